/*
 * kernels_avx2.c - the kernel set for x86-64 with AVX2, FMA and F16C.
 *
 * Compiled with -mavx2 -mfma -mf16c (the build does this for *_avx2.c) and
 * only reached after cpu_backend.c has checked the CPU.  Same contracts as
 * cpu_kernels.h; the portable set is the reference.
 *
 * Element types.  Each weight/KV dtype contributes two tiny loaders: load8
 * (8 elements at index i as a __m256) and load1 (one element, for tails).
 * The kernel bodies are always_inline functions taking those loaders as
 * arguments; each dtype's entry point passes constants, so the compiler
 * emits one fully specialized loop per dtype without macros.  A quantized
 * format would add its own kernels instead (its loads are per block).
 *
 * Loops that run over a small constant range (tokens × rows of a register
 * tile) carry `#pragma GCC unroll`, so the accumulators stay in registers.
 */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu_kernels.h"
#include "base/base.h"

#define INLINE static inline __attribute__((always_inline))

/* ---- loading each element type as f32 ---------------------------------------- */

typedef __m256 (*load8_fn)(const void *base, int64_t i);
typedef float (*load1_fn)(const void *base, int64_t i);

INLINE __m256 f32_load8(const void *p, int64_t i) {
    return _mm256_loadu_ps((const float *)p + i);
}
INLINE float f32_load1(const void *p, int64_t i) {
    return ((const float *)p)[i];
}
INLINE __m256 f16_load8(const void *p, int64_t i) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i)));
}
INLINE float f16_load1(const void *p, int64_t i) {
    return _cvtsh_ss(((const uint16_t *)p)[i]);
}
/* bf16 is the top half of an f32: widen to 32 bits and shift into place. */
INLINE __m256 bf16_load8(const void *p, int64_t i) {
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)p + i));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
INLINE float bf16_load1(const void *p, int64_t i) {
    return pt_bf16_to_f32(((const uint16_t *)p)[i]);
}

INLINE float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Eight horizontal sums at once: lane i of the result is the sum of v[i]. */
INLINE __m256 hsum8(const __m256 *v) {
    __m256 e = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
    __m256 f = _mm256_hadd_ps(_mm256_hadd_ps(v[4], v[5]), _mm256_hadd_ps(v[6], v[7]));
    /* e holds v0..v3's halves of the low lane, then of the high lane. */
    return _mm256_add_ps(_mm256_permute2f128_ps(e, f, 0x20), _mm256_permute2f128_ps(e, f, 0x31));
}

/* ---- matvec: the decode kernel -------------------------------------------------
 * Eight rows at a time, one accumulator each (8 FMA chains in flight), one
 * load of x shared by all eight, and a single hsum8 for the eight results.
 * Eight concurrent row streams plus a software prefetch PREFETCH bytes ahead
 * in each keep enough cache misses in flight for one core to approach the
 * machine's bandwidth.  Near a row's end the prefetch moves on to the same
 * row of the next block, so short rows (4 KiB of bf16) do not start cold.
 * (Measured, one thread, bf16 2048x2048: 4 rows without prefetch ~9.5 GB/s,
 * 8 rows with prefetch 13.7, with the wrap 17.8 - the f32 rate.) */

#define PREFETCH 1024

/* Prefetches PREFETCH bytes ahead of element k of row i of an R-row block
 * (rows rb bytes apart), once per cache line.  The address may lie past the
 * matrix (a prefetch never faults), so it is formed as an integer. */
INLINE void prefetch_ahead(const char *row, size_t rb, int64_t k, const int ESIZE, const int R) {
    size_t at = (size_t)(k * ESIZE) + PREFETCH;
    if (((k * ESIZE) & 63) == 0)
        __builtin_prefetch((const void *)((uintptr_t)row + at + (at >= rb ? (R - 1) * rb : 0)));
}

INLINE float dot_tail(load1_fn ld1, const void *row, const float *x, int64_t from, int64_t cols) {
    float s = 0;
    for (int64_t k = from; k < cols; k++) s += ld1(row, k) * x[k];
    return s;
}

INLINE void matvec_body(load8_fn ld, load1_fn ld1, float *y, const void *w, size_t rb, int64_t nr,
                        const float *x, int64_t cols, const int ESIZE) {
    const int64_t c8 = cols & ~(int64_t)7;
    int64_t r = 0;
    for (; r + 8 <= nr; r += 8) {
        const char *wr = (const char *)w + r * rb;
        __m256 acc[8];
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++) acc[i] = _mm256_setzero_ps();
        for (int64_t k = 0; k < c8; k += 8) {
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++) prefetch_ahead(wr + i * rb, rb, k, ESIZE, 8);
            __m256 xv = _mm256_loadu_ps(x + k);
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++) acc[i] = _mm256_fmadd_ps(ld(wr + i * rb, k), xv, acc[i]);
        }
        __m256 s = hsum8(acc);
        if (c8 < cols) {
            float t[8];
            for (int i = 0; i < 8; i++) t[i] = dot_tail(ld1, wr + i * rb, x, c8, cols);
            s = _mm256_add_ps(s, _mm256_loadu_ps(t));
        }
        _mm256_storeu_ps(y + r, s);
    }
    for (; r < nr; r++) { /* the last nr % 8 rows, one at a time */
        const char *w0 = (const char *)w + r * rb;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        int64_t k = 0;
        for (; k + 32 <= c8; k += 32) {
            a0 = _mm256_fmadd_ps(ld(w0, k), _mm256_loadu_ps(x + k), a0);
            a1 = _mm256_fmadd_ps(ld(w0, k + 8), _mm256_loadu_ps(x + k + 8), a1);
            a2 = _mm256_fmadd_ps(ld(w0, k + 16), _mm256_loadu_ps(x + k + 16), a2);
            a3 = _mm256_fmadd_ps(ld(w0, k + 24), _mm256_loadu_ps(x + k + 24), a3);
        }
        for (; k < c8; k += 8) a0 = _mm256_fmadd_ps(ld(w0, k), _mm256_loadu_ps(x + k), a0);
        __m256 a = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
        y[r] = hsum(a) + dot_tail(ld1, w0, x, c8, cols);
    }
}

/* ---- matmul_small: NT tokens × R rows per step ------------------------------------ */

INLINE void small_tile(load8_fn ld, load1_fn ld1, float *y, int64_t ldy, const char *w, size_t rb,
                       const float *x, int64_t ldx, int64_t cols, const int NT, const int R,
                       const int ESIZE) {
    const int64_t c8 = cols & ~(int64_t)7;
    __m256 acc[PT_CPU_SMALL_NT][4];
#pragma GCC unroll 4
    for (int t = 0; t < NT; t++)
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) acc[t][r] = _mm256_setzero_ps();
    for (int64_t k = 0; k < c8; k += 8) {
        __m256 wv[4];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) prefetch_ahead(w + r * rb, rb, k, ESIZE, R);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) wv[r] = ld(w + r * rb, k);
#pragma GCC unroll 4
        for (int t = 0; t < NT; t++) {
            __m256 xv = _mm256_loadu_ps(x + t * ldx + k);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) acc[t][r] = _mm256_fmadd_ps(wv[r], xv, acc[t][r]);
        }
    }
#pragma GCC unroll 4
    for (int t = 0; t < NT; t++)
#pragma GCC unroll 4
        for (int r = 0; r < R; r++)
            y[t * ldy + r] = hsum(acc[t][r]) + dot_tail(ld1, w + r * rb, x + t * ldx, c8, cols);
}

/* Rows per step for NT tokens: keep NT*R <= 8 accumulators. */
INLINE void small_rows(load8_fn ld, load1_fn ld1, float *y, int64_t ldy, const char *w, size_t rb,
                       int64_t nr, const float *x, int64_t ldx, int64_t cols, const int NT,
                       const int ESIZE) {
    const int R = NT == 1 ? 4 : NT == 2 ? 4 : 2;
    int64_t r = 0;
    for (; r + R <= nr; r += R) small_tile(ld, ld1, y + r, ldy, w + r * rb, rb, x, ldx, cols, NT, R, ESIZE);
    for (; r < nr; r++) small_tile(ld, ld1, y + r, ldy, w + r * rb, rb, x, ldx, cols, NT, 1, ESIZE);
}

INLINE void matmul_small_body(load8_fn ld, load1_fn ld1, float *y, int64_t ldy, const void *w,
                              size_t rb, int64_t nr, const float *x, int64_t ldx, int nt,
                              int64_t cols, const int ESIZE) {
    switch (nt) {
    case 1: small_rows(ld, ld1, y, ldy, w, rb, nr, x, ldx, cols, 1, ESIZE); break;
    case 2: small_rows(ld, ld1, y, ldy, w, rb, nr, x, ldx, cols, 2, ESIZE); break;
    case 3: small_rows(ld, ld1, y, ldy, w, rb, nr, x, ldx, cols, 3, ESIZE); break;
    default: small_rows(ld, ld1, y, ldy, w, rb, nr, x, ldx, cols, 4, ESIZE); break;
    }
}

/* ---- conversions ------------------------------------------------------------------ */

INLINE void to_f32_body(load8_fn ld, load1_fn ld1, float *dst, const void *src, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, ld(src, i));
    for (; i < n; i++) dst[i] = ld1(src, i);
}

static void f32_from_f32(void *dst, const float *src, int64_t n) {
    memcpy(dst, src, (size_t)n * sizeof(float));
}

static void f16_from_f32(void *dst, const float *src, int64_t n) {
    uint16_t *d = dst;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(d + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) d[i] = pt_f32_to_f16(src[i]);
}

/* Round-to-nearest-even on the bit pattern, NaNs kept quiet: the same rule as
 * pt_f32_to_bf16, 8 lanes at a time. */
INLINE __m256i bf16_round8(__m256 f) {
    __m256i u = _mm256_castps_si256(f);
    __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff))), 16);
    __m256i abs = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
    __m256i nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7f800000));
    __m256i qnan = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(64));
    return _mm256_blendv_epi8(r, qnan, nan);
}

static void bf16_from_f32(void *dst, const float *src, int64_t n) {
    uint16_t *d = dst;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i a = bf16_round8(_mm256_loadu_ps(src + i)), b = bf16_round8(_mm256_loadu_ps(src + i + 8));
        /* packus interleaves 128-bit lanes; the permute puts them back in order. */
        __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xD8);
        _mm256_storeu_si256((__m256i *)(d + i), p);
    }
    for (; i < n; i++) d[i] = pt_f32_to_bf16(src[i]);
}

/* ---- the per-dtype entry points ---------------------------------------------------- */

#define PT_AVX2_WOPS(T, ESIZE)                                                                   \
    static void T##_matvec(float *y, const void *w, size_t rb, int64_t nr, const float *x,       \
                           int64_t cols) {                                                       \
        matvec_body(T##_load8, T##_load1, y, w, rb, nr, x, cols, ESIZE);                         \
    }                                                                                            \
    static void T##_matmul_small(float *y, int64_t ldy, const void *w, size_t rb, int64_t nr,    \
                                 const float *x, int64_t ldx, int nt, int64_t cols) {            \
        matmul_small_body(T##_load8, T##_load1, y, ldy, w, rb, nr, x, ldx, nt, cols, ESIZE);     \
    }                                                                                            \
    static void T##_to_f32(float *dst, const void *src, int64_t n) {                             \
        to_f32_body(T##_load8, T##_load1, dst, src, n);                                          \
    }

PT_AVX2_WOPS(f32, 4)
PT_AVX2_WOPS(f16, 2)
PT_AVX2_WOPS(bf16, 2)

/* ---- packed GEMM -------------------------------------------------------------------- */

/* Transposes an 8x8 block: rows src[0..7] (at column k, read as f32 by
 * load) to panel columns. */
INLINE void transpose8(float *dst, int64_t ldd, const void *const *src, int64_t k, load8_fn load) {
    __m256 r0 = load(src[0], k), r1 = load(src[1], k);
    __m256 r2 = load(src[2], k), r3 = load(src[3], k);
    __m256 r4 = load(src[4], k), r5 = load(src[5], k);
    __m256 r6 = load(src[6], k), r7 = load(src[7], k);
    __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1);
    __m256 t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);
    __m256 t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5);
    __m256 t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
    __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xEE);
    __m256 s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    __m256 s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xEE);
    __m256 s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    _mm256_storeu_ps(dst + 0 * ldd, _mm256_permute2f128_ps(s0, s4, 0x20));
    _mm256_storeu_ps(dst + 1 * ldd, _mm256_permute2f128_ps(s1, s5, 0x20));
    _mm256_storeu_ps(dst + 2 * ldd, _mm256_permute2f128_ps(s2, s6, 0x20));
    _mm256_storeu_ps(dst + 3 * ldd, _mm256_permute2f128_ps(s3, s7, 0x20));
    _mm256_storeu_ps(dst + 4 * ldd, _mm256_permute2f128_ps(s0, s4, 0x31));
    _mm256_storeu_ps(dst + 5 * ldd, _mm256_permute2f128_ps(s1, s5, 0x31));
    _mm256_storeu_ps(dst + 6 * ldd, _mm256_permute2f128_ps(s2, s6, 0x31));
    _mm256_storeu_ps(dst + 7 * ldd, _mm256_permute2f128_ps(s3, s7, 0x31));
}

/* Rows j < nr of w (the missing ones read zero, which is zero bytes in
 * every float format) converted and transposed 8x8 at a time straight into
 * the panel.  Converting into a row-major buffer first cost a 16 KB round
 * trip per panel whose stores missed L1 behind the tiles' stream of x
 * (perf: 86% of the conversion's samples on the store). */
INLINE void pack_direct(float *panel, const void *w, size_t row_bytes, int nr, int kb, float *zero,
                        load8_fn load8, load1_fn load1) {
    const void *src[PT_CPU_NR];
    if (nr < PT_CPU_NR) memset(zero, 0, (size_t)kb * sizeof(float));
    for (int j = 0; j < PT_CPU_NR; j++) src[j] = j < nr ? (const char *)w + (size_t)j * row_bytes : (const void *)zero;
    int k = 0;
    for (; k + 8 <= kb; k += 8) {
#pragma GCC unroll 4
        for (int v = 0; v < PT_CPU_NR / 8; v++)
            transpose8(panel + k * PT_CPU_NR + 8 * v, PT_CPU_NR, src + 8 * v, k, load8);
    }
    for (; k < kb; k++)
        for (int j = 0; j < PT_CPU_NR; j++) panel[k * PT_CPU_NR + j] = load1(src[j], k);
}

static void pack_panel(float *panel, const pt_cpu_wops *wo, const void *w, size_t row_bytes, int nr,
                       int kb, float *tmp) {
    if (wo->to_f32 == f32_to_f32) pack_direct(panel, w, row_bytes, nr, kb, tmp, f32_load8, f32_load1);
    else if (wo->to_f32 == f16_to_f32) pack_direct(panel, w, row_bytes, nr, kb, tmp, f16_load8, f16_load1);
    else if (wo->to_f32 == bf16_to_f32) pack_direct(panel, w, row_bytes, nr, kb, tmp, bf16_load8, bf16_load1);
    else { /* any other format: rows through tmp (nr < NR leaves its last row for the zeros) */
        for (int j = 0; j < nr; j++) wo->to_f32(tmp + (size_t)j * kb, (const char *)w + (size_t)j * row_bytes, kb);
        pack_direct(panel, tmp, (size_t)kb * sizeof(float), nr, kb, tmp + (size_t)(PT_CPU_NR - 1) * kb,
                    f32_load8, f32_load1);
    }
}

/* The MR x NR register tile: MR * NR/8 accumulators, NR/8 panel loads and
 * MR broadcasts per k. */
#define NV (PT_CPU_NR / 8)
INLINE void tile_body(float *y, int64_t ldy, const float *xp, const float *p, int kb, int nr,
                      int accumulate, const int NT) {
    __m256 c[PT_CPU_MR][NV];
#pragma GCC unroll 8
    for (int t = 0; t < NT; t++)
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) c[t][v] = _mm256_setzero_ps();
    for (int k = 0; k < kb; k++) {
        __m256 b[NV];
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) b[v] = _mm256_load_ps(p + k * PT_CPU_NR + 8 * v);
#pragma GCC unroll 8
        for (int t = 0; t < NT; t++) {
            __m256 a = _mm256_broadcast_ss(xp + k * PT_CPU_MR + t);
#pragma GCC unroll 4
            for (int v = 0; v < NV; v++) c[t][v] = _mm256_fmadd_ps(a, b[v], c[t][v]);
        }
    }
#pragma GCC unroll 8
    for (int t = 0; t < NT; t++) {
        float *yt = y + t * ldy;
        if (nr == PT_CPU_NR) {
#pragma GCC unroll 4
            for (int v = 0; v < NV; v++) {
                if (accumulate) c[t][v] = _mm256_add_ps(c[t][v], _mm256_loadu_ps(yt + 8 * v));
                _mm256_storeu_ps(yt + 8 * v, c[t][v]);
            }
        } else {
            float buf[PT_CPU_NR];
#pragma GCC unroll 4
            for (int v = 0; v < NV; v++) _mm256_storeu_ps(buf + 8 * v, c[t][v]);
            for (int j = 0; j < nr; j++) yt[j] = (accumulate ? yt[j] : 0.0f) + buf[j];
        }
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

/* ---- attention tiles ---------------------------------------------------------------- */

INLINE float dot_f32(const float *a, const float *b, int n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = s0;
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    }
    if (i + 8 <= n) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        i += 8;
    }
    float s = hsum(_mm256_add_ps(s0, s1));
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

/* Eight rows at a time, one accumulator each, reduced together by hsum8. */
static void attn_scores(float *s, const float *q, const float *k, int64_t ld, int cnt, int hd) {
    const int h8 = hd & ~7;
    int c = 0;
    for (; c + 8 <= cnt; c += 8) {
        const float *kc = k + c * ld;
        __m256 acc[8];
#pragma GCC unroll 8
        for (int r = 0; r < 8; r++) acc[r] = _mm256_setzero_ps();
        for (int i = 0; i < h8; i += 8) {
            __m256 qv = _mm256_loadu_ps(q + i);
#pragma GCC unroll 8
            for (int r = 0; r < 8; r++) acc[r] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(kc + r * ld + i), acc[r]);
        }
        __m256 sv = hsum8(acc);
        if (h8 < hd) {
            float tail[8];
            for (int r = 0; r < 8; r++) tail[r] = dot_f32(q + h8, kc + r * ld + h8, hd - h8);
            sv = _mm256_add_ps(sv, _mm256_loadu_ps(tail));
        }
        _mm256_storeu_ps(s + c, sv);
    }
    for (; c < cnt; c++) s[c] = dot_f32(q, k + c * ld, hd);
}

/* 64 output dims (8 registers) at a time, summed over all rows before acc
 * is touched again. */
static void attn_accum(float *acc, const float *w, const float *v, int64_t ld, int cnt, int hd) {
    int i = 0;
    for (; i + 64 <= hd; i += 64) {
        __m256 a[8];
#pragma GCC unroll 8
        for (int r = 0; r < 8; r++) a[r] = _mm256_loadu_ps(acc + i + 8 * r);
        for (int c = 0; c < cnt; c++) {
            __m256 wc = _mm256_broadcast_ss(w + c);
            const float *vc = v + c * ld + i;
#pragma GCC unroll 8
            for (int r = 0; r < 8; r++) a[r] = _mm256_fmadd_ps(wc, _mm256_loadu_ps(vc + 8 * r), a[r]);
        }
#pragma GCC unroll 8
        for (int r = 0; r < 8; r++) _mm256_storeu_ps(acc + i + 8 * r, a[r]);
    }
    for (; i + 8 <= hd; i += 8) {
        __m256 a = _mm256_loadu_ps(acc + i);
        for (int c = 0; c < cnt; c++)
            a = _mm256_fmadd_ps(_mm256_broadcast_ss(w + c), _mm256_loadu_ps(v + c * ld + i), a);
        _mm256_storeu_ps(acc + i, a);
    }
    for (; i < hd; i++) {
        float a = acc[i];
        for (int c = 0; c < cnt; c++) a += w[c] * v[c * ld + i];
        acc[i] = a;
    }
}

/* ---- exp ----------------------------------------------------------------------------
 * exp(x) = 2^n * exp(r), n = round(x / ln 2), r = x - n ln 2 in [-ln2/2, ln2/2]
 * with ln 2 split in two so r is exact; exp(r) by a degree-6 polynomial
 * (Cephes' coefficients).  Measured max relative error ~2e-7 over the
 * normal range (the tests check < 1e-6).  Inputs are clamped to the range
 * whose result is a normal float: below it the result is ~0 anyway. */

INLINE __m256 exp8(__m256 x) {
    x = _mm256_min_ps(x, _mm256_set1_ps(88.3762626647949f));
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.3365447505531f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    /* 2^n: n + 127 into the exponent field.  n is in [-126, 128]; 128 only
     * at the clamp, where x*log2e rounds up - scale in two steps there. */
    __m256i e = _mm256_cvtps_epi32(n);
    __m256i e1 = _mm256_srai_epi32(e, 1), e2 = _mm256_sub_epi32(e, e1);
    __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(e1, _mm256_set1_epi32(127)), 23));
    __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(e2, _mm256_set1_epi32(127)), 23));
    return _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
}

static float exp_sum(float *x, int64_t n, float max) {
    __m256 m = _mm256_set1_ps(max), s = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), m));
        _mm256_storeu_ps(x + i, e);
        s = _mm256_add_ps(s, e);
    }
    float sum = hsum(s);
    for (; i < n; i++) sum += x[i] = expf(x[i] - max);
    return sum;
}

static void swiglu(float *y, const float *g, const float *u, size_t n) {
    const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 gv = _mm256_loadu_ps(g + i);
        __m256 e = exp8(_mm256_sub_ps(zero, gv));
        __m256 silu = _mm256_div_ps(gv, _mm256_add_ps(one, e));
        _mm256_storeu_ps(y + i, _mm256_mul_ps(silu, _mm256_loadu_ps(u + i)));
    }
    for (; i < n; i++) y[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

/* ---- the rest of the element-wise kernels -------------------------------------------- */

static void rmsnorm_row(float *y, const float *x, const float *g, int64_t d, float eps) {
    /* Squares of floats are exact in double, so the sum's error is only the
     * double additions: far below f32 rounding for any realistic d. */
    __m256d s0 = _mm256_setzero_pd(), s1 = s0;
    int64_t i = 0;
    for (; i + 8 <= d; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(v));
        __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
        s0 = _mm256_fmadd_pd(lo, lo, s0);
        s1 = _mm256_fmadd_pd(hi, hi, s1);
    }
    double acc[4];
    _mm256_storeu_pd(acc, _mm256_add_pd(s0, s1));
    double ss = (acc[0] + acc[1]) + (acc[2] + acc[3]);
    for (; i < d; i++) ss += (double)x[i] * x[i];
    float sc = (float)(1.0 / sqrt(ss / (double)d + eps));
    __m256 sv = _mm256_set1_ps(sc);
    for (i = 0; i + 8 <= d; i += 8)
        _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), sv),
                                              _mm256_loadu_ps(g + i)));
    for (; i < d; i++) y[i] = x[i] * sc * g[i];
}

static void add(float *y, const float *a, const float *b, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_add_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));
    for (; i < n; i++) y[i] = a[i] + b[i];
}

static float max(const float *x, int64_t n) {
    __m256 m = _mm256_set1_ps(x[0]);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) m = _mm256_max_ps(m, _mm256_loadu_ps(x + i));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    float r = _mm_cvtss_f32(h);
    for (; i < n; i++) r = x[i] > r ? x[i] : r;
    return r;
}

static void scale(float *x, float a, int64_t n) {
    __m256 av = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), av));
    for (; i < n; i++) x[i] *= a;
}

/* Adjacent pairs: with c, s duplicated per pair and x's pairs swapped,
 * fmaddsub gives (x0 c - x1 s, x1 c + x0 s) in one instruction. */
static void rope_norm(float *x, const float *cos, const float *sin, int n_rot) {
    const __m256i dup = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3);
    int i = 0, half = n_rot / 2;
    for (; i + 4 <= half; i += 4) {
        __m256 c = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_loadu_ps(cos + i)), dup);
        __m256 s = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_loadu_ps(sin + i)), dup);
        __m256 v = _mm256_loadu_ps(x + 2 * i);
        __m256 swapped = _mm256_permute_ps(v, 0xB1);
        _mm256_storeu_ps(x + 2 * i, _mm256_fmaddsub_ps(v, c, _mm256_mul_ps(swapped, s)));
    }
    for (; i < half; i++) {
        float x0 = x[2 * i], x1 = x[2 * i + 1];
        x[2 * i] = x0 * cos[i] - x1 * sin[i];
        x[2 * i + 1] = x0 * sin[i] + x1 * cos[i];
    }
}

static void rope_neox(float *x, const float *cos, const float *sin, int n_rot) {
    int i = 0, h = n_rot / 2;
    for (; i + 8 <= h; i += 8) {
        __m256 c = _mm256_loadu_ps(cos + i), s = _mm256_loadu_ps(sin + i);
        __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + i + h);
        _mm256_storeu_ps(x + i, _mm256_fmsub_ps(a, c, _mm256_mul_ps(b, s)));
        _mm256_storeu_ps(x + i + h, _mm256_fmadd_ps(a, s, _mm256_mul_ps(b, c)));
    }
    for (; i < h; i++) {
        float x0 = x[i], x1 = x[i + h];
        x[i] = x0 * cos[i] - x1 * sin[i];
        x[i + h] = x0 * sin[i] + x1 * cos[i];
    }
}

static float sum(const float *x, size_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm256_add_ps(s0, _mm256_loadu_ps(x + i));
        s1 = _mm256_add_ps(s1, _mm256_loadu_ps(x + i + 8));
        s2 = _mm256_add_ps(s2, _mm256_loadu_ps(x + i + 16));
        s3 = _mm256_add_ps(s3, _mm256_loadu_ps(x + i + 24));
    }
    float s = hsum(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    for (; i < n; i++) s += x[i];
    return s;
}

/* Twelve chains of 8-lane FMAs: more than latency (4-5 cycles) x units
 * (2) needs, in named variables (GCC keeps an array of them on the stack). */
#define CHAINS12(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
static double peak_f32(int64_t iters, float *sink) {
    __m256 m = _mm256_set1_ps(0.9999999f), c = _mm256_set1_ps(1e-7f), s = _mm256_setzero_ps();
#define DECL(i) __m256 a##i = _mm256_set1_ps((float)i);
#define STEP(i) a##i = _mm256_fmadd_ps(a##i, m, c);
#define SUM(i) s = _mm256_add_ps(s, a##i);
    CHAINS12(DECL)
    for (int64_t i = 0; i < iters; i++) {
        CHAINS12(STEP)
    }
    CHAINS12(SUM)
    *sink = hsum(s);
    return (double)iters * 12 * 8 * 2;
#undef DECL
#undef STEP
#undef SUM
}

/* Twelve chains of vpmaddubsw (32 u8 x s8 products summed in pairs); each
 * result feeds the next as its signed operand, so no call is hoisted. */
static double peak_i8(int64_t iters, float *sink) {
    __m256i u = _mm256_set1_epi8(3), s = _mm256_setzero_si256();
#define DECL(i) __m256i a##i = _mm256_set1_epi8((char)i);
#define STEP(i) a##i = _mm256_maddubs_epi16(u, a##i);
#define SUM(i) s = _mm256_add_epi16(s, a##i);
    CHAINS12(DECL)
    for (int64_t i = 0; i < iters; i++) {
        CHAINS12(STEP)
    }
    CHAINS12(SUM)
    *sink = (float)_mm256_extract_epi16(s, 0);
    return (double)iters * 12 * 32 * 2;
#undef DECL
#undef STEP
#undef SUM
}

#define WOPS(T, SMALL_MAX) {T##_matvec, T##_matmul_small, T##_to_f32, T##_from_f32, SMALL_MAX}

static const pt_cpu_kernels avx2 = {
    .name = "avx2",
    .nr = PT_CPU_NR,
    .w = {[PT_F32] = WOPS(f32, 10), [PT_F16] = WOPS(f16, 20), [PT_BF16] = WOPS(bf16, 20)},
    .pack_panel = pack_panel,
    .gemm_tile = gemm_tile,
    .attn_scores = attn_scores,
    .attn_accum = attn_accum,
    .rmsnorm_row = rmsnorm_row,
    .add = add,
    .swiglu = swiglu,
    .exp_sum = exp_sum,
    .max = max,
    .scale = scale,
    .rope_norm = rope_norm,
    .rope_neox = rope_neox,
    .sum = sum,
    .peak_f32 = peak_f32,
    .peak_i8 = peak_i8,
};

const pt_cpu_kernels *pt_cpu_kernels_avx2(void) {
    return &avx2;
}
