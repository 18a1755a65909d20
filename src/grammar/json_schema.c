/*
 * json_schema.c - JSON Schema -> grammar rules.
 *
 * The grammar accepts JSON text that validates against the schema, with
 * flexible whitespace between tokens.  Properties come in any order when an
 * object lists at most ANY_ORDER_MAX of them, else in the order the schema
 * lists them (as OpenAI's structured outputs do); properties not
 * listed come after them, only where additionalProperties allows, and may
 * not reuse a listed name.  Keywords that change the language and cannot
 * be enforced exactly are errors that name the keyword, never ignored;
 * annotations (title, description, examples, default, $comment, ...) are
 * ignored.
 *
 * Shared rules (value, string, number, ws...) are built once per schema so
 * the matcher's per-position mask work is shared between properties.
 */
#include "grammar/grammar_int.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct sc {
    gbuild *b;
    const json_t *root;
    pt_err *err;
    int ws, value, string, str_char, str_body, number, integer, boolean, null, any_obj, any_arr;
    struct { const char *ref; int rule; } *refs;
    int n_refs, cap_refs;
    int depth;
    int ws_max; /* whitespace characters allowed between two tokens */
    /* Where gen is in the schema, as a JSON Pointer ("" is the root), and
     * where the first error happened: errors name the keyword and this. */
    char path[512];
    size_t path_len;
    char err_path[512];
    bool err_at;
} sc;

static int gen(sc *c, const json_t *s, int *rule);
static bool has_validation(const json_t *s);

/* Appends "/seg" (a keyword, an index or a property name, escaped as JSON
 * Pointer escapes it) to the path; returns the old length for path_pop.
 * A path too long for the buffer keeps its head, ending in "...". */
static size_t path_push(sc *c, const char *fmt, ...) {
    size_t old = c->path_len;
    char seg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(seg, sizeof seg, fmt, ap);
    va_end(ap);
    size_t n = old, cap = sizeof c->path - 4;
    if (n < cap) c->path[n++] = '/';
    for (const char *p = seg; *p && n < cap; p++) {
        if (*p == '~' || *p == '/') {
            c->path[n++] = '~';
            if (n < cap) c->path[n++] = *p == '~' ? '0' : '1';
        } else {
            c->path[n++] = *p;
        }
    }
    if (n >= cap) memcpy(c->path + n, "...", 3), n += 3;
    c->path[n] = 0;
    c->path_len = n;
    return old;
}

static void path_pop(sc *c, size_t old) {
    c->path_len = old;
    c->path[old] = 0;
}

/* gen for the sub-schema at path + "/kw" (+ "/sub"): its errors say where
 * it is. */
static int gen_at(sc *c, const json_t *s, int *rule, const char *kw, const char *sub) {
    size_t old = path_push(c, "%s", kw);
    if (sub) path_push(c, "%s", sub);
    int rc = gen(c, s, rule);
    path_pop(c, old);
    return rc;
}

static int gen_at_i(sc *c, const json_t *s, int *rule, const char *kw, size_t i) {
    char ix[24];
    snprintf(ix, sizeof ix, "%zu", i);
    return gen_at(c, s, rule, kw, ix);
}

/* --- shared rules ---------------------------------------------------------- */

/* A schema no value satisfies (false, an enum of none of the allowed types,
 * maxLength < minLength): a rule with no alternatives.  gb_finish drops
 * every alternative that needs it, so an optional property with such a
 * schema can never appear, and a schema that needs it everywhere is refused
 * ("matches no finite text"). */
static int no_value(sc *c) { return gb_rule(c->b); }

static int ws_rule(sc *c) {
    if (c->ws < 0) {
        pt_byteset w = {{0}};
        bs_add(&w, ' '), bs_add(&w, '\t'), bs_add(&w, '\n'), bs_add(&w, '\r');
        gseq s = {0};
        seq_bytes(c->b, &s, &w);
        /* bounded so a model cannot loop on whitespace forever */
        c->ws = gb_repeat(c->b, gb_rule_of(c->b, &s), 0, c->ws_max, c->err);
    }
    return c->ws;
}

/* One character of a JSON string's contents, as JSON spells it. */
static int str_char_rule(sc *c) {
    if (c->str_char >= 0) return c->str_char;
    gbuild *b = c->b;
    int r = gb_rule(b);
    pt_byteset plain = {{0}};
    bs_range(&plain, 0x20, 0x7F);
    plain.w['"' >> 5] &= ~(1u << ('"' & 31));
    plain.w['\\' >> 5] &= ~(1u << ('\\' & 31));
    gseq s = {0};
    seq_bytes(b, &s, &plain);
    gb_alt(b, r, &s);
    gb_utf8_range(b, r, 0x80, 0x10FFFF);
    pt_byteset esc = {{0}};
    for (const char *p = "\"\\/bfnrt"; *p; p++) bs_add(&esc, (unsigned char)*p);
    seq_byte(b, &s, '\\');
    seq_bytes(b, &s, &esc);
    gb_alt(b, r, &s);
    pt_byteset hex = {{0}};
    bs_range(&hex, '0', '9'), bs_range(&hex, 'a', 'f'), bs_range(&hex, 'A', 'F');
    seq_lit(b, &s, "\\u", 2);
    for (int i = 0; i < 4; i++) seq_bytes(b, &s, &hex);
    gb_alt(b, r, &s);
    return c->str_char = r;
}

static int quoted(sc *c, int body) {
    gseq s = {0};
    seq_byte(c->b, &s, '"');
    seq_ref(&s, body);
    seq_byte(c->b, &s, '"');
    return gb_rule_of(c->b, &s);
}

static int string_rule(sc *c) {
    if (c->string < 0) {
        c->str_body = gb_star(c->b, str_char_rule(c));
        c->string = quoted(c, c->str_body);
    }
    return c->string;
}

static int digits_rule(gbuild *b, long lo) { /* [0-9]{lo,} */
    pt_byteset d = {{0}};
    bs_range(&d, '0', '9');
    gseq s = {0};
    seq_bytes(b, &s, &d);
    return gb_repeat(b, gb_rule_of(b, &s), lo, -1, NULL);
}

/* -?(0|[1-9][0-9]*) */
static int int_rule(sc *c) {
    if (c->integer >= 0) return c->integer;
    gbuild *b = c->b;
    int r = gb_rule(b);
    for (int neg = 0; neg < 2; neg++) {
        gseq s = {0};
        if (neg) seq_byte(b, &s, '-');
        seq_byte(b, &s, '0');
        gb_alt(b, r, &s);
        if (neg) seq_byte(b, &s, '-');
        pt_byteset nz = {{0}};
        bs_range(&nz, '1', '9');
        seq_bytes(b, &s, &nz);
        seq_ref(&s, digits_rule(b, 0));
        gb_alt(b, r, &s);
    }
    return c->integer = r;
}

static int frac_exp(sc *c, bool exp) { /* (\.[0-9]+)?([eE][+-]?[0-9]+)? */
    gbuild *b = c->b;
    gseq f = {0}, e = {0}, s = {0};
    seq_byte(b, &f, '.');
    seq_ref(&f, digits_rule(b, 1));
    seq_ref(&s, gb_opt(b, gb_rule_of(b, &f)));
    if (exp) {
        pt_byteset ee = {{0}}, pm = {{0}};
        bs_add(&ee, 'e'), bs_add(&ee, 'E'), bs_add(&pm, '+'), bs_add(&pm, '-');
        seq_bytes(b, &e, &ee);
        gseq p = {0};
        seq_bytes(b, &p, &pm);
        seq_ref(&e, gb_opt(b, gb_rule_of(b, &p)));
        seq_ref(&e, digits_rule(b, 1));
        seq_ref(&s, gb_opt(b, gb_rule_of(b, &e)));
    }
    return gb_rule_of(b, &s);
}

static int number_rule(sc *c) {
    if (c->number < 0) {
        gseq s = {0};
        seq_ref(&s, int_rule(c));
        seq_ref(&s, frac_exp(c, true));
        c->number = gb_rule_of(c->b, &s);
    }
    return c->number;
}

static int value_rule(sc *c);

/* "[" ws (x (ws "," ws x)*)? ws "]" with bounds on the count */
static int list_rule(sc *c, char open, char close, int item, long lo, long hi, int prefix_n,
                     const int *prefix) {
    gbuild *b = c->b;
    int ws = ws_rule(c);
    gseq sep = {0};
    seq_ref(&sep, ws);
    seq_byte(b, &sep, ',');
    seq_ref(&sep, ws);
    int comma = gb_rule_of(b, &sep);
    /* tail_k: items after the k-th, as ("," item)* within the count */
    int r = gb_rule(b);
    gseq body = {0};
    /* Build from the end: after prefix items, the rest are `item`. */
    long n_pre = prefix_n;
    int rest; /* rule: items number n_pre+1.. given at least one item before */
    {
        gseq ci = {0};
        seq_ref(&ci, comma);
        seq_ref(&ci, item);
        int one = gb_rule_of(b, &ci);
        long used = n_pre > 0 ? n_pre : 1; /* items before `rest` */
        long need = lo > used ? lo - used : 0;
        long max = hi < 0 ? -1 : hi - used;
        if (max < 0 && hi >= 0) max = 0;
        if (max >= 0 && max < need) max = need;
        rest = gb_repeat(b, one, need, max, c->err);
        if (rest < 0) return -1;
    }
    /* prefix items: p0 (comma p1 (comma p2 ...)?)? with required ones forced */
    int after = rest; /* what may follow item k (k>=0) */
    for (long k = n_pre - 1; k >= 1; k--) {
        gseq a = {0};
        seq_ref(&a, comma);
        seq_ref(&a, prefix[k]);
        seq_ref(&a, after);
        int rr = gb_rule(b);
        gb_alt(b, rr, &a);
        if (k >= lo) { gseq e = {0}; gb_alt(b, rr, &e); }
        after = rr;
    }
    gseq full = {0};
    if (n_pre > 0) {
        seq_ref(&full, prefix[0]);
        seq_ref(&full, after);
    } else {
        seq_ref(&full, item);
        seq_ref(&full, rest);
    }
    int nonempty = gb_rule_of(b, &full);
    seq_byte(b, &body, (unsigned char)open);
    seq_ref(&body, ws);
    seq_ref(&body, nonempty);
    seq_ref(&body, ws);
    seq_byte(b, &body, (unsigned char)close);
    gb_alt(b, r, &body);
    if (lo <= 0 && hi != 0) {
        seq_byte(b, &body, (unsigned char)open);
        seq_ref(&body, ws);
        seq_byte(b, &body, (unsigned char)close);
        gb_alt(b, r, &body);
    }
    if (hi == 0) { /* only the empty list */
        gseq e = {0};
        seq_byte(b, &e, (unsigned char)open);
        seq_ref(&e, ws);
        seq_byte(b, &e, (unsigned char)close);
        int only = gb_rule_of(b, &e);
        return only;
    }
    return r;
}

static int kv_rule(sc *c, int key, int val) {
    gseq s = {0};
    seq_ref(&s, key);
    seq_ref(&s, ws_rule(c));
    seq_byte(c->b, &s, ':');
    seq_ref(&s, ws_rule(c));
    seq_ref(&s, val);
    return gb_rule_of(c->b, &s);
}

static int value_rule(sc *c) {
    if (c->value >= 0) return c->value;
    gbuild *b = c->b;
    int r = c->value = gb_rule(b);
    int kv = kv_rule(c, string_rule(c), r);
    int obj = list_rule(c, '{', '}', kv, 0, -1, 0, NULL);
    int arr = list_rule(c, '[', ']', r, 0, -1, 0, NULL);
    const int alts[] = {obj, arr, string_rule(c), number_rule(c), gb_lit_rule(b, "true"),
                        gb_lit_rule(b, "false"), gb_lit_rule(b, "null")};
    for (size_t i = 0; i < sizeof alts / sizeof *alts; i++) {
        gseq s = {0};
        seq_ref(&s, alts[i]);
        gb_alt(b, r, &s);
    }
    return r;
}

/* --- constants ------------------------------------------------------------- */

/* The JSON text of a constant, with flexible whitespace inside. */
static int const_rule(sc *c, const json_t *v) {
    gbuild *b = c->b;
    gseq s = {0};
    if (json_is_object(v) || json_is_array(v)) {
        bool obj = json_is_object(v);
        seq_byte(b, &s, obj ? '{' : '[');
        seq_ref(&s, ws_rule(c));
        size_t i = 0, n = obj ? json_object_size(v) : json_array_size(v);
        const char *k;
        json_t *x;
        void *it = obj ? json_object_iter((json_t *)v) : NULL;
        for (i = 0; i < n; i++) {
            if (i) {
                seq_ref(&s, ws_rule(c));
                seq_byte(b, &s, ',');
                seq_ref(&s, ws_rule(c));
            }
            if (obj) {
                k = json_object_iter_key(it);
                x = json_object_iter_value(it);
                it = json_object_iter_next((json_t *)v, it);
                json_t *ks = json_string(k);
                char *kt = json_dumps(ks, JSON_ENCODE_ANY | JSON_COMPACT);
                seq_lit(b, &s, kt, strlen(kt));
                free(kt);
                json_decref(ks);
                seq_ref(&s, ws_rule(c));
                seq_byte(b, &s, ':');
                seq_ref(&s, ws_rule(c));
            } else {
                x = json_array_get(v, i);
            }
            seq_ref(&s, const_rule(c, x));
        }
        seq_ref(&s, ws_rule(c));
        seq_byte(b, &s, obj ? '}' : ']');
        return gb_rule_of(b, &s);
    }
    if (json_is_real(v)) {
        /* 1.0 may be written 1.0 or 1: the numeric value is what counts */
        double d = json_real_value(v);
        char buf[64];
        if (d == floor(d) && fabs(d) < 1e15) {
            int r = gb_rule(b);
            snprintf(buf, sizeof buf, "%.0f", d);
            seq_lit(b, &s, buf, strlen(buf));
            gb_alt(b, r, &s);
            snprintf(buf, sizeof buf, "%.1f", d);
            seq_lit(b, &s, buf, strlen(buf));
            gb_alt(b, r, &s);
            return r;
        }
    }
    char *t = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT | JSON_REAL_PRECISION(17));
    seq_lit(b, &s, t, strlen(t));
    free(t);
    return gb_rule_of(b, &s);
}

/* --- strings --------------------------------------------------------------- */

typedef struct { const char *name; const char *re; } fmt_re;

/* A calendar date: days per month, February 29 in leap years only. */
#define DATE_RE "([0-9]{4}-((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12][0-9]|30)|02-(0[1-9]|1[0-9]|2[0-8]))|([0-9]{2}(0[48]|[2468][048]|[13579][26])|(0[48]|[2468][048]|[13579][26])00)-02-29)"

static const fmt_re formats[] = {
    {"date", DATE_RE},
    {"time", "([01][0-9]|2[0-3]):[0-5][0-9]:([0-5][0-9]|60)(\\.[0-9]+)?(Z|z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"},
    {"date-time", DATE_RE "[Tt ]([01][0-9]|2[0-3]):[0-5][0-9]:([0-5][0-9]|60)(\\.[0-9]+)?(Z|z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"},
    {"uuid", "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"},
    {"ipv4", "((25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\\.){3}(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"},
    {"email", "[a-zA-Z0-9!#$%&'*+/=?^_`{|}~-]+(\\.[a-zA-Z0-9!#$%&'*+/=?^_`{|}~-]+)*@([a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?\\.)*[a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?"},
    {"uri", "[a-zA-Z][a-zA-Z0-9+.-]*:[a-zA-Z0-9._~:/?#@!$&'()*+,;=%\\[\\]-]*"},
    /* a URI, or a relative reference whose first segment has no ':' */
    {"uri-reference", "[a-zA-Z][a-zA-Z0-9+.-]*:[a-zA-Z0-9._~:/?#@!$&'()*+,;=%\\[\\]-]*|"
                      "(/[a-zA-Z0-9._~:/?#@!$&'()*+,;=%\\[\\]-]*|[a-zA-Z0-9._~@!$&'()*+,;=%-]+"
                      "([/?#][a-zA-Z0-9._~:/?#@!$&'()*+,;=%\\[\\]-]*)?|[?#][a-zA-Z0-9._~:/?#@!$&'()*+,;=%\\[\\]-]*)?"},
    {"hostname", "([a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?\\.)*[a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?"},
};

static int gen_string_len(sc *c, const json_t *mn, const json_t *mx, int *rule) {
    if (!mn && !mx) {
        *rule = string_rule(c);
        return 0;
    }
    if ((mn && !json_is_integer(mn)) || (mx && !json_is_integer(mx)))
        return pt_fail(c->err, "minLength/maxLength must be integers");
    long lo = mn ? (long)json_integer_value(mn) : 0, hi = mx ? (long)json_integer_value(mx) : -1;
    if (lo < 0) lo = 0;
    if (hi >= 0 && hi < lo) { /* no string is valid */
        *rule = no_value(c);
        return 0;
    }
    int body = gb_repeat(c->b, str_char_rule(c), lo, hi, c->err);
    if (body < 0) return -1;
    *rule = quoted(c, body);
    return 0;
}

static int gen_string(sc *c, const json_t *s, int *rule) {
    json_t *mn = json_object_get(s, "minLength"), *mx = json_object_get(s, "maxLength");
    json_t *pat = json_object_get(s, "pattern"), *fmt = json_object_get(s, "format");
    if (pat && !json_is_string(pat)) return pt_fail(c->err, "\"pattern\" must be a string");
    if (pat && fmt) return pt_fail(c->err, "\"pattern\" together with \"format\" is not supported");
    if (pat) {
        if ((mn && !json_is_integer(mn)) || (mx && !json_is_integer(mx)))
            return pt_fail(c->err, "minLength/maxLength must be integers");
        long lo = mn ? (long)json_integer_value(mn) : 0, hi = mx ? (long)json_integer_value(mx) : -1;
        int body;
        if (pt_regex_rule_len(c->b, json_string_value(pat), true, false, lo, hi, &body, c->err) < 0)
            return pt_failp(c->err, "pattern");
        *rule = quoted(c, body);
        return 0;
    }
    if (fmt) {
        const char *f = json_string_value(fmt);
        for (size_t i = 0; f && i < sizeof formats / sizeof *formats; i++) {
            if (strcmp(formats[i].name, f)) continue;
            if (mn || mx)
                return pt_fail(c->err, "\"format\" \"%s\" together with minLength/maxLength is not supported", f);
            int body;
            if (pt_regex_rule(c->b, formats[i].re, true, true, &body, c->err) < 0) return -1;
            *rule = quoted(c, body);
            return 0;
        }
        /* a format the standard does not define only annotates */
        static const char *const standard[] = {"duration", "idn-email", "idn-hostname", "ipv6", "iri",
                                               "iri-reference", "uri-template", "json-pointer",
                                               "relative-json-pointer", "regex", NULL};
        for (int i = 0; f && standard[i]; i++)
            if (!strcmp(f, standard[i])) return pt_fail(c->err, "string format \"%s\" is not supported", f);
        if (!f) return pt_fail(c->err, "\"format\" must be a string");
        if (mn || mx) return gen_string_len(c, mn, mx, rule);
        *rule = string_rule(c);
        return 0;
    }
    return gen_string_len(c, mn, mx, rule);
}

/* --- integers with bounds -------------------------------------------------- */

/* Digit strings (no leading zeros) of exactly nd digits in [lo, hi], as
 * alternatives of rule r. */
static void digit_range(gbuild *b, int r, const char *lo, const char *hi, int nd, gseq *prefix) {
    if (nd == 0) {
        gseq s = {0};
        seq_cat(&s, prefix);
        gb_alt(b, r, &s);
        return;
    }
    pt_byteset set = {{0}};
    if (lo[0] == hi[0]) {
        gseq p = {0};
        seq_cat(&p, prefix);
        seq_byte(b, &p, (unsigned char)lo[0]);
        digit_range(b, r, lo + 1, hi + 1, nd - 1, &p);
        seq_free(&p);
        return;
    }
    bool lo_min = true, hi_max = true;
    for (int i = 1; i < nd; i++) lo_min &= lo[i] == '0', hi_max &= hi[i] == '9';
    char a = lo[0] + !lo_min, z = hi[0] - !hi_max;
    if (!lo_min) {
        char nines[24];
        memset(nines, '9', sizeof nines);
        gseq p = {0};
        seq_cat(&p, prefix);
        seq_byte(b, &p, (unsigned char)lo[0]);
        digit_range(b, r, lo + 1, nines, nd - 1, &p);
        seq_free(&p);
    }
    if (a <= z) {
        gseq s = {0};
        seq_cat(&s, prefix);
        bs_range(&set, (unsigned char)a, (unsigned char)z);
        seq_bytes(b, &s, &set);
        pt_byteset d = {{0}};
        bs_range(&d, '0', '9');
        for (int i = 1; i < nd; i++) seq_bytes(b, &s, &d);
        gb_alt(b, r, &s);
    }
    if (!hi_max) {
        char zeros[24];
        memset(zeros, '0', sizeof zeros);
        gseq p = {0};
        seq_cat(&p, prefix);
        seq_byte(b, &p, (unsigned char)hi[0]);
        digit_range(b, r, zeros, hi + 1, nd - 1, &p);
        seq_free(&p);
    }
}

/* Non-negative decimal integers in [lo, hi] (hi < 0: unbounded). */
static void uint_range(gbuild *b, int r, int64_t lo, int64_t hi, bool neg) {
    char a[24], z[24];
    int la = snprintf(a, sizeof a, "%" PRId64, lo);
    int lz = hi < 0 ? 19 : snprintf(z, sizeof z, "%" PRId64, hi);
    for (int nd = la; nd <= lz; nd++) {
        char from[24], to[24];
        if (nd == la) memcpy(from, a, (size_t)nd + 1);
        else { memset(from, '0', (size_t)nd); from[0] = '1'; from[nd] = 0; }
        if (hi >= 0 && nd == lz) memcpy(to, z, (size_t)nd + 1);
        else { memset(to, '9', (size_t)nd); to[nd] = 0; }
        if (nd == 1 && from[0] == '0' && neg) from[0] = '1'; /* no "-0" */
        if (strcmp(from, to) > 0 && nd == (int)strlen(from)) continue;
        gseq p = {0};
        if (neg) seq_byte(b, &p, '-');
        digit_range(b, r, from, to, nd, &p);
        seq_free(&p);
    }
    if (hi < 0) { /* 20 digits and more */
        gseq s = {0};
        if (neg) seq_byte(b, &s, '-');
        pt_byteset nz = {{0}};
        bs_range(&nz, '1', '9');
        seq_bytes(b, &s, &nz);
        seq_ref(&s, digits_rule(b, 19));
        gb_alt(b, r, &s);
    }
}

static int get_bound(sc *c, const json_t *s, const char *k, const char *ek, bool want_lo, bool *has,
                     double *v) {
    json_t *x = json_object_get(s, k), *ex = json_object_get(s, ek);
    *has = false;
    if (x && !json_is_number(x)) return pt_fail(c->err, "\"%s\" must be a number", k);
    if (x) { *has = true; *v = json_number_value(x); }
    if (json_is_number(ex)) { /* draft 6+: a number */
        double e = json_number_value(ex);
        double adj = want_lo ? floor(e) + 1 : ceil(e) - 1;
        if (!*has || (want_lo ? adj > *v : adj < *v)) *v = adj;
        *has = true;
    } else if (json_is_true(ex) && *has) { /* draft 4: a flag */
        *v = want_lo ? floor(*v) + 1 : ceil(*v) - 1;
    }
    return 0;
}

static int gen_integer(sc *c, const json_t *s, int *rule) {
    bool hl, hh;
    double lo = 0, hi = 0;
    if (get_bound(c, s, "minimum", "exclusiveMinimum", true, &hl, &lo) < 0 ||
        get_bound(c, s, "maximum", "exclusiveMaximum", false, &hh, &hi) < 0)
        return -1;
    if (!hl && !hh) {
        *rule = int_rule(c);
        return 0;
    }
    if (hl) lo = ceil(lo);
    if (hh) hi = floor(hi);
    if ((hl && fabs(lo) > 9e18) || (hh && fabs(hi) > 9e18))
        return pt_fail(c->err, "integer bounds beyond 64 bits are not supported");
    if (hl && hh && lo > hi) return pt_fail(c->err, "minimum > maximum: no integer is valid");
    gbuild *b = c->b;
    int r = gb_rule(b);
    /* non-negative part [max(lo,0), hi] and negative part [lo, min(hi,-1)] */
    if (!hh || hi >= 0) uint_range(b, r, hl && lo > 0 ? (int64_t)lo : 0, hh ? (int64_t)hi : -1, false);
    if (!hl || lo < 0) {
        int64_t nlo = hh && hi < 0 ? (int64_t)-hi : 1, nhi = hl ? (int64_t)-lo : -1;
        uint_range(b, r, nlo, nhi, true);
    }
    *rule = r;
    return 0;
}

/* Fractions: any (absent or .digits), nonzero, or zero-or-absent. */
static int frac_rule(sc *c, int kind) {
    gbuild *b = c->b;
    pt_byteset d = {{0}}, nz = {{0}};
    bs_range(&d, '0', '9');
    bs_range(&nz, '1', '9');
    int r = gb_rule(b);
    gseq s = {0};
    if (kind != 1) gb_alt(b, r, &s); /* absent */
    seq_byte(b, &s, '.');
    if (kind == 0) {
        seq_ref(&s, digits_rule(b, 1));
    } else if (kind == 1) {
        seq_ref(&s, gb_star(b, gb_lit_rule(b, "0")));
        seq_bytes(b, &s, &nz);
        seq_ref(&s, digits_rule(b, 0));
    } else {
        seq_ref(&s, gb_repeat(b, gb_lit_rule(b, "0"), 1, -1, NULL));
    }
    gb_alt(b, r, &s);
    return r;
}

static void num_alt(sc *c, int r, bool neg, int64_t ilo, int64_t ihi, int frac) {
    if (ihi >= 0 && ilo > ihi) return;
    gbuild *b = c->b;
    int ir = gb_rule(b);
    uint_range(b, ir, ilo, ihi, false);
    gseq s = {0};
    if (neg) seq_byte(b, &s, '-');
    seq_ref(&s, ir);
    seq_ref(&s, frac_rule(c, frac));
    gb_alt(b, r, &s);
}

/* Non-negative decimals D (no exponent) with a <= D (or a < D) and, if
 * b >= 0, D <= b (or D < b); a and b integers. */
static void nonneg_range(sc *c, int r, bool neg, int64_t a, bool a_incl, int64_t b, bool b_incl) {
    int64_t lo_any = a_incl ? a : a + 1, hi_any = b < 0 ? -1 : b - 1;
    if (b < 0 || lo_any <= hi_any) num_alt(c, r, neg, lo_any, hi_any, 0);
    if (!a_incl && (b < 0 || a < b)) num_alt(c, r, neg, a, a, 1);      /* a < D < a+1 */
    if (b >= 0 && b_incl && (a_incl ? b >= a : b > a)) num_alt(c, r, neg, b, b, 2); /* D == b */
}

static int gen_number(sc *c, const json_t *s, int *rule) {
    const char *keys[] = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"};
    bool bounded = false;
    for (int i = 0; i < 4; i++) bounded |= json_object_get(s, keys[i]) != NULL;
    if (!bounded) {
        *rule = number_rule(c);
        return 0;
    }
    /* bounds as (value, inclusive); draft 4 uses boolean exclusive flags */
    bool has[2] = {false, false}, incl[2] = {true, true};
    double v[2] = {0, 0};
    for (int k = 0; k < 2; k++) {
        json_t *x = json_object_get(s, k ? "maximum" : "minimum");
        json_t *ex = json_object_get(s, k ? "exclusiveMaximum" : "exclusiveMinimum");
        if (x && !json_is_number(x)) return pt_fail(c->err, "\"%s\" must be a number", keys[k]);
        if (x) has[k] = true, v[k] = json_number_value(x);
        if (json_is_true(ex) && x) incl[k] = false;
        if (json_is_number(ex)) {
            double e = json_number_value(ex);
            if (!has[k] || (k ? e <= v[k] : e >= v[k])) has[k] = true, v[k] = e, incl[k] = false;
        }
        if (has[k] && (v[k] != floor(v[k]) || fabs(v[k]) > 9e18))
            return pt_fail(c->err, "number bounds that are not integers are not supported");
    }
    if (has[0] && has[1] && (v[0] > v[1] || (v[0] == v[1] && (!incl[0] || !incl[1]))))
        return pt_fail(c->err, "the number bounds admit no value");
    int r = gb_rule(c->b);
    int64_t lo = (int64_t)v[0], hi = (int64_t)v[1];
    /* x >= 0 part */
    if (!has[1] || hi >= 0) {
        bool own = has[0] && lo >= 0; /* else the bound is below 0: D >= 0 */
        int64_t a = own ? lo : 0;
        bool li = own ? incl[0] : true;
        nonneg_range(c, r, false, a, li, has[1] ? hi : -1, incl[1]);
    }
    /* x < 0 part: D = -x */
    if (!has[0] || lo < 0) {
        int64_t a = has[1] && hi < 0 ? -hi : 0;
        bool ai = has[1] && hi < 0 ? incl[1] : false; /* D > 0: "-0" is 0, counted above */
        nonneg_range(c, r, true, a, ai, has[0] ? -lo : -1, incl[0]);
    }
    *rule = r;
    return 0;
}

/* --- objects and arrays ---------------------------------------------------- */

/* The contents of a JSON string that is none of names[0..n) (JSON-escaped
 * contents, all sharing their first d bytes).  Names are matched byte by
 * byte; a string leaves the trie with any character that no name has next. */
static int str_body_except(sc *c, char **names, int n, int d) {
    gbuild *b = c->b;
    int r = gb_rule(b);
    bool ends_here = false, child[256] = {false};
    for (int i = 0; i < n; i++) {
        if (!names[i][d]) ends_here = true;
        else child[(unsigned char)names[i][d]] = true;
    }
    if (!ends_here) {
        gseq e = {0};
        gb_alt(b, r, &e);
    }
    bool mid_char = d > 0 && ((unsigned char)names[0][d - 1] & 0x80) &&
                    (d < 2 || ((unsigned char)names[0][d] >= 0x80 && (unsigned char)names[0][d] < 0xC0));
    bool any_high = false;
    for (int x = 0; x < 256; x++) {
        if (!child[x]) continue;
        any_high |= x >= 0x80;
        char **sub = pt_xmalloc((size_t)n * sizeof *sub);
        int k = 0;
        for (int i = 0; i < n; i++)
            if ((unsigned char)names[i][d] == x) sub[k++] = names[i];
        gseq s = {0};
        seq_byte(b, &s, (unsigned)x);
        seq_ref(&s, str_body_except(c, sub, k, d + 1));
        gb_alt(b, r, &s);
        free(sub);
    }
    if (mid_char) return r; /* a different continuation byte: refused (rare) */
    int other = gb_rule(b);
    pt_byteset plain = {{0}};
    for (unsigned x = 0x20; x < 0x80; x++)
        if (x != '"' && x != '\\' && !child[x]) bs_add(&plain, x);
    gseq s = {0};
    seq_bytes(b, &s, &plain);
    gb_alt(b, other, &s);
    if (!any_high) gb_utf8_range(b, other, 0x80, 0x10FFFF);
    if (!child['\\']) {
        pt_byteset esc = {{0}};
        for (const char *p = "\"\\/bfnrt"; *p; p++) bs_add(&esc, (unsigned char)*p);
        seq_byte(b, &s, '\\');
        seq_bytes(b, &s, &esc);
        gb_alt(b, other, &s);
    }
    seq_ref(&s, other);
    string_rule(c);
    seq_ref(&s, c->str_body);
    gb_alt(b, r, &s);
    return r;
}

/* A JSON string (quoted) that is none of the names. */
static int key_except(sc *c, char **names, int n) {
    if (!n) return string_rule(c);
    return quoted(c, str_body_except(c, names, n, 0));
}

static char *json_quote(const char *k) { /* "k" as JSON writes it */
    json_t *ks = json_string(k);
    char *t = json_dumps(ks, JSON_ENCODE_ANY | JSON_COMPACT);
    json_decref(ks);
    return t;
}

static bool in_list(const json_t *arr, const char *k) {
    size_t i;
    json_t *x;
    json_array_foreach(arr, i, x) if (json_is_string(x) && !strcmp(json_string_value(x), k)) return true;
    return false;
}

/* A patternProperties key that every string matches: a search for
 * nothing, or for .* (which may match the empty substring). */
static bool matches_every_key(const char *p) {
    static const char *const every[] = {"", ".*", "^.*", ".*$", "(.*)", "^(.*)", "(.*)$", NULL};
    for (int i = 0; every[i]; i++)
        if (!strcmp(p, every[i])) return true;
    return false;
}

/* Objects with at most this many listed properties take them in any order
 * (2^n rule pairs: at most 512 rules and 4,096 alternatives per object);
 * larger ones in the schema's order.  6 left 49 valid instances of the
 * MaskBench dev split refused for their order, 8 leaves 31. */
#define ANY_ORDER_MAX 8

static int gen_object(sc *c, const json_t *s, int *rule) {
    gbuild *b = c->b;
    json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
    json_t *addl = json_object_get(s, "additionalProperties");
    if (props && !json_is_object(props)) return pt_fail(c->err, "\"properties\" must be an object");
    if (req && !json_is_array(req)) return pt_fail(c->err, "\"required\" must be an array");
    json_t *pprops = json_object_get(s, "patternProperties");
    /* One pattern that every key matches (".*" searches, so it matches
     * any string, newlines included): every property, listed or not, must
     * satisfy its schema, and additionalProperties applies to no key. */
    json_t *all_keys = NULL;
    if (json_is_object(pprops) && json_object_size(pprops) == 1 && !json_is_false(addl)) {
        void *it = json_object_iter(pprops);
        if (matches_every_key(json_object_iter_key(it))) all_keys = json_object_iter_value(it);
    }
    if (pprops && !all_keys && (!json_is_object(pprops) || !json_is_false(addl)))
        return pt_fail(c->err, "\"patternProperties\" is only supported with additionalProperties: false "
                               "or a single pattern matching every key");
    if (all_keys) {
        addl = all_keys; /* the extra keys' schema */
        pprops = NULL;
    }
    if (json_object_get(s, "propertyNames")) return pt_fail(c->err, "\"propertyNames\" is not supported");
    static const char *const deps[] = {"dependencies", "dependentRequired", "dependentSchemas", NULL};
    for (int j = 0; deps[j]; j++)
        if (json_object_get(s, deps[j]))
            return pt_fail(c->err, "\"%s\" is not supported (a property that requires others: list "
                                   "them all in \"required\", or use anyOf of the two shapes)", deps[j]);
    if (json_object_get(s, "unevaluatedProperties"))
        return pt_fail(c->err, "\"unevaluatedProperties\" is not supported");
    /* A required name not listed in properties is an additional property
     * that must come: list it, with additionalProperties' schema. */
    json_t *own_props = NULL;
    size_t ri;
    json_t *rx;
    json_array_foreach(req, ri, rx) {
        if (!json_is_string(rx)) return pt_fail(c->err, "\"required\" must list strings");
        if (props && json_object_get(props, json_string_value(rx))) continue;
        if (json_is_false(addl)) {
            json_decref(own_props);
            return pt_fail(c->err, "required property \"%s\" is not allowed by additionalProperties: false",
                           json_string_value(rx));
        }
        if (!own_props) own_props = props ? json_copy(props) : json_object();
        json_object_set_new(own_props, json_string_value(rx), addl ? json_incref(addl) : json_true());
    }
    if (own_props) props = own_props;
    int np = props ? (int)json_object_size(props) : 0;
    int n_req = req ? (int)json_array_size(req) : 0;
    json_t *mnp = json_object_get(s, "minProperties"), *mxp = json_object_get(s, "maxProperties");
    if (mnp && (!json_is_integer(mnp) || json_integer_value(mnp) > n_req)) {
        json_decref(own_props);
        return pt_fail(c->err, "\"minProperties\" above the number of required properties is not supported");
    }
    if (mxp && (!json_is_integer(mxp) || !json_is_false(addl) || json_integer_value(mxp) < np)) {
        json_decref(own_props);
        return pt_fail(c->err, "\"maxProperties\" is not supported");
    }
    int *kv = pt_xcalloc((size_t)np + 1, sizeof *kv);
    bool *opt = pt_xcalloc((size_t)np + 1, 1);
    char **names = pt_xcalloc((size_t)np + 1, sizeof *names);
    const char *k;
    json_t *v;
    int i = 0, rc = 0;
    json_object_foreach(props, k, v) {
        int val;
        if (all_keys && !json_is_true(all_keys) && has_validation(all_keys)) { /* both apply */
            json_t *both = json_pack("{s:[O,O]}", "allOf", v, all_keys);
            rc = gen_at(c, both, &val, "properties", k);
            json_decref(both);
        } else {
            rc = gen_at(c, v, &val, "properties", k);
        }
        if (rc < 0) goto out;
        char *q = json_quote(k);
        gseq ks = {0};
        seq_lit(b, &ks, q, strlen(q));
        kv[i] = kv_rule(c, gb_rule_of(b, &ks), val);
        q[strlen(q) - 1] = 0;
        names[i] = pt_xstrdup(q + 1);
        free(q);
        opt[i] = !in_list(req, k);
        i++;
    }
    /* additional properties */
    int extra = -1;
    if (pprops && json_object_size(pprops)) { /* extra keys: those a pattern matches */
        extra = gb_rule(b);
        const char *pk;
        json_t *pv;
        json_object_foreach(pprops, pk, pv) {
            int key, val;
            if ((rc = pt_regex_rule(b, pk, true, false, &key, c->err)) < 0) {
                pt_failp(c->err, "patternProperties key \"%.40s\"", pk);
                goto out;
            }
            if ((rc = gen_at(c, pv, &val, "patternProperties", pk)) < 0) goto out;
            gseq q = {0};
            seq_ref(&q, kv_rule(c, quoted(c, key), val));
            gb_alt(b, extra, &q);
        }
    }
    if (!json_is_false(addl)) {
        int val;
        if (!addl || json_is_true(addl)) val = value_rule(c);
        else if ((rc = gen_at(c, addl, &val, "additionalProperties", NULL)) < 0)
            goto out;
        extra = kv_rule(c, key_except(c, names, np), val);
    }
    int ws = ws_rule(c);
    gseq cs = {0};
    seq_ref(&cs, ws);
    seq_byte(b, &cs, ',');
    seq_ref(&cs, ws);
    int comma = gb_rule_of(b, &cs);
    /* T[i][first]: properties i.. where `first` says no comma is needed */
    int next_first = -1, next_more = -1;
    {
        /* after all listed properties: (comma extra)* or, if first, (extra (comma extra)*)? */
        gseq e = {0};
        if (extra >= 0) {
            gseq ce = {0};
            seq_ref(&ce, comma);
            seq_ref(&ce, extra);
            int more = gb_star(b, gb_rule_of(b, &ce));
            next_more = more;
            gseq f = {0};
            seq_ref(&f, extra);
            seq_ref(&f, more);
            next_first = gb_opt(b, gb_rule_of(b, &f));
        } else {
            next_more = gb_rule_of(b, &e);
            next_first = gb_rule(b);
            gseq e2 = {0};
            gb_alt(b, next_first, &e2);
        }
    }
    if (np >= 2 && np <= ANY_ORDER_MAX) {
        /* Few properties: any order.  One rule pair per set of properties
         * already written (F: none yet, M: some, so a comma comes first);
         * each may come once; the object may close once the required ones
         * are in. */
        int nset = 1 << np, F[1 << ANY_ORDER_MAX], M[1 << ANY_ORDER_MAX];
        unsigned need = 0;
        for (int j = 0; j < np; j++) need |= opt[j] ? 0u : 1u << j;
        for (int S = 0; S < nset; S++) F[S] = gb_rule(b), M[S] = gb_rule(b);
        for (int S = 0; S < nset; S++) {
            gseq a = {0};
            for (int j = 0; j < np; j++) {
                if (S >> j & 1) continue;
                seq_ref(&a, kv[j]);
                seq_ref(&a, M[S | 1 << j]);
                gb_alt(b, F[S], &a);
                seq_ref(&a, comma);
                seq_ref(&a, kv[j]);
                seq_ref(&a, M[S | 1 << j]);
                gb_alt(b, M[S], &a);
            }
            if (((unsigned)S & need) == need) {
                seq_ref(&a, next_first);
                gb_alt(b, F[S], &a);
                seq_ref(&a, next_more);
                gb_alt(b, M[S], &a);
            }
        }
        next_first = F[0];
        np = -np; /* the ordered chain below is skipped; restored after */
    }
    for (int j = np - 1; j >= 0; j--) {
        int tf = gb_rule(b), tm = gb_rule(b);
        gseq a = {0};
        seq_ref(&a, kv[j]);
        seq_ref(&a, next_more);
        gb_alt(b, tf, &a);
        seq_ref(&a, comma);
        seq_ref(&a, kv[j]);
        seq_ref(&a, next_more);
        gb_alt(b, tm, &a);
        if (opt[j]) {
            seq_ref(&a, next_first);
            gb_alt(b, tf, &a);
            seq_ref(&a, next_more);
            gb_alt(b, tm, &a);
        }
        next_first = tf;
        next_more = tm;
    }
    if (np < 0) np = -np;
    gseq o = {0};
    seq_byte(b, &o, '{');
    seq_ref(&o, ws);
    seq_ref(&o, next_first);
    seq_ref(&o, ws);
    seq_byte(b, &o, '}');
    *rule = gb_rule_of(b, &o);
out:
    json_decref(own_props);
    for (int j = 0; j < np; j++) free(names[j]);
    free(names);
    free(kv);
    free(opt);
    return rc;
}

static int gen_array(sc *c, const json_t *s, int *rule) {
    json_t *items = json_object_get(s, "items"), *prefix = json_object_get(s, "prefixItems");
    json_t *addi = json_object_get(s, "additionalItems");
    if (json_is_true(json_object_get(s, "uniqueItems")))
        return pt_fail(c->err, "\"uniqueItems\" is not supported");
    if (json_object_get(s, "contains")) return pt_fail(c->err, "\"contains\" is not supported");
    if (json_object_get(s, "unevaluatedItems")) return pt_fail(c->err, "\"unevaluatedItems\" is not supported");
    const char *prefix_kw = "prefixItems", *items_kw = "items";
    if (json_is_array(items)) { /* draft 4 tuples */
        prefix = items;
        items = addi;
        prefix_kw = "items", items_kw = "additionalItems";
    }
    json_t *mn = json_object_get(s, "minItems"), *mx = json_object_get(s, "maxItems");
    if ((mn && !json_is_integer(mn)) || (mx && !json_is_integer(mx)))
        return pt_fail(c->err, "minItems/maxItems must be integers");
    long lo = mn ? (long)json_integer_value(mn) : 0, hi = mx ? (long)json_integer_value(mx) : -1;
    int n_pre = prefix ? (int)json_array_size(prefix) : 0;
    int *pre = pt_xcalloc((size_t)n_pre + 1, sizeof *pre);
    for (int i = 0; i < n_pre; i++)
        if (gen_at_i(c, json_array_get(prefix, (size_t)i), &pre[i], prefix_kw, (size_t)i) < 0) {
            free(pre);
            return -1;
        }
    int item;
    if (json_is_false(items)) {
        if (hi < 0 || hi > n_pre) hi = n_pre;
        item = gb_rule(c->b); /* derives nothing: no items past the prefix */
        if (lo > n_pre) {
            free(pre);
            return pt_fail(c->err, "minItems is larger than the tuple allows");
        }
    } else if (!items || json_is_true(items)) {
        item = value_rule(c);
    } else if (gen_at(c, items, &item, items_kw, NULL) < 0) {
        free(pre);
        return -1;
    }
    if (hi >= 0 && lo > hi) {
        free(pre);
        return pt_fail(c->err, "minItems > maxItems: no array is valid");
    }
    int r = list_rule(c, '[', ']', item, lo, hi, n_pre, pre);
    free(pre);
    if (r < 0) return -1;
    *rule = r;
    return 0;
}

/* --- references and combinators -------------------------------------------- */

static const json_t *resolve_ref(sc *c, const char *ref) {
    if (ref[0] != '#') return NULL;
    const json_t *cur = c->root;
    const char *p = ref + 1;
    if (*p && *p != '/') return NULL;
    while (*p == '/') {
        p++;
        char tok[512];
        size_t n = 0;
        while (*p && *p != '/' && n + 1 < sizeof tok) {
            if (p[0] == '~' && p[1] == '0') tok[n++] = '~', p += 2;
            else if (p[0] == '~' && p[1] == '1') tok[n++] = '/', p += 2;
            else if (p[0] == '%' && p[1] && p[2]) {
                char h[3] = {p[1], p[2], 0};
                tok[n++] = (char)strtol(h, NULL, 16);
                p += 3;
            } else tok[n++] = *p++;
        }
        tok[n] = 0;
        if (json_is_object(cur)) cur = json_object_get(cur, tok);
        else if (json_is_array(cur)) cur = json_array_get(cur, (size_t)strtoul(tok, NULL, 10));
        else return NULL;
        if (!cur) return NULL;
    }
    return cur;
}

static int gen_ref(sc *c, const char *ref, int *rule) {
    for (int i = 0; i < c->n_refs; i++)
        if (!strcmp(c->refs[i].ref, ref)) {
            *rule = c->refs[i].rule;
            return 0;
        }
    const json_t *t = resolve_ref(c, ref);
    if (!t) return pt_fail(c->err, "$ref \"%s\" cannot be resolved (only local refs are supported)", ref);
    if (c->n_refs == c->cap_refs) {
        c->cap_refs = c->cap_refs ? 2 * c->cap_refs : 16;
        c->refs = pt_xrealloc(c->refs, (size_t)c->cap_refs * sizeof *c->refs);
    }
    int r = gb_rule(c->b); /* registered first: recursion refers to it */
    c->refs[c->n_refs].ref = ref;
    c->refs[c->n_refs++].rule = r;
    /* errors inside the target name the target's path */
    int body, rc;
    char saved[sizeof c->path];
    size_t saved_len = c->path_len;
    memcpy(saved, c->path, sizeof saved);
    c->path_len = 0;
    c->path[0] = 0;
    const char *p = ref + 1; /* "#/$defs/a" -> "/$defs/a", kept as written */
    size_t n = strlen(p) < sizeof c->path - 1 ? strlen(p) : sizeof c->path - 1;
    memcpy(c->path, p, n);
    c->path[n] = 0;
    c->path_len = n;
    rc = gen(c, t, &body);
    memcpy(c->path, saved, sizeof saved);
    c->path_len = saved_len;
    if (rc < 0) return -1;
    gseq s = {0};
    seq_ref(&s, body);
    gb_alt(c->b, r, &s);
    *rule = r;
    return 0;
}

/* Keywords that only annotate: ignored. */
static bool is_annotation(const char *k) {
    static const char *const ann[] = {"title", "description", "default", "examples", "$comment", "$schema",
                                      "$id", "id", "$defs", "definitions", "deprecated", "readOnly",
                                      "writeOnly", "contentMediaType", "contentEncoding", "$anchor",
                                      "markdownDescription", "example", "x-", "strict", "discriminator",
                                      "xml", "externalDocs", "$vocabulary", "$dynamicAnchor", NULL};
    for (int i = 0; ann[i]; i++)
        if (!strcmp(k, ann[i])) return true;
    return !strncmp(k, "x-", 2);
}

static const json_t *deref(sc *c, const json_t *s) {
    for (int i = 0; i < 32 && json_is_object(s); i++) {
        json_t *r = json_object_get(s, "$ref");
        if (!json_is_string(r)) return s;
        /* a $ref alone (siblings only annotations) is its target */
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)s, k, v) if (strcmp(k, "$ref") && !is_annotation(k)) return s;
        const json_t *t = resolve_ref(c, json_string_value(r));
        if (!t) return s;
        s = t;
    }
    return s;
}

static json_t *type_list(const json_t *t) {
    json_t *l = json_array();
    if (json_is_string(t)) json_array_append_new(l, json_string(json_string_value(t)));
    else if (json_is_array(t)) {
        size_t i;
        json_t *x;
        json_array_foreach(t, i, x) json_array_append(l, x);
    }
    return l;
}

/* Merges schema b into a (allOf), for the keywords where the intersection
 * is again one schema.  -1 with err set on a conflict it cannot express. */
static int merge_into(sc *c, json_t *a, const json_t *b) {
    b = deref(c, b);
    if (json_is_true(b)) return 0;
    if (!json_is_object(b)) return pt_fail(c->err, "allOf with a false or non-object schema is not supported");
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)b, k, v) {
        json_t *old = json_object_get(a, k);
        if (is_annotation(k)) continue;
        if (!old) {
            json_object_set(a, k, v);
        } else if (json_equal(old, v)) {
            continue;
        } else if (!strcmp(k, "properties") && json_is_object(old) && json_is_object(v)) {
            json_t *np = json_deep_copy(old);
            const char *pk;
            json_t *pv;
            json_object_foreach(v, pk, pv) {
                json_t *po = json_object_get(np, pk);
                if (!po) json_object_set(np, pk, pv);
                else if (!json_equal(po, pv))
                    json_object_set_new(np, pk, json_pack("{s:[O,O]}", "allOf", po, pv));
            }
            json_object_set_new(a, k, np);
        } else if (!strcmp(k, "required") && json_is_array(old) && json_is_array(v)) {
            json_t *nr = json_deep_copy(old);
            size_t i;
            json_t *x;
            json_array_foreach(v, i, x) if (json_is_string(x) && !in_list(nr, json_string_value(x)))
                json_array_append(nr, x);
            json_object_set_new(a, k, nr);
        } else if (!strcmp(k, "type")) {
            json_t *la = type_list(old), *lb = type_list(v), *both = json_array();
            size_t i;
            json_t *x;
            json_array_foreach(la, i, x) {
                const char *t = json_string_value(x);
                if (t && (in_list(lb, t) || (!strcmp(t, "integer") && in_list(lb, "number"))))
                    json_array_append(both, x);
                else if (t && !strcmp(t, "number") && in_list(lb, "integer"))
                    json_array_append_new(both, json_string("integer"));
            }
            json_decref(la);
            json_decref(lb);
            if (!json_array_size(both)) {
                json_decref(both);
                return pt_fail(c->err, "allOf with disjoint types: no value is valid");
            }
            json_object_set_new(a, k, both);
        } else if (!strcmp(k, "minimum") || !strcmp(k, "minLength") || !strcmp(k, "minItems")) {
            if (json_number_value(v) > json_number_value(old)) json_object_set(a, k, v);
        } else if (!strcmp(k, "maximum") || !strcmp(k, "maxLength") || !strcmp(k, "maxItems")) {
            if (json_number_value(v) < json_number_value(old)) json_object_set(a, k, v);
        } else if (!strcmp(k, "allOf") && json_is_array(old) && json_is_array(v)) {
            json_t *na = json_deep_copy(old);
            json_array_extend(na, v);
            json_object_set_new(a, k, na);
        } else {
            return pt_fail(c->err, "allOf with conflicting \"%s\" is not supported", k);
        }
    }
    return 0;
}

static int gen_merged(sc *c, json_t *m, int *rule) {
    int rc = gen(c, m, rule);
    json_decref(m);
    return rc;
}

/* A copy of s without the keywords listed. */
static json_t *without(const json_t *s, const char *const *drop) {
    json_t *o = json_object();
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)s, k, v) {
        bool skip = false;
        for (int i = 0; drop[i]; i++) skip |= !strcmp(k, drop[i]);
        if (!skip) json_object_set(o, k, v);
    }
    return o;
}

static bool has_validation(const json_t *s) {
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)s, k, v) if (!is_annotation(k)) return true;
    return false;
}

static bool value_has_type(const json_t *v, const char *t) {
    if (!strcmp(t, "string")) return json_is_string(v);
    if (!strcmp(t, "integer")) return json_is_integer(v) || (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)));
    if (!strcmp(t, "number")) return json_is_number(v);
    if (!strcmp(t, "boolean")) return json_is_boolean(v);
    if (!strcmp(t, "null")) return json_is_null(v);
    if (!strcmp(t, "object")) return json_is_object(v);
    if (!strcmp(t, "array")) return json_is_array(v);
    return false;
}

/* minLength/maxLength and numeric bounds, checked on one listed value. */
static bool value_in_bounds(const json_t *s, const json_t *v) {
    json_t *x;
    if (json_is_string(v)) {
        long chars = 0;
        for (const unsigned char *p = (const unsigned char *)json_string_value(v); *p; p++)
            chars += (*p & 0xC0) != 0x80;
        if ((x = json_object_get(s, "minLength")) && json_is_number(x) && chars < json_number_value(x)) return false;
        if ((x = json_object_get(s, "maxLength")) && json_is_number(x) && chars > json_number_value(x)) return false;
    }
    if (json_is_number(v)) {
        double d = json_number_value(v);
        if ((x = json_object_get(s, "minimum")) && json_is_number(x) && d < json_number_value(x)) return false;
        if ((x = json_object_get(s, "maximum")) && json_is_number(x) && d > json_number_value(x)) return false;
        if ((x = json_object_get(s, "exclusiveMinimum")) && json_is_number(x) && d <= json_number_value(x)) return false;
        if ((x = json_object_get(s, "exclusiveMaximum")) && json_is_number(x) && d >= json_number_value(x)) return false;
    }
    return true;
}

static int gen_enum(sc *c, const json_t *s, const json_t *vals, int *rule) {
    json_t *types = json_object_get(s, "type");
    json_t *tl = types ? type_list(types) : NULL;
    int r = gb_rule(c->b); /* no value of the allowed types: derives nothing (no_value) */
    size_t i;
    json_t *v;
    json_array_foreach(vals, i, v) {
        if (tl) {
            bool ok = false;
            size_t j;
            json_t *t;
            json_array_foreach(tl, j, t) ok |= json_is_string(t) && value_has_type(v, json_string_value(t));
            if (!ok) continue;
        }
        if (!value_in_bounds(s, v)) continue;
        gseq q = {0};
        seq_ref(&q, const_rule(c, v));
        gb_alt(c->b, r, &q);
    }
    json_decref(tl);
    /* keywords that could rule out some values: those we cannot check on
     * the values are refused (unknown keywords only annotate) */
    static const char *const refuse[] = {"pattern", "format", "properties", "required", "items",
                                         "prefixItems", "minItems", "maxItems", "additionalProperties",
                                         "patternProperties", "multipleOf", "allOf", "anyOf", "oneOf",
                                         "not", "$ref", "uniqueItems", "contains", "minProperties",
                                         "maxProperties", "propertyNames", "dependencies",
                                         "dependentRequired", "dependentSchemas", "unevaluatedProperties",
                                         "unevaluatedItems", NULL};
    for (int j = 0; refuse[j]; j++)
        if (json_object_get(s, refuse[j]))
            return pt_fail(c->err, "\"%s\" beside \"enum\"/\"const\" is not supported", refuse[j]);
    *rule = r;
    return 0;
}

typedef int (*type_gen)(sc *c, const json_t *s, int *rule);

static int gen_bool(sc *c, const json_t *s, int *rule) {
    (void)s;
    if (c->boolean < 0) {
        c->boolean = gb_rule(c->b);
        gseq t = {0}, f = {0};
        seq_lit(c->b, &t, "true", 4);
        seq_lit(c->b, &f, "false", 5);
        gb_alt(c->b, c->boolean, &t);
        gb_alt(c->b, c->boolean, &f);
    }
    *rule = c->boolean;
    return 0;
}

static int gen_null(sc *c, const json_t *s, int *rule) {
    (void)s;
    if (c->null < 0) c->null = gb_lit_rule(c->b, "null");
    *rule = c->null;
    return 0;
}

static const struct { const char *name; type_gen fn; } type_table[] = {
    {"object", gen_object}, {"array", gen_array},   {"string", gen_string}, {"integer", gen_integer},
    {"number", gen_number}, {"boolean", gen_bool}, {"null", gen_null},
};

/* Keywords that constrain one type.  Without "type" they say nothing about
 * values of the other types: {"properties": {...}} also accepts "a string".
 * Every standard one is listed, so none is skipped unread: the generator of
 * its type enforces or refuses it. */
static const char *const implied[] = {
    "properties", "required", "additionalProperties", "patternProperties", "propertyNames", "minProperties",
    "maxProperties", "dependencies", "dependentRequired", "dependentSchemas", "unevaluatedProperties",
    "items", "prefixItems", "additionalItems", "minItems", "maxItems", "uniqueItems", "contains",
    "unevaluatedItems", "minLength", "maxLength", "pattern", "format", "minimum", "maximum",
    "exclusiveMinimum", "exclusiveMaximum",
};

static int gen_typed(sc *c, const json_t *s, int *rule) {
    json_t *types = json_object_get(s, "type");
    json_t *tl = type_list(types);
    if (!types) {
        bool any = false;
        for (size_t i = 0; i < sizeof implied / sizeof *implied; i++) any |= json_object_get(s, implied[i]) != NULL;
        if (!any) { /* no constraint at all */
            json_decref(tl);
            *rule = value_rule(c);
            return 0;
        }
        /* every type, each under the keywords for it */
        static const char *const all[] = {"object", "array", "string", "number", "boolean", "null"};
        for (size_t i = 0; i < sizeof all / sizeof *all; i++) json_array_append_new(tl, json_string(all[i]));
    }
    if (json_is_true(json_object_get(s, "nullable")) && !in_list(tl, "null"))
        json_array_append_new(tl, json_string("null"));
    if (in_list(tl, "integer") && in_list(tl, "number")) { /* number covers it */
        json_t *n = json_array();
        size_t i;
        json_t *x;
        json_array_foreach(tl, i, x) if (strcmp(json_string_value(x), "integer")) json_array_append(n, x);
        json_decref(tl);
        tl = n;
    }
    int r = gb_rule(c->b);
    size_t i;
    json_t *t;
    int rc = 0;
    json_array_foreach(tl, i, t) {
        const char *name = json_string_value(t);
        size_t j = 0;
        for (; name && j < sizeof type_table / sizeof *type_table; j++)
            if (!strcmp(type_table[j].name, name)) break;
        if (!name || j == sizeof type_table / sizeof *type_table) {
            rc = pt_fail(c->err, "unknown type \"%s\"", name ? name : "?");
            break;
        }
        int x;
        if ((rc = type_table[j].fn(c, s, &x)) < 0) break;
        gseq q = {0};
        seq_ref(&q, x);
        gb_alt(c->b, r, &q);
    }
    json_decref(tl);
    *rule = r;
    return rc;
}

/* --- oneOf: sound only when no value matches two branches ------------------ */

enum { T_NULL = 1, T_BOOL = 2, T_OBJ = 4, T_ARR = 8, T_STR = 16, T_NUM = 32, T_ALL = 63 };

static unsigned type_bit_of_value(const json_t *v) {
    return json_is_null(v) ? T_NULL : json_is_boolean(v) ? T_BOOL : json_is_object(v) ? T_OBJ
         : json_is_array(v) ? T_ARR : json_is_string(v) ? T_STR : T_NUM;
}

static unsigned type_bit_of_name(const char *t) {
    static const struct { const char *n; unsigned b; } tb[] = {
        {"null", T_NULL}, {"boolean", T_BOOL}, {"object", T_OBJ}, {"array", T_ARR},
        {"string", T_STR}, {"number", T_NUM}, {"integer", T_NUM}};
    for (size_t i = 0; t && i < sizeof tb / sizeof *tb; i++)
        if (!strcmp(tb[i].n, t)) return tb[i].b;
    return T_ALL;
}

/* The JSON types the schema's values may have (a superset). */
static unsigned types_of(sc *c, const json_t *s, int depth) {
    s = deref(c, s);
    if (!json_is_object(s) || depth > 20) return json_is_false(s) ? 0 : T_ALL;
    unsigned t = T_ALL;
    json_t *cn = json_object_get(s, "const"), *en = json_object_get(s, "enum");
    json_t *ty = json_object_get(s, "type"), *all = json_object_get(s, "allOf");
    json_t *any = json_object_get(s, "anyOf"), *one = json_object_get(s, "oneOf");
    size_t i;
    json_t *x;
    if (cn) t &= type_bit_of_value(cn);
    if (json_is_array(en)) {
        unsigned e = 0;
        json_array_foreach(en, i, x) e |= type_bit_of_value(x);
        t &= e;
    }
    if (json_is_string(ty)) t &= type_bit_of_name(json_string_value(ty));
    if (json_is_array(ty)) {
        unsigned e = 0;
        json_array_foreach(ty, i, x) e |= type_bit_of_name(json_string_value(x));
        t &= e;
    }
    if (json_is_true(json_object_get(s, "nullable")) && ty) t |= T_NULL;
    if (json_is_array(all)) json_array_foreach(all, i, x) t &= types_of(c, x, depth + 1);
    json_t *alts = json_is_array(any) ? any : json_is_array(one) ? one : NULL;
    if (alts) {
        unsigned e = 0;
        json_array_foreach(alts, i, x) e |= types_of(c, x, depth + 1);
        t &= e;
    }
    return t;
}

/* The schema's allowed values when it lists them (const / enum), else NULL. */
static const json_t *value_list(sc *c, const json_t *s, json_t **tmp) {
    s = deref(c, s);
    *tmp = NULL;
    if (!json_is_object(s)) return NULL;
    json_t *cn = json_object_get(s, "const"), *en = json_object_get(s, "enum");
    if (cn) return *tmp = json_pack("[O]", cn);
    return json_is_array(en) ? en : NULL;
}

static bool values_disjoint(sc *c, const json_t *a, const json_t *b) {
    json_t *ta, *tb;
    const json_t *la = value_list(c, a, &ta), *lb = value_list(c, b, &tb);
    bool dis = la && lb;
    size_t i, j;
    json_t *x, *y;
    if (dis) json_array_foreach(la, i, x) json_array_foreach(lb, j, y) if (json_equal(x, y)) dis = false;
    json_decref(ta);
    json_decref(tb);
    return dis;
}

/* No value can match both: different types, disjoint listed values, or
 * objects told apart by a required property with disjoint values. */
static bool disjoint(sc *c, const json_t *a, const json_t *b) {
    if (!(types_of(c, a, 0) & types_of(c, b, 0))) return true;
    if (values_disjoint(c, a, b)) return true;
    a = deref(c, a), b = deref(c, b);
    json_t *pa = json_object_get(a, "properties"), *pb = json_object_get(b, "properties");
    json_t *ra = json_object_get(a, "required"), *rb = json_object_get(b, "required");
    const char *k;
    json_t *v;
    if (json_is_object(pa) && json_is_object(pb))
        json_object_foreach(pa, k, v) {
            json_t *w = json_object_get(pb, k);
            if (w && in_list(ra, k) && in_list(rb, k) && disjoint(c, v, w)) return true;
        }
    return false;
}

static int gen(sc *c, const json_t *s, int *rule) {
    if (++c->depth > 100) return pt_fail(c->err, "schema nests too deeply");
    int rc = 0;
    if (json_is_true(s) || (json_is_object(s) && !has_validation(s))) {
        *rule = value_rule(c);
        goto out;
    }
    if (!json_is_object(s)) {
        if (json_is_false(s)) *rule = no_value(c);
        else rc = pt_fail(c->err, "schema must be an object or a boolean");
        goto out;
    }
    /* then/else without if apply to nothing: not refused */
    static const char *const refused[] = {"not", "if", "$dynamicRef", "$recursiveRef", "multipleOf", NULL};
    for (int i = 0; refused[i]; i++)
        if (json_object_get(s, refused[i])) {
            json_t *m = json_object_get(s, "multipleOf"), *ty = json_object_get(s, "type");
            bool one = json_is_number(m) && json_number_value(m) == 1;
            if (!strcmp(refused[i], "multipleOf") && one && json_is_string(ty)) {
                if (!strcmp(json_string_value(ty), "integer")) continue;
                if (!strcmp(json_string_value(ty), "number")) { /* a whole number: an integer */
                    static const char *const drop_m[] = {"multipleOf", NULL};
                    json_t *w = without(s, drop_m);
                    json_object_set_new(w, "type", json_string("integer"));
                    int ir;
                    if ((rc = gen_merged(c, w, &ir)) == 0) { /* 10 or 10.0 */
                        gseq q = {0};
                        seq_ref(&q, ir);
                        seq_ref(&q, frac_rule(c, 2));
                        *rule = gb_rule_of(c->b, &q);
                    }
                    goto out;
                }
            }
            rc = pt_fail(c->err, "\"%s\" is not supported", refused[i]);
            goto out;
        }
    json_t *ref = json_object_get(s, "$ref");
    json_t *all = json_object_get(s, "allOf");
    json_t *any = json_object_get(s, "anyOf");
    json_t *one = json_object_get(s, "oneOf");
    static const char *const drop_ref[] = {"$ref", NULL}, *const drop_all[] = {"allOf", NULL};
    static const char *const drop_any[] = {"anyOf", NULL}, *const drop_one[] = {"oneOf", NULL};
    if (json_is_string(ref)) {
        json_t *rest = without(s, drop_ref);
        if (!has_validation(rest)) {
            json_decref(rest);
            rc = gen_ref(c, json_string_value(ref), rule);
            goto out;
        }
        json_t *m = json_object();
        const json_t *t = resolve_ref(c, json_string_value(ref));
        if (!t) rc = pt_fail(c->err, "$ref \"%s\" cannot be resolved", json_string_value(ref));
        if (rc == 0) rc = merge_into(c, m, rest);
        if (rc == 0) rc = merge_into(c, m, t);
        json_decref(rest);
        if (rc < 0) {
            json_decref(m);
            goto out;
        }
        rc = gen_merged(c, m, rule);
        goto out;
    }
    if (json_is_array(all)) {
        json_t *m = without(s, drop_all);
        size_t i;
        json_t *x;
        json_array_foreach(all, i, x) if ((rc = merge_into(c, m, x)) < 0) {
            json_decref(m);
            goto out;
        }
        rc = gen_merged(c, m, rule);
        goto out;
    }
    if (json_is_array(any) || json_is_array(one)) {
        json_t *alts = json_is_array(any) ? any : one;
        if (json_is_array(any) && json_is_array(one)) {
            rc = pt_fail(c->err, "anyOf together with oneOf is not supported");
            goto out;
        }
        for (size_t i = 0; alts == one && i < json_array_size(one); i++)
            for (size_t j = i + 1; j < json_array_size(one); j++)
                if (!disjoint(c, json_array_get(one, i), json_array_get(one, j))) {
                    rc = pt_fail(c->err, "oneOf whose branches %zu and %zu may both match is not "
                                         "supported (use anyOf if either may)", i, j);
                    goto out;
                }
        json_t *rest = without(s, json_is_array(any) ? drop_any : drop_one);
        bool plain = !has_validation(rest);
        int r = gb_rule(c->b);
        size_t i;
        json_t *x;
        json_array_foreach(alts, i, x) {
            int xr;
            const char *kw = json_is_array(any) ? "anyOf" : "oneOf";
            if (plain) {
                rc = gen_at_i(c, x, &xr, kw, i);
            } else {
                json_t *m = json_deep_copy(rest);
                rc = merge_into(c, m, x);
                if (rc == 0) rc = gen_at_i(c, m, &xr, kw, i);
                json_decref(m);
            }
            if (rc < 0) break;
            gseq q = {0};
            seq_ref(&q, xr);
            gb_alt(c->b, r, &q);
        }
        json_decref(rest);
        *rule = r;
        goto out;
    }
    json_t *en = json_object_get(s, "enum"), *cn = json_object_get(s, "const");
    if (cn) {
        json_t *one_val = json_pack("[O]", cn);
        rc = gen_enum(c, s, one_val, rule);
        json_decref(one_val);
        goto out;
    }
    if (en) {
        if (!json_is_array(en)) rc = pt_fail(c->err, "\"enum\" must be an array");
        else rc = gen_enum(c, s, en, rule);
        goto out;
    }
    rc = gen_typed(c, s, rule);
out:
    if (rc < 0 && !c->err_at) { /* the innermost schema that failed */
        memcpy(c->err_path, c->path, sizeof c->err_path);
        c->err_at = true;
    }
    c->depth--;
    return rc;
}

int pt_grammar_from_schema(pt_grammar **out, const json_t *schema, pt_err *err) {
    return pt_grammar_from_schema_ws(out, schema, 20, err);
}

/* The grammar of one value of schema, or with open/close (not NULL) of
 * value (close (open value close)*)?: the first value's opening markup is
 * the prompt's; after a close comes the end or another opening. */
static int compile(pt_grammar **out, const json_t *schema, int ws_max, const char *open, const char *close,
                   pt_err *err) {
    if (json_is_false(schema)) return pt_fail(err, "schema false allows no value");
    gbuild b;
    gb_init(&b);
    sc c = {.b = &b, .root = schema, .err = err, .ws_max = ws_max < 0 ? 0 : ws_max};
    c.ws = c.value = c.string = c.str_char = c.str_body = c.number = c.integer = c.boolean = c.null = -1;
    c.any_obj = c.any_arr = -1;
    int body, rc = gen(&c, schema, &body);
    if (rc == 0) {
        gseq s = {0};
        /* leading whitespace is allowed; none after the value, so a finished
         * value leaves only the end of generation */
        seq_ref(&s, ws_rule(&c));
        seq_ref(&s, body);
        if (open) {
            gseq more = {0}, tail = {0};
            seq_lit(&b, &more, open, strlen(open));
            seq_ref(&more, ws_rule(&c));
            seq_ref(&more, body);
            seq_lit(&b, &more, close, strlen(close));
            seq_lit(&b, &tail, close, strlen(close));
            seq_ref(&tail, gb_star(&b, gb_rule_of(&b, &more)));
            seq_ref(&s, gb_opt(&b, gb_rule_of(&b, &tail)));
        }
        rc = gb_finish(&b, gb_rule_of(&b, &s), out, err);
    } else if (err && c.err_at) {
        size_t n = strlen(err->msg);
        snprintf(err->msg + n, sizeof err->msg - n, " (at #%s)", c.err_path);
    }
    free(c.refs);
    gb_free(&b);
    return rc;
}

int pt_grammar_from_schema_ws(pt_grammar **out, const json_t *schema, int ws_max, pt_err *err) {
    return compile(out, schema, ws_max, NULL, NULL, err);
}

int pt_grammar_from_schema_calls(pt_grammar **out, const json_t *schema, int ws_max, const char *open,
                                 const char *close, pt_err *err) {
    return compile(out, schema, ws_max, open, close, err);
}

int pt_grammar_from_schema_text(pt_grammar **out, const char *text, size_t len, pt_err *err) {
    json_error_t je;
    json_t *s = json_loadb(text, len, JSON_DECODE_ANY, &je);
    if (!s) return pt_fail(err, "JSON schema: %s (line %d)", je.text, je.line);
    int rc = pt_grammar_from_schema(out, s, err);
    json_decref(s);
    return rc;
}
