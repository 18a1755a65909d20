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
 * The delta rule runs a decode row in the recurrent form (transformers'
 * torch_recurrent_gated_delta_rule order of operations) and a run of a
 * sequence's consecutive rows (prefill) in the chunkwise form, chunk rows
 * at a time: the deltas of a chunk solve one triangular system against the
 * state at its start, and the state is updated once per chunk.
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
 * epsilon inside the root as in FLA); with eps > 0, x / max(|x|, eps)
 * (ggml's l2_norm, its sum in double). */
static void l2norm_scaled(float *y, const float *x, int d, float scale, float eps) {
    float r;
    if (eps > 0) {
        double ss = 0;
        for (int i = 0; i < d; i++) ss += (double)(x[i] * x[i]);
        r = scale / fmaxf(sqrtf((float)ss), eps);
    } else {
        float ss = 0;
        for (int i = 0; i < d; i++) ss += x[i] * x[i];
        r = scale / sqrtf(ss + 1e-6f);
    }
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

/* Row t's inputs for value head h: q (l2-normed, / sqrt dk) and k
 * (l2-normed) into q and k; its log-decay g and its beta. */
static const float *head_inputs(const pt_op_gated_delta *a, int t, int h, float *q, float *k,
                                float *g, float *beta) {
    int dk = a->dk, nk = a->n_k_heads, nv = a->n_v_heads;
    int kh = a->tiled ? h % nk : h / (nv / nk);
    const float *row = a->qkv + (size_t)t * a->stride, *ba = a->ba + (size_t)t * 2 * nv;
    l2norm_scaled(q, row + (size_t)kh * dk, dk, 1.0f / sqrtf((float)dk), a->l2_eps);
    l2norm_scaled(k, row + (size_t)(nk + kh) * dk, dk, 1.0f, a->l2_eps);
    *g = a->A[h] * softplusf(ba[nv + h] + a->dt_bias[h]);
    *beta = sigmoidf(ba[h]);
    return row + (size_t)2 * nk * dk + (size_t)h * a->dv; /* v */
}

/* dots[j] = x·k_j for j < n, with the chunk's keys transposed (KT
 * [dk][c]): the inner loop runs along j, so it vectorizes (a plain dot
 * product's sum would not, without reassociation). */
static void kt_dots(float *dots, const float *x, const float *KT, int dk, int c, int n) {
    for (int j = 0; j < n; j++) dots[j] = 0;
    for (int m = 0; m < dk; m++) {
        const float *kt = KT + (size_t)m * c;
        for (int j = 0; j < n; j++) dots[j] += x[m] * kt[j];
    }
}

/* y[dv] = scale * Sᵀx for S [dk][dv]. */
static void state_t_mul(float *y, const float *S, const float *x, int dk, int dv, float scale) {
    for (int j = 0; j < dv; j++) y[j] = 0;
    for (int i = 0; i < dk; i++) {
        const float *row = S + (size_t)i * dv;
        for (int j = 0; j < dv; j++) y[j] += row[j] * x[i];
    }
    for (int j = 0; j < dv; j++) y[j] *= scale;
}

/* Rows t0 .. t0+c-1 of one sequence, value head h, from state S, in the
 * chunkwise form.  With G_i the decays' running sum over the chunk, the
 * deltas u_i = beta_i (v_i - (e^g_i S_{i-1})ᵀ k_i) solve the unit lower-
 * triangular system
 *     u_i + beta_i sum_{j<i} e^{G_i - G_j} (k_i·k_j) u_j = beta_i (v_i - e^{G_i} S0ᵀ k_i),
 * then o_i = e^{G_i} S0ᵀ q_i + sum_{j<=i} e^{G_i - G_j} (q_i·k_j) u_j and
 * S = e^{G_last} S0 + sum_j e^{G_last - G_j} k_j u_jᵀ.  Every exponent is
 * <= 0 (the decays are): nothing overflows. */
static void delta_chunk(const pt_op_gated_delta *a, int t0, int c, int h, float *S, float *ws) {
    int dk = a->dk, dv = a->dv, nv = a->n_v_heads;
    float *Q = ws, *K = Q + (size_t)c * dk, *U = K + (size_t)c * dk, *G = U + (size_t)c * dv;
    float *B = G + c, *tmp = B + c, *KT = tmp + c, *dots = KT + (size_t)c * dk, acc = 0;
    for (int i = 0; i < c; i++) {
        float g;
        const float *v = head_inputs(a, t0 + i, h, Q + (size_t)i * dk, K + (size_t)i * dk, &g, &B[i]);
        G[i] = acc += g;
        float *u = U + (size_t)i * dv;
        state_t_mul(u, S, K + (size_t)i * dk, dk, dv, expf(G[i]));
        for (int j = 0; j < dv; j++) u[j] = B[i] * (v[j] - u[j]);
        for (int m = 0; m < dk; m++) KT[(size_t)m * c + i] = K[(size_t)i * dk + m];
    }
    for (int i = 1; i < c; i++) { /* forward substitution */
        kt_dots(dots, K + (size_t)i * dk, KT, dk, c, i);
        float *u = U + (size_t)i * dv;
        for (int j = 0; j < i; j++) {
            float coef = B[i] * expf(G[i] - G[j]) * dots[j];
            const float *uj = U + (size_t)j * dv;
            for (int e = 0; e < dv; e++) u[e] -= coef * uj[e];
        }
    }
    for (int i = 0; i < c; i++) {
        float *o = a->out + ((size_t)(t0 + i) * nv + (size_t)h) * dv;
        state_t_mul(o, S, Q + (size_t)i * dk, dk, dv, expf(G[i]));
        kt_dots(dots, Q + (size_t)i * dk, KT, dk, c, i + 1);
        for (int j = 0; j <= i; j++) {
            float coef = expf(G[i] - G[j]) * dots[j];
            const float *uj = U + (size_t)j * dv;
            for (int e = 0; e < dv; e++) o[e] += coef * uj[e];
        }
    }
    float last = G[c - 1], keep = expf(last);
    for (int j = 0; j < c; j++) tmp[j] = expf(last - G[j]);
    for (int m = 0; m < dk; m++) {
        float *row = S + (size_t)m * dv;
        for (int e = 0; e < dv; e++) row[e] *= keep;
        for (int j = 0; j < c; j++) {
            float km = tmp[j] * K[(size_t)j * dk + m];
            const float *uj = U + (size_t)j * dv;
            for (int e = 0; e < dv; e++) row[e] += km * uj[e];
        }
    }
}

/* Rows from t on that continue t's sequence (next position, no restart),
 * at most max. */
static int run_length(const pt_batch_view *b, int t, int max) {
    int n = 1;
    while (n < max && t + n < b->n_tokens && b->seq[t + n] == b->seq[t] &&
           b->pos[t + n] == b->pos[t + n - 1] + 1)
        n++;
    return n;
}

static void delta_task(void *ctx, int ith, int nth) {
    const delta_job *j = ctx;
    const pt_op_gated_delta *a = j->a;
    int dk = a->dk, dv = a->dv, nv = a->n_v_heads, chunk = PT_MAX(a->chunk, 1);
    float *q = j->scratch[ith], *k = q + dk, *mem = k + dk, *cw = mem + dv;
    int64_t lo, hi;
    pt_cpu_split(nv, ith, nth, 1, &lo, &hi);
    for (int t = 0; t < a->b.n_tokens;) {
        int slot = row_slot(&a->b, t, "gated_delta"), c = run_length(&a->b, t, chunk);
        for (int64_t h = lo; h < hi; h++) {
            float *S = a->state + ((size_t)slot * nv + (size_t)h) * dk * dv;
            if (a->b.pos[t] == 0) memset(S, 0, sizeof(float) * (size_t)dk * dv);
            if (c > 1) {
                delta_chunk(a, t, c, (int)h, S, cw);
                continue;
            }
            float g, beta;
            const float *v = head_inputs(a, t, (int)h, q, k, &g, &beta);
            delta_step(S, a->out + ((size_t)t * nv + (size_t)h) * dv, q, k, v, expf(g), beta, dk,
                       dv, mem);
        }
        t += c;
    }
}

void pt_cpu_gated_delta(pt_backend *be, const pt_op_gated_delta *a) {
    pt_cpu_backend *cb = pt_cpu(be);
    if (a->n_k_heads < 1 || a->n_v_heads % a->n_k_heads)
        pt_cpu_die("gated_delta: %d value heads over %d key heads", a->n_v_heads, a->n_k_heads);
    size_t c = (size_t)PT_MAX(a->chunk, 1);
    size_t floats = (size_t)2 * a->dk + (size_t)a->dv + c * ((size_t)3 * a->dk + a->dv + 4) + 16;
    if (pt_cpu_scratch_reserve(cb, floats, "gated_delta")) return;
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
