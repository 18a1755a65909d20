/*
 * test_family_chat.c - the real chat templates of the families of issue 16
 * as `petrel serve` renders and reads them: the prompt each renders for a
 * conversation (exact text where the template is deterministic), and what
 * the server learns from its source (thinking, harmony, the tool-call
 * family).
 *
 * Templates (the models' own, byte for byte; llama.cpp keeps copies under
 * models/templates/, from which these were taken):
 *   Gemma 2     tests/template/chat/google-gemma-2-2b-it.jinja
 *   Gemma 3     fuzz/corpus/jinja/gemma3.jinja
 *   Qwen3(-MoE) fuzz/corpus/jinja/qwen3.jinja (Qwen3-30B-A3B ships the
 *               same template as the dense Qwen3 models)
 *   gpt-oss     tests/template/chat/openai-gpt-oss-120b.jinja (gpt-oss-20b's
 *               is the same)
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

#include "io/model_file.h"
#include "server/harmony.h"
#include "server/reasoning.h"
#include "server/tools.h"
#include "tokenizer/chat_template.h"

static char *load(const char *path) {
    char *s = NULL;
    size_t n;
    pt_err err = {{0}};
    if (pt_read_file(path, 1u << 20, &s, &n, &err)) fail_msg("%s", err.msg);
    return s;
}

/* Renders messages (JSON text) with tools and extra kwargs (JSON or NULL);
 * returns the prompt or NULL with err set. */
static char *render(const char *tpl, const char *messages, const char *tools, const char *extra,
                    pt_err *err) {
    json_t *m = json_loads(messages, 0, NULL), *t = tools ? json_loads(tools, 0, NULL) : NULL;
    json_t *x = extra ? json_loads(extra, 0, NULL) : NULL;
    assert_non_null(m);
    pt_tools_prepare_messages(m);
    if (pt_harmony_template(tpl)) pt_harmony_prepare_messages(m); /* as completion.c */
    char *out = NULL;
    int rc = pt_chat_render(tpl, m, t, true, "<bos>", "<eos>", x, &out, NULL, err);
    json_decref(m);
    json_decref(t);
    json_decref(x);
    return rc ? NULL : out;
}

static const char k_chat[] = "[{\"role\":\"user\",\"content\":\"Hi\"},"
                             "{\"role\":\"assistant\",\"content\":\"Hello.\"},"
                             "{\"role\":\"user\",\"content\":\"  Bye  \"}]";
static const char k_sys[] = "[{\"role\":\"system\",\"content\":\"Be terse.\"},"
                            "{\"role\":\"user\",\"content\":\"Hi\"}]";

/* Gemma 2 has no system role: its template raises, which the server
 * answers with a 400 carrying this message (completion.c); turns are
 * trimmed, the assistant is "model". */
static void test_gemma2(void **state) {
    (void)state;
    char *tpl = load("tests/template/chat/google-gemma-2-2b-it.jinja");
    pt_err err = {{0}};
    char *p = render(tpl, k_chat, NULL, NULL, &err);
    assert_non_null(p);
    assert_string_equal(p, "<bos><start_of_turn>user\nHi<end_of_turn>\n"
                           "<start_of_turn>model\nHello.<end_of_turn>\n"
                           "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n");
    free(p);
    assert_null(render(tpl, k_sys, NULL, NULL, &err));
    assert_non_null(strstr(err.msg, "System role not supported"));
    assert_false(pt_reason_template_thinks(tpl));
    assert_false(pt_harmony_template(tpl));
    free(tpl);
}

/* Gemma 3 folds the system message into the first user turn. */
static void test_gemma3(void **state) {
    (void)state;
    char *tpl = load("fuzz/corpus/jinja/gemma3.jinja");
    pt_err err = {{0}};
    char *p = render(tpl, k_sys, NULL, NULL, &err);
    assert_non_null(p);
    assert_string_equal(p, "<bos><start_of_turn>user\nBe terse.\n\nHi<end_of_turn>\n"
                           "<start_of_turn>model\n");
    free(p);
    assert_false(pt_reason_template_thinks(tpl));
    assert_false(pt_harmony_template(tpl));
    free(tpl);
}

/* Qwen3-MoE: <think> is the model's to open (the reasoning filter starts
 * outside); enable_thinking false renders an empty one; tools are Hermes
 * <tool_call> blocks, and a past call and its result render back. */
static void test_qwen3(void **state) {
    (void)state;
    char *tpl = load("fuzz/corpus/jinja/qwen3.jinja");
    pt_err err = {{0}};
    char *p = render(tpl, k_sys, NULL, NULL, &err);
    assert_string_equal(p, "<|im_start|>system\nBe terse.<|im_end|>\n"
                           "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
    assert_false(pt_reason_prompt_open(p, strlen(p)));
    free(p);
    p = render(tpl, k_sys, NULL, "{\"enable_thinking\": false}", &err);
    assert_non_null(strstr(p, "<|im_start|>assistant\n<think>\n\n</think>\n\n"));
    free(p);
    assert_true(pt_reason_template_thinks(tpl));
    assert_false(pt_harmony_template(tpl));
    assert_int_equal(pt_tool_family_of(tpl), PT_TOOLS_HERMES);
    p = render(tpl,
               "[{\"role\":\"user\",\"content\":\"Weather?\"},"
               "{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":[{\"id\":\"c1\",\"type\":"
               "\"function\",\"function\":{\"name\":\"w\",\"arguments\":\"{\\\"city\\\":"
               "\\\"Oslo\\\"}\"}}]},"
               "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"3C\"}]",
               "[{\"type\":\"function\",\"function\":{\"name\":\"w\",\"parameters\":{}}}]", NULL,
               &err);
    assert_non_null(p);
    assert_non_null(strstr(
        p, "<tool_call>\n{\"name\": \"w\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>"));
    assert_non_null(
        strstr(p, "<|im_start|>user\n<tool_response>\n3C\n</tool_response><|im_end|>\n"));
    free(p);
    free(tpl);
}

static const char k_weather_tool[] =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"The "
    "weather\","
    "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},"
    "\"required\":[\"city\"]}}}]";

/* gpt-oss: harmony (not <think>); the system message is the template's
 * own (reasoning effort from the kwargs), the request's system message
 * becomes the developer's instructions, tools a TypeScript namespace; the
 * prompt ends with <|start|>assistant, the header the output filter
 * starts from; a past call (content null, as the openai client sends it)
 * and its result render as harmony messages. */
static void test_gpt_oss(void **state) {
    (void)state;
    char *tpl = load("tests/template/chat/openai-gpt-oss-120b.jinja");
    assert_true(pt_harmony_template(tpl));
    assert_false(pt_reason_template_thinks(tpl));
    pt_err err = {{0}};
    char *p = render(tpl, k_sys, NULL, "{\"reasoning_effort\": \"high\"}", &err);
    assert_non_null(p);
    static const char head[] = "<|start|>system<|message|>You are ChatGPT, a large language model "
                               "trained by OpenAI.\nKnowledge cutoff: 2024-06\nCurrent date: ";
    assert_int_equal(strncmp(p, head, strlen(head)), 0);
    const char *rest = strstr(p, "\n\nReasoning: high\n\n# Valid channels: analysis, commentary, "
                                 "final. Channel must be included for every message.<|end|>");
    assert_non_null(rest);
    assert_string_equal(strstr(rest, "<|end|>"),
                        "<|end|><|start|>developer<|message|># Instructions\n\nBe terse.\n\n<|end|>"
                        "<|start|>user<|message|>Hi<|end|><|start|>assistant");
    free(p);

    p = render(
        tpl,
        "[{\"role\":\"user\",\"content\":\"Weather in Oslo?\"},"
        "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"c1\",\"type\":"
        "\"function\","
        "\"function\":{\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\":\\\"Oslo\\\"}\"}}]},"
        "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"3C\"}]",
        k_weather_tool, NULL, &err);
    assert_non_null(p);
    assert_non_null(
        strstr(p, "\nCalls to these tools must go to the commentary channel: 'functions'.<|end|>"));
    assert_non_null(strstr(
        p, "<|start|>developer<|message|># Tools\n\n## functions\n\nnamespace functions {\n\n"
           "// The weather\ntype get_weather = (_: {\ncity: string,\n}) => any;\n\n"
           "} // namespace functions<|end|>"));
    assert_non_null(strstr(p,
                           "<|start|>assistant to=functions.get_weather<|channel|>commentary json"
                           "<|message|>{\"city\": \"Oslo\"}<|call|>"
                           "<|start|>functions.get_weather to=assistant<|channel|>commentary"
                           "<|message|>\"3C\"<|end|><|start|>assistant"));
    free(p);
    free(tpl);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gemma2),
        cmocka_unit_test(test_gemma3),
        cmocka_unit_test(test_qwen3),
        cmocka_unit_test(test_gpt_oss),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
