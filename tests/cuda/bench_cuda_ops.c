/*
 * bench_cuda_ops.c - speed of the CUDA backend's decode kernels against the
 * device's measured read bandwidth, one op at a time:
 *   - matmul with bf16 weights of Llama-3.1-8B's shapes, token rows 1..16,
 *     on the GEMV kernels and on cuBLAS (GEMV_MAX=0), weight copies rotated
 *     so no run reads from L2;
 *   - attention of decode rows over a paged f16 cache at several depths,
 *     one cache per layer rotated likewise, and of a 512-row prefill chunk;
 *   - attention of one decode row over quantized caches (--kv-quant) against
 *     the f16 cache of the same run, same geometry and data;
 *   - a GPU-only consistency check: GEMV against cuBLAS on the same data;
 *   - matmul with quantized weights (q4_0, q8_0, q4_k, q6_k, affine 4/8-bit
 *     g64) of the 8B shapes, laid out as the loader leaves them (q4_0/q8_0
 *     rewritten for the split GEMV unless PETREL_CUDA_REPACK=0; "gpt-oss"
 *     rows of 2880 columns besides): the quantized GEMV (1..16 rows) and,
 *     past 16 rows, the split layout's tensor-core GEMM (qmms.cu, q4_0 and
 *     q8_0) against dequantize-to-f16 + cuBLAS (PETREL_CUDA_QGEMV_MAX=0,
 *     PETREL_CUDA_QMMS=0), at 1..512 rows (BENCH_QMM_NS=32,64: those);
 *     fractions are of the quantized bytes.
 * Writes a table to stdout and, given a path, JSON.  Not a test: timings
 * are never assertions.  Loops replay as CUDA graphs (see main).
 *
 * usage: bench_cuda_ops [out.json] [quick | kvq | qmm]   (kvq, qmm: that arm alone;
 *        BENCH_KVQ_DEPTH=D: its one depth D; BENCH_QMM_FORMATS=q4_0,q8_0:
 *        those formats, lm_head too; BENCH_QMM_GEMV_ONLY=1: no cuBLAS arm;
 *        BENCH_QMM_SHAPE=w_up: that shape alone; BENCH_QMM_NS=32,64: those
 *        token counts)
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv/kvcache.h"
#include "quant/quant.h"

/* ||got - ref|| / ||ref|| (infinite if got has a non-finite value). */
static double rel_l2(const float *got, const float *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)got[i] - ref[i];
        num += isfinite(got[i]) ? d * d : INFINITY;
        den += (double)ref[i] * ref[i];
    }
    return sqrt(num / den);
}

static pt_backend *gemv_be, *blas_be;
static FILE *js;
static int n_json;
static double bw;

static void json_row(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void json_row(const char *fmt, ...) {
    if (!js) return;
    va_list ap;
    va_start(ap, fmt);
    fprintf(js, "%s\n  ", n_json++ ? "," : "");
    vfprintf(js, fmt, ap);
    va_end(ap);
}

/* Device buffers filled from one 64 MiB pool of random bf16 values in
 * [-1, 1): generating gigabytes value by value would cost device time. */
#define POOL_BYTES ((size_t)64 << 20)
static uint16_t *pool;

static void *dev_rand_bf16(pt_backend *be, size_t n, pt_rng *rng) {
    if (!pool) {
        pool = malloc(POOL_BYTES);
        for (size_t i = 0; i < POOL_BYTES / 2; i++)
            pool[i] = pt_f32_to_bf16((float)(pt_rng_uniform(rng) * 2 - 1));
    }
    void *d = be->ops->alloc(be, 2 * n);
    if (!d) {
        fprintf(stderr, "bench: out of device memory\n");
        exit(1);
    }
    size_t off = (size_t)(pt_rng_next(rng) % 1024) * 2; /* copies differ */
    for (size_t done = 0; done < 2 * n;) {
        size_t len = PT_MIN(POOL_BYTES - off, 2 * n - done);
        be->ops->upload(be, (char *)d + done, (const char *)pool + off, len);
        done += len;
        off = 0;
    }
    return d;
}

static float *dev_rand_f32(pt_backend *be, size_t n, pt_rng *rng) {
    float *h = malloc(4 * n);
    for (size_t i = 0; i < n; i++) h[i] = (float)(pt_rng_uniform(rng) * 2 - 1);
    float *d = be->ops->alloc(be, 4 * n);
    be->ops->upload(be, d, h, 4 * n);
    free(h);
    return d;
}

/* ---- matmul ------------------------------------------------------------------ */

static void bench_matmul(const char *name, int rows, int cols, bool quick) {
    pt_rng rng;
    pt_rng_seed(&rng, (uint64_t)rows * 31 + cols);
    size_t wbytes = (size_t)rows * cols * 2;
    int copies = (int)((((size_t)1 << 30) + wbytes - 1) / wbytes); /* >= 1 GiB in rotation */
    if (copies > 64) copies = 64;
    if (copies < 2) copies = 2;
    /* one set of weights, used through both backends (same device) */
    void **w = malloc(sizeof(void *) * (size_t)copies);
    for (int i = 0; i < copies; i++) w[i] = dev_rand_bf16(gemv_be, (size_t)rows * cols, &rng);
    float *x = dev_rand_f32(gemv_be, (size_t)16 * cols, &rng);
    float *y = gemv_be->ops->alloc(gemv_be, (size_t)16 * rows * 4);
    float *y2 = gemv_be->ops->alloc(gemv_be, (size_t)16 * rows * 4);
    static const int ns[] = {1, 2, 4, 8, 16};
    for (size_t ni = 0; ni < PT_ARRAY_LEN(ns); ni++) {
        int n = ns[ni];
        double t_arm[2] = {0, 0};
        for (int arm = 0; arm < 2; arm++) {
            pt_backend *be = arm == 0 ? gemv_be : blas_be;
            if (arm == 0 && n > 8) continue;
            int iters = quick ? 2 * copies : 6 * copies;
            double best = 1e30;
            for (int rep = 0; rep < 3; rep++) {
                be->ops->sync(be);
                double t0 = pt_now();
                for (int i = 0; i < iters; i++) {
                    pt_weight wt = {.dtype = PT_BF16, .rows = rows, .cols = cols,
                                    .data = w[i % copies], .nbytes = wbytes};
                    pt_be_matmul(be, y, x, &wt, n);
                }
                be->ops->sync(be);
                double t = (pt_now() - t0) / iters;
                if (t < best) best = t;
            }
            t_arm[arm] = best;
        }
        /* consistency: GEMV vs cuBLAS on copy 0 */
        double rel = -1;
        if (n <= 8) {
            pt_weight wt = {.dtype = PT_BF16, .rows = rows, .cols = cols, .data = w[0], .nbytes = wbytes};
            pt_be_matmul(gemv_be, y, x, &wt, n);
            pt_be_matmul(blas_be, y2, x, &wt, n);
            size_t cnt = (size_t)n * rows;
            float *a = malloc(4 * cnt), *b = malloc(4 * cnt);
            gemv_be->ops->download(gemv_be, a, y, 4 * cnt);
            blas_be->ops->download(blas_be, b, y2, 4 * cnt);
            double num = 0, den = 0;
            for (size_t i = 0; i < cnt; i++) {
                double d = (double)a[i] - b[i];
                num += d * d;
                den += (double)b[i] * b[i];
            }
            rel = sqrt(num / den);
            free(a);
            free(b);
        }
        double gbs0 = t_arm[0] > 0 ? wbytes / t_arm[0] / 1e9 : 0, gbs1 = wbytes / t_arm[1] / 1e9;
        printf("matmul %-8s %6dx%-6d n=%-2d  gemv %8.1f us %7.0f GB/s %5.1f%%   cublas %8.1f us "
               "%7.0f GB/s %5.1f%%   rel(gemv,cublas) %.2g\n",
               name, rows, cols, n, t_arm[0] * 1e6, gbs0, 100 * gbs0 * 1e9 / bw, t_arm[1] * 1e6,
               gbs1, 100 * gbs1 * 1e9 / bw, rel);
        json_row("{\"op\": \"matmul\", \"name\": \"%s\", \"rows\": %d, \"cols\": %d, \"n\": %d, "
                 "\"gemv_us\": %.3f, \"cublas_us\": %.3f, \"gemv_frac\": %.4f, \"cublas_frac\": "
                 "%.4f, \"rel_gemv_cublas\": %.3g}",
                 name, rows, cols, n, t_arm[0] * 1e6, t_arm[1] * 1e6, gbs0 * 1e9 / bw,
                 gbs1 * 1e9 / bw, rel);
    }
    for (int i = 0; i < copies; i++) gemv_be->ops->free(gemv_be, w[i], wbytes);
    free(w);
    gemv_be->ops->free(gemv_be, x, 0);
    gemv_be->ops->free(gemv_be, y, 0);
    gemv_be->ops->free(gemv_be, y2, 0);
}

/* ---- matmul, quantized weights ---------------------------------------------------- */

static pt_backend *qblas_be; /* PETREL_CUDA_QGEMV_MAX=0: dequantize + cuBLAS always */

typedef struct qbench_w {
    pt_weight w;
    void *p[3];
} qbench_w;

/* Host pool of whole quantized rows: GGUF blocks of random values, or
 * random affine codes; at most ~8 MiB. */
static uint8_t *qbench_pool(const pt_weight_format *f, int rows, int cols, size_t row_bytes,
                            int *pool_rows, pt_rng *rng) {
    *pool_rows = (int)PT_MIN((size_t)rows, (((size_t)8 << 20) / row_bytes) + 1);
    uint8_t *h = malloc(row_bytes * (size_t)*pool_rows);
    if (f->dtype == PT_AFFINE) {
        for (size_t i = 0; i < row_bytes * (size_t)*pool_rows; i++) h[i] = (uint8_t)pt_rng_next(rng);
    } else {
        float *x = malloc(sizeof(float) * cols);
        for (int r = 0; r < *pool_rows; r++) {
            for (int k = 0; k < cols; k++) x[k] = (float)(pt_rng_uniform(rng) * 2 - 1);
            pt_gguf_quantize(f->dtype, x, h + (size_t)r * row_bytes, cols);
        }
        free(x);
    }
    return h;
}

/* A quantized matrix on the device, its rows taken from the pool starting
 * at a random row (copies differ), affine scales random and small. */
static qbench_w qbench_make(const pt_weight_format *f, int rows, int cols, const uint8_t *h,
                            int pool_rows, pt_rng *rng) {
    qbench_w q;
    memset(&q, 0, sizeof q);
    q.w = (pt_weight){.dtype = f->dtype, .rows = rows, .cols = cols, .bits = f->bits,
                      .group_size = f->group_size, .scale_dtype = PT_F16};
    size_t nb[3] = {0, 0, 0};
    if (f->dtype == PT_AFFINE) {
        nb[0] = pt_affine_code_bytes(rows, cols, f->bits);
        nb[1] = nb[2] = pt_affine_scale_bytes(rows, cols, f->group_size, PT_F16);
    } else {
        nb[0] = pt_dtype_bytes(f->dtype, (uint64_t)rows * cols);
    }
    size_t row_bytes = nb[0] / rows;
    pt_backend *be = gemv_be;
    for (int i = 0; i < 3; i++) {
        if (!nb[i]) continue;
        q.p[i] = be->ops->alloc(be, nb[i]);
        if (!q.p[i]) {
            fprintf(stderr, "bench: out of device memory\n");
            exit(1);
        }
    }
    /* the pool in runs of whole rows, starting at a random row */
    size_t off = (size_t)(pt_rng_next(rng) % (uint64_t)pool_rows);
    for (size_t r = 0; r < (size_t)rows;) {
        size_t src = (r + off) % (size_t)pool_rows, len = PT_MIN((size_t)pool_rows - src, (size_t)rows - r);
        be->ops->upload(be, (uint8_t *)q.p[0] + r * row_bytes, h + src * row_bytes, len * row_bytes);
        r += len;
    }
    if (f->dtype == PT_AFFINE) {
        size_t ns = nb[1] / 2;
        uint16_t *s = malloc(nb[1]);
        for (int k = 1; k <= 2; k++) {
            for (size_t i = 0; i < ns; i++)
                s[i] = pt_f32_to_f16((float)((pt_rng_uniform(rng) * 2 - 1) * (k == 1 ? 0.01 : 0.1)));
            be->ops->upload(be, q.p[k], s, nb[1]);
        }
        free(s);
    }
    q.w.data = q.p[0], q.w.scales = q.p[1], q.w.biases = q.p[2];
    q.w.nbytes = nb[0] + nb[1] + nb[2];
    pt_be_repack_weight(be, &q.w); /* as the loader does (PETREL_CUDA_REPACK=0: not) */
    return q;
}

static void bench_qmatmul(const char *fname, const char *name, int rows, int cols, bool quick) {
    const char *shape = getenv("BENCH_QMM_SHAPE"); /* one shape by name (profiling) */
    if (shape && strcmp(shape, name) != 0) return;
    pt_weight_format f;
    if (pt_weight_format_parse(fname, &f)) return;
    pt_rng rng;
    pt_rng_seed(&rng, (uint64_t)rows * 37 + cols);
    int pool_rows;
    size_t row_bytes = f.dtype == PT_AFFINE ? pt_affine_code_bytes(1, cols, f.bits)
                                            : pt_dtype_bytes(f.dtype, (uint64_t)cols);
    uint8_t *pool_h = qbench_pool(&f, rows, cols, row_bytes, &pool_rows, &rng);
    qbench_w first = qbench_make(&f, rows, cols, pool_h, pool_rows, &rng);
    size_t wbytes = first.w.nbytes;
    int copies = (int)((((size_t)1 << 30) + wbytes - 1) / wbytes);
    if (copies > 64) copies = 64;
    if (copies < 2) copies = 2;
    qbench_w *w = malloc(sizeof(qbench_w) * (size_t)copies);
    w[0] = first;
    for (int i = 1; i < copies; i++) w[i] = qbench_make(&f, rows, cols, pool_h, pool_rows, &rng);
    free(pool_h);
    /* BENCH_QMM_NS=32,64,128: those token counts (default below) */
    int ns[16] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512}, n_ns = 10, nmax = 0;
    if (getenv("BENCH_QMM_NS")) {
        n_ns = 0;
        for (const char *p = getenv("BENCH_QMM_NS"); *p && n_ns < 16;) {
            char *end;
            long v = strtol(p, &end, 10);
            if (end == p) break;
            if (v > 0) ns[n_ns++] = (int)v;
            p = *end == ',' ? end + 1 : end;
        }
    }
    for (int i = 0; i < n_ns; i++)
        nmax = ns[i] > nmax ? ns[i] : nmax;
    float *x = dev_rand_f32(gemv_be, (size_t)nmax * cols, &rng);
    float *y = gemv_be->ops->alloc(gemv_be, (size_t)nmax * rows * 4);
    float *y2 = gemv_be->ops->alloc(gemv_be, (size_t)nmax * rows * 4);
    const bool gemv_only = getenv("BENCH_QMM_GEMV_ONLY") != NULL;
    /* arm 0 past 16 rows: the tensor-core GEMM on the split layout (q4_0,
     * q8_0; qmms.cu) where it takes the weight, else the cuBLAS path again */
    const bool mms =
        (f.dtype == PT_Q4_0 || f.dtype == PT_Q8_0) && first.w.layout == PT_LAYOUT_ROWSPLIT;
    for (int ni = 0; ni < n_ns; ni++) {
        int n = ns[ni];
        double t_arm[2] = {0, 0};
        for (int arm = 0; arm < 2; arm++) {
            pt_backend *be = arm == 0 ? gemv_be : qblas_be;
            if (arm == 0 && n > 16 && !mms) continue;
            if (arm == 1 && gemv_only) continue;
            if (quick && n == 2) continue;
            int iters = n >= 64 ? copies : quick ? 2 * copies : 4 * copies;
            if ((double)n * rows * cols > 1e11)
                iters = iters < 4 ? iters : 4; /* prefill of big shapes */
            double best = 1e30;
            for (int rep = 0; rep < 3; rep++) {
                be->ops->sync(be);
                double t0 = pt_now();
                for (int i = 0; i < iters; i++) pt_be_matmul(be, y, x, &w[i % copies].w, n);
                be->ops->sync(be);
                double t = (pt_now() - t0) / iters;
                if (t < best) best = t;
            }
            t_arm[arm] = best;
        }
        double rel = -1;
        if (t_arm[0] > 0 && t_arm[1] > 0 && (size_t)n * rows <= ((size_t)64 << 20)) {
            pt_be_matmul(gemv_be, y, x, &w[0].w, n);
            pt_be_matmul(qblas_be, y2, x, &w[0].w, n);
            size_t cnt = (size_t)n * rows;
            float *a = malloc(4 * cnt), *b = malloc(4 * cnt);
            gemv_be->ops->download(gemv_be, a, y, 4 * cnt);
            qblas_be->ops->download(qblas_be, b, y2, 4 * cnt);
            rel = rel_l2(a, b, cnt);
            free(a);
            free(b);
        }
        if (t_arm[1] <= 0 && t_arm[0] <= 0) continue;
        if (t_arm[1] <= 0) t_arm[1] = INFINITY; /* BENCH_QMM_GEMV_ONLY */
        double g0 = t_arm[0] > 0 ? wbytes / t_arm[0] : 0, g1 = wbytes / t_arm[1];
        double tf = 2.0 * rows * cols * n / t_arm[1] / 1e12;
        double tf0 = t_arm[0] > 0 ? 2.0 * rows * cols * n / t_arm[0] / 1e12 : 0;
        printf("qmatmul %-10s %-8s %6dx%-6d n=%-4d %s %8.1f us %5.1f%% %6.1f TFLOP/s   "
               "dequant+cublas %9.1f us %5.1f%% %6.1f TFLOP/s   x%.2f  rel %.2g\n",
               fname, name, rows, cols, n, n <= 16 ? "qgemv" : "qmms ", t_arm[0] * 1e6,
               100 * g0 / bw, tf0, t_arm[1] * 1e6, 100 * g1 / bw, tf,
               t_arm[0] > 0 ? t_arm[1] / t_arm[0] : 0, rel);
        json_row("{\"op\": \"qmatmul\", \"format\": \"%s\", \"name\": \"%s\", \"rows\": %d, "
                 "\"cols\": %d, \"n\": %d, \"bytes\": %zu, \"qgemv_us\": %.3f, \"blas_us\": %.3f, "
                 "\"qgemv_frac\": %.4f, \"blas_frac\": %.4f, \"blas_tflops\": %.2f, \"rel\": %.3g}",
                 fname, name, rows, cols, n, wbytes, t_arm[0] * 1e6, t_arm[1] * 1e6, g0 / bw,
                 g1 / bw, tf, rel);
    }
    for (int i = 0; i < copies; i++)
        for (int k = 0; k < 3; k++)
            if (w[i].p[k]) gemv_be->ops->free(gemv_be, w[i].p[k], 0);
    free(w);
    gemv_be->ops->free(gemv_be, x, 0);
    gemv_be->ops->free(gemv_be, y, 0);
    gemv_be->ops->free(gemv_be, y2, 0);
}

/* ---- attention --------------------------------------------------------------------- */

/* n_rows query rows at depth `depth` each (n_seqs sequences; prefill when
 * n_seqs == 1 and n_rows > 1: positions depth-n_rows+1..depth), f16 cache
 * with 8 KV heads of 128, 32 query heads, `layers` caches rotated. */
static pt_backend *simple_be;

static void bench_attention(pt_backend *be, const char *arm, int depth, int n_rows, int n_seqs,
                            int layers) {
    const int n_kv = 8, hd = 128, n_heads = 32, ps = 16;
    int pages_per_seq = (depth + 1 + ps - 1) / ps;
    int n_pages = pages_per_seq * n_seqs;
    size_t cache_bytes = (size_t)n_pages * ps * n_kv * hd * 2;
    pt_rng rng;
    pt_rng_seed(&rng, 77);
    void **k = malloc(sizeof(void *) * (size_t)layers), **v = malloc(sizeof(void *) * (size_t)layers);
    for (int l = 0; l < layers; l++) {
        k[l] = dev_rand_bf16(be, cache_bytes / 2, &rng); /* bf16 bits read as f16: finite, |x|<1 */
        v[l] = dev_rand_bf16(be, cache_bytes / 2, &rng);
    }
    int32_t *bt = malloc(sizeof(int32_t) * (size_t)n_pages);
    for (int i = 0; i < n_pages; i++) bt[i] = i;
    int32_t pos[512], seq[512];
    for (int i = 0; i < n_rows; i++) {
        seq[i] = n_seqs == 1 ? 0 : i % n_seqs;
        pos[i] = n_seqs == 1 ? depth - (n_rows - 1 - i) : depth;
    }
    int32_t *d_bt = be->ops->alloc(be, 4 * (size_t)n_pages), *d_pos = be->ops->alloc(be, 4 * 512),
            *d_seq = be->ops->alloc(be, 4 * 512);
    be->ops->upload(be, d_bt, bt, 4 * (size_t)n_pages);
    be->ops->upload(be, d_pos, pos, 4 * (size_t)n_rows);
    be->ops->upload(be, d_seq, seq, 4 * (size_t)n_rows);
    float *q = dev_rand_f32(be, (size_t)n_rows * n_heads * hd, &rng);
    float *out = be->ops->alloc(be, (size_t)n_rows * n_heads * hd * 4);
    pt_batch_view b = {.n_tokens = n_rows, .pos = d_pos, .seq = d_seq, .block_table = d_bt, .max_pages = pages_per_seq, .n_seqs = n_seqs};
    int iters = n_rows > 64 ? 8 : 64;
    double best = 1e30;
    for (int rep = 0; rep < 3; rep++) {
        be->ops->sync(be);
        double t0 = pt_now();
        for (int i = 0; i < iters; i++) {
            pt_kv_view kv = {.k = k[i % layers], .v = v[i % layers], .dtype = PT_F16,
                             .page_size = ps, .n_kv_heads = n_kv, .head_dim = hd};
            pt_be_attention(be, out, q, &kv, &b, n_heads, 0.088f);
        }
        be->ops->sync(be);
        double t = (pt_now() - t0) / iters;
        if (t < best) best = t;
    }
    /* cross-check against the simple kernel on layer 0 */
    double rel = -1;
    if (be != simple_be) {
        size_t cnt = (size_t)n_rows * n_heads * hd;
        float *out2 = simple_be->ops->alloc(simple_be, cnt * 4);
        pt_kv_view kv = {.k = k[0], .v = v[0], .dtype = PT_F16, .page_size = ps,
                         .n_kv_heads = n_kv, .head_dim = hd};
        pt_be_attention(be, out, q, &kv, &b, n_heads, 0.088f);
        be->ops->sync(be);
        pt_be_attention(simple_be, out2, q, &kv, &b, n_heads, 0.088f);
        float *h1 = malloc(cnt * 4), *h2 = malloc(cnt * 4);
        be->ops->download(be, h1, out, cnt * 4);
        simple_be->ops->download(simple_be, h2, out2, cnt * 4);
        rel = rel_l2(h1, h2, cnt);
        free(h1), free(h2);
        simple_be->ops->free(simple_be, out2, cnt * 4);
    }
    /* bytes: each sequence's K and V up to the deepest row, once */
    double bytes = (double)n_seqs * (depth + 1) * n_kv * hd * 2 * 2;
    double flops = 0;
    for (int i = 0; i < n_rows; i++) flops += 4.0 * (pos[i] + 1) * n_heads * hd;
    printf("attention %-6s depth %6d rows %3d seqs %2d: %9.1f us  %7.0f GB/s %5.1f%%  %7.2f TFLOP/s"
           "  rel(simple) %.2g\n",
           arm, depth, n_rows, n_seqs, best * 1e6, bytes / best / 1e9, 100 * bytes / best / bw,
           flops / best / 1e12, rel);
    json_row("{\"op\": \"attention\", \"arm\": \"%s\", \"depth\": %d, \"rows\": %d, \"seqs\": %d, "
             "\"us\": %.3f, \"frac\": %.4f, \"tflops\": %.3f, \"rel_simple\": %.3g}",
             arm, depth, n_rows, n_seqs, best * 1e6, bytes / best / bw, flops / best / 1e12, rel);
    for (int l = 0; l < layers; l++) {
        be->ops->free(be, k[l], cache_bytes);
        be->ops->free(be, v[l], cache_bytes);
    }
    free(k), free(v), free(bt);
    be->ops->free(be, d_bt, 0), be->ops->free(be, d_pos, 0), be->ops->free(be, d_seq, 0);
    be->ops->free(be, q, 0), be->ops->free(be, out, 0);
}

/* ---- attention over quantized pages ------------------------------------------------ */

/* One decode row at `depth` (positions 0..depth) over a cache of each
 * format, Llama-3.1-8B's geometry (32 query heads, 8 kv heads of 128), the
 * pages filled by the backend's own kv_store, KVQ_CHUNK rows a call, from
 * one device pool of random rows (chunks read it at different offsets, and
 * layer 0 holds the same rows in every format, which gives rel_vs_f16: how
 * far the format's output is from the f16 cache's).  Each format rotates
 * through enough layers for ~512 MiB so that no call reads from L2.  Time
 * per call: the median over KVQ_REPS replays of a graph of >= 64 calls
 * (the backend's stream is private, so no events: wall time around sync,
 * whose ~10 us spread over the calls costs well under 1%). */
#define KVQ_CHUNK 4096
#define KVQ_POOL_ROWS (KVQ_CHUNK + 512)
#define KVQ_REPS 9

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void bench_kvq_attention(pt_backend *be, int depth) {
    static const char *const formats[] = {"none", "turbo", "turbo:k8v8", "8", "4"};
    const int n_kv = 8, hd = 128, n_heads = 32, ps = 16, n_pos = depth + 1;
    const int n_pages = (n_pos + ps - 1) / ps;
    const size_t w = (size_t)n_kv * hd, qn = (size_t)n_heads * hd;
    pt_rng rng;
    pt_rng_seed(&rng, 4242);
    float *pool_k = dev_rand_f32(be, KVQ_POOL_ROWS * w, &rng);
    float *pool_v = dev_rand_f32(be, KVQ_POOL_ROWS * w, &rng);
    float *q = dev_rand_f32(be, qn, &rng), *out = be->ops->alloc(be, 4 * qn);
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)n_pos), *bt = malloc(sizeof(int32_t) * n_pages);
    for (int i = 0; i < n_pos; i++) pos[i] = i;
    for (int i = 0; i < n_pages; i++) bt[i] = i;
    int32_t *d_pos = be->ops->alloc(be, 4 * (size_t)n_pos), *d_bt = be->ops->alloc(be, 4 * (size_t)n_pages);
    int32_t *d_seq = be->ops->alloc(be, 4 * KVQ_CHUNK); /* zeros: sequence 0 */
    be->ops->upload(be, d_pos, pos, 4 * (size_t)n_pos);
    be->ops->upload(be, d_bt, bt, 4 * (size_t)n_pages);
    float *ref = malloc(4 * qn), *got = malloc(4 * qn);
    double t_f16 = 0;
    for (size_t f = 0; f < PT_ARRAY_LEN(formats); f++) {
        pt_err err = {{0}};
        pt_kv_config cfg = {.n_layers = 1, .n_kv_heads = n_kv, .head_dim = hd, .page_size = ps,
                            .n_pages = n_pages, .dtype = PT_F16};
        char name[32];
        if (pt_kvq_parse(formats[f], &cfg.quant, &err)) {
            printf("attention kv %s: %s\n", formats[f], err.msg);
            continue;
        }
        pt_kv_format_name(&cfg, name, sizeof name);
        double bytes = (double)pt_kv_bytes_per_token(&cfg) * n_pos; /* K + V, codes and scales */
        int layers = (int)ceil((double)(512 << 20) / bytes);
        cfg.n_layers = layers < 2 ? 2 : layers > 128 ? 128 : layers;
        pt_kv_cache kv;
        if (pt_kv_cache_init(&kv, be, &cfg, &err)) {
            printf("attention kv %-10s depth %6d: skipped: %s\n", name, depth, err.msg);
            continue;
        }
        pt_kv_seq seq = {0};
        if (pt_kv_seq_reserve(&kv, &seq, n_pos, &err)) {
            fprintf(stderr, "bench: %s\n", err.msg);
            exit(1);
        }
        for (int l = 0; l < cfg.n_layers; l++) {
            pt_kv_view view = pt_kv_layer(&kv, l);
            for (int c0 = 0; c0 < n_pos; c0 += KVQ_CHUNK) {
                size_t off = (size_t)((c0 / KVQ_CHUNK) * 131 + l * 37) % 512 * w;
                pt_batch_view b = {.n_tokens = PT_MIN(KVQ_CHUNK, n_pos - c0), .pos = d_pos + c0, .seq = d_seq,
                                   .block_table = d_bt, .max_pages = n_pages, .n_seqs = 1};
                pt_be_kv_store(be, &view, &b, pool_k + off, pool_v + off);
            }
        }
        be->ops->sync(be);
        /* iters: every layer equally often, the same calls every replay */
        int iters = cfg.n_layers * ((64 + cfg.n_layers - 1) / cfg.n_layers);
        pt_batch_view b = {.n_tokens = 1, .pos = d_pos + depth, .seq = d_seq, .block_table = d_bt, .max_pages = n_pages, .n_seqs = 1};
        double t[KVQ_REPS];
        for (int rep = -1; rep < KVQ_REPS; rep++) { /* rep -1 captures the graph */
            be->ops->sync(be);
            double t0 = pt_now();
            for (int i = 0; i < iters; i++) {
                pt_kv_view view = pt_kv_layer(&kv, i % cfg.n_layers);
                pt_be_attention(be, out, q, &view, &b, n_heads, 1.0f / sqrtf((float)hd));
            }
            be->ops->sync(be);
            if (rep >= 0) t[rep] = (pt_now() - t0) / iters;
        }
        qsort(t, KVQ_REPS, sizeof t[0], cmp_double);
        double us = t[KVQ_REPS / 2] * 1e6;
        /* layer 0 once more, for the distance from the f16 cache's output */
        pt_kv_view view0 = pt_kv_layer(&kv, 0);
        pt_be_attention(be, out, q, &view0, &b, n_heads, 1.0f / sqrtf((float)hd));
        be->ops->download(be, f == 0 ? ref : got, out, 4 * qn);
        double rel = 0;
        if (f == 0) {
            t_f16 = us;
        } else {
            rel = rel_l2(got, ref, qn);
        }
        double speedup = t_f16 > 0 ? t_f16 / us : 0, flops = 4.0 * n_pos * n_heads * hd;
        printf("attention kv %-10s depth %6d: %9.1f us  %8.2f MB  %7.0f GB/s %5.1f%%  x%.2f vs f16"
               "  rel(f16) %.3g  (%d layers)\n",
               name, depth, us, bytes / 1e6, bytes / us / 1e3, 100 * bytes / (us * 1e-6) / bw,
               speedup, rel, cfg.n_layers);
        json_row("{\"op\": \"attention\", \"arm\": \"kv:%s\", \"format\": \"%s\", \"depth\": %d, "
                 "\"rows\": 1, \"seqs\": 1, \"us\": %.3f, \"bytes\": %.0f, \"frac\": %.4f, "
                 "\"tflops\": %.3f, \"speedup_vs_f16\": %.3f, \"rel_vs_f16\": %.3g}",
                 name, name, depth, us, bytes, bytes / (us * 1e-6) / bw, flops / us / 1e6, speedup,
                 rel);
        pt_kv_seq_release(&kv, &seq);
        pt_kv_cache_free(&kv);
    }
    free(pos), free(bt), free(ref), free(got);
    be->ops->free(be, d_pos, 0), be->ops->free(be, d_bt, 0), be->ops->free(be, d_seq, 0);
    be->ops->free(be, pool_k, 0), be->ops->free(be, pool_v, 0);
    be->ops->free(be, q, 0), be->ops->free(be, out, 0);
}

int main(int argc, char **argv) {
    bool quick = argc > 2 && strcmp(argv[2], "quick") == 0;
    bool kvq_only = argc > 2 && strcmp(argv[2], "kvq") == 0;
    bool qmm_only = argc > 2 && strcmp(argv[2], "qmm") == 0;
    pt_err err = {{0}};
    /* Each timed loop records the same ops every repetition, so the
     * backend replays it as a CUDA graph (with PDL between kernels): the
     * best of 3 repetitions is GPU time, as in a decode step, not the
     * host's launch rate.  GEMV arm up to 16 rows (the default). */
    setenv("PETREL_CUDA_GEMV_MAX", "16", 1);
    setenv("PETREL_CUDA_QGEMV_MAX", "16", 1);
    /* the split layout's tensor-core GEMM at every row count past 16 (the
     * qmm arm compares it with dequantize + cuBLAS; PETREL_CUDA_QMMS=0: the
     * latter twice) */
    setenv("PETREL_CUDA_QMMS_MAX", "1048576", 0);
    gemv_be = pt_backend_cuda_new(0, &err);
    unsetenv("PETREL_CUDA_QGEMV_MAX");
    if (!gemv_be) {
        printf("bench_cuda_ops: skipped: %s\n", err.msg);
        return 77;
    }
    setenv("PETREL_CUDA_GEMV_MAX", "0", 1);
    blas_be = pt_backend_cuda_new(0, &err);
    setenv("PETREL_CUDA_QGEMV_MAX", "0", 1);
    setenv("PETREL_CUDA_QMMS", "0", 1);
    qblas_be = pt_backend_cuda_new(0, &err);
    unsetenv("PETREL_CUDA_QGEMV_MAX");
    unsetenv("PETREL_CUDA_QMMS");
    setenv("PETREL_CUDA_ATTN", "simple", 1);
    simple_be = pt_backend_cuda_new(0, &err);
    setenv("PETREL_CUDA_ATTN", "tiled", 1);
    pt_backend *tiled_be = pt_backend_cuda_new(0, &err);
    if (argc > 1 && !(js = fopen(argv[1], "w"))) {
        perror(argv[1]);
        return 1;
    }
    bw = gemv_be->ops->read_bandwidth(gemv_be);
    printf("device: %s\nread bandwidth: %.1f GB/s\n", gemv_be->detail, bw / 1e9);
    if (js) fprintf(js, "{\"device\": \"%s\", \"read_bandwidth_gbs\": %.3f, \"results\": [", gemv_be->detail, bw / 1e9);

    static const int depths[] = {1024, 8192, 32768};
    if (!kvq_only) {
        static const char *const qf[] = {"q4_0", "q8_0", "q4_k", "q6_k", "affine4g64", "affine8g64"};
        /* BENCH_QMM_FORMATS=q4_0,q8_0: those formats alone (with lm_head) */
        const char *only = getenv("BENCH_QMM_FORMATS");
        for (size_t i = 0; i < PT_ARRAY_LEN(qf); i++) {
            if (only && !strstr(only, qf[i])) continue;
            bench_qmatmul(qf[i], "wq", 4096, 4096, quick);
            if (i < 2 || !quick) {
                bench_qmatmul(qf[i], "wk", 1024, 4096, quick);
                bench_qmatmul(qf[i], "w_up", 14336, 4096, quick);
                bench_qmatmul(qf[i], "w_down", 4096, 14336, quick);
            }
            if (only) bench_qmatmul(qf[i], "lm_head", 128256, 4096, quick);
            if (only) bench_qmatmul(qf[i], "oss_q", 4096, 2880, quick); /* gpt-oss's dense rows */
        }
    }
    if (!kvq_only && !qmm_only) {
        bench_matmul("wq", 4096, 4096, quick);
        bench_matmul("wk", 1024, 4096, quick);
        bench_matmul("w_up", 14336, 4096, quick);
        bench_matmul("w_down", 4096, 14336, quick);
        bench_matmul("lm_head", 128256, 4096, quick);
        bench_matmul("1b_wq", 2048, 2048, quick);
        bench_matmul("1b_wk", 256, 2048, quick);

        for (size_t i = 0; i < PT_ARRAY_LEN(depths); i++) {
            bench_attention(gemv_be, "tiled", depths[i], 1, 1, depths[i] > 8192 ? 8 : 32);
            if (!quick) bench_attention(simple_be, "simple", depths[i], 1, 1, depths[i] > 8192 ? 8 : 32);
            bench_attention(gemv_be, "tiled", depths[i], 8, 8, 4);
        }
        bench_attention(gemv_be, "mma", 4095, 512, 1, 2);
        bench_attention(tiled_be, "tiled", 4095, 512, 1, 2);
        bench_attention(gemv_be, "mma", 511, 512, 1, 8);
        bench_attention(gemv_be, "mma", 16383, 512, 1, 1);
        if (!quick) bench_attention(simple_be, "simple", 4095, 512, 1, 2);
    }
    /* BENCH_KVQ_DEPTH=D: that depth alone (for a profiler run) */
    const char *only = getenv("BENCH_KVQ_DEPTH");
    if (qmm_only) {
    } else if (only && atoi(only) > 0) bench_kvq_attention(gemv_be, atoi(only));
    else
        for (size_t i = 0; i < PT_ARRAY_LEN(depths); i++) bench_kvq_attention(gemv_be, depths[i]);
    if (js) {
        fprintf(js, "\n]}\n");
        fclose(js);
    }
    simple_be->ops->destroy(simple_be);
    tiled_be->ops->destroy(tiled_be);
    blas_be->ops->destroy(blas_be);
    qblas_be->ops->destroy(qblas_be);
    gemv_be->ops->destroy(gemv_be);
    return 0;
}
