/*
 * bench_http.h - the HTTP/1.1 client `petrel bench serve` drives a server
 * with: one blocking socket per request, a request body sent with
 * Content-Length, the response read to the end (identity or chunked) and,
 * for streams, split into server-sent events as the bytes arrive.
 *
 * It is deliberately small: the load generator runs one thread per simulated
 * client, so a blocking request per thread is the simplest correct model, and
 * every event is timestamped the moment its bytes are read.
 */
#ifndef PETREL_BENCH_HTTP_H
#define PETREL_BENCH_HTTP_H

#include <stddef.h>

/* Seconds on a monotonic clock (the same origin for every thread). */
double bs_now(void);

/* Called for each SSE `data:` payload (NUL-terminated) with the time its
 * last byte arrived.  Return nonzero to stop reading. */
typedef int (*bs_event_fn)(void *ctx, const char *data, size_t len, double t);

typedef struct bs_http_result {
    int status; /* HTTP status, 0 when no response arrived */
    char *body; /* the whole body when not streamed (malloc'd, NUL-ended) */
    size_t body_len;
    char err[160]; /* set when the exchange failed below HTTP */
} bs_http_result;

/* Sends METHOD path with body (may be NULL) to host:port.  When on_event is
 * given and the answer is 200 text/event-stream, events go to it as they
 * arrive and body stays NULL; otherwise the body is collected.  Returns 0
 * when a response was read completely, -1 with r->err set otherwise.
 * timeout_s bounds each read. */
int bs_http(const char *host, int port, const char *method, const char *path, const char *body,
            const char *api_key, int timeout_s, bs_event_fn on_event, void *ctx, bs_http_result *r);
void bs_http_result_free(bs_http_result *r);

/* Splits "http://HOST:PORT" (a trailing slash or /v1 allowed) into its parts. */
int bs_parse_url(const char *url, char *host, size_t cap, int *port);

#endif
