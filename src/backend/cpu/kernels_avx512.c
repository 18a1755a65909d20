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
 *   - pack_panel and gemm_tile (prefill): panels of 32 rows and a 6 x 32
 *     tile in 12 zmm accumulators; each output is the same chain of FMAs
 *     in the same order as AVX2's, so prefill results equal the AVX2 set's
 *     bit for bit;
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

INLINE void matvec_body(load16_fn ld, float *y, const void *w, size_t rb, int64_t nr,
                        const float *x, int64_t cols, const int ESIZE) {
    const int64_t c16 = cols & ~(int64_t)15;
    const __mmask16 all = 0xffff, tail = (__mmask16)((1u << (cols & 15)) - 1);
    int64_t r = 0;
    for (; r + 8 <= nr; r += 8) {
        const char *wr = (const char *)w + r * rb;
        __m512 acc[8];
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++)
            acc[i] = _mm512_setzero_ps();
        for (int64_t k = 0; k < c16; k += 16) {
            /* one line per row every 64 bytes: every step for f32, every
             * other one for f16/bf16 (32 bytes per step) */
            if (ESIZE == 4 || (k & 31) == 0) {
#pragma GCC unroll 8
                for (int i = 0; i < 8; i++)
                    prefetch_ahead(wr + i * rb, rb, k, ESIZE, 8);
            }
            __m512 xv = _mm512_loadu_ps(x + k);
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++)
                acc[i] = _mm512_fmadd_ps(ld(wr + i * rb, k, all), xv, acc[i]);
        }
        if (tail) {
            __m512 xv = _mm512_maskz_loadu_ps(tail, x + c16);
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++)
                acc[i] = _mm512_fmadd_ps(ld(wr + i * rb, c16, tail), xv, acc[i]);
        }
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++)
            y[r + i] = _mm512_reduce_add_ps(acc[i]);
    }
    for (; r < nr; r++) { /* the last nr % 8 rows, one at a time */
        const char *w0 = (const char *)w + r * rb;
        __m512 a0 = _mm512_setzero_ps(), a1 = a0;
        int64_t k = 0;
        for (; k + 32 <= c16; k += 32) {
            a0 = _mm512_fmadd_ps(ld(w0, k, all), _mm512_loadu_ps(x + k), a0);
            a1 = _mm512_fmadd_ps(ld(w0, k + 16, all), _mm512_loadu_ps(x + k + 16), a1);
        }
        for (; k < c16; k += 16)
            a0 = _mm512_fmadd_ps(ld(w0, k, all), _mm512_loadu_ps(x + k), a0);
        if (tail) a1 = _mm512_fmadd_ps(ld(w0, c16, tail), _mm512_maskz_loadu_ps(tail, x + c16), a1);
        y[r] = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
    }
}

static void f32_matvec(float *y, const void *w, size_t rb, int64_t nr, const float *x,
                       int64_t cols) {
    matvec_body(f32_load16, y, w, rb, nr, x, cols, 4);
}
static void f16_matvec(float *y, const void *w, size_t rb, int64_t nr, const float *x,
                       int64_t cols) {
    matvec_body(f16_load16, y, w, rb, nr, x, cols, 2);
}
static void bf16_matvec(float *y, const void *w, size_t rb, int64_t nr, const float *x,
                        int64_t cols) {
    matvec_body(bf16_load16, y, w, rb, nr, x, cols, 2);
}

/* ---- packed GEMM: panels of 32 rows, a 6 x 32 tile ------------------------------
 * The AVX2 tile is 6 tokens x 16 rows in 12 ymm accumulators.  In zmm, 16
 * rows are one register and a 6 x 16 tile leaves only 6 FMA chains, fewer
 * than latency x units (4 x 2); panels of NR = 32 rows give 12 chains
 * again: per k, two panel loads, 6 broadcasts, 12 FMAs.  Lane j of token
 * t's accumulator runs the same FMAs in the same order as in the AVX2 tile
 * (k in order within a column block, blocks added in order), so prefill
 * results equal the AVX2 set's bit for bit. */
#define NR PT_CPU_NR_MAX
#define NV (NR / 16)

typedef __m256 (*load8_fn)(const void *base, int64_t i);
INLINE __m256 f32_load8(const void *p, int64_t i) {
    return _mm256_loadu_ps((const float *)p + i);
}
INLINE __m256 f16_load8(const void *p, int64_t i) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i)));
}
INLINE __m256 bf16_load8(const void *p, int64_t i) {
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)p + i));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
typedef float (*load1_fn)(const void *base, int64_t i);
INLINE float f32_load1(const void *p, int64_t i) {
    return ((const float *)p)[i];
}
INLINE float f16_load1(const void *p, int64_t i) {
    return _cvtsh_ss(((const uint16_t *)p)[i]);
}
INLINE float bf16_load1(const void *p, int64_t i) {
    return pt_bf16_to_f32(((const uint16_t *)p)[i]);
}

/* An 8 x 8 block: rows src[0..7] at column k to 8 panel columns, ldd apart. */
INLINE void transpose8(float *dst, int64_t ldd, const void *const *src, int64_t k, load8_fn load) {
    __m256 r[8], t[8], u[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++)
        r[i] = load(src[i], k);
#pragma GCC unroll 4
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
#pragma GCC unroll 2
    for (int i = 0; i < 8; i += 4) {
        u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
        u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
        u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        _mm256_storeu_ps(dst + i * ldd, _mm256_permute2f128_ps(u[i], u[i + 4], 0x20));
        _mm256_storeu_ps(dst + (i + 4) * ldd, _mm256_permute2f128_ps(u[i], u[i + 4], 0x31));
    }
}

/* Rows j < nr of w converted and transposed straight into the panel; the
 * missing rows read zero (zero bytes in every float format). */
INLINE void pack_direct(float *panel, const void *w, size_t row_bytes, int nr, int kb, float *zero,
                        load8_fn load8, load1_fn load1) {
    const void *src[NR];
    if (nr < NR) memset(zero, 0, (size_t)kb * sizeof(float));
    for (int j = 0; j < NR; j++)
        src[j] = j < nr ? (const char *)w + (size_t)j * row_bytes : (const void *)zero;
    int k = 0;
    for (; k + 8 <= kb; k += 8) {
#pragma GCC unroll 4
        for (int v = 0; v < NR / 8; v++)
            transpose8(panel + k * NR + 8 * v, NR, src + 8 * v, k, load8);
    }
    for (; k < kb; k++) /* a matrix's last columns, fewer than 8 */
        for (int j = 0; j < NR; j++)
            panel[k * NR + j] = load1(src[j], k);
}

static void pack_panel(float *panel, const pt_cpu_wops *wo, const void *w, size_t row_bytes, int nr,
                       int kb, float *tmp) {
    if (wo->matvec == f32_matvec)
        pack_direct(panel, w, row_bytes, nr, kb, tmp, f32_load8, f32_load1);
    else if (wo->matvec == f16_matvec)
        pack_direct(panel, w, row_bytes, nr, kb, tmp, f16_load8, f16_load1);
    else if (wo->matvec == bf16_matvec)
        pack_direct(panel, w, row_bytes, nr, kb, tmp, bf16_load8, bf16_load1);
    else { /* any other format: rows through tmp (nr < NR leaves its last row for the zeros) */
        for (int j = 0; j < nr; j++)
            wo->to_f32(tmp + (size_t)j * kb, (const char *)w + (size_t)j * row_bytes, kb);
        pack_direct(panel, tmp, (size_t)kb * sizeof(float), nr, kb, tmp + (size_t)(NR - 1) * kb,
                    f32_load8, f32_load1);
    }
}

INLINE void tile_body(float *y, int64_t ldy, const float *xp, const float *p, int kb, int nr,
                      int accumulate, const int NT) {
    __m512 c[PT_CPU_MR][NV];
#pragma GCC unroll 8
    for (int t = 0; t < NT; t++)
#pragma GCC unroll 2
        for (int v = 0; v < NV; v++)
            c[t][v] = _mm512_setzero_ps();
    for (int k = 0; k < kb; k++) {
        __m512 b[NV];
#pragma GCC unroll 2
        for (int v = 0; v < NV; v++)
            b[v] = _mm512_load_ps(p + k * NR + 16 * v);
#pragma GCC unroll 8
        for (int t = 0; t < NT; t++) {
            __m512 a = _mm512_set1_ps(xp[k * PT_CPU_MR + t]);
#pragma GCC unroll 2
            for (int v = 0; v < NV; v++)
                c[t][v] = _mm512_fmadd_ps(a, b[v], c[t][v]);
        }
    }
    __mmask16 m[NV];
#pragma GCC unroll 2
    for (int v = 0; v < NV; v++) {
        int left = nr - 16 * v;
        m[v] = left >= 16  ? (__mmask16)0xffff
               : left <= 0 ? (__mmask16)0
                           : (__mmask16)((1u << left) - 1);
    }
#pragma GCC unroll 8
    for (int t = 0; t < NT; t++) {
        float *yt = y + t * ldy;
#pragma GCC unroll 2
        for (int v = 0; v < NV; v++) {
            if (accumulate)
                c[t][v] = _mm512_add_ps(c[t][v], _mm512_maskz_loadu_ps(m[v], yt + 16 * v));
            _mm512_mask_storeu_ps(yt + 16 * v, m[v], c[t][v]);
        }
    }
}

static void gemm_tile(float *y, int64_t ldy, const float *xp, const float *panel, int kb, int nt,
                      int nr, int accumulate) {
    switch (nt) {
    case 1:
        tile_body(y, ldy, xp, panel, kb, nr, accumulate, 1);
        break;
    case 2:
        tile_body(y, ldy, xp, panel, kb, nr, accumulate, 2);
        break;
    case 3:
        tile_body(y, ldy, xp, panel, kb, nr, accumulate, 3);
        break;
    case 4:
        tile_body(y, ldy, xp, panel, kb, nr, accumulate, 4);
        break;
    case 5:
        tile_body(y, ldy, xp, panel, kb, nr, accumulate, 5);
        break;
    default:
        tile_body(y, ldy, xp, panel, kb, nr, accumulate, PT_CPU_MR);
        break;
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
    for (; i + 16 <= n; i += 16)
        s0 = _mm512_add_ps(s0, _mm512_loadu_ps(x + i));
    if (i < n)
        s1 = _mm512_add_ps(s1, _mm512_maskz_loadu_ps((__mmask16)((1u << (n - i)) - 1), x + i));
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
    avx512.nr = NR;
    avx512.pack_panel = pack_panel;
    avx512.gemm_tile = gemm_tile;
    avx512.sum = sum;
    avx512.peak_f32 = peak_f32;
    avx512.peak_i8 = peak_i8;
}

const pt_cpu_kernels *pt_cpu_kernels_avx512(void) {
    pthread_once(&once, init);
    return &avx512;
}
