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
 * The delta rule has two kernels, the same function to f32 rounding.
 * Decode steps run the recurrent form: lanes own columns j of a head's
 * state S [dk][dv] (a column in registers, split over 1, 2 or 4 lanes by
 * dk), because column j's update needs only k, q (shared by the warp),
 * v[j] and two scalars: lanes meet only to share the normalized q and k
 * and to add a split column's partial sums.  Prefill steps (the caller
 * picks by rows per sequence) run the chunkwise form, 64 rows at a time,
 * as the CPU does: see gated_delta_chunk_kernel.
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
        CU_LAUNCH(sigmoid_mul_kernel, (unsigned)CU_DIV_UP(count, 256), 256, 0, c, y, x, g, n, d,
                  g_d);
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
        CU_LAUNCH(rmsnorm_gated_kernel, (unsigned)CU_DIV_UP(n, 8), 256, 0, c, y, x, z, w, n, d,
                  eps);
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
        for (int i = 0; i + 1 < K - 1; i++) /* shift the tail: drop the oldest, append x */
            st[(size_t)i * C] = fresh ? 0.0f : st[(size_t)(i + 1) * C];
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

/* ---- gated_delta, chunkwise (prefill) ------------------------------------------- */

/* The chunkwise form of the same rule, for steps whose sequences bring many
 * rows (a prefill): the CPU's delta_chunk (cpu_recurrent.c has the
 * derivation), with the work of a chunk spread over a block instead of a
 * walk of the rows.  For a chunk of c <= DELTA_C consecutive rows of one
 * sequence, with G_i the running sum of the log-decays and S0 the state
 * at the chunk's start:
 *     A[i][j] = beta_i e^{G_i - G_j} k_i·k_j   (j < i)
 *     P[i][j] =        e^{G_i - G_j} q_i·k_j   (j <= i)
 *     U0[i]   = beta_i (v_i - e^{G_i} S0ᵀk_i);   (I + A) U = U0
 *     out_i   = e^{G_i} S0ᵀq_i + sum_j P[i][j] U_j
 *     S       = e^{G_last} S0 + sum_j e^{G_last - G_j} k_j U_jᵀ.
 * Every exponent is <= 0: nothing overflows.
 *
 * A state column's update needs only that column (of U, of S), so a block
 * owns DELTA_VB = 32 columns of one value head of one sequence: the f32
 * state slice S0 [dk][32] stays in shared memory across the chunks, and
 * only the chunk's matrices A and P (64 x 64, recomputed by each of a
 * head's dv / 32 blocks) are shared work.  The block finds its sequence's
 * rows itself (warp 0 scans seq[] with ballots), so positions stay on the
 * device and a chunk is any DELTA_C rows of the sequence in batch order:
 * a row at position 0 ends the chunk before it and starts the next one
 * from a zero state.  All arithmetic is f32 on the CUDA cores (the
 * matrices are small: 64 x 64 x dk per chunk); the triangular solve is
 * forward substitution, a warp per 4 columns, so it needs no block
 * barrier per row. */
#define DELTA_C 64
#define DELTA_VB 32
#define DELTA_THREADS 256

/* Shared memory of the instance for key dims up to DK, in floats:
 * Q, K [C][DK + 4] (rows padded so float4 reads of 8 rows hit 8 bank
 * groups), A, P [C][C + 4], U [C][VB + 4] (the solve's 8 row-parts of a
 * column land in distinct banks), S [DK][VB], and per row G, beta, e^{G},
 * e^{G_last - G} and the row's batch index. */
template <int DK> struct delta_layout {
    static constexpr int KS = DK + 4, PS = DELTA_C + 4, US = DELTA_VB + 4;
    static constexpr int q = 0, k = q + DELTA_C * KS, a = k + DELTA_C * KS, p = a + DELTA_C * PS;
    static constexpr int u = p + DELTA_C * PS, s = u + DELTA_C * US, g = s + DK * DELTA_VB;
    static constexpr int beta = g + DELTA_C, eg = beta + DELTA_C, w = eg + DELTA_C;
    static constexpr int rows = w + DELTA_C, floats = rows + DELTA_C;
    static constexpr size_t bytes = sizeof(float) * floats;
};

/* Warp 0 gathers the next chunk of sequence s: rows from *next on, in
 * batch order, at most DELTA_C of them, ending before a row at position 0
 * unless it is the chunk's first (then *fresh: start from zero).  Returns
 * the chunk's row count (0: the sequence has no rows left) in lane 0's
 * view; all lanes agree. */
__device__ int delta_gather(const cu_rows &r, int s, int *next, int *rows, bool *fresh, int lane) {
    int cn = 0, t0 = *next;
    bool zero = false, stop = false;
    const unsigned lt = (1u << lane) - 1;
    while (!stop && t0 < r.n) {
        const int t = t0 + lane;
        const bool match = t < r.n && r.seq[t] == s;
        const unsigned m = __ballot_sync(0xffffffffu, match);
        unsigned z = __ballot_sync(0xffffffffu, match && r.pos[t] == 0);
        unsigned take = m;
        int end = t0 + 32; /* where the scan resumes */
        if (m && cn == 0 && (z & m & -m)) { /* the chunk's first row restarts */
            zero = true;
            z &= ~(m & -m);
        }
        if (z) { /* a restart later: the chunk ends before it */
            const int b = __ffs(z) - 1;
            take &= (1u << b) - 1;
            end = t0 + b;
            stop = true;
        }
        while (__popc(take) > DELTA_C - cn) take &= ~(1u << (31 - __clz(take)));
        if (__popc(take) == DELTA_C - cn && take) { /* full: resume after its last row */
            end = t0 + 32 - __clz(take);
            stop = true;
        }
        if (take >> lane & 1) rows[cn + __popc(take & lt)] = t;
        cn += __popc(take);
        t0 = end;
    }
    *next = t0, *fresh = zero;
    __syncwarp();
    return cn;
}

template <int DK>
__global__ void __launch_bounds__(DELTA_THREADS, 1) gated_delta_chunk_kernel(cu_delta_args a) {
    using L = delta_layout<DK>;
    constexpr int C = DELTA_C, VB = DELTA_VB, KS = L::KS, PS = L::PS, US = L::US;
    cu_grid_trigger();
    cu_grid_wait();
    extern __shared__ float4 smem4[];
    float *sm = (float *)smem4;
    float *sQ = sm + L::q, *sK = sm + L::k, *sA = sm + L::a, *sP = sm + L::p, *sU = sm + L::u;
    float *sS = sm + L::s, *sG = sm + L::g, *sB = sm + L::beta, *sEG = sm + L::eg, *sW = sm + L::w;
    int *sRows = (int *)(sm + L::rows);
    __shared__ int s_cn, s_next;
    __shared__ bool s_fresh;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int j0 = blockIdx.x * VB, h = blockIdx.y, s = blockIdx.z;
    const int dk = a.dk, dv = a.dv, nk = a.n_k_heads, nv = a.n_v_heads;
    const int dk4 = (dk + 3) & ~3;
    const int kh = a.tiled ? h % nk : h / (nv / nk);
    const float qscale = 1.0f / sqrtf((float)dk);
    const int slot = a.r.state_slot[s];
    if (slot < 0) return; /* the whole block: slot is uniform */
    float *st = a.state + ((size_t)slot * nv + h) * dk * dv;

    for (int i = tid; i < DK * VB; i += DELTA_THREADS) {
        const int m = i / VB, c = i % VB;
        sS[i] = m < dk && j0 + c < dv ? st[(size_t)m * dv + j0 + c] : 0.f;
    }
    if (tid == 0) s_next = 0;
    bool any = false;
    __syncthreads();
    for (;;) {
        if (warp == 0) {
            int next = s_next;
            bool fresh;
            int cn = delta_gather(a.r, s, &next, sRows, &fresh, lane);
            if (lane == 0) s_cn = cn, s_next = next, s_fresh = fresh;
        }
        __syncthreads();
        const int cn = s_cn;
        if (cn == 0) break;
        any = true;
        if (s_fresh)
            for (int i = tid; i < DK * VB; i += DELTA_THREADS) sS[i] = 0.f;

        /* Rows' inputs: normalized q and k (zero past dk4 and past cn),
         * log-decay and beta; a warp per row. */
        for (int i = warp; i < C; i += DELTA_THREADS / 32) {
            float *q = sQ + i * KS, *k = sK + i * KS;
            if (i < cn) {
                const int t = sRows[i];
                const float *row = a.qkv + (size_t)t * a.stride;
                l2norm_warp(q, row + (size_t)kh * dk, dk, qscale, a.l2_eps, lane);
                l2norm_warp(k, row + (size_t)(nk + kh) * dk, dk, 1.0f, a.l2_eps, lane);
                for (int m = dk + lane; m < dk4; m += 32) q[m] = k[m] = 0.f;
                if (lane == 0) {
                    const float *ba = a.ba + (size_t)t * 2 * nv;
                    sG[i] = a.A[h] * softplus_f(ba[nv + h] + a.dt_bias[h]);
                    sB[i] = sigmoid_f(ba[h]);
                }
            } else {
                for (int m = lane; m < dk4; m += 32) q[m] = k[m] = 0.f;
                if (lane == 0) sG[i] = 0.f, sB[i] = 0.f;
            }
        }
        __syncthreads();
        if (tid == 0) { /* the running sum in row order, as the CPU's */
            float acc = 0.f;
            for (int i = 0; i < cn; i++) sG[i] = acc += sG[i];
            for (int i = cn; i < C; i++) sG[i] = acc;
        }
        __syncthreads();
        if (tid < C) {
            sEG[tid] = tid < cn ? expf(sG[tid]) : 0.f;
            sW[tid] = tid < cn ? expf(sG[C - 1] - sG[tid]) : 0.f;
        }

        /* A and P: thread (ti, tj) takes rows ti + 16x, columns tj + 16y,
         * y <= x (the blocks on or under the diagonal). */
        {
            const int ti = tid >> 4, tj = tid & 15;
            float kk[4][4] = {}, qk[4][4] = {};
            for (int m = 0; m < dk4; m += 4) {
                float4 kj[4], ki[4], qi[4];
#pragma unroll
                for (int x = 0; x < 4; x++) {
                    kj[x] = *(const float4 *)(sK + (tj + 16 * x) * KS + m);
                    ki[x] = *(const float4 *)(sK + (ti + 16 * x) * KS + m);
                    qi[x] = *(const float4 *)(sQ + (ti + 16 * x) * KS + m);
                }
#pragma unroll
                for (int x = 0; x < 4; x++)
#pragma unroll
                    for (int y = 0; y <= x; y++) {
                        kk[x][y] += ki[x].x * kj[y].x + ki[x].y * kj[y].y + ki[x].z * kj[y].z +
                                    ki[x].w * kj[y].w;
                        qk[x][y] += qi[x].x * kj[y].x + qi[x].y * kj[y].y + qi[x].z * kj[y].z +
                                    qi[x].w * kj[y].w;
                    }
            }
#pragma unroll
            for (int x = 0; x < 4; x++)
#pragma unroll
                for (int y = 0; y < 4; y++) {
                    const int i = ti + 16 * x, j = tj + 16 * y;
                    float av = 0.f, pv = 0.f;
                    if (y <= x && j <= i && i < cn) {
                        const float e = expf(sG[i] - sG[j]);
                        if (j < i) av = sB[i] * e * kk[x][y];
                        pv = e * qk[x][y];
                    }
                    sA[i * PS + j] = av;
                    sP[i * PS + j] = pv;
                }
        }

        /* U0 and the state's part of the output: lane = column, the warp's
         * rows warp + 8x. */
        float o[C / 8];
        {
            float uk[C / 8] = {}, uq[C / 8] = {};
            for (int m = 0; m < dk4; m += 4) {
                const float s0 = sS[(m + 0) * VB + lane], s1 = sS[(m + 1) * VB + lane];
                const float s2 = sS[(m + 2) * VB + lane], s3 = sS[(m + 3) * VB + lane];
#pragma unroll
                for (int x = 0; x < C / 8; x++) {
                    const float4 k4 = *(const float4 *)(sK + (warp + 8 * x) * KS + m);
                    const float4 q4 = *(const float4 *)(sQ + (warp + 8 * x) * KS + m);
                    uk[x] += k4.x * s0 + k4.y * s1 + k4.z * s2 + k4.w * s3;
                    uq[x] += q4.x * s0 + q4.y * s1 + q4.z * s2 + q4.w * s3;
                }
            }
            __syncthreads(); /* sEG, sW written */
            const bool col = j0 + lane < dv;
#pragma unroll
            for (int x = 0; x < C / 8; x++) {
                const int i = warp + 8 * x;
                float u = 0.f;
                if (i < cn && col) {
                    const float v = a.qkv[(size_t)sRows[i] * a.stride + (size_t)2 * nk * dk +
                                          (size_t)h * dv + j0 + lane];
                    u = sB[i] * (v - sEG[i] * uk[x]);
                }
                sU[i * US + lane] = u;
                o[x] = sEG[i] * uq[x];
            }
        }
        __syncthreads();

        /* (I + A) U = U0 by forward substitution: warp w solves columns
         * 4w .. 4w+3, lane l column 4w + l % 4 over the rows j = l / 4
         * (mod 8) of each sum; the parts meet by shuffles. */
        {
            const int c = 4 * warp + (lane & 3), part = lane >> 2;
            for (int i = 1; i < cn; i++) {
                float sum = 0.f;
                for (int j = part; j < i; j += 8) sum += sA[i * PS + j] * sU[j * US + c];
                sum += __shfl_xor_sync(0xffffffffu, sum, 4);
                sum += __shfl_xor_sync(0xffffffffu, sum, 8);
                sum += __shfl_xor_sync(0xffffffffu, sum, 16);
                if (part == 0) sU[i * US + c] -= sum;
                __syncwarp();
            }
        }
        __syncthreads();

        /* out = e^G S0ᵀq + P U (lane = column, rows warp + 8x), and the
         * state: rows warp * DK/8 .. +DK/8 of it, lane = column. */
        {
            const int cn4 = (cn + 3) & ~3;
            for (int j = 0; j < cn4; j += 4) {
                const float u0 = sU[(j + 0) * US + lane], u1 = sU[(j + 1) * US + lane];
                const float u2 = sU[(j + 2) * US + lane], u3 = sU[(j + 3) * US + lane];
#pragma unroll
                for (int x = 0; x < C / 8; x++) {
                    const float4 p = *(const float4 *)(sP + (warp + 8 * x) * PS + j);
                    o[x] += p.x * u0 + p.y * u1 + p.z * u2 + p.w * u3;
                }
            }
            if (j0 + lane < dv)
#pragma unroll
                for (int x = 0; x < C / 8; x++) {
                    const int i = warp + 8 * x;
                    if (i < cn) a.out[((size_t)sRows[i] * nv + h) * dv + j0 + lane] = o[x];
                }

            constexpr int R = DK / 8;
            const int m0 = warp * R;
            const float keep = expf(sG[C - 1]);
            float acc[R];
#pragma unroll
            for (int x = 0; x < R; x++) acc[x] = sS[(m0 + x) * VB + lane] * keep;
            for (int i = 0; i < cn; i++) {
                const float u = sU[i * US + lane], w = sW[i];
#pragma unroll
                for (int x = 0; x < R; x += 4)
                    if (m0 + x < dk4) { /* rows past dk: no key there (sK is not set) */
                        const float4 k4 = *(const float4 *)(sK + i * KS + m0 + x);
                        acc[x + 0] += w * k4.x * u;
                        acc[x + 1] += w * k4.y * u;
                        acc[x + 2] += w * k4.z * u;
                        acc[x + 3] += w * k4.w * u;
                    }
            }
#pragma unroll
            for (int x = 0; x < R; x++) sS[(m0 + x) * VB + lane] = acc[x];
        }
        __syncthreads();
    }
    if (!any) return;
    for (int i = tid; i < dk * VB; i += DELTA_THREADS) {
        const int m = i / VB, c = i % VB;
        if (j0 + c < dv) st[(size_t)m * dv + j0 + c] = sS[i];
    }
}

/* The smallest instance whose RPL * SPLIT holds dk. */
template <int RPL, int SPLIT> static void launch_delta(const cu_ctx *c, const cu_delta_args *a) {
    dim3 grid(CU_DIV_UP(a->dv, 32 / SPLIT), a->n_v_heads, a->r.n_seqs);
    CU_LAUNCH((gated_delta_kernel<RPL, SPLIT>), grid, 32, 0, c, *a);
}

template <int DK> static int launch_delta_chunk(const cu_ctx *c, const cu_delta_args *a) {
    if (delta_layout<DK>::bytes > (size_t)c->smem_optin) return -1;
    dim3 grid(CU_DIV_UP(a->dv, DELTA_VB), a->n_v_heads, a->r.n_seqs);
    CU_LAUNCH(gated_delta_chunk_kernel<DK>, grid, DELTA_THREADS, delta_layout<DK>::bytes, c, *a);
    return 0;
}

/* Shared memory over 48 KiB must be allowed per kernel, and not while a
 * graph is being captured: once, up front (a device with less than an
 * instance needs runs the recurrent kernel instead). */
extern "C" void cu_recurrent_init(void) {
    cudaFuncSetAttribute(gated_delta_chunk_kernel<64>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         (int)delta_layout<64>::bytes);
    cudaFuncSetAttribute(gated_delta_chunk_kernel<128>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         (int)delta_layout<128>::bytes);
    cudaFuncSetAttribute(gated_delta_chunk_kernel<256>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         (int)delta_layout<256>::bytes);
    cudaGetLastError(); /* a device that refuses a size: that instance is not launched */
}

extern "C" int cu_gated_delta(const cu_ctx *c, const cu_delta_args *a) {
    if (a->dk < 1 || a->dk > CU_DELTA_MAX_DK || a->dv < 1 || a->n_k_heads < 1 ||
        a->n_v_heads % a->n_k_heads)
        return -1;
    if (a->r.n <= 0 || a->r.n_seqs <= 0) return 0;
    if (a->chunked) {
        int rc = a->dk <= 64 ? launch_delta_chunk<64>(c, a)
                 : a->dk <= 128 ? launch_delta_chunk<128>(c, a)
                                : launch_delta_chunk<256>(c, a);
        if (rc == 0) return 0;
    }
    if (a->dk <= 64) launch_delta<64, 1>(c, a); /* <32, 1> spills (ptxas 13.0), this does not */
    else if (a->dk <= 128) launch_delta<64, 2>(c, a);
    else launch_delta<64, 4>(c, a);
    return 0;
}
