/*
 * blocks.c - the pieces a family's forward is assembled from.
 *
 * Each block runs one step's rows through one part of a layer, written
 * once against the backend op table, reading the layer's weights
 * (m->layers[l]) and plan (m->plan[l]) itself, so a family's forward names
 * blocks, not tensors.  Data flows through the workspace: x is the residual
 * stream; a block reads h and leaves its result in h (attention also uses
 * q, k, v and att; the FFN gate and up).
 *
 * A block implements only the plan kinds that pt_layer_plan_check accepts;
 * a new kind comes with its block and leaves that check in the same change.
 */
#include <math.h>

#include "model/model_int.h"

/* y = x·Wᵀ (+ bias) for n rows. */
static void project(pt_backend *be, float *y, const float *x, const pt_weight *w, const float *bias,
                    int n) {
    pt_be_matmul(be, y, x, w, n);
    if (bias) pt_be_add_bias(be, y, bias, n, (int)w->rows);
}

void pt_block_embed(pt_model *m, const pt_step *s) {
    pt_be_embed(m->be, m->ws->x, &m->tok_embd, m->ws->tokens, s->n);
}

/* y = RMSNorm(x) * gain over rows of dim (PT_NORM_RMS, the only kind yet). */
void pt_block_norm(pt_model *m, const pt_step *s, float *y, const float *x, const float *gain) {
    pt_be_rmsnorm(m->be, y, x, gain, s->n, m->cfg.dim, m->cfg.norm_eps);
}

/* q, k, v = h·Wq, Wk, Wv (+ biases); with qk_norm an RMSNorm per head;
 * then rope at each row's position with the layer's frequencies. */
void pt_block_qkv(pt_model *m, int l, const pt_step *s) {
    pt_backend *be = m->be;
    const pt_model_config *c = &m->cfg;
    const pt_layer *L = &m->layers[l];
    const pt_rope *rope = &m->plan[l].rope;
    pt_workspace *ws = m->ws;
    int n = s->n;

    project(be, ws->q, ws->h, &L->wq, L->bq, n);
    project(be, ws->k, ws->h, &L->wk, L->bk, n);
    project(be, ws->v, ws->h, &L->wv, L->bv, n);
    if (c->qk_norm) {
        pt_be_rmsnorm(be, ws->q, ws->q, L->q_norm, n * c->n_heads, c->head_dim, c->norm_eps);
        pt_be_rmsnorm(be, ws->k, ws->k, L->k_norm, n * c->n_kv_heads, c->head_dim, c->norm_eps);
    }
    pt_be_rope(be, ws->q, s->b, c->n_heads, c->head_dim, rope);
    pt_be_rope(be, ws->k, s->b, c->n_kv_heads, c->head_dim, rope);
}

/* Stores the rows' k and v in the layer's cache, then h = attention of q
 * over each row's sequence up to its position, ·Wo (+ bias).  Full causal
 * attention (PT_MIX_ATTN). */
void pt_block_attention(pt_model *m, int l, const pt_step *s) {
    pt_backend *be = m->be;
    const pt_model_config *c = &m->cfg;
    const pt_layer *L = &m->layers[l];
    pt_workspace *ws = m->ws;
    pt_kv_view kv = pt_kv_layer(s->kv, l);

    pt_be_kv_store(be, &kv, s->b, ws->k, ws->v);
    pt_be_attention(be, ws->att, ws->q, &kv, s->b, c->n_heads, 1.0f / sqrtf((float)c->head_dim));
    project(be, ws->h, ws->att, &L->wo, L->bo, s->n);
}

/* h = (act(h·Wgate) * h·Wup)·Wdown: a dense gated FFN (PT_FFN_DENSE with
 * PT_ACT_SILU, i.e. SwiGLU). */
void pt_block_ffn(pt_model *m, int l, const pt_step *s) {
    pt_backend *be = m->be;
    const pt_layer *L = &m->layers[l];
    pt_workspace *ws = m->ws;
    int n = s->n;

    pt_be_matmul(be, ws->gate, ws->h, &L->w_gate, n);
    pt_be_matmul(be, ws->up, ws->h, &L->w_up, n);
    pt_be_swiglu(be, ws->gate, ws->gate, ws->up, (size_t)n * m->cfg.ffn_dim);
    pt_be_matmul(be, ws->h, ws->gate, &L->w_down, n);
}

/* x += h (every plan's residual scale is 1 so far). */
void pt_block_residual(pt_model *m, const pt_step *s) {
    pt_workspace *ws = m->ws;
    pt_be_add(m->be, ws->x, ws->x, ws->h, (size_t)s->n * m->cfg.dim);
}

/* Final norm and output projection for the wanted rows, PT_OUT_ROWS at a
 * time, straight into the caller's buffer. */
void pt_block_output(pt_model *m, const pt_step *s) {
    pt_backend *be = m->be;
    pt_workspace *ws = m->ws;
    const pt_model_config *c = &m->cfg;
    for (int i = 0; i < s->n_out; i += PT_OUT_ROWS) {
        int k = PT_MIN(PT_OUT_ROWS, s->n_out - i);
        pt_be_gather_rows(be, ws->out_h, ws->x, ws->out_idx + i, k, c->dim);
        pt_be_rmsnorm(be, ws->out_h, ws->out_h, m->output_norm, k, c->dim, c->norm_eps);
        pt_be_matmul(be, ws->logits, ws->out_h, &m->output, k);
        be->ops->download(be, s->logits + (size_t)i * c->vocab_size, ws->logits,
                          sizeof(float) * (size_t)k * c->vocab_size);
    }
}
