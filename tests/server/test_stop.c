/*
 * test_stop.c - the stop-string matcher against a brute-force reference.
 *
 * The streaming contract: however the generated text is split into tokens,
 * the concatenation of what pt_stop_scan releases is exactly the text
 * before the stop string that is complete first (earliest end, then the
 * longer), or all of it, and nothing after a match is released.  A driver plays the server's part
 * (hold buffer, release) over random texts, stop sets and token splits.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

#include "server/stop.h"

/* Feeds pieces (NUL-separated in one string, n of them) and returns the
 * released text; *matched tells whether a stop string ended it. */
static char *stream(const pt_stop *st, const char **pieces, int n, bool *matched) {
    char hold[4096], *out = calloc(1, 4096);
    size_t hold_len = 0, out_len = 0;
    *matched = false;
    for (int i = 0; i < n && !*matched; i++) {
        size_t k = strlen(pieces[i]);
        memcpy(hold + hold_len, pieces[i], k);
        hold_len += k;
        size_t r = pt_stop_scan(st, hold, hold_len, matched);
        assert_true(r <= hold_len);
        memcpy(out + out_len, hold, r);
        out_len += r;
        memmove(hold, hold + r, hold_len - r);
        hold_len -= r;
    }
    if (!*matched) { /* end of generation: the held tail is final */
        memcpy(out + out_len, hold, hold_len);
        out_len += hold_len;
    }
    out[out_len] = 0;
    return out;
}

static void check(const char **stops, int n_stops, const char **pieces, int n, const char *want,
                  bool want_match) {
    pt_stop st = {0};
    for (int i = 0; i < n_stops; i++)
        assert_int_equal(pt_stop_add(&st, stops[i], strlen(stops[i]), NULL), 0);
    bool matched;
    char *got = stream(&st, pieces, n, &matched);
    assert_string_equal(got, want);
    assert_int_equal(matched, want_match);
    free(got);
    pt_stop_free(&st);
}

static void test_examples(void **state) {
    (void)state;
    const char *end[] = {"END"};
    const char *p1[] = {"abc E", "ND more"};
    check(end, 1, p1, 2, "abc ", true); /* split across tokens */
    const char *p2[] = {"x.\nEND!"};
    check(end, 1, p2, 1, "x.\n", true); /* inside one token */
    const char *p3[] = {"E", "N", "X", "END"};
    check(end, 1, p3, 4, "ENX", true); /* a false start is released */
    const char *p4[] = {"the E", "N"};
    check(end, 1, p4, 2, "the EN", false); /* a prefix at the very end is kept */
    const char *two[] = {"world", "lo w"};
    const char *p5[] = {"hel", "lo world"};
    check(two, 2, p5, 2, "hel", true); /* the earliest of several wins */
    const char *none[] = {"zzz"};
    const char *p6[] = {"plain", " text"};
    check(none, 1, p6, 2, "plain text", false);
    const char *nested[] = {"c", "aacba"}; /* "c" completes before "aacba" can */
    const char *p9[] = {"aacba"};
    check(nested, 2, p9, 1, "aa", true);
    const char *p7[] = {"abc"};
    check(NULL, 0, p7, 1, "abc", false);
    const char *utf[] = {"\xc3\xa9t\xc3\xa9"}; /* "été" */
    const char *p8[] = {"un \xc3\xa9", "t\xc3\xa9 chaud"};
    check(utf, 1, p8, 2, "un ", true);
}

static void test_hold_back(void **state) {
    (void)state;
    pt_stop st = {0};
    assert_int_equal(pt_stop_add(&st, "<|end|>", 7, NULL), 0);
    bool m;
    assert_int_equal(pt_stop_scan(&st, "hi <|en", 7, &m), 3);
    assert_false(m);
    assert_int_equal(pt_stop_scan(&st, "hi <", 4, &m), 3);
    assert_int_equal(pt_stop_scan(&st, "hi", 2, &m), 2);
    assert_int_equal(pt_stop_scan(&st, "<|end|>", 7, &m), 0);
    assert_true(m);
    pt_stop_free(&st);
}

static void test_limits(void **state) {
    (void)state;
    pt_stop st = {0};
    pt_err err;
    assert_int_equal(pt_stop_add(&st, "", 0, &err), 0); /* ignored */
    assert_int_equal(st.n, 0);
    char big[PT_STOP_MAX_LEN + 2];
    memset(big, 'a', sizeof big);
    assert_int_equal(pt_stop_add(&st, big, sizeof big, &err), -1);
    for (int i = 0; i < PT_STOP_MAX; i++)
        assert_int_equal(pt_stop_add(&st, "x", 1, &err), 0);
    assert_int_equal(pt_stop_add(&st, "y", 1, &err), -1);
    pt_stop_free(&st);
}

/* Random texts over {a, b, c}, random stop sets, random splits. */
static void test_random_splits(void **state) {
    (void)state;
    uint64_t seed = 12345;
#define RND()                                                                                      \
    (seed = seed * 6364136223846793005ull + 1442695040888963407ull, (unsigned)(seed >> 33))
    for (int iter = 0; iter < 20000; iter++) {
        char text[64], stops[3][8];
        int len = 1 + (int)(RND() % 40), n_stops = 1 + (int)(RND() % 3);
        for (int i = 0; i < len; i++)
            text[i] = (char)('a' + RND() % 3);
        text[len] = 0;
        const char *sp[3];
        for (int k = 0; k < n_stops; k++) {
            int sl = 1 + (int)(RND() % 5);
            for (int i = 0; i < sl; i++)
                stops[k][i] = (char)('a' + RND() % 3);
            stops[k][sl] = 0;
            sp[k] = stops[k];
        }
        /* reference: cut before the stop string that ends first */
        int cut = len, cut_end = 1 << 30;
        for (int k = 0; k < n_stops; k++) {
            const char *p = strstr(text, sp[k]);
            if (!p) continue;
            int at = (int)(p - text), end = at + (int)strlen(sp[k]);
            if (end < cut_end || (end == cut_end && at < cut)) cut = at, cut_end = end;
        }
        char want[64];
        memcpy(want, text, (size_t)cut);
        want[cut] = 0;
        /* split into random pieces */
        char store[64][64];
        const char *pieces[64];
        int n = 0;
        for (int i = 0; i < len;) {
            int k = 1 + (int)(RND() % 6);
            if (i + k > len) k = len - i;
            memcpy(store[n], text + i, (size_t)k);
            store[n][k] = 0;
            pieces[n] = store[n];
            n++, i += k;
        }
        check(sp, n_stops, pieces, n, want, cut < len);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_examples),
        cmocka_unit_test(test_hold_back),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_random_splits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
