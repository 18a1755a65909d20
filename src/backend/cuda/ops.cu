/*
 * ops.cu - the small ops of a forward pass: embedding lookup, RMSNorm,
 * residual add, bias, SwiGLU, rotary embedding, KV-cache store, row gather,
 * the greedy argmax of logit rows, and the read kernel that measures memory
 * bandwidth.
 *
 * Each is memory-bound and tiny next to the matmuls; they are written for
 * plain coalesced access.  Activations are f32 as everywhere in Petrel.
 */
#include <limits.h>
#include <math.h>

#include "backend/cuda/cu_common.cuh"

static int grid_for(size_t count, int threads) {
    size_t b = CU_DIV_UP(count, (size_t)threads);
    return (int)(b < 65535 ? (b ? b : 1) : 65535);
}

/* ---- embed ---------------------------------------------------------------- */

template <int T>
__global__ void embed_kernel(float *y, const void *table, int64_t rows, int64_t cols,
                             const int32_t *ids) {
    cu_grid_trigger();
    cu_grid_wait();
    int i = blockIdx.x;
    int64_t id = ids[i];
    float *dst = y + (size_t)i * cols;
    bool ok = id >= 0 && id < rows;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
        dst[c] = ok ? cu_load_elem<T>(table, (size_t)id * cols + c) : 0.f;
}

extern "C" void cu_embed(const cu_ctx *c, float *y, const void *table, int dtype, int64_t rows,
                         int64_t cols, const int32_t *ids, int n) {
    if (n <= 0) return;
    if (dtype == CU_F32) CU_LAUNCH((embed_kernel<CU_F32>), n, 256, 0, c, y, table, rows, cols, ids);
    else if (dtype == CU_F16) CU_LAUNCH((embed_kernel<CU_F16>), n, 256, 0, c, y, table, rows, cols, ids);
    else CU_LAUNCH((embed_kernel<CU_BF16>), n, 256, 0, c, y, table, rows, cols, ids);
}

/* ---- rmsnorm ------------------------------------------------------------- */

/* One warp per row (short rows: per-head q/k norms) ... */
/* One row's norm by one warp.  rope_store_kernel makes the per-head q/k
 * norms with the same arithmetic (warp_rms_scale, x * r * g), so the fused
 * launch is bit for bit the unfused one. */
/* The scale 1 / rms of a row of d whose lane-strided elements' squares
 * each lane summed, in order, into ss. */
__device__ __forceinline__ float warp_rms_scale(float ss, int d, float eps) {
    ss = cu_warp_sum(ss);
    return 1.0f / sqrtf(ss / (float)d + eps);
}

__device__ __forceinline__ void warp_rmsnorm(float *yr, const float *xr, const float *g, int d,
                                             float eps, int lane) {
    float ss = 0.f;
    for (int i = lane; i < d; i += 32) ss = fmaf(xr[i], xr[i], ss);
    float r = warp_rms_scale(ss, d, eps);
    for (int i = lane; i < d; i += 32) yr[i] = xr[i] * r * g[i];
}

__global__ void rmsnorm_warp_kernel(float *y, const float *x, const float *g, int n, int d,
                                    float eps) {
    cu_grid_trigger();
    cu_grid_wait();
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x & 31;
    if (row >= n) return;
    warp_rmsnorm(y + (size_t)row * d, x + (size_t)row * d, g, d, eps, lane);
}

/* ... or one block per row.  Each thread rereads and writes only the
 * elements it summed, so y may alias x. */
__global__ void rmsnorm_block_kernel(float *y, const float *x, const float *g, int d, float eps) {
    cu_grid_trigger();
    cu_grid_wait();
    const float *xr = x + (size_t)blockIdx.x * d;
    float *yr = y + (size_t)blockIdx.x * d;
    float ss = 0.f;
    for (int i = threadIdx.x; i < d; i += blockDim.x) ss = fmaf(xr[i], xr[i], ss);
    __shared__ float red[32];
    ss = cu_warp_sum(ss);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x / 32] = ss;
    __syncthreads();
    if (threadIdx.x < 32) {
        float v = threadIdx.x < blockDim.x / 32 ? red[threadIdx.x] : 0.f;
        v = cu_warp_sum(v);
        if (threadIdx.x == 0) red[0] = v;
    }
    __syncthreads();
    float r = 1.0f / sqrtf(red[0] / (float)d + eps);
    for (int i = threadIdx.x; i < d; i += blockDim.x) yr[i] = xr[i] * r * g[i];
}

extern "C" void cu_rmsnorm(const cu_ctx *c, float *y, const float *x, const float *g, int n, int d,
                           float eps) {
    if (n <= 0) return;
    const int threads = cu_rms_threads(d);
    if (threads == 32) CU_LAUNCH((rmsnorm_warp_kernel), CU_DIV_UP(n, 8), 256, 0, c, y, x, g, n, d, eps);
    else CU_LAUNCH((rmsnorm_block_kernel), n, threads, 0, c, y, x, g, d, eps);
}

/* ---- elementwise ---------------------------------------------------------- */

__global__ void add_kernel(float *y, const float *a, const float *b, size_t count) {
    cu_grid_trigger();
    cu_grid_wait();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count;
         i += (size_t)gridDim.x * blockDim.x)
        y[i] = a[i] + b[i];
}

__global__ void add4_kernel(float4 *y, const float4 *a, const float4 *b, size_t count4) {
    cu_grid_trigger();
    cu_grid_wait();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count4;
         i += (size_t)gridDim.x * blockDim.x) {
        float4 p = a[i], q = b[i];
        y[i] = make_float4(p.x + q.x, p.y + q.y, p.z + q.z, p.w + q.w);
    }
}

extern "C" void cu_add(const cu_ctx *c, float *y, const float *a, const float *b, size_t count) {
    if (!count) return;
    if (count % 4 == 0 && cu_aligned16(y) && cu_aligned16(a) && cu_aligned16(b))
        CU_LAUNCH((add4_kernel), grid_for(count / 4, 256), 256, 0, c, (float4 *)y, (const float4 *)a,
                                                            (const float4 *)b, count / 4);
    else CU_LAUNCH((add_kernel), grid_for(count, 256), 256, 0, c, y, a, b, count);
}

__global__ void add_bias_kernel(float *y, const float *bias, int n, int d) {
    cu_grid_trigger();
    cu_grid_wait();
    size_t count = (size_t)n * d;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count;
         i += (size_t)gridDim.x * blockDim.x)
        y[i] += bias[i % d];
}

extern "C" void cu_add_bias(const cu_ctx *c, float *y, const float *bias, int n, int d) {
    if (n <= 0 || d <= 0) return;
    CU_LAUNCH((add_bias_kernel), grid_for((size_t)n * d, 256), 256, 0, c, y, bias, n, d);
}

__global__ void swiglu_kernel(float *y, const float *gate, const float *up, size_t count) {
    cu_grid_trigger();
    cu_grid_wait();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count;
         i += (size_t)gridDim.x * blockDim.x)
        y[i] = cu_silu_mul(gate[i], up[i]);
}

extern "C" void cu_swiglu(const cu_ctx *c, float *y, const float *gate, const float *up,
                          size_t count) {
    if (!count) return;
    CU_LAUNCH((swiglu_kernel), grid_for(count, 256), 256, 0, c, y, gate, up, count);
}

/* ---- rope ------------------------------------------------------------------ */

/* The angle of pair j at position p: pos * inv_freq in double, sin/cos
 * taken in double and rounded once to f32 (as the CPU backend does): at
 * position 32k an f32 product is already off by ~2e-3 rad.  FP64 is slow
 * on some GPUs, but rope is a few thousand angles per row (and
 * rope_store_kernel takes each once per row, not once per head). */
__device__ __forceinline__ float2 rope_angle(int p, float inv_freq, float mscale) {
    double sd, cd;
    sincos((double)p * (double)inv_freq, &sd, &cd);
    return make_float2((float)(cd * (double)mscale), (float)(sd * (double)mscale));
}

/* The pair (x0, x1) rotated by the angle cs = (cos, sin): its first and
 * its second element, each product rounded on its own (no contraction
 * into an FMA): the CPU's arithmetic, and the same in every kernel. */
__device__ __forceinline__ float rope_first(float x0, float x1, float2 cs) {
    return __fsub_rn(__fmul_rn(x0, cs.x), __fmul_rn(x1, cs.y));
}

__device__ __forceinline__ float rope_second(float x0, float x1, float2 cs) {
    return __fadd_rn(__fmul_rn(x0, cs.y), __fmul_rn(x1, cs.x));
}

__device__ __forceinline__ void rope_rotate(float *h, int a, int b, float2 cs) {
    float x0 = h[a], x1 = h[b];
    h[a] = rope_first(x0, x1, cs);
    h[b] = rope_second(x0, x1, cs);
}

/* The pair j of a head: GGUF/NeoX style 0 rotates (2j, 2j + 1), style 1
 * (j, j + half). */
__device__ __forceinline__ int2 rope_pair(int style, int j, int half) {
    return style == 0 ? make_int2(2 * j, 2 * j + 1) : make_int2(j, j + half);
}

/* One thread per rotated pair. */
__global__ void rope_kernel(float *x, const int32_t *pos, int n, int n_heads, int head_dim,
                            int style, int n_rot, const float *inv_freq, float mscale) {
    cu_grid_trigger();
    cu_grid_wait();
    int half = n_rot / 2;
    size_t count = (size_t)n * n_heads * half;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count;
         i += (size_t)gridDim.x * blockDim.x) {
        int j = (int)(i % half);
        size_t rh = i / half; /* row * n_heads + head */
        int row = (int)(rh / n_heads);
        int2 ab = rope_pair(style, j, half);
        rope_rotate(x + rh * head_dim, ab.x, ab.y, rope_angle(pos[row], inv_freq[j], mscale));
    }
}

extern "C" void cu_rope(const cu_ctx *c, float *x, const int32_t *pos, int n, int n_heads,
                        int head_dim, int style, int n_rot, const float *inv_freq, float mscale) {
    size_t count = (size_t)n * n_heads * (n_rot / 2);
    if (!count) return;
    CU_LAUNCH((rope_kernel), grid_for(count, 256), 256, 0, c, x, pos, n, n_heads, head_dim, style, n_rot,
                                                     inv_freq, mscale);
}

/* ---- kv_store -------------------------------------------------------------- */

/* The cache slot (page * page_size + offset) of position p of sequence
 * seq, or -1 where its page is not mapped (the row is not stored). */
__device__ __forceinline__ long long kv_slot(int p, int seq, const int32_t *bt, int max_pages,
                                             int page_size) {
    int page = bt[(size_t)seq * max_pages + p / page_size];
    return page < 0 ? -1 : (long long)page * page_size + p % page_size;
}

template <int T>
__global__ void kv_store_kernel(void *kc, void *vc, int page_size, int n_kv_heads, int head_dim,
                                const int32_t *pos, const int32_t *seq, const int32_t *bt,
                                int max_pages, int n, const float *k, const float *v) {
    cu_grid_trigger();
    cu_grid_wait();
    size_t per_row = (size_t)n_kv_heads * head_dim, count = (size_t)n * per_row;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count;
         i += (size_t)gridDim.x * blockDim.x) {
        int row = (int)(i / per_row);
        size_t e = i % per_row;
        long long slot = kv_slot(pos[row], seq[row], bt, max_pages, page_size);
        if (slot < 0) continue;
        size_t dst = (size_t)slot * per_row + e;
        cu_store_elem<T>(kc, dst, k[i]);
        cu_store_elem<T>(vc, dst, v[i]);
    }
}

extern "C" void cu_kv_store(const cu_ctx *c, void *kc, void *vc, int dtype, int page_size,
                            int n_kv_heads, int head_dim, const int32_t *pos, const int32_t *seq,
                            const int32_t *block_table, int max_pages, int n, const float *k,
                            const float *v) {
    size_t count = (size_t)n * n_kv_heads * head_dim;
    if (!count) return;
    int g = grid_for(count, 256);
#define KV_ARGS kc, vc, page_size, n_kv_heads, head_dim, pos, seq, block_table, max_pages, n, k, v
    if (dtype == CU_F32) CU_LAUNCH((kv_store_kernel<CU_F32>), g, 256, 0, c, KV_ARGS);
    else if (dtype == CU_F16) CU_LAUNCH((kv_store_kernel<CU_F16>), g, 256, 0, c, KV_ARGS);
    else CU_LAUNCH((kv_store_kernel<CU_BF16>), g, 256, 0, c, KV_ARGS);
#undef KV_ARGS
}

/* ---- rope and kv_store as one launch (cuda_fuse.c) ------------------------ */

/* Warps a block, and elements a lane (head_dim up to 32 * RS_MAX). */
#define RS_WARPS 4
#define RS_MAX 16

/* A warp a head: the q heads, then the k heads, then the v heads of a
 * token row (blockIdx.x), RS_WARPS of them a block (blockIdx.y).  The
 * block first computes the row's angles into shared memory, one each (the
 * unfused rope took every pair's double sincos once per head).  A q or k
 * head's warp loads it into registers, lane-strided, makes its norm
 * (qk_norm models) there, parks it in shared memory for the rotation's
 * partners, and writes each rotated element back in place and, for k,
 * into the cache; a v head's warp copies it into the cache.  Every value
 * is computed as rmsnorm_warp_kernel, rope_kernel and kv_store_kernel
 * compute it. */
template <int T>
__global__ void rope_store_kernel(cu_rope_store_args a) {
    extern __shared__ float sm[]; /* angles: [n_rot / 2] float2; then [RS_WARPS][d] */
    float2 *ang = (float2 *)sm;
    const int row = blockIdx.x, half = a.n_rot / 2, d = a.head_dim;
    const int nq = a.n_heads, nk = a.n_kv_heads;
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    const int unit = blockIdx.y * RS_WARPS + warp;
    const size_t per_row = (size_t)nk * d;
    float *x = unit < nq        ? a.q + ((size_t)row * nq + unit) * d
               : unit < nq + nk ? a.k + (size_t)row * per_row + (size_t)(unit - nq) * d
                                : NULL;
    /* Before the wait for the kernel before (PDL), what no kernel of the
     * burst writes: the step's positions and page table (uploaded before
     * the burst is recorded: cuda_upload flushes first) and the rope's
     * frequencies; so the angles' double sincos overlaps its tail. */
    cu_grid_trigger();
    for (int j = threadIdx.x; j < half; j += blockDim.x)
        ang[j] = rope_angle(a.pos[row], a.inv_freq[j], a.mscale);
    const long long slot = kv_slot(a.kv_pos[row], a.seq[row], a.block_table, a.max_pages,
                                   a.page_size);
    cu_grid_wait();
    float e[RS_MAX];
    if (x) {
#pragma unroll
        for (int t = 0; t < RS_MAX; t++)
            if (lane + 32 * t < d) e[t] = x[lane + 32 * t];
    }
    __syncthreads();
    if (!x) { /* a v head, or none */
        int h = unit - nq - nk;
        if (h >= nk || slot < 0) return;
        const float *v = a.v + (size_t)row * per_row + (size_t)h * d;
        for (int i = lane; i < d; i += 32)
            cu_store_elem<T>(a.vc, (size_t)slot * per_row + (size_t)h * d + i, v[i]);
        return;
    }
    const bool is_k = unit >= nq;
    if (a.q_norm) {
        const float *g = is_k ? a.k_norm : a.q_norm;
        float ss = 0.f;
#pragma unroll
        for (int t = 0; t < RS_MAX; t++)
            if (lane + 32 * t < d) ss = fmaf(e[t], e[t], ss);
        const float r = warp_rms_scale(ss, d, a.eps);
#pragma unroll
        for (int t = 0; t < RS_MAX; t++)
            if (lane + 32 * t < d) e[t] = e[t] * r * g[lane + 32 * t];
    }
    float *hs = sm + 2 * half + warp * d;
#pragma unroll
    for (int t = 0; t < RS_MAX; t++)
        if (lane + 32 * t < d) hs[lane + 32 * t] = e[t];
    __syncwarp();
    const size_t dst = (size_t)slot * per_row + (size_t)(unit - nq) * d;
#pragma unroll
    for (int t = 0; t < RS_MAX; t++) {
        const int i = lane + 32 * t;
        if (i >= d) break;
        float y = e[t];
        if (i < a.n_rot) { /* pair j; i its first or second element */
            const bool first = a.style == 0 ? !(i & 1) : i < half;
            const int j = a.style == 0 ? i >> 1 : first ? i : i - half;
            const int2 ab = rope_pair(a.style, j, half);
            y = first ? rope_first(hs[ab.x], hs[ab.y], ang[j])
                      : rope_second(hs[ab.x], hs[ab.y], ang[j]);
        }
        x[i] = y;
        if (is_k && slot >= 0) cu_store_elem<T>(a.kc, dst + i, y);
    }
}

extern "C" int cu_rope_store(const cu_ctx *c, const cu_rope_store_args *a) {
    if (a->n <= 0) return 0;
    if (a->head_dim > 32 * RS_MAX || a->n_rot > a->head_dim || (a->n_rot & 1)) return -1;
    size_t smem = sizeof(float) * ((size_t)a->n_rot + (size_t)RS_WARPS * a->head_dim);
    dim3 grid(a->n, CU_DIV_UP(a->n_heads + 2 * a->n_kv_heads, RS_WARPS));
    if (a->dtype == CU_F32) CU_LAUNCH((rope_store_kernel<CU_F32>), grid, 32 * RS_WARPS, smem, c, *a);
    else if (a->dtype == CU_F16) CU_LAUNCH((rope_store_kernel<CU_F16>), grid, 32 * RS_WARPS, smem, c, *a);
    else if (a->dtype == CU_BF16) CU_LAUNCH((rope_store_kernel<CU_BF16>), grid, 32 * RS_WARPS, smem, c, *a);
    else return -1;
    return 0;
}

/* ---- gather_rows ----------------------------------------------------------- */

__global__ void gather_rows_kernel(float *dst, const float *src, const int32_t *idx, int d) {
    cu_grid_trigger();
    cu_grid_wait();
    const float *s = src + (size_t)idx[blockIdx.x] * d;
    float *o = dst + (size_t)blockIdx.x * d;
    for (int c = threadIdx.x; c < d; c += blockDim.x) o[c] = s[c];
}

extern "C" void cu_gather_rows(const cu_ctx *c, float *dst, const float *src, const int32_t *idx,
                               int n, int d) {
    if (n <= 0 || d <= 0) return;
    CU_LAUNCH((gather_rows_kernel), n, 256, 0, c, dst, src, idx, d);
}

/* ---- argmax ------------------------------------------------------------------ */

/* (v, i) beats (bv, bi): larger, or as large and earlier.  v is never NaN
 * here (a NaN is never taken), so equal means equal. */
static __device__ __forceinline__ bool argmax_beats(float v, int i, float bv, int bi) {
    return v > bv || (v == bv && i < bi);
}

/* One block of 1024 threads per row.  Each thread walks its elements in
 * increasing order keeping the first of its largest (16-byte loads when the
 * row allows), then the block keeps the best (value, index) pair: the
 * sampler's argmax whatever the order of the reduction, since ties go to
 * the lower index.  A row with nothing above -inf keeps INT_MAX: 0. */
__global__ void __launch_bounds__(1024) argmax_kernel(int32_t *ids, const float *x, int d) {
    cu_grid_trigger();
    cu_grid_wait();
    const float *row = x + (size_t)blockIdx.x * d;
    float best = -INFINITY;
    int at = INT_MAX;
    if ((d & 3) == 0 && ((uintptr_t)row & 15) == 0) {
        const float4 *r4 = (const float4 *)row;
        for (int c = threadIdx.x; c < d / 4; c += blockDim.x) {
            float4 v = r4[c];
            if (v.x > best) best = v.x, at = 4 * c;
            if (v.y > best) best = v.y, at = 4 * c + 1;
            if (v.z > best) best = v.z, at = 4 * c + 2;
            if (v.w > best) best = v.w, at = 4 * c + 3;
        }
    } else {
        for (int c = threadIdx.x; c < d; c += blockDim.x)
            if (row[c] > best) best = row[c], at = c;
    }
    for (int o = 16; o > 0; o >>= 1) {
        float v = __shfl_xor_sync(0xffffffffu, best, o);
        int i = __shfl_xor_sync(0xffffffffu, at, o);
        if (argmax_beats(v, i, best, at)) best = v, at = i;
    }
    __shared__ float s_best[32];
    __shared__ int s_at[32];
    int warp = threadIdx.x / 32, lane = threadIdx.x & 31, n_warps = blockDim.x / 32;
    if (lane == 0) s_best[warp] = best, s_at[warp] = at;
    __syncthreads();
    if (warp) return;
    best = lane < n_warps ? s_best[lane] : -INFINITY;
    at = lane < n_warps ? s_at[lane] : INT_MAX;
    for (int o = 16; o > 0; o >>= 1) {
        float v = __shfl_xor_sync(0xffffffffu, best, o);
        int i = __shfl_xor_sync(0xffffffffu, at, o);
        if (argmax_beats(v, i, best, at)) best = v, at = i;
    }
    if (lane == 0) ids[blockIdx.x] = at == INT_MAX ? 0 : at;
}

extern "C" void cu_argmax(const cu_ctx *c, int32_t *ids, const float *x, int n, int d) {
    if (n <= 0 || d <= 0) return;
    CU_LAUNCH((argmax_kernel), n, 1024, 0, c, ids, x, d);
}

/* ---- read bandwidth -------------------------------------------------------- */

/* Streams the buffer with 16-byte loads, several in flight per thread, and
 * folds it into one number so the compiler keeps every load. */
__global__ void __launch_bounds__(512) read_kernel(const uint4 *src, size_t n16, float *out) {
    cu_grid_trigger();
    cu_grid_wait();
    uint32_t acc = 0;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n16; i += 4 * stride) {
        uint4 a = cu_ld_stream(src + i), b = cu_ld_stream(src + i + stride),
              c = cu_ld_stream(src + i + 2 * stride), d = cu_ld_stream(src + i + 3 * stride);
        acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^
               d.z ^ d.w;
    }
    for (; i < n16; i += stride) {
        uint4 a = cu_ld_stream(src + i);
        acc ^= a.x ^ a.y ^ a.z ^ a.w;
    }
    if (acc == 0x12345678u) out[0] = 1.f; /* practically never: keeps the loads */
}

extern "C" void cu_read_kernel(const cu_ctx *c, const void *src, size_t nbytes, float *out) {
    CU_LAUNCH((read_kernel), c->n_sm * 4, 512, 0, c, (const uint4 *)src, nbytes / 16, out);
}
