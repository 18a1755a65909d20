/*
 * logits_proc.c - the edit record, and the bias and penalty processors.
 *
 * The penalty processor keeps the whole accepted history (4 bytes a token)
 * rather than a ring of the window, so that rollback can bring back the
 * tokens that re-enter the window; counts[] always holds how often each id
 * occurs among the last `window` of them.
 */
#include "sample/logits_proc.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>

void pt_logits_mask(pt_logits *l, const uint32_t *allowed) {
    for (int i = 0; i < l->n_vocab; i++)
        if (!(allowed[i >> 5] >> (i & 31) & 1)) l->v[i] = -INFINITY;
}

float pt_logits_raw(const pt_logits *l, int32_t id) {
    for (int i = 0; i < l->n_saved; i++)
        if (l->saved_id[i] == id) return l->saved_raw[i];
    return l->v[id];
}

/* ---- logit bias --------------------------------------------------------- */

typedef struct bias {
    int32_t *id;
    float *val;
    int n;
} bias;

static int bias_max_writes(const void *self) {
    return ((const bias *)self)->n;
}

static void bias_apply(void *self, pt_logits *l) {
    const bias *b = self;
    for (int i = 0; i < b->n; i++) pt_logits_set(l, b->id[i], l->v[b->id[i]] + b->val[i]);
}

static void stateless_accept(void *self, int32_t id) {
    (void)self, (void)id;
}

static void stateless_rollback(void *self, int n) {
    (void)self, (void)n;
}

static void bias_free(void *self) {
    bias *b = self;
    free(b->id);
    free(b->val);
    free(b);
}

static const pt_logits_proc_ops bias_ops = {"logit_bias", bias_max_writes, bias_apply,
                                            stateless_accept, stateless_rollback, bias_free, NULL};

pt_logits_proc pt_bias_proc_new(const int32_t *ids, const float *values, int n, int n_vocab) {
    bias *b = pt_xcalloc(1, sizeof *b);
    b->id = pt_xmalloc(sizeof(int32_t) * (size_t)PT_MAX(n, 1));
    b->val = pt_xmalloc(sizeof(float) * (size_t)PT_MAX(n, 1));
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= n_vocab) continue;
        b->id[b->n] = ids[i];
        b->val[b->n++] = values[i];
    }
    return (pt_logits_proc){&bias_ops, b};
}

/* ---- penalties ------------------------------------------------------------ */

typedef struct penalty {
    float repetition, frequency, presence;
    int window, n_vocab;
    int32_t *hist; /* every accepted id, oldest first */
    int len, cap;
    int32_t *counts; /* [n_vocab] occurrences among the last window */
} penalty;

static int first_in_window(const penalty *p) {
    return p->len > p->window ? p->len - p->window : 0;
}

static int penalty_max_writes(const void *self) {
    const penalty *p = self;
    return p->len - first_in_window(p);
}

/* One distinct token of the window, seen `count` times: CTRL's repetition
 * penalty (divide a positive logit, multiply a negative one), then OpenAI's
 * frequency and presence penalties. */
static float penalized(const penalty *p, float x, int count) {
    if (p->repetition != 1.0f) x = x > 0.0f ? x / p->repetition : x * p->repetition;
    return x - (float)count * p->frequency - p->presence;
}

/* Penalizes each distinct token of the window once.  A token's count is
 * negated once it is done, so later copies of it are skipped; a second
 * pass restores the counts. */
static void penalty_apply(void *self, pt_logits *l) {
    penalty *p = self;
    int first = first_in_window(p);
    for (int i = first; i < p->len; i++) {
        int32_t id = p->hist[i];
        int count = p->counts[id];
        if (count <= 0) continue;
        pt_logits_set(l, id, penalized(p, l->v[id], count));
        p->counts[id] = -count;
    }
    for (int i = first; i < p->len; i++)
        if (p->counts[p->hist[i]] < 0) p->counts[p->hist[i]] = -p->counts[p->hist[i]];
}

static void penalty_accept(void *self, int32_t id) {
    penalty *p = self;
    if (id < 0 || id >= p->n_vocab) return;
    if (p->len == p->cap) {
        p->cap = p->cap ? 2 * p->cap : 64;
        p->hist = pt_xrealloc(p->hist, sizeof(int32_t) * (size_t)p->cap);
    }
    p->hist[p->len++] = id;
    p->counts[id]++;
    if (p->len > p->window) p->counts[p->hist[p->len - 1 - p->window]]--;
}

static void penalty_rollback(void *self, int n) {
    penalty *p = self;
    for (; n > 0 && p->len > 0; n--) {
        p->counts[p->hist[--p->len]]--;
        if (p->len >= p->window) p->counts[p->hist[p->len - p->window]]++;
    }
}

static void penalty_free(void *self) {
    penalty *p = self;
    free(p->hist);
    free(p->counts);
    free(p);
}

static const pt_logits_proc_ops penalty_ops = {"penalties", penalty_max_writes, penalty_apply,
                                               penalty_accept, penalty_rollback, penalty_free, NULL};

pt_logits_proc pt_penalty_proc_new(const pt_sampling *s, int n_vocab) {
    penalty *p = pt_xcalloc(1, sizeof *p);
    p->repetition = s->repetition_penalty > 0.0f ? s->repetition_penalty : 1.0f;
    p->frequency = s->frequency_penalty;
    p->presence = s->presence_penalty;
    p->window = s->penalty_last_n < 0 ? INT_MAX : s->penalty_last_n;
    p->n_vocab = n_vocab;
    p->counts = pt_xcalloc((size_t)n_vocab, sizeof(int32_t));
    return (pt_logits_proc){&penalty_ops, p};
}
