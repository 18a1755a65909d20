/*
 * cuda_family.h - launchers for the ops the model families beyond Llama
 * need (Gemma: attention with a window or soft-capped scores, GeGLU, scale
 * and soft-cap; mixture of experts: routing, the matmul by expert id, the
 * weighted combine).  Kernels in family_ops.cu; the matmul by expert id
 * (f32/f16/bf16 and quantized experts) in moe.cu.  The Gated DeltaNet ops
 * (Qwen3-Next, Qwen3.5) are in recurrent.cu, DeepSeek's column copy and
 * grouped routing in mla.cu.
 *
 * Kept out of cuda_internal.h so that adding a family op recompiles only
 * the files that launch it.  Conventions as in cuda_internal.h: plain
 * pointers, a cu_ctx for the stream, and -1 from a launcher that has no
 * kernel for the arguments (nothing is queued then).
 */
#ifndef PETREL_CUDA_FAMILY_H
#define PETREL_CUDA_FAMILY_H

#include "backend/cuda/cuda_internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Largest head_dim attention takes (the simple kernel of attention.cu
 * keeps 18 dims a lane), so that multi-head latent attention's cache
 * rows run: DeepSeek's kv rank 512 + rope 64. */
#define CU_ATTN_MAX_HEAD_DIM 576

/* Most experts a routing or a sort takes (the routing keeps a bit per
 * expert per lane: 32 lanes x 32 bits). */
#define CU_MOE_MAX_EXPERTS 1024

void cu_geglu(const cu_ctx *c, float *y, const float *gate, const float *up, size_t count);
/* x *= s, or (softcap) x = s * tanh(x / s). */
void cu_scale(const cu_ctx *c, float *x, float s, size_t count, int softcap);

/* gpt-oss's clamped SwiGLU: g = min(gate, limit), u = clamp(up, ±limit),
 * y = (u + 1) * g * sigmoid(alpha * g). */
void cu_swiglu_oai(const cu_ctx *c, float *y, const float *gate, const float *up, size_t count,
                   float alpha, float limit);
/* y[t][j] += bias[ids[t][j]] for rows of d (a bias per expert). */
void cu_add_id(const cu_ctx *c, float *y, const float *bias, const int32_t *ids, int n, int k,
               int d);

/* Attention as cu_attention_simple (one warp per row and query head), row
 * t seeing positions pos[t] - window + 1 .. pos[t] (window > 0) with
 * scores soft-capped to softcap * tanh(s / softcap) (softcap > 0) and, with
 * sinks, exp(sinks[h]) one more term in head h's denominator (gpt-oss). */
void cu_attention_ext(const cu_ctx *c, const cu_attn_args *a, int window, float softcap,
                      const float *sinks);

/* Per row of logits[n][n_experts]: softmax, the k largest (ties: lower
 * expert first) into ids[n][k] and weights[n][k], renormalized to sum 1
 * when renorm is set.  -1 for more than CU_MOE_MAX_EXPERTS experts. */
int cu_moe_route(const cu_ctx *c, int32_t *ids, float *weights, const float *logits, int n,
                 int n_experts, int k, int renorm);

/* y[t] = sum over j of weights[t][j] * x[t][j], rows of d. */
void cu_moe_combine(const cu_ctx *c, float *y, const float *x, const float *weights, int n, int k,
                    int d);

/* The matmul by expert id (moe.cu), two launches: cu_moe_prep, then
 * cu_matmul_id or cu_qmatmul_id over its scratch.
 *
 * Device scratch (bytes) for pairs = n * k (row, slot) pairs over
 * n_experts, and code_elems = x rows * cols activations to round (0 for
 * f32/f16/bf16 experts). */
size_t cu_moe_scratch(int pairs, int n_experts, int64_t code_elems);
/* Groups the pairs (row * k + slot) of ids[pairs] by expert into scratch
 * and lists the experts chosen; ids out of range are left out (their
 * output rows are not written).  group > 0 (quantized experts: 32, or an
 * affine weight's group) also rounds x [x_rows][cols] to int16 codes per
 * activation block of `group`, as the CPU backend does.  -1 for too many
 * experts, a group that is not 32 * 2^i, or x not 16-byte aligned. */
int cu_moe_prep(const cu_ctx *c, void *scratch, const int32_t *ids, int pairs, int n_experts,
                const float *x, int x_rows, int cols, int group);

/* y[pair][rows] = x row of pair · W[ids[pair]]ᵀ over the prepared scratch,
 * x [n][x_slots][cols] (pair = t * k + j reads slot x_slots > 1 ? j : 0).
 * A block per (8 weight rows, chosen expert): only chosen experts are
 * read, each row once per 8 of its pairs.  A pair's sum does not depend on
 * the other pairs (batch-invariant).  w: n_experts matrices [rows][cols]
 * of wtype (CU_F32/F16/BF16), expert_stride bytes apart. */
int cu_matmul_id(const cu_ctx *c, float *y, const float *x, const void *w, int wtype,
                 size_t expert_stride, int rows, int cols, int n_experts, const void *scratch,
                 int pairs, int k, int x_slots);
/* The same for quantized experts, x as the codes cu_moe_prep rounded: w
 * describes expert 0; expert e's codes are e * expert_stride bytes after
 * it, its affine scales and biases e * rows * (cols / group) elements
 * after them. */
int cu_qmatmul_id(const cu_ctx *c, float *y, const cu_qweight *w, size_t expert_stride,
                  int n_experts, const void *scratch, int pairs, int k, int x_slots);
/* Whether cu_qmatmul_id takes a stack of experts like w (cu_qweight_ok's
 * formats, and CU_MXFP4). */
int cu_moe_qweight_ok(const cu_qweight *w);

/* The matmul by expert id for many token rows (moe_mma.cu): the same
 * product as cu_moe_prep + cu_qmatmul_id, y[pair][rows] for x [n][x_slots]
 * [cols] and quantized experts w (as cu_qmatmul_id's), as a grouped GEMM
 * on the tensor cores with w and x rounded to f16 (within 2^-9 of
 * sum |w x| per output).  Two launches, no host sync.  Scratch: bytes for
 * pairs over n_experts, x_rows = n * x_slots rows of cols.  -1 (nothing
 * queued) for a stack it does not take. */
size_t cu_moe_mma_scratch(int pairs, int n_experts, int x_rows, int64_t cols);
int cu_moe_mma(const cu_ctx *c, float *y, const float *x, const cu_qweight *w,
               size_t expert_stride, int n_experts, const int32_t *ids, void *scratch, int pairs,
               int k, int x_slots);
/* Allows the grouped GEMM its shared memory (55 KiB); once, as cu_moe_init. */
void cu_moe_mma_init(const cu_ctx *c);

/* The routed-experts FFN of pt_op_moe_ffn in two launches (moe.cu), for
 * quantized experts: the same bits as the op sequence it stands for
 * (cu_moe_route, the matmuls by id, cu_add_id, the activation,
 * cu_moe_combine).  gate, up and down describe expert 0 of their stacks
 * (as cu_qmatmul_id's w); act is scratch of n * k * gate.rows floats. */
enum { CU_MOE_SWIGLU, CU_MOE_GEGLU, CU_MOE_SWIGLU_OAI }; /* = enum pt_moe_act */

typedef struct cu_moe_ffn_args {
    float *y;
    const float *x, *logits;
    cu_qweight gate, up, down;
    size_t gate_stride, up_stride, down_stride;
    const float *gate_bias, *up_bias, *down_bias;
    int32_t *ids;
    float *weights, *act;
    int n, n_experts, k, act_kind, renorm;
    float alpha, limit;
    int rows_per_warp; /* gate rows a warp of the up kernel stages, 1..4, fewer if
                          the block's shared memory would pass 100 KiB */
    int kernels;       /* 1: session 9's two kernels (PETREL_CUDA_MOE_FFN=1, for A/B);
                          else session 11's (moe.cu) */
} cu_moe_ffn_args;

/* -1 (nothing queued) for shapes the kernels do not take: formats that
 * differ between gate and up, more than 32 slots, rows too large for
 * shared memory; the caller runs the op sequence then. */
int cu_moe_ffn(const cu_ctx *c, const cu_moe_ffn_args *a);
/* Allows the fused kernels their shared memory (over 48 KiB): once, after
 * cu_kvq_init has read c->smem_optin, before any graph capture. */
void cu_moe_init(const cu_ctx *c);

/* ---- recurrent.cu: Gated DeltaNet layers ------------------------------------ */

/* dst[t][j] = src[t][idx[j]] for n rows (an index out of range gives 0). */
void cu_gather_cols(const cu_ctx *c, float *dst, const float *src, const int32_t *idx, int n,
                    int d_src, int d_dst);
/* y[t][i] = x[t][i] * sigmoid(g[t][g_d == 1 ? 0 : i]); y may alias x. */
void cu_sigmoid_mul(const cu_ctx *c, float *y, const float *x, const float *g, int n, int d,
                    int g_d);
/* y = x / rms(x) * w * silu(z) for n rows of d; y may alias x. */
void cu_rmsnorm_gated(const cu_ctx *c, float *y, const float *x, const float *z, const float *w,
                      int n, int d, float eps);

/* A batch's rows as the state ops see them: row t belongs to batch
 * sequence seq[t] < n_seqs, whose state lives in slot state_slot[seq]. */
typedef struct cu_rows {
    const int32_t *pos, *seq, *state_slot;
    int n, n_seqs;
} cu_rows;

/* The causal depthwise conv with its tail state, then SiLU
 * (pt_op_conv1d_silu): y, x [n][C], w [C][K], state [slots][K-1][C]. */
void cu_conv1d_silu(const cu_ctx *c, float *y, const float *x, const float *w, float *state,
                    cu_rows r, int C, int K);

/* Largest key head dim the delta rule takes (a column of the state, dk
 * floats, lives in the registers of 1, 2 or 4 lanes). */
#define CU_DELTA_MAX_DK 256

/* The gated delta rule (pt_op_gated_delta).  chunked: take each sequence's
 * rows 64 at a time in the chunkwise form (prefill; the caller decides,
 * by rows per sequence); else row by row in the recurrent form (decode).
 * The same function to f32 rounding. */
typedef struct cu_delta_args {
    float *out;
    const float *qkv, *ba, *A, *dt_bias;
    float *state;
    cu_rows r;
    int n_k_heads, n_v_heads, dk, dv, stride, tiled;
    float l2_eps;
    int chunked;
} cu_delta_args;

/* Allows the chunkwise kernels their shared memory (over 48 KiB): once,
 * before any graph capture.  cu_gated_delta skips an instance whose size
 * is over c->smem_optin (read by cu_kvq_init). */
void cu_recurrent_init(void);

/* -1 for dk over CU_DELTA_MAX_DK or value heads not a multiple of key heads. */
int cu_gated_delta(const cu_ctx *c, const cu_delta_args *a);

/* ---- mla.cu: DeepSeek-V2/V3 ---------------------------------------------- */

/* dst[t][dst_off + j] = src[t][src_off + j] for j < width, n rows. */
void cu_copy_cols(const cu_ctx *c, float *dst, int d_dst, int dst_off, const float *src, int d_src,
                  int src_off, int width, int n);

/* DeepSeek's routing (pt_op_moe_route_grouped), one warp per row.  -1 for
 * more than CU_MOE_MAX_EXPERTS experts or groups that do not divide them. */
typedef struct cu_route_grouped_args {
    int32_t *ids;
    float *weights;
    const float *logits, *bias;
    int n, n_experts, k, n_groups, groups_used, gating, renorm;
    float scale;
} cu_route_grouped_args;

int cu_moe_route_grouped(const cu_ctx *c, const cu_route_grouped_args *a);

#ifdef __cplusplus
}
#endif

#endif
