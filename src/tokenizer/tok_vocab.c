/*
 * tok_vocab.c - the vocabulary's containers: a string arena, growable
 * buffers, the text -> id hash map, the merge-pair map, the added-token trie
 * and the end-of-generation set.
 *
 * Vocabularies reach 262,144 tokens and half a million merges, so strings
 * live in a few big arena chunks rather than one malloc each, and both maps
 * are open-addressing tables with linear probing, at most half full.
 */
#include "tokenizer/tokenizer_internal.h"

#include <stdlib.h>

/* ---- arena, buffers ---- */

#define ARENA_CHUNK (1u << 20)

char *tok_arena_dup(tok_arena *a, const char *s, size_t n) {
    if (a->left < n + 1) {
        size_t size = n + 1 > ARENA_CHUNK ? n + 1 : ARENA_CHUNK;
        a->chunks = pt_xrealloc(a->chunks, (a->n_chunks + 1) * sizeof *a->chunks);
        a->cur = a->chunks[a->n_chunks++] = pt_xmalloc(size);
        a->left = size;
    }
    char *p = a->cur;
    if (n) memcpy(p, s, n);
    p[n] = 0;
    a->cur += n + 1;
    a->left -= n + 1;
    return p;
}

void tok_arena_free(tok_arena *a) {
    for (size_t i = 0; i < a->n_chunks; i++) free(a->chunks[i]);
    free(a->chunks);
    memset(a, 0, sizeof *a);
}

void tok_buf_put(tok_buf *b, const void *p, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n + 1) cap *= 2;
        b->s = pt_xrealloc(b->s, cap);
        b->cap = cap;
    }
    if (n) memcpy(b->s + b->n, p, n);
    b->n += n;
    b->s[b->n] = 0; /* always a C string too */
}

void tok_ids_push(tok_ids *a, int32_t id) {
    if (a->n == a->cap) {
        a->cap = a->cap ? a->cap * 2 : 64;
        a->v = pt_xrealloc(a->v, a->cap * sizeof *a->v);
    }
    a->v[a->n++] = id;
}

/* FNV-1a with a final avalanche, so that linear probing on the low bits
 * does not cluster on similar strings. */
uint64_t tok_hash(const void *p, size_t n) {
    const uint8_t *s = p;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 0x100000001b3ull;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return h;
}

static size_t table_size(size_t n) {
    size_t size = 16;
    while (size < 2 * n) size *= 2;
    return size;
}

/* ---- the vocabulary ---- */

int tok_alloc_vocab(pt_tokenizer *t, int64_t n, pt_err *err) {
    if (n <= 0) return pt_fail(err, "the vocabulary is empty");
    if (n > TOK_MAX_VOCAB)
        return pt_fail(err, "vocabulary of %lld tokens exceeds the limit of %d", (long long)n,
                       TOK_MAX_VOCAB);
    t->n_vocab = (int)n;
    t->tokens = pt_xcalloc((size_t)n, sizeof *t->tokens);
    t->eog = pt_xcalloc((size_t)n, 1);
    for (int64_t i = 0; i < n; i++) {
        t->tokens[i].text = t->tokens[i].bytes = "";
        t->tokens[i].type = TOK_UNUSED;
    }
    return 0;
}

static void strmap_put(pt_tokenizer *t, int32_t id) {
    const tok_token *tk = &t->tokens[id];
    size_t i = tok_hash(tk->text, tk->len) & t->map.mask;
    for (;; i = (i + 1) & t->map.mask) {
        int32_t cur = t->map.slots[i];
        if (cur < 0) {
            t->map.slots[i] = id;
            return;
        }
        const tok_token *o = &t->tokens[cur];
        if (o->len == tk->len && !memcmp(o->text, tk->text, tk->len)) {
            t->map.slots[i] = id; /* a later definition wins, as in a JS Map */
            return;
        }
    }
}

/* Added tokens are inserted last so that they win over a vocabulary entry
 * with the same text, as in both reference implementations. */
void tok_strmap_build(pt_tokenizer *t) {
    size_t size = table_size((size_t)t->n_vocab);
    t->map.slots = pt_xmalloc(size * sizeof *t->map.slots);
    memset(t->map.slots, 0xff, size * sizeof *t->map.slots);
    t->map.mask = size - 1;
    uint8_t *is_added = pt_xcalloc((size_t)t->n_vocab, 1);
    for (int i = 0; i < t->n_added; i++) is_added[t->added[i].id] = 1;
    for (int32_t id = 0; id < t->n_vocab; id++)
        if (!is_added[id] && t->tokens[id].type != TOK_UNUSED) strmap_put(t, id);
    for (int i = 0; i < t->n_added; i++) strmap_put(t, t->added[i].id);
    free(is_added);
}

int32_t tok_strmap_get(const pt_tokenizer *t, const char *s, size_t n) {
    if (!t->map.slots) return -1;
    size_t i = tok_hash(s, n) & t->map.mask;
    for (;; i = (i + 1) & t->map.mask) {
        int32_t id = t->map.slots[i];
        if (id < 0) return -1;
        const tok_token *tk = &t->tokens[id];
        if (tk->len == n && (n == 0 || !memcmp(tk->text, s, n))) return id; /* s may be NULL */
    }
}

/* ---- merges ---- */

static uint64_t pair_key(int32_t a, int32_t b) {
    return (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
}

static void pairmap_grow(tok_pairmap *m) {
    size_t size = m->slots ? (m->mask + 1) * 2 : 1024;
    tok_pair *old = m->slots;
    size_t old_size = old ? m->mask + 1 : 0;
    m->slots = pt_xmalloc(size * sizeof *m->slots);
    for (size_t i = 0; i < size; i++) m->slots[i].key = UINT64_MAX;
    m->mask = size - 1;
    for (size_t i = 0; i < old_size; i++) {
        if (old[i].key == UINT64_MAX) continue;
        size_t j = tok_hash(&old[i].key, 8) & m->mask;
        while (m->slots[j].key != UINT64_MAX) j = (j + 1) & m->mask;
        m->slots[j] = old[i];
    }
    free(old);
}

/* A repeated pair takes the later rank, as a JS Map or Rust HashMap built
 * from the list would. */
void tok_pairmap_put(tok_pairmap *m, int32_t a, int32_t b, int32_t rank, int32_t result) {
    if (!m->slots || 2 * (m->n + 1) > m->mask + 1) pairmap_grow(m);
    uint64_t key = pair_key(a, b);
    size_t i = tok_hash(&key, 8) & m->mask;
    while (m->slots[i].key != UINT64_MAX && m->slots[i].key != key) i = (i + 1) & m->mask;
    if (m->slots[i].key == UINT64_MAX) m->n++;
    m->slots[i] = (tok_pair){key, rank, result};
}

const tok_pair *tok_pairmap_get(const tok_pairmap *m, int32_t a, int32_t b) {
    if (!m->slots) return NULL;
    uint64_t key = pair_key(a, b);
    size_t i = tok_hash(&key, 8) & m->mask;
    for (;; i = (i + 1) & m->mask) {
        if (m->slots[i].key == key) return &m->slots[i];
        if (m->slots[i].key == UINT64_MAX) return NULL;
    }
}

/* ---- added-token trie ---- */

static uint32_t trie_node(tok_trie *tr) {
    if (tr->n_nodes == tr->cap_nodes) {
        tr->cap_nodes = tr->cap_nodes ? tr->cap_nodes * 2 : 256;
        tr->term = pt_xrealloc(tr->term, tr->cap_nodes * sizeof *tr->term);
    }
    tr->term[tr->n_nodes] = -1;
    return tr->n_nodes++;
}

static uint32_t trie_child(const tok_trie *tr, uint32_t node, uint8_t c) {
    uint64_t key = (uint64_t)node * 256 + c + 1;
    size_t i = tok_hash(&key, 8) & tr->edge_mask;
    for (;; i = (i + 1) & tr->edge_mask) {
        if (tr->edges[i].key == key) return tr->edges[i].child;
        if (!tr->edges[i].key) return 0; /* the root is never a child */
    }
}

static void trie_add_edge(tok_trie *tr, uint32_t node, uint8_t c, uint32_t child) {
    uint64_t key = (uint64_t)node * 256 + c + 1;
    size_t i = tok_hash(&key, 8) & tr->edge_mask;
    while (tr->edges[i].key) i = (i + 1) & tr->edge_mask;
    tr->edges[i] = (tok_trie_edge){key, child};
    tr->n_edges++;
}

void tok_trie_build(pt_tokenizer *t) {
    tok_trie *tr = &t->trie;
    size_t total = 0;
    for (int i = 0; i < t->n_added; i++) total += t->tokens[t->added[i].id].len;
    size_t size = table_size(total + 1);
    tr->edges = pt_xcalloc(size, sizeof *tr->edges);
    tr->edge_mask = size - 1;
    trie_node(tr); /* root */
    for (int i = 0; i < t->n_added; i++) {
        const tok_token *tk = &t->tokens[t->added[i].id];
        if (!tk->len) continue; /* an empty added token would match everywhere */
        uint32_t node = 0;
        for (uint32_t k = 0; k < tk->len; k++) {
            uint8_t c = (uint8_t)tk->text[k];
            uint32_t next = trie_child(tr, node, c);
            if (!next) {
                next = trie_node(tr);
                trie_add_edge(tr, node, c, next);
            }
            node = next;
        }
        tr->term[node] = i; /* a later duplicate wins */
    }
}

int tok_trie_match(const pt_tokenizer *t, const char *text, size_t n, bool parse_special,
                   size_t *len) {
    const tok_trie *tr = &t->trie;
    if (!tr->n_edges) return -1;
    int best = -1;
    uint32_t node = 0;
    for (size_t k = 0; k < n; k++) {
        node = trie_child(tr, node, (uint8_t)text[k]);
        if (!node) break;
        int a = tr->term[node];
        if (a >= 0 && (parse_special || !t->added[a].special)) {
            best = a;
            *len = k + 1;
        }
    }
    return best;
}

/* ---- end of generation ---- */

void tok_set_eog(pt_tokenizer *t, int32_t id) {
    if (id >= 0 && id < t->n_vocab) t->eog[id] = 1;
}

/* Chat models end a turn with a token other than the file's eos; these are
 * the names in use (llama.cpp keeps a similar list). Only special tokens
 * count, so a vocabulary piece that happens to read "</s>" does not.
 * <|end|> ends Phi-3's turn, but in OpenAI's harmony format (a vocabulary
 * with <|channel|>) it ends one message of the answer: gpt-oss writes its
 * reasoning, <|end|>, then the final message, and stops at <|return|> or
 * <|call|> (llama.cpp drops <|end|> from its end tokens likewise). */
void tok_mark_eog_by_name(pt_tokenizer *t) {
    int32_t channel = tok_strmap_get(t, "<|channel|>", strlen("<|channel|>"));
    bool harmony = channel >= 0 && t->tokens[channel].special;
    static const char *names[] = {
        "<|eot_id|>", "<|eom_id|>",     "<|im_end|>",     "<|end|>",
        "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>", "</s>",
        "<|return|>", "<|call|>",       "<EOT>",          "<|END_OF_TURN_TOKEN|>",
        "<｜end▁of▁sentence｜>",
    };
    for (size_t i = 0; i < PT_ARRAY_LEN(names); i++) {
        if (harmony && !strcmp(names[i], "<|end|>")) continue;
        int32_t id = tok_strmap_get(t, names[i], strlen(names[i]));
        if (id >= 0 && t->tokens[id].special) tok_set_eog(t, id);
    }
    tok_set_eog(t, t->eos);
    /* a GGUF may name <|end|> its eot token: not in harmony */
    int32_t end = tok_strmap_get(t, "<|end|>", strlen("<|end|>"));
    if (harmony && end >= 0 && end != t->eos) t->eog[end] = 0;
}
