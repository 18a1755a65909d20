/*
 * jinja_builtin.c - what templates can call: filters (`x | trim`), tests
 * (`x is string`), methods (`s.startswith('a')`, `d.items()`) and globals
 * (`namespace`, `range`, `raise_exception`, `strftime_now`).
 *
 * The set is the reference's, and so is each one's behaviour, even where it
 * differs from Python: `s.strip('\n')` ignores its argument and strips all
 * whitespace; `x | int` on a float floors it; `title` only uppercases the
 * first ASCII letter of each word.  Filters are chosen by the operand's
 * type; a filter that the reference does not have for that type is an
 * error here too (docs/chat-templates.md lists them).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "tokenizer/jinja_int.h"

static jv mkfunc(jj_render *R, jj_builtin_fn fn, jv self, const char *name) {
    jfunc *f = jj_zalloc(&R->arena, sizeof *f);
    f->fn = fn;
    f->self = self;
    f->name = name;
    return (jv){.kind = JV_FUNC, .f = f};
}

static jv kwarg(jmap *kw, const char *name, bool *found) {
    jv *v = kw ? jj_map_get(kw, name, strlen(name)) : NULL;
    *found = v != NULL;
    return v ? *v : jv_undef();
}

/* args[i] ?? kw[name] ?? dflt, as the reference picks option values. */
static jv option(jlist *args, size_t i, jmap *kw, const char *name, jv dflt) {
    if (args && i < args->n) return args->v[i];
    bool found;
    jv v = kwarg(kw, name, &found);
    return found ? v : dflt;
}

static jv str_result(jj_buf *b) { return jv_strv(jj_buf_str(b)); }

/* ---- string methods ---- */

static jv m_upper(jj_render *R, const jj_node *at, jv self, jv *a, size_t n) {
    jj_buf b;
    jj_buf_init(&b, &R->arena);
    jj_case_map(self.s->s, self.s->len, true, &b);
    return str_result(&b);
}

static jv m_lower(jj_render *R, const jj_node *at, jv self, jv *a, size_t n) {
    jj_buf b;
    jj_buf_init(&b, &R->arena);
    jj_case_map(self.s->s, self.s->len, false, &b);
    return str_result(&b);
}

static jv m_title(jj_render *R, const jj_node *at, jv self, jv *a, size_t n) {
    jj_buf b;
    jj_buf_init(&b, &R->arena);
    jj_title(self.s->s, self.s->len, &b);
    return str_result(&b);
}

static jv m_capitalize(jj_render *R, const jj_node *at, jv self, jv *a, size_t n) {
    jj_buf b;
    jj_buf_init(&b, &R->arena);
    jj_capitalize(self.s->s, self.s->len, &b);
    return str_result(&b);
}

static jv trimmed(jj_render *R, jv self, bool start, bool end) {
    size_t b, e;
    jj_trim(self.s->s, self.s->len, start, end, &b, &e);
    return jv_str(R, self.s->s + b, e - b);
}

/* strip/lstrip/rstrip ignore their argument, as in the reference */
static jv m_strip(jj_render *R, const jj_node *at, jv self, jv *a, size_t n) { return trimmed(R, self, true, true); }
static jv m_lstrip(jj_render *R, const jj_node *at, jv self, jv *a, size_t n) { return trimmed(R, self, true, false); }
static jv m_rstrip(jj_render *R, const jj_node *at, jv self, jv *a, size_t n) { return trimmed(R, self, false, true); }

static bool affix(const jstr *s, const jstr *p, bool prefix) {
    if (p->len > s->len) return false;
    return memcmp(prefix ? s->s : s->s + s->len - p->len, p->s, p->len) == 0;
}

static jv starts_ends(jj_render *R, const jj_node *at, jv self, jv *a, size_t n, bool prefix) {
    const char *name = prefix ? "startswith" : "endswith";
    if (n == 0) jj_fail(R, at, "%s() requires at least one argument", name);
    if (a[0].kind == JV_STR) return jv_bool(affix(self.s, a[0].s, prefix));
    if (!jv_is_list(a[0])) jj_fail(R, at, "%s() argument must be a string or tuple of strings", name);
    for (size_t i = 0; i < a[0].l->n; i++) {
        jv item = a[0].l->v[i];
        if (item.kind != JV_STR) jj_fail(R, at, "%s() tuple elements must be strings", name);
        if (affix(self.s, item.s, prefix)) return jv_bool(true);
    }
    return jv_bool(false);
}

static jv m_startswith(jj_render *R, const jj_node *at, jv self, jv *a, size_t n) { return starts_ends(R, at, self, a, n, true); }
static jv m_endswith(jj_render *R, const jj_node *at, jv self, jv *a, size_t n) { return starts_ends(R, at, self, a, n, false); }

/* split() without a separator: runs of whitespace separate, no empty parts;
 * past maxsplit parts the rest of the text is the last part. */
static jv split_space(jj_render *R, const jstr *s, double maxsplit) {
    jlist *l = jj_list_new(R, 4);
    size_t i, e, k;
    jj_trim(s->s, s->len, true, false, &i, &e);
    while (i < s->len) {
        size_t start = i;
        while (i < s->len && !jj_js_space_at(s->s, s->len, i)) i++;
        if (maxsplit != -1 && (double)l->n >= maxsplit) {
            jj_list_push(R, l, jv_str(R, s->s + start, s->len - start));
            break;
        }
        jj_list_push(R, l, jv_str(R, s->s + start, i - start));
        while ((k = jj_js_space_at(s->s, s->len, i)) > 0) i += k;
    }
    return jv_list(l, JV_ARRAY);
}

static jv m_split(jj_render *R, const jj_node *at, jv self, jv *a, size_t n) {
    jv sep = n > 0 ? a[0] : jv_null();
    if (sep.kind != JV_STR && sep.kind != JV_NULL) jj_fail(R, at, "sep argument must be a string or null");
    jv maxsplit = n > 1 ? a[1] : jv_int(-1);
    if (maxsplit.kind != JV_INT) jj_fail(R, at, "maxsplit argument must be a number");
    const jstr *s = self.s;
    if (sep.kind == JV_NULL) return split_space(R, s, maxsplit.n);
    if (sep.s->len == 0) jj_fail(R, at, "empty separator");
    /* JS split on every occurrence, then Python's maxsplit by splice+join */
    jlist *parts = jj_list_new(R, 4);
    size_t pos = 0;
    for (;;) {
        const char *hit = memmem(s->s + pos, s->len - pos, sep.s->s, sep.s->len);
        size_t end = hit ? (size_t)(hit - s->s) : s->len;
        jj_list_push(R, parts, jv_str(R, s->s + pos, end - pos));
        if (!hit) break;
        pos = end + sep.s->len;
    }
    double m = maxsplit.n;
    if (m != -1 && (double)parts->n > m) {
        size_t keep = m >= 0 ? (size_t)m : (size_t)fmax((double)parts->n + m, 0);
        jj_buf rest;
        jj_buf_init(&rest, &R->arena);
        for (size_t i = keep; i < parts->n; i++) {
            if (i > keep) jj_buf_add(&rest, sep.s->s, sep.s->len);
            jj_buf_add(&rest, parts->v[i].s->s, parts->v[i].s->len);
        }
        parts->n = keep;
        jj_list_push(R, parts, str_result(&rest));
    }
    return jv_list(parts, JV_ARRAY);
}

/* utils.replace: at most count replacements (all if null or negative);
 * an empty `old` matches before every character and at the end. */
static jstr *replace(jj_render *R, const jstr *s, const jstr *old, const jstr *new, double count) {
    if (count == 0) return (jstr *)s;
    double left = count < 0 || isnan(count) ? INFINITY : count;
    jj_buf b;
    jj_buf_init(&b, &R->arena);
    if (old->len == 0) {
        for (size_t i = 0; i <= s->len;) {
            if (left > 0) jj_buf_add(&b, new->s, new->len), left--;
            if (i == s->len) break;
            uint32_t cp;
            size_t k = (size_t)jj_utf8_dec(s->s + i, s->len - i, &cp);
            jj_buf_add(&b, s->s + i, k);
            i += k;
        }
        return jj_buf_str(&b);
    }
    size_t pos = 0;
    while (left > 0) {
        const char *hit = memmem(s->s + pos, s->len - pos, old->s, old->len);
        if (!hit) break;
        size_t at = (size_t)(hit - s->s);
        jj_buf_add(&b, s->s + pos, at - pos);
        jj_buf_add(&b, new->s, new->len);
        pos = at + old->len;
        left--;
    }
    jj_buf_add(&b, s->s + pos, s->len - pos);
    return jj_buf_str(&b);
}

static jv m_replace(jj_render *R, const jj_node *at, jv self, jv *a, size_t n) {
    if (n < 2) jj_fail(R, at, "replace() requires at least two arguments");
    if (a[0].kind != JV_STR || a[1].kind != JV_STR) jj_fail(R, at, "replace() arguments must be strings");
    jv count = jv_null();
    if (n > 2) {
        bool found;
        count = a[2].kind == JV_KWARGS ? kwarg(a[2].m, "count", &found) : a[2];
        if (a[2].kind == JV_KWARGS && !found) count = jv_null();
    }
    if (count.kind != JV_INT && count.kind != JV_NULL) jj_fail(R, at, "replace() count argument must be a number or null");
    return jv_strv(replace(R, self.s, a[0].s, a[1].s, count.kind == JV_NULL ? -1 : count.n));
}

/* ---- dict methods ---- */

static jv pair(jj_render *R, jstr *k, jv v) {
    jlist *p = jj_list_new(R, 2);
    jj_list_push(R, p, jv_strv(k));
    jj_list_push(R, p, v);
    return jv_list(p, JV_ARRAY);
}

static jv m_get(jj_render *R, const jj_node *at, jv self, jv *a, size_t n) {
    if (n == 0 || a[0].kind != JV_STR)
        jj_fail(R, at, "Object key must be a string: got %s", n ? jv_type_name(a[0]) : "nothing");
    jv *v = jj_map_get(self.m, a[0].s->s, a[0].s->len);
    return v ? *v : n > 1 ? a[1] : jv_null();
}

static jv m_items(jj_render *R, const jj_node *at, jv self, jv *a, size_t n) {
    jlist *l = jj_list_new(R, self.m->n);
    for (size_t i = 0; i < self.m->n; i++) jj_list_push(R, l, pair(R, self.m->k[i], self.m->v[i]));
    return jv_list(l, JV_ARRAY);
}

static jv m_keys(jj_render *R, const jj_node *at, jv self, jv *a, size_t n) {
    jlist *l = jj_list_new(R, self.m->n);
    for (size_t i = 0; i < self.m->n; i++) jj_list_push(R, l, jv_strv(self.m->k[i]));
    return jv_list(l, JV_ARRAY);
}

static jv m_values(jj_render *R, const jj_node *at, jv self, jv *a, size_t n) {
    jlist *l = jj_list_new(R, self.m->n);
    for (size_t i = 0; i < self.m->n; i++) jj_list_push(R, l, self.m->v[i]);
    return jv_list(l, JV_ARRAY);
}

/* Stable merge sort of values by a key, with jv_compare (which may fail). */
typedef struct sort_ctx {
    jj_render *R;
    const jj_node *at;
    bool case_sensitive, reverse;
} sort_ctx;

static int sort_cmp(sort_ctx *c, jv a, jv b) {
    int r = jv_compare(c->R, c->at, a, b, c->case_sensitive);
    return c->reverse ? -r : r;
}

static void merge_sort(sort_ctx *c, jv *items, jv *keys, jv *ti, jv *tk, size_t n) {
    if (n < 2) return;
    size_t h = n / 2;
    merge_sort(c, items, keys, ti, tk, h);
    merge_sort(c, items + h, keys + h, ti, tk, n - h);
    size_t i = 0, j = h, o = 0;
    while (i < h && j < n) {
        if (sort_cmp(c, keys[j], keys[i]) < 0)
            ti[o] = items[j], tk[o++] = keys[j++];
        else
            ti[o] = items[i], tk[o++] = keys[i++];
    }
    while (i < h) ti[o] = items[i], tk[o++] = keys[i++];
    while (j < n) ti[o] = items[j], tk[o++] = keys[j++];
    memcpy(items, ti, n * sizeof *items);
    memcpy(keys, tk, n * sizeof *keys);
}

static jv sorted(jj_render *R, sort_ctx *c, jv *items, jv *keys, size_t n) {
    jlist *l = jj_list_new(R, n);
    jv *it = jj_alloc(&R->arena, (n + 1) * sizeof(jv)), *ks = jj_alloc(&R->arena, (n + 1) * sizeof(jv));
    jv *ti = jj_alloc(&R->arena, (n + 1) * sizeof(jv)), *tk = jj_alloc(&R->arena, (n + 1) * sizeof(jv));
    if (n) {
        memcpy(it, items, n * sizeof(jv));
        memcpy(ks, keys, n * sizeof(jv));
    }
    jj_step(R, c->at, n);
    merge_sort(c, it, ks, ti, tk, n);
    for (size_t i = 0; i < n; i++) jj_list_push(R, l, it[i]);
    return jv_list(l, JV_ARRAY);
}

static jv m_dictsort(jj_render *R, const jj_node *at, jv self, jv *a, size_t n) {
    jlist pos = {0, 0, a};
    jmap *kw = NULL;
    for (size_t i = 0; i < n; i++)
        if (a[i].kind == JV_KWARGS) kw = a[i].m;
    pos.n = n - (kw ? 1 : 0); /* the reference filters keywords out; they come last */
    jv cs = option(&pos, 0, kw, "case_sensitive", jv_bool(false));
    if (cs.kind != JV_BOOL) jj_fail(R, at, "case_sensitive must be a boolean");
    jv by = option(&pos, 1, kw, "by", jv_cstr(R, "key"));
    if (by.kind != JV_STR) jj_fail(R, at, "by must be a string");
    if (!jj_str_is(by.s, "key") && !jj_str_is(by.s, "value")) jj_fail(R, at, "by must be either 'key' or 'value'");
    jv rev = option(&pos, 2, kw, "reverse", jv_bool(false));
    if (rev.kind != JV_BOOL) jj_fail(R, at, "reverse must be a boolean");
    size_t m = self.m->n;
    jv *items = jj_alloc(&R->arena, (m + 1) * sizeof(jv)), *keys = jj_alloc(&R->arena, (m + 1) * sizeof(jv));
    bool by_key = jj_str_is(by.s, "key");
    for (size_t i = 0; i < m; i++) {
        items[i] = pair(R, self.m->k[i], self.m->v[i]);
        keys[i] = by_key ? jv_strv(self.m->k[i]) : self.m->v[i];
    }
    sort_ctx c = {R, at, cs.b, rev.b};
    return sorted(R, &c, items, keys, m);
}

/* ---- member access: `s.upper`, `d.items`, `l.length` ---- */

typedef struct method {
    const char *name;
    jj_builtin_fn fn;
} method;

static const method STRING_METHODS[] = {
    {"upper", m_upper}, {"lower", m_lower}, {"strip", m_strip}, {"title", m_title},
    {"capitalize", m_capitalize}, {"rstrip", m_rstrip}, {"lstrip", m_lstrip},
    {"startswith", m_startswith}, {"endswith", m_endswith}, {"split", m_split},
    {"replace", m_replace},
};

static const method DICT_METHODS[] = {
    {"get", m_get}, {"items", m_items}, {"keys", m_keys}, {"values", m_values}, {"dictsort", m_dictsort},
};

static jj_builtin_fn find_method(const method *t, size_t n, const char *name, size_t len) {
    for (size_t i = 0; i < n; i++)
        if (strlen(t[i].name) == len && memcmp(t[i].name, name, len) == 0) return t[i].fn;
    return NULL;
}

jv jj_member_builtin(jj_render *R, const jj_node *at, jv obj, const char *name, size_t n) {
    jj_builtin_fn fn = NULL;
    if (obj.kind == JV_STR) {
        if (n == 6 && memcmp(name, "length", 6) == 0) return jv_int((double)jj_utf16_len(obj.s->s, obj.s->len));
        fn = find_method(STRING_METHODS, PT_ARRAY_LEN(STRING_METHODS), name, n);
    } else if (jv_is_list(obj)) {
        if (n == 6 && memcmp(name, "length", 6) == 0) return jv_int((double)obj.l->n);
    } else if (jv_is_map(obj)) {
        fn = find_method(DICT_METHODS, PT_ARRAY_LEN(DICT_METHODS), name, n);
    }
    return fn ? mkfunc(R, fn, obj, "method") : jv_undef();
}

/* ---- tests ---- */

static bool is_lower_upper(jj_render *R, jv v, bool upper) {
    if (v.kind != JV_STR) return false;
    jj_buf b;
    jj_buf_init(&b, &R->arena);
    jj_case_map(v.s->s, v.s->len, upper, &b);
    return b.n == v.s->len && (b.n == 0 || memcmp(b.p, v.s->s, b.n) == 0);
}

typedef bool (*test_fn)(jj_render *R, const jj_node *at, jv v, jv *other);

static bool t_boolean(jj_render *R, const jj_node *at, jv v, jv *o) { return v.kind == JV_BOOL; }
static bool t_callable(jj_render *R, const jj_node *at, jv v, jv *o) { return v.kind == JV_FUNC; }
static bool t_false(jj_render *R, const jj_node *at, jv v, jv *o) { return v.kind == JV_BOOL && !v.b; }
static bool t_true(jj_render *R, const jj_node *at, jv v, jv *o) { return v.kind == JV_BOOL && v.b; }
static bool t_none(jj_render *R, const jj_node *at, jv v, jv *o) { return v.kind == JV_NULL; }
static bool t_string(jj_render *R, const jj_node *at, jv v, jv *o) { return v.kind == JV_STR; }
static bool t_number(jj_render *R, const jj_node *at, jv v, jv *o) { return jv_is_num(v); }
static bool t_integer(jj_render *R, const jj_node *at, jv v, jv *o) { return v.kind == JV_INT; }
/* not tuples, not dicts: the reference compares type names */
static bool t_iterable(jj_render *R, const jj_node *at, jv v, jv *o) { return v.kind == JV_ARRAY || v.kind == JV_STR; }
static bool t_mapping(jj_render *R, const jj_node *at, jv v, jv *o) { return jv_is_map(v); }
static bool t_sequence(jj_render *R, const jj_node *at, jv v, jv *o) {
    return jv_is_list(v) || jv_is_map(v) || v.kind == JV_STR;
}
static bool t_lower(jj_render *R, const jj_node *at, jv v, jv *o) { return is_lower_upper(R, v, false); }
static bool t_upper(jj_render *R, const jj_node *at, jv v, jv *o) { return is_lower_upper(R, v, true); }
static bool t_defined(jj_render *R, const jj_node *at, jv v, jv *o) { return v.kind != JV_UNDEF; }
static bool t_undefined(jj_render *R, const jj_node *at, jv v, jv *o) { return v.kind == JV_UNDEF; }

static bool parity(jj_render *R, const jj_node *at, jv v, bool odd) {
    if (v.kind != JV_INT) jj_fail(R, at, "cannot %s on %s", odd ? "odd" : "even", jv_type_name(v));
    return (fmod(v.n, 2) != 0) == odd;
}
static bool t_odd(jj_render *R, const jj_node *at, jv v, jv *o) { return parity(R, at, v, true); }
static bool t_even(jj_render *R, const jj_node *at, jv v, jv *o) { return parity(R, at, v, false); }

static bool t_equalto(jj_render *R, const jj_node *at, jv v, jv *o) {
    if (!o) jj_fail(R, at, "test equalto needs a value to compare with");
    return jv_strict_eq(v, *o);
}

static const struct {
    const char *name;
    test_fn fn;
} TESTS[] = {
    {"boolean", t_boolean}, {"callable", t_callable}, {"odd", t_odd}, {"even", t_even},
    {"false", t_false}, {"true", t_true}, {"none", t_none}, {"string", t_string},
    {"number", t_number}, {"integer", t_integer}, {"iterable", t_iterable}, {"mapping", t_mapping},
    {"sequence", t_sequence}, {"lower", t_lower}, {"upper", t_upper}, {"defined", t_defined},
    {"undefined", t_undefined}, {"equalto", t_equalto}, {"eq", t_equalto},
};

/* args[0] is tested; args[1], when n > 1, is the value equalto compares to. */
bool jj_apply_test(jj_render *R, const jj_node *at, const jstr *name, jv *args, size_t n) {
    for (size_t i = 0; i < PT_ARRAY_LEN(TESTS); i++)
        if (jj_str_is(name, TESTS[i].name)) return TESTS[i].fn(R, at, args[0], n > 1 ? &args[1] : NULL);
    jj_fail(R, at, "Unknown test: %s", name->s);
}

/* ---- filters ---- */

static jv attribute_path(jj_render *R, jv item, const jstr *path) {
    size_t start = 0;
    for (;;) {
        const char *dot = memchr(path->s + start, '.', path->len - start);
        size_t end = dot ? (size_t)(dot - path->s) : path->len;
        const char *part = path->s + start;
        size_t plen = end - start;
        if (jv_is_attr(item)) {
            jv *v = jj_map_get(item.m, part, plen);
            item = v ? *v : jv_undef();
        } else if (jv_is_list(item)) {
            double idx = jj_parse_int(part, plen);
            if (isnan(idx) || idx < 0 || idx >= (double)item.l->n) return jv_undef();
            item = item.l->v[(size_t)idx];
        } else {
            return jv_undef();
        }
        if (!dot) return item;
        start = end + 1;
    }
}

static jv join_list(jj_render *R, jv list, const jstr *sep) {
    jj_buf b;
    jj_buf_init(&b, &R->arena);
    for (size_t i = 0; i < list.l->n; i++) {
        if (i && sep) jj_buf_add(&b, sep->s, sep->len);
        jv x = list.l->v[i];
        if (x.kind != JV_NULL && x.kind != JV_UNDEF) jv_raw_to_string(R, x, &b); /* Array.join */
    }
    return str_result(&b);
}

static jv to_json_str(jj_render *R, jv v, const jj_json_opts *o) {
    jj_buf b;
    jj_buf_init(&b, &R->arena);
    jv_to_json(R, v, o, &b);
    return str_result(&b);
}

static void add_spaces(jj_buf *b, double n) {
    char spaces[64];
    memset(spaces, ' ', sizeof spaces);
    for (; n >= 64; n -= 64) jj_buf_add(b, spaces, 64); /* huge widths hit the memory cap */
    jj_buf_add(b, spaces, (size_t)n);
}

static jv indent_lines(jj_render *R, const jj_node *at, const jstr *s, double width, bool first, bool blank) {
    if (width < 0) jj_fail(R, at, "Invalid count value: %g", width);
    jj_buf b;
    jj_buf_init(&b, &R->arena);
    size_t start = 0, line = 0;
    for (;;) {
        const char *nl = memchr(s->s + start, '\n', s->len - start);
        size_t end = nl ? (size_t)(nl - s->s) : s->len;
        if (!((!first && line == 0) || (!blank && end == start))) add_spaces(&b, width);
        jj_buf_add(&b, s->s + start, end - start);
        if (!nl) break;
        jj_buf_addc(&b, '\n');
        start = end + 1;
        line++;
    }
    return str_result(&b);
}

static jv unique(jj_render *R, jv list) {
    jlist *l = jj_list_new(R, list.l->n);
    for (size_t i = 0; i < list.l->n; i++) {
        jv x = list.l->v[i];
        bool seen = false;
        jj_step(R, NULL, l->n);
        for (size_t j = 0; j < l->n && !seen; j++) {
            jv y = l->v[j];
            seen = jv_strict_eq(x, y) || (jv_is_num(x) && jv_is_num(y) && isnan(x.n) && isnan(y.n));
        }
        if (!seen) jj_list_push(R, l, x);
    }
    return jv_list(l, JV_ARRAY);
}

/* Filters without arguments, one table per operand type (the reference
 * picks the filter by the operand's type first). */
typedef jv (*plain_fn)(jj_render *R, const jj_node *at, jv v);

typedef struct plain_filter {
    const char *name;
    plain_fn fn;
} plain_filter;

static jv pf_self(jj_render *R, const jj_node *at, jv v) { return v; }
static jv pf_list_length(jj_render *R, const jj_node *at, jv v) { return jv_int((double)v.l->n); }
static jv pf_list_join(jj_render *R, const jj_node *at, jv v) { return join_list(R, v, NULL); }
static jv pf_unique(jj_render *R, const jj_node *at, jv v) { return unique(R, v); }

/* `[] | first` is JavaScript's undefined, which eval_filter deals with */
static jv end_item(jj_render *R, jv v, bool first) {
    if (v.l->n == 0) {
        R->hole = true;
        return jv_undef();
    }
    return v.l->v[first ? 0 : v.l->n - 1];
}
static jv pf_first(jj_render *R, const jj_node *at, jv v) { return end_item(R, v, true); }
static jv pf_last(jj_render *R, const jj_node *at, jv v) { return end_item(R, v, false); }

static jv pf_reverse(jj_render *R, const jj_node *at, jv v) {
    jlist *l = jj_list_new(R, v.l->n);
    for (size_t i = v.l->n; i-- > 0;) jj_list_push(R, l, v.l->v[i]);
    return jv_list(l, JV_ARRAY);
}

static jv pf_sort(jj_render *R, const jj_node *at, jv v) {
    sort_ctx c = {R, at, false, false};
    return sorted(R, &c, v.l->v, v.l->v, v.l->n);
}

static jv pf_list_string(jj_render *R, const jj_node *at, jv v) {
    jj_json_opts o = {0};
    return to_json_str(R, v, &o);
}

static const plain_filter LIST_FILTERS[] = {
    {"list", pf_self}, {"first", pf_first}, {"last", pf_last}, {"length", pf_list_length},
    {"reverse", pf_reverse}, {"sort", pf_sort}, {"join", pf_list_join}, {"string", pf_list_string},
    {"unique", pf_unique},
};

static jv pf_str_length(jj_render *R, const jj_node *at, jv v) { return jv_int((double)jj_utf16_len(v.s->s, v.s->len)); }
static jv pf_upper(jj_render *R, const jj_node *at, jv v) { return m_upper(R, at, v, NULL, 0); }
static jv pf_lower(jj_render *R, const jj_node *at, jv v) { return m_lower(R, at, v, NULL, 0); }
static jv pf_title(jj_render *R, const jj_node *at, jv v) { return m_title(R, at, v, NULL, 0); }
static jv pf_capitalize(jj_render *R, const jj_node *at, jv v) { return m_capitalize(R, at, v, NULL, 0); }
static jv pf_trim(jj_render *R, const jj_node *at, jv v) { return trimmed(R, v, true, true); }
static jv pf_indent(jj_render *R, const jj_node *at, jv v) { return indent_lines(R, at, v.s, 4, false, false); }

static jv pf_str_int(jj_render *R, const jj_node *at, jv v) {
    double x = jj_parse_int(v.s->s, v.s->len);
    return jv_int(isnan(x) ? 0 : x);
}

static jv pf_str_float(jj_render *R, const jj_node *at, jv v) {
    double x = jj_parse_float(v.s->s, v.s->len);
    return jv_float(isnan(x) ? 0 : x);
}

static const plain_filter STRING_FILTERS[] = {
    {"length", pf_str_length}, {"upper", pf_upper}, {"lower", pf_lower}, {"title", pf_title},
    {"capitalize", pf_capitalize}, {"trim", pf_trim}, {"indent", pf_indent}, {"join", pf_self},
    {"string", pf_self}, {"int", pf_str_int}, {"float", pf_str_float},
};

static jv pf_abs(jj_render *R, const jj_node *at, jv v) { return v.kind == JV_INT ? jv_int(fabs(v.n)) : jv_float(fabs(v.n)); }
static jv pf_num_int(jj_render *R, const jj_node *at, jv v) { return jv_int(floor(v.n)); }
static jv pf_num_float(jj_render *R, const jj_node *at, jv v) { return jv_float(v.n); }
static jv pf_num_string(jj_render *R, const jj_node *at, jv v) { return jv_strv(jv_stringify(R, v)); }

static const plain_filter NUMBER_FILTERS[] = {
    {"abs", pf_abs}, {"int", pf_num_int}, {"float", pf_num_float}, {"string", pf_num_string},
};

static jv pf_bool_int(jj_render *R, const jj_node *at, jv v) { return jv_int(v.b); }
static jv pf_bool_float(jj_render *R, const jj_node *at, jv v) { return jv_float(v.b); }
static jv pf_bool_string(jj_render *R, const jj_node *at, jv v) { return jv_cstr(R, v.b ? "true" : "false"); }

static const plain_filter BOOL_FILTERS[] = {
    {"bool", pf_self}, {"int", pf_bool_int}, {"float", pf_bool_float}, {"string", pf_bool_string},
};

static jv pf_dict_items(jj_render *R, const jj_node *at, jv v) { return m_items(R, at, v, NULL, 0); }
static jv pf_dict_length(jj_render *R, const jj_node *at, jv v) { return jv_int((double)v.m->n); }

static const plain_filter DICT_FILTERS[] = {
    {"items", pf_dict_items}, {"length", pf_dict_length},
};

static plain_fn find_plain(const plain_filter *t, size_t n, const jstr *name) {
    for (size_t i = 0; i < n; i++)
        if (jj_str_is(name, t[i].name)) return t[i].fn;
    return NULL;
}

#define FIND_PLAIN(table, name) find_plain(table, PT_ARRAY_LEN(table), name)

static jv plain_filter_apply(jj_render *R, const jj_node *at, jv v, const jstr *name) {
    const char *f = name->s;
    if (!strcmp(f, "safe")) return v;
    if (!strcmp(f, "tojson")) {
        jj_json_opts o = {.undef_as_null = true};
        return to_json_str(R, v, &o);
    }
    plain_fn fn = NULL;
    const char *type = NULL;
    if (jv_is_list(v)) {
        fn = FIND_PLAIN(LIST_FILTERS, name), type = "ArrayValue";
    } else if (v.kind == JV_STR) {
        fn = FIND_PLAIN(STRING_FILTERS, name), type = "StringValue";
    } else if (jv_is_num(v)) {
        fn = FIND_PLAIN(NUMBER_FILTERS, name), type = "NumericValue";
    } else if (v.kind == JV_BOOL) {
        fn = FIND_PLAIN(BOOL_FILTERS, name), type = "BooleanValue";
    } else if (jv_is_map(v)) {
        fn = FIND_PLAIN(DICT_FILTERS, name), type = "ObjectValue";
        /* then the dict methods, called without arguments */
        jj_builtin_fn m = fn ? NULL : find_method(DICT_METHODS, PT_ARRAY_LEN(DICT_METHODS), name->s, name->len);
        if (m) return m(R, at, v, NULL, 0);
    }
    if (fn) return fn(R, at, v);
    if (type) jj_fail(R, at, "Unknown %s filter: %s", type, f);
    jj_fail(R, at, "Cannot apply filter \"%s\" to type: %s", f, jv_type_name(v));
}

static jv f_tojson(jj_render *R, const jj_node *at, jv v, jmap *kw) {
    bool found;
    jj_json_opts o = {.undef_as_null = true};
    jv indent = kwarg(kw, "indent", &found);
    if (found && indent.kind != JV_INT && indent.kind != JV_NULL) jj_fail(R, at, "If set, indent must be a number");
    if (indent.kind == JV_INT) {
        if (indent.n < 0) jj_fail(R, at, "Invalid count value: %g", indent.n);
        if (indent.n > 1000) jj_fail(R, at, "tojson indent %g is too large", indent.n);
        o.indent = (int)indent.n;
    }
    jv ascii = kwarg(kw, "ensure_ascii", &found);
    if (found && ascii.kind != JV_BOOL) jj_fail(R, at, "If set, ensure_ascii must be a boolean");
    o.ascii = found && ascii.b;
    jv sort = kwarg(kw, "sort_keys", &found);
    if (found && sort.kind != JV_BOOL) jj_fail(R, at, "If set, sort_keys must be a boolean");
    o.sort_keys = found && sort.b;
    jv seps = kwarg(kw, "separators", &found);
    if (found && jv_is_list(seps)) {
        if (seps.l->n != 2 || seps.l->v[0].kind != JV_STR || seps.l->v[1].kind != JV_STR)
            jj_fail(R, at, "separators must be a tuple of two strings");
        o.item_sep = seps.l->v[0].s;
        o.key_sep = seps.l->v[1].s;
    } else if (found && seps.kind != JV_NULL) {
        jj_fail(R, at, "If set, separators must be a tuple of two strings");
    }
    return to_json_str(R, v, &o);
}

static jv f_join(jj_render *R, const jj_node *call, jv v, jenv *env) {
    if (v.kind != JV_STR && !jv_is_list(v)) jj_fail(R, call, "Cannot apply filter \"join\" to type: %s", jv_type_name(v));
    jlist *args;
    jmap *kw;
    jj_eval_args(R, call, env, &args, &kw);
    jv sep = option(args, 0, kw, "separator", jv_cstr(R, ""));
    if (sep.kind != JV_STR) jj_fail(R, call, "separator must be a string");
    if (jv_is_list(v)) return join_list(R, v, sep.s);
    jj_buf b; /* a string joins its characters */
    jj_buf_init(&b, &R->arena);
    for (size_t i = 0; i < v.s->len;) {
        uint32_t cp;
        size_t k = (size_t)jj_utf8_dec(v.s->s + i, v.s->len - i, &cp);
        if (i) jj_buf_add(&b, sep.s->s, sep.s->len);
        jj_buf_add(&b, v.s->s + i, k);
        i += k;
    }
    return str_result(&b);
}

static jv f_int_float(jj_render *R, const jj_node *at, jv v, jlist *args, jmap *kw, bool is_int) {
    jv dflt = option(args, 0, kw, "default", is_int ? jv_int(0) : jv_float(0));
    if (v.kind == JV_STR) {
        double x = is_int ? jj_parse_int(v.s->s, v.s->len) : jj_parse_float(v.s->s, v.s->len);
        return isnan(x) ? dflt : is_int ? jv_int(x) : jv_float(x);
    }
    if (jv_is_num(v)) return v;
    if (v.kind == JV_BOOL) return is_int ? jv_int(v.b) : jv_float(v.b);
    jj_fail(R, at, "Cannot apply filter \"%s\" to type: %s", is_int ? "int" : "float", jv_type_name(v));
}

static jv f_sort(jj_render *R, const jj_node *at, jv v, jlist *args, jmap *kw) {
    jv rev = option(args, 0, kw, "reverse", jv_bool(false));
    if (rev.kind != JV_BOOL) jj_fail(R, at, "reverse must be a boolean");
    jv cs = option(args, 1, kw, "case_sensitive", jv_bool(false));
    if (cs.kind != JV_BOOL) jj_fail(R, at, "case_sensitive must be a boolean");
    jv attr = option(args, 2, kw, "attribute", jv_null());
    if (attr.kind != JV_STR && attr.kind != JV_INT && attr.kind != JV_NULL)
        jj_fail(R, at, "attribute must be a string, integer, or null");
    size_t n = v.l->n;
    jv *keys = jj_alloc(&R->arena, (n + 1) * sizeof(jv));
    jstr *path = attr.kind == JV_NULL ? NULL : jv_stringify(R, attr);
    if (attr.kind == JV_INT) {
        char num[32];
        path = jj_cstr(&R->arena, jj_num_fmt(attr.n, num));
    }
    for (size_t i = 0; i < n; i++) keys[i] = path ? attribute_path(R, v.l->v[i], path) : v.l->v[i];
    sort_ctx c = {R, at, cs.b, rev.b};
    return sorted(R, &c, v.l->v, keys, n);
}

static jv f_selectattr(jj_render *R, const jj_node *call, jv v, jenv *env, bool select) {
    const char *name = select ? "selectattr" : "rejectattr";
    for (size_t i = 0; i < v.l->n; i++)
        if (!jv_is_attr(v.l->v[i])) jj_fail(R, call, "`%s` can only be applied to array of objects", name);
    for (size_t i = 0; i < call->n; i++)
        if (call->list[i]->kind != N_STR) jj_fail(R, call, "arguments of `%s` must be strings", name);
    const jstr *attr = call->n > 0 ? call->list[0]->str : NULL;
    const jstr *test = call->n > 1 ? call->list[1]->str : NULL;
    jv tv[2] = {jv_undef(), call->n > 2 ? jv_strv(call->list[2]->str) : jv_undef()};
    if (!attr && v.l->n) jj_fail(R, call, "`%s` needs an attribute name", name);
    jlist *l = jj_list_new(R, v.l->n);
    for (size_t i = 0; i < v.l->n; i++) {
        jv *a = jj_map_get(v.l->v[i].m, attr->s, attr->len);
        bool r = false;
        if (a) {
            tv[0] = *a;
            r = test ? jj_apply_test(R, call, test, tv, call->n > 2 ? 2 : 1) : jv_truthy(*a);
        }
        if (r == select) jj_list_push(R, l, v.l->v[i]);
    }
    return jv_list(l, JV_ARRAY);
}

static jv f_map(jj_render *R, const jj_node *at, jv v, jmap *kw) {
    bool has_attr, has_default;
    jv attr = kwarg(kw, "attribute", &has_attr);
    if (!has_attr) jj_fail(R, at, "`map` expressions without `attribute` set are not currently supported.");
    if (attr.kind != JV_STR) jj_fail(R, at, "attribute must be a string");
    jv dflt = kwarg(kw, "default", &has_default);
    jlist *l = jj_list_new(R, v.l->n);
    for (size_t i = 0; i < v.l->n; i++) {
        if (!jv_is_attr(v.l->v[i])) jj_fail(R, at, "items in map must be an object");
        jv x = attribute_path(R, v.l->v[i], attr.s);
        jj_list_push(R, l, x.kind == JV_UNDEF && has_default ? dflt : x);
    }
    return jv_list(l, JV_ARRAY);
}

static jv call_filter(jj_render *R, jv v, const jj_node *call, jenv *env) {
    if (call->a->kind != N_IDENT) jj_fail(R, call, "Unknown filter: %s", "expression");
    const char *f = call->a->str->s;
    if (!strcmp(f, "join")) return f_join(R, call, v, env);
    if (!strcmp(f, "selectattr") || !strcmp(f, "rejectattr")) {
        if (!jv_is_list(v)) jj_fail(R, call, "Cannot apply filter \"%s\" to type: %s", f, jv_type_name(v));
        return f_selectattr(R, call, v, env, f[0] == 's');
    }
    jlist *args;
    jmap *kw;
    jj_eval_args(R, call, env, &args, &kw);
    if (!strcmp(f, "tojson")) return f_tojson(R, call, v, kw);
    if (!strcmp(f, "int") || !strcmp(f, "float")) return f_int_float(R, call, v, args, kw, f[0] == 'i');
    if (!strcmp(f, "default")) {
        jv dflt = args->n > 0 ? args->v[0] : jv_cstr(R, "");
        jv boolean = option(args, 1, kw, "boolean", jv_bool(false));
        if (boolean.kind != JV_BOOL) jj_fail(R, call, "`default` filter flag must be a boolean");
        return v.kind == JV_UNDEF || (boolean.b && !jv_truthy(v)) ? dflt : v;
    }
    if (jv_is_list(v)) {
        if (!strcmp(f, "sort")) return f_sort(R, call, v, args, kw);
        if (!strcmp(f, "map")) return f_map(R, call, v, kw);
        jj_fail(R, call, "Unknown ArrayValue filter: %s", f);
    }
    if (v.kind == JV_STR) {
        if (!strcmp(f, "indent")) {
            jv width = option(args, 0, kw, "width", jv_int(4));
            if (width.kind != JV_INT) jj_fail(R, call, "width must be a number");
            jv first = option(args, 1, kw, "first", jv_bool(false));
            jv blank = option(args, 2, kw, "blank", jv_bool(false));
            return indent_lines(R, call, v.s, width.n, jv_js_truthy(first), jv_js_truthy(blank));
        }
        if (!strcmp(f, "replace")) {
            /* the reference always passes the keywords, even when empty */
            jj_list_push(R, args, jv_map(kw ? kw : jj_map_new(R, 0), JV_KWARGS));
            return m_replace(R, call, v, args->v, args->n);
        }
        jj_fail(R, call, "Unknown StringValue filter: %s", f);
    }
    if (jv_is_map(v)) {
        jj_builtin_fn fn = find_method(DICT_METHODS, PT_ARRAY_LEN(DICT_METHODS), f, strlen(f));
        if (!fn) jj_fail(R, call, "Unknown ObjectValue filter: %s", f);
        if (kw && kw->n) jj_list_push(R, args, jv_map(kw, JV_KWARGS));
        return fn(R, call, v, args->v, args->n);
    }
    jj_fail(R, call, "Cannot apply filter \"%s\" to type: %s", f, jv_type_name(v));
}

jv jj_apply_filter(jj_render *R, jv operand, const jj_node *filter, jenv *env) {
    if (filter->kind == N_IDENT) return plain_filter_apply(R, filter, operand, filter->str);
    return call_filter(R, operand, filter, env);
}

/* ---- globals ---- */

static jv g_raise_exception(jj_render *R, const jj_node *at, jv self, jv *a, size_t n) {
    jj_buf b;
    jj_buf_init(&b, &R->arena);
    /* new Error(x).message; none is undefined there too, so "" */
    if (n > 0 && a[0].kind != JV_UNDEF && a[0].kind != JV_NULL) jv_raw_to_string(R, a[0], &b);
    jj_raise(R, b.p ? b.p : "", b.n);
}

static jv g_range(jj_render *R, const jj_node *at, jv self, jv *a, size_t n) {
    if (n && a[n - 1].kind == JV_KWARGS) n--;
    if (n < 1 || n > 3) jj_fail(R, at, "range() takes 1 to 3 arguments");
    for (size_t i = 0; i < n; i++)
        if (!jv_is_num(a[i])) jj_fail(R, at, "range() arguments must be numbers, got %s", jv_type_name(a[i]));
    double start = n == 1 ? 0 : a[0].n, stop = n == 1 ? a[0].n : a[1].n, step = n == 3 ? a[2].n : 1;
    if (step == 0) jj_fail(R, at, "range() step must not be zero");
    jlist *l = jj_list_new(R, 0);
    for (double i = start; step > 0 ? i < stop : i > stop; i += step) {
        jj_step(R, at, 1);
        jj_list_push(R, l, trunc(i) == i ? jv_int(i) : jv_float(i));
    }
    return jv_list(l, JV_ARRAY);
}

/* The reference's strftime: %Y %m %d %b %B %H %M %% in local time, English
 * month names; any other %x is left as it is. */
static jv g_strftime_now(jj_render *R, const jj_node *at, jv self, jv *a, size_t n) {
    static const char *months[] = {"January", "February", "March", "April", "May", "June", "July",
                                   "August", "September", "October", "November", "December"};
    if (n < 1 || a[0].kind != JV_STR) jj_fail(R, at, "strftime_now() needs a format string");
    struct tm tm;
    time_t now = R->opts.now;
    localtime_r(&now, &tm);
    const jstr *f = a[0].s;
    jj_buf b;
    jj_buf_init(&b, &R->arena);
    for (size_t i = 0; i < f->len; i++) {
        char tmp[32];
        if (f->s[i] != '%' || i + 1 >= f->len || !f->s[i + 1] || !strchr("YmdbBHM%", f->s[i + 1])) {
            jj_buf_addc(&b, f->s[i]);
            continue;
        }
        switch (f->s[++i]) {
        case 'Y': snprintf(tmp, sizeof tmp, "%d", tm.tm_year + 1900); break;
        case 'm': snprintf(tmp, sizeof tmp, "%02d", tm.tm_mon + 1); break;
        case 'd': snprintf(tmp, sizeof tmp, "%02d", tm.tm_mday); break;
        case 'b': snprintf(tmp, sizeof tmp, "%.3s", months[tm.tm_mon]); break;
        case 'B': snprintf(tmp, sizeof tmp, "%s", months[tm.tm_mon]); break;
        case 'H': snprintf(tmp, sizeof tmp, "%02d", tm.tm_hour); break;
        case 'M': snprintf(tmp, sizeof tmp, "%02d", tm.tm_min); break;
        default: snprintf(tmp, sizeof tmp, "%%"); break;
        }
        jj_buf_adds(&b, tmp);
    }
    return str_result(&b);
}

/* One [key, value] entry of namespace()'s positional argument. */
static void namespace_entry(jj_render *R, const jj_node *at, jmap *m, jv pairv) {
    jv k, v;
    if (jv_is_list(pairv) && pairv.l->n == 2) {
        k = pairv.l->v[0], v = pairv.l->v[1];
    } else if (pairv.kind == JV_STR) { /* a two-character string is a pair */
        uint32_t cp;
        const jstr *s = pairv.s;
        size_t k1 = s->len ? (size_t)jj_utf8_dec(s->s, s->len, &cp) : 0;
        size_t k2 = k1 < s->len ? (size_t)jj_utf8_dec(s->s + k1, s->len - k1, &cp) : 0;
        if (!k1 || !k2 || k1 + k2 != s->len)
            jj_fail(R, at, "namespace expected an object or an iterable of [key, value] pairs");
        k = jv_str(R, s->s, k1), v = jv_str(R, s->s + k1, k2);
    } else {
        jj_fail(R, at, "namespace expected an object or an iterable of [key, value] pairs");
    }
    if (k.kind != JV_STR) jj_fail(R, at, "namespace keys must be strings");
    jj_map_set(R, m, k.s, v);
}

static jv g_namespace(jj_render *R, const jj_node *at, jv self, jv *a, size_t n) {
    jmap *kw = n && a[n - 1].kind == JV_KWARGS ? a[--n].m : NULL;
    if (n > 1) jj_fail(R, at, "namespace expected at most 1 argument, got %zu", n);
    jmap *m = jj_map_new(R, 4);
    if (n == 1) {
        jv src = a[0];
        if (jv_is_map(src)) {
            for (size_t i = 0; i < src.m->n; i++) jj_map_set(R, m, src.m->k[i], src.m->v[i]);
        } else if (jv_is_list(src)) {
            for (size_t i = 0; i < src.l->n; i++) namespace_entry(R, at, m, src.l->v[i]);
        } else {
            jj_fail(R, at, "'%s' object is not iterable", jv_type_name(src));
        }
    }
    for (size_t i = 0; kw && i < kw->n; i++) jj_map_set(R, m, kw->k[i], kw->v[i]);
    return jv_map(m, JV_NS);
}

void jj_setup_globals(jj_render *R, jenv *env) {
    static const struct { const char *name; jj_builtin_fn fn; } fns[] = {
        {"namespace", g_namespace}, {"raise_exception", g_raise_exception},
        {"range", g_range}, {"strftime_now", g_strftime_now},
    };
    for (size_t i = 0; i < PT_ARRAY_LEN(fns); i++)
        jj_env_set(R, env, jj_cstr(&R->arena, fns[i].name), mkfunc(R, fns[i].fn, jv_undef(), fns[i].name));
    static const char *consts[] = {"false", "true", "none", "False", "True", "None"};
    for (size_t i = 0; i < PT_ARRAY_LEN(consts); i++) {
        char c = consts[i][0];
        jv v = c == 'n' || c == 'N' ? jv_null() : jv_bool(c == 't' || c == 'T');
        jj_env_set(R, env, jj_cstr(&R->arena, consts[i]), v);
    }
}
