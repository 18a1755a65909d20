/*
 * qmms.cu - q4_0 and q8_0 weights in the row-split layout (PT_LAYOUT_ROWSPLIT,
 * repack.c: per group of rows, the rows' 16-byte code pieces, then their f16
 * scales) times more than 16 token rows (batched decode, speculative verify;
 * the backend takes it up to 128 rows for q4_0 and 64 for q8_0, where it
 * measured faster than the path below) on the tensor cores, without writing
 * an f16 copy of the weight.  Before it, those rows dequantized the whole
 * weight to f16 in scratch and ran cuBLAS: 82 us a call for the 8B shapes
 * at 64 rows, 58 of them writing the copy (docs/cuda.md, "Batched
 * decode"), which prefill past those rows still does (faster there).
 *
 * y[m][r] = x[m][k] . W[r][k]^T, the weight as the A operand of mma.sync
 * m16n8k16 (16 weight rows), the tokens as B (8 tokens an n-tile):
 *
 *  - A small kernel rounds x to f16 into scratch, [m][kp] with kp = cols
 *    rounded up to 128, zeros past cols, and each 128 columns permuted
 *    (below) so that a lane's A fragment is whole bytes of one block.
 *  - A block is 8 warps, 128 MT weight rows (16 MT a warp: MT m16 tiles;
 *    MT = 1, two blocks an SM at 128 registers, by default for q4_0; MT =
 *    2, one block an SM, for q8_0; PETREL_CUDA_QMMS_MT=1|2 picks) and all
 *    BM = 8 NT token rows of its token tile (32 or 64), so the weight is
 *    read once from memory for every token of the tile.  The grid is
 *    (token tiles, row tiles, K splits), token tiles fastest: blocks on
 *    the same weight rows run together and the second finds them in L2.
 *  - Weights go from memory straight into registers, no shared memory and
 *    no barrier on their way: a chunk is 128 columns, 4 q4_0 blocks (or 4
 *    q8_0 blocks) of each row, and lane (g, t) of a warp loads block t of
 *    rows g and g + 8 of each m-tile: one 16-byte load a row for q4_0 (two
 *    for q8_0) plus the block's 2-byte scale; the four lanes of a quad read
 *    64 (128) consecutive bytes of a row.  A ring of D chunks is in flight
 *    in registers (3 for q4_0, 2 for q8_0), unrolled so that no register
 *    copy waits on a load.
 *  - Activations go through shared memory (every warp of the block reads
 *    them): a ring of 3 stages of one chunk (BM rows of 256 bytes, padded
 *    to 320 so a quarter warp's two tokens fall 16 banks apart), copied
 *    with 16-byte cp.async, one barrier a chunk.  They are stored so that a
 *    lane's B fragments of both steps of a word (below) are one 16-byte
 *    shared load: 64 i + 16 t of the chunk holds b0, b1 of step 2i and b0,
 *    b1 of step 2i + 1.
 *  - Decoding, in registers: a q4_0 word (bytes 4i..4i+3 of the block:
 *    elements 4i..4i+3 low, 4i+16..4i+19 high) gives four f16 pairs by one
 *    LOP3 each: (q & 0x000F000F) | 0x6400_6400 is (1024 + n0, 1024 + n2),
 *    minus 1032 is exact, times the block's scale d rounds once (the same
 *    f16 value the dequantize kernel writes); the high nibbles (1024 +
 *    16 n) / 16 - 72 by one exact fma.  q8_0: a byte b ^ 0x80 under 0x64
 *    is 1024 + 128 + b, minus 1152, times d.
 *  - K splits, when the row tiles do not fill the GPU (4096-row matrices:
 *    32 tiles of 128 rows), are the blocks of one thread-block cluster:
 *    each leaves its partial tile in its shared memory and, after a
 *    cluster barrier, block z adds its share of the tile's outputs over
 *    the S blocks' shared memory in split order.  No scratch, no counters,
 *    no atomics: the result does not depend on which block finished first.
 *
 * The permutation.  Lane (g, t) of an m16n8k16 A fragment holds k
 * positions 2t, 2t+1 (a0 for row g, a1 for g + 8) and 2t+8, 2t+9 (a2, a3).
 * The mma does not care which column is which as long as A and B agree,
 * so in chunk c, step s = 2i + u (i = 0..3, u = 0..1), position
 * p = 2t + e + 8h holds column 128c + 32t + 16u + 4i + 2e + h: lane t's
 * positions of every step are block t's elements, word i of the block
 * feeds steps 2i (low nibbles) and 2i + 1 (high), and the activations are
 * stored in that order.  For q8_0 the element 16u + 4i + 2e + h is byte
 * 2e + h of word 4u + i.
 *
 * Accuracy: weights and activations each rounded to f16 (2^-11 relative
 * each), products summed in f32 inside the tensor core and, across K
 * splits, in f32 in split order: within 2^-9 of sum |w x| per output, the
 * bound of the dequantize + cuBLAS path (tests/cuda/test_cuda_qmatmul.c
 * test_qmms).  Not batch-invariant: rows past 16 never were (docs/cuda.md,
 * "Batch invariance"); the split GEMV keeps rows 1..16.
 */
#include <cooperative_groups.h>

#include "backend/cuda/cu_common.cuh"
#include "backend/cuda/qdecode.cuh"
#include "backend/cuda/qmma.h"

namespace cg = cooperative_groups;

#define QS_WARPS 8
#define QS_THREADS (QS_WARPS * 32)
/* weight rows per block: 16 MT a warp (MT m16 tiles) */
#define QS_ROWS(MT) (QS_WARPS * 16 * (MT))
#define QS_KC 128 /* columns per chunk */
/* bytes of a token's chunk in shared memory: 256 and 64 of padding, so the
 * two tokens of a quarter warp's 16-byte loads fall 16 banks apart */
#define QS_AROW (QS_KC * 2 + 64)
#define QS_ASTAGES 3
#define QS_MAX_SPLITS 8 /* the portable cluster size */
/* floats of a token's row of the partial tile: rows + 4 = 4 mod 32, so
 * the lanes (g, t) of a fragment store (rows g, tokens 2t) in distinct
 * banks */
#define QS_PROW(MT) (QS_ROWS(MT) + 4)

struct qs_args {
    const uint8_t *w;
    int64_t rows;
    int nb;     /* blocks of 32 columns a row */
    int gs;     /* rows a group: 1 << gs */
    int64_t cr; /* code bytes a row */
    int64_t sr; /* scale bytes a row (2 nb) */
    int M;      /* token rows */
    int64_t kp; /* a token's row of xa, in halves */
    int kc_per; /* chunks a split */
};

template <int F> struct qs_fmt {
    static constexpr int pieces = F == CU_Q4_0 ? 1 : 2; /* 16-byte loads a row and chunk */
    static constexpr int ring = F == CU_Q4_0 ? 3 : 2;   /* chunks in flight in registers */
};

__device__ __forceinline__ uint32_t qs_h2u(__half2 h) {
    return *(uint32_t *)&h;
}
__device__ __forceinline__ __half2 qs_u2h(uint32_t u) {
    return *(__half2 *)&u;
}

/* c += a b (m16n8k16, f16, f32 sums): not volatile, so the compiler may
 * interleave independent products (cu_mma.cuh's is volatile). */
__device__ __forceinline__ void qs_mma(float *c, const uint32_t *a, uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
        "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t qs_ld_scale(const uint8_t *p) {
    uint16_t v;
    asm volatile("ld.global.nc.L1::no_allocate.u16 %0, [%1];" : "=h"(v) : "l"(p));
    return v;
}

/* This lane's row r: where its codes and its scales start. */
__device__ __forceinline__ void qs_rowp(const qs_args &a, int64_t r, const uint8_t *&codes,
                                        const uint8_t *&scales) {
    const uint8_t *g = a.w + (size_t)(r >> a.gs) * (size_t)((a.cr + a.sr) << a.gs);
    const size_t i = (size_t)(r & ((1 << a.gs) - 1));
    codes = g + i * (size_t)a.cr;
    scales = g + ((size_t)a.cr << a.gs) + i * (size_t)a.sr;
}

/* Registers of one chunk: [m-tile][row g / g + 8][piece], and the scales. */
template <int F, int MT> struct qs_chunk_regs {
    uint4 q[MT][2][qs_fmt<F>::pieces];
    uint32_t d[MT][2];
};

/* Loads block b of the lane's four rows; past the row (ok false) the
 * row's last block with a zero scale: zero weights, which meet zero
 * activations. */
template <int F, int MT>
__device__ __forceinline__ void qs_load(qs_chunk_regs<F, MT> &c, const uint8_t *(&cp)[MT][2],
                                        const uint8_t *(&sp)[MT][2], int b, int nb, bool ok) {
    const uint32_t keep = ok && b < nb ? 0xffffu : 0u;
    const size_t bb = (size_t)(b < nb ? b : nb - 1);
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
#pragma unroll
            for (int p = 0; p < qs_fmt<F>::pieces; p++)
                c.q[mt][h][p] =
                    cu_ld_stream((const uint4 *)(cp[mt][h] + bb * 16 * qs_fmt<F>::pieces) + p);
            c.d[mt][h] = qs_ld_scale(sp[mt][h] + 2 * bb) & keep;
        }
}

__device__ __forceinline__ uint32_t qs_word(const uint4 &v, int i) {
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

/* Word i of a row's block as the A registers of steps 2i (lo) and 2i + 1
 * (hi): [0] the pair at positions 2t, 2t+1, [1] at 2t+8, 2t+9. */
template <int F, int MT>
__device__ __forceinline__ void qs_decode(const qs_chunk_regs<F, MT> &c, __half2 d, int mt, int h,
                                          int i, uint32_t lo[2], uint32_t hi[2]) {
    if (F == CU_Q4_0) {
        const uint32_t q = qs_word(c.q[mt][h][0], i), q8 = q >> 8;
        const uint32_t LO = 0x000F000Fu, HI = 0x00F000F0u, EX = 0x64006400u;
        const __half2 k1032 = qs_u2h(0x64086408u);                             /* 1024 + 8 */
        const __half2 k16 = qs_u2h(0x2C002C00u);                               /* 1/16 */
        const __half2 km72 = qs_u2h(0xD480D480u);                              /* -(64 + 8) */
        lo[0] = qs_h2u(__hmul2(__hsub2(qs_u2h((q & LO) | EX), k1032), d));     /* 4i, 4i+2 */
        lo[1] = qs_h2u(__hmul2(__hsub2(qs_u2h((q8 & LO) | EX), k1032), d));    /* 4i+1, 4i+3 */
        hi[0] = qs_h2u(__hmul2(__hfma2(qs_u2h((q & HI) | EX), k16, km72), d)); /* +16 */
        hi[1] = qs_h2u(__hmul2(__hfma2(qs_u2h((q8 & HI) | EX), k16, km72), d));
    } else {
        const __half2 k1152 = qs_u2h(0x64806480u); /* 1024 + 128 */
        const uint32_t v0 = qs_word(c.q[mt][h][0], i) ^ 0x80808080u;
        const uint32_t v1 = qs_word(c.q[mt][h][F == CU_Q4_0 ? 0 : 1], i) ^ 0x80808080u;
        lo[0] = qs_h2u(__hmul2(__hsub2(qs_u2h(__byte_perm(v0, 0x64646464u, 0x4240)), k1152), d));
        lo[1] = qs_h2u(__hmul2(__hsub2(qs_u2h(__byte_perm(v0, 0x64646464u, 0x4341)), k1152), d));
        hi[0] = qs_h2u(__hmul2(__hsub2(qs_u2h(__byte_perm(v1, 0x64646464u, 0x4240)), k1152), d));
        hi[1] = qs_h2u(__hmul2(__hsub2(qs_u2h(__byte_perm(v1, 0x64646464u, 0x4341)), k1152), d));
    }
}

/* Requests chunk kc's activations (BM token rows) into stage st. */
template <int BM>
__device__ __forceinline__ void qs_load_act(uint8_t *stage, const __half *xa, const qs_args &a,
                                            int m0, int kc) {
#pragma unroll
    for (int i = threadIdx.x; i < BM * 16; i += QS_THREADS) {
        const int tk = i >> 4, piece = i & 15;
        const int m = m0 + tk < a.M ? m0 + tk : a.M - 1; /* clamped: never stored */
        cp_async16(stage + tk * QS_AROW + 16 * piece,
                   xa + (size_t)m * a.kp + (size_t)kc * QS_KC + 8 * piece);
    }
}

/* Grid: (token tiles of 8 NT, row tiles of QS_ROWS, K splits of kc_per
 * chunks); the K splits of a tile are one cluster (1, 1, gridDim.z). */
template <int F, int NT, int MT>
__global__ void __launch_bounds__(QS_THREADS, 3 - MT)
    qmms_kernel(float *y, const __half *xa, qs_args a) {
    constexpr int BM = 8 * NT, D = qs_fmt<F>::ring;
    extern __shared__ __align__(16) uint8_t qs_smem[];
    cu_grid_trigger();
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int m0 = blockIdx.x * BM;
    const int64_t r0 = (int64_t)blockIdx.y * QS_ROWS(MT);
    const int kcs = (a.nb + 3) >> 2;
    const int kc0 = blockIdx.z * a.kc_per;
    const int nkc = min(a.kc_per, kcs - kc0);

    const uint8_t *cp[MT][2], *sp[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int64_t r = r0 + 16 * MT * warp + 16 * mt + 8 * h + g;
            qs_rowp(a, r < a.rows ? r : a.rows - 1, cp[mt][h], sp[mt][h]);
        }

    /* the weights' first chunks before the wait (no kernel writes them),
     * the activations after */
    qs_chunk_regs<F, MT> ring[D];
#pragma unroll
    for (int s = 0; s < D - 1; s++)
        qs_load<F, MT>(ring[s], cp, sp, 4 * (kc0 + s) + t, a.nb, s < nkc);
    cu_grid_wait();
    const size_t stage_bytes = (size_t)BM * QS_AROW;
#pragma unroll
    for (int s = 0; s < QS_ASTAGES - 1; s++) {
        if (s < nkc) qs_load_act<BM>(qs_smem + s * stage_bytes, xa, a, m0, kc0 + s);
        cp_async_commit();
    }

    float acc[MT][NT][4];
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                acc[i][j][e] = 0.f;

    /* lane (g, t)'s B fragments of word i, n-tile nt: b0, b1 of step 2i,
     * b0, b1 of step 2i + 1, 16 bytes at token 8 nt + g, 64 i + 16 t */
    const int a_off = g * QS_AROW + 16 * t;
    for (int base = 0; base < nkc; base += D) {
#pragma unroll
        for (int sl = 0; sl < D; sl++) {
            const int c = base + sl;
            if (c >= nkc) break;
            /* chunk c + D - 1 into the slot chunk c - 1 left */
            qs_load<F, MT>(ring[(sl + D - 1) % D], cp, sp, 4 * (kc0 + c + D - 1) + t, a.nb,
                           c + D - 1 < nkc);
            cp_async_wait<QS_ASTAGES - 2>();
            __syncthreads(); /* stage c is in for every thread; c - 1's is free */
            if (c + QS_ASTAGES - 1 < nkc)
                qs_load_act<BM>(qs_smem + ((c + QS_ASTAGES - 1) % QS_ASTAGES) * stage_bytes, xa, a,
                                m0, kc0 + c + QS_ASTAGES - 1);
            cp_async_commit();
            const uint8_t *as = qs_smem + (c % QS_ASTAGES) * stage_bytes + a_off;
            const qs_chunk_regs<F, MT> &w = ring[sl];
            __half2 dd[MT][2];
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int h = 0; h < 2; h++)
                    dd[mt][h] = qs_u2h(__byte_perm(w.d[mt][h], 0, 0x1010));
#pragma unroll
            for (int i = 0; i < 4; i++) {
                uint4 b[NT];
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
                    b[nt] = *(const uint4 *)(as + nt * 8 * QS_AROW + 64 * i);
                uint32_t A[MT][2][4]; /* [mt][step 2i + u][fragment register] */
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        uint32_t lo[2], hi[2];
                        qs_decode<F, MT>(w, dd[mt][h], mt, h, i, lo, hi);
                        A[mt][0][h] = lo[0], A[mt][0][2 + h] = lo[1];
                        A[mt][1][h] = hi[0], A[mt][1][2 + h] = hi[1];
                    }
                    /* step 2i for every tile, then 2i + 1: no product waits on
                     * the one before it */
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
#pragma unroll
                    for (int mt = 0; mt < MT; mt++)
                        qs_mma(acc[mt][nt], A[mt][0], b[nt].x, b[nt].y);
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
#pragma unroll
                    for (int mt = 0; mt < MT; mt++)
                        qs_mma(acc[mt][nt], A[mt][1], b[nt].z, b[nt].w);
            }
        }
    }
    cp_async_wait<0>();

    /* c0, c1: row g, tokens 2t, 2t + 1; c2, c3: row g + 8 */
    const int64_t N = a.rows;
    if (gridDim.z == 1) {
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int64_t r = r0 + 16 * MT * warp + 16 * mt + 8 * (e >> 1) + g;
                    int m = m0 + nt * 8 + 2 * t + (e & 1);
                    if (r < N && m < a.M) y[(size_t)m * N + r] = acc[mt][nt][e];
                }
        return;
    }

    /* K split: the partial tile into this block's shared memory (the
     * activation ring is done with), then block z of the cluster adds
     * tokens [z BM / S, (z + 1) BM / S) of the tile over the S blocks in
     * split order: a thread 4 rows of one of 4 tokens a pass, every
     * block's 16 bytes requested before the first is added */
    __syncthreads();
    float *part = (float *)qs_smem;
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                part[(nt * 8 + 2 * t + (e & 1)) * QS_PROW(MT) + 16 * MT * warp + 16 * mt +
                     8 * (e >> 1) + g] = acc[mt][nt][e];
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 /* clusters: before sm_90 the host never splits K */
    cg::cluster_group cluster = cg::this_cluster();
    cluster.sync();
    const int S = (int)gridDim.z, z = (int)cluster.block_rank();
    const int per = BM / S; /* S divides BM (a power of two, <= 8): at least 4 */
    const float *src[QS_MAX_SPLITS];
#pragma unroll
    for (int q = 0; q < QS_MAX_SPLITS; q++)
        src[q] = cluster.map_shared_rank(part, q < S ? q : 0);
    constexpr int TPR = QS_ROWS(MT) / 4, TP = QS_THREADS / TPR; /* threads a token, tokens a pass */
    const int rr = 4 * (tid % TPR);
    const int64_t r = r0 + rr;
    for (int i0 = 0; i0 < per; i0 += TP) {
        const int il = i0 + tid / TPR, tk = z * per + il, m = m0 + tk;
        if (il >= per) break;
        float4 v[QS_MAX_SPLITS];
#pragma unroll
        for (int q = 0; q < QS_MAX_SPLITS; q++)
            if (q < S) v[q] = *(const float4 *)(src[q] + tk * QS_PROW(MT) + rr);
        float4 sum = v[0];
#pragma unroll
        for (int q = 1; q < QS_MAX_SPLITS; q++)
            if (q < S) sum.x += v[q].x, sum.y += v[q].y, sum.z += v[q].z, sum.w += v[q].w;
        if (m >= a.M || r >= N) continue;
        float *dst = y + (size_t)m * N + r;
        if (r + 3 < N && (N & 3) == 0) {
            *(float4 *)dst = sum;
        } else {
            const float f[4] = {sum.x, sum.y, sum.z, sum.w};
            for (int k = 0; k < 4 && r + k < N; k++)
                dst[k] = f[k];
        }
    }
    cluster.sync(); /* no block leaves while another reads its shared memory */
#endif
}

/* x [M][cols] f32 -> xa [M][kp] f16 in the permuted order (header), zeros
 * past cols.  A thread per token row and block of 32 columns. */
__global__ void qs_act_kernel(__half *xa, const float *x, int M, int nb, int64_t kp) {
    cu_grid_trigger();
    cu_grid_wait();
    const int64_t per_row = kp / 32;
    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (int64_t)M * per_row) return;
    const int64_t m = idx / per_row;
    const int b = (int)(idx - m * per_row), c = b >> 2, t = b & 3;
    float v[32];
    if (b < nb) {
        const float4 *src = (const float4 *)(x + (size_t)m * nb * 32 + (size_t)b * 32);
#pragma unroll
        for (int q = 0; q < 8; q++) {
            float4 f = src[q];
            v[4 * q] = f.x, v[4 * q + 1] = f.y, v[4 * q + 2] = f.z, v[4 * q + 3] = f.w;
        }
    } else {
#pragma unroll
        for (int q = 0; q < 32; q++)
            v[q] = 0.f;
    }
    /* word i of the block feeds steps 2i and 2i + 1: 16 bytes at 64 i + 16 t
     * of the chunk, b0 and b1 of step 2i (positions 2t + e + 8h: elements
     * 4i + 2e + h), then of step 2i + 1 (the same + 16) */
    uint4 *dst = (uint4 *)((uint8_t *)(xa + (size_t)m * kp + (size_t)c * QS_KC) + 16 * t);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int k = 4 * i;
        dst[4 * i] = make_uint4(qs_h2u(__floats2half2_rn(v[k], v[k + 2])),
                                qs_h2u(__floats2half2_rn(v[k + 1], v[k + 3])),
                                qs_h2u(__floats2half2_rn(v[k + 16], v[k + 18])),
                                qs_h2u(__floats2half2_rn(v[k + 17], v[k + 19])));
    }
}

/* ---- host ------------------------------------------------------------------------ */

static int64_t qs_kp(int64_t cols) {
    return CU_DIV_UP(cols, (int64_t)QS_KC) * QS_KC;
}

/* n-tiles of 8 tokens a block for an n-row call. */
static int qs_nt(int n) {
    return n <= 32 ? 4 : 8;
}

static size_t qs_smem_bytes(int nt, int mt, int splits) {
    size_t ring = (size_t)QS_ASTAGES * 8 * nt * QS_AROW;
    size_t part = splits > 1 ? (size_t)8 * nt * QS_PROW(mt) * sizeof(float) : 0;
    return ring > part ? ring : part;
}

/* K splits (a power of two up to the cluster size): the fewest waves times
 * chunks a block, per_sm blocks an SM; none without clusters (before
 * sm_90). */
static int qs_splits(const cu_ctx *c, int64_t tiles, int kcs, int per_sm) {
    const int sms = (c->n_sm > 0 ? c->n_sm : 132) * per_sm;
    int best = 1;
    if (!c->clusters) return 1;
    int64_t best_cost = INT64_MAX;
    for (int s = 1; s <= QS_MAX_SPLITS && s <= kcs; s *= 2) {
        int per = CU_DIV_UP(kcs, s);
        if (CU_DIV_UP(kcs, per) != s) continue; /* would leave a split empty */
        int64_t cost = CU_DIV_UP(tiles * s, (int64_t)sms) * (per + 2); /* + 2: prologue, sums */
        if (cost < best_cost) best = s, best_cost = cost;
    }
    return best;
}

extern "C" int cu_qmms_takes(const cu_qweight *w, int n) {
    return (w->fmt == CU_Q4_0 || w->fmt == CU_Q8_0) && w->layout == CU_LAYOUT_SPLIT && n >= 1 &&
           cu_qweight_ok(w) && w->rows <= 65535LL * QS_ROWS(1) && w->cols <= 0x3fffffffLL &&
           CU_DIV_UP((int64_t)n, (int64_t)32) <= 0x7fffffffLL;
}

extern "C" size_t cu_qmms_act_bytes(const cu_qweight *w, int n) {
    return (size_t)n * (size_t)qs_kp(w->cols) * 2;
}

template <int F, int NT, int MT> static void qs_init_one() {
    cudaFuncSetAttribute(qmms_kernel<F, NT, MT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         (int)qs_smem_bytes(NT, MT, 2));
}

extern "C" void cu_qmms_init(void) {
    qs_init_one<CU_Q4_0, 4, 2>(), qs_init_one<CU_Q4_0, 8, 2>();
    qs_init_one<CU_Q8_0, 4, 2>(), qs_init_one<CU_Q8_0, 8, 2>();
    qs_init_one<CU_Q4_0, 4, 1>(), qs_init_one<CU_Q4_0, 8, 1>();
    qs_init_one<CU_Q8_0, 4, 1>(), qs_init_one<CU_Q8_0, 8, 1>();
    cudaGetLastError();
}

template <int F, int NT, int MT>
static void qs_launch(const cu_ctx *c, float *y, const __half *xa, const qs_args &a, int64_t mtiles,
                      int64_t ntiles, int splits) {
    cudaLaunchAttribute attr[2];
    int na = 0;
    if (splits > 1) {
        attr[na].id = cudaLaunchAttributeClusterDimension;
        attr[na].val.clusterDim.x = 1, attr[na].val.clusterDim.y = 1;
        attr[na].val.clusterDim.z = (unsigned)splits;
        na++;
    }
    if (c->pdl) {
        attr[na].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[na].val.programmaticStreamSerializationAllowed = 1;
        na++;
    }
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)mtiles, (unsigned)ntiles, (unsigned)splits);
    cfg.blockDim = dim3(QS_THREADS);
    cfg.dynamicSmemBytes = qs_smem_bytes(NT, MT, splits);
    cfg.stream = c->s;
    cfg.attrs = attr;
    cfg.numAttrs = na;
    cudaLaunchKernelEx(&cfg, qmms_kernel<F, NT, MT>, y, xa, a);
}

extern "C" int cu_qmms(const cu_ctx *c, float *y, const float *x, const cu_qweight *w, int n,
                       void *act) {
    if (!cu_qmms_takes(w, n) || !cu_aligned16(x) || !act) return -1;
    const int nt = qs_nt(n), bm = 8 * nt;
    const int nb = (int)(w->cols / 32), kcs = (nb + 3) / 4;
    const int64_t kp = qs_kp(w->cols);
    const int64_t mtiles = CU_DIV_UP((int64_t)n, (int64_t)bm);
    /* the tiling measured faster in 8B batched decode (q4_0: one m16 tile
     * a warp) or measured at all (q8_0: two) unless asked */
    const int mt = c->qmms_mt == 1 || c->qmms_mt == 2 ? c->qmms_mt : w->fmt == CU_Q4_0 ? 1 : 2;
    const int64_t ntiles = CU_DIV_UP(w->rows, (int64_t)QS_ROWS(mt));
    const int splits = qs_splits(c, mtiles * ntiles, kcs, 3 - mt);
    const int cb = w->fmt == CU_Q4_0 ? 16 : 32;
    int gs = 0;
    while (((int64_t)nb * (cb + 2) << gs) & 15)
        gs++;
    qs_args a;
    a.w = (const uint8_t *)w->data, a.rows = w->rows, a.nb = nb, a.gs = gs;
    a.cr = (int64_t)nb * cb, a.sr = (int64_t)nb * 2, a.M = n, a.kp = kp;
    a.kc_per = CU_DIV_UP(kcs, splits);

    __half *xa = (__half *)act;
    const int64_t threads = (int64_t)n * (kp / 32);
    CU_LAUNCH(qs_act_kernel, (unsigned)CU_DIV_UP(threads, (int64_t)256), 256, 0, c, xa, x, n, nb,
              kp);
#define QS_GO(F, NT, MT) qs_launch<F, NT, MT>(c, y, xa, a, mtiles, ntiles, splits)
    if (w->fmt == CU_Q4_0) {
        if (mt == 2)
            nt == 4 ? QS_GO(CU_Q4_0, 4, 2) : QS_GO(CU_Q4_0, 8, 2);
        else
            nt == 4 ? QS_GO(CU_Q4_0, 4, 1) : QS_GO(CU_Q4_0, 8, 1);
    } else {
        if (mt == 2)
            nt == 4 ? QS_GO(CU_Q8_0, 4, 2) : QS_GO(CU_Q8_0, 8, 2);
        else
            nt == 4 ? QS_GO(CU_Q8_0, 4, 1) : QS_GO(CU_Q8_0, 8, 1);
    }
#undef QS_GO
    return 0;
}
