/*
 * test_layer_plan.c - the per-layer plan a config gives, and the kinds the
 * loader refuses.
 *
 * A Llama-family config plans every layer as full attention with a dense
 * SiLU FFN, plain RMSNorm, unit residual scale, cache group 0 and the
 * config's rope (style, rotated dims, base); Mistral's window, Qwen3-MoE's
 * experts and Gemma's per-layer kinds (window or global, rope base, caps,
 * scale, norm) come out as their configs say.  A config that asks for
 * something no block runs (experts in a family that routes none, dense
 * layers in Qwen3-MoE) loads no further than the plan or the config, with
 * an error naming the layer and the kind; so do hand-built plans with the
 * other declared kinds.  The supported list in
 * errors comes from the registry table.  A weight spec may be a 3-D stack
 * of experts; dummy weights lay one out with the right stride.  GGUF Gemma
 * and gpt-oss metadata read as llama.cpp reads it (defaults, window
 * pattern, the 27B attention scale, YaRN).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "io/model_file.h"
#include "model/model_int.h"

#define BASE                                                                                       \
    "\"hidden_size\":64,\"num_hidden_layers\":3,\"num_attention_heads\":4,"                        \
    "\"num_key_value_heads\":2,\"intermediate_size\":128,\"vocab_size\":100,"                      \
    "\"max_position_embeddings\":8192,\"rope_theta\":500000.0"

/* cfg from config.json text; fails the test if it does not parse. */
static void config_of(const char *text, pt_model_config *c) {
    json_error_t je;
    json_t *j = json_loads(text, 0, &je);
    if (!j) fail_msg("bad test JSON: %s", je.text);
    pt_err err = {{0}};
    if (pt_config_from_json(j, c, &err)) fail_msg("%s", err.msg);
    json_decref(j);
}

/* The plan of text must be refused with an error containing each of the
 * strings in want (NULL-terminated). */
static void assert_refused(const char *text, const char *const *want) {
    pt_model_config c;
    config_of(text, &c);
    pt_layer_plan plan[8];
    pt_err err = {{0}};
    assert_int_equal(pt_model_plan(&c, plan, &err), -1);
    for (; *want; want++)
        if (!strstr(err.msg, *want)) fail_msg("error '%s' does not say '%s'", err.msg, *want);
}

static void test_llama_plan(void **state) {
    (void)state;
    const char *cases[] = {
        "{\"model_type\":\"llama\"," BASE "}",
        "{\"model_type\":\"qwen3\"," BASE ",\"head_dim\":32}",
        /* Qwen2 carries a window and switches it off. */
        "{\"model_type\":\"qwen2\"," BASE ",\"sliding_window\":4096,\"use_sliding_window\":false}",
    };
    for (size_t i = 0; i < PT_ARRAY_LEN(cases); i++) {
        pt_model_config c;
        config_of(cases[i], &c);
        pt_layer_plan plan[3];
        pt_err err = {{0}};
        assert_int_equal(pt_model_plan(&c, plan, &err), 0);
        for (int l = 0; l < 3; l++) {
            const pt_layer_plan *p = &plan[l];
            assert_int_equal(p->mixer, PT_MIX_ATTN);
            assert_int_equal(p->ffn, PT_FFN_DENSE);
            assert_int_equal(p->act, PT_ACT_SILU);
            assert_int_equal(p->norm, PT_NORM_RMS);
            assert_int_equal(p->cache_group, 0);
            assert_true(p->residual_scale == 1.0f);
            assert_true(p->rope_theta == 500000.0f);
            assert_int_equal(p->rope.style, PT_ROPE_NEOX); /* Hugging Face rotate_half */
            assert_int_equal(p->rope.n_rot, c.head_dim);
            assert_true(p->rope.mscale == 1.0f);
            assert_null(p->rope.inv_freq); /* the loader's job */
        }
    }
}

static void test_unsupported_kinds_refused(void **state) {
    (void)state;
    /* Mixtral-style experts under a Llama-family model_type: that family's
     * forward routes no experts. */
    assert_refused("{\"model_type\":\"mistral\"," BASE ",\"num_local_experts\":8,"
                   "\"num_experts_per_tok\":2}",
                   (const char *[]){"layer 0", "mixture-of-experts", "8 experts", "top 2",
                                    "not implemented yet", "mistral", NULL});
}

/* Config readers refuse what their family does not run, naming the key. */
static void test_config_refusals(void **state) {
    (void)state;
    static const struct {
        const char *json, *want;
    } cases[] = {
        {"{\"model_type\":\"qwen3_moe\"," BASE ",\"num_experts\":4,\"num_experts_per_tok\":2,"
         "\"moe_intermediate_size\":32,\"mlp_only_layers\":[1]}",
         "dense layers among the sparse ones"},
        {"{\"model_type\":\"qwen3_moe\"," BASE ",\"num_experts\":4}", "num_experts_per_tok"},
        {"{\"model_type\":\"llama\"," BASE ",\"hidden_act\":\"gelu\"}", "hidden_act 'gelu'"},
        {"{\"model_type\":\"gemma2\"," BASE ",\"hidden_activation\":\"gelu_pytorch_tanh\","
         "\"sliding_window\":16,\"layer_types\":[\"full_attention\"]}",
         "1 layer_types for 3 layers"},
        {"{\"model_type\":\"gemma3_text\"," BASE ",\"hidden_activation\":\"silu\"}",
         "non-GELU-tanh"},
    };
    for (size_t i = 0; i < PT_ARRAY_LEN(cases); i++) {
        json_t *j = json_loads(cases[i].json, 0, NULL);
        assert_non_null(j);
        pt_model_config c;
        pt_err err = {{0}};
        assert_int_equal(pt_config_from_json(j, &c, &err), -1);
        if (!strstr(err.msg, cases[i].want))
            fail_msg("case %zu: error '%s' does not say '%s'", i, err.msg, cases[i].want);
        json_decref(j);
    }
}

/* Mistral v0.1's window applies to every layer; Qwen3-MoE plans routed
 * experts with its top-k and expert size. */
static void test_window_and_moe_plans(void **state) {
    (void)state;
    pt_model_config c;
    pt_layer_plan plan[3];
    pt_err err = {{0}};
    config_of("{\"model_type\":\"mistral\"," BASE ",\"sliding_window\":4096}", &c);
    assert_int_equal(pt_model_plan(&c, plan, &err), 0);
    for (int l = 0; l < 3; l++) {
        assert_int_equal(plan[l].mixer, PT_MIX_ATTN_SWA);
        assert_int_equal(plan[l].window, 4096);
        assert_true(plan[l].attn_scale == 0.25f); /* 1 / sqrt(16) */
    }
    /* Qwen2 with the window on: transformers slides only layers from
     * max_window_layers on; explicit layer_types win. */
    config_of("{\"model_type\":\"qwen2\"," BASE ",\"sliding_window\":512,"
              "\"use_sliding_window\":true,\"max_window_layers\":2}",
              &c);
    assert_int_equal(pt_model_plan(&c, plan, &err), 0);
    assert_int_equal(plan[0].mixer, PT_MIX_ATTN);
    assert_int_equal(plan[1].mixer, PT_MIX_ATTN);
    assert_int_equal(plan[2].mixer, PT_MIX_ATTN_SWA);
    config_of("{\"model_type\":\"qwen2\"," BASE ",\"sliding_window\":512,"
              "\"use_sliding_window\":true,\"layer_types\":[\"sliding_attention\","
              "\"full_attention\",\"full_attention\"]}",
              &c);
    assert_int_equal(pt_model_plan(&c, plan, &err), 0);
    assert_int_equal(plan[0].mixer, PT_MIX_ATTN_SWA);
    assert_int_equal(plan[2].mixer, PT_MIX_ATTN);
    config_of("{\"model_type\":\"qwen3_moe\"," BASE ",\"num_local_experts\":6,"
              "\"num_experts_per_tok\":2,\"moe_intermediate_size\":32,\"norm_topk_prob\":true}",
              &c);
    assert_int_equal(pt_model_plan(&c, plan, &err), 0);
    assert_int_equal(c.expert_ffn_dim, 32);
    assert_true(c.expert_renorm);
    assert_true(c.qk_norm);
    for (int l = 0; l < 3; l++) {
        assert_int_equal(plan[l].ffn, PT_FFN_MOE);
        assert_int_equal(plan[l].n_experts, 6);
        assert_int_equal(plan[l].top_k, 2);
        assert_int_equal(plan[l].mixer, PT_MIX_ATTN);
    }
}

/* Gemma: layer kinds from layer_types or the family's default pattern, the
 * local rope base on window layers only, query_pre_attn_scalar, the caps,
 * the (1 + w) norm and GELU-tanh. */
static void test_gemma_plans(void **state) {
    (void)state;
    pt_model_config c;
    pt_layer_plan plan[3];
    pt_err err = {{0}};
    /* Gemma 3, transformers 5 style: rope per layer type, linear scaling on
     * the global layer only. */
    config_of("{\"model_type\":\"gemma3_text\"," BASE ",\"hidden_activation\":"
              "\"gelu_pytorch_tanh\",\"sliding_window\":12,\"query_pre_attn_scalar\":64,"
              "\"layer_types\":[\"sliding_attention\",\"full_attention\",\"sliding_attention\"],"
              "\"rope_parameters\":{\"full_attention\":{\"rope_type\":\"linear\",\"factor\":8.0,"
              "\"rope_theta\":1000000.0},\"sliding_attention\":{\"rope_type\":\"default\","
              "\"rope_theta\":10000.0}}}",
              &c);
    assert_int_equal(pt_model_plan(&c, plan, &err), 0);
    assert_true(c.tied_embeddings); /* Gemma's default */
    assert_true(c.embed_scale == 8.0f);
    for (int l = 0; l < 3; l++) {
        bool swa = l != 1;
        assert_int_equal(plan[l].mixer, swa ? PT_MIX_ATTN_SWA : PT_MIX_ATTN);
        assert_int_equal(plan[l].window, swa ? 12 : 0);
        assert_true(plan[l].rope_theta == (swa ? 10000.0f : 1000000.0f));
        assert_int_equal(plan[l].rope_scaled, !swa);
        assert_true(plan[l].attn_scale == 0.125f);
        assert_int_equal(plan[l].norm, PT_NORM_RMS_1PW);
        assert_int_equal(plan[l].act, PT_ACT_GELU_TANH);
        assert_true(plan[l].attn_softcap == 0);
    }
    assert_int_equal(c.rope_scaling, PT_ROPE_SCALING_LINEAR);
    /* Gemma 2, legacy style, no layer_types: even layers slide. */
    config_of("{\"model_type\":\"gemma2\"," BASE ",\"hidden_act\":\"gelu_pytorch_tanh\","
              "\"sliding_window\":4096,\"attn_logit_softcapping\":50.0,"
              "\"final_logit_softcapping\":30.0,\"tie_word_embeddings\":true}",
              &c);
    assert_int_equal(pt_model_plan(&c, plan, &err), 0);
    assert_true(c.final_softcap == 30.0f);
    for (int l = 0; l < 3; l++) {
        assert_int_equal(plan[l].mixer, l % 2 == 0 ? PT_MIX_ATTN_SWA : PT_MIX_ATTN);
        assert_true(plan[l].attn_softcap == 50.0f);
        assert_true(plan[l].rope_theta == 500000.0f);
        assert_true(plan[l].attn_scale == 0.25f); /* no query_pre_attn_scalar: head_dim 16 */
    }
}

/* Kinds no config reader produces yet are refused all the same, at the
 * layer that has them. */
static void test_hand_built_plans_checked(void **state) {
    (void)state;
    pt_model_config c;
    config_of("{\"model_type\":\"llama\"," BASE "}", &c);
    pt_layer_plan plan[3];
    pt_err err = {{0}};
    assert_int_equal(pt_model_plan(&c, plan, &err), 0);
    static const struct {
        size_t off;
        int value;
        const char *want;
    } bad[] = {
        {offsetof(pt_layer_plan, mixer), PT_MIX_RECURRENT, "recurrent"},
        {offsetof(pt_layer_plan, norm), 9, "norm kind 9"},
        {offsetof(pt_layer_plan, mixer), 7, "mixer kind 7"},
        {offsetof(pt_layer_plan, n_shared), 2, "2 shared experts"},
        {offsetof(pt_layer_plan, cache_group), 1, "cache group 1"},
    };
    for (size_t i = 0; i < PT_ARRAY_LEN(bad); i++) {
        pt_layer_plan p[3];
        memcpy(p, plan, sizeof p);
        *(int *)((char *)&p[2] + bad[i].off) = bad[i].value;
        if (bad[i].off == offsetof(pt_layer_plan, n_shared)) p[2].ffn = PT_FFN_MOE, p[2].top_k = 2;
        assert_int_equal(pt_layer_plan_check(p, 3, &err), -1);
        assert_non_null(strstr(err.msg, "layer 2"));
        assert_non_null(strstr(err.msg, bad[i].want));
        assert_int_equal(pt_layer_plan_check(p, 2, &err), 0); /* layers 0-1 are fine */
    }
    plan[1].residual_scale = 0.5f; /* MiniCPM's: runs */
    assert_int_equal(pt_layer_plan_check(plan, 3, &err), 0);
    plan[1].residual_scale = 0;
    assert_int_equal(pt_layer_plan_check(plan, 3, &err), -1);
    assert_non_null(strstr(err.msg, "layer 1: a residual scaled by 0"));
}

/* Loading refuses at the plan, before weights: a dummy model asking for a
 * window fails with the plan's reason, not a missing tensor or memory. */
static void test_load_refuses_before_weights(void **state) {
    (void)state;
    char path[] = "/tmp/petrel_plan_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    FILE *f = fdopen(fd, "w");
    fputs("{\"model_type\":\"mistral\"," BASE ",\"num_local_experts\":8,"
          "\"num_experts_per_tok\":2}",
          f);
    fclose(f);
    char spec[64];
    snprintf(spec, sizeof spec, "dummy:%s", path);
    pt_err err = {{0}};
    pt_backend *be = pt_backend_cpu_new(1, "auto", &err);
    assert_non_null(be);
    pt_model_opts o = {.backend = be};
    pt_model *m = NULL;
    assert_int_equal(pt_model_load(&m, spec, &o, &err), -1);
    assert_null(m);
    assert_non_null(strstr(err.msg, "mixture-of-experts FFN (8 experts, top 2)"));
    remove(path);
    be->ops->destroy(be);
}

/* Qwen3-Next: without layer_types every full_attention_interval-th layer
 * is full attention, the rest Gated DeltaNet in the state cache group;
 * every FFN routes experts with one shared expert; partial rope. */
#define QNEXT                                                                                      \
    "{\"model_type\":\"qwen3_next\"," BASE ",\"head_dim\":16,\"partial_rotary_factor\":0.25,"    \
    "\"num_experts\":4,\"num_experts_per_tok\":2,\"moe_intermediate_size\":8,"                   \
    "\"shared_expert_intermediate_size\":12,\"full_attention_interval\":3,"                       \
    "\"linear_num_key_heads\":2,\"linear_num_value_heads\":4,\"linear_key_head_dim\":8,"         \
    "\"linear_value_head_dim\":8"

static void test_qwen3_next_plan(void **state) {
    (void)state;
    pt_model_config c;
    config_of(QNEXT ",\"linear_conv_kernel_dim\":4}", &c);
    pt_layer_plan plan[3];
    pt_err err = {{0}};
    assert_int_equal(pt_model_plan(&c, plan, &err), 0);
    for (int l = 0; l < 3; l++) {
        assert_int_equal(plan[l].mixer, l < 2 ? PT_MIX_RECURRENT : PT_MIX_ATTN);
        assert_int_equal(plan[l].cache_group, l < 2 ? 2 : 0);
        assert_int_equal(plan[l].ffn, PT_FFN_MOE);
        assert_int_equal(plan[l].n_shared, 1);
        assert_int_equal(plan[l].rope.n_rot, 4);
        assert_int_equal(plan[l].norm, PT_NORM_RMS_1PW);
    }
    json_t *j = json_loads(QNEXT "}", 0, NULL); /* no conv kernel */
    assert_int_equal(pt_config_from_json(j, &c, &err), -1);
    assert_non_null(strstr(err.msg, "linear_conv_kernel_dim"));
    json_decref(j);
    j = json_loads(QNEXT ",\"linear_conv_kernel_dim\":4,\"layer_types\":[\"linear_attention\","
                   "\"sliding_attention\",\"full_attention\"]}", 0, NULL);
    assert_int_equal(pt_config_from_json(j, &c, &err), -1);
    assert_non_null(strstr(err.msg, "layer_types[1] 'sliding_attention'"));
    json_decref(j);
}

/* The list of supported architectures comes from the registry's rows. */
static void test_supported_list_from_table(void **state) {
    (void)state;
    json_t *j = json_loads("{\"model_type\":\"minicpm\"}", 0, NULL);
    pt_model_config c;
    pt_err err = {{0}};
    assert_int_equal(pt_config_from_json(j, &c, &err), -1);
    assert_non_null(strstr(err.msg, "'minicpm' is not supported (supported: llama, mistral, "
                                    "qwen2, qwen3, qwen3_moe, gemma2, gemma3_text, gemma4_text, "
                                    "gpt_oss, qwen3_next, qwen3_5_text, qwen3_5_moe_text, "
                                    "deepseek_v3, deepseek_v2, minicpm3)"));
    json_decref(j);
}

/* MiniCPM3's config.json: DeepSeek-V2's attention keys (q bottleneck, v
 * head hidden / heads when absent), the three scalings, LongRoPE's short
 * factors dividing each pair's frequency; refused: long factors that the
 * sequence's length would pick (original context below the trained one),
 * factors that do not match the rope dims, attention biases. */
#define MCPM3 "{\"model_type\":\"minicpm3\",\"hidden_size\":64,\"num_hidden_layers\":4," \
    "\"num_attention_heads\":4,\"num_key_value_heads\":4,\"intermediate_size\":96,"     \
    "\"q_lora_rank\":24,\"kv_lora_rank\":32,\"qk_nope_head_dim\":12,"                    \
    "\"qk_rope_head_dim\":8,\"vocab_size\":32,\"scale_emb\":12,\"scale_depth\":1.4,"     \
    "\"dim_model_base\":256,\"max_position_embeddings\":4096,"
static void test_minicpm3_config(void **state) {
    (void)state;
    pt_model_config c;
    pt_err err = {{0}};
    json_t *j = json_loads(MCPM3 "\"rope_scaling\":{\"type\":\"longrope\","
                           "\"short_factor\":[1,2,3,4],\"long_factor\":[5,6,7,8],"
                           "\"original_max_position_embeddings\":4096}}", 0, NULL);
    if (pt_config_from_json(j, &c, &err)) fail_msg("%s", err.msg);
    json_decref(j);
    assert_int_equal(c.head_dim, 20);
    assert_int_equal(c.n_rot, 8);
    assert_int_equal(c.v_head_dim, 16);
    assert_int_equal(c.n_kv_heads, 1);
    assert_float_equal(c.embed_scale, 12, 1e-6);
    assert_float_equal(c.residual_scale, 0.7, 1e-6); /* 1.4 / sqrt(4) */
    assert_float_equal(c.output_scale, 4, 1e-6);
    assert_int_equal(c.rope_scaling, PT_ROPE_SCALING_LONGROPE);
    float f[4];
    pt_rope_inv_freq(&c, c.rope_theta, f);
    for (int i = 0; i < 4; i++)
        assert_float_equal(f[i], 1.0 / pow(10000.0, 2.0 * i / 8) / (i + 1), 1e-7);
    pt_layer_plan plan[4];
    assert_int_equal(pt_model_plan(&c, plan, &err), 0);
    assert_int_equal(plan[3].mixer, PT_MIX_MLA);
    assert_float_equal(plan[3].residual_scale, 0.7, 1e-6);
    assert_float_equal(plan[3].rope.mscale, 1, 0);
    static const struct {
        const char *tail, *want;
    } bad[] = {
        {"\"rope_scaling\":{\"type\":\"longrope\",\"short_factor\":[1,2,3,4],\"long_factor\":"
         "[5,6,7,8],\"original_max_position_embeddings\":1024}}", "below max_position_embeddings"},
        {"\"rope_scaling\":{\"type\":\"longrope\",\"short_factor\":[1,2,3],\"long_factor\":"
         "[5,6,7]}}", "3 LongRoPE factors for 8 rope dims"},
        {"\"rope_scaling\":{\"type\":\"longrope\",\"short_factor\":[1,2,3,4],\"long_factor\":"
         "[5,6,7]}}", "one length"},
        {"\"attention_bias\":true}", "attention_bias"},
    };
    for (size_t i = 0; i < PT_ARRAY_LEN(bad); i++) {
        char text[1024];
        snprintf(text, sizeof text, "%s%s", MCPM3, bad[i].tail);
        j = json_loads(text, 0, NULL);
        assert_non_null(j);
        assert_int_equal(pt_config_from_json(j, &c, &err), -1);
        if (!strstr(err.msg, bad[i].want)) fail_msg("%s: %s", bad[i].want, err.msg);
        json_decref(j);
    }
}

/* DeepSeek's config.json: latent attention shapes, the first layers
 * dense, V3's routing (sigmoid, bias, groups, scale), one fused shared
 * FFN, adjacent-pair rope, YaRN's mscale_all_dim in the score scale; V2's
 * group-limited routing and sparse-every-n layers are refused. */
#define DSV3 "{\"model_type\":\"deepseek_v3\",\"hidden_size\":64,\"num_hidden_layers\":3," \
    "\"num_attention_heads\":4,\"num_key_value_heads\":4,\"intermediate_size\":96,"           \
    "\"q_lora_rank\":32,\"kv_lora_rank\":16,\"qk_nope_head_dim\":8,\"qk_rope_head_dim\":4,"   \
    "\"v_head_dim\":6,\"moe_intermediate_size\":16,\"n_routed_experts\":8,"                     \
    "\"n_shared_experts\":2,\"num_experts_per_tok\":3,\"first_k_dense_replace\":1,"             \
    "\"n_group\":4,\"topk_group\":2,\"scoring_func\":\"sigmoid\",\"norm_topk_prob\":true,"  \
    "\"routed_scaling_factor\":2.5,\"vocab_size\":32,\"rope_theta\":10000.0"
static void test_deepseek_config(void **state) {
    (void)state;
    pt_model_config c;
    pt_err err = {{0}};
    json_t *j = json_loads(DSV3 ",\"topk_method\":\"noaux_tc\",\"rope_scaling\":{\"type\":"
                           "\"yarn\",\"factor\":40,\"original_max_position_embeddings\":4096,"
                           "\"mscale\":1.0,\"mscale_all_dim\":1.0}}", 0, NULL);
    if (pt_config_from_json(j, &c, &err)) fail_msg("%s", err.msg);
    json_decref(j);
    assert_int_equal(c.head_dim, 12);
    assert_int_equal(c.n_rot, 4);
    assert_int_equal(c.n_kv_heads, 1);
    assert_int_equal(c.rope_style, PT_ROPE_NORM);
    assert_true(c.router_grouped && c.router_bias && c.expert_renorm);
    assert_int_equal(c.expert_gating, PT_MOE_SIGMOID);
    assert_int_equal(c.n_expert_groups, 4);
    assert_int_equal(c.n_group_used, 2);
    assert_true(c.expert_scale == 2.5f);
    assert_int_equal(c.shared_ffn_dim, 32);
    double m = 0.1 * log(40.0) + 1.0;
    assert_float_equal(c.attn_scale, m * m / sqrt(12.0), 1e-6);
    assert_float_equal(c.rope_mscale, 1.0, 1e-6);
    pt_layer_plan plan[3];
    assert_int_equal(pt_model_plan(&c, plan, &err), 0);
    assert_int_equal(plan[0].mixer, PT_MIX_MLA);
    assert_int_equal(plan[0].ffn, PT_FFN_DENSE);
    assert_int_equal(plan[0].n_shared, 0);
    assert_int_equal(plan[2].ffn, PT_FFN_MOE);
    assert_int_equal(plan[2].n_shared, 1);
    assert_int_equal(plan[2].top_k, 3);
    /* as transformers 5 saves it: YaRN under rope_parameters, no
     * scoring_func or topk_method (its V3 code always routes so) */
    j = json_loads(DSV3 ",\"rope_parameters\":{\"rope_type\":\"yarn\",\"rope_theta\":10000.0,"
                   "\"factor\":40.0,\"original_max_position_embeddings\":4096,\"mscale\":1.0,"
                   "\"mscale_all_dim\":1.0}}",
                   0, NULL);
    json_object_del(j, "scoring_func");
    json_object_del(j, "rope_theta");
    if (pt_config_from_json(j, &c, &err)) fail_msg("%s", err.msg);
    json_decref(j);
    assert_true(c.router_grouped && c.router_bias);
    assert_int_equal(c.expert_gating, PT_MOE_SIGMOID);
    assert_int_equal(c.n_expert_groups, 4);
    assert_float_equal(c.attn_scale, m * m / sqrt(12.0), 1e-6);
    j = json_loads(DSV3 ",\"topk_method\":\"group_limited_greedy\"}", 0, NULL);
    assert_int_equal(pt_config_from_json(j, &c, &err), -1);
    assert_non_null(strstr(err.msg, "topk_method 'group_limited_greedy' with 4 groups"));
    json_decref(j);
    j = json_loads(DSV3 ",\"topk_method\":\"noaux_tc\",\"moe_layer_freq\":2}", 0, NULL);
    assert_int_equal(pt_config_from_json(j, &c, &err), -1);
    assert_non_null(strstr(err.msg, "moe_layer_freq 2"));
    json_decref(j);
}

/* gpt-oss: even layers slide and are cache group 1 (the window group),
 * every layer has sinks and routed experts with the clamped SwiGLU, and
 * YaRN's attention factor scales the rope. */
static void test_gptoss_plan(void **state) {
    (void)state;
    pt_model_config c;
    config_of("{\"model_type\":\"gpt_oss\"," BASE ",\"num_local_experts\":4,"
              "\"num_experts_per_tok\":2,\"sliding_window\":128,"
              "\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":32.0,"
              "\"original_max_position_embeddings\":4096,\"beta_fast\":32.0,\"beta_slow\":1.0}}",
              &c);
    pt_layer_plan plan[3];
    pt_err err = {{0}};
    assert_int_equal(pt_model_plan(&c, plan, &err), 0);
    for (int l = 0; l < 3; l++) {
        assert_int_equal(plan[l].mixer, l % 2 == 0 ? PT_MIX_ATTN_SWA : PT_MIX_ATTN);
        assert_int_equal(plan[l].cache_group, l % 2 == 0);
        assert_true(plan[l].attn_sinks);
        assert_int_equal(plan[l].ffn, PT_FFN_MOE);
        assert_int_equal(plan[l].act, PT_ACT_SWIGLU_OAI);
        assert_true(fabsf(plan[l].rope.mscale - (float)(0.1 * log(32.0) + 1)) < 1e-6f);
    }
    assert_true(c.qkv_bias && c.o_bias && c.expert_bias && c.expert_renorm);
    /* a dense FFN with the clamped SwiGLU has no block */
    plan[1].ffn = PT_FFN_DENSE;
    assert_int_equal(pt_layer_plan_check(plan, 3, &err), -1);
    assert_non_null(strstr(err.msg, "layer 1: a dense FFN with gpt-oss's clamped SwiGLU"));
}

/* An impossible mixture is a bad config, not a plan to refuse later. */
/* Gemma 4 (a GGUF family: its config is built here as its reader fills
 * it): sliding and full layers get their own head dims, KV heads and rope
 * dims; full layers divide their rope by rope_freqs; the layers past
 * n_kv_layers attend over the last earlier layer of their kind, with
 * twice the FFN width (ffn_alt); a sharing
 * layer with no such layer is refused; config.json is refused. */
static void test_gemma4_plan(void **state) {
    (void)state;
    static const bool swa[7] = {1, 0, 1, 1, 0, 1, 0};
    pt_model_config c = {.arch = "gemma4", .dim = 32, .n_layers = 7, .n_heads = 2,
                         .n_kv_heads = 1, .head_dim = 16, .n_rot = 16, .ffn_dim = 48,
                         .vocab_size = 256, .norm_eps = 1e-6f, .rope_theta = 1000,
                         .rope_theta_swa = 100, .sliding_window = 4, .head_dim_swa = 8,
                         .n_kv_heads_swa = 2, .n_rot_swa = 8, .n_kv_layers = 5,
                         .rope_freq_factors = true, .attn_scale = 1, .act = PT_ACT_GELU_TANH,
                         .ffn_dim_alt = 96, .ffn_alt = {1u << 5 | 1u << 6}};
    for (int l = 0; l < 7; l++)
        if (swa[l]) pt_config_set_swa(&c, l);
    pt_layer_plan plan[7];
    pt_err err = {{0}};
    assert_int_equal(pt_model_plan(&c, plan, &err), 0);
    static const int source[7] = {0, 1, 2, 3, 4, 3, 4};
    for (int l = 0; l < 7; l++) {
        assert_int_equal(plan[l].mixer, swa[l] ? PT_MIX_ATTN_SWA : PT_MIX_ATTN);
        assert_int_equal(plan[l].head_dim, swa[l] ? 8 : 16);
        assert_int_equal(plan[l].n_kv_heads, swa[l] ? 2 : 1);
        assert_int_equal(plan[l].rope.n_rot, swa[l] ? 8 : 16);
        assert_true(plan[l].rope_theta == (swa[l] ? 100.0f : 1000.0f));
        assert_int_equal(plan[l].rope_factors, !swa[l]);
        assert_int_equal(plan[l].cache_group, swa[l]);
        assert_int_equal(plan[l].kv_layer, source[l]);
        assert_int_equal(plan[l].ffn_dim, l >= 5 ? 96 : 48); /* double-wide MLP */
        assert_true(plan[l].attn_scale == 1.0f);
    }
    /* layer 1 (full) shares, but layer 0 is the only earlier one: sliding */
    c.n_kv_layers = 1;
    assert_int_equal(pt_model_plan(&c, plan, &err), -1);
    assert_non_null(strstr(err.msg, "layer 1 shares K/V but no earlier layer of its kind"));

    /* a config.json without layer kinds is refused with what it lacks */
    json_t *j = json_loads("{\"model_type\":\"gemma4_text\",\"hidden_activation\":"
                           "\"gelu_pytorch_tanh\"," BASE "}",
                           0, NULL);
    assert_non_null(j);
    assert_int_equal(pt_config_from_json(j, &c, &err), -1);
    assert_non_null(strstr(err.msg, "gemma4_text needs sliding_window and layer_types"));
    json_decref(j);
}

/* transformers' gemma4_text config.json (E2B-like: per-layer inputs, the
 * last two layers sharing K/V with the double-wide MLP, proportional rope
 * on full layers; the 26B-like one: V = K with one global KV head, and
 * experts): the shapes per layer kind and the plan they give. */
static void test_gemma4_json(void **state) {
    (void)state;
#define G4 "\"model_type\":\"gemma4_text\",\"hidden_size\":64,\"num_hidden_layers\":6,"        \
           "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"head_dim\":32,"             \
           "\"global_head_dim\":64,\"intermediate_size\":96,\"vocab_size\":320,"              \
           "\"hidden_activation\":\"gelu_pytorch_tanh\",\"sliding_window\":8,"                 \
           "\"layer_types\":[\"sliding_attention\",\"sliding_attention\",\"full_attention\","  \
           "\"sliding_attention\",\"sliding_attention\",\"full_attention\"],"                   \
           "\"rope_parameters\":{\"sliding_attention\":{\"rope_type\":\"default\","            \
           "\"rope_theta\":10000.0},\"full_attention\":{\"rope_type\":\"proportional\","       \
           "\"partial_rotary_factor\":0.25,\"rope_theta\":1000000.0}}"
    pt_model_config c;
    pt_layer_plan plan[6];
    pt_err err = {{0}};
    config_of("{" G4 ",\"hidden_size_per_layer_input\":16,\"vocab_size_per_layer_input\":320,"
              "\"num_kv_shared_layers\":2,\"use_double_wide_mlp\":true,"
              "\"final_logit_softcapping\":15.0}",
              &c);
    assert_string_equal(c.arch, "gemma4");
    assert_int_equal(c.head_dim, 64);
    assert_int_equal(c.head_dim_swa, 32);
    assert_int_equal(c.n_rot, 64);
    assert_int_equal(c.n_rot_swa, 32);
    assert_int_equal(c.rope_rot_pairs, 8); /* 0.25 * 64 / 2 */
    assert_true(c.rope_theta == 1e6f && c.rope_theta_swa == 1e4f);
    assert_int_equal(c.ple_dim, 16);
    assert_int_equal(c.n_kv_layers, 4);
    assert_true(c.tied_embeddings && c.v_norm && c.final_softcap == 15.0f);
    assert_int_equal(c.norm, PT_NORM_RMS);
    assert_int_equal(pt_model_plan(&c, plan, &err), 0);
    static const int source[6] = {0, 1, 2, 3, 3, 2};
    for (int l = 0; l < 6; l++) {
        bool swa = l % 3 != 2;
        assert_int_equal(plan[l].head_dim, swa ? 32 : 64);
        assert_int_equal(plan[l].n_kv_heads, 2);
        assert_int_equal(plan[l].rope_factors, !swa);
        assert_int_equal(plan[l].kv_layer, source[l]);
        assert_int_equal(plan[l].ffn_dim, l >= 4 ? 192 : 96);
    }
    config_of("{" G4 ",\"hidden_size_per_layer_input\":0,\"attention_k_eq_v\":true,"
              "\"num_global_key_value_heads\":1,\"enable_moe_block\":true,\"num_experts\":6,"
              "\"top_k_experts\":2,\"moe_intermediate_size\":32}",
              &c);
    assert_int_equal(c.ple_dim, 0);
    assert_int_equal(c.n_kv_heads, 1);
    assert_int_equal(c.n_kv_heads_swa, 2);
    assert_int_equal(c.n_experts, 6);
    assert_int_equal(c.n_experts_used, 2);
    assert_int_equal(c.expert_ffn_dim, 32);
    for (int l = 0; l < 6; l++)
        assert_int_equal(c.v_from_k[0] >> l & 1, l % 3 == 2);
    /* scaled proportional rope is refused, not run unscaled */
    json_t *j = json_loads("{" G4 ",\"x\":0}", 0, NULL);
    json_object_set_new(json_object_get(json_object_get(j, "rope_parameters"), "full_attention"),
                        "factor", json_real(8.0));
    assert_int_equal(pt_config_from_json(j, &c, &err), -1);
    assert_non_null(strstr(err.msg, "proportional full rope only"));
    json_decref(j);
#undef G4
}

static void test_bad_mixture(void **state) {
    (void)state;
    json_t *j = json_loads("{\"model_type\":\"mistral\"," BASE ",\"num_local_experts\":2,"
                           "\"num_experts_per_tok\":4}",
                           0, NULL);
    pt_model_config c;
    pt_err err = {{0}};
    assert_int_equal(pt_config_from_json(j, &c, &err), -1);
    assert_non_null(strstr(err.msg, "2 experts with 4 per token"));
    json_decref(j);
}

/* matmul_id over a stack equals matmul over each expert's own view
 * (pt_weight_expert): the stride, and for MLX affine the scales' and
 * biases' offsets, pick the right expert.  One row per expert (decode), so
 * both run the same kernel and must agree exactly. */
static void check_expert_matmul(pt_backend *be, const pt_weight *w, const char *format) {
    const int k = 3;
    const int32_t ids[3] = {3, 0, 2};
    float x[64], y[3 * 128], want[128];
    for (int i = 0; i < 64; i++) x[i] = (float)((i * 37) % 17 - 8) / 8.0f;
    pt_be_matmul_id(be, y, x, w, ids, 1, k, 1);
    for (int j = 0; j < k; j++) {
        pt_weight one = pt_weight_expert(w, ids[j]);
        pt_be_matmul(be, want, x, &one, 1);
        if (memcmp(want, y + j * 128, sizeof want) != 0)
            fail_msg("%s: matmul_id slot %d (expert %d) differs from the expert's own matmul", format,
                     j, ids[j]);
        if (j > 0 && memcmp(y, y + j * 128, sizeof want) == 0)
            fail_msg("%s: experts %d and %d gave the same output", format, ids[0], ids[j]);
    }
}

/* The benchmark presets of the new families plan as the real models do. */
static void test_family_presets(void **state) {
    (void)state;
    pt_model_config c;
    pt_layer_plan plan[48];
    pt_err err = {{0}};
    config_of(pt_config_preset("qwen3-30b-a3b"), &c);
    assert_int_equal(pt_model_plan(&c, plan, &err), 0);
    assert_int_equal(plan[47].ffn, PT_FFN_MOE);
    assert_int_equal(plan[47].n_experts, 128);
    assert_int_equal(plan[47].top_k, 8);
    assert_int_equal(c.expert_ffn_dim, 768);
    config_of(pt_config_preset("gemma3-12b"), &c);
    assert_int_equal(pt_model_plan(&c, plan, &err), 0);
    for (int l = 0; l < 48; l++) {
        bool global = (l + 1) % 6 == 0;
        assert_int_equal(plan[l].mixer, global ? PT_MIX_ATTN : PT_MIX_ATTN_SWA);
        assert_true(plan[l].rope_theta == (global ? 1e6f : 1e4f));
        assert_int_equal(plan[l].rope_scaled, global); /* linear x8 on global layers only */
    }
    config_of(pt_config_preset("gemma2-9b"), &c);
    assert_int_equal(pt_model_plan(&c, plan, &err), 0);
    assert_int_equal(plan[0].window, 4096);
    assert_int_equal(plan[1].mixer, PT_MIX_ATTN);
    assert_true(c.final_softcap == 30.0f && plan[1].attn_softcap == 50.0f);
    config_of(pt_config_preset("gpt-oss-20b"), &c);
    assert_int_equal(pt_model_plan(&c, plan, &err), 0);
    for (int l = 0; l < 24; l++) {
        assert_int_equal(plan[l].mixer, l % 2 ? PT_MIX_ATTN : PT_MIX_ATTN_SWA);
        assert_int_equal(plan[l].ffn, PT_FFN_MOE);
    }
    assert_int_equal(plan[0].window, 128);
    assert_int_equal(plan[0].n_experts, 32);
    assert_int_equal(plan[0].top_k, 4);
    pt_layer_plan plan64[64];
    config_of(pt_config_preset("qwen3.5-27b"), &c);
    assert_int_equal(pt_model_plan(&c, plan64, &err), 0);
    for (int l = 0; l < 64; l++)
        assert_int_equal(plan64[l].mixer, l % 4 == 3 ? PT_MIX_ATTN : PT_MIX_RECURRENT);
    char names[256];
    pt_config_preset_names(names, sizeof names);
    assert_non_null(strstr(names, "gpt-oss-20b"));
    assert_non_null(strstr(names, "qwen3.5-27b"));
}

/* A family whose spec is a stack of experts gets one pt_weight per layer
 * with n_experts matrices expert_stride bytes apart, in any format. */
static void test_expert_stack_dummy(void **state) {
    (void)state;
    static const pt_weight_spec specs[] = {
        {"blk.%d.ffn_gate_exps.weight", "model.layers.%d.mlp.experts.gate_proj", D_EXPERTS, D_FFN,
         D_DIM, offsetof(pt_layer, w_gate), true, NEED_ALWAYS},
    };
    /* In the table, or among the weights only dummy models make (gpt-oss's
     * experts): the same stack either way. */
    static const pt_family fams[2] = {
        {.name = "test", .weights = specs, .n_weights = 1},
        {.name = "test", .dummy_weights = specs, .n_dummy_weights = 1}};
    static const struct {
        const char *format;
        size_t stride; /* 128 rows x 64 cols */
        size_t bytes;  /* of one expert, with affine scales and biases */
    } cases[] = {{"bf16", 128 * 64 * 2, 128 * 64 * 2},
                 {"q4_0", 128 * 64 / 32 * 18, 128 * 64 / 32 * 18},
                 {"q8_0", 128 * 64 / 32 * 34, 128 * 64 / 32 * 34},
                 {"affine4g32", 128 * 64 / 2, 128 * 64 / 2 + 2 * 128 * 2 * 2}};
    pt_err err = {{0}};
    pt_backend *be = pt_backend_cpu_new(1, "auto", &err);
    assert_non_null(be);
    for (size_t i = 0; i < 2 * PT_ARRAY_LEN(cases); i++) {
        const pt_family *fam = &fams[i & 1];
        pt_model m = {.be = be};
        config_of("{\"model_type\":\"llama\"," BASE "}", &m.cfg);
        m.family = fam;
        m.cfg.n_experts = 4;
        size_t bytes;
        assert_int_equal(pt_family_dummy_bytes(fam, &m.cfg, cases[i / 2].format, &bytes, &err), 0);
        assert_int_equal(bytes, 3 * 4 * cases[i / 2].bytes);
        m.layers = calloc(3, sizeof(pt_layer));
        if (pt_model_make_dummy_weights(&m, cases[i / 2].format, 7, &err)) fail_msg("%s", err.msg);
        for (int l = 0; l < 3; l++) {
            const pt_weight *w = &m.layers[l].w_gate;
            assert_int_equal(w->n_experts, 4);
            assert_int_equal(w->rows, 128);
            assert_int_equal(w->cols, 64);
            assert_int_equal(w->expert_stride, cases[i / 2].stride);
            assert_non_null(w->data);
        }
        check_expert_matmul(be, &m.layers[1].w_gate, cases[i / 2].format);
        assert_int_equal(m.weight_bytes, bytes);
        pt_model_free_owned(&m);
        free(m.layers);
    }
    be->ops->destroy(be);
}

/* ---- GGUF configs, as llama.cpp reads them ------------------------------------ *
 * A GGUF of metadata and one tiny token_embd (the vocabulary's source):
 * enough for pt_config_from_file.  kvs: "u:key=123", "f:key=1.5",
 * "s:key=text". */
static void put(FILE *f, const void *p, size_t n) {
    assert_int_equal(fwrite(p, 1, n, f), n);
}
static void put_u32(FILE *f, uint32_t v) { put(f, &v, 4); }
static void put_u64(FILE *f, uint64_t v) { put(f, &v, 8); }
static void put_str(FILE *f, const char *s, size_t n) {
    put_u64(f, n);
    put(f, s, n);
}

static void config_of_gguf(const char *arch, const char *const *kvs, pt_model_config *c) {
    char path[96];
    snprintf(path, sizeof path, "/tmp/petrel_plan_%d.gguf", (int)getpid());
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    size_t n_kv = 1;
    while (kvs[n_kv - 1]) n_kv++;
    put(f, "GGUF", 4), put_u32(f, 3), put_u64(f, 1), put_u64(f, n_kv);
    put_str(f, "general.architecture", 20), put_u32(f, 8), put_str(f, arch, strlen(arch));
    for (const char *const *kv = kvs; *kv; kv++) {
        const char *eq = strchr(*kv, '=');
        char key[96];
        snprintf(key, sizeof key, "%s.%.*s", arch, (int)(eq - *kv - 2), *kv + 2);
        put_str(f, key, strlen(key));
        if ((*kv)[0] == 'u') put_u32(f, 4), put_u32(f, (uint32_t)atol(eq + 1));
        if ((*kv)[0] == 'f') {
            float v = strtof(eq + 1, NULL);
            put_u32(f, 6), put(f, &v, 4);
        }
        if ((*kv)[0] == 's') put_u32(f, 8), put_str(f, eq + 1, strlen(eq + 1));
    }
    /* token_embd.weight: ne = {64, 8} f32 at offset 0 */
    put_str(f, "token_embd.weight", 17), put_u32(f, 2), put_u64(f, 64), put_u64(f, 8);
    put_u32(f, 0), put_u64(f, 0);
    static const uint8_t zero[64 * 8 * 4];
    long pos = ftell(f);
    put(f, zero, (size_t)((32 - pos % 32) % 32));
    put(f, zero, sizeof zero);
    fclose(f);
    pt_model_file *mf;
    pt_err err = {{0}};
    if (pt_model_file_open(&mf, path, &err) || pt_config_from_file(mf, c, &err))
        fail_msg("%s: %s", arch, err.msg);
    pt_model_file_close(mf);
    remove(path);
}

/* Gemma 2 at the 27B layer count scales scores by (dim / heads)^-1/2 and
 * soft-caps with llama.cpp's defaults when the keys are absent; its window
 * (4096 by default) is on the even layers.  Gemma 3 takes the window
 * pattern and the window layers' rope base (10000 by default) and keeps
 * rope scaling off them.  gpt-oss reads YaRN and keeps the correction
 * range unrounded. */
static void test_gguf_configs(void **state) {
    (void)state;
    pt_model_config c;
    static const char *const g2[] = {"u:embedding_length=64", "u:block_count=46",
                                     "u:attention.head_count=4", "u:attention.key_length=32",
                                     "u:feed_forward_length=128", NULL};
    config_of_gguf("gemma2", g2, &c);
    assert_string_equal(c.arch, "gemma2");
    assert_float_equal(c.attn_scale, 1 / sqrtf(16), 1e-7);
    assert_float_equal(c.attn_softcap, 50, 0), assert_float_equal(c.final_softcap, 30, 0);
    assert_int_equal(c.sliding_window, 4096);
    assert_true(pt_config_layer_swa(&c, 44) && !pt_config_layer_swa(&c, 45));
    assert_true(c.tied_embeddings);
    assert_float_equal(c.embed_scale, 8, 1e-6);

    static const char *const g3[] = {"u:embedding_length=64", "u:block_count=4",
                                     "u:attention.head_count=4", "u:attention.key_length=32",
                                     "u:feed_forward_length=128", "u:attention.sliding_window=12",
                                     "u:attention.sliding_window_pattern=3",
                                     "f:rope.freq_base=1000000", "s:rope.scaling.type=linear",
                                     "f:rope.scaling.factor=8", NULL};
    config_of_gguf("gemma3", g3, &c);
    assert_string_equal(c.arch, "gemma3_text");
    assert_float_equal(c.attn_scale, 1 / sqrtf(32), 1e-7);
    assert_float_equal(c.attn_softcap, 0, 0), assert_float_equal(c.final_softcap, 0, 0);
    bool want[4] = {true, true, false, true};
    for (int l = 0; l < 4; l++) assert_int_equal(pt_config_layer_swa(&c, l), want[l]);
    assert_float_equal(c.rope_theta_swa, 10000, 0);
    assert_true(c.rope_scaling_global_only);
    assert_int_equal(c.rope_scaling, PT_ROPE_SCALING_LINEAR);

    static const char *const oss[] = {"u:embedding_length=64", "u:block_count=4",
                                      "u:attention.head_count=4", "u:attention.key_length=32",
                                      "u:feed_forward_length=64", "u:expert_count=6",
                                      "u:expert_used_count=2", "u:expert_feed_forward_length=64",
                                      "u:attention.sliding_window=8", "f:rope.freq_base=150000",
                                      "s:rope.scaling.type=yarn", "f:rope.scaling.factor=32",
                                      "u:rope.scaling.original_context_length=4096", NULL};
    config_of_gguf("gpt-oss", oss, &c);
    assert_string_equal(c.arch, "gpt_oss");
    assert_int_equal(c.rope_scaling, PT_ROPE_SCALING_YARN);
    assert_int_equal(c.rope_orig_ctx, 4096);
    assert_false(c.rope_yarn_truncate);
    assert_float_equal(c.rope_mscale, 1 + 0.1f * logf(32), 1e-6);
    assert_true(c.attn_sinks && c.expert_bias && c.expert_renorm && c.qkv_bias && c.o_bias);
    assert_true(pt_config_layer_swa(&c, 0) && !pt_config_layer_swa(&c, 1));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama_plan),
        cmocka_unit_test(test_unsupported_kinds_refused),
        cmocka_unit_test(test_config_refusals),
        cmocka_unit_test(test_window_and_moe_plans),
        cmocka_unit_test(test_gemma_plans),
        cmocka_unit_test(test_family_presets),
        cmocka_unit_test(test_hand_built_plans_checked),
        cmocka_unit_test(test_load_refuses_before_weights),
        cmocka_unit_test(test_supported_list_from_table),
        cmocka_unit_test(test_deepseek_config),
        cmocka_unit_test(test_minicpm3_config),
        cmocka_unit_test(test_gptoss_plan),
        cmocka_unit_test(test_gguf_configs),
        cmocka_unit_test(test_qwen3_next_plan),
        cmocka_unit_test(test_gemma4_plan),
        cmocka_unit_test(test_gemma4_json),
        cmocka_unit_test(test_bad_mixture),
        cmocka_unit_test(test_expert_stack_dummy),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
