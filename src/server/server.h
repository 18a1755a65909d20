/*
 * server.h - `petrel serve`: an OpenAI-compatible HTTP server over one
 * engine.  The only entry point the command line needs.
 *
 * Threads: the calling thread runs the libevent loop (HTTP, JSON, SSE); the
 * scheduler thread (engine/scheduler.h) owns the engine and batches every
 * running request into one forward per step.  docs/server.md has the whole
 * picture.
 */
#ifndef PETREL_SERVER_H
#define PETREL_SERVER_H

#include "engine/engine.h"

typedef struct pt_server_opts {
    const char *host;          /* default 127.0.0.1 */
    int port;                  /* default 8080; 0 = any free port */
    const char *api_key;       /* NULL: no auth; "" is refused (a start-up error) */
    size_t max_body;           /* bytes; default 8 MiB */
    int parallel;              /* sequences decoded together; default 8 */
    int max_queue;             /* waiting requests before 503; default 1024 */
    int max_prefill;           /* prompt tokens per step; default: the batch */
    int n_ctx;                 /* positions per sequence; default the engine's */
    const char *model_id;      /* name in /v1/models; default from the path */
    const char *chat_template; /* a file overriding the model's template */
    int idle_timeout;          /* seconds; default 60 */
    int header_timeout;        /* seconds a request head may take; default 10 */
    int min_body_rate;         /* bytes/s a body must keep up; default 1024, < 0: none */
    int max_conns;             /* open connections; default from RLIMIT_NOFILE */
    const char *allowed_hosts; /* Host names served besides loopback ones; "*": any */
    const char *cors_origins;  /* origins web pages may call from; "*": any */
    int shutdown_timeout;      /* seconds in-flight requests get on SIGTERM; default 10 */
    const char *port_file;     /* write the bound port here once listening */
    bool quiet;                /* no per-request log lines */
    pt_spec_params spec;       /* --spec: every request's drafter (prediction aside) */
} pt_server_opts;

/* Serves until SIGINT/SIGTERM; returns 0 after a clean shutdown, or -1 with
 * err set if it could not start.  e stays the caller's (not closed). */
int pt_server_run(pt_engine *e, const pt_server_opts *o, pt_err *err);

/* Opens the engine for pt_server_run_loading, on a thread of its own;
 * returns 0, or -1 with err set. */
typedef int (*pt_server_load_fn)(void *arg, pt_engine **e, pt_err *err);

/* As pt_server_run, but listens first and loads the model meanwhile:
 * until it is loaded /health answers 503 {"status": "loading"} and the
 * generation routes 503 model_loading.  *e gets the engine (NULL if it did
 * not load); the caller closes it.  A failed load ends the server with -1
 * and the loader's message. */
int pt_server_run_loading(pt_server_load_fn load, void *arg, const pt_server_opts *o,
                          pt_engine **e, pt_err *err);

/* The model id a path serves under: its file name without .gguf. */
void pt_server_model_id(const char *path, char *out, size_t cap);

#endif
