/*
 * test_jump_forward.c - jump-forward decoding on stories260K: where the
 * grammar admits one continuation its tokens go in as verified drafts, so
 * greedy output is token-identical to plain constrained decoding while
 * tokens are reported forced; sampled output still follows the grammar;
 * the forced tokens spell the grammar's forced bytes, less the last token
 * (which may merge with what follows), and are ones the grammar accepts.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>

#include <cmocka.h>
#include <jansson.h>

#include "engine/engine.h"
#include "server/structured.h"

#define MODEL PETREL_SOURCE_DIR "/models/stories260K.gguf"

/* Long keys in a fixed order (more than 8 properties: the schema's order),
 * so most of the output is forced. */
static const char *const k_schema =
    "{\"type\":\"object\",\"additionalProperties\":false,\"properties\":{"
    "\"the_name_of_the_little_girl\":{\"type\":\"string\",\"maxLength\":12},"
    "\"the_number_of_her_friends\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":9},"
    "\"the_colour_of_her_hat\":{\"enum\":[\"red\",\"blue\"]},"
    "\"a\":{\"type\":\"boolean\"},\"b\":{\"type\":\"boolean\"},\"c\":{\"type\":\"boolean\"},"
    "\"d\":{\"type\":\"boolean\"},\"e\":{\"type\":\"boolean\"},"
    "\"whether_the_story_ends_well\":{\"type\":\"boolean\"}},"
    "\"required\":[\"the_name_of_the_little_girl\",\"the_number_of_her_friends\",\"the_colour_of_her_hat\","
    "\"a\",\"b\",\"c\",\"d\",\"e\",\"whether_the_story_ends_well\"]}";

static pt_engine *open_engine(void) {
    pt_engine_opts o = {.model_path = MODEL, .n_threads = 1, .kernels = "auto", .n_ctx = 1024,
                        .kv_dtype = PT_F32};
    pt_engine *e = NULL;
    pt_err err = {{0}};
    if (pt_engine_open(&e, &o, &err)) fail_msg("open: %s", err.msg);
    return e;
}

static pt_structured *compile(pt_engine *e, const char *text) {
    pt_grammar *g = NULL;
    pt_err err = {{0}};
    json_t *j = json_loads(text, 0, NULL);
    /* one whitespace character at most between tokens, as the server */
    if (pt_grammar_from_schema_ws(&g, j, 1, &err)) fail_msg("schema: %s", err.msg);
    json_decref(j);
    return pt_structured_new(g, e->tok);
}

typedef struct {
    int32_t toks[1000];
    int n;
} got;

static int collect(void *user, const pt_sample_result *r, const char *text, size_t len) {
    (void)text, (void)len;
    got *g = user;
    if (r && g->n < 1000) g->toks[g->n++] = r->id;
    return 0;
}

static pt_gen_stats run(pt_engine *e, pt_structured *so, float temp, bool jf, int spec_kind, got *g) {
    static const char *prompt = "Once upon a time";
    int32_t *ids = NULL;
    size_t n = 0;
    pt_err err = {{0}};
    if (pt_tokenize(e->tok, prompt, strlen(prompt), true, false, &ids, &n, &err)) fail_msg("%s", err.msg);
    pt_gen_params gp = {.max_tokens = 900, .add_procs = pt_structured_add_procs, .proc_arg = so};
    gp.sampling = pt_sampling_default();
    gp.sampling.temperature = temp;
    gp.sampling.seed = 7;
    gp.spec.kind = spec_kind;
    gp.spec.k = 4;
    gp.spec.ngram_min = 2, gp.spec.ngram_max = 4;
    gp.spec.jump_forward = jf;
    pt_gen_stats st;
    g->n = 0;
    if (pt_generate(e, ids, (int)n, &gp, collect, g, &st, &err)) fail_msg("generate: %s", err.msg);
    free(ids);
    return st;
}

/* The tokens, fed to a fresh matcher of the schema, make a complete
 * sentence (an end token only where it is complete). */
static bool follows_grammar(pt_engine *e, const pt_structured *so, const got *g) {
    (void)so;
    pt_gvocab *v = pt_gvocab_from_tokenizer(e->tok);
    pt_grammar *gr = NULL;
    pt_err err = {{0}};
    assert_int_equal(pt_grammar_from_schema_text(&gr, k_schema, strlen(k_schema), &err), 0); /* any whitespace */
    pt_gmatcher *m = pt_gmatcher_new(gr, v);
    bool ok = true;
    for (int i = 0; i < g->n && ok; i++)
        ok = pt_tokenizer_is_eog(e->tok, g->toks[i]) ? pt_gmatcher_is_accepting(m) : pt_gmatcher_accept(m, g->toks[i]);
    ok = ok && pt_gmatcher_is_accepting(m);
    pt_gmatcher_free(m);
    pt_grammar_free(gr);
    pt_gvocab_free(v);
    return ok;
}

static void test_greedy_identical_with_forced_tokens(void **state) {
    (void)state;
    pt_engine *e = open_engine();
    pt_structured *so = compile(e, k_schema);
    got plain, fast, both;
    pt_gen_stats a = run(e, so, 0, false, PT_SPEC_OFF, &plain);
    pt_gen_stats b = run(e, so, 0, true, PT_SPEC_OFF, &fast);
    assert_int_equal(a.n_forced, 0);
    assert_true(b.n_forced > 10); /* the keys are mostly forced */
    assert_int_equal(b.n_drafted, 0); /* forced tokens are not counted as speculation */
    assert_int_equal(plain.n, fast.n);
    assert_memory_equal(plain.toks, fast.toks, sizeof(int32_t) * (size_t)plain.n);
    assert_true(follows_grammar(e, so, &plain));
    /* with n-gram speculation too: still the same tokens */
    pt_gen_stats c = run(e, so, 0, true, PT_SPEC_NGRAM, &both);
    assert_true(c.n_forced > 0);
    assert_int_equal(plain.n, both.n);
    assert_memory_equal(plain.toks, both.toks, sizeof(int32_t) * (size_t)plain.n);
    pt_structured_free(so);
    pt_engine_close(e);
}

/* Sampling: forced tokens are verified with the sampler's distribution, so
 * the output still follows the grammar to its end. */
static void test_sampled_follows_grammar(void **state) {
    (void)state;
    pt_engine *e = open_engine();
    pt_structured *so = compile(e, k_schema);
    got g;
    pt_gen_stats st = run(e, so, 1.0f, true, PT_SPEC_OFF, &g);
    assert_true(st.n_forced > 0);
    assert_int_equal(st.finish, PT_FINISH_STOP);
    assert_true(follows_grammar(e, so, &g));
    pt_structured_free(so);
    pt_engine_close(e);
}

/* What the processor proposes: tokens spelling a proper prefix of the
 * forced bytes, each accepted by the grammar; the matcher does not move. */
static void test_forced_tokens_spell_forced_bytes(void **state) {
    (void)state;
    pt_engine *e = open_engine();
    pt_structured *so = compile(e, k_schema);
    pt_sampler *s = pt_sampler_new(NULL, e->model->cfg.vocab_size);
    pt_sampler_add_proc(s, pt_grammar_proc_new(so));
    const char *head = "{\"the_name_of_the_little_girl\":\"Lily\",\"";
    /* tokens that spell the head exactly (SentencePiece would put a space
     * in front): the longest at each point */
    pt_gvocab *v = pt_gvocab_from_tokenizer(e->tok);
    for (size_t at = 0; at < strlen(head);) {
        size_t len;
        int32_t id = pt_gvocab_longest_prefix(v, head + at, strlen(head) - at, &len);
        assert_true(id >= 0);
        pt_sampler_accept(s, id);
        at += len;
    }
    int32_t out[16];
    int k = pt_sampler_forced(s, out, 16);
    assert_true(k > 0);
    /* the forced text from here: the next key and its quote (then
     * whitespace or ':' is a choice) */
    const char *want = "the_number_of_her_friends\"";
    size_t at = 0;
    for (int i = 0; i < k; i++) {
        size_t len;
        const char *b = pt_token_bytes(e->tok, out[i], &len);
        assert_true(at + len < strlen(want)); /* a proper prefix: the last token left out */
        assert_memory_equal(b, want + at, len);
        at += len;
    }
    assert_int_equal(pt_sampler_forced(s, out, 2), PT_MIN(k, 2)); /* cap respected, nothing moved */
    assert_int_equal(pt_sampler_forced(s, out, 0), 0);
    pt_gvocab_free(v);
    pt_sampler_free(s);
    pt_structured_free(so);
    pt_engine_close(e);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_identical_with_forced_tokens),
        cmocka_unit_test(test_sampled_follows_grammar),
        cmocka_unit_test(test_forced_tokens_spell_forced_bytes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
