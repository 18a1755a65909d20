/*
 * test_progress.c - base/progress.h's two styles written to a memory
 * stream: the lines style reports each tenth once, in order, ending at
 * 100% and "done"; the bar redraws in place with '\r' and ends with a
 * newline; nothing is printed when off, or when a job ends before its
 * delay (quick loads stay silent).  No assertion depends on timing: the
 * bar's redraws are throttled by time, so only its first and last states
 * are checked.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "base/progress.h"

/* Runs a job of 1000 bytes in ten steps; returns what it printed. */
static char *run(int style, double delay) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    pt_progress p;
    pt_progress_begin_to(&p, "job", 1000, f, style, delay);
    for (int i = 0; i < 10; i++) pt_progress_add(&p, 100);
    pt_progress_add(&p, 100); /* past the total: clamped */
    pt_progress_end(&p);
    fclose(f);
    return buf;
}

static void test_lines(void **state) {
    (void)state;
    char *out = run(PT_PROGRESS_LINES, 0);
    assert_null(strchr(out, '\r'));
    int n = 0, last = -1;
    for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n")) {
        int pct;
        if (sscanf(line, "petrel: job: %d%%", &pct) == 1) {
            assert_true(pct > last); /* each tenth once, in order */
            last = pct;
            n++;
            assert_non_null(strstr(line, "of 1000 B"));
            assert_non_null(strstr(line, "ETA"));
        } else {
            assert_int_equal(strncmp(line, "petrel: job: done in ", 21), 0);
        }
    }
    assert_int_equal(n, 10);
    assert_int_equal(last, 100);
    free(out);
}

static void test_bar(void **state) {
    (void)state;
    char *out = run(PT_PROGRESS_BAR, 0);
    assert_true(out[0] == '\r');
    assert_non_null(strstr(out, "\rjob [##"));                      /* the first draw */
    assert_non_null(strstr(out, "[########################] 100%")); /* the last */
    assert_non_null(strstr(out, "1000 B of 1000 B"));
    char *nl = strchr(out, '\n');
    assert_non_null(nl); /* one newline after the bar, then the summary */
    assert_int_equal(strncmp(nl + 1, "petrel: job: done in ", 21), 0);
    assert_null(strchr(nl + 1, '\r'));
    free(out);
}

static void test_silent(void **state) {
    (void)state;
    char *out = run(PT_PROGRESS_OFF, 0);
    assert_string_equal(out, "");
    free(out);
    out = run(PT_PROGRESS_LINES, 3600); /* ended long before its delay */
    assert_string_equal(out, "");
    free(out);
    out = run(PT_PROGRESS_BAR, 3600);
    assert_string_equal(out, "");
    free(out);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lines),
        cmocka_unit_test(test_bar),
        cmocka_unit_test(test_silent),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
