/*
 * test_api.c - the public API (include/petrel/petrel.h) in-process, on
 * stories260K: tokenizing (the count query and truncation), parameters
 * outside their ranges refused with a message, petrel_generate refused
 * while a scheduler owns the model, requests submitted from four threads
 * at once equal to petrel_generate alone, a text callback that stops its
 * request, a queued request cancelled, and a stop with requests still
 * queued: every on_done runs exactly once.  (The installed library and the
 * docs/api.md example: tests/api/installed_example.sh.)
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "petrel/petrel.h"

#define MODEL PETREL_SOURCE_DIR "/models/stories260K.gguf"

static const char *const k_prompts[] = {"Once upon a time", "Lily wanted to", "The little dog",
                                        "Tom and Sue"};

typedef struct answer {
    char text[4096];
    size_t len;
    int n_done; /* on_done calls: must end at 1 */
    int stop_after_pieces; /* on_text asks to stop after this many (0: never) */
    int n_pieces;
    petrel_stats st;
    char error[256];
    /* blocking: on_text waits until *go before returning (NULL: no wait) */
    int *go;
} answer;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;

static int keep(void *user, const char *text, size_t len) {
    answer *a = user;
    if (a->len + len < sizeof a->text) {
        memcpy(a->text + a->len, text, len);
        a->len += len;
    }
    a->n_pieces++;
    if (a->go) {
        pthread_mutex_lock(&mu);
        while (!*a->go) pthread_cond_wait(&cv, &mu);
        pthread_mutex_unlock(&mu);
    }
    return a->stop_after_pieces && a->n_pieces >= a->stop_after_pieces;
}

static void finished(void *user, const petrel_stats *st, const char *error) {
    answer *a = user;
    pthread_mutex_lock(&mu);
    a->st = *st;
    if (error) snprintf(a->error, sizeof a->error, "%s", error);
    a->n_done++;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
}

static void wait_done(answer *a) {
    pthread_mutex_lock(&mu);
    while (!a->n_done) pthread_cond_wait(&cv, &mu);
    pthread_mutex_unlock(&mu);
}

static petrel_model *open_model(void) {
    char err[256];
    petrel_model *m = petrel_open(MODEL, NULL, err, sizeof err);
    if (!m) fail_msg("petrel_open: %s", err);
    return m;
}

static petrel_params greedy(int max_tokens) {
    petrel_params p = petrel_default_params();
    p.temperature = 0;
    p.max_tokens = max_tokens;
    return p;
}

static void test_tokenize(void **state) {
    (void)state;
    petrel_model *m = open_model();
    char err[256];
    const char *t = "Once upon a time there was a dog";
    int n = petrel_tokenize(m, t, strlen(t), 1, NULL, 0, err, sizeof err);
    assert_true(n > 4);
    int32_t all[64], some[4] = {-7, -7, -7, -7};
    assert_int_equal(petrel_tokenize(m, t, strlen(t), 1, all, 64, err, sizeof err), n);
    assert_int_equal(petrel_tokenize(m, t, strlen(t), 1, some, 3, err, sizeof err), n);
    assert_memory_equal(some, all, 3 * sizeof *all);
    assert_int_equal(some[3], -7); /* nothing past cap */
    assert_int_equal(all[0], 1);   /* BOS */
    int32_t nobos[64];
    assert_int_equal(petrel_tokenize(m, t, strlen(t), 0, nobos, 64, err, sizeof err), n - 1);
    assert_memory_equal(nobos, all + 1, (size_t)(n - 1) * sizeof *all);
    size_t len = 0;
    const char *piece = petrel_token_text(m, all[1], &len);
    assert_non_null(piece);
    if (!(len > 0 && memmem(" Once", 5, piece, len))) /* "Once" or " Once" */
        fail_msg("token %d is '%.*s'", all[1], (int)len, piece);
    assert_null(petrel_token_text(m, petrel_n_vocab(m), &len));
    assert_true(petrel_token_eos(m) >= 0);
    petrel_close(m);
}

static void test_bad_params(void **state) {
    (void)state;
    petrel_model *m = open_model();
    char err[256] = "";
    petrel_params p = greedy(8);
    p.temperature = 5;
    assert_int_equal(petrel_generate(m, "Once", &p, NULL, NULL, NULL, err, sizeof err), -1);
    assert_non_null(strstr(err, "temperature"));
    petrel_scheduler *s = petrel_scheduler_start(m, 2, err, sizeof err);
    assert_non_null(s);
    err[0] = 0;
    answer a = {0};
    assert_int_equal(petrel_submit(s, "Once", &p, keep, finished, &a, err, sizeof err), 0);
    assert_non_null(strstr(err, "temperature"));
    assert_null(petrel_scheduler_start(m, 2, err, sizeof err)); /* one per model */
    p = greedy(8);
    assert_int_equal(petrel_generate(m, "Once", &p, NULL, NULL, NULL, err, sizeof err), -1);
    assert_non_null(strstr(err, "scheduler"));
    petrel_scheduler_stop(s);
    assert_int_equal(a.n_done, 0); /* refused: never called back */
    assert_int_equal(petrel_generate(m, "Once", &p, NULL, NULL, NULL, err, sizeof err), 0);
    assert_null(petrel_scheduler_start(m, 0, err, sizeof err));
    assert_non_null(strstr(err, "max_parallel"));
    petrel_close(m);
}

typedef struct submitter {
    petrel_scheduler *s;
    answer *ans; /* 4 of them */
    int first;   /* prompt index of the first */
} submitter;

static void *submit4(void *arg) {
    submitter *w = arg;
    petrel_params p = greedy(48);
    for (int i = 0; i < 4; i++) {
        char err[256];
        if (!petrel_submit(w->s, k_prompts[(w->first + i) % 4], &p, keep, finished, &w->ans[i],
                           err, sizeof err))
            snprintf(w->ans[i].error, sizeof w->ans[i].error, "submit: %.200s", err);
    }
    return NULL;
}

static void test_concurrent_equals_alone(void **state) {
    (void)state;
    petrel_model *m = open_model();
    char err[256];
    static answer alone[4];
    memset(alone, 0, sizeof alone);
    petrel_params p = greedy(48);
    for (int i = 0; i < 4; i++)
        assert_int_equal(petrel_generate(m, k_prompts[i], &p, keep, &alone[i], &alone[i].st, err,
                                         sizeof err), 0);
    petrel_scheduler *s = petrel_scheduler_start(m, 4, err, sizeof err);
    assert_non_null(s);
    static answer ans[4][4];
    memset(ans, 0, sizeof ans);
    submitter w[4];
    pthread_t th[4];
    for (int t = 0; t < 4; t++) {
        w[t] = (submitter){s, ans[t], t};
        pthread_create(&th[t], NULL, submit4, &w[t]);
    }
    for (int t = 0; t < 4; t++) pthread_join(th[t], NULL);
    for (int t = 0; t < 4; t++)
        for (int i = 0; i < 4; i++) {
            answer *a = &ans[t][i];
            if (a->error[0]) fail_msg("request %d/%d: %s", t, i, a->error);
            wait_done(a);
        }
    petrel_scheduler_stop(s);
    for (int t = 0; t < 4; t++)
        for (int i = 0; i < 4; i++) {
            answer *a = &ans[t][i], *ref = &alone[(t + i) % 4];
            assert_int_equal(a->n_done, 1);
            assert_string_equal(a->error, "");
            assert_int_equal(a->st.completion_tokens, ref->st.completion_tokens);
            assert_int_equal(a->len, ref->len);
            assert_memory_equal(a->text, ref->text, ref->len);
        }
    petrel_close(m);
}

static void test_stop_cancel_shutdown(void **state) {
    (void)state;
    petrel_model *m = open_model();
    char err[256];
    petrel_scheduler *s = petrel_scheduler_start(m, 1, err, sizeof err);
    assert_non_null(s);

    /* the text callback stops its request */
    answer stop = {.stop_after_pieces = 2};
    petrel_params p = greedy(100);
    assert_true(petrel_submit(s, "Once upon a time", &p, keep, finished, &stop, err, sizeof err));
    wait_done(&stop);
    assert_int_equal(stop.n_pieces, 2);
    assert_true(stop.st.completion_tokens < 100);
    assert_true(stop.st.stopped_at_eos);

    /* B waits behind A (one slot), whose callback holds the scheduler's
     * thread until B has been cancelled: B ends cancelled, unrun */
    int go = 0;
    answer a = {.go = &go}, b = {0};
    assert_true(petrel_submit(s, "Lily wanted to", &p, keep, finished, &a, err, sizeof err));
    uint64_t idb = petrel_submit(s, "The little dog", &p, keep, finished, &b, err, sizeof err);
    assert_true(idb > 0);
    petrel_cancel(s, idb);
    pthread_mutex_lock(&mu);
    go = 1;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
    wait_done(&b);
    assert_true(b.st.cancelled);
    assert_int_equal(b.st.completion_tokens, 0);
    assert_int_equal(b.len, 0);
    wait_done(&a);

    /* stop with work queued: every on_done runs once, before stop returns */
    answer q[6];
    memset(q, 0, sizeof q);
    for (int i = 0; i < 6; i++)
        assert_true(petrel_submit(s, k_prompts[i % 4], &p, keep, finished, &q[i], err, sizeof err));
    petrel_scheduler_stop(s);
    for (int i = 0; i < 6; i++) assert_int_equal(q[i].n_done, 1);
    assert_int_equal(a.n_done, 1);
    assert_int_equal(b.n_done, 1);
    petrel_close(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tokenize),
        cmocka_unit_test(test_bad_params),
        cmocka_unit_test(test_concurrent_equals_alone),
        cmocka_unit_test(test_stop_cancel_shutdown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
