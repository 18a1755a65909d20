/*
 * cpu_elementwise.c - the row-wise and element-wise ops: rmsnorm, add,
 * add_bias, swiglu, rope and gather_rows; and Gemma's geglu, scale and
 * softcap, and argmax (plain loops: they run once per layer or once per
 * output).
 *
 * Each op splits its rows (or elements, in cache-line multiples) across the
 * pool and calls one kernel per piece.  All are memory- or latency-bound, so
 * small calls stay on the calling thread (see pt_cpu_run).
 */
#include <math.h>

#include "backend/cpu/cpu_backend.h"

/* A generic job: most ops here need a handful of pointers and sizes. */
typedef struct ew_job {
    const pt_cpu_kernels *k;
    float *y;
    const float *a, *b;
    size_t count; /* elements, or rows */
    int d;
    float eps; /* rmsnorm's epsilon; the factor of scale, the cap of softcap */
} ew_job;

/* ---- rmsnorm ------------------------------------------------------------------ */

static void rmsnorm_task(void *ctx, int ith, int nth) {
    const ew_job *j = ctx;
    int64_t lo, hi;
    pt_cpu_split((int64_t)j->count, ith, nth, 1, &lo, &hi);
    for (int64_t i = lo; i < hi; i++)
        j->k->rmsnorm_row(j->y + i * j->d, j->a + i * j->d, j->b, j->d, j->eps);
}

void pt_cpu_rmsnorm(pt_backend *be, float *y, const float *x, const float *g, int n, int d, float eps) {
    pt_cpu_backend *cb = pt_cpu(be);
    ew_job j = {.k = cb->k, .y = y, .a = x, .b = g, .count = (size_t)PT_MAX(n, 0), .d = d, .eps = eps};
    pt_cpu_run(cb, rmsnorm_task, &j, (double)n * d);
}

/* ---- add, swiglu: flat element ranges ----------------------------------------- */

static void add_task(void *ctx, int ith, int nth) {
    const ew_job *j = ctx;
    int64_t lo, hi;
    pt_cpu_split((int64_t)j->count, ith, nth, 16, &lo, &hi);
    if (hi > lo) j->k->add(j->y + lo, j->a + lo, j->b + lo, (size_t)(hi - lo));
}

void pt_cpu_add(pt_backend *be, float *y, const float *a, const float *b, size_t count) {
    pt_cpu_backend *cb = pt_cpu(be);
    ew_job j = {.k = cb->k, .y = y, .a = a, .b = b, .count = count};
    pt_cpu_run(cb, add_task, &j, (double)count);
}

static void swiglu_task(void *ctx, int ith, int nth) {
    const ew_job *j = ctx;
    int64_t lo, hi;
    pt_cpu_split((int64_t)j->count, ith, nth, 16, &lo, &hi);
    if (hi > lo) j->k->swiglu(j->y + lo, j->a + lo, j->b + lo, (size_t)(hi - lo));
}

void pt_cpu_swiglu(pt_backend *be, float *y, const float *gate, const float *up, size_t count) {
    pt_cpu_backend *cb = pt_cpu(be);
    ew_job j = {.k = cb->k, .y = y, .a = gate, .b = up, .count = count};
    /* exp makes each element ~10x an add, so parallelize sooner. */
    pt_cpu_run(cb, swiglu_task, &j, 8.0 * (double)count);
}

/* ---- geglu, scale, softcap: plain loops over element ranges -------------------- */

/* gelu with the tanh approximation, as transformers' gelu_pytorch_tanh:
 * 0.5 x (1 + tanh z) written as x / (1 + e^-2z), which is the same value
 * without the cancellation of 1 + tanh z for negative x. */
static inline float gelu_tanh(float x) {
    const float c = 0.7978845608028654f; /* sqrt(2 / pi) */
    float z = c * (x + 0.044715f * x * x * x);
    return x / (1.0f + expf(-2.0f * z));
}

static void geglu_task(void *ctx, int ith, int nth) {
    const ew_job *j = ctx;
    int64_t lo, hi;
    pt_cpu_split((int64_t)j->count, ith, nth, 16, &lo, &hi);
    for (int64_t i = lo; i < hi; i++) j->y[i] = gelu_tanh(j->a[i]) * j->b[i];
}

void pt_cpu_geglu(pt_backend *be, float *y, const float *gate, const float *up, size_t count) {
    pt_cpu_backend *cb = pt_cpu(be);
    ew_job j = {.y = y, .a = gate, .b = up, .count = count};
    pt_cpu_run(cb, geglu_task, &j, 16.0 * (double)count);
}

static void scale_task(void *ctx, int ith, int nth) {
    const ew_job *j = ctx;
    int64_t lo, hi;
    pt_cpu_split((int64_t)j->count, ith, nth, 16, &lo, &hi);
    for (int64_t i = lo; i < hi; i++) j->y[i] *= j->eps;
}

void pt_cpu_scale(pt_backend *be, float *x, float s, size_t count) {
    ew_job j = {.y = x, .count = count, .eps = s};
    pt_cpu_run(pt_cpu(be), scale_task, &j, (double)count);
}

static void softcap_task(void *ctx, int ith, int nth) {
    const ew_job *j = ctx;
    int64_t lo, hi;
    pt_cpu_split((int64_t)j->count, ith, nth, 16, &lo, &hi);
    for (int64_t i = lo; i < hi; i++) j->y[i] = j->eps * tanhf(j->y[i] / j->eps);
}

void pt_cpu_softcap(pt_backend *be, float *x, float cap, size_t count) {
    ew_job j = {.y = x, .count = count, .eps = cap};
    pt_cpu_run(pt_cpu(be), softcap_task, &j, 16.0 * (double)count);
}

/* ---- argmax: greedy picks, a row at a time -------------------------------------- */

/* The sampler's argmax (sampler.c): the first of the largest; a NaN is
 * never larger, so it never wins, and a row without a finite value or
 * +inf gives 0. */
static void argmax_task(void *ctx, int ith, int nth) {
    const ew_job *j = ctx;
    int64_t lo, hi;
    pt_cpu_split((int64_t)j->count, ith, nth, 1, &lo, &hi);
    for (int64_t i = lo; i < hi; i++) {
        const float *x = j->a + (size_t)i * (size_t)j->d;
        int32_t best = 0;
        float max = -INFINITY;
        for (int c = 0; c < j->d; c++)
            if (x[c] > max) max = x[c], best = c;
        ((int32_t *)j->y)[i] = best;
    }
}

void pt_cpu_argmax(pt_backend *be, int32_t *ids, const float *x, int n, int d) {
    ew_job j = {.y = (float *)ids, .a = x, .count = (size_t)n, .d = d};
    pt_cpu_run(pt_cpu(be), argmax_task, &j, (double)n * d);
}

/* ---- gpt-oss: the clamped SwiGLU, and biases by expert id ------------------------- */

typedef struct oai_job {
    float *y;
    const float *gate, *up, *bias;
    const int32_t *ids;
    size_t count;
    int k, d;
    float alpha, limit;
} oai_job;

static void swiglu_oai_task(void *ctx, int ith, int nth) {
    const oai_job *j = ctx;
    int64_t lo, hi;
    pt_cpu_split((int64_t)j->count, ith, nth, 16, &lo, &hi);
    for (int64_t i = lo; i < hi; i++) {
        float g = PT_MIN(j->gate[i], j->limit), u = PT_MAX(-j->limit, PT_MIN(j->up[i], j->limit));
        j->y[i] = (u + 1.0f) * (g / (1.0f + expf(-j->alpha * g)));
    }
}

void pt_cpu_swiglu_oai(pt_backend *be, float *y, const float *gate, const float *up, size_t count,
                       float alpha, float limit) {
    oai_job j = {.y = y, .gate = gate, .up = up, .count = count, .alpha = alpha, .limit = limit};
    pt_cpu_run(pt_cpu(be), swiglu_oai_task, &j, 16.0 * (double)count);
}

static void add_id_task(void *ctx, int ith, int nth) {
    const oai_job *j = ctx;
    int64_t lo, hi;
    pt_cpu_split((int64_t)j->count, ith, nth, 1, &lo, &hi); /* (row, slot) pairs */
    for (int64_t i = lo; i < hi; i++) {
        float *y = j->y + i * j->d;
        const float *b = j->bias + (size_t)j->ids[i] * j->d;
        for (int c = 0; c < j->d; c++) y[c] += b[c];
    }
}

void pt_cpu_add_id(pt_backend *be, float *y, const float *bias, const int32_t *ids, int n, int k,
                   int d) {
    oai_job j = {.y = y, .bias = bias, .ids = ids, .count = (size_t)PT_MAX(n, 0) * k, .d = d};
    pt_cpu_run(pt_cpu(be), add_id_task, &j, (double)n * k * d);
}

/* ---- add_bias: every row gets the same vector --------------------------------- */

static void add_bias_task(void *ctx, int ith, int nth) {
    const ew_job *j = ctx;
    int64_t lo, hi;
    pt_cpu_split((int64_t)j->count, ith, nth, 1, &lo, &hi);
    for (int64_t i = lo; i < hi; i++) j->k->add(j->y + i * j->d, j->y + i * j->d, j->b, (size_t)j->d);
}

void pt_cpu_add_bias(pt_backend *be, float *y, const float *bias, int n, int d) {
    pt_cpu_backend *cb = pt_cpu(be);
    ew_job j = {.k = cb->k, .y = y, .b = bias, .count = (size_t)PT_MAX(n, 0), .d = d};
    pt_cpu_run(cb, add_bias_task, &j, (double)n * d);
}

/* ---- gather_rows ------------------------------------------------------------------ */

typedef struct gather_job {
    float *dst;
    const float *src;
    const int32_t *idx;
    int n, d;
} gather_job;

static void gather_task(void *ctx, int ith, int nth) {
    const gather_job *j = ctx;
    int64_t lo, hi;
    pt_cpu_split(j->n, ith, nth, 1, &lo, &hi);
    for (int64_t i = lo; i < hi; i++)
        memcpy(j->dst + i * j->d, j->src + (int64_t)j->idx[i] * j->d, (size_t)j->d * sizeof(float));
}

void pt_cpu_gather_rows(pt_backend *be, float *dst, const float *src, const int32_t *idx, int n, int d) {
    gather_job j = {dst, src, idx, n, d};
    pt_cpu_run(pt_cpu(be), gather_task, &j, (double)n * d);
}

/* ---- rope ------------------------------------------------------------------------- */

typedef struct rope_job {
    const pt_cpu_kernels *k;
    float *x;
    const int32_t *pos;
    int n, n_heads, head_dim;
    const pt_rope *rope;
    float *const *scratch;
} rope_job;

/* The angles are pos * inv_freq[i] in double: at position 128k a float
 * product would already be off by ~0.004 rad.  sin/cos are then taken in
 * double and rounded once, and shared by every head of the row. */
static void rope_row_angles(float *c, float *s, int32_t pos, const pt_rope *r) {
    for (int i = 0; i < r->n_rot / 2; i++) {
        double theta = (double)pos * (double)r->inv_freq[i];
        c[i] = (float)(cos(theta) * r->mscale);
        s[i] = (float)(sin(theta) * r->mscale);
    }
}

static void rope_task(void *ctx, int ith, int nth) {
    const rope_job *j = ctx;
    float *c = j->scratch[ith], *s = c + j->rope->n_rot / 2;
    int64_t lo, hi;
    pt_cpu_split(j->n, ith, nth, 1, &lo, &hi);
    for (int64_t t = lo; t < hi; t++) {
        rope_row_angles(c, s, j->pos[t], j->rope);
        for (int h = 0; h < j->n_heads; h++) {
            float *xh = j->x + (t * j->n_heads + h) * j->head_dim;
            if (j->rope->style == PT_ROPE_NEOX)
                j->k->rope_neox(xh, c, s, j->rope->n_rot);
            else
                j->k->rope_norm(xh, c, s, j->rope->n_rot);
        }
    }
}

void pt_cpu_rope(pt_backend *be, float *x, const pt_batch_view *b, int n_heads, int head_dim,
                 const pt_rope *rope) {
    pt_cpu_backend *cb = pt_cpu(be);
    if (rope->n_rot < 0 || rope->n_rot > head_dim || rope->n_rot % 2)
        pt_cpu_die("rope: n_rot %d must be even and at most head_dim %d", rope->n_rot, head_dim);
    if (rope->style != PT_ROPE_NORM && rope->style != PT_ROPE_NEOX)
        pt_cpu_die("rope: unknown style %d", rope->style);
    if (pt_cpu_scratch_reserve(cb, (size_t)rope->n_rot + 16, "rope")) return;
    rope_job j = {cb->k, x, b->pos, b->n_tokens, n_heads, head_dim, rope, cb->scratch};
    /* sin/cos in double cost ~50 element-ops per pair. */
    pt_cpu_run(cb, rope_task, &j, (double)b->n_tokens * (n_heads * head_dim + 50.0 * rope->n_rot));
}
