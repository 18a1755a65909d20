/*
 * spm.c - SentencePiece-style tokenizing as llama.cpp does it for GGUF
 * vocabularies of type "llama" (tokenizer.ggml.model = "llama").
 *
 * The vocabulary is a list of pieces with scores.  To encode a stretch of
 * text: optionally put a space in front (add_space_prefix), turn every
 * space into "▁" (U+2581), cut the result into UTF-8 characters, then keep
 * merging the adjacent pair whose concatenation is a vocabulary piece with
 * the highest score (ties: the leftmost pair).  A final symbol that is not
 * a piece (a character the vocabulary lacks) becomes its bytes as <0xNN>
 * tokens.  The lookup covers every token, control tokens included, exactly
 * as llama.cpp's does.
 *
 * llama.cpp does not validate UTF-8 here: a lead byte says how long the
 * character is, and a broken sequence ends up as byte tokens, so arbitrary
 * bytes round-trip.  We keep that behaviour.
 */
#include "tokenizer/tokenizer_internal.h"

#include <stdio.h>

static const char k_meta[] = "\xe2\x96\x81"; /* U+2581 "▁" */

/* The merged piece must be in the vocabulary; its score decides. */
static bool spm_pair(const pt_tokenizer *t, const char *word, const tok_sym *l,
                     const tok_sym *r, double *cost, int32_t *id) {
    int32_t found = tok_strmap_get(t, word + l->off, (size_t)(l->len + r->len));
    if (found < 0) return false;
    *cost = -(double)t->tokens[found].score;
    *id = found;
    return true;
}

static void push_bytes(const pt_tokenizer *t, const char *s, size_t n, tok_ids *out) {
    for (size_t i = 0; i < n; i++) {
        int32_t id = t->byte_ids[(uint8_t)s[i]];
        if (id < 0) id = t->unk; /* llama.cpp would abort; we degrade */
        if (id >= 0) tok_ids_push(out, id);
    }
}

void tok_spm_encode(const pt_tokenizer *t, const char *text, size_t n, bool space_prefix,
                    tok_work *w, tok_ids *out) {
    tok_buf *b = &w->tmp;
    b->n = 0;
    if (space_prefix) tok_buf_put(b, k_meta, 3);
    for (size_t i = 0; i < n; i++) {
        if (text[i] == ' ')
            tok_buf_put(b, k_meta, 3);
        else
            tok_buf_putc(b, text[i]);
    }
    if (!b->n) return;

    w->n_syms = 0;
    for (size_t off = 0; off < b->n;) {
        size_t len = (size_t)tok_utf8_len((uint8_t)b->s[off]);
        if (len > b->n - off) len = b->n - off;
        tok_sym_push(w, (int32_t)off, (int32_t)len, tok_strmap_get(t, b->s + off, len));
        off += len;
    }
    tok_merge(t, b->s, w, spm_pair);

    for (int32_t i = 0; i >= 0; i = w->syms[i].next) {
        const tok_sym *s = &w->syms[i];
        if (s->id >= 0)
            tok_ids_push(out, s->id);
        else
            push_bytes(t, b->s + s->off, (size_t)s->len, out);
    }
}

/* <0xNN> byte tokens; llama.cpp falls back to the one-byte piece. */
static void find_byte_tokens(pt_tokenizer *t) {
    for (int c = 0; c < 256; c++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", c);
        int32_t id = tok_strmap_get(t, name, 6);
        if (id < 0) {
            char one = (char)c;
            id = tok_strmap_get(t, &one, 1);
        }
        t->byte_ids[c] = id;
    }
}

int tok_spm_load_gguf(pt_tokenizer *t, const pt_gguf *g, pt_err *err) {
    t->model = TOK_MODEL_SPM;
    bool b;
    t->add_space_prefix = pt_gguf_get_bool(g, "tokenizer.ggml.add_space_prefix", &b) ? b : true;
    t->add_bos = pt_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &b) ? b : true;
    t->add_eos = pt_gguf_get_bool(g, "tokenizer.ggml.add_eos_token", &b) ? b : false;
    /* llama.cpp's detokenizer removes the space it added (remove_space). */
    t->strip_first_space = t->add_space_prefix;
    find_byte_tokens(t);
    if (t->add_bos && t->bos < 0)
        return pt_fail(err, "tokenizer.ggml.add_bos_token is set but there is no bos token");
    tok_decode_cfg dc = {false, k_meta, " ", false};
    tok_build_decode_table(t, &dc);
    return 0;
}
