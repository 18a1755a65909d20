/*
 * jinja_eval.c - walks the syntax tree: statements write text, expressions
 * produce values.  Also pt_jinja_render().
 *
 * Semantics are the reference's (@huggingface/jinja), which differ from
 * Python Jinja2 in ways that change prompts, so they are kept on purpose:
 *
 *  - scopes: a for loop has one scope for all its iterations; `set` inside
 *    an `if` writes the enclosing scope; a macro runs in a child of the
 *    scope it is *called* from (dynamic scoping), not where it was defined.
 *  - a for loop first evaluates its `if` filter for every item, then runs
 *    the body; `loop.length` counts the items that passed.
 *  - an iteration that ends in break or continue contributes no text at
 *    all, not even the text before the break (the reference builds each
 *    iteration's text as a string and drops it when the control-flow
 *    exception passes); the `else` block runs when no iteration completed.
 *  - none and undefined print as nothing; true prints "true".
 *
 * Errors unwind with longjmp to pt_jinja_render(); all memory is in the
 * render's arena, so nothing leaks.  Recursion, steps, memory and output
 * are bounded by pt_jinja_opts.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "tokenizer/jinja_int.h"

typedef enum { FLOW_NEXT, FLOW_BREAK, FLOW_CONTINUE } flow;

/* ---- errors and limits ---- */

void jj_fail(jj_render *R, const jj_node *at, const char *fmt, ...) {
    char *m = R->err ? R->err->msg : NULL;
    char scratch[512];
    if (!m) m = scratch;
    size_t cap = sizeof scratch, k = 0;
    if (at && R->tpl) {
        int line, col;
        jj_line_col(R->tpl->src, R->tpl->src_len, at->off, &line, &col);
        k = (size_t)snprintf(m, cap, "jinja %d:%d: ", line, col);
    } else {
        k = (size_t)snprintf(m, cap, "jinja: ");
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m + k, cap - k, fmt, ap);
    va_end(ap);
    R->status = -1;
    longjmp(R->jmp, 1);
}

void jj_raise(jj_render *R, const char *msg, size_t n) {
    if (R->err) {
        size_t k = PT_MIN(n, sizeof R->err->msg - 1);
        memcpy(R->err->msg, msg, k);
        R->err->msg[k] = 0;
    }
    R->status = PT_JINJA_RAISED;
    longjmp(R->jmp, 1);
}

void jj_step(jj_render *R, const jj_node *at, uint64_t n) {
    R->steps += n;
    if (R->steps > R->opts.max_steps)
        jj_fail(R, at, "template ran too long (over %llu loop iterations and calls)",
                (unsigned long long)R->opts.max_steps);
}

static void enter(jj_render *R, const jj_node *at) {
    if (++R->depth > R->opts.max_depth)
        jj_fail(R, at, "template recursion too deep (over %d levels)", R->opts.max_depth);
}

static void render_oom(void *ctx) {
    jj_render *R = ctx;
    jj_fail(R, NULL, "template needed more than %zu bytes of memory", R->opts.max_memory);
}

/* ---- scopes ---- */

jenv *jj_env_new(jj_render *R, jenv *parent) {
    jenv *e = jj_zalloc(&R->arena, sizeof *e);
    e->parent = parent;
    return e;
}

static jv *env_slot(const jenv *e, const char *name, size_t n) {
    for (size_t i = 0; i < e->n; i++)
        if (jj_str_eq(e->names[i], name, n)) return &e->vals[i];
    return NULL;
}

void jj_env_set(jj_render *R, jenv *e, const jstr *name, jv v) {
    jv *slot = env_slot(e, name->s, name->len);
    if (slot) {
        *slot = v;
        return;
    }
    if (e->n == e->cap) {
        size_t cap = e->cap ? e->cap * 2 : 8;
        const jstr **nn = jj_alloc(&R->arena, cap * sizeof *nn);
        jv *nv = jj_alloc(&R->arena, cap * sizeof *nv);
        if (e->n) {
            memcpy(nn, e->names, e->n * sizeof *nn);
            memcpy(nv, e->vals, e->n * sizeof *nv);
        }
        e->names = nn, e->vals = nv, e->cap = cap;
    }
    e->names[e->n] = name;
    e->vals[e->n++] = v;
}

jv jj_env_get(const jenv *e, const char *name, size_t n) {
    for (; e; e = e->parent) {
        jv *slot = env_slot(e, name, n);
        if (slot) return *slot;
    }
    return jv_undef();
}

static void env_set_c(jj_render *R, jenv *e, const char *name, jv v) {
    jj_env_set(R, e, jj_cstr(&R->arena, name), v);
}

/* ---- output ---- */

static jj_buf *main_out(jj_render *R);

static void emit(jj_render *R, jj_buf *out, const char *s, size_t n, const jj_node *at) {
    if (out == main_out(R) && out->n + n > R->opts.max_output)
        jj_fail(R, at, "rendered text over the %zu-byte limit", R->opts.max_output);
    jj_buf_add(out, s, n);
}

static void emit_value(jj_render *R, jj_buf *out, jv v, const jj_node *at) {
    if (v.kind == JV_NULL || v.kind == JV_UNDEF) return;
    if (v.kind == JV_STR) return emit(R, out, v.s->s, v.s->len, at);
    jstr *s = jv_stringify(R, v);
    emit(R, out, s->s, s->len, at);
}

/* ---- expressions ---- */

static const char *op_name(int op) {
    static const char *names[] = {
        "or", "and", "in", "not in", "==", "!=", "<", ">", "<=", ">=", "+", "-", "~", "*",
        "/", "//", "%", "**", "not", "-", "+",
    };
    return names[op];
}

static jv concat_raw(jj_render *R, jv a, jv b) {
    jj_buf t;
    jj_buf_init(&t, &R->arena);
    jv_raw_to_string(R, a, &t);
    jv_raw_to_string(R, b, &t);
    return jv_strv(jj_buf_str(&t));
}

static bool str_contains(const jstr *hay, const jstr *needle) {
    if (needle->len == 0) return true;
    if (needle->len > hay->len) return false;
    return memmem(hay->s, hay->len, needle->s, needle->len) != NULL;
}

static jv eval_pow(jj_render *R, const jj_node *n, jv l, jv r) {
    double a = l.kind == JV_BOOL ? (double)l.b : l.n, b = r.kind == JV_BOOL ? (double)r.b : r.n;
    if (a == 0 && b < 0) jj_fail(R, n, "0.0 cannot be raised to a negative power");
    double res = (isnan(b) || (fabs(a) == 1 && isinf(b))) ? NAN : pow(a, b); /* JS ** */
    if (!isfinite(res)) jj_fail(R, n, "Exponentiation result is not a finite real number");
    bool is_float = l.kind == JV_FLOAT || r.kind == JV_FLOAT || b < 0;
    return is_float ? jv_float(res) : jv_int(res);
}

static jv eval_arith(const jj_node *n, jv l, jv r, bool *done) {
    double a = l.n, b = r.n, res;
    bool is_float = l.kind == JV_FLOAT || r.kind == JV_FLOAT;
    *done = true;
    switch (n->op) {
    case OP_ADD: res = a + b; break;
    case OP_SUB: res = a - b; break;
    case OP_MUL: res = a * b; break;
    case OP_DIV: return jv_float(a / b);
    case OP_FLOORDIV: res = floor(a / b); break;
    case OP_MOD: res = fmod(a, b); break; /* JS %: the sign of the dividend */
    case OP_LT: return jv_bool(a < b);
    case OP_GT: return jv_bool(a > b);
    case OP_LE: return jv_bool(a <= b);
    case OP_GE: return jv_bool(a >= b);
    default: *done = false; return jv_undef();
    }
    return is_float ? jv_float(res) : jv_int(res);
}

/* The reference's evaluateBinaryExpression, branch for branch: which
 * operand types meet decides, and some combinations fall through to the
 * string rules (`"a" + [1]` is "a1") or to an error. */
static jv eval_binary(jj_render *R, const jj_node *n, jenv *env) {
    jv l = jj_eval(R, n->a, env);
    if (n->op == OP_AND) return jv_truthy(l) ? jj_eval(R, n->b, env) : l;
    if (n->op == OP_OR) return jv_truthy(l) ? l : jj_eval(R, n->b, env);
    jv r = jj_eval(R, n->b, env);
    if (n->op == OP_EQ) return jv_bool(jv_loose_eq(R, l, r));
    if (n->op == OP_NE) return jv_bool(!jv_loose_eq(R, l, r));
    bool member_op = n->op == OP_IN || n->op == OP_NOT_IN;
    if (l.kind == JV_UNDEF || r.kind == JV_UNDEF) {
        if (r.kind == JV_UNDEF && member_op) return jv_bool(n->op == OP_NOT_IN);
        jj_fail(R, n, "Cannot perform operation %s on undefined values", op_name(n->op));
    }
    if (l.kind == JV_NULL || r.kind == JV_NULL) jj_fail(R, n, "Cannot perform operation on null values");
    if (n->op == OP_CONCAT) return concat_raw(R, l, r);
    bool lnum = jv_is_num(l) || l.kind == JV_BOOL, rnum = jv_is_num(r) || r.kind == JV_BOOL;
    if (n->op == OP_POW && lnum && rnum) return eval_pow(R, n, l, r);
    if (jv_is_num(l) && jv_is_num(r)) {
        bool done;
        jv v = eval_arith(n, l, r, &done);
        if (done) return v;
    } else if (jv_is_list(l) && jv_is_list(r)) {
        if (n->op == OP_ADD) {
            jlist *c = jj_list_new(R, l.l->n + r.l->n);
            for (size_t i = 0; i < l.l->n; i++) jj_list_push(R, c, l.l->v[i]);
            for (size_t i = 0; i < r.l->n; i++) jj_list_push(R, c, r.l->v[i]);
            return jv_list(c, JV_ARRAY);
        }
    } else if (jv_is_list(r) && member_op) {
        bool found = false;
        for (size_t i = 0; i < r.l->n && !found; i++) found = jv_strict_eq(r.l->v[i], l);
        return jv_bool(found == (n->op == OP_IN));
    }
    if ((l.kind == JV_STR || r.kind == JV_STR) && n->op == OP_ADD) return concat_raw(R, l, r);
    if (l.kind == JV_STR && r.kind == JV_STR && member_op)
        return jv_bool(str_contains(r.s, l.s) == (n->op == OP_IN));
    if (l.kind == JV_STR && jv_is_map(r) && member_op)
        return jv_bool((jj_map_get(r.m, l.s->s, l.s->len) != NULL) == (n->op == OP_IN));
    jj_fail(R, n, "Unknown operator \"%s\" between %s and %s", op_name(n->op), jv_type_name(l), jv_type_name(r));
}

static jv eval_unary(jj_render *R, const jj_node *n, jenv *env) {
    jv a = jj_eval(R, n->a, env);
    if (n->op == OP_NOT) return jv_bool(!jv_truthy(a));
    if (!jv_is_num(a) && a.kind != JV_BOOL)
        jj_fail(R, n, "Unknown operator \"%s\" for %s", op_name(n->op), jv_type_name(a));
    double v = a.kind == JV_BOOL ? (double)a.b : a.n;
    double res = n->op == OP_NEG ? -1 * v : v;
    return a.kind == JV_FLOAT ? jv_float(res) : jv_int(res);
}

void jj_eval_args(jj_render *R, const jj_node *call, jenv *env, jlist **pos, jmap **kw) {
    jlist *p = jj_list_new(R, call->n);
    jmap *k = NULL;
    /* all positional arguments first, as Python evaluates them */
    for (size_t i = 0; i < call->n; i++) {
        const jj_node *a = call->list[i];
        if (a->kind == N_SPREAD) {
            jv v = jj_eval(R, a->a, env);
            if (!jv_is_list(v)) jj_fail(R, a, "Cannot unpack non-iterable type: %s", jv_type_name(v));
            for (size_t j = 0; j < v.l->n; j++) jj_list_push(R, p, v.l->v[j]);
        } else if (a->kind != N_KWARG && a->kind != N_KWSPREAD) {
            jj_list_push(R, p, jj_eval(R, a, env));
        }
    }
    for (size_t i = 0; i < call->n; i++) {
        const jj_node *a = call->list[i];
        if (a->kind != N_KWARG && a->kind != N_KWSPREAD) continue;
        if (!k) k = jj_map_new(R, 4);
        if (a->kind == N_KWARG) {
            if (jj_map_get(k, a->str->s, a->str->len))
                jj_fail(R, a, "Got multiple values for keyword argument '%s'", a->str->s);
            jj_map_set(R, k, a->str, jj_eval(R, a->a, env));
            continue;
        }
        jv v = jj_eval(R, a->a, env);
        if (!jv_is_map(v)) jj_fail(R, a, "Argument after ** must be a mapping, not %s", jv_type_name(v));
        for (size_t j = 0; j < v.m->n; j++) {
            if (jj_map_get(k, v.m->k[j]->s, v.m->k[j]->len))
                jj_fail(R, a, "Got multiple values for keyword argument '%s'", v.m->k[j]->s);
            jj_map_set(R, k, v.m->k[j], v.m->v[j]);
        }
    }
    *pos = p;
    *kw = k;
}

static jv eval_call(jj_render *R, const jj_node *n, jenv *env) {
    jlist *args;
    jmap *kw;
    jj_eval_args(R, n, env, &args, &kw);
    if (kw && kw->n) jj_list_push(R, args, jv_map(kw, JV_KWARGS));
    jv fn = jj_eval(R, n->a, env);
    return jj_call(R, n, fn, args->v, args->n, env);
}

/* utils.slice: Python slicing on an array of n items, written to idx. */
static size_t slice_indices(jj_render *R, const jj_node *at, double len, jv a, jv b, jv c, size_t **idx) {
    double step = c.kind == JV_UNDEF ? 1 : c.n;
    double dir = step > 0 ? 1 : step < 0 ? -1 : 0;
    double start, stop;
    if (dir >= 0) {
        start = a.kind == JV_UNDEF ? 0 : a.n < 0 ? fmax(len + a.n, 0) : fmin(a.n, len);
        stop = b.kind == JV_UNDEF ? len : b.n < 0 ? fmax(len + b.n, 0) : fmin(b.n, len);
    } else {
        start = a.kind == JV_UNDEF ? len - 1 : a.n < 0 ? fmax(len + a.n, -1) : fmin(a.n, len - 1);
        stop = b.kind == JV_UNDEF ? -1 : b.n < -1 ? fmax(len + b.n, -1) : fmin(b.n, len - 1);
    }
    size_t n = 0, cap = 0;
    *idx = NULL;
    for (double i = start; dir * i < dir * stop; i += step) {
        if (n == cap) {
            cap = cap ? cap * 2 : 16;
            size_t *ni = jj_alloc(&R->arena, cap * sizeof *ni);
            if (n) memcpy(ni, *idx, n * sizeof *ni);
            *idx = ni;
        }
        (*idx)[n++] = (size_t)i;
    }
    jj_step(R, at, n);
    return n;
}

static jv eval_slice(jj_render *R, const jj_node *s, jv obj, jenv *env) {
    if (!jv_is_list(obj) && obj.kind != JV_STR) jj_fail(R, s, "Slice object must be an array or string");
    jv parts[3];
    const jj_node *nodes[3] = {s->a, s->b, s->c};
    static const char *names[3] = {"start", "stop", "step"};
    for (int i = 0; i < 3; i++) {
        parts[i] = nodes[i] ? jj_eval(R, nodes[i], env) : jv_undef();
        if (parts[i].kind != JV_INT && parts[i].kind != JV_UNDEF)
            jj_fail(R, s, "Slice %s must be numeric or undefined", names[i]);
    }
    size_t *idx;
    if (jv_is_list(obj)) {
        size_t n = slice_indices(R, s, (double)obj.l->n, parts[0], parts[1], parts[2], &idx);
        jlist *l = jj_list_new(R, n);
        for (size_t i = 0; i < n; i++) jj_list_push(R, l, obj.l->v[idx[i]]);
        return jv_list(l, JV_ARRAY);
    }
    /* strings slice by code point (Array.from) */
    const jstr *str = obj.s;
    size_t ncp = 0;
    size_t *off = jj_alloc(&R->arena, (str->len + 1) * sizeof *off);
    for (size_t i = 0; i < str->len;) {
        uint32_t cp;
        off[ncp++] = i;
        i += (size_t)jj_utf8_dec(str->s + i, str->len - i, &cp);
    }
    off[ncp] = str->len;
    size_t n = slice_indices(R, s, (double)ncp, parts[0], parts[1], parts[2], &idx);
    jj_buf b;
    jj_buf_init(&b, &R->arena);
    for (size_t i = 0; i < n; i++) jj_buf_add(&b, str->s + off[idx[i]], off[idx[i] + 1] - off[idx[i]]);
    return jv_strv(jj_buf_str(&b));
}

static jv list_at(jv list, double i) {
    double len = (double)list.l->n;
    i = isnan(i) ? 0 : trunc(i);
    if (i < 0) i += len;
    return i >= 0 && i < len ? list.l->v[(size_t)i] : jv_undef();
}

static jv eval_member(jj_render *R, const jj_node *n, jenv *env) {
    jv obj = jj_eval(R, n->a, env);
    jv prop;
    if (n->flag) {
        if (n->b->kind == N_SLICE) return eval_slice(R, n->b, obj, env);
        prop = jj_eval(R, n->b, env);
    } else if (n->b->kind == N_INT) {
        prop = jv_int(n->b->num);
    } else {
        prop = jv_strv(n->b->str);
    }
    if (jv_is_attr(obj)) {
        if (prop.kind != JV_STR) jj_fail(R, n, "Cannot access property with non-string: got %s", jv_type_name(prop));
        jv *v = jj_map_get(obj.m, prop.s->s, prop.s->len);
        if (v) return *v;
        return obj.kind == JV_NS ? jv_undef() : jj_member_builtin(R, n, obj, prop.s->s, prop.s->len);
    }
    if (jv_is_list(obj) || obj.kind == JV_STR) {
        if (prop.kind == JV_INT) {
            if (jv_is_list(obj)) return list_at(obj, prop.n);
            jj_buf b;
            jj_buf_init(&b, &R->arena);
            return jj_utf16_at(obj.s->s, obj.s->len, prop.n, &b) ? jv_strv(jj_buf_str(&b)) : jv_undef();
        }
        if (prop.kind == JV_STR) return jj_member_builtin(R, n, obj, prop.s->s, prop.s->len);
        jj_fail(R, n, "Cannot access property with non-string/non-number: got %s", jv_type_name(prop));
    }
    if (prop.kind != JV_STR) jj_fail(R, n, "Cannot access property with non-string: got %s", jv_type_name(prop));
    return jj_member_builtin(R, n, obj, prop.s->s, prop.s->len);
}

static jv eval_literal_list(jj_render *R, const jj_node *n, jenv *env, jv_kind kind) {
    jlist *l = jj_list_new(R, n->n);
    for (size_t i = 0; i < n->n; i++) jj_list_push(R, l, jj_eval(R, n->list[i], env));
    return jv_list(l, kind);
}

static jv eval_object(jj_render *R, const jj_node *n, jenv *env) {
    jmap *m = jj_map_new(R, n->n);
    for (size_t i = 0; i < n->n; i++) {
        jv k = jj_eval(R, n->list[i], env);
        if (k.kind != JV_STR) jj_fail(R, n->list[i], "Object keys must be strings: got %s", jv_type_name(k));
        jj_map_set(R, m, k.s, jj_eval(R, n->list2[i], env));
    }
    return jv_map(m, JV_OBJECT);
}

static jv eval_test(jj_render *R, const jj_node *n, jenv *env) {
    jv operand = jj_eval(R, n->a, env);
    bool r = jj_apply_test(R, n, n->str, &operand, 1);
    return jv_bool(n->flag ? !r : r);
}

/* `[] | first` is JavaScript's undefined in the reference, not one of its
 * values: assigning it is fine (reading the variable back gives
 * Undefined), any other use is a TypeError.  hole_ok says which. */
static jv eval_node(jj_render *R, const jj_node *n, jenv *env, bool hole_ok);

jv jj_eval(jj_render *R, const jj_node *n, jenv *env) { return eval_node(R, n, env, false); }

static jv eval_filter(jj_render *R, const jj_node *n, jenv *env, bool hole_ok) {
    jv v = jj_apply_filter(R, jj_eval(R, n->a, env), n->b, env);
    if (R->hole) {
        R->hole = false;
        if (!hole_ok) jj_fail(R, n, "Cannot read properties of undefined (%s of an empty list)", n->b->str->s);
    }
    return v;
}

static jv eval_node(jj_render *R, const jj_node *n, jenv *env, bool hole_ok) {
    enter(R, n);
    jv v;
    switch (n->kind) {
    case N_INT: v = jv_int(n->num); break;
    case N_FLOAT: v = jv_float(n->num); break;
    case N_STR: v = jv_strv(n->str); break;
    case N_IDENT: v = jj_env_get(env, n->str->s, n->str->len); break;
    case N_ARRAY: v = eval_literal_list(R, n, env, JV_ARRAY); break;
    case N_TUPLE: v = eval_literal_list(R, n, env, JV_TUPLE); break;
    case N_OBJECT: v = eval_object(R, n, env); break;
    case N_MEMBER: v = eval_member(R, n, env); break;
    case N_CALL: v = eval_call(R, n, env); break;
    case N_BINARY: v = eval_binary(R, n, env); break;
    case N_UNARY: v = eval_unary(R, n, env); break;
    case N_FILTER: v = eval_filter(R, n, env, hole_ok); break;
    case N_TEST: v = eval_test(R, n, env); break;
    case N_SELECT: v = jv_truthy(jj_eval(R, n->b, env)) ? eval_node(R, n->a, env, hole_ok) : jv_undef(); break;
    case N_TERNARY:
        v = eval_node(R, jv_truthy(jj_eval(R, n->a, env)) ? n->b : n->c, env, hole_ok);
        break;
    default: jj_fail(R, n, "Unknown node type");
    }
    R->depth--;
    return v;
}

/* ---- statements ---- */

static flow exec_block(jj_render *R, jj_node *const *list, size_t n, jenv *env, jj_buf *out);

/* Renders a block to a string of its own (set blocks, macros, filters). */
static jstr *render_block(jj_render *R, jj_node *const *list, size_t n, jenv *env, flow *f) {
    jj_buf b;
    jj_buf_init(&b, &R->arena);
    *f = exec_block(R, list, n, env, &b);
    return jj_buf_str(&b);
}

static void bind_target(jj_render *R, const jj_node *target, jv item, jenv *scope) {
    if (target->kind == N_IDENT) return jj_env_set(R, scope, target->str, item);
    for (size_t j = 0; j < target->n; j++) {
        if (target->list[j]->kind != N_IDENT)
            jj_fail(R, target->list[j], "Cannot unpack non-identifier type");
        jj_env_set(R, scope, target->list[j]->str, item.l->v[j]);
    }
}

static jv loop_object(jj_render *R, jlist *items, size_t i) {
    size_t n = items->n;
    jmap *m = jj_map_new(R, 9);
    static const char *keys[] = {"index", "index0", "revindex", "revindex0", "first", "last", "length", "previtem", "nextitem"};
    jv vals[9] = {
        jv_int((double)i + 1), jv_int((double)i), jv_int((double)(n - i)), jv_int((double)(n - i - 1)),
        jv_bool(i == 0), jv_bool(i == n - 1), jv_int((double)n),
        i > 0 ? items->v[i - 1] : jv_undef(), i + 1 < n ? items->v[i + 1] : jv_undef(),
    };
    for (int k = 0; k < 9; k++) {
        if (!R->loop_keys[k]) R->loop_keys[k] = jj_cstr(&R->arena, keys[k]); /* once per render */
        m->k[k] = R->loop_keys[k];
        m->v[k] = vals[k];
    }
    m->n = 9;
    return jv_map(m, JV_OBJECT);
}

static flow exec_for(jj_render *R, const jj_node *s, jenv *env, jj_buf *out) {
    jenv *scope = jj_env_new(R, env);
    const jj_node *test = NULL;
    jv it;
    if (s->b->kind == N_SELECT) {
        it = jj_eval(R, s->b->a, scope);
        test = s->b->b;
    } else {
        it = jj_eval(R, s->b, scope);
    }
    if (jv_is_map(it)) {
        jlist *keys = jj_list_new(R, it.m->n);
        for (size_t i = 0; i < it.m->n; i++) jj_list_push(R, keys, jv_strv(it.m->k[i]));
        it = jv_list(keys, JV_ARRAY);
    }
    if (!jv_is_list(it)) jj_fail(R, s->b, "Expected iterable or object type in for loop: got %s", jv_type_name(it));
    /* first pass: unpacking checks and the `if` filter, for every item */
    jlist *items = jj_list_new(R, it.l->n);
    for (size_t i = 0; i < it.l->n; i++) {
        jv cur = it.l->v[i];
        jj_step(R, s, 1);
        if (s->a->kind == N_TUPLE) {
            if (cur.kind != JV_ARRAY) jj_fail(R, s, "Cannot unpack non-iterable type: %s", jv_type_name(cur));
            if (s->a->n != cur.l->n)
                jj_fail(R, s, "Too %s items to unpack", s->a->n > cur.l->n ? "few" : "many");
        }
        if (test) {
            jenv *ls = jj_env_new(R, scope);
            bind_target(R, s->a, cur, ls);
            if (!jv_truthy(jj_eval(R, test, ls))) continue;
        }
        jj_list_push(R, items, cur);
    }
    bool none = true;
    jstr *loop_name = jj_cstr(&R->arena, "loop");
    for (size_t i = 0; i < items->n; i++) {
        jj_env_set(R, scope, loop_name, loop_object(R, items, i));
        bind_target(R, s->a, items->v[i], scope);
        size_t mark = out->n;
        flow f = exec_block(R, s->list, s->n, scope, out);
        if (f != FLOW_NEXT) {
            out->n = mark; /* the reference drops the whole iteration's text */
            if (f == FLOW_BREAK) break;
            continue;
        }
        none = false;
    }
    if (none) return exec_block(R, s->list2, s->n2, scope, out);
    return FLOW_NEXT;
}

static flow exec_set(jj_render *R, const jj_node *s, jenv *env) {
    jv rhs;
    if (s->b) {
        rhs = eval_node(R, s->b, env, s->a->kind != N_TUPLE);
    } else {
        flow f;
        jstr *text = render_block(R, s->list, s->n, env, &f);
        if (f != FLOW_NEXT) return f;
        rhs = jv_strv(text);
    }
    const jj_node *a = s->a;
    if (a->kind == N_IDENT) {
        jj_env_set(R, env, a->str, rhs);
    } else if (a->kind == N_TUPLE) {
        if (!jv_is_list(rhs)) jj_fail(R, s, "Cannot unpack non-iterable type in set: %s", jv_type_name(rhs));
        if (rhs.l->n != a->n) jj_fail(R, s, "Too %s items to unpack in set", a->n > rhs.l->n ? "few" : "many");
        for (size_t i = 0; i < a->n; i++) {
            if (a->list[i]->kind != N_IDENT) jj_fail(R, s, "Cannot unpack to non-identifier in set");
            jj_env_set(R, env, a->list[i]->str, rhs.l->v[i]);
        }
    } else if (a->kind == N_MEMBER) {
        jv obj = jj_eval(R, a->a, env);
        if (obj.kind != JV_NS) jj_fail(R, s, "cannot assign attribute on non-namespace object");
        if (a->b->kind != N_IDENT) jj_fail(R, s, "Cannot assign to member with non-identifier property");
        jj_map_set(R, obj.m, a->b->str, rhs);
    } else {
        jj_fail(R, s, "Invalid LHS inside assignment expression");
    }
    return FLOW_NEXT;
}

/* Binds a macro's (or call block's) parameters in scope: positionals,
 * then keywords, then defaults (evaluated in scope, so they may use the
 * other parameters); kwargs/varargs collect the rest when the body reads
 * them. */
static void bind_macro_args(jj_render *R, const jj_node *def, const char *name, jv *args, size_t n, jenv *scope) {
    size_t npos = n;
    jmap *kw = NULL;
    if (npos && args[npos - 1].kind == JV_KWARGS) {
        jmap *given = args[--npos].m;
        kw = jj_map_new(R, given->n);
        for (size_t i = 0; i < given->n; i++) jj_map_set(R, kw, given->k[i], given->v[i]);
    }
    bool *pending = jj_zalloc(&R->arena, def->n + 1);
    for (size_t i = 0; i < def->n; i++) {
        const jj_node *p = def->list[i];
        bool have = i < npos;
        jv v = have ? args[i] : jv_undef();
        jv *k;
        if (!have && kw && (k = jj_map_get(kw, p->str->s, p->str->len))) {
            v = *k, have = true;
            jj_map_del(kw, p->str->s, p->str->len);
        }
        if (!have && p->kind == N_KWARG) pending[i] = true;
        jj_env_set(R, scope, p->str, v);
    }
    if (def->op & USES_KWARGS)
        env_set_c(R, scope, "kwargs", jv_map(kw ? kw : jj_map_new(R, 0), JV_OBJECT));
    else if (kw && kw->n)
        jj_fail(R, def, "macro %s takes no keyword argument '%s'", name, kw->k[0]->s);
    if (def->op & USES_VARARGS) {
        jlist *rest = jj_list_new(R, 0);
        for (size_t i = def->n; i < npos; i++) jj_list_push(R, rest, args[i]);
        env_set_c(R, scope, "varargs", jv_list(rest, JV_ARRAY));
    } else if (npos > def->n) {
        jj_fail(R, def, "macro %s takes not more than %zu argument(s)", name, def->n);
    }
    for (size_t i = 0; i < def->n; i++)
        if (pending[i]) jj_env_set(R, scope, def->list[i]->str, jj_eval(R, def->list[i]->a, scope));
}

static jv call_macro(jj_render *R, const jj_node *at, jfunc *f, jv *args, size_t n, jenv *env) {
    const jj_node *def = f->macro;
    bool is_caller = def->kind == N_CALLBLOCK;
    jenv *scope = jj_env_new(R, is_caller ? f->env : env);
    char name[80];
    if (is_caller)
        snprintf(name, sizeof name, "None");
    else
        snprintf(name, sizeof name, "'%.64s'", def->str->s);
    bind_macro_args(R, def, name, args, n, scope);
    flow fl;
    jstr *text = render_block(R, def->list2, def->n2, scope, &fl);
    if (fl != FLOW_NEXT) jj_fail(R, at, "break or continue inside a macro is not supported");
    return jv_strv(text);
}

jv jj_call(jj_render *R, const jj_node *at, jv fn, jv *args, size_t n, jenv *env) {
    if (fn.kind != JV_FUNC) jj_fail(R, at, "Cannot call something that is not a function: got %s", jv_type_name(fn));
    jj_step(R, at, 1);
    if (fn.f->fn) return fn.f->fn(R, at, fn.f->self, args, n);
    enter(R, at);
    jv v = call_macro(R, at, fn.f, args, n, env);
    R->depth--;
    return v;
}

static jv exec_call_block(jj_render *R, const jj_node *s, jenv *env) {
    jfunc *caller = jj_zalloc(&R->arena, sizeof *caller);
    caller->macro = s;
    caller->env = env;
    caller->name = "caller";
    jlist *args;
    jmap *kw;
    jj_eval_args(R, s->a, env, &args, &kw);
    jj_list_push(R, args, jv_map(kw ? kw : jj_map_new(R, 0), JV_KWARGS));
    jv fn = jj_eval(R, s->a->a, env);
    if (fn.kind != JV_FUNC) jj_fail(R, s, "Cannot call something that is not a function: got %s", jv_type_name(fn));
    jenv *inner = jj_env_new(R, env);
    env_set_c(R, inner, "caller", (jv){.kind = JV_FUNC, .f = caller});
    return jj_call(R, s, fn, args->v, args->n, inner);
}

static flow exec(jj_render *R, const jj_node *s, jenv *env, jj_buf *out) {
    switch (s->kind) {
    case N_TEXT: emit(R, out, s->str->s, s->str->len, s); return FLOW_NEXT;
    case N_COMMENT: return FLOW_NEXT;
    case N_IF: {
        bool t = jv_truthy(jj_eval(R, s->a, env));
        return t ? exec_block(R, s->list, s->n, env, out) : exec_block(R, s->list2, s->n2, env, out);
    }
    case N_FOR: return exec_for(R, s, env, out);
    case N_SET: return exec_set(R, s, env);
    case N_MACRO: {
        jfunc *f = jj_zalloc(&R->arena, sizeof *f);
        f->macro = s;
        f->name = s->str->s;
        jj_env_set(R, env, s->str, (jv){.kind = JV_FUNC, .f = f});
        return FLOW_NEXT;
    }
    case N_CALLBLOCK: emit_value(R, out, exec_call_block(R, s, env), s); return FLOW_NEXT;
    case N_FILTERBLOCK: {
        flow f;
        jstr *text = render_block(R, s->list, s->n, env, &f);
        if (f != FLOW_NEXT) return f;
        emit_value(R, out, jj_apply_filter(R, jv_strv(text), s->a, env), s);
        return FLOW_NEXT;
    }
    case N_BREAK: return FLOW_BREAK;
    case N_CONTINUE: return FLOW_CONTINUE;
    default: emit_value(R, out, jj_eval(R, s, env), s); return FLOW_NEXT;
    }
}

static flow exec_block(jj_render *R, jj_node *const *list, size_t n, jenv *env, jj_buf *out) {
    enter(R, n ? list[0] : NULL);
    for (size_t i = 0; i < n; i++) {
        flow f = exec(R, list[i], env, out);
        if (f != FLOW_NEXT) {
            R->depth--;
            return f;
        }
    }
    R->depth--;
    return FLOW_NEXT;
}

/* ---- pt_jinja_render ---- */

typedef struct render_state {
    jj_render R;
    jj_buf out;
} render_state;

static jj_buf *main_out(jj_render *R) { return &((render_state *)R)->out; }

static void set_defaults(pt_jinja_opts *o) {
    if (!o->max_output) o->max_output = 16u << 20;
    if (!o->max_memory) o->max_memory = 256u << 20;
    if (!o->max_steps) o->max_steps = 10000000;
    if (o->max_depth <= 0) o->max_depth = 1000;
    if (!o->now) o->now = time(NULL);
}

static void load_context(jj_render *R, const json_t *ctx) {
    if (!ctx) return;
    if (!json_is_object(ctx)) jj_fail(R, NULL, "the template context must be a JSON object");
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)ctx, key, val) {
        size_t n = strlen(key);
        if (env_slot(R->global, key, n)) jj_fail(R, NULL, "Variable already declared: %s", key);
        jj_env_set(R, R->global, jj_str(&R->arena, key, n), jv_from_json(R, val, 1));
    }
}

int pt_jinja_render(const pt_jinja *t, const json_t *ctx, const pt_jinja_opts *opts, char **out,
                    size_t *out_len, pt_err *err) {
    *out = NULL;
    if (out_len) *out_len = 0;
    render_state *st = pt_xcalloc(1, sizeof *st);
    jj_render *R = &st->R;
    R->err = err;
    R->tpl = t;
    if (opts) R->opts = *opts;
    set_defaults(&R->opts);
    R->arena.cap = R->opts.max_memory;
    R->arena.oom = render_oom;
    R->arena.oom_ctx = R;
    if (setjmp(R->jmp)) {
        int status = R->status;
        jj_arena_free(&R->arena);
        free(st);
        return status;
    }
    jj_buf_init(&st->out, &R->arena);
    R->global = jj_env_new(R, NULL);
    jj_setup_globals(R, R->global);
    load_context(R, ctx);
    if (exec_block(R, t->body, t->n_body, R->global, &st->out) != FLOW_NEXT)
        jj_fail(R, NULL, "break or continue outside of a loop");
    char *s = malloc(st->out.n + 1);
    if (!s) jj_fail(R, NULL, "out of memory");
    if (st->out.n) memcpy(s, st->out.p, st->out.n);
    s[st->out.n] = 0;
    *out = s;
    if (out_len) *out_len = st->out.n;
    jj_arena_free(&R->arena);
    free(st);
    return 0;
}
