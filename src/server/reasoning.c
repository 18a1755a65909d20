/*
 * reasoning.c - the <think> splitter of the output filter (see reasoning.h).
 *
 * States: START (only whitespace so far: the answer may open <think>),
 * THINK (reasoning until </think>), AFTER (just closed: whitespace is
 * dropped, as the template puts it there), ANSWER (content to the end).
 */
#include "server/reasoning.h"

#include <ctype.h>
#include <string.h>

#include "base/base.h"
#include "server/tools.h"

enum { R_START, R_THINK, R_AFTER, R_ANSWER };

static const char k_open[] = "<think>", k_close[] = "</think>";

bool pt_reason_template_thinks(const char *src) {
    return src && strstr(src, k_close) != NULL;
}

bool pt_reason_prompt_open(const char *p, size_t n) {
    while (n && isspace((unsigned char)p[n - 1]))
        n--;
    size_t k = sizeof k_open - 1;
    return n >= k && !memcmp(p + n - k, k_open, k);
}

void pt_reason_init(pt_reason *r, bool inside, pt_reason_fn out, void *user) {
    memset(r, 0, sizeof *r);
    r->state = inside ? R_THINK : R_START;
    r->out = out;
    r->user = user;
}

static void emit(pt_reason *r, bool reasoning, size_t n) {
    if (n) r->out(r->user, reasoning, r->buf, n);
    memmove(r->buf, r->buf + n, r->len - n);
    r->len -= n;
}

static void drop(pt_reason *r, size_t n) {
    memmove(r->buf, r->buf + n, r->len - n);
    r->len -= n;
}

/* One state's worth of the held text; true if the state changed. */
static bool step(pt_reason *r) {
    size_t ws = 0;
    switch (r->state) {
    case R_START: {
        while (ws < r->len && isspace((unsigned char)r->buf[ws]))
            ws++;
        size_t n = r->len - ws, k = sizeof k_open - 1;
        if (n >= k && !memcmp(r->buf + ws, k_open, k)) {
            drop(r, ws + k);
            r->state = R_THINK;
            return true;
        }
        if (n < k && !memcmp(r->buf + ws, k_open, n)) return false; /* may still open */
        r->state = R_ANSWER;
        return true;
    }
    case R_THINK: {
        const char *c = NULL;
        size_t k = sizeof k_close - 1;
        for (size_t i = 0; i + k <= r->len && !c; i++)
            if (!memcmp(r->buf + i, k_close, k)) c = r->buf + i;
        if (!c) {
            emit(r, true, r->len - pt_tag_partial(r->buf, r->len, k_close));
            return false;
        }
        emit(r, true, (size_t)(c - r->buf));
        drop(r, k);
        r->state = R_AFTER;
        return true;
    }
    case R_AFTER:
        while (ws < r->len && isspace((unsigned char)r->buf[ws]))
            ws++;
        drop(r, ws);
        if (r->len == 0) return false;
        r->state = R_ANSWER;
        return true;
    default:
        emit(r, false, r->len);
        return false;
    }
}

void pt_reason_push(pt_reason *r, const char *s, size_t n) {
    if (r->len + n > r->cap) {
        while (r->len + n > r->cap)
            r->cap = r->cap ? r->cap * 2 : 128;
        r->buf = pt_xrealloc(r->buf, r->cap);
    }
    memcpy(r->buf + r->len, s, n);
    r->len += n;
    while (step(r)) {
    }
}

void pt_reason_flush(pt_reason *r) {
    /* what was held: an unfinished tag is text of its side */
    emit(r, r->state == R_THINK, r->len);
}

void pt_reason_free(pt_reason *r) {
    free(r->buf);
    r->buf = NULL;
}
