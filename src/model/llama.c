/*
 * llama.c - the forward pass of the dense Llama family, and model loading.
 *
 * One function, written once against the backend op table, runs any mix of
 * prefill and decode rows: x = embed(tokens); per layer
 *     h = rmsnorm(x); q,k,v = h·Wq,Wk,Wv (+bias) (qk-norm) (rope);
 *     store k,v in the paged cache; x += attention(q, cache)·Wo;
 *     h = rmsnorm(x); x += (silu(h·Wgate) * h·Wup)·Wdown;
 * then logits = rmsnorm(x)·Woutᵀ for the rows that want them.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "model/model.h"

#define OUT_ROWS 32 /* logits computed per output chunk */

/* Activation and batch buffers in backend memory, sized once at load for
 * max_batch rows, so a decode step allocates nothing. */
struct pt_workspace {
    int cap;
    float *x, *h, *q, *k, *v, *att, *gate, *up, *out_h, *logits;
    int32_t *tokens, *pos, *seq, *out_idx, *block_table;
    size_t bt_cap; /* int32 entries in block_table */
    /* host staging */
    int32_t *h_block_table, *h_out_idx;
};

static int workspace_init(pt_model *m, int cap, pt_err *err) {
    const pt_model_config *c = &m->cfg;
    pt_workspace *ws = pt_xcalloc(1, sizeof *ws);
    m->ws = ws;
    ws->cap = cap;
    size_t q = (size_t)c->n_heads * c->head_dim, kvd = (size_t)c->n_kv_heads * c->head_dim;
    struct {
        void **p;
        size_t n;
    } bufs[] = {
        {(void **)&ws->x, (size_t)cap * c->dim * 4},   {(void **)&ws->h, (size_t)cap * c->dim * 4},
        {(void **)&ws->q, (size_t)cap * q * 4},        {(void **)&ws->k, (size_t)cap * kvd * 4},
        {(void **)&ws->v, (size_t)cap * kvd * 4},      {(void **)&ws->att, (size_t)cap * q * 4},
        {(void **)&ws->gate, (size_t)cap * c->ffn_dim * 4},
        {(void **)&ws->up, (size_t)cap * c->ffn_dim * 4},
        {(void **)&ws->out_h, (size_t)OUT_ROWS * c->dim * 4},
        {(void **)&ws->logits, (size_t)OUT_ROWS * c->vocab_size * 4},
        {(void **)&ws->tokens, (size_t)cap * 4},       {(void **)&ws->pos, (size_t)cap * 4},
        {(void **)&ws->seq, (size_t)cap * 4},          {(void **)&ws->out_idx, (size_t)cap * 4},
    };
    for (size_t i = 0; i < PT_ARRAY_LEN(bufs); i++)
        if (!(*bufs[i].p = pt_model_alloc(m, bufs[i].n)))
            return pt_fail(err, "cannot allocate %.1f MiB of activations", bufs[i].n / 1048576.0);
    ws->h_out_idx = pt_xmalloc(sizeof(int32_t) * (size_t)cap);
    return 0;
}

static void workspace_free(pt_model *m) {
    pt_workspace *ws = m->ws;
    if (!ws) return;
    if (ws->block_table) m->be->ops->free(m->be, ws->block_table, ws->bt_cap * 4);
    free(ws->h_block_table);
    free(ws->h_out_idx);
    free(ws);
    m->ws = NULL;
}

/* Grows the block-table buffers (by doubling, so rarely). */
static int workspace_block_table(pt_model *m, size_t need, pt_err *err) {
    pt_workspace *ws = m->ws;
    if (need <= ws->bt_cap) return 0;
    size_t cap = PT_MAX(need, ws->bt_cap * 2);
    if (ws->block_table) m->be->ops->free(m->be, ws->block_table, ws->bt_cap * 4);
    ws->block_table = m->be->ops->alloc(m->be, cap * 4);
    ws->bt_cap = ws->block_table ? cap : 0;
    if (!ws->block_table) return pt_fail(err, "cannot allocate the block table");
    ws->h_block_table = pt_xrealloc(ws->h_block_table, cap * 4);
    return 0;
}

/* ---- Loading ------------------------------------------------------------- */

static int finish_load(pt_model *m, const pt_model_opts *o, pt_err *err) {
    const pt_model_config *c = &m->cfg;
    float *freq = pt_xmalloc(sizeof(float) * (size_t)(c->n_rot / 2));
    pt_rope_inv_freq(c, freq);
    float *dev = pt_model_alloc(m, sizeof(float) * (size_t)(c->n_rot / 2));
    if (dev) m->be->ops->upload(m->be, dev, freq, sizeof(float) * (size_t)(c->n_rot / 2));
    free(freq);
    if (!dev) return pt_fail(err, "out of backend memory");
    m->rope_inv_freq = dev;
    m->max_batch = o->max_batch > 0 ? o->max_batch : 512;
    return workspace_init(m, m->max_batch, err);
}

static int load_dummy(pt_model *m, const char *spec, const pt_model_opts *o, pt_err *err) {
    const char *json_text = pt_config_preset(spec);
    char *file_text = NULL;
    if (!json_text) {
        size_t len;
        if (pt_read_file(spec, 1 << 20, &file_text, &len, err))
            return pt_failp(err, "dummy:%s is neither a preset (llama-1b, llama-8b, qwen3-8b) "
                                 "nor a readable config.json",
                            spec);
        json_text = file_text;
    }
    json_error_t jerr;
    json_t *j = json_loads(json_text, 0, &jerr);
    free(file_text);
    if (!j) return pt_fail(err, "dummy:%s: bad JSON at line %d: %s", spec, jerr.line, jerr.text);
    int rc = pt_config_from_json(j, &m->cfg, err);
    json_decref(j);
    if (rc) return -1;
    const char *dt = o->dummy_dtype ? o->dummy_dtype : "bf16";
    const pt_model_config *c = &m->cfg;
    /* Say what it needs before trying: the user sees a clear reason. */
    size_t need;
    if (pt_model_dummy_bytes(c, dt, &need, err)) return -1;
    size_t avail = pt_mem_available();
    if (m->be->host_memory && avail && need > avail)
        return pt_fail(err, "dummy:%s in %s needs %.1f GiB of memory, %.1f GiB available", spec, dt,
                       need / 1073741824.0, avail / 1073741824.0);
    m->layers = pt_xcalloc((size_t)c->n_layers, sizeof(pt_layer));
    return pt_model_make_dummy_weights(m, dt, o->dummy_seed, err);
}

static int load_file(pt_model *m, const char *path, pt_err *err) {
    if (pt_model_file_open(&m->file, path, err)) return -1;
    if (pt_config_from_file(m->file, &m->cfg, err)) return -1;
    size_t need = pt_model_file_bytes(m->file), avail = pt_mem_available();
    if (avail && need > avail + avail / 4)
        return pt_fail(err, "%s: weights need %.1f GiB of memory, %.1f GiB available", path,
                       need / 1073741824.0, avail / 1073741824.0);
    m->layers = pt_xcalloc((size_t)m->cfg.n_layers, sizeof(pt_layer));
    return pt_model_bind_file_weights(m, err);
}

int pt_model_load(pt_model **out, const char *path, const pt_model_opts *o, pt_err *err) {
    *out = NULL;
    if (!o || !o->backend) return pt_fail(err, "pt_model_load: no backend");
    pt_model *m = pt_xcalloc(1, sizeof *m);
    m->be = o->backend;
    int rc = strncmp(path, "dummy:", 6) == 0 ? load_dummy(m, path + 6, o, err)
                                             : load_file(m, path, err);
    if (rc == 0) rc = finish_load(m, o, err);
    if (rc) {
        pt_model_free(m);
        return -1;
    }
    *out = m;
    return 0;
}

void pt_model_free(pt_model *m) {
    if (!m) return;
    workspace_free(m);
    pt_model_free_owned(m);
    free(m->layers);
    if (m->file) pt_model_file_close(m->file);
    free(m);
}

int pt_model_kv_init(const pt_model *m, pt_kv_cache *kv, int n_positions, pt_dtype dtype,
                     const pt_kvq_spec *quant, pt_err *err) {
    const pt_model_config *c = &m->cfg;
    pt_kv_config kc = {.n_layers = c->n_layers,
                       .n_kv_heads = c->n_kv_heads,
                       .head_dim = c->head_dim,
                       .page_size = PT_KV_PAGE_SIZE,
                       .dtype = dtype};
    if (quant) kc.quant = *quant;
    kc.n_pages = (n_positions + kc.page_size - 1) / kc.page_size;
    return pt_kv_cache_init(kv, m->be, &kc, err);
}

/* ---- Forward ------------------------------------------------------------- */

static void matmul_bias(pt_backend *be, float *y, const float *x, const pt_weight *w,
                        const float *bias, int n) {
    be->ops->matmul(be, y, x, w, n);
    if (bias) be->ops->add_bias(be, y, bias, n, (int)w->rows);
}

static void layer_forward(pt_model *m, const pt_layer *L, pt_kv_view kv, const pt_batch_view *b) {
    pt_backend *be = m->be;
    const pt_backend_ops *op = be->ops;
    const pt_model_config *c = &m->cfg;
    pt_workspace *ws = m->ws;
    int n = b->n_tokens;
    pt_rope rope = {c->rope_style, c->n_rot, m->rope_inv_freq, 1.0f};

    op->rmsnorm(be, ws->h, ws->x, L->attn_norm, n, c->dim, c->norm_eps);
    matmul_bias(be, ws->q, ws->h, &L->wq, L->bq, n);
    matmul_bias(be, ws->k, ws->h, &L->wk, L->bk, n);
    matmul_bias(be, ws->v, ws->h, &L->wv, L->bv, n);
    if (c->qk_norm) {
        op->rmsnorm(be, ws->q, ws->q, L->q_norm, n * c->n_heads, c->head_dim, c->norm_eps);
        op->rmsnorm(be, ws->k, ws->k, L->k_norm, n * c->n_kv_heads, c->head_dim, c->norm_eps);
    }
    op->rope(be, ws->q, b, c->n_heads, c->head_dim, &rope);
    op->rope(be, ws->k, b, c->n_kv_heads, c->head_dim, &rope);
    op->kv_store(be, &kv, b, ws->k, ws->v);
    op->attention(be, ws->att, ws->q, &kv, b, c->n_heads, 1.0f / sqrtf((float)c->head_dim));
    matmul_bias(be, ws->h, ws->att, &L->wo, L->bo, n);
    op->add(be, ws->x, ws->x, ws->h, (size_t)n * c->dim);

    op->rmsnorm(be, ws->h, ws->x, L->ffn_norm, n, c->dim, c->norm_eps);
    op->matmul(be, ws->gate, ws->h, &L->w_gate, n);
    op->matmul(be, ws->up, ws->h, &L->w_up, n);
    op->swiglu(be, ws->gate, ws->gate, ws->up, (size_t)n * c->ffn_dim);
    op->matmul(be, ws->h, ws->gate, &L->w_down, n);
    op->add(be, ws->x, ws->x, ws->h, (size_t)n * c->dim);
}

/* Final norm and output projection for the wanted rows, OUT_ROWS at a time,
 * straight into the caller's buffer. */
static void output_forward(pt_model *m, int n_out, float *logits) {
    pt_backend *be = m->be;
    pt_workspace *ws = m->ws;
    const pt_model_config *c = &m->cfg;
    for (int i = 0; i < n_out; i += OUT_ROWS) {
        int k = PT_MIN(OUT_ROWS, n_out - i);
        be->ops->gather_rows(be, ws->out_h, ws->x, ws->out_idx + i, k, c->dim);
        be->ops->rmsnorm(be, ws->out_h, ws->out_h, m->output_norm, k, c->dim, c->norm_eps);
        be->ops->matmul(be, ws->logits, ws->out_h, &m->output, k);
        be->ops->download(be, logits + (size_t)i * c->vocab_size, ws->logits,
                          sizeof(float) * (size_t)k * c->vocab_size);
    }
}

static int check_batch(pt_model *m, pt_kv_cache *kv, const pt_batch *b, int first, int n,
                       pt_err *err) {
    for (int i = first; i < first + n; i++) {
        if (b->tokens[i] < 0 || b->tokens[i] >= m->cfg.vocab_size)
            return pt_fail(err, "token id %d out of range (vocabulary %d)", b->tokens[i],
                           m->cfg.vocab_size);
        if (b->seq[i] < 0 || b->seq[i] >= b->n_seqs)
            return pt_fail(err, "row %d: sequence index %d out of range", i, b->seq[i]);
        if (b->pos[i] < 0) return pt_fail(err, "row %d: negative position", i);
        if (b->pos[i] >= b->seqs[b->seq[i]]->n_pages * kv->cfg.page_size)
            return pt_fail(err, "row %d: position %d has no KV page (the caller reserves them)", i,
                           b->pos[i]);
    }
    return 0;
}

/* Uploads rows [first, first+n) and the block tables; fills the view. */
static int upload_batch(pt_model *m, const pt_batch *b, int first, int n, pt_batch_view *v,
                        int *n_out, pt_err *err) {
    pt_backend *be = m->be;
    pt_workspace *ws = m->ws;
    int max_pages = 1;
    for (int s = 0; s < b->n_seqs; s++) max_pages = PT_MAX(max_pages, b->seqs[s]->n_pages);
    if (workspace_block_table(m, (size_t)max_pages * b->n_seqs, err)) return -1;
    for (int s = 0; s < b->n_seqs; s++) {
        const pt_kv_seq *sq = b->seqs[s];
        int32_t *row = ws->h_block_table + (size_t)s * max_pages;
        memcpy(row, sq->pages, sizeof(int32_t) * (size_t)sq->n_pages);
        for (int p = sq->n_pages; p < max_pages; p++) row[p] = -1;
    }
    be->ops->upload(be, ws->block_table, ws->h_block_table,
                    sizeof(int32_t) * (size_t)max_pages * b->n_seqs);
    be->ops->upload(be, ws->tokens, b->tokens + first, sizeof(int32_t) * (size_t)n);
    be->ops->upload(be, ws->pos, b->pos + first, sizeof(int32_t) * (size_t)n);
    be->ops->upload(be, ws->seq, b->seq + first, sizeof(int32_t) * (size_t)n);
    *n_out = 0;
    for (int i = 0; i < n; i++)
        if (b->logits && b->logits[first + i]) ws->h_out_idx[(*n_out)++] = i;
    be->ops->upload(be, ws->out_idx, ws->h_out_idx, sizeof(int32_t) * (size_t)*n_out);
    *v = (pt_batch_view){n, ws->pos, ws->seq, ws->block_table, max_pages, b->n_seqs};
    return 0;
}

int pt_model_forward(pt_model *m, pt_kv_cache *kv, const pt_batch *b, float *logits,
                     pt_err *err) {
    const pt_model_config *c = &m->cfg;
    for (int first = 0; first < b->n_tokens; first += m->max_batch) {
        int n = PT_MIN(m->max_batch, b->n_tokens - first), n_out;
        pt_batch_view v;
        if (check_batch(m, kv, b, first, n, err)) return -1;
        if (upload_batch(m, b, first, n, &v, &n_out, err)) return -1;
        m->be->ops->embed(m->be, m->ws->x, &m->tok_embd, m->ws->tokens, n);
        for (int l = 0; l < c->n_layers; l++) layer_forward(m, &m->layers[l], pt_kv_layer(kv, l), &v);
        if (n_out) {
            output_forward(m, n_out, logits);
            logits += (size_t)n_out * c->vocab_size;
        }
    }
    m->be->ops->sync(m->be);
    return 0;
}
