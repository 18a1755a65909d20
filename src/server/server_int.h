/*
 * server_int.h - what the files of src/server share: the server object, the
 * route handlers, and the few connection calls http.h leaves out.
 *
 * Thread rules: everything here belongs to the event-loop thread except
 * what `mu` guards (the outbox of generation results, filled by the
 * scheduler thread and the prompt worker) and pt_server_wake, which any
 * thread may call.
 */
#ifndef PETREL_SERVER_INT_H
#define PETREL_SERVER_INT_H

#include <pthread.h>

#include "engine/scheduler.h"
#include "server/http.h"
#include "server/metrics.h"
#include "server/openai.h"
#include "server/server.h"

struct event;
typedef struct pt_req pt_req;
typedef struct pt_chat_tmpl pt_chat_tmpl;
typedef struct pt_front pt_front;

/* SRV_LOADING: listening, the first model not loaded yet: /health says
 * "loading", generation routes answer 503 model_loading. */
enum { SRV_RUNNING, SRV_DRAINING, SRV_CANCELLING, SRV_LOADING };
typedef struct pt_loader pt_loader;
typedef struct pt_pending pt_pending;

/* A model of the pool (pool.c).  SLOT_EVICTING: chosen to make room; it
 * takes no new request and is unloaded once its last one is freed. */
enum { SLOT_UNLOADED, SLOT_LOADING, SLOT_LOADED, SLOT_EVICTING };

/* The loop thread owns a slot's state and its lists.  While it is loaded,
 * e, sched, tmpl, lim, parallel and n_ctx do not change, and the prompt
 * worker and the scheduler thread read them through the requests that
 * use the slot: n_active > 0 keeps it loaded. */
typedef struct pt_slot {
    char id[256];
    const char *path;
    int state; /* SLOT_* */
    pt_engine *e;
    pt_sched *sched;
    pt_chat_tmpl *tmpl; /* the chat template (prompt.c) */
    pt_oai_limits lim;
    int parallel, n_ctx; /* the server's options as this engine allows them */
    long created;        /* unix time it was loaded, for /v1/models */
    double last_used;    /* pt_now() when a request was last routed to it */
    int n_active;        /* generation requests alive that use it */
    size_t file_bytes;   /* the weights on disk */
    size_t kv_bytes;     /* its KV pool at the last load; 0 before one */
    double load_seconds; /* the last load, start-up included */
    pt_pending *wait_head, *wait_tail; /* requests waiting for it to load */
    pt_metrics metrics; /* its part of GET /metrics; its own lock */
} pt_slot;

struct pt_server {
    pt_slot *slots; /* the models, in the order given; slots[0] loads first */
    int n_slots;
    pt_server_load_fn load; /* opens an engine (the command line's) */
    void *load_arg;
    pt_loader *loader; /* the load in progress, or NULL (one at a time) */
    bool load_failed;  /* the first model did not load: load_err says why */
    pt_err load_err;
    int n_pending;     /* requests waiting for a model to load */
    pt_front *front;   /* the prompt worker (front.c) */
    pt_http *http;
    struct event_base *base;
    pt_server_opts o;
    struct event *wake, *sig_int, *sig_term, *grace;
    int state;  /* SRV_* */
    int n_reqs; /* generation requests alive */
    uint64_t n_served;

    pthread_mutex_t mu; /* guards the outbox and each pt_req's shared part */
    pt_req *outbox;     /* requests with news for the event loop */
};

/* A log line (with a timestamp) unless --quiet.  Any thread. */
void pt_server_log(pt_server *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Wakes the event loop to look at the outbox.  Any thread. */
void pt_server_wake(pt_server *s);
/* The event loop found news in the outbox (completion.c). */
void pt_server_deliver(pt_server *s);
/* A generation request ended and was freed; the server may be able to exit. */
void pt_server_req_done(pt_server *s);

/* The handler's part of the request's log line. */
void pt_conn_note(pt_conn *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Drops the connection now (no gone callback). */
void pt_conn_abort(pt_conn *c, const char *why);
/* {"error": {...}}; type NULL: from the status. */
json_t *pt_error_json(int status, const char *type, const char *code, const char *param,
                      const char *msg);

/* While loading: answers 503 model_loading and returns true. */
bool pt_server_loading(pt_conn *c);

/* ---- the model pool (pool.c) ---- */

/* Slots from o->models, none loaded; sizes the files. */
void pt_models_init(pt_server *s);
/* Unloads everything, joins a load in progress, frees the slots. */
void pt_models_free(pt_server *s);
/* Starts loading slot m on the loading thread; 0, or -1 with err set. */
int pt_models_load(pt_server *s, pt_slot *m, pt_err *err);
/* The slot a generation request is for.  NULL when it was answered here
 * (an unknown model: 404) or queued until its model loads (then the pool
 * calls pt_handle_on with a copy of the body). */
pt_slot *pt_models_route(pt_conn *c, const char *body, size_t len, int kind);
/* A request of m was freed (n_active dropped): an evicting model may go. */
void pt_models_release(pt_server *s, pt_slot *m);
/* Shutdown: answers the waiting requests 503. */
void pt_models_drain(pt_server *s);
/* Requests waiting for m to load. */
int pt_models_n_waiting(const pt_slot *m);
/* "loaded", "loading", "unloaded", "evicting". */
const char *pt_slot_state(const pt_slot *m);
/* The slot named id, or NULL. */
pt_slot *pt_models_find(pt_server *s, const char *id);
/* "'a', 'b'" - the models served, for error messages. */
void pt_models_names(const pt_server *s, char *out, size_t cap);
/* The engine's part of start-up for a loaded slot (server.c). */
int pt_slot_start(pt_server *s, pt_slot *m, pt_err *err);
/* Its scheduler, template and engine go (the requests are gone). */
void pt_slot_stop(pt_slot *m);
/* The first model is ready: the server starts answering (server.c). */
void pt_server_ready(pt_server *s);

/* A routed generation request (completion.c). */
void pt_handle_on(pt_conn *c, pt_slot *m, const char *body, size_t len, int kind);

/* Route handlers: body[0..len) is the whole request body. */
void pt_handle_health(pt_conn *c, const char *body, size_t len);
void pt_handle_models(pt_conn *c, const char *body, size_t len);
void pt_handle_model(pt_conn *c, const char *body, size_t len);
void pt_handle_chat(pt_conn *c, const char *body, size_t len);
void pt_handle_completions(pt_conn *c, const char *body, size_t len);
void pt_handle_metrics(pt_conn *c, const char *body, size_t len); /* metrics.c */

/* The prompt worker (front.c): renders and tokenizes requests off the
 * event loop, in arrival order, and submits them. */
int pt_front_start(pt_server *s, pt_err *err);
void pt_front_push(pt_server *s, pt_req *q);
/* Answers what is still queued "shutting down" and joins the thread. */
void pt_front_stop(pt_server *s);
/* On the worker: prompt -> ids -> scheduler job, or a failure posted to
 * the loop; shutting_down refuses it instead (completion.c). */
void pt_front_work(pt_server *s, pt_req *q, bool shutting_down);

/* Chat prompts (prompt.c): the model's template, or --chat-template. */
int pt_chat_tmpl_open(pt_chat_tmpl **out, pt_engine *e, const char *override_path, pt_err *err);
void pt_chat_tmpl_free(pt_chat_tmpl *t);
const char *pt_chat_tmpl_source(const pt_chat_tmpl *t); /* "gguf", "file", "builtin", ... */
/* Read off the template's source: its tool-call markup (PT_TOOLS_*) and
 * whether it writes <think> tags. */
int pt_chat_tmpl_tool_family(const pt_chat_tmpl *t);
bool pt_chat_tmpl_thinks(const pt_chat_tmpl *t);
bool pt_chat_tmpl_harmony(const pt_chat_tmpl *t); /* harmony.h's format (gpt-oss) */
/* Renders messages (tools and extra variables may be NULL) with the
 * generation prompt added.  *out is malloc'd.  Returns 0, or -1 with err
 * set: a message for the client (the template raised, or failed on these
 * messages). */
int pt_chat_tmpl_render(const pt_chat_tmpl *t, const json_t *messages, const json_t *tools,
                        const json_t *extra, char **out, size_t *out_len, pt_err *err);

#endif
