/*
 * block_pool.c - block reference counts, the free queue in eviction order,
 * and the content-hash map (see block_pool.h for the states).
 *
 * The free queue is an intrusive doubly-linked list over block ids so that
 * a cache hit can pull a block out of the middle in O(1).  The hash map is
 * open addressing with linear probing and backward-shift deletion (no
 * tombstones), sized to twice the block count so probes stay short.
 */
#include "kv/block_pool.h"

#include <stdlib.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>

/* ---- the free queue ------------------------------------------------------ */

static void queue_unlink(pt_block_pool *p, int32_t id) {
    int32_t a = p->prev[id], b = p->next[id];
    if (a >= 0) p->next[a] = b; else p->head = b;
    if (b >= 0) p->prev[b] = a; else p->tail = a;
    p->prev[id] = p->next[id] = -1;
    p->n_free--;
}

static void queue_push_tail(pt_block_pool *p, int32_t id) {
    p->prev[id] = p->tail;
    p->next[id] = -1;
    if (p->tail >= 0) p->next[p->tail] = id; else p->head = id;
    p->tail = id;
    p->n_free++;
}

static void queue_push_head(pt_block_pool *p, int32_t id) {
    p->next[id] = p->head;
    p->prev[id] = -1;
    if (p->head >= 0) p->prev[p->head] = id; else p->tail = id;
    p->head = id;
    p->n_free++;
}

/* ---- the hash map -------------------------------------------------------- */

static uint32_t slot_of(const pt_block_pool *p, uint64_t h) {
    return (uint32_t)(h ^ (h >> 29)) & p->map_mask;
}

static void map_remove(pt_block_pool *p, int32_t id) {
    uint32_t i = slot_of(p, p->hash[id]);
    while (p->map[i] != id) {
        if (p->map[i] < 0) return; /* not registered (another block owns the hash) */
        i = (i + 1) & p->map_mask;
    }
    /* Backward shift: move later entries of the run into the hole when
     * their home slot does not lie between the hole and them. */
    for (uint32_t j = (i + 1) & p->map_mask;; j = (j + 1) & p->map_mask) {
        int32_t e = p->map[j];
        if (e < 0) break;
        uint32_t home = slot_of(p, p->hash[e]);
        if (((j - home) & p->map_mask) >= ((j - i) & p->map_mask)) {
            p->map[i] = e;
            i = j;
        }
    }
    p->map[i] = -1;
}

int32_t pt_block_lookup(const pt_block_pool *p, uint64_t hash) {
    if (!hash) return -1;
    for (uint32_t i = slot_of(p, hash);; i = (i + 1) & p->map_mask) {
        int32_t e = p->map[i];
        if (e < 0 || p->hash[e] == hash) return e;
    }
}

void pt_block_set_hash(pt_block_pool *p, int32_t id, uint64_t hash) {
    if (!hash || p->hash[id] == hash) return;
    if (p->hash[id]) map_remove(p, id);
    p->hash[id] = 0;
    if (pt_block_lookup(p, hash) >= 0) return; /* the first holder keeps it */
    p->hash[id] = hash;
    uint32_t i = slot_of(p, hash);
    while (p->map[i] >= 0) i = (i + 1) & p->map_mask;
    p->map[i] = id;
}

/* ---- the pool -------------------------------------------------------------- */

int pt_block_pool_init(pt_block_pool *p, int n_blocks, pt_err *err) {
    memset(p, 0, sizeof *p);
    if (n_blocks <= 0 || n_blocks > 1 << 29)
        return pt_fail(err, "block pool: bad size %d", n_blocks);
    uint32_t cap = 16;
    while (cap < 2u * (uint32_t)n_blocks) cap <<= 1;
    p->n_blocks = n_blocks;
    p->refs = pt_xcalloc((size_t)n_blocks, sizeof *p->refs);
    p->hash = pt_xcalloc((size_t)n_blocks, sizeof *p->hash);
    p->prev = pt_xmalloc(sizeof *p->prev * (size_t)n_blocks);
    p->next = pt_xmalloc(sizeof *p->next * (size_t)n_blocks);
    p->map = pt_xmalloc(sizeof *p->map * cap);
    p->map_mask = cap - 1;
    memset(p->map, 0xff, sizeof *p->map * cap);
    p->head = p->tail = -1;
    for (int32_t i = 0; i < n_blocks; i++) queue_push_tail(p, i); /* taken 0, 1, 2... */
    return 0;
}

void pt_block_pool_free(pt_block_pool *p) {
    free(p->refs);
    free(p->hash);
    free(p->prev);
    free(p->next);
    free(p->map);
    memset(p, 0, sizeof *p);
}

int32_t pt_block_alloc(pt_block_pool *p) {
    int32_t id = p->head;
    if (id < 0) return -1;
    queue_unlink(p, id);
    if (p->hash[id] && p->on_evict) p->on_evict(p->evict_ctx, id, p->hash[id]);
    if (p->hash[id]) map_remove(p, id);
    p->hash[id] = 0;
    p->refs[id] = 1;
    return id;
}

void pt_block_ref(pt_block_pool *p, int32_t id) {
    if (p->refs[id]++ == 0) queue_unlink(p, id);
}

void pt_block_unref(pt_block_pool *p, int32_t id) {
    if (--p->refs[id] > 0) return;
    if (p->hash[id])
        queue_push_tail(p, id);
    else
        queue_push_head(p, id);
}

uint64_t pt_block_hash(uint64_t parent, const int32_t *tokens, int n, uint64_t salt) {
    XXH3_state_t st;
    XXH3_64bits_reset_withSeed(&st, salt);
    XXH3_64bits_update(&st, &parent, sizeof parent);
    XXH3_64bits_update(&st, tokens, sizeof(int32_t) * (size_t)n);
    uint64_t h = XXH3_64bits_digest(&st);
    return h ? h : 1;
}
