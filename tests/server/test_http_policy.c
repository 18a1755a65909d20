/*
 * test_http_policy.c - the pure checks behind the server's browser guards
 * (http_parse.c): Content-Type, Host names, allow lists and same-origin, and
 * the head fields they read.  The server's use of them is in
 * e2e/hardening.test.mjs.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

#include "server/http.h"

static void test_json_type(void **state) {
    (void)state;
    assert_true(pt_http_is_json_type("application/json"));
    assert_true(pt_http_is_json_type("Application/JSON"));
    assert_true(pt_http_is_json_type("application/json; charset=utf-8"));
    assert_true(pt_http_is_json_type("application/json;charset=UTF-8"));
    assert_false(pt_http_is_json_type(""));
    assert_false(pt_http_is_json_type("text/plain"));
    assert_false(pt_http_is_json_type("application/x-www-form-urlencoded"));
    assert_false(pt_http_is_json_type("multipart/form-data; boundary=x"));
    assert_false(pt_http_is_json_type("application/jsonx"));
    assert_false(pt_http_is_json_type("application/json-seq"));
}

static void name_is(const char *host, const char *want) {
    char out[64];
    assert_int_equal(pt_http_host_name(host, out, sizeof out), 0);
    assert_string_equal(out, want);
}

static void test_host_names(void **state) {
    (void)state;
    name_is("localhost", "localhost");
    name_is("LocalHost:8080", "localhost");
    name_is("localhost.:80", "localhost");
    name_is("127.0.0.1:1", "127.0.0.1");
    name_is("[::1]:8080", "[::1]");
    name_is("[::1]", "[::1]");
    name_is("evil.example", "evil.example");
    char out[8];
    const char *bad[] = {"",    ":80", "a:b", "[::1",    "[::1]x",
                         "a b", "a/b", "u@h", "a:80:90", "averyveryverylongname"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        assert_int_equal(pt_http_host_name(bad[i], out, sizeof out), -1);
    assert_true(pt_http_is_loopback_name("localhost"));
    assert_true(pt_http_is_loopback_name("127.0.0.1"));
    assert_true(pt_http_is_loopback_name("[::1]"));
    assert_false(pt_http_is_loopback_name("localhost.evil.example"));
    assert_false(pt_http_is_loopback_name("127.0.0.1.nip.io"));
}

static void test_lists(void **state) {
    (void)state;
    assert_false(pt_http_list_has(NULL, "a"));
    assert_false(pt_http_list_has("", "a"));
    assert_true(pt_http_list_has("a,b", "b"));
    assert_true(pt_http_list_has(" a , B ", "b"));
    assert_false(pt_http_list_has("ab", "a"));
    assert_false(pt_http_list_has("a", "ab"));
    assert_true(pt_http_list_has("x,*", "anything"));
    assert_true(pt_http_list_has("http://app:3000", "HTTP://APP:3000"));
    assert_false(pt_http_list_has("http://app:3000", "http://app:3001"));
}

static void test_same_origin(void **state) {
    (void)state;
    assert_true(pt_http_same_origin("http://127.0.0.1:8080", "127.0.0.1:8080"));
    assert_true(pt_http_same_origin("http://LOCALHOST:8080", "localhost:8080"));
    assert_true(pt_http_same_origin("http://h", "h:80"));
    assert_false(pt_http_same_origin("http://h:8081", "h:8080"));
    assert_false(pt_http_same_origin("https://h:8080", "h:8080")); /* we serve no TLS */
    assert_false(pt_http_same_origin("http://h:8080", ""));
    assert_false(pt_http_same_origin("null", "h:8080"));
    assert_false(pt_http_same_origin("http://h:8080.evil", "h:8080"));
}

static int head(const char *s, pt_http_head *h) {
    pt_err err;
    size_t end = pt_http_head_end(s, strlen(s));
    assert_true(end > 0);
    return pt_http_parse_head(s, end, h, &err);
}

static void test_head_fields(void **state) {
    (void)state;
    pt_http_head h;
    assert_int_equal(head("OPTIONS /v1/models HTTP/1.1\r\nHost: localhost:8\r\n"
                          "Origin: http://app:3\r\nContent-Type: application/json\r\n"
                          "Access-Control-Request-Headers: authorization, x-stainless-os\r\n\r\n",
                          &h),
                     0);
    assert_string_equal(h.host, "localhost:8");
    assert_string_equal(h.origin, "http://app:3");
    assert_string_equal(h.content_type, "application/json");
    assert_string_equal(h.cors_headers, "authorization, x-stainless-os");
    /* echoed back into a response header: anything but names is dropped */
    assert_int_equal(
        head("OPTIONS / HTTP/1.1\r\nAccess-Control-Request-Headers: a;b=<x>\r\n\r\n", &h), 0);
    assert_string_equal(h.cors_headers, "");
    /* two Hosts or two Origins: which one would the check have seen? */
    assert_int_equal(head("GET / HTTP/1.1\r\nHost: localhost\r\nHost: evil\r\n\r\n", &h), 400);
    assert_int_equal(head("GET / HTTP/1.1\r\nOrigin: a\r\nOrigin: b\r\n\r\n", &h), 400);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_json_type),   cmocka_unit_test(test_host_names),
        cmocka_unit_test(test_lists),       cmocka_unit_test(test_same_origin),
        cmocka_unit_test(test_head_fields),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
