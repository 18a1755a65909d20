/*
 * server.h - `petrel serve`: an OpenAI-compatible HTTP server over one
 * model or a pool of them.  The only entry point the command line needs.
 *
 * Threads: the calling thread runs the libevent loop (HTTP, JSON, SSE);
 * each loaded model's scheduler thread (engine/scheduler.h) owns its engine
 * and batches every running request into one forward per step; models load
 * on a thread of their own.  docs/server.md has the whole picture.
 */
#ifndef PETREL_SERVER_H
#define PETREL_SERVER_H

#include "engine/engine.h"

/* A model of the pool: its id in /v1/models and requests, and its path. */
typedef struct pt_server_model {
    const char *id, *path;
} pt_server_model;

typedef struct pt_server_opts {
    const pt_server_model *models; /* at least one; the first loads at start-up */
    int n_models;
    size_t pool_memory; /* bytes of weights + KV the loaded models may hold; 0: no limit */
    int pool_wait;      /* seconds a request waits for its model to load; default 120 */
    const char *host;          /* default 127.0.0.1 */
    int port;                  /* default 8080; 0 = any free port */
    const char *api_key;       /* NULL: no auth; "" is refused (a start-up error) */
    size_t max_body;           /* bytes; default 8 MiB */
    int parallel;              /* sequences decoded together; default 8 */
    int max_queue;             /* waiting requests before 503; default 1024 */
    int max_prefill;           /* prompt tokens per step; default: the batch */
    int n_ctx;                 /* positions per sequence; default the engine's */
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

/* Opens the engine of the model at path, on the loading thread; returns
 * 0, or -1 with err set.  Never called twice at once. */
typedef int (*pt_server_load_fn)(void *arg, const char *path, pt_engine **e, pt_err *err);

/* Listens first and loads the first model meanwhile: until it is loaded
 * /health answers 503 {"status": "loading"} and the generation routes 503
 * model_loading.  Other models load when a request names them, evicting
 * the least recently used idle ones to stay within pool_memory.  Serves
 * until SIGINT/SIGTERM; returns 0 after a clean shutdown, or -1 with err
 * set if it could not start (a failed first load: the loader's message).
 * The server closes every engine it opened. */
int pt_server_run_loading(pt_server_load_fn load, void *arg, const pt_server_opts *o,
                          pt_err *err);

/* The model id a path serves under: its file name without .gguf. */
void pt_server_model_id(const char *path, char *out, size_t cap);

#endif
