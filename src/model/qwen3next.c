/*
 * qwen3next.c - Qwen3-Next (qwen3_next): a hybrid of Gated DeltaNet
 * (linear-recurrent) layers and gated full-attention layers, usually three
 * of the first to one of the second, every FFN routed experts plus one
 * gated shared expert.
 *
 *     x = embed(tokens)
 *     per layer:  h = rmsnorm(x)                               (gains 1 + w)
 *       linear:   qkvz, ba = h·Wqkvzᵀ, h·Wbaᵀ    (fused, grouped per key head)
 *                 q, k, v = silu(causal depthwise conv(q, k, v))   (tail: state)
 *                 o = gated delta rule(l2norm q, l2norm k, v, g, beta)   (state)
 *                 h = (rmsnorm(o) · w · silu(z))·Woutᵀ         (per value head)
 *       full:     q, gate = h·Wqᵀ (per head: hd queries, then hd gates)
 *                 q, k = rmsnorm per head (1 + w), partial rope (first n_rot)
 *                 h = (attention(q, k, v) * sigmoid(gate))·Woᵀ
 *       x += h;   h = rmsnorm(x)
 *                 x += experts(h) + sigmoid(h·wsgᵀ) · shared_expert(h)
 *     logits = rmsnorm(x)·Woutᵀ
 *
 * The recurrent layers' state (conv tail and delta-rule matrices, f32)
 * lives in the KV cache's state group (kvcache.h), one slot per sequence;
 * the ops (cpu_recurrent.c) read and update it: decode rows one token at a
 * time, a prefill's rows in chunks (the chunkwise form).  The layer, the
 * gated attention and the delta rule after the in-projections are blocks
 * shared with Qwen3.5 (blocks.c); the fused projections are split into
 * their parts with gather_cols, by index tables built here at load.  Only
 * Hugging Face checkpoints load (GGUF qwen3next is not read yet); dense
 * layers among the sparse ones and attention biases are refused.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "model/model_int.h"

/* clang-format off */
static const pt_arch qwen3next_archs[] = {
    /* name         GGUF name  config.json    GGUF rope     qkv_bias qk_norm */
    {"qwen3_next",  NULL,      "qwen3_next",  PT_ROPE_NEOX, false,   true},
};
/* clang-format on */

/* ---- Config -------------------------------------------------------------------- */

/* Which layers are linear: layer_types, or every full_attention_interval-th
 * layer full (the older configs' way, default 4). */
static int read_layer_kinds(json_t *j, pt_model_config *c, pt_err *err) {
    json_t *types = json_object_get(j, "layer_types");
    if (json_is_array(types)) {
        if ((int)json_array_size(types) != c->n_layers || c->n_layers > 64 * 16)
            return pt_fail(err, "config.json: %zu layer_types for %d layers",
                           json_array_size(types), c->n_layers);
        for (int l = 0; l < c->n_layers; l++) {
            const char *t = json_string_value(json_array_get(types, (size_t)l));
            if (t && strcmp(t, "linear_attention") == 0)
                c->recurrent_layers[l / 64] |= (uint64_t)1 << (l % 64);
            else if (!t || strcmp(t, "full_attention") != 0)
                return pt_fail(err, "config.json: layer_types[%d] '%s' is not supported "
                                    "(linear_attention, full_attention)",
                               l, t ? t : "?");
        }
        return 0;
    }
    int every = 4;
    pt_json_int(j, "full_attention_interval", &every);
    if (every < 1 || c->n_layers > 64 * 16)
        return pt_fail(err, "config.json: full_attention_interval %d", every);
    for (int l = 0; l < c->n_layers; l++)
        if ((l + 1) % every) c->recurrent_layers[l / 64] |= (uint64_t)1 << (l % 64);
    return 0;
}

static int read_linear(json_t *j, pt_model_config *c, pt_err *err) {
    static const struct {
        const char *key;
        size_t off;
    } req[] = {
        {"linear_num_key_heads", offsetof(pt_model_config, lin_k_heads)},
        {"linear_num_value_heads", offsetof(pt_model_config, lin_v_heads)},
        {"linear_key_head_dim", offsetof(pt_model_config, lin_k_dim)},
        {"linear_value_head_dim", offsetof(pt_model_config, lin_v_dim)},
        {"linear_conv_kernel_dim", offsetof(pt_model_config, lin_conv_kernel)},
    };
    for (size_t i = 0; i < PT_ARRAY_LEN(req); i++) {
        int *v = (int *)((char *)c + req[i].off);
        if (!pt_json_int(j, req[i].key, v) || *v < 1 || *v > 65536)
            return pt_fail(err, "config.json: %s needs a positive %s", c->arch, req[i].key);
    }
    if (c->lin_v_heads % c->lin_k_heads)
        return pt_fail(err, "config.json: linear_num_value_heads %d is not a multiple of "
                            "linear_num_key_heads %d",
                       c->lin_v_heads, c->lin_k_heads);
    return 0;
}

/* Every layer sparse, with one gated shared expert. */
static int read_experts(json_t *j, pt_model_config *c, pt_err *err) {
    int step = 1;
    pt_json_int(j, "decoder_sparse_step", &step);
    if (step != 1 || json_array_size(json_object_get(j, "mlp_only_layers")) > 0)
        return pt_fail(err, "config.json: qwen3_next with dense layers among the sparse ones "
                            "(decoder_sparse_step %d, mlp_only_layers) is not implemented yet",
                       step);
    if (!pt_json_int(j, "num_experts", &c->n_experts) || c->n_experts < 1 ||
        !pt_json_int(j, "num_experts_per_tok", &c->n_experts_used) ||
        !pt_json_int(j, "moe_intermediate_size", &c->expert_ffn_dim))
        return pt_fail(err, "config.json: qwen3_next needs num_experts, num_experts_per_tok and "
                            "moe_intermediate_size");
    c->expert_renorm = json_is_true(json_object_get(j, "norm_topk_prob"));
    if (!pt_json_int(j, "shared_expert_intermediate_size", &c->shared_ffn_dim) ||
        c->shared_ffn_dim < 1)
        return pt_fail(err, "config.json: qwen3_next needs shared_expert_intermediate_size");
    c->n_shared_experts = 1;
    return 0;
}

int pt_hybrid_read_json(json_t *j, pt_model_config *c, pt_err *err) {
    if (pt_config_json_common(j, c, err) || pt_config_json_act(j, c, err)) return -1;
    if (c->act != PT_ACT_SILU)
        return pt_fail(err, "config.json: %s with a non-SiLU activation", c->arch);
    if (json_is_true(json_object_get(j, "attention_bias")))
        return pt_fail(err, "config.json: %s with attention_bias is not supported", c->arch);
    c->norm = PT_NORM_RMS_1PW;
    c->attn_output_gate = true;
    /* partial rope: top level (older configs) or in rope_parameters */
    float frac = 1.0f;
    json_t *rp = json_object_get(j, "rope_parameters");
    if (!pt_json_float(j, "partial_rotary_factor", &frac) && json_is_object(rp))
        pt_json_float(rp, "partial_rotary_factor", &frac);
    c->n_rot = (int)((float)c->head_dim * frac);
    if (!(frac > 0 && frac <= 1) || c->n_rot % 2 || c->n_rot < 2)
        return pt_fail(err, "config.json: partial_rotary_factor %g of head_dim %d", (double)frac,
                       c->head_dim);
    return read_layer_kinds(j, c, err) || read_linear(j, c, err) ? -1 : 0;
}

static int qwen3next_read_json(json_t *j, pt_model_config *c, pt_err *err) {
    return pt_hybrid_read_json(j, c, err) || read_experts(j, c, err) ? -1 : 0;
}

static int qwen3next_read_gguf(const pt_gguf *g, const pt_model_file *mf, const char *garch,
                               pt_model_config *c, pt_err *err) {
    (void)g, (void)garch, (void)c;
    return pt_fail(err, "%s: GGUF qwen3next files are not supported yet", mf->path);
}

/* ---- Weights ------------------------------------------------------------------ */

/* clang-format off */
#define L(f) offsetof(pt_layer, f)
#define M(f) offsetof(pt_model, f)
#define LA "model.layers.%d.linear_attn."
static const pt_weight_spec qwen3next_weights[] = {
    {"token_embd.weight", "model.embed_tokens.weight", D_NONE, D_VOCAB, D_DIM, M(tok_embd), false, NEED_ALWAYS},
    {"output_norm.weight", "model.norm.weight", D_NONE, D_DIM, D_NONE, M(output_norm), false, NEED_ALWAYS},
    {"output.weight", "lm_head.weight", D_NONE, D_VOCAB, D_DIM, M(output), false, NEED_UNTIED},
    {"blk.%d.attn_norm.weight", "model.layers.%d.input_layernorm.weight", D_NONE, D_DIM, D_NONE, L(attn_norm), true, NEED_ALWAYS},
    {"blk.%d.ffn_norm.weight", "model.layers.%d.post_attention_layernorm.weight", D_NONE, D_DIM, D_NONE, L(ffn_norm), true, NEED_ALWAYS},
    /* gated full attention */
    {"blk.%d.attn_q.weight", "model.layers.%d.self_attn.q_proj.weight", D_NONE, D_Q2, D_DIM, L(wq), true, NEED_ATTN},
    {"blk.%d.attn_k.weight", "model.layers.%d.self_attn.k_proj.weight", D_NONE, D_KV, D_DIM, L(wk), true, NEED_ATTN},
    {"blk.%d.attn_v.weight", "model.layers.%d.self_attn.v_proj.weight", D_NONE, D_KV, D_DIM, L(wv), true, NEED_ATTN},
    {"blk.%d.attn_output.weight", "model.layers.%d.self_attn.o_proj.weight", D_NONE, D_DIM, D_Q, L(wo), true, NEED_ATTN},
    {"blk.%d.attn_q_norm.weight", "model.layers.%d.self_attn.q_norm.weight", D_NONE, D_HEAD, D_NONE, L(q_norm), true, NEED_ATTN},
    {"blk.%d.attn_k_norm.weight", "model.layers.%d.self_attn.k_norm.weight", D_NONE, D_HEAD, D_NONE, L(k_norm), true, NEED_ATTN},
    /* Gated DeltaNet */
    {"blk.%d.ssm_in.weight", LA "in_proj_qkvz.weight", D_NONE, D_LQKVZ, D_DIM, L(w_qkvz), true, NEED_RECURRENT},
    {"blk.%d.ssm_ba.weight", LA "in_proj_ba.weight", D_NONE, D_LBA, D_DIM, L(w_ba), true, NEED_RECURRENT},
    {"blk.%d.ssm_conv1d.weight", LA "conv1d.weight", D_NONE, D_LCONV, D_NONE, L(conv_w), true, NEED_RECURRENT},
    {"blk.%d.ssm_dt.bias", LA "dt_bias", D_NONE, D_LVHEADS, D_NONE, L(dt_bias), true, NEED_RECURRENT},
    {"blk.%d.ssm_a_log", LA "A_log", D_NONE, D_LVHEADS, D_NONE, L(ssm_a), true, NEED_RECURRENT},
    {"blk.%d.ssm_norm.weight", LA "norm.weight", D_NONE, D_LVDIM, D_NONE, L(lin_norm), true, NEED_RECURRENT},
    {"blk.%d.ssm_out.weight", LA "out_proj.weight", D_NONE, D_DIM, D_LV, L(w_lin_out), true, NEED_RECURRENT},
    /* routed experts and the shared one */
    {"blk.%d.ffn_gate_inp.weight", "model.layers.%d.mlp.gate.weight", D_NONE, D_EXPERTS, D_DIM, L(w_router), true, NEED_ALWAYS},
    {"blk.%d.ffn_gate_exps.weight", "model.layers.%d.mlp.experts.%d.gate_proj.weight", D_EXPERTS, D_EFFN, D_DIM, L(w_gate), true, NEED_ALWAYS},
    {"blk.%d.ffn_up_exps.weight", "model.layers.%d.mlp.experts.%d.up_proj.weight", D_EXPERTS, D_EFFN, D_DIM, L(w_up), true, NEED_ALWAYS},
    {"blk.%d.ffn_down_exps.weight", "model.layers.%d.mlp.experts.%d.down_proj.weight", D_EXPERTS, D_DIM, D_EFFN, L(w_down), true, NEED_ALWAYS},
    {"blk.%d.ffn_gate_shexp.weight", "model.layers.%d.mlp.shared_expert.gate_proj.weight", D_NONE, D_SFFN, D_DIM, L(w_sh_gate), true, NEED_SHARED},
    {"blk.%d.ffn_up_shexp.weight", "model.layers.%d.mlp.shared_expert.up_proj.weight", D_NONE, D_SFFN, D_DIM, L(w_sh_up), true, NEED_SHARED},
    {"blk.%d.ffn_down_shexp.weight", "model.layers.%d.mlp.shared_expert.down_proj.weight", D_NONE, D_DIM, D_SFFN, L(w_sh_down), true, NEED_SHARED},
    {"blk.%d.ffn_gate_inp_shexp.weight", "model.layers.%d.mlp.shared_expert_gate.weight", D_NONE, D_ONE, D_DIM, L(w_sh_router), true, NEED_SHARED},
};
#undef LA
#undef L
#undef M
/* clang-format on */

/* x̂ · (1 + w) everywhere but the gated norm: the RMSNorm op multiplies by
 * its gain, so each stored w becomes 1 + w once (in f32, as transformers);
 * A_log becomes the decay rate -exp(A_log). */
static int qwen3next_finish(pt_model *m, pt_err *err) {
    return pt_norms_one_plus(m, err) || pt_ssm_a_from_log(m, err) ? -1 : 0;
}

/* ---- Workspace: the split tables of the fused projections --------------------- */

/* Column tables for gather_cols.  in_proj_qkvz gives, per key head, its q
 * [dk], k [dk], then the v [r*dv] and z [r*dv] of its r value heads; the
 * conv wants all q, all k, all v.  in_proj_ba gives, per key head, r b's
 * then r a's.  (q_proj's split is pt_workspace_hybrid's.) */
static int qwen3next_workspace(pt_model *m, int cap, pt_err *err) {
    if (pt_workspace_hybrid(m, cap, err)) return -1;
    const pt_model_config *c = &m->cfg;
    pt_workspace *ws = m->ws;
    int nk = c->lin_k_heads, nv = c->lin_v_heads;
    int dk = c->lin_k_dim, dv = c->lin_v_dim, r = nv / nk, group = 2 * dk + 2 * r * dv;
    int kd = nk * dk, vd = nv * dv, n = 2 * kd + vd;
    int32_t *a = pt_xmalloc(sizeof(int32_t) * (size_t)n), *b = pt_xmalloc(sizeof(int32_t) * (size_t)n);
    for (int g = 0; g < nk; g++) {
        for (int i = 0; i < dk; i++) a[g * dk + i] = g * group + i, a[kd + g * dk + i] = g * group + dk + i;
        for (int j = 0; j < r * dv; j++) {
            a[2 * kd + g * r * dv + j] = g * group + 2 * dk + j;
            b[g * r * dv + j] = g * group + 2 * dk + r * dv + j;
        }
    }
    ws->idx_mix = pt_index_table(m, a, 2 * kd + vd);
    ws->idx_z = pt_index_table(m, b, vd);
    for (int g = 0; g < nk; g++)
        for (int i = 0; i < r; i++) a[g * r + i] = g * 2 * r + i, a[nv + g * r + i] = g * 2 * r + r + i;
    ws->idx_ba = pt_index_table(m, a, 2 * nv);
    free(a), free(b);
    if (!ws->idx_mix || !ws->idx_z || !ws->idx_ba)
        return pt_fail(err, "out of backend memory for the split tables");
    return 0;
}

/* ---- Forward -------------------------------------------------------------------- */

/* h -> ws->mix (q, k, v), ws->z, ws->ba: the fused projections, split. */
static void qwen3next_lin_in(pt_model *m, int l, const pt_step *s) {
    pt_backend *be = m->be;
    const pt_model_config *c = &m->cfg;
    const pt_layer *L = &m->layers[l];
    pt_workspace *ws = m->ws;
    int n = s->n, nv = c->lin_v_heads, kd = c->lin_k_heads * c->lin_k_dim;
    int vd = nv * c->lin_v_dim, conv = 2 * kd + vd, qkvz = 2 * kd + 2 * vd;

    pt_be_matmul(be, ws->fused, ws->h, &L->w_qkvz, n);
    pt_be_gather_cols(be, ws->mix, ws->fused, ws->idx_mix, n, qkvz, conv);
    pt_be_gather_cols(be, ws->z, ws->fused, ws->idx_z, n, qkvz, vd);
    pt_be_matmul(be, ws->fused, ws->h, &L->w_ba, n);
    pt_be_gather_cols(be, ws->ba, ws->fused, ws->idx_ba, n, 2 * nv, 2 * nv);
}

static void qwen3next_layer(pt_model *m, int l, const pt_step *s) {
    pt_block_hybrid_layer(m, l, s, qwen3next_lin_in);
}

static void qwen3next_forward(pt_model *m, const pt_step *s) {
    pt_block_stack(m, s, qwen3next_layer);
}

const pt_family pt_family_qwen3next = {
    .name = "qwen3next",
    .archs = qwen3next_archs,
    .n_archs = PT_ARRAY_LEN(qwen3next_archs),
    .read_json = qwen3next_read_json,
    .read_gguf = qwen3next_read_gguf,
    .weights = qwen3next_weights,
    .n_weights = PT_ARRAY_LEN(qwen3next_weights),
    .moe = true,
    .hybrid = true,
    .finish = qwen3next_finish,
    .workspace = qwen3next_workspace,
    .forward = qwen3next_forward,
};
