/*
 * test_hybrid_engine.c - the engine with a hybrid recurrent model (the
 * qwen3_next transformers fixture, tests/fixtures/hf/qwen3_next):
 *
 *   - greedy generation through the core and runner reproduces the 32
 *     tokens transformers gives for the fixture's prompts;
 *   - the prefix cache is off for such a model (its pages would come
 *     without the recurrent state at their end), so a repeated prompt
 *     reuses nothing and gives the same tokens;
 *   - speculative decoding gives the same tokens: a rejected draft rolls
 *     the recurrent state back to its checkpoint and recomputes;
 *   - the core runs at most one sequence per recurrent-state slot.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>
#include <jansson.h>

#include "engine/core.h"

#define FIXTURE PETREL_SOURCE_DIR "/tests/fixtures/hf/qwen3_next"

typedef struct {
    int32_t ids[64];
    int n;
} out_tokens;

static int collect(void *user, const pt_sample_result *r, const char *text, size_t len) {
    (void)text, (void)len;
    out_tokens *o = user;
    if (r && o->n < 64) o->ids[o->n++] = r->id;
    return 0;
}

static pt_engine *open_engine(void) {
    pt_engine_opts o = {.model_path = FIXTURE, .n_threads = 2, .kernels = "auto", .n_ctx = 128,
                        .kv_dtype = PT_F32, .no_tokenizer = true};
    pt_engine *e = NULL;
    pt_err err = {{0}};
    if (pt_engine_open(&e, &o, &err)) fail_msg("open: %s", err.msg);
    return e;
}

static pt_gen_params greedy(int n) {
    pt_gen_params gp = {.max_tokens = n, .ignore_eos = true};
    gp.sampling = pt_sampling_default();
    gp.sampling.temperature = 0;
    return gp;
}

static void test_greedy_matches_transformers(void **state) {
    (void)state;
    pt_engine *e = open_engine();
    assert_false(e->prefix_cache);
    json_error_t je;
    json_t *r = json_load_file(FIXTURE "/reference.json", 0, &je);
    assert_non_null(r);
    json_t *p;
    size_t k;
    json_array_foreach(json_object_get(r, "prompts"), k, p) {
        json_t *jt = json_object_get(p, "tokens"), *jg = json_object_get(p, "greedy");
        int n = (int)json_array_size(jt), ng = (int)json_array_size(jg);
        int32_t *toks = malloc(sizeof(int32_t) * (size_t)n);
        for (int i = 0; i < n; i++) toks[i] = (int32_t)json_integer_value(json_array_get(jt, (size_t)i));
        for (int round = 0; round < 2; round++) { /* the second would hit a prefix cache */
            pt_gen_params gp = greedy(ng);
            out_tokens o = {.n = 0};
            pt_gen_stats st;
            pt_err err = {{0}};
            if (pt_generate(e, toks, n, &gp, collect, &o, &st, &err)) fail_msg("%s", err.msg);
            assert_int_equal(st.n_cached, 0);
            assert_int_equal(o.n, ng);
            for (int i = 0; i < ng; i++)
                if (o.ids[i] != json_integer_value(json_array_get(jg, (size_t)i)))
                    fail_msg("prompt %zu (%d tokens), round %d: token %d is %d, transformers %lld",
                             k, n, round, i, o.ids[i],
                             (long long)json_integer_value(json_array_get(jg, (size_t)i)));
        }
        free(toks);
    }
    json_decref(r);
    assert_int_equal(e->kv.n_free_slots, e->kv.cfg.n_state_slots);
    pt_engine_close(e);
}

/* Speculative decoding: drafts from an oracle that is right half the time
 * (the reference's own greedy tokens, corrupted), so steps accept some and
 * reject some; every rejection rolls the recurrent state back to its
 * checkpoint.  The tokens must still be transformers' greedy ones. */
static void test_speculation_rolls_back(void **state) {
    (void)state;
    pt_engine *e = open_engine();
    json_error_t je;
    json_t *r = json_load_file(FIXTURE "/reference.json", 0, &je);
    assert_non_null(r);
    json_t *p;
    size_t k;
    int drafted = 0, accepted = 0;
    json_array_foreach(json_object_get(r, "prompts"), k, p) {
        json_t *jt = json_object_get(p, "tokens"), *jg = json_object_get(p, "greedy");
        int n = (int)json_array_size(jt), ng = (int)json_array_size(jg);
        int32_t *toks = malloc(sizeof(int32_t) * (size_t)n), *truth = malloc(sizeof(int32_t) * (size_t)ng);
        for (int i = 0; i < n; i++) toks[i] = (int32_t)json_integer_value(json_array_get(jt, (size_t)i));
        for (int i = 0; i < ng; i++) truth[i] = (int32_t)json_integer_value(json_array_get(jg, (size_t)i));
        pt_gen_params gp = greedy(ng);
        gp.spec = (pt_spec_params){.kind = PT_SPEC_ORACLE, .k = 4, .oracle = truth, .n_oracle = ng,
                                   .oracle_accept = 0.6f};
        gp.sampling.seed = 7 + k;
        out_tokens o = {.n = 0};
        pt_gen_stats st;
        pt_err err = {{0}};
        if (pt_generate(e, toks, n, &gp, collect, &o, &st, &err)) fail_msg("%s", err.msg);
        assert_int_equal(o.n, ng);
        for (int i = 0; i < ng; i++)
            if (o.ids[i] != truth[i])
                fail_msg("prompt %zu: token %d is %d, transformers %d (drafted %d, accepted %d)", k,
                         i, o.ids[i], truth[i], st.n_drafted, st.n_accepted);
        drafted += st.n_drafted, accepted += st.n_accepted;
        free(toks), free(truth);
    }
    print_message("drafted %d, accepted %d\n", drafted, accepted);
    assert_true(accepted > 0 && accepted < drafted); /* both paths ran */
    json_decref(r);
    assert_int_equal(e->kv.n_free_slots, e->kv.cfg.n_state_slots); /* checkpoints freed too */
    pt_engine_close(e);
}

static void test_max_seqs_follows_slots(void **state) {
    (void)state;
    pt_engine *e = open_engine();
    pt_core_opts co = {.max_seqs = 64};
    pt_core *c = pt_core_new(e, &co);
    assert_int_equal(pt_core_options(c)->max_seqs, e->kv.cfg.n_state_slots);
    assert_int_equal(e->kv.cfg.n_state_slots, 8);
    pt_core_free(c);
    pt_engine_close(e);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_matches_transformers),
        cmocka_unit_test(test_speculation_rolls_back),
        cmocka_unit_test(test_max_seqs_follows_slots),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
