/*
 * quant_i8_avx2.c - prefill for GGUF q8_0, q4_0, q4_k, q5_k, q6_k, MXFP4 and
 * MLX affine 4-bit weights: a GEMM with int8 activations on AVX2, weights
 * repacked into panels of 8 rows (and int8 decode rows, at the end).
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
 * q6_k is read like q8_0 (signed codes q - 32, the sign trick; |w| <= 32
 * lets 4 groups share an i16 sum), with a second mul for the block's
 * columns 16..31 (its int8 scales cover 16 columns).
 * MXFP4 is read like q8_0 (its codes, twice the e2m1 value, are integers
 * in [-12, 12]: quant_i8.h), and |w| <= 12 lets all 8 groups share one
 * i16 sum; its mul is half the e8m0 scale and it has no add.
 * Every other format is read as unsigned codes c with, per block of 32,
 * weight = mul * c + add (q4_0: d, -8d; q4_k, q5_k: d * sc, -dmin * m;
 * affine: the group's scale and bias).  Products use vpmaddubsw (u8 x s8,
 * pairs summed to i16):
 *   unsigned codes against the signed activation codes; add meets the
 *     block's d_x * sum of codes, one FMA per block.  A 4-bit pair is at
 *     most 2 * 15 * 127 = 3810, so the 8 groups of a block add up in i16
 *     (<= 30480) before one vpmaddwd; 5-bit pairs (7874) go 4 groups at a
 *     time;
 *   - q8_0: the sign trick |w| * sign(x, w) = w * x (|w| <= 128, |x| <=
 *     127: a pair stays below 2^15); pairs of groups cannot share an i16
 *     sum, so each goes through vpmaddwd.
 * Every block's integer sum is exact; it is scaled once in f32.
 *
 * Where AVX-512 VNNI is present, quant_i8_avx512.c runs the same kernels
 * with vpdpbusd in place of maddubs + madd and 16 rows per zmm panel; its
 * outputs equal these bit for bit (tests/quant/test_kernels.c).
 */
#include "backend/cpu/quant_i8.h"

#define TT 4  /* tokens per register tile */
#define NR 8  /* rows per panel: one per 32-bit lane */
#define KC 32 /* blocks of 32 columns per panel: 1024 columns */
/* Keeps a sum a chain in a register: without it GCC reassociates the
 * integer adds, computes every product first and spills them. */
#define CHAIN(v) __asm__("" : "+x"(v))

/* One block of a panel: codes[g] holds group g (columns 4g..4g+3) of the
 * 8 rows, row j in lane j; abs is |codes| (q8_0 only); weight = mul * code
 * + add for row j's lane. */
typedef struct pblock {
    __m256i codes[8];
    __m256i abs[8];
    float mul[NR], add[NR];
    float mul2[NR]; /* q6_k: mul of columns 16..31 (mul is 0..15's) */
} pblock;

/* Packs blocks [c0, c0 + kc) of rows [r, r + nr) of w into p; rows past
 * nr are zero. */
AI void pack(pblock *p, const pt_weight *w, size_t row_bytes, int64_t r, int nr, int64_t c0,
             int kc, const int F) {
    if (F == F_Q4_0X8) { /* the layout is the panel's, nibbles still packed: r % 8 == 0, nr == 8 */
        const uint8_t *u = (const uint8_t *)w->data + (size_t)((r / 8) * (w->cols / 32) + c0) * 144;
        const __m256i m = _mm256_set1_epi8(15);
        for (int c = 0; c < kc; c++, u += 144) {
            __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)u));
            _mm256_storeu_ps(p[c].mul, d);
            _mm256_storeu_ps(p[c].add, _mm256_mul_ps(d, _mm256_set1_ps(-8)));
            for (int v = 0; v < 4; v++) {
                __m256i q = _mm256_loadu_si256((const __m256i *)(u + 16 + 32 * v));
                p[c].codes[v] = _mm256_and_si256(q, m);
                p[c].codes[v + 4] = _mm256_and_si256(_mm256_srli_epi16(q, 4), m);
            }
        }
        return;
    }
    for (int c = 0; c < kc; c++) {
        __m256i v[8];
        for (int j = 0; j < NR; j++) {
            if (j < nr) {
                const uint8_t *row = (const uint8_t *)w->data + (size_t)(r + j) * row_bytes;
                v[j] = decode(w, row, r + j, c0 + c, F, &p[c].mul[j], &p[c].add[j], &p[c].mul2[j]);
            } else {
                v[j] = _mm256_setzero_si256();
                p[c].mul[j] = p[c].add[j] = p[c].mul2[j] = 0;
            }
        }
        transpose8(v);
        for (int g = 0; g < 8; g++) {
            p[c].codes[g] = v[g];
            if (F == F_Q8_0 || F == F_Q6_K || F == F_MXFP4)
                p[c].abs[g] = _mm256_sign_epi8(v[g], v[g]); /* -128 -> 128 as u8 */
        }
    }
}

/* acc[t] (8 rows) += the panel's kc blocks . token t0 + t's blocks c0.. */
AI void tile(const pblock *p, int kc, const pt_qact8 *a, int t0, int64_t c0, const int NT,
             const int F, __m256 acc[TT]) {
    /* groups whose u8 x s8 pairs fit one i16 sum: 8 for 4-bit codes, 4 for 5-bit */
    const int per_i16 = F == F_Q5_K ? 4 : 8;
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
        __m256i isum[TT], isum2[TT];
        const pblock *b = &p[c];
        /* Token by token, so each isum is one chain: interleaving the
         * tokens' products makes GCC spill them all before adding. */
#pragma GCC unroll 4
        for (int t = 0; t < NT; t++) {
            const int8_t *xt = x[t] + 32 * c;
            if (F == F_Q6_K) { /* |w| <= 32: 4 groups per i16 sum; halves kept apart */
                __m256i sh[2];
#pragma GCC unroll 2
                for (int h = 0; h < 2; h++) {
                    __m256i s16 = _mm256_setzero_si256();
#pragma GCC unroll 4
                    for (int g = 4 * h; g < 4 * h + 4; g++)
                        s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(
                                                        _mm256_load_si256(&b->abs[g]),
                                                        _mm256_sign_epi8(bcast4(xt + 4 * g), b->codes[g])));
                    sh[h] = _mm256_madd_epi16(s16, ones);
                }
                isum[t] = sh[0];
                isum2[t] = sh[1];
            } else if (F == F_MXFP4) { /* |w| <= 12: a pair <= 3048, all 8 groups in one i16 sum */
                __m256i s16 = _mm256_setzero_si256();
#pragma GCC unroll 8
                for (int g = 0; g < 8; g++)
                    s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(_mm256_load_si256(&b->abs[g]),
                                                                    _mm256_sign_epi8(bcast4(xt + 4 * g), b->codes[g])));
                isum[t] = _mm256_madd_epi16(s16, ones);
            } else if (F != F_Q8_0) {
                __m256i s = _mm256_setzero_si256();
#pragma GCC unroll 2
                for (int h = 0; h < 8; h += per_i16) {
                    __m256i s16 = _mm256_maddubs_epi16(_mm256_load_si256(&b->codes[h]), bcast4(xt + 4 * h));
#pragma GCC unroll 8
                    for (int g = h + 1; g < h + per_i16; g++)
                        s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(_mm256_load_si256(&b->codes[g]),
                                                                        bcast4(xt + 4 * g)));
                    s = h ? _mm256_add_epi32(s, _mm256_madd_epi16(s16, ones)) : _mm256_madd_epi16(s16, ones);
                }
                isum[t] = s;
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
        __m256 mul = _mm256_load_ps(b->mul), add = _mm256_load_ps(b->add);
#pragma GCC unroll 4
        for (int t = 0; t < NT; t++) {
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]),
                                     _mm256_mul_ps(mul, _mm256_broadcast_ss(dx[t] + c)), acc[t]);
            if (F == F_Q6_K)
                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum2[t]),
                                         _mm256_mul_ps(_mm256_load_ps(b->mul2), _mm256_broadcast_ss(dx[t] + c)),
                                         acc[t]);
            else if (F != F_Q8_0 && F != F_MXFP4)
                acc[t] = _mm256_fmadd_ps(add, _mm256_broadcast_ss(ds[t] + c), acc[t]);
        }
    }
}

/* y[t][r..r+nr) (+)= the tile's lanes. */
AI void store(float *y, __m256 v, int nr, bool add) {
    float tmp[NR];
    if (nr == NR) {
        if (add) v = _mm256_add_ps(v, _mm256_loadu_ps(y));
        _mm256_storeu_ps(y, v);
        return;
    }
    _mm256_storeu_ps(tmp, v);
    for (int j = 0; j < nr; j++) y[j] = add ? y[j] + tmp[j] : tmp[j];
}

AI void rows_i8(const pt_weight *w, const pt_qact8 *a, float *y, int64_t r0, int64_t r1,
                const int F) {
    _Alignas(32) pblock panel[KC];
    size_t row_bytes = row_bytes_of(w);
    for (int64_t r = r0; r < r1; r += NR) {
        int nr = (int)PT_MIN(NR, r1 - r);
        for (int64_t c0 = 0; c0 < a->n_chunks; c0 += KC) {
            int kc = (int)PT_MIN(KC, a->n_chunks - c0);
            pack(panel, w, row_bytes, r, nr, c0, kc, F);
            for (int t0 = 0; t0 < a->n; t0 += TT) {
                int nt = PT_MIN(TT, a->n - t0);
                __m256 acc[TT];
                for (int t = 0; t < TT; t++) acc[t] = _mm256_setzero_ps();
                switch (nt) {
                case 4: tile(panel, kc, a, t0, c0, 4, F, acc); break;
                case 3: tile(panel, kc, a, t0, c0, 3, F, acc); break;
                case 2: tile(panel, kc, a, t0, c0, 2, F, acc); break;
                default: tile(panel, kc, a, t0, c0, 1, F, acc); break;
                }
                for (int t = 0; t < nt; t++)
                    store(y + (size_t)(t0 + t) * (size_t)w->rows + (size_t)r, acc[t], nr, c0 > 0);
            }
        }
    }
}

#define ROWS(name, F)                                                                              \
    static void name(const pt_weight *w, const pt_qact8 *a, float *y, int64_t r0, int64_t r1) {    \
        rows_i8(w, a, y, r0, r1, F);                                                               \
    }
ROWS(rows_q8_0, F_Q8_0)
ROWS(rows_q4_0, F_Q4_0)
ROWS(rows_q4_k, F_Q4_K)
ROWS(rows_q5_k, F_Q5_K)
ROWS(rows_aff4, F_AFF4)
ROWS(rows_q6_k, F_Q6_K)
ROWS(rows_q4_0x8, F_Q4_0X8)
ROWS(rows_mxfp4, F_MXFP4)

pt_qk_rows8_fn pt_qk_avx2_rows8(const pt_weight *w) {
    if (w->layout == PT_LAYOUT_Q4_0X8) return rows_q4_0x8;
    switch (w->dtype) {
    case PT_Q8_0: return rows_q8_0;
    case PT_Q4_0: return rows_q4_0;
    case PT_Q4_K: return rows_q4_k;
    case PT_Q5_K: return rows_q5_k;
    case PT_Q6_K: return rows_q6_k;
    case PT_AFFINE: return w->bits == 4 ? rows_aff4 : NULL; /* groups of 32, 64, 128 */
    case PT_MXFP4: return rows_mxfp4;
    default: return NULL;
    }
}

/* ---- decode: int8 activations, rows in their file layout --------------------------
 *
 * Below PT_QK_I8_MIN_TOKENS tokens the panel repack costs more than it
 * saves, and decode streams every weight byte once, so these kernels read
 * the rows where they lie, VR = 4 rows side by side (4 streams in flight,
 * one load of each token's block shared by the 4 rows).  Per block of 32
 * columns and row: a broadcast load, a shift and a mask (q4_0), vpmaddubsw
 * and vpmaddwd give the block's exact integer sum in 8 lanes; then, once
 * for the 4 rows, 9 shuffles and adds put their sums side by side, and one
 * convert and one FMA scale them by (the rows' 4 f16 scales, gathered into
 * one word by integer ops and widened at once) x d_x.  That is ~9 vector
 * ops per 32 weights and row, against ~13.5 with a scalar scale, a
 * convert and an FMA per row, and ~15 in the int16 kernel.
 *   q4_0: the unsigned nibbles c meet the signed activation codes; the
 *     offset -8 comes off as madd(maddubs(8, x), 1), computed once per
 *     block and token for all rows: the block's integer sum is exact;
 *   q8_0: the sign trick of the GEMM above.
 * The next group of 4 rows is prefetched once per cache line while this
 * one is read, as the f16 matvec and the int16 rows do: 4 streams rb bytes
 * apart, and the next group starts cold otherwise. */
#define VR 4 /* rows per pass */

/* nibbles32(p) by a broadcast and a per-lane shift (no lane insert). */
AI __m256i q4_codes(const uint8_t *p) {
    __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)p));
    v = _mm256_srlv_epi32(v, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4));
    return _mm256_and_si256(v, _mm256_set1_epi8(15));
}

/* lane j (and j + 4) of the result: the sum of the 8 lanes of s[j]'s block
 * sums' halves: 4 rows' integer sums side by side in 9 shuffles and adds,
 * so one convert, one scale vector and one FMA serve the 4 rows. */
AI __m256i rows4(const __m256i s[4]) {
    __m256i a = _mm256_add_epi32(_mm256_unpacklo_epi32(s[0], s[1]), _mm256_unpackhi_epi32(s[0], s[1]));
    __m256i b = _mm256_add_epi32(_mm256_unpacklo_epi32(s[2], s[3]), _mm256_unpackhi_epi32(s[2], s[3]));
    return _mm256_add_epi32(_mm256_unpacklo_epi64(a, b), _mm256_unpackhi_epi64(a, b));
}

/* The 4 rows' block scales, gathered as below, as f32 in both halves. */
AI __m256 scales4(uint64_t h, const int F) {
    if (F != F_MXFP4) return _mm256_cvtph_ps(_mm_set1_epi64x((long long)h));
    __m128 s = e8m0_half4(_mm_cvtepu8_epi32(_mm_cvtsi32_si128((int)h)));
    return _mm256_insertf128_ps(_mm256_castps128_ps256(s), s, 1);
}

/* y[t][r + j] for j < NR_ (rows r.. of w, rb bytes apart) and every token.
 * The 4 rows' scales of a block (f16, or MXFP4's e8m0 bytes) are gathered
 * into one 64-bit word by integer ops (which leave the vector pipes to the
 * dot products) and widened once; rows j >= NR_ are read as zero.  MXFP4
 * goes as q4_0 does, its nibbles looked up as twice their value plus 12
 * (unsigned) and the offset 12 taken off as q4_0's 8. */
AI void vec_rows(const pt_weight *w, const pt_qact8 *a, float *y, int64_t r, size_t rb,
                 const int NR_, const int F, bool prefetch) {
    const int bb = F == F_Q8_0 ? 34 : F == F_MXFP4 ? 17 : 18;
    const uint8_t *row0 = (const uint8_t *)w->data + (size_t)r * rb;
    const __m256i ones = _mm256_set1_epi16(1), bias = _mm256_set1_epi8(F == F_MXFP4 ? 12 : 8);
    const __m256i lut = _mm256_setr_epi8(MXFP4_BIASED, MXFP4_BIASED);
    for (int t = 0; t < a->n; t++) {
        const int8_t *xq = a->q + (size_t)t * (size_t)a->cols;
        const float *dx = a->d + (size_t)t * (size_t)a->n_chunks;
        __m256 acc = _mm256_setzero_ps();
        for (int64_t c = 0; c < a->n_chunks; c++) {
            const uint8_t *blk = row0 + (size_t)bb * (size_t)c;
            if (prefetch && t == 0 && ((size_t)c * (size_t)bb) % 64 < (size_t)bb) /* once per line */
#pragma GCC unroll 4
                for (int j = 0; j < NR_; j++) __builtin_prefetch(blk + (size_t)(VR + j) * rb);
            __m256i x = _mm256_load_si256((const __m256i *)(xq + 32 * c)), off = ones;
            if (F != F_Q8_0) off = _mm256_madd_epi16(_mm256_maddubs_epi16(bias, x), ones);
            __m256i s[VR];
            uint64_t h = 0;
#pragma GCC unroll 4
            for (int j = 0; j < VR; j++) {
                const uint8_t *b = blk + (size_t)j * rb;
                if (j >= NR_) {
                    s[j] = _mm256_setzero_si256();
                    continue;
                }
                if (F == F_MXFP4) {
                    h |= (uint64_t)b[0] << (8 * j);
                    __m256i q = _mm256_shuffle_epi8(lut, q4_codes(b + 1));
                    s[j] = _mm256_sub_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(q, x), ones), off);
                    continue;
                }
                uint16_t hj;
                memcpy(&hj, b, 2);
                h |= (uint64_t)hj << (16 * j);
                if (F == F_Q4_0) {
                    s[j] = _mm256_madd_epi16(_mm256_maddubs_epi16(q4_codes(b + 2), x), ones);
                    s[j] = _mm256_sub_epi32(s[j], off);
                } else {
                    __m256i q = _mm256_loadu_si256((const __m256i *)(b + 2));
                    s[j] = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(x, q)), ones);
                }
            }
            __m256 sc = _mm256_mul_ps(scales4(h, F), _mm256_broadcast_ss(dx + c));
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(rows4(s)), sc, acc);
        }
        __m128 v = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
        float out[4];
        _mm_storeu_ps(out, v);
#pragma GCC unroll 4
        for (int j = 0; j < NR_; j++) y[(size_t)t * (size_t)w->rows + (size_t)(r + j)] = out[j];
    }
}

AI void vec_i8(const pt_weight *w, const pt_qact8 *a, float *y, int64_t r0, int64_t r1, const int F) {
    size_t rb = row_bytes_of(w);
    int64_t r = r0;
    for (; r + VR <= r1; r += VR) vec_rows(w, a, y, r, rb, VR, F, r + 2 * VR <= r1);
    for (; r < r1; r++) vec_rows(w, a, y, r, rb, 1, F, false);
}

/* Decode of q4_0 repacked 8 rows at a time (PT_LAYOUT_Q4_0X8, repack.c):
 * per unit of 8 rows x 32 columns, 4 loads; each, masked and shifted,
 * meets 4 broadcast activation codes in a vpmaddubsw, and the 8 products
 * (pairs at most 2 * 15 * 127 = 3810) add up in i16 before one vpmaddwd
 * leaves the block's exact integer sums of the 8 rows in 8 lanes.  One
 * convert of the 8 f16 scales, one convert and two FMAs finish the block:
 * ~33 vector ops per 8 rows against ~66 in the file-layout kernel above,
 * and no horizontal sums.  The nibbles' offset 8 comes off at the end, as
 * -8 * sum over blocks of d_w * (d_x * sum of the block's codes): the
 * activation's ds, shared by the 8 rows.  Rows [r0, r1) are whole groups
 * (the layout needs rows % 8 == 0; callers split in runs of 8). */
#ifndef X8_AHEAD
#define X8_AHEAD 2048 /* bytes prefetched ahead in a group's stream */
#endif

static void vec_q4_0x8(const pt_weight *w, const pt_qact8 *a, float *y, int64_t r0, int64_t r1) {
    const int64_t nc = a->n_chunks;
    const __m256i m = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);
    for (int64_t r = r0; r < r1; r += 8) {
        const uint8_t *g = (const uint8_t *)w->data + (size_t)(r / 8) * (size_t)nc * 144;
        for (int t = 0; t < a->n; t++) {
            const int8_t *xq = a->q + (size_t)t * (size_t)a->cols;
            const float *dx = a->d + (size_t)t * (size_t)nc, *ds = a->ds + (size_t)t * (size_t)nc;
            __m256 acc = _mm256_setzero_ps(), off = _mm256_setzero_ps();
            const uint8_t *u = g;
            for (int64_t c = 0; c < nc; c++, u += 144) {
                /* a unit is 2.25 cache lines: three prefetches cover it */
                __builtin_prefetch(u + X8_AHEAD);
                __builtin_prefetch(u + X8_AHEAD + 64);
                __builtin_prefetch(u + X8_AHEAD + 128);
                const int8_t *x = xq + 32 * c;
                __m256i s16 = _mm256_setzero_si256();
#pragma GCC unroll 4
                for (int v = 0; v < 4; v++) {
                    __m256i q = _mm256_loadu_si256((const __m256i *)(u + 16 + 32 * v));
                    s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(_mm256_and_si256(q, m), bcast4(x + 4 * v)));
                    s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(q, 4), m),
                                                                    bcast4(x + 16 + 4 * v)));
                }
                __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)u));
                acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(s16, ones)),
                                      _mm256_mul_ps(d, _mm256_broadcast_ss(dx + c)), acc);
                off = _mm256_fmadd_ps(d, _mm256_broadcast_ss(ds + c), off);
            }
            acc = _mm256_fmadd_ps(off, _mm256_set1_ps(-8), acc);
            _mm256_storeu_ps(y + (size_t)t * (size_t)w->rows + (size_t)r, acc);
        }
    }
}

static void vec_q8_0(const pt_weight *w, const pt_qact8 *a, float *y, int64_t r0, int64_t r1) {
    vec_i8(w, a, y, r0, r1, F_Q8_0);
}
static void vec_q4_0(const pt_weight *w, const pt_qact8 *a, float *y, int64_t r0, int64_t r1) {
    vec_i8(w, a, y, r0, r1, F_Q4_0);
}
static void vec_mxfp4(const pt_weight *w, const pt_qact8 *a, float *y, int64_t r0, int64_t r1) {
    vec_i8(w, a, y, r0, r1, F_MXFP4);
}

pt_qk_rows8_fn pt_qk_avx2_vec8(const pt_weight *w) {
    if (w->layout == PT_LAYOUT_Q4_0X8) return vec_q4_0x8;
    switch (w->dtype) {
    case PT_Q8_0: return vec_q8_0;
    case PT_Q4_0: return vec_q4_0;
    case PT_MXFP4: return vec_mxfp4;
    default: return NULL;
    }
}

/* The portable quantizer's arithmetic, 8 lanes at a time: the same max, the
 * same d = amax / 127 and 1 / d, and cvtps rounds to nearest even as lrintf
 * does in the default mode, so the codes are bit-identical. */
void pt_qk_avx2_quantize_act8(pt_qact8 *a, const float *x, int t0, int t1) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int t = t0; t < t1; t++)
        for (int64_t c = 0; c < a->n_chunks; c++) {
            const float *v = x + (size_t)t * (size_t)a->cols + 32 * (size_t)c;
            int8_t *q = a->q + (size_t)t * (size_t)a->cols + 32 * (size_t)c;
            __m256 f[4], m = _mm256_setzero_ps();
            for (int i = 0; i < 4; i++) {
                f[i] = _mm256_loadu_ps(v + 8 * i);
                m = _mm256_max_ps(m, _mm256_andnot_ps(sign, f[i]));
            }
            float amax = hmax8(m);
            float d = amax / 127, id = d > 0 ? 1 / d : 0;
            __m256i iq[4];
            for (int i = 0; i < 4; i++) iq[i] = _mm256_cvtps_epi32(_mm256_mul_ps(f[i], _mm256_set1_ps(id)));
            /* i32 -> i16 -> i8 with saturation (|code| <= 127 already); packs interleave lanes */
            __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(iq[0], iq[1]), _mm256_packs_epi32(iq[2], iq[3]));
            p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_store_si256((__m256i *)q, p);
            /* the two halves' sums side by side: lanes 0 and 1 after the adds */
            __m256i s = _mm256_hadd_epi32(_mm256_add_epi32(iq[0], iq[1]), _mm256_add_epi32(iq[2], iq[3]));
            __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
            s4 = _mm_hadd_epi32(s4, s4); /* (lo, hi, lo, hi) */
            int32_t *sq = a->sq + 2 * ((size_t)t * (size_t)a->n_chunks + (size_t)c);
            _mm_storel_epi64((__m128i *)sq, s4);
            a->d[(size_t)t * (size_t)a->n_chunks + (size_t)c] = d;
            a->ds[(size_t)t * (size_t)a->n_chunks + (size_t)c] = d * (float)(sq[0] + sq[1]);
        }
}
