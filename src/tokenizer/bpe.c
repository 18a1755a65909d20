/*
 * bpe.c - BPE by merge rank, for tokenizer.json "model": {"type": "BPE"}
 * and GGUF vocabularies of type "gpt2".
 *
 * A word (one pre-token) starts as single symbols and repeatedly merges the
 * adjacent pair with the lowest rank in the merge list, leftmost first.  The
 * symbols are either
 *   - bytes, for byte-level BPE (GPT-2, Llama 3, Qwen): the vocabulary is
 *     spelled in GPT-2's printable alphabet, where each of the 256 byte
 *     values has one character (bytes_to_unicode below), so every byte is a
 *     token and nothing is ever unknown; or
 *   - Unicode code points, for SentencePiece-converted BPE (Llama 2, Gemma):
 *     a character missing from the vocabulary becomes its UTF-8 bytes as
 *     <0xNN> tokens when byte_fallback is set, else the unknown token.
 * Merges are stored by token id pair, so the loop never builds strings.
 * ignore_merges (Llama 3) takes a pre-token that is itself in the
 * vocabulary as one token without merging.
 */
#include "tokenizer/tokenizer_internal.h"

#include <stdio.h>
#include <stdlib.h>

/* ---- GPT-2's byte <-> unicode alphabet ----
 * Printable Latin-1 bytes stand for themselves; the other 68 bytes (0-32,
 * 127-160, 173) take code points 256, 257, ... in byte order. */

static uint32_t byte_cp(uint8_t b) {
    if (b <= 32) return 256u + b;
    if (b >= 127 && b <= 160) return 256u + 33 + (b - 127u);
    if (b == 173) return 256u + 67;
    return b;
}

void tok_byte_to_unicode(uint8_t b, char out[3], size_t *n) {
    *n = tok_utf8_encode(byte_cp(b), out);
}

int tok_unicode_to_byte(uint32_t cp) {
    if (cp >= 256) {
        uint32_t k = cp - 256;
        if (k < 33) return (int)k;
        if (k < 67) return (int)(127 + k - 33);
        if (k == 67) return 173;
        return -1;
    }
    if (cp <= 32 || (cp >= 127 && cp <= 160) || cp == 173) return -1;
    return (int)cp;
}

/* ---- encoding a word ---- */

static bool bpe_pair(const pt_tokenizer *t, const char *word, const tok_sym *l,
                     const tok_sym *r, double *cost, int32_t *id) {
    if (l->id < 0 || r->id < 0) return false;
    const tok_pair *p = tok_pairmap_get(&t->merges, l->id, r->id);
    if (!p) return false;
    *cost = p->rank;
    *id = p->result;
    return true;
}

/* The vocabulary entry spelling the whole word, for ignore_merges. */
static int32_t whole_word(const pt_tokenizer *t, const char *word, size_t n, tok_work *w) {
    if (!t->byte_level) return tok_strmap_get(t, word, n);
    w->tmp.n = 0;
    for (size_t i = 0; i < n; i++) {
        char u[3];
        size_t k;
        tok_byte_to_unicode((uint8_t)word[i], u, &k);
        tok_buf_put(&w->tmp, u, k);
    }
    return tok_strmap_get(t, w->tmp.s, w->tmp.n);
}

/* A piece the vocabulary lacks: its bytes as <0xNN> tokens if they all
 * exist (byte_fallback), else the unknown token. */
static void push_unknown(const pt_tokenizer *t, const char *s, size_t n, tok_ids *out) {
    bool bytes_ok = t->byte_fallback;
    for (size_t i = 0; bytes_ok && i < n; i++) bytes_ok = t->byte_ids[(uint8_t)s[i]] >= 0;
    if (bytes_ok) {
        for (size_t i = 0; i < n; i++) tok_ids_push(out, t->byte_ids[(uint8_t)s[i]]);
    } else if (t->unk >= 0) {
        tok_ids_push(out, t->unk);
    }
}

static void split_symbols(const pt_tokenizer *t, const char *word, size_t n, tok_work *w) {
    w->n_syms = 0;
    if (t->byte_level) {
        for (size_t i = 0; i < n; i++) tok_sym_push(w, (int32_t)i, 1, t->byte_sym[(uint8_t)word[i]]);
        return;
    }
    for (size_t off = 0; off < n;) { /* the text is valid UTF-8 here */
        size_t len = PT_MIN((size_t)tok_utf8_len((uint8_t)word[off]), n - off);
        tok_sym_push(w, (int32_t)off, (int32_t)len, tok_strmap_get(t, word + off, len));
        off += len;
    }
}

void tok_bpe_word(const pt_tokenizer *t, const char *word, size_t n, tok_work *w,
                  tok_ids *out) {
    if (!n) return;
    if (t->ignore_merges) {
        int32_t id = whole_word(t, word, n, w);
        if (id >= 0) {
            tok_ids_push(out, id);
            return;
        }
    }
    split_symbols(t, word, n, w);
    if (w->n_syms > 1) tok_merge(t, word, w, bpe_pair);
    for (int32_t i = 0; i >= 0; i = w->syms[i].next) {
        const tok_sym *s = &w->syms[i];
        if (s->id >= 0)
            tok_ids_push(out, s->id);
        else
            push_unknown(t, word + s->off, (size_t)s->len, out);
    }
}

/* fuse_unk: a run of unknown tokens becomes one. */
void tok_bpe_fuse_unk(const pt_tokenizer *t, tok_ids *out, size_t from) {
    if (!t->fuse_unk || t->unk < 0) return;
    size_t j = from;
    for (size_t i = from; i < out->n; i++) {
        if (out->v[i] == t->unk && j > from && out->v[j - 1] == t->unk) continue;
        out->v[j++] = out->v[i];
    }
    out->n = j;
}

/* The tokens of single bytes (byte-level) and of <0xNN> (byte fallback). */
void tok_bpe_finish(pt_tokenizer *t) {
    for (int c = 0; c < 256; c++) {
        char name[8];
        size_t n;
        t->byte_sym[c] = -1;
        if (t->byte_level) {
            tok_byte_to_unicode((uint8_t)c, name, &n);
            t->byte_sym[c] = tok_strmap_get(t, name, n);
        }
        snprintf(name, sizeof name, "<0x%02X>", c);
        t->byte_ids[c] = tok_strmap_get(t, name, 6);
    }
}

/* ---- GGUF "gpt2" vocabularies ---- */

/* tokenizer.ggml.pre names the pre-tokenizer; llama.cpp hard-codes a regex
 * per name.  These are the families we know.  Qwen's tokenizer.json
 * normalizes to NFC before splitting; llama.cpp skips that, we do not, so
 * that a GGUF Qwen encodes as its Hugging Face tokenizer does. */
static const struct pre_type {
    const char *name;
    const char *regex;
    bool ignore_merges, add_bos, nfc;
} k_pre_types[] = {
    {"llama-bpe", tok_llama3_regex, true, true, false},
    {"llama3", tok_llama3_regex, true, true, false},
    {"llama-v3", tok_llama3_regex, true, true, false},
    {"falcon3", tok_llama3_regex, true, true, false},
    {"pixtral", tok_llama3_regex, true, true, false},
    {"smaug-bpe", tok_llama3_regex, false, false, false},
    {"qwen2", tok_qwen2_regex, false, false, true},
    {"deepseek-r1-qwen", tok_qwen2_regex, false, false, true},
    {"gpt-2", tok_gpt2_regex, false, false, false},
    {"gpt2", tok_gpt2_regex, false, false, false},
    {"default", tok_gpt2_regex, false, false, false},
};

static const struct pre_type *find_pre(const pt_gguf *g) {
    pt_gguf_str s;
    if (!pt_gguf_get_str(g, "tokenizer.ggml.pre", &s)) return &k_pre_types[PT_ARRAY_LEN(k_pre_types) - 1];
    for (size_t i = 0; i < PT_ARRAY_LEN(k_pre_types); i++)
        if (strlen(k_pre_types[i].name) == s.len && !memcmp(k_pre_types[i].name, s.s, s.len))
            return &k_pre_types[i];
    pt_warn("tokenizer.ggml.pre = '%.*s' is not known; using GPT-2's pre-tokenizer regex",
            (int)PT_MIN(s.len, 64u), s.s);
    return &k_pre_types[PT_ARRAY_LEN(k_pre_types) - 1];
}

/* Merges are "left right"; the split is at the first space after the first
 * byte, as in llama.cpp. */
static int read_merges(pt_tokenizer *t, const pt_gguf *g, pt_err *err) {
    int et;
    uint64_t n;
    if (!pt_gguf_get_arr(g, "tokenizer.ggml.merges", &et, &n) || et != PT_GGUF_STRING)
        return pt_fail(err, "tokenizer.ggml.merges is missing or not a string array");
    if (n > INT32_MAX) return pt_fail(err, "tokenizer.ggml.merges has too many entries");
    tok_buf both = {0};
    uint64_t skipped = 0;
    for (uint64_t i = 0; i < n; i++) {
        pt_gguf_str s;
        if (!pt_gguf_arr_str(g, "tokenizer.ggml.merges", i, &s)) continue;
        const char *sp = s.len > 1 ? memchr(s.s + 1, ' ', (size_t)s.len - 1) : NULL;
        if (!sp) {
            free(both.s);
            return pt_fail(err, "tokenizer.ggml.merges[%llu] has no space", (unsigned long long)i);
        }
        size_t la = (size_t)(sp - s.s), lb = (size_t)s.len - la - 1;
        both.n = 0;
        tok_buf_put(&both, s.s, la);
        tok_buf_put(&both, sp + 1, lb);
        int32_t a = tok_strmap_get(t, s.s, la), b = tok_strmap_get(t, sp + 1, lb);
        int32_t r = tok_strmap_get(t, both.s, both.n);
        if (a < 0 || b < 0 || r < 0) {
            skipped++;
            continue;
        }
        tok_pairmap_put(&t->merges, a, b, (int32_t)i, r);
    }
    free(both.s);
    if (skipped) pt_debug("%llu merges name pieces outside the vocabulary; skipped",
                          (unsigned long long)skipped);
    return 0;
}

int tok_bpe_load_gguf(pt_tokenizer *t, const pt_gguf *g, pt_err *err) {
    t->model = TOK_MODEL_BPE;
    t->byte_level = true;
    if (read_merges(t, g, err)) return -1;
    const struct pre_type *pre = find_pre(g);
    t->pres = pt_xcalloc(1, sizeof *t->pres);
    t->n_pres = 1;
    t->pres[0].kind = PRE_SPLIT;
    t->pres[0].behavior = SPLIT_ISOLATED;
    if (tok_regex_compile(pre->regex, strlen(pre->regex), &t->pres[0].re, err)) return -1;
    t->ignore_merges = pre->ignore_merges;
    if (pre->nfc) {
        t->norms = pt_xcalloc(1, sizeof *t->norms);
        t->n_norms = 1;
        t->norms[0].kind = NORM_NFC;
    }
    bool b;
    t->add_bos = pt_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &b) ? b : pre->add_bos;
    t->add_eos = pt_gguf_get_bool(g, "tokenizer.ggml.add_eos_token", &b) ? b : false;
    if (t->add_bos && t->bos < 0) t->add_bos = false;
    if (t->add_eos && t->eos < 0) t->add_eos = false;
    tok_bpe_finish(t);
    tok_decode_cfg dc = {true, NULL, NULL, false};
    tok_build_decode_table(t, &dc);
    return 0;
}
