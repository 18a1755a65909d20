/*
 * test_affine.c - MLX affine quantization: golden vectors, worked examples,
 * MLX's packing, and the error bound MLX's own tests assert.
 *
 * Goldens (tests/quant/data/affine_golden.json) come from a second,
 * independent implementation of MLX's formulas (gen_affine_golden.py):
 * every bits x group size x scale dtype, on random rows, constant rows,
 * zeros, extreme ranges, tiny values and either sign dominant.  Codes,
 * stored scales and biases, and dequantized values must match bit for bit.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>
#include <jansson.h>

#include "quant/quant.h"

#define GOLDEN PETREL_SOURCE_DIR "/tests/quant/data/affine_golden.json"

static size_t unhex(const char *s, uint8_t *out, size_t cap) {
    size_t n = strlen(s) / 2;
    assert_true(n <= cap);
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        assert_int_equal(sscanf(s + 2 * i, "%2x", &v), 1);
        out[i] = (uint8_t)v;
    }
    return n;
}

static pt_dtype scale_type(const char *s) {
    return strcmp(s, "f16") == 0 ? PT_F16 : strcmp(s, "bf16") == 0 ? PT_BF16 : PT_F32;
}

static void test_goldens(void **state) {
    (void)state;
    json_error_t je;
    json_t *root = json_load_file(GOLDEN, 0, &je);
    if (!root) fail_msg("%s: %s", GOLDEN, je.text);
    int cols = (int)json_integer_value(json_object_get(root, "cols"));
    json_t *inputs = json_object_get(root, "inputs_f32_hex"), *cases = json_object_get(root, "cases");
    int seen[9][129] = {{0}};
    size_t i;
    json_t *c;
    json_array_foreach(cases, i, c) {
        int bits = (int)json_integer_value(json_object_get(c, "bits"));
        int gs = (int)json_integer_value(json_object_get(c, "group_size"));
        const char *kind = json_string_value(json_object_get(c, "kind"));
        pt_dtype st = scale_type(json_string_value(json_object_get(c, "scale_dtype")));
        float w[256], deq[256], want_deq[256];
        uint8_t want_q[256], want_s[1024], want_b[1024], s[1024], b[1024];
        uint32_t q[64];
        assert_true(cols <= 256);
        unhex(json_string_value(json_object_get(inputs, kind)), (uint8_t *)w, sizeof w);
        size_t nq = unhex(json_string_value(json_object_get(c, "packed_hex")), want_q, sizeof want_q);
        size_t ns = unhex(json_string_value(json_object_get(c, "scales_hex")), want_s, sizeof want_s);
        unhex(json_string_value(json_object_get(c, "biases_hex")), want_b, sizeof want_b);
        unhex(json_string_value(json_object_get(c, "dequant_f32_hex")), (uint8_t *)want_deq, sizeof want_deq);
        assert_int_equal(nq, (size_t)pt_affine_row_words(cols, bits) * 4);

        pt_affine_quantize_row(w, cols, bits, gs, st, q, s, b);
        if (memcmp(q, want_q, nq)) fail_msg("%d-bit g%d %s: packed codes differ", bits, gs, kind);
        if (memcmp(s, want_s, ns)) fail_msg("%d-bit g%d %s: scales differ", bits, gs, kind);
        if (memcmp(b, want_b, ns)) fail_msg("%d-bit g%d %s: biases differ", bits, gs, kind);
        pt_affine_dequantize_row(q, s, b, st, cols, bits, gs, deq);
        for (int k = 0; k < cols; k++)
            if (memcmp(&deq[k], &want_deq[k], 4))
                fail_msg("%d-bit g%d %s element %d: %.9g, want %.9g", bits, gs, kind, k, deq[k], want_deq[k]);
        seen[bits][gs]++;
    }
    static const int all_bits[] = {2, 3, 4, 5, 6, 8}, all_gs[] = {32, 64, 128};
    for (int x = 0; x < 6; x++)
        for (int y = 0; y < 3; y++)
            if (!seen[all_bits[x]][all_gs[y]]) fail_msg("no golden for %d bits, group %d", all_bits[x], all_gs[y]);
    json_decref(root);
}

/* Worked example (docs/formats.md): a 4-bit group of 32 whose minimum -1
 * dominates its maximum 0.5.  s = 1.5 / 15 = 0.1, edge = -1,
 * q0 = rint(-1 / 0.1) = -10, so s = -1 / -10 = 0.1 and bias = -1; the
 * weight -1 + 0.1 k has code k. */
static void test_worked_min_dominant(void **state) {
    (void)state;
    float w[32], s, b;
    for (int j = 0; j < 32; j++) w[j] = -1.0f + 0.1f * (float)(j % 16);
    pt_affine_group_params(w, 32, 4, &s, &b);
    assert_float_equal(s, 0.1f, 1e-7f);
    assert_true(b == -1.0f);
    uint32_t q[4];
    uint16_t sc, bi;
    pt_affine_quantize_row(w, 32, 4, 32, PT_F16, q, &sc, &bi);
    for (int j = 0; j < 32; j++) assert_int_equal(pt_affine_code(q, j, 4), j % 16);
    assert_int_equal(q[0], 0x76543210u); /* first code in the lowest nibble */
}

/* A 2-bit group dominated by its maximum 1.0 (minimum -0.2): the scale is
 * negative and codes count down from the maximum.  s = -(1.2 / 3) = -0.4,
 * q0 = rint(1 / -0.4) = rint(-2.5) = -2 (halfway rounds to even), so
 * s = 1 / -2 = -0.5, bias = 1: codes 0, 1, 2, 3 stand for 1, 0.5, 0, -0.5,
 * and zero is exact. */
static void test_worked_max_dominant(void **state) {
    (void)state;
    float w[32] = {1.0f, -0.2f, 0.5f, 0.0f}, s, b;
    pt_affine_group_params(w, 32, 2, &s, &b);
    assert_true(s == -0.5f);
    assert_true(b == 1.0f);
    uint32_t q[2];
    float sc, bi, back[32];
    pt_affine_quantize_row(w, 32, 2, 32, PT_F32, q, &sc, &bi);
    assert_int_equal(pt_affine_code(q, 0, 2), 0);
    assert_int_equal(pt_affine_code(q, 1, 2), 2); /* -0.2 -> rint(2.4) = 2 -> 0.0 */
    assert_int_equal(pt_affine_code(q, 2, 2), 1);
    assert_int_equal(pt_affine_code(q, 3, 2), 2);
    pt_affine_dequantize_row(q, &sc, &bi, PT_F32, 32, 2, 32, back);
    assert_true(back[3] == 0.0f && back[0] == 1.0f && back[2] == 0.5f);
}

/* A constant group: the scale is the 1e-7 floor, the bias the constant;
 * zeros give bias 0 and dequantize to exactly 0 (MLX's own test). */
static void test_constant_and_zero_groups(void **state) {
    (void)state;
    static const int all_bits[] = {2, 3, 4, 5, 6, 8};
    for (int i = 0; i < 6; i++) {
        float w[64], z[64] = {0}, back[64];
        for (int j = 0; j < 64; j++) w[j] = 0.3f;
        uint32_t q[16];
        uint16_t s, b;
        pt_affine_quantize_row(w, 64, all_bits[i], 64, PT_BF16, q, &s, &b);
        pt_affine_dequantize_row(q, &s, &b, PT_BF16, 64, all_bits[i], 64, back);
        for (int j = 0; j < 64; j++) assert_true(back[j] == pt_bf16_to_f32(pt_f32_to_bf16(0.3f)));
        pt_affine_quantize_row(z, 64, all_bits[i], 64, PT_F16, q, &s, &b);
        pt_affine_dequantize_row(q, &s, &b, PT_F16, 64, all_bits[i], 64, back);
        for (int j = 0; j < 64; j++) assert_true(back[j] == 0.0f);
    }
}

/* MLX's 3-, 5- and 6-bit layouts, decoded the way MLX's extract_bits
 * does (byte masks), must agree with our bit stream. */
static void test_mlx_byte_layouts(void **state) {
    (void)state;
    uint32_t q[8] = {0};
    for (int i = 0; i < 8; i++) pt_affine_set_code(q, i, 3, (unsigned)(7 - i));
    const uint8_t *p = (const uint8_t *)q;
    int w3[8] = {p[0] & 7, (p[0] & 0x38) >> 3, ((p[0] & 0xc0) >> 6) + ((p[1] & 1) << 2),
                 (p[1] & 0xe) >> 1, (p[1] & 0x70) >> 4, ((p[1] & 0x80) >> 7) + ((p[2] & 3) << 1),
                 (p[2] & 0x1c) >> 2, (p[2] & 0xe0) >> 5};
    for (int i = 0; i < 8; i++) assert_int_equal(w3[i], 7 - i);

    memset(q, 0, sizeof q);
    for (int i = 0; i < 8; i++) pt_affine_set_code(q, i, 5, (unsigned)(3 * i + 1));
    int w5[8] = {p[0] & 0x1f, ((p[0] & 0xe0) >> 5) + ((p[1] & 3) << 3), (p[1] & 0x7c) >> 2,
                 ((p[1] & 0x80) >> 7) + ((p[2] & 0xf) << 1), ((p[2] & 0xf0) >> 4) + ((p[3] & 1) << 4),
                 (p[3] & 0x3e) >> 1, ((p[3] & 0xc0) >> 6) + ((p[4] & 7) << 2), (p[4] & 0xf8) >> 3};
    for (int i = 0; i < 8; i++) assert_int_equal(w5[i], 3 * i + 1);

    memset(q, 0, sizeof q);
    for (int i = 0; i < 4; i++) pt_affine_set_code(q, i, 6, (unsigned)(60 - 13 * i));
    int w6[4] = {p[0] & 0x3f, ((p[0] >> 6) & 3) + ((p[1] & 0xf) << 2),
                 ((p[1] >> 4) & 0xf) + ((p[2] & 3) << 4), (p[2] >> 2) & 0x3f};
    for (int i = 0; i < 4; i++) assert_int_equal(w6[i], 60 - 13 * i);

    memset(q, 0, sizeof q);
    for (int i = 0; i < 32; i++) pt_affine_set_code(q, i, 8, (unsigned)i);
    assert_int_equal(q[0], 0x03020100u);
    assert_int_equal(q[1], 0x07060504u);
}

/* Every code position of every width round-trips, neighbours untouched. */
static void test_code_round_trip(void **state) {
    (void)state;
    static const int all_bits[] = {2, 3, 4, 5, 6, 8};
    for (int i = 0; i < 6; i++) {
        int bits = all_bits[i];
        uint32_t q[64] = {0};
        for (int k = 0; k < 256; k++) pt_affine_set_code(q, k, bits, (unsigned)(k * 37 + 11));
        for (int k = 0; k < 256; k++)
            assert_int_equal(pt_affine_code(q, k, bits), (k * 37 + 11) & ((1 << bits) - 1));
    }
}

/* MLX's test: |w - dequant(quant(w))| <= |scale| (+ eps) everywhere. */
static void test_error_bound(void **state) {
    (void)state;
    pt_rng rng;
    pt_rng_seed(&rng, 3);
    static const int all_bits[] = {2, 3, 4, 5, 6, 8}, all_gs[] = {32, 64, 128};
    float w[512], back[512], s[16], b[16];
    uint32_t q[128];
    for (int i = 0; i < 6; i++)
        for (int g = 0; g < 3; g++) {
            for (int k = 0; k < 512; k++) w[k] = (float)(pt_rng_uniform(&rng) * 2 - 1);
            pt_affine_quantize_row(w, 512, all_bits[i], all_gs[g], PT_F32, q, s, b);
            pt_affine_dequantize_row(q, s, b, PT_F32, 512, all_bits[i], all_gs[g], back);
            for (int k = 0; k < 512; k++)
                assert_true(fabsf(w[k] - back[k]) <= fabsf(s[k / all_gs[g]]) + 1e-6f);
        }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_goldens),
        cmocka_unit_test(test_worked_min_dominant),
        cmocka_unit_test(test_worked_max_dominant),
        cmocka_unit_test(test_constant_and_zero_groups),
        cmocka_unit_test(test_mlx_byte_layouts),
        cmocka_unit_test(test_code_round_trip),
        cmocka_unit_test(test_error_bound),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
