/*
 * family_ops.cu - kernels of the ops the model families beyond Llama add:
 * GeGLU, scale and soft-cap (Gemma), attention with a window,
 * soft-capped scores and sinks (Gemma's sliding and global layers,
 * gpt-oss), gpt-oss's clamped SwiGLU and bias by expert id, and the
 * mixture-of-experts routing and weighted combine (the matmul by expert
 * id is moe.cu's).  Declared in cuda_family.h.
 *
 * These are the first CUDA versions: each is written to be right and to
 * read only what it must (an unselected expert is never read), not yet to
 * be fast (element loads, not 16-byte ones; the attention is the one-warp
 * plain kernel).  Every kernel follows the PDL rule of cu_common.cuh.
 */
#include <float.h>

#include "backend/cuda/cu_common.cuh"
#include "backend/cuda/cuda_family.h"

/* ---- elementwise -------------------------------------------------------------- */

__global__ void geglu_kernel(float *y, const float *gate, const float *up, size_t count) {
    cu_grid_trigger();
    cu_grid_wait();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < count) y[i] = cu_gelu_tanh(gate[i]) * up[i];
}

extern "C" void cu_geglu(const cu_ctx *c, float *y, const float *gate, const float *up,
                         size_t count) {
    if (count) CU_LAUNCH(geglu_kernel, (unsigned)CU_DIV_UP(count, 256), 256, 0, c, y, gate, up, count);
}

__global__ void scale_kernel(float *x, float s, size_t count, int softcap) {
    cu_grid_trigger();
    cu_grid_wait();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < count) x[i] = softcap ? s * tanhf(x[i] / s) : x[i] * s;
}

extern "C" void cu_scale(const cu_ctx *c, float *x, float s, size_t count, int softcap) {
    if (count) CU_LAUNCH(scale_kernel, (unsigned)CU_DIV_UP(count, 256), 256, 0, c, x, s, count, softcap);
}

__global__ void swiglu_oai_kernel(float *y, const float *gate, const float *up, size_t count,
                                  float alpha, float limit) {
    cu_grid_trigger();
    cu_grid_wait();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= count) return;
    y[i] = cu_swiglu_oai(gate[i], up[i], alpha, limit);
}

extern "C" void cu_swiglu_oai(const cu_ctx *c, float *y, const float *gate, const float *up,
                              size_t count, float alpha, float limit) {
    if (count)
        CU_LAUNCH(swiglu_oai_kernel, (unsigned)CU_DIV_UP(count, 256), 256, 0, c, y, gate, up, count,
                  alpha, limit);
}

__global__ void add_id_kernel(float *y, const float *bias, const int32_t *ids, int pairs, int d) {
    cu_grid_trigger();
    cu_grid_wait();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)pairs * d) return;
    size_t pr = i / d, col = i % d;
    y[i] += bias[(size_t)ids[pr] * d + col];
}

extern "C" void cu_add_id(const cu_ctx *c, float *y, const float *bias, const int32_t *ids, int n,
                          int k, int d) {
    size_t count = (size_t)n * k * d;
    if (count)
        CU_LAUNCH(add_id_kernel, (unsigned)CU_DIV_UP(count, 256), 256, 0, c, y, bias, ids, n * k, d);
}

/* ---- attention with a window, soft-capped scores and sinks ---------------------- */

#define EXT_MAX_DPL 16 /* head_dim <= 512 */

/* One warp per (row, query head), lanes over head_dim, an online softmax
 * over the positions the row sees. */
template <int T>
__global__ void attn_ext_kernel(cu_attn_args a, int window, float softcap, const float *sinks) {
    cu_grid_trigger();
    cu_grid_wait();
    const int wid = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31;
    if (wid >= a.n * a.n_heads) return;
    const int t = wid / a.n_heads, h = wid % a.n_heads, hd = a.head_dim;
    const int kvh = h / (a.n_heads / a.n_kv_heads), p = a.pos[t];
    const int j0 = window > 0 ? max(0, p + 1 - window) : 0;
    const int32_t *btrow = a.block_table + (size_t)a.seq[t] * a.max_pages;
    const float *qr = a.q + ((size_t)t * a.n_heads + h) * hd;
    float qv[EXT_MAX_DPL], acc[EXT_MAX_DPL];
#pragma unroll
    for (int i = 0; i < EXT_MAX_DPL; i++) {
        int d = lane + 32 * i;
        qv[i] = d < hd ? qr[d] : 0.f;
        acc[i] = 0.f;
    }
    float m = -FLT_MAX, l = 0.f;
    for (int j = j0; j <= p; j++) {
        int page = btrow[j / a.page_size];
        size_t base = (((size_t)page * a.page_size + j % a.page_size) * a.n_kv_heads + kvh) * hd;
        float dot = 0.f;
#pragma unroll
        for (int i = 0; i < EXT_MAX_DPL; i++) {
            int d = lane + 32 * i;
            if (d < hd) dot = fmaf(qv[i], cu_load_elem<T>(a.k, base + d), dot);
        }
        float s = cu_warp_sum(dot) * a.scale;
        if (softcap > 0.f) s = softcap * tanhf(s / softcap);
        float mnew = fmaxf(m, s), alpha = expf(m - mnew), pj = expf(s - mnew);
        l = l * alpha + pj;
        m = mnew;
#pragma unroll
        for (int i = 0; i < EXT_MAX_DPL; i++) {
            int d = lane + 32 * i;
            if (d < hd) acc[i] = acc[i] * alpha + pj * cu_load_elem<T>(a.v, base + d);
        }
    }
    if (sinks) l += expf(sinks[h] - m); /* a logit without a value */
    float *o = a.out + ((size_t)t * a.n_heads + h) * hd;
#pragma unroll
    for (int i = 0; i < EXT_MAX_DPL; i++) {
        int d = lane + 32 * i;
        if (d < hd) o[d] = acc[i] / l;
    }
}

extern "C" void cu_attention_ext(const cu_ctx *c, const cu_attn_args *a, int window,
                                 float softcap, const float *sinks) {
    int warps = a->n * a->n_heads;
    if (warps <= 0) return;
    int blocks = CU_DIV_UP(warps, 4);
    if (a->dtype == CU_F32)
        CU_LAUNCH((attn_ext_kernel<CU_F32>), blocks, 128, 0, c, *a, window, softcap, sinks);
    else if (a->dtype == CU_F16)
        CU_LAUNCH((attn_ext_kernel<CU_F16>), blocks, 128, 0, c, *a, window, softcap, sinks);
    else
        CU_LAUNCH((attn_ext_kernel<CU_BF16>), blocks, 128, 0, c, *a, window, softcap, sinks);
}

/* ---- routing ---------------------------------------------------------------------- */

#define ROUTE_PER_LANE (CU_MOE_MAX_EXPERTS / 32)

/* One warp per row.  Lane l owns experts l, l + 32, ...; a bit per owned
 * expert marks it taken.  Each of the k rounds finds the largest untaken
 * logit, the lower expert among equals (as the CPU backend's strict >). */
__global__ void moe_route_kernel(int32_t *ids, float *weights, const float *logits, int n, int E,
                                 int k, int renorm) {
    cu_grid_trigger();
    cu_grid_wait();
    const int t = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31;
    if (t >= n) return;
    const float *l = logits + (size_t)t * E;
    const float2 st = cu_warp_softmax_stats(l, E, lane);
    const float mx = st.x, sum = st.y;
    uint32_t taken = 0;
    float kept = 0.f, w_mine = 0.f; /* lane s keeps slot s's weight (k <= 32) */
    int id_mine = -1;
    for (int s = 0; s < k; s++) {
        float bv = -INFINITY;
        int be = -1;
        for (int i = 0, e = lane; e < E; i++, e += 32)
            if (!(taken >> i & 1) && (be < 0 || l[e] > bv)) bv = l[e], be = e;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            int oe = __shfl_xor_sync(0xffffffffu, be, o);
            if (oe >= 0 && (be < 0 || ov > bv || (ov == bv && oe < be))) bv = ov, be = oe;
        }
        if (be >= 0 && (be & 31) == lane) taken |= 1u << (be >> 5);
        float w = be >= 0 ? expf(l[be] - mx) / sum : 0.f;
        kept += w;
        if (lane == s) w_mine = w, id_mine = be;
    }
    if (lane < k) {
        ids[(size_t)t * k + lane] = id_mine;
        weights[(size_t)t * k + lane] = renorm ? w_mine / kept : w_mine;
    }
}

extern "C" int cu_moe_route(const cu_ctx *c, int32_t *ids, float *weights, const float *logits,
                            int n, int n_experts, int k, int renorm) {
    if (n_experts < 1 || n_experts > CU_MOE_MAX_EXPERTS || k < 1 || k > 32 || k > n_experts)
        return -1;
    if (n > 0)
        CU_LAUNCH(moe_route_kernel, (unsigned)CU_DIV_UP(n, 4), 128, 0, c, ids, weights, logits, n,
                  n_experts, k, renorm);
    return 0;
}

/* ---- combine ---------------------------------------------------------------------- */

__global__ void moe_combine_kernel(float *y, const float *x, const float *w, int n, int k, int d) {
    cu_grid_trigger();
    cu_grid_wait();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)n * d) return;
    size_t t = i / d, c = i % d;
    float acc = 0.f;
    /* an explicit fused multiply-add, as moe.cu's fused down kernel sums */
    for (int s = 0; s < k; s++) acc = fmaf(w[t * k + s], x[(t * k + s) * d + c], acc);
    y[i] = acc;
}

extern "C" void cu_moe_combine(const cu_ctx *c, float *y, const float *x, const float *weights,
                               int n, int k, int d) {
    size_t count = (size_t)n * d;
    if (count)
        CU_LAUNCH(moe_combine_kernel, (unsigned)CU_DIV_UP(count, 256), 256, 0, c, y, x, weights, n,
                  k, d);
}
