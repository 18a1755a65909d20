/*
 * jinja_value.c - the arena and the run-time values of the Jinja
 * interpreter: building them, converting JSON input to them, and the
 * reference's rules for turning them into text (toString, String(value),
 * tojson), for truth, equality and ordering.
 *
 * Those rules are JavaScript's, because the reference runs on JavaScript
 * values: `{{ 1.0 }}` prints "1.0" but `{{ "x" ~ 1.0 }}` prints "x1",
 * `[1] == [1]` is false (identity) and `"1" == 1` is true (coercion).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "tokenizer/jinja_int.h"

/* ---- arena ---- */

struct jj_chunk {
    jj_chunk *next;
    size_t size, used;
    _Alignas(16) unsigned char data[];
};

enum { CHUNK_SIZE = 64 * 1024 - 64 };

static jj_chunk *chunk_new(jj_arena *a, size_t size) {
    jj_chunk *c = malloc(sizeof *c + size);
    if (!c) {
        if (a->oom) a->oom(a->oom_ctx); /* does not return */
        fprintf(stderr, "petrel: out of memory (jinja arena)\n");
        abort();
    }
    c->size = size;
    c->used = 0;
    return c;
}

void *jj_alloc(jj_arena *a, size_t n) {
    if (n > SIZE_MAX / 4 || (a->cap && a->used + n + 16 > a->cap)) {
        if (a->oom) a->oom(a->oom_ctx);
        abort();
    }
    n = (n + 15) & ~(size_t)15;
    a->used += n;
    jj_chunk *c = a->head;
    if (c && c->size - c->used >= n) {
        void *p = c->data + c->used;
        c->used += n;
        return p;
    }
    if (n > CHUNK_SIZE / 4 && c) {
        /* a big block gets a chunk of its own behind the current one, so
         * the space left in the current one is not thrown away */
        jj_chunk *big = chunk_new(a, n);
        big->used = n;
        big->next = c->next;
        c->next = big;
        return big->data;
    }
    c = chunk_new(a, n > CHUNK_SIZE ? n : CHUNK_SIZE);
    c->next = a->head;
    a->head = c;
    c->used = n;
    return c->data;
}

void *jj_zalloc(jj_arena *a, size_t n) {
    void *p = jj_alloc(a, n);
    memset(p, 0, n);
    return p;
}

/* Grows the most recent allocation in place when it is at the end of the
 * current chunk; returns false when it is not. */
static bool arena_extend(jj_arena *a, void *p, size_t old, size_t want) {
    jj_chunk *c = a->head;
    old = (old + 15) & ~(size_t)15;
    want = (want + 15) & ~(size_t)15;
    if (!c || (unsigned char *)p + old != c->data + c->used || c->size - c->used < want - old)
        return false;
    if (a->cap && a->used + (want - old) + 16 > a->cap) return false;
    c->used += want - old;
    a->used += want - old;
    return true;
}

void jj_arena_free(jj_arena *a) {
    jj_chunk *c = a->head;
    while (c) {
        jj_chunk *next = c->next;
        free(c);
        c = next;
    }
    a->head = NULL;
    a->used = 0;
}

/* ---- strings and buffers ---- */

jstr *jj_str(jj_arena *a, const char *s, size_t len) {
    jstr *r = jj_alloc(a, sizeof *r + len + 1);
    r->len = len;
    if (len) memcpy(r->s, s, len);
    r->s[len] = 0;
    return r;
}

jstr *jj_cstr(jj_arena *a, const char *s) { return jj_str(a, s, strlen(s)); }

void jj_buf_init(jj_buf *b, jj_arena *a) {
    b->arena = a;
    b->p = NULL;
    b->n = b->cap = 0;
}

static void buf_reserve(jj_buf *b, size_t more) {
    if (b->cap - b->n >= more) return;
    size_t want = b->n + more;
    if (want < b->n) jj_alloc(b->arena, SIZE_MAX); /* overflow: fails */
    size_t cap = b->cap ? b->cap : 64;
    while (cap < want) cap = cap > SIZE_MAX / 4 ? want : cap * 2;
    if (b->p && arena_extend(b->arena, b->p, b->cap, cap)) {
        b->cap = cap;
        return;
    }
    char *p = jj_alloc(b->arena, cap);
    if (b->n) memcpy(p, b->p, b->n);
    b->p = p;
    b->cap = cap;
}

void jj_buf_add(jj_buf *b, const char *s, size_t n) {
    if (n == 0) return;
    buf_reserve(b, n);
    memcpy(b->p + b->n, s, n);
    b->n += n;
}

void jj_buf_addc(jj_buf *b, char c) {
    buf_reserve(b, 1);
    b->p[b->n++] = c;
}

void jj_buf_add_cp(jj_buf *b, uint32_t cp) {
    char u[4];
    size_t n;
    if (cp >= 0xD800 && cp < 0xE000) cp = 0xFFFD;
    if (cp < 0x80) {
        u[0] = (char)cp, n = 1;
    } else if (cp < 0x800) {
        u[0] = (char)(0xC0 | (cp >> 6)), u[1] = (char)(0x80 | (cp & 0x3F)), n = 2;
    } else if (cp < 0x10000) {
        u[0] = (char)(0xE0 | (cp >> 12)), u[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        u[2] = (char)(0x80 | (cp & 0x3F)), n = 3;
    } else {
        u[0] = (char)(0xF0 | (cp >> 18)), u[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        u[2] = (char)(0x80 | ((cp >> 6) & 0x3F)), u[3] = (char)(0x80 | (cp & 0x3F)), n = 4;
    }
    jj_buf_add(b, u, n);
}

jstr *jj_buf_str(jj_buf *b) { return jj_str(b->arena, b->p ? b->p : "", b->n); }

/* ---- lists and maps ---- */

jv jv_str(jj_render *R, const char *s, size_t n) { return jv_strv(jj_str(&R->arena, s, n)); }
jv jv_cstr(jj_render *R, const char *s) { return jv_str(R, s, strlen(s)); }

jlist *jj_list_new(jj_render *R, size_t cap) {
    jlist *l = jj_alloc(&R->arena, sizeof *l);
    l->n = 0;
    l->cap = cap;
    l->v = cap ? jj_alloc(&R->arena, cap * sizeof(jv)) : NULL;
    return l;
}

void jj_list_push(jj_render *R, jlist *l, jv v) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 4;
        jv *nv = jj_alloc(&R->arena, cap * sizeof(jv));
        if (l->n) memcpy(nv, l->v, l->n * sizeof(jv));
        l->v = nv;
        l->cap = cap;
    }
    l->v[l->n++] = v;
}

jv jv_list(jlist *l, jv_kind kind) { return (jv){.kind = kind, .l = l}; }

jmap *jj_map_new(jj_render *R, size_t cap) {
    jmap *m = jj_alloc(&R->arena, sizeof *m);
    m->n = 0;
    m->cap = cap;
    m->k = cap ? jj_alloc(&R->arena, cap * sizeof(jstr *)) : NULL;
    m->v = cap ? jj_alloc(&R->arena, cap * sizeof(jv)) : NULL;
    return m;
}

jv *jj_map_get(const jmap *m, const char *k, size_t n) {
    for (size_t i = 0; i < m->n; i++)
        if (jj_str_eq(m->k[i], k, n)) return &m->v[i];
    return NULL;
}

void jj_map_set(jj_render *R, jmap *m, jstr *k, jv v) {
    jv *slot = jj_map_get(m, k->s, k->len);
    if (slot) {
        *slot = v;
        return;
    }
    if (m->n == m->cap) {
        size_t cap = m->cap ? m->cap * 2 : 4;
        jstr **nk = jj_alloc(&R->arena, cap * sizeof(jstr *));
        jv *nv = jj_alloc(&R->arena, cap * sizeof(jv));
        if (m->n) {
            memcpy(nk, m->k, m->n * sizeof(jstr *));
            memcpy(nv, m->v, m->n * sizeof(jv));
        }
        m->k = nk, m->v = nv, m->cap = cap;
    }
    m->k[m->n] = k;
    m->v[m->n++] = v;
}

bool jj_map_del(jmap *m, const char *k, size_t n) {
    for (size_t i = 0; i < m->n; i++)
        if (jj_str_eq(m->k[i], k, n)) {
            memmove(m->k + i, m->k + i + 1, (m->n - i - 1) * sizeof(jstr *));
            memmove(m->v + i, m->v + i + 1, (m->n - i - 1) * sizeof(jv));
            m->n--;
            return true;
        }
    return false;
}

jv jv_map(jmap *m, jv_kind kind) { return (jv){.kind = kind, .m = m}; }

/* ---- JSON input ---- */

/* JavaScript objects list keys that are array indices ("0", "17") first,
 * in numeric order, then the rest in insertion order; JSON.parse builds
 * such objects, so the reference sees context dicts in that order. */
static bool index_key(const char *k, size_t n, double *val) {
    if (n == 0 || n > 10 || (n > 1 && k[0] == '0')) return false;
    double v = 0;
    for (size_t i = 0; i < n; i++) {
        if (k[i] < '0' || k[i] > '9') return false;
        v = v * 10 + (k[i] - '0');
    }
    *val = v;
    return v < 4294967295.0;
}

static jv object_from_json(jj_render *R, const json_t *j, int depth) {
    size_t n = json_object_size(j), n_idx = 0;
    jmap *m = jj_map_new(R, n);
    const char *key;
    json_t *val;
    double iv;
    json_object_foreach((json_t *)j, key, val) {
        if (index_key(key, strlen(key), &iv)) n_idx++;
    }
    if (n_idx) {
        /* insertion sort of the few index keys by value */
        const char **ks = jj_alloc(&R->arena, n_idx * sizeof(char *));
        double *vs = jj_alloc(&R->arena, n_idx * sizeof(double));
        size_t c = 0;
        json_object_foreach((json_t *)j, key, val) {
            if (!index_key(key, strlen(key), &iv)) continue;
            size_t p = c++;
            while (p > 0 && vs[p - 1] > iv) ks[p] = ks[p - 1], vs[p] = vs[p - 1], p--;
            ks[p] = key, vs[p] = iv;
        }
        for (size_t i = 0; i < n_idx; i++)
            jj_map_set(R, m, jj_cstr(&R->arena, ks[i]), jv_from_json(R, json_object_get(j, ks[i]), depth + 1));
    }
    json_object_foreach((json_t *)j, key, val) {
        if (n_idx && index_key(key, strlen(key), &iv)) continue;
        jj_map_set(R, m, jj_cstr(&R->arena, key), jv_from_json(R, val, depth + 1));
    }
    return jv_map(m, JV_OBJECT);
}

jv jv_from_json(jj_render *R, const json_t *j, int depth) {
    if (depth > R->opts.max_depth) jj_fail(R, NULL, "context JSON is nested too deeply");
    switch (json_typeof(j)) {
    case JSON_OBJECT: return object_from_json(R, j, depth);
    case JSON_ARRAY: {
        size_t n = json_array_size(j);
        jlist *l = jj_list_new(R, n);
        for (size_t i = 0; i < n; i++) jj_list_push(R, l, jv_from_json(R, json_array_get(j, i), depth + 1));
        return jv_list(l, JV_ARRAY);
    }
    case JSON_STRING: return jv_str(R, json_string_value(j), json_string_length(j));
    case JSON_INTEGER: return jv_int((double)json_integer_value(j));
    case JSON_REAL: {
        /* JSON.parse("1.0") is the number 1, which the reference calls an
         * integer (Number.isInteger) */
        double d = json_real_value(j);
        return isfinite(d) && trunc(d) == d ? jv_int(d) : jv_float(d);
    }
    case JSON_TRUE: return jv_bool(true);
    case JSON_FALSE: return jv_bool(false);
    default: return jv_null();
    }
}

/* ---- truth and names ---- */

const char *jv_type_name(jv v) {
    static const char *names[] = {
        "UndefinedValue", "NullValue", "BooleanValue", "IntegerValue", "FloatValue",
        "StringValue", "ArrayValue", "TupleValue", "ObjectValue", "KeywordArgumentsValue",
        "NamespaceValue", "FunctionValue",
    };
    return names[v.kind];
}

bool jv_truthy(jv v) {
    switch (v.kind) {
    case JV_UNDEF:
    case JV_NULL: return false;
    case JV_BOOL: return v.b;
    case JV_INT:
    case JV_FLOAT: return v.n != 0 && !isnan(v.n);
    case JV_STR: return v.s->len > 0;
    case JV_ARRAY:
    case JV_TUPLE: return v.l->n > 0;
    case JV_OBJECT:
    case JV_KWARGS: return v.m->n > 0;
    default: return true; /* namespace, function */
    }
}

bool jv_js_truthy(jv v) {
    switch (v.kind) {
    case JV_ARRAY:
    case JV_TUPLE:
    case JV_OBJECT:
    case JV_KWARGS: return true; /* a JS array or Map is always truthy */
    default: return jv_truthy(v);
    }
}

/* ---- to text ---- */

void jv_to_string(jj_render *R, jv v, jj_buf *out) {
    char num[400];
    switch (v.kind) {
    case JV_UNDEF: jj_buf_adds(out, "undefined"); break;
    case JV_NULL: jj_buf_adds(out, "undefined"); break; /* NullValue's value is undefined */
    case JV_BOOL: jj_buf_adds(out, v.b ? "true" : "false"); break;
    case JV_INT: jj_buf_adds(out, jj_num_fmt(v.n, num)); break;
    case JV_FLOAT: jj_buf_adds(out, jj_float_fmt(v.n, num)); break;
    case JV_STR: jj_buf_add(out, v.s->s, v.s->len); break;
    case JV_FUNC: jj_fail(R, NULL, "cannot print a function");
    default: { /* containers print as JSON, undefined as `undefined` */
        jj_json_opts o = {0};
        jv_to_json(R, v, &o, out);
    }
    }
}

void jv_raw_to_string(jj_render *R, jv v, jj_buf *out) {
    char num[32];
    switch (v.kind) {
    case JV_INT:
    case JV_FLOAT: jj_buf_adds(out, jj_num_fmt(v.n, num)); break;
    case JV_ARRAY:
    case JV_TUPLE: /* Array.prototype.toString joins the elements' toString() */
        for (size_t i = 0; i < v.l->n; i++) {
            if (i) jj_buf_addc(out, ',');
            jv_to_string(R, v.l->v[i], out);
        }
        break;
    case JV_OBJECT:
    case JV_KWARGS:
    case JV_NS: jj_buf_adds(out, "[object Map]"); break;
    default: jv_to_string(R, v, out);
    }
}

jstr *jv_stringify(jj_render *R, jv v) {
    if (v.kind == JV_STR) return v.s;
    jj_buf b;
    jj_buf_init(&b, &R->arena);
    jv_to_string(R, v, &b);
    return jj_buf_str(&b);
}

/* ---- tojson ---- */

/* String.prototype.localeCompare in Node's default (root) collation,
 * for ASCII: punctuation < digits < letters, case only breaks ties. */
static const char COLLATION[] =
    "\t\n\v\f\r _-,;:!?.'\"()[]{}@*/\\&#%`^+<=>|~$0123456789aAbBcCdDeEfFgGhHiIjJkKlLmMnNoOpPqQrRsStTuUvVwWxXyYzZ";

static uint32_t primary_weight(uint32_t cp, int *tertiary) {
    *tertiary = 0;
    if (cp >= 0x80) return 1000 + cp; /* beyond ASCII: code point order (approximation) */
    const char *p = memchr(COLLATION, (int)cp, sizeof COLLATION - 1);
    if (!p) return 0; /* other control characters are ignorable */
    int idx = (int)(p - COLLATION);
    if (cp >= 'A' && cp <= 'Z') *tertiary = 1, idx--; /* same primary as its lowercase */
    return (uint32_t)idx + 1;
}

static int locale_cmp(const jstr *a, const jstr *b) {
    int tie = 0;
    size_t i = 0, j = 0;
    for (;;) {
        uint32_t ca = 0, cb = 0, wa = 0, wb = 0;
        int ta = 0, tb = 0;
        while (i < a->len && wa == 0) {
            i += (size_t)jj_utf8_dec(a->s + i, a->len - i, &ca);
            wa = primary_weight(ca, &ta);
        }
        while (j < b->len && wb == 0) {
            j += (size_t)jj_utf8_dec(b->s + j, b->len - j, &cb);
            wb = primary_weight(cb, &tb);
        }
        if (wa == 0 || wb == 0) return wa == wb ? tie : wa == 0 ? -1 : 1;
        if (wa != wb) return wa < wb ? -1 : 1;
        if (!tie && ta != tb) tie = ta < tb ? -1 : 1;
    }
}

static void sort_entries(jstr **k, jv *v, size_t n) {
    for (size_t i = 1; i < n; i++) { /* stable insertion sort: key counts are small */
        jstr *kk = k[i];
        jv vv = v[i];
        size_t p = i;
        while (p > 0 && locale_cmp(k[p - 1], kk) > 0) k[p] = k[p - 1], v[p] = v[p - 1], p--;
        k[p] = kk, v[p] = vv;
    }
}

static void json_pad(jj_buf *out, int indent, int depth) {
    jj_buf_addc(out, '\n');
    for (long i = 0; i < (long)indent * depth; i++) jj_buf_addc(out, ' ');
}

static void to_json(jj_render *R, jv v, const jj_json_opts *o, int depth, jj_buf *out) {
    char num[32];
    if (depth > R->opts.max_depth) jj_fail(R, NULL, "value is nested too deeply to convert to JSON");
    const char *isep = o->item_sep ? o->item_sep->s : o->indent ? "," : ", ";
    size_t isep_n = o->item_sep ? o->item_sep->len : strlen(isep);
    const char *ksep = o->key_sep ? o->key_sep->s : ": ";
    size_t ksep_n = o->key_sep ? o->key_sep->len : 2;
    switch (v.kind) {
    case JV_NULL: jj_buf_adds(out, "null"); break;
    case JV_UNDEF: jj_buf_adds(out, o->undef_as_null ? "null" : "undefined"); break;
    case JV_BOOL: jj_buf_adds(out, v.b ? "true" : "false"); break;
    case JV_INT:
    case JV_FLOAT: jj_buf_adds(out, isfinite(v.n) ? jj_num_fmt(v.n, num) : "null"); break;
    case JV_STR: jj_json_quote(v.s->s, v.s->len, o->ascii, out); break;
    case JV_ARRAY:
        jj_buf_addc(out, '[');
        for (size_t i = 0; i < v.l->n; i++) {
            if (i) jj_buf_add(out, isep, isep_n);
            if (o->indent) json_pad(out, o->indent, depth + 1);
            to_json(R, v.l->v[i], o, depth + 1, out);
        }
        if (o->indent && v.l->n) json_pad(out, o->indent, depth);
        jj_buf_addc(out, ']');
        break;
    case JV_OBJECT:
    case JV_NS: {
        size_t n = v.m->n;
        jstr **k = v.m->k;
        jv *vals = v.m->v;
        if (o->sort_keys && n > 1) {
            k = jj_alloc(&R->arena, n * sizeof *k);
            vals = jj_alloc(&R->arena, n * sizeof *vals);
            memcpy(k, v.m->k, n * sizeof *k);
            memcpy(vals, v.m->v, n * sizeof *vals);
            sort_entries(k, vals, n);
        }
        jj_buf_addc(out, '{');
        for (size_t i = 0; i < n; i++) {
            if (i) jj_buf_add(out, isep, isep_n);
            if (o->indent) json_pad(out, o->indent, depth + 1);
            jj_json_quote(k[i]->s, k[i]->len, o->ascii, out);
            jj_buf_add(out, ksep, ksep_n);
            to_json(R, vals[i], o, depth + 1, out);
        }
        if (o->indent && n) json_pad(out, o->indent, depth);
        jj_buf_addc(out, '}');
        break;
    }
    default: /* tuples, keyword arguments and functions, as in the reference */
        jj_fail(R, NULL, "Cannot convert to JSON: %s", jv_type_name(v));
    }
}

void jv_to_json(jj_render *R, jv v, const jj_json_opts *o, jj_buf *out) {
    to_json(R, v, o, 0, out);
}

/* ---- equality and order ---- */

static bool same_ref(jv a, jv b) {
    if (jv_is_list(a) && jv_is_list(b)) return a.l == b.l;
    if (jv_is_attr(a) && jv_is_attr(b)) return a.m == b.m;
    if (a.kind == JV_FUNC && b.kind == JV_FUNC) return a.f == b.f;
    return false;
}

static bool is_ref(jv v) { return jv_is_list(v) || jv_is_attr(v) || v.kind == JV_FUNC; }

/* a.value === b.value: numbers by value (1 === 1.0), strings by content,
 * containers by identity. */
bool jv_strict_eq(jv a, jv b) {
    if (jv_is_num(a) && jv_is_num(b)) return a.n == b.n;
    /* the reference's NullValue holds undefined, so none === undefined */
    if ((a.kind == JV_NULL || a.kind == JV_UNDEF) && (b.kind == JV_NULL || b.kind == JV_UNDEF)) return true;
    if (is_ref(a) || is_ref(b)) return same_ref(a, b);
    if (a.kind != b.kind) return false;
    switch (a.kind) {
    case JV_BOOL: return a.b == b.b;
    case JV_STR: return a.s->len == b.s->len && memcmp(a.s->s, b.s->s, a.s->len) == 0;
    default: return true; /* null === null, undefined === undefined */
    }
}

/* a.value == b.value, JavaScript's loose equality, on the raw values:
 * null and undefined equal each other only; booleans and strings compare
 * to numbers as numbers; a container compares to a primitive through its
 * string form (Array: elements joined by ","; Map: "[object Map]"). */
bool jv_loose_eq(jj_render *R, jv a, jv b) {
    bool a_nil = a.kind == JV_NULL || a.kind == JV_UNDEF;
    bool b_nil = b.kind == JV_NULL || b.kind == JV_UNDEF;
    if (a_nil || b_nil) return a_nil && b_nil;
    if (is_ref(a) && is_ref(b)) return same_ref(a, b);
    if (is_ref(a) || is_ref(b)) {
        if (a.kind == JV_FUNC || b.kind == JV_FUNC) return false;
        jj_buf t;
        jj_buf_init(&t, &R->arena);
        jv_raw_to_string(R, is_ref(a) ? a : b, &t);
        jv prim = jv_strv(jj_buf_str(&t));
        return is_ref(a) ? jv_loose_eq(R, prim, b) : jv_loose_eq(R, a, prim);
    }
    if (a.kind == JV_STR && b.kind == JV_STR) return jv_strict_eq(a, b);
    double x = a.kind == JV_STR ? jj_to_number(a.s->s, a.s->len) : a.kind == JV_BOOL ? (double)a.b : a.n;
    double y = b.kind == JV_STR ? jj_to_number(b.s->s, b.s->len) : b.kind == JV_BOOL ? (double)b.b : b.n;
    return x == y;
}

static bool numeric_like(jv v) { return jv_is_num(v) || v.kind == JV_BOOL; }
static double numeric_value(jv v) { return v.kind == JV_BOOL ? (double)v.b : v.n; }

/* compareRuntimeValues: for sort, dictsort.  Types must match, except
 * that numbers and booleans compare as numbers. */
int jv_compare(jj_render *R, const jj_node *at, jv a, jv b, bool case_sensitive) {
    if (a.kind == JV_NULL && b.kind == JV_NULL) return 0;
    if (a.kind == JV_NULL || b.kind == JV_NULL || (a.kind == JV_UNDEF) != (b.kind == JV_UNDEF))
        jj_fail(R, at, "Cannot compare %s with %s", jv_type_name(a), jv_type_name(b));
    if (a.kind == JV_UNDEF) return 0;
    if (numeric_like(a) && numeric_like(b)) {
        double x = numeric_value(a), y = numeric_value(b);
        return x < y ? -1 : x > y ? 1 : 0;
    }
    if (a.kind != b.kind)
        jj_fail(R, at, "Cannot compare different types: %s and %s", jv_type_name(a), jv_type_name(b));
    if (a.kind != JV_STR) jj_fail(R, at, "Cannot compare type: %s", jv_type_name(a));
    if (case_sensitive) return jj_utf16_cmp(a.s->s, a.s->len, b.s->s, b.s->len);
    jj_buf la, lb;
    jj_buf_init(&la, &R->arena);
    jj_buf_init(&lb, &R->arena);
    jj_case_map(a.s->s, a.s->len, false, &la);
    jj_case_map(b.s->s, b.s->len, false, &lb);
    return jj_utf16_cmp(la.p ? la.p : "", la.n, lb.p ? lb.p : "", lb.n);
}
