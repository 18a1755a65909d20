/*
 * test_sampler.c - the sampler chain against hand-computed expectations and
 * simple reference implementations written here in double precision.
 *
 * Distribution tests draw 20,000 tokens from a fixed seed and require every
 * drawn id to be in the expected set, every token expected 10 or more times
 * to be drawn, each frequency within 0.015 of its renormalized probability
 * (about 4 standard deviations at worst) and a chi-square statistic below
 * df + 6 sqrt(2 df) + 10 (p < 1e-5).  The seed is fixed, so the draws are
 * the same on every run: a pass is never a fluke of the RNG, and a wrong
 * renormalization (errors of 0.05 and more here) fails by a wide margin.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <math.h>
#include <stdlib.h>

#include "sample/sampler.h"

#define DRAWS 20000
#define MAX_TEST_VOCAB 4096

/* ------------------------------------------------------------------------
 * Helpers
 * ---------------------------------------------------------------------- */

static pt_sampling greedy_params(void) {
    pt_sampling p = pt_sampling_default();
    p.temperature = 0.0f;
    return p;
}

/* Samples once from a copy of logits; returns the id. */
static int32_t sample_once(pt_sampler *s, const float *logits, int n, pt_sample_result *res) {
    float buf[MAX_TEST_VOCAB];
    pt_sample_result tmp;
    assert_true(n <= MAX_TEST_VOCAB);
    memcpy(buf, logits, (size_t)n * sizeof(float));
    pt_sampler_sample(s, buf, res ? res : &tmp);
    int32_t id = res ? res->id : tmp.id;
    assert_true(id >= 0 && id < n);
    return id;
}

/* Runs greedy sampling with the given params and history over logits, and
 * returns the logits as the processors left them (in `logits`). */
static void process(pt_sampling p, const int32_t *hist, int n_hist, float *logits, int n) {
    pt_sampler *s = pt_sampler_new(&p, n);
    pt_sample_result r;
    assert_non_null(s);
    for (int i = 0; i < n_hist; i++)
        pt_sampler_accept(s, hist[i]);
    pt_sampler_sample(s, logits, &r);
    pt_sampler_free(s);
}

static void fill_log(float *logits, const double *probs, int n) {
    for (int i = 0; i < n; i++)
        logits[i] = (float)log(probs[i]);
}

/* Expected distribution after the filters: probs^(1/T) over the kept ids,
 * renormalized; 0 elsewhere. */
static void expected(const double *probs, int n, double temp, const int *keep, int n_keep,
                     double *out) {
    double sum = 0.0;
    for (int i = 0; i < n; i++)
        out[i] = 0.0;
    for (int k = 0; k < n_keep; k++) {
        out[keep[k]] = pow(probs[keep[k]], 1.0 / temp);
        sum += out[keep[k]];
    }
    for (int k = 0; k < n_keep; k++)
        out[keep[k]] /= sum;
}

/* Draws DRAWS tokens and checks them against the expected distribution. */
static void check_distribution(pt_sampling p, const float *logits, int n, const double *want) {
    int counts[MAX_TEST_VOCAB] = {0};
    pt_sampler *s = pt_sampler_new(&p, n);
    for (int i = 0; i < DRAWS; i++)
        counts[sample_once(s, logits, n, NULL)]++;
    pt_sampler_free(s);

    double chi2 = 0.0, max_dev = 0.0;
    int df = -1;
    for (int i = 0; i < n; i++) {
        if (want[i] == 0.0) {
            assert_int_equal(counts[i], 0);
            continue;
        }
        double e = want[i] * DRAWS, d = counts[i] - e;
        if (e >= 10.0) assert_true(counts[i] > 0);
        chi2 += d * d / e;
        df++;
        max_dev = fmax(max_dev, fabs(counts[i] / (double)DRAWS - want[i]));
    }
    assert_true(max_dev < 0.015);
    assert_true(chi2 < df + 6.0 * sqrt(2.0 * df) + 10.0);
}

/* Reference log-softmax in double. */
static void ref_log_softmax(const float *logits, int n, double *out) {
    double max = -INFINITY, sum = 0.0;
    for (int i = 0; i < n; i++)
        max = fmax(max, logits[i]);
    for (int i = 0; i < n; i++)
        sum += exp((double)logits[i] - max);
    for (int i = 0; i < n; i++)
        out[i] = (double)logits[i] - max - log(sum);
}

/* Ranking by logit descending, id ascending: qsort over ids in the tests. */
static const float *g_rank_logits;
static int cmp_rank(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    float lx = g_rank_logits[x], ly = g_rank_logits[y];
    if (lx != ly) return lx > ly ? -1 : 1;
    return x < y ? -1 : x > y;
}
static void ref_rank(const float *logits, int n, int32_t *ids) {
    for (int i = 0; i < n; i++)
        ids[i] = i;
    g_rank_logits = logits;
    qsort(ids, (size_t)n, sizeof(*ids), cmp_rank);
}

/* Roughly normal logits (sum of four uniforms), scale `scale`. */
static void random_logits(pt_rng *rng, float *logits, int n, double scale) {
    for (int i = 0; i < n; i++) {
        double x = 0.0;
        for (int k = 0; k < 4; k++)
            x += pt_rng_uniform(rng) - 0.5;
        logits[i] = (float)(x * scale);
    }
}

/* ------------------------------------------------------------------------
 * Defaults and greedy
 * ---------------------------------------------------------------------- */

static void test_defaults(void **state) {
    (void)state;
    pt_sampling p = pt_sampling_default();
    assert_true(p.temperature == 1.0f);
    assert_int_equal(p.top_k, 0);
    assert_true(p.top_p == 1.0f);
    assert_true(p.min_p == 0.0f);
    assert_true(p.repetition_penalty == 1.0f);
    assert_true(p.frequency_penalty == 0.0f && p.presence_penalty == 0.0f);
    assert_int_equal(p.seed, 0);
    assert_int_equal(p.n_logprobs, -1);
    assert_null(pt_sampler_new(&p, 0));
}

static void test_greedy_argmax_and_ties(void **state) {
    (void)state;
    const float logits[] = {0.5f, 2.0f, -1.0f, 2.0f, 1.9f};
    const float temps[] = {0.0f, 1e-6f, 1e-5f, -1.0f};
    for (size_t t = 0; t < 2 * PT_ARRAY_LEN(temps); t++) {
        pt_sampling p = greedy_params();
        p.temperature = temps[t / 2];
        p.seed = 1234 + t;
        if (t % 2) { /* filters are ignored when greedy */
            p.top_k = 3;
            p.top_p = 0.5f;
            p.min_p = 0.9f;
        }
        pt_sampler *s = pt_sampler_new(&p, 5);
        for (int i = 0; i < 50; i++)
            assert_int_equal(sample_once(s, logits, 5, NULL), 1);
        pt_sampler_free(s);
    }
    /* All equal: the lowest id.  -inf everywhere: id 0.  NaN never wins. */
    pt_sampling p = greedy_params();
    pt_sampler *s = pt_sampler_new(&p, 4);
    const float flat[] = {3.0f, 3.0f, 3.0f, 3.0f};
    const float dead[] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
    const float nan[] = {NAN, 1.0f, NAN, 2.0f};
    assert_int_equal(sample_once(s, flat, 4, NULL), 0);
    assert_int_equal(sample_once(s, dead, 4, NULL), 0);
    assert_int_equal(sample_once(s, nan, 4, NULL), 3);
    pt_sampler_free(s);
}

/* ------------------------------------------------------------------------
 * Penalties and bias: exact effect on a small vector
 * ---------------------------------------------------------------------- */

static const int32_t hist_112[] = {1, 1, 2};

static void test_repetition_penalty(void **state) {
    (void)state;
    pt_sampling p = greedy_params();
    p.repetition_penalty = 2.0f;
    float l[] = {1.0f, 2.0f, -2.0f, 3.0f, 0.0f};
    /* Token 1 (seen twice) is divided once, token 2 multiplied once. */
    process(p, hist_112, 3, l, 5);
    const float want[] = {1.0f, 1.0f, -4.0f, 3.0f, 0.0f};
    for (int i = 0; i < 5; i++)
        assert_true(l[i] == want[i]);
}

static void test_frequency_penalty(void **state) {
    (void)state;
    pt_sampling p = greedy_params();
    p.frequency_penalty = 0.5f;
    float l[] = {1.0f, 2.0f, -2.0f, 3.0f, 0.0f};
    process(p, hist_112, 3, l, 5);
    const float want[] = {1.0f, 1.0f, -2.5f, 3.0f, 0.0f};
    for (int i = 0; i < 5; i++)
        assert_true(l[i] == want[i]);
}

static void test_presence_penalty(void **state) {
    (void)state;
    pt_sampling p = greedy_params();
    p.presence_penalty = 0.75f;
    float l[] = {1.0f, 2.0f, -2.0f, 3.0f, 0.0f};
    process(p, hist_112, 3, l, 5);
    const float want[] = {1.0f, 1.25f, -2.75f, 3.0f, 0.0f};
    for (int i = 0; i < 5; i++)
        assert_true(l[i] == want[i]);
}

static void test_penalties_combined(void **state) {
    (void)state;
    pt_sampling p = greedy_params();
    p.repetition_penalty = 2.0f;
    p.frequency_penalty = 0.5f;
    p.presence_penalty = 0.25f;
    float l[] = {1.0f, 2.0f, -2.0f, 3.0f, 0.0f};
    /* Repetition first, then frequency and presence subtracted. */
    process(p, hist_112, 3, l, 5);
    const float want[] = {1.0f, 2.0f / 2 - 1.0f - 0.25f, -2.0f * 2 - 0.5f - 0.25f, 3.0f, 0.0f};
    for (int i = 0; i < 5; i++)
        assert_true(l[i] == want[i]);
    /* The penalty can change the greedy choice: 3 seen, 0 wins. */
    pt_sampling q = greedy_params();
    q.repetition_penalty = 4.0f;
    pt_sampler *s = pt_sampler_new(&q, 5);
    const float base[] = {1.0f, 2.0f, -2.0f, 3.0f, 0.0f};
    assert_int_equal(sample_once(s, base, 5, NULL), 3);
    pt_sampler_accept(s, 3);
    pt_sampler_accept(s, 1);
    assert_int_equal(sample_once(s, base, 5, NULL), 0);
    pt_sampler_free(s);
}

static void test_penalty_window(void **state) {
    (void)state;
    pt_sampling p = greedy_params();
    p.frequency_penalty = 1.0f;
    p.penalty_last_n = 2;
    pt_sampler *s = pt_sampler_new(&p, 5);
    const float base[] = {0.0f, 2.0f, -2.0f, 3.0f, 0.0f};
    float l[5];
    pt_sample_result r;
    const int32_t hist[] = {1, 1, 2, 3};
    for (int i = 0; i < 4; i++)
        pt_sampler_accept(s, hist[i]);
    /* Window {2, 3}: token 1 has left it. */
    memcpy(l, base, sizeof(l));
    pt_sampler_sample(s, l, &r);
    assert_true(l[1] == 2.0f && l[2] == -3.0f && l[3] == 2.0f);
    /* Window {3, 3}. */
    pt_sampler_accept(s, 3);
    memcpy(l, base, sizeof(l));
    pt_sampler_sample(s, l, &r);
    assert_true(l[1] == 2.0f && l[2] == -2.0f && l[3] == 1.0f);
    /* Reset forgets everything. */
    pt_sampler_reset(s);
    memcpy(l, base, sizeof(l));
    pt_sampler_sample(s, l, &r);
    for (int i = 0; i < 5; i++)
        assert_true(l[i] == base[i]);
    pt_sampler_free(s);

    /* 0 disables the penalties; -1 is the whole history. */
    p.penalty_last_n = 0;
    memcpy(l, base, sizeof(l));
    process(p, hist, 4, l, 5);
    for (int i = 0; i < 5; i++)
        assert_true(l[i] == base[i]);
    p.penalty_last_n = -1;
    memcpy(l, base, sizeof(l));
    process(p, hist, 4, l, 5);
    assert_true(l[1] == 0.0f && l[2] == -3.0f && l[3] == 2.0f);
}

static void test_long_history_ring(void **state) {
    (void)state;
    /* A window smaller than the history, crossing the buffer's growth and
     * wrapping many times, counts exactly what a direct count gives. */
    enum { N = 7, W = 100, H = 1000 };
    pt_sampling p = greedy_params();
    p.frequency_penalty = 1.0f;
    p.penalty_last_n = W;
    pt_sampler *s = pt_sampler_new(&p, N);
    int32_t hist[H];
    pt_rng rng;
    pt_rng_seed(&rng, 99);
    for (int i = 0; i < H; i++) {
        hist[i] = (int32_t)(pt_rng_next(&rng) % N);
        pt_sampler_accept(s, hist[i]);
    }
    int count[N] = {0};
    for (int i = H - W; i < H; i++)
        count[hist[i]]++;
    float l[N] = {0};
    pt_sample_result r;
    pt_sampler_sample(s, l, &r);
    for (int i = 0; i < N; i++)
        assert_true(l[i] == -(float)count[i]);
    pt_sampler_free(s);
}

static void test_logit_bias(void **state) {
    (void)state;
    pt_sampling p = greedy_params();
    p.repetition_penalty = 2.0f;
    pt_sampler *s = pt_sampler_new(&p, 5);
    const int32_t ids[] = {3, 0, 99, -1};
    const float vals[] = {1.0f, -100.0f, 5.0f, 5.0f}; /* the last two are out of range */
    pt_sampler_set_bias(s, ids, vals, 4);
    pt_sampler_accept(s, 3);
    float l[] = {4.5f, 1.0f, 0.0f, 4.0f, 2.5f};
    pt_sample_result r;
    pt_sampler_sample(s, l, &r);
    /* Bias before the penalty: (4 + 1) / 2 = 2.5 (not 4 / 2 + 1). */
    assert_true(l[3] == 2.5f);
    assert_true(l[0] == 4.5f - 100.0f);
    assert_int_equal(r.id, 3);
    /* Clearing the bias. */
    pt_sampler_set_bias(s, NULL, NULL, 0);
    float m[] = {4.5f, 1.0f, 0.0f, 4.0f, 2.5f};
    pt_sampler_sample(s, m, &r);
    assert_int_equal(r.id, 0);
    assert_true(m[0] == 4.5f && m[3] == 2.0f);
    pt_sampler_free(s);
}

/* ------------------------------------------------------------------------
 * Random sampling: filters and their distributions
 * ---------------------------------------------------------------------- */

static void test_top_k_one_is_greedy(void **state) {
    (void)state;
    enum { N = 16 };
    const float temps[] = {0.3f, 1.0f, 5.0f, 100.0f};
    pt_rng rng;
    pt_rng_seed(&rng, 5);
    for (int trial = 0; trial < 200; trial++) {
        float l[N];
        random_logits(&rng, l, N, 4.0);
        if (trial % 2) l[9] = l[4] = 50.0f; /* a tie at the top: 4 wins */
        pt_sampling g = greedy_params();
        pt_sampler *gs = pt_sampler_new(&g, N);
        int32_t want = sample_once(gs, l, N, NULL);
        pt_sampler_free(gs);
        if (trial % 2) assert_int_equal(want, 4);
        for (size_t t = 0; t < PT_ARRAY_LEN(temps); t++) {
            pt_sampling p = pt_sampling_default();
            p.temperature = temps[t];
            p.top_k = 1;
            p.seed = (uint64_t)trial;
            pt_sampler *s = pt_sampler_new(&p, N);
            for (int i = 0; i < 5; i++)
                assert_int_equal(sample_once(s, l, N, NULL), want);
            pt_sampler_free(s);
        }
    }
}

/* The distribution the filter tests share, in scrambled order. */
static const double probs6[] = {0.04, 0.25, 0.10, 0.40, 0.06, 0.15};

static void test_temperature(void **state) {
    (void)state;
    float l[6];
    double want[6];
    const int all[] = {0, 1, 2, 3, 4, 5};
    fill_log(l, probs6, 6);
    const double temps[] = {1.0, 0.5, 2.0};
    for (size_t t = 0; t < PT_ARRAY_LEN(temps); t++) {
        pt_sampling p = pt_sampling_default();
        p.temperature = (float)temps[t];
        p.seed = 11 + t;
        expected(probs6, 6, temps[t], all, 6, want);
        check_distribution(p, l, 6, want);
    }
}

static void test_top_k(void **state) {
    (void)state;
    float l[6];
    double want[6];
    const int keep[] = {3, 1, 5};
    fill_log(l, probs6, 6);
    pt_sampling p = pt_sampling_default();
    p.top_k = 3;
    p.temperature = 2.0f;
    p.seed = 21;
    expected(probs6, 6, 2.0, keep, 3, want);
    check_distribution(p, l, 6, want);
}

static void test_top_p(void **state) {
    (void)state;
    float l[6];
    double want[6];
    fill_log(l, probs6, 6);
    /* 0.40 + 0.25 = 0.65 < 0.75 <= 0.40 + 0.25 + 0.15. */
    const int keep[] = {3, 1, 5};
    pt_sampling p = pt_sampling_default();
    p.top_p = 0.75f;
    p.seed = 31;
    expected(probs6, 6, 1.0, keep, 3, want);
    check_distribution(p, l, 6, want);
    /* Below the best token's probability, and 0: the best alone. */
    const int best[] = {3};
    expected(probs6, 6, 1.0, best, 1, want);
    p.top_p = 0.3f;
    check_distribution(p, l, 6, want);
    p.top_p = 0.0f;
    check_distribution(p, l, 6, want);

    /* The cut inside a tie: three tokens of 0.2 after the best 0.3; top-p
     * 0.45 needs one of them, and the lowest id is the one kept. */
    const double tied[] = {0.1, 0.2, 0.3, 0.2, 0.2};
    const int keep_tied[] = {2, 1};
    fill_log(l, tied, 5);
    p.top_p = 0.45f;
    expected(tied, 5, 1.0, keep_tied, 2, want);
    check_distribution(p, l, 5, want);
}

static void test_top_k_then_top_p(void **state) {
    (void)state;
    float l[6];
    double want[6];
    fill_log(l, probs6, 6);
    /* top-k 4 leaves .40 .25 .15 .10, renormalized .444 .278 .167 .111;
     * top-p 0.7 of that keeps two (.722).  Without renormalizing it would
     * keep three (.40 + .25 = .65 < .7). */
    const int keep[] = {3, 1};
    pt_sampling p = pt_sampling_default();
    p.top_k = 4;
    p.top_p = 0.7f;
    p.seed = 41;
    expected(probs6, 6, 1.0, keep, 2, want);
    check_distribution(p, l, 6, want);
}

static void test_min_p(void **state) {
    (void)state;
    float l[6];
    double want[6];
    fill_log(l, probs6, 6);
    /* min_p 0.3: keep p >= 0.12, i.e. .40 .25 .15. */
    const int keep[] = {3, 1, 5};
    pt_sampling p = pt_sampling_default();
    p.min_p = 0.3f;
    p.seed = 51;
    expected(probs6, 6, 1.0, keep, 3, want);
    check_distribution(p, l, 6, want);
    /* After temperature 0.5 the ratios square: .25/.40 -> .39, .15/.40 ->
     * .14, so min_p 0.3 keeps two. */
    const int keep_t[] = {3, 1};
    p.temperature = 0.5f;
    expected(probs6, 6, 0.5, keep_t, 2, want);
    check_distribution(p, l, 6, want);
    /* min_p >= 1: the best alone. */
    const int best[] = {3};
    p.temperature = 1.0f;
    p.min_p = 1.5f;
    expected(probs6, 6, 1.0, best, 1, want);
    check_distribution(p, l, 6, want);
}

static void test_seed_determinism(void **state) {
    (void)state;
    enum { N = 12, STEPS = 2000 };
    float l[N];
    pt_rng rng;
    pt_rng_seed(&rng, 3);
    random_logits(&rng, l, N, 1.0);
    pt_sampling p = pt_sampling_default();
    p.top_p = 0.95f;
    p.seed = 7;
    pt_sampler *a = pt_sampler_new(&p, N), *b = pt_sampler_new(&p, N);
    p.seed = 8;
    pt_sampler *c = pt_sampler_new(&p, N);
    static int32_t seq[STEPS];
    int differ = 0;
    for (int i = 0; i < STEPS; i++) {
        seq[i] = sample_once(a, l, N, NULL);
        assert_int_equal(sample_once(b, l, N, NULL), seq[i]);
        differ += sample_once(c, l, N, NULL) != seq[i];
    }
    assert_true(differ > STEPS / 2);
    /* Reset replays the stream from the start. */
    pt_sampler_reset(a);
    for (int i = 0; i < STEPS; i++)
        assert_int_equal(sample_once(a, l, N, NULL), seq[i]);
    pt_sampler_free(a);
    pt_sampler_free(b);
    pt_sampler_free(c);
}

static void test_nonfinite_logits(void **state) {
    (void)state;
    pt_sampling p = pt_sampling_default();
    p.top_k = 3;
    pt_sampler *s = pt_sampler_new(&p, 5);
    const float dead[] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
    const float nan[] = {1.0f, NAN, 0.5f, NAN, 0.0f};
    const float masked[] = {-INFINITY, 1.0f, -INFINITY, 1.0f, -INFINITY};
    assert_int_equal(sample_once(s, dead, 5, NULL), 0);
    for (int i = 0; i < 100; i++) {
        int32_t id = sample_once(s, nan, 5, NULL);
        assert_true(id != 1 && id != 3);
        id = sample_once(s, masked, 5, NULL);
        assert_true(id == 1 || id == 3);
    }
    pt_sampler_free(s);
}

/* ------------------------------------------------------------------------
 * Logprobs
 * ---------------------------------------------------------------------- */

static void test_logprobs_reference(void **state) {
    (void)state;
    enum { N = 1000 };
    static float l[N], raw[N];
    static double ref[N];
    static int32_t rank[N];
    pt_rng rng;
    pt_rng_seed(&rng, 17);
    random_logits(&rng, raw, N, 20.0);
    ref_log_softmax(raw, N, ref);
    ref_rank(raw, N, rank);

    pt_sampling p = pt_sampling_default();
    p.temperature = 0.7f;
    p.top_k = 50;
    p.repetition_penalty = 1.3f;
    p.presence_penalty = 1.0f;
    p.n_logprobs = 5;
    p.seed = 2;
    pt_sampler *s = pt_sampler_new(&p, N);
    for (int i = 0; i < 40; i++)
        pt_sampler_accept(s, rank[i % 8]);
    const int32_t bias_id[] = {rank[0], rank[N - 1]};
    const float bias_val[] = {-3.0f, 2.0f};
    pt_sampler_set_bias(s, bias_id, bias_val, 2);
    for (int step = 0; step < 50; step++) {
        pt_sample_result r;
        memcpy(l, raw, sizeof(l));
        pt_sampler_sample(s, l, &r);
        /* Raw distribution despite penalties, bias and temperature. */
        assert_true(fabs(r.logprob - ref[r.id]) < 1e-5);
        assert_int_equal(r.n_top, 5);
        for (int k = 0; k < 5; k++) {
            assert_int_equal(r.top[k].id, rank[k]);
            assert_true(fabs(r.top[k].logprob - ref[rank[k]]) < 1e-5);
        }
    }
    pt_sampler_free(s);

    /* A token forced by bias still reports its raw (tiny) logprob. */
    pt_sampling g = greedy_params();
    g.n_logprobs = 0;
    g.frequency_penalty = 0.5f;
    s = pt_sampler_new(&g, N);
    int32_t worst = rank[N - 1];
    const float big = 1000.0f;
    pt_sampler_accept(s, worst);
    pt_sampler_set_bias(s, &worst, &big, 1);
    pt_sample_result r;
    memcpy(l, raw, sizeof(l));
    pt_sampler_sample(s, l, &r);
    assert_int_equal(r.id, worst);
    assert_int_equal(r.n_top, 0);
    assert_true(fabs(r.logprob - ref[worst]) < 1e-5);
    assert_true(r.logprob < -10.0f);
    pt_sampler_free(s);
}

static void test_logprobs_ordering(void **state) {
    (void)state;
    enum { N = 64 };
    float l[N];
    double ref[N];
    int32_t rank[N];
    /* Many ties: 8 distinct values. */
    for (int i = 0; i < N; i++)
        l[i] = (float)((i * 37) % 8) * 0.5f;
    ref_log_softmax(l, N, ref);
    ref_rank(l, N, rank);
    const int asks[] = {1, 7, 20, 50};
    for (size_t a = 0; a < PT_ARRAY_LEN(asks); a++) {
        pt_sampling p = greedy_params();
        p.n_logprobs = asks[a];
        pt_sampler *s = pt_sampler_new(&p, N);
        pt_sample_result r;
        float buf[N];
        memcpy(buf, l, sizeof(buf));
        pt_sampler_sample(s, buf, &r);
        int want = asks[a] > 20 ? 20 : asks[a];
        assert_int_equal(r.n_top, want);
        assert_int_equal(r.id, rank[0]);
        for (int k = 0; k < want; k++) {
            assert_int_equal(r.top[k].id, rank[k]);
            assert_true(fabs(r.top[k].logprob - ref[rank[k]]) < 1e-6);
            if (k) assert_true(r.top[k].logprob <= r.top[k - 1].logprob);
        }
        pt_sampler_free(s);
    }
    /* -1: no logprob work at all. */
    pt_sampling p = greedy_params();
    p.n_logprobs = -1;
    pt_sampler *s = pt_sampler_new(&p, N);
    pt_sample_result r;
    r.n_top = 99;
    r.logprob = 5.0f;
    float buf[N];
    memcpy(buf, l, sizeof(buf));
    pt_sampler_sample(s, buf, &r);
    assert_int_equal(r.n_top, 0);
    assert_true(r.logprob == 0.0f);
    pt_sampler_free(s);
}

/* ------------------------------------------------------------------------
 * Larger vocabularies: the nucleus probes, the full heap, and 150k tokens
 * ---------------------------------------------------------------------- */

enum { BIG = 150000 };

/* A reference chain over the ranked vocabulary: tempered probabilities,
 * then top-k, top-p (with a hair of slack so rounding cannot make the
 * reference the smaller set) and min-p.  Every filter keeps a prefix of the
 * ranking; returns its length.  allowed[id] is 0 for a dropped token, else
 * 1 + one of four rank buckets of about equal probability, and bucket_p[]
 * their exact probabilities. */
static int ref_keep(const float *l, const int32_t *rank, int n_vocab, const pt_sampling *p,
                    char *allowed, double *bucket_p) {
    static double w[BIG];
    int n = n_vocab;
    double sum = 0.0;
    if (p->top_k > 0 && p->top_k < n) n = p->top_k;
    for (int i = 0; i < n; i++) {
        w[i] = exp(((double)l[rank[i]] - l[rank[0]]) / p->temperature);
        sum += w[i];
    }
    if (p->top_p < 1.0f) {
        double cum = 0.0;
        int m = 0;
        while (m < n && cum < (p->top_p + 1e-6) * sum)
            cum += w[m++];
        n = m;
    }
    while (n > 1 && w[n - 1] < p->min_p * (1.0 - 1e-6))
        n--;
    sum = 0.0;
    for (int i = 0; i < n; i++)
        sum += w[i];
    memset(allowed, 0, (size_t)n_vocab);
    double cum = 0.0;
    for (int b = 0; b < 4; b++)
        bucket_p[b] = 0.0;
    for (int i = 0; i < n; i++) {
        int b = PT_MIN((int)(4.0 * (cum + 0.5 * w[i]) / sum), 3);
        allowed[rank[i]] = (char)(1 + b);
        bucket_p[b] += w[i] / sum;
        cum += w[i];
    }
    return n;
}

/* Draws from raw[0..n) and checks against the reference chain: the kept
 * set's size is within [min_kept, max_kept] (which picks the code path
 * under test), every draw is kept, each bucket's share is within tol of its
 * probability, and logprobs match a double log-softmax. */
static void check_buckets(const float *raw, int n, pt_sampling p, int draws, double tol,
                          int min_kept, int max_kept) {
    static float l[BIG];
    static double ref[BIG];
    static int32_t rank[BIG];
    static char allowed[BIG];
    double bucket_p[4];
    int hits[4] = {0};
    ref_log_softmax(raw, n, ref);
    ref_rank(raw, n, rank);
    int kept = ref_keep(raw, rank, n, &p, allowed, bucket_p);
    assert_in_range(kept, min_kept, max_kept);
    pt_sampler *s = pt_sampler_new(&p, n);
    for (int i = 0; i < draws; i++) {
        pt_sample_result r;
        memcpy(l, raw, (size_t)n * sizeof(float));
        pt_sampler_sample(s, l, &r);
        assert_true(r.id >= 0 && r.id < n);
        assert_true(allowed[r.id]);
        hits[allowed[r.id] - 1]++;
        if (p.n_logprobs >= 0) assert_true(fabs(r.logprob - ref[r.id]) < 1e-5);
    }
    for (int b = 0; b < 4; b++)
        assert_true(fabs(hits[b] / (double)draws - bucket_p[b]) < tol);
    pt_sampler_free(s);
}

static pt_sampling filters(float temperature, int top_k, float top_p, float min_p) {
    pt_sampling p = pt_sampling_default();
    p.temperature = temperature;
    p.top_k = top_k;
    p.top_p = top_p;
    p.min_p = min_p;
    return p;
}

/* top-p without top-k looks in the best 256 tokens first, else runs a
 * quickselect on mass: nuclei for each (1500 draws, buckets within 0.06,
 * about 4.6 standard deviations), and inputs that stress the selection
 * (500 draws, within 0.1, about 4.5 standard deviations): a top-k nearly
 * the vocabulary, every logit equal (all decisions are id ties), logits
 * sorted by id. */
static void test_nucleus_paths(void **state) {
    (void)state;
    enum { N = 10000, D = 1500, D_STRESS = 500 };
    static float raw[N];
    pt_rng rng;
    pt_rng_seed(&rng, 5000);
    random_logits(&rng, raw, N, 6.0);
    pt_sampling p = filters(1.0f, 0, 0.6f, 0.0f);
    p.seed = 1;
    check_buckets(raw, N, p, D, 0.06, 20, 255); /* the probe */
    p = filters(1.0f, 0, 0.9f, 0.0f);
    p.seed = 2;
    p.n_logprobs = 2;
    check_buckets(raw, N, p, D, 0.06, 257, 2000); /* quickselect */
    p = filters(2.0f, 0, 0.95f, 0.0f);
    p.seed = 3;
    check_buckets(raw, N, p, D, 0.06, 2000, N); /* quickselect, half of it */
    p = filters(1.0f, 8000, 0.95f, 0.0f);
    p.seed = 4;
    check_buckets(raw, N, p, D_STRESS, 0.1, 257, 2000);

    /* All equal: top-p 0.25 is exactly the 2500 lowest ids (the reference
     * allows one more for its slack). */
    for (int i = 0; i < N; i++)
        raw[i] = 1.5f;
    p = filters(1.0f, 0, 0.25f, 0.0f);
    p.seed = 6;
    check_buckets(raw, N, p, D_STRESS, 0.1, 2500, 2501);
    /* Sorted by id, both ways. */
    for (int i = 0; i < N; i++)
        raw[i] = (float)i * 1e-3f;
    p = filters(1.0f, 0, 0.9f, 0.0f);
    p.seed = 7;
    check_buckets(raw, N, p, D_STRESS, 0.1, 1000, N);
    for (int i = 0; i < N; i++)
        raw[i] = (float)-i * 1e-3f;
    p.seed = 8;
    check_buckets(raw, N, p, D_STRESS, 0.1, 1000, N);
}

/* The probe path with an exactly known answer: the six-token distribution
 * inside a vocabulary of 2000 whose other tokens are nearly impossible. */
static void test_nucleus_probe_exact(void **state) {
    (void)state;
    enum { N = 2000 };
    const int32_t at[] = {1900, 17, 512, 3, 999, 250};
    static double probs[N], want[N];
    static float l[N];
    for (int i = 0; i < N; i++)
        probs[i] = 1e-6;
    for (int i = 0; i < 6; i++)
        probs[at[i]] = probs6[i];
    fill_log(l, probs, N);
    /* The tail adds 0.002 to the mass: .40 + .25 < .75 * 1.002 <= .80. */
    const int keep[] = {at[3], at[1], at[5]};
    pt_sampling p = filters(1.0f, 0, 0.75f, 0.0f);
    p.seed = 61;
    expected(probs, N, 1.0, keep, 3, want);
    check_distribution(p, l, N, want);
}

/* The quickselect path with an exactly known answer: one token of mass
 * 200, 600 tied tokens of mass 1 at scattered ids, and 3495 of mass 1e-3.
 * Top-p with a target mass of 600.5 keeps the big token and exactly the 401
 * lowest ids of the tied ones: more than the sampler's first probe of 256. */
static void test_nucleus_quickselect_exact(void **state) {
    (void)state;
    enum { N = 4096, TIED = 600 };
    static double probs[N], want[N];
    static float l[N];
    static int keep[N];
    int n_keep = 0, tied_seen = 0;
    for (int i = 0; i < N; i++)
        probs[i] = 1e-3;
    probs[2000] = 200.0;
    keep[n_keep++] = 2000;
    for (int i = 0; i < TIED; i++)
        probs[(i * 1237 + 5) % N] = 1.0; /* 1237 is odd: distinct */
    for (int i = 0; i < N; i++)
        if (probs[i] == 1.0 && tied_seen++ < 401) keep[n_keep++] = i;
    assert_int_equal(tied_seen, TIED);
    double total = 200.0 + TIED + (N - 1 - TIED) * 1e-3;
    fill_log(l, probs, N);
    pt_sampling p = filters(1.0f, 0, (float)(600.5 / total), 0.0f);
    p.seed = 71;
    expected(probs, N, 1.0, keep, n_keep, want);
    check_distribution(p, l, N, want);

    /* 2049 equal tokens, top-p 0.5: a target of 1024.5 tokens, so exactly
     * ids 0..1024.  (The first median-of-three pivot is id 1024 itself, the
     * case where the pivot completes the nucleus.) */
    enum { M = 2049 };
    for (int i = 0; i < M; i++) {
        probs[i] = 1.0;
        keep[i] = i;
    }
    fill_log(l, probs, M);
    p = filters(1.0f, 0, 0.5f, 0.0f);
    p.seed = 72;
    expected(probs, M, 1.0, keep, 1025, want);
    check_distribution(p, l, M, want);
}

static void test_large_vocab(void **state) {
    (void)state;
    static float raw[BIG], l[BIG];
    static double ref[BIG];
    static int32_t rank[BIG];
    pt_rng rng;
    pt_rng_seed(&rng, 150);
    random_logits(&rng, raw, BIG, 12.0);
    ref_log_softmax(raw, BIG, ref);
    ref_rank(raw, BIG, rank);

    /* Greedy with logprobs. */
    pt_sampling g = greedy_params();
    g.n_logprobs = 20;
    pt_sampler *s = pt_sampler_new(&g, BIG);
    pt_sample_result r;
    memcpy(l, raw, sizeof(l));
    pt_sampler_sample(s, l, &r);
    assert_int_equal(r.id, rank[0]);
    assert_true(fabs(r.logprob - ref[rank[0]]) < 1e-5);
    assert_int_equal(r.n_top, 20);
    for (int k = 0; k < 20; k++) {
        assert_int_equal(r.top[k].id, rank[k]);
        assert_true(fabs(r.top[k].logprob - ref[rank[k]]) < 1e-5);
    }
    pt_sampler_free(s);

    /* Each filter alone and together; 200 draws, buckets within 0.15
     * (about 4.2 standard deviations). */
    const struct {
        pt_sampling p;
        int min_kept, max_kept;
    } cases[] = {
        {filters(0.8f, 40, 1.0f, 0.0f), 40, 40},    {filters(0.7f, 0, 0.5f, 0.0f), 10, 40},
        {filters(1.0f, 0, 0.9f, 0.0f), 400, 1000},  {filters(1.3f, 0, 1.0f, 0.05f), 2, BIG},
        {filters(0.7f, 500, 0.95f, 0.01f), 2, 500},
    };
    for (size_t c = 0; c < PT_ARRAY_LEN(cases); c++) {
        pt_sampling p = cases[c].p;
        p.seed = 1000 + c;
        p.n_logprobs = c % 2 ? 3 : -1;
        check_buckets(raw, BIG, p, 200, 0.15, cases[c].min_kept, cases[c].max_kept);
    }
}

/* Ties at the top-k boundary in a large vocabulary go to the lowest ids:
 * ten tokens share the highest logit, top-k 5 keeps the five lowest. */
static void test_large_vocab_top_k_ties(void **state) {
    (void)state;
    static float raw[BIG], l[BIG];
    const int32_t tied[] = {149999, 77, 120000, 5, 90001, 3000, 64000, 12, 100, 140000};
    const int32_t lowest5[] = {5, 12, 77, 100, 3000};
    pt_rng rng;
    pt_rng_seed(&rng, 7);
    random_logits(&rng, raw, BIG, 4.0);
    for (size_t i = 0; i < PT_ARRAY_LEN(tied); i++)
        raw[tied[i]] = 10.0f;

    pt_sampling p = pt_sampling_default();
    p.top_k = 5;
    p.seed = 3;
    pt_sampler *s = pt_sampler_new(&p, BIG);
    int seen[5] = {0};
    for (int i = 0; i < 400; i++) {
        pt_sample_result r;
        memcpy(l, raw, sizeof(l));
        pt_sampler_sample(s, l, &r);
        int k = 0;
        while (k < 4 && lowest5[k] != r.id)
            k++;
        assert_int_equal(lowest5[k], r.id);
        seen[k]++;
    }
    for (int k = 0; k < 5; k++)
        assert_true(seen[k] > 40); /* ~80 each */
    pt_sampler_free(s);

    /* top-k 1 and greedy: the lowest tied id. */
    p.top_k = 1;
    s = pt_sampler_new(&p, BIG);
    pt_sample_result r;
    memcpy(l, raw, sizeof(l));
    pt_sampler_sample(s, l, &r);
    assert_int_equal(r.id, 5);
    pt_sampler_free(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_greedy_argmax_and_ties),
        cmocka_unit_test(test_repetition_penalty),
        cmocka_unit_test(test_frequency_penalty),
        cmocka_unit_test(test_presence_penalty),
        cmocka_unit_test(test_penalties_combined),
        cmocka_unit_test(test_penalty_window),
        cmocka_unit_test(test_long_history_ring),
        cmocka_unit_test(test_logit_bias),
        cmocka_unit_test(test_top_k_one_is_greedy),
        cmocka_unit_test(test_temperature),
        cmocka_unit_test(test_top_k),
        cmocka_unit_test(test_top_p),
        cmocka_unit_test(test_top_k_then_top_p),
        cmocka_unit_test(test_min_p),
        cmocka_unit_test(test_seed_determinism),
        cmocka_unit_test(test_nonfinite_logits),
        cmocka_unit_test(test_logprobs_reference),
        cmocka_unit_test(test_logprobs_ordering),
        cmocka_unit_test(test_nucleus_paths),
        cmocka_unit_test(test_nucleus_probe_exact),
        cmocka_unit_test(test_nucleus_quickselect_exact),
        cmocka_unit_test(test_large_vocab),
        cmocka_unit_test(test_large_vocab_top_k_ties),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
