/*
 * test_spec.c - speculative decoding on stories260K: greedy output is
 * token-identical to plain decoding (llama.cpp's recorded continuations)
 * with the n-gram drafter, with Predicted Outputs, with an oracle drafter
 * at several acceptance rates and draft lengths, under continuous batching
 * and with a quantized KV cache; the drafted and accepted counts are
 * reported and the KV pool is whole at the end (rejected drafts' positions
 * rolled back).  A draft model (stories260K drafting for itself) gives
 * the same output with every draft accepted, alone and batched, and hands
 * back every page of both pools; a model of another vocabulary (a
 * transformers fixture) is refused as a draft, with the reason.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>

#include <cmocka.h>
#include <jansson.h>

#include "engine/bench.h"
#include "engine/scheduler.h"

#define MODEL PETREL_SOURCE_DIR "/models/stories260K.gguf"
#define FIXTURES PETREL_SOURCE_DIR "/tests/fixtures/"

static pt_engine *open_engine(const char *kv_quant, int n_ctx) {
    pt_engine_opts o = {.model_path = MODEL, .n_threads = 1, .kernels = "auto", .n_ctx = n_ctx,
                        .kv_dtype = PT_F32, .kv_quant = kv_quant};
    pt_engine *e = NULL;
    pt_err err = {{0}};
    if (pt_engine_open(&e, &o, &err)) fail_msg("open: %s", err.msg);
    return e;
}

static int ids(json_t *c, const char *key, int32_t *out) {
    json_t *a = json_object_get(c, key);
    for (size_t i = 0; i < json_array_size(a); i++)
        out[i] = (int32_t)json_integer_value(json_array_get(a, i));
    return (int)json_array_size(a);
}

typedef struct {
    int32_t toks[512];
    int n;
} got;

static int collect(void *user, const pt_sample_result *r, const char *text, size_t len) {
    (void)text, (void)len;
    got *g = user;
    if (r && g->n < 512) g->toks[g->n++] = r->id;
    return 0;
}

static pt_gen_stats generate(pt_engine *e, const int32_t *p, int n, int max, const pt_spec_params *sp,
                             got *g) {
    pt_gen_params gp = {.max_tokens = max, .spec = *sp};
    gp.sampling = pt_sampling_default();
    gp.sampling.temperature = 0;
    pt_gen_stats st;
    pt_err err = {{0}};
    g->n = 0;
    if (pt_generate(e, p, n, &gp, collect, g, &st, &err)) fail_msg("generate: %s", err.msg);
    return st;
}

/* The fixture's greedy continuations (llama.cpp's, or with a quantized
 * cache its plain output), with each drafter. */
static void check_goldens(const char *kv_quant) {
    json_error_t je;
    json_t *f = json_load_file(FIXTURES "stories260K-greedy.json", 0, &je);
    assert_non_null(f);
    pt_engine *e = open_engine(kv_quant, 256);
    json_t *cs = json_object_get(f, "cases");
    int drafted = 0;
    for (size_t c = 0; c < json_array_size(cs); c++) {
        int32_t prompt[64], want[64];
        int n = ids(json_array_get(cs, c), "prompt_ids", prompt);
        int nw = ids(json_array_get(cs, c), "continuation_ids", want);
        if (kv_quant) { /* a quantized cache has its own plain output */
            pt_spec_params off = {0};
            got plain;
            generate(e, prompt, n, nw, &off, &plain);
            memcpy(want, plain.toks, sizeof(int32_t) * (size_t)nw);
        }
        for (int k = 1; k <= 8; k *= 2) {
            pt_spec_params sp = {.kind = PT_SPEC_NGRAM, .k = k, .ngram_min = 1, .ngram_max = 3};
            got g;
            pt_gen_stats st = generate(e, prompt, n, nw, &sp, &g);
            assert_int_equal(g.n, nw);
            for (int t = 0; t < nw; t++)
                if (g.toks[t] != want[t]) fail_msg("case %zu k %d token %d: %d, llama.cpp %d", c, k, t, g.toks[t], want[t]);
            assert_true(st.n_accepted <= st.n_drafted);
            drafted += st.n_drafted;
            /* Predicted Outputs: the answer itself, with two tokens changed */
            int32_t pred[64];
            memcpy(pred, want, sizeof(int32_t) * (size_t)nw);
            pred[5] = 3, pred[20] = 3;
            sp.prediction = pred, sp.n_prediction = nw;
            st = generate(e, prompt, n, nw, &sp, &g);
            assert_memory_equal(g.toks, want, sizeof(int32_t) * (size_t)nw);
            /* most of it was predicted right: each of the two wrong tokens
             * costs the rest of its draft */
            if (!(st.n_accepted >= nw / 4 && st.n_accepted >= 0.5 * st.n_drafted))
                fail_msg("case %zu k %d: %d of %d drafts accepted", c, k, st.n_accepted, st.n_drafted);
        }
    }
    assert_true(drafted > 0);
    assert_int_equal(pt_kv_free_pages(&e->kv), e->kv.cfg.n_pages);
    pt_engine_close(e);
    json_decref(f);
}

static void test_goldens_f32(void **state) {
    (void)state;
    check_goldens(NULL);
}

static void test_goldens_turbo(void **state) {
    (void)state;
    check_goldens("turbo:k8v3:anydim");
}

/* The oracle: whatever it proposes, the output is the plain one
 * (pt_bench_spec fails otherwise); acceptance follows A; a hopeless
 * drafter backs off. */
static void test_oracle(void **state) {
    (void)state;
    pt_engine *e = open_engine(NULL, 512);
    float accept[] = {0.0f, 0.5f, 0.9f, 1.0f};
    int ks[] = {1, 4, 8};
    for (size_t a = 0; a < PT_ARRAY_LEN(accept); a++)
        for (size_t k = 0; k < PT_ARRAY_LEN(ks); k++) {
            pt_spec_params sp = {.kind = PT_SPEC_ORACLE, .k = ks[k], .oracle_accept = accept[a]};
            pt_bench_spec_run r;
            pt_err err = {{0}};
            if (pt_bench_spec(e, 17, 200, &sp, &r, &err)) fail_msg("A %.2f k %d: %s", accept[a], ks[k], err.msg);
            double acc = r.n_drafted ? (double)r.n_accepted / r.n_drafted : 0;
            if (accept[a] == 1.0f) assert_true(acc == 1.0);
            if (accept[a] == 0.0f) assert_true(acc < 0.05); /* a corrupted token may still be right */
            /* a drafter that is always wrong pauses, doubling each time: a
             * few drafts in 200 tokens, not one per step */
            if (accept[a] == 0.0f && r.n_drafted >= 40)
                fail_msg("A 0 k %d: %d drafts in 200 tokens", ks[k], r.n_drafted);
            if (accept[a] == 1.0f && ks[k] == 8) assert_true(r.steps_spec < 200 / 4);
        }
    assert_int_equal(pt_kv_free_pages(&e->kv), e->kv.cfg.n_pages);
    pt_engine_close(e);
}

/* Under continuous batching: speculating and plain jobs share steps, and
 * each produces its alone-tokens. */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int32_t toks[64];
    int n;
    bool done;
    pt_sched_stats st;
} job_out;

static int job_token(void *user, const pt_sample_result *r) {
    job_out *o = user;
    if (o->n < 64) o->toks[o->n++] = r->id;
    return 0;
}

static void job_done(void *user, const pt_sched_stats *st) {
    job_out *o = user;
    pthread_mutex_lock(&o->mu);
    o->st = *st;
    o->done = true;
    pthread_cond_signal(&o->cv);
    pthread_mutex_unlock(&o->mu);
}

static void test_batched(void **state) {
    (void)state;
    json_error_t je;
    json_t *f = json_load_file(FIXTURES "stories260K-greedy.json", 0, &je);
    json_t *cs = json_object_get(f, "cases");
    pt_engine *e = open_engine(NULL, 128);
    pt_kv_cache_free(&e->kv);
    pt_err err = {{0}};
    assert_int_equal(pt_model_kv_init(e->model, &e->kv, 128 * 8, PT_F32, NULL, &err), 0);
    pt_sched *s;
    pt_sched_opts o = {.max_seqs = 8, .n_ctx = 128};
    assert_int_equal(pt_sched_start(&s, e, &o, &err), 0);
    enum { N = 8 };
    job_out out[N];
    for (int j = 0; j < N; j++) {
        memset(&out[j], 0, sizeof out[j]);
        pthread_mutex_init(&out[j].mu, NULL);
        pthread_cond_init(&out[j].cv, NULL);
        int32_t prompt[64];
        int n = ids(json_array_get(cs, (size_t)j % json_array_size(cs)), "prompt_ids", prompt);
        pt_sched_job job = {.prompt = prompt, .n_prompt = n, .on_token = job_token,
                            .on_done = job_done, .user = &out[j]};
        job.params.sampling = pt_sampling_default();
        job.params.sampling.temperature = 0;
        job.params.max_tokens = 48;
        if (j % 2 == 0)
            job.params.spec = (pt_spec_params){.kind = PT_SPEC_NGRAM, .k = 2 + j, .ngram_min = 1,
                                               .ngram_max = 2};
        assert_true(pt_sched_submit(s, &job, &err) > 0);
    }
    for (int j = 0; j < N; j++) {
        pthread_mutex_lock(&out[j].mu);
        while (!out[j].done) pthread_cond_wait(&out[j].cv, &out[j].mu);
        pthread_mutex_unlock(&out[j].mu);
        int32_t want[64];
        int nw = ids(json_array_get(cs, (size_t)j % json_array_size(cs)), "continuation_ids", want);
        assert_int_equal(out[j].n, nw);
        assert_memory_equal(out[j].toks, want, sizeof(int32_t) * (size_t)nw);
        if (j % 2) assert_int_equal(out[j].st.n_drafted, 0);
    }
    pt_sched_stop(s);
    assert_int_equal(pt_kv_free_pages(&e->kv), e->kv.cfg.n_pages);
    pt_engine_close(e);
    json_decref(f);
}

/* stories260K drafting for itself: the draft's greedy tokens are the
 * target's, so every draft is accepted and the output is llama.cpp's. */
static pt_engine *with_self_draft(int n_ctx, const char *draft_kv_quant) {
    pt_engine *e = open_engine(NULL, n_ctx), *d = open_engine(draft_kv_quant, n_ctx);
    pt_err err = {{0}};
    if (pt_engine_attach_draft(e, d, &err)) fail_msg("attach: %s", err.msg);
    return e;
}

static void check_draft_model(const char *draft_kv_quant) {
    json_error_t je;
    json_t *f = json_load_file(FIXTURES "stories260K-greedy.json", 0, &je);
    json_t *cs = json_object_get(f, "cases");
    pt_engine *e = with_self_draft(256, draft_kv_quant);
    long drafted = 0, accepted = 0;
    for (size_t c = 0; c < json_array_size(cs); c++) {
        int32_t prompt[64], want[64];
        int n = ids(json_array_get(cs, c), "prompt_ids", prompt);
        int nw = ids(json_array_get(cs, c), "continuation_ids", want);
        for (int k = 1; k <= 8; k *= 2) {
            pt_spec_params sp = {.kind = PT_SPEC_DRAFT, .k = k};
            got g;
            pt_gen_stats st = generate(e, prompt, n, nw, &sp, &g);
            assert_int_equal(g.n, nw);
            assert_memory_equal(g.toks, want, sizeof(int32_t) * (size_t)nw);
            /* every step but the prefill's drafts (the last may be cut by max_tokens) */
            if (nw > 4) assert_true(st.n_drafted >= (nw - 1) / (k + 1));
            if (!draft_kv_quant && st.n_accepted != st.n_drafted)
                fail_msg("case %zu k %d: %d of %d accepted", c, k, st.n_accepted, st.n_drafted);
            drafted += st.n_drafted, accepted += st.n_accepted;
        }
    }
    print_message("draft model (its KV %s): %ld of %ld drafts accepted\n",
                  draft_kv_quant ? draft_kv_quant : "f32", accepted, drafted);
    /* a draft with a coarser cache is wrong now and then: its rejected
     * positions were rolled back, or later drafts would go astray */
    if (draft_kv_quant) assert_true(accepted < drafted && accepted > drafted / 4);
    assert_int_equal(pt_kv_free_pages(&e->kv), e->kv.cfg.n_pages);
    assert_int_equal(pt_kv_free_pages(&e->draft->kv), e->draft->kv.cfg.n_pages);
    pt_engine_close(e);
    json_decref(f);
}

static void test_draft_model(void **state) {
    (void)state;
    check_draft_model(NULL);
}

/* The draft's KV in 4 bits: a draft that is sometimes wrong. */
static void test_draft_model_rejects(void **state) {
    (void)state;
    check_draft_model("4");
}

/* Batched: draft-model, n-gram and plain jobs in the same steps. */
static void test_draft_model_batched(void **state) {
    (void)state;
    json_error_t je;
    json_t *f = json_load_file(FIXTURES "stories260K-greedy.json", 0, &je);
    json_t *cs = json_object_get(f, "cases");
    pt_engine *e = with_self_draft(128, NULL);
    pt_kv_cache_free(&e->kv);
    pt_err err = {{0}};
    assert_int_equal(pt_model_kv_init(e->model, &e->kv, 128 * 8, PT_F32, NULL, &err), 0);
    pt_sched *s;
    pt_sched_opts o = {.max_seqs = 8, .n_ctx = 128};
    assert_int_equal(pt_sched_start(&s, e, &o, &err), 0);
    enum { N = 9 };
    job_out out[N];
    for (int j = 0; j < N; j++) {
        memset(&out[j], 0, sizeof out[j]);
        pthread_mutex_init(&out[j].mu, NULL);
        pthread_cond_init(&out[j].cv, NULL);
        int32_t prompt[64];
        int n = ids(json_array_get(cs, (size_t)j % json_array_size(cs)), "prompt_ids", prompt);
        pt_sched_job job = {.prompt = prompt, .n_prompt = n, .on_token = job_token,
                            .on_done = job_done, .user = &out[j]};
        job.params.sampling = pt_sampling_default();
        job.params.sampling.temperature = 0;
        job.params.max_tokens = 48;
        int kind[] = {PT_SPEC_DRAFT, PT_SPEC_NGRAM, PT_SPEC_OFF};
        job.params.spec = (pt_spec_params){.kind = kind[j % 3], .k = 1 + j, .ngram_min = 1, .ngram_max = 2};
        assert_true(pt_sched_submit(s, &job, &err) > 0);
    }
    for (int j = 0; j < N; j++) {
        pthread_mutex_lock(&out[j].mu);
        while (!out[j].done) pthread_cond_wait(&out[j].cv, &out[j].mu);
        pthread_mutex_unlock(&out[j].mu);
        int32_t want[64];
        int nw = ids(json_array_get(cs, (size_t)j % json_array_size(cs)), "continuation_ids", want);
        assert_int_equal(out[j].n, nw);
        assert_memory_equal(out[j].toks, want, sizeof(int32_t) * (size_t)nw);
        if (j % 3 == 0) {
            assert_true(out[j].st.n_drafted > 0);
            assert_int_equal(out[j].st.n_accepted, out[j].st.n_drafted);
        }
        if (j % 3 == 2) assert_int_equal(out[j].st.n_drafted, 0);
    }
    pt_sched_stop(s);
    assert_int_equal(pt_kv_free_pages(&e->kv), e->kv.cfg.n_pages);
    assert_int_equal(pt_kv_free_pages(&e->draft->kv), e->draft->kv.cfg.n_pages);
    pt_engine_close(e);
    json_decref(f);
}

/* A transformers fixture (320 tokens) cannot draft for stories260K (512). */
static void test_draft_vocab_refused(void **state) {
    (void)state;
    pt_engine *e = open_engine(NULL, 64), *d = NULL;
    pt_engine_opts o = {.model_path = FIXTURES "hf/llama2", .n_threads = 1, .kernels = "auto",
                        .n_ctx = 64, .kv_dtype = PT_F32, .no_tokenizer = true};
    pt_err err = {{0}};
    if (pt_engine_open(&d, &o, &err)) fail_msg("open: %s", err.msg);
    assert_int_equal(pt_engine_attach_draft(e, d, &err), -1);
    if (!strstr(err.msg, "vocabulary of 320 tokens, the model 512"))
        fail_msg("message: %s", err.msg);
    assert_null(e->draft);
    pt_engine_close(d);
    pt_engine_close(e);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_goldens_f32),
        cmocka_unit_test(test_goldens_turbo),
        cmocka_unit_test(test_oracle),
        cmocka_unit_test(test_batched),
        cmocka_unit_test(test_draft_model),
        cmocka_unit_test(test_draft_model_rejects),
        cmocka_unit_test(test_draft_model_batched),
        cmocka_unit_test(test_draft_vocab_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
