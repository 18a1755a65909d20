/*
 * harmony.h - the output filter for OpenAI's harmony format (gpt-oss):
 * the answer is a sequence of messages, each a header, <|message|>, a body
 * and a terminator, and the header says where the body goes:
 *
 *   <|channel|>analysis<|message|>...<|end|>         reasoning_content
 *   <|start|>assistant<|channel|>final<|message|>...<|return|>   content
 *   <|channel|>commentary to=functions.NAME <|constrain|>json<|message|>
 *       {"a": 1}<|call|>                             a tool call
 *
 * The recipient (to=...) may also stand right after the role, before
 * <|channel|>; the content type is "<|constrain|>json" or a bare "json".
 * Commentary without a recipient (a preamble the user is meant to see) is
 * content.  The chat template ends the prompt with <|start|>assistant, so
 * the output begins with a header.  The markers are special tokens: the
 * caller detokenizes with special tokens kept, and <|call|> / <|return|>
 * may never arrive (they end generation), so the end of the output ends a
 * body too.
 *
 * Invariants: every byte of a body goes to exactly one side; markers and
 * headers go nowhere; text where a header should start but that does not
 * begin like one (<|..., to=...), a header that runs past 512 bytes
 * without <|message|> (a model that does not write harmony), a call whose
 * body is not a JSON object, or a call when tools were not asked for, is
 * content, byte for byte (the latter two: the body); a header cut short
 * by the end of the output is dropped;
 * parsing never fails a request.  Text is held back only while it may
 * begin a marker, and a call's body until it ends.
 */
#ifndef PETREL_HARMONY_H
#define PETREL_HARMONY_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Whether a template writes harmony (its source has <|channel|>). */
bool pt_harmony_template(const char *template_src);

typedef void (*pt_harmony_text_fn)(void *user, bool reasoning, const char *s, size_t n);
typedef void (*pt_harmony_call_fn)(void *user, json_t *call); /* a new reference */

typedef struct pt_harmony {
    int state;
    int sink;   /* the body's destination (harmony.c's SINK_*) */
    char *name; /* the called function (SINK_CALL), or NULL: the body is
                   {"name": ..., "arguments": ...} (a forced call) */
    char *buf;  /* held: a header, a possible marker start, or a call's body */
    size_t len, cap;
    bool calls;  /* tools were given: functions.NAME messages are calls */
    int n_calls; /* made so far (call ids) */
    uint64_t id_seed;
    pt_harmony_text_fn on_text;
    pt_harmony_call_fn on_call;
    void *user;
} pt_harmony;

void pt_harmony_init(pt_harmony *h, bool calls, uint64_t id_seed, pt_harmony_text_fn on_text,
                     pt_harmony_call_fn on_call, void *user);
/* The prompt already holds a forced call's header: the output is that
 * call's body.  name: the function, or NULL when the body names it. */
void pt_harmony_forced(pt_harmony *h, const char *name);
/* The prompt opened the final channel (a grammar-constrained answer):
 * the output is content. */
void pt_harmony_final(pt_harmony *h);
void pt_harmony_push(pt_harmony *h, const char *s, size_t n);
/* The end of the output: a body in progress ends here. */
void pt_harmony_flush(pt_harmony *h);
void pt_harmony_free(pt_harmony *h);

/* Messages as the harmony template expects them (changed in place): an
 * assistant call's "content": null is dropped (the template tests
 * `"<|channel|>..." in message.content`, which fails on null, and the
 * openai client sends null there), and a reasoning_content we returned
 * becomes the "thinking" the template renders as the analysis channel. */
void pt_harmony_prepare_messages(json_t *messages);

/* The header a forced call's prompt ends with (after <|start|>assistant):
 * the named function's, or with name NULL a JSON commentary whose body
 * names the function (malloc'd). */
char *pt_harmony_call_header(const char *name);
/* The header of a final answer, for a grammar that constrains the answer
 * from its first token (response_format). */
#define PT_HARMONY_FINAL_HEADER "<|channel|>final<|message|>"

#endif
