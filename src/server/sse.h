/*
 * sse.h - Server-Sent Events framing, as OpenAI streams use it.
 *
 * An event is one or more "data: LINE\n" lines and a blank line.  OpenAI
 * sends one JSON object per event and ends the stream with "data: [DONE]".
 * JSON from jansson never contains a raw newline, but the framing does not
 * rely on that: a payload with newlines becomes several data lines, which
 * a conforming client joins back with "\n".
 */
#ifndef PETREL_SSE_H
#define PETREL_SSE_H

#include <event2/buffer.h>
#include <jansson.h>

#include "base/base.h"

/* Appends the event carrying data[0..len). */
void pt_sse_event(struct evbuffer *out, const char *data, size_t len);
/* Appends the event carrying the compact JSON of v.  Returns -1 if v cannot
 * be encoded (then nothing is appended). */
int pt_sse_json(struct evbuffer *out, const json_t *v);
/* Appends "data: [DONE]\n\n". */
void pt_sse_done(struct evbuffer *out);

#endif
