/*
 * plan.c - what each layer is made of, computed once from the config.
 *
 * A family's forward reads m->plan[l] instead of config flags, so layers of
 * one model may differ (a sliding window on some, experts on others, a rope
 * base per layer).  The plan can describe more than the blocks run today:
 * pt_layer_plan_check refuses, at load and with the layer's number, every
 * kind no block implements yet, so a model either runs exactly or does not
 * load.  A block that adds a kind removes its refusal here.
 *
 * Runs now: full and sliding-window attention (window applied by the
 * attention op; in a model with both, the window layers are cache group 1,
 * whose pages are given back as the window slides: kvcache.h; head dims,
 * KV heads and rope dims may differ between the two kinds, and a layer may
 * attend over an earlier layer's K/V instead of its own, plan.kv_layer), Gated
 * DeltaNet recurrent mixers (cache group 2, the recurrent state) and one
 * gated shared expert in hybrid families, multi-head latent attention with
 * an ungated shared expert and leading dense layers (DeepSeek), dense
 * SiLU / GELU-tanh FFNs, routed experts (SiLU or GELU-tanh) in families
 * that route them, plain and (1 + w) RMSNorm, residuals scaled by a
 * positive factor (MiniCPM).
 * Refused: more than one shared expert, other groups.
 */
#include <math.h>
#include <stdio.h>

#include "model/model_int.h"

/* The layer whose K/V shared layer l reads: the last layer before the
 * sharing ones of the same kind (sliding or full), as Gemma 3n / 4 do; -1
 * if there is none. */
static int shared_kv_source(const pt_model_config *c, int l) {
    for (int e = PT_MIN(c->n_kv_layers, l) - 1; e >= 0; e--)
        if (pt_config_layer_swa(c, e) == pt_config_layer_swa(c, l)) return e;
    return -1;
}

int pt_model_plan(const pt_model_config *c, pt_layer_plan *plan, pt_err *err) {
    int n_swa = 0;
    for (int l = 0; l < c->n_layers; l++) n_swa += pt_config_layer_swa(c, l);
    bool groups = n_swa > 0 && n_swa < c->n_layers; /* window layers get their own */
    for (int l = 0; l < c->n_layers; l++) {
        bool swa = pt_config_layer_swa(c, l), rec = pt_config_layer_recurrent(c, l);
        bool moe = c->n_experts > 0 && l >= c->n_dense_lead;
        plan[l] = (pt_layer_plan){
            .mixer = rec                    ? PT_MIX_RECURRENT
                     : c->kv_lora_rank > 0 ? PT_MIX_MLA
                     : swa                  ? PT_MIX_ATTN_SWA
                                            : PT_MIX_ATTN,
            .window = swa ? c->sliding_window : 0,
            .rope_theta = swa && c->rope_theta_swa > 0 ? c->rope_theta_swa : c->rope_theta,
            .rope_scaled = !(swa && c->rope_scaling_global_only),
            .rope = {.style = c->rope_style, .n_rot = pt_config_layer_n_rot(c, l),
                     .mscale = (c->rope_scaling == PT_ROPE_SCALING_YARN ||
                                c->rope_scaling == PT_ROPE_SCALING_LONGROPE) &&
                                       !(swa && c->rope_scaling_global_only)
                                   ? c->rope_mscale
                                   : 1.0f},
            .attn_scale = c->attn_scale > 0 ? c->attn_scale
                                            : 1.0f / sqrtf((float)pt_config_layer_head_dim(c, l)),
            .attn_softcap = c->attn_softcap,
            .attn_sinks = c->attn_sinks,
            .ffn = moe ? PT_FFN_MOE : PT_FFN_DENSE,
            .act = c->act,
            .n_experts = moe ? c->n_experts : 0,
            .top_k = moe ? c->n_experts_used : 0,
            .n_shared = moe ? c->n_shared_experts : 0,
            .norm = c->norm,
            .residual_scale = c->residual_scale > 0 ? c->residual_scale : 1.0f,
            /* group 0 the paged KV, 1 the window layers' (kvcache.h), 2 the
             * recurrent state */
            .cache_group = rec ? 2 : swa && groups, /* all-window models keep one group */
            .head_dim = pt_config_layer_head_dim(c, l),
            .n_kv_heads = pt_config_layer_kv_heads(c, l),
            .kv_layer = l,
            .rope_factors = (c->rope_freq_factors || c->rope_rot_pairs > 0) && !swa,
            .ffn_dim = pt_config_layer_ffn(c, l),
        };
        if (!pt_config_layer_own_kv(c, l) && (plan[l].kv_layer = shared_kv_source(c, l)) < 0)
            return pt_fail(err, "layer %d shares K/V but no earlier layer of its kind keeps them",
                           l);
    }
    /* Experts need a family whose forward routes them (and whose weight
     * table names them): a Mixtral config under "mistral" is refused. */
    const pt_family *f = pt_family_of(c->arch);
    for (int l = 0; l < c->n_layers; l++)
        if (plan[l].ffn == PT_FFN_MOE && f && !f->moe)
            return pt_fail(err, "layer %d: a mixture-of-experts FFN (%d experts, top %d) is not "
                                "implemented yet for %s models",
                           l, plan[l].n_experts, plan[l].top_k, c->arch);
    /* Recurrent mixers, latent attention and shared experts likewise need
     * a family that runs them (and names their weights). */
    for (int l = 0; l < c->n_layers; l++)
        if (f && ((plan[l].mixer == PT_MIX_RECURRENT && !f->hybrid) ||
                  (plan[l].mixer == PT_MIX_MLA && !f->mla) ||
                  (plan[l].n_shared > 0 && !f->hybrid && !f->mla)))
            return pt_fail(err, "layer %d: %s is not implemented yet for %s models", l,
                           plan[l].mixer == PT_MIX_RECURRENT ? "a recurrent (linear-attention) mixer"
                           : plan[l].mixer == PT_MIX_MLA     ? "multi-head latent attention"
                                                             : "a shared expert",
                           c->arch);
    return pt_layer_plan_check(plan, c->n_layers, err);
}

/* Why layer p cannot run yet into why; false if it can. */
static bool not_implemented(const pt_layer_plan *p, char *why, size_t cap) {
    if (p->mixer == PT_MIX_ATTN_SWA && p->window <= 0)
        snprintf(why, cap, "sliding-window attention without a window (%d)", p->window);
    else if (p->mixer == PT_MIX_RECURRENT && p->cache_group != 2)
        snprintf(why, cap, "a recurrent (linear-attention) mixer in cache group %d (its state "
                           "is group 2)", p->cache_group);
    else if (p->mixer != PT_MIX_ATTN && p->mixer != PT_MIX_ATTN_SWA && p->mixer != PT_MIX_RECURRENT &&
             p->mixer != PT_MIX_MLA)
        snprintf(why, cap, "mixer kind %d", p->mixer);
    else if (p->ffn == PT_FFN_MOE && (p->n_shared > 1 || p->top_k <= 0))
        snprintf(why, cap, "a mixture-of-experts FFN with %d shared experts, top %d", p->n_shared,
                 p->top_k);
    else if (p->ffn != PT_FFN_DENSE && p->ffn != PT_FFN_MOE)
        snprintf(why, cap, "FFN kind %d", p->ffn);
    else if (p->act != PT_ACT_SILU && p->act != PT_ACT_GELU_TANH && p->act != PT_ACT_SWIGLU_OAI)
        snprintf(why, cap, "activation kind %d", p->act);
    else if (p->ffn != PT_FFN_MOE && p->act == PT_ACT_SWIGLU_OAI)
        snprintf(why, cap, "a dense FFN with gpt-oss's clamped SwiGLU");
    else if (p->norm != PT_NORM_RMS && p->norm != PT_NORM_RMS_1PW)
        snprintf(why, cap, "norm kind %d", p->norm);
    else if (!(p->residual_scale > 0))
        snprintf(why, cap, "a residual scaled by %g", (double)p->residual_scale);
    else if (p->mixer != PT_MIX_RECURRENT && p->cache_group != 0 &&
             !(p->cache_group == 1 && p->mixer == PT_MIX_ATTN_SWA))
        snprintf(why, cap, "cache group %d (only sliding-window layers have group 1)",
                 p->cache_group);
    else if (p->n_shared > 0 && p->ffn != PT_FFN_MOE)
        snprintf(why, cap, "%d shared experts without routed ones", p->n_shared);
    else
        return false;
    return true;
}

int pt_layer_plan_check(const pt_layer_plan *plan, int n_layers, pt_err *err) {
    char why[96];
    for (int l = 0; l < n_layers; l++)
        if (not_implemented(&plan[l], why, sizeof why))
            return pt_fail(err, "layer %d: %s is not implemented yet", l, why);
    return 0;
}
