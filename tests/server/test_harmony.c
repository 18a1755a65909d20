/*
 * test_harmony.c - the harmony splitter (gpt-oss) through the chat
 * answer's filter (message.h): the analysis channel is reasoning_content,
 * the final channel content, a commentary message to functions.NAME a
 * tool call; markers are whole chunks (each is one special token, and the
 * detokenizer hands a token's text at once) or split anywhere (stop-string
 * hold-back may cut between tokens).  Malformed output is content.
 *
 * The outputs are written in the format the real template renders
 * (tests/template/chat/openai-gpt-oss-120b.jinja: an assistant call is
 * "<|start|>assistant to=functions.NAME<|channel|>commentary json
 * <|message|>ARGS<|call|>") and OpenAI's harmony documentation (the model
 * writes the recipient after the channel, and "<|constrain|>json").
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

#include "server/message.h"
#include "tokenizer/tokenizer.h"

typedef struct answer {
    char reasoning[4096], content[4096];
    json_t *calls; /* the tool_calls of the message, or of the deltas */
} answer;

static pt_msgsplit_opts opts(bool tools) {
    return (pt_msgsplit_opts){.harmony = true, .tools = tools, .id_seed = 11};
}

/* The whole answer at once. */
static json_t *whole(const pt_msgsplit_opts *o, const char *out) {
    pt_msgsplit m;
    pt_msgsplit_init(&m, o);
    pt_msgsplit_push(&m, out, strlen(out));
    pt_msgsplit_finish(&m);
    json_t *msg = pt_msgsplit_message(&m);
    pt_msgsplit_free(&m);
    return msg;
}

static void gather(pt_msgsplit *m, answer *a) {
    json_t *d = pt_msgsplit_deltas(m);
    pt_msgsplit_taken(m);
    size_t k;
    json_t *x;
    json_array_foreach(d, k, x) {
        const char *r = json_string_value(json_object_get(x, "reasoning_content"));
        const char *c = json_string_value(json_object_get(x, "content"));
        if (r) strcat(a->reasoning, r);
        if (c) strcat(a->content, c);
        if (json_object_get(x, "tool_calls")) json_array_append(a->calls, x);
    }
    json_decref(d);
}

/* Streamed in pieces of `step` bytes; deltas gathered after each. */
static void streamed(const pt_msgsplit_opts *o, const char *out, size_t step, answer *a) {
    memset(a, 0, sizeof *a);
    a->calls = json_array();
    pt_msgsplit m;
    pt_msgsplit_init(&m, o);
    size_t n = strlen(out);
    for (size_t i = 0; i < n; i += step) {
        pt_msgsplit_push(&m, out + i, PT_MIN(step, n - i));
        gather(&m, a);
    }
    pt_msgsplit_finish(&m);
    gather(&m, a);
    pt_msgsplit_free(&m);
}

static const char *str(const json_t *msg, const char *key) {
    return json_string_value(json_object_get(msg, key));
}

static const char k_think_answer[] = "<|channel|>analysis<|message|>User says hi. Reply."
                                     "<|end|><|start|>assistant<|channel|>final<|message|>"
                                     "Hello! How can I help?<|return|>";

/* analysis -> reasoning_content, final -> content, markers gone. */
static void test_channels(void **state) {
    (void)state;
    pt_msgsplit_opts o = opts(false);
    json_t *msg = whole(&o, k_think_answer);
    assert_string_equal(str(msg, "reasoning_content"), "User says hi. Reply.");
    assert_string_equal(str(msg, "content"), "Hello! How can I help?");
    assert_null(json_object_get(msg, "tool_calls"));
    json_decref(msg);
    /* <|return|> ends generation, so it never arrives: same answer */
    char cut[sizeof k_think_answer];
    snprintf(cut, sizeof cut, "%.*s", (int)(strlen(k_think_answer) - strlen("<|return|>")),
             k_think_answer);
    msg = whole(&o, cut);
    assert_string_equal(str(msg, "content"), "Hello! How can I help?");
    json_decref(msg);
}

/* Streamed at every piece size, the deltas add up to the whole answer. */
static void test_channels_streamed(void **state) {
    (void)state;
    pt_msgsplit_opts o = opts(false);
    for (size_t step = 1; step <= 16; step++) {
        answer a;
        streamed(&o, k_think_answer, step, &a);
        assert_string_equal(a.reasoning, "User says hi. Reply.");
        assert_string_equal(a.content, "Hello! How can I help?");
        assert_int_equal(json_array_size(a.calls), 0);
        json_decref(a.calls);
    }
}

static const char k_call[] =
    "<|channel|>analysis<|message|>Need weather.<|end|>"
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
    "<|message|>{\"city\": \"Paris\", \"unit\": \"c\"}<|call|>";

/* A call in the channel's header and one in the role's (as the template
 * renders past calls): name, compact arguments, an id. */
static void test_tool_call(void **state) {
    (void)state;
    pt_msgsplit_opts o = opts(true);
    json_t *msg = whole(&o, k_call);
    assert_string_equal(str(msg, "reasoning_content"), "Need weather.");
    assert_true(json_is_null(json_object_get(msg, "content")));
    json_t *calls = json_object_get(msg, "tool_calls");
    assert_int_equal(json_array_size(calls), 1);
    json_t *c = json_array_get(calls, 0);
    assert_string_equal(str(c, "type"), "function");
    assert_int_equal(strncmp(str(c, "id"), "call_", 5), 0);
    json_t *fn = json_object_get(c, "function");
    assert_string_equal(str(fn, "name"), "get_weather");
    assert_string_equal(str(fn, "arguments"), "{\"city\":\"Paris\",\"unit\":\"c\"}");
    json_decref(msg);

    msg = whole(&o, "<|start|>assistant to=functions.add<|channel|>commentary json<|message|>"
                    "{\"a\": 1, \"b\": 2}"); /* <|call|> ended generation */
    calls = json_object_get(msg, "tool_calls");
    assert_int_equal(json_array_size(calls), 1);
    fn = json_object_get(json_array_get(calls, 0), "function");
    assert_string_equal(str(fn, "name"), "add");
    assert_string_equal(str(fn, "arguments"), "{\"a\":1,\"b\":2}");
    json_decref(msg);
}

/* Streamed: the call is OpenAI's two chunks, whatever the piece size. */
static void test_tool_call_streamed(void **state) {
    (void)state;
    pt_msgsplit_opts o = opts(true);
    for (size_t step = 1; step <= 9; step += 2) {
        answer a;
        streamed(&o, k_call, step, &a);
        assert_string_equal(a.reasoning, "Need weather.");
        assert_string_equal(a.content, "");
        assert_int_equal(json_array_size(a.calls), 2);
        json_t *first =
            json_array_get(json_object_get(json_array_get(a.calls, 0), "tool_calls"), 0);
        json_t *second =
            json_array_get(json_object_get(json_array_get(a.calls, 1), "tool_calls"), 0);
        assert_int_equal(json_integer_value(json_object_get(first, "index")), 0);
        assert_string_equal(str(json_object_get(first, "function"), "name"), "get_weather");
        assert_string_equal(str(json_object_get(first, "function"), "arguments"), "");
        assert_string_equal(str(json_object_get(second, "function"), "arguments"),
                            "{\"city\":\"Paris\",\"unit\":\"c\"}");
        json_decref(a.calls);
    }
}

/* Malformed: invalid JSON in a call, a call when no tools were given, text
 * that is not harmony at all, an unclosed analysis: content (or
 * reasoning), never a crash, and nothing lost. */
static void test_malformed(void **state) {
    (void)state;
    pt_msgsplit_opts tools = opts(true), none = opts(false);
    json_t *msg = whole(&tools, "<|channel|>commentary to=functions.f <|constrain|>json<|message|>"
                                "{\"a\": <|call|>");
    assert_null(json_object_get(msg, "tool_calls"));
    assert_string_equal(str(msg, "content"), "{\"a\": ");
    json_decref(msg);

    msg = whole(&none, "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{}");
    assert_null(json_object_get(msg, "tool_calls"));
    assert_string_equal(str(msg, "content"), "{}");
    json_decref(msg);

    msg = whole(&none, "just words, no harmony");
    assert_string_equal(str(msg, "content"), "just words, no harmony");
    json_decref(msg);

    /* a stray marker in text that is not harmony stays in the text */
    msg = whole(&none, "x<|end|>y<|channel|>z");
    assert_string_equal(str(msg, "content"), "xy<|channel|>z");
    json_decref(msg);

    msg = whole(&none, "<|channel|>analysis<|message|>thinking until max_tokens");
    assert_string_equal(str(msg, "reasoning_content"), "thinking until max_tokens");
    assert_string_equal(str(msg, "content"), "");
    json_decref(msg);

    /* a header cut by max_tokens leaves nothing behind */
    msg = whole(&none, "<|channel|>analysis<|message|>a<|end|><|start|>assistant<|chan");
    assert_string_equal(str(msg, "reasoning_content"), "a");
    assert_string_equal(str(msg, "content"), "");
    json_decref(msg);

    /* a long run with no header is the answer, not held forever */
    char big[2048];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = 0;
    answer a;
    streamed(&none, big, 64, &a);
    assert_int_equal(strlen(a.content), sizeof big - 1);
    json_decref(a.calls);
}

/* A forced call: the prompt holds the header, the output is the body
 * (the named function's arguments, or {"name", "arguments"}); a forced
 * final answer (response_format) is content. */
static void test_forced(void **state) {
    (void)state;
    pt_msgsplit_opts o = opts(true);
    o.tool_forced = true;
    o.forced_name = "get_weather";
    json_t *msg = whole(&o, "{\"city\": \"Oslo\", \"unit\": \"f\"}");
    json_t *fn = json_object_get(json_array_get(json_object_get(msg, "tool_calls"), 0), "function");
    assert_string_equal(str(fn, "name"), "get_weather");
    assert_string_equal(str(fn, "arguments"), "{\"city\":\"Oslo\",\"unit\":\"f\"}");
    json_decref(msg);

    o.forced_name = NULL;
    msg = whole(&o, "{\"name\": \"add\", \"arguments\": {\"a\": 2}}");
    fn = json_object_get(json_array_get(json_object_get(msg, "tool_calls"), 0), "function");
    assert_string_equal(str(fn, "name"), "add");
    assert_string_equal(str(fn, "arguments"), "{\"a\":2}");
    json_decref(msg);

    pt_msgsplit_opts f = opts(false);
    f.harmony_final = true;
    msg = whole(&f, "{\"x\": 1}");
    assert_string_equal(str(msg, "content"), "{\"x\": 1}");
    assert_null(json_object_get(msg, "reasoning_content"));
    json_decref(msg);

    char *h = pt_harmony_call_header("get_weather");
    assert_string_equal(
        h, "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>");
    free(h);
}

/* A byte-level vocabulary with harmony's special tokens (ids as small as
 * the test needs; detokenizing needs no merges). */
static const char k_harmony_vocab[] =
    "{\"added_tokens\": ["
    " {\"id\": 10, \"content\": \"<|start|>\", \"special\": true},"
    " {\"id\": 11, \"content\": \"<|end|>\", \"special\": true},"
    " {\"id\": 12, \"content\": \"<|message|>\", \"special\": true},"
    " {\"id\": 13, \"content\": \"<|channel|>\", \"special\": true},"
    " {\"id\": 14, \"content\": \"<|return|>\", \"special\": true},"
    " {\"id\": 15, \"content\": \"<|call|>\", \"special\": true},"
    " {\"id\": 16, \"content\": \"<|constrain|>\", \"special\": true}],"
    " \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false,"
    "  \"trim_offsets\": true, \"use_regex\": true},"
    " \"decoder\": {\"type\": \"ByteLevel\"},"
    " \"model\": {\"type\": \"BPE\", \"vocab\": {\"Hi\": 0, \"!\": 1, \"\\u0120there\": 2,"
    "  \"analysis\": 3, \"final\": 4, \"assistant\": 5, \"commentary\": 6,"
    "  \"\\u0120to\": 7, \"=functions.f\": 8, \"json\": 9, \"{}\": 17, \"\\u0120\": 18,"
    "  \"hmm\": 19}, \"merges\": []}}";

/* Token ids through the detokenizer as the server runs it for a harmony
 * template (special tokens kept) and into the splitter; and which tokens
 * end generation: <|return|> and <|call|>, never <|end|>, which in
 * harmony only ends the reasoning message (a Phi-3-style vocabulary
 * without <|channel|> keeps <|end|> as its end of turn). */
static void test_tokens(void **state) {
    (void)state;
    pt_tokenizer *t;
    pt_err err = {{0}};
    if (pt_tokenizer_load_json_mem(&t, k_harmony_vocab, strlen(k_harmony_vocab), NULL, &err))
        fail_msg("%s", err.msg);
    assert_false(pt_tokenizer_is_eog(t, 11));
    assert_true(pt_tokenizer_is_eog(t, 14));
    assert_true(pt_tokenizer_is_eog(t, 15));
    /* <|channel|>analysis<|message|>hmm<|end|><|start|>assistant<|channel|>final
     * <|message|>Hi there!  then a call: ... commentary to=functions.f <|constrain|>json
     * <|message|>{} */
    const int32_t ids[] = {13, 3,  12, 19, 11, 10, 5, 13, 4,  12, 0,  2, 1,
                           11, 10, 5,  13, 6,  7,  8, 18, 16, 9,  12, 17};
    pt_msgsplit_opts o = opts(true);
    pt_msgsplit m;
    pt_msgsplit_init(&m, &o);
    pt_detok d;
    pt_detok_init(&d, t);
    d.at_start = true;
    d.skip_special = false; /* completion.c for a harmony template */
    char buf[256];
    for (size_t i = 0; i < PT_ARRAY_LEN(ids); i++) {
        size_t n = pt_detok_push(&d, ids[i], buf, sizeof buf);
        pt_msgsplit_push(&m, buf, n);
    }
    pt_msgsplit_push(&m, buf, pt_detok_flush(&d, buf, sizeof buf));
    pt_msgsplit_finish(&m);
    json_t *msg = pt_msgsplit_message(&m);
    assert_string_equal(str(msg, "reasoning_content"), "hmm");
    assert_string_equal(str(msg, "content"), "Hi there!");
    json_t *fn = json_object_get(json_array_get(json_object_get(msg, "tool_calls"), 0), "function");
    assert_string_equal(str(fn, "name"), "f");
    assert_string_equal(str(fn, "arguments"), "{}");
    json_decref(msg);
    pt_msgsplit_free(&m);
    pt_tokenizer_free(t);

    /* without <|channel|>: <|end|> is an end of turn as before */
    char phi[sizeof k_harmony_vocab];
    snprintf(phi, sizeof phi, "%s", k_harmony_vocab);
    memcpy(strstr(phi, "<|channel|>"), "<|chanxel|>", 11);
    if (pt_tokenizer_load_json_mem(&t, phi, strlen(phi), NULL, &err)) fail_msg("%s", err.msg);
    assert_true(pt_tokenizer_is_eog(t, 11));
    pt_tokenizer_free(t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_channels),  cmocka_unit_test(test_channels_streamed),
        cmocka_unit_test(test_tool_call), cmocka_unit_test(test_tool_call_streamed),
        cmocka_unit_test(test_malformed), cmocka_unit_test(test_forced),
        cmocka_unit_test(test_tokens),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
