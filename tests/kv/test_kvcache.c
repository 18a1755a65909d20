/*
 * test_kvcache.c - the paged KV cache: page accounting, geometry of each
 * format, a window group of its own geometry beside a layer keeping no K/V,
 * and attention over quantized pages.
 *
 * The attention check writes random K/V rows for a sequence whose pages are
 * scattered in the pool, runs the CPU backend's kv_store and attention ops
 * (both kernel sets), and compares with a naive attention in double over
 * the rows the codec's scalar decoder gives back: the fused kernels must
 * compute the same function of the stored bytes, whatever the codec.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

#include "kv/kvcache.h"

static pt_kv_config config(int n_kv, int hd, const char *quant) {
    pt_kv_config c = {.n_layers = 2,
                      .n_kv_heads = n_kv,
                      .head_dim = hd,
                      .page_size = 16,
                      .n_pages = 16,
                      .dtype = PT_F16};
    pt_err err;
    assert_int_equal(pt_kvq_parse(quant, &c.quant, &err), 0);
    return c;
}

static void test_pages(void **state) {
    (void)state;
    pt_err err;
    pt_backend *be = pt_backend_cpu_new(1, "portable", &err);
    assert_non_null(be);
    pt_kv_config cfg = config(2, 64, "turbo");
    pt_kv_cache kv;
    assert_int_equal(pt_kv_cache_init(&kv, be, &cfg, &err), 0);
    pt_kv_seq a = {0}, b = {0};
    assert_int_equal(pt_kv_seq_reserve(&kv, &a, 40, &err), 0); /* 3 pages */
    assert_int_equal(pt_kv_seq_reserve(&kv, &b, 17, &err), 0); /* 2 pages */
    assert_int_equal(pt_kv_free_pages(&kv), 11);
    assert_int_not_equal(pt_kv_seq_reserve(&kv, &b, 16 * 14, &err), 0);
    assert_non_null(strstr(err.msg, "KV cache full"));
    pt_kv_seq_truncate(&kv, &a, 16);
    assert_int_equal(pt_kv_free_pages(&kv), 13);
    pt_kv_seq_release(&kv, &a);
    pt_kv_seq_release(&kv, &b);
    assert_int_equal(pt_kv_free_pages(&kv), 16);
    pt_kv_cache_free(&kv);
    be->ops->destroy(be);
}

static void test_geometry(void **state) {
    (void)state;
    char name[32];
    static const struct {
        const char *quant;
        int hd;
        size_t per_head; /* K + V bytes per token per kv head per layer */
        const char *name;
    } cases[] = {
        {"none", 128, 512, "f16"},
        {"turbo", 128, 200, "turbo-k8v3"},
        {"turbo:k8v4", 128, 216, "turbo-k8v4"},
        {"turbo:k4v3", 128, 136, "turbo-k4v3"},
        {"turbo:k2v2", 128, 88, "turbo-k2v2"},
        {"turbo:k8v8", 128, 280, "turbo-k8v8"},
        {"8", 128, 128 + 8 + 8 + 128 + 8 + 8, "affine8"},
        {"4", 128, 64 + 16 + 64 + 16, "affine4"},
        {"4", 8, 4 + 4 + 4 + 4, "affine4"}, /* one group of 8 */
        {"turbo:k8v3:anydim", 16, 16 + 4 + 6 + 2, "turbo-k8v3"},
    };
    for (size_t i = 0; i < PT_ARRAY_LEN(cases); i++) {
        pt_kv_config c = config(3, cases[i].hd, cases[i].quant);
        assert_int_equal(pt_kv_bytes_per_token(&c), 2 * 3 * cases[i].per_head);
        assert_string_equal(pt_kv_format_name(&c, name, sizeof name), cases[i].name);
    }
    /* Formats the codec cannot store are refused up front. */
    pt_err err;
    pt_backend *be = pt_backend_cpu_new(1, "portable", &err);
    pt_kv_cache kv;
    pt_kv_config c = config(2, 80, "turbo");
    assert_int_equal(pt_kv_bytes_per_token(&c), 0);
    assert_int_not_equal(pt_kv_cache_init(&kv, be, &c, &err), 0);
    assert_non_null(strstr(err.msg, "head_dim 80"));
    c = config(2, 16, "turbo");
    assert_int_not_equal(pt_kv_cache_init(&kv, be, &c, &err), 0);
    assert_non_null(strstr(err.msg, ":anydim"));
    be->ops->destroy(be);
}

/* ---- attention over quantized pages ------------------------------------------------------ */

static float frand(pt_rng *r) {
    return (float)(pt_rng_uniform(r) * 2 - 1);
}

/* Naive attention of one query head over rows decoded by the codec. */
static void reference_attention(const pt_kv_codec *c, const float *dk, const float *dv, int n_pos,
                                const float *q, float scale, float *out) {
    int d = c->head_dim;
    double *w = malloc(sizeof(double) * (size_t)n_pos), mx = -INFINITY, sum = 0;
    for (int p = 0; p < n_pos; p++) {
        double s = 0;
        for (int i = 0; i < d; i++)
            s += (double)q[i] * dk[(size_t)p * d + i];
        w[p] = s * scale;
        mx = w[p] > mx ? w[p] : mx;
    }
    for (int p = 0; p < n_pos; p++)
        sum += (w[p] = exp(w[p] - mx));
    for (int i = 0; i < d; i++) {
        double o = 0;
        for (int p = 0; p < n_pos; p++)
            o += w[p] * dv[(size_t)p * d + i];
        out[i] = (float)(o / sum);
    }
    free(w);
}

typedef struct attn_case {
    const char *quant, *kernels;
    int hd, n_kv, n_heads, n_pos, n_rows; /* the last n_rows positions are queries */
} attn_case;

static void run_attention(const attn_case *tc) {
    pt_err err;
    pt_backend *be = pt_backend_cpu_new(2, tc->kernels, &err);
    if (!be) {
        print_message("skipping %s kernels: %s\n", tc->kernels, err.msg);
        return;
    }
    pt_kv_config cfg = config(tc->n_kv, tc->hd, tc->quant);
    cfg.n_pages = 128;
    pt_kv_cache kv;
    if (pt_kv_cache_init(&kv, be, &cfg, &err)) fail_msg("%s: %s", tc->quant, err.msg);
    /* A block table of scattered pages, so rows cross page boundaries. */
    int n_pages = (tc->n_pos + cfg.page_size - 1) / cfg.page_size;
    int32_t *table = malloc(sizeof(int32_t) * (size_t)n_pages);
    for (int i = 0; i < n_pages; i++)
        table[i] = (i * 37 + 5) % cfg.n_pages;
    int n = tc->n_pos, d = tc->hd, kvw = tc->n_kv * d, qw = tc->n_heads * d;
    float *k = malloc(sizeof(float) * (size_t)n * kvw),
          *v = malloc(sizeof(float) * (size_t)n * kvw);
    float *q = malloc(sizeof(float) * (size_t)tc->n_rows * qw);
    float *out = malloc(sizeof(float) * (size_t)tc->n_rows * qw);
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)n), *seq = calloc((size_t)n, sizeof(int32_t));
    pt_rng r;
    pt_rng_seed(&r, (uint64_t)d * 131 + (uint64_t)tc->n_heads);
    for (size_t i = 0; i < (size_t)n * kvw; i++)
        k[i] = 2 * frand(&r), v[i] = frand(&r);
    for (size_t i = 0; i < (size_t)tc->n_rows * qw; i++)
        q[i] = frand(&r);
    for (int i = 0; i < n; i++)
        pos[i] = i;

    pt_kv_view view = pt_kv_layer(&kv, 1);
    pt_batch_view all = {.n_tokens = n, .pos = pos, .seq = seq, .block_table = table, .max_pages = n_pages, .n_seqs = 1};
    pt_be_kv_store(be, &view, &all, k, v);
    pt_batch_view rows = {.n_tokens = tc->n_rows, .pos = pos + n - tc->n_rows, .seq = seq, .block_table = table, .max_pages = n_pages, .n_seqs = 1};
    float scale = 1.0f / sqrtf((float)d);
    pt_be_attention(be, out, q, &view, &rows, tc->n_heads, scale);

    /* Decode every stored row with the scalar codec, then attend naively. */
    const pt_kv_codec *c = &kv.codec;
    float *dk = malloc(sizeof(float) * (size_t)n * d), *dv = malloc(sizeof(float) * (size_t)n * d);
    float *want = malloc(sizeof(float) * (size_t)d);
    double max_err = 0;
    for (int g = 0; g < tc->n_kv; g++) {
        for (int p = 0; p < n; p++) {
            size_t slot = (size_t)table[p / cfg.page_size] * cfg.page_size + p % cfg.page_size;
            c->decode_k(c, (const uint8_t *)view.k + (slot * tc->n_kv + g) * c->k_row,
                        dk + (size_t)p * d);
            c->decode_v(c, (const uint8_t *)view.v + (slot * tc->n_kv + g) * c->v_row,
                        dv + (size_t)p * d);
        }
        int group = tc->n_heads / tc->n_kv;
        for (int t = 0; t < tc->n_rows; t++)
            for (int h = g * group; h < (g + 1) * group; h++) {
                reference_attention(c, dk, dv, n - tc->n_rows + t + 1,
                                    q + ((size_t)t * tc->n_heads + h) * d, scale, want);
                const float *got = out + ((size_t)t * tc->n_heads + h) * d;
                for (int i = 0; i < d; i++)
                    max_err = fmax(max_err, fabs(got[i] - want[i]));
            }
    }
    if (getenv("KVQ_VERBOSE"))
        print_message("%s %s d=%d: %.3g\n", tc->quant, tc->kernels, d, max_err);
    if (max_err > 2e-6)
        fail_msg("%s %s d=%d heads %d/%d: max error %.3g", tc->quant, tc->kernels, d, tc->n_heads,
                 tc->n_kv, max_err);
    free(dk), free(dv), free(want), free(k), free(v), free(q), free(out), free(pos), free(seq);
    free(table);
    pt_kv_cache_free(&kv);
    be->ops->destroy(be);
}

static void test_attention_quantized(void **state) {
    (void)state;
    static const char *quants[] = {"turbo",      "turbo:k8v2", "turbo:k8v4", "turbo:k8v5",
                                   "turbo:k8v8", "turbo:k4v3", "turbo:k2v2", "turbo:k5v3",
                                   "8",          "4"};
    static const char *kernels[] = {"portable", "avx2"};
    for (size_t kset = 0; kset < PT_ARRAY_LEN(kernels); kset++)
        for (size_t i = 0; i < PT_ARRAY_LEN(quants); i++) {
            /* decode (one row at depth), prefill (every row), GQA groups 1-8 */
            attn_case dec = {quants[i], kernels[kset], 128, 2, 8, 150, 1};
            attn_case pre = {quants[i], kernels[kset], 64, 2, 6, 40, 40};
            attn_case wide = {quants[i], kernels[kset], 256, 1, 5, 70, 2};
            attn_case gqa8 = {quants[i], kernels[kset], 64, 2, 16, 90, 3};
            run_attention(&dec);
            run_attention(&pre);
            run_attention(&wide);
            run_attention(&gqa8);
        }
    /* A row long enough to be split into parts merged afterwards (in the
     * rotated domain for TurboQuant). */
    static const char *split_quants[] = {"turbo", "turbo:k4v5", "8"};
    for (size_t kset = 0; kset < PT_ARRAY_LEN(kernels); kset++)
        for (size_t i = 0; i < PT_ARRAY_LEN(split_quants); i++) {
            attn_case longrow = {split_quants[i], kernels[kset], 128, 2, 4, 1500, 2};
            run_attention(&longrow);
        }
    attn_case d512 = {"turbo", "avx2", 512, 1, 1, 33, 3};
    attn_case small = {"turbo:k8v3:anydim", "avx2", 16, 2, 4, 50, 5};
    attn_case small8 = {"4", "avx2", 8, 4, 8, 50, 5};
    run_attention(&d512);
    run_attention(&small);
    run_attention(&small8);
}

/* A window group with its own geometry (Gemma 4: sliding layers have 3
 * KV heads of 8, full ones 1 of 16) and a layer keeping no K/V: each
 * layer's view and bytes are its group's, the shared layer has no
 * buffers, copy on write copies a window page with the window group's
 * page size (every byte of it, none past it), and a codec, which has one
 * geometry, is refused. */
static void test_window_geometry(void **state) {
    (void)state;
    pt_err err;
    pt_backend *be = pt_backend_cpu_new(1, "portable", &err);
    assert_non_null(be);
    pt_kv_config c = {.n_layers = 4, .n_kv_heads = 1, .head_dim = 16, .page_size = 4,
                      .n_pages = 8, .dtype = PT_F32, .window = 4, .window_n_kv_heads = 3,
                      .window_head_dim = 8};
    c.window_layers[0] = 1u << 0 | 1u << 2; /* layers 0 and 2 slide */
    c.no_kv[0] = 1u << 3;                   /* layer 3 reads another's */
    pt_kv_cache kv;
    assert_int_equal(pt_kv_cache_init(&kv, be, &c, &err), 0);
    assert_true(kv.grouped);
    for (int l = 0; l < 3; l++) {
        pt_kv_view v = pt_kv_layer(&kv, l);
        assert_int_equal(v.n_kv_heads, l == 1 ? 1 : 3);
        assert_int_equal(v.head_dim, l == 1 ? 16 : 8);
        assert_non_null(kv.k[l]);
    }
    assert_null(kv.k[3]);
    assert_null(kv.v[3]);
    /* 2 window layers of 3 x 8 floats, 1 full of 16; K and V */
    assert_int_equal(pt_kv_bytes_per_token(&c), (2 * 24 + 16) * 4 * 2);
    assert_int_equal(pt_kv_window_bytes_per_token(&kv), 2 * 24 * 4 * 2);
    assert_int_equal(pt_kv_page_bytes(&kv), 16 * 4 * 2 * 4);

    /* a forked sequence writing its shared first page gets a copy */
    pt_kv_seq a = {0}, b;
    assert_int_equal(pt_kv_seq_own(&kv, &a, 0, 4, &err), 0);
    int32_t wp = a.wpages[0], gp = a.pages[0];
    size_t wpage = 4 * 24 * 4, gpage = 4 * 16 * 4;
    float *wk = kv.k[0], *gk = kv.k[1];
    for (size_t i = 0; i < wpage / 4; i++) wk[(size_t)wp * wpage / 4 + i] = (float)i + 1;
    for (size_t i = 0; i < gpage / 4; i++) gk[(size_t)gp * gpage / 4 + i] = (float)i + 1;
    pt_kv_seq_computed(&a, 4);
    pt_kv_seq_fork(&kv, &b, &a);
    assert_int_equal(pt_kv_seq_own(&kv, &b, 0, 4, &err), 0);
    assert_int_not_equal(b.wpages[0], wp);
    assert_int_not_equal(b.pages[0], gp);
    for (size_t i = 0; i < wpage / 4; i++)
        assert_true(wk[(size_t)b.wpages[0] * wpage / 4 + i] == (float)i + 1);
    for (size_t i = 0; i < gpage / 4; i++)
        assert_true(gk[(size_t)b.pages[0] * gpage / 4 + i] == (float)i + 1);
    pt_kv_seq_release(&kv, &a);
    pt_kv_seq_release(&kv, &b);
    assert_int_equal(pt_kv_free_pages(&kv), c.n_pages);
    pt_kv_cache_free(&kv);

    pt_kv_config q = c;
    assert_int_equal(pt_kvq_parse("8", &q.quant, &err), 0);
    assert_int_equal(pt_kv_cache_init(&kv, be, &q, &err), -1);
    assert_non_null(strstr(err.msg, "window layers of another shape need a plain cache"));
    be->ops->destroy(be);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pages),
        cmocka_unit_test(test_geometry),
        cmocka_unit_test(test_attention_quantized),
        cmocka_unit_test(test_window_geometry),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
