/*
 * kvcache.c - page pools and block tables, sized by the cache's format;
 * the window group's recycling (see kvcache.h, "Cache groups"); and the
 * recurrent-state slots of hybrid models (kvcache.h).
 */
#include "kv/kvcache.h"

#include <stdio.h>
#include <stdlib.h>

/* Bytes a quantized buffer may be read past its last row: the SIMD kernels
 * load whole words of packed codes (attn_kvq_avx2.c, unpack8). */
#define QUANT_PAD 64

static bool quantized(const pt_kv_config *c) {
    return c->quant.kind != PT_KVQ_NONE;
}

/* Bytes of one position's K and V rows over all kv heads of one layer. */
static int slot_bytes(const pt_kv_config *c, size_t *k, size_t *v, pt_err *err) {
    if (!quantized(c)) {
        *k = *v = (size_t)c->n_kv_heads * c->head_dim * pt_dtype_bytes(c->dtype, 1);
        if (c->v_is_k) *v = 0; /* the values are the keys' buffer */
        return 0;
    }
    if (c->v_is_k) return pt_fail(err, "KV cache: a quantized cache whose values are its keys "
                                       "(multi-head latent attention) is not implemented yet");
    pt_kv_codec codec;
    if (pt_kv_codec_init(&codec, &c->quant, c->head_dim, err)) return -1;
    *k = (size_t)c->n_kv_heads * codec.k_row;
    *v = (size_t)c->n_kv_heads * codec.v_row;
    return 0;
}

/* Whether layer l is one of the window layers (the group may not exist). */
static bool window_layer(const pt_kv_config *c, int l) {
    return c->window > 0 && (c->window_layers[l / 64] >> (l % 64) & 1);
}

/* The window group's slot bytes: its own geometry if it has one. */
static void window_slot_bytes(const pt_kv_config *c, size_t k, size_t v, size_t *wk, size_t *wv) {
    *wk = k, *wv = v;
    if (c->window_head_dim <= 0 && c->window_n_kv_heads <= 0) return;
    int heads = c->window_n_kv_heads > 0 ? c->window_n_kv_heads : c->n_kv_heads;
    int dim = c->window_head_dim > 0 ? c->window_head_dim : c->head_dim;
    *wk = *wv = (size_t)heads * dim * pt_dtype_bytes(c->dtype, 1);
}

size_t pt_kv_bytes_per_token(const pt_kv_config *c) {
    size_t k, v, wk, wv, n = 0;
    if (slot_bytes(c, &k, &v, NULL)) return 0;
    window_slot_bytes(c, k, v, &wk, &wv);
    for (int l = 0; l < c->n_layers; l++)
        if (pt_kv_layer_keeps(c, l)) n += window_layer(c, l) ? wk + wv : k + v;
    return n;
}

size_t pt_kv_state_bytes(const pt_kv_config *c) {
    if (c->n_state_slots <= 0) return 0;
    int n = 0;
    for (int l = 0; l < c->n_layers; l++) n += pt_kv_layer_recurrent(c, l);
    return (size_t)n * (size_t)(c->conv_floats + c->rec_floats) * sizeof(float);
}

const char *pt_kv_format_name(const pt_kv_config *c, char *buf, size_t cap) {
    if (quantized(c)) return pt_kvq_name(&c->quant, buf, cap);
    snprintf(buf, cap, "%s", pt_dtype_name(c->dtype));
    return buf;
}

/* The codec's constants in backend memory, for device kernels: TurboQuant's
 * sign vector, its value centroids, then the boundaries between them. */
static int upload_tables(pt_kv_cache *kv, pt_err *err) {
    const pt_kv_codec *c = &kv->codec;
    if (c->spec.kind != PT_KVQ_TURBO) return 0;
    size_t n_cent = (size_t)1 << c->spec.v_bits, n = (size_t)c->head_dim + 2 * n_cent - 1;
    float *host = pt_xmalloc(n * sizeof(float));
    memcpy(host, c->signs, sizeof(float) * (size_t)c->head_dim);
    memcpy(host + c->head_dim, c->centroids, sizeof(float) * n_cent);
    memcpy(host + c->head_dim + n_cent, pt_tq_boundaries(c->spec.v_bits), sizeof(float) * (n_cent - 1));
    kv->tables_bytes = n * sizeof(float);
    kv->tables = kv->be->ops->alloc(kv->be, kv->tables_bytes);
    if (kv->tables) kv->be->ops->upload(kv->be, kv->tables, host, kv->tables_bytes);
    free(host);
    return kv->tables ? 0 : pt_fail(err, "KV cache: cannot allocate the codec's tables");
}

/* Two groups when the window layers are some but not all of the layers;
 * the window pool defaults to group 0's size (as many pages as it can
 * ever need). */
static int plan_groups(pt_kv_cache *kv, pt_err *err) {
    pt_kv_config *cfg = &kv->cfg;
    int n_win = 0;
    if (cfg->window > 0) {
        if (cfg->n_layers > 64 * (int)PT_ARRAY_LEN(cfg->window_layers))
            return pt_fail(err, "KV cache: %d layers, a window group takes at most %d",
                           cfg->n_layers, 64 * (int)PT_ARRAY_LEN(cfg->window_layers));
        for (int l = 0; l < cfg->n_layers; l++) n_win += cfg->window_layers[l / 64] >> (l % 64) & 1;
    }
    kv->grouped = n_win > 0 && n_win < cfg->n_layers;
    if (!kv->grouped || cfg->window_pages <= 0 || cfg->window_pages > cfg->n_pages)
        cfg->window_pages = cfg->n_pages;
    if (cfg->window_slack < 0) cfg->window_slack = 0;
    if (cfg->window_rows <= 0) cfg->window_rows = 512;
    return 0;
}

static int buffer_bytes(const pt_kv_cache *kv, int n_pages, size_t k, size_t v, size_t pad,
                        size_t *kb, size_t *vb) {
    size_t slots = (size_t)kv->cfg.page_size * (size_t)n_pages;
    return !pt_mul_ok(slots, k, kb) || !pt_mul_ok(slots, v, vb) || !pt_add_ok(*kb, pad, kb) ||
           !pt_add_ok(*vb, pad, vb);
}

static size_t layer_k_bytes(const pt_kv_cache *kv, int l) {
    return pt_kv_layer_windowed(kv, l) ? kv->wk_bytes : kv->k_bytes;
}

static size_t layer_v_bytes(const pt_kv_cache *kv, int l) {
    return pt_kv_layer_windowed(kv, l) ? kv->wv_bytes : kv->v_bytes;
}

/* Checks the format and sets the codec and per-layer buffer sizes. */
static int plan(pt_kv_cache *kv, pt_err *err) {
    const pt_kv_config *cfg = &kv->cfg;
    if (cfg->dtype != PT_F32 && cfg->dtype != PT_F16 && cfg->dtype != PT_BF16)
        return pt_fail(err, "KV cache: unsupported element type %s", pt_dtype_name(cfg->dtype));
    if (cfg->page_size <= 0 || cfg->n_pages <= 0 || cfg->n_layers <= 0 || cfg->n_pages > 1 << 30)
        return pt_fail(err, "KV cache: bad geometry (%d pages of %d positions)", cfg->n_pages,
                       cfg->page_size);
    if (quantized(cfg)) {
        if (pt_kv_codec_init(&kv->codec, &cfg->quant, cfg->head_dim, err)) return -1;
        const pt_kv_codec *c = &kv->codec;
        pt_err why;
        char name[32];
        if (kv->be->ops->kv_quant_check &&
            kv->be->ops->kv_quant_check(kv->be, c->spec.kind, c->spec.k_bits, c->spec.v_bits,
                                        c->group, c->head_dim, &why))
            return pt_fail(err, "--kv-quant %s: %s", pt_kvq_name(&c->spec, name, sizeof name),
                           why.msg);
    }
    size_t k, v, wk, wv;
    if (slot_bytes(cfg, &k, &v, err)) return -1;
    if (plan_groups(kv, err)) return -1;
    window_slot_bytes(cfg, k, v, &wk, &wv);
    if ((wk != k || wv != v) && (quantized(cfg) || !kv->grouped))
        return pt_fail(err, "KV cache: window layers of another shape need a plain cache with "
                            "a window group");
    size_t pad = quantized(cfg) ? QUANT_PAD : 0;
    kv->k_page = (size_t)cfg->page_size * k;
    kv->v_page = (size_t)cfg->page_size * v;
    kv->wk_page = (size_t)cfg->page_size * wk;
    kv->wv_page = (size_t)cfg->page_size * wv;
    if (buffer_bytes(kv, cfg->n_pages, k, v, pad, &kv->k_bytes, &kv->v_bytes) ||
        buffer_bytes(kv, cfg->window_pages, wk, wv, pad, &kv->wk_bytes, &kv->wv_bytes))
        return pt_fail(err, "KV cache: size overflows");
    return 0;
}

/* The recurrent-state group: per recurrent layer one conv and one state
 * buffer of n_state_slots slots, and the free-slot stack. */
static int state_init(pt_kv_cache *kv, pt_err *err) {
    const pt_kv_config *c = &kv->cfg;
    if (c->n_state_slots <= 0) return 0;
    if (c->conv_floats < 0 || c->rec_floats <= 0 || c->n_state_slots > 1 << 20)
        return pt_fail(err, "KV cache: bad recurrent-state geometry");
    kv->conv = pt_xcalloc((size_t)c->n_layers, sizeof(float *));
    kv->rec = pt_xcalloc((size_t)c->n_layers, sizeof(float *));
    size_t slots = (size_t)c->n_state_slots;
    for (int l = 0; l < c->n_layers; l++) {
        if (!pt_kv_layer_recurrent(c, l)) continue;
        kv->conv[l] = kv->be->ops->alloc(kv->be, sizeof(float) * slots * (size_t)PT_MAX(c->conv_floats, 1));
        kv->rec[l] = kv->be->ops->alloc(kv->be, sizeof(float) * slots * (size_t)c->rec_floats);
        if (!kv->conv[l] || !kv->rec[l])
            return pt_fail(err, "KV cache: cannot allocate %.2f GiB of recurrent state for %d "
                                "sequences",
                           (double)pt_kv_state_bytes(c) * (double)slots / (1 << 30),
                           c->n_state_slots);
    }
    kv->free_slots = pt_xmalloc(sizeof(int32_t) * slots);
    for (int i = 0; i < c->n_state_slots; i++) kv->free_slots[i] = c->n_state_slots - 1 - i;
    kv->n_free_slots = c->n_state_slots;
    return 0;
}

static void snaps_free(pt_kv_cache *kv) {
    const pt_kv_config *c = &kv->cfg;
    size_t n = (size_t)kv->n_snaps;
    for (int l = 0; kv->sconv && l < c->n_layers; l++) {
        if (kv->sconv[l])
            kv->be->ops->free(kv->be, kv->sconv[l], sizeof(float) * n * (size_t)PT_MAX(c->conv_floats, 1));
        if (kv->srec[l]) kv->be->ops->free(kv->be, kv->srec[l], sizeof(float) * n * (size_t)c->rec_floats);
    }
    free(kv->sconv), free(kv->srec), free(kv->snap_key), free(kv->snap_used);
    kv->sconv = kv->srec = NULL;
    kv->snap_key = kv->snap_used = NULL;
    kv->n_snaps = 0;
}

int pt_kv_snaps_init(pt_kv_cache *kv, int n, pt_err *err) {
    const pt_kv_config *c = &kv->cfg;
    snaps_free(kv);
    if (c->n_state_slots <= 0 || n <= 0) return 0;
    kv->n_snaps = n;
    kv->sconv = pt_xcalloc((size_t)c->n_layers, sizeof(float *));
    kv->srec = pt_xcalloc((size_t)c->n_layers, sizeof(float *));
    kv->snap_key = pt_xcalloc((size_t)n, sizeof(uint64_t));
    kv->snap_used = pt_xcalloc((size_t)n, sizeof(uint64_t));
    for (int l = 0; l < c->n_layers; l++) {
        if (!pt_kv_layer_recurrent(c, l)) continue;
        kv->sconv[l] = kv->be->ops->alloc(kv->be, sizeof(float) * (size_t)n * (size_t)PT_MAX(c->conv_floats, 1));
        kv->srec[l] = kv->be->ops->alloc(kv->be, sizeof(float) * (size_t)n * (size_t)c->rec_floats);
        if (!kv->sconv[l] || !kv->srec[l]) {
            double gib = (double)pt_kv_state_bytes(c) * n / (1 << 30);
            snaps_free(kv);
            return pt_fail(err, "KV cache: cannot allocate %.2f GiB for %d recurrent-state "
                                "snapshots (the prefix cache of a hybrid model)", gib, n);
        }
    }
    return 0;
}

int pt_kv_cache_init(pt_kv_cache *kv, pt_backend *be, const pt_kv_config *cfg, pt_err *err) {
    memset(kv, 0, sizeof *kv);
    kv->be = be;
    kv->cfg = *cfg;
    if (plan(kv, err)) return -1;
    kv->k = pt_xcalloc((size_t)cfg->n_layers, sizeof(void *));
    kv->v = pt_xcalloc((size_t)cfg->n_layers, sizeof(void *));
    if (state_init(kv, err)) {
        pt_kv_cache_free(kv);
        return -1;
    }
    double total = 0;
    for (int l = 0; l < cfg->n_layers; l++)
        if (pt_kv_layer_keeps(cfg, l)) total += (double)(layer_k_bytes(kv, l) + layer_v_bytes(kv, l));
    for (int l = 0; l < cfg->n_layers; l++) {
        if (!pt_kv_layer_keeps(cfg, l)) continue; /* recurrent (state group) or shared */
        kv->k[l] = be->ops->alloc(be, layer_k_bytes(kv, l));
        kv->v[l] = cfg->v_is_k ? kv->k[l] : be->ops->alloc(be, layer_v_bytes(kv, l));
        if (!kv->k[l] || !kv->v[l]) {
            double gib = total / (1 << 30);
            pt_kv_cache_free(kv);
            return pt_fail(err, "KV cache: cannot allocate %.2f GiB for %d pages; lower --ctx",
                           gib, cfg->n_pages);
        }
    }
    if (upload_tables(kv, err)) {
        pt_kv_cache_free(kv);
        return -1;
    }
    if (pt_block_pool_init(&kv->pool, cfg->n_pages, err) ||
        (kv->grouped && pt_block_pool_init(&kv->wpool, kv->cfg.window_pages, err))) {
        pt_kv_cache_free(kv);
        return -1;
    }
    return 0;
}

void pt_kv_cache_free(pt_kv_cache *kv) {
    if (kv->k)
        for (int l = 0; l < kv->cfg.n_layers; l++) {
            if (kv->k[l]) kv->be->ops->free(kv->be, kv->k[l], layer_k_bytes(kv, l));
            if (kv->v[l] && !kv->cfg.v_is_k) kv->be->ops->free(kv->be, kv->v[l], layer_v_bytes(kv, l));
        }
    if (kv->tables) kv->be->ops->free(kv->be, kv->tables, kv->tables_bytes);
    size_t slots = (size_t)PT_MAX(kv->cfg.n_state_slots, 0);
    for (int l = 0; kv->conv && l < kv->cfg.n_layers; l++) {
        if (kv->conv[l])
            kv->be->ops->free(kv->be, kv->conv[l],
                              sizeof(float) * slots * (size_t)PT_MAX(kv->cfg.conv_floats, 1));
        if (kv->rec[l])
            kv->be->ops->free(kv->be, kv->rec[l], sizeof(float) * slots * (size_t)kv->cfg.rec_floats);
    }
    free(kv->conv);
    free(kv->rec);
    free(kv->free_slots);
    snaps_free(kv);
    free(kv->k);
    free(kv->v);
    pt_block_pool_free(&kv->pool);
    if (kv->grouped) pt_block_pool_free(&kv->wpool);
    free(kv->disk_buf);
    memset(kv, 0, sizeof *kv);
}

static int pages_for(const pt_kv_cache *kv, int n_positions) {
    return (n_positions + kv->cfg.page_size - 1) / kv->cfg.page_size;
}

/* A state slot for seq if the cache has the group and seq holds none. */
static int take_state(pt_kv_cache *kv, pt_kv_seq *seq, pt_err *err) {
    if (kv->cfg.n_state_slots <= 0 || seq->state) return 0;
    if (kv->n_free_slots == 0)
        return pt_fail(err, "KV cache full: all %d recurrent-state slots are held (one per "
                            "running sequence of a hybrid model)",
                       kv->cfg.n_state_slots);
    seq->state = kv->free_slots[--kv->n_free_slots] + 1;
    seq->state_pos = 0; /* its content is stale until a row at position 0 */
    return 0;
}

static void give_state(pt_kv_cache *kv, pt_kv_seq *seq) {
    if (seq->state) kv->free_slots[kv->n_free_slots++] = seq->state - 1;
    if (seq->ckpt) kv->free_slots[kv->n_free_slots++] = seq->ckpt - 1;
    seq->state = seq->ckpt = 0;
    seq->state_pos = seq->ckpt_pos = 0;
}

/* Copies one state to another, every recurrent layer: slot src of the
 * buffers sconv/srec (the slots', or the snapshots') to slot dst of
 * dconv/drec.  Slots count from 0 here. */
static void copy_slot(pt_kv_cache *kv, float **dconv, float **drec, int dst, float **sconv,
                      float **srec, int src) {
    const pt_kv_config *c = &kv->cfg;
    size_t cb = sizeof(float) * (size_t)c->conv_floats, rb = sizeof(float) * (size_t)c->rec_floats;
    for (int l = 0; l < c->n_layers; l++) {
        if (!pt_kv_layer_recurrent(c, l)) continue;
        kv->be->ops->copy(kv->be, (char *)dconv[l] + (size_t)dst * cb, (char *)sconv[l] + (size_t)src * cb, cb);
        kv->be->ops->copy(kv->be, (char *)drec[l] + (size_t)dst * rb, (char *)srec[l] + (size_t)src * rb, rb);
    }
}

/* Copies state slot src to slot dst (1-based, as seqs hold them). */
static void copy_state(pt_kv_cache *kv, int dst, int src) {
    copy_slot(kv, kv->conv, kv->rec, dst - 1, kv->conv, kv->rec, src - 1);
}

bool pt_kv_seq_ckpt_reserve(pt_kv_cache *kv, pt_kv_seq *seq) {
    if (!seq->state) return false;
    if (seq->ckpt) return true;
    if (kv->n_free_slots == 0) return false;
    seq->ckpt = kv->free_slots[--kv->n_free_slots] + 1;
    seq->ckpt_pos = -1; /* nothing in it yet */
    return true;
}

void pt_kv_seq_checkpoint(pt_kv_cache *kv, pt_kv_seq *seq) {
    if (!seq->state || !seq->ckpt) return;
    copy_state(kv, seq->ckpt, seq->state);
    seq->ckpt_pos = seq->state_pos;
}

/* Makes room for cap entries in both tables. */
static void table_grow(pt_kv_cache *kv, pt_kv_seq *seq, int need) {
    if (need <= seq->cap) return;
    seq->cap = PT_MAX(need, seq->cap * 2);
    seq->pages = pt_xrealloc(seq->pages, sizeof(int32_t) * (size_t)seq->cap);
    if (kv->grouped) seq->wpages = pt_xrealloc(seq->wpages, sizeof(int32_t) * (size_t)seq->cap);
}

int pt_kv_seq_reserve(pt_kv_cache *kv, pt_kv_seq *seq, int n_positions, pt_err *err) {
    if (n_positions > 0 && take_state(kv, seq, err)) return -1;
    int need = pages_for(kv, n_positions);
    if (need <= seq->n_pages) return 0;
    if (need - seq->n_pages > kv->pool.n_free)
        return pt_fail(err, "KV cache full: %d positions need %d more pages, %d free", n_positions,
                       need - seq->n_pages, kv->pool.n_free);
    if (kv->grouped && need - seq->n_pages > kv->wpool.n_free)
        return pt_fail(err, "KV cache window group full: %d positions need %d more pages, %d "
                            "free (more sequences at once than it was sized for)",
                       n_positions, need - seq->n_pages, kv->wpool.n_free);
    table_grow(kv, seq, need);
    for (; seq->n_pages < need; seq->n_pages++) {
        seq->pages[seq->n_pages] = pt_block_alloc(&kv->pool);
        if (kv->grouped) seq->wpages[seq->n_pages] = pt_block_alloc(&kv->wpool);
    }
    return 0;
}

int pt_kv_seq_pages_needed(const pt_kv_cache *kv, const pt_kv_seq *seq, int from, int to) {
    if (to <= from) return 0;
    int first = from / kv->cfg.page_size, end = pages_for(kv, to), n = 0;
    for (int i = first; i < PT_MIN(end, seq->n_pages); i++)
        n += pt_block_refs(&kv->pool, seq->pages[i]) > 1;
    return n + PT_MAX(0, end - seq->n_pages);
}

/* Copies page src of group g (its layers only, K and V) to page dst. */
static void copy_group_page(pt_kv_cache *kv, int g, int32_t dst, int32_t src) {
    pt_backend *be = kv->be;
    for (int l = 0; l < kv->cfg.n_layers; l++) {
        if (!kv->k[l] || pt_kv_layer_windowed(kv, l) != (g == 1)) continue; /* NULL: none */
        char *k = kv->k[l], *v = kv->v[l];
        size_t kp = g ? kv->wk_page : kv->k_page, vp = g ? kv->wv_page : kv->v_page;
        be->ops->copy(be, k + (size_t)dst * kp, k + (size_t)src * kp, kp);
        be->ops->copy(be, v + (size_t)dst * vp, v + (size_t)src * vp, vp);
    }
}

/* Entry *slot of group g's pool becomes a page of the sequence's own:
 * a fresh one where it was recycled, a copy where it is shared. */
static int own_page(pt_kv_cache *kv, int g, int32_t *slot) {
    pt_block_pool *pool = g ? &kv->wpool : &kv->pool;
    int32_t old = *slot;
    if (old >= 0 && pt_block_refs(pool, old) == 1) return 0;
    int32_t fresh = pt_block_alloc(pool);
    if (fresh < 0) return -1;
    if (old >= 0) {
        copy_group_page(kv, g, fresh, old);
        pt_block_unref(pool, old);
    }
    *slot = fresh;
    return 0;
}

/* Gives back the window pages no write from `from` on can need, nor a
 * rollback to from - window_slack. */
static void recycle(pt_kv_cache *kv, pt_kv_seq *seq, int from) {
    int keep = from - (kv->cfg.window - 1) - kv->cfg.window_slack; /* first position kept */
    int end = PT_MIN(seq->n_pages, keep / kv->cfg.page_size); /* pages wholly below it */
    for (; seq->wlo < end; seq->wlo++) {
        int32_t *w = &seq->wpages[seq->wlo];
        if (*w >= 0) pt_block_unref(&kv->wpool, *w);
        *w = -1;
    }
}

/* Whether a write at position n finds the window pages of [n - window + 1, n). */
static bool window_whole(const pt_kv_cache *kv, const pt_kv_seq *seq, int n) {
    if (!kv->grouped || n == 0) return true;
    int lo = PT_MAX(0, n - kv->cfg.window + 1) / kv->cfg.page_size;
    return lo >= seq->wlo;
}

int pt_kv_seq_own(pt_kv_cache *kv, pt_kv_seq *seq, int from, int to, pt_err *err) {
    if (to <= from) return 0;
    int n_old = seq->n_pages;
    if (pt_kv_seq_pages_needed(kv, seq, from, to) > kv->pool.n_free)
        return pt_fail(err, "KV cache full: writing positions %d..%d needs %d pages, %d free",
                       from, to - 1, pt_kv_seq_pages_needed(kv, seq, from, to), kv->pool.n_free);
    if (!window_whole(kv, seq, from))
        return pt_fail(err, "KV cache: writing position %d needs window positions already "
                            "given back (roll back to 0 and recompute)", from);
    /* recycling first lets its pages serve this write; again after the
     * reserve for pages a write far ahead left below its window */
    if (kv->grouped) recycle(kv, seq, from);
    if (pt_kv_seq_reserve(kv, seq, to, err)) return -1;
    if (kv->grouped) recycle(kv, seq, from);
    int first = from / kv->cfg.page_size, end = pages_for(kv, to);
    for (int i = first; i < PT_MIN(end, n_old); i++) own_page(kv, 0, &seq->pages[i]);
    for (int i = first; kv->grouped && i < end; i++)
        if (own_page(kv, 1, &seq->wpages[i]))
            return pt_fail(err, "KV cache window group full writing positions %d..%d", from, to - 1);
    return 0;
}

void pt_kv_seq_fork(pt_kv_cache *kv, pt_kv_seq *dst, const pt_kv_seq *src) {
    memset(dst, 0, sizeof *dst);
    table_grow(kv, dst, PT_MAX(src->n_pages, 1));
    for (int i = 0; i < src->n_pages; i++) {
        pt_block_ref(&kv->pool, src->pages[i]);
        dst->pages[i] = src->pages[i];
        if (!kv->grouped) continue;
        if (src->wpages[i] >= 0) pt_block_ref(&kv->wpool, src->wpages[i]);
        dst->wpages[i] = src->wpages[i];
    }
    dst->n_pages = src->n_pages;
    dst->n_tokens = src->n_tokens;
    dst->wlo = src->wlo;
    if (!src->state) return;
    if (take_state(kv, dst, NULL)) {
        dst->state_pos = -1; /* no slot: it restarts at position 0 */
        return;
    }
    copy_state(kv, dst->state, src->state);
    dst->state_pos = src->state_pos;
}

void pt_kv_copy_page(pt_kv_cache *kv, int32_t dst, int32_t src) {
    copy_group_page(kv, 0, dst, src);
}

size_t pt_kv_page_bytes(const pt_kv_cache *kv) {
    size_t n = 0;
    for (int l = 0; l < kv->cfg.n_layers; l++)
        if (kv->k[l] && !pt_kv_layer_windowed(kv, l)) n += kv->k_page + kv->v_page;
    return n;
}

void pt_kv_page_save(pt_kv_cache *kv, int32_t page, void *host) {
    pt_backend *be = kv->be;
    char *h = host;
    for (int l = 0; l < kv->cfg.n_layers; l++) {
        if (!kv->k[l] || pt_kv_layer_windowed(kv, l)) continue;
        be->ops->download(be, h, (char *)kv->k[l] + (size_t)page * kv->k_page, kv->k_page);
        h += kv->k_page;
        be->ops->download(be, h, (char *)kv->v[l] + (size_t)page * kv->v_page, kv->v_page);
        h += kv->v_page;
    }
}

void pt_kv_page_load(pt_kv_cache *kv, int32_t page, const void *host) {
    pt_backend *be = kv->be;
    const char *h = host;
    for (int l = 0; l < kv->cfg.n_layers; l++) {
        if (!kv->k[l] || pt_kv_layer_windowed(kv, l)) continue;
        be->ops->upload(be, (char *)kv->k[l] + (size_t)page * kv->k_page, h, kv->k_page);
        h += kv->k_page;
        be->ops->upload(be, (char *)kv->v[l] + (size_t)page * kv->v_page, h, kv->v_page);
        h += kv->v_page;
    }
}

static void drop_pages(pt_kv_cache *kv, pt_kv_seq *seq, int keep) {
    while (seq->n_pages > keep) {
        int i = --seq->n_pages;
        pt_block_unref(&kv->pool, seq->pages[i]);
        if (kv->grouped && seq->wpages[i] >= 0) pt_block_unref(&kv->wpool, seq->wpages[i]);
    }
    if (seq->wlo > seq->n_pages) seq->wlo = seq->n_pages;
}

void pt_kv_seq_truncate(pt_kv_cache *kv, pt_kv_seq *seq, int n) {
    /* a rollback below the window pages kept: nothing short of recomputing
     * from the start restores them (kvcache.h) */
    if (n > 0 && !window_whole(kv, seq, n)) n = 0;
    drop_pages(kv, seq, pages_for(kv, n));
    if (n == 0) seq->wlo = 0;
    if (seq->n_tokens > n) seq->n_tokens = n;
    if (n == 0) {
        give_state(kv, seq);
    } else if (seq->state && n < seq->state_pos) {
        if (seq->ckpt && seq->ckpt_pos >= 0 && seq->ckpt_pos <= n) {
            copy_state(kv, seq->state, seq->ckpt);
            seq->state_pos = seq->ckpt_pos;
            if (seq->n_tokens > seq->ckpt_pos) seq->n_tokens = seq->ckpt_pos;
        } else {
            seq->state_pos = -1;
        }
    }
}

void pt_kv_seq_release(pt_kv_cache *kv, pt_kv_seq *seq) {
    pt_kv_seq_truncate(kv, seq, 0);
    free(seq->pages);
    free(seq->wpages);
    memset(seq, 0, sizeof *seq);
}

int pt_kv_free_pages(const pt_kv_cache *kv) {
    return kv->pool.n_free;
}

int pt_kv_seq_group_pages(const pt_kv_cache *kv, const pt_kv_seq *seq, int g) {
    if (g == 0) return seq->n_pages;
    int n = 0;
    for (int i = seq->wlo; kv->grouped && i < seq->n_pages; i++) n += seq->wpages[i] >= 0;
    return n;
}

/* Window pages one sequence holds at most: those of window - 1 + slack
 * positions below a write of window_rows rows, plus one for alignment. */
int pt_kv_window_pages_per_seq(const pt_kv_config *c) {
    int rows = c->window_rows > 0 ? c->window_rows : 512;
    return (c->window - 1 + c->window_slack + rows + c->page_size - 1) / c->page_size + 1;
}

size_t pt_kv_window_bytes_per_token(const pt_kv_cache *kv) {
    if (!kv->grouped) return 0;
    size_t n = 0;
    for (int l = 0; l < kv->cfg.n_layers; l++)
        if (kv->k[l] && pt_kv_layer_windowed(kv, l))
            n += (kv->wk_page + kv->wv_page) / (size_t)kv->cfg.page_size;
    return n;
}

int pt_kv_max_seqs(const pt_kv_cache *kv) {
    if (!kv->grouped || kv->cfg.window_pages >= kv->cfg.n_pages) return INT32_MAX;
    return kv->cfg.window_pages / pt_kv_window_pages_per_seq(&kv->cfg);
}

/* ---- the prefix cache ---------------------------------------------------------- */

void pt_kv_seq_set_key(pt_kv_cache *kv, pt_kv_seq *seq, int i, uint64_t key) {
    pt_block_set_hash(&kv->pool, seq->pages[i], key);
    if (kv->grouped && seq->wpages[i] >= 0) pt_block_set_hash(&kv->wpool, seq->wpages[i], key);
}

/* First window page a sequence of n pages needs to go on from there. */
static int window_lo(const pt_kv_cache *kv, int n) {
    return PT_MAX(0, n * kv->cfg.page_size - kv->cfg.window + 1) / kv->cfg.page_size;
}

int pt_kv_prefix_window(const pt_kv_cache *kv, const uint64_t *keys, int n) {
    if (!kv->grouped) return n;
    for (;; n--) {
        int i = window_lo(kv, n);
        while (i < n && pt_block_lookup(&kv->wpool, keys[i]) >= 0) i++;
        if (i == n) return n;
    }
}

/* The snapshot of the state at the end of the page keyed key, or -1. */
static int find_snap(const pt_kv_cache *kv, uint64_t key) {
    for (int i = 0; i < kv->n_snaps; i++)
        if (kv->snap_used[i] && kv->snap_key[i] == key) return i;
    return -1;
}

void pt_kv_seq_snapshot(pt_kv_cache *kv, const pt_kv_seq *seq, uint64_t key) {
    if (!kv->n_snaps || !seq->state || seq->state_pos <= 0 || seq->state_pos % kv->cfg.page_size)
        return;
    int i = find_snap(kv, key);
    if (i < 0) { /* the least recently used, or an empty one */
        i = 0;
        for (int j = 1; j < kv->n_snaps; j++)
            if (kv->snap_used[j] < kv->snap_used[i]) i = j;
        copy_slot(kv, kv->sconv, kv->srec, i, kv->conv, kv->rec, seq->state - 1);
        kv->snap_key[i] = key;
    }
    kv->snap_used[i] = ++kv->snap_tick;
}

int pt_kv_prefix_state(const pt_kv_cache *kv, const uint64_t *keys, int n) {
    if (kv->cfg.n_state_slots <= 0) return n;
    while (n > 0 && find_snap(kv, keys[n - 1]) < 0) n--;
    return n;
}

int pt_kv_seq_adopt(pt_kv_cache *kv, pt_kv_seq *seq, const uint64_t *keys, int n) {
    /* a hybrid model's pages are only worth their state: none past the
     * last snapshot, and none at all if no state slot is free for it */
    if (kv->cfg.n_state_slots > 0) {
        n = pt_kv_prefix_state(kv, keys, n);
        if (n > 0 && take_state(kv, seq, NULL)) n = 0;
    }
    table_grow(kv, seq, n);
    int b = 0;
    for (; b < n; b++) {
        int32_t id = pt_block_lookup(&kv->pool, keys[b]);
        if (id >= 0)
            pt_block_ref(&kv->pool, id);
        else if ((id = pt_kv_restore_page(kv, keys[b])) < 0)
            break;
        seq->pages[b] = id;
        if (kv->grouped) seq->wpages[b] = -1;
        seq->n_pages = b + 1;
    }
    if (kv->grouped) { /* the window pages the last ones need */
        b = pt_kv_prefix_window(kv, keys, b);
        drop_pages(kv, seq, b);
        seq->wlo = window_lo(kv, b);
        for (int i = seq->wlo; i < b; i++) {
            seq->wpages[i] = pt_block_lookup(&kv->wpool, keys[i]);
            pt_block_ref(&kv->wpool, seq->wpages[i]);
        }
    }
    if (kv->cfg.n_state_slots > 0) { /* pages may have run short: back to a snapshot */
        int keep = pt_kv_prefix_state(kv, keys, b);
        drop_pages(kv, seq, keep);
        b = keep;
        if (b > 0) {
            int i = find_snap(kv, keys[b - 1]);
            copy_slot(kv, kv->conv, kv->rec, seq->state - 1, kv->sconv, kv->srec, i);
            kv->snap_used[i] = ++kv->snap_tick;
            seq->state_pos = b * kv->cfg.page_size;
        }
    }
    seq->n_tokens = b * kv->cfg.page_size;
    return b;
}

/* The pool is about to reuse cached page id: save it if the disk lacks it.
 * The copy is what goes to the writer thread; the page is free at once. */
static void evict_to_disk(void *ctx, int32_t id, uint64_t key) {
    pt_kv_cache *kv = ctx;
    if (!pt_disk_wants(kv->disk, key)) return;
    void *buf = pt_xmalloc(pt_kv_page_bytes(kv));
    pt_kv_page_save(kv, id, buf);
    pt_disk_write(kv->disk, key, buf);
}

void pt_kv_attach_disk(pt_kv_cache *kv, pt_disk *disk) {
    kv->disk = disk;
    kv->pool.on_evict = disk ? evict_to_disk : NULL;
    kv->pool.evict_ctx = kv;
    if (disk && !kv->disk_buf) kv->disk_buf = pt_xmalloc(pt_kv_page_bytes(kv));
}

int32_t pt_kv_restore_page(pt_kv_cache *kv, uint64_t key) {
    if (!kv->disk || !pt_disk_has(kv->disk, key) || kv->pool.n_free == 0) return -1;
    if (pt_disk_read(kv->disk, key, kv->disk_buf)) return -1;
    int32_t id = pt_block_alloc(&kv->pool);
    pt_kv_page_load(kv, id, kv->disk_buf);
    pt_block_set_hash(&kv->pool, id, key);
    return id;
}

void pt_kv_flush_to_disk(pt_kv_cache *kv) {
    if (!kv->disk) return;
    for (int32_t id = 0; id < kv->pool.n_blocks; id++) {
        uint64_t key = kv->pool.hash[id];
        if (key && pt_disk_wants(kv->disk, key)) {
            void *buf = pt_xmalloc(pt_kv_page_bytes(kv));
            pt_kv_page_save(kv, id, buf);
            pt_disk_write(kv->disk, key, buf);
        }
    }
    pt_disk_sync(kv->disk);
}

pt_kv_view pt_kv_layer(const pt_kv_cache *kv, int layer) {
    const pt_kv_config *c = &kv->cfg;
    bool win = pt_kv_layer_windowed(kv, layer);
    pt_kv_view v = {.k = kv->k[layer],
                    .v = kv->v[layer],
                    .dtype = c->dtype,
                    .page_size = c->page_size,
                    .n_kv_heads = win && c->window_n_kv_heads > 0 ? c->window_n_kv_heads
                                                                  : c->n_kv_heads,
                    .head_dim = win && c->window_head_dim > 0 ? c->window_head_dim : c->head_dim};
    if (quantized(&kv->cfg)) {
        const pt_kv_codec *c = &kv->codec;
        v.codec = c;
        v.kvq = c->spec.kind, v.k_bits = c->spec.k_bits, v.v_bits = c->spec.v_bits;
        v.group = c->group, v.k_row = c->k_row, v.v_row = c->v_row;
        v.tables = kv->tables;
    }
    return v;
}
