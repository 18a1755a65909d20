/*
 * cmd_serve.c - `petrel serve`: the OpenAI-compatible HTTP server.
 *
 * Flags go into pt_server_opts; src/server/ does the rest (docs/server.md).
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>

#include "cli/cli.h"
#include "server/server.h"

static struct {
    const char *host, *api_key, *model_name, *chat_template, *port_file;
    const char *allowed_hosts, *cors_origin;
    int port, parallel, max_queue, prefill, idle_timeout, shutdown_timeout;
    int header_timeout, min_body_rate, max_conns;
    uint64_t max_body;
    bool quiet;
} g;

static const cli_opt serve_opts[] = {
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
static int load_engine(void *arg, pt_engine **e, pt_err *err) {
    (void)arg;
    if (cli_open_engine(e)) return pt_fail(err, "the model did not load: %s", cli_margs.model);
    return 0;
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
                  "POST /v1/chat/completions, POST /v1/completions, GET /health.\n"
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
    char model_id[256];
    pt_server_model_id(cli_margs.model, model_id, sizeof model_id);
    pt_server_opts o = {.host = g.host,
                        .port = g.port,
                        .api_key = g.api_key,
                        .max_body = (size_t)g.max_body,
                        .parallel = g.parallel,
                        .max_queue = g.max_queue,
                        .max_prefill = g.prefill,
                        .n_ctx = 0, /* the engine's, once loaded */
                        .model_id = g.model_name ? g.model_name : model_id,
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
    pt_engine *e = NULL;
    rc = pt_server_run_loading(load_engine, NULL, &o, &e, &err);
    if (rc) fprintf(stderr, "petrel serve: %s\n", err.msg);
    if (e) pt_engine_close(e);
    return rc ? 1 : 0;
}
