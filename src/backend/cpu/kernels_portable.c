/*
 * kernels_portable.c - the kernel set in plain C, for any CPU.
 *
 * It is the reference the AVX2 set is tested against and the fallback where
 * AVX2 is missing.  Clarity first, then speed: one generic row-dot loop,
 * inlined with a per-dtype "element as f32" function, serves every dtype.
 * Dot products keep eight independent accumulators, which lets the CPU
 * pipeline them (and makes the summation order close to the SIMD set's).
 */
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu_kernels.h"
#include "base/base.h"

/* ---- element conversion, one pair of functions per dtype ---------------- */

static void f32_to_f32(float *dst, const void *src, int64_t n) {
    memcpy(dst, src, (size_t)n * sizeof(float));
}

/* IEEE half to float with no branches (pt_f16_to_f32 loops over subnormals,
 * and a branch on random signs mispredicts half the time): normals move
 * exponent and mantissa into place and rebias; inf/NaN get exponent 255;
 * subnormals are exactly mantissa * 2^-24 in float arithmetic, selected by
 * mask; the sign is or-ed in last. */
static inline float half_to_float(uint16_t h) {
    uint32_t em = h & 0x7fffu, u = (em << 13) + ((uint32_t)(127 - 15) << 23), sub_bits;
    u += -(uint32_t)(em >= 0x7c00u) & ((uint32_t)(128 - 16) << 23);
    float sub = (float)em * 0x1p-24f;
    memcpy(&sub_bits, &sub, 4);
    uint32_t is_sub = -(uint32_t)(em < 0x0400u);
    u = (u & ~is_sub) | (sub_bits & is_sub);
    u |= (uint32_t)(h & 0x8000u) << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static void f16_to_f32(float *dst, const void *src, int64_t n) {
    const uint16_t *s = src;
    for (int64_t i = 0; i < n; i++) dst[i] = half_to_float(s[i]);
}

static void bf16_to_f32(float *dst, const void *src, int64_t n) {
    const uint16_t *s = src;
    for (int64_t i = 0; i < n; i++) dst[i] = pt_bf16_to_f32(s[i]);
}

static void f32_from_f32(void *dst, const float *src, int64_t n) {
    memcpy(dst, src, (size_t)n * sizeof(float));
}

static void f16_from_f32(void *dst, const float *src, int64_t n) {
    uint16_t *d = dst;
    for (int64_t i = 0; i < n; i++) d[i] = pt_f32_to_f16(src[i]);
}

static void bf16_from_f32(void *dst, const float *src, int64_t n) {
    uint16_t *d = dst;
    for (int64_t i = 0; i < n; i++) d[i] = pt_f32_to_bf16(src[i]);
}


/* One element of a row as f32, per dtype; the row dot below is inlined
 * with each, so every dtype gets its own loop with the conversion fused in
 * (no staging buffer). */
typedef float (*elt_fn)(const void *row, int64_t i);

static inline float f32_elt(const void *row, int64_t i) {
    return ((const float *)row)[i];
}
static inline float f16_elt(const void *row, int64_t i) {
    return half_to_float(((const uint16_t *)row)[i]);
}
static inline float bf16_elt(const void *row, int64_t i) {
    return pt_bf16_to_f32(((const uint16_t *)row)[i]);
}

static inline float dot_elt(elt_fn elt, const void *row, const float *x, int64_t n) {
    float s[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) s[j] += elt(row, i + j) * x[i + j];
    for (; i < n; i++) s[0] += elt(row, i) * x[i];
    return ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
}

static float dot_f32(const float *a, const float *b, int64_t n) {
    return dot_elt(f32_elt, a, b, n);
}

/* ---- row dot products, and the kernels built on them ---------------------- */

typedef float (*rowdot_fn)(const void *row, const float *x, int64_t cols);

static float f32_rowdot(const void *row, const float *x, int64_t cols) {
    return dot_elt(f32_elt, row, x, cols);
}
static float f16_rowdot(const void *row, const float *x, int64_t cols) {
    return dot_elt(f16_elt, row, x, cols);
}
static float bf16_rowdot(const void *row, const float *x, int64_t cols) {
    return dot_elt(bf16_elt, row, x, cols);
}

static void matvec_any(rowdot_fn dot, float *y, const void *w, size_t row_bytes, int64_t nr,
                       const float *x, int64_t cols) {
    for (int64_t r = 0; r < nr; r++) y[r] = dot((const char *)w + r * row_bytes, x, cols);
}

static void matmul_small_any(rowdot_fn dot, float *y, int64_t ldy, const void *w, size_t row_bytes,
                             int64_t nr, const float *x, int64_t ldx, int nt, int64_t cols) {
    /* Weight rows outermost, so each is streamed once and stays in cache
     * while the nt tokens use it. */
    for (int64_t r = 0; r < nr; r++)
        for (int t = 0; t < nt; t++)
            y[t * ldy + r] = dot((const char *)w + r * row_bytes, x + t * ldx, cols);
}

/* The per-dtype entries: thin wrappers that name the row dot / converter. */
#define PT_DEFINE_WOPS(T)                                                                        \
    static void T##_matvec(float *y, const void *w, size_t rb, int64_t nr, const float *x,       \
                           int64_t cols) {                                                       \
        matvec_any(T##_rowdot, y, w, rb, nr, x, cols);                                           \
    }                                                                                            \
    static void T##_matmul_small(float *y, int64_t ldy, const void *w, size_t rb, int64_t nr,    \
                                 const float *x, int64_t ldx, int nt, int64_t cols) {            \
        matmul_small_any(T##_rowdot, y, ldy, w, rb, nr, x, ldx, nt, cols);                       \
    }

PT_DEFINE_WOPS(f32)
PT_DEFINE_WOPS(f16)
PT_DEFINE_WOPS(bf16)

/* ---- packed GEMM ---------------------------------------------------------- */

static void pack_panel(float *panel, const pt_cpu_wops *wo, const void *w, size_t row_bytes, int nr,
                       int kb, float *tmp) {
    for (int j = 0; j < PT_CPU_NR; j++) {
        if (j < nr) wo->to_f32(tmp, (const char *)w + (size_t)j * row_bytes, kb);
        for (int k = 0; k < kb; k++) panel[k * PT_CPU_NR + j] = j < nr ? tmp[k] : 0.0f;
    }
}

static void gemm_tile(float *y, int64_t ldy, const float *xp, const float *panel, int kb, int nt,
                      int nr, int accumulate) {
    float c[PT_CPU_MR][PT_CPU_NR] = {{0}};
    for (int k = 0; k < kb; k++) {
        const float *p = panel + k * PT_CPU_NR;
        for (int t = 0; t < nt; t++) {
            float a = xp[k * PT_CPU_MR + t];
            for (int j = 0; j < PT_CPU_NR; j++) c[t][j] += a * p[j];
        }
    }
    for (int t = 0; t < nt; t++)
        for (int j = 0; j < nr; j++) y[t * ldy + j] = (accumulate ? y[t * ldy + j] : 0) + c[t][j];
}

/* ---- attention tiles -------------------------------------------------------- */

static void attn_scores(float *s, const float *q, const float *k, int64_t ld, int cnt, int hd) {
    for (int c = 0; c < cnt; c++) s[c] = dot_f32(q, k + c * ld, hd);
}

static void attn_accum(float *acc, const float *w, const float *v, int64_t ld, int cnt, int hd) {
    for (int c = 0; c < cnt; c++)
        for (int i = 0; i < hd; i++) acc[i] += w[c] * v[c * ld + i];
}

/* ---- element-wise ---------------------------------------------------------- */

static void rmsnorm_row(float *y, const float *x, const float *g, int64_t d, float eps) {
    double ss = 0;
    for (int64_t i = 0; i < d; i++) ss += (double)x[i] * x[i];
    float s = (float)(1.0 / sqrt(ss / (double)d + eps));
    for (int64_t i = 0; i < d; i++) y[i] = x[i] * s * g[i];
}

static void add(float *y, const float *a, const float *b, size_t n) {
    for (size_t i = 0; i < n; i++) y[i] = a[i] + b[i];
}

static void swiglu(float *y, const float *g, const float *u, size_t n) {
    for (size_t i = 0; i < n; i++) y[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

static float exp_sum(float *x, int64_t n, float max) {
    float s = 0;
    for (int64_t i = 0; i < n; i++) s += x[i] = expf(x[i] - max);
    return s;
}

static float max(const float *x, int64_t n) {
    float m = x[0];
    for (int64_t i = 1; i < n; i++) m = x[i] > m ? x[i] : m;
    return m;
}

static void scale(float *x, float a, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] *= a;
}

static void rope_norm(float *x, const float *cos, const float *sin, int n_rot) {
    for (int i = 0; i < n_rot / 2; i++) {
        float x0 = x[2 * i], x1 = x[2 * i + 1];
        x[2 * i] = x0 * cos[i] - x1 * sin[i];
        x[2 * i + 1] = x0 * sin[i] + x1 * cos[i];
    }
}

static void rope_neox(float *x, const float *cos, const float *sin, int n_rot) {
    int h = n_rot / 2;
    for (int i = 0; i < h; i++) {
        float x0 = x[i], x1 = x[i + h];
        x[i] = x0 * cos[i] - x1 * sin[i];
        x[i + h] = x0 * sin[i] + x1 * cos[i];
    }
}

static float sum(const float *x, size_t n) {
    float s[8] = {0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) s[j] += x[i + j];
    for (; i < n; i++) s[0] += x[i];
    return s[0] + s[1] + s[2] + s[3] + s[4] + s[5] + s[6] + s[7];
}

/* Eight chains of a * m + c; the compiler may vectorize them (SSE2), which
 * is what the scalar GEMM tile gets too. */
static double peak_f32(int64_t iters, float *sink) {
    float a[8];
    for (int k = 0; k < 8; k++) a[k] = (float)k;
    for (int64_t i = 0; i < iters; i++)
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) a[k] = a[k] * 0.9999999f + 1e-7f;
    *sink = a[0] + a[1] + a[2] + a[3] + a[4] + a[5] + a[6] + a[7];
    return (double)iters * 8 * 2;
}

/* The scalar GEMM tile and the scalar row dots run at similar rates, so the
 * small path's single pass over the weights wins up to moderate n. */
#define WOPS(T) {T##_matvec, T##_matmul_small, T##_to_f32, T##_from_f32, 8}

static const pt_cpu_kernels portable = {
    .name = "portable",
    .nr = PT_CPU_NR,
    .w = {[PT_F32] = WOPS(f32), [PT_F16] = WOPS(f16), [PT_BF16] = WOPS(bf16)},
    .pack_panel = pack_panel,
    .gemm_tile = gemm_tile,
    .attn_scores = attn_scores,
    .attn_accum = attn_accum,
    .rmsnorm_row = rmsnorm_row,
    .add = add,
    .swiglu = swiglu,
    .exp_sum = exp_sum,
    .max = max,
    .scale = scale,
    .rope_norm = rope_norm,
    .rope_neox = rope_neox,
    .sum = sum,
    .peak_f32 = peak_f32,
};

const pt_cpu_kernels *pt_cpu_kernels_portable(void) {
    return &portable;
}
