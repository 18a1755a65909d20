/*
 * cpu_kernels.c - measures the CPU backend's kernels against the machine's
 * own ceilings: read bandwidth for decode matvecs, and OpenBLAS sgemm for
 * prefill.  Not a test and not part of the build; results and the exact
 * command go in bench/cpu_kernels.md.
 *
 *   gcc -O2 -std=c11 -D_GNU_SOURCE -Isrc -DHAVE_OPENBLAS \
 *       -I/usr/include/x86_64-linux-gnu/openblas-pthread bench/cpu_kernels.c \
 *       build-cpu/libpetrel_backend.a build-cpu/libpetrel_base.a -lopenblas -lpthread -lm \
 *       -o /tmp/cpu_kernels && /tmp/cpu_kernels [avx2|portable] [all|matvec|gemm|attention]
 *
 * Decode: each matvec rotates through enough copies of its matrix to exceed
 * 1 GiB, so every call streams its weights from DRAM as a real decode step
 * does.  The machine this was written on is shared and noisy, so the
 * bandwidth and the matvec are measured in alternation: ROUNDS times, a fresh
 * backend measures read_bandwidth and then the matvec (best of 3 passes).
 * Reported: best matvec over best bandwidth, and the median and range of
 * the per-round ratios.  Prefill: our matmul and OpenBLAS sgemm alternate within each pass;
 * best pass per arm.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"

#ifdef HAVE_OPENBLAS
#include <cblas.h>
void openblas_set_num_threads(int n);
#endif

#define ROTATE_BYTES ((size_t)1200 << 20)
#define ROUNDS 5

static pt_rng rng;

/* Random values in the first MiB, repeated: fast to fill, and the kernels'
 * speed does not depend on the values. */
static void fill_weight(pt_dtype dt, void *p, size_t n) {
    size_t esize = pt_dtype_bytes(dt, 1), first = PT_MIN(n, (size_t)(1 << 20) / esize);
    for (size_t i = 0; i < first; i++) {
        float v = (float)(pt_rng_uniform(&rng) * 2 - 1);
        if (dt == PT_F32) ((float *)p)[i] = v;
        else if (dt == PT_F16) ((uint16_t *)p)[i] = pt_f32_to_f16(v);
        else ((uint16_t *)p)[i] = pt_f32_to_bf16(v);
    }
    for (size_t i = first; i < n; i += first)
        memcpy((char *)p + i * esize, p, PT_MIN(first, n - i) * esize);
}

static float *rand_floats(size_t n) {
    float *p = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) p[i] = (float)(pt_rng_uniform(&rng) * 2 - 1);
    return p;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Best of 3 passes over all copies: GB/s of weight bytes. */
static double matvec_pass(pt_backend *be, const pt_weight *w, int copies, const float *x, float *y) {
    double best = 1e30;
    for (int pass = 0; pass < 3; pass++) {
        double t0 = pt_now();
        for (int c = 0; c < copies; c++) pt_be_matmul(be, y, x, &w[c], 1);
        best = PT_MIN(best, (pt_now() - t0) / copies);
    }
    return (double)w[0].nbytes / best;
}

static void bench_matvec(const char *kernels, int nth, pt_dtype dt, int64_t rows, int64_t cols) {
    size_t nbytes = pt_dtype_bytes(dt, (uint64_t)(rows * cols));
    int copies = (int)PT_MAX(1, ROTATE_BYTES / nbytes);
    pt_weight *w = calloc((size_t)copies, sizeof *w);
    for (int c = 0; c < copies; c++) {
        void *p = malloc(nbytes);
        fill_weight(dt, p, (size_t)(rows * cols));
        w[c] = (pt_weight){.dtype = dt, .rows = rows, .cols = cols, .data = p, .nbytes = nbytes};
    }
    float *x = rand_floats((size_t)cols), *y = malloc(sizeof(float) * (size_t)rows);
    double ratio[ROUNDS], bw[ROUNDS], best_mv = 0;
    for (int r = 0; r < ROUNDS; r++) {
        pt_err err;
        pt_backend *be = pt_backend_cpu_new(nth, kernels, &err);
        bw[r] = be->ops->read_bandwidth(be);
        double mv = matvec_pass(be, w, copies, x, y);
        ratio[r] = mv / bw[r];
        best_mv = PT_MAX(best_mv, mv);
        be->ops->destroy(be);
    }
    qsort(ratio, ROUNDS, sizeof(double), cmp_double);
    qsort(bw, ROUNDS, sizeof(double), cmp_double);
    printf("| %5lldx%-5lld | %-4s | %d | %5.1f | %5.1f | %3.0f%% | %3.0f%% | %3.0f-%3.0f%% |\n",
           (long long)rows, (long long)cols, pt_dtype_name(dt), nth, best_mv / 1e9,
           bw[ROUNDS - 1] / 1e9, 100 * best_mv / bw[ROUNDS - 1], 100 * ratio[ROUNDS / 2],
           100 * ratio[0], 100 * ratio[ROUNDS - 1]);
    fflush(stdout);
    for (int c = 0; c < copies; c++) free((void *)w[c].data);
    free(w), free(x), free(y);
}

/* Prefill: y[n][rows] = x[n][cols] Wᵀ.  Arms: ours f32, ours bf16, OpenBLAS
 * sgemm on the f32 weights; alternating, best pass each, in GFLOP/s. */
static void bench_gemm(pt_backend *be, int64_t rows, int64_t cols, int n) {
    enum { ARMS = 3 };
    pt_dtype dts[2] = {PT_F32, PT_BF16};
    pt_weight w[2];
    for (int d = 0; d < 2; d++) {
        size_t nbytes = pt_dtype_bytes(dts[d], (uint64_t)(rows * cols));
        void *p = be->ops->alloc(be, nbytes);
        fill_weight(dts[d], p, (size_t)(rows * cols));
        w[d] = (pt_weight){.dtype = dts[d], .rows = rows, .cols = cols, .data = p, .nbytes = nbytes};
    }
    float *x = rand_floats((size_t)(n * cols)), *y = malloc(sizeof(float) * (size_t)(n * rows));
    double best[ARMS] = {1e30, 1e30, 1e30}, flops = 2.0 * rows * cols * n;
    int reps = (int)PT_MAX(1, 1e9 / flops);
    for (int pass = 0; pass < 7; pass++)
        for (int arm = 0; arm < ARMS; arm++) {
            double t0 = pt_now();
            for (int r = 0; r < reps; r++) {
                if (arm < 2) {
                    pt_be_matmul(be, y, x, &w[arm], n);
                } else {
#ifdef HAVE_OPENBLAS
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, (int)rows, (int)cols, 1.0f, x,
                                (int)cols, w[0].data, (int)cols, 0.0f, y, (int)rows);
#endif
                }
            }
            best[arm] = PT_MIN(best[arm], (pt_now() - t0) / reps);
        }
    printf("| %5lldx%-5lld | %3d | %d | %6.1f | %6.1f |", (long long)rows, (long long)cols, n,
           be->n_threads, flops / best[0] / 1e9, flops / best[1] / 1e9);
#ifdef HAVE_OPENBLAS
    printf(" %6.1f |", flops / best[2] / 1e9);
#endif
    printf("\n");
    fflush(stdout);
    for (int d = 0; d < 2; d++) be->ops->free(be, (void *)w[d].data, w[d].nbytes);
    free(x), free(y);
}

/* Attention over a bf16 paged cache, TinyLlama's shape (32 query heads, 4
 * kv heads of 64, pages of 16): n rows at positions ctx .. ctx+n-1 of one
 * sequence.  Reports ms and the rate of K/V bytes read (each row reads its
 * whole prefix). */
static void bench_attention(pt_backend *be, int n, int ctx) {
    const int nh = 32, nkv = 4, hd = 64, ps = 16, pages = (ctx + n + ps - 1) / ps;
    size_t elts = (size_t)pages * ps * nkv * hd;
    uint16_t *k = malloc(elts * 2), *v = malloc(elts * 2);
    fill_weight(PT_BF16, k, elts);
    fill_weight(PT_BF16, v, elts);
    int32_t *bt = malloc(sizeof(int32_t) * (size_t)pages), *pos = malloc(sizeof(int32_t) * (size_t)n);
    int32_t *seq = calloc((size_t)n, sizeof(int32_t));
    for (int i = 0; i < pages; i++) bt[i] = (int32_t)((i * 7919) % pages); /* scattered pages */
    for (int i = 0; i < n; i++) pos[i] = ctx + i;
    pt_kv_view kv = {.k = k, .v = v, .dtype = PT_BF16, .page_size = ps, .n_kv_heads = nkv, .head_dim = hd};
    pt_batch_view b = {.n_tokens = n, .pos = pos, .seq = seq, .block_table = bt, .max_pages = pages, .n_seqs = 1};
    float *q = rand_floats((size_t)n * nh * hd), *o = malloc(sizeof(float) * (size_t)n * nh * hd);
    double best = 1e30, bytes = 0;
    for (int i = 0; i < n; i++) bytes += (double)(pos[i] + 1) * nkv * hd * 2 * 2;
    for (int r = 0; r < 7; r++) {
        double t0 = pt_now();
        pt_be_attention(be, o, q, &kv, &b, nh, 0.125f);
        best = PT_MIN(best, pt_now() - t0);
    }
    printf("| %3d | %5d | %d | %7.3f | %5.1f |\n", n, ctx, be->n_threads, best * 1e3, bytes / best / 1e9);
    fflush(stdout);
    free(k), free(v), free(bt), free(pos), free(seq), free(q), free(o);
}

int main(int argc, char **argv) {
    const char *kernels = argc > 1 ? argv[1] : "avx2";
    const char *what = argc > 2 ? argv[2] : "all";
    bool all = strcmp(what, "all") == 0;
    bool do_mv = all || !strcmp(what, "matvec"), do_gemm = all || !strcmp(what, "gemm");
    bool do_attn = all || !strcmp(what, "attention");
    pt_rng_seed(&rng, 42);
    static const pt_dtype types[] = {PT_F32, PT_F16, PT_BF16};
    /* 1B-class shapes (TinyLlama): wq, w_gate/w_up, w_down, output. */
    static const int64_t mv[][2] = {{2048, 2048}, {5632, 2048}, {2048, 5632}, {32000, 2048}};
    if (do_mv) {
        printf("| matrix | dtype | threads | matvec GB/s (best) | read bw GB/s (best) | best / best | "
               "per-round matvec / bw (median) | range |\n");
        printf("|---|---|---|---|---|---|---|---|\n");
        for (int nth = 1; nth <= 2; nth++)
            for (size_t s = 0; s < PT_ARRAY_LEN(mv); s++)
                for (size_t d = 0; d < PT_ARRAY_LEN(types); d++)
                    bench_matvec(kernels, nth, types[d], mv[s][0], mv[s][1]);
    }
    static const int64_t gm[][2] = {{2048, 2048}, {5632, 2048}, {2048, 5632}};
    static const int ns[] = {8, 16, 64, 512};
    if (do_gemm) {
        printf("\n| matrix | n | threads | f32 GFLOP/s | bf16 GFLOP/s |%s\n",
#ifdef HAVE_OPENBLAS
               " OpenBLAS sgemm GFLOP/s |"
#else
               ""
#endif
        );
        printf("|---|---|---|---|---|---|\n");
        for (int nth = 1; nth <= 2; nth++) {
            pt_err err;
            pt_backend *be = pt_backend_cpu_new(nth, kernels, &err);
#ifdef HAVE_OPENBLAS
            openblas_set_num_threads(nth);
#endif
            for (size_t s = 0; s < PT_ARRAY_LEN(gm); s++)
                for (size_t i = 0; i < PT_ARRAY_LEN(ns); i++) bench_gemm(be, gm[s][0], gm[s][1], ns[i]);
            be->ops->destroy(be);
        }
    }
    if (do_attn) {
        printf("\n| rows | context | threads | ms | K/V GB/s |\n|---|---|---|---|---|\n");
        for (int nth = 1; nth <= 2; nth++) {
            pt_err err;
            pt_backend *be = pt_backend_cpu_new(nth, kernels, &err);
            bench_attention(be, 1, 4096);
            bench_attention(be, 1, 32768);
            bench_attention(be, 512, 0);
            be->ops->destroy(be);
        }
    }
    return 0;
}
