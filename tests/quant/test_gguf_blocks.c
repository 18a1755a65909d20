/*
 * test_gguf_blocks.c - GGUF block quants against llama.cpp.
 *
 * 1. Blocks built by hand from the documented layouts decode to the values
 *    the layout says (one per format, every field exercised).
 * 2. tests/quant/data/gguf_golden.json (gen_gguf_golden.sh: llama.cpp's own
 *    libggml-base.so) gives inputs, the blocks llama.cpp's reference
 *    quantizer wrote and the floats its dequantizer read back: our
 *    dequantizer must reproduce those floats bit for bit, our q8_0/q4_0
 *    quantizers those blocks byte for byte, and our simpler k-quant
 *    quantizers must come within a factor of llama.cpp's error.
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

#define GOLDEN PETREL_SOURCE_DIR "/tests/quant/data/gguf_golden.json"

static void put_f16(uint8_t *p, float v) {
    uint16_t h = pt_f32_to_f16(v);
    memcpy(p, &h, 2);
}

/* ---- hand-built blocks --------------------------------------------------- */

static void test_q8_0_by_hand(void **state) {
    (void)state;
    uint8_t b[34];
    put_f16(b, 0.25f);
    for (int j = 0; j < 32; j++) b[2 + j] = (uint8_t)(int8_t)(j - 16);
    float y[32];
    pt_gguf_dequantize(PT_Q8_0, b, y, 32);
    for (int j = 0; j < 32; j++) assert_true(y[j] == 0.25f * (float)(j - 16));
}

static void test_q4_0_by_hand(void **state) {
    (void)state;
    uint8_t b[18];
    put_f16(b, 0.5f);
    for (int j = 0; j < 16; j++) b[2 + j] = (uint8_t)(j | (15 - j) << 4);
    float y[32];
    pt_gguf_dequantize(PT_Q4_0, b, y, 32);
    for (int j = 0; j < 16; j++) {
        assert_true(y[j] == 0.5f * (float)(j - 8));       /* low nibbles: first half */
        assert_true(y[j + 16] == 0.5f * (float)(7 - j));  /* high nibbles: second half */
    }
}

/* Scales of sub-block j in a q4_k/q5_k block built below: sc = 3 + 7j (up
 * to 52, so the high bits of j >= 4 are used), m = 60 - 5j. */
static void k_scales(uint8_t s[12], int sc[8], int m[8]) {
    memset(s, 0, 12);
    for (int j = 0; j < 8; j++) {
        sc[j] = 3 + 7 * j;
        m[j] = 60 - 5 * j;
    }
    /* the documented packing: j < 4 in the low 6 bits of bytes j and j+4;
     * j >= 4: low nibbles in byte j+4, high 2 bits in the top of bytes j-4
     * (scale) and j (min) */
    for (int j = 0; j < 4; j++) s[j] = (uint8_t)sc[j], s[j + 4] = (uint8_t)m[j];
    for (int j = 4; j < 8; j++) {
        s[j + 4] = (uint8_t)((sc[j] & 15) | (m[j] & 15) << 4);
        s[j - 4] |= (uint8_t)((sc[j] >> 4) << 6);
        s[j] |= (uint8_t)((m[j] >> 4) << 6);
    }
}

static void test_q4_k_by_hand(void **state) {
    (void)state;
    uint8_t b[144];
    int sc[8], m[8];
    put_f16(b, 0.125f);
    put_f16(b + 2, 0.0625f);
    k_scales(b + 4, sc, m);
    int q[256];
    for (int e = 0; e < 256; e++) q[e] = (e * 7 + 3) % 16;
    /* 32 bytes per 64 weights: low nibbles the first 32, high the next */
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++)
            b[16 + 32 * c + l] = (uint8_t)(q[64 * c + l] | q[64 * c + 32 + l] << 4);
    float y[256];
    pt_gguf_dequantize(PT_Q4_K, b, y, 256);
    for (int e = 0; e < 256; e++) {
        int j = e / 32;
        float want = 0.125f * (float)sc[j] * (float)q[e] - 0.0625f * (float)m[j];
        if (fabsf(y[e] - want) > 1e-6f) fail_msg("q4_k element %d: %g, want %g", e, y[e], want);
    }
}

static void test_q5_k_by_hand(void **state) {
    (void)state;
    uint8_t b[176] = {0};
    int sc[8], m[8];
    put_f16(b, 0.125f);
    put_f16(b + 2, 0.0625f);
    k_scales(b + 4, sc, m);
    int q[256];
    for (int e = 0; e < 256; e++) q[e] = (e * 11 + 5) % 32;
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) {
            int lo = q[64 * c + l], hi = q[64 * c + 32 + l];
            b[48 + 32 * c + l] = (uint8_t)((lo & 15) | (hi & 15) << 4);
            b[16 + l] |= (uint8_t)((lo >> 4) << (2 * c) | (hi >> 4) << (2 * c + 1));
        }
    float y[256];
    pt_gguf_dequantize(PT_Q5_K, b, y, 256);
    for (int e = 0; e < 256; e++) {
        int j = e / 32;
        float want = 0.125f * (float)sc[j] * (float)q[e] - 0.0625f * (float)m[j];
        if (fabsf(y[e] - want) > 1e-6f) fail_msg("q5_k element %d: %g, want %g", e, y[e], want);
    }
}

static void test_q6_k_by_hand(void **state) {
    (void)state;
    uint8_t b[210] = {0};
    int q[256];
    for (int e = 0; e < 256; e++) q[e] = (e * 13 + 1) % 64;
    /* per 128 weights: ql[64] low nibbles (l, l+32 | l+64, l+96 in the high
     * nibble), qh[32] two bits each for l, l+32, l+64, l+96 */
    for (int h = 0; h < 2; h++)
        for (int l = 0; l < 32; l++) {
            const int *Q = q + 128 * h;
            b[64 * h + l] = (uint8_t)((Q[l] & 15) | (Q[l + 64] & 15) << 4);
            b[64 * h + l + 32] = (uint8_t)((Q[l + 32] & 15) | (Q[l + 96] & 15) << 4);
            b[128 + 32 * h + l] = (uint8_t)((Q[l] >> 4) | (Q[l + 32] >> 4) << 2 |
                                            (Q[l + 64] >> 4) << 4 | (Q[l + 96] >> 4) << 6);
        }
    for (int j = 0; j < 16; j++) b[192 + j] = (uint8_t)(int8_t)(j % 2 ? -(j + 1) : j + 1);
    put_f16(b + 208, 0.03125f);
    float y[256];
    pt_gguf_dequantize(PT_Q6_K, b, y, 256);
    for (int e = 0; e < 256; e++) {
        int j = e / 16, sc = j % 2 ? -(j + 1) : j + 1;
        float want = 0.03125f * (float)sc * (float)(q[e] - 32);
        if (y[e] != want) fail_msg("q6_k element %d: %g, want %g", e, y[e], want);
    }
}

/* ---- llama.cpp goldens --------------------------------------------------- */

static int unhex(const char *s, uint8_t *out, size_t n) {
    if (strlen(s) != 2 * n) return -1;
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        if (sscanf(s + 2 * i, "%2x", &v) != 1) return -1;
        out[i] = (uint8_t)v;
    }
    return 0;
}

static pt_dtype type_of(const char *name) {
    static const struct {
        const char *name;
        pt_dtype t;
    } map[] = {{"q8_0", PT_Q8_0}, {"q4_0", PT_Q4_0}, {"q4_K", PT_Q4_K}, {"q5_K", PT_Q5_K}, {"q6_K", PT_Q6_K}};
    for (size_t i = 0; i < PT_ARRAY_LEN(map); i++)
        if (strcmp(map[i].name, name) == 0) return map[i].t;
    fail_msg("unknown type %s", name);
    return PT_F32;
}

static double rmse(const float *a, const float *b, int n) {
    double s = 0;
    for (int i = 0; i < n; i++) s += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
    return sqrt(s / n);
}

static void test_llama_cpp_goldens(void **state) {
    (void)state;
    json_error_t je;
    json_t *root = json_load_file(GOLDEN, 0, &je);
    if (!root) fail_msg("%s: %s", GOLDEN, je.text);
    json_t *cases = json_object_get(root, "cases");
    assert_true(json_array_size(cases) >= 25);
    size_t i;
    json_t *c;
    json_array_foreach(cases, i, c) {
        const char *tn = json_string_value(json_object_get(c, "type"));
        pt_dtype t = type_of(tn);
        int n = (int)json_integer_value(json_object_get(c, "n")), kind = (int)json_integer_value(json_object_get(c, "kind"));
        size_t nb = pt_dtype_bytes(t, (uint64_t)n);
        uint8_t *blocks = malloc(nb), *mine = malloc(nb);
        float *x = malloc(sizeof(float) * n), *want = malloc(sizeof(float) * n),
              *got = malloc(sizeof(float) * n);
        assert_int_equal(unhex(json_string_value(json_object_get(c, "blocks")), blocks, nb), 0);
        assert_int_equal(unhex(json_string_value(json_object_get(c, "dequant_f32_hex")),
                               (uint8_t *)want, sizeof(float) * n), 0);
        for (int k = 0; k < n; k++) x[k] = (float)json_number_value(json_array_get(json_object_get(c, "input"), (size_t)k));

        /* dequantizing llama.cpp's blocks: bit-exact */
        pt_gguf_dequantize(t, blocks, got, n);
        for (int k = 0; k < n; k++)
            if (memcmp(&got[k], &want[k], 4) != 0)
                fail_msg("%s case %d element %d: we read %.9g, llama.cpp %.9g", tn, kind, k, got[k], want[k]);

        /* quantizing */
        pt_gguf_quantize(t, x, mine, n);
        if (t == PT_Q8_0 || t == PT_Q4_0) {
            if (memcmp(mine, blocks, nb) != 0) fail_msg("%s case %d: blocks differ from llama.cpp's", tn, kind);
        } else {
            pt_gguf_dequantize(t, mine, got, n);
            double ours = rmse(x, got, n), theirs = rmse(x, want, n);
            if (ours > 2.0 * theirs + 1e-6)
                fail_msg("%s case %d: our rmse %.4g vs llama.cpp's %.4g", tn, kind, ours, theirs);
        }
        free(blocks), free(mine), free(x), free(want), free(got);
    }
    json_decref(root);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_q8_0_by_hand),  cmocka_unit_test(test_q4_0_by_hand),
        cmocka_unit_test(test_q4_k_by_hand),  cmocka_unit_test(test_q5_k_by_hand),
        cmocka_unit_test(test_q6_k_by_hand),  cmocka_unit_test(test_llama_cpp_goldens),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
