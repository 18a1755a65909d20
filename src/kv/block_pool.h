/*
 * block_pool.h - the ids of the KV cache's fixed-size blocks: who holds
 * each, which are free, and which free ones still hold reusable content.
 *
 * The pool is bookkeeping only; the bytes live in the KV cache's per-layer
 * buffers, indexed by block id.  Every block is in exactly one of three
 * states:
 *
 *     FREE-EMPTY   refs == 0, no hash: at the head of the free queue;
 *     FREE-CACHED  refs == 0, a content hash: in the free queue in the order
 *                  it was freed (least recently used first), and findable
 *                  by its hash until it is taken for new content;
 *     HELD         refs > 0: owned by that many sequences, not in the queue.
 *
 * Transitions and the function behind each:
 *     FREE-*      -> HELD         pt_block_alloc (takes the queue's head,
 *                                 forgetting any hash it had)
 *     FREE-CACHED -> HELD         pt_block_ref (a cache hit revives it)
 *     HELD        -> HELD         pt_block_ref / pt_block_unref (refs > 1)
 *     HELD        -> FREE-*       pt_block_unref (last owner gone): to the
 *                                 queue's tail when hashed, its head if not
 *
 * So allocation evicts empty blocks first, then cached ones in LRU order,
 * and content survives a free until the block is actually reused (vLLM's
 * free_block_queue with cached_block_hash_to_block).
 *
 * A hash maps to at most one block: the first block registered under it.
 * Hash 0 means "none".
 */
#ifndef PETREL_BLOCK_POOL_H
#define PETREL_BLOCK_POOL_H

#include "base/base.h"

typedef struct pt_block_pool {
    int n_blocks;
    int n_free;
    uint32_t *refs;   /* [n_blocks] */
    uint64_t *hash;   /* [n_blocks] content hash, 0 = none */
    int32_t *prev, *next; /* [n_blocks] free queue links, -1 at the ends */
    int32_t head, tail;   /* free queue: head is taken first */
    int32_t *map;     /* open-addressing hash -> block id, -1 empty */
    uint32_t map_mask;
    /* Called when pt_block_alloc takes a cached block, before its content
     * is lost (the disk tier saves it).  NULL: nothing. */
    void (*on_evict)(void *ctx, int32_t id, uint64_t hash);
    void *evict_ctx;
} pt_block_pool;

int pt_block_pool_init(pt_block_pool *p, int n_blocks, pt_err *err);
void pt_block_pool_free(pt_block_pool *p);

/* Takes the least valuable free block (empty before cached, then least
 * recently freed), drops its old hash, and returns it held once; -1 if no
 * block is free. */
int32_t pt_block_alloc(pt_block_pool *p);
/* One more owner of a held block, or revives a cached free one. */
void pt_block_ref(pt_block_pool *p, int32_t id);
/* One owner fewer; the last one frees the block (keeping its hash). */
void pt_block_unref(pt_block_pool *p, int32_t id);

/* Records the block's content hash so pt_block_lookup finds it.  A hash
 * already registered to another block is left with that block. */
void pt_block_set_hash(pt_block_pool *p, int32_t id, uint64_t hash);
/* The block holding content hash, held or cached-free, or -1. */
int32_t pt_block_lookup(const pt_block_pool *p, uint64_t hash);

/* The key of a full block: its tokens chained with the parent block's key
 * (0 for the first block) and a salt for everything else that changes the
 * stored bytes (model, KV format).  Never 0. */
uint64_t pt_block_hash(uint64_t parent, const int32_t *tokens, int n, uint64_t salt);

static inline int pt_block_refs(const pt_block_pool *p, int32_t id) {
    return (int)p->refs[id];
}

#endif
