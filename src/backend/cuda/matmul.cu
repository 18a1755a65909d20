/*
 * matmul.cu - y = x · wᵀ for few rows of x (decode): weight-streaming GEMV.
 *
 * Decode reads every weight once per step, so these kernels are judged by
 * one number: weight bytes per second against the device's read bandwidth.
 * A block of 128 threads works on groups of R consecutive weight rows; its
 * threads split the columns in 16-byte chunks (8 bf16/f16 or 4 f32
 * weights), keep 4 chunk loads in flight plus the next 4 being fetched
 * (loads that skip L1: weights are used once), convert to f32 in registers
 * and multiply by the f32 activations of all NT token rows (read through
 * L1/L2, where they stay: they are small and every block reads them).
 * Accumulation is f32; at the end of each row group the block sums its
 * threads' partial sums.  R grows with NT so activation reads per weight
 * byte stay flat.  The grid is persistent (see gemv_vec_kernel).
 *
 * Larger batches go to cuBLAS (cuda_backend.c).  Any shape whose rows are
 * not whole 16-byte chunks, or misaligned pointers, take the plain kernel.
 *
 * Batch invariance: a token row's result does not depend on how many rows
 * come with it.  Each thread takes its chunks in the same order at every
 * NT (tid, tid + 128, ...: R and U only change which loads are in flight),
 * every operation is an explicit fmaf, and the block sums in warp order;
 * the kernel is picked by shape and alignment, not by n (n = 9..16 run the
 * NT = 16 instance).  So verifying k + 1 draft rows gives each row the bits
 * that decoding it alone gives (tests/cuda/test_cuda_ops.c).
 */
#include "backend/cuda/cu_common.cuh"

#define GEMV_THREADS 128
#define GEMV_LOADS 4 /* 16-byte weight loads in flight per thread, per buffer */

/* One work item: chunk batch b (U chunks per thread) of row group grp
 * (R rows); past the end of a row the loads are skipped (zeros). */
template <int T, int R, int U>
__device__ __forceinline__ void gemv_load(uint4 (&wv)[U][R], const char *w, size_t row_bytes,
                                          int rows, int grp, int b, int n_chunks) {
#pragma unroll
    for (int u = 0; u < U; u++) {
        int c = (b * U + u) * GEMV_THREADS + threadIdx.x;
#pragma unroll
        for (int r = 0; r < R; r++) {
            int row = min(grp * R + r, rows - 1); /* clamped rows compute, never store */
            const uint4 *p = (const uint4 *)(w + (size_t)row * row_bytes) + c;
            wv[u][r] = c < n_chunks ? cu_ld_stream(p) : make_uint4(0, 0, 0, 0);
        }
    }
}

/* Persistent: the grid is what fits on the GPU at once, each block walks
 * its row groups (grp = blockIdx.x, + gridDim.x, ...) one chunk batch at a
 * time, and the loads of the next batch are issued before the current one
 * is multiplied and, at a row's end, reduced; so every thread keeps weight
 * loads in flight from its first load to its last, across rows. */
/* A launch: cu_fused's matrices on one input, each a segment of the grid
 * (blocks [first[s], first[s + 1])), each run exactly as alone. */
struct gemv_args {
    cu_fused f;
    int first[CU_FUSE_MAX_W + 1];
};

/* NORM: the input is rmsnorm(x) * g (cu_fused), each element made as
 * rmsnorm makes it where it is multiplied. */
template <int T, int NT, int R, bool NORM>
__global__ void __launch_bounds__(GEMV_THREADS) gemv_vec_kernel(const gemv_args a) {
    cu_grid_trigger();
    /* this block's segment (indices written out: no local copy of a) */
    int seg = 0;
#pragma unroll
    for (int i = 1; i < CU_FUSE_MAX_W; i++)
        if (i < a.f.nw && (int)blockIdx.x >= a.first[i]) seg = i;
    float *y = a.f.y[0];
    const float *bias = a.f.bias[0];
    const void *w = a.f.w[0].data;
    int rows = (int)a.f.w[0].rows, bid = (int)blockIdx.x, nblk = a.first[1];
#pragma unroll
    for (int i = 1; i < CU_FUSE_MAX_W; i++)
        if (seg == i) {
            y = a.f.y[i], bias = a.f.bias[i], w = a.f.w[i].data, rows = (int)a.f.w[i].rows;
            bid = (int)blockIdx.x - a.first[i], nblk = a.first[i + 1] - a.first[i];
        }
    const float *x = a.f.x;
    const int cols = (int)a.f.w[0].cols, n = a.f.n;
    const int U = GEMV_LOADS / R, EPC = cu_chunk<T>::n, STEP = GEMV_THREADS * U;
    const int n_chunks = cols / EPC, bpr = (n_chunks + STEP - 1) / STEP;
    const int n_groups = (rows + R - 1) / R;
    const int my_groups = bid < n_groups ? (n_groups - 1 - bid) / nblk + 1 : 0;
    const int n_items = my_groups * bpr;
    const size_t row_bytes = (size_t)cols * (T == CU_F32 ? 4 : 2);
    const char *wb = (const char *)w;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    __shared__ float red[2][GEMV_THREADS / 32][R * NT];

    /* The first weights are loaded before waiting for the previous kernel:
     * no kernel writes weights, and their latency overlaps its tail. */
    uint4 wv[U][R], wn[U][R];
    if (n_items) gemv_load<T, R, U>(wv, wb, row_bytes, rows, bid, 0, n_chunks);
    cu_grid_wait();
    __shared__ float nred[33], nscale[NT];
    if (NORM) {
        for (int t = 0; t < n; t++) {
            const float r = cu_rms_scale(x + (size_t)t * cols, cols, a.f.eps, nred);
            if (tid == 0) nscale[t] = r;
        }
        __syncthreads();
        if (a.f.norm_y && blockIdx.x == 0) /* one block stores the norm */
            for (int i = tid; i < n * cols; i += GEMV_THREADS)
                a.f.norm_y[i] = x[i] * nscale[i / cols] * a.f.g[i % cols];
    }

    float acc[R][NT];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) acc[r][t] = 0.f;
    for (int k = 0; k < n_items; k++) {
        const int j = k / bpr, b = k - j * bpr, grp = bid + j * nblk;
        if (k + 1 < n_items) {
            int j1 = (k + 1) / bpr, b1 = k + 1 - j1 * bpr;
            gemv_load<T, R, U>(wn, wb, row_bytes, rows, bid + j1 * nblk, b1, n_chunks);
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            int c = (b * U + u) * GEMV_THREADS + tid;
            if (c >= n_chunks) break;
            float wf[R][EPC];
#pragma unroll
            for (int r = 0; r < R; r++) cu_unpack<T>(wv[u][r], wf[r]);
#pragma unroll
            for (int t = 0; t < NT; t++) {
                if (t >= n) break;
                const float4 *xp = (const float4 *)(x + (size_t)t * cols + (size_t)c * EPC);
                float xf[EPC];
#pragma unroll
                for (int i = 0; i < EPC / 4; i++) {
                    float4 v = __ldca(xp + i);
                    if (NORM) { /* as rmsnorm: x * r * g */
                        const float r = nscale[t];
                        const float4 g = __ldca((const float4 *)(a.f.g + (size_t)c * EPC) + i);
                        v = make_float4(v.x * r * g.x, v.y * r * g.y, v.z * r * g.z, v.w * r * g.w);
                    }
                    xf[4 * i] = v.x, xf[4 * i + 1] = v.y, xf[4 * i + 2] = v.z, xf[4 * i + 3] = v.w;
                }
#pragma unroll
                for (int r = 0; r < R; r++)
#pragma unroll
                    for (int i = 0; i < EPC; i++) acc[r][t] = fmaf(wf[r][i], xf[i], acc[r][t]);
            }
        }
        if (b == bpr - 1) {
            /* Row group done: sum over the block.  red alternates between
             * two buffers, so one barrier per group suffices. */
            float(*rd)[R * NT] = red[j & 1];
#pragma unroll
            for (int r = 0; r < R; r++)
#pragma unroll
                for (int t = 0; t < NT; t++) {
                    float v = cu_warp_sum(acc[r][t]);
                    if (lane == 0) rd[warp][r * NT + t] = v;
                    acc[r][t] = 0.f;
                }
            __syncthreads();
            if (tid < R * NT) {
                int r = tid / NT, t = tid % NT, row = grp * R + r;
                float v = 0.f;
#pragma unroll
                for (int q = 0; q < GEMV_THREADS / 32; q++) v += rd[q][tid];
                if (row < rows && t < n) {
                    const size_t o = (size_t)t * rows + row;
                    if (bias) v += bias[row]; /* as add_bias: y + b */
                    y[o] = v;
                    if (a.f.res_out) a.f.res_out[o] = a.f.res_in[o] + v; /* as add: x + y */
                }
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int r = 0; r < R; r++) wv[u][r] = wn[u][r];
    }
}

/* Any shape and alignment: one block per weight row, element loads. */
template <int T>
__global__ void __launch_bounds__(GEMV_THREADS)
    gemv_plain_kernel(float *y, const float *x, const void *__restrict__ w, int rows, int cols,
                      int n) {
    cu_grid_trigger();
    cu_grid_wait();
    const int row = blockIdx.x;
    float acc[CU_GEMV_MAX_ROWS];
#pragma unroll
    for (int t = 0; t < CU_GEMV_MAX_ROWS; t++) acc[t] = 0.f;
    const size_t off = (size_t)row * cols;
    for (int c = threadIdx.x; c < cols; c += GEMV_THREADS) {
        float wv = cu_load_elem<T>(w, off + c);
#pragma unroll
        for (int t = 0; t < CU_GEMV_MAX_ROWS; t++)
            if (t < n) acc[t] = fmaf(wv, x[(size_t)t * cols + c], acc[t]);
    }
    __shared__ float red[GEMV_THREADS / 32][CU_GEMV_MAX_ROWS];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
    for (int t = 0; t < CU_GEMV_MAX_ROWS; t++) {
        float v = cu_warp_sum(acc[t]);
        if (lane == 0) red[warp][t] = v;
    }
    __syncthreads();
    if (threadIdx.x < n) {
        float v = 0.f;
        for (int k = 0; k < GEMV_THREADS / 32; k++) v += red[k][threadIdx.x];
        y[(size_t)threadIdx.x * rows + row] = v;
    }
}

/* Rows of weights a block owns, by token count: more rows when more tokens
 * share each weight load, so activation reads per weight byte stay flat. */
#define GEMV_R(nt) ((nt) == 1 ? 1 : (nt) == 2 ? 2 : 4)

/* As many blocks as fit on the GPU at once (asked of the occupancy
 * calculator once per kernel and device, from cu_gemv_init: not during a
 * graph capture, kept in the context), the row groups spread evenly over
 * them. */
template <int T, int NT> static void gemv_init_one(cu_ctx *c) {
    int per_sm = 0;
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, gemv_vec_kernel<T, NT, GEMV_R(NT), false>,
                                                  GEMV_THREADS, 0);
    c->gemv_fit[T][NT - 1] = (c->n_sm > 0 ? c->n_sm : 1) * (per_sm > 0 ? per_sm : 1);
}

template <int T> static void gemv_init_type(cu_ctx *c) {
    gemv_init_one<T, 1>(c), gemv_init_one<T, 2>(c), gemv_init_one<T, 3>(c);
    gemv_init_one<T, 4>(c), gemv_init_one<T, 5>(c), gemv_init_one<T, 6>(c);
    gemv_init_one<T, 7>(c), gemv_init_one<T, 8>(c), gemv_init_one<T, 16>(c);
}

extern "C" void cu_gemv_init(cu_ctx *c) {
    gemv_init_type<CU_F32>(c);
    gemv_init_type<CU_F16>(c);
    gemv_init_type<CU_BF16>(c);
}

/* Each segment's share (by rows) of the blocks that fit at once, spread
 * evenly over its row groups (one matrix alone: all of them). */
template <int T, int NT, bool NORM> static void launch_vec(const cu_ctx *c, gemv_args &a) {
    const int R = GEMV_R(NT);
    const cu_fused &f = a.f;
    int fit = c->gemv_fit[T][NT - 1] > 0 ? c->gemv_fit[T][NT - 1] : 132 * 4;
    int64_t all_rows = 0;
    for (int i = 0; i < f.nw; i++) all_rows += f.w[i].rows;
    a.first[0] = 0;
    for (int i = 0; i < CU_FUSE_MAX_W; i++) {
        if (i >= f.nw) {
            a.first[i + 1] = a.first[i];
            continue;
        }
        int share = (int)((int64_t)fit * f.w[i].rows / all_rows);
        share = share > 0 ? share : 1;
        int groups = (int)CU_DIV_UP(f.w[i].rows, (int64_t)R);
        int per_block = c->gemv_mode & 1 ? CU_DIV_UP(groups, share) : 1;
        a.first[i + 1] = a.first[i] + CU_DIV_UP(groups, per_block);
    }
    cudaLaunchConfig_t cfg = cu_config_pdl(a.first[f.nw], GEMV_THREADS, 0, c->s,
                                           c->pdl && (c->gemv_mode & 2));
    cudaLaunchKernelEx(&cfg, gemv_vec_kernel<T, NT, R, NORM>, a);
}

template <int T> static void dispatch_vec(const cu_ctx *c, gemv_args &a) {
    switch (a.f.n) {
    case 1: launch_vec<T, 1, false>(c, a); break;
    case 2: launch_vec<T, 2, false>(c, a); break;
    case 3: launch_vec<T, 3, false>(c, a); break;
    case 4: launch_vec<T, 4, false>(c, a); break;
    case 5: launch_vec<T, 5, false>(c, a); break;
    case 6: launch_vec<T, 6, false>(c, a); break;
    case 7: launch_vec<T, 7, false>(c, a); break;
    case 8: launch_vec<T, 8, false>(c, a); break;
    default: launch_vec<T, 16, false>(c, a); break;
    }
}

/* With the norm folded in: fewer instances (a row's bits do not depend on
 * NT, so 3 token rows may run the 4-row one). */
template <int T> static void dispatch_vec_norm(const cu_ctx *c, gemv_args &a) {
    const int n = a.f.n;
    if (n == 1) launch_vec<T, 1, true>(c, a);
    else if (n == 2) launch_vec<T, 2, true>(c, a);
    else if (n <= 4) launch_vec<T, 4, true>(c, a);
    else if (n <= 8) launch_vec<T, 8, true>(c, a);
    else launch_vec<T, 16, true>(c, a);
}

/* Whether the vector kernel takes rows of cols elements of type wtype at
 * w, with x. */
static bool vec_ok(const void *x, const void *w, int wtype, int64_t cols) {
    size_t esz = wtype == CU_F32 ? 4 : 2;
    return ((size_t)cols * esz) % 16 == 0 && cols % 4 == 0 && cu_aligned16(x) && cu_aligned16(w);
}

extern "C" int cu_gemv(const cu_ctx *c, float *y, const float *x, const void *w, int wtype,
                       int rows, int cols, int n) {
    if (n < 1 || n > CU_GEMV_MAX_ROWS || rows < 1 || cols < 1) return -1;
    if (vec_ok(x, w, wtype, cols)) {
        gemv_args a = {};
        a.f.x = x, a.f.n = n, a.f.nw = 1, a.f.y[0] = y;
        a.f.w[0].data = w, a.f.w[0].rows = rows, a.f.w[0].cols = cols, a.f.w[0].fmt = wtype;
        switch (wtype) {
        case CU_F32: dispatch_vec<CU_F32>(c, a); break;
        case CU_F16: dispatch_vec<CU_F16>(c, a); break;
        case CU_BF16: dispatch_vec<CU_BF16>(c, a); break;
        default: return -1;
        }
        return 0;
    }
    switch (wtype) {
    case CU_F32: CU_LAUNCH((gemv_plain_kernel<CU_F32>), rows, GEMV_THREADS, 0, c, y, x, w, rows, cols, n); break;
    case CU_F16: CU_LAUNCH((gemv_plain_kernel<CU_F16>), rows, GEMV_THREADS, 0, c, y, x, w, rows, cols, n); break;
    case CU_BF16: CU_LAUNCH((gemv_plain_kernel<CU_BF16>), rows, GEMV_THREADS, 0, c, y, x, w, rows, cols, n); break;
    default: return -1;
    }
    return 0;
}

/* The fused launch (cuda_internal.h) for f32/f16/bf16 matrices of one type
 * and the same columns that the vector kernel takes; no swiglu (made where
 * it is multiplied, its expf would be paid once per weight row). */
extern "C" int cu_gemv_fused(const cu_ctx *c, const cu_fused *f) {
    if (f->nw < 1 || f->nw > CU_FUSE_MAX_W || f->n < 1 || f->n > CU_GEMV_MAX_ROWS) return -1;
    if (f->pro == CU_PRO_SWIGLU || (f->res_out && f->nw != 1)) return -1;
    const int wt = f->w[0].fmt;
    if (f->pro == CU_PRO_NORM && (!cu_aligned16(f->g) || f->w[0].cols % 4)) return -1;
    for (int i = 0; i < f->nw; i++)
        if (f->w[i].fmt != wt || f->w[i].cols != f->w[0].cols || f->w[i].rows < 1 ||
            f->w[i].rows > 0x7fffffff || !vec_ok(f->x, f->w[i].data, wt, f->w[0].cols))
            return -1;
    gemv_args a = {};
    a.f = *f;
    const bool norm = f->pro == CU_PRO_NORM;
    switch (wt) {
    case CU_F32: norm ? dispatch_vec_norm<CU_F32>(c, a) : dispatch_vec<CU_F32>(c, a); break;
    case CU_F16: norm ? dispatch_vec_norm<CU_F16>(c, a) : dispatch_vec<CU_F16>(c, a); break;
    case CU_BF16: norm ? dispatch_vec_norm<CU_BF16>(c, a) : dispatch_vec<CU_BF16>(c, a); break;
    default: return -1;
    }
    return 0;
}

template <int T>
__global__ void convert_kernel(void *dst, const float *src, size_t count) {
    cu_grid_trigger();
    cu_grid_wait();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count;
         i += (size_t)gridDim.x * blockDim.x)
        cu_store_elem<T>(dst, i, src[i]);
}

extern "C" void cu_convert_from_f32(const cu_ctx *c, void *dst, int dtype, const float *src,
                                    size_t count) {
    int blocks = (int)(count / 256 + 1 < 8192 ? count / 256 + 1 : 8192);
    if (dtype == CU_BF16) CU_LAUNCH((convert_kernel<CU_BF16>), blocks, 256, 0, c, dst, src, count);
    else CU_LAUNCH((convert_kernel<CU_F16>), blocks, 256, 0, c, dst, src, count);
}
