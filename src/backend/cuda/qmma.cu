/*
 * qmma.cu - q4_0 and q8_0 weights times 17..256 token rows (batched
 * decode, short prefills) on the tensor cores, reading each weight byte
 * once from memory.  Before it, those rows dequantized the whole weight to
 * f16 in scratch (written, then read again by cuBLAS): at 64 rows that
 * cost twice the bf16 GEMM (docs/cuda.md, "Tensor-core GEMM").
 *
 * y[m][n] = x[m][k] . W[n][k]^T with the weight as the A operand of
 * mma.sync m16n8k16 (16 weight rows) and the tokens as B (8 tokens), so a
 * call of 17 rows wastes at most 7 token columns, not 15.
 *
 *  - First, a small kernel rounds x to f16 into scratch ([m][kp], kp = k
 *    rounded up to 256), permuting each 16 columns for q4_0 (below).
 *  - A block is 8 warps and owns 256 weight rows (32 a warp: two m16
 *    tiles) and up to 64 tokens (eight n8 tiles), so each decoded weight
 *    feeds 8 mma per k-step and each activation tile, read from L2 by
 *    every block, is shared by 256 rows.  The grid is (token tiles, row
 *    tiles, K splits): token tiles vary fastest, so the blocks that read
 *    the same weight rows run together and the second one finds them in
 *    L2.  K is split when there are too few row tiles to fill the GPU
 *    (4096-row matrices: 16 tiles); the last block of a tile to finish
 *    adds the splits' partial sums in split order (a counter per tile), so
 *    results do not depend on which block finishes first.
 *  - Stages of 256 columns: each weight row's bytes (the file's blocks as
 *    they are, q4_0 144 bytes, q8_0 272) and the tile's f16 activations,
 *    copied with 16-byte cp.async into a ring of 3 (q4_0) or 2 (q8_0)
 *    stages, the next stages in flight while this one is multiplied.  Rows
 *    whose bytes are not 16-byte aligned (k not a multiple of 256) copy
 *    the aligned words that hold them and remember the offset.
 *  - Each lane decodes its part of the A fragment straight from shared
 *    memory into f16 pairs: a q4_0 nibble n becomes the f16 1024 + n by
 *    one LOP3 (0x6400 | n), minus 1032 gives n - 8 exactly, times the
 *    block's scale d (one rounding, as the f16 dequantization for cuBLAS
 *    rounds it); q8_0 bytes likewise (0x6400 | (b ^ 0x80), minus 1152).
 *    The products accumulate in f32 inside the mma.
 *
 * q4_0's permutation: lane (g, t) of an m16n8k16 A fragment holds columns
 * 2t, 2t+1 (a0) and 2t+8, 2t+9 (a2) of a 16-column step.  A q4_0 block
 * keeps element i in the low nibble of byte i and element i + 16 in the
 * high one, so the two 16-bit loads of bytes 2t..2t+1 and 2t+8..2t+9 hold
 * elements {2t, 2t+1, 2t+8, 2t+9} of both steps; the f16 trick takes
 * nibbles at bits 0 and 16 (or 4 and 20) of a word, giving the pairs
 * (2t, 2t+8) and (2t+1, 2t+9).  The mma does not care which column is
 * which as long as A and B agree, so the activations are stored with
 * position p = 8h + 2t + s holding element 2t + h + 8s of each 16.
 *
 * Accuracy: weights and activations each rounded to f16 (2^-11 relative),
 * products summed in f32: within 2^-9 of sum |w x| per output, the bound
 * the cuBLAS path had (tests/cuda/test_cuda_qmatmul.c).  Not
 * batch-invariant (rows past 16 never were: docs/cuda.md).
 */
#include "backend/cuda/cu_common.cuh"
#include "backend/cuda/cu_mma.cuh"
#include "backend/cuda/qdecode.cuh"
#include "backend/cuda/qmma.h"

#define QX_WARPS 8
#define QX_THREADS (QX_WARPS * 32)
#define QX_BN (QX_WARPS * 32) /* weight rows per block */
#define QX_KT 256             /* columns per stage */
/* bytes of a token's activations in a stage: padded so the 8 rows of an
 * ldmatrix fall in distinct banks */
#define QX_AROW (QX_KT * 2 + 16)
#define QX_MAX_SPLITS 16
#define QX_COUNTERS 4096 /* tiles that may split K at once */

/* Per format: bytes per 32-element block, ring depth, lanes copying one
 * row (a row's stage is at most 10 words of 16 bytes for q4_0, 18 for
 * q8_0). */
template <int F> struct qx_fmt {
    static constexpr int bb = F == CU_Q4_0 ? 18 : 34;
    static constexpr int stages = F == CU_Q4_0 ? 3 : 2;
    static constexpr int lanes_per_row = F == CU_Q4_0 ? 16 : 32;
};

/* A row's stride in a stage: a whole number of 16-byte words, odd so the
 * 8 rows of a fragment start 4 banks apart.  Rows not 16-byte aligned need
 * one more word (then even: some 2-way conflicts, on the odd shapes). */
static int qx_row_stride(int f, int64_t cols) {
    int base = f == CU_Q4_0 ? 144 : 272;
    return cols % QX_KT == 0 ? base : base + 16;
}

static size_t qx_smem(int f, int bm, int stride) {
    int stages = f == CU_Q4_0 ? qx_fmt<CU_Q4_0>::stages : qx_fmt<CU_Q8_0>::stages;
    return (size_t)stages * ((size_t)QX_BN * stride + (size_t)bm * QX_AROW);
}

__device__ __forceinline__ uint32_t lds16(const uint8_t *p) {
    return *(const uint16_t *)p;
}

__device__ __forceinline__ uint32_t h2u(__half2 h) {
    return *(uint32_t *)&h;
}
__device__ __forceinline__ __half2 u2h(uint32_t u) {
    return *(__half2 *)&u;
}

/* One weight row's share of a 32-column block for lane t of its quad: the
 * four f16 pairs p[step][lo/hi] (step: columns 0-15 or 16-31 of the block,
 * lo: the pair at a0/a1, hi: the pair at a2/a3), already times the scale.
 * b points at the block in the stage. */
template <int F>
__device__ __forceinline__ void qx_decode(const uint8_t *b, int t, uint32_t p[2][2]) {
    const __half2 d = u2h(__byte_perm(lds16(b), 0, 0x1010));
    if (F == CU_Q4_0) {
        /* bytes 2t, 2t+1 | 2t+8, 2t+9: nibbles of elements 2t, 2t+1, 2t+8,
         * 2t+9 (low) and the same + 16 (high) */
        uint32_t q = lds16(b + 2 + 2 * t) | lds16(b + 10 + 2 * t) << 16;
        uint32_t q1 = q >> 8;
        const uint32_t LO = 0x000F000Fu, HI = 0x00F000F0u, EX = 0x64006400u;
        const __half2 k1032 = u2h(0x64086408u); /* 1024 + 8 */
        const __half2 k16 = u2h(0x2C002C00u);   /* 1/16 */
        const __half2 km72 = u2h(0xD480D480u);  /* -(64 + 8) */
        /* 1024 + n - 1032 and (1024 + 16 n) / 16 - 72 are exact */
        p[0][0] = h2u(__hmul2(__hsub2(u2h((q & LO) | EX), k1032), d));     /* 2t, 2t+8 */
        p[0][1] = h2u(__hmul2(__hsub2(u2h((q1 & LO) | EX), k1032), d));    /* 2t+1, 2t+9 */
        p[1][0] = h2u(__hmul2(__hfma2(u2h((q & HI) | EX), k16, km72), d)); /* +16 */
        p[1][1] = h2u(__hmul2(__hfma2(u2h((q1 & HI) | EX), k16, km72), d));
    } else {
        const __half2 k1152 = u2h(0x64806480u); /* 1024 + 128 */
#pragma unroll
        for (int s = 0; s < 2; s++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                uint32_t v = lds16(b + 2 + 16 * s + 8 * h + 2 * t) ^ 0x8080u;
                uint32_t e = __byte_perm(v, 0x6464u, 0x5140); /* (1024 + u0, 1024 + u1) */
                p[s][h] = h2u(__hmul2(__hsub2(u2h(e), k1152), d));
            }
    }
}

/* Requests stage k (columns kt * 256 ...) of this block into ring slot
 * `slot`: weights if wgt, activations if act. */
template <int F, int BM>
__device__ __forceinline__ void qx_load(uint8_t *smem, const cu_qweight &w, const __half *xa,
                                        int64_t kp, int M, int m0, int64_t r0, int stride,
                                        size_t stage_bytes, int slot, int kt, bool wgt, bool act) {
    typedef qx_fmt<F> Q;
    uint8_t *st = smem + (size_t)slot * stage_bytes;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int64_t c0 = (int64_t)kt * QX_KT, left = w.cols - c0;
    if (wgt) {
        const int64_t row_bytes = w.cols / 32 * Q::bb;
        const int64_t off0 = c0 / 32 * Q::bb;
        const int64_t tbytes = (left < QX_KT ? left : QX_KT) / 32 * Q::bb;
        const int RPI = QX_WARPS * 32 / Q::lanes_per_row; /* rows per pass of the block */
        const int word = lane % Q::lanes_per_row;
        const uint8_t *base = (const uint8_t *)w.data;
#pragma unroll 4
        for (int i = warp * (32 / Q::lanes_per_row) + lane / Q::lanes_per_row; i < QX_BN;
             i += RPI) {
            int64_t gr = r0 + i < w.rows ? r0 + i : w.rows - 1; /* clamped: never stored */
            int64_t start = gr * row_bytes + off0;
            int64_t a16 = start >> 4, nw = ((start + tbytes + 15) >> 4) - a16;
            if (word < nw)
                cp_async16(st + (size_t)i * stride + 16 * word, base + 16 * (a16 + word));
        }
    }
    if (act) {
        uint8_t *as = st + (size_t)QX_BN * stride;
#pragma unroll
        for (int i = tid; i < BM * 32; i += QX_THREADS) {
            int tk = i >> 5, ch = i & 31, m = m0 + tk < M ? m0 + tk : M - 1;
            cp_async16(as + tk * QX_AROW + 16 * ch, xa + (size_t)m * kp + c0 + 8 * ch);
        }
    }
}

/* Grid: (token tiles of BM, row tiles of QX_BN, K splits of kt_per stages). */
template <int F, int BM>
__global__ void __launch_bounds__(QX_THREADS, 1)
    qmma_kernel(float *y, const __half *xa, cu_qweight w, int M, int64_t kp, int stride, int kt_per,
                float *part, int *counters) {
    typedef qx_fmt<F> Q;
    const int NT = BM / 8, S = Q::stages;
    extern __shared__ __align__(16) uint8_t qx_smem_buf[];
    __shared__ int last;
    cu_grid_trigger();
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int m0 = blockIdx.x * BM;
    const int64_t r0 = (int64_t)blockIdx.y * QX_BN;
    const int kts = (int)CU_DIV_UP(w.cols, (int64_t)QX_KT);
    const int kt0 = blockIdx.z * kt_per;
    const int nkt = min(kt_per, kts - kt0);
    const size_t stage_bytes = (size_t)QX_BN * stride + (size_t)BM * QX_AROW;
    const int64_t row_bytes = w.cols / 32 * Q::bb;

    /* weights of the first stages before the wait (no kernel writes them),
     * activations after */
#pragma unroll
    for (int s = 0; s < S - 1; s++)
        if (s < nkt)
            qx_load<F, BM>(qx_smem_buf, w, xa, kp, M, m0, r0, stride, stage_bytes, s, kt0 + s, true,
                           false);
    cu_grid_wait();
#pragma unroll
    for (int s = 0; s < S - 1; s++) {
        if (s < nkt)
            qx_load<F, BM>(qx_smem_buf, w, xa, kp, M, m0, r0, stride, stage_bytes, s, kt0 + s,
                           false, true);
        cp_async_commit();
    }

    float acc[2][NT][4];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                acc[i][j][e] = 0.f;

    /* this lane's 4 weight rows: warp's 32, m tile mt, half h (g or g + 8) */
    int64_t myrow[2][2];
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int64_t r = r0 + 32 * warp + 16 * mt + 8 * h + g;
            myrow[mt][h] = r < w.rows ? r : w.rows - 1;
        }

    for (int it = 0; it < nkt; it++) {
        cp_async_wait<S - 2>();
        __syncthreads(); /* stage it is in for every thread; slot it - 1 is free */
        if (it + S - 1 < nkt)
            qx_load<F, BM>(qx_smem_buf, w, xa, kp, M, m0, r0, stride, stage_bytes, (it + S - 1) % S,
                           kt0 + it + S - 1, true, true);
        cp_async_commit();

        const uint8_t *st = qx_smem_buf + (size_t)(it % S) * stage_bytes;
        const uint8_t *as = st + (size_t)QX_BN * stride;
        const int64_t c0 = (int64_t)(kt0 + it) * QX_KT, left = w.cols - c0;
        const int nb = left < QX_KT ? (int)(left / 32) : QX_KT / 32;
        const int64_t off0 = c0 / 32 * Q::bb;
        const uint8_t *rp[2][2];
#pragma unroll
        for (int mt = 0; mt < 2; mt++)
#pragma unroll
            for (int h = 0; h < 2; h++)
                rp[mt][h] = st + (size_t)(32 * warp + 16 * mt + 8 * h + g) * stride +
                            (int)((myrow[mt][h] * row_bytes + off0) & 15);
        /* ldmatrix rows: lane l gives token l % 8 of the tile, 8 columns at
         * (l / 8) * 8 of the block: matrices = b0, b1 of step 0, b0, b1 of
         * step 1 */
        const uint8_t *ap = as + (lane & 7) * QX_AROW + (lane >> 3) * 16;
#pragma unroll 2
        for (int j = 0; j < QX_KT / 32; j++) {
            if (j >= nb) break;
            uint32_t a[2][2][4]; /* [mt][step][fragment register] */
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    uint32_t p[2][2];
                    qx_decode<F>(rp[mt][h] + Q::bb * j, t, p);
                    a[mt][0][h] = p[0][0], a[mt][0][2 + h] = p[0][1];
                    a[mt][1][h] = p[1][0], a[mt][1][2 + h] = p[1][1];
                }
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                uint32_t b[4];
                cu_ldmatrix4(b, ap + nt * 8 * QX_AROW + 64 * j);
#pragma unroll
                for (int mt = 0; mt < 2; mt++) {
                    mma16816<CU_F16>(acc[mt][nt], a[mt][0], b[0], b[1]);
                    mma16816<CU_F16>(acc[mt][nt], a[mt][1], b[2], b[3]);
                }
            }
        }
    }
    cp_async_wait<0>();

    /* c0, c1: row g, tokens 2t, 2t + 1; c2, c3: row g + 8 */
    const int64_t N = w.rows;
    const bool split = gridDim.z > 1;
    float *dst = split ? part + (size_t)blockIdx.z * M * N : y;
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int64_t r = r0 + 32 * warp + 16 * mt + 8 * (e >> 1) + g;
                int m = m0 + nt * 8 + 2 * t + (e & 1);
                if (r < N && m < M) dst[(size_t)m * N + r] = acc[mt][nt][e];
            }
    if (!split) return;

    /* The last block of this tile adds the splits in order (threadfence
     * reduction: each block's partial is visible before its count). */
    __threadfence();
    __syncthreads();
    int *cnt = counters + blockIdx.y * gridDim.x + blockIdx.x;
    if (tid == 0) last = atomicAdd(cnt, 1) == (int)gridDim.z - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int64_t r = r0 + 32 * warp + 16 * mt + 8 * (e >> 1) + g;
                int m = m0 + nt * 8 + 2 * t + (e & 1);
                if (r >= N || m >= M) continue;
                float v = 0.f;
                for (unsigned z = 0; z < gridDim.z; z++)
                    v += __ldcg(part + (size_t)z * M * N + (size_t)m * N + r);
                y[(size_t)m * N + r] = v;
            }
    if (tid == 0) *cnt = 0; /* ready for the next call */
}

/* x [M][cols] f32 -> xa [M][kp] f16, each 16 columns permuted for q4_0
 * (position 8h + 2t + s holds element 2t + h + 8s), zeros past cols.  A
 * thread per 16 columns. */
template <bool PERM>
__global__ void qx_act_kernel(__half *xa, const float *x, int M, int64_t cols, int64_t kp) {
    cu_grid_trigger();
    cu_grid_wait();
    const int64_t per_row = kp / 16;
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (int64_t)M * per_row) return;
    const int64_t m = i / per_row, c = (i - m * per_row) * 16;
    float v[16];
    if (c < cols) {
        const float4 *src = (const float4 *)(x + m * cols + c);
#pragma unroll
        for (int q = 0; q < 4; q++) {
            float4 f = src[q];
            v[4 * q] = f.x, v[4 * q + 1] = f.y, v[4 * q + 2] = f.z, v[4 * q + 3] = f.w;
        }
    } else {
#pragma unroll
        for (int q = 0; q < 16; q++)
            v[q] = 0.f;
    }
    uint32_t o[8];
#pragma unroll
    for (int p = 0; p < 8; p++) { /* positions 2p, 2p + 1 */
        int e0 = 2 * p, e1 = 2 * p + 1;
        if (PERM) {
            int h = p >> 2, tt = p & 3; /* position 8h + 2tt + s */
            e0 = 2 * tt + h, e1 = 2 * tt + h + 8;
        }
        o[p] = h2u(__floats2half2_rn(v[e0], v[e1]));
    }
    uint4 *d = (uint4 *)(xa + m * kp + c);
    d[0] = make_uint4(o[0], o[1], o[2], o[3]);
    d[1] = make_uint4(o[4], o[5], o[6], o[7]);
}

/* ---- host ------------------------------------------------------------------------ */

static int64_t qx_kp(int64_t cols) {
    return CU_DIV_UP(cols, (int64_t)QX_KT) * QX_KT;
}

/* Token rows per block tile for an n-row call. */
static int qx_bm(int n) {
    return n <= 32 ? 32 : 64;
}

/* K splits: the fewest waves times stages per block, one block an SM (the
 * ring takes most of shared memory). */
static int qx_splits(const cu_ctx *c, int64_t tiles, int kts) {
    const int sms = c->n_sm > 0 ? c->n_sm : 132;
    if (tiles >= QX_COUNTERS) return 1;
    int best = 1;
    int64_t best_cost = INT64_MAX;
    for (int s = 1; s <= QX_MAX_SPLITS && s <= kts; s++) {
        int per = CU_DIV_UP(kts, s);
        if (CU_DIV_UP(kts, per) != s) continue; /* would leave a split empty */
        int64_t cost = CU_DIV_UP(tiles * s, (int64_t)sms) * per;
        if (cost < best_cost) best = s, best_cost = cost;
    }
    return best;
}

struct qx_plan {
    int bm, splits, kt_per;
    int64_t mtiles, ntiles;
};

static qx_plan qx_plan_of(const cu_ctx *c, const cu_qweight *w, int n) {
    qx_plan p;
    p.bm = qx_bm(n);
    p.mtiles = CU_DIV_UP((int64_t)n, (int64_t)p.bm);
    p.ntiles = CU_DIV_UP(w->rows, (int64_t)QX_BN);
    int kts = (int)CU_DIV_UP(w->cols, (int64_t)QX_KT);
    p.splits = qx_splits(c, p.mtiles * p.ntiles, kts);
    p.kt_per = CU_DIV_UP(kts, p.splits);
    return p;
}

extern "C" int cu_qmma_takes(const cu_qweight *w, int n) {
    return (w->fmt == CU_Q4_0 || w->fmt == CU_Q8_0) && n >= 1 && cu_qweight_ok(w) &&
           w->rows <= 65535LL * QX_BN && w->cols <= 0x7fffffffLL;
}

extern "C" size_t cu_qmma_act_bytes(const cu_qweight *w, int n) {
    return (size_t)n * (size_t)qx_kp(w->cols) * 2;
}

extern "C" size_t cu_qmma_part_bytes(const cu_ctx *c, const cu_qweight *w, int n) {
    qx_plan p = qx_plan_of(c, w, n);
    return p.splits > 1 ? (size_t)p.splits * n * (size_t)w->rows * sizeof(float) : 0;
}

template <int F, int BM> static void qx_init_one(int stride) {
    cudaFuncSetAttribute(qmma_kernel<F, BM>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         (int)qx_smem(F, BM, stride));
}

extern "C" int cu_qmma_init(int **counters) {
    qx_init_one<CU_Q4_0, 32>(160), qx_init_one<CU_Q4_0, 64>(160);
    qx_init_one<CU_Q8_0, 32>(288), qx_init_one<CU_Q8_0, 64>(288);
    cudaGetLastError();
    *counters = NULL;
    if (cudaMalloc((void **)counters, QX_COUNTERS * sizeof(int)) != cudaSuccess ||
        cudaMemset(*counters, 0, QX_COUNTERS * sizeof(int)) != cudaSuccess) {
        cudaGetLastError();
        if (*counters) cudaFree(*counters);
        *counters = NULL;
        return -1;
    }
    return 0;
}

template <int F, int BM>
static void qx_launch(const cu_ctx *c, const qx_plan &p, float *y, const __half *xa,
                      const cu_qweight &w, int n, float *part, int *counters) {
    const int stride = qx_row_stride(F, w.cols);
    dim3 grid((unsigned)p.mtiles, (unsigned)p.ntiles, (unsigned)p.splits);
    CU_LAUNCH((qmma_kernel<F, BM>), grid, QX_THREADS, qx_smem(F, BM, stride), c, y, xa, w, n,
              qx_kp(w.cols), stride, p.kt_per, part, counters);
}

extern "C" int cu_qmma(const cu_ctx *c, float *y, const float *x, const cu_qweight *w, int n,
                       void *act, void *part, int *counters) {
    if (!cu_qmma_takes(w, n) || !counters || !cu_aligned16(x) || !act) return -1;
    const qx_plan p = qx_plan_of(c, w, n);
    if (p.splits > 1 && !part) return -1;
    const int64_t kp = qx_kp(w->cols);
    const int64_t threads = (int64_t)n * (kp / 16);
    const unsigned blocks = (unsigned)CU_DIV_UP(threads, (int64_t)256);
    __half *xa = (__half *)act;
    if (w->fmt == CU_Q4_0)
        CU_LAUNCH((qx_act_kernel<true>), blocks, 256, 0, c, xa, x, n, w->cols, kp);
    else
        CU_LAUNCH((qx_act_kernel<false>), blocks, 256, 0, c, xa, x, n, w->cols, kp);
    const cu_qweight ww = *w;
    float *pf = (float *)part;
    if (w->fmt == CU_Q4_0) {
        if (p.bm == 32)
            qx_launch<CU_Q4_0, 32>(c, p, y, xa, ww, n, pf, counters);
        else
            qx_launch<CU_Q4_0, 64>(c, p, y, xa, ww, n, pf, counters);
    } else {
        if (p.bm == 32)
            qx_launch<CU_Q8_0, 32>(c, p, y, xa, ww, n, pf, counters);
        else
            qx_launch<CU_Q8_0, 64>(c, p, y, xa, ww, n, pf, counters);
    }
    return 0;
}
