/*
 * quant_avx2.c - quantized-weight row kernels for AVX2 + FMA + F16C.
 *
 * Each kernel walks one weight row in chunks of 32 weights, unpacks a
 * chunk once into 32 byte codes, widens them to int16 and multiplies them
 * with the int16 activations of a tile of up to 4 tokens (vpmaddwd: pairs
 * summed to i32), scaling each chunk's integer sum once in f32
 * (quant_kernels.h states the sum).  Decode, which streams the
 * weights once per token, is memory-bound; the tile makes prefill decode
 * each chunk once per 4 tokens.
 *
 * Unpacking, per MLX affine width (codes form a little-endian bit stream):
 *   8 bits: the 32 bytes as they are.
 *   4 bits: 16 bytes in both lanes, lane 1 shifted right 4, masked: low
 *           nibbles (even elements) then high (odd): PT_QK_PERM_EVEN_ODD.
 *   2 bits: 8 bytes in four 64-bit lanes shifted by 0, 2, 4, 6, masked:
 *           lane k holds elements 4j + k: PT_QK_PERM_STRIDE4.
 *   3, 5, 6 bits: a byte shuffle puts each run of 12, 20 or 24 bits that
 *           holds 4 codes into its own 32-bit lane (shifted into place for
 *           3 and 5 bits), then shifts and masks spread the 4 codes to the
 *           lane's 4 bytes: natural order.
 * The activations are stored in the same order as the codes (quant_act).
 */
#include <immintrin.h>

#include "backend/cpu/quant_kernels.h"

#define AI static inline __attribute__((always_inline))
#define TILE 4

/* ---- helpers ----------------------------------------------------------------- */

/* 32 codes widened to int16: positions 0..15 and 16..31. */
typedef struct w16 {
    __m256i lo, hi;
} w16;

AI w16 widen_u8(__m256i q) {
    return (w16){_mm256_cvtepu8_epi16(_mm256_castsi256_si128(q)),
                 _mm256_cvtepu8_epi16(_mm256_extracti128_si256(q, 1))};
}

AI w16 widen_s8(__m256i q) {
    return (w16){_mm256_cvtepi8_epi16(_mm256_castsi256_si128(q)),
                 _mm256_cvtepi8_epi16(_mm256_extracti128_si256(q, 1))};
}

/* Integer dot product of a widened chunk with 32 int16 activations, as 8
 * partial sums in f32 (exact: |sum| < 2^31 for our codes). */
AI __m256 dot16(w16 w, const int16_t *xq) {
    const __m256i *x = (const __m256i *)xq;
    __m256i p = _mm256_add_epi32(_mm256_madd_epi16(w.lo, _mm256_load_si256(x)),
                                 _mm256_madd_epi16(w.hi, _mm256_load_si256(x + 1)));
    return _mm256_cvtepi32_ps(p);
}

/* Token t0 + t's activations: codes, block scales, block sums. */
typedef struct xrows {
    const int16_t *q[TILE];
    const float *d[TILE], *ds[TILE];
} xrows;

AI xrows x_rows(const pt_qact *a, int t0, const int NT) {
    xrows x;
    for (int t = 0; t < NT; t++) {
        x.q[t] = a->q + (size_t)(t0 + t) * (size_t)a->cols;
        x.d[t] = a->d + (size_t)(t0 + t) * (size_t)a->n_blocks;
        x.ds[t] = a->ds + (size_t)(t0 + t) * (size_t)a->n_blocks;
    }
    return x;
}

AI float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

AI float f16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

AI float scale_at(const uint8_t *p, int64_t i, pt_dtype t) {
    uint16_t h;
    float f;
    switch (t) {
    case PT_F16: memcpy(&h, p + 2 * i, 2); return _cvtsh_ss(h);
    case PT_BF16: memcpy(&h, p + 2 * i, 2); return pt_bf16_to_f32(h);
    default: memcpy(&f, p + 4 * i, 4); return f;
    }
}

/* Broadcasts 16 bytes to both lanes. */
AI __m256i bcast128(__m128i v) {
    return _mm256_inserti128_si256(_mm256_castsi128_si256(v), v, 1);
}

/* 16 bytes of nibbles -> [low nibbles | high nibbles]. */
AI __m256i nibbles(const uint8_t *p) {
    __m256i v = bcast128(_mm_loadu_si128((const __m128i *)p));
    v = _mm256_srlv_epi32(v, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4));
    return _mm256_and_si256(v, _mm256_set1_epi8(15));
}

/* ---- MLX affine ----------------------------------------------------------------- */

AI __m256i spread(__m256i v, int bits) {
    __m256i m = _mm256_set1_epi32((1 << bits) - 1), r = _mm256_and_si256(v, m);
    for (int k = 1; k < 4; k++) /* code k of the lane: bits [k*bits, (k+1)*bits) -> byte k */
        r = _mm256_or_si256(r, _mm256_and_si256(_mm256_slli_epi32(v, k * (8 - bits)),
                                                _mm256_slli_epi32(m, 8 * k)));
    return r;
}

/* The 32 codes of chunk c (bit offset 32 * c * bits), in the kernel's order. */
AI __m256i unpack_affine(const uint8_t *row, int64_t c, const int bits) {
    const uint8_t *p = row + 4 * bits * c;
    switch (bits) {
    case 8: return _mm256_loadu_si256((const __m256i *)p);
    case 4: return nibbles(p);
    case 2: {
        uint64_t u;
        memcpy(&u, p, 8);
        __m256i v = _mm256_srlv_epi64(_mm256_set1_epi64x((long long)u), _mm256_setr_epi64x(0, 2, 4, 6));
        return _mm256_and_si256(v, _mm256_set1_epi8(3));
    }
    case 3: { /* 12 bytes: 4 runs of 3 bytes, 8 codes each */
        __m128i lo = _mm_loadl_epi64((const __m128i *)p);
        int32_t hi;
        memcpy(&hi, p + 8, 4);
        __m256i v = bcast128(_mm_insert_epi32(lo, hi, 2));
        v = _mm256_shuffle_epi8(v, _mm256_setr_epi8(0, 1, 2, -1, 0, 1, 2, -1, 3, 4, 5, -1, 3, 4, 5, -1,
                                                    6, 7, 8, -1, 6, 7, 8, -1, 9, 10, 11, -1, 9, 10, 11, -1));
        v = _mm256_srlv_epi32(v, _mm256_setr_epi32(0, 12, 0, 12, 0, 12, 0, 12));
        return spread(v, 3);
    }
    case 5: { /* 20 bytes: 4 runs of 5 bytes, 8 codes each */
        __m256i v = _mm256_inserti128_si256(
            _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)p)),
            _mm_loadu_si128((const __m128i *)(p + 4)), 1);
        v = _mm256_shuffle_epi8(v, _mm256_setr_epi8(0, 1, 2, -1, 2, 3, 4, -1, 5, 6, 7, -1, 7, 8, 9, -1,
                                                    6, 7, 8, -1, 8, 9, 10, -1, 11, 12, 13, -1, 13, 14, 15, -1));
        v = _mm256_srlv_epi32(v, _mm256_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4));
        return spread(v, 5);
    }
    default: { /* 6 bits, 24 bytes: 8 runs of 3 bytes, 4 codes each */
        __m256i v = _mm256_inserti128_si256(
            _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)p)),
            _mm_loadu_si128((const __m128i *)(p + 8)), 1);
        v = _mm256_shuffle_epi8(v, _mm256_setr_epi8(0, 1, 2, -1, 3, 4, 5, -1, 6, 7, 8, -1, 9, 10, 11, -1,
                                                    4, 5, 6, -1, 7, 8, 9, -1, 10, 11, 12, -1, 13, 14, 15, -1));
        return spread(v, 6);
    }
    }
}

/* n scales of a row from the stored dtype to f32. */
AI void scales_f32(float *dst, const uint8_t *src, int64_t g0, int n, pt_dtype t) {
    int i = 0;
    if (t == PT_F16) {
        for (; i + 8 <= n; i += 8)
            _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + 2 * (g0 + i)))));
    } else if (t == PT_BF16) {
        for (; i + 8 <= n; i += 8) {
            __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(src + 2 * (g0 + i))));
            _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(h, 16)));
        }
    }
    for (; i < n; i++) dst[i] = scale_at(src, g0 + i, t);
}

#define SEG 256 /* groups whose scales are converted at a time */

/* per_group = group_size / 32 is a constant in each instance, so the chunk
 * loop of a group unrolls. */
/* The chunk's codes as int16.  8 and 4 bits widen straight from memory
 * (vpmovzxbw), 4 bits then splitting each byte's nibbles: low ones are the
 * even elements, high ones the odd (PT_QK_PERM_EVEN_ODD). */
AI w16 unpack_affine16(const uint8_t *row, int64_t c, const int bits) {
    const uint8_t *p = row + 4 * bits * c;
    if (bits == 8)
        return (w16){_mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)p)),
                     _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(p + 16)))};
    if (bits == 4) {
        __m256i v = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)p));
        return (w16){_mm256_and_si256(v, _mm256_set1_epi16(15)), _mm256_srli_epi16(v, 4)};
    }
    return widen_u8(unpack_affine(row, c, bits));
}

/* sum_i v[i] * w[i] over n floats. */
AI float dot_f32(const float *v, const float *w, int n) {
    __m256 acc = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(v + i), _mm256_loadu_ps(w + i), acc);
    float s = hsum(acc);
    for (; i < n; i++) s += v[i] * w[i];
    return s;
}

/* The activations come in blocks of one group, so a group's integer sum
 * runs across its chunks and is scaled once (by s * d_x); the biases meet
 * the blocks' sums in one f32 dot product per run of groups. */
AI void tile_affine(const pt_weight *w, int64_t r, const pt_qact *a, int t0, const int NT,
                    const int bits, const int per_group, float *out) {
    size_t ss = w->scale_dtype == PT_F32 ? 4 : 2;
    int64_t groups = w->cols / (32 * per_group);
    const uint8_t *row = (const uint8_t *)w->data + (size_t)r * (size_t)(w->cols * bits / 8);
    const uint8_t *sr = (const uint8_t *)w->scales + (size_t)(r * groups) * ss;
    const uint8_t *br = (const uint8_t *)w->biases + (size_t)(r * groups) * ss;
    xrows x = x_rows(a, t0, NT);
    __m256 acc[TILE];
    float badd[TILE], sv[SEG], bv[SEG], sd[TILE][SEG];
    for (int t = 0; t < NT; t++) acc[t] = _mm256_setzero_ps(), badd[t] = 0;
    for (int64_t g0 = 0; g0 < groups; g0 += SEG) {
        int ng = (int)PT_MIN(SEG, groups - g0);
        scales_f32(sv, sr, g0, ng, w->scale_dtype);
        scales_f32(bv, br, g0, ng, w->scale_dtype);
        for (int t = 0; t < NT; t++) {
            badd[t] += dot_f32(bv, x.ds[t] + g0, ng);
            for (int gi = 0; gi < ng; gi++) sd[t][gi] = sv[gi] * x.d[t][g0 + gi];
        }
        for (int gi = 0; gi < ng; gi++) {
            int64_t c0 = (g0 + gi) * per_group;
            __m256i isum[TILE];
#pragma GCC unroll 4
            for (int k = 0; k < per_group; k++) {
                w16 q = unpack_affine16(row, c0 + k, bits);
#pragma GCC unroll 4
                for (int t = 0; t < NT; t++) {
                    const __m256i *xq = (const __m256i *)(x.q[t] + 32 * (c0 + k));
                    __m256i p = _mm256_add_epi32(_mm256_madd_epi16(q.lo, _mm256_load_si256(xq)),
                                                 _mm256_madd_epi16(q.hi, _mm256_load_si256(xq + 1)));
                    isum[t] = k ? _mm256_add_epi32(isum[t], p) : p; /* < 2^31: 16 products of 255 x 32767 */
                }
            }
            for (int t = 0; t < NT; t++)
                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), _mm256_broadcast_ss(&sd[t][gi]), acc[t]);
        }
    }
    for (int t = 0; t < NT; t++) out[t] = hsum(acc[t]) + badd[t];
}

/* ---- GGUF blocks ------------------------------------------------------------------ */

AI void tile_q8_0(const pt_weight *w, int64_t r, const pt_qact *a, int t0, const int NT,
                  const int bits, const int unused, float *out) {
    const uint8_t *row = (const uint8_t *)w->data + (size_t)r * (size_t)(w->cols / 32) * 34;
    xrows x = x_rows(a, t0, NT);
    __m256 acc[TILE];
    for (int t = 0; t < NT; t++) acc[t] = _mm256_setzero_ps();
    for (int64_t c = 0; c < a->n_chunks; c++) {
        const uint8_t *blk = row + 34 * c;
        float d = f16(blk);
        w16 q = {_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(blk + 2))),
                 _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(blk + 18)))};
        for (int t = 0; t < NT; t++)
            acc[t] = _mm256_fmadd_ps(dot16(q, x.q[t] + 32 * c),
                                     _mm256_set1_ps(d * x.d[t][c]), acc[t]);
    }
    for (int t = 0; t < NT; t++) out[t] = hsum(acc[t]);
}

AI void tile_q4_0(const pt_weight *w, int64_t r, const pt_qact *a, int t0, const int NT,
                  const int bits, const int unused, float *out) {
    const uint8_t *row = (const uint8_t *)w->data + (size_t)r * (size_t)(w->cols / 32) * 18;
    xrows x = x_rows(a, t0, NT);
    __m256 acc[TILE];
    for (int t = 0; t < NT; t++) acc[t] = _mm256_setzero_ps();
    for (int64_t c = 0; c < a->n_chunks; c++) {
        const uint8_t *blk = row + 18 * c;
        float d = f16(blk);
        /* low nibbles are elements 0..15, high ones 16..31; codes are q - 8 */
        __m256i v = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(blk + 2)));
        __m256i eight = _mm256_set1_epi16(8);
        w16 q = {_mm256_sub_epi16(_mm256_and_si256(v, _mm256_set1_epi16(15)), eight),
                 _mm256_sub_epi16(_mm256_srli_epi16(v, 4), eight)};
        for (int t = 0; t < NT; t++)
            acc[t] = _mm256_fmadd_ps(dot16(q, x.q[t] + 32 * c),
                                     _mm256_set1_ps(d * x.d[t][c]), acc[t]);
    }
    for (int t = 0; t < NT; t++) out[t] = hsum(acc[t]);
}

AI void scale_min_k4(int j, const uint8_t *s, int *sc, int *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* q4_k (bits 4) and q5_k (bits 5): 8 sub-blocks of 32 with scale and min. */
AI void tile_qk(const pt_weight *w, int64_t r, const pt_qact *a, int t0, const int NT,
                const int bits, const int unused, float *out) {
    const int bb = bits == 4 ? 144 : 176;
    const uint8_t *row = (const uint8_t *)w->data + (size_t)r * (size_t)(w->cols / 256) * bb;
    xrows x = x_rows(a, t0, NT);
    __m256 acc[TILE];
    float badd[TILE];
    for (int t = 0; t < NT; t++) acc[t] = _mm256_setzero_ps(), badd[t] = 0;
    for (int64_t sb = 0; sb < w->cols / 256; sb++) {
        const uint8_t *blk = row + bb * sb, *qs = blk + (bits == 4 ? 16 : 48);
        float d = f16(blk), dmin = f16(blk + 2);
        __m256i qh = bits == 5 ? _mm256_loadu_si256((const __m256i *)(blk + 16)) : _mm256_setzero_si256();
        for (int j = 0; j < 8; j++) {
            int sc, m;
            scale_min_k4(j, blk + 4, &sc, &m);
            __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * (j / 2)));
            if (j % 2) v = _mm256_srli_epi16(v, 4);
            __m256i q = _mm256_and_si256(v, _mm256_set1_epi8(15));
            if (bits == 5) { /* bit j of qh[i] is the fifth bit */
                __m256i bit = _mm256_set1_epi8((char)(1 << j));
                __m256i hb = _mm256_cmpeq_epi8(_mm256_and_si256(qh, bit), bit);
                q = _mm256_or_si256(q, _mm256_and_si256(hb, _mm256_set1_epi8(16)));
            }
            float mul = d * (float)sc, add = -(dmin * (float)m);
            int64_t c = 8 * sb + j;
            w16 qw = widen_u8(q);
            for (int t = 0; t < NT; t++) {
                acc[t] = _mm256_fmadd_ps(dot16(qw, x.q[t] + 32 * c),
                                         _mm256_set1_ps(mul * x.d[t][c]), acc[t]);
                badd[t] += add * x.ds[t][c];
            }
        }
    }
    for (int t = 0; t < NT; t++) out[t] = hsum(acc[t]) + badd[t];
}

/* q6_k: codes q - 32 (signed) times their 16-wide sub-block's scale. */
AI void tile_q6_k(const pt_weight *w, int64_t r, const pt_qact *a, int t0, const int NT,
                  const int bits, const int unused, float *out) {
    const uint8_t *row = (const uint8_t *)w->data + (size_t)r * (size_t)(w->cols / 256) * 210;
    xrows x = x_rows(a, t0, NT);
    __m256 acc[TILE];
    for (int t = 0; t < NT; t++) acc[t] = _mm256_setzero_ps();
    for (int64_t sb = 0; sb < w->cols / 256; sb++) {
        const uint8_t *blk = row + 210 * sb;
        const int8_t *scales = (const int8_t *)(blk + 192);
        float d = f16(blk + 208);
        for (int j = 0; j < 8; j++) {
            int half = j / 4, k = j % 4;
            __m256i l = _mm256_loadu_si256((const __m256i *)(blk + 64 * half + (k & 1 ? 32 : 0)));
            __m256i h = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * half));
            if (k & 2) l = _mm256_srli_epi16(l, 4);
            l = _mm256_and_si256(l, _mm256_set1_epi8(15));
            h = _mm256_and_si256(_mm256_srli_epi16(h, 2 * k), _mm256_set1_epi8(3));
            __m256i q = _mm256_sub_epi8(_mm256_or_si256(l, _mm256_slli_epi16(h, 4)), _mm256_set1_epi8(32));
            w16 qw = widen_s8(q); /* sub-block scales folded into the codes: |sc * q| <= 4096 */
            qw.lo = _mm256_mullo_epi16(qw.lo, _mm256_set1_epi16(scales[2 * j]));
            qw.hi = _mm256_mullo_epi16(qw.hi, _mm256_set1_epi16(scales[2 * j + 1]));
            int64_t c = 8 * sb + j;
            for (int t = 0; t < NT; t++)
                acc[t] = _mm256_fmadd_ps(dot16(qw, x.q[t] + 32 * c),
                                         _mm256_set1_ps(d * x.d[t][c]), acc[t]);
        }
    }
    for (int t = 0; t < NT; t++) out[t] = hsum(acc[t]);
}

/* ---- rows: tiles of tokens, one function per format (and affine width) ---------- */

/* Bytes from one row's codes to the next. */
static size_t code_row_bytes(const pt_weight *w) {
    return w->dtype == PT_AFFINE ? (size_t)(w->cols * w->bits / 8) : pt_dtype_bytes(w->dtype, (uint64_t)w->cols);
}

/* Asks for the codes of the row PREFETCH_BYTES ahead: rows are read one
 * after another, one stream per thread, and the hardware prefetcher alone
 * keeps too few lines in flight for one core to reach the machine's
 * bandwidth in decode (the f16/bf16 matvec reads 8 rows side by side for
 * the same reason). */
#define PREFETCH_BYTES 4096
static void prefetch_ahead(const pt_weight *w, size_t rb, int64_t r, int64_t r1) {
    int64_t ahead = r + (int64_t)((PREFETCH_BYTES + rb - 1) / rb);
    if (ahead >= r1) return;
    const char *p = (const char *)w->data + (size_t)ahead * rb;
    for (size_t off = 0; off < rb; off += 64) __builtin_prefetch(p + off);
}

#define ROWS(name, tile, bits, pg)                                                                     \
    static void name(const pt_weight *w, const pt_qact *a, float *y, int64_t r0, int64_t r1) {     \
        size_t rb = code_row_bytes(w);                                                             \
        for (int64_t r = r0; r < r1; r++) {                                                        \
            prefetch_ahead(w, rb, r, r1);                                                          \
            for (int t0 = 0; t0 < a->n; t0 += TILE) {                                              \
                float out[TILE];                                                                   \
                int nt = PT_MIN(TILE, a->n - t0);                                                  \
                switch (nt) {                                                                      \
                case 4: tile(w, r, a, t0, 4, bits, pg, out); break;                                    \
                case 3: tile(w, r, a, t0, 3, bits, pg, out); break;                                    \
                case 2: tile(w, r, a, t0, 2, bits, pg, out); break;                                    \
                default: tile(w, r, a, t0, 1, bits, pg, out); break;                                   \
                }                                                                                  \
                for (int t = 0; t < nt; t++) y[(size_t)(t0 + t) * (size_t)w->rows + (size_t)r] = out[t]; \
            }                                                                                      \
        }                                                                                          \
    }

#define AFFINE_ROWS(bits)                                                                          \
    ROWS(rows_affine##bits##_32, tile_affine, bits, 1)                                             \
    ROWS(rows_affine##bits##_64, tile_affine, bits, 2)                                             \
    ROWS(rows_affine##bits##_128, tile_affine, bits, 4)
AFFINE_ROWS(2)
AFFINE_ROWS(3)
AFFINE_ROWS(4)
AFFINE_ROWS(5)
AFFINE_ROWS(6)
AFFINE_ROWS(8)
ROWS(rows_q8_0, tile_q8_0, 8, 0)
ROWS(rows_q4_0, tile_q4_0, 4, 0)
ROWS(rows_q4_k, tile_qk, 4, 0)
ROWS(rows_q5_k, tile_qk, 5, 0)
ROWS(rows_q6_k, tile_q6_k, 6, 0)

#define AFFINE_ENTRIES(bits, perm)                                                                 \
    {PT_AFFINE, bits, 32, rows_affine##bits##_32, perm},                                           \
    {PT_AFFINE, bits, 64, rows_affine##bits##_64, perm},                                           \
    {PT_AFFINE, bits, 128, rows_affine##bits##_128, perm}

static const struct {
    pt_dtype t;
    int bits, group_size; /* affine only */
    pt_qk_rows_fn rows;
    int perm;
} kernels[] = {
    AFFINE_ENTRIES(2, PT_QK_PERM_STRIDE4),
    AFFINE_ENTRIES(3, PT_QK_PERM_NONE),
    AFFINE_ENTRIES(4, PT_QK_PERM_EVEN_ODD),
    AFFINE_ENTRIES(5, PT_QK_PERM_NONE),
    AFFINE_ENTRIES(6, PT_QK_PERM_NONE),
    AFFINE_ENTRIES(8, PT_QK_PERM_NONE),
    {PT_Q8_0, 0, 0, rows_q8_0, PT_QK_PERM_NONE},
    {PT_Q4_0, 0, 0, rows_q4_0, PT_QK_PERM_NONE},
    {PT_Q4_K, 0, 0, rows_q4_k, PT_QK_PERM_NONE},
    {PT_Q5_K, 0, 0, rows_q5_k, PT_QK_PERM_NONE},
    {PT_Q6_K, 0, 0, rows_q6_k, PT_QK_PERM_NONE},
};

static int find_kernel(const pt_weight *w) {
    for (size_t i = 0; i < PT_ARRAY_LEN(kernels); i++)
        if (kernels[i].t == w->dtype && (w->dtype != PT_AFFINE || (kernels[i].bits == w->bits &&
                                                                   kernels[i].group_size == w->group_size)))
            return (int)i;
    return -1;
}

pt_qk_rows_fn pt_qk_avx2_rows(const pt_weight *w) {
    if (w->layout != PT_LAYOUT_FILE) return NULL; /* rows read in file layout only */
    int k = find_kernel(w);
    return k < 0 ? NULL : kernels[k].rows;
}

int pt_qk_avx2_perm(const pt_weight *w) {
    int k = find_kernel(w);
    return k < 0 ? PT_QK_PERM_NONE : kernels[k].perm;
}
