/*
 * quant_kernels.h - the CPU backend's kernels for quantized weights: MLX
 * affine (2/3/4/5/6/8 bits, groups of 32/64/128) and GGUF q8_0, q4_0,
 * q4_k, q5_k, q6_k.  Matrix-vector and matrix-matrix products, threaded, in
 * an AVX2 and a portable flavour, and row dequantization for embeddings.
 *
 * Numerics (docs/quantization.md): calls of fewer than
 * PT_QK_I8_MIN_TOKENS tokens (decode) of formats other than q4_0 and q8_0,
 * and every call without AVX2, quantize activations to int16 in blocks of 32 elements, or of the group size for
 * affine weights (d = max|x| / 32767, q = rint(x / d)).  Every
 * product of a weight code and an activation code is then an exact integer
 * dot product over a block (vpmaddwd on AVX2); each block's sum is scaled
 * once in f32:
 *
 *     y = sum over blocks  mul_w * d_x * sum_i(c_i * q_i)  +  add_w * d_x * sum_i(q_i)
 *
 * where (mul_w, add_w) is the block's weight scale and offset (affine: the
 * group's scale and bias; q4_k: d*sc and -dmin*m; ...).  The only error
 * beyond f32 rounding is the activation's rounding, at most d_x / 2 =
 * max|x| / 65534 per element: logits of whole models match an f32 forward
 * on the dequantized weights to about 1e-4 of their range.  The AVX2 and
 * portable kernels compute the same integer sums; they differ only in the
 * order of f32 additions.
 *
 * Prefill on AVX2 (quant_i8_avx2.c) quantizes activations to int8 instead
 * (blocks of 32, d = max|x| / 127, as llama.cpp does): the same sum, 258x
 * coarser rounding, 2-4x the speed.  Measured cost: 0.6-0.9% of the logit
 * range on test_convert's 4-bit models (int16: < 0.1%), KL 5e-4 nats
 * against int16 on a random TinyLlama-shape Q8_0 model, half what Q8_0
 * weights cost against F16 there (docs/benchmarks.md).  Decode of q4_0,
 * q8_0 and MXFP4 on AVX2 takes int8 activations too (the rows kernels at the end
 * of quant_i8_avx2.c), as llama.cpp does for these formats.  With the
 * avx512 kernel set the same int8 paths run on AVX-512 VNNI
 * (quant_i8_avx512.c), bit-identical to the AVX2 ones.
 * PETREL_CPU_INT8 (read when the backend is created): 0 keeps every call
 * on int16, "prefill" keeps decode there.  Where both int8 paths run, q4_0
 * matrices are repacked at load 8 rows at a time (PT_LAYOUT_Q4_0X8,
 * backend/repack.c; PETREL_CPU_REPACK=0 keeps the file's layout): every
 * kernel here reads either layout, the AVX2 int16 rows only the file's.
 *
 * Use: keep a pt_qk_ctx per backend (it owns the activation scratch) and
 * call pt_qk_matmul for any weight whose dtype pt_qk_handles().
 */
#ifndef PETREL_QUANT_KERNELS_H
#define PETREL_QUANT_KERNELS_H

#include "backend/backend.h"
#include "base/threadpool.h"

/* Quantized activations of n rows of x, laid out for one weight format. */
typedef struct pt_qact {
    int n;            /* rows (tokens) */
    int64_t cols;     /* a multiple of 32 */
    int64_t n_chunks; /* cols / 32 */
    int block;        /* elements sharing a scale: 32, or an affine weight's group size */
    int64_t n_blocks; /* cols / block */
    int perm;         /* enum pt_qk_perm: order of elements inside each 32-chunk */
    int16_t *q;       /* [n][cols] codes, chunk by chunk */
    float *d;         /* [n][n_blocks] scale of each block */
    float *ds;        /* [n][n_blocks] d * sum of the block's codes */
} pt_qact;

/* The AVX2 kernels unpack some code widths in an order other than the
 * natural one; the activations are stored in that order instead, which
 * costs nothing per weight. */
enum pt_qk_perm {
    PT_QK_PERM_NONE,
    PT_QK_PERM_EVEN_ODD, /* position p < 16: element 2p; p >= 16: 2(p-16)+1 (4-bit) */
    PT_QK_PERM_STRIDE4,  /* position 8k + j: element 4j + k (2-bit) */
};

/* Computes y[t][r] for r in [r0, r1) and every row t of the activations. */
typedef void (*pt_qk_rows_fn)(const pt_weight *w, const pt_qact *a, float *y, int64_t r0,
                              int64_t r1);

/* int8 activations for the prefill GEMM (quant_i8_avx2.c): blocks of 32,
 * d = max|x| / 127, codes in [-127, 127], natural order. */
typedef struct pt_qact8 {
    int n;
    int64_t cols, n_chunks;
    int8_t *q; /* [n][cols], 32-byte aligned rows */
    float *d;  /* [n][n_chunks] */
    float *ds; /* [n][n_chunks] d * sum of the chunk's codes */
    /* [n][n_chunks][2] sums of the codes of columns 0..15 and 16..31 of
     * each chunk: the AVX-512 kernels read signed weights as unsigned
     * (q8_0: w + 128; q6_k: q, not q - 32) and take the offset off with these. */
    int32_t *sq;
} pt_qact8;

typedef void (*pt_qk_rows8_fn)(const pt_weight *w, const pt_qact8 *a, float *y, int64_t r0,
                               int64_t r1);

/* Below this many tokens a call takes the int16 row kernels: they are
 * faster there (the GEMM repacks 8 rows per 1024 columns per call: at 4
 * tokens it ran 0.76-0.91x the rows, at 8 tokens 1.06-2.3x; bench/quant_gemm.c,
 * Zen 3), and int16 rounds activations 258x finer. */
#define PT_QK_I8_MIN_TOKENS 8

typedef struct pt_qk_ctx {
    bool avx2;     /* use the AVX2 kernels (the caller checked the CPU) */
    bool avx512;   /* with avx2: the int8 kernels on AVX-512 VNNI (quant_i8_avx512.c) */
    bool i8;       /* with avx2: the int8 GEMM for n >= PT_QK_I8_MIN_TOKENS where one exists */
    bool i8_decode; /* with i8: int8 rows below that too (q4_0, q8_0) */
    void *scratch; /* activation codes and scales, grown on demand */
    size_t cap;
} pt_qk_ctx;

/* Whether these kernels run weights of this dtype. */
bool pt_qk_handles(pt_dtype t);
/* AVX2, FMA and F16C present on this CPU. */
bool pt_qk_cpu_has_avx2(void);
/* AVX-512 F, BW, VL, DQ and VNNI present (and AVX2 as above). */
bool pt_qk_cpu_has_avx512(void);

/* y[n][w.rows] = x[n][w.cols] . w^T on the pool (NULL: this thread). */
void pt_qk_matmul(pt_qk_ctx *ctx, pt_pool *pool, float *y, const float *x, const pt_weight *w,
                  int n);
/* Row r of w as f32 (embedding lookups). */
void pt_qk_dequant_row(const pt_weight *w, int64_t r, float *out);
void pt_qk_ctx_free(pt_qk_ctx *ctx);

/* ---- the pieces, for tests and for callers with their own threading ---- */

/* Bytes of scratch pt_qk_act_init needs for n rows of cols. */
size_t pt_qk_act_bytes(int n, int64_t cols);
void pt_qk_act_init(pt_qact *a, void *scratch, int n, int64_t cols, int block, int perm);
/* The activation block that goes with w: its group size (affine) or 32. */
int pt_qk_act_block(const pt_weight *w);
/* Quantizes rows [t0, t1) of x into a. */
void pt_qk_quantize_act(pt_qact *a, const float *x, int t0, int t1);
/* The row kernel and activation order for w, or NULL if none. */
pt_qk_rows_fn pt_qk_portable_rows(const pt_weight *w);
pt_qk_rows_fn pt_qk_avx2_rows(const pt_weight *w);
int pt_qk_avx2_perm(const pt_weight *w);
/* The int8-activation GEMM for w (q8_0, q4_0, q4_k, q5_k, q6_k, affine
 * 4-bit, MXFP4), or NULL. */
pt_qk_rows8_fn pt_qk_avx2_rows8(const pt_weight *w);
/* The int8-activation decode kernel for w (q8_0, q4_0, MXFP4): rows in their file
 * layout, any n (meant for n < PT_QK_I8_MIN_TOKENS), or NULL. */
pt_qk_rows8_fn pt_qk_avx2_vec8(const pt_weight *w);
/* The same on AVX-512 VNNI (quant_i8_avx512.c): bit-identical results. */
pt_qk_rows8_fn pt_qk_avx512_rows8(const pt_weight *w);
pt_qk_rows8_fn pt_qk_avx512_vec8(const pt_weight *w);
size_t pt_qk_act8_bytes(int n, int64_t cols);
void pt_qk_act8_init(pt_qact8 *a, void *scratch, int n, int64_t cols);
void pt_qk_quantize_act8(pt_qact8 *a, const float *x, int t0, int t1);
/* The same codes and scales, bit for bit, 8 lanes at a time. */
void pt_qk_avx2_quantize_act8(pt_qact8 *a, const float *x, int t0, int t1);
/* The kernels pt_qk_matmul would run for w with n tokens: "avx2 int8 gemm",
 * "avx512 int8 rows", "avx2 int16", "portable int16"... (bench and tests
 * report it). */
const char *pt_qk_path(const pt_qk_ctx *ctx, const pt_weight *w, int n);

#endif
