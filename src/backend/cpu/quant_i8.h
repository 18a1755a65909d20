/*
 * quant_i8.h - what the int8-activation kernels of every x86 set share
 * (quant_i8_avx2.c, quant_i8_avx512.c): the formats as template constants,
 * row sizes, and decode(), which reads one block of 32 weights of a row as
 * codes plus (mul, add).  Static inline: each kernel file compiles it with
 * its own target flags.
 */
#ifndef PETREL_QUANT_I8_H
#define PETREL_QUANT_I8_H

#include <immintrin.h>
#include <string.h>

#include "backend/cpu/quant_kernels.h"

#define AI static inline __attribute__((always_inline))

/* The formats, as the template parameter of the kernels. */
enum { F_Q8_0, F_Q4_0, F_Q4_K, F_Q5_K, F_AFF4, F_Q6_K, F_Q4_0X8 /* PT_LAYOUT_Q4_0X8 */, F_MXFP4 };

/* MXFP4's e2m1 codes as twice their value, all integers in [-12, 12]
 * (quant_portable.c's chunk_mxfp4 reads the same), and the same plus 12,
 * in [0, 24], for kernels that want the weight unsigned (the offset
 * 12 * sum of the activation codes comes off the integer sum).  A block's
 * mul is then half its e8m0 scale: 2^(e - 128). */
#define MXFP4_TWICE 0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12
#define MXFP4_BIASED 12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0

/* 2^(e - 128) exactly, as f32 bits: a normal number for e >= 2, the
 * subnormals 2^-128 and 2^-127 below (ldexpf's values; no NaN for 255). */
AI float e8m0_half(uint8_t e) {
    uint32_t b = e >= 2 ? (uint32_t)(e - 1) << 23 : 0x00200000u << e;
    float f;
    memcpy(&f, &b, 4);
    return f;
}

/* The same for 4 scale bytes (e in the low byte of each 32-bit lane). */
AI __m128 e8m0_half4(__m128i e) {
    __m128i normal = _mm_slli_epi32(_mm_sub_epi32(e, _mm_set1_epi32(1)), 23);
    __m128i sub = _mm_sllv_epi32(_mm_set1_epi32(0x00200000), e);
    __m128i small = _mm_cmplt_epi32(e, _mm_set1_epi32(2));
    return _mm_castsi128_ps(_mm_blendv_epi8(normal, sub, small));
}

/* The 16 bytes of nibbles at p as 32 codes in natural order (q4_0's and
 * MXFP4's order: low nibbles are elements 0..15, high ones 16..31). */
AI __m256i nibbles32(const uint8_t *p) {
    __m128i v = _mm_loadu_si128((const __m128i *)p);
    __m256i b = _mm256_inserti128_si256(_mm256_castsi128_si256(v), _mm_srli_epi16(v, 4), 1);
    return _mm256_and_si256(b, _mm256_set1_epi8(15));
}

AI float scale_at(const void *p, int64_t i, pt_dtype t) {
    uint16_t h;
    float f;
    switch (t) {
    case PT_F16:
        memcpy(&h, (const uint8_t *)p + 2 * i, 2);
        return _cvtsh_ss(h);
    case PT_BF16:
        memcpy(&h, (const uint8_t *)p + 2 * i, 2);
        return pt_bf16_to_f32(h);
    default:
        memcpy(&f, (const uint8_t *)p + 4 * i, 4);
        return f;
    }
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

/* Bytes of one row of w. */
static size_t row_bytes_of(const pt_weight *w) {
    switch (w->dtype) {
    case PT_Q8_0:
        return (size_t)(w->cols / 32) * 34;
    case PT_Q4_0:
        return (size_t)(w->cols / 32) * 18;
    case PT_Q4_K:
        return (size_t)(w->cols / 256) * 144;
    case PT_Q5_K:
        return (size_t)(w->cols / 256) * 176;
    case PT_Q6_K:
        return (size_t)(w->cols / 256) * 210;
    case PT_MXFP4:
        return (size_t)(w->cols / 32) * 17;
    default:
        return (size_t)(w->cols / 2); /* affine 4-bit */
    }
}

/* The 32 codes of block c of row r, natural order, and the block's mul and
 * add (and q6_k's mul2).  q8_0, q6_k, MXFP4: signed bytes; the others
 * unsigned. */
AI __m256i decode(const pt_weight *w, const uint8_t *row, int64_t r, int64_t c, const int F,
                  float *mul, float *add, float *mul2) {
    if (F == F_Q6_K) { /* codes q - 32 in [-32, 31]; int8 scales per 16 columns */
        const uint8_t *blk = row + 210 * (size_t)(c / 8);
        int j = (int)(c % 8), half = j / 4, k = j % 4;
        const int8_t *sc = (const int8_t *)(blk + 192) + 2 * j;
        float d = _cvtsh_ss((uint16_t)(blk[208] | blk[209] << 8));
        *mul = d * (float)sc[0];
        *mul2 = d * (float)sc[1];
        *add = 0;
        __m256i l = _mm256_loadu_si256((const __m256i *)(blk + 64 * half + (k & 1 ? 32 : 0)));
        __m256i h = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * half));
        if (k & 2) l = _mm256_srli_epi16(l, 4);
        l = _mm256_and_si256(l, _mm256_set1_epi8(15));
        h = _mm256_and_si256(_mm256_srli_epi16(h, 2 * k), _mm256_set1_epi8(3));
        return _mm256_sub_epi8(_mm256_or_si256(l, _mm256_slli_epi16(h, 4)), _mm256_set1_epi8(32));
    }
    *mul2 = 0;
    if (F == F_MXFP4) {
        const uint8_t *blk = row + 17 * (size_t)c;
        *mul = e8m0_half(blk[0]);
        *add = 0;
        return _mm256_shuffle_epi8(_mm256_setr_epi8(MXFP4_TWICE, MXFP4_TWICE), nibbles32(blk + 1));
    }
    if (F == F_Q8_0 || F == F_Q4_0) {
        const uint8_t *blk = row + (F == F_Q8_0 ? 34 : 18) * (size_t)c;
        float d = _cvtsh_ss((uint16_t)(blk[0] | blk[1] << 8));
        *mul = d;
        *add = F == F_Q4_0 ? -8 * d : 0;
        if (F == F_Q8_0) return _mm256_loadu_si256((const __m256i *)(blk + 2));
        /* low nibbles are elements 0..15, high ones 16..31 */
        __m128i v = _mm_loadu_si128((const __m128i *)(blk + 2));
        __m256i b = _mm256_inserti128_si256(_mm256_castsi128_si256(v), _mm_srli_epi16(v, 4), 1);
        return _mm256_and_si256(b, _mm256_set1_epi8(15));
    }
    if (F == F_Q4_K || F == F_Q5_K) { /* sub-block j of a 256-block */
        const uint8_t *blk = row + (F == F_Q4_K ? 144 : 176) * (size_t)(c / 8);
        int j = (int)(c % 8), sc, m;
        scale_min_k4(j, blk + 4, &sc, &m);
        *mul = _cvtsh_ss((uint16_t)(blk[0] | blk[1] << 8)) * (float)sc;
        *add = -(_cvtsh_ss((uint16_t)(blk[2] | blk[3] << 8)) * (float)m);
        const uint8_t *qs = blk + (F == F_Q4_K ? 16 : 48) + 32 * (j / 2);
        __m256i v = _mm256_loadu_si256((const __m256i *)qs);
        if (j % 2) v = _mm256_srli_epi16(v, 4);
        v = _mm256_and_si256(v, _mm256_set1_epi8(15));
        if (F == F_Q5_K) { /* bit j of qh[i] is element i's fifth bit */
            __m256i qh = _mm256_loadu_si256((const __m256i *)(blk + 16));
            __m256i bit = _mm256_set1_epi8((char)(1 << j));
            __m256i hb = _mm256_cmpeq_epi8(_mm256_and_si256(qh, bit), bit);
            v = _mm256_or_si256(v, _mm256_and_si256(hb, _mm256_set1_epi8(16)));
        }
        return v;
    }
    /* affine 4-bit: a little-endian nibble stream, element 2i in byte i's
     * low nibble; one scale and bias per group of group_size */
    int64_t groups = w->cols / w->group_size, g = c * 32 / w->group_size;
    *mul = scale_at(w->scales, r * groups + g, w->scale_dtype);
    *add = scale_at(w->biases, r * groups + g, w->scale_dtype);
    __m128i v = _mm_loadu_si128((const __m128i *)(row + 16 * (size_t)c));
    __m128i m = _mm_set1_epi8(15), lo = _mm_and_si128(v, m),
            hi = _mm_and_si128(_mm_srli_epi16(v, 4), m);
    return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_unpacklo_epi8(lo, hi)),
                                   _mm_unpackhi_epi8(lo, hi), 1);
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

/* Group g's 4 codes of token row x broadcast to every lane. */
AI __m256i bcast4(const int8_t *x) {
    int32_t v;
    memcpy(&v, x, 4);
    return _mm256_set1_epi32(v);
}

AI float hmax8(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

#endif
