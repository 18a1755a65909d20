/*
 * test_hf_reference.c - every architecture we claim, against Hugging Face
 * transformers.
 *
 * tests/fixtures/hf/<case>/ holds a small random-weight model saved by
 * transformers (scripts/make_hf_references.py, docs/hf-references.md) and
 * reference.json with its float64 logits at every prompt position and 32
 * greedy tokens.  We load the directory, run each prompt in one batch and
 * compare every position's logits (1e-4 absolute: we compute in f32 on the
 * stored weights) and argmax, then generate greedily one token per step and
 * compare tokens and per-step logits — so prefill, decode and the paged KV
 * cache are all checked.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>
#include <jansson.h>

#include "model/model.h"

#define HF_DIR PETREL_SOURCE_DIR "/tests/fixtures/hf/"
#define TOL 1e-4

static int32_t *ids_of(json_t *arr, int *n) {
    *n = (int)json_array_size(arr);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(*n ? *n : 1));
    for (int i = 0; i < *n; i++) ids[i] = (int32_t)json_integer_value(json_array_get(arr, (size_t)i));
    return ids;
}

static double row_diff(const float *got, json_t *want, int vocab) {
    assert_int_equal(json_array_size(want), vocab);
    double d = 0;
    for (int v = 0; v < vocab; v++) {
        double x = fabs(got[v] - json_number_value(json_array_get(want, (size_t)v)));
        if (!(x <= d)) d = x; /* NaN propagates as a failure */
    }
    return d;
}

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

static void run_prompt(pt_model *m, pt_kv_cache *kv, json_t *p, const char *name) {
    int n, vocab = m->cfg.vocab_size;
    int32_t *tok = ids_of(json_object_get(p, "tokens"), &n);
    int n_greedy;
    int32_t *greedy = ids_of(json_object_get(p, "greedy"), &n_greedy);
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)n), *seq = calloc((size_t)n, sizeof(int32_t));
    bool *want = malloc((size_t)n);
    float *logits = malloc(sizeof(float) * (size_t)n * vocab);
    for (int i = 0; i < n; i++) pos[i] = i, want[i] = true;
    pt_kv_seq s = {0};
    pt_kv_seq *seqs[1] = {&s};
    pt_batch b = {n, tok, pos, seq, want, 1, seqs};
    pt_err err;
    if (pt_model_run(m, kv, &b, logits, &err)) fail_msg("%s: %s", name, err.msg);
    json_t *rows = json_object_get(p, "logits");
    for (int i = 0; i < n; i++) {
        double d = row_diff(logits + (size_t)i * vocab, json_array_get(rows, (size_t)i), vocab);
        if (d > TOL) fail_msg("%s, %d-token prompt, position %d: max |logit diff| %.3g", name, n, i, d);
        int want_arg = (int)json_integer_value(json_array_get(json_object_get(p, "argmax"), (size_t)i));
        assert_int_equal(argmax(logits + (size_t)i * vocab, vocab), want_arg);
    }
    /* greedy decode, one row per step, reusing the cache */
    json_t *glog = json_object_get(p, "greedy_logits");
    int32_t next = argmax(logits + (size_t)(n - 1) * vocab, vocab);
    for (int step = 0; step < n_greedy; step++) {
        if (next != greedy[step])
            fail_msg("%s, %d-token prompt: greedy token %d is %d, transformers gives %d", name, n,
                     step, next, greedy[step]);
        if (step == n_greedy - 1) break;
        int32_t p1 = n + step, s0 = 0;
        bool w = true;
        pt_batch d = {1, &next, &p1, &s0, &w, 1, seqs};
        if (pt_model_run(m, kv, &d, logits, &err)) fail_msg("%s: %s", name, err.msg);
        double diff = row_diff(logits, json_array_get(glog, (size_t)step + 1), vocab);
        if (diff > TOL) fail_msg("%s: decode step %d: max |logit diff| %.3g", name, step + 1, diff);
        next = argmax(logits, vocab);
    }
    pt_kv_seq_release(kv, &s);
    free(tok), free(greedy), free(pos), free(seq), free(want), free(logits);
}

static void check_case(const char *name, const char *kernels, int threads) {
    char dir[512], ref[600];
    snprintf(dir, sizeof dir, HF_DIR "%s", name);
    snprintf(ref, sizeof ref, "%s/reference.json", dir);
    pt_err err = {{0}};
    pt_backend *be = pt_backend_cpu_new(threads, kernels, &err);
    assert_non_null(be);
    pt_model_opts o = {.backend = be};
    pt_model *m;
    if (pt_model_load(&m, dir, &o, &err)) fail_msg("%s: %s", name, err.msg);
    pt_kv_cache kv;
    assert_int_equal(pt_model_kv_init(m, &kv, 128, PT_F32, NULL, &err), 0);
    json_error_t je;
    json_t *r = json_load_file(ref, 0, &je);
    if (!r) fail_msg("%s: %s", ref, je.text);
    json_t *p;
    size_t i;
    json_array_foreach(json_object_get(r, "prompts"), i, p) run_prompt(m, &kv, p, name);
    assert_int_equal(pt_kv_free_pages(&kv), kv.cfg.n_pages);
    json_decref(r);
    pt_kv_cache_free(&kv);
    pt_model_free(m);
    be->ops->destroy(be);
}

#define CASE(n)                                                                                    \
    static void test_##n(void **state) {                                                           \
        (void)state;                                                                               \
        check_case(#n, "auto", 2);                                                                 \
        check_case(#n, "portable", 1);                                                             \
    }
CASE(llama2)
CASE(llama3)
CASE(mistral)
CASE(qwen2)
CASE(qwen3)
CASE(llama_sharded)
CASE(qwen3_moe)
CASE(gemma2)
CASE(gemma3_text)

/* A backend without an op a model's plan needs (CUDA has no expert matmul
 * or windowed attention yet) refuses the model at load, naming the op. */
static void test_missing_op_refused(void **state) {
    (void)state;
    static const struct {
        const char *model;
        size_t op; /* offset of the op to remove */
        const char *want;
    } cases[] = {
        {"qwen3_moe", offsetof(pt_backend_ops, matmul_id), "lacks op 'matmul_id' (a mixture-of-experts FFN, layer 0)"},
        {"qwen3_moe", offsetof(pt_backend_ops, moe_route), "lacks op 'moe_route'"},
        {"gemma2", offsetof(pt_backend_ops, attention_ext), "lacks op 'attention_ext' (sliding-window attention, layer 0)"},
        {"gemma3_text", offsetof(pt_backend_ops, geglu), "lacks op 'geglu'"},
        {"gemma2", offsetof(pt_backend_ops, softcap), "lacks op 'softcap' (soft-capped logits)"},
    };
    pt_err err = {{0}};
    pt_backend *be = pt_backend_cpu_new(1, "auto", &err);
    assert_non_null(be);
    const pt_backend_ops *real = be->ops;
    for (size_t i = 0; i < PT_ARRAY_LEN(cases); i++) {
        pt_backend_ops ops = *real;
        *(void **)((char *)&ops + cases[i].op) = NULL;
        be->ops = &ops;
        char dir[512];
        snprintf(dir, sizeof dir, HF_DIR "%s", cases[i].model);
        pt_model_opts o = {.backend = be};
        pt_model *m = NULL;
        assert_int_equal(pt_model_load(&m, dir, &o, &err), -1);
        assert_null(m);
        if (!strstr(err.msg, cases[i].want)) fail_msg("'%s' does not say '%s'", err.msg, cases[i].want);
        be->ops = real;
    }
    /* Sliding-window layers with a quantized KV cache: refused, not run. */
    pt_model_opts o = {.backend = be};
    pt_model *m;
    if (pt_model_load(&m, HF_DIR "gemma2", &o, &err)) fail_msg("%s", err.msg);
    pt_kv_cache kv;
    pt_kvq_spec q = {.kind = PT_KVQ_AFFINE, .k_bits = 8, .v_bits = 8};
    assert_int_equal(pt_model_kv_init(m, &kv, 64, PT_F32, &q, &err), -1);
    assert_non_null(strstr(err.msg, "quantized KV cache with sliding-window layers"));
    pt_model_free(m);
    be->ops->destroy(be);
}

/* Each damage to a model directory gives an error naming what is wrong. */
static void test_bad_config(void **state) {
    (void)state;
    pt_err err = {{0}};
    pt_backend *be = pt_backend_cpu_new(1, "auto", &err);
    pt_model_opts o = {.backend = be};
    pt_model *m;
    assert_int_equal(pt_model_load(&m, "dummy:nonexistent-preset", &o, &err), -1);
    assert_non_null(strstr(err.msg, "nonexistent-preset"));
    pt_model_config c;
    json_t *j = json_loads("{\"model_type\":\"gpt_neox\",\"hidden_size\":8}", 0, NULL);
    assert_int_equal(pt_config_from_json(j, &c, &err), -1);
    assert_non_null(strstr(err.msg, "gpt_neox"));
    json_decref(j);
    j = json_loads("{\"model_type\":\"llama\",\"hidden_size\":64,\"num_hidden_layers\":2,"
                   "\"num_attention_heads\":5,\"num_key_value_heads\":2,\"intermediate_size\":8,"
                   "\"vocab_size\":10}", 0, NULL);
    assert_int_equal(pt_config_from_json(j, &c, &err), -1);
    assert_non_null(strstr(err.msg, "multiple"));
    json_decref(j);
    j = json_loads("{\"model_type\":\"llama\",\"hidden_size\":64,\"num_hidden_layers\":2,"
                   "\"num_attention_heads\":4,\"intermediate_size\":8,\"vocab_size\":10,"
                   "\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":4}}", 0, NULL);
    assert_int_equal(pt_config_from_json(j, &c, &err), -1);
    assert_non_null(strstr(err.msg, "yarn"));
    json_decref(j);
    /* an integer too large for the field is out of range, not missing */
    j = json_loads("{\"model_type\":\"llama\",\"hidden_size\":64,\"num_hidden_layers\":2,"
                   "\"num_attention_heads\":4,\"intermediate_size\":8,"
                   "\"vocab_size\":1099511627776}",
                   0, NULL);
    assert_int_equal(pt_config_from_json(j, &c, &err), -1);
    if (!strstr(err.msg, "vocab_size 1099511627776 is out of range")) fail_msg("%s", err.msg);
    json_decref(j);
    be->ops->destroy(be);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama2),  cmocka_unit_test(test_llama3),
        cmocka_unit_test(test_mistral), cmocka_unit_test(test_qwen2),
        cmocka_unit_test(test_qwen3),   cmocka_unit_test(test_llama_sharded),
        cmocka_unit_test(test_qwen3_moe), cmocka_unit_test(test_gemma2),
        cmocka_unit_test(test_gemma3_text), cmocka_unit_test(test_missing_op_refused),
        cmocka_unit_test(test_bad_config),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
