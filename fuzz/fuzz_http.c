/*
 * fuzz_http.c - libFuzzer target for the HTTP/1.1 request parser.
 * fuzz-layer: server
 *
 * Arbitrary bytes as what a client sends.  The head: pt_http_head_end must
 * stay inside the input, and pt_http_parse_head must either accept it (with
 * NUL-terminated fields and a Content-Length of -1 or more, never both a
 * length and chunked) or refuse it with one of the statuses it documents.
 * The bytes after the head as a chunked body: decoding them in one piece
 * and one byte at a time must agree (result and bytes), never exceed the
 * cap, and the same bytes framed by pt_http_chunk must decode to
 * themselves.  Seeds: fuzz/corpus/http/.
 */
#include <stdlib.h>
#include <string.h>

#include "server/http.h"

#define CAP 4096 /* body cap: small, so the -2 path is reached */

static void check_head(const char *buf, size_t len) {
    size_t end = pt_http_head_end(buf, len);
    if (end > len) __builtin_trap();
    pt_http_head h;
    pt_err err;
    int st = pt_http_parse_head(buf, end ? end : len, &h, &err);
    if (st == 0) {
        if (!memchr(h.method, 0, sizeof h.method) || !memchr(h.path, 0, sizeof h.path) ||
            !memchr(h.authorization, 0, sizeof h.authorization) ||
            !memchr(h.request_id, 0, sizeof h.request_id))
            __builtin_trap();
        if (h.content_length < -1 || (h.content_length >= 0 && h.chunked)) __builtin_trap();
    } else if (st != 400 && st != 431 && st != 501 && st != 505) {
        __builtin_trap();
    }
}

/* Decodes data as a chunked body, fed in pieces of step bytes (0: all at
 * once); the result, with the decoded bytes in out. */
static int decode(const uint8_t *data, size_t len, size_t step, struct evbuffer *out) {
    struct evbuffer *in = evbuffer_new();
    pt_chunked c = {0};
    int rc = 0;
    size_t at = 0;
    do {
        size_t n = step ? PT_MIN(step, len - at) : len;
        evbuffer_add(in, data + at, n);
        at += n;
        rc = pt_chunked_decode(&c, in, out, CAP);
        if (evbuffer_get_length(out) > CAP) __builtin_trap();
    } while (rc == 0 && at < len);
    evbuffer_free(in);
    return rc;
}

static void check_chunked(const uint8_t *data, size_t len) {
    struct evbuffer *a = evbuffer_new(), *b = evbuffer_new();
    int ra = decode(data, len, 0, a), rb = decode(data, len, 1, b);
    size_t na = evbuffer_get_length(a), nb = evbuffer_get_length(b);
    if (ra < -2 || ra > 1 || ra != rb) __builtin_trap();
    if (ra == 1 && (na != nb || (na && memcmp(evbuffer_pullup(a, -1), evbuffer_pullup(b, -1), na))))
        __builtin_trap();
    evbuffer_free(a), evbuffer_free(b);

    /* framing round trip: the input as two chunks and the last one */
    struct evbuffer *framed = evbuffer_new(), *back = evbuffer_new();
    size_t half = PT_MIN(len / 2, (size_t)CAP / 2), rest = PT_MIN(len - half, (size_t)CAP - half);
    pt_http_chunk(framed, data, half);
    pt_http_chunk(framed, data + half, rest);
    evbuffer_add(framed, "0\r\n\r\n", 5);
    pt_chunked c = {0};
    if (pt_chunked_decode(&c, framed, back, CAP) != 1) __builtin_trap();
    if (evbuffer_get_length(back) != half + rest ||
        (half + rest && memcmp(evbuffer_pullup(back, -1), data, half + rest)))
        __builtin_trap();
    evbuffer_free(framed), evbuffer_free(back);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    check_head((const char *)data, size);
    size_t end = pt_http_head_end((const char *)data, size);
    check_chunked(data + end, size - end);
    return 0;
}
