/*
 * recurrent.cu - kernels of the hybrid recurrent layers (Gated DeltaNet:
 * Qwen3-Next, Qwen3.5): gather_cols and sigmoid_mul (splitting and gating
 * fused projections), the causal depthwise conv with its tail state, the
 * gated delta rule, and the gated output RMSNorm.  Declared in
 * cuda_family.h; the CPU versions (the reference) are in
 * cpu/cpu_recurrent.c, and each kernel here does the CPU's arithmetic in
 * the CPU's order where that order is sequential.
 *
 * State ops (conv1d_silu, gated_delta) walk a sequence's rows in row
 * order inside one launch: a block owns one batch sequence (and a slice
 * of channels or state columns), scans the batch for that sequence's
 * rows, and carries the state from row to row in registers.  Sequences,
 * channels and value heads run in parallel; rows of one sequence never
 * do.  A row at position 0 starts from a zero state, as on the CPU.
 *
 * The delta rule runs every row in the recurrent form, prefill included
 * (the CPU takes a prefill's rows in the chunkwise form, which is the
 * same function to f32 rounding): first, plain and right; a chunked
 * tensor-core prefill is the next step for speed.  Lanes own columns j of
 * a head's state S [dk][dv] (a column in registers, split over 1, 2 or 4
 * lanes by dk), because column j's update needs only k, q (shared by the
 * warp), v[j] and two scalars: lanes meet only to share the normalized q
 * and k and to add a split column's partial sums.
 *
 * Every kernel follows the PDL rule of cu_common.cuh.
 */
#include <math.h>

#include "backend/cuda/cu_common.cuh"
#include "backend/cuda/cuda_family.h"

__device__ __forceinline__ float sigmoid_f(float x) {
    return 1.0f / (1.0f + expf(-x)); /* as the CPU's sigmoidf */
}

/* torch's softplus (beta 1, threshold 20), as the CPU's. */
__device__ __forceinline__ float softplus_f(float x) {
    return x > 20.0f ? x : log1pf(expf(x));
}

/* ---- gather_cols, sigmoid_mul ------------------------------------------------- */

__global__ void gather_cols_kernel(float *dst, const float *src, const int32_t *idx, int n,
                                   int d_src, int d_dst) {
    cu_grid_trigger();
    cu_grid_wait();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)n * d_dst) return;
    size_t t = i / d_dst;
    int c = idx[i % d_dst];
    dst[i] = c >= 0 && c < d_src ? src[t * d_src + c] : 0.f;
}

extern "C" void cu_gather_cols(const cu_ctx *c, float *dst, const float *src, const int32_t *idx,
                               int n, int d_src, int d_dst) {
    size_t count = (size_t)n * d_dst;
    if (n > 0 && d_dst > 0)
        CU_LAUNCH(gather_cols_kernel, (unsigned)CU_DIV_UP(count, 256), 256, 0, c, dst, src, idx, n,
                  d_src, d_dst);
}

__global__ void sigmoid_mul_kernel(float *y, const float *x, const float *g, int n, int d,
                                   int g_d) {
    cu_grid_trigger();
    cu_grid_wait();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)n * d) return;
    size_t t = i / d, col = i % d;
    y[i] = x[i] * sigmoid_f(g[t * g_d + (g_d == 1 ? 0 : col)]);
}

extern "C" void cu_sigmoid_mul(const cu_ctx *c, float *y, const float *x, const float *g, int n,
                               int d, int g_d) {
    size_t count = (size_t)n * d;
    if (n > 0 && d > 0)
        CU_LAUNCH(sigmoid_mul_kernel, (unsigned)CU_DIV_UP(count, 256), 256, 0, c, y, x, g, n, d, g_d);
}

/* ---- rmsnorm_gated --------------------------------------------------------------- */

/* One warp per row (rows are a value head: 64-256 floats).  Each lane
 * rereads and writes only the elements it summed, so y may alias x. */
__global__ void rmsnorm_gated_kernel(float *y, const float *x, const float *z, const float *w,
                                     int n, int d, float eps) {
    cu_grid_trigger();
    cu_grid_wait();
    const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x & 31;
    if (row >= n) return;
    const float *xr = x + (size_t)row * d, *zr = z + (size_t)row * d;
    float *yr = y + (size_t)row * d;
    float ss = 0.f;
    for (int i = lane; i < d; i += 32) ss = fmaf(xr[i], xr[i], ss);
    ss = cu_warp_sum(ss);
    float inv = 1.0f / sqrtf(ss / (float)d + eps);
    for (int i = lane; i < d; i += 32) {
        float zi = zr[i];
        yr[i] = xr[i] * inv * w[i] * (zi * sigmoid_f(zi));
    }
}

extern "C" void cu_rmsnorm_gated(const cu_ctx *c, float *y, const float *x, const float *z,
                                 const float *w, int n, int d, float eps) {
    if (n > 0 && d > 0)
        CU_LAUNCH(rmsnorm_gated_kernel, (unsigned)CU_DIV_UP(n, 8), 256, 0, c, y, x, z, w, n, d, eps);
}

/* ---- conv1d_silu ------------------------------------------------------------------- */

/* Thread = channel c of batch sequence blockIdx.y.  The tail state stays
 * in global memory ([K-1][C] per slot, oldest first), read and shifted as
 * the CPU does; K is small (4). */
__global__ void conv1d_silu_kernel(float *y, const float *x, const float *w, float *state,
                                   cu_rows r, int C, int K) {
    cu_grid_trigger();
    cu_grid_wait();
    const int c = blockIdx.x * blockDim.x + threadIdx.x, s = blockIdx.y;
    if (c >= C) return;
    const float *wc = w + (size_t)c * K;
    float *st = NULL; /* this channel's tail, found at the sequence's first row */
    for (int t = 0; t < r.n; t++) {
        if (r.seq[t] != s) continue;
        if (!st) {
            int slot = r.state_slot[s];
            if (slot < 0) return; /* no state: a model bug (the CPU stops there) */
            st = state + (size_t)slot * (K - 1) * C + c;
        }
        const bool fresh = r.pos[t] == 0;
        const float xv = x[(size_t)t * C + c];
        float acc = wc[K - 1] * xv;
        for (int i = 0; i < K - 1; i++) acc += wc[i] * (fresh ? 0.0f : st[(size_t)i * C]);
        for (int i = 0; i + 1 < K - 1; i++) st[(size_t)i * C] = fresh ? 0.0f : st[(size_t)(i + 1) * C];
        if (K > 1) st[(size_t)(K - 2) * C] = xv;
        y[(size_t)t * C + c] = acc * sigmoid_f(acc);
    }
}

extern "C" void cu_conv1d_silu(const cu_ctx *c, float *y, const float *x, const float *w,
                               float *state, cu_rows r, int C, int K) {
    if (r.n <= 0 || r.n_seqs <= 0 || C <= 0) return;
    dim3 grid(CU_DIV_UP(C, 128), r.n_seqs);
    CU_LAUNCH(conv1d_silu_kernel, grid, 128, 0, c, y, x, w, state, r, C, K);
}

/* ---- gated_delta ------------------------------------------------------------------- */

/* dst[0..dk) = x * scale / norm(x), by one warp: the CPU's l2norm_scaled
 * (eps 0: the root of |x|² + 1e-6; else max(|x|, eps), the sum in double). */
__device__ void l2norm_warp(float *dst, const float *x, int dk, float scale, float eps, int lane) {
    float r;
    if (eps > 0.f) {
        double ss = 0;
        for (int i = lane; i < dk; i += 32) ss += (double)(x[i] * x[i]);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
        r = scale / fmaxf(sqrtf((float)ss), eps);
    } else {
        float ss = 0.f;
        for (int i = lane; i < dk; i += 32) ss += x[i] * x[i];
        ss = cu_warp_sum(ss);
        r = scale / sqrtf(ss + 1e-6f);
    }
    for (int i = lane; i < dk; i += 32) dst[i] = x[i] * r;
}

/* Block = one warp = CPW = 32 / SPLIT state columns of value head
 * blockIdx.y of batch sequence blockIdx.z.  SPLIT lanes share a column:
 * lane l takes column l % CPW, rows part * RPL .. part * RPL + RPL - 1 of
 * it (part = l / CPW), in registers (the loops over RPL are unrolled so
 * they never leave them: 64 rows a lane fit without spilling, 128 do not),
 * and the parts' sums meet by shuffles.  Per row, as the CPU's delta_step:
 *     S = exp(g) S;  delta = beta (v - Sᵀk);  S += k deltaᵀ;  out = Sᵀq. */
template <int RPL, int SPLIT>
__global__ void __launch_bounds__(32) gated_delta_kernel(cu_delta_args a) {
    constexpr int CPW = 32 / SPLIT;
    cu_grid_trigger();
    cu_grid_wait();
    __shared__ float sq[RPL * SPLIT], sk[RPL * SPLIT];
    const int lane = threadIdx.x, h = blockIdx.y, s = blockIdx.z;
    const int dk = a.dk, dv = a.dv, nk = a.n_k_heads, nv = a.n_v_heads;
    const int j = blockIdx.x * CPW + lane % CPW, i0 = lane / CPW * RPL;
    const bool mine = j < dv; /* lanes past dv still take part in the shuffles */
    const int kh = a.tiled ? h % nk : h / (nv / nk);
    const float qscale = 1.0f / sqrtf((float)dk);
    float S[RPL];
    float *st = NULL; /* the head's state, found at the sequence's first row */
    for (int t = 0; t < a.r.n; t++) {
        if (a.r.seq[t] != s) continue;
        if (!st) {
            int slot = a.r.state_slot[s];
            if (slot < 0) return; /* the whole warp: slot is uniform */
            st = a.state + ((size_t)slot * nv + h) * dk * dv;
#pragma unroll
            for (int i = 0; i < RPL; i++)
                S[i] = mine && i0 + i < dk ? st[(size_t)(i0 + i) * dv + j] : 0.f;
        }
        if (a.r.pos[t] == 0) {
#pragma unroll
            for (int i = 0; i < RPL; i++) S[i] = 0.f;
        }
        const float *row = a.qkv + (size_t)t * a.stride;
        l2norm_warp(sq, row + (size_t)kh * dk, dk, qscale, a.l2_eps, lane);
        l2norm_warp(sk, row + (size_t)(nk + kh) * dk, dk, 1.0f, a.l2_eps, lane);
        __syncwarp();
        const float *ba = a.ba + (size_t)t * 2 * nv;
        const float decay = expf(a.A[h] * softplus_f(ba[nv + h] + a.dt_bias[h]));
        const float beta = sigmoid_f(ba[h]);
        const float v = mine ? row[(size_t)2 * nk * dk + (size_t)h * dv + j] : 0.f;
        float mem = 0.f;
#pragma unroll
        for (int i = 0; i < RPL; i++)
            if (i0 + i < dk) {
                S[i] *= decay;
                mem += S[i] * sk[i0 + i];
            }
#pragma unroll
        for (int o = CPW; o < 32; o <<= 1) mem += __shfl_xor_sync(0xffffffffu, mem, o);
        const float delta = (v - mem) * beta;
        float out = 0.f;
#pragma unroll
        for (int i = 0; i < RPL; i++)
            if (i0 + i < dk) {
                S[i] += sk[i0 + i] * delta;
                out += S[i] * sq[i0 + i];
            }
#pragma unroll
        for (int o = CPW; o < 32; o <<= 1) out += __shfl_xor_sync(0xffffffffu, out, o);
        if (mine && i0 == 0) a.out[((size_t)t * nv + h) * dv + j] = out;
        __syncwarp(); /* every lane is done with sq, sk before the next row */
    }
    if (st && mine) {
#pragma unroll
        for (int i = 0; i < RPL; i++)
            if (i0 + i < dk) st[(size_t)(i0 + i) * dv + j] = S[i];
    }
}

/* The smallest instance whose RPL * SPLIT holds dk. */
template <int RPL, int SPLIT> static void launch_delta(const cu_ctx *c, const cu_delta_args *a) {
    dim3 grid(CU_DIV_UP(a->dv, 32 / SPLIT), a->n_v_heads, a->r.n_seqs);
    CU_LAUNCH((gated_delta_kernel<RPL, SPLIT>), grid, 32, 0, c, *a);
}

extern "C" int cu_gated_delta(const cu_ctx *c, const cu_delta_args *a) {
    if (a->dk < 1 || a->dk > CU_DELTA_MAX_DK || a->dv < 1 || a->n_k_heads < 1 ||
        a->n_v_heads % a->n_k_heads)
        return -1;
    if (a->r.n <= 0 || a->r.n_seqs <= 0) return 0;
    if (a->dk <= 64) launch_delta<64, 1>(c, a); /* <32, 1> spills (ptxas 13.0), this does not */
    else if (a->dk <= 128) launch_delta<64, 2>(c, a);
    else launch_delta<64, 4>(c, a);
    return 0;
}
