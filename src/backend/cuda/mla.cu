/*
 * mla.cu - kernels of the ops DeepSeek-V2/V3 adds: copy_cols (splitting
 * fused projections and joining multi-head latent attention's [latent |
 * rope] parts side by side) and moe_route_grouped, its router (softmax or
 * sigmoid scores, a selection bias, group-limited top-k, scaled weights).
 * Declared in cuda_family.h; the CPU versions (the reference) are in
 * cpu/cpu_mla.c.
 *
 * The router must choose the CPU's experts in the CPU's order: every
 * selection is "the largest, the lower index among equals", which a warp
 * reduction under that total order finds exactly; the group scores and
 * the weights' sum are taken in the CPU's sequential order.  Probabilities
 * differ from the CPU's only by expf's and the softmax sum's rounding.
 *
 * Every kernel follows the PDL rule of cu_common.cuh.
 */
#include <math.h>

#include "backend/cuda/cu_common.cuh"
#include "backend/cuda/cuda_family.h"

/* ---- copy_cols ------------------------------------------------------------------ */

__global__ void copy_cols_kernel(float *dst, int d_dst, int dst_off, const float *src, int d_src,
                                 int src_off, int width, int n) {
    cu_grid_trigger();
    cu_grid_wait();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)n * width) return;
    size_t t = i / width, j = i % width;
    dst[t * d_dst + dst_off + j] = src[t * d_src + src_off + j];
}

extern "C" void cu_copy_cols(const cu_ctx *c, float *dst, int d_dst, int dst_off, const float *src,
                             int d_src, int src_off, int width, int n) {
    size_t count = (size_t)n * width;
    if (n > 0 && width > 0)
        CU_LAUNCH(copy_cols_kernel, (unsigned)CU_DIV_UP(count, 256), 256, 0, c, dst, d_dst, dst_off,
                  src, d_src, src_off, width, n);
}

/* ---- moe_route_grouped ---------------------------------------------------------- */

/* The warp's largest v[i] over i < n not taken (ties: the lower i), or -1;
 * lane l looks at i = l, l + 32, ...  Every lane gets the same answer. */
__device__ int warp_best_free(const float *v, const unsigned char *taken, int n, int lane) {
    float bv = 0.f;
    int bi = -1;
    for (int i = lane; i < n; i += 32)
        if (!taken[i] && (bi < 0 || v[i] > bv)) bv = v[i], bi = i;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (oi >= 0 && (bi < 0 || ov > bv || (ov == bv && oi < bi))) bv = ov, bi = oi;
    }
    return bi;
}

/* One warp (the block) per row.  Shared memory: p[E] probabilities, s[E]
 * selection scores, gscore[G] group scores, then taken[E] and chosen[G]
 * flags. */
__global__ void __launch_bounds__(32) moe_route_grouped_kernel(cu_route_grouped_args a) {
    extern __shared__ float sh[];
    cu_grid_trigger();
    cu_grid_wait();
    const int t = blockIdx.x, lane = threadIdx.x, E = a.n_experts;
    const int G = a.n_groups > 1 ? a.n_groups : 1;
    float *p = sh, *s = p + E, *gscore = s + E;
    unsigned char *taken = (unsigned char *)(gscore + G), *chosen = taken + E;
    const float *l = a.logits + (size_t)t * E;
    if (a.gating == 1) { /* PT_MOE_SIGMOID */
        for (int e = lane; e < E; e += 32) p[e] = 1.0f / (1.0f + expf(-l[e]));
    } else {
        float mx = -INFINITY, sum = 0.f;
        for (int e = lane; e < E; e += 32) mx = fmaxf(mx, l[e]);
        mx = cu_warp_max(mx);
        for (int e = lane; e < E; e += 32) sum += p[e] = expf(l[e] - mx);
        sum = cu_warp_sum(sum);
        for (int e = lane; e < E; e += 32) p[e] /= sum;
    }
    for (int e = lane; e < E; e += 32) {
        s[e] = p[e] + (a.bias ? a.bias[e] : 0.0f);
        taken[e] = 0;
    }
    __syncwarp();
    if (a.n_groups > 1) { /* experts outside the groups_used best groups are ineligible */
        const int per = E / G;
        for (int g = lane; g < G; g += 32) { /* the sum of the group's two largest s */
            const float *sg = s + g * per;
            int b1 = 0, b2 = -1;
            for (int e = 1; e < per; e++) b1 = sg[e] > sg[b1] ? e : b1;
            for (int e = 0; e < per; e++)
                if (e != b1 && (b2 < 0 || sg[e] > sg[b2])) b2 = e;
            gscore[g] = sg[b1] + (b2 >= 0 ? sg[b2] : 0.0f);
            chosen[g] = 0;
        }
        __syncwarp();
        for (int i = 0; i < a.groups_used; i++) {
            int g = warp_best_free(gscore, chosen, G, lane);
            if (lane == 0) chosen[g] = 1;
            __syncwarp();
        }
        for (int e = lane; e < E; e += 32) taken[e] = !chosen[e / per];
        __syncwarp();
    }
    int32_t *ids = a.ids + (size_t)t * a.k;
    float *w = a.weights + (size_t)t * a.k, sum = 0.f;
    for (int j = 0; j < a.k; j++) {
        int e = warp_best_free(s, taken, E, lane);
        if (lane == 0) {
            taken[e] = 1;
            ids[j] = e;
            sum += w[j] = p[e];
        }
        __syncwarp();
    }
    if (lane == 0) {
        float mul = a.scale * (a.renorm ? 1.0f / fmaxf(sum, 6.103515625e-5f) : 1.0f);
        for (int j = 0; j < a.k; j++) w[j] *= mul;
    }
}

extern "C" int cu_moe_route_grouped(const cu_ctx *c, const cu_route_grouped_args *a) {
    const int E = a->n_experts, G = a->n_groups > 1 ? a->n_groups : 1;
    if (E < 1 || E > CU_MOE_MAX_EXPERTS || a->k < 1 || E % G ||
        (G > 1 && (a->groups_used < 1 || a->groups_used > G || a->k > a->groups_used * (E / G))) ||
        a->k > E)
        return -1;
    if (a->n <= 0) return 0;
    size_t smem = sizeof(float) * (2 * (size_t)E + G) + (size_t)E + G;
    CU_LAUNCH(moe_route_grouped_kernel, (unsigned)a->n, 32, smem, c, *a);
    return 0;
}
