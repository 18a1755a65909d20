/*
 * moe.cu - the matmul by expert id on the GPU (cuda_family.h): the sort of
 * the (row, slot) pairs by expert, the activations' rounding for quantized
 * experts, and the kernels for f32/f16/bf16 and quantized expert stacks;
 * and moe_ffn's two fused kernels for decode (the section at the end).
 *
 * One launch prepares (moe_prep_kernel): block 0 groups the pairs by
 * expert on the device and lists the experts some pair chose (used[]), so
 * the ids never go to the host and a decode step stays one graph; the
 * other blocks round the activation rows to int16 codes per 32-element
 * chunk exactly as the CPU backend does (qx_chunk), once per call instead
 * of once per weight row.
 *
 * Then one launch multiplies: block (row tile, j) takes the j-th used
 * expert, so the grid is rows / 8 x min(pairs, experts) and no block
 * exists for an expert nobody chose (a decode step of Qwen3-30B-A3B: 8 of
 * 128 experts, 8 blocks wide instead of 128).  A warp owns one weight row
 * and streams it with 16-byte loads:
 *
 *  - quantized (every GGUF and affine format, and gpt-oss's MXFP4, which
 *    no other op takes): the warp copies the row's bytes 64 chunks (2048 columns)
 *    at a time into its shared memory with 16-byte cp.async over the
 *    16-byte words that hold them (so rows that are not 16-byte aligned,
 *    e.g. q4_0 at 2880 columns = 1620 bytes, take the same path), each
 *    lane decodes its two chunks there (qf_chunk) and multiplies them with
 *    every pair's codes (qdot_chunk: exact integer sums, as the GEMV);
 *  - f32/f16/bf16: each lane reads 16-byte words of the row (2 in flight)
 *    and multiplies them in f32 with every pair's x row.
 *
 * A row is read once per 8 pairs of its expert (decode: once).  Batch
 * invariance: a pair's sum is taken in an order fixed by the weight's
 * shape (lane, chunk, warp butterfly), never by which or how many other
 * pairs share the call, so a token row gets the same bits alone or in a
 * batch.  Every kernel follows the PDL rule of cu_common.cuh.
 */
#include "backend/cuda/cu_common.cuh"
#include "backend/cuda/cuda_family.h"
#include "backend/cuda/moe_sort.cuh"
#include "backend/cuda/qdecode.cuh"

#define MOE_WARPS 8  /* weight rows per block, a warp each */
#define MOE_PAIRS 8  /* pairs per pass over a weight row */
#define MOE_SEG 64   /* chunks of 32 columns per warp pass: two per lane */
#define MOE_SEG16 137 /* 16-byte words of a pass: 64 q8_0 blocks (2176 B) + 16 B of slack */
#define MOE_MIN_BLOCKS 4 /* blocks per SM the registers are sized for (64 each): latency hiding */

/* ---- scratch: order, first, used, activation codes -------------------------------- */

/* Byte offsets of the parts of the scratch: order[pairs], first[E + 1],
 * used[E + 1] (used[0] experts chosen, then their ids), then for quantized
 * experts the codes (64 bytes per chunk of 32 activations) and per chunk
 * (dx, s0, s1) as a float4. */
struct moe_layout {
    size_t first, used, codes, meta, total;
};

__host__ __device__ static inline moe_layout moe_layout_of(int pairs, int E, int64_t code_elems) {
    moe_layout l;
    l.first = sizeof(int32_t) * (size_t)pairs;
    l.used = l.first + sizeof(int32_t) * ((size_t)E + 1);
    l.codes = (l.used + sizeof(int32_t) * ((size_t)E + 1) + 15) & ~(size_t)15;
    l.meta = l.codes + (size_t)(code_elems / 32) * 64;
    l.total = l.meta + (size_t)(code_elems / 32) * 16;
    return l;
}

extern "C" size_t cu_moe_scratch(int pairs, int n_experts, int64_t code_elems) {
    return moe_layout_of(pairs, n_experts, code_elems).total;
}

/* Chunk c of activation row xr (rows of nch chunks, contiguous at x) as
 * int16 codes: 64 bytes at xc[4 ci ..] and (dx, s0, s1) at xm[ci], ci =
 * xr * nch + c, rounded as the CPU does (qx_chunk).  Every lane of the
 * warp calls it (qx_chunk shuffles); lanes past the row store nothing. */
__device__ __forceinline__ void moe_code_chunk(uint4 *xc, float4 *xm, const float *x, int xr, int c,
                                               int nch, int G) {
    const bool valid = c < nch;
    uint32_t xw[16];
    float dx;
    int s0, s1;
    qx_chunk(x + ((size_t)xr * nch + (valid ? c : 0)) * 32, valid, G, xw, dx, s0, s1);
    if (!valid) return;
    const size_t ci = (size_t)xr * nch + c;
#pragma unroll
    for (int i = 0; i < 4; i++)
        xc[4 * ci + i] = make_uint4(xw[4 * i], xw[4 * i + 1], xw[4 * i + 2], xw[4 * i + 3]);
    xm[ci] = make_float4(dx, __int_as_float(s0), __int_as_float(s1), 0.f);
}

/* ---- prepare: sort, used experts, activation codes ------------------------------- */

/* Block 0: the pairs grouped by expert and the experts chosen listed
 * (moe_sort.cuh).  Blocks 1..: one warp per 32 chunks
 * of an activation row (a chunk per lane; an affine group's G chunks on
 * adjacent lanes), rounded as qx_chunk says. */
__global__ void __launch_bounds__(1024)
    moe_prep_kernel(char *scratch, const int32_t *ids, int pairs, int E, const float *x,
                    int x_rows, int cols, int G) {
    extern __shared__ int32_t cnt[]; /* [E] counts, then [E] cursors */
    cu_grid_trigger();
    cu_grid_wait();
    const moe_layout L = moe_layout_of(pairs, E, G ? (int64_t)x_rows * cols : 0);
    if (blockIdx.x > 0) {
        const int nch = cols / 32, per_row = CU_DIV_UP(nch, 32), lane = threadIdx.x & 31;
        const int item = (blockIdx.x - 1) * 32 + (threadIdx.x >> 5);
        if (item >= x_rows * per_row) return; /* the whole warp: qx_chunk shuffles */
        moe_code_chunk((uint4 *)(scratch + L.codes), (float4 *)(scratch + L.meta), x,
                       item / per_row, item % per_row * 32 + lane, nch, G);
        return;
    }
    moe_sort_pairs((int32_t *)scratch, (int32_t *)(scratch + L.first),
                   (int32_t *)(scratch + L.used), NULL, NULL, 0, cnt, ids, pairs, E);
}

extern "C" int cu_moe_prep(const cu_ctx *c, void *scratch, const int32_t *ids, int pairs,
                           int n_experts, const float *x, int x_rows, int cols, int group) {
    if (n_experts < 1 || n_experts > CU_MOE_MAX_EXPERTS) return -1;
    int G = group / 32, blocks = 1;
    if (group) { /* quantized experts: round the activations */
        if (group % 32 || cols % group || (G & (G - 1)) || G > 32 || !cu_aligned16(x)) return -1;
        blocks += (int)CU_DIV_UP((int64_t)x_rows * CU_DIV_UP(cols / 32, 32), (int64_t)32);
    }
    CU_LAUNCH(moe_prep_kernel, blocks, 1024, sizeof(int32_t) * 2 * (size_t)n_experts, c,
              (char *)scratch, ids, pairs, n_experts, x, x_rows, cols, G);
    return 0;
}

/* ---- the pairs of a block's expert ------------------------------------------------ */

/* The input rows pairs p0 .. p0 + np - 1 of the expert's list read (row t,
 * slot j: x row t * x_slots + j, or t); the pairs themselves are read
 * again at the store (registers). */
__device__ __forceinline__ void moe_xrows(int (&xrow)[MOE_PAIRS], const int32_t *order, int p0,
                                          int np, int k, int x_slots) {
#pragma unroll
    for (int i = 0; i < MOE_PAIRS; i++) {
        int pair = order[p0 + (i < np ? i : 0)], t = pair / k, slot = pair % k;
        xrow[i] = t * x_slots + (x_slots > 1 ? slot : 0);
    }
}

/* Each pair's sum over the warp (a fixed butterfly), stored by lane 0. */
__device__ __forceinline__ void moe_store(float *y, const float (&acc)[MOE_PAIRS],
                                          const int32_t *order, int p0, int np, int64_t rows,
                                          int64_t r) {
#pragma unroll
    for (int i = 0; i < MOE_PAIRS; i++) {
        float v = cu_warp_sum(acc[i]);
        if (i < np && (threadIdx.x & 31) == 0) y[(size_t)order[p0 + i] * rows + r] = v;
    }
}

/* ---- f32 / f16 / bf16 experts ----------------------------------------------------- */

#define MOE_DEPTH 2 /* 16-byte words in flight per lane (more spills at 64 registers) */

/* VEC: every row 16-byte aligned and x rows too (decided by the launcher
 * from the shape and the pointers, never from the pairs), else element
 * loads. */
template <int T, bool VEC>
__global__ void __launch_bounds__(MOE_WARPS * 32, MOE_MIN_BLOCKS)
    moe_matmul_kernel(float *y, const float *x, const void *w, size_t expert_stride, int rows,
                      int cols, const char *scratch, int pairs, int E, int k, int x_slots) {
    cu_grid_trigger();
    cu_grid_wait();
    const moe_layout L = moe_layout_of(pairs, E, 0);
    const int32_t *order = (const int32_t *)scratch, *first = (const int32_t *)(scratch + L.first);
    const int32_t *used = (const int32_t *)(scratch + L.used);
    if ((int)blockIdx.y >= used[0]) return;
    const int e = used[1 + blockIdx.y], lo = first[e], hi = first[e + 1];
    const int r = blockIdx.x * MOE_WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (r >= rows) return;
    const size_t esz = T == CU_F32 ? 4 : 2;
    const char *wr = (const char *)w + (size_t)e * expert_stride + (size_t)r * cols * esz;
    const int PER = cu_chunk<T>::n, nw = cols / PER;
    for (int p0 = lo; p0 < hi; p0 += MOE_PAIRS) {
        const int np = min(MOE_PAIRS, hi - p0);
        int xrow[MOE_PAIRS];
        float acc[MOE_PAIRS];
        moe_xrows(xrow, order, p0, np, k, x_slots);
#pragma unroll
        for (int i = 0; i < MOE_PAIRS; i++) acc[i] = 0.f;
        if (VEC) {
            const uint4 *wp = (const uint4 *)wr;
            for (int w0 = lane; w0 < nw; w0 += 32 * MOE_DEPTH) {
                uint4 b[MOE_DEPTH];
#pragma unroll
                for (int d = 0; d < MOE_DEPTH; d++)
                    if (w0 + 32 * d < nw) b[d] = cu_ld_stream(wp + w0 + 32 * d);
#pragma unroll
                for (int d = 0; d < MOE_DEPTH; d++) {
                    const int wi = w0 + 32 * d;
                    if (wi >= nw) break;
                    float f[8];
                    cu_unpack<T>(b[d], f);
#pragma unroll
                    for (int i = 0; i < MOE_PAIRS; i++) {
                        if (i >= np) break;
                        const float4 *xp = (const float4 *)(x + (size_t)xrow[i] * cols) + wi * PER / 4;
#pragma unroll
                        for (int q = 0; q < PER / 4; q++) {
                            float4 v = __ldg(xp + q);
                            acc[i] = fmaf(f[4 * q], v.x, acc[i]);
                            acc[i] = fmaf(f[4 * q + 1], v.y, acc[i]);
                            acc[i] = fmaf(f[4 * q + 2], v.z, acc[i]);
                            acc[i] = fmaf(f[4 * q + 3], v.w, acc[i]);
                        }
                    }
                }
            }
        } else {
            for (int c = lane; c < cols; c += 32) {
                float wv = cu_load_elem<T>(wr, c);
#pragma unroll
                for (int i = 0; i < MOE_PAIRS; i++)
                    if (i < np) acc[i] = fmaf(wv, x[(size_t)xrow[i] * cols + c], acc[i]);
            }
        }
        moe_store(y, acc, order, p0, np, rows, r);
    }
}

template <int T>
static void launch_matmul(const cu_ctx *c, dim3 grid, bool vec, float *y, const float *x,
                          const void *w, size_t stride, int rows, int cols, const char *s,
                          int pairs, int E, int k, int x_slots) {
    if (vec)
        CU_LAUNCH((moe_matmul_kernel<T, true>), grid, MOE_WARPS * 32, 0, c, y, x, w, stride, rows,
                  cols, s, pairs, E, k, x_slots);
    else
        CU_LAUNCH((moe_matmul_kernel<T, false>), grid, MOE_WARPS * 32, 0, c, y, x, w, stride, rows,
                  cols, s, pairs, E, k, x_slots);
}

extern "C" int cu_matmul_id(const cu_ctx *c, float *y, const float *x, const void *w, int wtype,
                            size_t expert_stride, int rows, int cols, int n_experts,
                            const void *scratch, int pairs, int k, int x_slots) {
    if (n_experts < 1 || n_experts > CU_MOE_MAX_EXPERTS || rows < 1 || cols < 1) return -1;
    if (wtype != CU_F32 && wtype != CU_F16 && wtype != CU_BF16) return -1;
    if (pairs <= 0) return 0;
    const size_t esz = wtype == CU_F32 ? 4 : 2;
    const bool vec = cu_aligned16(w) && expert_stride % 16 == 0 && (size_t)cols * esz % 16 == 0 &&
                     cu_aligned16(x);
    dim3 grid(CU_DIV_UP(rows, MOE_WARPS), pairs < n_experts ? pairs : n_experts);
    const char *s = (const char *)scratch;
    if (wtype == CU_F32)
        launch_matmul<CU_F32>(c, grid, vec, y, x, w, expert_stride, rows, cols, s, pairs, n_experts, k, x_slots);
    else if (wtype == CU_F16)
        launch_matmul<CU_F16>(c, grid, vec, y, x, w, expert_stride, rows, cols, s, pairs, n_experts, k, x_slots);
    else
        launch_matmul<CU_BF16>(c, grid, vec, y, x, w, expert_stride, rows, cols, s, pairs, n_experts, k, x_slots);
    return 0;
}

/* ---- quantized experts ------------------------------------------------------------ */

/* A warp pass (MOE_SEG chunks) must fit the warp's buffer with the slack
 * of a start up to 14 bytes past a 16-byte word: q8_0 is the largest. */
static_assert(CU_DIV_UP(MOE_SEG * 34 + 14, 16) <= MOE_SEG16, "q8_0 pass");

template <int F>
__global__ void __launch_bounds__(MOE_WARPS * 32, MOE_MIN_BLOCKS)
    moe_qmatmul_kernel(float *y, cu_qweight w, size_t expert_stride, const char *scratch,
                       int pairs, int E, int k, int x_slots, int x_rows) {
    __shared__ uint4 seg[MOE_WARPS][MOE_SEG16];
    cu_grid_trigger();
    cu_grid_wait();
    const int64_t cols = w.cols;
    const moe_layout L = moe_layout_of(pairs, E, (int64_t)x_rows * cols);
    const int32_t *order = (const int32_t *)scratch, *first = (const int32_t *)(scratch + L.first);
    const int32_t *used = (const int32_t *)(scratch + L.used);
    if ((int)blockIdx.y >= used[0]) return;
    const int e = used[1 + blockIdx.y], lo = first[e], hi = first[e + 1];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t r = (int64_t)blockIdx.x * MOE_WARPS + warp;
    if (r >= w.rows) return; /* the whole warp; no block barrier below */
    if (F >= CU_AFF4 && F <= CU_AFFN) { /* this expert's scales and biases */
        size_t sb = (size_t)w.rows * (size_t)(cols / w.group) * (w.scale_type == CU_F32 ? 4 : 2);
        w.scales = (const char *)w.scales + (size_t)e * sb;
        w.biases = (const char *)w.biases + (size_t)e * sb;
    }
    const uint4 *xc = (const uint4 *)(scratch + L.codes);
    const float4 *xm = (const float4 *)(scratch + L.meta);
    const int nch = (int)(cols / 32), nseg = CU_DIV_UP(nch, MOE_SEG);
    const uint8_t *rp = (const uint8_t *)w.data + (size_t)e * expert_stride +
                        (size_t)r * (size_t)qf_bytes(F, w.bits, cols);
    /* codes stored as u + 128: back to signed bytes for dp2a */
    const bool WIDE = F == CU_Q8_0 || F == CU_AFF8 || F == CU_MXFP4;
    qchunk q[2];
    for (int p0 = lo; p0 < hi; p0 += MOE_PAIRS) {
        const int np = min(MOE_PAIRS, hi - p0);
        int xrow[MOE_PAIRS];
        float acc[MOE_PAIRS];
        moe_xrows(xrow, order, p0, np, k, x_slots);
#pragma unroll
        for (int i = 0; i < MOE_PAIRS; i++) acc[i] = 0.f;
        for (int s = 0; s < nseg; s++) {
            const int c0 = s * MOE_SEG, nc = min(MOE_SEG, nch - c0);
            if (p0 == lo || nseg > 1) { /* one pass per row: decoded chunks stay in registers */
                const uint8_t *sb = rp + qf_bytes(F, w.bits, (int64_t)c0 * 32);
                const uintptr_t a0 = (uintptr_t)sb & ~(uintptr_t)15;
                const uintptr_t a1 = ((uintptr_t)sb + (uintptr_t)qf_bytes(F, w.bits, (int64_t)nc * 32) + 15) & ~(uintptr_t)15;
                const int n16 = (int)((a1 - a0) / 16);
                __syncwarp(); /* every lane is done with the last pass's bytes */
                for (int i = lane; i < n16; i += 32) cp_async16(&seg[warp][i], (const uint4 *)a0 + i);
                cp_async_commit();
                cp_async_wait<0>();
                __syncwarp();
                const uint8_t *sp = (const uint8_t *)seg[warp] + (sb - (const uint8_t *)a0);
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int cc = lane + 32 * h;
                    if (cc >= nc) continue;
                    qf_chunk<F>(q[h], sp, cc, c0 + cc, w, r);
                    if (WIDE) {
#pragma unroll
                        for (int i = 0; i < 8; i++) q[h].u[i] ^= 0x80808080u;
                        q[h].add[0] += 128.f * q[h].mul[0], q[h].add[1] += 128.f * q[h].mul[1];
                    }
                }
            }
#pragma unroll
            for (int i = 0; i < MOE_PAIRS; i++) {
                if (i >= np) break;
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int cc = lane + 32 * h;
                    if (cc >= nc) continue;
                    const size_t ci = (size_t)xrow[i] * nch + c0 + cc;
                    const uint4 *cp = xc + 4 * ci;
                    uint4 a0 = __ldg(cp), a1 = __ldg(cp + 1), a2 = __ldg(cp + 2), a3 = __ldg(cp + 3);
                    const uint32_t xw[16] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w,
                                             a2.x, a2.y, a2.z, a2.w, a3.x, a3.y, a3.z, a3.w};
                    float4 m = __ldg(xm + ci);
                    acc[i] = fmaf(m.x, qdot_chunk(q[h], xw, __float_as_int(m.y), __float_as_int(m.z)), acc[i]);
                }
            }
        }
        moe_store(y, acc, order, p0, np, w.rows, r);
    }
}

/* cu_qweight_ok, and MXFP4 (blocks of 32 columns) besides: matmul_id is
 * the one op that takes it. */
extern "C" int cu_moe_qweight_ok(const cu_qweight *w) {
    if (w->fmt == CU_MXFP4) return w->rows >= 1 && w->cols >= 32 && w->cols % 32 == 0 && w->data;
    return cu_qweight_ok(w);
}

extern "C" int cu_qmatmul_id(const cu_ctx *c, float *y, const cu_qweight *w, size_t expert_stride,
                             int n_experts, const void *scratch, int pairs, int k, int x_slots) {
    /* the 16-byte loads of these formats need every expert 16-byte aligned */
    bool wide = w->fmt == CU_Q4_K || w->fmt == CU_Q5_K || w->fmt == CU_AFF4 || w->fmt == CU_AFF8;
    int align = wide ? 16 : w->fmt == CU_MXFP4 ? 1 : 2; /* MXFP4 is read bytewise */
    if (!cu_moe_qweight_ok(w) || n_experts < 1 || n_experts > CU_MOE_MAX_EXPERTS ||
        expert_stride % align || w->rows > 0x7fffffffLL * MOE_WARPS)
        return -1;
    if (pairs <= 0) return 0;
    const cu_qweight ww = *w;
    const char *s = (const char *)scratch;
    const int x_rows = pairs / k * x_slots;
    dim3 grid((unsigned)CU_DIV_UP(w->rows, (int64_t)MOE_WARPS), pairs < n_experts ? pairs : n_experts);
#define QF_ID(F) CU_LAUNCH((moe_qmatmul_kernel<F>), grid, MOE_WARPS * 32, 0, c, y, ww, expert_stride, s, pairs, n_experts, k, x_slots, x_rows); break
    switch (w->fmt) {
    case CU_Q8_0: QF_ID(CU_Q8_0);
    case CU_Q4_0: QF_ID(CU_Q4_0);
    case CU_Q4_K: QF_ID(CU_Q4_K);
    case CU_Q5_K: QF_ID(CU_Q5_K);
    case CU_Q6_K: QF_ID(CU_Q6_K);
    case CU_AFF4: QF_ID(CU_AFF4);
    case CU_AFF8: QF_ID(CU_AFF8);
    case CU_AFFN: QF_ID(CU_AFFN);
    case CU_MXFP4: QF_ID(CU_MXFP4);
    default: return -1;
    }
#undef QF_ID
    return 0;
}

/* ---- moe_ffn: the routed FFN of a decode step in two launches ----------------------
 *
 * The op sequence moe_route, matmul_id (gate, up), add_id, activation,
 * matmul_id (down), add_id, moe_combine costs eleven launches, each of a
 * few microseconds of work at one token.  For up to PETREL_CUDA_MOE_FUSED
 * token rows and quantized experts it is two:
 *
 *  - up (grid: row tiles x (token, slot) pairs): each block routes its
 *    token itself (softmax, top k, renormalization: no launch, no host),
 *    so it knows its expert before anything else; each warp then copies
 *    its RPW gate rows and RPW up rows whole into its shared memory with
 *    16-byte cp.async (all in flight at once), the block rounds the token's
 *    activations to int16 codes meanwhile, and each warp takes its rows'
 *    products, adds the experts' biases and applies the activation:
 *    act[t][j][r] = act(gate, up).
 *  - down (grid: row tiles x tokens): a warp owns output row r of its
 *    token and copies row r of each of the k chosen experts (k rows in
 *    flight), the block rounds the k activation rows to codes, and the
 *    warp sums w_j (row · act_j + bias_j) over j = 0 .. k-1 in that order:
 *    the weighted combine needs no atomics and no other launch.
 *
 * Every number is computed as the op sequence computes it on this device:
 * the routing as moe_route_kernel (the same max, sum and slot order), each
 * product with moe_qmatmul_kernel's chunk order, lane sums and butterfly,
 * the biases as single adds, the activations by cu_common.cuh's functions
 * and the combine by fmaf in slot order, as moe_combine_kernel.  So a
 * token row gets the same bits through either path, alone or in a batch
 * (test_cuda_ops test_moe_ffn compares them bit for bit): batch invariance
 * holds across PETREL_CUDA_MOE_FUSED's threshold.
 */

#define FFN_WARPS 8
#define FFN_RPW_MAX 4              /* gate rows per warp (each with its up row), at most */
#define FFN_SMEM_2ROWS (100 << 10) /* fewer rows a warp past this: two blocks an SM */

/* 16-byte words of shared memory a staged row of `bytes` needs: its
 * aligned words, one more when it starts inside a word. */
static inline __host__ __device__ int ffn_words(int64_t bytes) {
    return (int)((bytes + 15) / 16) + 1;
}

/* Shared memory (in 16-byte words) of the up and down kernels: the
 * activation codes (64 bytes and a float4 of scales per chunk), the up
 * kernel's routing row and slots, and the warps' rows. */
static inline __host__ __device__ int ffn_up_words(int nch, int E, int rpw, int words) {
    return 5 * nch + (CU_DIV_UP(E, 4) * 4 + 32) / 4 + FFN_WARPS * rpw * 2 * words;
}
static inline __host__ __device__ int ffn_down_words(int nch, int k, int words) {
    return 5 * k * nch + FFN_WARPS * k * words;
}

/* The warp copies a whole row (the 16-byte words that hold it) to dst;
 * the row starts ((uintptr_t)row & 15) bytes into dst. */
__device__ __forceinline__ void ffn_stage(uint4 *dst, const uint8_t *row, int64_t bytes, int lane) {
    const uintptr_t a0 = (uintptr_t)row & ~(uintptr_t)15;
    const int n16 = (int)((((uintptr_t)row + (uintptr_t)bytes + 15) & ~(uintptr_t)15) - a0) / 16;
    for (int i = lane; i < n16; i += 32) cp_async16(dst + i, (const uint4 *)a0 + i);
}

/* rows x rows of nch chunks at x (contiguous) as int16 codes into shared
 * memory, as moe_prep_kernel rounds them: a warp per 32 chunks of a row. */
__device__ __forceinline__ void ffn_codes(uint4 *xc, float4 *xm, const float *x, int rows, int nch,
                                          int G, int warp, int lane) {
    const int per_row = CU_DIV_UP(nch, 32);
    for (int item = warp; item < rows * per_row; item += FFN_WARPS) {
        moe_code_chunk(xc, xm, x, item / per_row, item % per_row * 32 + lane, nch, G);
    }
}

/* A staged row (sp: its first byte) times one activation row's codes, in
 * moe_qmatmul_kernel's order: per pass of MOE_SEG chunks, chunk lane then
 * lane + 32, then the warp's butterfly.  Every lane gets the sum. */
template <int F>
__device__ __forceinline__ float ffn_dot(const uint8_t *sp, const cu_qweight &w, int64_t r, int nch,
                                         const uint4 *xc, const float4 *xm, int lane) {
    const bool WIDE = F == CU_Q8_0 || F == CU_AFF8 || F == CU_MXFP4;
    float acc = 0.f;
    for (int c0 = 0; c0 < nch; c0 += MOE_SEG) {
        const int nc = min(MOE_SEG, nch - c0);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int cc = lane + 32 * h;
            if (cc >= nc) continue;
            qchunk q;
            qf_chunk<F>(q, sp, c0 + cc, c0 + cc, w, r);
            if (WIDE) {
#pragma unroll
                for (int i = 0; i < 8; i++) q.u[i] ^= 0x80808080u;
                q.add[0] += 128.f * q.mul[0], q.add[1] += 128.f * q.mul[1];
            }
            const uint4 *cp = xc + 4 * (c0 + cc);
            const uint4 a0 = cp[0], a1 = cp[1], a2 = cp[2], a3 = cp[3];
            const uint32_t xw[16] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w,
                                     a2.x, a2.y, a2.z, a2.w, a3.x, a3.y, a3.z, a3.w};
            const float4 m = xm[c0 + cc];
            acc = fmaf(m.x, qdot_chunk(q, xw, __float_as_int(m.y), __float_as_int(m.z)), acc);
        }
    }
    return cu_warp_sum(acc);
}

__device__ __forceinline__ float ffn_act(const cu_moe_ffn_args &a, float g, float u) {
    if (a.act_kind == CU_MOE_SWIGLU_OAI) return cu_swiglu_oai(g, u, a.alpha, a.limit);
    if (a.act_kind == CU_MOE_GEGLU) return cu_gelu_tanh(g) * u;
    return cu_silu_mul(g, u);
}

/* Token t's routing into the block's shared memory: sel[s] = the expert
 * of slot s, by rank (larger logit first, the lower expert among equals:
 * moe_route_kernel's order), one thread per expert. */
__device__ __forceinline__ void ffn_route(float *lg, int *sel, const float *logits, int E, int k) {
    for (int e = threadIdx.x; e < E; e += blockDim.x) lg[e] = logits[e];
    if (threadIdx.x < 32) sel[threadIdx.x] = 0; /* NaN logits can leave a slot unranked */
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        const float v = lg[e];
        int rank = 0;
        for (int i = 0; i < E; i++) {
            const float o = lg[i];
            rank += o > v || (o == v && i < e);
        }
        if (rank < k) sel[rank] = e;
    }
    __syncthreads();
}

/* Slot j's routing weight, as moe_route_kernel computes it (one warp). */
__device__ __forceinline__ float ffn_weight(const float *lg, const int *sel, int E, int k, int j,
                                            int renorm, int lane) {
    const float2 st = cu_warp_softmax_stats(lg, E, lane);
    const float mx = st.x, sum = st.y;
    float kept = 0.f, wj = 0.f;
    for (int s = 0; s < k; s++) {
        float w = expf(lg[sel[s]] - mx) / sum;
        kept += w;
        if (s == j) wj = w;
    }
    return renorm ? wj / kept : wj;
}

template <int F>
__global__ void __launch_bounds__(FFN_WARPS * 32, 2)
    moe_ffn_up_kernel(cu_moe_ffn_args a, int rpw, int words) {
    extern __shared__ uint4 sm[];
    cu_grid_trigger();
    cu_grid_wait();
    const int nch = (int)(a.gate.cols / 32), E = a.n_experts, f = (int)a.gate.rows;
    const int p = blockIdx.y, t = p / a.k, j = p % a.k;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    uint4 *xc = sm;
    float4 *xm = (float4 *)(sm + 4 * nch);
    float *lg = (float *)(sm + 5 * nch);
    int *sel = (int *)(lg + CU_DIV_UP(E, 4) * 4);
    uint4 *mine = sm + ffn_up_words(nch, E, 0, 0) + warp * rpw * 2 * words;

    ffn_route(lg, sel, a.logits + (size_t)t * E, E, a.k);
    const int e = min(max(sel[j], 0), E - 1);
    const cu_qweight wg = qf_expert<F>(a.gate, a.gate_stride, e);
    const cu_qweight wu = qf_expert<F>(a.up, a.up_stride, e);
    const int64_t rb = qf_bytes(F, wg.bits, wg.cols);
    const uint8_t *gr = (const uint8_t *)wg.data, *ur = (const uint8_t *)wu.data;
    const int r0 = blockIdx.x * FFN_WARPS * rpw + warp;
    for (int i = 0; i < rpw; i++) {
        const int r = r0 + i * FFN_WARPS;
        if (r >= f) break;
        ffn_stage(mine + 2 * i * words, gr + r * rb, rb, lane);
        ffn_stage(mine + (2 * i + 1) * words, ur + r * rb, rb, lane);
    }
    cp_async_commit();
    if (blockIdx.x == 0 && warp == 0) {
        float w = ffn_weight(lg, sel, E, a.k, j, a.renorm, lane);
        if (lane == 0) a.ids[p] = e, a.weights[p] = w;
    }
    ffn_codes(xc, xm, a.x + (size_t)t * a.gate.cols, 1, nch, a.gate.group ? a.gate.group / 32 : 1,
              warp, lane);
    __syncthreads();
    cp_async_wait<0>();
    __syncwarp();
    for (int i = 0; i < rpw; i++) {
        const int r = r0 + i * FFN_WARPS;
        if (r >= f) break;
        /* each row where ffn_stage put it: as far into its words as into memory's */
        const uint8_t *gs = (const uint8_t *)(mine + 2 * i * words) + ((uintptr_t)(gr + r * rb) & 15);
        const uint8_t *us =
            (const uint8_t *)(mine + (2 * i + 1) * words) + ((uintptr_t)(ur + r * rb) & 15);
        float g = ffn_dot<F>(gs, wg, r, nch, xc, xm, lane);
        float u = ffn_dot<F>(us, wu, r, nch, xc, xm, lane);
        if (a.gate_bias) g = g + a.gate_bias[(size_t)e * f + r];
        if (a.up_bias) u = u + a.up_bias[(size_t)e * f + r];
        if (lane == 0) a.act[(size_t)p * f + r] = ffn_act(a, g, u);
    }
}

template <int F>
__global__ void __launch_bounds__(FFN_WARPS * 32, 2)
    moe_ffn_down_kernel(cu_moe_ffn_args a, int words) {
    extern __shared__ uint4 sm[];
    cu_grid_trigger();
    cu_grid_wait();
    const int k = a.k, nch = (int)(a.down.cols / 32), d = (int)a.down.rows, t = blockIdx.y;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int r = blockIdx.x * FFN_WARPS + warp;
    uint4 *xc = sm;
    float4 *xm = (float4 *)(sm + 4 * k * nch);
    uint4 *mine = sm + 5 * k * nch + warp * k * words;
    const int32_t *ids = a.ids + (size_t)t * k;
    const int64_t rb = qf_bytes(F, a.down.bits, a.down.cols);
    if (r < d)
        for (int j = 0; j < k; j++) {
            const cu_qweight w = qf_expert<F>(a.down, a.down_stride, ids[j]);
            ffn_stage(mine + j * words, (const uint8_t *)w.data + r * rb, rb, lane);
        }
    cp_async_commit();
    ffn_codes(xc, xm, a.act + (size_t)t * k * a.down.cols, k, nch,
              a.down.group ? a.down.group / 32 : 1, warp, lane);
    __syncthreads();
    cp_async_wait<0>();
    __syncwarp();
    if (r >= d) return;
    float out = 0.f;
    for (int j = 0; j < k; j++) {
        const int e = ids[j];
        const cu_qweight w = qf_expert<F>(a.down, a.down_stride, e);
        const uint8_t *rs =
            (const uint8_t *)(mine + j * words) + (((uintptr_t)w.data + r * rb) & 15);
        float v = ffn_dot<F>(rs, w, r, nch, xc + 4 * j * nch, xm + j * nch, lane);
        if (a.down_bias) v = v + a.down_bias[(size_t)e * d + r];
        out = fmaf(a.weights[(size_t)t * k + j], v, out);
    }
    if (lane == 0) a.y[(size_t)t * d + r] = out;
}

/* ---- moe_ffn, session 11: the same numbers, shorter chains ---------------------------
 *
 * The kernels above run, in each block, one chain after another: routing
 * (one thread per expert comparing its logit with all E), then one round
 * trip to memory, then 2 RPW products (up) or k products (down) one after
 * another, each decoding its chunks, reloading the activation codes and
 * ending in its own 5-step butterfly; and the down kernel waits for the up
 * kernel before it even knows which rows to load.  These two compute every
 * value in the same order (so the bits stay those of the op sequence):
 *
 *  - routing: T = 1, 2, 4 or 8 threads per expert (as many as the block
 *    has for E) count the logits ranked above it over 1/T of the E logits
 *    each (float4 reads where the spans allow) and add their counts with
 *    shuffles: integer sums, the same ranks;
 *  - shared memory without bank conflicts (ncu, session 11: 58-61 % of the
 *    kernels' shared wavefronts above were repeats): q4_0 chunks read as
 *    two aligned 16-byte words (ffn_q4_0), activation codes stored by
 *    quarters (ffn_codes_q);
 *  - products: a lane walks its chunks (lane, lane + 32, ... : the order of
 *    moe_qmatmul_kernel's passes) once, loads the activation codes of a
 *    chunk once for all the warp's rows (up: 2 RPW rows, unrolled), and
 *    keeps a sum per row; the butterflies of all rows then run interleaved;
 *  - down routes its token itself from the logits, before its grid wait:
 *    the up kernel triggers its dependents only after its own wait, so when
 *    a down block runs, the router's grid has completed (its logits are in
 *    L2, read with ld.global.cg past a stale L1).  The down kernel's weight
 *    rows (constants) and routing weights are then fetched while the up
 *    kernel runs; only the activations wait for it.
 */

/* Token t's routing as ffn_route computes it (the same ranks), by T
 * threads per expert; blockDim.x a multiple of 32. */
template <bool CG>
__device__ __forceinline__ void ffn_route2(float *lg, int *sel, const float *logits, int E, int k) {
    for (int e = threadIdx.x; e < E; e += blockDim.x) lg[e] = CG ? __ldcg(logits + e) : logits[e];
    if (threadIdx.x < 32) sel[threadIdx.x] = 0; /* NaN logits can leave a slot unranked */
    __syncthreads();
    int T = 8; /* threads per expert: a power of two, so a group is within a warp */
    while (T > 1 && E * T > (int)blockDim.x) T >>= 1;
    const int span = CU_DIV_UP(E, T);
    const bool vec = span % 4 == 0 && E % span == 0; /* float4 reads of whole spans */
    for (int base = 0; base < E * T; base += blockDim.x) { /* uniform trip count: shuffles */
        const int idx = base + threadIdx.x, e = idx / T, part = idx % T;
        int rank = 0;
        if (e < E) {
            const float v = lg[e];
            const int i0 = part * span, i1 = min(E, i0 + span);
            if (vec) {
                for (int i = i0; i < i1; i += 4) {
                    const float4 o = *(const float4 *)(lg + i);
                    rank += (o.x > v || (o.x == v && i < e)) + (o.y > v || (o.y == v && i + 1 < e)) +
                            (o.z > v || (o.z == v && i + 2 < e)) + (o.w > v || (o.w == v && i + 3 < e));
                }
            } else {
                for (int i = i0; i < i1; i++) {
                    const float o = lg[i];
                    rank += o > v || (o == v && i < e);
                }
            }
        }
        for (int s = 1; s < T; s <<= 1) rank += __shfl_xor_sync(0xffffffffu, rank, s);
        if (e < E && part == 0 && rank < k) sel[rank] = e;
    }
    __syncthreads();
}

/* Every slot's weight into wts[0 .. k-1], each as ffn_weight computes it
 * (the same max, sum and kept sum; one warp). */
__device__ __forceinline__ void ffn_weights(float *wts, const float *lg, const int *sel, int E,
                                            int k, int renorm, int lane) {
    const float2 st = cu_warp_softmax_stats(lg, E, lane);
    const float mx = st.x, sum = st.y;
    float kept = 0.f;
    for (int s = 0; s < k; s++) kept += expf(lg[sel[s]] - mx) / sum;
    for (int s = lane; s < k; s += 32) {
        const float w = expf(lg[sel[s]] - mx) / sum;
        wts[s] = renorm ? w / kept : w;
    }
}

/* q4_0 chunk c of a row staged `off` bytes into the 16-byte words at w16:
 * the qchunk qf_chunk<CU_Q4_0> makes, read as the two aligned words that
 * hold the 18-byte block (it starts at an even byte, at most 14, of the
 * first).  A warp's lanes read consecutive words, each bank once per
 * quarter warp; qf_chunk's nine 2-byte reads at an 18-byte lane stride hit
 * banks 4 to 5 times each (ncu, session 11: 58 % of the up kernel's shared
 * wavefronts were such repeats). */
__device__ __forceinline__ void ffn_q4_0(qchunk &q, const uint4 *w16, int off, int c) {
    const int B = off + 18 * c, o = B & 15;
    const uint4 a = w16[B >> 4], b = w16[(B >> 4) + 1];
    uint32_t w[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
    if (o & 8) /* the block from word o >> 2 on, in w[0 .. 4] */
#pragma unroll
        for (int i = 0; i < 6; i++) w[i] = w[i + 2];
    if (o & 4)
#pragma unroll
        for (int i = 0; i < 5; i++) w[i] = w[i + 1];
    uint32_t d16, qs[4];
    if (o & 2) {
        d16 = w[0] >> 16;
#pragma unroll
        for (int i = 0; i < 4; i++) qs[i] = w[i + 1];
    } else {
        d16 = w[0] & 0xffffu;
#pragma unroll
        for (int i = 0; i < 4; i++) qs[i] = __funnelshift_r(w[i], w[i + 1], 16);
    }
    const float d = h2f(d16);
#pragma unroll
    for (int i = 0; i < 4; i++) q.u[i] = qs[i] & 0x0F0F0F0Fu, q.u[i + 4] = (qs[i] >> 4) & 0x0F0F0F0Fu;
    q.mul[0] = q.mul[1] = d, q.add[0] = q.add[1] = -8.f * d;
}

/* Chunk cc of a row staged `off` bytes into w16 times the activation
 * codes xw/xm of that chunk, added to acc as ffn_dot adds it. */
template <int F>
__device__ __forceinline__ float ffn_chunk(float acc, const uint4 *w16, int off, const cu_qweight &w,
                                           int64_t r, int cc, const uint32_t (&xw)[16],
                                           const float4 &m) {
    const bool WIDE = F == CU_Q8_0 || F == CU_AFF8 || F == CU_MXFP4;
    qchunk q;
    if (F == CU_Q4_0)
        ffn_q4_0(q, w16, off, cc);
    else
        qf_chunk<F>(q, (const uint8_t *)w16 + off, cc, cc, w, r);
    if (WIDE) {
#pragma unroll
        for (int i = 0; i < 8; i++) q.u[i] ^= 0x80808080u;
        q.add[0] += 128.f * q.mul[0], q.add[1] += 128.f * q.mul[1];
    }
    return fmaf(m.x, qdot_chunk(q, xw, __float_as_int(m.y), __float_as_int(m.z)), acc);
}

/* rows x rows of nch chunks at x as int16 codes, as ffn_codes rounds them,
 * stored by quarters: the 16-byte quarter i of chunk ci at xc[i n + ci]
 * (n = rows nch), so lanes reading consecutive chunks read consecutive
 * words (ffn_codes' 64-byte stride, moe_prep's layout, hits banks 4
 * times).  Items go to warps from `first` on (mod FFN_WARPS). */
__device__ __forceinline__ void ffn_codes_q(uint4 *xc, float4 *xm, const float *x, int rows,
                                            int nch, int G, int first, int warp, int lane) {
    const int per_row = CU_DIV_UP(nch, 32), n = rows * nch;
    for (int item = (warp - first + FFN_WARPS) % FFN_WARPS; item < rows * per_row;
         item += FFN_WARPS) {
        const int xr = item / per_row, c = item % per_row * 32 + lane;
        const bool valid = c < nch;
        uint32_t xw[16];
        float dx;
        int s0, s1;
        qx_chunk(x + ((size_t)xr * nch + (valid ? c : 0)) * 32, valid, G, xw, dx, s0, s1);
        if (!valid) continue;
        const int ci = xr * nch + c;
#pragma unroll
        for (int i = 0; i < 4; i++)
            xc[i * n + ci] = make_uint4(xw[4 * i], xw[4 * i + 1], xw[4 * i + 2], xw[4 * i + 3]);
        xm[ci] = make_float4(dx, __int_as_float(s0), __int_as_float(s1), 0.f);
    }
}

/* Chunk ci's codes from ffn_codes_q's layout (n chunks in all). */
__device__ __forceinline__ void ffn_load_codes(uint32_t (&xw)[16], float4 &m, const uint4 *xc,
                                               const float4 *xm, int ci, int n) {
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const uint4 a = xc[i * n + ci];
        xw[4 * i] = a.x, xw[4 * i + 1] = a.y, xw[4 * i + 2] = a.z, xw[4 * i + 3] = a.w;
    }
    m = xm[ci];
}

/* Shared memory (16-byte words) of the routing area: E logits, k slots'
 * experts and weights (32 each). */
static inline __host__ __device__ int ffn_route_words(int E) {
    return (CU_DIV_UP(E, 4) * 4 + 64) / 4;
}

/* Blocks an SM the registers are sized for: 4 (64 registers) lets the
 * down kernel's blocks in beside three of the up kernel's (PDL overlap);
 * the affine decoders would spill there. */
#define FFN_MIN_BLOCKS(F) ((F) >= CU_AFF4 && (F) <= CU_AFFN ? 2 : 4)

template <int F, int RPW>
__global__ void __launch_bounds__(FFN_WARPS * 32, FFN_MIN_BLOCKS(F))
    moe_ffn_up2_kernel(cu_moe_ffn_args a, int words) {
    extern __shared__ uint4 sm[];
    cu_grid_wait();
    cu_grid_trigger(); /* after the wait: the down kernel reads the logits before its own */
    const int nch = (int)(a.gate.cols / 32), E = a.n_experts, f = (int)a.gate.rows;
    const int p = blockIdx.y, t = p / a.k, j = p % a.k;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    uint4 *xc = sm;
    float4 *xm = (float4 *)(sm + 4 * nch);
    float *lg = (float *)(sm + 5 * nch);
    int *sel = (int *)(lg + CU_DIV_UP(E, 4) * 4);
    uint4 *mine = sm + 5 * nch + ffn_route_words(E) + warp * RPW * 2 * words;

    /* the activation codes first, by the last warps (2 of 8 at 2048
     * columns), while the first ones load the logits: routing waits on
     * both (its first barrier), so their two trips to memory overlap */
    ffn_codes_q(xc, xm, a.x + (size_t)t * a.gate.cols, 1, nch,
                a.gate.group ? a.gate.group / 32 : 1,
                FFN_WARPS - min(FFN_WARPS, CU_DIV_UP(nch, 32)), warp, lane);
    ffn_route2<false>(lg, sel, a.logits + (size_t)t * E, E, a.k);
    const int e = min(max(sel[j], 0), E - 1);
    const cu_qweight wg = qf_expert<F>(a.gate, a.gate_stride, e);
    const cu_qweight wu = qf_expert<F>(a.up, a.up_stride, e);
    const int64_t rb = qf_bytes(F, wg.bits, wg.cols);
    const uint8_t *gr = (const uint8_t *)wg.data, *ur = (const uint8_t *)wu.data;
    const int r0 = blockIdx.x * FFN_WARPS * RPW + warp;
#pragma unroll
    for (int i = 0; i < RPW; i++) {
        const int r = r0 + i * FFN_WARPS;
        if (r < f) {
            ffn_stage(mine + 2 * i * words, gr + r * rb, rb, lane);
            ffn_stage(mine + (2 * i + 1) * words, ur + r * rb, rb, lane);
        }
    }
    cp_async_commit();
    if (blockIdx.x == 0 && warp == 0) {
        float w = ffn_weight(lg, sel, E, a.k, j, a.renorm, lane);
        if (lane == 0) a.ids[p] = e, a.weights[p] = w;
    }
    cp_async_wait<0>();
    __syncwarp();
    int off[2 * RPW];
#pragma unroll
    for (int i = 0; i < 2 * RPW; i++) /* each row where ffn_stage put it */
        off[i] = (int)((uintptr_t)((i & 1 ? ur : gr) + (r0 + (i >> 1) * FFN_WARPS) * rb) & 15);
    float acc[2 * RPW];
#pragma unroll
    for (int i = 0; i < 2 * RPW; i++) acc[i] = 0.f;
    for (int cc = lane; cc < nch; cc += 32) {
        uint32_t xw[16];
        float4 m;
        ffn_load_codes(xw, m, xc, xm, cc, nch);
#pragma unroll
        for (int i = 0; i < 2 * RPW; i++)
            if (r0 + (i >> 1) * FFN_WARPS < f)
                acc[i] = ffn_chunk<F>(acc[i], mine + i * words, off[i], i & 1 ? wu : wg,
                                      r0 + (i >> 1) * FFN_WARPS, cc, xw, m);
    }
#pragma unroll
    for (int i = 0; i < 2 * RPW; i++) acc[i] = cu_warp_sum(acc[i]);
#pragma unroll
    for (int i = 0; i < RPW; i++) {
        const int r = r0 + i * FFN_WARPS;
        if (r >= f) break;
        float g = acc[2 * i], u = acc[2 * i + 1];
        if (a.gate_bias) g = g + a.gate_bias[(size_t)e * f + r];
        if (a.up_bias) u = u + a.up_bias[(size_t)e * f + r];
        if (lane == 0) a.act[(size_t)p * f + r] = ffn_act(a, g, u);
    }
}

#define FFN_KJ 8 /* down: experts whose products a lane keeps at once */

template <int F>
__global__ void __launch_bounds__(FFN_WARPS * 32, FFN_MIN_BLOCKS(F))
    moe_ffn_down2_kernel(cu_moe_ffn_args a, int words) {
    extern __shared__ uint4 sm[];
    cu_grid_trigger();
    const int k = a.k, E = a.n_experts, nch = (int)(a.down.cols / 32), d = (int)a.down.rows;
    const int t = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int r = blockIdx.x * FFN_WARPS + warp;
    uint4 *xc = sm;
    float4 *xm = (float4 *)(sm + 4 * k * nch);
    float *lg = (float *)(sm + 5 * k * nch);
    int *sel = (int *)(lg + CU_DIV_UP(E, 4) * 4);
    float *wts = (float *)(sel + 32);
    uint4 *mine = sm + 5 * k * nch + ffn_route_words(E) + warp * k * words;
    const int64_t rb = qf_bytes(F, a.down.bits, a.down.cols);

    /* before the wait: the routing (the router's grid is done, see above),
     * the rows and the weights */
    ffn_route2<true>(lg, sel, a.logits + (size_t)t * E, E, k);
    if (r < d)
        for (int j = 0; j < k; j++) {
            const cu_qweight w = qf_expert<F>(a.down, a.down_stride, min(max(sel[j], 0), E - 1));
            ffn_stage(mine + j * words, (const uint8_t *)w.data + r * rb, rb, lane);
        }
    cp_async_commit();
    if (warp == 0) ffn_weights(wts, lg, sel, E, k, a.renorm, lane);
    cu_grid_wait();
    ffn_codes_q(xc, xm, a.act + (size_t)t * k * a.down.cols, k, nch,
                a.down.group ? a.down.group / 32 : 1, 0, warp, lane);
    __syncthreads();
    cp_async_wait<0>();
    __syncwarp();
    if (r >= d) return;
    float out = 0.f;
    for (int j0 = 0; j0 < k; j0 += FFN_KJ) {
        float acc[FFN_KJ];
#pragma unroll
        for (int i = 0; i < FFN_KJ; i++) acc[i] = 0.f;
        for (int cc = lane; cc < nch; cc += 32) {
#pragma unroll
            for (int i = 0; i < FFN_KJ; i++) {
                const int j = j0 + i;
                if (j >= k) break;
                const int e = min(max(sel[j], 0), E - 1);
                const cu_qweight w = qf_expert<F>(a.down, a.down_stride, e);
                uint32_t xw[16];
                float4 m;
                ffn_load_codes(xw, m, xc, xm, j * nch + cc, k * nch);
                acc[i] = ffn_chunk<F>(acc[i], mine + j * words,
                                      (int)(((uintptr_t)w.data + r * rb) & 15), w, r, cc, xw, m);
            }
        }
#pragma unroll
        for (int i = 0; i < FFN_KJ; i++)
            if (j0 + i < k) acc[i] = cu_warp_sum(acc[i]);
#pragma unroll
        for (int i = 0; i < FFN_KJ; i++) {
            const int j = j0 + i;
            if (j >= k) break;
            float v = acc[i];
            if (a.down_bias) v = v + a.down_bias[(size_t)min(max(sel[j], 0), E - 1) * d + r];
            out = fmaf(wts[j], v, out);
        }
    }
    if (lane == 0) a.y[(size_t)t * d + r] = out;
}

#define FFN_FORMATS(X)                                                                             \
    X(CU_Q8_0) X(CU_Q4_0) X(CU_Q4_K) X(CU_Q5_K) X(CU_Q6_K) X(CU_AFF4) X(CU_AFF8) X(CU_AFFN) X(CU_MXFP4)

/* Shared memory beyond 48 KiB needs an opt-in, per kernel and device. */
extern "C" void cu_moe_init(const cu_ctx *c) {
#define X(F)                                                                                       \
    cudaFuncSetAttribute(moe_ffn_up_kernel<F>, cudaFuncAttributeMaxDynamicSharedMemorySize,        \
                         c->smem_optin);                                                           \
    cudaFuncSetAttribute(moe_ffn_down_kernel<F>, cudaFuncAttributeMaxDynamicSharedMemorySize,      \
                         c->smem_optin);                                                           \
    cudaFuncSetAttribute(moe_ffn_up2_kernel<F, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize,    \
                         c->smem_optin);                                                           \
    cudaFuncSetAttribute(moe_ffn_up2_kernel<F, 2>, cudaFuncAttributeMaxDynamicSharedMemorySize,    \
                         c->smem_optin);                                                           \
    cudaFuncSetAttribute(moe_ffn_up2_kernel<F, 3>, cudaFuncAttributeMaxDynamicSharedMemorySize,    \
                         c->smem_optin);                                                           \
    cudaFuncSetAttribute(moe_ffn_up2_kernel<F, 4>, cudaFuncAttributeMaxDynamicSharedMemorySize,    \
                         c->smem_optin);                                                           \
    cudaFuncSetAttribute(moe_ffn_down2_kernel<F>, cudaFuncAttributeMaxDynamicSharedMemorySize,     \
                         c->smem_optin);
    FFN_FORMATS(X)
#undef X
    cudaGetLastError();
}

/* The activation block (32 columns, or an affine group) as a count of
 * chunks, if the codes' rounding takes it; 0 if not. */
static int ffn_group(const cu_qweight *w) {
    if (w->fmt < CU_AFF4 || w->fmt > CU_AFFN) return 1;
    int G = w->group / 32;
    return w->group % 32 || w->cols % w->group || (G & (G - 1)) || G > 32 ? 0 : G;
}

/* What cu_qmatmul_id asks of a stack of experts. */
static bool ffn_stack_ok(const cu_qweight *w, size_t stride) {
    bool wide = w->fmt == CU_Q4_K || w->fmt == CU_Q5_K || w->fmt == CU_AFF4 || w->fmt == CU_AFF8;
    size_t align = wide ? 16 : w->fmt == CU_MXFP4 ? 1 : 2;
    return cu_moe_qweight_ok(w) && stride % align == 0 && ffn_group(w) && w->rows <= 0x7fffffff &&
           w->cols <= 0x7fffffff;
}

extern "C" int cu_moe_ffn(const cu_ctx *c, const cu_moe_ffn_args *a) {
    const cu_qweight *g = &a->gate, *u = &a->up, *dn = &a->down;
    if (a->n < 1 || a->n_experts < 1 || a->n_experts > CU_MOE_MAX_EXPERTS || a->k < 1 ||
        a->k > 32 || a->k > a->n_experts || a->n * a->k > 65535)
        return -1;
    if (g->fmt != u->fmt || g->bits != u->bits || g->group != u->group ||
        g->scale_type != u->scale_type || g->rows != u->rows || g->cols != u->cols ||
        dn->cols != g->rows || !ffn_stack_ok(g, a->gate_stride) || !ffn_stack_ok(u, a->up_stride) ||
        !ffn_stack_ok(dn, a->down_stride) || !cu_aligned16(a->x) || !cu_aligned16(a->act))
        return -1;
    const int nch = (int)(g->cols / 32), nchd = (int)(dn->cols / 32);
    const int wu = ffn_words(qf_bytes(g->fmt, g->bits, g->cols));
    const int wd = ffn_words(qf_bytes(dn->fmt, dn->bits, dn->cols));
    const size_t limit = c->smem_optin > 0 ? (size_t)c->smem_optin : 48 << 10;
    int rpw = a->rows_per_warp < 1 ? 1 : a->rows_per_warp;
    if (rpw > FFN_RPW_MAX) rpw = FFN_RPW_MAX;
    while (rpw > 1 && 16 * (size_t)ffn_up_words(nch, a->n_experts, rpw, wu) > FFN_SMEM_2ROWS) rpw--;
    const size_t up_smem = 16 * (size_t)ffn_up_words(nch, a->n_experts, rpw, wu);
    const size_t down_smem = 16 * (size_t)ffn_down_words(nchd, a->k, wd);
    /* session 11's kernels: the routing area grows by the slots' weights */
    const size_t up2_smem = up_smem + 16 * (size_t)(ffn_route_words(a->n_experts) -
                                                    (CU_DIV_UP(a->n_experts, 4) * 4 + 32) / 4);
    const size_t down2_smem = down_smem + 16 * (size_t)ffn_route_words(a->n_experts);
    if (up_smem > limit || down_smem > limit) return -1;
    const cu_moe_ffn_args args = *a;
    dim3 up_grid((unsigned)CU_DIV_UP(g->rows, (int64_t)FFN_WARPS * rpw), (unsigned)(a->n * a->k));
    dim3 down_grid((unsigned)CU_DIV_UP(dn->rows, (int64_t)FFN_WARPS), (unsigned)a->n);
    if (a->kernels != 1 && up2_smem <= limit && down2_smem <= limit) {
#define UP2(F) case F: switch (rpw) { \
        case 1: CU_LAUNCH((moe_ffn_up2_kernel<F, 1>), up_grid, FFN_WARPS * 32, up2_smem, c, args, wu); break; \
        case 2: CU_LAUNCH((moe_ffn_up2_kernel<F, 2>), up_grid, FFN_WARPS * 32, up2_smem, c, args, wu); break; \
        case 3: CU_LAUNCH((moe_ffn_up2_kernel<F, 3>), up_grid, FFN_WARPS * 32, up2_smem, c, args, wu); break; \
        default: CU_LAUNCH((moe_ffn_up2_kernel<F, 4>), up_grid, FFN_WARPS * 32, up2_smem, c, args, wu); break; \
        } break;
#define DOWN2(F) case F: CU_LAUNCH(moe_ffn_down2_kernel<F>, down_grid, FFN_WARPS * 32, down2_smem, c, args, wd); break;
        switch (g->fmt) {
            FFN_FORMATS(UP2)
        default: return -1;
        }
        switch (dn->fmt) {
            FFN_FORMATS(DOWN2)
        default: return -1;
        }
#undef UP2
#undef DOWN2
        return 0;
    }
#define UP(F) case F: CU_LAUNCH(moe_ffn_up_kernel<F>, up_grid, FFN_WARPS * 32, up_smem, c, args, rpw, wu); break;
#define DOWN(F) case F: CU_LAUNCH(moe_ffn_down_kernel<F>, down_grid, FFN_WARPS * 32, down_smem, c, args, wd); break;
    switch (g->fmt) {
        FFN_FORMATS(UP)
    default: return -1;
    }
    switch (dn->fmt) {
        FFN_FORMATS(DOWN)
    default: return -1; /* not reached: ffn_stack_ok took the format */
    }
#undef UP
#undef DOWN
    return 0;
}
