/*
 * regex.c - regular expressions (the subset JSON Schema patterns and
 * `--regex` use) compiled into grammar rules.
 *
 * Supported: literals (UTF-8), . [classes] [^negated] with ranges, \d \w \s
 * \D \W \S \n \t \r \f \v \xHH \uHHHH and escaped punctuation, groups ( )
 * (?: ), alternation, * + ? {n} {n,} {n,m} (lazy suffix ? accepted: it does
 * not change the language), ^ at the start and $ at the end.  Everything
 * else (backreferences, lookaround, \b, \p{...}, anchors in the middle) is
 * an error naming the construct.
 *
 * Characters are code points; a class becomes byte sets over UTF-8.  In
 * JSON-string mode the regex describes the decoded string, so each
 * character is emitted as JSON spells it: `"` as \", `\` as \\, control
 * characters as their escapes.
 */
#include "grammar/grammar_int.h"

#include <stdlib.h>

typedef struct { uint32_t lo, hi; } crange;

typedef struct {
    crange *r;
    int n, cap;
} cclass;

typedef struct {
    gbuild *b;
    const char *s;
    size_t i, n;
    bool json;
    pt_err *err;
    int depth;
    /* the last item parsed: its character atom (-1 if a group) and count */
    int item_atom;
    long item_lo, item_hi;
    int top_alts, top_items; /* at the outermost level */
} rx;

/* Lengths in characters: lo..hi, hi < 0 for unbounded. */
static long len_add(long a, long b) { return a < 0 || b < 0 ? -1 : a + b > 1000000 ? 1000000 : a + b; }
static long len_mul(long a, long q) { /* q < 0: unbounded count */
    if (a == 0) return 0;
    return a < 0 || q < 0 ? -1 : a * q > 1000000 ? 1000000 : a * q;
}

static void cc_add(cclass *c, uint32_t lo, uint32_t hi) {
    if (c->n == c->cap) {
        c->cap = c->cap ? 2 * c->cap : 8;
        c->r = pt_xrealloc(c->r, (size_t)c->cap * sizeof *c->r);
    }
    c->r[c->n++] = (crange){lo, hi};
}

static int cmp_range(const void *a, const void *b) {
    const crange *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

static void cc_normalize(cclass *c) {
    if (!c->n) return;
    qsort(c->r, (size_t)c->n, sizeof *c->r, cmp_range);
    int k = 0;
    for (int i = 1; i < c->n; i++) {
        if (c->r[i].lo <= c->r[k].hi + 1) {
            if (c->r[i].hi > c->r[k].hi) c->r[k].hi = c->r[i].hi;
        } else {
            c->r[++k] = c->r[i];
        }
    }
    c->n = k + 1;
}

static void cc_negate(cclass *c) {
    cc_normalize(c);
    cclass o = {0};
    uint32_t next = 0;
    for (int i = 0; i < c->n; i++) {
        if (c->r[i].lo > next) cc_add(&o, next, c->r[i].lo - 1);
        next = c->r[i].hi + 1;
    }
    if (next <= 0x10FFFF) cc_add(&o, next, 0x10FFFF);
    free(c->r);
    *c = o;
}

static void json_escape_char(gbuild *b, int rule, uint32_t c) {
    static const char *const named[] = {['\b'] = "\\b", ['\f'] = "\\f", ['\n'] = "\\n",
                                        ['\r'] = "\\r", ['\t'] = "\\t"};
    char buf[8];
    if (c == '"') strcpy(buf, "\\\"");
    else if (c == '\\') strcpy(buf, "\\\\");
    else if (c < sizeof named / sizeof *named && named[c]) strcpy(buf, named[c]);
    else snprintf(buf, sizeof buf, "\\u%04x", (unsigned)c);
    gseq s = {0};
    seq_lit(b, &s, buf, strlen(buf));
    gb_alt(b, rule, &s);
}

/* A rule matching one character of the class. */
static int cc_rule(gbuild *b, cclass *c, bool json) {
    cc_normalize(c);
    int rule = gb_rule(b);
    pt_byteset ascii = {{0}};
    bool any_ascii = false;
    for (int i = 0; i < c->n; i++) {
        uint32_t lo = c->r[i].lo, hi = c->r[i].hi;
        for (uint32_t x = lo; x <= hi && x < 0x80; x++) {
            if (json && (x == '"' || x == '\\' || x < 0x20)) {
                json_escape_char(b, rule, x);
            } else {
                bs_add(&ascii, x);
                any_ascii = true;
            }
        }
        if (hi >= 0x80) gb_utf8_range(b, rule, lo < 0x80 ? 0x80 : lo, hi);
    }
    if (any_ascii) {
        gseq s = {0};
        seq_bytes(b, &s, &ascii);
        gb_alt(b, rule, &s);
    }
    free(c->r);
    c->r = NULL;
    c->n = c->cap = 0;
    return rule;
}

static int hexval(int ch) {
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
    return -1;
}

/* Decodes one UTF-8 character of the source. */
static uint32_t rx_utf8(rx *r) {
    const uint8_t *p = (const uint8_t *)r->s + r->i;
    uint32_t c = p[0];
    int n = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    if (r->i + (size_t)n > r->n) n = 1;
    if (n == 2) c &= 0x1F;
    else if (n == 3) c &= 0x0F;
    else if (n == 4) c &= 0x07;
    for (int k = 1; k < n; k++) c = (c << 6) | (p[k] & 0x3F);
    r->i += (size_t)n;
    return c;
}

static void cc_digit(cclass *c) { cc_add(c, '0', '9'); }
static void cc_word(cclass *c) {
    cc_add(c, '0', '9');
    cc_add(c, 'A', 'Z');
    cc_add(c, 'a', 'z');
    cc_add(c, '_', '_');
}
static void cc_space(cclass *c) {
    cc_add(c, '\t', '\r'); /* \t \n \v \f \r */
    cc_add(c, ' ', ' ');
}

/* After a backslash: adds the escape's characters to c; returns -1 on an
 * unsupported escape. */
static int rx_escape(rx *r, cclass *c) {
    if (r->i >= r->n) return pt_fail(r->err, "regex ends with a backslash");
    char e = r->s[r->i++];
    cclass tmp = {0};
    switch (e) {
    case 'd': cc_digit(c); return 0;
    case 'w': cc_word(c); return 0;
    case 's': cc_space(c); return 0;
    case 'D': cc_digit(&tmp); break;
    case 'W': cc_word(&tmp); break;
    case 'S': cc_space(&tmp); break;
    case 'n': cc_add(c, '\n', '\n'); return 0;
    case 't': cc_add(c, '\t', '\t'); return 0;
    case 'r': cc_add(c, '\r', '\r'); return 0;
    case 'f': cc_add(c, '\f', '\f'); return 0;
    case 'v': cc_add(c, '\v', '\v'); return 0;
    case '0': cc_add(c, 0, 0); return 0;
    case 'x':
    case 'u': {
        int nd = e == 'x' ? 2 : 4;
        uint32_t v = 0;
        if (r->i < r->n && r->s[r->i] == '{') return pt_fail(r->err, "regex escape \\%c{...} is not supported", e);
        for (int k = 0; k < nd; k++) {
            int h = r->i < r->n ? hexval((unsigned char)r->s[r->i]) : -1;
            if (h < 0) return pt_fail(r->err, "regex escape \\%c needs %d hex digits", e, nd);
            v = v * 16 + (uint32_t)h;
            r->i++;
        }
        cc_add(c, v, v);
        return 0;
    }
    default:
        if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z') || (e >= '1' && e <= '9'))
            return pt_fail(r->err, "regex escape \\%c is not supported", e);
        cc_add(c, (unsigned char)e, (unsigned char)e);
        return 0;
    }
    cc_negate(&tmp);
    for (int i = 0; i < tmp.n; i++) cc_add(c, tmp.r[i].lo, tmp.r[i].hi);
    free(tmp.r);
    return 0;
}

static int rx_class(rx *r, cclass *c) {
    bool neg = r->i < r->n && r->s[r->i] == '^';
    if (neg) r->i++;
    bool first = true;
    for (;;) {
        if (r->i >= r->n) return pt_fail(r->err, "regex class [ is not closed");
        char ch = r->s[r->i];
        if (ch == ']' && !first) {
            r->i++;
            break;
        }
        first = false;
        uint32_t lo;
        if (ch == '[' && r->i + 1 < r->n && r->s[r->i + 1] == ':')
            return pt_fail(r->err, "regex POSIX classes [:name:] are not supported");
        if (ch == '\\') {
            r->i++;
            cclass e = {0};
            if (rx_escape(r, &e) < 0) return -1;
            if (e.n != 1 || e.r[0].lo != e.r[0].hi) { /* \d etc: not a range end */
                for (int i = 0; i < e.n; i++) cc_add(c, e.r[i].lo, e.r[i].hi);
                free(e.r);
                continue;
            }
            lo = e.r[0].lo;
            free(e.r);
        } else {
            lo = rx_utf8(r);
        }
        uint32_t hi = lo;
        if (r->i + 1 < r->n && r->s[r->i] == '-' && r->s[r->i + 1] != ']') {
            r->i++;
            if (r->s[r->i] == '\\') {
                r->i++;
                cclass e = {0};
                if (rx_escape(r, &e) < 0) return -1;
                if (e.n != 1 || e.r[0].lo != e.r[0].hi) {
                    free(e.r);
                    return pt_fail(r->err, "regex class range ends in a class escape");
                }
                hi = e.r[0].lo;
                free(e.r);
            } else {
                hi = rx_utf8(r);
            }
            if (hi < lo) return pt_fail(r->err, "regex class range is reversed");
        }
        cc_add(c, lo, hi);
    }
    if (neg) cc_negate(c);
    return 0;
}

static int rx_alt(rx *r, int *rule, long *lo, long *hi);

static int rx_number(rx *r, long *v) {
    if (r->i >= r->n || r->s[r->i] < '0' || r->s[r->i] > '9') return -1;
    long x = 0;
    while (r->i < r->n && r->s[r->i] >= '0' && r->s[r->i] <= '9') {
        x = x * 10 + (r->s[r->i++] - '0');
        if (x > 1000000) x = 1000000;
    }
    *v = x;
    return 0;
}

/* One atom with its quantifier, appended to seq; *len_lo..*len_hi its
 * length in characters. */
static int rx_item(rx *r, gseq *seq, long *len_lo, long *len_hi) {
    gbuild *b = r->b;
    char ch = r->s[r->i];
    int atom;
    long alo = 1, ahi = 1; /* the atom's length: one character unless a group */
    bool is_char = ch != '(';
    cclass c = {0};
    if (ch == '(') {
        r->i++;
        if (r->i < r->n && r->s[r->i] == '?') {
            if (r->i + 1 < r->n && r->s[r->i + 1] == ':') r->i += 2;
            else return pt_fail(r->err, "regex group (?%c is not supported", r->i + 1 < r->n ? r->s[r->i + 1] : ' ');
        }
        if (rx_alt(r, &atom, &alo, &ahi) < 0) return -1;
        if (r->i >= r->n || r->s[r->i] != ')') return pt_fail(r->err, "regex group ( is not closed");
        r->i++;
    } else if (ch == '[') {
        r->i++;
        if (rx_class(r, &c) < 0) {
            free(c.r);
            return -1;
        }
        atom = cc_rule(b, &c, r->json);
    } else if (ch == '.') {
        r->i++;
        cc_add(&c, '\n', '\n');
        cc_negate(&c);
        atom = cc_rule(b, &c, r->json);
    } else if (ch == '\\') {
        r->i++;
        if (rx_escape(r, &c) < 0) {
            free(c.r);
            return -1;
        }
        atom = cc_rule(b, &c, r->json);
    } else if (ch == '*' || ch == '+' || ch == '?' || ch == '{') {
        return pt_fail(r->err, "regex quantifier '%c' has nothing to repeat", ch);
    } else if (ch == '^' || ch == '$') {
        return pt_fail(r->err, "regex anchor '%c' is only supported at the start/end", ch);
    } else {
        uint32_t u = rx_utf8(r);
        cc_add(&c, u, u);
        atom = cc_rule(b, &c, r->json);
    }
    long lo = 1, hi = 1;
    if (r->i < r->n) {
        ch = r->s[r->i];
        if (ch == '*') lo = 0, hi = -1, r->i++;
        else if (ch == '+') lo = 1, hi = -1, r->i++;
        else if (ch == '?') lo = 0, hi = 1, r->i++;
        else if (ch == '{') {
            size_t save = r->i++;
            if (rx_number(r, &lo) < 0) { /* a literal brace */
                r->i = save;
                lo = hi = 1;
                goto done;
            }
            hi = lo;
            if (r->i < r->n && r->s[r->i] == ',') {
                r->i++;
                if (rx_number(r, &hi) < 0) hi = -1;
            }
            if (r->i >= r->n || r->s[r->i] != '}') return pt_fail(r->err, "regex {m,n} is not closed");
            r->i++;
        }
        if ((lo != 1 || hi != 1) && r->i < r->n) {
            if (r->s[r->i] == '?') r->i++;
            else if (r->s[r->i] == '+') return pt_fail(r->err, "regex possessive quantifiers are not supported");
        }
    }
done:
    r->item_atom = is_char ? atom : -1;
    r->item_lo = lo;
    r->item_hi = hi;
    *len_lo = len_mul(alo, lo);
    *len_hi = len_mul(ahi, hi);
    if (lo != 1 || hi != 1) {
        atom = gb_repeat(b, atom, lo, hi, r->err);
        if (atom < 0) return -1;
    }
    seq_ref(seq, atom);
    return 0;
}

/* Alternatives; *lo..*hi the length range of what they match. */
static int rx_alt(rx *r, int *rule, long *lo, long *hi) {
    if (++r->depth > 200) return pt_fail(r->err, "regex nests too deeply");
    int R = gb_rule(r->b);
    *lo = -1; /* none yet */
    *hi = 0;
    for (;;) {
        gseq s = {0};
        long slo = 0, shi = 0;
        while (r->i < r->n && r->s[r->i] != '|' && r->s[r->i] != ')') {
            if (r->s[r->i] == '$' && r->i + 1 == r->n) break;
            long ilo = 0, ihi = 0;
            if (rx_item(r, &s, &ilo, &ihi) < 0) {
                seq_free(&s);
                return -1;
            }
            slo = len_add(slo, ilo);
            shi = len_add(shi, ihi);
            if (r->depth == 1) r->top_items++;
        }
        if (r->depth == 1) r->top_alts++;
        if (*lo < 0 || slo < *lo) *lo = slo;
        if (*hi >= 0 && (shi < 0 || shi > *hi)) *hi = shi;
        gb_alt(r->b, R, &s);
        if (r->i < r->n && r->s[r->i] == '|') {
            r->i++;
            continue;
        }
        break;
    }
    r->depth--;
    *rule = R;
    return 0;
}

int pt_regex_rule(gbuild *b, const char *re, bool json, bool force_anchored, int *rule, pt_err *err) {
    return pt_regex_rule_len(b, re, json, force_anchored, 0, -1, rule, err);
}

int pt_regex_rule_len(gbuild *b, const char *re, bool json, bool force_anchored, long min_len,
                      long max_len, int *rule, pt_err *err) {
    rx r = {.b = b, .s = re, .n = strlen(re), .json = json, .err = err};
    bool start = false, end = false;
    if (r.n && re[0] == '^') start = true, r.i = 1;
    if (r.n > r.i && re[r.n - 1] == '$' && (r.n < 2 || re[r.n - 2] != '\\')) end = true;
    int body;
    long lo, hi;
    if (rx_alt(&r, &body, &lo, &hi) < 0) return -1;
    if (end) r.i++;
    if (r.i != r.n) return pt_fail(err, "regex has an unmatched ')' at offset %zu", r.i);
    if (force_anchored) start = end = true;
    if (!start || !end) hi = -1; /* a search: anything may surround the match */
    bool bounded = min_len > 0 || max_len >= 0;
    if (bounded && !(lo >= min_len && (max_len < 0 || (hi >= 0 && hi <= max_len)))) {
        /* The bounds matter.  One character class repeated (^[a-z]+$) takes
         * them as its count; anything else would need the regex's automaton
         * crossed with a counter. */
        if (!(start && end && r.top_alts == 1 && r.top_items == 1 && r.item_atom >= 0))
            return pt_fail(err, "\"pattern\" together with minLength/maxLength is not supported "
                                "(unless the pattern is one repeated character class)");
        long qlo = r.item_lo > min_len ? r.item_lo : min_len, qhi = r.item_hi;
        if (max_len >= 0 && (qhi < 0 || max_len < qhi)) qhi = max_len;
        if (qhi >= 0 && qhi < qlo) return pt_fail(err, "no string matches \"pattern\" within minLength/maxLength");
        /* in a JSON string the repeat ends at the closing quote: counted */
        body = json ? gb_repeat_counted(b, r.item_atom, qlo, qhi, gb_star(b, r.item_atom), err)
                    : gb_repeat(b, r.item_atom, qlo, qhi, err);
        if (body < 0) return -1;
    }
    gseq s = {0};
    int any = -1;
    if (!start || !end) { /* JSON Schema patterns search: .* around them */
        cclass c = {0};
        cc_add(&c, 0, 0x10FFFF);
        any = gb_star(b, cc_rule(b, &c, json));
    }
    if (!start) seq_ref(&s, any);
    seq_ref(&s, body);
    if (!end) seq_ref(&s, any);
    *rule = gb_rule_of(b, &s);
    return 0;
}

int pt_grammar_from_regex(pt_grammar **out, const char *re, pt_err *err) {
    gbuild b;
    gb_init(&b);
    int rule;
    int rc = pt_regex_rule(&b, re, false, true, &rule, err);
    if (rc == 0) rc = gb_finish(&b, rule, out, err);
    gb_free(&b);
    return rc;
}
