/*
 * eval.h - model quality: perplexity over a text, and the KL divergence
 * between the next-token distributions of two models (or two
 * configurations of one model, e.g. f16 vs quantized KV) on the same text.
 *
 * Both slide a window of n_ctx tokens over the text with a stride of half
 * a window and score each token once, in the second half of a window (so
 * every scored token sees at least n_ctx/2 tokens of context, as
 * llama.cpp's perplexity does), except in the first window, where every
 * token after the first is scored.
 */
#ifndef PETREL_EVAL_H
#define PETREL_EVAL_H

#include "engine/engine.h"

typedef struct pt_eval_result {
    int n_scored;
    double nll_mean;       /* mean negative log-likelihood (nats) */
    double ppl;            /* exp(nll_mean) */
    double kl_mean, kl_p99, kl_max; /* KL only */
    double top1_agree;     /* KL only: fraction where both argmaxes agree */
} pt_eval_result;

typedef void (*pt_eval_progress)(void *user, int done, int total);

/* Perplexity of e's model on tokens. */
int pt_eval_ppl(pt_engine *e, const int32_t *tokens, int n, int n_ctx, pt_eval_progress cb,
                void *user, pt_eval_result *out, pt_err *err);
/* KL(P_a || P_b) per scored position; the models must share a vocabulary. */
int pt_eval_kl(pt_engine *a, pt_engine *b, const int32_t *tokens, int n, int n_ctx,
               pt_eval_progress cb, void *user, pt_eval_result *out, pt_err *err);

#endif
