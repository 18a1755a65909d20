/*
 * kvcache.c - page pool and block tables.
 */
#include "kv/kvcache.h"

#include <stdlib.h>

size_t pt_kv_bytes_per_token(const pt_kv_config *c) {
    return 2 * (size_t)c->n_layers * (size_t)c->n_kv_heads * (size_t)c->head_dim *
           pt_dtype_bytes(c->dtype, 1);
}

int pt_kv_cache_init(pt_kv_cache *kv, pt_backend *be, const pt_kv_config *cfg, pt_err *err) {
    memset(kv, 0, sizeof *kv);
    kv->be = be;
    kv->cfg = *cfg;
    if (cfg->dtype != PT_F32 && cfg->dtype != PT_F16 && cfg->dtype != PT_BF16)
        return pt_fail(err, "KV cache: unsupported element type %s", pt_dtype_name(cfg->dtype));
    if (cfg->page_size <= 0 || cfg->n_pages <= 0 || cfg->n_layers <= 0 || cfg->n_pages > 1 << 30)
        return pt_fail(err, "KV cache: bad geometry (%d pages of %d positions)", cfg->n_pages,
                       cfg->page_size);
    size_t per_page = (size_t)cfg->page_size * cfg->n_kv_heads * cfg->head_dim *
                      pt_dtype_bytes(cfg->dtype, 1);
    if (!pt_mul_ok(per_page, (size_t)cfg->n_pages, &kv->layer_bytes))
        return pt_fail(err, "KV cache: size overflows");
    kv->k = pt_xcalloc((size_t)cfg->n_layers, sizeof(void *));
    kv->v = pt_xcalloc((size_t)cfg->n_layers, sizeof(void *));
    for (int l = 0; l < cfg->n_layers; l++) {
        kv->k[l] = be->ops->alloc(be, kv->layer_bytes);
        kv->v[l] = be->ops->alloc(be, kv->layer_bytes);
        if (!kv->k[l] || !kv->v[l]) {
            double gib = (double)kv->layer_bytes * 2 * cfg->n_layers / (1 << 30);
            pt_kv_cache_free(kv);
            return pt_fail(err, "KV cache: cannot allocate %.2f GiB for %d pages; lower --ctx",
                           gib, cfg->n_pages);
        }
    }
    kv->free_pages = pt_xmalloc(sizeof(int32_t) * (size_t)cfg->n_pages);
    kv->refs = pt_xcalloc((size_t)cfg->n_pages, sizeof(uint16_t));
    /* Pop order 0, 1, 2...: the stack holds ids in reverse. */
    for (int i = 0; i < cfg->n_pages; i++) kv->free_pages[i] = cfg->n_pages - 1 - i;
    kv->n_free = cfg->n_pages;
    return 0;
}

void pt_kv_cache_free(pt_kv_cache *kv) {
    if (kv->k)
        for (int l = 0; l < kv->cfg.n_layers; l++) {
            if (kv->k[l]) kv->be->ops->free(kv->be, kv->k[l], kv->layer_bytes);
            if (kv->v[l]) kv->be->ops->free(kv->be, kv->v[l], kv->layer_bytes);
        }
    free(kv->k);
    free(kv->v);
    free(kv->free_pages);
    free(kv->refs);
    memset(kv, 0, sizeof *kv);
}

int pt_kv_seq_reserve(pt_kv_cache *kv, pt_kv_seq *seq, int n_positions, pt_err *err) {
    int need = (n_positions + kv->cfg.page_size - 1) / kv->cfg.page_size;
    if (need <= seq->n_pages) return 0;
    if (need - seq->n_pages > kv->n_free)
        return pt_fail(err, "KV cache full: %d positions need %d more pages, %d free", n_positions,
                       need - seq->n_pages, kv->n_free);
    if (need > seq->cap) {
        seq->cap = PT_MAX(need, seq->cap * 2);
        seq->pages = pt_xrealloc(seq->pages, sizeof(int32_t) * (size_t)seq->cap);
    }
    while (seq->n_pages < need) {
        int32_t id = kv->free_pages[--kv->n_free];
        kv->refs[id] = 1;
        seq->pages[seq->n_pages++] = id;
    }
    return 0;
}

static void unref_page(pt_kv_cache *kv, int32_t id) {
    if (--kv->refs[id] == 0) kv->free_pages[kv->n_free++] = id;
}

void pt_kv_seq_truncate(pt_kv_cache *kv, pt_kv_seq *seq, int n) {
    int keep = (n + kv->cfg.page_size - 1) / kv->cfg.page_size;
    while (seq->n_pages > keep) unref_page(kv, seq->pages[--seq->n_pages]);
    if (seq->n_tokens > n) seq->n_tokens = n;
}

void pt_kv_seq_release(pt_kv_cache *kv, pt_kv_seq *seq) {
    pt_kv_seq_truncate(kv, seq, 0);
    free(seq->pages);
    memset(seq, 0, sizeof *seq);
}

int pt_kv_free_pages(const pt_kv_cache *kv) {
    return kv->n_free;
}

pt_kv_view pt_kv_layer(const pt_kv_cache *kv, int layer) {
    pt_kv_view v = {kv->k[layer], kv->v[layer], kv->cfg.dtype, kv->cfg.page_size,
                    kv->cfg.n_kv_heads, kv->cfg.head_dim};
    return v;
}
