/*
 * backend.h - the op table that model code is written against.
 *
 * A backend owns memory (weights, activations, the KV pool) and runs ops on
 * it.  The CPU backend runs each op synchronously on its thread pool; the CUDA
 * backend enqueues ops on a stream.  Model code never looks inside a buffer:
 * it passes pointers it got from the same backend, so one forward pass serves
 * both.
 *
 * Errors are sticky, as in SQLite's pager ERROR state: the first failure
 * (a device error, scratch that cannot grow, a shape no kernel takes, an
 * injected fault) is kept in the backend with the op's name, later ops are
 * skipped, and sync and download return -1 until the caller takes the
 * error (pt_be_take_error) after failing the work that depended on it.
 *
 * Conventions for every op:
 *   - activations are f32, row-major: a [n][d] matrix is n rows of d floats;
 *   - a "token batch" of n rows carries, per row, a position and the index of
 *     its sequence (pt_batch_view), so prefill (many rows of one sequence),
 *     decode (one row of many sequences) and mixed steps are the same call;
 *   - an output may alias an input only where the op says so.
 */
#ifndef PETREL_BACKEND_H
#define PETREL_BACKEND_H

#include "base/base.h"
#include "base/dtype.h"

/* The four structs below travel by value inside op records (pt_op), which
 * the CUDA backend compares bytewise to reuse graphs: they must have no
 * padding (-Wpadded is an error here), and their pad_ fields stay zero. */
#pragma GCC diagnostic push
#pragma GCC diagnostic error "-Wpadded"

/* A weight matrix W of shape [rows][cols] (rows = output features), in any
 * dtype whose blocks run along a row.  Used as y = x · Wᵀ. */
typedef struct pt_weight {
    pt_dtype dtype;
    /* PT_AFFINE only (MLX layout): data holds packed uint32 codes; each group
     * of group_size weights along a row has w = scale * q + bias, with scales
     * and biases [rows][cols / group_size] of scale_dtype (f16, bf16, f32). */
    pt_dtype scale_dtype;
    int bits, group_size;
    int64_t rows, cols;
    const void *data; /* backend memory */
    size_t nbytes;
    const void *scales, *biases;
    /* A stack of experts (MoE), 3-D [n_experts][rows][cols]: expert e's
     * matrix starts expert_stride bytes after expert e-1's (its scales and
     * biases likewise, rows * (cols / group_size) elements each); nbytes
     * counts them all.  0 for a plain matrix, the only kind matmul takes. */
    int n_experts;
    /* Tensor parallel shards are plain matrices (row slices are views,
     * column slices copies: model/tp.c), so nothing here marks them. */
    int pad_;
    size_t expert_stride;
    /* enum pt_weight_layout: how data is arranged.  The file's layout
     * unless the backend asked for another at load (weight_layout). */
    int layout;
    int pad2_;
} pt_weight;

/* Weight layouts other than the file's, made at load for a backend that
 * runs them faster (pt_backend_ops.weight_layout, quant/repack.c). */
enum pt_weight_layout {
    PT_LAYOUT_FILE,
    /* q4_0, rows a multiple of 8: rows interleaved 8 at a time so that a
     * 32-byte load holds 4 bytes of each of 8 rows (quant/repack.c). */
    PT_LAYOUT_Q4_0X8,
    /* q4_0 or q8_0: groups of 1-8 rows (whole 16-byte words; one row at
     * 256 * k columns) keep their place and size, their rows' block codes
     * first (16 or 32 bytes a block, in block order) then their f16
     * scales, so that a GPU lane's 16-byte load holds whole codes
     * (repack.c, the CUDA GEMV). */
    PT_LAYOUT_ROWSPLIT,
};

/* Expert e of a stack as a plain matrix (its codes, and its scales and
 * biases for PT_AFFINE), for backends that run one expert at a time. */
static inline pt_weight pt_weight_expert(const pt_weight *w, int e) {
    pt_weight x = *w;
    size_t groups = x.group_size ? (size_t)x.rows * (size_t)(x.cols / x.group_size) : 0;
    size_t sb = groups * (x.scale_dtype == PT_F32 ? 4 : 2); /* scales, biases of one expert */
    x.data = (const char *)w->data + (size_t)e * w->expert_stride;
    if (x.scales) x.scales = (const char *)w->scales + (size_t)e * sb;
    if (x.biases) x.biases = (const char *)w->biases + (size_t)e * sb;
    x.nbytes = w->expert_stride;
    x.n_experts = 0;
    x.expert_stride = 0;
    return x;
}

enum pt_rope_style {
    PT_ROPE_NORM, /* rotate adjacent pairs (x0,x1), (x2,x3)...: GGUF llama */
    PT_ROPE_NEOX, /* rotate (x_i, x_{i+d/2}): Hugging Face rotate_half */
};

typedef struct pt_rope {
    int style;             /* enum pt_rope_style */
    int n_rot;             /* leading dims of each head that rotate (even) */
    const float *inv_freq; /* [n_rot/2] backend memory, scaling already applied */
    float mscale;          /* multiplies cos and sin (1 unless YaRN-style) */
    int pad_;
} pt_rope;

/* The paged KV cache of one layer, as the backend sees it.  Token at position
 * p of sequence s lives in page block_table[s][p / page_size], slot
 * p % page_size; a page holds [page_size][n_kv_heads][head_dim] elements. */
typedef struct pt_kv_view {
    void *k, *v;
    pt_dtype dtype; /* PT_F32, PT_F16 or PT_BF16 */
    int page_size, n_kv_heads, head_dim;
    /* Quantized caches (--kv-quant; formats in src/kv/kv_codec.h): codec is
     * set, and a slot holds n_kv_heads rows of k_row (K) or v_row (V) bytes
     * instead of elements of dtype.  The ints repeat the codec's geometry
     * for device code: kvq is enum pt_kvq_kind (0 = plain), group the scale
     * group along head_dim.  tables is the codec's constants in backend
     * memory (TurboQuant: signs [head_dim], V centroids [1 << v_bits], then
     * the (1 << v_bits) - 1 boundaries between them); codec itself is host
     * memory (its scalar encoders and decoders). */
    const struct pt_kv_codec *codec; /* NULL: plain elements of dtype */
    int kvq, k_bits, v_bits, group;
    int k_row, v_row;
    const float *tables;
} pt_kv_view;

/* One forward batch, in backend memory (see pt_backend_ops.upload). */
typedef struct pt_batch_view {
    const int32_t *pos;         /* [n_tokens] position of each row */
    const int32_t *seq;         /* [n_tokens] sequence index of each row */
    const int32_t *block_table; /* [n_seqs][max_pages] page ids */
    /* [n_seqs] each sequence's slot in the recurrent-state buffers
     * (kvcache.h, the state group); NULL for models without recurrent
     * layers. */
    const int32_t *state_slot;
    int n_tokens, max_pages, n_seqs;
    int pad_;
} pt_batch_view;

#pragma GCC diagnostic pop

/* How attention_ext scores: scores are q·k · scale, then, with softcap > 0,
 * softcap · tanh(score / softcap) (Gemma 2); with window > 0 row t sees
 * only positions pos[t] - window + 1 .. pos[t] (sliding window); with
 * sinks, head h's softmax denominator has one more term, exp(sinks[h]),
 * a logit no value goes with (gpt-oss's attention sinks). */
typedef struct pt_attn_params {
    float scale;
    int window;    /* 0: every position up to pos[t] */
    float softcap; /* 0: none */
    int pad_;
    const float *sinks; /* [n_heads] backend memory, or NULL */
} pt_attn_params;

/* ---- Op records ------------------------------------------------------------
 *
 * Every compute op is one record: a kind and that op's struct of named
 * arguments.  Model code calls the pt_be_* wrappers below, which zero a
 * pt_op, fill it field by field and hand it to the backend's run; the CPU
 * backend executes it at once, the CUDA backend stores it (the zeroed bytes
 * make equal calls compare equal, for graph reuse) and launches it later.
 *
 * Adding an op: a kind here, its struct in the union, a wrapper that fills
 * the zeroed record field by field (a whole-struct assignment would copy
 * stray padding), its name in backend.c; a case in cpu_backend.c's
 * cpu_run_op and in cuda_backend.c's cuda_exec_op with a launcher in the
 * .cu file of its family (docs/architecture.md). */
typedef enum pt_op_kind {
    PT_OP_MATMUL,
    PT_OP_EMBED,
    PT_OP_RMSNORM,
    PT_OP_ADD,
    PT_OP_ADD_BIAS,
    PT_OP_SWIGLU,
    PT_OP_ROPE,
    PT_OP_KV_STORE,
    PT_OP_ATTENTION,
    PT_OP_GATHER_ROWS,
    /* Model-family ops (issue 16): optional, see has_op. */
    PT_OP_ATTENTION_EXT,
    PT_OP_GEGLU,
    PT_OP_SCALE,
    PT_OP_SOFTCAP,
    PT_OP_MOE_ROUTE,
    PT_OP_MATMUL_ID,
    PT_OP_MOE_COMBINE,
    PT_OP_SWIGLU_OAI,
    PT_OP_ADD_ID,
    /* Hybrid recurrent layers (issue 17, Gated DeltaNet): optional. */
    PT_OP_GATHER_COLS,
    PT_OP_SIGMOID_MUL,
    PT_OP_CONV1D_SILU,
    PT_OP_GATED_DELTA,
    PT_OP_RMSNORM_GATED,
    /* Multi-head latent attention and DeepSeek routing (issue 17): optional. */
    PT_OP_COPY_COLS,
    PT_OP_MOE_ROUTE_GROUPED,
    /* Tensor parallel (docs/tensor-parallel.md): optional. */
    PT_OP_ALL_REDUCE,
    PT_OP_MOE_LOCAL,
    /* A routed-experts FFN in one op (decode's fused kernels): optional. */
    PT_OP_MOE_FFN,
    /* Greedy picks on the device (only ids come back): optional. */
    PT_OP_ARGMAX,
    PT_OP_COUNT
} pt_op_kind;

/* y[n][w.rows] = x[n][w.cols] · wᵀ.  y must not alias x. */
typedef struct pt_op_matmul {
    float *y;
    const float *x;
    pt_weight w;
    int n;
} pt_op_matmul;

/* y[i] = row ids[i] of the table, converted to f32. */
typedef struct pt_op_embed {
    float *y;
    const int32_t *ids;
    pt_weight table;
    int n;
} pt_op_embed;

/* y[i] = x[i] / rms(x[i]) * g, rows of d; y may alias x. */
typedef struct pt_op_rmsnorm {
    float *y;
    const float *x, *g;
    int n, d;
    float eps;
} pt_op_rmsnorm;

/* y = a + b over count floats; y may alias a or b. */
typedef struct pt_op_add {
    float *y;
    const float *a, *b;
    size_t count;
} pt_op_add;

/* y[i][j] += bias[j] for n rows of d. */
typedef struct pt_op_add_bias {
    float *y;
    const float *bias;
    int n, d;
} pt_op_add_bias;

/* y = silu(gate) * up over count floats; y may alias gate or up. */
typedef struct pt_op_swiglu {
    float *y;
    const float *gate, *up;
    size_t count;
} pt_op_swiglu;

/* Rotates x[n][n_heads][head_dim] in place at each row's position. */
typedef struct pt_op_rope {
    float *x;
    pt_batch_view b;
    pt_rope rope;
    int n_heads, head_dim;
} pt_op_rope;

/* Writes each row's k and v ([n][n_kv_heads][head_dim]) into the cache. */
typedef struct pt_op_kv_store {
    pt_kv_view kv;
    pt_batch_view b;
    const float *k, *v;
} pt_op_kv_store;

/* Causal attention: row t's query heads q[t][n_heads][head_dim] attend to
 * positions 0..pos[t] of its sequence in the cache (grouped-query: head h
 * reads kv head h / (n_heads / n_kv_heads)).  out is [n][n_heads][head_dim]. */
typedef struct pt_op_attention {
    float *out;
    const float *q;
    pt_kv_view kv;
    pt_batch_view b;
    int n_heads;
    float scale;
} pt_op_attention;

/* dst[i] = src[idx[i]] for rows of d floats (idx in backend memory). */
typedef struct pt_op_gather_rows {
    float *dst;
    const float *src;
    const int32_t *idx;
    int n, d;
} pt_op_gather_rows;

/* Attention with a window and/or score soft-capping (p: scale, window,
 * softcap); plain KV caches only (the model refuses quantized ones with
 * these layers). */
typedef struct pt_op_attention_ext {
    float *out;
    const float *q;
    pt_kv_view kv;
    pt_batch_view b;
    int n_heads;
    pt_attn_params p;
} pt_op_attention_ext;

/* y = gelu_tanh(gate) * up over count floats (GeGLU); y may alias gate or up. */
typedef struct pt_op_geglu {
    float *y;
    const float *gate, *up;
    size_t count;
} pt_op_geglu;

/* x *= s (scale), or x = s * tanh(x / s) (softcap: logit soft-capping),
 * over count floats. */
typedef struct pt_op_scale {
    float *x;
    float s;
    size_t count;
} pt_op_scale;

/* Mixture-of-experts routing: per row of logits[n][n_experts], softmax,
 * the k largest probabilities (ties: lower expert first) into ids[n][k]
 * and weights[n][k], renormalized to sum 1 when renorm is set. */
typedef struct pt_op_moe_route {
    int32_t *ids;
    float *weights;
    const float *logits;
    int n, n_experts, k;
    bool renorm;
} pt_op_moe_route;

/* Matmul by expert id (ggml's mul_mat_id): for row t and slot j,
 * y[t][j] = x[t][x_slots > 1 ? j : 0] · W[ids[t][j]]ᵀ, with w a stack of
 * experts (n_experts > 0); x is [n][x_slots][w.cols], y [n][k][w.rows].
 * Reads only the experts some row selects, each once per call.  An id of
 * -1 (moe_local: another rank's expert) skips its slot: y[t][j] is zero
 * (the CPU backend; the CUDA one never sees one: it lacks moe_local). */
typedef struct pt_op_matmul_id {
    float *y;
    const float *x;
    pt_weight w;
    const int32_t *ids;
    int n, k, x_slots;
} pt_op_matmul_id;

/* y[t] = sum over j of weights[t][j] * x[t][j], rows of d; y [n][d],
 * x [n][k][d].  y must not alias x. */
typedef struct pt_op_moe_combine {
    float *y;
    const float *x, *weights;
    int n, k, d;
} pt_op_moe_combine;

/* gpt-oss's clamped SwiGLU over count floats: with g = min(gate, limit)
 * and u = clamp(up, -limit, limit), y = (u + 1) · g · sigmoid(alpha · g);
 * y may alias gate or up. */
typedef struct pt_op_swiglu_oai {
    float *y;
    const float *gate, *up;
    size_t count;
    float alpha, limit;
} pt_op_swiglu_oai;

/* Bias by expert id (ggml's add_id): y[t][j] += bias[ids[t][j]] for rows
 * of d; y [n][k][d], bias [n_experts][d], ids [n][k]. */
typedef struct pt_op_add_id {
    float *y;
    const float *bias;
    const int32_t *ids;
    int n, k, d;
    int pad_;
} pt_op_add_id;
/* dst[t][j] = src[t][idx[j]] for n rows: src rows of d_src floats, dst
 * rows of d_dst; idx [d_dst] in backend memory.  Splits a fused
 * projection into its parts.  dst must not alias src. */
typedef struct pt_op_gather_cols {
    float *dst;
    const float *src;
    const int32_t *idx;
    int n, d_src, d_dst;
} pt_op_gather_cols;

/* y[t][i] = x[t][i] * sigmoid(g[t][g_d == 1 ? 0 : i]) for n rows of d;
 * g has rows of g_d floats (d, or 1: one gate per row).  y may alias x. */
typedef struct pt_op_sigmoid_mul {
    float *y;
    const float *x, *g;
    int n, d, g_d;
} pt_op_sigmoid_mul;

/* Causal depthwise convolution over each sequence's positions, then SiLU:
 * y[t][c] = silu(sum_j w[c][j] * u[t-K+1+j][c]) with u the channel's
 * inputs, where inputs before the batch's first row of a sequence come
 * from its conv state (state + slot * (K-1) * C: the last K-1 input rows,
 * oldest first) and the state is left holding the last K-1 inputs.  A row
 * at position 0 starts from a zero state.  Rows of one sequence must come
 * in position order.  x, y [n][C]; w [C][K]. */
typedef struct pt_op_conv1d_silu {
    float *y;
    const float *x, *w;
    float *state;
    pt_batch_view b;
    int C, K;
} pt_op_conv1d_silu;

/* The gated delta rule (Gated DeltaNet), one token at a time per sequence.
 * Row t reads q [n_k_heads][dk] at qkv + t*stride, k right after it and v
 * [n_v_heads][dv] after k; ba + t*2*n_v_heads holds b then a per v head.
 * Value head h uses key head h / (n_v_heads / n_k_heads) (transformers'
 * repeat_interleave), or h % n_k_heads with tiled (llama.cpp's qwen35
 * GGUF layout, whose converter reorders the value heads so).  A[h] is the
 * decay rate -exp(A_log[h]).  With S the head's state [dk][dv] (state +
 * (slot * n_v_heads + h) * dk * dv, zero at position 0):
 *     q, k = l2norm(q), l2norm(k);  q /= sqrt(dk)
 *     g = A[h] * softplus(a + dt_bias[h]);  beta = sigmoid(b)
 *     S = exp(g) S;  S += k (beta (v - Sᵀk))ᵀ;  out[t][h] = Sᵀq
 * l2norm(x) is x / sqrt(|x|² + 1e-6) (FLA, transformers) when l2_eps is 0,
 * else x / max(|x|, l2_eps) (ggml's l2_norm).  Rows of one sequence must
 * come in position order.  With chunk > 1, a run of consecutive rows of
 * one sequence (a prefill) goes chunk rows at a time through the chunkwise
 * form (the same function, to f32 rounding); 0 or 1: token by token. */
typedef struct pt_op_gated_delta {
    float *out;
    const float *qkv, *ba, *A, *dt_bias;
    float *state;
    pt_batch_view b;
    int n_k_heads, n_v_heads, dk, dv, stride, chunk;
    bool tiled;
    float l2_eps;
} pt_op_gated_delta;

/* y = x / rms(x) * w * silu(z) for n rows of d (the gated output norm of
 * Gated DeltaNet: w is a plain gain, not 1 + w).  y may alias x. */
typedef struct pt_op_rmsnorm_gated {
    float *y;
    const float *x, *z, *w;
    int n, d;
    float eps;
} pt_op_rmsnorm_gated;

/* dst[t][dst_off + j] = src[t][src_off + j] for j < width and n rows:
 * src rows of d_src floats, dst rows of d_dst.  Splits fused projections
 * and joins parts side by side (MLA's [latent | rope] keys and queries);
 * columns of dst outside the range are left as they are.  dst must not
 * alias src. */
typedef struct pt_op_copy_cols {
    float *dst;
    const float *src;
    int n, d_src, d_dst, src_off, dst_off, width;
} pt_op_copy_cols;

/* DeepSeek-V2/V3 routing, per row of logits[n][n_experts]: probabilities
 * p = softmax (gating 0) or sigmoid (gating 1) of the logits; selection
 * scores s = p + bias (bias [n_experts], NULL: s = p); with n_groups > 1
 * the experts form n_groups equal groups, each scored by the sum of its
 * two largest s, and only the groups_used best groups are eligible
 * (ties: lower group first).  ids[n][k] = the k eligible experts with the
 * largest s (ties: lower expert first); weights[n][k] = their p, divided
 * by their sum when renorm, times scale. */
typedef struct pt_op_moe_route_grouped {
    int32_t *ids;
    float *weights;
    const float *logits, *bias;
    int n, n_experts, k, n_groups, groups_used, gating;
    float scale;
    bool renorm;
} pt_op_moe_route_grouped;

enum pt_moe_gating { PT_MOE_SOFTMAX, PT_MOE_SIGMOID };

/* buf[count] = the sum of buf over the ranks of comm (backend/comm.h),
 * in place (tensor parallel: the partial outputs of a row-parallel matmul).
 * Every rank runs it, with its own buffer and count, in the same order of
 * calls; afterwards every rank holds the same floats. */
/* Expert parallel: this rank holds experts [first, first + count) of the
 * routing's.  Each slot of ids[n][k] that chose one of them is renumbered
 * from 0; every other slot becomes id -1 with weight 0, which matmul_id
 * skips (a zero row) and moe_combine adds as nothing. */
typedef struct pt_op_moe_local {
    int32_t *ids;
    float *weights;
    int n, k, first, count;
} pt_op_moe_local;

/* The activation of moe_ffn's experts (act(gate, up), as the ops swiglu,
 * geglu and swiglu_oai compute it). */
enum pt_moe_act { PT_MOE_SWIGLU, PT_MOE_GEGLU, PT_MOE_SWIGLU_OAI };

/* A routed-experts FFN, the op sequence moe_route, matmul_id (gate, up),
 * add_id (gate_bias, up_bias, when given), the activation, matmul_id
 * (down, an input per slot), add_id (down_bias), moe_combine, as one op:
 *
 *     ids, weights = moe_route(logits, k, renorm)        [n][k]
 *     gate[t][j] = x[t] · Wgate[ids[t][j]]ᵀ (+ gate_bias[ids[t][j]]), up likewise
 *     gate = act(gate, up)                                [n][k][F]
 *     out[t][j] = gate[t][j] · Wdown[ids[t][j]]ᵀ (+ down_bias)   [n][k][d]
 *     y[t] = sum over j of weights[t][j] · out[t][j]       [n][d]
 *
 * The CPU backend runs exactly those ops (the reference); the CUDA backend
 * runs them as two kernels at decode (moe.cu), with the same arithmetic.
 * ids and weights hold the routing afterwards; gate, up and out are
 * scratch of those sizes, their contents afterwards unspecified.  The
 * weights are read through their pointers when the op runs (on CUDA, when
 * the step is flushed or replayed), so they must outlive it, as a model's
 * layers do.  y may alias x. */
typedef struct pt_op_moe_ffn {
    float *y;
    const float *x, *logits;
    const pt_weight *w_gate, *w_up, *w_down;
    const float *gate_bias, *up_bias, *down_bias; /* [n_experts][F or d], or NULL */
    int32_t *ids;
    float *weights, *gate, *up, *out;
    int n, n_experts, k, act; /* act: enum pt_moe_act */
    float alpha, limit;       /* PT_MOE_SWIGLU_OAI's */
    bool renorm;
} pt_op_moe_ffn;

/* ids[i] = the index of the largest of row i of x [n][d]: the lowest such
 * index on ties; NaN never wins; a row of nothing but -inf and NaN gives 0
 * (the greedy sampler's argmax, sampler.c).  A decode step then brings
 * back n ids instead of n rows of logits. */
typedef struct pt_op_argmax {
    int32_t *ids;
    const float *x;
    int n, d;
} pt_op_argmax;

typedef struct pt_op_all_reduce {
    float *buf;
    struct pt_comm *comm;
    size_t count;
    int rank;
    int pad_;
} pt_op_all_reduce;

typedef struct pt_op {
    pt_op_kind kind;
    union {
        pt_op_matmul matmul;
        pt_op_embed embed;
        pt_op_rmsnorm rmsnorm;
        pt_op_add add;
        pt_op_add_bias add_bias;
        pt_op_swiglu swiglu;
        pt_op_rope rope;
        pt_op_kv_store kv_store;
        pt_op_attention attention;
        pt_op_gather_rows gather_rows;
        pt_op_attention_ext attention_ext;
        pt_op_geglu geglu;
        pt_op_scale scale; /* PT_OP_SCALE and PT_OP_SOFTCAP */
        pt_op_moe_route moe_route;
        pt_op_matmul_id matmul_id;
        pt_op_moe_combine moe_combine;
        pt_op_swiglu_oai swiglu_oai;
        pt_op_add_id add_id;
        pt_op_gather_cols gather_cols;
        pt_op_sigmoid_mul sigmoid_mul;
        pt_op_conv1d_silu conv1d_silu;
        pt_op_gated_delta gated_delta;
        pt_op_rmsnorm_gated rmsnorm_gated;
        pt_op_copy_cols copy_cols;
        pt_op_moe_route_grouped moe_route_grouped;
        pt_op_all_reduce all_reduce;
        pt_op_moe_local moe_local;
        pt_op_moe_ffn moe_ffn;
        pt_op_argmax argmax;
    };
} pt_op;

/* "matmul", "rope", ... for messages; "?" for an unknown kind. */
const char *pt_op_name(int kind);

typedef struct pt_backend pt_backend;

typedef struct pt_backend_ops {
    /* Memory.  alloc returns zeroed backend memory or NULL. */
    void *(*alloc)(pt_backend *be, size_t nbytes);
    void (*free)(pt_backend *be, void *p, size_t nbytes);
    void (*upload)(pt_backend *be, void *dst, const void *src, size_t nbytes);
    /* Waits for the ops before it; -1 if the backend is in error (dst then
     * holds garbage). */
    int (*download)(pt_backend *be, void *dst, const void *src, size_t nbytes);
    /* Backend memory to backend memory, in op order (KV page copies). */
    void (*copy)(pt_backend *be, void *dst, const void *src, size_t nbytes);
    /* Waits for every op; -1 if the backend is in error (see the top). */
    int (*sync)(pt_backend *be);

    /* Runs (CPU) or enqueues (CUDA) one op record; see pt_be_* below. */
    void (*run)(pt_backend *be, const pt_op *op);
    /* Whether run takes ops of this kind (enum pt_op_kind); NULL: every
     * kind.  The loader refuses a model whose plan needs a kind the backend
     * lacks, naming it (pt_model_check_ops), before any weight is read. */
    bool (*has_op)(pt_backend *be, int kind);
    /* NULL when kv_store and attention take every quantized KV format;
     * otherwise 0 if they take this one (kvq: enum pt_kvq_kind, group: the
     * scale group along head_dim), or -1 with the reason in err.  Checked
     * when a cache is created, so a refusal comes before any work. */
    int (*kv_quant_check)(pt_backend *be, int kvq, int k_bits, int v_bits, int group, int head_dim,
                          pt_err *err);

    /* Bytes of backend memory free now; NULL for host memory (then the
     * system's available memory counts). */
    size_t (*free_memory)(pt_backend *be);

    /* Measured memory read bandwidth in bytes/s (a large streaming read on
     * all threads), for rooflines. */
    double (*read_bandwidth)(pt_backend *be);
    /* Measured compute peak in operations/s (a multiply-add is 2) on all
     * threads, for the multiply-adds a prefill with weights of dtype wt
     * runs; note (may be NULL) gets a line naming the kernels and how the
     * probes ran.  NULL op: not measured (prefill shows no fraction). */
    double (*compute_peak)(pt_backend *be, pt_dtype wt, char *note, size_t note_len);
    /* The layout (enum pt_weight_layout) this backend runs the plain
     * matrix w fastest in; the loader then keeps a repacked copy
     * (pt_model_repack_weight).  NULL: always the file's. */
    int (*weight_layout)(pt_backend *be, const pt_weight *w);
    /* For a backend whose memory is not host memory: rearranges w's data
     * in place (same bytes, same address) into layout, the one
     * weight_layout asked for; 0 done, -1 not done (w stays in the file's
     * layout, nothing failed).  NULL: never. */
    int (*repack)(pt_backend *be, const pt_weight *w, int layout);
    /* Kernels one decode step launched (the last one run as a whole, e.g.
     * a CUDA graph), for benchmarks; 0 or NULL: not known. */
    int (*step_kernels)(pt_backend *be);
    void (*destroy)(pt_backend *be);
} pt_backend_ops;

struct pt_backend {
    const pt_backend_ops *ops;
    const char *name;   /* "cpu", "cuda" */
    const char *detail; /* e.g. "avx2, 2 threads" */
    int n_threads;
    bool host_memory; /* backend memory is host memory: weights can stay mmap'd */
    /* The sticky error: set by pt_be_fail, cleared by pt_be_take_error. */
    bool failed;
    pt_err error;
};

/* Records the first failure (later ones are only logged) and returns -1.
 * Backends call it; what names the op or call ("matmul", "sync"). */
int pt_be_fail(pt_backend *be, const char *what, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Hands the sticky error to err and leaves the error state (the caller has
 * failed whatever the broken ops fed); -1, or 0 if there was none. */
int pt_be_take_error(pt_backend *be, pt_err *err);

/* ---- Op wrappers: what model code calls ------------------------------------
 * Each zeroes a record (padding included), fills it and runs it. */

static inline void pt_be_run(pt_backend *be, pt_op *o) {
    if (!be->failed) be->ops->run(be, o); /* after a failure the inputs are garbage */
}

/* Puts the plain matrix w, already in backend memory, into the layout the
 * backend runs fastest, where the backend rearranges its memory in place
 * (ops.repack; a host-memory backend gets a repacked copy from the loader
 * instead, pt_model_repack_weight).  Nothing changes when it declines. */
static inline void pt_be_repack_weight(pt_backend *be, pt_weight *w) {
    if (!be->ops->weight_layout || !be->ops->repack || w->n_experts || w->layout != PT_LAYOUT_FILE)
        return;
    int layout = be->ops->weight_layout(be, w);
    if (layout != PT_LAYOUT_FILE && be->ops->repack(be, w, layout) == 0) w->layout = layout;
}

static inline void pt_be_matmul(pt_backend *be, float *y, const float *x, const pt_weight *w,
                                int n) {
    pt_op o;
    memset(&o, 0, sizeof o);
    o.kind = PT_OP_MATMUL;
    o.matmul.y = y, o.matmul.x = x, o.matmul.w = *w, o.matmul.n = n;
    pt_be_run(be, &o);
}

static inline void pt_be_embed(pt_backend *be, float *y, const pt_weight *table,
                               const int32_t *ids, int n) {
    pt_op o;
    memset(&o, 0, sizeof o);
    o.kind = PT_OP_EMBED;
    o.embed.y = y, o.embed.table = *table, o.embed.ids = ids, o.embed.n = n;
    pt_be_run(be, &o);
}

static inline void pt_be_rmsnorm(pt_backend *be, float *y, const float *x, const float *g, int n,
                                 int d, float eps) {
    pt_op o;
    memset(&o, 0, sizeof o);
    o.kind = PT_OP_RMSNORM;
    o.rmsnorm.y = y, o.rmsnorm.x = x, o.rmsnorm.g = g;
    o.rmsnorm.n = n, o.rmsnorm.d = d, o.rmsnorm.eps = eps;
    pt_be_run(be, &o);
}

static inline void pt_be_add(pt_backend *be, float *y, const float *a, const float *b,
                             size_t count) {
    pt_op o;
    memset(&o, 0, sizeof o);
    o.kind = PT_OP_ADD;
    o.add.y = y, o.add.a = a, o.add.b = b, o.add.count = count;
    pt_be_run(be, &o);
}

static inline void pt_be_add_bias(pt_backend *be, float *y, const float *bias, int n, int d) {
    pt_op o;
    memset(&o, 0, sizeof o);
    o.kind = PT_OP_ADD_BIAS;
    o.add_bias.y = y, o.add_bias.bias = bias, o.add_bias.n = n, o.add_bias.d = d;
    pt_be_run(be, &o);
}

static inline void pt_be_swiglu(pt_backend *be, float *y, const float *gate, const float *up,
                                size_t count) {
    pt_op o;
    memset(&o, 0, sizeof o);
    o.kind = PT_OP_SWIGLU;
    o.swiglu.y = y, o.swiglu.gate = gate, o.swiglu.up = up, o.swiglu.count = count;
    pt_be_run(be, &o);
}

static inline void pt_be_rope(pt_backend *be, float *x, const pt_batch_view *b, int n_heads,
                              int head_dim, const pt_rope *rope) {
    pt_op o;
    memset(&o, 0, sizeof o);
    o.kind = PT_OP_ROPE;
    o.rope.x = x, o.rope.b = *b, o.rope.rope = *rope;
    o.rope.n_heads = n_heads, o.rope.head_dim = head_dim;
    pt_be_run(be, &o);
}

static inline void pt_be_kv_store(pt_backend *be, const pt_kv_view *kv, const pt_batch_view *b,
                                  const float *k, const float *v) {
    pt_op o;
    memset(&o, 0, sizeof o);
    o.kind = PT_OP_KV_STORE;
    o.kv_store.kv = *kv, o.kv_store.b = *b, o.kv_store.k = k, o.kv_store.v = v;
    pt_be_run(be, &o);
}

static inline void pt_be_attention(pt_backend *be, float *out, const float *q,
                                   const pt_kv_view *kv, const pt_batch_view *b, int n_heads,
                                   float scale) {
    pt_op o;
    memset(&o, 0, sizeof o);
    o.kind = PT_OP_ATTENTION;
    o.attention.out = out, o.attention.q = q, o.attention.kv = *kv, o.attention.b = *b;
    o.attention.n_heads = n_heads, o.attention.scale = scale;
    pt_be_run(be, &o);
}

static inline void pt_be_gather_rows(pt_backend *be, float *dst, const float *src,
                                     const int32_t *idx, int n, int d) {
    pt_op o;
    memset(&o, 0, sizeof o);
    o.kind = PT_OP_GATHER_ROWS;
    o.gather_rows.dst = dst, o.gather_rows.src = src, o.gather_rows.idx = idx;
    o.gather_rows.n = n, o.gather_rows.d = d;
    pt_be_run(be, &o);
}

/* ---- Model-family op wrappers (issue 16) ---- */

static inline bool pt_be_has_op(const pt_backend *be, int kind) {
    return !be->ops->has_op || be->ops->has_op((pt_backend *)be, kind);
}

static inline void pt_be_attention_ext(pt_backend *be, float *out, const float *q,
                                       const pt_kv_view *kv, const pt_batch_view *b, int n_heads,
                                       const pt_attn_params *p) {
    pt_op o;
    memset(&o, 0, sizeof o);
    o.kind = PT_OP_ATTENTION_EXT;
    o.attention_ext.out = out, o.attention_ext.q = q, o.attention_ext.kv = *kv;
    o.attention_ext.b = *b, o.attention_ext.n_heads = n_heads;
    o.attention_ext.p.scale = p->scale, o.attention_ext.p.window = p->window;
    o.attention_ext.p.softcap = p->softcap, o.attention_ext.p.sinks = p->sinks;
    pt_be_run(be, &o);
}

static inline void pt_be_geglu(pt_backend *be, float *y, const float *gate, const float *up,
                               size_t count) {
    pt_op o;
    memset(&o, 0, sizeof o);
    o.kind = PT_OP_GEGLU;
    o.geglu.y = y, o.geglu.gate = gate, o.geglu.up = up, o.geglu.count = count;
    pt_be_run(be, &o);
}

static inline void pt_be_scale(pt_backend *be, float *x, float s, size_t count) {
    pt_op o;
    memset(&o, 0, sizeof o);
    o.kind = PT_OP_SCALE;
    o.scale.x = x, o.scale.s = s, o.scale.count = count;
    pt_be_run(be, &o);
}

static inline void pt_be_softcap(pt_backend *be, float *x, float cap, size_t count) {
    pt_op o;
    memset(&o, 0, sizeof o);
    o.kind = PT_OP_SOFTCAP;
    o.scale.x = x, o.scale.s = cap, o.scale.count = count;
    pt_be_run(be, &o);
}

static inline void pt_be_moe_route(pt_backend *be, int32_t *ids, float *weights,
                                   const float *logits, int n, int n_experts, int k, bool renorm) {
    pt_op o;
    memset(&o, 0, sizeof o);
    o.kind = PT_OP_MOE_ROUTE;
    o.moe_route.ids = ids, o.moe_route.weights = weights, o.moe_route.logits = logits;
    o.moe_route.n = n, o.moe_route.n_experts = n_experts, o.moe_route.k = k;
    o.moe_route.renorm = renorm;
    pt_be_run(be, &o);
}

static inline void pt_be_matmul_id(pt_backend *be, float *y, const float *x, const pt_weight *w,
                                   const int32_t *ids, int n, int k, int x_slots) {
    pt_op o;
    memset(&o, 0, sizeof o);
    o.kind = PT_OP_MATMUL_ID;
    o.matmul_id.y = y, o.matmul_id.x = x, o.matmul_id.w = *w, o.matmul_id.ids = ids;
    o.matmul_id.n = n, o.matmul_id.k = k, o.matmul_id.x_slots = x_slots;
    pt_be_run(be, &o);
}

static inline void pt_be_moe_combine(pt_backend *be, float *y, const float *x,
                                     const float *weights, int n, int k, int d) {
    pt_op o;
    memset(&o, 0, sizeof o);
    o.kind = PT_OP_MOE_COMBINE;
    o.moe_combine.y = y, o.moe_combine.x = x, o.moe_combine.weights = weights;
    o.moe_combine.n = n, o.moe_combine.k = k, o.moe_combine.d = d;
    pt_be_run(be, &o);
}

/* The record is filled field by field (see "Op records"). */
static inline void pt_be_moe_ffn(pt_backend *be, const pt_op_moe_ffn *a) {
    pt_op o;
    memset(&o, 0, sizeof o);
    o.kind = PT_OP_MOE_FFN;
    pt_op_moe_ffn *r = &o.moe_ffn;
    r->y = a->y, r->x = a->x, r->logits = a->logits;
    r->w_gate = a->w_gate, r->w_up = a->w_up, r->w_down = a->w_down;
    r->gate_bias = a->gate_bias, r->up_bias = a->up_bias, r->down_bias = a->down_bias;
    r->ids = a->ids, r->weights = a->weights, r->gate = a->gate, r->up = a->up, r->out = a->out;
    r->n = a->n, r->n_experts = a->n_experts, r->k = a->k, r->act = a->act;
    r->alpha = a->alpha, r->limit = a->limit, r->renorm = a->renorm;
    pt_be_run(be, &o);
}

static inline void pt_be_swiglu_oai(pt_backend *be, float *y, const float *gate,
                                    const float *up, size_t count, float alpha, float limit) {
    pt_op o;
    memset(&o, 0, sizeof o);
    o.kind = PT_OP_SWIGLU_OAI;
    o.swiglu_oai.y = y, o.swiglu_oai.gate = gate, o.swiglu_oai.up = up;
    o.swiglu_oai.count = count, o.swiglu_oai.alpha = alpha, o.swiglu_oai.limit = limit;
    pt_be_run(be, &o);
}

static inline void pt_be_add_id(pt_backend *be, float *y, const float *bias, const int32_t *ids,
                                int n, int k, int d) {
    pt_op o;
    memset(&o, 0, sizeof o);
    o.kind = PT_OP_ADD_ID;
    o.add_id.y = y, o.add_id.bias = bias, o.add_id.ids = ids;
    o.add_id.n = n, o.add_id.k = k, o.add_id.d = d;
    pt_be_run(be, &o);
}

static inline void pt_be_gather_cols(pt_backend *be, float *dst, const float *src,
                                     const int32_t *idx, int n, int d_src, int d_dst) {
    pt_op o;
    memset(&o, 0, sizeof o);
    o.kind = PT_OP_GATHER_COLS;
    o.gather_cols.dst = dst, o.gather_cols.src = src, o.gather_cols.idx = idx;
    o.gather_cols.n = n, o.gather_cols.d_src = d_src, o.gather_cols.d_dst = d_dst;
    pt_be_run(be, &o);
}

static inline void pt_be_sigmoid_mul(pt_backend *be, float *y, const float *x, const float *g,
                                     int n, int d, int g_d) {
    pt_op o;
    memset(&o, 0, sizeof o);
    o.kind = PT_OP_SIGMOID_MUL;
    o.sigmoid_mul.y = y, o.sigmoid_mul.x = x, o.sigmoid_mul.g = g;
    o.sigmoid_mul.n = n, o.sigmoid_mul.d = d, o.sigmoid_mul.g_d = g_d;
    pt_be_run(be, &o);
}

static inline void pt_be_conv1d_silu(pt_backend *be, float *y, const float *x, const float *w,
                                     float *state, const pt_batch_view *b, int C, int K) {
    pt_op o;
    memset(&o, 0, sizeof o);
    o.kind = PT_OP_CONV1D_SILU;
    o.conv1d_silu.y = y, o.conv1d_silu.x = x, o.conv1d_silu.w = w, o.conv1d_silu.state = state;
    o.conv1d_silu.b = *b;
    o.conv1d_silu.C = C, o.conv1d_silu.K = K;
    pt_be_run(be, &o);
}

static inline void pt_be_gated_delta(pt_backend *be, const pt_op_gated_delta *a) {
    pt_op o;
    memset(&o, 0, sizeof o);
    o.kind = PT_OP_GATED_DELTA;
    pt_op_gated_delta *d = &o.gated_delta; /* field by field: the padding after tiled stays zero */
    d->out = a->out, d->qkv = a->qkv, d->ba = a->ba, d->A = a->A, d->dt_bias = a->dt_bias;
    d->state = a->state, d->b = a->b;
    d->n_k_heads = a->n_k_heads, d->n_v_heads = a->n_v_heads, d->dk = a->dk, d->dv = a->dv;
    d->stride = a->stride, d->chunk = a->chunk, d->tiled = a->tiled, d->l2_eps = a->l2_eps;
    pt_be_run(be, &o);
}

static inline void pt_be_rmsnorm_gated(pt_backend *be, float *y, const float *x, const float *z,
                                       const float *w, int n, int d, float eps) {
    pt_op o;
    memset(&o, 0, sizeof o);
    o.kind = PT_OP_RMSNORM_GATED;
    o.rmsnorm_gated.y = y, o.rmsnorm_gated.x = x, o.rmsnorm_gated.z = z, o.rmsnorm_gated.w = w;
    o.rmsnorm_gated.n = n, o.rmsnorm_gated.d = d, o.rmsnorm_gated.eps = eps;
    pt_be_run(be, &o);
}

static inline void pt_be_copy_cols(pt_backend *be, float *dst, int d_dst, int dst_off,
                                   const float *src, int d_src, int src_off, int width, int n) {
    pt_op o;
    memset(&o, 0, sizeof o);
    o.kind = PT_OP_COPY_COLS;
    pt_op_copy_cols *c = &o.copy_cols;
    c->dst = dst, c->src = src, c->n = n, c->d_src = d_src, c->d_dst = d_dst;
    c->src_off = src_off, c->dst_off = dst_off, c->width = width;
    pt_be_run(be, &o);
}

static inline void pt_be_moe_route_grouped(pt_backend *be, const pt_op_moe_route_grouped *a) {
    pt_op o;
    memset(&o, 0, sizeof o);
    o.kind = PT_OP_MOE_ROUTE_GROUPED;
    pt_op_moe_route_grouped *r = &o.moe_route_grouped;
    r->ids = a->ids, r->weights = a->weights, r->logits = a->logits, r->bias = a->bias;
    r->n = a->n, r->n_experts = a->n_experts, r->k = a->k, r->n_groups = a->n_groups;
    r->groups_used = a->groups_used, r->gating = a->gating, r->scale = a->scale;
    r->renorm = a->renorm;
    pt_be_run(be, &o);
}

static inline void pt_be_moe_local(pt_backend *be, int32_t *ids, float *weights, int n, int k,
                                   int first, int count) {
    pt_op o;
    memset(&o, 0, sizeof o);
    o.kind = PT_OP_MOE_LOCAL;
    o.moe_local.ids = ids, o.moe_local.weights = weights, o.moe_local.n = n;
    o.moe_local.k = k, o.moe_local.first = first, o.moe_local.count = count;
    pt_be_run(be, &o);
}

static inline void pt_be_argmax(pt_backend *be, int32_t *ids, const float *x, int n, int d) {
    pt_op o;
    memset(&o, 0, sizeof o);
    o.kind = PT_OP_ARGMAX;
    o.argmax.ids = ids, o.argmax.x = x, o.argmax.n = n, o.argmax.d = d;
    pt_be_run(be, &o);
}

/* Runs even after a failure: the other ranks wait for this rank's part,
 * and a rank that skipped it would leave them waiting for ever (its sum
 * is garbage then, and so is theirs; each forward reports its error). */
static inline void pt_be_all_reduce(pt_backend *be, struct pt_comm *comm, int rank, float *buf,
                                    size_t count) {
    pt_op o;
    memset(&o, 0, sizeof o);
    o.kind = PT_OP_ALL_REDUCE;
    o.all_reduce.buf = buf, o.all_reduce.comm = comm, o.all_reduce.count = count;
    o.all_reduce.rank = rank;
    be->ops->run(be, &o);
}

/* CPU backend.  n_threads <= 0 means one per online core.  kernels:
 * "auto" (the best this CPU supports), "avx2" or "portable". */
pt_backend *pt_backend_cpu_new(int n_threads, const char *kernels, pt_err *err);
/* CUDA backend on the given device ordinal (builds with PETREL_CUDA only). */
pt_backend *pt_backend_cuda_new(int device, pt_err *err);
/* By name: "cpu" (also for NULL) or "cuda". */
pt_backend *pt_backend_open(const char *device, int n_threads, const char *kernels, pt_err *err);
/* CUDA devices this process sees; 0 without a driver, a device or a build
 * with CUDA. */
int pt_backend_cuda_devices(void);
/* Whether a device name ("cpu", "cuda", "cuda:N") is a CUDA device. */
bool pt_backend_is_cuda(const char *device);

#endif
