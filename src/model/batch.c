/*
 * batch.c - KV bookkeeping for callers that run pt_model_forward directly
 * (tests, eval, convert's calibration).  The engine's runner does the same
 * per plan item; the forward itself never changes sequence state.
 */
#include "model/model.h"

int pt_batch_reserve(pt_kv_cache *kv, const pt_batch *b, pt_err *err) {
    for (int i = 0; i < b->n_tokens; i++) {
        if (b->seq[i] < 0 || b->seq[i] >= b->n_seqs)
            return pt_fail(err, "row %d: sequence index %d out of range", i, b->seq[i]);
        pt_kv_seq *s = b->seqs[b->seq[i]];
        if (b->pos[i] >= 0 && pt_kv_seq_own(kv, s, b->pos[i], b->pos[i] + 1, err)) return -1;
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
