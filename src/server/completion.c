/*
 * completion.c - /v1/chat/completions and /v1/completions: a validated
 * request becomes a prompt, a scheduler job, and then JSON or an SSE stream.
 *
 * A request (pt_req) lives in four places, each with its own part:
 *
 *   prompt worker     pt_front_work (front.c's thread): render the chat
 *                     template, tokenize, submit the job, or post a
 *                     failure; the loop never blocks on a long prompt;
 *   scheduler thread  on_token / on_done: post the sampled tokens and the
 *                     final stats to the request's outbox; nothing else, so
 *                     the thread that owns the model does no text work;
 *   srv->mu           the outbox: tokens, the done flag and final stats,
 *                     and the stop flag the loop raises;
 *   event loop        deliver(): the output filter - detokenize, hold back
 *                     text that may be the start of a stop string, cut at
 *                     a stop string (then stop the job: a token or two may
 *                     be computed in vain, and are not counted) - then SSE
 *                     chunks or the accumulated answer when done.
 *
 * Lifetime: the request is freed on the event loop once on_done's news (or
 * the worker's failure) has been delivered; neither thread touches it
 * after posting that.  If the client leaves first, the connection forgets
 * the request, the job is cancelled (or never submitted), and the request
 * waits for that last news before it is freed.
 *
 * Streaming and non-streaming share every step up to deliver(), so at
 * temperature 0 the streamed text is the non-streamed text by construction.
 */
#include <event2/buffer.h>
#include <event2/event.h>
#include <limits.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "server/message.h"
#include "server/server_int.h"
#include "server/structured.h"
#include "server/sse.h"

#define BACKLOG_LIMIT (64u << 20) /* bytes a streaming client may leave unread */

typedef struct gen_tok {
    pt_sample_result r;
    size_t start; /* offset of its text in the completion */
} gen_tok;

/* Released text and the tokens whose text starts in it. */
typedef struct piece {
    struct piece *next;
    gen_tok *toks;
    int n_toks;
    size_t len;
    char text[];
} piece;

/* The n choices of one request.  Each choice is a pt_req with its own
 * job, outbox and output filter; the group holds what they share: the
 * stream's head, the answer being assembled, usage, and what choices
 * 1..n-1 are submitted with.  They go to the scheduler once choice 0 has
 * started, so its prompt's pages are in the prefix cache and every choice
 * shares them (copy on write) instead of computing the prompt again. */
typedef struct pt_group {
    int n;         /* choices */
    int n_alive;   /* choices not freed yet; the last frees the group */
    int n_settled; /* choices whose part of the answer is complete */
    pt_req **choice; /* by index; NULL once freed */
    bool began;      /* the stream's head is sent */
    json_t *choices; /* non-streamed: the finished choices, by index */
    int n_completion;
    int n_drafted, n_accepted; /* speculation, summed over the choices like n_completion */
    pt_sched_stats st0; /* choice 0's, for usage and timings */
    int sibling_cached; /* the fewest prompt tokens a choice 1..n-1 reused */
    /* written by choice 0's prompt worker before its job is submitted */
    pt_sched_job job; /* choices 1..n-1: the same job but user and seed */
    int32_t *prompt;
    int32_t *bias_ids;
    float *bias_vals;
    int32_t *prediction; /* the Predicted Output's tokens, or NULL */
    bool seed_given;
    pt_structured *structured; /* the grammar every choice's processor reads */
    char *forced_name; /* harmony: the function a forced call's header names */
    bool siblings_out;         /* choices 1..n-1 were submitted (or freed) */
} pt_group;

struct pt_req {
    pt_server *srv;
    pt_slot *m;    /* the model it runs on; its n_active counts this request */
    pt_conn *conn; /* NULL once the client is gone or the answer is out */
    pt_group *grp;
    int index; /* of this choice */
    int kind;
    bool stream, include_usage, logprobs, chat;
    char id[40];
    long created;
    uint64_t job;
    int n_prompt;
    pt_stop stop;
    pt_req_clock clock; /* for /metrics: arrival, then the scheduler thread's */

    /* prompt worker, until it posts */
    pt_oai_request oai; /* the parsed request, owned until tokenized */
    pt_structured *structured; /* response_format's grammar, or NULL; lives
                                  until the job is done (the sampler's
                                  processor reads it) */

    /* chat: the answer split into reasoning, content and tool calls
     * (message.h); set up by the worker before the job is submitted */
    pt_tool_choice tools;
    pt_msgsplit_opts msg_opts;
    pt_msgsplit msg;
    bool split; /* msg is in use (some filter beyond stop strings runs) */

    /* event loop: the output filter */
    pt_detok dt;
    char *hold; /* text not released yet */
    size_t hold_len, hold_cap;
    gen_tok *pend; /* tokens not released yet (only with logprobs) */
    int n_pend, cap_pend;
    size_t released; /* bytes of completion text released */
    bool matched;    /* a stop string ended the text */
    int n_used;      /* tokens that made the text (up to the stop string) */
    piece *rel_head, *rel_tail; /* released by the filter, not sent yet */

    /* under srv->mu */
    bool front_busy; /* the prompt worker may still touch it: not freed yet */
    bool gone;   /* the client left before the job was submitted */
    struct {     /* the worker's failure: status 0 = none */
        int status;
        const char *code, *param;
        char msg[512];
    } fail;
    pt_sample_result *toks; /* sampled, for the loop's filter */
    int n_toks, cap_toks;
    bool stop_seen; /* the loop matched a stop string: end the job */
    bool done;
    pt_sched_stats st;
    bool in_outbox;
    pt_req *next_out;

    /* event loop */
    pt_req *next_drain;
    pt_sample_result *drain; /* tokens taken from the outbox */
    int n_drain, cap_drain;
    bool drain_done;
    bool began;            /* the stream's head is sent */
    struct evbuffer *text; /* non-streamed: the content so far */
    json_t *lp;            /* non-streamed: logprobs so far */
};

/* ---- the scheduler side: tokens out -------------------------------------------- */

/* Adds q to the outbox (under mu) so the loop looks at it. */
static void enlist(pt_req *q) {
    if (q->in_outbox) return;
    q->in_outbox = true;
    q->next_out = q->srv->outbox;
    q->srv->outbox = q;
}

static int on_token(void *user, const pt_sample_result *r) {
    pt_req *q = user;
    pt_server *s = q->srv;
    pt_metrics_token(&q->m->metrics, &q->clock); /* q->clock is this thread's while the job runs */
    pthread_mutex_lock(&s->mu);
    if (q->n_toks == q->cap_toks) {
        q->cap_toks = q->cap_toks ? 2 * q->cap_toks : 16;
        q->toks = pt_xrealloc(q->toks, sizeof *q->toks * (size_t)q->cap_toks);
    }
    q->toks[q->n_toks++] = *r;
    bool stop = q->stop_seen;
    enlist(q);
    pthread_mutex_unlock(&s->mu);
    pt_server_wake(s);
    return stop;
}

static void on_done(void *user, const pt_sched_stats *st) {
    pt_req *q = user;
    pt_server *s = q->srv; /* q may be freed by the loop once we unlock */
    pthread_mutex_lock(&s->mu);
    q->done = true;
    q->st = *st;
    enlist(q);
    pthread_mutex_unlock(&s->mu);
    pt_server_wake(s);
}

/* ---- the output filter (event loop) ---------------------------------------------- */

/* Releases the first k held bytes, with the pending tokens whose text
 * starts before the new end (all of them if all). */
static void release(pt_req *q, size_t k, bool all) {
    size_t end = q->released + k;
    int nt = 0;
    while (nt < q->n_pend && (all || q->pend[nt].start < end))
        nt++;
    if (k == 0 && nt == 0) return;
    piece *p = pt_xmalloc(sizeof *p + k);
    p->next = NULL;
    p->len = k;
    p->n_toks = nt;
    p->toks = NULL;
    if (k) {
        memcpy(p->text, q->hold, k);
        memmove(q->hold, q->hold + k, q->hold_len - k);
        q->hold_len -= k;
    }
    if (nt) {
        p->toks = pt_xmalloc(sizeof(gen_tok) * (size_t)nt);
        memcpy(p->toks, q->pend, sizeof(gen_tok) * (size_t)nt);
        memmove(q->pend, q->pend + nt, sizeof(gen_tok) * (size_t)(q->n_pend - nt));
        q->n_pend -= nt;
    }
    q->released = end;
    if (q->rel_tail)
        q->rel_tail->next = p;
    else
        q->rel_head = p;
    q->rel_tail = p;
}

static void hold_reserve(pt_req *q, size_t extra) {
    if (q->hold_len + extra <= q->hold_cap) return;
    while (q->hold_len + extra > q->hold_cap)
        q->hold_cap = q->hold_cap ? q->hold_cap * 2 : 256;
    q->hold = pt_xrealloc(q->hold, q->hold_cap);
}

/* One token through the filter.  A stop string ends the text here and
 * asks the scheduler to end the job. */
static void filter_token(pt_req *q, const pt_sample_result *r) {
    if (q->matched) return; /* computed after the stop: not part of the answer */
    const pt_tokenizer *tok = q->m->e->tok;
    size_t start = q->released + q->hold_len;
    q->n_used++;
    if (r->id < pt_tokenizer_n_vocab(tok)) {
        size_t plen;
        pt_token_bytes(tok, r->id, &plen);
        hold_reserve(q, plen + 72);
        q->hold_len +=
            pt_detok_push(&q->dt, r->id, q->hold + q->hold_len, q->hold_cap - q->hold_len);
    }
    if (q->logprobs) {
        if (q->n_pend == q->cap_pend) {
            q->cap_pend = q->cap_pend ? q->cap_pend * 2 : 16;
            q->pend = pt_xrealloc(q->pend, sizeof(gen_tok) * (size_t)q->cap_pend);
        }
        q->pend[q->n_pend++] = (gen_tok){*r, start};
    }
    bool matched;
    size_t k = pt_stop_scan(&q->stop, q->hold, q->hold_len, &matched);
    if (!matched) {
        release(q, k, false);
        return;
    }
    q->hold_len = k; /* the stop string and what follows are dropped */
    q->matched = true;
    release(q, k, false);
    q->n_pend = 0;
    pthread_mutex_lock(&q->srv->mu);
    q->stop_seen = true; /* on_token answers "stop" from now on */
    pthread_mutex_unlock(&q->srv->mu);
    pt_sched_cancel(q->m->sched, q->job); /* and a step that samples nothing ends it too */
}

/* The job ended: settle what was held back, and make the stats describe
 * the answer (a stop string ends it with "stop", whatever the job saw). */
static void filter_done(pt_req *q) {
    if (q->matched) {
        q->st.finish = PT_FINISH_STOP;
        q->st.n_generated = q->n_used;
        return;
    }
    if (q->st.finish == PT_FINISH_CANCEL || q->st.finish == PT_FINISH_NONE) return;
    /* the end of the text: what was held back for a stop string is final */
    hold_reserve(q, 72);
    q->hold_len += pt_detok_flush(&q->dt, q->hold + q->hold_len, q->hold_cap - q->hold_len);
    release(q, q->hold_len, true);
}

/* ---- JSON pieces ------------------------------------------------------------------ */

static json_t *real_or_floor(float x) {
    return json_real(isfinite(x) ? x : -9999.0); /* OpenAI's floor for impossible tokens */
}

static json_t *token_text(const pt_tokenizer *tok, int32_t id, json_t **bytes) {
    size_t n = 0;
    const char *b = id < pt_tokenizer_n_vocab(tok) ? pt_token_bytes(tok, id, &n) : "";
    if (bytes) *bytes = pt_oai_bytes(b, n);
    return pt_oai_string_lossy(b, n);
}

/* Chat format: {"token", "logprob", "bytes", "top_logprobs": [...]} */
static json_t *chat_logprob(const pt_tokenizer *tok, const pt_sample_result *r) {
    json_t *bytes, *e = json_object();
    json_object_set_new(e, "token", token_text(tok, r->id, &bytes));
    json_object_set_new(e, "logprob", real_or_floor(r->logprob));
    json_object_set_new(e, "bytes", bytes);
    json_t *top = json_array();
    for (int i = 0; i < r->n_top; i++) {
        json_t *t = json_object();
        json_object_set_new(t, "token", token_text(tok, r->top[i].id, &bytes));
        json_object_set_new(t, "logprob", real_or_floor(r->top[i].logprob));
        json_object_set_new(t, "bytes", bytes);
        json_array_append_new(top, t);
    }
    json_object_set_new(e, "top_logprobs", top);
    return e;
}

/* Completions format: parallel arrays tokens / token_logprobs / top_logprobs
 * / text_offset; appends to lp (created if NULL). */
static json_t *completion_logprobs(json_t *lp, const pt_tokenizer *tok, const gen_tok *t, int n) {
    if (!lp)
        lp = json_pack("{s:[], s:[], s:[], s:[]}", "tokens", "token_logprobs", "top_logprobs",
                       "text_offset");
    for (int i = 0; i < n; i++) {
        const pt_sample_result *r = &t[i].r;
        json_array_append_new(json_object_get(lp, "tokens"), token_text(tok, r->id, NULL));
        json_array_append_new(json_object_get(lp, "token_logprobs"), real_or_floor(r->logprob));
        json_t *top = json_object();
        for (int k = 0; k < r->n_top; k++) {
            json_t *key = token_text(tok, r->top[k].id, NULL);
            json_object_set_new(top, json_string_value(key), real_or_floor(r->top[k].logprob));
            json_decref(key);
        }
        json_array_append_new(json_object_get(lp, "top_logprobs"), top);
        json_array_append_new(json_object_get(lp, "text_offset"),
                              json_integer((json_int_t)t[i].start));
    }
    return lp;
}

static json_t *logprobs_of(pt_req *q, const gen_tok *t, int n) {
    const pt_tokenizer *tok = q->m->e->tok;
    if (!q->chat) return completion_logprobs(NULL, tok, t, n);
    json_t *content = json_array();
    for (int i = 0; i < n; i++)
        json_array_append_new(content, chat_logprob(tok, &t[i].r));
    return json_pack("{s:o}", "content", content);
}

static json_t *envelope(pt_req *q, const char *object) {
    return json_pack("{s:s, s:s, s:I, s:s, s:s}", "id", q->id, "object", object, "created",
                     (json_int_t)q->created, "model", q->m->id, "system_fingerprint",
                     "petrel");
}

/* One streamed chunk: text (may be empty), its tokens' logprobs, and the
 * finish reason on the last. */
static json_t *chunk_of(pt_req *q, json_t *delta, const gen_tok *t, int n, const char *finish) {
    json_t *c = envelope(q, "chat.completion.chunk");
    json_t *choice = json_pack("{s:i, s:o}", "index", q->index, "delta", delta);
    json_object_set_new(choice, "logprobs", q->logprobs && n ? logprobs_of(q, t, n) : json_null());
    json_object_set_new(choice, "finish_reason", finish ? json_string(finish) : json_null());
    json_object_set_new(c, "choices", json_pack("[o]", choice));
    if (q->include_usage) json_object_set_new(c, "usage", json_null());
    return c;
}

static json_t *chunk(pt_req *q, const char *text, size_t len, const gen_tok *t, int n,
                     const char *finish, bool role) {
    json_t *c = envelope(q, q->chat ? "chat.completion.chunk" : "text_completion");
    json_t *choice = json_pack("{s:i}", "index", q->index);
    json_t *s = json_stringn(text, len);
    if (!s) s = pt_oai_string_lossy(text, len);
    if (q->chat) {
        json_t *delta = json_object();
        if (role) json_object_set_new(delta, "role", json_string("assistant"));
        if (len || role)
            json_object_set_new(delta, "content", s);
        else
            json_decref(s);
        json_object_set_new(choice, "delta", delta);
    } else {
        json_object_set_new(choice, "text", s);
    }
    json_object_set_new(choice, "logprobs", q->logprobs && n ? logprobs_of(q, t, n) : json_null());
    json_object_set_new(choice, "finish_reason", finish ? json_string(finish) : json_null());
    json_object_set_new(c, "choices", json_pack("[o]", choice));
    if (q->include_usage) json_object_set_new(c, "usage", json_null());
    return c;
}

/* ---- the event-loop side ------------------------------------------------------------- */

static void free_pieces(piece *p) {
    while (p) {
        piece *next = p->next;
        free(p->toks);
        free(p);
        p = next;
    }
}

static void group_free(pt_group *g) {
    json_decref(g->choices);
    free(g->prompt);
    free(g->bias_ids);
    free(g->bias_vals);
    free(g->prediction);
    free(g->forced_name);
    pt_structured_free(g->structured);
    free(g->choice);
    free(g);
}

static void req_free(pt_req *q) {
    pt_server *s = q->srv;
    pt_group *g = q->grp;
    free_pieces(q->rel_head);
    free(q->toks);
    free(q->drain);
    pt_stop_free(&q->stop);
    free(q->hold);
    free(q->pend);
    if (q->text) evbuffer_free(q->text);
    json_decref(q->lp);
    if (q->split) pt_msgsplit_free(&q->msg);
    pt_structured_free(q->structured);
    g->choice[q->index] = NULL;
    if (--g->n_alive == 0) group_free(g);
    pt_slot *m = q->m;
    free(q);
    s->n_reqs--;
    m->n_active--;
    pt_server_req_done(s);
    pt_models_release(s, m);
}

static void note_stats(pt_req *q, const pt_sched_stats *st) {
    int n_dec = st->n_generated > 1 ? st->n_generated - 1 : 0;
    char choices[64] = "";
    if (q->grp->n > 1) /* what the other choices took from the prefix cache */
        snprintf(choices, sizeof choices, " choices=%d sibling_cached=%d", q->grp->n,
                 q->grp->sibling_cached);
    pt_conn_note(q->conn,
                 "%s prompt=%d cached=%d completion=%d ttft=%.1fms prefill=%.0ftok/s "
                 "decode=%.1ftok/s finish=%s%s%s",
                 q->id, st->n_prompt, st->n_cached, st->n_generated, st->ttft * 1e3,
                 st->t_prefill > 0 ? st->n_prompt / st->t_prefill : 0.0,
                 st->t_decode > 0 ? n_dec / st->t_decode : 0.0, pt_oai_finish_reason(st->finish),
                 q->stream ? " stream" : "", choices);
}

/* Why a job ended without an answer, as an HTTP error. */
static void failure(const pt_req *q, int *status, const char **code, char *msg, size_t cap) {
    if (q->st.finish == PT_FINISH_CANCEL) {
        *status = 503, *code = "server_shutting_down";
        snprintf(msg, cap, "the server is shutting down; the request was cancelled");
    } else {
        *status = 500, *code = "generation_failed";
        snprintf(msg, cap, "generation failed: %s", q->st.error);
    }
}

static bool failed(const pt_req *q) {
    return q->st.finish == PT_FINISH_CANCEL || q->st.finish == PT_FINISH_NONE;
}

static void send_event(pt_req *q, json_t *v) {
    struct evbuffer *b = evbuffer_new();
    pt_sse_json(b, v);
    json_decref(v);
    pt_http_stream_write(q->conn, b);
    evbuffer_free(b);
}

/* "tool_calls" when the answer made calls and ended on its own. */
static const char *finish_reason(const pt_req *q) {
    if (q->split && q->st.finish == PT_FINISH_STOP &&
        q->msg.n_calls + json_array_size(q->msg.calls) > 0)
        return "tool_calls";
    return pt_oai_finish_reason(q->st.finish);
}

/* The answer is out (or the client is gone): no choice writes again, and
 * the jobs still running are cancelled (their on_done frees them). */
static void group_close(pt_group *g) {
    for (int i = 0; i < g->n; i++) {
        pt_req *c = g->choice[i];
        if (!c) continue;
        c->conn = NULL;
        pthread_mutex_lock(&c->srv->mu);
        c->gone = true;
        uint64_t job = c->job;
        pthread_mutex_unlock(&c->srv->mu);
        if (job && !c->drain_done) pt_sched_cancel(c->m->sched, job);
    }
}

/* One error answers the whole request, whichever choice failed. */
static void group_error(pt_req *q, int status, const char *code, const char *param,
                        const char *msg) {
    pt_group *g = q->grp;
    if (!q->conn) return;
    if (g->began) {
        send_event(q, pt_error_json(status, NULL, code, param, msg));
        pt_http_stream_end(q->conn);
    } else {
        pt_http_error(q->conn, status, NULL, code, param, "%s", msg);
    }
    group_close(g);
}

static void job_error(pt_req *q) {
    int status;
    const char *code;
    char msg[320];
    note_stats(q, &q->st);
    failure(q, &status, &code, msg, sizeof msg);
    group_error(q, status, code, NULL, msg);
}

/* Usage of the whole request: the prompt once, the choices' completions
 * summed, the prompt's cache hits as choice 0 saw them. */
static json_t *group_usage(const pt_group *g) {
    json_t *u = pt_oai_usage(g->st0.n_prompt, g->n_completion, g->st0.n_cached);
    pt_oai_usage_spec(u, g->n_drafted, g->n_accepted);
    return u;
}

/* A choice's answer is complete; true when it was the last. */
static bool settle(pt_req *q) {
    pt_group *g = q->grp;
    g->n_completion += q->st.n_generated;
    g->n_drafted += q->st.n_drafted;
    g->n_accepted += q->st.n_accepted;
    if (q->index == 0) g->st0 = q->st;
    else if (q->st.n_cached < g->sibling_cached)
        g->sibling_cached = q->st.n_cached;
    return ++g->n_settled == g->n;
}

static void stream_end(pt_req *q) {
    if (failed(q)) {
        job_error(q);
        return;
    }
    pt_group *g = q->grp;
    json_t *last = chunk(q, "", 0, NULL, 0, finish_reason(q), false);
    if (!settle(q)) {
        send_event(q, last);
        return;
    }
    note_stats(q, &g->st0);
    if (q->include_usage) {
        send_event(q, last);
        last = envelope(q, q->chat ? "chat.completion.chunk" : "text_completion");
        json_object_set_new(last, "choices", json_array());
        json_object_set_new(last, "usage", group_usage(g));
    }
    json_object_set_new(last, "timings", pt_oai_timings(&g->st0));
    send_event(q, last);
    struct evbuffer *b = evbuffer_new();
    pt_sse_done(b);
    pt_http_stream_write(q->conn, b);
    evbuffer_free(b);
    pt_http_stream_end(q->conn);
    group_close(g);
}

/* The logprobs of a whole answer, or null when not asked for. */
static json_t *final_logprobs(pt_req *q) {
    if (!q->logprobs) return json_null();
    if (q->chat) return json_pack("{s:o}", "content", q->lp ? json_incref(q->lp) : json_array());
    return q->lp ? json_incref(q->lp) : completion_logprobs(NULL, q->m->e->tok, NULL, 0);
}

static json_t *whole_choice(pt_req *q) {
    size_t n = evbuffer_get_length(q->text);
    const char *t = n ? (const char *)evbuffer_pullup(q->text, -1) : "";
    json_t *choice = json_pack("{s:i}", "index", q->index);
    if (q->split) {
        json_object_set_new(choice, "message", pt_msgsplit_message(&q->msg));
    } else {
        json_t *text = json_stringn(t, n);
        if (!text) text = pt_oai_string_lossy(t, n);
        if (q->chat)
            json_object_set_new(choice, "message",
                                json_pack("{s:s, s:o}", "role", "assistant", "content", text));
        else
            json_object_set_new(choice, "text", text);
    }
    json_object_set_new(choice, "logprobs", final_logprobs(q));
    json_object_set_new(choice, "finish_reason", json_string(finish_reason(q)));
    return choice;
}

static void reply_whole(pt_req *q) {
    if (failed(q)) {
        job_error(q);
        return;
    }
    pt_group *g = q->grp;
    json_array_set_new(g->choices, (size_t)q->index, whole_choice(q));
    if (!settle(q)) return;
    note_stats(q, &g->st0);
    json_t *r = envelope(q, q->chat ? "chat.completion" : "text_completion");
    json_object_set(r, "choices", g->choices);
    json_object_set_new(r, "usage", group_usage(g));
    json_object_set_new(r, "timings", pt_oai_timings(&g->st0));
    pt_http_reply_json(q->conn, 200, r);
    json_decref(r);
    group_close(g);
}

/* Non-streamed: keep the text and logprobs until the end. */
static void accumulate(pt_req *q, const piece *p) {
    if (q->split)
        pt_msgsplit_push(&q->msg, p->text, p->len);
    else
        evbuffer_add(q->text, p->text, p->len);
    if (!q->logprobs || p->n_toks == 0) return;
    if (!q->chat) {
        q->lp = completion_logprobs(q->lp, q->m->e->tok, p->toks, p->n_toks);
        return;
    }
    if (!q->lp) q->lp = json_array();
    for (int i = 0; i < p->n_toks; i++)
        json_array_append_new(q->lp, chat_logprob(q->m->e->tok, &p->toks[i].r));
}

/* A split answer's text as reasoning, content and tool-call deltas; the
 * tokens' logprobs ride on the first. */
static void stream_split(pt_req *q, const char *text, size_t len, const gen_tok *toks, int nt,
                         bool done) {
    pt_msgsplit_push(&q->msg, text, len);
    if (done) pt_msgsplit_finish(&q->msg);
    json_t *deltas = pt_msgsplit_deltas(&q->msg);
    pt_msgsplit_taken(&q->msg);
    if (json_array_size(deltas) == 0 && nt) json_array_append_new(deltas, json_object());
    size_t i;
    json_t *d;
    json_array_foreach(deltas, i, d) {
        send_event(q, chunk_of(q, json_incref(d), i ? NULL : toks, i ? 0 : nt, NULL));
    }
    json_decref(deltas);
}

/* Streamed: everything that arrived since the last wakeup goes out as one
 * chunk (fewer, larger writes when the loop falls behind). */
static void stream_pieces(pt_req *q, const piece *p, bool done) {
    size_t len = 0;
    int nt = 0;
    for (const piece *x = p; x; x = x->next)
        len += x->len, nt += x->n_toks;
    if (len == 0 && nt == 0 && !(done && q->split)) return;
    char *text = pt_xmalloc(len + 1);
    gen_tok *toks = pt_xmalloc(sizeof(gen_tok) * (size_t)(nt ? nt : 1));
    len = 0, nt = 0;
    for (const piece *x = p; x; x = x->next) {
        memcpy(text + len, x->text, x->len);
        if (x->n_toks) memcpy(toks + nt, x->toks, sizeof(gen_tok) * (size_t)x->n_toks);
        len += x->len, nt += x->n_toks;
    }
    if (q->split)
        stream_split(q, text, len, toks, nt, done);
    else if (len || nt)
        send_event(q, chunk(q, text, len, toks, nt, NULL, false));
    free(text);
    free(toks);
}

static void submit_siblings(pt_group *g);

static void deliver_one(pt_req *q) {
    pt_group *g = q->grp;
    bool done = q->drain_done;
    if (done && q->fail.status) { /* refused before its job ran */
        group_error(q, q->fail.status, q->fail.code, q->fail.param, q->fail.msg);
        if (q->index == 0 && !g->siblings_out) { /* they were never submitted */
            g->siblings_out = true;
            for (int i = 1; i < g->n; i++) req_free(g->choice[i]);
        }
        req_free(q);
        return;
    }
    /* choice 0 has started: its prompt's pages are in the prefix cache now */
    if (q->index == 0 && !g->siblings_out && (q->n_drain || done)) submit_siblings(g);
    for (int i = 0; i < q->n_drain; i++) filter_token(q, &q->drain[i]);
    q->n_drain = 0;
    if (done) {
        filter_done(q);
        pt_metrics_done(&q->m->metrics, &q->clock, &q->st, q->index == 0);
    }
    piece *p = q->rel_head;
    q->rel_head = q->rel_tail = NULL;
    if (q->conn && q->stream && !g->began) {
        pt_http_stream_begin(q->conn, 200, "text/event-stream", NULL);
        g->began = true;
    }
    if (q->conn && q->stream && q->chat && !q->began)
        send_event(q, chunk(q, "", 0, NULL, 0, NULL, true)); /* the role comes first */
    q->began = true;
    if (q->conn) {
        if (q->stream) {
            stream_pieces(q, p, done && !failed(q));
            if (done)
                stream_end(q);
            else if (pt_conn_backlog(q->conn) > BACKLOG_LIMIT) {
                pt_conn_abort(q->conn, "client too slow");
                group_close(g);
            }
        } else {
            for (const piece *x = p; x; x = x->next)
                accumulate(q, x);
            if (done && q->split && !failed(q)) pt_msgsplit_finish(&q->msg);
            if (done) reply_whole(q);
        }
    }
    free_pieces(p);
    if (done) req_free(q);
}

void pt_server_deliver(pt_server *s) {
    pt_req *list = NULL;
    pthread_mutex_lock(&s->mu);
    for (pt_req *q = s->outbox; q; q = q->next_out) {
        q->in_outbox = false;
        /* swap the token arrays: the outbox gets the emptied one back */
        pt_sample_result *t = q->drain;
        int cap = q->cap_drain;
        q->drain = q->toks, q->n_drain = q->n_toks, q->cap_drain = q->cap_toks;
        q->toks = t, q->n_toks = 0, q->cap_toks = cap;
        q->drain_done = q->done && !q->front_busy;
        q->next_drain = list;
        list = q;
    }
    s->outbox = NULL;
    pthread_mutex_unlock(&s->mu);
    /* the list is newest first; order between requests does not matter */
    while (list) {
        pt_req *q = list;
        list = q->next_drain;
        deliver_one(q);
    }
}

static void on_gone(void *user) {
    group_close(user);
}

/* ---- from request to job --------------------------------------------------------------- */

/* Called on the loop (ids) and on the prompt worker (seeds). */
static uint64_t random_seed(void) {
    static _Atomic uint64_t counter;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t z =
        (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 30) ^ ((atomic_fetch_add(&counter, 1) + 1) * 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull; /* splitmix64 finalizer */
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void make_id(pt_req *q) {
    uint64_t a = random_seed(), b = random_seed();
    snprintf(q->id, sizeof q->id, "%s-%012llx%012llx", q->chat ? "chatcmpl" : "cmpl",
             (unsigned long long)(a & 0xffffffffffffull),
             (unsigned long long)(b & 0xffffffffffffull));
}

/* Records why the worker refused the request (answered on the loop). */
static int refuse(pt_req *q, int status, const char *code, const char *param, const char *msg) {
    q->fail.status = status;
    q->fail.code = code;
    q->fail.param = param;
    snprintf(q->fail.msg, sizeof q->fail.msg, "%s", msg);
    return -1;
}

static void append(char **text, size_t *len, const char *s) {
    size_t k = strlen(s);
    *text = pt_xrealloc(*text, *len + k + 1);
    memcpy(*text + *len, s, k + 1);
    *len += k;
}

/* What the rendered chat prompt tells the output filter (a <think> left
 * open), and the call markup a forced tool call starts from.  A grammar
 * (a forced call, response_format) constrains the answer from its first
 * token, so a prompt that left <think> open is closed first: the answer
 * is then content, not reasoning.  Harmony (gpt-oss) keeps special tokens
 * in the text (they are its markers), and the header a grammar cannot
 * write (special tokens are outside every grammar) goes into the prompt. */
static void chat_prompt_end(pt_req *q, pt_server *s, bool constrained, char **text, size_t *len) {
    pt_msgsplit_opts *o = &q->msg_opts;
    o->think = pt_chat_tmpl_thinks(q->m->tmpl);
    o->think_inside = o->think && pt_reason_prompt_open(*text, *len);
    o->tool_family = pt_chat_tmpl_tool_family(q->m->tmpl);
    o->tools = q->tools.mode != PT_TOOL_NONE;
    o->tool_forced = q->tools.mode == PT_TOOL_REQUIRED || q->tools.mode == PT_TOOL_NAMED;
    o->id_seed = random_seed();
    o->harmony = pt_chat_tmpl_harmony(q->m->tmpl);
    if (o->harmony) {
        q->dt.skip_special = false; /* the prompt ends with <|start|>assistant */
        if (o->tool_forced) {
            const char *name = pt_tools_forced_name(q->oai.tools, &q->tools);
            if (name) o->forced_name = q->grp->forced_name = pt_xstrdup(name);
            char *h = pt_harmony_call_header(name);
            append(text, len, h);
            free(h);
        } else if (constrained) {
            append(text, len, PT_HARMONY_FINAL_HEADER);
            o->harmony_final = true;
        }
        return;
    }
    if ((constrained || o->tool_forced) && o->think_inside) {
        append(text, len, "\n</think>\n\n");
        o->think_inside = false;
    }
    if (o->tool_forced) append(text, len, pt_tools_call_prefix(o->tool_family));
}

/* The template's extra variables (a new reference, or NULL):
 * chat_template_kwargs, and reasoning_effort unless they set it. */
static json_t *template_vars(const pt_oai_request *r) {
    json_t *v = r->template_kwargs ? json_copy(r->template_kwargs) : NULL;
    if (r->reasoning_effort && !json_object_get(v, "reasoning_effort")) {
        if (!v) v = json_object();
        json_object_set_new(v, "reasoning_effort", json_string(r->reasoning_effort));
    }
    return v;
}

/* The prompt's token ids; on error records the failure and returns -1. */
static int prompt_tokens(pt_req *q, pt_server *s, const pt_oai_request *r, int32_t **ids,
                         size_t *n) {
    pt_err err = {{0}};
    const pt_tokenizer *tok = q->m->e->tok;
    if (r->prompt_ids) {
        *n = (size_t)r->n_prompt_ids;
        *ids = pt_xmalloc(sizeof(int32_t) * *n);
        memcpy(*ids, r->prompt_ids, sizeof(int32_t) * *n);
        return 0;
    }
    if (r->kind == PT_OAI_COMPLETION) {
        if (pt_tokenize(tok, r->prompt, r->prompt_len, true, true, ids, n, &err) == 0) return 0;
        return refuse(q, 400, "invalid_prompt", "prompt", err.msg);
    }
    char *text;
    size_t len;
    pt_tools_prepare_messages(r->messages);
    if (pt_chat_tmpl_harmony(q->m->tmpl)) pt_harmony_prepare_messages(r->messages);
    json_t *extra = template_vars(r);
    int bad = pt_chat_tmpl_render(q->m->tmpl, r->messages, r->tools, extra, &text, &len, &err);
    json_decref(extra);
    if (bad) return refuse(q, 400, "invalid_messages", "messages", err.msg);
    chat_prompt_end(q, s, r->response_format != NULL, &text, &len);
    /* the template writes any BOS itself; add one only if it did not */
    int rc = pt_tokenize(tok, text, len, false, true, ids, n, &err);
    free(text);
    if (rc) return refuse(q, 400, "invalid_messages", "messages", err.msg);
    int32_t bos = pt_tokenizer_bos(tok);
    if (pt_tokenizer_adds_bos(tok) && bos >= 0 && (*n == 0 || (*ids)[0] != bos)) {
        *ids = pt_xrealloc(*ids, sizeof(int32_t) * (*n + 1));
        memmove(*ids + 1, *ids, sizeof(int32_t) * *n);
        (*ids)[0] = bos;
        (*n)++;
    }
    return 0;
}

/* Choice index of group g; choice 0 takes r's stop strings, the others
 * copy them, and all answer under choice 0's id. */
static pt_req *req_new(pt_server *s, pt_slot *m, pt_conn *c, pt_oai_request *r, pt_group *g,
                       int index) {
    pt_req *q = pt_xcalloc(1, sizeof *q);
    q->srv = s;
    q->m = m;
    m->n_active++;
    q->conn = c;
    q->grp = g;
    q->index = index;
    g->choice[index] = q;
    q->kind = r->kind;
    q->chat = r->kind == PT_OAI_CHAT;
    q->stream = r->stream;
    q->include_usage = r->stream && r->include_usage;
    q->logprobs = r->logprobs;
    q->created = (long)time(NULL);
    pt_metrics_arrival(&q->clock);
    if (index == 0) {
        make_id(q);
        q->stop = r->stop; /* the request gives its stop strings to q */
        memset(&r->stop, 0, sizeof r->stop);
    } else {
        const pt_req *q0 = g->choice[0];
        memcpy(q->id, q0->id, sizeof q->id);
        q->created = q0->created;
        for (int i = 0; i < q0->stop.n; i++)
            pt_stop_add(&q->stop, q0->stop.str[i], q0->stop.len[i], NULL); /* checked already */
    }
    pt_detok_init(&q->dt, m->e->tok);
    q->dt.at_start = q->chat; /* a reply is a text of its own; a completion continues the prompt */
    if (!q->stream) q->text = evbuffer_new();
    s->n_reqs++;
    return q;
}

/* Parses on the loop (cheap, and errors answer at once); the prompt goes
 * to the worker. */
static void handle(pt_conn *c, const char *body, size_t len, int kind) {
    pt_server *s = pt_conn_server(c);
    if (pt_server_loading(c)) return;
    if (s->state != SRV_RUNNING) {
        pt_http_error(c, 503, NULL, "server_shutting_down", NULL, "the server is shutting down");
        return;
    }
    pt_slot *m = pt_models_route(c, body, len, kind);
    if (m) pt_handle_on(c, m, body, len, kind);
}

void pt_handle_on(pt_conn *c, pt_slot *m, const char *body, size_t len, int kind) {
    pt_server *s = pt_conn_server(c);
    if (s->state != SRV_RUNNING) {
        pt_http_error(c, 503, NULL, "server_shutting_down", NULL, "the server is shutting down");
        return;
    }
    pt_oai_request r;
    pt_oai_error e;
    if (pt_oai_parse(&r, kind, body, len, &m->lim, &e)) {
        pt_http_error(c, e.status, e.type, e.code, e.param[0] ? e.param : NULL, "%s", e.message);
        return;
    }
    pt_tool_choice tools = {0};
    if (kind == PT_OAI_CHAT) {
        pt_err err = {{0}};
        const char *param = "tools";
        if (pt_tools_check(r.tools, json_object_get(r.root, "tool_choice"),
                           json_object_get(r.root, "parallel_tool_calls"), &tools, &param, &err)) {
            pt_http_error(c, 400, NULL, "invalid_value", param, "%s", err.msg);
            pt_oai_request_free(&r);
            return;
        }
    }
    pt_group *g = pt_xcalloc(1, sizeof *g);
    g->n = g->n_alive = r.n;
    g->choice = pt_xcalloc((size_t)r.n, sizeof *g->choice);
    g->choices = json_array();
    for (int i = 0; i < r.n; i++) json_array_append_new(g->choices, json_null());
    g->siblings_out = r.n == 1;
    g->sibling_cached = INT_MAX;
    pt_req *q = req_new(s, m, c, &r, g, 0);
    for (int i = 1; i < r.n; i++) req_new(s, m, c, &r, g, i);
    q->tools = tools;
    q->oai = r; /* q owns the parsed request now */
    q->front_busy = true;
    pt_conn_on_gone(c, on_gone, g);
    pt_front_push(s, q);
}

/* The grammar of a forced call's output: the family's call markup after
 * its prefix; for harmony, whose header (in the prompt) names the
 * function, the arguments alone, or when the model picks among several
 * tools one {"name", "arguments"} object (a harmony message holds one). */
static int forced_call_grammar(const pt_req *q, const pt_oai_request *r, pt_grammar **g,
                               pt_err *err) {
    if (!q->msg_opts.harmony)
        return pt_tools_forced_grammar(r->tools, &q->tools, q->msg_opts.tool_family, g, err);
    if (q->msg_opts.forced_name)
        return pt_tools_args_grammar(r->tools, q->msg_opts.forced_name, g, err);
    pt_tool_choice one = q->tools;
    one.parallel_asked = false;
    return pt_tools_forced_grammar(r->tools, &one, PT_TOOLS_HERMES, g, err);
}

/* Compiles response_format into q->structured; a schema it cannot
 * enforce is a 400 naming the feature. */
static int structured_compile(pt_req *q, pt_server *s, const pt_oai_request *r) {
    pt_err err = {{0}};
    if (q->msg_opts.tool_forced) { /* the call's grammar; it wins over response_format */
        pt_grammar *g;
        if (forced_call_grammar(q, r, &g, &err))
            return refuse(q, 400, "invalid_value", "tools", err.msg);
        q->structured = pt_structured_new(g, q->m->e->tok);
        return 0;
    }
    if (!r->response_format) return 0;
    const char *param = "response_format";
    if (pt_structured_from_response_format(&q->structured, r->response_format, q->m->e->tok, &param,
                                           &err))
        return refuse(q, 400, "invalid_value", param, err.msg);
    return 0;
}

/* The request's speculation: the server's (--spec), or with a Predicted
 * Output that text as the first draft source, whatever --spec says (the
 * client asked for it).  *pred holds the prediction's tokens until the
 * job is submitted (the scheduler copies them). */
static int speculation(pt_server *s, const pt_slot *m, const pt_oai_request *r,
                       pt_spec_params *sp, int32_t **pred, pt_err *err) {
    *sp = s->o.spec;
    if (!r->prediction) return 0;
    size_t n = 0;
    if (pt_tokenize(m->e->tok, r->prediction, r->prediction_len, false, false, pred, &n, err))
        return -1;
    sp->kind = PT_SPEC_NGRAM; /* with --spec draft too: the prediction is the better guess */
    /* tokens past the context can never be emitted, so never drafted */
    sp->prediction = *pred;
    sp->n_prediction = (int)PT_MIN(n, (size_t)m->n_ctx);
    return 0;
}

/* Choice 0's job, kept for choices 1..n-1 (submitted by the loop). */
static void keep_for_siblings(pt_req *q, const pt_sched_job *job, const pt_oai_request *r) {
    pt_group *g = q->grp;
    g->job = *job;
    g->prompt = pt_xmalloc(sizeof(int32_t) * (size_t)job->n_prompt);
    memcpy(g->prompt, job->prompt, sizeof(int32_t) * (size_t)job->n_prompt);
    g->job.prompt = g->prompt;
    if (job->n_bias) {
        g->bias_ids = pt_xmalloc(sizeof(int32_t) * (size_t)job->n_bias);
        g->bias_vals = pt_xmalloc(sizeof(float) * (size_t)job->n_bias);
        memcpy(g->bias_ids, job->bias_ids, sizeof(int32_t) * (size_t)job->n_bias);
        memcpy(g->bias_vals, job->bias_vals, sizeof(float) * (size_t)job->n_bias);
    }
    g->job.bias_ids = g->bias_ids, g->job.bias_vals = g->bias_vals;
    const pt_spec_params *sp = &job->params.spec;
    if (sp->n_prediction > 0) { /* the caller frees its copy once choice 0 is submitted */
        g->prediction = pt_xmalloc(sizeof(int32_t) * (size_t)sp->n_prediction);
        memcpy(g->prediction, sp->prediction, sizeof(int32_t) * (size_t)sp->n_prediction);
    }
    g->job.params.spec.prediction = g->prediction;
    g->seed_given = r->seed_given;
    g->structured = q->structured; /* the group's now: it outlives every choice's job */
    q->structured = NULL;
}

/* On the loop, once choice 0 has started: the other choices' jobs.  A
 * choice that cannot be submitted fails the request as choice 0 would. */
static void submit_siblings(pt_group *g) {
    pt_req *q0 = g->choice[0];
    pt_server *s = q0->srv;
    g->siblings_out = true;
    bool doomed = !q0->conn || (q0->drain_done && failed(q0));
    for (int i = 1; i < g->n; i++) {
        pt_req *q = g->choice[i];
        if (doomed) {
            req_free(q); /* no other thread knows it */
            continue;
        }
        q->msg_opts = q0->msg_opts;
        q->msg_opts.id_seed = random_seed();
        q->dt.skip_special = q0->dt.skip_special;
        q->n_prompt = q0->n_prompt;
        if (q->chat && (q->msg_opts.think || q->msg_opts.tools || q->msg_opts.harmony)) {
            pt_msgsplit_init(&q->msg, &q->msg_opts);
            q->split = true;
        }
        pt_sched_job job = g->job;
        job.user = q;
        /* seeded: distinct and reproducible per choice */
        job.params.sampling.seed = g->seed_given ? g->job.params.sampling.seed + (uint64_t)i
                                                 : random_seed();
        pt_err err = {{0}};
        uint64_t id = pt_sched_submit(q->m->sched, &job, &err);
        pthread_mutex_lock(&s->mu);
        q->job = id;
        if (!id) {
            refuse(q, 503, "server_busy", NULL, err.msg);
            q->done = true;
            enlist(q);
        }
        pthread_mutex_unlock(&s->mu);
        if (!id) pt_server_wake(s);
    }
}

/* Tokenizes and submits q, or records why not; then tells the loop. */
static int front_submit(pt_server *s, pt_req *q) {
    pt_oai_request *r = &q->oai;
    int32_t *ids = NULL;
    size_t n = 0;
    if (prompt_tokens(q, s, r, &ids, &n)) return -1;
    int n_ctx = q->m->n_ctx;
    if ((int64_t)n >= n_ctx) {
        char msg[256];
        snprintf(msg, sizeof msg,
                 "This model's maximum context length is %d tokens, but the prompt has %zu "
                 "tokens; shorten it or start the server with a larger --ctx",
                 n_ctx, n);
        free(ids);
        return refuse(q, 400, "context_length_exceeded",
                      r->kind == PT_OAI_CHAT ? "messages" : "prompt", msg);
    }
    if (structured_compile(q, s, r)) {
        free(ids);
        return -1;
    }
    pt_sched_job job = {.prompt = ids,
                        .n_prompt = (int)n,
                        .on_token = on_token,
                        .on_done = on_done,
                        .user = q,
                        .bias_ids = r->bias_ids,
                        .bias_vals = r->bias_vals,
                        .n_bias = r->n_bias};
    job.params.sampling = r->sampling;
    if (!r->seed_given) job.params.sampling.seed = random_seed();
    job.params.max_tokens = r->max_tokens;
    job.params.ignore_eos = r->ignore_eos;
    if (q->structured) job.add_procs = pt_structured_add_procs, job.proc_arg = q->structured;
    q->n_prompt = (int)n;
    if (q->chat && (q->msg_opts.think || q->msg_opts.tools || q->msg_opts.harmony)) {
        pt_msgsplit_init(&q->msg, &q->msg_opts); /* before the first token can arrive */
        q->split = true;
    }
    pt_err err = {{0}};
    int32_t *pred = NULL;
    if (speculation(s, q->m, r, &job.params.spec, &pred, &err)) {
        free(ids);
        return refuse(q, 400, "invalid_value", "prediction", err.msg);
    }
    if (pt_sched_check(q->m->sched, &job, &err)) { /* never runnable here: the client's to fix */
        free(ids);
        free(pred);
        return refuse(q, 400, "context_length_exceeded",
                      r->kind == PT_OAI_CHAT ? "messages" : "prompt", err.msg);
    }
    if (q->grp->n > 1) keep_for_siblings(q, &job, r);
    uint64_t id = pt_sched_submit(q->m->sched, &job, &err);
    free(ids);
    free(pred);
    if (!id) return refuse(q, 503, "server_busy", NULL, err.msg);
    /* q->front_busy keeps q alive even if the job is already done */
    pthread_mutex_lock(&s->mu);
    q->job = id;
    bool gone = q->gone;
    pthread_mutex_unlock(&s->mu);
    if (gone) pt_sched_cancel(q->m->sched, id); /* it left while we tokenized */
    return 0;
}

void pt_front_work(pt_server *s, pt_req *q, bool shutting_down) {
    pthread_mutex_lock(&s->mu);
    bool gone = q->gone;
    pthread_mutex_unlock(&s->mu);
    int rc;
    if (shutting_down)
        rc = refuse(q, 503, "server_shutting_down", NULL, "the server is shutting down");
    else if (gone)
        rc = refuse(q, 499, "client_closed_request", NULL, "the client left");
    else
        rc = front_submit(s, q);
    pt_oai_request_free(&q->oai);
    /* The worker's last touch: after this the loop may free q.  A failure
     * is final news; a success lets a stream's head go out. */
    pthread_mutex_lock(&s->mu);
    q->front_busy = false;
    if (rc) q->done = true;
    enlist(q);
    pthread_mutex_unlock(&s->mu);
    pt_server_wake(s);
}

void pt_handle_chat(pt_conn *c, const char *body, size_t len) {
    handle(c, body, len, PT_OAI_CHAT);
}

void pt_handle_completions(pt_conn *c, const char *body, size_t len) {
    handle(c, body, len, PT_OAI_COMPLETION);
}
