/*
 * gen_limits.c - the table of generation parameter ranges (gen_limits.h).
 *
 * The ranges are OpenAI's where OpenAI has one (temperature, top_p, the
 * penalties, logprobs), vLLM's otherwise (top_k -1, min_p,
 * repetition_penalty).  Integers with no natural top end go to INT_MAX.
 */
#include "engine/gen_limits.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

const pt_gen_limit pt_gen_limits[PT_GP_COUNT] = {
    [PT_GP_MAX_TOKENS] = {"max_tokens", "n-predict", 1, INT_MAX, true},
    [PT_GP_TEMPERATURE] = {"temperature", "temp", 0, 2, false},
    [PT_GP_TOP_K] = {"top_k", "top-k", -1, INT_MAX, true},
    [PT_GP_TOP_P] = {"top_p", "top-p", 0, 1, false},
    [PT_GP_MIN_P] = {"min_p", "min-p", 0, 1, false},
    [PT_GP_REPETITION_PENALTY] = {"repetition_penalty", "repeat-penalty", 0.01, 10, false},
    [PT_GP_FREQUENCY_PENALTY] = {"frequency_penalty", "frequency-penalty", -2, 2, false},
    [PT_GP_PRESENCE_PENALTY] = {"presence_penalty", "presence-penalty", -2, 2, false},
    /* the sampler keeps at most 20 alternatives (pt_sample_result.top) */
    [PT_GP_LOGPROBS] = {"logprobs", "logprobs", 0, 20, true},
    /* each sequence takes a row of every decode batch: --batch narrows it */
    [PT_GP_PARALLEL] = {"parallel", "parallel", 1, 65536, true},
};

const pt_gen_limit *pt_gen_limit_of_flag(const char *flag) {
    for (int i = 0; i < PT_GP_COUNT; i++)
        if (pt_gen_limits[i].flag && strcmp(pt_gen_limits[i].flag, flag) == 0)
            return &pt_gen_limits[i];
    return NULL;
}

bool pt_gen_in_range(const pt_gen_limit *l, double x) {
    if (!(x >= l->lo && x <= l->hi)) return false; /* NaN fails here too */
    return !l->integer || x == floor(x);
}

const char *pt_gen_range_text(const pt_gen_limit *l, char *buf, size_t cap) {
    const char *what = l->integer ? "an integer" : "a number";
    if (l->integer && l->hi >= INT_MAX)
        snprintf(buf, cap, "%s >= %.15g", what, l->lo);
    else
        snprintf(buf, cap, "%s between %.15g and %.15g", what, l->lo, l->hi);
    return buf;
}

int pt_gen_params_check(const pt_gen_params *p, pt_err *err) {
    const pt_sampling *s = &p->sampling;
    const struct {
        pt_gen_param id;
        double v;
    } vals[] = {
        {PT_GP_MAX_TOKENS, p->max_tokens},
        {PT_GP_TEMPERATURE, s->temperature},
        {PT_GP_TOP_K, s->top_k},
        {PT_GP_TOP_P, s->top_p},
        {PT_GP_MIN_P, s->min_p},
        {PT_GP_REPETITION_PENALTY, s->repetition_penalty},
        {PT_GP_FREQUENCY_PENALTY, s->frequency_penalty},
        {PT_GP_PRESENCE_PENALTY, s->presence_penalty},
        {PT_GP_LOGPROBS, s->n_logprobs == -1 ? 0 : s->n_logprobs},
    };
    for (size_t i = 0; i < sizeof vals / sizeof vals[0]; i++) {
        pt_gen_limit l = pt_gen_limits[vals[i].id];
        if (!l.integer) { /* the values are floats here: 0.01 arrived as 0.0099999998 */
            l.lo = (float)l.lo;
            l.hi = (float)l.hi;
        }
        if (pt_gen_in_range(&l, vals[i].v)) continue;
        char r[64];
        return pt_fail(err, "%s %g is out of range: it must be %s", l.name, vals[i].v,
                       pt_gen_range_text(&pt_gen_limits[vals[i].id], r, sizeof r));
    }
    return 0;
}
