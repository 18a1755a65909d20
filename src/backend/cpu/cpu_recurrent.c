/*
 * cpu_recurrent.c - the ops of hybrid recurrent layers (Gated DeltaNet,
 * Qwen3-Next): gather_cols and sigmoid_mul (splitting and gating fused
 * projections), the causal depthwise conv with its tail state, the gated
 * delta rule, and the gated output RMSNorm.
 *
 * State ops (conv1d_silu, gated_delta) run a sequence's rows one token at
 * a time, in row order: each row reads the state its sequence's previous
 * row left.  So they parallelize over what is independent within a row
 * (channels for the conv, value heads for the delta rule), never over rows.
 * A row at position 0 starts its sequence from a zero state, which is how
 * a state slot is (re)initialized: no separate clear is needed.
 *
 * The delta rule here is the recurrent form for every row, prefill too
 * (transformers' torch_recurrent_gated_delta_rule order of operations);
 * the chunked form for long prefills is not written yet.
 */
#include <math.h>

#include "backend/cpu/cpu_backend.h"

static inline float sigmoidf(float x) {
    return 1.0f / (1.0f + expf(-x));
}

/* torch's softplus (beta 1, threshold 20: linear above it). */
static inline float softplusf(float x) {
    return x > 20.0f ? x : log1pf(expf(x));
}

/* The slot of row t's sequence, checked: a model bug if out of range. */
static int row_slot(const pt_batch_view *b, int t, const char *op) {
    if (!b->state_slot) pt_cpu_die("%s: the batch has no recurrent-state slots", op);
    int s = b->seq[t];
    if (s < 0 || s >= b->n_seqs) pt_cpu_die("%s: row %d: sequence %d out of range", op, t, s);
    int slot = b->state_slot[s];
    if (slot < 0) pt_cpu_die("%s: row %d: sequence %d holds no state slot", op, t, s);
    return slot;
}

/* ---- gather_cols, sigmoid_mul ------------------------------------------------ */

typedef struct cols_job {
    float *y;
    const float *x, *g;
    const int32_t *idx;
    int n, d_src, d;
} cols_job;

static void gather_cols_task(void *ctx, int ith, int nth) {
    const cols_job *j = ctx;
    int64_t lo, hi;
    pt_cpu_split(j->n, ith, nth, 1, &lo, &hi);
    for (int64_t t = lo; t < hi; t++) {
        const float *src = j->x + t * j->d_src;
        float *dst = j->y + t * j->d;
        for (int i = 0; i < j->d; i++) dst[i] = src[j->idx[i]];
    }
}

void pt_cpu_gather_cols(pt_backend *be, float *dst, const float *src, const int32_t *idx, int n,
                        int d_src, int d_dst) {
    for (int i = 0; i < d_dst; i++)
        if (idx[i] < 0 || idx[i] >= d_src)
            pt_cpu_die("gather_cols: column %d of %d out of range", idx[i], d_src);
    cols_job j = {.y = dst, .x = src, .idx = idx, .n = n, .d_src = d_src, .d = d_dst};
    pt_cpu_run(pt_cpu(be), gather_cols_task, &j, (double)n * d_dst);
}

static void sigmoid_mul_task(void *ctx, int ith, int nth) {
    const cols_job *j = ctx;
    int64_t lo, hi;
    pt_cpu_split(j->n, ith, nth, 1, &lo, &hi);
    for (int64_t t = lo; t < hi; t++) {
        const float *x = j->x + t * j->d, *g = j->g + t * j->d_src;
        float *y = j->y + t * j->d;
        for (int i = 0; i < j->d; i++) y[i] = x[i] * sigmoidf(g[j->d_src == 1 ? 0 : i]);
    }
}

void pt_cpu_sigmoid_mul(pt_backend *be, float *y, const float *x, const float *g, int n, int d,
                        int g_d) {
    if (g_d != 1 && g_d != d) pt_cpu_die("sigmoid_mul: gate rows of %d for rows of %d", g_d, d);
    cols_job j = {.y = y, .x = x, .g = g, .n = n, .d_src = g_d, .d = d};
    pt_cpu_run(pt_cpu(be), sigmoid_mul_task, &j, 10.0 * n * d);
}

/* ---- conv1d_silu ----------------------------------------------------------------- */

typedef struct conv_job {
    float *y, *state;
    const float *x, *w;
    const pt_batch_view *b;
    int C, K;
} conv_job;

/* Channels [lo, hi) of every row, in row order. */
static void conv_task(void *ctx, int ith, int nth) {
    const conv_job *j = ctx;
    int C = j->C, K = j->K;
    int64_t lo, hi;
    pt_cpu_split(C, ith, nth, 16, &lo, &hi);
    for (int t = 0; t < j->b->n_tokens; t++) {
        int slot = row_slot(j->b, t, "conv1d_silu");
        float *st = j->state + (size_t)slot * (K - 1) * C; /* [K-1][C], oldest first */
        const float *x = j->x + (size_t)t * C;
        float *y = j->y + (size_t)t * C;
        bool fresh = j->b->pos[t] == 0;
        for (int64_t c = lo; c < hi; c++) {
            const float *w = j->w + c * K;
            float acc = w[K - 1] * x[c];
            for (int i = 0; i < K - 1; i++) {
                float u = fresh ? 0.0f : st[(size_t)i * C + c];
                acc += w[i] * u;
            }
            /* shift the tail: drop the oldest input, append this one */
            for (int i = 0; i + 1 < K - 1; i++)
                st[(size_t)i * C + c] = fresh ? 0.0f : st[(size_t)(i + 1) * C + c];
            if (K > 1) st[(size_t)(K - 2) * C + c] = x[c];
            y[c] = acc * sigmoidf(acc);
        }
    }
}

void pt_cpu_conv1d_silu(pt_backend *be, float *y, const float *x, const float *w, float *state,
                        const pt_batch_view *b, int C, int K) {
    if (K < 1 || C < 1) pt_cpu_die("conv1d_silu: kernel %d over %d channels", K, C);
    if (y == x) pt_cpu_die("conv1d_silu: y must not alias x");
    conv_job j = {.y = y, .state = state, .x = x, .w = w, .b = b, .C = C, .K = K};
    pt_cpu_run(pt_cpu(be), conv_task, &j, 2.0 * b->n_tokens * C * K);
}

/* ---- gated_delta ------------------------------------------------------------------ */

typedef struct delta_job {
    const pt_op_gated_delta *a;
    float *const *scratch;
} delta_job;

/* x / sqrt(sum x^2 + 1e-6) times scale, into y (transformers' l2norm, the
 * epsilon inside the root as in FLA). */
static void l2norm_scaled(float *y, const float *x, int d, float scale) {
    float ss = 0;
    for (int i = 0; i < d; i++) ss += x[i] * x[i];
    float r = scale / sqrtf(ss + 1e-6f);
    for (int i = 0; i < d; i++) y[i] = x[i] * r;
}

/* One value head's step: S = exp(g) S; S += k ⊗ beta (v - Sᵀk); out = Sᵀq. */
static void delta_step(float *S, float *out, const float *q, const float *k, const float *v,
                       float decay, float beta, int dk, int dv, float *mem) {
    for (int j = 0; j < dv; j++) mem[j] = 0;
    for (int i = 0; i < dk; i++) {
        float *row = S + (size_t)i * dv;
        for (int j = 0; j < dv; j++) {
            row[j] *= decay;
            mem[j] += row[j] * k[i];
        }
    }
    for (int j = 0; j < dv; j++) mem[j] = (v[j] - mem[j]) * beta; /* the delta */
    for (int j = 0; j < dv; j++) out[j] = 0;
    for (int i = 0; i < dk; i++) {
        float *row = S + (size_t)i * dv;
        for (int j = 0; j < dv; j++) {
            row[j] += k[i] * mem[j];
            out[j] += row[j] * q[i];
        }
    }
}

static void delta_task(void *ctx, int ith, int nth) {
    const delta_job *j = ctx;
    const pt_op_gated_delta *a = j->a;
    int dk = a->dk, dv = a->dv, nk = a->n_k_heads, nv = a->n_v_heads, ratio = nv / nk;
    float *q = j->scratch[ith], *k = q + dk, *mem = k + dk;
    float qscale = 1.0f / sqrtf((float)dk);
    int64_t lo, hi;
    pt_cpu_split(nv, ith, nth, 1, &lo, &hi);
    for (int t = 0; t < a->b.n_tokens; t++) {
        int slot = row_slot(&a->b, t, "gated_delta");
        const float *row = a->qkv + (size_t)t * a->stride, *ba = a->ba + (size_t)t * 2 * nv;
        for (int64_t h = lo; h < hi; h++) {
            int kh = (int)h / ratio;
            float *S = a->state + ((size_t)slot * nv + (size_t)h) * dk * dv;
            if (a->b.pos[t] == 0) memset(S, 0, sizeof(float) * (size_t)dk * dv);
            l2norm_scaled(q, row + (size_t)kh * dk, dk, qscale);
            l2norm_scaled(k, row + (size_t)(nk + kh) * dk, dk, 1.0f);
            const float *v = row + (size_t)2 * nk * dk + (size_t)h * dv;
            float g = -expf(a->A_log[h]) * softplusf(ba[nv + h] + a->dt_bias[h]);
            delta_step(S, a->out + ((size_t)t * nv + (size_t)h) * dv, q, k, v, expf(g),
                       sigmoidf(ba[h]), dk, dv, mem);
        }
    }
}

void pt_cpu_gated_delta(pt_backend *be, const pt_op_gated_delta *a) {
    pt_cpu_backend *cb = pt_cpu(be);
    if (a->n_k_heads < 1 || a->n_v_heads % a->n_k_heads)
        pt_cpu_die("gated_delta: %d value heads over %d key heads", a->n_v_heads, a->n_k_heads);
    if (pt_cpu_scratch_reserve(cb, (size_t)2 * a->dk + (size_t)a->dv + 16, "gated_delta")) return;
    delta_job j = {a, cb->scratch};
    pt_cpu_run(cb, delta_task, &j, 4.0 * a->b.n_tokens * a->n_v_heads * a->dk * a->dv);
}

/* ---- rmsnorm_gated ------------------------------------------------------------------ */

typedef struct gnorm_job {
    const pt_op_rmsnorm_gated *a;
} gnorm_job;

static void gnorm_task(void *ctx, int ith, int nth) {
    const pt_op_rmsnorm_gated *a = ((const gnorm_job *)ctx)->a;
    int64_t lo, hi;
    pt_cpu_split(a->n, ith, nth, 1, &lo, &hi);
    for (int64_t r = lo; r < hi; r++) {
        const float *x = a->x + r * a->d, *z = a->z + r * a->d;
        float *y = a->y + r * a->d;
        float ss = 0;
        for (int i = 0; i < a->d; i++) ss += x[i] * x[i];
        float inv = 1.0f / sqrtf(ss / (float)a->d + a->eps);
        for (int i = 0; i < a->d; i++) y[i] = x[i] * inv * a->w[i] * (z[i] * sigmoidf(z[i]));
    }
}

void pt_cpu_rmsnorm_gated(pt_backend *be, const pt_op_rmsnorm_gated *a) {
    gnorm_job j = {a};
    pt_cpu_run(pt_cpu(be), gnorm_task, &j, 10.0 * a->n * a->d);
}
