/*
 * gguf_blocks.c - GGUF block quants as llama.cpp lays them out: the
 * reference dequantizers (byte-exact against llama.cpp's, see
 * tests/quant/test_gguf_blocks.c) and quantizers.
 *
 * Layouts (little-endian; "f16" is an IEEE half; docs/formats.md draws them):
 *   q8_0  34 B / 32:  f16 d, int8 q[32]                  w = d * q
 *   q4_0  18 B / 32:  f16 d, u8 qs[16]                   w = d * (q - 8);
 *                     q[j] = qs[j] & 15, q[j+16] = qs[j] >> 4
 *   q4_k 144 B / 256: f16 d, f16 dmin, u8 scales[12], u8 qs[128]
 *                     8 sub-blocks of 32 with 6-bit scale sc and min m:
 *                     w = d * sc * q - dmin * m, q in 0..15
 *   q5_k 176 B / 256: as q4_k plus u8 qh[32] (the fifth bit), q in 0..31
 *   q6_k 210 B / 256: u8 ql[128], u8 qh[64], int8 scales[16], f16 d
 *                     16 sub-blocks of 16: w = d * sc * (q - 32), q in 0..63
 *
 * Q8_0 and Q4_0 quantize exactly as llama.cpp's reference quantizers.  The
 * k-quant quantizers here choose scales by a plain min/max per sub-block
 * (llama.cpp searches for better ones); their blocks decode with any
 * reader, which is what tests and dummy weights need.
 */
#include <math.h>

#include "quant/quant.h"

static float f16_at(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return pt_f16_to_f32(h);
}

static void f16_put(uint8_t *p, float v) {
    uint16_t h = pt_f32_to_f16(v);
    memcpy(p, &h, 2);
}

/* ---- q8_0 ---------------------------------------------------------------- */

static void deq_q8_0(const uint8_t *b, float *y) {
    float d = f16_at(b);
    for (int j = 0; j < 32; j++) y[j] = d * (float)(int8_t)b[2 + j];
}

static void quant_q8_0(const float *x, uint8_t *b) {
    float amax = 0;
    for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
    float d = amax / 127, id = d != 0 ? 1.0f / d : 0.0f;
    f16_put(b, d);
    for (int j = 0; j < 32; j++) b[2 + j] = (uint8_t)(int8_t)roundf(x[j] * id);
}

/* ---- q4_0 ---------------------------------------------------------------- */

static void deq_q4_0(const uint8_t *b, float *y) {
    float d = f16_at(b);
    for (int j = 0; j < 16; j++) {
        y[j] = d * (float)((b[2 + j] & 15) - 8);
        y[j + 16] = d * (float)((b[2 + j] >> 4) - 8);
    }
}

static void quant_q4_0(const float *x, uint8_t *b) {
    float amax = 0, max = 0; /* the value of largest magnitude, with its sign */
    for (int j = 0; j < 32; j++)
        if (fabsf(x[j]) > amax) amax = fabsf(x[j]), max = x[j];
    float d = max / -8, id = d != 0 ? 1.0f / d : 0.0f;
    f16_put(b, d);
    for (int j = 0; j < 16; j++) {
        int lo = (int8_t)(x[j] * id + 8.5f), hi = (int8_t)(x[j + 16] * id + 8.5f);
        b[2 + j] = (uint8_t)(PT_MIN(15, lo) | PT_MIN(15, hi) << 4);
    }
}

/* ---- k-quant scales: 8 pairs of 6-bit (scale, min) in 12 bytes ----------- */

static void scale_min_k4(int j, const uint8_t *s, int *sc, int *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

static void put_scale_min_k4(uint8_t s[12], const int sc[8], const int m[8]) {
    memset(s, 0, 12);
    for (int j = 0; j < 8; j++) {
        if (j < 4) {
            s[j] |= (uint8_t)sc[j];
            s[j + 4] |= (uint8_t)m[j];
        } else {
            s[j + 4] = (uint8_t)((sc[j] & 15) | (m[j] & 15) << 4);
            s[j - 4] |= (uint8_t)((sc[j] >> 4) << 6);
            s[j] |= (uint8_t)((m[j] >> 4) << 6);
        }
    }
}

/* Scale, min and codes of a 256-block with 8 sub-blocks of 32 and codes in
 * 0..nmax: min/max per sub-block, 6-bit scales relative to the block's. */
static void kquant_scales(const float *x, int nmax, float *d, float *dmin, int sc[8], int m[8],
                          uint8_t q[256]) {
    float scale[8], mins[8], max_scale = 0, max_min = 0;
    for (int j = 0; j < 8; j++) {
        float lo = 0, hi = 0; /* min is clamped at 0: the format stores -min >= 0 */
        for (int l = 0; l < 32; l++) lo = fminf(lo, x[32 * j + l]), hi = fmaxf(hi, x[32 * j + l]);
        scale[j] = (hi - lo) / (float)nmax;
        mins[j] = -lo;
        max_scale = fmaxf(max_scale, scale[j]);
        max_min = fmaxf(max_min, mins[j]);
    }
    *d = pt_f16_to_f32(pt_f32_to_f16(max_scale / 63));
    *dmin = pt_f16_to_f32(pt_f32_to_f16(max_min / 63));
    for (int j = 0; j < 8; j++) {
        sc[j] = *d > 0 ? PT_MIN(63, (int)lrintf(scale[j] / *d)) : 0;
        m[j] = *dmin > 0 ? PT_MIN(63, (int)lrintf(mins[j] / *dmin)) : 0;
        float ds = *d * (float)sc[j], dm = *dmin * (float)m[j];
        for (int l = 0; l < 32; l++) {
            int c = ds > 0 ? (int)lrintf((x[32 * j + l] + dm) / ds) : 0;
            q[32 * j + l] = (uint8_t)PT_MAX(0, PT_MIN(nmax, c));
        }
    }
}

/* ---- q4_k ---------------------------------------------------------------- */

static void deq_q4_k(const uint8_t *b, float *y) {
    float d = f16_at(b), dmin = f16_at(b + 2);
    const uint8_t *s = b + 4, *qs = b + 16;
    for (int j = 0; j < 8; j += 2, qs += 32) { /* 64 weights per 32 bytes */
        int sc0, m0, sc1, m1;
        scale_min_k4(j, s, &sc0, &m0);
        scale_min_k4(j + 1, s, &sc1, &m1);
        for (int l = 0; l < 32; l++) {
            y[32 * j + l] = d * (float)sc0 * (float)(qs[l] & 15) - dmin * (float)m0;
            y[32 * j + 32 + l] = d * (float)sc1 * (float)(qs[l] >> 4) - dmin * (float)m1;
        }
    }
}

static void quant_q4_k(const float *x, uint8_t *b) {
    float d, dmin;
    int sc[8], m[8];
    uint8_t q[256];
    kquant_scales(x, 15, &d, &dmin, sc, m, q);
    f16_put(b, d);
    f16_put(b + 2, dmin);
    put_scale_min_k4(b + 4, sc, m);
    for (int j = 0; j < 8; j += 2)
        for (int l = 0; l < 32; l++)
            b[16 + 16 * j + l] = (uint8_t)(q[32 * j + l] | q[32 * j + 32 + l] << 4);
}

/* ---- q5_k ---------------------------------------------------------------- */

static void deq_q5_k(const uint8_t *b, float *y) {
    float d = f16_at(b), dmin = f16_at(b + 2);
    const uint8_t *s = b + 4, *qh = b + 16, *qs = b + 48;
    for (int j = 0; j < 8; j += 2, qs += 32) {
        int sc0, m0, sc1, m1;
        scale_min_k4(j, s, &sc0, &m0);
        scale_min_k4(j + 1, s, &sc1, &m1);
        for (int l = 0; l < 32; l++) { /* bit j of qh[l] is the fifth bit of sub-block j */
            int q0 = (qs[l] & 15) | ((qh[l] >> j) & 1) << 4;
            int q1 = (qs[l] >> 4) | ((qh[l] >> (j + 1)) & 1) << 4;
            y[32 * j + l] = d * (float)sc0 * (float)q0 - dmin * (float)m0;
            y[32 * j + 32 + l] = d * (float)sc1 * (float)q1 - dmin * (float)m1;
        }
    }
}

static void quant_q5_k(const float *x, uint8_t *b) {
    float d, dmin;
    int sc[8], m[8];
    uint8_t q[256];
    kquant_scales(x, 31, &d, &dmin, sc, m, q);
    f16_put(b, d);
    f16_put(b + 2, dmin);
    put_scale_min_k4(b + 4, sc, m);
    memset(b + 16, 0, 32);
    for (int j = 0; j < 8; j += 2)
        for (int l = 0; l < 32; l++) {
            int q0 = q[32 * j + l], q1 = q[32 * j + 32 + l];
            b[48 + 16 * j + l] = (uint8_t)((q0 & 15) | (q1 & 15) << 4);
            b[16 + l] |= (uint8_t)((q0 >> 4) << j | (q1 >> 4) << (j + 1));
        }
}

/* ---- q6_k ---------------------------------------------------------------- */

/* Code e (0..255) of a q6_k block: low 4 bits in ql, high 2 in qh. */
static int q6_code(const uint8_t *ql, const uint8_t *qh, int e) {
    int half = e / 128, k = (e % 128) / 32, l = e % 32;
    const uint8_t *L = ql + 64 * half, *H = qh + 32 * half;
    int lo = (k & 1 ? L[l + 32] : L[l]) >> (k & 2 ? 4 : 0) & 15;
    return lo | ((H[l] >> (2 * k)) & 3) << 4;
}

static void deq_q6_k(const uint8_t *b, float *y) {
    float d = f16_at(b + 208);
    const int8_t *sc = (const int8_t *)(b + 192);
    for (int e = 0; e < 256; e++) y[e] = d * (float)sc[e / 16] * (float)(q6_code(b, b + 128, e) - 32);
}

/* Each sub-block's scale maps its largest-magnitude value to code -32
 * (the wider side of -32..31); the block scale maps the largest of those to
 * int8 -128, so extremes, and constant blocks, come back exactly. */
static void quant_q6_k(const float *x, uint8_t *b) {
    float s[16], s_max = 0;
    for (int j = 0; j < 16; j++) {
        float amax = 0, max = 0;
        for (int l = 0; l < 16; l++)
            if (fabsf(x[16 * j + l]) > amax) amax = fabsf(x[16 * j + l]), max = x[16 * j + l];
        s[j] = max / -32;
        if (fabsf(s[j]) > fabsf(s_max)) s_max = s[j];
    }
    float iscale = s_max != 0 ? -128 / s_max : 0;
    float d = pt_f16_to_f32(pt_f32_to_f16(iscale != 0 ? 1 / iscale : 0));
    f16_put(b + 208, d);
    memset(b, 0, 192);
    for (int j = 0; j < 16; j++) {
        int sc = PT_MAX(-128, PT_MIN(127, (int)lrintf(iscale * s[j])));
        b[192 + j] = (uint8_t)(int8_t)sc;
        for (int l = 0; l < 16; l++) {
            int e = 16 * j + l, c = sc && d != 0 ? (int)lrintf(x[e] / (d * (float)sc)) : 0;
            c = PT_MAX(-32, PT_MIN(31, c)) + 32;
            int half = e / 128, k = (e % 128) / 32, i = e % 32;
            uint8_t *L = b + 64 * half + (k & 1 ? 32 : 0), *H = b + 128 + 32 * half;
            L[i] |= (uint8_t)((c & 15) << (k & 2 ? 4 : 0));
            H[i] |= (uint8_t)((c >> 4) << (2 * k));
        }
    }
}

/* ---- the table ------------------------------------------------------------ */

static const struct {
    pt_dtype t;
    void (*deq)(const uint8_t *block, float *y);
    void (*quant)(const float *x, uint8_t *block);
} formats[] = {
    {PT_Q8_0, deq_q8_0, quant_q8_0}, {PT_Q4_0, deq_q4_0, quant_q4_0},
    {PT_Q4_K, deq_q4_k, quant_q4_k}, {PT_Q5_K, deq_q5_k, quant_q5_k},
    {PT_Q6_K, deq_q6_k, quant_q6_k},
};

static int find(pt_dtype t) {
    for (size_t i = 0; i < PT_ARRAY_LEN(formats); i++)
        if (formats[i].t == t) return (int)i;
    return -1;
}

bool pt_gguf_quant_type(pt_dtype t) {
    return find(t) >= 0;
}

void pt_gguf_dequantize(pt_dtype t, const void *blocks, float *out, int64_t n) {
    int f = find(t);
    const pt_dtype_info *d = pt_dtype_get(t);
    if (f < 0) return;
    for (int64_t i = 0; i < n / d->block; i++)
        formats[f].deq((const uint8_t *)blocks + i * d->block_bytes, out + i * d->block);
}

void pt_gguf_quantize(pt_dtype t, const float *x, void *blocks, int64_t n) {
    int f = find(t);
    const pt_dtype_info *d = pt_dtype_get(t);
    if (f < 0) return;
    for (int64_t i = 0; i < n / d->block; i++)
        formats[f].quant(x + i * d->block, (uint8_t *)blocks + i * d->block_bytes);
}
