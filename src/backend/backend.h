/*
 * backend.h - the op table that model code is written against.
 *
 * A backend owns memory (weights, activations, the KV pool) and runs ops on
 * it.  The CPU backend runs each op synchronously on its thread pool; the CUDA
 * backend enqueues ops on a stream.  Model code never looks inside a buffer:
 * it passes pointers it got from the same backend, so one forward pass serves
 * both.
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

/* A weight matrix W of shape [rows][cols] (rows = output features), in any
 * dtype whose blocks run along a row.  Used as y = x · Wᵀ. */
typedef struct pt_weight {
    pt_dtype dtype;
    int64_t rows, cols;
    const void *data; /* backend memory */
    size_t nbytes;
    /* PT_AFFINE only (MLX layout): data holds packed uint32 codes; each group
     * of group_size weights along a row has w = scale * q + bias, with scales
     * and biases [rows][cols / group_size] of scale_dtype (f16, bf16, f32). */
    int bits, group_size;
    const void *scales, *biases;
    pt_dtype scale_dtype;
    /* A stack of experts (MoE), 3-D [n_experts][rows][cols]: expert e's
     * matrix starts expert_stride bytes after expert e-1's (its scales and
     * biases likewise, rows * (cols / group_size) elements each); nbytes
     * counts them all.  0 for a plain matrix, the only kind matmul takes. */
    int n_experts;
    size_t expert_stride;
} pt_weight;

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
    int n_tokens;
    const int32_t *pos;         /* [n_tokens] position of each row */
    const int32_t *seq;         /* [n_tokens] sequence index of each row */
    const int32_t *block_table; /* [n_seqs][max_pages] page ids */
    int max_pages, n_seqs;
} pt_batch_view;

/* How attention_ext scores: scores are q·k · scale, then, with softcap > 0,
 * softcap · tanh(score / softcap) (Gemma 2); with window > 0 row t sees
 * only positions pos[t] - window + 1 .. pos[t] (sliding window). */
typedef struct pt_attn_params {
    float scale;
    int window;    /* 0: every position up to pos[t] */
    float softcap; /* 0: none */
} pt_attn_params;

typedef struct pt_backend pt_backend;

typedef struct pt_backend_ops {
    /* Memory.  alloc returns zeroed backend memory or NULL. */
    void *(*alloc)(pt_backend *be, size_t nbytes);
    void (*free)(pt_backend *be, void *p, size_t nbytes);
    void (*upload)(pt_backend *be, void *dst, const void *src, size_t nbytes);
    void (*download)(pt_backend *be, void *dst, const void *src, size_t nbytes);
    /* Backend memory to backend memory, in op order (KV page copies). */
    void (*copy)(pt_backend *be, void *dst, const void *src, size_t nbytes);
    void (*sync)(pt_backend *be);

    /* y[n][w.rows] = x[n][w.cols] · wᵀ.  y must not alias x. */
    void (*matmul)(pt_backend *be, float *y, const float *x, const pt_weight *w, int n);
    /* y[i] = row ids[i] of the table, converted to f32. */
    void (*embed)(pt_backend *be, float *y, const pt_weight *table, const int32_t *ids, int n);
    /* y[i] = x[i] / rms(x[i]) * g, rows of d; y may alias x. */
    void (*rmsnorm)(pt_backend *be, float *y, const float *x, const float *g, int n, int d, float eps);
    /* y = a + b over count floats; y may alias a or b. */
    void (*add)(pt_backend *be, float *y, const float *a, const float *b, size_t count);
    /* y[i][j] += bias[j] for n rows of d. */
    void (*add_bias)(pt_backend *be, float *y, const float *bias, int n, int d);
    /* y = silu(gate) * up over count floats; y may alias gate or up. */
    void (*swiglu)(pt_backend *be, float *y, const float *gate, const float *up, size_t count);
    /* Rotates x[n][n_heads][head_dim] in place at each row's position. */
    void (*rope)(pt_backend *be, float *x, const pt_batch_view *b, int n_heads, int head_dim,
                 const pt_rope *rope);
    /* Writes each row's k and v ([n][n_kv_heads][head_dim]) into the cache. */
    void (*kv_store)(pt_backend *be, const pt_kv_view *kv, const pt_batch_view *b, const float *k,
                     const float *v);
    /* Causal attention: row t's query heads q[t][n_heads][head_dim] attend to
     * positions 0..pos[t] of its sequence in the cache (grouped-query: head h
     * reads kv head h / (n_heads / n_kv_heads)).  out is [n][n_heads][head_dim]. */
    void (*attention)(pt_backend *be, float *out, const float *q, const pt_kv_view *kv,
                      const pt_batch_view *b, int n_heads, float scale);
    /* dst[i] = src[idx[i]] for rows of d floats (idx in backend memory). */
    void (*gather_rows)(pt_backend *be, float *dst, const float *src, const int32_t *idx, int n,
                        int d);

    /* Model-family ops (issue 16).  Optional: a backend leaves NULL those it
     * lacks, and the loader refuses a model whose plan needs one, naming it
     * (pt_model_check_ops in src/model), before any weight is read. */

    /* attention with a window and/or score soft-capping; plain KV caches
     * only (the model refuses quantized ones with these layers). */
    void (*attention_ext)(pt_backend *be, float *out, const float *q, const pt_kv_view *kv,
                          const pt_batch_view *b, int n_heads, const pt_attn_params *p);
    /* y = gelu_tanh(gate) * up over count floats (GeGLU); y may alias gate or up. */
    void (*geglu)(pt_backend *be, float *y, const float *gate, const float *up, size_t count);
    /* x *= s over count floats. */
    void (*scale)(pt_backend *be, float *x, float s, size_t count);
    /* x = cap * tanh(x / cap) over count floats (logit soft-capping). */
    void (*softcap)(pt_backend *be, float *x, float cap, size_t count);
    /* Mixture-of-experts routing: per row of logits[n][n_experts], softmax,
     * the k largest probabilities (ties: lower expert first) into ids[n][k]
     * and weights[n][k], renormalized to sum 1 when renorm is set. */
    void (*moe_route)(pt_backend *be, int32_t *ids, float *weights, const float *logits, int n,
                      int n_experts, int k, bool renorm);
    /* Matmul by expert id (ggml's mul_mat_id): for row t and slot j,
     * y[t][j] = x[t][x_slots > 1 ? j : 0] · W[ids[t][j]]ᵀ, with w a stack of
     * experts (n_experts > 0); x is [n][x_slots][w.cols], y [n][k][w.rows].
     * Reads only the experts some row selects, each once per call. */
    void (*matmul_id)(pt_backend *be, float *y, const float *x, const pt_weight *w,
                      const int32_t *ids, int n, int k, int x_slots);
    /* y[t] = sum over j of weights[t][j] * x[t][j], rows of d; y [n][d],
     * x [n][k][d].  y must not alias x. */
    void (*moe_combine)(pt_backend *be, float *y, const float *x, const float *weights, int n,
                        int k, int d);

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
    void (*destroy)(pt_backend *be);
} pt_backend_ops;

struct pt_backend {
    const pt_backend_ops *ops;
    const char *name;   /* "cpu", "cuda" */
    const char *detail; /* e.g. "avx2, 2 threads" */
    int n_threads;
    bool host_memory; /* backend memory is host memory: weights can stay mmap'd */
};

/* CPU backend.  n_threads <= 0 means one per online core.  kernels:
 * "auto" (the best this CPU supports), "avx2" or "portable". */
pt_backend *pt_backend_cpu_new(int n_threads, const char *kernels, pt_err *err);
/* CUDA backend on the given device ordinal (builds with PETREL_CUDA only). */
pt_backend *pt_backend_cuda_new(int device, pt_err *err);
/* By name: "cpu" (also for NULL) or "cuda". */
pt_backend *pt_backend_open(const char *device, int n_threads, const char *kernels, pt_err *err);

#endif
