/*
 * stop.c - stop strings: first occurrence, or the longest tail that is a
 * prefix of one (see stop.h).
 *
 * Both searches are plain byte loops: a request has at most PT_STOP_MAX
 * strings of at most PT_STOP_MAX_LEN bytes, and the unreleased buffer is
 * never longer than the longest of them plus one token's text.
 */
#include "server/stop.h"

#include <stdint.h>
#include <stdlib.h>

int pt_stop_add(pt_stop *st, const char *s, size_t len, pt_err *err) {
    if (len == 0) return 0;
    if (st->n == PT_STOP_MAX) return pt_fail(err, "at most %d stop strings", PT_STOP_MAX);
    if (len > PT_STOP_MAX_LEN)
        return pt_fail(err, "a stop string is longer than %d bytes", PT_STOP_MAX_LEN);
    char *copy = pt_xmalloc(len + 1);
    memcpy(copy, s, len);
    copy[len] = 0;
    st->str[st->n] = copy;
    st->len[st->n++] = len;
    return 0;
}

void pt_stop_free(pt_stop *st) {
    for (int i = 0; i < st->n; i++)
        free(st->str[i]);
    memset(st, 0, sizeof *st);
}

/* Offset of the stop string that is complete first (the earliest end; of
 * two ending together, the longer), or len if none.  Ordering by end, not
 * start, is what makes the result independent of how the text was split
 * into tokens: a streamed generation stops as soon as any stop string is
 * complete, before a longer one that started earlier could finish. */
static size_t first_match(const pt_stop *st, const char *text, size_t len) {
    size_t best = len, best_end = SIZE_MAX;
    for (int i = 0; i < st->n; i++) {
        const char *p = memmem(text, len, st->str[i], st->len[i]);
        if (!p) continue;
        size_t at = (size_t)(p - text), end = at + st->len[i];
        if (end < best_end || (end == best_end && at < best)) best = at, best_end = end;
    }
    return best;
}

/* Whether text[0..k) is a prefix of some stop string. */
static bool is_prefix(const pt_stop *st, const char *text, size_t k) {
    for (int i = 0; i < st->n; i++)
        if (st->len[i] > k && memcmp(st->str[i], text, k) == 0) return true;
    return false;
}

size_t pt_stop_scan(const pt_stop *st, const char *text, size_t len, bool *matched) {
    *matched = false;
    if (st->n == 0) return len;
    size_t m = first_match(st, text, len);
    if (m < len) {
        *matched = true;
        return m;
    }
    size_t longest = 0;
    for (int i = 0; i < st->n; i++)
        longest = PT_MAX(longest, st->len[i]);
    /* the longest tail shorter than a whole stop string that starts one */
    for (size_t k = PT_MIN(len, longest - 1); k > 0; k--)
        if (is_prefix(st, text + len - k, k)) return len - k;
    return len;
}
