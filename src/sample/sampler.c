/*
 * sampler.c - the sampler chain: logits processors (logit bias, penalties,
 * and any the caller adds: logits_proc.h), then greedy argmax or
 * temperature / top-k / top-p / min-p and a seeded draw.
 *
 * Everything a call to pt_sampler_sample() needs is allocated by
 * pt_sampler_new() (or grown by pt_sampler_accept() / pt_sampler_set_bias()
 * / pt_sampler_add_proc()), so sampling itself never allocates.  The costs per call are:
 *
 *   greedy, no logprobs      one pass over the vocabulary (argmax)
 *   logprobs                 two more passes over the raw logits
 *   penalties                O(window) for the distinct tokens in the window
 *   random, no filters       one exp pass plus one walk for the draw
 *   top-k                    one pass, mostly a compare per token
 *   top-p                    without top-k, the best 256 gathered as for
 *                            top-k; if the nucleus is larger, a quickselect
 *                            on mass, O(vocab) expected; either way a heap
 *                            popped once per token for the last few
 *   min-p                    one pass over the surviving candidates
 *
 * No stage sorts the whole vocabulary.  Tokens are ranked by logit, and
 * equal logits by the lower id, so greedy, top-k, top-p and the logprob
 * alternatives all break ties the same way.
 *
 * docs/sampling.md gives the exact semantics of each stage and the reference
 * implementations (llama.cpp, vLLM, OpenAI) they follow.
 */
#include "sample/sampler.h"

#include "sample/logits_proc.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>

#define PT_MAX_LOGPROBS ((int)PT_ARRAY_LEN(((pt_sample_result *)0)->top))
#define PT_GREEDY_TEMPERATURE 1e-5f

struct pt_sampler {
    pt_sampling p; /* sanitized copy of the caller's parameters */
    int n_vocab;
    bool greedy;   /* temperature <= 1e-5: argmax, filters ignored */
    pt_rng rng;

    /* The processors, applied in order: the bias (slot 0, a no-op until
     * set), the penalties when any is on, then the caller's. */
    pt_logits_proc *procs;
    int n_procs;
    int bias_slot, penalty_slot; /* -1 when absent */

    /* The edit record of the current call: raw values of the logits the
     * processors overwrote, so the chosen token's logprob is of the
     * unmodified distribution.  Sized by the processors' max_writes. */
    pt_logits edit;

    /* Work space of the random path, [n_vocab] each: candidate ids and
     * their unnormalized probabilities (indexed by token id). */
    int32_t *ids;
    float *w;
};

pt_sampling pt_sampling_default(void) {
    return (pt_sampling){
        .temperature = 1.0f,
        .top_k = 0,
        .top_p = 1.0f,
        .min_p = 0.0f,
        .repetition_penalty = 1.0f,
        .frequency_penalty = 0.0f,
        .presence_penalty = 0.0f,
        .penalty_last_n = -1,
        .seed = 0,
        .n_logprobs = -1,
    };
}

/* ------------------------------------------------------------------------
 * Construction and history
 * ---------------------------------------------------------------------- */

/* Makes room in the edit record for every write the processors may make. */
static void ensure_record(pt_sampler *s) {
    int need = 0;
    for (int i = 0; i < s->n_procs; i++) need += s->procs[i].ops->max_writes(s->procs[i].self);
    if (s->edit.cap >= need) return;
    need = PT_MAX(need, 2 * s->edit.cap);
    s->edit.saved_id = pt_xrealloc(s->edit.saved_id, (size_t)need * sizeof(int32_t));
    s->edit.saved_raw = pt_xrealloc(s->edit.saved_raw, (size_t)need * sizeof(float));
    s->edit.cap = need;
}

static int add_proc(pt_sampler *s, pt_logits_proc p) {
    s->procs = pt_xrealloc(s->procs, sizeof *s->procs * (size_t)(s->n_procs + 1));
    s->procs[s->n_procs] = p;
    return s->n_procs++;
}

/* Replaces values the sampler cannot use with the "off" value, so the
 * stages below need no checks of their own. */
static void sanitize(pt_sampling *p) {
    if (!(p->repetition_penalty > 0.0f)) p->repetition_penalty = 1.0f;
    if (p->n_logprobs < -1) p->n_logprobs = -1;
    if (p->n_logprobs > PT_MAX_LOGPROBS) p->n_logprobs = PT_MAX_LOGPROBS;
}

pt_sampler *pt_sampler_new(const pt_sampling *params, int n_vocab) {
    if (n_vocab < 1) return NULL;
    pt_sampler *s = pt_xcalloc(1, sizeof(*s));
    s->p = params ? *params : pt_sampling_default();
    sanitize(&s->p);
    s->n_vocab = n_vocab;
    s->greedy = !(s->p.temperature > PT_GREEDY_TEMPERATURE);
    s->edit.n_vocab = n_vocab;
    s->bias_slot = add_proc(s, pt_bias_proc_new(NULL, NULL, 0, n_vocab));
    bool penalize = s->p.penalty_last_n != 0 &&
                    (s->p.repetition_penalty != 1.0f || s->p.frequency_penalty != 0.0f ||
                     s->p.presence_penalty != 0.0f);
    s->penalty_slot = penalize ? add_proc(s, pt_penalty_proc_new(&s->p, n_vocab)) : -1;
    if (!s->greedy) {
        s->ids = pt_xmalloc((size_t)n_vocab * sizeof(*s->ids));
        s->w = pt_xmalloc((size_t)n_vocab * sizeof(*s->w));
    }
    pt_rng_seed(&s->rng, s->p.seed);
    return s;
}

void pt_sampler_free(pt_sampler *s) {
    if (!s) return;
    for (int i = 0; i < s->n_procs; i++) s->procs[i].ops->free(s->procs[i].self);
    free(s->procs);
    free(s->edit.saved_id);
    free(s->edit.saved_raw);
    free(s->ids);
    free(s->w);
    free(s);
}

/* The bias is always slot 0 (a no-op with no entries: max_writes 0);
 * penalties and the caller's processors come after it. */
bool pt_sampler_is_argmax(const pt_sampler *s) {
    return s->greedy && s->p.n_logprobs < 0 && s->n_procs == 1 &&
           s->procs[0].ops->max_writes(s->procs[0].self) == 0;
}

void pt_sampler_accept(pt_sampler *s, int32_t id) {
    for (int i = 0; i < s->n_procs; i++) s->procs[i].ops->accept(s->procs[i].self, id);
    ensure_record(s);
}

int pt_sampler_forced(pt_sampler *s, int32_t *out, int cap) {
    for (int i = 0; i < s->n_procs; i++) {
        if (!s->procs[i].ops->forced) continue;
        int n = s->procs[i].ops->forced(s->procs[i].self, out, cap);
        if (n > 0) return n;
    }
    return 0;
}

void pt_sampler_rollback(pt_sampler *s, int n) {
    for (int i = 0; i < s->n_procs; i++) s->procs[i].ops->rollback(s->procs[i].self, n);
}

void pt_sampler_reset(pt_sampler *s) {
    pt_sampler_rollback(s, INT_MAX);
    pt_rng_seed(&s->rng, s->p.seed);
}

void pt_sampler_set_bias(pt_sampler *s, const int32_t *ids, const float *values, int n) {
    pt_logits_proc *b = &s->procs[s->bias_slot];
    b->ops->free(b->self);
    *b = pt_bias_proc_new(ids, values, PT_MAX(n, 0), s->n_vocab);
    ensure_record(s);
}

void pt_sampler_add_proc(pt_sampler *s, pt_logits_proc p) {
    add_proc(s, p);
    ensure_record(s);
}

/* ------------------------------------------------------------------------
 * Ranking
 * ---------------------------------------------------------------------- */

/* The highest logit; the lowest id among equals.  NaN never wins, and a
 * vocabulary of nothing but -inf and NaN gives id 0. */
static int32_t argmax(const float *logits, int n) {
    int32_t best = 0;
    float max = -INFINITY;
    for (int i = 0; i < n; i++) {
        if (logits[i] > max) {
            max = logits[i];
            best = i;
        }
    }
    return best;
}

/* Does token a rank above token b?  Higher logit first, lower id on ties. */
static inline bool ranks_above(const float *logits, int32_t a, int32_t b) {
    float la = logits[a], lb = logits[b];
    return la > lb || (la == lb && a < b);
}

/* Binary heaps of token ids: the best token on top, or the worst. */
enum { BEST_ON_TOP, WORST_ON_TOP };

static inline bool heap_above(const float *logits, int32_t a, int32_t b, int order) {
    return order == BEST_ON_TOP ? ranks_above(logits, a, b) : ranks_above(logits, b, a);
}

static void sift_down(int32_t *h, int n, int i, const float *logits, int order) {
    int32_t x = h[i];
    for (;;) {
        int c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && heap_above(logits, h[c + 1], h[c], order)) c++;
        if (!heap_above(logits, h[c], x, order)) break;
        h[i] = h[c];
        i = c;
    }
    h[i] = x;
}

static void heap_build(int32_t *h, int n, const float *logits, int order) {
    for (int i = n / 2 - 1; i >= 0; i--)
        sift_down(h, n, i, logits, order);
}

/* Moves the best of the heap h[0..n) to h[n-1]; the heap is then h[0..n-1).
 * Popping m times leaves the m best in h[n-m..n), best last. */
static void heap_pop(int32_t *h, int n, const float *logits) {
    int32_t top = h[0];
    h[0] = h[n - 1];
    h[n - 1] = top;
    sift_down(h, n - 1, 0, logits, BEST_ON_TOP);
}

/* ------------------------------------------------------------------------
 * Random sampling.  The candidates are always s->ids[lo..n), in no
 * particular order; w[id] holds their unnormalized probabilities.
 * ---------------------------------------------------------------------- */

/* top-p without top-k first looks in the best PT_NUCLEUS_PROBE tokens:
 * real next-token distributions put 0.9-0.95 of their mass in far fewer.
 * Quickselect finishes with a heap once a region is PT_NUCLEUS_SMALL tokens,
 * or after PT_NUCLEUS_ROUNDS rounds of bad pivots. */
#define PT_NUCLEUS_PROBE 256
#define PT_NUCLEUS_SMALL 64
#define PT_NUCLEUS_ROUNDS 64

/* w[id] = exp((logit - max) / T) for each candidate; returns their sum.
 * The best token gets exactly 1. */
static double weigh(pt_sampler *s, const float *logits, int lo, float max, float inv_t) {
    double sum = 0.0;
    for (int i = s->n_vocab - 1; i >= lo; i--) {
        int32_t id = s->ids[i];
        s->w[id] = expf((logits[id] - max) * inv_t);
        sum += s->w[id];
    }
    return sum;
}

/* Gathers the k best tokens of the vocabulary (k < n_vocab), unordered,
 * into ids[n-k..n) and returns n-k.  One pass keeps the best k seen so far
 * in a heap with the worst on top, so most tokens cost one comparison with
 * it (an equal logit never displaces the lower id already held). */
static int select_best(pt_sampler *s, const float *logits, int k) {
    int n = s->n_vocab;
    int32_t *h = s->ids + (n - k);
    for (int i = 0; i < k; i++)
        h[i] = i;
    heap_build(h, k, logits, WORST_ON_TOP);
    float worst = logits[h[0]];
    for (int i = k; i < n; i++) {
        if (!(logits[i] > worst)) continue;
        h[0] = i;
        sift_down(h, k, 0, logits, WORST_ON_TOP);
        worst = logits[h[0]];
    }
    return n - k;
}

static inline void swap_ids(int32_t *ids, int i, int j) {
    int32_t t = ids[i];
    ids[i] = ids[j];
    ids[j] = t;
}

/* Ranks ids[a..b) by popping a heap of them until `kept` plus the popped
 * mass reaches target.  The popped tokens end up in ids[j..b), best last;
 * returns j, or -1 if all of them fall short.  *mass is kept plus what was
 * popped. */
static int pop_nucleus(pt_sampler *s, const float *logits, int a, int b, double kept, double target,
                       double *mass) {
    int32_t *h = s->ids + a;
    int j = b - a;
    heap_build(h, j, logits, BEST_ON_TOP);
    while (j > 0) {
        heap_pop(h, j, logits);
        j--;
        kept += s->w[h[j]];
        if (kept >= target) break;
    }
    *mass = kept;
    return kept >= target ? a + j : -1;
}

/* Splits ids[a..b) around the median of its first, middle and last token:
 * returns m with the pivot at ids[m], the tokens ranked below it in
 * ids[a..m) and those above in ids[m+1..b); *above is their mass. */
static int partition(pt_sampler *s, const float *logits, int a, int b, double *above) {
    int32_t *ids = s->ids;
    int mid = a + (b - a) / 2, last = b - 1, m = a;
    if (ranks_above(logits, ids[a], ids[mid])) swap_ids(ids, a, mid);
    if (ranks_above(logits, ids[mid], ids[last])) swap_ids(ids, mid, last);
    if (ranks_above(logits, ids[a], ids[mid])) swap_ids(ids, a, mid);
    swap_ids(ids, mid, last);
    int32_t pivot = ids[last];
    double up = 0.0;
    for (int i = a; i < last; i++) {
        if (ranks_above(logits, pivot, ids[i]))
            swap_ids(ids, i, m++);
        else
            up += s->w[ids[i]];
    }
    swap_ids(ids, m, last);
    *above = up;
    return m;
}

/* The nucleus of the candidates ids[lo..n), by quickselect on mass: the
 * undecided tokens are ids[a..b), all ranked below the kept ones in
 * ids[b..n).  Each round either drops a pivot and everything below it, or
 * keeps a pivot and everything above it, so expected work is O(n).
 * Returns the new lo; *mass is the nucleus's mass. */
static int select_nucleus(pt_sampler *s, const float *logits, int lo, double target, double *mass) {
    int a = lo, b = s->n_vocab;
    double kept = 0.0, above;
    for (int round = 0; b - a > PT_NUCLEUS_SMALL && round < PT_NUCLEUS_ROUNDS; round++) {
        int m = partition(s, logits, a, b, &above);
        if (kept + above >= target) {
            a = m + 1; /* the nucleus lies above the pivot */
            continue;
        }
        kept += above + s->w[s->ids[m]];
        if (kept >= target) {
            *mass = kept;
            return m;
        }
        b = m; /* the pivot and all above it are in */
    }
    int j = pop_nucleus(s, logits, a, b, kept, target, mass);
    return j >= 0 ? j : a; /* short only by rounding: keep them all */
}

/* top-p: the smallest set of best tokens whose probability reaches top_p
 * (at least one token).  *sum is the candidates' mass in, the nucleus's
 * out.  lo is 0 exactly when top-k did not run; then the best
 * PT_NUCLEUS_PROBE tokens are tried first. */
static int keep_nucleus(pt_sampler *s, const float *logits, int lo, double *sum) {
    int n = s->n_vocab;
    double target = (double)s->p.top_p * *sum;
    if (lo == 0 && PT_NUCLEUS_PROBE <= n / 4) {
        int a = select_best(s, logits, PT_NUCLEUS_PROBE);
        int j = pop_nucleus(s, logits, a, n, 0.0, target, sum);
        if (j >= 0) return j;
        for (int i = a; i < n; i++)
            s->ids[i] = i; /* undo the probe */
    }
    return select_nucleus(s, logits, lo, target, sum);
}

/* min-p: keep tokens with p >= min_p * p_max, i.e. w >= min_p since the
 * best has w = 1 (which also keeps it for any min_p). */
static int keep_min_p(pt_sampler *s, int lo, double *sum) {
    float thr = PT_MIN(s->p.min_p, 1.0f);
    int j = s->n_vocab;
    double kept = 0.0;
    for (int i = s->n_vocab - 1; i >= lo; i--) {
        int32_t id = s->ids[i];
        if (s->w[id] >= thr) {
            s->ids[--j] = id;
            kept += s->w[id];
        }
    }
    *sum = kept;
    return j;
}

/* One uniform draw over the candidates in proportion to w.  Falls back to
 * the best token if rounding (or a NaN logit) leaves the walk short. */
static int32_t draw(pt_sampler *s, int lo, double sum, int32_t best) {
    double u = pt_rng_uniform(&s->rng) * sum, cum = 0.0;
    for (int i = s->n_vocab - 1; i >= lo; i--) {
        cum += s->w[s->ids[i]];
        if (u < cum) return s->ids[i];
    }
    return best;
}

/* The sampler's distribution p: temperature, then top-k, top-p and min-p
 * leave the candidates s->ids[*lo..n) with weights w[id] summing to *sum.
 * Returns false (and the argmax in *best) when the logits are not finite:
 * then there is nothing to weigh. */
static bool candidates(pt_sampler *s, const float *logits, int *lo, double *sum, int32_t *best) {
    const pt_sampling *p = &s->p;
    int n = s->n_vocab;
    *best = argmax(logits, n);
    float max = logits[*best];
    if (!isfinite(max)) return false;
    *lo = 0;
    if (p->top_k > 0 && p->top_k < n)
        *lo = select_best(s, logits, p->top_k);
    else
        for (int i = 0; i < n; i++)
            s->ids[i] = i;
    *sum = weigh(s, logits, *lo, max, 1.0f / p->temperature);
    if (p->top_p < 1.0f) *lo = keep_nucleus(s, logits, *lo, sum);
    if (p->min_p > 0.0f) *lo = keep_min_p(s, *lo, sum);
    return true;
}

/* temperature -> top-k -> top-p -> min-p -> draw.  Every call consumes
 * exactly one number from the RNG, so streams stay aligned across calls
 * whatever the filters keep. */
static int32_t sample_random(pt_sampler *s, const float *logits) {
    int lo;
    double sum;
    int32_t best;
    if (!candidates(s, logits, &lo, &sum, &best)) {
        pt_rng_next(&s->rng);
        return best;
    }
    return draw(s, lo, sum, best);
}

/* Speculative verification at one position, the drafter's distribution q
 * a point mass on `draft`: accept it with probability min(1, p/q) = p(draft),
 * else draw from the normalized residual max(0, p - q), which is p without
 * the draft.  The emitted token is then distributed exactly as p (the
 * rejection-sampling lemma).  Two numbers come from the RNG. */
static int32_t verify_random(pt_sampler *s, const float *logits, int32_t draft, bool *accepted) {
    int n = s->n_vocab, lo;
    double sum;
    int32_t best;
    *accepted = false;
    if (!candidates(s, logits, &lo, &sum, &best)) {
        pt_rng_next(&s->rng);
        *accepted = best == draft;
        return best;
    }
    double pd = 0.0;
    for (int i = lo; i < n && draft >= 0; i++)
        if (s->ids[i] == draft) pd = s->w[draft];
    if (pt_rng_uniform(&s->rng) * sum < pd) {
        *accepted = true;
        return draft;
    }
    if (pd > 0.0) {
        s->w[draft] = 0.0f; /* the residual */
        sum -= pd;
    }
    int32_t heaviest = -1; /* what rounding falls back to: never the draft */
    for (int i = lo; i < n; i++)
        if (s->ids[i] != draft && (heaviest < 0 || s->w[s->ids[i]] > s->w[heaviest]))
            heaviest = s->ids[i];
    if (heaviest < 0 || !(sum > 0.0)) return best; /* p was the draft alone: unreachable */
    return draw(s, lo, sum, heaviest);
}

/* ------------------------------------------------------------------------
 * Logprobs and the entry point
 * ---------------------------------------------------------------------- */

/* Inserts (id, x) into top[0..cnt), kept descending with at most `want`
 * entries; x must rank above the last entry when the list is full.  Equal
 * logits keep the earlier (lower) id first.  Returns the new count. */
static int top_insert(pt_logprob *top, int cnt, int want, int32_t id, float x) {
    int j = cnt < want ? cnt++ : want - 1;
    while (j > 0 && x > top[j - 1].logprob) {
        top[j] = top[j - 1];
        j--;
    }
    top[j] = (pt_logprob){id, x};
    return cnt;
}

/* Log-softmax statistics of the raw logits: returns log(sum exp(logit)),
 * computed as max + log(sum exp(logit - max)) with a double sum, and fills
 * out->top with the n_logprobs best tokens and their logprobs. */
static double raw_logprobs(const pt_sampler *s, const float *logits, pt_sample_result *out) {
    int want = s->p.n_logprobs, cnt = 0;
    float max = -INFINITY;
    for (int i = 0; i < s->n_vocab; i++) {
        float x = logits[i];
        if (x > max) max = x;
        if (want > 0 && (cnt < want || x > out->top[cnt - 1].logprob))
            cnt = top_insert(out->top, cnt, want, i, x);
    }
    /* n_vocab >= 1 and the max contributes exp(0) = 1, so sum >= 1 for
     * finite logits; NaN or infinite logits give NaN logprobs. */
    double sum = 0.0;
    for (int i = 0; i < s->n_vocab; i++)
        sum += expf(logits[i] - max);
    double lse = (double)max + log(sum);
    for (int k = 0; k < cnt; k++)
        out->top[k].logprob = (float)(out->top[k].logprob - lse);
    out->n_top = cnt;
    return lse;
}

void pt_sampler_verify(pt_sampler *s, float *logits, int32_t draft, pt_sample_result *out,
                       bool *accepted) {
    bool want_logprobs = s->p.n_logprobs >= 0;
    double lse = 0.0;
    out->n_top = 0;
    out->logprob = 0.0f;
    if (want_logprobs) lse = raw_logprobs(s, logits, out);
    s->edit.v = logits;
    s->edit.record = want_logprobs;
    s->edit.n_saved = 0;
    for (int i = 0; i < s->n_procs; i++) s->procs[i].ops->apply(s->procs[i].self, &s->edit);
    if (s->greedy) {
        out->id = argmax(logits, s->n_vocab);
        *accepted = out->id == draft;
    } else {
        out->id = verify_random(s, logits, draft, accepted);
    }
    if (want_logprobs) out->logprob = (float)(pt_logits_raw(&s->edit, out->id) - lse);
}

void pt_sampler_sample(pt_sampler *s, float *logits, pt_sample_result *out) {
    bool want_logprobs = s->p.n_logprobs >= 0;
    double lse = 0.0;
    out->n_top = 0;
    out->logprob = 0.0f;
    if (want_logprobs) lse = raw_logprobs(s, logits, out);
    /* bias before the penalties, as llama.cpp and vLLM do */
    s->edit.v = logits;
    s->edit.record = want_logprobs;
    s->edit.n_saved = 0;
    for (int i = 0; i < s->n_procs; i++) s->procs[i].ops->apply(s->procs[i].self, &s->edit);
    out->id = s->greedy ? argmax(logits, s->n_vocab) : sample_random(s, logits);
    if (want_logprobs) out->logprob = (float)(pt_logits_raw(&s->edit, out->id) - lse);
}
