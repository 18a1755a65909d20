/*
 * message.h - the last stage of a chat answer's output filter: released
 * text split into reasoning, content and tool calls (reasoning.h, then
 * tools.h on what is not reasoning; for harmony templates harmony.h does
 * both), and the OpenAI JSON of each part.
 *
 * The splitter collects what its filters emit until the caller takes it:
 * a stream takes it per chunk, a whole answer once at the end.  It runs
 * on the event loop only.
 */
#ifndef PETREL_MESSAGE_H
#define PETREL_MESSAGE_H

#include <jansson.h>

#include "server/harmony.h"
#include "server/reasoning.h"
#include "server/tools.h"

typedef struct pt_text {
    char *s;
    size_t len, cap;
} pt_text;

typedef struct pt_msgsplit {
    bool think, tools; /* which filters run */
    bool harmony;      /* the harmony splitter instead of both */
    pt_reason rs;
    pt_harmony hm;
    pt_toolparse tp;
    pt_text reasoning, content; /* emitted, not taken yet */
    json_t *calls;              /* emitted, not taken yet */
    int n_calls;                /* all calls so far (their stream index) */
} pt_msgsplit;

typedef struct pt_msgsplit_opts {
    bool think;        /* the template writes <think> */
    bool think_inside; /* ... and the prompt left one open */
    bool tools;        /* parse tool calls (tools given, choice not none) */
    int tool_family;
    bool tool_forced; /* the output is the call's JSON (tools.h) */
    uint64_t id_seed; /* call ids */
    bool harmony;     /* the template writes harmony (harmony.h) */
    bool harmony_final; /* ... and the prompt opened the final channel */
    const char *forced_name; /* harmony, tool_forced: the function the prompt's
                                header names, or NULL (borrowed until init) */
} pt_msgsplit_opts;

void pt_msgsplit_init(pt_msgsplit *m, const pt_msgsplit_opts *o);
void pt_msgsplit_push(pt_msgsplit *m, const char *s, size_t n);
/* The end of the answer: settles what the filters hold. */
void pt_msgsplit_finish(pt_msgsplit *m);
/* Forgets what was taken (the texts and calls above). */
void pt_msgsplit_taken(pt_msgsplit *m);
void pt_msgsplit_free(pt_msgsplit *m);

/* A whole answer's message: role, content (null when only calls and
 * whitespace came), reasoning_content and tool_calls when there are any. */
json_t *pt_msgsplit_message(const pt_msgsplit *m);
/* Streamed deltas of what was emitted since the last take, in order:
 * reasoning and content in one delta, then for each call OpenAI's two
 * chunks (index, id, type, name and empty arguments; then the arguments).
 * Returns an array of delta objects (possibly empty). */
json_t *pt_msgsplit_deltas(const pt_msgsplit *m);

#endif
