/*
 * dummy.c - random weights of a family's shapes, for benchmarking without
 * downloads (vLLM's "dummy" load format).
 *
 * Every spec of the model's family (and its dummy_weights: what a file
 * gives in another layout) gets values in the requested format
 * (f32, f16, bf16, a GGUF block type or MLX affine), from a seeded RNG in
 * table order, so a seed gives the same model every time.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "base/progress.h"
#include "model/model_int.h"
#include "quant/quant.h"

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

static int dummy_vector(pt_model *m, const pt_weight_spec *s, int layer, pt_rng *rng,
                        pt_err *err) {
    int64_t n = pt_spec_dim(&m->cfg, s->rows, layer);
    void *dev;
    uint8_t *host;
    if (dummy_buffer(m, sizeof(float) * (size_t)n, &dev, &host, s->hf, err)) return -1;
    for (int64_t i = 0; i < n; i++)
        ((float *)host)[i] = 1.0f + 0.1f * (float)(pt_rng_uniform(rng) - 0.5);
    dummy_upload(m, dev, host, sizeof(float) * (size_t)n);
    *(const float **)pt_spec_target(m, s, layer) = dev;
    return 0;
}

/* A matrix, or a stack of n_experts of them (experts one after another in
 * each of the three buffers). */
static int dummy_matrix(pt_model *m, const pt_weight_spec *s, int layer, const pt_weight_format *f,
                        pt_rng *rng, pt_err *err) {
    int64_t rows = pt_spec_dim(&m->cfg, s->rows, layer), cols = pt_spec_dim(&m->cfg, s->cols, layer);
    int64_t n_experts = pt_spec_dim(&m->cfg, s->experts, layer);
    units u = units_of(f);
    if (cols % (int64_t)u.elems) {
        char name[160];
        pt_spec_name(s, false, layer, name, sizeof name);
        return pt_fail(err, "dummy weights: %s has %lld columns, not a multiple of the %zu of %s "
                            "blocks or groups",
                       name, (long long)cols, u.elems, pt_dtype_name(f->dtype));
    }
    size_t per_expert = (size_t)rows * (size_t)cols / u.elems;
    size_t n_units = per_expert * (size_t)PT_MAX(n_experts, 1);
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
    pt_weight *w = pt_spec_target(m, s, layer);
    *w = (pt_weight){.dtype = f->dtype, .rows = rows, .cols = cols, .data = dev[0],
                     .nbytes = cb + 2 * sb, .bits = f->bits, .group_size = f->group_size,
                     .scales = dev[1], .biases = dev[2], .scale_dtype = f->scale_dtype,
                     .n_experts = (int)n_experts,
                     .expert_stride = n_experts ? per_expert * u.code_bytes : 0};
    m->weight_bytes += w->nbytes;
    if (m->progress) pt_progress_add(m->progress, w->nbytes);
    return pt_model_repack_weight(m, w, true, err);
}

static int parse_format(const char *format, pt_weight_format *f, pt_err *err) {
    if (pt_weight_format_parse(format, f) == 0) return 0;
    return pt_fail(err, "dummy weights: unknown dtype '%s' (f32, f16, bf16, q8_0, q4_0, q4_k, "
                        "q5_k, q6_k, affineB or affineBgG with B in 2,3,4,5,6,8 and G in 32,64,128)",
                   format);
}

/* The family's specs, then the ones only dummy models make. */
static const pt_weight_spec *spec_at(const pt_family *fam, size_t i) {
    return i < fam->n_weights ? &fam->weights[i] : &fam->dummy_weights[i - fam->n_weights];
}

int pt_model_dummy_bytes(const pt_model_config *c, const char *format, size_t *out, pt_err *err) {
    const pt_family *fam = pt_family_of(c->arch);
    if (!fam) return pt_fail(err, "dummy weights: unknown architecture '%s'", c->arch);
    return pt_family_dummy_bytes(fam, c, format, out, err);
}

int pt_family_dummy_bytes(const pt_family *fam, const pt_model_config *c, const char *format,
                          size_t *out, pt_err *err) {
    pt_weight_format f;
    if (parse_format(format, &f, err)) return -1;
    *out = 0;
    for (size_t i = 0; i < fam->n_weights + fam->n_dummy_weights; i++) {
        const pt_weight_spec *s = spec_at(fam, i);
        if (s->cols == D_NONE) continue;
        for (int l = 0; l < (s->per_layer ? c->n_layers : 1); l++) {
            if (!pt_spec_needed(c, s->need, l)) continue;
            size_t one = pt_weight_format_bytes(&f, pt_spec_dim(c, s->rows, l),
                                                pt_spec_dim(c, s->cols, l));
            *out += one * (size_t)PT_MAX(pt_spec_dim(c, s->experts, l), 1);
        }
    }
    return 0;
}

int pt_model_make_dummy_weights(pt_model *m, const char *format, uint64_t seed, pt_err *err) {
    pt_weight_format f;
    if (parse_format(format, &f, err)) return -1;
    pt_rng rng;
    pt_rng_seed(&rng, seed);
    size_t total = 0;
    if (pt_model_dummy_bytes(&m->cfg, format, &total, err)) return -1;
    pt_progress progress;
    pt_progress_begin(&progress, "making dummy weights", total);
    m->progress = &progress;
    const pt_family *fam = m->family;
    int rc = 0;
    for (size_t i = 0; i < fam->n_weights + fam->n_dummy_weights && !rc; i++) {
        const pt_weight_spec *s = spec_at(fam, i);
        for (int l = 0; l < (s->per_layer ? m->cfg.n_layers : 1) && !rc; l++)
            if (pt_spec_needed(&m->cfg, s->need, l))
                rc = s->cols == D_NONE ? dummy_vector(m, s, l, &rng, err)
                                   : dummy_matrix(m, s, l, &f, &rng, err);
    }
    m->progress = NULL;
    if (rc) return -1;
    pt_progress_end(&progress);
    if (!m->output.data) m->output = m->tok_embd;
    return 0;
}
