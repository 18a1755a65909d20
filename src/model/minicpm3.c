/*
 * minicpm3.c - MiniCPM3 (GGUF minicpm3; config.json minicpm3): multi-head
 * latent attention in a dense model, with MiniCPM's scalings.
 *
 *     x = scale_emb · embed(tokens)
 *     per layer:  x += scale_depth / sqrt(n_layers) · MLA(rmsnorm(x))
 *                 x += scale_depth / sqrt(n_layers) · FFN(rmsnorm(x))
 *     logits = (dim_model_base / hidden_size) · rmsnorm(x) · Woutᵀ
 *
 * The attention is DeepSeek's latent attention (mla.c), run absorbed: the
 * cache holds kv_lora + n_rot floats per token and layer.  Unlike
 * deepseek2 files, every minicpm3 GGUF keeps kv_b fused (attn_kv_b), which
 * is split into the per-head stacks at load; its rope is NEOX-style
 * (rotate-half) in both kinds of file, and its score scale 1 / sqrt(no-rope
 * + rope dims).  The value head is v_head_dim, or hidden_size / heads when
 * the file does not say (the Hub config and llama.cpp's converter do not).
 *
 * The scalings.  config.json has scale_emb, scale_depth and dim_model_base;
 * a GGUF file has no keys for them and llama.cpp (src/models/minicpm3.cpp)
 * uses MiniCPM3-4B's values, 12, 1.4 and 256, whatever the file: so do we.
 *
 * LongRoPE.  The rope frequencies are divided per pair by the short
 * factors, or the long ones past the original context.  llama.cpp picks
 * once per context (long when the context exceeds
 * rope.scaling.original_context_length, by default context_length); the
 * Hub code per sequence length.  We pick at load: the short factors, and a
 * file whose trained context reaches past its original one (where the
 * choice would depend on the context) is refused.  GGUF files carry them
 * as rope_factors_short / rope_factors_long tensors, config.json as
 * rope_scaling.short_factor / long_factor (registry.c reads those).
 */
#include <math.h>
#include <stdio.h>

#include "model/model_int.h"

/* clang-format off */
static const pt_arch minicpm3_archs[] = {
    /* name        GGUF name   config.json  GGUF rope     qkv_bias qk_norm */
    {"minicpm3",   "minicpm3", "minicpm3",  PT_ROPE_NEOX, false,   false},
};
/* clang-format on */

/* llama.cpp's constants for every minicpm3 GGUF (MiniCPM3-4B's config). */
#define GGUF_SCALE_EMB 12.0f
#define GGUF_SCALE_DEPTH 1.4f
#define GGUF_DIM_BASE 256

/* ---- Config -------------------------------------------------------------- */

static int check_shapes(const pt_model_config *c, const char *where, pt_err *err) {
    if (c->kv_lora_rank <= 0 || c->v_head_dim <= 0 || c->n_rot <= 0 || c->n_rot % 2 ||
        c->head_dim <= c->n_rot || c->q_lora_rank < 0 || c->kv_lora_rank > 1 << 14 ||
        c->v_head_dim > 1024)
        return pt_fail(err, "%s: latent attention shapes out of range (kv_lora_rank %d, "
                            "q_lora_rank %d, key head %d with %d rope dims, value head %d)",
                       where, c->kv_lora_rank, c->q_lora_rank, c->head_dim, c->n_rot,
                       c->v_head_dim);
    return 0;
}

/* MiniCPM's three scalings from its settings. */
static void set_scales(pt_model_config *c, float scale_emb, float scale_depth, float dim_base) {
    c->embed_scale = scale_emb;
    c->residual_scale = scale_depth / sqrtf((float)c->n_layers);
    c->output_scale = dim_base / (float)c->dim;
}

/* The short LongRoPE factors of a GGUF file, as llama.cpp picks them for
 * contexts within the original one (module comment). */
static int longrope_gguf(const pt_model_file *mf, const char *garch, const pt_gguf *g,
                         pt_model_config *c, pt_err *err) {
    const pt_tensor_info *sh = pt_model_file_tensor(mf, "rope_factors_short.weight");
    const pt_tensor_info *lo = pt_model_file_tensor(mf, "rope_factors_long.weight");
    if (!sh && !lo) return 0;
    int n = c->n_rot / 2;
    if (!sh || !lo || sh->dtype != PT_F32 || sh->ndim != 1 || sh->shape[0] != n ||
        n > PT_ROPE_EXT_MAX)
        return pt_fail(err, "%s: expected f32 rope_factors_short and rope_factors_long of %d "
                            "(half the rope dims, at most %d)",
                       mf->path, n, PT_ROPE_EXT_MAX);
    int orig = c->max_ctx;
    pt_gguf_int(g, garch, "rope.scaling.original_context_length", &orig);
    if (orig < c->max_ctx)
        return pt_fail(err, "%s: LongRoPE with an original context of %d below the trained "
                            "%d is not supported (llama.cpp switches to the long factors "
                            "past %d)",
                       mf->path, orig, c->max_ctx, orig);
    memcpy(c->rope_ext, sh->data, sizeof(float) * (size_t)n);
    for (int i = 0; i < n; i++)
        if (!(c->rope_ext[i] > 0))
            return pt_fail(err, "%s: rope_factors_short[%d] is %g", mf->path, i,
                           (double)c->rope_ext[i]);
    c->rope_n_ext = n;
    c->rope_scaling = PT_ROPE_SCALING_LONGROPE;
    c->rope_orig_ctx = orig;
    c->rope_mscale = 1.0f;
    pt_gguf_float(g, garch, "rope.scaling.attn_factor", &c->rope_mscale);
    return 0;
}

/* llama.cpp's converter writes key_length (no-rope + rope dims), the rope
 * dims, both ranks and head_count_kv = heads (the non-absorbed form it
 * runs); no value_length, no rope scaling keys. */
static int minicpm3_read_gguf(const pt_gguf *g, const pt_model_file *mf, const char *garch,
                              pt_model_config *c, pt_err *err) {
    pt_gguf_str st;
    char key[96];
    snprintf(key, sizeof key, "%s.rope.scaling.type", garch);
    bool typed = pt_gguf_get_str(g, key, &st);
    bool longrope = typed && st.len == 8 && memcmp(st.s, "longrope", 8) == 0;
    if (typed && !longrope && !(st.len == 4 && memcmp(st.s, "none", 4) == 0))
        return pt_fail(err, "%s: minicpm3 with rope scaling '%.*s' is not supported (LongRoPE "
                            "factors only)",
                       mf->path, (int)PT_MIN(st.len, 32), st.s);
    float factor = 1;
    if (pt_gguf_float(g, garch, "rope.scaling.factor", &factor) && factor != 0 && factor != 1)
        return pt_fail(err, "%s: minicpm3 with rope.scaling.factor %g is not supported",
                       mf->path, (double)factor);
    if (longrope) c->rope_scaling = PT_ROPE_SCALING_LONGROPE; /* the common reader skips it */
    if (pt_config_gguf_common(g, mf, garch, c, err)) return -1;
    c->rope_scaling = PT_ROPE_SCALING_NONE;
    if (longrope_gguf(mf, garch, g, c, err)) return -1;
    if (!pt_gguf_int(g, garch, "attention.kv_lora_rank", &c->kv_lora_rank))
        return pt_fail(err, "%s: GGUF minicpm3 needs %s.attention.kv_lora_rank", mf->path, garch);
    pt_gguf_int(g, garch, "attention.q_lora_rank", &c->q_lora_rank);
    if (!pt_model_file_tensor(mf, "blk.0.attn_q_a.weight")) c->q_lora_rank = 0; /* direct q */
    if (!pt_gguf_int(g, garch, "attention.value_length", &c->v_head_dim))
        c->v_head_dim = c->dim / c->n_heads;
    c->kv_b_fused = pt_model_file_tensor(mf, "blk.0.attn_kv_b.weight") != NULL;
    c->n_kv_heads = 1;
    set_scales(c, GGUF_SCALE_EMB, GGUF_SCALE_DEPTH, (float)GGUF_DIM_BASE);
    return check_shapes(c, mf->path, err);
}

/* The Hub's MiniCPM3 config (and transformers' port): the DeepSeek-V2
 * attention keys, scale_emb, scale_depth, dim_model_base, rope_scaling
 * {type longrope, short_factor, long_factor, original_max_position_embeddings}. */
static int minicpm3_read_json(json_t *j, pt_model_config *c, pt_err *err) {
    if (pt_config_json_common(j, c, err) || pt_config_json_act(j, c, err)) return -1;
    int nope = 0, rope = 0;
    if (!pt_json_int(j, "qk_nope_head_dim", &nope) || !pt_json_int(j, "qk_rope_head_dim", &rope) ||
        !pt_json_int(j, "kv_lora_rank", &c->kv_lora_rank))
        return pt_fail(err, "config.json: minicpm3 needs qk_nope_head_dim, qk_rope_head_dim and "
                            "kv_lora_rank");
    if (!pt_json_int(j, "q_lora_rank", &c->q_lora_rank)) c->q_lora_rank = 0; /* null: direct */
    if (!pt_json_int(j, "v_head_dim", &c->v_head_dim)) c->v_head_dim = c->dim / c->n_heads;
    if (json_is_true(json_object_get(j, "attention_bias")))
        return pt_fail(err, "config.json: minicpm3 with attention_bias is not supported");
    c->head_dim = nope + rope, c->n_rot = rope, c->n_kv_heads = 1;
    float emb = 1, depth = 1, base = (float)c->dim;
    pt_json_float(j, "scale_emb", &emb);
    pt_json_float(j, "scale_depth", &depth);
    pt_json_float(j, "dim_model_base", &base);
    if (!(emb > 0) || !(depth > 0) || !(base > 0))
        return pt_fail(err, "config.json: minicpm3 scale_emb %g, scale_depth %g and "
                            "dim_model_base %g must be positive",
                       (double)emb, (double)depth, (double)base);
    set_scales(c, emb, depth, base);
    return check_shapes(c, "config.json", err);
}

/* ---- Weights ------------------------------------------------------------- */

/* clang-format off */
#define L(f) offsetof(pt_layer, f)
/* k_b / v_b: files keep kv_b fused (attn_kv_b, kv_b_proj), split at load
 * (pt_mla_split_kv_b); dummy weights make the stacks directly. */
static const pt_weight_spec minicpm3_weights[] = {
    PT_W_TOKEN_IO,
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
    {"blk.%d.ffn_gate.weight", "model.layers.%d.mlp.gate_proj.weight", D_NONE, D_FFN, D_DIM, L(w_gate), true, NEED_ALWAYS},
    {"blk.%d.ffn_up.weight", "model.layers.%d.mlp.up_proj.weight", D_NONE, D_FFN, D_DIM, L(w_up), true, NEED_ALWAYS},
    {"blk.%d.ffn_down.weight", "model.layers.%d.mlp.down_proj.weight", D_NONE, D_DIM, D_FFN, L(w_down), true, NEED_ALWAYS},
};
#undef L
/* clang-format on */

/* Hugging Face checkpoints store kv_b_proj fused. */
static int minicpm3_file_layout(pt_model *m, pt_err *err) {
    (void)err;
    if (m->file->kind != PT_FILE_GGUF) m->cfg.kv_b_fused = true;
    return 0;
}

/* ---- Forward ------------------------------------------------------------- */

static void minicpm3_layer(pt_model *m, int l, const pt_step *s) {
    const pt_layer *L = &m->layers[l];
    pt_workspace *ws = m->ws;

    pt_block_norm(m, s, ws->h, ws->x, L->attn_norm);
    pt_block_mla_attention(m, l, s);
    pt_block_residual_scaled(m, l, s);

    pt_block_norm(m, s, ws->h, ws->x, L->ffn_norm);
    pt_block_ffn(m, l, s);
    pt_block_residual_scaled(m, l, s);
}

/* The embedding and output scalings are the config's (pt_block_embed,
 * pt_block_output). */
static void minicpm3_forward(pt_model *m, const pt_step *s) {
    pt_block_stack(m, s, minicpm3_layer);
}

const pt_family pt_family_minicpm3 = {
    .name = "minicpm3",
    .archs = minicpm3_archs,
    .n_archs = PT_ARRAY_LEN(minicpm3_archs),
    .read_json = minicpm3_read_json,
    .read_gguf = minicpm3_read_gguf,
    .weights = minicpm3_weights,
    .n_weights = PT_ARRAY_LEN(minicpm3_weights),
    .mla = true,
    .file_layout = minicpm3_file_layout,
    .finish = pt_mla_split_kv_b,
    .workspace = pt_workspace_mla,
    .forward = minicpm3_forward,
};
