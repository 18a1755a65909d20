/*
 * tools.c - tool calling: request checks, the forced-call grammar, and the
 * call parser of the output filter (see tools.h).
 *
 * The parser is a small state machine over the released output text:
 *
 *   START  (Llama 3.1, Mistral) nothing but whitespace yet: a call may be
 *          the whole answer, opened by the family's marker or by its
 *          leading JSON character ('{' or '[');
 *   TEXT   content; held back only while the tail may begin the marker;
 *   CALL   inside a call: held until the close tag (Hermes) or the end of
 *          the output (the others, whose calls run to the end).
 *
 * It runs on the event loop, after stop strings and reasoning, so the
 * scheduler never sees text.
 */
#include "server/tools.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- families -------------------------------------------------------------------- */

typedef struct family {
    const char *marker; /* opens a call in the output */
    const char *close;  /* ends one, or NULL: calls run to the end */
    char lead;          /* a call may open the answer with this, unmarked; 0: no */
    const char *args;   /* the arguments' key in the call JSON */
    const char *prefix; /* the prompt's end for a forced call */
    bool array;         /* a forced call is an array of calls */
} family;

static const family k_families[] = {
    [PT_TOOLS_HERMES] = {"<tool_call>", "</tool_call>", 0, "arguments", "<tool_call>\n", false},
    [PT_TOOLS_LLAMA3] = {"<|python_tag|>", NULL, '{', "parameters", "", false},
    [PT_TOOLS_MISTRAL] = {"[TOOL_CALLS]", NULL, '[', "arguments", "[TOOL_CALLS]", true},
};

int pt_tool_family_of(const char *src) {
    if (!src) return PT_TOOLS_HERMES;
    if (strstr(src, "[TOOL_CALLS]")) return PT_TOOLS_MISTRAL;
    if (strstr(src, "<tool_call>")) return PT_TOOLS_HERMES;
    if (strstr(src, "<|python_tag|>") || strstr(src, "ipython")) return PT_TOOLS_LLAMA3;
    return PT_TOOLS_HERMES;
}

const char *pt_tools_call_prefix(int f) {
    return k_families[f].prefix;
}

/* ---- request checks --------------------------------------------------------------- */

static const json_t *tool_named(const json_t *tools, const char *name) {
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        const char *n = json_string_value(json_object_get(json_object_get(t, "function"), "name"));
        if (n && !strcmp(n, name)) return t;
    }
    return NULL;
}

static int check_tools(const json_t *tools, const char **param, pt_err *err) {
    static char where[48];
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        snprintf(where, sizeof where, "tools[%zu]", i);
        *param = where;
        const char *type = json_string_value(json_object_get(t, "type"));
        json_t *fn = json_object_get(t, "function");
        if (!json_is_object(t) || !type || strcmp(type, "function"))
            return pt_fail(err, "tools[%zu] must be {\"type\": \"function\", \"function\": {...}}",
                           i);
        if (!json_is_object(fn) || !json_is_string(json_object_get(fn, "name")))
            return pt_fail(err, "tools[%zu].function needs a \"name\" string", i);
        json_t *p = json_object_get(fn, "parameters");
        if (p && !json_is_null(p) && !json_is_object(p))
            return pt_fail(err, "tools[%zu].function.parameters must be a JSON Schema object", i);
    }
    return 0;
}

int pt_tools_check(const json_t *tools, const json_t *choice, const json_t *parallel,
                   pt_tool_choice *out, const char **param, pt_err *err) {
    memset(out, 0, sizeof *out);
    out->parallel = true;
    if (tools && json_array_size(tools) == 0) tools = NULL;
    if (parallel && !json_is_null(parallel)) {
        *param = "parallel_tool_calls";
        if (!json_is_boolean(parallel))
            return pt_fail(err, "'parallel_tool_calls' must be a boolean");
        out->parallel = out->parallel_asked = json_is_true(parallel);
    }
    if (tools && check_tools(tools, param, err)) return -1;
    *param = "tool_choice";
    out->mode = tools ? PT_TOOL_AUTO : PT_TOOL_NONE;
    if (!choice || json_is_null(choice)) return 0;
    const char *s = json_string_value(choice);
    if (s && !strcmp(s, "none")) {
        out->mode = PT_TOOL_NONE;
        return 0;
    }
    if (s && strcmp(s, "auto") && strcmp(s, "required"))
        return pt_fail(err,
                       "tool_choice '%.40s' is not one of none, auto, required or "
                       "{\"type\": \"function\", \"function\": {\"name\": ...}}",
                       s);
    if (!s && !json_is_object(choice))
        return pt_fail(err, "tool_choice must be a string or {\"type\": \"function\", "
                            "\"function\": {\"name\": ...}}");
    if (!tools && s && !strcmp(s, "auto")) return 0; /* nothing to call: plain text */
    if (!tools) return pt_fail(err, "tool_choice '%s' needs 'tools'", s ? s : "function");
    if (s) {
        out->mode = !strcmp(s, "auto") ? PT_TOOL_AUTO : PT_TOOL_REQUIRED;
        return 0;
    }
    const char *name =
        json_string_value(json_object_get(json_object_get(choice, "function"), "name"));
    if (!name) return pt_fail(err, "tool_choice.function needs a \"name\" string");
    if (!tool_named(tools, name))
        return pt_fail(err, "tool_choice names '%.64s', which is not among the tools", name);
    out->mode = PT_TOOL_NAMED;
    out->name = name;
    return 0;
}

/* ---- the forced-call grammar --------------------------------------------------------- */

/* Moves a parameter schema's $defs / definitions up to root, where its
 * "#/$defs/x" references resolve once it is nested inside the call. */
static json_t *hoist_defs(const json_t *params, json_t *root) {
    json_t *p = params && json_is_object(params) ? json_deep_copy(params)
                                                 : json_pack("{s:s}", "type", "object");
    static const char *const keys[] = {"$defs", "definitions"};
    for (size_t k = 0; k < PT_ARRAY_LEN(keys); k++) {
        json_t *d = json_object_get(p, keys[k]);
        if (!json_is_object(d)) continue;
        json_t *into = json_object_get(root, keys[k]);
        if (!into) json_object_set_new(root, keys[k], into = json_object());
        json_object_update_missing(into, d);
        json_object_del(p, keys[k]);
    }
    json_object_del(p, "$schema");
    return p;
}

static json_t *call_schema(const json_t *tool, const family *f, json_t *root) {
    const json_t *fn = json_object_get(tool, "function");
    json_t *args = hoist_defs(json_object_get(fn, "parameters"), root);
    return json_pack("{s:s, s:{s:{s:O}, s:o}, s:[s,s], s:b}", "type", "object", "properties",
                     "name", "const", json_object_get(fn, "name"), f->args, args, "required",
                     "name", f->args, "additionalProperties", 0);
}

/* The call grammar failed: name the tool whose parameters cannot be
 * enforced, rather than the wrapper schema's inner property. */
static int blame_tool(const json_t *tools, pt_err *err) {
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        json_t *root = json_object();
        json_t *p = hoist_defs(json_object_get(json_object_get(t, "function"), "parameters"), root);
        json_object_update_missing(p, root);
        json_decref(root);
        pt_grammar *g = NULL;
        pt_err e = {{0}};
        int rc = pt_grammar_from_schema_ws(&g, p, 1, &e);
        json_decref(p);
        pt_grammar_free(g);
        if (rc) return pt_fail(err, "tools[%zu].function.parameters: %s", i, e.msg);
    }
    return pt_failp(err, "tools");
}

int pt_tools_forced_grammar(const json_t *tools, const pt_tool_choice *c, int fam, pt_grammar **out,
                            pt_err *err) {
    const family *f = &k_families[fam];
    json_t *root = json_object(), *calls = json_array();
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        if (c->mode == PT_TOOL_NAMED &&
            strcmp(json_string_value(json_object_get(json_object_get(t, "function"), "name")),
                   c->name))
            continue;
        json_array_append_new(calls, call_schema(t, f, root));
    }
    json_t *one = json_array_size(calls) == 1 ? json_incref(json_array_get(calls, 0))
                                              : json_pack("{s:O}", "anyOf", calls);
    json_decref(calls);
    if (f->array) {
        json_object_set_new(root, "type", json_string("array"));
        json_object_set_new(root, "items", one);
        json_object_set_new(root, "minItems", json_integer(1));
        if (!c->parallel || c->mode == PT_TOOL_NAMED)
            json_object_set_new(root, "maxItems", json_integer(1));
    } else {
        json_object_update(root, one);
        json_decref(one);
    }
    /* one whitespace character at most, as response_format's grammar.
     * Hermes with parallel_tool_calls: true in the request: after the
     * first call's closing tag, the end or another <tool_call> block, each
     * call in its own tags as the template writes them.  Only when asked:
     * a grammar cannot make a weak model stop, and given the choice a
     * small one opens call after call until max_tokens (the bundled model
     * did, in the SDK tests), so by default a forced call is one call. */
    int rc;
    if (f->close && c->parallel_asked && c->mode == PT_TOOL_REQUIRED) {
        char open[64], close[64];
        snprintf(open, sizeof open, "\n%s", f->prefix); /* "\n<tool_call>\n" */
        snprintf(close, sizeof close, "\n%s", f->close);
        rc = pt_grammar_from_schema_calls(out, root, 1, open, close, err);
    } else {
        rc = pt_grammar_from_schema_ws(out, root, 1, err);
    }
    json_decref(root);
    return rc ? blame_tool(tools, err) : 0;
}

int pt_tools_args_grammar(const json_t *tools, const char *name, pt_grammar **out, pt_err *err) {
    const json_t *t = tool_named(tools, name);
    if (!t) return pt_fail(err, "no tool is named '%.64s'", name);
    json_t *root = json_object();
    json_t *p = hoist_defs(json_object_get(json_object_get(t, "function"), "parameters"), root);
    json_object_update_missing(p, root);
    json_decref(root);
    int rc = pt_grammar_from_schema_ws(out, p, 1, err);
    json_decref(p);
    return rc ? blame_tool(tools, err) : 0;
}

const char *pt_tools_forced_name(const json_t *tools, const pt_tool_choice *c) {
    if (c->mode == PT_TOOL_NAMED) return c->name;
    if (c->mode != PT_TOOL_REQUIRED || json_array_size(tools) != 1) return NULL;
    const json_t *fn = json_object_get(json_array_get(tools, 0), "function");
    return json_string_value(json_object_get(fn, "name"));
}

/* ---- messages for the template ------------------------------------------------------- */

void pt_tools_prepare_messages(json_t *messages) {
    size_t i, k;
    json_t *m, *tc;
    json_array_foreach(messages, i, m) {
        json_t *calls = json_object_get(m, "tool_calls");
        json_array_foreach(calls, k, tc) {
            json_t *fn = json_object_get(tc, "function");
            json_t *a = json_object_get(fn, "arguments");
            if (!json_is_string(a)) continue;
            json_t *v = json_loadb(json_string_value(a), json_string_length(a), 0, NULL);
            if (json_is_object(v))
                json_object_set_new(fn, "arguments", v);
            else
                json_decref(v);
        }
    }
}

/* ---- parsing calls --------------------------------------------------------------------- */

size_t pt_tag_partial(const char *s, size_t n, const char *tag) {
    size_t t = strlen(tag);
    for (size_t k = t - 1 < n ? t - 1 : n; k > 0; k--)
        if (!memcmp(s + n - k, tag, k)) return k;
    return 0;
}

static const char *find(const char *s, size_t n, const char *tag) {
    size_t t = strlen(tag);
    for (size_t i = 0; i + t <= n; i++)
        if (s[i] == tag[0] && !memcmp(s + i, tag, t)) return s + i;
    return NULL;
}

/* The id of a request's call number n: "call_" and 24 characters drawn
 * from the request's seed. */
static void call_id(uint64_t seed, int n, char out[32]) {
    static const char al[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    uint64_t z = seed + (uint64_t)(n + 1) * 0x9e3779b97f4a7c15ull;
    memcpy(out, "call_", 5);
    for (int i = 0; i < 24; i++) {
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        z ^= z >> 31;
        out[5 + i] = al[z % 62];
    }
    out[29] = 0;
}

/* {"name", "arguments"|"parameters"} -> OpenAI's call object, or NULL. */
static json_t *openai_call(pt_toolparse *p, const json_t *v) {
    const char *name = json_string_value(json_object_get(v, "name"));
    json_t *a = json_object_get(v, "arguments");
    if (!a) a = json_object_get(v, "parameters");
    if (!json_is_object(v) || !name || !*name || !(json_is_object(a) || json_is_string(a)))
        return NULL;
    char *args = json_is_string(a) ? strdup(json_string_value(a)) : json_dumps(a, JSON_COMPACT);
    json_t *c = pt_tool_call_new(p->id_seed, p->n_calls, name, args ? args : "{}");
    free(args);
    return c;
}

json_t *pt_tool_call_new(uint64_t id_seed, int n, const char *name, const char *args) {
    char id[32];
    call_id(id_seed, n, id);
    return json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", id, "type", "function", "function", "name",
                     name, "arguments", args);
}

/* Calls in text: JSON values (a call, or an array of calls) separated by
 * whitespace or ';'.  A new array, or NULL if anything is not a call. */
static json_t *parse_calls(pt_toolparse *p, const char *s, size_t n) {
    json_t *out = json_array();
    int base = p->n_calls;
    size_t i = 0;
    for (;;) {
        while (i < n && (isspace((unsigned char)s[i]) || s[i] == ';'))
            i++;
        if (i == n) break;
        json_error_t je;
        json_t *v = json_loadb(s + i, n - i, JSON_DISABLE_EOF_CHECK, &je);
        if (!v) goto bad;
        i += (size_t)je.position;
        json_t *items = json_is_array(v) ? json_incref(v) : json_pack("[O]", v);
        json_decref(v);
        size_t k;
        json_t *x;
        json_array_foreach(items, k, x) {
            json_t *c = openai_call(p, x);
            if (!c) {
                json_decref(items);
                goto bad;
            }
            json_array_append_new(out, c);
            p->n_calls++; /* a fresh id per call */
        }
        json_decref(items);
    }
    if (json_array_size(out)) return out;
bad:
    p->n_calls = base;
    json_decref(out);
    return NULL;
}

/* ---- the streaming parser ----------------------------------------------------------------- */

enum { S_START, S_TEXT, S_CALL };

static void buf_add(pt_toolparse *p, const char *s, size_t n) {
    if (p->len + n + 1 > p->cap) {
        while (p->len + n + 1 > p->cap)
            p->cap = p->cap ? p->cap * 2 : 256;
        p->buf = pt_xrealloc(p->buf, p->cap);
    }
    memcpy(p->buf + p->len, s, n);
    p->len += n;
}

static void buf_drop(pt_toolparse *p, size_t k) {
    memmove(p->buf, p->buf + k, p->len - k);
    p->len -= k;
}

static void text_out(pt_toolparse *p, const char *s, size_t n) {
    if (n) p->on_text(p->user, s, n);
}

/* A call's body: calls out, or the exact text it came from. */
static void settle_call(pt_toolparse *p, const char *body, size_t n, bool marked, bool closed) {
    const family *f = &k_families[p->family];
    json_t *calls = parse_calls(p, body, n);
    if (calls) {
        p->gap_len = 0; /* layout between calls */
        size_t i;
        json_t *c;
        json_array_foreach(calls, i, c) p->on_call(p->user, json_incref(c));
        json_decref(calls);
        return;
    }
    text_out(p, p->gap, p->gap_len);
    p->gap_len = 0;
    if (marked) text_out(p, f->marker, strlen(f->marker));
    text_out(p, body, n);
    if (closed) text_out(p, f->close, strlen(f->close));
}

void pt_toolparse_init(pt_toolparse *p, int family, bool forced, uint64_t id_seed,
                       pt_tool_text_fn on_text, pt_tool_call_fn on_call, void *user) {
    memset(p, 0, sizeof *p);
    p->family = family;
    p->forced = forced;
    p->id_seed = id_seed;
    p->on_text = on_text;
    p->on_call = on_call;
    p->user = user;
    p->state = forced ? S_CALL : k_families[family].lead ? S_START : S_TEXT;
}

/* The start of the answer: is it a call? */
static bool step_start(pt_toolparse *p) {
    const family *f = &k_families[p->family];
    size_t ws = 0, ml = strlen(f->marker);
    while (ws < p->len && isspace((unsigned char)p->buf[ws]))
        ws++;
    const char *s = p->buf + ws;
    size_t n = p->len - ws;
    if (n == 0) return false;
    if (n >= ml && !memcmp(s, f->marker, ml)) {
        buf_drop(p, ws + ml);
        p->state = S_CALL;
        p->marked = true;
        return true;
    }
    if (n < ml && !memcmp(s, f->marker, n)) return false; /* may still be the marker */
    p->state = s[0] == f->lead ? S_CALL : S_TEXT;
    return true;
}

/* Where the whitespace before buf[end] begins. */
static size_t ws_start(const char *s, size_t end) {
    while (end > 0 && isspace((unsigned char)s[end - 1]))
        end--;
    return end;
}

/* Whitespace is held back too: before a call it is the template's layout
 * between calls, not content (kept aside in gap in case the call turns
 * out malformed, when it goes back with the markup). */
static bool step_text(pt_toolparse *p) {
    const family *f = &k_families[p->family];
    const char *m = find(p->buf, p->len, f->marker);
    if (!m) {
        size_t end = ws_start(p->buf, p->len - pt_tag_partial(p->buf, p->len, f->marker));
        text_out(p, p->buf, end);
        buf_drop(p, end);
        return false;
    }
    size_t at = (size_t)(m - p->buf), ws = ws_start(p->buf, at);
    text_out(p, p->buf, ws);
    p->gap = pt_xrealloc(p->gap, at - ws + 1);
    memcpy(p->gap, p->buf + ws, at - ws);
    p->gap_len = at - ws;
    buf_drop(p, at + strlen(f->marker));
    p->state = S_CALL;
    p->marked = true;
    return true;
}

/* The closing tag that ends the call in buf: the first one; for a forced
 * call the first after whole JSON (the grammar saw to that), since a tag
 * inside one of its strings is not the close.  NULL if none yet. */
static const char *call_close(const pt_toolparse *p) {
    const family *f = &k_families[p->family];
    const char *c = find(p->buf, p->len, f->close);
    while (c && p->forced) {
        json_t *v = json_loadb(p->buf, (size_t)(c - p->buf), 0, NULL);
        json_decref(v);
        if (v) break;
        c = find(c + 1, p->len - (size_t)(c + 1 - p->buf), f->close);
    }
    return c;
}

static bool step_call(pt_toolparse *p) {
    const family *f = &k_families[p->family];
    if (!f->close) return false; /* runs to the end of the output */
    const char *c = call_close(p);
    if (!c) return false;
    size_t at = (size_t)(c - p->buf);
    char *body = pt_xmalloc(at + 1);
    memcpy(body, p->buf, at);
    buf_drop(p, at + strlen(f->close));
    settle_call(p, body, at, p->marked, true); /* a forced first call's marker is the prompt's */
    free(body);
    p->state = S_TEXT;
    return true;
}

void pt_toolparse_push(pt_toolparse *p, const char *s, size_t n) {
    buf_add(p, s, n);
    for (bool more = true; more;)
        more = p->state == S_START  ? step_start(p)
               : p->state == S_TEXT ? step_text(p)
                                    : step_call(p);
}

void pt_toolparse_flush(pt_toolparse *p) {
    const family *f = &k_families[p->family];
    if (p->state != S_CALL) {
        /* after calls, trailing whitespace is layout too */
        if (!(p->n_calls && ws_start(p->buf, p->len) == 0)) text_out(p, p->buf, p->len);
    } else if (p->forced || !f->close) {
        /* a call that runs to the end; a marked one puts its marker back if
         * it is not a call (an unmarked one only began with '{' or '[') */
        size_t n = p->len;
        /* a forced Hermes call may still close its tag */
        if (p->forced && f->close && n >= strlen(f->close)) {
            const char *c = call_close(p);
            if (c) n = (size_t)(c - p->buf);
        }
        settle_call(p, p->buf, n, p->marked, false);
    } else {
        text_out(p, p->gap, p->gap_len); /* unclosed: as it was written */
        text_out(p, f->marker, strlen(f->marker));
        text_out(p, p->buf, p->len);
    }
    p->len = 0;
}

void pt_toolparse_free(pt_toolparse *p) {
    free(p->buf);
    free(p->gap);
    p->buf = p->gap = NULL;
}
