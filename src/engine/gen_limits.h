/*
 * gen_limits.h - the allowed range of every user-facing generation
 * parameter, in one table that the command line (`petrel generate`,
 * `serve`) and the OpenAI request parser both check against, so a value
 * the server refuses is refused by the CLI too, with the same range.
 *
 * Invariants: every range is closed [lo, hi] and finite, so NaN and the
 * infinities are always out of range; an integer parameter also refuses
 * fractions.  Values are checked where they enter (flag, JSON field), never
 * clamped: a value out of range is an error naming the parameter and its
 * range.  "Off" values (top_k 0 or -1, top_p 1, min_p 0, penalties 0/1)
 * are inside the ranges.
 */
#ifndef PETREL_GEN_LIMITS_H
#define PETREL_GEN_LIMITS_H

#include <stdbool.h>
#include <stddef.h>

#include "engine/engine.h"

typedef enum pt_gen_param {
    PT_GP_MAX_TOKENS,         /* tokens to generate; the context's end stops earlier */
    PT_GP_TEMPERATURE,        /* 0 = greedy */
    PT_GP_TOP_K,              /* 0 or -1 = off (-1 as vLLM) */
    PT_GP_TOP_P,              /* 1 = off */
    PT_GP_MIN_P,              /* 0 = off */
    PT_GP_REPETITION_PENALTY, /* 1 = off */
    PT_GP_FREQUENCY_PENALTY,  /* 0 = off */
    PT_GP_PRESENCE_PENALTY,   /* 0 = off */
    PT_GP_LOGPROBS,           /* alternatives reported per token */
    PT_GP_PARALLEL,           /* server: sequences decoded together (also <= --batch) */
    PT_GP_COUNT
} pt_gen_param;

typedef struct pt_gen_limit {
    const char *name; /* the OpenAI field name ("temperature") */
    const char *flag; /* the CLI flag without dashes ("temp"), or NULL */
    double lo, hi;    /* inclusive */
    bool integer;
} pt_gen_limit;

extern const pt_gen_limit pt_gen_limits[PT_GP_COUNT];

/* The row whose CLI flag is flag, or NULL. */
const pt_gen_limit *pt_gen_limit_of_flag(const char *flag);

/* True if x is a value the parameter allows. */
bool pt_gen_in_range(const pt_gen_limit *l, double x);

/* The range in words, for messages and --help: "a number between 0 and 2",
 * "an integer between 0 and 20", "an integer >= 1".  Returns buf. */
const char *pt_gen_range_text(const pt_gen_limit *l, char *buf, size_t cap);

/* Checks a whole pt_gen_params against the table (n_logprobs may also be
 * -1: none), for callers of the C API that pass values no flag or JSON
 * parser has seen.  Fails naming the first parameter out of range. */
int pt_gen_params_check(const pt_gen_params *p, pt_err *err);

#endif
