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
#include "grammar/grammar_vocab.h"

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

/* Every keyword the engine cannot enforce is refused, never ignored, and
 * the error names the keyword and where in the schema it is (a JSON
 * Pointer), so a 400 tells the user what to change. */
static void test_schema_refusals_name_keyword_and_path(void **state) {
    (void)state;
    const char *bad[][3] = {
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"not\":{\"type\":\"string\"}}}}", "\"not\"",
         "#/properties/a)"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"oneOf\":[{\"type\":\"string\"},{\"type\":\"string\","
         "\"maxLength\":3}]}}}", "oneOf", "#/properties/a)"},
        {"{\"type\":\"object\",\"properties\":{\"m\":{\"type\":\"object\",\"patternProperties\":{\"^x\":{}}}}}",
         "patternProperties", "#/properties/m)"},
        {"{\"if\":{\"type\":\"string\"},\"then\":{\"minLength\":2}}", "\"if\"", "(at #)"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{}},\"dependentRequired\":{\"a\":[\"b\"]}}",
         "dependentRequired", "(at #)"},
        {"{\"type\":\"object\",\"dependencies\":{\"a\":[\"b\"]}}", "\"dependencies\"", "(at #)"},
        {"{\"type\":\"object\",\"dependentSchemas\":{\"a\":{}}}", "dependentSchemas", "(at #)"},
        {"{\"type\":\"array\",\"items\":{\"type\":\"array\",\"uniqueItems\":true}}", "uniqueItems",
         "#/items)"},
        {"{\"type\":\"array\",\"prefixItems\":[{},{\"type\":\"array\",\"contains\":{}}]}", "contains",
         "#/prefixItems/1)"},
        {"{\"type\":\"object\",\"propertyNames\":{\"maxLength\":3}}", "propertyNames", "(at #)"},
        {"{\"type\":\"object\",\"unevaluatedProperties\":false}", "unevaluatedProperties", "(at #)"},
        {"{\"type\":\"array\",\"unevaluatedItems\":false}", "unevaluatedItems", "(at #)"},
        {"{\"type\":\"number\",\"multipleOf\":0.5}", "multipleOf", "(at #)"},
        {"{\"anyOf\":[{\"type\":\"null\"},{\"$ref\":\"#/$defs/a~1b\"}],\"$defs\":{\"a/b\":{\"type\":\"object\","
         "\"additionalProperties\":{\"not\":{}}}}}", "\"not\"", "#/$defs/a~1b/additionalProperties)"},
        {"{\"type\":\"object\",\"properties\":{\"a/b\":{\"$dynamicRef\":\"#x\"}}}", "$dynamicRef",
         "#/properties/a~1b)"},
        {"{\"enum\":[{},{\"a\":1}],\"minProperties\":1}", "minProperties", "(at #)"},
        {"{\"const\":[1,1],\"uniqueItems\":true}", "uniqueItems", "(at #)"},
        {"{\"type\":\"array\",\"items\":[{\"type\":\"string\"}],\"additionalItems\":{\"not\":{}}}", "\"not\"",
         "#/additionalItems)"},
        {"{\"type\":\"object\",\"properties\":{\"s\":{\"type\":\"string\",\"pattern\":\"a(?=b)\"}}}", "pattern",
         "#/properties/s)"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        pt_grammar *g = NULL;
        pt_err err = {{0}};
        if (pt_grammar_from_schema_text(&g, bad[i][0], strlen(bad[i][0]), &err) != -1)
            fail_msg("%s: compiled; it must be refused", bad[i][0]);
        assert_null(g);
        if (!strstr(err.msg, bad[i][1])) fail_msg("%s: error \"%s\" does not name %s", bad[i][0], err.msg, bad[i][1]);
        if (!strstr(err.msg, bad[i][2])) fail_msg("%s: error \"%s\" does not say %s", bad[i][0], err.msg, bad[i][2]);
    }
    /* what the spec makes a no-op stays accepted: annotations, a disjoint
     * oneOf, additionalItems without tuple items, uniqueItems false,
     * then/else without if */
    const char *good[] = {
        "{\"oneOf\":[{\"type\":\"string\"},{\"type\":\"integer\"}],\"title\":\"t\",\"x-extra\":1}",
        "{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"additionalItems\":false,\"uniqueItems\":false}",
        "{\"type\":\"string\",\"then\":{\"maxLength\":1},\"else\":false}",
        "{\"oneOf\":[{\"type\":\"object\",\"properties\":{\"k\":{\"const\":\"a\"}},\"required\":[\"k\"]},"
        "{\"type\":\"object\",\"properties\":{\"k\":{\"const\":\"b\"}},\"required\":[\"k\"]}]}",
    };
    for (size_t i = 0; i < sizeof good / sizeof *good; i++) pt_grammar_free(schema(good[i]));
    pt_grammar *g = schema(good[1]);
    assert_true(accepts(g, "[1,2,3]")); /* additionalItems applies to no item here */
    pt_grammar_free(g);
    g = schema(good[2]);
    assert_true(accepts(g, "\"abc\"")); /* then/else without if: no constraint */
    pt_grammar_free(g);
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

/* pattern with length bounds: implied ones, and one repeated class whose
 * count takes them; patternProperties with a pattern every key matches. */
static void test_pattern_length_and_all_keys(void **state) {
    (void)state;
    pt_grammar *g = schema("{\"type\":\"string\",\"pattern\":\"^[a-z\\\"]+$\",\"maxLength\":3}");
    assert_true(accepts(g, "\"abc\""));
    assert_true(accepts(g, "\"a\\\"b\"")); /* an escaped quote is one character */
    assert_false(accepts(g, "\"abcd\""));
    assert_false(accepts(g, "\"\""));
    assert_false(accepts(g, "\"ab1\""));
    pt_grammar_free(g);
    g = schema("{\"type\":\"string\",\"pattern\":\"^[0-9]{4}-[0-9]{2}$\",\"minLength\":7,\"maxLength\":7}");
    assert_true(accepts(g, "\"2024-01\""));
    assert_false(accepts(g, "\"2024-1\""));
    pt_grammar_free(g);
    g = schema("{\"type\":\"string\",\"pattern\":\"[a-z]\",\"minLength\":1}"); /* a search: length >= 1 implied */
    assert_true(accepts(g, "\"9a9\""));
    pt_grammar_free(g);
    const char *bad[] = {"{\"type\":\"string\",\"pattern\":\"^(a|bc)+$\",\"maxLength\":3}",
                         "{\"type\":\"string\",\"pattern\":\"[a-z]+\",\"maxLength\":3}",
                         "{\"type\":\"string\",\"pattern\":\"^[a-z]{5}$\",\"maxLength\":3}"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        pt_err err = {{0}};
        assert_int_equal(pt_grammar_from_schema_text(&g, bad[i], strlen(bad[i]), &err), -1);
        assert_non_null(strstr(err.msg, "pattern"));
    }
    g = schema("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},"
               "\"patternProperties\":{\".*\":{\"type\":\"integer\",\"minimum\":0}}}");
    assert_true(accepts(g, "{\"a\":1,\"b\":2}"));
    assert_true(accepts(g, "{\"b\":2,\"c\":0}"));
    assert_false(accepts(g, "{\"b\":\"x\"}"));
    assert_false(accepts(g, "{\"a\":-1}")); /* both the property and the pattern apply */
    assert_false(accepts(g, "{\"a\":1,\"a\":2}"));
    pt_grammar_free(g);
}

/* Keywords of one type leave the other types free; objects of up to 8
 * listed properties take them in any order. */
static void test_untyped_keywords_and_order(void **state) {
    (void)state;
    pt_grammar *g = schema("{\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"]}");
    assert_true(accepts(g, "{\"a\":1}"));
    assert_false(accepts(g, "{\"a\":\"x\"}"));
    assert_false(accepts(g, "{}"));
    assert_true(accepts(g, "\"not an object\""));
    assert_true(accepts(g, "[1,2]"));
    pt_grammar_free(g);
    g = schema("{\"items\":{\"type\":\"string\"},\"minLength\":2}");
    assert_true(accepts(g, "[\"x\"]"));
    assert_false(accepts(g, "[1]"));
    assert_true(accepts(g, "{\"k\":1}"));
    assert_false(accepts(g, "\"x\""));
    assert_true(accepts(g, "\"xy\""));
    pt_grammar_free(g);
    g = schema("{\"patternProperties\":{\"^a\":{\"type\":\"integer\"}},\"additionalProperties\":false}");
    assert_true(accepts(g, "{\"a1\":1}"));
    assert_false(accepts(g, "{\"a1\":\"x\"}")); /* was any value: the keyword went unread */
    assert_false(accepts(g, "{\"b\":1}"));
    assert_true(accepts(g, "7"));
    pt_grammar_free(g);
    {
        pt_err err = {{0}};
        const char *u = "{\"uniqueItems\":true}";
        assert_int_equal(pt_grammar_from_schema_text(&g, u, strlen(u), &err), -1);
        assert_non_null(strstr(err.msg, "uniqueItems"));
    }
    g = schema("{\"type\":\"object\",\"properties\":{\"p1\":{},\"p2\":{},\"p3\":{},\"p4\":{},\"p5\":{},"
               "\"p6\":{},\"p7\":{},\"p8\":{}},\"required\":[\"p8\"],\"additionalProperties\":false}");
    assert_true(accepts(g, "{\"p8\":0,\"p1\":1,\"p7\":7}"));
    assert_true(accepts(g, "{\"p3\":0,\"p2\":1,\"p8\":7,\"p1\":1}"));
    assert_false(accepts(g, "{\"p3\":0,\"p2\":1}"));         /* p8 is required */
    assert_false(accepts(g, "{\"p8\":0,\"p1\":1,\"p8\":7}")); /* each at most once */
    pt_grammar_free(g);
}

/* Every string of 1 to 4 characters over a 6-letter alphabet that holds a
 * quote and a colon: subtrees large enough for the matcher's memoized walks
 * (256 nodes and more), with tokens crossing key boundaries. */
static pt_gvocab *big_vocab_n(int max_len, int *n_out, char ***toks) {
    static const char al[] = "ab\":c ";
    int n = 0, k = 0;
    for (int len = 1, p = 6; len <= max_len; len++, p *= 6) n += p;
    char **t = calloc((size_t)n, sizeof *t);
    size_t *l = calloc((size_t)n, sizeof *l);
    for (int len = 1; len <= max_len; len++) {
        int total = 1;
        for (int i = 0; i < len; i++) total *= 6;
        for (int x = 0; x < total; x++, k++) {
            t[k] = calloc(8, 1);
            for (int i = 0, y = x; i < len; i++, y /= 6) t[k][i] = al[y % 6];
            l[k] = (size_t)len;
        }
    }
    pt_gvocab *v = pt_gvocab_from_bytes(n, (const char *const *)t, l);
    free(l);
    *n_out = n;
    *toks = t;
    return v;
}

static pt_gvocab *big_vocab(int *n_out, char ***toks) { return big_vocab_n(4, n_out, toks); }

/* Masks of an object with extra keys allowed (a key that is none of the
 * listed names) equal accept-then-rollback for every token, and a second
 * key position reuses the first's walks instead of walking the trie again. */
static void test_masks_memoized_walks(void **state) {
    (void)state;
    pt_grammar *g = schema("{\"type\":\"object\",\"properties\":{\"ab\":{\"type\":\"string\"},"
                           "\"abc\":{\"type\":\"string\"}}}");
    int n;
    char **toks;
    pt_gvocab *v = big_vocab(&n, &toks);
    pt_gmatcher *m = pt_gmatcher_new(g, v);
    int words = (n + 31) / 32;
    uint32_t *mask = calloc((size_t)words, 4);
    const char *prefixes[] = {"{\"", "{\"a", "{\"ab", "{\"b", "{\"ab\":\"x\",\"", "{\"ab\":\"x\",\"c"};
    long walked[6];
    for (int p = 0; p < 6; p++) {
        pt_gmatcher_reset(m);
        assert_true(pt_gmatcher_accept_bytes(m, prefixes[p], strlen(prefixes[p])));
        long before = pt_gmatcher_nodes_walked(m);
        pt_gmatcher_mask(m, mask);
        walked[p] = pt_gmatcher_nodes_walked(m) - before;
        for (int t = 0; t < n; t++) {
            bool bit = (mask[t >> 5] >> (t & 31)) & 1;
            bool acc = pt_gmatcher_accept(m, t);
            if (acc) pt_gmatcher_rollback(m, 1);
            if (bit != acc) fail_msg("after %s, token \"%s\": mask says %d, accept says %d", prefixes[p], toks[t], bit, acc);
        }
    }
    /* the next key positions reuse the first one's walks: without the
     * memo, the mask after {"a walked 834 nodes against the first's 863 */
    for (int p = 1; p < 6; p++) {
        if (walked[p] * 2 > walked[0]) fail_msg("mask after %s walked %ld trie nodes (first: %ld)", prefixes[p], walked[p], walked[0]);
    }
    for (int i = 0; i < n; i++) free(toks[i]);
    free(toks);
    free(mask);
    pt_gmatcher_free(m);
    pt_gvocab_free(v);
    pt_grammar_free(g);
}

/* A subschema no value satisfies rules out its property instead of
 * failing the whole schema; needed everywhere, it is still an error. */
static void test_unsatisfiable_subschemas(void **state) {
    (void)state;
    pt_grammar *g = schema("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"array\",\"enum\":[\"x\"]},"
                           "\"b\":{\"type\":\"integer\"},\"c\":false,\"d\":{\"type\":\"string\",\"minLength\":3,"
                           "\"maxLength\":2}}}");
    assert_true(accepts(g, "{\"b\":1}"));
    assert_true(accepts(g, "{}"));
    assert_false(accepts(g, "{\"a\":\"x\"}"));
    assert_false(accepts(g, "{\"a\":[\"x\"]}"));
    assert_false(accepts(g, "{\"c\":1}"));
    assert_false(accepts(g, "{\"d\":\"xy\"}"));
    pt_grammar_free(g);
    const char *req = "{\"type\":\"object\",\"properties\":{\"c\":false},\"required\":[\"c\"]}";
    pt_err err = {{0}};
    assert_int_equal(pt_grammar_from_schema_text(&g, req, strlen(req), &err), -1);
    assert_non_null(strstr(err.msg, "no finite text"));
}

/* Only classifications that cost a long walk go to the vocabulary's shared
 * cache: keys and literals filled it and pushed the string contents out. */
static void test_shared_cache_keeps_long_walks(void **state) {
    (void)state;
    int n;
    char **toks;
    pt_gvocab *v = big_vocab_n(5, &n, &toks); /* a string's contents: ~3,900 nodes */
    uint32_t *mask = calloc((size_t)(n + 31) / 32, 4);
    pt_grammar *g = schema("{\"enum\":[\"ab:\",\"ba c\",1]}");
    pt_gmatcher *m = pt_gmatcher_new(g, v);
    pt_gmatcher_mask(m, mask);
    assert_true(pt_gmatcher_accept_bytes(m, "\"a", 2));
    pt_gmatcher_mask(m, mask);
    assert_int_equal(v->n_slots_used, 0);
    pt_gmatcher_free(m);
    pt_grammar_free(g);
    g = schema("{\"type\":\"string\"}");
    m = pt_gmatcher_new(g, v);
    assert_true(pt_gmatcher_accept_bytes(m, "\"", 1));
    pt_gmatcher_mask(m, mask);
    assert_true(v->n_slots_used > 0);
    pt_gmatcher_free(m);
    pt_grammar_free(g);
    for (int i = 0; i < n; i++) free(toks[i]);
    free(toks);
    free(mask);
    pt_gvocab_free(v);
}

/* Jump-forward: the bytes every continuation starts with. */
static void test_forced_bytes(void **state) {
    (void)state;
    pt_grammar *g = schema("{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},"
                           "\"kind\":{\"const\":\"person\"}},\"required\":[\"name\",\"kind\"],"
                           "\"additionalProperties\":false}");
    int n;
    pt_gvocab *v = small_vocab(&n);
    pt_gmatcher *m = pt_gmatcher_new(g, v);
    char out[64];
    /* leading whitespace may come first: nothing is forced */
    assert_int_equal(pt_gmatcher_forced_bytes(m, out, sizeof out), 0);
    assert_true(pt_gmatcher_accept_bytes(m, "{", 1));
    /* "name" or "kind" may come first (few properties: any order) */
    size_t k = pt_gmatcher_forced_bytes(m, out, sizeof out);
    assert_int_equal(k, 0);
    assert_true(pt_gmatcher_accept_bytes(m, "\"n", 2));
    k = pt_gmatcher_forced_bytes(m, out, sizeof out);
    assert_int_equal(k, 4);
    assert_memory_equal(out, "ame\"", 4); /* then whitespace or ':' */
    assert_int_equal(pt_gmatcher_n_steps(m), 2); /* the matcher did not move */
    assert_true(pt_gmatcher_accept_bytes(m, "ame\":\"Al\",\"k", 12));
    k = pt_gmatcher_forced_bytes(m, out, sizeof out);
    assert_int_equal(k, 4);
    assert_memory_equal(out, "ind\"", 4);
    assert_true(pt_gmatcher_accept_bytes(m, "ind\":\"p", 7));
    k = pt_gmatcher_forced_bytes(m, out, sizeof out);
    assert_int_equal(k, 6); /* the rest of the const; then '}' after optional whitespace */
    assert_memory_equal(out, "erson\"", 6);
    assert_int_equal(pt_gmatcher_forced_bytes(m, out, 2), 2); /* cap respected */
    assert_true(pt_gmatcher_accept_bytes(m, "erson\"}", 7));
    assert_int_equal(pt_gmatcher_forced_bytes(m, out, sizeof out), 0); /* accepting: the end may come */
    pt_gmatcher_free(m);
    pt_gvocab_free(v);
    pt_grammar_free(g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_schema_object),    cmocka_unit_test(test_schema_features),
        cmocka_unit_test(test_schema_errors),    cmocka_unit_test(test_regex_and_gbnf),
        cmocka_unit_test(test_schema_refusals_name_keyword_and_path),
        cmocka_unit_test(test_masks_brute_force), cmocka_unit_test(test_rollback_and_finish),
        cmocka_unit_test(test_forced_bytes),     cmocka_unit_test(test_masks_memoized_walks),
        cmocka_unit_test(test_pattern_length_and_all_keys), cmocka_unit_test(test_untyped_keywords_and_order),
        cmocka_unit_test(test_shared_cache_keeps_long_walks), cmocka_unit_test(test_unsatisfiable_subschemas),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
