/*
 * structured.c - response_format and the grammar logits processor.
 *
 * The processor masks every token the grammar does not allow next.  End of
 * generation follows the grammar: while the output is incomplete every
 * end-of-generation token is masked; once it is complete they are allowed,
 * and once nothing can extend it they are the only tokens allowed.
 *
 * The vocabulary trie is built once per tokenizer and shared (read-only);
 * each request compiles its own grammar and each processor owns its
 * matcher, so nothing here is shared between threads but the trie.
 */
#include "server/structured.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

/* Whitespace between JSON tokens in generated output: one character at
 * most, so a small model cannot spend its tokens on indentation. */
#define PT_STRUCTURED_WS 1

struct pt_structured {
    pt_grammar *g;
    const pt_gvocab *v;
    const pt_tokenizer *tok;
};

static pthread_mutex_t vocab_mu = PTHREAD_MUTEX_INITIALIZER;
static const pt_tokenizer *vocab_tok;
static pt_gvocab *vocab;

/* The trie for tok, built on first use; kept for the process's life. */
static const pt_gvocab *shared_vocab(const pt_tokenizer *tok) {
    pthread_mutex_lock(&vocab_mu);
    if (vocab_tok != tok) {
        pt_gvocab_free(vocab); /* a different model: callers of the old one are gone */
        vocab = pt_gvocab_from_tokenizer(tok);
        vocab_tok = tok;
    }
    const pt_gvocab *v = vocab;
    pthread_mutex_unlock(&vocab_mu);
    return v;
}

pt_structured *pt_structured_new(pt_grammar *g, const pt_tokenizer *tok) {
    pt_structured *s = pt_xcalloc(1, sizeof *s);
    s->g = g;
    s->tok = tok;
    s->v = shared_vocab(tok);
    return s;
}

void pt_structured_free(pt_structured *s) {
    if (!s) return;
    pt_grammar_free(s->g);
    free(s);
}

int pt_structured_from_response_format(pt_structured **out, const json_t *rf,
                                       const pt_tokenizer *tok, const char **param, pt_err *err) {
    *out = NULL;
    *param = "response_format";
    if (!rf || json_is_null(rf)) return 0;
    if (!json_is_object(rf)) return pt_fail(err, "response_format must be an object");
    const char *t = json_string_value(json_object_get(rf, "type"));
    pt_grammar *g = NULL;
    if (t && !strcmp(t, "text")) return 0;
    if (t && !strcmp(t, "json_object")) {
        json_t *any = json_pack("{s:s}", "type", "object");
        int rc = pt_grammar_from_schema_ws(&g, any, PT_STRUCTURED_WS, err);
        json_decref(any);
        if (rc) return -1;
    } else if (t && !strcmp(t, "json_schema")) {
        json_t *js = json_object_get(rf, "json_schema");
        *param = "response_format.json_schema";
        if (!json_is_object(js))
            return pt_fail(err, "response_format json_schema must be an object with a \"schema\"");
        json_t *schema = json_object_get(js, "schema");
        if (!schema) return pt_fail(err, "response_format.json_schema has no \"schema\"");
        *param = "response_format.json_schema.schema";
        if (pt_grammar_from_schema_ws(&g, schema, PT_STRUCTURED_WS, err)) return pt_failp(err, "json_schema");
    } else {
        return pt_fail(err, "response_format type '%.40s' is not supported; use 'text', "
                            "'json_object' or 'json_schema'", t ? t : "?");
    }
    *out = pt_structured_new(g, tok);
    return 0;
}

/* --- the processor ------------------------------------------------------- */

typedef struct gproc {
    const pt_structured *s;
    pt_gmatcher *m;
    uint32_t *mask;
    int words;
} gproc;

static int gp_max_writes(const void *self) {
    (void)self;
    return 0;
}

static void gp_apply(void *self, pt_logits *l) {
    gproc *p = self;
    int words = (l->n_vocab + 31) / 32;
    if (words > p->words) {
        p->mask = pt_xrealloc(p->mask, (size_t)words * 4);
        p->words = words;
    }
    memset(p->mask, 0, (size_t)words * 4);
    int nv = pt_gvocab_n_vocab(p->s->v);
    if (nv > l->n_vocab) nv = l->n_vocab;
    if (!pt_gmatcher_is_finished(p->m)) {
        uint32_t *full = p->mask;
        if (nv == l->n_vocab) {
            pt_gmatcher_mask(p->m, full);
        } else { /* the model's vocab is smaller than the tokenizer's */
            uint32_t *tmp = pt_xmalloc((size_t)(pt_gvocab_n_vocab(p->s->v) + 31) / 32 * 4);
            pt_gmatcher_mask(p->m, tmp);
            memcpy(full, tmp, (size_t)(nv / 32) * 4);
            for (int i = nv / 32 * 32; i < nv; i++)
                if ((tmp[i >> 5] >> (i & 31)) & 1) full[i >> 5] |= 1u << (i & 31);
            free(tmp);
        }
    }
    if (pt_gmatcher_is_accepting(p->m))
        for (int i = 0; i < nv; i++)
            if (pt_tokenizer_is_eog(p->s->tok, i)) p->mask[i >> 5] |= 1u << (i & 31);
    pt_logits_mask(l, p->mask);
}

static void gp_accept(void *self, int32_t id) {
    gproc *p = self;
    /* An end token, or one the mask did not allow (a caller that skipped
     * apply), still counts as a step so rollback stays aligned. */
    if (!pt_gmatcher_accept(p->m, id)) pt_gmatcher_accept_bytes(p->m, "", 0);
}

static void gp_rollback(void *self, int n) {
    gproc *p = self;
    pt_gmatcher_rollback(p->m, n);
}

/* Jump-forward: the bytes the grammar forces next, as tokens.  The
 * tokenizer spells them (the model's own tokenization) when its tokens
 * spell exactly those bytes; else (a SentencePiece space prefix, a
 * normalizer) the longest vocabulary token at each point does.  Tokenized
 * alone, the bytes may be cut differently than in context, where the text
 * before and after can merge with them (SGLang retokenizes the whole
 * output for this); here nothing already output is changed.  Instead the
 * last token is left out, since what follows may merge with it (`"` then
 * `:` may be the one token `":`), and what is proposed is verified by the
 * model like a speculative draft: a token the model would cut differently
 * costs a wasted row, never a different output. */
static int gp_forced(void *self, int32_t *out, int cap) {
    gproc *p = self;
    char buf[256];
    size_t n = pt_gmatcher_forced_bytes(p->m, buf, sizeof buf);
    if (n == 0 || cap <= 0) return 0;
    int32_t ids[sizeof buf + 1], *t = NULL;
    size_t n_t = 0, at = 0;
    int k = 0;
    pt_err err = {{0}};
    if (pt_tokenize(p->s->tok, buf, n, false, false, &t, &n_t, &err) == 0) {
        for (size_t i = 0; i < n_t && k < (int)sizeof buf; i++) {
            size_t len;
            const char *b = pt_token_bytes(p->s->tok, t[i], &len);
            if (!len || at + len > n || memcmp(b, buf + at, len)) break;
            ids[k++] = t[i];
            at += len;
        }
    }
    free(t);
    if (at < n) { /* not all spelled: the longest tokens, from the start */
        k = 0, at = 0;
        while (at < n) {
            size_t len;
            int32_t id = pt_gvocab_longest_prefix(p->s->v, buf + at, n - at, &len);
            if (id < 0) break;
            ids[k++] = id;
            at += len;
        }
    }
    k = k - 1 < cap ? k - 1 : cap; /* the last may merge with what follows */
    int ok = 0;
    while (ok < k && pt_gmatcher_accept(p->m, ids[ok])) out[ok] = ids[ok], ok++;
    pt_gmatcher_rollback(p->m, ok);
    return ok;
}

static void gp_free(void *self) {
    gproc *p = self;
    pt_gmatcher_free(p->m);
    free(p->mask);
    free(p);
}

static const pt_logits_proc_ops grammar_ops = {
    .name = "grammar",
    .max_writes = gp_max_writes,
    .apply = gp_apply,
    .accept = gp_accept,
    .rollback = gp_rollback,
    .free = gp_free,
    .forced = gp_forced,
};

pt_logits_proc pt_grammar_proc_new(const pt_structured *s) {
    gproc *p = pt_xcalloc(1, sizeof *p);
    p->s = s;
    p->m = pt_gmatcher_new(s->g, s->v);
    return (pt_logits_proc){&grammar_ops, p};
}

void pt_structured_add_procs(void *arg, pt_sampler *s) {
    pt_sampler_add_proc(s, pt_grammar_proc_new(arg));
}
