/*
 * gemma.c - Gemma 2 and Gemma 3 text models, as transformers computes them.
 *
 *     x = embed(tokens) · sqrt(dim)
 *     per layer:  x += norm(attention(rope(qkv(norm(x)))))·Wo)      post-norm
 *                 x += norm(Wdown·(gelu_tanh(h·Wgate) * h·Wup))      with h = norm(x)
 *     logits = norm(x)·Eᵀ  (tied), then cap · tanh(logits / cap) (Gemma 2)
 *
 * Every norm is RMSNorm times (1 + w): the files store w, and finish()
 * turns each gain into 1 + w once at load, so the forward runs the plain
 * RMSNorm op.  Attention scores are scaled by query_pre_attn_scalar^-½
 * instead of head_dim^-½; Gemma 2 soft-caps them (attn_logit_softcapping)
 * and the logits (final_logit_softcapping); Gemma 3 instead normalizes q
 * and k per head.  Layers alternate sliding-window and global attention
 * (config layer_types, or the family's default pattern); Gemma 3's window
 * layers have their own rope base (rope_local_base_freq, or
 * rope_parameters.sliding_attention) and the global layers alone take the
 * rope scaling.  The window is applied by the attention op; window layers
 * are the KV cache's window group, which keeps only the window (kvcache.h).
 *
 * GGUF files (llama.cpp's gemma2 / gemma3) store the norm gains as 1 + w
 * already and carry no query_pre_attn_scalar: gemma_read_gguf follows
 * llama.cpp's reading of them.
 */
#include <math.h>

#include "model/model_int.h"

/* clang-format off */
static const pt_arch gemma_archs[] = {
    /* name          GGUF name  config.json     GGUF rope     qkv_bias qk_norm */
    {"gemma2",      "gemma2",  "gemma2",       PT_ROPE_NEOX, false,   false},
    {"gemma3_text", "gemma3",  "gemma3_text",  PT_ROPE_NEOX, false,   true},
};
/* clang-format on */

/* ---- Config -------------------------------------------------------------- */

/* Which layers slide: layer_types when present, else Gemma 2's even
 * layers, or Gemma 3's all but every sliding_window_pattern-th. */
static int read_layer_types(json_t *j, pt_model_config *c, bool gemma3, pt_err *err) {
    int given = pt_config_json_layer_types(j, c, err);
    if (given) return given < 0 ? -1 : 0;
    c->swa_per_layer = true; /* even if the pattern slides no layer */
    int pattern = 6;
    if (!pt_json_int(j, "sliding_window_pattern", &pattern))
        pt_json_int(j, "_sliding_window_pattern", &pattern);
    for (int l = 0; l < c->n_layers; l++)
        if (gemma3 ? pattern <= 0 || (l + 1) % pattern != 0 : l % 2 == 0) pt_config_set_swa(c, l);
    return 0;
}

/* Rope bases: transformers 5 writes rope_parameters per layer type
 * ({"full_attention": {...}, "sliding_attention": {...}}); older configs
 * rope_theta, rope_scaling and rope_local_base_freq. */
static int read_rope(json_t *j, pt_model_config *c, bool gemma3, pt_err *err) {
    json_t *rp = json_object_get(j, "rope_parameters");
    json_t *full = json_object_get(rp, "full_attention"), *local = json_object_get(rp, "sliding_attention");
    if (json_is_object(full)) {
        if (!pt_json_float(full, "rope_theta", &c->rope_theta))
            return pt_fail(err, "config.json: rope_parameters.full_attention has no rope_theta");
        c->rope_scaling = PT_ROPE_SCALING_NONE;
        if (pt_rope_scaling_json(full, c, err)) return -1;
    }
    if (json_is_object(local)) {
        const char *type = json_string_value(json_object_get(local, "rope_type"));
        if (type && strcmp(type, "default") != 0)
            return pt_fail(err, "config.json: rope scaling '%s' on sliding layers is not "
                                "supported",
                           type);
        pt_json_float(local, "rope_theta", &c->rope_theta_swa);
    } else if (gemma3 && !pt_json_float(j, "rope_local_base_freq", &c->rope_theta_swa)) {
        c->rope_theta_swa = 10000.0f; /* Gemma3TextConfig's default */
    }
    c->rope_scaling_global_only = gemma3;
    return 0;
}

/* A JSON number, or 0 for null / absent (no soft-capping). */
static float cap_of(json_t *j, const char *key) {
    float v = 0;
    return pt_json_float(j, key, &v) && v > 0 ? v : 0;
}

static int gemma_read_json(json_t *j, pt_model_config *c, pt_err *err) {
    bool gemma3 = strcmp(c->arch, "gemma3_text") == 0;
    if (pt_config_json_common(j, c, err) || pt_config_json_act(j, c, err)) return -1;
    if (c->act != PT_ACT_GELU_TANH)
        return pt_fail(err, "config.json: %s with a non-GELU-tanh activation is not supported",
                       c->arch);
    if (json_is_true(json_object_get(j, "attention_bias")))
        return pt_fail(err, "config.json: %s with attention_bias is not supported", c->arch);
    if (json_is_true(json_object_get(j, "use_bidirectional_attention")))
        return pt_fail(err, "config.json: bidirectional attention (EmbeddingGemma) is not "
                            "supported");
    /* Gemma ties the output head to the embeddings unless told otherwise. */
    if (!json_is_false(json_object_get(j, "tie_word_embeddings"))) c->tied_embeddings = true;
    c->norm = PT_NORM_RMS_1PW;
    c->embed_scale = sqrtf((float)c->dim);
    float qpas = (float)c->head_dim;
    pt_json_float(j, "query_pre_attn_scalar", &qpas);
    if (!(qpas > 0)) return pt_fail(err, "config.json: query_pre_attn_scalar must be positive");
    c->attn_scale = 1.0f / sqrtf(qpas);
    c->attn_softcap = cap_of(j, "attn_logit_softcapping");
    c->final_softcap = cap_of(j, "final_logit_softcapping");
    if (pt_json_int(j, "sliding_window", &c->sliding_window) && c->sliding_window > 0 &&
        read_layer_types(j, c, gemma3, err))
        return -1;
    return read_rope(j, c, gemma3, err);
}

/* GGUF (llama.cpp's gemma2 / gemma3, src/models/gemma{2,3}.cpp): no key
 * for query_pre_attn_scalar, so scores scale by head_dim^-1/2, or by
 * (dim / heads)^-1/2 at the 27B models' layer counts (46, 62) - what the
 * released configs say, and what llama.cpp computes for any file.  Window
 * layers: attention.sliding_window_pattern p (layer l slides iff p == 0 or
 * l % p < p - 1; default 2 for Gemma 2, 6 for Gemma 3), their rope base
 * rope.freq_base_swa (Gemma 2: the global base; Gemma 3: 10000), and
 * Gemma 3's rope scaling on the global layers only.  Gemma 2 soft-caps with
 * llama.cpp's defaults (50, 30) when the keys are absent. */
static int gemma_read_gguf(const pt_gguf *g, const pt_model_file *mf, const char *garch,
                           pt_model_config *c, pt_err *err) {
    bool gemma3 = strcmp(c->arch, "gemma3_text") == 0;
    if (pt_config_gguf_common(g, mf, garch, c, err)) return -1;
    c->act = PT_ACT_GELU_TANH;
    c->norm = PT_NORM_RMS_1PW;
    c->embed_scale = sqrtf((float)c->dim);
    bool big = c->n_layers == (gemma3 ? 62 : 46);
    c->attn_scale = 1.0f / sqrtf(big && c->n_heads ? (float)(c->dim / c->n_heads) : (float)c->head_dim);
    if (!gemma3) {
        c->attn_softcap = 50, c->final_softcap = 30;
        pt_gguf_float(g, garch, "attn_logit_softcapping", &c->attn_softcap);
    }
    pt_gguf_float(g, garch, "final_logit_softcapping", &c->final_softcap);
    c->attn_softcap = PT_MAX(c->attn_softcap, 0.0f), c->final_softcap = PT_MAX(c->final_softcap, 0.0f);
    int window = gemma3 ? 0 : 4096, pattern = gemma3 ? 6 : 2;
    pt_gguf_int(g, garch, "attention.sliding_window", &window);
    pt_gguf_int(g, garch, "attention.sliding_window_pattern", &pattern);
    if (window > 0) {
        c->sliding_window = window;
        c->swa_per_layer = true;
        for (int l = 0; l < c->n_layers; l++)
            if (pattern <= 0 || l % pattern < pattern - 1) pt_config_set_swa(c, l);
    }
    c->rope_theta_swa = gemma3 ? 10000.0f : c->rope_theta;
    pt_gguf_float(g, garch, "rope.freq_base_swa", &c->rope_theta_swa);
    c->rope_scaling_global_only = gemma3;
    return 0;
}

/* ---- Weights ------------------------------------------------------------- */

/* clang-format off */
#define L(f) offsetof(pt_layer, f)
static const pt_weight_spec gemma_weights[] = {
    PT_W_TOKEN_IO,
    PT_W_ATTN,
    PT_W_QK_NORM,
    {"blk.%d.post_attention_norm.weight", "model.layers.%d.post_attention_layernorm.weight", D_NONE, D_DIM, D_NONE, L(post_attn_norm), true, NEED_ALWAYS},
    {"blk.%d.ffn_norm.weight", "model.layers.%d.pre_feedforward_layernorm.weight", D_NONE, D_DIM, D_NONE, L(ffn_norm), true, NEED_ALWAYS},
    {"blk.%d.post_ffw_norm.weight", "model.layers.%d.post_feedforward_layernorm.weight", D_NONE, D_DIM, D_NONE, L(post_ffn_norm), true, NEED_ALWAYS},
    {"blk.%d.ffn_gate.weight", "model.layers.%d.mlp.gate_proj.weight", D_NONE, D_FFN, D_DIM, L(w_gate), true, NEED_ALWAYS},
    {"blk.%d.ffn_up.weight", "model.layers.%d.mlp.up_proj.weight", D_NONE, D_FFN, D_DIM, L(w_up), true, NEED_ALWAYS},
    {"blk.%d.ffn_down.weight", "model.layers.%d.mlp.down_proj.weight", D_NONE, D_DIM, D_FFN, L(w_down), true, NEED_ALWAYS},
};
#undef L
/* clang-format on */

/* Hugging Face files store each norm's w of x̂ · (1 + w); the RMSNorm op
 * multiplies by its gain, so every gain becomes 1 + w (in f32, as
 * transformers adds).  GGUF files already store 1 + w (llama.cpp's
 * converter adds it; its graph runs a plain RMSNorm). */
static int gemma_finish(pt_model *m, pt_err *err) {
    if (m->file && m->file->kind == PT_FILE_GGUF) return 0;
    return pt_norms_one_plus(m, err);
}

/* ---- Forward ------------------------------------------------------------- */

static void gemma_layer(pt_model *m, int l, const pt_step *s) {
    const pt_layer *L = &m->layers[l];
    pt_workspace *ws = m->ws;

    pt_block_norm(m, s, ws->h, ws->x, L->attn_norm);
    pt_block_qkv(m, l, s);
    pt_block_attention(m, l, s);
    pt_block_norm(m, s, ws->h, ws->h, L->post_attn_norm);
    pt_block_residual(m, s);

    pt_block_norm(m, s, ws->h, ws->x, L->ffn_norm);
    pt_block_ffn(m, l, s);
    pt_block_norm(m, s, ws->h, ws->h, L->post_ffn_norm);
    pt_block_residual(m, s);
}

static void gemma_forward(pt_model *m, const pt_step *s) {
    pt_block_stack(m, s, gemma_layer);
}

const pt_family pt_family_gemma = {
    .name = "gemma",
    .archs = gemma_archs,
    .n_archs = PT_ARRAY_LEN(gemma_archs),
    .read_json = gemma_read_json,
    .read_gguf = gemma_read_gguf,
    .weights = gemma_weights,
    .n_weights = PT_ARRAY_LEN(gemma_weights),
    .finish = gemma_finish,
    .forward = gemma_forward,
};
