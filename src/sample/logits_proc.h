/*
 * logits_proc.h - logits processors: the stages that change a row of
 * logits before a token is picked (logit bias, repetition penalties, and
 * later grammar masks), behind one small interface.
 *
 * A processor sees every token the sequence accepts (prompt and generated)
 * and can forget the last n of them again, so speculative decoding can
 * roll a request back after rejected drafts and preemption can resume it:
 *
 *     apply(l)      edit the logits of the next position;
 *     accept(id)    id is now part of the sequence;
 *     rollback(n)   forget the last n accepted tokens (n may exceed what
 *                   was accepted: then forget everything);
 *     free()        release the processor;
 *     forced(out)   optional (NULL: none): the tokens that must come next
 *                   whatever the model says (a grammar with one way on),
 *                   for jump-forward; they are verified like drafts.
 *
 * Edits go through pt_logits_set, which remembers the raw value of each
 * entry it overwrites so the sampler can report logprobs of the model's own
 * distribution, or pt_logits_mask, which needs no record because a masked
 * token is never chosen.  max_writes bounds the pt_logits_set calls of one
 * apply, so the record can be sized before sampling.
 */
#ifndef PETREL_LOGITS_PROC_H
#define PETREL_LOGITS_PROC_H

#include "sample/sampler.h"

/* One row of logits being edited, with the record of raw values. */
typedef struct pt_logits {
    float *v;
    int n_vocab;
    bool record;       /* keep raw values (logprobs are wanted) */
    int32_t *saved_id; /* [cap] entries written, first write first */
    float *saved_raw;
    int n_saved, cap;
} pt_logits;

static inline void pt_logits_set(pt_logits *l, int32_t id, float x) {
    if (l->record && l->n_saved < l->cap) {
        l->saved_id[l->n_saved] = id;
        l->saved_raw[l->n_saved++] = l->v[id];
    }
    l->v[id] = x;
}

/* Sets every token whose bit is clear in allowed (n_vocab bits) to -inf. */
void pt_logits_mask(pt_logits *l, const uint32_t *allowed);

/* The unmodified logit of id: its first recorded value, if any. */
float pt_logits_raw(const pt_logits *l, int32_t id);

typedef struct pt_logits_proc_ops {
    const char *name;
    int (*max_writes)(const void *self);
    void (*apply)(void *self, pt_logits *l);
    void (*accept)(void *self, int32_t id);
    void (*rollback)(void *self, int n);
    void (*free)(void *self);
    int (*forced)(void *self, int32_t *out, int cap);
} pt_logits_proc_ops;

typedef struct pt_logits_proc {
    const pt_logits_proc_ops *ops;
    void *self;
} pt_logits_proc;

/* OpenAI's logit_bias: adds values[i] to ids[i]'s logit.  Ids outside
 * [0, n_vocab) are dropped. */
pt_logits_proc pt_bias_proc_new(const int32_t *ids, const float *values, int n, int n_vocab);

/* CTRL's repetition penalty and OpenAI's frequency and presence penalties
 * over the last `window` accepted tokens (window < 0: all of them). */
pt_logits_proc pt_penalty_proc_new(const pt_sampling *p, int n_vocab);

#endif
