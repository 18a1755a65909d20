/*
 * jinja_parse.c - tokens to a syntax tree, and pt_jinja_compile().
 *
 * A recursive-descent parser with the reference's grammar and precedence,
 * lowest first:
 *
 *   x if c else y  (and `x if c`, which the for-loop uses as its filter)
 *   or   and   not   comparisons and (not) in   + - ~   * / // %   **
 *   is (not) test   | filter   unary sign   member . [] and call ()   atom
 *
 * So `a + b | trim` is `a + (b|trim)` and `not x == y` is `not (x == y)`.
 * Like the reference, commas between arguments and list items are
 * optional, and statements are only: set (and block set), if, for, macro,
 * call, filter, break, continue.
 *
 * Untrusted input: nesting is bounded (MAX_NEST) so a template cannot
 * exhaust the stack of this parser or of the renderer that walks the tree.
 */
#include <math.h>
#include <stdlib.h>

#include "tokenizer/jinja_int.h"

enum { MAX_NEST = 200, MAX_SOURCE = 16 << 20 };

typedef jj_compile P_;

typedef struct vec {
    jj_node **v;
    size_t n, cap;
} vec;

static void vec_push(P_ *P, vec *v, jj_node *x) {
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 4;
        jj_node **nv = jj_alloc(P->arena, cap * sizeof *nv);
        if (v->n) memcpy(nv, v->v, v->n * sizeof *nv);
        v->v = nv;
        v->cap = cap;
    }
    v->v[v->n++] = x;
}

static const jj_token EOF_TOKEN = {-1, "", 0, 0};

static const jj_token *tok_at(P_ *P, size_t i) { return i < P->n_toks ? &P->toks[i] : &EOF_TOKEN; }
static const jj_token *tok(P_ *P) { return tok_at(P, P->pos); }

static const char *type_name(int type) {
    static const char *names[] = {
        "Text", "NumericLiteral", "StringLiteral", "Identifier", "Equals", "OpenParen",
        "CloseParen", "OpenStatement", "CloseStatement", "OpenExpression", "CloseExpression",
        "OpenSquareBracket", "CloseSquareBracket", "OpenCurlyBracket", "CloseCurlyBracket",
        "Comma", "Dot", "Colon", "Pipe", "AdditiveBinaryOperator", "MultiplicativeBinaryOperator",
        "ExponentiationBinaryOperator", "ComparisonBinaryOperator", "UnaryOperator", "Comment",
    };
    return type >= 0 && type < (int)PT_ARRAY_LEN(names) ? names[type] : "end of template";
}

static _Noreturn void fail_at(P_ *P, const jj_token *t, const char *msg) {
    jj_compile_fail(P, t->type < 0 ? P->src_len : t->off, "%s", msg);
}

static const jj_token *expect(P_ *P, int type, const char *what) {
    const jj_token *t = tok(P);
    if (t->type != type) {
        char msg[200];
        snprintf(msg, sizeof msg, "%s, got %s", what, type_name(t->type));
        fail_at(P, t, msg);
    }
    P->pos++;
    return t;
}

static bool is(P_ *P, int type) { return tok(P)->type == type; }

static bool tok_is_ident(const jj_token *t, const char *name) {
    return t->type == T_IDENT && t->len == strlen(name) && memcmp(t->s, name, t->len) == 0;
}

static bool is_ident(P_ *P, const char *name) { return tok_is_ident(tok(P), name); }

static void expect_ident(P_ *P, const char *name) {
    if (!is_ident(P, name)) {
        char msg[64];
        snprintf(msg, sizeof msg, "Expected %s", name);
        fail_at(P, tok(P), msg);
    }
    P->pos++;
}

/* {% name ...: one of up to three names */
static bool is_statement(P_ *P, const char *a, const char *b, const char *c) {
    const jj_token *t = tok_at(P, P->pos + 1);
    return is(P, T_OPEN_STMT) && (tok_is_ident(t, a) || (b && tok_is_ident(t, b)) || (c && tok_is_ident(t, c)));
}

static jj_node *node(P_ *P, int kind, const jj_token *at) {
    jj_node *n = jj_zalloc(P->arena, sizeof *n);
    n->kind = kind;
    n->off = at->type < 0 ? (uint32_t)P->src_len : at->off;
    return n;
}

static void enter(P_ *P) {
    if (++P->depth > MAX_NEST) fail_at(P, tok(P), "template nests too deeply");
}
static void leave(P_ *P) { P->depth--; }

static jj_node *parse_any(P_ *P);
static jj_node *parse_expression(P_ *P);
static jj_node *parse_primary(P_ *P);
static jj_node *parse_call(P_ *P, jj_node *callee);

/* Statements up to (not including) {% a/b/c; `end` names the tag that
 * closes the block, for the error when the template ends first. */
static void parse_body(P_ *P, vec *body, const char *end, const char *a, const char *b, const char *c) {
    while (!is_statement(P, a, b, c)) {
        if (tok(P)->type < 0) {
            char msg[80];
            snprintf(msg, sizeof msg, "Unexpected end of template: missing {%% %s %%}", end);
            fail_at(P, tok(P), msg);
        }
        vec_push(P, body, parse_any(P));
    }
}

static void set_list(jj_node *n, vec *v, bool second) {
    if (second)
        n->list2 = v->v, n->n2 = v->n;
    else
        n->list = v->v, n->n = v->n;
}

/* ---- expressions ---- */

/* expr, expr, ... -> a tuple when there is a comma */
static jj_node *parse_sequence(P_ *P, bool primary) {
    const jj_token *at = tok(P);
    jj_node *first = primary ? parse_primary(P) : parse_expression(P);
    if (!is(P, T_COMMA)) return first;
    vec items = {0};
    vec_push(P, &items, first);
    while (is(P, T_COMMA)) {
        P->pos++;
        vec_push(P, &items, primary ? parse_primary(P) : parse_expression(P));
    }
    jj_node *t = node(P, N_TUPLE, at);
    set_list(t, &items, false);
    return t;
}

/* ( args ): calls allow *x, **x and name=value; parameters allow name and
 * name=default. */
static void parse_args(P_ *P, bool params, vec *args) {
    expect(P, T_LPAREN, "Expected opening parenthesis for arguments list");
    bool saw_kw = false, saw_spread = false;
    while (!is(P, T_RPAREN)) {
        const jj_token *at = tok(P);
        bool kw_spread = at->type == T_POW_OP;
        bool spread = at->type == T_MUL_OP && at->len == 1 && at->s[0] == '*';
        if (params && (kw_spread || spread))
            fail_at(P, at, "Argument unpacking is not allowed in parameter declarations");
        if (kw_spread) {
            P->pos++;
            jj_node *n = node(P, N_KWSPREAD, at);
            n->a = parse_expression(P);
            vec_push(P, args, n);
            if (is(P, T_COMMA)) P->pos++;
            if (!is(P, T_RPAREN)) fail_at(P, tok(P), "Expected closing parenthesis: `**` must be applied to the final argument");
            break;
        }
        jj_node *arg;
        if (spread) {
            if (saw_spread) fail_at(P, at, "Only one `*` argument unpacking is allowed");
            saw_spread = true;
            P->pos++;
            arg = node(P, N_SPREAD, at);
            arg->a = parse_expression(P);
        } else {
            arg = parse_expression(P);
            if (is(P, T_EQUALS)) {
                P->pos++;
                if (arg->kind != N_IDENT)
                    fail_at(P, at, params ? "Expected identifier for parameter declaration" : "Expected identifier for keyword argument");
                jj_node *kw = node(P, N_KWARG, at);
                kw->str = arg->str;
                kw->a = parse_expression(P);
                arg = kw;
            }
            if (params) {
                if (arg->kind != N_IDENT && arg->kind != N_KWARG)
                    fail_at(P, at, "Expected identifier for parameter declaration");
                for (size_t i = 0; i < args->n; i++)
                    if (jj_str_eq(args->v[i]->str, arg->str->s, arg->str->len))
                        fail_at(P, at, "Duplicate parameter name");
            }
            if (arg->kind == N_KWARG)
                saw_kw = true;
            else if (saw_kw)
                fail_at(P, at, params ? "Non-default argument follows default argument" : "Positional arguments must come before keyword arguments");
            else if (saw_spread)
                fail_at(P, at, "Positional arguments must not follow `*` argument unpacking");
        }
        vec_push(P, args, arg);
        if (is(P, T_COMMA)) P->pos++;
    }
    expect(P, T_RPAREN, "Expected closing parenthesis for arguments list");
}

/* Inside [ ]: an index, or a slice a:b:c with any part left out. */
static jj_node *parse_subscript(P_ *P) {
    const jj_token *at = tok(P);
    jj_node *parts[4] = {0};
    size_t n = 0;
    bool slice = false;
    while (!is(P, T_RBRACKET)) {
        if (n == 4) fail_at(P, tok(P), "Expected 0-3 arguments for slice expression");
        if (is(P, T_COLON)) {
            parts[n++] = NULL;
            P->pos++;
            slice = true;
        } else {
            parts[n++] = parse_expression(P);
            if (is(P, T_COLON)) {
                P->pos++;
                slice = true;
            }
        }
    }
    if (n == 0) fail_at(P, at, "Expected at least one argument for member/slice expression");
    if (!slice) return parts[0];
    if (n > 3) fail_at(P, at, "Expected 0-3 arguments for slice expression");
    jj_node *s = node(P, N_SLICE, at);
    s->a = parts[0], s->b = parts[1], s->c = parts[2];
    return s;
}

static jj_node *parse_member(P_ *P, jj_node *obj) {
    while (is(P, T_DOT) || is(P, T_LBRACKET)) {
        const jj_token *op = tok(P);
        P->pos++;
        jj_node *m = node(P, N_MEMBER, op);
        m->a = obj;
        m->flag = op->type == T_LBRACKET;
        if (m->flag) {
            m->b = parse_subscript(P);
            expect(P, T_RBRACKET, "Expected closing square bracket");
        } else {
            m->b = parse_primary(P);
            if (m->b->kind != N_IDENT && m->b->kind != N_INT)
                fail_at(P, op, "Expected identifier or integer following dot operator");
        }
        obj = m;
    }
    return obj;
}

static jj_node *parse_call(P_ *P, jj_node *callee) {
    enter(P); /* f()()() recurses */
    jj_node *c = node(P, N_CALL, tok(P));
    c->a = callee;
    vec args = {0};
    parse_args(P, false, &args);
    set_list(c, &args, false);
    jj_node *e = parse_member(P, c);
    if (is(P, T_LPAREN)) e = parse_call(P, e);
    leave(P);
    return e;
}

static jj_node *parse_call_member(P_ *P) {
    jj_node *m = parse_member(P, parse_primary(P));
    return is(P, T_LPAREN) ? parse_call(P, m) : m;
}

static jj_node *parse_unary_sign(P_ *P) {
    const jj_token *t = tok(P);
    if ((t->type == T_UNARY_OP || t->type == T_ADD_OP) && t->len == 1 && (t->s[0] == '-' || t->s[0] == '+')) {
        enter(P);
        P->pos++;
        jj_node *u = node(P, N_UNARY, t);
        u->op = t->s[0] == '-' ? OP_NEG : OP_POS;
        u->a = parse_unary_sign(P);
        leave(P);
        return u;
    }
    return parse_call_member(P);
}

static jj_node *parse_filter(P_ *P) {
    jj_node *operand = parse_unary_sign(P);
    while (is(P, T_PIPE)) {
        const jj_token *at = tok(P);
        P->pos++;
        jj_node *f = parse_primary(P);
        if (f->kind != N_IDENT) fail_at(P, at, "Expected identifier for the filter");
        if (is(P, T_LPAREN)) f = parse_call(P, f);
        jj_node *n = node(P, N_FILTER, at);
        n->a = operand, n->b = f;
        operand = n;
    }
    return operand;
}

static jj_node *parse_test(P_ *P) {
    jj_node *operand = parse_filter(P);
    while (is_ident(P, "is")) {
        const jj_token *at = tok(P);
        P->pos++;
        bool negate = is_ident(P, "not");
        if (negate) P->pos++;
        jj_node *t = parse_primary(P);
        if (t->kind != N_IDENT) fail_at(P, at, "Expected identifier for the test");
        jj_node *n = node(P, N_TEST, at);
        n->a = operand, n->str = t->str, n->flag = negate;
        operand = n;
    }
    return operand;
}

static int binop(const jj_token *t) {
    static const struct { const char *s; int op; } ops[] = {
        {"+", OP_ADD}, {"-", OP_SUB}, {"~", OP_CONCAT}, {"*", OP_MUL}, {"/", OP_DIV},
        {"//", OP_FLOORDIV}, {"%", OP_MOD}, {"**", OP_POW}, {"==", OP_EQ}, {"!=", OP_NE},
        {"<", OP_LT}, {">", OP_GT}, {"<=", OP_LE}, {">=", OP_GE}, {"in", OP_IN},
        {"and", OP_AND}, {"or", OP_OR},
    };
    for (size_t i = 0; i < PT_ARRAY_LEN(ops); i++)
        if (t->len == strlen(ops[i].s) && memcmp(t->s, ops[i].s, t->len) == 0) return ops[i].op;
    return -1;
}

static jj_node *binary(P_ *P, const jj_token *at, int op, jj_node *l, jj_node *r) {
    jj_node *n = node(P, N_BINARY, at);
    n->op = op, n->a = l, n->b = r;
    return n;
}

static jj_node *parse_power(P_ *P) {
    jj_node *l = parse_test(P);
    while (is(P, T_POW_OP)) {
        const jj_token *t = tok(P);
        P->pos++;
        l = binary(P, t, OP_POW, l, parse_test(P));
    }
    return l;
}

static jj_node *parse_mul(P_ *P) {
    jj_node *l = parse_power(P);
    while (is(P, T_MUL_OP)) {
        const jj_token *t = tok(P);
        P->pos++;
        l = binary(P, t, binop(t), l, parse_power(P));
    }
    return l;
}

static jj_node *parse_add(P_ *P) {
    jj_node *l = parse_mul(P);
    while (is(P, T_ADD_OP)) {
        const jj_token *t = tok(P);
        P->pos++;
        l = binary(P, t, binop(t), l, parse_mul(P));
    }
    return l;
}

static jj_node *parse_comparison(P_ *P) {
    jj_node *l = parse_add(P);
    for (;;) {
        const jj_token *t = tok(P);
        int op;
        if (is_ident(P, "not") && tok_is_ident(tok_at(P, P->pos + 1), "in"))
            op = OP_NOT_IN, P->pos += 2;
        else if (is_ident(P, "in"))
            op = OP_IN, P->pos++;
        else if (is(P, T_CMP_OP))
            op = binop(t), P->pos++;
        else
            break;
        l = binary(P, t, op, l, parse_add(P));
    }
    return l;
}

/* `not` binds looser than comparisons; like the reference, a second `not`
 * after a complete operand starts over (`not a not b` is `not b`). */
static jj_node *parse_not(P_ *P) {
    jj_node *r = NULL;
    while (is_ident(P, "not")) {
        enter(P);
        const jj_token *t = tok(P);
        P->pos++;
        jj_node *u = node(P, N_UNARY, t);
        u->op = OP_NOT;
        u->a = parse_not(P);
        r = u;
        leave(P);
    }
    return r ? r : parse_comparison(P);
}

static jj_node *parse_and(P_ *P) {
    jj_node *l = parse_not(P);
    while (is_ident(P, "and")) {
        const jj_token *t = tok(P);
        P->pos++;
        l = binary(P, t, OP_AND, l, parse_not(P));
    }
    return l;
}

static jj_node *parse_or(P_ *P) {
    jj_node *l = parse_and(P);
    while (is_ident(P, "or")) {
        const jj_token *t = tok(P);
        P->pos++;
        l = binary(P, t, OP_OR, l, parse_and(P));
    }
    return l;
}

static jj_node *parse_expression(P_ *P) {
    enter(P);
    jj_node *a = parse_or(P);
    if (is_ident(P, "if")) {
        const jj_token *at = tok(P);
        P->pos++;
        jj_node *test = parse_or(P);
        if (is_ident(P, "else")) {
            P->pos++;
            jj_node *t = node(P, N_TERNARY, at);
            t->a = test, t->b = a, t->c = parse_expression(P);
            a = t;
        } else {
            jj_node *s = node(P, N_SELECT, at);
            s->a = a, s->b = test;
            a = s;
        }
    }
    leave(P);
    return a;
}

static jj_node *parse_primary(P_ *P) {
    const jj_token *t = tok(P);
    P->pos++;
    switch (t->type) {
    case T_NUM: {
        char buf[64];
        size_t n = t->len < sizeof buf ? t->len : sizeof buf - 1;
        memcpy(buf, t->s, n);
        buf[n] = 0;
        bool is_float = memchr(t->s, '.', t->len) != NULL;
        jj_node *x = node(P, is_float ? N_FLOAT : N_INT, t);
        x->num = t->len < sizeof buf ? strtod(buf, NULL) : INFINITY; /* 64 digits overflow anyway */
        return x;
    }
    case T_STR: { /* adjacent literals concatenate */
        jj_buf b;
        jj_buf_init(&b, P->arena);
        jj_buf_add(&b, t->s, t->len);
        while (is(P, T_STR)) {
            jj_buf_add(&b, tok(P)->s, tok(P)->len);
            P->pos++;
        }
        jj_node *x = node(P, N_STR, t);
        x->str = jj_buf_str(&b);
        return x;
    }
    case T_IDENT: {
        jj_node *x = node(P, N_IDENT, t);
        x->str = jj_str(P->arena, t->s, t->len);
        return x;
    }
    case T_LPAREN: {
        enter(P);
        jj_node *e = parse_sequence(P, false);
        expect(P, T_RPAREN, "Expected closing parenthesis");
        leave(P);
        return e;
    }
    case T_LBRACKET: {
        enter(P);
        vec items = {0};
        while (!is(P, T_RBRACKET)) {
            if (tok(P)->type < 0) fail_at(P, tok(P), "Unexpected end of template in list literal");
            vec_push(P, &items, parse_expression(P));
            if (is(P, T_COMMA)) P->pos++;
        }
        P->pos++;
        jj_node *x = node(P, N_ARRAY, t);
        set_list(x, &items, false);
        leave(P);
        return x;
    }
    case T_LBRACE: {
        enter(P);
        vec keys = {0}, vals = {0};
        while (!is(P, T_RBRACE)) {
            if (tok(P)->type < 0) fail_at(P, tok(P), "Unexpected end of template in dict literal");
            vec_push(P, &keys, parse_expression(P));
            expect(P, T_COLON, "Expected colon between key and value in object literal");
            vec_push(P, &vals, parse_expression(P));
            if (is(P, T_COMMA)) P->pos++;
        }
        P->pos++;
        jj_node *x = node(P, N_OBJECT, t);
        set_list(x, &keys, false);
        set_list(x, &vals, true);
        leave(P);
        return x;
    }
    default: {
        char msg[80];
        snprintf(msg, sizeof msg, "Unexpected token: %s", type_name(t->type));
        fail_at(P, t, msg);
    }
    }
}

/* ---- which macros read kwargs / varargs ---- */

/* Operator chains (a + b + c ...) build trees deeper than the parser's
 * recursion; the scan below bounds its own depth. */
enum { MAX_SCAN_DEPTH = 2000 };

typedef struct special_scan {
    P_ *P;
    int declared, accessed, depth;
} special_scan;

static int special_bit(const jstr *s) {
    return jj_str_is(s, "kwargs") ? USES_KWARGS : jj_str_is(s, "varargs") ? USES_VARARGS : 0;
}

static void declare_target(special_scan *s, const jj_node *t) {
    if (!t) return;
    if (t->kind == N_IDENT) s->declared |= special_bit(t->str);
    if (t->kind == N_TUPLE)
        for (size_t i = 0; i < t->n; i++) declare_target(s, t->list[i]);
}

static void scan(special_scan *s, const jj_node *n);

static void scan_list(special_scan *s, jj_node **l, size_t n) {
    for (size_t i = 0; i < n; i++) scan(s, l[i]);
}

static void declare_params(special_scan *s, const jj_node *owner) {
    for (size_t i = 0; i < owner->n; i++) s->declared |= special_bit(owner->list[i]->str);
    for (size_t i = 0; i < owner->n; i++)
        if (owner->list[i]->kind == N_KWARG) scan(s, owner->list[i]->a);
}

/* A load of kwargs/varargs before anything declares that name, in the
 * order the reference (and Jinja) visits the tree. */
static void scan_node(special_scan *s, const jj_node *n);

static void scan(special_scan *s, const jj_node *n) {
    if (!n) return;
    if (++s->depth > MAX_SCAN_DEPTH) jj_compile_fail(s->P, n->off, "template nests too deeply");
    scan_node(s, n);
    s->depth--;
}

static void scan_node(special_scan *s, const jj_node *n) {
    switch (n->kind) {
    case N_IDENT: {
        int bit = special_bit(n->str);
        if (bit && !(s->declared & bit)) s->accessed |= bit;
        return;
    }
    case N_FOR:
        declare_target(s, n->a);
        if (n->b->kind == N_SELECT) {
            scan(s, n->b->a);
            scan_list(s, n->list, n->n);
            scan_list(s, n->list2, n->n2);
            scan(s, n->b->b);
            return;
        }
        scan(s, n->b);
        scan_list(s, n->list, n->n);
        scan_list(s, n->list2, n->n2);
        return;
    case N_SET:
        declare_target(s, n->a);
        scan(s, n->b);
        scan_list(s, n->list, n->n);
        return;
    case N_MACRO:
        declare_params(s, n);
        scan_list(s, n->list2, n->n2);
        return;
    case N_CALLBLOCK:
        scan(s, n->a);
        declare_params(s, n);
        scan_list(s, n->list2, n->n2);
        return;
    case N_FILTERBLOCK:
        scan_list(s, n->list, n->n);
        if (n->a->kind == N_CALL) scan_list(s, n->a->list, n->a->n);
        return;
    case N_FILTER:
        scan(s, n->a);
        if (n->b->kind == N_CALL) scan_list(s, n->b->list, n->b->n);
        return;
    case N_MEMBER:
        scan(s, n->a);
        if (n->flag) scan(s, n->b);
        return;
    case N_TEST: scan(s, n->a); return;
    case N_SELECT:
        scan(s, n->b);
        scan(s, n->a);
        return;
    case N_KWARG: scan(s, n->a); return;
    case N_TERNARY: /* constructor order: condition, then the two values */
        scan(s, n->a);
        scan(s, n->b);
        scan(s, n->c);
        return;
    default:
        scan(s, n->a);
        scan(s, n->b);
        scan(s, n->c);
        scan_list(s, n->list, n->n);
        scan_list(s, n->list2, n->n2);
    }
}

/* params: the owner's list; body: its list2. */
static int special_args(P_ *P, const jj_node *owner) {
    special_scan s = {P, 0, 0, 0};
    for (size_t i = 0; i < owner->n; i++) s.declared |= special_bit(owner->list[i]->str);
    scan_list(&s, owner->list2, owner->n2);
    return s.accessed;
}

/* ---- statements ---- */

static jj_node *parse_set(P_ *P, const jj_token *at) {
    jj_node *n = node(P, N_SET, at);
    n->a = parse_sequence(P, false);
    if (is(P, T_EQUALS)) {
        P->pos++;
        n->b = parse_sequence(P, false);
    } else {
        expect(P, T_CLOSE_STMT, "Expected %} token");
        vec body = {0};
        parse_body(P, &body, "endset", "endset", NULL, NULL);
        set_list(n, &body, false);
        expect(P, T_OPEN_STMT, "Expected {% token");
        expect_ident(P, "endset");
    }
    expect(P, T_CLOSE_STMT, "Expected closing statement token");
    return n;
}

/* if / elif chain; the caller consumes {% endif %}. */
static jj_node *parse_if(P_ *P, const jj_token *at) {
    enter(P);
    jj_node *n = node(P, N_IF, at);
    n->a = parse_expression(P);
    expect(P, T_CLOSE_STMT, "Expected closing statement token");
    vec body = {0}, alt = {0};
    parse_body(P, &body, "endif", "elif", "else", "endif");
    if (is_statement(P, "elif", NULL, NULL)) {
        const jj_token *elif = tok_at(P, P->pos + 1);
        P->pos += 2;
        vec_push(P, &alt, parse_if(P, elif));
    } else if (is_statement(P, "else", NULL, NULL)) {
        P->pos += 2;
        expect(P, T_CLOSE_STMT, "Expected closing statement token");
        parse_body(P, &alt, "endif", "endif", NULL, NULL);
    }
    set_list(n, &body, false);
    set_list(n, &alt, true);
    leave(P);
    return n;
}

static jj_node *parse_for(P_ *P, const jj_token *at) {
    jj_node *n = node(P, N_FOR, at);
    n->a = parse_sequence(P, true);
    if (n->a->kind != N_IDENT && n->a->kind != N_TUPLE)
        fail_at(P, at, "Expected identifier/tuple for the loop variable");
    if (!is_ident(P, "in")) fail_at(P, tok(P), "Expected `in` keyword following loop variable");
    P->pos++;
    n->b = parse_expression(P);
    expect(P, T_CLOSE_STMT, "Expected closing statement token");
    vec body = {0}, alt = {0};
    parse_body(P, &body, "endfor", "endfor", "else", NULL);
    if (is_statement(P, "else", NULL, NULL)) {
        P->pos += 2;
        expect(P, T_CLOSE_STMT, "Expected closing statement token");
        parse_body(P, &alt, "endfor", "endfor", NULL, NULL);
    }
    set_list(n, &body, false);
    set_list(n, &alt, true);
    return n;
}

static jj_node *parse_macro(P_ *P, const jj_token *at) {
    jj_node *n = node(P, N_MACRO, at);
    jj_node *name = parse_primary(P);
    if (name->kind != N_IDENT) fail_at(P, at, "Expected identifier following macro statement");
    n->str = name->str;
    vec params = {0}, body = {0};
    parse_args(P, true, &params);
    expect(P, T_CLOSE_STMT, "Expected closing statement token");
    parse_body(P, &body, "endmacro", "endmacro", NULL, NULL);
    set_list(n, &params, false);
    set_list(n, &body, true);
    n->op = special_args(P, n);
    return n;
}

static jj_node *parse_call_block(P_ *P, const jj_token *at) {
    jj_node *n = node(P, N_CALLBLOCK, at);
    vec params = {0}, body = {0};
    if (is(P, T_LPAREN)) parse_args(P, true, &params);
    jj_node *callee = parse_primary(P);
    if (callee->kind != N_IDENT) fail_at(P, at, "Expected identifier following call statement");
    jj_node *call = node(P, N_CALL, at);
    call->a = callee;
    vec args = {0};
    parse_args(P, false, &args);
    set_list(call, &args, false);
    n->a = call;
    expect(P, T_CLOSE_STMT, "Expected closing statement token");
    parse_body(P, &body, "endcall", "endcall", NULL, NULL);
    expect(P, T_OPEN_STMT, "Expected '{%'");
    expect_ident(P, "endcall");
    expect(P, T_CLOSE_STMT, "Expected closing statement token");
    set_list(n, &params, false);
    set_list(n, &body, true);
    n->op = special_args(P, n);
    return n;
}

static jj_node *parse_filter_block(P_ *P, const jj_token *at) {
    jj_node *n = node(P, N_FILTERBLOCK, at);
    jj_node *f = parse_primary(P);
    if (f->kind == N_IDENT && is(P, T_LPAREN)) f = parse_call(P, f);
    n->a = f;
    expect(P, T_CLOSE_STMT, "Expected closing statement token");
    vec body = {0};
    parse_body(P, &body, "endfilter", "endfilter", NULL, NULL);
    set_list(n, &body, false);
    expect(P, T_OPEN_STMT, "Expected '{%'");
    expect_ident(P, "endfilter");
    expect(P, T_CLOSE_STMT, "Expected '%}'");
    return n;
}

static void expect_end(P_ *P, const char *name) {
    expect(P, T_OPEN_STMT, "Expected {% token");
    expect_ident(P, name);
    expect(P, T_CLOSE_STMT, "Expected %} token");
}

static jj_node *parse_statement(P_ *P) {
    expect(P, T_OPEN_STMT, "Expected opening statement token");
    const jj_token *t = tok(P);
    if (t->type != T_IDENT) fail_at(P, t, "Unknown statement");
    P->pos++;
    jj_node *n;
    if (tok_is_ident(t, "set")) {
        n = parse_set(P, t);
    } else if (tok_is_ident(t, "if")) {
        n = parse_if(P, t);
        expect_end(P, "endif");
    } else if (tok_is_ident(t, "macro")) {
        n = parse_macro(P, t);
        expect_end(P, "endmacro");
    } else if (tok_is_ident(t, "for")) {
        n = parse_for(P, t);
        expect_end(P, "endfor");
    } else if (tok_is_ident(t, "call")) {
        n = parse_call_block(P, t);
    } else if (tok_is_ident(t, "break") || tok_is_ident(t, "continue")) {
        n = node(P, tok_is_ident(t, "break") ? N_BREAK : N_CONTINUE, t);
        expect(P, T_CLOSE_STMT, "Expected closing statement token");
    } else if (tok_is_ident(t, "filter")) {
        n = parse_filter_block(P, t);
    } else {
        char msg[120];
        snprintf(msg, sizeof msg, "Unknown statement type: %.*s", (int)PT_MIN(t->len, 64), t->s);
        fail_at(P, t, msg);
    }
    return n;
}

static jj_node *parse_any(P_ *P) {
    const jj_token *t = tok(P);
    jj_node *n;
    enter(P);
    switch (t->type) {
    case T_COMMENT:
    case T_TEXT:
        n = node(P, t->type == T_TEXT ? N_TEXT : N_COMMENT, t);
        n->str = jj_str(P->arena, t->s, t->len);
        P->pos++;
        break;
    case T_OPEN_STMT: n = parse_statement(P); break;
    case T_OPEN_EXPR:
        P->pos++;
        n = parse_expression(P);
        expect(P, T_CLOSE_EXPR, "Expected closing expression token");
        break;
    default: {
        char msg[80];
        snprintf(msg, sizeof msg, "Unexpected token type: %s", type_name(t->type));
        fail_at(P, t, msg);
    }
    }
    leave(P);
    return n;
}

void jj_parse(jj_compile *P, jj_node ***body, size_t *n) {
    vec v = {0};
    P->pos = 0;
    while (P->pos < P->n_toks) vec_push(P, &v, parse_any(P));
    *body = v.v;
    *n = v.n;
}

/* ---- the public entry points ---- */

static void compile_oom(void *ctx) {
    jj_compile *c = ctx;
    snprintf(c->msg, sizeof c->msg, "jinja: template too large to compile");
    longjmp(c->jmp, 1);
}

int pt_jinja_compile(pt_jinja **out, const char *src, size_t len, pt_err *err) {
    *out = NULL;
    if (len > MAX_SOURCE) return pt_fail(err, "jinja: template of %zu bytes is over the %d-byte limit", len, MAX_SOURCE);
    size_t bad;
    if (!jj_utf8_valid(src, len, &bad)) {
        int line, col;
        jj_line_col(src, len, bad, &line, &col);
        return pt_fail(err, "jinja %d:%d: template is not valid UTF-8", line, col);
    }
    pt_jinja *t = pt_xcalloc(1, sizeof *t);
    t->src = pt_xmalloc(len + 1);
    memcpy(t->src, src, len);
    t->src[len] = 0;
    t->src_len = len;
    /* tokens, tree and the preprocessed copies take at most a few hundred
     * bytes per source byte; the cap only stops a runaway */
    t->arena.cap = 512 * len + (4 << 20);
    jj_compile *c = pt_xcalloc(1, sizeof *c);
    c->arena = &t->arena;
    c->src = t->src;
    c->src_len = len;
    t->arena.oom = compile_oom;
    t->arena.oom_ctx = c;
    if (setjmp(c->jmp)) {
        pt_fail(err, "%s", c->msg);
        free(c);
        pt_jinja_free(t);
        return -1;
    }
    jj_tokenize(c);
    jj_parse(c, &t->body, &t->n_body);
    t->arena.oom = NULL;
    free(c);
    *out = t;
    return 0;
}

void pt_jinja_free(pt_jinja *t) {
    if (!t) return;
    jj_arena_free(&t->arena);
    free(t->src);
    free(t);
}
