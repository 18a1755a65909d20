/*
 * forward.c - pt_model_forward, the one entry for every forward call:
 * checks a flattened batch, uploads it (rows, positions, sequences, block
 * tables) into the workspace in chunks of max_batch rows, and hands each
 * chunk to the family's forward as a pt_step.
 *
 * The forward reads the sequences' block tables and changes no sequence
 * state: pages and positions are the caller's (the engine's runner, or
 * pt_model_run in batch.c for direct callers).
 */
#include "model/model_int.h"

/* Rejects rows the forward cannot run.  Pages are the caller's: every
 * row's position must already have one. */
static int check_rows(pt_model *m, const pt_kv_cache *kv, const pt_batch *b, int first, int n,
                      pt_err *err) {
    for (int i = first; i < first + n; i++) {
        if (b->tokens[i] < 0 || b->tokens[i] >= m->cfg.vocab_size)
            return pt_fail(err, "token id %d out of range (vocabulary %d)", b->tokens[i],
                           m->cfg.vocab_size);
        if (b->seq[i] < 0 || b->seq[i] >= b->n_seqs)
            return pt_fail(err, "row %d: sequence index %d out of range", i, b->seq[i]);
        if (b->pos[i] < 0) return pt_fail(err, "row %d: negative position", i);
        const pt_kv_seq *sq = b->seqs[b->seq[i]];
        if (b->pos[i] >= sq->n_pages * kv->cfg.page_size ||
            (kv->grouped && sq->wpages[b->pos[i] / kv->cfg.page_size] < 0))
            return pt_fail(err, "row %d: position %d has no KV page (the caller reserves them)", i,
                           b->pos[i]);
    }
    return 0;
}

/* Hybrid recurrent models: each sequence's rows must continue its state
 * exactly, in order: from state_pos, or from position 0, which restarts
 * it.  A state rolled back (-1) or behind a reused prefix is refused here,
 * so it is never used for positions it does not hold.  Then uploads each
 * sequence's state slot for the recurrent ops. */
static int state_rows(pt_model *m, const pt_kv_cache *kv, const pt_batch *b, pt_err *err) {
    pt_workspace *ws = m->ws;
    if (kv->cfg.n_state_slots <= 0)
        return pt_fail(err, "a hybrid recurrent model needs a cache with its state group "
                            "(pt_model_kv_init)");
    size_t ns = (size_t)PT_MAX(b->n_seqs, 1);
    if (ns > ws->ss_cap) {
        if (ws->state_slot) m->be->ops->free(m->be, ws->state_slot, ws->ss_cap * 4);
        ws->ss_cap = PT_MAX(ns, 2 * ws->ss_cap);
        ws->state_slot = m->be->ops->alloc(m->be, ws->ss_cap * 4);
        ws->h_state_slot = pt_xrealloc(ws->h_state_slot, ws->ss_cap * 4);
        ws->h_state_next = pt_xrealloc(ws->h_state_next, ws->ss_cap * 4);
        if (!ws->state_slot) return ws->ss_cap = 0, pt_fail(err, "out of backend memory");
    }
    for (int s = 0; s < b->n_seqs; s++) {
        ws->h_state_slot[s] = b->seqs[s]->state - 1;
        ws->h_state_next[s] = b->seqs[s]->state_pos;
    }
    for (int i = 0; i < b->n_tokens; i++) {
        int s = b->seq[i], p = b->pos[i];
        if (s < 0 || s >= b->n_seqs) continue; /* check_rows says so */
        if (ws->h_state_slot[s] < 0)
            return pt_fail(err, "row %d: its sequence holds no recurrent-state slot (the caller "
                                "reserves it)", i);
        if (p != 0 && p != ws->h_state_next[s]) {
            if (ws->h_state_next[s] < 0)
                return pt_fail(err, "row %d: position %d, but the sequence's recurrent state was "
                                    "rolled back; a hybrid model restarts it at position 0", i, p);
            return pt_fail(err, "row %d: position %d, but the sequence's recurrent state holds "
                                "positions 0..%d; a hybrid model continues a sequence only where "
                                "its state ends (no prefix reuse; rollback needs a checkpoint)",
                           i, p, ws->h_state_next[s] - 1);
        }
        ws->h_state_next[s] = p + 1;
    }
    m->be->ops->upload(m->be, ws->state_slot, ws->h_state_slot, 4 * (size_t)b->n_seqs);
    return 0;
}

/* Uploads rows [first, first+n) and the block tables (a grouped cache's
 * window tables after group 0's); fills the views (v[1]: the window
 * group's) and the indices of the rows whose logits are wanted. */
int pt_model_upload_batch(pt_model *m, const pt_kv_cache *kv, const pt_batch *b, int first, int n,
                          pt_batch_view v[2], int *n_out, pt_err *err) {
    pt_backend *be = m->be;
    pt_workspace *ws = m->ws;
    int max_pages = 1, n_groups = kv->grouped ? 2 : 1;
    for (int s = 0; s < b->n_seqs; s++)
        max_pages = PT_MAX(max_pages, b->seqs[s]->n_pages);
    size_t per_group = (size_t)max_pages * b->n_seqs;
    if (pt_workspace_block_table(m, per_group * n_groups, err)) return -1;
    for (int g = 0; g < n_groups; g++)
        for (int s = 0; s < b->n_seqs; s++) {
            const pt_kv_seq *sq = b->seqs[s];
            int32_t *row = ws->h_block_table + per_group * g + (size_t)s * max_pages;
            memcpy(row, g ? sq->wpages : sq->pages, sizeof(int32_t) * (size_t)sq->n_pages);
            for (int p = sq->n_pages; p < max_pages; p++)
                row[p] = -1;
        }
    be->ops->upload(be, ws->block_table, ws->h_block_table,
                    sizeof(int32_t) * per_group * n_groups);
    be->ops->upload(be, ws->tokens, b->tokens + first, sizeof(int32_t) * (size_t)n);
    be->ops->upload(be, ws->pos, b->pos + first, sizeof(int32_t) * (size_t)n);
    be->ops->upload(be, ws->seq, b->seq + first, sizeof(int32_t) * (size_t)n);
    *n_out = 0;
    for (int i = 0; i < n; i++)
        if (b->logits && b->logits[first + i]) ws->h_out_idx[(*n_out)++] = i;
    be->ops->upload(be, ws->out_idx, ws->h_out_idx, sizeof(int32_t) * (size_t)*n_out);
    v[0] = (pt_batch_view){.n_tokens = n, .pos = ws->pos, .seq = ws->seq, .block_table = ws->block_table, .max_pages = max_pages, .n_seqs = b->n_seqs, .state_slot = ws->state_slot};
    v[1] = v[0];
    v[1].block_table = ws->block_table + per_group * (n_groups - 1);
    return 0;
}

bool pt_model_can_argmax(const pt_model *m) {
    const pt_backend *be = m->be;
    return !m->tp && m->output.rows == m->cfg.vocab_size &&
           (!be->ops->has_op || be->ops->has_op((pt_backend *)be, PT_OP_ARGMAX));
}

int pt_model_forward(pt_model *m, pt_kv_cache *kv, const pt_batch *b, float *logits, pt_err *err) {
    /* every row is checked before any runs: a chunk must not fail after
     * an earlier one has moved a recurrent state */
    if (check_rows(m, kv, b, 0, b->n_tokens, err)) return -1;
    if (pt_model_recurrent(m) && state_rows(m, kv, b, err)) return -1;
    int32_t *ids = b->argmax;
    if (ids && !pt_model_can_argmax(m))
        return pt_fail(err, "this model's forward cannot pick tokens on its backend (argmax)");
    if (m->tp) return pt_tp_forward(m, kv, b, logits, err); /* a split model: its ranks */
    for (int first = 0; first < b->n_tokens; first += m->max_batch) {
        int n = PT_MIN(m->max_batch, b->n_tokens - first), n_out;
        pt_batch_view v[2];
        if (pt_model_upload_batch(m, kv, b, first, n, v, &n_out, err)) return -1;
        pt_step s = {.kv = kv, .b = &v[0], .bw = &v[1], .n = n, .n_out = n_out, .logits = logits,
                     .ids = ids};
        m->family->forward(m, &s);
        if (ids) ids += n_out;
        else if (n_out) logits += (size_t)n_out * m->cfg.vocab_size;
    }
    /* The backend's sticky error (a device fault, memory, an injected
     * fault) surfaces here: this batch's K/V and logits are garbage, so the
     * caller fails the batch's sequences; the backend may run the next. */
    if (m->be->ops->sync(m->be)) {
        /* a recurrent state the failed ops half-updated must not be continued */
        for (int i = 0; i < b->n_seqs && pt_model_recurrent(m); i++)
            if (b->seqs[i]->state) b->seqs[i]->state_pos = -1;
        return pt_be_take_error(m->be, err);
    }
    return 0;
}
