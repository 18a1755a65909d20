/*
 * http.c - connections, routing, auth and limits of `petrel serve`.
 *
 * A connection is a bufferevent and a small state machine:
 *
 *   HEAD   reading a request head (idle keep-alive connections wait here)
 *   BODY   reading its body (Content-Length or chunked), bounded by max_body
 *   BUSY   a handler owns the request until it completes the response;
 *          reading stays on so a client that hangs up is noticed at once
 *   CLOSING / LINGER  the last response is being flushed, then the write
 *          side is shut and what the client still sends is drained for a
 *          moment, so an early error reply is not lost to a TCP reset
 *
 * Routes are a table: method, path, whether an API key is needed, handler.
 * A path that exists with another method gets 405 (with Allow), an unknown
 * path 404, a bad key 401; a body over the limit gets 413 before it is read.
 * Every error body is OpenAI-shaped JSON.  One log line per request is
 * written when its response ends (or its client leaves).
 *
 * Hostile clients (docs/server.md, "Security model"):
 *   - Time: a request head must be complete --header-timeout seconds after
 *     its first byte (a new connection's clock starts at accept), and a body
 *     must bring --min-body-rate bytes/s over each such window, else 408 and
 *     close.  One timer per connection (`deadline`) serves both and also
 *     bounds the linger, so a trickling client cannot hold a descriptor.
 *   - Descriptors: at --max-connections (or when accept runs out of
 *     descriptors) the listener is disabled; new connections wait in the
 *     kernel's queue and accepting resumes when one of ours closes.  One log
 *     line per minute at most says so.
 *   - Browsers: before a body is read, a Host that is not ours (a
 *     DNS-rebinding page) and a cross-origin Origin that --cors-origin does
 *     not allow get 403; a POST that is not application/json gets 415 (an
 *     HTML form cannot send one, and a page's fetch of one must preflight).
 *     An allowed origin's responses carry Access-Control-Allow-Origin and
 *     OPTIONS preflights are answered.
 */
#include "server/http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>
#include <sys/socket.h>

#include "server/server_int.h"

enum { C_HEAD, C_BODY, C_BUSY, C_CLOSING, C_LINGER };

#define LINGER_SECONDS 2
#define PAUSE_LOG_SECONDS 60 /* at most one "not accepting" line per minute */
#define EMFILE_RETRY_MS 1000 /* out of descriptors with none of ours to close */

struct pt_conn {
    pt_http *http;
    pt_conn *prev, *next;
    struct bufferevent *bev;
    struct event *kick;     /* deferred look at pipelined input */
    struct event *deadline; /* head deadline, body-rate window or linger limit */
    bool head_clock;        /* the head deadline is running */
    size_t window_mark;     /* body bytes when the rate window began */
    char acao[264];         /* Access-Control-Allow-Origin of this request, "" none */
    int state;
    pt_http_head head;
    struct evbuffer *body;
    pt_chunked chunked_in;
    bool chunked_out, keep_alive;
    pt_conn_gone_fn gone;
    void *gone_user;
    uint64_t id; /* request number, for the log */
    double t_start;
    int status;
    char note[320]; /* the handler's part of the log line */
};

struct pt_http {
    pt_server *srv;
    struct event_base *base;
    struct evconnlistener *lis;
    struct event *resume; /* re-enables accepting after running out of descriptors */
    pt_http_opts o;
    int port;
    bool check_host;     /* Host is checked: a loopback bind or --allowed-hosts */
    char bound_name[64]; /* the bound address as a Host name ("127.0.0.1", "[::1]") */
    bool vary_origin;    /* responses depend on Origin: --cors-origin lists some */
    bool paused;         /* accepting paused: at the cap or out of descriptors */
    double pause_logged; /* when a pause was last logged */
    unsigned n_pauses;   /* pauses not logged since */
    pt_conn *conns;
    int n_conns;
    uint64_t n_requests;
    bool draining;
    void (*drained)(void *);
    void *drained_user;
};

/* ---- routes ---------------------------------------------------------------- */

typedef void (*route_fn)(pt_conn *c, const char *body, size_t len);

static const struct route {
    const char *method;
    const char *path;
    bool prefix; /* path is a prefix ("/v1/models/" + id) */
    bool auth;
    route_fn fn;
} k_routes[] = {
    {"GET", "/health", false, false, pt_handle_health},
    {"GET", "/metrics", false, true, pt_handle_metrics},
    {"GET", "/v1/models", false, true, pt_handle_models},
    {"GET", "/v1/models/", true, true, pt_handle_model},
    {"POST", "/v1/chat/completions", false, true, pt_handle_chat},
    {"POST", "/v1/completions", false, true, pt_handle_completions},
};

static bool route_matches(const struct route *r, const char *path) {
    size_t n = strlen(r->path);
    return r->prefix ? strncmp(path, r->path, n) == 0 && path[n] : strcmp(path, r->path) == 0;
}

/* ---- small helpers ---------------------------------------------------------- */

static struct evbuffer *out_of(pt_conn *c) {
    return bufferevent_get_output(c->bev);
}

static void set_read_timeout(pt_conn *c, bool on) {
    struct timeval tv = {c->http->o.idle_timeout, 0};
    bufferevent_set_timeouts(c->bev, on ? &tv : NULL, &tv);
}

static void arm_deadline(pt_conn *c, int seconds) {
    struct timeval tv = {seconds, 0};
    event_add(c->deadline, &tv);
}

const pt_http_head *pt_conn_head(const pt_conn *c) {
    return &c->head;
}
pt_server *pt_conn_server(const pt_conn *c) {
    return c->http->srv;
}
size_t pt_conn_backlog(const pt_conn *c) {
    return evbuffer_get_length(out_of((pt_conn *)c));
}

void pt_conn_on_gone(pt_conn *c, pt_conn_gone_fn fn, void *user) {
    c->gone = fn;
    c->gone_user = user;
}

void pt_conn_note(pt_conn *c, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->note, sizeof c->note, fmt, ap);
    va_end(ap);
}

static void log_request(pt_conn *c, const char *status_text) {
    double ms = (pt_now() - c->t_start) * 1e3;
    pt_server_log(c->http->srv, "#%llu %s %s %s %.1fms%s%s", (unsigned long long)c->id,
                  c->head.method, c->head.path, status_text, ms, c->note[0] ? " " : "", c->note);
}

/* ---- closing ----------------------------------------------------------------- */

static void resume_accepting(pt_http *h);

static void conn_free(pt_conn *c) {
    pt_http *h = c->http;
    if (c->prev)
        c->prev->next = c->next;
    else
        h->conns = c->next;
    if (c->next) c->next->prev = c->prev;
    h->n_conns--;
    bufferevent_free(c->bev);
    event_free(c->kick);
    event_free(c->deadline);
    evbuffer_free(c->body);
    free(c);
    resume_accepting(h); /* a descriptor and a slot are free again */
    if (h->draining && h->n_conns == 0 && h->drained) {
        void (*done)(void *) = h->drained;
        h->drained = NULL;
        done(h->drained_user);
    }
}

/* The client is gone (or must go) while a handler may own the request. */
static void conn_drop(pt_conn *c, const char *why) {
    if (c->state == C_BUSY) {
        char st[64];
        snprintf(st, sizeof st, "499 (%s)", why);
        log_request(c, st);
        if (c->gone) c->gone(c->gone_user);
    }
    conn_free(c);
}

/* After the last response is flushed: stop sending, read what the client
 * still sends for a moment, then close. */
static void start_linger(pt_conn *c) {
    c->state = C_LINGER;
    shutdown(bufferevent_getfd(c->bev), SHUT_WR);
    struct timeval tv = {LINGER_SECONDS, 0};
    bufferevent_set_timeouts(c->bev, &tv, NULL);
    bufferevent_enable(c->bev, EV_READ);
    arm_deadline(c, LINGER_SECONDS); /* a client that keeps sending cannot stretch it */
}

/* ---- responses ------------------------------------------------------------------ */

/* Writes the status line and headers.  content_length < 0: a stream. */
static void write_head(pt_conn *c, int status, const char *ctype, const char *headers,
                       int64_t content_length) {
    struct evbuffer *out = out_of(c);
    c->status = status;
    c->keep_alive = c->keep_alive && c->head.keep_alive && !c->http->draining &&
                    (content_length >= 0 || c->head.minor == 1);
    evbuffer_add_printf(out, "HTTP/1.1 %d %s\r\nServer: petrel\r\n", status,
                        pt_http_reason(status));
    if (ctype) evbuffer_add_printf(out, "Content-Type: %s\r\n", ctype);
    if (status == 204) {
        /* no body and, by RFC 9110, no Content-Length */
    } else if (content_length >= 0) {
        evbuffer_add_printf(out, "Content-Length: %lld\r\n", (long long)content_length);
    } else {
        c->chunked_out = c->head.minor == 1;
        evbuffer_add_printf(out, "Cache-Control: no-cache\r\n%s",
                            c->chunked_out ? "Transfer-Encoding: chunked\r\n" : "");
    }
    if (!c->keep_alive)
        evbuffer_add_printf(out, "Connection: close\r\n");
    else if (c->head.minor == 0)
        evbuffer_add_printf(out, "Connection: keep-alive\r\n");
    if (c->head.request_id[0]) evbuffer_add_printf(out, "X-Request-Id: %s\r\n", c->head.request_id);
    if (c->acao[0]) evbuffer_add_printf(out, "Access-Control-Allow-Origin: %s\r\n", c->acao);
    if (c->http->vary_origin) evbuffer_add_printf(out, "Vary: Origin\r\n");
    if (headers) evbuffer_add_printf(out, "%s", headers);
    evbuffer_add(out, "\r\n", 2);
}

static void kick_cb(evutil_socket_t fd, short what, void *arg);

/* The response is complete: log it and get ready for the next request. */
static void response_done(pt_conn *c) {
    char st[16];
    snprintf(st, sizeof st, "%d", c->status);
    log_request(c, st);
    c->gone = NULL;
    c->chunked_out = false;
    c->note[0] = 0;
    if (!c->keep_alive) {
        c->state = C_CLOSING; /* conn_write closes once flushed */
        return;
    }
    c->state = C_HEAD;
    c->head_clock = false; /* the next head's first byte starts it */
    evbuffer_drain(c->body, evbuffer_get_length(c->body));
    set_read_timeout(c, true);
    /* pipelined requests may already be buffered: look at them from the
     * event loop, not from inside the handler that just finished */
    static const struct timeval zero = {0, 0};
    event_add(c->kick, &zero);
}

void pt_http_reply(pt_conn *c, int status, const char *ctype, const char *headers, const void *body,
                   size_t len) {
    write_head(c, status, ctype, headers, (int64_t)len);
    evbuffer_add(out_of(c), body, len);
    response_done(c);
}

void pt_http_reply_json(pt_conn *c, int status, const json_t *body) {
    char *s = json_dumps(body, JSON_COMPACT);
    if (!s) {
        static const char k_fail[] =
            "{\"error\":{\"message\":\"cannot encode the response\",\"type\":\"server_error\","
            "\"param\":null,\"code\":null}}";
        pt_http_reply(c, 500, "application/json", NULL, k_fail, sizeof k_fail - 1);
        return;
    }
    size_t n = strlen(s);
    s[n] = '\n'; /* a trailing newline: friendlier to curl users, valid JSON */
    pt_http_reply(c, status, "application/json", NULL, s, n + 1);
    free(s);
}

static const char *error_type(int status) {
    switch (status) {
    case 401:
        return "authentication_error";
    case 404:
        return "not_found_error";
    case 429:
        return "rate_limit_error";
    default:
        return status >= 500 ? "server_error" : "invalid_request_error";
    }
}

/* The error object, shared with streams that fail after their headers. */
json_t *pt_error_json(int status, const char *type, const char *code, const char *param,
                      const char *msg) {
    json_t *e = json_object();
    json_object_set_new(e, "message", json_string(msg));
    json_object_set_new(e, "type", json_string(type ? type : error_type(status)));
    json_object_set_new(e, "param", param ? json_string(param) : json_null());
    json_object_set_new(e, "code", code ? json_string(code) : json_null());
    json_t *root = json_object();
    json_object_set_new(root, "error", e);
    return root;
}

/* Replies with an error body; headers as for pt_http_reply. */
static void reply_error(pt_conn *c, int status, const char *type, const char *code,
                        const char *param, const char *headers, const char *msg) {
    /* a message quoting a file or a template may not be UTF-8: keep the reply valid */
    json_t *m = json_string(msg);
    if (!m) msg = "request failed (message not UTF-8)";
    json_decref(m);
    json_t *body = pt_error_json(status, type, code, param, msg);
    if (c->note[0] == 0) pt_conn_note(c, "error=\"%.200s\"", msg);
    char *s = json_dumps(body, JSON_COMPACT);
    json_decref(body);
    size_t n = s ? strlen(s) : 0;
    pt_http_reply(c, status, "application/json", headers, s ? s : "", n);
    free(s);
}

void pt_http_error(pt_conn *c, int status, const char *type, const char *code, const char *param,
                   const char *fmt, ...) {
    char msg[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    reply_error(c, status, type, code, param, NULL, msg);
}

void pt_http_stream_begin(pt_conn *c, int status, const char *ctype, const char *headers) {
    write_head(c, status, ctype, headers, -1);
}

void pt_http_stream_write(pt_conn *c, struct evbuffer *buf) {
    size_t n = evbuffer_get_length(buf);
    if (n == 0) return;
    struct evbuffer *out = out_of(c);
    if (c->chunked_out) evbuffer_add_printf(out, "%zx\r\n", n);
    evbuffer_add_buffer(out, buf);
    if (c->chunked_out) evbuffer_add(out, "\r\n", 2);
}

void pt_http_stream_end(pt_conn *c) {
    if (c->chunked_out) evbuffer_add(out_of(c), "0\r\n\r\n", 5);
    response_done(c);
}

void pt_conn_abort(pt_conn *c, const char *why) {
    c->gone = NULL; /* the handler asked: it needs no call back */
    conn_drop(c, why);
}

/* An error found before the body was read: answer and close, since the
 * rest of the request cannot be trusted to frame the next one. */
static void early_error(pt_conn *c, int status, const char *code, const char *msg) {
    c->keep_alive = false;
    c->state = C_BUSY;
    pt_http_error(c, status, NULL, code, NULL, "%s", msg);
}

/* ---- dispatch -------------------------------------------------------------------- */

/* Constant-time comparison, so the key cannot be guessed byte by byte from
 * response times. */
static bool key_equal(const char *a, const char *b) {
    size_t na = strlen(a), nb = strlen(b);
    unsigned char d = na != nb;
    for (size_t i = 0; i < na; i++)
        d |= (unsigned char)(a[i] ^ b[i % (nb ? nb : 1)]);
    return d == 0;
}

static bool authorized(pt_conn *c) {
    const char *key = c->http->o.api_key; /* never "": the server refuses to start */
    if (!key) return true;
    const char *a = c->head.authorization;
    if (strncasecmp(a, "Bearer ", 7) != 0) return false;
    a += 7;
    while (*a == ' ')
        a++;
    return key_equal(a, key);
}

/* OPTIONS on a route: its methods, and for an allowed origin the CORS
 * preflight answer.  Browsers send preflights without credentials, so no key
 * is asked for. */
static void reply_options(pt_conn *c, const char *allow) {
    char hdr[1024];
    int n = snprintf(hdr, sizeof hdr, "Allow: %s, OPTIONS\r\n", allow);
    if (c->acao[0]) {
        const char *more = c->head.cors_headers;
        snprintf(hdr + n, sizeof hdr - (size_t)n,
                 "Access-Control-Allow-Methods: %s, OPTIONS\r\n"
                 "Access-Control-Allow-Headers: Authorization, Content-Type%s%s\r\n"
                 "Access-Control-Max-Age: 600\r\n",
                 allow, more[0] ? ", " : "", more);
    }
    pt_http_reply(c, 204, NULL, hdr, "", 0);
}

static void dispatch(pt_conn *c) {
    c->state = C_BUSY;
    event_del(c->deadline);
    set_read_timeout(c, false);
    const char *path = c->head.path;
    const struct route *hit = NULL;
    char allow[96] = "";
    for (size_t i = 0; i < PT_ARRAY_LEN(k_routes); i++) {
        const struct route *r = &k_routes[i];
        if (!route_matches(r, path)) continue;
        if (strcmp(r->method, c->head.method) == 0)
            hit = r;
        else
            snprintf(allow + strlen(allow), sizeof allow - strlen(allow), "%s%s",
                     allow[0] ? ", " : "", r->method);
    }
    if (!hit && allow[0] && strcmp(c->head.method, "OPTIONS") == 0) {
        reply_options(c, allow);
        return;
    }
    if (!hit && allow[0]) {
        char hdr[128], msg[256];
        snprintf(hdr, sizeof hdr, "Allow: %s\r\n", allow);
        snprintf(msg, sizeof msg, "%s %.100s is not supported; use %s", c->head.method, path,
                 allow);
        reply_error(c, 405, NULL, "method_not_allowed", NULL, hdr, msg);
        return;
    }
    if (!hit) {
        pt_http_error(c, 404, NULL, "not_found", NULL,
                      "no route %s %s (see /v1/models, "
                      "/v1/chat/completions, /v1/completions, /health)",
                      c->head.method, path);
        return;
    }
    if (hit->auth && !authorized(c)) {
        bool missing = c->head.authorization[0] == 0;
        pt_http_error(c, 401, "invalid_request_error", "invalid_api_key", NULL,
                      missing ? "missing API key: send the header 'Authorization: Bearer KEY'"
                              : "incorrect API key");
        return;
    }
    size_t len = evbuffer_get_length(c->body);
    const char *body = len ? (const char *)evbuffer_pullup(c->body, -1) : "";
    hit->fn(c, body, len);
}

/* ---- admission: Host, Origin, Content-Type -------------------------------------------- */

/* A DNS-rebinding page reaches a loopback server under its own name, so on
 * a loopback bind only loopback names are served.  No Host at all is not a
 * browser (HTTP/1.0 tools), and is let through. */
static bool host_allowed(const pt_http *h, const char *host) {
    if (!host[0] || !h->check_host) return true;
    char name[256];
    if (pt_http_host_name(host, name, sizeof name)) return false;
    return pt_http_is_loopback_name(name) || strcmp(name, h->bound_name) == 0 ||
           pt_http_list_has(h->o.allowed_hosts, name);
}

/* Whether a request with an Origin may go on; sets the origin its responses
 * allow.  Same-origin requests need no CORS headers. */
static bool origin_allowed(pt_conn *c) {
    const char *origin = c->head.origin, *list = c->http->o.cors_origins;
    if (pt_http_list_has(list, "*")) {
        snprintf(c->acao, sizeof c->acao, "*");
        return true;
    }
    if (pt_http_list_has(list, origin)) {
        snprintf(c->acao, sizeof c->acao, "%s", origin);
        return true;
    }
    return pt_http_same_origin(origin, c->head.host);
}

/* The checks made before a body is read; false: refused (and answered). */
static bool admit_sender(pt_conn *c) {
    char msg[600];
    if (!host_allowed(c->http, c->head.host)) {
        snprintf(msg, sizeof msg,
                 "Host '%.200s' is not served here: this server answers to localhost names "
                 "and its own address; start it with --allowed-hosts NAME to add one",
                 c->head.host);
        early_error(c, 403, "host_not_allowed", msg);
        return false;
    }
    if (c->head.origin[0] && !origin_allowed(c)) {
        snprintf(msg, sizeof msg,
                 "cross-origin request from '%.200s' refused; start the server with "
                 "--cors-origin ORIGIN to allow a web page to call it",
                 c->head.origin);
        early_error(c, 403, "origin_not_allowed", msg);
        return false;
    }
    return true;
}

static bool admit_body_type(pt_conn *c) {
    if (strcmp(c->head.method, "POST") != 0 || pt_http_is_json_type(c->head.content_type))
        return true;
    char msg[300];
    snprintf(msg, sizeof msg,
             "a POST body must be JSON: send 'Content-Type: application/json' (got %s%.128s%s)",
             c->head.content_type[0] ? "'" : "",
             c->head.content_type[0] ? c->head.content_type : "no Content-Type",
             c->head.content_type[0] ? "'" : "");
    early_error(c, 415, "unsupported_media_type", msg);
    return false;
}

/* ---- reading ----------------------------------------------------------------------- */

/* Results of one reading step. */
enum { R_WAIT, R_AGAIN };

static int read_head(pt_conn *c) {
    struct evbuffer *in = bufferevent_get_input(c->bev);
    size_t avail = evbuffer_get_length(in);
    if (avail == 0) return R_WAIT;
    if (!c->head_clock) { /* the first byte of a head on a kept-alive connection */
        c->head_clock = true;
        arm_deadline(c, c->http->o.header_timeout);
    }
    size_t look = PT_MIN(avail, (size_t)PT_HTTP_MAX_HEAD);
    const char *p = (const char *)evbuffer_pullup(in, (ev_ssize_t)look);
    size_t end = pt_http_head_end(p, look);
    if (!end && avail < PT_HTTP_MAX_HEAD) return R_WAIT;
    c->t_start = pt_now();
    c->id = ++c->http->n_requests;
    memset(&c->head, 0, sizeof c->head);
    c->acao[0] = 0;
    event_del(c->deadline);
    if (!end) {
        snprintf(c->head.method, sizeof c->head.method, "-");
        snprintf(c->head.path, sizeof c->head.path, "-");
        early_error(c, 431, "request_header_too_large", "request head larger than 16 KiB");
        return R_WAIT;
    }
    pt_err err = {{0}};
    int status = pt_http_parse_head(p, end, &c->head, &err);
    evbuffer_drain(in, end);
    if (status) {
        if (!c->head.method[0]) snprintf(c->head.method, sizeof c->head.method, "-");
        if (!c->head.path[0]) snprintf(c->head.path, sizeof c->head.path, "-");
        early_error(c, status, "invalid_request", err.msg);
        return R_WAIT;
    }
    c->keep_alive = true;
    if (!admit_sender(c)) return R_WAIT;
    size_t max = c->http->o.max_body;
    if (c->head.content_length > 0 && (uint64_t)c->head.content_length > max) {
        char msg[160];
        snprintf(msg, sizeof msg,
                 "request body of %lld bytes is over the limit of %zu bytes "
                 "(--max-body)",
                 (long long)c->head.content_length, max);
        early_error(c, 413, "request_too_large", msg);
        return R_WAIT;
    }
    if (!admit_body_type(c)) return R_WAIT;
    if (c->head.expect_continue && c->head.minor == 1 &&
        (c->head.chunked || c->head.content_length > 0))
        evbuffer_add_printf(out_of(c), "HTTP/1.1 100 Continue\r\n\r\n");
    memset(&c->chunked_in, 0, sizeof c->chunked_in);
    c->state = C_BODY;
    c->window_mark = 0;
    if (c->http->o.min_body_rate > 0) arm_deadline(c, c->http->o.header_timeout);
    return R_AGAIN;
}

static int read_body(pt_conn *c) {
    struct evbuffer *in = bufferevent_get_input(c->bev);
    if (c->head.chunked) {
        int rc = pt_chunked_decode(&c->chunked_in, in, c->body, c->http->o.max_body);
        if (rc == 0) return R_WAIT;
        if (rc < 0) {
            char msg[128];
            snprintf(msg, sizeof msg,
                     rc == -2 ? "request body is over the limit of %zu bytes (--max-body)"
                              : "malformed chunked body",
                     c->http->o.max_body);
            early_error(c, rc == -2 ? 413 : 400, rc == -2 ? "request_too_large" : "invalid_request",
                        msg);
            return R_WAIT;
        }
    } else {
        size_t want = c->head.content_length > 0 ? (size_t)c->head.content_length : 0;
        size_t have = evbuffer_get_length(c->body);
        size_t k = PT_MIN(want - have, evbuffer_get_length(in));
        if (k) evbuffer_remove_buffer(in, c->body, k);
        if (have + k < want) return R_WAIT;
    }
    dispatch(c);
    return c->state == C_HEAD ? R_AGAIN : R_WAIT;
}

static void process_input(pt_conn *c) {
    struct evbuffer *in = bufferevent_get_input(c->bev);
    for (;;) {
        int r = R_WAIT;
        switch (c->state) {
        case C_HEAD:
            if (c->http->draining && evbuffer_get_length(in) == 0) return;
            r = read_head(c);
            break;
        case C_BODY:
            r = read_body(c);
            break;
        case C_BUSY:
            /* pipelined input waits, within reason */
            if (evbuffer_get_length(in) > c->http->o.max_body + PT_HTTP_MAX_HEAD) {
                conn_drop(c, "too much pipelined input");
                return;
            }
            return;
        default:
            evbuffer_drain(in, evbuffer_get_length(in));
            return;
        }
        if (r == R_WAIT) return;
    }
}

static void conn_read(struct bufferevent *bev, void *arg) {
    (void)bev;
    process_input(arg);
}

static void kick_cb(evutil_socket_t fd, short what, void *arg) {
    (void)fd, (void)what;
    pt_conn *c = arg;
    if (c->state == C_HEAD && c->http->draining &&
        evbuffer_get_length(bufferevent_get_input(c->bev)) == 0) {
        conn_free(c);
        return;
    }
    process_input(c);
}

/* A request that is too slow gets 408 (its head may be only partly read). */
static void too_slow(pt_conn *c, const char *msg) {
    if (c->state == C_HEAD) {
        c->t_start = pt_now();
        c->id = ++c->http->n_requests;
        memset(&c->head, 0, sizeof c->head);
        snprintf(c->head.method, sizeof c->head.method, "-");
        snprintf(c->head.path, sizeof c->head.path, "-");
    }
    early_error(c, 408, "request_timeout", msg);
}

static void deadline_cb(evutil_socket_t fd, short what, void *arg) {
    (void)fd, (void)what;
    pt_conn *c = arg;
    const pt_http_opts *o = &c->http->o;
    char msg[200];
    switch (c->state) {
    case C_HEAD:
        if (evbuffer_get_length(bufferevent_get_input(c->bev)) == 0) {
            conn_free(c); /* a new connection that never spoke: nobody to answer */
            return;
        }
        snprintf(msg, sizeof msg, "request head not complete after %d s (--header-timeout)",
                 o->header_timeout);
        too_slow(c, msg);
        return;
    case C_BODY: {
        size_t have = evbuffer_get_length(c->body), got = have - c->window_mark;
        if (got >= (size_t)o->min_body_rate * (size_t)o->header_timeout) {
            c->window_mark = have;
            arm_deadline(c, o->header_timeout);
            return;
        }
        snprintf(msg, sizeof msg,
                 "request body arrived at %zu bytes/s, under the minimum of %d (--min-body-rate)",
                 got / (size_t)o->header_timeout, o->min_body_rate);
        too_slow(c, msg);
        return;
    }
    case C_LINGER:
        conn_free(c);
        return;
    default:
        return;
    }
}

static void conn_write(struct bufferevent *bev, void *arg) {
    (void)bev;
    pt_conn *c = arg;
    if (c->state == C_CLOSING) start_linger(c);
}

static void conn_event(struct bufferevent *bev, short what, void *arg) {
    (void)bev;
    pt_conn *c = arg;
    const char *why = what & BEV_EVENT_EOF       ? "client closed"
                      : what & BEV_EVENT_TIMEOUT ? "timeout"
                                                 : "connection error";
    conn_drop(c, why);
}

/* ---- listening ----------------------------------------------------------------------- */

/* Stops accepting: connections wait in the kernel's queue (the listener's
 * backlog) instead of costing a descriptor here.  Logged once a minute at
 * most, however often it happens. */
static void pause_accepting(pt_http *h, const char *why) {
    if (!h->lis || h->paused) return;
    evconnlistener_disable(h->lis);
    h->paused = true;
    h->n_pauses++;
    double now = pt_now();
    if (h->pause_logged > 0 && now - h->pause_logged < PAUSE_LOG_SECONDS) return;
    if (h->n_pauses > 1)
        pt_warn("serve: %s; not accepting new connections until one closes (%u pauses in the "
                "last %d s)",
                why, h->n_pauses, PAUSE_LOG_SECONDS);
    else
        pt_warn("serve: %s; not accepting new connections until one closes", why);
    h->pause_logged = now;
    h->n_pauses = 0;
}

static void resume_accepting(pt_http *h) {
    if (!h->paused || !h->lis || h->draining || h->n_conns >= h->o.max_conns) return;
    h->paused = false;
    event_del(h->resume);
    evconnlistener_enable(h->lis);
}

static void on_accept(struct evconnlistener *lis, evutil_socket_t fd, struct sockaddr *sa,
                      int salen, void *arg) {
    (void)lis, (void)sa, (void)salen;
    pt_http *h = arg;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one); /* SSE: send each token now */
    pt_conn *c = pt_xcalloc(1, sizeof *c);
    c->http = h;
    c->bev = bufferevent_socket_new(h->base, fd, BEV_OPT_CLOSE_ON_FREE);
    c->kick = evtimer_new(h->base, kick_cb, c);
    c->deadline = evtimer_new(h->base, deadline_cb, c);
    c->body = evbuffer_new();
    if (!c->bev || !c->kick || !c->deadline || !c->body) {
        if (c->bev)
            bufferevent_free(c->bev);
        else
            evutil_closesocket(fd);
        if (c->kick) event_free(c->kick);
        if (c->deadline) event_free(c->deadline);
        if (c->body) evbuffer_free(c->body);
        free(c);
        return;
    }
    c->next = h->conns;
    if (h->conns) h->conns->prev = c;
    h->conns = c;
    h->n_conns++;
    bufferevent_setcb(c->bev, conn_read, conn_write, conn_event, c);
    set_read_timeout(c, true);
    bufferevent_enable(c->bev, EV_READ | EV_WRITE);
    c->head_clock = true; /* a new connection's first head is due from now */
    c->t_start = pt_now();
    arm_deadline(c, h->o.header_timeout);
    if (h->n_conns >= h->o.max_conns) {
        char why[96];
        snprintf(why, sizeof why, "%d connections open, the limit (--max-connections)", h->n_conns);
        pause_accepting(h, why);
    }
}

static void resume_cb(evutil_socket_t fd, short what, void *arg) {
    (void)fd, (void)what;
    resume_accepting(arg);
}

/* EMFILE and friends: the pending connection stays queued, so accepting
 * again at once would spin.  Pause until one of our connections closes (or
 * a second passes, if the descriptors went elsewhere) and keep serving the
 * connections we have. */
static void on_accept_error(struct evconnlistener *lis, void *arg) {
    (void)lis;
    pt_http *h = arg;
    char why[160];
    snprintf(why, sizeof why, "accept failed with %d connections open: %s", h->n_conns,
             strerror(errno));
    pause_accepting(h, why);
    static const struct timeval retry = {EMFILE_RETRY_MS / 1000, (EMFILE_RETRY_MS % 1000) * 1000};
    event_add(h->resume, &retry);
}

/* The bound address: whether it is loopback, and its name in a Host header. */
static bool bound_is_loopback(const struct sockaddr_storage *ss, char *name, size_t cap) {
    char a[INET6_ADDRSTRLEN] = "";
    if (ss->ss_family == AF_INET) {
        const struct in_addr *in = &((const struct sockaddr_in *)ss)->sin_addr;
        inet_ntop(AF_INET, in, a, sizeof a);
        snprintf(name, cap, "%s", a);
        return (ntohl(in->s_addr) >> 24) == 127;
    }
    const struct in6_addr *in6 = &((const struct sockaddr_in6 *)ss)->sin6_addr;
    inet_ntop(AF_INET6, in6, a, sizeof a);
    snprintf(name, cap, "[%s]", a);
    return IN6_IS_ADDR_LOOPBACK(in6) || (IN6_IS_ADDR_V4MAPPED(in6) && in6->s6_addr[12] == 127);
}

int pt_http_listen(pt_http **out, struct event_base *base, pt_server *srv, const pt_http_opts *o,
                   pt_err *err) {
    *out = NULL;
    char port[16];
    snprintf(port, sizeof port, "%d", o->port);
    struct evutil_addrinfo hints = {0}, *ai = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = EVUTIL_AI_PASSIVE | EVUTIL_AI_ADDRCONFIG;
    int gai = evutil_getaddrinfo(o->host, port, &hints, &ai);
    if (gai) return pt_fail(err, "cannot resolve --host %s: %s", o->host, evutil_gai_strerror(gai));
    pt_http *h = pt_xcalloc(1, sizeof *h);
    h->srv = srv;
    h->base = base;
    h->o = *o;
    h->lis = evconnlistener_new_bind(base, on_accept, h, LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE,
                                     1024, ai->ai_addr, (int)ai->ai_addrlen);
    int e = errno;
    evutil_freeaddrinfo(ai);
    if (!h->lis) {
        free(h);
        return pt_fail(err, "cannot listen on %s:%d: %s", o->host, o->port, strerror(e));
    }
    evconnlistener_set_error_cb(h->lis, on_accept_error);
    h->resume = evtimer_new(base, resume_cb, h);
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    getsockname(evconnlistener_get_fd(h->lis), (struct sockaddr *)&ss, &sl);
    h->port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                             : ((struct sockaddr_in *)&ss)->sin_port);
    bool loopback = bound_is_loopback(&ss, h->bound_name, sizeof h->bound_name);
    h->check_host = (loopback || o->allowed_hosts) && !pt_http_list_has(o->allowed_hosts, "*");
    h->vary_origin = o->cors_origins && !pt_http_list_has(o->cors_origins, "*");
    *out = h;
    return 0;
}

int pt_http_port(const pt_http *h) {
    return h->port;
}
int pt_http_n_conns(const pt_http *h) {
    return h->n_conns;
}

void pt_http_drain(pt_http *h, void (*done)(void *), void *user) {
    h->draining = true;
    h->drained = done;
    h->drained_user = user;
    if (h->lis) {
        evconnlistener_free(h->lis);
        h->lis = NULL;
    }
    /* idle connections go now; busy ones finish their response first */
    for (pt_conn *c = h->conns, *next; c; c = next) {
        next = c->next;
        if (c->state == C_HEAD || c->state == C_LINGER)
            conn_free(c);
        else
            c->keep_alive = false;
    }
    if (h->n_conns == 0 && h->drained) {
        h->drained = NULL;
        done(user);
    }
}

void pt_http_free(pt_http *h) {
    if (!h) return;
    h->draining = true; /* closing connections must not re-enable accepting */
    while (h->conns) {
        h->drained = NULL;
        conn_drop(h->conns, "server stopped");
    }
    if (h->lis) evconnlistener_free(h->lis);
    if (h->resume) event_free(h->resume);
    free(h);
}
