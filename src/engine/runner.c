/*
 * runner.c - plan items -> one batch -> forward -> logits (see runner.h).
 */
#include "engine/runner.h"

#include <stdlib.h>

void pt_runner_init(pt_runner *r, pt_engine *e) {
    memset(r, 0, sizeof *r);
    r->e = e;
    const char *env = getenv("PETREL_DEVICE_ARGMAX");
    r->can_ids = pt_model_can_argmax(e->model) && !(env && *env && atoi(env) == 0);
}

void pt_runner_free(pt_runner *r) {
    free(r->tok), free(r->pos), free(r->seq), free(r->want);
    free(r->kv);
    free(r->logits), free(r->ids);
    memset(r, 0, sizeof *r);
}

static void grow(pt_runner *r, int rows, int seqs, int logits) {
    if (rows > r->cap_rows) {
        r->cap_rows = PT_MAX(rows, 2 * r->cap_rows);
        size_t n = (size_t)r->cap_rows;
        r->tok = pt_xrealloc(r->tok, sizeof(int32_t) * n);
        r->pos = pt_xrealloc(r->pos, sizeof(int32_t) * n);
        r->seq = pt_xrealloc(r->seq, sizeof(int32_t) * n);
        r->want = pt_xrealloc(r->want, sizeof(bool) * n);
    }
    if (seqs > r->cap_seqs) {
        r->cap_seqs = PT_MAX(seqs, 2 * r->cap_seqs);
        r->kv = pt_xrealloc(r->kv, sizeof *r->kv * (size_t)r->cap_seqs);
    }
    if (logits > r->cap_logits) {
        r->cap_logits = PT_MAX(logits, 2 * r->cap_logits);
        size_t vocab = (size_t)r->e->model->cfg.vocab_size;
        r->logits = pt_xrealloc(r->logits, sizeof(float) * vocab * (size_t)r->cap_logits);
        r->ids = pt_xrealloc(r->ids, sizeof(int32_t) * (size_t)r->cap_logits);
    }
}

int pt_runner_run(pt_runner *r, const pt_run_item *items, int n_items, int *failed, pt_err *err) {
    pt_kv_cache *kv = &r->e->kv;
    int rows = 0, logits = 0;
    *failed = -1;
    for (int i = 0; i < n_items; i++) rows += items[i].n_rows, logits += items[i].n_logits;
    grow(r, rows, n_items, logits);
    int row = 0;
    for (int i = 0; i < n_items; i++) {
        pt_seq *s = items[i].seq;
        int first = s->kv.n_tokens, n = items[i].n_rows;
        if (first + n > s->n_tokens || first + n > r->e->n_ctx) {
            *failed = i;
            return pt_fail(err, "sequence of %d tokens cannot compute positions %d..%d (context %d)",
                           s->n_tokens, first, first + n - 1, r->e->n_ctx);
        }
        if (pt_kv_seq_own(kv, &s->kv, first, first + n, err)) {
            *failed = i;
            return -1;
        }
        r->kv[i] = &s->kv;
        for (int j = 0; j < n; j++, row++) {
            r->tok[row] = s->tokens[first + j];
            r->pos[row] = first + j;
            r->seq[row] = i;
            r->want[row] = j >= n - items[i].n_logits;
        }
    }
    r->have_ids = r->want_ids && r->can_ids;
    pt_batch b = {rows, r->tok, r->pos, r->seq, r->want, n_items, r->kv,
                  r->have_ids ? r->ids : NULL};
    if (pt_model_forward(r->e->model, kv, &b, r->logits, err)) return -1;
    for (int i = 0; i < n_items; i++)
        pt_kv_seq_computed(&items[i].seq->kv, items[i].seq->kv.n_tokens + items[i].n_rows);
    return 0;
}
