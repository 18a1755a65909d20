/*
 * jinja.h - our interpreter of the Jinja subset that chat templates use.
 *
 * A model's tokenizer_config.json carries its prompt format as a Jinja
 * template.  No C library renders Jinja, so this is ours.  The reference is
 * not Python's Jinja2 but @huggingface/jinja (the renderer transformers.js
 * uses): for every template and context it accepts we produce the same
 * bytes, quirks included (see docs/chat-templates.md for the list), and
 * where it fails we fail too.
 *
 * Templates and contexts are untrusted.  Compiling bounds the nesting depth
 * of the syntax tree; rendering bounds recursion, loop iterations, memory
 * and output size (pt_jinja_opts), so a hostile template fails cleanly
 * instead of exhausting the process.
 *
 * A compiled template is immutable: render it from any number of threads at
 * once.
 */
#ifndef PETREL_JINJA_H
#define PETREL_JINJA_H

#include <jansson.h>
#include <time.h>

#include "base/base.h"

typedef struct pt_jinja pt_jinja;

/* Return value of pt_jinja_render() when the template itself gave up by
 * calling raise_exception(msg): err->msg is then msg, verbatim, fit to show
 * a user ("Conversation roles must alternate user/assistant/..."). */
#define PT_JINJA_RAISED (-2)

/* Limits of one render.  A zero field means its default. */
typedef struct pt_jinja_opts {
    size_t max_output;  /* bytes of rendered text (default 16 MiB) */
    size_t max_memory;  /* bytes of values the render may allocate (default 256 MiB) */
    uint64_t max_steps; /* loop iterations + macro calls + range() items (default 10M) */
    int max_depth;      /* nested evaluation depth: expressions, blocks, macro calls (default 1000) */
    time_t now;         /* the clock strftime_now() reads (default: time(NULL)) */
} pt_jinja_opts;

/* Compiles len bytes of template source.  Syntax errors carry the line and
 * column ("jinja 3:17: Expected closing statement token").  The source must
 * be valid UTF-8. */
int pt_jinja_compile(pt_jinja **out, const char *src, size_t len, pt_err *err);

/* Renders with the variables of ctx (a JSON object, or NULL for none) into
 * a malloc'd NUL-terminated string (*out; *out_len without the NUL, may be
 * NULL).  opts may be NULL.  Returns 0, -1 on an error (err says what and
 * where), or PT_JINJA_RAISED. */
int pt_jinja_render(const pt_jinja *t, const json_t *ctx, const pt_jinja_opts *opts, char **out,
                    size_t *out_len, pt_err *err);

void pt_jinja_free(pt_jinja *t);

#endif
