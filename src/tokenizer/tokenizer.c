/*
 * tokenizer.c - the public tokenizer API: loading (dispatch on the file
 * kind), encoding a text, and the accessors.
 *
 * Encoding runs in the same stages for every tokenizer:
 *   1. added tokens are found in the raw text, leftmost-longest (special
 *      ones only with parse_special), which cuts it into sections;
 *   2. an added token with lstrip/rstrip eats the white space beside it;
 *   3. each plain section is encoded by the model: SPM (llama.cpp's rule:
 *      a space in front of the first section and of every section that
 *      follows an added token) or BPE (normalize, pre-tokenize, merge each
 *      word, fuse unknowns);
 *   4. with add_special, the BOS/EOS (or template) tokens go around it.
 * For byte-level and tokenizer.json BPE the text is first made valid UTF-8
 * (bad bytes become U+FFFD, as a JS string would hold them); SPM takes any
 * bytes, as llama.cpp does.
 */
#include "tokenizer/tokenizer_internal.h"

#include <stdlib.h>
#include <sys/stat.h>

#define MAX_JSON_BYTES ((size_t)512 << 20)

/* ---- loading ---- */

void pt_tokenizer_free(pt_tokenizer *t) {
    if (!t) return;
    tok_pretok_free(t);
    tok_arena_free(&t->arena);
    free(t->tokens);
    free(t->eog);
    free(t->map.slots);
    free(t->merges.slots);
    free(t->added);
    free(t->trie.term);
    free(t->trie.edges);
    free(t->prefix.v);
    free(t->suffix.v);
    free(t);
}

static pt_tokenizer *tok_new(void) {
    pt_tokenizer *t = pt_xcalloc(1, sizeof *t);
    t->bos = t->eos = t->unk = -1;
    for (int i = 0; i < 256; i++) t->byte_ids[i] = t->byte_sym[i] = -1;
    return t;
}

int pt_tokenizer_load_gguf(pt_tokenizer **out, const pt_gguf *g, pt_err *err) {
    *out = NULL;
    pt_gguf_str model;
    if (!pt_gguf_get_str(g, "tokenizer.ggml.model", &model))
        return pt_fail(err, "the GGUF file has no tokenizer (tokenizer.ggml.model)");
    bool spm = model.len == 5 && !memcmp(model.s, "llama", 5);
    bool bpe = model.len == 4 && !memcmp(model.s, "gpt2", 4);
    if (!spm && !bpe)
        return pt_fail(err, "GGUF tokenizer model '%.*s' is not supported (only llama and gpt2)",
                       (int)PT_MIN(model.len, 40u), model.s);
    pt_tokenizer *t = tok_new();
    if (tok_gguf_vocab(t, g, spm, err) ||
        (spm ? tok_spm_load_gguf(t, g, err) : tok_bpe_load_gguf(t, g, err))) {
        pt_tokenizer_free(t);
        return -1;
    }
    if (t->add_bos) tok_ids_push(&t->prefix, t->bos);
    if (t->add_eos) tok_ids_push(&t->suffix, t->eos);
    *out = t;
    return 0;
}

/* flags: tokenizer_config.json needs JSON_DECODE_INT_AS_REAL, as HF writes
 * model_max_length = 1e30 as an integer literal that overflows json_int_t. */
static json_t *parse_json(const char *data, size_t len, size_t flags, const char *what,
                          pt_err *err) {
    json_error_t jerr;
    json_t *root = json_loadb(data, len, JSON_ALLOW_NUL | flags, &jerr);
    if (!root)
        pt_fail(err, "%s: line %d column %d: %s", what, jerr.line, jerr.column, jerr.text);
    return root;
}

int pt_tokenizer_load_json_mem(pt_tokenizer **out, const char *json, size_t len,
                               const json_t *config, pt_err *err) {
    *out = NULL;
    json_t *root = parse_json(json, len, 0, "tokenizer.json", err);
    if (!root) return -1;
    pt_tokenizer *t = tok_new();
    int rc = tok_json_load(t, root, config, err);
    json_decref(root);
    if (rc) {
        pt_tokenizer_free(t);
        return pt_failp(err, "tokenizer.json");
    }
    *out = t;
    return 0;
}

static int read_whole(const char *path, char **data, size_t *len, pt_err *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return pt_fail(err, "%s: cannot open", path);
    struct stat st;
    if (fstat(fileno(f), &st) || (size_t)st.st_size > MAX_JSON_BYTES) {
        fclose(f);
        return pt_fail(err, "%s: cannot stat, or larger than %zu MB", path, MAX_JSON_BYTES >> 20);
    }
    *len = (size_t)st.st_size;
    *data = pt_xmalloc(*len + 1);
    size_t got = fread(*data, 1, *len, f);
    fclose(f);
    if (got != *len) {
        free(*data);
        return pt_fail(err, "%s: read error", path);
    }
    return 0;
}

static int load_json_files(pt_tokenizer **out, const char *path, const json_t *config,
                           pt_err *err) {
    char *data;
    size_t len;
    if (read_whole(path, &data, &len, err)) return -1;
    int rc = pt_tokenizer_load_json_mem(out, data, len, config, err);
    free(data);
    return rc ? pt_failp(err, "%s", path) : 0;
}

int pt_tokenizer_load_json(pt_tokenizer **out, const char *tokenizer_json,
                           const char *tokenizer_config_json, pt_err *err) {
    *out = NULL;
    json_t *config = NULL;
    if (tokenizer_config_json) {
        char *data;
        size_t len;
        if (read_whole(tokenizer_config_json, &data, &len, err)) return -1;
        config = parse_json(data, len, JSON_DECODE_INT_AS_REAL, tokenizer_config_json, err);
        free(data);
        if (!config) return -1;
    }
    int rc = load_json_files(out, tokenizer_json, config, err);
    json_decref(config);
    return rc;
}

/* generation_config.json may name more end tokens: "eos_token_id": 1 or [1, 106]. */
static void add_generation_eos(pt_tokenizer *t, const json_t *gen) {
    const json_t *e = json_object_get(gen, "eos_token_id"), *v;
    size_t i;
    if (json_is_integer(e)) tok_set_eog(t, (int32_t)json_integer_value(e));
    json_array_foreach(e, i, v) {
        if (json_is_integer(v)) tok_set_eog(t, (int32_t)json_integer_value(v));
    }
}

int pt_tokenizer_load(pt_tokenizer **out, const pt_model_file *mf, pt_err *err) {
    *out = NULL;
    if (mf->kind == PT_FILE_GGUF) return pt_tokenizer_load_gguf(out, mf->gguf, err);
    if (!mf->tokenizer_json && mf->tokenizer_gguf) { /* converted from GGUF */
        pt_gguf *g;
        if (pt_gguf_open(&g, mf->tokenizer_gguf, err)) return -1;
        int rc = pt_tokenizer_load_gguf(out, g, err); /* copies what it keeps */
        pt_gguf_close(g);
        if (rc) return pt_failp(err, "%s", mf->tokenizer_gguf);
        add_generation_eos(*out, mf->generation_config);
        return 0;
    }
    if (!mf->tokenizer_json)
        return pt_fail(err, "%s: no tokenizer.json (or tokenizer.gguf) beside the model", mf->path);
    if (load_json_files(out, mf->tokenizer_json, mf->tokenizer_config, err)) return -1;
    add_generation_eos(*out, mf->generation_config);
    return 0;
}

/* ---- encoding ---- */

typedef struct section {
    size_t off, len;
    int added; /* index into t->added, or -1 for plain text */
} section;

typedef struct sections {
    section *v;
    size_t n, cap;
} sections;

static void add_section(sections *s, size_t off, size_t len, int added) {
    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 16;
        s->v = pt_xrealloc(s->v, s->cap * sizeof *s->v);
    }
    s->v[s->n++] = (section){off, len, added};
}

static void split_added(const pt_tokenizer *t, const char *s, size_t n, bool parse_special,
                        sections *out) {
    size_t start = 0;
    for (size_t i = 0; i < n;) {
        size_t len = 0;
        int a = tok_trie_match(t, s + i, n - i, parse_special, &len);
        if (a < 0) {
            i++;
            continue;
        }
        if (i > start) add_section(out, start, i - start, -1);
        add_section(out, i, len, a);
        i += len;
        start = i;
    }
    if (start < n) add_section(out, start, n - start, -1);
    /* lstrip/rstrip: the neighbouring text loses its white space. */
    for (size_t k = 0; k < out->n; k++) {
        if (out->v[k].added < 0) continue;
        const tok_added *a = &t->added[out->v[k].added];
        if (a->lstrip && k > 0 && out->v[k - 1].added < 0)
            out->v[k - 1].len = tok_js_trim_right(s + out->v[k - 1].off, out->v[k - 1].len);
        if (a->rstrip && k + 1 < out->n && out->v[k + 1].added < 0) {
            section *next = &out->v[k + 1];
            size_t cut = tok_js_trim_left(s + next->off, next->len);
            next->off += cut;
            next->len -= cut;
        }
    }
}

typedef struct scratch {
    tok_work work;
    tok_buf norm;
    tok_words words;
} scratch;

static int encode_bpe(const pt_tokenizer *t, const char *s, size_t n, int index, scratch *sc,
                      tok_ids *out, pt_err *err) {
    if (t->n_norms) {
        if (tok_normalize(t, s, n, &sc->norm, err)) return -1;
        s = sc->norm.s;
        n = sc->norm.n;
    }
    if (!n) return 0;
    if (tok_pretokenize(t, s, n, index, &sc->words, err)) return -1;
    size_t from = out->n;
    for (size_t k = 0; k < sc->words.n; k++)
        tok_bpe_word(t, sc->words.text.s + sc->words.spans[2 * k], sc->words.spans[2 * k + 1],
                     &sc->work, out);
    tok_bpe_fuse_unk(t, out, from);
    return 0;
}

static int encode_sections(const pt_tokenizer *t, const char *s, const sections *secs,
                           tok_ids *out, pt_err *err) {
    scratch sc = {0};
    bool prev_added = true; /* llama.cpp: the first section gets the space too */
    int rc = 0;
    for (size_t k = 0; k < secs->n && !rc; k++) {
        const section *c = &secs->v[k];
        if (c->added >= 0) {
            tok_ids_push(out, t->added[c->added].id);
            prev_added = true;
        } else if (c->len && t->model == TOK_MODEL_SPM) {
            tok_spm_encode(t, s + c->off, c->len, t->add_space_prefix && prev_added, &sc.work, out);
            prev_added = false;
        } else if (c->len) {
            rc = encode_bpe(t, s + c->off, c->len, (int)k, &sc, out, err);
        }
    }
    tok_work_free(&sc.work);
    free(sc.norm.s);
    tok_words_free(&sc.words);
    return rc;
}

int pt_tokenize(const pt_tokenizer *t, const char *text, size_t len, bool add_special,
                bool parse_special, int32_t **ids, size_t *n_ids, pt_err *err) {
    *ids = NULL;
    *n_ids = 0;
    if (!text && len) return pt_fail(err, "tokenize: NULL text");
    tok_buf clean = {0};
    if (t->model == TOK_MODEL_BPE && !tok_utf8_valid(text, len)) {
        tok_utf8_sanitize(text, len, &clean);
        text = clean.s;
        len = clean.n;
    }
    sections secs = {0};
    split_added(t, text ? text : "", len, parse_special, &secs);
    tok_ids out = {0};
    if (add_special)
        for (size_t i = 0; i < t->prefix.n; i++) tok_ids_push(&out, t->prefix.v[i]);
    int rc = encode_sections(t, text, &secs, &out, err);
    if (add_special)
        for (size_t i = 0; i < t->suffix.n; i++) tok_ids_push(&out, t->suffix.v[i]);
    free(secs.v);
    free(clean.s);
    if (rc) {
        free(out.v);
        return -1;
    }
    if (!out.v) out.v = pt_xmalloc(sizeof *out.v); /* callers may free it either way */
    *ids = out.v;
    *n_ids = out.n;
    return 0;
}

/* ---- accessors ---- */

int pt_tokenizer_n_vocab(const pt_tokenizer *t) { return t->n_vocab; }
int32_t pt_tokenizer_bos(const pt_tokenizer *t) { return t->bos; }
int32_t pt_tokenizer_eos(const pt_tokenizer *t) { return t->eos; }

bool pt_tokenizer_is_eog(const pt_tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_vocab && t->eog[id];
}

bool pt_tokenizer_adds_bos(const pt_tokenizer *t) {
    return t->bos >= 0 && t->prefix.n && t->prefix.v[0] == t->bos;
}

int32_t pt_token_lookup(const pt_tokenizer *t, const char *piece) {
    return piece ? tok_strmap_get(t, piece, strlen(piece)) : -1;
}

bool pt_token_is_special(const pt_tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_vocab && t->tokens[id].special;
}
