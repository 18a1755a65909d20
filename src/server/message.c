/*
 * message.c - a chat answer split into reasoning, content and tool calls
 * (see message.h).  Reasoning comes first in the chain: a call written
 * inside <think> is the model thinking about a call, not making one.
 */
#include "server/message.h"

#include "server/openai.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

static void text_add(pt_text *t, const char *s, size_t n) {
    if (t->len + n + 1 > t->cap) {
        while (t->len + n + 1 > t->cap)
            t->cap = t->cap ? t->cap * 2 : 256;
        t->s = pt_xrealloc(t->s, t->cap);
    }
    memcpy(t->s + t->len, s, n);
    t->len += n;
    t->s[t->len] = 0;
}

static void on_content(void *user, const char *s, size_t n) {
    text_add(&((pt_msgsplit *)user)->content, s, n);
}

static void on_call(void *user, json_t *call) {
    pt_msgsplit *m = user;
    json_array_append_new(m->calls, call);
}

static void on_reason(void *user, bool reasoning, const char *s, size_t n) {
    pt_msgsplit *m = user;
    if (reasoning)
        text_add(&m->reasoning, s, n);
    else if (m->tools)
        pt_toolparse_push(&m->tp, s, n);
    else
        text_add(&m->content, s, n);
}

static void on_harmony(void *user, bool reasoning, const char *s, size_t n) {
    pt_msgsplit *m = user;
    text_add(reasoning ? &m->reasoning : &m->content, s, n);
}

void pt_msgsplit_init(pt_msgsplit *m, const pt_msgsplit_opts *o) {
    memset(m, 0, sizeof *m);
    m->calls = json_array();
    if (o->harmony) {
        m->harmony = true;
        pt_harmony_init(&m->hm, o->tools, o->id_seed, on_harmony, on_call, m);
        if (o->tool_forced)
            pt_harmony_forced(&m->hm, o->forced_name);
        else if (o->harmony_final)
            pt_harmony_final(&m->hm);
        return;
    }
    m->think = o->think;
    m->tools = o->tools;
    if (m->think) pt_reason_init(&m->rs, o->think_inside, on_reason, m);
    if (m->tools)
        pt_toolparse_init(&m->tp, o->tool_family, o->tool_forced, o->id_seed, on_content, on_call,
                          m);
}

void pt_msgsplit_push(pt_msgsplit *m, const char *s, size_t n) {
    if (m->harmony)
        pt_harmony_push(&m->hm, s, n);
    else if (m->think)
        pt_reason_push(&m->rs, s, n);
    else
        on_reason(m, false, s, n);
}

void pt_msgsplit_finish(pt_msgsplit *m) {
    if (m->harmony) pt_harmony_flush(&m->hm);
    if (m->think) pt_reason_flush(&m->rs);
    if (m->tools) pt_toolparse_flush(&m->tp);
}

void pt_msgsplit_taken(pt_msgsplit *m) {
    m->reasoning.len = m->content.len = 0;
    m->n_calls += (int)json_array_size(m->calls);
    json_array_clear(m->calls);
}

void pt_msgsplit_free(pt_msgsplit *m) {
    if (m->harmony) pt_harmony_free(&m->hm);
    if (m->think) pt_reason_free(&m->rs);
    if (m->tools) pt_toolparse_free(&m->tp);
    free(m->reasoning.s);
    free(m->content.s);
    json_decref(m->calls);
}

static json_t *string_of(const pt_text *t) {
    json_t *s = json_stringn(t->s ? t->s : "", t->len);
    return s ? s : pt_oai_string_lossy(t->s, t->len);
}

static bool blank(const pt_text *t) {
    for (size_t i = 0; i < t->len; i++)
        if (!isspace((unsigned char)t->s[i])) return false;
    return true;
}

json_t *pt_msgsplit_message(const pt_msgsplit *m) {
    json_t *msg = json_pack("{s:s}", "role", "assistant");
    bool calls = json_array_size(m->calls) > 0;
    json_object_set_new(msg, "content",
                        calls && blank(&m->content) ? json_null() : string_of(&m->content));
    if (m->reasoning.len) json_object_set_new(msg, "reasoning_content", string_of(&m->reasoning));
    if (calls) json_object_set(msg, "tool_calls", m->calls);
    return msg;
}

json_t *pt_msgsplit_deltas(const pt_msgsplit *m) {
    json_t *out = json_array();
    if (m->reasoning.len || m->content.len) {
        json_t *d = json_object();
        if (m->reasoning.len) json_object_set_new(d, "reasoning_content", string_of(&m->reasoning));
        if (m->content.len) json_object_set_new(d, "content", string_of(&m->content));
        json_array_append_new(out, d);
    }
    size_t i;
    json_t *c;
    json_array_foreach(m->calls, i, c) {
        json_t *fn = json_object_get(c, "function");
        int index = m->n_calls + (int)i;
        json_array_append_new(out, json_pack("{s:[{s:i, s:O, s:s, s:{s:O, s:s}}]}", "tool_calls",
                                             "index", index, "id", json_object_get(c, "id"), "type",
                                             "function", "function", "name",
                                             json_object_get(fn, "name"), "arguments", ""));
        json_array_append_new(out,
                              json_pack("{s:[{s:i, s:{s:O}}]}", "tool_calls", "index", index,
                                        "function", "arguments", json_object_get(fn, "arguments")));
    }
    return out;
}
