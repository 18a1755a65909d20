/*
 * test_tools.c - tool-call parsing per template family (Hermes/Qwen,
 * Llama 3.1, Mistral), streamed and not, including malformed output, and
 * the forced-call grammar.
 *
 * Every case is fed three ways - whole, byte by byte, and in chunks of 3 -
 * and must give the same content and calls each time: the streamed parser
 * is the non-streamed one by construction.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

#include "server/tools.h"

typedef struct got {
    char text[4096];
    size_t len;
    json_t *calls;
} got;

static void on_text(void *u, const char *s, size_t n) {
    got *g = u;
    assert_true(g->len + n < sizeof g->text);
    memcpy(g->text + g->len, s, n);
    g->len += n;
    g->text[g->len] = 0;
}

static void on_call(void *u, json_t *c) {
    json_array_append_new(((got *)u)->calls, c);
}

static void run(int family, bool forced, const char *out, size_t chunk, got *g) {
    memset(g, 0, sizeof *g);
    g->calls = json_array();
    pt_toolparse p;
    pt_toolparse_init(&p, family, forced, 42, on_text, on_call, g);
    size_t n = strlen(out);
    for (size_t i = 0; i < n; i += chunk)
        pt_toolparse_push(&p, out + i, i + chunk <= n ? chunk : n - i);
    pt_toolparse_flush(&p);
    pt_toolparse_free(&p);
}

/* Checks content and the calls' names and arguments (as JSON values);
 * want_calls is "name:args|name:args" or "". */
static void check(int family, bool forced, const char *out, const char *want_text,
                  const char *want_calls) {
    size_t chunks[] = {100000, 1, 3};
    for (size_t c = 0; c < 3; c++) {
        got g;
        run(family, forced, out, chunks[c], &g);
        assert_string_equal(g.text, want_text);
        char buf[1024] = "";
        size_t i;
        json_t *call;
        json_array_foreach(g.calls, i, call) {
            json_t *fn = json_object_get(call, "function");
            assert_string_equal(json_string_value(json_object_get(call, "type")), "function");
            const char *id = json_string_value(json_object_get(call, "id"));
            assert_non_null(id);
            assert_int_equal(strlen(id), 29);
            assert_memory_equal(id, "call_", 5);
            /* arguments is a string holding JSON */
            const char *a = json_string_value(json_object_get(fn, "arguments"));
            assert_non_null(a);
            json_t *v = json_loads(a, 0, NULL);
            assert_non_null(v);
            char *canon = json_dumps(v, JSON_COMPACT | JSON_SORT_KEYS);
            snprintf(buf + strlen(buf), sizeof buf - strlen(buf), "%s%s:%s", i ? "|" : "",
                     json_string_value(json_object_get(fn, "name")), canon);
            free(canon);
            json_decref(v);
        }
        /* ids are distinct */
        if (json_array_size(g.calls) == 2)
            assert_string_not_equal(
                json_string_value(json_object_get(json_array_get(g.calls, 0), "id")),
                json_string_value(json_object_get(json_array_get(g.calls, 1), "id")));
        assert_string_equal(buf, want_calls);
        json_decref(g.calls);
    }
}

static void test_hermes(void **state) {
    (void)state;
    int f = PT_TOOLS_HERMES;
    check(f, false, "Just text, no calls.", "Just text, no calls.", "");
    check(f, false,
          "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
          "\"Paris\"}}\n</tool_call>",
          "", "get_weather:{\"city\":\"Paris\"}");
    /* text before, two parallel calls, whitespace between */
    check(f, false,
          "Let me look.\n<tool_call>{\"name\":\"a\",\"arguments\":{\"x\":1}}</tool_call>\n"
          "<tool_call>{\"name\":\"b\",\"arguments\":{}}</tool_call>",
          "Let me look.", "a:{\"x\":1}|b:{}");
    /* whitespace around calls is layout: held, then dropped */
    check(f, false, "\n\n<tool_call>{\"name\":\"a\",\"arguments\":{}}</tool_call>\n", "", "a:{}");
    /* but it stays in text that makes no call, in order */
    check(f, false, "a \n b\n\n", "a \n b\n\n", "");
    /* arguments given as a JSON string pass through */
    check(f, false, "<tool_call>{\"name\":\"a\",\"arguments\":\"{\\\"y\\\":2}\"}</tool_call>", "",
          "a:{\"y\":2}");
    /* a '<' that is not the tag is text, held only while it may be one */
    check(f, false, "1 < 2 and <tool but not a call", "1 < 2 and <tool but not a call", "");
}

static void test_hermes_malformed(void **state) {
    (void)state;
    int f = PT_TOOLS_HERMES;
    /* unclosed tag: everything back as content, byte for byte */
    check(f, false, "ok <tool_call>{\"name\":\"a\",\"arguments\":{}}",
          "ok <tool_call>{\"name\":\"a\",\"arguments\":{}}", "");
    check(f, false, "ok \n <tool_call>{\"name\":", "ok \n <tool_call>{\"name\":", "");
    /* invalid JSON inside a closed tag */
    check(f, false, "<tool_call>{\"name\": \"a\", \"arguments\": {</tool_call> after",
          "<tool_call>{\"name\": \"a\", \"arguments\": {</tool_call> after", "");
    /* valid JSON that is not a call */
    check(f, false, "<tool_call>[1,2]</tool_call>", "<tool_call>[1,2]</tool_call>", "");
    check(f, false, "<tool_call>{\"arguments\":{}}</tool_call>",
          "<tool_call>{\"arguments\":{}}</tool_call>", "");
    /* a good call next to a bad one: the good one is a call */
    check(f, false,
          "<tool_call>oops</tool_call><tool_call>{\"name\":\"b\",\"arguments\":{}}</tool_call>",
          "<tool_call>oops</tool_call>", "b:{}");
    check(f, false, "x\n<tool_call>bad</tool_call>\n", "x\n<tool_call>bad</tool_call>\n", "");
    /* the tag cut short at the end */
    check(f, false, "text <tool_ca", "text <tool_ca", "");
}

static void test_llama3(void **state) {
    (void)state;
    int f = PT_TOOLS_LLAMA3;
    check(f, false, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}", "",
          "get_weather:{\"city\":\"Oslo\"}");
    check(f, false,
          "<|python_tag|>{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"parameters\": "
          "{\"k\": [1]}}",
          "", "a:{}|b:{\"k\":[1]}");
    check(f, false, "  The answer is 4.", "  The answer is 4.", "");
    /* JSON that is not a call is the answer itself */
    check(f, false, "{\"answer\": 4}", "{\"answer\": 4}", "");
    check(f, false, "{\"name\": \"a\", \"parameters\": {", "{\"name\": \"a\", \"parameters\": {",
          "");
    check(f, false, "<|python_tag|>not json", "<|python_tag|>not json", "");
    /* a '{' later in prose is prose */
    check(f, false, "Use {\"name\": \"a\", \"parameters\": {}}",
          "Use {\"name\": \"a\", \"parameters\": {}}", "");
}

static void test_mistral(void **state) {
    (void)state;
    int f = PT_TOOLS_MISTRAL;
    check(f, false,
          "[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {\"q\": \"x\"}}, {\"name\": \"b\", "
          "\"arguments\": {}}]",
          "", "a:{\"q\":\"x\"}|b:{}");
    /* the control token dropped by the detokenizer: a leading array */
    check(f, false, " [{\"name\": \"a\", \"arguments\": {}}]", "", "a:{}");
    check(f, false, "Sure. [TOOL_CALLS][{\"name\": \"a\", \"arguments\": {}}]", "Sure.", "a:{}");
    check(f, false, "[1, 2, 3]", "[1, 2, 3]", "");
    check(f, false, "[TOOL_CALLS][{\"name\": \"a\"", "[TOOL_CALLS][{\"name\": \"a\"", "");
    check(f, false, "[citation needed]", "[citation needed]", "");
}

static void test_forced(void **state) {
    (void)state;
    /* the markup is in the prompt: the output is the JSON alone */
    check(PT_TOOLS_HERMES, true, "{\"name\":\"a\",\"arguments\":{\"n\":3}}", "", "a:{\"n\":3}");
    check(PT_TOOLS_HERMES, true, "{\"name\":\"a\",\"arguments\":{}}\n</tool_call>", "", "a:{}");
    check(PT_TOOLS_MISTRAL, true, "[{\"name\":\"a\",\"arguments\":{}}]", "", "a:{}");
    check(PT_TOOLS_LLAMA3, true, "{\"name\":\"a\",\"parameters\":{}}", "", "a:{}");
    /* cut short by max_tokens: the text, not a crash */
    check(PT_TOOLS_HERMES, true, "{\"name\":\"a\",\"argu", "{\"name\":\"a\",\"argu", "");
    /* several forced Hermes calls, each closed and the next opened as the
     * grammar writes them; a closing tag inside a string is not the close */
    check(PT_TOOLS_HERMES, true,
          "{\"name\":\"a\",\"arguments\":{\"n\":1}}\n</tool_call>\n<tool_call>\n"
          "{\"name\":\"b\",\"arguments\":{\"s\":\"</tool_call>\"}}\n</tool_call>",
          "", "a:{\"n\":1}|b:{\"s\":\"</tool_call>\"}");
    check(PT_TOOLS_HERMES, true, "{\"name\":\"b\",\"arguments\":{\"s\":\"x</tool_call>\"}}", "",
          "b:{\"s\":\"x</tool_call>\"}");
}

static const char *k_tools =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":"
    "\"object\","
    "\"properties\":{\"city\":{\"type\":\"string\"},\"unit\":{\"enum\":[\"c\",\"f\"]}},"
    "\"required\":[\"city\"],\"additionalProperties\":false}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"add\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"a\":{\"$ref\":\"#/$defs/"
    "n\"}},\"required\":[\"a\"],\"$defs\":{\"n\":{\"type\":\"integer\"}}}}}]";

static bool grammar_accepts(pt_grammar *g, const char *s) {
    /* a one-byte-per-token vocabulary runs the grammar over bytes */
    static char bytes[256][2];
    static const char *ptrs[256];
    static size_t lens[256];
    for (int i = 0; i < 256; i++)
        bytes[i][0] = (char)i, ptrs[i] = bytes[i], lens[i] = 1;
    pt_gvocab *v = pt_gvocab_from_bytes(256, ptrs, lens);
    pt_gmatcher *m = pt_gmatcher_new(g, v);
    bool ok = true;
    for (const char *c = s; *c && ok; c++)
        ok = pt_gmatcher_accept(m, (unsigned char)*c);
    ok = ok && pt_gmatcher_is_accepting(m);
    pt_gmatcher_free(m);
    pt_gvocab_free(v);
    return ok;
}

static void test_choice_and_grammar(void **state) {
    (void)state;
    json_t *tools = json_loads(k_tools, 0, NULL);
    assert_non_null(tools);
    pt_tool_choice c;
    const char *param;
    pt_err err = {{0}};
    assert_int_equal(pt_tools_check(tools, NULL, NULL, &c, &param, &err), 0);
    assert_int_equal(c.mode, PT_TOOL_AUTO);
    assert_true(c.parallel);
    json_t *named = json_loads("{\"type\":\"function\",\"function\":{\"name\":\"add\"}}", 0, NULL);
    assert_int_equal(pt_tools_check(tools, named, json_false(), &c, &param, &err), 0);
    assert_int_equal(c.mode, PT_TOOL_NAMED);
    assert_string_equal(c.name, "add");
    assert_false(c.parallel);

    pt_grammar *g;
    assert_int_equal(pt_tools_forced_grammar(tools, &c, PT_TOOLS_HERMES, &g, &err), 0);
    assert_true(grammar_accepts(g, "{\"name\":\"add\",\"arguments\":{\"a\":5}}"));
    assert_false(grammar_accepts(g, "{\"name\":\"get_weather\",\"arguments\":{\"city\":\"x\"}}"));
    assert_false(grammar_accepts(g, "{\"name\":\"add\",\"arguments\":{\"a\":\"5\"}}"));
    pt_grammar_free(g);

    json_t *req = json_string("required");
    assert_int_equal(pt_tools_check(tools, req, NULL, &c, &param, &err), 0);
    assert_int_equal(c.mode, PT_TOOL_REQUIRED);
    assert_int_equal(pt_tools_forced_grammar(tools, &c, PT_TOOLS_HERMES, &g, &err), 0);
    assert_true(grammar_accepts(g, "{\"name\":\"add\",\"arguments\":{\"a\":5}}"));
    assert_true(grammar_accepts(
        g, "{\"name\":\"get_weather\",\"arguments\":{\"city\":\"x\",\"unit\":\"c\"}}"));
    assert_false(grammar_accepts(g, "{\"name\":\"get_weather\",\"arguments\":{}}"));
    assert_false(grammar_accepts(g, "{\"name\":\"nope\",\"arguments\":{}}"));
    pt_grammar_free(g);
    json_t *par = json_true();
    assert_int_equal(pt_tools_check(tools, req, par, &c, &param, &err), 0);
    assert_true(c.parallel_asked);
    json_decref(par);
    assert_int_equal(pt_tools_forced_grammar(tools, &c, PT_TOOLS_HERMES, &g, &err), 0);
    /* parallel_tool_calls: true: after a call's closing tag, the end or
     * another tagged call */
    const char *a1 = "{\"name\":\"add\",\"arguments\":{\"a\":5}}";
    const char *two = "{\"name\":\"add\",\"arguments\":{\"a\":5}}\n</tool_call>\n<tool_call>\n"
                      "{\"name\":\"get_weather\",\"arguments\":{\"city\":\"x\"}}\n</tool_call>";
    char buf[512];
    snprintf(buf, sizeof buf, "%s\n</tool_call>", a1);
    assert_true(grammar_accepts(g, buf));
    assert_true(grammar_accepts(g, two));
    snprintf(buf, sizeof buf, "%s\n</tool_call>\n<tool_call>\n", a1);
    assert_false(grammar_accepts(g, buf)); /* an opened call must come */
    snprintf(buf, sizeof buf, "%s%s", a1, a1);
    assert_false(grammar_accepts(g, buf)); /* calls only inside their tags */
    pt_grammar_free(g);
    /* parallel_tool_calls absent (default): one call */
    assert_int_equal(pt_tools_check(tools, req, NULL, &c, &param, &err), 0);
    assert_false(c.parallel_asked);
    assert_int_equal(pt_tools_forced_grammar(tools, &c, PT_TOOLS_HERMES, &g, &err), 0);
    assert_true(grammar_accepts(g, a1));
    assert_false(grammar_accepts(g, two));
    snprintf(buf, sizeof buf, "%s\n</tool_call>", a1);
    assert_false(grammar_accepts(g, buf));
    pt_grammar_free(g);
    /* Mistral: an array of calls; Llama: "parameters" */
    assert_int_equal(pt_tools_forced_grammar(tools, &c, PT_TOOLS_MISTRAL, &g, &err), 0);
    assert_true(grammar_accepts(
        g,
        "[{\"name\":\"add\",\"arguments\":{\"a\":1}},{\"name\":\"add\",\"arguments\":{\"a\":2}}]"));
    assert_false(grammar_accepts(g, "[]"));
    pt_grammar_free(g);
    assert_int_equal(pt_tools_forced_grammar(tools, &c, PT_TOOLS_LLAMA3, &g, &err), 0);
    assert_true(grammar_accepts(g, "{\"name\":\"add\",\"parameters\":{\"a\":1}}"));
    pt_grammar_free(g);

    /* refusals name the field */
    json_t *bad = json_string("sometimes");
    assert_int_equal(pt_tools_check(tools, bad, NULL, &c, &param, &err), -1);
    assert_string_equal(param, "tool_choice");
    json_t *missing = json_loads("{\"type\":\"function\",\"function\":{\"name\":\"zz\"}}", 0, NULL);
    assert_int_equal(pt_tools_check(tools, missing, NULL, &c, &param, &err), -1);
    assert_non_null(strstr(err.msg, "zz"));
    assert_int_equal(pt_tools_check(NULL, req, NULL, &c, &param, &err), -1);
    json_t *autoc = json_string("auto"), *empty = json_array();
    assert_int_equal(pt_tools_check(empty, autoc, NULL, &c, &param, &err), 0);
    assert_int_equal(c.mode, PT_TOOL_NONE);
    json_decref(autoc);
    json_decref(empty);
    json_t *badtools = json_loads("[{\"type\":\"function\",\"function\":{}}]", 0, NULL);
    assert_int_equal(pt_tools_check(badtools, NULL, NULL, &c, &param, &err), -1);
    assert_string_equal(param, "tools[0]");
    /* an unsupported schema keyword in parameters is an error, not ignored */
    json_t *unsup = json_loads(
        "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":"
        "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"array\",\"uniqueItems\":true}}}}}]",
        0, NULL);
    assert_int_equal(pt_tools_check(unsup, req, NULL, &c, &param, &err), 0);
    assert_int_equal(pt_tools_forced_grammar(unsup, &c, PT_TOOLS_HERMES, &g, &err), -1);
    assert_non_null(strstr(err.msg, "tools[0].function.parameters"));
    assert_non_null(strstr(err.msg, "uniqueItems"));
    json_decref(unsup);
    json_decref(badtools);
    json_decref(missing);
    json_decref(bad);
    json_decref(req);
    json_decref(named);
    json_decref(tools);
}

static void test_family_and_messages(void **state) {
    (void)state;
    assert_int_equal(pt_tool_family_of(NULL), PT_TOOLS_HERMES);
    assert_int_equal(pt_tool_family_of("{{ '<tool_call>' }}"), PT_TOOLS_HERMES);
    assert_int_equal(pt_tool_family_of("{{ '[TOOL_CALLS]' }}"), PT_TOOLS_MISTRAL);
    assert_int_equal(pt_tool_family_of("<|start_header_id|>ipython<|end_header_id|>"),
                     PT_TOOLS_LLAMA3);
    assert_string_equal(pt_tools_call_prefix(PT_TOOLS_HERMES), "<tool_call>\n");
    json_t *m = json_loads(
        "[{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"c\","
        "\"type\":\"function\",\"function\":{\"name\":\"a\",\"arguments\":\"{\\\"x\\\":1}\"}}]}]",
        0, NULL);
    pt_tools_prepare_messages(m);
    json_t *a = json_object_get(
        json_object_get(json_array_get(json_object_get(json_array_get(m, 0), "tool_calls"), 0),
                        "function"),
        "arguments");
    assert_true(json_is_object(a));
    assert_int_equal(json_integer_value(json_object_get(a, "x")), 1);
    json_decref(m);
}

static void test_partial(void **state) {
    (void)state;
    assert_int_equal(pt_tag_partial("abc<to", 6, "<tool_call>"), 3);
    assert_int_equal(pt_tag_partial("abc", 3, "<tool_call>"), 0);
    assert_int_equal(pt_tag_partial("<", 1, "<tool_call>"), 1);
    assert_int_equal(pt_tag_partial("", 0, "<t>"), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hermes),
        cmocka_unit_test(test_hermes_malformed),
        cmocka_unit_test(test_llama3),
        cmocka_unit_test(test_mistral),
        cmocka_unit_test(test_forced),
        cmocka_unit_test(test_choice_and_grammar),
        cmocka_unit_test(test_family_and_messages),
        cmocka_unit_test(test_partial),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
