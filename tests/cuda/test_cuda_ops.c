/*
 * test_cuda_ops.c - every op of the CUDA backend against the CPU backend
 * (portable kernels), on fresh random inputs.
 *
 * Each check uploads the same host data to both backends, fills the output
 * with NaN bytes first (so an element the kernel never wrote fails), runs
 * the op on each, and compares ‖cuda − cpu‖ / ‖cpu‖ with a tolerance chosen
 * by the arithmetic: f32 paths near 1e-6, paths that round activations to
 * bf16/f16 for the tensor cores near 1e-3.  Shapes are odd on purpose
 * (rows that are not whole 16-byte chunks, several sequences with pages in
 * shuffled order, grouped-query heads, long contexts that split).
 *
 * Every code path of the backend is forced at least once through its
 * environment knobs: PETREL_CUDA_GEMV_MAX=0 (cuBLAS for every matmul),
 * PETREL_CUDA_ATTN=simple (the plain attention kernel) and
 * PETREL_CUDA_GDN_CHUNK=1 (the chunkwise delta rule for every step, decode
 * rows too; the default backend takes prefill steps chunkwise and decode
 * steps row by row).
 *
 * The model-family ops (attention_ext with windows and soft-caps, geglu,
 * scale, softcap, moe_route, matmul_id, moe_combine) are checked the same
 * way; routing must pick the CPU's experts in the CPU's order.  moe_ffn
 * (the routed FFN as one op; two fused kernels at decode for quantized
 * experts) against the CPU's op sequence, and its fused kernels against
 * the CUDA op sequence (GPU_ALT) and a batch's rows against each row
 * alone, bit for bit; from 32 rows the grouped tensor-core GEMM
 * (moe_mma.cu) against the CPU at 4e-3 and required to differ from
 * GPU_ALT's exact kernels.  So are the
 * hybrid recurrent ops (gather_cols, sigmoid_mul, rmsnorm_gated,
 * conv1d_silu and gated_delta over several sequences' states, prefill,
 * decode and a restart) and DeepSeek's (copy_cols, moe_route_grouped).
 *
 * argmax (greedy picks on the device) must give the CPU's index exactly,
 * ties, NaN and infinities included (test_argmax).
 *
 * Batch invariance (test_batch_invariance): matmul and attention rows of
 * a 2..16-row call are compared bit for bit with each row computed alone,
 * as speculative verification needs.
 *
 * Without a CUDA device the test exits 77, which CTest reports as skipped.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <cmocka.h>

#include "backend/backend.h"
#include "quant/quant.h"

enum { CPU, GPU, GPU_ALT, N_BE };
/* GPU_ALT: cuBLAS-only matmul, simple attention, chunked delta rule, and
 * moe_ffn as its op sequence with the exact matmul_id at every row count
 * (PETREL_CUDA_MOE_FUSED=0, PETREL_CUDA_MOE_MMA=0) */
static pt_backend *be[N_BE];
static pt_rng rng;

/* ---- host data on every backend --------------------------------------------- */

typedef struct arr {
    void *h;
    void *d[N_BE];
    size_t nbytes;
} arr;

static float frand(float lo, float hi) {
    return lo + (hi - lo) * (float)pt_rng_uniform(&rng);
}

static arr arr_from(const void *host, size_t nbytes) {
    arr a = {malloc(nbytes ? nbytes : 1), {0}, nbytes};
    memcpy(a.h, host, nbytes);
    for (int b = 0; b < N_BE; b++) {
        a.d[b] = be[b]->ops->alloc(be[b], nbytes);
        assert_non_null(a.d[b]);
        be[b]->ops->upload(be[b], a.d[b], host, nbytes);
    }
    return a;
}

static arr arr_rand(size_t n, float lo, float hi) {
    float *h = malloc(sizeof(float) * (n ? n : 1));
    for (size_t i = 0; i < n; i++) h[i] = frand(lo, hi);
    arr a = arr_from(h, sizeof(float) * n);
    free(h);
    return a;
}

/* An output buffer filled with NaN bytes on every backend. */
static arr arr_poison(size_t nbytes) {
    void *h = malloc(nbytes ? nbytes : 1);
    memset(h, 0xff, nbytes);
    arr a = arr_from(h, nbytes);
    free(h);
    return a;
}

static void arr_repoison(arr *a) {
    memset(a->h, 0xff, a->nbytes);
    for (int b = 0; b < N_BE; b++) be[b]->ops->upload(be[b], a->d[b], a->h, a->nbytes);
}

static float *arr_get(const arr *a, int b) {
    float *h = malloc(a->nbytes ? a->nbytes : 1);
    be[b]->ops->download(be[b], h, a->d[b], a->nbytes);
    return h;
}

static void arr_free(arr *a) {
    for (int b = 0; b < N_BE; b++) be[b]->ops->free(be[b], a->d[b], a->nbytes);
    free(a->h);
    memset(a, 0, sizeof *a);
}

/* ‖got − ref‖ / ‖ref‖ over n floats; NaN anywhere fails. */
static double rel_err(const float *got, const float *ref, size_t n, double *max_abs) {
    double num = 0, den = 0;
    *max_abs = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(got[i]) || !isfinite(ref[i])) return INFINITY;
        double d = (double)got[i] - ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
        if (fabs(d) > *max_abs) *max_abs = fabs(d);
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* Compares backend b's copy of out with the CPU's. */
static void check_out(const arr *out, int b, double tol, const char *fmt, ...) {
    char what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    size_t n = out->nbytes / sizeof(float);
    float *ref = arr_get(out, CPU), *got = arr_get(out, b);
    double max_abs, e = rel_err(got, ref, n, &max_abs);
    if (!(e <= tol)) {
        size_t bad = 0;
        for (size_t i = 0; i < n; i++)
            if (!isfinite(got[i]) || fabs(got[i] - ref[i]) > tol * (fabs(ref[i]) + 1e-3)) {
                bad = i;
                break;
            }
        print_error("%s [%s]: rel err %.3g > %.1g (max abs %.3g); first bad [%zu] got %g want %g\n",
                    what, b == GPU ? "cuda" : "cuda-alt", e, tol, max_abs, bad, got[bad],
                    ref[bad]);
        free(ref);
        free(got);
        fail();
    }
    free(ref);
    free(got);
}

static uint16_t to_half(pt_dtype t, float x) {
    return t == PT_F16 ? pt_f32_to_f16(x) : pt_f32_to_bf16(x);
}

/* Host copy of n random values in [lo, hi) stored as type t. */
static arr arr_rand_typed(pt_dtype t, size_t n, float lo, float hi) {
    size_t es = t == PT_F32 ? 4 : 2;
    uint8_t *h = malloc(es * (n ? n : 1));
    for (size_t i = 0; i < n; i++) {
        float x = frand(lo, hi);
        if (t == PT_F32) memcpy(h + 4 * i, &x, 4);
        else {
            uint16_t v = to_half(t, x);
            memcpy(h + 2 * i, &v, 2);
        }
    }
    arr a = arr_from(h, es * n);
    free(h);
    return a;
}

static const char *tname(pt_dtype t) {
    return pt_dtype_name(t);
}

/* ---- matmul -------------------------------------------------------------------- */

static void one_matmul(pt_dtype t, int rows, int cols, int n) {
    arr w = arr_rand_typed(t, (size_t)rows * cols, -1, 1);
    arr x = arr_rand((size_t)n * cols, -1, 1);
    arr y = arr_poison(sizeof(float) * (size_t)n * rows);
    for (int b = 0; b < N_BE; b++) {
        pt_weight wt = {.dtype = t, .rows = rows, .cols = cols, .data = w.d[b], .nbytes = w.nbytes};
        pt_be_matmul(be[b], y.d[b], x.d[b], &wt, n);
    }
    /* GEMV and Sgemm are f32 throughout: relative error ~1e-6.  GemmEx
     * rounds x to the weight type (f16: 2^-11, bf16: 2^-8 relative), so
     * each output may be off by up to that times sum_k |w_k x_k|, which
     * can be large against |sum_k w_k x_k| for short rows: checked per
     * element against that bound (with a factor 2 of margin). */
    double tol_f32 = 2e-5;
    bool gemv = n <= 16; /* PETREL_CUDA_GEMV_MAX default */
    double *mag = NULL; /* sum_k |w_k x_k| per output, for the rounded paths */
    if (t != PT_F32) {
        mag = calloc((size_t)n * rows, sizeof(double));
        float *wf = malloc(sizeof(float) * (size_t)cols);
        for (int r = 0; r < rows; r++) {
            for (int k = 0; k < cols; k++) {
                uint16_t hw;
                memcpy(&hw, (const uint8_t *)w.h + 2 * ((size_t)r * cols + k), 2);
                wf[k] = fabsf(t == PT_F16 ? pt_f16_to_f32(hw) : pt_bf16_to_f32(hw));
            }
            for (int q = 0; q < n; q++) {
                const float *xr = (const float *)x.h + (size_t)q * cols;
                double m = 0;
                for (int k = 0; k < cols; k++) m += wf[k] * fabsf(xr[k]);
                mag[(size_t)q * rows + r] = m;
            }
        }
        free(wf);
    }
    for (int b = GPU; b <= GPU_ALT; b++) {
        bool rounded = t != PT_F32 && (b == GPU_ALT || !gemv);
        if (!rounded) {
            check_out(&y, b, tol_f32, "matmul %s %dx%d n=%d", tname(t), rows, cols, n);
            continue;
        }
        float *ref = arr_get(&y, CPU), *got = arr_get(&y, b);
        double u = t == PT_F16 ? ldexp(1.0, -10) : ldexp(1.0, -7);
        for (size_t i = 0; i < (size_t)n * rows; i++)
            if (!(fabs((double)got[i] - ref[i]) <= u * mag[i] + 1e-6))
                fail_msg("matmul %s %dx%d n=%d [%s]: y[%zu][%zu] = %g, cpu %g, bound %.3g", tname(t),
                         rows, cols, n, b == GPU ? "cuda" : "cuda-alt", i / rows, i % rows, got[i],
                         ref[i], u * mag[i]);
        free(ref);
        free(got);
    }
    free(mag);
    arr_free(&w);
    arr_free(&x);
    arr_free(&y);
}

static void test_matmul(void **state) {
    (void)state;
    static const pt_dtype types[] = {PT_F32, PT_F16, PT_BF16};
    /* 20000x64 and 3000x8200: more row groups than resident blocks (the
     * persistent GEMV walks several), 8200: several chunk batches per row */
    static const int shapes[][2] = {{1, 8},      {37, 29},    {64, 64},   {130, 264},
                                    {256, 1024}, {17, 5000},  {1000, 4096}, {96, 17},
                                    {20000, 64}, {3000, 8200}};
    static const int ns[] = {1, 2, 3, 4, 5, 7, 8, 9, 16, 33};
    for (int ti = 0; ti < 3; ti++)
        for (size_t si = 0; si < PT_ARRAY_LEN(shapes); si++)
            for (size_t ni = 0; ni < PT_ARRAY_LEN(ns); ni++)
                one_matmul(types[ti], shapes[si][0], shapes[si][1], ns[ni]);
}

/* ---- embed, gather ---------------------------------------------------------------- */

static void test_embed(void **state) {
    (void)state;
    static const pt_dtype types[] = {PT_F32, PT_F16, PT_BF16};
    for (int ti = 0; ti < 3; ti++) {
        int rows = 301, cols = 67, n = 19;
        arr table = arr_rand_typed(types[ti], (size_t)rows * cols, -2, 2);
        int32_t ids[19];
        for (int i = 0; i < n; i++) ids[i] = (int32_t)(pt_rng_next(&rng) % rows);
        ids[3] = ids[7]; /* a repeat */
        ids[0] = rows - 1;
        arr id = arr_from(ids, sizeof ids);
        arr y = arr_poison(sizeof(float) * (size_t)n * cols);
        for (int b = 0; b < N_BE; b++) {
            pt_weight w = {.dtype = types[ti], .rows = rows, .cols = cols, .data = table.d[b], .nbytes = table.nbytes};
            pt_be_embed(be[b], y.d[b], &w, id.d[b], n);
        }
        check_out(&y, GPU, 0, "embed %s", tname(types[ti]));
        arr_free(&table);
        arr_free(&id);
        arr_free(&y);
    }
}

static void test_gather_rows(void **state) {
    (void)state;
    int rows = 50, d = 131, n = 13;
    arr src = arr_rand((size_t)rows * d, -3, 3);
    int32_t idx[13];
    for (int i = 0; i < n; i++) idx[i] = (int32_t)(pt_rng_next(&rng) % rows);
    arr id = arr_from(idx, sizeof idx);
    arr y = arr_poison(sizeof(float) * (size_t)n * d);
    for (int b = 0; b < N_BE; b++) pt_be_gather_rows(be[b], y.d[b], src.d[b], id.d[b], n, d);
    check_out(&y, GPU, 0, "gather_rows");
    arr_free(&src);
    arr_free(&id);
    arr_free(&y);
}

/* argmax: the GPU's picks equal the CPU's exactly (the sampler's rule:
 * first of the largest, NaN never wins, 0 when nothing is above -inf), at
 * a 128k vocabulary, widths that are not whole 16-byte chunks, a row
 * start off the 16-byte grid, and rows of ties, NaN, +inf and -inf. */
static void test_argmax(void **state) {
    (void)state;
    static const int shapes[][3] = {/* rows, width, float offset of x */
                                    {1, 128256, 0}, {32, 128256, 0}, {3, 1001, 0},
                                    {5, 32000, 1}, {7, 5, 0}, {40, 4096, 3}};
    for (size_t si = 0; si < PT_ARRAY_LEN(shapes); si++) {
        int n = shapes[si][0], d = shapes[si][1], off = shapes[si][2];
        size_t count = (size_t)n * d + off;
        float *h = malloc(sizeof(float) * count);
        for (size_t i = 0; i < count; i++) h[i] = frand(-8, 8);
        for (int r = 0; r < n; r++) {
            float *row = h + off + (size_t)r * d;
            int a = (int)(pt_rng_next(&rng) % d), c = (int)(pt_rng_next(&rng) % d);
            switch (r % 6) {
            case 0: row[a] = row[c] = 20; break; /* a tie: the first wins */
            case 1: row[a] = NAN, row[c] = 30; break;
            case 2: for (int i = 0; i < d; i++) row[i] = i % 3 ? -INFINITY : NAN; break;
            case 3: for (int i = 0; i < d; i++) row[i] = -INFINITY; break;
            case 4: row[a] = row[c] = INFINITY; break;
            default: break; /* plain random */
            }
        }
        arr x = arr_from(h, sizeof(float) * count);
        arr ids = arr_poison(sizeof(int32_t) * (size_t)n);
        for (int b = 0; b < N_BE; b++)
            pt_be_argmax(be[b], ids.d[b], (const float *)x.d[b] + off, n, d);
        int32_t *cpu = (int32_t *)arr_get(&ids, CPU), *gpu = (int32_t *)arr_get(&ids, GPU);
        for (int r = 0; r < n; r++) {
            const float *row = h + off + (size_t)r * d;
            int32_t want = 0;
            float max = -INFINITY;
            for (int i = 0; i < d; i++)
                if (row[i] > max) max = row[i], want = i;
            if (cpu[r] != want || gpu[r] != want)
                fail_msg("argmax %dx%d (offset %d) row %d: cpu %d, gpu %d, want %d", n, d, off, r,
                         cpu[r], gpu[r], want);
        }
        free(cpu), free(gpu), free(h);
        arr_free(&x);
        arr_free(&ids);
    }
}

/* ---- norms and elementwise ---------------------------------------------------------- */

static void test_rmsnorm(void **state) {
    (void)state;
    static const int dims[][2] = {{1, 7}, {5, 64}, {33, 128}, {3, 513}, {4, 4096}, {2, 5000}, {300, 128}};
    for (size_t i = 0; i < PT_ARRAY_LEN(dims); i++) {
        int n = dims[i][0], d = dims[i][1];
        arr x = arr_rand((size_t)n * d, -4, 4), g = arr_rand((size_t)d, 0.5f, 1.5f);
        arr y = arr_poison(sizeof(float) * (size_t)n * d);
        for (int b = 0; b < N_BE; b++) pt_be_rmsnorm(be[b], y.d[b], x.d[b], g.d[b], n, d, 1e-5f);
        check_out(&y, GPU, 1e-6, "rmsnorm %dx%d", n, d);
        /* in place */
        for (int b = 0; b < N_BE; b++) pt_be_rmsnorm(be[b], x.d[b], x.d[b], g.d[b], n, d, 1e-6f);
        check_out(&x, GPU, 1e-6, "rmsnorm in place %dx%d", n, d);
        arr_free(&x);
        arr_free(&g);
        arr_free(&y);
    }
}

static void test_elementwise(void **state) {
    (void)state;
    static const size_t counts[] = {1, 3, 4, 1001, 4096, 100003};
    for (size_t i = 0; i < PT_ARRAY_LEN(counts); i++) {
        size_t n = counts[i];
        arr a = arr_rand(n, -5, 5), c = arr_rand(n, -5, 5);
        arr y = arr_poison(sizeof(float) * n);
        for (int b = 0; b < N_BE; b++) pt_be_add(be[b], y.d[b], a.d[b], c.d[b], n);
        check_out(&y, GPU, 0, "add %zu", n);
        for (int b = 0; b < N_BE; b++) pt_be_add(be[b], a.d[b], a.d[b], c.d[b], n);
        check_out(&a, GPU, 0, "add in place %zu", n);
        arr_repoison(&y);
        for (int b = 0; b < N_BE; b++) pt_be_swiglu(be[b], y.d[b], a.d[b], c.d[b], n);
        check_out(&y, GPU, 1e-6, "swiglu %zu", n);
        for (int b = 0; b < N_BE; b++) pt_be_swiglu(be[b], c.d[b], a.d[b], c.d[b], n);
        check_out(&c, GPU, 1e-6, "swiglu in place %zu", n);
        arr_free(&a);
        arr_free(&c);
        arr_free(&y);
    }
    /* odd offsets: misaligned pointers take the scalar kernels */
    arr a = arr_rand(1003, -1, 1), c = arr_rand(1003, -1, 1);
    arr y = arr_poison(sizeof(float) * 1003);
    for (int b = 0; b < N_BE; b++)
        pt_be_add(be[b], (float *)y.d[b] + 1, (float *)a.d[b] + 1, (float *)c.d[b] + 2, 1000);
    float *ref = arr_get(&y, CPU), *got = arr_get(&y, GPU);
    double max_abs;
    assert_true(rel_err(got + 1, ref + 1, 1000, &max_abs) == 0);
    free(ref);
    free(got);
    arr_free(&a);
    arr_free(&c);
    arr_free(&y);

    int n = 7, d = 45;
    arr x = arr_rand((size_t)n * d, -1, 1), bias = arr_rand((size_t)d, -1, 1);
    for (int b = 0; b < N_BE; b++) pt_be_add_bias(be[b], x.d[b], bias.d[b], n, d);
    check_out(&x, GPU, 0, "add_bias");
    arr_free(&x);
    arr_free(&bias);
}

/* ---- rope ----------------------------------------------------------------------------- */

static void test_rope(void **state) {
    (void)state;
    static const struct {
        int style, n_heads, head_dim, n_rot;
        float theta, mscale;
    } cases[] = {
        {PT_ROPE_NORM, 3, 8, 8, 10000.f, 1.f},      {PT_ROPE_NEOX, 5, 64, 64, 500000.f, 1.f},
        {PT_ROPE_NEOX, 8, 128, 128, 1e6f, 1.f},     {PT_ROPE_NORM, 4, 128, 64, 10000.f, 1.f},
        {PT_ROPE_NEOX, 2, 96, 32, 10000.f, 1.2f},
    };
    for (size_t ci = 0; ci < PT_ARRAY_LEN(cases); ci++) {
        int n = 37, nh = cases[ci].n_heads, hd = cases[ci].head_dim, nr = cases[ci].n_rot;
        float freq[64];
        for (int i = 0; i < nr / 2; i++) freq[i] = powf(cases[ci].theta, -2.0f * i / nr);
        int32_t pos[37];
        for (int i = 0; i < n; i++) pos[i] = (int32_t)(pt_rng_next(&rng) % 32768);
        pos[0] = 0, pos[1] = 32767, pos[2] = 1;
        arr f = arr_from(freq, sizeof(float) * (size_t)(nr / 2)), p = arr_from(pos, sizeof pos);
        arr x = arr_rand((size_t)n * nh * hd, -2, 2);
        for (int b = 0; b < N_BE; b++) {
            pt_batch_view bv = {.n_tokens = n, .pos = p.d[b], .seq = NULL, .block_table = NULL, .max_pages = 0, .n_seqs = 0};
            pt_rope r = {.style = cases[ci].style, .n_rot = nr, .inv_freq = f.d[b], .mscale = cases[ci].mscale};
            pt_be_rope(be[b], x.d[b], &bv, nh, hd, &r);
        }
        /* angles up to 32767 rad: both sides round pos*inv_freq to f32 and
         * take an accurate sin/cos, so only the last bits may differ */
        check_out(&x, GPU, 2e-6, "rope style %d %dx%d rot %d", cases[ci].style, nh, hd, nr);
        arr_free(&f);
        arr_free(&p);
        arr_free(&x);
    }
}

/* ---- kv_store and attention ------------------------------------------------------------- */

typedef struct seq_setup {
    int len; /* positions stored */
} seq_setup;

/* When set, one_attention runs attention_ext with these window and
 * soft-cap settings (its own scale) instead of attention. */
static const pt_attn_params *g_ext;
static bool g_sinks; /* with g_ext: random sink logits per head (gpt-oss) */
/* V is a view of K (MLA's latent rows: kvcache.h v_is_k): one cache,
 * stored once, as DeepSeek's layers pass it. */
static bool g_v_is_k;

/* Builds a paged cache holding n_seqs sequences of the given lengths, pages
 * handed out in shuffled order, K/V stored through kv_store (itself
 * checked), then runs attention for a batch of query rows (seq, pos) and
 * compares. */
static void one_attention(pt_dtype kt, int page_size, int n_heads, int n_kv, int hd,
                          const int *lens, int n_seqs, const int32_t *qseq, const int32_t *qpos,
                          int nq) {
    int max_pages = 1, total_pages = 0;
    for (int s = 0; s < n_seqs; s++) {
        int p = (lens[s] + page_size - 1) / page_size;
        max_pages = PT_MAX(max_pages, p);
        total_pages += p;
    }
    int n_pages = total_pages + 3;
    int32_t *perm = malloc(sizeof(int32_t) * (size_t)n_pages);
    for (int i = 0; i < n_pages; i++) perm[i] = i;
    for (int i = n_pages - 1; i > 0; i--) {
        int j = (int)(pt_rng_next(&rng) % (uint64_t)(i + 1));
        int32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    int32_t *bt = malloc(sizeof(int32_t) * (size_t)max_pages * n_seqs);
    int next = 0;
    for (int s = 0; s < n_seqs; s++) {
        int p = (lens[s] + page_size - 1) / page_size;
        for (int i = 0; i < max_pages; i++) bt[s * max_pages + i] = i < p ? perm[next++] : -1;
    }
    size_t es = kt == PT_F32 ? 4 : 2;
    size_t page_bytes = (size_t)page_size * n_kv * hd * es;
    arr kc = arr_poison(page_bytes * n_pages), vc = arr_poison(page_bytes * n_pages);
    arr bta = arr_from(bt, sizeof(int32_t) * (size_t)max_pages * n_seqs);

    /* store every position of every sequence in one batch */
    int n_store = 0;
    for (int s = 0; s < n_seqs; s++) n_store += lens[s];
    int32_t *sp = malloc(sizeof(int32_t) * (size_t)n_store), *ss = malloc(sizeof(int32_t) * (size_t)n_store);
    for (int s = 0, r = 0; s < n_seqs; s++)
        for (int p = 0; p < lens[s]; p++, r++) sp[r] = p, ss[r] = s;
    arr spa = arr_from(sp, sizeof(int32_t) * (size_t)n_store), ssa = arr_from(ss, sizeof(int32_t) * (size_t)n_store);
    arr k = arr_rand((size_t)n_store * n_kv * hd, -1, 1), v = arr_rand((size_t)n_store * n_kv * hd, -1, 1);
    pt_kv_view kv[N_BE];
    for (int b = 0; b < N_BE; b++) {
        kv[b] = (pt_kv_view){.k = kc.d[b], .v = g_v_is_k ? kc.d[b] : vc.d[b], .dtype = kt,
                             .page_size = page_size, .n_kv_heads = n_kv, .head_dim = hd};
        pt_batch_view bv = {.n_tokens = n_store, .pos = spa.d[b], .seq = ssa.d[b], .block_table = bta.d[b], .max_pages = max_pages, .n_seqs = n_seqs};
        pt_be_kv_store(be[b], &kv[b], &bv, k.d[b], g_v_is_k ? k.d[b] : v.d[b]);
    }
    /* compare the stored pages (only pages in use: the rest stay poisoned) */
    {
        uint8_t *ref = (uint8_t *)arr_get(&kc, CPU), *got = (uint8_t *)arr_get(&kc, GPU);
        uint8_t *refv = (uint8_t *)arr_get(&vc, CPU), *gotv = (uint8_t *)arr_get(&vc, GPU);
        for (int s = 0; s < n_seqs; s++)
            for (int p = 0; p < lens[s]; p++) {
                size_t off = ((size_t)bt[s * max_pages + p / page_size] * page_size + p % page_size) *
                             n_kv * hd * es;
                if (memcmp(ref + off, got + off, (size_t)n_kv * hd * es) ||
                    memcmp(refv + off, gotv + off, (size_t)n_kv * hd * es))
                    fail_msg("kv_store %s: seq %d pos %d differs from the CPU's", tname(kt), s, p);
            }
        free(ref);
        free(got);
        free(refv);
        free(gotv);
    }

    arr qpa = arr_from(qpos, sizeof(int32_t) * (size_t)nq), qsa = arr_from(qseq, sizeof(int32_t) * (size_t)nq);
    arr q = arr_rand((size_t)nq * n_heads * hd, -1, 1);
    arr out = arr_poison(sizeof(float) * (size_t)nq * n_heads * hd);
    float scale = 1.0f / sqrtf((float)hd) * 2.0f; /* sharper than usual: softmax must be exact */
    arr sinks = arr_rand(g_sinks ? (size_t)n_heads : 0, -2, 4);
    for (int b = 0; b < N_BE; b++) {
        pt_batch_view bv = {.n_tokens = nq, .pos = qpa.d[b], .seq = qsa.d[b], .block_table = bta.d[b], .max_pages = max_pages, .n_seqs = n_seqs};
        if (g_ext) {
            pt_attn_params p = *g_ext;
            p.scale = scale;
            p.sinks = g_sinks ? sinks.d[b] : NULL;
            pt_be_attention_ext(be[b], out.d[b], q.d[b], &kv[b], &bv, n_heads, &p);
        } else {
            pt_be_attention(be[b], out.d[b], q.d[b], &kv[b], &bv, n_heads, scale);
        }
    }
    /* 16-bit caches with 64+ rows take the tensor cores, queries and
     * probabilities split in two 16-bit parts: ~1e-5 instead of ~1e-6;
     * so do head_dim 256's windows and soft-caps (the wide kernel) */
    double tol = kt == PT_F32 ? 2e-5 : 6e-5;
    check_out(&out, GPU, tol, "attention %s ps=%d heads %d/%d hd=%d%s rows=%d", tname(kt),
              page_size, n_heads, n_kv, hd, g_v_is_k ? " (v is k)" : "", nq);
    check_out(&out, GPU_ALT, 2e-5, "attention %s ps=%d heads %d/%d hd=%d%s rows=%d", tname(kt),
              page_size, n_heads, n_kv, hd, g_v_is_k ? " (v is k)" : "", nq);

    arr_free(&sinks);
    arr_free(&kc), arr_free(&vc), arr_free(&bta), arr_free(&spa), arr_free(&ssa);
    arr_free(&k), arr_free(&v), arr_free(&qpa), arr_free(&qsa), arr_free(&q), arr_free(&out);
    free(perm), free(bt), free(sp), free(ss);
}

/* Rows of each kind: a prefill of seq 0 (positions first..last), decode
 * rows of every sequence at its last position, and the two mixed. */
static void attention_batches(pt_dtype kt, int page_size, int n_heads, int n_kv, int hd,
                              const int *lens, int n_seqs) {
    int32_t qs[600], qp[600];
    int n = 0;
    /* prefill: the last min(len, 70) positions of sequence 0 */
    int first = PT_MAX(0, lens[0] - 70);
    for (int p = first; p < lens[0]; p++) qs[n] = 0, qp[n++] = p;
    one_attention(kt, page_size, n_heads, n_kv, hd, lens, n_seqs, qs, qp, n);
    /* decode: one row per sequence */
    int nd = 0;
    int32_t ds[128], dp[128];
    for (int s = 0; s < n_seqs; s++) ds[nd] = s, dp[nd++] = lens[s] - 1;
    one_attention(kt, page_size, n_heads, n_kv, hd, lens, n_seqs, ds, dp, nd);
    /* a verify step: the last min(len, 7) positions of sequence 0 */
    n = 0;
    for (int p = PT_MAX(0, lens[0] - 7); p < lens[0]; p++) qs[n] = 0, qp[n++] = p;
    one_attention(kt, page_size, n_heads, n_kv, hd, lens, n_seqs, qs, qp, n);
    /* mixed: decode rows interleaved with a prefill run, in odd order */
    n = 0;
    for (int s = n_seqs - 1; s >= 0; s--) {
        qs[n] = s, qp[n++] = lens[s] - 1;
        if (s == n_seqs / 2)
            for (int p = 0; p < PT_MIN(lens[s], 11); p++) qs[n] = s, qp[n++] = p;
    }
    one_attention(kt, page_size, n_heads, n_kv, hd, lens, n_seqs, qs, qp, n);
    /* two prefills in one batch, 64+ rows: row groups straddle sequences */
    if (n_seqs >= 2) {
        n = 0;
        for (int s = 0; s < 2; s++)
            for (int p = PT_MAX(0, lens[s] - 45); p < lens[s]; p++) qs[n] = s, qp[n++] = p;
        for (int p = 0; p < PT_MIN(lens[0], 30); p++) qs[n] = 0, qp[n++] = p;
        one_attention(kt, page_size, n_heads, n_kv, hd, lens, n_seqs, qs, qp, n);
    }
}

static void test_attention(void **state) {
    (void)state;
    static const pt_dtype types[] = {PT_F16, PT_BF16, PT_F32};
    int lens_a[] = {37, 1, 200, 16};
    int lens_b[] = {1500, 130};
    int lens_c[] = {5000};
    int lens_e[] = {257, 1, 5000};
    /* batched decode: 70 sequences, one row each (the tiled kernel a row a
     * block, not the tensor cores' passes), and a mixed batch of them */
    int lens_d[70];
    for (int s = 0; s < 70; s++) lens_d[s] = 1 + (s * 53) % 300;
    for (int ti = 0; ti < 3; ti++) {
        pt_dtype t = types[ti];
        /* tiled kernel shapes: head_dim 128 and 64, groups 1..8 */
        attention_batches(t, 16, 32, 8, 128, lens_a, 4);
        attention_batches(t, 16, 32, 4, 64, lens_a, 4);
        attention_batches(t, 16, 8, 8, 128, lens_a, 4);
        attention_batches(t, 16, 16, 8, 64, lens_b, 2);
        attention_batches(t, 7, 8, 1, 128, lens_b, 2);
        /* long context: the split path */
        attention_batches(t, 16, 32, 8, 128, lens_c, 1);
        attention_batches(t, 16, 32, 8, 128, lens_d, 70);
        /* the simple kernel's shapes: tiny and odd head dims, groups of 3 and 16 */
        attention_batches(t, 16, 8, 4, 8, lens_a, 4);
        attention_batches(t, 5, 6, 2, 96, lens_a, 4);
        attention_batches(t, 16, 32, 2, 64, lens_b, 2);
        /* DeepSeek's latent rows: 576 dims, every head over one KV head */
        attention_batches(t, 16, 16, 1, 576, lens_a, 4);
        /* the wide kernel (16-bit caches): head_dim 256 with groups 6
         * (Qwen3.5), 1, 4, 16, across split boundaries (1, 257, 5000 keys);
         * and the latent rows as DeepSeek stores them (V a view of K), 16
         * and 128 heads */
        if (t == PT_F32) continue;
        attention_batches(t, 16, 24, 4, 256, lens_e, 3);
        attention_batches(t, 16, 8, 8, 256, lens_a, 4);
        attention_batches(t, 7, 16, 4, 256, lens_b, 2);
        attention_batches(t, 16, 16, 1, 256, lens_c, 1);
        g_v_is_k = true;
        attention_batches(t, 16, 16, 1, 576, lens_e, 3);
        attention_batches(t, 16, 16, 1, 576, lens_c, 1);
        attention_batches(t, 16, 128, 1, 576, lens_a, 4);
        g_v_is_k = false;
    }
}

/* ---- batch invariance ------------------------------------------------------------ */

/* Speculative verification runs k + 1 rows where decoding runs 1: greedy
 * output equals plain decoding only if every row's bits do not depend on
 * the rows beside it.  These compare, bit for bit on the GPU, each row of
 * an n-row call with the same row computed alone. */

static void *gpu_put(const void *h, size_t n) {
    void *d = be[GPU]->ops->alloc(be[GPU], n);
    assert_non_null(d);
    be[GPU]->ops->upload(be[GPU], d, h, n);
    return d;
}

static void gpu_get(void *h, const void *d, size_t n) {
    be[GPU]->ops->download(be[GPU], h, d, n);
}

static void invariant_matmul(pt_dtype t, int rows, int cols, int n) {
    arr w = arr_rand_typed(t, (size_t)rows * cols, -1, 1);
    size_t ny = (size_t)n * rows;
    float *x = malloc(sizeof(float) * (size_t)n * cols);
    for (size_t i = 0; i < (size_t)n * cols; i++) x[i] = frand(-1, 1);
    float *yn = malloc(sizeof(float) * ny), *y1 = malloc(sizeof(float) * rows);
    void *dx = gpu_put(x, sizeof(float) * (size_t)n * cols), *dy = gpu_put(yn, sizeof(float) * ny);
    pt_weight wt = {.dtype = t, .rows = rows, .cols = cols, .data = w.d[GPU], .nbytes = w.nbytes};
    pt_be_matmul(be[GPU], dy, dx, &wt, n);
    gpu_get(yn, dy, sizeof(float) * ny);
    for (int i = 0; i < n; i++) {
        void *dxi = gpu_put(x + (size_t)i * cols, sizeof(float) * cols);
        void *dyi = gpu_put(y1, sizeof(float) * rows);
        pt_be_matmul(be[GPU], dyi, dxi, &wt, 1);
        gpu_get(y1, dyi, sizeof(float) * rows);
        if (memcmp(y1, yn + (size_t)i * rows, sizeof(float) * rows)) {
            int r = 0;
            while (y1[r] == yn[(size_t)i * rows + r]) r++;
            fail_msg("matmul %s %dx%d: row %d of %d differs from the row alone at [%d]: %.9g vs %.9g",
                     tname(t), rows, cols, i, n, r, yn[(size_t)i * rows + r], y1[r]);
        }
        be[GPU]->ops->free(be[GPU], dxi, sizeof(float) * cols);
        be[GPU]->ops->free(be[GPU], dyi, sizeof(float) * rows);
    }
    be[GPU]->ops->free(be[GPU], dx, sizeof(float) * (size_t)n * cols);
    be[GPU]->ops->free(be[GPU], dy, sizeof(float) * ny);
    free(x), free(yn), free(y1);
    arr_free(&w);
}

/* Attention of rows p..p+n-1 of one sequence (a verify step: the block
 * table as wide as p + n keys need) against each row alone (a decode step:
 * the table as wide as its own position needs). */
static void invariant_attention(pt_dtype kt, int n_heads, int n_kv, int hd, int p, int n) {
    const int ps = 16, len = p + n, pages = (len + ps - 1) / ps;
    int32_t *bt = malloc(sizeof(int32_t) * (size_t)pages), *pos = malloc(sizeof(int32_t) * (size_t)len),
            *seq = calloc((size_t)len, sizeof(int32_t));
    for (int i = 0; i < pages; i++) bt[i] = pages - 1 - i; /* pages out of order */
    for (int i = 0; i < len; i++) pos[i] = i;
    size_t es = 2, page_bytes = (size_t)ps * n_kv * hd * es, row = (size_t)n_heads * hd;
    float *kv = malloc(sizeof(float) * (size_t)len * n_kv * hd);
    void *kc = be[GPU]->ops->alloc(be[GPU], page_bytes * pages);
    void *vc = be[GPU]->ops->alloc(be[GPU], page_bytes * pages);
    void *dbt = gpu_put(bt, sizeof(int32_t) * pages), *dpos = gpu_put(pos, sizeof(int32_t) * len),
         *dseq = gpu_put(seq, sizeof(int32_t) * len);
    for (size_t i = 0; i < (size_t)len * n_kv * hd; i++) kv[i] = frand(-1, 1);
    void *dk = gpu_put(kv, sizeof(float) * (size_t)len * n_kv * hd);
    for (size_t i = 0; i < (size_t)len * n_kv * hd; i++) kv[i] = frand(-1, 1);
    void *dv = gpu_put(kv, sizeof(float) * (size_t)len * n_kv * hd);
    pt_kv_view view = {.k = kc, .v = g_v_is_k ? kc : vc, .dtype = kt, .page_size = ps,
                       .n_kv_heads = n_kv, .head_dim = hd};
    pt_batch_view all = {.n_tokens = len, .pos = dpos, .seq = dseq, .block_table = dbt,
                         .max_pages = pages, .n_seqs = 1};
    pt_be_kv_store(be[GPU], &view, &all, dk, g_v_is_k ? dk : dv);
    float *q = malloc(sizeof(float) * n * row), *on = malloc(sizeof(float) * n * row),
          *o1 = malloc(sizeof(float) * row);
    for (size_t i = 0; i < n * row; i++) q[i] = frand(-1, 1);
    void *dq = gpu_put(q, sizeof(float) * n * row), *dout = gpu_put(on, sizeof(float) * n * row);
    float scale = 2.0f / sqrtf((float)hd);
    pt_batch_view verify = {.n_tokens = n, .pos = (int32_t *)dpos + p, .seq = dseq,
                            .block_table = dbt, .max_pages = pages, .n_seqs = 1};
    pt_be_attention(be[GPU], dout, dq, &view, &verify, n_heads, scale);
    gpu_get(on, dout, sizeof(float) * n * row);
    for (int i = 0; i < n; i++) {
        /* the block table of a decode step: the first pages of the same
         * pages, as many as position p + i needs */
        int own = (p + i) / ps + 1;
        void *dq1 = gpu_put(q + i * row, sizeof(float) * row), *do1 = gpu_put(o1, sizeof(float) * row);
        void *dbt1 = gpu_put(bt, sizeof(int32_t) * own);
        pt_batch_view one = {.n_tokens = 1, .pos = (int32_t *)dpos + p + i, .seq = dseq,
                             .block_table = dbt1, .max_pages = own, .n_seqs = 1};
        pt_be_attention(be[GPU], do1, dq1, &view, &one, n_heads, scale);
        gpu_get(o1, do1, sizeof(float) * row);
        if (memcmp(o1, on + i * row, sizeof(float) * row)) {
            size_t e = 0;
            while (o1[e] == on[i * row + e]) e++;
            fail_msg("attention %s heads %d/%d hd %d: row at pos %d of %d rows from %d differs "
                     "from the row alone at [%zu]: %.9g vs %.9g",
                     tname(kt), n_heads, n_kv, hd, p + i, n, p, e, on[i * row + e], o1[e]);
        }
        be[GPU]->ops->free(be[GPU], dq1, sizeof(float) * row);
        be[GPU]->ops->free(be[GPU], do1, sizeof(float) * row);
        be[GPU]->ops->free(be[GPU], dbt1, sizeof(int32_t) * own);
    }
    be[GPU]->ops->free(be[GPU], kc, page_bytes * pages);
    be[GPU]->ops->free(be[GPU], vc, page_bytes * pages);
    be[GPU]->ops->free(be[GPU], dbt, sizeof(int32_t) * pages);
    be[GPU]->ops->free(be[GPU], dpos, sizeof(int32_t) * len);
    be[GPU]->ops->free(be[GPU], dseq, sizeof(int32_t) * len);
    be[GPU]->ops->free(be[GPU], dk, sizeof(float) * (size_t)len * n_kv * hd);
    be[GPU]->ops->free(be[GPU], dv, sizeof(float) * (size_t)len * n_kv * hd);
    be[GPU]->ops->free(be[GPU], dq, sizeof(float) * n * row);
    be[GPU]->ops->free(be[GPU], dout, sizeof(float) * n * row);
    free(bt), free(pos), free(seq), free(kv), free(q), free(on), free(o1);
}

static void test_batch_invariance(void **state) {
    (void)state;
    static const pt_dtype types[] = {PT_F16, PT_BF16, PT_F32};
    static const int ns[] = {2, 5, 9, 16};
    for (int ti = 0; ti < 3; ti++)
        for (size_t ni = 0; ni < PT_ARRAY_LEN(ns); ni++) {
            invariant_matmul(types[ti], 1000, 4096, ns[ni]);
            invariant_matmul(types[ti], 67, 8200, ns[ni]);
            invariant_matmul(types[ti], 40, 17, ns[ni]); /* the plain kernel */
        }
    /* positions: one split; a verify step that crosses a page and a split
     * boundary (1021 + 5 > 1024); deep (several splits) */
    static const int ps[] = {20, 1021, 5003};
    for (int ti = 0; ti < 2; ti++)
        for (size_t pi = 0; pi < PT_ARRAY_LEN(ps); pi++) {
            invariant_attention(types[ti], 32, 8, 128, ps[pi], 5);
            invariant_attention(types[ti], 16, 8, 64, ps[pi], 16);
            /* the wide kernel: head_dim 256 (16 query vectors a block), latent rows
             * (V a view of K; 128 heads take 64 query vectors a block) */
            invariant_attention(types[ti], 24, 4, 256, ps[pi], 5);
            invariant_attention(types[ti], 16, 16, 256, ps[pi], 16);
            g_v_is_k = true;
            invariant_attention(types[ti], 16, 1, 576, ps[pi], 16);
            invariant_attention(types[ti], 128, 1, 576, ps[pi], 5);
            g_v_is_k = false;
        }
}

/* ---- model-family ops (cuda_family.h) ---------------------------------------------- */

/* attention_ext: windows shorter than, equal to and longer than the
 * sequences, with and without Gemma 2's soft-cap (4: it bites at this
 * scale), through the same batches as attention. */
static void test_attention_ext(void **state) {
    (void)state;
    static const pt_attn_params ps[] = {{.window = 8}, {.window = 1}, {.window = 300}, {.softcap = 4.0f}, {.window = 12, .softcap = 4.0f}};
    static const pt_dtype types[] = {PT_F16, PT_BF16, PT_F32};
    int lens_a[] = {37, 1, 200, 16};
    int lens_b[] = {1500, 130};
    int lens_e[] = {257, 1, 5000};
    for (size_t pi = 0; pi < PT_ARRAY_LEN(ps); pi++) {
        g_ext = &ps[pi];
        for (int ti = 0; ti < 3; ti++) {
            attention_batches(types[ti], 16, 8, 4, 64, lens_a, 4);
            attention_batches(types[ti], 5, 6, 2, 96, lens_a, 4);
        }
        /* head_dim 256 (Gemma 2/3) takes the wide kernel: windows across
         * its splits, rows whose window starts mid-split, a split wholly
         * below every window */
        attention_batches(PT_BF16, 16, 16, 8, 256, lens_b, 2);
        attention_batches(PT_F16, 16, 24, 4, 256, lens_e, 3);
        g_sinks = true; /* sink logits up to 4: as large as the largest scores */
        attention_batches(PT_BF16, 16, 16, 8, 256, lens_a, 4); /* sinks: the ext kernel */
        attention_batches(PT_F32, 16, 8, 4, 64, lens_a, 4);
        attention_batches(PT_BF16, 5, 6, 2, 96, lens_a, 4);
        g_sinks = false;
    }
    g_ext = NULL;
}

static arr rand_ids(int n, int k, int E);

static void test_family_elementwise(void **state) {
    (void)state;
    static const size_t counts[] = {1, 1001, 100003};
    for (size_t i = 0; i < PT_ARRAY_LEN(counts); i++) {
        size_t n = counts[i];
        arr a = arr_rand(n, -6, 6), c = arr_rand(n, -3, 3);
        arr y = arr_poison(sizeof(float) * n);
        for (int b = 0; b < N_BE; b++) pt_be_geglu(be[b], y.d[b], a.d[b], c.d[b], n);
        check_out(&y, GPU, 1e-6, "geglu %zu", n);
        for (int b = 0; b < N_BE; b++) pt_be_scale(be[b], a.d[b], 0.37f, n);
        check_out(&a, GPU, 0, "scale %zu", n);
        for (int b = 0; b < N_BE; b++) pt_be_softcap(be[b], c.d[b], 1.5f, n);
        check_out(&c, GPU, 1e-6, "softcap %zu", n);
        arr_free(&a), arr_free(&c), arr_free(&y);
        /* gpt-oss's SwiGLU, inputs past its limit of 7 on both sides */
        arr g = arr_rand(n, -12, 12), u = arr_rand(n, -12, 12);
        arr z = arr_poison(sizeof(float) * n);
        for (int b = 0; b < N_BE; b++) pt_be_swiglu_oai(be[b], z.d[b], g.d[b], u.d[b], n, 1.702f, 7.0f);
        check_out(&z, GPU, 1e-6, "swiglu_oai %zu", n);
        arr_free(&g), arr_free(&u), arr_free(&z);
    }
    /* a bias by expert id */
    int n = 9, k = 3, d = 130, E = 7;
    arr y = arr_rand((size_t)n * k * d, -1, 1), bias = arr_rand((size_t)E * d, -1, 1);
    arr ids = rand_ids(n, k, E);
    for (int b = 0; b < N_BE; b++) pt_be_add_id(be[b], y.d[b], bias.d[b], ids.d[b], n, k, d);
    check_out(&y, GPU, 0, "add_id");
    arr_free(&y), arr_free(&bias), arr_free(&ids);
}

/* Routing: the same experts in the same order as the CPU, weights within
 * 1e-6.  Random logits can tie; tied experts may come in either order. */
static void one_route(int n, int E, int k, bool renorm) {
    arr lg = arr_rand((size_t)n * E, -4, 4);
    arr ids = arr_poison(sizeof(int32_t) * (size_t)n * k), w = arr_poison(sizeof(float) * (size_t)n * k);
    for (int b = 0; b < N_BE; b++) pt_be_moe_route(be[b], ids.d[b], w.d[b], lg.d[b], n, E, k, renorm);
    int32_t *ic = (int32_t *)arr_get(&ids, CPU), *ig = (int32_t *)arr_get(&ids, GPU);
    float *l = arr_get(&lg, CPU);
    for (int i = 0; i < n * k; i++)
        if (ic[i] != ig[i] && l[(size_t)(i / k) * E + ic[i]] != l[(size_t)(i / k) * E + ig[i]])
            fail_msg("moe_route n=%d E=%d k=%d: row %d slot %d: expert %d on cuda, %d on cpu", n, E, k,
                     i / k, i % k, ig[i], ic[i]);
    check_out(&w, GPU, 1e-6, "moe_route weights n=%d E=%d k=%d renorm=%d", n, E, k, renorm);
    free(ic), free(ig), free(l);
    arr_free(&lg), arr_free(&ids), arr_free(&w);
}

/* Random ids: k distinct experts per row (as routing gives). */
static arr rand_ids(int n, int k, int E) {
    int32_t *h = malloc(sizeof(int32_t) * (size_t)n * k);
    for (int t = 0; t < n; t++)
        for (int j = 0; j < k; j++) {
            int32_t e;
            bool dup;
            do {
                e = (int32_t)(pt_rng_next(&rng) % (uint64_t)E);
                dup = false;
                for (int i = 0; i < j; i++) dup |= h[t * k + i] == e;
            } while (dup);
            h[t * k + j] = e;
        }
    arr a = arr_from(h, sizeof(int32_t) * (size_t)n * k);
    free(h);
    return a;
}

/* matmul_id with f32/f16/bf16 experts: both sides compute in f32 from the
 * same weights, so 2e-5 relative; every (row, slot) output is written
 * (poisoned first). */
static void one_matmul_id(pt_dtype t, int E, int rows, int cols, int n, int k, int x_slots) {
    size_t es = t == PT_F32 ? 4 : 2, stride = (size_t)rows * cols * es;
    arr w = arr_rand_typed(t, (size_t)E * rows * cols, -1, 1);
    arr x = arr_rand((size_t)n * x_slots * cols, -1, 1);
    arr ids = rand_ids(n, k, E);
    arr y = arr_poison(sizeof(float) * (size_t)n * k * rows);
    for (int b = 0; b < N_BE; b++) {
        pt_weight wt = {.dtype = t, .rows = rows, .cols = cols, .data = w.d[b], .nbytes = w.nbytes,
                        .n_experts = E, .expert_stride = stride};
        pt_be_matmul_id(be[b], y.d[b], x.d[b], &wt, ids.d[b], n, k, x_slots);
    }
    check_out(&y, GPU, 2e-5, "matmul_id %s E=%d %dx%d n=%d k=%d slots=%d", tname(t), E, rows, cols, n,
              k, x_slots);
    arr_free(&w), arr_free(&x), arr_free(&ids), arr_free(&y);
}

/* Each token row of an n-row matmul_id call (rows sharing experts)
 * against the same row alone, bit for bit on the GPU. */
static void invariant_matmul_id(pt_dtype t, int E, int rows, int cols, int n, int k) {
    size_t es = t == PT_F32 ? 4 : 2, ny = (size_t)n * k * rows, y1n = (size_t)k * rows;
    arr w = arr_rand_typed(t, (size_t)E * rows * cols, -1, 1);
    arr ids = rand_ids(n, k, E);
    float *x = malloc(sizeof(float) * (size_t)n * cols), *yn = malloc(sizeof(float) * ny);
    float *y1 = malloc(sizeof(float) * y1n);
    for (size_t i = 0; i < (size_t)n * cols; i++) x[i] = frand(-1, 1);
    memset(yn, 0xff, sizeof(float) * ny);
    pt_weight wt = {.dtype = t, .rows = rows, .cols = cols, .data = w.d[GPU], .nbytes = w.nbytes,
                    .n_experts = E, .expert_stride = (size_t)rows * cols * es};
    void *dx = gpu_put(x, sizeof(float) * (size_t)n * cols), *dy = gpu_put(yn, sizeof(float) * ny);
    pt_be_matmul_id(be[GPU], dy, dx, &wt, ids.d[GPU], n, k, 1);
    gpu_get(yn, dy, sizeof(float) * ny);
    for (int i = 0; i < n; i++) {
        memset(y1, 0xff, sizeof(float) * y1n);
        void *dxi = gpu_put(x + (size_t)i * cols, sizeof(float) * cols);
        void *dyi = gpu_put(y1, sizeof(float) * y1n);
        void *dii = gpu_put((int32_t *)ids.h + (size_t)i * k, sizeof(int32_t) * k);
        pt_be_matmul_id(be[GPU], dyi, dxi, &wt, dii, 1, k, 1);
        gpu_get(y1, dyi, sizeof(float) * y1n);
        if (memcmp(y1, yn + (size_t)i * y1n, sizeof(float) * y1n)) {
            size_t r = 0;
            while (!memcmp(&y1[r], &yn[(size_t)i * y1n + r], sizeof(float))) r++;
            fail_msg("matmul_id %s E=%d %dx%d: row %d of %d differs from the row alone at [%zu]: "
                     "%.9g vs %.9g", tname(t), E, rows, cols, i, n, r, yn[(size_t)i * y1n + r], y1[r]);
        }
        be[GPU]->ops->free(be[GPU], dxi, sizeof(float) * cols);
        be[GPU]->ops->free(be[GPU], dyi, sizeof(float) * y1n);
        be[GPU]->ops->free(be[GPU], dii, sizeof(int32_t) * k);
    }
    be[GPU]->ops->free(be[GPU], dx, sizeof(float) * (size_t)n * cols);
    be[GPU]->ops->free(be[GPU], dy, sizeof(float) * ny);
    free(x), free(yn), free(y1);
    arr_free(&w), arr_free(&ids);
}

static void test_moe(void **state) {
    (void)state;
    static const int routes[][3] = {{1, 6, 2}, {37, 6, 2}, {5, 128, 8}, {300, 128, 8},
                                    {3, 512, 10}, {9, 64, 1}, {2, 1000, 32}};
    for (size_t i = 0; i < PT_ARRAY_LEN(routes); i++) {
        one_route(routes[i][0], routes[i][1], routes[i][2], true);
        one_route(routes[i][0], routes[i][1], routes[i][2], false);
    }
    static const pt_dtype types[] = {PT_F32, PT_F16, PT_BF16};
    for (int ti = 0; ti < 3; ti++) {
        one_matmul_id(types[ti], 6, 37, 64, 1, 2, 1);    /* decode, shared input */
        one_matmul_id(types[ti], 6, 64, 37, 1, 2, 2);    /* decode, an input per slot */
        one_matmul_id(types[ti], 6, 37, 64, 40, 2, 1);   /* prefill: > 8 pairs per expert */
        one_matmul_id(types[ti], 128, 96, 256, 3, 8, 8); /* most experts unused */
        one_matmul_id(types[ti], 20, 130, 1000, 17, 4, 1);
        /* 128 experts, top 8, decode-sized batches (16 rows share experts),
         * 2880 columns (gpt-oss) */
        one_matmul_id(types[ti], 128, 24, 2880, 1, 8, 1);
        one_matmul_id(types[ti], 128, 24, 2880, 4, 8, 8);
        one_matmul_id(types[ti], 128, 24, 2880, 16, 8, 1);
        one_matmul_id(types[ti], 4, 8, 2880, 16, 2, 2); /* 8 pairs per expert on average */
        invariant_matmul_id(types[ti], 16, 24, 2880, 9, 4);
        invariant_matmul_id(types[ti], 20, 13, 1000, 16, 4); /* element loads (odd rows) */
    }
    static const int combos[][3] = {{1, 2, 64}, {33, 8, 130}, {7, 1, 5}};
    for (size_t i = 0; i < PT_ARRAY_LEN(combos); i++) {
        int n = combos[i][0], k = combos[i][1], d = combos[i][2];
        arr x = arr_rand((size_t)n * k * d, -2, 2), w = arr_rand((size_t)n * k, 0, 1);
        arr y = arr_poison(sizeof(float) * (size_t)n * d);
        for (int b = 0; b < N_BE; b++) pt_be_moe_combine(be[b], y.d[b], x.d[b], w.d[b], n, k, d);
        check_out(&y, GPU, 1e-6, "moe_combine n=%d k=%d d=%d", n, k, d);
        arr_free(&x), arr_free(&w), arr_free(&y);
    }
}

/* ---- moe_ffn ------------------------------------------------------------------------- */

/* A stack of E random matrices [rows][cols] of type t on every backend
 * (GGUF blocks quantized from f32, or f32/bf16 as they are). */
static arr expert_stack(pt_dtype t, int E, int rows, int cols, pt_weight *w) {
    size_t n = (size_t)E * rows * cols;
    arr a;
    if (t == PT_F32 || t == PT_BF16 || t == PT_F16) {
        a = arr_rand_typed(t, n, -1, 1);
    } else {
        float *x = malloc(sizeof(float) * n);
        for (size_t i = 0; i < n; i++) x[i] = frand(-1, 1);
        void *blocks = malloc(pt_dtype_bytes(t, n));
        pt_gguf_quantize(t, x, blocks, (int64_t)n);
        a = arr_from(blocks, pt_dtype_bytes(t, n));
        free(blocks), free(x);
    }
    *w = (pt_weight){.dtype = t, .rows = rows, .cols = cols, .nbytes = a.nbytes, .n_experts = E,
                     .expert_stride = a.nbytes / (size_t)E};
    return a;
}

/* Backends a and b hold the same bytes of out. */
static void check_bits(const arr *out, int a, int b, const char *what) {
    float *x = arr_get(out, a), *y = arr_get(out, b);
    if (memcmp(x, y, out->nbytes)) {
        size_t i = 0;
        while (!memcmp(x + i, y + i, sizeof(float))) i++;
        fail_msg("%s: float %zu: 0x%08x (fused) vs 0x%08x (op by op)", what, i,
                 ((uint32_t *)x)[i], ((uint32_t *)y)[i]);
    }
    free(x), free(y);
}

typedef struct ffn_case {
    pt_dtype gt, dt; /* gate/up, down */
    int E, dim, f, n, k, act;
    bool bias, renorm;
} ffn_case;

/* moe_ffn on every backend from the same routing logits, inputs and
 * experts.  The CPU runs the op sequence (the reference): the GPU's routing
 * must match it and y agree to 1e-4 relative (int16 activation codes on
 * both sides; an f32 sum order apart); the default GPU backend (fused
 * kernels up to 8 rows of quantized experts) and GPU_ALT (the CUDA op
 * sequence) must agree bit for bit; and each row of the batch on the GPU
 * must be the row computed alone (n = 1: the fused kernels). */
static void one_moe_ffn(const ffn_case *c) {
    int n = c->n, k = c->k, E = c->E, dim = c->dim, f = c->f;
    pt_weight wg, wu, wd;
    arr g = expert_stack(c->gt, E, f, dim, &wg), u = expert_stack(c->gt, E, f, dim, &wu);
    arr d = expert_stack(c->dt, E, dim, f, &wd);
    arr x = arr_rand((size_t)n * dim, -1, 1), lg = arr_rand((size_t)n * E, -4, 4);
    arr gb = arr_rand((size_t)E * f, -1, 1), ub = arr_rand((size_t)E * f, -1, 1);
    arr db = arr_rand((size_t)E * dim, -1, 1);
    arr y = arr_poison(sizeof(float) * (size_t)n * dim);
    arr ids = arr_poison(sizeof(int32_t) * (size_t)n * k);
    arr w = arr_poison(sizeof(float) * (size_t)n * k);
    arr sg = arr_poison(sizeof(float) * (size_t)n * k * f);
    arr su = arr_poison(sizeof(float) * (size_t)n * k * f);
    arr so = arr_poison(sizeof(float) * (size_t)n * k * dim);
    pt_weight wgb[N_BE], wub[N_BE], wdb[N_BE];
    for (int b = 0; b < N_BE; b++) {
        wgb[b] = wg, wub[b] = wu, wdb[b] = wd;
        wgb[b].data = g.d[b], wub[b].data = u.d[b], wdb[b].data = d.d[b];
        pt_op_moe_ffn a = {
            .y = y.d[b], .x = x.d[b], .logits = lg.d[b], .w_gate = &wgb[b], .w_up = &wub[b],
            .w_down = &wdb[b], .gate_bias = c->bias ? gb.d[b] : NULL,
            .up_bias = c->bias ? ub.d[b] : NULL, .down_bias = c->bias ? db.d[b] : NULL,
            .ids = ids.d[b], .weights = w.d[b], .gate = sg.d[b], .up = su.d[b], .out = so.d[b],
            .n = n, .n_experts = E, .k = k, .act = c->act, .alpha = 1.702f, .limit = 7.0f,
            .renorm = c->renorm};
        pt_be_moe_ffn(be[b], &a);
    }
    char what[160];
    snprintf(what, sizeof what, "moe_ffn %s/%s E=%d dim=%d f=%d n=%d k=%d act=%d bias=%d",
             tname(c->gt), tname(c->dt), E, dim, f, n, k, c->act, c->bias);
    int32_t *ic = (int32_t *)arr_get(&ids, CPU), *ig = (int32_t *)arr_get(&ids, GPU);
    for (int i = 0; i < n * k; i++)
        if (ic[i] != ig[i])
            fail_msg("%s: row %d slot %d: expert %d on cuda, %d on cpu", what, i / k, i % k, ig[i],
                     ic[i]);
    free(ic), free(ig);
    check_out(&w, GPU, 1e-6, "%s: weights", what);
    /* 32+ rows of quantized experts: the grouped GEMM (moe_mma.cu, f16
     * weights and activations in three chained products) on GPU, the
     * exact op sequence on GPU_ALT (PETREL_CUDA_MOE_MMA=0), which must
     * then differ somewhere, or the GEMM did not run */
    bool mma = n >= 32 && pt_gguf_quant_type(c->gt) && pt_gguf_quant_type(c->dt);
    check_out(&y, GPU, mma ? 4e-3 : 1e-4, "%s", what);
    if (mma) {
        check_out(&y, GPU_ALT, 1e-4, "%s (op sequence)", what);
        float *ya = arr_get(&y, GPU), *yb = arr_get(&y, GPU_ALT);
        assert_true(memcmp(ya, yb, y.nbytes) != 0);
        free(ya), free(yb);
    } else {
        check_bits(&y, GPU, GPU_ALT, what);
    }
    check_bits(&ids, GPU, GPU_ALT, what);
    check_bits(&w, GPU, GPU_ALT, what);
    /* each row alone on the GPU (the exact kernels: bit for bit) */
    float *yn = arr_get(&y, GPU), *xh = arr_get(&x, CPU), *lh = arr_get(&lg, CPU);
    for (int t = 0; t < n && n > 1 && !mma; t++) {
        void *dx = gpu_put(xh + (size_t)t * dim, sizeof(float) * dim);
        void *dl = gpu_put(lh + (size_t)t * E, sizeof(float) * E);
        float *y1 = malloc(sizeof(float) * dim);
        memset(y1, 0xff, sizeof(float) * dim);
        void *dy = gpu_put(y1, sizeof(float) * dim);
        pt_op_moe_ffn a = {
            .y = dy, .x = dx, .logits = dl, .w_gate = &wgb[GPU], .w_up = &wub[GPU],
            .w_down = &wdb[GPU], .gate_bias = c->bias ? gb.d[GPU] : NULL,
            .up_bias = c->bias ? ub.d[GPU] : NULL, .down_bias = c->bias ? db.d[GPU] : NULL,
            .ids = ids.d[GPU], .weights = w.d[GPU], .gate = sg.d[GPU], .up = su.d[GPU],
            .out = so.d[GPU], .n = 1, .n_experts = E, .k = k, .act = c->act, .alpha = 1.702f,
            .limit = 7.0f, .renorm = c->renorm};
        pt_be_moe_ffn(be[GPU], &a);
        gpu_get(y1, dy, sizeof(float) * dim);
        if (memcmp(y1, yn + (size_t)t * dim, sizeof(float) * dim)) {
            int i = 0;
            while (!memcmp(&y1[i], &yn[(size_t)t * dim + i], sizeof(float))) i++;
            fail_msg("%s: row %d of %d differs from the row alone at [%d]: %.9g vs %.9g", what, t,
                     n, i, yn[(size_t)t * dim + i], y1[i]);
        }
        be[GPU]->ops->free(be[GPU], dx, sizeof(float) * dim);
        be[GPU]->ops->free(be[GPU], dl, sizeof(float) * E);
        be[GPU]->ops->free(be[GPU], dy, sizeof(float) * dim);
        free(y1);
    }
    free(yn), free(xh), free(lh);
    arr *all[] = {&g, &u, &d, &x, &lg, &gb, &ub, &db, &y, &ids, &w, &sg, &su, &so};
    for (size_t i = 0; i < PT_ARRAY_LEN(all); i++) arr_free(all[i]);
}

static void test_moe_ffn(void **state) {
    (void)state;
    static const ffn_case cases[] = {
        /* Qwen3-MoE's shape at a smaller width: 128 experts, top 8, decode */
        {PT_Q4_0, PT_Q4_0, 128, 512, 192, 1, 8, PT_MOE_SWIGLU, false, true},
        {PT_Q4_0, PT_Q4_0, 128, 512, 192, 8, 8, PT_MOE_SWIGLU, false, true},
        /* past the fused rows: the op sequence, rows sharing experts */
        {PT_Q4_0, PT_Q4_0, 128, 512, 192, 12, 8, PT_MOE_SWIGLU, false, true},
        /* gpt-oss: 2880 wide (q4_0 rows not 16-byte aligned), biases, clamped SwiGLU */
        {PT_Q4_0, PT_Q4_0, 4, 2880, 2880, 1, 4, PT_MOE_SWIGLU_OAI, true, true},
        {PT_Q8_0, PT_Q8_0, 6, 2880, 1440, 3, 3, PT_MOE_SWIGLU_OAI, true, true},
        /* Q4_K_M's mix (q4_k gate/up, q6_k down), GeGLU, no renormalization */
        {PT_Q4_K, PT_Q6_K, 16, 512, 256, 2, 3, PT_MOE_GEGLU, false, false},
        {PT_Q8_0, PT_Q4_0, 6, 256, 96, 5, 2, PT_MOE_SWIGLU, true, false},
        /* gpt-oss's 32 experts top 4 (routing: 8 threads an expert, float4
         * spans); more than 8 slots (the down kernel's second group of
         * products) */
        {PT_Q4_0, PT_Q4_0, 32, 512, 192, 1, 4, PT_MOE_SWIGLU_OAI, true, true},
        {PT_Q8_0, PT_Q4_0, 16, 256, 96, 2, 10, PT_MOE_SWIGLU, true, false},
        /* prefill: the grouped GEMM (64-pair tiles, experts of one to
         * several tiles, 2880 and 1440 columns, a tail step of 32) */
        {PT_Q4_0, PT_Q4_0, 128, 512, 192, 48, 8, PT_MOE_SWIGLU, false, true},
        {PT_Q4_0, PT_Q4_0, 4, 2880, 2880, 70, 4, PT_MOE_SWIGLU_OAI, true, true},
        {PT_Q8_0, PT_Q8_0, 6, 2880, 1440, 40, 3, PT_MOE_SWIGLU_OAI, true, true},
        {PT_Q4_K, PT_Q6_K, 16, 512, 256, 33, 3, PT_MOE_GEGLU, false, false},
        {PT_Q8_0, PT_Q4_0, 6, 256, 96, 130, 2, PT_MOE_SWIGLU, true, false},
        /* float experts: the op sequence on every backend */
        {PT_BF16, PT_BF16, 16, 256, 96, 2, 4, PT_MOE_SWIGLU, false, true},
        {PT_F32, PT_F32, 8, 128, 64, 3, 2, PT_MOE_SWIGLU_OAI, true, true},
    };
    for (size_t i = 0; i < PT_ARRAY_LEN(cases); i++) one_moe_ffn(&cases[i]);
}

/* ---- hybrid recurrent and latent-attention ops (recurrent.cu, mla.cu) ------------ */

/* Backend b's copy of out is the CPU's, byte for byte. */
static void check_same(const arr *out, int b, const char *what) {
    float *ref = arr_get(out, CPU), *got = arr_get(out, b);
    if (memcmp(ref, got, out->nbytes)) {
        size_t i = 0;
        while (!memcmp(ref + i, got + i, sizeof(float))) i++;
        fail_msg("%s [cuda]: float %zu differs: 0x%08x vs the cpu's 0x%08x", what, i,
                 ((uint32_t *)got)[i], ((uint32_t *)ref)[i]);
    }
    free(ref);
    free(got);
}

/* Every element within tol * (1 + |cpu|): for state carried over many
 * rows, where a relative norm would hide one bad column. */
static void check_close_each(const arr *out, int b, double tol, const char *what) {
    size_t n = out->nbytes / sizeof(float);
    float *ref = arr_get(out, CPU), *got = arr_get(out, b);
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - ref[i]);
        if (!(d <= tol * (1 + fabs(ref[i]))))
            fail_msg("%s [%s]: [%zu] = %.9g, cpu %.9g (bound %.3g)", what,
                     b == GPU ? "cuda" : "cuda-alt", i, got[i], ref[i], tol * (1 + fabs(ref[i])));
        if (d > worst) worst = d;
    }
    print_message("%s [%s]: worst abs diff %.3g\n", what, b == GPU ? "cuda" : "cuda-alt", worst);
    free(ref);
    free(got);
}

static arr arr_ints(const int32_t *h, int n) {
    return arr_from(h, sizeof(int32_t) * (size_t)n);
}

/* gather_cols (repeated and reordered columns), copy_cols (columns outside
 * the range kept), sigmoid_mul (a gate per element and per row, in place)
 * and rmsnorm_gated (rows shorter and longer than a warp's 32, in place):
 * shapes past a 256-thread block and a 32-lane warp. */
static void test_recurrent_elementwise(void **state) {
    (void)state;
    static const int gshapes[][3] = {{1, 9, 4}, {7, 300, 170}, {33, 1000, 999}};
    for (size_t i = 0; i < PT_ARRAY_LEN(gshapes); i++) {
        int n = gshapes[i][0], ds = gshapes[i][1], dd = gshapes[i][2];
        int32_t *idx = malloc(sizeof(int32_t) * (size_t)dd);
        for (int j = 0; j < dd; j++) idx[j] = (int32_t)(pt_rng_next(&rng) % (uint64_t)ds);
        idx[0] = ds - 1;
        arr ix = arr_ints(idx, dd), src = arr_rand((size_t)n * ds, -3, 3);
        arr dst = arr_poison(sizeof(float) * (size_t)n * dd);
        for (int b = 0; b < N_BE; b++)
            pt_be_gather_cols(be[b], dst.d[b], src.d[b], ix.d[b], n, ds, dd);
        check_same(&dst, GPU, "gather_cols");
        arr_free(&ix), arr_free(&src), arr_free(&dst);
        free(idx);
    }
    static const int cshapes[][6] = {/* n, d_src, src_off, d_dst, dst_off, width */
                                     {1, 8, 0, 8, 0, 8},
                                     {300, 70, 5, 40, 7, 33},
                                     {9, 576, 512, 600, 0, 64},
                                     {40, 1000, 1, 999, 998, 1}};
    for (size_t i = 0; i < PT_ARRAY_LEN(cshapes); i++) {
        const int *c = cshapes[i];
        arr src = arr_rand((size_t)c[0] * c[1], -3, 3), dst = arr_rand((size_t)c[0] * c[3], -3, 3);
        for (int b = 0; b < N_BE; b++)
            pt_be_copy_cols(be[b], dst.d[b], c[3], c[4], src.d[b], c[1], c[2], c[5], c[0]);
        check_same(&dst, GPU, "copy_cols");
        arr_free(&src), arr_free(&dst);
    }
    static const int sshapes[][2] = {{1, 1}, {5, 1001}, {300, 128}};
    for (size_t i = 0; i < PT_ARRAY_LEN(sshapes); i++) {
        int n = sshapes[i][0], d = sshapes[i][1];
        arr x = arr_rand((size_t)n * d, -4, 4), g = arr_rand((size_t)n * d, -8, 8);
        arr y = arr_poison(sizeof(float) * (size_t)n * d);
        for (int b = 0; b < N_BE; b++) pt_be_sigmoid_mul(be[b], y.d[b], x.d[b], g.d[b], n, d, d);
        check_out(&y, GPU, 1e-6, "sigmoid_mul %dx%d", n, d);
        for (int b = 0; b < N_BE; b++) pt_be_sigmoid_mul(be[b], x.d[b], x.d[b], g.d[b], n, d, 1);
        check_out(&x, GPU, 1e-6, "sigmoid_mul, one gate per row, in place %dx%d", n, d);
        arr_free(&x), arr_free(&g), arr_free(&y);
    }
    static const int nshapes[][2] = {{1, 16}, {37, 128}, {300, 96}, {3, 1000}};
    for (size_t i = 0; i < PT_ARRAY_LEN(nshapes); i++) {
        int n = nshapes[i][0], d = nshapes[i][1];
        arr x = arr_rand((size_t)n * d, -4, 4), z = arr_rand((size_t)n * d, -6, 6);
        arr w = arr_rand((size_t)d, 0.5f, 1.5f), y = arr_poison(sizeof(float) * (size_t)n * d);
        for (int b = 0; b < N_BE; b++)
            pt_be_rmsnorm_gated(be[b], y.d[b], x.d[b], z.d[b], w.d[b], n, d, 1e-6f);
        check_out(&y, GPU, 1e-6, "rmsnorm_gated %dx%d", n, d);
        for (int b = 0; b < N_BE; b++)
            pt_be_rmsnorm_gated(be[b], x.d[b], x.d[b], z.d[b], w.d[b], n, d, 1e-6f);
        check_out(&x, GPU, 1e-6, "rmsnorm_gated in place %dx%d", n, d);
        arr_free(&x), arr_free(&z), arr_free(&w), arr_free(&y);
    }
}

/* A step of a recurrent test: n rows (pos, seq) over n_seqs sequences
 * whose states live in slots. */
typedef struct rec_step {
    int n, n_seqs;
    const int32_t *pos, *seq, *slots;
} rec_step;

/* The batch views of a step on every backend (freed by rec_views_free). */
typedef struct rec_views {
    arr pos, seq, slots;
    pt_batch_view b[N_BE];
} rec_views;

static rec_views rec_views_of(const rec_step *s) {
    rec_views v;
    v.pos = arr_ints(s->pos, s->n), v.seq = arr_ints(s->seq, s->n);
    v.slots = arr_ints(s->slots, s->n_seqs);
    for (int b = 0; b < N_BE; b++)
        v.b[b] = (pt_batch_view){.pos = v.pos.d[b], .seq = v.seq.d[b], .state_slot = v.slots.d[b],
                                 .n_tokens = s->n, .n_seqs = s->n_seqs};
    return v;
}

static void rec_views_free(rec_views *v) {
    arr_free(&v->pos), arr_free(&v->seq), arr_free(&v->slots);
}

/* Three steps over states in slots 2 and 0 of 3 (slot 1 must stay as it
 * is): a prefill of sequence 0 from position 0 (70 rows: the CPU's
 * chunks of 64 and 6) beside sequence 1 continuing its state from
 * position 9 (12 rows); decode rows of both in reverse order; then
 * sequence 1 restarting at position 0 (its state ignored) beside a decode
 * row of sequence 0.  The states start as random numbers, so a kernel
 * that does not reset at position 0 fails. */
enum { REC_STEPS = 3, REC_MAX_ROWS = 82 };

static void rec_steps(rec_step *st, int32_t pos[][REC_MAX_ROWS], int32_t seq[][REC_MAX_ROWS]) {
    static const int32_t slots[2] = {2, 0};
    int n = 0;
    for (int t = 0; t < 70; t++, n++) pos[0][n] = t, seq[0][n] = 0;
    for (int t = 0; t < 12; t++, n++) pos[0][n] = 9 + t, seq[0][n] = 1;
    st[0] = (rec_step){n, 2, pos[0], seq[0], slots};
    pos[1][0] = 21, seq[1][0] = 1, pos[1][1] = 70, seq[1][1] = 0;
    st[1] = (rec_step){2, 2, pos[1], seq[1], slots};
    pos[2][0] = 71, seq[2][0] = 0, pos[2][1] = 0, seq[2][1] = 1;
    st[2] = (rec_step){2, 2, pos[2], seq[2], slots};
}

static void one_conv(int C, int K) {
    rec_step st[REC_STEPS];
    int32_t pos[REC_STEPS][REC_MAX_ROWS], seq[REC_STEPS][REC_MAX_ROWS];
    rec_steps(st, pos, seq);
    arr w = arr_rand((size_t)C * K, -1, 1);
    arr state = arr_rand((size_t)3 * (K - 1) * C + 1, -2, 2);
    for (int i = 0; i < REC_STEPS; i++) {
        rec_views v = rec_views_of(&st[i]);
        arr x = arr_rand((size_t)st[i].n * C, -2, 2);
        arr y = arr_poison(sizeof(float) * (size_t)st[i].n * C);
        for (int b = 0; b < N_BE; b++)
            pt_be_conv1d_silu(be[b], y.d[b], x.d[b], w.d[b], state.d[b], &v.b[b], C, K);
        check_out(&y, GPU, 1e-6, "conv1d_silu C=%d K=%d step %d", C, K, i);
        check_same(&state, GPU, "conv1d_silu state"); /* inputs copied, never computed */
        arr_free(&x), arr_free(&y);
        rec_views_free(&v);
    }
    arr_free(&w), arr_free(&state);
}

/* The gated delta rule over n_steps steps whose sequences keep their
 * states in slots of a buffer of n_slots (the others must stay as they
 * are).  The CPU takes runs of a sequence's consecutive rows in its
 * chunkwise form (chunk 64) and single rows in the recurrent form; CUDA
 * takes a step chunkwise when its sequences bring 16 rows each on average
 * (cuda), or always (cuda-alt), else row by row: the same function to
 * f32 rounding (the CPU's own chunked test holds 5e-5 against a double
 * reference).  Outputs and states within 5e-4 (1 + |cpu|) each, far under
 * what a wrong index, a missed reset or a chunk cut wrongly gives (order
 * 1); each check prints its worst difference. */
static void run_delta(const rec_step *st, int n_steps, int n_slots, int nk, int nv, int dk, int dv,
                      bool tiled, float l2_eps) {
    int stride = 2 * nk * dk + nv * dv + 3; /* rows with slack after v, as the conv output's */
    float *h = malloc(sizeof(float) * (size_t)nv);
    for (int i = 0; i < nv; i++) h[i] = -expf(frand(-1.5f, 1.5f)); /* -exp(A_log) */
    arr A = arr_from(h, sizeof(float) * (size_t)nv), dt = arr_rand((size_t)nv, -1, 1);
    free(h);
    size_t per = (size_t)nv * dk * dv;
    arr state = arr_rand((size_t)n_slots * per, -0.5f, 0.5f);
    for (int i = 0; i < n_steps; i++) {
        rec_views v = rec_views_of(&st[i]);
        int n = st[i].n;
        arr qkv = arr_rand((size_t)n * stride, -1, 1), ba = arr_rand((size_t)n * 2 * nv, -3, 3);
        arr out = arr_poison(sizeof(float) * (size_t)n * nv * dv);
        for (int b = 0; b < N_BE; b++) {
            pt_op_gated_delta op = {.out = out.d[b], .qkv = qkv.d[b], .ba = ba.d[b], .A = A.d[b],
                                    .dt_bias = dt.d[b], .state = state.d[b], .b = v.b[b],
                                    .n_k_heads = nk, .n_v_heads = nv, .dk = dk, .dv = dv,
                                    .stride = stride, .chunk = 64, .tiled = tiled,
                                    .l2_eps = l2_eps};
            pt_be_gated_delta(be[b], &op);
        }
        char what[160];
        for (int b = GPU; b <= GPU_ALT; b++) {
            snprintf(what, sizeof what, "gated_delta heads %d/%d dk %d dv %d%s%s step %d (%d rows)",
                     nk, nv, dk, dv, tiled ? " tiled" : "", l2_eps > 0 ? " ggml-l2" : "", i, n);
            check_close_each(&out, b, 5e-4, what);
            strncat(what, " state", sizeof what - strlen(what) - 1);
            check_close_each(&state, b, 5e-4, what);
        }
        arr_free(&qkv), arr_free(&ba), arr_free(&out);
        rec_views_free(&v);
    }
    arr_free(&A), arr_free(&dt), arr_free(&state);
}

/* The three steps of rec_steps. */
static void one_delta(int nk, int nv, int dk, int dv, bool tiled, float l2_eps) {
    rec_step st[REC_STEPS];
    int32_t pos[REC_STEPS][REC_MAX_ROWS], seq[REC_STEPS][REC_MAX_ROWS];
    rec_steps(st, pos, seq);
    run_delta(st, REC_STEPS, 3, nk, nv, dk, dv, tiled, l2_eps);
}

/* Long prefills, where the chunkwise kernel carries a state across
 * several chunks: three sequences in slots 3, 0 and 1 of 4.
 *   step 0: sequence 0 from position 0 (rows 0-99), sequence 1 continuing
 *           its state from position 5 (67 rows: a chunk and 3), sequence
 *           0 again (100-149), a decode row of sequence 2, sequence 0
 *           again (150-152): 221 rows, sequence 0's CUDA chunks cross the
 *           other sequences' rows (the CPU's runs stop there);
 *   step 1: sequence 1 on (72-99), sequence 0 on (153-283: 131 rows, two
 *           whole chunks and 3), sequence 1 restarting at position 0 in
 *           the same step (0-40, its earlier rows' state dropped), two
 *           rows of sequence 2: 202 rows;
 *   step 2: a decode row of each, in the order 2, 0, 1. */
enum { LONG_STEPS = 3, LONG_MAX_ROWS = 224 };

static int add_rows(int32_t *pos, int32_t *seq, int n, int s, int from, int count) {
    for (int i = 0; i < count; i++) pos[n + i] = from + i, seq[n + i] = s;
    return n + count;
}

static void one_delta_long(int nk, int nv, int dk, int dv, bool tiled, float l2_eps) {
    static const int32_t slots[3] = {3, 0, 1};
    static int32_t pos[LONG_STEPS][LONG_MAX_ROWS], seq[LONG_STEPS][LONG_MAX_ROWS];
    rec_step st[LONG_STEPS];
    int n = add_rows(pos[0], seq[0], 0, 0, 0, 100);
    n = add_rows(pos[0], seq[0], n, 1, 5, 67);
    n = add_rows(pos[0], seq[0], n, 0, 100, 50);
    n = add_rows(pos[0], seq[0], n, 2, 30, 1);
    n = add_rows(pos[0], seq[0], n, 0, 150, 3);
    st[0] = (rec_step){n, 3, pos[0], seq[0], slots};
    n = add_rows(pos[1], seq[1], 0, 1, 72, 28);
    n = add_rows(pos[1], seq[1], n, 0, 153, 131);
    n = add_rows(pos[1], seq[1], n, 1, 0, 41);
    n = add_rows(pos[1], seq[1], n, 2, 31, 2);
    st[1] = (rec_step){n, 3, pos[1], seq[1], slots};
    n = add_rows(pos[2], seq[2], 0, 2, 33, 1);
    n = add_rows(pos[2], seq[2], n, 0, 284, 1);
    n = add_rows(pos[2], seq[2], n, 1, 41, 1);
    st[2] = (rec_step){n, 3, pos[2], seq[2], slots};
    run_delta(st, LONG_STEPS, 4, nk, nv, dk, dv, tiled, l2_eps);
}

/* Shapes: every kernel instance (a column in 1, 2 and 4 lanes; key dims
 * up to 64, 128 and 256 chunkwise), key dims that are not multiples of
 * 32, value dims under and over a warp's 32 columns (and a block's 32
 * chunkwise), grouped and tiled value heads, both l2 norms; the long
 * prefills with Qwen3.5's heads; channels past the conv's 128-thread
 * blocks. */
static void test_recurrent_state(void **state) {
    (void)state;
    static const int convs[][2] = {{1, 4}, {300, 4}, {1000, 2}, {64, 1}};
    for (size_t i = 0; i < PT_ARRAY_LEN(convs); i++) one_conv(convs[i][0], convs[i][1]);
    one_delta(1, 1, 16, 20, false, 0);
    one_delta(2, 4, 32, 48, false, 0);
    one_delta(2, 4, 32, 48, true, 1e-6f);
    one_delta(2, 2, 64, 40, false, 0);
    one_delta(1, 2, 128, 128, true, 1e-6f);
    one_delta(2, 6, 100, 33, false, 0);
    one_delta(1, 1, 200, 64, false, 0);
    one_delta(1, 1, 256, 70, true, 9.2f); /* the l2 floor (norms ~9.2 here) bites for some rows */
    one_delta_long(2, 4, 128, 128, false, 0); /* Qwen3.5's head shape */
    one_delta_long(1, 2, 64, 40, true, 1e-6f);
    one_delta_long(2, 6, 100, 33, false, 0);
    one_delta_long(1, 1, 256, 70, false, 0);
}

/* DeepSeek routing: the CPU's experts in the CPU's order (ids bit for
 * bit: random logits are never near-tied at this count), weights within
 * 1e-6.  Softmax and sigmoid gating, with and without bias, renorm and
 * scale; group counts under and over a warp's 32. */
static void one_route_grouped(int n, int E, int k, int groups, int used, int gating, bool bias,
                              bool renorm, float scale) {
    arr lg = arr_rand((size_t)n * E, -4, 4), bs = arr_rand((size_t)E, -0.1f, 0.1f);
    arr ids = arr_poison(sizeof(int32_t) * (size_t)n * k);
    arr w = arr_poison(sizeof(float) * (size_t)n * k);
    for (int b = 0; b < N_BE; b++) {
        pt_op_moe_route_grouped r = {.ids = ids.d[b], .weights = w.d[b], .logits = lg.d[b],
                                     .bias = bias ? bs.d[b] : NULL, .n = n, .n_experts = E,
                                     .k = k, .n_groups = groups, .groups_used = used,
                                     .gating = gating, .scale = scale, .renorm = renorm};
        pt_be_moe_route_grouped(be[b], &r);
    }
    char what[160];
    snprintf(what, sizeof what, "moe_route_grouped n=%d E=%d k=%d groups %d/%d gating %d bias %d "
             "renorm %d", n, E, k, used, groups, gating, bias, renorm);
    check_same(&ids, GPU, what);
    check_out(&w, GPU, 1e-6, "%s weights", what);
    arr_free(&lg), arr_free(&bs), arr_free(&ids), arr_free(&w);
}

static void test_route_grouped(void **state) {
    (void)state;
    one_route_grouped(5, 64, 6, 1, 1, PT_MOE_SOFTMAX, false, false, 1.0f);   /* V2-Lite */
    one_route_grouped(37, 160, 6, 8, 3, PT_MOE_SOFTMAX, false, false, 16.0f); /* V2 */
    one_route_grouped(37, 256, 8, 8, 4, PT_MOE_SIGMOID, true, true, 2.5f);    /* V3 */
    one_route_grouped(1, 256, 8, 8, 4, PT_MOE_SIGMOID, true, true, 2.5f);
    one_route_grouped(3, 256, 20, 64, 5, PT_MOE_SIGMOID, true, false, 1.0f);  /* 64 groups */
    one_route_grouped(2, 1024, 40, 32, 2, PT_MOE_SOFTMAX, true, true, 1.0f);
    one_route_grouped(4, 96, 3, 96, 3, PT_MOE_SIGMOID, false, true, 1.0f);    /* groups of 1 */
    one_route_grouped(300, 33, 33, 1, 1, PT_MOE_SOFTMAX, false, true, 1.0f);  /* every expert */
}

static void test_read_bandwidth(void **state) {
    (void)state;
    double bw = be[GPU]->ops->read_bandwidth(be[GPU]);
    print_message("cuda read bandwidth: %.1f GB/s (%s)\n", bw / 1e9, be[GPU]->detail);
    assert_true(bw > 1e11);
}

int main(void) {
    pt_err err = {{0}};
    be[GPU] = pt_backend_cuda_new(0, &err);
    if (!be[GPU]) {
        printf("test_cuda_ops: skipped: %s\n", err.msg);
        fflush(stdout);
        _exit(77); /* not exit(): leak checkers would count the runtime's buffers */
    }
    setenv("PETREL_CUDA_GEMV_MAX", "0", 1);
    setenv("PETREL_CUDA_ATTN", "simple", 1);
    setenv("PETREL_CUDA_GDN_CHUNK", "1", 1);
    setenv("PETREL_CUDA_MOE_FUSED", "0", 1);
    setenv("PETREL_CUDA_MOE_MMA", "0", 1);
    be[GPU_ALT] = pt_backend_cuda_new(0, &err);
    unsetenv("PETREL_CUDA_MOE_MMA");
    unsetenv("PETREL_CUDA_GEMV_MAX");
    unsetenv("PETREL_CUDA_ATTN");
    unsetenv("PETREL_CUDA_GDN_CHUNK");
    unsetenv("PETREL_CUDA_MOE_FUSED");
    be[CPU] = pt_backend_cpu_new(4, "portable", &err);
    if (!be[CPU] || !be[GPU_ALT]) {
        fprintf(stderr, "test_cuda_ops: %s\n", err.msg);
        return 1;
    }
    pt_rng_seed(&rng, 12345);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matmul),    cmocka_unit_test(test_embed),
        cmocka_unit_test(test_gather_rows), cmocka_unit_test(test_rmsnorm),
        cmocka_unit_test(test_elementwise), cmocka_unit_test(test_rope),
        cmocka_unit_test(test_attention), cmocka_unit_test(test_batch_invariance),
        cmocka_unit_test(test_attention_ext), cmocka_unit_test(test_family_elementwise),
        cmocka_unit_test(test_moe), cmocka_unit_test(test_moe_ffn),
        cmocka_unit_test(test_recurrent_elementwise),
        cmocka_unit_test(test_recurrent_state), cmocka_unit_test(test_route_grouped),
        cmocka_unit_test(test_read_bandwidth), cmocka_unit_test(test_argmax),
    };
    /* CMOCKA_FILTER / CMOCKA_SKIP (patterns with * and ?): a subset */
    if (getenv("CMOCKA_FILTER")) cmocka_set_test_filter(getenv("CMOCKA_FILTER"));
    if (getenv("CMOCKA_SKIP")) cmocka_set_skip_filter(getenv("CMOCKA_SKIP"));
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    for (int b = 0; b < N_BE; b++) be[b]->ops->destroy(be[b]);
    return rc;
}
