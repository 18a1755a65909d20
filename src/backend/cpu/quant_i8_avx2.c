/*
 * quant_i8_avx2.c - prefill for GGUF q8_0 and q4_0 weights: a register-
 * tiled GEMM with int8 activations (AVX2).
 *
 * Prefill is compute-bound, and the int16 row kernels of quant_avx2.c read
 * 2 bytes of activation per multiply-add from L2 (one weight row meets a
 * tile of 4 tokens, so each token's codes are read once per row).  Here:
 *   - activations are quantized once per call to int8 in blocks of 32
 *     (d = max|x| / 127, q = rint(x / d): the Q8_0 rounding llama.cpp uses),
 *     a quarter of the f32 bytes and half of the int16 ones;
 *   - a register tile of TR weight rows x TT tokens: each decoded weight
 *     chunk serves TT tokens and each activation chunk TR rows, so a tile
 *     reads (TR + TT) * 32 bytes per TR * TT * 32 multiply-adds;
 *   - the products go through vpmaddubsw (u8 x s8 -> pairs summed to i16)
 *     with the sign trick: |w| * sign(x, w) = w * x.  |w| <= 128 and
 *     |x| <= 127, so a pair stays below 2^15 and never saturates;
 *   - cache blocking: a thread walks its rows in blocks of about
 *     BLOCK_BYTES of weights (L2), and inside a block all tokens, TT at a
 *     time; the TT tokens' codes (cols bytes each) stay in L1 while the
 *     block's rows go by.
 * Per 32-block the integer sum is exact; it is scaled once in f32 by
 * d_w * d_x.  Weight decoding (q4_0: nibbles, minus 8) is paid once per
 * TT tokens.
 *
 * Where AVX-512 VNNI is present, vpdpbusd would replace maddubs + madd (and
 * 512-bit registers double TR); such a kernel slots in beside this one
 * through pt_qk_i8_rows (quant_matmul.c), tested on a machine that has it.
 */
#include <immintrin.h>

#include "backend/cpu/quant_kernels.h"

#define AI static inline __attribute__((always_inline))
#define TT 4                       /* tokens per register tile */
#define TR 2                       /* weight rows per register tile */
#define BLOCK_BYTES (192 * 1024)   /* weight bytes per cache block (L2: 512 KiB) */

AI float f16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

AI float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* The 32 signed codes of a block, natural order.  q4_0: 16 bytes, low
 * nibbles are elements 0..15, high ones 16..31, each minus 8. */
AI __m256i codes(const uint8_t *blk, const int q4) {
    if (!q4) return _mm256_loadu_si256((const __m256i *)(blk + 2));
    __m128i v = _mm_loadu_si128((const __m128i *)(blk + 2));
    __m256i b = _mm256_inserti128_si256(_mm256_castsi128_si256(v), _mm_srli_epi16(v, 4), 1);
    return _mm256_sub_epi8(_mm256_and_si256(b, _mm256_set1_epi8(15)), _mm256_set1_epi8(8));
}

/* out[r][t] = row r . token t0 + t, for r < NR, t < NT. */
AI void tile(const uint8_t *row0, size_t row_bytes, const pt_qact8 *a, int t0, const int NT,
             const int NR, const int q4, float out[TR][TT]) {
    const size_t bb = q4 ? 18 : 34;
    const int8_t *x[TT];
    const float *dx[TT];
#pragma GCC unroll 4
    for (int t = 0; t < NT; t++) {
        x[t] = a->q + (size_t)(t0 + t) * (size_t)a->cols;
        dx[t] = a->d + (size_t)(t0 + t) * (size_t)a->n_chunks;
    }
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[TR][TT];
#pragma GCC unroll 2
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 4
        for (int t = 0; t < NT; t++) acc[r][t] = _mm256_setzero_ps();
    for (int64_t c = 0; c < a->n_chunks; c++) {
        __m256i w[TR], wa[TR];
        __m256 dw[TR];
#pragma GCC unroll 2
        for (int r = 0; r < NR; r++) {
            const uint8_t *blk = row0 + (size_t)r * row_bytes + bb * (size_t)c;
            w[r] = codes(blk, q4);
            wa[r] = _mm256_sign_epi8(w[r], w[r]); /* |w| as u8 (-128 -> 128) */
            dw[r] = _mm256_set1_ps(f16(blk));
        }
#pragma GCC unroll 4
        for (int t = 0; t < NT; t++) {
            __m256i xv = _mm256_load_si256((const __m256i *)(x[t] + 32 * c));
            __m256 d = _mm256_broadcast_ss(dx[t] + c);
#pragma GCC unroll 2
            for (int r = 0; r < NR; r++) {
                __m256i p = _mm256_maddubs_epi16(wa[r], _mm256_sign_epi8(xv, w[r]));
                p = _mm256_madd_epi16(p, ones);
                acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_mul_ps(d, dw[r]), acc[r][t]);
            }
        }
    }
#pragma GCC unroll 2
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 4
        for (int t = 0; t < NT; t++) out[r][t] = hsum(acc[r][t]);
}

AI void tile_any(const uint8_t *row0, size_t row_bytes, const pt_qact8 *a, int t0, int nt, int nr,
                 const int q4, float out[TR][TT]) {
#define T(NT, NR) tile(row0, row_bytes, a, t0, NT, NR, q4, out)
    if (nr == 2) {
        switch (nt) {
        case 4: T(4, 2); break;
        case 3: T(3, 2); break;
        case 2: T(2, 2); break;
        default: T(1, 2); break;
        }
    } else {
        switch (nt) {
        case 4: T(4, 1); break;
        case 3: T(3, 1); break;
        case 2: T(2, 1); break;
        default: T(1, 1); break;
        }
    }
#undef T
}

AI void rows_i8(const pt_weight *w, const pt_qact8 *a, float *y, int64_t r0, int64_t r1,
                const int q4) {
    size_t row_bytes = (size_t)(w->cols / 32) * (q4 ? 18 : 34);
    int64_t block = PT_MAX(TR, (int64_t)(BLOCK_BYTES / row_bytes) / TR * TR);
    for (int64_t rb = r0; rb < r1; rb += block) {
        int64_t re = PT_MIN(r1, rb + block);
        for (int t0 = 0; t0 < a->n; t0 += TT) {
            int nt = PT_MIN(TT, a->n - t0);
            for (int64_t r = rb; r < re; r += TR) {
                int nr = (int)PT_MIN(TR, re - r);
                float out[TR][TT];
                tile_any((const uint8_t *)w->data + (size_t)r * row_bytes, row_bytes, a, t0, nt, nr,
                         q4, out);
                for (int i = 0; i < nr; i++)
                    for (int t = 0; t < nt; t++)
                        y[(size_t)(t0 + t) * (size_t)w->rows + (size_t)(r + i)] = out[i][t];
            }
        }
    }
}

static void rows_q8_0(const pt_weight *w, const pt_qact8 *a, float *y, int64_t r0, int64_t r1) {
    rows_i8(w, a, y, r0, r1, 0);
}

static void rows_q4_0(const pt_weight *w, const pt_qact8 *a, float *y, int64_t r0, int64_t r1) {
    rows_i8(w, a, y, r0, r1, 1);
}

pt_qk_rows8_fn pt_qk_avx2_rows8(const pt_weight *w) {
    switch (w->dtype) {
    case PT_Q8_0: return rows_q8_0;
    case PT_Q4_0: return rows_q4_0;
    default: return NULL;
    }
}
