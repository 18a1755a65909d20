/*
 * quant_i8_avx512.c - the int8-activation kernels of quant_i8_avx2.c on
 * AVX-512 with VNNI: the prefill GEMM (q8_0, q4_0, q4_k, q5_k, q6_k,
 * MXFP4, affine 4-bit, and q4_0 in PT_LAYOUT_Q4_0X8) and the decode rows
 * (q8_0, q4_0 in either layout, MXFP4).
 *
 * Compiled with -mavx512f/bw/vl/dq/vnni (the build does this for
 * *_avx512.c) and reached only when cpu_backend.c found those on the CPU.
 *
 * What changes against the AVX2 kernels:
 *   - vpdpbusd (u8 x s8, four products summed into a 32-bit lane and
 *     added to it) replaces vpmaddubsw + vpaddw + vpmaddwd: one instruction
 *     per 4 columns x 16 rows, and no i16 intermediate to keep below 2^15;
 *   - a panel holds 16 rows, one per 32-bit lane of a zmm register: per
 *     block of 32 columns and token, 8 vpdpbusd (each taking the token's 4
 *     codes as an embedded broadcast) give 16 rows' exact block sums, and
 *     one convert and one or two FMAs scale them;
 *   - the weight is always the unsigned operand.  q4_0, q4_k, q5_k and
 *     affine codes are unsigned already.  Signed codes become unsigned by an
 *     offset taken off the integer sum once per block and token: q8_0 is
 *     read as w + 128 (sum - 128 * sum of x), q6_k as its raw 6-bit q
 *     instead of q - 32 (sum - 32 * sum of x, per half block since its
 *     scales cover 16 columns), MXFP4 as twice its e2m1 value plus 12
 *     (sum - 12 * sum of x); the activations' sums of codes come with
 *     them (pt_qact8.sq).
 * The integer sums are the AVX2 kernels' exactly, and they are scaled by
 * the same f32 operations in the same order (per row: block by block, 1024
 * columns per panel, panels added in order), so every output equals the
 * AVX2 kernel's bit for bit: tests/quant/test_kernels.c asserts it.
 */
#include "backend/cpu/quant_i8.h"

#define TT 8  /* tokens per register tile: 8 independent vpdpbusd chains */
#define NR 16 /* rows per panel: one per 32-bit lane of a zmm */
#define KC 32 /* blocks per panel (1024 columns): as the AVX2 GEMM, so the f32 sums match */

/* One block of a panel: codes[g] holds group g (columns 4g..4g+3) of the
 * 16 rows as unsigned bytes, row j in lane j (q8_0: w + 128; q6_k: q);
 * weight = mul * code + add for unsigned formats. */
typedef struct pblock {
    __m512i codes[8];
    float mul[NR], add[NR];
    float mul2[NR]; /* q6_k: mul of columns 16..31 (mul is 0..15's) */
} pblock;

/* Packs blocks [c0, c0 + kc) of rows [r, r + nr) of w into p; rows past
 * nr read zero codes and zero scales. */
AI void pack(pblock *p, const pt_weight *w, size_t row_bytes, int64_t r, int nr, int64_t c0, int kc,
             const int F) {
    if (F == F_Q4_0X8) { /* two 8-row groups of the layout (the second absent if nr == 8) */
        const int64_t nc = w->cols / 32;
        const uint8_t *u0 = (const uint8_t *)w->data + (size_t)((r / 8) * nc + c0) * 144;
        const uint8_t *u1 = nr > 8 ? u0 + (size_t)nc * 144 : NULL;
        const __m512i m = _mm512_set1_epi8(15);
        for (int c = 0; c < kc; c++, u0 += 144, u1 = u1 ? u1 + 144 : NULL) {
            __m128i h1 = u1 ? _mm_loadu_si128((const __m128i *)u1) : _mm_setzero_si128();
            __m512 d = _mm512_insertf32x8(
                _mm512_castps256_ps512(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)u0))),
                _mm256_cvtph_ps(h1), 1);
            _mm512_storeu_ps(p[c].mul, d);
            _mm512_storeu_ps(p[c].add, _mm512_mul_ps(d, _mm512_set1_ps(-8)));
            for (int v = 0; v < 4; v++) {
                __m256i q1 = u1 ? _mm256_loadu_si256((const __m256i *)(u1 + 16 + 32 * v))
                                : _mm256_setzero_si256();
                __m512i q = _mm512_inserti64x4(
                    _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(u0 + 16 + 32 * v))),
                    q1, 1);
                p[c].codes[v] = _mm512_and_si512(q, m);
                p[c].codes[v + 4] = _mm512_and_si512(_mm512_srli_epi16(q, 4), m);
            }
        }
        return;
    }
    for (int c = 0; c < kc; c++) {
        __m256i v[NR];
        for (int j = 0; j < NR; j++) {
            if (j < nr) {
                const uint8_t *row = (const uint8_t *)w->data + (size_t)(r + j) * row_bytes;
                v[j] = decode(w, row, r + j, c0 + c, F, &p[c].mul[j], &p[c].add[j], &p[c].mul2[j]);
                if (F == F_Q8_0) v[j] = _mm256_xor_si256(v[j], _mm256_set1_epi8((char)0x80));
                if (F == F_Q6_K) v[j] = _mm256_add_epi8(v[j], _mm256_set1_epi8(32));
                if (F == F_MXFP4) v[j] = _mm256_add_epi8(v[j], _mm256_set1_epi8(12));
            } else {
                v[j] = _mm256_setzero_si256();
                p[c].mul[j] = p[c].add[j] = p[c].mul2[j] = 0;
            }
        }
        transpose8(v);
        transpose8(v + 8);
        for (int g = 0; g < 8; g++)
            p[c].codes[g] = _mm512_inserti64x4(_mm512_castsi256_si512(v[g]), v[8 + g], 1);
    }
}

AI int32_t load_i32(const int8_t *x) {
    int32_t v;
    memcpy(&v, x, 4);
    return v;
}

/* acc[t] (16 rows) += the panel's kc blocks . token t0 + t's blocks c0.. */
AI void tile(const pblock *p, int kc, const pt_qact8 *a, int t0, int64_t c0, const int NT,
             const int F, __m512 acc[TT]) {
    const int8_t *x[TT];
    const float *dx[TT], *ds[TT];
    const int32_t *sq[TT];
#pragma GCC unroll 8
    for (int t = 0; t < NT; t++) {
        size_t at = (size_t)(t0 + t) * (size_t)a->n_chunks + (size_t)c0;
        x[t] = a->q + (size_t)(t0 + t) * (size_t)a->cols + 32 * (size_t)c0;
        dx[t] = a->d + at;
        ds[t] = a->ds + at;
        sq[t] = a->sq + 2 * at;
    }
    for (int c = 0; c < kc; c++) {
        const pblock *b = &p[c];
        __m512i isum[TT], isum2[TT];
        /* the offsets of signed codes read unsigned, per token */
#pragma GCC unroll 8
        for (int t = 0; t < NT; t++) {
            const int32_t *s = sq[t] + 2 * c;
            if (F == F_Q8_0)
                isum[t] = _mm512_set1_epi32(-128 * (s[0] + s[1]));
            else if (F == F_MXFP4)
                isum[t] = _mm512_set1_epi32(-12 * (s[0] + s[1]));
            else if (F == F_Q6_K)
                isum[t] = _mm512_set1_epi32(-32 * s[0]), isum2[t] = _mm512_set1_epi32(-32 * s[1]);
            else
                isum[t] = _mm512_setzero_si512();
        }
        /* group by group, so each group's codes are loaded once for all
         * tokens; the tokens' sums are independent chains */
#pragma GCC unroll 8
        for (int g = 0; g < 8; g++) {
            __m512i cg = _mm512_load_si512(&b->codes[g]);
#pragma GCC unroll 8
            for (int t = 0; t < NT; t++) {
                __m512i xb = _mm512_set1_epi32(load_i32(x[t] + 32 * c + 4 * g));
                if (F == F_Q6_K && g >= 4)
                    isum2[t] = _mm512_dpbusd_epi32(isum2[t], cg, xb);
                else
                    isum[t] = _mm512_dpbusd_epi32(isum[t], cg, xb);
            }
        }
        __m512 mul = _mm512_load_ps(b->mul), add = _mm512_load_ps(b->add);
#pragma GCC unroll 8
        for (int t = 0; t < NT; t++) {
            __m512 dxt = _mm512_set1_ps(dx[t][c]);
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[t]), _mm512_mul_ps(mul, dxt), acc[t]);
            if (F == F_Q6_K)
                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum2[t]),
                                         _mm512_mul_ps(_mm512_load_ps(b->mul2), dxt), acc[t]);
            else if (F != F_Q8_0 && F != F_MXFP4)
                acc[t] = _mm512_fmadd_ps(add, _mm512_set1_ps(ds[t][c]), acc[t]);
        }
    }
}

/* y[t][r..r+nr) (+)= the tile's lanes. */
AI void store(float *y, __m512 v, int nr, bool add) {
    __mmask16 k = (__mmask16)((1u << nr) - 1);
    if (add) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(k, y));
    _mm512_mask_storeu_ps(y, k, v);
}

/* Tokens [t0, t0 + NT) over the panel, and the results stored. */
AI void tokens(const pblock *panel, int kc, const pt_qact8 *a, float *y, int64_t rows, int64_t r,
               int nr, int t0, int64_t c0, const int NT, const int F) {
    __m512 acc[TT];
#pragma GCC unroll 8
    for (int t = 0; t < NT; t++)
        acc[t] = _mm512_setzero_ps();
    tile(panel, kc, a, t0, c0, NT, F, acc);
#pragma GCC unroll 8
    for (int t = 0; t < NT; t++)
        store(y + (size_t)(t0 + t) * (size_t)rows + (size_t)r, acc[t], nr, c0 > 0);
}

AI void rows_i8(const pt_weight *w, const pt_qact8 *a, float *y, int64_t r0, int64_t r1,
                const int F) {
    _Alignas(64) pblock panel[KC];
    size_t row_bytes = row_bytes_of(w);
    for (int64_t r = r0; r < r1; r += NR) {
        int nr = (int)PT_MIN(NR, r1 - r);
        for (int64_t c0 = 0; c0 < a->n_chunks; c0 += KC) {
            int kc = (int)PT_MIN(KC, a->n_chunks - c0);
            pack(panel, w, row_bytes, r, nr, c0, kc, F);
            int t0 = 0;
            for (; t0 + 8 <= a->n; t0 += 8)
                tokens(panel, kc, a, y, w->rows, r, nr, t0, c0, 8, F);
            if (t0 + 4 <= a->n) tokens(panel, kc, a, y, w->rows, r, nr, t0, c0, 4, F), t0 += 4;
            if (t0 + 2 <= a->n) tokens(panel, kc, a, y, w->rows, r, nr, t0, c0, 2, F), t0 += 2;
            if (t0 < a->n) tokens(panel, kc, a, y, w->rows, r, nr, t0, c0, 1, F);
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

pt_qk_rows8_fn pt_qk_avx512_rows8(const pt_weight *w) {
    if (w->layout == PT_LAYOUT_Q4_0X8) return rows_q4_0x8;
    switch (w->dtype) {
    case PT_Q8_0:
        return rows_q8_0;
    case PT_Q4_0:
        return rows_q4_0;
    case PT_Q4_K:
        return rows_q4_k;
    case PT_Q5_K:
        return rows_q5_k;
    case PT_Q6_K:
        return rows_q6_k;
    case PT_AFFINE:
        return w->bits == 4 ? rows_aff4 : NULL;
    case PT_MXFP4:
        return rows_mxfp4;
    default:
        return NULL;
    }
}

/* ---- decode: the AVX2 rows with vpdpbusd ----------------------------------------
 *
 * The same structure as quant_i8_avx2.c's decode kernels (rows where they
 * lie, VR side by side; q4_0 repacked 8 rows at a time), and the same
 * per-lane integer sums, so the same f32 results; what changes is the
 * instruction count per 32 weights and row:
 *   q8_0: the weight read as w + 128 (one xor) meets the activation codes
 *     in one vpdpbusd whose lanes start at -128 * (their 4 codes' sum),
 *     computed once per block for all rows; AVX2 spent two vpsignb, a
 *     vpmaddubsw and a vpmaddwd;
 *   q4_0: vpdpbusd from -8 * (the codes' sum), likewise shared;
 *   q4_0x8: 8 vpdpbusd per 8 rows x 32 columns, two chains, where AVX2
 *     needed 8 vpmaddubsw, 7 vpaddw and a vpmaddwd.
 * Decode is bound by memory; fewer instructions per byte leave the core
 * free to keep more loads in flight (docs/backend-cpu.md). */
#define VR 8 /* rows per pass: 8 streams */

AI __m256i q4_codes(const uint8_t *p) {
    __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)p));
    v = _mm256_srlv_epi32(v, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4));
    return _mm256_and_si256(v, _mm256_set1_epi8(15));
}

/* lane j (and j + 4): the sums of the low (high) 4 lanes of s[j]: 4 rows'
 * sums side by side, as quant_i8_avx2.c's rows4. */
AI __m256i rows4(const __m256i s[4]) {
    __m256i a =
        _mm256_add_epi32(_mm256_unpacklo_epi32(s[0], s[1]), _mm256_unpackhi_epi32(s[0], s[1]));
    __m256i b =
        _mm256_add_epi32(_mm256_unpacklo_epi32(s[2], s[3]), _mm256_unpackhi_epi32(s[2], s[3]));
    return _mm256_add_epi32(_mm256_unpacklo_epi64(a, b), _mm256_unpackhi_epi64(a, b));
}

/* The 4 rows' block scales as f32 in both halves, as quant_i8_avx2.c's. */
AI __m256 scales4(uint64_t h, const int F) {
    if (F != F_MXFP4) return _mm256_cvtph_ps(_mm_set1_epi64x((long long)h));
    __m128 s = e8m0_half4(_mm_cvtepu8_epi32(_mm_cvtsi32_si128((int)h)));
    return _mm256_insertf128_ps(_mm256_castps128_ps256(s), s, 1);
}

/* y[t][r + j] for j < NR_ (rows r.. of w, rb bytes apart) and every token;
 * two groups of 4 rows, each scaled as the AVX2 kernel scales its 4.
 * MXFP4: codes twice the value plus 12, offset 12 (as q4_0's 8). */
AI void vec_rows(const pt_weight *w, const pt_qact8 *a, float *y, int64_t r, size_t rb,
                 const int NR_, const int F, bool prefetch) {
    const int bb = F == F_Q8_0 ? 34 : F == F_MXFP4 ? 17 : 18;
    const int G = NR_ > 4 ? 2 : 1; /* groups of 4 rows */
    const uint8_t *row0 = (const uint8_t *)w->data + (size_t)r * rb;
    const __m256i bias = _mm256_set1_epi8(F == F_Q8_0 ? (char)0x80 : F == F_MXFP4 ? 12 : 8);
    const __m256i lut = _mm256_setr_epi8(MXFP4_BIASED, MXFP4_BIASED);
    for (int t = 0; t < a->n; t++) {
        const int8_t *xq = a->q + (size_t)t * (size_t)a->cols;
        const float *dx = a->d + (size_t)t * (size_t)a->n_chunks;
        __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
        for (int64_t c = 0; c < a->n_chunks; c++) {
            const uint8_t *blk = row0 + (size_t)bb * (size_t)c;
            if (prefetch && t == 0 &&
                ((size_t)c * (size_t)bb) % 64 < (size_t)bb) /* once per line */
#pragma GCC unroll 8
                for (int j = 0; j < NR_; j++)
                    __builtin_prefetch(blk + (size_t)(VR + j) * rb);
            __m256i x = _mm256_load_si256((const __m256i *)(xq + 32 * c));
            /* the lanes' offset: q8_0 128, q4_0 8, MXFP4 12 times their codes' sum */
            __m256i off = _mm256_sub_epi32(_mm256_setzero_si256(),
                                           _mm256_dpbusd_epi32(_mm256_setzero_si256(), bias, x));
            __m256 dxc = _mm256_set1_ps(dx[c]);
#pragma GCC unroll 2
            for (int gi = 0; gi < G; gi++) {
                __m256i s[4];
                uint64_t h = 0;
#pragma GCC unroll 4
                for (int j = 0; j < 4; j++) {
                    const uint8_t *b = blk + (size_t)(4 * gi + j) * rb;
                    if (4 * gi + j >= NR_) {
                        s[j] = _mm256_setzero_si256();
                        continue;
                    }
                    __m256i q;
                    if (F == F_MXFP4) {
                        h |= (uint64_t)b[0] << (8 * j);
                        q = _mm256_shuffle_epi8(lut, q4_codes(b + 1));
                    } else {
                        uint16_t hj;
                        memcpy(&hj, b, 2);
                        h |= (uint64_t)hj << (16 * j);
                        q = F == F_Q4_0
                                ? q4_codes(b + 2)
                                : _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(b + 2)), bias);
                    }
                    s[j] = _mm256_dpbusd_epi32(off, q, x);
                }
                __m256 sc = _mm256_mul_ps(scales4(h, F), dxc);
                acc[gi] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(rows4(s)), sc, acc[gi]);
            }
        }
#pragma GCC unroll 2
        for (int gi = 0; gi < G; gi++) {
            __m128 v =
                _mm_add_ps(_mm256_castps256_ps128(acc[gi]), _mm256_extractf128_ps(acc[gi], 1));
            float out[4];
            _mm_storeu_ps(out, v);
            for (int j = 0; j < 4 && 4 * gi + j < NR_; j++)
                y[(size_t)t * (size_t)w->rows + (size_t)(r + 4 * gi + j)] = out[j];
        }
    }
}

AI void vec_i8(const pt_weight *w, const pt_qact8 *a, float *y, int64_t r0, int64_t r1,
               const int F) {
    size_t rb = row_bytes_of(w);
    int64_t r = r0;
    for (; r + VR <= r1; r += VR)
        vec_rows(w, a, y, r, rb, VR, F, r + 2 * VR <= r1);
    for (; r + 4 <= r1; r += 4)
        vec_rows(w, a, y, r, rb, 4, F, false);
    for (; r < r1; r++)
        vec_rows(w, a, y, r, rb, 1, F, false);
}

#ifndef X8_AHEAD
#define X8_AHEAD 2048 /* bytes prefetched ahead in a group's stream */
#endif

/* q4_0 in PT_LAYOUT_Q4_0X8: quant_i8_avx2.c's vec_q4_0x8 with the 8
 * groups' products summed by vpdpbusd in two chains (even and odd groups)
 * instead of in i16, and two 8-row groups side by side in one zmm (low
 * and high 256 bits): half the instructions per byte, and two streams in
 * flight per thread where one group alone ran at ~20 GB/s on one core
 * (bench/quant_gemm.c).  Per row, the same integer sums scaled by the same
 * f32 operations as AVX2's. */
static void vec_q4_0x8_one(const pt_weight *w, const pt_qact8 *a, float *y, int64_t r) {
    const int64_t nc = a->n_chunks;
    const __m256i m = _mm256_set1_epi8(15);
    const uint8_t *g = (const uint8_t *)w->data + (size_t)(r / 8) * (size_t)nc * 144;
    for (int t = 0; t < a->n; t++) {
        const int8_t *xq = a->q + (size_t)t * (size_t)a->cols;
        const float *dx = a->d + (size_t)t * (size_t)nc, *ds = a->ds + (size_t)t * (size_t)nc;
        __m256 acc = _mm256_setzero_ps(), off = _mm256_setzero_ps();
        const uint8_t *u = g;
        for (int64_t c = 0; c < nc; c++, u += 144) {
            __builtin_prefetch(u + X8_AHEAD);
            __builtin_prefetch(u + X8_AHEAD + 64);
            __builtin_prefetch(u + X8_AHEAD + 128);
            const int8_t *x = xq + 32 * c;
            __m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();
#pragma GCC unroll 4
            for (int v = 0; v < 4; v++) {
                __m256i q = _mm256_loadu_si256((const __m256i *)(u + 16 + 32 * v));
                s0 = _mm256_dpbusd_epi32(s0, _mm256_and_si256(q, m), bcast4(x + 4 * v));
                s1 = _mm256_dpbusd_epi32(s1, _mm256_and_si256(_mm256_srli_epi16(q, 4), m),
                                         bcast4(x + 16 + 4 * v));
            }
            __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)u));
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(s0, s1)),
                                  _mm256_mul_ps(d, _mm256_broadcast_ss(dx + c)), acc);
            off = _mm256_fmadd_ps(d, _mm256_broadcast_ss(ds + c), off);
        }
        acc = _mm256_fmadd_ps(off, _mm256_set1_ps(-8), acc);
        _mm256_storeu_ps(y + (size_t)t * (size_t)w->rows + (size_t)r, acc);
    }
}

/* Rows [r, r + 16): groups r / 8 and r / 8 + 1, lanes 0..7 and 8..15. */
static void vec_q4_0x8_two(const pt_weight *w, const pt_qact8 *a, float *y, int64_t r) {
    const int64_t nc = a->n_chunks;
    const size_t gb = (size_t)nc * 144; /* bytes of one group */
    const __m512i m = _mm512_set1_epi8(15);
    const uint8_t *g = (const uint8_t *)w->data + (size_t)(r / 8) * gb;
    for (int t = 0; t < a->n; t++) {
        const int8_t *xq = a->q + (size_t)t * (size_t)a->cols;
        const float *dx = a->d + (size_t)t * (size_t)nc, *ds = a->ds + (size_t)t * (size_t)nc;
        __m512 acc = _mm512_setzero_ps(), off = _mm512_setzero_ps();
        const uint8_t *u = g;
        for (int64_t c = 0; c < nc; c++, u += 144) {
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                __builtin_prefetch(u + h * gb + X8_AHEAD);
                __builtin_prefetch(u + h * gb + X8_AHEAD + 64);
                __builtin_prefetch(u + h * gb + X8_AHEAD + 128);
            }
            const int8_t *x = xq + 32 * c;
            __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
#pragma GCC unroll 4
            for (int v = 0; v < 4; v++) {
                __m512i q = _mm512_inserti64x4(
                    _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(u + 16 + 32 * v))),
                    _mm256_loadu_si256((const __m256i *)(u + gb + 16 + 32 * v)), 1);
                s0 = _mm512_dpbusd_epi32(s0, _mm512_and_si512(q, m),
                                         _mm512_set1_epi32(load_i32(x + 4 * v)));
                s1 = _mm512_dpbusd_epi32(s1, _mm512_and_si512(_mm512_srli_epi16(q, 4), m),
                                         _mm512_set1_epi32(load_i32(x + 16 + 4 * v)));
            }
            __m512 d = _mm512_insertf32x8(
                _mm512_castps256_ps512(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)u))),
                _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(u + gb))), 1);
            acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1)),
                                  _mm512_mul_ps(d, _mm512_set1_ps(dx[c])), acc);
            off = _mm512_fmadd_ps(d, _mm512_set1_ps(ds[c]), off);
        }
        acc = _mm512_fmadd_ps(off, _mm512_set1_ps(-8), acc);
        _mm512_storeu_ps(y + (size_t)t * (size_t)w->rows + (size_t)r, acc);
    }
}

/* Rows [r0, r1) are whole groups of 8 (callers split in runs of 8). */
static void vec_q4_0x8(const pt_weight *w, const pt_qact8 *a, float *y, int64_t r0, int64_t r1) {
    int64_t r = r0;
    for (; r + 16 <= r1; r += 16)
        vec_q4_0x8_two(w, a, y, r);
    for (; r < r1; r += 8)
        vec_q4_0x8_one(w, a, y, r);
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

pt_qk_rows8_fn pt_qk_avx512_vec8(const pt_weight *w) {
    if (w->layout == PT_LAYOUT_Q4_0X8) return vec_q4_0x8;
    switch (w->dtype) {
    case PT_Q8_0:
        return vec_q8_0;
    case PT_Q4_0:
        return vec_q4_0;
    case PT_MXFP4:
        return vec_mxfp4;
    default:
        return NULL;
    }
}
