/*
 * kvcache.h - the paged KV cache: a pool of fixed-size pages in backend
 * memory and, per sequence, a block table of the pages it owns.
 *
 * A page holds page_size consecutive positions of one sequence, for every
 * layer (one buffer per layer and per K/V, indexed by page id).  The ids are
 * managed by a block pool (block_pool.h): reference counts, a free queue in
 * eviction order that keeps freed pages' content hashes, a hash -> page map.
 * Sequences grow a page at a time; a fork shares every page of its parent
 * and copies a shared page only when it writes into it (pt_kv_seq_own);
 * truncation (rollback) and release give pages back.
 *
 * A cache has one codec (cfg.quant, --kv-quant): plain elements of cfg.dtype,
 * or rows of a KV codec (kv_codec.h) whose byte sizes set the page size.
 * The codec is part of the cache's geometry: every page of a cache holds
 * the same format, and pt_kv_format_name() names it for anything that keys
 * pages across caches (prefix and disk caches).
 *
 * Cache groups.  A model whose layers mix sliding-window and full attention
 * (Gemma 2/3, gpt-oss) gets two groups: group 0, the full-attention layers,
 * and the window group, the layers that see only the last `window`
 * positions.  Each group has its own pool of page ids and its own buffer
 * size (a window layer's buffer holds window_pages pages, a full layer's
 * n_pages), and a sequence has one block table per group, indexed alike
 * (page i holds positions [i*page_size, (i+1)*page_size) in both).  As a
 * sequence's writes move on, window-group pages wholly below every window
 * it can still need go back to their pool and their table entry becomes -1
 * (recycling, in pt_kv_seq_own), so a long context costs what its full
 * layers need plus about one window per sequence.  Everything that counts
 * pages for admission (pt_kv_seq_pages_needed, pt_kv_free_pages, the
 * prefix cache's pool) is group 0's: the window pool is sized for
 * pt_kv_max_seqs sequences and cannot run out while no more run at once.
 * The window group may have its own geometry (KV heads, head dim: Gemma
 * 4's sliding layers differ from its full ones) with plain elements; its
 * page sizes are then wk_page / wv_page.  Layers marked in cfg.no_kv keep
 * no buffers at all: the model points them at an earlier layer's.
 *
 * Rollback (pt_kv_seq_truncate) across the window: writing position n
 * needs the window pages of [n - window + 1, n).  Recycling before a write
 * at `from` keeps positions >= from - window + 1 - window_slack, so a
 * rollback to n >= from - window_slack always finds its window; the
 * engine's verify step only rolls back positions written in that same
 * step (n > from), so its slack is 0, and a draft model's cache, which
 * rolls back up to k drafted steps, keeps k positions of slack.  A deeper
 * rollback drops the whole sequence (n_tokens 0): the caller recomputes,
 * which is always correct.
 *
 * Hybrid recurrent models (Gated DeltaNet) add another cache group (plan group 2), the
 * recurrent state: layers marked in cfg.recurrent keep no K/V pages but,
 * per sequence, a fixed-size f32 state (the conv tail and the delta rule's
 * matrices), never paged.  A sequence takes one of cfg.n_state_slots slots
 * when it first reserves, and gives it back when truncated to 0 or
 * released.  The state covers positions [0, state_pos) and only moves
 * forward.  Rollback (speculative decoding) goes through a checkpoint: a
 * second slot, reserved once and held until release, into which the
 * state is copied before a verify step; truncating below state_pos then
 * restores the checkpoint and drops the positions after it (n_tokens
 * falls back to ckpt_pos: they are recomputed, K/V and state together).
 * Without a usable checkpoint truncating below state_pos marks the state
 * invalid (-1), and the forward refuses to continue such a sequence
 * anywhere but at position 0.
 *
 * The prefix cache of a hybrid model needs the recurrent state at the end
 * of the pages it reuses: K/V pages alone would leave the recurrent layers
 * without the positions before them.  States are big (a whole sequence's
 * worth per layer), so they are not kept per page: a small store of
 * snapshots (pt_kv_snaps_init), each the state at the end of one page,
 * keyed by that page's content key and evicted least recently used.  The
 * engine takes a snapshot where a prompt's computation pauses at a page
 * boundary (core.c says where); pt_kv_prefix_state shortens a run of page
 * hits to the longest that ends in a snapshot, and pt_kv_seq_adopt
 * restores it, so a reused prefix always comes with its state.
 *
 * Invariants: a page id is either on the free list (refcount 0) or owned by
 * at least one sequence; a sequence with n_tokens positions stored owns
 * ceil(n_tokens / page_size) group-0 pages or more (reserve may run ahead),
 * and window-group pages for every index from the first one a write at
 * n_tokens - window_slack can need up to its group-0 table's end; a state
 * slot is either free or held by exactly one sequence.
 */
#ifndef PETREL_KVCACHE_H
#define PETREL_KVCACHE_H

#include "backend/backend.h"
#include "kv/block_pool.h"
#include "kv/disk_tier.h"
#include "kv/kv_codec.h"

#define PT_KV_PAGE_SIZE 16 /* positions per page unless a caller asks otherwise */

typedef struct pt_kv_config {
    int n_layers, n_kv_heads, head_dim;
    int page_size; /* positions per page, default 16 */
    int n_pages;   /* pool size */
    pt_dtype dtype; /* PT_F32, PT_F16 or PT_BF16: the elements when not quantized */
    pt_kvq_spec quant; /* kind PT_KVQ_NONE (zero) for plain elements */
    /* Multi-head latent attention: each slot's one row (the compressed
     * latent and the rope key) is both key and value, so V is a view of
     * the K buffer (no V bytes: pages copy, save and count K only).  Plain
     * elements only. */
    bool v_is_k;
    /* The recurrent-state group; all zero for models without one.  A layer
     * whose bit is set in recurrent (bit l % 64 of word l / 64) has no K/V
     * and, per slot, conv_floats of conv tail and rec_floats of state. */
    int n_state_slots;
    int64_t conv_floats, rec_floats;
    uint64_t recurrent[16];
    /* The window group: layers whose bit is set in window_layers see only
     * the last `window` positions.  window 0, or no layer set, or every
     * layer set: one group, every page kept. */
    int window;
    int window_pages; /* pool of the window group; 0: n_pages */
    int window_slack; /* positions kept below the window for deeper rollbacks */
    int window_rows;  /* rows a sequence writes in one call at most (pt_kv_max_seqs) */
    uint64_t window_layers[16]; /* bit l % 64 of word l / 64: layer l is in it */
    /* The window group's own geometry (Gemma 4's sliding layers have other
     * head dims and KV heads than its full ones); 0: n_kv_heads, head_dim.
     * Plain elements only (a codec has one geometry). */
    int window_n_kv_heads, window_head_dim;
    /* Layers that keep no K/V: they read an earlier layer's (the model
     * says which; Gemma 4's shared KV layers).  Bit l % 64 of word l / 64. */
    uint64_t no_kv[16];
} pt_kv_config;

static inline bool pt_kv_layer_recurrent(const pt_kv_config *c, int l) {
    return c->n_state_slots > 0 && (c->recurrent[l / 64] >> (l % 64) & 1);
}

/* Whether layer l has K/V buffers of its own. */
static inline bool pt_kv_layer_keeps(const pt_kv_config *c, int l) {
    return !pt_kv_layer_recurrent(c, l) && !(c->no_kv[l / 64] >> (l % 64) & 1);
}

typedef struct pt_kv_cache {
    pt_backend *be;
    pt_kv_config cfg;
    pt_kv_codec codec;       /* valid when cfg.quant.kind != PT_KVQ_NONE */
    size_t k_bytes, v_bytes; /* bytes of one layer's K / V buffer (group 0) */
    size_t wk_bytes, wv_bytes; /* the same for a window-group layer */
    bool grouped;            /* the window group exists */
    void **k, **v;           /* [n_layers] backend buffers; NULL for recurrent layers
                              * and those that keep none (cfg.no_kv) */
    float **conv, **rec;     /* [n_layers] state buffers [n_state_slots][...]; NULL: none */
    int32_t *free_slots;     /* the state slots no sequence holds (a stack) */
    int n_free_slots;
    float *tables;           /* backend copy of the codec's tables, or NULL */
    size_t tables_bytes;
    size_t k_page, v_page;   /* bytes of one page of one layer's K / V (group 0) */
    size_t wk_page, wv_page; /* the same for a window-group layer */
    pt_block_pool pool;      /* page ids: owners, free queue, content hashes */
    pt_block_pool wpool;     /* the window group's page ids (grouped only) */
    /* hybrid models' state snapshots: per recurrent layer n_snaps slots of
     * conv and rec state, each the state at the end of the page whose key
     * is snap_key[i] (snap_used[i]: LRU tick; 0: empty) */
    int n_snaps;
    float **sconv, **srec;
    uint64_t *snap_key, *snap_used, snap_tick;
    pt_disk *disk;           /* the cold tier, or NULL (pt_kv_attach_disk) */
    void *disk_buf;          /* [pt_kv_page_bytes] staging for disk reads */
} pt_kv_cache;

typedef struct pt_kv_seq {
    int32_t *pages; /* block table */
    int n_pages, cap;
    int n_tokens; /* positions whose K/V are stored */
    int32_t *wpages; /* grouped: the window group's table, [n_pages], -1 where recycled */
    int wlo;         /* wpages[i] < 0 for every i < wlo */
    int state;     /* recurrent-state slot + 1; 0: none */
    int state_pos; /* positions folded into the state; -1: rolled back past it */
    int ckpt;      /* checkpoint slot + 1; 0: none */
    int ckpt_pos;  /* positions the checkpoint covers */
} pt_kv_seq;

/* Counts positions [0, n) of seq as computed (after a forward): its K/V
 * and, where it has one, its recurrent state. */
static inline void pt_kv_seq_computed(pt_kv_seq *seq, int n) {
    if (n > seq->n_tokens) seq->n_tokens = n;
    if (seq->state && n > seq->state_pos) seq->state_pos = n;
}


/* Whether layer l of the cache is in the window group. */
static inline bool pt_kv_layer_windowed(const pt_kv_cache *kv, int l) {
    return kv->grouped && (kv->cfg.window_layers[l / 64] >> (l % 64) & 1);
}

int pt_kv_cache_init(pt_kv_cache *kv, pt_backend *be, const pt_kv_config *cfg, pt_err *err);
void pt_kv_cache_free(pt_kv_cache *kv);
/* Bytes of K+V per token over all layers (what the codec stores: codes and
 * scales included); 0 if the codec cannot take the geometry. */
size_t pt_kv_bytes_per_token(const pt_kv_config *cfg);
/* The cache's element format: the dtype name ("f16") or the codec's
 * ("turbo-k8v3", "affine8").  Part of any key that shares pages. */
const char *pt_kv_format_name(const pt_kv_config *cfg, char *buf, size_t cap);
/* Bytes of recurrent state one sequence holds (0 without the group). */
size_t pt_kv_state_bytes(const pt_kv_config *cfg);
/* Ensures the sequence has pages for positions [0, n_positions), and a
 * recurrent-state slot if the cache has the group. */
int pt_kv_seq_reserve(pt_kv_cache *kv, pt_kv_seq *seq, int n_positions, pt_err *err);
/* Pages a sequence needs taken from the pool to write positions
 * [from, to): new pages past its table plus copies of shared ones. */
int pt_kv_seq_pages_needed(const pt_kv_cache *kv, const pt_kv_seq *seq, int from, int to);
/* Reserves [0, to) and makes the pages covering [from, to) the sequence's
 * own, copying any page it shares (copy on write), so writing those
 * positions cannot change another sequence's view. */
int pt_kv_seq_own(pt_kv_cache *kv, pt_kv_seq *seq, int from, int to, pt_err *err);
/* Hybrid models: reserves seq's checkpoint slot (once; held until
 * release).  false if it has no state or no slot is free. */
bool pt_kv_seq_ckpt_reserve(pt_kv_cache *kv, pt_kv_seq *seq);
/* Copies seq's state into its reserved checkpoint, as of state_pos. */
void pt_kv_seq_checkpoint(pt_kv_cache *kv, pt_kv_seq *seq);
/* dst (empty) shares every page and position of src, and gets a copy of
 * its recurrent state (if no slot is free, dst has none and must restart
 * at position 0). */
void pt_kv_seq_fork(pt_kv_cache *kv, pt_kv_seq *dst, const pt_kv_seq *src);
/* Copies group-0 page src's bytes, every layer of group 0, K and V, to page dst. */
void pt_kv_copy_page(pt_kv_cache *kv, int32_t dst, int32_t src);
/* Bytes of one group-0 page over its layers, K and V: what a host copy
 * holds.  The disk tier keeps group-0 pages only, so it refuses grouped
 * caches (engine.c). */
size_t pt_kv_page_bytes(const pt_kv_cache *kv);
/* A page's bytes to host memory (layer by layer, K then V) and back: for
 * swapping and the disk tier.  pt_kv_page_load restores exactly what
 * pt_kv_page_save wrote, into any page of a cache of the same format. */
void pt_kv_page_save(pt_kv_cache *kv, int32_t page, void *host);
void pt_kv_page_load(pt_kv_cache *kv, int32_t page, const void *host);
/* Returns all pages of the sequence to the pool and empties it. */
void pt_kv_seq_release(pt_kv_cache *kv, pt_kv_seq *seq);
/* Rolls back to n positions: drops positions >= n, and pages past the new
 * end go back to the pool (exactly ceil(n / page_size) stay).  At 0 the
 * state slots go back too.  Above 0 but below state_pos, the checkpoint is
 * restored if it covers at most n positions (n_tokens drops to ckpt_pos:
 * the rest is recomputed), else the state is marked invalid (-1). */
void pt_kv_seq_truncate(pt_kv_cache *kv, pt_kv_seq *seq, int n);
int pt_kv_free_pages(const pt_kv_cache *kv);
/* Pages the sequence holds in group g (0, or 1: the window group). */
int pt_kv_seq_group_pages(const pt_kv_cache *kv, const pt_kv_seq *seq, int g);
/* Sequences the window pool holds at once, each writing up to
 * cfg.window_rows rows a call; INT32_MAX without a window group or with a
 * pool as large as group 0's. */
int pt_kv_max_seqs(const pt_kv_cache *kv);
/* Window-group pages one sequence can hold at once (the pool holds that
 * many per sequence it is sized for). */
int pt_kv_window_pages_per_seq(const pt_kv_config *cfg);
/* Bytes per position of the window group's layers (0 with one group):
 * pt_kv_bytes_per_token less this is what each position of context costs
 * once the window pool is paid for. */
size_t pt_kv_window_bytes_per_token(const pt_kv_cache *kv);

/* The prefix cache.  Content keys are set on both groups' page i at once
 * (pt_kv_seq_set_key); pt_kv_prefix_window shortens a run of n leading
 * group-0 hits to the longest whose window pages are also still cached;
 * pt_kv_seq_adopt gives an empty sequence the first n pages by key (group 0
 * from the pool or the disk tier, then the window pages it needs) and
 * returns how many it took (positions = that x page_size). */
void pt_kv_seq_set_key(pt_kv_cache *kv, pt_kv_seq *seq, int i, uint64_t key);
int pt_kv_prefix_window(const pt_kv_cache *kv, const uint64_t *keys, int n);
int pt_kv_seq_adopt(pt_kv_cache *kv, pt_kv_seq *seq, const uint64_t *keys, int n);

/* Hybrid models' state snapshots (above).  pt_kv_snaps_init makes room for
 * n (0: none, and hybrid prefixes are never reused); pt_kv_seq_snapshot
 * stores seq's state, which must cover exactly the pages up to the one
 * keyed key (state_pos a positive multiple of page_size), replacing the
 * least recently used snapshot; pt_kv_prefix_state is the longest run of
 * the first n keys that ends in a snapshot (n for a cache without
 * recurrent state; 0 if none). */
int pt_kv_snaps_init(pt_kv_cache *kv, int n, pt_err *err);
void pt_kv_seq_snapshot(pt_kv_cache *kv, const pt_kv_seq *seq, uint64_t key);
int pt_kv_prefix_state(const pt_kv_cache *kv, const uint64_t *keys, int n);

/* The disk tier: cached pages evicted from the pool are written to disk
 * (off the hot path), and pt_kv_restore_page brings one back.  disk is the
 * caller's (closed after the cache).  NULL detaches. */
void pt_kv_attach_disk(pt_kv_cache *kv, pt_disk *disk);
/* A free page holding the disk's copy of key, keyed and held once; -1 if
 * the disk has none (or a damaged one) or no page is free. */
int32_t pt_kv_restore_page(pt_kv_cache *kv, uint64_t key);
/* Writes every keyed page the disk lacks (at shutdown) and waits. */
void pt_kv_flush_to_disk(pt_kv_cache *kv);
pt_kv_view pt_kv_layer(const pt_kv_cache *kv, int layer);

#endif
