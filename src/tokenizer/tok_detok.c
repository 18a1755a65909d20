/*
 * tok_detok.c - from token ids back to text, and the UTF-8 rules that keep
 * that text valid.
 *
 * At load time every token gets the bytes it decodes to (tok_token.bytes):
 * byte-level vocabularies map their GPT-2 alphabet back to bytes,
 * SentencePiece-style ones turn "▁" into a space and <0xNN> into the byte,
 * added and control tokens are their text.  Decoding is then concatenation,
 * with two refinements:
 *
 *   - One leading space.  A tokenizer that puts a space in front of the text
 *     (llama.cpp's add_space_prefix, HF's Prepend("▁") normalizer, Metaspace,
 *     a Strip decoder) removes it again when decoding a text from its start:
 *     the first piece that produces bytes, after skipped special tokens,
 *     loses one leading ' '.  That is what HF's decode(skip_special_tokens=
 *     True) and sentencepiece do.  llama.cpp's llama_detokenize strips it
 *     too, except after a removed BOS; we follow HF there.  A continuation
 *     (tokens generated after a prompt) keeps its space, as llama.cpp's
 *     token_to_piece does: pt_detok_init leaves at_start false, and
 *     pt_detokenize sets it.
 *
 *   - Broken UTF-8.  A token may end in the middle of a character (byte
 *     tokens, byte-level pieces).  The streaming decoder holds an incomplete
 *     tail back until the next token completes it; bytes that can never
 *     form a character become U+FFFD, one per maximal subpart, as WHATWG's
 *     TextDecoder (and so the JS reference) does.  pt_detokenize repairs the
 *     whole string in one pass with tok_utf8_sanitize; the two must agree,
 *     and a test checks they do.
 */
#include "tokenizer/tokenizer_internal.h"

#include <stdlib.h>

static const char k_fffd[] = "\xef\xbf\xbd";

/* ---- UTF-8 ---- */

size_t tok_utf8_encode(uint32_t cp, char *out) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | cp >> 6);
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | cp >> 12);
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | cp >> 18);
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* For a lead byte: how many continuation bytes follow and the allowed range
 * of the first one (which excludes overlongs, surrogates, > U+10FFFF).
 * Returns -1 for a byte that cannot start a character. */
static int utf8_lead(uint8_t c, uint8_t *lo, uint8_t *hi) {
    *lo = 0x80, *hi = 0xBF;
    if (c < 0x80) return 0;
    if (c >= 0xC2 && c <= 0xDF) return 1;
    if (c == 0xE0) return *lo = 0xA0, 2;
    if (c == 0xED) return *hi = 0x9F, 2;
    if (c >= 0xE1 && c <= 0xEF) return 2;
    if (c == 0xF0) return *lo = 0x90, 3;
    if (c == 0xF4) return *hi = 0x8F, 3;
    if (c >= 0xF1 && c <= 0xF3) return 3;
    return -1;
}

/* Length of the valid character at s, or 0 with *bad = the length of the
 * maximal subpart to replace by one U+FFFD. */
static size_t utf8_check(const uint8_t *s, size_t n, size_t *bad) {
    uint8_t lo, hi;
    int need = utf8_lead(s[0], &lo, &hi);
    if (need < 0) return *bad = 1, 0;
    for (int i = 1; i <= need; i++) {
        if ((size_t)i >= n || s[i] < (i == 1 ? lo : 0x80) || s[i] > (i == 1 ? hi : 0xBF))
            return *bad = (size_t)i, 0;
    }
    return (size_t)need + 1;
}

size_t tok_utf8_decode(const char *s, size_t n, uint32_t *cp) {
    size_t bad, len = utf8_check((const uint8_t *)s, n, &bad);
    if (!len) {
        *cp = 0xFFFD;
        return bad;
    }
    const uint8_t *u = (const uint8_t *)s;
    static const uint8_t masks[5] = {0, 0x7F, 0x1F, 0x0F, 0x07};
    uint32_t c = u[0] & masks[len];
    for (size_t i = 1; i < len; i++) c = c << 6 | (u[i] & 0x3F);
    *cp = c;
    return len;
}

bool tok_utf8_valid(const char *s, size_t n) {
    size_t bad;
    for (size_t i = 0; i < n;) {
        size_t k = utf8_check((const uint8_t *)s + i, n - i, &bad);
        if (!k) return false;
        i += k;
    }
    return true;
}

void tok_utf8_sanitize(const char *s, size_t n, tok_buf *out) {
    size_t bad;
    tok_buf_put(out, NULL, 0);
    for (size_t i = 0; i < n;) {
        size_t k = utf8_check((const uint8_t *)s + i, n - i, &bad);
        if (k) {
            tok_buf_put(out, s + i, k);
            i += k;
        } else {
            tok_buf_put(out, k_fffd, 3);
            i += bad;
        }
    }
}

/* ---- the decode table ---- */

static void replace_all(const char *s, size_t n, const char *from, const char *to,
                        tok_buf *out) {
    size_t fl = strlen(from), tl = strlen(to);
    for (size_t i = 0; i < n;) {
        if (fl && i + fl <= n && !memcmp(s + i, from, fl)) {
            tok_buf_put(out, to, tl);
            i += fl;
        } else {
            tok_buf_putc(out, s[i++]);
        }
    }
}

static void from_byte_level(const char *s, size_t n, tok_buf *out) {
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t k = tok_utf8_decode(s + i, n - i, &cp);
        int b = tok_unicode_to_byte(cp);
        if (b >= 0)
            tok_buf_putc(out, (char)b);
        else
            tok_buf_put(out, s + i, k); /* not in the alphabet: keep as is */
        i += k;
    }
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

/* "<0xNN>" -> NN, or -1. */
int tok_byte_token_value(const char *s, size_t n) {
    if (n != 6 || memcmp(s, "<0x", 3) || s[5] != '>') return -1;
    int hi = hexval(s[3]), lo = hexval(s[4]);
    return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

void tok_build_decode_table(pt_tokenizer *t, const tok_decode_cfg *cfg) {
    tok_buf b = {0};
    for (int id = 0; id < t->n_vocab; id++) {
        tok_token *tk = &t->tokens[id];
        bool added = tk->type == TOK_CONTROL || tk->type == TOK_USER || tk->type == TOK_UNKNOWN;
        int byte = tk->type == TOK_BYTE ? tok_byte_token_value(tk->text, tk->len) : -1;
        b.n = 0;
        tok_buf_put(&b, NULL, 0);
        if (byte >= 0)
            tok_buf_putc(&b, (char)byte);
        else if (!added && cfg->byte_level)
            from_byte_level(tk->text, tk->len, &b);
        else if (cfg->from && (!added || cfg->replace_added))
            replace_all(tk->text, tk->len, cfg->from, cfg->to, &b);
        else
            tok_buf_put(&b, tk->text, tk->len);
        if (b.n == tk->len && !memcmp(b.s, tk->text, b.n))
            tk->bytes = tk->text;
        else
            tk->bytes = tok_arena_dup(&t->arena, b.s, b.n);
        tk->n_bytes = (uint32_t)b.n;
    }
    free(b.s);
}

/* ---- streaming ---- */

void pt_detok_init(pt_detok *d, const pt_tokenizer *t) {
    memset(d, 0, sizeof *d);
    d->tok = t;
    d->skip_special = true;
    d->at_start = false;
}

typedef struct sink {
    char *out;
    size_t cap, n;
} sink;

static void emit(sink *k, const char *s, size_t n) {
    if (k->n + n > k->cap) {
        pt_warn("detokenizer output buffer of %zu bytes is too small; text dropped", k->cap);
        return;
    }
    memcpy(k->out + k->n, s, n);
    k->n += n;
}

/* Feeds one byte: complete characters go out, an incomplete one waits in
 * d->pending, an impossible one becomes U+FFFD. */
static void feed(pt_detok *d, uint8_t c, sink *k) {
    uint8_t lo, hi;
    if (d->n_pending) {
        int need = utf8_lead((uint8_t)d->pending[0], &lo, &hi);
        if (d->n_pending > 1) lo = 0x80, hi = 0xBF;
        if (c >= lo && c <= hi) {
            d->pending[d->n_pending++] = (char)c;
            if (d->n_pending == need + 1) {
                emit(k, d->pending, (size_t)d->n_pending);
                d->n_pending = 0;
            }
            return;
        }
        emit(k, k_fffd, 3); /* the held bytes can never complete */
        d->n_pending = 0;
    }
    int need = utf8_lead(c, &lo, &hi);
    if (need == 0)
        emit(k, (const char *)&c, 1);
    else if (need < 0)
        emit(k, k_fffd, 3);
    else
        d->pending[d->n_pending++] = (char)c;
}

/* The bytes a token adds to a decoded text, after skipping and the
 * leading-space rule; NULL if it adds nothing. */
static const char *piece(const pt_tokenizer *t, int32_t id, bool skip_special, bool *at_start,
                         size_t *n) {
    if (!t || id < 0 || id >= t->n_vocab) return NULL;
    const tok_token *tk = &t->tokens[id];
    if (skip_special && tk->special) return NULL;
    const char *p = tk->bytes;
    *n = tk->n_bytes;
    if (*at_start && *n) {
        if (t->strip_first_space && p[0] == ' ') p++, (*n)--;
        *at_start = false;
    }
    return p;
}

size_t pt_detok_push(pt_detok *d, int32_t id, char *out, size_t cap) {
    size_t n;
    const char *p = piece(d->tok, id, d->skip_special, &d->at_start, &n);
    if (!p) return 0;
    sink k = {out, cap, 0};
    for (size_t i = 0; i < n; i++) feed(d, (uint8_t)p[i], &k);
    return k.n;
}

size_t pt_detok_flush(pt_detok *d, char *out, size_t cap) {
    if (!d->n_pending) return 0;
    sink k = {out, cap, 0};
    emit(&k, k_fffd, 3);
    d->n_pending = 0;
    return k.n;
}

char *pt_detokenize(const pt_tokenizer *t, const int32_t *ids, size_t n, bool skip_special) {
    tok_buf raw = {0}, out = {0};
    bool at_start = true;
    for (size_t i = 0; i < n; i++) {
        size_t len;
        const char *p = piece(t, ids[i], skip_special, &at_start, &len);
        if (p) tok_buf_put(&raw, p, len);
    }
    tok_utf8_sanitize(raw.s ? raw.s : "", raw.n, &out);
    free(raw.s);
    return out.s;
}

const char *pt_token_bytes(const pt_tokenizer *t, int32_t id, size_t *len) {
    if (!t || id < 0 || id >= t->n_vocab) {
        if (len) *len = 0;
        return NULL;
    }
    if (len) *len = t->tokens[id].n_bytes;
    return t->tokens[id].bytes;
}
