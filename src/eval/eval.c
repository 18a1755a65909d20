/*
 * eval.c - perplexity and KL divergence over sliding windows.
 */
#include "eval/eval.h"

#include <math.h>
#include <stdlib.h>

/* Runs tokens[0..n) as a fresh sequence and writes the logits of rows
 * [from, n-1) (the rows that predict a next token we score) to out. */
static int window_logits(pt_engine *e, const int32_t *tokens, int n, int from, float *out,
                         pt_err *err) {
    pt_kv_seq kv = {0};
    pt_kv_seq *seqs[1] = {&kv};
    int32_t *pos = pt_xmalloc(sizeof(int32_t) * (size_t)n);
    int32_t *seq = pt_xcalloc((size_t)n, sizeof(int32_t));
    bool *want = pt_xcalloc((size_t)n, sizeof(bool));
    for (int i = 0; i < n; i++) {
        pos[i] = i;
        want[i] = i >= from && i < n - 1;
    }
    pt_batch b = {n, (int32_t *)tokens, pos, seq, want, 1, seqs};
    int rc = pt_model_run(e->model, &e->kv, &b, out, err);
    pt_kv_seq_release(&e->kv, &kv);
    free(pos);
    free(seq);
    free(want);
    return rc;
}

/* log-softmax of one row into lp (double accumulation for the sum). */
static void log_softmax(const float *x, int n, double *lp) {
    double mx = x[0], sum = 0;
    for (int i = 1; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    for (int i = 0; i < n; i++) sum += exp(x[i] - mx);
    double lse = mx + log(sum);
    for (int i = 0; i < n; i++) lp[i] = x[i] - lse;
}

static int argmax(const double *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Walks the windows; for each, gets logits from one or two engines and
 * hands each scored row to the accumulators below. */
static int run_windows(pt_engine *a, pt_engine *b, const int32_t *tokens, int n, int n_ctx,
                       pt_eval_progress cb, void *user, pt_eval_result *r, double *kls,
                       pt_err *err) {
    if (n_ctx < 4) return pt_fail(err, "eval: window of %d tokens is too small", n_ctx);
    if (n < 2) return pt_fail(err, "eval: the text has fewer than 2 tokens");
    if (n_ctx > a->n_ctx || (b && n_ctx > b->n_ctx))
        return pt_fail(err, "eval: window of %d tokens exceeds the KV cache (raise --ctx)", n_ctx);
    int vocab = a->model->cfg.vocab_size;
    if (b && b->model->cfg.vocab_size != vocab)
        return pt_fail(err, "eval: vocabularies differ (%d vs %d)", vocab, b->model->cfg.vocab_size);
    float *la = pt_alloc_big(sizeof(float) * (size_t)n_ctx * vocab);
    float *lb = b ? pt_alloc_big(sizeof(float) * (size_t)n_ctx * vocab) : NULL;
    double *pa = pt_xmalloc(sizeof(double) * (size_t)vocab), *pb = pt_xmalloc(sizeof(double) * (size_t)vocab);
    double nll = 0;
    int agree = 0, rc = 0, stride = n_ctx / 2, scored_to = 1; /* next token index to score */
    memset(r, 0, sizeof *r);
    for (int start = 0; scored_to < n && rc == 0; start += stride) {
        int len = PT_MIN(n_ctx, n - start);
        int from = scored_to - 1 - start; /* row predicting token scored_to */
        rc = window_logits(a, tokens + start, len, from, la, err);
        if (rc == 0 && b) rc = window_logits(b, tokens + start, len, from, lb, err);
        for (int row = from; rc == 0 && row < len - 1; row++) {
            const float *xa = la + (size_t)(row - from) * vocab;
            log_softmax(xa, vocab, pa);
            nll -= pa[tokens[start + row + 1]];
            if (b) {
                log_softmax(lb + (size_t)(row - from) * vocab, vocab, pb);
                double kl = 0;
                for (int v = 0; v < vocab; v++) kl += exp(pa[v]) * (pa[v] - pb[v]);
                kls[r->n_scored] = kl > 0 ? kl : 0;
                agree += argmax(pa, vocab) == argmax(pb, vocab);
            }
            r->n_scored++;
        }
        scored_to = start + len;
        if (cb) cb(user, scored_to, n);
        if (start + len >= n) break;
    }
    pt_free_big(la, sizeof(float) * (size_t)n_ctx * vocab);
    if (lb) pt_free_big(lb, sizeof(float) * (size_t)n_ctx * vocab);
    free(pa);
    free(pb);
    if (rc) return -1;
    r->nll_mean = nll / r->n_scored;
    r->ppl = exp(r->nll_mean);
    if (b) {
        double sum = 0;
        for (int i = 0; i < r->n_scored; i++) sum += kls[i];
        r->kl_mean = sum / r->n_scored;
        qsort(kls, (size_t)r->n_scored, sizeof(double), cmp_double);
        r->kl_p99 = kls[(int)floor(0.99 * (r->n_scored - 1))];
        r->kl_max = kls[r->n_scored - 1];
        r->top1_agree = (double)agree / r->n_scored;
    }
    return 0;
}

int pt_eval_ppl(pt_engine *e, const int32_t *tokens, int n, int n_ctx, pt_eval_progress cb,
                void *user, pt_eval_result *out, pt_err *err) {
    return run_windows(e, NULL, tokens, n, n_ctx, cb, user, out, NULL, err);
}

int pt_eval_kl(pt_engine *a, pt_engine *b, const int32_t *tokens, int n, int n_ctx,
               pt_eval_progress cb, void *user, pt_eval_result *out, pt_err *err) {
    double *kls = pt_xmalloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
    int rc = run_windows(a, b, tokens, n, n_ctx, cb, user, out, kls, err);
    free(kls);
    return rc;
}
