/*
 * deepseek.c - DeepSeek-V2 / V3 (GGUF deepseek2; config.json deepseek_v2,
 * deepseek_v3): multi-head latent attention (MLA) and routed experts with
 * shared ones, the first n_dense_lead layers dense.
 *
 *     x = embed(tokens)
 *     per layer:  h = rmsnorm(x)
 *       q       = rmsnorm(h·Wq_aᵀ)·Wq_bᵀ  (or h·Wqᵀ)   per head [no-rope | rope]
 *       c, kr   = h·Wkv_aᵀ = [latent (kv_lora) | rope key (n_rot)]
 *       c       = rmsnorm(c);  q_rope, kr = rope(q_rope), rope(kr)
 *       per head i:  k_i = [c·W_kb,iᵀ | kr],  v_i = c·W_vb,iᵀ
 *       x += concat_i(attention(q_i, k_i, v_i))·Woᵀ
 *       h = rmsnorm(x)
 *       x += dense FFN(h)                      (layers < n_dense_lead)
 *          | experts(h) + shared_experts(h)    (DeepSeek routing)
 *     logits = rmsnorm(x)·Woutᵀ
 *
 * Latent attention runs absorbed (mla.c, shared with MiniCPM3): the cache
 * holds one row of kv_lora + n_rot floats per token and layer, for all
 * heads.
 *
 * Routing (moe_route_grouped): probabilities by softmax (V2) or sigmoid
 * (V3), a selection bias added for choosing only (V3's
 * e_score_correction_bias), top groups by the sum of their two best
 * scores when n_expert_groups > 1, weights renormalized if the file says
 * and times expert_scale (routed_scaling_factor).  The n shared experts
 * are stored as one FFN of n x expert_ffn_dim and added ungated.
 *
 * Loads: GGUF files in llama.cpp's MLA layout (attn_k_b / attn_v_b, written
 * since llama.cpp split attn_kv_b), older ones with the fused attn_kv_b
 * and Hugging Face checkpoints (kv_b_proj): the fused matrix is split into
 * the same stacks at load, as f32 (split_kv_b); dummy weights from a
 * config.json or a preset.
 * YaRN rope (V2-Lite's, V3's) follows llama.cpp's deepseek2 in GGUF files
 * and transformers' in config.json.
 */
#include <math.h>
#include <stdio.h>

#include "model/model_int.h"

/* clang-format off */
static const pt_arch deepseek_archs[] = {
    /* name           GGUF name    config.json    GGUF rope     qkv_bias qk_norm */
    {"deepseek_v3",   "deepseek2", "deepseek_v3", PT_ROPE_NORM, false,   false},
    {"deepseek_v2",   NULL,        "deepseek_v2", PT_ROPE_NORM, false,   false},
};
/* clang-format on */

/* ---- Config -------------------------------------------------------------- */

/* Shapes every reader must have produced. */
static int check_mla(const pt_model_config *c, const char *where, pt_err *err) {
    if (c->kv_lora_rank <= 0 || c->v_head_dim <= 0 || c->n_rot <= 0 || c->n_rot % 2 ||
        c->head_dim <= c->n_rot || c->q_lora_rank < 0 || c->kv_lora_rank > 1 << 14 ||
        c->v_head_dim > 1024)
        return pt_fail(err, "%s: latent attention shapes out of range (kv_lora_rank %d, "
                            "q_lora_rank %d, key head %d with %d rope dims, value head %d)",
                       where, c->kv_lora_rank, c->q_lora_rank, c->head_dim, c->n_rot,
                       c->v_head_dim);
    if (c->n_experts > 0 &&
        (c->n_dense_lead < 0 || c->n_dense_lead > c->n_layers ||
         (c->n_expert_groups > 1 &&
          (c->n_experts % c->n_expert_groups || c->n_group_used <= 0 ||
           c->n_group_used > c->n_expert_groups ||
           c->n_experts_used > c->n_group_used * (c->n_experts / c->n_expert_groups)))))
        return pt_fail(err, "%s: expert groups do not fit (%d experts in %d groups, %d used, "
                            "top %d, %d leading dense layers)",
                       where, c->n_experts, c->n_expert_groups, c->n_group_used,
                       c->n_experts_used, c->n_dense_lead);
    return 0;
}

/* The shared experts as one FFN, and the router's flags. */
static void set_shared(pt_model_config *c, int n_shared) {
    c->n_shared_experts = n_shared > 0 && c->n_experts > 0;
    c->shared_ffn_dim = c->n_shared_experts ? n_shared * c->expert_ffn_dim : 0;
    c->router_grouped = c->n_experts > 0;
    if (c->expert_scale <= 0) c->expert_scale = 1.0f;
}

/* YaRN's get_mscale, in llama.cpp's float arithmetic. */
static float yarn_mscale_f(float factor, float m) {
    return factor <= 1.0f ? 1.0f : 0.1f * m * logf(factor) + 1.0f;
}

/* YaRN as llama.cpp runs deepseek2 (llama-context.cpp and deepseek2.cpp):
 * the frequencies ramp between the corrections for beta_fast 32 and
 * beta_slow 1 (not read from files), rounded outwards; with
 * yarn_log_multiplier (the converter writes 0.1 x mscale_all_dim) cos and
 * sin are unscaled and the scores are scaled by mscale(factor,
 * mscale_all_dim)^2, without it both follow mscale(factor, 1).  Read
 * before the common keys, which then leave the scaling alone.  Returns the
 * score multiplier (1 without YaRN), or -1. */
static float read_yarn_gguf(const pt_gguf *g, const pt_model_file *mf, const char *garch,
                            pt_model_config *c, pt_err *err) {
    char key[128];
    pt_gguf_str st;
    snprintf(key, sizeof key, "%s.rope.scaling.type", garch);
    if (!pt_gguf_get_str(g, key, &st) || !(st.len == 4 && memcmp(st.s, "yarn", 4) == 0)) return 1;
    float attn = 1, log_mul = 0;
    if (pt_gguf_float(g, garch, "rope.scaling.attn_factor", &attn) && attn != 1.0f)
        return (float)pt_fail(err, "%s: YaRN with rope.scaling.attn_factor %g is not supported",
                              mf->path, (double)attn);
    if (!pt_gguf_float(g, garch, "rope.scaling.factor", &c->rope_factor) || !(c->rope_factor > 0))
        return (float)pt_fail(err, "%s: YaRN rope scaling without a factor", mf->path);
    if (!pt_gguf_int(g, garch, "rope.scaling.original_context_length", &c->rope_orig_ctx) &&
        !pt_gguf_int(g, garch, "context_length", &c->rope_orig_ctx))
        c->rope_orig_ctx = 4096;
    c->rope_scaling = PT_ROPE_SCALING_YARN;
    c->rope_beta_fast = 32, c->rope_beta_slow = 1;
    c->rope_yarn_truncate = true;
    float f = c->rope_factor, rope_m;
    if (pt_gguf_float(g, garch, "rope.scaling.yarn_log_multiplier", &log_mul))
        log_mul /= 0.1f;
    if (log_mul != 0.0f) /* llama.cpp takes mscale = mscale_all_dim for deepseek2: ratio 1 */
        rope_m = yarn_mscale_f(f, log_mul != 1.0f ? log_mul : 1.0f) / yarn_mscale_f(f, log_mul);
    else
        rope_m = yarn_mscale_f(f, 1.0f);
    c->rope_mscale = rope_m;
    float m = rope_m * (1.0f + 0.1f * log_mul * logf(f));
    return m * m;
}

/* llama.cpp's converter: attention.key_length_mla / value_length_mla are
 * the per-head sizes (key_length is the cached row, kv_lora + rope);
 * head_count_kv is 1.  Files without them keep the fused attn_kv_b. */
static int deepseek_read_gguf(const pt_gguf *g, const pt_model_file *mf, const char *garch,
                              pt_model_config *c, pt_err *err) {
    float score_mul = read_yarn_gguf(g, mf, garch, c, err);
    if (score_mul < 0 || pt_config_gguf_common(g, mf, garch, c, err)) return -1;
    if (!pt_gguf_int(g, garch, "attention.kv_lora_rank", &c->kv_lora_rank))
        return pt_fail(err, "%s: GGUF deepseek2 needs %s.attention.kv_lora_rank", mf->path, garch);
    if (!pt_gguf_int(g, garch, "attention.key_length_mla", &c->head_dim) ||
        !pt_gguf_int(g, garch, "attention.value_length_mla", &c->v_head_dim)) {
        /* written before llama.cpp split attn_kv_b: key_length is the head */
        c->kv_b_fused = true;
        if (!pt_gguf_int(g, garch, "attention.value_length", &c->v_head_dim))
            c->v_head_dim = c->head_dim - c->n_rot;
    }
    float temp = 0;
    if (pt_gguf_float(g, garch, "attention.temperature_scale", &temp) && temp != 0.0f)
        return pt_fail(err, "%s: deepseek2 with attention temperature scaling (%g, Mistral "
                            "Large 3) is not supported yet",
                       mf->path, (double)temp);
    int nextn = 0;
    if (pt_gguf_int(g, garch, "nextn_predict_layers", &nextn) && nextn > 0)
        c->n_layers -= nextn; /* multi-token-prediction blocks: not run */
    pt_gguf_int(g, garch, "attention.q_lora_rank", &c->q_lora_rank);
    if (!pt_model_file_tensor(mf, "blk.0.attn_q_a.weight")) c->q_lora_rank = 0; /* direct q (Lite) */
    c->n_kv_heads = 1;
    if (score_mul != 1.0f) c->attn_scale = score_mul / sqrtf((float)c->head_dim);
    pt_gguf_int(g, garch, "leading_dense_block_count", &c->n_dense_lead);
    int n_shared = 0, gating = 0;
    if (pt_gguf_int(g, garch, "expert_count", &c->n_experts) && c->n_experts > 0) {
        if (!pt_gguf_int(g, garch, "expert_used_count", &c->n_experts_used) ||
            !pt_gguf_int(g, garch, "expert_feed_forward_length", &c->expert_ffn_dim))
            return pt_fail(err, "%s: GGUF deepseek2 needs %s.expert_used_count and "
                                "expert_feed_forward_length",
                           mf->path, garch);
        pt_gguf_int(g, garch, "expert_shared_count", &n_shared);
        pt_gguf_float(g, garch, "expert_weights_scale", &c->expert_scale);
        char key[96];
        bool norm = false;
        snprintf(key, sizeof key, "%s.expert_weights_norm", garch);
        pt_gguf_get_bool(g, key, &norm);
        c->expert_renorm = norm;
        pt_gguf_int(g, garch, "expert_gating_func", &gating); /* absent: softmax (V2) */
        if (gating != 0 && gating != 1 && gating != 2)
            return pt_fail(err, "%s: expert_gating_func %d is not supported (1 softmax, 2 "
                                "sigmoid)",
                           mf->path, gating);
        c->expert_gating = gating == 2 ? PT_MOE_SIGMOID : PT_MOE_SOFTMAX;
        pt_gguf_int(g, garch, "expert_group_count", &c->n_expert_groups);
        pt_gguf_int(g, garch, "expert_group_used_count", &c->n_group_used);
        char name[64];
        snprintf(name, sizeof name, "blk.%d.exp_probs_b.bias", c->n_dense_lead);
        c->router_bias = pt_model_file_tensor(mf, name) != NULL;
    }
    set_shared(c, n_shared);
    return check_mla(c, mf->path, err);
}

/* YaRN's get_mscale (transformers' DeepSeek). */
static double yarn_mscale(double factor, double m) {
    return factor <= 1 ? 1.0 : 0.1 * m * log(factor) + 1.0;
}

/* transformers' DeepseekV2Config / DeepseekV3Config.  The rope key is
 * interleaved (rope_interleave, V3's default; V2 rotates complex pairs):
 * adjacent-pair rope.  With YaRN the scores are also scaled by
 * mscale(factor, mscale_all_dim)^2.  Routing keys absent (as transformers
 * 5 saves a V3 config): V3's sigmoid noaux_tc, V2's softmax. */
static int deepseek_read_json(json_t *j, pt_model_config *c, pt_err *err) {
    if (pt_config_json_common(j, c, err)) return -1;
    int nope = 0, rope = 0;
    if (!pt_json_int(j, "qk_nope_head_dim", &nope) || !pt_json_int(j, "qk_rope_head_dim", &rope) ||
        !pt_json_int(j, "v_head_dim", &c->v_head_dim) ||
        !pt_json_int(j, "kv_lora_rank", &c->kv_lora_rank))
        return pt_fail(err, "config.json: %s needs qk_nope_head_dim, qk_rope_head_dim, "
                            "v_head_dim and kv_lora_rank",
                       c->arch);
    if (!pt_json_int(j, "q_lora_rank", &c->q_lora_rank)) c->q_lora_rank = 0; /* null: direct */
    c->head_dim = nope + rope, c->n_rot = rope, c->n_kv_heads = 1;
    c->rope_style = json_is_false(json_object_get(j, "rope_interleave")) ? PT_ROPE_NEOX
                                                                         : PT_ROPE_NORM;
    if (c->rope_scaling == PT_ROPE_SCALING_YARN) {
        /* where pt_config_json_common read the YaRN settings: rope_scaling,
         * or transformers 5's rope_parameters */
        float ms_all = 0;
        json_t *rs = json_object_get(j, "rope_scaling");
        if (!json_is_object(rs)) rs = json_object_get(j, "rope_parameters");
        if (json_is_object(rs)) pt_json_float(rs, "mscale_all_dim", &ms_all);
        double m = ms_all != 0 ? yarn_mscale(c->rope_factor, ms_all) : 1.0;
        c->attn_scale = (float)(m * m / sqrt((double)c->head_dim));
    }
    int freq = 1, n_shared = 0;
    pt_json_int(j, "moe_layer_freq", &freq);
    if (freq != 1)
        return pt_fail(err, "config.json: %s with moe_layer_freq %d is not supported", c->arch,
                       freq);
    if (pt_json_int(j, "n_routed_experts", &c->n_experts) && c->n_experts > 0) {
        if (!pt_json_int(j, "num_experts_per_tok", &c->n_experts_used) ||
            !pt_json_int(j, "moe_intermediate_size", &c->expert_ffn_dim))
            return pt_fail(err, "config.json: %s needs num_experts_per_tok and "
                                "moe_intermediate_size",
                           c->arch);
        pt_json_int(j, "first_k_dense_replace", &c->n_dense_lead);
        pt_json_int(j, "n_shared_experts", &n_shared);
        pt_json_float(j, "routed_scaling_factor", &c->expert_scale);
        c->expert_renorm = json_is_true(json_object_get(j, "norm_topk_prob"));
        /* transformers' DeepseekV3 always routes by sigmoid with the
         * selection bias and groups (the Hub configs' noaux_tc), and
         * writes neither key; its DeepseekV2 by softmax */
        bool v3 = strcmp(c->arch, "deepseek_v3") == 0;
        const char *score = json_string_value(json_object_get(j, "scoring_func"));
        const char *method = json_string_value(json_object_get(j, "topk_method"));
        if (!score) score = v3 ? "sigmoid" : "softmax";
        if (!method && v3) method = "noaux_tc";
        c->expert_gating = score && strcmp(score, "sigmoid") == 0 ? PT_MOE_SIGMOID : PT_MOE_SOFTMAX;
        if (score && strcmp(score, "sigmoid") != 0 && strcmp(score, "softmax") != 0)
            return pt_fail(err, "config.json: scoring_func '%s' is not supported", score);
        pt_json_int(j, "n_group", &c->n_expert_groups);
        pt_json_int(j, "topk_group", &c->n_group_used);
        if (method && strcmp(method, "noaux_tc") == 0) {
            c->router_bias = true;
        } else if (c->n_expert_groups > 1 && c->n_group_used < c->n_expert_groups) {
            /* V2's group_limited_greedy scores a group by its best expert */
            return pt_fail(err, "config.json: topk_method '%s' with %d groups is not "
                                "implemented yet (noaux_tc, greedy)",
                           method ? method : "greedy", c->n_expert_groups);
        } else {
            c->n_expert_groups = c->n_group_used = 0;
        }
    }
    set_shared(c, n_shared);
    return check_mla(c, "config.json", err);
}

/* ---- Weights ------------------------------------------------------------- */

/* clang-format off */
#define L(f) offsetof(pt_layer, f)
#define M(f) offsetof(pt_model, f)
/* The Hugging Face names are transformers' except attention's k_b / v_b,
 * which checkpoints fuse as kv_b_proj (split_kv_b reads it). */
static const pt_weight_spec deepseek_weights[] = {
    {"token_embd.weight", "model.embed_tokens.weight", D_NONE, D_VOCAB, D_DIM, M(tok_embd), false, NEED_ALWAYS},
    {"output_norm.weight", "model.norm.weight", D_NONE, D_DIM, D_NONE, M(output_norm), false, NEED_ALWAYS},
    {"output.weight", "lm_head.weight", D_NONE, D_VOCAB, D_DIM, M(output), false, NEED_UNTIED},
    {"blk.%d.attn_norm.weight", "model.layers.%d.input_layernorm.weight", D_NONE, D_DIM, D_NONE, L(attn_norm), true, NEED_ALWAYS},
    {"blk.%d.attn_q_a.weight", "model.layers.%d.self_attn.q_a_proj.weight", D_NONE, D_QLORA, D_DIM, L(wq_a), true, NEED_Q_LORA},
    {"blk.%d.attn_q_a_norm.weight", "model.layers.%d.self_attn.q_a_layernorm.weight", D_NONE, D_QLORA, D_NONE, L(q_a_norm), true, NEED_Q_LORA},
    {"blk.%d.attn_q_b.weight", "model.layers.%d.self_attn.q_b_proj.weight", D_NONE, D_Q, D_QLORA, L(wq_b), true, NEED_Q_LORA},
    {"blk.%d.attn_q.weight", "model.layers.%d.self_attn.q_proj.weight", D_NONE, D_Q, D_DIM, L(wq), true, NEED_Q_DIRECT},
    {"blk.%d.attn_kv_a_mqa.weight", "model.layers.%d.self_attn.kv_a_proj_with_mqa.weight", D_NONE, D_KVA, D_DIM, L(wkv_a), true, NEED_ALWAYS},
    {"blk.%d.attn_kv_a_norm.weight", "model.layers.%d.self_attn.kv_a_layernorm.weight", D_NONE, D_KVLORA, D_NONE, L(kv_a_norm), true, NEED_ALWAYS},
    {"blk.%d.attn_k_b.weight", "model.layers.%d.self_attn.k_b_proj.weight", D_HEADS, D_KVLORA, D_NOPE, L(wk_b), true, NEED_KV_B_SPLIT},
    {"blk.%d.attn_v_b.weight", "model.layers.%d.self_attn.v_b_proj.weight", D_HEADS, D_VHEAD, D_KVLORA, L(wv_b), true, NEED_KV_B_SPLIT},
    {"blk.%d.attn_output.weight", "model.layers.%d.self_attn.o_proj.weight", D_NONE, D_DIM, D_OV, L(wo), true, NEED_ALWAYS},
    {"blk.%d.ffn_norm.weight", "model.layers.%d.post_attention_layernorm.weight", D_NONE, D_DIM, D_NONE, L(ffn_norm), true, NEED_ALWAYS},
    {"blk.%d.ffn_gate.weight", "model.layers.%d.mlp.gate_proj.weight", D_NONE, D_FFN, D_DIM, L(w_gate), true, NEED_DENSE},
    {"blk.%d.ffn_up.weight", "model.layers.%d.mlp.up_proj.weight", D_NONE, D_FFN, D_DIM, L(w_up), true, NEED_DENSE},
    {"blk.%d.ffn_down.weight", "model.layers.%d.mlp.down_proj.weight", D_NONE, D_DIM, D_FFN, L(w_down), true, NEED_DENSE},
    {"blk.%d.ffn_gate_inp.weight", "model.layers.%d.mlp.gate.weight", D_NONE, D_EXPERTS, D_DIM, L(w_router), true, NEED_MOE},
    {"blk.%d.exp_probs_b.bias", "model.layers.%d.mlp.gate.e_score_correction_bias", D_NONE, D_EXPERTS, D_NONE, L(exp_probs_b), true, NEED_ROUTER_BIAS},
    {"blk.%d.ffn_gate_exps.weight", "model.layers.%d.mlp.experts.%d.gate_proj.weight", D_EXPERTS, D_EFFN, D_DIM, L(w_gate), true, NEED_MOE},
    {"blk.%d.ffn_up_exps.weight", "model.layers.%d.mlp.experts.%d.up_proj.weight", D_EXPERTS, D_EFFN, D_DIM, L(w_up), true, NEED_MOE},
    {"blk.%d.ffn_down_exps.weight", "model.layers.%d.mlp.experts.%d.down_proj.weight", D_EXPERTS, D_DIM, D_EFFN, L(w_down), true, NEED_MOE},
    {"blk.%d.ffn_gate_shexp.weight", "model.layers.%d.mlp.shared_experts.gate_proj.weight", D_NONE, D_SFFN, D_DIM, L(w_sh_gate), true, NEED_MOE_SHARED},
    {"blk.%d.ffn_up_shexp.weight", "model.layers.%d.mlp.shared_experts.up_proj.weight", D_NONE, D_SFFN, D_DIM, L(w_sh_up), true, NEED_MOE_SHARED},
    {"blk.%d.ffn_down_shexp.weight", "model.layers.%d.mlp.shared_experts.down_proj.weight", D_NONE, D_DIM, D_SFFN, L(w_sh_down), true, NEED_MOE_SHARED},
};
#undef L
#undef M
/* clang-format on */

/* Hugging Face checkpoints store kv_b_proj fused, as older GGUFs do. */
static int deepseek_file_layout(pt_model *m, pt_err *err) {
    (void)err;
    if (m->file->kind != PT_FILE_GGUF) m->cfg.kv_b_fused = true;
    return 0;
}

static int deepseek_finish(pt_model *m, pt_err *err) {
    return pt_mla_split_kv_b(m, err);
}

/* ---- Workspace ------------------------------------------------------------- */

static int deepseek_workspace(pt_model *m, int cap, pt_err *err) {
    const pt_model_config *c = &m->cfg;
    pt_workspace *ws = m->ws;
    size_t n = (size_t)cap;
    if (pt_workspace_mla(m, cap, err)) return -1;
    struct {
        float **p;
        size_t floats;
    } bufs[] = {
        {&ws->shared, n * (size_t)c->dim},
        {&ws->sh_gate, n * (size_t)c->shared_ffn_dim},
        {&ws->sh_up, n * (size_t)c->shared_ffn_dim},
    };
    for (size_t i = 0; i < PT_ARRAY_LEN(bufs); i++)
        if (!(*bufs[i].p = pt_model_alloc(m, sizeof(float) * PT_MAX(bufs[i].floats, 1))))
            return pt_fail(err, "cannot allocate %.1f MiB of activations",
                           (double)bufs[i].floats * 4 / 1048576.0);
    return 0;
}

/* ---- Forward ------------------------------------------------------------- */

/* h -> h: the plan's FFN (dense, or routed experts) plus the shared
 * experts, ungated, in routed layers. */
static void ffn_with_shared(pt_model *m, int l, const pt_step *s) {
    pt_backend *be = m->be;
    const pt_model_config *c = &m->cfg;
    const pt_layer *L = &m->layers[l];
    pt_workspace *ws = m->ws;
    int n = s->n;

    if (m->plan[l].n_shared == 0) {
        pt_block_ffn(m, l, s);
        return;
    }
    pt_be_matmul(be, ws->sh_gate, ws->h, &L->w_sh_gate, n);
    pt_be_matmul(be, ws->sh_up, ws->h, &L->w_sh_up, n);
    pt_be_swiglu(be, ws->sh_gate, ws->sh_gate, ws->sh_up, (size_t)n * c->shared_ffn_dim);
    pt_be_matmul(be, ws->shared, ws->sh_gate, &L->w_sh_down, n);
    pt_block_ffn(m, l, s);
    pt_be_add(be, ws->h, ws->h, ws->shared, (size_t)n * c->dim);
}

static void deepseek_layer(pt_model *m, int l, const pt_step *s) {
    const pt_layer *L = &m->layers[l];
    pt_workspace *ws = m->ws;

    pt_block_norm(m, s, ws->h, ws->x, L->attn_norm);
    pt_block_mla_attention(m, l, s);
    pt_block_residual(m, s);

    pt_block_norm(m, s, ws->h, ws->x, L->ffn_norm);
    ffn_with_shared(m, l, s);
    pt_block_residual(m, s);
}

static void deepseek_forward(pt_model *m, const pt_step *s) {
    pt_block_stack(m, s, deepseek_layer);
}

const pt_family pt_family_deepseek = {
    .name = "deepseek",
    .archs = deepseek_archs,
    .n_archs = PT_ARRAY_LEN(deepseek_archs),
    .read_json = deepseek_read_json,
    .read_gguf = deepseek_read_gguf,
    .weights = deepseek_weights,
    .n_weights = PT_ARRAY_LEN(deepseek_weights),
    .moe = true,
    .mla = true,
    .file_layout = deepseek_file_layout,
    .finish = deepseek_finish,
    .workspace = deepseek_workspace,
    .forward = deepseek_forward,
};
