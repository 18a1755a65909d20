/*
 * qwen3moe.c - Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B): Qwen3's
 * attention (RMSNorm on q and k per head) with every FFN a set of routed
 * experts.
 *
 *     x = embed(tokens)
 *     per layer:  x += attention(rope(qkv(rmsnorm(x))))·Wo
 *                 h = rmsnorm(x); p = softmax(h·Wrouterᵀ)
 *                 x += sum over the top-k experts e of p_e · FFN_e(h)
 *                      (p renormalized over the k when norm_topk_prob)
 *     logits = rmsnorm(x)·Woutᵀ
 *
 * Hub checkpoints store each expert's gate/up/down as its own tensor
 * (mlp.experts.<e>.gate_proj.weight); the loader gathers them into one
 * stack per layer (weights.c).  Dense layers among the sparse ones
 * (mlp_only_layers, decoder_sparse_step > 1) are refused: no released
 * Qwen3-MoE has them.  GGUF qwen3moe files (llama.cpp's layout: experts
 * stacked in ffn_*_exps, any block type) load too.
 */
#include "model/model_int.h"

/* clang-format off */
static const pt_arch qwen3moe_archs[] = {
    /* name        GGUF name  config.json   GGUF rope     qkv_bias qk_norm */
    {"qwen3_moe", "qwen3moe", "qwen3_moe",  PT_ROPE_NEOX, false,   true},
};
/* clang-format on */

/* Refuses layers that would be dense in a sparse model. */
static int check_all_sparse(json_t *j, pt_err *err) {
    int step = 1;
    json_t *dense = json_object_get(j, "mlp_only_layers");
    pt_json_int(j, "decoder_sparse_step", &step);
    if (step != 1 || json_array_size(dense) > 0)
        return pt_fail(err, "config.json: qwen3_moe with dense layers among the sparse ones "
                            "(decoder_sparse_step %d, %zu mlp_only_layers) is not implemented yet",
                       step, json_array_size(dense));
    return 0;
}

static int qwen3moe_read_json(json_t *j, pt_model_config *c, pt_err *err) {
    if (pt_config_json_common(j, c, err) || pt_config_json_act(j, c, err)) return -1;
    if (json_is_true(json_object_get(j, "attention_bias"))) c->qkv_bias = c->o_bias = true;
    if (json_is_true(json_object_get(j, "use_sliding_window")))
        return pt_fail(err, "config.json: qwen3_moe with use_sliding_window is not supported");
    /* transformers 5 writes num_local_experts; Hub configs num_experts */
    if (!pt_json_int(j, "num_experts", &c->n_experts) &&
        !pt_json_int(j, "num_local_experts", &c->n_experts))
        return pt_fail(err, "config.json: qwen3_moe without num_experts");
    if (!pt_json_int(j, "num_experts_per_tok", &c->n_experts_used) ||
        !pt_json_int(j, "moe_intermediate_size", &c->expert_ffn_dim))
        return pt_fail(err, "config.json: qwen3_moe needs num_experts_per_tok and "
                            "moe_intermediate_size");
    c->expert_renorm = json_is_true(json_object_get(j, "norm_topk_prob"));
    return check_all_sparse(j, err);
}

/* llama.cpp's converter writes the experts' count, top-k and size; it
 * always renormalizes the top-k weights for qwen3moe (every released
 * Qwen3-MoE sets norm_topk_prob), and newer files say so in
 * expert_weights_norm. */
static int qwen3moe_read_gguf(const pt_gguf *g, const pt_model_file *mf, const char *garch,
                              pt_model_config *c, pt_err *err) {
    if (pt_config_gguf_common(g, mf, garch, c, err)) return -1;
    if (!pt_gguf_int(g, garch, "expert_count", &c->n_experts) ||
        !pt_gguf_int(g, garch, "expert_used_count", &c->n_experts_used) ||
        !pt_gguf_int(g, garch, "expert_feed_forward_length", &c->expert_ffn_dim))
        return pt_fail(err, "%s: GGUF qwen3moe needs %s.expert_count, expert_used_count and "
                            "expert_feed_forward_length",
                       mf->path, garch);
    bool norm = true;
    char key[96];
    snprintf(key, sizeof key, "%s.expert_weights_norm", garch);
    pt_gguf_get_bool(g, key, &norm);
    c->expert_renorm = norm;
    return 0;
}

/* clang-format off */
#define L(f) offsetof(pt_layer, f)
static const pt_weight_spec qwen3moe_weights[] = {
    PT_W_TOKEN_IO,
    PT_W_ATTN,
    PT_W_ATTN_BIAS,
    PT_W_QK_NORM,
    {"blk.%d.ffn_norm.weight", "model.layers.%d.post_attention_layernorm.weight", D_NONE, D_DIM, D_NONE, L(ffn_norm), true, NEED_ALWAYS},
    {"blk.%d.ffn_gate_inp.weight", "model.layers.%d.mlp.gate.weight", D_NONE, D_EXPERTS, D_DIM, L(w_router), true, NEED_ALWAYS},
    {"blk.%d.ffn_gate_exps.weight", "model.layers.%d.mlp.experts.%d.gate_proj.weight", D_EXPERTS, D_EFFN, D_DIM, L(w_gate), true, NEED_ALWAYS},
    {"blk.%d.ffn_up_exps.weight", "model.layers.%d.mlp.experts.%d.up_proj.weight", D_EXPERTS, D_EFFN, D_DIM, L(w_up), true, NEED_ALWAYS},
    {"blk.%d.ffn_down_exps.weight", "model.layers.%d.mlp.experts.%d.down_proj.weight", D_EXPERTS, D_DIM, D_EFFN, L(w_down), true, NEED_ALWAYS},
};
#undef L
/* clang-format on */

/* The pre-norm layer; its FFN is the plan's PT_FFN_MOE (routed experts). */
static void qwen3moe_forward(pt_model *m, const pt_step *s) {
    pt_block_stack(m, s, pt_block_prenorm_layer);
}

const pt_family pt_family_qwen3moe = {
    .name = "qwen3moe",
    .archs = qwen3moe_archs,
    .n_archs = PT_ARRAY_LEN(qwen3moe_archs),
    .read_json = qwen3moe_read_json,
    .read_gguf = qwen3moe_read_gguf,
    .weights = qwen3moe_weights,
    .n_weights = PT_ARRAY_LEN(qwen3moe_weights),
    .moe = true,
    .forward = qwen3moe_forward,
};
