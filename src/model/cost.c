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
 * A recurrent (Gated DeltaNet) layer keeps no KV: it reads and writes its
 * fixed state instead, whatever the depth (a hybrid's flat decode curve).
 * A latent-attention layer (DeepSeek) counts its absorbed projections; its
 * KV per token is the cache's (one latent + rope-key row).
 *
 * Every KV layer is taken to store the same bytes per position
 * (kv_bytes_per_token / layers with KV): true of every family but Gemma 4,
 * whose sliding and full layers have different shapes; its figure is
 * their average.
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

/* Floats of one recurrent layer's state per sequence: conv tail, matrices. */
static double state_floats(const pt_model_config *c) {
    double conv = 2.0 * c->lin_k_heads * c->lin_k_dim + (double)c->lin_v_heads * c->lin_v_dim;
    return conv * (c->lin_conv_kernel - 1) + (double)c->lin_v_heads * c->lin_k_dim * c->lin_v_dim;
}

double pt_model_step_bytes(const pt_model *m, int depth, size_t kv_bytes_per_token) {
    const pt_model_config *c = &m->cfg;
    int n_kv = 0; /* layers keeping K/V (a shared layer reads its source's) */
    for (int l = 0; l < c->n_layers; l++)
        n_kv += m->plan[l].mixer != PT_MIX_RECURRENT && m->plan[l].kv_layer == l;
    double w = (double)m->weight_bytes, kv = 0;
    double kv_layer = n_kv ? (double)kv_bytes_per_token / n_kv : 0;
    if (!c->tied_embeddings) w -= (double)m->tok_embd.nbytes;
    for (int l = 0; l < c->n_layers; l++) {
        const pt_layer_plan *p = &m->plan[l];
        w -= idle_expert_bytes(m, l);
        if (p->mixer == PT_MIX_RECURRENT) {
            kv += 2.0 * 4.0 * state_floats(c); /* read and written back */
            continue;
        }
        int seen = p->mixer == PT_MIX_ATTN_SWA ? PT_MIN(depth, p->window) : depth;
        kv += (double)seen * kv_layer;
    }
    return w + kv;
}

/* Layers of m that keep KV pages, and of those the sliding-window ones. */
static void kv_layers(const pt_model *m, int *n_kv, int *n_win) {
    *n_kv = *n_win = 0;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        const pt_layer_plan *p = &m->plan[l];
        *n_kv += p->mixer != PT_MIX_RECURRENT;
        *n_win += p->mixer == PT_MIX_ATTN_SWA;
    }
}

double pt_model_kv_resident(const pt_model *m, int n_ctx, size_t kv_bytes_per_token,
                            int page_size) {
    int n_kv, n_win, window = 0;
    kv_layers(m, &n_kv, &n_win);
    if (!n_kv) return 0;
    for (int l = 0; l < m->cfg.n_layers; l++)
        if (m->plan[l].mixer == PT_MIX_ATTN_SWA) window = PT_MAX(window, m->plan[l].window);
    double per_layer = (double)kv_bytes_per_token / n_kv;
    long pages = ((long)n_ctx + page_size - 1) / page_size;
    /* the window group recycles pages wholly below the window: one more
     * than the window spans stays, as the write position moves through a page */
    long wpages = n_win ? PT_MIN(pages, ((long)window + page_size - 1) / page_size + 1) : 0;
    return per_layer * page_size * ((double)pages * (n_kv - n_win) + (double)wpages * n_win);
}

double pt_model_token_flops(const pt_model *m) {
    const pt_model_config *c = &m->cfg;
    double q = (double)c->n_heads * c->head_dim, kv = (double)c->n_kv_heads * c->head_dim;
    double attn = c->dim * (q * (c->attn_output_gate ? 2 : 1) + 2 * kv) + q * c->dim;
    double kd = (double)c->lin_k_heads * c->lin_k_dim, vd = (double)c->lin_v_heads * c->lin_v_dim;
    double linear = c->dim * (2 * kd + 2 * vd + 2.0 * c->lin_v_heads) + vd * c->dim +
                    (2 * kd + vd) * c->lin_conv_kernel + 3.0 * c->lin_v_heads * c->lin_k_dim * c->lin_v_dim;
    if (c->kv_lora_rank > 0) { /* latent attention's projections, absorbed */
        double H = c->n_heads, r = c->kv_lora_rank, nope = c->head_dim - c->n_rot;
        attn = (c->q_lora_rank > 0 ? (double)c->dim * c->q_lora_rank + c->q_lora_rank * q
                                   : c->dim * q) +
               c->dim * (r + c->n_rot) + H * nope * r + H * r * c->v_head_dim +
               H * c->v_head_dim * c->dim;
    }
    double total = (double)c->vocab_size * c->dim;
    for (int l = 0; l < c->n_layers; l++) {
        const pt_layer_plan *p = &m->plan[l];
        double ffn = p->ffn == PT_FFN_MOE
                         ? (double)c->dim * p->n_experts + 3.0 * c->dim * c->expert_ffn_dim * p->top_k
                         : 3.0 * c->dim * p->ffn_dim;
        if (p->n_shared > 0) ffn += 3.0 * c->dim * c->shared_ffn_dim + c->dim;
        total += (p->mixer == PT_MIX_RECURRENT ? linear : attn) + ffn;
    }
    return 2.0 * total;
}
