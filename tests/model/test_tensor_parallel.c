/*
 * test_tensor_parallel.c - the CPU reference of tensor parallel (model/tp.c,
 * docs/tensor-parallel.md): a model split over N ranks must compute what
 * the whole model computes.
 *
 * For each case the same prompt runs through the whole model and through
 * the split one, 8 rows per forward call (so prompts run in chunks), the
 * logits of every position wanted; then 16 greedy steps, one row each.
 * The logits must agree within 1e-4 of the largest |logit| (the split
 * only reorders additions: each row-parallel matmul's dot products are
 * cut into N partial sums that all_reduce adds in rank order, so the
 * results differ from the whole model's by a few f32 roundings per layer,
 * ~1e-6 relative; 1e-4 leaves room for the many layers of a long run and
 * still fails on any slicing mistake, which moves logits by O(1)), and the
 * greedy tokens must be identical.  Quantized weights get 1e-3: their
 * matmuls round the activations (here to int16, see main), and a rounding
 * step taken on one side and not the other moves the logits by ~1e-4 of
 * their range (measured: at most 6.5e-5 relative).  The transformers fixtures also have
 * transformers' own greedy continuation, which the split model must give.
 *
 * Cases: Qwen3, Qwen2 (biases on q, k, v; tied embeddings), Gemma 2 and 3
 * (window layers, soft-capping, post-block norms) and Qwen3-MoE fixtures
 * at N = 2 and 4 (their 4 heads and 2 KV heads: N = 4
 * replicates each KV head on two ranks); and two dummy configs with 8
 * heads, 2 KV heads and a vocabulary of 250 (not a multiple of N) at N =
 * 2, 4, 8: a dense Qwen2-shaped one in q8_0 (the column slices of Wo and
 * Wdown cut q8_0 blocks at their boundaries), a Qwen3-MoE one with 8
 * experts in q8_0 (whole experts per rank: expert parallel at every N) and
 * one with 6 in bf16 (expert parallel at N = 2; at 4 and 8 each expert's
 * rows split).  The qwen3_moe fixture's 6 experts likewise go whole at
 * N = 2 and sliced at N = 4.  And a Qwen2-shaped one whose second layer
 * has an 8-position sliding window (the KV cache's window group) in f32;
 * and the dense and MoE ones in MLX affine 4-bit (scales and biases
 * sliced with the codes).  Then the refusals: heads that do not split, a
 * family that is not split yet; and --tensor-parallel 1 on the CPU being
 * today's path exactly (bit-identical logits).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "model/model.h"

#define HF_DIR PETREL_SOURCE_DIR "/tests/fixtures/hf/"
#define TP_DIR PETREL_SOURCE_DIR "/tests/model/tp/"
#define ROWS 8   /* rows per forward call */
#define N_GEN 16 /* greedy steps */
#define MAX_POS 64
#define TOL 1e-4   /* float weights */
#define TOL_Q 1e-3 /* quantized weights: activations rounded to int16 per block */

typedef struct run {
    pt_backend *be;
    pt_model *m;
    pt_kv_cache kv;
    int vocab, n_prompt;
    float *prompt_logits; /* [n_prompt][vocab] */
    int32_t greedy[N_GEN];
} run;

static int argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* Loads path (split over tp ranks when tp > 0), runs the prompt with every
 * position's logits wanted, then N_GEN greedy steps. */
static void run_model(run *r, const char *path, const char *dtype, int tp, const int32_t *prompt,
                      int n_prompt) {
    memset(r, 0, sizeof *r);
    pt_err err = {{0}};
    r->be = pt_backend_cpu_new(2, "auto", &err);
    assert_non_null(r->be);
    pt_model_opts o = {.backend = r->be,
                       .max_batch = ROWS,
                       .dummy_dtype = dtype,
                       .dummy_seed = 7,
                       .tensor_parallel = tp};
    if (pt_model_load(&r->m, path, &o, &err)) fail_msg("%s at %d ranks: %s", path, tp, err.msg);
    assert_int_equal(pt_model_tp_ranks(r->m), tp > 1 ? tp : 1);
    if (pt_model_kv_init(r->m, &r->kv, MAX_POS, PT_F32, NULL, &err)) fail_msg("%s", err.msg);
    r->vocab = r->m->cfg.vocab_size;
    r->n_prompt = n_prompt;
    r->prompt_logits = malloc(sizeof(float) * (size_t)n_prompt * r->vocab);

    pt_kv_seq seq = {0};
    pt_kv_seq *seqs[1] = {&seq};
    int32_t pos[MAX_POS], sid[MAX_POS] = {0}, tok[MAX_POS];
    bool want[MAX_POS];
    for (int i = 0; i < n_prompt; i++)
        pos[i] = i, want[i] = true, tok[i] = prompt[i];
    pt_batch b = {.n_tokens = n_prompt,
                  .tokens = tok,
                  .pos = pos,
                  .seq = sid,
                  .logits = want,
                  .n_seqs = 1,
                  .seqs = seqs};
    if (pt_model_run(r->m, &r->kv, &b, r->prompt_logits, &err)) fail_msg("%s", err.msg);

    float *row = malloc(sizeof(float) * (size_t)r->vocab);
    int32_t next = argmax(r->prompt_logits + (size_t)(n_prompt - 1) * r->vocab, r->vocab);
    for (int g = 0; g < N_GEN; g++) {
        r->greedy[g] = next;
        int32_t p = n_prompt + g, s0 = 0;
        bool w = true;
        pt_batch d = {.n_tokens = 1,
                      .tokens = &next,
                      .pos = &p,
                      .seq = &s0,
                      .logits = &w,
                      .n_seqs = 1,
                      .seqs = seqs};
        if (pt_model_run(r->m, &r->kv, &d, row, &err)) fail_msg("%s", err.msg);
        next = argmax(row, r->vocab);
    }
    free(row);
    pt_kv_seq_release(&r->kv, &seq);
}

static void free_run(run *r) {
    pt_kv_cache_free(&r->kv);
    pt_model_free(r->m);
    r->be->ops->destroy(r->be);
    free(r->prompt_logits);
}

/* The split run against the whole one: logits within TOL of the largest,
 * the same greedy tokens. */
static void compare(const run *whole, const run *split, const char *what, int n, double tol) {
    size_t count = (size_t)whole->n_prompt * whole->vocab;
    double big = 1, worst = 0;
    for (size_t i = 0; i < count; i++)
        big = fmax(big, fabs(whole->prompt_logits[i]));
    for (size_t i = 0; i < count; i++)
        worst = fmax(worst, fabs(whole->prompt_logits[i] - split->prompt_logits[i]));
    printf("  %-22s N=%d: max |logit diff| %.3g (largest |logit| %.3g)\n", what, n, worst, big);
    if (worst > tol * big) fail_msg("%s at %d ranks: logits differ by %g", what, n, worst);
    for (int g = 0; g < N_GEN; g++)
        if (whole->greedy[g] != split->greedy[g])
            fail_msg("%s at %d ranks: greedy token %d is %d, whole model %d", what, n, g,
                     split->greedy[g], whole->greedy[g]);
}

/* The first prompt and greedy tokens of a fixture's reference.json. */
static int fixture_prompt(const char *name, int32_t *tokens, int32_t *greedy) {
    char path[512];
    snprintf(path, sizeof path, HF_DIR "%s/reference.json", name);
    json_error_t je;
    json_t *r = json_load_file(path, 0, &je);
    if (!r) fail_msg("%s: %s", path, je.text);
    json_t *p = json_array_get(json_object_get(r, "prompts"), 0);
    json_t *t = json_object_get(p, "tokens"), *g = json_object_get(p, "greedy");
    int n = (int)json_array_size(t);
    assert_true(n > 0 && n + N_GEN <= MAX_POS && json_array_size(g) >= N_GEN);
    for (int i = 0; i < n; i++)
        tokens[i] = (int32_t)json_integer_value(json_array_get(t, (size_t)i));
    for (int i = 0; i < N_GEN; i++)
        greedy[i] = (int32_t)json_integer_value(json_array_get(g, (size_t)i));
    json_decref(r);
    return n;
}

static void fixture_case(const char *name, const int *ns, int n_ns) {
    int32_t prompt[MAX_POS], ref[N_GEN];
    int n = fixture_prompt(name, prompt, ref);
    char dir[512];
    snprintf(dir, sizeof dir, HF_DIR "%s", name);
    run whole;
    run_model(&whole, dir, NULL, 0, prompt, n);
    for (int g = 0; g < N_GEN; g++)
        assert_int_equal(whole.greedy[g], ref[g]);
    for (int i = 0; i < n_ns; i++) {
        run split;
        run_model(&split, dir, NULL, ns[i], prompt, n);
        compare(&whole, &split, name, ns[i], TOL);
        for (int g = 0; g < N_GEN; g++)
            assert_int_equal(split.greedy[g], ref[g]);
        free_run(&split);
    }
    free_run(&whole);
}

static void dummy_case_at(const char *file, const char *dtype, const int *ns, int n_ns) {
    char path[512];
    snprintf(path, sizeof path, "dummy:" TP_DIR "%s", file);
    int32_t prompt[21];
    for (int i = 0; i < 21; i++)
        prompt[i] = (int32_t)((i * 37 + 11) % 250);
    run whole;
    run_model(&whole, path, dtype, 0, prompt, 21);
    for (int i = 0; i < n_ns; i++) {
        run split;
        run_model(&split, path, dtype, ns[i], prompt, 21);
        char what[64];
        snprintf(what, sizeof what, "%s %s", file, dtype);
        bool quant = strcmp(dtype, "f32") && strcmp(dtype, "bf16") && strcmp(dtype, "f16");
        compare(&whole, &split, what, ns[i], quant ? TOL_Q : TOL);
        free_run(&split);
    }
    free_run(&whole);
}

static void dummy_case(const char *file, const char *dtype) {
    static const int ns[] = {2, 4, 8};
    dummy_case_at(file, dtype, ns, 3);
}

static void test_qwen3(void **state) {
    (void)state;
    static const int ns[] = {2, 4};
    fixture_case("qwen3", ns, 2);
}

static void test_qwen2_bias_tied(void **state) {
    (void)state;
    static const int ns[] = {2, 4};
    fixture_case("qwen2", ns, 2);
}

/* Gemma 2: window layers, score and logit soft-capping, norms after each
 * block; Gemma 3: q/k norms, a rope base per layer kind. */
static void test_gemma(void **state) {
    (void)state;
    static const int ns[] = {2, 4};
    fixture_case("gemma2", ns, 2);
    fixture_case("gemma3_text", ns, 2);
}

static void test_qwen3_moe(void **state) {
    (void)state;
    static const int ns[] = {2, 4};
    fixture_case("qwen3_moe", ns, 2);
}

static void test_dummy_dense_q8_0(void **state) {
    (void)state;
    dummy_case("dense.json", "q8_0");
}

/* Layer 1 attends through an 8-position window (the cache's window group,
 * replicated per rank), over a 37-position run. */
static void test_dummy_window_f32(void **state) {
    (void)state;
    dummy_case("dense_swa.json", "f32");
}

/* 8 experts: whole experts per rank (expert parallel) at every N. */
static void test_dummy_moe_experts_q8_0(void **state) {
    (void)state;
    dummy_case("moe.json", "q8_0");
}

/* 6 experts: expert parallel at N = 2, each expert's rows split at 4 and 8. */
static void test_dummy_moe_slices_bf16(void **state) {
    (void)state;
    dummy_case("moe6.json", "bf16");
}

/* MLX affine (4 bits, groups of 32): codes, scales and biases sliced by
 * rows and columns (dense at N = 8: Wo's and Wdown's 32 columns, one
 * group), expert stacks as views (8 experts) and as sliced copies (6
 * experts at N = 4: 32 of each expert's 128 rows). */
static void test_dummy_affine(void **state) {
    (void)state;
    dummy_case("dense.json", "affine4g32");
    dummy_case("moe.json", "affine4g32");
    static const int ns[] = {2, 4};
    dummy_case_at("moe6.json", "affine4g32", ns, 2);
}

/* A split that cannot be made fails at load with the reason. */
static void expect_refused(const char *path, int tp, const char *needle) {
    pt_err err = {{0}};
    pt_backend *be = pt_backend_cpu_new(1, "auto", &err);
    pt_model *m = NULL;
    pt_model_opts o = {.backend = be, .max_batch = ROWS, .tensor_parallel = tp};
    assert_int_equal(pt_model_load(&m, path, &o, &err), -1);
    assert_null(m);
    if (!strstr(err.msg, needle)) fail_msg("expected '%s' in: %s", needle, err.msg);
    be->ops->destroy(be);
}

static void test_refusals(void **state) {
    (void)state;
    expect_refused(HF_DIR "qwen3", 3, "attention heads (4) do not split evenly over 3 ranks");
    expect_refused(HF_DIR "qwen3", 8, "attention heads (4) do not split evenly over 8 ranks");
    expect_refused(HF_DIR "qwen3_next", 2, "the qwen3next family (qwen3_next) is not split yet");
}

/* --tensor-parallel 1 on the CPU is the whole model's path: the same bits. */
static void test_one_rank_is_today(void **state) {
    (void)state;
    int32_t prompt[MAX_POS], ref[N_GEN];
    int n = fixture_prompt("llama3", prompt, ref);
    run a, b;
    run_model(&a, HF_DIR "llama3", NULL, 0, prompt, n);
    run_model(&b, HF_DIR "llama3", NULL, 1, prompt, n);
    assert_null(b.m->tp);
    assert_null(b.m->comm);
    assert_memory_equal(a.prompt_logits, b.prompt_logits, sizeof(float) * (size_t)n * a.vocab);
    assert_memory_equal(a.greedy, b.greedy, sizeof a.greedy);
    free_run(&a);
    free_run(&b);
}

int main(void) {
    /* Quantized matmuls round their activations per block of 32; in int8
     * (prefill on AVX2) a 1e-7 difference in an input can move one value a
     * whole step, 1/127 of its block's largest, and the logits by 1e-2:
     * a true difference of the two forwards, but one that says nothing
     * about the split.  int16 rounding (32767 steps) keeps such moves at
     * about 1e-4 of the logits' range, which TOL_Q allows. */
    setenv("PETREL_CPU_INT8", "0", 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_qwen3),
        cmocka_unit_test(test_qwen2_bias_tied),
        cmocka_unit_test(test_qwen3_moe),
        cmocka_unit_test(test_gemma),
        cmocka_unit_test(test_dummy_dense_q8_0),
        cmocka_unit_test(test_dummy_window_f32),
        cmocka_unit_test(test_dummy_moe_experts_q8_0),
        cmocka_unit_test(test_dummy_moe_slices_bf16),
        cmocka_unit_test(test_dummy_affine),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_one_rank_is_today),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
