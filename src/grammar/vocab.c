/*
 * vocab.c - the vocabulary as a byte trie, the shape token masks are
 * computed over.
 *
 * The trie is stored in depth-first preorder: node i has one byte, the
 * token whose bytes end there (or -1), and end[i], the index just past its
 * subtree, so the children of i are i+1, end[i+1], ... and a subtree is a
 * contiguous range.  Tokens with identical bytes hang off dup_next.
 * Invariant: node 0 is the empty prefix; tokens with no bytes (special
 * tokens) are not in the trie and so are never allowed by a grammar.
 */
#include "grammar/grammar_vocab.h"

#include <stdlib.h>

#include "tokenizer/tokenizer.h"

int32_t pt_gvocab_longest_prefix(const pt_gvocab *v, const char *s, size_t len, size_t *n) {
    int32_t node = 0, best = -1;
    *n = 0;
    for (size_t d = 0; d < len; d++) {
        int32_t next = -1;
        for (int32_t c = node + 1; c < v->tend[node]; c = v->tend[c])
            if (v->tbyte[c] == (uint8_t)s[d]) {
                next = c;
                break;
            }
        if (next < 0) break;
        node = next;
        if (v->ttok[node] >= 0) {
            best = v->ttok[node] & ~TTOK_DUP;
            *n = d + 1;
        }
    }
    return best;
}

static const pt_gvocab *sort_vocab;

static int cmp_tok(const void *a, const void *b) {
    const pt_gvocab *v = sort_vocab;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    size_t lx = v->len[x], ly = v->len[y], l = lx < ly ? lx : ly;
    int c = memcmp(v->blob + v->off[x], v->blob + v->off[y], l);
    if (c) return c;
    if (lx != ly) return lx < ly ? -1 : 1;
    return x < y ? -1 : x > y;
}

static void build_trie(pt_gvocab *v) {
    int32_t *ids = pt_xmalloc((size_t)v->n_vocab * sizeof *ids);
    int n = 0;
    size_t total = 1;
    for (int i = 0; i < v->n_vocab; i++) {
        v->dup_next[i] = -1;
        if (v->len[i]) { ids[n++] = i; total += v->len[i]; }
    }
    sort_vocab = v; /* qsort has no context argument in C11 */
    qsort(ids, (size_t)n, sizeof *ids, cmp_tok);
    v->tbyte = pt_xmalloc(total);
    v->ttok = pt_xmalloc(total * sizeof *v->ttok);
    v->tend = pt_xmalloc(total * sizeof *v->tend);
    int32_t path[PT_GVOCAB_MAX_LEN + 1]; /* node index at each depth */
    int nn = 1, depth = 0;
    v->tbyte[0] = 0;
    v->ttok[0] = -1;
    path[0] = 0;
    int32_t prev = -1;
    for (int k = 0; k < n; k++) {
        int32_t id = ids[k];
        const uint8_t *s = (const uint8_t *)v->blob + v->off[id];
        size_t len = v->len[id], lcp = 0;
        if (prev >= 0) {
            const uint8_t *p = (const uint8_t *)v->blob + v->off[prev];
            size_t pl = v->len[prev];
            while (lcp < pl && lcp < len && p[lcp] == s[lcp]) lcp++;
            if (lcp == len && pl == len) { /* same bytes: a duplicate */
                int32_t t = v->ttok[path[depth]]; /* TTOK_DUP is set after the build */
                while (v->dup_next[t] >= 0) t = v->dup_next[t];
                v->dup_next[t] = id;
                prev = id;
                continue;
            }
        }
        while (depth > (int)lcp) v->tend[path[depth--]] = nn;
        for (size_t j = lcp; j < len; j++) {
            v->tbyte[nn] = s[j];
            v->ttok[nn] = -1;
            path[++depth] = nn++;
        }
        v->ttok[path[depth]] = id;
        prev = id;
    }
    while (depth >= 0) v->tend[path[depth--]] = nn;
    v->n_nodes = nn;
    for (int i = 0; i < nn; i++)
        if (v->ttok[i] >= 0 && v->dup_next[v->ttok[i]] >= 0) v->ttok[i] |= TTOK_DUP;
    free(ids);
}

pt_gvocab *pt_gvocab_from_bytes(int n_vocab, const char *const *bytes, const size_t *lens) {
    pt_gvocab *v = pt_xcalloc(1, sizeof *v);
    v->n_vocab = n_vocab;
    v->n_words = (n_vocab + 31) / 32;
    v->off = pt_xmalloc((size_t)n_vocab * sizeof *v->off);
    v->len = pt_xmalloc((size_t)n_vocab * sizeof *v->len);
    v->dup_next = pt_xmalloc((size_t)n_vocab * sizeof *v->dup_next);
    size_t total = 0;
    for (int i = 0; i < n_vocab; i++) {
        size_t l = bytes[i] ? lens[i] : 0;
        if (l > PT_GVOCAB_MAX_LEN) l = 0; /* absurdly long: never allowed */
        v->len[i] = (uint32_t)l;
        v->off[i] = total;
        total += l;
    }
    pthread_mutex_init(&v->mu, NULL);
    v->slots = pt_xcalloc(2 * PT_GVOCAB_CACHE, sizeof *v->slots);
    v->blob = pt_xmalloc(total + 1);
    for (int i = 0; i < n_vocab; i++)
        if (v->len[i]) memcpy(v->blob + v->off[i], bytes[i], v->len[i]);
    build_trie(v);
    return v;
}

pt_gvocab *pt_gvocab_from_tokenizer(const pt_tokenizer *tok) {
    int n = pt_tokenizer_n_vocab(tok);
    const char **b = pt_xcalloc((size_t)n, sizeof *b);
    size_t *l = pt_xcalloc((size_t)n, sizeof *l);
    for (int i = 0; i < n; i++) {
        if (pt_token_is_special(tok, i)) continue;
        b[i] = pt_token_bytes(tok, i, &l[i]);
    }
    pt_gvocab *v = pt_gvocab_from_bytes(n, b, l);
    free(b);
    free(l);
    return v;
}

void pt_gvocab_free(pt_gvocab *v) {
    if (!v) return;
    for (int i = 0; i < 2 * PT_GVOCAB_CACHE; i++) {
        pc_slot *sl = &v->slots[i];
        if (!sl->e) continue;
        free(sl->sig);
        free(sl->e->acc);
        free(sl->e->acc_ls);
        free(sl->e->unc);
        free(sl->e);
    }
    free(v->slots);
    pthread_mutex_destroy(&v->mu);
    free(v->off);
    free(v->len);
    free(v->blob);
    free(v->dup_next);
    free(v->tbyte);
    free(v->ttok);
    free(v->tend);
    free(v);
}

int pt_gvocab_n_vocab(const pt_gvocab *v) { return v->n_vocab; }

static pc_slot *find_slot(pt_gvocab *v, uint64_t h, const uint8_t *sig, size_t len) {
    uint32_t mask = 2 * PT_GVOCAB_CACHE - 1, i = (uint32_t)(h >> 20) & mask;
    for (;; i = (i + 1) & mask) {
        pc_slot *sl = &v->slots[i];
        if (!sl->e || (sl->hash == h && sl->len == len && !memcmp(sl->sig, sig, len))) return sl;
    }
}

pc_entry *pt_gvocab_cache_get(pt_gvocab *v, uint64_t h, const uint8_t *sig, size_t len) {
    pthread_mutex_lock(&v->mu);
    pc_entry *e = find_slot(v, h, sig, len)->e;
    pthread_mutex_unlock(&v->mu);
    return e;
}

bool pt_gvocab_cache_put(pt_gvocab *v, uint64_t h, const uint8_t *sig, size_t len, pc_entry *e) {
    pthread_mutex_lock(&v->mu);
    bool ok = false;
    if (v->n_slots_used < PT_GVOCAB_CACHE) {
        pc_slot *sl = find_slot(v, h, sig, len);
        if (!sl->e) {
            sl->hash = h;
            sl->len = len;
            sl->sig = pt_xmalloc(len + 1);
            memcpy(sl->sig, sig, len);
            sl->e = e;
            v->n_slots_used++;
            ok = true;
        }
    }
    pthread_mutex_unlock(&v->mu);
    return ok;
}
