/*
 * model.h - a loaded model: its configuration, its per-layer plan, its
 * weights in backend memory, and one forward pass over a flattened batch.
 *
 * A model belongs to a family (one file each: llama.c is Llama 2/3/3.1,
 * Mistral, Qwen2/2.5 and Qwen3), which reads its config, names its weights
 * and assembles its forward from the shared blocks of blocks.c.  From the
 * config comes a plan of every layer (plan.c): which mixer, FFN, norm, rope
 * and cache group it uses.  registry.c maps file architecture names to
 * families; load.c loads (file or dummy weights) and owns the workspace;
 * weights.c binds tensors by name; dummy.c fills random weights; forward.c
 * runs a batch (batch.c adds page bookkeeping for direct callers).
 * Adding a family: docs/model.md.
 */
#ifndef PETREL_MODEL_H
#define PETREL_MODEL_H

#include "backend/backend.h"
#include "io/model_file.h"
#include "kv/kvcache.h"

enum pt_rope_scaling {
    PT_ROPE_SCALING_NONE,
    PT_ROPE_SCALING_LINEAR,
    PT_ROPE_SCALING_LLAMA3,
    PT_ROPE_SCALING_YARN,
    PT_ROPE_SCALING_LONGROPE, /* each pair's frequency divided by its rope_ext factor */
};

/* FFN activations (the gate's nonlinearity in act(x·Wgate) * x·Wup);
 * PT_ACT_SWIGLU_OAI is gpt-oss's clamped form, (clamp(up) + 1) ·
 * g·sigmoid(alpha·g) with g = min(gate, limit) (act_alpha, act_limit). */
enum pt_act { PT_ACT_SILU, PT_ACT_GELU_TANH, PT_ACT_SWIGLU_OAI };

typedef struct pt_family pt_family; /* model_int.h */

#define PT_ROPE_EXT_MAX 64 /* LongRoPE factors a config holds: rope dims up to 128 */

/* Plain data, no pointers: the engine hashes its bytes into cache keys
 * (a pointer would change the key with every process). */
typedef struct pt_model_config {
    char arch[32]; /* registry name: "llama", "mistral", "qwen2", "qwen3" */
    int dim, n_layers, n_heads, n_kv_heads, head_dim, ffn_dim, vocab_size;
    int max_ctx; /* trained context length */
    float norm_eps, rope_theta;
    int rope_style; /* enum pt_rope_style */
    int n_rot;      /* rotated dims per head */
    int rope_scaling; /* enum pt_rope_scaling */
    float rope_factor, rope_low_freq_factor, rope_high_freq_factor;
    int rope_orig_ctx;
    float rope_beta_fast, rope_beta_slow; /* YaRN's correction range, in rotations */
    float rope_mscale;      /* YaRN's (LongRoPE's) attention factor: multiplies cos and sin */
    bool rope_yarn_truncate; /* YaRN: the correction range rounded outwards */
    bool attn_sinks;        /* a learned logit per head in the softmax (gpt-oss) */
    bool expert_bias;       /* experts' gate, up and down and the router have biases */
    float act_alpha, act_limit; /* PT_ACT_SWIGLU_OAI */
    bool qkv_bias, o_bias, qk_norm, tied_embeddings;
    int act;            /* enum pt_act of the gated FFN */
    int sliding_window; /* tokens each query sees; 0: all (full attention) */
    int n_experts, n_experts_used, n_shared_experts; /* 0 experts: dense FFN */
    int expert_ffn_dim; /* rows of each expert's gate and up (moe_intermediate_size) */
    bool expert_renorm; /* top-k routing weights renormalized to sum 1 (norm_topk_prob) */
    int norm;           /* enum pt_norm_kind of every RMSNorm */
    float attn_scale;   /* attention score scale; 0: 1 / sqrt(head_dim) */
    float attn_softcap, final_softcap; /* tanh soft-capping of scores, logits; 0: none */
    float embed_scale;  /* embeddings are multiplied by it (Gemma: sqrt(dim)); 0: 1 */
    float rope_theta_swa; /* rope base of sliding-window layers; 0: rope_theta */
    bool rope_scaling_global_only; /* rope_scaling applies to full-attention layers only */
    bool swa_per_layer;   /* swa_layers says which layers have the window; else all */
    uint64_t swa_layers[16]; /* bit l % 64 of word l / 64: layer l has the window */
    /* Hybrid recurrent models (Qwen3-Next, Qwen3.5): layers with their bit
     * set in recurrent_layers are Gated DeltaNet layers, of these shapes;
     * lin_tiled and lin_l2_eps as pt_op_gated_delta's tiled and l2_eps
     * (llama.cpp's qwen35 GGUF layout and l2norm). */
    uint64_t recurrent_layers[16];
    int lin_k_heads, lin_v_heads, lin_k_dim, lin_v_dim, lin_conv_kernel;
    bool lin_tiled;
    float lin_l2_eps;
    int shared_ffn_dim;    /* the shared expert's intermediate size (n_shared_experts 1) */
    bool attn_output_gate; /* q_proj also gives a gate per head: out *= sigmoid(gate) */
    /* Multi-head latent attention (DeepSeek-V2/V3), on when kv_lora_rank >
     * 0: queries through a rank-q_lora_rank bottleneck (0: projected
     * directly), keys and values from a shared kv_lora_rank latent plus one
     * rope key of n_rot dims.  head_dim is a query/key head (no-rope part
     * + n_rot), v_head_dim a value head; the cache holds latent + rope key. */
    int q_lora_rank, kv_lora_rank, v_head_dim;
    bool kv_b_fused;      /* the file has attn_kv_b: split into k_b, v_b at load */
    int n_dense_lead;     /* the first n layers have a dense FFN (ffn_dim) */
    /* DeepSeek routing (moe_route_grouped) instead of softmax top-k:
     * gating enum pt_moe_gating, a selection bias per expert, groups,
     * weights times expert_scale.  The shared experts are one FFN of
     * shared_ffn_dim, ungated. */
    bool router_grouped, router_bias;
    int expert_gating, n_expert_groups, n_group_used;
    float expert_scale;
    /* Gemma 4: sliding layers' own shapes (0: as the full layers'); the
     * per-layer input width (0: none); layers n_kv_layers.. keep no K/V and
     * read the last earlier layer's of their kind (0: every layer keeps
     * its own); layers with their bit in v_from_k have no V projection
     * (V is K's projection); V normalized per head without a gain; full
     * layers' rope frequencies divided by a rope_freqs tensor, or (from a
     * config.json's proportional rope) only their first rope_rot_pairs
     * pairs rotating: load builds the factors (1, then 1e30). */
    int head_dim_swa, n_kv_heads_swa, n_rot_swa;
    int ple_dim;
    int n_kv_layers;
    uint64_t v_from_k[16];
    bool v_norm, rope_freq_factors;
    int rope_rot_pairs;
    uint64_t experts_fused[16]; /* layers whose experts' gate and up are one stack */
    /* Layers with their bit in ffn_alt have FFNs ffn_dim_alt wide (Gemma 4's
     * double-wide MLP in its shared-KV layers); 0: every layer ffn_dim. */
    int ffn_dim_alt;
    uint64_t ffn_alt[16];
    /* LongRoPE (MiniCPM3, Phi-3): the factors chosen at load, short or long
     * (registry.c: llama.cpp's choice), one per rotated pair; each pair's
     * frequency is divided by its factor (PT_ROPE_SCALING_LONGROPE). */
    float rope_ext[PT_ROPE_EXT_MAX];
    int rope_n_ext;
    /* MiniCPM: each layer's branches join the residual times residual_scale
     * (scale_depth / sqrt(n_layers)), and the final norm's output is
     * multiplied by output_scale (dim_model_base / hidden_size) before the
     * output head; 0: 1. */
    float residual_scale, output_scale;
} pt_model_config;

static inline bool pt_config_layer_recurrent(const pt_model_config *c, int l) {
    return c->recurrent_layers[l / 64] >> (l % 64) & 1;
}

/* Whether layer l of c attends through the sliding window. */
static inline bool pt_config_layer_swa(const pt_model_config *c, int l) {
    if (c->sliding_window <= 0) return false;
    return !c->swa_per_layer || (c->swa_layers[l / 64] >> (l % 64) & 1);
}

/* Layer l's attention shapes: a sliding layer's may differ (Gemma 4). */
static inline int pt_config_layer_head_dim(const pt_model_config *c, int l) {
    return pt_config_layer_swa(c, l) && c->head_dim_swa > 0 ? c->head_dim_swa : c->head_dim;
}
static inline int pt_config_layer_kv_heads(const pt_model_config *c, int l) {
    return pt_config_layer_swa(c, l) && c->n_kv_heads_swa > 0 ? c->n_kv_heads_swa : c->n_kv_heads;
}
static inline int pt_config_layer_n_rot(const pt_model_config *c, int l) {
    return pt_config_layer_swa(c, l) && c->n_rot_swa > 0 ? c->n_rot_swa : c->n_rot;
}
/* Layer l's FFN width. */
static inline int pt_config_layer_ffn(const pt_model_config *c, int l) {
    return c->ffn_dim_alt > 0 && (c->ffn_alt[l / 64] >> (l % 64) & 1) ? c->ffn_dim_alt : c->ffn_dim;
}
/* Whether layer l computes and keeps its own K/V (else it reads an earlier
 * layer's: Gemma 4's shared KV layers). */
static inline bool pt_config_layer_own_kv(const pt_model_config *c, int l) {
    return c->n_kv_layers <= 0 || l < c->n_kv_layers;
}

/* What one layer is made of, computed from the config (pt_model_plan).
 * The forward of a family reads it instead of flags; kinds that no block
 * implements yet are declared here and refused at load. */
enum pt_mixer { PT_MIX_ATTN, PT_MIX_ATTN_SWA, PT_MIX_RECURRENT, PT_MIX_MLA };
enum pt_ffn_kind { PT_FFN_DENSE, PT_FFN_MOE };
enum pt_norm_kind {
    PT_NORM_RMS,     /* x / rms(x) * w */
    PT_NORM_RMS_1PW, /* x / rms(x) * (1 + w): Gemma */
};

typedef struct pt_layer_plan {
    int mixer;         /* enum pt_mixer */
    int window;        /* PT_MIX_ATTN_SWA: positions a query sees */
    float rope_theta;  /* base of this layer's rope frequencies */
    bool rope_scaled;  /* the config's rope_scaling applies to this layer */
    float attn_scale;  /* score scale (1 / sqrt(head_dim) unless the config says) */
    float attn_softcap; /* > 0: scores soft-capped (Gemma 2) */
    bool attn_sinks;   /* a sink logit per head (pt_layer.sinks) */
    pt_rope rope;      /* style, n_rot; inv_freq filled at load (backend memory) */
    int ffn;           /* enum pt_ffn_kind */
    int act;           /* enum pt_act */
    int n_experts, top_k, n_shared; /* PT_FFN_MOE */
    int norm;          /* enum pt_norm_kind */
    float residual_scale; /* x += scale * block(x) */
    int cache_group;   /* which KV cache group holds this layer's state */
    int head_dim, n_kv_heads; /* this layer's attention shapes (n_heads is the config's) */
    int kv_layer;      /* the layer whose K/V it attends over: itself, or an earlier one
                        * it shares (it then stores none) */
    bool rope_factors; /* its rope frequencies are divided by m->rope_freqs */
    int ffn_dim;       /* its dense FFN's width */
} pt_layer_plan;

typedef struct pt_layer {
    const float *attn_norm, *ffn_norm; /* [dim] */
    const float *post_attn_norm, *post_ffn_norm; /* [dim], Gemma's norms after each block */
    const float *q_norm, *k_norm;      /* [head_dim], qk_norm only */
    const float *bq, *bk, *bv, *bo;    /* biases, NULL if absent */
    pt_weight wq, wk, wv, wo, w_gate, w_up, w_down; /* MoE: gate/up/down are expert stacks */
    pt_weight w_router; /* MoE: [n_experts][dim] */
    const float *sinks; /* [n_heads] attention sinks (gpt-oss), or NULL */
    const float *b_router; /* [n_experts], expert_bias only */
    const float *b_gate_exps, *b_up_exps; /* [n_experts][expert_ffn_dim] */
    const float *b_down_exps;             /* [n_experts][dim] */
    /* the shared expert beside the routed ones, and its gate [1][dim] */
    pt_weight w_sh_gate, w_sh_up, w_sh_down, w_sh_router;
    /* Gated DeltaNet (recurrent layers): the in-projections (Qwen3-Next:
     * fused qkvz and ba; Qwen3.5: qkv, z, b and a, b and a then joined
     * into w_ba at load), the output projection, the conv [conv channels]
     * [kernel], the decay rate ssm_a = -exp(A_log) (a file with A_log has
     * it turned at load) and dt_bias [value heads], the gated norm's gain
     * [value dim] */
    pt_weight w_qkvz, w_ba, w_lin_out, w_lin_qkv, w_lin_z, w_beta, w_alpha;
    const float *conv_w, *ssm_a, *dt_bias, *lin_norm;
    /* Multi-head latent attention: q's down and up projections (or wq),
     * the latent + rope key projection, per-head stacks [n_heads] of the
     * latent's key (k_b [kv_lora][no-rope dims]) and value (v_b
     * [v_head_dim][kv_lora]) up-projections, the two bottleneck norms;
     * DeepSeek routing's selection bias [n_experts] */
    pt_weight wq_a, wq_b, wkv_a, wk_b, wv_b;
    const float *q_a_norm, *kv_a_norm, *exp_probs_b;
    /* Gemma 4: V's norm (a gain of ones: the norm has none); the per-layer
     * input's gate [ple][dim] and projection [dim][ple], its norm [dim];
     * the layer's output scale ([1]; 0 in out_scale_h: none) */
    const float *v_norm;
    pt_weight w_ple_gate, w_ple_proj;
    const float *ple_post_norm, *out_scale;
    float out_scale_h;
    /* Gemma 4 mixture-of-experts layers (a dense MLP, w_sh_*, beside the
     * experts): the experts' pre-norm, the MLP's and the experts' post-
     * norms; the router's input gain (the file's scale, divided by
     * sqrt(dim) at load); gate and up of the experts as one stack (w_gate
     * and w_up are then views of it); each expert's output scale [n_experts]
     * (or NULL) and the same as a stack of 1 x 1 matrices for matmul_id */
    const float *ffn_norm_2, *post_ffn_norm_1, *post_ffn_norm_2, *router_gain, *exps_scale;
    pt_weight w_gate_up, w_exps_scale;
} pt_layer;

/* Per-token and per-sequence arrays of one forward call, host side. */
typedef struct pt_batch {
    int n_tokens;
    int32_t *tokens; /* [n_tokens] */
    int32_t *pos;    /* [n_tokens] */
    int32_t *seq;    /* [n_tokens] index into seqs */
    bool *logits;    /* [n_tokens] whether this row's logits are wanted */
    int n_seqs;
    pt_kv_seq **seqs;
    /* Non-NULL (only where pt_model_can_argmax): each wanted row's greedy
     * pick, the argmax of its logits as the sampler takes it, in row order,
     * instead of its logits (which pt_model_forward then leaves alone; it
     * may be given NULL).  A decode step of 64 rows then brings back 256
     * bytes instead of 64 rows of logits (33 MB at a 128k vocabulary). */
    int32_t *argmax;
} pt_batch;

typedef struct pt_model_opts {
    pt_backend *backend;  /* required */
    int max_batch;        /* rows per forward call; default 512 */
    const char *dummy_dtype; /* dummy weights: "bf16", "f16", "f32", "q4_0", "affine4"... */
    uint64_t dummy_seed;
    /* Tensor parallel (docs/tensor-parallel.md): > 1 splits the model over
     * that many ranks, each on a CPU backend of its own (kernels as named,
     * threads the backend's divided among them); 0 or 1: one model.  A
     * host-memory backend only: the GPU side is pt_model_attach_comm. */
    int tensor_parallel;
    const char *kernels;
} pt_model_opts;

typedef struct pt_workspace pt_workspace;

typedef struct pt_model {
    pt_model_config cfg;
    const pt_family *family; /* the code that runs it (registry.c) */
    pt_backend *be;
    pt_model_file *file; /* NULL for dummy weights */
    pt_weight tok_embd, output;
    const float *output_norm;
    /* Gemma 4's per-layer inputs: token table [vocab][n_layers * ple], the
     * projection from the embeddings [n_layers * ple][dim], its norm [ple];
     * and full layers' rope frequency divisors [n_rot / 2] (NULL: none) */
    pt_weight ple_embd, ple_model_proj;
    const float *ple_proj_norm, *rope_freqs;
    pt_layer *layers;
    pt_layer_plan *plan; /* [n_layers] */
    size_t weight_bytes; /* bytes of all weights */
    int max_batch;
    pt_workspace *ws;
    void *owned; /* backend allocations to free (list) */
    /* Tensor parallel (model/tp.c).  A rank of a split model: its weights
     * are its shard, and its blocks sum their row-parallel outputs over
     * comm (all_reduce); its output rows are the vocabulary [vocab_first,
     * vocab_first + output.rows).  The model callers hold (the front) has
     * tp set instead, and runs each forward as its ranks.  comm NULL and
     * tp NULL: an ordinary model, today's forward op for op. */
    struct pt_comm *comm;
    int rank, n_ranks, vocab_first;
    /* Expert parallel (a rank of a split MoE model): its expert stacks are
     * the routing's experts [expert_first, expert_first + expert_count);
     * 0: it holds every expert (or a slice of each). */
    int expert_first, expert_count;
    bool comm_owned;  /* comm is freed with the model (pt_model_attach_comm) */
    bool keep_layout; /* weights stay in the file's layout (no repacking): a front
                       * model's are sliced into ranks */
    struct pt_tp *tp;
    struct pt_progress *progress; /* while weights are bound or made, else NULL */
} pt_model;

/* Makes m rank `rank` of communicator c (its blocks then all_reduce
 * their row-parallel outputs), with every weight whole: a group of one,
 * so that one GPU runs the tensor-parallel path (an NCCL communicator of
 * one rank).  owned: c is freed with m. */
void pt_model_attach_comm(pt_model *m, struct pt_comm *c, int rank, bool owned);
/* Ranks of m's tensor-parallel group (1: unsplit). */
int pt_model_tp_ranks(const pt_model *m);

/* Loads a GGUF file, a Hugging Face directory, or (dummy weights) a
 * config.json / preset name prefixed "dummy:" e.g. "dummy:llama-1b". */
int pt_model_load(pt_model **out, const char *path, const pt_model_opts *opts, pt_err *err);
void pt_model_free(pt_model *m);

/* Runs the batch: stores each row's K/V in the cache and writes the logits
 * of rows with batch->logits set, in row order, to logits (host memory,
 * [n_wanted][vocab_size]).  The forward reads the sequences' block tables
 * and changes no sequence state: the caller owns pages and positions (the
 * engine's runner; for direct use, pt_batch_reserve before and
 * pt_batch_advance after).  -1 with err set if a check fails or the
 * backend failed (its sticky error, taken here: the batch's K/V and logits
 * are then garbage and the backend is ready for the next batch). */
int pt_model_forward(pt_model *m, pt_kv_cache *kv, const pt_batch *batch, float *logits,
                     pt_err *err);

/* Whether pt_model_forward takes pt_batch.argmax: the backend runs argmax
 * and the model's output head is its whole vocabulary (not a split
 * model's slice). */
bool pt_model_can_argmax(const pt_model *m);

/* For callers that drive the forward directly: reserve the pages every row
 * writes (copying shared ones), and afterwards count the rows as computed. */
int pt_batch_reserve(pt_kv_cache *kv, const pt_batch *b, pt_err *err);
void pt_batch_advance(const pt_batch *b);
/* The three in one: reserve, forward, advance. */
int pt_model_run(pt_model *m, pt_kv_cache *kv, const pt_batch *b, float *logits, pt_err *err);

/* A KV cache shaped for this model with room for n_positions positions:
 * elements of dtype, or rows of the codec quant asks for (NULL or kind
 * PT_KVQ_NONE: plain). */
int pt_model_kv_init(const pt_model *m, pt_kv_cache *kv, int n_positions, pt_dtype dtype,
                     const pt_kvq_spec *quant, pt_err *err);
/* The same for at most max_seqs sequences at once: a model with
 * sliding-window and full layers gets a window group (kvcache.h) whose pool
 * holds max_seqs windows instead of n_positions (0: n_positions, nothing
 * saved but pages still recycled), each with slack positions more for
 * rollbacks across steps (window_slack). */
int pt_model_kv_init_seqs(const pt_model *m, pt_kv_cache *kv, int n_positions, int max_seqs,
                          int slack, pt_dtype dtype, const pt_kvq_spec *quant, pt_err *err);
/* Recurrent-state slots pt_model_kv_init gives a hybrid model's cache (at
 * most one per page): the sequences that can run at once. */
#define PT_MODEL_STATE_SLOTS 16
/* Whether some layer of m keeps recurrent state (a hybrid model): such a
 * model cannot roll back a sequence or reuse a cached prefix. */
bool pt_model_recurrent(const pt_model *m);

/* The plan of every layer of c into plan[c->n_layers] (rope inv_freq left
 * NULL: the loader uploads it).  Fails, naming the layer, when a layer needs
 * a kind no block implements yet ("sliding-window attention ... not
 * implemented yet"). */
int pt_model_plan(const pt_model_config *c, pt_layer_plan *plan, pt_err *err);
/* The check half of pt_model_plan, for plans built by hand. */
int pt_layer_plan_check(const pt_layer_plan *plan, int n_layers, pt_err *err);

/* Registry: fills cfg from the file's metadata (architecture, shapes,
 * rope); errors name the missing key or the unsupported architecture. */
int pt_config_from_file(const pt_model_file *mf, pt_model_config *cfg, pt_err *err);
int pt_config_from_json(json_t *config, pt_model_config *cfg, pt_err *err);
/* Built-in shapes for dummy weights ("llama-8b", "qwen3-30b-a3b",
 * "gpt-oss-20b", ...): the config.json text of name, or NULL. */
const char *pt_config_preset(const char *name);
/* Every preset's name, comma-separated, into buf. */
void pt_config_preset_names(char *buf, size_t cap);
/* One line describing the model ("llama 64d x 5 layers, ..."). */
void pt_config_describe(const pt_model_config *cfg, char *buf, size_t cap);
/* rope inverse frequencies [n_rot/2] for base theta, cfg's scaling applied. */
void pt_rope_inv_freq(const pt_model_config *cfg, float theta, float *out);
/* Bytes one decode step at depth reads (active experts only, at most a
 * window of KV in sliding-window layers; kv_bytes_per_token over all
 * layers), and multiply-adds x 2 per token (cost.c). */
double pt_model_step_bytes(const pt_model *m, int depth, size_t kv_bytes_per_token);
double pt_model_token_flops(const pt_model *m);
/* Bytes of KV one sequence keeps resident at n_ctx positions, pages of
 * page_size: full-attention layers every page so far, sliding-window
 * layers (their own cache group) only the pages their window still sees. */
double pt_model_kv_resident(const pt_model *m, int n_ctx, size_t kv_bytes_per_token, int page_size);
/* Refuses, naming the op, a model whose plan needs an op the backend lacks
 * (CUDA has no expert matmul yet, say).  Called at load before weights. */
int pt_model_check_ops(const pt_model *m, pt_err *err);

/* Weights (weights.c: by name from a file; dummy.c: random). */
int pt_model_bind_file_weights(pt_model *m, pt_err *err);
/* Dummy weights in a format named as pt_weight_format_parse takes them: f32,
 * f16, bf16, q8_0, q4_0, q4_k, q5_k, q6_k, affineB or affineBgG. */
int pt_model_make_dummy_weights(pt_model *m, const char *format, uint64_t seed, pt_err *err);
/* Bytes the matrices of cfg take in that format. */
int pt_model_dummy_bytes(const pt_model_config *cfg, const char *format, size_t *out, pt_err *err);
/* The Hugging Face name of a GGUF weight name ("blk.3.attn_q.weight" ->
 * "model.layers.3.self_attn.q_proj.weight"); -1 if it is not one we bind. */
int pt_weight_hf_name(const char *gguf_name, char *out, size_t cap);
/* The weight matrix of m called name (either spelling), or NULL.  Lets a
 * tool swap one matrix (convert's sensitivity sweep). */
pt_weight *pt_model_weight_named(pt_model *m, const char *name);
/* Backend buffer owned by the model (freed with it).  NULL on failure. */
void *pt_model_alloc(pt_model *m, size_t nbytes);
/* Gives the plain matrix w the layout its backend runs fastest
 * (pt_backend_ops.weight_layout): on a host-memory backend a repacked copy
 * in memory the model owns, or, with owned (w's buffer is the model's own,
 * not the file's mapping), repacked in place; on a device (CUDA) the
 * backend rearranges its copy in place (pt_be_repack_weight). */
int pt_model_repack_weight(pt_model *m, pt_weight *w, bool owned, pt_err *err);

/* An MLX affine matrix of the model's file (t: <module>.weight, sc: its
 * .scales; .biases found by name), checked against rows x cols and
 * described in *w with pointers into the file's mapping, for code that
 * reads it on the host before or instead of binding it (mla.c's
 * kv_b split). */
int pt_model_file_affine(pt_model *m, const pt_tensor_info *t,
                         const pt_tensor_info *sc, int64_t rows, int64_t cols,
                         pt_weight *w, pt_err *err);
void pt_model_free_owned(pt_model *m);

#endif
