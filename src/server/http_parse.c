/*
 * http_parse.c - HTTP/1.1 request heads and chunked bodies, as pure
 * functions over bytes (RFC 9112).
 *
 * The input is untrusted, so the parser is strict where leniency would let
 * two parties disagree about where a request ends (the request-smuggling
 * family): a Content-Length that is not plain digits, two different
 * Content-Lengths, Content-Length together with Transfer-Encoding, a
 * transfer coding other than chunked, obsolete header folding and
 * whitespace before a header's colon are all rejected.  A bare LF is
 * accepted as a line end, as RFC 9112 allows.  Two Host or two Origin
 * headers are rejected too: the checks below must see the one value.
 *
 * The request-policy helpers (JSON content types, Host names, allow lists,
 * same origin) are pure string checks as well; http.c decides with them.
 */
#include "server/http.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>

static const struct {
    int status;
    const char *reason;
} k_reasons[] = {
    {100, "Continue"},
    {200, "OK"},
    {204, "No Content"},
    {400, "Bad Request"},
    {401, "Unauthorized"},
    {403, "Forbidden"},
    {404, "Not Found"},
    {405, "Method Not Allowed"},
    {408, "Request Timeout"},
    {411, "Length Required"},
    {413, "Content Too Large"},
    {414, "URI Too Long"},
    {415, "Unsupported Media Type"},
    {417, "Expectation Failed"},
    {422, "Unprocessable Content"},
    {429, "Too Many Requests"},
    {431, "Request Header Fields Too Large"},
    {500, "Internal Server Error"},
    {501, "Not Implemented"},
    {503, "Service Unavailable"},
    {505, "HTTP Version Not Supported"},
};

const char *pt_http_reason(int status) {
    for (size_t i = 0; i < PT_ARRAY_LEN(k_reasons); i++)
        if (k_reasons[i].status == status) return k_reasons[i].reason;
    return "Unknown";
}

size_t pt_http_head_end(const char *buf, size_t len) {
    for (size_t i = 0; i < len; i++) {
        if (buf[i] != '\n') continue;
        if (i + 1 < len && buf[i + 1] == '\n') return i + 2;
        if (i + 2 < len && buf[i + 1] == '\r' && buf[i + 2] == '\n') return i + 3;
    }
    return 0;
}

/* Sets the message and returns the status to answer with. */
static int refuse(pt_err *err, int status, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
    }
    return status;
}

/* RFC 9110 token characters (method names, header names). */
static bool is_tchar(int c) {
    return isalnum(c) || (c && strchr("!#$%&'*+-.^_`|~", c));
}

/* The next line of [*p, end): sets *len without the CR LF and advances *p. */
static const char *next_line(const char **p, const char *end, size_t *len) {
    const char *s = *p, *nl = memchr(s, '\n', (size_t)(end - s));
    if (!nl) nl = end;
    *len = (size_t)(nl - s);
    if (*len && s[*len - 1] == '\r') (*len)--;
    *p = nl < end ? nl + 1 : end;
    return s;
}

/* Whether a comma-separated header value contains token (any case). */
static bool has_token(const char *v, size_t n, const char *token) {
    size_t tl = strlen(token);
    for (size_t i = 0; i < n;) {
        while (i < n && (v[i] == ' ' || v[i] == '\t' || v[i] == ','))
            i++;
        size_t j = i;
        while (j < n && v[j] != ',')
            j++;
        size_t k = j;
        while (k > i && (v[k - 1] == ' ' || v[k - 1] == '\t'))
            k--;
        if (k - i == tl && strncasecmp(v + i, token, tl) == 0) return true;
        i = j;
    }
    return false;
}

static int parse_request_line(const char *s, size_t n, pt_http_head *h, pt_err *err) {
    const char *sp1 = memchr(s, ' ', n);
    if (!sp1 || sp1 == s) return refuse(err, 400, "malformed request line");
    size_t ml = (size_t)(sp1 - s);
    if (ml >= sizeof h->method) return refuse(err, 501, "method too long");
    for (size_t i = 0; i < ml; i++)
        if (!is_tchar((unsigned char)s[i])) return refuse(err, 400, "malformed method");
    memcpy(h->method, s, ml);
    h->method[ml] = 0;

    const char *t = sp1 + 1, *end = s + n;
    const char *sp2 = memchr(t, ' ', (size_t)(end - t));
    if (!sp2 || sp2 == t) return refuse(err, 400, "malformed request line");
    const char *ver = sp2 + 1;
    size_t vl = (size_t)(end - ver);
    if (vl != 8 || memcmp(ver, "HTTP/1.", 7) != 0 || (ver[7] != '0' && ver[7] != '1'))
        return refuse(err, 505, "only HTTP/1.0 and HTTP/1.1 are served");
    h->minor = ver[7] - '0';

    /* absolute-form (http://host/path) is reduced to its path */
    size_t tl = (size_t)(sp2 - t);
    if (tl > 7 && strncasecmp(t, "http://", 7) == 0) {
        const char *slash = memchr(t + 7, '/', tl - 7);
        if (!slash) return refuse(err, 400, "malformed request target");
        tl -= (size_t)(slash - t);
        t = slash;
    }
    if (t[0] != '/' && !(tl == 1 && t[0] == '*'))
        return refuse(err, 400, "malformed request target");
    for (size_t i = 0; i < tl; i++)
        if ((unsigned char)t[i] <= ' ' || t[i] == 0x7f)
            return refuse(err, 400, "malformed request target");
    const char *q = memchr(t, '?', tl);
    if (q) tl = (size_t)(q - t);
    const char *f = memchr(t, '#', tl);
    if (f) tl = (size_t)(f - t);
    if (tl >= sizeof h->path) return refuse(err, 414, "request target too long");
    memcpy(h->path, t, tl);
    h->path[tl] = 0;
    return 0;
}

/* Copies a header value into a fixed field; too long is an error. */
static int set_field(char *dst, size_t cap, const char *v, size_t n, const char *name,
                     pt_err *err) {
    if (n >= cap) return refuse(err, 431, "%s header too long", name);
    memcpy(dst, v, n);
    dst[n] = 0;
    return 0;
}

static int parse_content_length(const char *v, size_t n, pt_http_head *h, pt_err *err) {
    if (n == 0 || n > 18) return refuse(err, 400, "invalid Content-Length");
    int64_t x = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isdigit((unsigned char)v[i])) return refuse(err, 400, "invalid Content-Length");
        x = x * 10 + (v[i] - '0');
    }
    if (h->content_length >= 0 && h->content_length != x)
        return refuse(err, 400, "conflicting Content-Length headers");
    h->content_length = x;
    return 0;
}

static int parse_header(const char *s, size_t n, pt_http_head *h, bool *te, bool *conn_close,
                        bool *conn_keep, pt_err *err) {
    if (s[0] == ' ' || s[0] == '\t') return refuse(err, 400, "obsolete header folding");
    const char *colon = memchr(s, ':', n);
    if (!colon || colon == s) return refuse(err, 400, "malformed header line");
    size_t nl = (size_t)(colon - s);
    for (size_t i = 0; i < nl; i++)
        if (!is_tchar((unsigned char)s[i])) return refuse(err, 400, "malformed header name");
    const char *v = colon + 1, *end = s + n;
    while (v < end && (*v == ' ' || *v == '\t'))
        v++;
    while (end > v && (end[-1] == ' ' || end[-1] == '\t'))
        end--;
    size_t vl = (size_t)(end - v);
#define IS(name) (nl == sizeof(name) - 1 && strncasecmp(s, name, nl) == 0)
    if (IS("content-length")) return parse_content_length(v, vl, h, err);
    if (IS("transfer-encoding")) {
        *te = true;
        /* chunked must be the only (and so the final) coding we accept */
        if (!(vl == 7 && strncasecmp(v, "chunked", 7) == 0))
            return refuse(err, 501, "unsupported Transfer-Encoding");
        h->chunked = true;
        return 0;
    }
    if (IS("connection")) {
        *conn_close |= has_token(v, vl, "close");
        *conn_keep |= has_token(v, vl, "keep-alive");
        return 0;
    }
    if (IS("expect")) {
        if (vl == 12 && strncasecmp(v, "100-continue", 12) == 0) h->expect_continue = true;
        return 0;
    }
    if (IS("authorization"))
        return set_field(h->authorization, sizeof h->authorization, v, vl, "Authorization", err);
    if (IS("host") || IS("origin")) {
        bool host = IS("host");
        char *dst = host ? h->host : h->origin;
        /* two of them would let two parties disagree about the target */
        if (dst[0]) return refuse(err, 400, "more than one %s header", host ? "Host" : "Origin");
        return set_field(dst, host ? sizeof h->host : sizeof h->origin, v, vl,
                         host ? "Host" : "Origin", err);
    }
    if (IS("content-type"))
        return set_field(h->content_type, sizeof h->content_type, v, vl, "Content-Type", err);
    if (IS("access-control-request-headers")) {
        /* echoed back in a preflight answer: plain header names only */
        for (size_t i = 0; i < vl; i++)
            if (!is_tchar((unsigned char)v[i]) && v[i] != ',' && v[i] != ' ') return 0;
        return set_field(h->cors_headers, sizeof h->cors_headers, v, vl,
                         "Access-Control-Request-Headers", err);
    }
    if (IS("x-request-id")) {
        for (size_t i = 0; i < vl; i++)
            if ((unsigned char)v[i] < 0x21 || (unsigned char)v[i] > 0x7e)
                return 0; /* ignore odd ids */
        return set_field(h->request_id, sizeof h->request_id, v, vl, "X-Request-Id", err);
    }
#undef IS
    return 0;
}

int pt_http_parse_head(const char *buf, size_t len, pt_http_head *h, pt_err *err) {
    memset(h, 0, sizeof *h);
    h->content_length = -1;
    if (len > PT_HTTP_MAX_HEAD) return refuse(err, 431, "request head too large");
    const char *p = buf, *end = buf + len;
    size_t n;
    const char *line = next_line(&p, end, &n);
    /* RFC 9112 2.2: ignore empty lines before the request line */
    while (n == 0 && p < end)
        line = next_line(&p, end, &n);
    int rc = parse_request_line(line, n, h, err);
    if (rc) return rc;
    bool te = false, conn_close = false, conn_keep = false;
    while (p < end) {
        line = next_line(&p, end, &n);
        if (n == 0) break;
        for (size_t i = 0; i < n; i++)
            if (line[i] == 0 || line[i] == '\r')
                return refuse(err, 400, "control character in a header");
        rc = parse_header(line, n, h, &te, &conn_close, &conn_keep, err);
        if (rc) return rc;
    }
    if (te && h->content_length >= 0)
        return refuse(err, 400, "both Content-Length and Transfer-Encoding given");
    if (te && h->minor == 0) return refuse(err, 400, "Transfer-Encoding in an HTTP/1.0 request");
    h->keep_alive = h->minor == 1 ? !conn_close : conn_keep && !conn_close;
    return 0;
}

/* ---- request policy ---- */

bool pt_http_is_json_type(const char *ct) {
    static const char k_json[] = "application/json";
    size_t n = sizeof k_json - 1;
    if (strncasecmp(ct, k_json, n) != 0) return false;
    ct += n;
    while (*ct == ' ' || *ct == '\t')
        ct++;
    return *ct == 0 || *ct == ';';
}

int pt_http_host_name(const char *host, char *out, size_t cap) {
    size_t n = strlen(host), end;
    if (n == 0) return -1;
    if (host[0] == '[') { /* [v6]:port */
        const char *rb = strchr(host, ']');
        if (!rb) return -1;
        end = (size_t)(rb - host) + 1;
        if (host[end] && host[end] != ':') return -1;
    } else {
        const char *colon = strchr(host, ':');
        end = colon ? (size_t)(colon - host) : n;
    }
    const char *port = host + end;
    if (*port == ':')
        for (const char *p = port + 1; *p; p++)
            if (!isdigit((unsigned char)*p)) return -1;
    if (end > 1 && host[end - 1] == '.') end--; /* "localhost." is localhost */
    if (end == 0 || end >= cap) return -1;
    for (size_t i = 0; i < end; i++) {
        unsigned char ch = (unsigned char)host[i];
        if (ch <= ' ' || ch >= 0x7f || ch == '/' || ch == '@') return -1;
        out[i] = (char)tolower(ch);
    }
    out[end] = 0;
    return 0;
}

bool pt_http_is_loopback_name(const char *name) {
    return strcmp(name, "localhost") == 0 || strcmp(name, "127.0.0.1") == 0 ||
           strcmp(name, "[::1]") == 0;
}

bool pt_http_list_has(const char *list, const char *item) {
    if (!list) return false;
    size_t il = strlen(item);
    for (const char *p = list; *p;) {
        while (*p == ' ' || *p == ',')
            p++;
        const char *e = p;
        while (*e && *e != ',')
            e++;
        const char *t = e;
        while (t > p && t[-1] == ' ')
            t--;
        size_t n = (size_t)(t - p);
        if (n == 1 && *p == '*') return true;
        if (n == il && n && strncasecmp(p, item, n) == 0) return true;
        p = e;
    }
    return false;
}

bool pt_http_same_origin(const char *origin, const char *host) {
    /* no TLS here, so a same-origin page was served over http:// */
    if (strncasecmp(origin, "http://", 7) != 0 || !host[0]) return false;
    const char *o = origin + 7;
    size_t hl = strlen(host);
    if (strncasecmp(o, host, hl) == 0 && o[hl] == 0) return true;
    /* "Host: h:80" and "Origin: http://h" name the same place */
    return hl > 3 && strcmp(host + hl - 3, ":80") == 0 && strlen(o) == hl - 3 &&
           strncasecmp(o, host, hl - 3) == 0;
}

/* ---- chunked bodies ---- */

enum { CH_SIZE, CH_DATA, CH_DATA_END, CH_TRAILER, CH_DONE };

/* Reads one line of at most 1 KiB; NULL if not complete yet, *bad if too
 * long. */
static char *read_line(struct evbuffer *in, bool *bad) {
    struct evbuffer_ptr eol = evbuffer_search_eol(in, NULL, NULL, EVBUFFER_EOL_CRLF);
    if (eol.pos < 0) {
        *bad = evbuffer_get_length(in) > 1024;
        return NULL;
    }
    if (eol.pos > 1024) {
        *bad = true;
        return NULL;
    }
    return evbuffer_readln(in, NULL, EVBUFFER_EOL_CRLF);
}

static int parse_chunk_size(const char *line, uint64_t *size) {
    uint64_t x = 0;
    int digits = 0;
    const char *p = line;
    for (; isxdigit((unsigned char)*p); p++, digits++) {
        if (digits == 15) return -1;
        x = x * 16 + (uint64_t)(isdigit((unsigned char)*p) ? *p - '0' : (tolower(*p) - 'a' + 10));
    }
    while (*p == ' ' || *p == '\t')
        p++;
    if (digits == 0 || (*p && *p != ';')) return -1; /* chunk extensions are ignored */
    *size = x;
    return 0;
}

int pt_chunked_decode(pt_chunked *c, struct evbuffer *in, struct evbuffer *out, size_t max) {
    for (;;) {
        bool bad = false;
        char *line;
        switch (c->state) {
        case CH_SIZE:
            if (!(line = read_line(in, &bad))) return bad ? -1 : 0;
            if (parse_chunk_size(line, &c->left)) {
                free(line);
                return -1;
            }
            free(line);
            if (c->left > max || evbuffer_get_length(out) + c->left > max) return -2;
            c->state = c->left ? CH_DATA : CH_TRAILER;
            break;
        case CH_DATA: {
            size_t avail = evbuffer_get_length(in);
            if (avail == 0) return 0;
            size_t k = (size_t)PT_MIN((uint64_t)avail, c->left);
            evbuffer_remove_buffer(in, out, k);
            c->left -= k;
            if (c->left == 0) c->state = CH_DATA_END;
            break;
        }
        case CH_DATA_END:
            if (!(line = read_line(in, &bad))) return bad ? -1 : 0;
            bad = line[0] != 0;
            free(line);
            if (bad) return -1;
            c->state = CH_SIZE;
            break;
        case CH_TRAILER: /* trailer fields are read and dropped */
            if (!(line = read_line(in, &bad))) return bad ? -1 : 0;
            bool empty = line[0] == 0;
            free(line);
            if (empty) c->state = CH_DONE;
            break;
        case CH_DONE:
            return 1;
        default:
            return -1;
        }
    }
}

void pt_http_chunk(struct evbuffer *out, const void *data, size_t len) {
    if (len == 0) return;
    evbuffer_add_printf(out, "%zx\r\n", len);
    evbuffer_add(out, data, len);
    evbuffer_add(out, "\r\n", 2);
}
