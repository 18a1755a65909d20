/*
 * openai.h - the OpenAI API's request and response JSON: parsing and
 * validating /v1/chat/completions and /v1/completions bodies into a
 * pt_oai_request, and building the pieces of responses (usage, timings,
 * logprobs, errors).
 *
 * Pure functions of their inputs (no engine, no I/O), so they are tested
 * directly.  Validation follows OpenAI: every field is optional except
 * messages / prompt, null means absent, unknown fields are ignored (clients
 * send many), a field of the wrong type or out of range is a 400 naming the
 * field in error.param.
 */
#ifndef PETREL_OPENAI_H
#define PETREL_OPENAI_H

#include <jansson.h>

#include "engine/scheduler.h"
#include "sample/sampler.h"
#include "server/stop.h"

enum pt_oai_kind { PT_OAI_CHAT = 1, PT_OAI_COMPLETION = 2 };

#define PT_OAI_MAX_CHOICES 16 /* n: each choice is a sequence of its own */

typedef struct pt_oai_error {
    int status;       /* HTTP status */
    const char *type; /* NULL: from the status */
    const char *code; /* machine-readable, or NULL */
    char param[64];   /* the offending field, or "" */
    char message[512];
} pt_oai_error;

/* What validation needs to know about the server. */
typedef struct pt_oai_limits {
    const char *model_id; /* the one model served */
    int n_vocab;          /* token ids in prompts and logit_bias are below this */
} pt_oai_limits;

typedef struct pt_oai_request {
    int kind;
    json_t *root;            /* the parsed body (owned) */
    const char *model;       /* as given, or NULL */
    json_t *messages;        /* chat: normalized copy, contents as strings (owned) */
    json_t *tools;           /* chat: borrowed from root, or NULL */
    json_t *template_kwargs; /* chat: extra template variables (borrowed), or NULL */
    const char *reasoning_effort; /* chat: "minimal".."high" (borrowed), or NULL */
    const char *prompt;      /* completions: text (borrowed from root), or NULL */
    size_t prompt_len;
    int32_t *prompt_ids; /* completions: token ids given instead of text (owned) */
    int n_prompt_ids;
    bool stream, include_usage;
    int max_tokens;       /* 0: not given */
    int n;                /* choices, 1..PT_OAI_MAX_CHOICES */
    pt_sampling sampling; /* n_logprobs set from logprobs/top_logprobs */
    bool seed_given;
    pt_stop stop;
    bool logprobs;    /* report per-token logprobs */
    int top_logprobs; /* alternatives per token, 0..20 */
    bool ignore_eos;
    int32_t *bias_ids; /* logit_bias (owned) */
    float *bias_vals;
    int n_bias;
    const char *user;
    json_t *response_format; /* borrowed from root; compiled at submit
                                (server/structured.c), or NULL */
    /* Predicted Outputs: the text the answer is expected to repeat (its
     * parts joined), drafted from when the request runs (owned; NULL: none) */
    char *prediction;
    size_t prediction_len;
} pt_oai_request;

/* Parses body[0..len) as a request of the given kind.  On error returns -1
 * with e filled (r is then freed already).  r is freed with
 * pt_oai_request_free. */
int pt_oai_parse(pt_oai_request *r, int kind, const char *body, size_t len,
                 const pt_oai_limits *lim, pt_oai_error *e);
void pt_oai_request_free(pt_oai_request *r);

/* {"error": {"message", "type", "param", "code"}} */
json_t *pt_oai_error_json(const pt_oai_error *e);

/* A JSON string of bytes that may not be valid UTF-8 (token pieces):
 * invalid sequences become U+FFFD. */
json_t *pt_oai_string_lossy(const char *s, size_t len);
/* [b0, b1, ...]: the exact bytes, as OpenAI's logprobs "bytes" field. */
json_t *pt_oai_bytes(const char *s, size_t len);

json_t *pt_oai_usage(int n_prompt, int n_completion, int n_cached);
/* Adds OpenAI's completion_tokens_details.accepted_prediction_tokens and
 * rejected_prediction_tokens to a usage object: the drafted tokens the
 * model confirmed, and the rest (so accepted + rejected = drafted). */
void pt_oai_usage_spec(json_t *usage, int n_drafted, int n_accepted);
/* Petrel's extra "timings" object. */
json_t *pt_oai_timings(const pt_sched_stats *st);
const char *pt_oai_finish_reason(int finish); /* "stop", "length", ... */

#endif
