/*
 * model_int.h - what the files of src/model share and no other layer sees:
 * the family row, the weight spec, the workspace, the step, the blocks.
 *
 * Who owns what:
 *   registry.c  the table of families, file names -> family, common config
 *               readers (GGUF keys, config.json keys) and apply_arch();
 *   plan.c      config -> per-layer plan, and the kinds not implemented yet;
 *   load.c      loading (file, dummy), the owned allocations, the rope
 *               tables, the workspace, KV geometry;
 *   weights.c   the spec helpers and binding tensors from a file by name;
 *   dummy.c     random weights of the specs' shapes;
 *   forward.c   pt_model_forward: checks and uploads a batch, then runs
 *               the family's forward (it changes no sequence state);
 *   batch.c     reserve / forward / advance for direct callers;
 *   blocks.c    the shared blocks a family's forward is assembled from;
 *   llama.c     the Llama family (llama, mistral, qwen2, qwen3);
 *   qwen3moe.c  Qwen3-MoE (qwen3_moe);
 *   gemma.c     Gemma 2 and Gemma 3 text (gemma2, gemma3_text);
 *   gemma4.c    Gemma 4 text (gemma4: GGUF);
 *   gptoss.c    gpt-oss (gpt_oss);
 *   qwen3next.c Qwen3-Next (qwen3_next): Gated DeltaNet + gated attention;
 *   qwen35.c    Qwen3.5 (GGUF qwen35, qwen35moe): the same hybrid, its
 *               in-projections unfused;
 *   deepseek.c  DeepSeek-V2/V3 (deepseek2, deepseek_v3): latent attention;
 *   mla.c       the latent attention blocks deepseek.c and minicpm3.c share;
 *   minicpm3.c  MiniCPM3 (minicpm3): latent attention, dense, MiniCPM's scalings;
 *   cost.c      bytes and multiply-adds per token, by the plan (rooflines).
 */
#ifndef PETREL_MODEL_INT_H
#define PETREL_MODEL_INT_H

#include <jansson.h>

#include "io/gguf.h"
#include "model/model.h"

/* ---- Weight specs ------------------------------------------------------------ */

/* A dimension of a weight, in terms of the config. */
enum pt_dim {
    D_NONE, D_DIM, D_Q, D_KV, D_FFN, D_VOCAB, D_HEAD, D_EXPERTS, D_EFFN, D_HEADS,
    /* hybrid recurrent models */
    D_Q2,      /* 2 * n_heads * head_dim: queries and their output gates */
    D_SFFN,    /* the shared expert's intermediate size */
    D_ONE,     /* 1 (the shared expert's gate) */
    D_LQKVZ,   /* Gated DeltaNet's fused q, k, v, z projection */
    D_LBA,     /* its b and a (2 per value head) */
    D_LV,      /* value heads x value dim */
    D_LVHEADS, /* value heads */
    D_LVDIM,   /* value dim */
    D_LCONV,   /* conv channels x kernel */
    D_LQKV,    /* conv channels: Qwen3.5's unfused q, k, v projection */
    /* multi-head latent attention */
    D_QLORA,   /* q_lora_rank */
    D_KVLORA,  /* kv_lora_rank */
    D_KVA,     /* kv_lora_rank + n_rot: the latent and the rope key */
    D_NOPE,    /* head_dim - n_rot: a key head's part without rope */
    D_VHEAD,   /* v_head_dim */
    D_OV,      /* n_heads * v_head_dim: the attention output */
    /* Gemma 4 */
    D_PLE,     /* the per-layer input width */
    D_PLE_ALL, /* n_layers x that */
    D_ROT2,    /* half the full layers' rope dims */
    D_EFFN2,   /* an expert's gate and up rows together */
};
/* Which config setting makes a weight present.  NEED_ATTN / NEED_RECURRENT:
 * only in layers of that mixer (hybrid models); NEED_DENSE / NEED_MOE: the
 * layer's FFN is dense (no experts, or one of DeepSeek's n_dense_lead
 * first layers) or routed experts (one table for a family's both kinds). */
enum pt_need { NEED_ALWAYS, NEED_QKV_BIAS, NEED_O_BIAS, NEED_QK_NORM, NEED_UNTIED, NEED_ATTN,
               NEED_RECURRENT, NEED_SHARED, NEED_DENSE, NEED_MOE,
               /* DeepSeek: q through the bottleneck or direct; the routed
                * layers' selection bias and shared experts */
               NEED_Q_LORA, NEED_Q_DIRECT, NEED_ROUTER_BIAS, NEED_MOE_SHARED,
               NEED_KV_B_SPLIT, /* per-head k_b, v_b stored (not the fused kv_b) */
               /* Gemma 4: layers that keep their own K/V; those with a V
                * projection; per-layer inputs; rope frequency factors; a
                * weight a file may omit (bound when present, never dummy);
                * experts' gate and up stacks apart, or together (experts_fused) */
               NEED_OWN_KV, NEED_V, NEED_PLE, NEED_ROPE_FREQS, NEED_OPTIONAL, NEED_EXPS_SPLIT,
               NEED_EXPS_FUSED };

/* One weight of a family: its names (%d is the layer; hf NULL in a family
 * read from GGUF only), its shape and where
 * it lands.  A Hugging Face name with a second %d is one tensor per expert
 * (Hub MoE checkpoints), gathered into the stack at load.  experts = D_EXPERTS makes it a 3-D stack [n_experts][rows][cols]
 * stored as one tensor (a pt_weight with n_experts set); D_NONE is a matrix,
 * or a vector when cols is D_NONE (f32 in backend memory). */
typedef struct pt_weight_spec {
    const char *gguf, *hf;
    int experts, rows, cols; /* enum pt_dim */
    size_t off;              /* offset in pt_layer (per_layer) or pt_model */
    bool per_layer;
    int need; /* enum pt_need */
} pt_weight_spec;

/* Rows most families' tables share: token embedding, final norm and
 * output head; the attention block's norm and q/k/v/o projections; their
 * optional biases (Qwen2, gpt-oss); q/k norms (Qwen3, Gemma 3). */
/* clang-format off */
#define PT_W_TOKEN_IO \
    {"token_embd.weight", "model.embed_tokens.weight", D_NONE, D_VOCAB, D_DIM, offsetof(pt_model, tok_embd), false, NEED_ALWAYS}, \
    {"output_norm.weight", "model.norm.weight", D_NONE, D_DIM, D_NONE, offsetof(pt_model, output_norm), false, NEED_ALWAYS}, \
    {"output.weight", "lm_head.weight", D_NONE, D_VOCAB, D_DIM, offsetof(pt_model, output), false, NEED_UNTIED}
#define PT_W_ATTN \
    {"blk.%d.attn_norm.weight", "model.layers.%d.input_layernorm.weight", D_NONE, D_DIM, D_NONE, offsetof(pt_layer, attn_norm), true, NEED_ALWAYS}, \
    {"blk.%d.attn_q.weight", "model.layers.%d.self_attn.q_proj.weight", D_NONE, D_Q, D_DIM, offsetof(pt_layer, wq), true, NEED_ALWAYS}, \
    {"blk.%d.attn_k.weight", "model.layers.%d.self_attn.k_proj.weight", D_NONE, D_KV, D_DIM, offsetof(pt_layer, wk), true, NEED_ALWAYS}, \
    {"blk.%d.attn_v.weight", "model.layers.%d.self_attn.v_proj.weight", D_NONE, D_KV, D_DIM, offsetof(pt_layer, wv), true, NEED_ALWAYS}, \
    {"blk.%d.attn_output.weight", "model.layers.%d.self_attn.o_proj.weight", D_NONE, D_DIM, D_Q, offsetof(pt_layer, wo), true, NEED_ALWAYS}
#define PT_W_ATTN_BIAS \
    {"blk.%d.attn_q.bias", "model.layers.%d.self_attn.q_proj.bias", D_NONE, D_Q, D_NONE, offsetof(pt_layer, bq), true, NEED_QKV_BIAS}, \
    {"blk.%d.attn_k.bias", "model.layers.%d.self_attn.k_proj.bias", D_NONE, D_KV, D_NONE, offsetof(pt_layer, bk), true, NEED_QKV_BIAS}, \
    {"blk.%d.attn_v.bias", "model.layers.%d.self_attn.v_proj.bias", D_NONE, D_KV, D_NONE, offsetof(pt_layer, bv), true, NEED_QKV_BIAS}, \
    {"blk.%d.attn_output.bias", "model.layers.%d.self_attn.o_proj.bias", D_NONE, D_DIM, D_NONE, offsetof(pt_layer, bo), true, NEED_O_BIAS}
#define PT_W_QK_NORM \
    {"blk.%d.attn_q_norm.weight", "model.layers.%d.self_attn.q_norm.weight", D_NONE, D_HEAD, D_NONE, offsetof(pt_layer, q_norm), true, NEED_QK_NORM}, \
    {"blk.%d.attn_k_norm.weight", "model.layers.%d.self_attn.k_norm.weight", D_NONE, D_HEAD, D_NONE, offsetof(pt_layer, k_norm), true, NEED_QK_NORM}
/* clang-format on */

/* A dimension of layer layer's weight (shapes may differ by layer kind). */
int64_t pt_spec_dim(const pt_model_config *c, int dim, int layer);
bool pt_spec_needed(const pt_model_config *c, int need, int layer);
void pt_spec_name(const pt_weight_spec *s, bool gguf, int layer, char *buf, size_t cap);
/* Where spec s of layer lands in m (a pt_weight, or a const float *). */
void *pt_spec_target(pt_model *m, const pt_weight_spec *s, int layer);
/* Rows [first, first + rows) of each expert of stack w, as a stack sharing
 * w's bytes (rows are whole blocks in every format): the gate and up halves
 * of a fused gate_up stack. */
pt_weight pt_weight_expert_rows(const pt_weight *w, int64_t first, int64_t rows);

/* ---- Families ---------------------------------------------------------------- */

/* One architecture as files name it, and the flags it sets in the config
 * (apply_arch in registry.c). */
typedef struct pt_arch {
    const char *name;      /* cfg.arch */
    const char *gguf_arch; /* general.architecture; NULL: files write another's */
    const char *hf_type;   /* config.json model_type */
    int gguf_rope_style;   /* GGUF llama permutes q/k for adjacent-pair rope */
    bool qkv_bias, qk_norm;
} pt_arch;

/* The rows of one forward call, as a family's forward and the blocks see
 * them.  Activations live in the workspace (m->ws). */
typedef struct pt_step {
    pt_kv_cache *kv;
    const pt_batch_view *b; /* rows in backend memory */
    const pt_batch_view *bw; /* the same rows with the window group's block tables
                              * (= b's when the cache has one group) */
    int n;                  /* rows */
    int n_out;              /* rows whose logits are wanted (ws->out_idx) */
    float *logits;          /* host, [n_out][vocab_size] */
    int32_t *ids;           /* host, [n_out]: their argmax instead (NULL: logits) */
} pt_step;

/* A registry row: everything that differs between families. */
struct pt_family {
    const char *name;
    const pt_arch *archs;
    size_t n_archs;
    /* Fill c from a file's metadata: the common keys (pt_config_*_common)
     * and the family's own.  c->arch and the arch flags are already set. */
    int (*read_json)(json_t *j, pt_model_config *c, pt_err *err);
    int (*read_gguf)(const pt_gguf *g, const pt_model_file *mf, const char *garch,
                     pt_model_config *c, pt_err *err);
    const pt_weight_spec *weights;
    size_t n_weights;
    /* Weights a file holds in a layout that finish converts (gpt-oss's
     * fused experts), so they are not in weights: dummy models make them
     * from these specs instead.  NULL: none. */
    const pt_weight_spec *dummy_weights;
    size_t n_dummy_weights;
    bool moe; /* its forward runs PT_FFN_MOE layers (else the plan refuses them) */
    bool hybrid; /* its forward runs recurrent mixers and a shared expert */
    bool mla;    /* its forward runs latent attention and ungated shared experts */
    /* Before a file's weights are bound: adjusts the config to the file's
     * layout (DeepSeek: Hugging Face checkpoints fuse kv_b_proj); NULL:
     * nothing to do. */
    int (*file_layout)(pt_model *m, pt_err *err);
    /* Extra workspace its forward needs, after the shared one; NULL: none. */
    int (*workspace)(pt_model *m, int cap, pt_err *err);
    /* After the weights are in place (file or dummy); NULL: nothing to do.
     * Gemma turns its stored norm offsets w into gains 1 + w here. */
    int (*finish)(pt_model *m, pt_err *err);
    /* Embeds s's rows, runs every layer, writes the wanted logits. */
    void (*forward)(pt_model *m, const pt_step *s);
};

extern const pt_family pt_family_llama, pt_family_qwen3moe, pt_family_gemma, pt_family_gemma4,
    pt_family_gptoss, pt_family_qwen3next, pt_family_qwen35, pt_family_deepseek,
    pt_family_minicpm3;
/* The family of a config's architecture (cfg.arch), or NULL. */
const pt_family *pt_family_of(const char *arch);
/* Bytes the matrices of family f take for config c in format. */
int pt_family_dummy_bytes(const pt_family *f, const pt_model_config *c, const char *format,
                          size_t *out, pt_err *err);
extern const pt_family *const pt_families[];
extern const size_t pt_n_families;

/* Common config readers (registry.c). */
bool pt_json_int(json_t *o, const char *key, int *out);
bool pt_json_float(json_t *o, const char *key, float *out);
bool pt_gguf_int(const pt_gguf *g, const char *garch, const char *key, int *out);
bool pt_gguf_float(const pt_gguf *g, const char *garch, const char *key, float *out);
/* Shapes, norm epsilon, rope and tied embeddings as most families write them. */
int pt_config_json_common(json_t *j, pt_model_config *c, pt_err *err);
int pt_config_gguf_common(const pt_gguf *g, const pt_model_file *mf, const char *garch,
                          pt_model_config *c, pt_err *err);
/* rope_scaling (or a rope_parameters object) into c; none is fine. */
int pt_rope_scaling_json(json_t *rs, pt_model_config *c, pt_err *err);
/* Marks layer l as a sliding-window layer (and the config as per-layer). */
void pt_config_set_swa(pt_model_config *c, int l);
/* layer_types ("sliding_attention" / "full_attention" per layer) into the
 * config's per-layer window bits: 1 if present, 0 if absent, -1 bad. */
int pt_config_json_layer_types(json_t *j, pt_model_config *c, pt_err *err);
/* hidden_act / hidden_activation into c->act (silu, gelu_pytorch_tanh). */
int pt_config_json_act(json_t *j, pt_model_config *c, pt_err *err);

/* ---- Workspace ------------------------------------------------------------- */

/* Logits computed per output chunk: 64, so that a decode step of up to 64
 * sequences reads the output head (1 GB at f16 for a 128k vocabulary) once. */
#define PT_OUT_ROWS 64

/* Activation and batch buffers in backend memory, sized once at load for
 * max_batch rows, so a decode step allocates nothing. */
struct pt_workspace {
    int cap;
    float *x, *h, *q, *k, *v, *att, *gate, *up, *out_h, *logits;
    /* MoE only (NULL otherwise): router logits [cap][n_experts], the chosen
     * experts and their weights [cap][k], expert outputs [cap][k][dim];
     * gate and up then hold [cap][k][expert_ffn_dim] too. */
    float *router, *moe_w, *moe_out;
    int32_t *moe_ids;
    int32_t *tokens, *pos, *seq, *out_idx, *block_table;
    int32_t *out_ids; /* [PT_OUT_ROWS] an output chunk's argmax */
    size_t bt_cap; /* int32 entries in block_table */
    /* host staging */
    int32_t *h_block_table, *h_out_idx;
    /* Hybrid recurrent models only (family workspace hook; NULL otherwise):
     * each batch sequence's state slot (and host copies); a fused
     * projection's output, the pieces gather_cols splits it into, and the
     * column indices that do it; the shared expert's output and gate. */
    int32_t *state_slot, *h_state_slot, *h_state_next;
    size_t ss_cap;
    float *fused, *mix, *conv, *z, *ba, *lin, *agate, *shared, *shared_g, *sh_gate, *sh_up;
    int32_t *idx_q, *idx_gate, *idx_mix, *idx_z, *idx_ba;
    /* Multi-head latent attention only (pt_workspace_mla):
     * absorbed queries and the attention's output [cap][n_heads][kv_lora
     * + n_rot], the cached rows [cap][kv_lora + n_rot], per-head latents
     * [cap][n_heads][kv_lora], q's bottleneck, no-rope and rope parts, the
     * value heads, and ids 0..n_heads-1 per row for the per-head stacks */
    float *mla_q, *mla_att, *mla_kv, *mla_lat, *mla_qa, *mla_nope, *mla_pe, *mla_ov;
    int32_t *head_ids;
    /* Gemma 4 only (family workspace hook): every row's per-layer inputs
     * [cap][n_layers][ple], and the column indices 0..n_layers*ple that
     * gather_cols takes layer l's ple of them from (idx_ple + l * ple). */
    float *ple;
    int32_t *idx_ple;
};

/* The workspace for cap rows (load.c; a split model's ranks get theirs in tp.c). */
int pt_model_workspace_init(pt_model *m, int cap, pt_err *err);
/* Uploads rows [first, first + n) of b and the block tables into m's
 * workspace, fills the views (v[1]: the window group's) and counts the
 * rows whose logits are wanted (forward.c). */
int pt_model_upload_batch(pt_model *m, const pt_kv_cache *kv, const pt_batch *b, int first, int n,
                          pt_batch_view v[2], int *n_out, pt_err *err);

/* ---- Tensor parallel (tp.c) ---------------------------------------------------- */

typedef struct pt_tp pt_tp;
/* Splits loaded model m over n ranks on CPU backends of their own
 * (m->tp); -1 with the reason if its family or shapes do not split. */
int pt_model_split(pt_model *m, int n, const char *kernels, pt_err *err);
void pt_tp_free(pt_tp *tp);
/* The KV geometry of a split model: n x n_layers layers of its ranks' KV
 * heads (rank r's layer l is r * n_layers + l). */
void pt_tp_kv_config(const pt_model *m, pt_kv_config *kc);
/* pt_model_forward of a split model, after the batch checks. */
int pt_tp_forward(pt_model *m, pt_kv_cache *kv, const pt_batch *b, float *logits, pt_err *err);

/* Grows the block-table buffers to need entries (load.c). */
int pt_workspace_block_table(pt_model *m, size_t need, pt_err *err);

/* ---- Blocks (blocks.c) ------------------------------------------------------- *
 * Each works on the step's rows in the workspace: x is the residual stream,
 * h the input and output of a block, q/k/v/att the attention's buffers. */

void pt_block_embed(pt_model *m, const pt_step *s); /* x = embed(tokens) */
void pt_block_norm(pt_model *m, const pt_step *s, float *y, const float *x, const float *gain);
void pt_block_qkv(pt_model *m, int l, const pt_step *s);       /* h -> q, k, v (roped) */
void pt_block_attention(pt_model *m, int l, const pt_step *s); /* cache k, v; h = attn(q)·Wo */
void pt_block_ffn(pt_model *m, int l, const pt_step *s);       /* h -> gated FFN(h), dense or MoE */
void pt_block_residual(pt_model *m, const pt_step *s);         /* x += h */
/* x += scale · h, layer l's plan's residual_scale */
void pt_block_residual_scaled(pt_model *m, int l, const pt_step *s);
void pt_block_output(pt_model *m, const pt_step *s);           /* wanted rows: logits or picks */

/* One decoder layer of a family, and the forward every family's is: embed,
 * each layer in turn, output. */
typedef void (*pt_layer_fn)(pt_model *m, int l, const pt_step *s);
void pt_block_stack(pt_model *m, const pt_step *s, pt_layer_fn layer);
/* The pre-norm layer: x += attn(norm(x)), then x += ffn(norm(x)), the FFN
 * dense or mixture-of-experts as the plan says (Llama, Qwen, Qwen3-MoE). */
void pt_block_prenorm_layer(pt_model *m, int l, const pt_step *s);

/* Hybrid recurrent families (Qwen3-Next, Qwen3.5); workspace from
 * pt_workspace_hybrid. */
/* h -> h: attention whose q projection also gives a sigmoid output gate
 * per head (hd queries then hd gates), q/k RMSNorm, rope. */
void pt_block_gated_attention(pt_model *m, int l, const pt_step *s);
/* h -> h: a Gated DeltaNet layer after its in-projections, which left
 * each row's q, k, v (all q, all k, all v) in ws->mix, its output gate in
 * ws->z and its b then a per value head in ws->ba: the causal conv, the
 * gated delta rule (state in the cache's group 2), the gated norm, out. */
void pt_block_deltanet(pt_model *m, int l, const pt_step *s);
/* The hybrid layer: x += mixer(norm(x)), a Gated DeltaNet (lin_in: the
 * family's in-projections, then pt_block_deltanet) or gated attention as
 * the plan says; then x += ffn(norm(x)), routed experts plus a gated
 * shared expert when the plan has one, else pt_block_ffn. */
void pt_block_hybrid_layer(pt_model *m, int l, const pt_step *s, pt_layer_fn lin_in);
/* config.json of a Qwen3-Next-like hybrid (qwen3next.c), all but the FFN:
 * common shapes, SiLU, no attention bias, (1 + w) norms, the attention
 * output gate, partial rope, which layers are linear (layer_types or
 * full_attention_interval) and the Gated DeltaNet shapes. */
int pt_hybrid_read_json(json_t *j, pt_model_config *c, pt_err *err);
/* Every norm gain g of m (attention, FFN, Gemma's post-norms, q/k, output;
 * not the gated norm) becomes 1 + g: for files that store w of x̂·(1 + w)
 * (Gemma, Qwen3-Next and Qwen3.5 on the Hub; their GGUF files store 1 + w). */
int pt_norms_one_plus(pt_model *m, pt_err *err);
/* Each recurrent layer's ssm_a, bound from a file's A_log, becomes the
 * decay rate -exp(A_log) the delta rule takes (once, in f32: the same
 * floats the rule would compute per token). */
int pt_ssm_a_from_log(pt_model *m, pt_err *err);
int pt_workspace_hybrid(pt_model *m, int cap, pt_err *err);

/* Multi-head latent attention (mla.c: DeepSeek-V2/V3, MiniCPM3). */
/* h -> h: the absorbed latent attention; caches one row per token
 * [rmsnorm(latent) | rope key]. */
void pt_block_mla_attention(pt_model *m, int l, const pt_step *s);
/* Its workspace (ws->mla_*, head_ids) for cap rows. */
int pt_workspace_mla(pt_model *m, int cap, pt_err *err);
/* With cfg.kv_b_fused: each layer's fused kv_b (GGUF attn_kv_b, Hugging
 * Face kv_b_proj) split into the per-head stacks wk_b, wv_b, as f32. */
int pt_mla_split_kv_b(pt_model *m, pt_err *err);
/* Uploads n indices into a new model-owned buffer (NULL: out of memory). */
int32_t *pt_index_table(pt_model *m, const int32_t *host, int n);

#endif
