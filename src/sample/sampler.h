/*
 * sampler.h - from logits to the next token.
 *
 * A chain of small stages, applied in this order: logits processors
 * (logits_proc.h): logit bias, then repetition / frequency / presence
 * penalties over the tokens seen so far (bias first, as llama.cpp and vLLM
 * do), then any the caller added (grammar masks); then either greedy argmax
 * (temperature 0) or
 * temperature -> top-k -> top-p -> min-p -> a draw from the seeded RNG.
 * Logprobs are always of the model's raw distribution (log-softmax of the
 * unmodified logits), as OpenAI reports them.
 */
#ifndef PETREL_SAMPLER_H
#define PETREL_SAMPLER_H

#include "base/base.h"

typedef struct pt_sampling {
    float temperature;        /* 0 = greedy */
    int top_k;                /* 0 = off */
    float top_p;              /* 1 = off */
    float min_p;              /* 0 = off */
    float repetition_penalty; /* 1 = off (CTRL-style: divide positive logits) */
    float frequency_penalty;  /* 0 = off (OpenAI) */
    float presence_penalty;   /* 0 = off (OpenAI) */
    int penalty_last_n;       /* window for the penalties; -1 = whole history */
    uint64_t seed;
    int n_logprobs; /* top alternatives to report, 0..20; -1 = none at all
                       (then result.logprob is 0 and no logprob work is done) */
} pt_sampling;

/* Defaults: temperature 1, everything else off, seed 0. */
pt_sampling pt_sampling_default(void);

typedef struct pt_logprob {
    int32_t id;
    float logprob;
} pt_logprob;

typedef struct pt_sample_result {
    int32_t id;
    float logprob;       /* of the chosen token, raw distribution */
    int n_top;           /* entries in top[] */
    pt_logprob top[20];  /* most likely tokens, descending */
} pt_sample_result;

typedef struct pt_sampler pt_sampler;

/* params is copied.  NULL if n_vocab < 1.  Allocates everything sampling
 * will need, sized by which stages params turns on. */
pt_sampler *pt_sampler_new(const pt_sampling *params, int n_vocab);
void pt_sampler_free(pt_sampler *s);
/* Records a token as part of the history (prompt or generated) the
 * penalties look at.  A no-op when all penalties are off. */
void pt_sampler_accept(pt_sampler *s, int32_t id);
/* Forgets the last n accepted tokens in every processor (speculative
 * drafts rejected).  The RNG is not rewound. */
void pt_sampler_rollback(pt_sampler *s, int n);
/* Forgets the history and reseeds the RNG: the sampler is as new (the bias
 * is kept). */
void pt_sampler_reset(pt_sampler *s);
/* Sets the logit bias (OpenAI `logit_bias`): n pairs of token id and a value
 * added to that token's logit after the penalties.  Replaces any earlier
 * bias; n = 0 clears it.  Ids outside [0, n_vocab) are ignored (the API
 * layer rejects them); -100 effectively bans a token. */
void pt_sampler_set_bias(pt_sampler *s, const int32_t *ids, const float *values, int n);
/* Appends a logits processor (logits_proc.h), applied after the bias and
 * the penalties; the sampler owns it from now on. */
struct pt_logits_proc;
void pt_sampler_add_proc(pt_sampler *s, struct pt_logits_proc p);
/* Jump-forward: tokens the processors say must come next (the first
 * processor that forces any), at most cap; 0 if none is forced. */
int pt_sampler_forced(pt_sampler *s, int32_t *out, int cap);
/* Picks the next token.  logits [n_vocab] are modified in place (penalties
 * and bias are applied there; temperature is not).  Never allocates. */
void pt_sampler_sample(pt_sampler *s, float *logits, pt_sample_result *out);

/* Whether pt_sampler_sample picks the plain argmax of the logits it is
 * given (greedy, no logprobs, and no processor that edits them: no bias,
 * penalty or grammar), so that an argmax taken elsewhere (on the GPU,
 * pt_model_can_argmax) is exactly its pick, and pt_sampler_verify's. */
bool pt_sampler_is_argmax(const pt_sampler *s);

/* Speculative verification: like pt_sampler_sample at a position where a
 * drafter proposed `draft` (with certainty: n-gram, predicted outputs).
 * Greedy: the argmax, accepted if it is the draft.  Sampling: the draft
 * is accepted with its probability under the sampler's distribution p,
 * else the token is drawn from p without the draft, so out->id is
 * distributed exactly as pt_sampler_sample's would be. */
void pt_sampler_verify(pt_sampler *s, float *logits, int32_t draft, pt_sample_result *out,
                       bool *accepted);

#endif
