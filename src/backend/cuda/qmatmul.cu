/*
 * qmatmul.cu - quantized weights on the GPU, read as the file stores them
 * (no repacking at load): GGUF q8_0, q4_0, q4_k, q5_k, q6_k and MLX affine
 * (codes of 2..8 bits, groups of 32/64/128, f16/bf16/f32 scales).
 *
 * The kernels share the activation rounding and the integer dot product:
 *
 *  - qgemv_co (decode, q4_0; q8_0 on request; rows of whole 256-element
 *    units): every lane of a warp on consecutive 16 bytes of one row,
 *    copied into the warp's shared memory and read back a block pair per
 *    lane (its comment below).  The decode path of q4_0.
 *  - qgemv_reg (decode, n <= CU_QGEMV_MAX_ROWS token rows; q4_0, q8_0,
 *    q4_k, q5_k, affine 4/8 with rows of whole 256-element units): lane
 *    = weight row, units read with 16-byte loads into registers and
 *    decoded there, no shared-memory staging of weights (its comment
 *    below).  It is the decode path of every other format but q6_k.
 *  - qgemv (the staged kernel: q6_k, and affine rows that are not whole
 *    units): a persistent grid
 *    (as many blocks of 128 threads as fit at once) whose blocks walk
 *    groups of QM_ROWS weight rows.  A block copies the rows' bytes into
 *    shared memory with 16-byte cp.async, one tile of 4096 columns per
 *    work item, two items in flight ahead of the one it multiplies, also
 *    across row groups, so its loads never wait for a reduction.  Each
 *    thread decodes one 32-element chunk of every row of the item from
 *    shared memory.  Activations are rounded to int16 codes per block of
 *    32 (an affine group) exactly as the CPU backend does
 *    (quant_kernels.h), by the thread that owns the chunk, so a chunk's
 *    product is an exact integer sum (dp2a: two int16 codes times two int8
 *    weight codes per instruction), scaled once in f32: ~2 instructions
 *    per weight instead of ~8 for dequantize-and-multiply in f32.  Needs
 *    16-byte aligned rows (every row size of a real model); other shapes
 *    take qgemv_plain (f32, decoding from global memory).
 *  - qdequant: rows of a weight as f16 (for cuBLAS, prefill) or f32 (the
 *    embed op, rows picked by token id).
 *
 * The decoder: a 32-element chunk is turned into 32 unsigned byte codes u
 * (in element order) and, per half of 16 elements, (mul, add) so that
 * weight = mul * u + add.  Signed formats fold their offset into add (q4_0:
 * u = nibble, add = -8 d; q8_0: u = byte ^ 0x80, add = -128 d; q6_k: add
 * = -32 mul).  Bytes become floats without the slow integer conversion:
 * the float with bits 0x4B000000 | u is exactly 2^23 + u.
 *
 * Batch invariance: which kernel runs depends on the weight and x's
 * alignment, never on n, and each kernel's per-row order of operations
 * is the same at every n (explicit fmaf, warp-ordered sums), so a token
 * row gets the same bits alone or among 16 (speculative verification).
 *
 * Accuracy: the GEMVs compute the CPU's integer sums, so the two
 * agree to f32 rounding (~1e-6); both differ from an f32 product by the
 * activation rounding, at most max|x| / 65534 per element.  The plain
 * kernel and the embeddings are f32 on the dequantized weights; prefill
 * rounds weights and activations to f16 (~2^-10 relative).
 */
#include "backend/cuda/cu_common.cuh"
#include "backend/cuda/cuda_family.h"
#include "backend/cuda/qdecode.cuh"

#define QM_THREADS 128
#define QM_TILE (QM_THREADS * 32) /* columns per stage: one chunk per thread */
#define QM_ROWS 4                 /* weight rows per block */
#define QM_STAGES 3

/* ---- formats (decoders: qdecode.cuh) ------------------------------------------ */

/* Elements 8g .. 8g+7 of a decoded chunk as weights. */
__device__ __forceinline__ void qf_get8(const qchunk &q, int g, float out[8]) {
    const float M = 8388608.f; /* 2^23 */
    float mul = q.mul[g >> 1], add = q.add[g >> 1];
#pragma unroll
    for (int k = 0; k < 2; k++) {
        uint32_t v = q.u[2 * g + k];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float u = __int_as_float(__byte_perm(v, 0x4B000000u, 0x7650 | i)) - M;
            out[4 * k + i] = fmaf(u, mul, add);
        }
    }
}

/* Rows of a split matrix are in groups of 2^gs, the fewest whose bytes are
 * whole 16-byte words (1 row at 256 * k columns, 4 at gpt-oss's 2880, at
 * most 8), each group its rows' codes (cr bytes a row), then their scales
 * (sr bytes): every row's codes start 16-byte aligned, and a group sits
 * where the file had it. */
__host__ __device__ __forceinline__ int qs_gshift(int f, int64_t cols) {
    const int64_t rb = cols / 32 * (f == CU_Q4_0 ? 18 : 34);
    int gs = 0;
    while ((rb << gs) & 15) gs++;
    return gs;
}
__device__ __forceinline__ const uint8_t *qs_row(const uint8_t *w0, int64_t r, int gs, size_t cr,
                                                 size_t sr, const uint8_t **scales) {
    const uint8_t *g = w0 + (size_t)(r >> gs) * ((cr + sr) << gs);
    const size_t i = (size_t)(r & ((1 << gs) - 1));
    *scales = g + (cr << gs) + i * sr;
    return g + i * cr;
}

/* Chunk c of a CU_LAYOUT_SPLIT q4_0/q8_0 row (its codes, then its scales),
 * as qf_chunk decodes the file's block. */
template <int F>
__device__ __forceinline__ void qs_chunk(qchunk &q, const void *w0, int64_t r, int64_t c,
                                         int64_t cols) {
    const int nc = (int)(cols / 32), cb = F == CU_Q4_0 ? 16 : 32;
    const uint8_t *sp, *row = qs_row((const uint8_t *)w0, r, qs_gshift(F, cols), (size_t)nc * cb,
                                     (size_t)nc * 2, &sp);
    const float d = h2f(ld16(sp + 2 * c));
    if (F == CU_Q4_0) {
        const uint4 a = *(const uint4 *)(row + 16 * c);
        const uint32_t v[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
        for (int i = 0; i < 4; i++)
            q.u[i] = v[i] & 0x0F0F0F0Fu, q.u[i + 4] = (v[i] >> 4) & 0x0F0F0F0Fu;
        q.mul[0] = q.mul[1] = d, q.add[0] = q.add[1] = -8.f * d;
    } else {
        const uint4 a = *(const uint4 *)(row + 32 * c), e = *(const uint4 *)(row + 32 * c + 16);
        const uint32_t v[8] = {a.x, a.y, a.z, a.w, e.x, e.y, e.z, e.w};
#pragma unroll
        for (int i = 0; i < 8; i++) q.u[i] = v[i] ^ 0x80808080u;
        q.mul[0] = q.mul[1] = d, q.add[0] = q.add[1] = -128.f * d;
    }
}

/* ---- decode GEMV ----------------------------------------------------------------- */

/* Work item k of this block: row group blockIdx.x + (k / n_tiles) *
 * gridDim.x, tile k % n_tiles.  Requests its bytes into stage slot
 * k % QM_STAGES (one commit group per call, empty past the last item, so
 * the wait counts stay simple). */
template <int F>
__device__ __forceinline__ void qgemv_stage(uint4 *smem, const cu_qweight &w, size_t row_bytes,
                                            int tile16, int n_tiles, int n_items, int k) {
    if (k < n_items) {
        int j = k / n_tiles, t = k - j * n_tiles;
        int64_t r0 = ((int64_t)blockIdx.x + (int64_t)j * gridDim.x) * QM_ROWS;
        int64_t c0 = (int64_t)t * QM_TILE, left = w.cols - c0;
        int n16 = (int)(qf_bytes(F, w.bits, left < QM_TILE ? left : QM_TILE) / 16);
        size_t off = (size_t)qf_bytes(F, w.bits, c0);
        uint4 *dst = smem + (k % QM_STAGES) * QM_ROWS * tile16;
        for (int i = threadIdx.x; i < QM_ROWS * n16; i += QM_THREADS) {
            int r = i / n16, c = i - r * n16;
            int64_t row = r0 + r < w.rows ? r0 + r : w.rows - 1; /* clamped rows: never stored */
            cp_async16(dst + r * tile16 + c,
                       (const uint8_t *)w.data + (size_t)row * row_bytes + off + 16 * (size_t)c);
        }
    }
    cp_async_commit();
}

/* Persistent: the grid is what fits on the GPU at once; each block walks
 * its row groups (blockIdx.x, + gridDim.x, ...) tile by tile with
 * QM_STAGES - 1 items in flight ahead of the one it multiplies, across
 * row groups, so its weight loads never pause for a reduction. */
template <int F, int NT>
__global__ void __launch_bounds__(QM_THREADS)
    qgemv_kernel(float *y, const float *x, cu_qweight w, int n) {
    cu_grid_trigger();
    extern __shared__ uint4 qm_smem[];
    __shared__ float red[2][QM_THREADS / 32][QM_ROWS * NT];
    const int64_t cols = w.cols;
    const size_t row_bytes = (size_t)qf_bytes(F, w.bits, cols);
    const int tile16 = (int)(qf_bytes(F, w.bits, QM_TILE) / 16);
    const int n_tiles = (int)CU_DIV_UP(cols, (int64_t)QM_TILE);
    const int64_t n_groups = CU_DIV_UP(w.rows, (int64_t)QM_ROWS);
    const int my_groups =
        (int64_t)blockIdx.x < n_groups ? (int)((n_groups - 1 - blockIdx.x) / gridDim.x) + 1 : 0;
    const int n_items = my_groups * n_tiles;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    /* activation block in chunks: 32 elements, or an affine group */
    const int G = F == CU_AFF4 || F == CU_AFF8 ? w.group / 32 : 1;
    const bool WIDE = F == CU_Q8_0 || F == CU_AFF8; /* codes of 8 bits */

#pragma unroll
    for (int k = 0; k < QM_STAGES - 1; k++)
        qgemv_stage<F>(qm_smem, w, row_bytes, tile16, n_tiles, n_items, k);
    cu_grid_wait();

    float acc[QM_ROWS][NT];
#pragma unroll
    for (int r = 0; r < QM_ROWS; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) acc[r][t] = 0.f;

    for (int k = 0; k < n_items; k++) {
        /* the slot of item k - 1 is free: every thread passed the barrier
         * at the end of the last iteration */
        qgemv_stage<F>(qm_smem, w, row_bytes, tile16, n_tiles, n_items, k + QM_STAGES - 1);
        cp_async_wait<QM_STAGES - 1>(); /* item k has landed (this thread's part) */
        __syncthreads();                /* ... and every other thread's */
        const int j = k / n_tiles, t = k - j * n_tiles;
        const int64_t r0 = ((int64_t)blockIdx.x + (int64_t)j * gridDim.x) * QM_ROWS;
        const int64_t gc = (int64_t)t * (QM_TILE / 32) + tid;
        const bool valid = gc * 32 < cols;
        qchunk q[QM_ROWS];
        if (valid) {
            const uint8_t *st = (const uint8_t *)(qm_smem + (k % QM_STAGES) * QM_ROWS * tile16);
#pragma unroll
            for (int r = 0; r < QM_ROWS; r++) {
                qf_chunk<F>(q[r], st + (size_t)r * tile16 * 16, tid, gc, w,
                            r0 + r < w.rows ? r0 + r : w.rows - 1);
                if (WIDE) { /* 8-bit codes as signed bytes: u - 128, the 128 into add */
#pragma unroll
                    for (int i = 0; i < 8; i++) q[r].u[i] ^= 0x80808080u;
                    q[r].add[0] += 128.f * q[r].mul[0], q[r].add[1] += 128.f * q[r].mul[1];
                }
            }
        }
#pragma unroll
        for (int tk = 0; tk < NT; tk++) {
            if (tk >= n) break;
            uint32_t xw[16];
            float dx;
            int s0, s1;
            qx_chunk(x + (size_t)tk * cols + gc * 32, valid, G, xw, dx, s0, s1);
            if (!valid) continue;
#pragma unroll
            for (int r = 0; r < QM_ROWS; r++) {
                /* exact integer sums of code products per half (dp2a: two
                 * int16 activations times two int8 weight codes) */
                acc[r][tk] = fmaf(dx, qdot_chunk(q[r], xw, s0, s1), acc[r][tk]);
            }
        }
        if (t == n_tiles - 1) {
            /* row group done: sum over the block (red alternates between
             * two buffers, so one barrier per group suffices) */
            float(*rd)[QM_ROWS * NT] = red[j & 1];
#pragma unroll
            for (int r = 0; r < QM_ROWS; r++)
#pragma unroll
                for (int tk = 0; tk < NT; tk++) {
                    float v = tk < n ? cu_warp_sum(acc[r][tk]) : 0.f;
                    if (lane == 0) rd[warp][r * NT + tk] = v;
                    acc[r][tk] = 0.f;
                }
            __syncthreads();
            for (int i = tid; i < QM_ROWS * NT; i += QM_THREADS) {
                int r = i / NT, tk = i % NT;
                if (tk >= n || r0 + r >= w.rows) continue;
                float v = 0.f;
#pragma unroll
                for (int q = 0; q < QM_THREADS / 32; q++) v += rd[q][i];
                y[(size_t)tk * w.rows + r0 + r] = v;
            }
        }
        __syncthreads(); /* everyone is done with this slot before it is refilled */
    }
}

/* ---- register GEMV: q4_0, q8_0, affine 4/8 ------------------------------------ */

/* A unit is 256 elements of a row (8 chunks): whole blocks that start at a
 * 16-byte boundary in every format here (q4_0: 8 x 18 bytes = 9 words of
 * 16 bytes, q8_0: 8 x 34 = 17, q4_k: one block of 144 = 9, q5_k: 176 = 11,
 * affine 4: 8, affine 8: 16).  q6_k (210-byte blocks, 2-byte aligned)
 * stays on the staged kernel. */
#define QR_WARPS 8
#define QR_UNIT 256

template <int F> struct qr_unit {
    static const int n16 = F == CU_Q4_0 || F == CU_Q4_K ? 9 : F == CU_Q8_0 ? 17 : F == CU_Q5_K ? 11
                         : F == CU_AFF4 ? 8 : 16;
};

/* An affine scale or bias as loaded (f32 bits, or f16/bf16 in the low 16). */
__device__ __forceinline__ float scale_raw(uint32_t v, int st) {
    return st == CU_F32 ? __uint_as_float(v) : st == CU_BF16 ? __uint_as_float(v << 16) : h2f(v);
}

/* The 32 bits at byte o of a unit held in registers (o even and known at
 * compile time once the loops are unrolled, so this is one byte_perm or
 * nothing). */
template <int NW>
__device__ __forceinline__ uint32_t qr_word(const uint32_t (&W)[NW], int o) {
    return (o & 3) ? __byte_perm(W[o >> 2], W[(o >> 2) + 1], 0x5432) : W[o >> 2];
}

/* Chunk c of a unit as the dp2a kernels take it: int8 codes in element
 * order (q8_0 and affine 8 as signed bytes, the offset moved into add) and
 * (mul, add) per half; rs, rb: affine scale and bias as loaded (qr_load). */
template <int F, int NW>
__device__ __forceinline__ void qr_chunk(qchunk &q, const uint32_t (&W)[NW], int c,
                                         const cu_qweight &w, uint32_t rs, uint32_t rb) {
    if (F == CU_Q4_0) {
        const int o = 18 * c;
        float d = h2f(qr_word(W, o) & 0xffffu);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            uint32_t v = qr_word(W, o + 2 + 4 * i);
            q.u[i] = v & 0x0F0F0F0Fu, q.u[i + 4] = (v >> 4) & 0x0F0F0F0Fu;
        }
        q.mul[0] = q.mul[1] = d, q.add[0] = q.add[1] = -8.f * d;
    } else if (F == CU_Q8_0) {
        const int o = 34 * c;
        float d = h2f(qr_word(W, o) & 0xffffu);
#pragma unroll
        for (int i = 0; i < 8; i++) q.u[i] = qr_word(W, o + 2 + 4 * i);
        q.mul[0] = q.mul[1] = d, q.add[0] = q.add[1] = 0.f;
    } else if (F == CU_Q4_K || F == CU_Q5_K) {
        /* one block: d, dmin (word 0), 12 scale bytes (words 1-3), q5_k's
         * high bits (words 4-11), then the nibbles; chunk c = sub-block c */
        const int QS = F == CU_Q4_K ? 4 : 12, shift = (c & 1) * 4;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            uint32_t v = (W[QS + 8 * (c >> 1) + i] >> shift) & 0x0F0F0F0Fu;
            if (F == CU_Q5_K) v |= ((W[4 + i] >> c) & 0x01010101u) << 4;
            q.u[i] = v;
        }
#define QR_SB(k) ((W[1 + ((k) >> 2)] >> (8 * ((k) & 3))) & 0xffu)
        int sc, m;
        if (c < 4) {
            sc = QR_SB(c) & 63, m = QR_SB(c + 4) & 63;
        } else {
            sc = (QR_SB(c + 4) & 15) | ((QR_SB(c - 4) >> 6) << 4);
            m = (QR_SB(c + 4) >> 4) | ((QR_SB(c) >> 6) << 4);
        }
#undef QR_SB
        float mul = h2f(W[0] & 0xffffu) * (float)sc, add = -(h2f(W[0] >> 16) * (float)m);
        q.mul[0] = q.mul[1] = mul, q.add[0] = q.add[1] = add;
    } else {
        if (F == CU_AFF4) {
#pragma unroll
            for (int i = 0; i < 4; i++) { /* nibbles lo, hi of each byte: elements 2k, 2k+1 */
                uint32_t v = W[4 * c + i];
                uint32_t lo = v & 0x0F0F0F0Fu, hi = (v >> 4) & 0x0F0F0F0Fu;
                q.u[2 * i] = __byte_perm(lo, hi, 0x5140);
                q.u[2 * i + 1] = __byte_perm(lo, hi, 0x7362);
            }
        } else {
#pragma unroll
            for (int i = 0; i < 8; i++) q.u[i] = W[8 * c + i] ^ 0x80808080u;
        }
        float s = scale_raw(rs, w.scale_type), a = scale_raw(rb, w.scale_type);
        if (F == CU_AFF8) a = fmaf(128.f, s, a); /* codes u - 128 */
        q.mul[0] = q.mul[1] = s, q.add[0] = q.add[1] = a;
    }
}

/* Units in flight per warp: three for the 9-word units (q4_0, q4_k,
 * affine 4), two for the larger ones (registers). */
template <int F> struct qr_depth {
    static const int n = qr_unit<F>::n16 <= 9 ? 3 : 2;
};

/* Loads unit u of row rr into b and, for affine weights (NS = 8), each
 * chunk's scale and bias as raw words: issued together, waited for only
 * where the unit is decoded (a conversion here would wait at once). */
template <int N16, int NS>
__device__ __forceinline__ void qr_load(uint4 (&b)[N16], uint32_t (&rs)[NS], uint32_t (&rb)[NS],
                                        const uint4 *wp, int u, const cu_qweight &w, int64_t rr) {
#pragma unroll
    for (int i = 0; i < N16; i++) b[i] = __ldg(wp + (size_t)u * N16 + i);
    if (NS == 8) {
        const int64_t ng = w.cols / w.group;
#pragma unroll
        for (int c = 0; c < NS; c++) {
            int64_t gi = rr * ng + ((int64_t)u * 8 + c) * 32 / w.group;
            if (w.scale_type == CU_F32) {
                rs[c] = __ldg((const uint32_t *)w.scales + gi), rb[c] = __ldg((const uint32_t *)w.biases + gi);
            } else {
                rs[c] = __ldg((const unsigned short *)w.scales + gi);
                rb[c] = __ldg((const unsigned short *)w.biases + gi);
            }
        }
    }
}

/* Unit u of this lane's row (its words in b) times the n token rows:
 * the unit's activations are rounded to int16 codes first, once per warp
 * (lane = token x chunk), into the warp's shared memory (xs, xm). */
template <int F, int NT, int N16, int NS>
__device__ __forceinline__ void qr_unit_dot(float (&acc)[NT], const uint4 (&b)[N16],
                                            const uint32_t (&rs)[NS], const uint32_t (&rb)[NS],
                                            const float *x, const cu_qweight &w, uint4 *xs,
                                            float4 *xm, int u, int G, int n) {
    const int lane = threadIdx.x & 31;
    const int64_t cols = w.cols;
    __syncwarp(); /* every lane is done reading the last unit's codes */
#pragma unroll
    for (int p0 = 0; p0 < 8 * NT; p0 += 32) {
        const int p = p0 + lane, t = p >> 3, c = p & 7;
        const bool valid = t < n;
        uint32_t xw[16];
        float dx;
        int s0, s1;
        qx_chunk(x + (size_t)(valid ? t : 0) * cols + ((int64_t)u * 8 + c) * 32, valid, G, xw, dx,
                 s0, s1);
        if (p < 8 * NT) {
#pragma unroll
            for (int i = 0; i < 4; i++)
                xs[4 * p + i] = make_uint4(xw[4 * i], xw[4 * i + 1], xw[4 * i + 2], xw[4 * i + 3]);
            xm[p] = make_float4(dx, __int_as_float(s0), __int_as_float(s1), 0.f);
        }
    }
    __syncwarp();
    uint32_t W[4 * N16];
#pragma unroll
    for (int i = 0; i < N16; i++)
        W[4 * i] = b[i].x, W[4 * i + 1] = b[i].y, W[4 * i + 2] = b[i].z, W[4 * i + 3] = b[i].w;
#pragma unroll
    for (int c = 0; c < 8; c++) {
        qchunk q;
        qr_chunk<F>(q, W, c, w, rs[c % NS], rb[c % NS]);
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t >= n) break;
            const uint4 *cp = xs + 4 * (t * 8 + c);
            uint4 a0 = cp[0], a1 = cp[1], a2 = cp[2], a3 = cp[3];
            const uint32_t xw[16] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w,
                                     a2.x, a2.y, a2.z, a2.w, a3.x, a3.y, a3.z, a3.w};
            float4 m = xm[t * 8 + c];
            acc[t] = fmaf(m.x, qdot_chunk(q, xw, __float_as_int(m.y), __float_as_int(m.z)), acc[t]);
        }
    }
}

/* One block owns 32 weight rows, lane l of every warp the row 32 b + l:
 * each lane reads its row's units with 16-byte loads (every weight byte
 * read once), the next units' loads in flight while one is decoded in
 * registers (qr_depth); no shared-memory staging of weights and no
 * barrier until the end.  Warp w takes units w, w + QR_WARPS, ...; the
 * activations of a unit are rounded to int16 codes once per warp (lane =
 * token x chunk, as the CPU rounds them) into the warp's shared memory,
 * which every lane then reads as a broadcast.  At the end the warps' sums
 * are added in warp order.  Which lane, warp and order a row's terms take
 * depends on the weight's shape only, never on n: a token row's result is
 * the same bits whatever the other rows of the batch are. */
template <int F, int NT>
__global__ void __launch_bounds__(QR_WARPS * 32)
    qgemv_reg_kernel(float *y, const float *x, cu_qweight w, int n) {
    cu_grid_trigger();
    const int N16 = qr_unit<F>::n16;
    extern __shared__ uint4 qr_smem[];
    __shared__ float red[QR_WARPS][NT][32];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t cols = w.cols, row = (int64_t)blockIdx.x * 32 + lane;
    const int64_t rr = row < w.rows ? row : w.rows - 1; /* clamped rows compute, never store */
    const int n_units = (int)(cols / QR_UNIT);
    const uint4 *wp = (const uint4 *)w.data + (size_t)rr * (size_t)n_units * N16;
    const int G = F == CU_AFF4 || F == CU_AFF8 ? w.group / 32 : 1;
    /* this warp's activation codes: [NT][8] chunks of 4 uint4, then [NT][8] metas */
    uint4 *xs = qr_smem + (size_t)warp * NT * 40;
    float4 *xm = (float4 *)(xs + NT * 32);

    /* a ring of QR_DEPTH units in registers: while one is decoded the
     * next ones are in flight, and a buffer is refilled as soon as it has
     * been used, so a load is waited for only where its unit is needed */
    const int D = qr_depth<F>::n, NS = F == CU_AFF4 || F == CU_AFF8 ? 8 : 1;
    uint4 buf[D][N16];
    uint32_t rs[D][NS], rb[D][NS];
#pragma unroll
    for (int d = 0; d < D; d++)
        if (warp + d * QR_WARPS < n_units)
            qr_load(buf[d], rs[d], rb[d], wp, warp + d * QR_WARPS, w, rr);
    cu_grid_wait();

    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0.f;
    for (int u0 = warp; u0 < n_units; u0 += D * QR_WARPS) {
#pragma unroll
        for (int d = 0; d < D; d++) {
            const int u = u0 + d * QR_WARPS;
            if (u < n_units) {
                qr_unit_dot<F, NT>(acc, buf[d], rs[d], rb[d], x, w, xs, xm, u, G, n);
                if (u + D * QR_WARPS < n_units)
                    qr_load(buf[d], rs[d], rb[d], wp, u + D * QR_WARPS, w, rr);
            }
        }
    }
#pragma unroll
    for (int t = 0; t < NT; t++) red[warp][t][lane] = acc[t];
    __syncthreads();
    for (int i = threadIdx.x; i < NT * 32; i += QR_WARPS * 32) {
        const int t = i >> 5, l = i & 31;
        const int64_t r = (int64_t)blockIdx.x * 32 + l;
        if (t >= n || r >= w.rows) continue;
        float v = red[0][t][l];
#pragma unroll
        for (int k = 1; k < QR_WARPS; k++) v += red[k][t][l];
        y[(size_t)t * w.rows + r] = v;
    }
}

/* ---- coalesced GEMV: q4_0, q8_0 ------------------------------------------------- */

/* The register GEMV above gives each lane its own row, so a warp's 16-byte
 * load touches 32 rows' lines and a lane holds a 2-3 unit ring (169
 * registers, 8 warps per SM: latency-bound, docs/cuda-notes.md run Q4).
 * This kernel reads the file's bytes with every lane of a warp on
 * consecutive 16 bytes of the same row, then transposes them in the
 * warp's shared memory so that each lane owns whole blocks:
 *
 *  - a step is 2048 columns (64 blocks) of QC_R rows; lane l owns blocks
 *    2l and 2l+1 of each row.  A row's step is 64 * 18 = 1152 bytes (q4_0)
 *    or 64 * 34 = 2176 (q8_0): whole 16-byte words, 16-byte aligned when a
 *    row is 256 * k columns.  The warp copies the QC_R row segments into
 *    its ring with 16-byte cp.async (every lane on consecutive words,
 *    QC_STAGES steps in flight), so weights take no registers in flight.
 *  - lane l then reads its block pair (36 or 68 bytes at a stride of 9 or
 *    17 words: no bank conflicts) with 4-byte shared loads; the first
 *    block's codes are 2 bytes off a word (one funnel shift per word).
 *  - the lane rounds its two chunks of activations to int16 codes (as the
 *    CPU, qx_chunk) once per token and step and uses them for its QC_R
 *    rows: the rounding, the costliest part per weight, is shared by the
 *    rows of the warp.
 *  - a block is W = min(8, steps) warps on the same rows, warp w taking
 *    steps w, w + W, ...; at the end each warp's lanes are summed with a
 *    butterfly and the warps' sums added in warp order.
 *
 * A row's order of operations depends on cols alone (which lane, step and
 * warp takes each block), not on the rows per warp QC_R (which varies with
 * the token count for registers) nor on n: batch-invariant. */
#define QC_STEP_CHUNKS 64
#define QC_MAXW 8
#define QC_STAGES 3

template <int F> struct qc_fmt {
    static const int bb = F == CU_Q4_0 ? 18 : 34; /* bytes per block */
    static const int pw = bb / 2;                 /* words per lane's block pair */
    static const int s16 = QC_STEP_CHUNKS * bb / 16; /* 16-byte words of a row's step */
};

/* Rows per warp R for NT token rows: more rows share the activation
 * rounding (q4_0 at 1-2 tokens, where it costs most per byte), fewer keep
 * the accumulators in registers and the ring small (q8_0).  At 1-2 tokens
 * PETREL_CUDA_QGEMV_CO=4, 8 or 16 overrides it, to measure.  Blocks per
 * SM the registers are sized for: 80 registers at 1-2 tokens. */
template <int F, int NT> struct qc_rows {
    static const int n = F == CU_Q4_0 && NT <= 2 ? 8 : 4;
};
template <int NT> struct qc_minb {
    static const int n = NT <= 2 ? 3 : NT <= 4 ? 2 : 1;
};

/* Warps per block for a row of cols columns (steps spread over them). */
static inline int qc_warps(int64_t cols) {
    int64_t steps = CU_DIV_UP(cols / 32, (int64_t)QC_STEP_CHUNKS);
    return steps < QC_MAXW ? (int)steps : QC_MAXW;
}
/* Ring slots per warp: up to QC_STAGES, no more than the warp's steps,
 * and the block's ring within 100 KiB where more than one slot (one slot
 * per warp is always taken: 72 KiB at most, 8 warps of 9 KiB). */
static inline int qc_stages(int64_t cols, size_t slot_bytes) {
    int64_t steps = CU_DIV_UP(cols / 32, (int64_t)QC_STEP_CHUNKS);
    int W = qc_warps(cols);
    int64_t per = CU_DIV_UP(steps, (int64_t)W), fit = (100 << 10) / ((size_t)W * slot_bytes);
    int64_t d = per < QC_STAGES ? per : QC_STAGES;
    d = d < fit ? d : fit;
    return d > 1 ? (int)d : 1;
}

/* Requests step s of the block's rows into ring slot `slot` (one commit
 * group per call, empty when s is past the row, so the wait count stays
 * D - 1). */
template <int F, int R>
__device__ __forceinline__ void qc_issue(uint4 *slot, const uint4 *w0, size_t row16, int64_t r0,
                                         int64_t rows, int s, int n_steps, int n_chunks) {
    const int S16 = qc_fmt<F>::s16, lane = threadIdx.x & 31;
    if (s < n_steps) {
        int cv = n_chunks - s * QC_STEP_CHUNKS;
        cv = cv < QC_STEP_CHUNKS ? cv : QC_STEP_CHUNKS;
        const int v16 = cv * qc_fmt<F>::bb / 16; /* cv is a multiple of 8 */
        /* row by row, lanes on consecutive words (few address operations:
         * a cp.async per 3-4 instructions) */
        const uint4 *src = w0 + (size_t)s * S16 + lane;
#pragma unroll
        for (int r = 0; r < R; r++) {
            const int64_t row = r0 + r < rows ? r0 + r : rows - 1; /* clamped: never stored */
            const uint4 *g = src + (size_t)row * row16;
            uint4 *d = slot + r * S16 + lane;
#pragma unroll
            for (int c = 0; c < S16; c += 32)
                if (c + lane < v16) cp_async16(d + c, g + c);
        }
    }
    cp_async_commit();
}

/* Block j (0 or 1) of the lane's block pair of one row in the ring (p:
 * the pair's first word), decoded as qdot_chunk takes it: q4_0 nibbles as
 * 0..15 with add = -8 d, q8_0 signed bytes with add = 0.  Block 0 has d in
 * the low half of word 0 and its codes from byte 2 (a funnel shift per
 * word); block 1 has d in the high half of word NQ and its codes
 * word-aligned after it. */
template <int F>
__device__ __forceinline__ void qc_block(qchunk &q, const uint32_t *p, int j) {
    const int NQ = F == CU_Q4_0 ? 4 : 8; /* code words per block */
    uint32_t V[NQ + 1];
#pragma unroll
    for (int i = 0; i <= NQ; i++) V[i] = p[j * NQ + i];
    float d = h2f(j ? V[0] >> 16 : V[0] & 0xffffu);
#pragma unroll
    for (int i = 0; i < NQ; i++) {
        uint32_t c = j ? V[i + 1] : __funnelshift_r(V[i], V[i + 1], 16);
        if (F == CU_Q4_0) q.u[i] = c & 0x0F0F0F0Fu, q.u[i + 4] = (c >> 4) & 0x0F0F0F0Fu;
        else q.u[i] = c;
    }
    q.mul[0] = q.mul[1] = d, q.add[0] = q.add[1] = (F == CU_Q4_0 ? -8.f : 0.f) * d;
}

template <int F, int NT, int R>
__global__ void __launch_bounds__(QC_MAXW * 32, qc_minb<NT>::n)
    qgemv_co_kernel(float *y, const float *x, cu_qweight w, int n, int D) {
    cu_grid_trigger();
    const int S16 = qc_fmt<F>::s16;
    extern __shared__ uint4 qc_smem[];
    __shared__ float red[QC_MAXW][R][NT];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, W = blockDim.x >> 5;
    const int64_t cols = w.cols, rows = w.rows, r0 = (int64_t)blockIdx.x * R;
    const int n_chunks = (int)(cols / 32), n_steps = (int)CU_DIV_UP(n_chunks, QC_STEP_CHUNKS);
    const size_t row16 = (size_t)n_chunks * qc_fmt<F>::bb / 16;
    const uint4 *w0 = (const uint4 *)w.data;
    uint4 *ring = qc_smem + (size_t)warp * D * R * S16;
    const int my_steps = warp < n_steps ? (n_steps - 1 - warp) / W + 1 : 0;

    /* D - 1 steps ahead of the one multiplied, one commit group each */
    for (int k = 0; k < D - 1; k++)
        qc_issue<F, R>(ring + k * R * S16, w0, row16, r0, rows, k < my_steps ? warp + k * W : n_steps,
                       n_steps, n_chunks);
    cu_grid_wait();

    float acc[R][NT];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) acc[r][t] = 0.f;

    for (int k = 0; k < my_steps; k++) {
        const int kn = k + D - 1; /* its slot was step k - 1's: done (syncwarp below) */
        qc_issue<F, R>(ring + (kn % D) * R * S16, w0, row16, r0, rows,
                       kn < my_steps ? warp + kn * W : n_steps, n_steps, n_chunks);
        const int s = warp + k * W;
        const int64_t c0 = (int64_t)s * QC_STEP_CHUNKS + 2 * lane; /* the lane's first chunk */
        const bool valid = c0 < n_chunks;
        /* one token row: its activations' loads and rounding overlap the
         * weights in flight instead of following them */
        uint32_t xw0[16], xw1[16];
        float dx0 = 0.f, dx1 = 0.f;
        int s00 = 0, s01 = 0, s10 = 0, s11 = 0;
        if constexpr (NT == 1) {
            qx_chunk(x + c0 * 32, valid, 1, xw0, dx0, s00, s01);
            qx_chunk(x + c0 * 32 + 32, valid, 1, xw1, dx1, s10, s11);
        }
        /* step k has landed (this lane's part): D - 1 groups may pend */
        if (D == 1) cp_async_wait<0>();
        else if (D == 2) cp_async_wait<1>();
        else cp_async_wait<2>();
        __syncwarp(); /* ... and the other lanes' */
        const uint32_t *p = (const uint32_t *)(ring + (k % D) * R * S16) + lane * qc_fmt<F>::pw;
        if constexpr (NT == 1) { /* codes rounded while the step was in flight (above) */
            if (valid) {
#pragma unroll
                for (int r = 0; r < R; r++) {
                    qchunk q;
                    qc_block<F>(q, p + r * S16 * 4, 0);
                    acc[r][0] = fmaf(dx0, qdot_chunk(q, xw0, s00, s01), acc[r][0]);
                }
#pragma unroll
                for (int r = 0; r < R; r++) {
                    qchunk q;
                    qc_block<F>(q, p + r * S16 * 4, 1);
                    acc[r][0] = fmaf(dx1, qdot_chunk(q, xw1, s10, s11), acc[r][0]);
                }
            }
        } else {
            /* chunk by chunk (one chunk's codes live at a time), token by
             * token; a row's terms come in the same order at every NT */
#pragma unroll
            for (int j = 0; j < 2; j++)
#pragma unroll
                for (int t = 0; t < NT; t++) {
                    if (t >= n) break;
                    uint32_t xw[16];
                    float dx;
                    int s0, s1;
                    qx_chunk(x + (size_t)t * cols + (c0 + j) * 32, valid, 1, xw, dx, s0, s1);
                    if (!valid) continue; /* the ring past the row holds stale bytes */
#pragma unroll
                    for (int r = 0; r < R; r++) {
                        qchunk q;
                        qc_block<F>(q, p + r * S16 * 4, j);
                        acc[r][t] = fmaf(dx, qdot_chunk(q, xw, s0, s1), acc[r][t]);
                    }
                }
        }
        __syncwarp(); /* every lane is done with slot k % D before it is refilled */
    }
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) {
            float v = cu_warp_sum(acc[r][t]);
            if (lane == 0) red[warp][r][t] = v;
        }
    __syncthreads();
    for (int i = threadIdx.x; i < R * NT; i += blockDim.x) {
        const int r = i / NT, t = i - r * NT;
        if (t >= n || r0 + r >= rows) continue;
        float v = red[0][r][t];
        for (int k = 1; k < W; k++) v += red[k][r][t];
        y[(size_t)t * rows + r0 + r] = v;
    }
}

/* Any row size: one block per weight row, chunks decoded from global
 * memory, up to CU_QGEMV_MAX_ROWS token rows. */
template <int F>
__global__ void __launch_bounds__(QM_THREADS)
    qgemv_plain_kernel(float *y, const float *x, cu_qweight w, int n) {
    cu_grid_trigger();
    cu_grid_wait();
    const int64_t row = blockIdx.x, cols = w.cols;
    const uint8_t *rp = (const uint8_t *)w.data + (size_t)row * qf_bytes(F, w.bits, cols);
    float acc[CU_QGEMV_MAX_ROWS];
#pragma unroll
    for (int t = 0; t < CU_QGEMV_MAX_ROWS; t++) acc[t] = 0.f;
    const bool split = (F == CU_Q4_0 || F == CU_Q8_0) && w.layout == CU_LAYOUT_SPLIT;
    for (int64_t c = threadIdx.x; c * 32 < cols; c += QM_THREADS) {
        qchunk q;
        if (split) qs_chunk<F>(q, w.data, row, c, cols);
        else qf_chunk<F>(q, rp, (int)c, c, w, row);
#pragma unroll
        for (int g = 0; g < 4; g++) {
            float wf[8];
            qf_get8(q, g, wf);
            for (int t = 0; t < n; t++)
#pragma unroll
                for (int i = 0; i < 8; i++)
                    acc[t] = fmaf(wf[i], x[(size_t)t * cols + c * 32 + 8 * g + i], acc[t]);
        }
    }
    __shared__ float red[QM_THREADS / 32][CU_QGEMV_MAX_ROWS];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
    for (int t = 0; t < CU_QGEMV_MAX_ROWS; t++) {
        float v = cu_warp_sum(acc[t]);
        if (lane == 0) red[warp][t] = v;
    }
    __syncthreads();
    if (threadIdx.x < n) {
        float v = 0.f;
        for (int k = 0; k < QM_THREADS / 32; k++) v += red[k][threadIdx.x];
        y[(size_t)threadIdx.x * w.rows + row] = v;
    }
}

/* ---- split GEMV: q4_0, q8_0 repacked at load (PT_LAYOUT_ROWSPLIT) ----------------- */

/* The file's 18- and 34-byte blocks put a block's codes 2 bytes off the
 * 16-byte grid, so every kernel above either copies them through shared
 * memory or gives each lane whole 144-byte runs of one row (169 registers,
 * scattered loads): neither read more than ~40 % of the bandwidth
 * (docs/cuda-notes.md runs Q4, Q5).  At load the backend rewrites each row
 * in place as its block codes (16 or 32 bytes a block, in order) followed by
 * its f16 scales (cuda_repack, qrepack_kernel below), the same bytes.
 * Then:
 *
 *  - a piece is one 16-byte load: a q4_0 block (32 weights) or half a q8_0
 *    block (16).  A step is 32 consecutive pieces of a row, one a lane: a
 *    warp's load is 512 consecutive bytes, fully coalesced.
 *  - an item is a step of QS_R rows.  A warp walks its items with a ring
 *    of qs_depth items in flight in registers (unrolled: no register copy
 *    waits on a load), across row groups, so it is never one load and done
 *    (the coalesced GEMV's limit).  The first items are requested before
 *    the kernel waits for its predecessor (PDL).
 *  - the block rounds the activations to int16 codes once, as the CPU does
 *    (qx_chunk), into shared memory: chunk c's 64 bytes of codes as four
 *    16-byte quarters, stored so that the quarters the lanes of a warp read
 *    together are consecutive (no bank conflicts), with (dx, sum of codes).
 *  - a lane's product of a piece is one exact integer sum (dp2a: two int16
 *    codes times two int8 weight codes), started at -8 * sum for q4_0 (its
 *    nibbles are code + 8), then one f32 multiply-add by d * dx.
 *  - the block's 8 warps are KS groups along K (KS by the shape alone:
 *    small matrices split K to fill the GPU) times 8 / KS row groups; a row
 *    group's sum is a butterfly over its lanes, then the KS warps' sums in
 *    warp order.  The grid is persistent: blocks take row groups blockIdx.x,
 *    + gridDim.x, ..., balanced so that none takes two more than another.
 *
 * Token rows are tiles of up to NT (the activations of NT rows must fit
 * shared memory: 16 rows at 4096 columns, 4 at 14336); each token row's
 * arithmetic is the same in every tile size and every tile, and KS depends
 * on the shape only, so a row gets the same bits alone or among 16. */
#define QS_WARPS 8
#define QS_R 2
#define QS_SMEM_MAX (200 << 10)

template <int F> struct qs_fmt {
    static const int cb = F == CU_Q4_0 ? 16 : 32; /* code bytes per block */
    static const int pc = F == CU_Q4_0 ? 32 : 16; /* columns per piece */
};
/* Items in flight per warp: more where an item is quick to multiply. */
template <int NT> struct qs_depth {
    static const int n = NT <= 2 ? 4 : 2;
};

/* Shared memory of the activation codes for NT token rows of cols columns:
 * 64 bytes of codes and 8 of (dx, sum) per chunk of 32. */
static inline size_t qs_smem(int nt, int64_t cols) {
    return (size_t)nt * (size_t)(cols / 32) * 72;
}

/* Where the codes and scales of this warp's QS_R rows from r0 start (rows
 * past the matrix read its last row: computed, never stored); set once a
 * row group, so that a request is two loads and two adds a row. */
__device__ __forceinline__ void qs_rows(const uint8_t *(&cp)[QS_R],
                                        const unsigned short *(&sp)[QS_R], const uint8_t *w0,
                                        int gs, size_t cr, size_t sr, int64_t rows, int64_t r0) {
#pragma unroll
    for (int r = 0; r < QS_R; r++) {
        const uint8_t *s;
        cp[r] = qs_row(w0, r0 + r < rows ? r0 + r : rows - 1, gs, cr, sr, &s);
        sp[r] = (const unsigned short *)s;
    }
}

/* Requests piece p (lane's 16 bytes of a step) of the rows at cp, sp into
 * b and sc. */
template <int F>
__device__ __forceinline__ void qs_issue(uint4 (&b)[QS_R], uint32_t (&sc)[QS_R],
                                         const uint8_t *const (&cp)[QS_R],
                                         const unsigned short *const (&sp)[QS_R], int p, int np) {
    if (p >= np) return;
#pragma unroll
    for (int r = 0; r < QS_R; r++) {
        b[r] = cu_ld_stream((const uint4 *)cp[r] + p);
        sc[r] = __ldg(sp[r] + (F == CU_Q4_0 ? p : p >> 1));
    }
}

/* One item: lane's piece of QS_R rows times the NT token rows' codes. */
template <int F, int NT>
__device__ __forceinline__ void qs_item(float (&acc)[QS_R][NT], const uint4 (&b)[QS_R],
                                        const uint32_t (&sc)[QS_R], const uint4 *xs,
                                        const float2 *xm, int nc, int st, int np, int n) {
    const int p = st * 32 + (threadIdx.x & 31);
    if (p >= np) return;
    float d[QS_R];
#pragma unroll
    for (int r = 0; r < QS_R; r++) d[r] = h2f(sc[r]);
    if (F == CU_Q4_0) {
        uint32_t lo[QS_R][4], hi[QS_R][4];
#pragma unroll
        for (int r = 0; r < QS_R; r++) {
            const uint32_t v[4] = {b[r].x, b[r].y, b[r].z, b[r].w};
#pragma unroll
            for (int i = 0; i < 4; i++)
                lo[r][i] = v[i] & 0x0F0F0F0Fu, hi[r][i] = (v[i] >> 4) & 0x0F0F0F0Fu;
        }
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t >= n) break;
            const uint4 *q = xs + (size_t)t * 4 * nc + p; /* chunk p's quarters, nc apart */
            const uint4 a0 = q[0], a1 = q[nc], a2 = q[2 * nc], a3 = q[3 * nc];
            const uint32_t xw[16] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w,
                                     a2.x, a2.y, a2.z, a2.w, a3.x, a3.y, a3.z, a3.w};
            const float2 m = xm[(size_t)t * nc + p];
#pragma unroll
            for (int r = 0; r < QS_R; r++) {
                /* byte i of word k: low nibble element 4k + i, high 16 + 4k + i */
                int h = -8 * __float_as_int(m.y);
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    h = __dp2a_lo((int)xw[2 * k], (int)lo[r][k], h);
                    h = __dp2a_hi((int)xw[2 * k + 1], (int)lo[r][k], h);
                    h = __dp2a_lo((int)xw[8 + 2 * k], (int)hi[r][k], h);
                    h = __dp2a_hi((int)xw[9 + 2 * k], (int)hi[r][k], h);
                }
                acc[r][t] = fmaf((float)h, __fmul_rn(d[r], m.x), acc[r][t]);
            }
        }
    } else {
        const int c = p >> 1, np2 = 2 * nc;
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t >= n) break;
            const uint4 *q = xs + (size_t)t * 2 * np2 + p; /* half p's quarters, 2 nc apart */
            const uint4 a0 = q[0], a1 = q[np2];
            const uint32_t xw[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
            const float dx = xm[(size_t)t * nc + c].x;
#pragma unroll
            for (int r = 0; r < QS_R; r++) {
                const uint32_t v[4] = {b[r].x, b[r].y, b[r].z, b[r].w};
                int h = 0;
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    h = __dp2a_lo((int)xw[2 * k], (int)v[k], h);
                    h = __dp2a_hi((int)xw[2 * k + 1], (int)v[k], h);
                }
                acc[r][t] = fmaf((float)h, __fmul_rn(d[r], dx), acc[r][t]);
            }
        }
    }
}

/* A launch: cu_fused's matrices (one, or QKV, or gate and up) on one
 * input, each a segment of the grid, blocks [first[s], first[s + 1]),
 * with its own K split ks[s]: each segment runs exactly as its matrix
 * alone would (the grid only decides which block takes a row group, never
 * a row's arithmetic). */
struct qs_args {
    cu_fused f;
    int ks[CU_FUSE_MAX_W];
    int first[CU_FUSE_MAX_W + 1];
};

template <int F, int NT>
__global__ void __launch_bounds__(QS_WARPS * 32, 2) qgemv_split_kernel(const qs_args a) {
    cu_grid_trigger();
    const int P = qs_depth<NT>::n;
    extern __shared__ uint4 qs_smem_buf[];
    __shared__ float red[2][QS_WARPS][QS_R][NT];
    __shared__ float nred[33], nscale[NT];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    /* this block's segment (indices written out: no local copy of a) */
    int seg = 0;
#pragma unroll
    for (int i = 1; i < CU_FUSE_MAX_W; i++)
        if (i < a.f.nw && (int)blockIdx.x >= a.first[i]) seg = i;
    float *y = a.f.y[0];
    const float *bias = a.f.bias[0];
    const uint8_t *w0 = (const uint8_t *)a.f.w[0].data;
    int64_t rows = a.f.w[0].rows;
    int ks = a.ks[0], bid = (int)blockIdx.x, nblk = a.first[1];
#pragma unroll
    for (int i = 1; i < CU_FUSE_MAX_W; i++)
        if (seg == i) {
            y = a.f.y[i], bias = a.f.bias[i], w0 = (const uint8_t *)a.f.w[i].data;
            rows = a.f.w[i].rows;
            ks = a.ks[i], bid = (int)blockIdx.x - a.first[i], nblk = a.first[i + 1] - a.first[i];
        }
    const float *x = a.f.x;
    const int n = a.f.n;
    const int64_t cols = a.f.w[0].cols;
    const int nc = (int)(cols / 32), np = (int)(cols / qs_fmt<F>::pc);
    const int n_steps = CU_DIV_UP(np, 32), S = n_steps / ks; /* ks divides n_steps */
    const int rgs = QS_WARPS / ks, kw = warp % ks, rg = warp / ks;
    const int64_t per_cg = (int64_t)rgs * QS_R, n_cg = CU_DIV_UP(rows, per_cg);
    const int my_cg =
        (int64_t)bid < n_cg ? (int)((n_cg - 1 - bid) / nblk) + 1 : 0;
    const int total = my_cg * S;
    const size_t cr = (size_t)nc * qs_fmt<F>::cb, sr = (size_t)nc * 2;
    const int gs = qs_gshift(F, cols);
    uint4 *xs = qs_smem_buf;
    float2 *xm = (float2 *)(xs + (size_t)NT * 4 * nc);

    /* the ring: item i of this warp in slot i % P; head = next to request */
    uint4 b[P][QS_R];
    uint32_t sc[P][QS_R];
    int hl = 0, hs = 0;
    const uint8_t *hc[QS_R];
    const unsigned short *hsc[QS_R];
    qs_rows(hc, hsc, w0, gs, cr, sr, rows, (int64_t)bid * per_cg + rg * QS_R);
#pragma unroll
    for (int j = 0; j < P; j++) {
        if (j < total) {
            qs_issue<F>(b[j], sc[j], hc, hsc, (kw + hs * ks) * 32 + lane, np);
            if (++hs == S) {
                hs = 0, hl++;
                qs_rows(hc, hsc, w0, gs, cr, sr, rows,
                        ((int64_t)bid + (int64_t)hl * nblk) * per_cg + rg * QS_R);
            }
        }
    }
    cu_grid_wait();

    /* the activations as int16 codes, once per block: x's, or made from x
     * as the op before the matmul makes them (rmsnorm, swiglu; fused) */
    const int pro = a.f.pro;
    if (pro == CU_PRO_NORM) {
        for (int t = 0; t < n; t++) {
            const float r = cu_rms_scale(x + (size_t)t * cols, (int)cols, a.f.eps, nred);
            if (threadIdx.x == 0) nscale[t] = r;
        }
        __syncthreads();
    }
    float *norm_y = blockIdx.x == 0 ? a.f.norm_y : NULL; /* one block stores the norm */
    for (int i = threadIdx.x; i < n * nc; i += blockDim.x) {
        const int t = i / nc, c = i - t * nc;
        const size_t off = (size_t)t * cols + (size_t)c * 32;
        uint32_t xw[16];
        float dx;
        int s0, s1;
        float v[32];
#pragma unroll
        for (int k = 0; k < 8; k++) {
            const float4 q = __ldg((const float4 *)(x + off) + k);
            v[4 * k] = q.x, v[4 * k + 1] = q.y, v[4 * k + 2] = q.z, v[4 * k + 3] = q.w;
        }
        if (pro == CU_PRO_NORM) { /* as rmsnorm: x * r * g */
            const float r = nscale[t], *g = a.f.g + (size_t)c * 32;
#pragma unroll
            for (int k = 0; k < 32; k++) v[k] = v[k] * r * __ldg(g + k);
            if (norm_y)
#pragma unroll
                for (int k = 0; k < 8; k++)
                    ((float4 *)(norm_y + off))[k] =
                        make_float4(v[4 * k], v[4 * k + 1], v[4 * k + 2], v[4 * k + 3]);
        } else if (pro == CU_PRO_SWIGLU) {
            const float *u = a.f.up + off;
#pragma unroll
            for (int k = 0; k < 32; k++) v[k] = cu_silu_mul(v[k], __ldg(u + k));
        }
        qx_codes(v, 1, xw, dx, s0, s1);
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const uint4 v = make_uint4(xw[4 * j], xw[4 * j + 1], xw[4 * j + 2], xw[4 * j + 3]);
            if (F == CU_Q4_0) xs[((size_t)t * 4 + j) * nc + c] = v;
            else xs[((size_t)t * 2 + (j & 1)) * 2 * nc + 2 * c + (j >> 1)] = v;
        }
        xm[(size_t)t * nc + c] = make_float2(dx, __int_as_float(s0 + s1));
    }
    __syncthreads();

    float acc[QS_R][NT];
#pragma unroll
    for (int r = 0; r < QS_R; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) acc[r][t] = 0.f;
    int tl = 0, ts = 0, par = 0; /* tail: the item multiplied next */
    for (int i0 = 0; i0 < total; i0 += P) {
#pragma unroll
        for (int j = 0; j < P; j++) {
            if (i0 + j >= total) break; /* the same for every warp of the block */
            qs_item<F, NT>(acc, b[j], sc[j], xs, xm, nc, kw + ts * ks, np, n);
            if (i0 + j + P < total) {
                qs_issue<F>(b[j], sc[j], hc, hsc, (kw + hs * ks) * 32 + lane, np);
                if (++hs == S) {
                    hs = 0, hl++;
                    qs_rows(hc, hsc, w0, gs, cr, sr, rows,
                            ((int64_t)bid + (int64_t)hl * nblk) * per_cg + rg * QS_R);
                }
            }
            if (++ts < S) continue;
            /* row group tl done: its sums */
            const int64_t g0 = ((int64_t)bid + (int64_t)tl * nblk) * per_cg;
            const int64_t r0 = g0 + rg * QS_R;
            ts = 0, tl++;
#pragma unroll
            for (int r = 0; r < QS_R; r++)
#pragma unroll
                for (int t = 0; t < NT; t++) {
                    if (t >= n) break;
                    float v = cu_warp_sum(acc[r][t]);
                    acc[r][t] = 0.f;
                    if (ks == 1) {
                        if (lane == 0 && r0 + r < rows) {
                            const size_t o = (size_t)t * rows + r0 + r;
                            if (bias) v += bias[r0 + r]; /* as add_bias: y + b */
                            y[o] = v;
                            if (a.f.res_out) a.f.res_out[o] = a.f.res_in[o] + v;
                        }
                    } else if (lane == 0) {
                        red[par][warp][r][t] = v;
                    }
                }
            if (ks > 1) { /* the ks warps of each row group, in warp order */
                __syncthreads();
                for (int k = threadIdx.x; k < rgs * QS_R * NT; k += blockDim.x) {
                    const int g = k / (QS_R * NT), r = (k / NT) % QS_R, t = k % NT;
                    const int64_t row = g0 + g * QS_R + r;
                    if (t >= n || row >= rows) continue;
                    float v = red[par][g * ks][r][t];
                    for (int q = 1; q < ks; q++) v += red[par][g * ks + q][r][t];
                    const size_t o = (size_t)t * rows + row;
                    if (bias) v += bias[row]; /* as add_bias: y + b */
                    y[o] = v;
                    if (a.f.res_out) a.f.res_out[o] = a.f.res_in[o] + v; /* as add: x + y */
                }
                par ^= 1; /* the next group writes the other half before the next barrier */
            }
        }
    }
}

/* Rewrites a q4_0/q8_0 matrix (src, the file's blocks of bb bytes) as
 * groups of 2^gs rows, their codes then their scales (dst, the same size):
 * a thread a block, 2-byte copies (blocks are 2-byte aligned). */
__global__ void qrepack_kernel(uint8_t *dst, const uint8_t *src, int64_t rows, int64_t nb, int bb,
                               int gs) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * nb) return;
    const int64_t r = i / nb, c = i - r * nb;
    const uint16_t *s = (const uint16_t *)(src + (size_t)i * bb);
    const uint8_t *sp, *cp = qs_row(dst, r, gs, (size_t)nb * (bb - 2), (size_t)nb * 2, &sp);
    uint16_t *codes = (uint16_t *)(cp + (size_t)c * (bb - 2));
    for (int k = 1; k < bb / 2; k++) codes[k - 1] = s[k];
    ((uint16_t *)sp)[c] = s[0];
}

/* ---- dequantization: prefill (f16 for cuBLAS) and embeddings (f32) ------------ */

/* out row i = weight row ids[i] (ids NULL: row i; an id out of range gives
 * zeros), one block per row, one chunk per thread and step. */
template <int F, typename O>
__global__ void qdequant_kernel(O *out, cu_qweight w, const int32_t *ids) {
    cu_grid_trigger();
    cu_grid_wait();
    const int64_t i = blockIdx.x, cols = w.cols;
    int64_t r = ids ? ids[i] : i;
    bool ok = r >= 0 && r < w.rows;
    const uint8_t *rp = (const uint8_t *)w.data + (size_t)(ok ? r : 0) * qf_bytes(F, w.bits, cols);
    O *dst = out + (size_t)i * cols;
    const bool split = (F == CU_Q4_0 || F == CU_Q8_0) && w.layout == CU_LAYOUT_SPLIT;
    for (int64_t c = threadIdx.x; c * 32 < cols; c += blockDim.x) {
        qchunk q;
        if (ok && split) qs_chunk<F>(q, w.data, r, c, cols);
        else if (ok) qf_chunk<F>(q, rp, (int)c, c, w, r);
#pragma unroll
        for (int g = 0; g < 4; g++) {
            float wf[8];
            if (ok) qf_get8(q, g, wf);
#pragma unroll
            for (int k = 0; k < 8; k++) wf[k] = ok ? wf[k] : 0.f;
            if (sizeof(O) == 4) { /* two 16-byte stores */
                float4 *d = (float4 *)((float *)dst + c * 32 + 8 * g);
                d[0] = make_float4(wf[0], wf[1], wf[2], wf[3]);
                d[1] = make_float4(wf[4], wf[5], wf[6], wf[7]);
            } else { /* one */
                __half2 h[4];
#pragma unroll
                for (int k = 0; k < 4; k++) h[k] = __floats2half2_rn(wf[2 * k], wf[2 * k + 1]);
                *(uint4 *)((__half *)dst + c * 32 + 8 * g) = *(const uint4 *)h;
            }
        }
    }
}

/* ---- launchers ------------------------------------------------------------------- */

/* CALL(F) with F the weight's format constant (QF_DISPATCH_TUNED: the
 * formats of the staged GEMV: not CU_AFFN, and not q4_0/q8_0/q4_k/q5_k,
 * whose 16-byte aligned rows are whole units of the register GEMV). */
#define QF_DISPATCH_TUNED(fmt, CALL)                                                               \
    switch (fmt) {                                                                                 \
    case CU_Q6_K: CALL(CU_Q6_K); break;                                                            \
    case CU_AFF4: CALL(CU_AFF4); break;                                                            \
    case CU_AFF8: CALL(CU_AFF8); break;                                                            \
    default: return -1;                                                                            \
    }
#define QF_DISPATCH(fmt, CALL)                                                                     \
    switch (fmt) {                                                                                 \
    case CU_Q8_0: CALL(CU_Q8_0); break;                                                            \
    case CU_Q4_0: CALL(CU_Q4_0); break;                                                            \
    case CU_Q4_K: CALL(CU_Q4_K); break;                                                            \
    case CU_Q5_K: CALL(CU_Q5_K); break;                                                            \
    case CU_Q6_K: CALL(CU_Q6_K); break;                                                            \
    case CU_AFF4: CALL(CU_AFF4); break;                                                            \
    case CU_AFF8: CALL(CU_AFF8); break;                                                            \
    case CU_AFFN: CALL(CU_AFFN); break;                                                            \
    default: return -1;                                                                            \
    }

extern "C" int cu_qweight_ok(const cu_qweight *w) {
    if (w->rows < 1 || w->cols < 1 || w->cols % qf_block(w->fmt) || !cu_aligned16(w->data))
        return 0;
    if (w->layout != CU_LAYOUT_FILE && (w->layout != CU_LAYOUT_SPLIT || !cu_qsplit_ok(w))) return 0;
    if (w->fmt >= CU_AFF4) {
        if (w->bits < 2 || w->bits > 8 || w->group < 32 || w->group % 32 || w->cols % w->group ||
            !w->scales || !w->biases)
            return 0;
        if ((w->fmt == CU_AFF4) != (w->bits == 4) || (w->fmt == CU_AFF8) != (w->bits == 8)) return 0;
    } else if (w->fmt < CU_Q8_0 || w->fmt > CU_Q6_K) {
        return 0;
    }
    return 1;
}

/* The staged kernel needs 16-byte aligned rows and tiles. */
static bool staged_ok(const cu_qweight *w) {
    return qf_bytes(w->fmt, w->bits, w->cols) % 16 == 0 &&
           qf_bytes(w->fmt, w->bits, QM_TILE) % 16 == 0 && w->fmt != CU_AFFN;
}

/* Shared memory of the staged GEMV for format F, and how many of its blocks
 * fit on the device at once (cu_qgemv_init: not during a graph capture). */
static size_t qgemv_smem(int f) {
    return (size_t)QM_STAGES * QM_ROWS * (size_t)qf_bytes(f, f == CU_AFF4 ? 4 : 8, QM_TILE);
}

/* Where cu_ctx.qgemv_fit keeps the grid of NT token rows (1, 2, 4, 8, 16). */
template <int NT> static constexpr int qgemv_slot() {
    return NT == 1 ? 0 : NT == 2 ? 1 : NT == 4 ? 2 : NT == 8 ? 3 : 4;
}

template <int F, int NT> static void qgemv_init_one(cu_ctx *c) {
    int sms = c->n_sm;
    size_t smem = qgemv_smem(F);
    cudaFuncSetAttribute(qgemv_kernel<F, NT>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    int per_sm = 0;
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, qgemv_kernel<F, NT>, QM_THREADS, smem);
    c->qgemv_fit[F - CU_Q8_0][qgemv_slot<NT>()] = (sms > 0 ? sms : 1) * (per_sm > 0 ? per_sm : 1);
}

template <int F> static void qgemv_init_fmt(cu_ctx *c) {
    qgemv_init_one<F, 1>(c), qgemv_init_one<F, 2>(c), qgemv_init_one<F, 4>(c);
    qgemv_init_one<F, 8>(c), qgemv_init_one<F, 16>(c);
}

/* Dynamic shared memory of the register GEMV: activation codes and their
 * scales, [NT][8 chunks] per warp. */
static size_t qr_smem_bytes(int nt) {
    return (size_t)QR_WARPS * nt * 40 * 16;
}

template <int F> static void qr_init_fmt() {
    cudaFuncSetAttribute(qgemv_reg_kernel<F, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)qr_smem_bytes(1));
    cudaFuncSetAttribute(qgemv_reg_kernel<F, 2>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)qr_smem_bytes(2));
    cudaFuncSetAttribute(qgemv_reg_kernel<F, 4>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)qr_smem_bytes(4));
    cudaFuncSetAttribute(qgemv_reg_kernel<F, 8>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)qr_smem_bytes(8));
    cudaFuncSetAttribute(qgemv_reg_kernel<F, 16>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)qr_smem_bytes(16));
}

template <int F, int NT, int R> static void qc_init_one() {
    /* the largest ring: qc_stages, or one slot of 16 q4_0 rows per warp */
    const int m = R == 16 ? 8 * 16 * qc_fmt<F>::s16 * 16 : 100 << 10;
    cudaFuncSetAttribute(qgemv_co_kernel<F, NT, R>, cudaFuncAttributeMaxDynamicSharedMemorySize, m);
}
template <int F> static void qc_init_fmt() {
    const int R16 = F == CU_Q4_0 ? 16 : 8;
    qc_init_one<F, 1, 4>(), qc_init_one<F, 1, 8>(), qc_init_one<F, 1, R16>();
    qc_init_one<F, 2, 4>(), qc_init_one<F, 2, 8>(), qc_init_one<F, 2, R16>();
    qc_init_one<F, 4, 4>(), qc_init_one<F, 8, 4>(), qc_init_one<F, 16, 4>();
}

/* Token rows per launch of the split GEMV kernel (a power of two, at
 * most 16) whose activation codes fit its shared memory; 0: none. */
static int qs_tile(int64_t cols) {
    int nt = 16;
    while (nt > 0 && qs_smem(nt, cols) > QS_SMEM_MAX) nt >>= 1;
    return nt;
}

template <int F, int NT> static void qs_init_one(cu_ctx *c) {
    cudaFuncSetAttribute(qgemv_split_kernel<F, NT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         QS_SMEM_MAX);
    int per_sm = 0;
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, qgemv_split_kernel<F, NT>, QS_WARPS * 32,
                                                  0);
    c->qsplit_fit[F == CU_Q8_0][qgemv_slot<NT>()] = per_sm > 0 ? per_sm : 1;
}
template <int F> static void qs_init_fmt(cu_ctx *c) {
    qs_init_one<F, 1>(c), qs_init_one<F, 2>(c), qs_init_one<F, 4>(c);
    qs_init_one<F, 8>(c), qs_init_one<F, 16>(c);
}

extern "C" void cu_qgemv_init(cu_ctx *c) {
    int dev = 0;
    cudaGetDevice(&dev);
    if (cudaDeviceGetAttribute(&c->smem_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev) !=
        cudaSuccess)
        c->smem_sm = 0;
    qs_init_fmt<CU_Q4_0>(c), qs_init_fmt<CU_Q8_0>(c);
    qc_init_fmt<CU_Q4_0>(), qc_init_fmt<CU_Q8_0>();
    qr_init_fmt<CU_Q4_0>(), qr_init_fmt<CU_Q8_0>(), qr_init_fmt<CU_Q4_K>(), qr_init_fmt<CU_Q5_K>();
    qr_init_fmt<CU_AFF4>(), qr_init_fmt<CU_AFF8>();
    qgemv_init_fmt<CU_Q6_K>(c), qgemv_init_fmt<CU_AFF4>(c);
    qgemv_init_fmt<CU_AFF8>(c);
    cudaGetLastError(); /* an attribute the device refuses shows up as a launch error later */
}

/* Launched without PDL: a persistent grid started early lands unevenly on
 * the SMs (docs/cuda-notes.md, run 4), and each block owns a fixed share. */
template <int F, int NT>
static void launch_qgemv(const cu_ctx *c, float *y, const float *x, const cu_qweight &w, int n) {
    int64_t groups = CU_DIV_UP(w.rows, (int64_t)QM_ROWS);
    int fit = c->qgemv_fit[F - CU_Q8_0][qgemv_slot<NT>()];
    if (fit <= 0) fit = 132 * 2;
    unsigned grid = (unsigned)(groups < fit ? groups : fit);
    cudaLaunchConfig_t cfg = cu_config_pdl(grid, QM_THREADS, qgemv_smem(F), c->s, false);
    cudaLaunchKernelEx(&cfg, qgemv_kernel<F, NT>, y, x, w, n);
}

template <int F>
static void qgemv_fmt(const cu_ctx *c, float *y, const float *x, const cu_qweight &w, int n) {
    if (n == 1) launch_qgemv<F, 1>(c, y, x, w, n);
    else if (n == 2) launch_qgemv<F, 2>(c, y, x, w, n);
    else if (n <= 4) launch_qgemv<F, 4>(c, y, x, w, n);
    else if (n <= 8) launch_qgemv<F, 8>(c, y, x, w, n);
    else launch_qgemv<F, 16>(c, y, x, w, n);
}

template <int F, int NT>
static void launch_qr(const cu_ctx *c, float *y, const float *x, const cu_qweight &w, int n) {
    unsigned grid = (unsigned)CU_DIV_UP(w.rows, (int64_t)32);
    CU_LAUNCH((qgemv_reg_kernel<F, NT>), grid, QR_WARPS * 32, qr_smem_bytes(NT), c, y, x, w, n);
}

template <int F>
static void qr_fmt(const cu_ctx *c, float *y, const float *x, const cu_qweight &w, int n) {
    if (n == 1) launch_qr<F, 1>(c, y, x, w, n);
    else if (n == 2) launch_qr<F, 2>(c, y, x, w, n);
    else if (n <= 4) launch_qr<F, 4>(c, y, x, w, n);
    else if (n <= 8) launch_qr<F, 8>(c, y, x, w, n);
    else launch_qr<F, 16>(c, y, x, w, n);
}

/* W warps of R rows, each with a ring of D slots (dynamic shared memory). */
template <int F, int NT, int R>
static void launch_qc(const cu_ctx *c, float *y, const float *x, const cu_qweight &w, int n) {
    const int W = qc_warps(w.cols);
    const size_t slot = (size_t)R * qc_fmt<F>::s16 * 16;
    const int D = qc_stages(w.cols, slot);
    unsigned grid = (unsigned)CU_DIV_UP(w.rows, (int64_t)R);
    CU_LAUNCH((qgemv_co_kernel<F, NT, R>), grid, W * 32, (size_t)W * D * slot, c, y, x, w, n, D);
}

template <int F, int NT>
static void launch_qc_r(const cu_ctx *c, float *y, const float *x, const cu_qweight &w, int n) {
    switch (c->qgemv_co) { /* PETREL_CUDA_QGEMV_CO=4|8|16 */
    case 4: launch_qc<F, NT, 4>(c, y, x, w, n); break;
    case 8: launch_qc<F, NT, 8>(c, y, x, w, n); break;
    case 16: /* q8_0: 8 warps of 16 rows would not fit shared memory */
        launch_qc<F, NT, F == CU_Q4_0 ? 16 : 8>(c, y, x, w, n);
        break;
    default: launch_qc<F, NT, qc_rows<F, NT>::n>(c, y, x, w, n); break;
    }
}

template <int F>
static void qc_fmt_launch(const cu_ctx *c, float *y, const float *x, const cu_qweight &w, int n) {
    if (n == 1) launch_qc_r<F, 1>(c, y, x, w, n);
    else if (n == 2) launch_qc_r<F, 2>(c, y, x, w, n);
    else if (n <= 4) launch_qc<F, 4, qc_rows<F, 4>::n>(c, y, x, w, n);
    else if (n <= 8) launch_qc<F, 8, qc_rows<F, 8>::n>(c, y, x, w, n);
    else launch_qc<F, 16, qc_rows<F, 16>::n>(c, y, x, w, n);
}

/* Whether the coalesced GEMV takes w: q4_0 (and q8_0 when
 * PETREL_CUDA_QGEMV_CO is 2, 4, 8 or 16) rows of 256 * k columns (16-byte
 * aligned rows and steps).  q8_0 stays on the register GEMV by default:
 * there the coalesced one was no faster at one token row (docs/cuda-notes.md
 * run Q5).  A choice by format, never by n: rows stay batch-invariant. */
static bool qc_ok(const cu_ctx *c, const cu_qweight *w) {
    bool fmt = w->fmt == CU_Q4_0 || (w->fmt == CU_Q8_0 && c->qgemv_co > 1);
    return c->qgemv_co && fmt && w->cols % QR_UNIT == 0 && w->rows <= 0x7fffffffLL * 4;
}

/* K split of the split GEMV, by the shape alone (batch invariance): the
 * most warps along K (a power of two dividing the steps, at most 8) that
 * keep the warps of the whole matrix within 16 an SM, so a small matrix
 * (wk: 1024 rows) still fills the GPU. */
static int qs_ksplit(const cu_qweight &w, int n_sm) {
    const int64_t np = w.cols / (w.fmt == CU_Q4_0 ? 32 : 16), steps = CU_DIV_UP(np, (int64_t)32);
    const int64_t groups = CU_DIV_UP(w.rows, (int64_t)QS_R);
    int ks = 1;
    while (2 * ks <= QS_WARPS && steps % (2 * ks) == 0 && groups * 2 * ks <= (int64_t)n_sm * 16)
        ks *= 2;
    return ks;
}

/* One launch of NT token rows: each segment's grid is its share (by rows)
 * of what fits at once (registers and shared memory), balanced over its
 * row groups; one matrix alone gets all of it. */
template <int F, int NT> static void qs_launch(const cu_ctx *c, qs_args &a) {
    const cu_fused &f = a.f;
    const size_t smem = qs_smem(NT, f.w[0].cols);
    int per_sm = c->qsplit_fit[F == CU_Q8_0][qgemv_slot<NT>()];
    const size_t block_smem = smem + sizeof(float) * 2 * QS_WARPS * QS_R * NT + 1024;
    const int by_smem = c->smem_sm > 0 ? (int)(c->smem_sm / block_smem) : 1;
    per_sm = per_sm < by_smem ? per_sm : by_smem;
    const int n_sm = c->n_sm > 0 ? c->n_sm : 132;
    const int64_t cap = (int64_t)n_sm * (per_sm > 0 ? per_sm : 1);
    int64_t all_rows = 0;
    for (int i = 0; i < f.nw; i++) all_rows += f.w[i].rows;
    a.first[0] = 0;
    for (int i = 0; i < CU_FUSE_MAX_W; i++) {
        if (i >= f.nw) {
            a.ks[i] = 1, a.first[i + 1] = a.first[i];
            continue;
        }
        const int ks = qs_ksplit(f.w[i], n_sm);
        const int64_t n_cg = CU_DIV_UP(f.w[i].rows, (int64_t)(QS_WARPS / ks) * QS_R);
        int64_t share = cap * f.w[i].rows / all_rows;
        share = share > 0 ? share : 1;
        const int64_t grid = n_cg <= share ? n_cg : CU_DIV_UP(n_cg, CU_DIV_UP(n_cg, share));
        a.ks[i] = ks, a.first[i + 1] = a.first[i] + (int)grid;
    }
    CU_LAUNCH((qgemv_split_kernel<F, NT>), (unsigned)a.first[f.nw], QS_WARPS * 32, smem, c, a);
}

template <int F> static void qs_launch_rows(const cu_ctx *c, qs_args &a, int m) {
    if (m == 1) qs_launch<F, 1>(c, a);
    else if (m == 2) qs_launch<F, 2>(c, a);
    else if (m <= 4) qs_launch<F, 4>(c, a);
    else if (m <= 8) qs_launch<F, 8>(c, a);
    else qs_launch<F, 16>(c, a);
}

/* n token rows in tiles of at most qs_tile(cols). */
template <int F>
static void qs_fmt_launch(const cu_ctx *c, float *y, const float *x, const cu_qweight &w, int n) {
    const int tile = qs_tile(w.cols);
    for (int t0 = 0; t0 < n; t0 += tile) {
        const int m = n - t0 < tile ? n - t0 : tile;
        qs_args a = {};
        a.f.x = x + (size_t)t0 * w.cols, a.f.n = m, a.f.nw = 1;
        a.f.y[0] = y + (size_t)t0 * w.rows, a.f.w[0] = w;
        qs_launch_rows<F>(c, a, m);
    }
}

extern "C" int cu_qsplit_ok(const cu_qweight *w) {
    return (w->fmt == CU_Q4_0 || w->fmt == CU_Q8_0) && w->cols % 32 == 0 && w->rows >= 1 &&
           w->rows % (1 << qs_gshift(w->fmt, w->cols)) == 0 && w->rows <= 0x7fffffffLL &&
           qs_tile(w->cols) >= 1;
}

extern "C" int cu_qrepack(const cu_ctx *c, void *dst, const cu_qweight *w) {
    if (!cu_qsplit_ok(w) || w->layout != CU_LAYOUT_FILE) return -1;
    const int64_t nb = w->cols / 32, blocks = w->rows * nb;
    const int bb = w->fmt == CU_Q4_0 ? 18 : 34;
    qrepack_kernel<<<(unsigned)CU_DIV_UP(blocks, (int64_t)256), 256, 0, c->s>>>(
        (uint8_t *)dst, (const uint8_t *)w->data, w->rows, nb, bb, qs_gshift(w->fmt, w->cols));
    return 0;
}

/* The kernel is chosen by the weight's format and shape and x's alignment,
 * never by n, so a token row gets the same bits at every n (batch
 * invariance: speculative verification equals decoding row by row). */
extern "C" int cu_qgemv(const cu_ctx *c, float *y, const float *x, const cu_qweight *w, int n) {
    if (n < 1 || n > CU_QGEMV_MAX_ROWS || !cu_qweight_ok(w)) return -1;
    const cu_qweight ww = *w;
    if (w->layout == CU_LAYOUT_SPLIT && cu_aligned16(x)) {
        if (w->fmt == CU_Q4_0) qs_fmt_launch<CU_Q4_0>(c, y, x, ww, n);
        else qs_fmt_launch<CU_Q8_0>(c, y, x, ww, n);
        return 0;
    }
    if (w->layout == CU_LAYOUT_SPLIT) { /* x not 16-byte aligned: the plain kernel */
        const unsigned grid = (unsigned)ww.rows;
        if (w->fmt == CU_Q4_0)
            CU_LAUNCH((qgemv_plain_kernel<CU_Q4_0>), grid, QM_THREADS, 0, c, y, x, ww, n);
        else
            CU_LAUNCH((qgemv_plain_kernel<CU_Q8_0>), grid, QM_THREADS, 0, c, y, x, ww, n);
        return 0;
    }
    if (qc_ok(c, w) && cu_aligned16(x)) {
        if (w->fmt == CU_Q4_0) qc_fmt_launch<CU_Q4_0>(c, y, x, ww, n);
        else qc_fmt_launch<CU_Q8_0>(c, y, x, ww, n);
        return 0;
    }
    const bool reg = w->fmt != CU_Q6_K && w->fmt != CU_AFFN;
    if (reg && w->cols % QR_UNIT == 0 && w->rows <= 0x7fffffffLL * 32 && cu_aligned16(x)) {
        switch (w->fmt) {
        case CU_Q4_0: qr_fmt<CU_Q4_0>(c, y, x, ww, n); break;
        case CU_Q8_0: qr_fmt<CU_Q8_0>(c, y, x, ww, n); break;
        case CU_Q4_K: qr_fmt<CU_Q4_K>(c, y, x, ww, n); break;
        case CU_Q5_K: qr_fmt<CU_Q5_K>(c, y, x, ww, n); break;
        case CU_AFF4: qr_fmt<CU_AFF4>(c, y, x, ww, n); break;
        default: qr_fmt<CU_AFF8>(c, y, x, ww, n); break;
        }
        return 0;
    }
    if (staged_ok(w) && w->cols % 32 == 0 && cu_aligned16(x)) {
#define QF_STAGED(F) qgemv_fmt<F>(c, y, x, ww, n)
        QF_DISPATCH_TUNED(w->fmt, QF_STAGED)
#undef QF_STAGED
        return 0;
    }
#define QF_PLAIN(F) CU_LAUNCH((qgemv_plain_kernel<F>), (unsigned)ww.rows, QM_THREADS, 0, c, y, x, ww, n)
    QF_DISPATCH(w->fmt, QF_PLAIN)
#undef QF_PLAIN
    return 0;
}

/* The fused launch (cuda_internal.h): split q4_0/q8_0 matrices of one
 * format and the same columns, whose token rows fit one tile. */
extern "C" int cu_qgemv_fused(const cu_ctx *c, const cu_fused *f) {
    if (f->nw < 1 || f->nw > CU_FUSE_MAX_W || f->n < 1 || !cu_aligned16(f->x)) return -1;
    if ((f->pro == CU_PRO_NORM && (!cu_aligned16(f->g) || (f->norm_y && !cu_aligned16(f->norm_y)))) ||
        (f->pro == CU_PRO_SWIGLU && !cu_aligned16(f->up)))
        return -1;
    for (int i = 0; i < f->nw; i++)
        if (f->w[i].layout != CU_LAYOUT_SPLIT || f->w[i].fmt != f->w[0].fmt ||
            f->w[i].cols != f->w[0].cols || !cu_qweight_ok(&f->w[i]))
            return -1;
    if (f->n > qs_tile(f->w[0].cols) || (f->res_out && f->nw != 1)) return -1;
    qs_args a = {};
    a.f = *f;
    if (f->w[0].fmt == CU_Q4_0) qs_launch_rows<CU_Q4_0>(c, a, f->n);
    else qs_launch_rows<CU_Q8_0>(c, a, f->n);
    return 0;
}

extern "C" int cu_qdequant_f16(const cu_ctx *c, void *out, const cu_qweight *w) {
    if (!cu_qweight_ok(w) || w->rows > 0x7fffffff) return -1;
    const cu_qweight ww = *w;
    const int32_t *none = NULL;
#define QF_DQ(F) CU_LAUNCH((qdequant_kernel<F, __half>), (unsigned)ww.rows, 128, 0, c, (__half *)out, ww, none)
    QF_DISPATCH(w->fmt, QF_DQ)
#undef QF_DQ
    return 0;
}

extern "C" int cu_qembed(const cu_ctx *c, float *y, const cu_qweight *w, const int32_t *ids, int n) {
    if (n <= 0) return 0;
    if (!cu_qweight_ok(w)) return -1;
    const cu_qweight ww = *w;
#define QF_EMB(F) CU_LAUNCH((qdequant_kernel<F, float>), (unsigned)n, 128, 0, c, y, ww, ids)
    QF_DISPATCH(w->fmt, QF_EMB)
#undef QF_EMB
    return 0;
}
