/*
 * test_layer_plan.c - the per-layer plan a config gives, and the kinds the
 * loader refuses.
 *
 * A Llama-family config plans every layer as full attention with a dense
 * SiLU FFN, plain RMSNorm, unit residual scale, cache group 0 and the
 * config's rope (style, rotated dims, base).  A config that asks for
 * something no block runs yet (a sliding window, experts, GELU) loads no
 * further than the plan, with an error naming the layer and the kind; so do
 * hand-built plans with the other declared kinds.  The supported list in
 * errors comes from the registry table.  A weight spec may be a 3-D stack
 * of experts; dummy weights lay one out with the right stride.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>
#include <jansson.h>

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
    /* Mistral v0.1: a 4096-token window inside an 8192-token context. */
    assert_refused("{\"model_type\":\"mistral\"," BASE ",\"sliding_window\":4096}",
                   (const char *[]){"layer 0", "sliding-window attention", "4096",
                                    "not implemented yet", NULL});
    /* Mixtral-style experts under a Llama-family model_type. */
    assert_refused("{\"model_type\":\"mistral\"," BASE ",\"num_local_experts\":8,"
                   "\"num_experts_per_tok\":2}",
                   (const char *[]){"layer 0", "mixture-of-experts", "8 experts", "top 2",
                                    "not implemented yet", NULL});
    assert_refused("{\"model_type\":\"llama\"," BASE ",\"hidden_act\":\"gelu_pytorch_tanh\"}",
                   (const char *[]){"GELU-tanh", "not implemented yet", NULL});
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
        {offsetof(pt_layer_plan, norm), PT_NORM_RMS_1PW, "(1 + w) RMSNorm"},
        {offsetof(pt_layer_plan, cache_group), 1, "cache group 1"},
    };
    for (size_t i = 0; i < PT_ARRAY_LEN(bad); i++) {
        pt_layer_plan p[3];
        memcpy(p, plan, sizeof p);
        *(int *)((char *)&p[2] + bad[i].off) = bad[i].value;
        assert_int_equal(pt_layer_plan_check(p, 3, &err), -1);
        assert_non_null(strstr(err.msg, "layer 2"));
        assert_non_null(strstr(err.msg, bad[i].want));
        assert_int_equal(pt_layer_plan_check(p, 2, &err), 0); /* layers 0-1 are fine */
    }
    plan[1].residual_scale = 0.5f;
    assert_int_equal(pt_layer_plan_check(plan, 3, &err), -1);
    assert_non_null(strstr(err.msg, "layer 1: a residual scaled by 0.5"));
}

/* Loading refuses at the plan, before weights: a dummy model asking for a
 * window fails with the plan's reason, not a missing tensor or memory. */
static void test_load_refuses_before_weights(void **state) {
    (void)state;
    char path[] = "/tmp/petrel_plan_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    FILE *f = fdopen(fd, "w");
    fputs("{\"model_type\":\"mistral\"," BASE ",\"sliding_window\":1024}", f);
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
    assert_non_null(strstr(err.msg, "sliding-window attention (window 1024)"));
    remove(path);
    be->ops->destroy(be);
}

/* The list of supported architectures comes from the registry's rows. */
static void test_supported_list_from_table(void **state) {
    (void)state;
    json_t *j = json_loads("{\"model_type\":\"gemma3\"}", 0, NULL);
    pt_model_config c;
    pt_err err = {{0}};
    assert_int_equal(pt_config_from_json(j, &c, &err), -1);
    assert_non_null(strstr(err.msg, "'gemma3' is not supported (supported: llama, mistral, "
                                    "qwen2, qwen3)"));
    json_decref(j);
}

/* An impossible mixture is a bad config, not a plan to refuse later. */
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

/* A family whose spec is a stack of experts gets one pt_weight per layer
 * with n_experts matrices expert_stride bytes apart, in any format. */
static void test_expert_stack_dummy(void **state) {
    (void)state;
    static const pt_weight_spec specs[] = {
        {"blk.%d.ffn_gate_exps.weight", "model.layers.%d.mlp.experts.gate_proj", D_EXPERTS, D_FFN,
         D_DIM, offsetof(pt_layer, w_gate), true, NEED_ALWAYS},
    };
    static const pt_family fam = {.name = "test", .weights = specs, .n_weights = 1};
    static const struct {
        const char *format;
        size_t stride; /* 128 rows x 64 cols */
    } cases[] = {{"bf16", 128 * 64 * 2}, {"q4_0", 128 * 64 / 32 * 18}};
    pt_err err = {{0}};
    pt_backend *be = pt_backend_cpu_new(1, "auto", &err);
    assert_non_null(be);
    for (size_t i = 0; i < PT_ARRAY_LEN(cases); i++) {
        pt_model m = {.be = be};
        config_of("{\"model_type\":\"llama\"," BASE "}", &m.cfg);
        m.family = &fam;
        m.cfg.n_experts = 4;
        size_t bytes;
        assert_int_equal(pt_family_dummy_bytes(&fam, &m.cfg, cases[i].format, &bytes, &err), 0);
        assert_int_equal(bytes, 3 * 4 * cases[i].stride);
        m.layers = calloc(3, sizeof(pt_layer));
        if (pt_model_make_dummy_weights(&m, cases[i].format, 7, &err)) fail_msg("%s", err.msg);
        for (int l = 0; l < 3; l++) {
            const pt_weight *w = &m.layers[l].w_gate;
            assert_int_equal(w->n_experts, 4);
            assert_int_equal(w->rows, 128);
            assert_int_equal(w->cols, 64);
            assert_int_equal(w->expert_stride, cases[i].stride);
            assert_int_equal(w->nbytes, 4 * cases[i].stride);
            assert_non_null(w->data);
        }
        assert_int_equal(m.weight_bytes, bytes);
        pt_model_free_owned(&m);
        free(m.layers);
    }
    be->ops->destroy(be);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama_plan),
        cmocka_unit_test(test_unsupported_kinds_refused),
        cmocka_unit_test(test_hand_built_plans_checked),
        cmocka_unit_test(test_load_refuses_before_weights),
        cmocka_unit_test(test_supported_list_from_table),
        cmocka_unit_test(test_bad_mixture),
        cmocka_unit_test(test_expert_stack_dummy),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
