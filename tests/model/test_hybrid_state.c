/*
 * test_hybrid_state.c - the recurrent-state cache group of a hybrid model
 * (qwen3_next, the transformers fixture in tests/fixtures/hf/qwen3_next):
 *
 *   - the cache keeps no K/V for recurrent layers and one state slot per
 *     sequence, taken at the first reserve and given back on release;
 *   - a prompt prefilled in one batch (the delta rule's chunkwise form) and
 *     the same prompt fed one token per forward (its recurrent form) give
 *     the same logits to f32 rounding; so does a prefill split in two;
 *   - two sequences interleaved in one batch each get exactly the logits
 *     they get alone (their states do not mix);
 *   - a sequence rolled back below its state's end without a checkpoint,
 *     or continued past a prefix it never computed, is refused with a
 *     message, never run on the wrong state; restarted at position 0 it
 *     gives the first logits again, bit for bit;
 *   - rolled back with a checkpoint (speculative decoding), the state and
 *     n_tokens return to it and recomputing gives the straight run's logits;
 *   - a fork copies the state (both continue with the same logits);
 *   - with every slot held the next sequence is refused, and a released
 *     slot serves it;
 *   - Qwen3.5 (the GGUF fixtures of tests/fixtures/gguf/qwen35*): an
 *     80-row prefill, which crosses the delta rule's 64-row chunk, and
 *     the same prompt token by token agree to f32 rounding;
 *   - the prefix cache's state snapshots: a sequence adopting a page that
 *     ends in a snapshot gets the state back and continues with exactly the
 *     logits of the sequence that stored it; a page without one, or whose
 *     snapshot was evicted (least recently used first), is not adopted.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

#include "model/model.h"

#define FIXTURE PETREL_SOURCE_DIR "/tests/fixtures/hf/qwen3_next"
#define N 24 /* prompt positions */

static pt_backend *be;
static pt_model *m;
static int vocab;
static int32_t prompt[N], prompt2[N];

static int setup(void **state) {
    (void)state;
    pt_err err = {{0}};
    be = pt_backend_cpu_new(2, "auto", &err);
    if (!be) return -1;
    pt_model_opts o = {.backend = be};
    if (pt_model_load(&m, FIXTURE, &o, &err)) {
        print_error("%s\n", err.msg);
        return -1;
    }
    vocab = m->cfg.vocab_size;
    for (int i = 0; i < N; i++) prompt[i] = (i * 37 + 5) % vocab, prompt2[i] = (i * 11 + 3) % vocab;
    return 0;
}

static int teardown(void **state) {
    (void)state;
    pt_model_free(m);
    be->ops->destroy(be);
    return 0;
}

/* Runs rows [from, from + n) of toks for seq; logits of every row. */
static int run(pt_kv_cache *kv, pt_kv_seq *seq, const int32_t *toks, int from, int n, float *logits,
               pt_err *err) {
    int32_t pos[N], sq[N];
    bool want[N];
    for (int i = 0; i < n; i++) pos[i] = from + i, sq[i] = 0, want[i] = true;
    pt_kv_seq *seqs[1] = {seq};
    pt_batch b = {n, (int32_t *)toks + from, pos, sq, want, 1, seqs};
    return pt_model_run(m, kv, &b, logits, err);
}

static double max_diff(const float *a, const float *b, size_t n) {
    double d = 0;
    for (size_t i = 0; i < n; i++) {
        double x = fabs((double)a[i] - b[i]);
        if (!(x <= d)) d = x;
    }
    return d;
}

static void test_geometry(void **state) {
    (void)state;
    pt_kv_cache kv;
    pt_err err = {{0}};
    assert_true(pt_model_recurrent(m));
    assert_int_equal(pt_model_kv_init(m, &kv, 128, PT_F32, NULL, &err), 0);
    assert_int_equal(kv.cfg.n_state_slots, 8); /* one per page, at most 16 */
    for (int l = 0; l < 4; l++) {
        assert_int_equal(m->plan[l].mixer, l < 3 ? PT_MIX_RECURRENT : PT_MIX_ATTN);
        assert_int_equal(m->plan[l].cache_group, l < 3 ? 2 : 0);
        assert_true((kv.k[l] == NULL) == (l < 3));
        assert_true((kv.rec[l] != NULL) == (l < 3));
    }
    assert_int_equal(m->plan[3].rope.n_rot, 8); /* partial_rotary_factor 0.25 of 32 */
    /* conv tail 3 x (2*2*16 + 4*16) and state 4 x 16 x 16 floats per layer */
    assert_int_equal(kv.cfg.conv_floats, 3 * 128);
    assert_int_equal(kv.cfg.rec_floats, 4 * 16 * 16);
    assert_int_equal(pt_kv_state_bytes(&kv.cfg), 3 * (3 * 128 + 1024) * 4);
    assert_int_equal(pt_kv_bytes_per_token(&kv.cfg), 1 * 2 * 2 * 32 * 4); /* one attention layer */
    pt_kv_cache_free(&kv);
}

static void test_prefill_equals_decode(void **state) {
    (void)state;
    pt_kv_cache kv;
    pt_err err = {{0}};
    assert_int_equal(pt_model_kv_init(m, &kv, 128, PT_F32, NULL, &err), 0);
    float *all = malloc(sizeof(float) * N * vocab), *one = malloc(sizeof(float) * vocab);
    pt_kv_seq a = {0}, b = {0};
    if (run(&kv, &a, prompt, 0, N, all, &err)) fail_msg("%s", err.msg);
    assert_int_equal(a.state_pos, N);
    double worst = 0;
    for (int i = 0; i < N; i++) {
        if (run(&kv, &b, prompt, i, 1, one, &err)) fail_msg("%s", err.msg);
        worst = fmax(worst, max_diff(all + (size_t)i * vocab, one, (size_t)vocab));
    }
    print_message("prefill vs token-by-token: max |logit diff| %.3g\n", worst);
    assert_true(worst < 1e-4);
    /* a prefill split 10 + 14 continues the state exactly */
    float *split = malloc(sizeof(float) * N * vocab);
    pt_kv_seq c = {0};
    if (run(&kv, &c, prompt, 0, 10, split, &err) ||
        run(&kv, &c, prompt, 10, N - 10, split + 10 * (size_t)vocab, &err))
        fail_msg("%s", err.msg);
    assert_true(max_diff(split, all, (size_t)N * vocab) < 1e-4);
    free(split);
    pt_kv_seq_release(&kv, &a), pt_kv_seq_release(&kv, &b), pt_kv_seq_release(&kv, &c);
    assert_int_equal(kv.n_free_slots, kv.cfg.n_state_slots);
    assert_int_equal(pt_kv_free_pages(&kv), kv.cfg.n_pages);
    free(all), free(one);
    pt_kv_cache_free(&kv);
}

/* Two sequences in one batch, rows interleaved, against each alone. */
static void test_interleaved_sequences(void **state) {
    (void)state;
    pt_kv_cache kv;
    pt_err err = {{0}};
    assert_int_equal(pt_model_kv_init(m, &kv, 128, PT_F32, NULL, &err), 0);
    float *alone[2], *both = malloc(sizeof(float) * 2 * N * vocab);
    const int32_t *toks[2] = {prompt, prompt2};
    for (int s = 0; s < 2; s++) {
        pt_kv_seq q = {0};
        alone[s] = malloc(sizeof(float) * N * vocab);
        if (run(&kv, &q, toks[s], 0, N, alone[s], &err)) fail_msg("%s", err.msg);
        pt_kv_seq_release(&kv, &q);
    }
    pt_kv_seq q0 = {0}, q1 = {0};
    pt_kv_seq *seqs[2] = {&q0, &q1};
    int32_t tok[2 * N], pos[2 * N], sq[2 * N];
    bool want[2 * N];
    for (int i = 0; i < 2 * N; i++)
        tok[i] = toks[i % 2][i / 2], pos[i] = i / 2, sq[i] = i % 2, want[i] = true;
    pt_batch b = {2 * N, tok, pos, sq, want, 2, seqs};
    if (pt_model_run(m, &kv, &b, both, &err)) fail_msg("%s", err.msg);
    double worst = 0;
    for (int i = 0; i < 2 * N; i++)
        worst = fmax(worst, max_diff(both + (size_t)i * vocab, alone[i % 2] + (size_t)(i / 2) * vocab,
                                     (size_t)vocab));
    print_message("interleaved vs alone: max |logit diff| %.3g\n", worst);
    assert_true(worst < 1e-4); /* matmul tiles differ with the row count; mixed states would be O(1) */
    pt_kv_seq_release(&kv, &q0), pt_kv_seq_release(&kv, &q1);
    free(alone[0]), free(alone[1]), free(both);
    pt_kv_cache_free(&kv);
}

static void test_rollback_refused(void **state) {
    (void)state;
    pt_kv_cache kv;
    pt_err err = {{0}};
    assert_int_equal(pt_model_kv_init(m, &kv, 128, PT_F32, NULL, &err), 0);
    float *first = malloc(sizeof(float) * N * vocab), *again = malloc(sizeof(float) * N * vocab);
    pt_kv_seq s = {0};
    if (run(&kv, &s, prompt, 0, N, first, &err)) fail_msg("%s", err.msg);
    /* speculative rollback: 2 positions back */
    pt_kv_seq_truncate(&kv, &s, N - 2);
    assert_int_equal(s.state_pos, -1);
    assert_int_equal(run(&kv, &s, prompt, N - 2, 2, again, &err), -1);
    assert_non_null(strstr(err.msg, "rolled back"));
    /* a restart at position 0 recomputes the same state */
    if (run(&kv, &s, prompt, 0, N, again, &err)) fail_msg("%s", err.msg);
    assert_memory_equal(again, first, sizeof(float) * N * vocab);
    /* a prefix it never computed (what a prefix-cache hit would give) */
    pt_kv_seq t = {0};
    assert_int_equal(pt_kv_seq_own(&kv, &t, 0, 17, &err), 0);
    t.n_tokens = 16;
    assert_int_equal(run(&kv, &t, prompt, 16, 1, again, &err), -1);
    assert_non_null(strstr(err.msg, "holds positions 0..-1"));
    pt_kv_seq_release(&kv, &s), pt_kv_seq_release(&kv, &t);
    free(first), free(again);
    pt_kv_cache_free(&kv);
}

/* Speculative rollback through a checkpoint: state saved at position 20,
 * rows 20..23 run (a verify of 3 drafts), rolled back to 22: the state
 * returns to 20 and n_tokens with it, and recomputing 20..23 gives the
 * first run's logits. */
static void test_rollback_to_checkpoint(void **state) {
    (void)state;
    pt_kv_cache kv;
    pt_err err = {{0}};
    assert_int_equal(pt_model_kv_init(m, &kv, 128, PT_F32, NULL, &err), 0);
    float *first = malloc(sizeof(float) * N * vocab), *again = malloc(sizeof(float) * N * vocab);
    pt_kv_seq s = {0}, ref = {0};
    if (run(&kv, &ref, prompt, 0, N, first, &err)) fail_msg("%s", err.msg);
    if (run(&kv, &s, prompt, 0, 20, again, &err)) fail_msg("%s", err.msg);
    assert_true(pt_kv_seq_ckpt_reserve(&kv, &s));
    pt_kv_seq_checkpoint(&kv, &s);
    assert_int_equal(s.ckpt_pos, 20);
    int32_t wrong[N];
    memcpy(wrong, prompt, sizeof wrong);
    wrong[21] = (wrong[21] + 1) % vocab, wrong[22] = (wrong[22] + 7) % vocab; /* rejected drafts */
    if (run(&kv, &s, wrong, 20, 4, again, &err)) fail_msg("%s", err.msg);
    pt_kv_seq_truncate(&kv, &s, 22);
    assert_int_equal(s.state_pos, 20);
    assert_int_equal(s.n_tokens, 20);
    if (run(&kv, &s, prompt, 20, 4, again + 20 * (size_t)vocab, &err)) fail_msg("%s", err.msg);
    double d = max_diff(again + 20 * (size_t)vocab, first + 20 * (size_t)vocab, 4 * (size_t)vocab);
    print_message("after rollback vs straight: max |logit diff| %.3g\n", d);
    assert_true(d < 1e-4); /* 4 rows from a state vs 24 rows in one chunk: f32 rounding */
    /* a rollback past the checkpoint cannot be served */
    pt_kv_seq_truncate(&kv, &s, 10);
    assert_int_equal(s.state_pos, -1);
    pt_kv_seq_release(&kv, &s), pt_kv_seq_release(&kv, &ref);
    assert_int_equal(kv.n_free_slots, kv.cfg.n_state_slots);
    free(first), free(again);
    pt_kv_cache_free(&kv);
}

/* A fork copies the state: both continue identically from the same point. */
static void test_fork_copies_state(void **state) {
    (void)state;
    pt_kv_cache kv;
    pt_err err = {{0}};
    assert_int_equal(pt_model_kv_init(m, &kv, 128, PT_F32, NULL, &err), 0);
    float *a = malloc(sizeof(float) * N * vocab), *b = malloc(sizeof(float) * vocab);
    pt_kv_seq s = {0}, f = {0};
    if (run(&kv, &s, prompt, 0, N - 1, a, &err)) fail_msg("%s", err.msg);
    pt_kv_seq_fork(&kv, &f, &s);
    assert_int_not_equal(f.state, s.state);
    assert_int_equal(f.state_pos, N - 1);
    if (run(&kv, &s, prompt, N - 1, 1, a, &err) || run(&kv, &f, prompt, N - 1, 1, b, &err))
        fail_msg("%s", err.msg);
    assert_memory_equal(a, b, sizeof(float) * vocab);
    pt_kv_seq_release(&kv, &s), pt_kv_seq_release(&kv, &f);
    assert_int_equal(kv.n_free_slots, kv.cfg.n_state_slots);
    free(a), free(b);
    pt_kv_cache_free(&kv);
}

static void test_slots_held_and_freed(void **state) {
    (void)state;
    pt_kv_cache kv;
    pt_err err = {{0}};
    assert_int_equal(pt_model_kv_init(m, &kv, 512, PT_F32, NULL, &err), 0);
    int n = kv.cfg.n_state_slots;
    assert_int_equal(n, 16);
    pt_kv_seq s[17];
    memset(s, 0, sizeof s);
    float *logits = malloc(sizeof(float) * vocab);
    for (int i = 0; i < n; i++)
        if (run(&kv, &s[i], prompt, 0, 1, logits, &err)) fail_msg("%d: %s", i, err.msg);
    assert_int_equal(kv.n_free_slots, 0);
    assert_int_equal(run(&kv, &s[n], prompt, 0, 1, logits, &err), -1);
    assert_non_null(strstr(err.msg, "recurrent-state slots are held"));
    pt_kv_seq_release(&kv, &s[3]);
    assert_int_equal(kv.n_free_slots, 1);
    if (run(&kv, &s[n], prompt, 0, 1, logits, &err)) fail_msg("%s", err.msg);
    pt_kv_seq_truncate(&kv, &s[5], 0); /* preemption gives the slot back too */
    assert_int_equal(kv.n_free_slots, 1);
    assert_int_equal(s[5].state, 0);
    for (int i = 0; i <= n; i++) pt_kv_seq_release(&kv, &s[i]);
    assert_int_equal(kv.n_free_slots, n);
    free(logits);
    pt_kv_cache_free(&kv);
}

/* Qwen3.5 (tests/fixtures/gguf/qwen35*, llama.cpp's layout: value heads
 * tiled over key heads, ggml's l2norm): an 80-row prefill, two chunks of
 * the delta rule's chunkwise form (64 + 16), against the same prompt fed
 * one token per forward (its recurrent form): the same logits at every
 * position to f32 rounding, as these fixtures magnify it (measured 1.0e-4
 * and 1.2e-4; the state's term across the chunk boundary off by 0.1%
 * gives 1.7e-2). */
static void check_gguf_prefill_equals_decode(const char *path) {
    enum { P = 80 };
    pt_err err = {{0}};
    pt_model_opts o = {.backend = be};
    pt_model *q;
    if (pt_model_load(&q, path, &o, &err)) fail_msg("%s: %s", path, err.msg);
    assert_true(pt_model_recurrent(q));
    int V = q->cfg.vocab_size;
    pt_kv_cache kv;
    assert_int_equal(pt_model_kv_init(q, &kv, 2 * P, PT_F32, NULL, &err), 0);
    int32_t toks[P], pos[P], sq[P] = {0};
    bool want[P];
    for (int i = 0; i < P; i++) toks[i] = 3 + (i * 53 + 7) % (V - 3), pos[i] = i, want[i] = true;
    float *all = malloc(sizeof(float) * P * V), *one = malloc(sizeof(float) * V);
    pt_kv_seq a = {0}, b = {0};
    pt_kv_seq *sa[1] = {&a}, *sb[1] = {&b};
    pt_batch batch = {P, toks, pos, sq, want, 1, sa};
    if (pt_model_run(q, &kv, &batch, all, &err)) fail_msg("%s", err.msg);
    double worst = 0;
    for (int i = 0; i < P; i++) {
        pt_batch step = {1, toks + i, pos + i, sq, want, 1, sb};
        if (pt_model_run(q, &kv, &step, one, &err)) fail_msg("%s", err.msg);
        worst = fmax(worst, max_diff(all + (size_t)i * V, one, (size_t)V));
    }
    print_message("%s: 80-row prefill vs token-by-token: max |logit diff| %.3g\n", path, worst);
    assert_true(worst < 3e-4); /* the fixtures' prompt tolerance: qwen35.py says why */
    pt_kv_seq_release(&kv, &a), pt_kv_seq_release(&kv, &b);
    free(all), free(one);
    pt_kv_cache_free(&kv);
    pt_model_free(q);
}

static void test_qwen35_prefill_equals_decode(void **state) {
    (void)state;
    check_gguf_prefill_equals_decode(PETREL_SOURCE_DIR "/tests/fixtures/gguf/qwen35/model.gguf");
    check_gguf_prefill_equals_decode(PETREL_SOURCE_DIR "/tests/fixtures/gguf/qwen35moe/model.gguf");
}

static void test_snapshot_adopt(void **state) {
    (void)state;
    pt_kv_cache kv;
    pt_err err = {{0}};
    assert_int_equal(pt_model_kv_init(m, &kv, 128, PT_F32, NULL, &err), 0);
    assert_int_equal(pt_kv_snaps_init(&kv, 2, &err), 0);
    int ps = kv.cfg.page_size;
    float *ref = malloc(sizeof(float) * N * vocab), *got = malloc(sizeof(float) * N * vocab);
    pt_kv_seq s = {0}, t = {0}, u = {0};
    const uint64_t k0 = 0x1234, k1 = 0x5678, k2 = 0x9abc;
    if (run(&kv, &s, prompt, 0, ps, ref, &err)) fail_msg("%s", err.msg);
    pt_kv_seq_set_key(&kv, &s, 0, k0);
    assert_int_equal(pt_kv_prefix_state(&kv, &k0, 1), 0); /* a page alone is not enough */
    pt_kv_seq_snapshot(&kv, &s, k0);
    assert_int_equal(pt_kv_prefix_state(&kv, &k0, 1), 1);
    if (run(&kv, &s, prompt, ps, N - ps, ref, &err)) fail_msg("%s", err.msg);

    assert_int_equal(pt_kv_seq_adopt(&kv, &t, &k0, 1), 1);
    assert_int_equal(t.n_tokens, ps);
    assert_int_equal(t.state_pos, ps);
    if (run(&kv, &t, prompt, ps, N - ps, got, &err)) fail_msg("%s", err.msg);
    assert_memory_equal(got, ref, sizeof(float) * (size_t)(N - ps) * vocab);

    /* two more snapshots: k0 was used least recently, so it goes */
    pt_kv_seq_snapshot(&kv, &t, k1); /* t is past its first page: not a page end */
    assert_int_equal(pt_kv_prefix_state(&kv, &k1, 1), 0);
    pt_kv_seq_release(&kv, &t);
    for (int i = 0; i < 2; i++) {
        pt_kv_seq w = {0};
        if (run(&kv, &w, prompt2, 0, ps, got, &err)) fail_msg("%s", err.msg);
        pt_kv_seq_snapshot(&kv, &w, i ? k2 : k1);
        pt_kv_seq_release(&kv, &w);
    }
    assert_int_equal(pt_kv_prefix_state(&kv, &k0, 1), 0);
    assert_int_equal(pt_kv_seq_adopt(&kv, &u, &k0, 1), 0);
    assert_int_equal(u.n_pages, 0);
    assert_int_equal(u.n_tokens, 0);
    pt_kv_seq_release(&kv, &s), pt_kv_seq_release(&kv, &u);
    assert_int_equal(kv.n_free_slots, kv.cfg.n_state_slots);
    free(ref), free(got);
    pt_kv_cache_free(&kv);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_geometry),
        cmocka_unit_test(test_prefill_equals_decode),
        cmocka_unit_test(test_interleaved_sequences),
        cmocka_unit_test(test_rollback_refused),
        cmocka_unit_test(test_rollback_to_checkpoint),
        cmocka_unit_test(test_fork_copies_state),
        cmocka_unit_test(test_slots_held_and_freed),
        cmocka_unit_test(test_qwen35_prefill_equals_decode),
        cmocka_unit_test(test_snapshot_adopt),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
