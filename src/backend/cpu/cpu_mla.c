/*
 * cpu_mla.c - the ops DeepSeek-V2/V3 adds (issue 17): copy_cols, which
 * splits fused projections and joins parts side by side (multi-head latent
 * attention's [latent | rope] queries and keys), and moe_route_grouped, its
 * router (softmax or sigmoid scores, a selection bias, group-limited top-k,
 * scaled weights).
 *
 * Both are a few floats per row; they go to the pool only for large
 * batches (pt_cpu_run decides by the work estimate).
 */
#include <math.h>

#include "backend/cpu/cpu_backend.h"

/* ---- copy_cols ---------------------------------------------------------------- */

static void copy_cols_task(void *ctx, int ith, int nth) {
    const pt_op_copy_cols *a = ctx;
    int64_t lo, hi;
    pt_cpu_split(a->n, ith, nth, 1, &lo, &hi);
    for (int64_t t = lo; t < hi; t++)
        memcpy(a->dst + t * a->d_dst + a->dst_off, a->src + t * a->d_src + a->src_off,
               sizeof(float) * (size_t)a->width);
}

void pt_cpu_copy_cols(pt_backend *be, const pt_op_copy_cols *a) {
    if (a->width < 0 || a->src_off < 0 || a->dst_off < 0 || a->src_off + a->width > a->d_src ||
        a->dst_off + a->width > a->d_dst)
        pt_cpu_die("copy_cols: columns [%d, %d) of %d into [%d, %d) of %d", a->src_off,
                   a->src_off + a->width, a->d_src, a->dst_off, a->dst_off + a->width, a->d_dst);
    pt_op_copy_cols j = *a;
    pt_cpu_run(pt_cpu(be), copy_cols_task, &j, (double)a->n * a->width);
}

/* ---- moe_route_grouped -------------------------------------------------------- */

/* Experts a row can hold (the stack buffers below). */
#define ROUTE_MAX_EXPERTS 1024

/* The index of the largest of v[0..n) not yet taken (ties: the lower). */
static int best_free(const float *v, const bool *taken, int n) {
    int best = -1;
    for (int e = 0; e < n; e++)
        if (!taken[e] && (best < 0 || v[e] > v[best])) best = e;
    return best;
}

static void route_grouped_row(const pt_op_moe_route_grouped *a, int t) {
    int E = a->n_experts;
    const float *l = a->logits + (size_t)t * E;
    int32_t *ids = a->ids + (size_t)t * a->k;
    float *w = a->weights + (size_t)t * a->k;
    float p[ROUTE_MAX_EXPERTS], s[ROUTE_MAX_EXPERTS];
    bool taken[ROUTE_MAX_EXPERTS];
    if (a->gating == PT_MOE_SIGMOID) {
        for (int e = 0; e < E; e++) p[e] = 1.0f / (1.0f + expf(-l[e]));
    } else {
        float mx = -INFINITY, sum = 0;
        for (int e = 0; e < E; e++) mx = PT_MAX(mx, l[e]);
        for (int e = 0; e < E; e++) sum += p[e] = expf(l[e] - mx);
        for (int e = 0; e < E; e++) p[e] /= sum;
    }
    for (int e = 0; e < E; e++) s[e] = p[e] + (a->bias ? a->bias[e] : 0.0f), taken[e] = false;
    if (a->n_groups > 1) { /* experts of groups outside the best groups_used are ineligible */
        int per = E / a->n_groups;
        float score[ROUTE_MAX_EXPERTS];
        bool chosen[ROUTE_MAX_EXPERTS];
        for (int g = 0; g < a->n_groups; g++) {
            const float *sg = s + g * per;
            int b1 = 0;
            for (int e = 1; e < per; e++) b1 = sg[e] > sg[b1] ? e : b1;
            int b2 = -1;
            for (int e = 0; e < per; e++)
                if (e != b1 && (b2 < 0 || sg[e] > sg[b2])) b2 = e;
            score[g] = sg[b1] + (b2 >= 0 ? sg[b2] : 0.0f);
            chosen[g] = false;
        }
        for (int i = 0; i < a->groups_used; i++) chosen[best_free(score, chosen, a->n_groups)] = true;
        for (int e = 0; e < E; e++) taken[e] = !chosen[e / per];
    }
    float sum = 0;
    for (int j = 0; j < a->k; j++) {
        int e = best_free(s, taken, E);
        taken[e] = true;
        ids[j] = e;
        sum += w[j] = p[e];
    }
    float mul = a->scale * (a->renorm ? 1.0f / PT_MAX(sum, 6.103515625e-5f) : 1.0f);
    for (int j = 0; j < a->k; j++) w[j] *= mul;
}

static void route_grouped_task(void *ctx, int ith, int nth) {
    const pt_op_moe_route_grouped *a = ctx;
    int64_t lo, hi;
    pt_cpu_split(a->n, ith, nth, 1, &lo, &hi);
    for (int64_t t = lo; t < hi; t++) route_grouped_row(a, (int)t);
}

void pt_cpu_moe_route_grouped(pt_backend *be, const pt_op_moe_route_grouped *a) {
    bool grouped = a->n_groups > 1;
    if (a->n_experts <= 0 || a->n_experts > ROUTE_MAX_EXPERTS || a->k <= 0 ||
        (grouped && (a->n_experts % a->n_groups || a->groups_used <= 0 ||
                     a->groups_used > a->n_groups ||
                     a->k > a->groups_used * (a->n_experts / a->n_groups))) ||
        (!grouped && a->k > a->n_experts))
        pt_cpu_die("moe_route_grouped: top %d of %d experts in %d groups (%d used)", a->k,
                   a->n_experts, a->n_groups, a->groups_used);
    pt_op_moe_route_grouped j = *a;
    pt_cpu_run(pt_cpu(be), route_grouped_task, &j, (double)a->n * a->n_experts * (a->k + 8));
}
