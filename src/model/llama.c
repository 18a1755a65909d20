/*
 * llama.c - the dense Llama family: Llama 2/3/3.1, Mistral, Qwen2/2.5 and
 * Qwen3.  Its architectures differ only in flags of its registry rows
 * (biases on q/k/v, RMSNorm on q and k, GGUF rope layout); everything else
 * is this file: the config keys it reads, its weights and its forward.
 *
 *     x = embed(tokens)
 *     per layer:  x += attention(rope(qkv(rmsnorm(x))))·Wo
 *                 x += ((silu(h·Wgate) * h·Wup)·Wdown)  with h = rmsnorm(x)
 *     logits = rmsnorm(x)·Woutᵀ for the rows that want them
 */
#include "model/model_int.h"

/* clang-format off */
static const pt_arch llama_archs[] = {
    /* name      GGUF name  config.json  GGUF rope     qkv_bias qk_norm */
    {"llama",   "llama",   "llama",     PT_ROPE_NORM, false,   false},
    {"mistral", NULL,      "mistral",   PT_ROPE_NORM, false,   false}, /* GGUF writes "llama" */
    {"qwen2",   "qwen2",   "qwen2",     PT_ROPE_NEOX, true,    false},
    {"qwen3",   "qwen3",   "qwen3",     PT_ROPE_NEOX, false,   true},
};
/* clang-format on */

/* ---- Config -------------------------------------------------------------- */

/* Which layers the window applies to: layer_types when the config has
 * them; else Qwen2/Qwen3's layers from max_window_layers on (as
 * transformers reads them); else every layer (Mistral). */
static int window_layers(json_t *j, pt_model_config *c, pt_err *err) {
    int given = pt_config_json_layer_types(j, c, err);
    if (given) return given < 0 ? -1 : 0;
    if (strcmp(c->arch, "qwen2") != 0 && strcmp(c->arch, "qwen3") != 0) return 0;
    int from = 28; /* Qwen2Config's default */
    pt_json_int(j, "max_window_layers", &from);
    c->swa_per_layer = true;
    for (int l = PT_MAX(from, 0); l < c->n_layers && l < 64 * 16; l++) pt_config_set_swa(c, l);
    return 0;
}

static int llama_read_json(json_t *j, pt_model_config *c, pt_err *err) {
    if (pt_config_json_common(j, c, err) || pt_config_json_act(j, c, err)) return -1;
    if (json_is_true(json_object_get(j, "attention_bias"))) c->qkv_bias = c->o_bias = true;
    /* Mistral v0.1 attends to a 4096-token window on every layer; Qwen2
     * configs carry a window but switch it off with use_sliding_window. */
    int window;
    if (pt_json_int(j, "sliding_window", &window) && window > 0 && window < c->max_ctx &&
        !json_is_false(json_object_get(j, "use_sliding_window"))) {
        c->sliding_window = window;
        if (window_layers(j, c, err)) return -1;
    }
    /* Mixtral-style experts under a Llama-family model_type. */
    if (pt_json_int(j, "num_local_experts", &c->n_experts) ||
        pt_json_int(j, "num_experts", &c->n_experts))
        pt_json_int(j, "num_experts_per_tok", &c->n_experts_used);
    c->expert_ffn_dim = c->n_experts ? c->ffn_dim : 0; /* refused at the plan, but shaped */
    return 0;
}

static int llama_read_gguf(const pt_gguf *g, const pt_model_file *mf, const char *garch,
                           pt_model_config *c, pt_err *err) {
    if (pt_config_gguf_common(g, mf, garch, c, err)) return -1;
    int window;
    if (pt_gguf_int(g, garch, "attention.sliding_window", &window) && window > 0 &&
        window < c->max_ctx)
        c->sliding_window = window;
    if (pt_gguf_int(g, garch, "expert_count", &c->n_experts)) /* Mixtral GGUFs are "llama" */
        pt_gguf_int(g, garch, "expert_used_count", &c->n_experts_used);
    c->expert_ffn_dim = c->n_experts ? c->ffn_dim : 0;
    return 0;
}

/* ---- Weights ------------------------------------------------------------- */

/* clang-format off */
#define L(f) offsetof(pt_layer, f)
static const pt_weight_spec llama_weights[] = {
    PT_W_TOKEN_IO,
    PT_W_ATTN,
    PT_W_ATTN_BIAS,
    PT_W_QK_NORM,
    {"blk.%d.ffn_norm.weight", "model.layers.%d.post_attention_layernorm.weight", D_NONE, D_DIM, D_NONE, L(ffn_norm), true, NEED_ALWAYS},
    {"blk.%d.ffn_gate.weight", "model.layers.%d.mlp.gate_proj.weight", D_NONE, D_FFN, D_DIM, L(w_gate), true, NEED_ALWAYS},
    {"blk.%d.ffn_up.weight", "model.layers.%d.mlp.up_proj.weight", D_NONE, D_FFN, D_DIM, L(w_up), true, NEED_ALWAYS},
    {"blk.%d.ffn_down.weight", "model.layers.%d.mlp.down_proj.weight", D_NONE, D_DIM, D_FFN, L(w_down), true, NEED_ALWAYS},
};
#undef L
/* clang-format on */

/* ---- Forward ------------------------------------------------------------- */

static void llama_forward(pt_model *m, const pt_step *s) {
    pt_block_stack(m, s, pt_block_prenorm_layer);
}

const pt_family pt_family_llama = {
    .name = "llama",
    .archs = llama_archs,
    .n_archs = PT_ARRAY_LEN(llama_archs),
    .read_json = llama_read_json,
    .read_gguf = llama_read_gguf,
    .weights = llama_weights,
    .n_weights = PT_ARRAY_LEN(llama_weights),
    .forward = llama_forward,
};
