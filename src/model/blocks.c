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
 * The hybrid recurrent families (Qwen3-Next, Qwen3.5) share their gated
 * attention, the Gated DeltaNet after its in-projections (which differ:
 * fused in one, not in the other), the shared-expert FFN and the layer.
 *
 * Kinds that need optional backend ops (backend.h: attention_ext, geglu,
 * the MoE ops; a backend says which it has in has_op) are listed in
 * missing_op, so a backend without them refuses the model at load, naming
 * the op, instead of failing mid-forward.
 */
#include <math.h>
#include <stdlib.h>

#include "model/model_int.h"

/* y = x·Wᵀ (+ bias) for n rows. */
static void project(pt_backend *be, float *y, const float *x, const pt_weight *w, const float *bias,
                    int n) {
    pt_be_matmul(be, y, x, w, n);
    if (bias) pt_be_add_bias(be, y, bias, n, (int)w->rows);
}

/* Tensor parallel: y (count floats) becomes the sum over the ranks of
 * their partial outputs of a row-parallel matmul (model/tp.c); nothing for
 * a model that is not a rank. */
static void reduce(pt_model *m, float *y, size_t count) {
    if (m->comm) pt_be_all_reduce(m->be, m->comm, m->rank, y, count);
}

/* x = embed(tokens), times the config's embedding scale (Gemma: sqrt(dim)). */
void pt_block_embed(pt_model *m, const pt_step *s) {
    pt_be_embed(m->be, m->ws->x, &m->tok_embd, m->ws->tokens, s->n);
    if (m->cfg.embed_scale > 0 && m->cfg.embed_scale != 1.0f)
        pt_be_scale(m->be, m->ws->x, m->cfg.embed_scale, (size_t)s->n * m->cfg.dim);
}

/* y = RMSNorm(x) * gain over rows of dim.  PT_NORM_RMS_1PW is the same op:
 * its family stored 1 + w as the gain at load (pt_family.finish). */
void pt_block_norm(pt_model *m, const pt_step *s, float *y, const float *x, const float *gain) {
    pt_be_rmsnorm(m->be, y, x, gain, s->n, m->cfg.dim, m->cfg.norm_eps);
}

/* q, k, v = h·Wq, Wk, Wv (+ biases); with qk_norm an RMSNorm per head;
 * then rope at each row's position with the layer's frequencies.  The
 * layer's shapes are its plan's (they may differ by layer kind). */
void pt_block_qkv(pt_model *m, int l, const pt_step *s) {
    pt_backend *be = m->be;
    const pt_model_config *c = &m->cfg;
    const pt_layer_plan *p = &m->plan[l];
    const pt_layer *L = &m->layers[l];
    pt_workspace *ws = m->ws;
    int n = s->n;

    project(be, ws->q, ws->h, &L->wq, L->bq, n);
    project(be, ws->k, ws->h, &L->wk, L->bk, n);
    project(be, ws->v, ws->h, &L->wv, L->bv, n);
    if (c->qk_norm) {
        pt_be_rmsnorm(be, ws->q, ws->q, L->q_norm, n * c->n_heads, p->head_dim, c->norm_eps);
        pt_be_rmsnorm(be, ws->k, ws->k, L->k_norm, n * p->n_kv_heads, p->head_dim, c->norm_eps);
    }
    pt_be_rope(be, ws->q, s->b, c->n_heads, p->head_dim, &p->rope);
    pt_be_rope(be, ws->k, s->b, p->n_kv_heads, p->head_dim, &p->rope);
}

/* Whether layer p's attention needs attention_ext (a window or a cap). */
static bool attn_ext(const pt_layer_plan *p) {
    return p->mixer == PT_MIX_ATTN_SWA || p->attn_softcap > 0 || p->attn_sinks;
}

/* Stores the rows' k and v in the layer's cache, then h = attention of q
 * over each row's sequence up to its position, ·Wo (+ bias).  A sliding-
 * window layer (PT_MIX_ATTN_SWA) sees only its last `window` positions.
 * A layer that shares an earlier layer's K/V (plan.kv_layer) stores
 * nothing and attends over that layer's cache, which already holds this
 * step's rows. */
void pt_block_attention(pt_model *m, int l, const pt_step *s) {
    pt_backend *be = m->be;
    const pt_model_config *c = &m->cfg;
    const pt_layer_plan *p = &m->plan[l];
    const pt_layer *L = &m->layers[l];
    pt_workspace *ws = m->ws;
    pt_kv_view kv = pt_kv_layer(s->kv, p->kv_layer);
    /* a layer of the cache's window group has its own pages (kvcache.h) */
    const pt_batch_view *b = pt_kv_layer_windowed(s->kv, p->kv_layer) ? s->bw : s->b;

    if (p->kv_layer == l) pt_be_kv_store(be, &kv, b, ws->k, ws->v);
    if (attn_ext(p)) {
        pt_attn_params ap = {.scale = p->attn_scale, .window = p->window,
                             .softcap = p->attn_softcap, .sinks = p->attn_sinks ? L->sinks : NULL};
        pt_be_attention_ext(be, ws->att, ws->q, &kv, b, c->n_heads, &ap);
    } else {
        pt_be_attention(be, ws->att, ws->q, &kv, b, c->n_heads, p->attn_scale);
    }
    pt_be_matmul(be, ws->h, ws->att, &L->wo, s->n);
    reduce(m, ws->h, (size_t)s->n * c->dim); /* a rank's heads give part of h */
    if (L->bo) pt_be_add_bias(be, ws->h, L->bo, s->n, c->dim);
}

/* y = act(gate) * up over count floats, the plan's activation. */
static void gated(pt_backend *be, int act, float *y, const float *up, size_t count) {
    if (act == PT_ACT_GELU_TANH)
        pt_be_geglu(be, y, y, up, count);
    else
        pt_be_swiglu(be, y, y, up, count);
}

/* Routed experts (PT_FFN_MOE): the router picks top_k experts per row and
 * weighs them; each row runs through its experts' gated FFNs and h is the
 * weighted sum.  Only the chosen experts' weights are read.  gpt-oss adds
 * biases (router and each expert's projections, by expert id) and its
 * clamped SwiGLU; its top-k-then-softmax router is moe_route with renorm
 * (a softmax over all experts renormalized over the k is the same).
 * DeepSeek routes with moe_route_grouped (sigmoid or softmax scores, a
 * selection bias, groups, scaled weights: config router_grouped).  Other
 * routing without expert parallel goes to moe_ffn, the same ops as one
 * (the CUDA backend fuses them into two kernels at decode). */
static void moe_ffn(pt_model *m, int l, const pt_step *s) {
    pt_backend *be = m->be;
    const pt_model_config *c = &m->cfg;
    const pt_layer_plan *p = &m->plan[l];
    const pt_layer *L = &m->layers[l];
    pt_workspace *ws = m->ws;
    int n = s->n, k = p->top_k, f = c->expert_ffn_dim;

    project(be, ws->router, ws->h, &L->w_router, L->b_router, n);
    if (!c->router_grouped && !m->expert_count && pt_be_has_op(be, PT_OP_MOE_FFN)) {
        /* the same ops as below, as one (CUDA: two kernels at decode) */
        pt_op_moe_ffn a = {
            .y = ws->h, .x = ws->h, .logits = ws->router, .w_gate = &L->w_gate,
            .w_up = &L->w_up, .w_down = &L->w_down, .gate_bias = L->b_gate_exps,
            .up_bias = L->b_up_exps, .down_bias = L->b_down_exps, .ids = ws->moe_ids,
            .weights = ws->moe_w, .gate = ws->gate, .up = ws->up, .out = ws->moe_out, .n = n,
            .n_experts = p->n_experts, .k = k, .alpha = c->act_alpha, .limit = c->act_limit,
            .renorm = c->expert_renorm,
            .act = p->act == PT_ACT_SWIGLU_OAI ? PT_MOE_SWIGLU_OAI
                   : p->act == PT_ACT_GELU_TANH ? PT_MOE_GEGLU : PT_MOE_SWIGLU};
        pt_be_moe_ffn(be, &a);
        reduce(m, ws->h, (size_t)n * c->dim);
        return;
    }
    if (c->router_grouped) {
        pt_op_moe_route_grouped r = {
            .ids = ws->moe_ids, .weights = ws->moe_w, .logits = ws->router,
            .bias = L->exp_probs_b, .n = n, .n_experts = p->n_experts, .k = k,
            .n_groups = c->n_expert_groups, .groups_used = c->n_group_used,
            .gating = c->expert_gating, .scale = c->expert_scale > 0 ? c->expert_scale : 1.0f,
            .renorm = c->expert_renorm};
        pt_be_moe_route_grouped(be, &r);
    } else {
        pt_be_moe_route(be, ws->moe_ids, ws->moe_w, ws->router, n, p->n_experts, k,
                        c->expert_renorm);
    }
    if (m->expert_count) /* expert parallel: this rank's experts only; the others' slots add 0 */
        pt_be_moe_local(be, ws->moe_ids, ws->moe_w, n, k, m->expert_first, m->expert_count);
    pt_be_matmul_id(be, ws->gate, ws->h, &L->w_gate, ws->moe_ids, n, k, 1);
    pt_be_matmul_id(be, ws->up, ws->h, &L->w_up, ws->moe_ids, n, k, 1);
    if (L->b_gate_exps) pt_be_add_id(be, ws->gate, L->b_gate_exps, ws->moe_ids, n, k, f);
    if (L->b_up_exps) pt_be_add_id(be, ws->up, L->b_up_exps, ws->moe_ids, n, k, f);
    if (p->act == PT_ACT_SWIGLU_OAI)
        pt_be_swiglu_oai(be, ws->gate, ws->gate, ws->up, (size_t)n * k * f, c->act_alpha,
                         c->act_limit);
    else
        gated(be, p->act, ws->gate, ws->up, (size_t)n * k * f);
    pt_be_matmul_id(be, ws->moe_out, ws->gate, &L->w_down, ws->moe_ids, n, k, k);
    if (L->b_down_exps) pt_be_add_id(be, ws->moe_out, L->b_down_exps, ws->moe_ids, n, k, c->dim);
    pt_be_moe_combine(be, ws->h, ws->moe_out, ws->moe_w, n, k, c->dim);
    reduce(m, ws->h, (size_t)n * c->dim); /* a rank's experts (or slice of each) give part of h */
}

/* h = (act(h·Wgate) * h·Wup)·Wdown: a dense gated FFN (SwiGLU, or GeGLU
 * with PT_ACT_GELU_TANH), or routed experts (PT_FFN_MOE). */
void pt_block_ffn(pt_model *m, int l, const pt_step *s) {
    pt_backend *be = m->be;
    const pt_layer *L = &m->layers[l];
    pt_workspace *ws = m->ws;
    int n = s->n;

    if (m->plan[l].ffn == PT_FFN_MOE) {
        moe_ffn(m, l, s);
        return;
    }
    pt_be_matmul(be, ws->gate, ws->h, &L->w_gate, n);
    pt_be_matmul(be, ws->up, ws->h, &L->w_up, n);
    gated(be, m->plan[l].act, ws->gate, ws->up, (size_t)n * m->plan[l].ffn_dim);
    pt_be_matmul(be, ws->h, ws->gate, &L->w_down, n);
    reduce(m, ws->h, (size_t)n * m->cfg.dim); /* a rank's FFN rows give part of h */
}

/* x += h. */
void pt_block_residual(pt_model *m, const pt_step *s) {
    pt_workspace *ws = m->ws;
    pt_be_add(m->be, ws->x, ws->x, ws->h, (size_t)s->n * m->cfg.dim);
}

/* x += residual_scale · h, layer l's plan's scale (MiniCPM: scale_depth /
 * sqrt(n_layers)); h is scaled in place first, as llama.cpp and
 * transformers round it. */
void pt_block_residual_scaled(pt_model *m, int l, const pt_step *s) {
    float scale = m->plan[l].residual_scale;
    if (scale != 1.0f) pt_be_scale(m->be, m->ws->h, scale, (size_t)s->n * m->cfg.dim);
    pt_block_residual(m, s);
}

/* Final norm and output projection for the wanted rows, PT_OUT_ROWS at a
 * time, straight into the caller's buffer; the normed rows scaled before
 * the head (MiniCPM's output_scale) and the logits soft-capped (Gemma 2)
 * if the config says.  With s->ids the backend picks each row's argmax of
 * those same logits and only the ids come back.  A tensor-parallel rank's output head is its slice of
 * the vocabulary (output.rows from vocab_first): it writes those columns
 * of each row, and the ranks together fill the rows. */
void pt_block_output(pt_model *m, const pt_step *s) {
    pt_backend *be = m->be;
    pt_workspace *ws = m->ws;
    const pt_model_config *c = &m->cfg;
    size_t w = (size_t)m->output.rows, vocab = (size_t)c->vocab_size;
    for (int i = 0; i < s->n_out; i += PT_OUT_ROWS) {
        int k = PT_MIN(PT_OUT_ROWS, s->n_out - i);
        pt_be_gather_rows(be, ws->out_h, ws->x, ws->out_idx + i, k, c->dim);
        pt_be_rmsnorm(be, ws->out_h, ws->out_h, m->output_norm, k, c->dim, c->norm_eps);
        if (c->output_scale > 0 && c->output_scale != 1.0f)
            pt_be_scale(be, ws->out_h, c->output_scale, (size_t)k * c->dim);
        pt_be_matmul(be, ws->logits, ws->out_h, &m->output, k);
        if (c->final_softcap > 0) pt_be_softcap(be, ws->logits, c->final_softcap, (size_t)k * w);
        if (s->ids) { /* the picks alone (pt_model_can_argmax: w is the vocabulary) */
            pt_be_argmax(be, ws->out_ids, ws->logits, k, (int)w);
            be->ops->download(be, s->ids + i, ws->out_ids, sizeof(int32_t) * (size_t)k);
            continue;
        }
        float *out = s->logits + (size_t)i * vocab;
        if (w == vocab) {
            be->ops->download(be, out, ws->logits, sizeof(float) * (size_t)k * vocab);
            continue;
        }
        for (int j = 0; j < k; j++)
            be->ops->download(be, out + (size_t)j * vocab + m->vocab_first, ws->logits + j * w,
                              sizeof(float) * w);
    }
}

/* ---- Which ops the blocks call ------------------------------------------------ */

/* The first op kind model m's blocks need that its backend lacks, with
 * the plan kind that needs it (layer -1: not a layer's); -1 when the
 * backend has them all. */
static int missing_op(const pt_model *m, int *layer, const char **why) {
    pt_backend *be = m->be;
    const pt_model_config *c = &m->cfg;
    *layer = -1;
    if (c->embed_scale > 0 && c->embed_scale != 1.0f && !pt_be_has_op(be, PT_OP_SCALE))
        return *why = "scaled embeddings", PT_OP_SCALE;
    if (m->comm && !pt_be_has_op(be, PT_OP_ALL_REDUCE))
        return *why = "tensor parallel", PT_OP_ALL_REDUCE;
    if (m->expert_count && !pt_be_has_op(be, PT_OP_MOE_LOCAL))
        return *why = "expert parallel", PT_OP_MOE_LOCAL;
    if (c->final_softcap > 0 && !pt_be_has_op(be, PT_OP_SOFTCAP))
        return *why = "soft-capped logits", PT_OP_SOFTCAP;
    if (c->output_scale > 0 && c->output_scale != 1.0f && !pt_be_has_op(be, PT_OP_SCALE))
        return *why = "a scaled output head", PT_OP_SCALE;
    static const int moe_ops[] = {PT_OP_MOE_ROUTE, PT_OP_MATMUL_ID, PT_OP_MOE_COMBINE};
    static const int mla_ops[] = {PT_OP_COPY_COLS, PT_OP_MATMUL_ID};
    static const int rec_ops[] = {PT_OP_GATHER_COLS, PT_OP_CONV1D_SILU, PT_OP_GATED_DELTA,
                                  PT_OP_RMSNORM_GATED};
    if (c->ple_dim > 0 && !pt_be_has_op(be, PT_OP_GATHER_COLS))
        return *why = "per-layer inputs", PT_OP_GATHER_COLS;
    if (c->attn_output_gate && !pt_be_has_op(be, PT_OP_SIGMOID_MUL))
        return *why = "gated attention output", PT_OP_SIGMOID_MUL;
    if (c->attn_output_gate && !pt_be_has_op(be, PT_OP_GATHER_COLS))
        return *why = "gated attention output", PT_OP_GATHER_COLS;
    for (int l = 0; l < c->n_layers; l++) {
        const pt_layer_plan *p = &m->plan[l];
        *layer = l;
        if (attn_ext(p) && !pt_be_has_op(be, PT_OP_ATTENTION_EXT))
            return *why = p->mixer == PT_MIX_ATTN_SWA ? "sliding-window attention"
                          : p->attn_sinks               ? "attention sinks"
                                                        : "soft-capped attention",
                   PT_OP_ATTENTION_EXT;
        if (p->residual_scale != 1.0f && !pt_be_has_op(be, PT_OP_SCALE))
            return *why = "scaled residuals", PT_OP_SCALE;
        if (p->act == PT_ACT_GELU_TANH && !pt_be_has_op(be, PT_OP_GEGLU))
            return *why = "a GELU-tanh FFN", PT_OP_GEGLU;
        for (size_t i = 0; p->ffn == PT_FFN_MOE && i < PT_ARRAY_LEN(moe_ops); i++)
            if (!pt_be_has_op(be, moe_ops[i])) return *why = "a mixture-of-experts FFN", moe_ops[i];
        if (p->ffn == PT_FFN_MOE && c->router_grouped && !pt_be_has_op(be, PT_OP_MOE_ROUTE_GROUPED))
            return *why = "DeepSeek expert routing", PT_OP_MOE_ROUTE_GROUPED;
        for (size_t i = 0; p->mixer == PT_MIX_MLA && i < PT_ARRAY_LEN(mla_ops); i++)
            if (!pt_be_has_op(be, mla_ops[i])) return *why = "multi-head latent attention", mla_ops[i];
        if (p->act == PT_ACT_SWIGLU_OAI && !pt_be_has_op(be, PT_OP_SWIGLU_OAI))
            return *why = "gpt-oss's clamped SwiGLU", PT_OP_SWIGLU_OAI;
        if (c->expert_bias && p->ffn == PT_FFN_MOE && !pt_be_has_op(be, PT_OP_ADD_ID))
            return *why = "biased experts", PT_OP_ADD_ID;
        for (size_t i = 0; p->mixer == PT_MIX_RECURRENT && i < PT_ARRAY_LEN(rec_ops); i++)
            if (!pt_be_has_op(be, rec_ops[i])) return *why = "a Gated DeltaNet layer", rec_ops[i];
        if (p->n_shared > 0 && !pt_be_has_op(be, PT_OP_SIGMOID_MUL))
            return *why = "a gated shared expert", PT_OP_SIGMOID_MUL;
    }
    return -1;
}

int pt_model_check_ops(const pt_model *m, pt_err *err) {
    int layer;
    const char *why;
    int kind = missing_op(m, &layer, &why);
    if (kind < 0) return 0;
    const char *op = pt_op_name(kind);
    if (layer < 0)
        return pt_fail(err, "the %s backend lacks op '%s' (%s) that %s models need; run it on "
                            "the cpu backend",
                       m->be->name, op, why, m->cfg.arch);
    return pt_fail(err, "the %s backend lacks op '%s' (%s, layer %d) that %s models need; run it "
                        "on the cpu backend",
                   m->be->name, op, why, layer, m->cfg.arch);
}

/* ---- Whole layers and the stack ------------------------------------------ */

void pt_block_prenorm_layer(pt_model *m, int l, const pt_step *s) {
    const pt_layer *L = &m->layers[l];
    pt_workspace *ws = m->ws;

    pt_block_norm(m, s, ws->h, ws->x, L->attn_norm);
    pt_block_qkv(m, l, s);
    pt_block_attention(m, l, s);
    pt_block_residual(m, s);

    pt_block_norm(m, s, ws->h, ws->x, L->ffn_norm);
    pt_block_ffn(m, l, s);
    pt_block_residual(m, s);
}

void pt_block_stack(pt_model *m, const pt_step *s, pt_layer_fn layer) {
    pt_block_embed(m, s);
    for (int l = 0; l < m->cfg.n_layers; l++)
        layer(m, l, s);
    pt_block_output(m, s);
}

/* ---- Hybrid recurrent layers (Qwen3-Next, Qwen3.5) ------------------------- */

/* Prefill rows of a sequence go through the delta rule this many at a time
 * in the chunkwise form (transformers' chunk size); decode rows one by one. */
#define GDN_CHUNK 64

void pt_block_gated_attention(pt_model *m, int l, const pt_step *s) {
    pt_backend *be = m->be;
    const pt_model_config *c = &m->cfg;
    const pt_layer *L = &m->layers[l];
    const pt_layer_plan *p = &m->plan[l];
    pt_workspace *ws = m->ws;
    int n = s->n, q = c->n_heads * c->head_dim;

    pt_be_matmul(be, ws->fused, ws->h, &L->wq, n);
    pt_be_gather_cols(be, ws->q, ws->fused, ws->idx_q, n, 2 * q, q);
    pt_be_gather_cols(be, ws->agate, ws->fused, ws->idx_gate, n, 2 * q, q);
    pt_be_matmul(be, ws->k, ws->h, &L->wk, n);
    pt_be_matmul(be, ws->v, ws->h, &L->wv, n);
    pt_be_rmsnorm(be, ws->q, ws->q, L->q_norm, n * c->n_heads, c->head_dim, c->norm_eps);
    pt_be_rmsnorm(be, ws->k, ws->k, L->k_norm, n * c->n_kv_heads, c->head_dim, c->norm_eps);
    pt_be_rope(be, ws->q, s->b, c->n_heads, c->head_dim, &p->rope);
    pt_be_rope(be, ws->k, s->b, c->n_kv_heads, c->head_dim, &p->rope);

    pt_kv_view kv = pt_kv_layer(s->kv, l);
    pt_be_kv_store(be, &kv, s->b, ws->k, ws->v);
    pt_be_attention(be, ws->att, ws->q, &kv, s->b, c->n_heads, p->attn_scale);
    pt_be_sigmoid_mul(be, ws->att, ws->att, ws->agate, n, q, q);
    pt_be_matmul(be, ws->h, ws->att, &L->wo, n);
}

void pt_block_deltanet(pt_model *m, int l, const pt_step *s) {
    pt_backend *be = m->be;
    const pt_model_config *c = &m->cfg;
    const pt_layer *L = &m->layers[l];
    pt_workspace *ws = m->ws;
    int n = s->n, nv = c->lin_v_heads, kd = c->lin_k_heads * c->lin_k_dim;
    int conv = 2 * kd + nv * c->lin_v_dim;

    pt_be_conv1d_silu(be, ws->conv, ws->mix, L->conv_w, s->kv->conv[l], s->b, conv,
                      c->lin_conv_kernel);
    pt_op_gated_delta d = {.out = ws->lin, .qkv = ws->conv, .ba = ws->ba, .A = L->ssm_a,
                           .dt_bias = L->dt_bias, .state = s->kv->rec[l], .b = *s->b,
                           .n_k_heads = c->lin_k_heads, .n_v_heads = nv, .dk = c->lin_k_dim,
                           .dv = c->lin_v_dim, .stride = conv, .chunk = GDN_CHUNK,
                           .tiled = c->lin_tiled, .l2_eps = c->lin_l2_eps};
    pt_be_gated_delta(be, &d);
    pt_be_rmsnorm_gated(be, ws->lin, ws->lin, ws->z, L->lin_norm, n * nv, c->lin_v_dim,
                        c->norm_eps);
    pt_be_matmul(be, ws->h, ws->lin, &L->w_lin_out, n);
}

/* h -> h: routed experts plus sigmoid(h·wsg) times the shared expert. */
static void moe_with_shared(pt_model *m, int l, const pt_step *s) {
    pt_backend *be = m->be;
    const pt_model_config *c = &m->cfg;
    const pt_layer *L = &m->layers[l];
    pt_workspace *ws = m->ws;
    int n = s->n;

    pt_be_matmul(be, ws->sh_gate, ws->h, &L->w_sh_gate, n);
    pt_be_matmul(be, ws->sh_up, ws->h, &L->w_sh_up, n);
    pt_be_swiglu(be, ws->sh_gate, ws->sh_gate, ws->sh_up, (size_t)n * c->shared_ffn_dim);
    pt_be_matmul(be, ws->shared, ws->sh_gate, &L->w_sh_down, n);
    pt_be_matmul(be, ws->shared_g, ws->h, &L->w_sh_router, n);
    pt_be_sigmoid_mul(be, ws->shared, ws->shared, ws->shared_g, n, c->dim, 1);
    pt_block_ffn(m, l, s); /* the plan says PT_FFN_MOE: routed experts into h */
    pt_be_add(be, ws->h, ws->h, ws->shared, (size_t)n * c->dim);
}

void pt_block_hybrid_layer(pt_model *m, int l, const pt_step *s, pt_layer_fn lin_in) {
    const pt_layer *L = &m->layers[l];
    pt_workspace *ws = m->ws;

    pt_block_norm(m, s, ws->h, ws->x, L->attn_norm);
    if (m->plan[l].mixer == PT_MIX_RECURRENT) {
        lin_in(m, l, s);
        pt_block_deltanet(m, l, s);
    } else {
        pt_block_gated_attention(m, l, s);
    }
    pt_block_residual(m, s);
    pt_block_norm(m, s, ws->h, ws->x, L->ffn_norm);
    if (m->plan[l].n_shared > 0)
        moe_with_shared(m, l, s);
    else
        pt_block_ffn(m, l, s);
    pt_block_residual(m, s);
}

/* gain = 1 + gain for one norm vector of n in backend memory (NULL: absent). */
static void one_plus(pt_model *m, const float *gain, int n, float *host) {
    if (!gain) return;
    m->be->ops->download(m->be, host, gain, sizeof(float) * (size_t)n);
    for (int i = 0; i < n; i++) host[i] += 1.0f;
    m->be->ops->upload(m->be, (float *)gain, host, sizeof(float) * (size_t)n);
}

int pt_norms_one_plus(pt_model *m, pt_err *err) {
    const pt_model_config *c = &m->cfg;
    float *host = pt_xmalloc(sizeof(float) * (size_t)PT_MAX(c->dim, c->head_dim));
    one_plus(m, m->output_norm, c->dim, host);
    for (int l = 0; l < c->n_layers; l++) {
        pt_layer *L = &m->layers[l];
        const float *dims[] = {L->attn_norm, L->post_attn_norm, L->ffn_norm, L->post_ffn_norm};
        for (size_t i = 0; i < PT_ARRAY_LEN(dims); i++) one_plus(m, dims[i], c->dim, host);
        one_plus(m, L->q_norm, c->head_dim, host);
        one_plus(m, L->k_norm, c->head_dim, host);
    }
    free(host);
    if (m->be->ops->sync(m->be)) return pt_be_take_error(m->be, err);
    return 0;
}

int pt_ssm_a_from_log(pt_model *m, pt_err *err) {
    const pt_model_config *c = &m->cfg;
    int nv = c->lin_v_heads;
    float *host = pt_xmalloc(sizeof(float) * (size_t)PT_MAX(nv, 1));
    for (int l = 0; l < c->n_layers; l++) {
        const float *a = m->layers[l].ssm_a;
        if (!a) continue;
        m->be->ops->download(m->be, host, a, sizeof(float) * (size_t)nv);
        for (int h = 0; h < nv; h++) host[h] = -expf(host[h]);
        m->be->ops->upload(m->be, (float *)a, host, sizeof(float) * (size_t)nv);
    }
    free(host);
    if (m->be->ops->sync(m->be)) return pt_be_take_error(m->be, err);
    return 0;
}
