/*
 * test_message.c - the chat answer's last filter stage: reasoning first,
 * then tool calls on what is not reasoning, and the OpenAI JSON of both
 * (the whole message, and streamed deltas in OpenAI's chunk format).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

#include "server/message.h"

static pt_msgsplit_opts opts(bool think, bool inside, bool tools) {
    return (pt_msgsplit_opts){.think = think,
                              .think_inside = inside,
                              .tools = tools,
                              .tool_family = PT_TOOLS_HERMES,
                              .id_seed = 7};
}

static const char k_out[] =
    "<think>maybe <tool_call>{\"name\":\"x\",\"arguments\":{}}</tool_call>?</think>\n\n"
    "Calling.<tool_call>{\"name\":\"get\",\"arguments\":{\"a\":1}}</tool_call>";

/* A call written while thinking is thought, not made. */
static void test_whole(void **state) {
    (void)state;
    pt_msgsplit m;
    pt_msgsplit_opts o = opts(true, false, true);
    pt_msgsplit_init(&m, &o);
    pt_msgsplit_push(&m, k_out, strlen(k_out));
    pt_msgsplit_finish(&m);
    json_t *msg = pt_msgsplit_message(&m);
    assert_string_equal(json_string_value(json_object_get(msg, "role")), "assistant");
    assert_string_equal(json_string_value(json_object_get(msg, "reasoning_content")),
                        "maybe <tool_call>{\"name\":\"x\",\"arguments\":{}}</tool_call>?");
    assert_string_equal(json_string_value(json_object_get(msg, "content")), "Calling.");
    json_t *calls = json_object_get(msg, "tool_calls");
    assert_int_equal(json_array_size(calls), 1);
    json_t *fn = json_object_get(json_array_get(calls, 0), "function");
    assert_string_equal(json_string_value(json_object_get(fn, "name")), "get");
    assert_string_equal(json_string_value(json_object_get(fn, "arguments")), "{\"a\":1}");
    json_decref(msg);
    pt_msgsplit_free(&m);
}

/* Streamed byte by byte: the deltas add up to the whole message, and each
 * call is two chunks: index/id/type/name/"" then the arguments. */
static void test_deltas(void **state) {
    (void)state;
    pt_msgsplit m;
    pt_msgsplit_opts o = opts(true, false, true);
    pt_msgsplit_init(&m, &o);
    char reasoning[512] = "", content[512] = "";
    json_t *all = json_array();
    for (size_t i = 0; i <= strlen(k_out); i++) {
        if (i < strlen(k_out))
            pt_msgsplit_push(&m, k_out + i, 1);
        else
            pt_msgsplit_finish(&m);
        json_t *d = pt_msgsplit_deltas(&m);
        pt_msgsplit_taken(&m);
        size_t k;
        json_t *x;
        json_array_foreach(d, k, x) {
            const char *r = json_string_value(json_object_get(x, "reasoning_content"));
            const char *c = json_string_value(json_object_get(x, "content"));
            if (r) strcat(reasoning, r);
            if (c) strcat(content, c);
            if (json_object_get(x, "tool_calls")) json_array_append(all, x);
        }
        json_decref(d);
    }
    assert_string_equal(reasoning,
                        "maybe <tool_call>{\"name\":\"x\",\"arguments\":{}}</tool_call>?");
    assert_string_equal(content, "Calling.");
    assert_int_equal(json_array_size(all), 2);
    json_t *head = json_array_get(json_object_get(json_array_get(all, 0), "tool_calls"), 0);
    json_t *body = json_array_get(json_object_get(json_array_get(all, 1), "tool_calls"), 0);
    assert_int_equal(json_integer_value(json_object_get(head, "index")), 0);
    assert_non_null(json_string_value(json_object_get(head, "id")));
    assert_string_equal(json_string_value(json_object_get(head, "type")), "function");
    json_t *fn = json_object_get(head, "function");
    assert_string_equal(json_string_value(json_object_get(fn, "name")), "get");
    assert_string_equal(json_string_value(json_object_get(fn, "arguments")), "");
    assert_int_equal(json_integer_value(json_object_get(body, "index")), 0);
    assert_null(json_object_get(body, "id"));
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(body, "function"), "arguments")),
        "{\"a\":1}");
    /* a later call gets the next index */
    const char *more = "<tool_call>{\"name\":\"b\",\"arguments\":{}}</tool_call>";
    pt_msgsplit_push(&m, more, strlen(more));
    json_t *d = pt_msgsplit_deltas(&m);
    json_t *h2 = json_array_get(json_object_get(json_array_get(d, 0), "tool_calls"), 0);
    assert_int_equal(json_integer_value(json_object_get(h2, "index")), 1);
    json_decref(d);
    json_decref(all);
    pt_msgsplit_free(&m);
}

/* Only whitespace besides the calls: content is null; no reasoning key
 * when there was none; without filters text passes unchanged. */
static void test_content_null_and_plain(void **state) {
    (void)state;
    pt_msgsplit m;
    pt_msgsplit_opts o = opts(false, false, true);
    pt_msgsplit_init(&m, &o);
    const char *out = "\n<tool_call>{\"name\":\"a\",\"arguments\":{}}</tool_call>\n";
    pt_msgsplit_push(&m, out, strlen(out));
    pt_msgsplit_finish(&m);
    json_t *msg = pt_msgsplit_message(&m);
    assert_true(json_is_null(json_object_get(msg, "content")));
    assert_null(json_object_get(msg, "reasoning_content"));
    json_decref(msg);
    pt_msgsplit_free(&m);

    o = opts(true, true, false); /* DeepSeek-R1: inside from the start, no tools */
    pt_msgsplit_init(&m, &o);
    out = "hmm</think>The <tool_call> stays text.";
    pt_msgsplit_push(&m, out, strlen(out));
    pt_msgsplit_finish(&m);
    msg = pt_msgsplit_message(&m);
    assert_string_equal(json_string_value(json_object_get(msg, "reasoning_content")), "hmm");
    assert_string_equal(json_string_value(json_object_get(msg, "content")),
                        "The <tool_call> stays text.");
    assert_null(json_object_get(msg, "tool_calls"));
    json_decref(msg);
    pt_msgsplit_free(&m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_whole),
        cmocka_unit_test(test_deltas),
        cmocka_unit_test(test_content_null_and_plain),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
