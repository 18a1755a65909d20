/*
 * cost.c - what one token of a forward costs, by the plan: the bytes a
 * decode step reads and the multiply-adds of a token, for rooflines
 * (petrel bench).
 *
 * A MoE layer reads only the top_k experts its router picks (matmul_id
 * never touches the others), so a decode step reads top_k / n_experts of
 * every expert stack; a sliding-window layer reads at most `window`
 * positions of its KV cache.  A dense Llama counts as before: every matrix
 * but the embedding table (one row of it), and the whole cache so far.
 */
#include "model/model_int.h"

/* Bytes of layer l's expert stacks that one token does not read. */
static double idle_expert_bytes(const pt_model *m, int l) {
    const pt_layer_plan *p = &m->plan[l];
    if (p->ffn != PT_FFN_MOE || p->n_experts <= 0) return 0;
    const pt_layer *L = &m->layers[l];
    double stacks = (double)L->w_gate.nbytes + (double)L->w_up.nbytes + (double)L->w_down.nbytes;
    return stacks * (1.0 - (double)p->top_k / p->n_experts);
}

double pt_model_step_bytes(const pt_model *m, int depth, size_t kv_bytes_per_token) {
    const pt_model_config *c = &m->cfg;
    double w = (double)m->weight_bytes, kv_layer = (double)kv_bytes_per_token / c->n_layers, kv = 0;
    if (!c->tied_embeddings) w -= (double)m->tok_embd.nbytes;
    for (int l = 0; l < c->n_layers; l++) {
        const pt_layer_plan *p = &m->plan[l];
        int seen = p->mixer == PT_MIX_ATTN_SWA ? PT_MIN(depth, p->window) : depth;
        w -= idle_expert_bytes(m, l);
        kv += (double)seen * kv_layer;
    }
    return w + kv;
}

double pt_model_token_flops(const pt_model *m) {
    const pt_model_config *c = &m->cfg;
    double q = (double)c->n_heads * c->head_dim, kv = (double)c->n_kv_heads * c->head_dim;
    double attn = c->dim * (q + 2 * kv) + q * c->dim, total = (double)c->vocab_size * c->dim;
    for (int l = 0; l < c->n_layers; l++) {
        const pt_layer_plan *p = &m->plan[l];
        double ffn = p->ffn == PT_FFN_MOE
                         ? (double)c->dim * p->n_experts + 3.0 * c->dim * c->expert_ffn_dim * p->top_k
                         : 3.0 * c->dim * c->ffn_dim;
        total += attn + ffn;
    }
    return 2.0 * total;
}
