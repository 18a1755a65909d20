/*
 * grammar.c - the rule builder the front ends share, and the checks that
 * turn its rules into a compiled pt_grammar (grammar_int.h).
 *
 * The checks are what let the matcher stay simple: every rule must derive
 * some finite string (alternatives that cannot are dropped, so a live state
 * can always finish), and no rule may reach itself without consuming a
 * byte (left recursion would make the stack closure loop).
 */
#include "grammar/grammar_int.h"

#include <stdlib.h>

void seq_push(gseq *s, int32_t e) {
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 8;
        s->e = pt_xrealloc(s->e, (size_t)s->cap * sizeof *s->e);
    }
    s->e[s->n++] = e;
}

void seq_cat(gseq *s, const gseq *t) {
    for (int i = 0; i < t->n; i++) seq_push(s, t->e[i]);
}

void seq_free(gseq *s) {
    free(s->e);
    memset(s, 0, sizeof *s);
}

void gb_init(gbuild *b) {
    memset(b, 0, sizeof *b);
    for (int i = 0; i < 256; i++) b->byte_set[i] = -1;
}

void gb_free(gbuild *b) {
    for (int r = 0; r < b->n_rules; r++) {
        for (int a = 0; a < b->n_alts[r]; a++) seq_free(&b->alts[r][a]);
        free(b->alts[r]);
    }
    free(b->alts);
    free(b->n_alts);
    free(b->cap_alts);
    free(b->sets);
    free(b->counts);
    memset(b, 0, sizeof *b);
}

int gb_rule(gbuild *b) {
    if (b->n_rules == b->cap_rules) {
        b->cap_rules = b->cap_rules ? 2 * b->cap_rules : 64;
        b->alts = pt_xrealloc(b->alts, (size_t)b->cap_rules * sizeof *b->alts);
        b->n_alts = pt_xrealloc(b->n_alts, (size_t)b->cap_rules * sizeof *b->n_alts);
        b->cap_alts = pt_xrealloc(b->cap_alts, (size_t)b->cap_rules * sizeof *b->cap_alts);
    }
    int r = b->n_rules++;
    b->alts[r] = NULL;
    b->n_alts[r] = b->cap_alts[r] = 0;
    return r;
}

void gb_alt(gbuild *b, int r, gseq *s) {
    if (b->n_alts[r] == b->cap_alts[r]) {
        b->cap_alts[r] = b->cap_alts[r] ? 2 * b->cap_alts[r] : 2;
        b->alts[r] = pt_xrealloc(b->alts[r], (size_t)b->cap_alts[r] * sizeof(gseq));
    }
    b->alts[r][b->n_alts[r]++] = *s;
    memset(s, 0, sizeof *s);
}

int gb_set(gbuild *b, const pt_byteset *s) {
    /* Sets repeat a lot (one per literal byte); a linear scan of the few
     * distinct ones is cheap next to everything else a compile does. */
    for (int i = 0; i < b->n_sets; i++)
        if (!memcmp(&b->sets[i], s, sizeof *s)) return i;
    if (b->n_sets == b->cap_sets) {
        b->cap_sets = b->cap_sets ? 2 * b->cap_sets : 64;
        b->sets = pt_xrealloc(b->sets, (size_t)b->cap_sets * sizeof *b->sets);
    }
    b->sets[b->n_sets] = *s;
    return b->n_sets++;
}

void seq_byte(gbuild *b, gseq *s, unsigned byte) {
    if (b->byte_set[byte] < 0) {
        pt_byteset one = {{0}};
        bs_add(&one, byte);
        b->byte_set[byte] = gb_set(b, &one);
    }
    seq_push(s, GE_MAKE(GE_BYTES, b->byte_set[byte]));
}

void seq_lit(gbuild *b, gseq *s, const char *lit, size_t len) {
    for (size_t i = 0; i < len; i++) seq_byte(b, s, (unsigned char)lit[i]);
}

void seq_bytes(gbuild *b, gseq *s, const pt_byteset *set) {
    seq_push(s, GE_MAKE(GE_BYTES, gb_set(b, set)));
}

int gb_rule_of(gbuild *b, gseq *s) {
    int r = gb_rule(b);
    gb_alt(b, r, s);
    return r;
}

int gb_lit_rule(gbuild *b, const char *lit) {
    gseq s = {0};
    seq_lit(b, &s, lit, strlen(lit));
    return gb_rule_of(b, &s);
}

int gb_star(gbuild *b, int x) {
    int r = gb_rule(b);
    gseq s = {0}, e = {0};
    seq_ref(&s, x);
    seq_ref(&s, r); /* right recursion: the matcher's tail calls keep it flat */
    gb_alt(b, r, &s);
    gb_alt(b, r, &e);
    return r;
}

int gb_opt(gbuild *b, int x) {
    int r = gb_rule(b);
    gseq s = {0}, e = {0};
    seq_ref(&s, x);
    gb_alt(b, r, &s);
    gb_alt(b, r, &e);
    return r;
}

int gb_repeat(gbuild *b, int x, long lo, long hi, pt_err *err) {
    if (lo < 0 || (hi >= 0 && hi < lo))
        return pt_fail(err, "repetition {%ld,%ld} is empty", lo, hi);
    if (lo > GB_MAX_REPEAT || (hi >= 0 && hi - lo > GB_MAX_REPEAT))
        return pt_fail(err, "repetition bound %ld is too large (at most %d)", hi >= 0 ? hi : lo,
                       GB_MAX_REPEAT);
    gseq s = {0};
    for (long i = 0; i < lo; i++) seq_ref(&s, x);
    if (hi < 0) {
        seq_ref(&s, gb_star(b, x));
    } else if (hi > lo) {
        /* O_1 ::= x | e;  O_k ::= x O_(k-1) | e: linear in hi - lo. */
        int o = gb_opt(b, x);
        for (long k = 2; k <= hi - lo; k++) {
            int r = gb_rule(b);
            gseq a = {0}, e = {0};
            seq_ref(&a, x);
            seq_ref(&a, o);
            gb_alt(b, r, &a);
            gb_alt(b, r, &e);
            o = r;
        }
        seq_ref(&s, o);
    }
    return gb_rule_of(b, &s);
}

int gb_repeat_counted(gbuild *b, int x, long lo, long hi, int star, pt_err *err) {
    int r = gb_repeat(b, x, lo, hi, err);
    if (r < 0 || hi < 0) return r; /* unbounded: one state already */
    if (b->n_counts == b->cap_counts) {
        b->cap_counts = b->cap_counts ? 2 * b->cap_counts : 8;
        b->counts = pt_xrealloc(b->counts, (size_t)b->cap_counts * sizeof *b->counts);
    }
    b->counts[b->n_counts++] = (struct gcount){r, x, star, lo, hi};
    return r;
}

/* --- UTF-8 ranges ------------------------------------------------------ */

static int utf8_encode(uint32_t c, uint8_t *o) {
    if (c < 0x80) { o[0] = (uint8_t)c; return 1; }
    if (c < 0x800) { o[0] = 0xC0 | (c >> 6); o[1] = 0x80 | (c & 63); return 2; }
    if (c < 0x10000) {
        o[0] = 0xE0 | (c >> 12); o[1] = 0x80 | ((c >> 6) & 63); o[2] = 0x80 | (c & 63);
        return 3;
    }
    o[0] = 0xF0 | (c >> 18); o[1] = 0x80 | ((c >> 12) & 63);
    o[2] = 0x80 | ((c >> 6) & 63); o[3] = 0x80 | (c & 63);
    return 4;
}

/* Alternatives for byte strings of length n between lo and hi (inclusive,
 * same length, continuation bytes in 80..BF), after the fixed prefix. */
static void utf8_span(gbuild *b, int rule, const gseq *prefix, const uint8_t *lo,
                      const uint8_t *hi, int n) {
    gseq s = {0};
    seq_cat(&s, prefix);
    pt_byteset set = {{0}};
    if (n == 1) {
        bs_range(&set, lo[0], hi[0]);
        seq_bytes(b, &s, &set);
        gb_alt(b, rule, &s);
        return;
    }
    if (lo[0] == hi[0]) {
        seq_byte(b, &s, lo[0]);
        utf8_span(b, rule, &s, lo + 1, hi + 1, n - 1);
        seq_free(&s);
        return;
    }
    uint8_t top[4] = {0xBF, 0xBF, 0xBF, 0xBF}, bot[4] = {0x80, 0x80, 0x80, 0x80};
    bool lo_full = !memcmp(lo + 1, bot, (size_t)n - 1), hi_full = !memcmp(hi + 1, top, (size_t)n - 1);
    int mid_lo = lo[0] + !lo_full, mid_hi = hi[0] - !hi_full;
    if (!lo_full) {
        gseq p = {0};
        seq_cat(&p, prefix);
        seq_byte(b, &p, lo[0]);
        utf8_span(b, rule, &p, lo + 1, top, n - 1);
        seq_free(&p);
    }
    if (mid_lo <= mid_hi) {
        bs_range(&set, (unsigned)mid_lo, (unsigned)mid_hi);
        seq_bytes(b, &s, &set);
        pt_byteset cont = {{0}};
        bs_range(&cont, 0x80, 0xBF);
        for (int i = 1; i < n; i++) seq_bytes(b, &s, &cont);
        gb_alt(b, rule, &s);
    }
    if (!hi_full) {
        gseq p = {0};
        seq_cat(&p, prefix);
        seq_byte(b, &p, hi[0]);
        utf8_span(b, rule, &p, bot, hi + 1, n - 1);
        seq_free(&p);
    }
    seq_free(&s);
}

void gb_utf8_range(gbuild *b, int rule, uint32_t lo, uint32_t hi) {
    static const uint32_t lim[4] = {0x7F, 0x7FF, 0xFFFF, 0x10FFFF};
    gseq none = {0};
    uint32_t from = lo;
    for (int k = 0; k < 4 && from <= hi; k++) {
        if (from > lim[k]) continue;
        uint32_t to = hi < lim[k] ? hi : lim[k];
        uint8_t a[4], z[4];
        int n = utf8_encode(from, a);
        utf8_encode(to, z);
        utf8_span(b, rule, &none, a, z, n);
        from = to + 1;
    }
}

/* --- finishing --------------------------------------------------------- */

/* Marks rules that derive some finite string (fixpoint). */
static void find_productive(const gbuild *b, bool *prod) {
    bool changed = true;
    while (changed) {
        changed = false;
        for (int r = 0; r < b->n_rules; r++) {
            if (prod[r]) continue;
            for (int a = 0; a < b->n_alts[r] && !prod[r]; a++) {
                const gseq *s = &b->alts[r][a];
                bool ok = true;
                for (int i = 0; i < s->n && ok; i++)
                    if (GE_KIND(s->e[i]) == GE_RULE && !prod[GE_ARG(s->e[i])]) ok = false;
                if (ok) prod[r] = changed = true;
            }
        }
    }
}

static void find_nullable(const gbuild *b, bool *null) {
    bool changed = true;
    while (changed) {
        changed = false;
        for (int r = 0; r < b->n_rules; r++) {
            if (null[r]) continue;
            for (int a = 0; a < b->n_alts[r] && !null[r]; a++) {
                const gseq *s = &b->alts[r][a];
                bool ok = true;
                for (int i = 0; i < s->n && ok; i++)
                    if (GE_KIND(s->e[i]) != GE_RULE || !null[GE_ARG(s->e[i])]) ok = false;
                if (ok) null[r] = changed = true;
            }
        }
    }
}

/* Depth-first search over "r can start with s" edges; color 1 = on the
 * path, 2 = done. */
static bool left_cycle(const gbuild *b, const bool *null, int r, uint8_t *color) {
    if (color[r] == 1) return true;
    if (color[r] == 2) return false;
    color[r] = 1;
    for (int a = 0; a < b->n_alts[r]; a++) {
        const gseq *s = &b->alts[r][a];
        for (int i = 0; i < s->n; i++) {
            if (GE_KIND(s->e[i]) != GE_RULE) break;
            int t = GE_ARG(s->e[i]);
            if (left_cycle(b, null, t, color)) return true;
            if (!null[t]) break;
        }
    }
    color[r] = 2;
    return false;
}

static bool is_ref(const pt_grammar *g, int32_t pos, int rule) {
    return GE_KIND(g->code[pos]) == GE_RULE && GE_ARG(g->code[pos]) == rule;
}

static void set_count(pt_grammar *g, int32_t pos, long lo, long hi, int32_t loop) {
    if (!g->cnt_hi) {
        g->cnt_lo = pt_xmalloc(((size_t)g->n_code + 1) * sizeof *g->cnt_lo);
        g->cnt_hi = pt_xmalloc(((size_t)g->n_code + 1) * sizeof *g->cnt_hi);
        g->cnt_loop = pt_xmalloc(((size_t)g->n_code + 1) * sizeof *g->cnt_loop);
        for (int i = 0; i <= g->n_code; i++) g->cnt_lo[i] = g->cnt_hi[i] = g->cnt_loop[i] = -1;
    }
    g->cnt_lo[pos] = (int32_t)(lo > 0 ? lo : 0);
    g->cnt_hi[pos] = (int32_t)hi;
    g->cnt_loop[pos] = loop;
}

/* Marks the points where counted repeat c resumes after a character,
 * with the characters left there (gb_repeat's shape: R ::= x^lo O_(hi-lo),
 * O_k ::= x O_(k-1) | e, O_1 ::= x | e).  Anything not of that shape (an
 * alternative pruned, x not flat bytes) is left unmarked: its masks are
 * then computed the slow way, which is always right. */
static void mark_count(pt_grammar *g, const struct gcount *c) {
    int32_t s0 = g->rule_alt[c->star];
    if (g->rule_alt[c->star + 1] - s0 != 2 || !is_ref(g, g->alt_start[s0], c->x) ||
        !is_ref(g, g->alt_start[s0] + 1, c->star))
        return;
    int32_t loop = g->alt_start[s0] + 1;
    for (int a = g->rule_alt[c->x]; a < g->rule_alt[c->x + 1]; a++) {
        int32_t p = g->alt_start[a];
        if (GE_KIND(g->code[p]) == GE_END) return; /* x matches the empty text */
        for (; GE_KIND(g->code[p]) != GE_END; p++)
            if (GE_KIND(g->code[p]) != GE_BYTES) return;
    }
    if (g->rule_alt[c->rule + 1] - g->rule_alt[c->rule] != 1) return;
    int32_t a0 = g->alt_start[g->rule_alt[c->rule]];
    for (long i = 0; i < c->lo; i++)
        if (!is_ref(g, a0 + (int32_t)i, c->x)) return;
    int32_t tail = a0 + (int32_t)c->lo; /* O_(hi-lo), or the end */
    if (c->hi > c->lo ? GE_KIND(g->code[tail]) != GE_RULE : GE_KIND(g->code[tail]) != GE_END) return;
    for (long i = 1; i <= c->lo; i++) set_count(g, a0 + (int32_t)i, c->lo - i, c->hi - i, loop);
    if (c->hi == c->lo) return;
    int o = GE_ARG(g->code[tail]);
    for (long k = c->hi - c->lo; k >= 1; k--) {
        if (g->rule_alt[o + 1] - g->rule_alt[o] != 2) return;
        int32_t s = g->alt_start[g->rule_alt[o]];
        if (!is_ref(g, s, c->x)) return;
        if (k == 1 ? GE_KIND(g->code[s + 1]) != GE_END : GE_KIND(g->code[s + 1]) != GE_RULE) return;
        set_count(g, s + 1, 0, k - 1, loop);
        if (k > 1) o = GE_ARG(g->code[s + 1]);
    }
}

int gb_finish(gbuild *b, int root, pt_grammar **out, pt_err *err) {
    *out = NULL;
    int n = b->n_rules;
    bool *prod = pt_xcalloc((size_t)n, 1), *null = pt_xcalloc((size_t)n, 1);
    uint8_t *color = pt_xcalloc((size_t)n, 1);
    int rc = 0;
    find_productive(b, prod);
    if (!prod[root]) {
        rc = pt_fail(err, "the grammar matches no finite text");
        goto done;
    }
    /* Drop alternatives that reference rules deriving nothing. */
    for (int r = 0; r < n; r++) {
        int k = 0;
        for (int a = 0; a < b->n_alts[r]; a++) {
            gseq *s = &b->alts[r][a];
            bool ok = true;
            for (int i = 0; i < s->n && ok; i++)
                if (GE_KIND(s->e[i]) == GE_RULE && !prod[GE_ARG(s->e[i])]) ok = false;
            if (ok) b->alts[r][k++] = *s;
            else seq_free(s);
        }
        b->n_alts[r] = k;
    }
    find_nullable(b, null);
    for (int r = 0; r < n; r++) {
        if (left_cycle(b, null, r, color)) {
            rc = pt_fail(err, "the grammar is left-recursive (a rule can reach itself "
                              "without reading a byte)");
            goto done;
        }
    }
    pt_grammar *g = pt_xcalloc(1, sizeof *g);
    size_t n_alts = 0, n_code = 0;
    for (int r = 0; r < n; r++) {
        n_alts += (size_t)b->n_alts[r];
        for (int a = 0; a < b->n_alts[r]; a++) n_code += (size_t)b->alts[r][a].n + 1;
    }
    g->code = pt_xmalloc((n_code + 1) * sizeof *g->code);
    g->alt_start = pt_xmalloc((n_alts + 1) * sizeof *g->alt_start);
    g->rule_alt = pt_xmalloc(((size_t)n + 1) * sizeof *g->rule_alt);
    int ac = 0, cc = 0;
    for (int r = 0; r < n; r++) {
        g->rule_alt[r] = ac;
        for (int a = 0; a < b->n_alts[r]; a++) {
            g->alt_start[ac++] = cc;
            const gseq *s = &b->alts[r][a];
            for (int i = 0; i < s->n; i++) g->code[cc++] = s->e[i];
            g->code[cc++] = GE_MAKE(GE_END, 0);
        }
    }
    g->rule_alt[n] = ac;
    g->code[cc] = GE_MAKE(GE_END, 0);
    g->n_code = cc;
    g->n_rules = n;
    g->root = root;
    g->n_sets = b->n_sets;
    g->sets = pt_xmalloc(((size_t)b->n_sets + 1) * sizeof *g->sets);
    if (b->n_sets) memcpy(g->sets, b->sets, (size_t)b->n_sets * sizeof *g->sets);
    for (int i = 0; i < b->n_counts; i++) mark_count(g, &b->counts[i]);
    *out = g;
done:
    free(prod);
    free(null);
    free(color);
    return rc;
}

void pt_grammar_free(pt_grammar *g) {
    if (!g) return;
    free(g->sets);
    free(g->code);
    free(g->alt_start);
    free(g->rule_alt);
    free(g->cnt_lo);
    free(g->cnt_hi);
    free(g->cnt_loop);
    free(g);
}

int pt_grammar_n_rules(const pt_grammar *g) { return g->n_rules; }
