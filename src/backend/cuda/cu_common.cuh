/*
 * cu_common.cuh - device helpers the kernels share: element conversion,
 * 16-byte chunk unpacking, warp reductions, streaming loads.
 */
#ifndef PETREL_CU_COMMON_CUH
#define PETREL_CU_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "backend/cuda/cuda_internal.h"

#define CU_DIV_UP(a, b) (((a) + (b) - 1) / (b))

/* One element of a cache or table of type T (CU_F32/F16/BF16) as f32. */
template <int T> __device__ __forceinline__ float cu_load_elem(const void *p, size_t i) {
    if (T == CU_F32) return ((const float *)p)[i];
    uint16_t h = ((const uint16_t *)p)[i];
    if (T == CU_BF16) return __uint_as_float((uint32_t)h << 16);
    return __half2float(__ushort_as_half(h));
}

template <int T> __device__ __forceinline__ void cu_store_elem(void *p, size_t i, float x) {
    if (T == CU_F32) ((float *)p)[i] = x;
    else if (T == CU_BF16) ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(x);
    else ((__half *)p)[i] = __float2half_rn(x);
}

/* Elements of type T in a 16-byte chunk. */
template <int T> struct cu_chunk { static const int n = T == CU_F32 ? 4 : 8; };

/* Unpacks a 16-byte chunk of type T into floats. */
template <int T> __device__ __forceinline__ void cu_unpack(const uint4 &u, float *f) {
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
    if (T == CU_F32) {
#pragma unroll
        for (int i = 0; i < 4; i++) f[i] = __uint_as_float(w[i]);
    } else if (T == CU_BF16) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            f[2 * i] = __uint_as_float(w[i] << 16);
            f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
        }
    } else {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            __half2 h = *(const __half2 *)&w[i];
            float2 v = __half22float2(h);
            f[2 * i] = v.x;
            f[2 * i + 1] = v.y;
        }
    }
}

/* A 16-byte load that skips L1: weights are read once per step. */
__device__ __forceinline__ uint4 cu_ld_stream(const uint4 *p) {
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
}

__device__ __forceinline__ float cu_warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* The threads cu_rmsnorm (ops.cu) gives a row of d: a warp for short rows
 * (per-head norms), 1024 from 2048 (one block a row at decode: the more
 * loads in flight, the sooner it is done; Gemma-3-12B's 3840 took 13.4 us
 * with 256, session 11), else 256. */
__host__ __device__ __forceinline__ int cu_rms_threads(int d) {
    return d <= 512 ? 32 : d >= 2048 ? 1024 : 256;
}

/* 1 / sqrt(mean(x^2) + eps) of the row xr of d floats exactly as
 * cu_rmsnorm (ops.cu) computes it, bit for bit, by a whole block of 128 to
 * 1024 threads, a multiple of 32 (the fused GEMVs fold the norm into their
 * input).  cu_rmsnorm's threads (cu_rms_threads) each sum x^2 over the
 * elements i = t (mod threads) in order with
 * fmaf; a butterfly sums each warp, a second one the warps.  Here thread t
 * plays threads t, t + blockDim.x, ... (at most 8), all their loads in
 * flight at once, and each warp sums its virtual warps side by side.  red:
 * 33 floats of shared memory; every thread calls it and gets the scale. */
__device__ __forceinline__ float cu_rms_scale(const float *xr, int d, float eps, float *red) {
    const int vt = cu_rms_threads(d);
    const int lane = threadIdx.x & 31, nb = blockDim.x;
    if (vt == 32) {
        if (threadIdx.x < 32) {
            float ss = 0.f;
#pragma unroll 4
            for (int i = lane; i < d; i += 32) ss = fmaf(xr[i], xr[i], ss);
            ss = cu_warp_sum(ss);
            if (lane == 0) red[32] = ss;
        }
    } else {
        float ss[8];
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const int v = j * nb + (int)threadIdx.x;
            ss[j] = 0.f;
            if (j * nb < vt)
#pragma unroll 4
                for (int i = v; i < d; i += vt) ss[j] = fmaf(xr[i], xr[i], ss[j]);
        }
#pragma unroll
        for (int j = 0; j < 8; j++)
            if (j * nb < vt) { /* the same for the whole block */
                const float s = cu_warp_sum(ss[j]);
                if (lane == 0) red[(j * nb + (int)threadIdx.x) >> 5] = s;
            }
        __syncthreads();
        if (threadIdx.x < 32) {
            const float v = cu_warp_sum(lane < vt / 32 ? red[lane] : 0.f);
            if (lane == 0) red[32] = v;
        }
    }
    __syncthreads();
    const float r = 1.0f / sqrtf(red[32] / (float)d + eps);
    __syncthreads(); /* red is free again for the next row */
    return r;
}

__device__ __forceinline__ float cu_warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* A router's softmax over a row of n logits by one warp: (max, sum of
 * exp(x - max)), lane-strided then butterflies.  moe_route_kernel and
 * moe_ffn's kernels all take it from here, so the routing weights they
 * make agree bit for bit. */
__device__ __forceinline__ float2 cu_warp_softmax_stats(const float *x, int n, int lane) {
    float mx = -INFINITY;
    for (int e = lane; e < n; e += 32) mx = fmaxf(mx, x[e]);
    mx = cu_warp_max(mx);
    float sum = 0.f;
    for (int e = lane; e < n; e += 32) sum += expf(x[e] - mx);
    return make_float2(mx, cu_warp_sum(sum));
}

/* The gated activations, one definition for the elementwise kernels (ops.cu,
 * family_ops.cu) and the fused expert kernels (moe.cu), so both give the
 * same bits.  SwiGLU: silu(g) * u. */
__device__ __forceinline__ float cu_silu_mul(float g, float u) {
    return g / (1.0f + expf(-g)) * u;
}

/* transformers' gelu_pytorch_tanh, written as the CPU backend writes it
 * (x / (1 + e^-2z) = 0.5 x (1 + tanh z) without the cancellation). */
__device__ __forceinline__ float cu_gelu_tanh(float x) {
    const float c = 0.7978845608028654f; /* sqrt(2 / pi) */
    float z = c * (x + 0.044715f * x * x * x);
    return x / (1.0f + expf(-2.0f * z));
}

/* gpt-oss's clamped SwiGLU: g = min(gate, limit), u = clamp(up, ±limit),
 * (u + 1) * g * sigmoid(alpha * g). */
__device__ __forceinline__ float cu_swiglu_oai(float gate, float up, float alpha, float limit) {
    float g = fminf(gate, limit), u = fmaxf(-limit, fminf(up, limit));
    return (u + 1.0f) * (g / (1.0f + expf(-alpha * g)));
}

/* Programmatic dependent launch (sm_90): every kernel is launched allowed
 * to start while the kernel before it in the stream finishes.  Each kernel
 * lets its successor launch at once (trigger), and waits for its
 * predecessor's memory (wait) before it reads or writes anything another
 * kernel touches; only reads of data no kernel writes (weights) may come
 * before the wait.  One exception, argued where it is: moe.cu's
 * moe_ffn_down2_kernel reads the router's logits before its wait, its
 * predecessor (moe_ffn_up2_kernel) triggering only after its own wait.
 * Elsewhere both are no-ops. */
__device__ __forceinline__ void cu_grid_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ void cu_grid_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

static inline cudaLaunchConfig_t cu_config_pdl(dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                                               bool pdl) {
    static cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t c = {};
    c.gridDim = grid;
    c.blockDim = block;
    c.dynamicSmemBytes = smem;
    c.stream = s;
    c.attrs = attr;
    c.numAttrs = pdl ? 1 : 0;
    return c;
}

static inline cudaLaunchConfig_t cu_config(dim3 grid, dim3 block, size_t smem, const cu_ctx *c) {
    return cu_config_pdl(grid, block, smem, c->s, c->pdl != 0);
}

/* kernel<<<grid, block, smem, ctx->s>>>(args...) with the PDL attribute
 * when the context asks for it;
 * parenthesize a template kernel: CU_LAUNCH((k<A, B>), ...). */
#define CU_LAUNCH(kern, grid, block, smem, ctx, ...)                                               \
    do {                                                                                           \
        cudaLaunchConfig_t cfg_ = cu_config((grid), (block), (smem), (ctx));                        \
        cudaLaunchKernelEx(&cfg_, kern, __VA_ARGS__);                                              \
    } while (0)

static inline bool cu_aligned16(const void *p) {
    return ((uintptr_t)p & 15) == 0;
}

#endif
