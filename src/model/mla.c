/*
 * mla.c - multi-head latent attention (MLA), the blocks DeepSeek-V2/V3
 * (deepseek.c) and MiniCPM3 (minicpm3.c) share: the absorbed attention,
 * its workspace, and the split of a fused kv_b matrix into the per-head
 * stacks it runs.
 *
 *     q       = rmsnorm(h·Wq_aᵀ)·Wq_bᵀ  (or h·Wqᵀ)   per head [no-rope | rope]
 *     c, kr   = h·Wkv_aᵀ = [latent (kv_lora) | rope key (n_rot)]
 *     c       = rmsnorm(c);  q_rope, kr = rope(q_rope), rope(kr)
 *     per head i:  k_i = [c·W_kb,iᵀ | kr],  v_i = c·W_vb,iᵀ
 *     h       = concat_i(attention(q_i, k_i, v_i))·Woᵀ
 *
 * Absorbed.  The key of head i is the latent through W_kb,i, so q_i·k_i =
 * (W_kb,iᵀ q_nope,i)·c + q_rope,i·kr: moving W_kb,i onto the query makes
 * every head attend over the same cached row [c | kr], and likewise the
 * value's W_vb,i applies after the weighted sum of latents.  The cache
 * stores kv_lora + n_rot floats per token and layer, once for all heads
 * (V is a view of K: kvcache.h v_is_k), and attention runs as multi-query
 * attention with head dim kv_lora + n_rot whose output's first kv_lora
 * columns are each head's latent.  One path serves prefill and decode; the
 * per-head stacks W_kb [n_heads][kv_lora][no-rope] and W_vb
 * [n_heads][v_head_dim][kv_lora] run as matmul_id with ids 0..n_heads-1
 * (one "expert" per head), and copy_cols splits and joins the parts.
 */
#include <stdio.h>
#include <stdlib.h>

#include "model/model_int.h"
#include "quant/quant.h"

/* ---- Weights ------------------------------------------------------------- */

/* An f32 stack [H][rows][cols] from host floats, on the model's list. */
static int upload_stack(pt_model *m, const float *host, int H, int64_t rows, int64_t cols,
                        pt_weight *w, pt_err *err) {
    size_t per = (size_t)(rows * cols) * sizeof(float), bytes = per * (size_t)H;
    void *dev = pt_model_alloc(m, bytes);
    if (!dev) return pt_fail(err, "out of backend memory for the latent attention's stacks");
    m->be->ops->upload(m->be, dev, host, bytes);
    *w = (pt_weight){.dtype = PT_F32, .rows = rows, .cols = cols, .data = dev, .nbytes = bytes,
                     .n_experts = H, .expert_stride = per};
    m->weight_bytes += bytes;
    return 0;
}

/* Older deepseek2 GGUFs and every minicpm3 one store attn_kv_b [H * (nope
 * + v_head)][kv_lora] (Hugging Face checkpoints the same as kv_b_proj): per head,
 * nope rows that give the key's no-rope part, then v_head rows that give
 * the value.  Split into the absorbed form's stacks, as f32 (any weight
 * type in, MLX affine too, dequantized once): k_b [H][kv_lora][nope]
 * (transposed: it multiplies the query) and v_b [H][v_head][kv_lora]. */
static int split_kv_b(pt_model *m, int l, pt_err *err) {
    const pt_model_config *c = &m->cfg;
    int H = c->n_heads, r = c->kv_lora_rank, dn = c->head_dim - c->n_rot, dv = c->v_head_dim;
    char name[96];
    if (m->file->kind == PT_FILE_GGUF)
        snprintf(name, sizeof name, "blk.%d.attn_kv_b.weight", l);
    else
        snprintf(name, sizeof name, "model.layers.%d.self_attn.kv_b_proj.weight", l);
    const pt_tensor_info *t = pt_model_file_tensor(m->file, name);
    int64_t rows = (int64_t)H * (dn + dv);
    pt_weight src;
    char sname[96];
    snprintf(sname, sizeof sname, "%.*s.scales", (int)(strlen(name) - strlen(".weight")), name);
    const pt_tensor_info *sc =
        m->file->kind == PT_FILE_GGUF ? NULL : pt_model_file_tensor(m->file, sname);
    if (t && sc) { /* MLX affine */
        if (pt_model_file_affine(m, t, sc, rows, r, &src, err)) return -1;
    } else {
        if (!t || t->ndim != 2 || t->shape[0] != rows || t->shape[1] != r)
            return pt_fail(err, "%s: expected tensor %s %lldx%d", m->file->path, name,
                           (long long)rows, r);
        static const pt_dtype ok[] = {PT_F32,  PT_F16,  PT_BF16, PT_Q8_0,
                                      PT_Q4_0, PT_Q4_K, PT_Q5_K, PT_Q6_K};
        bool known = false;
        for (size_t i = 0; i < PT_ARRAY_LEN(ok); i++) known |= t->dtype == ok[i];
        if (!known || r % pt_dtype_get(t->dtype)->block)
            return pt_fail(err, "tensor %s: type %s is not supported", name,
                           pt_dtype_name(t->dtype));
        src = (pt_weight){.dtype = t->dtype, .rows = rows, .cols = r, .data = t->data,
                          .nbytes = t->nbytes};
    }
    float *row = pt_xmalloc(sizeof(float) * (size_t)r);
    float *kb = pt_xmalloc(sizeof(float) * (size_t)H * r * dn);
    float *vb = pt_xmalloc(sizeof(float) * (size_t)H * dv * r);
    for (int h = 0; h < H; h++) {
        for (int i = 0; i < dn; i++) {
            pt_weight_dequantize_row(&src, (int64_t)h * (dn + dv) + i, row);
            for (int j = 0; j < r; j++) kb[((size_t)h * r + j) * dn + i] = row[j];
        }
        for (int i = 0; i < dv; i++)
            pt_weight_dequantize_row(&src, (int64_t)h * (dn + dv) + dn + i,
                                     vb + ((size_t)h * dv + i) * r);
    }
    pt_layer *L = &m->layers[l];
    int rc = upload_stack(m, kb, H, r, dn, &L->wk_b, err) ||
             upload_stack(m, vb, H, dv, r, &L->wv_b, err);
    free(row), free(kb), free(vb);
    return rc ? -1 : 0;
}

int pt_mla_split_kv_b(pt_model *m, pt_err *err) {
    for (int l = 0; m->cfg.kv_b_fused && l < m->cfg.n_layers; l++)
        if (split_kv_b(m, l, err)) return -1;
    if (m->be->ops->sync(m->be)) return pt_be_take_error(m->be, err);
    return 0;
}

/* ---- Workspace ------------------------------------------------------------- */

int pt_workspace_mla(pt_model *m, int cap, pt_err *err) {
    const pt_model_config *c = &m->cfg;
    pt_workspace *ws = m->ws;
    size_t n = (size_t)cap, H = (size_t)c->n_heads, r = (size_t)c->kv_lora_rank;
    size_t row = r + (size_t)c->n_rot, nope = (size_t)(c->head_dim - c->n_rot);
    struct {
        float **p;
        size_t floats;
    } bufs[] = {
        {&ws->mla_q, n * H * row},
        {&ws->mla_att, n * H * row},
        {&ws->mla_kv, n * row},
        {&ws->mla_lat, n * H * r},
        {&ws->mla_qa, n * (size_t)c->q_lora_rank},
        {&ws->mla_nope, n * H * nope},
        {&ws->mla_pe, n * H * (size_t)c->n_rot},
        {&ws->mla_ov, n * H * (size_t)c->v_head_dim},
    };
    for (size_t i = 0; i < PT_ARRAY_LEN(bufs); i++)
        if (!(*bufs[i].p = pt_model_alloc(m, sizeof(float) * PT_MAX(bufs[i].floats, 1))))
            return pt_fail(err, "cannot allocate %.1f MiB of activations",
                           (double)bufs[i].floats * 4 / 1048576.0);
    /* every row selects every head's matrix of the per-head stacks */
    int32_t *ids = pt_xmalloc(sizeof(int32_t) * n * H);
    for (size_t i = 0; i < n * H; i++) ids[i] = (int32_t)(i % H);
    ws->head_ids = pt_model_alloc(m, sizeof(int32_t) * n * H);
    if (ws->head_ids) m->be->ops->upload(m->be, ws->head_ids, ids, sizeof(int32_t) * n * H);
    free(ids);
    return ws->head_ids ? 0 : pt_fail(err, "out of backend memory for the head ids");
}

/* ---- Forward ------------------------------------------------------------- */

/* Absorbed queries into ws->mla_q [n][n_heads][kv_lora | rope]. */
static void mla_queries(pt_model *m, int l, const pt_step *s) {
    pt_backend *be = m->be;
    const pt_model_config *c = &m->cfg;
    const pt_layer *L = &m->layers[l];
    pt_workspace *ws = m->ws;
    int n = s->n, H = c->n_heads, r = c->kv_lora_rank, dr = c->n_rot, hd = c->head_dim;
    int dn = hd - dr, row = r + dr;

    if (c->q_lora_rank > 0) {
        pt_be_matmul(be, ws->mla_qa, ws->h, &L->wq_a, n);
        pt_be_rmsnorm(be, ws->mla_qa, ws->mla_qa, L->q_a_norm, n, c->q_lora_rank, c->norm_eps);
        pt_be_matmul(be, ws->q, ws->mla_qa, &L->wq_b, n);
    } else {
        pt_be_matmul(be, ws->q, ws->h, &L->wq, n);
    }
    pt_be_copy_cols(be, ws->mla_nope, dn, 0, ws->q, hd, 0, dn, n * H);
    pt_be_copy_cols(be, ws->mla_pe, dr, 0, ws->q, hd, dn, dr, n * H);
    pt_be_rope(be, ws->mla_pe, s->b, H, dr, &m->plan[l].rope);
    /* q_nope,i · W_kb,i: the query in latent space, per head */
    pt_be_matmul_id(be, ws->mla_lat, ws->mla_nope, &L->wk_b, ws->head_ids, n, H, H);
    pt_be_copy_cols(be, ws->mla_q, row, 0, ws->mla_lat, r, 0, r, n * H);
    pt_be_copy_cols(be, ws->mla_q, row, r, ws->mla_pe, dr, 0, dr, n * H);
}

/* The cached rows ws->mla_kv [n][rmsnorm(latent) | rope(key)]. */
static void mla_cache_rows(pt_model *m, int l, const pt_step *s) {
    pt_backend *be = m->be;
    const pt_model_config *c = &m->cfg;
    const pt_layer *L = &m->layers[l];
    pt_workspace *ws = m->ws;
    int n = s->n, r = c->kv_lora_rank, dr = c->n_rot, row = r + dr;

    pt_be_matmul(be, ws->mla_kv, ws->h, &L->wkv_a, n);
    pt_be_copy_cols(be, ws->mla_lat, r, 0, ws->mla_kv, row, 0, r, n);
    pt_be_rmsnorm(be, ws->mla_lat, ws->mla_lat, L->kv_a_norm, n, r, c->norm_eps);
    pt_be_copy_cols(be, ws->mla_kv, row, 0, ws->mla_lat, r, 0, r, n);
    pt_be_copy_cols(be, ws->mla_pe, dr, 0, ws->mla_kv, row, r, dr, n);
    pt_be_rope(be, ws->mla_pe, s->b, 1, dr, &m->plan[l].rope);
    pt_be_copy_cols(be, ws->mla_kv, row, r, ws->mla_pe, dr, 0, dr, n);
}

/* h -> h: latent attention; caches one row per token, then multi-query
 * attention over the rows and each head's latent through W_vb and Wo. */
void pt_block_mla_attention(pt_model *m, int l, const pt_step *s) {
    pt_backend *be = m->be;
    const pt_model_config *c = &m->cfg;
    const pt_layer *L = &m->layers[l];
    pt_workspace *ws = m->ws;
    int n = s->n, H = c->n_heads, r = c->kv_lora_rank, row = r + c->n_rot;

    mla_queries(m, l, s);
    mla_cache_rows(m, l, s);
    pt_kv_view kv = pt_kv_layer(s->kv, l);
    pt_be_kv_store(be, &kv, s->b, ws->mla_kv, ws->mla_kv);
    pt_be_attention(be, ws->mla_att, ws->mla_q, &kv, s->b, H, m->plan[l].attn_scale);
    pt_be_copy_cols(be, ws->mla_lat, r, 0, ws->mla_att, row, 0, r, n * H);
    pt_be_matmul_id(be, ws->mla_ov, ws->mla_lat, &L->wv_b, ws->head_ids, n, H, H);
    pt_be_matmul(be, ws->h, ws->mla_ov, &L->wo, n);
}
