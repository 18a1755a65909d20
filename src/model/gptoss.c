/*
 * gptoss.c - gpt-oss (gpt-oss-20b, gpt-oss-120b): biased attention with a
 * learned sink logit per head, alternating sliding-window (even layers) and
 * full attention, YaRN rope, and every FFN a set of routed experts with
 * biases and a clamped SwiGLU.
 *
 *     x = embed(tokens)
 *     per layer:  x += attention(rope(qkv(rmsnorm(x)) + b), sinks)·Wo + bo
 *                 h = rmsnorm(x); r = h·Wrᵀ + br
 *                 ids = top-k(r); w = softmax(r[ids])
 *                 x += sum over the k of w · (act(h·Wg_e + bg_e, h·Wu_e + bu_e)·Wd_e + bd_e)
 *     logits = rmsnorm(x)·Woutᵀ
 *     act(g, u) = (clamp(u, -7, 7) + 1) · g'·sigmoid(1.702 g'),  g' = min(g, 7)
 *
 * Sinks (attention_ext's `sinks`): head h's softmax has one more term in
 * its denominator, exp(sinks[h]), that no value goes with.
 *
 * Experts: the Hub's unquantized checkpoints fuse them per layer as
 * mlp.experts.gate_up_proj [E][dim][2F] (input-major, gate and up
 * interleaved: column 2f is gate row f, 2f + 1 up row f) with
 * gate_up_proj_bias [E][2F], and down_proj [E][F][dim] with down_proj_bias
 * [E][dim].  The released checkpoints store them as MXFP4 (_blocks and
 * _scales, output-major [E][2F][dim / 32] blocks of 32 e2m1 values with one
 * e8m0 scale, still interleaved).  gptoss_finish builds our stacks from
 * either, once, at load: w_gate / w_up [E][F][dim] and w_down [E][dim][F],
 * in the file's type (MXFP4 blocks stay MXFP4: matmul_id decodes them on
 * the fly), and the biases as f32.  GGUF files (llama.cpp's gpt-oss) have
 * these stacks already (ffn_{gate,up,down}_exps, weight and bias, gate and
 * up apart; MXFP4 as ggml's block_mxfp4, or any block type): bound as
 * they are.
 */
#include <stdio.h>
#include <stdlib.h>

#include "base/progress.h"
#include "model/model_int.h"

/* clang-format off */
static const pt_arch gptoss_archs[] = {
    /* name       GGUF name  config.json  GGUF rope     qkv_bias qk_norm */
    {"gpt_oss",   "gpt-oss", "gpt_oss",   PT_ROPE_NEOX, true,    false},
};
/* clang-format on */

/* ---- Config -------------------------------------------------------------- */

static int gptoss_read_json(json_t *j, pt_model_config *c, pt_err *err) {
    if (pt_config_json_common(j, c, err)) return -1;
    c->qkv_bias = c->o_bias = !json_is_false(json_object_get(j, "attention_bias"));
    if (!pt_json_int(j, "num_local_experts", &c->n_experts) ||
        !pt_json_int(j, "num_experts_per_tok", &c->n_experts_used))
        return pt_fail(err, "config.json: gpt_oss needs num_local_experts and "
                            "num_experts_per_tok");
    c->expert_ffn_dim = c->ffn_dim;
    c->expert_renorm = true; /* softmax over the top k */
    c->expert_bias = true;
    c->attn_sinks = true;
    c->act = PT_ACT_SWIGLU_OAI;
    c->act_alpha = 1.702f; /* fixed in transformers' GptOssExperts */
    if (!pt_json_float(j, "swiglu_limit", &c->act_limit)) c->act_limit = 7.0f;
    if (pt_json_int(j, "sliding_window", &c->sliding_window) && c->sliding_window > 0) {
        int given = pt_config_json_layer_types(j, c, err);
        if (given < 0) return -1;
        if (!given) { /* transformers' default: even layers slide */
            c->swa_per_layer = true;
            for (int l = 0; l < c->n_layers; l += 2) pt_config_set_swa(c, l);
        }
    }
    return 0;
}

/* GGUF (llama.cpp's gpt-oss, src/models/openai-moe.cpp): the experts'
 * count, top-k and size; the window on layers l % p < p - 1 of
 * attention.sliding_window_pattern p (default 2: the even layers), every
 * layer with the same rope (rope.freq_base_swa, if given, for the window
 * layers); YaRN as pt_config_gguf_common reads it, but with the correction
 * range unrounded.  The rest is fixed by the architecture, as in
 * transformers. */
static int gptoss_read_gguf(const pt_gguf *g, const pt_model_file *mf, const char *garch,
                            pt_model_config *c, pt_err *err) {
    if (pt_config_gguf_common(g, mf, garch, c, err)) return -1;
    if (!pt_gguf_int(g, garch, "expert_count", &c->n_experts) ||
        !pt_gguf_int(g, garch, "expert_used_count", &c->n_experts_used) ||
        !pt_gguf_int(g, garch, "expert_feed_forward_length", &c->expert_ffn_dim) ||
        !pt_gguf_int(g, garch, "attention.sliding_window", &c->sliding_window))
        return pt_fail(err, "%s: GGUF gpt-oss needs %s.expert_count, expert_used_count, "
                            "expert_feed_forward_length and attention.sliding_window",
                       mf->path, garch);
    c->qkv_bias = c->o_bias = true;
    c->expert_renorm = c->expert_bias = c->attn_sinks = true;
    c->act = PT_ACT_SWIGLU_OAI;
    c->act_alpha = 1.702f, c->act_limit = 7.0f; /* fixed in llama.cpp too */
    int pattern = 2;
    pt_gguf_int(g, garch, "attention.sliding_window_pattern", &pattern);
    if (c->sliding_window > 0) {
        c->swa_per_layer = true;
        for (int l = 0; l < c->n_layers; l++)
            if (pattern <= 0 || l % pattern < pattern - 1) pt_config_set_swa(c, l);
    }
    pt_gguf_float(g, garch, "rope.freq_base_swa", &c->rope_theta_swa);
    /* Every released gpt-oss config says "truncate": false (OpenAI's
     * reference keeps the YaRN correction range unrounded); ggml always
     * rounds it outwards, so llama.cpp's rope differs from the model's
     * (on the fixture, by 3e-4 at position 1 and 2.5 logits at position 71).
     * The model is what transformers computes. */
    c->rope_yarn_truncate = false;
    return 0;
}

/* clang-format off */
#define L(f) offsetof(pt_layer, f)
/* The experts are not here: gptoss_finish builds them from the fused
 * tensors (Hugging Face) or binds llama.cpp's stacks (GGUF). */
static const pt_weight_spec gptoss_weights[] = {
    PT_W_TOKEN_IO,
    PT_W_ATTN,
    PT_W_ATTN_BIAS,
    {"blk.%d.attn_sinks.weight", "model.layers.%d.self_attn.sinks", D_NONE, D_HEADS, D_NONE, L(sinks), true, NEED_ALWAYS},
    {"blk.%d.post_attention_norm.weight", "model.layers.%d.post_attention_layernorm.weight", D_NONE, D_DIM, D_NONE, L(ffn_norm), true, NEED_ALWAYS},
    {"blk.%d.ffn_gate_inp.weight", "model.layers.%d.mlp.router.weight", D_NONE, D_EXPERTS, D_DIM, L(w_router), true, NEED_ALWAYS},
    {"blk.%d.ffn_gate_inp.bias", "model.layers.%d.mlp.router.bias", D_NONE, D_EXPERTS, D_NONE, L(b_router), true, NEED_ALWAYS},
};

/* Dummy models' experts, in the layout gptoss_finish builds from a file. */
static const pt_weight_spec gptoss_dummy_weights[] = {
    {"blk.%d.ffn_gate_exps.weight", "model.layers.%d.mlp.experts.gate", D_EXPERTS, D_EFFN, D_DIM, L(w_gate), true, NEED_ALWAYS},
    {"blk.%d.ffn_up_exps.weight", "model.layers.%d.mlp.experts.up", D_EXPERTS, D_EFFN, D_DIM, L(w_up), true, NEED_ALWAYS},
    {"blk.%d.ffn_down_exps.weight", "model.layers.%d.mlp.experts.down", D_EXPERTS, D_DIM, D_EFFN, L(w_down), true, NEED_ALWAYS},
};
#undef L
/* clang-format on */

/* ---- The experts, from the fused tensors ---------------------------------- */

static const pt_tensor_info *layer_tensor(const pt_model *m, int l, const char *what) {
    char name[160];
    snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%s", l, what);
    return pt_model_file_tensor(m->file, name);
}

static bool shape_is(const pt_tensor_info *t, int ndim, int64_t a, int64_t b, int64_t c, int64_t d) {
    int64_t want[4] = {a, b, c, d};
    if (!t || t->ndim != ndim) return false;
    for (int i = 0; i < ndim; i++)
        if (t->shape[i] != want[i]) return false;
    return true;
}

/* Host bytes into backend memory, on the model's owned list. */
static const void *upload(pt_model *m, const void *host, size_t bytes, pt_err *err) {
    void *dev = pt_model_alloc(m, bytes);
    if (!dev) {
        pt_fail(err, "gpt_oss: out of backend memory for the experts (%zu bytes)", bytes);
        return NULL;
    }
    m->be->ops->upload(m->be, dev, host, bytes);
    return dev;
}

/* A stack [E][rows][cols] of t's type whose element (e, r, c) is t's
 * element at index src(e, r, c) (a permutation of t's elements). */
typedef size_t (*elem_index)(int64_t e, int64_t r, int64_t c, const int64_t *shape, int which);

/* gate_up [E][D][2F]: gate row f = column 2f, up row f = column 2f + 1. */
static size_t gate_up_index(int64_t e, int64_t r, int64_t c, const int64_t *sh, int which) {
    return (size_t)(((e * sh[1]) + c) * sh[2] + 2 * r + which);
}

/* down [E][F][D] read as [E][D][F]. */
static size_t down_index(int64_t e, int64_t r, int64_t c, const int64_t *sh, int which) {
    (void)which;
    return (size_t)((e * sh[1] + c) * sh[2] + r);
}

static int permuted_stack(pt_model *m, const pt_tensor_info *t, int64_t rows, int64_t cols,
                          elem_index idx, int which, pt_weight *w, pt_err *err) {
    if (t->dtype != PT_BF16 && t->dtype != PT_F16 && t->dtype != PT_F32)
        return pt_fail(err, "tensor %s: type %s is not supported (bf16, f16, f32, or MXFP4 "
                            "_blocks/_scales)",
                       t->name, pt_dtype_name(t->dtype));
    int64_t E = t->shape[0];
    size_t es = pt_dtype_bytes(t->dtype, 1), n = (size_t)(E * rows * cols);
    char *host = pt_xmalloc(n * es);
    const char *src = t->data;
    for (int64_t e = 0; e < E; e++)
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c = 0; c < cols; c++)
                memcpy(host + (size_t)((e * rows + r) * cols + c) * es,
                       src + idx(e, r, c, t->shape, which) * es, es);
    *w = (pt_weight){.dtype = t->dtype, .rows = rows, .cols = cols, .nbytes = n * es,
                     .n_experts = (int)E, .expert_stride = (size_t)(rows * cols) * es};
    w->data = upload(m, host, n * es, err);
    free(host);
    if (!w->data) return -1;
    m->weight_bytes += w->nbytes;
    return 0;
}

/* A bias tensor [E][width] (f32 after conversion) cut into [E][part_len]
 * taking every stride-th value from offset `first`. */
static const float *bias_part(pt_model *m, const pt_tensor_info *t, int64_t part_len, int stride,
                              int first, pt_err *err) {
    int64_t E = t->shape[0], width = t->shape[1];
    if (t->dtype != PT_BF16 && t->dtype != PT_F16 && t->dtype != PT_F32) {
        pt_fail(err, "tensor %s: bias of type %s is not supported", t->name, pt_dtype_name(t->dtype));
        return NULL;
    }
    float *host = pt_xmalloc(sizeof(float) * (size_t)(E * part_len));
    for (int64_t e = 0; e < E; e++)
        for (int64_t i = 0; i < part_len; i++) {
            size_t at = (size_t)(e * width + first + i * stride);
            const char *p = t->data;
            float v;
            uint16_t h;
            if (t->dtype == PT_F32) {
                memcpy(&v, p + 4 * at, 4);
            } else {
                memcpy(&h, p + 2 * at, 2);
                v = t->dtype == PT_BF16 ? pt_bf16_to_f32(h) : pt_f16_to_f32(h);
            }
            host[e * part_len + i] = v;
        }
    const float *dev = upload(m, host, sizeof(float) * (size_t)(E * part_len), err);
    free(host);
    return dev;
}

/* One MXFP4 block of the checkpoint (scale e, 16 bytes: element 2j in the
 * low nibble of byte j, 2j + 1 in the high) as ggml's block_mxfp4 (scale,
 * then element i in the low nibble of byte i, i + 16 in the high). */
static void mxfp4_block(uint8_t out[17], uint8_t e, const uint8_t in[16]) {
    uint8_t el[32];
    for (int j = 0; j < 16; j++) el[2 * j] = in[j] & 15, el[2 * j + 1] = in[j] >> 4;
    out[0] = e;
    for (int i = 0; i < 16; i++) out[1 + i] = (uint8_t)(el[i] | el[i + 16] << 4);
}

/* A stack [E][rows][cols] of MXFP4 rows from blocks [E][src_rows][cols/32][16]
 * and scales [E][src_rows][cols/32]: our row r is the file's row
 * r * stride + first (gate/up de-interleaved with stride 2). */
static int mxfp4_stack(pt_model *m, const pt_tensor_info *bl, const pt_tensor_info *sc,
                       int64_t rows, int64_t cols, int stride, int first, pt_weight *w,
                       pt_err *err) {
    int64_t E = bl->shape[0], src_rows = bl->shape[1], nb = cols / 32;
    size_t row_bytes = (size_t)nb * 17, n = (size_t)(E * rows) * row_bytes;
    uint8_t *host = pt_xmalloc(n);
    const uint8_t *b = bl->data, *s = sc->data;
    for (int64_t e = 0; e < E; e++)
        for (int64_t r = 0; r < rows; r++) {
            int64_t fr = e * src_rows + r * stride + first;
            for (int64_t g = 0; g < nb; g++)
                mxfp4_block(host + (size_t)(e * rows + r) * row_bytes + (size_t)g * 17,
                            s[fr * nb + g], b + (size_t)(fr * nb + g) * 16);
        }
    *w = (pt_weight){.dtype = PT_MXFP4, .rows = rows, .cols = cols, .nbytes = n,
                     .n_experts = (int)E, .expert_stride = (size_t)rows * row_bytes};
    w->data = upload(m, host, n, err);
    free(host);
    if (!w->data) return -1;
    m->weight_bytes += n;
    return 0;
}

/* MXFP4 experts (the released checkpoints): gate_up_proj_blocks
 * [E][2F][dim/32][16] with _scales [E][2F][dim/32], gate and up rows
 * interleaved; down_proj_blocks [E][dim][F/32][16].  Output-major already:
 * only repacked into ggml's block layout and de-interleaved. */
static int bind_mxfp4(pt_model *m, int l, pt_err *err) {
    const pt_model_config *c = &m->cfg;
    pt_layer *L = &m->layers[l];
    int64_t E = c->n_experts, D = c->dim, F = c->expert_ffn_dim;
    const pt_tensor_info *gb = layer_tensor(m, l, "gate_up_proj_blocks");
    const pt_tensor_info *gs = layer_tensor(m, l, "gate_up_proj_scales");
    const pt_tensor_info *db = layer_tensor(m, l, "down_proj_blocks");
    const pt_tensor_info *ds = layer_tensor(m, l, "down_proj_scales");
    if (!gb && !db)
        return pt_fail(err, "gpt_oss layer %d: no mlp.experts.gate_up_proj (nor its MXFP4 "
                            "_blocks)", l);
    if (D % 32 || F % 32 || !shape_is(gb, 4, E, 2 * F, D / 32, 16) ||
        !shape_is(gs, 3, E, 2 * F, D / 32, 0) || !shape_is(db, 4, E, D, F / 32, 16) ||
        !shape_is(ds, 3, E, D, F / 32, 0) || gb->dtype != PT_U8 || gs->dtype != PT_U8 ||
        db->dtype != PT_U8 || ds->dtype != PT_U8)
        return pt_fail(err, "gpt_oss layer %d: expected u8 MXFP4 experts gate_up_proj_blocks "
                            "%lldx%lldx%lldx16, _scales %lldx%lldx%lld, down_proj_blocks "
                            "%lldx%lldx%lldx16, _scales %lldx%lldx%lld",
                       l, (long long)E, (long long)(2 * F), (long long)(D / 32), (long long)E,
                       (long long)(2 * F), (long long)(D / 32), (long long)E, (long long)D,
                       (long long)(F / 32), (long long)E, (long long)D, (long long)(F / 32));
    if (mxfp4_stack(m, gb, gs, F, D, 2, 0, &L->w_gate, err) ||
        mxfp4_stack(m, gb, gs, F, D, 2, 1, &L->w_up, err) ||
        mxfp4_stack(m, db, ds, D, F, 1, 0, &L->w_down, err))
        return -1;
    if (m->progress) pt_progress_add(m->progress, gb->nbytes + gs->nbytes + db->nbytes + ds->nbytes);
    return 0;
}

static int bind_experts(pt_model *m, int l, pt_err *err) {
    const pt_model_config *c = &m->cfg;
    pt_layer *L = &m->layers[l];
    int64_t E = c->n_experts, D = c->dim, F = c->expert_ffn_dim;
    const pt_tensor_info *gu = layer_tensor(m, l, "gate_up_proj"), *dn = layer_tensor(m, l, "down_proj");
    const pt_tensor_info *gub = layer_tensor(m, l, "gate_up_proj_bias");
    const pt_tensor_info *dnb = layer_tensor(m, l, "down_proj_bias");
    if (!gub || !dnb || !shape_is(gub, 2, E, 2 * F, 0, 0) || !shape_is(dnb, 2, E, D, 0, 0))
        return pt_fail(err, "gpt_oss layer %d: expected mlp.experts.gate_up_proj_bias %lldx%lld "
                            "and down_proj_bias %lldx%lld",
                       l, (long long)E, (long long)(2 * F), (long long)E, (long long)D);
    if (gu || dn) {
        if (!shape_is(gu, 3, E, D, 2 * F, 0) || !shape_is(dn, 3, E, F, D, 0))
            return pt_fail(err, "gpt_oss layer %d: expected mlp.experts.gate_up_proj %lldx%lldx%lld "
                                "and down_proj %lldx%lldx%lld",
                           l, (long long)E, (long long)D, (long long)(2 * F), (long long)E,
                           (long long)F, (long long)D);
        if (permuted_stack(m, gu, F, D, gate_up_index, 0, &L->w_gate, err) ||
            permuted_stack(m, gu, F, D, gate_up_index, 1, &L->w_up, err) ||
            permuted_stack(m, dn, D, F, down_index, 0, &L->w_down, err))
            return -1;
        if (m->progress) pt_progress_add(m->progress, gu->nbytes + dn->nbytes);
    } else if (bind_mxfp4(m, l, err)) {
        return -1;
    }
    if (!(L->b_gate_exps = bias_part(m, gub, F, 2, 0, err)) ||
        !(L->b_up_exps = bias_part(m, gub, F, 2, 1, err)) ||
        !(L->b_down_exps = bias_part(m, dnb, D, 1, 0, err)))
        return -1;
    return 0;
}

/* ---- The experts of a GGUF file ---------------------------------------------- */

static const pt_tensor_info *gguf_tensor(const pt_model *m, int l, const char *what) {
    char name[96];
    snprintf(name, sizeof name, "blk.%d.%s", l, what);
    return pt_model_file_tensor(m->file, name);
}

static bool expert_dtype_ok(pt_dtype t) {
    static const pt_dtype ok[] = {PT_F32, PT_F16, PT_BF16, PT_Q8_0, PT_Q4_0, PT_Q4_K,
                                  PT_Q5_K, PT_Q6_K, PT_MXFP4};
    for (size_t i = 0; i < PT_ARRAY_LEN(ok); i++)
        if (ok[i] == t) return true;
    return false;
}

/* One stack [E][rows][cols] as the file has it (llama.cpp's ffn_*_exps:
 * ne = cols, rows, experts), any matrix type or MXFP4; zero copy where the
 * backend's memory is host memory. */
static int gguf_stack(pt_model *m, const pt_tensor_info *t, int64_t rows, int64_t cols,
                      pt_weight *w, pt_err *err) {
    int64_t E = m->cfg.n_experts;
    if (!shape_is(t, 3, E, rows, cols, 0))
        return pt_fail(err, "tensor %s: expected %lldx%lldx%lld (experts x rows x cols)",
                       t->name, (long long)E, (long long)rows, (long long)cols);
    if (!expert_dtype_ok(t->dtype) || cols % pt_dtype_get(t->dtype)->block)
        return pt_fail(err, "tensor %s: expert weights of type %s are not supported", t->name,
                       pt_dtype_name(t->dtype));
    *w = (pt_weight){.dtype = t->dtype, .rows = rows, .cols = cols, .nbytes = t->nbytes,
                     .n_experts = (int)E, .expert_stride = t->nbytes / (size_t)E};
    if (m->progress) pt_progress_add(m->progress, t->nbytes);
    w->data = m->be->host_memory ? t->data : upload(m, t->data, t->nbytes, err);
    if (!w->data) return -1;
    m->weight_bytes += t->nbytes;
    return 0;
}

static int bind_gguf_experts(pt_model *m, int l, pt_err *err) {
    const pt_model_config *c = &m->cfg;
    pt_layer *L = &m->layers[l];
    int64_t E = c->n_experts, D = c->dim, F = c->expert_ffn_dim;
    static const char *const names[6] = {"ffn_gate_exps.weight", "ffn_up_exps.weight",
                                         "ffn_down_exps.weight", "ffn_gate_exps.bias",
                                         "ffn_up_exps.bias", "ffn_down_exps.bias"};
    const pt_tensor_info *t[6];
    for (int i = 0; i < 6; i++)
        if (!(t[i] = gguf_tensor(m, l, names[i])))
            return pt_fail(err, "%s: missing tensor blk.%d.%s", m->file->path, l, names[i]);
    if (!shape_is(t[3], 2, E, F, 0, 0) || !shape_is(t[4], 2, E, F, 0, 0) ||
        !shape_is(t[5], 2, E, D, 0, 0))
        return pt_fail(err, "gpt-oss layer %d: expected expert biases %lldx%lld (gate, up) and "
                            "%lldx%lld (down)",
                       l, (long long)E, (long long)F, (long long)E, (long long)D);
    if (gguf_stack(m, t[0], F, D, &L->w_gate, err) || gguf_stack(m, t[1], F, D, &L->w_up, err) ||
        gguf_stack(m, t[2], D, F, &L->w_down, err))
        return -1;
    if (!(L->b_gate_exps = bias_part(m, t[3], F, 1, 0, err)) ||
        !(L->b_up_exps = bias_part(m, t[4], F, 1, 0, err)) ||
        !(L->b_down_exps = bias_part(m, t[5], D, 1, 0, err)))
        return -1;
    return 0;
}

/* Dummy models: the stacks come from gptoss_dummy_weights; the biases are
 * zeros (their bytes are noise beside the experts'). */
static int dummy_biases(pt_model *m, pt_err *err) {
    const pt_model_config *c = &m->cfg;
    size_t n = (size_t)c->n_experts * (size_t)PT_MAX(c->expert_ffn_dim, c->dim);
    float *zeros = pt_xcalloc(n, sizeof(float));
    int rc = 0;
    for (int l = 0; l < c->n_layers && !rc; l++) {
        pt_layer *L = &m->layers[l];
        rc = !(L->b_gate_exps = upload(m, zeros, sizeof(float) * n, err)) ||
             !(L->b_up_exps = upload(m, zeros, sizeof(float) * n, err)) ||
             !(L->b_down_exps = upload(m, zeros, sizeof(float) * n, err));
    }
    free(zeros);
    return rc ? -1 : 0;
}

static int gptoss_finish(pt_model *m, pt_err *err) {
    if (!m->file) return dummy_biases(m, err);
    bool gguf = m->file->kind == PT_FILE_GGUF;
    for (int l = 0; l < m->cfg.n_layers; l++)
        if (gguf ? bind_gguf_experts(m, l, err) : bind_experts(m, l, err)) return -1;
    if (m->be->ops->sync(m->be)) return pt_be_take_error(m->be, err);
    return 0;
}

/* ---- Forward ------------------------------------------------------------- */

static void gptoss_layer(pt_model *m, int l, const pt_step *s) {
    const pt_layer *L = &m->layers[l];
    pt_workspace *ws = m->ws;

    pt_block_norm(m, s, ws->h, ws->x, L->attn_norm);
    pt_block_qkv(m, l, s);
    pt_block_attention(m, l, s); /* the plan's window and sinks */
    pt_block_residual(m, s);

    pt_block_norm(m, s, ws->h, ws->x, L->ffn_norm);
    pt_block_ffn(m, l, s); /* routed, biased experts with the clamped SwiGLU */
    pt_block_residual(m, s);
}

static void gptoss_forward(pt_model *m, const pt_step *s) {
    pt_block_stack(m, s, gptoss_layer);
}

const pt_family pt_family_gptoss = {
    .name = "gptoss",
    .archs = gptoss_archs,
    .n_archs = PT_ARRAY_LEN(gptoss_archs),
    .read_json = gptoss_read_json,
    .read_gguf = gptoss_read_gguf,
    .weights = gptoss_weights,
    .n_weights = PT_ARRAY_LEN(gptoss_weights),
    .dummy_weights = gptoss_dummy_weights,
    .n_dummy_weights = PT_ARRAY_LEN(gptoss_dummy_weights),
    .moe = true,
    .finish = gptoss_finish,
    .forward = gptoss_forward,
};
