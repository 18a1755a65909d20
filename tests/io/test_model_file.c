/*
 * test_model_file.c - opening models: the stories GGUF, and Hugging Face
 * directories built here (single file, sharded with an index, a bare set of
 * *.safetensors, no weights), plus the errors a broken directory must give.
 */
#include <ftw.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "io/gguf.h"
#include "io/model_file.h"

#define STORIES PETREL_SOURCE_DIR "/models/stories260K.gguf"

#define assert_err_has(err, sub)                                                                   \
    do {                                                                                           \
        if (!strstr((err).msg, (sub))) fail_msg("error \"%s\" lacks \"%s\"", (err).msg, (sub));    \
    } while (0)

/* ---- scratch directories ------------------------------------------------- */

static char dir[64];

static void write_file(const char *name, const void *data, size_t n) {
    char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, n, f), n);
    fclose(f);
}

static void write_text(const char *name, const char *text) {
    write_file(name, text, strlen(text));
}

/* A safetensors file holding f32 tensors of 2 elements each, named in
 * names (NULL-terminated), laid out back to back. */
static void write_st(const char *file, const char *const *names) {
    char json[1024] = "{";
    size_t n = 0;
    for (; names[n]; n++) {
        char entry[160];
        snprintf(entry, sizeof entry,
                 "%s\"%s\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [%zu, %zu]}",
                 n ? ", " : "", names[n], n * 8, n * 8 + 8);
        strcat(json, entry);
    }
    strcat(json, "}");
    uint64_t len = strlen(json);
    size_t total = 8 + len + n * 8;
    uint8_t *b = calloc(1, total);
    memcpy(b, &len, 8);
    memcpy(b + 8, json, len);
    for (size_t i = 0; i < n * 8; i++)
        b[8 + len + i] = (uint8_t)i;
    write_file(file, b, total);
    free(b);
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    return remove(path);
}

static int setup(void **state) {
    strcpy(dir, "/tmp/petrel-mf-XXXXXX");
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state) {
    return nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static const char *config = "{\"model_type\": \"llama\", \"hidden_size\": 64}";

static void expect_open_error(const char *path, const char *sub) {
    pt_model_file *mf = NULL;
    pt_err err = {{0}};
    assert_int_equal(pt_model_file_open(&mf, path, &err), -1);
    assert_null(mf);
    assert_err_has(err, sub);
}

/* ---- GGUF ---------------------------------------------------------------- */

static void test_gguf(void **state) {
    pt_model_file *mf;
    pt_err err = {{0}};
    if (pt_model_file_open(&mf, STORIES, &err)) fail_msg("%s", err.msg);
    assert_int_equal(mf->kind, PT_FILE_GGUF);
    assert_non_null(mf->gguf);
    assert_null(mf->config);
    assert_null(mf->tokenizer_json);
    assert_int_equal(mf->n_tensors, 48);
    assert_string_equal(mf->path, STORIES);
    const pt_tensor_info *t = pt_model_file_tensor(mf, "token_embd.weight");
    assert_non_null(t);
    assert_int_equal(t->shape[0], 512);
    assert_int_equal(t->shape[1], 64);
    t = pt_model_file_tensor(mf, "blk.3.attn_q.weight");
    assert_non_null(t);
    assert_int_equal(t->nbytes, 64 * 64 * 4);
    assert_null(pt_model_file_tensor(mf, "blk.5.attn_q.weight"));
    assert_null(pt_model_file_tensor(mf, ""));
    for (int i = 0; i < mf->n_tensors; i++)
        assert_ptr_equal(pt_model_file_tensor(mf, mf->tensors[i].name), &mf->tensors[i]);
    assert_int_equal(pt_model_file_bytes(mf), 1185376 - 14176);
    int64_t v;
    assert_true(pt_gguf_get_int(mf->gguf, "llama.embedding_length", &v));
    assert_int_equal(v, 64);
    pt_model_file_close(mf);
}

static void test_gguf_damaged(void **state) {
    char *text;
    size_t len;
    pt_err err = {{0}};
    if (pt_read_file(STORIES, 4 << 20, &text, &len, &err)) fail_msg("%s", err.msg);
    assert_int_equal(len, 1185376);
    write_file("cut.gguf", text, 100000);
    char path[128];
    snprintf(path, sizeof path, "%s/cut.gguf", dir);
    expect_open_error(path, "cut.gguf: tensor ");
    expect_open_error(path, "runs past end of file (size 100000)");
    free(text);
}

/* ---- Hugging Face directories -------------------------------------------- */

static void test_hf_single(void **state) {
    write_text("config.json", config);
    write_text("generation_config.json", "{\"eos_token_id\": 2}");
    write_text("tokenizer_config.json", "{\"bos_token\": \"<s>\"}");
    write_text("tokenizer.json", "{}");
    write_st("model.safetensors", (const char *const[]){"w1", "w0", NULL});
    write_st("ignored.safetensors", (const char *const[]){"w1", NULL}); /* not consulted */

    pt_model_file *mf;
    pt_err err = {{0}};
    if (pt_model_file_open(&mf, dir, &err)) fail_msg("%s", err.msg);
    assert_int_equal(mf->kind, PT_FILE_HF);
    assert_null(mf->gguf);
    assert_non_null(mf->config);
    assert_string_equal(json_string_value(json_object_get(mf->config, "model_type")), "llama");
    assert_int_equal(json_integer_value(json_object_get(mf->generation_config, "eos_token_id")), 2);
    assert_non_null(mf->tokenizer_config);
    assert_non_null(mf->tokenizer_json);
    assert_non_null(strstr(mf->tokenizer_json, "/tokenizer.json"));
    assert_int_equal(mf->n_tensors, 2);
    const pt_tensor_info *w0 = pt_model_file_tensor(mf, "w0");
    assert_non_null(w0);
    assert_int_equal(w0->dtype, PT_F32);
    assert_int_equal(((const uint8_t *)w0->data)[0], 8);
    assert_non_null(pt_model_file_tensor(mf, "w1"));
    assert_null(pt_model_file_tensor(mf, "w2"));
    assert_int_equal(pt_model_file_bytes(mf), 16);
    pt_model_file_close(mf);
}

static void test_hf_sharded(void **state) {
    write_text("config.json", config);
    write_st("model-00001-of-00002.safetensors", (const char *const[]){"a", "b", NULL});
    write_st("model-00002-of-00002.safetensors", (const char *const[]){"c", NULL});
    write_text("model.safetensors.index.json",
               "{\"metadata\": {\"total_size\": 24}, \"weight_map\": {"
               "\"a\": \"model-00001-of-00002.safetensors\","
               "\"c\": \"model-00002-of-00002.safetensors\","
               "\"b\": \"model-00001-of-00002.safetensors\"}}");
    pt_model_file *mf;
    pt_err err = {{0}};
    if (pt_model_file_open(&mf, dir, &err)) fail_msg("%s", err.msg);
    assert_null(mf->generation_config);
    assert_null(mf->tokenizer_config);
    assert_null(mf->tokenizer_json);
    assert_int_equal(mf->n_tensors, 3);
    assert_non_null(pt_model_file_tensor(mf, "a"));
    assert_non_null(pt_model_file_tensor(mf, "b"));
    const pt_tensor_info *c = pt_model_file_tensor(mf, "c");
    assert_non_null(c);
    assert_int_equal(((const uint8_t *)c->data)[1], 1);
    pt_model_file_close(mf);

    /* the index names a shard that is not there */
    write_text("model.safetensors.index.json",
               "{\"weight_map\": {\"a\": \"model-00001-of-00002.safetensors\","
               " \"d\": \"model-00003-of-00002.safetensors\"}}");
    expect_open_error(dir, "model.safetensors.index.json: weight_map names shard "
                           "model-00003-of-00002.safetensors: ");
    expect_open_error(dir, "No such file");
    /* ... a tensor its shard does not hold */
    write_text("model.safetensors.index.json",
               "{\"weight_map\": {\"a\": \"model-00001-of-00002.safetensors\","
               " \"c\": \"model-00001-of-00002.safetensors\"}}");
    expect_open_error(dir, "model.safetensors.index.json: tensor c: not found in shard "
                           "model-00001-of-00002.safetensors");
    /* ... a path outside the directory */
    write_text("model.safetensors.index.json", "{\"weight_map\": {\"a\": \"../x.safetensors\"}}");
    expect_open_error(dir, "weight_map: tensor a: shard must be a file name");
    write_text("model.safetensors.index.json", "{\"weight_map\": {\"a\": 5}}");
    expect_open_error(dir, "weight_map: tensor a: shard must be a file name");
    write_text("model.safetensors.index.json", "{\"metadata\": {}}");
    expect_open_error(dir, "model.safetensors.index.json: weight_map missing or not an object");
    write_text("model.safetensors.index.json", "{\"weight_map\": ");
    expect_open_error(dir, "model.safetensors.index.json: line 1, column");
}

static void test_hf_glob(void **state) {
    write_text("config.json", config);
    write_st("b.safetensors", (const char *const[]){"y", NULL});
    write_st("a.safetensors", (const char *const[]){"x", NULL});
    write_text("notes.txt", "not weights");
    pt_model_file *mf;
    pt_err err = {{0}};
    if (pt_model_file_open(&mf, dir, &err)) fail_msg("%s", err.msg);
    assert_int_equal(mf->n_tensors, 2);
    assert_string_equal(mf->tensors[0].name, "x"); /* files in name order */
    assert_string_equal(mf->tensors[1].name, "y");
    pt_model_file_close(mf);

    write_st("c.safetensors", (const char *const[]){"z", "x", NULL});
    expect_open_error(dir, ": tensor x is in both a.safetensors and c.safetensors");

    write_text("c.safetensors", "garbage");
    expect_open_error(dir, "/c.safetensors: file is 7 bytes, too small");
}

static void test_hf_no_weights(void **state) {
    write_text("config.json", config);
    pt_model_file *mf;
    pt_err err = {{0}};
    if (pt_model_file_open(&mf, dir, &err)) fail_msg("%s", err.msg);
    assert_int_equal(mf->n_tensors, 0);
    assert_null(pt_model_file_tensor(mf, "x"));
    assert_int_equal(pt_model_file_bytes(mf), 0);
    pt_model_file_close(mf);
}

static void test_not_a_model(void **state) {
    char path[128];
    expect_open_error(dir, ": not a GGUF file or a model directory (no config.json)");
    write_text("readme.txt", "hello");
    snprintf(path, sizeof path, "%s/readme.txt", dir);
    expect_open_error(path, "readme.txt: not a GGUF file or a model directory (no config.json)");
    write_st("w.safetensors", (const char *const[]){"x", NULL});
    snprintf(path, sizeof path, "%s/w.safetensors", dir);
    expect_open_error(path, "w.safetensors: a .safetensors file alone is not a model");
    snprintf(path, sizeof path, "%s/missing", dir);
    expect_open_error(path, "missing: No such file or directory");

    write_text("config.json", "{\"a\": 1,}");
    expect_open_error(dir, "config.json: line 1, column");
    write_text("config.json", "[1]");
    expect_open_error(dir, "config.json: not a JSON object");
    write_text("config.json", config);
    write_text("generation_config.json", "nope");
    expect_open_error(dir, "generation_config.json: line 1");
}

static void test_read_file(void **state) {
    write_text("f.txt", "hello");
    char path[128], *text;
    size_t len;
    pt_err err = {{0}};
    snprintf(path, sizeof path, "%s/f.txt", dir);
    if (pt_read_file(path, 5, &text, &len, &err)) fail_msg("%s", err.msg);
    assert_int_equal(len, 5);
    assert_string_equal(text, "hello");
    free(text);
    assert_int_equal(pt_read_file(path, 4, &text, &len, &err), -1);
    assert_null(text);
    assert_err_has(err, "f.txt: 5 bytes, larger than the 4-byte limit");
    assert_int_equal(pt_read_file(dir, 100, &text, &len, &err), -1);
    assert_err_has(err, "is a directory");
    snprintf(path, sizeof path, "%s/none", dir);
    assert_int_equal(pt_read_file(path, 100, &text, &len, &err), -1);
    assert_err_has(err, "none: No such file");
    /* a file whose size stat does not report */
    if (pt_read_file("/proc/self/status", 1 << 20, &text, NULL, &err)) fail_msg("%s", err.msg);
    assert_non_null(strstr(text, "Name:"));
    free(text);
    assert_int_equal(pt_read_file("/proc/self/status", 16, &text, NULL, &err), -1);
    assert_err_has(err, "larger than the 16-byte limit");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_gguf, setup, teardown),
        cmocka_unit_test_setup_teardown(test_gguf_damaged, setup, teardown),
        cmocka_unit_test_setup_teardown(test_hf_single, setup, teardown),
        cmocka_unit_test_setup_teardown(test_hf_sharded, setup, teardown),
        cmocka_unit_test_setup_teardown(test_hf_glob, setup, teardown),
        cmocka_unit_test_setup_teardown(test_hf_no_weights, setup, teardown),
        cmocka_unit_test_setup_teardown(test_not_a_model, setup, teardown),
        cmocka_unit_test_setup_teardown(test_read_file, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
