/*
 * draft.c - the n-gram and oracle drafters (see draft.h), and the check
 * that a draft model shares the target's vocabulary (pt_engine_attach_draft,
 * engine.h).  The draft model's own drafting runs in the core (core.c:
 * draft_model_pass), beside the requests whose sequences it mirrors.
 *
 * The n-gram search is a plain backward scan: O(length x n) per call,
 * a few microseconds for contexts of a few thousand tokens, far below a
 * forward.  An index would pay off only for very long contexts.
 */
#include "engine/draft.h"

#include <stdlib.h>

/* The latest start i < limit with src[i..i+n) == pat[0..n), or -1. */
static int find_last(const int32_t *src, int limit, const int32_t *pat, int n) {
    for (int i = limit - 1; i >= 0; i--)
        if (src[i] == pat[0] && memcmp(src + i, pat, sizeof(int32_t) * (size_t)n) == 0) return i;
    return -1;
}

/* The start i of an occurrence of pat[0..n) in src[0..len) whose end i + n
 * is nearest to `want`, or -1. */
static int find_nearest(const int32_t *src, int len, const int32_t *pat, int n, int want) {
    int best = -1;
    for (int i = 0; i + n <= len; i++)
        if (src[i] == pat[0] && memcmp(src + i, pat, sizeof(int32_t) * (size_t)n) == 0 &&
            (best < 0 || abs(i + n - want) < abs(best + n - want)))
            best = i;
    return best;
}

int pt_draft_ngram(const int32_t *hist, int n_hist, const int32_t *extra, int n_extra, int at_hint,
                   int n_min, int n_max, int k, int32_t *out) {
    if (k <= 0) return 0;
    for (int n = PT_MIN(n_max, n_hist); n >= PT_MAX(n_min, 1); n--) {
        const int32_t *suffix = hist + n_hist - n;
        /* a Predicted Output first: it is the intended continuation */
        int at = extra ? find_nearest(extra, n_extra - 1, suffix, n, at_hint) : -1;
        if (at >= 0) {
            int m = PT_MIN(k, n_extra - (at + n));
            memcpy(out, extra + at + n, sizeof(int32_t) * (size_t)m);
            return m;
        }
        /* then the sequence itself, the occurrence before the suffix */
        at = find_last(hist, n_hist - n, suffix, n);
        if (at >= 0) {
            int m = PT_MIN(k, n_hist - (at + n));
            memcpy(out, hist + at + n, sizeof(int32_t) * (size_t)m);
            return m;
        }
    }
    return 0;
}

int pt_draft_oracle(const int32_t *truth, int n_truth, int at, float accept, int n_vocab, int k,
                    pt_rng *rng, int32_t *out) {
    int m = PT_MAX(0, PT_MIN(k, n_truth - at));
    for (int i = 0; i < m; i++) {
        out[i] = truth[at + i];
        if (pt_rng_uniform(rng) >= accept && n_vocab > 1) /* a wrong guess: any other token */
            out[i] = (int32_t)((out[i] + 1 + pt_rng_next(rng) % (uint64_t)(n_vocab - 1)) % n_vocab);
    }
    return m;
}

/* ---- the draft model's vocabulary ---------------------------------------------- */

int pt_engine_attach_draft(pt_engine *e, pt_engine *d, pt_err *err) {
    int nt = e->model->cfg.vocab_size, nd = d->model->cfg.vocab_size;
    if (nt != nd)
        return pt_fail(err, "--draft-model has a vocabulary of %d tokens, the model %d: a draft "
                            "model must use the target's tokenizer", nd, nt);
    /* opened without one (the size is checked first, so a model with none
     * still hears why it does not fit); the texts need it */
    if (e->tok && !d->tok && d->model->file && pt_tokenizer_load(&d->tok, d->model->file, err))
        return pt_failp(err, "--draft-model: its tokenizer is needed to compare vocabularies");
    if (!e->tok != !d->tok)
        return pt_fail(err, "--draft-model: only one of the two models has a tokenizer, so "
                            "their vocabularies cannot be compared");
    if (e->tok && pt_tokenizer_n_vocab(e->tok) != pt_tokenizer_n_vocab(d->tok))
        return pt_fail(err, "--draft-model's tokenizer has %d tokens, the model's %d: a draft "
                            "model must use the target's tokenizer",
                       pt_tokenizer_n_vocab(d->tok), pt_tokenizer_n_vocab(e->tok));
    for (int id = 0; e->tok && id < pt_tokenizer_n_vocab(e->tok); id++) {
        size_t lt, ld;
        const char *t = pt_token_bytes(e->tok, id, &lt), *x = pt_token_bytes(d->tok, id, &ld);
        if (lt != ld || memcmp(t, x, lt) != 0)
            return pt_fail(err, "--draft-model's token %d is '%.*s', the model's is '%.*s': a "
                                "draft model must use the target's tokenizer",
                           id, (int)PT_MIN(ld, 40), x, (int)PT_MIN(lt, 40), t);
    }
    /* the draft's own rollbacks reach back over its k drafted steps
     * (core.c draft_sync): its window pages keep that many positions */
    if (d->kv.grouped) {
        d->kv_slack = 16; /* core.c's SPEC_MAX */
        if (pt_engine_kv_init(d, d->kv.cfg.n_pages * d->kv.cfg.page_size, err))
            return pt_failp(err, "--draft-model's KV cache");
    }
    e->draft = d;
    return 0;
}
