/*
 * test_kv_codec.c - the --kv-quant surface and the row codecs: parsing and
 * refusals, row geometry and layout, affine error bounds and corner cases,
 * and that a TurboQuant row is exactly turboquant.c's planes side by side.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

#include "kv/kv_codec.h"

static void test_parse(void **state) {
    (void)state;
    static const struct {
        const char *s;
        int kind, kb, vb;
        bool any;
        const char *name;
    } ok[] = {
        {NULL, PT_KVQ_NONE, 0, 0, false, "none"},
        {"none", PT_KVQ_NONE, 0, 0, false, "none"},
        {"8", PT_KVQ_AFFINE, 8, 8, false, "affine8"},
        {"4", PT_KVQ_AFFINE, 4, 4, false, "affine4"},
        {"turbo", PT_KVQ_TURBO, 8, 3, false, "turbo-k8v3"},
        {"turbo:k4v2", PT_KVQ_TURBO, 4, 2, false, "turbo-k4v2"},
        {"turbo:k5v8", PT_KVQ_TURBO, 5, 8, false, "turbo-k5v8"},
        {"turbo:anydim", PT_KVQ_TURBO, 8, 3, true, "turbo-k8v3"},
        {"turbo:k2v5:anydim", PT_KVQ_TURBO, 2, 5, true, "turbo-k2v5"},
    };
    char name[32];
    pt_err err;
    for (size_t i = 0; i < PT_ARRAY_LEN(ok); i++) {
        pt_kvq_spec s;
        assert_int_equal(pt_kvq_parse(ok[i].s, &s, &err), 0);
        assert_int_equal(s.kind, ok[i].kind);
        assert_int_equal(s.k_bits, ok[i].kb);
        assert_int_equal(s.v_bits, ok[i].vb);
        assert_int_equal(s.any_dim, ok[i].any);
        assert_string_equal(pt_kvq_name(&s, name, sizeof name), ok[i].name);
    }
    static const struct {
        const char *s, *msg;
    } bad[] = {
        {"6", "expected none, 8, 4"},   {"turbo:k3v3", "key bits 3"},
        {"turbo:k8v6", "value bits 6"}, {"turbo:k8", "k<bits>v<bits>"},
        {"turbo:x", "k<bits>v<bits>"},  {"turbo:k8v3x", "k<bits>v<bits>"},
        {"turbo:k1v3", "key bits 1"},   {"int8", "expected none"},
        /* the whole value is quoted, then the part that is wrong */
        {"turbo:k8v3:bogus", "'turbo:k8v3:bogus': 'bogus'"},
        {"turbo:anydim:k8v6", "'turbo:anydim:k8v6': value bits 6"},
    };
    for (size_t i = 0; i < PT_ARRAY_LEN(bad); i++) {
        pt_kvq_spec s;
        assert_int_not_equal(pt_kvq_parse(bad[i].s, &s, &err), 0);
        if (!strstr(err.msg, bad[i].msg)) fail_msg("'%s': message '%s'", bad[i].s, err.msg);
    }
}

static pt_kv_codec bind(const char *quant, int d) {
    pt_kvq_spec s;
    pt_kv_codec c;
    pt_err err;
    assert_int_equal(pt_kvq_parse(quant, &s, &err), 0);
    if (pt_kv_codec_init(&c, &s, d, &err)) fail_msg("%s d=%d: %s", quant, d, err.msg);
    return c;
}

static void test_geometry_and_refusals(void **state) {
    (void)state;
    /* constants.json: bytes per token per kv head at d = 128 */
    static const struct {
        int kb, vb, bytes;
    } table[] = {{2, 2, 88},  {2, 3, 104}, {2, 4, 120}, {2, 5, 136}, {2, 8, 184},
                 {4, 2, 120}, {4, 3, 136}, {4, 4, 152}, {4, 5, 168}, {4, 8, 216},
                 {5, 2, 136}, {5, 3, 152}, {5, 4, 168}, {5, 5, 184}, {5, 8, 232},
                 {8, 2, 184}, {8, 3, 200}, {8, 4, 216}, {8, 5, 232}, {8, 8, 280}};
    for (size_t i = 0; i < PT_ARRAY_LEN(table); i++) {
        char q[32];
        snprintf(q, sizeof q, "turbo:k%dv%d", table[i].kb, table[i].vb);
        pt_kv_codec c = bind(q, 128);
        assert_int_equal(c.k_row + c.v_row, table[i].bytes);
        assert_int_equal(c.group, 32);
    }
    pt_kv_codec c = bind("8", 48); /* 32 does not divide 48: groups of 16 */
    assert_int_equal(c.group, 16);
    assert_int_equal(c.k_row, 48 + 3 * 4);
    pt_kvq_spec s;
    pt_err err;
    static const struct {
        const char *q;
        int d;
        const char *msg;
    } refuse[] = {
        {"turbo", 80, "head_dim 80 is not one of 64, 128, 256, 512"},
        {"turbo", 32, "add ':anydim'"},
        {"turbo", 1024, "head_dim 1024"},
        {"turbo:anydim", 24, "head_dim 24"},
        {"8", 12, "not a multiple of 8"},
        {"8", 0, "head_dim 0"},
        {"4", 1024, "up to 512"},
    };
    for (size_t i = 0; i < PT_ARRAY_LEN(refuse); i++) {
        assert_int_equal(pt_kvq_parse(refuse[i].q, &s, &err), 0);
        assert_int_not_equal(pt_kv_codec_init(&c, &s, refuse[i].d, &err), 0);
        if (!strstr(err.msg, refuse[i].msg))
            fail_msg("%s d=%d: '%s'", refuse[i].q, refuse[i].d, err.msg);
    }
    assert_int_equal(pt_kvq_parse("none", &s, &err), 0);
    assert_int_not_equal(pt_kv_codec_init(&c, &s, 64, &err), 0);
}

/* A TurboQuant row is [codes][scales][zeros] (K) or [codes][scales] (V),
 * exactly the planes turboquant.c produces. */
static void test_turbo_row_layout(void **state) {
    (void)state;
    pt_kv_codec c = bind("turbo:k4v3", 128);
    float x[128], y[128], z[128];
    pt_rng r;
    pt_rng_seed(&r, 1);
    for (int i = 0; i < 128; i++)
        x[i] = (float)(pt_rng_uniform(&r) * 4 - 2);
    uint8_t row[256], codes[128];
    uint16_t s[4], zp[4];
    c.encode_k(&c, x, row);
    pt_tq_encode_k(x, 128, 32, 4, codes, s, zp);
    assert_int_equal(c.k_row, 64 + 16);
    assert_memory_equal(row, codes, 64);
    assert_memory_equal(row + 64, s, 8);
    assert_memory_equal(row + 72, zp, 8);
    c.decode_k(&c, row, y);
    pt_tq_decode_k(codes, s, zp, 128, 32, 4, z);
    assert_memory_equal(y, z, sizeof y);

    c.encode_v(&c, x, row);
    pt_tq_encode_v(x, 128, 32, 3, c.signs, codes, s);
    assert_int_equal(c.v_row, 48 + 8);
    assert_memory_equal(row, codes, 48);
    assert_memory_equal(row + 48, s, 8);
    c.decode_v(&c, row, y);
    pt_tq_decode_v(codes, s, 128, 32, 3, c.signs, z);
    assert_memory_equal(y, z, sizeof y);
    /* raw + unrotate == eager decode */
    c.decode_v_raw(&c, row, y);
    c.unrotate(&c, y, 1.0f);
    for (int i = 0; i < 128; i++)
        assert_float_equal(y[i], z[i], 1e-6);
}

/* Affine: error at most half a step (plus the fp16 rounding of the bias),
 * constant groups exact to fp16, never a non-finite value. */
static void test_affine(void **state) {
    (void)state;
    static const int bits[] = {8, 4};
    for (size_t b = 0; b < PT_ARRAY_LEN(bits); b++) {
        char q[4];
        snprintf(q, sizeof q, "%d", bits[b]);
        pt_kv_codec c = bind(q, 64);
        float x[64], y[64];
        uint8_t row[256];
        pt_rng r;
        pt_rng_seed(&r, 4);
        for (int trial = 0; trial < 200; trial++) {
            float span = (float)ldexp(1, (int)(pt_rng_next(&r) % 20) - 10);
            float off = (float)(pt_rng_uniform(&r) - 0.5) * 8;
            for (int i = 0; i < 64; i++)
                x[i] = off + span * (float)pt_rng_uniform(&r);
            c.encode_k(&c, x, row);
            c.decode_k(&c, row, y);
            for (int g = 0; g < 2; g++) {
                float mn = x[g * 32], mx = mn;
                for (int i = g * 32; i < g * 32 + 32; i++)
                    mn = fminf(mn, x[i]), mx = fmaxf(mx, x[i]);
                float step = (mx - mn) / (float)((1 << bits[b]) - 1);
                float tol = step * 0.5f * 1.002f + fabsf(mn) * 0x1p-11f + 1e-7f;
                for (int i = g * 32; i < g * 32 + 32; i++)
                    if (fabsf(y[i] - x[i]) > tol)
                        fail_msg("affine%d: |%g - %g| > %g", bits[b], y[i], x[i], tol);
            }
        }
        for (int i = 0; i < 64; i++)
            x[i] = i < 32 ? 0.3f : -7.25f;
        c.encode_v(&c, x, row);
        c.decode_v(&c, row, y);
        for (int i = 0; i < 64; i++)
            assert_true(y[i] == pt_f16_to_f32(pt_f32_to_f16(x[i])));
        for (int i = 0; i < 64; i++)
            x[i] = i % 3 ? NAN : (i % 2 ? INFINITY : -1e30f);
        c.encode_k(&c, x, row);
        c.decode_k(&c, row, y);
        for (int i = 0; i < 64; i++)
            assert_true(isfinite(y[i]) && fabsf(y[i]) <= 65504 * 1.01f);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse),
        cmocka_unit_test(test_geometry_and_refusals),
        cmocka_unit_test(test_turbo_row_layout),
        cmocka_unit_test(test_affine),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
