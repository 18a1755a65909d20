/*
 * http.h - the HTTP/1.1 layer of `petrel serve`: parsing request heads and
 * bodies (http_parse.c, pure functions the tests and fuzzers drive
 * directly) and connections, routing, auth and limits (http.c).
 *
 * Why not evhttp: libevent 2.1 (Debian's) answers an oversized body or a
 * malformed request itself with an HTML page, so a client cannot get the
 * OpenAI-style JSON error it parses, and it stops reading a connection while
 * a handler runs, so a client that hangs up during a long non-streamed
 * generation goes unnoticed until the reply is written.  We keep libevent's
 * event loop, listener and bufferevents and do the (small) HTTP/1.1 framing
 * here: request line, headers, Content-Length or chunked bodies,
 * 100-continue, keep-alive and pipelining, chunked streaming responses.
 */
#ifndef PETREL_HTTP_H
#define PETREL_HTTP_H

#include <event2/buffer.h>
#include <jansson.h>

#include "base/base.h"

/* ---- parsing (http_parse.c) ---- */

#define PT_HTTP_MAX_HEAD 16384 /* request line + headers */

typedef struct pt_http_head {
    char method[16];
    char path[2048];        /* without the query string */
    int minor;              /* HTTP/1.minor */
    bool keep_alive;        /* what the client asked for (version and Connection) */
    int64_t content_length; /* -1: none given */
    bool chunked;           /* Transfer-Encoding: chunked */
    bool expect_continue;
    char authorization[512];
    char request_id[64];    /* X-Request-Id, echoed back */
    char host[256];         /* Host, as sent ("" if absent) */
    char origin[256];       /* Origin: set by browsers on cross-origin and POST requests */
    char content_type[128]; /* Content-Type */
    char cors_headers[512]; /* Access-Control-Request-Headers of a preflight, if plain tokens */
} pt_http_head;

/* Parses a request head: buf[0..len) is everything up to and including the
 * blank line.  Returns 0, or the HTTP status to answer with (400, 431, 501,
 * 505) and a message in err. */
int pt_http_parse_head(const char *buf, size_t len, pt_http_head *h, pt_err *err);

/* Length of the head at the start of buf (through the blank line), 0 if it
 * is not complete yet. */
size_t pt_http_head_end(const char *buf, size_t len);

/* Incremental decoder of a chunked request body. */
typedef struct pt_chunked {
    int state;
    uint64_t left; /* bytes left in the current chunk */
} pt_chunked;

/* Moves what it can from in to out (decoded).  Returns 1 when the body is
 * complete, 0 when it needs more input, -1 on malformed input and -2 when
 * out would exceed max bytes. */
int pt_chunked_decode(pt_chunked *c, struct evbuffer *in, struct evbuffer *out, size_t max);

/* Frames data as one chunk of a chunked response (len 0 is skipped: a
 * zero-length chunk would end the response). */
void pt_http_chunk(struct evbuffer *out, const void *data, size_t len);

const char *pt_http_reason(int status);

/* ---- request policy (http_parse.c): pure checks http.c applies ---- */

/* Whether a Content-Type value is application/json, parameters (charset)
 * allowed. */
bool pt_http_is_json_type(const char *content_type);

/* The host name of a Host header value: lower case, without the port or a
 * trailing dot; an IPv6 literal keeps its brackets ("[::1]").  Returns 0,
 * or -1 if the value is malformed. */
int pt_http_host_name(const char *host, char *out, size_t cap);

/* Whether name is localhost, 127.0.0.1 or [::1]. */
bool pt_http_is_loopback_name(const char *name);

/* Whether the comma-separated list holds item (any case; "*" holds
 * everything).  A NULL list holds nothing. */
bool pt_http_list_has(const char *list, const char *item);

/* Whether an Origin value names the server the Host header names (an
 * "http://" origin with the same host and port). */
bool pt_http_same_origin(const char *origin, const char *host);

/* ---- connections (http.c) ---- */

typedef struct pt_server pt_server;
typedef struct pt_conn pt_conn;

/* Called when the client goes away while a handler still owns the
 * connection (a response not finished).  The connection is freed right
 * after: the handler must forget it. */
typedef void (*pt_conn_gone_fn)(void *user);

/* The request being served, for handlers. */
const pt_http_head *pt_conn_head(const pt_conn *c);
pt_server *pt_conn_server(const pt_conn *c);
void pt_conn_on_gone(pt_conn *c, pt_conn_gone_fn fn, void *user);
/* Bytes waiting to be sent (a slow reader's backlog). */
size_t pt_conn_backlog(const pt_conn *c);

/* A whole response.  headers: extra "Name: value\r\n" lines or NULL. */
void pt_http_reply(pt_conn *c, int status, const char *content_type, const char *headers,
                   const void *body, size_t len);
void pt_http_reply_json(pt_conn *c, int status, const json_t *body);
/* An OpenAI-style error: {"error": {"message", "type", "param", "code"}}.
 * type NULL: chosen from the status; param and code may be NULL. */
void pt_http_error(pt_conn *c, int status, const char *type, const char *code, const char *param,
                   const char *fmt, ...) __attribute__((format(printf, 6, 7)));

/* A streamed response: headers now, then pieces, then the end. */
void pt_http_stream_begin(pt_conn *c, int status, const char *content_type, const char *headers);
/* Sends (and empties) buf as the next piece. */
void pt_http_stream_write(pt_conn *c, struct evbuffer *buf);
void pt_http_stream_end(pt_conn *c);

/* The listening side, owned by the server. */
typedef struct pt_http_opts {
    const char *host;
    int port;                  /* 0: any free port */
    const char *api_key;       /* NULL: no auth; never "" */
    size_t max_body;           /* bytes of a request body */
    int idle_timeout;          /* seconds a keep-alive connection may sit idle */
    int header_timeout;        /* seconds a request head may take once begun */
    int min_body_rate;         /* bytes/s a body must keep up, per header_timeout window; 0: off */
    int max_conns;             /* open connections before accepting pauses */
    const char *allowed_hosts; /* extra Host names (comma list, "*": any); NULL: none */
    const char *cors_origins;  /* origins allowed cross-origin (comma list, "*"); NULL: none */
} pt_http_opts;

typedef struct pt_http pt_http;
struct event_base;

int pt_http_listen(pt_http **out, struct event_base *base, pt_server *srv, const pt_http_opts *o,
                   pt_err *err);
int pt_http_port(const pt_http *h); /* the port actually bound */
/* Stops accepting; idle connections are closed, busy ones close after their
 * response.  done() is called once no connection is left. */
void pt_http_drain(pt_http *h, void (*done)(void *), void *user);
int pt_http_n_conns(const pt_http *h);
void pt_http_free(pt_http *h);

#endif
