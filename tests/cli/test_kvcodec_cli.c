/*
 * test_kvcodec_cli.c - `petrel kvcodec` on values JSON cannot hold: NaN and
 * the infinities are written as the strings the input side reads ("nan",
 * "inf", "-inf"), every decoded row keeps head_dim entries, and a failed
 * write of the output is a nonzero exit with a message.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

static char dir[128];

static int setup(void **state) {
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/petrel_test_kvcodec_cli_%d", (int)getpid());
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", dir, dir);
    return system(cmd) == 0 ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : -1;
}

/* Runs `petrel kvcodec MODE --kv-quant Q IN > OUT`; returns the exit status. */
static int kvcodec(const char *mode, const char *q, const char *in, const char *out) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s kvcodec %s --kv-quant %s '%s' > '%s' 2> '%s/stderr'", PETREL_BIN, mode,
             q, in, out, dir);
    int rc = system(cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

static json_t *load(const char *path) {
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    if (!j) fail_msg("%s: %s", path, je.text);
    return j;
}

static void save(json_t *j, const char *path) {
    assert_int_equal(json_dump_file(j, path, 0), 0);
}

/* One row of head_dim ordinary numbers. */
static json_t *plain_row(int d) {
    json_t *r = json_array();
    for (int i = 0; i < d; i++) json_array_append_new(r, json_real(0.25 * (i % 7) - 0.5));
    return r;
}

/* Checks every row of part has d entries, each a number or one of the
 * non-finite strings; counts those strings. */
static void check_rows(json_t *out, const char *part, int d, int *n_nan, int *n_inf) {
    json_t *rows = json_object_get(out, part), *r;
    size_t k;
    assert_true(json_array_size(rows) > 0);
    json_array_foreach(rows, k, r) {
        assert_int_equal(json_array_size(r), d);
        for (int i = 0; i < d; i++) {
            json_t *v = json_array_get(r, (size_t)i);
            if (json_is_number(v)) continue;
            assert_true(json_is_string(v));
            const char *s = json_string_value(v);
            if (!strcmp(s, "nan")) (*n_nan)++;
            else if (!strcmp(s, "inf") || !strcmp(s, "-inf")) (*n_inf)++;
            else fail_msg("%s row %zu entry %d: unexpected string '%s'", part, k, i, s);
        }
    }
}

/* Encoded rows whose fp16 scales are NaN and +-Inf decode to non-finite
 * values: every one must come out, as a string. */
static void check_codec(const char *q, int d) {
    char in[200], enc[200], dec[200];
    snprintf(in, sizeof in, "%s/in.json", dir);
    snprintf(enc, sizeof enc, "%s/enc.json", dir);
    snprintf(dec, sizeof dec, "%s/dec.json", dir);
    json_t *rows = json_array();
    for (int r = 0; r < 3; r++) json_array_append_new(rows, plain_row(d));
    json_t *src = json_pack("{s:O, s:O}", "keys", rows, "values", rows);
    json_decref(rows);
    save(src, in);
    json_decref(src);
    assert_int_equal(kvcodec("encode", q, in, enc), 0);

    json_t *e = load(enc);
    static const char *const bad[3] = {"7e00", "7c00", "fc00"}; /* NaN, +Inf, -Inf as f16 */
    const char *parts[2] = {"keys", "values"};
    for (int p = 0; p < 2; p++)
        for (int r = 0; r < 3; r++) {
            json_t *row = json_array_get(json_object_get(e, parts[p]), (size_t)r);
            json_t *sc = json_object_get(row, "scales_f16");
            assert_true(json_array_size(sc) > 0);
            for (size_t g = 0; g < json_array_size(sc); g++) json_array_set_new(sc, g, json_string(bad[r]));
            json_object_del(row, "scales"); /* the hex planes are what decode reads */
        }
    save(e, enc);
    json_decref(e);

    assert_int_equal(kvcodec("decode", q, enc, dec), 0);
    json_t *out = load(dec);
    int n_nan = 0, n_inf = 0;
    check_rows(out, "keys", d, &n_nan, &n_inf);
    check_rows(out, "values", d, &n_nan, &n_inf);
    assert_true(n_nan > 0);
    assert_true(n_inf > 0);
    json_decref(out);

    /* what decode wrote, the input side reads back: encode accepts it */
    assert_int_equal(kvcodec("encode", q, dec, enc), 0);
}

static void test_nonfinite_affine(void **state) {
    (void)state;
    check_codec("8", 64);
    check_codec("4", 64);
}

static void test_nonfinite_turbo(void **state) {
    (void)state;
    check_codec("turbo:k8v3", 64);
}

/* Output that cannot be written (a full disk) is an error, not exit 0. */
static void test_write_error(void **state) {
    (void)state;
    if (access("/dev/full", W_OK)) skip();
    char in[200];
    snprintf(in, sizeof in, "%s/in.json", dir);
    json_t *src = json_pack("{s:[o]}", "keys", plain_row(64));
    save(src, in);
    json_decref(src);
    assert_int_not_equal(kvcodec("encode", "8", in, "/dev/full"), 0);
    char path[512], *msg = NULL;
    size_t cap = 0;
    snprintf(path, sizeof path, "%s/stderr", dir);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    assert_true(getline(&msg, &cap, f) > 0);
    assert_non_null(strstr(msg, "petrel kvcodec"));
    free(msg);
    fclose(f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nonfinite_affine),
        cmocka_unit_test(test_nonfinite_turbo),
        cmocka_unit_test(test_write_error),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
