/*
 * matcher.c - runs a grammar over bytes and computes token masks.
 *
 * State.  A stack is a chain of nodes; node = (pos, parent): "match the
 * element at code[pos], then continue with parent".  Nodes are hash-consed,
 * so equal stacks are equal ids and a state (a set of stacks) is a small
 * array of ids.  After each byte the state is closed: rule references are
 * expanded and finished alternatives popped until every stack's top is a
 * byte set (a "leaf"), or the stack is empty (ROOT: the text may end).  A
 * reference that is the last element of its alternative pushes no return
 * frame (a tail call), so right recursion (x*, lists) keeps stacks flat.
 * Closures are memoized per node.
 *
 * Masks.  For each leaf the vocabulary is classified once, by walking the
 * trie from the leaf's stack cut three frames down (the rest replaced by
 * SENTINEL): a token consumed before the walk pops into SENTINEL is
 * accepted whatever lies below; one that fails before any pop is rejected
 * whatever lies below; only tokens that run past a possible pop are
 * "uncertain" and are checked against the real state at mask time.  Three
 * frames hold a JSON string or number to its end, so inside a value almost
 * every token is decided by the classification (XGrammar's adaptive masks).
 * Classifications are shared through the vocabulary, keyed by a canonical
 * text of the sub-grammar they depend on, so a string's is computed once
 * per process.  Whole-state masks are cached too (a string's contents
 * repeat one state for many tokens).
 *
 * Walks.  State sets are interned and their byte transitions memoized: a
 * DFA built lazily over the pushdown's states (LLGuidance's lexer, without
 * a separate lexer grammar), so walking the trie costs a table lookup per
 * node once the sets along it have been seen.
 *
 * History.  Each accepted step pushes the new state; rollback pops.
 */
#include "grammar/grammar_vocab.h"

#include <stdlib.h>

enum { N_ROOT = 0, N_SENT = 1 };
enum { DS_SENT = 1, DS_LIVE = 2 }; /* a set holds SENTINEL / more than it */

typedef struct ivec {
    int32_t *a;
    int n, cap;
} ivec;

static void iv_grow(ivec *v) {
    v->cap = v->cap ? 2 * v->cap : 16;
    v->a = pt_xrealloc(v->a, (size_t)v->cap * sizeof *v->a);
}

static inline void iv_push(ivec *v, int32_t x) {
    if (v->n == v->cap) iv_grow(v);
    v->a[v->n++] = x;
}


/* A counted string's tokens by character count (see "counted strings"). */
struct ctab {
    int32_t c0;         /* bytes left of the current character at the leaf */
    int maxk;           /* most characters a token adds */
    int32_t *body;      /* tokens that stay in the string, by k */
    int32_t *body_off;  /* [maxk + 2] */
    uint32_t **cum;     /* [maxk + 1] bitmaps of body tokens of <= k, or NULL */
    int32_t *q, *q_k;   /* tokens reaching the quote, with their k */
    uint8_t *q_unc;     /* uncertain in the unbounded classification */
    int n_q;
};

struct pt_gmatcher {
    const pt_grammar *g;
    const pt_gvocab *v;
    /* nodes */
    int32_t *npos, *npar, *nnext, *clo_off, *clo_len;
    uint32_t *clo_mark, *set_mark;
    int n_nodes, cap_nodes;
    int32_t *htab; /* open addressing: node id + 1, 0 = empty */
    uint32_t hcap;
    uint32_t clo_gen, set_gen;
    ivec clo_pool;
    /* state history */
    ivec hist, hist_off;
    /* mask machinery */
    pc_entry **pc; /* [cap_pc] by truncated leaf node id */
    int n_pc;
    /* interned state sets and their byte transitions: a DFA built lazily
     * over the pushdown states, so a trie walk costs a table lookup per
     * node once a set has been seen */
    ivec dpool;               /* members of set k: dpool[doff[k] .. doff[k+1]) */
    ivec doff;
    uint8_t *dsent;           /* [k] DS_SENT | DS_LIVE */
    pt_byteset *dfirst;       /* [k] the bytes some member accepts: a walk
                               * skips the others without building their
                               * (dead) transitions */
    int32_t **dtrans;         /* [k] 256 successors; -2 unknown, -1 dead */
    int32_t *dhash;           /* open addressing: set index + 1 */
    uint32_t dhcap;
    int n_dsets;
    ivec dtmp;
    pc_entry **own;
    int n_own, cap_own;
    int32_t *canon;     /* [n_rules] signature numbering, -1 */
    ivec canon_touched, canon_queue;
    uint8_t *sig;
    size_t sig_len, sig_cap;
    uint32_t *tok_mark, tok_gen;
    ivec sim_a, sim_b;
    /* masks of whole states seen before: a state is a set of hash-consed
     * node ids, so equal ids mean an equal mask (a string's contents
     * repeat one state for many tokens) */
    struct mcache { uint64_t key; int32_t *ids; int n; uint32_t *mask; } *mc;
    uint32_t mc_cap;
    int mc_n;
    /* memoized trie walks (walk()): key -> slices of memo_pool */
    struct memo_ent { uint64_t key; int32_t acc_off, acc_n, unc_off, unc_n; } *memo;
    uint32_t memo_cap;
    int memo_n;
    ivec memo_pool, walk_acc;
    long n_walked; /* trie nodes visited, for tests */
    bool no_counts; /* counted strings classified by walks (tests) */
    long n_counted;
};

#define MC_MAX 512

static void ctab_free(struct ctab *c);

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return x < y ? -1 : x > y;
}

static uint32_t node_hash(int32_t pos, int32_t par) {
    uint64_t h = ((uint64_t)(uint32_t)pos << 32 | (uint32_t)par) * 0x9E3779B97F4A7C15ull;
    return (uint32_t)(h >> 32);
}

static int32_t node_add(pt_gmatcher *m, int32_t pos, int32_t par) {
    if (m->n_nodes == m->cap_nodes) {
        size_t c = m->cap_nodes ? 2 * (size_t)m->cap_nodes : 1024;
        m->npos = pt_xrealloc(m->npos, c * sizeof(int32_t));
        m->npar = pt_xrealloc(m->npar, c * sizeof(int32_t));
        m->nnext = pt_xrealloc(m->nnext, c * sizeof(int32_t));
        m->clo_off = pt_xrealloc(m->clo_off, c * sizeof(int32_t));
        m->clo_len = pt_xrealloc(m->clo_len, c * sizeof(int32_t));
        m->clo_mark = pt_xrealloc(m->clo_mark, c * sizeof(uint32_t));
        m->set_mark = pt_xrealloc(m->set_mark, c * sizeof(uint32_t));
        m->cap_nodes = (int)c;
    }
    int32_t id = m->n_nodes++;
    m->npos[id] = pos;
    m->npar[id] = par;
    m->nnext[id] = -1;
    m->clo_off[id] = -1;
    m->clo_len[id] = 0;
    m->clo_mark[id] = 0;
    m->set_mark[id] = 0;
    return id;
}

static void htab_grow(pt_gmatcher *m) {
    uint32_t cap = m->hcap ? 2 * m->hcap : 4096;
    int32_t *t = pt_xcalloc(cap, sizeof *t);
    for (int32_t id = 2; id < m->n_nodes; id++) {
        uint32_t h = node_hash(m->npos[id], m->npar[id]) & (cap - 1);
        while (t[h]) h = (h + 1) & (cap - 1);
        t[h] = id + 1;
    }
    free(m->htab);
    m->htab = t;
    m->hcap = cap;
}

static int32_t node_get(pt_gmatcher *m, int32_t pos, int32_t par) {
    if ((uint32_t)m->n_nodes * 2 >= m->hcap) htab_grow(m);
    uint32_t h = node_hash(pos, par) & (m->hcap - 1);
    for (;;) {
        int32_t e = m->htab[h];
        if (!e) break;
        if (m->npos[e - 1] == pos && m->npar[e - 1] == par) return e - 1;
        h = (h + 1) & (m->hcap - 1);
    }
    int32_t id = node_add(m, pos, par);
    m->htab[h] = id + 1;
    return id;
}

static void closure_rec(pt_gmatcher *m, int32_t id) {
    if (m->clo_mark[id] == m->clo_gen) return;
    m->clo_mark[id] = m->clo_gen;
    if (id <= N_SENT) {
        iv_push(&m->clo_pool, id);
        return;
    }
    const pt_grammar *g = m->g;
    int32_t pos = m->npos[id], e = g->code[pos];
    switch (GE_KIND(e)) {
    case GE_BYTES: iv_push(&m->clo_pool, id); break;
    case GE_END: closure_rec(m, m->npar[id]); break;
    default: {
        int r = GE_ARG(e);
        int32_t ret = GE_KIND(g->code[pos + 1]) == GE_END ? m->npar[id]
                                                          : node_get(m, pos + 1, m->npar[id]);
        for (int a = g->rule_alt[r]; a < g->rule_alt[r + 1]; a++)
            closure_rec(m, node_get(m, g->alt_start[a], ret));
    }
    }
}

/* The leaves (and ROOT/SENT) reachable from node id without a byte. */
static void closure(pt_gmatcher *m, int32_t id, int *off, int *len) {
    if (m->clo_off[id] < 0) {
        if (++m->clo_gen == 0) { /* wrapped: stale marks could collide */
            memset(m->clo_mark, 0, (size_t)m->n_nodes * sizeof *m->clo_mark);
            m->clo_gen = 1;
        }
        int start = m->clo_pool.n;
        closure_rec(m, id);
        m->clo_off[id] = start;
        m->clo_len[id] = m->clo_pool.n - start;
    }
    *off = m->clo_off[id];
    *len = m->clo_len[id];
}

static void set_begin(pt_gmatcher *m) {
    if (++m->set_gen == 0) {
        memset(m->set_mark, 0, (size_t)m->n_nodes * sizeof *m->set_mark);
        m->set_gen = 1;
    }
}

static void set_add_closure(pt_gmatcher *m, int32_t id, ivec *out) {
    int off, len;
    closure(m, id, &off, &len);
    for (int i = 0; i < len; i++) {
        int32_t x = m->clo_pool.a[off + i];
        if (m->set_mark[x] != m->set_gen) {
            m->set_mark[x] = m->set_gen;
            iv_push(out, x);
        }
    }
}

/* out = the state after byte b from state s[0..n). */
static void step(pt_gmatcher *m, const int32_t *s, int n, unsigned b, ivec *out) {
    out->n = 0;
    set_begin(m);
    const pt_grammar *g = m->g;
    for (int i = 0; i < n; i++) {
        int32_t id = s[i];
        if (id <= N_SENT) continue;
        int32_t pos = m->npos[id];
        if (!bs_has(&g->sets[GE_ARG(g->code[pos])], b)) continue;
        if (m->nnext[id] < 0) {
            int32_t nx = node_get(m, pos + 1, m->npar[id]);
            m->nnext[id] = nx;
        }
        set_add_closure(m, m->nnext[id], out);
    }
}

static const int32_t *cur_state(const pt_gmatcher *m, int *n) {
    int k = m->hist_off.n - 1;
    int off = m->hist_off.a[k - 1];
    *n = m->hist_off.a[k] - off;
    return m->hist.a + off;
}

static void push_state(pt_gmatcher *m, const ivec *s) {
    for (int i = 0; i < s->n; i++) iv_push(&m->hist, s->a[i]);
    iv_push(&m->hist_off, m->hist.n);
}

pt_gmatcher *pt_gmatcher_new(const pt_grammar *g, const pt_gvocab *v) {
    pt_gmatcher *m = pt_xcalloc(1, sizeof *m);
    m->g = g;
    m->v = v;
    node_add(m, -1, -1); /* N_ROOT */
    node_add(m, -2, -1); /* N_SENT */
    htab_grow(m);
    m->canon = pt_xmalloc(((size_t)g->n_rules + 1) * sizeof *m->canon);
    for (int i = 0; i <= g->n_rules; i++) m->canon[i] = -1;
    m->tok_mark = pt_xcalloc((size_t)v->n_vocab, sizeof *m->tok_mark);
    pt_gmatcher_reset(m);
    return m;
}

void pt_gmatcher_reset(pt_gmatcher *m) {
    const pt_grammar *g = m->g;
    m->hist.n = m->hist_off.n = 0;
    iv_push(&m->hist_off, 0);
    ivec s = {0};
    set_begin(m);
    for (int a = g->rule_alt[g->root]; a < g->rule_alt[g->root + 1]; a++)
        set_add_closure(m, node_get(m, g->alt_start[a], N_ROOT), &s);
    push_state(m, &s);
    free(s.a);
}

void pt_gmatcher_free(pt_gmatcher *m) {
    if (!m) return;
    free(m->npos);
    free(m->npar);
    free(m->nnext);
    free(m->clo_off);
    free(m->clo_len);
    free(m->clo_mark);
    free(m->set_mark);
    free(m->htab);
    free(m->clo_pool.a);
    free(m->hist.a);
    free(m->hist_off.a);
    for (int i = 0; i < m->n_own; i++) pc_entry_free(m->own[i]); /* those the shared cache did not take */
    free(m->own);
    free(m->pc);
    free(m->canon);
    free(m->canon_touched.a);
    free(m->canon_queue.a);
    free(m->sig);
    for (int k = 0; k < m->n_dsets; k++) free(m->dtrans[k]);
    free(m->dtrans);
    free(m->dsent);
    free(m->dfirst);
    free(m->dhash);
    free(m->dpool.a);
    free(m->doff.a);
    free(m->dtmp.a);
    free(m->tok_mark);
    free(m->sim_a.a);
    free(m->sim_b.a);
    for (uint32_t i = 0; i < m->mc_cap; i++) {
        free(m->mc[i].ids);
        free(m->mc[i].mask);
    }
    free(m->mc);
    free(m->memo);
    free(m->memo_pool.a);
    free(m->walk_acc.a);
    free(m);
}

/* Runs bytes from state s; the result is left in *res (m->sim_a or
 * sim_b); false if some byte is rejected. */
static bool run_bytes(pt_gmatcher *m, const int32_t *s, int n, const uint8_t *p, size_t len,
                      ivec **res) {
    ivec *a = &m->sim_a, *b = &m->sim_b;
    a->n = 0;
    for (int i = 0; i < n; i++) iv_push(a, s[i]);
    for (size_t i = 0; i < len; i++) {
        step(m, a->a, a->n, p[i], b);
        if (!b->n) return false;
        ivec *t = a;
        a = b;
        b = t;
    }
    *res = a;
    return true;
}

bool pt_gmatcher_accept_bytes(pt_gmatcher *m, const char *s, size_t len) {
    int n;
    const int32_t *st = cur_state(m, &n);
    ivec *res;
    /* hist may move while stepping: copy the state first */
    int32_t small[64], *copy = n <= 64 ? small : pt_xmalloc((size_t)n * sizeof *copy);
    memcpy(copy, st, (size_t)n * sizeof *copy);
    bool ok = run_bytes(m, copy, n, (const uint8_t *)s, len, &res);
    if (copy != small) free(copy);
    if (ok) push_state(m, res);
    return ok;
}

bool pt_gmatcher_accept(pt_gmatcher *m, int32_t id) {
    const pt_gvocab *v = m->v;
    if (id < 0 || id >= v->n_vocab || !v->len[id]) return false;
    return pt_gmatcher_accept_bytes(m, v->blob + v->off[id], v->len[id]);
}

void pt_gmatcher_rollback(pt_gmatcher *m, int n) {
    int keep = m->hist_off.n - 1 - n;
    if (keep < 1) keep = 1;
    m->hist_off.n = keep + 1;
    m->hist.n = m->hist_off.a[keep];
}

int pt_gmatcher_n_steps(const pt_gmatcher *m) { return m->hist_off.n - 2; }

bool pt_gmatcher_is_accepting(const pt_gmatcher *m) {
    int n;
    const int32_t *s = cur_state(m, &n);
    for (int i = 0; i < n; i++)
        if (s[i] == N_ROOT) return true;
    return false;
}

bool pt_gmatcher_is_finished(pt_gmatcher *m) {
    int n;
    const int32_t *s = cur_state(m, &n);
    return n == 1 && s[0] == N_ROOT;
}

/* --- masks ------------------------------------------------------------- */

/* --- the lazy DFA over state sets --------------------------------------- */

static uint64_t ids_hash(const int32_t *a, int n) {
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < n; i++) h = (h ^ (uint32_t)a[i]) * 1099511628211ull;
    return h;
}

static void sort_ids(int32_t *a, int n) { /* sets are small: insertion sort */
    for (int i = 1; i < n; i++) {
        int32_t x = a[i];
        int j = i - 1;
        for (; j >= 0 && a[j] > x; j--) a[j + 1] = a[j];
        a[j + 1] = x;
    }
}

static void dhash_grow(pt_gmatcher *m) {
    uint32_t cap = m->dhcap ? 2 * m->dhcap : 1024;
    int32_t *t = pt_xcalloc(cap, sizeof *t);
    for (int k = 0; k < m->n_dsets; k++) {
        int off = m->doff.a[k], n = m->doff.a[k + 1] - off;
        uint32_t h = (uint32_t)ids_hash(m->dpool.a + off, n) & (cap - 1);
        while (t[h]) h = (h + 1) & (cap - 1);
        t[h] = k + 1;
    }
    free(m->dhash);
    m->dhash = t;
    m->dhcap = cap;
}

/* The index of the set a[0..n) (sorted in place); -1 if empty. */
static int32_t dset(pt_gmatcher *m, int32_t *a, int n) {
    if (!n) return -1;
    sort_ids(a, n);
    if ((uint32_t)m->n_dsets * 2 + 2 >= m->dhcap) dhash_grow(m);
    if (!m->doff.n) iv_push(&m->doff, 0);
    uint32_t h = (uint32_t)ids_hash(a, n) & (m->dhcap - 1);
    for (;; h = (h + 1) & (m->dhcap - 1)) {
        int32_t e = m->dhash[h];
        if (!e) break;
        int off = m->doff.a[e - 1];
        if (m->doff.a[e] - off == n && !memcmp(m->dpool.a + off, a, (size_t)n * sizeof *a)) return e - 1;
    }
    int k = m->n_dsets++;
    bool sent = false;
    for (int i = 0; i < n; i++) {
        iv_push(&m->dpool, a[i]);
        sent |= a[i] == N_SENT;
    }
    iv_push(&m->doff, m->dpool.n);
    if ((k & (k - 1)) == 0) { /* grow per-set arrays at powers of two */
        size_t c = k ? 2 * (size_t)k : 1;
        m->dsent = pt_xrealloc(m->dsent, c);
        m->dtrans = pt_xrealloc(m->dtrans, c * sizeof *m->dtrans);
        m->dfirst = pt_xrealloc(m->dfirst, c * sizeof *m->dfirst);
    }
    pt_byteset *first = &m->dfirst[k];
    memset(first, 0, sizeof *first);
    for (int i = 0; i < n; i++) {
        if (a[i] <= N_SENT) continue;
        const pt_byteset *bs = &m->g->sets[GE_ARG(m->g->code[m->npos[a[i]]])];
        for (int w = 0; w < 8; w++) first->w[w] |= bs->w[w];
    }
    m->dsent[k] = (uint8_t)((sent ? DS_SENT : 0) | (n > (int)sent ? DS_LIVE : 0));
    m->dtrans[k] = NULL;
    m->dhash[h] = k + 1;
    return k;
}

/* The set after byte b from set k (-1: nothing survives), computed the
 * first time. */
static int32_t dstep_slow(pt_gmatcher *m, int32_t k, unsigned b) {
    int32_t *t = m->dtrans[k];
    if (!t) {
        t = m->dtrans[k] = pt_xmalloc(256 * sizeof *t);
        for (int i = 0; i < 256; i++) t[i] = -2;
    }
    int off = m->doff.a[k], n = m->doff.a[k + 1] - off;
    int32_t small[64], *in = n <= 64 ? small : pt_xmalloc((size_t)n * sizeof *in);
    memcpy(in, m->dpool.a + off, (size_t)n * sizeof *in);
    step(m, in, n, b, &m->dtmp);
    if (in != small) free(in);
    int32_t r = dset(m, m->dtmp.a, m->dtmp.n);
    m->dtrans[k][b] = r; /* dset may not move dtrans[k]'s table, only the array */
    return r;
}

static inline int32_t dstep(pt_gmatcher *m, int32_t k, unsigned b) {
    const int32_t *t = m->dtrans[k];
    if (t && t[b] != -2) return t[b];
    return dstep_slow(m, k, b);
}

/* Sets the bits of token id t and of the tokens with the same bytes. */
static void set_tok_all(const pt_gvocab *v, uint32_t *bits, int32_t t) {
    for (; t >= 0; t = v->dup_next[t]) bits[t >> 5] |= 1u << (t & 31);
}

/* The same for a trie node's ttok: dup_next is read only when flagged. */
static inline void set_tok(const pt_gvocab *v, uint32_t *bits, int32_t tt) {
    int32_t t = tt & ~TTOK_DUP;
    bits[t >> 5] |= 1u << (t & 31);
    if (tt & TTOK_DUP) set_tok_all(v, bits, v->dup_next[t]);
}

static void add_subtree_unc(pt_gmatcher *m, ivec *unc, int from, int to) {
    for (int i = from; i < to; i++)
        if (m->v->ttok[i] >= 0) iv_push(unc, m->v->ttok[i] & ~TTOK_DUP);
}

/* --- trie walks, memoized per (set, subtree) ----------------------------
 * A walk lists the tokens below trie node ti that set k accepts (`acc`,
 * trie tokens with their TTOK_DUP flag) and, when `popped` (some shorter
 * prefix ran past the cut), those that depend on what lies below (`unc`).
 * The result depends only on (k, ti, popped), so walks of large subtrees
 * are memoized: many leaves reach the same set after a byte or two (every
 * extra-key node of an object reaches the same string body after one
 * character), and appending a stored list costs far less than walking the
 * 200k-node subtree of string characters again. */

#define MEMO_MIN 256          /* subtrees of fewer nodes are walked */
#define MEMO_POOL_MAX (1 << 22) /* list entries kept per matcher (16 MiB) */

static bool memo_find(pt_gmatcher *m, uint64_t key, struct memo_ent **out) {
    if (!m->memo_cap) {
        m->memo_cap = 1024;
        m->memo = pt_xcalloc(m->memo_cap, sizeof *m->memo);
    }
    uint32_t h = (uint32_t)((key * 0x9E3779B97F4A7C15ull) >> 40) & (m->memo_cap - 1);
    for (;; h = (h + 1) & (m->memo_cap - 1)) {
        struct memo_ent *e = &m->memo[h];
        *out = e;
        if (!e->key) return false;
        if (e->key == key) return true;
    }
}

static void memo_put(pt_gmatcher *m, uint64_t key, const ivec *acc, int a0, const ivec *unc, int u0) {
    int na = acc->n - a0, nu = unc->n - u0;
    if (m->memo_pool.n + na + nu > MEMO_POOL_MAX) return;
    if ((uint32_t)m->memo_n * 2 >= m->memo_cap) { /* grow and rehash */
        struct memo_ent *old = m->memo;
        uint32_t oc = m->memo_cap;
        m->memo_cap *= 2;
        m->memo = pt_xcalloc(m->memo_cap, sizeof *m->memo);
        for (uint32_t i = 0; i < oc; i++) {
            struct memo_ent *e;
            if (old[i].key && !memo_find(m, old[i].key, &e)) *e = old[i];
        }
        free(old);
    }
    struct memo_ent *e;
    if (memo_find(m, key, &e)) return;
    e->key = key;
    e->acc_off = m->memo_pool.n;
    e->acc_n = na;
    for (int i = 0; i < na; i++) iv_push(&m->memo_pool, acc->a[a0 + i]);
    e->unc_off = m->memo_pool.n;
    e->unc_n = nu;
    for (int i = 0; i < nu; i++) iv_push(&m->memo_pool, unc->a[u0 + i]);
    m->memo_n++;
}

static void walk(pt_gmatcher *m, ivec *acc, ivec *unc, int ti, int32_t k, bool popped) {
    const pt_gvocab *v = m->v;
    bool memo = ti > 0 && v->tend[ti] - ti >= MEMO_MIN;
    /* key 0 means empty: sets and nodes are offset by one */
    uint64_t key = ((uint64_t)(k + 1) << 33) | ((uint64_t)ti << 1) | popped;
    if (memo) {
        struct memo_ent *e;
        if (memo_find(m, key, &e)) {
            for (int i = 0; i < e->acc_n; i++) iv_push(acc, m->memo_pool.a[e->acc_off + i]);
            for (int i = 0; i < e->unc_n; i++) iv_push(unc, m->memo_pool.a[e->unc_off + i]);
            return;
        }
    }
    int a0 = acc->n, u0 = unc->n;
    m->n_walked++;
    const int32_t *tend = v->tend, *ttok = v->ttok;
    const uint8_t *tbyte = v->tbyte;
    for (int c = ti + 1, end = tend[ti]; c < end; c = tend[c]) {
        /* (dfirst re-read: dstep may grow it) */
        int32_t t = bs_has(&m->dfirst[k], tbyte[c]) ? dstep(m, k, tbyte[c]) : -1;
        unsigned f = t >= 0 ? m->dsent[t] : 0;
        bool sent = f & DS_SENT, live = f & DS_LIVE;
        int32_t tok = ttok[c];
        if (tok >= 0) {
            if (t >= 0) iv_push(acc, tok);
            else if (popped) iv_push(unc, tok & ~TTOK_DUP);
        }
        bool pp = popped || sent;
        if (live) walk(m, acc, unc, c, t, pp);
        else if (pp) add_subtree_unc(m, unc, c + 1, v->tend[c]);
    }
    if (memo) memo_put(m, key, acc, a0, unc, u0);
}

/* The leaf's stack cut below its PC_DEPTH-th frame, the rest replaced by
 * SENTINEL: the context a classification may look into.  Deep enough to
 * hold a whole JSON string or number (char, loop, closing quote), so only
 * tokens that run past such a value are uncertain. */
#define PC_DEPTH 3

static int32_t truncate_stack(pt_gmatcher *m, int32_t id, int k) {
    if (id <= N_SENT) return id;
    if (k == 0) return N_SENT;
    int32_t below = truncate_stack(m, m->npar[id], k - 1);
    return node_get(m, m->npos[id], below);
}

/* --- the vocabulary-wide cache of classifications ----------------------
 * A classification depends only on the grammar reachable from a truncated
 * stack, so it is keyed by a canonical text of that sub-grammar (rules
 * renumbered in order of discovery): a JSON string's classification is
 * computed once per vocabulary, whichever schema holds the string. */

static void sig_put(pt_gmatcher *m, const void *p, size_t n) {
    if (m->sig_len + n > m->sig_cap) {
        m->sig_cap = (m->sig_len + n) * 2 + 256;
        m->sig = pt_xrealloc(m->sig, m->sig_cap);
    }
    memcpy(m->sig + m->sig_len, p, n);
    m->sig_len += n;
}

static void sig_tail(pt_gmatcher *m, int32_t pos) {
    const pt_grammar *g = m->g;
    for (;; pos++) {
        int32_t e = g->code[pos];
        uint8_t k = (uint8_t)GE_KIND(e);
        sig_put(m, &k, 1);
        if (k == GE_END) return;
        if (k == GE_BYTES) {
            sig_put(m, &g->sets[GE_ARG(e)], sizeof(pt_byteset));
        } else {
            int r = GE_ARG(e);
            if (m->canon[r] < 0) {
                m->canon[r] = m->canon_touched.n;
                iv_push(&m->canon_touched, r);
                iv_push(&m->canon_queue, r);
            }
            sig_put(m, &m->canon[r], sizeof(int32_t));
        }
    }
}

/* Signatures longer than this are not shared: a sub-grammar that large is
 * some schema's own (an object's remaining properties), another schema
 * will not hold it, and writing it out for every leaf under it cost more
 * than the classifications (megabytes per mask on large schemas). */
#define SIG_MAX 4096
#define SHARE_MIN_NODES 2048 /* classifications that walked fewer are not shared */

/* The canonical text of the sub-grammar reachable from truncated stack id
 * in m->sig; false if it would exceed SIG_MAX. */
static bool signature(pt_gmatcher *m, int32_t id) {
    const pt_grammar *g = m->g;
    m->sig_len = 0;
    m->canon_touched.n = m->canon_queue.n = 0;
    int32_t cur = id;
    for (; cur > N_SENT; cur = m->npar[cur]) sig_tail(m, m->npos[cur]);
    uint8_t bottom = cur == N_ROOT ? 'R' : 'S';
    sig_put(m, &bottom, 1);
    for (int q = 0; q < m->canon_queue.n && m->sig_len <= SIG_MAX; q++) {
        int r = m->canon_queue.a[q];
        int32_t na = g->rule_alt[r + 1] - g->rule_alt[r];
        sig_put(m, &na, sizeof na);
        for (int a = g->rule_alt[r]; a < g->rule_alt[r + 1]; a++) sig_tail(m, g->alt_start[a]);
    }
    for (int i = 0; i < m->canon_touched.n; i++) m->canon[m->canon_touched.a[i]] = -1;
    return m->sig_len <= SIG_MAX;
}

static uint64_t sig_hash(const uint8_t *p, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

/* Accepted sets at most this large are kept as lists: most leaves (a key,
 * a literal, a digit) accept a handful of tokens, and ORing a 128k-bit map
 * per leaf into every mask cost more than the rest of the mask. */
#define ACC_LIST_MAX 2048

void pc_entry_free(pc_entry *pc) {
    if (pc->cnt) ctab_free(pc->cnt);
    free(pc->cnt);
    if (!pc->acc_borrowed) free(pc->acc);
    free(pc->acc_ls);
    free(pc->unc);
    free(pc);
}

static pc_entry *classify(pt_gmatcher *m, int32_t t) {
    const pt_gvocab *v = m->v;
    pc_entry *pc = pt_xcalloc(1, sizeof *pc);
    ivec acc = {0}, unc = {0};
    int32_t one = t;
    walk(m, &acc, &unc, 0, dset(m, &one, 1), false);
    if (acc.n > ACC_LIST_MAX) {
        pc->acc = pt_xcalloc((size_t)v->n_words, sizeof *pc->acc);
        for (int i = 0; i < acc.n; i++) set_tok(v, pc->acc, acc.a[i]);
    } else {
        ivec ls = {0};
        for (int i = 0; i < acc.n; i++)
            for (int32_t x = acc.a[i] & ~TTOK_DUP; x >= 0; x = (acc.a[i] & TTOK_DUP) ? v->dup_next[x] : -1)
                iv_push(&ls, x);
        pc->acc_ls = ls.a;
        pc->n_acc_ls = ls.n;
    }
    free(acc.a);
    pc->unc = unc.a;
    pc->n_unc = unc.n;
    return pc;
}

/* --- counted strings -------------------------------------------------
 * A string with maxLength (or a pattern of one repeated class with length
 * bounds) is x{lo,hi}: every count left is a different grammar state, and
 * classifying each by a trie walk cost 5 to 10 ms per position.  But the
 * counted repeat accepts a token exactly when the unbounded x* does and
 * the characters the token puts in the string fit the count: with the
 * stack [leaf in x, return into the repeat with lo..hi left, closing
 * quote r], a token is (the rest of the current character) then k
 * characters then, maybe, the quote and what follows it; it is accepted iff
 * [leaf, return into x*, r] accepts it and k <= hi, and, when it reaches
 * the quote, k >= lo.  So the leaf's unbounded classification (shared
 * through the vocabulary like any string's) is split once by k into a
 * table, and the classification for each count is cut from it.  Counting
 * needs the characters' boundaries: x's alternatives are JSON string
 * characters (the schema compiler marks only those), so a character is a
 * UTF-8 sequence or an escape, and the string ends at a bare quote. */


static void ctab_free(struct ctab *c) {
    free(c->body);
    free(c->body_off);
    if (c->cum)
        for (int k = 0; k <= c->maxk; k++) free(c->cum[k]);
    free(c->cum);
    free(c->q);
    free(c->q_k);
    free(c->q_unc);
}

/* Characters token t starts after its first c0 bytes; *quote: it reaches
 * the string's closing quote (k counts the characters before it). */
static int token_chars(const pt_gvocab *v, int32_t t, int32_t c0, bool *quote) {
    const uint8_t *p = (const uint8_t *)v->blob + v->off[t];
    uint32_t n = v->len[t], i = (uint32_t)c0;
    int k = 0;
    *quote = false;
    while (i < n) {
        uint8_t b = p[i];
        if (b == '"') {
            *quote = true;
            break;
        }
        k++;
        if (b == '\\') i += i + 1 < n && p[i + 1] == 'u' ? 6 : 2;
        else i += b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : b >= 0xC0 ? 2 : 1;
    }
    return k;
}

static pc_entry *pc_get(pt_gmatcher *m, int32_t leaf);

static void ctab_add_q(struct ctab *c, int32_t t, int k, bool unc) {
    if ((c->n_q & (c->n_q - 1)) == 0) {
        size_t cap = c->n_q ? 2 * (size_t)c->n_q : 1;
        c->q = pt_xrealloc(c->q, cap * sizeof *c->q);
        c->q_k = pt_xrealloc(c->q_k, cap * sizeof *c->q_k);
        c->q_unc = pt_xrealloc(c->q_unc, cap);
    }
    c->q[c->n_q] = t;
    c->q_k[c->n_q] = k;
    c->q_unc[c->n_q++] = unc;
}

/* The table of classification e, whose leaf has c0 bytes of its
 * character left. */
static struct ctab *ctab_build(const pt_gvocab *v, const pc_entry *e, int32_t c0) {
    ivec toks = {0}, ks = {0};
    if (e->acc) {
        for (int w = 0; w < v->n_words; w++)
            for (uint32_t bits = e->acc[w]; bits; bits &= bits - 1) iv_push(&toks, w * 32 + __builtin_ctz(bits));
    }
    for (int i = 0; i < e->n_acc_ls; i++) iv_push(&toks, e->acc_ls[i]);
    struct ctab *c = pt_xcalloc(1, sizeof *c);
    int nb = 0;
    for (int i = 0; i < toks.n; i++) {
        bool quote;
        int k = token_chars(v, toks.a[i], c0, &quote);
        if (quote) {
            ctab_add_q(c, toks.a[i], k, false);
            k = -1;
        } else {
            if (k > c->maxk) c->maxk = k;
            nb++;
        }
        iv_push(&ks, k);
    }
    for (int i = 0; i < e->n_unc; i++) {
        bool quote;
        int k = token_chars(v, e->unc[i], c0, &quote);
        ctab_add_q(c, e->unc[i], k, true);
    }
    /* body tokens by k (counting sort) */
    c->body_off = pt_xcalloc((size_t)c->maxk + 2, sizeof *c->body_off);
    for (int i = 0; i < toks.n; i++)
        if (ks.a[i] >= 0) c->body_off[ks.a[i] + 1]++;
    for (int k = 0; k <= c->maxk; k++) c->body_off[k + 1] += c->body_off[k];
    c->body = pt_xmalloc(((size_t)nb + 1) * sizeof *c->body);
    int32_t *fill = pt_xmalloc(((size_t)c->maxk + 1) * sizeof *fill);
    memcpy(fill, c->body_off, ((size_t)c->maxk + 1) * sizeof *fill);
    for (int i = 0; i < toks.n; i++)
        if (ks.a[i] >= 0) c->body[fill[ks.a[i]]++] = toks.a[i];
    free(fill);
    if (nb > ACC_LIST_MAX) { /* cumulative bitmaps: one OR per mask */
        c->cum = pt_xmalloc(((size_t)c->maxk + 1) * sizeof *c->cum);
        for (int k = 0; k <= c->maxk; k++) {
            c->cum[k] = k ? pt_xmalloc((size_t)v->n_words * sizeof **c->cum)
                          : pt_xcalloc((size_t)v->n_words, sizeof **c->cum);
            if (k) memcpy(c->cum[k], c->cum[k - 1], (size_t)v->n_words * sizeof **c->cum);
            for (int j = c->body_off[k]; j < c->body_off[k + 1]; j++)
                c->cum[k][c->body[j] >> 5] |= 1u << (c->body[j] & 31);
        }
    }
    free(toks.a);
    free(ks.a);
    return c;
}

/* The table of unbounded stack u, built once per classification: the
 * unbounded string's is shared through the vocabulary, so is its table. */
static struct ctab *ctab_get(pt_gmatcher *m, int32_t u, int32_t c0) {
    pc_entry *e = pc_get(m, u);
    pt_gvocab *v = (pt_gvocab *)m->v;
    pthread_mutex_lock(&v->mu);
    if (!e->cnt) e->cnt = ctab_build(v, e, c0);
    struct ctab *c = e->cnt;
    pthread_mutex_unlock(&v->mu);
    return c;
}

/* The classification of truncated stack t = [leaf, p, r] when p resumes a
 * counted repeat and r is the closing quote; NULL otherwise. */
static pc_entry *counted_classify(pt_gmatcher *m, int32_t t) {
    const pt_grammar *g = m->g;
    if (m->no_counts || !g->cnt_hi || t <= N_SENT) return NULL;
    int32_t p = m->npar[t];
    if (p <= N_SENT || g->cnt_hi[m->npos[p]] < 0) return NULL;
    int32_t r = m->npar[p];
    if (r <= N_SENT || GE_KIND(g->code[m->npos[r]]) != GE_BYTES) return NULL;
    const pt_byteset *rs = &g->sets[GE_ARG(g->code[m->npos[r]])];
    for (int w = 0; w < 8; w++)
        if (rs->w[w] != (w == ('"' >> 5) ? 1u << ('"' & 31) : 0)) return NULL;
    int32_t pp = m->npos[p], lo = g->cnt_lo[pp], hi = g->cnt_hi[pp];
    int32_t c0 = 0;
    for (int32_t q = m->npos[t]; GE_KIND(g->code[q]) != GE_END; q++) c0++;
    int32_t u = node_get(m, m->npos[t], node_get(m, g->cnt_loop[pp], r));
    struct ctab *c = ctab_get(m, u, c0);
    pc_entry *pc = pt_xcalloc(1, sizeof *pc);
    int hk = hi < c->maxk ? hi : c->maxk;
    ivec acc = {0}, unc = {0};
    if (c->cum) {
        pc->acc = c->cum[hk];
        pc->acc_borrowed = true;
    } else {
        for (int j = 0; j < c->body_off[hk + 1]; j++) iv_push(&acc, c->body[j]);
    }
    for (int i = 0; i < c->n_q; i++) {
        if (c->q_k[i] < lo || c->q_k[i] > hi) continue;
        iv_push(c->q_unc[i] ? &unc : &acc, c->q[i]);
    }
    pc->acc_ls = acc.a;
    pc->n_acc_ls = acc.n;
    pc->unc = unc.a;
    pc->n_unc = unc.n;
    m->n_counted++;
    return pc;
}

long pt_gmatcher_counted(pt_gmatcher *m, bool on) {
    m->no_counts = !on;
    return m->n_counted;
}

static pc_entry *pc_get(pt_gmatcher *m, int32_t leaf) {
    int32_t t = truncate_stack(m, leaf, PC_DEPTH);
    if (t >= m->n_pc) {
        int n = m->n_nodes + 1024;
        m->pc = pt_xrealloc(m->pc, (size_t)n * sizeof *m->pc);
        memset(m->pc + m->n_pc, 0, (size_t)(n - m->n_pc) * sizeof *m->pc);
        m->n_pc = n;
    }
    if (m->pc[t]) return m->pc[t];
    pc_entry *cpc = counted_classify(m, t);
    if (cpc) { /* cut from a table: cheap, and only this matcher's */
        if (m->n_own == m->cap_own) {
            m->cap_own = m->cap_own ? 2 * m->cap_own : 16;
            m->own = pt_xrealloc(m->own, (size_t)m->cap_own * sizeof *m->own);
        }
        m->own[m->n_own++] = cpc;
        if (t >= m->n_pc) { /* node_get above may have added nodes */
            int n = m->n_nodes + 1024;
            m->pc = pt_xrealloc(m->pc, (size_t)n * sizeof *m->pc);
            memset(m->pc + m->n_pc, 0, (size_t)(n - m->n_pc) * sizeof *m->pc);
            m->n_pc = n;
        }
        return m->pc[t] = cpc;
    }
    bool shared = signature(m, t);
    pt_gvocab *v = (pt_gvocab *)m->v; /* the cache is the one mutable part */
    uint64_t h = shared ? sig_hash(m->sig, m->sig_len) : 0;
    pc_entry *pc = shared ? pt_gvocab_cache_get(v, h, m->sig, m->sig_len) : NULL;
    if (!pc) {
        long walked = m->n_walked;
        pc = classify(m, t);
        /* The shared cache holds PT_GVOCAB_CACHE entries: keep them for the
         * classifications that cost a long walk (a string's contents), not
         * for the keys and literals every schema has thousands of (they
         * filled it within the first few thousand MaskBench schemas, after
         * which every schema walked the string contents again). */
        shared &= m->n_walked - walked >= SHARE_MIN_NODES;
        if (!shared || !pt_gvocab_cache_put(v, h, m->sig, m->sig_len, pc)) { /* ours to free */
            if (m->n_own == m->cap_own) {
                m->cap_own = m->cap_own ? 2 * m->cap_own : 16;
                m->own = pt_xrealloc(m->own, (size_t)m->cap_own * sizeof *m->own);
            }
            m->own[m->n_own++] = pc;
        }
    }
    m->pc[t] = pc;
    return pc;
}

static void mask_compute(pt_gmatcher *m, const int32_t *s, int n, uint32_t *mask);

void pt_gmatcher_mask(pt_gmatcher *m, uint32_t *mask) {
    const pt_gvocab *v = m->v;
    int n;
    const int32_t *s0 = cur_state(m, &n);
    int32_t small[64], *s = n <= 64 ? small : pt_xmalloc((size_t)n * sizeof *s);
    memcpy(s, s0, (size_t)n * sizeof *s);
    qsort(s, (size_t)n, sizeof *s, cmp_i32);
    uint64_t key = 1469598103934665603ull;
    for (int i = 0; i < n; i++) key = (key ^ (uint32_t)s[i]) * 1099511628211ull;
    if (!m->mc_cap) {
        m->mc_cap = 2 * MC_MAX;
        m->mc = pt_xcalloc(m->mc_cap, sizeof *m->mc);
    }
    uint32_t h = (uint32_t)(key >> 17) & (m->mc_cap - 1);
    for (;; h = (h + 1) & (m->mc_cap - 1)) {
        struct mcache *e = &m->mc[h];
        if (!e->mask) break;
        if (e->key == key && e->n == n && !memcmp(e->ids, s, (size_t)n * sizeof *s)) {
            memcpy(mask, e->mask, (size_t)v->n_words * sizeof *mask);
            if (s != small) free(s);
            return;
        }
    }
    mask_compute(m, s, n, mask);
    if (m->mc_n < MC_MAX) {
        struct mcache *e = &m->mc[h];
        e->key = key;
        e->n = n;
        e->ids = pt_xmalloc((size_t)n * sizeof *s + 1);
        memcpy(e->ids, s, (size_t)n * sizeof *s);
        e->mask = pt_xmalloc((size_t)v->n_words * sizeof *mask);
        memcpy(e->mask, mask, (size_t)v->n_words * sizeof *mask);
        m->mc_n++;
    }
    if (s != small) free(s);
}

/* Every token accepted from set k (a whole state: no SENTINEL), by a
 * pruned, memoized trie walk: used when too many tokens are uncertain to
 * check one by one. */
static void walk_full(pt_gmatcher *m, uint32_t *mask, int32_t k) {
    ivec unc = {0};
    m->walk_acc.n = 0;
    walk(m, &m->walk_acc, &unc, 0, k, false);
    for (int i = 0; i < m->walk_acc.n; i++) set_tok(m->v, mask, m->walk_acc.a[i]);
    free(unc.a); /* empty: nothing pops without a SENTINEL */
}

static void mask_compute(pt_gmatcher *m, const int32_t *s, int n, uint32_t *mask) {
    const pt_gvocab *v = m->v;
    memset(mask, 0, (size_t)v->n_words * sizeof *mask);
    long n_unc = 0;
    for (int i = 0; i < n; i++)
        if (s[i] > N_SENT) n_unc += pc_get(m, s[i])->n_unc;
    int32_t tmp[64], *cp = n <= 64 ? tmp : pt_xmalloc((size_t)n * sizeof *cp);
    memcpy(cp, s, (size_t)n * sizeof *cp);
    int32_t k0 = dset(m, cp, n);
    if (cp != tmp) free(cp);
    if (n_unc > 1500) {
        walk_full(m, mask, k0);
        return;
    }
    for (int i = 0; i < n; i++) {
        if (s[i] <= N_SENT) continue;
        const pc_entry *pc = pc_get(m, s[i]);
        if (pc->acc)
            for (int w = 0; w < v->n_words; w++) mask[w] |= pc->acc[w];
        for (int j = 0; j < pc->n_acc_ls; j++) mask[pc->acc_ls[j] >> 5] |= 1u << (pc->acc_ls[j] & 31);
    }
    if (++m->tok_gen == 0) {
        memset(m->tok_mark, 0, (size_t)v->n_vocab * sizeof *m->tok_mark);
        m->tok_gen = 1;
    }
    for (int i = 0; i < n; i++) {
        if (s[i] <= N_SENT) continue;
        const pc_entry *pc = pc_get(m, s[i]);
        for (int k = 0; k < pc->n_unc; k++) {
            int32_t t = pc->unc[k];
            if ((mask[t >> 5] >> (t & 31)) & 1 || m->tok_mark[t] == m->tok_gen) continue;
            m->tok_mark[t] = m->tok_gen;
            const uint8_t *p = (const uint8_t *)v->blob + v->off[t];
            int32_t k = k0;
            for (uint32_t j = 0; j < v->len[t] && k >= 0; j++)
                k = bs_has(&m->dfirst[k], p[j]) ? dstep(m, k, p[j]) : -1;
            if (k >= 0) set_tok_all(v, mask, t);
        }
    }
}

long pt_gmatcher_nodes_walked(const pt_gmatcher *m) { return m->n_walked; }

/* --- jump-forward -------------------------------------------------------- */

/* The one byte every stack of state s[0..n) accepts next, or -1 when the
 * state may end here or allows two bytes or more. */
static int forced_byte(const pt_gmatcher *m, const int32_t *s, int n) {
    const pt_grammar *g = m->g;
    pt_byteset u = {{0}};
    for (int i = 0; i < n; i++) {
        if (s[i] <= N_SENT) return -1; /* the text may end: nothing is forced */
        const pt_byteset *b = &g->sets[GE_ARG(g->code[m->npos[s[i]]])];
        for (int w = 0; w < 8; w++) u.w[w] |= b->w[w];
    }
    int byte = -1;
    for (int w = 0; w < 8; w++) {
        if (!u.w[w]) continue;
        if (byte >= 0 || (u.w[w] & (u.w[w] - 1))) return -1;
        byte = w * 32 + __builtin_ctz(u.w[w]);
    }
    return byte;
}

size_t pt_gmatcher_forced_bytes(pt_gmatcher *m, char *out, size_t cap) {
    int n;
    const int32_t *st = cur_state(m, &n);
    ivec *a = &m->sim_a, *b = &m->sim_b;
    a->n = 0;
    for (int i = 0; i < n; i++) iv_push(a, st[i]);
    size_t len = 0;
    for (int c; len < cap && (c = forced_byte(m, a->a, a->n)) >= 0; len++) {
        out[len] = (char)c;
        step(m, a->a, a->n, (unsigned)c, b);
        ivec *t = a;
        a = b;
        b = t;
    }
    return len;
}
