/*
 * tools.h - OpenAI tool calling: `tools` and `tool_choice` checked, the
 * grammar that forces a call (tool_choice "required" or a named function),
 * and the output parser that turns a model's call markup into
 * message.tool_calls.
 *
 * Models write calls in their template family's markup:
 *
 *   Hermes / Qwen   <tool_call>{"name": ..., "arguments": {...}}</tool_call>
 *                   (one block per call, text may come before)
 *   Llama 3.1       {"name": ..., "parameters": {...}} as the whole answer,
 *                   optionally after <|python_tag|>, several split by ';'
 *   Mistral         [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]
 *
 * The family is read off the chat template's source.  A forced call puts
 * the family's opening markup at the end of the prompt and constrains the
 * output to the call's JSON, so even a tiny model writes a valid call; the
 * parser then reads the output as that JSON.
 *
 * Invariant: parsing never fails a request.  Markup that does not hold a
 * well-formed call (an unclosed tag, invalid JSON, an unknown shape) is
 * returned as content, byte for byte.
 */
#ifndef PETREL_TOOLS_H
#define PETREL_TOOLS_H

#include <jansson.h>

#include "base/base.h"
#include "grammar/grammar.h"

enum pt_tool_family { PT_TOOLS_HERMES, PT_TOOLS_LLAMA3, PT_TOOLS_MISTRAL };
enum pt_tool_mode { PT_TOOL_NONE, PT_TOOL_AUTO, PT_TOOL_REQUIRED, PT_TOOL_NAMED };

/* The family whose markup a template writes (Hermes when unknown). */
int pt_tool_family_of(const char *template_src);

typedef struct pt_tool_choice {
    int mode;         /* PT_TOOL_*; NONE when no tools are given */
    const char *name; /* PT_TOOL_NAMED: the function (borrowed) */
    bool parallel;    /* parallel_tool_calls (default true) */
    bool parallel_asked; /* given as true in the request (not the default) */
} pt_tool_choice;

/* Checks tools (an array of {"type":"function","function":{"name",...}}, or
 * NULL), tool_choice and parallel_tool_calls (each NULL when absent).  On
 * error returns -1 with err set and *param naming the field. */
int pt_tools_check(const json_t *tools, const json_t *tool_choice, const json_t *parallel,
                   pt_tool_choice *out, const char **param, pt_err *err);

/* For a forced choice: the grammar of the call JSON and the markup that
 * the prompt ends with (static).  The tools' parameter schemas must be
 * ones the grammar engine can enforce, else -1 naming the feature. */
int pt_tools_forced_grammar(const json_t *tools, const pt_tool_choice *c, int family,
                            pt_grammar **out, pt_err *err);
const char *pt_tools_call_prefix(int family);
/* The grammar of the named tool's arguments alone (a harmony call, whose
 * header names the function). */
int pt_tools_args_grammar(const json_t *tools, const char *name, pt_grammar **out, pt_err *err);
/* The function a forced call must call: the named choice's, or the only
 * tool's; NULL when the model picks among several (borrowed). */
const char *pt_tools_forced_name(const json_t *tools, const pt_tool_choice *c);

/* Messages as templates expect them: an assistant's tool_calls[].function
 * .arguments given as a JSON string becomes the object it encodes, as
 * Hugging Face templates index into it.  Changes messages in place. */
void pt_tools_prepare_messages(json_t *messages);

/* What the parser hands on: content text and completed calls. */
typedef void (*pt_tool_text_fn)(void *user, const char *s, size_t n);
typedef void (*pt_tool_call_fn)(void *user, json_t *call); /* call: a new reference */

typedef struct pt_toolparse {
    int family;
    bool forced; /* the output is the call JSON, the markup in the prompt */
    int state;   /* tools.c's parser states */
    char *buf;   /* held text: a possible tag start, or a call's body */
    size_t len, cap;
    bool marked; /* the call in CALL was opened by the marker */
    char *gap;   /* whitespace right before the marker (text if the call is not one) */
    size_t gap_len;
    int n_calls;
    uint64_t id_seed;
    pt_tool_text_fn on_text;
    pt_tool_call_fn on_call;
    void *user;
} pt_toolparse;

void pt_toolparse_init(pt_toolparse *p, int family, bool forced, uint64_t id_seed,
                       pt_tool_text_fn on_text, pt_tool_call_fn on_call, void *user);
/* Feeds output text; emits what is settled. */
void pt_toolparse_push(pt_toolparse *p, const char *s, size_t n);
/* The end of the output: settles what is held (malformed: as text). */
void pt_toolparse_flush(pt_toolparse *p);
void pt_toolparse_free(pt_toolparse *p);

/* OpenAI's call object {"id", "type": "function", "function": {"name",
 * "arguments"}} for a request's call number n (its id drawn from id_seed
 * and n); args: the arguments' JSON text. */
json_t *pt_tool_call_new(uint64_t id_seed, int n, const char *name, const char *args);

/* The longest k < strlen(tag) with s[n-k..n) == tag[0..k): bytes a filter
 * must hold back because they may begin tag. */
size_t pt_tag_partial(const char *s, size_t n, const char *tag);

#endif
