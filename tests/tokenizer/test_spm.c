/*
 * test_spm.c - the SentencePiece-style (GGUF "llama") tokenizer on the real
 * stories260K vocabulary:
 *   - the prompt ids llama.cpp recorded in stories260K-greedy.json, with and
 *     without BOS, and the pieces llama.cpp printed for each generated token;
 *   - thousands of random strings against a naive re-implementation of
 *     llama.cpp's algorithm written here from the GGUF arrays (quadratic
 *     scan instead of a heap, no shared code);
 *   - special-token parsing, empty input, byte fallback;
 *   - the streaming detokenizer: every token one by one equals the one-shot
 *     decode and is valid UTF-8; emoji split over four byte tokens.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

#include "io/gguf.h"
#include "io/model_file.h"
#include "tokenizer/tokenizer.h"

#define MODEL PETREL_SOURCE_DIR "/models/stories260K.gguf"
#define FIXTURE PETREL_SOURCE_DIR "/tests/fixtures/stories260K-greedy.json"

static pt_model_file *g_mf;
static pt_tokenizer *g_tok;

static int setup(void **state) {
    pt_err err = {{0}};
    if (pt_model_file_open(&g_mf, MODEL, &err) || pt_tokenizer_load(&g_tok, g_mf, &err)) {
        fprintf(stderr, "setup: %s\n", err.msg);
        return -1;
    }
    return 0;
}

static int teardown(void **state) {
    pt_tokenizer_free(g_tok);
    pt_model_file_close(g_mf);
    return 0;
}

static void tokenize(const char *s, bool add_special, bool parse_special, int32_t **ids,
                     size_t *n) {
    pt_err err = {{0}};
    int rc = pt_tokenize(g_tok, s, strlen(s), add_special, parse_special, ids, n, &err);
    if (rc) fprintf(stderr, "tokenize: %s\n", err.msg);
    assert_int_equal(rc, 0);
}

static void assert_ids(const int32_t *got, size_t n, const json_t *want, const char *what) {
    if (n != json_array_size(want)) {
        fprintf(stderr, "%s: %zu ids, expected %zu\n", what, n, json_array_size(want));
        fail();
    }
    for (size_t i = 0; i < n; i++) {
        if (got[i] != json_integer_value(json_array_get(want, i))) {
            fprintf(stderr, "%s: id %zu is %d, expected %lld\n", what, i, got[i],
                    (long long)json_integer_value(json_array_get(want, i)));
            fail();
        }
    }
}

/* ---- llama.cpp's recorded ids and pieces ---- */

static void test_fixture(void **state) {
    json_error_t jerr;
    json_t *fx = json_load_file(FIXTURE, 0, &jerr);
    assert_non_null(fx);
    const json_t *c;
    size_t i;
    json_array_foreach(json_object_get(fx, "cases"), i, c) {
        const char *prompt = json_string_value(json_object_get(c, "prompt"));
        int32_t *ids;
        size_t n;
        tokenize(prompt, true, false, &ids, &n);
        assert_ids(ids, n, json_object_get(c, "prompt_ids"), prompt);
        free(ids);
        tokenize(prompt, false, false, &ids, &n);
        assert_ids(ids, n, json_object_get(c, "prompt_ids_no_bos"), prompt);
        free(ids);

        /* Each generated token streams out as llama.cpp's piece. */
        pt_detok d;
        pt_detok_init(&d, g_tok);
        const json_t *cont = json_object_get(c, "continuation_ids");
        const json_t *pieces = json_object_get(c, "continuation_pieces");
        char all[4096] = "";
        size_t used = 0;
        for (size_t k = 0; k < json_array_size(cont); k++) {
            char buf[256];
            size_t m = pt_detok_push(&d, (int32_t)json_integer_value(json_array_get(cont, k)), buf,
                                     sizeof buf);
            assert_int_equal(m, json_string_length(json_array_get(pieces, k)));
            assert_memory_equal(buf, json_string_value(json_array_get(pieces, k)), m);
            memcpy(all + used, buf, m);
            used += m;
        }
        assert_int_equal(pt_detok_flush(&d, all + used, 16), 0);
        all[used] = 0;
        assert_string_equal(all, json_string_value(json_object_get(c, "continuation_text")));
    }
    json_decref(fx);
}

static void test_basics(void **state) {
    assert_int_equal(pt_tokenizer_n_vocab(g_tok), 512);
    assert_int_equal(pt_tokenizer_bos(g_tok), 1);
    assert_int_equal(pt_tokenizer_eos(g_tok), 2);
    assert_true(pt_tokenizer_adds_bos(g_tok));
    assert_true(pt_tokenizer_is_eog(g_tok, 2));
    assert_false(pt_tokenizer_is_eog(g_tok, 1));
    assert_false(pt_tokenizer_is_eog(g_tok, 403));
    assert_true(pt_token_is_special(g_tok, 1));
    assert_false(pt_token_is_special(g_tok, 403));
    assert_int_equal(pt_token_lookup(g_tok, "<s>"), 1);
    assert_int_equal(pt_token_lookup(g_tok, "<0x41>"), 3 + 0x41);
    assert_int_equal(pt_token_lookup(g_tok, "no such piece"), -1);
    size_t len;
    const char *b = pt_token_bytes(g_tok, 3 + 0x41, &len);
    assert_int_equal(len, 1);
    assert_int_equal(b[0], 'A');
    b = pt_token_bytes(g_tok, 403, &len); /* "▁Once" */
    assert_int_equal(len, 5);
    assert_memory_equal(b, " Once", 5);
    assert_null(pt_token_bytes(g_tok, 512, &len));
    assert_null(pt_token_bytes(g_tok, -1, &len));
}

static void test_special_and_empty(void **state) {
    int32_t *ids;
    size_t n;
    tokenize("", true, false, &ids, &n); /* llama.cpp: just BOS */
    assert_int_equal(n, 1);
    assert_int_equal(ids[0], 1);
    free(ids);
    tokenize("", false, false, &ids, &n);
    assert_int_equal(n, 0);
    free(ids);

    /* "</s>" is one token only when special text is parsed, and the text
     * after it gets llama.cpp's space prefix again. */
    tokenize("Once</s>Once", false, true, &ids, &n);
    assert_int_equal(n, 3);
    assert_int_equal(ids[0], 403);
    assert_int_equal(ids[1], 2);
    assert_int_equal(ids[2], 403);
    free(ids);
    tokenize("</s>", false, false, &ids, &n);
    assert_true(n > 1);
    for (size_t i = 0; i < n; i++) assert_int_not_equal(ids[i], 2);
    free(ids);

    /* Characters the vocabulary lacks fall back to bytes: 中 = E4 B8 AD. */
    tokenize("中", false, false, &ids, &n);
    assert_int_equal(n, 4);
    assert_int_equal(ids[0], pt_token_lookup(g_tok, "\xe2\x96\x81"));
    assert_int_equal(ids[1], 3 + 0xE4);
    assert_int_equal(ids[2], 3 + 0xB8);
    assert_int_equal(ids[3], 3 + 0xAD);
    free(ids);
}

/* ---- an independent, naive llama.cpp SPM ---- */

typedef struct naive_vocab {
    int n;
    char **text;
    float *score;
} naive_vocab;

static void naive_load(naive_vocab *v) {
    const pt_gguf *g = g_mf->gguf;
    uint64_t n;
    int et;
    assert_true(pt_gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &n));
    v->n = (int)n;
    v->text = calloc(n, sizeof *v->text);
    v->score = calloc(n, sizeof *v->score);
    for (uint64_t i = 0; i < n; i++) {
        pt_gguf_str s;
        double sc;
        assert_true(pt_gguf_arr_str(g, "tokenizer.ggml.tokens", i, &s));
        assert_true(pt_gguf_arr_float(g, "tokenizer.ggml.scores", i, &sc));
        v->text[i] = strndup(s.s, s.len);
        v->score[i] = (float)sc;
    }
}

static void naive_free(naive_vocab *v) {
    for (int i = 0; i < v->n; i++) free(v->text[i]);
    free(v->text);
    free(v->score);
}

static int naive_find(const naive_vocab *v, const char *s, size_t n) {
    for (int i = 0; i < v->n; i++)
        if (strlen(v->text[i]) == n && !memcmp(v->text[i], s, n)) return i;
    return -1;
}

/* Whole-text SPM: no special tokens in the input. */
static size_t naive_encode(const naive_vocab *v, const char *text, int32_t *out) {
    char buf[1024];
    size_t n = 0;
    memcpy(buf, "\xe2\x96\x81", 3), n = 3;
    for (const char *p = text; *p; p++) {
        if (*p == ' ')
            memcpy(buf + n, "\xe2\x96\x81", 3), n += 3;
        else
            buf[n++] = *p;
    }
    size_t start[512], len[512], k = 0;
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)buf[i];
        size_t l = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
        start[k] = i, len[k] = l, k++;
        i += l;
    }
    for (;;) {
        int best = -1;
        float best_score = 0;
        for (size_t i = 0; i + 1 < k; i++) {
            int id = naive_find(v, buf + start[i], len[i] + len[i + 1]);
            if (id >= 0 && (best < 0 || v->score[id] > best_score)) best = (int)i, best_score = v->score[id];
        }
        if (best < 0) break;
        len[best] += len[best + 1];
        memmove(start + best + 1, start + best + 2, (k - best - 2) * sizeof *start);
        memmove(len + best + 1, len + best + 2, (k - best - 2) * sizeof *len);
        k--;
    }
    size_t m = 0;
    for (size_t i = 0; i < k; i++) {
        int id = naive_find(v, buf + start[i], len[i]);
        if (id >= 0) {
            out[m++] = id;
            continue;
        }
        for (size_t b = 0; b < len[i]; b++) {
            char name[8];
            snprintf(name, sizeof name, "<0x%02X>", (unsigned char)buf[start[i] + b]);
            out[m++] = naive_find(v, name, 6);
        }
    }
    return m;
}

static void test_random_vs_naive(void **state) {
    static const char *alphabet[] = {"a", "b", "e", "h", "i", "l", "n", "o", "r", "s", "t", "T",
                                     "L", " ", " ", " ", ".", ",", "!", "'", "\n", "é", "中",
                                     "😀", "1", "9", "\t"};
    naive_vocab v;
    naive_load(&v);
    pt_rng rng;
    pt_rng_seed(&rng, 42);
    char text[256];
    int32_t want[1024];
    for (int iter = 0; iter < 3000; iter++) {
        size_t n = 0, chars = pt_rng_next(&rng) % 40;
        for (size_t c = 0; c < chars; c++) {
            const char *a = alphabet[pt_rng_next(&rng) % PT_ARRAY_LEN(alphabet)];
            memcpy(text + n, a, strlen(a));
            n += strlen(a);
        }
        text[n] = 0;
        size_t m = naive_encode(&v, text, want);
        int32_t *ids;
        size_t got;
        tokenize(text, false, false, &ids, &got);
        if (n == 0) m = 0; /* llama.cpp encodes nothing for empty text */
        if (got != m || (m && memcmp(ids, want, m * sizeof *ids))) {
            fprintf(stderr, "mismatch on \"%s\": %zu ids vs %zu\n", text, got, m);
            fail();
        }
        free(ids);
    }
    naive_free(&v);
}

/* ---- detokenizing ---- */

static bool valid_utf8(const char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        size_t l = c < 0x80 ? 1 : (c >= 0xC2 && c < 0xE0) ? 2 : (c >= 0xE0 && c < 0xF0) ? 3
                                                          : (c >= 0xF0 && c < 0xF5) ? 4 : 0;
        if (!l || i + l > n) return false;
        for (size_t k = 1; k < l; k++)
            if (((unsigned char)s[i + k] & 0xC0) != 0x80) return false;
        i += l;
    }
    return true;
}

/* Streams ids one by one and compares with pt_detokenize. */
static void stream_equals_oneshot(const pt_tokenizer *t, const int32_t *ids, size_t n) {
    size_t cap = 64, used = 0;
    char *all = malloc(cap);
    pt_detok d;
    pt_detok_init(&d, t);
    d.at_start = true;
    for (size_t i = 0; i <= n; i++) {
        char buf[1024];
        size_t m = i < n ? pt_detok_push(&d, ids[i], buf, sizeof buf) : pt_detok_flush(&d, buf, sizeof buf);
        if (used + m + 1 > cap) all = realloc(all, cap = 2 * (used + m + 1));
        memcpy(all + used, buf, m);
        used += m;
    }
    all[used] = 0;
    char *one = pt_detokenize(t, ids, n, true);
    assert_true(valid_utf8(all, used));
    assert_string_equal(all, one);
    free(one);
    free(all);
}

static void test_detok_whole_vocab(void **state) {
    int n = pt_tokenizer_n_vocab(g_tok);
    int32_t *ids = malloc(n * sizeof *ids);
    for (int i = 0; i < n; i++) ids[i] = i;
    stream_equals_oneshot(g_tok, ids, (size_t)n);
    pt_rng rng;
    pt_rng_seed(&rng, 7);
    for (int round = 0; round < 20; round++) { /* random orders mix the byte tokens */
        for (int i = n - 1; i > 0; i--) {
            int j = (int)(pt_rng_next(&rng) % (uint64_t)(i + 1)), tmp = ids[i];
            ids[i] = ids[j], ids[j] = tmp;
        }
        stream_equals_oneshot(g_tok, ids, (size_t)n);
    }
    free(ids);
}

static void test_detok_emoji_and_space(void **state) {
    int32_t *ids;
    size_t n;
    tokenize("😀 ok", true, false, &ids, &n);
    /* BOS, ▁, F0 9F 98 80, ▁, o, k (or merged) */
    pt_detok d;
    pt_detok_init(&d, g_tok);
    d.at_start = true;
    char buf[256], all[256];
    size_t used = 0, emitted_before_last_byte = 0;
    for (size_t i = 0; i < n; i++) {
        size_t m = pt_detok_push(&d, ids[i], buf, sizeof buf);
        if (ids[i] == 3 + 0x98) emitted_before_last_byte = m;
        memcpy(all + used, buf, m);
        used += m;
    }
    all[used] = 0;
    assert_int_equal(emitted_before_last_byte, 0); /* held back: incomplete */
    assert_string_equal(all, "😀 ok");
    char *one = pt_detokenize(g_tok, ids, n, true);
    assert_string_equal(one, "😀 ok");
    free(one);
    one = pt_detokenize(g_tok, ids, n, false);
    assert_string_equal(one, "<s> 😀 ok");
    free(one);
    free(ids);

    /* A truncated character becomes U+FFFD, once. */
    int32_t broken[] = {3 + 0xF0, 3 + 0x9F, 403};
    one = pt_detokenize(g_tok, broken, 3, true);
    assert_string_equal(one, "\xef\xbf\xbd Once");
    free(one);
    pt_detok_init(&d, g_tok);
    used = pt_detok_push(&d, broken[0], all, sizeof all);
    used += pt_detok_push(&d, broken[1], all + used, sizeof all - used);
    assert_int_equal(used, 0);
    used += pt_detok_flush(&d, all + used, sizeof all - used);
    assert_int_equal(used, 3);
}

static void test_prompt_roundtrip(void **state) {
    int32_t ids[] = {1, 403, 407, 261, 378};
    char *s = pt_detokenize(g_tok, ids, 5, true);
    assert_string_equal(s, "Once upon a time");
    free(s);
    s = pt_detokenize(g_tok, ids + 1, 4, true);
    assert_string_equal(s, "Once upon a time");
    free(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_basics),
        cmocka_unit_test(test_fixture),
        cmocka_unit_test(test_special_and_empty),
        cmocka_unit_test(test_random_vs_naive),
        cmocka_unit_test(test_detok_whole_vocab),
        cmocka_unit_test(test_detok_emoji_and_space),
        cmocka_unit_test(test_prompt_roundtrip),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
