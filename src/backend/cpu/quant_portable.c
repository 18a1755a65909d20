/*
 * quant_portable.c - quantized-weight kernels in plain C: activation
 * quantization (used by both flavours), the portable row kernels, and row
 * dequantization for embeddings.
 *
 * Every format is read through one function per format that decodes a
 * chunk of 32 consecutive weights of a row into integer codes c[32] and
 * two floats, mul and add, such that weight i = mul * c[i] + add.  The row
 * kernel is then the same for all formats (quant_kernels.h has the sum).
 */
#include <math.h>

#include "backend/cpu/quant_kernels.h"
#include "backend/repack.h"

/* ---- activations ----------------------------------------------------------- */

size_t pt_qk_act_bytes(int n, int64_t cols) {
    size_t chunks = (size_t)n * (size_t)(cols / 32);
    return chunks * 32 * sizeof(int16_t) + chunks * 2 * sizeof(float) + 64;
}

void pt_qk_act_init(pt_qact *a, void *scratch, int n, int64_t cols, int block, int perm) {
    uintptr_t p = ((uintptr_t)scratch + 31) & ~(uintptr_t)31; /* 32-byte aligned chunks */
    a->n = n;
    a->cols = cols;
    a->n_chunks = cols / 32;
    a->block = block;
    a->n_blocks = cols / block;
    a->perm = perm;
    a->q = (int16_t *)p;
    a->d = (float *)(p + (size_t)n * (size_t)cols * sizeof(int16_t));
    a->ds = a->d + (size_t)n * (size_t)a->n_blocks;
}

int pt_qk_act_block(const pt_weight *w) {
    return w->dtype == PT_AFFINE ? w->group_size : 32;
}

/* Element stored at position p of a chunk, for each order. */
static int perm_elem(int perm, int p) {
    switch (perm) {
    case PT_QK_PERM_EVEN_ODD: return p < 16 ? 2 * p : 2 * (p - 16) + 1;
    case PT_QK_PERM_STRIDE4: return 4 * (p % 8) + p / 8;
    default: return p;
    }
}

void pt_qk_quantize_act(pt_qact *a, const float *x, int t0, int t1) {
    int order[32];
    for (int p = 0; p < 32; p++) order[p] = perm_elem(a->perm, p);
    for (int t = t0; t < t1; t++)
        for (int64_t b = 0; b < a->n_blocks; b++) {
            const float *v = x + (size_t)t * (size_t)a->cols + (size_t)(b * a->block);
            int16_t *q = a->q + (size_t)t * (size_t)a->cols + (size_t)(b * a->block);
            float amax = 0;
            for (int i = 0; i < a->block; i++) amax = fmaxf(amax, fabsf(v[i]));
            float d = amax / 32767, id = d > 0 ? 1 / d : 0;
            int sum = 0;
            for (int c = 0; c < a->block; c += 32) /* each chunk in the kernels' order */
                for (int p = 0; p < 32; p++) {
                    q[c + p] = (int16_t)lrintf(v[c + order[p]] * id);
                    sum += q[c + p];
                }
            size_t k = (size_t)t * (size_t)a->n_blocks + (size_t)b;
            a->d[k] = d;
            a->ds[k] = d * (float)sum;
        }
}

size_t pt_qk_act8_bytes(int n, int64_t cols) {
    return (size_t)n * (size_t)cols + 4 * (size_t)n * (size_t)(cols / 32) * sizeof(float) + 64;
}

void pt_qk_act8_init(pt_qact8 *a, void *scratch, int n, int64_t cols) {
    uintptr_t p = ((uintptr_t)scratch + 31) & ~(uintptr_t)31;
    a->n = n;
    a->cols = cols;
    a->n_chunks = cols / 32;
    a->q = (int8_t *)p;
    a->d = (float *)(p + (size_t)n * (size_t)cols); /* cols is a multiple of 32 */
    a->ds = a->d + (size_t)n * (size_t)a->n_chunks;
    a->sq = (int32_t *)(a->ds + (size_t)n * (size_t)a->n_chunks);
}

void pt_qk_quantize_act8(pt_qact8 *a, const float *x, int t0, int t1) {
    for (int t = t0; t < t1; t++)
        for (int64_t c = 0; c < a->n_chunks; c++) {
            const float *v = x + (size_t)t * (size_t)a->cols + 32 * (size_t)c;
            int8_t *q = a->q + (size_t)t * (size_t)a->cols + 32 * (size_t)c;
            float amax = 0;
            for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(v[i]));
            float d = amax / 127, id = d > 0 ? 1 / d : 0;
            int sum = 0, half = 0;
            for (int i = 0; i < 32; i++) {
                sum += q[i] = (int8_t)lrintf(v[i] * id);
                if (i == 15) half = sum;
            }
            int32_t *sq = a->sq + 2 * ((size_t)t * (size_t)a->n_chunks + (size_t)c);
            sq[0] = half;
            sq[1] = sum - half;
            a->d[(size_t)t * (size_t)a->n_chunks + (size_t)c] = d;
            a->ds[(size_t)t * (size_t)a->n_chunks + (size_t)c] = d * (float)sum;
        }
}

/* ---- chunk decoders ----------------------------------------------------------- */

/* Where row r of w lives: codes (or blocks), and affine scales and biases;
 * r itself for repacked layouts, whose rows are not contiguous. */
typedef struct qrow {
    const uint8_t *p, *s, *b;
    int64_t r;
} qrow;

typedef void (*chunk_fn)(const pt_weight *w, qrow row, int64_t c, int32_t out[32], float *mul,
                         float *add);

static float f16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return pt_f16_to_f32(h);
}

static float scale_at(const uint8_t *p, int64_t i, pt_dtype t) {
    uint16_t h;
    float f;
    switch (t) {
    case PT_F16: memcpy(&h, p + 2 * i, 2); return pt_f16_to_f32(h);
    case PT_BF16: memcpy(&h, p + 2 * i, 2); return pt_bf16_to_f32(h);
    default: memcpy(&f, p + 4 * i, 4); return f;
    }
}

static void chunk_affine(const pt_weight *w, qrow row, int64_t c, int32_t out[32], float *mul,
                         float *add) {
    int bits = w->bits;
    uint64_t bit = (uint64_t)c * 32 * (unsigned)bits;
    const uint8_t *p = row.p + bit / 8; /* chunks start on a byte (32 * bits is a multiple of 8) */
    uint64_t acc = 0;
    int have = 0, k = 0, mask = (1 << bits) - 1;
    while (k < 32) { /* little-endian bit stream */
        if (have < bits) {
            acc |= (uint64_t)*p++ << have;
            have += 8;
            continue;
        }
        out[k++] = (int32_t)(acc & (uint64_t)mask);
        acc >>= bits;
        have -= bits;
    }
    int64_t g = c * 32 / w->group_size;
    *mul = scale_at(row.s, g, w->scale_dtype);
    *add = scale_at(row.b, g, w->scale_dtype);
}

static void chunk_q8_0(const pt_weight *w, qrow row, int64_t c, int32_t out[32], float *mul,
                       float *add) {
    const uint8_t *b = row.p + 34 * c;
    for (int i = 0; i < 32; i++) out[i] = (int8_t)b[2 + i];
    *mul = f16(b);
    *add = 0;
}

static void chunk_q4_0(const pt_weight *w, qrow row, int64_t c, int32_t out[32], float *mul,
                       float *add) {
    const uint8_t *b = row.p + 18 * c;
    for (int i = 0; i < 16; i++) {
        out[i] = (b[2 + i] & 15) - 8;
        out[i + 16] = (b[2 + i] >> 4) - 8;
    }
    *mul = f16(b);
    *add = 0;
}

/* q4_0 repacked 8 rows at a time (PT_LAYOUT_Q4_0X8): the file's block,
 * gathered back, then read as above. */
static void chunk_q4_0x8(const pt_weight *w, qrow row, int64_t c, int32_t out[32], float *mul,
                         float *add) {
    uint8_t b[18];
    pt_q4_0x8_block(b, w->data, w->cols, row.r, c);
    chunk_q4_0(w, (qrow){.p = b}, 0, out, mul, add);
}

/* 6-bit scale and min of sub-block j of a q4_k/q5_k block. */
static void scale_min_k4(int j, const uint8_t *s, int *sc, int *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

static void chunk_q4_k(const pt_weight *w, qrow row, int64_t c, int32_t out[32], float *mul,
                       float *add) {
    const uint8_t *b = row.p + 144 * (c / 8);
    int j = (int)(c % 8), sc, m, shift = j % 2 ? 4 : 0;
    const uint8_t *qs = b + 16 + 32 * (j / 2);
    for (int i = 0; i < 32; i++) out[i] = (qs[i] >> shift) & 15;
    scale_min_k4(j, b + 4, &sc, &m);
    *mul = f16(b) * (float)sc;
    *add = -(f16(b + 2) * (float)m);
}

static void chunk_q5_k(const pt_weight *w, qrow row, int64_t c, int32_t out[32], float *mul,
                       float *add) {
    const uint8_t *b = row.p + 176 * (c / 8);
    int j = (int)(c % 8), sc, m, shift = j % 2 ? 4 : 0;
    const uint8_t *qh = b + 16, *qs = b + 48 + 32 * (j / 2);
    for (int i = 0; i < 32; i++) out[i] = ((qs[i] >> shift) & 15) | ((qh[i] >> j) & 1) << 4;
    scale_min_k4(j, b + 4, &sc, &m);
    *mul = f16(b) * (float)sc;
    *add = -(f16(b + 2) * (float)m);
}

/* q6_k sub-blocks are 16 wide: their int8 scales are folded into c. */
static void chunk_q6_k(const pt_weight *w, qrow row, int64_t c, int32_t out[32], float *mul,
                       float *add) {
    const uint8_t *b = row.p + 210 * (c / 8);
    int j = (int)(c % 8), half = j / 4, k = j % 4;
    const uint8_t *ql = b + 64 * half + (k & 1 ? 32 : 0), *qh = b + 128 + 32 * half;
    const int8_t *sc = (const int8_t *)(b + 192) + 2 * j;
    for (int i = 0; i < 32; i++) {
        int q = ((ql[i] >> (k & 2 ? 4 : 0)) & 15) | ((qh[i] >> (2 * k)) & 3) << 4;
        out[i] = sc[i / 16] * (q - 32);
    }
    *mul = f16(b + 208);
    *add = 0;
}

/* MXFP4: e2m1 codes as twice their value ({0, 1, 2, 3, 4, 6, 8, 12} and
 * negatives, all integers), so mul = 2^(e - 127) / 2. */
static void chunk_mxfp4(const pt_weight *w, qrow row, int64_t c, int32_t out[32], float *mul,
                        float *add) {
    static const int8_t twice[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
    const uint8_t *b = row.p + 17 * c;
    for (int i = 0; i < 16; i++) {
        out[i] = twice[b[1 + i] & 15];
        out[i + 16] = twice[b[1 + i] >> 4];
    }
    *mul = ldexpf(1.0f, (int)b[0] - 128);
    *add = 0;
    (void)w;
}

static const struct {
    pt_dtype t;
    int block, block_bytes;
    chunk_fn chunk;
} formats[] = {
    {PT_AFFINE, 0, 0, chunk_affine}, {PT_Q8_0, 32, 34, chunk_q8_0},
    {PT_Q4_0, 32, 18, chunk_q4_0},   {PT_Q4_K, 256, 144, chunk_q4_k},
    {PT_Q5_K, 256, 176, chunk_q5_k}, {PT_Q6_K, 256, 210, chunk_q6_k},
    {PT_MXFP4, 32, 17, chunk_mxfp4},
};

static int find_format(pt_dtype t) {
    for (size_t i = 0; i < PT_ARRAY_LEN(formats); i++)
        if (formats[i].t == t) return (int)i;
    return -1;
}

bool pt_qk_handles(pt_dtype t) {
    return find_format(t) >= 0;
}

static chunk_fn chunk_of(const pt_weight *w) {
    return w->layout == PT_LAYOUT_Q4_0X8 ? chunk_q4_0x8 : formats[find_format(w->dtype)].chunk;
}

static qrow row_of(const pt_weight *w, int64_t r) {
    qrow q = {.r = r};
    if (w->dtype == PT_AFFINE) {
        size_t ss = w->scale_dtype == PT_F32 ? 4 : 2, groups = (size_t)(w->cols / w->group_size);
        q.p = (const uint8_t *)w->data + (size_t)r * (size_t)(w->cols * w->bits / 8);
        q.s = (const uint8_t *)w->scales + (size_t)r * groups * ss;
        q.b = (const uint8_t *)w->biases + (size_t)r * groups * ss;
    } else {
        int f = find_format(w->dtype);
        q.p = (const uint8_t *)w->data +
              (size_t)r * (size_t)(w->cols / formats[f].block) * (size_t)formats[f].block_bytes;
    }
    return q;
}

void pt_qk_dequant_row(const pt_weight *w, int64_t r, float *out) {
    int f = find_format(w->dtype);
    if (f < 0) return;
    qrow row = row_of(w, r);
    chunk_fn chunk = chunk_of(w);
    int32_t c[32];
    float mul, add;
    for (int64_t k = 0; k < w->cols / 32; k++) {
        chunk(w, row, k, c, &mul, &add);
        for (int i = 0; i < 32; i++) out[32 * k + i] = mul * (float)c[i] + add;
    }
}

/* ---- the row kernel --------------------------------------------------------- */

static void rows_portable(const pt_weight *w, const pt_qact *a, float *y, int64_t r0,
                          int64_t r1) {
    chunk_fn chunk = chunk_of(w);
    int32_t c[32];
    float mul, add;
    for (int64_t r = r0; r < r1; r++) {
        qrow row = row_of(w, r);
        for (int t0 = 0; t0 < a->n; t0 += 8) { /* a tile of tokens shares each decoded chunk */
            int nt = PT_MIN(8, a->n - t0);
            float acc[8] = {0};
            for (int64_t k = 0; k < a->n_chunks; k++) {
                chunk(w, row, k, c, &mul, &add);
                int64_t b = k * 32 / a->block; /* add * sum(x) once per block */
                bool first = (k * 32) % a->block == 0;
                for (int t = 0; t < nt; t++) {
                    size_t at = (size_t)(t0 + t) * (size_t)a->n_blocks + (size_t)b;
                    const int16_t *q = a->q + (size_t)(t0 + t) * (size_t)a->cols + 32 * k;
                    int32_t isum = 0;
                    for (int i = 0; i < 32; i++) isum += c[i] * q[i];
                    acc[t] += mul * a->d[at] * (float)isum + (first ? add * a->ds[at] : 0);
                }
            }
            for (int t = 0; t < nt; t++) y[(size_t)(t0 + t) * (size_t)w->rows + (size_t)r] = acc[t];
        }
    }
}

pt_qk_rows_fn pt_qk_portable_rows(const pt_weight *w) {
    return find_format(w->dtype) >= 0 ? rows_portable : NULL;
}
