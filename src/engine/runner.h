/*
 * runner.h - one forward over a step's rows: plan items in, logits out.
 *
 * The runner turns "compute rows [n_computed, n_computed + n_rows) of these
 * sequences and give me the logits of the last n_logits rows of each" into
 * one flattened batch, makes the pages those rows write the sequences' own
 * (allocating lazily, copying shared pages), runs the model, and advances
 * each sequence's computed count.  It is the only code that writes
 * sequence KV state during a forward; the model reads block tables only.
 */
#ifndef PETREL_RUNNER_H
#define PETREL_RUNNER_H

#include "engine/engine.h"

typedef struct pt_run_item {
    pt_seq *seq;
    int n_rows;   /* tokens from seq->kv.n_tokens on; seq->tokens must hold them */
    int n_logits; /* logits of the last n_logits rows, 0..n_rows */
} pt_run_item;

typedef struct pt_runner {
    pt_engine *e;
    int32_t *tok, *pos, *seq; /* [cap_rows] */
    bool *want;
    int cap_rows;
    pt_kv_seq **kv; /* [cap_seqs] */
    int cap_seqs;
    float *logits; /* [cap_logits][vocab] */
    int32_t *ids;  /* [cap_logits] */
    int cap_logits;
    /* Greedy picks on the backend: with want_ids set by the caller, a run
     * brings back each wanted row's argmax (as the sampler takes it) into
     * ids instead of its logits into logits, where the model can
     * (pt_model_can_argmax, and PETREL_DEVICE_ARGMAX is not 0: A/B runs);
     * have_ids says which of the two the last run filled. */
    bool want_ids, have_ids, can_ids;
} pt_runner;

void pt_runner_init(pt_runner *r, pt_engine *e);
void pt_runner_free(pt_runner *r);

/* Runs the items as one batch.  On success the logits of item i start at
 * row (sum of n_logits of the items before it) of r->logits (with
 * have_ids: its picks at that index of r->ids).  On failure
 * *failed is the item whose pages could not be had (-1: the forward itself
 * failed) and no sequence advanced. */
int pt_runner_run(pt_runner *r, const pt_run_item *items, int n_items, int *failed, pt_err *err);

#endif
