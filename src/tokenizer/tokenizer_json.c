/*
 * tokenizer_json.c - loading a Hugging Face tokenizer.json (plus the
 * tokenizer_config.json beside it) into a pt_tokenizer.
 *
 * Supported: model BPE (byte-level or with byte_fallback, ignore_merges,
 * fuse_unk, merges as "a b" strings or [a, b] pairs); added_tokens with
 * special/lstrip/rstrip; normalizers NFC, NFD, NFKC, NFKD, Replace,
 * Prepend, Strip, Lowercase, StripAccents, Sequence; pre-tokenizers Split,
 * ByteLevel, Metaspace, Whitespace, WhitespaceSplit, Digits, Punctuation,
 * Sequence; post-processors TemplateProcessing, ByteLevel, BertProcessing,
 * RobertaProcessing, Sequence; decoders ByteLevel, ByteFallback, Replace,
 * Fuse, Strip, Metaspace, Sequence.  Anything else is refused with an error
 * that names it: encoding a text slightly wrong is worse than not loading.
 *
 * The file is untrusted.  Every id is range-checked, every string length
 * bounded, recursion (Sequence in Sequence) limited, and a merge that names
 * a piece outside the vocabulary is skipped (both references would refuse
 * or ignore it).
 */
#include "tokenizer/tokenizer_internal.h"

#include <stdlib.h>
#include <strings.h>

static const char *jstr(const json_t *o, const char *key) {
    return json_string_value(json_object_get(o, key));
}

static bool jbool(const json_t *o, const char *key, bool dflt) {
    const json_t *v = json_object_get(o, key);
    return json_is_boolean(v) ? json_is_true(v) : dflt;
}

static char *jdup(const json_t *s, size_t *len) {
    *len = json_string_length(s);
    char *p = pt_xmalloc(*len + 1);
    memcpy(p, json_string_value(s), *len);
    p[*len] = 0;
    return p;
}

/* A token named in tokenizer_config.json: "text" or {"content": "text"}. */
static const json_t *token_name(const json_t *config, const char *key) {
    const json_t *v = json_object_get(config, key);
    if (json_is_object(v)) v = json_object_get(v, "content");
    return json_is_string(v) ? v : NULL;
}

static int32_t lookup_json(const pt_tokenizer *t, const json_t *s) {
    return s ? tok_strmap_get(t, json_string_value(s), json_string_length(s)) : -1;
}

/* ---- vocabulary and added tokens ---- */

static int check_id(const json_t *v, const char *what, const char *name, int64_t *max,
                    pt_err *err) {
    if (!json_is_integer(v) || json_integer_value(v) < 0 ||
        json_integer_value(v) >= TOK_MAX_VOCAB)
        return pt_fail(err, "%s \"%.40s\" has no valid id", what, name);
    if (json_integer_value(v) > *max) *max = json_integer_value(v);
    return 0;
}

static int size_vocab(const json_t *vocab, const json_t *added, int64_t *max, pt_err *err) {
    const char *key;
    const json_t *v;
    size_t i;
    json_object_foreach((json_t *)vocab, key, v) {
        if (check_id(v, "vocab entry", key, max, err)) return -1;
    }
    json_array_foreach(added, i, v) {
        if (!json_is_object(v) || !json_is_string(json_object_get(v, "content")))
            return pt_fail(err, "added_tokens[%zu] has no content", i);
        if (check_id(json_object_get(v, "id"), "added token", jstr(v, "content"), max, err))
            return -1;
    }
    return 0;
}

static void set_text(pt_tokenizer *t, int64_t id, const char *s, size_t n, uint8_t type) {
    t->tokens[id].text = tok_arena_dup(&t->arena, s, n);
    t->tokens[id].len = (uint32_t)n;
    t->tokens[id].type = type;
}

static int load_vocab(pt_tokenizer *t, const json_t *model, const json_t *added, pt_err *err) {
    const json_t *vocab = json_object_get(model, "vocab");
    if (!json_is_object(vocab)) return pt_fail(err, "model.vocab is not an object");
    if (added && !json_is_array(added)) return pt_fail(err, "added_tokens is not an array");
    int64_t max = -1;
    if (size_vocab(vocab, added, &max, err)) return -1;
    /* Ids may leave holes, but a few entries must not make us allocate for
     * millions: the table is at most 4 slots per entry, plus some slack. */
    size_t entries = json_object_size(vocab) + json_array_size(added);
    if (max >= 4 * (int64_t)entries + 65536)
        return pt_fail(err, "the largest id, %lld, is far beyond the %zu tokens given",
                       (long long)max, entries);
    if (tok_alloc_vocab(t, max + 1, err)) return -1;
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)vocab, key, v) {
        set_text(t, json_integer_value(v), key, strlen(key), TOK_NORMAL);
    }
    size_t i;
    t->added = pt_xcalloc(json_array_size(added) + 1, sizeof *t->added);
    json_array_foreach(added, i, v) {
        const json_t *content = json_object_get(v, "content");
        int64_t id = json_integer_value(json_object_get(v, "id"));
        bool special = jbool(v, "special", false);
        set_text(t, id, json_string_value(content), json_string_length(content),
                 special ? TOK_CONTROL : TOK_USER);
        t->tokens[id].special = special;
        t->added[t->n_added++] =
            (tok_added){(int32_t)id, special, jbool(v, "lstrip", false), jbool(v, "rstrip", false)};
    }
    tok_strmap_build(t);
    tok_trie_build(t);
    return 0;
}

/* ---- merges and model options ---- */

/* "a b" (split as JS's split(" ", 2): text after a second space is
 * ignored) or ["a", "b"]. */
static bool merge_parts(const json_t *m, const char **a, size_t *la, const char **b,
                        size_t *lb) {
    if (json_is_string(m)) {
        const char *s = json_string_value(m);
        size_t n = json_string_length(m);
        const char *sp = memchr(s, ' ', n);
        if (!sp) return false;
        *a = s, *la = (size_t)(sp - s);
        *b = sp + 1;
        const char *end = memchr(*b, ' ', n - *la - 1);
        *lb = end ? (size_t)(end - *b) : n - *la - 1;
        return true;
    }
    if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
        json_is_string(json_array_get(m, 1))) {
        *a = json_string_value(json_array_get(m, 0));
        *la = json_string_length(json_array_get(m, 0));
        *b = json_string_value(json_array_get(m, 1));
        *lb = json_string_length(json_array_get(m, 1));
        return true;
    }
    return false;
}

static int load_merges(pt_tokenizer *t, const json_t *model, pt_err *err) {
    const json_t *merges = json_object_get(model, "merges");
    if (!merges) return 0;
    if (!json_is_array(merges)) return pt_fail(err, "model.merges is not an array");
    if (json_array_size(merges) > INT32_MAX) return pt_fail(err, "model.merges is too long");
    tok_buf both = {0};
    size_t i, skipped = 0;
    const json_t *m;
    json_array_foreach(merges, i, m) {
        const char *a, *b;
        size_t la, lb;
        if (!merge_parts(m, &a, &la, &b, &lb)) {
            if (json_is_string(m)) { /* no space: can never match, as in JS */
                skipped++;
                continue;
            }
            free(both.s);
            return pt_fail(err, "model.merges[%zu] is neither \"a b\" nor [\"a\", \"b\"]", i);
        }
        both.n = 0;
        tok_buf_put(&both, a, la);
        tok_buf_put(&both, b, lb);
        int32_t ia = tok_strmap_get(t, a, la), ib = tok_strmap_get(t, b, lb);
        int32_t ir = tok_strmap_get(t, both.s, both.n);
        if (ia < 0 || ib < 0 || ir < 0) {
            skipped++;
            continue;
        }
        tok_pairmap_put(&t->merges, ia, ib, (int32_t)i, ir);
    }
    free(both.s);
    if (skipped) pt_debug("tokenizer.json: %zu merges skipped (pieces not in the vocabulary)", skipped);
    return 0;
}

static int load_model_options(pt_tokenizer *t, const json_t *model, pt_err *err) {
    static const char *unsupported[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (size_t i = 0; i < PT_ARRAY_LEN(unsupported); i++) {
        const char *s = jstr(model, unsupported[i]);
        if (s && *s) return pt_fail(err, "model.%s is not supported", unsupported[i]);
    }
    t->byte_fallback = jbool(model, "byte_fallback", false);
    t->ignore_merges = jbool(model, "ignore_merges", false);
    t->fuse_unk = jbool(model, "fuse_unk", false);
    t->unk = lookup_json(t, json_object_get(model, "unk_token"));
    return 0;
}

/* ---- normalizers ---- */

static tok_norm *add_norm(pt_tokenizer *t, int kind) {
    t->norms = pt_xrealloc(t->norms, (size_t)(t->n_norms + 1) * sizeof *t->norms);
    tok_norm *nm = &t->norms[t->n_norms++];
    memset(nm, 0, sizeof *nm);
    nm->kind = kind;
    return nm;
}

/* pattern {"String": s} or {"Regex": r}; *re is compiled for a Regex. */
static int parse_pattern(const json_t *pattern, const json_t **lit, pcre2_code **re,
                         pt_err *err) {
    const json_t *s = json_object_get(pattern, "String"), *r = json_object_get(pattern, "Regex");
    *lit = NULL;
    *re = NULL;
    if (json_is_string(s)) {
        *lit = s;
        return 0;
    }
    if (json_is_string(r))
        return tok_regex_compile(json_string_value(r), json_string_length(r), re, err);
    return pt_fail(err, "pattern is neither {\"String\": ...} nor {\"Regex\": ...}");
}

static int parse_norm(pt_tokenizer *t, const json_t *j, int depth, pt_err *err) {
    if (!j || json_is_null(j)) return 0;
    const char *type = jstr(j, "type");
    if (!type) return pt_fail(err, "normalizer without a type");
    if (depth > TOK_MAX_DEPTH) return pt_fail(err, "normalizers nested too deeply");
    static const struct {
        const char *name;
        int kind;
    } simple[] = {{"NFC", NORM_NFC},           {"NFD", NORM_NFD},
                  {"NFKC", NORM_NFKC},         {"NFKD", NORM_NFKD},
                  {"Lowercase", NORM_LOWERCASE}, {"StripAccents", NORM_STRIP_ACCENTS}};
    for (size_t i = 0; i < PT_ARRAY_LEN(simple); i++)
        if (!strcmp(type, simple[i].name)) return add_norm(t, simple[i].kind), 0;
    if (!strcmp(type, "Sequence")) {
        const json_t *list = json_object_get(j, "normalizers"), *v;
        size_t i;
        if (!json_is_array(list)) return pt_fail(err, "Sequence normalizer without a list");
        json_array_foreach(list, i, v) {
            if (parse_norm(t, v, depth + 1, err)) return -1;
        }
        return 0;
    }
    if (!strcmp(type, "Replace")) {
        const json_t *content = json_object_get(j, "content"), *lit;
        if (!json_is_string(content)) return pt_fail(err, "Replace normalizer without content");
        tok_norm *nm = add_norm(t, NORM_REPLACE);
        nm->with = jdup(content, &nm->with_len);
        if (parse_pattern(json_object_get(j, "pattern"), &lit, &nm->re, err)) return -1;
        if (lit) nm->pat = jdup(lit, &nm->pat_len);
        return 0;
    }
    if (!strcmp(type, "Prepend")) {
        const json_t *p = json_object_get(j, "prepend");
        if (!json_is_string(p)) return pt_fail(err, "Prepend normalizer without a string");
        tok_norm *nm = add_norm(t, NORM_PREPEND);
        nm->with = jdup(p, &nm->with_len);
        return 0;
    }
    if (!strcmp(type, "Strip")) {
        tok_norm *nm = add_norm(t, NORM_STRIP);
        nm->left = jbool(j, "strip_left", true);
        nm->right = jbool(j, "strip_right", true);
        return 0;
    }
    return pt_fail(err, "normalizer \"%.40s\" is not supported", type);
}

/* ---- pre-tokenizers ---- */

static tok_pre *add_pre(pt_tokenizer *t, int kind) {
    t->pres = pt_xrealloc(t->pres, (size_t)(t->n_pres + 1) * sizeof *t->pres);
    tok_pre *p = &t->pres[t->n_pres++];
    memset(p, 0, sizeof *p);
    p->kind = kind;
    return p;
}

/* A literal string as a regex: ASCII punctuation escaped. */
static int literal_regex(const json_t *s, pcre2_code **re, pt_err *err) {
    tok_buf b = {0};
    const char *p = json_string_value(s);
    for (size_t i = 0; i < json_string_length(s); i++) {
        unsigned char c = (unsigned char)p[i];
        if (c < 0x80 && !((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')))
            tok_buf_putc(&b, '\\');
        tok_buf_putc(&b, (char)c);
    }
    int rc = tok_regex_compile(b.s ? b.s : "", b.n, re, err);
    free(b.s);
    return rc;
}

static int split_behavior(const char *s, int *out, pt_err *err) {
    static const char *names[] = {"isolated", "removed", "mergedwithprevious", "mergedwithnext",
                                  "contiguous"};
    for (int i = 0; s && i < (int)PT_ARRAY_LEN(names); i++)
        if (!strcasecmp(s, names[i])) return *out = i, 0;
    return pt_fail(err, "Split behavior \"%.40s\" is not known", s ? s : "(none)");
}

static int add_matcher(pt_tokenizer *t, const char *regex, pt_err *err) {
    tok_pre *p = add_pre(t, PRE_SPLIT);
    p->invert = true; /* the words are the matches */
    return tok_regex_compile(regex, strlen(regex), &p->re, err);
}

static int parse_metaspace(pt_tokenizer *t, const json_t *j, pt_err *err) {
    tok_pre *p = add_pre(t, PRE_METASPACE);
    const json_t *r = json_object_get(j, "replacement");
    if (json_is_string(r))
        p->repl = jdup(r, &p->repl_len);
    else
        p->repl = pt_xstrdup("\xe2\x96\x81"), p->repl_len = 3;
    const char *scheme = jstr(j, "prepend_scheme");
    if (!scheme)
        p->prepend = jbool(j, "add_prefix_space", true) ? PREPEND_ALWAYS : PREPEND_NEVER;
    else if (!strcmp(scheme, "always"))
        p->prepend = PREPEND_ALWAYS;
    else if (!strcmp(scheme, "first"))
        p->prepend = PREPEND_FIRST;
    else if (!strcmp(scheme, "never"))
        p->prepend = PREPEND_NEVER;
    else
        return pt_fail(err, "Metaspace prepend_scheme \"%.40s\" is not known", scheme);
    p->split = jbool(j, "split", true);
    return 0;
}

#define PUNCT "\\p{P}\\x{21}-\\x{2F}\\x{3A}-\\x{40}\\x{5B}-\\x{60}\\x{7B}-\\x{7E}"

static int parse_pre(pt_tokenizer *t, const json_t *j, int depth, pt_err *err) {
    if (!j || json_is_null(j)) return 0;
    const char *type = jstr(j, "type");
    if (!type) return pt_fail(err, "pre-tokenizer without a type");
    if (depth > TOK_MAX_DEPTH) return pt_fail(err, "pre-tokenizers nested too deeply");
    if (!strcmp(type, "Sequence")) {
        const json_t *list = json_object_get(j, "pretokenizers"), *v;
        size_t i;
        if (!json_is_array(list)) return pt_fail(err, "Sequence pre-tokenizer without a list");
        json_array_foreach(list, i, v) {
            if (parse_pre(t, v, depth + 1, err)) return -1;
        }
        return 0;
    }
    if (!strcmp(type, "Split")) {
        tok_pre *p = add_pre(t, PRE_SPLIT);
        const json_t *lit;
        p->invert = jbool(j, "invert", false);
        if (split_behavior(jstr(j, "behavior"), &p->behavior, err) ||
            parse_pattern(json_object_get(j, "pattern"), &lit, &p->re, err))
            return -1;
        return lit ? literal_regex(lit, &p->re, err) : 0;
    }
    if (!strcmp(type, "ByteLevel")) {
        tok_pre *p = add_pre(t, PRE_BYTE_LEVEL);
        p->prefix = jbool(j, "add_prefix_space", true);
        t->byte_level = true;
        if (jbool(j, "use_regex", true))
            return tok_regex_compile(tok_gpt2_regex, strlen(tok_gpt2_regex), &p->re, err);
        return 0;
    }
    if (!strcmp(type, "Metaspace")) return parse_metaspace(t, j, err);
    if (!strcmp(type, "Whitespace")) return add_matcher(t, "\\w+|[^\\w\\s]+", err);
    if (!strcmp(type, "WhitespaceSplit")) return add_matcher(t, "\\S+", err);
    if (!strcmp(type, "Digits"))
        return add_matcher(t, jbool(j, "individual_digits", false) ? "[^\\d]+|\\d" : "[^\\d]+|\\d+",
                           err);
    if (!strcmp(type, "Punctuation")) return add_matcher(t, "[^" PUNCT "]+|[" PUNCT "]+", err);
    return pt_fail(err, "pre-tokenizer \"%.40s\" is not supported", type);
}

/* ---- post-processor: what add_special puts around the text ---- */

static int push_special(pt_tokenizer *t, tok_ids *to, const json_t *name, const json_t *table,
                        pt_err *err) {
    const json_t *entry = json_object_get(table, json_string_value(name));
    const json_t *ids = json_object_get(entry, "ids"), *v;
    size_t i;
    if (json_is_array(ids)) {
        json_array_foreach(ids, i, v) {
            json_int_t id = json_integer_value(v);
            if (!json_is_integer(v) || id < 0 || id >= t->n_vocab)
                return pt_fail(err, "post_processor: special token \"%.40s\" has a bad id",
                               json_string_value(name));
            tok_ids_push(to, (int32_t)id);
        }
        return 0;
    }
    int32_t id = lookup_json(t, name);
    if (id < 0)
        return pt_fail(err, "post_processor: special token \"%.40s\" is not in the vocabulary",
                       json_string_value(name));
    tok_ids_push(to, id);
    return 0;
}

static int parse_template(pt_tokenizer *t, const json_t *j, pt_err *err) {
    const json_t *single = json_object_get(j, "single"), *item;
    const json_t *table = json_object_get(j, "special_tokens");
    if (!json_is_array(single)) return pt_fail(err, "TemplateProcessing without \"single\"");
    t->has_template = true;
    t->prefix.n = t->suffix.n = 0;
    bool after = false;
    size_t i;
    json_array_foreach(single, i, item) {
        const json_t *sp = json_object_get(item, "SpecialToken");
        if (json_object_get(item, "Sequence")) {
            after = true;
        } else if (json_is_object(sp) && json_is_string(json_object_get(sp, "id"))) {
            if (push_special(t, after ? &t->suffix : &t->prefix, json_object_get(sp, "id"), table,
                             err))
                return -1;
        } else {
            return pt_fail(err, "TemplateProcessing item %zu is not understood", i);
        }
    }
    return 0;
}

/* Bert/RobertaProcessing: "cls": [text, id], "sep": [text, id]. */
static int parse_bert(pt_tokenizer *t, const json_t *j, pt_err *err) {
    const json_t *cls = json_array_get(json_object_get(j, "cls"), 1);
    const json_t *sep = json_array_get(json_object_get(j, "sep"), 1);
    if (!json_is_integer(cls) || !json_is_integer(sep) || json_integer_value(cls) < 0 ||
        json_integer_value(cls) >= t->n_vocab || json_integer_value(sep) < 0 ||
        json_integer_value(sep) >= t->n_vocab)
        return pt_fail(err, "post_processor: bad cls/sep tokens");
    t->has_template = true;
    t->prefix.n = t->suffix.n = 0;
    tok_ids_push(&t->prefix, (int32_t)json_integer_value(cls));
    tok_ids_push(&t->suffix, (int32_t)json_integer_value(sep));
    return 0;
}

static int parse_post(pt_tokenizer *t, const json_t *j, int depth, pt_err *err) {
    if (!j || json_is_null(j)) return 0;
    const char *type = jstr(j, "type");
    if (!type) return pt_fail(err, "post_processor without a type");
    if (depth > TOK_MAX_DEPTH) return pt_fail(err, "post_processors nested too deeply");
    if (!strcmp(type, "TemplateProcessing")) return parse_template(t, j, err);
    if (!strcmp(type, "ByteLevel")) return 0;
    if (!strcmp(type, "BertProcessing") || !strcmp(type, "RobertaProcessing"))
        return parse_bert(t, j, err);
    if (!strcmp(type, "Sequence")) {
        const json_t *list = json_object_get(j, "processors"), *v;
        size_t i;
        if (!json_is_array(list)) return pt_fail(err, "Sequence post_processor without a list");
        json_array_foreach(list, i, v) {
            if (parse_post(t, v, depth + 1, err)) return -1;
        }
        return 0;
    }
    return pt_fail(err, "post_processor \"%.40s\" is not supported", type);
}

/* ---- decoder: how tokens turn back into text ---- */

typedef struct decoder_info {
    bool byte_level, byte_fallback, strip_first;
    char *from, *to; /* first Replace / Metaspace */
} decoder_info;

static void set_replace(decoder_info *d, const char *from, size_t from_len, const char *to,
                        size_t to_len) {
    if (d->from || !from_len) return;
    d->from = pt_xmalloc(from_len + 1);
    memcpy(d->from, from, from_len);
    d->from[from_len] = 0;
    d->to = pt_xmalloc(to_len + 1);
    memcpy(d->to, to, to_len);
    d->to[to_len] = 0;
}

static int parse_decoder(const json_t *j, int depth, decoder_info *d, pt_err *err) {
    if (!j || json_is_null(j)) return 0;
    const char *type = jstr(j, "type");
    if (!type) return pt_fail(err, "decoder without a type");
    if (depth > TOK_MAX_DEPTH) return pt_fail(err, "decoders nested too deeply");
    if (!strcmp(type, "Sequence")) {
        const json_t *list = json_object_get(j, "decoders"), *v;
        size_t i;
        if (!json_is_array(list)) return pt_fail(err, "Sequence decoder without a list");
        json_array_foreach(list, i, v) {
            if (parse_decoder(v, depth + 1, d, err)) return -1;
        }
        return 0;
    }
    if (!strcmp(type, "ByteLevel")) return d->byte_level = true, 0;
    if (!strcmp(type, "ByteFallback")) return d->byte_fallback = true, 0;
    if (!strcmp(type, "Fuse")) return 0;
    if (!strcmp(type, "Strip")) {
        const char *c = jstr(j, "content");
        const json_t *start = json_object_get(j, "start");
        if (c && !strcmp(c, " ") && json_integer_value(start) > 0) d->strip_first = true;
        return 0;
    }
    if (!strcmp(type, "Replace")) {
        const json_t *s = json_object_get(json_object_get(j, "pattern"), "String");
        const json_t *c = json_object_get(j, "content");
        if (!json_is_string(s) || !json_is_string(c))
            return pt_fail(err, "Replace decoder: only string patterns are supported");
        set_replace(d, json_string_value(s), json_string_length(s), json_string_value(c),
                    json_string_length(c));
        return 0;
    }
    if (!strcmp(type, "Metaspace")) {
        const json_t *r = json_object_get(j, "replacement");
        const char *repl = json_is_string(r) ? json_string_value(r) : "\xe2\x96\x81";
        set_replace(d, repl, strlen(repl), " ", 1);
        const char *scheme = jstr(j, "prepend_scheme");
        d->strip_first = scheme ? strcmp(scheme, "never") != 0 : jbool(j, "add_prefix_space", true);
        return 0;
    }
    return pt_fail(err, "decoder \"%.40s\" is not supported", type);
}

static int load_decoder(pt_tokenizer *t, const json_t *j, pt_err *err) {
    decoder_info d = {0};
    int rc = parse_decoder(j, 0, &d, err);
    if (!rc) {
        if (d.byte_fallback) /* <0xNN> pieces of the model decode to their byte */
            for (int id = 0; id < t->n_vocab; id++)
                if (t->tokens[id].type == TOK_NORMAL &&
                    tok_byte_token_value(t->tokens[id].text, t->tokens[id].len) >= 0)
                    t->tokens[id].type = TOK_BYTE;
        t->strip_first_space = d.strip_first;
        tok_decode_cfg cfg = {d.byte_level, d.from, d.to, !d.byte_level};
        tok_build_decode_table(t, &cfg);
    }
    free(d.from);
    free(d.to);
    return rc;
}

/* ---- tokenizer_config.json ---- */

static void load_config(pt_tokenizer *t, const json_t *config) {
    t->bos = lookup_json(t, token_name(config, "bos_token"));
    t->eos = lookup_json(t, token_name(config, "eos_token"));
    if (t->unk < 0) t->unk = lookup_json(t, token_name(config, "unk_token"));
    t->add_bos = jbool(config, "add_bos_token", false) && t->bos >= 0;
    t->add_eos = jbool(config, "add_eos_token", false) && t->eos >= 0;
    if (t->has_template) { /* the template decides; it may still name the bos */
        if (t->bos < 0 && t->prefix.n) t->bos = t->prefix.v[0];
        t->add_bos = t->prefix.n && t->prefix.v[0] == t->bos;
        return;
    }
    if (t->add_bos) tok_ids_push(&t->prefix, t->bos);
    if (t->add_eos) tok_ids_push(&t->suffix, t->eos);
}

int tok_json_load(pt_tokenizer *t, json_t *root, const json_t *config, pt_err *err) {
    if (!json_is_object(root)) return pt_fail(err, "the top level is not an object");
    const json_t *model = json_object_get(root, "model");
    if (!json_is_object(model)) return pt_fail(err, "there is no \"model\" object");
    const char *type = jstr(model, "type");
    if (type ? strcmp(type, "BPE") != 0 : !json_object_get(model, "merges"))
        return pt_fail(err, "model type \"%.40s\" is not supported (only BPE)",
                       type ? type : "(none)");
    t->model = TOK_MODEL_BPE;
    if (load_vocab(t, model, json_object_get(root, "added_tokens"), err) ||
        load_merges(t, model, err) || load_model_options(t, model, err) ||
        parse_norm(t, json_object_get(root, "normalizer"), 0, err) ||
        parse_pre(t, json_object_get(root, "pre_tokenizer"), 0, err) ||
        parse_post(t, json_object_get(root, "post_processor"), 0, err) ||
        load_decoder(t, json_object_get(root, "decoder"), err))
        return -1;
    load_config(t, config);
    tok_bpe_finish(t);
    tok_mark_eog_by_name(t);
    return 0;
}
