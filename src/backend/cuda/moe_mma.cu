/*
 * moe_mma.cu - the matmul by expert id for many token rows (prefill,
 * batched decode) as a grouped GEMM on the tensor cores: each chosen
 * expert's weight tile is read once per 64 of its (row, slot) pairs and
 * multiplied with all of them at once.  moe.cu's kernels, which read a
 * weight row once per 8 pairs and multiply on the CUDA cores, keep the
 * rows up to PETREL_CUDA_MOE_MMA (decode, batch-invariant there).
 *
 * Two launches, both graph-safe (no count comes to the host):
 *
 *  - plan (moe_mma_plan_kernel): block 0 counts the pairs per expert in
 *    shared memory, scans the counts, places each pair at its expert's
 *    cursor (order[]) and lists the tiles: (expert, first pair) for every
 *    64 pairs of an expert, at most pairs / 64 + experts of them.  The
 *    other blocks round the activation rows to f16 ([x rows][kp], kp =
 *    cols rounded up to 64, zeros past cols), 8 values a thread.
 *  - GEMM (moe_mma_kernel): block (row tile, tile) owns 128 weight rows of
 *    the tile's expert and its up to 64 pairs; blocks past the tile count
 *    return at once (the grid is sized for the most tiles there can be).
 *    Steps of 64 columns: each thread decodes one 32-column chunk of one
 *    weight row with qdecode.cuh's decoder (any format matmul_id takes:
 *    GGUF, affine, MXFP4) into f16 in shared memory while the pairs'
 *    activations arrive by 16-byte cp.async, double-buffered so one
 *    barrier a step suffices, the next step's chunk loaded from memory
 *    while this one's mma run.  A warp owns 16 weight rows and all 64
 *    pairs (8 n8 tiles of mma.sync m16n8k16, f16 in, f32 sums); the
 *    results go to y[pair][row] through order[].
 *
 * Numerics: weights and activations each rounded to f16 (2^-11 relative),
 * products summed in f32 by the tensor core: within 2^-9 of sum |w x| per
 * output, the bound of qmma.cu and of the dense cuBLAS path.  A pair's
 * value does not depend on which tile or column it lands in (each mma
 * column is summed alike), so the result does not depend on the order
 * the atomics place the pairs in; it does differ from moe.cu's exact
 * integer products, so rows past the threshold are not bit-identical to
 * the same rows alone (as dense matmuls past 16 rows never were).
 */
#include "backend/cuda/cu_common.cuh"
#include "backend/cuda/cu_mma.cuh"
#include "backend/cuda/cuda_family.h"
#include "backend/cuda/moe_sort.cuh"
#include "backend/cuda/qdecode.cuh"

#define MM_BN 128 /* weight rows per block: 16 a warp */
#define MM_BM 64  /* pairs per tile */
#define MM_BK 64  /* columns per step: two chunks a row */
#define MM_LD 72  /* f16 per shared row: 144 bytes, so 8 ldmatrix rows hit distinct banks */
#define MM_THREADS 256

/* ---- scratch ----------------------------------------------------------------------- */

/* order[pairs], first[E + 1], the tile count and tiles[max] as (expert,
 * first pair), then the f16 activations [x_rows][kp], 16-byte aligned. */
struct mm_layout {
    size_t first, ntiles, tiles, xh, total;
    int max_tiles, kp;
};

__host__ __device__ static inline mm_layout mm_layout_of(int pairs, int E, int x_rows, int64_t cols) {
    mm_layout l;
    l.max_tiles = CU_DIV_UP(pairs, MM_BM) + (pairs < E ? pairs : E);
    l.kp = (int)CU_DIV_UP(cols, (int64_t)MM_BK) * MM_BK;
    l.first = sizeof(int32_t) * (size_t)pairs;
    l.ntiles = l.first + sizeof(int32_t) * ((size_t)E + 1);
    l.tiles = l.ntiles + sizeof(int32_t);
    l.xh = (l.tiles + sizeof(int32_t) * 2 * (size_t)l.max_tiles + 15) & ~(size_t)15;
    l.total = l.xh + sizeof(__half) * (size_t)x_rows * (size_t)l.kp;
    return l;
}

extern "C" size_t cu_moe_mma_scratch(int pairs, int n_experts, int x_rows, int64_t cols) {
    return mm_layout_of(pairs, n_experts, x_rows, cols).total;
}

/* ---- plan: sort, tiles, f16 activations ---------------------------------------------- */

__global__ void __launch_bounds__(1024)
    moe_mma_plan_kernel(char *scratch, const int32_t *ids, int pairs, int E, const float *x,
                        int x_rows, int cols) {
    extern __shared__ int32_t cnt[]; /* [E] counts, then [E] cursors */
    cu_grid_trigger();
    cu_grid_wait();
    const mm_layout L = mm_layout_of(pairs, E, x_rows, cols);
    if (blockIdx.x > 0) { /* 8 activations a thread, as f16 */
        const int per_row = L.kp / 8;
        const int64_t i = (int64_t)(blockIdx.x - 1) * blockDim.x + threadIdx.x;
        if (i >= (int64_t)x_rows * per_row) return;
        const int64_t r = i / per_row;
        const int c = (int)(i % per_row) * 8;
        uint4 o = make_uint4(0, 0, 0, 0);
        if (c < cols) { /* cols is a multiple of 32: all 8 or none */
            const float4 *xp = (const float4 *)(x + r * cols + c);
            const float4 a = __ldg(xp), b = __ldg(xp + 1);
            __half2 h[4] = {__floats2half2_rn(a.x, a.y), __floats2half2_rn(a.z, a.w),
                            __floats2half2_rn(b.x, b.y), __floats2half2_rn(b.z, b.w)};
            o = *(const uint4 *)h;
        }
        ((uint4 *)(scratch + L.xh))[i] = o;
        return;
    }
    moe_sort_pairs((int32_t *)scratch, (int32_t *)(scratch + L.first), NULL,
                   (int32_t *)(scratch + L.tiles), (int32_t *)(scratch + L.ntiles), MM_BM, cnt, ids,
                   pairs, E);
}

/* ---- the grouped GEMM ---------------------------------------------------------------- */

/* A decoded chunk (codes u with value mul * u + add per half, as every
 * decoder of qdecode.cuh gives them) as 32 f16 at dst; zeros if !valid. */
__device__ __forceinline__ void mm_store_chunk(__half *dst, const qchunk &q, bool valid) {
    uint32_t h[16];
#pragma unroll
    for (int i = 0; i < 16; i++) {
        const int half = i >> 3;
        const uint32_t w = q.u[i >> 1] >> (16 * (i & 1));
        const float v0 = fmaf(q.mul[half], (float)(w & 0xff), q.add[half]);
        const float v1 = fmaf(q.mul[half], (float)((w >> 8) & 0xff), q.add[half]);
        __half2 p = __floats2half2_rn(v0, v1);
        h[i] = valid ? *(uint32_t *)&p : 0u;
    }
    uint4 *d = (uint4 *)dst;
#pragma unroll
    for (int i = 0; i < 4; i++) d[i] = make_uint4(h[4 * i], h[4 * i + 1], h[4 * i + 2], h[4 * i + 3]);
}

template <int F>
__global__ void __launch_bounds__(MM_THREADS, 2)
    moe_mma_kernel(float *y, cu_qweight w, size_t stride, const char *scratch, int pairs, int E,
                   int k, int x_slots, int x_rows) {
    extern __shared__ uint4 mm_smem[];
    __half *As = (__half *)mm_smem;   /* [2][MM_BN][MM_LD] */
    __half *Bs = As + 2 * MM_BN * MM_LD; /* [2][MM_BM][MM_LD] */
    cu_grid_trigger();
    cu_grid_wait();
    const mm_layout L = mm_layout_of(pairs, E, x_rows, w.cols);
    const int32_t *order = (const int32_t *)scratch, *first = (const int32_t *)(scratch + L.first);
    const int32_t *tiles = (const int32_t *)(scratch + L.tiles);
    if ((int)blockIdx.y >= *(const int32_t *)(scratch + L.ntiles)) return;
    const int e = tiles[2 * blockIdx.y], p0 = tiles[2 * blockIdx.y + 1];
    const int np = min(MM_BM, first[e + 1] - p0);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int64_t rows = w.rows;
    const int nch = (int)(w.cols / 32), nsteps = L.kp / MM_BK;
    const cu_qweight we = qf_expert<F>(w, stride, e);

    /* this thread's chunk: row ar of the tile, chunk 2 s + (tid & 1) */
    const int arow = tid >> 1;
    const int64_t ar = (int64_t)blockIdx.x * MM_BN + arow;
    const bool a_ok = ar < rows;
    const uint8_t *ap = (const uint8_t *)we.data + (a_ok ? ar : 0) * qf_bytes(F, we.bits, we.cols);
    /* this thread's activations: pairs tid / 8 and tid / 8 + 32, word tid % 8 of a step
     * (pairs past np repeat the tile's first: computed, never stored) */
    const __half *xh = (const __half *)(scratch + L.xh);
    const __half *bp[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int t = (tid >> 3) + 32 * i, pair = order[p0 + (t < np ? t : 0)];
        const int xr = pair / k * x_slots + (x_slots > 1 ? pair % k : 0);
        bp[i] = xh + (size_t)xr * L.kp + (tid & 7) * 8;
    }

    qchunk q;
    int c = tid & 1;
    if (a_ok && c < nch) qf_chunk<F>(q, ap, c, c, we, ar);
#pragma unroll
    for (int i = 0; i < 2; i++)
        cp_async16(Bs + ((tid >> 3) + 32 * i) * MM_LD + (tid & 7) * 8, bp[i]);
    cp_async_commit();

    float acc[8][4];
#pragma unroll
    for (int i = 0; i < 8; i++) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
    for (int s = 0; s < nsteps; s++) {
        const int buf = s & 1;
        __half *Ab = As + buf * MM_BN * MM_LD, *Bb = Bs + buf * MM_BM * MM_LD;
        mm_store_chunk(Ab + arow * MM_LD + (tid & 1) * 32, q, a_ok && c < nch);
        cp_async_wait<0>();
        __syncthreads(); /* this step's tiles are whole; last step's mma are done */
        if (s + 1 < nsteps) { /* the next step in flight while this one multiplies */
            __half *Bn = Bs + (buf ^ 1) * MM_BM * MM_LD;
#pragma unroll
            for (int i = 0; i < 2; i++)
                cp_async16(Bn + ((tid >> 3) + 32 * i) * MM_LD + (tid & 7) * 8,
                           bp[i] + (size_t)(s + 1) * MM_BK);
            cp_async_commit();
            c = 2 * (s + 1) + (tid & 1);
            if (a_ok && c < nch) qf_chunk<F>(q, ap, c, c, we, ar);
        }
#pragma unroll
        for (int kk = 0; kk < MM_BK / 16; kk++) {
            uint32_t a[4];
            cu_ldmatrix4(a, Ab + (warp * 16 + (lane & 15)) * MM_LD + kk * 16 + (lane >> 4) * 8);
#pragma unroll
            for (int n2 = 0; n2 < 4; n2++) {
                if (n2 * 16 >= np) break; /* block-uniform */
                uint32_t b[4];
                cu_ldmatrix4(b, Bb + (n2 * 16 + (lane & 7) + ((lane >> 4) << 3)) * MM_LD + kk * 16 +
                                    ((lane >> 3) & 1) * 8);
                mma16816<CU_F16>(acc[2 * n2], a, b[0], b[1]);
                mma16816<CU_F16>(acc[2 * n2 + 1], a, b[2], b[3]);
            }
        }
    }
    /* c0, c1: weight row g, pairs 2t and 2t + 1 of the n8 tile; c2, c3: row g + 8 */
    const int g = lane >> 2, t2 = (lane & 3) * 2;
#pragma unroll
    for (int nt = 0; nt < 8; nt++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int tok = nt * 8 + t2 + (i & 1);
            const int64_t r = (int64_t)blockIdx.x * MM_BN + warp * 16 + g + (i >> 1) * 8;
            if (tok < np && r < rows) y[(size_t)order[p0 + tok] * rows + r] = acc[nt][i];
        }
}

#define MM_FORMATS(X)                                                                              \
    X(CU_Q8_0) X(CU_Q4_0) X(CU_Q4_K) X(CU_Q5_K) X(CU_Q6_K) X(CU_AFF4) X(CU_AFF8) X(CU_AFFN) X(CU_MXFP4)

static size_t mm_smem_bytes() {
    return sizeof(__half) * (size_t)2 * (MM_BN + MM_BM) * MM_LD;
}

extern "C" void cu_moe_mma_init(const cu_ctx *c) {
    (void)c;
#define X(F)                                                                                       \
    cudaFuncSetAttribute(moe_mma_kernel<F>, cudaFuncAttributeMaxDynamicSharedMemorySize,           \
                         (int)mm_smem_bytes());
    MM_FORMATS(X)
#undef X
    cudaGetLastError();
}

extern "C" int cu_moe_mma(const cu_ctx *c, float *y, const float *x, const cu_qweight *w,
                          size_t expert_stride, int n_experts, const int32_t *ids, void *scratch,
                          int pairs, int k, int x_slots) {
    /* the decoders' loads: 16-byte words for these formats, 2-byte for the GGUF blocks */
    bool wide = w->fmt == CU_Q4_K || w->fmt == CU_Q5_K || w->fmt == CU_AFF4 || w->fmt == CU_AFF8;
    size_t align = wide ? 16 : w->fmt == CU_MXFP4 ? 1 : 2;
    if (!cu_moe_qweight_ok(w) || n_experts < 1 || n_experts > CU_MOE_MAX_EXPERTS || k < 1 ||
        x_slots < 1 || expert_stride % align || w->cols % 32 || w->rows > 0x7fffffff ||
        w->cols > 0x7fffffff || !cu_aligned16(x) || (size_t)c->smem_optin < mm_smem_bytes())
        return -1;
    if (pairs <= 0) return 0;
    const int x_rows = pairs / k * x_slots;
    const mm_layout L = mm_layout_of(pairs, n_experts, x_rows, w->cols);
    if (L.max_tiles > 65535) return -1;
    const int64_t words = (int64_t)x_rows * (L.kp / 8);
    char *s = (char *)scratch;
    CU_LAUNCH(moe_mma_plan_kernel, (unsigned)(1 + CU_DIV_UP(words, (int64_t)1024)), 1024,
              sizeof(int32_t) * 2 * (size_t)n_experts, c, s, ids, pairs, n_experts, x, x_rows,
              (int)w->cols);
    const cu_qweight ww = *w;
    dim3 grid((unsigned)CU_DIV_UP(w->rows, (int64_t)MM_BN), (unsigned)L.max_tiles);
#define X(F)                                                                                       \
    case F:                                                                                        \
        CU_LAUNCH(moe_mma_kernel<F>, grid, MM_THREADS, mm_smem_bytes(), c, y, ww, expert_stride,  \
                  (const char *)s, pairs, n_experts, k, x_slots, x_rows);                          \
        break;
    switch (w->fmt) {
        MM_FORMATS(X)
    default: return -1; /* not reached: cu_moe_qweight_ok took the format */
    }
#undef X
    return 0;
}
