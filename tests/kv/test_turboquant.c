/*
 * test_turboquant.c - the TurboQuant codec against its reference.
 *
 * Golden vectors (tests/fixtures/turboquant/goldens.txt) come from
 * tq_ref.py, an independent model of the reference's float32 path that
 * reproduces the reference README's worked example; every head dim, every
 * key and value bit width, random rows and the corner cases (zeros,
 * constant groups, fp16 extremes, huge and tiny values, large offsets,
 * NaN/Inf).  Packed bytes, fp16 scales and zero points must be
 * bit-identical, and so must the decoded rows.  Where the reference would
 * store a non-finite value the goldens hold Petrel's repair, and we check
 * that the repair triggered exactly there.  Round-trip MSE on N(0,1) must
 * match the reference's published figures.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

#include "base/base.h"
#include "kv/turboquant.h"

#define GOLDENS PETREL_SOURCE_DIR "/tests/fixtures/turboquant/goldens.txt"

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint32_t fnv(const float *x, int n) {
    uint32_t h = 0x811c9dc5u;
    for (int i = 0; i < n; i++) {
        uint32_t u = f32_bits(x[i]);
        for (int b = 0; b < 4; b++)
            h = (h ^ ((u >> (8 * b)) & 0xff)) * 0x01000193u;
    }
    return h;
}

static double gauss(pt_rng *r) {
    double u1 = pt_rng_uniform(r), u2 = pt_rng_uniform(r);
    return sqrt(-2.0 * log(u1 + 1e-300)) * cos(2 * M_PI * u2);
}

static void hex_bytes(const char *s, uint8_t *out, size_t n) {
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        assert_int_equal(sscanf(s + 2 * i, "%2x", &v), 1);
        out[i] = (uint8_t)v;
    }
}

/* ---- constants and packing ----------------------------------------------------- */

static void test_constants(void **state) {
    (void)state;
    static const struct {
        int d, minus;
        uint32_t inv_hex;
    } dims[] = {{64, 29, 0x3e000000},
                {128, 59, 0x3db504f3},
                {256, 132, 0x3d800000},
                {512, 250, 0x3d3504f3}};
    float s[PT_TQ_MAX_DIM];
    for (size_t i = 0; i < PT_ARRAY_LEN(dims); i++) {
        assert_int_equal(pt_tq_signs(dims[i].d, s), 0);
        int minus = 0;
        for (int j = 0; j < dims[i].d; j++)
            minus += s[j] < 0;
        assert_int_equal(minus, dims[i].minus);
        assert_int_equal(f32_bits(pt_tq_inv_sqrt(dims[i].d)), dims[i].inv_hex);
    }
    assert_int_equal(pt_tq_signs(80, s), -1);
    /* The README's d = 64 sign string, element 0 first. */
    const char *want = "+---+++-++-+-+-+-++-+--+---+--+-+-+++++++++-++-++----+--+-+++--+";
    pt_tq_signs(64, s);
    for (int j = 0; j < 64; j++)
        assert_true((s[j] < 0) == (want[j] == '-'));
    /* 3-bit literals, and the 2-bit table's float32 bit patterns. */
    assert_int_equal(f32_bits(pt_tq_centroids(3)[0]), 0xc009b98c);
    assert_int_equal(f32_bits(pt_tq_boundaries(3)[6]), 0x3fdfbc2c);
    assert_int_equal(f32_bits(pt_tq_centroids(2)[3]), 0x3fc18e33);
    assert_int_equal(f32_bits(pt_tq_boundaries(2)[1]), 0xbb9d2ba0);
    static const int vbits[] = {2, 3, 4, 5, 8};
    for (size_t i = 0; i < PT_ARRAY_LEN(vbits); i++) {
        const float *c = pt_tq_centroids(vbits[i]), *b = pt_tq_boundaries(vbits[i]);
        int n = 1 << vbits[i];
        for (int j = 0; j + 1 < n; j++) {
            assert_true(c[j] < c[j + 1]);
            assert_true(c[j] < b[j] && b[j] < c[j + 1]);
        }
    }
    assert_null(pt_tq_centroids(6));
    assert_true(pt_tq_k_bits_ok(5) && !pt_tq_k_bits_ok(3) && pt_tq_v_bits_ok(3));
    assert_true(pt_tq_dim_ok(128, false) && !pt_tq_dim_ok(32, false) && pt_tq_dim_ok(32, true));
}

static void test_packing_examples(void **state) {
    (void)state;
    static const struct {
        int bits, n;
        int32_t codes[8];
        const char *hex;
    } ex[] = {
        {2, 8, {0, 1, 2, 3, 0, 1, 2, 3}, "e4e4"},
        {3, 8, {0, 1, 2, 3, 4, 5, 6, 7}, "88c6fa"},
        {4, 8, {0, 1, 2, 3, 4, 5, 6, 7}, "10325476"},
        {5, 8, {0, 1, 2, 3, 4, 5, 6, 7}, "2088418a39"},
        {5, 8, {1, 2, 3, 4, 5, 6, 7, 8}, "410c52cc41"},
        {8, 3, {-1, 127, -127}, "ff7f81"},
    };
    for (size_t i = 0; i < PT_ARRAY_LEN(ex); i++) {
        uint8_t out[8] = {0}, want[8];
        size_t nb = (size_t)ex[i].n * ex[i].bits / 8;
        pt_tq_pack(ex[i].codes, ex[i].n, ex[i].bits, out);
        hex_bytes(ex[i].hex, want, nb);
        assert_memory_equal(out, want, nb);
        int32_t back[8];
        pt_tq_unpack(out, ex[i].n, ex[i].bits, true, back);
        assert_memory_equal(back, ex[i].codes, sizeof(int32_t) * (size_t)ex[i].n);
    }
    /* Random round trips at every width. */
    pt_rng r;
    pt_rng_seed(&r, 3);
    static const int widths[] = {2, 3, 4, 5, 8};
    for (size_t w = 0; w < PT_ARRAY_LEN(widths); w++) {
        int32_t c[512], back[512];
        uint8_t buf[512];
        for (int i = 0; i < 512; i++)
            c[i] = (int32_t)(pt_rng_next(&r) % (1u << widths[w]));
        pt_tq_pack(c, 512, widths[w], buf);
        pt_tq_unpack(buf, 512, widths[w], false, back);
        assert_memory_equal(c, back, sizeof c);
    }
}

/* ---- the README's worked example ---------------------------------------------------- */

static const float ex_k[32] = {0.917,  1.285, 0.988,  -0.284, -0.536, 0.340,  0.817,  0.606,
                               1.386,  0.751, 0.684,  -0.139, -0.365, 1.191,  0.329,  0.787,
                               -0.526, 0.038, -0.475, -0.165, 0.842,  -0.588, -0.020, 0.398,
                               -0.101, 0.149, 0.167,  0.551,  0.041,  0.463,  0.334,  0.555};

static void test_worked_example_keys(void **state) {
    (void)state;
    uint8_t codes[32], want[32];
    uint16_t s, z;
    assert_int_equal(pt_tq_encode_k(ex_k, 32, 32, 8, codes, &s, &z), 0);
    assert_int_equal(s, 0x1ff5);
    assert_true(pt_f16_to_f32(z) == 51.0f);
    hex_bytes("43724ca888f9361b7f2e25bb9e66f73289d290b83981ca00c0e0e214d209f814", want, 32);
    assert_memory_equal(codes, want, 32);
    float x[32];
    pt_tq_decode_k(codes, &s, &z, 32, 32, 8, x);
    assert_float_equal(x[0], 0.91692, 1e-5);
    assert_int_equal(pt_tq_encode_k(ex_k, 32, 32, 4, codes, &s, &z), 0);
    assert_int_equal(s, 0x3036);
    assert_true(pt_f16_to_f32(z) == -4.0f);
    hex_bytes("eb2c709aaf39d1a640300a7453858487", want, 16);
    assert_memory_equal(codes, want, 16);
}

static void test_worked_example_values(void **state) {
    (void)state;
    static const float v[64] = {
        0.225,  1.658,  -0.664, 1.199,  -0.403, -0.958, 1.211,  -0.440, -0.388, -1.389, -2.098,
        0.634,  -1.165, 0.778,  1.848,  -0.115, -1.127, 0.394,  0.762,  -0.262, 0.017,  1.335,
        1.265,  0.710,  -0.866, -0.054, 0.603,  -0.212, -0.610, -0.765, -0.632, -0.672, -0.451,
        1.146,  -0.801, 0.887,  0.418,  0.140,  -0.827, -0.457, 1.974,  0.099,  0.538,  0.663,
        1.056,  -0.238, -0.610, -0.060, -0.261, 0.791,  0.190,  0.239,  0.145,  1.228,  -0.543,
        -0.478, 0.885,  -0.106, 0.361,  -0.729, 0.023,  0.432,  -1.327, -0.695};
    float signs[64], x[64];
    uint8_t codes[24], want[24];
    uint16_t s[2];
    pt_tq_signs(64, signs);
    assert_int_equal(pt_tq_encode_v(v, 64, 32, 3, signs, codes, s), 0);
    assert_int_equal(s[0], 0x39ea);
    assert_int_equal(s[1], 0x3b7e);
    hex_bytes("3dbd6b51b891b23862e116d99b5a2bfcd67d6b228a2415ba", want, 24);
    assert_memory_equal(codes, want, 24);
    pt_tq_decode_v(codes, s, 64, 32, 3, signs, x);
    static const float first[4] = {0.0860, 1.7636, -0.7579, 1.1175};
    for (int i = 0; i < 4; i++)
        assert_float_equal(x[i], first[i], 6e-5);
    double mse = 0;
    for (int i = 0; i < 64; i++)
        mse += (x[i] - v[i]) * (x[i] - v[i]) / 64;
    assert_float_equal(mse, 0.0218, 5e-5);
}

/* ---- goldens ------------------------------------------------------------------------------ */

typedef struct golden_run {
    int rows, encs, repaired;
} golden_run;

/* Reads "key v v v" lines of hex into out; returns the count. */
static int read_hex_words(char *line, const char *key, uint32_t *out, int max) {
    size_t kl = strlen(key);
    assert_true(strncmp(line, key, kl) == 0);
    int n = 0;
    for (char *save = NULL, *t = strtok_r(line + kl, " \n", &save); t && n < max;
         t = strtok_r(NULL, " \n", &save))
        out[n++] = (uint32_t)strtoul(t, NULL, 16);
    return n;
}

static void check_enc(FILE *f, char *line, size_t cap, const float *x, int d, golden_run *run) {
    char kind;
    int bits, ref_finite;
    assert_int_equal(sscanf(line, "enc %c %d %d", &kind, &bits, &ref_finite), 3);
    int group = pt_tq_group(d), ng = d / group;
    uint8_t packed[PT_TQ_MAX_DIM], want[PT_TQ_MAX_DIM];
    uint16_t s[16], z[16];
    uint32_t ws[16], wz[16], wd[PT_TQ_MAX_DIM + 1];
    float signs[PT_TQ_MAX_DIM], dec[PT_TQ_MAX_DIM];
    pt_tq_signs(d, signs);
    int repaired = kind == 'K' ? pt_tq_encode_k(x, d, group, bits, packed, s, z)
                               : pt_tq_encode_v(x, d, group, bits, signs, packed, s);
    assert_true((repaired == 0) == (ref_finite == 1));
    run->repaired += repaired > 0;

    assert_non_null(fgets(line, (int)cap, f));
    assert_true(strncmp(line, "packed ", 7) == 0);
    size_t nb = (size_t)d * bits / 8;
    hex_bytes(line + 7, want, nb);
    if (memcmp(packed, want, nb)) fail_msg("%c%d d=%d: packed bytes differ", kind, bits, d);

    assert_non_null(fgets(line, (int)cap, f));
    assert_int_equal(read_hex_words(line, "scales", ws, 16), ng);
    for (int g = 0; g < ng; g++) {
        if (s[g] != ws[g])
            fail_msg("%c%d d=%d group %d: scale %04x, want %04x", kind, bits, d, g, s[g], ws[g]);
        assert_true((s[g] & 0x7c00) != 0x7c00); /* never stored non-finite */
    }
    if (kind == 'K') {
        assert_non_null(fgets(line, (int)cap, f));
        assert_int_equal(read_hex_words(line, "zeros", wz, 16), ng);
        for (int g = 0; g < ng; g++) {
            if (z[g] != wz[g])
                fail_msg("K%d d=%d group %d: zero %04x, want %04x", bits, d, g, z[g], wz[g]);
            assert_true((z[g] & 0x7c00) != 0x7c00);
        }
        pt_tq_decode_k(packed, s, z, d, group, bits, dec);
    } else {
        pt_tq_decode_v(packed, s, d, group, bits, signs, dec);
    }
    assert_non_null(fgets(line, (int)cap, f));
    int n = read_hex_words(line, "decoded", wd, PT_TQ_MAX_DIM + 1);
    for (int i = 0; i < d; i++)
        assert_true(isfinite(dec[i]));
    if (n > 1)
        for (int i = 0; i < d; i++)
            if (f32_bits(dec[i]) != wd[1 + i])
                fail_msg("%c%d d=%d: decoded[%d] %a, want %a", kind, bits, d, i, dec[i],
                         bits_f32(wd[1 + i]));
    if (fnv(dec, d) != wd[0]) fail_msg("%c%d d=%d: decoded row differs", kind, bits, d);
    run->encs++;
}

static void test_goldens(void **state) {
    (void)state;
    FILE *f = fopen(GOLDENS, "r");
    assert_non_null(f);
    size_t cap = 16384;
    char *line = malloc(cap), name[64];
    float x[PT_TQ_MAX_DIM];
    int d = 0;
    golden_run run = {0};
    uint32_t words[PT_TQ_MAX_DIM];
    while (fgets(line, (int)cap, f)) {
        if (line[0] == '#') continue;
        if (sscanf(line, "row %63s %d", name, &d) == 2) {
            assert_non_null(fgets(line, (int)cap, f));
            assert_int_equal(read_hex_words(line, "x", words, PT_TQ_MAX_DIM), d);
            for (int i = 0; i < d; i++)
                x[i] = bits_f32(words[i]);
            run.rows++;
        } else if (strncmp(line, "enc ", 4) == 0) {
            check_enc(f, line, cap, x, d, &run);
        }
    }
    fclose(f);
    free(line);
    /* 4 head dims x 14 rows, 9 encodings each; the repairs the goldens mark. */
    assert_int_equal(run.rows, 56);
    assert_int_equal(run.encs, 56 * 9);
    assert_int_equal(run.repaired, 4 * 4 * 6 + 5 * 4 * 2);
}

/* ---- quality and safety ---------------------------------------------------------------------- */

/* Round-trip MSE on N(0,1) at d = 128, against the reference README's table
 * (keys k8 2.3e-5, k5 0.00153, k4 0.00653, k2 0.166; values v2 0.112,
 * v3 0.0325, v4 0.0089, v5 0.0024, v8 1.0e-4). */
static void test_round_trip_mse(void **state) {
    (void)state;
    static const struct {
        char kind;
        int bits;
        double mse;
    } want[] = {{'K', 8, 2.3e-5}, {'K', 5, 0.00153}, {'K', 4, 0.00653},
                {'K', 2, 0.166},  {'V', 2, 0.112},   {'V', 3, 0.0325},
                {'V', 4, 0.0089}, {'V', 5, 0.0024},  {'V', 8, 1.0e-4}};
    enum { D = 128, ROWS = 2000 };
    float signs[D], x[D], y[D];
    uint8_t codes[D];
    uint16_t s[4], z[4];
    pt_tq_signs(D, signs);
    for (size_t w = 0; w < PT_ARRAY_LEN(want); w++) {
        pt_rng r;
        pt_rng_seed(&r, 11);
        double err = 0;
        for (int row = 0; row < ROWS; row++) {
            for (int i = 0; i < D; i++)
                x[i] = (float)gauss(&r);
            if (want[w].kind == 'K') {
                pt_tq_encode_k(x, D, 32, want[w].bits, codes, s, z);
                pt_tq_decode_k(codes, s, z, D, 32, want[w].bits, y);
            } else {
                pt_tq_encode_v(x, D, 32, want[w].bits, signs, codes, s);
                pt_tq_decode_v(codes, s, D, 32, want[w].bits, signs, y);
            }
            for (int i = 0; i < D; i++)
                err += (double)(y[i] - x[i]) * (y[i] - x[i]);
        }
        double mse = err / (ROWS * D);
        if (fabs(mse / want[w].mse - 1) > 0.05)
            fail_msg("%c%d: MSE %.5g, reference %.5g", want[w].kind, want[w].bits, mse,
                     want[w].mse);
    }
}

/* The deferred transform: un-rotating a weighted sum of raw rows equals the
 * weighted sum of eagerly decoded rows (to float32 rounding). */
static void test_deferred_unrotate(void **state) {
    (void)state;
    enum { D = 256, T = 20 };
    float signs[D], x[D], acc[D] = {0}, eager[D] = {0}, r[D], row[D];
    uint8_t codes[T][D];
    uint16_t s[T][8];
    pt_tq_signs(D, signs);
    pt_rng g;
    pt_rng_seed(&g, 5);
    double wsum = 0;
    for (int t = 0; t < T; t++) {
        for (int i = 0; i < D; i++)
            x[i] = (float)gauss(&g);
        pt_tq_encode_v(x, D, 32, 3, signs, codes[t], s[t]);
        float w = (float)pt_rng_uniform(&g);
        wsum += w;
        pt_tq_dequant_rotated(codes[t], s[t], D, 32, 3, r);
        pt_tq_decode_v(codes[t], s[t], D, 32, 3, signs, row);
        for (int i = 0; i < D; i++)
            acc[i] += w * r[i], eager[i] += w * row[i];
    }
    pt_tq_unrotate(acc, D, signs, (float)(1 / wsum));
    for (int i = 0; i < D; i++)
        assert_float_equal(acc[i], eager[i] / wsum, 2e-5);
}

/* Whatever goes in, nothing non-finite is stored or decoded, and constant
 * groups (the reference's +-Inf zero point) come back close to their value. */
static void test_never_non_finite(void **state) {
    (void)state;
    enum { D = 128 };
    float signs[D], x[D], y[D];
    uint8_t codes[D];
    uint16_t s[4], z[4];
    pt_tq_signs(D, signs);
    pt_rng r;
    pt_rng_seed(&r, 99);
    static const int kb[] = {2, 4, 5, 8}, vb[] = {2, 3, 4, 5, 8};
    for (int trial = 0; trial < 400; trial++) {
        for (int i = 0; i < D; i++) {
            uint64_t u = pt_rng_next(&r);
            int e = (int)(u % 90) - 45;
            x[i] = (float)(ldexp(gauss(&r), e));
            if (u % 97 == 0) x[i] = NAN;
            if (u % 89 == 0) x[i] = (u & 1) ? INFINITY : -INFINITY;
            if (trial % 4 == 1 && i % 32 < 31) x[i] = x[i - i % 32]; /* near-constant */
            if (trial % 4 == 2) x[i] = 3e38f * (float)(u % 3) - 3e38f;
        }
        for (size_t k = 0; k < PT_ARRAY_LEN(kb); k++) {
            pt_tq_encode_k(x, D, 32, kb[k], codes, s, z);
            pt_tq_decode_k(codes, s, z, D, 32, kb[k], y);
            for (int g = 0; g < 4; g++)
                assert_true((s[g] & 0x7c00) != 0x7c00 && (z[g] & 0x7c00) != 0x7c00);
            for (int i = 0; i < D; i++)
                assert_true(isfinite(y[i]));
        }
        for (size_t v = 0; v < PT_ARRAY_LEN(vb); v++) {
            pt_tq_encode_v(x, D, 32, vb[v], signs, codes, s);
            pt_tq_decode_v(codes, s, D, 32, vb[v], signs, y);
            for (int g = 0; g < 4; g++)
                assert_true((s[g] & 0x7c00) != 0x7c00);
            for (int i = 0; i < D; i++)
                assert_true(isfinite(y[i]));
        }
    }
    /* Constant groups: the reference decodes these to NaN. */
    static const float consts[] = {0.5f, -3.0f, 1234.5f, 7e-4f, 65504.0f};
    for (size_t c = 0; c < PT_ARRAY_LEN(consts); c++)
        for (size_t k = 0; k < PT_ARRAY_LEN(kb); k++) {
            for (int i = 0; i < D; i++)
                x[i] = consts[c];
            assert_int_equal(pt_tq_encode_k(x, D, 32, kb[k], codes, s, z), 4);
            pt_tq_decode_k(codes, s, z, D, 32, kb[k], y);
            for (int i = 0; i < D; i++)
                assert_float_equal(y[i], consts[c], fabsf(consts[c]) / 1024);
        }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_constants),
        cmocka_unit_test(test_packing_examples),
        cmocka_unit_test(test_worked_example_keys),
        cmocka_unit_test(test_worked_example_values),
        cmocka_unit_test(test_goldens),
        cmocka_unit_test(test_round_trip_mse),
        cmocka_unit_test(test_deferred_unrotate),
        cmocka_unit_test(test_never_non_finite),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
