/*
 * cpu_matmul.c - y = x · Wᵀ for any weight dtype, and the embedding lookup.
 *
 * Three regimes, picked by the number of token rows n:
 *   n = 1 (decode)        memory-bound: threads take disjoint row ranges and
 *                         each weight byte is streamed exactly once;
 *   n <= wops.small_max   (10-20) rows are walked in L2-sized chunks and
 *                         every chunk serves all n tokens before the next is
 *                         read, so W crosses memory once and is never
 *                         converted to f32 in memory;
 *   larger n (prefill)    compute-bound: a packed GEMM.  Per block of NB
 *                         tokens, x is packed once into k-major tiles of
 *                         PT_CPU_MR tokens; weight rows go in chunks of RC
 *                         (the chunk's y block stays in L2), and for each
 *                         block of KB columns, a panel of rows (16, or 32 for
 *                         the avx512 set) is converted
 *                         to f32 into a k-major panel that stays in L1 while
 *                         the register tiles sweep the token tiles.  Weight
 *                         conversion is paid once per NB tokens; each y
 *                         element sums its column blocks in order, whatever
 *                         the chunking.
 * Quantized formats (MLX affine, GGUF blocks) go to their own driver,
 * quant_kernels.h, on the same pool.
 *
 * Work is split by weight rows, so threads never write the same y element
 * and never read the same weight bytes; when there are fewer row panels than
 * threads (small projections at large n) the tokens are split instead.
 */
#include "backend/cpu/cpu_backend.h"

/* Packed GEMM blocking: columns per panel (a multiple of every quantized
 * block size) and tokens per pass over the weights (a multiple of MR). */
#define KB 256
#define NB 192
/* Weight rows per chunk: a chunk's y block (NB x RC floats) stays in L2. */
#define RC 128
/* Target bytes of weights per chunk of the small-batch path (fits L2). */
#define SMALL_CHUNK_BYTES (256 * 1024)

typedef struct matmul_job {
    const pt_cpu_kernels *k;
    const pt_cpu_wops *wo;
    pt_dtype dt;
    float *y;
    const float *x;
    const char *w;
    size_t row_bytes;
    int64_t rows, cols;
    int n;
    bool split_tokens; /* packed path: split tokens instead of rows */
    float *const *scratch;
    int64_t t0, t1; /* packed path: the token block in xp */
    float *xp;
} matmul_job;

static void matvec_task(void *ctx, int ith, int nth) {
    const matmul_job *j = ctx;
    int64_t r0, r1;
    /* 16 rows = one cache line of y, so no two threads share a line. */
    pt_cpu_split(j->rows, ith, nth, 16, &r0, &r1);
    if (r1 > r0) j->wo->matvec(j->y + r0, j->w + r0 * j->row_bytes, j->row_bytes, r1 - r0, j->x, j->cols);
}

static void small_task(void *ctx, int ith, int nth) {
    const matmul_job *j = ctx;
    int64_t r0, r1;
    pt_cpu_split(j->rows, ith, nth, 16, &r0, &r1);
    int64_t chunk = PT_MAX(4, (int64_t)(SMALL_CHUNK_BYTES / j->row_bytes));
    for (int64_t r = r0; r < r1; r += chunk) {
        int64_t nr = PT_MIN(chunk, r1 - r);
        for (int t = 0; t < j->n; t += PT_CPU_SMALL_NT) {
            int nt = PT_MIN(PT_CPU_SMALL_NT, j->n - t);
            j->wo->matmul_small(j->y + t * j->rows + r, j->rows, j->w + r * j->row_bytes,
                                j->row_bytes, nr, j->x + t * j->cols, j->cols, nt, j->cols);
        }
    }
}

/* Asks for the weights of the panel after this one (rows [r, r + NR) at
 * the same columns) while this panel's tiles run: a panel gathers 16 rows
 * kilobytes apart, which the hardware prefetcher does not follow, and its
 * conversion stalled on DRAM (perf, f16 TinyLlama pp128 on one thread:
 * 10.6% of samples in f16_to_f32 against 36.8% in gemm_tile). */
static void prefetch_panel(const matmul_job *j, int64_t r, int64_t r1, size_t koff, int kb) {
    size_t bytes = pt_dtype_bytes(j->dt, (uint64_t)kb);
    for (int64_t i = r; i < PT_MIN(r1, r + j->k->nr); i++)
        for (size_t off = 0; off < bytes; off += 64) __builtin_prefetch(j->w + i * j->row_bytes + koff + off);
}

/* Copies x's tokens [t0, t1) into MR-token tiles over all columns, k-major:
 * tile i holds xp[i*cols*MR + k*MR + t] = x[(t0 + i*MR + t)*cols + k], zero
 * past t1.  Packed once per token block and read by every panel of every
 * thread: rows of x (and of y) lie a power of two apart and fell into the
 * same L1 sets as each other and the panel. */
static void pack_x(float *xp, const float *x, int64_t cols, int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; t += PT_CPU_MR) {
        int nt = (int)PT_MIN(PT_CPU_MR, t1 - t);
        for (int tt = 0; tt < PT_CPU_MR; tt++) {
            const float *src = x + (t + tt) * cols;
            for (int64_t k = 0; k < cols; k++) xp[k * PT_CPU_MR + tt] = tt < nt ? src[k] : 0.0f;
        }
        xp += (size_t)cols * PT_CPU_MR;
    }
}

static void pack_x_task(void *ctx, int ith, int nth) {
    const matmul_job *j = ctx;
    int64_t lo, hi;
    pt_cpu_split(j->t1 - j->t0, ith, nth, PT_CPU_MR, &lo, &hi);
    if (hi > lo) pack_x(j->xp + lo * j->cols, j->x, j->cols, j->t0 + lo, j->t0 + hi);
}

/* Packed GEMM over rows [r0, r1) and tokens [t0, t1) of the current token
 * block (xp holds its tiles).  Rows go in chunks of RC so the chunk's y
 * block stays in L2 while every column block adds into it; each panel is
 * still converted exactly once. */
static void gemm_range(const matmul_job *j, float *scratch, int64_t r0, int64_t r1, int64_t t0,
                       int64_t t1) {
    const int NR = j->k->nr; /* rows per panel: 16, or 32 (avx512) */
    float *panel = scratch, *tmp = panel + NR * KB;
    for (int64_t rc = r0; rc < r1; rc += RC) {
        int64_t rc_end = PT_MIN(r1, rc + RC);
        for (int64_t k0 = 0; k0 < j->cols; k0 += KB) {
            int kb = (int)PT_MIN(KB, j->cols - k0);
            size_t koff = pt_dtype_bytes(j->dt, (uint64_t)k0);
            for (int64_t r = rc; r < rc_end; r += NR) {
                int nr = (int)PT_MIN(NR, rc_end - r);
                j->k->pack_panel(panel, j->wo, j->w + r * j->row_bytes + koff, j->row_bytes, nr, kb,
                                 tmp);
                if (r + NR < rc_end) /* the next panel: next rows, next column block, next chunk */
                    prefetch_panel(j, r + NR, rc_end, koff, kb);
                else if (k0 + KB < j->cols)
                    prefetch_panel(j, rc, rc_end, pt_dtype_bytes(j->dt, (uint64_t)(k0 + KB)),
                                   (int)PT_MIN(KB, j->cols - k0 - KB));
                else
                    prefetch_panel(j, rc_end, r1, 0, (int)PT_MIN(KB, j->cols));
                const float *xt = j->xp + (t0 - j->t0) * j->cols + k0 * PT_CPU_MR;
                for (int64_t t = t0; t < t1; t += PT_CPU_MR, xt += (size_t)j->cols * PT_CPU_MR) {
                    int nt = (int)PT_MIN(PT_CPU_MR, t1 - t);
                    j->k->gemm_tile(j->y + t * j->rows + r, j->rows, xt, panel, kb, nt, nr, k0 > 0);
                }
            }
        }
    }
}

static void gemm_task(void *ctx, int ith, int nth) {
    const matmul_job *j = ctx;
    int64_t lo, hi;
    if (j->split_tokens) {
        pt_cpu_split(j->t1 - j->t0, ith, nth, PT_CPU_MR, &lo, &hi);
        if (hi > lo) gemm_range(j, j->scratch[ith], 0, j->rows, j->t0 + lo, j->t0 + hi);
    } else {
        pt_cpu_split(j->rows, ith, nth, j->k->nr, &lo, &hi);
        if (hi > lo) gemm_range(j, j->scratch[ith], lo, hi, j->t0, j->t1);
    }
}

void pt_cpu_matmul(pt_backend *be, float *y, const float *x, const pt_weight *w, int n) {
    pt_cpu_backend *cb = pt_cpu(be);
    if (n <= 0 || w->rows <= 0) return;
    if (pt_qk_handles(w->dtype)) { /* quantized: its own driver, same pool */
        pt_qk_matmul(&cb->quant, be->n_threads > 1 ? cb->pool : NULL, y, x, w, n);
        return;
    }
    matmul_job j = {
        .k = cb->k,
        .wo = pt_cpu_wops_for(cb, w->dtype, "matmul"),
        .dt = w->dtype,
        .y = y,
        .x = x,
        .w = w->data,
        .row_bytes = pt_dtype_bytes(w->dtype, (uint64_t)w->cols),
        .rows = w->rows,
        .cols = w->cols,
        .n = n,
    };
    if (j.row_bytes == 0) pt_cpu_die("matmul: bad weight shape %lldx%lld %s", (long long)w->rows,
                                     (long long)w->cols, pt_dtype_name(w->dtype));
    double work = (double)w->rows * (double)w->cols * n;
    if (n == 1) {
        pt_cpu_run(cb, matvec_task, &j, work);
    } else if (n <= j.wo->small_max) {
        pt_cpu_run(cb, small_task, &j, work);
    } else {
        int64_t panels = (w->rows + cb->k->nr - 1) / cb->k->nr;
        j.split_tokens = panels < 2 * be->n_threads && n >= 2 * PT_CPU_MR * be->n_threads;
        if (pt_cpu_scratch_reserve(cb, 2 * (size_t)cb->k->nr * KB, "matmul")) return;
        j.scratch = cb->scratch;
        size_t tiles = (size_t)(PT_MIN(n, NB) + PT_CPU_MR - 1) / PT_CPU_MR;
        j.xp = pt_cpu_grow(&cb->xpack, &cb->xpack_cap, tiles * PT_CPU_MR * (size_t)j.cols * sizeof(float));
        for (j.t0 = 0; j.t0 < n; j.t0 = j.t1) {
            j.t1 = PT_MIN(n, j.t0 + NB);
            double block = (double)w->rows * (double)w->cols * (double)(j.t1 - j.t0);
            pt_cpu_run(cb, pack_x_task, &j, (double)(j.t1 - j.t0) * (double)j.cols);
            pt_cpu_run(cb, gemm_task, &j, block);
        }
    }
}

/* ---- embedding ------------------------------------------------------------- */

typedef struct embed_job {
    const pt_cpu_wops *wo; /* NULL: a quantized table (quant_kernels.h) */
    const pt_weight *w;
    float *y;
    const char *table;
    size_t row_bytes;
    int64_t cols;
    const int32_t *ids;
    int n;
} embed_job;

static void embed_task(void *ctx, int ith, int nth) {
    const embed_job *j = ctx;
    int64_t lo, hi;
    pt_cpu_split(j->n, ith, nth, 1, &lo, &hi);
    for (int64_t i = lo; i < hi; i++) {
        if (j->wo)
            j->wo->to_f32(j->y + i * j->cols, j->table + (size_t)j->ids[i] * j->row_bytes, j->cols);
        else
            pt_qk_dequant_row(j->w, j->ids[i], j->y + i * j->cols);
    }
}

void pt_cpu_embed(pt_backend *be, float *y, const pt_weight *table, const int32_t *ids, int n) {
    pt_cpu_backend *cb = pt_cpu(be);
    /* Token ids come from the tokenizer or a request; the engine validates
     * them, so one out of range here is a bug, not bad input. */
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= table->rows)
            pt_cpu_die("embed: token id %d out of range [0, %lld)", ids[i], (long long)table->rows);
    bool quant = pt_qk_handles(table->dtype);
    embed_job j = {
        .wo = quant ? NULL : pt_cpu_wops_for(cb, table->dtype, "embed"),
        .w = table,
        .y = y,
        .table = table->data,
        .row_bytes = pt_dtype_bytes(table->dtype, (uint64_t)table->cols),
        .cols = table->cols,
        .ids = ids,
        .n = n,
    };
    pt_cpu_run(cb, embed_task, &j, (double)n * (double)table->cols);
}
