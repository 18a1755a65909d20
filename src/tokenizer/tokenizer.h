/*
 * tokenizer.h - text <-> token ids.
 *
 * Two families: SentencePiece-style (GGUF "llama" vocab: pieces with scores,
 * "▁" for space, <0xNN> byte fallback) and byte-level BPE (tokenizer.json or
 * GGUF "gpt2" vocab: merges, a pre-tokenizer regex, the GPT-2 byte<->unicode
 * map).  Both share this interface; the concrete type is private.
 *
 * Decoding is streaming: pt_detok holds back an incomplete UTF-8 sequence so
 * that text handed to a user is always valid UTF-8, however the bytes split
 * across tokens.
 */
#ifndef PETREL_TOKENIZER_H
#define PETREL_TOKENIZER_H

#include "base/base.h"
#include "io/model_file.h"

typedef struct pt_tokenizer pt_tokenizer;

/* From the model: GGUF tokenizer.ggml.* keys, or the HF directory's
 * tokenizer.json + tokenizer_config.json. */
int pt_tokenizer_load(pt_tokenizer **out, const pt_model_file *mf, pt_err *err);
/* From the paths of a tokenizer.json and tokenizer_config.json (the config
 * may be NULL). */
int pt_tokenizer_load_json(pt_tokenizer **out, const char *tokenizer_json,
                           const char *tokenizer_config_json, pt_err *err);
/* From a parsed GGUF (tokenizer.ggml.model "llama" or "gpt2"). */
int pt_tokenizer_load_gguf(pt_tokenizer **out, const pt_gguf *g, pt_err *err);
/* From tokenizer.json text in memory (untrusted: any bytes give a result or
 * an error); config is the parsed tokenizer_config.json or NULL. */
int pt_tokenizer_load_json_mem(pt_tokenizer **out, const char *json, size_t len,
                               const json_t *config, pt_err *err);
void pt_tokenizer_free(pt_tokenizer *t);

int pt_tokenizer_n_vocab(const pt_tokenizer *t);
int32_t pt_tokenizer_bos(const pt_tokenizer *t); /* -1 if none */
int32_t pt_tokenizer_eos(const pt_tokenizer *t); /* -1 if none */
/* True for tokens that end generation (eos, eot, <|im_end|>, ...). */
bool pt_tokenizer_is_eog(const pt_tokenizer *t, int32_t id);
/* Whether encoding with add_special prepends BOS (from the model's config). */
bool pt_tokenizer_adds_bos(const pt_tokenizer *t);

/* Encodes text.  add_special: add BOS/EOS as the model's config says.
 * parse_special: text like "<|im_start|>" becomes the special token, else it
 * is tokenized as plain text.  *ids is malloc'd; caller frees. */
int pt_tokenize(const pt_tokenizer *t, const char *text, size_t len, bool add_special,
                bool parse_special, int32_t **ids, size_t *n_ids, pt_err *err);

/* The bytes this token decodes to on its own (special tokens: their text;
 * byte tokens: the byte).  Not NUL-terminated. */
const char *pt_token_bytes(const pt_tokenizer *t, int32_t id, size_t *len);
/* Looks up a token by its exact vocabulary string; -1 if absent. */
int32_t pt_token_lookup(const pt_tokenizer *t, const char *piece);
bool pt_token_is_special(const pt_tokenizer *t, int32_t id);

/* Streaming decoder. */
typedef struct pt_detok {
    const pt_tokenizer *tok;
    bool skip_special; /* drop control tokens (default true) */
    bool at_start;     /* the ids start a text: the first piece loses the
                          leading space the tokenizer added (SPM, Llama-2
                          style); false after pt_detok_init, as a continuation
                          keeps its space; pt_detokenize sets it */
    char pending[8];   /* incomplete UTF-8 tail */
    int n_pending;
} pt_detok;

void pt_detok_init(pt_detok *d, const pt_tokenizer *t);
/* Appends the text of token id to out (at most cap bytes; needs cap >= 64 +
 * the piece length) and returns the number of bytes written: only complete
 * UTF-8 characters. */
size_t pt_detok_push(pt_detok *d, int32_t id, char *out, size_t cap);
/* Bytes that can never form a character come out as U+FFFD at once, one per
 * maximal subpart (as WHATWG TextDecoder does). */
/* Flushes a trailing incomplete sequence as U+FFFD. */
size_t pt_detok_flush(pt_detok *d, char *out, size_t cap);

/* One-shot decode of ids into a malloc'd NUL-terminated string. */
char *pt_detokenize(const pt_tokenizer *t, const int32_t *ids, size_t n, bool skip_special);

#endif
