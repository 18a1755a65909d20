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
 */
#include "server/http.h"

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

struct pt_conn {
    pt_http *http;
    pt_conn *prev, *next;
    struct bufferevent *bev;
    struct event *kick; /* deferred look at pipelined input */
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
    struct event *resume; /* re-enables accepting after an accept error */
    pt_http_opts o;
    int port;
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
    evbuffer_free(c->body);
    free(c);
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
    if (content_length >= 0) {
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
    const char *key = c->http->o.api_key;
    if (!key || !*key) return true;
    const char *a = c->head.authorization;
    if (strncasecmp(a, "Bearer ", 7) != 0) return false;
    a += 7;
    while (*a == ' ')
        a++;
    return key_equal(a, key);
}

static void dispatch(pt_conn *c) {
    c->state = C_BUSY;
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

/* ---- reading ----------------------------------------------------------------------- */

/* Results of one reading step. */
enum { R_WAIT, R_AGAIN };

static int read_head(pt_conn *c) {
    struct evbuffer *in = bufferevent_get_input(c->bev);
    size_t avail = evbuffer_get_length(in);
    if (avail == 0) return R_WAIT;
    size_t look = PT_MIN(avail, (size_t)PT_HTTP_MAX_HEAD);
    const char *p = (const char *)evbuffer_pullup(in, (ev_ssize_t)look);
    size_t end = pt_http_head_end(p, look);
    if (!end && avail < PT_HTTP_MAX_HEAD) return R_WAIT;
    c->t_start = pt_now();
    c->id = ++c->http->n_requests;
    memset(&c->head, 0, sizeof c->head);
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
    if (c->head.expect_continue && c->head.minor == 1 &&
        (c->head.chunked || c->head.content_length > 0))
        evbuffer_add_printf(out_of(c), "HTTP/1.1 100 Continue\r\n\r\n");
    memset(&c->chunked_in, 0, sizeof c->chunked_in);
    c->state = C_BODY;
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
    c->body = evbuffer_new();
    if (!c->bev || !c->kick || !c->body) {
        if (c->bev)
            bufferevent_free(c->bev);
        else
            evutil_closesocket(fd);
        if (c->kick) event_free(c->kick);
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
}

static void resume_cb(evutil_socket_t fd, short what, void *arg) {
    (void)fd, (void)what;
    pt_http *h = arg;
    if (h->lis) evconnlistener_enable(h->lis);
}

/* EMFILE and friends: the pending connection stays queued, so accepting
 * again at once would spin.  Pause for a moment and keep serving the
 * connections we have. */
static void on_accept_error(struct evconnlistener *lis, void *arg) {
    pt_http *h = arg;
    pt_warn("serve: accept failed: %s; pausing new connections for 100 ms", strerror(errno));
    evconnlistener_disable(lis);
    static const struct timeval pause = {0, 100000};
    event_add(h->resume, &pause);
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
    while (h->conns) {
        h->drained = NULL;
        conn_drop(h->conns, "server stopped");
    }
    if (h->lis) evconnlistener_free(h->lis);
    if (h->resume) event_free(h->resume);
    free(h);
}
