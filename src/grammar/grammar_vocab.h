/*
 * grammar_vocab.h - the vocabulary trie's layout (vocab.c), read by the
 * matcher's mask walk.
 */
#ifndef PETREL_GRAMMAR_VOCAB_H
#define PETREL_GRAMMAR_VOCAB_H

#include "grammar/grammar_int.h"

#include <pthread.h>

#define PT_GVOCAB_MAX_LEN 1024

/* One truncated stack's classified vocabulary (matcher.c). */
typedef struct pc_entry {
    uint32_t *acc;   /* [n_words] accepted whatever lies below the cut, or NULL */
    int32_t *acc_ls; /* when few are: their ids instead (duplicates included) */
    int n_acc_ls;
    int32_t *unc;    /* tokens that depend on it */
    int n_unc;
    bool acc_borrowed; /* acc belongs to a counted table (matcher.c) */
    struct ctab *cnt;  /* counted strings' table, built on first use under
                        * the vocabulary's mutex (matcher.c) */
} pc_entry;

void pc_entry_free(pc_entry *e);

typedef struct pc_slot {
    uint64_t hash;
    uint8_t *sig;
    size_t len;
    pc_entry *e;
} pc_slot;

/* Set on a trie node's token when dup_next must be followed: the walks
 * then need not read dup_next (a cache miss per token) for the rest. */
#define TTOK_DUP 0x40000000

#define PT_GVOCAB_CACHE 4096 /* entries kept, each n_vocab bits + a list */

struct pt_gvocab {
    int n_vocab, n_words;
    size_t *off;       /* [n_vocab] token bytes in blob */
    uint32_t *len;     /* [n_vocab] 0: never allowed */
    char *blob;
    int32_t *dup_next; /* [n_vocab] next id with the same bytes, -1 */
    uint8_t *tbyte;    /* trie, preorder: byte of node i */
    int32_t *ttok;     /* first token ending at node i, -1; ORed with
                        * TTOK_DUP when more tokens have the same bytes */
    int32_t *tend;     /* one past node i's subtree */
    int n_nodes;
    pthread_mutex_t mu; /* guards the cache: matchers of many threads */
    pc_slot *slots;     /* [2 * PT_GVOCAB_CACHE] open addressing */
    int n_slots_used;
};

/* The classification with this signature, or NULL. */
pc_entry *pt_gvocab_cache_get(pt_gvocab *v, uint64_t h, const uint8_t *sig, size_t len);
/* Keeps e (the vocabulary owns it from now on); false if the cache is full
 * or holds the signature already (the caller keeps e). */
bool pt_gvocab_cache_put(pt_gvocab *v, uint64_t h, const uint8_t *sig, size_t len, pc_entry *e);

/* Trie nodes the matcher's walks have visited (for tests: memoized walks
 * must not walk a subtree twice from one set). */
long pt_gmatcher_nodes_walked(const pt_gmatcher *m);
/* Off: masks of counted strings are classified by walking the trie like
 * any other state (for tests: both ways must give the same masks).
 * Returns how many classifications were derived from a counted table. */
long pt_gmatcher_counted(pt_gmatcher *m, bool on);

#endif
