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

/* Uploads rows [first, first+n) and the block tables (a grouped cache's
 * window tables after group 0's); fills the views (v[1]: the window
 * group's) and the indices of the rows whose logits are wanted. */
static int upload_batch(pt_model *m, const pt_kv_cache *kv, const pt_batch *b, int first, int n,
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
    v[0] = (pt_batch_view){.n_tokens = n, .pos = ws->pos, .seq = ws->seq, .block_table = ws->block_table, .max_pages = max_pages, .n_seqs = b->n_seqs};
    v[1] = v[0];
    v[1].block_table = ws->block_table + per_group * (n_groups - 1);
    return 0;
}

int pt_model_forward(pt_model *m, pt_kv_cache *kv, const pt_batch *b, float *logits, pt_err *err) {
    for (int first = 0; first < b->n_tokens; first += m->max_batch) {
        int n = PT_MIN(m->max_batch, b->n_tokens - first), n_out;
        pt_batch_view v[2];
        if (check_rows(m, kv, b, first, n, err)) return -1;
        if (upload_batch(m, kv, b, first, n, v, &n_out, err)) return -1;
        pt_step s = {.kv = kv, .b = &v[0], .bw = &v[1], .n = n, .n_out = n_out, .logits = logits};
        m->family->forward(m, &s);
        if (n_out) logits += (size_t)n_out * m->cfg.vocab_size;
    }
    /* The backend's sticky error (a device fault, memory, an injected
     * fault) surfaces here: this batch's K/V and logits are garbage, so the
     * caller fails the batch's sequences; the backend may run the next. */
    if (m->be->ops->sync(m->be)) return pt_be_take_error(m->be, err);
    return 0;
}
