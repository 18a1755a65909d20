/*
 * test_bpe.c - BPE tokenizers from tokenizer.json (and GGUF "gpt2"), on
 * small vocabularies written here so every expected id can be worked out by
 * hand.  Real vocabularies are checked against the reference implementation
 * by the tokenizer/parity test (tests/parity/tokenizer/).
 *   - SentencePiece-style BPE: Prepend/Replace normalizers, merges by rank,
 *     byte fallback, fuse_unk, template BOS, added tokens with
 *     parse_special on and off, lstrip/rstrip, the leading-space rule;
 *   - byte-level BPE: the GPT-2 alphabet, regex pre-tokenizing, special and
 *     non-special added tokens, an emoji over four byte tokens, the whole
 *     vocabulary streamed one token at a time;
 *   - normalizers and pre-tokenizers one by one (HF's five Split
 *     behaviours, ECMAScript regex semantics, Metaspace, Digits);
 *   - malformed tokenizer.json and GGUF input give an error, not a crash;
 *   - a 100 KB input encodes (time printed, not asserted).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

#include "tokenizer/tokenizer_internal.h"

static pt_tokenizer *load(const char *json, const char *config) {
    pt_err err = {{0}};
    json_t *cfg = NULL;
    if (config) {
        json_error_t jerr;
        cfg = json_loads(config, 0, &jerr);
        assert_non_null(cfg);
    }
    pt_tokenizer *t;
    int rc = pt_tokenizer_load_json_mem(&t, json, strlen(json), cfg, &err);
    if (rc) fprintf(stderr, "load: %s\n", err.msg);
    assert_int_equal(rc, 0);
    json_decref(cfg);
    return t;
}

/* Encodes s and compares with the n expected ids. */
static void expect(const pt_tokenizer *t, const char *s, bool add_special, bool parse_special,
                   const int32_t *want, size_t n) {
    int32_t *ids;
    size_t got;
    pt_err err = {{0}};
    assert_int_equal(pt_tokenize(t, s, strlen(s), add_special, parse_special, &ids, &got, &err), 0);
    if (got != n || (n && memcmp(ids, want, n * sizeof *ids))) {
        fprintf(stderr, "\"%s\": got", s);
        for (size_t i = 0; i < got; i++) fprintf(stderr, " %d", ids[i]);
        fprintf(stderr, ", want");
        for (size_t i = 0; i < n; i++) fprintf(stderr, " %d", want[i]);
        fprintf(stderr, "\n");
        fail();
    }
    free(ids);
}
#define EXPECT(t, s, add, parse, ...)                                                   \
    do {                                                                                \
        const int32_t want_[] = {__VA_ARGS__};                                          \
        expect(t, s, add, parse, want_, PT_ARRAY_LEN(want_));                           \
    } while (0)
#define EXPECT_NONE(t, s, add, parse) expect(t, s, add, parse, NULL, 0)

static char *decode(const pt_tokenizer *t, const int32_t *ids, size_t n, bool at_start) {
    char *out = malloc(64 * n + 64);
    size_t used = 0;
    pt_detok d;
    pt_detok_init(&d, t);
    d.at_start = at_start;
    for (size_t i = 0; i < n; i++) used += pt_detok_push(&d, ids[i], out + used, 64);
    used += pt_detok_flush(&d, out + used, 64);
    out[used] = 0;
    return out;
}

/* ---- SentencePiece-style BPE (Llama 2 / Gemma layout) ---- */

static const char k_spm_json[] =
    "{\"added_tokens\": ["
    "  {\"id\": 0, \"content\": \"<unk>\", \"special\": true},"
    "  {\"id\": 1, \"content\": \"<s>\", \"special\": true},"
    "  {\"id\": 2, \"content\": \"</s>\", \"special\": true},"
    "  {\"id\": 13, \"content\": \"<mask>\", \"special\": false, \"lstrip\": true, \"rstrip\": true}],"
    " \"normalizer\": {\"type\": \"Sequence\", \"normalizers\": ["
    "  {\"type\": \"Prepend\", \"prepend\": \"\\u2581\"},"
    "  {\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, \"content\": \"\\u2581\"}]},"
    " \"pre_tokenizer\": null,"
    " \"post_processor\": {\"type\": \"TemplateProcessing\","
    "  \"single\": [{\"SpecialToken\": {\"id\": \"<s>\", \"type_id\": 0}},"
    "             {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}],"
    "  \"special_tokens\": {\"<s>\": {\"id\": \"<s>\", \"ids\": [1], \"tokens\": [\"<s>\"]}}},"
    " \"decoder\": {\"type\": \"Sequence\", \"decoders\": ["
    "  {\"type\": \"Replace\", \"pattern\": {\"String\": \"\\u2581\"}, \"content\": \" \"},"
    "  {\"type\": \"ByteFallback\"}, {\"type\": \"Fuse\"},"
    "  {\"type\": \"Strip\", \"content\": \" \", \"start\": 1, \"stop\": 0}]},"
    " \"model\": {\"type\": \"BPE\", \"unk_token\": \"<unk>\", \"fuse_unk\": true,"
    "  \"byte_fallback\": true,"
    "  \"vocab\": {\"<unk>\": 0, \"<s>\": 1, \"</s>\": 2, \"\\u2581\": 3, \"a\": 4, \"b\": 5,"
    "   \"c\": 6, \"ab\": 7, \"\\u2581ab\": 8, \"abc\": 9, \"<0xC3>\": 10, \"<0xA9>\": 11,"
    "   \"x\": 12},"
    "  \"merges\": [\"a b\", \"\\u2581 ab\", \"ab c\"]}}";

static const char k_spm_config[] =
    "{\"bos_token\": \"<s>\", \"eos_token\": \"</s>\", \"add_bos_token\": true,"
    " \"model_max_length\": 1e30}";

static void test_spm_bpe(void **state) {
    pt_tokenizer *t = load(k_spm_json, k_spm_config);
    EXPECT(t, "ab", false, false, 8);           /* a+b (rank 0), then ▁+ab */
    EXPECT(t, "abc", false, false, 8, 6);       /* ▁+ab beats ab+c by rank */
    EXPECT(t, "ab", true, false, 1, 8);         /* the template's BOS */
    EXPECT(t, "\xc3\xa9", false, false, 3, 10, 11); /* é: byte fallback */
    EXPECT(t, "\xc3\xb1", false, false, 3, 0);  /* ñ: <0xB1> missing -> unk */
    EXPECT(t, "\xc3\xb1\xc3\xb1", false, false, 3, 0); /* unknowns fuse */
    EXPECT(t, "ab</s>ab", false, true, 8, 2, 8);   /* Prepend per section */
    EXPECT(t, "ab</s>ab", false, false, 8, 0, 7);  /* < / s > unknown, fused */
    EXPECT(t, "ab  <mask>  ab", false, false, 8, 13, 8); /* non-special, stripped */
    EXPECT_NONE(t, "", false, false);
    EXPECT(t, "", true, true, 1);
    assert_int_equal(pt_tokenizer_bos(t), 1);
    assert_int_equal(pt_tokenizer_eos(t), 2);
    assert_true(pt_tokenizer_adds_bos(t));
    assert_true(pt_tokenizer_is_eog(t, 2));
    assert_true(pt_token_is_special(t, 1));
    assert_false(pt_token_is_special(t, 13));

    int32_t ids[] = {1, 8, 6, 3, 10, 11};
    char *s = pt_detokenize(t, ids, 6, true);
    assert_string_equal(s, "abc \xc3\xa9"); /* BOS skipped, first space stripped */
    free(s);
    s = pt_detokenize(t, ids, 6, false);
    assert_string_equal(s, "<s> abc \xc3\xa9");
    free(s);
    s = decode(t, ids + 1, 5, false); /* a continuation keeps its space */
    assert_string_equal(s, " abc \xc3\xa9");
    free(s);
    pt_tokenizer_free(t);
}

/* ---- byte-level BPE (GPT-2 / Llama 3 / Qwen layout) ---- */

static char *byte_level_json(void) {
    json_t *vocab = json_object();
    char u[4];
    size_t n;
    for (int b = 0; b < 256; b++) {
        tok_byte_to_unicode((uint8_t)b, u, &n);
        u[n] = 0;
        json_object_set_new(vocab, u, json_integer(b));
    }
    json_object_set_new(vocab, "\xc4\xa0t", json_integer(256)); /* Ġt */
    json_object_set_new(vocab, "he", json_integer(257));
    json_object_set_new(vocab, "\xc4\xa0the", json_integer(258));
    json_t *root = json_pack(
        "{s:[{s:i,s:s,s:b},{s:i,s:s,s:b}],s:{s:s,s:b,s:b},s:{s:s},s:n,"
        "s:{s:s,s:o,s:[[s,s],[s,s],[s,s]],s:b}}",
        "added_tokens", "id", 259, "content", "<|im_start|>", "special", 1, "id", 260, "content",
        "<think>", "special", 0, "pre_tokenizer", "type", "ByteLevel", "add_prefix_space", 0,
        "use_regex", 1, "decoder", "type", "ByteLevel", "normalizer", "model", "type", "BPE",
        "vocab", vocab, "merges", "\xc4\xa0", "t", "h", "e", "\xc4\xa0t", "he", "ignore_merges", 0);
    assert_non_null(root);
    char *s = json_dumps(root, 0);
    json_decref(root);
    return s;
}

static void test_byte_level(void **state) {
    char *json = byte_level_json();
    pt_tokenizer *t = load(json, "{\"eos_token\": {\"content\": \"<|im_start|>\"}}");
    free(json);
    EXPECT(t, " the", false, false, 258);
    EXPECT(t, "the", false, false, 't', 257);
    EXPECT(t, "the the", false, false, 't', 257, 258);
    EXPECT(t, "<|im_start|> the<think>", false, true, 259, 258, 260);
    EXPECT(t, "<|im_start|>", false, false, '<', '|', 'i', 'm', '_', 's', 't', 'a', 'r', 't', '|', '>');
    EXPECT(t, "a\n\n b", false, false, 'a', '\n', '\n', ' ', 'b'); /* byte b is token b */
    EXPECT(t, "\xff", false, false, 0xef, 0xbf, 0xbd); /* invalid UTF-8 -> U+FFFD first */
    assert_false(pt_tokenizer_adds_bos(t));
    assert_int_equal(pt_tokenizer_eos(t), 259);
    assert_int_equal(pt_token_lookup(t, "\xc4\xa0the"), 258);
    size_t len;
    const char *b = pt_token_bytes(t, 258, &len);
    assert_int_equal(len, 4);
    assert_memory_equal(b, " the", 4);

    /* An emoji is four byte tokens; nothing comes out before the last. */
    int32_t emoji[] = {0xF0, 0x9F, 0x98, 0x80, 258};
    pt_detok d;
    pt_detok_init(&d, t);
    char out[256];
    assert_int_equal(pt_detok_push(&d, emoji[0], out, sizeof out), 0);
    assert_int_equal(pt_detok_push(&d, emoji[1], out, sizeof out), 0);
    assert_int_equal(pt_detok_push(&d, emoji[2], out, sizeof out), 0);
    assert_int_equal(pt_detok_push(&d, emoji[3], out, sizeof out), 4);
    assert_memory_equal(out, "\xf0\x9f\x98\x80", 4);
    char *s = pt_detokenize(t, emoji, 5, true);
    assert_string_equal(s, "\xf0\x9f\x98\x80 the"); /* byte-level strips nothing */
    free(s);
    /* A sequence that breaks off: one U+FFFD, then the next character. */
    int32_t broken[] = {0xF0, 0x9F, 'a', 0x80, 0xE2, 0x82};
    s = decode(t, broken, 6, false);
    assert_string_equal(s, "\xef\xbf\xbd" "a" "\xef\xbf\xbd" "\xef\xbf\xbd");
    free(s);
    s = pt_detokenize(t, broken, 6, true);
    assert_string_equal(s, "\xef\xbf\xbd" "a" "\xef\xbf\xbd" "\xef\xbf\xbd");
    free(s);
    pt_tokenizer_free(t);
}

/* Every token one at a time, in many orders: the stream equals the
 * one-shot decode and is valid UTF-8 (256 single bytes make every kind of
 * broken sequence). */
static void test_stream_whole_vocab(void **state) {
    char *json = byte_level_json();
    pt_tokenizer *t = load(json, NULL);
    free(json);
    int n = pt_tokenizer_n_vocab(t) - 1; /* all but token 0, the NUL byte */
    int32_t ids[512];
    pt_rng rng;
    pt_rng_seed(&rng, 1);
    for (int round = 0; round < 200; round++) {
        for (int i = 0; i < n; i++) ids[i] = i + 1;
        for (int i = n - 1; round && i > 0; i--) {
            int j = (int)(pt_rng_next(&rng) % (uint64_t)(i + 1)), tmp = ids[i];
            ids[i] = ids[j], ids[j] = tmp;
        }
        char *stream = decode(t, ids, (size_t)n, true);
        char *one = pt_detokenize(t, ids, (size_t)n, true);
        assert_true(tok_utf8_valid(stream, strlen(stream)));
        assert_string_equal(stream, one);
        free(stream);
        free(one);
    }
    pt_tokenizer_free(t);
}

/* ---- normalizers and pre-tokenizers ---- */

static pt_tokenizer *with_parts(const char *normalizer, const char *pre) {
    char json[2048];
    snprintf(json, sizeof json,
             "{\"normalizer\": %s, \"pre_tokenizer\": %s, \"model\": {\"type\": \"BPE\","
             " \"vocab\": {\"a\": 0}, \"merges\": []}}",
             normalizer, pre);
    return load(json, NULL);
}

/* The words of s, joined by '|'. */
static void expect_words(const pt_tokenizer *t, const char *s, int section, const char *want) {
    tok_words w = {0};
    pt_err err;
    assert_int_equal(tok_pretokenize(t, s, strlen(s), section, &w, &err), 0);
    char got[1024] = "";
    for (size_t i = 0; i < w.n; i++) {
        if (i) strcat(got, "|");
        strncat(got, w.text.s + w.spans[2 * i], w.spans[2 * i + 1]);
    }
    if (strcmp(got, want)) fprintf(stderr, "pre-tokenize \"%s\": got \"%s\"\n", s, got);
    assert_string_equal(got, want);
    tok_words_free(&w);
}

static void test_split_behaviors(void **state) {
    static const struct {
        const char *behavior, *want;
    } cases[] = {
        {"Removed", "the|final|countdown"},
        {"Isolated", "the|-|final|-|-|countdown"},
        {"MergedWithPrevious", "the-|final-|-|countdown"},
        {"MergedWithNext", "the|-final|-|-countdown"},
        {"Contiguous", "the|-|final|--|countdown"},
    };
    for (size_t i = 0; i < PT_ARRAY_LEN(cases); i++) {
        char pre[256];
        snprintf(pre, sizeof pre,
                 "{\"type\": \"Split\", \"pattern\": {\"String\": \"-\"}, \"behavior\": \"%s\","
                 " \"invert\": false}",
                 cases[i].behavior);
        pt_tokenizer *t = with_parts("null", pre);
        expect_words(t, "the-final--countdown", 0, cases[i].want);
        pt_tokenizer_free(t);
    }
}

static void test_regex_semantics(void **state) {
    /* \s is ECMAScript's: U+FEFF is white space, U+0085 is not. */
    pt_tokenizer *t = with_parts("null", "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"\\\\s+\"},"
                                         " \"behavior\": \"Removed\"}");
    expect_words(t, "a\xc2\x85" "b\xef\xbb\xbf" "c \t\n d", 0, "a\xc2\x85" "b|c|d");
    pt_tokenizer_free(t);
    /* \d is ASCII only. */
    t = with_parts("null", "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"\\\\d+\"},"
                           " \"behavior\": \"Isolated\"}");
    expect_words(t, "x\xd9\xa1\xd9\xa2" "42", 0, "x\xd9\xa1\xd9\xa2|42");
    pt_tokenizer_free(t);
    /* "." stops at U+2028; \u escapes are ECMAScript's. */
    t = with_parts("null", "{\"type\": \"Split\", \"pattern\": {\"Regex\": \".|\\\\u00e9\"},"
                           " \"behavior\": \"Isolated\"}");
    expect_words(t, "a\xe2\x80\xa8" "b", 0, "a|\xe2\x80\xa8|b");
    pt_tokenizer_free(t);
    /* Llama 3's contractions: [sS], not the long s. */
    t = with_parts("null", "{\"type\": \"Split\", \"pattern\": {\"Regex\":"
                           " \"(?i:'s|'t|'re|'ve|'m|'ll|'d)\"}, \"behavior\": \"Isolated\"}");
    expect_words(t, "it'S it'\xc5\xbf", 0, "it|'S| it'\xc5\xbf");
    pt_tokenizer_free(t);
    /* Invert keeps only the matches; Digits splits digits one by one. */
    t = with_parts("null", "{\"type\": \"Digits\", \"individual_digits\": true}");
    expect_words(t, "ab123c", 0, "ab|1|2|3|c");
    pt_tokenizer_free(t);
    t = with_parts("null", "{\"type\": \"Sequence\", \"pretokenizers\": ["
                           "{\"type\": \"WhitespaceSplit\"}, {\"type\": \"Punctuation\"}]}");
    expect_words(t, "  hi, there!!  ", 0, "hi|,|there|!!");
    pt_tokenizer_free(t);
}

static void test_metaspace(void **state) {
    pt_tokenizer *t = with_parts("null", "{\"type\": \"Metaspace\", \"replacement\": \"\\u2581\","
                                         " \"prepend_scheme\": \"first\", \"split\": true}");
    expect_words(t, "hello world", 0, "\xe2\x96\x81hello|\xe2\x96\x81world");
    expect_words(t, "hello world", 1, "hello|\xe2\x96\x81world");
    pt_tokenizer_free(t);
    t = with_parts("null", "{\"type\": \"Metaspace\", \"replacement\": \"\\u2581\","
                           " \"add_prefix_space\": true, \"split\": false}");
    expect_words(t, "a b", 3, "\xe2\x96\x81" "a\xe2\x96\x81" "b");
    pt_tokenizer_free(t);
}

static void expect_norm(const char *normalizer, const char *in, const char *want) {
    pt_tokenizer *t = with_parts(normalizer, "null");
    tok_buf out = {0};
    pt_err err;
    assert_int_equal(tok_normalize(t, in, strlen(in), &out, &err), 0);
    if (strcmp(out.s, want)) fprintf(stderr, "normalize %s \"%s\": got \"%s\"\n", normalizer, in, out.s);
    assert_string_equal(out.s, want);
    free(out.s);
    pt_tokenizer_free(t);
}

static void test_normalizers(void **state) {
    expect_norm("{\"type\": \"NFC\"}", "e\xcc\x81", "\xc3\xa9");
    expect_norm("{\"type\": \"NFD\"}", "\xc3\xa9", "e\xcc\x81");
    expect_norm("{\"type\": \"NFKC\"}", "\xef\xac\x81", "fi");
    expect_norm("{\"type\": \"Lowercase\"}", "\xc3\x80" "B", "\xc3\xa0" "b");
    expect_norm("{\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"NFD\"},"
                " {\"type\": \"StripAccents\"}]}", "\xc3\xa9t\xc3\xa9", "ete");
    expect_norm("{\"type\": \"Strip\", \"strip_left\": true, \"strip_right\": true}",
                " \t x y \n", "x y");
    expect_norm("{\"type\": \"Replace\", \"pattern\": {\"Regex\": \" {2,}\"}, \"content\": \" \"}",
                "a  b     c d", "a b c d");
    expect_norm("{\"type\": \"Prepend\", \"prepend\": \"\\u2581\"}", "x", "\xe2\x96\x81x");
    expect_norm("{\"type\": \"Prepend\", \"prepend\": \"\\u2581\"}", "", "");
}

/* ---- untrusted input ---- */

static void expect_error(const char *json, const char *fragment) {
    pt_tokenizer *t = (pt_tokenizer *)1;
    pt_err err = {{0}};
    assert_int_equal(pt_tokenizer_load_json_mem(&t, json, strlen(json), NULL, &err), -1);
    assert_null(t);
    if (!strstr(err.msg, fragment)) fprintf(stderr, "error \"%s\" lacks \"%s\"\n", err.msg, fragment);
    assert_non_null(strstr(err.msg, fragment));
}

#define MODEL(rest) "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": []}" rest "}"

static void test_malformed_json(void **state) {
    expect_error("", "line 1");
    expect_error("{\"model\": ", "tokenizer.json");
    expect_error("[1, 2]", "top level");
    expect_error("{}", "no \"model\"");
    expect_error("{\"model\": {\"type\": \"Unigram\", \"vocab\": []}}", "Unigram");
    expect_error("{\"model\": {\"type\": \"BPE\", \"vocab\": [1]}}", "vocab");
    expect_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {}}}", "empty");
    expect_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": -1}}}", "\"a\"");
    expect_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 99999999999}}}", "\"a\"");
    expect_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": \"0\"}}}", "\"a\"");
    expect_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [7]}}", "merges[0]");
    expect_error(MODEL(", \"added_tokens\": [{\"id\": 5}]"), "added_tokens[0]");
    expect_error(MODEL(", \"added_tokens\": {}"), "added_tokens");
    expect_error(MODEL(", \"normalizer\": {\"type\": \"Precompiled\"}"), "Precompiled");
    expect_error(MODEL(", \"normalizer\": {\"type\": \"Replace\", \"pattern\": {}, \"content\": \"\"}"),
                 "pattern");
    expect_error(MODEL(", \"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"((\"},"
                       " \"behavior\": \"Isolated\"}"), "regex");
    expect_error(MODEL(", \"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"String\": \"x\"},"
                       " \"behavior\": \"Sideways\"}"), "Sideways");
    expect_error(MODEL(", \"pre_tokenizer\": {\"type\": \"BertPreTokenizer\"}"), "BertPreTokenizer");
    expect_error(MODEL(", \"post_processor\": {\"type\": \"TemplateProcessing\", \"single\":"
                       " [{\"SpecialToken\": {\"id\": \"<nope>\"}}]}"), "<nope>");
    expect_error(MODEL(", \"decoder\": {\"type\": \"CTC\"}"), "CTC");
    expect_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"end_of_word_suffix\": \"</w>\"}}",
                 "end_of_word_suffix");
    char deep[4096] = "";
    for (int i = 0; i < 20; i++) strcat(deep, "{\"type\": \"Sequence\", \"normalizers\": [");
    strcat(deep, "{\"type\": \"NFC\"}");
    for (int i = 0; i < 20; i++) strcat(deep, "]}");
    char json[8192];
    snprintf(json, sizeof json, MODEL(", \"normalizer\": %s"), deep);
    expect_error(json, "nested");
}

/* A GGUF header with just the tokenizer keys given. */
static size_t tiny_gguf(uint8_t *buf, const char *model, bool with_merges) {
    size_t n = 0;
#define PUT(p, k) (memcpy(buf + n, p, k), n += k)
#define U32(v) do { uint32_t v_ = (v); PUT(&v_, 4); } while (0)
#define U64(v) do { uint64_t v_ = (v); PUT(&v_, 8); } while (0)
#define STR(s) do { U64(strlen(s)); PUT(s, strlen(s)); } while (0)
    PUT("GGUF", 4);
    U32(3);
    U64(0);
    U64(with_merges ? 3 : 2);
    STR("tokenizer.ggml.model");
    U32(PT_GGUF_STRING);
    STR(model);
    STR("tokenizer.ggml.tokens");
    U32(PT_GGUF_ARRAY);
    U32(PT_GGUF_STRING);
    U64(3);
    STR("a");
    STR("b");
    STR("ab");
    if (with_merges) {
        STR("tokenizer.ggml.merges");
        U32(PT_GGUF_ARRAY);
        U32(PT_GGUF_STRING);
        U64(1);
        STR("a b");
    }
    while (n % 32) buf[n++] = 0;
    return n;
}

static void test_gguf(void **state) {
    uint8_t buf[1024];
    pt_gguf *g;
    pt_tokenizer *t;
    pt_err err = {{0}};
    size_t n = tiny_gguf(buf, "bert", true);
    assert_int_equal(pt_gguf_parse(&g, buf, n, "tiny", &err), 0);
    assert_int_equal(pt_tokenizer_load_gguf(&t, g, &err), -1);
    assert_non_null(strstr(err.msg, "bert"));
    pt_gguf_close(g);
    n = tiny_gguf(buf, "gpt2", false);
    assert_int_equal(pt_gguf_parse(&g, buf, n, "tiny", &err), 0);
    assert_int_equal(pt_tokenizer_load_gguf(&t, g, &err), -1);
    assert_non_null(strstr(err.msg, "merges"));
    pt_gguf_close(g);
    n = tiny_gguf(buf, "gpt2", true);
    assert_int_equal(pt_gguf_parse(&g, buf, n, "tiny", &err), 0);
    assert_int_equal(pt_tokenizer_load_gguf(&t, g, &err), 0);
    EXPECT(t, "ab", false, false, 2);
    EXPECT(t, "ba", false, false, 1, 0);
    pt_tokenizer_free(t);
    pt_gguf_close(g);
}

/* ---- size ---- */

static void test_100k(void **state) {
    char *json = byte_level_json();
    pt_tokenizer *t = load(json, NULL);
    free(json);
    size_t n = 100 * 1024;
    char *text = malloc(n);
    static const char words[] = "the quick brown fox jumps over the lazy dog 123 \xe4\xbd\xa0\xe5\xa5\xbd! ";
    for (size_t i = 0; i < n; i++) text[i] = words[i % (sizeof words - 1)];
    while (n && ((unsigned char)text[n - 1] & 0xC0) == 0x80) n--; /* whole characters */
    while (n && (unsigned char)text[n - 1] >= 0xC0) n--;
    int32_t *ids;
    size_t n_ids;
    pt_err err;
    double t0 = pt_now();
    assert_int_equal(pt_tokenize(t, text, n, false, false, &ids, &n_ids, &err), 0);
    printf("100 KB byte-level: %zu tokens in %.3f s\n", n_ids, pt_now() - t0);
    char *back = pt_detokenize(t, ids, n_ids, false);
    assert_int_equal(strlen(back), n);
    assert_memory_equal(back, text, n);
    free(back);
    free(ids);
    free(text);
    pt_tokenizer_free(t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_spm_bpe),        cmocka_unit_test(test_byte_level),
        cmocka_unit_test(test_stream_whole_vocab), cmocka_unit_test(test_split_behaviors),
        cmocka_unit_test(test_regex_semantics), cmocka_unit_test(test_metaspace),
        cmocka_unit_test(test_normalizers),    cmocka_unit_test(test_malformed_json),
        cmocka_unit_test(test_gguf),           cmocka_unit_test(test_100k),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
