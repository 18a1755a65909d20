/*
 * draft.h - drafters for speculative decoding: cheap guesses of the next
 * tokens, which the target model then verifies in one forward (core.c).
 *
 * A drafter only proposes; correctness never depends on it.  Greedy
 * output is token-identical whatever it proposes, and sampled output keeps
 * the target's distribution (pt_sampler_verify).  Only speed depends on
 * how often its guesses are right.
 */
#ifndef PETREL_DRAFT_H
#define PETREL_DRAFT_H

#include "engine/engine.h"

/* Prompt lookup: for n from n_max down to n_min, finds the last n tokens
 * of hist in `extra` (a Predicted Output, searched first: the occurrence
 * ending nearest to index `at`, where the output so far would end if it
 * followed the prediction) or earlier in hist itself (latest first), and
 * proposes up to k tokens that followed there.  Returns how many it wrote
 * to out. */
int pt_draft_ngram(const int32_t *hist, int n_hist, const int32_t *extra, int n_extra, int at,
                   int n_min, int n_max, int k, int32_t *out);

/* The oracle (for benchmarks): the next k tokens of `truth` from index
 * `at`, each replaced with probability 1 - accept by another token. */
int pt_draft_oracle(const int32_t *truth, int n_truth, int at, float accept, int n_vocab, int k,
                    pt_rng *rng, int32_t *out);

#endif
