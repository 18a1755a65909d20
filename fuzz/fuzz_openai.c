/*
 * fuzz_openai.c - libFuzzer target for what a client's request body reaches:
 * the OpenAI request parser and the tool-call output parser.
 *
 * Input: one selector byte, then the bytes.  The request parser
 * (pt_oai_parse, chat or completions by the selector's low bit) must either
 * accept the body with n in 1..PT_OAI_MAX_CHOICES or refuse it with a 4xx
 * status and a message.  The tool-call parser (family from the selector)
 * must hand on the same text and calls whether the bytes come in one piece
 * or one at a time, as the output filter feeds it.  Family 3 is gpt-oss's
 * harmony filter: the same, per side (content or reasoning), and it may
 * hand on no more text than it was given, since every body byte goes to
 * one side at most and markers and headers to none.
 *
 * Selector bits: 0 chat or completion; 1-2 the tool family; for harmony,
 * 3 tools given and 4-5 how the prompt ended (a header, a forced named
 * call, a forced call naming its function in the body, a final answer).
 * Seeds: fuzz/corpus/openai/.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/harmony.h"
#include "server/openai.h"
#include "server/tools.h"

typedef struct sink {
    char *s;
    size_t len, cap;
    int side;    /* harmony: the side the last text went to, 0 after a call */
    size_t text; /* harmony: text bytes handed on */
} sink;

static void put(sink *k, const char *s, size_t n) {
    if (k->len + n + 1 > k->cap) {
        k->cap = (k->len + n + 1) * 2;
        k->s = realloc(k->s, k->cap);
        if (!k->s) abort();
    }
    memcpy(k->s + k->len, s, n);
    k->len += n;
}

/* Text may be handed on in different pieces; only its sequence counts. */
static void on_text(void *user, const char *s, size_t n) {
    put(user, s, n);
}

/* Call ids are derived from the seed and the call's index, so the two runs
 * must agree on them too. */
static void on_call(void *user, json_t *call) {
    char *j = json_dumps(call, JSON_SORT_KEYS | JSON_COMPACT);
    put(user, "\001call:", 6);
    if (j) put(user, j, strlen(j));
    put(user, "\001", 1);
    free(j);
    json_decref(call);
}

/* A side is marked where it changes, so the marks do not depend on how
 * the text was cut into pieces. */
static void on_harmony_text(void *user, bool reasoning, const char *s, size_t n) {
    sink *k = user;
    int side = reasoning ? 'r' : 'c';
    if (k->side != side) {
        put(k, reasoning ? "\001reasoning:" : "\001content:", reasoning ? 11 : 9);
        k->side = side;
    }
    put(k, s, n);
    k->text += n;
}

static void on_harmony_call(void *user, json_t *call) {
    ((sink *)user)->side = 0;
    on_call(user, call);
}

static void parse_harmony(int sel, const char *s, size_t n, size_t step, sink *out) {
    pt_harmony h;
    pt_harmony_init(&h, (sel >> 3) & 1, 42, on_harmony_text, on_harmony_call, out);
    switch ((sel >> 4) & 3) {
    case 1: pt_harmony_forced(&h, "get_weather"); break;
    case 2: pt_harmony_forced(&h, NULL); break;
    case 3: pt_harmony_final(&h); break;
    }
    if (!step) step = n ? n : 1;
    for (size_t i = 0; i < n; i += step)
        pt_harmony_push(&h, s + i, n - i < step ? n - i : step);
    pt_harmony_flush(&h);
    pt_harmony_free(&h);
}

static void parse_calls(int family, const char *s, size_t n, size_t step, sink *out) {
    pt_toolparse p;
    pt_toolparse_init(&p, family, false, 42, on_text, on_call, out);
    if (!step) step = n ? n : 1;
    for (size_t i = 0; i < n; i += step)
        pt_toolparse_push(&p, s + i, n - i < step ? n - i : step);
    pt_toolparse_flush(&p);
    pt_toolparse_free(&p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    int sel = data[0];
    const char *body = (const char *)data + 1;
    size_t len = size - 1;

    pt_oai_limits lim = {.model_id = "fuzz", .n_vocab = 512};
    pt_oai_request r;
    pt_oai_error e;
    memset(&e, 0, sizeof e);
    int kind = (sel & 1) ? PT_OAI_CHAT : PT_OAI_COMPLETION;
    if (pt_oai_parse(&r, kind, body, len, &lim, &e) == 0) {
        if (r.n < 1 || r.n > PT_OAI_MAX_CHOICES) {
            fprintf(stderr, "accepted with n = %d\n", r.n);
            __builtin_trap();
        }
        pt_oai_request_free(&r);
    } else if (e.status < 400 || e.status > 499 || !e.message[0]) {
        fprintf(stderr, "refused with status %d, message \"%s\"\n", e.status, e.message);
        __builtin_trap();
    }

    sink whole = {0}, bytes = {0};
    int family = (sel >> 1) & 3;
    if (family == 3) {
        parse_harmony(sel, body, len, 0, &whole);
        parse_harmony(sel, body, len, 1, &bytes);
        if (whole.text > len) {
            fprintf(stderr, "harmony handed on %zu text bytes of %zu\n", whole.text, len);
            __builtin_trap();
        }
    } else {
        parse_calls(family, body, len, 0, &whole);
        parse_calls(family, body, len, 1, &bytes);
    }
    if (whole.len != bytes.len || (whole.len && memcmp(whole.s, bytes.s, whole.len))) {
        fprintf(stderr, "whole:   %.*s\nbyte by byte: %.*s\n", (int)whole.len, whole.s,
                (int)bytes.len, bytes.s);
        __builtin_trap();
    }
    free(whole.s);
    free(bytes.s);
    return 0;
}
