/*
 * test_gguf.c - the GGUF reader: the real stories260K model, files written
 * here by a tiny writer (round trip of every value type), and damaged files,
 * each of which must fail with a message naming what is wrong.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <cmocka.h>

#include "io/gguf.h"

#define STORIES PETREL_SOURCE_DIR "/models/stories260K.gguf"

#define assert_err_has(err, sub)                                                                   \
    do {                                                                                           \
        if (!strstr((err).msg, (sub))) fail_msg("error \"%s\" lacks \"%s\"", (err).msg, (sub));    \
    } while (0)

/* ---- a tiny GGUF writer -------------------------------------------------- */

typedef struct buf {
    uint8_t *p;
    size_t n, cap;
} buf;

static void put(buf *b, const void *d, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, d, n);
    b->n += n;
}
static void put_u8(buf *b, uint8_t v) {
    put(b, &v, 1);
}
static void put_u16(buf *b, uint16_t v) {
    put(b, &v, 2);
}
static void put_u32(buf *b, uint32_t v) {
    put(b, &v, 4);
}
static void put_u64(buf *b, uint64_t v) {
    put(b, &v, 8);
}
static void put_f32(buf *b, float v) {
    put(b, &v, 4);
}
static void put_f64(buf *b, double v) {
    put(b, &v, 8);
}
static void put_str(buf *b, const char *s) {
    put_u64(b, strlen(s));
    put(b, s, strlen(s));
}
static void put_key(buf *b, const char *key, uint32_t type) {
    put_str(b, key);
    put_u32(b, type);
}
static void put_header(buf *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    put(b, "GGUF", 4);
    put_u32(b, version);
    put_u64(b, n_tensors);
    put_u64(b, n_kv);
}

/* One key of every value type, arrays (of strings, ints, floats, arrays)
 * included.  Returns the number of keys written. */
static int put_test_kvs(buf *b) {
    put_key(b, "general.architecture", PT_GGUF_STRING), put_str(b, "llama");
    put_key(b, "t.u8", PT_GGUF_U8), put_u8(b, 200);
    put_key(b, "t.i8", PT_GGUF_I8), put_u8(b, (uint8_t)-5);
    put_key(b, "t.u16", PT_GGUF_U16), put_u16(b, 60000);
    put_key(b, "t.i16", PT_GGUF_I16), put_u16(b, (uint16_t)-3000);
    put_key(b, "t.u32", PT_GGUF_U32), put_u32(b, 4000000000u);
    put_key(b, "t.i32", PT_GGUF_I32), put_u32(b, (uint32_t)-7);
    put_key(b, "t.u64", PT_GGUF_U64), put_u64(b, 1ull << 40);
    put_key(b, "t.u64big", PT_GGUF_U64), put_u64(b, UINT64_MAX);
    put_key(b, "t.i64", PT_GGUF_I64), put_u64(b, (uint64_t) - (1ll << 40));
    put_key(b, "t.f32", PT_GGUF_F32), put_f32(b, 1.5f);
    put_key(b, "t.f64", PT_GGUF_F64), put_f64(b, -2.25);
    put_key(b, "t.bool", PT_GGUF_BOOL), put_u8(b, 1);
    put_key(b, "t.strs", PT_GGUF_ARRAY), put_u32(b, PT_GGUF_STRING), put_u64(b, 3);
    put_str(b, "a"), put_str(b, ""), put_str(b, "h\xc3\xa9llo");
    put_key(b, "t.ints", PT_GGUF_ARRAY), put_u32(b, PT_GGUF_I32), put_u64(b, 3);
    put_u32(b, 1), put_u32(b, (uint32_t)-2), put_u32(b, 3);
    put_key(b, "t.floats", PT_GGUF_ARRAY), put_u32(b, PT_GGUF_F32), put_u64(b, 2);
    put_f32(b, 0.5f), put_f32(b, 1.5f);
    /* [[1, 2], [3]] of u16, then [["x", "y"]] */
    put_key(b, "t.nested", PT_GGUF_ARRAY), put_u32(b, PT_GGUF_ARRAY), put_u64(b, 2);
    put_u32(b, PT_GGUF_U16), put_u64(b, 2), put_u16(b, 1), put_u16(b, 2);
    put_u32(b, PT_GGUF_U16), put_u64(b, 1), put_u16(b, 3);
    put_key(b, "t.nested_strs", PT_GGUF_ARRAY), put_u32(b, PT_GGUF_ARRAY), put_u64(b, 1);
    put_u32(b, PT_GGUF_STRING), put_u64(b, 2), put_str(b, "x"), put_str(b, "y");
    put_key(b, "t.empty", PT_GGUF_ARRAY), put_u32(b, PT_GGUF_F64), put_u64(b, 0);
    return 19;
}

#define AUTO UINT64_MAX

typedef struct wt {
    const char *name;
    uint32_t nd;
    uint64_t ne[5];
    uint32_t type;   /* ggml type id */
    uint64_t offset; /* AUTO: next aligned position */
} wt;

typedef struct gopts {
    uint32_t version;
    const wt *tensors;
    int n_tensors;
    bool kvs;          /* the put_test_kvs() set */
    int64_t alignment; /* 0: no general.alignment key */
    size_t data_bytes; /* 0: up to the end of the last tensor */
} gopts;

static uint8_t pattern(size_t i) {
    return (uint8_t)(i * 7 + 1);
}

static size_t tensor_bytes(const wt *t) {
    uint64_t n = 1;
    for (uint32_t d = 0; d < t->nd && d < 5; d++)
        n *= t->ne[d];
    int dt = pt_dtype_from_gguf(t->type);
    return dt < 0 ? 0 : pt_dtype_bytes((pt_dtype)dt, n);
}

static void build_gguf(buf *b, const gopts *o) {
    size_t align = o->alignment > 0 ? (size_t)o->alignment : 32, data_end = 0;
    uint64_t next = 0;
    put_header(b, o->version ? o->version : 3, (uint64_t)o->n_tensors,
               (o->kvs ? 19 : 0) + (o->alignment ? 1 : 0));
    if (o->kvs) put_test_kvs(b);
    if (o->alignment)
        put_key(b, "general.alignment", PT_GGUF_U32), put_u32(b, (uint32_t)o->alignment);
    for (int i = 0; i < o->n_tensors; i++) {
        const wt *t = &o->tensors[i];
        uint64_t off = t->offset == AUTO ? next : t->offset;
        size_t nb = tensor_bytes(t);
        put_str(b, t->name);
        put_u32(b, t->nd);
        for (uint32_t d = 0; d < t->nd; d++)
            put_u64(b, t->ne[d]);
        put_u32(b, t->type);
        put_u64(b, off);
        next = (off + nb + align - 1) / align * align;
        if (off < 1u << 20 && nb < 1u << 20 && off + nb > data_end) data_end = off + nb;
    }
    while (b->n % align)
        put_u8(b, 0);
    size_t n = o->data_bytes ? o->data_bytes : data_end;
    for (size_t i = 0; i < n; i++)
        put_u8(b, pattern(i));
}

static const wt small_tensors[] = {
    {"a", 2, {3, 2}, 0, AUTO},  /* f32 [2, 3]: 24 bytes at 0 */
    {"b", 1, {4}, 1, AUTO},     /* f16 [4]: 8 bytes at 32 */
    {"c", 2, {32, 2}, 8, AUTO}, /* q8_0 [2, 32]: 68 bytes at 64 */
};

/* Parses b from an exact-size heap copy, so ASan sees any over-read. */
static int parse_buf(pt_gguf **g, const buf *b, pt_err *err) {
    void *copy = malloc(b->n ? b->n : 1);
    memcpy(copy, b->p, b->n);
    int rc = pt_gguf_parse(g, copy, b->n, "t.gguf", err);
    if (rc == 0) {
        pt_gguf_close(*g); /* reparse from b itself, which outlives the result */
        rc = pt_gguf_parse(g, b->p, b->n, "t.gguf", err);
    }
    free(copy);
    return rc;
}

/* Builds a file with the given tensors and expects an error containing sub. */
static void expect_tensor_error(const wt *ts, int n, const char *sub) {
    buf b = {0};
    gopts o = {.tensors = ts, .n_tensors = n};
    build_gguf(&b, &o);
    pt_gguf *g = NULL;
    pt_err err = {{0}};
    assert_int_equal(parse_buf(&g, &b, &err), -1);
    assert_null(g);
    assert_err_has(err, "t.gguf: ");
    assert_err_has(err, sub);
    free(b.p);
}

static void expect_error(const buf *b, const char *sub) {
    pt_gguf *g = NULL;
    pt_err err = {{0}};
    assert_int_equal(parse_buf(&g, b, &err), -1);
    assert_null(g);
    assert_err_has(err, "t.gguf: ");
    assert_err_has(err, sub);
}

/* ---- the real model ------------------------------------------------------ */

static void test_stories(void **state) {
    pt_gguf *g;
    pt_err err = {{0}};
    if (pt_gguf_open(&g, STORIES, &err)) fail_msg("%s", err.msg);
    assert_int_equal(pt_gguf_version(g), 3);
    assert_int_equal(pt_gguf_n_kv(g), 19);
    assert_int_equal(pt_gguf_n_tensors(g), 48);
    assert_int_equal(pt_gguf_alignment(g), 32);
    assert_int_equal(pt_gguf_data_offset(g), 14176);

    int64_t v;
    assert_true(pt_gguf_get_int(g, "llama.embedding_length", &v));
    assert_int_equal(v, 64);
    assert_true(pt_gguf_get_int(g, "llama.block_count", &v));
    assert_int_equal(v, 5);
    double eps;
    assert_true(pt_gguf_get_float(g, "llama.attention.layer_norm_rms_epsilon", &eps));
    assert_true(eps > 0.99e-5 && eps < 1.01e-5);
    pt_gguf_str s;
    assert_true(pt_gguf_get_str(g, "general.architecture", &s));
    assert_int_equal(s.len, 5);
    assert_memory_equal(s.s, "llama", 5);

    int et;
    uint64_t count;
    assert_true(pt_gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &count));
    assert_int_equal(et, PT_GGUF_STRING);
    assert_int_equal(count, 512);
    assert_true(pt_gguf_arr_str(g, "tokenizer.ggml.tokens", 1, &s));
    assert_int_equal(s.len, 3);
    assert_memory_equal(s.s, "<s>", 3);
    assert_false(pt_gguf_arr_str(g, "tokenizer.ggml.tokens", 512, &s));
    double score;
    assert_true(pt_gguf_arr_float(g, "tokenizer.ggml.scores", 511, &score));
    assert_true(pt_gguf_arr_int(g, "tokenizer.ggml.token_type", 0, &v));
    assert_int_equal(v, 2);

    const pt_tensor_info *t = pt_gguf_tensor(g, 0);
    assert_string_equal(t->name, "token_embd.weight");
    assert_int_equal(t->dtype, PT_F32);
    assert_int_equal(t->ndim, 2);
    assert_int_equal(t->shape[0], 512);
    assert_int_equal(t->shape[1], 64);
    assert_int_equal(t->nbytes, 512 * 64 * 4);
    const pt_tensor_info *last = pt_gguf_tensor(g, 47);
    assert_string_equal(last->name, "blk.4.ffn_norm.weight");
    assert_int_equal(last->ndim, 1);
    assert_int_equal(last->shape[0], 64);
    assert_int_equal((const char *)last->data + last->nbytes - (const char *)t->data,
                     1185376 - 14176);
    assert_null(pt_gguf_tensor(g, 48));
    assert_null(pt_gguf_tensor(g, -1));

    pt_gguf_str key;
    int type;
    assert_true(pt_gguf_kv_at(g, 0, &key, &type));
    assert_int_equal(type, PT_GGUF_ARRAY);
    assert_false(pt_gguf_kv_at(g, 19, &key, &type));
    pt_gguf_close(g);
}

static buf read_stories(void) {
    buf b = {0};
    FILE *f = fopen(STORIES, "rb");
    assert_non_null(f);
    uint8_t chunk[65536];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0)
        put(&b, chunk, n);
    fclose(f);
    return b;
}

/* Every cut of the header, and cuts through the data, must fail cleanly. */
static void test_stories_truncated(void **state) {
    buf whole = read_stories();
    assert_int_equal(whole.n, 1185376);
    size_t header = 14176;
    for (size_t cut = 0; cut < whole.n; cut += cut < header + 64 ? 1 : 4099) {
        uint8_t *copy = malloc(cut ? cut : 1);
        memcpy(copy, whole.p, cut);
        pt_gguf *g = NULL;
        pt_err err = {{0}};
        int rc = pt_gguf_parse(&g, copy, cut, "stories.gguf", &err);
        free(copy);
        if (rc == 0) fail_msg("cut at %zu parsed", cut);
        assert_err_has(err, "stories.gguf: ");
        if (!strstr(err.msg, "past end of file") && !strstr(err.msg, "cannot fit"))
            fail_msg("cut at %zu: unexpected message \"%s\"", cut, err.msg);
        if (cut >= header) assert_err_has(err, "tensor ");
    }
    pt_gguf *g;
    pt_err err = {{0}};
    assert_int_equal(pt_gguf_parse(&g, whole.p, whole.n - 1, "stories.gguf", &err), -1);
    assert_err_has(err, "stories.gguf: tensor blk.4.ffn_norm.weight: data [offset 1185120, "
                        "256 bytes] runs past end of file (size 1185375)");
    free(whole.p);
}

/* ---- round trip ---------------------------------------------------------- */

static void check_small(const pt_gguf *g, const uint8_t *base) {
    int64_t i;
    double f;
    bool bv;
    pt_gguf_str s;
    int et;
    uint64_t n;
    assert_true(pt_gguf_get_int(g, "t.u8", &i)), assert_int_equal(i, 200);
    assert_true(pt_gguf_get_int(g, "t.i8", &i)), assert_int_equal(i, -5);
    assert_true(pt_gguf_get_int(g, "t.u16", &i)), assert_int_equal(i, 60000);
    assert_true(pt_gguf_get_int(g, "t.i16", &i)), assert_int_equal(i, -3000);
    assert_true(pt_gguf_get_int(g, "t.u32", &i)), assert_int_equal(i, 4000000000ll);
    assert_true(pt_gguf_get_int(g, "t.i32", &i)), assert_int_equal(i, -7);
    assert_true(pt_gguf_get_int(g, "t.u64", &i)), assert_int_equal(i, 1ll << 40);
    assert_true(pt_gguf_get_int(g, "t.i64", &i)), assert_true(i == -(1ll << 40));
    assert_false(pt_gguf_get_int(g, "t.u64big", &i)); /* does not fit */
    assert_false(pt_gguf_get_int(g, "t.f32", &i));    /* float is not an int */
    assert_false(pt_gguf_get_int(g, "t.bool", &i));
    assert_false(pt_gguf_get_int(g, "no.such.key", &i));
    assert_true(pt_gguf_get_float(g, "t.f32", &f)), assert_true(f == 1.5);
    assert_true(pt_gguf_get_float(g, "t.f64", &f)), assert_true(f == -2.25);
    assert_true(pt_gguf_get_float(g, "t.i8", &f)), assert_true(f == -5.0);
    assert_false(pt_gguf_get_float(g, "general.architecture", &f));
    assert_true(pt_gguf_get_bool(g, "t.bool", &bv)), assert_true(bv);
    assert_false(pt_gguf_get_bool(g, "t.u8", &bv));
    assert_true(pt_gguf_get_str(g, "general.architecture", &s));
    assert_true(s.len == 5 && memcmp(s.s, "llama", 5) == 0);
    assert_false(pt_gguf_get_str(g, "t.strs", &s));

    assert_true(pt_gguf_get_arr(g, "t.strs", &et, &n));
    assert_int_equal(et, PT_GGUF_STRING), assert_int_equal(n, 3);
    assert_true(pt_gguf_arr_str(g, "t.strs", 1, &s)), assert_int_equal(s.len, 0);
    assert_true(pt_gguf_arr_str(g, "t.strs", 2, &s));
    assert_true(s.len == 6 && memcmp(s.s, "h\xc3\xa9llo", 6) == 0);
    assert_false(pt_gguf_arr_str(g, "t.strs", 3, &s));
    assert_false(pt_gguf_arr_int(g, "t.strs", 0, &i));
    assert_true(pt_gguf_arr_int(g, "t.ints", 1, &i)), assert_int_equal(i, -2);
    assert_true(pt_gguf_arr_float(g, "t.ints", 2, &f)), assert_true(f == 3.0);
    assert_false(pt_gguf_arr_int(g, "t.floats", 0, &i));
    assert_true(pt_gguf_arr_float(g, "t.floats", 1, &f)), assert_true(f == 1.5);
    assert_false(pt_gguf_arr_str(g, "t.floats", 0, &s));
    assert_true(pt_gguf_get_arr(g, "t.nested", &et, &n));
    assert_int_equal(et, PT_GGUF_ARRAY), assert_int_equal(n, 2);
    assert_false(pt_gguf_arr_int(g, "t.nested", 0, &i));
    assert_false(pt_gguf_arr_str(g, "t.nested", 0, &s));
    assert_true(pt_gguf_get_arr(g, "t.nested_strs", &et, &n)), assert_int_equal(n, 1);
    assert_true(pt_gguf_get_arr(g, "t.empty", &et, &n));
    assert_int_equal(et, PT_GGUF_F64), assert_int_equal(n, 0);
    assert_false(pt_gguf_arr_float(g, "t.empty", 0, &f));
    assert_false(pt_gguf_get_arr(g, "t.u8", &et, &n));

    assert_int_equal(pt_gguf_n_tensors(g), 3);
    size_t data = pt_gguf_data_offset(g);
    assert_int_equal(data % 32, 0);
    const pt_tensor_info *a = pt_gguf_tensor(g, 0), *b = pt_gguf_tensor(g, 1),
                         *c = pt_gguf_tensor(g, 2);
    assert_string_equal(a->name, "a");
    assert_int_equal(a->dtype, PT_F32), assert_int_equal(a->ndim, 2);
    assert_int_equal(a->shape[0], 2), assert_int_equal(a->shape[1], 3);
    assert_int_equal(a->nbytes, 24);
    assert_ptr_equal(a->data, base + data);
    assert_int_equal(((const uint8_t *)a->data)[5], pattern(5));
    assert_string_equal(b->name, "b");
    assert_int_equal(b->dtype, PT_F16), assert_int_equal(b->shape[0], 4);
    assert_ptr_equal(b->data, base + data + 32);
    assert_int_equal(((const uint8_t *)b->data)[0], pattern(32));
    assert_int_equal(c->dtype, PT_Q8_0), assert_int_equal(c->nbytes, 68);
    assert_int_equal(c->shape[0], 2), assert_int_equal(c->shape[1], 32);
    assert_ptr_equal(c->data, base + data + 64);
}

static void test_roundtrip(void **state) {
    for (uint32_t version = 2; version <= 3; version++) {
        buf b = {0};
        gopts o = {.version = version, .tensors = small_tensors, .n_tensors = 3, .kvs = true};
        build_gguf(&b, &o);
        pt_gguf *g;
        pt_err err = {{0}};
        if (parse_buf(&g, &b, &err)) fail_msg("%s", err.msg);
        assert_int_equal(pt_gguf_version(g), version);
        assert_int_equal(pt_gguf_n_kv(g), 19);
        check_small(g, b.p);
        pt_gguf_close(g);
        free(b.p);
    }
}

static void test_roundtrip_file(void **state) {
    char dir[] = "/tmp/petrel-gguf-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[64];
    snprintf(path, sizeof path, "%s/small.gguf", dir);
    buf b = {0};
    gopts o = {.tensors = small_tensors, .n_tensors = 3, .kvs = true};
    build_gguf(&b, &o);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(b.p, 1, b.n, f), b.n);
    fclose(f);
    pt_gguf *g;
    pt_err err = {{0}};
    if (pt_gguf_open(&g, path, &err)) fail_msg("%s", err.msg);
    int64_t i;
    assert_true(pt_gguf_get_int(g, "t.u8", &i)), assert_int_equal(i, 200);
    const pt_tensor_info *c = pt_gguf_tensor(g, 2);
    assert_int_equal(((const uint8_t *)c->data)[67], pattern(64 + 67));
    pt_gguf_close(g);

    /* an empty file, and a directory */
    f = fopen(path, "wb");
    fclose(f);
    assert_int_equal(pt_gguf_open(&g, path, &err), -1);
    assert_err_has(err, "magic at offset 0 runs past end of file (size 0)");
    assert_int_equal(pt_gguf_open(&g, dir, &err), -1);
    assert_err_has(err, "not a regular file");
    unlink(path);
    rmdir(dir);
    free(b.p);
}

static void test_alignment(void **state) {
    buf b = {0};
    gopts o = {.tensors = small_tensors, .n_tensors = 3, .alignment = 64};
    build_gguf(&b, &o);
    pt_gguf *g;
    pt_err err = {{0}};
    if (parse_buf(&g, &b, &err)) fail_msg("%s", err.msg);
    assert_int_equal(pt_gguf_alignment(g), 64);
    assert_int_equal(pt_gguf_data_offset(g) % 64, 0);
    assert_ptr_equal(pt_gguf_tensor(g, 1)->data, b.p + pt_gguf_data_offset(g) + 64);
    pt_gguf_close(g);
    free(b.p);

    b = (buf){0};
    o.alignment = 48;
    build_gguf(&b, &o);
    expect_error(&b, "general.alignment: 48 is not a power of two");
    free(b.p);

    b = (buf){0};
    put_header(&b, 3, 0, 1);
    put_key(&b, "general.alignment", PT_GGUF_STRING), put_str(&b, "32");
    expect_error(&b, "general.alignment: must be an integer, has type string");
    free(b.p);
}

static void test_no_tensors(void **state) {
    buf b = {0};
    put_header(&b, 3, 0, 1);
    put_key(&b, "general.name", PT_GGUF_STRING), put_str(&b, "x");
    pt_gguf *g;
    pt_err err = {{0}};
    if (parse_buf(&g, &b, &err)) fail_msg("%s", err.msg);
    assert_int_equal(pt_gguf_n_tensors(g), 0);
    pt_gguf_close(g);
    free(b.p);
}

/* ---- damaged headers ----------------------------------------------------- */

static void test_bad_magic_and_version(void **state) {
    buf b = {0};
    put(&b, "GGUG", 4), put_u32(&b, 3), put_u64(&b, 0), put_u64(&b, 0);
    expect_error(&b, "not a GGUF file (magic 47 47 55 47");
    free(b.p);
    b = (buf){0};
    put(&b, "GG", 2);
    expect_error(&b, "magic at offset 0 runs past end of file (size 2)");
    free(b.p);

    static const struct {
        uint32_t version;
        const char *msg;
    } cases[] = {
        {1, "GGUF version 1 is not supported"},
        {0, "unsupported GGUF version 0"},
        {4, "unsupported GGUF version 4"},
        {0x03000000, "looks like a big-endian file"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        b = (buf){0};
        put_header(&b, cases[i].version, 0, 0);
        expect_error(&b, cases[i].msg);
        free(b.p);
    }
}

static void test_huge_counts(void **state) {
    buf b = {0};
    put_header(&b, 3, 1ull << 60, 0);
    expect_error(&b, "tensor count 1152921504606846976 at offset 24 cannot fit");
    free(b.p);
    b = (buf){0};
    put_header(&b, 3, 0, 1ull << 60);
    put(&b, "0123456789abcdef", 16);
    expect_error(
        &b, "key/value count 1152921504606846976 at offset 24 cannot fit in the 16 bytes left");
    free(b.p);
    b = (buf){0};
    put_header(&b, 3, UINT64_MAX, UINT64_MAX);
    expect_error(&b, "key/value count");
    free(b.p);
    b = (buf){0};
    put_header(&b, 3, 0, 1);
    put_key(&b, "x", PT_GGUF_ARRAY), put_u32(&b, PT_GGUF_U32), put_u64(&b, 1ull << 62);
    put_u32(&b, 1);
    expect_error(&b, "key x: array length 4611686018427387904 at offset");
    free(b.p);
    b = (buf){0};
    put_header(&b, 3, 0, 1);
    put_key(&b, "x", PT_GGUF_ARRAY), put_u32(&b, PT_GGUF_STRING), put_u64(&b, 3);
    put_u64(&b, 0), put_u64(&b, 0);
    expect_error(&b, "key x: array length 3 at offset");
    free(b.p);
}

static void test_bad_strings(void **state) {
    buf b = {0};
    put_header(&b, 3, 0, 1);
    put_u64(&b, 1000), put(&b, "abcdefghijklmnop", 16);
    expect_error(&b, "t.gguf: key 0: string length 1000 at offset 24 runs past end of file "
                     "(size 48)");
    free(b.p);
    b = (buf){0};
    put_header(&b, 3, 0, 1);
    put_key(&b, "general.name", PT_GGUF_STRING), put_u64(&b, 1ull << 40);
    expect_error(&b, "key general.name: string length 1099511627776");
    free(b.p);
    b = (buf){0};
    put_header(&b, 3, 0, 1);
    put_key(&b, "general.name", PT_GGUF_STRING), put_u64(&b, UINT64_MAX);
    expect_error(&b, "key general.name: string length 18446744073709551615");
    free(b.p);
    b = (buf){0};
    put_header(&b, 3, 0, 1);
    put_key(&b, "tok", PT_GGUF_ARRAY), put_u32(&b, PT_GGUF_STRING), put_u64(&b, 2);
    put_str(&b, "a"), put_u64(&b, 999), put_u64(&b, 0);
    expect_error(&b, "key tok: element 1: string length 999");
    free(b.p);
    b = (buf){0};
    put_header(&b, 3, 1, 0);
    put_u64(&b, 500), put(&b, "blk.0", 5), put(&b, "0123456789abcdef01234567", 24);
    expect_error(&b, "tensor 0: name: string length 500");
    free(b.p);
}

static void test_bad_values(void **state) {
    buf b = {0};
    put_header(&b, 3, 0, 1);
    put_key(&b, "x", 13), put_u32(&b, 0);
    expect_error(&b, "key x: unknown value type 13");
    free(b.p);
    b = (buf){0};
    put_header(&b, 3, 0, 1);
    put_key(&b, "x", PT_GGUF_ARRAY), put_u32(&b, 77), put_u64(&b, 0);
    expect_error(&b, "key x: array of unknown value type 77");
    free(b.p);
    b = (buf){0};
    put_header(&b, 3, 0, 1);
    put_key(&b, "x", PT_GGUF_U64), put_u32(&b, 1);
    expect_error(&b, "key x: u64 at offset 37 runs past end of file (size 41)");
    free(b.p);
    b = (buf){0};
    put_header(&b, 3, 0, 2);
    put_key(&b, "x", PT_GGUF_U8), put_u8(&b, 1);
    put_key(&b, "x", PT_GGUF_U8), put_u8(&b, 2);
    expect_error(&b, "key x appears more than once");
    free(b.p);

    /* 20 levels of arrays of one array */
    b = (buf){0};
    put_header(&b, 3, 0, 1);
    put_key(&b, "deep", PT_GGUF_ARRAY);
    for (int i = 0; i < 20; i++)
        put_u32(&b, PT_GGUF_ARRAY), put_u64(&b, 1);
    put_u32(&b, PT_GGUF_U8), put_u64(&b, 0);
    expect_error(&b, "key deep: element 0: element 0: ");
    expect_error(&b, "arrays nested more than 8 deep");
    free(b.p);
}

static void test_bad_tensors(void **state) {
    wt ts[3];
    memcpy(ts, small_tensors, sizeof ts);
    ts[1].offset = 36;
    expect_tensor_error(ts, 3, "tensor b: data offset 36 is not a multiple of the alignment 32");

    memcpy(ts, small_tensors, sizeof ts);
    ts[1].offset = 1 << 20;
    expect_tensor_error(ts, 3, "tensor b: data [offset ");
    expect_tensor_error(ts, 3, ", 8 bytes] runs past end of file (size ");

    memcpy(ts, small_tensors, sizeof ts);
    ts[2].offset = 1ull << 63;
    expect_tensor_error(ts, 3, "tensor c: data [offset ");

    memcpy(ts, small_tensors, sizeof ts);
    ts[1].type = 99, ts[1].offset = 32;
    expect_tensor_error(ts, 3, "tensor b: unknown or unsupported ggml type 99");

    memcpy(ts, small_tensors, sizeof ts);
    ts[1].nd = 5, ts[1].ne[1] = ts[1].ne[2] = ts[1].ne[3] = ts[1].ne[4] = 1;
    expect_tensor_error(ts, 3, "tensor b: 5 dimensions (at most 4 supported)");

    memcpy(ts, small_tensors, sizeof ts);
    ts[0].ne[1] = 0, ts[1].offset = 32, ts[2].offset = 64;
    expect_tensor_error(ts, 3, "tensor a: dimension 1 is 0");

    memcpy(ts, small_tensors, sizeof ts);
    ts[0].ne[0] = UINT64_MAX, ts[1].offset = 32, ts[2].offset = 64;
    expect_tensor_error(ts, 3, "tensor a: dimension 0 is -1");

    memcpy(ts, small_tensors, sizeof ts);
    ts[0].ne[0] = ts[0].ne[1] = 1ull << 40, ts[1].offset = 32, ts[2].offset = 64;
    expect_tensor_error(ts, 3, "tensor a: element count overflows");

    memcpy(ts, small_tensors, sizeof ts);
    ts[0].ne[0] = 1ull << 62, ts[0].ne[1] = 1, ts[1].offset = 32, ts[2].offset = 64;
    expect_tensor_error(ts, 3, "tensor a: byte size overflows");

    memcpy(ts, small_tensors, sizeof ts);
    ts[2].ne[0] = 16;
    expect_tensor_error(ts, 3, "tensor c: row length 16 is not a multiple of the q8_0 block (32)");

    memcpy(ts, small_tensors, sizeof ts);
    ts[2].name = "a";
    expect_tensor_error(ts, 3, "tensor a appears more than once");

    memcpy(ts, small_tensors, sizeof ts);
    ts[1].offset = 0, ts[2].offset = 32;
    expect_tensor_error(ts, 3, "tensors a and b overlap");

    memcpy(ts, small_tensors, sizeof ts);
    ts[1].name = "";
    expect_tensor_error(ts, 3, "tensor with an empty name");

    static const wt scalar_q8[] = {{"s", 0, {0}, 8, 0}};
    expect_tensor_error(scalar_q8, 1, "tensor s: row length 1 is not a multiple");

    buf b = {0};
    put_header(&b, 3, 1, 0);
    put_str(&b, "big"), put_u32(&b, 0x10000), put(&b, "0123456789abcdef", 16);
    expect_error(&b, "tensor big: 65536 dimensions");
    free(b.p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stories),
        cmocka_unit_test(test_stories_truncated),
        cmocka_unit_test(test_roundtrip),
        cmocka_unit_test(test_roundtrip_file),
        cmocka_unit_test(test_alignment),
        cmocka_unit_test(test_no_tensors),
        cmocka_unit_test(test_bad_magic_and_version),
        cmocka_unit_test(test_huge_counts),
        cmocka_unit_test(test_bad_strings),
        cmocka_unit_test(test_bad_values),
        cmocka_unit_test(test_bad_tensors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
