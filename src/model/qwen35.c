/*
 * qwen35.c - Qwen3.5 (GGUF qwen35, dense FFN) and Qwen3.5-MoE (GGUF
 * qwen35moe, routed experts plus a gated shared expert): the Qwen3-Next
 * hybrid of Gated DeltaNet and gated full-attention layers, from GGUF files
 * in llama.cpp's layout (and dense Qwen3.5 from Hugging Face, below).
 *
 *     x = embed(tokens)
 *     per layer:  h = rmsnorm(x)
 *       linear:   qkv, z, b, a = h·Wqkvᵀ, h·Wgateᵀ, h·Wbetaᵀ, h·Walphaᵀ
 *                 then as Qwen3-Next (pt_block_deltanet): conv, delta rule,
 *                 gated norm, out
 *       full:     gated attention as Qwen3-Next (pt_block_gated_attention)
 *       x += h;   h = rmsnorm(x);  x += ffn(h)    (dense, or experts + shared)
 *     logits = rmsnorm(x)·Woutᵀ
 *
 * What differs from Qwen3-Next, and where it is handled:
 *   - the in-projections are not fused: q, k, v come out in the conv's
 *     channel order (all q, all k, all v), so no split table; b and a are
 *     two matrices, joined into one [b; a] at load (finish) so one matmul
 *     gives the delta rule its ba rows;
 *   - value head h reads key head h % n_k_heads (the converter reorders
 *     the value heads to ggml's broadcast), and l2norm is ggml's
 *     x / max(|x|, eps): cfg.lin_tiled, cfg.lin_l2_eps;
 *   - the file stores the decay rate ssm_a = -exp(A_log) itself, and the
 *     norms' gains as 1 + w already (plain RMSNorm);
 *   - rope is interleaved M-RoPE over rope.dimension_count dims; text
 *     tokens have one position in its first three sections, so it is
 *     NEOX rope on those dims, provided no rotary pair falls to the fourth
 *     section (whose position is 0 for text): such files are refused;
 *   - the FFN is dense (qwen35) or experts with a shared one (qwen35moe).
 * Hugging Face qwen3_5_text checkpoints (Qwen3_5ForCausalLM, dense) load
 * too: transformers' names, value heads grouped (h / (n_v / n_k)), FLA's
 * l2norm, w of (1 + w) norms and A_log, turned at load.
 * Hugging Face qwen3_5_moe_text (Qwen3_5MoeForCausalLM) too: experts one
 * tensor each or in transformers' fused gate_up / down stacks (gate_up
 * split into gate and up views at finish).
 * Not read: the multi-token-prediction blocks (nextn: left out of the
 * layers, as llama.cpp's main pass leaves them), fused gate_up expert
 * stacks in GGUF files, attention.recurrent_layers arrays
 * (full_attention_interval only) and the vision-language wrappers
 * (qwen3_5, qwen3_5_moe: model.language_model.*).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model_int.h"

/* clang-format off */
static const pt_arch qwen35_archs[] = {
    /* name         GGUF name    config.json     GGUF rope     qkv_bias qk_norm */
    {"qwen35",      "qwen35",    "qwen3_5_text", PT_ROPE_NEOX, false,   true},
    {"qwen35moe",   "qwen35moe", "qwen3_5_moe_text", PT_ROPE_NEOX, false, true},
};
/* clang-format on */

/* ---- Config -------------------------------------------------------------------- */

/* The Gated DeltaNet shapes: ssm.group_count key heads and
 * ssm.time_step_rank value heads, of ssm.state_size dims each. */
static int read_linear(const pt_gguf *g, const pt_model_file *mf, const char *garch,
                       pt_model_config *c, pt_err *err) {
    int inner, state;
    if (!pt_gguf_int(g, garch, "ssm.conv_kernel", &c->lin_conv_kernel) ||
        !pt_gguf_int(g, garch, "ssm.inner_size", &inner) ||
        !pt_gguf_int(g, garch, "ssm.state_size", &state) ||
        !pt_gguf_int(g, garch, "ssm.time_step_rank", &c->lin_v_heads) ||
        !pt_gguf_int(g, garch, "ssm.group_count", &c->lin_k_heads))
        return pt_fail(err, "%s: %s needs ssm.conv_kernel, ssm.inner_size, ssm.state_size, "
                            "ssm.time_step_rank and ssm.group_count",
                       mf->path, garch);
    c->lin_k_dim = c->lin_v_dim = state;
    if (c->lin_conv_kernel < 1 || c->lin_conv_kernel > 64 || state < 1 || state > 4096 ||
        c->lin_k_heads < 1 || c->lin_v_heads < 1 || c->lin_v_heads > 4096 ||
        c->lin_v_heads % c->lin_k_heads || (int64_t)c->lin_v_heads * state != inner)
        return pt_fail(err, "%s: Gated DeltaNet shapes do not fit (conv %d, inner %d, state %d, "
                            "%d value heads over %d key heads)",
                       mf->path, c->lin_conv_kernel, inner, state, c->lin_v_heads, c->lin_k_heads);
    c->lin_tiled = true;
    c->lin_l2_eps = c->norm_eps;
    return 0;
}

/* Every full_attention_interval-th layer is full attention (default 4),
 * as llama.cpp reads it when the file has no recurrent_layers array. */
static int read_layer_kinds(const pt_gguf *g, const pt_model_file *mf, const char *garch,
                            pt_model_config *c, pt_err *err) {
    char key[96];
    int type;
    uint64_t count;
    snprintf(key, sizeof key, "%s.attention.recurrent_layers", garch);
    if (pt_gguf_get_arr(g, key, &type, &count))
        return pt_fail(err, "%s: %s (an explicit layer list) is not supported yet", mf->path, key);
    int every = 4;
    pt_gguf_int(g, garch, "full_attention_interval", &every);
    if (every < 1 || c->n_layers > 64 * 16)
        return pt_fail(err, "%s: full_attention_interval %d for %d layers", mf->path, every,
                       c->n_layers);
    for (int l = 0; l < c->n_layers; l++)
        if ((l + 1) % every) c->recurrent_layers[l / 64] |= (uint64_t)1 << (l % 64);
    return 0;
}

/* Which position rotary pair i takes in ggml's interleaved M-RoPE: 0-2 the
 * text position (t, h, w sections), 3 the extra section's. */
static int imrope_section(const int sect[4], int i) {
    int sector = i % (sect[0] + sect[1] + sect[2] + sect[3]);
    if (sector % 3 == 1 && sector < 3 * sect[1]) return 1;
    if (sector % 3 == 2 && sector < 3 * sect[2]) return 2;
    if (sector % 3 == 0 && sector < 3 * sect[0]) return 0;
    return 3;
}

/* rope.dimension_sections: every rotary pair must take the text position. */
static int read_rope_sections(const pt_gguf *g, const pt_model_file *mf, const char *garch,
                              pt_model_config *c, pt_err *err) {
    char key[96];
    int type, sect[4] = {0};
    uint64_t count;
    snprintf(key, sizeof key, "%s.rope.dimension_sections", garch);
    if (!pt_gguf_get_arr(g, key, &type, &count)) return 0; /* plain rope */
    for (uint64_t i = 0; i < count && i < 4; i++) {
        int64_t v;
        if (!pt_gguf_arr_int(g, key, i, &v) || v < 0 || v > 4096)
            return pt_fail(err, "%s: %s[%d] is not a small count", mf->path, key, (int)i);
        sect[i] = (int)v;
    }
    if (sect[0] + sect[1] + sect[2] + sect[3] <= 0)
        return pt_fail(err, "%s: %s are all zero", mf->path, key);
    for (int i = 0; i < c->n_rot / 2; i++)
        if (imrope_section(sect, i) == 3)
            return pt_fail(err, "%s: %s [%d, %d, %d, %d] put rotary pair %d on the extra "
                                "section's position, which is not supported",
                           mf->path, key, sect[0], sect[1], sect[2], sect[3], i);
    return 0;
}

/* Routed experts (softmax, top k renormalized, as llama.cpp runs
 * qwen35moe) and one gated shared expert. */
static int read_experts(const pt_gguf *g, const pt_model_file *mf, const char *garch,
                        pt_model_config *c, pt_err *err) {
    if (!pt_gguf_int(g, garch, "expert_count", &c->n_experts) || c->n_experts == 0) {
        if (strcmp(garch, "qwen35moe") == 0)
            return pt_fail(err, "%s: qwen35moe needs expert_count", mf->path);
        c->n_experts = 0;
        return 0;
    }
    if (!pt_gguf_int(g, garch, "expert_used_count", &c->n_experts_used) ||
        !pt_gguf_int(g, garch, "expert_feed_forward_length", &c->expert_ffn_dim))
        return pt_fail(err, "%s: %s needs expert_used_count and expert_feed_forward_length",
                       mf->path, garch);
    c->expert_renorm = true;
    float scale = 1;
    int func = 1;
    pt_gguf_float(g, garch, "expert_weights_scale", &scale);
    pt_gguf_int(g, garch, "expert_gating_func", &func);
    if ((scale != 0 && scale != 1) || func != 1)
        return pt_fail(err, "%s: expert weights scaled by %g or gated by function %d (only "
                            "softmax, unscaled, is supported)",
                       mf->path, (double)scale, func);
    if (pt_gguf_int(g, garch, "expert_shared_feed_forward_length", &c->shared_ffn_dim) &&
        c->shared_ffn_dim > 0)
        c->n_shared_experts = 1;
    if (!pt_model_file_tensor(mf, "blk.0.ffn_gate_exps.weight"))
        return pt_fail(err, "%s: no blk.0.ffn_gate_exps.weight (fused gate_up expert stacks "
                            "are not supported yet)",
                       mf->path);
    return 0;
}

static int qwen35_read_gguf(const pt_gguf *g, const pt_model_file *mf, const char *garch,
                            pt_model_config *c, pt_err *err) {
    if (pt_config_gguf_common(g, mf, garch, c, err)) return -1;
    /* block_count also counts the multi-token-prediction blocks after the
     * trunk (llama.cpp's n_layer_all); they are not run here */
    int nextn = 0;
    if (pt_gguf_int(g, garch, "nextn_predict_layers", &nextn) && nextn != 0) {
        if (nextn < 0 || nextn >= c->n_layers)
            return pt_fail(err, "%s: %d prediction layers of %d blocks", mf->path, nextn,
                           c->n_layers);
        c->n_layers -= nextn;
    }
    c->norm = PT_NORM_RMS; /* the converter stored 1 + w */
    c->act = PT_ACT_SILU;
    c->attn_output_gate = true;
    if (read_linear(g, mf, garch, c, err) || read_layer_kinds(g, mf, garch, c, err) ||
        read_rope_sections(g, mf, garch, c, err))
        return -1;
    return read_experts(g, mf, garch, c, err);
}

/* transformers' qwen3_5_moe_text (Qwen3_5MoeForCausalLM): the same, every
 * layer's FFN routed experts (softmax, top k, always renormalized: the
 * config has no norm_topk_prob) plus a sigmoid-gated shared expert.  Its
 * config has no intermediate_size (no dense FFN); the common reader wants
 * one, so a copy of the config gets the experts' width. */
static int qwen35moe_read_json(json_t *j, pt_model_config *c, pt_err *err) {
    json_t *jc = json_copy(j);
    if (!jc) return pt_fail(err, "out of memory reading config.json");
    json_t *mi = json_object_get(j, "moe_intermediate_size");
    if (!json_object_get(j, "intermediate_size") && json_is_integer(mi))
        json_object_set(jc, "intermediate_size", mi);
    int rc = pt_hybrid_read_json(jc, c, err);
    json_decref(jc);
    if (rc) return -1;
    if (!pt_json_int(j, "num_experts", &c->n_experts) &&
        !pt_json_int(j, "num_local_experts", &c->n_experts))
        c->n_experts = 0;
    if (c->n_experts < 1 || !pt_json_int(j, "num_experts_per_tok", &c->n_experts_used) ||
        c->n_experts_used < 1 || c->n_experts_used > c->n_experts ||
        !pt_json_int(j, "moe_intermediate_size", &c->expert_ffn_dim) || c->expert_ffn_dim < 1 ||
        !pt_json_int(j, "shared_expert_intermediate_size", &c->shared_ffn_dim) ||
        c->shared_ffn_dim < 1)
        return pt_fail(err, "config.json: qwen3_5_moe_text needs num_experts, "
                            "num_experts_per_tok (at most num_experts), moe_intermediate_size "
                            "and shared_expert_intermediate_size");
    c->expert_renorm = true;
    c->n_shared_experts = 1;
    return 0;
}

/* transformers' qwen3_5_text (Qwen3_5ForCausalLM): Qwen3-Next's config
 * with a dense FFN; value heads grouped over key heads, FLA's l2norm, w of
 * (1 + w) norms and A_log stored (finish turns them).  mrope_section is
 * not read: a text token has one position in every section. */
static int qwen35_read_json(json_t *j, pt_model_config *c, pt_err *err) {
    if (strcmp(c->arch, "qwen35moe") == 0) return qwen35moe_read_json(j, c, err);
    if (pt_hybrid_read_json(j, c, err)) return -1;
    if (json_is_integer(json_object_get(j, "num_experts")))
        return pt_fail(err, "config.json: qwen3_5_text with num_experts (a Qwen3.5-MoE "
                            "checkpoint says model_type qwen3_5_moe_text)");
    return 0;
}

/* ---- Weights ------------------------------------------------------------------ */

/* clang-format off */
#define L(f) offsetof(pt_layer, f)
#define M(f) offsetof(pt_model, f)
#define SA "model.layers.%d.self_attn."
#define LA "model.layers.%d.linear_attn."
#define MLP "model.layers.%d.mlp."
/* Hugging Face names: Qwen3_5ForCausalLM's and Qwen3_5MoeForCausalLM's */
static const pt_weight_spec qwen35_weights[] = {
    {"token_embd.weight", "model.embed_tokens.weight", D_NONE, D_VOCAB, D_DIM, M(tok_embd), false, NEED_ALWAYS},
    {"output_norm.weight", "model.norm.weight", D_NONE, D_DIM, D_NONE, M(output_norm), false, NEED_ALWAYS},
    {"output.weight", "lm_head.weight", D_NONE, D_VOCAB, D_DIM, M(output), false, NEED_UNTIED},
    {"blk.%d.attn_norm.weight", "model.layers.%d.input_layernorm.weight", D_NONE, D_DIM, D_NONE, L(attn_norm), true, NEED_ALWAYS},
    {"blk.%d.post_attention_norm.weight", "model.layers.%d.post_attention_layernorm.weight", D_NONE, D_DIM, D_NONE, L(ffn_norm), true, NEED_ALWAYS},
    /* gated full attention */
    {"blk.%d.attn_q.weight", SA "q_proj.weight", D_NONE, D_Q2, D_DIM, L(wq), true, NEED_ATTN},
    {"blk.%d.attn_k.weight", SA "k_proj.weight", D_NONE, D_KV, D_DIM, L(wk), true, NEED_ATTN},
    {"blk.%d.attn_v.weight", SA "v_proj.weight", D_NONE, D_KV, D_DIM, L(wv), true, NEED_ATTN},
    {"blk.%d.attn_output.weight", SA "o_proj.weight", D_NONE, D_DIM, D_Q, L(wo), true, NEED_ATTN},
    {"blk.%d.attn_q_norm.weight", SA "q_norm.weight", D_NONE, D_HEAD, D_NONE, L(q_norm), true, NEED_ATTN},
    {"blk.%d.attn_k_norm.weight", SA "k_norm.weight", D_NONE, D_HEAD, D_NONE, L(k_norm), true, NEED_ATTN},
    /* Gated DeltaNet */
    {"blk.%d.attn_qkv.weight", LA "in_proj_qkv.weight", D_NONE, D_LQKV, D_DIM, L(w_lin_qkv), true, NEED_RECURRENT},
    {"blk.%d.attn_gate.weight", LA "in_proj_z.weight", D_NONE, D_LV, D_DIM, L(w_lin_z), true, NEED_RECURRENT},
    {"blk.%d.ssm_beta.weight", LA "in_proj_b.weight", D_NONE, D_LVHEADS, D_DIM, L(w_beta), true, NEED_RECURRENT},
    {"blk.%d.ssm_alpha.weight", LA "in_proj_a.weight", D_NONE, D_LVHEADS, D_DIM, L(w_alpha), true, NEED_RECURRENT},
    {"blk.%d.ssm_conv1d.weight", LA "conv1d.weight", D_NONE, D_LCONV, D_NONE, L(conv_w), true, NEED_RECURRENT},
    {"blk.%d.ssm_dt.bias", LA "dt_bias", D_NONE, D_LVHEADS, D_NONE, L(dt_bias), true, NEED_RECURRENT},
    {"blk.%d.ssm_a", LA "A_log", D_NONE, D_LVHEADS, D_NONE, L(ssm_a), true, NEED_RECURRENT},
    {"blk.%d.ssm_norm.weight", LA "norm.weight", D_NONE, D_LVDIM, D_NONE, L(lin_norm), true, NEED_RECURRENT},
    {"blk.%d.ssm_out.weight", LA "out_proj.weight", D_NONE, D_DIM, D_LV, L(w_lin_out), true, NEED_RECURRENT},
    /* dense FFN (qwen35) */
    {"blk.%d.ffn_gate.weight", "model.layers.%d.mlp.gate_proj.weight", D_NONE, D_FFN, D_DIM, L(w_gate), true, NEED_DENSE},
    {"blk.%d.ffn_up.weight", "model.layers.%d.mlp.up_proj.weight", D_NONE, D_FFN, D_DIM, L(w_up), true, NEED_DENSE},
    {"blk.%d.ffn_down.weight", "model.layers.%d.mlp.down_proj.weight", D_NONE, D_DIM, D_FFN, L(w_down), true, NEED_DENSE},
    /* routed experts and the shared one (qwen35moe); Hugging Face files
     * hold the experts one tensor each (Hub names) or as transformers'
     * fused stacks (gate_up [E][2F][H], gate rows first; down), which
     * file_layout tells apart */
    {"blk.%d.ffn_gate_inp.weight", MLP "gate.weight", D_NONE, D_EXPERTS, D_DIM, L(w_router), true, NEED_MOE},
    {"blk.%d.ffn_gate_exps.weight", MLP "experts.%d.gate_proj.weight", D_EXPERTS, D_EFFN, D_DIM, L(w_gate), true, NEED_EXPS_SPLIT},
    {"blk.%d.ffn_up_exps.weight", MLP "experts.%d.up_proj.weight", D_EXPERTS, D_EFFN, D_DIM, L(w_up), true, NEED_EXPS_SPLIT},
    {"blk.%d.ffn_down_exps.weight", MLP "experts.%d.down_proj.weight", D_EXPERTS, D_DIM, D_EFFN, L(w_down), true, NEED_EXPS_SPLIT},
    {"blk.%d.ffn_gate_up_exps.weight", MLP "experts.gate_up_proj", D_EXPERTS, D_EFFN2, D_DIM, L(w_gate_up), true, NEED_EXPS_FUSED},
    {"blk.%d.ffn_down_exps.weight", MLP "experts.down_proj", D_EXPERTS, D_DIM, D_EFFN, L(w_down), true, NEED_EXPS_FUSED},
    {"blk.%d.ffn_gate_shexp.weight", MLP "shared_expert.gate_proj.weight", D_NONE, D_SFFN, D_DIM, L(w_sh_gate), true, NEED_SHARED},
    {"blk.%d.ffn_up_shexp.weight", MLP "shared_expert.up_proj.weight", D_NONE, D_SFFN, D_DIM, L(w_sh_up), true, NEED_SHARED},
    {"blk.%d.ffn_down_shexp.weight", MLP "shared_expert.down_proj.weight", D_NONE, D_DIM, D_SFFN, L(w_sh_down), true, NEED_SHARED},
    {"blk.%d.ffn_gate_inp_shexp.weight", MLP "shared_expert_gate.weight", D_NONE, D_ONE, D_DIM, L(w_sh_router), true, NEED_SHARED},
};
#undef MLP
#undef SA
#undef LA
#undef L
#undef M
/* clang-format on */

/* Joins n byte arrays of backend memory, one after the other, into a new
 * allocation of the model. */
static const void *join_bytes(pt_model *m, const void *const *src, const size_t *bytes, int n) {
    size_t total = 0;
    for (int i = 0; i < n; i++) total += bytes[i];
    void *dev = pt_model_alloc(m, total);
    if (!dev) return NULL;
    char *host = pt_xmalloc(total), *p = host;
    for (int i = 0; i < n; i++) {
        m->be->ops->download(m->be, p, src[i], bytes[i]);
        p += bytes[i];
    }
    m->be->ops->upload(m->be, dev, host, total);
    free(host);
    return dev;
}

/* w_ba = [w_beta; w_alpha]: the rows of both, one after the other (rows
 * are independent in every matrix format, so the bytes simply follow; an
 * MLX affine matrix's codes, scales and biases each follow on their own). */
static int join_ba(pt_model *m, pt_layer *L, pt_err *err) {
    const pt_weight *b = &L->w_beta, *a = &L->w_alpha;
    bool affine = b->dtype == PT_AFFINE;
    if (b->dtype != a->dtype || b->n_experts || a->n_experts ||
        (affine && (b->bits != a->bits || b->group_size != a->group_size ||
                    b->scale_dtype != a->scale_dtype)))
        return pt_fail(err, "ssm_beta and ssm_alpha are stored as %s and %s: joining them "
                            "needs one format",
                       pt_dtype_name(b->dtype), pt_dtype_name(a->dtype));
    L->w_ba = *b;
    L->w_ba.rows = b->rows + a->rows;
    L->w_ba.nbytes = b->nbytes + a->nbytes;
    if (affine) {
        size_t ss = pt_dtype_bytes(b->scale_dtype, (uint64_t)(b->cols / b->group_size));
        size_t code_bytes[2] = {(size_t)(b->rows * b->cols * b->bits / 8),
                                (size_t)(a->rows * a->cols * a->bits / 8)};
        size_t scale_bytes[2] = {(size_t)b->rows * ss, (size_t)a->rows * ss};
        const void *codes[2] = {b->data, a->data}, *scales[2] = {b->scales, a->scales},
                   *biases[2] = {b->biases, a->biases};
        L->w_ba.data = join_bytes(m, codes, code_bytes, 2);
        L->w_ba.scales = join_bytes(m, scales, scale_bytes, 2);
        L->w_ba.biases = join_bytes(m, biases, scale_bytes, 2);
    } else {
        const void *data[2] = {b->data, a->data};
        size_t bytes[2] = {b->nbytes, a->nbytes};
        L->w_ba.data = join_bytes(m, data, bytes, 2);
    }
    if (!L->w_ba.data || (affine && (!L->w_ba.scales || !L->w_ba.biases)))
        return pt_fail(err, "out of backend memory for the joined b/a projection");
    return 0;
}

/* Hugging Face experts: transformers' fused stacks if layer 0 has them
 * (one tensor per expert otherwise, as the Hub's first checkpoints). */
static int qwen35_file_layout(pt_model *m, pt_err *err) {
    (void)err;
    if (m->file->kind == PT_FILE_GGUF || m->cfg.n_experts <= 0 ||
        !pt_model_file_tensor(m->file, "model.layers.0.mlp.experts.gate_up_proj"))
        return 0;
    for (int l = 0; l < m->cfg.n_layers && l < 64 * 16; l++)
        m->cfg.experts_fused[l / 64] |= 1ull << (l % 64);
    return 0;
}

static int qwen35_finish(pt_model *m, pt_err *err) {
    /* a Hugging Face checkpoint (read_json set the norm kind) stores w of
     * x̂·(1 + w) and A_log; a GGUF file 1 + w and -exp(A_log) */
    if (m->cfg.norm == PT_NORM_RMS_1PW && (pt_norms_one_plus(m, err) || pt_ssm_a_from_log(m, err)))
        return -1;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        pt_layer *L = &m->layers[l];
        if (pt_config_layer_recurrent(&m->cfg, l) && join_ba(m, L, err)) return -1;
        if (L->w_gate_up.data) { /* fused: gate rows, then up rows, per expert */
            L->w_gate = pt_weight_expert_rows(&L->w_gate_up, 0, m->cfg.expert_ffn_dim);
            L->w_up = pt_weight_expert_rows(&L->w_gate_up, m->cfg.expert_ffn_dim,
                                            m->cfg.expert_ffn_dim);
        }
    }
    if (m->be->ops->sync(m->be)) return pt_be_take_error(m->be, err);
    return 0;
}

/* ---- Forward -------------------------------------------------------------------- */

/* h -> ws->mix (q, k, v), ws->z, ws->ba: four plain projections, three
 * matmuls. */
static void qwen35_lin_in(pt_model *m, int l, const pt_step *s) {
    pt_backend *be = m->be;
    const pt_layer *L = &m->layers[l];
    pt_workspace *ws = m->ws;

    pt_be_matmul(be, ws->mix, ws->h, &L->w_lin_qkv, s->n);
    pt_be_matmul(be, ws->z, ws->h, &L->w_lin_z, s->n);
    pt_be_matmul(be, ws->ba, ws->h, &L->w_ba, s->n);
}

static void qwen35_layer(pt_model *m, int l, const pt_step *s) {
    pt_block_hybrid_layer(m, l, s, qwen35_lin_in);
}

static void qwen35_forward(pt_model *m, const pt_step *s) {
    pt_block_stack(m, s, qwen35_layer);
}

const pt_family pt_family_qwen35 = {
    .name = "qwen35",
    .archs = qwen35_archs,
    .n_archs = PT_ARRAY_LEN(qwen35_archs),
    .read_json = qwen35_read_json,
    .read_gguf = qwen35_read_gguf,
    .weights = qwen35_weights,
    .n_weights = PT_ARRAY_LEN(qwen35_weights),
    .moe = true,
    .hybrid = true,
    .file_layout = qwen35_file_layout,
    .finish = qwen35_finish,
    .workspace = pt_workspace_hybrid,
    .forward = qwen35_forward,
};
