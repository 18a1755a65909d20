/*
 * cpu_kernels.h - the inner loops of the CPU backend, as a table.
 *
 * A kernel set is a struct of function pointers: one set of portable C
 * (kernels_portable.c), one for AVX2+FMA+F16C (kernels_avx2.c) and one for
 * AVX-512 with VNNI (kernels_avx512.c), chosen once when the backend is
 * created.  The drivers (cpu_matmul.c,
 * cpu_elementwise.c, cpu_attention.c) split work across threads and call
 * only these pointers, so every op runs on any set and the tests can check
 * each one the machine has.
 *
 * Everything that depends on a weight's element type lives in one pt_cpu_wops
 * entry, indexed by pt_dtype.  Adding a quantized format (q8_0, q4_k...) means
 * filling that entry in each set: a row-dot kernel that may quantize x itself
 * (cols work against rows*cols), and a dequantizer for the packed GEMM path.
 * A NULL entry means "not supported by this backend".
 *
 * Kernels are single-threaded and touch only what their arguments name.
 */
#ifndef PETREL_CPU_KERNELS_H
#define PETREL_CPU_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "base/dtype.h"

/* Packed GEMM geometry (see gemm_tile): a tile is up to PT_CPU_MR token rows
 * by PT_CPU_NR weight rows, sized for 16 AVX2 registers (12 accumulators).
 * A set may use wider panels (pt_cpu_kernels.nr, at most PT_CPU_NR_MAX):
 * the AVX-512 set's 6 x 32 tile keeps 12 zmm accumulators. */
#define PT_CPU_MR 6
#define PT_CPU_NR 16
#define PT_CPU_NR_MAX 32
/* matmul_small takes at most this many token rows per call. */
#define PT_CPU_SMALL_NT 4

typedef struct pt_cpu_wops {
    /* Decode: y[r] = row r · x for r < nr.  Rows are row_bytes apart and
     * hold cols elements; x is cols floats. */
    void (*matvec)(float *y, const void *w, size_t row_bytes, int64_t nr, const float *x,
                   int64_t cols);
    /* Few tokens (nt <= PT_CPU_SMALL_NT): y[t*ldy + r] = row r · x[t*ldx ...]
     * for t < nt, r < nr.  Each row is read once for all nt tokens. */
    void (*matmul_small)(float *y, int64_t ldy, const void *w, size_t row_bytes, int64_t nr,
                         const float *x, int64_t ldx, int nt, int64_t cols);
    /* dst[i] = element i of src, for n elements; src starts on a block. */
    void (*to_f32)(float *dst, const void *src, int64_t n);
    /* The inverse of to_f32, rounding to nearest even; NULL for formats the
     * KV cache cannot store. */
    void (*from_f32)(void *dst, const float *src, int64_t n);
    /* Largest token count for which matmul_small beats the packed GEMM,
     * which pays a conversion of every weight per token block (measured:
     * bench/cpu_kernels.md). */
    int small_max;
} pt_cpu_wops;

typedef struct pt_cpu_kernels {
    const char *name; /* "portable", "avx2", "avx512" */
    pt_cpu_wops w[PT_DTYPE_COUNT];

    /* Rows per GEMM panel and tile: PT_CPU_NR, or PT_CPU_NR_MAX (avx512). */
    int nr;
    /* Packed GEMM, the prefill path.  A panel holds nr weight rows of
     * kb columns, k-major and converted to f32: panel[k * NR + j] = element k
     * of row j, where w points at the panel's first column in row 0 (on a
     * block boundary); rows j >= nr are zero.  tmp has room for NR * kb
     * floats.  (NR is the set's nr; the argument nr is the rows present.) */
    void (*pack_panel)(float *panel, const pt_cpu_wops *wo, const void *w, size_t row_bytes, int nr,
                       int kb, float *tmp);
    /* y[t*ldy + j] = (accumulate ? y[t*ldy + j] : 0) + sum over k < kb of
     * xp[k*MR + t] * panel[k*NR + j], for t < nt <= MR and j < nr <= NR.
     * xp is a token tile packed k-major by the driver (pt_cpu_pack_x), so
     * the broadcasts walk one contiguous stream: rows of x a power of two
     * apart fell into the same L1 sets as each other and the panel. */
    void (*gemm_tile)(float *y, int64_t ldy, const float *xp, const float *panel, int kb, int nt,
                      int nr, int accumulate);

    /* Attention tiles for one query head over cnt cached rows already in
     * f32, ld floats apart (hd elements each):
     *   attn_scores: s[c] = q · k[c];
     *   attn_accum:  acc[i] += sum over c of w[c] * v[c][i].
     * Both keep their partial sums in registers across the rows: the
     * per-position dot-and-axpy form spends its time on horizontal sums and
     * on reloading and storing acc. */
    void (*attn_scores)(float *s, const float *q, const float *k, int64_t ld, int cnt, int hd);
    void (*attn_accum)(float *acc, const float *w, const float *v, int64_t ld, int cnt, int hd);

    /* One row of rmsnorm: y = x * g / sqrt(mean(x^2) + eps), the sum of
     * squares taken in double; y may alias x. */
    void (*rmsnorm_row)(float *y, const float *x, const float *g, int64_t d, float eps);
    /* y = a + b; y may alias a or b. */
    void (*add)(float *y, const float *a, const float *b, size_t n);
    /* y = silu(g) * u = g / (1 + exp(-g)) * u; y may alias g or u. */
    void (*swiglu)(float *y, const float *g, const float *u, size_t n);
    /* x[i] = exp(x[i] - max) for i < n; returns the sum of the new values.
     * Relative error below 1e-6 (softmax's denominators and weights). */
    float (*exp_sum)(float *x, int64_t n, float max);
    /* The largest of x[0..n), n >= 1. */
    float (*max)(const float *x, int64_t n);
    /* x[i] *= a. */
    void (*scale)(float *x, float a, int64_t n);
    /* Rotary embedding of one head, cos/sin already computed per pair
     * (already multiplied by mscale).  NORM style: pairs (x[2i], x[2i+1]);
     * NEOX: (x[i], x[i + n_rot/2]).  i < n_rot/2; other dims untouched. */
    void (*rope_norm)(float *x, const float *cos, const float *sin, int n_rot);
    void (*rope_neox)(float *x, const float *cos, const float *sin, int n_rot);
    /* Sum of n floats, for the bandwidth probe (a pure streaming read). */
    float (*sum)(const float *x, size_t n);
    /* Compute-peak loops for the prefill roofline (cpu_peak.c): iters
     * rounds of independent dependency chains, enough to fill the
     * pipelines; each returns the operations it did (a multiply-add is 2)
     * and stores a result in *sink so nothing is optimized away.
     *   peak_f32: f32 fused multiply-adds, what the packed GEMM issues;
     *   peak_i8:  u8 x s8 multiply-adds (vpmaddubsw), what the int8 GEMM
     *             issues; NULL where the set has no int8 kernels. */
    double (*peak_f32)(int64_t iters, float *sink);
    double (*peak_i8)(int64_t iters, float *sink);
} pt_cpu_kernels;

const pt_cpu_kernels *pt_cpu_kernels_portable(void);
/* NULL when this build has no AVX2 set; the caller checks the CPU. */
const pt_cpu_kernels *pt_cpu_kernels_avx2(void);
/* The AVX-512 set (kernels_avx512.c): AVX2's with the kernels that gain
 * from 512-bit registers replaced; the caller checks the CPU. */
const pt_cpu_kernels *pt_cpu_kernels_avx512(void);

#endif
