/*
 * test_hybrid_engine.c - the engine with a hybrid recurrent model (the
 * qwen3_next transformers fixture, tests/fixtures/hf/qwen3_next):
 *
 *   - greedy generation through the core and runner reproduces the 32
 *     tokens transformers gives for the fixture's prompts;
 *   - the prefix cache reuses a hybrid model's pages only where a state
 *     snapshot ends them: a repeated prompt reuses its last full page and
 *     gives the same tokens; prompts sharing a prefix that is not
 *     page-aligned ("system prompts") teach the cache the branch point, so
 *     the third such prompt reuses it; every output equals the output with
 *     the prefix cache off;
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

static pt_engine *open_engine_opts(bool no_prefix_cache) {
    pt_engine_opts o = {.model_path = FIXTURE, .n_threads = 2, .kernels = "auto", .n_ctx = 128,
                        .kv_dtype = PT_F32, .no_tokenizer = true, .no_prefix_cache = no_prefix_cache};
    pt_engine *e = NULL;
    pt_err err = {{0}};
    if (pt_engine_open(&e, &o, &err)) fail_msg("open: %s", err.msg);
    return e;
}

static pt_engine *open_engine(void) {
    return open_engine_opts(false);
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
    assert_true(e->prefix_cache);
    int ps = e->kv.cfg.page_size;
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
            /* the first round snapshots the state at the prompt's last full
             * page; the second starts there */
            assert_int_equal(st.n_cached, round ? (n - 1) / ps * ps : 0);
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

/* Greedy tokens for prompt on engine e; the positions it reused. */
static int gen(pt_engine *e, const int32_t *prompt, int n, out_tokens *o) {
    pt_gen_params gp = greedy(16);
    pt_gen_stats st;
    pt_err err = {{0}};
    o->n = 0;
    if (pt_generate(e, prompt, n, &gp, collect, o, &st, &err)) fail_msg("%s", err.msg);
    assert_int_equal(o->n, 16);
    return st.n_cached;
}

/* Three prompts share a 40-token prefix (two pages and a half) and then
 * differ.  The first snapshots only its own last page; the second finds
 * the shared pages but no state at their end, so it computes them again,
 * pausing at the branch point to snapshot there; the third reuses that. */
static void test_prefix_branches(void **state) {
    (void)state;
    pt_engine *on = open_engine(), *off = open_engine_opts(true);
    int ps = on->kv.cfg.page_size, vocab = on->model->cfg.vocab_size;
    enum { SHARED = 40, LEN = 50 };
    int32_t p[3][LEN];
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < LEN; i++)
            p[k][i] = i < SHARED ? (i * 37 + 11) % vocab : (i * 13 + 101 * k + 7) % vocab;
    int want_cached[3] = {0, 0, SHARED / ps * ps};
    for (int k = 0; k < 3; k++) {
        out_tokens a, b;
        int cached = gen(on, p[k], LEN, &a);
        assert_int_equal(gen(off, p[k], LEN, &b), 0);
        if (cached != want_cached[k])
            fail_msg("prompt %d reused %d positions, not %d", k, cached, want_cached[k]);
        assert_memory_equal(a.ids, b.ids, sizeof(int32_t) * 16);
    }
    /* and the first again: its last full page, from its own snapshot */
    out_tokens a, b;
    assert_int_equal(gen(on, p[0], LEN, &a), (LEN - 1) / ps * ps);
    gen(off, p[0], LEN, &b);
    assert_memory_equal(a.ids, b.ids, sizeof(int32_t) * 16);
    assert_int_equal(on->kv.n_free_slots, on->kv.cfg.n_state_slots);
    pt_engine_close(on);
    pt_engine_close(off);
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
        cmocka_unit_test(test_prefix_branches),
        cmocka_unit_test(test_speculation_rolls_back),
        cmocka_unit_test(test_max_seqs_follows_slots),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
