/*
 * test_reasoning.c - the <think> splitter per template style (Qwen3: the
 * model opens the tag; DeepSeek-R1: the prompt does), streamed and not,
 * including unclosed and cut tags.  Each case is fed whole, byte by byte
 * and in chunks of 3, with the same result each time.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "server/reasoning.h"

typedef struct got {
    char side[2][1024];
    size_t len[2];
} got;

static void out(void *u, bool reasoning, const char *s, size_t n) {
    got *g = u;
    int k = reasoning;
    assert_true(g->len[k] + n < sizeof g->side[k]);
    memcpy(g->side[k] + g->len[k], s, n);
    g->len[k] += n;
    g->side[k][g->len[k]] = 0;
}

static void check(bool inside, const char *text, const char *want_reasoning,
                  const char *want_content) {
    size_t chunks[] = {100000, 1, 3};
    for (size_t c = 0; c < 3; c++) {
        got g;
        memset(&g, 0, sizeof g);
        pt_reason r;
        pt_reason_init(&r, inside, out, &g);
        size_t n = strlen(text);
        for (size_t i = 0; i < n; i += chunks[c])
            pt_reason_push(&r, text + i, i + chunks[c] <= n ? chunks[c] : n - i);
        pt_reason_flush(&r);
        pt_reason_free(&r);
        assert_string_equal(g.side[1], want_reasoning);
        assert_string_equal(g.side[0], want_content);
    }
}

/* Qwen3: the model writes <think> itself */
static void test_qwen3(void **state) {
    (void)state;
    check(false, "<think>\nLet me add 2 and 2.\n</think>\n\nIt is 4.", "\nLet me add 2 and 2.\n",
          "It is 4.");
    check(false, "\n<think>a</think>b", "a", "b");
    /* no thinking (enable_thinking false): all content */
    check(false, "It is 4.", "", "It is 4.");
    check(false, "  <thinking is fun>", "", "  <thinking is fun>");
    /* a <think> later in the answer is content */
    check(false, "Say <think>x</think>", "", "Say <think>x</think>");
    /* unclosed: out of tokens while thinking */
    check(false, "<think>hmm, so", "hmm, so", "");
    /* cut inside the closing tag */
    check(false, "<think>hmm</thi", "hmm</thi", "");
    /* cut inside the opening tag */
    check(false, "<thi", "", "<thi");
    check(false, "<think></think>", "", "");
}

/* DeepSeek-R1: the prompt ends with <think>\n, the output starts inside */
static void test_r1(void **state) {
    (void)state;
    check(true, "First, 2+2.\n</think>\n\n4", "First, 2+2.\n", "4");
    check(true, "no end in sight", "no end in sight", "");
    check(true, "</think>answer", "", "answer");
    check(true, "a < b </think> c", "a < b ", "c");
}

static void test_template_and_prompt(void **state) {
    (void)state;
    assert_true(pt_reason_template_thinks("{{ '<think>\\n' }}...{{ '</think>' }}"));
    assert_false(pt_reason_template_thinks("<|im_start|>"));
    assert_false(pt_reason_template_thinks(NULL));
    const char *r1 = "<｜Assistant｜><think>\n";
    assert_true(pt_reason_prompt_open(r1, strlen(r1)));
    const char *off = "<|im_start|>assistant\n<think>\n\n</think>\n\n";
    assert_false(pt_reason_prompt_open(off, strlen(off)));
    const char *plain = "<|im_start|>assistant\n";
    assert_false(pt_reason_prompt_open(plain, strlen(plain)));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_qwen3),
        cmocka_unit_test(test_r1),
        cmocka_unit_test(test_template_and_prompt),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
