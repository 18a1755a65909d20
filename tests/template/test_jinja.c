/*
 * test_jinja.c - the Jinja interpreter and chat-template rendering, by
 * feature, with hand-written expected outputs; plus the limits that make
 * untrusted templates safe, error positions, and garbage input.
 *
 * Byte parity with @huggingface/jinja on real chat templates is checked
 * separately (tests/parity/jinja, CTest template/jinja_parity); the
 * expectations here were written from the reference's documented and
 * observed behaviour and double as its specification.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

#include "tokenizer/chat_template.h"

/* Renders src with a context given as JSON text (NULL: none).  Returns the
 * output, or NULL with *rc and err set. */
static char *render_opts(const char *src, const char *ctx_json, const pt_jinja_opts *opts, int *rc, pt_err *err) {
    pt_jinja *t;
    *rc = pt_jinja_compile(&t, src, strlen(src), err);
    if (*rc) return NULL;
    json_t *ctx = NULL;
    if (ctx_json) {
        json_error_t je;
        ctx = json_loads(ctx_json, 0, &je);
        assert_non_null(ctx);
    }
    char *out = NULL;
    *rc = pt_jinja_render(t, ctx, opts, &out, NULL, err);
    json_decref(ctx);
    pt_jinja_free(t);
    return out;
}

static void expect(const char *src, const char *ctx, const char *want) {
    pt_err err = {{0}};
    int rc;
    char *out = render_opts(src, ctx, NULL, &rc, &err);
    if (rc != 0) fail_msg("template %s: %s", src, err.msg);
    if (strcmp(out, want) != 0) fail_msg("template %s\n  want [%s]\n  got  [%s]", src, want, out);
    free(out);
}

/* Fails with rc; err->msg must contain `needle`. */
static void expect_error(const char *src, const char *ctx, int want_rc, const char *needle) {
    pt_err err = {{0}};
    int rc;
    char *out = render_opts(src, ctx, NULL, &rc, &err);
    if (rc == 0) fail_msg("template %s rendered [%s], expected an error", src, out);
    assert_int_equal(rc, want_rc);
    if (needle && !strstr(err.msg, needle)) fail_msg("template %s: error [%s] lacks [%s]", src, err.msg, needle);
}

static void test_text_and_whitespace(void **state) {
    expect("Hello\n", NULL, "Hello"); /* one trailing newline dropped */
    expect("a  {{- 'b' -}}  c", NULL, "abc");
    expect("{% if true %}\nyes\n{% endif %}\nafter", NULL, "yes\nafter"); /* trim_blocks */
    expect("  {% if true %}\n  x\n  {% endif %}\n", NULL, "  x\n");        /* lstrip_blocks */
    expect("a {#- c -#} b {# keep #} c", NULL, "ab  c");
    expect("{{ 'x' }}\n{{ 'y' }}", NULL, "x\ny"); /* no trim after }} */
    expect("{% generation %}kept{% endgeneration %}", NULL, "kept");
}

static void test_values_print(void **state) {
    expect("{{ 1 }}|{{ 1.0 }}|{{ -0.0 }}|{{ true }}|{{ none }}|{{ undefined_name }}", NULL, "1|1.0|-0.0|true||");
    expect("{{ [1, 'a', none, 2.0] }}", NULL, "[1, \"a\", null, 2]");
    expect("{{ {'k': 'v', 'n': [1]} }}", NULL, "{\"k\": \"v\", \"n\": [1]}");
    expect("{{ 0.1 + 0.2 }}|{{ 10 / 4 }}|{{ 10 // 4 }}|{{ -7 // 2 }}|{{ -7 % 3 }}|{{ 2 ** 10 }}", NULL,
           "0.30000000000000004|2.5|2|-4|-1|1024");
    expect("{{ 10.0 ** 21 }}|{{ 0.0000001 }}|{{ 2 ** 70 }}", NULL, "1e+21|1e-7|1.1805916207174113e+21");
    expect("{{ 'a\\tb\\n' }}|{{ \"\\u00e9\\x41\" }}|{{ 'con' 'cat' }}", NULL, "a\tb\n|éA|concat");
    expect("{{ f }}|{{ i }}", "{\"f\": 2.0, \"i\": 3}", "2|3"); /* JSON 2.0 is an integer */
}

static void test_operators(void **state) {
    expect("{{ 1 + 2 * 3 }}|{{ (1 + 2) * 3 }}|{{ 'ab' + 'cd' | upper }}|{{ not 1 == 2 }}", NULL, "7|9|abCD|true");
    expect("{{ 'a' ~ 1 ~ 2.0 ~ true }}|{{ 'a' + 1 }}|{{ [1] + [2] }}", NULL, "a12true|a1|[1, 2]");
    expect("{{ 0 or 'x' }}|{{ 1 and 'y' }}|{{ [] or 'e' }}", NULL, "x|y|e");
    expect("{{ 'a' in 'abc' }}|{{ 2 in [1, 2] }}|{{ 'k' in {'k': 1} }}|{{ 'x' not in undef }}", NULL,
           "true|true|true|true");
    expect("{{ 1 == true }}|{{ '1' == 1 }}|{{ [1] == [1] }}|{{ l == l }}", "{\"l\": [1]}", "true|true|false|true");
    expect("{{ 'y' if x else 'n' }}|{{ 'a' if false else 'b' if true else 'c' }}|[{{ 'z' if false }}]", "{\"x\": 1}",
           "y|b|[]");
    expect("{{ -x }}|{{ - 2 }}|{{ not not 0 }}", "{\"x\": 5}", "-5|-2|false");
}

static void test_member_and_slices(void **state) {
    const char *ctx = "{\"d\": {\"a\": 1, \"c\": {\"d\": [3]}}, \"l\": [\"x\", \"y\", \"z\"], \"s\": \"abcdef\"}";
    expect("{{ d.a }}|{{ d['c'].d[0] }}|{{ l[-1] }}|{{ l[9] }}|{{ d.nope.deeper }}|{{ l.length }}", ctx,
           "1|3|z|||3");
    expect("{{ l[1:] }}|{{ l[::-1] }}|{{ s[1:4] }}|{{ s[::2] }}|{{ s[-2:] }}", ctx,
           "[\"y\", \"z\"]|[\"z\", \"y\", \"x\"]|bcd|ace|ef");
    expect("{{ e | length }}|{{ e[1:] }}", "{\"e\": \"😀x\"}", "3|x"); /* length counts UTF-16 units */
}

static void test_string_methods(void **state) {
    const char *ctx = "{\"s\": \"  hEllo wOrld  \"}";
    expect("[{{ s.strip() }}]|{{ s.upper() }}|{{ s.title() }}|{{ s.startswith('  h') }}", ctx,
           "[hEllo wOrld]|  HELLO WORLD  |  HEllo WOrld  |true");
    expect("[{{ '\\n x \\n'.strip('\\n') }}]", NULL, "[x]"); /* the argument is ignored, as in the reference */
    expect("{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'a b c'.split(' ', 1) }}", NULL,
           "[\"a\", \"b\", \"\", \"c\"]|[\"a\", \"b\"]|[\"a\", \"b c\"]");
    expect("{{ 'aaa'.replace('a', 'b', 2) }}|{{ 'abc'.replace('', '-') }}", NULL, "bba|-a-b-c-");
    expect("{{ 'hELLO' | capitalize }}|{{ 'ß' | upper }}|{{ 'ÉCOLE' | lower }}", NULL, "HELLO|SS|école");
}

static void test_filters(void **state) {
    expect("[{{ '  x ' | trim }}]|{{ 'abc' | length }}|{{ [3, 1, 2] | sort }}|{{ [1, 2] | reverse }}", NULL,
           "[x]|3|[1, 2, 3]|[2, 1]");
    expect("{{ x | default('d') }}|{{ '' | default('d', true) }}|{{ [1, 2] | join(', ') }}", NULL, "d|d|1, 2");
    expect("{{ '4.7' | int }}|{{ 'x' | int(7) }}|{{ -3.5 | int }}|{{ '2.5' | float }}|{{ -2 | abs }}", NULL,
           "4|7|-4|2.5|2");
    expect("{{ d | tojson }}|{{ d | tojson(indent=2) }}", "{\"d\": {\"a\": [1, null]}}",
           "{\"a\": [1, null]}|{\n  \"a\": [\n    1,\n    null\n  ]\n}");
    expect("{{ 'é' | tojson }}|{{ 'é' | tojson(ensure_ascii=true) }}", NULL, "\"é\"|\"\\u00e9\"");
    expect("{{ 'a\\n\\nb' | indent(2, true) }}", NULL, "  a\n\n  b");
    expect("{{ m | map(attribute='r') | join }}|{{ m | selectattr('r', 'equalto', 'u') | list | length }}",
           "{\"m\": [{\"r\": \"u\"}, {\"r\": \"a\"}, {\"r\": \"u\"}]}", "uau|2");
    expect("{% for k, v in d | dictsort %}{{ k }}{{ v }}{% endfor %}", "{\"d\": {\"b\": 1, \"a\": 2}}", "a2b1");
    expect("{{ [1, 2, 1, '1'] | unique }}|{{ d | items }}", "{\"d\": {\"a\": 1}}", "[1, 2, \"1\"]|[[\"a\", 1]]");
    expect("{% filter upper %}abc{{ 'd' }}{% endfilter %}", NULL, "ABCD");
}

static void test_tests(void **state) {
    expect("{{ x is defined }}{{ y is undefined }}{{ n is none }}{{ 's' is string }}{{ 1 is number }}", "{\"x\": 0, \"n\": null}",
           "truetruetruetruetrue");
    expect("{{ {} is mapping }}{{ [] is iterable }}{{ (1, 2) is iterable }}{{ 3 is odd }}{{ x is not none }}", NULL,
           "truetruefalsetruetrue");
    expect("{{ false is false }}{{ 0 is false }}{{ 'abc' is lower }}", NULL, "truefalsetrue");
}

static void test_for_loops(void **state) {
    expect("{% for x in l %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.first }}{{ loop.last }}{{ loop.length }};{% endfor %}",
           "{\"l\": [\"a\", \"b\"]}", "102truefalse2;211falsetrue2;");
    expect("{% for x in [] %}x{% else %}empty{% endfor %}", NULL, "empty");
    expect("{% for x in range(10) if x is odd %}{{ x }}{% endfor %}", NULL, "13579");
    expect("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", "{\"d\": {\"z\": 1, \"a\": 2}}", "z=1;a=2;");
    expect("{% for k in d %}{{ k }}{% endfor %}", "{\"d\": {\"b\": 1, \"2\": 0, \"a\": 1, \"1\": 0}}", "12ba");
    /* text of an iteration that breaks or continues is dropped, like the reference */
    expect("{% for x in [1, 2, 3] %}A{{ x }}{% if x == 2 %}B{% continue %}{% endif %}C{% endfor %}", NULL, "A1CA3C");
    expect("{% for x in range(9) %}{% if x == 3 %}{% break %}{% endif %}{{ x }}{% endfor %}", NULL, "012");
    expect("{% set y = 'o' %}{% for x in [1] %}{% set y = 'i' %}{% endfor %}{{ y }}", NULL, "o");
}

static void test_set_namespace_macro(void **state) {
    expect("{% set a, b = [1, 2] %}{% set c %}[{{ a + b }}]{% endset %}{{ c }}", NULL, "[3]");
    expect("{% if true %}{% set z = 1 %}{% endif %}{{ z }}", NULL, "1");
    expect("{% set ns = namespace(n=0) %}{% for x in [1, 2, 3] %}{% set ns.n = ns.n + x %}{% endfor %}{{ ns.n }}",
           NULL, "6");
    expect("{% macro g(name, greet='Hi') %}{{ greet }} {{ name }}{% endmacro %}{{ g('A') }}|{{ g('B', greet='Yo') }}",
           NULL, "Hi A|Yo B");
    expect("{% macro f(n) %}{% if n <= 1 %}1{% else %}{{ n * (f(n - 1) | int) }}{% endif %}{% endmacro %}{{ f(5) }}",
           NULL, "120");
    expect("{% macro m(a) %}{{ a }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1, 2, k=3) }}", NULL,
           "1[2]{\"k\": 3}");
    expect("{% macro w() %}<{{ caller() }}>{% endmacro %}{% call w() %}in{% endcall %}", NULL, "<in>");
}

static void test_errors(void **state) {
    expect_error("line1\n{{ 'x' | nosuchfilter }}", NULL, -1, "jinja 2:");
    expect_error("{% if true %}never closed", NULL, -1, "endif");
    expect_error("{{ 1 ! 2 }}", NULL, -1, "jinja 1:6: Unexpected character: !");
    expect_error("{{ none + 'x' }}", NULL, -1, "null");
    expect_error("{{ 'a' < 'b' }}", NULL, -1, "Unknown operator");
    expect_error("{{ x | d('y') }}", NULL, -1, NULL); /* the reference has no `d` alias */
    expect_error("{% include 'x' %}", NULL, -1, "include");
    expect_error("{{ raise_exception('Roles must alternate') }}", NULL, PT_JINJA_RAISED, NULL);
    pt_err err = {{0}};
    int rc;
    render_opts("a{{ raise_exception('exact message') }}", NULL, NULL, &rc, &err);
    assert_int_equal(rc, PT_JINJA_RAISED);
    assert_string_equal(err.msg, "exact message");
    expect_error("{{ true }}", "{\"true\": 1}", -1, "already declared");
    expect_error("{% break %}", NULL, -1, "outside");
    expect_error("{{ [] | first }}", NULL, -1, NULL);
    expect("{% set x = [] | first %}[{{ x }}]", NULL, "[]");
    /* invalid UTF-8 in the source is refused at compile time */
    pt_jinja *t;
    assert_int_equal(pt_jinja_compile(&t, "ok \xff", 4, &err), -1);
    assert_non_null(strstr(err.msg, "UTF-8"));
}

static void test_limits(void **state) {
    pt_err err = {{0}};
    int rc;
    /* unbounded macro recursion */
    char *out = render_opts("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", NULL, NULL, &rc, &err);
    assert_null(out);
    assert_int_equal(rc, -1);
    assert_non_null(strstr(err.msg, "recursion"));
    /* output size */
    pt_jinja_opts o = {.max_output = 1000};
    out = render_opts("{% for i in range(1000) %}0123456789{% endfor %}", NULL, &o, &rc, &err);
    assert_null(out);
    assert_non_null(strstr(err.msg, "limit"));
    /* loop iterations */
    pt_jinja_opts s = {.max_steps = 10000};
    out = render_opts("{% for i in range(100) %}{% for j in range(100) %}{% for k in range(100) %}{% endfor %}{% endfor %}{% endfor %}",
                      NULL, &s, &rc, &err);
    assert_null(out);
    assert_non_null(strstr(err.msg, "too long"));
    /* memory: a string that doubles 40 times */
    pt_jinja_opts m = {.max_memory = 8 << 20};
    out = render_opts("{% set ns = namespace(s='xx') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s | length }}",
                      NULL, &m, &rc, &err);
    assert_null(out);
    assert_non_null(strstr(err.msg, "memory"));
    /* deep nesting in the source is refused by the parser */
    char deep[4000];
    size_t k = 0;
    k += (size_t)sprintf(deep, "{{ ");
    for (int i = 0; i < 1000; i++) deep[k++] = '(';
    deep[k++] = '1';
    for (int i = 0; i < 1000; i++) deep[k++] = ')';
    strcpy(deep + k, " }}");
    out = render_opts(deep, NULL, NULL, &rc, &err);
    assert_null(out);
    assert_non_null(strstr(err.msg, "deeply"));
    /* a long flat chain is fine up to the depth limit, then an error, not a crash */
    char chain[40000];
    k = (size_t)sprintf(chain, "{{ 1");
    for (int i = 0; i < 5000; i++) k += (size_t)sprintf(chain + k, " + 1");
    strcpy(chain + k, " }}");
    out = render_opts(chain, NULL, NULL, &rc, &err);
    assert_null(out);
    if (!strstr(err.msg, "recursion")) fail_msg("%s", err.msg);
    /* the same inside a macro, whose body the compiler walks */
    char macro[40100];
    snprintf(macro, sizeof macro, "{%% macro m() %%}%s{%% endmacro %%}", chain);
    out = render_opts(macro, NULL, NULL, &rc, &err);
    assert_null(out);
    if (!strstr(err.msg, "deeply")) fail_msg("%s", err.msg);
    /* f()()()... nests in the parser */
    char calls[8000];
    k = (size_t)sprintf(calls, "{{ f");
    for (int i = 0; i < 3000; i++) k += (size_t)sprintf(calls + k, "()");
    strcpy(calls + k, " }}");
    out = render_opts(calls, NULL, NULL, &rc, &err);
    assert_null(out);
    if (!strstr(err.msg, "deeply")) fail_msg("%s", err.msg);
    /* a 500-term chain is fine */
    k = (size_t)sprintf(chain, "{{ 0");
    for (int i = 0; i < 500; i++) k += (size_t)sprintf(chain + k, " + 1");
    strcpy(chain + k, " }}");
    expect(chain, NULL, "500");
}

static void test_garbage_does_not_crash(void **state) {
    static const char *bad[] = {
        "{{", "{%", "{#", "}}", "{{ }}", "{% %}", "{% for %}", "{% for x in %}{% endfor %}", "{{ 'unterminated }}",
        "{{ \"\\q\" }}", "{{ \"\\u12\" }}", "{% set %}", "{% macro %}", "{{ a[ }}", "{{ a[:::] }}", "{{ {1: 2} }}",
        "{{ f(**x, y) }}", "{{ f(*a, *b) }}", "{% macro m(a=1, b) %}{% endmacro %}", "{% endfor %}",
        "{% if x %}{% else %}{% else %}{% endif %}", "{{ x.1.2 }}", "{{ 1 is }}", "{{ 1 | }}", "{{ -}}",
        "{%- -%}", "{# never closed", "{{ ((((( }}", "{% call %}{% endcall %}", "{% filter %}{% endfilter %}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        pt_err err = {{0}};
        int rc;
        char *out = render_opts(bad[i], "{\"x\": 1, \"a\": [1]}", NULL, &rc, &err);
        free(out); /* any outcome but a crash is fine; most fail */
    }
}

/* NUL bytes are text like any other. */
static void test_nul_in_source(void **state) {
    static const char src[] = "a\0{{ 'b\0' ~ x }}\0{# \0 #}c";
    pt_jinja *t;
    pt_err err = {{0}};
    assert_int_equal(pt_jinja_compile(&t, src, sizeof src - 1, &err), 0);
    json_t *ctx = json_pack("{s:s#}", "x", "y\0z", (size_t)3);
    char *out;
    size_t n;
    assert_int_equal(pt_jinja_render(t, ctx, NULL, &out, &n, &err), 0);
    assert_int_equal(n, 9);
    assert_memory_equal(out, "a\0b\0y\0z\0c", 9);
    free(out);
    json_decref(ctx);
    pt_jinja_free(t);
}

static void test_chat_render(void **state) {
    json_error_t je;
    json_t *msgs = json_loads("[{\"role\": \"system\", \"content\": \"S\"}, {\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"hi\"}]}]", 0, &je);
    char *out;
    pt_err err = {{0}};
    assert_int_equal(pt_chat_render(NULL, msgs, NULL, true, NULL, NULL, NULL, &out, NULL, &err), 0);
    assert_string_equal(out, "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
    free(out);
    /* the ChatML fallback renders tools, an assistant's calls and tool
     * results Hermes-style, so a conversation with calls goes back in */
    json_t *conv = json_loads(
        "[{\"role\": \"system\", \"content\": \"S\"}, {\"role\": \"user\", \"content\": \"w?\"},"
        " {\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"id\": \"c1\", \"type\": \"function\","
        " \"function\": {\"name\": \"get\", \"arguments\": {\"city\": \"Oslo\"}}}]},"
        " {\"role\": \"tool\", \"tool_call_id\": \"c1\", \"content\": \"7C\"}]", 0, &je);
    json_t *ftools = json_loads("[{\"type\": \"function\", \"function\": {\"name\": \"get\"}}]", 0, &je);
    assert_int_equal(pt_chat_render(NULL, conv, ftools, true, NULL, NULL, NULL, &out, NULL, &err), 0);
    assert_string_equal(out,
        "<|im_start|>system\nS\n\n# Tools\n\nYou may call one or more functions. Their signatures are "
        "within <tools></tools>:\n<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get\"}}\n</tools>\n\n"
        "For each call, return {\"name\": <function-name>, \"arguments\": <args-json-object>} within "
        "<tool_call></tool_call>.<|im_end|>\n<|im_start|>user\nw?<|im_end|>\n<|im_start|>assistant\n"
        "<tool_call>\n{\"name\": \"get\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\n7C\n</tool_response><|im_end|>\n<|im_start|>assistant\n");
    free(out);
    json_decref(conv);
    json_decref(ftools);
    /* tools, bos/eos and extra keys reach the template; extra overrides */
    json_t *tools = json_loads("[{\"name\": \"t\"}]", 0, &je);
    json_t *extra = json_loads("{\"flag\": true, \"eos_token\": \"E2\"}", 0, &je);
    const char *tpl = "{{ bos_token }}{{ tools[0].name }}{{ add_generation_prompt }}{{ flag }}{{ eos_token }}{{ messages | length }}";
    assert_int_equal(pt_chat_render(tpl, msgs, tools, false, "B", "E", extra, &out, NULL, &err), 0);
    assert_string_equal(out, "BtfalsetrueE22");
    free(out);
    /* a template's own rejection comes back as PT_JINJA_RAISED with its message */
    const char *strict = "{% if messages[0].role == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}";
    assert_int_equal(pt_chat_render(strict, msgs, NULL, true, NULL, NULL, NULL, &out, NULL, &err), PT_JINJA_RAISED);
    assert_string_equal(err.msg, "System role not supported");
    assert_null(out);
    /* syntax errors name the template */
    assert_int_equal(pt_chat_render("{{ x", msgs, NULL, true, NULL, NULL, NULL, &out, NULL, &err), -1);
    assert_non_null(strstr(err.msg, "chat template"));
    json_decref(msgs);
    json_decref(tools);
    json_decref(extra);
}

static void test_compiled_reuse(void **state) {
    pt_jinja *t;
    pt_err err = {{0}};
    const char *src = "{% for m in messages %}{{ m }};{% endfor %}";
    assert_int_equal(pt_jinja_compile(&t, src, strlen(src), &err), 0);
    for (int i = 0; i < 3; i++) {
        json_t *ctx = json_pack("{s:[i,i]}", "messages", i, i + 1);
        char *out;
        size_t n;
        assert_int_equal(pt_jinja_render(t, ctx, NULL, &out, &n, &err), 0);
        char want[32];
        snprintf(want, sizeof want, "%d;%d;", i, i + 1);
        assert_string_equal(out, want);
        assert_int_equal(n, strlen(want));
        free(out);
        json_decref(ctx);
    }
    pt_jinja_free(t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_text_and_whitespace), cmocka_unit_test(test_values_print),
        cmocka_unit_test(test_operators),           cmocka_unit_test(test_member_and_slices),
        cmocka_unit_test(test_string_methods),      cmocka_unit_test(test_filters),
        cmocka_unit_test(test_tests),               cmocka_unit_test(test_for_loops),
        cmocka_unit_test(test_set_namespace_macro), cmocka_unit_test(test_errors),
        cmocka_unit_test(test_limits),              cmocka_unit_test(test_garbage_does_not_crash),
        cmocka_unit_test(test_nul_in_source),       cmocka_unit_test(test_chat_render),
        cmocka_unit_test(test_compiled_reuse),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
