/*
 * weights.c - binding the model's weights: by name from a file, or random
 * ("dummy") ones of the right shapes for benchmarking.
 *
 * A table lists every weight once with its GGUF and Hugging Face names, its
 * expected shape in terms of the config, and whether the architecture needs
 * it.  Matrices stay in the file's dtype and, on a backend whose memory is
 * host memory, point straight into the mapping (zero copy).  Vectors (norm
 * gains, biases) are small and converted to f32.
 *
 * Quantized matrices: GGUF block types (q8_0, q4_0, q4_k, q5_k, q6_k) bind
 * like any other dtype; an MLX affine matrix is three tensors, <m>.weight
 * (packed uint32 codes), <m>.scales and <m>.biases, with its bits and group
 * size from config.json's "quantization" (src/quant/mlx_config.c).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "model/model.h"
#include "quant/mlx_config.h"
#include "quant/quant.h"

enum dim_id { D_NONE, D_DIM, D_Q, D_KV, D_FFN, D_VOCAB, D_HEAD };

typedef struct weight_spec {
    const char *gguf, *hf; /* names; %d is the layer */
    int rows, cols;        /* enum dim_id; cols = D_NONE for a vector */
    size_t off;            /* offset in pt_layer (per layer) or pt_model */
    bool per_layer;
    int need; /* which config flag requires it */
} weight_spec;

enum { NEED_ALWAYS, NEED_QKV_BIAS, NEED_O_BIAS, NEED_QK_NORM, NEED_UNTIED };

#define L(f) offsetof(pt_layer, f)
#define M(f) offsetof(pt_model, f)
static const weight_spec specs[] = {
    {"token_embd.weight", "model.embed_tokens.weight", D_VOCAB, D_DIM, M(tok_embd), false, NEED_ALWAYS},
    {"output_norm.weight", "model.norm.weight", D_DIM, D_NONE, M(output_norm), false, NEED_ALWAYS},
    {"output.weight", "lm_head.weight", D_VOCAB, D_DIM, M(output), false, NEED_UNTIED},
    {"blk.%d.attn_norm.weight", "model.layers.%d.input_layernorm.weight", D_DIM, D_NONE, L(attn_norm), true, NEED_ALWAYS},
    {"blk.%d.attn_q.weight", "model.layers.%d.self_attn.q_proj.weight", D_Q, D_DIM, L(wq), true, NEED_ALWAYS},
    {"blk.%d.attn_k.weight", "model.layers.%d.self_attn.k_proj.weight", D_KV, D_DIM, L(wk), true, NEED_ALWAYS},
    {"blk.%d.attn_v.weight", "model.layers.%d.self_attn.v_proj.weight", D_KV, D_DIM, L(wv), true, NEED_ALWAYS},
    {"blk.%d.attn_output.weight", "model.layers.%d.self_attn.o_proj.weight", D_DIM, D_Q, L(wo), true, NEED_ALWAYS},
    {"blk.%d.attn_q.bias", "model.layers.%d.self_attn.q_proj.bias", D_Q, D_NONE, L(bq), true, NEED_QKV_BIAS},
    {"blk.%d.attn_k.bias", "model.layers.%d.self_attn.k_proj.bias", D_KV, D_NONE, L(bk), true, NEED_QKV_BIAS},
    {"blk.%d.attn_v.bias", "model.layers.%d.self_attn.v_proj.bias", D_KV, D_NONE, L(bv), true, NEED_QKV_BIAS},
    {"blk.%d.attn_output.bias", "model.layers.%d.self_attn.o_proj.bias", D_DIM, D_NONE, L(bo), true, NEED_O_BIAS},
    {"blk.%d.attn_q_norm.weight", "model.layers.%d.self_attn.q_norm.weight", D_HEAD, D_NONE, L(q_norm), true, NEED_QK_NORM},
    {"blk.%d.attn_k_norm.weight", "model.layers.%d.self_attn.k_norm.weight", D_HEAD, D_NONE, L(k_norm), true, NEED_QK_NORM},
    {"blk.%d.ffn_norm.weight", "model.layers.%d.post_attention_layernorm.weight", D_DIM, D_NONE, L(ffn_norm), true, NEED_ALWAYS},
    {"blk.%d.ffn_gate.weight", "model.layers.%d.mlp.gate_proj.weight", D_FFN, D_DIM, L(w_gate), true, NEED_ALWAYS},
    {"blk.%d.ffn_up.weight", "model.layers.%d.mlp.up_proj.weight", D_FFN, D_DIM, L(w_up), true, NEED_ALWAYS},
    {"blk.%d.ffn_down.weight", "model.layers.%d.mlp.down_proj.weight", D_DIM, D_FFN, L(w_down), true, NEED_ALWAYS},
};
#undef L
#undef M

static int64_t dim_value(const pt_model_config *c, int d) {
    switch (d) {
    case D_DIM: return c->dim;
    case D_Q: return (int64_t)c->n_heads * c->head_dim;
    case D_KV: return (int64_t)c->n_kv_heads * c->head_dim;
    case D_FFN: return c->ffn_dim;
    case D_VOCAB: return c->vocab_size;
    case D_HEAD: return c->head_dim;
    default: return 0;
    }
}

static bool needed(const pt_model_config *c, int need) {
    switch (need) {
    case NEED_QKV_BIAS: return c->qkv_bias;
    case NEED_O_BIAS: return c->o_bias;
    case NEED_QK_NORM: return c->qk_norm;
    case NEED_UNTIED: return !c->tied_embeddings;
    default: return true;
    }
}

/* ---- Allocation owned by the model --------------------------------------- */

typedef struct owned_buf {
    struct owned_buf *next;
    void *p;
    size_t n;
} owned_buf;

void *pt_model_alloc(pt_model *m, size_t nbytes) {
    void *p = m->be->ops->alloc(m->be, nbytes);
    if (!p) return NULL;
    owned_buf *o = pt_xmalloc(sizeof *o);
    o->p = p;
    o->n = nbytes;
    o->next = m->owned;
    m->owned = o;
    return p;
}

void pt_model_free_owned(pt_model *m) {
    owned_buf *o = m->owned;
    while (o) {
        owned_buf *next = o->next;
        m->be->ops->free(m->be, o->p, o->n);
        free(o);
        o = next;
    }
    m->owned = NULL;
}

/* ---- From a file ---------------------------------------------------------- */

static void spec_name(const weight_spec *s, bool gguf, int layer, char *buf, size_t cap) {
    snprintf(buf, cap, gguf ? s->gguf : s->hf, layer);
}

/* Converts a vector tensor to f32 and places it in backend memory. */
static int bind_vector(pt_model *m, const pt_tensor_info *t, int64_t n, const float **out,
                       pt_err *err) {
    int64_t count = 1;
    for (int i = 0; i < t->ndim; i++) count *= t->shape[i];
    if (count != n)
        return pt_fail(err, "tensor %s: expected %lld elements, file has %lld", t->name,
                       (long long)n, (long long)count);
    float *host = pt_xmalloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) {
        const uint8_t *p = t->data;
        uint16_t h;
        switch (t->dtype) {
        case PT_F32: memcpy(&host[i], p + 4 * i, 4); break;
        case PT_F16: memcpy(&h, p + 2 * i, 2); host[i] = pt_f16_to_f32(h); break;
        case PT_BF16: memcpy(&h, p + 2 * i, 2); host[i] = pt_bf16_to_f32(h); break;
        default:
            free(host);
            return pt_fail(err, "tensor %s: vector of type %s is not supported", t->name,
                           pt_dtype_name(t->dtype));
        }
    }
    float *dev = pt_model_alloc(m, sizeof(float) * (size_t)n);
    if (!dev) {
        free(host);
        return pt_fail(err, "out of backend memory for tensor %s", t->name);
    }
    m->be->ops->upload(m->be, dev, host, sizeof(float) * (size_t)n);
    free(host);
    *out = dev;
    return 0;
}

static bool matrix_dtype_ok(pt_dtype t) {
    static const pt_dtype ok[] = {PT_F32, PT_F16, PT_BF16, PT_Q8_0, PT_Q4_0, PT_Q4_K, PT_Q5_K, PT_Q6_K};
    for (size_t i = 0; i < PT_ARRAY_LEN(ok); i++)
        if (ok[i] == t) return true;
    return false;
}

/* Places a tensor's bytes in backend memory (or points into the mapping). */
static const void *bind_bytes(pt_model *m, const pt_tensor_info *t, pt_err *err) {
    if (m->be->host_memory) return t->data;
    void *dev = pt_model_alloc(m, t->nbytes);
    if (!dev) {
        pt_fail(err, "out of backend memory for tensor %s", t->name);
        return NULL;
    }
    m->be->ops->upload(m->be, dev, t->data, t->nbytes);
    return dev;
}

static bool is_scale_dtype(pt_dtype t) {
    return t == PT_F16 || t == PT_BF16 || t == PT_F32;
}

/* An MLX affine matrix: <module>.weight holds rows x (cols * bits / 32)
 * uint32 codes; <module>.scales and .biases rows x (cols / group_size). */
static int bind_affine(pt_model *m, const pt_tensor_info *t, const pt_tensor_info *sc,
                       int64_t rows, int64_t cols, pt_weight *w, pt_err *err) {
    char module[160];
    snprintf(module, sizeof module, "%.*s", (int)(strlen(t->name) - strlen(".weight")), t->name);
    int bits, gs;
    if (pt_mlx_module_params(m->file->config, module, &bits, &gs, err)) return -1;
    char bname[176];
    snprintf(bname, sizeof bname, "%s.biases", module);
    const pt_tensor_info *bi = pt_model_file_tensor(m->file, bname);
    if (!bi) return pt_fail(err, "%s: has scales but no biases (%s)", module, bname);
    if (cols % gs)
        return pt_fail(err, "%s: %lld columns is not a multiple of group size %d", module,
                       (long long)cols, gs);
    int64_t words = cols * bits / 32, groups = cols / gs;
    if (t->dtype != PT_U32 || t->ndim != 2 || t->shape[0] != rows || t->shape[1] != words)
        return pt_fail(err, "tensor %s: expected %lldx%lld u32 (%lldx%lld at %d bits), file has "
                            "%s %lldx%lld",
                       t->name, (long long)rows, (long long)words, (long long)rows, (long long)cols,
                       bits, pt_dtype_name(t->dtype), (long long)t->shape[0],
                       (long long)(t->ndim > 1 ? t->shape[1] : 1));
    const pt_tensor_info *sb[2] = {sc, bi};
    for (int i = 0; i < 2; i++)
        if (!is_scale_dtype(sb[i]->dtype) || sb[i]->dtype != sc->dtype || sb[i]->ndim != 2 ||
            sb[i]->shape[0] != rows || sb[i]->shape[1] != groups)
            return pt_fail(err, "tensor %s: expected %lldx%lld %s (group size %d), file has %s "
                                "%lldx%lld",
                           sb[i]->name, (long long)rows, (long long)groups,
                           pt_dtype_name(sc->dtype), gs, pt_dtype_name(sb[i]->dtype),
                           (long long)sb[i]->shape[0],
                           (long long)(sb[i]->ndim > 1 ? sb[i]->shape[1] : 1));
    *w = (pt_weight){.dtype = PT_AFFINE, .rows = rows, .cols = cols, .bits = bits,
                     .group_size = gs, .scale_dtype = sc->dtype};
    if (!(w->data = bind_bytes(m, t, err)) || !(w->scales = bind_bytes(m, sc, err)) ||
        !(w->biases = bind_bytes(m, bi, err)))
        return -1;
    w->nbytes = t->nbytes + sc->nbytes + bi->nbytes;
    m->weight_bytes += w->nbytes;
    return 0;
}

static int bind_matrix(pt_model *m, const pt_tensor_info *t, int64_t rows, int64_t cols,
                       pt_weight *w, pt_err *err) {
    if (t->ndim != 2 || t->shape[0] != rows || t->shape[1] != cols)
        return pt_fail(err, "tensor %s: expected %lldx%lld, file has %s%lldx%lld", t->name,
                       (long long)rows, (long long)cols, t->ndim == 2 ? "" : "a non-matrix ",
                       (long long)t->shape[0], (long long)(t->ndim > 1 ? t->shape[1] : 1));
    if (!matrix_dtype_ok(t->dtype))
        return pt_fail(err, "tensor %s: weight type %s is not supported", t->name,
                       pt_dtype_name(t->dtype));
    if (cols % pt_dtype_get(t->dtype)->block)
        return pt_fail(err, "tensor %s: %lld columns is not a whole number of %s blocks", t->name,
                       (long long)cols, pt_dtype_name(t->dtype));
    w->dtype = t->dtype;
    w->rows = rows;
    w->cols = cols;
    w->nbytes = t->nbytes;
    if (!(w->data = bind_bytes(m, t, err))) return -1;
    m->weight_bytes += t->nbytes;
    return 0;
}

static int bind_one(pt_model *m, const weight_spec *s, int layer, pt_err *err) {
    const pt_model_config *c = &m->cfg;
    bool gguf = m->file->kind == PT_FILE_GGUF;
    char name[160];
    spec_name(s, gguf, layer, name, sizeof name);
    const pt_tensor_info *t = pt_model_file_tensor(m->file, name);
    void *base = s->per_layer ? (void *)&m->layers[layer] : (void *)m;
    if (!t) {
        if (!needed(c, s->need)) return 0;
        return pt_fail(err, "%s: missing tensor %s", m->file->path, name);
    }
    if (!needed(c, s->need) && s->need != NEED_UNTIED) return 0; /* e.g. unused bias */
    int64_t rows = dim_value(c, s->rows);
    if (s->cols == D_NONE) return bind_vector(m, t, rows, (const float **)((char *)base + s->off), err);
    pt_weight *w = (pt_weight *)((char *)base + s->off);
    if (!gguf) { /* MLX affine: a "<module>.scales" beside "<module>.weight" */
        char sname[176];
        snprintf(sname, sizeof sname, "%.*s.scales", (int)(strlen(name) - strlen(".weight")), name);
        const pt_tensor_info *sc = pt_model_file_tensor(m->file, sname);
        if (sc) return bind_affine(m, t, sc, rows, dim_value(c, s->cols), w, err);
    }
    return bind_matrix(m, t, rows, dim_value(c, s->cols), w, err);
}

int pt_model_bind_file_weights(pt_model *m, pt_err *err) {
    const pt_model_config *c = &m->cfg;
    for (size_t i = 0; i < PT_ARRAY_LEN(specs); i++) {
        int n = specs[i].per_layer ? c->n_layers : 1;
        for (int l = 0; l < n; l++)
            if (bind_one(m, &specs[i], l, err)) return -1;
    }
    if (!m->output.data) m->output = m->tok_embd; /* tied */
    return 0;
}

/* ---- Names ---------------------------------------------------------------- */

/* Matches name against a spec's pattern (one %d, the layer). */
static bool spec_match(const char *pattern, const char *name, int *layer) {
    const char *d = strstr(pattern, "%d");
    if (!d) return strcmp(pattern, name) == 0 && (*layer = 0, true);
    size_t pre = (size_t)(d - pattern);
    if (strncmp(pattern, name, pre) != 0) return false;
    char *end;
    long l = strtol(name + pre, &end, 10);
    if (end == name + pre || l < 0 || l > 100000 || strcmp(end, d + 2) != 0) return false;
    *layer = (int)l;
    return true;
}

static const weight_spec *spec_named(const char *name, int *layer, bool *gguf) {
    for (size_t i = 0; i < PT_ARRAY_LEN(specs); i++) {
        if (spec_match(specs[i].gguf, name, layer)) return *gguf = true, &specs[i];
        if (spec_match(specs[i].hf, name, layer)) return *gguf = false, &specs[i];
    }
    return NULL;
}

int pt_weight_hf_name(const char *gguf_name, char *out, size_t cap) {
    int layer;
    bool gguf;
    const weight_spec *s = spec_named(gguf_name, &layer, &gguf);
    if (!s || !gguf) return -1;
    spec_name(s, false, layer, out, cap);
    return 0;
}

pt_weight *pt_model_weight_named(pt_model *m, const char *name) {
    int layer;
    bool gguf;
    const weight_spec *s = spec_named(name, &layer, &gguf);
    if (!s || s->cols == D_NONE || (s->per_layer && layer >= m->cfg.n_layers)) return NULL;
    return (pt_weight *)((char *)(s->per_layer ? (void *)&m->layers[layer] : (void *)m) + s->off);
}

/* ---- Dummy weights -------------------------------------------------------- */

/* Random values, cheaply: a table of 64Ki uniform values in [-a, a) (a =
 * sqrt(3 / cols): unit variance per output, so activations neither vanish nor
 * explode through the layers), stored in the weight format once, and copied
 * in 1 KiB-element runs from random offsets.  Filling 16 GB this way runs at
 * memcpy speed; values per element would take a minute.
 *
 * Any format is a flat sequence of units whose bytes can be copied as they
 * are: an element (f32, f16, bf16), a block (GGUF) or a group (MLX affine,
 * with its scale and bias).  Rows start on a unit, so runs may cross rows. */
#define DUMMY_TABLE (1 << 16)
#define DUMMY_RUN 1024

typedef struct units {
    size_t elems, code_bytes, scale_bytes; /* per unit */
} units;

static units units_of(const pt_weight_format *f) {
    if (f->dtype == PT_AFFINE)
        return (units){(size_t)f->group_size, (size_t)(f->group_size * f->bits / 8),
                       pt_dtype_bytes(f->scale_dtype, 1)};
    const pt_dtype_info *d = pt_dtype_get(f->dtype);
    return (units){(size_t)d->block, (size_t)d->block_bytes, 0};
}

typedef struct dummy_table {
    uint8_t *codes, *scales, *biases;
} dummy_table;

static void make_table(dummy_table *tb, const pt_weight_format *f, float a, pt_rng *rng) {
    size_t n = DUMMY_TABLE + DUMMY_RUN;
    float *x = pt_xmalloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++) x[i] = (float)((pt_rng_uniform(rng) * 2 - 1) * a);
    units u = units_of(f);
    memset(tb, 0, sizeof *tb);
    tb->codes = pt_xmalloc(n / u.elems * u.code_bytes);
    if (f->dtype == PT_AFFINE) {
        tb->scales = pt_xmalloc(n / u.elems * u.scale_bytes);
        tb->biases = pt_xmalloc(n / u.elems * u.scale_bytes);
        pt_affine_quantize_row(x, (int64_t)n, f->bits, f->group_size, f->scale_dtype,
                               (uint32_t *)tb->codes, tb->scales, tb->biases);
    } else if (pt_gguf_quant_type(f->dtype)) {
        pt_gguf_quantize(f->dtype, x, tb->codes, (int64_t)n);
    } else {
        for (size_t i = 0; i < n; i++) pt_quant_store(tb->codes, (int64_t)i, f->dtype, x[i]);
    }
    free(x);
}

static void free_table(dummy_table *tb) {
    free(tb->codes);
    free(tb->scales);
    free(tb->biases);
}

static void fill_units(const dummy_table *tb, units u, uint8_t *codes, uint8_t *scales,
                       uint8_t *biases, size_t n_units, pt_rng *rng) {
    size_t table_units = DUMMY_TABLE / u.elems, run = DUMMY_RUN / u.elems;
    for (size_t i = 0; i < n_units; i += run) {
        size_t off = pt_rng_next(rng) % table_units, len = PT_MIN(run, n_units - i);
        memcpy(codes + i * u.code_bytes, tb->codes + off * u.code_bytes, len * u.code_bytes);
        if (!u.scale_bytes) continue;
        memcpy(scales + i * u.scale_bytes, tb->scales + off * u.scale_bytes, len * u.scale_bytes);
        memcpy(biases + i * u.scale_bytes, tb->biases + off * u.scale_bytes, len * u.scale_bytes);
    }
}

/* Backend memory of n bytes and a host buffer to fill it through. */
static int dummy_buffer(pt_model *m, size_t n, void **dev, uint8_t **host, const char *what,
                        pt_err *err) {
    *dev = n ? pt_model_alloc(m, n) : NULL;
    *host = m->be->host_memory ? *dev : (n ? pt_alloc_big(n) : NULL);
    if (n && (!*dev || !*host)) {
        if (*host && (void *)*host != *dev) pt_free_big(*host, n);
        return pt_fail(err, "dummy weights: cannot allocate %.1f MiB for %s", n / 1048576.0, what);
    }
    return 0;
}

static void dummy_upload(pt_model *m, void *dev, uint8_t *host, size_t n) {
    if (n && (void *)host != dev) {
        m->be->ops->upload(m->be, dev, host, n);
        pt_free_big(host, n);
    }
}

static int dummy_vector(pt_model *m, const weight_spec *s, void *base, pt_rng *rng, pt_err *err) {
    int64_t n = dim_value(&m->cfg, s->rows);
    void *dev;
    uint8_t *host;
    if (dummy_buffer(m, sizeof(float) * (size_t)n, &dev, &host, s->hf, err)) return -1;
    for (int64_t i = 0; i < n; i++)
        ((float *)host)[i] = 1.0f + 0.1f * (float)(pt_rng_uniform(rng) - 0.5);
    dummy_upload(m, dev, host, sizeof(float) * (size_t)n);
    *(const float **)((char *)base + s->off) = dev;
    return 0;
}

static int dummy_matrix(pt_model *m, const weight_spec *s, int layer, void *base,
                        const pt_weight_format *f, pt_rng *rng, pt_err *err) {
    int64_t rows = dim_value(&m->cfg, s->rows), cols = dim_value(&m->cfg, s->cols);
    units u = units_of(f);
    if (cols % (int64_t)u.elems) {
        char name[160];
        spec_name(s, false, layer, name, sizeof name);
        return pt_fail(err, "dummy weights: %s has %lld columns, not a multiple of the %zu of %s "
                            "blocks or groups",
                       name, (long long)cols, u.elems, pt_dtype_name(f->dtype));
    }
    size_t n_units = (size_t)rows * (size_t)cols / u.elems;
    size_t cb = n_units * u.code_bytes, sb = n_units * u.scale_bytes;
    void *dev[3];
    uint8_t *host[3];
    if (dummy_buffer(m, cb, &dev[0], &host[0], s->hf, err) ||
        dummy_buffer(m, sb, &dev[1], &host[1], s->hf, err) ||
        dummy_buffer(m, sb, &dev[2], &host[2], s->hf, err))
        return -1;
    dummy_table tb;
    make_table(&tb, f, sqrtf(3.0f / (float)cols), rng);
    fill_units(&tb, u, host[0], host[1], host[2], n_units, rng);
    free_table(&tb);
    dummy_upload(m, dev[0], host[0], cb);
    dummy_upload(m, dev[1], host[1], sb);
    dummy_upload(m, dev[2], host[2], sb);
    pt_weight *w = (pt_weight *)((char *)base + s->off);
    *w = (pt_weight){.dtype = f->dtype, .rows = rows, .cols = cols, .data = dev[0],
                     .nbytes = cb + 2 * sb, .bits = f->bits, .group_size = f->group_size,
                     .scales = dev[1], .biases = dev[2], .scale_dtype = f->scale_dtype};
    m->weight_bytes += w->nbytes;
    return 0;
}

static int parse_format(const char *format, pt_weight_format *f, pt_err *err) {
    if (pt_weight_format_parse(format, f) == 0) return 0;
    return pt_fail(err, "dummy weights: unknown dtype '%s' (f32, f16, bf16, q8_0, q4_0, q4_k, "
                        "q5_k, q6_k, affineB or affineBgG with B in 2,3,4,5,6,8 and G in 32,64,128)",
                   format);
}

int pt_model_dummy_bytes(const pt_model_config *c, const char *format, size_t *out, pt_err *err) {
    pt_weight_format f;
    if (parse_format(format, &f, err)) return -1;
    *out = 0;
    for (size_t i = 0; i < PT_ARRAY_LEN(specs); i++) {
        if (specs[i].cols == D_NONE || !needed(c, specs[i].need)) continue;
        size_t one = pt_weight_format_bytes(&f, dim_value(c, specs[i].rows), dim_value(c, specs[i].cols));
        *out += one * (size_t)(specs[i].per_layer ? c->n_layers : 1);
    }
    return 0;
}

int pt_model_make_dummy_weights(pt_model *m, const char *format, uint64_t seed, pt_err *err) {
    pt_weight_format f;
    if (parse_format(format, &f, err)) return -1;
    pt_rng rng;
    pt_rng_seed(&rng, seed);
    for (size_t i = 0; i < PT_ARRAY_LEN(specs); i++) {
        const weight_spec *s = &specs[i];
        if (!needed(&m->cfg, s->need)) continue;
        for (int l = 0; l < (s->per_layer ? m->cfg.n_layers : 1); l++) {
            void *base = s->per_layer ? (void *)&m->layers[l] : (void *)m;
            if (s->cols == D_NONE ? dummy_vector(m, s, base, &rng, err)
                                  : dummy_matrix(m, s, l, base, &f, &rng, err))
                return -1;
        }
    }
    if (!m->output.data) m->output = m->tok_embd;
    return 0;
}
