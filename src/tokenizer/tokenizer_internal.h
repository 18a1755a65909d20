/*
 * tokenizer_internal.h - the concrete pt_tokenizer, shared by the files of
 * src/tokenizer/ and by nothing else.
 *
 * One structure serves every tokenizer we load.  A vocabulary is a table of
 * tokens (their text as the file spells it, and the bytes each decodes to);
 * a hash map finds a token by its text.  Added tokens ("<|im_start|>",
 * "<start_of_turn>", user-defined pieces) are matched in the raw text by a
 * trie before anything else runs.  Then one of two models encodes the plain
 * text between them:
 *
 *   TOK_MODEL_SPM  llama.cpp's SentencePiece-style merge by score (GGUF
 *                  tokenizer.ggml.model = "llama"), in spm.c;
 *   TOK_MODEL_BPE  BPE merges by rank, byte-level (GPT-2 alphabet) or over
 *                  code points with <0xNN> byte fallback, in bpe.c; fed by
 *                  the normalizers and pre-tokenizers of tok_pretok.c.
 *
 * Both models share the merge engine of tok_merge.c: a linked list of
 * symbols and a binary heap of candidate pairs, cheapest first, ties to the
 * leftmost pair.  Files: tokenizer.c (public API, dispatch, added-token
 * splitting), tok_vocab.c (arena, maps, trie), tokenizer_json.c (HF
 * tokenizer.json), tok_gguf.c (GGUF vocabulary keys), spm.c and bpe.c
 * (models and their GGUF settings), tok_pretok.c, tok_merge.c, tok_detok.c
 * (decoding, UTF-8 repair).  docs/tokenizer.md has the whole story.
 *
 * A loaded tokenizer is immutable: pt_tokenize keeps its scratch state on
 * the caller's stack and heap, so one tokenizer serves many threads.
 */
#ifndef PETREL_TOKENIZER_INTERNAL_H
#define PETREL_TOKENIZER_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "io/gguf.h"
#include "tokenizer/tokenizer.h"

/* Token types, numbered as GGUF's tokenizer.ggml.token_type. */
enum {
    TOK_NORMAL = 1,
    TOK_UNKNOWN = 2,
    TOK_CONTROL = 3,
    TOK_USER = 4, /* user-defined: matched in text even without parse_special */
    TOK_UNUSED = 5,
    TOK_BYTE = 6,
};

enum { TOK_MODEL_SPM = 1, TOK_MODEL_BPE = 2 };

/* Limits on what an untrusted file may ask of us. */
#define TOK_MAX_VOCAB (1 << 24)
#define TOK_MAX_DEPTH 8 /* nesting of Sequence normalizers/pre-tokenizers */

typedef struct tok_token {
    const char *text; /* as in the vocabulary, NUL-terminated, in the arena */
    const char *bytes; /* what the token decodes to (pt_token_bytes) */
    uint32_t len, n_bytes;
    float score;
    uint8_t type;
    bool special; /* skipped by the detokenizer when skip_special */
} tok_token;

/* ---- small containers (tok_vocab.c) ---- */

typedef struct tok_arena {
    char **chunks;
    size_t n_chunks;
    char *cur;
    size_t left;
} tok_arena;
char *tok_arena_dup(tok_arena *a, const char *s, size_t n); /* NUL-terminated copy */
void tok_arena_free(tok_arena *a);

typedef struct tok_buf {
    char *s;
    size_t n, cap;
} tok_buf;
void tok_buf_put(tok_buf *b, const void *p, size_t n);
static inline void tok_buf_putc(tok_buf *b, char c) { tok_buf_put(b, &c, 1); }

typedef struct tok_ids {
    int32_t *v;
    size_t n, cap;
} tok_ids;
void tok_ids_push(tok_ids *a, int32_t id);

uint64_t tok_hash(const void *p, size_t n);

/* Text -> token id.  Keys are the token texts themselves. */
typedef struct tok_strmap {
    int32_t *slots; /* token id, -1 = empty */
    size_t mask;
} tok_strmap;

/* A BPE merge: (left id, right id) -> rank and result id. */
typedef struct tok_pair {
    uint64_t key; /* UINT64_MAX = empty */
    int32_t rank, result;
} tok_pair;
typedef struct tok_pairmap {
    tok_pair *slots;
    size_t mask, n;
} tok_pairmap;
void tok_pairmap_put(tok_pairmap *m, int32_t a, int32_t b, int32_t rank, int32_t result);
const tok_pair *tok_pairmap_get(const tok_pairmap *m, int32_t a, int32_t b);

/* Added tokens and the trie that finds them in text. */
typedef struct tok_added {
    int32_t id;
    bool special; /* matched only when parse_special */
    bool lstrip, rstrip;
} tok_added;

typedef struct tok_trie_edge {
    uint64_t key; /* node * 256 + byte + 1; 0 = empty */
    uint32_t child;
} tok_trie_edge;
typedef struct tok_trie {
    int32_t *term; /* per node: index into added[], or -1 */
    uint32_t n_nodes, cap_nodes;
    tok_trie_edge *edges;
    size_t edge_mask, n_edges;
} tok_trie;

/* ---- normalizers and pre-tokenizers (tok_pretok.c) ---- */

enum {
    NORM_NFC,
    NORM_NFD,
    NORM_NFKC,
    NORM_NFKD,
    NORM_REPLACE,
    NORM_PREPEND,
    NORM_STRIP,
    NORM_LOWERCASE,
    NORM_STRIP_ACCENTS,
};

typedef struct tok_norm {
    int kind;
    pcre2_code *re;   /* REPLACE with a regex */
    char *pat, *with; /* REPLACE: literal pattern, content; PREPEND: with */
    size_t pat_len, with_len;
    bool left, right; /* STRIP */
} tok_norm;

enum { SPLIT_ISOLATED, SPLIT_REMOVED, SPLIT_PREV, SPLIT_NEXT, SPLIT_CONTIGUOUS };
enum { PRE_SPLIT, PRE_BYTE_LEVEL, PRE_METASPACE };
enum { PREPEND_ALWAYS, PREPEND_FIRST, PREPEND_NEVER };

typedef struct tok_pre {
    int kind;
    pcre2_code *re;   /* SPLIT; BYTE_LEVEL with use_regex */
    int behavior;     /* SPLIT_* */
    bool invert;      /* SPLIT: keep only the matches */
    bool prefix;      /* BYTE_LEVEL add_prefix_space */
    char *repl;       /* METASPACE replacement (usually "▁") */
    size_t repl_len;
    int prepend;      /* METASPACE PREPEND_* */
    bool split;       /* METASPACE split on the replacement */
} tok_pre;

/* ---- the tokenizer ---- */

struct pt_tokenizer {
    int model; /* TOK_MODEL_* */
    int n_vocab;
    tok_token *tokens;
    tok_arena arena;
    tok_strmap map;

    int32_t bos, eos, unk;
    bool add_bos, add_eos;     /* for add_special, unless a template says */
    tok_ids prefix, suffix;    /* add_special from a TemplateProcessing */
    bool has_template;
    uint8_t *eog;              /* n_vocab flags */

    tok_added *added;
    int n_added;
    tok_trie trie;

    /* SPM */
    bool add_space_prefix;
    int32_t byte_ids[256]; /* <0xNN> tokens, -1 if absent (SPM, byte fallback) */

    /* BPE */
    tok_pairmap merges;
    bool byte_level;    /* text bytes map through the GPT-2 alphabet */
    bool byte_fallback; /* unknown pieces become <0xNN> tokens */
    bool ignore_merges; /* a pre-token in the vocabulary is taken whole */
    bool fuse_unk;
    int32_t byte_sym[256]; /* byte-level: the token of each single byte */
    tok_norm *norms;
    int n_norms;
    tok_pre *pres;
    int n_pres;

    /* decoding */
    bool strip_first_space; /* see pt_detok.at_start */
};

/* tok_vocab.c */
int tok_alloc_vocab(pt_tokenizer *t, int64_t n, pt_err *err);
void tok_strmap_build(pt_tokenizer *t);
int32_t tok_strmap_get(const pt_tokenizer *t, const char *s, size_t n);
void tok_trie_build(pt_tokenizer *t);
/* Longest added token at text[i..n) allowed under parse_special: its index
 * in t->added, or -1; *len gets its length. */
int tok_trie_match(const pt_tokenizer *t, const char *text, size_t n, bool parse_special,
                   size_t *len);
void tok_set_eog(pt_tokenizer *t, int32_t id);
void tok_mark_eog_by_name(pt_tokenizer *t);

/* tok_merge.c: the merge engine shared by SPM and BPE. */
typedef struct tok_sym {
    int32_t off, len; /* bytes of the word; len 0 = merged away */
    int32_t id;       /* token, or -1 if the piece is not in the vocabulary */
    int32_t prev, next;
} tok_sym;
typedef struct tok_cand {
    double cost; /* lower merges first */
    int32_t left, right, size, id;
} tok_cand;
typedef struct tok_work {
    tok_sym *syms;
    size_t n_syms, cap_syms;
    tok_cand *heap;
    size_t n_heap, cap_heap;
    tok_buf tmp;
} tok_work;
/* Looks up the merge of two adjacent symbols: true with its cost and id. */
typedef bool (*tok_pair_fn)(const pt_tokenizer *t, const char *word, const tok_sym *l,
                            const tok_sym *r, double *cost, int32_t *id);
void tok_sym_push(tok_work *w, int32_t off, int32_t len, int32_t id);
void tok_merge(const pt_tokenizer *t, const char *word, tok_work *w, tok_pair_fn pair);
void tok_work_free(tok_work *w);

/* spm.c */
int tok_spm_load_gguf(pt_tokenizer *t, const pt_gguf *g, pt_err *err);
void tok_spm_encode(const pt_tokenizer *t, const char *text, size_t n, bool space_prefix,
                    tok_work *w, tok_ids *out);

/* bpe.c */
int tok_bpe_load_gguf(pt_tokenizer *t, const pt_gguf *g, pt_err *err);
void tok_bpe_word(const pt_tokenizer *t, const char *word, size_t n, tok_work *w,
                  tok_ids *out);
void tok_bpe_fuse_unk(const pt_tokenizer *t, tok_ids *out, size_t from);
void tok_bpe_finish(pt_tokenizer *t); /* byte_sym, byte_ids */
void tok_byte_to_unicode(uint8_t b, char out[3], size_t *n);
int tok_unicode_to_byte(uint32_t cp); /* -1 if not in the GPT-2 alphabet */

/* tok_pretok.c */
int tok_regex_compile(const char *pattern, size_t len, pcre2_code **out, pt_err *err);
extern const char tok_gpt2_regex[];
extern const char tok_llama3_regex[];
extern const char tok_qwen2_regex[];
/* Applies the normalizers: out gets the normalized text. */
int tok_normalize(const pt_tokenizer *t, const char *s, size_t n, tok_buf *out, pt_err *err);
/* Splits text into words: offsets into words->s are in spans (pairs). */
typedef struct tok_words {
    tok_buf text;
    size_t *spans; /* 2 per word: offset, length */
    size_t n, cap;
} tok_words;
int tok_pretokenize(const pt_tokenizer *t, const char *s, size_t n, int section,
                    tok_words *out, pt_err *err);
void tok_words_free(tok_words *w);
void tok_pretok_free(pt_tokenizer *t);
/* ECMAScript trimStart/trimEnd: bytes of leading white space; length
 * without the trailing white space. */
size_t tok_js_trim_left(const char *s, size_t n);
size_t tok_js_trim_right(const char *s, size_t n);

/* tokenizer_json.c */
int tok_json_load(pt_tokenizer *t, json_t *root, const json_t *config, pt_err *err);

/* tok_gguf.c: what GGUF vocabularies of every model type share. */
int tok_gguf_vocab(pt_tokenizer *t, const pt_gguf *g, bool spm, pt_err *err);

/* tok_detok.c */
typedef struct tok_decode_cfg {
    bool byte_level;      /* normal tokens go through the GPT-2 inverse map */
    const char *from, *to; /* else: replace from with to (e.g. "▁" -> " ") */
    bool replace_added;   /* ... in added tokens too (HF decoders do) */
} tok_decode_cfg;
void tok_build_decode_table(pt_tokenizer *t, const tok_decode_cfg *cfg);
/* Replaces invalid UTF-8 with U+FFFD (WHATWG: one per maximal subpart). */
void tok_utf8_sanitize(const char *s, size_t n, tok_buf *out);
bool tok_utf8_valid(const char *s, size_t n);
/* Length of the UTF-8 sequence starting with byte c, as llama.cpp counts. */
static inline int tok_utf8_len(uint8_t c) {
    static const uint8_t lens[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return lens[c >> 4];
}
size_t tok_utf8_encode(uint32_t cp, char *out);
/* Decodes one character; invalid bytes give U+FFFD and their length. */
size_t tok_utf8_decode(const char *s, size_t n, uint32_t *cp);
int tok_byte_token_value(const char *s, size_t n); /* "<0xNN>" -> NN, else -1 */

#endif
