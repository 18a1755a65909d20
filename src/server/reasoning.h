/*
 * reasoning.h - the output filter that splits a thinking model's
 * <think>...</think> from its answer: message.reasoning_content and
 * message.content (and their streamed deltas).
 *
 * Thinking templates differ in where the tag is written: Qwen3 lets the
 * model open <think> itself (and with enable_thinking false renders an
 * empty <think></think> into the prompt); DeepSeek-R1's template ends the
 * prompt with <think>\n, so the output starts inside the reasoning.  The
 * filter therefore starts either inside (the prompt ended in an open tag)
 * or at the start, where leading whitespace and then <think> opens it.
 *
 * Invariants: every output byte goes to exactly one side except the two
 * tags themselves (and whitespace right after </think>); an unclosed
 * <think> leaves the rest as reasoning (the model ran out of tokens while
 * thinking); text is held back only while it may be the start of a tag.
 */
#ifndef PETREL_REASONING_H
#define PETREL_REASONING_H

#include <stdbool.h>
#include <stddef.h>

typedef void (*pt_reason_fn)(void *user, bool reasoning, const char *s, size_t n);

typedef struct pt_reason {
    int state;
    char *buf; /* held: a possible tag start, or leading whitespace */
    size_t len, cap;
    pt_reason_fn out;
    void *user;
} pt_reason;

/* Whether a template writes <think> tags (its source mentions </think>). */
bool pt_reason_template_thinks(const char *template_src);
/* Whether a rendered prompt leaves a <think> open at its end. */
bool pt_reason_prompt_open(const char *prompt, size_t len);

void pt_reason_init(pt_reason *r, bool inside, pt_reason_fn out, void *user);
void pt_reason_push(pt_reason *r, const char *s, size_t n);
void pt_reason_flush(pt_reason *r);
void pt_reason_free(pt_reason *r);

#endif
