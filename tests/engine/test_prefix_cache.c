/*
 * test_prefix_cache.c - reuse of KV pages by content, on stories260K.
 *
 * The same prompt run again reuses its full pages (all but the page that
 * holds its last token) and produces the same tokens; a prompt sharing
 * only its first page reuses just that; another KV format never matches;
 * --prefix-cache off reuses nothing; and reuse through a preemption's
 * resume keeps the outputs identical.  Every page is free at the end
 * (cached pages count as free: they are evicted on demand).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <cmocka.h>

#include "engine/core.h"

#define MODEL PETREL_SOURCE_DIR "/models/stories260K.gguf"

typedef struct {
    int32_t ids[256];
    int n;
} out_tokens;

static int collect(void *user, const pt_sample_result *r, const char *text, size_t len) {
    (void)text, (void)len;
    out_tokens *o = user;
    if (r && o->n < 256) o->ids[o->n++] = r->id;
    return 0;
}

static pt_engine *open_engine_disk(const char *kv_quant, bool no_cache, const char *disk) {
    pt_engine_opts o = {.model_path = MODEL, .n_threads = 1, .kernels = "auto", .n_ctx = 256,
                        .kv_dtype = PT_F16, .kv_quant = kv_quant, .no_prefix_cache = no_cache,
                        .kv_disk = disk};
    pt_engine *e = NULL;
    pt_err err = {{0}};
    if (pt_engine_open(&e, &o, &err)) fail_msg("open: %s", err.msg);
    return e;
}

static pt_engine *open_engine(const char *kv_quant, bool no_cache) {
    return open_engine_disk(kv_quant, no_cache, NULL);
}

/* A 45-token prompt: BOS then a fixed pseudo-random walk over the vocab. */
static void prompt(int32_t *p, int n, int32_t variant_at, int32_t variant) {
    p[0] = 1;
    uint32_t x = 12345;
    for (int i = 1; i < n; i++) {
        x = x * 1103515245u + 12345u;
        p[i] = 3 + (int32_t)((x >> 16) % 500);
    }
    if (variant_at > 0) p[variant_at] = variant;
}

static pt_gen_stats run(pt_engine *e, const int32_t *p, int n, out_tokens *o) {
    pt_gen_params gp = {.max_tokens = 24, .ignore_eos = true};
    gp.sampling = pt_sampling_default();
    gp.sampling.temperature = 0;
    pt_gen_stats st;
    pt_err err = {{0}};
    o->n = 0;
    if (pt_generate(e, p, n, &gp, collect, o, &st, &err)) fail_msg("generate: %s", err.msg);
    return st;
}

static void check_reuse(const char *kv_quant) {
    pt_engine *e = open_engine(kv_quant, false);
    int32_t p[45], q[45];
    prompt(p, 45, 0, 0);
    prompt(q, 45, 20, 7); /* differs in the second page */
    out_tokens a, b, c, d;
    pt_gen_stats s1 = run(e, p, 45, &a);
    assert_int_equal(s1.n_cached, 0);
    pt_gen_stats s2 = run(e, p, 45, &b);
    /* pages 0-1 (positions 0..31) reused; page 2 holds the last prompt token */
    assert_int_equal(s2.n_cached, 32);
    assert_int_equal(a.n, b.n);
    assert_memory_equal(a.ids, b.ids, sizeof(int32_t) * (size_t)a.n);
    pt_gen_stats s3 = run(e, q, 45, &c);
    assert_int_equal(s3.n_cached, 16);
    /* the generated tokens' pages are keyed too: prompt + first output
     * tokens as a new prompt reuses more than the prompt's own pages */
    int32_t longer[69];
    memcpy(longer, p, sizeof p);
    memcpy(longer + 45, a.ids, sizeof(int32_t) * 24);
    pt_gen_stats s4 = run(e, longer, 69, &d);
    assert_int_equal(s4.n_cached, 64);
    assert_int_equal(pt_kv_free_pages(&e->kv), e->kv.cfg.n_pages);
    pt_engine_close(e);

    /* the same without the cache: same tokens, nothing reused */
    e = open_engine(kv_quant, true);
    out_tokens x;
    run(e, p, 45, &x);
    pt_gen_stats s5 = run(e, p, 45, &x);
    assert_int_equal(s5.n_cached, 0);
    assert_memory_equal(a.ids, x.ids, sizeof(int32_t) * (size_t)a.n);
    pt_engine_close(e);
}

static void test_reuse_f16(void **state) {
    (void)state;
    check_reuse(NULL);
}

static void test_reuse_turbo(void **state) {
    (void)state;
    check_reuse("turbo:k8v3:anydim");
}

/* Keys are salted with the KV format: two engines on the same model with
 * different formats never share a key, the same format always does. */
static void test_salt(void **state) {
    (void)state;
    pt_engine *a = open_engine(NULL, false), *b = open_engine("8", false), *c = open_engine(NULL, false);
    assert_true(a->cache_salt != b->cache_salt);
    assert_true(a->cache_salt == c->cache_salt);
    pt_engine_close(a), pt_engine_close(b), pt_engine_close(c);
}

/* The core, synchronously: requests that share cached prompt pages in a
 * pool too small for them all.  Preempting a sharer returns none of the
 * shared pages; the plan must know, or a step finds the pool short.
 * Every request finishes with the tokens it gets alone. */
typedef struct {
    out_tokens toks;
    pt_sched_stats st;
    bool done;
} core_result;

static int core_token(void *user, const pt_sample_result *r) {
    core_result *x = user;
    if (x->toks.n < 256) x->toks.ids[x->toks.n++] = r->id;
    return 0;
}

static void core_done(void *user, const pt_sched_stats *st) {
    core_result *x = user;
    x->st = *st;
    x->done = true;
}

static void test_shared_pages_under_preemption(void **state) {
    (void)state;
    pt_engine *e = open_engine(NULL, false);
    int32_t p[45];
    prompt(p, 45, 0, 0);
    out_tokens alone;
    pt_gen_params gp = {.max_tokens = 30, .ignore_eos = true};
    gp.sampling = pt_sampling_default();
    gp.sampling.temperature = 0;
    {
        pt_gen_stats st;
        pt_err err = {{0}};
        alone.n = 0;
        assert_int_equal(pt_generate(e, p, 45, &gp, collect, &alone, &st, &err), 0);
    }
    /* 7 pages: one request needs 5 alone (75 positions), two share 3 */
    pt_kv_cache_free(&e->kv);
    pt_err err = {{0}};
    assert_int_equal(pt_model_kv_init(e->model, &e->kv, 7 * 16, PT_F16, NULL, &err), 0);
    pt_core_opts co = {.max_seqs = 6, .max_prefill = 16};
    pt_core *c = pt_core_new(e, &co);
    enum { N = 6 };
    core_result res[N] = {0};
    int preempted = 0, cached = 0;
    for (int k = 0; k < N; k++) {
        pt_sched_job job = {.prompt = p, .n_prompt = 45, .params = gp, .on_token = core_token,
                            .on_done = core_done, .user = &res[k]};
        assert_int_equal(pt_core_check(c, &job, &err), 0);
        pt_core_add(c, &job, (uint64_t)k + 1);
        for (int s = 0; s < 5; s++) pt_core_step(c); /* staggered arrivals */
    }
    for (int guard = 0; pt_core_step(c) > 0; guard++) assert_true(guard < 100000);
    for (int k = 0; k < N; k++) {
        assert_true(res[k].done);
        if (res[k].st.finish != PT_FINISH_LENGTH) fail_msg("request %d: %s", k, res[k].st.error);
        assert_int_equal(res[k].toks.n, 30);
        assert_memory_equal(res[k].toks.ids, alone.ids, sizeof(int32_t) * 30);
        preempted += res[k].st.n_preempted;
        cached += res[k].st.n_cached;
    }
    print_message("%d preemptions, %d prompt positions reused over %d requests\n", preempted,
                  cached, N);
    assert_true(preempted > 0 && cached > 0);
    pt_core_free(c);
    assert_int_equal(pt_kv_free_pages(&e->kv), e->kv.cfg.n_pages);
    pt_engine_close(e);
}

/* The disk tier across "restarts" (engines closed and opened again): the
 * pages come back from disk with the same tokens out; a page file with a
 * flipped byte is caught by its checksum and recomputed instead. */
static void check_restart(const char *kv_quant) {
    char dir[256], cmd[600];
    snprintf(dir, sizeof dir, "%s/prefix-disk-%d", PETREL_BINARY_DIR, (int)getpid());
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
    int32_t p[45];
    prompt(p, 45, 0, 0);
    out_tokens cold, warm, damaged;
    pt_engine *e = open_engine_disk(kv_quant, false, dir);
    assert_int_equal(run(e, p, 45, &cold).n_cached, 0);
    pt_engine_close(e); /* writes the cached pages */

    e = open_engine_disk(kv_quant, false, dir);
    assert_int_equal(run(e, p, 45, &warm).n_cached, 32);
    assert_memory_equal(cold.ids, warm.ids, sizeof(int32_t) * 24);
    /* flip one byte of the second page's file */
    uint64_t key = pt_block_hash(pt_block_hash(0, p, 16, e->cache_salt), p + 16, 16, e->cache_salt);
    pt_engine_close(e);
    char path[600];
    snprintf(path, sizeof path, "%s/%016llx.kv", dir, (unsigned long long)key);
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    fseek(f, 200, SEEK_SET);
    int c = fgetc(f);
    fseek(f, 200, SEEK_SET);
    fputc(c ^ 1, f);
    fclose(f);
    e = open_engine_disk(kv_quant, false, dir);
    assert_int_equal(run(e, p, 45, &damaged).n_cached, 16); /* page 0 only */
    assert_memory_equal(cold.ids, damaged.ids, sizeof(int32_t) * 24);
    pt_engine_close(e);
    assert_int_equal(system(cmd), 0);
}

static void test_restart_f16(void **state) {
    (void)state;
    check_restart(NULL);
}

static void test_restart_turbo(void **state) {
    (void)state;
    check_restart("turbo:k8v3:anydim");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reuse_f16),
        cmocka_unit_test(test_reuse_turbo),
        cmocka_unit_test(test_salt),
        cmocka_unit_test(test_shared_pages_under_preemption),
        cmocka_unit_test(test_restart_f16),
        cmocka_unit_test(test_restart_turbo),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
