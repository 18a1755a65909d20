/*
 * attn_kvq.cu - quantized KV caches on the GPU: the encoder behind kv_store
 * and fused decode attention that reads packed keys and values directly.
 *
 * Formats are src/kv/kv_codec.h's: per (position, kv head) a row of packed
 * codes (LSB-first bitstream), fp16 scales, and fp16 zero points (TurboQuant
 * K) or biases (affine K and V).  TurboQuant values are stored rotated.
 *
 * Encoder (cu_kvq_store): one warp per (token, kv head) row; lane = element
 * of a 32-group.  It performs the reference's float32 operations in the
 * reference's order with explicitly rounded intrinsics (__fadd_rn, ...), so
 * nvcc cannot contract them into FMAs, and the group sums run as the same
 * halving tree as src/kv/turboquant.c: its bytes must equal the CPU
 * encoder's bit for bit (the CPU's goldens then carry over).  Group size 32
 * only (head dims 64..512 for TurboQuant; affine head dims that 32 divides).
 *
 * Attention (cu_kvq_attention): flash-decoding.  A block (4 warps) owns one
 * query row, one kv head and its G <= 8 query heads, and one split of the
 * context.  Each warp walks tiles of 32 keys: lane = key for the scores
 * (it dequantizes its key's codes in registers: x = code * scale + offset),
 * online softmax in base 2, then lane = head_dim / 32 dims for P.V, adding
 * w * centroid[code] * scale (TurboQuant: the rotated domain) or
 * w * (code * scale + bias).  Warps merge in shared memory; with one split
 * the block un-rotates and writes the row, otherwise each split writes its
 * (accumulator, max, sum) and cu_kvq_combine merges them and applies the
 * one inverse transform per output row (the deferred transform).
 *
 * Host side, what cuda_backend.c needs to call these (declarations below;
 * they belong in cuda_internal.h): build a cu_kvq_args from the pt_kv_view
 * (kvq, k_bits, v_bits, group, k_row, v_row, tables) and the batch, then
 * cu_kvq_store() in kv_store and cu_kvq_attention() with
 * cu_kvq_attention_scratch() bytes of device scratch in attention, after
 * cu_kvq_init() once per device before any capture.  Both
 * return -1 for shapes they do not take (group != 32, head_dim > 512,
 * G > 8); those must fail loudly, there is no f16 fallback for these bytes.
 */
#include <float.h>
#include <math.h>

#include "backend/cuda/cu_common.cuh"

extern "C" {

typedef struct cu_kvq_args {
    float *out;          /* [n][n_heads][head_dim] */
    const float *q;      /* [n][n_heads][head_dim] */
    uint8_t *k, *v;      /* the layer's paged rows */
    const float *tables; /* TurboQuant: signs [head_dim], centroids [1 << v_bits],
                            boundaries [(1 << v_bits) - 1] */
    int kvq;             /* 1 affine, 2 TurboQuant (enum pt_kvq_kind) */
    int k_bits, v_bits, group, k_row, v_row;
    int page_size, n_kv_heads, head_dim;
    const int32_t *pos, *seq, *block_table;
    int max_pages, n, n_heads;
    float scale;
} cu_kvq_args;

/* Sets kernel attributes; once per device, before any capture. */
void cu_kvq_init(void);
int cu_kvq_store(cudaStream_t s, const cu_kvq_args *a, const float *k, const float *v);
size_t cu_kvq_attention_scratch(const cu_kvq_args *a, int n_sm);
int cu_kvq_attention(cudaStream_t s, const cu_kvq_args *a, int n_sm, void *scratch);
}

#define KVQ_AFFINE 1
#define KVQ_TURBO 2
#define KVQ_WARPS 4
#define KVQ_MAX_G 8
#define KVQ_MAX_DPL 16 /* head_dim 512 / 32 lanes */
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

__device__ __forceinline__ float ld_f16(const uint8_t *p) {
    uint16_t h = (uint16_t)(p[0] | (p[1] << 8)); /* rows are only byte-aligned */
    return f16_val(h);
}

/* Byte offset of (position p of sequence sq, kv head 0) for rows of row bytes. */
__device__ __forceinline__ size_t kvq_slot(const cu_kvq_args &a, int sq, int p, int row) {
    int32_t page = a.block_table[(size_t)sq * a.max_pages + p / a.page_size];
    return ((size_t)page * a.page_size + (size_t)(p % a.page_size)) * a.n_kv_heads * row;
}

/* Code e of a bitstream (8-bit codes are bytes, signed when sgn). */
__device__ __forceinline__ int get_code(const uint8_t *codes, int e, int bits, bool sgn) {
    if (bits == 8) return sgn ? (int)(int8_t)codes[e] : (int)codes[e];
    int bit = e * bits, byte = bit >> 3, sh = bit & 7;
    uint32_t w = codes[byte] | ((uint32_t)codes[byte + 1] << 8); /* b <= 5: two bytes hold it */
    return (int)((w >> sh) & ((1u << bits) - 1));
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

__device__ void encode_affine_row(const float *x, uint8_t *row, int d, int bits, bool turbo) {
    const int lane = threadIdx.x & 31, ng = d / 32, codes = d * bits / 8;
    for (int g = 0; g < ng; g++) {
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
}

/* TurboQuant value row: signs, FWHT in shared memory, per-group RMS,
 * Lloyd-Max codes (README 3a-3b), with turboquant.c's repairs. */
__device__ void encode_turbo_v_row(const float *x, uint8_t *row, int d, int bits,
                                   const float *tables, float *y) {
    const int lane = threadIdx.x & 31, ng = d / 32, codes = d * bits / 8, nb = (1 << bits) - 1;
    const float *signs = tables, *bnd = tables + d + (1 << bits);
    bool fin = true;
    for (int i = lane; i < d; i += 32)
        fin &= isfinite(x[i]);
    fin = __all_sync(0xffffffffu, fin);
    for (int i = lane; i < d; i += 32)
        y[i] = __fmul_rn(fin ? x[i] : clamp_f16_range(x[i]), signs[i]);
    __syncwarp();
    for (int h = 1; h < d; h *= 2) {
        for (int k = lane; k < d / 2; k += 32) {
            int i = (k / h) * 2 * h + k % h;
            float a = y[i], b = y[i + h];
            y[i] = __fadd_rn(a, b);
            y[i + h] = __fsub_rn(a, b);
        }
        __syncwarp();
    }
    const float inv = (float)(1.0 / sqrt((double)d)); /* float32(1/sqrt(d)), as turboquant.c */
    for (int g = 0; g < ng; g++) {
        float t = __fmul_rn(y[g * 32 + lane], inv);
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
        if (lane == 0)
            row[codes + 2 * g] = (uint8_t)s16, row[codes + 2 * g + 1] = (uint8_t)(s16 >> 8);
    }
}

__global__ void kvq_store_kernel(cu_kvq_args a, const float *k, const float *v) {
    cu_grid_trigger();
    cu_grid_wait();
    extern __shared__ float ybuf[]; /* [warps][head_dim] */
    const int warp = threadIdx.x >> 5, item = blockIdx.x * (blockDim.x >> 5) + warp;
    if (item >= a.n * a.n_kv_heads) return;
    const int t = item / a.n_kv_heads, g = item % a.n_kv_heads, d = a.head_dim;
    const int sq = a.seq[t], p = a.pos[t];
    const float *kx = k + (size_t)item * d, *vx = v + (size_t)item * d;
    uint8_t *krow = a.k + kvq_slot(a, sq, p, a.k_row) + (size_t)g * a.k_row;
    uint8_t *vrow = a.v + kvq_slot(a, sq, p, a.v_row) + (size_t)g * a.v_row;
    const bool turbo = a.kvq == KVQ_TURBO;
    encode_affine_row(kx, krow, d, a.k_bits, turbo);
    if (turbo)
        encode_turbo_v_row(vx, vrow, d, a.v_bits, a.tables, ybuf + (size_t)warp * d);
    else
        encode_affine_row(vx, vrow, d, a.v_bits, false);
}

/* ---- attention ------------------------------------------------------------------------- */

/* Scratch per split: [n][n_heads][head_dim + 2] (accumulator, max, sum). */
/* Splits of the context so that the grid fills the GPU twice over; the
 * positions live on the device, so a split may come out empty (handled). */
static int kvq_splits(const cu_kvq_args *a, int n_sm) {
    int want = CU_DIV_UP(2 * n_sm, a->n * a->n_kv_heads);
    return want < 1 ? 1 : (want > 32 ? 32 : want);
}

struct kvq_warp_state {
    float m[KVQ_MAX_G], l[KVQ_MAX_G];
    float acc[KVQ_MAX_G][KVQ_MAX_DPL];
};

/* Scores of the lane's key (position p) against the G queries in qs. */
__device__ __forceinline__ void key_scores(const cu_kvq_args &a, const uint8_t *row,
                                           const float *qs, int G, float *s) {
    const int d = a.head_dim, ng = d / 32, kc = d * a.k_bits / 8;
    const bool turbo = a.kvq == KVQ_TURBO, sgn = turbo && a.k_bits == 8;
    for (int h = 0; h < G; h++)
        s[h] = 0;
    for (int g = 0; g < ng; g++) {
        float sc = ld_f16(row + kc + 2 * g), z = ld_f16(row + kc + 2 * (ng + g));
        float off = turbo ? z * sc : z;
        for (int i = g * 32; i < g * 32 + 32; i++) {
            float x = fmaf((float)get_code(row, i, a.k_bits, sgn), sc, off);
            for (int h = 0; h < G; h++)
                s[h] = fmaf(qs[h * d + i], x, s[h]);
        }
    }
}

/* Adds w[h] * V(row) to the lane's dims [lane * dpl, lane * dpl + dpl). */
__device__ __forceinline__ void value_accum(const cu_kvq_args &a, const uint8_t *row,
                                            const float *cent, const float *w, int G,
                                            kvq_warp_state &st) {
    const int lane = threadIdx.x & 31, d = a.head_dim, dpl = d / 32, ng = d / 32;
    const int vc = d * a.v_bits / 8, g = lane * dpl / 32;
    const bool turbo = a.kvq == KVQ_TURBO;
    float sc = ld_f16(row + vc + 2 * g), b = turbo ? 0.0f : ld_f16(row + vc + 2 * (ng + g));
    for (int k = 0; k < dpl; k++) {
        int c = get_code(row, lane * dpl + k, a.v_bits, false);
        float x = turbo ? cent[c] * sc : fmaf((float)c, sc, b);
        for (int h = 0; h < G; h++)
            st.acc[h][k] = fmaf(w[h], x, st.acc[h][k]);
    }
}

/* Walks this warp's tiles of [p0, p1) for row t, kv head kvh. */
__device__ void warp_walk(const cu_kvq_args &a, int t, int kvh, int p0, int p1, const float *qs,
                          const float *cent, int G, kvq_warp_state &st) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, sq = a.seq[t];
    for (int h = 0; h < G; h++) {
        st.m[h] = -INFINITY, st.l[h] = 0;
        for (int k = 0; k < KVQ_MAX_DPL; k++)
            st.acc[h][k] = 0;
    }
    for (int base = p0 + warp * 32; base < p1; base += KVQ_WARPS * 32) {
        int p = base + lane;
        float s[KVQ_MAX_G];
        if (p < p1) {
            const uint8_t *krow = a.k + kvq_slot(a, sq, p, a.k_row) + (size_t)kvh * a.k_row;
            key_scores(a, krow, qs, G, s);
        } else {
            for (int h = 0; h < G; h++)
                s[h] = -INFINITY;
        }
        float w[KVQ_MAX_G];
        for (int h = 0; h < G; h++) {
            float mx = fmaxf(st.m[h], cu_warp_max(s[h]));
            float corr = exp2f(st.m[h] - mx); /* 0 on the first tile */
            w[h] = exp2f(s[h] - mx);
            st.l[h] = st.l[h] * corr + cu_warp_sum(w[h]);
            for (int k = 0; k < KVQ_MAX_DPL; k++)
                st.acc[h][k] *= corr;
            st.m[h] = mx;
        }
        int n_keys = min(32, p1 - base);
        for (int j = 0; j < n_keys; j++) {
            float wj[KVQ_MAX_G];
            for (int h = 0; h < G; h++)
                wj[h] = __shfl_sync(0xffffffffu, w[h], j);
            const uint8_t *vrow = a.v + kvq_slot(a, sq, base + j, a.v_row) + (size_t)kvh * a.v_row;
            value_accum(a, vrow, cent, wj, G, st);
        }
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

/* Shared memory: q [G][d], centroids [256], warp states [warps][G][d + 2], y [d]. */
static size_t kvq_attn_smem(int G, int d) {
    return sizeof(float) * ((size_t)G * d + 256 + (size_t)KVQ_WARPS * G * (d + 2) + d);
}

__global__ void __launch_bounds__(KVQ_WARPS * 32)
    kvq_attn_kernel(cu_kvq_args a, int n_splits, float *part) {
    cu_grid_trigger();
    cu_grid_wait();
    extern __shared__ float sm[];
    const int d = a.head_dim, G = a.n_heads / a.n_kv_heads, dpl = d / 32;
    const int t = blockIdx.x / a.n_kv_heads, kvh = blockIdx.x % a.n_kv_heads, split = blockIdx.y;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    float *qs = sm, *cent = qs + G * d, *ws = cent + 256, *y = ws + KVQ_WARPS * G * (d + 2);
    const float qscale = a.scale * KVQ_LOG2E;
    for (int i = threadIdx.x; i < G * d; i += blockDim.x)
        qs[i] = a.q[((size_t)t * a.n_heads + kvh * G) * d + i] * qscale;
    if (a.kvq == KVQ_TURBO)
        for (int i = threadIdx.x; i < (1 << a.v_bits); i += blockDim.x)
            cent[i] = a.tables[d + i];
    __syncthreads();

    const int n_pos = a.pos[t] + 1, chunk = CU_DIV_UP(n_pos, n_splits);
    const int p0 = min(n_pos, split * chunk), p1 = min(n_pos, p0 + chunk);
    kvq_warp_state st;
    warp_walk(a, t, kvh, p0, p1, qs, cent, G, st);

    /* merge the warps: each writes (acc, m, l) per head, warp 0's lanes sum */
    for (int h = 0; h < G; h++) {
        float *w = ws + ((size_t)warp * G + h) * (d + 2);
        for (int k = 0; k < dpl; k++)
            w[lane * dpl + k] = st.acc[h][k];
        if (lane == 0) w[d] = st.m[h], w[d + 1] = st.l[h];
    }
    __syncthreads();
    for (int h = 0; h < G; h++) {
        float mx = -INFINITY, l = 0;
        for (int wp = 0; wp < KVQ_WARPS; wp++)
            mx = fmaxf(mx, ws[((size_t)wp * G + h) * (d + 2) + d]);
        for (int wp = 0; wp < KVQ_WARPS; wp++) {
            const float *w = ws + ((size_t)wp * G + h) * (d + 2);
            l += w[d + 1] * (w[d] == -INFINITY ? 0.0f : exp2f(w[d] - mx));
        }
        for (int i = threadIdx.x; i < d; i += blockDim.x) {
            float acc = 0;
            for (int wp = 0; wp < KVQ_WARPS; wp++) {
                const float *w = ws + ((size_t)wp * G + h) * (d + 2);
                if (w[d] != -INFINITY) acc += w[i] * exp2f(w[d] - mx);
            }
            y[i] = acc;
        }
        const int head = kvh * G + h;
        if (n_splits > 1) {
            float *pp = part + (((size_t)split * a.n + t) * a.n_heads + head) * (d + 2);
            for (int i = threadIdx.x; i < d; i += blockDim.x)
                pp[i] = y[i];
            if (threadIdx.x == 0) pp[d] = mx, pp[d + 1] = l;
            __syncthreads();
            continue;
        }
        float *o = a.out + ((size_t)t * a.n_heads + head) * d;
        if (a.kvq == KVQ_TURBO) {
            block_unrotate(y, d, a.tables, 1.0f / l, o);
        } else {
            __syncthreads();
            for (int i = threadIdx.x; i < d; i += blockDim.x)
                o[i] = y[i] / l;
            __syncthreads();
        }
    }
}

/* Merges the splits of one (row, head) and applies the one inverse
 * transform (TurboQuant) or the normalization. */
__global__ void kvq_combine_kernel(cu_kvq_args a, int n_splits, const float *part) {
    cu_grid_trigger();
    cu_grid_wait();
    extern __shared__ float y[];
    const int d = a.head_dim, t = blockIdx.x / a.n_heads, head = blockIdx.x % a.n_heads;
    float mx = -INFINITY, l = 0;
    for (int sp = 0; sp < n_splits; sp++)
        mx = fmaxf(mx, part[(((size_t)sp * a.n + t) * a.n_heads + head) * (d + 2) + d]);
    for (int i = threadIdx.x; i < d; i += blockDim.x)
        y[i] = 0;
    for (int sp = 0; sp < n_splits; sp++) {
        const float *pp = part + (((size_t)sp * a.n + t) * a.n_heads + head) * (d + 2);
        if (pp[d] == -INFINITY) continue; /* an empty split */
        float w = exp2f(pp[d] - mx);
        l += w * pp[d + 1];
        for (int i = threadIdx.x; i < d; i += blockDim.x)
            y[i] += w * pp[i];
    }
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

static bool kvq_shape_ok(const cu_kvq_args *a) {
    int G = a->n_kv_heads > 0 ? a->n_heads / a->n_kv_heads : 0;
    return a->group == 32 && a->head_dim % 32 == 0 && a->head_dim >= 32 && a->head_dim <= 512 &&
           G >= 1 && G <= KVQ_MAX_G && a->n_heads % a->n_kv_heads == 0 &&
           (a->kvq == KVQ_TURBO || a->kvq == KVQ_AFFINE);
}

/* Shared memory beyond 48 KiB (G = 8 at head_dim 512) needs an opt-in. */
extern "C" void cu_kvq_init(void) {
    cudaFuncSetAttribute(kvq_attn_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         (int)kvq_attn_smem(KVQ_MAX_G, 512));
}

extern "C" int cu_kvq_store(cudaStream_t s, const cu_kvq_args *a, const float *k, const float *v) {
    if (!kvq_shape_ok(a)) return -1;
    if (a->n <= 0) return 0;
    const int warps = 4, items = a->n * a->n_kv_heads;
    size_t smem = sizeof(float) * (size_t)warps * a->head_dim;
    CU_LAUNCH(kvq_store_kernel, dim3(CU_DIV_UP(items, warps)), dim3(warps * 32), smem, s, *a, k, v);
    return 0;
}

extern "C" size_t cu_kvq_attention_scratch(const cu_kvq_args *a, int n_sm) {
    int splits = kvq_splits(a, n_sm);
    return splits > 1 ? sizeof(float) * (size_t)splits * a->n * a->n_heads * (a->head_dim + 2) : 0;
}

extern "C" int cu_kvq_attention(cudaStream_t s, const cu_kvq_args *a, int n_sm, void *scratch) {
    if (!kvq_shape_ok(a)) return -1;
    if (a->n <= 0) return 0;
    int splits = kvq_splits(a, n_sm), G = a->n_heads / a->n_kv_heads;
    if (splits > 1 && !scratch) splits = 1;
    size_t smem = kvq_attn_smem(G, a->head_dim);
    CU_LAUNCH(kvq_attn_kernel, dim3(a->n * a->n_kv_heads, splits), dim3(KVQ_WARPS * 32), smem, s,
              *a, splits, (float *)scratch);
    if (splits > 1)
        CU_LAUNCH(kvq_combine_kernel, dim3(a->n * a->n_heads), dim3(128),
                  sizeof(float) * a->head_dim, s, *a, splits, (const float *)scratch);
    return 0;
}
