/*
 * jinja_int.h - the parts of the Jinja interpreter its own files share:
 * the arena, tokens, the syntax tree, run-time values and the render
 * context.  Nothing outside src/tokenizer/jinja_*.c includes this.
 *
 * Memory: everything a compile or a render allocates comes from one arena
 * that is freed whole at the end, so the code never frees piecemeal and an
 * error can unwind with longjmp from any depth without leaking.  Values may
 * therefore share structure freely (and do, as JavaScript's do: `a == b`
 * for two lists is identity, exactly as in the reference).
 *
 * Strings are UTF-8, always valid (the source is checked at compile time and
 * JSON strings are checked by jansson), with an explicit length; they may
 * hold NUL.  Where the reference counts UTF-16 code units (length, s[i]) the
 * helpers in jinja_str.c do the same.
 */
#ifndef PETREL_JINJA_INT_H
#define PETREL_JINJA_INT_H

#include <setjmp.h>

#include "tokenizer/jinja.h"

/* ---- arena (jinja_value.c) ---- */

typedef struct jj_chunk jj_chunk;
typedef struct jj_arena {
    jj_chunk *head;
    size_t used; /* bytes handed out, for the cap */
    size_t cap;
    void (*oom)(void *ctx); /* called when cap would be exceeded; must not return */
    void *oom_ctx;
} jj_arena;

void *jj_alloc(jj_arena *a, size_t n); /* 16-byte aligned, uninitialized */
void *jj_zalloc(jj_arena *a, size_t n);
void jj_arena_free(jj_arena *a);

/* ---- strings ---- */

typedef struct jstr {
    size_t len;
    char s[]; /* NUL-terminated as a convenience */
} jstr;

jstr *jj_str(jj_arena *a, const char *s, size_t len);
jstr *jj_cstr(jj_arena *a, const char *s);
static inline bool jj_str_eq(const jstr *a, const char *s, size_t len) {
    return a->len == len && memcmp(a->s, s, len) == 0;
}
static inline bool jj_str_is(const jstr *a, const char *cs) {
    return jj_str_eq(a, cs, strlen(cs));
}

/* Growable byte buffer in an arena. */
typedef struct jj_buf {
    jj_arena *arena;
    char *p;
    size_t n, cap;
} jj_buf;

void jj_buf_init(jj_buf *b, jj_arena *a);
void jj_buf_add(jj_buf *b, const char *s, size_t n);
static inline void jj_buf_adds(jj_buf *b, const char *s) { jj_buf_add(b, s, strlen(s)); }
void jj_buf_addc(jj_buf *b, char c);
void jj_buf_add_cp(jj_buf *b, uint32_t cp); /* as UTF-8 */
jstr *jj_buf_str(jj_buf *b);

/* ---- text helpers that follow JavaScript (jinja_str.c) ---- */

int jj_utf8_dec(const char *s, size_t n, uint32_t *cp); /* bytes used, >= 1 */
bool jj_utf8_valid(const char *s, size_t n, size_t *bad_at);
bool jj_js_space(uint32_t cp);                          /* JS \s */
size_t jj_js_space_at(const char *s, size_t n, size_t i); /* bytes of a \s at i, or 0 */
size_t jj_js_space_before(const char *s, size_t i);       /* bytes of a \s ending at i, or 0 */
void jj_trim(const char *s, size_t n, bool start, bool end, size_t *b, size_t *e);
size_t jj_utf16_len(const char *s, size_t n);
/* The UTF-16 code unit at index i (negative from the end), as a string:
 * a lone surrogate becomes U+FFFD, which is what Node writes for it. */
bool jj_utf16_at(const char *s, size_t n, double i, jj_buf *out);
int jj_utf16_cmp(const char *a, size_t an, const char *b, size_t bn);
void jj_case_map(const char *s, size_t n, bool upper, jj_buf *out);
void jj_title(const char *s, size_t n, jj_buf *out);
void jj_capitalize(const char *s, size_t n, jj_buf *out);
/* Number -> text as JavaScript's String(x); buf needs 32 bytes. */
const char *jj_num_fmt(double x, char *buf);
/* FloatValue's toString: integral values keep a ".0". buf needs 400 bytes. */
const char *jj_float_fmt(double x, char *buf);
double jj_parse_int(const char *s, size_t n);   /* parseInt(s, 10); NaN if none */
double jj_parse_float(const char *s, size_t n); /* parseFloat(s); NaN if none */
double jj_to_number(const char *s, size_t n);   /* Number(s) */
/* JSON.stringify(string), optionally with non-ASCII escaped. */
void jj_json_quote(const char *s, size_t n, bool ascii, jj_buf *out);

/* ---- tokens (jinja_lex.c) ---- */

enum {
    T_TEXT, T_NUM, T_STR, T_IDENT, T_EQUALS, T_LPAREN, T_RPAREN, T_OPEN_STMT, T_CLOSE_STMT,
    T_OPEN_EXPR, T_CLOSE_EXPR, T_LBRACKET, T_RBRACKET, T_LBRACE, T_RBRACE, T_COMMA, T_DOT,
    T_COLON, T_PIPE, T_ADD_OP, T_MUL_OP, T_POW_OP, T_CMP_OP, T_UNARY_OP, T_COMMENT,
};

typedef struct jj_token {
    int type;
    const char *s; /* value: the text, unescaped string, operator or number */
    size_t len;
    uint32_t off; /* offset in the original source, for line:col */
} jj_token;

/* The compiled template (jinja_parse.c). */
typedef struct jj_node jj_node;
struct pt_jinja {
    jj_arena arena;
    char *src; /* the original source, for line:col */
    size_t src_len;
    jj_node **body;
    size_t n_body;
};

/* Shared by lexer and parser: errors longjmp to jmp with msg filled. */
typedef struct jj_compile {
    jj_arena *arena;
    const char *src; /* as given */
    size_t src_len;
    char *pp; /* after the trim_blocks/lstrip_blocks preprocessing */
    uint32_t *pp_off; /* pp[i] came from src[pp_off[i]] */
    size_t pp_len;
    jmp_buf jmp;
    char msg[400];
    jj_token *toks;
    size_t n_toks, pos;
    int depth;
} jj_compile;

void jj_line_col(const char *src, size_t len, size_t off, int *line, int *col);
_Noreturn void jj_compile_fail(jj_compile *c, size_t off, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void jj_tokenize(jj_compile *c);

/* ---- syntax tree (jinja_parse.c) ---- */

enum {
    /* statements */
    N_TEXT, N_COMMENT, N_IF, N_FOR, N_SET, N_MACRO, N_CALLBLOCK, N_FILTERBLOCK, N_BREAK,
    N_CONTINUE,
    /* expressions */
    N_INT, N_FLOAT, N_STR, N_IDENT, N_ARRAY, N_TUPLE, N_OBJECT, N_MEMBER, N_SLICE, N_CALL,
    N_KWARG, N_SPREAD, N_KWSPREAD, N_BINARY, N_UNARY, N_FILTER, N_TEST, N_SELECT, N_TERNARY,
};

enum {
    OP_OR, OP_AND, OP_IN, OP_NOT_IN, OP_EQ, OP_NE, OP_LT, OP_GT, OP_LE, OP_GE, OP_ADD, OP_SUB,
    OP_CONCAT, OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD, OP_POW, OP_NOT, OP_NEG, OP_POS,
};

/* Macro bodies that read these get them bound (see bind_macro_args). */
enum { USES_KWARGS = 1, USES_VARARGS = 2 };

/* One node type for all; the comment on each kind says which fields it uses. */
struct jj_node {
    int kind;
    int op;       /* N_BINARY/N_UNARY: OP_*; N_MACRO/N_CALLBLOCK: USES_* */
    bool flag;    /* N_MEMBER: computed; N_TEST: negated */
    uint32_t off; /* source offset */
    jstr *str;    /* N_TEXT/N_STR/N_IDENT/N_COMMENT value; N_KWARG/N_TEST/N_MACRO name */
    double num;   /* N_INT/N_FLOAT */
    jj_node *a, *b, *c;
    /* N_MEMBER a.b  N_SLICE [a:b:c] (each may be NULL)  N_CALL a(list)
     * N_KWARG str=a  N_SPREAD *a  N_KWSPREAD **a  N_BINARY a op b  N_UNARY op a
     * N_FILTER a|b (b: N_IDENT or N_CALL)  N_TEST a is str  N_SELECT a if b
     * N_TERNARY b if a else c  N_IF if a: list else list2
     * N_FOR for a in b: list else list2  N_SET a = b, or body list
     * N_MACRO str(list): list2  N_CALLBLOCK call(list) a: list2
     * N_FILTERBLOCK filter a: list  N_ARRAY/N_TUPLE list
     * N_OBJECT {list[i]: list2[i]} */
    jj_node **list, **list2;
    size_t n, n2;
};

void jj_parse(jj_compile *c, jj_node ***body, size_t *n);

/* ---- values (jinja_value.c) ---- */

typedef enum {
    JV_UNDEF, JV_NULL, JV_BOOL, JV_INT, JV_FLOAT, JV_STR, JV_ARRAY, JV_TUPLE, JV_OBJECT,
    JV_KWARGS, JV_NS, JV_FUNC,
} jv_kind;

typedef struct jv jv;
typedef struct jlist jlist;
typedef struct jmap jmap;
typedef struct jfunc jfunc;

struct jv {
    jv_kind kind;
    union {
        bool b;
        double n; /* JV_INT too: the reference's numbers are doubles */
        jstr *s;
        jlist *l; /* JV_ARRAY, JV_TUPLE */
        jmap *m;  /* JV_OBJECT, JV_KWARGS, JV_NS */
        jfunc *f;
    };
};

struct jlist {
    size_t n, cap;
    jv *v;
};

/* Insertion-ordered string-keyed map. */
struct jmap {
    size_t n, cap;
    jstr **k;
    jv *v;
};

typedef struct jj_render jj_render;
typedef struct jenv jenv;

/* A built-in gets its receiver (for methods), positional arguments and, as
 * the reference passes them, a trailing JV_KWARGS when keywords were given. */
typedef jv (*jj_builtin_fn)(jj_render *R, const jj_node *at, jv self, jv *args, size_t n);

struct jfunc {
    jj_builtin_fn fn; /* NULL for macros and call-block callers */
    jv self;
    const char *name;
    const jj_node *macro; /* N_MACRO, or N_CALLBLOCK for its caller() */
    jenv *env;            /* caller(): the scope the call block was in */
};

static inline jv jv_undef(void) { return (jv){.kind = JV_UNDEF}; }
static inline jv jv_null(void) { return (jv){.kind = JV_NULL}; }
static inline jv jv_bool(bool b) { return (jv){.kind = JV_BOOL, .b = b}; }
static inline jv jv_int(double n) { return (jv){.kind = JV_INT, .n = n}; }
static inline jv jv_float(double n) { return (jv){.kind = JV_FLOAT, .n = n}; }
static inline jv jv_strv(jstr *s) { return (jv){.kind = JV_STR, .s = s}; }
static inline bool jv_is_num(jv v) { return v.kind == JV_INT || v.kind == JV_FLOAT; }
static inline bool jv_is_list(jv v) { return v.kind == JV_ARRAY || v.kind == JV_TUPLE; }
static inline bool jv_is_map(jv v) { return v.kind == JV_OBJECT || v.kind == JV_KWARGS; }
/* ObjectValue or NamespaceValue: what `.attr` reads a key of. */
static inline bool jv_is_attr(jv v) { return jv_is_map(v) || v.kind == JV_NS; }

jv jv_str(jj_render *R, const char *s, size_t n);
jv jv_cstr(jj_render *R, const char *s);
jlist *jj_list_new(jj_render *R, size_t cap);
void jj_list_push(jj_render *R, jlist *l, jv v);
jv jv_list(jlist *l, jv_kind kind);
jmap *jj_map_new(jj_render *R, size_t cap);
jv *jj_map_get(const jmap *m, const char *k, size_t n);
void jj_map_set(jj_render *R, jmap *m, jstr *k, jv v);
bool jj_map_del(jmap *m, const char *k, size_t n);
jv jv_map(jmap *m, jv_kind kind);

const char *jv_type_name(jv v); /* the reference's names: "StringValue", ... */
bool jv_truthy(jv v);           /* __bool__ */
bool jv_js_truthy(jv v);        /* !!v.value, as JavaScript sees the raw value */
void jv_to_string(jj_render *R, jv v, jj_buf *out);     /* RuntimeValue.toString() */
void jv_raw_to_string(jj_render *R, jv v, jj_buf *out); /* String(v.value) */
jstr *jv_stringify(jj_render *R, jv v);                 /* jv_to_string as a string */

typedef struct jj_json_opts {
    int indent; /* 0: none */
    bool ascii, sort_keys;
    const jstr *item_sep, *key_sep; /* NULL: defaults */
    bool undef_as_null;
} jj_json_opts;
void jv_to_json(jj_render *R, jv v, const jj_json_opts *o, jj_buf *out);

bool jv_loose_eq(jj_render *R, jv a, jv b);  /* a.value == b.value */
bool jv_strict_eq(jv a, jv b);               /* a.value === b.value */
int jv_compare(jj_render *R, const jj_node *at, jv a, jv b, bool case_sensitive);
jv jv_from_json(jj_render *R, const json_t *j, int depth);

/* ---- rendering (jinja_eval.c) ---- */

struct jenv {
    jenv *parent;
    size_t n, cap;
    const jstr **names;
    jv *vals;
};

struct jj_render {
    jj_arena arena;
    jmp_buf jmp;
    pt_err *err;
    int status; /* -1 or PT_JINJA_RAISED once failed */
    const pt_jinja *tpl;
    pt_jinja_opts opts;
    uint64_t steps;
    int depth;
    bool hole; /* the last filter produced JavaScript's undefined (see eval_filter) */
    jstr *loop_keys[9]; /* the keys of `loop`, shared by all its objects */
    jenv *global;
};

_Noreturn void jj_fail(jj_render *R, const jj_node *at, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
_Noreturn void jj_raise(jj_render *R, const char *msg, size_t n);
void jj_step(jj_render *R, const jj_node *at, uint64_t n);

jenv *jj_env_new(jj_render *R, jenv *parent);
void jj_env_set(jj_render *R, jenv *e, const jstr *name, jv v);
jv jj_env_get(const jenv *e, const char *name, size_t n);

jv jj_eval(jj_render *R, const jj_node *n, jenv *env);
jv jj_call(jj_render *R, const jj_node *at, jv fn, jv *args, size_t n, jenv *env);
/* Evaluates a call's argument list: positionals (with *spread) into pos,
 * keywords (with **spread) into *kw (NULL when none). */
void jj_eval_args(jj_render *R, const jj_node *call, jenv *env, jlist **pos, jmap **kw);

/* ---- built-ins (jinja_builtin.c) ---- */

jv jj_apply_filter(jj_render *R, jv operand, const jj_node *filter, jenv *env);
bool jj_apply_test(jj_render *R, const jj_node *at, const jstr *name, jv *args, size_t n);
jv jj_member_builtin(jj_render *R, const jj_node *at, jv obj, const char *name, size_t n);
void jj_setup_globals(jj_render *R, jenv *env);

#endif
