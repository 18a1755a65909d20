/*
 * gbnf.c - GBNF-style grammar text (llama.cpp's format) -> rules.
 *
 *     root  ::= "{" ws item ("," ws item)* "}"   # comment
 *     item  ::= [a-z]+ | "\"" [^"]* "\""
 *
 * Literals take \n \t \r \\ \" \xHH \uHHHH escapes; classes take ranges and
 * ^; postfix * + ? {m} {m,} {m,n}.  Names are [A-Za-z0-9_-]+; a rule may be
 * used before it is defined, but must be defined somewhere.
 */
#include "grammar/grammar_int.h"

#include <stdlib.h>

typedef struct {
    gbuild *b;
    const char *s;
    size_t i, n;
    pt_err *err;
    char **names;
    int *rules;
    bool *defined;
    int n_names, cap;
    int depth;
} gp;

static bool name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
}

static void skip_space(gp *p, bool newlines) {
    while (p->i < p->n) {
        char c = p->s[p->i];
        if (c == '#') {
            while (p->i < p->n && p->s[p->i] != '\n') p->i++;
        } else if (c == ' ' || c == '\t' || c == '\r' || (newlines && c == '\n')) {
            p->i++;
        } else if (c == '\\' && p->i + 1 < p->n && p->s[p->i + 1] == '\n') {
            p->i += 2;
        } else {
            break;
        }
    }
}

static int rule_for(gp *p, const char *name, size_t len) {
    for (int i = 0; i < p->n_names; i++)
        if (strlen(p->names[i]) == len && !memcmp(p->names[i], name, len)) return i;
    if (p->n_names == p->cap) {
        p->cap = p->cap ? 2 * p->cap : 16;
        p->names = pt_xrealloc(p->names, (size_t)p->cap * sizeof *p->names);
        p->rules = pt_xrealloc(p->rules, (size_t)p->cap * sizeof *p->rules);
        p->defined = pt_xrealloc(p->defined, (size_t)p->cap * sizeof *p->defined);
    }
    char *nm = pt_xmalloc(len + 1);
    memcpy(nm, name, len);
    nm[len] = 0;
    p->names[p->n_names] = nm;
    p->rules[p->n_names] = gb_rule(p->b);
    p->defined[p->n_names] = false;
    return p->n_names++;
}

static int line_of(const gp *p) {
    int l = 1;
    for (size_t i = 0; i < p->i && i < p->n; i++) l += p->s[i] == '\n';
    return l;
}

/* One character of a literal or class, escapes decoded. */
static int read_char(gp *p, uint32_t *out) {
    if (p->i >= p->n) return pt_fail(p->err, "grammar line %d: unexpected end", line_of(p));
    unsigned char c = (unsigned char)p->s[p->i];
    if (c != '\\') {
        /* UTF-8: decode one code point */
        int n = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
        uint32_t v = n == 1 ? c : n == 2 ? c & 0x1F : n == 3 ? c & 0x0F : c & 0x07;
        for (int k = 1; k < n && p->i + (size_t)k < p->n; k++) v = (v << 6) | ((unsigned char)p->s[p->i + k] & 0x3F);
        p->i += (size_t)n;
        *out = v;
        return 0;
    }
    p->i++;
    if (p->i >= p->n) return pt_fail(p->err, "grammar line %d: escape at end", line_of(p));
    char e = p->s[p->i++];
    switch (e) {
    case 'n': *out = '\n'; return 0;
    case 't': *out = '\t'; return 0;
    case 'r': *out = '\r'; return 0;
    case 'x': case 'u': case 'U': {
        int nd = e == 'x' ? 2 : e == 'u' ? 4 : 8;
        uint32_t v = 0;
        for (int k = 0; k < nd; k++, p->i++) {
            char h = p->i < p->n ? p->s[p->i] : 0;
            int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
            if (d < 0) return pt_fail(p->err, "grammar line %d: bad \\%c escape", line_of(p), e);
            v = v * 16 + (uint32_t)d;
        }
        *out = v;
        return 0;
    }
    default: *out = (unsigned char)e; return 0;
    }
}

static void emit_char(gbuild *b, gseq *s, uint32_t c) {
    if (c < 0x80) {
        seq_byte(b, s, c);
        return;
    }
    int r = gb_rule(b);
    gb_utf8_range(b, r, c, c);
    seq_ref(s, r);
}

static int parse_alts(gp *p, int *rule);

static int parse_atom(gp *p, gseq *s) {
    gbuild *b = p->b;
    char c = p->s[p->i];
    int atom;
    if (c == '"') {
        p->i++;
        gseq lit = {0};
        while (p->i < p->n && p->s[p->i] != '"') {
            uint32_t ch;
            if (read_char(p, &ch) < 0) { seq_free(&lit); return -1; }
            emit_char(b, &lit, ch);
        }
        if (p->i >= p->n) { seq_free(&lit); return pt_fail(p->err, "grammar line %d: unterminated literal", line_of(p)); }
        p->i++;
        atom = gb_rule_of(b, &lit);
    } else if (c == '[') {
        p->i++;
        bool neg = p->i < p->n && p->s[p->i] == '^';
        if (neg) p->i++;
        /* collect ranges, then build like a regex class */
        uint32_t lo[256], hi[256];
        int n = 0;
        while (p->i < p->n && p->s[p->i] != ']') {
            if (n == 256) return pt_fail(p->err, "grammar line %d: class too long", line_of(p));
            if (read_char(p, &lo[n]) < 0) return -1;
            hi[n] = lo[n];
            if (p->i + 1 < p->n && p->s[p->i] == '-' && p->s[p->i + 1] != ']') {
                p->i++;
                if (read_char(p, &hi[n]) < 0) return -1;
            }
            n++;
        }
        if (p->i >= p->n) return pt_fail(p->err, "grammar line %d: unterminated class", line_of(p));
        p->i++;
        atom = gb_rule(b);
        /* sort-free complement: mark ASCII, and ranges above */
        if (neg) {
            uint32_t next = 0;
            /* simple O(n^2) complement over sorted copies */
            for (int a = 0; a < n; a++)
                for (int z = a + 1; z < n; z++)
                    if (lo[z] < lo[a]) {
                        uint32_t t = lo[a]; lo[a] = lo[z]; lo[z] = t;
                        t = hi[a]; hi[a] = hi[z]; hi[z] = t;
                    }
            for (int a = 0; a < n; a++) {
                if (lo[a] > next) gb_utf8_range(b, atom, next, lo[a] - 1);
                if (hi[a] + 1 > next) next = hi[a] + 1;
            }
            if (next <= 0x10FFFF) gb_utf8_range(b, atom, next, 0x10FFFF);
        } else {
            for (int a = 0; a < n; a++)
                if (lo[a] <= hi[a]) gb_utf8_range(b, atom, lo[a], hi[a]);
        }
    } else if (c == '(') {
        p->i++;
        if (parse_alts(p, &atom) < 0) return -1;
        skip_space(p, true);
        if (p->i >= p->n || p->s[p->i] != ')') return pt_fail(p->err, "grammar line %d: missing ')'", line_of(p));
        p->i++;
    } else if (name_char(c)) {
        size_t st = p->i;
        while (p->i < p->n && name_char(p->s[p->i])) p->i++;
        atom = p->rules[rule_for(p, p->s + st, p->i - st)];
    } else if (c == '.') {
        p->i++;
        atom = gb_rule(b);
        gb_utf8_range(b, atom, 0, 0x10FFFF);
    } else {
        return pt_fail(p->err, "grammar line %d: unexpected '%c'", line_of(p), c);
    }
    long lo = 1, hi = 1;
    if (p->i < p->n) {
        c = p->s[p->i];
        if (c == '*') lo = 0, hi = -1, p->i++;
        else if (c == '+') lo = 1, hi = -1, p->i++;
        else if (c == '?') lo = 0, hi = 1, p->i++;
        else if (c == '{') {
            p->i++;
            char *end;
            lo = strtol(p->s + p->i, &end, 10);
            p->i = (size_t)(end - p->s);
            hi = lo;
            if (p->i < p->n && p->s[p->i] == ',') {
                p->i++;
                hi = p->i < p->n && p->s[p->i] == '}' ? -1 : strtol(p->s + p->i, &end, 10);
                if (hi >= 0) p->i = (size_t)(end - p->s);
            }
            if (p->i >= p->n || p->s[p->i] != '}') return pt_fail(p->err, "grammar line %d: bad {m,n}", line_of(p));
            p->i++;
        }
    }
    if (lo != 1 || hi != 1) {
        atom = gb_repeat(b, atom, lo, hi, p->err);
        if (atom < 0) return -1;
    }
    seq_ref(s, atom);
    return 0;
}

/* Is the text at i the start of a new rule definition (name ::=)? */
static bool at_definition(const gp *p) {
    size_t i = p->i;
    while (i < p->n && name_char(p->s[i])) i++;
    if (i == p->i) return false;
    while (i < p->n && (p->s[i] == ' ' || p->s[i] == '\t')) i++;
    return i + 2 < p->n + 1 && !strncmp(p->s + i, "::=", 3);
}

static int parse_alts(gp *p, int *rule) {
    if (++p->depth > 200) return pt_fail(p->err, "grammar nests too deeply");
    int r = gb_rule(p->b);
    gseq s = {0};
    for (;;) {
        skip_space(p, p->depth > 1);
        if (p->i >= p->n || p->s[p->i] == ')' || (p->depth == 1 && p->s[p->i] == '\n')) {
            /* a newline inside a top-level rule continues it only if the
             * next line is not a new definition */
            if (p->i < p->n && p->s[p->i] == '\n') {
                size_t save = p->i;
                skip_space(p, true);
                if (p->i < p->n && !at_definition(p) && (p->s[p->i] == '|' || p->s[p->i] != ')')) continue;
                p->i = save;
            }
            gb_alt(p->b, r, &s);
            break;
        }
        if (p->s[p->i] == '|') {
            p->i++;
            gb_alt(p->b, r, &s);
            continue;
        }
        if (parse_atom(p, &s) < 0) {
            seq_free(&s);
            return -1;
        }
    }
    p->depth--;
    *rule = r;
    return 0;
}

int pt_grammar_from_gbnf(pt_grammar **out, const char *text, size_t len, pt_err *err) {
    gbuild b;
    gb_init(&b);
    gp p = {.b = &b, .s = text, .n = len, .err = err};
    int rc = 0;
    for (;;) {
        skip_space(&p, true);
        if (p.i >= p.n) break;
        size_t st = p.i;
        while (p.i < p.n && name_char(p.s[p.i])) p.i++;
        if (p.i == st) { rc = pt_fail(err, "grammar line %d: expected a rule name", line_of(&p)); break; }
        int k = rule_for(&p, text + st, p.i - st);
        skip_space(&p, false);
        if (p.i + 3 > p.n || strncmp(text + p.i, "::=", 3)) {
            rc = pt_fail(err, "grammar line %d: expected '::=' after %s", line_of(&p), p.names[k]);
            break;
        }
        p.i += 3;
        if (p.defined[k]) { rc = pt_fail(err, "grammar: rule %s is defined twice", p.names[k]); break; }
        p.defined[k] = true;
        int body;
        if ((rc = parse_alts(&p, &body)) < 0) break;
        gseq s = {0};
        seq_ref(&s, body);
        gb_alt(&b, p.rules[k], &s);
    }
    int root = -1;
    for (int i = 0; rc == 0 && i < p.n_names; i++) {
        if (!p.defined[i]) rc = pt_fail(err, "grammar: rule %s is used but not defined", p.names[i]);
        if (!strcmp(p.names[i], "root")) root = p.rules[i];
    }
    if (rc == 0 && root < 0) rc = pt_fail(err, "grammar: no rule named root");
    if (rc == 0) rc = gb_finish(&b, root, out, err);
    for (int i = 0; i < p.n_names; i++) free(p.names[i]);
    free(p.names);
    free(p.rules);
    free(p.defined);
    gb_free(&b);
    return rc;
}
