/*
 * quant_matmul.c - running a quantized matmul on the thread pool: quantize
 * the activations (tokens split across threads), then the weight rows
 * (split across threads, each thread doing all tokens of its rows, so each
 * weight byte is read once per call).
 */
#include <stdlib.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include "backend/cpu/quant_kernels.h"

/* avx2 and fma by __builtin_cpu_supports (which also checks that the OS
 * saves AVX state); f16c from CPUID directly, since clang's builtin does not
 * know that name.  The CPU backend's kernel choice uses this too. */
bool pt_qk_cpu_has_avx2(void) {
#if defined(__x86_64__) || defined(__i386__)
    unsigned a, b, c, d;
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
#else
    return false;
#endif
}

/* The AVX-512 subset the int8 kernels of quant_i8_avx512.c are compiled
 * for; the CPU backend's "avx512" kernel set requires it too. */
bool pt_qk_cpu_has_avx512(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    return pt_qk_cpu_has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512vnni");
#else
    return false;
#endif
}

typedef struct job {
    pt_qact a;
    pt_qact8 a8;
    pt_qk_rows8_fn rows8; /* non-NULL: the int8 GEMM, a8 */
    const float *x;
    const pt_weight *w;
    float *y;
    pt_qk_rows_fn rows;
    bool avx2;
} job;

static void act_part(void *ctx, int ith, int nth) {
    job *j = ctx;
    int n = j->rows8 ? j->a8.n : j->a.n, t0 = (int)((int64_t)n * ith / nth), t1 = (int)((int64_t)n * (ith + 1) / nth);
    if (t0 >= t1) return;
    if (j->rows8 && j->avx2) pt_qk_avx2_quantize_act8(&j->a8, j->x, t0, t1);
    else if (j->rows8) pt_qk_quantize_act8(&j->a8, j->x, t0, t1);
    else pt_qk_quantize_act(&j->a, j->x, t0, t1);
}

/* Rows in runs of 8, so threads do not share the cache lines of y. */
static void rows_part(void *ctx, int ith, int nth) {
    job *j = ctx;
    int64_t runs = (j->w->rows + 7) / 8;
    int64_t r0 = runs * ith / nth * 8, r1 = PT_MIN(j->w->rows, runs * (ith + 1) / nth * 8);
    if (r0 >= r1) return;
    if (j->rows8) j->rows8(j->w, &j->a8, j->y, r0, r1);
    else j->rows(j->w, &j->a, j->y, r0, r1);
}

/* Activations up to this many elements are quantized on the calling thread. */
#define ACT_INLINE_MAX (16 * 1024)

static void run(pt_pool *pool, pt_pool_fn fn, job *j) {
    if (pool) pt_pool_run(pool, fn, j);
    else fn(j, 0, 1);
}

static pt_qk_rows8_fn rows8_for(const pt_qk_ctx *ctx, const pt_weight *w, int n) {
    if (!ctx->avx2 || !ctx->i8) return NULL;
    if (n >= PT_QK_I8_MIN_TOKENS) return ctx->avx512 ? pt_qk_avx512_rows8(w) : pt_qk_avx2_rows8(w);
    if (!ctx->i8_decode) return NULL;
    return ctx->avx512 ? pt_qk_avx512_vec8(w) : pt_qk_avx2_vec8(w);
}

const char *pt_qk_path(const pt_qk_ctx *ctx, const pt_weight *w, int n) {
    if (rows8_for(ctx, w, n)) {
        if (ctx->avx512) return n >= PT_QK_I8_MIN_TOKENS ? "avx512 int8 gemm" : "avx512 int8 rows";
        return n >= PT_QK_I8_MIN_TOKENS ? "avx2 int8 gemm" : "avx2 int8 rows";
    }
    if (ctx->avx2 && pt_qk_avx2_rows(w)) return "avx2 int16";
    return pt_qk_portable_rows(w) ? "portable int16" : "none";
}

void pt_qk_matmul(pt_qk_ctx *ctx, pt_pool *pool, float *y, const float *x, const pt_weight *w,
                  int n) {
    job j = {.x = x, .w = w, .y = y, .avx2 = ctx->avx2};
    j.rows = ctx->avx2 ? pt_qk_avx2_rows(w) : NULL;
    if (!j.rows) j.rows = pt_qk_portable_rows(w); /* formats without AVX2 rows (MXFP4) */
    if (!j.rows || n <= 0) return;
    j.rows8 = rows8_for(ctx, w, n);
    size_t need = j.rows8 ? pt_qk_act8_bytes(n, w->cols) : pt_qk_act_bytes(n, w->cols);
    if (need > ctx->cap) {
        pt_free_big(ctx->scratch, ctx->cap);
        ctx->cap = PT_MAX(need, ctx->cap * 2);
        ctx->scratch = pt_alloc_big(ctx->cap);
        if (!ctx->scratch) { /* the caller sized activations far larger than this */
            ctx->cap = 0;
            pt_log(PT_LOG_ERROR, "quantized matmul: cannot allocate %zu bytes", need);
            abort();
        }
    }
    if (j.rows8)
        pt_qk_act8_init(&j.a8, ctx->scratch, n, w->cols);
    else
        pt_qk_act_init(&j.a, ctx->scratch, n, w->cols, pt_qk_act_block(w),
                       ctx->avx2 ? pt_qk_avx2_perm(w) : PT_QK_PERM_NONE);
    /* A decode step's activations (a few thousand floats, about a
     * microsecond) are quantized on this thread: a pool dispatch costs more
     * than the work, twice per matmul, ~150 matmuls per token. */
    run((int64_t)n * w->cols <= ACT_INLINE_MAX ? NULL : pool, act_part, &j);
    run(pool, rows_part, &j);
}

void pt_qk_ctx_free(pt_qk_ctx *ctx) {
    pt_free_big(ctx->scratch, ctx->cap);
    ctx->scratch = NULL;
    ctx->cap = 0;
}
