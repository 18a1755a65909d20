/*
 * attn_kvq.cu - quantized KV caches on the GPU: the encoder behind kv_store
 * and fused decode attention that reads packed keys and values directly.
 *
 * Formats are src/kv/kv_codec.h's: per (position, kv head) a row of packed
 * codes (LSB-first bitstream), fp16 scales, and fp16 zero points (TurboQuant
 * K) or biases (affine K and V).  TurboQuant values are stored rotated.
 *
 * Encoder (cu_kvq_store): one block per (token, kv head) row, one warp per
 * 32-group, lane = element.  It performs the reference's float32
 * operations in the reference's order with explicitly rounded intrinsics
 * (__fadd_rn, ...), so nvcc cannot contract them into FMAs, and the group
 * sums run as the same halving tree as src/kv/turboquant.c: its bytes must
 * equal the CPU encoder's bit for bit (the CPU's goldens then carry over).
 * Groups of 32 at head_dim 64, 128, 256 or 512 (cu_kvq_supported).
 *
 * Attention (cu_kvq_attention): flash-decoding straight from the packed
 * rows (no dequantized copy of the window); the block layout is described
 * above kvq_attn_kernel.  With one split the block un-rotates (TurboQuant)
 * and writes the row; otherwise each split leaves (accumulator, max, sum)
 * and kvq_combine_kernel merges them and applies the one inverse transform
 * per output row (the deferred transform).
 *
 * cuda_backend.c checks formats with cu_kvq_supported() when a cache is
 * created, so the launchers' -1 (a shape they do not take) is never seen
 * in practice; it is fatal there: no other kernel reads these bytes.
 */
#include <float.h>
#include <math.h>

#include "backend/cuda/cu_common.cuh"
#include "backend/cuda/cu_mma.cuh"
#include "backend/cuda/cuda_internal.h"

#define KVQ_AFFINE 1
#define KVQ_TURBO 2
#define KVQ_WARPS 4
#define KVQ_MAX_G 8
#define KVQ_LOG2E 1.4426950408889634f
#define F16_MAX 65504.0f

/* ---- shared helpers --------------------------------------------------------------- */

__device__ __forceinline__ uint16_t f16_bits(float x) {
    return __half_as_ushort(__float2half_rn(x));
}

__device__ __forceinline__ float f16_val(uint16_t h) {
    return __half2float(__ushort_as_half(h));
}

__device__ __forceinline__ bool f16_finite(uint16_t h) {
    return (h & 0x7c00) != 0x7c00;
}

/* Byte offset of (position p of sequence sq, kv head 0) for rows of row bytes. */
__device__ __forceinline__ size_t kvq_slot(const cu_kvq_args &a, int sq, int p, int row) {
    int32_t page = a.block_table[(size_t)sq * a.max_pages + p / a.page_size];
    return ((size_t)page * a.page_size + (size_t)(p % a.page_size)) * a.n_kv_heads * row;
}

__device__ __forceinline__ float clamp_f16_range(float v) {
    return isnan(v) ? 0.0f : fminf(fmaxf(v, -F16_MAX), F16_MAX);
}

__device__ __forceinline__ int to_code(float v, int lo, int hi) {
    if (isnan(v)) return lo > 0 ? lo : (hi < 0 ? hi : 0);
    v = rintf(v);
    return v < (float)lo ? lo : v > (float)hi ? hi : (int)v;
}

__device__ __forceinline__ float warp_min(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v = fminf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* The halving tree of turboquant.c (s[i] += s[i + h], h = 16 .. 1): lane 0
 * of a shfl_down reduction adds in exactly that order. */
__device__ __forceinline__ float warp_tree_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v = __fadd_rn(v, __shfl_down_sync(0xffffffffu, v, o));
    return __shfl_sync(0xffffffffu, v, 0);
}

/* Packs the warp's 32 codes (lane = element) into 4 * bits bytes at out. */
__device__ __forceinline__ void pack_group(int code, int bits, uint8_t *out) {
    const int lane = threadIdx.x & 31;
    if (bits == 8) {
        out[lane] = (uint8_t)code;
        return;
    }
    uint8_t byte = 0;
    for (int t = 0; t < 8; t++) {
        int sb = lane * 8 + t, e = sb / bits;
        int c = __shfl_sync(0xffffffffu, code, e & 31); /* every lane must shuffle */
        if (lane < 4 * bits) byte |= (uint8_t)(((c >> (sb % bits)) & 1) << t);
    }
    if (lane < 4 * bits) out[lane] = byte;
}

/* ---- encoder ------------------------------------------------------------------------- */

/* One key (or affine) group; lane = element.  Returns the lane's code and
 * the group's fp16 scale and zero point (or bias). */
__device__ void encode_affine_group(float x, int bits, bool turbo, int *code, uint16_t *s16,
                                    uint16_t *z16) {
    bool ok = __all_sync(0xffffffffu, isfinite(x));
    const bool sgn = turbo && bits == 8;
    const int lo = sgn ? -127 : 0, hi = sgn ? 127 : (1 << bits) - 1;
    if (!turbo) { /* affine: fp16 bias = min, scale rounded up, codes from stored values */
        float c = clamp_f16_range(x), mn = warp_min(c), mx = -warp_min(-c);
        *z16 = f16_bits(mn);
        float s = __fdiv_rn(__fsub_rn(mx, mn), (float)hi);
        uint16_t h = f16_bits(s);
        if (f16_val(h) < s) h++;
        *s16 = h;
        float b = f16_val(*z16), sh = f16_val(h);
        float q = sh > 0 ? rintf(__fdiv_rn(__fsub_rn(c, b), sh)) : 0.0f;
        *code = q < 0 ? 0 : q > (float)hi ? hi : (int)q;
        return;
    }
    if (ok) { /* the reference's float32 path (README 2a) */
        float mn = warp_min(x), mx = -warp_min(-x), scale, sp, zero;
        if (sgn) {
            scale = __fdiv_rn(__fsub_rn(mx, mn), 254.0f);
            sp = __fadd_rn(scale, 1e-8f);
            zero = rintf(__fdiv_rn(__fadd_rn(mx, mn), __fmul_rn(2.0f, sp)));
        } else {
            scale = __fdiv_rn(__fsub_rn(mx, mn), (float)hi);
            sp = __fadd_rn(scale, 1e-8f);
            zero = rintf(__fdiv_rn(mn, sp));
        }
        *code = to_code(__fsub_rn(__fdiv_rn(x, sp), zero), lo, hi);
        *s16 = f16_bits(scale);
        *z16 = f16_bits(zero);
        if (f16_finite(*s16) && f16_finite(*z16)) return;
    }
    /* Petrel's repair (turboquant.c key_group_repair) */
    float c = clamp_f16_range(x), mn = warp_min(c), mx = -warp_min(-c);
    float amax = fmaxf(fabsf(mn), fabsf(mx));
    float s = fmaxf(__fdiv_rn(__fsub_rn(mx, mn), (float)(hi - lo)), __fdiv_rn(amax, 1024.0f));
    uint16_t h = f16_bits(s);
    if (f16_val(h) < s) h++;
    float sh = f16_val(h);
    if (sh == 0) {
        *code = 0, *s16 = 0, *z16 = 0;
        return;
    }
    float zero =
        sgn ? rintf(__fdiv_rn(__fmul_rn(__fadd_rn(mx, mn), 0.5f), sh)) : rintf(__fdiv_rn(mn, sh));
    *code = to_code(__fsub_rn(__fdiv_rn(c, sh), zero), lo, hi);
    *s16 = h;
    *z16 = f16_bits(zero);
}

/* Group g of a key (or affine) row, by warp g. */
__device__ void encode_affine_row_group(const float *x, uint8_t *row, int d, int bits, bool turbo,
                                        int g) {
    const int lane = threadIdx.x & 31, ng = d / 32, codes = d * bits / 8;
    int code;
    uint16_t s16, z16;
    encode_affine_group(x[g * 32 + lane], bits, turbo, &code, &s16, &z16);
    pack_group(code, bits, row + g * 4 * bits);
    if (lane == 0) {
        row[codes + 2 * g] = (uint8_t)s16, row[codes + 2 * g + 1] = (uint8_t)(s16 >> 8);
        row[codes + 2 * ng + 2 * g] = (uint8_t)z16;
        row[codes + 2 * ng + 2 * g + 1] = (uint8_t)(z16 >> 8);
    }
}

/* TurboQuant value row by the whole block (thread = element, warp g =
 * group g): signs, FWHT in shared memory, per-group RMS, Lloyd-Max codes
 * (README 3a-3b), with turboquant.c's repairs.  sm: [d] for the transform,
 * then [(1 << bits) - 1] for the boundaries. */
__device__ void encode_turbo_v_row(const float *x, uint8_t *row, int d, int bits,
                                   const float *tables, float *sm) {
    const int i = threadIdx.x, lane = i & 31, g = i >> 5, codes = d * bits / 8, nb = (1 << bits) - 1;
    float *y = sm, *bnd = sm + d;
    for (int j = i; j < nb; j += d)
        bnd[j] = tables[d + (1 << bits) + j];
    const bool fin = __syncthreads_and(isfinite(x[i]));
    y[i] = __fmul_rn(fin ? x[i] : clamp_f16_range(x[i]), tables[i]);
    for (int h = 1; h < d; h *= 2) { /* butterflies of a stage are independent: any order */
        __syncthreads();
        if (i < d / 2) {
            int j = (i / h) * 2 * h + i % h;
            float a = y[j], b = y[j + h];
            y[j] = __fadd_rn(a, b);
            y[j + h] = __fsub_rn(a, b);
        }
    }
    __syncthreads();
    const float inv = (float)(1.0 / sqrt((double)d)); /* float32(1/sqrt(d)), as turboquant.c */
    float t = __fmul_rn(y[i], inv);
    float scale = __fsqrt_rn(__fmul_rn(warp_tree_sum(__fmul_rn(t, t)), 1.0f / 32.0f));
    uint16_t s16 = f16_bits(scale);
    if (!f16_finite(s16)) s16 = 0x7bff, scale = F16_MAX;
    float yn = __fdiv_rn(t, __fadd_rn(scale, 1e-8f));
    int lo = 0, hi = nb; /* boundaries strictly below yn; NaN -> 0 */
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (bnd[mid] < yn)
            lo = mid + 1;
        else
            hi = mid;
    }
    pack_group(lo, bits, row + g * 4 * bits);
    if (lane == 0) row[codes + 2 * g] = (uint8_t)s16, row[codes + 2 * g + 1] = (uint8_t)(s16 >> 8);
}

/* One block per (token, kv head) row, head_dim threads: warp g encodes
 * group g of K and V, so the groups of a row run side by side. */
__global__ void kvq_store_kernel(cu_kvq_args a, const float *k, const float *v) {
    cu_grid_trigger();
    cu_grid_wait();
    extern __shared__ float sm[]; /* turbo: [head_dim + 255] */
    const int item = blockIdx.x, t = item / a.n_kv_heads, kvh = item % a.n_kv_heads;
    const int d = a.head_dim, g = threadIdx.x >> 5;
    const int sq = a.seq[t], p = a.pos[t];
    const float *kx = k + (size_t)item * d, *vx = v + (size_t)item * d;
    uint8_t *krow = a.k + kvq_slot(a, sq, p, a.k_row) + (size_t)kvh * a.k_row;
    uint8_t *vrow = a.v + kvq_slot(a, sq, p, a.v_row) + (size_t)kvh * a.v_row;
    const bool turbo = a.kvq == KVQ_TURBO;
    encode_affine_row_group(kx, krow, d, a.k_bits, turbo, g);
    if (turbo)
        encode_turbo_v_row(vx, vrow, d, a.v_bits, a.tables, sm);
    else
        encode_affine_row_group(vx, vrow, d, a.v_bits, false, g);
}

/* ---- attention ------------------------------------------------------------------------- */

/* A block owns one query row t, one kv head and its G query heads, and one
 * split of the row's context; its KVQ_WARPS warps take turns on tiles of 32
 * positions.  A warp copies its next tile's packed K and V rows into its
 * own shared-memory buffer with cp.async while it works on the current one
 * (two buffers where they fit, else one), so the rows of a whole tile are
 * in flight at once and the arithmetic never waits on a single load.  Per
 * tile the warp
 *
 *   1. scores the 32 keys: lanes are split into lpk = head_dim / 16 lanes
 *      per key, 16 dims each (half a scale group), whose query values stay
 *      in registers for the whole walk: the lane forms
 *      sc * dot(q, codes) + off * sum(q) for every query head, the lpk
 *      lanes of a key add up, and the scores go to shared memory;
 *   2. runs the online softmax with lane = key (base 2, q pre-scaled by
 *      scale * log2 e), leaving each key's weight in shared memory;
 *   3. adds the weighted values: lanes are split into head_dim / 8 lanes
 *      per key (8 dims each; two chunks of 8 at head_dim 512), accumulating
 *      w * centroid[code] * scale (TurboQuant: the rotated domain) or
 *      w * (code * scale + bias) in registers.
 *
 * The code widths are template parameters of steps 1 and 3, dispatched by
 * a switch per tile: the K and V variants add up instead of multiplying. */

#define KVQ_TILE 32
#define KVQ_NCH(D) ((D) == 512 ? 2 : 1)   /* chunks of 8 dims per lane in P.V */
#define KVQ_MIN_CHUNK 64                  /* fewest positions a split takes */
#define KVQ_STAGE_MAX (100 << 10)         /* shared bytes per block up to which tiles are double-buffered */

/* Positions per split of a row with n_pos positions: a multiple of the
 * tile, so the warps of a block get whole tiles. */
__device__ __forceinline__ int kvq_chunk(int n_pos, int n_splits) {
    const int c = CU_DIV_UP(CU_DIV_UP(n_pos, n_splits), KVQ_TILE) * KVQ_TILE;
    return c > KVQ_MIN_CHUNK ? c : KVQ_MIN_CHUNK;
}

/* Slot index of position p; bt is the sequence's block-table row.  The
 * kernels pass slots around as 32 bits: 2^32 slots of even 16 bytes would
 * be 64 GiB per layer. */
__device__ __forceinline__ uint32_t kvq_slot_index(const int32_t *bt, int page_size, int p) {
    return (uint32_t)bt[p / page_size] * (uint32_t)page_size + (uint32_t)(p % page_size);
}

__device__ __forceinline__ float ld_half_al(const uint8_t *p) { /* 2-byte aligned */
    return __half2float(*(const __half *)p);
}

/* cp.async of CH bytes (4, 8 or 16; both addresses CH-aligned). */
template <int CH> __device__ __forceinline__ void cp_async(void *dst, const void *src) {
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    if (CH == 16)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src));
    else
        asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(d), "l"(src), "n"(CH));
}
__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::);
}
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

/* The warp copies rows (row bytes each) of the first n keys of a tile, key
 * j's from src + slot_j * stride (slot_j in lane j's slot_l), to dst + j *
 * row.  Rows keep their global alignment, so CH = the largest of 16, 8, 4
 * dividing row.  The n * cpr pieces of CH bytes are dealt to the lanes in
 * turn (piece c: row c / cpr, part c % cpr), so every lane copies on every
 * step: a loop over rows instead would leave most lanes idle and spend
 * more instructions on the copy than the kernels spend on the math. */
template <int CH>
__device__ __forceinline__ void stage_rows_ch(uint8_t *dst, const uint8_t *src, size_t stride,
                                              int row, uint32_t slot_l, int n) {
    const int lane = threadIdx.x & 31, cpr = row / CH, total = n * cpr;
    const int step_r = 32 / cpr, step_p = 32 % cpr;
    int r = lane / cpr, part = lane % cpr;
    for (int c0 = 0; c0 < total; c0 += 32) { /* uniform trip count: the shuffle needs all lanes */
        const uint32_t slot = __shfl_sync(0xffffffffu, slot_l, r & 31);
        if (c0 + lane < total)
            cp_async<CH>(dst + r * row + part * CH, src + (size_t)slot * stride + part * CH);
        r += step_r, part += step_p;
        if (part >= cpr) part -= cpr, r++;
    }
}

__device__ __forceinline__ void stage_rows(uint8_t *dst, const uint8_t *src, size_t stride, int row,
                                           uint32_t slot_l, int n) {
    if (row % 16 == 0) stage_rows_ch<16>(dst, src, stride, row, slot_l, n);
    else if (row % 8 == 0) stage_rows_ch<8>(dst, src, stride, row, slot_l, n);
    else stage_rows_ch<4>(dst, src, stride, row, slot_l, n);
}

/* A warp's walk over its block's split of the context (both attention
 * kernels): positions [p0, p1) of row t's sequence for KV head kvh, the
 * warp taking every KVQ_WARPS-th tile of KVQ_TILE keys, each copied into
 * one of its nbuf buffers (tile_bytes each, K rows then V rows) with
 * cp.async: with two, the next tile flies while this one is used. */
struct kvq_walk {
    const int32_t *bt;
    const uint8_t *kb, *vb;
    size_t kstride, vstride;
    int p0, p1, nbuf, tile_bytes, page_size, k_row, v_row;
    uint8_t *stage; /* this warp's buffers */

    __device__ kvq_walk(const cu_kvq_args &a, int t, int kvh, int split, int n_splits, int nbuf_,
                        uint8_t *region)
        : nbuf(nbuf_), page_size(a.page_size), k_row(a.k_row), v_row(a.v_row) {
        const int n_pos = a.pos[t] + 1, chunk = kvq_chunk(n_pos, n_splits);
        p0 = min(n_pos, split * chunk), p1 = min(n_pos, p0 + chunk);
        bt = a.block_table + (size_t)a.seq[t] * a.max_pages;
        kb = a.k + (size_t)kvh * a.k_row, vb = a.v + (size_t)kvh * a.v_row;
        kstride = (size_t)a.n_kv_heads * a.k_row, vstride = (size_t)a.n_kv_heads * a.v_row;
        tile_bytes = KVQ_TILE * (a.k_row + a.v_row);
        stage = region + (size_t)(threadIdx.x >> 5) * nbuf * tile_bytes;
    }
    __device__ int first() const { return p0 + (int)(threadIdx.x >> 5) * KVQ_TILE; }
    static constexpr int step = KVQ_WARPS * KVQ_TILE;

    /* Copies tile `base` into buffer b (the keys' slots come from its lanes). */
    __device__ void copy(int base, int b) const {
        const int lane = threadIdx.x & 31, n = min(KVQ_TILE, p1 - base);
        const uint32_t slot_l = lane < n ? kvq_slot_index(bt, page_size, base + lane) : 0;
        uint8_t *dst = stage + (size_t)b * tile_bytes;
        stage_rows(dst, kb, kstride, k_row, slot_l, n);
        stage_rows(dst + KVQ_TILE * k_row, vb, vstride, v_row, slot_l, n);
    }
    /* Before the walk: the first tile on its way (double-buffered). */
    __device__ void start() const {
        if (nbuf == 2 && first() < p1) copy(first(), 0);
        cp_async_commit();
    }
    /* Tile `base`, the it-th of the warp, in shared memory: its K rows
     * (V rows follow KVQ_TILE K rows on). */
    __device__ const uint8_t *wait(int base, int it) const {
        const int b = nbuf == 2 ? it & 1 : 0;
        if (nbuf == 2) {
            if (base + step < p1) copy(base + step, b ^ 1);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            copy(base, 0);
            cp_async_commit();
            cp_async_wait<0>();
        }
        __syncwarp();
        return stage + (size_t)b * tile_bytes;
    }
};

/* Code i of the LSB-first bitstream held in words w. */
template <int B, bool SGN> __device__ __forceinline__ float group_code(const uint32_t *w, int i) {
    const int bit = i * B, wi = bit >> 5, sh = bit & 31;
    uint32_t v = w[wi] >> sh;
    if (sh + B > 32) v |= w[wi + 1] << (32 - sh);
    if (B == 8 && SGN) return (float)(int)(int8_t)(v & 0xffu);
    return (float)(v & ((1u << B) - 1));
}

/* The 16 codes (B bits each, 2 * B bytes) at p into words w: 32-bit loads
 * for even B (p is then 4-byte aligned), 16-bit loads for odd. */
template <int B> __device__ __forceinline__ void load16_codes(const uint8_t *p, uint32_t *w) {
    if (B % 2 == 0) {
#pragma unroll
        for (int k = 0; k < B / 2; k++)
            w[k] = ((const uint32_t *)p)[k];
    } else {
#pragma unroll
        for (int k = 0; k < B; k++) {
            uint32_t h = ((const uint16_t *)p)[k];
            w[k / 2] = k % 2 ? w[k / 2] | h << 16 : h;
        }
    }
}

/* Step 1 for one tile: scores of its first n keys (rows at kst, row bytes
 * a.k_row) into ss[h * 32 + key]; -inf for the keys past n. */
template <int GM, int D, int B, bool TURBO>
__device__ __forceinline__ void kvq_score_tile(const cu_kvq_args &a, const uint8_t *kst, int n,
                                               const float (&q)[GM][16], const float (&qsum)[GM],
                                               float *ss) {
    constexpr bool SGN = TURBO && B == 8;
    constexpr int NW = (2 * B + 3) / 4; /* words holding 16 codes */
    constexpr int lpk = D / 16, kp = 32 / lpk, cb = D * B / 8, ng = D / 32;
    const int lane = threadIdx.x & 31, kpart = lane % lpk, kslot = lane / lpk, g = kpart >> 1;
#pragma unroll 4
    for (int j = 0; j < lpk; j++) {
        const int key = j * kp + kslot;
        const uint8_t *row = kst + (size_t)key * a.k_row;
        uint32_t w[NW];
        load16_codes<B>(row + kpart * 2 * B, w);
        const float sc = ld_half_al(row + cb + 2 * g), z = ld_half_al(row + cb + 2 * (ng + g));
        const float off = TURBO ? z * sc : z;
        float dot[GM];
#pragma unroll
        for (int h = 0; h < GM; h++)
            dot[h] = 0;
#pragma unroll
        for (int i = 0; i < 16; i++) {
            const float c = group_code<B, SGN>(w, i);
#pragma unroll
            for (int h = 0; h < GM; h++)
                dot[h] = fmaf(q[h][i], c, dot[h]);
        }
#pragma unroll
        for (int h = 0; h < GM; h++) {
            float s = fmaf(sc, dot[h], off * qsum[h]);
#pragma unroll
            for (int o = 1; o < lpk; o <<= 1)
                s += __shfl_xor_sync(0xffffffffu, s, o);
            if (kpart == 0) ss[h * 32 + key] = key < n ? s : -INFINITY;
        }
    }
}

/* The 8 codes (B bits each, B bytes) at p, as the low 8 * B bits. */
template <int B> __device__ __forceinline__ uint64_t load8_codes(const uint8_t *p) {
    if (B == 8) return *(const uint32_t *)p | (uint64_t)*(const uint32_t *)(p + 4) << 32;
    if (B == 4) return *(const uint32_t *)p;
    if (B == 2) return *(const uint16_t *)p;
    uint64_t v = 0;
#pragma unroll
    for (int k = 0; k < B; k++)
        v |= (uint64_t)p[k] << (8 * k);
    return v;
}

/* Step 3 for one tile: acc[h][c * 8 + i] += w[h][key] * V[key][dim] over
 * its first n keys (rows at vst, row bytes a.v_row), the lane's dims being
 * c * 256 + vpart * 8 + i. */
template <int GM, int D, int B, bool TURBO>
__device__ __forceinline__ void kvq_value_tile(const cu_kvq_args &a, const uint8_t *vst, int n,
                                               const float *ss, const float *cent,
                                               float (&acc)[GM][KVQ_NCH(D) * 8]) {
    constexpr int NCH = KVQ_NCH(D), lpv = D / (8 * NCH), kpv = 32 / lpv, cb = D * B / 8, ng = D / 32;
    const int lane = threadIdx.x & 31, vpart = lane % lpv, vslot = lane / lpv;
#pragma unroll 4
    for (int j = 0; j < lpv; j++) {
        const int key = j * kpv + vslot;
        if (key >= n) continue;
        const uint8_t *row = vst + (size_t)key * a.v_row;
        float wt[GM];
#pragma unroll
        for (int h = 0; h < GM; h++)
            wt[h] = ss[h * 32 + key];
#pragma unroll
        for (int c = 0; c < NCH; c++) {
            const int e0 = c * 256 + vpart * 8, g = e0 >> 5;
            const uint64_t cw64 = load8_codes<B>(row + e0 * B / 8);
            const uint32_t cw32 = (uint32_t)cw64; /* all 8 codes when B <= 4 */
            const float sc = ld_half_al(row + cb + 2 * g);
            const float bias = TURBO ? 0.0f : ld_half_al(row + cb + 2 * (ng + g));
            float ws[GM];
#pragma unroll
            for (int h = 0; h < GM; h++)
                ws[h] = TURBO ? wt[h] * sc : wt[h];
#pragma unroll
            for (int i = 0; i < 8; i++) {
                const uint32_t code =
                    (B <= 4 ? cw32 >> (i * B) : (uint32_t)(cw64 >> (i * B))) & ((1u << B) - 1);
                const float x = TURBO ? cent[code] : fmaf((float)code, sc, bias);
#pragma unroll
                for (int h = 0; h < GM; h++)
                    acc[h][c * 8 + i] = fmaf(ws[h], x, acc[h][c * 8 + i]);
            }
        }
    }
}

/* Per-tile dispatch on the code widths (uniform branches). */
template <int GM, int D>
__device__ __forceinline__ void kvq_scores(const cu_kvq_args &a, const uint8_t *kst, int n,
                                           const float (&q)[GM][16], const float (&qsum)[GM],
                                           float *ss) {
    if (a.kvq == KVQ_TURBO) {
        switch (a.k_bits) {
        case 8: kvq_score_tile<GM, D, 8, true>(a, kst, n, q, qsum, ss); break;
        case 5: kvq_score_tile<GM, D, 5, true>(a, kst, n, q, qsum, ss); break;
        case 4: kvq_score_tile<GM, D, 4, true>(a, kst, n, q, qsum, ss); break;
        default: kvq_score_tile<GM, D, 2, true>(a, kst, n, q, qsum, ss); break;
        }
    } else if (a.k_bits == 8) {
        kvq_score_tile<GM, D, 8, false>(a, kst, n, q, qsum, ss);
    } else {
        kvq_score_tile<GM, D, 4, false>(a, kst, n, q, qsum, ss);
    }
}

template <int GM, int D>
__device__ __forceinline__ void kvq_values(const cu_kvq_args &a, const uint8_t *vst, int n,
                                           const float *ss, const float *cent,
                                           float (&acc)[GM][KVQ_NCH(D) * 8]) {
    if (a.kvq == KVQ_TURBO) {
        switch (a.v_bits) {
        case 8: kvq_value_tile<GM, D, 8, true>(a, vst, n, ss, cent, acc); break;
        case 5: kvq_value_tile<GM, D, 5, true>(a, vst, n, ss, cent, acc); break;
        case 4: kvq_value_tile<GM, D, 4, true>(a, vst, n, ss, cent, acc); break;
        case 3: kvq_value_tile<GM, D, 3, true>(a, vst, n, ss, cent, acc); break;
        default: kvq_value_tile<GM, D, 2, true>(a, vst, n, ss, cent, acc); break;
        }
    } else if (a.v_bits == 8) {
        kvq_value_tile<GM, D, 8, false>(a, vst, n, ss, cent, acc);
    } else {
        kvq_value_tile<GM, D, 4, false>(a, vst, n, ss, cent, acc);
    }
}

/* In-place FWHT of y[d] by the whole block, then out = y * sign / sqrt(d) * mul. */
__device__ void block_unrotate(float *y, int d, const float *signs, float mul, float *out) {
    for (int h = 1; h < d; h *= 2) {
        __syncthreads();
        for (int k = threadIdx.x; k < d / 2; k += blockDim.x) {
            int i = (k / h) * 2 * h + k % h;
            float a = y[i], b = y[i + h];
            y[i] = a + b, y[i + h] = a - b;
        }
    }
    __syncthreads();
    const float inv = (float)(1.0 / sqrt((double)d));
    for (int i = threadIdx.x; i < d; i += blockDim.x)
        out[i] = y[i] * inv * signs[i] * mul;
    __syncthreads();
}

/* The end of a block's walk: the warps' results ws[warp][GM][d + 2] (the
 * accumulator of each head's dims, then its max and sum; max -inf for a
 * warp without positions) merged into the split's partial (several splits)
 * or, with one split, into the output rows, un-rotated (TurboQuant) or
 * normalized.  y (d floats) follows ws.  Every thread of the block calls
 * it, after the barrier that made ws visible. */
__device__ void kvq_block_merge(const cu_kvq_args &a, const float *ws, int GM, int G, int t,
                                int kvh, int split, int n_splits, float *part) {
    const int d = a.head_dim;
    float *y = (float *)ws + KVQ_WARPS * GM * (d + 2);
    if (n_splits > 1) { /* every (head, dim) at once, no more barriers */
        for (int e = threadIdx.x; e < G * d; e += blockDim.x) {
            const int h = e / d, i = e - h * d;
            float mx = -INFINITY, s = 0, lsum = 0;
            for (int wp = 0; wp < KVQ_WARPS; wp++)
                mx = fmaxf(mx, ws[((size_t)wp * GM + h) * (d + 2) + d]);
            for (int wp = 0; wp < KVQ_WARPS; wp++) {
                const float *w = ws + ((size_t)wp * GM + h) * (d + 2);
                if (w[d] == -INFINITY) continue; /* a warp without positions */
                const float c = exp2f(w[d] - mx);
                s += w[i] * c, lsum += w[d + 1] * c;
            }
            float *pp = part + (((size_t)split * a.n + t) * a.n_heads + kvh * G + h) * (d + 2);
            pp[i] = s;
            if (i == 0) pp[d] = mx, pp[d + 1] = lsum;
        }
        return;
    }
    for (int h = 0; h < G; h++) {
        float mx = -INFINITY, lsum = 0;
        for (int wp = 0; wp < KVQ_WARPS; wp++)
            mx = fmaxf(mx, ws[((size_t)wp * GM + h) * (d + 2) + d]);
        for (int wp = 0; wp < KVQ_WARPS; wp++) {
            const float *w = ws + ((size_t)wp * GM + h) * (d + 2);
            if (w[d] != -INFINITY) lsum += w[d + 1] * exp2f(w[d] - mx);
        }
        for (int i = threadIdx.x; i < d; i += blockDim.x) {
            float s = 0;
            for (int wp = 0; wp < KVQ_WARPS; wp++) {
                const float *w = ws + ((size_t)wp * GM + h) * (d + 2);
                if (w[d] != -INFINITY) s += w[i] * exp2f(w[d] - mx);
            }
            y[i] = s;
        }
        const int head = kvh * G + h;
        float *o = a.out + ((size_t)t * a.n_heads + head) * d;
        if (a.kvq == KVQ_TURBO) {
            block_unrotate(y, d, a.tables, 1.0f / lsum, o);
        } else {
            __syncthreads();
            for (int i = threadIdx.x; i < d; i += blockDim.x)
                o[i] = y[i] / lsum;
            __syncthreads();
        }
    }
}

/* Shared memory of the attention kernel, in bytes: q [GM][d], centroids
 * [256], scores [warps][GM][32] (floats), then one region that first holds
 * the warps' tile buffers [warps][nbuf][32 K rows, 32 V rows] and after the
 * walk the warp results [warps][GM][d + 2] and y [d]. */
static size_t kvq_attn_smem(int GM, int d, int k_row, int v_row, int nbuf) {
    size_t head = sizeof(float) * ((size_t)GM * d + 256 + (size_t)KVQ_WARPS * GM * 32);
    size_t stage = (size_t)KVQ_WARPS * nbuf * KVQ_TILE * (size_t)(k_row + v_row);
    size_t merge = sizeof(float) * ((size_t)KVQ_WARPS * GM * (d + 2) + d);
    return head + (stage > merge ? stage : merge);
}

/* Splits of a row's context: as many blocks as fit on the GPU at once
 * (three per SM: registers and shared memory allow no more), so a deep
 * context runs in one wave; a split takes at least KVQ_MIN_CHUNK
 * positions, so a short context uses the first few and the rest exit at
 * once (the depth lives on the device: the grid cannot depend on it, or a
 * CUDA graph could not replay it). */
static int kvq_splits(const cu_kvq_args *a, int n_sm) {
    int want = 3 * n_sm / (a->n * a->n_kv_heads);
    return want < 1 ? 1 : (want > 64 ? 64 : want);
}

template <int GM, int D>
__global__ void __launch_bounds__(KVQ_WARPS * 32, GM <= 4 ? 3 : 2)
    kvq_attn_kernel(cu_kvq_args a, int n_splits, int nbuf, float *part) {
    constexpr int NCH = KVQ_NCH(D), d = D;
    cu_grid_trigger();
    cu_grid_wait();
    extern __shared__ float4 sm4[];
    const int G = a.n_heads / a.n_kv_heads;
    const int t = blockIdx.x / a.n_kv_heads, kvh = blockIdx.x % a.n_kv_heads, split = blockIdx.y;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    float *qs = (float *)sm4, *cent = qs + GM * d, *ss = cent + 256 + warp * GM * 32;
    uint8_t *region = (uint8_t *)(cent + 256 + KVQ_WARPS * GM * 32); /* 16-byte aligned */

    const float qscale = a.scale * KVQ_LOG2E;
    for (int i = threadIdx.x; i < GM * d; i += blockDim.x) /* heads past G: zeros */
        qs[i] = i < G * d ? a.q[((size_t)t * a.n_heads + kvh * G) * d + i] * qscale : 0.0f;
    if (a.kvq == KVQ_TURBO)
        for (int i = threadIdx.x; i < (1 << a.v_bits); i += blockDim.x)
            cent[i] = a.tables[d + i];

    const kvq_walk w(a, t, kvh, split, n_splits, nbuf, region);
    if (w.p0 >= w.p1) return; /* a split past the context: the combine does not read it */
    w.start();
    __syncthreads(); /* q and the centroids */

    float q[GM][16], qsum[GM], m[GM], l[GM], acc[GM][NCH * 8];
    const int kpart = lane % (d >> 4);
#pragma unroll
    for (int h = 0; h < GM; h++) {
        float s = 0;
#pragma unroll
        for (int i = 0; i < 16; i++)
            q[h][i] = qs[h * d + kpart * 16 + i], s += q[h][i];
        qsum[h] = s, m[h] = -INFINITY, l[h] = 0;
#pragma unroll
        for (int e = 0; e < NCH * 8; e++)
            acc[h][e] = 0;
    }

    for (int base = w.first(), it = 0; base < w.p1; base += w.step, it++) {
        const uint8_t *kst = w.wait(base, it), *vst = kst + KVQ_TILE * a.k_row;
        const int n = min(KVQ_TILE, w.p1 - base);
        kvq_scores<GM, D>(a, kst, n, q, qsum, ss);
        __syncwarp();
#pragma unroll
        for (int h = 0; h < GM; h++) { /* online softmax, lane = key */
            float s = ss[h * 32 + lane], mx = fmaxf(m[h], cu_warp_max(s));
            float corr = exp2f(m[h] - mx), p = exp2f(s - mx); /* corr 0 on the first tile */
            l[h] = l[h] * corr + cu_warp_sum(p);
            m[h] = mx;
            ss[h * 32 + lane] = p;
#pragma unroll
            for (int e = 0; e < NCH * 8; e++)
                acc[h][e] *= corr;
        }
        __syncwarp();
        kvq_values<GM, D>(a, vst, n, ss, cent, acc);
        __syncwarp(); /* the buffer is refilled two tiles on */
    }
    cp_async_wait<0>();

    /* Lanes holding the same dims for different keys add up; then each
     * warp leaves (acc, m, l) per head for the merge, in the region the
     * tile buffers used (hence the barrier first). */
    const int lpv = d / (8 * NCH), vpart = lane % lpv;
#pragma unroll
    for (int h = 0; h < GM; h++)
#pragma unroll
        for (int e = 0; e < NCH * 8; e++)
            for (int o = lpv; o < 32; o <<= 1)
                acc[h][e] += __shfl_xor_sync(0xffffffffu, acc[h][e], o);
    __syncthreads();
    float *ws = (float *)region;
#pragma unroll
    for (int h = 0; h < GM; h++) { /* register arrays: constant indices only */
        float *w = ws + ((size_t)warp * GM + h) * (d + 2);
        if (h >= G) break;
        if (lane < lpv)
#pragma unroll
            for (int c = 0; c < NCH; c++)
#pragma unroll
                for (int i = 0; i < 8; i++)
                    w[c * 256 + vpart * 8 + i] = acc[h][c * 8 + i];
        if (lane == 0) w[d] = m[h], w[d + 1] = l[h];
    }
    __syncthreads();

    kvq_block_merge(a, ws, GM, G, t, kvh, split, n_splits, part);
}

/* ---- the tensor-core kernel: TurboQuant keys of 8 bits, values of 2-4 -------------- */

/* The kernel above is bound by its instructions, not by memory: per
 * cached (position, KV head) row it unpacks every code and runs an FMA per
 * query head (docs/kv-quant.md).  This one computes the same sums as
 * mma.sync products (f32 accumulation) on the
 * exact codes, for TurboQuant k8 with 2-, 3- or 4-bit values at head_dim
 * 64 or 128 (the common formats; the others keep the kernel above).  The
 * block, split and staging layout is the same; a warp takes tiles of 32
 * keys, and the scores never leave its registers.
 *
 *  - Scores, per 32-dim group: A = the query heads (G <= 8) in f16, their
 *    high parts in rows 0-7 and remainders in rows 8-15, so one product
 *    carries both (the two rows are summed after); B = 8 keys' codes, which
 *    are exact in f16 (a byte permute makes 1024 + 128 + code, minus 1152).
 *    The key's group scale and zero point then apply in f32, as above.
 *  - P·V, per 32-dim group: A = the probabilities times the key's value
 *    scale (an f16), split hi/lo the same way; B = the centroids of
 *    16 keys x 8 dims, looked up in a table of centroid pairs (the two
 *    keys a B register holds: one 64-bit shared load gives both their high
 *    and their low parts), multiplied once with each.
 *  - Within a group the dims may sit in any order along a product's inner
 *    (scores) or column (P·V) index, as long as both operands agree: a lane
 *    then reads 8 contiguous key bytes, and 4 contiguous value codes.
 *
 * The errors are those of the split operands (~2^-22 relative), like the
 * f16 cache's tensor-core kernel (attention.cu). */
#define KVQ_MMA_H 8 /* query heads a warp's products hold (rows 0-7 of A) */

/* Two f16 lanes 1024 + 128 + c from bytes (b, b + 1) of u, the signed codes
 * already biased by 128 (x ^ 0x80), minus 1152: (c_b, c_b+1) exactly. */
__device__ __forceinline__ uint32_t kvq_codes_f16x2(uint32_t u, int sel) {
    uint32_t x = __byte_perm(u, 0x64646464u, sel);
    __half2 h = __hsub2(*(__half2 *)&x, __floats2half2_rn(1152.0f, 1152.0f));
    return *(uint32_t *)&h;
}

template <int D, int VB>
__global__ void __launch_bounds__(KVQ_WARPS * 32, 3)
    kvq_mma_kernel(cu_kvq_args a, int n_splits, int nbuf, float *part) {
    constexpr int NG = D / 32, VMASK = (1 << VB) - 1;
    constexpr int KCB = D, VCB = D * VB / 8; /* code bytes of a K and a V row */
    cu_grid_trigger();
    cu_grid_wait();
    extern __shared__ float4 sm4[];
    const int G = a.n_heads / a.n_kv_heads;
    const int t = blockIdx.x / a.n_kv_heads, kvh = blockIdx.x % a.n_kv_heads, split = blockIdx.y;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g8 = lane >> 2, tq = lane & 3;
    float *qs = (float *)sm4, *qsum = qs + KVQ_MMA_H * D; /* qsum [8][NG] */
    uint2 *tab = (uint2 *)(qsum + KVQ_MMA_H * NG); /* [code of key 2t | code of key 2t+1 << VB] */
    uint4 *qf = (uint4 *)(tab + (1 << 2 * VB));    /* A of the scores [NG][2][lane] */
    uint8_t *region = (uint8_t *)(qf + NG * 2 * 32); /* 16-byte aligned */

    const float qscale = a.scale * KVQ_LOG2E;
    for (int i = threadIdx.x; i < KVQ_MMA_H * D; i += blockDim.x) /* heads past G: zeros */
        qs[i] = i < G * D ? a.q[((size_t)t * a.n_heads + kvh * G) * D + i] * qscale : 0.0f;
    for (int e = threadIdx.x; e < 1 << 2 * VB; e += blockDim.x) {
        uint32_t hi, lo;
        split2<CU_F16>(a.tables[D + (e & VMASK)], a.tables[D + (e >> VB)], hi, lo);
        tab[e] = make_uint2(hi, lo);
    }

    const kvq_walk w(a, t, kvh, split, n_splits, nbuf, region);
    if (w.p0 >= w.p1) return; /* a split past the context: the combine does not read it */
    w.start();
    __syncthreads(); /* q and the table */

    /* A of the scores, per group gr and k-step st, kept in shared memory
     * (registers hold the accumulators): lane (g8, tq) holds head g8's dims
     * gr * 32 + 8 tq + 4 st + {0, 1} (cols 2t..) and + {2, 3} (cols 2t + 8..).
     * Then each head's sum over each group (the zero points'). */
    for (int e = threadIdx.x; e < NG * 2 * 32; e += blockDim.x) {
        const int ln = e & 31, st = (e >> 5) & 1, gr = e >> 6;
        const float *q4 = qs + (ln >> 2) * D + gr * 32 + 8 * (ln & 3) + 4 * st;
        uint4 f;
        split2<CU_F16>(q4[0], q4[1], f.x, f.y);
        split2<CU_F16>(q4[2], q4[3], f.z, f.w);
        qf[e] = f;
    }
    for (int e = threadIdx.x; e < KVQ_MMA_H * NG; e += blockDim.x) {
        float s = 0;
        for (int i = 0; i < 32; i++)
            s += qs[(e / NG) * D + (e % NG) * 32 + i];
        qsum[e] = s;
    }
    __syncthreads();

    /* P·V accumulators, per group and n-tile i: rows g8 (high parts of head
     * g8's probabilities) and g8 + 8 (remainders), cols 2 tq and 2 tq + 1:
     * dims gr * 32 + 8 tq + i and gr * 32 + 8 tq + 4 + i. */
    float acc[NG][4][4];
#pragma unroll
    for (int gr = 0; gr < NG; gr++)
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                acc[gr][i][e] = 0;
    float m = -INFINITY, l = 0; /* head g8's max; the lane's part of its sum */

    for (int base = w.first(), it = 0; base < w.p1; base += w.step, it++) {
        const uint8_t *kst = w.wait(base, it), *vst = kst + KVQ_TILE * a.k_row;
        const int n = min(KVQ_TILE, w.p1 - base);

        /* Scores of head g8 for keys 8 j + 2 tq + {0, 1}. */
        float sc[4][2] = {{0, 0}, {0, 0}, {0, 0}, {0, 0}};
#pragma unroll
        for (int gr = 0; gr < NG; gr++) {
            const uint4 f0 = qf[(gr * 2) * 32 + lane], f1 = qf[(gr * 2 + 1) * 32 + lane];
            const uint32_t qa0[4] = {f0.x, f0.y, f0.z, f0.w}, qa1[4] = {f1.x, f1.y, f1.z, f1.w};
            const float qz = qsum[g8 * NG + gr];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const uint8_t *krow = kst + (size_t)(8 * j + g8) * a.k_row;
                const uint8_t *ka = kst + (size_t)(8 * j + 2 * tq) * a.k_row, *kb2 = ka + a.k_row;
                const uint2 w = *(const uint2 *)(krow + gr * 32 + 8 * tq);
                const uint32_t u0 = w.x ^ 0x80808080u, u1 = w.y ^ 0x80808080u;
                float c[4] = {0, 0, 0, 0};
                mma16816<CU_F16>(c, qa0, kvq_codes_f16x2(u0, 0x4140), kvq_codes_f16x2(u0, 0x4342));
                mma16816<CU_F16>(c, qa1, kvq_codes_f16x2(u1, 0x4140), kvq_codes_f16x2(u1, 0x4342));
                const float sa = ld_half_al(ka + KCB + 2 * gr), za = ld_half_al(ka + KCB + 2 * (NG + gr));
                const float sb = ld_half_al(kb2 + KCB + 2 * gr), zb = ld_half_al(kb2 + KCB + 2 * (NG + gr));
                sc[j][0] += fmaf(sa, c[0] + c[2], za * sa * qz);
                sc[j][1] += fmaf(sb, c[1] + c[3], zb * sb * qz);
            }
        }
#pragma unroll
        for (int j = 0; j < 4; j++) {
            if (8 * j + 2 * tq >= n) sc[j][0] = -INFINITY;
            if (8 * j + 2 * tq + 1 >= n) sc[j][1] = -INFINITY;
        }

        /* Online softmax of head g8 (its 4 lanes hold the tile's 32 keys). */
        float mx = m;
#pragma unroll
        for (int j = 0; j < 4; j++)
            mx = fmaxf(mx, fmaxf(sc[j][0], sc[j][1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float corr = exp2f(m - mx); /* 0 on the first tile */
        m = mx;
        float ps = 0;
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int e = 0; e < 2; e++)
                sc[j][e] = exp2f(sc[j][e] - mx), ps += sc[j][e];
        l = l * corr + ps;
#pragma unroll
        for (int gr = 0; gr < NG; gr++)
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    acc[gr][i][e] *= corr;

        /* P·V over the tile's two 16-key steps. */
#pragma unroll
        for (int u = 0; u < 2; u++) {
            const int k0 = 16 * u + 2 * tq; /* the lane's keys: k0, k0 + 1, k0 + 8, k0 + 9 */
            const uint8_t *vr[4] = {vst + (size_t)k0 * a.v_row, vst + (size_t)(k0 + 1) * a.v_row,
                                    vst + (size_t)(k0 + 8) * a.v_row, vst + (size_t)(k0 + 9) * a.v_row};
            const float pk[4] = {sc[2 * u][0], sc[2 * u][1], sc[2 * u + 1][0], sc[2 * u + 1][1]};
            const bool live[4] = {k0 < n, k0 + 1 < n, k0 + 8 < n, k0 + 9 < n};
#pragma unroll
            for (int gr = 0; gr < NG; gr++) {
                float pv[4];
                uint32_t f[4]; /* the key's codes of dims gr * 32 + 4 g8 .. + 3 */
                const int bit = 4 * VB * g8, wi = gr * VB + (bit >> 5), sh = bit & 31;
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    /* a key past n was never staged: its scale may be anything */
                    pv[k] = live[k] ? pk[k] * ld_half_al(vr[k] + VCB + 2 * gr) : 0.0f;
                    const uint32_t *w = (const uint32_t *)vr[k];
                    f[k] = VB == 3 ? __funnelshift_r(w[wi], w[wi + 1], sh) : w[wi] >> sh;
                }
                uint32_t pa[4];
                split2<CU_F16>(pv[0], pv[1], pa[0], pa[1]);
                split2<CU_F16>(pv[2], pv[3], pa[2], pa[3]);
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const uint2 e0 = tab[((f[0] >> (i * VB)) & VMASK) | ((f[1] >> (i * VB)) & VMASK) << VB];
                    const uint2 e1 = tab[((f[2] >> (i * VB)) & VMASK) | ((f[3] >> (i * VB)) & VMASK) << VB];
                    mma16816<CU_F16>(acc[gr][i], pa, e0.x, e1.x);
                    mma16816<CU_F16>(acc[gr][i], pa, e0.y, e1.y);
                }
            }
        }
        __syncwarp(); /* the buffer is refilled two tiles on */
    }
    cp_async_wait<0>();

    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    __syncthreads(); /* the tile buffers become the warps' results */
    float *ws = (float *)region;
    if (g8 < G) {
        float *w = ws + ((size_t)warp * KVQ_MMA_H + g8) * (D + 2);
#pragma unroll
        for (int gr = 0; gr < NG; gr++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                w[gr * 32 + 8 * tq + i] = acc[gr][i][0] + acc[gr][i][2];
                w[gr * 32 + 8 * tq + 4 + i] = acc[gr][i][1] + acc[gr][i][3];
            }
        if (tq == 0) w[D] = m, w[D + 1] = l;
    }
    __syncthreads();
    kvq_block_merge(a, ws, KVQ_MMA_H, G, t, kvh, split, n_splits, part);
}

/* Merges the splits of one (row, head) and applies the one inverse
 * transform (TurboQuant) or the normalization.  Only the splits that hold
 * positions are read; thread s takes split s's (max, sum), then each
 * thread sums its dims over the splits with the loads of eight in flight. */
__global__ void kvq_combine_kernel(cu_kvq_args a, int n_splits, const float *part) {
    cu_grid_trigger();
    cu_grid_wait();
    extern __shared__ float y[]; /* [head_dim], then the splits' weights [64] */
    __shared__ float red[2];
    const int d = a.head_dim, t = blockIdx.x / a.n_heads, head = blockIdx.x % a.n_heads;
    const int n_pos = a.pos[t] + 1, used = CU_DIV_UP(n_pos, kvq_chunk(n_pos, n_splits));
    const size_t sstride = (size_t)a.n * a.n_heads * (d + 2);
    const float *p0 = part + ((size_t)t * a.n_heads + head) * (d + 2);
    float *wsp = y + d;
    if (threadIdx.x < 32) { /* warp 0: max and sum over the splits (<= 64) */
        const int s0 = threadIdx.x, s1 = threadIdx.x + 32;
        float m0 = s0 < used ? p0[s0 * sstride + d] : -INFINITY;
        float m1 = s1 < used ? p0[s1 * sstride + d] : -INFINITY;
        float mx = cu_warp_max(fmaxf(m0, m1));
        float w0 = s0 < used ? exp2f(m0 - mx) : 0.0f, w1 = s1 < used ? exp2f(m1 - mx) : 0.0f;
        float l = cu_warp_sum((s0 < used ? w0 * p0[s0 * sstride + d + 1] : 0.0f) +
                              (s1 < used ? w1 * p0[s1 * sstride + d + 1] : 0.0f));
        wsp[s0] = w0, wsp[s1] = w1;
        if (threadIdx.x == 0) red[0] = l;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        float acc = 0;
#pragma unroll 8
        for (int sp = 0; sp < used; sp++)
            acc += p0[sp * sstride + i] * wsp[sp];
        y[i] = acc;
    }
    const float l = red[0];
    float *o = a.out + ((size_t)t * a.n_heads + head) * d;
    if (a.kvq == KVQ_TURBO) {
        block_unrotate(y, d, a.tables, 1.0f / l, o);
    } else {
        __syncthreads();
        for (int i = threadIdx.x; i < d; i += blockDim.x)
            o[i] = y[i] / l;
    }
}

/* ---- launchers ------------------------------------------------------------------------ */

extern "C" int cu_kvq_supported(int kvq, int k_bits, int v_bits, int group, int head_dim) {
    const bool dim_ok = head_dim == 64 || head_dim == 128 || head_dim == 256 || head_dim == 512;
    if (group != 32 || !dim_ok) return 0;
    if (kvq == KVQ_TURBO)
        return (k_bits == 2 || k_bits == 4 || k_bits == 5 || k_bits == 8) &&
               (v_bits == 2 || v_bits == 3 || v_bits == 4 || v_bits == 5 || v_bits == 8);
    return kvq == KVQ_AFFINE && (k_bits == 4 || k_bits == 8) && k_bits == v_bits;
}

/* Shared memory of the tensor-core kernel: q [8][d], its group sums
 * [8][d / 32], the centroid pair table, the scores' A fragments, then the
 * tile buffers or, after the walk, the warp results
 * [warps][8][d + 2] and y [d]. */
static size_t kvq_mma_smem(int d, int v_bits, int k_row, int v_row, int nbuf) {
    size_t head = sizeof(float) * KVQ_MMA_H * (d + d / 32) + sizeof(uint2) * ((size_t)1 << 2 * v_bits) +
                  sizeof(uint4) * (d / 32) * 2 * 32;
    size_t stage = (size_t)KVQ_WARPS * nbuf * KVQ_TILE * (size_t)(k_row + v_row);
    size_t merge = sizeof(float) * ((size_t)KVQ_WARPS * KVQ_MMA_H * (d + 2) + d);
    return head + (stage > merge ? stage : merge);
}

/* Whether the tensor-core kernel takes the cache (else the FMA kernel). */
static bool kvq_mma_ok(const cu_ctx *c, const cu_kvq_args *a) {
    return c->kvq_mma && a->kvq == KVQ_TURBO && a->k_bits == 8 && a->v_bits >= 2 &&
           a->v_bits <= 4 && (a->head_dim == 64 || a->head_dim == 128);
}

static bool kvq_shape_ok(const cu_kvq_args *a) {
    int G = a->n_kv_heads > 0 ? a->n_heads / a->n_kv_heads : 0;
    return cu_kvq_supported(a->kvq, a->k_bits, a->v_bits, a->group, a->head_dim) && G >= 1 &&
           G <= KVQ_MAX_G && a->n_heads % a->n_kv_heads == 0 && a->k_row % 4 == 0 &&
           a->v_row % 4 == 0;
}

#define KVQ_FOR_EACH_KERNEL(X)                                                                     \
    X(1, 64) X(2, 64) X(4, 64) X(8, 64) X(1, 128) X(2, 128) X(4, 128) X(8, 128) X(1, 256)          \
        X(2, 256) X(4, 256) X(8, 256) X(1, 512) X(2, 512) X(4, 512) X(8, 512)

#define KVQ_FOR_EACH_MMA_KERNEL(Y) Y(64, 2) Y(64, 3) Y(64, 4) Y(128, 2) Y(128, 3) Y(128, 4)

/* Shared memory beyond 48 KiB needs an opt-in, per kernel and device. */
extern "C" void cu_kvq_init(cu_ctx *c) {
    int dev = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&c->smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
#define X(gm, dim)                                                                                 \
    cudaFuncSetAttribute(kvq_attn_kernel<gm, dim>, cudaFuncAttributeMaxDynamicSharedMemorySize,    \
                         c->smem_optin);
    KVQ_FOR_EACH_KERNEL(X)
#undef X
#define Y(dim, vb)                                                                                 \
    cudaFuncSetAttribute(kvq_mma_kernel<dim, vb>, cudaFuncAttributeMaxDynamicSharedMemorySize,     \
                         c->smem_optin);
    KVQ_FOR_EACH_MMA_KERNEL(Y)
#undef Y
}

extern "C" int cu_kvq_store(const cu_ctx *c, const cu_kvq_args *a, const float *k, const float *v) {
    if (!kvq_shape_ok(a)) return -1;
    if (a->n <= 0) return 0;
    const size_t smem = sizeof(float) * (size_t)(a->head_dim + 255);
    CU_LAUNCH(kvq_store_kernel, dim3(a->n * a->n_kv_heads), dim3(a->head_dim), smem, c, *a, k, v);
    return 0;
}

extern "C" size_t cu_kvq_attention_scratch(const cu_kvq_args *a, int n_sm) {
    int splits = kvq_splits(a, n_sm);
    return splits > 1 ? sizeof(float) * (size_t)splits * a->n * a->n_heads * (a->head_dim + 2) : 0;
}

extern "C" int cu_kvq_attention(const cu_ctx *c, const cu_kvq_args *a, int n_sm, void *scratch) {
    if (!kvq_shape_ok(a)) return -1;
    if (a->n <= 0) return 0;
    int splits = kvq_splits(a, n_sm), G = a->n_heads / a->n_kv_heads;
    if (splits > 1 && !scratch) splits = 1;
    const bool mma = kvq_mma_ok(c, a);
    const int gm = G <= 1 ? 1 : G <= 2 ? 2 : G <= 4 ? 4 : 8;
    int nbuf = 2; /* double-buffered tiles while they fit KVQ_STAGE_MAX */
    size_t smem = mma ? kvq_mma_smem(a->head_dim, a->v_bits, a->k_row, a->v_row, nbuf)
                      : kvq_attn_smem(gm, a->head_dim, a->k_row, a->v_row, nbuf);
    if (smem > KVQ_STAGE_MAX) {
        nbuf = 1;
        smem = mma ? kvq_mma_smem(a->head_dim, a->v_bits, a->k_row, a->v_row, nbuf)
                   : kvq_attn_smem(gm, a->head_dim, a->k_row, a->v_row, nbuf);
    }
    if (c->smem_optin && smem > (size_t)c->smem_optin) return -1;
    const dim3 grid(a->n * a->n_kv_heads, splits), block(KVQ_WARPS * 32);
    float *part = (float *)scratch;
#define X(g_, d_)                                                                                  \
    if (!mma && gm == g_ && a->head_dim == d_)                                                     \
        CU_LAUNCH((kvq_attn_kernel<g_, d_>), grid, block, smem, c, *a, splits, nbuf, part);
    KVQ_FOR_EACH_KERNEL(X)
#undef X
#define Y(d_, vb_)                                                                                 \
    if (mma && a->head_dim == d_ && a->v_bits == vb_)                                              \
        CU_LAUNCH((kvq_mma_kernel<d_, vb_>), grid, block, smem, c, *a, splits, nbuf, part);
    KVQ_FOR_EACH_MMA_KERNEL(Y)
#undef Y
    if (splits > 1)
        CU_LAUNCH(kvq_combine_kernel, dim3(a->n * a->n_heads), dim3(128),
                  sizeof(float) * (a->head_dim + 64), c, *a, splits, (const float *)part);
    return 0;
}
