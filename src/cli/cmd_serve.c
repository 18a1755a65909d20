/*
 * cmd_serve.c - `petrel serve`: the OpenAI-compatible HTTP server.
 *
 * Flags go into pt_server_opts; src/server/ does the rest (docs/server.md).
 * The models served: every -m (PATH or NAME=PATH), then each model in
 * --models-dir (a .gguf file or a directory, by name); without either, the
 * default model.  One model is served exactly as before the pool existed.
 */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/cli.h"
#include "server/server.h"

static struct {
    const char *host, *api_key, *model_name, *chat_template, *port_file;
    const char *allowed_hosts, *cors_origin, *models_dir, *pool_memory;
    cli_list models;
    int pool_wait;
    int port, parallel, max_queue, prefill, idle_timeout, shutdown_timeout;
    int header_timeout, min_body_rate, max_conns;
    uint64_t max_body;
    bool quiet;
} g;

static const cli_opt serve_opts[] = {
    {"model", 'm', CLI_LIST, &g.models, "PATH",
     "a model to serve: GGUF file or Hugging Face directory, NAME=PATH to name it; give it "
     "again to serve several (the first loads at start-up, the others when a request names "
     "them)"},
    {"models-dir", 0, CLI_STR, &g.models_dir, "DIR",
     "serve each model in DIR: every .gguf file and every directory, named after it"},
    {"pool-memory", 0, CLI_STR, &g.pool_memory, "SIZE",
     "bytes the loaded models may hold, weights + KV (6G, 512M, or 80% of free memory); "
     "loading another evicts the least recently used idle one (default: no limit)"},
    {"pool-wait", 0, CLI_INT, &g.pool_wait, "S",
     "a request waits up to S seconds for its model to load, then 503 (default 120)"},
    {"host", 0, CLI_STR, &g.host, "ADDR",
     "address to listen on (default 127.0.0.1: this machine only)"},
    {"port", 'p', CLI_INT, &g.port, "N", "TCP port (default 8080; 0 = any free port, printed)"},
    {"api-key", 0, CLI_STR, &g.api_key, "KEY",
     "require 'Authorization: Bearer KEY' on /v1/* (default: $PETREL_API_KEY, else none)"},
    {"parallel", 'P', CLI_INT, &g.parallel, "N",
     "sequences decoded together, continuous batching; at most --batch (default 8)"},
    {"max-seqs", 0, CLI_INT, &g.parallel, "N", "the same as --parallel"},
    {"max-queue", 0, CLI_INT, &g.max_queue, "N",
     "requests that may wait for a slot before 503 (default 1024)"},
    {"prefill-chunk", 0, CLI_INT, &g.prefill, "N",
     "prompt tokens prefilled per step, bounds decode stalls (default: --batch)"},
    {"max-body", 0, CLI_U64, &g.max_body, "BYTES",
     "largest request body; larger gets 413 (default 8388608)"},
    {"model-name", 0, CLI_STR, &g.model_name, "NAME",
     "model id in /v1/models and responses (default: the file name without .gguf)"},
    {"chat-template", 0, CLI_STR, &g.chat_template, "FILE",
     "Jinja chat template to use instead of the model's"},
    {"idle-timeout", 0, CLI_INT, &g.idle_timeout, "S",
     "close idle or stalled connections after S seconds (default 60)"},
    {"header-timeout", 0, CLI_INT, &g.header_timeout, "S",
     "a request head must arrive within S seconds of its start, else 408 (default 10)"},
    {"min-body-rate", 0, CLI_INT, &g.min_body_rate, "B",
     "a request body must arrive at B bytes/s or more, over each --header-timeout window, "
     "else 408 (default 1024; 0 = no minimum)"},
    {"max-connections", 0, CLI_INT, &g.max_conns, "N",
     "open connections before new ones wait (default: what ulimit -n leaves)"},
    {"allowed-hosts", 0, CLI_STR, &g.allowed_hosts, "H,..",
     "Host names served besides localhost ones (DNS-rebinding guard; * = any)"},
    {"cors-origin", 0, CLI_STR, &g.cors_origin, "O,..",
     "web origins (http://host:port) allowed to call the API from a browser (* = any)"},
    {"shutdown-timeout", 0, CLI_INT, &g.shutdown_timeout, "S",
     "on SIGINT/SIGTERM, let requests finish for up to S seconds, then cancel (default 10)"},
    {"port-file", 0, CLI_STR, &g.port_file, "PATH", "write the bound port to PATH once ready to serve (the model loaded)"},
    {"quiet", 'q', CLI_FLAG, &g.quiet, NULL, "no log line per request"},
    {NULL, 0, 0, NULL, NULL, NULL},
};

/* The server's loading thread: the engine from the model flags (their
 * errors are printed by cli_open_engine). */
static int load_engine(void *arg, const char *path, pt_engine **e, pt_err *err) {
    (void)arg;
    if (cli_open_engine_at(path, e)) return pt_fail(err, "the model did not load: %s", path);
    return 0;
}

typedef struct model_list {
    pt_server_model *v;
    int n;
} model_list;

/* Adds PATH or NAME=PATH (a NAME has no '/'); a name twice is an error. */
static int add_model(model_list *l, const char *arg) {
    const char *eq = strchr(arg, '=');
    const char *slash = strchr(arg, '/');
    char id[256];
    const char *path = arg;
    if (eq && eq > arg && (!slash || slash > eq)) {
        snprintf(id, sizeof id, "%.*s", (int)(eq - arg), arg);
        path = eq + 1;
    } else {
        pt_server_model_id(arg, id, sizeof id);
    }
    for (int i = 0; i < l->n; i++)
        if (strcmp(l->v[i].id, id) == 0) {
            fprintf(stderr,
                    "petrel serve: two models are named '%s' (%s and %s); name one with "
                    "-m NAME=PATH\n",
                    id, l->v[i].path, path);
            return -1;
        }
    l->v = pt_xrealloc(l->v, sizeof *l->v * (size_t)(l->n + 1));
    l->v[l->n++] = (pt_server_model){.id = pt_xstrdup(id), .path = pt_xstrdup(path)};
    return 0;
}

static int by_name(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* --models-dir: each .gguf file and each directory in it, sorted by name. */
static int add_models_dir(model_list *l, const char *dir) {
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr, "petrel serve: --models-dir %s: %s\n", dir, strerror(errno));
        return -1;
    }
    char **names = NULL;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        char path[4096];
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        size_t k = strlen(e->d_name);
        if (stat(path, &st) ||
            !(S_ISDIR(st.st_mode) || (k > 5 && strcmp(e->d_name + k - 5, ".gguf") == 0)))
            continue;
        names = pt_xrealloc(names, sizeof *names * (size_t)(n + 1));
        names[n++] = pt_xstrdup(path);
    }
    closedir(d);
    qsort(names, (size_t)n, sizeof *names, by_name);
    int rc = n ? 0 : -1;
    if (!n)
        fprintf(stderr, "petrel serve: --models-dir %s holds no model (.gguf files or "
                        "directories)\n", dir);
    for (int i = 0; i < n; i++) {
        if (rc == 0 && add_model(l, names[i])) rc = -1;
        free(names[i]);
    }
    free(names);
    return rc;
}

/* The pool's flags: what one model allows and several do not. */
static int check_pool(const model_list *l, size_t *pool_memory) {
    if (g.pool_memory) {
        pt_err err = {{0}};
        if (pt_parse_budget(g.pool_memory, pt_mem_available(), pool_memory, &err)) {
            const char *why = strstr(err.msg, ": "); /* after the "--kv-budget VALUE" it names */
            fprintf(stderr, "petrel serve: --pool-memory %s%s\n", g.pool_memory,
                    why ? why : err.msg);
            return -1;
        }
    }
    if (l->n == 1) return 0;
    const char *flag = g.model_name       ? "--model-name (name them with -m NAME=PATH)"
                       : g.chat_template  ? "--chat-template"
                       : cli_margs.kv_disk ? "--kv-disk"
                       : cli_sargs.draft_model ? "--draft-model"
                                               : NULL;
    if (flag) {
        fprintf(stderr, "petrel serve: %s serves one model; %d are given\n", flag, l->n);
        return -1;
    }
    return 0;
}

static void free_models(model_list *l) {
    for (int i = 0; i < l->n; i++) {
        free((char *)l->v[i].id);
        free((char *)l->v[i].path);
    }
    free(l->v);
}

int cmd_serve(int argc, char **argv) {
    cli_model_defaults();
    memset(&g, 0, sizeof g);
    g.port = 8080, g.shutdown_timeout = 10, g.max_body = 8u << 20;
    g.min_body_rate = INT_MIN; /* not given: 0 there means "no minimum" */
    const cli_opt *tables[] = {serve_opts, cli_spec_opts, cli_model_opts, NULL};
    const char *pos[1];
    int n_pos;
    int rc =
        cli_parse(argc, argv,
                  "petrel serve [options]\n\n"
                  "Serves the model over an OpenAI-compatible HTTP API: GET /v1/models,\n"
                  "POST /v1/chat/completions, POST /v1/completions, GET /health, GET /metrics.\n"
                  "Several models (-m A -m B, --models-dir DIR) are served from one endpoint:\n"
                  "a request's \"model\" picks one, loaded on demand within --pool-memory.\n"
                  "--ctx is the context of each sequence; the KV cache holds --parallel of them.\n"
                  "llama-server's spellings work where they mean the same: --host, --port,\n"
                  "-m, -c/--ctx-size, -t, -ngl/--gpu-layers (device selection), --api-key.",
                  tables, pos, 0, &n_pos);
    if (rc) return rc < 0 ? 2 : 0;
    if (g.port < 0 || g.port > 65535) {
        fprintf(stderr, "petrel: --port %d is not a TCP port\n", g.port);
        return 2;
    }
    /* an empty key would mean "no auth" while looking like a key: with
     * --api-key "$KEY" and KEY unset, that is a silent open server */
    if (g.api_key && !*g.api_key) {
        fprintf(stderr, "petrel serve: --api-key is empty (an unset variable?); give a key, or "
                        "leave the flag out to serve without one\n");
        return 2;
    }
    const char *env_key = getenv("PETREL_API_KEY");
    if (!g.api_key && env_key) {
        if (!*env_key) {
            fprintf(stderr, "petrel serve: PETREL_API_KEY is set but empty; set it to a key, or "
                            "unset it to serve without one\n");
            return 2;
        }
        g.api_key = env_key;
    }
    if (g.header_timeout < 0 || (g.min_body_rate < 0 && g.min_body_rate != INT_MIN) ||
        g.max_conns < 0) {
        fprintf(stderr, "petrel serve: --header-timeout, --min-body-rate and --max-connections "
                        "take positive numbers (--min-body-rate 0: no minimum)\n");
        return 2;
    }
    /* Each running sequence takes one row of every decode batch, so the
     * table's range narrows to --batch; an explicit --parallel above it is
     * an error rather than silently lowered. */
    int batch = cli_margs.batch > 0 ? cli_margs.batch : 512;
    if (g.parallel > batch) {
        pt_gen_limit l = pt_gen_limits[PT_GP_PARALLEL];
        l.hi = batch;
        char v[16], note[64];
        snprintf(v, sizeof v, "%d", g.parallel);
        snprintf(note, sizeof note, "(--batch is %d: raise it for more)", batch);
        cli_check_range("-P/--parallel (--max-seqs)", v, g.parallel, &l, note);
        return 2;
    }

    pt_spec_params spec;
    if (cli_spec_params(&spec, false, NULL)) return 2;

    /* a sliding-window model's window pages are sized for --parallel (kvcache.h) */
    cli_margs.max_seqs = g.parallel > 0 ? g.parallel : 8;
    model_list models = {0};
    size_t pool_memory = 0;
    rc = 0;
    for (int i = 0; i < g.models.n && !rc; i++)
        rc = add_model(&models, g.models.v[i]);
    if (!rc && g.models_dir) rc = add_models_dir(&models, g.models_dir);
    if (!rc && models.n == 0) rc = add_model(&models, cli_margs.model); /* the default */
    if (!rc && models.n == 1 && g.model_name) {
        free((char *)models.v[0].id);
        models.v[0].id = pt_xstrdup(g.model_name);
    }
    if (!rc) rc = check_pool(&models, &pool_memory);
    if (rc) {
        free_models(&models);
        return 2;
    }
    pt_server_opts o = {.models = models.v,
                        .n_models = models.n,
                        .pool_memory = pool_memory,
                        .pool_wait = g.pool_wait,
                        .host = g.host,
                        .port = g.port,
                        .api_key = g.api_key,
                        .max_body = (size_t)g.max_body,
                        .parallel = g.parallel,
                        .max_queue = g.max_queue,
                        .max_prefill = g.prefill,
                        .n_ctx = 0, /* the engine's, once loaded */
                        .chat_template = g.chat_template,
                        .idle_timeout = g.idle_timeout,
                        .header_timeout = g.header_timeout,
                        .min_body_rate = g.min_body_rate == INT_MIN ? 0  /* default */
                                         : g.min_body_rate == 0     ? -1 /* none */
                                                                    : g.min_body_rate,
                        .max_conns = g.max_conns,
                        .allowed_hosts = g.allowed_hosts,
                        .cors_origins = g.cors_origin,
                        .shutdown_timeout = g.shutdown_timeout,
                        .port_file = g.port_file,
                        .quiet = g.quiet,
                        .spec = spec};
    pt_err err = {{0}};
    rc = pt_server_run_loading(load_engine, NULL, &o, &err);
    if (rc) fprintf(stderr, "petrel serve: %s\n", err.msg);
    free_models(&models);
    return rc ? 1 : 0;
}
