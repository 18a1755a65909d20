/*
 * test_sse.c - the bytes on the wire: SSE events, chunked response framing,
 * and the HTTP/1.1 request parser (heads and chunked bodies).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

#include "server/http.h"
#include "server/sse.h"

/* The buffer's bytes as a NUL-terminated string (caller frees). */
static char *drain(struct evbuffer *b) {
    size_t n = evbuffer_get_length(b);
    char *s = malloc(n + 1);
    evbuffer_remove(b, s, n);
    s[n] = 0;
    return s;
}

static void expect(struct evbuffer *b, const char *want) {
    char *got = drain(b);
    assert_string_equal(got, want);
    free(got);
}

static void test_sse_events(void **state) {
    (void)state;
    struct evbuffer *b = evbuffer_new();
    pt_sse_event(b, "{\"a\":1}", 7);
    expect(b, "data: {\"a\":1}\n\n");
    pt_sse_event(b, "x\ny", 3);
    expect(b, "data: x\ndata: y\n\n");
    pt_sse_event(b, "x\r\ny\n", 5);
    expect(b, "data: x\ndata: y\ndata: \n\n");
    pt_sse_event(b, "", 0);
    expect(b, "data: \n\n");
    pt_sse_done(b);
    expect(b, "data: [DONE]\n\n");
    json_t *v = json_pack("{s:s}", "content", "line1\nline2");
    assert_int_equal(pt_sse_json(b, v), 0);
    expect(b, "data: {\"content\":\"line1\\nline2\"}\n\n"); /* JSON escapes: one line */
    json_decref(v);
    pt_http_chunk(b, "hello", 5);
    pt_http_chunk(b, "", 0);
    pt_http_chunk(b, "0123456789abcdef0", 17);
    expect(b, "5\r\nhello\r\n11\r\n0123456789abcdef0\r\n");
    evbuffer_free(b);
}

static int head(const char *s, pt_http_head *h) {
    pt_err err;
    size_t end = pt_http_head_end(s, strlen(s));
    assert_true(end > 0);
    return pt_http_parse_head(s, end, h, &err);
}

static void test_heads(void **state) {
    (void)state;
    pt_http_head h;
    assert_int_equal(head("GET /v1/models?x=1 HTTP/1.1\r\nHost: a\r\n\r\n", &h), 0);
    assert_string_equal(h.method, "GET");
    assert_string_equal(h.path, "/v1/models");
    assert_true(h.keep_alive);
    assert_int_equal(h.content_length, -1);
    assert_int_equal(
        head("POST /v1/completions HTTP/1.1\r\nContent-Length: 12\r\nConnection: close\r\n"
             "Authorization: Bearer k1\r\nExpect: 100-continue\r\nX-Request-Id: r-7\r\n\r\n",
             &h),
        0);
    assert_int_equal(h.content_length, 12);
    assert_false(h.keep_alive);
    assert_true(h.expect_continue);
    assert_string_equal(h.authorization, "Bearer k1");
    assert_string_equal(h.request_id, "r-7");
    assert_int_equal(head("GET / HTTP/1.0\r\n\r\n", &h), 0);
    assert_false(h.keep_alive);
    assert_int_equal(head("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n", &h), 0);
    assert_true(h.keep_alive);
    assert_int_equal(head("GET http://localhost:8080/health HTTP/1.1\n\n", &h), 0);
    assert_string_equal(h.path, "/health");
    assert_int_equal(head("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", &h), 0);
    assert_true(h.chunked);
    /* rejected */
    assert_int_equal(head("GET / HTTP/2.0\r\n\r\n", &h), 505);
    assert_int_equal(head("GET /\r\n\r\n", &h), 400);
    assert_int_equal(head("G@T / HTTP/1.1\r\n\r\n", &h), 400);
    assert_int_equal(head("GET nopath HTTP/1.1\r\n\r\n", &h), 400);
    assert_int_equal(head("POST / HTTP/1.1\r\nContent-Length: 1x\r\n\r\n", &h), 400);
    assert_int_equal(head("POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n", &h), 400);
    assert_int_equal(head("POST / HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n", &h),
                     400);
    assert_int_equal(
        head("POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n", &h),
        400);
    assert_int_equal(head("POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", &h), 501);
    assert_int_equal(head("GET / HTTP/1.1\r\nA: b\r\n folded\r\n\r\n", &h), 400);
    assert_int_equal(head("GET / HTTP/1.1\r\nBad Name: b\r\n\r\n", &h), 400);
    assert_int_equal(head("GET / HTTP/1.1\r\nnocolon\r\n\r\n", &h), 400);
    assert_int_equal(pt_http_head_end("GET / HTTP/1.1\r\nA: b\r\n", 22), 0);
}

/* Feeds s to the decoder one byte at a time. */
static int chunked(const char *s, size_t max, char *out) {
    pt_chunked c = {0};
    struct evbuffer *in = evbuffer_new(), *body = evbuffer_new();
    int rc = 0;
    for (size_t i = 0; s[i] && rc == 0; i++) {
        evbuffer_add(in, s + i, 1);
        rc = pt_chunked_decode(&c, in, body, max);
    }
    size_t n = evbuffer_get_length(body);
    evbuffer_remove(body, out, n);
    out[n] = 0;
    evbuffer_free(in);
    evbuffer_free(body);
    return rc;
}

static void test_chunked(void **state) {
    (void)state;
    char out[256];
    assert_int_equal(
        chunked("5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\nTrailer: x\r\n\r\n", 100, out), 1);
    assert_string_equal(out, "hello world");
    assert_int_equal(chunked("A\r\n0123456789\r\n0\r\n\r\n", 100, out), 1);
    assert_int_equal(chunked("3\r\nabc\r\n", 100, out), 0); /* incomplete */
    assert_int_equal(chunked("zz\r\n", 100, out), -1);
    assert_int_equal(chunked("3\r\nabcX\r\n", 100, out), -1);
    assert_int_equal(chunked("ffffffffffffffff\r\n", 100, out), -1);
    assert_int_equal(chunked("65\r\n", 100, out), -2); /* 101 bytes > 100 */
    assert_int_equal(chunked("40\r\n", 100, out), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sse_events),
        cmocka_unit_test(test_heads),
        cmocka_unit_test(test_chunked),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
