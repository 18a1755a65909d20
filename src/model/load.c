/*
 * load.c - loading a model, whatever its family: the config (from a file,
 * or a preset / config.json for dummy weights), the layer plan, the
 * weights, the rope tables and the workspace; and the KV geometry the model
 * asks for.
 *
 * Order matters for the user: the plan is built right after the config, so
 * a model that asks for a layer kind we cannot run is refused with that
 * reason before any weight is read or memory is spent.
 *
 * Every backend buffer the model holds is on its owned list (pt_model_alloc)
 * and freed with it; the workspace is allocated once for max_batch rows so
 * a forward allocates nothing (the block table may grow, by doubling).
 */
#include <stdio.h>
#include <stdlib.h>

#include "backend/comm.h"
#include "model/model_int.h"

/* ---- Allocations owned by the model ----------------------------------------- */

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

/* ---- Workspace ---------------------------------------------------------------- */

static int moe_workspace(pt_model *m, int cap, pt_err *err);

int pt_model_workspace_init(pt_model *m, int cap, pt_err *err) {
    const pt_model_config *c = &m->cfg;
    pt_workspace *ws = pt_xcalloc(1, sizeof *ws);
    m->ws = ws;
    ws->cap = cap;
    size_t q = 0, kvd = 0, ffn = 0; /* the widest layer's (shapes may differ by layer) */
    for (int l = 0; l < c->n_layers; l++) {
        q = PT_MAX(q, (size_t)c->n_heads * m->plan[l].head_dim);
        kvd = PT_MAX(kvd, (size_t)m->plan[l].n_kv_heads * m->plan[l].head_dim);
        ffn = PT_MAX(ffn, (size_t)m->plan[l].ffn_dim);
    }
    struct {
        void **p;
        size_t n;
    } bufs[] = {
        {(void **)&ws->x, (size_t)cap * c->dim * 4},
        {(void **)&ws->h, (size_t)cap * c->dim * 4},
        {(void **)&ws->q, (size_t)cap * q * 4},
        {(void **)&ws->k, (size_t)cap * kvd * 4},
        {(void **)&ws->v, (size_t)cap * kvd * 4},
        {(void **)&ws->att, (size_t)cap * q * 4},
        {(void **)&ws->gate, (size_t)cap * ffn * 4},
        {(void **)&ws->up, (size_t)cap * ffn * 4},
        {(void **)&ws->out_h, (size_t)PT_OUT_ROWS * c->dim * 4},
        {(void **)&ws->logits, (size_t)PT_OUT_ROWS * c->vocab_size * 4},
        {(void **)&ws->tokens, (size_t)cap * 4},
        {(void **)&ws->pos, (size_t)cap * 4},
        {(void **)&ws->seq, (size_t)cap * 4},
        {(void **)&ws->out_idx, (size_t)cap * 4},
        {(void **)&ws->out_ids, (size_t)PT_OUT_ROWS * 4},
    };
    if (c->n_experts > 0) { /* gate and up hold every row's k experts */
        size_t ek = (size_t)cap * c->n_experts_used;
        bufs[6].n = bufs[7].n = PT_MAX(bufs[6].n, ek * c->expert_ffn_dim * 4);
    }
    for (size_t i = 0; i < PT_ARRAY_LEN(bufs); i++)
        if (!(*bufs[i].p = pt_model_alloc(m, bufs[i].n)))
            return pt_fail(err, "cannot allocate %.1f MiB of activations", bufs[i].n / 1048576.0);
    ws->h_out_idx = pt_xmalloc(sizeof(int32_t) * (size_t)cap);
    if (c->n_experts > 0 && moe_workspace(m, cap, err)) return -1;
    return m->family->workspace ? m->family->workspace(m, cap, err) : 0;
}

/* The router's and the experts' buffers (MoE models only). */
static int moe_workspace(pt_model *m, int cap, pt_err *err) {
    const pt_model_config *c = &m->cfg;
    pt_workspace *ws = m->ws;
    size_t ek = (size_t)cap * c->n_experts_used;
    struct {
        void **p;
        size_t n;
    } bufs[] = {
        {(void **)&ws->router, (size_t)cap * c->n_experts * 4},
        {(void **)&ws->moe_ids, ek * 4},
        {(void **)&ws->moe_w, ek * 4},
        {(void **)&ws->moe_out, ek * c->dim * 4},
    };
    for (size_t i = 0; i < PT_ARRAY_LEN(bufs); i++)
        if (!(*bufs[i].p = pt_model_alloc(m, bufs[i].n)))
            return pt_fail(err, "cannot allocate %.1f MiB for the experts' activations",
                           bufs[i].n / 1048576.0);
    return 0;
}

static void workspace_free(pt_model *m) {
    pt_workspace *ws = m->ws;
    if (!ws) return;
    if (ws->block_table) m->be->ops->free(m->be, ws->block_table, ws->bt_cap * 4);
    free(ws->h_block_table);
    free(ws->h_out_idx);
    if (ws->state_slot) m->be->ops->free(m->be, ws->state_slot, ws->ss_cap * 4);
    free(ws->h_state_slot);
    free(ws->h_state_next);
    free(ws);
    m->ws = NULL;
}

int32_t *pt_index_table(pt_model *m, const int32_t *host, int n) {
    int32_t *dev = pt_model_alloc(m, sizeof(int32_t) * (size_t)n);
    if (dev) m->be->ops->upload(m->be, dev, host, sizeof(int32_t) * (size_t)n);
    return dev;
}

/* The buffers of hybrid recurrent models (model_int.h: pt_workspace), and
 * the column tables that split gated attention's q projection: per head,
 * hd queries then hd gates. */
int pt_workspace_hybrid(pt_model *m, int cap, pt_err *err) {
    const pt_model_config *c = &m->cfg;
    pt_workspace *ws = m->ws;
    size_t q = (size_t)c->n_heads * c->head_dim, kd = (size_t)c->lin_k_heads * c->lin_k_dim;
    size_t vd = (size_t)c->lin_v_heads * c->lin_v_dim, conv = 2 * kd + vd, n = (size_t)cap;
    struct {
        float **p;
        size_t floats;
    } bufs[] = {
        {&ws->fused, n * PT_MAX(2 * q, 2 * kd + 2 * vd)},
        {&ws->mix, n * conv},
        {&ws->conv, n * conv},
        {&ws->z, n * vd},
        {&ws->ba, n * 2 * (size_t)c->lin_v_heads},
        {&ws->lin, n * vd},
        {&ws->agate, n * q},
        {&ws->shared, n * (size_t)c->dim},
        {&ws->shared_g, n},
        {&ws->sh_gate, n * (size_t)c->shared_ffn_dim},
        {&ws->sh_up, n * (size_t)c->shared_ffn_dim},
    };
    for (size_t i = 0; i < PT_ARRAY_LEN(bufs); i++)
        if (!(*bufs[i].p = pt_model_alloc(m, sizeof(float) * PT_MAX(bufs[i].floats, 1))))
            return pt_fail(err, "cannot allocate %.1f MiB of activations",
                           (double)bufs[i].floats * 4 / 1048576.0);
    int hd = c->head_dim, nh = c->n_heads;
    int32_t *a = pt_xmalloc(sizeof(int32_t) * q), *b = pt_xmalloc(sizeof(int32_t) * q);
    for (int h = 0; h < nh; h++)
        for (int i = 0; i < hd; i++)
            a[h * hd + i] = h * 2 * hd + i, b[h * hd + i] = h * 2 * hd + hd + i;
    ws->idx_q = pt_index_table(m, a, (int)q);
    ws->idx_gate = pt_index_table(m, b, (int)q);
    free(a), free(b);
    if (!ws->idx_q || !ws->idx_gate)
        return pt_fail(err, "out of backend memory for the split tables");
    return 0;
}

int pt_workspace_block_table(pt_model *m, size_t need, pt_err *err) {
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

/* ---- Loading ------------------------------------------------------------------ */

/* The family, the layer plan, and room for the family's per-layer weights. */
static int plan_layers(pt_model *m, pt_err *err) {
    m->family = pt_family_of(m->cfg.arch); /* the registry named it: never NULL */
    m->plan = pt_xcalloc((size_t)m->cfg.n_layers, sizeof *m->plan);
    m->layers = pt_xcalloc((size_t)m->cfg.n_layers, sizeof *m->layers);
    if (pt_model_plan(&m->cfg, m->plan, err)) return -1;
    return pt_model_check_ops(m, err);
}

/* Whether layers a and b rope alike (and can share a table). */
static bool same_rope(const pt_layer_plan *a, const pt_layer_plan *b) {
    return a->rope_theta == b->rope_theta && a->rope_scaled == b->rope_scaled &&
           a->rope.n_rot == b->rope.n_rot && a->rope_factors == b->rope_factors;
}

/* Layer p's inverse frequencies [n_rot / 2] into freq: the config's base
 * and scaling, or unscaled (Gemma 3's local layers), each divided by its
 * factor in rope_freqs where the plan says (Gemma 4's full layers; a
 * factor of 1e30 stops a pair rotating). */
static void layer_inv_freq(pt_model *m, const pt_layer_plan *p, float *freq) {
    pt_model_config lc = m->cfg;
    if (!p->rope_scaled) lc.rope_scaling = PT_ROPE_SCALING_NONE;
    lc.n_rot = p->rope.n_rot;
    pt_rope_inv_freq(&lc, p->rope_theta, freq);
    if (!p->rope_factors || !m->rope_freqs) return;
    float *f = pt_xmalloc(sizeof(float) * (size_t)(lc.n_rot / 2));
    m->be->ops->download(m->be, f, m->rope_freqs, sizeof(float) * (size_t)(lc.n_rot / 2));
    for (int i = 0; i < lc.n_rot / 2; i++) freq[i] /= f[i];
    free(f);
}

/* Each layer's rope frequencies in backend memory; layers that rope alike
 * share one table (every layer, for the Llama family; one local and one
 * global table for Gemma 3 and 4). */
static int rope_tables(pt_model *m, pt_err *err) {
    const pt_model_config *c = &m->cfg;
    for (int l = 0; l < c->n_layers; l++) {
        pt_layer_plan *p = &m->plan[l];
        const pt_layer_plan *same = NULL; /* an earlier layer with this table */
        for (int e = 0; e < l && !same; e++)
            if (same_rope(&m->plan[e], p)) same = &m->plan[e];
        if (same) {
            p->rope.inv_freq = same->rope.inv_freq;
            continue;
        }
        size_t bytes = sizeof(float) * (size_t)(p->rope.n_rot / 2);
        float *dev = pt_model_alloc(m, bytes), *freq = pt_xmalloc(bytes);
        if (!dev) {
            free(freq);
            return pt_fail(err, "out of backend memory");
        }
        layer_inv_freq(m, p, freq);
        m->be->ops->upload(m->be, dev, freq, bytes);
        free(freq);
        p->rope.inv_freq = dev;
    }
    return 0;
}

static int finish_load(pt_model *m, const pt_model_opts *o, pt_err *err) {
    if (m->family->finish && m->family->finish(m, err)) return -1;
    if (rope_tables(m, err)) return -1;
    m->max_batch = o->max_batch > 0 ? o->max_batch : 512;
    return pt_model_workspace_init(m, m->max_batch, err);
}

static int load_dummy(pt_model *m, const char *spec, const pt_model_opts *o, pt_err *err) {
    const char *json_text = pt_config_preset(spec);
    char *file_text = NULL;
    if (!json_text) {
        size_t len;
        if (pt_read_file(spec, 1 << 20, &file_text, &len, err)) {
            char names[256];
            pt_config_preset_names(names, sizeof names);
            return pt_failp(err, "dummy:%s is neither a preset (%s) nor a readable config.json",
                            spec, names);
        }
        json_text = file_text;
    }
    json_error_t jerr;
    json_t *j = json_loads(json_text, 0, &jerr);
    free(file_text);
    if (!j) return pt_fail(err, "dummy:%s: bad JSON at line %d: %s", spec, jerr.line, jerr.text);
    int rc = pt_config_from_json(j, &m->cfg, err);
    json_decref(j);
    if (rc || plan_layers(m, err)) return -1;
    const char *dt = o->dummy_dtype ? o->dummy_dtype : "bf16";
    /* Say what it needs before trying: the user sees a clear reason. */
    size_t need;
    if (pt_model_dummy_bytes(&m->cfg, dt, &need, err)) return -1;
    size_t avail = pt_mem_available();
    if (m->be->host_memory && avail && need > avail)
        return pt_fail(err, "dummy:%s in %s needs %.1f GiB of memory, %.1f GiB available", spec, dt,
                       need / 1073741824.0, avail / 1073741824.0);
    return pt_model_make_dummy_weights(m, dt, o->dummy_seed, err);
}

static int load_file(pt_model *m, const char *path, pt_err *err) {
    if (pt_model_file_open(&m->file, path, err)) return -1;
    if (pt_config_from_file(m->file, &m->cfg, err)) return -1;
    if (plan_layers(m, err)) return pt_failp(err, "%s", path);
    if (m->family->file_layout && m->family->file_layout(m, err)) return -1;
    size_t need = pt_model_file_bytes(m->file), avail = pt_mem_available();
    if (avail && need > avail + avail / 4)
        return pt_fail(err, "%s: weights need %.1f GiB of memory, %.1f GiB available", path,
                       need / 1073741824.0, avail / 1073741824.0);
    return pt_model_bind_file_weights(m, err);
}

int pt_model_load(pt_model **out, const char *path, const pt_model_opts *o, pt_err *err) {
    *out = NULL;
    if (!o || !o->backend) return pt_fail(err, "pt_model_load: no backend");
    pt_model *m = pt_xcalloc(1, sizeof *m);
    m->be = o->backend;
    m->keep_layout = o->tensor_parallel > 1; /* the ranks slice the file's layout */
    int rc =
        strncmp(path, "dummy:", 6) == 0 ? load_dummy(m, path + 6, o, err) : load_file(m, path, err);
    if (rc == 0) rc = finish_load(m, o, err);
    if (rc == 0 && o->tensor_parallel > 1)
        rc = pt_model_split(m, o->tensor_parallel, o->kernels, err);
    if (rc) {
        pt_model_free(m);
        return -1;
    }
    *out = m;
    return 0;
}

void pt_model_free(pt_model *m) {
    if (!m) return;
    pt_tp_free(m->tp);
    if (m->comm_owned) pt_comm_free(m->comm);
    workspace_free(m);
    pt_model_free_owned(m);
    free(m->layers);
    free(m->plan);
    if (m->file) pt_model_file_close(m->file);
    free(m);
}

int pt_model_kv_init(const pt_model *m, pt_kv_cache *kv, int n_positions, pt_dtype dtype,
                     const pt_kvq_spec *quant, pt_err *err) {
    return pt_model_kv_init_seqs(m, kv, n_positions, 0, 0, dtype, quant, err);
}

/* The window group (kvcache.h): the plan's sliding-window layers, when
 * some layers are not; its pool holds max_seqs sequences' windows and
 * slack positions each. */
static void kv_window_group(const pt_model *m, pt_kv_config *kc, int max_seqs, int slack) {
    const pt_model_config *c = &m->cfg;
    if (c->n_layers > 64 * (int)PT_ARRAY_LEN(kc->window_layers)) return;
    for (int l = 0; l < c->n_layers; l++) {
        if (m->plan[l].cache_group != 1) continue;
        kc->window = PT_MAX(kc->window, m->plan[l].window);
        kc->window_layers[l / 64] |= 1ull << (l % 64);
        kc->window_n_kv_heads = m->plan[l].n_kv_heads; /* one shape per kind (Gemma 4) */
        kc->window_head_dim = m->plan[l].head_dim;
    }
    kc->window_rows = m->max_batch;
    kc->window_slack = slack;
    if (max_seqs > 0 && kc->window > 0)
        kc->window_pages = (int)PT_MIN((int64_t)kc->n_pages,
                                       (int64_t)max_seqs * pt_kv_window_pages_per_seq(kc));
}

int pt_model_kv_init_seqs(const pt_model *m, pt_kv_cache *kv, int n_positions, int max_seqs,
                          int slack, pt_dtype dtype, const pt_kvq_spec *quant, pt_err *err) {
    const pt_model_config *c = &m->cfg;
    if (quant && quant->kind != PT_KVQ_NONE)
        for (int l = 0; l < c->n_layers; l++)
            if (m->plan[l].mixer == PT_MIX_ATTN_SWA || m->plan[l].attn_softcap > 0 ||
                m->plan[l].attn_sinks)
                return pt_fail(err, "a quantized KV cache with %s layers (layer %d) is not "
                                    "implemented yet; use a plain cache",
                               m->plan[l].mixer == PT_MIX_ATTN_SWA ? "sliding-window"
                               : m->plan[l].attn_sinks             ? "attention-sink"
                                                                   : "soft-capped attention",
                               l);
    pt_kv_config kc = {.n_layers = c->n_layers,
                       .n_kv_heads = c->n_kv_heads,
                       .head_dim = c->head_dim,
                       .page_size = PT_KV_PAGE_SIZE,
                       .dtype = dtype};
    if (c->kv_lora_rank > 0) { /* latent attention: one row, latent + rope key, is K and V */
        if (quant && quant->kind != PT_KVQ_NONE)
            return pt_fail(err, "a quantized KV cache with multi-head latent attention is not "
                                "implemented yet; use a plain cache");
        kc.n_kv_heads = 1;
        kc.head_dim = c->kv_lora_rank + c->n_rot;
        kc.v_is_k = true;
    }
    if (quant) kc.quant = *quant;
    kc.n_pages = (n_positions + kc.page_size - 1) / kc.page_size;
    kv_window_group(m, &kc, max_seqs, slack);
    for (int l = 0; l < c->n_layers && l < 64 * (int)PT_ARRAY_LEN(kc.no_kv); l++)
        if (m->plan[l].kv_layer != l) kc.no_kv[l / 64] |= 1ull << (l % 64);
    if (m->tp) pt_tp_kv_config(m, &kc); /* every rank's layers, of its KV heads */
    if (pt_model_recurrent(m)) { /* group 2: the recurrent state, per sequence */
        int64_t conv_dim = 2 * (int64_t)c->lin_k_heads * c->lin_k_dim +
                           (int64_t)c->lin_v_heads * c->lin_v_dim;
        kc.n_state_slots = PT_MIN(kc.n_pages, PT_MODEL_STATE_SLOTS);
        kc.conv_floats = conv_dim * (c->lin_conv_kernel - 1);
        kc.rec_floats = (int64_t)c->lin_v_heads * c->lin_k_dim * c->lin_v_dim;
        memcpy(kc.recurrent, c->recurrent_layers, sizeof kc.recurrent);
    }
    return pt_kv_cache_init(kv, m->be, &kc, err);
}

bool pt_model_recurrent(const pt_model *m) {
    for (int l = 0; l < m->cfg.n_layers; l++)
        if (m->plan[l].mixer == PT_MIX_RECURRENT) return true;
    return false;
}
