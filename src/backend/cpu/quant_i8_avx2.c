/*
 * quant_i8_avx2.c - prefill for GGUF q8_0 and q4_0 weights: a GEMM with
 * int8 activations on AVX2, weights repacked into panels of 8 rows.
 *
 * Prefill is compute-bound.  The int16 row kernels of quant_avx2.c read
 * 2 bytes of activation per multiply-add from L2 and finish every 32-wide
 * block of every (row, token) pair with a convert, a scale and a
 * horizontal sum.  Here:
 *   - activations are quantized once per call to int8 in blocks of 32
 *     (d = max|x| / 127, q = rint(x / d): the Q8_0 rounding llama.cpp uses);
 *   - the weights of 8 rows and KC blocks are repacked into a panel on the
 *     thread's stack (L1), once per pass over all tokens: for each block
 *     and each group g of 4 columns, one 32-byte vector holds the 4 codes
 *     of row j in its 32-bit lane j.  A token's 4 codes of group g,
 *     broadcast to every lane, meet 8 rows in one vpmaddubsw, and a
 *     block's sums for 8 rows land in the 8 lanes of one register: one
 *     convert and one FMA (by the 8 rows' scales times the token's) per
 *     block, token and 8 rows, and no horizontal sums;
 *   - a register tile of TT tokens x 8 rows; the panel stays in L1 while
 *     every token of the call goes by.
 * Products use vpmaddubsw (u8 x s8, pairs summed to i16):
 *   q4_0: the unsigned nibbles c in [0, 15] against the signed activation
 *     codes; the -8 offset is -8 * d_w * (d_x * sum of the block's codes),
 *     one FMA per block.  A pair is at most 2 * 15 * 127 = 3810, so the 8
 *     groups of a block add up in i16 (<= 30480) before one vpmaddwd;
 *   - q8_0: the sign trick |w| * sign(x, w) = w * x (|w| <= 128, |x| <=
 *     127: a pair stays below 2^15); pairs of groups cannot share an i16
 *     sum, so each goes through vpmaddwd.
 * Every block's integer sum is exact; it is scaled once in f32.
 *
 * Where AVX-512 VNNI is present, vpdpbusd would replace maddubs + madd and
 * 512-bit registers hold 16 rows; such a kernel slots in beside this one
 * through pt_qk_avx2_rows8's table, tested on a machine that has it.
 */
#include <immintrin.h>

#include "backend/cpu/quant_kernels.h"

#define AI static inline __attribute__((always_inline))
#define TT 4  /* tokens per register tile */
#define NR 8  /* rows per panel: one per 32-bit lane */
#define KC 32 /* blocks of 32 columns per panel: 1024 columns */
/* Keeps a sum a chain in a register: without it GCC reassociates the
 * integer adds, computes every product first and spills them. */
#define CHAIN(v) __asm__("" : "+x"(v))

/* One block of a panel: codes[g] holds group g (columns 4g..4g+3) of the
 * 8 rows, row j in lane j; abs is |codes| (q8_0 only); d the rows' scales. */
typedef struct pblock {
    __m256i codes[8];
    __m256i abs[8];
    float d[NR];
} pblock;

AI float f16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* The 32 codes of a block, natural order.  q4_0: unsigned nibbles, low
 * ones are elements 0..15, high ones 16..31; q8_0: signed bytes. */
AI __m256i codes(const uint8_t *blk, const int q4) {
    if (!q4) return _mm256_loadu_si256((const __m256i *)(blk + 2));
    __m128i v = _mm_loadu_si128((const __m128i *)(blk + 2));
    __m256i b = _mm256_inserti128_si256(_mm256_castsi128_si256(v), _mm_srli_epi16(v, 4), 1);
    return _mm256_and_si256(b, _mm256_set1_epi8(15));
}

/* Transposes 8 vectors of 8 dwords: out[g] lane j = in[j] lane g. */
AI void transpose8(__m256i v[8]) {
    __m256i t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_epi32(v[i], v[i + 1]);
        t[i + 1] = _mm256_unpackhi_epi32(v[i], v[i + 1]);
    }
    for (int i = 0; i < 8; i += 4)
        for (int k = 0; k < 2; k++) {
            u[i + k] = _mm256_unpacklo_epi64(t[i + k], t[i + 2 + k]);
            u[i + 2 + k] = _mm256_unpackhi_epi64(t[i + k], t[i + 2 + k]);
        }
    /* u[0..3] hold rows 0..3 of groups {0,4}, {2,6}, {1,5}, {3,7} (low lane: g < 4) */
    static const int order[4] = {0, 2, 1, 3};
    for (int k = 0; k < 4; k++) {
        v[order[k]] = _mm256_permute2x128_si256(u[k], u[4 + k], 0x20);
        v[order[k] + 4] = _mm256_permute2x128_si256(u[k], u[4 + k], 0x31);
    }
}

/* Packs blocks [c0, c0 + kc) of rows [r, r + nr) into p; rows past nr are
 * zero. */
AI void pack(pblock *p, const uint8_t *w, size_t row_bytes, int nr, int64_t c0, int kc,
             const int q4) {
    const size_t bb = q4 ? 18 : 34;
    for (int c = 0; c < kc; c++) {
        __m256i v[8];
        for (int j = 0; j < NR; j++) {
            if (j < nr) {
                const uint8_t *blk = w + (size_t)j * row_bytes + bb * (size_t)(c0 + c);
                v[j] = codes(blk, q4);
                p[c].d[j] = f16(blk);
            } else {
                v[j] = _mm256_setzero_si256();
                p[c].d[j] = 0;
            }
        }
        transpose8(v);
        for (int g = 0; g < 8; g++) {
            p[c].codes[g] = v[g];
            if (!q4) p[c].abs[g] = _mm256_sign_epi8(v[g], v[g]); /* -128 -> 128 as u8 */
        }
    }
}

/* Group g's 4 codes of token row x broadcast to every lane. */
AI __m256i bcast4(const int8_t *x) {
    int32_t v;
    memcpy(&v, x, 4);
    return _mm256_set1_epi32(v);
}

/* acc[t] (8 rows) += the panel's kc blocks . token t0 + t's blocks c0.. */
AI void tile(const pblock *p, int kc, const pt_qact8 *a, int t0, int64_t c0, const int NT,
             const int q4, __m256 acc[TT]) {
    const __m256i ones = _mm256_set1_epi16(1);
    const int8_t *x[TT];
    const float *dx[TT], *ds[TT];
#pragma GCC unroll 4
    for (int t = 0; t < NT; t++) {
        x[t] = a->q + (size_t)(t0 + t) * (size_t)a->cols + 32 * (size_t)c0;
        dx[t] = a->d + (size_t)(t0 + t) * (size_t)a->n_chunks + c0;
        ds[t] = a->ds + (size_t)(t0 + t) * (size_t)a->n_chunks + c0;
    }
    for (int c = 0; c < kc; c++) {
        __m256i isum[TT];
        const pblock *b = &p[c];
        /* Token by token, so each isum is one chain: interleaving the
         * tokens' products makes GCC spill them all before adding. */
#pragma GCC unroll 4
        for (int t = 0; t < NT; t++) {
            const int8_t *xt = x[t] + 32 * c;
            if (q4) {
                __m256i s = _mm256_maddubs_epi16(_mm256_load_si256(&b->codes[0]), bcast4(xt));
#pragma GCC unroll 8
                for (int g = 1; g < 8; g++)
                    s = _mm256_add_epi16(s, _mm256_maddubs_epi16(_mm256_load_si256(&b->codes[g]),
                                                                  bcast4(xt + 4 * g)));
                isum[t] = _mm256_madd_epi16(s, ones);
            } else {
                __m256i s = _mm256_setzero_si256();
#pragma GCC unroll 8
                for (int g = 0; g < 8; g++) {
                    __m256i p = _mm256_maddubs_epi16(_mm256_load_si256(&b->abs[g]),
                                                     _mm256_sign_epi8(bcast4(xt + 4 * g), b->codes[g]));
                    s = _mm256_add_epi32(s, _mm256_madd_epi16(p, ones));
                    CHAIN(s);
                }
                isum[t] = s;
            }
        }
        __m256 dw = _mm256_load_ps(b->d);
        __m256 dw8 = q4 ? _mm256_mul_ps(dw, _mm256_set1_ps(8)) : dw;
#pragma GCC unroll 4
        for (int t = 0; t < NT; t++) {
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]),
                                     _mm256_mul_ps(dw, _mm256_broadcast_ss(dx[t] + c)), acc[t]);
            if (q4) acc[t] = _mm256_fnmadd_ps(dw8, _mm256_broadcast_ss(ds[t] + c), acc[t]);
        }
    }
}

/* y[t][r..r+nr) (+)= the tile's lanes. */
AI void store(float *y, int64_t ldy, __m256 v, int nr, bool add) {
    float tmp[NR];
    if (nr == NR) {
        if (add) v = _mm256_add_ps(v, _mm256_loadu_ps(y));
        _mm256_storeu_ps(y, v);
        return;
    }
    _mm256_storeu_ps(tmp, v);
    for (int j = 0; j < nr; j++) y[j] = add ? y[j] + tmp[j] : tmp[j];
    (void)ldy;
}

AI void rows_i8(const pt_weight *w, const pt_qact8 *a, float *y, int64_t r0, int64_t r1,
                const int q4) {
    _Alignas(32) pblock panel[KC];
    size_t row_bytes = (size_t)(w->cols / 32) * (q4 ? 18 : 34);
    for (int64_t r = r0; r < r1; r += NR) {
        int nr = (int)PT_MIN(NR, r1 - r);
        for (int64_t c0 = 0; c0 < a->n_chunks; c0 += KC) {
            int kc = (int)PT_MIN(KC, a->n_chunks - c0);
            pack(panel, (const uint8_t *)w->data + (size_t)r * row_bytes, row_bytes, nr, c0, kc, q4);
            for (int t0 = 0; t0 < a->n; t0 += TT) {
                int nt = PT_MIN(TT, a->n - t0);
                __m256 acc[TT];
                for (int t = 0; t < TT; t++) acc[t] = _mm256_setzero_ps();
                switch (nt) {
                case 4: tile(panel, kc, a, t0, c0, 4, q4, acc); break;
                case 3: tile(panel, kc, a, t0, c0, 3, q4, acc); break;
                case 2: tile(panel, kc, a, t0, c0, 2, q4, acc); break;
                default: tile(panel, kc, a, t0, c0, 1, q4, acc); break;
                }
                for (int t = 0; t < nt; t++)
                    store(y + (size_t)(t0 + t) * (size_t)w->rows + (size_t)r, w->rows, acc[t], nr, c0 > 0);
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
