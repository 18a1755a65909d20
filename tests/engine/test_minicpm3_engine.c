/*
 * test_minicpm3_engine.c - the engine with a latent-attention model that
 * uses LongRoPE (the minicpm3 GGUF fixture, tests/fixtures/gguf/minicpm3):
 *
 *   - greedy generation through the core and runner reproduces the 32
 *     tokens llama.cpp gives for the fixture's three prompts (5, 23 and 80
 *     tokens), twice (the second time from the prefix cache);
 *   - a context past the model's LongRoPE original context, where llama.cpp
 *     would take the long rope factors, is refused at open, naming the
 *     limit.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "engine/core.h"

#define FIXTURE PETREL_SOURCE_DIR "/tests/fixtures/gguf/minicpm3"

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

static int open_engine(pt_engine **e, int n_ctx, pt_err *err) {
    pt_engine_opts o = {.model_path = FIXTURE "/model.gguf", .n_threads = 2, .kernels = "auto",
                        .n_ctx = n_ctx, .kv_dtype = PT_F32, .no_tokenizer = true};
    return pt_engine_open(e, &o, err);
}

static void test_greedy_matches_llama_cpp(void **state) {
    (void)state;
    pt_engine *e = NULL;
    pt_err err = {{0}};
    if (open_engine(&e, 4096, &err)) fail_msg("open: %s", err.msg);
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
        for (int round = 0; round < 2; round++) {
            pt_gen_params gp = {.max_tokens = ng, .ignore_eos = true};
            gp.sampling = pt_sampling_default();
            gp.sampling.temperature = 0;
            out_tokens o = {.n = 0};
            pt_gen_stats st;
            if (pt_generate(e, toks, n, &gp, collect, &o, &st, &err)) fail_msg("%s", err.msg);
            assert_int_equal(o.n, ng);
            for (int i = 0; i < ng; i++)
                if (o.ids[i] != json_integer_value(json_array_get(jg, (size_t)i)))
                    fail_msg("prompt %zu (%d tokens), round %d: token %d is %d, llama.cpp %lld", k,
                             n, round, i, o.ids[i],
                             (long long)json_integer_value(json_array_get(jg, (size_t)i)));
        }
        free(toks);
    }
    json_decref(r);
    pt_engine_close(e);
}

static void test_context_past_longrope_refused(void **state) {
    (void)state;
    pt_engine *e = NULL;
    pt_err err = {{0}};
    assert_int_equal(open_engine(&e, 8192, &err), -1);
    assert_null(e);
    if (!strstr(err.msg, "a context of 8192 is beyond this model's LongRoPE original context 4096"))
        fail_msg("%s", err.msg);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_matches_llama_cpp),
        cmocka_unit_test(test_context_past_longrope_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
