/*
 * test_openai.c - request validation and response pieces of the OpenAI
 * layer: every bad request gets the right status, error code and param,
 * good ones land in the right fields.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

#include "server/openai.h"

static const pt_oai_limits k_lim = {.model_id = "stories260K", .n_vocab = 512};

static int parse(pt_oai_request *r, int kind, const char *body, pt_oai_error *e) {
    memset(e, 0, sizeof *e);
    return pt_oai_parse(r, kind, body, strlen(body), &k_lim, e);
}

/* A request that must fail with status, code and param. */
static void bad(int kind, const char *body, int status, const char *code, const char *param) {
    pt_oai_request r;
    pt_oai_error e;
    if (parse(&r, kind, body, &e) == 0) fail_msg("accepted: %s", body);
    if (e.status != status)
        fail_msg("%s: status %d, want %d (%s)", body, e.status, status, e.message);
    if (code) assert_string_equal(e.code, code);
    assert_string_equal(e.param, param ? param : "");
    assert_true(strlen(e.message) > 0);
}

#define CHAT PT_OAI_CHAT
#define COMP PT_OAI_COMPLETION
#define MSG "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]"

static void test_malformed(void **state) {
    (void)state;
    bad(CHAT, "{", 400, "invalid_json", NULL);
    bad(CHAT, "", 400, "invalid_json", NULL);
    bad(CHAT, "{\"a\":1} x", 400, "invalid_json", NULL);
    bad(CHAT, "[1,2]", 400, "invalid_json", NULL);
    bad(CHAT, "\"str\"", 400, "invalid_json", NULL);
    bad(CHAT, "{\"messages\":\"\xff\"}", 400, "invalid_json", NULL); /* not UTF-8 */
}

static void test_wrong_types(void **state) {
    (void)state;
    bad(CHAT, "{" MSG ",\"temperature\":\"hot\"}", 400, "invalid_type", "temperature");
    bad(CHAT, "{" MSG ",\"max_tokens\":1.5}", 400, "invalid_type", "max_tokens");
    bad(CHAT, "{" MSG ",\"max_tokens\":\"10\"}", 400, "invalid_type", "max_tokens");
    bad(CHAT, "{" MSG ",\"stream\":\"yes\"}", 400, "invalid_type", "stream");
    bad(CHAT, "{" MSG ",\"stop\":5}", 400, "invalid_type", "stop");
    bad(CHAT, "{" MSG ",\"stop\":[\"a\",1]}", 400, "invalid_type", "stop");
    bad(CHAT, "{" MSG ",\"logprobs\":1}", 400, "invalid_type", "logprobs");
    bad(CHAT, "{" MSG ",\"seed\":\"x\"}", 400, "invalid_type", "seed");
    bad(CHAT, "{" MSG ",\"model\":7}", 400, "invalid_type", "model");
    bad(CHAT, "{" MSG ",\"reasoning_effort\":3}", 400, "invalid_type", "reasoning_effort");
    bad(CHAT, "{" MSG ",\"stream_options\":{\"include_usage\":1}}", 400, "invalid_type",
        "stream_options.include_usage");
    bad(CHAT, "{\"messages\":{}}", 400, "invalid_type", "messages");
    bad(CHAT, "{\"messages\":[1]}", 400, "invalid_type", "messages[0]");
    bad(CHAT, "{\"messages\":[{\"content\":\"x\"}]}", 400, "invalid_type", "messages[0].role");
    bad(CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":{}}]}", 400, "invalid_type",
        "messages[0].content");
    bad(COMP, "{\"prompt\":{}}", 400, "invalid_type", "prompt");
    bad(COMP, "{\"prompt\":\"x\",\"logprobs\":true}", 400, "invalid_type", "logprobs");
}

static void test_values(void **state) {
    (void)state;
    bad(CHAT, "{" MSG ",\"temperature\":3}", 400, "invalid_value", "temperature");
    bad(CHAT, "{" MSG ",\"top_p\":-0.1}", 400, "invalid_value", "top_p");
    bad(CHAT, "{" MSG ",\"max_tokens\":0}", 400, "invalid_value", "max_tokens");
    bad(CHAT, "{" MSG ",\"max_completion_tokens\":-4}", 400, "invalid_value",
        "max_completion_tokens");
    bad(CHAT, "{" MSG ",\"logprobs\":true,\"top_logprobs\":21}", 400, "invalid_value",
        "top_logprobs");
    bad(CHAT, "{" MSG ",\"top_logprobs\":2}", 400, "invalid_value", "top_logprobs");
    bad(CHAT, "{" MSG ",\"n\":17}", 400, "invalid_value", "n");
    bad(CHAT, "{" MSG ",\"frequency_penalty\":2.5}", 400, "invalid_value", "frequency_penalty");
    bad(CHAT, "{" MSG ",\"logit_bias\":{\"x\":1}}", 400, "invalid_value", "logit_bias");
    bad(CHAT, "{" MSG ",\"logit_bias\":{\"600\":1}}", 400, "invalid_value", "logit_bias");
    bad(CHAT, "{" MSG ",\"logit_bias\":{\"5\":200}}", 400, "invalid_value", "logit_bias");
    bad(CHAT, "{" MSG ",\"response_format\":{\"type\":\"xml\"}}", 400, "unsupported_value",
        "response_format");
    bad(CHAT, "{" MSG ",\"response_format\":{\"type\":\"json_schema\"}}", 400, "invalid_value",
        "response_format");
    bad(CHAT, "{" MSG ",\"reasoning_effort\":\"extreme\"}", 400, "invalid_value",
        "reasoning_effort");

    bad(CHAT, "{\"messages\":[]}", 400, "invalid_value", "messages");
    bad(CHAT, "{\"messages\":[{\"role\":\"wizard\",\"content\":\"x\"}]}", 400, "invalid_value",
        "messages[0].role");
    bad(CHAT, "{\"messages\":[{\"role\":\"user\"}]}", 400, "missing_required_parameter",
        "messages[0].content");
    bad(CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}", 400,
        "unsupported_value", "messages[0].content[0]");
    bad(CHAT, "{}", 400, "missing_required_parameter", "messages");
    bad(COMP, "{\"max_tokens\":5}", 400, "missing_required_parameter", "prompt");
    bad(COMP, "{\"prompt\":[\"a\",\"b\"]}", 400, "unsupported_value", "prompt");
    bad(COMP, "{\"prompt\":[1,2,999]}", 400, "invalid_value", "prompt");
    bad(COMP, "{\"prompt\":[]}", 400, "invalid_value", "prompt");
    bad(COMP, "{\"prompt\":\"x\",\"logprobs\":21}", 400, "invalid_value", "logprobs");
    bad(COMP, "{\"prompt\":\"x\",\"echo\":true}", 400, "unsupported_value", "echo");
    bad(COMP, "{\"prompt\":\"x\",\"best_of\":3}", 400, "unsupported_value", "best_of");
    char many[512] = "{" MSG ",\"stop\":[";
    for (int i = 0; i < PT_STOP_MAX + 1; i++)
        strcat(many, i ? ",\"s\"" : "\"s\"");
    strcat(many, "]}");
    bad(CHAT, many, 400, "invalid_value", "stop");
}

/* A request that must fail with status, code and param, and a message
 * that says want and does not say avoid (NULL: no check). */
static void bad_says(int kind, const char *body, int status, const char *code, const char *param,
                     const char *want, const char *avoid) {
    bad(kind, body, status, code, param);
    pt_oai_request r;
    pt_oai_error e;
    assert_int_equal(parse(&r, kind, body, &e), -1);
    if (want && !strstr(e.message, want))
        fail_msg("%s: message '%s' lacks '%s'", body, e.message, want);
    if (avoid && strstr(e.message, avoid))
        fail_msg("%s: message '%s' says '%s'", body, e.message, avoid);
}

/* Errors point at what is actually wrong (issue 10, item 7). */
static void test_messages_point_right(void **state) {
    (void)state;
    /* a text part without its text is missing the text, not of the wrong type */
    bad_says(CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\"}]}]}", 400,
             "missing_required_parameter", "messages[0].content[0].text", "no 'text'",
             "only text content parts");
    bad_says(CHAT,
             "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},"
             "{\"type\":\"text\",\"text\":5}]}]}",
             400, "invalid_type", "messages[0].content[1].text", "must be a string", NULL);
    bad_says(CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[\"hi\"]}]}", 400,
             "invalid_type", "messages[0].content[0]", "content part", NULL);
    bad_says(CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}",
             400, "unsupported_value", "messages[0].content[0]", "'image_url'", NULL);
    /* a bad token id is named, with its position */
    bad_says(COMP, "{\"prompt\":[1,99999]}", 400, "invalid_value", "prompt", "prompt[1] is 99999",
             NULL);
    bad_says(COMP, "{\"prompt\":[1,-4,3]}", 400, "invalid_value", "prompt", "prompt[1] is -4",
             NULL);
    bad_says(COMP, "{\"prompt\":[1,2.5]}", 400, "invalid_type", "prompt", "prompt[1]", NULL);
    /* NUL in a string: a human message, not jansson's flag name */
    bad_says(CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\\u0000b\"}]}", 400,
             "invalid_value", NULL, "NUL", "JSON_ALLOW_NUL");
    bad_says(COMP, "{\"prompt\":\"\\u0000\"}", 400, "invalid_value", NULL, "NUL", "ALLOW_NUL");
    bad_says(COMP, "{\"prompt\":\"x\",\"a\\u0000\":1}", 400, "invalid_value", NULL, "NUL",
             "ALLOW_NUL");
    /* n: 1 to 16 choices, each a sequence of its own */
    bad_says(CHAT, "{" MSG ",\"n\":0}", 400, "invalid_value", "n", "must be 1 to 16", "requests");
    bad_says(CHAT, "{" MSG ",\"n\":-2}", 400, "invalid_value", "n", "got -2", "requests");
    bad_says(COMP, "{\"prompt\":\"x\",\"best_of\":2}", 400, "unsupported_value", "best_of", "'n'", NULL);
    pt_oai_request r;
    pt_oai_error e;
    assert_int_equal(parse(&r, CHAT, "{" MSG ",\"n\":3}", &e), 0);
    assert_int_equal(r.n, 3);
    pt_oai_request_free(&r);
    assert_int_equal(parse(&r, CHAT, "{" MSG "}", &e), 0);
    assert_int_equal(r.n, 1);
    pt_oai_request_free(&r);
}

/* Ranges come from engine/gen_limits.h, the table the CLI checks too, and
 * the message states them. */
static void test_ranges_from_shared_table(void **state) {
    (void)state;
    bad_says(CHAT, "{" MSG ",\"temperature\":2.5}", 400, "invalid_value", "temperature",
             "'temperature' must be a number between 0 and 2, got 2.5", NULL);
    bad_says(CHAT, "{" MSG ",\"top_k\":-5}", 400, "invalid_value", "top_k",
             "an integer >= -1, got -5", NULL);
    bad_says(CHAT, "{" MSG ",\"min_p\":5}", 400, "invalid_value", "min_p", "between 0 and 1", NULL);
    bad_says(CHAT, "{" MSG ",\"repetition_penalty\":-3}", 400, "invalid_value",
             "repetition_penalty", "between 0.01 and 10", NULL);
    bad_says(CHAT, "{" MSG ",\"logprobs\":true,\"top_logprobs\":100}", 400, "invalid_value",
             "top_logprobs", "between 0 and 20", NULL);
    bad_says(COMP, "{\"prompt\":\"x\",\"logprobs\":100}", 400, "invalid_value", "logprobs",
             "between 0 and 20", NULL);
    bad_says(CHAT, "{" MSG ",\"max_tokens\":0}", 400, "invalid_value", "max_tokens",
             "an integer >= 1, got 0", NULL);
    /* the edges themselves are in range */
    pt_oai_request r;
    pt_oai_error e;
    assert_int_equal(parse(&r, CHAT,
                           "{" MSG ",\"temperature\":2,\"top_p\":0,\"min_p\":1,\"top_k\":-1,"
                           "\"repetition_penalty\":0.01,\"logprobs\":true,\"top_logprobs\":20}",
                           &e),
                     0);
    assert_int_equal(r.sampling.n_logprobs, 20);
    pt_oai_request_free(&r);
}

static void test_unknown_model(void **state) {
    (void)state;
    bad(CHAT, "{\"model\":\"gpt-4\"," MSG "}", 404, "model_not_found", "model");
    bad(COMP, "{\"model\":\"nope\",\"prompt\":\"x\"}", 404, "model_not_found", "model");
}

static void test_good_chat(void **state) {
    (void)state;
    pt_oai_request r;
    pt_oai_error e;
    const char *body =
        "{\"model\":\"stories260K\",\"messages\":[{\"role\":\"system\",\"content\":\"be brief\"},"
        "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"text\","
        "\"text\":\"b\"}]},{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[]}],"
        "\"stream\":true,\"stream_options\":{\"include_usage\":true},\"max_tokens\":50,"
        "\"max_completion_tokens\":20,\"temperature\":0,\"top_p\":0.5,\"top_k\":-1,\"min_p\":0.1,"
        "\"seed\":-3,\"stop\":[\"x\",\"yy\",\"\"],\"logprobs\":true,\"top_logprobs\":3,\"n\":1,"
        "\"user\":\"u1\",\"presence_penalty\":null,\"logit_bias\":{\"5\":-100},\"unknown\":{}}";
    assert_int_equal(parse(&r, CHAT, body, &e), 0);
    assert_true(r.stream && r.include_usage);
    assert_int_equal(r.max_tokens, 20);
    assert_true(r.sampling.temperature == 0.0f);
    assert_true(r.sampling.top_p == 0.5f);
    assert_int_equal(r.sampling.top_k, 0);
    assert_true(r.seed_given);
    assert_true(r.sampling.seed == (uint64_t)-3);
    assert_int_equal(r.stop.n, 2);
    assert_int_equal(r.sampling.n_logprobs, 3);
    assert_string_equal(r.user, "u1");
    assert_int_equal(r.n_bias, 1);
    assert_int_equal(r.bias_ids[0], 5);
    assert_int_equal(json_array_size(r.messages), 3);
    json_t *m1 = json_array_get(r.messages, 1);
    assert_string_equal(json_string_value(json_object_get(m1, "content")), "a\nb");
    pt_oai_request_free(&r);

    assert_int_equal(parse(&r, CHAT, "{" MSG ",\"reasoning_effort\":\"high\"}", &e), 0);
    assert_string_equal(r.reasoning_effort, "high");
    pt_oai_request_free(&r);

    assert_int_equal(parse(&r, CHAT, "{" MSG "}", &e), 0);
    assert_null(r.reasoning_effort);
    assert_false(r.stream);
    assert_int_equal(r.max_tokens, 0); /* chat: until the context is full */
    assert_int_equal(r.sampling.n_logprobs, -1);
    assert_true(r.sampling.temperature == 1.0f);
    pt_oai_request_free(&r);
}

static void test_good_completion(void **state) {
    (void)state;
    pt_oai_request r;
    pt_oai_error e;
    assert_int_equal(parse(&r, COMP, "{\"prompt\":\"Once\",\"logprobs\":2,\"stop\":\"\\n\"}", &e),
                     0);
    assert_string_equal(r.prompt, "Once");
    assert_int_equal(r.max_tokens, 16); /* OpenAI's default for completions */
    assert_int_equal(r.sampling.n_logprobs, 2);
    assert_int_equal(r.stop.n, 1);
    pt_oai_request_free(&r);
    assert_int_equal(parse(&r, COMP, "{\"prompt\":[[1,403,407]]}", &e), 0);
    assert_int_equal(r.n_prompt_ids, 3);
    assert_int_equal(r.prompt_ids[2], 407);
    pt_oai_request_free(&r);
    assert_int_equal(parse(&r, COMP, "{\"prompt\":[\"one\"],\"max_tokens\":3.0}", &e), 0);
    assert_string_equal(r.prompt, "one");
    assert_int_equal(r.max_tokens, 3);
    pt_oai_request_free(&r);
}

static void test_pieces(void **state) {
    (void)state;
    json_t *s = pt_oai_string_lossy("a\xff"
                                    "b\xc3",
                                    4);
    assert_string_equal(json_string_value(s), "a\xef\xbf\xbd"
                                              "b\xef\xbf\xbd");
    json_decref(s);
    json_t *b = pt_oai_bytes("\xe2\x82", 2);
    assert_int_equal(json_integer_value(json_array_get(b, 0)), 0xe2);
    json_decref(b);
    json_t *u = pt_oai_usage(5, 7, 0);
    assert_int_equal(json_integer_value(json_object_get(u, "total_tokens")), 12);
    assert_non_null(json_object_get(json_object_get(u, "prompt_tokens_details"), "cached_tokens"));
    json_decref(u);
    assert_string_equal(pt_oai_finish_reason(PT_FINISH_STOP), "stop");
    assert_string_equal(pt_oai_finish_reason(PT_FINISH_LENGTH), "length");
    pt_oai_error e = {.status = 401, .code = "invalid_api_key"};
    snprintf(e.message, sizeof e.message, "bad key");
    json_t *j = pt_oai_error_json(&e);
    json_t *err = json_object_get(j, "error");
    assert_string_equal(json_string_value(json_object_get(err, "type")), "authentication_error");
    assert_true(json_is_null(json_object_get(err, "param")));
    json_decref(j);
}

/* Predicted Outputs: the text, its parts joined as they are; bad shapes
 * name the field; the usage and timings fields of speculation. */
static void test_prediction(void **state) {
    (void)state;
    pt_oai_request r;
    pt_oai_error e;
    assert_int_equal(parse(&r, CHAT, "{" MSG ",\"prediction\":{\"type\":\"content\",\"content\":\"a b\"}}", &e), 0);
    assert_int_equal(r.prediction_len, 3);
    assert_string_equal(r.prediction, "a b");
    pt_oai_request_free(&r);
    assert_int_equal(parse(&r, CHAT, "{" MSG ",\"prediction\":{\"type\":\"content\",\"content\":"
                                      "[{\"type\":\"text\",\"text\":\"ab\"},{\"type\":\"text\",\"text\":\"c\"}]}}", &e), 0);
    assert_string_equal(r.prediction, "abc");
    pt_oai_request_free(&r);
    assert_int_equal(parse(&r, COMP, "{\"prompt\":\"x\",\"prediction\":null}", &e), 0);
    assert_null(r.prediction);
    pt_oai_request_free(&r);
    bad(CHAT, "{" MSG ",\"prediction\":\"text\"}", 400, "invalid_type", "prediction");
    bad(CHAT, "{" MSG ",\"prediction\":{\"content\":\"x\"}}", 400, "invalid_value", "prediction.type");
    bad(CHAT, "{" MSG ",\"prediction\":{\"type\":\"text\",\"content\":\"x\"}}", 400, "invalid_value", "prediction.type");
    bad(CHAT, "{" MSG ",\"prediction\":{\"type\":\"content\"}}", 400, "missing_required_parameter", "prediction.content");
    bad(CHAT, "{" MSG ",\"prediction\":{\"type\":\"content\",\"content\":1}}", 400, "invalid_type", "prediction.content");
    bad(CHAT, "{" MSG ",\"prediction\":{\"type\":\"content\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"image_url\"}]}}",
        400, "invalid_value", "prediction.content[1]");
    json_t *u = pt_oai_usage(5, 7, 0);
    pt_oai_usage_spec(u, 6, 4);
    json_t *d = json_object_get(u, "completion_tokens_details");
    assert_int_equal(json_integer_value(json_object_get(d, "accepted_prediction_tokens")), 4);
    assert_int_equal(json_integer_value(json_object_get(d, "rejected_prediction_tokens")), 2);
    json_decref(u);
    pt_sched_stats st = {.n_prompt = 3, .n_generated = 9, .n_drafted = 6, .n_accepted = 4};
    json_t *t = pt_oai_timings(&st);
    assert_int_equal(json_integer_value(json_object_get(t, "drafted_tokens")), 6);
    assert_int_equal(json_integer_value(json_object_get(t, "accepted_tokens")), 4);
    json_decref(t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_malformed), cmocka_unit_test(test_wrong_types),
        cmocka_unit_test(test_values),    cmocka_unit_test(test_unknown_model),
        cmocka_unit_test(test_good_chat), cmocka_unit_test(test_good_completion),
        cmocka_unit_test(test_pieces),
        cmocka_unit_test(test_messages_point_right),
        cmocka_unit_test(test_ranges_from_shared_table),
        cmocka_unit_test(test_prediction),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
