/*
 * openai.c - OpenAI request validation and response pieces (see openai.h).
 *
 * Fields are a table: name, which endpoints take it, a parser, and for
 * numbers the allowed range and where the value goes.  Adding a field is
 * adding a row.  The ranges of the generation parameters are not written
 * here: they come from engine/gen_limits.h, the table the CLI flags are
 * checked against too.
 */
#include "server/openai.h"

#include "engine/gen_limits.h"

#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#define BOTH (PT_OAI_CHAT | PT_OAI_COMPLETION)

typedef struct field field;
typedef int (*field_fn)(pt_oai_request *r, json_t *v, const field *f, const pt_oai_limits *lim,
                        pt_oai_error *e);

struct field {
    const char *name;
    int kinds;
    field_fn parse;
    const pt_gen_limit *range; /* of numbers, or NULL */
    size_t off;                /* offset of a float in pt_sampling */
};

/* ---- errors ---------------------------------------------------------------- */

static int fail(pt_oai_error *e, int status, const char *code, const char *param, const char *fmt,
                ...) __attribute__((format(printf, 5, 6)));

static int fail(pt_oai_error *e, int status, const char *code, const char *param, const char *fmt,
                ...) {
    e->status = status;
    e->type = NULL;
    e->code = code;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return -1;
}

static int wrong_type(pt_oai_error *e, const char *name, const char *what) {
    return fail(e, 400, "invalid_type", name, "'%s' must be %s", name, what);
}

json_t *pt_oai_error_json(const pt_oai_error *e) {
    const char *type = e->type            ? e->type
                       : e->status == 401 ? "authentication_error"
                       : e->status == 404 ? "not_found_error"
                       : e->status >= 500 ? "server_error"
                                          : "invalid_request_error";
    json_t *err = json_object();
    json_t *msg = json_string(e->message);
    json_object_set_new(err, "message", msg ? msg : json_string("invalid request"));
    json_object_set_new(err, "type", json_string(type));
    json_object_set_new(err, "param", e->param[0] ? json_string(e->param) : json_null());
    json_object_set_new(err, "code", e->code ? json_string(e->code) : json_null());
    json_t *root = json_object();
    json_object_set_new(root, "error", err);
    return root;
}

/* ---- scalar fields ------------------------------------------------------------ */

/* A JSON integer, or a real with an integral value (10.0). */
static bool get_int(json_t *v, long long *out) {
    if (json_is_integer(v)) {
        *out = json_integer_value(v);
        return true;
    }
    if (json_is_real(v)) {
        double d = json_real_value(v);
        if (d == floor(d) && fabs(d) < 9e15) {
            *out = (long long)d;
            return true;
        }
    }
    return false;
}

static int out_of_range(pt_oai_error *e, const field *f, const char *got) {
    char r[64];
    return fail(e, 400, "invalid_value", f->name, "'%s' must be %s, got %s", f->name,
                pt_gen_range_text(f->range, r, sizeof r), got);
}

static int int_in_range(json_t *v, const field *f, pt_oai_error *e, long long *out) {
    if (!get_int(v, out)) return wrong_type(e, f->name, "an integer");
    if (!pt_gen_in_range(f->range, (double)*out)) {
        char got[32];
        snprintf(got, sizeof got, "%lld", *out);
        return out_of_range(e, f, got);
    }
    return 0;
}

static int f_sampling_float(pt_oai_request *r, json_t *v, const field *f, const pt_oai_limits *lim,
                            pt_oai_error *e) {
    (void)lim;
    if (!json_is_number(v)) return wrong_type(e, f->name, "a number");
    double x = json_number_value(v);
    if (!pt_gen_in_range(f->range, x)) {
        char got[32];
        snprintf(got, sizeof got, "%g", x);
        return out_of_range(e, f, got);
    }
    *(float *)((char *)&r->sampling + f->off) = (float)x;
    return 0;
}

static int f_top_k(pt_oai_request *r, json_t *v, const field *f, const pt_oai_limits *lim,
                   pt_oai_error *e) {
    long long k;
    if (int_in_range(v, f, e, &k)) return -1;
    r->sampling.top_k = k < 0 ? 0 : (int)PT_MIN(k, (long long)lim->n_vocab); /* -1: off, as vLLM */
    return 0;
}

static int f_max_tokens(pt_oai_request *r, json_t *v, const field *f, const pt_oai_limits *lim,
                        pt_oai_error *e) {
    (void)lim;
    long long n;
    if (int_in_range(v, f, e, &n)) return -1;
    /* max_completion_tokens is the newer name; it wins when both are given */
    if (r->max_tokens == 0 || strcmp(f->name, "max_completion_tokens") == 0) r->max_tokens = (int)n;
    return 0;
}

static int f_seed(pt_oai_request *r, json_t *v, const field *f, const pt_oai_limits *lim,
                  pt_oai_error *e) {
    (void)lim;
    long long s;
    if (!get_int(v, &s)) return wrong_type(e, f->name, "an integer");
    r->sampling.seed = (uint64_t)s;
    r->seed_given = true;
    return 0;
}

static int f_bool(json_t *v, const field *f, pt_oai_error *e, bool *out) {
    if (!json_is_boolean(v)) return wrong_type(e, f->name, "a boolean");
    *out = json_is_true(v);
    return 0;
}

static int f_stream(pt_oai_request *r, json_t *v, const field *f, const pt_oai_limits *lim,
                    pt_oai_error *e) {
    (void)lim;
    return f_bool(v, f, e, &r->stream);
}

static int f_ignore_eos(pt_oai_request *r, json_t *v, const field *f, const pt_oai_limits *lim,
                        pt_oai_error *e) {
    (void)lim;
    return f_bool(v, f, e, &r->ignore_eos);
}

static int f_stream_options(pt_oai_request *r, json_t *v, const field *f, const pt_oai_limits *lim,
                            pt_oai_error *e) {
    (void)lim;
    if (!json_is_object(v)) return wrong_type(e, f->name, "an object");
    json_t *u = json_object_get(v, "include_usage");
    if (u && !json_is_null(u)) {
        if (!json_is_boolean(u)) return wrong_type(e, "stream_options.include_usage", "a boolean");
        r->include_usage = json_is_true(u);
    }
    return 0;
}

/* Choices: separate sequences that share the prompt (completion.c). */
static int f_n(pt_oai_request *r, json_t *v, const field *f, const pt_oai_limits *lim,
               pt_oai_error *e) {
    (void)lim;
    long long n;
    if (!get_int(v, &n)) return wrong_type(e, f->name, "an integer");
    if (n < 1 || n > PT_OAI_MAX_CHOICES)
        return fail(e, 400, "invalid_value", f->name,
                    "'%s' must be 1 to %d (the number of choices to generate), got %lld", f->name,
                    PT_OAI_MAX_CHOICES, n);
    r->n = (int)n;
    return 0;
}

static int f_best_of(pt_oai_request *r, json_t *v, const field *f, const pt_oai_limits *lim,
                     pt_oai_error *e) {
    (void)r, (void)lim;
    long long n;
    if (!get_int(v, &n)) return wrong_type(e, f->name, "an integer");
    if (n != 1)
        return fail(e, 400, "unsupported_value", f->name,
                    "'best_of' must be 1: Petrel does not rank choices (use 'n' for several)");
    return 0;
}

static int f_echo(pt_oai_request *r, json_t *v, const field *f, const pt_oai_limits *lim,
                  pt_oai_error *e) {
    (void)r, (void)lim;
    bool echo = false;
    if (f_bool(v, f, e, &echo)) return -1;
    if (echo) return fail(e, 400, "unsupported_value", f->name, "'echo' is not supported");
    return 0;
}

static int f_suffix(pt_oai_request *r, json_t *v, const field *f, const pt_oai_limits *lim,
                    pt_oai_error *e) {
    (void)r, (void)lim, (void)v;
    return fail(e, 400, "unsupported_value", f->name, "'suffix' is not supported");
}

static int f_string(json_t *v, const field *f, pt_oai_error *e, const char **out) {
    if (!json_is_string(v)) return wrong_type(e, f->name, "a string");
    *out = json_string_value(v);
    return 0;
}

static int f_model(pt_oai_request *r, json_t *v, const field *f, const pt_oai_limits *lim,
                   pt_oai_error *e) {
    if (f_string(v, f, e, &r->model)) return -1;
    if (strcmp(r->model, lim->model_id) != 0)
        return fail(e, 404, "model_not_found", f->name,
                    "The model '%.200s' does not exist; this server serves '%.200s'", r->model,
                    lim->model_id);
    return 0;
}

static int f_user(pt_oai_request *r, json_t *v, const field *f, const pt_oai_limits *lim,
                  pt_oai_error *e) {
    (void)lim;
    return f_string(v, f, e, &r->user);
}

static int add_stop(pt_oai_request *r, json_t *s, pt_oai_error *e) {
    pt_err err = {{0}};
    if (pt_stop_add(&r->stop, json_string_value(s), json_string_length(s), &err))
        return fail(e, 400, "invalid_value", "stop", "%s", err.msg);
    return 0;
}

static int f_stop(pt_oai_request *r, json_t *v, const field *f, const pt_oai_limits *lim,
                  pt_oai_error *e) {
    (void)lim;
    if (json_is_string(v)) return add_stop(r, v, e);
    if (!json_is_array(v)) return wrong_type(e, f->name, "a string or an array of strings");
    size_t i;
    json_t *s;
    json_array_foreach(v, i, s) {
        if (!json_is_string(s)) return wrong_type(e, f->name, "a string or an array of strings");
        if (add_stop(r, s, e)) return -1;
    }
    return 0;
}

static int f_logprobs(pt_oai_request *r, json_t *v, const field *f, const pt_oai_limits *lim,
                      pt_oai_error *e) {
    (void)lim;
    if (r->kind == PT_OAI_CHAT) return f_bool(v, f, e, &r->logprobs);
    /* completions: an integer, the number of alternatives */
    long long k;
    if (int_in_range(v, f, e, &k)) return -1;
    r->logprobs = true;
    r->top_logprobs = (int)k;
    return 0;
}

static int f_top_logprobs(pt_oai_request *r, json_t *v, const field *f, const pt_oai_limits *lim,
                          pt_oai_error *e) {
    (void)lim;
    long long k;
    if (int_in_range(v, f, e, &k)) return -1;
    r->top_logprobs = (int)k;
    return 0;
}

static int f_logit_bias(pt_oai_request *r, json_t *v, const field *f, const pt_oai_limits *lim,
                        pt_oai_error *e) {
    if (!json_is_object(v)) return wrong_type(e, f->name, "an object of token ids to numbers");
    size_t n = json_object_size(v);
    r->bias_ids = pt_xcalloc(n ? n : 1, sizeof *r->bias_ids);
    r->bias_vals = pt_xcalloc(n ? n : 1, sizeof *r->bias_vals);
    const char *key;
    json_t *x;
    json_object_foreach(v, key, x) {
        char *end;
        long id = strtol(key, &end, 10);
        if (!*key || *end || id < 0 || id >= lim->n_vocab)
            return fail(e, 400, "invalid_value", f->name,
                        "logit_bias key '%.40s' is not a token id below %d", key, lim->n_vocab);
        if (!json_is_number(x) || json_number_value(x) < -100 || json_number_value(x) > 100)
            return fail(e, 400, "invalid_value", f->name,
                        "logit_bias values must be numbers between -100 and 100");
        r->bias_ids[r->n_bias] = (int32_t)id;
        r->bias_vals[r->n_bias++] = (float)json_number_value(x);
    }
    return 0;
}

/* Predicted Outputs: {"type": "content", "content": "..." | [text parts]}.
 * The parts are joined as they are (no separator): the prediction is the
 * literal text the answer is expected to contain. */
static int f_prediction(pt_oai_request *r, json_t *v, const field *f, const pt_oai_limits *lim,
                        pt_oai_error *e) {
    (void)lim;
    if (!json_is_object(v))
        return wrong_type(e, f->name, "an object ({\"type\": \"content\", \"content\": ...})");
    const char *t = json_string_value(json_object_get(v, "type"));
    if (!t || strcmp(t, "content"))
        return fail(e, 400, "invalid_value", "prediction.type",
                    "prediction.type must be \"content\" (got %s%.40s%s)", t ? "'" : "",
                    t ? t : "none", t ? "'" : "");
    json_t *c = json_object_get(v, "content");
    if (json_is_string(c)) {
        r->prediction_len = json_string_length(c);
        r->prediction = pt_xmalloc(r->prediction_len + 1);
        memcpy(r->prediction, json_string_value(c), r->prediction_len + 1);
        return 0;
    }
    if (!json_is_array(c))
        return c ? wrong_type(e, "prediction.content", "a string or an array of text parts")
                 : fail(e, 400, "missing_required_parameter", "prediction.content",
                        "'prediction.content' is required");
    size_t i, len = 0;
    json_t *part;
    json_array_foreach(c, i, part) {
        const char *type = json_string_value(json_object_get(part, "type"));
        json_t *text = json_object_get(part, "text");
        if (!json_is_object(part) || !type || strcmp(type, "text") || !json_is_string(text)) {
            char pp[64];
            snprintf(pp, sizeof pp, "prediction.content[%zu]", i);
            return fail(e, 400, "invalid_value", pp,
                        "'%s' must be a text part ({\"type\": \"text\", \"text\": \"...\"})", pp);
        }
        len += json_string_length(text);
    }
    r->prediction = pt_xmalloc(len + 1);
    json_array_foreach(c, i, part) {
        json_t *text = json_object_get(part, "text");
        memcpy(r->prediction + r->prediction_len, json_string_value(text), json_string_length(text));
        r->prediction_len += json_string_length(text);
    }
    r->prediction[len] = 0;
    return 0;
}

/* The shape is checked here; the schema is compiled when the request is
 * submitted (server/structured.c), where an unsupported feature is a 400
 * that names it. */
static int f_response_format(pt_oai_request *r, json_t *v, const field *f, const pt_oai_limits *lim,
                             pt_oai_error *e) {
    (void)lim;
    if (!json_is_object(v)) return wrong_type(e, f->name, "an object");
    const char *t = json_string_value(json_object_get(v, "type"));
    if (!t || (strcmp(t, "text") && strcmp(t, "json_object") && strcmp(t, "json_schema")))
        return fail(e, 400, "unsupported_value", f->name,
                    "response_format '%.40s' is not supported; use 'text', 'json_object' or "
                    "'json_schema'", t ? t : "?");
    if (!strcmp(t, "json_schema") && !json_is_object(json_object_get(v, "json_schema")))
        return fail(e, 400, "invalid_value", f->name,
                    "response_format json_schema needs a \"json_schema\" object with a \"schema\"");
    r->response_format = strcmp(t, "text") ? v : NULL;
    return 0;
}

static int f_tools(pt_oai_request *r, json_t *v, const field *f, const pt_oai_limits *lim,
                   pt_oai_error *e) {
    (void)lim;
    if (!json_is_array(v)) return wrong_type(e, f->name, "an array");
    if (json_array_size(v)) r->tools = v;
    return 0;
}

static int f_template_kwargs(pt_oai_request *r, json_t *v, const field *f, const pt_oai_limits *lim,
                             pt_oai_error *e) {
    (void)lim;
    if (!json_is_object(v)) return wrong_type(e, f->name, "an object");
    r->template_kwargs = v;
    return 0;
}

/* OpenAI's reasoning_effort; templates that read it (gpt-oss) get it as a
 * variable (completion.c), unless chat_template_kwargs sets one. */
static int f_reasoning_effort(pt_oai_request *r, json_t *v, const field *f,
                              const pt_oai_limits *lim, pt_oai_error *e) {
    (void)lim;
    static const char *const ok[] = {"minimal", "low", "medium", "high"};
    const char *s = json_string_value(v);
    if (!s) return wrong_type(e, f->name, "a string");
    for (size_t i = 0; i < PT_ARRAY_LEN(ok); i++)
        if (!strcmp(s, ok[i])) {
            r->reasoning_effort = s;
            return 0;
        }
    return fail(e, 400, "invalid_value", f->name,
                "'%s' must be one of minimal, low, medium, high", f->name);
}

/* ---- prompts ---------------------------------------------------------------------- */

static int token_ids(pt_oai_request *r, json_t *a, const pt_oai_limits *lim, pt_oai_error *e) {
    size_t n = json_array_size(a), i;
    r->prompt_ids = pt_xmalloc(sizeof(int32_t) * (n ? n : 1));
    json_t *t;
    json_array_foreach(a, i, t) {
        long long id;
        if (!get_int(t, &id))
            return fail(e, 400, "invalid_type", "prompt",
                        "prompt[%zu] is not an integer: a token-id prompt holds only integers", i);
        if (id < 0 || id >= lim->n_vocab)
            return fail(e, 400, "invalid_value", "prompt",
                        "prompt[%zu] is %lld, not a token id: ids are 0 to %d for this model", i,
                        id, lim->n_vocab - 1);
        r->prompt_ids[i] = (int32_t)id;
    }
    r->n_prompt_ids = (int)n;
    if (n == 0) return fail(e, 400, "invalid_value", "prompt", "the prompt has no tokens");
    return 0;
}

/* A string, a token id array, or a one-element array of either. */
static int f_prompt(pt_oai_request *r, json_t *v, const field *f, const pt_oai_limits *lim,
                    pt_oai_error *e) {
    if (json_is_array(v) && json_array_size(v) == 1 &&
        (json_is_string(json_array_get(v, 0)) || json_is_array(json_array_get(v, 0))))
        v = json_array_get(v, 0);
    if (json_is_string(v)) {
        r->prompt = json_string_value(v);
        r->prompt_len = json_string_length(v);
        return 0;
    }
    if (json_is_array(v) && json_array_size(v) > 0 && json_is_string(json_array_get(v, 0)))
        return fail(e, 400, "unsupported_value", f->name,
                    "one prompt per request: send several requests for several prompts");
    if (json_is_array(v)) return token_ids(r, v, lim, e);
    return wrong_type(e, f->name, "a string or an array of token ids");
}

/* Message content as one string: text, or the text parts of a list. */
static int content_text(json_t *c, size_t idx, pt_oai_error *e, json_t **out) {
    char param[48];
    snprintf(param, sizeof param, "messages[%zu].content", idx);
    if (json_is_string(c)) {
        *out = json_incref(c);
        return 0;
    }
    if (!json_is_array(c)) return wrong_type(e, param, "a string or an array of content parts");
    size_t cap = 64, len = 0, i;
    char *buf = pt_xmalloc(cap);
    json_t *part;
    json_array_foreach(c, i, part) {
        char pp[96];
        snprintf(pp, sizeof pp, "%s[%zu]", param, i);
        const char *type = json_string_value(json_object_get(part, "type"));
        json_t *text = json_object_get(part, "text");
        int rc = 0;
        if (!json_is_object(part))
            rc = wrong_type(e, pp, "a content part object ({\"type\": \"text\", \"text\": ...})");
        else if (!type)
            rc = fail(e, 400, "missing_required_parameter", pp,
                      "content part %zu of messages[%zu] has no 'type' string", i, idx);
        else if (strcmp(type, "text") != 0)
            rc = fail(e, 400, "unsupported_value", pp,
                      "only text content parts are supported (got '%.40s')", type);
        else if (!json_is_string(text)) {
            snprintf(pp, sizeof pp, "%s[%zu].text", param, i);
            rc = text ? wrong_type(e, pp, "a string")
                      : fail(e, 400, "missing_required_parameter", pp,
                             "content part %zu of messages[%zu] is of type 'text' but has no "
                             "'text'",
                             i, idx);
        }
        if (rc) {
            free(buf);
            return rc;
        }
        size_t n = json_string_length(text);
        while (len + n + 2 > cap)
            buf = pt_xrealloc(buf, cap *= 2);
        if (i) buf[len++] = '\n';
        memcpy(buf + len, json_string_value(text), n);
        len += n;
    }
    *out = json_stringn_nocheck(buf, len);
    free(buf);
    return 0;
}

static int f_messages(pt_oai_request *r, json_t *v, const field *f, const pt_oai_limits *lim,
                      pt_oai_error *e) {
    (void)lim;
    static const char *roles[] = {"system", "developer", "user", "assistant", "tool"};
    if (!json_is_array(v)) return wrong_type(e, f->name, "an array of messages");
    if (json_array_size(v) == 0)
        return fail(e, 400, "invalid_value", f->name, "'messages' must not be empty");
    r->messages = json_array();
    size_t i;
    json_t *m;
    json_array_foreach(v, i, m) {
        char param[48];
        snprintf(param, sizeof param, "messages[%zu]", i);
        if (!json_is_object(m)) return wrong_type(e, param, "an object");
        const char *role = json_string_value(json_object_get(m, "role"));
        snprintf(param, sizeof param, "messages[%zu].role", i);
        if (!role) return wrong_type(e, param, "a string");
        bool known = false;
        for (size_t k = 0; k < PT_ARRAY_LEN(roles); k++)
            known |= strcmp(role, roles[k]) == 0;
        if (!known)
            return fail(e, 400, "invalid_value", param,
                        "unknown role '%.40s' (system, developer, user, assistant, tool)", role);
        json_t *copy = json_copy(m), *c = json_object_get(m, "content"), *text = NULL;
        json_array_append_new(r->messages, copy);
        if (c && !json_is_null(c)) {
            if (content_text(c, i, e, &text)) return -1;
            json_object_set_new(copy, "content", text);
        } else if (strcmp(role, "assistant") != 0) {
            snprintf(param, sizeof param, "messages[%zu].content", i);
            return fail(e, 400, "missing_required_parameter", param, "'%s' is required", param);
        }
    }
    return 0;
}

/* ---- the table ---------------------------------------------------------------------- */

#define LIMIT(p) (&pt_gen_limits[p])
#define SAMPLING(name, p, member)                                                                  \
    { name, BOTH, f_sampling_float, LIMIT(p), offsetof(pt_sampling, member) }

static const field k_fields[] = {
    {"model", BOTH, f_model, NULL, 0},
    {"messages", PT_OAI_CHAT, f_messages, NULL, 0},
    {"prompt", PT_OAI_COMPLETION, f_prompt, NULL, 0},
    {"stream", BOTH, f_stream, NULL, 0},
    {"stream_options", BOTH, f_stream_options, NULL, 0},
    {"max_tokens", BOTH, f_max_tokens, LIMIT(PT_GP_MAX_TOKENS), 0},
    {"max_completion_tokens", BOTH, f_max_tokens, LIMIT(PT_GP_MAX_TOKENS), 0},
    SAMPLING("temperature", PT_GP_TEMPERATURE, temperature),
    SAMPLING("top_p", PT_GP_TOP_P, top_p),
    SAMPLING("min_p", PT_GP_MIN_P, min_p),
    SAMPLING("frequency_penalty", PT_GP_FREQUENCY_PENALTY, frequency_penalty),
    SAMPLING("presence_penalty", PT_GP_PRESENCE_PENALTY, presence_penalty),
    SAMPLING("repetition_penalty", PT_GP_REPETITION_PENALTY, repetition_penalty),
    {"top_k", BOTH, f_top_k, LIMIT(PT_GP_TOP_K), 0},
    {"seed", BOTH, f_seed, NULL, 0},
    {"stop", BOTH, f_stop, NULL, 0},
    {"logprobs", PT_OAI_CHAT, f_logprobs, NULL, 0},
    {"logprobs", PT_OAI_COMPLETION, f_logprobs, LIMIT(PT_GP_LOGPROBS), 0},
    {"top_logprobs", PT_OAI_CHAT, f_top_logprobs, LIMIT(PT_GP_LOGPROBS), 0},
    {"n", BOTH, f_n, NULL, 0},
    {"best_of", PT_OAI_COMPLETION, f_best_of, NULL, 0},
    {"echo", PT_OAI_COMPLETION, f_echo, NULL, 0},
    {"suffix", PT_OAI_COMPLETION, f_suffix, NULL, 0},
    {"user", BOTH, f_user, NULL, 0},
    {"prediction", BOTH, f_prediction, NULL, 0},
    {"logit_bias", BOTH, f_logit_bias, NULL, 0},
    {"ignore_eos", BOTH, f_ignore_eos, NULL, 0},
    {"response_format", BOTH, f_response_format, NULL, 0},
    {"tools", PT_OAI_CHAT, f_tools, NULL, 0},
    {"chat_template_kwargs", PT_OAI_CHAT, f_template_kwargs, NULL, 0},
    {"reasoning_effort", PT_OAI_CHAT, f_reasoning_effort, NULL, 0},
};

static void defaults(pt_oai_request *r, int kind) {
    memset(r, 0, sizeof *r);
    r->kind = kind;
    r->sampling = pt_sampling_default(); /* OpenAI's: temperature 1, top_p 1 */
    r->n = 1;
}

int pt_oai_parse(pt_oai_request *r, int kind, const char *body, size_t len,
                 const pt_oai_limits *lim, pt_oai_error *e) {
    defaults(r, kind);
    json_error_t je;
    r->root = json_loadb(body, len, 0, &je);
    /* jansson refuses \u0000 unless given JSON_ALLOW_NUL.  Petrel keeps it
     * refused, as `petrel generate` refuses a NUL on stdin (a prompt is
     * text), but says so in words rather than with jansson's flag name. */
    if (!r->root && (json_error_code(&je) == json_error_null_character ||
                     json_error_code(&je) == json_error_null_byte_in_key))
        return fail(e, 400, "invalid_value", NULL,
                    "the request contains \\u0000 (a NUL character) at line %d, column %d; "
                    "Petrel does not accept NUL in any text",
                    je.line, je.column);
    if (!r->root)
        return fail(e, 400, "invalid_json", NULL,
                    "We could not parse the JSON body of your request: %s (line %d, column %d)",
                    je.text, je.line, je.column);
    int rc = -1;
    if (!json_is_object(r->root)) {
        fail(e, 400, "invalid_json", NULL, "the request body must be a JSON object");
        goto out;
    }
    for (size_t i = 0; i < PT_ARRAY_LEN(k_fields); i++) {
        const field *f = &k_fields[i];
        json_t *v = json_object_get(r->root, f->name);
        if (!(f->kinds & kind) || !v || json_is_null(v)) continue;
        if (f->parse(r, v, f, lim, e)) goto out;
    }
    const char *required = kind == PT_OAI_CHAT ? (r->messages ? NULL : "messages")
                                               : (r->prompt || r->prompt_ids ? NULL : "prompt");
    if (required) {
        fail(e, 400, "missing_required_parameter", required, "'%s' is required", required);
        goto out;
    }
    if (kind == PT_OAI_CHAT && r->top_logprobs && !r->logprobs) {
        fail(e, 400, "invalid_value", "top_logprobs", "'top_logprobs' needs 'logprobs': true");
        goto out;
    }
    r->sampling.n_logprobs = r->logprobs ? r->top_logprobs : -1;
    if (kind == PT_OAI_COMPLETION && r->max_tokens == 0) r->max_tokens = 16; /* OpenAI's default */
    rc = 0;
out:
    if (rc) pt_oai_request_free(r);
    return rc;
}

void pt_oai_request_free(pt_oai_request *r) {
    json_decref(r->messages);
    json_decref(r->root);
    free(r->prompt_ids);
    free(r->bias_ids);
    free(r->bias_vals);
    free(r->prediction);
    pt_stop_free(&r->stop);
    memset(r, 0, sizeof *r);
}

/* ---- response pieces ------------------------------------------------------------------ */

/* Length of the valid UTF-8 character at s (1..4), or 0 if invalid. */
static size_t utf8_char(const unsigned char *s, size_t n) {
    if (s[0] < 0x80) return 1;
    size_t need = s[0] >= 0xF0 && s[0] <= 0xF4 ? 4 : s[0] >= 0xE0 ? 3 : s[0] >= 0xC2 ? 2 : 0;
    if (need == 0 || need > n || s[0] > 0xF4) return 0;
    for (size_t i = 1; i < need; i++)
        if ((s[i] & 0xC0) != 0x80) return 0;
    if (need == 3 && ((s[0] == 0xE0 && s[1] < 0xA0) || (s[0] == 0xED && s[1] > 0x9F))) return 0;
    if (need == 4 && ((s[0] == 0xF0 && s[1] < 0x90) || (s[0] == 0xF4 && s[1] > 0x8F))) return 0;
    return need;
}

json_t *pt_oai_string_lossy(const char *s, size_t len) {
    char *buf = pt_xmalloc(len * 3 + 1);
    size_t o = 0;
    for (size_t i = 0; i < len;) {
        size_t k = utf8_char((const unsigned char *)s + i, len - i);
        if (k && !(k == 1 && s[i] == 0)) {
            memcpy(buf + o, s + i, k);
            o += k, i += k;
        } else {
            memcpy(buf + o, "\xef\xbf\xbd", 3); /* U+FFFD */
            o += 3, i++;
        }
    }
    json_t *v = json_stringn(buf, o);
    free(buf);
    return v ? v : json_string("");
}

json_t *pt_oai_bytes(const char *s, size_t len) {
    json_t *a = json_array();
    for (size_t i = 0; i < len; i++)
        json_array_append_new(a, json_integer((unsigned char)s[i]));
    return a;
}

json_t *pt_oai_usage(int n_prompt, int n_completion, int n_cached) {
    return json_pack("{s:i, s:i, s:i, s:{s:i}}", "prompt_tokens", n_prompt, "completion_tokens",
                     n_completion, "total_tokens", n_prompt + n_completion, "prompt_tokens_details",
                     "cached_tokens", n_cached);
}

void pt_oai_usage_spec(json_t *usage, int n_drafted, int n_accepted) {
    json_t *d = json_object_get(usage, "completion_tokens_details");
    if (!d) json_object_set_new(usage, "completion_tokens_details", d = json_object());
    json_object_set_new(d, "accepted_prediction_tokens", json_integer(n_accepted));
    json_object_set_new(d, "rejected_prediction_tokens", json_integer(n_drafted - n_accepted));
}

json_t *pt_oai_timings(const pt_sched_stats *st) {
    int n_dec = st->n_generated > 1 ? st->n_generated - 1 : 0;
    /* the prefill computed only what the prefix cache did not hold */
    double pre = st->t_prefill > 0 ? (st->n_prompt - st->n_cached) / st->t_prefill : 0;
    double dec = st->t_decode > 0 ? n_dec / st->t_decode : 0;
    json_t *t = json_pack("{s:f, s:f, s:i, s:f, s:f, s:i, s:f, s:f, s:i}", "queue_ms", st->t_queue * 1e3,
                     "ttft_ms", st->ttft * 1e3, "prompt_tokens", st->n_prompt, "prefill_ms",
                     st->t_prefill * 1e3, "prefill_tokens_per_second", pre, "completion_tokens",
                     st->n_generated, "decode_ms", st->t_decode * 1e3, "decode_tokens_per_second",
                     dec, "preemptions", st->n_preempted);
    /* speculative decoding: tokens drafted, and those the model confirmed */
    json_object_set_new(t, "drafted_tokens", json_integer(st->n_drafted));
    json_object_set_new(t, "accepted_tokens", json_integer(st->n_accepted));
    /* jump-forward: tokens the grammar forced, computed without a forward each */
    json_object_set_new(t, "forced_tokens", json_integer(st->n_forced));
    return t;
}

const char *pt_oai_finish_reason(int finish) {
    static const char *names[] = {[PT_FINISH_NONE] = "error",
                                  [PT_FINISH_STOP] = "stop",
                                  [PT_FINISH_LENGTH] = "length",
                                  [PT_FINISH_CANCEL] = "cancelled"};
    return finish >= 0 && finish < (int)PT_ARRAY_LEN(names) ? names[finish] : "error";
}
