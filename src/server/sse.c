/*
 * sse.c - Server-Sent Events framing (see sse.h).
 */
#include "server/sse.h"

#include <stdlib.h>

void pt_sse_event(struct evbuffer *out, const char *data, size_t len) {
    size_t start = 0;
    for (size_t i = 0; i <= len; i++) {
        if (i < len && data[i] != '\n') continue;
        size_t end = i;
        if (end > start && data[end - 1] == '\r') end--; /* CRLF counts as one break */
        evbuffer_add(out, "data: ", 6);
        evbuffer_add(out, data + start, end - start);
        evbuffer_add(out, "\n", 1);
        start = i + 1;
    }
    evbuffer_add(out, "\n", 1);
}

int pt_sse_json(struct evbuffer *out, const json_t *v) {
    char *s = json_dumps(v, JSON_COMPACT);
    if (!s) return -1;
    pt_sse_event(out, s, strlen(s));
    free(s);
    return 0;
}

void pt_sse_done(struct evbuffer *out) {
    evbuffer_add(out, "data: [DONE]\n\n", 14);
}
