/*
 * jinja_lex.c - template source to tokens.
 *
 * Two passes, as the reference does them:
 *
 * 1. Preprocessing with Hugging Face's settings (trim_blocks and
 *    lstrip_blocks on): drop one trailing newline; drop spaces and tabs
 *    that start a line before `{%`, `{#` or `{-`; drop the newline right
 *    after `%}`, `#}` or `-}`; remove transformers' `{% generation %}` tags.
 *    These are plain text rewrites, applied to the whole source (text and
 *    tags alike), so they are done the same way here.  Each byte kept
 *    remembers where it came from, for error positions.
 *
 * 2. Tokenizing: text runs up to the next `{{`, `{%` or `{#`; inside a tag,
 *    operators, names, numbers and string literals.  `{%-`, `-%}` and
 *    friends strip the whitespace around them.  A `-` or `+` that cannot
 *    be a binary operator (after `(`, `,`, an operator...) is a sign and
 *    joins a following number: `-1` is one token.
 *
 * The scanning rules, including their corner cases (what ends a comment,
 * when `}}` closes a tag inside a dict literal), follow the reference,
 * because they decide what a template means.
 */
#include <stdarg.h>
#include <stdio.h>

#include "tokenizer/jinja_int.h"

void jj_line_col(const char *src, size_t len, size_t off, int *line, int *col) {
    int l = 1, c = 1;
    for (size_t i = 0; i < off && i < len; i++) {
        if (src[i] == '\n')
            l++, c = 1;
        else if (((unsigned char)src[i] & 0xC0) != 0x80)
            c++;
    }
    *line = l;
    *col = c;
}

void jj_compile_fail(jj_compile *c, size_t off, const char *fmt, ...) {
    int line, col;
    jj_line_col(c->src, c->src_len, off, &line, &col);
    int k = snprintf(c->msg, sizeof c->msg, "jinja %d:%d: ", line, col);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->msg + k, sizeof c->msg - (size_t)k, fmt, ap);
    va_end(ap);
    longjmp(c->jmp, 1);
}

/* ---- pass 1: preprocessing ---- */

typedef struct text {
    char *s;
    uint32_t *off;
    size_t n;
} text;

static text text_new(jj_compile *c, size_t cap) {
    text t = {jj_alloc(c->arena, cap + 1), jj_alloc(c->arena, (cap + 1) * sizeof(uint32_t)), 0};
    return t;
}

static void keep(text *to, const text *from, size_t i) {
    to->s[to->n] = from->s[i];
    to->off[to->n++] = from->off[i];
}

/* Bytes of a JavaScript line terminator ending just before i (multiline ^). */
static bool line_start(const text *t, size_t i) {
    if (i == 0) return true;
    char p = t->s[i - 1];
    if (p == '\n' || p == '\r') return true;
    return i >= 3 && (unsigned char)t->s[i - 3] == 0xE2 && (unsigned char)t->s[i - 2] == 0x80 &&
           ((unsigned char)p == 0xA8 || (unsigned char)p == 0xA9);
}

/* /^[ \t]*({[#%-])/gm -> "$1" */
static text lstrip_blocks(jj_compile *c, const text *in) {
    text out = text_new(c, in->n);
    for (size_t i = 0; i < in->n;) {
        if (line_start(in, i)) {
            size_t q = i;
            while (q < in->n && (in->s[q] == ' ' || in->s[q] == '\t')) q++;
            if (q + 1 < in->n && in->s[q] == '{' && strchr("#%-", in->s[q + 1]) && in->s[q + 1])
                i = q; /* drop the indentation */
        }
        keep(&out, in, i++);
    }
    return out;
}

/* /([#%-]})\n/g -> "$1" */
static text trim_blocks(jj_compile *c, const text *in) {
    text out = text_new(c, in->n);
    for (size_t i = 0; i < in->n;) {
        if (i + 2 < in->n && in->s[i] && strchr("#%-", in->s[i]) && in->s[i + 1] == '}' && in->s[i + 2] == '\n') {
            keep(&out, in, i);
            keep(&out, in, i + 1);
            i += 3;
            continue;
        }
        keep(&out, in, i++);
    }
    return out;
}

static size_t skip_ws(const text *t, size_t i) {
    size_t k;
    while ((k = jj_js_space_at(t->s, t->n, i)) > 0) i += k;
    return i;
}

/* Length of a `{%-? (end)?generation -?%}` tag at i, or 0; reports its dashes. */
static size_t generation_tag(const text *t, size_t i, bool *lstrip, bool *rstrip) {
    size_t p = i;
    if (p + 1 >= t->n || t->s[p] != '{' || t->s[p + 1] != '%') return 0;
    p += 2;
    *lstrip = p < t->n && t->s[p] == '-';
    if (*lstrip) p++;
    p = skip_ws(t, p);
    if (t->n - p >= 3 && memcmp(t->s + p, "end", 3) == 0 && t->n - p >= 13 &&
        memcmp(t->s + p + 3, "generation", 10) == 0)
        p += 3;
    if (t->n - p < 10 || memcmp(t->s + p, "generation", 10) != 0) return 0;
    p = skip_ws(t, p + 10);
    *rstrip = p < t->n && t->s[p] == '-';
    if (*rstrip) p++;
    if (p + 1 >= t->n || t->s[p] != '%' || t->s[p + 1] != '}') return 0;
    return p + 2 - i;
}

/* /(\s*){%(-?)\s*(?:end)?generation\s*(-?)%}(\s*)/gs -> whitespace kept
 * on a side unless that side has a dash. */
static text strip_generation(jj_compile *c, const text *in) {
    text out = text_new(c, in->n);
    size_t copied = 0; /* in[0..copied) is in out */
    for (size_t i = 0; i < in->n; i++) {
        bool ls, rs;
        size_t len = generation_tag(in, i, &ls, &rs);
        if (!len) continue;
        size_t ws = i; /* whitespace before the tag, not before the last match */
        size_t k;
        while (ws > copied && (k = jj_js_space_before(in->s, ws)) > 0 && ws - k >= copied) ws -= k;
        for (size_t j = copied; j < (ls ? ws : i); j++) keep(&out, in, j);
        size_t end = i + len, after = skip_ws(in, end);
        if (!rs)
            for (size_t j = end; j < after; j++) keep(&out, in, j);
        copied = after;
        i = after - 1;
    }
    for (size_t j = copied; j < in->n; j++) keep(&out, in, j);
    return out;
}

static void preprocess(jj_compile *c) {
    text t = text_new(c, c->src_len);
    memcpy(t.s, c->src, c->src_len);
    for (size_t i = 0; i < c->src_len; i++) t.off[i] = (uint32_t)i;
    t.n = c->src_len;
    if (t.n && t.s[t.n - 1] == '\n') t.n--;
    t = lstrip_blocks(c, &t);
    t = trim_blocks(c, &t);
    t = strip_generation(c, &t);
    t.s[t.n] = 0;
    t.off[t.n] = (uint32_t)c->src_len;
    c->pp = t.s;
    c->pp_off = t.off;
    c->pp_len = t.n;
}

/* ---- pass 2: tokens ---- */

typedef struct lexer {
    jj_compile *c;
    const char *s;
    size_t n, cur;
    size_t cap;
    int curly; /* depth of { } inside an expression, where }} does not close */
} lexer;

static _Noreturn void lex_fail(lexer *L, const char *fmt, const char *arg) {
    jj_compile_fail(L->c, L->c->pp_off[L->cur < L->n ? L->cur : L->n], fmt, arg);
}

static int last_type(const lexer *L) {
    return L->c->n_toks ? L->c->toks[L->c->n_toks - 1].type : -1;
}

static void push(lexer *L, int type, const char *s, size_t len, size_t at) {
    jj_compile *c = L->c;
    if (c->n_toks == L->cap) {
        size_t cap = L->cap ? L->cap * 2 : 256;
        jj_token *t = jj_alloc(c->arena, cap * sizeof *t);
        if (c->n_toks) memcpy(t, c->toks, c->n_toks * sizeof *t);
        c->toks = t;
        L->cap = cap;
    }
    c->toks[c->n_toks++] = (jj_token){type, s, len, c->pp_off[at]};
}

static bool is_digit(char ch) { return ch >= '0' && ch <= '9'; }
static bool is_word(char ch) {
    return is_digit(ch) || (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_';
}

/* The reference's consumeWhile: running into the end of the source while
 * the predicate still holds is an error ("{{ name" never closes). */
static size_t consume_while(lexer *L, bool (*pred)(char)) {
    size_t start = L->cur;
    while (L->cur < L->n && pred(L->s[L->cur]))
        if (++L->cur >= L->n) lex_fail(L, "Unexpected end of input%s", "");
    return L->cur - start;
}

static size_t consume_space(lexer *L) {
    size_t start = L->cur, k;
    while ((k = jj_js_space_at(L->s, L->n, L->cur)) > 0)
        if ((L->cur += k) >= L->n) lex_fail(L, "Unexpected end of input%s", "");
    return L->cur - start;
}

static void skip_leading_space(lexer *L) {
    size_t k;
    while ((k = jj_js_space_at(L->s, L->n, L->cur)) > 0) L->cur += k;
}

/* `{%-`, `{{-`, `{#-`: trim the text token just before, dropping it if empty. */
static void strip_trailing_space(lexer *L) {
    jj_compile *c = L->c;
    if (!c->n_toks || c->toks[c->n_toks - 1].type != T_TEXT) return;
    jj_token *t = &c->toks[c->n_toks - 1];
    size_t b, e;
    jj_trim(t->s, t->len, false, true, &b, &e);
    t->len = e;
    if (t->len == 0) c->n_toks--;
}

static bool starts(const lexer *L, const char *seq) {
    size_t k = strlen(seq);
    return L->n - L->cur >= k && memcmp(L->s + L->cur, seq, k) == 0;
}

static int hexval(char ch) {
    return is_digit(ch) ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10 : -1;
}

/* \x and \u escapes name UTF-16 code units; a surrogate pair spelled as two
 * \u escapes becomes one character, a lone half becomes U+FFFD as Node
 * would write it. */
static void add_unit(jj_buf *b, uint32_t unit, uint32_t *hi) {
    if (*hi) {
        if (unit >= 0xDC00 && unit < 0xE000) {
            jj_buf_add_cp(b, 0x10000 + ((*hi - 0xD800) << 10) + (unit - 0xDC00));
            *hi = 0;
            return;
        }
        jj_buf_add_cp(b, 0xFFFD);
        *hi = 0;
    }
    if (unit >= 0xD800 && unit < 0xDC00)
        *hi = unit;
    else
        jj_buf_add_cp(b, unit);
}

static void lex_string(lexer *L) {
    char quote = L->s[L->cur++];
    size_t at = L->cur - 1;
    jj_buf b;
    jj_buf_init(&b, L->c->arena);
    uint32_t hi = 0;
    for (;;) {
        if (L->cur >= L->n) lex_fail(L, "Unexpected end of input%s", "");
        char ch = L->s[L->cur];
        if (ch == quote) break;
        if (ch != '\\') {
            if (hi) add_unit(&b, 0xFFFD, &hi);
            jj_buf_addc(&b, ch);
            if (++L->cur >= L->n) lex_fail(L, "Unexpected end of input%s", "");
            continue;
        }
        if (++L->cur >= L->n) lex_fail(L, "Unexpected end of input%s", "");
        char esc = L->s[L->cur++];
        if (esc == 'x' || esc == 'u') {
            size_t len = esc == 'x' ? 2 : 4;
            uint32_t unit = 0;
            for (size_t k = 0; k < len; k++) {
                int h = L->cur + k < L->n ? hexval(L->s[L->cur + k]) : -1;
                if (h < 0) lex_fail(L, "Invalid hexadecimal escape sequence: \\%s", esc == 'x' ? "x" : "u");
                unit = unit * 16 + (uint32_t)h;
            }
            L->cur += len;
            add_unit(&b, unit, &hi);
            continue;
        }
        static const char from[] = "ntrbfv'\"\\", to[] = "\n\t\r\b\f\v'\"\\";
        const char *p = esc ? strchr(from, esc) : NULL;
        if (!p) {
            char bad[2] = {esc, 0};
            lex_fail(L, "Unexpected escaped character: %s", bad);
        }
        if (hi) add_unit(&b, 0xFFFD, &hi);
        jj_buf_addc(&b, to[p - from]);
    }
    if (hi) jj_buf_add_cp(&b, 0xFFFD);
    L->cur++; /* closing quote */
    push(L, T_STR, b.p ? b.p : "", b.n, at);
}

static void lex_comment(lexer *L) {
    size_t at = L->cur;
    L->cur += 2;
    bool strip_before = L->cur < L->n && L->s[L->cur] == '-';
    if (strip_before) L->cur++;
    size_t start = L->cur;
    while (!(L->cur + 1 < L->n && L->s[L->cur] == '#' && L->s[L->cur + 1] == '}')) {
        if (L->cur + 2 >= L->n) lex_fail(L, "Missing end of comment tag%s", "");
        L->cur++;
    }
    size_t len = L->cur - start;
    bool strip_after = len > 0 && L->s[L->cur - 1] == '-';
    if (strip_after) len--;
    if (strip_before) strip_trailing_space(L);
    push(L, T_COMMENT, L->s + start, len, at);
    L->cur += 2;
    if (strip_after) skip_leading_space(L);
}

/* A `-` or `+` where a value is expected: a sign, glued to a number. */
static bool lex_sign(lexer *L) {
    int last = last_type(L);
    if (last == T_TEXT || last == -1) {
        char bad[2] = {L->s[L->cur], 0};
        lex_fail(L, "Unexpected character: %s", bad);
    }
    if (last == T_IDENT || last == T_NUM || last == T_STR || last == T_RPAREN || last == T_RBRACKET)
        return false; /* binary operator */
    size_t at = L->cur++;
    size_t digits = consume_while(L, is_digit);
    if (digits && L->cur + 1 < L->n && L->s[L->cur] == '.' && is_digit(L->s[L->cur + 1])) {
        L->cur++;
        consume_while(L, is_digit);
    }
    push(L, digits ? T_NUM : T_UNARY_OP, L->s + at, digits ? L->cur - at : 1, at);
    return true;
}

static const struct {
    const char *seq;
    int type;
} TABLE[] = {
    {"{%", T_OPEN_STMT}, {"%}", T_CLOSE_STMT}, {"{{", T_OPEN_EXPR}, {"}}", T_CLOSE_EXPR},
    {"(", T_LPAREN}, {")", T_RPAREN}, {"{", T_LBRACE}, {"}", T_RBRACE}, {"[", T_LBRACKET},
    {"]", T_RBRACKET}, {",", T_COMMA}, {".", T_DOT}, {":", T_COLON}, {"|", T_PIPE},
    {"<=", T_CMP_OP}, {">=", T_CMP_OP}, {"==", T_CMP_OP}, {"!=", T_CMP_OP}, {"<", T_CMP_OP},
    {">", T_CMP_OP}, {"+", T_ADD_OP}, {"-", T_ADD_OP}, {"~", T_ADD_OP}, {"**", T_POW_OP},
    {"*", T_MUL_OP}, {"//", T_MUL_OP}, {"/", T_MUL_OP}, {"%", T_MUL_OP}, {"=", T_EQUALS},
};

static bool lex_table(lexer *L) {
    for (size_t i = 0; i < PT_ARRAY_LEN(TABLE); i++) {
        if (TABLE[i].type == T_CLOSE_EXPR && L->curly > 0) continue;
        if (!starts(L, TABLE[i].seq)) continue;
        size_t len = strlen(TABLE[i].seq);
        push(L, TABLE[i].type, L->s + L->cur, len, L->cur);
        if (TABLE[i].type == T_OPEN_EXPR) L->curly = 0;
        if (TABLE[i].type == T_LBRACE) L->curly++;
        if (TABLE[i].type == T_RBRACE) L->curly--;
        L->cur += len;
        return true;
    }
    return false;
}

/* Text up to the next tag; true if there was any. */
static bool lex_text(lexer *L) {
    size_t start = L->cur;
    while (L->cur < L->n &&
           !(L->s[L->cur] == '{' && L->cur + 1 < L->n && strchr("%{#", L->s[L->cur + 1]) && L->s[L->cur + 1]))
        L->cur++;
    if (L->cur == start) return false;
    push(L, T_TEXT, L->s + start, L->cur - start, start);
    return true;
}

static void lex_one(lexer *L) {
    int last = last_type(L);
    if ((last == -1 || last == T_CLOSE_STMT || last == T_CLOSE_EXPR || last == T_COMMENT) && lex_text(L))
        return;
    if (starts(L, "{#")) return lex_comment(L);
    if (starts(L, "{%-") || starts(L, "{{-")) {
        bool stmt = L->s[L->cur + 1] == '%';
        strip_trailing_space(L);
        push(L, stmt ? T_OPEN_STMT : T_OPEN_EXPR, L->s + L->cur, 2, L->cur);
        if (!stmt) L->curly = 0;
        L->cur += 3;
        return;
    }
    consume_space(L);
    if (starts(L, "-%}") || starts(L, "-}}")) {
        bool stmt = L->s[L->cur + 1] == '%';
        push(L, stmt ? T_CLOSE_STMT : T_CLOSE_EXPR, L->s + L->cur + 1, 2, L->cur);
        L->cur += 3;
        skip_leading_space(L);
        return;
    }
    char ch = L->s[L->cur];
    if ((ch == '-' || ch == '+') && lex_sign(L)) return;
    if (lex_table(L)) return;
    if (ch == '\'' || ch == '"') return lex_string(L);
    size_t at = L->cur;
    if (is_digit(ch)) {
        consume_while(L, is_digit);
        if (last_type(L) != T_DOT && L->cur + 1 < L->n && L->s[L->cur] == '.' && is_digit(L->s[L->cur + 1])) {
            L->cur++;
            consume_while(L, is_digit);
        }
        push(L, T_NUM, L->s + at, L->cur - at, at);
        return;
    }
    if (is_word(ch)) {
        consume_while(L, is_word);
        push(L, T_IDENT, L->s + at, L->cur - at, at);
        return;
    }
    uint32_t cp;
    int k = jj_utf8_dec(L->s + L->cur, L->n - L->cur, &cp);
    char bad[8] = {0};
    memcpy(bad, L->s + L->cur, (size_t)k);
    lex_fail(L, "Unexpected character: %s", bad);
}

void jj_tokenize(jj_compile *c) {
    preprocess(c);
    lexer L = {.c = c, .s = c->pp, .n = c->pp_len};
    c->n_toks = 0;
    while (L.cur < L.n) lex_one(&L);
}
