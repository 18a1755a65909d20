/*
 * attention.cu - causal attention of query rows over the paged KV cache.
 *
 * The tiled kernel (head_dim 64 or 128, f16/bf16 cache) is flash-decoding
 * style.  A block of 4 warps owns one KV head, NQ query vectors (qr rows x
 * gq query heads of that KV head: decode rows have qr = 1, prefill rows of
 * one sequence share each K/V tile across qr rows) and one slice ("split")
 * of the context.  Each warp walks its own tiles of 32 keys: it copies the
 * keys' K and V rows from their pages into its shared memory (cp.async, 16
 * bytes a lane), scores its 32 keys against all NQ queries (lane = key),
 * updates a running max and sum per query (online softmax, base 2) and
 * accumulates P·V (lane = 1/32 of head_dim).  The 4 warps' states are merged
 * at the end; with several splits each split writes its unnormalized sum and
 * (max, sum) and a second kernel merges the splits.  A split is a fixed
 * ATT_SPLIT_KEYS keys (doubled per power of two of the context past
 * ATT_SPLIT_MAX splits), so a long sequence fills the GPU.
 *
 * Batch invariance (decode vs speculative verification, up to 16 rows and
 * contexts of ATT_SPLIT_KEYS * ATT_SPLIT_MAX keys): a row's result is the
 * same bits whether it comes alone or with other rows.  Its splits do not
 * depend on the batch, each query vector's arithmetic is the same in every
 * NQ instance (explicit fmaf throughout), and keys past a row's position
 * that another row of the pass needs are masked to exact no-ops (p = 0,
 * alpha = 1).
 *
 * Rows of one block that belong to different sequences are handled in
 * passes, one per sequence, so any batch is correct; the scheduler's common
 * batches (one prefill sequence, or one decode row per sequence) take one.
 *
 * The tensor-core kernel takes prefill chunks of head_dim 64 and 128; the
 * wide kernel head_dim 256 and MLA's 576-wide latent rows (V a view of K),
 * decode and prefill (its own comment below).
 *
 * The simple kernel (one warp per row and query head, lanes over head_dim)
 * serves every other shape and is the cross-check in the tests.
 */
#include <float.h>
#include <limits.h>
#include <math.h>

#include "backend/cuda/cu_common.cuh"
#include "backend/cuda/cu_mma.cuh"
#include "backend/cuda/cuda_family.h"

#define ATT_WARPS 4
#define ATT_KT 32 /* keys per warp per tile */
#define ATT_BLOCK_KEYS (ATT_WARPS * ATT_KT)
#define ATT_LOG2E 1.4426950408889634f
#define ATT_SPLIT_KEYS 256 /* keys per split of the tiled kernel */
#define ATT_SPLIT_MAX 128  /* splits before the split size grows */
#define WIDE_SPLIT_MAX 256 /* the same for the wide kernel: one latent KV head fills few blocks */

typedef struct att_plan {
    int mma;  /* 1: prefill-sized batches (the tensor-core kernel, or the wide one's MT 4) */
    int wide; /* 0, or the wide kernel's MT (query vectors / 16): head_dim 256 and 576 */
    int gq, qr, chunk, n_splits;
    float *part_acc; /* [n_splits][n][n_heads][head_dim] */
    float *part_ml;  /* [n_splits][n][n_heads][2]: running max, sum */
} att_plan;

__device__ __forceinline__ void cp_async16(void *smem, const void *gmem) {
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem));
}

__device__ __forceinline__ void cp_async_wait_all() {
    asm volatile("cp.async.wait_all;" ::: "memory");
}

/* The next pass of a block over its query rows t0 .. t0 + nrows - 1: the
 * first sequence sq not yet done, its rows (active, a bit per row; at most
 * 64 rows) and their largest and smallest positions; false when every row
 * is done.  Rows of one sequence share the keys a pass reads. */
__device__ __forceinline__ bool att_next_pass(const cu_attn_args &a, int t0, int nrows,
                                              uint64_t &done, int &sq, uint64_t &active,
                                              int &pmax, int &pmin) {
    int first = -1;
    for (int r = 0; r < nrows; r++)
        if (!((done >> r) & 1)) {
            first = r;
            break;
        }
    if (first < 0) return false;
    sq = a.seq[t0 + first];
    active = 0, pmax = -1, pmin = INT_MAX;
    for (int r = 0; r < nrows; r++)
        if (!((done >> r) & 1) && a.seq[t0 + r] == sq) {
            active |= 1ull << r;
            pmax = max(pmax, a.pos[t0 + r]);
            pmin = min(pmin, a.pos[t0 + r]);
        }
    done |= active;
    return true;
}

template <int HD, int NQ> struct att_layout {
    static const int k_stride = HD + 8; /* elements: keeps lane-per-row reads conflict-free */
    static const int k_bytes = ATT_KT * k_stride * 2;
    static const int v_bytes = ATT_KT * HD * 2;
    static const int p_bytes = NQ * ATT_KT * 4;
    static const int warp_bytes = k_bytes + v_bytes + p_bytes;
    static const int q_bytes = NQ * HD * 4;
    static const int bytes = q_bytes + ATT_WARPS * warp_bytes;
};

template <int HD, int NQ, int T>
__global__ void __launch_bounds__(ATT_WARPS * 32)
    attn_tiled_kernel(cu_attn_args a, att_plan p) {
    cu_grid_trigger();
    cu_grid_wait();
    typedef att_layout<HD, NQ> L;
    const int DPL = HD / 32; /* head dims per lane in P·V */
    extern __shared__ __align__(16) unsigned char smem[];
    float *Qs = (float *)smem;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    unsigned char *wbase = smem + L::q_bytes + warp * L::warp_bytes;
    uint16_t *Ks = (uint16_t *)wbase;
    uint16_t *Vs = (uint16_t *)(wbase + L::k_bytes);
    float *Ps = (float *)(wbase + L::k_bytes + L::v_bytes);

    const int G = a.n_heads / a.n_kv_heads, hgroups = G / p.gq;
    const int kvh = blockIdx.x / hgroups, head0 = kvh * G + (blockIdx.x % hgroups) * p.gq;
    const int t0 = blockIdx.y * p.qr, nrows = min(p.qr, a.n - t0);
    const int split = blockIdx.z, kbeg = split * p.chunk;
    const float qscale = a.scale * ATT_LOG2E;

    uint64_t done = 0, active;
    int sq, pmax, pmin;
    while (att_next_pass(a, t0, nrows, done, sq, active, pmax, pmin)) { /* a pass per sequence */
        const int kend = min(kbeg + p.chunk, pmax + 1);
        if (kend <= kbeg) continue;

        __syncthreads(); /* the previous pass is done with shared memory */
        for (int i = threadIdx.x; i < NQ * HD; i += ATT_WARPS * 32) {
            int qv = i / HD, d = i % HD, r = qv / p.gq, h = qv % p.gq;
            float val = 0.f;
            if (r < nrows && ((active >> r) & 1))
                val = a.q[((size_t)(t0 + r) * a.n_heads + head0 + h) * HD + d] * qscale;
            Qs[i] = val;
        }
        __syncthreads();

        int qpos[NQ];
#pragma unroll
        for (int qv = 0; qv < NQ; qv++) {
            int r = qv / p.gq;
            qpos[qv] = (r < nrows && ((active >> r) & 1)) ? a.pos[t0 + r] : -1;
        }
        float m[NQ], l[NQ], acc[NQ][DPL];
#pragma unroll
        for (int qv = 0; qv < NQ; qv++) {
            m[qv] = -FLT_MAX;
            l[qv] = 0.f;
#pragma unroll
            for (int i = 0; i < DPL; i++) acc[qv][i] = 0.f;
        }
        const int32_t *btrow = a.block_table + (size_t)sq * a.max_pages;
        const uint16_t *kc = (const uint16_t *)a.k, *vc = (const uint16_t *)a.v;

        for (int ks = kbeg + warp * ATT_KT; ks < kend; ks += ATT_BLOCK_KEYS) {
            /* Copy this tile's K and V rows from their pages.  Lane j looks
             * up key ks + j's slot once; the lanes copying that key's 16-byte
             * chunks get it by shuffle. */
            const int CPR = HD / 8; /* 16-byte chunks per row; divides 32 */
            int own = ks + lane, slot_own = -1;
            if (own < kend) slot_own = btrow[own / a.page_size] * a.page_size + own % a.page_size;
#pragma unroll
            for (int i = 0; i < CPR; i++) {
                int j = i * (32 / CPR) + lane / CPR, part = lane % CPR;
                int slot = __shfl_sync(0xffffffffu, slot_own, j);
                uint16_t *kd = Ks + j * L::k_stride + part * 8, *vd = Vs + j * HD + part * 8;
                if (slot >= 0) {
                    size_t off = ((size_t)slot * a.n_kv_heads + kvh) * HD + part * 8;
                    cp_async16(kd, kc + off);
                    cp_async16(vd, vc + off);
                } else {
                    *(uint4 *)kd = make_uint4(0, 0, 0, 0);
                    *(uint4 *)vd = make_uint4(0, 0, 0, 0);
                }
            }
            cp_async_wait_all();
            __syncwarp();

            /* Scores: lane j against key ks + j. */
            float sc[NQ];
#pragma unroll
            for (int qv = 0; qv < NQ; qv++) sc[qv] = 0.f;
            const uint16_t *krow = Ks + lane * L::k_stride;
#pragma unroll
            for (int c = 0; c < HD / 8; c++) {
                float kf[8];
                cu_unpack<T>(*(const uint4 *)(krow + c * 8), kf);
#pragma unroll
                for (int qv = 0; qv < NQ; qv++) {
                    const float4 *qp = (const float4 *)(Qs + qv * HD + c * 8);
                    float4 q0 = qp[0], q1 = qp[1];
                    float s = sc[qv];
                    s = fmaf(kf[0], q0.x, s), s = fmaf(kf[1], q0.y, s);
                    s = fmaf(kf[2], q0.z, s), s = fmaf(kf[3], q0.w, s);
                    s = fmaf(kf[4], q1.x, s), s = fmaf(kf[5], q1.y, s);
                    s = fmaf(kf[6], q1.z, s), s = fmaf(kf[7], q1.w, s);
                    sc[qv] = s;
                }
            }
            const int kk = ks + lane;
#pragma unroll
            for (int qv = 0; qv < NQ; qv++) {
                float s = (kk < kend && kk <= qpos[qv]) ? sc[qv] : -INFINITY;
                float mnew = fmaxf(m[qv], cu_warp_max(s));
                float pj = exp2f(s - mnew), alpha = exp2f(m[qv] - mnew);
                l[qv] = fmaf(l[qv], alpha, cu_warp_sum(pj));
                m[qv] = mnew;
#pragma unroll
                for (int i = 0; i < DPL; i++) acc[qv][i] *= alpha;
                Ps[qv * ATT_KT + lane] = pj;
            }
            __syncwarp();

            /* P·V: lane owns head dims [lane*DPL, lane*DPL + DPL). */
#pragma unroll 2
            for (int j = 0; j < ATT_KT; j += 4) {
                float4 pq[NQ];
#pragma unroll
                for (int qv = 0; qv < NQ; qv++) pq[qv] = *(const float4 *)(Ps + qv * ATT_KT + j);
#pragma unroll
                for (int jj = 0; jj < 4; jj++) {
                    const uint16_t *vr = Vs + (j + jj) * HD + lane * DPL;
                    float vf[DPL];
                    if (DPL == 4) {
                        uint2 u = *(const uint2 *)vr;
                        uint4 u4 = make_uint4(u.x, u.y, 0, 0);
                        float tmp[8];
                        cu_unpack<T>(u4, tmp);
#pragma unroll
                        for (int i = 0; i < DPL; i++) vf[i] = tmp[i];
                    } else {
                        uint32_t u = *(const uint32_t *)vr;
                        uint4 u4 = make_uint4(u, 0, 0, 0);
                        float tmp[8];
                        cu_unpack<T>(u4, tmp);
#pragma unroll
                        for (int i = 0; i < DPL; i++) vf[i] = tmp[i];
                    }
#pragma unroll
                    for (int qv = 0; qv < NQ; qv++) {
                        float pj = jj == 0 ? pq[qv].x : jj == 1 ? pq[qv].y : jj == 2 ? pq[qv].z : pq[qv].w;
#pragma unroll
                        for (int i = 0; i < DPL; i++) acc[qv][i] = fmaf(pj, vf[i], acc[qv][i]);
                    }
                }
            }
            __syncwarp();
        }

        /* Merge the warps' running states. */
        __syncthreads();
        float *Cm = (float *)(smem + L::q_bytes), *Cl = Cm + ATT_WARPS * NQ,
              *Ca = Cl + ATT_WARPS * NQ;
        if (lane == 0)
#pragma unroll
            for (int qv = 0; qv < NQ; qv++) {
                Cm[warp * NQ + qv] = m[qv];
                Cl[warp * NQ + qv] = l[qv];
            }
#pragma unroll
        for (int qv = 0; qv < NQ; qv++)
#pragma unroll
            for (int i = 0; i < DPL; i++) Ca[(warp * NQ + qv) * HD + lane * DPL + i] = acc[qv][i];
        __syncthreads();
        for (int e = threadIdx.x; e < NQ * HD; e += ATT_WARPS * 32) {
            int qv = e / HD, d = e % HD, r = qv / p.gq, h = qv % p.gq;
            if (!(r < nrows && ((active >> r) & 1))) continue;
            float M = -FLT_MAX;
            for (int w = 0; w < ATT_WARPS; w++) M = fmaxf(M, Cm[w * NQ + qv]);
            float Lsum = 0.f, A = 0.f;
            for (int w = 0; w < ATT_WARPS; w++) {
                float f = exp2f(Cm[w * NQ + qv] - M);
                Lsum = fmaf(Cl[w * NQ + qv], f, Lsum);
                A = fmaf(Ca[(w * NQ + qv) * HD + d], f, A);
            }
            int t = t0 + r, head = head0 + h;
            if (p.n_splits == 1) {
                a.out[((size_t)t * a.n_heads + head) * HD + d] = A / Lsum;
            } else {
                size_t pi = ((size_t)split * a.n + t) * a.n_heads + head;
                p.part_acc[pi * HD + d] = A;
                if (d == 0) {
                    p.part_ml[2 * pi] = M;
                    p.part_ml[2 * pi + 1] = Lsum;
                }
            }
        }
    }
}

/* Merges the splits of each (row, head): split s holds keys
 * [s*chunk, (s+1)*chunk) and exists for row t only if s*chunk <= pos[t].
 * A block per (row, head) and 32 columns: the split weights 2^(m_s - M)
 * go to shared memory once, warp w sums the splits s = w (mod 8) for its
 * lane's column, and the 8 warps' sums are added in warp order (fixed:
 * the bits depend on the row alone).  Latency bounds it, not bytes: a
 * thread per column walking all 129 splits of a 32k row, one dependent
 * load after another, took about as long as the attention itself
 * (qwen3.5-27b's 32k decode row: ~60 µs a layer). */
#define MERGE_WARPS 8
#define MERGE_MAX_SPLITS 512

__global__ void __launch_bounds__(MERGE_WARPS * 32) attn_merge_kernel(cu_attn_args a, att_plan p) {
    cu_grid_trigger();
    cu_grid_wait();
    __shared__ float fs[MERGE_MAX_SPLITS], ls[MERGE_MAX_SPLITS], red[MERGE_WARPS];
    __shared__ float wa[MERGE_WARPS][32], wl[MERGE_WARPS];
    const int t = blockIdx.x / a.n_heads, hd = a.head_dim;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, d = blockIdx.y * 32 + lane;
    const int nvalid = min(p.n_splits, a.pos[t] / p.chunk + 1);
    /* (row, head) = blockIdx.x; its split s is partial row s * stride + blockIdx.x */
    const size_t stride = (size_t)a.n * a.n_heads;
    float mx = -FLT_MAX;
    for (int s = threadIdx.x; s < nvalid; s += MERGE_WARPS * 32)
        mx = fmaxf(mx, p.part_ml[2 * (s * stride + blockIdx.x)]);
    mx = cu_warp_max(mx);
    if (lane == 0) red[warp] = mx;
    __syncthreads();
    float M = red[0];
#pragma unroll
    for (int w = 1; w < MERGE_WARPS; w++) M = fmaxf(M, red[w]);
    for (int s = threadIdx.x; s < nvalid; s += MERGE_WARPS * 32) {
        size_t pi = s * stride + blockIdx.x;
        fs[s] = exp2f(p.part_ml[2 * pi] - M);
        ls[s] = p.part_ml[2 * pi + 1];
    }
    __syncthreads();
    float A = 0.f, L = 0.f;
#pragma unroll 4
    for (int s = warp; s < nvalid; s += MERGE_WARPS) {
        const float f = fs[s];
        L = fmaf(ls[s], f, L);
        if (d < hd) A = fmaf(p.part_acc[(s * stride + blockIdx.x) * hd + d], f, A);
    }
    wa[warp][lane] = A;
    if (lane == 0) wl[warp] = L;
    __syncthreads();
    if (warp == 0 && d < hd) {
        float As = wa[0][lane], Ls = wl[0];
#pragma unroll
        for (int w = 1; w < MERGE_WARPS; w++) As += wa[w][lane], Ls += wl[w];
        a.out[(size_t)blockIdx.x * hd + d] = As / Ls;
    }
}

/* ---- the tensor-core kernel (prefill) ------------------------------------------- */

/* Rows of a prefill chunk share every K/V tile, so scores and P·V are
 * matrix products: mma.sync m16n8k16 with f32 accumulation (sm_80+), a warp
 * per 16 query vectors, 4 warps per block sharing double-buffered 64-key K/V
 * tiles (cp.async).  The cache is f16/bf16 already; queries and
 * probabilities are split into a 16-bit high part and a 16-bit remainder
 * (x = hi + lo) and multiplied twice, which keeps the f32 kernels' accuracy
 * (~1e-6) for twice the tensor work, still far below the memory time. */
#define MMA_KT 64
#define MMA_WARPS 4
#define MMA_QV (MMA_WARPS * 16) /* query vectors per block */

template <int HD> struct mma_layout {
    static const int ks = HD + 8; /* row stride in elements: conflict-free fragment reads */
    static const int stage_elems = 2 * MMA_KT * ks;
    static const int bytes = 2 * stage_elems * 2;
};

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void *smem) {
    unsigned addr = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

/* Copies keys [ks, ks + MMA_KT) of kv head kvh into a stage (zeros past kend). */
template <int HD>
__device__ __forceinline__ void mma_load_tile(uint16_t *Kst, uint16_t *Vst, const cu_attn_args &a,
                                              const int32_t *btrow, int kvh, int ks, int kend) {
    const int CPR = HD / 8, KS = mma_layout<HD>::ks;
    const uint16_t *kc = (const uint16_t *)a.k, *vc = (const uint16_t *)a.v;
#pragma unroll 4
    for (int c = threadIdx.x; c < MMA_KT * CPR; c += MMA_WARPS * 32) {
        int j = c / CPR, part = c % CPR, kk = ks + j;
        uint16_t *kd = Kst + j * KS + part * 8, *vd = Vst + j * KS + part * 8;
        if (kk < kend) {
            int slot = btrow[kk / a.page_size] * a.page_size + kk % a.page_size;
            size_t off = ((size_t)slot * a.n_kv_heads + kvh) * HD + part * 8;
            cp_async16(kd, kc + off);
            cp_async16(vd, vc + off);
        } else {
            *(uint4 *)kd = make_uint4(0, 0, 0, 0);
            *(uint4 *)vd = make_uint4(0, 0, 0, 0);
        }
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
}

template <int HD, int T>
__global__ void __launch_bounds__(MMA_WARPS * 32) attn_mma_kernel(cu_attn_args a, att_plan p) {
    cu_grid_trigger();
    cu_grid_wait();
    typedef mma_layout<HD> L;
    const int KS = L::ks, ND = HD / 8, NK = HD / 16;
    extern __shared__ __align__(16) unsigned char smem[];
    uint16_t *stage0 = (uint16_t *)smem;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;

    const int G = a.n_heads / a.n_kv_heads, hgroups = G / p.gq, gq = p.gq;
    const int kvh = blockIdx.x / hgroups, head0 = kvh * G + (blockIdx.x % hgroups) * gq;
    const int qrb = MMA_QV / gq;
    const int t0 = blockIdx.y * qrb, nrows = min(qrb, a.n - t0);
    const int split = blockIdx.z, kbeg = split * p.chunk;
    const float qscale = a.scale * ATT_LOG2E;
    /* this lane's two query vectors (fragment rows g and g + 8) */
    const int v0 = warp * 16 + g, v1 = v0 + 8;
    const int r0 = v0 / gq, h0 = v0 % gq, r1 = v1 / gq, h1 = v1 % gq;

    uint64_t done = 0, active;
    int sq, pmax, pmin;
    while (att_next_pass(a, t0, nrows, done, sq, active, pmax, pmin)) { /* a pass per sequence */
        const int kend = min(kbeg + p.chunk, pmax + 1);
        if (kend <= kbeg) continue;

        const bool act0 = r0 < nrows && ((active >> r0) & 1), act1 = r1 < nrows && ((active >> r1) & 1);
        const int pos0 = act0 ? a.pos[t0 + r0] : -1, pos1 = act1 ? a.pos[t0 + r1] : -1;
        int wmax = max(pos0, pos1);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) wmax = max(wmax, __shfl_xor_sync(0xffffffffu, wmax, o));

        /* Q fragments, pre-scaled into the log2 domain, split hi + lo. */
        uint32_t qh[NK][4], ql[NK][4];
        {
            const float *q0 = a.q + ((size_t)(t0 + r0) * a.n_heads + head0 + h0) * HD + 2 * t4;
            const float *q1 = a.q + ((size_t)(t0 + r1) * a.n_heads + head0 + h1) * HD + 2 * t4;
            const float2 zero = make_float2(0.f, 0.f);
#pragma unroll
            for (int kk = 0; kk < NK; kk++) {
                float2 x00 = act0 ? *(const float2 *)(q0 + kk * 16) : zero;
                float2 x10 = act1 ? *(const float2 *)(q1 + kk * 16) : zero;
                float2 x01 = act0 ? *(const float2 *)(q0 + kk * 16 + 8) : zero;
                float2 x11 = act1 ? *(const float2 *)(q1 + kk * 16 + 8) : zero;
                split2<T>(x00.x * qscale, x00.y * qscale, qh[kk][0], ql[kk][0]);
                split2<T>(x10.x * qscale, x10.y * qscale, qh[kk][1], ql[kk][1]);
                split2<T>(x01.x * qscale, x01.y * qscale, qh[kk][2], ql[kk][2]);
                split2<T>(x11.x * qscale, x11.y * qscale, qh[kk][3], ql[kk][3]);
            }
        }
        float o[ND][4];
#pragma unroll
        for (int d = 0; d < ND; d++) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.f;
        float m0 = -FLT_MAX, m1 = -FLT_MAX, l0 = 0.f, l1 = 0.f;

        const int32_t *btrow = a.block_table + (size_t)sq * a.max_pages;
        const int ntiles = CU_DIV_UP(kend - kbeg, MMA_KT);
        __syncthreads(); /* the previous pass is done with the stages */
        mma_load_tile<HD>(stage0, stage0 + MMA_KT * KS, a, btrow, kvh, kbeg, kend);
        for (int it = 0; it < ntiles; it++) {
            uint16_t *Ks = stage0 + (it & 1) * L::stage_elems, *Vs = Ks + MMA_KT * KS;
            if (it + 1 < ntiles) {
                uint16_t *Kn = stage0 + ((it + 1) & 1) * L::stage_elems;
                mma_load_tile<HD>(Kn, Kn + MMA_KT * KS, a, btrow, kvh, kbeg + (it + 1) * MMA_KT, kend);
                asm volatile("cp.async.wait_group 1;" ::: "memory");
            } else {
                asm volatile("cp.async.wait_group 0;" ::: "memory");
            }
            __syncthreads();
            const int ks = kbeg + it * MMA_KT;
            if (ks <= wmax) { /* warp-uniform: causal tiles past every row are skipped */
                float sc[MMA_KT / 8][4];
#pragma unroll
                for (int j = 0; j < MMA_KT / 8; j++) sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.f;
#pragma unroll
                for (int kk = 0; kk < NK; kk++)
#pragma unroll
                    for (int j = 0; j < MMA_KT / 8; j++) {
                        const uint16_t *kr = Ks + (j * 8 + g) * KS + kk * 16 + 2 * t4;
                        uint32_t b0 = *(const uint32_t *)kr, b1 = *(const uint32_t *)(kr + 8);
                        mma16816<T>(sc[j], qh[kk], b0, b1);
                        mma16816<T>(sc[j], ql[kk], b0, b1);
                    }
                /* mask, running max per row (a row's 64 scores live in 4 lanes) */
                float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
                for (int j = 0; j < MMA_KT / 8; j++)
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        int key = ks + j * 8 + 2 * t4 + e;
                        if (!(key < kend && key <= pos0)) sc[j][e] = -INFINITY;
                        if (!(key < kend && key <= pos1)) sc[j][2 + e] = -INFINITY;
                        mx0 = fmaxf(mx0, sc[j][e]);
                        mx1 = fmaxf(mx1, sc[j][2 + e]);
                    }
                mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
                mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
                mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
                mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
                const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
                const float al0 = exp2f(m0 - mn0), al1 = exp2f(m1 - mn1);
                m0 = mn0, m1 = mn1;
                l0 *= al0, l1 *= al1;
#pragma unroll
                for (int j = 0; j < MMA_KT / 8; j++) {
                    sc[j][0] = exp2f(sc[j][0] - mn0), sc[j][1] = exp2f(sc[j][1] - mn0);
                    sc[j][2] = exp2f(sc[j][2] - mn1), sc[j][3] = exp2f(sc[j][3] - mn1);
                    l0 += sc[j][0] + sc[j][1];
                    l1 += sc[j][2] + sc[j][3];
                }
#pragma unroll
                for (int d = 0; d < ND; d++) o[d][0] *= al0, o[d][1] *= al0, o[d][2] *= al1, o[d][3] *= al1;
                /* O += P·V; P's accumulator layout is the A layout of the next product */
#pragma unroll
                for (int m = 0; m < MMA_KT / 16; m++) {
                    uint32_t ph[4], pl[4];
                    split2<T>(sc[2 * m][0], sc[2 * m][1], ph[0], pl[0]);
                    split2<T>(sc[2 * m][2], sc[2 * m][3], ph[1], pl[1]);
                    split2<T>(sc[2 * m + 1][0], sc[2 * m + 1][1], ph[2], pl[2]);
                    split2<T>(sc[2 * m + 1][2], sc[2 * m + 1][3], ph[3], pl[3]);
                    const uint16_t *vrow =
                        Vs + (16 * m + (lane & 7) + ((lane >> 3) & 1) * 8) * KS + (lane >> 4) * 8;
#pragma unroll
                    for (int d = 0; d < ND; d += 2) {
                        uint32_t b[4];
                        ldmatrix_x4_trans(b, vrow + 8 * d);
                        mma16816<T>(o[d], ph, b[0], b[1]);
                        mma16816<T>(o[d], pl, b[0], b[1]);
                        mma16816<T>(o[d + 1], ph, b[2], b[3]);
                        mma16816<T>(o[d + 1], pl, b[2], b[3]);
                    }
                }
            }
            __syncthreads(); /* the stage is overwritten by the next prefetch */
        }

        l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
        l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
        l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
        l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
#pragma unroll
        for (int half = 0; half < 2; half++) {
            const bool act = half ? act1 : act0;
            if (!act) continue;
            const int t = t0 + (half ? r1 : r0), head = head0 + (half ? h1 : h0);
            const float M = half ? m1 : m0, Lsum = half ? l1 : l0;
            if (p.n_splits == 1) {
                float *dst = a.out + ((size_t)t * a.n_heads + head) * HD + 2 * t4;
                const float inv = 1.0f / Lsum;
#pragma unroll
                for (int d = 0; d < ND; d++)
                    *(float2 *)(dst + 8 * d) = make_float2(o[d][2 * half] * inv, o[d][2 * half + 1] * inv);
            } else {
                size_t pi = ((size_t)split * a.n + t) * a.n_heads + head;
                float *dst = p.part_acc + pi * HD + 2 * t4;
#pragma unroll
                for (int d = 0; d < ND; d++)
                    *(float2 *)(dst + 8 * d) = make_float2(o[d][2 * half], o[d][2 * half + 1]);
                if (t4 == 0) {
                    p.part_ml[2 * pi] = M;
                    p.part_ml[2 * pi + 1] = Lsum;
                }
            }
        }
    }
}

/* ---- the wide kernel (head_dim 256; DeepSeek's 576-wide latent rows) ---------------- */

/* Heads too wide for the kernels above: 16 query vectors of head_dim 256
 * or 576 hold 64 or 144 f32 accumulators a lane in a warp that owns all
 * their columns, and their queries alone would fill the registers the
 * tensor-core kernel keeps them in.  So 8 warps share one query tile of
 * QV = 16 * MT query vectors (MT = 1 for decode, 4 for prefill and wide
 * groups) and split every 16-key step three ways:
 *
 *   1. scores: each warp computes SPW of the QV x KT tile's 16x8 pieces
 *      (mma, queries from shared memory, split hi + lo as in the
 *      tensor-core kernel) into a shared score tile;
 *   2. softmax: TPR threads per query vector take KPT keys each, mask,
 *      update that vector's running max and sum (base 2) and write the
 *      probabilities, split hi + lo, and the rescale factor;
 *   3. P·V: each warp owns head_dim / 8 output columns for all QV vectors
 *      (mma, V through ldmatrix.trans) and rescales them.
 *
 * A K/V tile is read once for all QV query vectors: for MLA (one latent
 * KV head, V the same row as K: `VK`, no V tile) that is 16 heads a block
 * in decode, 64 in prefill.  Every output column is computed, the latent
 * rows' rope part too, so the result is attention's over the whole row.
 *
 * Batch invariance: decode and verification take the same instance (MT
 * from the group size alone), the fixed splits of the tiled kernel, and
 * a query vector's arithmetic does not depend on the others in the tile
 * (an mma row is its own dot products; the softmax reductions stay inside
 * the vector's own lanes); keys past its position are exact no-ops. */
#define WIDE_WARPS 8

template <int HD, int MT, int VK> struct wide_layout {
    static const int QV = 16 * MT;
    static const int KT = MT == 1 ? 64 : 32; /* keys a tile: 8 or 16 score pieces */
    static const int ks = HD + 8;            /* K/V row stride, elements */
    static const int qs = HD / 2 + 4;        /* Q row stride, 32-bit pairs */
    static const int ss = KT + 8;            /* score row stride, floats */
    static const int ps = KT / 2 + 4;        /* P row stride, 32-bit pairs */
    static const int q_bytes = 2 * QV * qs * 4;
    static const int s_bytes = QV * ss * 4;
    static const int p_bytes = 2 * QV * ps * 4;
    static const int row_bytes = 2 * QV * 4; /* per query vector: alpha, final sum */
    static const int tile_bytes = KT * ks * 2 * (VK ? 1 : 2);
    static const int fixed = q_bytes + s_bytes + p_bytes + row_bytes;
    static const int stages = fixed + 2 * tile_bytes <= 227 * 1024 ? 2 : 1;
    static const int bytes = fixed + stages * tile_bytes;
};

__device__ __forceinline__ void ldmatrix_x2_trans(uint32_t (&r)[2], const void *smem) {
    unsigned addr = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(addr));
}

/* Copies keys [ks, ks + KT) of kv head kvh into a stage (zeros past kend). */
/* Copies keys [ks, ks + KT) of kv head kvh into a stage, zeros outside
 * [klo, kend): below a window the pages may be recycled (kvcache.h). */
template <int HD, int KT, int VK>
__device__ __forceinline__ void wide_load_tile(uint16_t *Kst, uint16_t *Vst, const cu_attn_args &a,
                                               const int32_t *btrow, int kvh, int ks, int klo,
                                               int kend) {
    const int CPR = HD / 8, KS = HD + 8;
    const uint16_t *kc = (const uint16_t *)a.k, *vc = (const uint16_t *)a.v;
#pragma unroll 4
    for (int c = threadIdx.x; c < KT * CPR; c += WIDE_WARPS * 32) {
        int j = c / CPR, part = c % CPR, kk = ks + j;
        uint16_t *kd = Kst + j * KS + part * 8, *vd = Vst + j * KS + part * 8;
        if (kk >= klo && kk < kend) {
            int slot = btrow[kk / a.page_size] * a.page_size + kk % a.page_size;
            size_t off = ((size_t)slot * a.n_kv_heads + kvh) * HD + part * 8;
            cp_async16(kd, kc + off);
            if (!VK) cp_async16(vd, vc + off);
        } else {
            *(uint4 *)kd = make_uint4(0, 0, 0, 0);
            if (!VK) *(uint4 *)vd = make_uint4(0, 0, 0, 0);
        }
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
}

template <int HD, int MT, int VK, int T>
__global__ void __launch_bounds__(WIDE_WARPS * 32, 1) attn_wide_kernel(cu_attn_args a, att_plan p) {
    cu_grid_trigger();
    cu_grid_wait();
    typedef wide_layout<HD, MT, VK> L;
    const int QV = L::QV, KT = L::KT, KS = L::ks, QS = L::qs, SS = L::ss, PS = L::ps;
    const int TPR = WIDE_WARPS * 32 / QV; /* softmax threads a query vector: 16 or 4 */
    const int KPT = KT / TPR;             /* keys a softmax thread: 4 or 8 */
    const int ND = HD / 64;               /* 8-column output pieces a warp */
    const int SPW = MT * KT / 64;         /* 16x8 score pieces a warp */
    extern __shared__ __align__(16) unsigned char smem[];
    uint32_t *Qh = (uint32_t *)smem, *Ql = Qh + QV * QS;
    float *S = (float *)(Ql + QV * QS);
    uint32_t *Ph = (uint32_t *)(S + QV * SS), *Pl = Ph + QV * PS;
    float *Rw = (float *)(Pl + QV * PS); /* [QV] alpha of the tile, [QV] final sums */
    uint16_t *stage0 = (uint16_t *)(Rw + 2 * QV);
    const int tile_elems = L::tile_bytes / 2;

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    const int G = a.n_heads / a.n_kv_heads, hgroups = G / p.gq, gq = p.gq;
    const int kvh = blockIdx.x / hgroups, head0 = kvh * G + (blockIdx.x % hgroups) * gq;
    const int t0 = blockIdx.y * p.qr, nrows = min(p.qr, a.n - t0);
    const int split = blockIdx.z, kbeg = split * p.chunk;
    const float qscale = a.scale * ATT_LOG2E;
    const int sv = threadIdx.x / TPR, sk = (threadIdx.x % TPR) * KPT; /* softmax role */
    const int c0 = warp * (HD / 8);                                   /* P·V columns */
    const int smt = (warp * SPW) / (KT / 8), snt = (warp * SPW) % (KT / 8); /* score pieces */

    uint64_t done = 0, active;
    int sq, pmax, pmin;
    while (att_next_pass(a, t0, nrows, done, sq, active, pmax, pmin)) { /* a pass per sequence */
        const int kend = min(kbeg + p.chunk, pmax + 1);
        if (kend <= kbeg) continue;
        /* With a window, keys below every row's window are neither read
         * nor walked; tiles stay on the split's KT grid (batch invariance).
         * A split wholly below them writes an empty partial. */
        const int klo = a.window > 0 ? max(kbeg, pmin - a.window + 1) : kbeg;
        const int kfirst = kbeg + (klo - kbeg) / KT * KT;

        __syncthreads(); /* the previous pass is done with shared memory */
        for (int i = threadIdx.x; i < QV * (HD / 2); i += WIDE_WARPS * 32) {
            int qv = i / (HD / 2), d2 = i % (HD / 2), r = qv / gq, h = qv % gq;
            float2 x = make_float2(0.f, 0.f);
            if (r < nrows && ((active >> r) & 1))
                x = *(const float2 *)(a.q + ((size_t)(t0 + r) * a.n_heads + head0 + h) * HD + 2 * d2);
            split2<T>(x.x * qscale, x.y * qscale, Qh[qv * QS + d2], Ql[qv * QS + d2]);
        }
        int spos; /* the softmax row's position; -1: no row */
        {
            int r = sv / gq;
            spos = r < nrows && ((active >> r) & 1) ? a.pos[t0 + r] : -1;
        }
        const int slo = a.window > 0 ? spos - a.window + 1 : 0; /* its first key */
        const float cap = a.softcap * ATT_LOG2E; /* the soft-cap in the log2 domain */
        float m = -FLT_MAX, l = 0.f, o[MT][ND][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int n = 0; n < ND; n++) o[mt][n][0] = o[mt][n][1] = o[mt][n][2] = o[mt][n][3] = 0.f;

        const int32_t *btrow = a.block_table + (size_t)sq * a.max_pages;
        const int ntiles = kend > kfirst ? CU_DIV_UP(kend - kfirst, KT) : 0;
        if (ntiles) wide_load_tile<HD, KT, VK>(stage0, stage0 + KT * KS, a, btrow, kvh, kfirst, klo, kend);
        for (int it = 0; it < ntiles; it++) {
            uint16_t *Ks = stage0 + (L::stages == 2 ? (it & 1) * tile_elems : 0);
            const uint16_t *Vs = VK ? Ks : Ks + KT * KS;
            if (L::stages == 2 && it + 1 < ntiles) {
                uint16_t *Kn = stage0 + ((it + 1) & 1) * tile_elems;
                wide_load_tile<HD, KT, VK>(Kn, Kn + KT * KS, a, btrow, kvh, kfirst + (it + 1) * KT,
                                           klo, kend);
                asm volatile("cp.async.wait_group 1;" ::: "memory");
            } else {
                asm volatile("cp.async.wait_group 0;" ::: "memory");
            }
            __syncthreads(); /* the tile, and (first tile) the queries, are in */
            const int ks = kfirst + it * KT;

            /* 1. scores of pieces (smt, snt .. snt + SPW - 1) */
            {
                float sc[SPW][4];
#pragma unroll
                for (int s = 0; s < SPW; s++) sc[s][0] = sc[s][1] = sc[s][2] = sc[s][3] = 0.f;
                const uint32_t *qh = Qh + (smt * 16 + g) * QS + t4;
                const uint32_t *ql = Ql + (smt * 16 + g) * QS + t4;
#pragma unroll 4
                for (int kk = 0; kk < HD / 16; kk++) {
                    const int c = kk * 8;
                    uint32_t ah[4] = {qh[c], qh[8 * QS + c], qh[c + 4], qh[8 * QS + c + 4]};
                    uint32_t al[4] = {ql[c], ql[8 * QS + c], ql[c + 4], ql[8 * QS + c + 4]};
#pragma unroll
                    for (int s = 0; s < SPW; s++) {
                        const uint32_t *kr =
                            (const uint32_t *)(Ks + ((snt + s) * 8 + g) * KS) + kk * 8 + t4;
                        uint32_t b0 = kr[0], b1 = kr[4];
                        mma16816<T>(sc[s], ah, b0, b1);
                        mma16816<T>(sc[s], al, b0, b1);
                    }
                }
#pragma unroll
                for (int s = 0; s < SPW; s++) {
                    float *sr = S + (smt * 16 + g) * SS + (snt + s) * 8 + 2 * t4;
                    *(float2 *)sr = make_float2(sc[s][0], sc[s][1]);
                    *(float2 *)(sr + 8 * SS) = make_float2(sc[s][2], sc[s][3]);
                }
            }
            __syncthreads();

            /* 2. softmax of query vector sv over keys sk .. sk + KPT - 1 */
            {
                const float *sr = S + sv * SS + sk;
                float e[KPT], mx = -INFINITY;
#pragma unroll
                for (int j = 0; j < KPT; j++) {
                    int key = ks + sk + j;
                    float v = sr[j];
                    if (cap > 0.f) v = cap * tanhf(v / cap);
                    e[j] = key < kend && key <= spos && key >= slo ? v : -INFINITY;
                    mx = fmaxf(mx, e[j]);
                }
#pragma unroll
                for (int off = TPR / 2; off > 0; off >>= 1)
                    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
                const float mn = fmaxf(m, mx), alpha = exp2f(m - mn);
                float sum = 0.f;
#pragma unroll
                for (int j = 0; j < KPT; j++) {
                    e[j] = exp2f(e[j] - mn);
                    sum += e[j];
                }
#pragma unroll
                for (int off = TPR / 2; off > 0; off >>= 1)
                    sum += __shfl_xor_sync(0xffffffffu, sum, off);
                l = fmaf(l, alpha, sum);
                m = mn;
#pragma unroll
                for (int j = 0; j < KPT; j += 2)
                    split2<T>(e[j], e[j + 1], Ph[sv * PS + (sk + j) / 2], Pl[sv * PS + (sk + j) / 2]);
                if (sk == 0) Rw[sv] = alpha;
            }
            __syncthreads();

            /* 3. O = O * alpha + P·V over this warp's columns */
            {
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    const float a0 = Rw[mt * 16 + g], a1 = Rw[mt * 16 + g + 8];
#pragma unroll
                    for (int n = 0; n < ND; n++) o[mt][n][0] *= a0, o[mt][n][1] *= a0, o[mt][n][2] *= a1, o[mt][n][3] *= a1;
                }
                /* m-tiles outer: B fragments are read again per m-tile, but
                 * only one m-tile's probabilities are live (MT 4 at 576
                 * columns holds 144 accumulators a lane already) */
#pragma unroll
                for (int k16 = 0; k16 < KT / 16; k16++)
#pragma unroll
                    for (int mt = 0; mt < MT; mt++) {
                        const uint32_t *hr = Ph + (mt * 16 + g) * PS + k16 * 8 + t4;
                        const uint32_t *lr = Pl + (mt * 16 + g) * PS + k16 * 8 + t4;
                        uint32_t ph[4] = {hr[0], hr[8 * PS], hr[4], hr[8 * PS + 4]};
                        uint32_t pl[4] = {lr[0], lr[8 * PS], lr[4], lr[8 * PS + 4]};
                        const uint16_t *vrow =
                            Vs + (k16 * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * KS + c0 + (lane >> 4) * 8;
#pragma unroll
                        for (int n = 0; n < ND; n += 2) {
                            if (n + 1 < ND) {
                                uint32_t b[4];
                                ldmatrix_x4_trans(b, vrow + 8 * n);
                                mma16816<T>(o[mt][n], ph, b[0], b[1]);
                                mma16816<T>(o[mt][n], pl, b[0], b[1]);
                                mma16816<T>(o[mt][n + 1], ph, b[2], b[3]);
                                mma16816<T>(o[mt][n + 1], pl, b[2], b[3]);
                            } else {
                                uint32_t b[2];
                                ldmatrix_x2_trans(b, vrow + 8 * n);
                                mma16816<T>(o[mt][n], ph, b[0], b[1]);
                                mma16816<T>(o[mt][n], pl, b[0], b[1]);
                            }
                        }
                    }
            }
            __syncthreads(); /* the stage, scores and probabilities are reused */
            if (L::stages == 1 && it + 1 < ntiles)
                wide_load_tile<HD, KT, VK>(stage0, stage0 + KT * KS, a, btrow, kvh,
                                           kfirst + (it + 1) * KT, klo, kend);
        }

        /* The softmax rows' totals, then this warp's columns out. */
        if (sk == 0 && spos >= 0) {
            Rw[QV + sv] = l;
            if (p.n_splits > 1) {
                int r = sv / gq, h = sv % gq;
                size_t pi = ((size_t)split * a.n + t0 + r) * a.n_heads + head0 + h;
                p.part_ml[2 * pi] = m;
                p.part_ml[2 * pi + 1] = l;
            }
        }
        __syncthreads();
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int half = 0; half < 2; half++) {
                const int qv = mt * 16 + g + 8 * half, r = qv / gq, h = qv % gq;
                if (!(r < nrows && ((active >> r) & 1))) continue;
                const int t = t0 + r, head = head0 + h;
                if (p.n_splits == 1) {
                    float *dst = a.out + ((size_t)t * a.n_heads + head) * HD + c0 + 2 * t4;
                    const float inv = 1.0f / Rw[QV + qv];
#pragma unroll
                    for (int n = 0; n < ND; n++)
                        *(float2 *)(dst + 8 * n) = make_float2(o[mt][n][2 * half] * inv, o[mt][n][2 * half + 1] * inv);
                } else {
                    size_t pi = ((size_t)split * a.n + t) * a.n_heads + head;
                    float *dst = p.part_acc + pi * HD + c0 + 2 * t4;
#pragma unroll
                    for (int n = 0; n < ND; n++)
                        *(float2 *)(dst + 8 * n) = make_float2(o[mt][n][2 * half], o[mt][n][2 * half + 1]);
                }
            }
    }
}

/* ---- the plain kernel ------------------------------------------------------- */

/* head_dim <= 576: DeepSeek's latent cache rows (kv rank 512 + rope 64) */
#define SIMPLE_MAX_DPL 18

template <int T> __global__ void attn_simple_kernel(cu_attn_args a) {
    cu_grid_trigger();
    cu_grid_wait();
    const int wid = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31;
    if (wid >= a.n * a.n_heads) return;
    const int t = wid / a.n_heads, h = wid % a.n_heads, hd = a.head_dim;
    const int kvh = h / (a.n_heads / a.n_kv_heads), p = a.pos[t];
    const int32_t *btrow = a.block_table + (size_t)a.seq[t] * a.max_pages;
    const float *qr = a.q + ((size_t)t * a.n_heads + h) * hd;
    float qv[SIMPLE_MAX_DPL], acc[SIMPLE_MAX_DPL];
#pragma unroll
    for (int i = 0; i < SIMPLE_MAX_DPL; i++) {
        int d = lane + 32 * i;
        qv[i] = d < hd ? qr[d] : 0.f;
        acc[i] = 0.f;
    }
    float m = -FLT_MAX, l = 0.f;
    for (int j = 0; j <= p; j++) {
        int page = btrow[j / a.page_size];
        size_t base = (((size_t)page * a.page_size + j % a.page_size) * a.n_kv_heads + kvh) * hd;
        float dot = 0.f;
#pragma unroll
        for (int i = 0; i < SIMPLE_MAX_DPL; i++) {
            int d = lane + 32 * i;
            if (d < hd) dot = fmaf(qv[i], cu_load_elem<T>(a.k, base + d), dot);
        }
        float s = cu_warp_sum(dot) * a.scale;
        float mnew = fmaxf(m, s), alpha = expf(m - mnew), pj = expf(s - mnew);
        l = l * alpha + pj;
        m = mnew;
#pragma unroll
        for (int i = 0; i < SIMPLE_MAX_DPL; i++) {
            int d = lane + 32 * i;
            if (d < hd) acc[i] = acc[i] * alpha + pj * cu_load_elem<T>(a.v, base + d);
        }
    }
    float *o = a.out + ((size_t)t * a.n_heads + h) * hd;
#pragma unroll
    for (int i = 0; i < SIMPLE_MAX_DPL; i++) {
        int d = lane + 32 * i;
        if (d < hd) o[d] = acc[i] / l;
    }
}

extern "C" void cu_attention_simple(const cu_ctx *c, const cu_attn_args *a) {
    int warps = a->n * a->n_heads;
    if (warps <= 0) return;
    int blocks = CU_DIV_UP(warps, 4);
    if (a->dtype == CU_F32) CU_LAUNCH((attn_simple_kernel<CU_F32>), blocks, 128, 0, c, *a);
    else if (a->dtype == CU_F16) CU_LAUNCH((attn_simple_kernel<CU_F16>), blocks, 128, 0, c, *a);
    else CU_LAUNCH((attn_simple_kernel<CU_BF16>), blocks, 128, 0, c, *a);
}

/* ---- planning and dispatch ------------------------------------------------------- */

#define MMA_MIN_ROWS 64
#define MMA_MIN_SEQ_ROWS 16 /* rows a sequence, on average, for tensor cores */

/* Fills the plan for the tiled, tensor-core or wide kernel; -1 if this
 * shape needs the simple one. */
static int make_plan(const cu_attn_args *a, int n_sm, att_plan *p) {
    if (a->n <= 0 || a->n_kv_heads <= 0 || a->n_heads % a->n_kv_heads) return -1;
    if (a->dtype == CU_F32) return -1;
    if (!cu_aligned16(a->q) || !cu_aligned16(a->k) || !cu_aligned16(a->v)) return -1;
    int G = a->n_heads / a->n_kv_heads, hd = a->head_dim;
    /* Rows of one sequence share K/V tiles, so a block takes several:
     * prefill chunks (many rows a sequence) the tensor-core kernel, short
     * runs the tiled kernel with 8 / gq rows a block.  Rows that share
     * nothing (decode: each its own sequence) take a block each, or a
     * block would run one pass per sequence; many of them in one batch
     * (batched decode) stay on the tiled kernel for the same reason. */
    int per_seq = a->n_seqs > 0 ? a->n / a->n_seqs : a->n;
    p->mma = a->n >= MMA_MIN_ROWS && per_seq >= MMA_MIN_SEQ_ROWS && !a->tiled_only;
    int kt;
    if ((hd == 64 || hd == 128) && a->window <= 0 && a->softcap <= 0.f) {
        int gq = G <= 8 ? G : (G % 8 == 0 ? 8 : 0);
        if (gq != 1 && gq != 2 && gq != 4 && gq != 8) return -1;
        p->wide = 0;
        p->gq = gq;
        p->qr = p->mma ? MMA_QV / gq : per_seq > 1 ? 8 / gq : 1;
        kt = MMA_KT;
    } else if (hd == 256 || (hd == 576 && a->k == a->v)) {
        /* The wide kernel: 64 query vectors a block for prefill and for
         * groups over 16 heads (MLA's 128), else 16.  Outside prefill the
         * choice depends on the group alone, so a row decoded and the same
         * row verified take one instance (batch invariance). */
        int mt = p->mma || G > 16 ? 4 : 1, qv = 16 * mt;
        int gq = G <= qv ? G : (G % qv == 0 ? qv : 0);
        if (!gq) return -1;
        p->wide = mt;
        p->gq = gq;
        p->qr = p->mma || per_seq > 1 ? qv / gq : 1;
        kt = mt == 1 ? 64 : 32;
    } else {
        return -1;
    }
    long rowgroups = CU_DIV_UP(a->n, p->qr);
    long base = (long)a->n_kv_heads * (G / p->gq) * rowgroups;
    long max_ctx = (long)a->max_pages * a->page_size;
    long chunk;
    if (p->mma) {
        /* Enough blocks for three per multiprocessor (what fits in shared
         * memory), each split at least one tile of keys. */
        long tiles = CU_DIV_UP(max_ctx, kt);
        long splits = CU_DIV_UP(3L * n_sm, base);
        if (splits > tiles) splits = tiles;
        if (splits > MERGE_MAX_SPLITS) splits = MERGE_MAX_SPLITS;
        if (splits < 1) splits = 1;
        chunk = CU_DIV_UP(CU_DIV_UP(max_ctx, splits), kt) * kt;
    } else {
        /* A fixed split, not one sized from the batch: a row's splits (and
         * so its bits) must not depend on the other rows (file comment). */
        long most = p->wide ? WIDE_SPLIT_MAX : ATT_SPLIT_MAX;
        chunk = ATT_SPLIT_KEYS;
        while (max_ctx > chunk * most) chunk *= 2;
    }
    p->chunk = (int)chunk;
    p->n_splits = (int)CU_DIV_UP(max_ctx, chunk);
    p->part_acc = p->part_ml = NULL;
    return 0;
}

extern "C" size_t cu_attention_scratch(const cu_attn_args *a, int n_sm) {
    att_plan p;
    if (make_plan(a, n_sm, &p) || p.n_splits == 1) return 0;
    size_t rows = (size_t)p.n_splits * a->n * a->n_heads;
    return rows * (a->head_dim + 2) * sizeof(float);
}

template <int HD, int NQ, int T>
static void launch_tiled(const cu_ctx *c, const cu_attn_args *a, const att_plan *p) {
    const int bytes = att_layout<HD, NQ>::bytes;
    int G = a->n_heads / a->n_kv_heads;
    dim3 grid(a->n_kv_heads * (G / p->gq), CU_DIV_UP(a->n, p->qr), p->n_splits);
    CU_LAUNCH((attn_tiled_kernel<HD, NQ, T>), grid, ATT_WARPS * 32, bytes, c, *a, *p);
}

template <int HD, int T>
static void dispatch_nq(const cu_ctx *c, const cu_attn_args *a, const att_plan *p) {
    switch (p->gq * p->qr) {
    case 1: launch_tiled<HD, 1, T>(c, a, p); break;
    case 2: launch_tiled<HD, 2, T>(c, a, p); break;
    case 4: launch_tiled<HD, 4, T>(c, a, p); break;
    default: launch_tiled<HD, 8, T>(c, a, p); break;
    }
}

template <int HD, int MT, int VK, int T>
static void launch_wide(const cu_ctx *c, const cu_attn_args *a, const att_plan *p) {
    int G = a->n_heads / a->n_kv_heads;
    const int bytes = wide_layout<HD, MT, VK>::bytes;
    dim3 grid(a->n_kv_heads * (G / p->gq), CU_DIV_UP(a->n, p->qr), p->n_splits);
    CU_LAUNCH((attn_wide_kernel<HD, MT, VK, T>), grid, WIDE_WARPS * 32, bytes, c, *a, *p);
}

template <int HD, int VK, int T>
static void dispatch_wide(const cu_ctx *c, const cu_attn_args *a, const att_plan *p) {
    if (p->wide == 1) launch_wide<HD, 1, VK, T>(c, a, p);
    else launch_wide<HD, 4, VK, T>(c, a, p);
}

template <int HD, int VK, int T> static void set_wide_limits() {
    cudaFuncSetAttribute(attn_wide_kernel<HD, 1, VK, T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         wide_layout<HD, 1, VK>::bytes);
    cudaFuncSetAttribute(attn_wide_kernel<HD, 4, VK, T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         wide_layout<HD, 4, VK>::bytes);
}

template <int HD, int NQ, int T> static void set_smem_limit() {
    cudaFuncSetAttribute(attn_tiled_kernel<HD, NQ, T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         att_layout<HD, NQ>::bytes);
}

template <int HD, int T> static void set_smem_limits() {
    set_smem_limit<HD, 1, T>();
    set_smem_limit<HD, 2, T>();
    set_smem_limit<HD, 4, T>();
    set_smem_limit<HD, 8, T>();
}

/* Shared memory over 48 KiB must be allowed per kernel, and not while a
 * graph is being captured: once, up front. */
extern "C" void cu_attention_init(void) {
    cudaFuncSetAttribute(attn_mma_kernel<64, CU_F16>, cudaFuncAttributeMaxDynamicSharedMemorySize, mma_layout<64>::bytes);
    cudaFuncSetAttribute(attn_mma_kernel<64, CU_BF16>, cudaFuncAttributeMaxDynamicSharedMemorySize, mma_layout<64>::bytes);
    cudaFuncSetAttribute(attn_mma_kernel<128, CU_F16>, cudaFuncAttributeMaxDynamicSharedMemorySize, mma_layout<128>::bytes);
    cudaFuncSetAttribute(attn_mma_kernel<128, CU_BF16>, cudaFuncAttributeMaxDynamicSharedMemorySize, mma_layout<128>::bytes);
    set_smem_limits<64, CU_F16>();
    set_smem_limits<64, CU_BF16>();
    set_smem_limits<128, CU_F16>();
    set_smem_limits<128, CU_BF16>();
    set_wide_limits<256, 0, CU_F16>();
    set_wide_limits<256, 0, CU_BF16>();
    set_wide_limits<576, 1, CU_F16>();
    set_wide_limits<576, 1, CU_BF16>();
}

extern "C" void cu_attention(const cu_ctx *c, const cu_attn_args *a, int n_sm, void *scratch) {
    att_plan p;
    if (a->n <= 0) return;
    if (make_plan(a, n_sm, &p)) {
        if (a->window > 0 || a->softcap > 0.f) cu_attention_ext(c, a, a->window, a->softcap, NULL);
        else cu_attention_simple(c, a);
        return;
    }
    if (p.n_splits > 1) {
        p.part_acc = (float *)scratch;
        p.part_ml = p.part_acc + (size_t)p.n_splits * a->n * a->n_heads * a->head_dim;
    }
    if (p.wide) {
        if (a->head_dim == 256) {
            if (a->dtype == CU_F16) dispatch_wide<256, 0, CU_F16>(c, a, &p);
            else dispatch_wide<256, 0, CU_BF16>(c, a, &p);
        } else {
            if (a->dtype == CU_F16) dispatch_wide<576, 1, CU_F16>(c, a, &p);
            else dispatch_wide<576, 1, CU_BF16>(c, a, &p);
        }
    } else if (p.mma) {
        int G = a->n_heads / a->n_kv_heads;
        dim3 grid(a->n_kv_heads * (G / p.gq), CU_DIV_UP(a->n, p.qr), p.n_splits);
        if (a->head_dim == 64) {
            if (a->dtype == CU_F16) CU_LAUNCH((attn_mma_kernel<64, CU_F16>), grid, MMA_WARPS * 32, mma_layout<64>::bytes, c, *a, p);
            else CU_LAUNCH((attn_mma_kernel<64, CU_BF16>), grid, MMA_WARPS * 32, mma_layout<64>::bytes, c, *a, p);
        } else {
            if (a->dtype == CU_F16) CU_LAUNCH((attn_mma_kernel<128, CU_F16>), grid, MMA_WARPS * 32, mma_layout<128>::bytes, c, *a, p);
            else CU_LAUNCH((attn_mma_kernel<128, CU_BF16>), grid, MMA_WARPS * 32, mma_layout<128>::bytes, c, *a, p);
        }
    } else if (a->head_dim == 64) {
        if (a->dtype == CU_F16) dispatch_nq<64, CU_F16>(c, a, &p);
        else dispatch_nq<64, CU_BF16>(c, a, &p);
    } else {
        if (a->dtype == CU_F16) dispatch_nq<128, CU_F16>(c, a, &p);
        else dispatch_nq<128, CU_BF16>(c, a, &p);
    }
    if (p.n_splits > 1) {
        dim3 grid(a->n * a->n_heads, CU_DIV_UP(a->head_dim, 32));
        CU_LAUNCH((attn_merge_kernel), grid, MERGE_WARPS * 32, 0, c, *a, p);
    }
}
