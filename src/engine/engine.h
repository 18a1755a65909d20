/*
 * engine.h - a model with its tokenizer and KV cache, and the generation
 * loop over one sequence.
 *
 * pt_seq is one conversation's state: its pages in the KV cache, its
 * sampler, and the tokens so far.  pt_generate() drives one sequence from
 * prompt to a stop condition through the engine core (core.h), the same
 * loop the server's scheduler drives many through, streaming each token to
 * a callback.
 */
#ifndef PETREL_ENGINE_H
#define PETREL_ENGINE_H

#include "model/model.h"
#include "sample/sampler.h"
#include "tokenizer/tokenizer.h"

/* Recurrent-state snapshots a hybrid model's prefix cache keeps (kvcache.h):
 * each costs one sequence's state (pt_kv_state_bytes). */
#define PT_ENGINE_STATE_SNAPS 8

typedef struct pt_engine_opts {
    const char *model_path;
    const char *device;  /* "cpu" (default) */
    int n_threads;       /* <= 0: one per core */
    const char *kernels; /* CPU kernels: "auto", "avx2", "portable" */
    int n_ctx;           /* positions per sequence; 0: min(model's, 4096) */
    const char *kv_budget; /* --kv-budget: pool size as bytes ("6G", "512M") or
                            * "N%" of free memory; NULL: n_ctx positions */
    pt_dtype kv_dtype;   /* PT_F32, PT_F16, PT_BF16 */
    const char *kv_quant; /* --kv-quant: NULL/"none", "8", "4", "turbo[:k<b>v<b>]" */
    bool no_tokenizer;    /* do not load one (callers that feed token ids) */
    bool no_prefix_cache; /* --prefix-cache off: never reuse KV pages across requests */
    const char *kv_disk;      /* --kv-disk DIR: the prefix cache's disk tier, or NULL */
    const char *kv_disk_size; /* --kv-disk-size SIZE (default: 8G or half the free space) */
    int max_batch;       /* rows per forward; 0: 512 */
    int max_seqs;        /* sequences at once, for a sliding-window model's KV window
                          * pool (kvcache.h); 0: unknown, the pool holds n_ctx */
    const char *dummy_dtype;
    uint64_t dummy_seed;
    /* --tensor-parallel N (docs/tensor-parallel.md): 0 one model, today's
     * path; N > 1 on the cpu the split model's reference forward; 1 on
     * cuda the forward through a one-rank NCCL communicator; N > 1 on
     * cuda needs N devices (and is not implemented yet). */
    int tensor_parallel;
} pt_engine_opts;

typedef struct pt_engine {
    pt_backend *be;
    pt_model *model;
    pt_tokenizer *tok; /* NULL for dummy weights */
    pt_kv_cache kv;
    pt_dtype kv_dtype;     /* the pool's format, kept for pt_engine_kv_init */
    pt_kvq_spec kv_quant;
    int n_ctx;
    int max_seqs;     /* pt_engine_opts.max_seqs, kept for pt_engine_kv_init */
    int kv_slack;     /* window positions kept for rollbacks across steps (a draft model's) */
    bool kv_budgeted; /* the pool was sized by --kv-budget, not by n_ctx */
    bool prefix_cache;   /* reuse full KV pages by content (core.c) */
    pt_disk *disk;       /* --kv-disk, or NULL */
    uint64_t cache_salt; /* everything besides tokens that decides a page's bytes */
    struct pt_runner *runner; /* for pt_seq_prefill / pt_seq_decode */
    struct pt_engine *draft; /* --draft-model (pt_engine_attach_draft), or NULL; owned */
    double load_seconds;
} pt_engine;

int pt_engine_open(pt_engine **out, const pt_engine_opts *opts, pt_err *err);
void pt_engine_close(pt_engine *e);

typedef struct pt_seq {
    pt_kv_seq kv;
    pt_sampler *sampler;
    int32_t *tokens; /* prompt then generated */
    int n_tokens, cap;
    int n_prompt;
} pt_seq;

void pt_seq_init(pt_seq *s, pt_engine *e, const pt_sampling *sp);
void pt_seq_free(pt_seq *s, pt_engine *e);
void pt_seq_push(pt_seq *s, int32_t id);

enum pt_finish { PT_FINISH_NONE, PT_FINISH_STOP, PT_FINISH_LENGTH, PT_FINISH_CANCEL };

enum pt_spec_kind { PT_SPEC_OFF, PT_SPEC_NGRAM, PT_SPEC_ORACLE, PT_SPEC_DRAFT };

/* Speculative decoding (draft.h): who proposes tokens for the target to
 * verify in one forward, and how many.  PT_SPEC_DRAFT needs the engine's
 * draft model (pt_engine_attach_draft); a Predicted Output, when given, is
 * searched first whatever the kind. */
typedef struct pt_spec_params {
    int kind;              /* enum pt_spec_kind */
    int k;                 /* drafts per step at most (adapted per sequence) */
    int ngram_min, ngram_max; /* suffix lengths the n-gram drafter matches */
    const int32_t *prediction; /* Predicted Outputs: searched first; copied when submitted */
    int n_prediction;
    /* PT_SPEC_ORACLE (bench): the target's own greedy continuation, each
     * token replaced by another with probability 1 - oracle_accept */
    const int32_t *oracle;
    int n_oracle;
    float oracle_accept;
    /* Jump-forward: where the grammar (a logits processor) admits one
     * continuation, its tokens go in as drafts, all computed in one
     * forward instead of one forward each.  Whatever the kind. */
    bool jump_forward;
} pt_spec_params;

typedef struct pt_gen_params {
    pt_sampling sampling;
    int max_tokens;  /* generated tokens at most */
    bool ignore_eos; /* keep going past end-of-generation tokens */
    pt_spec_params spec;
    /* extra logits processors, as pt_sched_job.add_procs (NULL: none) */
    void (*add_procs)(void *proc_arg, pt_sampler *s);
    void *proc_arg;
} pt_gen_params;

typedef struct pt_gen_stats {
    int n_prompt, n_generated;
    int n_cached; /* prompt positions reused from the prefix cache */
    int n_drafted, n_accepted; /* speculative tokens proposed / accepted */
    int n_forced;               /* tokens the grammar forced (jump-forward) */
    double t_prefill, t_decode; /* seconds */
    double ttft;                /* prompt in -> first token out, seconds */
    int finish;                 /* enum pt_finish */
} pt_gen_stats;

/* Called once per generated token with its text (possibly empty: bytes of
 * an incomplete UTF-8 character are held back).  Return nonzero to stop. */
typedef int (*pt_token_cb)(void *user, const pt_sample_result *tok, const char *text,
                           size_t len);

int pt_generate(pt_engine *e, const int32_t *prompt, int n_prompt, const pt_gen_params *p,
                pt_token_cb cb, void *user, pt_gen_stats *stats, pt_err *err);

/* Runs the prompt of s (all tokens not yet in the cache) and samples the
 * first token into *r. */
int pt_seq_prefill(pt_engine *e, pt_seq *s, pt_sample_result *r, pt_err *err);
/* Feeds the last token of s and samples the next into *r. */
int pt_seq_decode(pt_engine *e, pt_seq *s, pt_sample_result *r, pt_err *err);

/* Makes draft the drafter of `--spec draft` for e, which then owns it
 * (pt_engine_close closes both).  Refused, with the first difference
 * named, unless both models have the same vocabulary: the same size and,
 * where both have tokenizers, the same text for every token id. */
int pt_engine_attach_draft(pt_engine *e, pt_engine *draft, pt_err *err);

pt_dtype pt_parse_kv_dtype(const char *s); /* -1 if unknown */

/* Bytes of a --kv-budget value: "6G", "512M", "1.5G", "123456" (bytes) or
 * "N%" of free_bytes.  -1 with a message if it is not one. */
int pt_parse_budget(const char *s, size_t free_bytes, size_t *out, pt_err *err);

/* (Re)builds the KV pool for n_positions in the engine's format (dtype and
 * --kv-quant codec); the pool must hold no sequences. */
int pt_engine_kv_init(pt_engine *e, int n_positions, pt_err *err);

/* The salt of every KV page key: a fingerprint of the weights (tensor
 * names, types, shapes and samples of their bytes, or the dummy seed and
 * format), the configuration (rope included), the KV format and the page
 * size.  Two engines share cached pages only if their salts are equal. */
uint64_t pt_engine_cache_salt(const pt_engine *e, const char *dummy_dtype, uint64_t dummy_seed);

#endif
