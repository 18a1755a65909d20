/*
 * bench_http.c - a blocking HTTP/1.1 client with chunked decoding and an
 * SSE splitter, for `petrel bench serve` (see bench_http.h).
 *
 * Bytes flow read() -> head parser -> body decoder (identity, chunked or
 * until close) -> sink (collect, or SSE lines -> events).  Each stage is a
 * small state machine fed whatever the socket returned, so an event is
 * delivered as soon as its blank line arrives, however the server split its
 * writes.  Every request sends `Connection: close`: one socket per request
 * keeps the state per thread trivial and costs a loopback handshake.
 */
#include "cli/bench_http.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

double bs_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* A growable byte buffer, always NUL-terminated. */
typedef struct buf {
    char *p;
    size_t n, cap;
} buf;

static int buf_add(buf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) return -1;
        b->p = p, b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}

static int fail(bs_http_result *r, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->err, sizeof r->err, fmt, ap);
    va_end(ap);
    return -1;
}

int bs_parse_url(const char *url, char *host, size_t cap, int *port) {
    if (strncmp(url, "http://", 7) != 0) return -1;
    const char *h = url + 7, *colon = strchr(h, ':');
    const char *slash = strchr(h, '/');
    if (!colon || (slash && slash < colon)) return -1;
    size_t n = (size_t)(colon - h);
    if (n == 0 || n >= cap) return -1;
    memcpy(host, h, n);
    host[n] = 0;
    char *end;
    long p = strtol(colon + 1, &end, 10);
    if (end == colon + 1 || p <= 0 || p > 65535) return -1;
    if (*end && strcmp(end, "/") != 0 && strcmp(end, "/v1") != 0 && strcmp(end, "/v1/") != 0)
        return -1;
    *port = (int)p;
    return 0;
}

static int dial(const char *host, int port, int timeout_s, bs_http_result *r) {
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai;
    int rc = getaddrinfo(host, ps, &hints, &ai);
    if (rc) return fail(r, "cannot resolve %s: %s", host, gai_strerror(rc));
    int fd = -1;
    for (struct addrinfo *a = ai; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd >= 0 && connect(fd, a->ai_addr, a->ai_addrlen) != 0) close(fd), fd = -1;
    }
    int e = errno;
    freeaddrinfo(ai);
    if (fd < 0) return fail(r, "cannot connect to %s:%d: %s", host, port, strerror(e));
    struct timeval tv = {.tv_sec = timeout_s};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

static int send_all(int fd, const char *p, size_t n) {
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        p += w, n -= (size_t)w;
    }
    return 0;
}

/* ---- the response side: body decoder and SSE splitter ------------------------------ */

enum { BODY_LENGTH, BODY_CHUNKED, BODY_CLOSE };
enum { CH_SIZE, CH_DATA, CH_DATA_END, CH_TRAILER, CH_DONE };

typedef struct reader {
    int mode, ch_state;
    size_t remain; /* BODY_LENGTH: bytes left; CH_DATA: bytes left in chunk */
    char sz[32];   /* the chunk-size line so far */
    size_t szn;
    buf line; /* the SSE line being read */
    bool sse, stop, done;
    buf event; /* data of the SSE event being read */
    buf body;  /* collected body when not streamed */
    bs_event_fn on_event;
    void *ctx;
    double t; /* arrival time of the bytes being fed */
} reader;

static void sse_line(reader *rd, const char *s, size_t n) {
    if (n && s[n - 1] == '\r') n--;
    if (n == 0) { /* blank line: the event is complete */
        if (rd->event.n && rd->on_event(rd->ctx, rd->event.p, rd->event.n, rd->t)) rd->stop = true;
        rd->event.n = 0;
        return;
    }
    if (n >= 5 && memcmp(s, "data:", 5) == 0) {
        s += 5, n -= 5;
        if (n && *s == ' ') s++, n--;
        if (rd->event.n) buf_add(&rd->event, "\n", 1);
        buf_add(&rd->event, s, n);
    } /* comments (":...") and other fields are not used by the OpenAI stream */
}

/* Decoded body bytes: collected, or cut into SSE lines. */
static void sink(reader *rd, const char *p, size_t n) {
    if (!rd->sse) {
        buf_add(&rd->body, p, n);
        return;
    }
    while (n && !rd->stop) {
        const char *nl = memchr(p, '\n', n);
        size_t k = nl ? (size_t)(nl - p) : n;
        if (!nl) {
            buf_add(&rd->line, p, k);
            return;
        }
        if (rd->line.n) {
            buf_add(&rd->line, p, k);
            sse_line(rd, rd->line.p, rd->line.n);
            rd->line.n = 0;
        } else {
            sse_line(rd, p, k);
        }
        p += k + 1, n -= k + 1;
    }
}

/* Feeds raw body bytes; returns -1 on a malformed chunked framing. */
static int feed(reader *rd, const char *p, size_t n) {
    if (rd->mode == BODY_CLOSE) {
        sink(rd, p, n);
        return 0;
    }
    if (rd->mode == BODY_LENGTH) {
        size_t k = n < rd->remain ? n : rd->remain;
        sink(rd, p, k);
        rd->remain -= k;
        rd->done = rd->remain == 0;
        return 0;
    }
    while (n && rd->ch_state != CH_DONE) {
        if (rd->ch_state == CH_DATA) {
            size_t k = n < rd->remain ? n : rd->remain;
            sink(rd, p, k);
            p += k, n -= k, rd->remain -= k;
            if (rd->remain == 0) rd->ch_state = CH_DATA_END;
            continue;
        }
        /* CH_SIZE, CH_DATA_END, CH_TRAILER read one line at a time */
        const char *nl = memchr(p, '\n', n);
        size_t k = nl ? (size_t)(nl - p) : n;
        if (rd->ch_state == CH_SIZE) {
            if (rd->szn + k >= sizeof rd->sz) return -1;
            memcpy(rd->sz + rd->szn, p, k);
            rd->szn += k;
            if (!nl) return 0;
            rd->sz[rd->szn] = 0;
            rd->szn = 0;
            char *end;
            unsigned long long v = strtoull(rd->sz, &end, 16);
            if (end == rd->sz) return -1;
            rd->remain = (size_t)v;
            rd->ch_state = v ? CH_DATA : CH_TRAILER;
        } else if (rd->ch_state == CH_DATA_END) {
            if (!nl) return k > 1 ? -1 : 0;
            rd->ch_state = CH_SIZE;
        } else { /* trailer lines end with an empty one */
            if (!nl) return 0;
            if (k == 0 || (k == 1 && p[0] == '\r')) rd->ch_state = CH_DONE, rd->done = true;
        }
        p += k + 1, n -= k + 1;
    }
    return 0;
}

/* Parses the response head in h (NUL-terminated, up to the blank line). */
static int parse_head(const char *h, reader *rd, bs_http_result *r, bool want_sse) {
    if (sscanf(h, "HTTP/1.%*d %d", &r->status) != 1) return fail(r, "not an HTTP response");
    rd->mode = BODY_CLOSE;
    for (const char *l = strstr(h, "\r\n"); l && l[2]; l = strstr(l + 2, "\r\n")) {
        const char *v = l + 2;
        if (strncasecmp(v, "content-length:", 15) == 0) {
            rd->mode = BODY_LENGTH;
            rd->remain = (size_t)strtoull(v + 15, NULL, 10);
        } else if (strncasecmp(v, "transfer-encoding:", 18) == 0 && strstr(v, "chunked")) {
            rd->mode = BODY_CHUNKED; /* only "chunked" alone is sent by our server */
        } else if (strncasecmp(v, "content-type:", 13) == 0) {
            const char *e = strstr(v, "\r\n");
            const char *t = strstr(v, "text/event-stream");
            rd->sse = want_sse && t && (!e || t < e) && r->status == 200;
        }
    }
    if (rd->mode == BODY_LENGTH && rd->remain == 0) rd->done = true;
    return 0;
}

int bs_http(const char *host, int port, const char *method, const char *path, const char *body,
            const char *api_key, int timeout_s, bs_event_fn on_event, void *ctx,
            bs_http_result *r) {
    memset(r, 0, sizeof *r);
    int fd = dial(host, port, timeout_s, r);
    if (fd < 0) return -1;
    size_t blen = body ? strlen(body) : 0;
    char head[640], clen[80] = "", auth[300] = "";
    if (body)
        snprintf(clen, sizeof clen, "Content-Type: application/json\r\nContent-Length: %zu\r\n",
                 blen);
    if (api_key) snprintf(auth, sizeof auth, "Authorization: Bearer %.256s\r\n", api_key);
    int hn = snprintf(head, sizeof head,
                      "%s %s HTTP/1.1\r\nHost: %s:%d\r\nAccept: */*\r\nConnection: close\r\n"
                      "%s%s\r\n",
                      method, path, host, port, auth, clen);
    if (hn <= 0 || (size_t)hn >= sizeof head || send_all(fd, head, (size_t)hn) ||
        (blen && send_all(fd, body, blen))) {
        close(fd);
        return fail(r, "cannot send the request: %s", strerror(errno));
    }

    reader rd = {.on_event = on_event, .ctx = ctx};
    buf hb = {0};
    bool have_head = false;
    int rc = 0;
    char tmp[16384];
    for (;;) {
        ssize_t got = recv(fd, tmp, sizeof tmp, 0);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) {
            rc = fail(r,
                      errno == EAGAIN || errno == EWOULDBLOCK ? "no bytes from the server for %d s"
                                                              : "read failed (%d s timeout)",
                      timeout_s);
            break;
        }
        rd.t = bs_now();
        if (got == 0) { /* closed: complete only if the framing says so */
            if (!have_head)
                rc = fail(r, "the server closed the connection without answering");
            else if (rd.mode != BODY_CLOSE && !rd.done)
                rc = fail(r, "the server closed the connection mid-response");
            else if (rd.sse && rd.line.n)
                sse_line(&rd, rd.line.p, rd.line.n);
            break;
        }
        const char *p = tmp;
        size_t n = (size_t)got;
        if (!have_head) {
            size_t old = hb.n;
            if (buf_add(&hb, tmp, n)) {
                rc = fail(r, "out of memory reading the response head");
                break;
            }
            char *end = strstr(hb.p, "\r\n\r\n");
            if (!end) {
                if (hb.n > 65536) {
                    rc = fail(r, "response head larger than 64 KiB");
                    break;
                }
                continue;
            }
            size_t hlen = (size_t)(end - hb.p) + 4;
            end[2] = 0;
            if (parse_head(hb.p, &rd, r, on_event != NULL)) {
                rc = -1;
                break;
            }
            have_head = true;
            p = tmp + (hlen - old), n -= hlen - old;
        }
        if (feed(&rd, p, n)) {
            rc = fail(r, "malformed chunked body");
            break;
        }
        if (rd.done || rd.stop) break;
    }
    close(fd);
    free(hb.p);
    free(rd.line.p);
    free(rd.event.p);
    if (rc == 0 && !rd.sse) {
        r->body = rd.body.p ? rd.body.p : calloc(1, 1);
        r->body_len = rd.body.n;
    } else {
        free(rd.body.p);
    }
    return rc;
}

void bs_http_result_free(bs_http_result *r) {
    free(r->body);
    r->body = NULL;
}
