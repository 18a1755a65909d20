/*
 * test_kv_window.c - the KV cache's window group (kvcache.h, "Cache
 * groups") on the Gemma 2 and Gemma 3 transformers fixtures, whose
 * sliding-window layers see 8 and 12 positions.
 *
 * The same tokens run through two caches: one group keeping every page
 * (the full-cache path), and a window group of 4-position pages whose pool
 * holds two sequences' windows.  Over 170 positions (about 20 windows)
 * the logits must be bit-identical at every position, the first 32 greedy
 * tokens must be transformers', the window group must hold at most
 * ceil(window / page) + 1 pages per sequence while group 0 grows with the
 * context, and its pool must end whole.  Rollbacks: a verify-style step
 * (k drafts written, one accepted) keeps its window; one deeper than the
 * slack drops the sequence to 0; with slack it does not.  The prefix
 * cache: a sequence adopting published pages by key gets its window pages
 * back and continues bit-identically.  Last, the resident bytes at 32k
 * context against an all-global cache of the same shape, for the
 * fixtures and for Gemma-2-9B's layer pattern.
 */
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
#define PS 4      /* positions per page of the windowed cache */
#define N_POS 170 /* positions generated */
#define ROWS 64   /* rows a sequence writes per call at most */

typedef struct fx {
    pt_backend *be;
    pt_model *m;
    pt_kv_cache full, win;
    int window, vocab;
    int32_t prompt[64], greedy[32];
    int n_prompt;
} fx;

static void load_ref(fx *f, const char *name) {
    char path[512];
    snprintf(path, sizeof path, HF_DIR "%s/reference.json", name);
    json_error_t je;
    json_t *r = json_load_file(path, 0, &je);
    if (!r) fail_msg("%s: %s", path, je.text);
    json_t *p = json_array_get(json_object_get(r, "prompts"), 0);
    json_t *t = json_object_get(p, "tokens"), *g = json_object_get(p, "greedy");
    f->n_prompt = (int)json_array_size(t);
    assert_true(f->n_prompt > 0 && f->n_prompt <= 64 && json_array_size(g) == 32);
    for (int i = 0; i < f->n_prompt; i++) f->prompt[i] = (int32_t)json_integer_value(json_array_get(t, (size_t)i));
    for (int i = 0; i < 32; i++) f->greedy[i] = (int32_t)json_integer_value(json_array_get(g, (size_t)i));
    json_decref(r);
}

/* The full cache by hand (window 0: one group) and the windowed one. */
static void setup(fx *f, const char *name, int slack) {
    memset(f, 0, sizeof *f);
    pt_err err = {{0}};
    f->be = pt_backend_cpu_new(1, "auto", &err);
    assert_non_null(f->be);
    char dir[512];
    snprintf(dir, sizeof dir, HF_DIR "%s", name);
    pt_model_opts o = {.backend = f->be, .max_batch = ROWS};
    if (pt_model_load(&f->m, dir, &o, &err)) fail_msg("%s: %s", name, err.msg);
    const pt_model_config *c = &f->m->cfg;
    f->vocab = c->vocab_size;
    pt_kv_config kc = {.n_layers = c->n_layers, .n_kv_heads = c->n_kv_heads, .head_dim = c->head_dim,
                       .page_size = PS, .n_pages = 2 * (N_POS + 40) / PS, .dtype = PT_F32};
    if (pt_kv_cache_init(&f->full, f->be, &kc, &err)) fail_msg("%s", err.msg);
    assert_false(f->full.grouped);
    for (int l = 0; l < c->n_layers; l++)
        if (f->m->plan[l].mixer == PT_MIX_ATTN_SWA) {
            kc.window = f->m->plan[l].window;
            kc.window_layers[l / 64] |= 1ull << (l % 64);
        }
    f->window = kc.window;
    assert_true(f->window > 0 && f->window < 16);
    kc.window_rows = ROWS, kc.window_slack = slack;
    kc.window_pages = 2 * ((kc.window - 1 + slack + ROWS + PS - 1) / PS + 1); /* two sequences */
    if (pt_kv_cache_init(&f->win, f->be, &kc, &err)) fail_msg("%s", err.msg);
    assert_true(f->win.grouped);
    assert_int_equal(pt_kv_max_seqs(&f->win), 2);
    load_ref(f, name);
}

static void teardown(fx *f) {
    /* every page of both pools back (cached ones count as free) */
    assert_int_equal(pt_kv_free_pages(&f->full), f->full.cfg.n_pages);
    assert_int_equal(pt_kv_free_pages(&f->win), f->win.cfg.n_pages);
    assert_int_equal(f->win.wpool.n_free, f->win.cfg.window_pages);
    pt_kv_cache_free(&f->full);
    pt_kv_cache_free(&f->win);
    pt_model_free(f->m);
    f->be->ops->destroy(f->be);
}

/* Runs tokens at positions [pos, pos + n) of one sequence; the last row's logits to out. */
static void run(fx *f, pt_kv_cache *kv, pt_kv_seq *s, const int32_t *tok, int pos, int n, float *out) {
    int32_t p[ROWS], sq[ROWS] = {0};
    bool want[ROWS] = {0};
    assert_true(n <= ROWS);
    for (int i = 0; i < n; i++) p[i] = pos + i;
    want[n - 1] = true;
    pt_kv_seq *seqs[1] = {s};
    pt_batch b = {n, (int32_t *)tok, p, sq, want, 1, seqs};
    pt_err err = {{0}};
    if (pt_model_run(f->m, kv, &b, out, &err)) fail_msg("position %d: %s", pos, err.msg);
}

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* Window pages a decoding sequence may hold: those covering the window's
 * positions (and the slack's), one more where they straddle a page
 * boundary. */
static int window_bound(const fx *f) {
    return (f->window + f->win.cfg.window_slack + PS - 1) / PS + 1;
}

/* Greedy over N_POS positions in both caches, logits compared bitwise.
 * Keys are published as pages fill (as core.c does) when keys != NULL.
 * Leaves both sequences alive; returns the tokens in toks[N_POS]. */
static void generate(fx *f, pt_kv_seq *a, pt_kv_seq *w, int32_t *toks, float *logits_at,
                     uint64_t *keys) {
    float *la = malloc(sizeof(float) * (size_t)f->vocab), *lw = malloc(sizeof(float) * (size_t)f->vocab);
    memcpy(toks, f->prompt, sizeof(int32_t) * (size_t)f->n_prompt);
    int pos = 0, n = f->n_prompt, published = 0;
    while (pos + n <= N_POS) {
        run(f, &f->full, a, toks + pos, pos, n, la);
        run(f, &f->win, w, toks + pos, pos, n, lw);
        pos += n;
        if (memcmp(la, lw, sizeof(float) * (size_t)f->vocab) != 0)
            fail_msg("position %d: the windowed cache's logits differ from the full cache's", pos - 1);
        if (logits_at) memcpy(logits_at + (size_t)(pos - 1) * f->vocab, lw, sizeof(float) * (size_t)f->vocab);
        int g = pos - f->n_prompt; /* greedy tokens so far */
        if (g < 32 && argmax(lw, f->vocab) != f->greedy[g])
            fail_msg("greedy token %d is %d, transformers gives %d", g, argmax(lw, f->vocab), f->greedy[g]);
        if (pos < N_POS) toks[pos] = argmax(lw, f->vocab);
        n = 1;
        for (; keys && (published + 1) * PS <= pos; published++) {
            keys[published] = pt_block_hash(published ? keys[published - 1] : 0, toks + published * PS, PS, 7);
            pt_kv_seq_set_key(&f->win, w, published, keys[published]);
        }
        /* group 0 grows with the context, the window group does not */
        assert_int_equal(pt_kv_seq_group_pages(&f->win, w, 0), (pos + PS - 1) / PS);
        if (pos > f->n_prompt && pt_kv_seq_group_pages(&f->win, w, 1) > window_bound(f))
            fail_msg("position %d: %d window pages held, bound %d", pos,
                     pt_kv_seq_group_pages(&f->win, w, 1), window_bound(f));
        assert_int_equal(f->win.cfg.window_pages - f->win.wpool.n_free, pt_kv_seq_group_pages(&f->win, w, 1));
    }
    assert_true(N_POS / f->window >= 10); /* well past several windows */
    free(la), free(lw);
}

static void check_generate(const char *name) {
    fx f;
    setup(&f, name, 0);
    pt_kv_seq a = {0}, w = {0};
    int32_t toks[N_POS];
    generate(&f, &a, &w, toks, NULL, NULL);
    assert_true(w.wlo > 0); /* pages were given back */
    pt_kv_seq_release(&f.full, &a);
    pt_kv_seq_release(&f.win, &w);
    teardown(&f);
}

static void test_gemma2_window(void **state) {
    (void)state;
    check_generate("gemma2");
}

static void test_gemma3_window(void **state) {
    (void)state;
    check_generate("gemma3_text");
}

/* A verify step: k drafts written after the last real token, one
 * accepted, the rest rolled back; the window survives and the next
 * logits still match the full cache's.  Then a rollback deeper than the
 * slack drops the sequence to nothing (the caller recomputes). */
static void check_rollback(const char *name, int slack) {
    fx f;
    setup(&f, name, slack);
    pt_kv_seq a = {0}, w = {0};
    int32_t toks[N_POS];
    generate(&f, &a, &w, toks, NULL, NULL);
    float *la = malloc(sizeof(float) * (size_t)f.vocab), *lw = malloc(sizeof(float) * (size_t)f.vocab);
    int n = a.n_tokens; /* N_POS */
    int32_t drafts[5] = {toks[n - 1], 3, 4, 5, 6};
    run(&f, &f.win, &w, drafts + 1, n, 4, lw); /* four drafts */
    pt_kv_seq_truncate(&f.win, &w, n + 1);     /* one accepted */
    assert_int_equal(w.n_tokens, n + 1);
    run(&f, &f.full, &a, drafts + 1, n, 4, la); /* the same rows, so the same K/V bits */
    pt_kv_seq_truncate(&f.full, &a, n + 1);
    int32_t next = 9;
    run(&f, &f.full, &a, &next, n + 1, 1, la);
    run(&f, &f.win, &w, &next, n + 1, 1, lw);
    assert_memory_equal(la, lw, sizeof(float) * (size_t)f.vocab);
    /* back by window + slack + a page: within the slack survives, beyond drops all */
    int back = f.window + PS;
    pt_kv_seq_truncate(&f.win, &w, w.n_tokens - back);
    if (slack >= back) {
        assert_int_equal(w.n_tokens, n + 2 - back);
        pt_kv_seq_truncate(&f.full, &a, n + 2 - back);
        int32_t t = 11;
        run(&f, &f.full, &a, &t, a.n_tokens, 1, la);
        run(&f, &f.win, &w, &t, w.n_tokens, 1, lw);
        assert_memory_equal(la, lw, sizeof(float) * (size_t)f.vocab);
    } else {
        assert_int_equal(w.n_tokens, 0);
        assert_int_equal(w.n_pages, 0);
    }
    pt_kv_seq_release(&f.full, &a);
    pt_kv_seq_release(&f.win, &w);
    free(la), free(lw);
    teardown(&f);
}

static void test_rollback(void **state) {
    (void)state;
    check_rollback("gemma2", 0);
    check_rollback("gemma3_text", 0);
    check_rollback("gemma2", 24);
}

/* Published pages come back by key with the window pages the last one
 * needs, and the adopting sequence goes on bit-identically. */
static void test_prefix_adopt(void **state) {
    (void)state;
    fx f;
    setup(&f, "gemma2", 0);
    pt_kv_seq a = {0}, w = {0}, w2 = {0};
    int32_t toks[N_POS];
    uint64_t keys[N_POS / PS];
    float *logits = malloc(sizeof(float) * (size_t)N_POS * f.vocab);
    float *lw = malloc(sizeof(float) * (size_t)f.vocab);
    generate(&f, &a, &w, toks, logits, keys);
    int full_pages = (N_POS - 1) / PS; /* never the page of the last token */
    pt_kv_seq_release(&f.win, &w);     /* its keyed pages stay cached */
    /* the whole run comes back: its last page needs only the window pages
     * held at the release, which stay cached */
    assert_int_equal(pt_kv_prefix_window(&f.win, keys, full_pages), full_pages);
    uint64_t bad[N_POS / PS];
    memcpy(bad, keys, sizeof bad);
    bad[full_pages - 1] ^= 1; /* the last window page unknown: the run is shorter */
    assert_true(pt_kv_prefix_window(&f.win, bad, full_pages) < full_pages);
    int got = pt_kv_seq_adopt(&f.win, &w2, keys, full_pages);
    assert_int_equal(got, full_pages);
    assert_int_equal(w2.n_tokens, full_pages * PS);
    assert_true(pt_kv_seq_group_pages(&f.win, &w2, 1) <= window_bound(&f));
    for (int pos = w2.n_tokens; pos < N_POS; pos++) {
        run(&f, &f.win, &w2, toks + pos, pos, 1, lw);
        if (memcmp(lw, logits + (size_t)pos * f.vocab, sizeof(float) * (size_t)f.vocab) != 0)
            fail_msg("adopted sequence, position %d: logits differ", pos);
    }
    pt_kv_seq_release(&f.full, &a);
    pt_kv_seq_release(&f.win, &w2);
    free(logits), free(lw);
    teardown(&f);
}

/* Resident KV bytes at 32k context, one sequence: the model's window
 * group against the same cache all global.  Printed for the record. */
static void test_resident_32k(void **state) {
    (void)state;
    pt_err err = {{0}};
    pt_backend *be = pt_backend_cpu_new(1, "auto", &err);
    const char *names[] = {"gemma2", "gemma3_text"};
    for (int i = 0; i < 2; i++) {
        char dir[512];
        snprintf(dir, sizeof dir, HF_DIR "%s", names[i]);
        pt_model_opts o = {.backend = be};
        pt_model *m;
        if (pt_model_load(&m, dir, &o, &err)) fail_msg("%s", err.msg);
        pt_kv_cache w, g;
        assert_int_equal(pt_model_kv_init_seqs(m, &w, 32768, 1, 0, PT_F16, NULL, &err), 0);
        assert_int_equal(pt_model_kv_init_seqs(m, &g, 32768, 0, 0, PT_F16, NULL, &err), 0);
        double bw = 0, bg = 0;
        for (int l = 0; l < m->cfg.n_layers; l++) {
            bool win = pt_kv_layer_windowed(&w, l);
            bw += (double)(win ? w.wk_bytes + w.wv_bytes : w.k_bytes + w.v_bytes);
            bg += (double)(g.k_bytes + g.v_bytes);
        }
        int n_global = 0;
        for (int l = 0; l < m->cfg.n_layers; l++) n_global += !pt_kv_layer_windowed(&w, l);
        print_message("%s at 32k, one sequence: %.2f MiB resident KV, all-global %.2f MiB (%.3f)\n",
                      names[i], bw / 1048576, bg / 1048576, bw / bg);
        /* the global layers' share plus a little */
        assert_true(bw < bg * ((double)n_global / m->cfg.n_layers + 0.05));
        assert_true(w.cfg.window_pages < w.cfg.n_pages / 20);
        pt_kv_cache_free(&w);
        pt_kv_cache_free(&g);
        pt_model_free(m);
    }
    be->ops->destroy(be);
}

/* Gemma-2-9B's layer pattern at 32k: 42 layers, every other one a window
 * of 4096, pages of 16 (the engine's).  Its 8 KV heads of 256 would make
 * the all-global cache 10.5 GiB, too much to allocate in a test, so the
 * heads here are 1 of 16: every buffer is exactly 128 times smaller (the
 * bytes per position and layer are the only thing heads change), and
 * the figures printed are scaled back.  The window group's pool for one
 * sequence is a window plus one 512-row step: (4095 + 512 + 15) / 16 + 1
 * = 289 pages (pt_kv_window_pages_per_seq).  docs/benchmarks.md quotes it. */
static void test_resident_32k_gemma2_9b(void **state) {
    (void)state;
    char path[] = "/tmp/petrel_g9_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    FILE *f = fdopen(fd, "w");
    fputs("{\"model_type\":\"gemma2\",\"hidden_size\":32,\"num_hidden_layers\":42,"
          "\"num_attention_heads\":2,\"num_key_value_heads\":1,\"head_dim\":16,"
          "\"intermediate_size\":32,\"vocab_size\":320,\"max_position_embeddings\":32768,"
          "\"hidden_activation\":\"gelu_pytorch_tanh\",\"query_pre_attn_scalar\":16,"
          "\"sliding_window\":4096,\"rms_norm_eps\":1e-6,\"rope_theta\":10000.0}",
          f);
    fclose(f);
    char spec[64];
    snprintf(spec, sizeof spec, "dummy:%s", path);
    pt_err err = {{0}};
    pt_backend *be = pt_backend_cpu_new(1, "auto", &err);
    pt_model_opts o = {.backend = be, .dummy_dtype = "f32"};
    pt_model *m;
    if (pt_model_load(&m, spec, &o, &err)) fail_msg("%s", err.msg);
    remove(path);
    pt_kv_cache w, g;
    assert_int_equal(pt_model_kv_init_seqs(m, &w, 32768, 1, 0, PT_F16, NULL, &err), 0);
    assert_int_equal(pt_model_kv_init_seqs(m, &g, 32768, 0, 0, PT_F16, NULL, &err), 0);
    double bw = 0, bg = 0;
    int n_win = 0;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        bool win = pt_kv_layer_windowed(&w, l);
        n_win += win;
        bw += (double)(win ? w.wk_bytes + w.wv_bytes : w.k_bytes + w.v_bytes);
        bg += (double)(g.k_bytes + g.v_bytes);
    }
    const double pos = 1 * 16 * 2 * 2; /* K and V of one head of 16, f16: bytes per position */
    assert_int_equal(n_win, 21);
    assert_int_equal(pt_kv_window_pages_per_seq(&w.cfg), 289);
    assert_true(bw == 21 * 32768 * pos + 21 * 289 * 16 * pos);
    assert_true(bg == 42 * 32768 * pos);
    print_message("gemma2-9b shape at 32k, one sequence: %.1f MiB resident KV, all-global %.1f "
                  "MiB (%.3f)\n",
                  128 * bw / 1048576, 128 * bg / 1048576, bw / bg);
    pt_kv_cache_free(&w);
    pt_kv_cache_free(&g);
    pt_model_free(m);
    be->ops->destroy(be);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gemma2_window), cmocka_unit_test(test_gemma3_window),
        cmocka_unit_test(test_rollback),      cmocka_unit_test(test_prefix_adopt),
        cmocka_unit_test(test_resident_32k),
        cmocka_unit_test(test_resident_32k_gemma2_9b),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
