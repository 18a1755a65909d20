/*
 * test_grammar.c - the grammar engine: schemas, regexes and GBNF accept
 * exactly the texts they should; masks equal a brute-force check of every
 * token (accept, then roll back) along seeded random walks; rollback
 * restores earlier states; unsupported schema keywords are errors that
 * name them.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>

#include <cmocka.h>

#include "grammar/grammar.h"

/* A small vocabulary: every printable byte alone plus multi-byte pieces
 * that cross JSON token boundaries (the cases masks get wrong). */
static const char *const pieces[] = {
    "{\"", "\":", "\",", "\"}", "\":\"", " \"", "\"a", "true", "tr", "ue", "false", "null", "12",
    "-1", ".5", "e3", "\"\"", "[]", "{}", "[1", ",\"", "name", "age", "\"name\"", "\": ", "}]",
    "\\n", "\\u00e9", "\xc3\xa9", "\xc3", "\xa9", "abc", "2024-01-02", "  ", "\n", "ok\"", "x\"}",
};

static pt_gvocab *small_vocab(int *n_out) {
    int n = 0x7F - 0x20 + (int)(sizeof pieces / sizeof *pieces) + 1;
    const char **b = calloc((size_t)n, sizeof *b);
    size_t *l = calloc((size_t)n, sizeof *l);
    static char bytes[128];
    int k = 0;
    for (int c = 0x20; c < 0x7F; c++, k++) {
        bytes[c] = (char)c;
        b[k] = &bytes[c];
        l[k] = 1;
    }
    for (size_t i = 0; i < sizeof pieces / sizeof *pieces; i++, k++) {
        b[k] = pieces[i];
        l[k] = strlen(pieces[i]);
    }
    b[k] = NULL; /* a special token: never allowed */
    k++;
    pt_gvocab *v = pt_gvocab_from_bytes(k, b, l);
    free(b);
    free(l);
    *n_out = k;
    return v;
}

static bool accepts(const pt_grammar *g, const char *text) {
    int n;
    pt_gvocab *v = small_vocab(&n);
    pt_gmatcher *m = pt_gmatcher_new(g, v);
    bool ok = pt_gmatcher_accept_bytes(m, text, strlen(text)) && pt_gmatcher_is_accepting(m);
    pt_gmatcher_free(m);
    pt_gvocab_free(v);
    return ok;
}

static pt_grammar *schema(const char *text) {
    pt_grammar *g;
    pt_err err = {{0}};
    if (pt_grammar_from_schema_text(&g, text, strlen(text), &err) < 0) fail_msg("schema: %s", err.msg);
    return g;
}

static void test_schema_object(void **state) {
    (void)state;
    pt_grammar *g = schema("{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},"
                           "\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":150}},"
                           "\"required\":[\"name\"],\"additionalProperties\":false}");
    assert_true(accepts(g, "{\"name\":\"Ann\",\"age\":42}"));
    assert_true(accepts(g, "{ \"name\" : \"Ann\" }"));
    assert_true(accepts(g, "{\"name\":\"\\u00e9\\n\xc3\xa9\",\"age\":150}"));
    assert_false(accepts(g, "{\"age\":42}"));                  /* required missing */
    assert_false(accepts(g, "{\"name\":\"Ann\",\"age\":151}")); /* above maximum */
    assert_false(accepts(g, "{\"name\":\"Ann\",\"age\":-1}"));
    assert_false(accepts(g, "{\"name\":\"Ann\",\"x\":1}"));     /* no additional */
    assert_false(accepts(g, "{\"name\":\"Ann\""));              /* unfinished */
    assert_false(accepts(g, "{\"name\":\"A\"nn\"}"));
    assert_true(accepts(g, "{\"age\":1,\"name\":\"Ann\"}"));           /* any order */
    assert_false(accepts(g, "{\"age\":1,\"name\":\"A\",\"age\":2}")); /* each once */
    pt_grammar_free(g);
}

static void test_schema_features(void **state) {
    (void)state;
    pt_grammar *g = schema("{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"enum\":[1,\"a\",null]},"
                           "\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/node\"},\"maxItems\":2}},"
                           "\"required\":[\"v\"],\"additionalProperties\":false}},\"$ref\":\"#/$defs/node\"}");
    assert_true(accepts(g, "{\"v\":1,\"kids\":[{\"v\":\"a\"},{\"v\":null,\"kids\":[]}]}"));
    assert_false(accepts(g, "{\"v\":2}"));
    assert_false(accepts(g, "{\"v\":1,\"kids\":[{\"v\":1},{\"v\":1},{\"v\":1}]}"));
    pt_grammar_free(g);
    g = schema("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"}}}");
    assert_true(accepts(g, "{\"a\":\"x\",\"b\":[1,{\"c\":true}]}")); /* additional allowed */
    assert_false(accepts(g, "{\"a\":\"x\",\"a\":1}"));                /* a listed name reused */
    pt_grammar_free(g);
    g = schema("{\"type\":\"string\",\"pattern\":\"^[a-c]{2,3}-\\\\d+$\"}");
    assert_true(accepts(g, "\"ab-12\""));
    assert_false(accepts(g, "\"abcd-1\""));
    pt_grammar_free(g);
    g = schema("{\"anyOf\":[{\"type\":\"string\",\"maxLength\":2},{\"type\":\"boolean\"}],\"nullable\":false}");
    assert_true(accepts(g, "\"\xc3\xa9x\""));
    assert_false(accepts(g, "\"abc\""));
    assert_true(accepts(g, "false"));
    pt_grammar_free(g);
    g = schema("{\"type\":\"array\",\"prefixItems\":[{\"const\":\"a\"},{\"type\":\"number\"}],\"items\":false}");
    assert_true(accepts(g, "[\"a\", -1.5e3]"));
    assert_false(accepts(g, "[\"a\",1,2]"));
    pt_grammar_free(g);
    g = schema("{\"allOf\":[{\"properties\":{\"a\":{\"type\":\"integer\",\"minimum\":-20}}},{\"required\":[\"a\"]}],"
               "\"additionalProperties\":false}");
    assert_true(accepts(g, "{\"a\":-20}"));
    assert_false(accepts(g, "{\"a\":-21}"));
    assert_false(accepts(g, "{}"));
    pt_grammar_free(g);
    g = schema("{\"type\":\"number\",\"exclusiveMinimum\":-2,\"maximum\":3}");
    assert_true(accepts(g, "-1.99"));
    assert_true(accepts(g, "3.000"));
    assert_true(accepts(g, "0"));
    assert_true(accepts(g, "-0.5"));
    assert_false(accepts(g, "-2"));
    assert_false(accepts(g, "-2.5"));
    assert_false(accepts(g, "3.01"));
    assert_false(accepts(g, "4"));
    pt_grammar_free(g);
    g = schema("{\"type\":\"number\",\"multipleOf\":1,\"maximum\":5}");
    assert_true(accepts(g, "5.0"));
    assert_true(accepts(g, "-3"));
    assert_false(accepts(g, "1.5"));
    assert_false(accepts(g, "6"));
    pt_grammar_free(g);
    g = schema("{\"type\":\"number\",\"exclusiveMinimum\":0}");
    assert_true(accepts(g, "0.001"));
    assert_true(accepts(g, "12.5"));
    assert_false(accepts(g, "0"));
    assert_false(accepts(g, "0.000"));
    assert_false(accepts(g, "-1"));
    pt_grammar_free(g);
    g = schema("{\"type\":\"string\",\"format\":\"uri-reference\"}");
    assert_true(accepts(g, "\"../a/b?x=1#f\""));
    assert_true(accepts(g, "\"https://x.org/p\""));
    assert_false(accepts(g, "\"://\""));
    pt_grammar_free(g);
    g = schema("{\"type\":\"string\",\"format\":\"date\"}");
    assert_true(accepts(g, "\"2024-01-02\""));
    assert_false(accepts(g, "\"2024-13-02\""));
    assert_false(accepts(g, "\"2023-02-29\""));
    assert_false(accepts(g, "\"2023-04-31\""));
    assert_true(accepts(g, "\"2000-02-29\""));
    assert_false(accepts(g, "\"1900-02-29\""));
    pt_grammar_free(g);
}

static void test_schema_errors(void **state) {
    (void)state;
    const char *bad[][2] = {
        {"{\"type\":\"array\",\"uniqueItems\":true}", "uniqueItems"},
        {"{\"not\":{\"type\":\"string\"}}", "not"},
        {"{\"type\":\"object\",\"patternProperties\":{\"a\":{}}}", "patternProperties"},
        {"{\"type\":\"string\",\"format\":\"iri-reference\"}", "iri-reference"},
        {"{\"$ref\":\"http://example.com/s.json\"}", "$ref"},
        {"{\"type\":\"string\",\"pattern\":\"(?=a)\"}", "pattern"},
        {"false", "false"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        pt_grammar *g = NULL;
        pt_err err = {{0}};
        assert_int_equal(pt_grammar_from_schema_text(&g, bad[i][0], strlen(bad[i][0]), &err), -1);
        assert_null(g);
        if (!strstr(err.msg, bad[i][1])) fail_msg("%s: error \"%s\" does not name %s", bad[i][0], err.msg, bad[i][1]);
    }
}

static void test_regex_and_gbnf(void **state) {
    (void)state;
    pt_grammar *g;
    pt_err err = {{0}};
    assert_int_equal(pt_grammar_from_regex(&g, "(ab|c)*d?[^x-z]", &err), 0);
    assert_true(accepts(g, "ababcd!"));
    assert_true(accepts(g, "\xc3\xa9"));
    assert_false(accepts(g, "abx"));
    assert_false(accepts(g, "ab"));
    pt_grammar_free(g);
    const char *gb = "root ::= item (\",\" item)*  # a list\nitem ::= [0-9]+ | \"\\\"\" [a-z]{1,3} \"\\\"\"\n";
    assert_int_equal(pt_grammar_from_gbnf(&g, gb, strlen(gb), &err), 0);
    assert_true(accepts(g, "1,\"abc\",22"));
    assert_false(accepts(g, "1,\"abcd\""));
    assert_false(accepts(g, "1,"));
    pt_grammar_free(g);
    const char *left = "root ::= root \"a\" | \"b\"\n";
    assert_int_equal(pt_grammar_from_gbnf(&g, left, strlen(left), &err), -1);
    assert_non_null(strstr(err.msg, "left-recursive"));
    const char *undef = "root ::= foo\n";
    assert_int_equal(pt_grammar_from_gbnf(&g, undef, strlen(undef), &err), -1);
    assert_non_null(strstr(err.msg, "foo"));
}

/* Along seeded random walks, the mask equals accept-then-rollback for
 * every token, and rolling back restores the earlier mask. */
static void check_walks(pt_grammar *g) {
    int n;
    pt_gvocab *v = small_vocab(&n);
    pt_gmatcher *m = pt_gmatcher_new(g, v);
    int words = (n + 31) / 32;
    uint32_t *mask = calloc((size_t)words, 4), *before = calloc((size_t)words, 4);
    pt_rng rng;
    pt_rng_seed(&rng, 7);
    for (int walk = 0; walk < 20; walk++) {
        pt_gmatcher_reset(m);
        for (int stepno = 0; stepno < 40; stepno++) {
            pt_gmatcher_mask(m, mask);
            int allowed[512], na = 0;
            for (int t = 0; t < n; t++) {
                bool bit = (mask[t >> 5] >> (t & 31)) & 1;
                bool acc = pt_gmatcher_accept(m, t);
                if (acc) pt_gmatcher_rollback(m, 1);
                if (bit != acc) fail_msg("token %d: mask says %d, accept says %d", t, bit, acc);
                if (acc) allowed[na++] = t;
            }
            assert_false(pt_gmatcher_accept(m, n - 1)); /* the special token */
            if (!na) {
                assert_true(pt_gmatcher_is_accepting(m));
                break;
            }
            memcpy(before, mask, (size_t)words * 4);
            int pick = allowed[pt_rng_next(&rng) % (uint64_t)na];
            assert_true(pt_gmatcher_accept(m, pick));
            if (stepno % 5 == 4) { /* rollback restores the state */
                pt_gmatcher_rollback(m, 1);
                pt_gmatcher_mask(m, mask);
                assert_memory_equal(mask, before, (size_t)words * 4);
                assert_true(pt_gmatcher_accept(m, pick));
            }
        }
    }
    free(mask);
    free(before);
    pt_gmatcher_free(m);
    pt_gvocab_free(v);
}

static void test_masks_brute_force(void **state) {
    (void)state;
    pt_grammar *g = schema("{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":4},"
                           "\"age\":{\"type\":\"integer\"},\"t\":{\"type\":\"array\",\"items\":{\"type\":\"boolean\"}}},"
                           "\"required\":[\"age\"]}");
    check_walks(g);
    pt_grammar_free(g);
    g = schema("{}");
    check_walks(g);
    pt_grammar_free(g);
    pt_err err;
    assert_int_equal(pt_grammar_from_regex(&g, "[a-c]+(-[0-9]{2})*e?", &err), 0);
    check_walks(g);
    pt_grammar_free(g);
}

static void test_rollback_and_finish(void **state) {
    (void)state;
    pt_grammar *g = schema("{\"const\":\"ok\"}");
    int n;
    pt_gvocab *v = small_vocab(&n);
    pt_gmatcher *m = pt_gmatcher_new(g, v);
    assert_false(pt_gmatcher_is_accepting(m));
    assert_true(pt_gmatcher_accept_bytes(m, "\"", 1));
    assert_true(pt_gmatcher_accept_bytes(m, "ok\"", 3));
    assert_true(pt_gmatcher_is_accepting(m));
    assert_int_equal(pt_gmatcher_n_steps(m), 2);
    pt_gmatcher_rollback(m, 1);
    assert_false(pt_gmatcher_is_accepting(m));
    assert_false(pt_gmatcher_accept_bytes(m, "x", 1));
    assert_int_equal(pt_gmatcher_n_steps(m), 1);
    pt_gmatcher_rollback(m, 99);
    assert_int_equal(pt_gmatcher_n_steps(m), 0);
    assert_true(pt_gmatcher_accept_bytes(m, "\"ok\"", 4));
    /* trailing whitespace may follow; nothing else */
    assert_false(pt_gmatcher_accept_bytes(m, "x", 1));
    pt_gmatcher_free(m);
    pt_gvocab_free(v);
    pt_grammar_free(g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_schema_object),    cmocka_unit_test(test_schema_features),
        cmocka_unit_test(test_schema_errors),    cmocka_unit_test(test_regex_and_gbnf),
        cmocka_unit_test(test_masks_brute_force), cmocka_unit_test(test_rollback_and_finish),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
