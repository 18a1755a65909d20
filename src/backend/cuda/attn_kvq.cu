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

/* A block owns one query row t, one kv head and its G query heads, and one
 * split of the row's context; its KVQ_WARPS warps take turns on tiles of 32
 * positions.  Per tile a warp
 *
 *   1. scores the 32 keys: lanes are split into lpk = head_dim / 32 lanes
 *      per key, one lane per 32-group (so each lane's codes are 4 * bits
 *      bytes on a 4-byte boundary and share one scale and offset): the lane
 *      forms sc * dot(q, codes) + off * sum(q) for every query head, the
 *      lpk lanes of a key add up, and the scores go to shared memory;
 *   2. runs the online softmax with lane = key (base 2, q pre-scaled by
 *      scale * log2 e), leaving each key's weight in shared memory;
 *   3. adds the weighted values: lanes are split into head_dim / 8 lanes
 *      per key (8 dims each; two chunks of 8 at head_dim 512), accumulating
 *      w * centroid[code] * scale (TurboQuant: the rotated domain) or
 *      w * (code * scale + bias) in registers.
 *
 * Loads of KU (keys) or VU (values) passes are issued before any of them is
 * used, so every warp keeps several rows in flight.  The code widths are
 * template parameters of the per-tile steps, dispatched by a switch per
 * tile: the K and V variants add up instead of multiplying. */

#define KVQ_TILE 32
#define KU 4 /* key passes loaded ahead */
#define VU 8 /* value passes loaded ahead */
#define KVQ_MIN_CHUNK 128 /* fewest positions a split takes */

/* Slot index of position p; bt is the sequence's block-table row. */
__device__ __forceinline__ size_t kvq_slot_index(const int32_t *bt, int page_size, int p) {
    return (size_t)bt[p / page_size] * page_size + (size_t)(p % page_size);
}

__device__ __forceinline__ float ld_half_al(const uint8_t *p) { /* 2-byte aligned */
    return __half2float(*(const __half *)p);
}

/* Code i (0..31) of a 32-group held in words w (LSB-first bitstream). */
template <int B, bool SGN> __device__ __forceinline__ float group_code(const uint32_t *w, int i) {
    const int bit = i * B, wi = bit >> 5, sh = bit & 31;
    uint32_t v = w[wi] >> sh;
    if (sh + B > 32) v |= w[wi + 1] << (32 - sh);
    if (B == 8 && SGN) return (float)(int)(int8_t)(v & 0xffu);
    return (float)(v & ((1u << B) - 1));
}

/* Step 1 for one tile: scores of keys base .. base + 31 (those < p1) into
 * ss[h * 32 + key]; -inf where there is no key. */
template <int GM, int B, bool TURBO>
__device__ __forceinline__ void kvq_score_tile(const cu_kvq_args &a, const int32_t *bt,
                                               const uint8_t *kb, int base, int p1, const float *qs,
                                               const float (&qsum)[GM], float *ss) {
    constexpr bool SGN = TURBO && B == 8;
    const int lane = threadIdx.x & 31, d = a.head_dim, lpk = d >> 5, kp = 32 / lpk;
    const int kpart = lane % lpk, kslot = lane / lpk, cb = d * B / 8;
    const size_t stride = (size_t)a.n_kv_heads * a.k_row;
    for (int j0 = 0; j0 < lpk; j0 += KU) {
        uint32_t w[KU][B];
        float sc[KU], off[KU];
        bool ok[KU];
#pragma unroll
        for (int u = 0; u < KU; u++) {
            const int p = base + (j0 + u) * kp + kslot;
            ok[u] = j0 + u < lpk && p < p1;
            sc[u] = off[u] = 0;
            if (ok[u]) {
                const uint8_t *row = kb + kvq_slot_index(bt, a.page_size, p) * stride;
                const uint32_t *cw = (const uint32_t *)(row + kpart * 4 * B);
#pragma unroll
                for (int k = 0; k < B; k++)
                    w[u][k] = cw[k];
                float s = ld_half_al(row + cb + 2 * kpart), z = ld_half_al(row + cb + 2 * (lpk + kpart));
                sc[u] = s, off[u] = TURBO ? z * s : z;
            } else {
#pragma unroll
                for (int k = 0; k < B; k++)
                    w[u][k] = 0;
            }
        }
#pragma unroll
        for (int u = 0; u < KU; u++) {
            if (j0 + u >= lpk) break; /* uniform across the warp */
            float dot[GM];
#pragma unroll
            for (int h = 0; h < GM; h++)
                dot[h] = 0;
#pragma unroll
            for (int i = 0; i < 32; i += 4) {
                float c0 = group_code<B, SGN>(w[u], i), c1 = group_code<B, SGN>(w[u], i + 1);
                float c2 = group_code<B, SGN>(w[u], i + 2), c3 = group_code<B, SGN>(w[u], i + 3);
#pragma unroll
                for (int h = 0; h < GM; h++) {
                    float4 q = *(const float4 *)(qs + h * d + kpart * 32 + i);
                    dot[h] = fmaf(q.x, c0, fmaf(q.y, c1, fmaf(q.z, c2, fmaf(q.w, c3, dot[h]))));
                }
            }
#pragma unroll
            for (int h = 0; h < GM; h++) {
                float s = fmaf(sc[u], dot[h], off[u] * qsum[h]);
                for (int o = 1; o < lpk; o <<= 1)
                    s += __shfl_xor_sync(0xffffffffu, s, o);
                if (kpart == 0) ss[h * 32 + (j0 + u) * kp + kslot] = ok[u] ? s : -INFINITY;
            }
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
 * the tile's keys, the lane's dims being c * 256 + vpart * 8 + i. */
template <int GM, int NCH, int B, bool TURBO>
__device__ __forceinline__ void kvq_value_tile(const cu_kvq_args &a, const int32_t *bt,
                                               const uint8_t *vb, int base, int p1,
                                               const float *ss, const float *cent,
                                               float (&acc)[GM][NCH * 8]) {
    const int lane = threadIdx.x & 31, d = a.head_dim, lpv = d / (8 * NCH), kpv = 32 / lpv;
    const int vpart = lane % lpv, vslot = lane / lpv, cb = d * B / 8, ng = d >> 5;
    const size_t stride = (size_t)a.n_kv_heads * a.v_row;
    for (int j0 = 0; j0 < lpv; j0 += VU) {
        uint64_t cw[VU][NCH];
        float sc[VU][NCH], bias[VU][NCH];
        bool ok[VU];
#pragma unroll
        for (int u = 0; u < VU; u++) {
            const int p = base + (j0 + u) * kpv + vslot;
            ok[u] = j0 + u < lpv && p < p1;
#pragma unroll
            for (int c = 0; c < NCH; c++)
                cw[u][c] = 0, sc[u][c] = bias[u][c] = 0;
            if (ok[u]) {
                const uint8_t *row = vb + kvq_slot_index(bt, a.page_size, p) * stride;
#pragma unroll
                for (int c = 0; c < NCH; c++) {
                    const int e0 = c * 256 + vpart * 8, g = e0 >> 5;
                    cw[u][c] = load8_codes<B>(row + e0 * B / 8);
                    sc[u][c] = ld_half_al(row + cb + 2 * g);
                    if (!TURBO) bias[u][c] = ld_half_al(row + cb + 2 * (ng + g));
                }
            }
        }
#pragma unroll
        for (int u = 0; u < VU; u++) {
            if (!ok[u]) continue;
            const int key = (j0 + u) * kpv + vslot;
            float wt[GM];
#pragma unroll
            for (int h = 0; h < GM; h++)
                wt[h] = ss[h * 32 + key];
#pragma unroll
            for (int c = 0; c < NCH; c++) {
                float ws[GM];
#pragma unroll
                for (int h = 0; h < GM; h++)
                    ws[h] = TURBO ? wt[h] * sc[u][c] : wt[h];
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    const uint32_t code = (uint32_t)(cw[u][c] >> (i * B)) & ((1u << B) - 1);
                    const float x = TURBO ? cent[code] : fmaf((float)code, sc[u][c], bias[u][c]);
#pragma unroll
                    for (int h = 0; h < GM; h++)
                        acc[h][c * 8 + i] = fmaf(ws[h], x, acc[h][c * 8 + i]);
                }
            }
        }
    }
}

/* Shared memory of the attention kernel, in floats: q [GM][d], centroids
 * [256], scores [warps][GM][32], warp results [warps][GM][d + 2], y [d]. */
static size_t kvq_attn_floats(int GM, int d) {
    return (size_t)GM * d + 256 + (size_t)KVQ_WARPS * GM * 32 + (size_t)KVQ_WARPS * GM * (d + 2) + d;
}

/* Per-tile dispatch on the code widths (uniform branches). */
template <int GM>
__device__ __forceinline__ void kvq_scores(const cu_kvq_args &a, const int32_t *bt, const uint8_t *kb,
                                           int base, int p1, const float *qs,
                                           const float (&qsum)[GM], float *ss) {
    if (a.kvq == KVQ_TURBO) {
        switch (a.k_bits) {
        case 8: kvq_score_tile<GM, 8, true>(a, bt, kb, base, p1, qs, qsum, ss); break;
        case 5: kvq_score_tile<GM, 5, true>(a, bt, kb, base, p1, qs, qsum, ss); break;
        case 4: kvq_score_tile<GM, 4, true>(a, bt, kb, base, p1, qs, qsum, ss); break;
        default: kvq_score_tile<GM, 2, true>(a, bt, kb, base, p1, qs, qsum, ss); break;
        }
    } else if (a.k_bits == 8) {
        kvq_score_tile<GM, 8, false>(a, bt, kb, base, p1, qs, qsum, ss);
    } else {
        kvq_score_tile<GM, 4, false>(a, bt, kb, base, p1, qs, qsum, ss);
    }
}

template <int GM, int NCH>
__device__ __forceinline__ void kvq_values(const cu_kvq_args &a, const int32_t *bt, const uint8_t *vb,
                                           int base, int p1, const float *ss, const float *cent,
                                           float (&acc)[GM][NCH * 8]) {
    if (a.kvq == KVQ_TURBO) {
        switch (a.v_bits) {
        case 8: kvq_value_tile<GM, NCH, 8, true>(a, bt, vb, base, p1, ss, cent, acc); break;
        case 5: kvq_value_tile<GM, NCH, 5, true>(a, bt, vb, base, p1, ss, cent, acc); break;
        case 4: kvq_value_tile<GM, NCH, 4, true>(a, bt, vb, base, p1, ss, cent, acc); break;
        case 3: kvq_value_tile<GM, NCH, 3, true>(a, bt, vb, base, p1, ss, cent, acc); break;
        default: kvq_value_tile<GM, NCH, 2, true>(a, bt, vb, base, p1, ss, cent, acc); break;
        }
    } else if (a.v_bits == 8) {
        kvq_value_tile<GM, NCH, 8, false>(a, bt, vb, base, p1, ss, cent, acc);
    } else {
        kvq_value_tile<GM, NCH, 4, false>(a, bt, vb, base, p1, ss, cent, acc);
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

/* Splits of a row's context: enough blocks to give every SM about four;
 * a split takes at least KVQ_MIN_CHUNK positions, so a short context uses
 * the first few and the rest exit at once (the depth lives on the device:
 * the grid cannot depend on it, or a CUDA graph could not replay it). */
static int kvq_splits(const cu_kvq_args *a, int n_sm) {
    int want = CU_DIV_UP(4 * n_sm, a->n * a->n_kv_heads);
    return want < 1 ? 1 : (want > 64 ? 64 : want);
}

template <int GM, int NCH>
__global__ void __launch_bounds__(KVQ_WARPS * 32)
    kvq_attn_kernel(cu_kvq_args a, int n_splits, float *part) {
    cu_grid_trigger();
    cu_grid_wait();
    extern __shared__ float4 sm4[];
    float *sm = (float *)sm4;
    const int d = a.head_dim, G = a.n_heads / a.n_kv_heads;
    const int t = blockIdx.x / a.n_kv_heads, kvh = blockIdx.x % a.n_kv_heads, split = blockIdx.y;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    float *qs = sm, *cent = qs + GM * d, *ss = cent + 256 + warp * GM * 32;
    float *ws = cent + 256 + KVQ_WARPS * GM * 32, *y = ws + KVQ_WARPS * GM * (d + 2);

    const float qscale = a.scale * KVQ_LOG2E;
    for (int i = threadIdx.x; i < GM * d; i += blockDim.x) /* heads past G: zeros */
        qs[i] = i < G * d ? a.q[((size_t)t * a.n_heads + kvh * G) * d + i] * qscale : 0.0f;
    if (a.kvq == KVQ_TURBO)
        for (int i = threadIdx.x; i < (1 << a.v_bits); i += blockDim.x)
            cent[i] = a.tables[d + i];
    __syncthreads();

    const int n_pos = a.pos[t] + 1;
    const int chunk = max(CU_DIV_UP(n_pos, n_splits), KVQ_MIN_CHUNK);
    const int p0 = min(n_pos, split * chunk), p1 = min(n_pos, p0 + chunk);
    if (n_splits > 1 && p0 >= p1) { /* an empty split: the combine skips it */
        if (threadIdx.x < G) {
            float *pp = part + (((size_t)split * a.n + t) * a.n_heads + kvh * G + threadIdx.x) * (d + 2);
            pp[d] = -INFINITY, pp[d + 1] = 0;
        }
        return;
    }
    const int32_t *bt = a.block_table + (size_t)a.seq[t] * a.max_pages;
    const uint8_t *kb = a.k + (size_t)kvh * a.k_row, *vb = a.v + (size_t)kvh * a.v_row;

    float qsum[GM], m[GM], l[GM], acc[GM][NCH * 8];
    const int kpart = lane % (d >> 5);
#pragma unroll
    for (int h = 0; h < GM; h++) {
        float s = 0;
        for (int i = 0; i < 32; i++)
            s += qs[h * d + kpart * 32 + i];
        qsum[h] = s, m[h] = -INFINITY, l[h] = 0;
#pragma unroll
        for (int e = 0; e < NCH * 8; e++)
            acc[h][e] = 0;
    }

    for (int base = p0 + warp * KVQ_TILE; base < p1; base += KVQ_WARPS * KVQ_TILE) {
        kvq_scores<GM>(a, bt, kb, base, p1, qs, qsum, ss);
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
        kvq_values<GM, NCH>(a, bt, vb, base, p1, ss, cent, acc);
        __syncwarp();
    }

    /* Lanes holding the same dims for different keys add up; then each
     * warp leaves (acc, m, l) per head for the merge. */
    const int lpv = d / (8 * NCH), vpart = lane % lpv;
#pragma unroll
    for (int h = 0; h < GM; h++)
#pragma unroll
        for (int e = 0; e < NCH * 8; e++)
            for (int o = lpv; o < 32; o <<= 1)
                acc[h][e] += __shfl_xor_sync(0xffffffffu, acc[h][e], o);
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
        if (n_splits > 1) {
            __syncthreads();
            float *pp = part + (((size_t)split * a.n + t) * a.n_heads + head) * (d + 2);
            for (int i = threadIdx.x; i < d; i += blockDim.x)
                pp[i] = y[i];
            if (threadIdx.x == 0) pp[d] = mx, pp[d + 1] = lsum;
            __syncthreads();
            continue;
        }
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

extern "C" int cu_kvq_supported(int kvq, int k_bits, int v_bits, int group, int head_dim) {
    const bool dim_ok = head_dim == 64 || head_dim == 128 || head_dim == 256 || head_dim == 512;
    if (group != 32 || !dim_ok) return 0;
    if (kvq == KVQ_TURBO)
        return (k_bits == 2 || k_bits == 4 || k_bits == 5 || k_bits == 8) &&
               (v_bits == 2 || v_bits == 3 || v_bits == 4 || v_bits == 5 || v_bits == 8);
    return kvq == KVQ_AFFINE && (k_bits == 4 || k_bits == 8) && k_bits == v_bits;
}

static bool kvq_shape_ok(const cu_kvq_args *a) {
    int G = a->n_kv_heads > 0 ? a->n_heads / a->n_kv_heads : 0;
    return cu_kvq_supported(a->kvq, a->k_bits, a->v_bits, a->group, a->head_dim) && G >= 1 &&
           G <= KVQ_MAX_G && a->n_heads % a->n_kv_heads == 0 && a->k_row % 4 == 0 &&
           a->v_row % 4 == 0;
}

#define KVQ_FOR_EACH_KERNEL(X) \
    X(1, 1) X(2, 1) X(4, 1) X(8, 1) X(1, 2) X(2, 2) X(4, 2) X(8, 2)

/* Shared memory beyond 48 KiB (G = 8 at head_dim 512) needs an opt-in. */
extern "C" void cu_kvq_init(void) {
#define X(gm, nch)                                                                                 \
    cudaFuncSetAttribute(kvq_attn_kernel<gm, nch>, cudaFuncAttributeMaxDynamicSharedMemorySize,    \
                         (int)(sizeof(float) * kvq_attn_floats(gm, 512)));
    KVQ_FOR_EACH_KERNEL(X)
#undef X
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
    const int gm = G <= 1 ? 1 : G <= 2 ? 2 : G <= 4 ? 4 : 8, nch = a->head_dim == 512 ? 2 : 1;
    const size_t smem = sizeof(float) * kvq_attn_floats(gm, a->head_dim);
    const dim3 grid(a->n * a->n_kv_heads, splits), block(KVQ_WARPS * 32);
    float *part = (float *)scratch;
#define X(g_, n_)                                                                                  \
    if (gm == g_ && nch == n_) CU_LAUNCH((kvq_attn_kernel<g_, n_>), grid, block, smem, s, *a, splits, part);
    KVQ_FOR_EACH_KERNEL(X)
#undef X
    if (splits > 1)
        CU_LAUNCH(kvq_combine_kernel, dim3(a->n * a->n_heads), dim3(128),
                  sizeof(float) * a->head_dim, s, *a, splits, (const float *)part);
    return 0;
}
