/*
 * qdecode.cuh - the quantized formats' device decoders, shared by the
 * dense GEMVs (qmatmul.cu) and the matmul by expert id (moe.cu): row sizes
 * per format, the 32-element chunk decoder (qf_chunk: byte codes in element
 * order and (mul, add) per half), the activations' rounding to int16 codes
 * as the CPU backend rounds them (qx_chunk) and the exact integer product
 * of a chunk with those codes (qdot_chunk), plus the cp.async helpers.
 * qmatmul.cu's header comment describes the decoder and its accuracy.
 *
 * Header-only device code: every kernel that includes it gets its own
 * inlined copy; nothing here owns memory or state.
 */
#ifndef PETREL_QDECODE_CUH
#define PETREL_QDECODE_CUH

#include "backend/cuda/cu_common.cuh"
#include "backend/cuda/cuda_internal.h"

/* ---- formats ---------------------------------------------------------------- */

/* Bytes of `cols` elements of a row (cols a multiple of the block). */
__host__ __device__ static inline int64_t qf_bytes(int f, int bits, int64_t cols) {
    switch (f) {
    case CU_Q8_0: return cols / 32 * 34;
    case CU_Q4_0: return cols / 32 * 18;
    case CU_Q4_K: return cols / 256 * 144;
    case CU_Q5_K: return cols / 256 * 176;
    case CU_Q6_K: return cols / 256 * 210;
    case CU_MXFP4: return cols / 32 * 17;
    default: return cols / 32 * 4 * bits; /* affine: 32 codes of `bits` bits */
    }
}

/* Elements per block of a format: a row is whole blocks. */
__host__ __device__ static inline int qf_block(int f) {
    return f == CU_Q4_K || f == CU_Q5_K || f == CU_Q6_K ? 256 : 32;
}

/* One decoded chunk: 32 byte codes in element order, (mul, add) per half. */
struct qchunk {
    uint32_t u[8];
    float mul[2], add[2];
};

__device__ __forceinline__ uint32_t ld16(const uint8_t *p) {
    return *(const uint16_t *)p;
}
/* 4 bytes at a 2-byte aligned address. */
__device__ __forceinline__ uint32_t ld32_2(const uint8_t *p) {
    return ld16(p) | ld16(p + 2) << 16;
}
__device__ __forceinline__ float h2f(uint32_t h) {
    return __half2float(__ushort_as_half((unsigned short)h));
}
__device__ __forceinline__ float scale_at(const void *p, int64_t i, int st) {
    if (st == CU_F32) return ((const float *)p)[i];
    uint32_t h = ((const uint16_t *)p)[i];
    return st == CU_BF16 ? __uint_as_float(h << 16) : h2f(h);
}

/* 6-bit scale and min of sub-block j of a q4_k/q5_k block (s: 12 bytes). */
__device__ __forceinline__ void scale_min_k4(int j, const uint8_t *s, int *sc, int *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* Chunk c (32 elements) of a row whose bytes start at row (the whole row,
 * or a tile of it staged in shared memory: c counts from the tile's start,
 * which is always a whole number of blocks); gc is the chunk's index in
 * the whole row and r the row (affine scales live beside the codes). */
template <int F>
__device__ __forceinline__ void qf_chunk(qchunk &q, const uint8_t *row, int c, int64_t gc,
                                         const cu_qweight &w, int64_t r) {
    if (F == CU_Q4_0) {
        const uint8_t *b = row + 18 * c;
        float d = h2f(ld16(b));
#pragma unroll
        for (int i = 0; i < 4; i++) {
            uint32_t v = ld32_2(b + 2 + 4 * i);
            q.u[i] = v & 0x0F0F0F0Fu, q.u[i + 4] = (v >> 4) & 0x0F0F0F0Fu;
        }
        q.mul[0] = q.mul[1] = d, q.add[0] = q.add[1] = -8.f * d;
    } else if (F == CU_Q8_0) {
        const uint8_t *b = row + 34 * c;
        float d = h2f(ld16(b));
#pragma unroll
        for (int i = 0; i < 8; i++) q.u[i] = ld32_2(b + 2 + 4 * i) ^ 0x80808080u;
        q.mul[0] = q.mul[1] = d, q.add[0] = q.add[1] = -128.f * d;
    } else if (F == CU_Q4_K || F == CU_Q5_K) {
        const int bb = F == CU_Q4_K ? 144 : 176;
        const uint8_t *b = row + bb * (c >> 3);
        int j = c & 7, sc, m, shift = (j & 1) * 4;
        /* blocks are 16-byte multiples: the codes are 16-byte aligned */
        const uint4 *qs = (const uint4 *)(b + (F == CU_Q4_K ? 16 : 48) + 32 * (j >> 1));
        uint4 a = qs[0], e = qs[1];
        uint32_t v[8] = {a.x, a.y, a.z, a.w, e.x, e.y, e.z, e.w};
        if (F == CU_Q5_K) {
            const uint4 *qh = (const uint4 *)(b + 16);
            uint4 h0 = qh[0], h1 = qh[1];
            uint32_t h[8] = {h0.x, h0.y, h0.z, h0.w, h1.x, h1.y, h1.z, h1.w};
#pragma unroll
            for (int i = 0; i < 8; i++)
                q.u[i] = ((v[i] >> shift) & 0x0F0F0F0Fu) | ((h[i] >> j) & 0x01010101u) << 4;
        } else {
#pragma unroll
            for (int i = 0; i < 8; i++) q.u[i] = (v[i] >> shift) & 0x0F0F0F0Fu;
        }
        scale_min_k4(j, b + 4, &sc, &m);
        uint32_t dd = *(const uint32_t *)b;
        float mul = h2f(dd & 0xffff) * (float)sc, add = -(h2f(dd >> 16) * (float)m);
        q.mul[0] = q.mul[1] = mul, q.add[0] = q.add[1] = add;
    } else if (F == CU_Q6_K) {
        const uint8_t *b = row + 210 * (c >> 3);
        int j = c & 7, half = j >> 2, k = j & 3;
        const uint8_t *ql = b + 64 * half + (k & 1 ? 32 : 0), *qh = b + 128 + 32 * half;
        int ls = k & 2 ? 4 : 0, hs = 2 * k;
#pragma unroll
        for (int i = 0; i < 8; i++)
            q.u[i] = ((ld32_2(ql + 4 * i) >> ls) & 0x0F0F0F0Fu) |
                     ((ld32_2(qh + 4 * i) >> hs) & 0x03030303u) << 4;
        float d = h2f(ld16(b + 208));
        uint32_t s = ld16(b + 192 + 2 * j);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            q.mul[h] = d * (float)(int8_t)(s >> (8 * h));
            q.add[h] = -32.f * q.mul[h];
        }
    } else if (F == CU_MXFP4) {
        /* e8m0 scale byte, then 16 bytes of e2m1 codes (element i the low
         * nibble of byte i, i + 16 the high one), any byte alignment.  As
         * the CPU: codes as twice their value (integers -12..12), mul =
         * 2^(e - 128); here stored as u = code + 128 (add = -128 mul, as
         * q8_0), so qf_get8 gives mul * code exactly. */
        const uint8_t *b = row + 17 * c;
        const uint32_t e = b[0];
        const float mul = e >= 2 ? __uint_as_float((e - 1) << 23) : __uint_as_float(0x400000u >> (1 - e));
        const uint32_t T0 = 0x03020100u, T1 = 0x0C080604u; /* |code| by the low 3 bits */
#pragma unroll
        for (int i = 0; i < 4; i++) {
            uint32_t v = b[1 + 4 * i] | (uint32_t)b[2 + 4 * i] << 8 | (uint32_t)b[3 + 4 * i] << 16 |
                         (uint32_t)b[4 + 4 * i] << 24;
#pragma unroll
            for (int h = 0; h < 2; h++) {
                uint32_t n = (v >> (4 * h)) & 0x0F0F0F0Fu, m = n & 0x07070707u;
                uint32_t sel = (m & 7u) | (m >> 4 & 0x70u) | (m >> 8 & 0x700u) | (m >> 12 & 0x7000u);
                uint32_t mag = __byte_perm(T0, T1, sel), sm = ((n >> 3) & 0x01010101u) * 0xFFu;
                q.u[i + 4 * h] = __vsub4(mag ^ sm, sm) ^ 0x80808080u; /* sign, then + 128 */
            }
        }
        q.mul[0] = q.mul[1] = mul, q.add[0] = q.add[1] = -128.f * mul;
    } else { /* MLX affine: little-endian bit stream of `bits`-bit codes */
        const int bits = F == CU_AFF4 ? 4 : F == CU_AFF8 ? 8 : w.bits;
        if (F == CU_AFF4) {
            uint4 a = *(const uint4 *)(row + 16 * c);
            uint32_t v[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
            for (int i = 0; i < 4; i++) { /* nibbles lo, hi of each byte: elements 2k, 2k+1 */
                uint32_t lo = v[i] & 0x0F0F0F0Fu, hi = (v[i] >> 4) & 0x0F0F0F0Fu;
                q.u[2 * i] = __byte_perm(lo, hi, 0x5140);
                q.u[2 * i + 1] = __byte_perm(lo, hi, 0x7362);
            }
        } else if (F == CU_AFF8) {
            const uint4 *p = (const uint4 *)(row + 32 * c);
            uint4 a = p[0], e = p[1];
            q.u[0] = a.x, q.u[1] = a.y, q.u[2] = a.z, q.u[3] = a.w;
            q.u[4] = e.x, q.u[5] = e.y, q.u[6] = e.z, q.u[7] = e.w;
        } else { /* other widths: bit by bit (not a speed path) */
            const uint8_t *p = row + (size_t)c * 4 * bits;
            uint32_t mask = (1u << bits) - 1;
#pragma unroll
            for (int i = 0; i < 8; i++) q.u[i] = 0;
            for (int e = 0; e < 32; e++) {
                int bit = e * bits;
                uint32_t v = (p[bit >> 3] | (uint32_t)p[(bit >> 3) + 1 < 4 * bits ? (bit >> 3) + 1 : (bit >> 3)] << 8);
                v = (v >> (bit & 7)) & mask;
                q.u[e >> 2] |= v << (8 * (e & 3));
            }
        }
        int64_t g = gc * 32 / w.group, ng = w.cols / w.group;
        float s = scale_at(w.scales, r * ng + g, w.scale_type);
        float a = scale_at(w.biases, r * ng + g, w.scale_type);
        q.mul[0] = q.mul[1] = s, q.add[0] = q.add[1] = a;
    }
}

/* Expert e of a stack whose expert 0 is w: its codes, and its affine
 * scales and biases (rows * cols / group of each per expert). */
template <int F>
__device__ __forceinline__ cu_qweight qf_expert(cu_qweight w, size_t stride, int e) {
    w.data = (const uint8_t *)w.data + (size_t)e * stride;
    if (F >= CU_AFF4 && F <= CU_AFFN) {
        size_t sb = (size_t)w.rows * (size_t)(w.cols / w.group) * (w.scale_type == CU_F32 ? 4 : 2);
        w.scales = (const char *)w.scales + (size_t)e * sb;
        w.biases = (const char *)w.biases + (size_t)e * sb;
    }
    return w;
}

/* ---- cp.async --------------------------------------------------------------------- */

__device__ __forceinline__ void cp_async16(void *smem, const void *gmem) {
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem));
}
__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;" ::: "memory");
}
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

/* ---- activations as int16 codes ----------------------------------------------------- */

/* One token's 32 activations of a chunk as int16 codes, exactly as the
 * CPU backend rounds them (quant_kernels.h): d = max|x| / 32767 over the
 * activation block (32 elements, or an affine group of G chunks, held by G
 * adjacent lanes: every lane of the warp must call this), q = rint(x / d).
 * xw[p] packs codes 2p and 2p+1; s0, s1 are the sums of the codes of each
 * half.  (qx_chunk below loads them; lanes whose chunk is past the row
 * pass valid = false: zeros.) */
__device__ __forceinline__ void qx_codes(const float (&v)[32], int G, uint32_t xw[16], float &dx,
                                         int &s0, int &s1) {
    float amax = 0.f;
#pragma unroll
    for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(v[i]));
    for (int o = 1; o < G; o <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    float d = amax / 32767.f, id = d > 0.f ? 1.f / d : 0.f;
    s0 = 0, s1 = 0;
#pragma unroll
    for (int p = 0; p < 16; p++) {
        /* rint by adding 1.5 * 2^23 (round to nearest even, like lrintf);
         * the product rounded first, as on the CPU (no fused multiply-add).
         * The code is the float's bits minus 0x4B400000, whose low 16 bits
         * are zero: the bits' low halves are the int16 codes as they are. */
        uint32_t a = __float_as_uint(__fadd_rn(__fmul_rn(v[2 * p], id), 12582912.f));
        uint32_t b = __float_as_uint(__fadd_rn(__fmul_rn(v[2 * p + 1], id), 12582912.f));
        xw[p] = __byte_perm(a, b, 0x5410);
        /* the sums of the codes: two int16 codes times 1, 1 per dp2a */
        if (p < 8) s0 = __dp2a_lo((int)xw[p], 0x0101, s0);
        else s1 = __dp2a_lo((int)xw[p], 0x0101, s1);
    }
    dx = d;
}

/* qx_codes of the 32 floats at xp. */
__device__ __forceinline__ void qx_chunk(const float *xp, bool valid, int G, uint32_t xw[16],
                                         float &dx, int &s0, int &s1) {
    float v[32];
#pragma unroll
    for (int i = 0; i < 8; i++) {
        float4 a = valid ? __ldg((const float4 *)xp + i) : make_float4(0.f, 0.f, 0.f, 0.f);
        v[4 * i] = a.x, v[4 * i + 1] = a.y, v[4 * i + 2] = a.z, v[4 * i + 3] = a.w;
    }
    qx_codes(v, G, xw, dx, s0, s1);
}

/* A chunk's product with one token's int16 codes, before the activation
 * scale dx: exact integer sums of code products per half (dp2a: two int16
 * codes times two int8 weight codes), then (mul, add) in f32.  Every
 * operation is written out (no contraction left to the compiler), so
 * every kernel and every token count computes a row the same way. */
__device__ __forceinline__ float qdot_chunk(const qchunk &q, const uint32_t xw[16], int s0,
                                            int s1) {
    int h0 = 0, h1 = 0;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        h0 = __dp2a_lo((int)xw[2 * i], (int)q.u[i], h0);
        h0 = __dp2a_hi((int)xw[2 * i + 1], (int)q.u[i], h0);
        h1 = __dp2a_lo((int)xw[2 * i + 8], (int)q.u[i + 4], h1);
        h1 = __dp2a_hi((int)xw[2 * i + 9], (int)q.u[i + 4], h1);
    }
    float v = __fmul_rn(q.mul[0], (float)h0);
    v = fmaf(q.add[0], (float)s0, v);
    v = fmaf(q.mul[1], (float)h1, v);
    return fmaf(q.add[1], (float)s1, v);
}

#endif
