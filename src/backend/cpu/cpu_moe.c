/*
 * cpu_moe.c - the mixture-of-experts ops: routing (softmax, top-k,
 * renormalization), the matmul by expert id, the weighted combine, and
 * moe_ffn (the routed FFN as one op: here exactly the sequence of the
 * others, the reference the CUDA backend's fused kernels are checked by).
 *
 * matmul_id groups the (row, slot) pairs of a call by expert with a
 * counting sort, then runs each selected expert once as an ordinary matmul
 * (cpu_matmul.c, any weight format, the whole pool) over the rows that chose
 * it: an expert no row selects is never read, and one selected by many rows
 * is streamed once for all of them (prefill).  A pair alone on its expert
 * whose input and output rows are contiguous (every decode step) runs in
 * place without copies.
 *
 * Routing and combining are a few floats per row and run on the pool only
 * when the batch is large.
 */
#include <math.h>

#include "backend/cpu/cpu_backend.h"

/* ---- moe_route ------------------------------------------------------------- */

typedef struct route_job {
    int32_t *ids;
    float *w;
    const float *logits;
    int n, n_experts, k;
    bool renorm;
} route_job;

/* Softmax of one row, then the k largest probabilities in descending order
 * (a strict > keeps the lower expert first among equals). */
static void route_row(const route_job *j, int t) {
    const float *l = j->logits + (size_t)t * j->n_experts;
    int32_t *ids = j->ids + (size_t)t * j->k;
    float *w = j->w + (size_t)t * j->k, mx = -INFINITY, sum = 0, kept = 0;
    for (int e = 0; e < j->n_experts; e++) mx = PT_MAX(mx, l[e]);
    for (int e = 0; e < j->n_experts; e++) sum += expf(l[e] - mx);
    for (int s = 0; s < j->k; s++) {
        int best = -1;
        for (int e = 0; e < j->n_experts; e++) {
            bool taken = false;
            for (int r = 0; r < s; r++) taken |= ids[r] == e;
            if (!taken && (best < 0 || l[e] > l[best])) best = e;
        }
        ids[s] = best;
        w[s] = expf(l[best] - mx) / sum;
        kept += w[s];
    }
    if (j->renorm)
        for (int s = 0; s < j->k; s++) w[s] /= kept;
}

static void route_task(void *ctx, int ith, int nth) {
    const route_job *j = ctx;
    int64_t lo, hi;
    pt_cpu_split(j->n, ith, nth, 1, &lo, &hi);
    for (int64_t t = lo; t < hi; t++) route_row(j, (int)t);
}

void pt_cpu_moe_route(pt_backend *be, int32_t *ids, float *weights, const float *logits, int n,
                      int n_experts, int k, bool renorm) {
    if (k <= 0 || k > n_experts) pt_cpu_die("moe_route: top %d of %d experts", k, n_experts);
    route_job j = {ids, weights, logits, n, n_experts, k, renorm};
    pt_cpu_run(pt_cpu(be), route_task, &j, (double)n * n_experts * (k + 4));
}

/* ---- matmul_id -------------------------------------------------------------- */

typedef struct copy_job {
    float *dst;
    const float *src;
    const int32_t *pairs; /* (row * k + slot) of each gathered row */
    int n, k, x_slots;
    int64_t d;
    bool scatter; /* false: dst[i] = x row of pair i; true: y row of pair i = src[i] */
} copy_job;

static const float *x_row(const float *x, int32_t pair, int k, int x_slots, int64_t cols) {
    int t = pair / k, slot = pair % k;
    return x + ((int64_t)t * x_slots + (x_slots > 1 ? slot : 0)) * cols;
}

static void copy_task(void *ctx, int ith, int nth) {
    const copy_job *j = ctx;
    int64_t lo, hi;
    pt_cpu_split(j->n, ith, nth, 1, &lo, &hi);
    for (int64_t i = lo; i < hi; i++) {
        if (j->scatter)
            memcpy(j->dst + (int64_t)j->pairs[i] * j->d, j->src + i * j->d, (size_t)j->d * 4);
        else
            memcpy(j->dst + i * j->d, x_row(j->src, j->pairs[i], j->k, j->x_slots, j->d),
                   (size_t)j->d * 4);
    }
}

/* Pairs (row * k + slot) sorted by expert: expert e's are
 * order[first[e] .. first[e + 1]).  first has n_experts + 1 entries.
 * Skipped pairs (id -1) are left out. */
static void sort_by_expert(const int32_t *ids, int pairs, int n_experts, int32_t *order,
                           int32_t *first) {
    memset(first, 0, sizeof(int32_t) * (size_t)(n_experts + 1));
    for (int i = 0; i < pairs; i++)
        if (ids[i] >= 0) first[ids[i] + 1]++;
    for (int e = 0; e < n_experts; e++) first[e + 1] += first[e];
    int32_t *fill = first + n_experts + 1; /* scratch cursor per expert */
    memcpy(fill, first, sizeof(int32_t) * (size_t)n_experts);
    for (int i = 0; i < pairs; i++)
        if (ids[i] >= 0) order[fill[ids[i]]++] = i;
}

void pt_cpu_matmul_id(pt_backend *be, float *y, const float *x, const pt_weight *w,
                      const int32_t *ids, int n, int k, int x_slots) {
    pt_cpu_backend *cb = pt_cpu(be);
    int E = w->n_experts, pairs = n * k;
    if (E <= 0) pt_cpu_die("matmul_id: weight is not a stack of experts");
    if (k <= 0 || (x_slots != 1 && x_slots != k))
        pt_cpu_die("matmul_id: %d input slots for top %d", x_slots, k);
    int64_t rows = w->rows, cols = w->cols;
    for (int i = 0; i < pairs; i++) {
        if (ids[i] < -1 || ids[i] >= E) pt_cpu_die("matmul_id: expert id %d of %d", ids[i], E);
        if (ids[i] < 0) memset(y + (int64_t)i * rows, 0, sizeof(float) * (size_t)rows); /* skipped */
    }
    if (pairs <= 0) return;
    /* one buffer: order [pairs], first [2E + 1], then gathered x and y rows */
    size_t ints = (size_t)pairs + 2 * (size_t)E + 1, head = (ints * 4 + 63) & ~(size_t)63;
    size_t bytes = head + 4 * (size_t)pairs * (size_t)(cols + rows);
    char *buf = pt_cpu_grow(&cb->moe_buf, &cb->moe_cap, bytes);
    int32_t *order = (int32_t *)buf, *first = order + pairs;
    float *xg = (float *)(buf + head), *yg = xg + (size_t)pairs * cols;
    sort_by_expert(ids, pairs, E, order, first);

    for (int e = 0; e < E; e++) {
        int cnt = first[e + 1] - first[e];
        if (cnt == 0) continue; /* never read */
        const int32_t *sel = order + first[e];
        pt_weight we = pt_weight_expert(w, e);
        if (cnt == 1) { /* one pair: straight from its x row into its y row */
            pt_cpu_matmul(be, y + (int64_t)sel[0] * rows, x_row(x, sel[0], k, x_slots, cols), &we, 1);
            continue;
        }
        copy_job g = {xg, x, sel, cnt, k, x_slots, cols, false};
        pt_cpu_run(cb, copy_task, &g, (double)cnt * cols);
        pt_cpu_matmul(be, yg, xg, &we, cnt);
        copy_job s = {y, yg, sel, cnt, k, x_slots, rows, true};
        pt_cpu_run(cb, copy_task, &s, (double)cnt * rows);
    }
}

/* ---- moe_combine ------------------------------------------------------------ */

typedef struct combine_job {
    float *y;
    const float *x, *w;
    int n, k, d;
} combine_job;

static void combine_task(void *ctx, int ith, int nth) {
    const combine_job *j = ctx;
    int64_t lo, hi;
    pt_cpu_split(j->n, ith, nth, 1, &lo, &hi);
    for (int64_t t = lo; t < hi; t++) {
        float *y = j->y + t * j->d;
        for (int i = 0; i < j->d; i++) y[i] = 0;
        for (int s = 0; s < j->k; s++) {
            const float *x = j->x + (t * j->k + s) * j->d;
            float w = j->w[t * j->k + s];
            for (int i = 0; i < j->d; i++) y[i] += w * x[i];
        }
    }
}

void pt_cpu_moe_combine(pt_backend *be, float *y, const float *x, const float *weights, int n,
                        int k, int d) {
    combine_job j = {y, x, weights, n, k, d};
    pt_cpu_run(pt_cpu(be), combine_task, &j, (double)n * k * d);
}

/* ---- moe_local (expert parallel) ------------------------------------------------ */

void pt_cpu_moe_local(int32_t *ids, float *weights, int n, int k, int first, int count) {
    for (int64_t i = 0; i < (int64_t)n * k; i++) {
        if (ids[i] >= first && ids[i] < first + count) {
            ids[i] -= first;
        } else {
            ids[i] = -1;
            weights[i] = 0;
        }
    }
}

/* ---- moe_ffn: the reference, the ops it stands for -------------------------------- */

/* Runs exactly the op sequence backend.h gives for moe_ffn, so a model that
 * calls it computes on the CPU what it computed op by op. */
void pt_cpu_moe_ffn(pt_backend *be, const pt_op_moe_ffn *a) {
    int n = a->n, k = a->k, f = (int)a->w_gate->rows, d = (int)a->w_down->rows;
    size_t count = (size_t)n * k * f;
    pt_cpu_moe_route(be, a->ids, a->weights, a->logits, n, a->n_experts, k, a->renorm);
    pt_cpu_matmul_id(be, a->gate, a->x, a->w_gate, a->ids, n, k, 1);
    pt_cpu_matmul_id(be, a->up, a->x, a->w_up, a->ids, n, k, 1);
    if (a->gate_bias) pt_cpu_add_id(be, a->gate, a->gate_bias, a->ids, n, k, f);
    if (a->up_bias) pt_cpu_add_id(be, a->up, a->up_bias, a->ids, n, k, f);
    if (a->act == PT_MOE_SWIGLU_OAI)
        pt_cpu_swiglu_oai(be, a->gate, a->gate, a->up, count, a->alpha, a->limit);
    else if (a->act == PT_MOE_GEGLU)
        pt_cpu_geglu(be, a->gate, a->gate, a->up, count);
    else
        pt_cpu_swiglu(be, a->gate, a->gate, a->up, count);
    pt_cpu_matmul_id(be, a->out, a->gate, a->w_down, a->ids, n, k, k);
    if (a->down_bias) pt_cpu_add_id(be, a->out, a->down_bias, a->ids, n, k, d);
    pt_cpu_moe_combine(be, a->y, a->out, a->weights, n, k, d);
}
