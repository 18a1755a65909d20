/*
 * tok_parity.c - compares Petrel's tokenizers with the reference ids that
 * reference.mjs computed (@lenml/tokenizers on the real tokenizer.json
 * files), string by string.
 *
 *   tok_parity CORPUS.json REF_DIR name...
 *
 * For each tokenizer name, REF_DIR/<name>.json holds the tokenizer paths
 * and, per corpus string, the ids for three encode modes and the decoded
 * text.  Every mismatch is printed with the string (escaped), the index of
 * the first differing id and both id lists around it; the exit status is 1
 * if anything differs.  The time to encode the corpus and a 100 KB text is
 * printed for information, never asserted.
 *
 * A name "X-gguf" (X = llama3 or qwen3) runs the GGUF code path instead:
 * X's tokenizer.json is converted in memory into the tokenizer.ggml.* keys
 * llama.cpp's converter writes (model "gpt2", tokens, token types, merges,
 * tokenizer.ggml.pre) and must give the same ids as the reference, without
 * BOS (the GGUF defaults for BOS are llama.cpp's, not this tokenizer.json's).  Every run also decodes
 * the whole vocabulary one token at a time through pt_detok and checks the
 * stream against pt_detokenize and for valid UTF-8.
 */
#include <stdio.h>
#include <stdlib.h>

#include "io/gguf.h"
#include "tokenizer/tokenizer.h"

#define MAX_REPORTS 8

typedef struct mode {
    const char *key; /* in the reference file */
    bool add_special, parse_special;
} mode;

static const mode k_modes[] = {
    {"plain", false, false},
    {"special", false, true},
    {"with_special", true, true},
};

static void print_escaped(const char *s, size_t n) {
    fputc('"', stderr);
    for (size_t i = 0; i < n && i < 400; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\n') fputs("\\n", stderr);
        else if (c == '\t') fputs("\\t", stderr);
        else if (c == '\r') fputs("\\r", stderr);
        else if (c == '"' || c == '\\') fprintf(stderr, "\\%c", c);
        else if (c < 0x20 || c == 0x7f) fprintf(stderr, "\\x%02x", c);
        else fputc(c, stderr);
    }
    fputs(n > 400 ? "...\"" : "\"", stderr);
}

static void print_ids(const char *label, const int32_t *ids, size_t n, size_t at) {
    size_t from = at > 5 ? at - 5 : 0, to = PT_MIN(n, at + 6);
    fprintf(stderr, "    %-9s (%zu ids) %s[", label, n, from ? "... " : "");
    for (size_t i = from; i < to; i++) fprintf(stderr, i == at ? " >%d<" : " %d", ids[i]);
    fprintf(stderr, " ]%s\n", to < n ? " ..." : "");
}

/* The first index where the lists differ, or SIZE_MAX if they agree. */
static size_t first_diff(const int32_t *got, size_t n, const json_t *want) {
    size_t m = json_array_size(want);
    for (size_t i = 0; i < PT_MIN(n, m); i++)
        if (got[i] != json_integer_value(json_array_get(want, i))) return i;
    return n == m ? SIZE_MAX : PT_MIN(n, m);
}

static int32_t *json_ids(const json_t *a, size_t *n) {
    *n = json_array_size(a);
    int32_t *v = malloc((*n + 1) * sizeof *v);
    for (size_t i = 0; i < *n; i++) v[i] = (int32_t)json_integer_value(json_array_get(a, i));
    return v;
}

typedef struct tally {
    size_t strings, mismatches[PT_ARRAY_LEN(k_modes)], decode_mismatches, reports, n_modes;
    double seconds;
} tally;

static void report(tally *t, const char *name, const char *what, size_t idx, const json_t *text) {
    if (t->reports++ >= MAX_REPORTS) return;
    fprintf(stderr, "MISMATCH %s %s, corpus string %zu: ", name, what, idx);
    print_escaped(json_string_value(text), json_string_length(text));
    fputc('\n', stderr);
}

static int check_encode(const pt_tokenizer *tok, const char *name, const json_t *ref,
                        const json_t *text, size_t idx, tally *t) {
    for (size_t m = 0; m < t->n_modes; m++) {
        const json_t *want = json_array_get(json_object_get(ref, k_modes[m].key), idx);
        int32_t *ids;
        size_t n;
        pt_err err = {{0}};
        double t0 = pt_now();
        if (pt_tokenize(tok, json_string_value(text), json_string_length(text),
                        k_modes[m].add_special, k_modes[m].parse_special, &ids, &n, &err)) {
            fprintf(stderr, "%s: tokenize failed: %s\n", name, err.msg);
            return -1;
        }
        t->seconds += pt_now() - t0;
        size_t at = first_diff(ids, n, want);
        if (at != SIZE_MAX) {
            t->mismatches[m]++;
            report(t, name, k_modes[m].key, idx, text);
            if (t->reports <= MAX_REPORTS) {
                size_t wn;
                int32_t *w = json_ids(want, &wn);
                print_ids("petrel", ids, n, at);
                print_ids("reference", w, wn, at);
                free(w);
            }
        }
        free(ids);
    }
    return 0;
}

static void check_decode(const pt_tokenizer *tok, const char *name, const json_t *ref,
                         const json_t *text, size_t idx, tally *t) {
    size_t n;
    int32_t *ids = json_ids(json_array_get(json_object_get(ref, "special"), idx), &n);
    char *got = pt_detokenize(tok, ids, n, true);
    const json_t *want = json_array_get(json_object_get(ref, "decoded"), idx);
    if (strlen(got) != json_string_length(want) || memcmp(got, json_string_value(want), strlen(got))) {
        /* pt_detokenize is a C string: a decoded NUL ends it early. */
        if (!memchr(json_string_value(want), 0, json_string_length(want))) {
            t->decode_mismatches++;
            report(t, name, "decode", idx, text);
            if (t->reports <= MAX_REPORTS) {
                fputs("    petrel:    ", stderr);
                print_escaped(got, strlen(got));
                fputs("\n    reference: ", stderr);
                print_escaped(json_string_value(want), json_string_length(want));
                fputc('\n', stderr);
            }
        }
    }
    free(got);
    free(ids);
}

/* 100 KB of the corpus glued together, for a rough speed figure. */
static void time_100k(const pt_tokenizer *tok, const char *name, const json_t *corpus) {
    char *buf = malloc(100 * 1024 + 1);
    size_t n = 0;
    for (size_t i = 0; n < 100 * 1024; i = (i + 1) % json_array_size(corpus)) {
        const json_t *s = json_array_get(corpus, i);
        size_t k = PT_MIN(json_string_length(s), 100 * 1024 - n);
        memcpy(buf + n, json_string_value(s), k);
        n += k;
    }
    int32_t *ids;
    size_t n_ids;
    pt_err err;
    double t0 = pt_now();
    if (pt_tokenize(tok, buf, n, false, true, &ids, &n_ids, &err) == 0) {
        printf("  %s: 100 KB -> %zu tokens in %.3f s\n", name, n_ids, pt_now() - t0);
        free(ids);
    }
    free(buf);
}

/* ---- GGUF conversion ---- */

typedef struct wbuf {
    uint8_t *p;
    size_t n, cap;
} wbuf;

static void w_put(wbuf *b, const void *p, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2;
        b->p = realloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, p, n);
    b->n += n;
}
static void w_u32(wbuf *b, uint32_t v) { w_put(b, &v, 4); }
static void w_u64(wbuf *b, uint64_t v) { w_put(b, &v, 8); }
static void w_str(wbuf *b, const char *s, size_t n) {
    w_u64(b, n);
    w_put(b, s, n);
}
static void w_key(wbuf *b, const char *key, uint32_t type) {
    w_str(b, key, strlen(key));
    w_u32(b, type);
}

typedef struct conv {
    size_t n;
    const char **text;
    size_t *len;
    int32_t *type;
} conv;

static int32_t conv_find(const conv *c, const char *s) {
    for (size_t i = 0; i < c->n; i++)
        if (c->text[i] && c->len[i] == strlen(s) && !memcmp(c->text[i], s, c->len[i])) return (int32_t)i;
    return -1;
}

/* The token table of a tokenizer.json as llama.cpp's converter lays it out. */
static void conv_vocab(conv *c, const json_t *root) {
    const json_t *vocab = json_object_get(json_object_get(root, "model"), "vocab"), *v;
    const json_t *added = json_object_get(root, "added_tokens");
    const char *key;
    size_t i;
    c->n = 0;
    json_object_foreach((json_t *)vocab, key, v) c->n = PT_MAX(c->n, (size_t)json_integer_value(v) + 1);
    json_array_foreach(added, i, v) c->n = PT_MAX(c->n, (size_t)json_integer_value(json_object_get(v, "id")) + 1);
    c->text = calloc(c->n, sizeof *c->text);
    c->len = calloc(c->n, sizeof *c->len);
    c->type = calloc(c->n, sizeof *c->type);
    json_object_foreach((json_t *)vocab, key, v) {
        size_t id = (size_t)json_integer_value(v);
        c->text[id] = key, c->len[id] = strlen(key), c->type[id] = 1;
    }
    json_array_foreach(added, i, v) {
        size_t id = (size_t)json_integer_value(json_object_get(v, "id"));
        const json_t *content = json_object_get(v, "content");
        c->text[id] = json_string_value(content), c->len[id] = json_string_length(content);
        c->type[id] = json_is_true(json_object_get(v, "special")) ? 3 : 4;
    }
}

static uint8_t *to_gguf(const json_t *root, const char *pre, size_t *size) {
    conv c;
    conv_vocab(&c, root);
    const json_t *merges = json_object_get(json_object_get(root, "model"), "merges");
    wbuf b = {0};
    w_put(&b, "GGUF", 4);
    w_u32(&b, 3);
    w_u64(&b, 0);
    w_u64(&b, 6);
    w_key(&b, "tokenizer.ggml.model", PT_GGUF_STRING);
    w_str(&b, "gpt2", 4);
    w_key(&b, "tokenizer.ggml.tokens", PT_GGUF_ARRAY);
    w_u32(&b, PT_GGUF_STRING);
    w_u64(&b, c.n);
    char pad[32];
    for (size_t i = 0; i < c.n; i++) {
        if (c.text[i]) {
            w_str(&b, c.text[i], c.len[i]);
        } else { /* a hole in the ids, as the converter fills it */
            snprintf(pad, sizeof pad, "[PAD%zu]", i);
            w_str(&b, pad, strlen(pad));
            c.type[i] = 5;
        }
    }
    w_key(&b, "tokenizer.ggml.token_type", PT_GGUF_ARRAY);
    w_u32(&b, PT_GGUF_I32);
    w_u64(&b, c.n);
    for (size_t i = 0; i < c.n; i++) w_u32(&b, (uint32_t)c.type[i]);
    w_key(&b, "tokenizer.ggml.merges", PT_GGUF_ARRAY);
    w_u32(&b, PT_GGUF_STRING);
    w_u64(&b, json_array_size(merges));
    const json_t *m;
    size_t i;
    char line[1024];
    json_array_foreach(merges, i, m) {
        if (json_is_string(m))
            snprintf(line, sizeof line, "%s", json_string_value(m));
        else
            snprintf(line, sizeof line, "%s %s", json_string_value(json_array_get(m, 0)),
                     json_string_value(json_array_get(m, 1)));
        w_str(&b, line, strlen(line));
    }
    w_key(&b, "tokenizer.ggml.pre", PT_GGUF_STRING);
    w_str(&b, pre, strlen(pre));
    w_key(&b, "tokenizer.ggml.bos_token_id", PT_GGUF_U32);
    w_u32(&b, (uint32_t)PT_MAX(conv_find(&c, "<|begin_of_text|>"), 0));
    w_key(&b, "tokenizer.ggml.eos_token_id", PT_GGUF_U32);
    w_u32(&b, (uint32_t)PT_MAX(conv_find(&c, "<|endoftext|>"), 0));
    while (b.n % 32) w_put(&b, "", 1);
    free(c.text), free(c.len), free(c.type);
    *size = b.n;
    return b.p;
}

/* Loads the reference's tokenizer through the GGUF path. */
static int load_as_gguf(const char *base, const char *json_path, pt_tokenizer **tok,
                        uint8_t **image, pt_gguf **g, pt_err *err) {
    static const struct {
        const char *base, *pre;
    } kinds[] = {{"llama3", "llama-bpe"}, {"qwen3", "qwen2"}};
    for (size_t k = 0; k < PT_ARRAY_LEN(kinds); k++) {
        if (strcmp(base, kinds[k].base)) continue;
        json_error_t jerr;
        json_t *root = json_load_file(json_path, JSON_ALLOW_NUL, &jerr);
        if (!root) return pt_fail(err, "%s: %s", json_path, jerr.text);
        size_t size;
        *image = to_gguf(root, kinds[k].pre, &size);
        json_decref(root);
        if (pt_gguf_parse(g, *image, size, "converted", err)) return -1;
        return pt_tokenizer_load_gguf(tok, *g, err);
    }
    return pt_fail(err, "no GGUF conversion for %s", base);
}

/* ---- whole-vocabulary streaming decode ---- */

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

/* Every token, in id order, one at a time: the stream must equal the
 * one-shot decode (up to its first NUL) and be valid UTF-8. */
static int check_vocab_stream(const pt_tokenizer *tok, const char *name) {
    int n = pt_tokenizer_n_vocab(tok);
    int32_t *ids = malloc((size_t)n * sizeof *ids);
    size_t cap = 1 << 20, used = 0;
    char *all = malloc(cap);
    pt_detok d;
    pt_detok_init(&d, tok);
    d.at_start = true;
    for (int i = 0; i <= n; i++) {
        char buf[4096];
        size_t m = i < n ? pt_detok_push(&d, ids[i] = i, buf, sizeof buf) : pt_detok_flush(&d, buf, sizeof buf);
        if (used + m + 1 > cap) all = realloc(all, cap *= 2);
        memcpy(all + used, buf, m);
        used += m;
    }
    char *one = pt_detokenize(tok, ids, (size_t)n, true);
    bool ok = valid_utf8(all, used) && strlen(one) <= used && !memcmp(all, one, strlen(one)) &&
              (strlen(one) == used || all[strlen(one)] == 0);
    printf("  %s: whole vocabulary streamed one token at a time: %zu bytes, %s\n", name, used,
           ok ? "equal to the one-shot decode, valid UTF-8" : "MISMATCH");
    free(one);
    free(all);
    free(ids);
    return ok ? 0 : -1;
}

static int run(const char *name, const json_t *corpus, const char *ref_dir, tally *t) {
    char path[4096], base[64];
    snprintf(base, sizeof base, "%s", name);
    char *dash = strstr(base, "-gguf");
    bool gguf = dash != NULL;
    if (dash) *dash = 0;
    snprintf(path, sizeof path, "%s/%s.json", ref_dir, base);
    json_error_t jerr;
    json_t *ref = json_load_file(path, JSON_ALLOW_NUL, &jerr);
    if (!ref) {
        fprintf(stderr, "%s: %s\n", path, jerr.text);
        return -1;
    }
    pt_tokenizer *tok = NULL;
    pt_gguf *g = NULL;
    uint8_t *image = NULL;
    pt_err err = {{0}};
    double t0 = pt_now();
    const char *json_path = json_string_value(json_object_get(ref, "tokenizer_json"));
    int rc = gguf ? load_as_gguf(base, json_path, &tok, &image, &g, &err)
                  : pt_tokenizer_load_json(&tok, json_path,
                                           json_string_value(json_object_get(ref, "tokenizer_config")),
                                           &err);
    if (rc) {
        fprintf(stderr, "%s: %s\n", name, err.msg);
    } else {
        printf("  %s: loaded in %.2f s, %d tokens\n", name, pt_now() - t0,
               pt_tokenizer_n_vocab(tok));
        t->n_modes = gguf ? 2 : PT_ARRAY_LEN(k_modes);
        for (size_t i = 0; i < json_array_size(corpus) && !rc; i++) {
            const json_t *text = json_array_get(corpus, i);
            rc = check_encode(tok, name, ref, text, i, t);
            if (!gguf) check_decode(tok, name, ref, text, i, t);
            t->strings++;
        }
        time_100k(tok, name, corpus);
        if (!rc && check_vocab_stream(tok, name)) t->decode_mismatches++;
    }
    pt_tokenizer_free(tok);
    pt_gguf_close(g);
    free(image);
    json_decref(ref);
    return rc;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s CORPUS.json REF_DIR name...\n", argv[0]);
        return 2;
    }
    json_error_t jerr;
    json_t *corpus = json_load_file(argv[1], JSON_ALLOW_NUL, &jerr);
    if (!json_is_array(corpus)) {
        fprintf(stderr, "%s: %s\n", argv[1], jerr.text);
        return 2;
    }
    int failed = 0;
    for (int a = 3; a < argc; a++) {
        tally t = {0};
        if (run(argv[a], corpus, argv[2], &t)) return 1;
        size_t bad = t.decode_mismatches;
        for (size_t m = 0; m < PT_ARRAY_LEN(k_modes); m++) bad += t.mismatches[m];
        char third[32] = "n/a";
        if (t.n_modes > 2) snprintf(third, sizeof third, "%zu", t.mismatches[2]);
        printf("%-11s %zu strings: mismatches plain %zu, special %zu, with_special %s, decode %zu"
               " (encode %.2f s)\n",
               argv[a], t.strings, t.mismatches[0], t.mismatches[1], third,
               t.decode_mismatches, t.seconds);
        failed |= bad != 0;
    }
    json_decref(corpus);
    printf(failed ? "tokenizer parity: FAILED\n" : "tokenizer parity: all ids identical\n");
    return failed;
}
