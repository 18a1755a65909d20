/*
 * batch.c - KV bookkeeping for callers that run pt_model_forward directly
 * (tests, eval, convert's calibration).  The engine's runner does the same
 * per plan item; the forward itself never changes sequence state.
 */
#include "model/model.h"

/* Each sequence's rows are owned as one span [lowest, highest + 1): a
 * window group recycles below the span's start (kvcache.h), so owning row
 * by row would give back pages the batch's earlier rows still read. */
int pt_batch_reserve(pt_kv_cache *kv, const pt_batch *b, pt_err *err) {
    for (int i = 0; i < b->n_tokens; i++)
        if (b->seq[i] < 0 || b->seq[i] >= b->n_seqs)
            return pt_fail(err, "row %d: sequence index %d out of range", i, b->seq[i]);
    for (int s = 0; s < b->n_seqs; s++) {
        int lo = INT32_MAX, hi = -1;
        for (int i = 0; i < b->n_tokens; i++)
            if (b->seq[i] == s && b->pos[i] >= 0) lo = PT_MIN(lo, b->pos[i]), hi = PT_MAX(hi, b->pos[i]);
        if (hi >= 0 && pt_kv_seq_own(kv, b->seqs[s], lo, hi + 1, err)) return -1;
    }
    return 0;
}

void pt_batch_advance(const pt_batch *b) {
    for (int i = 0; i < b->n_tokens; i++) {
        pt_kv_seq_computed(b->seqs[b->seq[i]], b->pos[i] + 1);
    }
}

int pt_model_run(pt_model *m, pt_kv_cache *kv, const pt_batch *b, float *logits, pt_err *err) {
    if (pt_batch_reserve(kv, b, err) || pt_model_forward(m, kv, b, logits, err)) return -1;
    pt_batch_advance(b);
    return 0;
}
