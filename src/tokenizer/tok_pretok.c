/*
 * tok_pretok.c - normalizers and pre-tokenizers: what happens to the text of
 * a section before the BPE model sees it.
 *
 * Normalizers rewrite the text (NFC/NFD/NFKC/NFKD via utf8proc, Replace,
 * Prepend, Strip, Lowercase, StripAccents); pre-tokenizers cut it into
 * words (Split by regex or string with HF's five delimiter behaviours,
 * ByteLevel with GPT-2's regex, Metaspace, Whitespace, WhitespaceSplit,
 * Digits, Punctuation).  tokenizer_json.c builds the lists; a GGUF "gpt2"
 * vocabulary gets a single Split.
 *
 * Regexes.  The patterns in tokenizer.json are written for Rust's Oniguruma;
 * our reference implementation for parity runs them as ECMAScript regexes
 * with the u flag.  We compile them with PCRE2 in UTF mode and give the few
 * escapes whose meaning differs between engines their ECMAScript meaning:
 * \s and \S become the explicit ECMAScript white-space set (PCRE2's \s with
 * UCP would add U+0085 and U+180E and miss U+FEFF), \d, \w and \b stay ASCII
 * (UCP off), "." excludes all four line terminators, $ matches only at the
 * very end, and \uXXXX is accepted.  \p{L}, \p{N}, ... are Unicode
 * properties as usual.  (\S inside a character class stays PCRE2's ASCII
 * one; no tokenizer we know writes it.)  One rewrite follows the JS reference exactly: the
 * contraction group "(?i:'s|'t|...)" becomes explicit [sS] classes, so that
 * "'ſ" is not a contraction.
 */
#include "tokenizer/tokenizer_internal.h"

#include <stdlib.h>
#include <utf8proc.h>

const char tok_gpt2_regex[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
const char tok_llama3_regex[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const char tok_qwen2_regex[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

/* ECMAScript WhiteSpace + LineTerminator, as class items. */
#define JS_SPACE_ITEMS                                                                        \
    "\\t\\n\\x{0B}\\f\\r\\x{20}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}" \
    "\\x{205F}\\x{3000}\\x{FEFF}"

static bool js_space(uint32_t c) {
    return (c >= 9 && c <= 13) || c == 32 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
           c == 0x205F || c == 0x3000 || c == 0xFEFF;
}

/* ---- regex translation and compilation ---- */

static bool starts(const char *p, size_t n, const char *lit) {
    size_t k = strlen(lit);
    return n >= k && !memcmp(p, lit, k);
}

static bool is_hex(char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

/* \uXXXX or \u{X..}: returns the chars consumed after the backslash, or 0. */
static size_t translate_u(const char *p, size_t n, tok_buf *out) {
    size_t k = 0;
    if (n >= 5 && is_hex(p[1]) && is_hex(p[2]) && is_hex(p[3]) && is_hex(p[4])) {
        tok_buf_put(out, "\\x{", 3);
        tok_buf_put(out, p + 1, 4);
        tok_buf_putc(out, '}');
        return 5;
    }
    if (n >= 3 && p[1] == '{') {
        for (k = 2; k < n && is_hex(p[k]); k++) {
        }
        if (k < n && p[k] == '}' && k > 2) {
            tok_buf_put(out, "\\x", 2);
            tok_buf_put(out, p + 1, k);
            return k + 1;
        }
    }
    return 0;
}

/* \p{Script=Han} and \p{gc=L} are ECMAScript spellings PCRE2 10.42 lacks:
 * emits "\p{" and returns the bytes consumed from the backslash, or 0. */
static size_t translate_p(const char *p, size_t n, tok_buf *out) {
    static const char *prefixes[] = {"Script=", "sc=", "General_Category=", "gc="};
    if (n < 4 || p[2] != '{') return 0;
    for (size_t i = 0; i < PT_ARRAY_LEN(prefixes); i++) {
        if (starts(p + 3, n - 3, prefixes[i])) {
            tok_buf_put(out, p, 3);
            return 3 + strlen(prefixes[i]);
        }
    }
    return 0;
}

/* An escape PCRE2 reads as ECMAScript does: copied with one whole
 * character after the backslash. */
static size_t copy_escape(const char *p, size_t n, tok_buf *out) {
    size_t k = 1 + PT_MIN((size_t)tok_utf8_len((uint8_t)p[1]), n - 1);
    tok_buf_put(out, p, k);
    return k;
}

/* ECMAScript's "." outside a class: anything but a line terminator. */
static const char k_dot[] = "[^\\n\\r\\x{2028}\\x{2029}]";

/* The backslash escape at p (p[0] == '\\') with its ECMAScript meaning;
 * returns the bytes consumed. */
static size_t translate_escape(const char *p, size_t n, bool in_class, tok_buf *out) {
    size_t used = 0;
    switch (p[1]) {
    case 's':
        if (in_class)
            tok_buf_put(out, JS_SPACE_ITEMS, strlen(JS_SPACE_ITEMS));
        else
            tok_buf_put(out, "[" JS_SPACE_ITEMS "]", strlen(JS_SPACE_ITEMS) + 2);
        return 2;
    case 'S':
        if (in_class) break; /* PCRE2's ASCII \S: the one approximation */
        tok_buf_put(out, "[^" JS_SPACE_ITEMS "]", strlen(JS_SPACE_ITEMS) + 3);
        return 2;
    case 'v': tok_buf_put(out, "\\x{0B}", 6); return 2;
    case 'u': used = translate_u(p + 1, n - 1, out); return used ? used + 1 : copy_escape(p, n, out);
    case 'p':
    case 'P': used = translate_p(p, n, out); return used ? used : copy_escape(p, n, out);
    }
    return copy_escape(p, n, out);
}

static void translate(const char *p, size_t n, tok_buf *out) {
    static const char contractions[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)";
    static const char js_contractions[] = "(?:'([sS]|[tT]|[rR][eE]|[vV][eE]|[mM]|[lL][lL]|[dD]))";
    bool in_class = false;
    for (size_t i = 0; i < n;) {
        char c = p[i];
        if (!in_class && starts(p + i, n - i, contractions)) {
            tok_buf_put(out, js_contractions, sizeof js_contractions - 1);
            i += sizeof contractions - 1;
        } else if (c == '\\' && i + 1 < n) {
            i += translate_escape(p + i, n - i, in_class, out);
        } else if (!in_class && c == '[') {
            in_class = true;
            tok_buf_putc(out, c);
            if (i + 1 < n && p[i + 1] == '^') tok_buf_putc(out, p[++i]);
            i++;
        } else if (!in_class && c == '.') {
            tok_buf_put(out, k_dot, sizeof k_dot - 1);
            i++;
        } else {
            if (c == ']') in_class = false;
            tok_buf_putc(out, c);
            i++;
        }
    }
}

int tok_regex_compile(const char *pattern, size_t len, pcre2_code **out, pt_err *err) {
    if (len > 65536) return pt_fail(err, "regex of %zu bytes is too long", len);
    tok_buf pat = {0};
    translate(pattern, len, &pat);
    int code;
    PCRE2_SIZE off;
    *out = pcre2_compile((PCRE2_SPTR)(pat.s ? pat.s : ""), pat.n,
                         PCRE2_UTF | PCRE2_DOLLAR_ENDONLY, &code, &off, NULL);
    free(pat.s);
    if (!*out) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(code, msg, sizeof msg);
        return pt_fail(err, "regex \"%.80s\": %s", pattern, (const char *)msg);
    }
    pcre2_jit_compile(*out, PCRE2_JIT_COMPLETE); /* the interpreter is the fallback */
    return 0;
}

/* Iterates over the non-empty matches of re in s[0..n). */
typedef struct match_iter {
    const pcre2_code *re;
    pcre2_match_data *md;
    const char *s;
    size_t n, pos;
} match_iter;

static void iter_init(match_iter *it, const pcre2_code *re, const char *s, size_t n) {
    it->re = re;
    it->md = pcre2_match_data_create(1, NULL);
    it->s = s;
    it->n = n;
    it->pos = 0;
}

static int iter_next(match_iter *it, size_t *ms, size_t *me, pt_err *err) {
    while (it->pos <= it->n) {
        uint32_t opts = PCRE2_NO_UTF_CHECK;
        int rc = pcre2_match(it->re, (PCRE2_SPTR)it->s, it->n, it->pos, opts, it->md, NULL);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT) /* deep backtracking: the interpreter uses the heap */
            rc = pcre2_match(it->re, (PCRE2_SPTR)it->s, it->n, it->pos, opts | PCRE2_NO_JIT,
                             it->md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) return 0;
        if (rc < 0) {
            PCRE2_UCHAR msg[128];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return pt_fail(err, "pre-tokenizer regex failed: %s", (const char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(it->md);
        if (ov[1] <= ov[0] || ov[1] > it->n) {
            /* Empty match: as JS's matchAll, move on by one character. */
            if (ov[0] >= it->n) return 0;
            it->pos = ov[0] + PT_MIN((size_t)tok_utf8_len((uint8_t)it->s[ov[0]]), it->n - ov[0]);
            continue;
        }
        *ms = ov[0];
        *me = ov[1];
        it->pos = ov[1];
        return 1;
    }
    return 0;
}

/* ---- normalizers ---- */

static void replace_literal(const tok_norm *nm, const char *s, size_t n, tok_buf *out) {
    size_t i = 0;
    while (i < n) {
        const char *hit = nm->pat_len ? memmem(s + i, n - i, nm->pat, nm->pat_len) : NULL;
        if (!hit) break;
        tok_buf_put(out, s + i, (size_t)(hit - (s + i)));
        tok_buf_put(out, nm->with, nm->with_len);
        i = (size_t)(hit - s) + nm->pat_len;
    }
    tok_buf_put(out, s + i, n - i);
}

static int replace_regex(const tok_norm *nm, const char *s, size_t n, tok_buf *out,
                         pt_err *err) {
    match_iter it;
    iter_init(&it, nm->re, s, n);
    size_t prev = 0, ms, me;
    int rc;
    while ((rc = iter_next(&it, &ms, &me, err)) > 0) {
        tok_buf_put(out, s + prev, ms - prev);
        tok_buf_put(out, nm->with, nm->with_len);
        prev = me;
    }
    tok_buf_put(out, s + prev, n - prev);
    pcre2_match_data_free(it.md);
    return rc;
}

static void unicode_form(int kind, const char *s, size_t n, tok_buf *out) {
    int opts = UTF8PROC_STABLE;
    if (kind == NORM_NFC || kind == NORM_NFKC) opts |= UTF8PROC_COMPOSE;
    else opts |= UTF8PROC_DECOMPOSE;
    if (kind == NORM_NFKC || kind == NORM_NFKD) opts |= UTF8PROC_COMPAT;
    utf8proc_uint8_t *dst = NULL;
    utf8proc_ssize_t len =
        utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &dst, opts);
    if (len >= 0)
        tok_buf_put(out, dst, (size_t)len);
    else
        tok_buf_put(out, s, n); /* cannot happen on valid UTF-8 */
    free(dst);
}

static void strip_spaces(const tok_norm *nm, const char *s, size_t n, tok_buf *out) {
    size_t first = n, last = 0; /* bytes [first, last) are kept */
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t k = tok_utf8_decode(s + i, n - i, &cp);
        if (!js_space(cp)) {
            if (first == n) first = i;
            last = i + k;
        }
        i += k;
    }
    if (first == n) return; /* all white space */
    if (!nm->left) first = 0;
    if (!nm->right) last = n;
    tok_buf_put(out, s + first, last - first);
}

/* Lowercase and StripAccents, one code point at a time. */
static void map_chars(int kind, const char *s, size_t n, tok_buf *out) {
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t k = tok_utf8_decode(s + i, n - i, &cp);
        i += k;
        if (kind == NORM_STRIP_ACCENTS) {
            utf8proc_category_t cat = utf8proc_category((utf8proc_int32_t)cp);
            if (cat == UTF8PROC_CATEGORY_MN || cat == UTF8PROC_CATEGORY_MC ||
                cat == UTF8PROC_CATEGORY_ME)
                continue;
        } else {
            cp = (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp);
        }
        char u[4];
        tok_buf_put(out, u, tok_utf8_encode(cp, u));
    }
}

static int apply_norm(const tok_norm *nm, const char *s, size_t n, tok_buf *out, pt_err *err) {
    switch (nm->kind) {
    case NORM_NFC:
    case NORM_NFD:
    case NORM_NFKC:
    case NORM_NFKD: unicode_form(nm->kind, s, n, out); return 0;
    case NORM_REPLACE:
        if (nm->re) return replace_regex(nm, s, n, out, err);
        replace_literal(nm, s, n, out);
        return 0;
    case NORM_PREPEND:
        if (n) tok_buf_put(out, nm->with, nm->with_len);
        tok_buf_put(out, s, n);
        return 0;
    case NORM_STRIP: strip_spaces(nm, s, n, out); return 0;
    default: map_chars(nm->kind, s, n, out); return 0;
    }
}

int tok_normalize(const pt_tokenizer *t, const char *s, size_t n, tok_buf *out, pt_err *err) {
    out->n = 0;
    tok_buf_put(out, s, n);
    tok_buf tmp = {0};
    for (int i = 0; i < t->n_norms; i++) {
        tmp.n = 0;
        tok_buf_put(&tmp, NULL, 0);
        if (apply_norm(&t->norms[i], out->s, out->n, &tmp, err)) {
            free(tmp.s);
            return -1;
        }
        tok_buf swap = *out;
        *out = tmp;
        tmp = swap;
    }
    free(tmp.s);
    return 0;
}

/* ---- pre-tokenizers ---- */

static void word_add(tok_words *w, const char *s, size_t n) {
    if (!n) return;
    if (w->n == w->cap) {
        w->cap = w->cap ? w->cap * 2 : 64;
        w->spans = pt_xrealloc(w->spans, w->cap * 2 * sizeof *w->spans);
    }
    w->spans[2 * w->n] = w->text.n;
    w->spans[2 * w->n + 1] = n;
    w->n++;
    tok_buf_put(&w->text, s, n);
}

void tok_words_free(tok_words *w) {
    free(w->text.s);
    free(w->spans);
    memset(w, 0, sizeof *w);
}

/* Cuts one word by re according to behavior (HF's SplitDelimiterBehavior);
 * invert keeps only the matches, as the JS reference does. */
static int split_word(const pcre2_code *re, int behavior, bool invert, const char *s, size_t n,
                      tok_words *out, pt_err *err) {
    match_iter it;
    iter_init(&it, re, s, n);
    size_t prev = 0, start = 0, ms, me;
    size_t run_s = 0, run_e = 0; /* CONTIGUOUS: pending run of matches */
    bool run = false;
    int rc;
    while ((rc = iter_next(&it, &ms, &me, err)) > 0) {
        if (invert) {
            word_add(out, s + ms, me - ms);
            continue;
        }
        switch (behavior) {
        case SPLIT_ISOLATED:
            word_add(out, s + prev, ms - prev);
            word_add(out, s + ms, me - ms);
            break;
        case SPLIT_REMOVED: word_add(out, s + prev, ms - prev); break;
        case SPLIT_PREV: word_add(out, s + prev, me - prev); break;
        case SPLIT_NEXT:
            word_add(out, s + start, ms - start);
            start = ms;
            break;
        case SPLIT_CONTIGUOUS:
            if (run && ms == run_e) {
                run_e = me;
                break;
            }
            if (run) word_add(out, s + run_s, run_e - run_s);
            word_add(out, s + prev, ms - prev);
            run = true, run_s = ms, run_e = me;
            break;
        }
        prev = me;
    }
    pcre2_match_data_free(it.md);
    if (rc < 0) return -1;
    if (invert) return 0;
    if (behavior == SPLIT_NEXT) {
        word_add(out, s + start, n - start);
        return 0;
    }
    if (run) word_add(out, s + run_s, run_e - run_s);
    word_add(out, s + prev, n - prev);
    return 0;
}

/* Spaces become the replacement ("▁"), which is prepended per the scheme;
 * with split, each word starts at a replacement character. */
static void metaspace(const tok_pre *p, const char *s, size_t n, int section, tok_words *out) {
    tok_buf r = {0}, b = {0};
    for (size_t i = 0; i < n; i++) {
        if (s[i] == ' ')
            tok_buf_put(&r, p->repl, p->repl_len);
        else
            tok_buf_putc(&r, s[i]);
    }
    bool want = p->prepend == PREPEND_ALWAYS || (p->prepend == PREPEND_FIRST && section == 0);
    bool has = r.n >= p->repl_len && !memcmp(r.s, p->repl, p->repl_len);
    if (want && !has) tok_buf_put(&b, p->repl, p->repl_len);
    tok_buf_put(&b, r.s, r.n);
    free(r.s);
    size_t start = 0;
    for (size_t i = 1; p->split && p->repl_len && i + p->repl_len <= b.n; i++) {
        if (!memcmp(b.s + i, p->repl, p->repl_len)) {
            word_add(out, b.s + start, i - start);
            start = i;
        }
    }
    word_add(out, b.s + start, b.n - start);
    free(b.s);
}

static int apply_pre(const tok_pre *p, const char *s, size_t n, int section, tok_words *out,
                     pt_err *err) {
    switch (p->kind) {
    case PRE_SPLIT: return split_word(p->re, p->behavior, p->invert, s, n, out, err);
    case PRE_METASPACE: metaspace(p, s, n, section, out); return 0;
    case PRE_BYTE_LEVEL: {
        tok_buf b = {0};
        if (p->prefix && (n == 0 || s[0] != ' ')) tok_buf_putc(&b, ' ');
        tok_buf_put(&b, s, n);
        int rc = 0;
        if (p->re)
            rc = split_word(p->re, SPLIT_ISOLATED, false, b.s, b.n, out, err);
        else
            word_add(out, b.s, b.n);
        free(b.s);
        return rc;
    }
    }
    return 0;
}

int tok_pretokenize(const pt_tokenizer *t, const char *s, size_t n, int section,
                    tok_words *out, pt_err *err) {
    out->n = 0;
    out->text.n = 0;
    word_add(out, s, n);
    for (int i = 0; i < t->n_pres; i++) {
        tok_words next = {0};
        for (size_t k = 0; k < out->n; k++) {
            const char *w = out->text.s + out->spans[2 * k];
            if (apply_pre(&t->pres[i], w, out->spans[2 * k + 1], section, &next, err)) {
                tok_words_free(&next);
                return -1;
            }
        }
        tok_words_free(out);
        *out = next;
    }
    return 0;
}

void tok_pretok_free(pt_tokenizer *t) {
    for (int i = 0; i < t->n_norms; i++) {
        pcre2_code_free(t->norms[i].re);
        free(t->norms[i].pat);
        free(t->norms[i].with);
    }
    for (int i = 0; i < t->n_pres; i++) {
        pcre2_code_free(t->pres[i].re);
        free(t->pres[i].repl);
    }
    free(t->norms);
    free(t->pres);
}

size_t tok_js_trim_left(const char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        uint32_t cp;
        size_t k = tok_utf8_decode(s + i, n - i, &cp);
        if (!js_space(cp)) break;
        i += k;
    }
    return i;
}

size_t tok_js_trim_right(const char *s, size_t n) {
    size_t keep = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t k = tok_utf8_decode(s + i, n - i, &cp);
        i += k;
        if (!js_space(cp)) keep = i;
    }
    return keep;
}
