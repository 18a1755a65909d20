/*
 * cuda_family.h - launchers for the ops the model families beyond Llama
 * need (Gemma: attention with a window or soft-capped scores, GeGLU, scale
 * and soft-cap; mixture of experts: routing, the matmul by expert id, the
 * weighted combine).  Kernels in family_ops.cu; the quantized matmul by
 * expert id lives in qmatmul.cu beside the format decoders it uses.
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

/* Device scratch (bytes) the sort of n*k pairs over n_experts needs. */
size_t cu_moe_sort_scratch(int pairs, int n_experts);
/* Groups the pairs (row * k + slot) of ids[pairs] by expert into scratch:
 * order[pairs] then first[n_experts + 1] (expert e's pairs are
 * order[first[e] .. first[e + 1])).  Ids out of range are left out (their
 * output rows are not written).  -1 for too many experts. */
int cu_moe_sort(const cu_ctx *c, void *scratch, const int32_t *ids, int pairs, int n_experts);

/* The matmul by expert id over the sort above, y[pair][rows] =
 * x row of pair · W[ids[pair]]ᵀ.  Each block takes one expert and a tile of
 * weight rows, streams that tile once per 8 pairs, and exits at once when
 * no pair chose its expert, so only selected experts are read.  A pair's
 * sum does not depend on the other pairs (batch-invariant).
 * w: n_experts matrices [rows][cols] of wtype (CU_F32/F16/BF16),
 * expert_stride bytes apart. */
int cu_matmul_id(const cu_ctx *c, float *y, const float *x, const void *w, int wtype,
                 size_t expert_stride, int rows, int cols, int n_experts, const void *sorted,
                 int pairs, int k, int x_slots);
/* The same for quantized experts (qmatmul.cu): w describes expert 0;
 * expert e's codes are e * expert_stride bytes after it, its affine scales
 * and biases e * rows * (cols / group) elements after them. */
int cu_qmatmul_id(const cu_ctx *c, float *y, const float *x, const cu_qweight *w,
                  size_t expert_stride, int n_experts, const void *sorted, int pairs, int k,
                  int x_slots);

#ifdef __cplusplus
}
#endif

#endif
