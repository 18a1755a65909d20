/*
 * test_kv_window_engine.c - the engine over a KV cache with a window
 * group (kvcache.h), on the Gemma 2 transformers fixture (window 8).
 *
 * The engine is opened for one sequence with 32-row steps, so its window
 * pool holds one sequence's window (4 pages of 16) while group 0 holds
 * the context (16 pages).  Asserted: greedy output over 200 positions
 * starts with transformers' 32 tokens; a follow-up request whose prompt is
 * the whole first conversation reuses its pages from the prefix cache
 * (window pages included) and answers exactly as an engine without the
 * prefix cache; speculative decoding (oracle drafts with rejections, and a
 * draft model with its own windowed cache) gives the plain output; the
 * core runs at most the sequences the window pool holds; every page of
 * both pools is back at the end; --kv-budget pays for the windows once and
 * then counts only the full-attention layers per position.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "engine/bench.h"
#include "engine/core.h"
#include "engine/draft.h"

#define MODEL PETREL_SOURCE_DIR "/tests/fixtures/hf/gemma2"

typedef struct {
    int32_t ids[512];
    int n;
    int finish;
} out_tokens;

static void done(void *user, const pt_sched_stats *st) {
    out_tokens *o = user;
    o->finish = st->finish;
    if (st->finish == PT_FINISH_NONE) print_message("request failed: %s\n", st->error);
}

static int collect(void *user, const pt_sample_result *r, const char *text, size_t len) {
    (void)text, (void)len;
    out_tokens *o = user;
    if (r && o->n < 512) o->ids[o->n++] = r->id;
    return 0;
}

static pt_engine *open_engine(bool no_cache) {
    pt_engine_opts o = {.model_path = MODEL, .n_threads = 1, .kernels = "auto", .n_ctx = 256,
                        .kv_dtype = PT_F32, .no_prefix_cache = no_cache, .no_tokenizer = true,
                        .max_batch = 32, .max_seqs = 1};
    pt_engine *e = NULL;
    pt_err err = {{0}};
    if (pt_engine_open(&e, &o, &err)) fail_msg("open: %s", err.msg);
    assert_true(e->kv.grouped);
    assert_int_equal(pt_kv_max_seqs(&e->kv), 1);
    assert_true(e->kv.cfg.window_pages < e->kv.cfg.n_pages);
    return e;
}

static pt_gen_stats gen(pt_engine *e, const int32_t *p, int n, int max, out_tokens *o) {
    pt_gen_params gp = {.max_tokens = max};
    gp.sampling = pt_sampling_default();
    gp.sampling.temperature = 0;
    pt_gen_stats st;
    pt_err err = {{0}};
    o->n = 0;
    if (pt_generate(e, p, n, &gp, collect, o, &st, &err)) fail_msg("generate: %s", err.msg);
    return st;
}

static void all_free(const pt_engine *e) {
    assert_int_equal(pt_kv_free_pages(&e->kv), e->kv.cfg.n_pages);
    assert_int_equal(e->kv.wpool.n_free, e->kv.cfg.window_pages);
}

static void test_greedy_and_prefix(void **state) {
    (void)state;
    json_error_t je;
    json_t *r = json_load_file(MODEL "/reference.json", 0, &je);
    assert_non_null(r);
    json_t *p0 = json_array_get(json_object_get(r, "prompts"), 0);
    json_t *t = json_object_get(p0, "tokens"), *g = json_object_get(p0, "greedy");
    int32_t conv[512];
    int n = (int)json_array_size(t);
    for (int i = 0; i < n; i++) conv[i] = (int32_t)json_integer_value(json_array_get(t, (size_t)i));
    pt_engine *e = open_engine(false), *plain = open_engine(true);
    out_tokens o;
    gen(e, conv, n, 200 - n, &o);
    assert_int_equal(o.n, 200 - n);
    for (int i = 0; i < 32; i++)
        assert_int_equal(o.ids[i], (int32_t)json_integer_value(json_array_get(g, (size_t)i)));
    json_decref(r);
    /* the conversation goes on: its 200 positions come back from the cache */
    memcpy(conv + n, o.ids, sizeof(int32_t) * (size_t)o.n);
    n += o.n;
    out_tokens a, b;
    pt_gen_stats st = gen(e, conv, n, 40, &a);
    if (st.n_cached < n - 2 * 16) fail_msg("%d of %d prompt positions reused", st.n_cached, n);
    pt_gen_stats sp = gen(plain, conv, n, 40, &b);
    assert_int_equal(sp.n_cached, 0);
    assert_int_equal(a.n, b.n);
    assert_memory_equal(a.ids, b.ids, sizeof(int32_t) * (size_t)a.n);
    all_free(e);
    all_free(plain);
    pt_engine_close(e);
    pt_engine_close(plain);
}

/* Verify steps roll back drafts past the window's recycling: the output
 * is the plain one (pt_bench_spec fails otherwise). */
static void test_spec(void **state) {
    (void)state;
    pt_engine *e = open_engine(true);
    float accept[] = {0.3f, 0.8f};
    for (int a = 0; a < 2; a++) {
        pt_spec_params sp = {.kind = PT_SPEC_ORACLE, .k = 4, .oracle_accept = accept[a]};
        pt_bench_spec_run run;
        pt_err err = {{0}};
        if (pt_bench_spec(e, 40, 150, &sp, &run, &err)) fail_msg("A %.1f: %s", accept[a], err.msg);
        assert_true(run.n_drafted > run.n_accepted); /* rejections happened */
        assert_true(run.n_accepted > 0);
    }
    /* a draft model with a windowed cache of its own, rolled back in step */
    pt_engine *d = open_engine(true);
    pt_err err = {{0}};
    if (pt_engine_attach_draft(e, d, &err)) fail_msg("%s", err.msg);
    assert_int_equal(d->kv.cfg.window_slack, 16);
    pt_spec_params sp = {.kind = PT_SPEC_DRAFT, .k = 4};
    pt_bench_spec_run run;
    if (pt_bench_spec(e, 40, 150, &sp, &run, &err)) fail_msg("draft model: %s", err.msg);
    assert_true(run.n_accepted > 0);
    all_free(e);
    all_free(d);
    pt_engine_close(e); /* closes its draft */
}

/* Asked for more sequences than the window pool holds, the core runs as
 * many as it holds: every request still completes. */
static void test_max_seqs_clamped(void **state) {
    (void)state;
    pt_engine *e = open_engine(true);
    pt_core_opts co = {.max_seqs = 4};
    pt_core *c = pt_core_new(e, &co);
    int32_t prompt[20];
    for (int i = 0; i < 20; i++) prompt[i] = 3 + i * 7;
    out_tokens outs[3];
    pt_sched_job jobs[3];
    for (int j = 0; j < 3; j++) {
        outs[j].n = 0;
        jobs[j] = (pt_sched_job){.prompt = prompt, .n_prompt = 20, .user = &outs[j]};
        jobs[j].params.sampling = pt_sampling_default();
        jobs[j].params.sampling.temperature = 0;
        jobs[j].params.max_tokens = 30;
        jobs[j].params.ignore_eos = true;
        jobs[j].on_done = done;
        outs[j].finish = -1;
    }
    pt_err err = {{0}};
    for (int j = 0; j < 3; j++) {
        if (pt_core_check(c, &jobs[j], &err)) fail_msg("%s", err.msg);
        pt_core_add(c, &jobs[j], (uint64_t)j + 1);
    }
    int steps = 0;
    while (pt_core_step(c) > 0) assert_true(++steps < 1000);
    pt_core_free(c);
    for (int j = 0; j < 3; j++) assert_int_equal(outs[j].finish, PT_FINISH_LENGTH);
    all_free(e);
    pt_engine_close(e);
}

/* --kv-budget with a window group: the windows are paid for once, then
 * each position costs only the full-attention layers, so the budget buys
 * about twice the positions of an all-global count here (2 of 4 layers
 * slide), and what is allocated stays within it. */
static void test_budget(void **state) {
    (void)state;
    pt_engine_opts o = {.model_path = MODEL, .n_threads = 1, .kernels = "auto", .n_ctx = 256,
                        .kv_dtype = PT_F32, .no_tokenizer = true, .max_batch = 32,
                        .max_seqs = 1, .kv_budget = "1M"};
    pt_engine *e = NULL;
    pt_err err = {{0}};
    if (pt_engine_open(&e, &o, &err)) fail_msg("open: %s", err.msg);
    const pt_kv_cache *kv = &e->kv;
    size_t all = pt_kv_bytes_per_token(&kv->cfg), total = 0;
    for (int l = 0; l < kv->cfg.n_layers; l++)
        total += pt_kv_layer_windowed(kv, l) ? kv->wk_bytes + kv->wv_bytes : kv->k_bytes + kv->v_bytes;
    int positions = kv->cfg.n_pages * kv->cfg.page_size;
    print_message("1 MiB buys %d positions (%zu bytes allocated); all-global: %zu\n", positions,
                  total, ((size_t)1 << 20) / all);
    assert_true(kv->grouped);
    assert_true(total <= (size_t)1 << 20);
    assert_true(positions > (int)(((size_t)1 << 20) / all * 3 / 2));
    pt_engine_close(e);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_and_prefix),
        cmocka_unit_test(test_spec),
        cmocka_unit_test(test_max_seqs_clamped),
        cmocka_unit_test(test_budget),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
