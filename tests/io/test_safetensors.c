/*
 * test_safetensors.c - the safetensors reader: a file written here, read back
 * from memory and from disk, then damaged headers and ranges, each of which
 * must fail with a message naming the tensor or field.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <cmocka.h>

#include "io/safetensors.h"

#define assert_err_has(err, sub)                                                                   \
    do {                                                                                           \
        if (!strstr((err).msg, (sub))) fail_msg("error \"%s\" lacks \"%s\"", (err).msg, (sub));    \
    } while (0)

/* ---- a tiny safetensors writer ------------------------------------------- */

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

static uint8_t pattern(size_t i) {
    return (uint8_t)(i * 7 + 1);
}

/* header length, the JSON, then data_bytes of pattern() */
static buf build_st(const char *json, size_t data_bytes) {
    buf b = {0};
    uint64_t n = strlen(json);
    put(&b, &n, 8);
    put(&b, json, n);
    for (size_t i = 0; i < data_bytes; i++) {
        uint8_t v = pattern(i);
        put(&b, &v, 1);
    }
    return b;
}

/* a: f32 [2,3] at 0..24, b: bf16 [4] at 24..32, s: i64 scalar at 32..40,
 * e: u8 [0] (empty) at 40..40, metadata format=pt */
static const char *small_json =
    "{\"b\": {\"dtype\": \"BF16\", \"shape\": [4], \"data_offsets\": [24, 32]},"
    " \"__metadata__\": {\"format\": \"pt\", \"n\": 3},"
    " \"a\": {\"dtype\": \"F32\", \"shape\": [2, 3], \"data_offsets\": [0, 24]},"
    " \"e\": {\"dtype\": \"U8\", \"shape\": [0], \"data_offsets\": [40, 40]},"
    " \"s\": {\"dtype\": \"I64\", \"shape\": [], \"data_offsets\": [32, 40]}}    ";

static int parse_exact(pt_safetensors **st, const void *data, size_t n, pt_err *err) {
    void *copy = malloc(n ? n : 1); /* exact size, so ASan sees any over-read */
    memcpy(copy, data, n);
    int rc = pt_safetensors_parse(st, copy, n, "t.safetensors", err);
    pt_safetensors_close(rc == 0 ? *st : NULL);
    free(copy);
    return rc ? rc : pt_safetensors_parse(st, data, n, "t.safetensors", err);
}

/* A file with one entry, given as JSON, and data_bytes of data. */
static void expect_error(const char *json, size_t data_bytes, const char *sub) {
    buf b = build_st(json, data_bytes);
    pt_safetensors *st = NULL;
    pt_err err = {{0}};
    assert_int_equal(parse_exact(&st, b.p, b.n, &err), -1);
    assert_null(st);
    assert_err_has(err, "t.safetensors: ");
    assert_err_has(err, sub);
    free(b.p);
}

static void check_small(const pt_safetensors *st, const uint8_t *base) {
    size_t data = pt_safetensors_data_offset(st);
    assert_int_equal(data, 8 + strlen(small_json));
    assert_int_equal(pt_safetensors_n_tensors(st), 4);
    /* data order: the empty tensor e sits at the end of s */
    assert_string_equal(pt_safetensors_tensor(st, 0)->name, "a");
    assert_string_equal(pt_safetensors_tensor(st, 1)->name, "b");
    assert_string_equal(pt_safetensors_tensor(st, 2)->name, "s");
    assert_string_equal(pt_safetensors_tensor(st, 3)->name, "e");
    assert_null(pt_safetensors_tensor(st, 4));

    const pt_tensor_info *a = pt_safetensors_find(st, "a");
    assert_non_null(a);
    assert_int_equal(a->dtype, PT_F32);
    assert_int_equal(a->ndim, 2);
    assert_int_equal(a->shape[0], 2);
    assert_int_equal(a->shape[1], 3);
    assert_int_equal(a->nbytes, 24);
    assert_ptr_equal(a->data, base + data);
    const pt_tensor_info *b = pt_safetensors_find(st, "b");
    assert_int_equal(b->dtype, PT_BF16);
    assert_int_equal(b->nbytes, 8);
    assert_int_equal(((const uint8_t *)b->data)[0], pattern(24));
    const pt_tensor_info *s = pt_safetensors_find(st, "s");
    assert_int_equal(s->dtype, PT_I64);
    assert_int_equal(s->ndim, 0);
    assert_int_equal(s->nbytes, 8);
    const pt_tensor_info *e = pt_safetensors_find(st, "e");
    assert_int_equal(e->ndim, 1);
    assert_int_equal(e->shape[0], 0);
    assert_int_equal(e->nbytes, 0);
    assert_null(pt_safetensors_find(st, "z"));
    assert_null(pt_safetensors_find(st, "__metadata__"));

    assert_non_null(pt_safetensors_metadata(st));
    assert_string_equal(pt_safetensors_meta_str(st, "format"), "pt");
    assert_null(pt_safetensors_meta_str(st, "n")); /* not a string */
    assert_null(pt_safetensors_meta_str(st, "missing"));
}

static void test_roundtrip(void **state) {
    buf b = build_st(small_json, 40);
    pt_safetensors *st;
    pt_err err = {{0}};
    if (parse_exact(&st, b.p, b.n, &err)) fail_msg("%s", err.msg);
    check_small(st, b.p);
    pt_safetensors_close(st);

    /* every cut must fail: the last bytes belong to s */
    for (size_t cut = 0; cut < b.n; cut++) {
        assert_int_equal(parse_exact(&st, b.p, cut, &err), -1);
        assert_err_has(err, "t.safetensors: ");
    }
    free(b.p);
}

static void test_roundtrip_file(void **state) {
    char dir[] = "/tmp/petrel-st-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[64];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    buf b = build_st(small_json, 40);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(b.p, 1, b.n, f), b.n);
    fclose(f);
    pt_safetensors *st;
    pt_err err = {{0}};
    if (pt_safetensors_open(&st, path, &err)) fail_msg("%s", err.msg);
    const pt_tensor_info *s = pt_safetensors_find(st, "s");
    assert_int_equal(((const uint8_t *)s->data)[7], pattern(39));
    pt_safetensors_close(st);
    assert_int_equal(pt_safetensors_open(&st, dir, &err), -1);
    assert_err_has(err, "not a regular file");
    unlink(path);
    assert_int_equal(pt_safetensors_open(&st, path, &err), -1);
    assert_err_has(err, "No such file");
    rmdir(dir);
    free(b.p);
}

static void test_empty_and_gaps(void **state) {
    buf b = build_st("{}", 0);
    pt_safetensors *st;
    pt_err err = {{0}};
    if (parse_exact(&st, b.p, b.n, &err)) fail_msg("%s", err.msg);
    assert_int_equal(pt_safetensors_n_tensors(st), 0);
    assert_null(pt_safetensors_metadata(st));
    pt_safetensors_close(st);
    free(b.p);

    /* holes between tensors and after the last are accepted (docs/formats.md) */
    b = build_st("{\"x\": {\"dtype\": \"I8\", \"shape\": [2], \"data_offsets\": [4, 6]},"
                 " \"y\": {\"dtype\": \"I8\", \"shape\": [1], \"data_offsets\": [8, 9]}}",
                 16);
    if (parse_exact(&st, b.p, b.n, &err)) fail_msg("%s", err.msg);
    assert_int_equal(pt_safetensors_n_tensors(st), 2);
    pt_safetensors_close(st);
    free(b.p);
}

/* ---- damaged files ------------------------------------------------------- */

static void test_bad_header_length(void **state) {
    pt_safetensors *st;
    pt_err err = {{0}};
    uint8_t small[5] = {1, 0, 0, 0, 0};
    assert_int_equal(parse_exact(&st, small, sizeof small, &err), -1);
    assert_err_has(err, "t.safetensors: file is 5 bytes, too small for the 8-byte header length");

    buf b = build_st("{}", 0);
    uint64_t n = 1000;
    memcpy(b.p, &n, 8);
    assert_int_equal(parse_exact(&st, b.p, b.n, &err), -1);
    assert_err_has(err, "t.safetensors: header length 1000 runs past end of file (size 10)");
    n = UINT64_MAX;
    memcpy(b.p, &n, 8);
    assert_int_equal(parse_exact(&st, b.p, b.n, &err), -1);
    assert_err_has(err, "header length 18446744073709551615 exceeds the 104857600-byte limit");
    n = 1;
    memcpy(b.p, &n, 8);
    assert_int_equal(parse_exact(&st, b.p, b.n, &err), -1);
    assert_err_has(err, "t.safetensors: header JSON: ");
    free(b.p);
}

static void test_bad_json(void **state) {
    expect_error("{\"a\": {", 0, "header JSON: ");
    expect_error("[1, 2]", 0, "header is not a JSON object");
    expect_error("{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]},"
                 " \"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 8]}}",
                 8, "duplicate object key");
    expect_error("{\"__metadata__\": [1]}", 0, "__metadata__ is not an object");
    expect_error("{\"a\": 7}", 0, "tensor a: entry is not an object");
    expect_error("{\"\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}}", 4,
                 "tensor with an empty name");
    expect_error("{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}} \x01", 4,
                 "header JSON: ");
}

static void test_bad_entries(void **state) {
    expect_error("{\"w\": {\"dtype\": \"F8_E4M3\", \"shape\": [4], \"data_offsets\": [0, 4]}}", 4,
                 "tensor w: unknown or unsupported dtype \"F8_E4M3\"");
    expect_error("{\"w\": {\"shape\": [4], \"data_offsets\": [0, 4]}}", 4,
                 "tensor w: dtype missing or not a string");
    expect_error("{\"w\": {\"dtype\": \"F32\", \"data_offsets\": [0, 4]}}", 4,
                 "tensor w: shape missing or not an array");
    expect_error("{\"w\": {\"dtype\": \"F32\", \"shape\": [1, -2], \"data_offsets\": [0, 4]}}", 4,
                 "tensor w: shape[1] is not a non-negative integer");
    expect_error("{\"w\": {\"dtype\": \"F32\", \"shape\": [1.5], \"data_offsets\": [0, 4]}}", 4,
                 "tensor w: shape[0] is not a non-negative integer");
    expect_error("{\"w\": {\"dtype\": \"F32\", \"shape\": [1,1,1,1,1], \"data_offsets\": [0, 4]}}",
                 4, "tensor w: shape has 5 dimensions (at most 4 supported)");
    expect_error("{\"w\": {\"dtype\": \"F32\", \"shape\": [2, 3], \"data_offsets\": [0, 20]}}", 24,
                 "tensor w: 6 elements of F32 are 24 bytes but data_offsets [0, 20] span 20");
    expect_error("{\"w\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [8, 0]}}", 8,
                 "tensor w: data_offsets must be [begin, end] with 0 <= begin <= end");
    expect_error("{\"w\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0]}}", 8,
                 "tensor w: data_offsets must be");
    expect_error("{\"w\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [-8, 0]}}", 8,
                 "tensor w: data_offsets must be");
    expect_error("{\"w\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [4, 12]}}", 8,
                 "tensor w: data_offsets [4, 12] run past the end of the data section (8 bytes)");
    expect_error("{\"w\": {\"dtype\": \"F32\", \"shape\": [4611686018427387904, 4],"
                 " \"data_offsets\": [0, 0]}}",
                 0, "tensor w: element count overflows");
    expect_error("{\"w\": {\"dtype\": \"F64\", \"shape\": [4611686018427387904],"
                 " \"data_offsets\": [0, 0]}}",
                 0, "tensor w: byte size overflows");
    expect_error("{\"w\": {\"dtype\": \"F32\", \"shape\": [2],"
                 " \"data_offsets\": [0, 9223372036854775807]}}",
                 8, "tensor w: data_offsets [0, 9223372036854775807] run past the end");
}

static void test_overlap(void **state) {
    expect_error("{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]},"
                 " \"b\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [4, 12]}}",
                 12, "tensors a and b overlap");
    expect_error("{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]},"
                 " \"b\": {\"dtype\": \"I64\", \"shape\": [1], \"data_offsets\": [0, 8]}}",
                 8, "tensors a and b overlap");
    /* an empty tensor inside another one's range shares no bytes */
    buf b = build_st("{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]},"
                     " \"z\": {\"dtype\": \"F32\", \"shape\": [0, 5], \"data_offsets\": [4, 4]}}",
                     8);
    pt_safetensors *st;
    pt_err err = {{0}};
    if (parse_exact(&st, b.p, b.n, &err)) fail_msg("%s", err.msg);
    pt_safetensors_close(st);
    free(b.p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip),      cmocka_unit_test(test_roundtrip_file),
        cmocka_unit_test(test_empty_and_gaps), cmocka_unit_test(test_bad_header_length),
        cmocka_unit_test(test_bad_json),       cmocka_unit_test(test_bad_entries),
        cmocka_unit_test(test_overlap),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
