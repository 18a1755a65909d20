/*
 * registry.c - which model families we run, and how their files describe
 * them.
 *
 * One row per family (model_int.h: pt_family): the architectures it
 * answers to in GGUF (general.architecture) and config.json (model_type),
 * its config reader, weight table and forward.  A file's architecture name
 * picks the family and its pt_arch row; apply_arch() copies the row's flags
 * into the config, then the family reads its keys.  The hyperparameters
 * most families write the same way are read by the common readers here,
 * which the families' readers call.
 */
#include <math.h>
#include <stdio.h>

#include "model/model_int.h"
#include "quant/mlx_config.h"

const pt_family *const pt_families[] = {&pt_family_llama,     &pt_family_qwen3moe,
                                         &pt_family_gemma,     &pt_family_gemma4,
                                         &pt_family_gptoss,    &pt_family_qwen3next,
                                         &pt_family_qwen35,    &pt_family_deepseek,
                                         &pt_family_minicpm3};
const size_t pt_n_families = PT_ARRAY_LEN(pt_families);

/* "llama, mistral, ...": every architecture in the table that files of
 * that kind (GGUF or config.json) name, as they name it, so adding a row
 * is the only edit. */
static const char *supported_list(char *buf, size_t cap, bool gguf) {
    buf[0] = 0;
    for (size_t f = 0; f < pt_n_families; f++)
        for (size_t a = 0; a < pt_families[f]->n_archs; a++) {
            const pt_arch *r = &pt_families[f]->archs[a];
            const char *name = gguf ? r->gguf_arch : r->hf_type;
            if (!name) continue;
            if (buf[0]) strncat(buf, ", ", cap - strlen(buf) - 1);
            strncat(buf, name, cap - strlen(buf) - 1);
        }
    return buf;
}

/* The arch row whose GGUF (gguf) or config.json name is name, or NULL. */
static const pt_arch *find_arch(const char *name, bool gguf, const pt_family **family) {
    for (size_t f = 0; f < pt_n_families; f++)
        for (size_t i = 0; i < pt_families[f]->n_archs; i++) {
            const pt_arch *a = &pt_families[f]->archs[i];
            const char *n = gguf ? a->gguf_arch : a->hf_type;
            if (n && strcmp(n, name) == 0) return *family = pt_families[f], a;
        }
    return NULL;
}

const pt_family *pt_family_of(const char *arch) {
    for (size_t f = 0; f < pt_n_families; f++)
        for (size_t i = 0; i < pt_families[f]->n_archs; i++)
            if (strcmp(pt_families[f]->archs[i].name, arch) == 0) return pt_families[f];
    return NULL;
}

/* GGUF stores q/k permuted for adjacent-pair rope; Hugging Face files use
 * rotate_half (neox) whatever the architecture. */
static void apply_arch(pt_model_config *c, const pt_arch *a, bool gguf) {
    snprintf(c->arch, sizeof c->arch, "%s", a->name);
    c->rope_style = gguf ? a->gguf_rope_style : PT_ROPE_NEOX;
    c->qkv_bias = a->qkv_bias;
    c->qk_norm = a->qk_norm;
}

static int check_shapes(pt_model_config *c, pt_err *err) {
    if (c->dim <= 0 || c->n_layers <= 0 || c->n_heads <= 0 || c->n_kv_heads <= 0 ||
        c->head_dim <= 0 || c->ffn_dim <= 0 || c->vocab_size <= 0)
        return pt_fail(err, "model config: a dimension is missing or not positive (dim %d, "
                            "layers %d, heads %d, kv heads %d, head dim %d, ffn %d, vocab %d)",
                       c->dim, c->n_layers, c->n_heads, c->n_kv_heads, c->head_dim, c->ffn_dim,
                       c->vocab_size);
    if (c->n_heads % c->n_kv_heads)
        return pt_fail(err, "model config: %d attention heads is not a multiple of %d KV heads",
                       c->n_heads, c->n_kv_heads);
    if (c->n_rot <= 0 || c->n_rot > c->head_dim || c->n_rot % 2)
        return pt_fail(err, "model config: rope dimension %d does not fit head dim %d", c->n_rot,
                       c->head_dim);
    if (c->dim > 1 << 16 || c->ffn_dim > 1 << 20 || c->n_layers > 1024 || c->vocab_size > 1 << 22 ||
        c->head_dim > 1024 || c->n_heads > 1024)
        return pt_fail(err, "model config: implausible dimensions (dim %d, ffn %d, layers %d)",
                       c->dim, c->ffn_dim, c->n_layers);
    int hd_swa = c->head_dim_swa > 0 ? c->head_dim_swa : c->head_dim;
    int kv_swa = c->n_kv_heads_swa > 0 ? c->n_kv_heads_swa : c->n_kv_heads;
    int rot_swa = c->n_rot_swa > 0 ? c->n_rot_swa : c->n_rot;
    if (hd_swa > 1024 || c->n_heads % kv_swa || rot_swa > hd_swa || rot_swa % 2 ||
        c->ffn_dim_alt < 0 || c->ffn_dim_alt > 1 << 20 ||
        c->ple_dim < 0 || c->ple_dim > 1 << 16 || c->n_kv_layers < 0 ||
        c->n_kv_layers > c->n_layers)
        return pt_fail(err, "model config: sliding layers' shapes (head dim %d, %d KV heads, "
                            "rope dims %d), the second FFN width %d, per-layer input width %d "
                            "or shared KV layers %d do not fit",
                       hd_swa, kv_swa, rot_swa, c->ffn_dim_alt, c->ple_dim, c->n_kv_layers);
    if (c->n_experts < 0 || c->n_experts > 1024 || c->n_experts_used < 0 ||
        c->n_experts_used > c->n_experts)
        return pt_fail(err, "model config: %d experts with %d per token is not a valid mixture",
                       c->n_experts, c->n_experts_used);
    if (c->n_experts > 0 && (c->n_experts_used <= 0 || c->expert_ffn_dim <= 0 ||
                             c->expert_ffn_dim > 1 << 20))
        return pt_fail(err, "model config: %d experts need a per-token count and an expert FFN "
                            "size (have %d per token, size %d)",
                       c->n_experts, c->n_experts_used, c->expert_ffn_dim);
    if (!(c->norm_eps > 0) || !(c->rope_theta > 0))
        return pt_fail(err, "model config: norm epsilon and rope theta must be positive");
    if (c->max_ctx <= 0) c->max_ctx = 4096;
    if (c->rope_scaling == PT_ROPE_SCALING_LONGROPE && c->rope_n_ext != c->n_rot / 2)
        return pt_fail(err, "model config: %d LongRoPE factors for %d rope dims (want %d)",
                       c->rope_n_ext, c->n_rot, c->n_rot / 2);
    return 0;
}

/* YaRN's get_mscale. */
static double yarn_mscale(double scale, double m) {
    return scale <= 1 ? 1.0 : 0.1 * m * log(scale) + 1.0;
}

/* ---- GGUF ---------------------------------------------------------------- */

/* A per-layer array whose entries are all equal reads as that number
 * (llama.cpp's converters write some keys per layer). */
static bool uniform_int_array(const pt_gguf *g, const char *key, int64_t *v) {
    int type;
    uint64_t count;
    if (!pt_gguf_get_arr(g, key, &type, &count) || count == 0 || !pt_gguf_arr_int(g, key, 0, v))
        return false;
    for (uint64_t i = 1; i < count; i++) {
        int64_t e;
        if (!pt_gguf_arr_int(g, key, i, &e) || e != *v) return false;
    }
    return true;
}

bool pt_gguf_int(const pt_gguf *g, const char *garch, const char *key, int *out) {
    char full[128];
    int64_t v;
    snprintf(full, sizeof full, "%s.%s", garch, key);
    if (!pt_gguf_get_int(g, full, &v) && !uniform_int_array(g, full, &v)) return false;
    if (v < INT32_MIN || v > INT32_MAX) return false;
    *out = (int)v;
    return true;
}

bool pt_gguf_float(const pt_gguf *g, const char *garch, const char *key, float *out) {
    char full[128];
    double v;
    snprintf(full, sizeof full, "%s.%s", garch, key);
    if (!pt_gguf_get_float(g, full, &v)) return false;
    *out = (float)v;
    return true;
}

/* YaRN as llama.cpp reads a GGUF: the original context from
 * rope.scaling.original_context_length, the correction range in rotations
 * (yarn_beta_fast / _slow, default 32 / 1) rounded outwards, as ggml always
 * does (ggml_rope_yarn_corr_dims), and cos/sin scaled by 0.1 ln(factor) + 1
 * times rope.scaling.attn_factor.  yarn_log_multiplier (DeepSeek's mscale)
 * is refused rather than ignored. */
static int yarn_gguf(const pt_gguf *g, const pt_model_file *mf, const char *arch, float factor,
                     pt_model_config *c, pt_err *err) {
    float v;
    if (pt_gguf_float(g, arch, "rope.scaling.yarn_log_multiplier", &v) && v != 0)
        return pt_fail(err, "%s: yarn rope with yarn_log_multiplier is not supported", mf->path);
    if (!(factor > 0) || !pt_gguf_int(g, arch, "rope.scaling.original_context_length",
                                      &c->rope_orig_ctx) || c->rope_orig_ctx <= 0)
        return pt_fail(err, "%s: yarn rope needs %s.rope.scaling.factor and "
                            "rope.scaling.original_context_length",
                       mf->path, arch);
    c->rope_scaling = PT_ROPE_SCALING_YARN;
    c->rope_factor = factor;
    c->rope_beta_fast = 32, c->rope_beta_slow = 1;
    pt_gguf_float(g, arch, "rope.scaling.yarn_beta_fast", &c->rope_beta_fast);
    pt_gguf_float(g, arch, "rope.scaling.yarn_beta_slow", &c->rope_beta_slow);
    c->rope_yarn_truncate = true;
    float attn = 1;
    pt_gguf_float(g, arch, "rope.scaling.attn_factor", &attn);
    c->rope_mscale = (float)yarn_mscale(factor, 1.0) * attn;
    return 0;
}

int pt_config_gguf_common(const pt_gguf *g, const pt_model_file *mf, const char *arch,
                          pt_model_config *c, pt_err *err) {
    static const struct {
        const char *key;
        size_t off;
    } req[] = {
        {"embedding_length", offsetof(pt_model_config, dim)},
        {"block_count", offsetof(pt_model_config, n_layers)},
        {"attention.head_count", offsetof(pt_model_config, n_heads)},
    };
    /* a family that read one itself (a per-layer array) has set it */
    for (size_t i = 0; i < PT_ARRAY_LEN(req); i++)
        if (*(int *)((char *)c + req[i].off) <= 0 &&
            !pt_gguf_int(g, arch, req[i].key, (int *)((char *)c + req[i].off)))
            return pt_fail(err, "%s: GGUF is missing %s.%s", mf->path, arch, req[i].key);
    /* a model whose every FFN is experts may give only the experts' size;
     * a family that read per-layer widths itself has set ffn_dim */
    if (c->ffn_dim <= 0 && !pt_gguf_int(g, arch, "feed_forward_length", &c->ffn_dim) &&
        !pt_gguf_int(g, arch, "expert_feed_forward_length", &c->ffn_dim))
        return pt_fail(err, "%s: GGUF is missing %s.feed_forward_length", mf->path, arch);
    if (!pt_gguf_int(g, arch, "attention.head_count_kv", &c->n_kv_heads))
        c->n_kv_heads = c->n_heads;
    if (!pt_gguf_int(g, arch, "attention.key_length", &c->head_dim))
        c->head_dim = c->n_heads ? c->dim / c->n_heads : 0;
    if (!pt_gguf_int(g, arch, "rope.dimension_count", &c->n_rot)) c->n_rot = c->head_dim;
    if (!pt_gguf_int(g, arch, "context_length", &c->max_ctx)) c->max_ctx = 4096;
    if (!pt_gguf_float(g, arch, "attention.layer_norm_rms_epsilon", &c->norm_eps))
        c->norm_eps = 1e-5f;
    if (!pt_gguf_float(g, arch, "rope.freq_base", &c->rope_theta)) c->rope_theta = 10000.0f;

    pt_gguf_str st;
    char key[128];
    snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
    /* a family that read its own rope scaling (DeepSeek's YaRN) set it already */
    if (c->rope_scaling == PT_ROPE_SCALING_NONE && pt_gguf_get_str(g, key, &st)) {
        float factor = 1;
        pt_gguf_float(g, arch, "rope.scaling.factor", &factor);
        if (st.len == 6 && memcmp(st.s, "linear", 6) == 0) {
            c->rope_scaling = PT_ROPE_SCALING_LINEAR;
            c->rope_factor = factor;
        } else if (st.len == 4 && memcmp(st.s, "yarn", 4) == 0) {
            if (yarn_gguf(g, mf, arch, factor, c, err)) return -1;
        } else if (!(st.len == 4 && memcmp(st.s, "none", 4) == 0)) {
            return pt_fail(err, "%s: rope scaling '%.*s' is not supported", mf->path,
                           (int)PT_MIN(st.len, 32), st.s);
        }
    }
    /* Llama 3.1 GGUFs carry the scaled frequencies as a tensor instead
     * (families that apply such factors say so first: Gemma 4). */
    if (!c->rope_freq_factors && pt_model_file_tensor(mf, "rope_freqs.weight"))
        return pt_fail(err, "%s: rope_freqs tensor (Llama 3.1 GGUF scaling) is not supported yet; "
                            "load the Hugging Face directory instead",
                       mf->path);

    /* The vocabulary size is the embedding's row count. */
    const pt_tensor_info *emb = pt_model_file_tensor(mf, "token_embd.weight");
    if (!emb || emb->ndim != 2) return pt_fail(err, "%s: missing tensor token_embd.weight", mf->path);
    c->vocab_size = (int)emb->shape[0];
    c->tied_embeddings = pt_model_file_tensor(mf, "output.weight") == NULL;
    return 0;
}

static int config_from_gguf(const pt_gguf *g, const pt_model_file *mf, pt_model_config *c,
                            pt_err *err) {
    pt_gguf_str s;
    char arch[32];
    if (!pt_gguf_get_str(g, "general.architecture", &s))
        return pt_fail(err, "%s: GGUF has no general.architecture", mf->path);
    snprintf(arch, sizeof arch, "%.*s", (int)PT_MIN(s.len, 31), s.s);
    const pt_family *f;
    const pt_arch *a = find_arch(arch, true, &f);
    char list[256];
    if (!a)
        return pt_fail(err, "%s: architecture '%s' is not supported (supported: %s)", mf->path,
                       arch, supported_list(list, sizeof list, true));
    apply_arch(c, a, true);
    if (f->read_gguf(g, mf, arch, c, err)) return -1;
    return check_shapes(c, err);
}

/* ---- config.json --------------------------------------------------------- */

bool pt_json_int(json_t *o, const char *key, int *out) {
    json_t *v = json_object_get(o, key);
    if (!json_is_integer(v)) return false;
    json_int_t x = json_integer_value(v);
    if (x < INT32_MIN || x > INT32_MAX) return false;
    *out = (int)x;
    return true;
}

bool pt_json_float(json_t *o, const char *key, float *out) {
    json_t *v = json_object_get(o, key);
    if (!json_is_number(v)) return false;
    *out = (float)json_number_value(v);
    return true;
}

/* YaRN as transformers' _compute_yarn_parameters reads it: the attention
 * factor is given, or from mscale / mscale_all_dim, or 0.1 ln(factor) + 1. */
static int yarn_json(json_t *rs, pt_model_config *c, pt_err *err) {
    c->rope_scaling = PT_ROPE_SCALING_YARN;
    if (!pt_json_int(rs, "original_max_position_embeddings", &c->rope_orig_ctx) ||
        c->rope_orig_ctx <= 0 || !(c->rope_factor > 0))
        return pt_fail(err, "config.json: yarn rope_scaling needs a factor and "
                            "original_max_position_embeddings");
    if (!pt_json_float(rs, "beta_fast", &c->rope_beta_fast) || c->rope_beta_fast == 0)
        c->rope_beta_fast = 32;
    if (!pt_json_float(rs, "beta_slow", &c->rope_beta_slow) || c->rope_beta_slow == 0)
        c->rope_beta_slow = 1;
    c->rope_yarn_truncate = !json_is_false(json_object_get(rs, "truncate"));
    float af, ms = 0, ms_all = 0;
    pt_json_float(rs, "mscale", &ms);
    pt_json_float(rs, "mscale_all_dim", &ms_all);
    if (pt_json_float(rs, "attention_factor", &af))
        c->rope_mscale = af;
    else if (ms != 0 && ms_all != 0)
        c->rope_mscale = (float)(yarn_mscale(c->rope_factor, ms) / yarn_mscale(c->rope_factor, ms_all));
    else
        c->rope_mscale = (float)yarn_mscale(c->rope_factor, 1.0);
    return 0;
}

/* LongRoPE as the MiniCPM3 and Phi-3 Hub code and transformers compute it:
 * the short factors while a sequence stays within
 * original_max_position_embeddings, the long ones past it, and cos and sin
 * times sqrt(1 + ln(max / original) / ln(original)).  The table is chosen
 * at load, so a model whose trained context reaches past the original one
 * (where the choice depends on the sequence) is refused; within it the
 * attention factor is 1 (or the config's attention_factor). */
static int longrope_json(json_t *rs, pt_model_config *c, pt_err *err) {
    int orig = c->max_ctx;
    pt_json_int(rs, "original_max_position_embeddings", &orig);
    if (orig < c->max_ctx)
        return pt_fail(err, "config.json: longrope with original_max_position_embeddings %d "
                            "below max_position_embeddings %d is not supported (the factors "
                            "would change with the sequence's length)",
                       orig, c->max_ctx);
    json_t *f = json_object_get(rs, "short_factor");
    size_t n = json_array_size(f);
    if (!json_is_array(f) || n == 0 || n > PT_ROPE_EXT_MAX ||
        json_array_size(json_object_get(rs, "long_factor")) != n)
        return pt_fail(err, "config.json: longrope needs short_factor and long_factor of one "
                            "length, at most %d",
                       PT_ROPE_EXT_MAX);
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_array_get(f, i);
        c->rope_ext[i] = (float)json_number_value(v);
        if (!json_is_number(v) || !(c->rope_ext[i] > 0))
            return pt_fail(err, "config.json: longrope short_factor[%zu] is not a positive "
                                "number",
                           i);
    }
    c->rope_n_ext = (int)n;
    c->rope_scaling = PT_ROPE_SCALING_LONGROPE;
    c->rope_orig_ctx = orig;
    c->rope_mscale = 1.0f;
    pt_json_float(rs, "attention_factor", &c->rope_mscale);
    return 0;
}

int pt_rope_scaling_json(json_t *rs, pt_model_config *c, pt_err *err) {
    if (!rs || json_is_null(rs)) return 0;
    if (!json_is_object(rs)) return pt_fail(err, "config.json: rope_scaling is not an object");
    const char *type = json_string_value(json_object_get(rs, "rope_type"));
    if (!type) type = json_string_value(json_object_get(rs, "type"));
    if (!type || strcmp(type, "default") == 0) return 0;
    if (strcmp(type, "longrope") == 0) return longrope_json(rs, c, err);
    if (!pt_json_float(rs, "factor", &c->rope_factor))
        return pt_fail(err, "config.json: rope_scaling has no factor");
    if (strcmp(type, "linear") == 0) {
        c->rope_scaling = PT_ROPE_SCALING_LINEAR;
        return 0;
    }
    if (strcmp(type, "llama3") == 0) {
        c->rope_scaling = PT_ROPE_SCALING_LLAMA3;
        if (!pt_json_float(rs, "low_freq_factor", &c->rope_low_freq_factor) ||
            !pt_json_float(rs, "high_freq_factor", &c->rope_high_freq_factor) ||
            !pt_json_int(rs, "original_max_position_embeddings", &c->rope_orig_ctx))
            return pt_fail(err, "config.json: llama3 rope_scaling needs low_freq_factor, "
                                "high_freq_factor and original_max_position_embeddings");
        if (!(c->rope_high_freq_factor > c->rope_low_freq_factor) || c->rope_orig_ctx <= 0)
            return pt_fail(err, "config.json: llama3 rope_scaling factors out of range");
        return 0;
    }
    if (strcmp(type, "yarn") == 0) return yarn_json(rs, c, err);
    return pt_fail(err, "config.json: rope scaling '%s' is not supported (supported: linear, "
                        "llama3, yarn, longrope)",
                   type);
}

int pt_config_json_common(json_t *j, pt_model_config *c, pt_err *err) {
    static const struct {
        const char *key;
        size_t off;
    } req[] = {
        {"hidden_size", offsetof(pt_model_config, dim)},
        {"num_hidden_layers", offsetof(pt_model_config, n_layers)},
        {"num_attention_heads", offsetof(pt_model_config, n_heads)},
        {"intermediate_size", offsetof(pt_model_config, ffn_dim)},
        {"vocab_size", offsetof(pt_model_config, vocab_size)},
    };
    for (size_t i = 0; i < PT_ARRAY_LEN(req); i++)
        if (!pt_json_int(j, req[i].key, (int *)((char *)c + req[i].off)))
            return json_is_integer(json_object_get(j, req[i].key))
                       ? pt_fail(err, "config.json: %s %lld is out of range", req[i].key,
                                 (long long)json_integer_value(json_object_get(j, req[i].key)))
                       : pt_fail(err, "config.json: missing or non-integer %s", req[i].key);
    if (!pt_json_int(j, "num_key_value_heads", &c->n_kv_heads)) c->n_kv_heads = c->n_heads;
    if (!pt_json_int(j, "head_dim", &c->head_dim))
        c->head_dim = c->n_heads ? c->dim / c->n_heads : 0;
    c->n_rot = c->head_dim;
    if (!pt_json_int(j, "max_position_embeddings", &c->max_ctx)) c->max_ctx = 4096;
    if (!pt_json_float(j, "rms_norm_eps", &c->norm_eps)) c->norm_eps = 1e-6f;
    /* transformers >= 5 writes rope settings under rope_parameters; older
     * configs have rope_theta and rope_scaling at the top level. */
    json_t *rp = json_object_get(j, "rope_parameters");
    if (!pt_json_float(j, "rope_theta", &c->rope_theta) &&
        !(json_is_object(rp) && pt_json_float(rp, "rope_theta", &c->rope_theta)))
        c->rope_theta = 10000.0f;
    c->tied_embeddings = json_is_true(json_object_get(j, "tie_word_embeddings"));
    json_t *rs = json_object_get(j, "rope_scaling");
    return pt_rope_scaling_json(rs && !json_is_null(rs) ? rs : rp, c, err);
}

void pt_config_set_swa(pt_model_config *c, int l) {
    c->swa_per_layer = true;
    c->swa_layers[l / 64] |= (uint64_t)1 << (l % 64);
}

int pt_config_json_layer_types(json_t *j, pt_model_config *c, pt_err *err) {
    json_t *types = json_object_get(j, "layer_types");
    if (!json_is_array(types)) return 0;
    if ((int)json_array_size(types) != c->n_layers || c->n_layers > 64 * 16)
        return pt_fail(err, "config.json: %zu layer_types for %d layers", json_array_size(types),
                       c->n_layers);
    c->swa_per_layer = true;
    for (int l = 0; l < c->n_layers; l++) {
        const char *t = json_string_value(json_array_get(types, (size_t)l));
        if (t && strcmp(t, "sliding_attention") == 0)
            pt_config_set_swa(c, l);
        else if (!t || strcmp(t, "full_attention") != 0)
            return pt_fail(err, "config.json: layer_types[%d] '%s' is not supported "
                                "(sliding_attention, full_attention)",
                           l, t ? t : "?");
    }
    return 1;
}

int pt_config_json_act(json_t *j, pt_model_config *c, pt_err *err) {
    const char *act = json_string_value(json_object_get(j, "hidden_act"));
    if (!act) act = json_string_value(json_object_get(j, "hidden_activation")); /* Gemma */
    if (!act || strcmp(act, "silu") == 0)
        c->act = PT_ACT_SILU;
    else if (strcmp(act, "gelu_pytorch_tanh") == 0)
        c->act = PT_ACT_GELU_TANH;
    else
        return pt_fail(err, "config.json: hidden_act '%s' is not supported (silu, "
                            "gelu_pytorch_tanh)",
                       act);
    return 0;
}

int pt_config_from_json(json_t *j, pt_model_config *c, pt_err *err) {
    memset(c, 0, sizeof *c);
    const char *type = json_string_value(json_object_get(j, "model_type"));
    if (!type) return pt_fail(err, "config.json: no model_type");
    const pt_family *f;
    const pt_arch *a = find_arch(type, false, &f);
    char list[256];
    if (!a)
        return pt_fail(err, "config.json: model_type '%s' is not supported (supported: %s)", type,
                       supported_list(list, sizeof list, false));
    apply_arch(c, a, false);
    if (f->read_json(j, c, err)) return -1;
    /* MLX quantized models: validated here, read per module by weights.c */
    if (pt_mlx_quant_check(j, err)) return -1;
    return check_shapes(c, err);
}

int pt_config_from_file(const pt_model_file *mf, pt_model_config *cfg, pt_err *err) {
    memset(cfg, 0, sizeof *cfg);
    if (mf->kind == PT_FILE_GGUF) return config_from_gguf(mf->gguf, mf, cfg, err);
    if (pt_config_from_json(mf->config, cfg, err)) return pt_failp(err, "%s", mf->path);
    return 0;
}

/* Shapes of public models, for benchmarking without downloads. */
static const struct {
    const char *name, *json;
} presets[] = {
    {"llama-1b", /* TinyLlama-1.1B */
     "{\"model_type\":\"llama\",\"hidden_size\":2048,\"num_hidden_layers\":22,"
     "\"num_attention_heads\":32,\"num_key_value_heads\":4,\"intermediate_size\":5632,"
     "\"vocab_size\":32000,\"max_position_embeddings\":2048,\"rms_norm_eps\":1e-5,"
     "\"rope_theta\":10000.0}"},
    {"llama-8b", /* Llama-3.1-8B */
     "{\"model_type\":\"llama\",\"hidden_size\":4096,\"num_hidden_layers\":32,"
     "\"num_attention_heads\":32,\"num_key_value_heads\":8,\"intermediate_size\":14336,"
     "\"vocab_size\":128256,\"max_position_embeddings\":131072,\"rms_norm_eps\":1e-5,"
     "\"rope_theta\":500000.0,\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":8.0,"
     "\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,"
     "\"original_max_position_embeddings\":8192}}"},
    {"qwen3-8b", /* Qwen3-8B */
     "{\"model_type\":\"qwen3\",\"hidden_size\":4096,\"num_hidden_layers\":36,"
     "\"num_attention_heads\":32,\"num_key_value_heads\":8,\"head_dim\":128,"
     "\"intermediate_size\":12288,\"vocab_size\":151936,\"max_position_embeddings\":40960,"
     "\"rms_norm_eps\":1e-6,\"rope_theta\":1000000.0}"},
    {"qwen3-30b-a3b", /* Qwen3-30B-A3B: 128 experts, 8 per token */
     "{\"model_type\":\"qwen3_moe\",\"hidden_size\":2048,\"num_hidden_layers\":48,"
     "\"num_attention_heads\":32,\"num_key_value_heads\":4,\"head_dim\":128,"
     "\"intermediate_size\":6144,\"moe_intermediate_size\":768,\"num_experts\":128,"
     "\"num_experts_per_tok\":8,\"norm_topk_prob\":true,\"vocab_size\":151936,"
     "\"max_position_embeddings\":40960,\"rms_norm_eps\":1e-6,\"rope_theta\":1000000.0}"},
    {"deepseek-v2-lite", /* DeepSeek-V2-Lite: latent attention, 64 experts + 2 shared */
     "{\"model_type\":\"deepseek_v2\",\"hidden_size\":2048,\"num_hidden_layers\":27,"
     "\"num_attention_heads\":16,\"num_key_value_heads\":16,\"intermediate_size\":10944,"
     "\"q_lora_rank\":null,\"kv_lora_rank\":512,\"qk_nope_head_dim\":128,"
     "\"qk_rope_head_dim\":64,\"v_head_dim\":128,\"moe_intermediate_size\":1408,"
     "\"n_routed_experts\":64,\"n_shared_experts\":2,\"num_experts_per_tok\":6,"
     "\"first_k_dense_replace\":1,\"n_group\":1,\"topk_group\":1,\"topk_method\":\"greedy\","
     "\"scoring_func\":\"softmax\",\"norm_topk_prob\":false,\"routed_scaling_factor\":1.0,"
     "\"vocab_size\":102400,\"max_position_embeddings\":163840,\"rms_norm_eps\":1e-6,"
     "\"rope_theta\":10000.0,\"rope_scaling\":{\"type\":\"yarn\",\"factor\":40,"
     "\"original_max_position_embeddings\":4096,\"beta_fast\":32,\"beta_slow\":1,"
     "\"mscale\":0.707,\"mscale_all_dim\":0.707}}"},
    {"minicpm3-4b", /* MiniCPM3-4B: latent attention, dense; LongRoPE factors left out */
     "{\"model_type\":\"minicpm3\",\"hidden_size\":2560,\"num_hidden_layers\":62,"
     "\"num_attention_heads\":40,\"num_key_value_heads\":40,\"intermediate_size\":6400,"
     "\"q_lora_rank\":768,\"kv_lora_rank\":256,\"qk_nope_head_dim\":64,"
     "\"qk_rope_head_dim\":32,\"vocab_size\":73448,\"max_position_embeddings\":32768,"
     "\"rms_norm_eps\":1e-5,\"rope_theta\":10000.0,\"scale_emb\":12,"
     "\"scale_depth\":1.4,\"dim_model_base\":256,\"tie_word_embeddings\":false}"},
    {"gemma2-9b", /* Gemma-2-9B: window 4096 on even layers, soft-capping */
     "{\"model_type\":\"gemma2\",\"hidden_size\":3584,\"num_hidden_layers\":42,"
     "\"num_attention_heads\":16,\"num_key_value_heads\":8,\"head_dim\":256,"
     "\"intermediate_size\":14336,\"vocab_size\":256000,\"max_position_embeddings\":8192,"
     "\"hidden_activation\":\"gelu_pytorch_tanh\",\"query_pre_attn_scalar\":256,"
     "\"sliding_window\":4096,\"attn_logit_softcapping\":50.0,"
     "\"final_logit_softcapping\":30.0,\"rms_norm_eps\":1e-6,\"rope_theta\":10000.0}"},
    {"gemma3-12b", /* Gemma-3-12B text: 5 local (window 1024) : 1 global */
     "{\"model_type\":\"gemma3_text\",\"hidden_size\":3840,\"num_hidden_layers\":48,"
     "\"num_attention_heads\":16,\"num_key_value_heads\":8,\"head_dim\":256,"
     "\"intermediate_size\":15360,\"vocab_size\":262208,\"max_position_embeddings\":131072,"
     "\"hidden_activation\":\"gelu_pytorch_tanh\",\"query_pre_attn_scalar\":256,"
     "\"sliding_window\":1024,\"sliding_window_pattern\":6,\"rms_norm_eps\":1e-6,"
     "\"rope_theta\":1000000.0,\"rope_local_base_freq\":10000.0,"
     "\"rope_scaling\":{\"rope_type\":\"linear\",\"factor\":8.0}}"},
    {"gpt-oss-20b", /* gpt-oss-20b: 32 experts, 4 per token; window 128 on even layers */
     "{\"model_type\":\"gpt_oss\",\"hidden_size\":2880,\"num_hidden_layers\":24,"
     "\"num_attention_heads\":64,\"num_key_value_heads\":8,\"head_dim\":64,"
     "\"intermediate_size\":2880,\"num_local_experts\":32,\"num_experts_per_tok\":4,"
     "\"sliding_window\":128,\"attention_bias\":true,\"swiglu_limit\":7.0,"
     "\"vocab_size\":201088,\"max_position_embeddings\":131072,\"rms_norm_eps\":1e-5,"
     "\"rope_theta\":150000.0,\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":32.0,"
     "\"beta_fast\":32.0,\"beta_slow\":1.0,\"truncate\":false,"
     "\"original_max_position_embeddings\":4096}}"},
    {"qwen3.5-27b", /* a Qwen3.5-27B-like hybrid: 48 Gated DeltaNet + 16 attention layers */
     "{\"model_type\":\"qwen3_5_text\",\"hidden_size\":5120,\"num_hidden_layers\":64,"
     "\"full_attention_interval\":4,\"num_attention_heads\":24,\"num_key_value_heads\":4,"
     "\"head_dim\":256,\"partial_rotary_factor\":0.25,\"intermediate_size\":17408,"
     "\"linear_num_key_heads\":16,\"linear_num_value_heads\":48,"
     "\"linear_key_head_dim\":128,\"linear_value_head_dim\":128,"
     "\"linear_conv_kernel_dim\":4,\"vocab_size\":248320,"
     "\"max_position_embeddings\":262144,\"rms_norm_eps\":1e-6,\"rope_theta\":10000000.0}"},
};

const char *pt_config_preset(const char *name) {
    for (size_t i = 0; i < PT_ARRAY_LEN(presets); i++)
        if (strcmp(presets[i].name, name) == 0) return presets[i].json;
    return NULL;
}

void pt_config_preset_names(char *buf, size_t cap) {
    size_t at = 0;
    buf[0] = 0;
    for (size_t i = 0; i < PT_ARRAY_LEN(presets) && at < cap; i++) {
        int n = snprintf(buf + at, cap - at, "%s%s", i ? ", " : "", presets[i].name);
        if (n < 0) break;
        at += (size_t)n;
    }
}

void pt_config_describe(const pt_model_config *c, char *buf, size_t cap) {
    if (c->kv_lora_rank > 0) /* latent attention: the cached row is the latent + rope key */
        snprintf(buf, cap, "%s: %d layers, dim %d, %d heads (latent attention: kv rank %d + rope "
                           "%d cached, q rank %d, head dim %d / value %d), ffn %d, vocab %d",
                 c->arch, c->n_layers, c->dim, c->n_heads, c->kv_lora_rank, c->n_rot,
                 c->q_lora_rank, c->head_dim, c->v_head_dim, c->ffn_dim, c->vocab_size);
    else
        snprintf(buf, cap, "%s: %d layers, dim %d, %d heads (%d kv, head dim %d), ffn %d, vocab %d",
                 c->arch, c->n_layers, c->dim, c->n_heads, c->n_kv_heads, c->head_dim, c->ffn_dim,
                 c->vocab_size);
}

/* YaRN's correction dimension: where num_rot rotations fit in ctx positions. */
static double yarn_dim(double num_rot, int dim, double base, int ctx) {
    const double pi = 3.14159265358979323846;
    return dim * log(ctx / (num_rot * 2 * pi)) / (2 * log(base));
}

/* YaRN: each frequency interpolated (divided by factor) or extrapolated
 * (kept), with a linear ramp between the correction range's ends. */
static void yarn_inv_freq(const pt_model_config *c, float theta, float *out) {
    int dim = c->n_rot;
    double low = yarn_dim(c->rope_beta_fast, dim, theta, c->rope_orig_ctx);
    double high = yarn_dim(c->rope_beta_slow, dim, theta, c->rope_orig_ctx);
    if (c->rope_yarn_truncate) low = floor(low), high = ceil(high);
    low = PT_MAX(low, 0.0), high = PT_MIN(high, (double)(dim - 1));
    if (low == high) high += 0.001; /* no singularity */
    for (int i = 0; i < dim / 2; i++) {
        double f = 1.0 / pow((double)theta, (2.0 * i) / dim);
        double ramp = PT_MIN(1.0, PT_MAX(0.0, (i - low) / (high - low)));
        out[i] = (float)(f / c->rope_factor * ramp + f * (1 - ramp));
    }
}

void pt_rope_inv_freq(const pt_model_config *c, float theta, float *out) {
    const double pi = 3.14159265358979323846;
    if (c->rope_scaling == PT_ROPE_SCALING_YARN) {
        yarn_inv_freq(c, theta, out);
        return;
    }
    for (int i = 0; i < c->n_rot / 2; i++) {
        double f = 1.0 / pow((double)theta, (2.0 * i) / c->n_rot);
        if (c->rope_scaling == PT_ROPE_SCALING_LINEAR) {
            f /= c->rope_factor;
        } else if (c->rope_scaling == PT_ROPE_SCALING_LONGROPE) {
            f /= c->rope_ext[i];
        } else if (c->rope_scaling == PT_ROPE_SCALING_LLAMA3) {
            double wavelen = 2 * pi / f;
            double low_wl = c->rope_orig_ctx / c->rope_low_freq_factor;
            double high_wl = c->rope_orig_ctx / c->rope_high_freq_factor;
            if (wavelen > low_wl) {
                f /= c->rope_factor;
            } else if (wavelen >= high_wl) {
                double smooth = (c->rope_orig_ctx / wavelen - c->rope_low_freq_factor) /
                                (c->rope_high_freq_factor - c->rope_low_freq_factor);
                f = (1 - smooth) * f / c->rope_factor + smooth * f;
            }
        }
        out[i] = (float)f;
    }
}
