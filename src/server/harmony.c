/*
 * harmony.c - the harmony splitter of the output filter (see harmony.h).
 *
 * States: HEAD (a header is held until <|message|>; a <|start|> in it
 * begins the header anew, so the role before it is dropped) and BODY
 * (the body goes to its sink until a terminator: <|end|>, <|call|>,
 * <|return|>, or a <|start|> the model wrote without ending the message).
 */
#include "server/harmony.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>

#include "base/base.h"
#include "server/tools.h"

enum { H_HEAD, H_BODY };
enum { SINK_REASON, SINK_CONTENT, SINK_CALL };

#define HEADER_MAX 512 /* longer without <|message|>: not a header */

static const char k_message[] = "<|message|>", k_start[] = "<|start|>", k_channel[] = "<|channel|>";
static const char *const k_ends[] = {"<|end|>", "<|call|>", "<|return|>", k_start};

bool pt_harmony_template(const char *src) {
    return src && strstr(src, k_channel) != NULL;
}

void pt_harmony_prepare_messages(json_t *messages) {
    size_t i;
    json_t *m;
    json_array_foreach(messages, i, m) {
        const char *role = json_string_value(json_object_get(m, "role"));
        if (!role || strcmp(role, "assistant")) continue;
        if (json_is_null(json_object_get(m, "content"))) json_object_del(m, "content");
        json_t *r = json_object_get(m, "reasoning_content");
        if (json_is_string(r) && !json_object_get(m, "thinking")) json_object_set(m, "thinking", r);
    }
}

char *pt_harmony_call_header(const char *name) {
    char *s;
    if (name) {
        size_t n = strlen(name) + 80;
        s = pt_xmalloc(n);
        snprintf(s, n, "<|channel|>commentary to=functions.%s <|constrain|>json<|message|>", name);
    } else {
        s = pt_xstrdup("<|channel|>commentary <|constrain|>json<|message|>");
    }
    return s;
}

void pt_harmony_init(pt_harmony *h, bool calls, uint64_t id_seed, pt_harmony_text_fn on_text,
                     pt_harmony_call_fn on_call, void *user) {
    memset(h, 0, sizeof *h);
    h->state = H_HEAD;
    h->calls = calls;
    h->id_seed = id_seed;
    h->on_text = on_text;
    h->on_call = on_call;
    h->user = user;
}

void pt_harmony_forced(pt_harmony *h, const char *name) {
    free(h->name);
    h->name = name ? pt_xstrdup(name) : NULL;
    h->state = H_BODY;
    h->sink = SINK_CALL;
}

void pt_harmony_final(pt_harmony *h) {
    h->state = H_BODY;
    h->sink = SINK_CONTENT;
}

void pt_harmony_free(pt_harmony *h) {
    free(h->buf);
    free(h->name);
    h->buf = h->name = NULL;
}

static const char *find(const char *s, size_t n, const char *tag) {
    size_t t = strlen(tag);
    for (size_t i = 0; i + t <= n; i++)
        if (s[i] == tag[0] && !memcmp(s + i, tag, t)) return s + i;
    return NULL;
}

static void drop(pt_harmony *h, size_t k) {
    memmove(h->buf, h->buf + k, h->len - k);
    h->len -= k;
}

static void text(pt_harmony *h, bool reasoning, const char *s, size_t n) {
    if (n) h->on_text(h->user, reasoning, s, n);
}

/* The word after `key` in header s[0..n): up to a space, a '<' or the end. */
static bool word_after(const char *s, size_t n, const char *key, const char **w, size_t *wn) {
    size_t k = strlen(key);
    for (size_t i = 0; i + k <= n; i++) {
        if (memcmp(s + i, key, k)) continue;
        /* "to=" starts a word: not the tail of another one */
        if (key[0] != '<' && i > 0 && s[i - 1] != ' ' && s[i - 1] != '>') continue;
        size_t j = i + k;
        while (j < n && s[j] != ' ' && s[j] != '<')
            j++;
        *w = s + i + k;
        *wn = j - (i + k);
        return true;
    }
    return false;
}

/* A header s[0..n) (without <|message|>) picks the body's sink. */
static void header(pt_harmony *h, const char *s, size_t n) {
    const char *st;
    while ((st = find(s, n, k_start))) { /* the last message's header only */
        size_t k = (size_t)(st - s) + sizeof k_start - 1;
        s += k, n -= k;
    }
    const char *w;
    size_t wn;
    free(h->name);
    h->name = NULL;
    static const char fn[] = "functions.";
    if (word_after(s, n, "to=", &w, &wn) && wn > sizeof fn - 1 && !memcmp(w, fn, sizeof fn - 1) &&
        h->calls) {
        h->sink = SINK_CALL;
        h->name = pt_xmalloc(wn - (sizeof fn - 1) + 1);
        memcpy(h->name, w + sizeof fn - 1, wn - (sizeof fn - 1));
        h->name[wn - (sizeof fn - 1)] = 0;
        return;
    }
    bool analysis = word_after(s, n, k_channel, &w, &wn) && wn == 8 && !memcmp(w, "analysis", 8);
    h->sink = analysis ? SINK_REASON : SINK_CONTENT;
}

/* A call's body (its whole text): a call out, or the text as content. */
static void settle_call(pt_harmony *h, const char *s, size_t n) {
    json_t *v = json_loadb(s, n, 0, NULL);
    json_t *args = h->name ? v : json_object_get(v, "arguments");
    const char *name = h->name ? h->name : json_string_value(json_object_get(v, "name"));
    if (!json_is_object(v) || !json_is_object(args) || !name || !*name) {
        json_decref(v);
        text(h, false, s, n);
        return;
    }
    char *a = json_dumps(args, JSON_COMPACT);
    h->on_call(h->user, pt_tool_call_new(h->id_seed, h->n_calls++, name, a ? a : "{}"));
    free(a);
    json_decref(v);
}

/* The earliest terminator in the held body, or NULL; *k its length. */
static const char *body_end(const pt_harmony *h, size_t *k) {
    const char *best = NULL;
    for (size_t i = 0; i < PT_ARRAY_LEN(k_ends); i++) {
        const char *e = find(h->buf, h->len, k_ends[i]);
        if (e && (!best || e < best)) best = e, *k = strlen(k_ends[i]);
    }
    return best;
}

/* Whether held text may be a header: one begins with a marker
 * (<|channel|>, <|start|>) or the recipient (" to=" after the role). */
static bool may_be_header(const char *s, size_t n) {
    static const char *const starts[] = {"<|", " to=", "to="};
    for (size_t i = 0; i < PT_ARRAY_LEN(starts); i++) {
        size_t k = PT_MIN(n, strlen(starts[i]));
        if (!memcmp(s, starts[i], k)) return true;
    }
    return false;
}

/* One state's worth of the held text; true if the state changed. */
static bool step(pt_harmony *h) {
    if (h->state == H_HEAD) {
        if (h->len && !may_be_header(h->buf, h->len)) {
            h->sink = SINK_CONTENT; /* not harmony here: the text is the answer */
            h->state = H_BODY;
            return true;
        }
        const char *m = find(h->buf, h->len, k_message);
        if (!m) {
            if (h->len <= HEADER_MAX) return false;
            text(h, false, h->buf, h->len); /* not harmony: the text is the answer */
            h->len = 0;
            h->sink = SINK_CONTENT;
            h->state = H_BODY;
            return true;
        }
        header(h, h->buf, (size_t)(m - h->buf));
        drop(h, (size_t)(m - h->buf) + sizeof k_message - 1);
        h->state = H_BODY;
        return true;
    }
    size_t k = 0;
    const char *e = body_end(h, &k);
    if (!e) {
        if (h->sink == SINK_CALL) return false; /* the body is held whole */
        size_t hold = 0;
        for (size_t i = 0; i < PT_ARRAY_LEN(k_ends); i++)
            hold = PT_MAX(hold, pt_tag_partial(h->buf, h->len, k_ends[i]));
        text(h, h->sink == SINK_REASON, h->buf, h->len - hold);
        drop(h, h->len - hold);
        return false;
    }
    size_t n = (size_t)(e - h->buf);
    if (h->sink == SINK_CALL)
        settle_call(h, h->buf, n);
    else
        text(h, h->sink == SINK_REASON, h->buf, n);
    bool start = !strncmp(e, k_start, k); /* a <|start|> begins the next header: keep it */
    drop(h, n + (start ? 0 : k));
    h->state = H_HEAD;
    return true;
}

void pt_harmony_push(pt_harmony *h, const char *s, size_t n) {
    if (h->len + n + 1 > h->cap) {
        while (h->len + n + 1 > h->cap)
            h->cap = h->cap ? h->cap * 2 : 256;
        h->buf = pt_xrealloc(h->buf, h->cap);
    }
    memcpy(h->buf + h->len, s, n);
    h->len += n;
    while (step(h)) {
    }
}

void pt_harmony_flush(pt_harmony *h) {
    if (h->state == H_HEAD) {
        /* an unfinished header (cut by max_tokens) is dropped */
    } else if (h->sink == SINK_CALL) {
        settle_call(h, h->buf, h->len);
    } else {
        text(h, h->sink == SINK_REASON, h->buf, h->len);
    }
    h->len = 0;
}
