/*
 * weights.c - binding the model's weights: by name from a file, or random
 * ("dummy") ones of the right shapes for benchmarking.
 *
 * A table lists every weight once with its GGUF and Hugging Face names, its
 * expected shape in terms of the config, and whether the architecture needs
 * it.  Matrices stay in the file's dtype and, on a backend whose memory is
 * host memory, point straight into the mapping (zero copy).  Vectors (norm
 * gains, biases) are small and converted to f32.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "model/model.h"

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
    return t == PT_F32 || t == PT_F16 || t == PT_BF16;
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
    w->dtype = t->dtype;
    w->rows = rows;
    w->cols = cols;
    w->nbytes = t->nbytes;
    if (m->be->host_memory) {
        w->data = t->data;
    } else {
        void *dev = pt_model_alloc(m, t->nbytes);
        if (!dev) return pt_fail(err, "out of backend memory for tensor %s", t->name);
        m->be->ops->upload(m->be, dev, t->data, t->nbytes);
        w->data = dev;
    }
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
    return bind_matrix(m, t, rows, dim_value(c, s->cols), (pt_weight *)((char *)base + s->off), err);
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

/* ---- Dummy weights -------------------------------------------------------- */

/* Random values, cheaply: a table of 64Ki uniform values in [-a, a) (a =
 * sqrt(3 / cols): unit variance per output, so activations neither vanish nor
 * explode through the layers), copied in 1 KiB-element runs from random
 * offsets.  Filling 16 GB this way runs at memcpy speed; values per element
 * would take a minute. */
#define DUMMY_TABLE (1 << 16)
#define DUMMY_RUN 1024

static void fill_random(void *dst, pt_dtype dt, size_t n, float a, pt_rng *rng) {
    size_t es = pt_dtype_bytes(dt, 1);
    uint8_t *table = pt_xmalloc(es * (DUMMY_TABLE + DUMMY_RUN));
    for (size_t i = 0; i < DUMMY_TABLE + DUMMY_RUN; i++) {
        float x = (float)((pt_rng_uniform(rng) * 2 - 1) * a);
        uint16_t h = dt == PT_F16 ? pt_f32_to_f16(x) : pt_f32_to_bf16(x);
        if (dt == PT_F32) memcpy(table + 4 * i, &x, 4);
        else memcpy(table + 2 * i, &h, 2);
    }
    for (size_t i = 0; i < n; i += DUMMY_RUN) {
        size_t off = pt_rng_next(rng) % DUMMY_TABLE, len = PT_MIN((size_t)DUMMY_RUN, n - i);
        memcpy((uint8_t *)dst + i * es, table + off * es, len * es);
    }
    free(table);
}

static int dummy_one(pt_model *m, const weight_spec *s, int layer, pt_dtype dt, pt_rng *rng,
                     pt_err *err) {
    const pt_model_config *c = &m->cfg;
    if (!needed(c, s->need)) return 0;
    void *base = s->per_layer ? (void *)&m->layers[layer] : (void *)m;
    int64_t rows = dim_value(c, s->rows);
    bool vector = s->cols == D_NONE;
    int64_t cols = vector ? 1 : dim_value(c, s->cols);
    pt_dtype t = vector ? PT_F32 : dt;
    size_t count = (size_t)rows * (size_t)cols, nbytes = pt_dtype_bytes(t, count);
    void *dev = pt_model_alloc(m, nbytes);
    void *host = m->be->host_memory ? dev : pt_alloc_big(nbytes);
    if (!dev || !host) {
        if (host && host != dev) pt_free_big(host, nbytes);
        return pt_fail(err, "dummy weights: cannot allocate %.1f MiB for %s", nbytes / 1048576.0,
                       s->hf);
    }
    if (vector) {
        for (size_t i = 0; i < count; i++)
            ((float *)host)[i] = 1.0f + 0.1f * (float)(pt_rng_uniform(rng) - 0.5);
    } else {
        fill_random(host, t, count, sqrtf(3.0f / (float)cols), rng);
    }
    if (host != dev) {
        m->be->ops->upload(m->be, dev, host, nbytes);
        pt_free_big(host, nbytes);
    }
    if (vector) {
        *(const float **)((char *)base + s->off) = dev;
    } else {
        pt_weight *w = (pt_weight *)((char *)base + s->off);
        w->dtype = t;
        w->rows = rows;
        w->cols = cols;
        w->data = dev;
        w->nbytes = nbytes;
        m->weight_bytes += nbytes;
    }
    return 0;
}

int pt_model_make_dummy_weights(pt_model *m, pt_dtype dt, uint64_t seed, pt_err *err) {
    pt_rng rng;
    pt_rng_seed(&rng, seed);
    for (size_t i = 0; i < PT_ARRAY_LEN(specs); i++) {
        int n = specs[i].per_layer ? m->cfg.n_layers : 1;
        for (int l = 0; l < n; l++)
            if (dummy_one(m, &specs[i], l, dt, &rng, err)) return -1;
    }
    if (!m->output.data) m->output = m->tok_embd;
    return 0;
}
