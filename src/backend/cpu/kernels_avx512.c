/*
 * kernels_avx512.c - the kernel set for x86-64 with AVX-512 (F, BW, VL, DQ,
 * VNNI): the AVX2 set with the kernels that gain from 512-bit registers
 * replaced.
 *
 * Compiled with the AVX-512 flags (the build does this for *_avx512.c) and
 * only reached after cpu_backend.c has checked the CPU
 * (pt_qk_cpu_has_avx512).  Same contracts as cpu_kernels.h.
 *
 * What is replaced, and why:
 *   - matvec (decode, f32/f16/bf16): 16 columns per step, 8 rows side by
 *     side with a software prefetch in each row, masked loads for the last
 *     columns: half the instructions per byte of the AVX2 loop;
 *   - gemm_tile (prefill): the same 6 x 16 tile as AVX2 in 6 zmm
 *     accumulators, one panel load and 6 broadcasts per k; each output is
 *     the same chain of FMAs in the same order, so prefill results equal the
 *     AVX2 set's bit for bit;
 *   - sum (the bandwidth probe's read) and the compute-peak loops: zmm, and
 *     peak_i8 counts vpdpbusd, what the int8 GEMM of quant_i8_avx512.c
 *     issues.
 * Everything else (element-wise ops, attention tiles, conversions,
 * matmul_small) is the AVX2 set's: those loops are bound by memory or
 * by their f32 work's dependency chains, not by vector width.
 */
#include <immintrin.h>
#include <pthread.h>
#include <string.h>

#include "backend/cpu/cpu_kernels.h"
#include "base/base.h"

#define INLINE static inline __attribute__((always_inline))

typedef __m512 (*load16_fn)(const void *base, int64_t i, __mmask16 m);

/* 16 elements at index i as f32; lanes outside m read zero (and touch no
 * memory). */
INLINE __m512 f32_load16(const void *p, int64_t i, __mmask16 m) {
    return _mm512_maskz_loadu_ps(m, (const float *)p + i);
}
INLINE __m512 f16_load16(const void *p, int64_t i, __mmask16 m) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const uint16_t *)p + i));
}
INLINE __m512 bf16_load16(const void *p, int64_t i, __mmask16 m) {
    __m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t *)p + i);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* ---- matvec ----------------------------------------------------------------------
 * As the AVX2 kernel: R rows at a time, one accumulator each, one load of
 * x shared by all; a prefetch PREFETCH bytes ahead in each row, moving on
 * to the next block of rows near a row's end.  16 columns per step halve
 * the instructions per byte; the row loop then has room for the loads of
 * 8 streams in flight. */
#define PREFETCH 1024

/* Prefetches PREFETCH bytes ahead of element k of row i of an R-row block
 * (rows rb bytes apart); past the row's end, the same row of the next
 * block.  Formed as an integer: the address may lie past the matrix. */
INLINE void prefetch_ahead(const char *row, size_t rb, int64_t k, const int ESIZE, const int R) {
    size_t at = (size_t)(k * ESIZE) + PREFETCH;
    __builtin_prefetch((const void *)((uintptr_t)row + at + (at >= rb ? (R - 1) * rb : 0)));
}

INLINE void matvec_body(load16_fn ld, float *y, const void *w, size_t rb, int64_t nr, const float *x,
                        int64_t cols, const int ESIZE) {
    const int64_t c16 = cols & ~(int64_t)15;
    const __mmask16 all = 0xffff, tail = (__mmask16)((1u << (cols & 15)) - 1);
    int64_t r = 0;
    for (; r + 8 <= nr; r += 8) {
        const char *wr = (const char *)w + r * rb;
        __m512 acc[8];
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++) acc[i] = _mm512_setzero_ps();
        for (int64_t k = 0; k < c16; k += 16) {
            /* one line per row every 64 bytes: every step for f32, every
             * other one for f16/bf16 (32 bytes per step) */
            if (ESIZE == 4 || (k & 31) == 0) {
#pragma GCC unroll 8
                for (int i = 0; i < 8; i++) prefetch_ahead(wr + i * rb, rb, k, ESIZE, 8);
            }
            __m512 xv = _mm512_loadu_ps(x + k);
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++) acc[i] = _mm512_fmadd_ps(ld(wr + i * rb, k, all), xv, acc[i]);
        }
        if (tail) {
            __m512 xv = _mm512_maskz_loadu_ps(tail, x + c16);
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++) acc[i] = _mm512_fmadd_ps(ld(wr + i * rb, c16, tail), xv, acc[i]);
        }
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++) y[r + i] = _mm512_reduce_add_ps(acc[i]);
    }
    for (; r < nr; r++) { /* the last nr % 8 rows, one at a time */
        const char *w0 = (const char *)w + r * rb;
        __m512 a0 = _mm512_setzero_ps(), a1 = a0;
        int64_t k = 0;
        for (; k + 32 <= c16; k += 32) {
            a0 = _mm512_fmadd_ps(ld(w0, k, all), _mm512_loadu_ps(x + k), a0);
            a1 = _mm512_fmadd_ps(ld(w0, k + 16, all), _mm512_loadu_ps(x + k + 16), a1);
        }
        for (; k < c16; k += 16) a0 = _mm512_fmadd_ps(ld(w0, k, all), _mm512_loadu_ps(x + k), a0);
        if (tail) a1 = _mm512_fmadd_ps(ld(w0, c16, tail), _mm512_maskz_loadu_ps(tail, x + c16), a1);
        y[r] = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
    }
}

static void f32_matvec(float *y, const void *w, size_t rb, int64_t nr, const float *x, int64_t cols) {
    matvec_body(f32_load16, y, w, rb, nr, x, cols, 4);
}
static void f16_matvec(float *y, const void *w, size_t rb, int64_t nr, const float *x, int64_t cols) {
    matvec_body(f16_load16, y, w, rb, nr, x, cols, 2);
}
static void bf16_matvec(float *y, const void *w, size_t rb, int64_t nr, const float *x, int64_t cols) {
    matvec_body(bf16_load16, y, w, rb, nr, x, cols, 2);
}

/* ---- packed GEMM tile --------------------------------------------------------------
 * PT_CPU_MR tokens x PT_CPU_NR (16) rows: one zmm accumulator per token,
 * one panel load and MR broadcasts per k.  Lane j of token t's accumulator
 * runs the same FMAs in the same order as the AVX2 tile's. */
#if PT_CPU_NR != 16
#error "the AVX-512 tile holds PT_CPU_NR = 16 rows in one register"
#endif

INLINE void tile_body(float *y, int64_t ldy, const float *xp, const float *p, int kb, int nr,
                      int accumulate, const int NT) {
    __m512 c[PT_CPU_MR];
#pragma GCC unroll 8
    for (int t = 0; t < NT; t++) c[t] = _mm512_setzero_ps();
    for (int k = 0; k < kb; k++) {
        __m512 b = _mm512_load_ps(p + k * PT_CPU_NR);
#pragma GCC unroll 8
        for (int t = 0; t < NT; t++) c[t] = _mm512_fmadd_ps(_mm512_set1_ps(xp[k * PT_CPU_MR + t]), b, c[t]);
    }
    const __mmask16 m = (__mmask16)((1u << nr) - 1);
#pragma GCC unroll 8
    for (int t = 0; t < NT; t++) {
        float *yt = y + t * ldy;
        if (accumulate) c[t] = _mm512_add_ps(c[t], _mm512_maskz_loadu_ps(m, yt));
        _mm512_mask_storeu_ps(yt, m, c[t]);
    }
}

static void gemm_tile(float *y, int64_t ldy, const float *xp, const float *panel, int kb, int nt,
                      int nr, int accumulate) {
    switch (nt) {
    case 1: tile_body(y, ldy, xp, panel, kb, nr, accumulate, 1); break;
    case 2: tile_body(y, ldy, xp, panel, kb, nr, accumulate, 2); break;
    case 3: tile_body(y, ldy, xp, panel, kb, nr, accumulate, 3); break;
#if PT_CPU_MR > 4
    case 4: tile_body(y, ldy, xp, panel, kb, nr, accumulate, 4); break;
    case 5: tile_body(y, ldy, xp, panel, kb, nr, accumulate, 5); break;
#endif
    default: tile_body(y, ldy, xp, panel, kb, nr, accumulate, PT_CPU_MR); break;
    }
}

/* ---- the probes ------------------------------------------------------------------- */

static float sum(const float *x, size_t n) {
    __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
        s0 = _mm512_add_ps(s0, _mm512_loadu_ps(x + i));
        s1 = _mm512_add_ps(s1, _mm512_loadu_ps(x + i + 16));
        s2 = _mm512_add_ps(s2, _mm512_loadu_ps(x + i + 32));
        s3 = _mm512_add_ps(s3, _mm512_loadu_ps(x + i + 48));
    }
    for (; i + 16 <= n; i += 16) s0 = _mm512_add_ps(s0, _mm512_loadu_ps(x + i));
    if (i < n) s1 = _mm512_add_ps(s1, _mm512_maskz_loadu_ps((__mmask16)((1u << (n - i)) - 1), x + i));
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
}

/* Twelve independent chains, more than latency x units needs. */
#define CHAINS12(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
static double peak_f32(int64_t iters, float *sink) {
    __m512 m = _mm512_set1_ps(0.9999999f), c = _mm512_set1_ps(1e-7f), s = _mm512_setzero_ps();
#define DECL(i) __m512 a##i = _mm512_set1_ps((float)i);
#define STEP(i) a##i = _mm512_fmadd_ps(a##i, m, c);
#define SUM(i) s = _mm512_add_ps(s, a##i);
    CHAINS12(DECL)
    for (int64_t i = 0; i < iters; i++) {
        CHAINS12(STEP)
    }
    CHAINS12(SUM)
    *sink = _mm512_reduce_add_ps(s);
    return (double)iters * 12 * 16 * 2;
#undef DECL
#undef STEP
#undef SUM
}

/* Twelve chains of vpdpbusd: 64 u8 x s8 products added into 16 lanes. */
static double peak_i8(int64_t iters, float *sink) {
    __m512i u = _mm512_set1_epi8(3), v = _mm512_set1_epi8(-2), s = _mm512_setzero_si512();
#define DECL(i) __m512i a##i = _mm512_set1_epi32(i);
#define STEP(i) a##i = _mm512_dpbusd_epi32(a##i, u, v);
#define SUM(i) s = _mm512_add_epi32(s, a##i);
    CHAINS12(DECL)
    for (int64_t i = 0; i < iters; i++) {
        CHAINS12(STEP)
        __asm__("" : "+v"(u)); /* a loop-carried input: nothing can be hoisted */
    }
    CHAINS12(SUM)
    *sink = (float)_mm512_reduce_add_epi32(s);
    return (double)iters * 12 * 64 * 2;
#undef DECL
#undef STEP
#undef SUM
}

/* ---- the set ---------------------------------------------------------------------- */

static pt_cpu_kernels avx512;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void init(void) {
    avx512 = *pt_cpu_kernels_avx2();
    avx512.name = "avx512";
    avx512.w[PT_F32].matvec = f32_matvec;
    avx512.w[PT_F16].matvec = f16_matvec;
    avx512.w[PT_BF16].matvec = bf16_matvec;
    avx512.gemm_tile = gemm_tile;
    avx512.sum = sum;
    avx512.peak_f32 = peak_f32;
    avx512.peak_i8 = peak_i8;
}

const pt_cpu_kernels *pt_cpu_kernels_avx512(void) {
    pthread_once(&once, init);
    return &avx512;
}
