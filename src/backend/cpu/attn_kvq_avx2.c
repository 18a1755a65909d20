/*
 * attn_kvq_avx2.c - AVX2 kernels for attention over quantized KV rows.
 *
 * Compiled with -mavx2 -mfma -mf16c and only used after the backend has
 * checked the CPU.  Same contracts as the portable kernels in attn_kvq.c.
 *
 * Everything runs 8 elements at a time.  Eight codes of b bits are exactly
 * b bytes of the row's bitstream (groups of 8 start on a byte), so one
 * small load, a broadcast, per-lane variable shifts and a mask give them as
 * 32-bit lanes.  Then:
 *   - keys (affine or TurboQuant): x = code * scale + offset in one FMA
 *     (offset = zero * scale for TurboQuant, the bias for affine), and one
 *     FMA per query head that shares the row;
 *   - TurboQuant values: the Lloyd-Max centroid of each code comes from
 *     registers (vpermps on 8-entry tables, blended for 16 and 32 entries;
 *     a gather for 256), times the group's scale and the softmax weight,
 *     added to the rotated-domain accumulator.
 * Each (format, bit width) gets its own loop: the bodies are always_inline
 * functions called with constants, as in kernels_avx2.c, and query heads go
 * in register blocks of up to 4.
 */
#include <immintrin.h>
#include <string.h>

#include "backend/cpu/attn_kvq.h"

#define INLINE static inline __attribute__((always_inline))
#define HEAD_BLOCK 4

/* ---- unpacking ------------------------------------------------------------------- */

/* Codes i..i+7 of a row whose first code byte is p (p = codes + i * bits / 8).
 * The loads are whole words (4 bytes, 8 for 5-bit codes) that may run past
 * the b bytes we need into the row's scales or the next row; the mask drops
 * those bits, and the cache pads every buffer's end (kvcache.c, QUANT_PAD).
 * A word load instead of a b-byte memcpy matters: the odd sizes compile to
 * byte stores and a wider reload, which stalls on store forwarding. */
INLINE __m256i unpack8(const uint8_t *p, int bits, bool sgn) {
    if (bits == 8) {
        __m128i b = _mm_loadl_epi64((const __m128i *)(const void *)p);
        return sgn ? _mm256_cvtepi8_epi32(b) : _mm256_cvtepu8_epi32(b);
    }
    __m256i v, sh;
    if (bits == 5) { /* 40 bits: lanes 0-3 from bits 0-31, lanes 4-7 from bits 20-51 */
        uint64_t w;
        memcpy(&w, p, 8);
        v = _mm256_set_m128i(_mm_set1_epi32((int)(uint32_t)(w >> 20)),
                             _mm_set1_epi32((int)(uint32_t)w));
        sh = _mm256_setr_epi32(0, 5, 10, 15, 0, 5, 10, 15);
    } else { /* 2, 3, 4 bits: all 8 codes lie in one 32-bit word */
        uint32_t w;
        memcpy(&w, p, 4);
        v = _mm256_set1_epi32((int)w);
        sh = _mm256_setr_epi32(0, bits, 2 * bits, 3 * bits, 4 * bits, 5 * bits, 6 * bits, 7 * bits);
    }
    return _mm256_and_si256(_mm256_srlv_epi32(v, sh), _mm256_set1_epi32((1 << bits) - 1));
}

INLINE float f16_at(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

INLINE float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* ---- centroid lookup --------------------------------------------------------------- */

typedef struct ctab {
    __m256 t[4];      /* up to 32 centroids in registers */
    const float *mem; /* 256 centroids: gathered */
} ctab;

INLINE ctab ctab_load(const float *cent, int bits) {
    ctab t = {.mem = cent};
    float pad[32] = {0};
    if (cent && bits > 0 && bits <= 5) { /* affine rows have no table (bits 0) */
        memcpy(pad, cent, sizeof(float) * (size_t)(1 << bits));
        for (int i = 0; i < 4; i++)
            t.t[i] = _mm256_loadu_ps(pad + 8 * i);
    }
    return t;
}

/* Bit k of each code as a blend mask (the sign bit of each lane). */
INLINE __m256 bit_mask(__m256i c, int k) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(c, 31 - k));
}

INLINE __m256 lookup(const ctab *t, __m256i c, int bits) {
    if (bits <= 3) return _mm256_permutevar8x32_ps(t->t[0], c);
    if (bits == 8) return _mm256_i32gather_ps(t->mem, c, 4);
    __m256 lo = _mm256_blendv_ps(_mm256_permutevar8x32_ps(t->t[0], c),
                                 _mm256_permutevar8x32_ps(t->t[1], c), bit_mask(c, 3));
    if (bits == 4) return lo;
    __m256 hi = _mm256_blendv_ps(_mm256_permutevar8x32_ps(t->t[2], c),
                                 _mm256_permutevar8x32_ps(t->t[3], c), bit_mask(c, 3));
    return _mm256_blendv_ps(lo, hi, bit_mask(c, 4));
}

/* ---- keys ---------------------------------------------------------------------------- */

/* Scores of NH (a compile-time 1..4) query heads against one K row. */
INLINE void k_row(const pt_kv_codec *c, const uint8_t *row, const float *q, float *sc, int ld,
                  int bits, bool sgn, bool turbo, int NH) {
    const int d = c->head_dim, G = c->group, ng = c->n_groups;
    const uint8_t *sp = row + c->k_codes, *zp = sp + 2 * ng;
    __m256 acc[HEAD_BLOCK];
#pragma GCC unroll 4
    for (int h = 0; h < NH; h++)
        acc[h] = _mm256_setzero_ps();
    for (int g = 0; g < ng; g++) {
        float s = f16_at(sp + 2 * g), z = f16_at(zp + 2 * g);
        __m256 vs = _mm256_set1_ps(s), vt = _mm256_set1_ps(turbo ? z * s : z);
        for (int i = g * G; i < g * G + G; i += 8) {
            __m256i ci = unpack8(row + i * bits / 8, bits, sgn);
            __m256 x = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ci), vs, vt);
#pragma GCC unroll 4
            for (int h = 0; h < NH; h++)
                acc[h] = _mm256_fmadd_ps(_mm256_loadu_ps(q + h * d + i), x, acc[h]);
        }
    }
#pragma GCC unroll 4
    for (int h = 0; h < NH; h++)
        sc[h * ld] = hsum(acc[h]);
}

/* Rows in memory order (slot by slot, every kv head), so a chunk is read
 * as one stream; each row serves its kv head's query heads in blocks. */
INLINE void k_any(const pt_kv_codec *c, const uint8_t *slots, size_t slot_bytes, int cnt, int n_kv,
                  const float *q, int G, float *sc, int ld, int bits, bool sgn, bool turbo) {
    const int d = c->head_dim;
    for (int r = 0; r < cnt; r++)
        for (int g = 0; g < n_kv; g++) {
            const uint8_t *row = slots + (size_t)r * slot_bytes + (size_t)g * c->k_row;
            for (int h = g * G; h < g * G + G; h += HEAD_BLOCK) {
                const float *qq = q + (size_t)h * d;
                float *ss = sc + (size_t)h * ld + r;
                switch (PT_MIN(HEAD_BLOCK, g * G + G - h)) {
                case 1:
                    k_row(c, row, qq, ss, ld, bits, sgn, turbo, 1);
                    break;
                case 2:
                    k_row(c, row, qq, ss, ld, bits, sgn, turbo, 2);
                    break;
                case 3:
                    k_row(c, row, qq, ss, ld, bits, sgn, turbo, 3);
                    break;
                default:
                    k_row(c, row, qq, ss, ld, bits, sgn, turbo, 4);
                    break;
                }
            }
        }
}

#define K_ENTRY(name, bits, sgn, turbo)                                                            \
    static void name(const pt_kv_codec *c, const uint8_t *slots, size_t slot_bytes, int cnt,       \
                     int n_kv, const float *q, int G, float *sc, int ld) {                         \
        k_any(c, slots, slot_bytes, cnt, n_kv, q, G, sc, ld, bits, sgn, turbo);                    \
    }
K_ENTRY(k_turbo2, 2, false, true)
K_ENTRY(k_turbo4, 4, false, true)
K_ENTRY(k_turbo5, 5, false, true)
K_ENTRY(k_turbo8, 8, true, true)
K_ENTRY(k_affine4, 4, false, false)
K_ENTRY(k_affine8, 8, false, false)

/* ---- values --------------------------------------------------------------------------- */

/* Rows per pass of v_rows, and groups per row at most (head_dim 512 in
 * groups of 8). */
#define V_ROWS 64
#define V_MAX_GROUPS (PT_TQ_MAX_DIM / 8)

/* acc[h] += sum over rows of w[h][r] * V_r for NH heads of one kv head,
 * cnt <= V_ROWS rows stride bytes apart.  The accumulator of each 8-wide
 * block stays in registers while the rows go by; the weight times the
 * row's group scale is one scalar per (head, row, group), computed first.
 * TurboQuant (centroid): V_r = centroid[code] * scale, rotated domain.
 * Affine: V_r = code * scale + bias; the bias terms are the same for every
 * element of a group, so their weighted sums are added once per block. */
INLINE void v_rows(const pt_kv_codec *c, const uint8_t *rows, size_t stride, int cnt,
                   const float *w, int ld, float *acc, int bits, bool centroid, int NH) {
    const int d = c->head_dim, G = c->group, ng = c->n_groups, vc = c->v_codes;
    float ws[HEAD_BLOCK][V_ROWS * V_MAX_GROUPS]; /* 64 KiB of stack at most */
    float bsum[HEAD_BLOCK][V_MAX_GROUPS] = {{0}};
    ctab tab = ctab_load(c->centroids, centroid ? bits : 0);
    for (int r = 0; r < cnt; r++) {
        const uint8_t *sp = rows + (size_t)r * stride + vc;
        for (int g = 0; g < ng; g++) {
            float s = f16_at(sp + 2 * g), b = centroid ? 0 : f16_at(sp + 2 * (ng + g));
#pragma GCC unroll 4
            for (int h = 0; h < NH; h++) {
                ws[h][r * ng + g] = w[h * ld + r] * s;
                bsum[h][g] += w[h * ld + r] * b;
            }
        }
    }
    for (int i = 0; i < d; i += 8) {
        const int g = i / G;
        __m256 a[HEAD_BLOCK];
#pragma GCC unroll 4
        for (int h = 0; h < NH; h++)
            a[h] = _mm256_loadu_ps(acc + (size_t)h * d + i);
        const uint8_t *p = rows + i * bits / 8;
        for (int r = 0; r < cnt; r++, p += stride) {
            __m256i ci = unpack8(p, bits, false);
            __m256 x = centroid ? lookup(&tab, ci, bits) : _mm256_cvtepi32_ps(ci);
#pragma GCC unroll 4
            for (int h = 0; h < NH; h++)
                a[h] = _mm256_fmadd_ps(_mm256_broadcast_ss(&ws[h][r * ng + g]), x, a[h]);
        }
#pragma GCC unroll 4
        for (int h = 0; h < NH; h++) {
            if (!centroid) a[h] = _mm256_add_ps(a[h], _mm256_set1_ps(bsum[h][g]));
            _mm256_storeu_ps(acc + (size_t)h * d + i, a[h]);
        }
    }
}

INLINE void v_any(const pt_kv_codec *c, const uint8_t *slots, size_t slot_bytes, int cnt, int n_kv,
                  const float *w, int ld, int G, float *acc, int bits, bool centroid) {
    const int d = c->head_dim;
    for (int r0 = 0; r0 < cnt; r0 += V_ROWS)
        for (int g = 0; g < n_kv; g++) {
            const uint8_t *rows = slots + (size_t)r0 * slot_bytes + (size_t)g * c->v_row;
            int n = PT_MIN(V_ROWS, cnt - r0);
            for (int h = g * G; h < g * G + G; h += HEAD_BLOCK) {
                const float *ww = w + (size_t)h * ld + r0;
                float *aa = acc + (size_t)h * d;
                switch (PT_MIN(HEAD_BLOCK, g * G + G - h)) {
                case 1:
                    v_rows(c, rows, slot_bytes, n, ww, ld, aa, bits, centroid, 1);
                    break;
                case 2:
                    v_rows(c, rows, slot_bytes, n, ww, ld, aa, bits, centroid, 2);
                    break;
                case 3:
                    v_rows(c, rows, slot_bytes, n, ww, ld, aa, bits, centroid, 3);
                    break;
                default:
                    v_rows(c, rows, slot_bytes, n, ww, ld, aa, bits, centroid, 4);
                    break;
                }
            }
        }
}

#define V_ENTRY(name, bits, centroid)                                                              \
    static void name(const pt_kv_codec *c, const uint8_t *slots, size_t slot_bytes, int cnt,       \
                     int n_kv, const float *w, int ld, int G, float *acc) {                        \
        v_any(c, slots, slot_bytes, cnt, n_kv, w, ld, G, acc, bits, centroid);                     \
    }
V_ENTRY(v_turbo2, 2, true)
V_ENTRY(v_turbo3, 3, true)
V_ENTRY(v_turbo4, 4, true)
V_ENTRY(v_turbo5, 5, true)
V_ENTRY(v_turbo8, 8, true)
V_ENTRY(v_affine4, 4, false)
V_ENTRY(v_affine8, 8, false)

/* ---- dispatch ------------------------------------------------------------------------- */

typedef void (*k_fn)(const pt_kv_codec *, const uint8_t *, size_t, int, int, const float *, int,
                     float *, int);
typedef void (*v_fn)(const pt_kv_codec *, const uint8_t *, size_t, int, int, const float *, int,
                     int, float *);

static const struct {
    int kind, bits;
    k_fn k;
    v_fn v;
} formats[] = {
    {PT_KVQ_TURBO, 2, k_turbo2, v_turbo2},    {PT_KVQ_TURBO, 3, NULL, v_turbo3},
    {PT_KVQ_TURBO, 4, k_turbo4, v_turbo4},    {PT_KVQ_TURBO, 5, k_turbo5, v_turbo5},
    {PT_KVQ_TURBO, 8, k_turbo8, v_turbo8},    {PT_KVQ_AFFINE, 4, k_affine4, v_affine4},
    {PT_KVQ_AFFINE, 8, k_affine8, v_affine8},
};

static void k_scores(const pt_kv_codec *c, const uint8_t *slots, size_t slot_bytes, int cnt,
                     int n_kv, const float *q, int G, float *sc, int ld) {
    for (size_t i = 0; i < PT_ARRAY_LEN(formats); i++)
        if (formats[i].kind == c->spec.kind && formats[i].bits == c->spec.k_bits && formats[i].k) {
            formats[i].k(c, slots, slot_bytes, cnt, n_kv, q, G, sc, ld);
            return;
        }
    pt_kvq_kernels_portable()->k_scores(c, slots, slot_bytes, cnt, n_kv, q, G, sc, ld);
}

static void v_accum(const pt_kv_codec *c, const uint8_t *slots, size_t slot_bytes, int cnt,
                    int n_kv, const float *w, int ld, int G, float *acc) {
    for (size_t i = 0; i < PT_ARRAY_LEN(formats); i++)
        if (formats[i].kind == c->spec.kind && formats[i].bits == c->spec.v_bits && formats[i].v) {
            formats[i].v(c, slots, slot_bytes, cnt, n_kv, w, ld, G, acc);
            return;
        }
    pt_kvq_kernels_portable()->v_accum(c, slots, slot_bytes, cnt, n_kv, w, ld, G, acc);
}

const pt_kvq_kernels *pt_kvq_kernels_avx2(void) {
    static const pt_kvq_kernels k = {"avx2", k_scores, v_accum};
    return &k;
}
