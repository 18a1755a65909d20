/*
 * gemma4.c - Gemma 4 text models (GGUF architecture gemma4), as llama.cpp
 * computes them (src/models/gemma4.cpp at the anchor commit).
 *
 *     x = embed(tokens) · sqrt(dim)
 *     pli[l] = (norm(x·Wpli)[l] / sqrt(dim) + embed_pl(tokens)[l] · sqrt(ple)) / sqrt(2)
 *     per layer:  h = norm(x);  q = rope(norm(h·Wq));  k = rope(norm(h·Wk));  v = norm(h·Wv)
 *                 x += norm(attention(q, k, v)·Wo)               (score scale 1)
 *                 x += norm(Wdown·(gelu_tanh(h·Wgate) * h·Wup))  with h = norm(x)
 *                 x += norm(Wproj·(gelu_tanh(x·Wgate_pl) * pli[l]))
 *                 x *= layer output scale
 *     logits = cap · tanh(norm(x)·Eᵀ / cap)
 *
 * Beyond Gemma 3: per-layer inputs (pli: a second token table and a
 * projection of the embeddings, one ple-wide slice per layer, gathered by
 * gather_cols); sliding and full layers with their own head dims, KV heads
 * and rope dims (the plan's shapes; the KV cache's window group has its own
 * geometry); full layers' rope frequencies divided by a rope_freqs tensor
 * (1e30 stops a pair: partial rotary); V normalized per head without a
 * gain, and V = K's projection in layers without attn_v; the last
 * shared_kv_layers layers compute only q and attend over the K/V of the
 * last earlier layer of their kind (plan.kv_layer); a scalar per layer on
 * its output.  Norms are plain RMSNorm: GGUF files store the gains
 * themselves.  Sliding layers keep only their window (kvcache.h).
 *
 * Mixture-of-experts models (26B-A4B) run a dense MLP and routed experts
 * side by side in every layer, each with its own norms, and add them:
 *
 *     h = norm1(mlp(norm(x))) + norm2(experts(norm_2(x)))
 *     router logits = (rmsnorm(x) · scale / sqrt(dim)) · Wrᵀ, softmax, top k, renormalized
 *
 * with each expert's output times its scale (ffn_down_exps.scale, when
 * present) and gate|up in one stack or two.
 *
 * Every op it calls has a CUDA kernel (gather_cols for the per-layer
 * inputs last); tests/cuda/test_cuda_model.c runs both GGUF fixtures
 * against the CPU.
 * Two FFN widths run (the double-wide MLP: feed_forward_length per layer,
 * config ffn_alt); a third, or head counts per layer, are refused.
 * Hugging Face gemma4_text checkpoints (Gemma4ForCausalLM) load too: the
 * same computation under transformers' names (gemma4_read_json), the full
 * layers' proportional rope as rope factors built at load.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "model/model_int.h"

/* clang-format off */
static const pt_arch gemma4_archs[] = {
    /* name     GGUF name  config.json    GGUF rope     qkv_bias qk_norm */
    {"gemma4",  "gemma4",  "gemma4_text", PT_ROPE_NEOX, false,   true},
};
/* clang-format on */

/* ---- Config -------------------------------------------------------------- */

/* Layer l's value of key in config.json's per_layer_config (where some
 * transformers versions keep the full layers' head_dim and KV heads);
 * false if absent. */
static bool per_layer_int(json_t *j, int l, const char *key, int *out) {
    char name[16];
    snprintf(name, sizeof name, "%d", l);
    json_t *e = json_object_get(json_object_get(j, "per_layer_config"), name);
    return json_is_object(e) && pt_json_int(e, key, out);
}

/* rope_parameters per layer type: sliding layers plain rope over their
 * head dim; full layers transformers' "proportional" rope, whose first
 * partial_rotary_factor * head_dim / 2 pairs rotate at base^(-2i/head_dim)
 * and the rest not at all (rope_rot_pairs; llama.cpp's rope_freqs does
 * the same with factors 1e30). */
static int json_rope(json_t *j, pt_model_config *c, pt_err *err) {
    json_t *rp = json_object_get(j, "rope_parameters");
    json_t *rs = json_object_get(rp, "sliding_attention"), *rf = json_object_get(rp, "full_attention");
    if (!json_is_object(rs) || !json_is_object(rf))
        return pt_fail(err, "config.json: gemma4_text needs rope_parameters for "
                            "sliding_attention and full_attention");
    const char *ts = json_string_value(json_object_get(rs, "rope_type"));
    const char *tf = json_string_value(json_object_get(rf, "rope_type"));
    float factor = 1.0f, frac = 1.0f;
    pt_json_float(rf, "factor", &factor);
    pt_json_float(rf, "partial_rotary_factor", &frac);
    if ((ts && strcmp(ts, "default") != 0) || !tf ||
        (strcmp(tf, "proportional") != 0 && strcmp(tf, "default") != 0) || factor != 1.0f ||
        !(frac > 0 && frac <= 1) || (strcmp(tf, "default") == 0 && frac != 1.0f))
        return pt_fail(err, "config.json: gemma4_text rope (sliding %s, full %s, factor %g, "
                            "partial %g) is not supported: plain sliding rope and unscaled "
                            "proportional full rope only",
                       ts ? ts : "?", tf ? tf : "?", (double)factor, (double)frac);
    c->rope_theta_swa = 10000.0f;
    pt_json_float(rs, "rope_theta", &c->rope_theta_swa);
    if (!pt_json_float(rf, "rope_theta", &c->rope_theta)) c->rope_theta = 1000000.0f;
    c->n_rot = c->head_dim;
    c->n_rot_swa = c->head_dim_swa;
    int pairs = (int)floorf(frac * (float)c->head_dim / 2.0f);
    c->rope_rot_pairs = pairs < c->head_dim / 2 ? pairs : 0;
    return 0;
}

/* transformers' gemma4_text (Gemma4ForCausalLM).  Sliding layers have the
 * config's head_dim and KV heads, full ones global_head_dim and, with
 * attention_k_eq_v (V = K's projection), num_global_key_value_heads; the
 * last num_kv_shared_layers layers reuse earlier K/V and, with
 * use_double_wide_mlp, an FFN twice as wide; enable_moe_block adds the
 * routed experts beside the dense MLP.  Norm gains are stored as they
 * multiply (plain RMSNorm), as in GGUF files. */
static int gemma4_read_json(json_t *j, pt_model_config *c, pt_err *err) {
    if (pt_config_json_common(j, c, err) || pt_config_json_act(j, c, err)) return -1;
    json_t *bidi = json_object_get(j, "use_bidirectional_attention");
    if (c->act != PT_ACT_GELU_TANH || json_is_true(json_object_get(j, "attention_bias")) ||
        (bidi && !json_is_null(bidi)))
        return pt_fail(err, "config.json: gemma4_text with a non-GELU-tanh activation, "
                            "attention_bias or bidirectional attention is not supported");
    if (!json_is_false(json_object_get(j, "tie_word_embeddings"))) c->tied_embeddings = true;
    if (!pt_json_int(j, "sliding_window", &c->sliding_window) || c->sliding_window <= 0 ||
        !json_is_array(json_object_get(j, "layer_types")))
        return pt_fail(err, "config.json: gemma4_text needs sliding_window and layer_types");
    if (pt_config_json_layer_types(j, c, err) < 0) return -1; /* 1: read */
    int full = 0;
    while (full < c->n_layers && pt_config_layer_swa(c, full)) full++;
    bool k_eq_v = json_is_true(json_object_get(j, "attention_k_eq_v"));
    int ghd = 0, gkv = 0;
    if (!pt_json_int(j, "global_head_dim", &ghd)) per_layer_int(j, full, "head_dim", &ghd);
    if (k_eq_v && !pt_json_int(j, "num_global_key_value_heads", &gkv))
        per_layer_int(j, full, "num_key_value_heads", &gkv);
    c->head_dim_swa = c->head_dim;
    c->n_kv_heads_swa = c->n_kv_heads;
    if (ghd > 0) c->head_dim = ghd;
    if (gkv > 0) c->n_kv_heads = gkv;
    if (c->head_dim % 2 || c->head_dim_swa % 2 || c->head_dim > 1024 ||
        c->n_heads % c->n_kv_heads || c->n_heads % c->n_kv_heads_swa)
        return pt_fail(err, "config.json: gemma4_text head shapes out of range (head_dim %d, "
                            "global %d, %d heads over %d / %d KV heads)",
                       c->head_dim_swa, c->head_dim, c->n_heads, c->n_kv_heads_swa,
                       c->n_kv_heads);
    if (json_rope(j, c, err)) return -1;
    json_t *ple = json_object_get(j, "hidden_size_per_layer_input");
    c->ple_dim = json_is_integer(ple) ? (int)json_integer_value(ple) : 0;
    int ple_vocab = c->vocab_size;
    pt_json_int(j, "vocab_size_per_layer_input", &ple_vocab);
    if (c->ple_dim < 0 || c->ple_dim > 65536 || (c->ple_dim > 0 && ple_vocab != c->vocab_size))
        return pt_fail(err, "config.json: per-layer inputs %d wide over %d tokens (the "
                            "vocabulary has %d) are not supported",
                       c->ple_dim, ple_vocab, c->vocab_size);
    int shared = 0;
    pt_json_int(j, "num_kv_shared_layers", &shared);
    if (shared < 0 || shared >= c->n_layers)
        return pt_fail(err, "config.json: %d shared KV layers of %d", shared, c->n_layers);
    c->n_kv_layers = shared ? c->n_layers - shared : 0;
    if (shared && json_is_true(json_object_get(j, "use_double_wide_mlp"))) {
        c->ffn_dim_alt = 2 * c->ffn_dim;
        for (int l = c->n_layers - shared; l < c->n_layers; l++)
            c->ffn_alt[l / 64] |= 1ull << (l % 64);
    }
    for (int l = 0; k_eq_v && l < c->n_layers; l++)
        if (!pt_config_layer_swa(c, l) && pt_config_layer_own_kv(c, l))
            c->v_from_k[l / 64] |= 1ull << (l % 64);
    if (json_is_true(json_object_get(j, "enable_moe_block"))) {
        if (!pt_json_int(j, "num_experts", &c->n_experts) || c->n_experts < 1 ||
            !pt_json_int(j, "top_k_experts", &c->n_experts_used) || c->n_experts_used < 1 ||
            c->n_experts_used > c->n_experts ||
            !pt_json_int(j, "moe_intermediate_size", &c->expert_ffn_dim) || c->expert_ffn_dim < 1)
            return pt_fail(err, "config.json: gemma4_text enable_moe_block needs num_experts, "
                                "top_k_experts (at most num_experts) and moe_intermediate_size");
        c->expert_renorm = true;
    }
    c->final_softcap = 0;
    pt_json_float(j, "final_logit_softcapping", &c->final_softcap);
    if (!(c->final_softcap > 0)) c->final_softcap = 0;
    c->norm = PT_NORM_RMS;
    c->embed_scale = sqrtf((float)c->dim);
    c->attn_scale = 1.0f; /* q and k are normalized: no 1/sqrt(head_dim) */
    c->v_norm = true;
    return 0;
}

/* Hugging Face experts: transformers' fused gate_up stack, or gate and up
 * stacks apart. */
static int gemma4_file_layout(pt_model *m, pt_err *err) {
    (void)err;
    if (m->file->kind == PT_FILE_GGUF || m->cfg.n_experts <= 0 ||
        !pt_model_file_tensor(m->file, "model.layers.0.experts.gate_up_proj"))
        return 0;
    for (int l = 0; l < m->cfg.n_layers && l < 64 * 16; l++)
        m->cfg.experts_fused[l / 64] |= 1ull << (l % 64);
    return 0;
}

/* Layer l's value of a per-layer key written as one number or an array of
 * n_layers; false if absent or malformed. */
static bool layer_int(const pt_gguf *g, const char *garch, const char *key, int l, int n,
                      int *out) {
    char full[128];
    int type;
    uint64_t count;
    int64_t v;
    snprintf(full, sizeof full, "%s.%s", garch, key);
    if (!pt_gguf_get_arr(g, full, &type, &count)) return pt_gguf_int(g, garch, key, out);
    if (count != (uint64_t)n || !pt_gguf_arr_int(g, full, (uint64_t)l, &v) || v < 0 ||
        v > INT32_MAX)
        return false;
    *out = (int)v;
    return true;
}

/* Which layers slide: sliding_window_pattern, one bool per layer. */
static int read_layer_kinds(const pt_gguf *g, const pt_model_file *mf, const char *garch,
                            pt_model_config *c, pt_err *err) {
    char key[128];
    int type;
    uint64_t count;
    snprintf(key, sizeof key, "%s.attention.sliding_window_pattern", garch);
    if (!pt_gguf_int(g, garch, "attention.sliding_window", &c->sliding_window) ||
        c->sliding_window <= 0 || !pt_gguf_get_arr(g, key, &type, &count) ||
        count != (uint64_t)c->n_layers)
        return pt_fail(err, "%s: gemma4 needs attention.sliding_window and a "
                            "sliding_window_pattern of one bool per layer",
                       mf->path);
    c->swa_per_layer = true;
    for (int l = 0; l < c->n_layers; l++) {
        bool swa;
        if (!pt_gguf_arr_bool(g, key, (uint64_t)l, &swa))
            return pt_fail(err, "%s: %s[%d] is not a bool", mf->path, key, l);
        if (swa) pt_config_set_swa(c, l);
    }
    return 0;
}

/* KV heads per layer kind (head_count_kv may be an array): one value per
 * kind, as the KV cache's two groups have one geometry each. */
static int read_kv_heads(const pt_gguf *g, const pt_model_file *mf, const char *garch,
                         pt_model_config *c, pt_err *err) {
    int kinds[2] = {0, 0}; /* full, sliding */
    for (int l = 0; l < c->n_layers; l++) {
        int v, *k = &kinds[pt_config_layer_swa(c, l)];
        if (!layer_int(g, garch, "attention.head_count_kv", l, c->n_layers, &v)) v = c->n_heads;
        if (v <= 0 || (*k && *k != v))
            return pt_fail(err, "%s: layer %d has %d KV heads; per-layer counts that differ "
                                "within a layer kind are not supported",
                           mf->path, l, v);
        *k = v;
    }
    c->n_kv_heads = kinds[0] ? kinds[0] : kinds[1];
    c->n_kv_heads_swa = kinds[1];
    return 0;
}

/* FFN widths per layer (feed_forward_length may be an array): layer 0's
 * and at most one other (the double-wide MLP of the shared-KV layers);
 * head counts must not differ.  Read before the common keys, which then
 * take ffn_dim as set. */
static int read_widths(const pt_gguf *g, const pt_model_file *mf, const char *garch,
                       pt_model_config *c, pt_err *err) {
    int n = 0, heads0 = 0;
    if (!pt_gguf_int(g, garch, "block_count", &n) || n <= 0 || n > 1024) return 0; /* common says */
    for (int l = 0; l < n; l++) {
        int ffn = 0, heads = 0;
        layer_int(g, garch, "feed_forward_length", l, n, &ffn);
        layer_int(g, garch, "attention.head_count", l, n, &heads);
        if (l == 0) c->ffn_dim = ffn, heads0 = heads;
        if (heads != heads0)
            return pt_fail(err, "%s: layer %d has %d heads, layer 0 %d; per-layer head counts "
                                "are not implemented yet",
                           mf->path, l, heads, heads0);
        if (ffn == c->ffn_dim) continue;
        if (c->ffn_dim_alt && ffn != c->ffn_dim_alt)
            return pt_fail(err, "%s: layer %d's FFN width %d is a third one (%d, %d); more than "
                                "two widths are not implemented yet",
                           mf->path, l, ffn, c->ffn_dim, c->ffn_dim_alt);
        c->ffn_dim_alt = ffn;
        c->ffn_alt[l / 64] |= 1ull << (l % 64);
    }
    return 0;
}

/* Experts: every layer has them or none does; which layers keep gate and
 * up in one stack. */
static int read_experts(const pt_gguf *g, const pt_model_file *mf, const char *garch,
                        pt_model_config *c, pt_err *err) {
    int routed = 0;
    for (int l = 0; l < c->n_layers; l++) {
        char name[64];
        snprintf(name, sizeof name, "blk.%d.ffn_gate_inp.weight", l);
        routed += pt_model_file_tensor(mf, name) != NULL;
        snprintf(name, sizeof name, "blk.%d.ffn_gate_up_exps.weight", l);
        if (pt_model_file_tensor(mf, name)) c->experts_fused[l / 64] |= 1ull << (l % 64);
    }
    if (routed == 0) return 0;
    if (routed != c->n_layers)
        return pt_fail(err, "%s: %d of %d layers have experts; a mix of expert and dense layers "
                            "is not implemented yet",
                       mf->path, routed, c->n_layers);
    if (!pt_gguf_int(g, garch, "expert_count", &c->n_experts) ||
        !pt_gguf_int(g, garch, "expert_used_count", &c->n_experts_used) ||
        !pt_gguf_int(g, garch, "expert_feed_forward_length", &c->expert_ffn_dim))
        return pt_fail(err, "%s: gemma4 experts need expert_count, expert_used_count and "
                            "expert_feed_forward_length",
                       mf->path);
    c->expert_renorm = true; /* softmax over all, top k, weights renormalized */
    return 0;
}

static int gemma4_read_gguf(const pt_gguf *g, const pt_model_file *mf, const char *garch,
                            pt_model_config *c, pt_err *err) {
    c->rope_freq_factors = pt_model_file_tensor(mf, "rope_freqs.weight") != NULL;
    if (read_widths(g, mf, garch, c, err) || pt_config_gguf_common(g, mf, garch, c, err) ||
        read_layer_kinds(g, mf, garch, c, err) ||
        read_kv_heads(g, mf, garch, c, err) || read_experts(g, mf, garch, c, err))
        return -1;
    int v_len = c->head_dim, v_len_swa;
    pt_gguf_int(g, garch, "attention.value_length", &v_len);
    if (!pt_gguf_int(g, garch, "attention.key_length_swa", &c->head_dim_swa))
        c->head_dim_swa = c->head_dim;
    v_len_swa = c->head_dim_swa;
    pt_gguf_int(g, garch, "attention.value_length_swa", &v_len_swa);
    if (v_len != c->head_dim || v_len_swa != c->head_dim_swa)
        return pt_fail(err, "%s: gemma4 needs value and key lengths equal (%d/%d, sliding %d/%d)",
                       mf->path, v_len, c->head_dim, v_len_swa, c->head_dim_swa);
    if (!pt_gguf_int(g, garch, "rope.dimension_count_swa", &c->n_rot_swa)) c->n_rot_swa = c->n_rot;
    if (!pt_gguf_float(g, garch, "rope.freq_base_swa", &c->rope_theta_swa))
        c->rope_theta_swa = c->rope_theta;
    if (!pt_gguf_int(g, garch, "embedding_length_per_layer_input", &c->ple_dim))
        return pt_fail(err, "%s: GGUF is missing %s.embedding_length_per_layer_input", mf->path,
                       garch);
    int shared = 0;
    pt_gguf_int(g, garch, "attention.shared_kv_layers", &shared);
    if (shared < 0 || shared >= c->n_layers)
        return pt_fail(err, "%s: %d shared KV layers of %d", mf->path, shared, c->n_layers);
    c->n_kv_layers = shared ? c->n_layers - shared : 0;
    pt_gguf_float(g, garch, "final_logit_softcapping", &c->final_softcap);
    if (!(c->final_softcap > 0)) c->final_softcap = 0;
    /* layers that keep K/V but have no V projection use K's */
    for (int l = 0; l < c->n_layers && l < 64 * 16; l++) {
        char name[64];
        snprintf(name, sizeof name, "blk.%d.attn_v.weight", l);
        if (pt_config_layer_own_kv(c, l) && !pt_model_file_tensor(mf, name))
            c->v_from_k[l / 64] |= 1ull << (l % 64);
    }
    c->act = PT_ACT_GELU_TANH;
    c->norm = PT_NORM_RMS; /* the files store the gains as they multiply */
    c->embed_scale = sqrtf((float)c->dim);
    c->attn_scale = 1.0f; /* q and k are normalized: no 1/sqrt(head_dim) */
    c->v_norm = true;
    return 0;
}

/* ---- Weights ------------------------------------------------------------- */

/* clang-format off */
#define L(f) offsetof(pt_layer, f)
#define M(f) offsetof(pt_model, f)
static const pt_weight_spec gemma4_weights[] = {
    {"token_embd.weight", "model.embed_tokens.weight", D_NONE, D_VOCAB, D_DIM, M(tok_embd), false, NEED_ALWAYS},
    {"output_norm.weight", "model.norm.weight", D_NONE, D_DIM, D_NONE, M(output_norm), false, NEED_ALWAYS},
    {"output.weight", "lm_head.weight", D_NONE, D_VOCAB, D_DIM, M(output), false, NEED_UNTIED},
    {"per_layer_token_embd.weight", "model.embed_tokens_per_layer.weight", D_NONE, D_VOCAB, D_PLE_ALL, M(ple_embd), false, NEED_PLE},
    {"per_layer_model_proj.weight", "model.per_layer_model_projection.weight", D_NONE, D_PLE_ALL, D_DIM, M(ple_model_proj), false, NEED_PLE},
    {"per_layer_proj_norm.weight", "model.per_layer_projection_norm.weight", D_NONE, D_PLE, D_NONE, M(ple_proj_norm), false, NEED_PLE},
    {"rope_freqs.weight", "rope_freqs.weight", D_NONE, D_ROT2, D_NONE, M(rope_freqs), false, NEED_ROPE_FREQS},
    {"blk.%d.attn_norm.weight", "model.layers.%d.input_layernorm.weight", D_NONE, D_DIM, D_NONE, L(attn_norm), true, NEED_ALWAYS},
    {"blk.%d.attn_q.weight", "model.layers.%d.self_attn.q_proj.weight", D_NONE, D_Q, D_DIM, L(wq), true, NEED_ALWAYS},
    {"blk.%d.attn_k.weight", "model.layers.%d.self_attn.k_proj.weight", D_NONE, D_KV, D_DIM, L(wk), true, NEED_OWN_KV},
    {"blk.%d.attn_v.weight", "model.layers.%d.self_attn.v_proj.weight", D_NONE, D_KV, D_DIM, L(wv), true, NEED_V},
    {"blk.%d.attn_output.weight", "model.layers.%d.self_attn.o_proj.weight", D_NONE, D_DIM, D_Q, L(wo), true, NEED_ALWAYS},
    {"blk.%d.attn_q_norm.weight", "model.layers.%d.self_attn.q_norm.weight", D_NONE, D_HEAD, D_NONE, L(q_norm), true, NEED_ALWAYS},
    {"blk.%d.attn_k_norm.weight", "model.layers.%d.self_attn.k_norm.weight", D_NONE, D_HEAD, D_NONE, L(k_norm), true, NEED_OWN_KV},
    {"blk.%d.post_attention_norm.weight", "model.layers.%d.post_attention_layernorm.weight", D_NONE, D_DIM, D_NONE, L(post_attn_norm), true, NEED_ALWAYS},
    {"blk.%d.ffn_norm.weight", "model.layers.%d.pre_feedforward_layernorm.weight", D_NONE, D_DIM, D_NONE, L(ffn_norm), true, NEED_ALWAYS},
    {"blk.%d.ffn_gate.weight", "model.layers.%d.mlp.gate_proj.weight", D_NONE, D_FFN, D_DIM, L(w_gate), true, NEED_DENSE},
    {"blk.%d.ffn_up.weight", "model.layers.%d.mlp.up_proj.weight", D_NONE, D_FFN, D_DIM, L(w_up), true, NEED_DENSE},
    {"blk.%d.ffn_down.weight", "model.layers.%d.mlp.down_proj.weight", D_NONE, D_DIM, D_FFN, L(w_down), true, NEED_DENSE},
    {"blk.%d.post_ffw_norm.weight", "model.layers.%d.post_feedforward_layernorm.weight", D_NONE, D_DIM, D_NONE, L(post_ffn_norm), true, NEED_ALWAYS},
    /* mixture-of-experts layers: the dense MLP lands in the shared expert's place */
    {"blk.%d.ffn_gate.weight", "model.layers.%d.mlp.gate_proj.weight", D_NONE, D_FFN, D_DIM, L(w_sh_gate), true, NEED_MOE},
    {"blk.%d.ffn_up.weight", "model.layers.%d.mlp.up_proj.weight", D_NONE, D_FFN, D_DIM, L(w_sh_up), true, NEED_MOE},
    {"blk.%d.ffn_down.weight", "model.layers.%d.mlp.down_proj.weight", D_NONE, D_DIM, D_FFN, L(w_sh_down), true, NEED_MOE},
    {"blk.%d.post_ffw_norm_1.weight", "model.layers.%d.post_feedforward_layernorm_1.weight", D_NONE, D_DIM, D_NONE, L(post_ffn_norm_1), true, NEED_MOE},
    {"blk.%d.pre_ffw_norm_2.weight", "model.layers.%d.pre_feedforward_layernorm_2.weight", D_NONE, D_DIM, D_NONE, L(ffn_norm_2), true, NEED_MOE},
    {"blk.%d.post_ffw_norm_2.weight", "model.layers.%d.post_feedforward_layernorm_2.weight", D_NONE, D_DIM, D_NONE, L(post_ffn_norm_2), true, NEED_MOE},
    {"blk.%d.ffn_gate_inp.weight", "model.layers.%d.router.proj.weight", D_NONE, D_EXPERTS, D_DIM, L(w_router), true, NEED_MOE},
    {"blk.%d.ffn_gate_inp.scale", "model.layers.%d.router.scale", D_NONE, D_DIM, D_NONE, L(router_gain), true, NEED_MOE},
    {"blk.%d.ffn_gate_exps.weight", "model.layers.%d.experts.gate_proj", D_EXPERTS, D_EFFN, D_DIM, L(w_gate), true, NEED_EXPS_SPLIT},
    {"blk.%d.ffn_up_exps.weight", "model.layers.%d.experts.up_proj", D_EXPERTS, D_EFFN, D_DIM, L(w_up), true, NEED_EXPS_SPLIT},
    {"blk.%d.ffn_gate_up_exps.weight", "model.layers.%d.experts.gate_up_proj", D_EXPERTS, D_EFFN2, D_DIM, L(w_gate_up), true, NEED_EXPS_FUSED},
    {"blk.%d.ffn_down_exps.weight", "model.layers.%d.experts.down_proj", D_EXPERTS, D_DIM, D_EFFN, L(w_down), true, NEED_MOE},
    {"blk.%d.ffn_down_exps.scale", "model.layers.%d.router.per_expert_scale", D_NONE, D_EXPERTS, D_NONE, L(exps_scale), true, NEED_OPTIONAL},
    {"blk.%d.inp_gate.weight", "model.layers.%d.per_layer_input_gate.weight", D_NONE, D_PLE, D_DIM, L(w_ple_gate), true, NEED_PLE},
    {"blk.%d.proj.weight", "model.layers.%d.per_layer_projection.weight", D_NONE, D_DIM, D_PLE, L(w_ple_proj), true, NEED_PLE},
    {"blk.%d.post_norm.weight", "model.layers.%d.post_per_layer_input_norm.weight", D_NONE, D_DIM, D_NONE, L(ple_post_norm), true, NEED_PLE},
    {"blk.%d.layer_output_scale.weight", "model.layers.%d.layer_scalar", D_NONE, D_ONE, D_NONE, L(out_scale), true, NEED_OPTIONAL},
};
#undef L
#undef M
/* clang-format on */

/* A MoE layer's derived weights: gate and up as views of a fused stack
 * (gate first, as llama.cpp splits it), the router's input gain divided
 * by sqrt(dim), and the experts' scales as a stack of 1 x 1 matrices. */
static int finish_experts(pt_model *m, pt_layer *L, float *host, pt_err *err) {
    const pt_model_config *c = &m->cfg;
    if (L->w_gate_up.data) {
        L->w_gate = pt_weight_expert_rows(&L->w_gate_up, 0, c->expert_ffn_dim);
        L->w_up = pt_weight_expert_rows(&L->w_gate_up, c->expert_ffn_dim, c->expert_ffn_dim);
    }
    float *gain = pt_model_alloc(m, sizeof(float) * (size_t)c->dim);
    if (!gain) return pt_fail(err, "out of backend memory");
    m->be->ops->download(m->be, host, L->router_gain, sizeof(float) * (size_t)c->dim);
    for (int i = 0; i < c->dim; i++) host[i] /= sqrtf((float)c->dim);
    m->be->ops->upload(m->be, gain, host, sizeof(float) * (size_t)c->dim);
    L->router_gain = gain;
    if (L->exps_scale)
        L->w_exps_scale = (pt_weight){.dtype = PT_F32, .rows = 1, .cols = 1, .data = L->exps_scale,
                                      .nbytes = sizeof(float) * (size_t)c->n_experts,
                                      .n_experts = c->n_experts, .expert_stride = sizeof(float)};
    return 0;
}

/* Full layers' rope factors from the config's proportional rope: 1 for the
 * pairs that rotate, 1e30 (a frequency of 0) for the rest. */
static int rope_factors(pt_model *m, pt_err *err) {
    int half = m->cfg.n_rot / 2;
    float *f = pt_xmalloc(sizeof(float) * (size_t)half);
    for (int i = 0; i < half; i++) f[i] = i < m->cfg.rope_rot_pairs ? 1.0f : 1e30f;
    float *dev = pt_model_alloc(m, sizeof(float) * (size_t)half);
    if (dev) m->be->ops->upload(m->be, dev, f, sizeof(float) * (size_t)half);
    free(f);
    if (!dev) return pt_fail(err, "out of backend memory");
    m->rope_freqs = dev;
    return 0;
}

/* The host copies the forward needs (each layer's output scale) and V's
 * norm gain: ones, shared by every layer (the norm has no weight). */
static int gemma4_finish(pt_model *m, pt_err *err) {
    const pt_model_config *c = &m->cfg;
    int d = PT_MAX(c->head_dim, c->head_dim_swa);
    float *ones = pt_xmalloc(sizeof(float) * (size_t)d);
    for (int i = 0; i < d; i++) ones[i] = 1.0f;
    float *dev = pt_model_alloc(m, sizeof(float) * (size_t)d);
    if (!dev) {
        free(ones);
        return pt_fail(err, "out of backend memory");
    }
    m->be->ops->upload(m->be, dev, ones, sizeof(float) * (size_t)d);
    free(ones);
    if (c->rope_rot_pairs > 0 && !m->rope_freqs && rope_factors(m, err)) return -1;
    float *host = pt_xmalloc(sizeof(float) * (size_t)c->dim);
    for (int l = 0; l < c->n_layers; l++) {
        pt_layer *L = &m->layers[l];
        L->v_norm = dev;
        L->out_scale_h = 0;
        if (L->out_scale) m->be->ops->download(m->be, &L->out_scale_h, L->out_scale, sizeof(float));
        if (c->n_experts > 0 && finish_experts(m, L, host, err)) {
            free(host);
            return -1;
        }
    }
    free(host);
    if (m->be->ops->sync(m->be)) return pt_be_take_error(m->be, err);
    return 0;
}

/* The per-layer inputs of cap rows (and as much again of scratch), and
 * the column indices that pick one layer's slice of a row. */
static int gemma4_workspace(pt_model *m, int cap, pt_err *err) {
    const pt_model_config *c = &m->cfg;
    if (c->n_experts > 0 &&
        !(m->ws->shared = pt_model_alloc(m, sizeof(float) * (size_t)cap * c->dim)))
        return pt_fail(err, "cannot allocate the dense MLP's output beside the experts'");
    if (c->ple_dim <= 0) return 0;
    size_t w = (size_t)c->n_layers * c->ple_dim;
    if (c->ple_dim > c->ffn_dim || (c->ffn_dim_alt && c->ple_dim > c->ffn_dim_alt))
        return pt_fail(err, "gemma4: per-layer input width %d exceeds an FFN width (%d, %d)",
                       c->ple_dim, c->ffn_dim, c->ffn_dim_alt);
    m->ws->ple = pt_model_alloc(m, 2 * (size_t)cap * w * sizeof(float));
    m->ws->idx_ple = pt_model_alloc(m, w * sizeof(int32_t));
    if (!m->ws->ple || !m->ws->idx_ple)
        return pt_fail(err, "cannot allocate %.1f MiB for per-layer inputs",
                       2.0 * cap * w * 4 / 1048576.0);
    int32_t *idx = pt_xmalloc(w * sizeof(int32_t));
    for (size_t i = 0; i < w; i++) idx[i] = (int32_t)i;
    m->be->ops->upload(m->be, m->ws->idx_ple, idx, w * sizeof(int32_t));
    free(idx);
    return 0;
}

/* ---- Forward ------------------------------------------------------------- */

/* ws->ple = (norm(x·Wpli / sqrt(dim)) + embed_pl(tokens) · sqrt(ple)) / sqrt(2),
 * rows of [n_layers][ple]; x is the scaled embeddings. */
static void per_layer_inputs(pt_model *m, const pt_step *s) {
    pt_backend *be = m->be;
    const pt_model_config *c = &m->cfg;
    pt_workspace *ws = m->ws;
    size_t w = (size_t)c->n_layers * c->ple_dim, count = (size_t)s->n * w;
    float *tok = ws->ple + (size_t)ws->cap * w;

    pt_be_matmul(be, ws->ple, ws->x, &m->ple_model_proj, s->n);
    pt_be_scale(be, ws->ple, 1.0f / sqrtf((float)c->dim), count);
    pt_be_rmsnorm(be, ws->ple, ws->ple, m->ple_proj_norm, s->n * c->n_layers, c->ple_dim,
                  c->norm_eps);
    pt_be_embed(be, tok, &m->ple_embd, ws->tokens, s->n);
    pt_be_scale(be, tok, sqrtf((float)c->ple_dim), count);
    pt_be_add(be, ws->ple, ws->ple, tok, count);
    pt_be_scale(be, ws->ple, 1.0f / sqrtf(2.0f), count);
}

/* q = rope(norm(h·Wq)); a layer keeping K/V also k = rope(norm(h·Wk)) and
 * v = norm(h·Wv) (or of h·Wk without attn_v), per head, its plan's shapes. */
static void qkv(pt_model *m, int l, const pt_step *s) {
    pt_backend *be = m->be;
    const pt_model_config *c = &m->cfg;
    const pt_layer_plan *p = &m->plan[l];
    const pt_layer *L = &m->layers[l];
    pt_workspace *ws = m->ws;
    int n = s->n, hd = p->head_dim, nkv = p->n_kv_heads;

    pt_be_matmul(be, ws->q, ws->h, &L->wq, n);
    pt_be_rmsnorm(be, ws->q, ws->q, L->q_norm, n * c->n_heads, hd, c->norm_eps);
    pt_be_rope(be, ws->q, s->b, c->n_heads, hd, &p->rope);
    if (p->kv_layer != l) return; /* it reads an earlier layer's K/V */
    pt_be_matmul(be, ws->k, ws->h, &L->wk, n);
    if (L->wv.data)
        pt_be_matmul(be, ws->v, ws->h, &L->wv, n);
    else
        be->ops->copy(be, ws->v, ws->k, sizeof(float) * (size_t)n * nkv * hd);
    pt_be_rmsnorm(be, ws->k, ws->k, L->k_norm, n * nkv, hd, c->norm_eps);
    pt_be_rmsnorm(be, ws->v, ws->v, L->v_norm, n * nkv, hd, c->norm_eps);
    pt_be_rope(be, ws->k, s->b, nkv, hd, &p->rope);
}

/* x += norm(Wproj·(gelu_tanh(x·Wgate_pl) * pli[l])): the layer's slice of
 * the per-layer inputs, gathered into up. */
static void per_layer_input(pt_model *m, int l, const pt_step *s) {
    pt_backend *be = m->be;
    const pt_model_config *c = &m->cfg;
    const pt_layer *L = &m->layers[l];
    pt_workspace *ws = m->ws;
    int n = s->n, P = c->ple_dim;

    pt_be_matmul(be, ws->gate, ws->x, &L->w_ple_gate, n);
    pt_be_gather_cols(be, ws->up, ws->ple, ws->idx_ple + (size_t)l * P, n, c->n_layers * P, P);
    pt_be_geglu(be, ws->gate, ws->gate, ws->up, (size_t)n * P);
    pt_be_matmul(be, ws->h, ws->gate, &L->w_ple_proj, n);
    pt_block_norm(m, s, ws->h, ws->h, L->ple_post_norm);
    pt_block_residual(m, s);
}

/* h = act(h·Wgate) * h·Wup, ·Wdown with the MoE layer's dense MLP. */
static void dense_mlp(pt_model *m, int l, const pt_step *s) {
    pt_backend *be = m->be;
    const pt_layer *L = &m->layers[l];
    pt_workspace *ws = m->ws;
    pt_be_matmul(be, ws->gate, ws->h, &L->w_sh_gate, s->n);
    pt_be_matmul(be, ws->up, ws->h, &L->w_sh_up, s->n);
    pt_be_geglu(be, ws->gate, ws->gate, ws->up, (size_t)s->n * m->plan[l].ffn_dim);
    pt_be_matmul(be, ws->h, ws->gate, &L->w_sh_down, s->n);
}

/* h = the routed experts' weighted sum for the rows of x (see the top).
 * An expert's output scale multiplies its routing weight: matmul_id with
 * the scales as 1 x 1 matrices gives weight[t][j] · scale[ids[t][j]]. */
static void experts(pt_model *m, int l, const pt_step *s) {
    pt_backend *be = m->be;
    const pt_model_config *c = &m->cfg;
    const pt_layer *L = &m->layers[l];
    pt_workspace *ws = m->ws;
    int n = s->n, k = c->n_experts_used, f = c->expert_ffn_dim;
    const float *w = ws->moe_w;

    pt_block_norm(m, s, ws->h, ws->x, L->router_gain);
    pt_be_matmul(be, ws->router, ws->h, &L->w_router, n);
    pt_be_moe_route(be, ws->moe_ids, ws->moe_w, ws->router, n, c->n_experts, k, true);
    if (L->exps_scale) { /* router's logits are spent: it holds the scaled weights */
        pt_be_matmul_id(be, ws->router, ws->moe_w, &L->w_exps_scale, ws->moe_ids, n, k, k);
        w = ws->router;
    }
    pt_block_norm(m, s, ws->h, ws->x, L->ffn_norm_2);
    pt_be_matmul_id(be, ws->gate, ws->h, &L->w_gate, ws->moe_ids, n, k, 1);
    pt_be_matmul_id(be, ws->up, ws->h, &L->w_up, ws->moe_ids, n, k, 1);
    pt_be_geglu(be, ws->gate, ws->gate, ws->up, (size_t)n * k * f);
    pt_be_matmul_id(be, ws->moe_out, ws->gate, &L->w_down, ws->moe_ids, n, k, k);
    pt_be_moe_combine(be, ws->h, ws->moe_out, w, n, k, c->dim);
}

/* h = norm1(mlp(norm(x))) + norm2(experts(x)): a MoE layer's FFN. */
static void moe_ffn(pt_model *m, int l, const pt_step *s) {
    const pt_layer *L = &m->layers[l];
    pt_workspace *ws = m->ws;
    size_t count = (size_t)s->n * m->cfg.dim;

    pt_block_norm(m, s, ws->h, ws->x, L->ffn_norm);
    dense_mlp(m, l, s);
    pt_block_norm(m, s, ws->shared, ws->h, L->post_ffn_norm_1);
    experts(m, l, s);
    pt_block_norm(m, s, ws->h, ws->h, L->post_ffn_norm_2);
    pt_be_add(m->be, ws->h, ws->h, ws->shared, count);
}

static void gemma4_layer(pt_model *m, int l, const pt_step *s) {
    const pt_layer *L = &m->layers[l];
    pt_workspace *ws = m->ws;

    pt_block_norm(m, s, ws->h, ws->x, L->attn_norm);
    qkv(m, l, s);
    pt_block_attention(m, l, s);
    pt_block_norm(m, s, ws->h, ws->h, L->post_attn_norm);
    pt_block_residual(m, s);

    if (m->plan[l].ffn == PT_FFN_MOE) {
        moe_ffn(m, l, s);
    } else {
        pt_block_norm(m, s, ws->h, ws->x, L->ffn_norm);
        pt_block_ffn(m, l, s);
    }
    pt_block_norm(m, s, ws->h, ws->h, L->post_ffn_norm);
    pt_block_residual(m, s);

    if (m->cfg.ple_dim > 0) per_layer_input(m, l, s);
    if (L->out_scale_h != 0)
        pt_be_scale(m->be, ws->x, L->out_scale_h, (size_t)s->n * m->cfg.dim);
}

static void gemma4_forward(pt_model *m, const pt_step *s) {
    pt_block_embed(m, s);
    if (m->cfg.ple_dim > 0) per_layer_inputs(m, s);
    for (int l = 0; l < m->cfg.n_layers; l++)
        gemma4_layer(m, l, s);
    pt_block_output(m, s);
}

const pt_family pt_family_gemma4 = {
    .name = "gemma4",
    .archs = gemma4_archs,
    .n_archs = PT_ARRAY_LEN(gemma4_archs),
    .read_json = gemma4_read_json,
    .read_gguf = gemma4_read_gguf,
    .weights = gemma4_weights,
    .n_weights = PT_ARRAY_LEN(gemma4_weights),
    .moe = true,
    .workspace = gemma4_workspace,
    .file_layout = gemma4_file_layout,
    .finish = gemma4_finish,
    .forward = gemma4_forward,
};
