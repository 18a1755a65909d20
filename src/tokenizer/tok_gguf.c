/*
 * tok_gguf.c - reading the tokenizer.ggml.* keys every GGUF vocabulary has:
 * the token strings, scores and types, and the special token ids.
 *
 * Token types follow llama.cpp: CONTROL, USER_DEFINED and UNKNOWN tokens
 * are "added" tokens, found in the raw text before the model runs; of those
 * USER_DEFINED ones are matched even without parse_special.  The model
 * specific parts (SPM settings, BPE merges and pre-tokenizer) are in spm.c
 * and bpe.c.
 */
#include "tokenizer/tokenizer_internal.h"

static int read_tokens(pt_tokenizer *t, const pt_gguf *g, pt_err *err) {
    int et;
    uint64_t n;
    if (!pt_gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &n) || et != PT_GGUF_STRING)
        return pt_fail(err, "tokenizer.ggml.tokens is missing or not a string array");
    if (tok_alloc_vocab(t, (int64_t)PT_MIN(n, (uint64_t)TOK_MAX_VOCAB + 1), err)) return -1;
    for (uint64_t i = 0; i < n; i++) {
        pt_gguf_str s;
        if (!pt_gguf_arr_str(g, "tokenizer.ggml.tokens", i, &s) || s.len > (1u << 20))
            return pt_fail(err, "tokenizer.ggml.tokens[%llu] is unreadable", (unsigned long long)i);
        t->tokens[i].text = tok_arena_dup(&t->arena, s.s, (size_t)s.len);
        t->tokens[i].len = (uint32_t)s.len;
        t->tokens[i].type = TOK_NORMAL;
    }
    return 0;
}

/* Optional per-token arrays must have one entry per token. */
static int check_array(const pt_gguf *g, const char *key, uint64_t n, bool *present,
                       pt_err *err) {
    int et;
    uint64_t count;
    *present = pt_gguf_get_arr(g, key, &et, &count);
    if (!*present) return 0;
    if (et == PT_GGUF_STRING || et == PT_GGUF_ARRAY || et == PT_GGUF_BOOL)
        return pt_fail(err, "%s is not a numeric array", key);
    if (count != n)
        return pt_fail(err, "%s has %llu entries for %llu tokens", key, (unsigned long long)count,
                       (unsigned long long)n);
    return 0;
}

static int read_scores_types(pt_tokenizer *t, const pt_gguf *g, pt_err *err) {
    bool has_scores, has_types;
    if (check_array(g, "tokenizer.ggml.scores", (uint64_t)t->n_vocab, &has_scores, err) ||
        check_array(g, "tokenizer.ggml.token_type", (uint64_t)t->n_vocab, &has_types, err))
        return -1;
    for (int i = 0; i < t->n_vocab; i++) {
        double score;
        int64_t type;
        if (has_scores && pt_gguf_arr_float(g, "tokenizer.ggml.scores", (uint64_t)i, &score))
            t->tokens[i].score = (float)score;
        if (has_types && pt_gguf_arr_int(g, "tokenizer.ggml.token_type", (uint64_t)i, &type)) {
            if (type < 0 || type > TOK_BYTE)
                return pt_fail(err, "token %d (\"%.40s\") has unknown type %lld", i,
                               t->tokens[i].text, (long long)type);
            t->tokens[i].type = type == 0 ? TOK_NORMAL : (uint8_t)type;
        }
    }
    return 0;
}

static void collect_added(pt_tokenizer *t) {
    t->added = pt_xcalloc((size_t)t->n_vocab, sizeof *t->added);
    for (int i = 0; i < t->n_vocab; i++) {
        uint8_t type = t->tokens[i].type;
        t->tokens[i].special = type == TOK_CONTROL || type == TOK_UNKNOWN || type == TOK_UNUSED;
        if (type == TOK_CONTROL || type == TOK_USER || type == TOK_UNKNOWN)
            t->added[t->n_added++] = (tok_added){i, type != TOK_USER, false, false};
    }
}

/* A special id from the file, or dflt; out of range means none. */
static int32_t special_id(const pt_tokenizer *t, const pt_gguf *g, const char *key,
                          int32_t dflt) {
    int64_t v;
    if (!pt_gguf_get_int(g, key, &v)) v = dflt;
    if (v < 0 || v >= t->n_vocab) {
        if (v != dflt && v != 0xFFFFFFFFll && v != -1)
            pt_warn("%s = %lld is outside the vocabulary; ignored", key, (long long)v);
        return -1;
    }
    return (int32_t)v;
}

int tok_gguf_vocab(pt_tokenizer *t, const pt_gguf *g, bool spm, pt_err *err) {
    if (read_tokens(t, g, err) || read_scores_types(t, g, err)) return -1;
    collect_added(t);
    tok_strmap_build(t);
    tok_trie_build(t);
    /* Defaults as llama.cpp has them for SPM vocabularies. */
    t->bos = special_id(t, g, "tokenizer.ggml.bos_token_id", spm ? 1 : -1);
    t->eos = special_id(t, g, "tokenizer.ggml.eos_token_id", spm ? 2 : -1);
    t->unk = special_id(t, g, "tokenizer.ggml.unknown_token_id", spm ? 0 : -1);
    tok_set_eog(t, special_id(t, g, "tokenizer.ggml.eot_token_id", -1));
    tok_set_eog(t, special_id(t, g, "tokenizer.ggml.eom_token_id", -1));
    tok_mark_eog_by_name(t);
    return 0;
}
