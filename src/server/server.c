/*
 * server.c - `petrel serve` as a whole: start-up (listener, prompt worker,
 * and for each model as it loads: KV pool sized for the parallel
 * sequences, chat template, scheduler thread), the small routes (/health,
 * /v1/models), the wakeup from the scheduler threads, and shutdown.
 * pool.c decides which models are loaded.
 *
 * Loading: the listener opens first and the first model loads on a thread
 * of its own (pool.c); meanwhile /health answers 503 "loading" (a load
 * balancer or an orchestrator can tell a server that is coming up from one
 * that is down) and the generation routes 503 model_loading.  When the
 * loader posts the engine, the loop finishes that model's start-up
 * (pt_slot_start) and the state becomes running.  A signal while loading
 * ends the server once the load returns.
 *
 * Shutdown: the first SIGINT/SIGTERM stops accepting and closes idle
 * connections; requests in flight get --shutdown-timeout seconds to finish
 * (a second signal cuts that short), then are cancelled: streams end with
 * an error event, waiting non-streamed requests get 503.  The loop exits
 * once no connection and no request is left, and everything is freed.
 */
#include "server/server_int.h"

#include <dirent.h>
#include <event2/event.h>
#include <event2/thread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <time.h>

/* Descriptors kept free beyond those open at start-up: the log, a port
 * file, what libevent and the C library open later. */
#define FD_HEADROOM 16

/* ---- logging and wakeups ------------------------------------------------------- */

void pt_server_log(pt_server *s, const char *fmt, ...) {
    if (s->o.quiet) return;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    char ts[32];
    strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%SZ", &tm);
    fprintf(stderr, "%s petrel: %s\n", ts, line); /* one write per line: lines never interleave */
}

void pt_server_wake(pt_server *s) {
    event_active(s->wake, EV_READ, 0); /* thread-safe: evthread_use_pthreads() */
}

static void wake_cb(evutil_socket_t fd, short what, void *arg) {
    (void)fd, (void)what;
    pt_server_deliver(arg);
}

static void maybe_exit(pt_server *s) {
    if ((s->state == SRV_DRAINING || s->state == SRV_CANCELLING) && s->n_reqs == 0 && pt_http_n_conns(s->http) == 0)
        event_base_loopexit(s->base, NULL);
}

void pt_server_req_done(pt_server *s) {
    s->n_served++;
    if (s->state != SRV_RUNNING) maybe_exit(s);
}

bool pt_server_loading(pt_conn *c) {
    pt_server *s = pt_conn_server(c);
    if (s->state != SRV_LOADING) return false;
    pt_http_error(c, 503, NULL, "model_loading", NULL,
                  "the model is still loading; retry when GET /health answers 200");
    return true;
}

/* ---- shutdown ------------------------------------------------------------------ */

static void cancel_all(pt_server *s, const char *why) {
    if (s->state == SRV_CANCELLING) return;
    s->state = SRV_CANCELLING;
    if (s->n_reqs) pt_server_log(s, "%s: cancelling %d request(s)", why, s->n_reqs);
    for (int i = 0; i < s->n_slots; i++)
        if (s->slots[i].sched) pt_sched_cancel_all(s->slots[i].sched);
}

static void grace_cb(evutil_socket_t fd, short what, void *arg) {
    (void)fd, (void)what;
    cancel_all(arg, "shutdown timeout");
}

static void drained_cb(void *arg) {
    maybe_exit(arg);
}

static void signal_cb(evutil_socket_t sig, short what, void *arg) {
    (void)what;
    pt_server *s = arg;
    if (s->state == SRV_LOADING) { /* nothing to finish or cancel yet */
        pt_server_log(s, "%s while loading the model: exiting once the load returns",
                      sig == SIGINT ? "SIGINT" : "SIGTERM");
        s->state = SRV_DRAINING;
        event_base_loopexit(s->base, NULL);
        return;
    }
    if (s->state != SRV_RUNNING) {
        cancel_all(s, "second signal");
        return;
    }
    s->state = SRV_DRAINING;
    pt_models_drain(s); /* no model loads any more */
    pt_server_log(s,
                  "%s: not accepting connections; finishing %d request(s) (up to %d s, "
                  "signal again to cancel)",
                  sig == SIGINT ? "SIGINT" : "SIGTERM", s->n_reqs, s->o.shutdown_timeout);
    struct timeval tv = {s->o.shutdown_timeout, 0};
    event_add(s->grace, &tv);
    pt_http_drain(s->http, drained_cb, s);
    maybe_exit(s);
}

/* ---- small routes ----------------------------------------------------------------- */

static json_t *model_object(pt_slot *m) {
    json_t *o = json_pack("{s:s, s:s, s:I, s:s, s:s}", "id", m->id, "object", "model", "created",
                          (json_int_t)m->created, "owned_by", "petrel", "state",
                          pt_slot_state(m));
    if (m->state == SLOT_LOADED || m->state == SLOT_EVICTING) {
        const pt_model_config *c = &m->e->model->cfg;
        json_object_set_new(o, "meta",
                            json_pack("{s:s, s:i, s:i, s:i, s:s}", "arch", c->arch, "n_ctx",
                                      m->n_ctx, "n_ctx_train", c->max_ctx, "n_vocab",
                                      c->vocab_size, "chat_template",
                                      pt_chat_tmpl_source(m->tmpl)));
    }
    return o;
}

void pt_handle_models(pt_conn *c, const char *body, size_t len) {
    (void)body, (void)len;
    if (pt_server_loading(c)) return;
    pt_server *s = pt_conn_server(c);
    json_t *data = json_array();
    for (int i = 0; i < s->n_slots; i++)
        json_array_append_new(data, model_object(&s->slots[i]));
    json_t *r = json_pack("{s:s, s:o}", "object", "list", "data", data);
    pt_http_reply_json(c, 200, r);
    json_decref(r);
}

void pt_handle_model(pt_conn *c, const char *body, size_t len) {
    (void)body, (void)len;
    pt_server *s = pt_conn_server(c);
    if (pt_server_loading(c)) return;
    const char *id = pt_conn_head(c)->path + strlen("/v1/models/");
    pt_slot *m = pt_models_find(s, id);
    if (!m) {
        char names[1024];
        pt_models_names(s, names, sizeof names);
        pt_http_error(c, 404, NULL, "model_not_found", "model",
                      "The model '%.200s' does not exist; this server serves %s", id, names);
        return;
    }
    json_t *r = model_object(m);
    pt_http_reply_json(c, 200, r);
    json_decref(r);
}

/* Ready once the first model is loaded (others load on demand).  The
 * request and KV figures are summed over the loaded models. */
void pt_handle_health(pt_conn *c, const char *body, size_t len) {
    (void)body, (void)len;
    pt_server *s = pt_conn_server(c);
    if (s->state == SRV_LOADING) {
        json_t *r = json_pack("{s:s, s:s}", "status", "loading", "model", s->slots[0].id);
        pt_http_reply_json(c, 503, r);
        json_decref(r);
        return;
    }
    int waiting = 0, running = 0, reserved = 0, pages = 0, cached = 0;
    size_t page_bytes = 0;
    for (int i = 0; i < s->n_slots; i++) {
        pt_slot *m = &s->slots[i];
        if (!m->sched) continue;
        int w, r, k;
        pt_sched_load(m->sched, &w, &r, &k);
        waiting += w, running += r, reserved += k;
        pages += m->e->kv.cfg.n_pages;
        cached += pt_sched_cached_pages(m->sched);
        if (!page_bytes) page_bytes = pt_kv_page_bytes(&m->e->kv);
    }
    bool ok = s->state == SRV_RUNNING;
    json_t *r =
        json_pack("{s:s, s:s, s:i, s:i, s:i, s:i, s:i, s:I}", "status", ok ? "ok" : "shutting_down",
                  "model", s->slots[0].id, "parallel",
                  s->slots[0].sched ? s->slots[0].parallel : s->o.parallel, "running", running,
                  "waiting", waiting + s->n_pending, "kv_pages_reserved", reserved, "kv_pages",
                  pages, "requests_served", (json_int_t)s->n_served);
    /* the pool's pages: held by running requests, free but cached, free */
    json_object_set_new(r, "kv_pages_cached", json_integer(cached));
    json_object_set_new(r, "kv_page_bytes", json_integer((json_int_t)page_bytes));
    if (s->n_slots > 1) {
        json_t *models = json_object();
        for (int i = 0; i < s->n_slots; i++)
            json_object_set_new(models, s->slots[i].id, json_string(pt_slot_state(&s->slots[i])));
        json_object_set_new(r, "models", models);
    }
    pt_http_reply_json(c, ok ? 200 : 503, r);
    json_decref(r);
}

/* ---- start-up ---------------------------------------------------------------------- */

void pt_server_model_id(const char *path, char *out, size_t cap) {
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/')
        n--; /* a directory given with a slash */
    const char *base = path;
    for (size_t i = 0; i < n; i++)
        if (path[i] == '/') base = path + i + 1;
    size_t len = (size_t)(path + n - base);
    if (len > 5 && strncmp(base + len - 5, ".gguf", 5) == 0) len -= 5;
    snprintf(out, cap, "%.*s", (int)len, base);
}

/* What needs no engine; engine_defaults() the rest once it is loaded. */
static void defaults(pt_server_opts *o) {
    if (!o->host) o->host = "127.0.0.1";
    if (o->max_body == 0) o->max_body = 8u << 20;
    if (o->parallel <= 0) o->parallel = 8;
    if (o->max_queue <= 0) o->max_queue = 1024;
    if (o->idle_timeout <= 0) o->idle_timeout = 60;
    if (o->header_timeout <= 0) o->header_timeout = 10;
    if (o->min_body_rate == 0) o->min_body_rate = 1024;
    if (o->min_body_rate < 0) o->min_body_rate = 0; /* pt_http_opts: 0 is none */
    if (o->shutdown_timeout < 0) o->shutdown_timeout = 0;
    if (o->pool_wait <= 0) o->pool_wait = 120;
}

static void engine_defaults(pt_slot *m, const pt_server_opts *o) {
    m->parallel = PT_MIN(o->parallel, m->e->model->max_batch);
    m->n_ctx = o->n_ctx > 0 ? o->n_ctx : m->e->n_ctx;
}

/* Without --kv-budget, every sequence can reach the full context at once:
 * the pool holds parallel x ctx positions (the engine opened it for one).
 * With it, the pool is what the budget buys and the scheduler grows
 * sequences lazily, preempting when it runs out. */
static int size_kv_pool(pt_engine *e, const pt_slot *o, pt_err *err) {
    /* a sliding-window model's window pool holds --parallel windows (kvcache.h) */
    bool window = e->kv.grouped && e->max_seqs != o->parallel;
    e->max_seqs = o->parallel;
    if (e->kv_budgeted) /* --kv-budget sized it; the scheduler preempts within it */
        return window ? pt_engine_kv_init(e, e->kv.cfg.n_pages * e->kv.cfg.page_size, err) : 0;
    int need = pt_sched_pages_for(e, o->n_ctx) * o->parallel;
    if (e->kv.cfg.n_pages >= need && !window) return 0;
    need = PT_MAX(need, e->kv.cfg.n_pages);
    int positions = need * e->kv.cfg.page_size;
    /* with overcommit a too-big pool would "succeed" and be killed later */
    double gib = (double)pt_kv_bytes_per_token(&e->kv.cfg) * positions / (1 << 30);
    double avail = (double)pt_mem_available() / (1 << 30);
    if (e->be->host_memory && avail > 0 && gib > 0.9 * avail)
        return pt_fail(err,
                       "a KV cache for %d sequences of %d positions needs %.1f GiB, %.1f GiB "
                       "are available: lower --parallel or --ctx",
                       o->parallel, o->n_ctx, gib, avail);
    if (pt_engine_kv_init(e, positions, err)) /* keeps --kv-type and --kv-quant */
        return pt_failp(err,
                        "KV cache for %d sequences of %d positions (lower --parallel or --ctx)",
                        o->parallel, o->n_ctx);
    return 0;
}

/* Descriptors open now (the model's, the loop's, stdio). */
static int open_fds(void) {
    DIR *d = opendir("/proc/self/fd");
    if (!d) return 32; /* no /proc: a generous guess */
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        n += e->d_name[0] != '.';
    closedir(d);
    return n - 1; /* the directory's own */
}

/* --max-connections: by default what RLIMIT_NOFILE leaves after the
 * descriptors open now and some headroom, so that accept never fails for
 * lack of one. */
static int size_conn_cap(pt_server_opts *o, pt_err *err) {
    struct rlimit rl;
    long limit = 65536;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
        limit = (long)PT_MIN(rl.rlim_cur, (rlim_t)1 << 30);
    int used = open_fds();
    long room = limit - used - FD_HEADROOM;
    if (o->max_conns > 0) {
        if (o->max_conns > room)
            pt_warn("serve: --max-connections %d is more than the %ld descriptors ulimit -n "
                    "leaves; accepting will pause when they run out",
                    o->max_conns, room > 0 ? room : 0);
        return 0;
    }
    if (room < 1)
        return pt_fail(err,
                       "ulimit -n is %ld and %d descriptors are already open: no room for "
                       "connections; raise ulimit -n",
                       limit, used);
    o->max_conns = (int)PT_MIN(room, 1L << 20);
    return 0;
}

/* A key that a client could never send is a mistake, not a policy.  (The
 * command line refuses an empty one with the flag's or variable's name.) */
static int check_api_key(const char *key, pt_err *err) {
    if (!key) return 0;
    if (!*key)
        return pt_fail(err, "the API key is empty: give a key, or none to serve without one");
    for (const char *p = key; *p; p++)
        if ((unsigned char)*p <= ' ' || (unsigned char)*p >= 0x7f)
            return pt_fail(err,
                           "the API key has a space or a non-printable byte (at %d): a client "
                           "cannot send it in an Authorization header",
                           (int)(p - key));
    return 0;
}

/* --allowed-hosts takes host names (any port matches), --cors-origin whole
 * origins ("http://host:port", as browsers send them). */
static int check_list(const char *list, bool origins, pt_err *err) {
    if (!list) return 0;
    const char *flag = origins ? "--cors-origin" : "--allowed-hosts";
    for (const char *p = list;;) {
        while (*p == ' ')
            p++;
        const char *e = strchr(p, ',');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        while (n && p[n - 1] == ' ')
            n--;
        char item[256], name[256];
        if (n == 0 || n >= sizeof item)
            return pt_fail(err, "%s: empty or overlong entry in '%s'", flag, list);
        memcpy(item, p, n);
        item[n] = 0;
        bool ok = strcmp(item, "*") == 0;
        if (!ok && origins) {
            const char *sep = strstr(item, "://");
            ok = strcmp(item, "null") == 0 || (sep && sep > item && !strchr(sep + 3, '/') &&
                                               pt_http_host_name(sep + 3, name, sizeof name) == 0);
        } else if (!ok) {
            ok = pt_http_host_name(item, name, sizeof name) == 0 && strlen(name) == n;
        }
        if (!ok)
            return pt_fail(err, "%s: '%s' is not %s", flag, item,
                           origins ? "an origin like http://localhost:3000 (no path), or *"
                                   : "a host name like example.com (no port), or *");
        if (!e) return 0;
        p = e + 1;
    }
}

static void write_port_file(const char *path, int port) {
    FILE *f = fopen(path, "w");
    if (!f) {
        pt_warn("serve: cannot write --port-file %s", path);
        return;
    }
    fprintf(f, "%d\n", port);
    fclose(f);
}

/* A loaded model's part of start-up: KV pool, template, scheduler.  On
 * failure the caller undoes it with pt_slot_stop. */
int pt_slot_start(pt_server *s, pt_slot *m, pt_err *err) {
    engine_defaults(m, &s->o);
    m->lim = (pt_oai_limits){.model_id = m->id, .n_vocab = m->e->model->cfg.vocab_size};
    if (!m->e->tok)
        return pt_fail(err, "this model has no tokenizer (dummy weights): nothing to serve");
    if (size_kv_pool(m->e, m, err)) return -1;
    m->kv_bytes = (size_t)m->e->kv.cfg.n_pages * pt_kv_page_bytes(&m->e->kv);
    if (pt_chat_tmpl_open(&m->tmpl, m->e, s->o.chat_template, err)) return -1;
    pt_sched_opts so = {.max_seqs = m->parallel,
                        .n_ctx = m->n_ctx,
                        .max_prefill = s->o.max_prefill,
                        .max_queue = s->o.max_queue};
    /* PETREL_SCHED_HOLD=N (tests): the first model's first step waits for N
     * requests (or a cancel), so a test of batching, preemption or eviction
     * does not hang on arrival timing; models loaded later do not wait */
    const char *hold = getenv("PETREL_SCHED_HOLD");
    if (hold && s->state == SRV_LOADING) so.hold = atoi(hold);
    return pt_sched_start(&m->sched, m->e, &so, err);
}

void pt_slot_stop(pt_slot *m) {
    pt_sched_stop(m->sched); /* every on_done has run when it returns */
    m->sched = NULL;
    pt_chat_tmpl_free(m->tmpl);
    m->tmpl = NULL;
    if (m->e) pt_engine_close(m->e);
    m->e = NULL;
}

static int check_opts(const pt_server_opts *o, pt_err *err) {
    return check_api_key(o->api_key, err) || check_list(o->allowed_hosts, false, err) ||
                   check_list(o->cors_origins, true, err)
               ? -1
               : 0;
}

/* The loop's part: events, signals, the listener. */
static int start_http(pt_server *s, pt_err *err) {
    s->base = event_base_new();
    if (!s->base) return pt_fail(err, "cannot create the event loop");
    s->wake = event_new(s->base, -1, 0, wake_cb, s);
    s->sig_int = evsignal_new(s->base, SIGINT, signal_cb, s);
    s->sig_term = evsignal_new(s->base, SIGTERM, signal_cb, s);
    s->grace = evtimer_new(s->base, grace_cb, s);
    if (!s->wake || !s->sig_int || !s->sig_term || !s->grace)
        return pt_fail(err, "cannot create the server's events");
    event_add(s->sig_int, NULL);
    event_add(s->sig_term, NULL);
    if (size_conn_cap(&s->o, err)) return -1;
    pt_http_opts ho = {.host = s->o.host,
                       .port = s->o.port,
                       .api_key = s->o.api_key,
                       .max_body = s->o.max_body,
                       .idle_timeout = s->o.idle_timeout,
                       .header_timeout = s->o.header_timeout,
                       .min_body_rate = s->o.min_body_rate,
                       .max_conns = s->o.max_conns,
                       .allowed_hosts = s->o.allowed_hosts,
                       .cors_origins = s->o.cors_origins};
    return pt_http_listen(&s->http, s->base, s, &ho, err);
}

/* ---- start and stop ------------------------------------------------------------------ */

static void stop(pt_server *s) {
    pt_http_free(s->http); /* drops what is left; their requests are cancelled */
    pt_front_stop(s);      /* nothing is submitted after this */
    s->state = SRV_CANCELLING; /* the pool loads nothing more */
    for (int i = 0; i < s->n_slots; i++) {
        pt_slot *m = &s->slots[i];
        if (m->sched) pt_sched_cancel_all(m->sched);
        pt_sched_stop(m->sched); /* every on_done has run when it returns */
        m->sched = NULL;
    }
    if (s->base) pt_server_deliver(s); /* frees the requests those posted */
    pt_models_free(s);                   /* joins a load, closes the engines */
    if (s->wake) event_free(s->wake);
    if (s->sig_int) event_free(s->sig_int);
    if (s->sig_term) event_free(s->sig_term);
    if (s->grace) event_free(s->grace);
    if (s->base) event_base_free(s->base);
    pthread_mutex_destroy(&s->mu);
}

static int init(pt_server *s, const pt_server_opts *o, pt_err *err) {
    if (evthread_use_pthreads()) return pt_fail(err, "libevent has no pthreads support");
    signal(SIGPIPE, SIG_IGN); /* a client that hangs up is an error return, not a kill */
    s->o = *o;
    defaults(&s->o);
    pthread_mutex_init(&s->mu, NULL);
    pt_models_init(s);
    return 0;
}

/* The start-up lines, once the server is ready. */
static void announce(pt_server *s) {
    int port = pt_http_port(s->http);
    bool v6 = strchr(s->o.host, ':') != NULL;
    const pt_slot *m = &s->slots[0];
    char pool[160] = "";
    if (s->n_slots > 1)
        snprintf(pool, sizeof pool, " (first of %d; the others load on demand, pool memory %s)",
                 s->n_slots, s->o.pool_memory ? "limited by --pool-memory" : "unlimited");
    fprintf(stderr,
            "petrel serve: model %s%s, %d parallel x %d positions, chat template: %s\n"
            "petrel serve: listening on http://%s%s%s:%d, up to %d connections, %s\n",
            m->id, pool, m->parallel, m->n_ctx, pt_chat_tmpl_source(m->tmpl), v6 ? "[" : "",
            s->o.host, v6 ? "]" : "", port, s->o.max_conns,
            s->o.api_key ? "API key required"
                         : "no API key (anyone who can connect may use it; --api-key or "
                           "$PETREL_API_KEY sets one)");
}

void pt_server_ready(pt_server *s) {
    s->state = SRV_RUNNING;
    announce(s);
    /* tools wait for the port file to send requests: only now */
    if (s->o.port_file) write_port_file(s->o.port_file, pt_http_port(s->http));
}

int pt_server_run_loading(pt_server_load_fn load, void *arg, const pt_server_opts *o,
                          pt_err *err) {
    pt_server s = {0};
    if (o->n_models < 1) return pt_fail(err, "no model to serve");
    if (init(&s, o, err)) return -1;
    s.state = SRV_LOADING;
    s.load = load, s.load_arg = arg;
    int rc = -1;
    if (check_opts(&s.o, err) || start_http(&s, err) || pt_front_start(&s, err)) goto out;
    int port = pt_http_port(s.http);
    bool v6 = strchr(s.o.host, ':') != NULL;
    fprintf(stderr, "petrel serve: loading the model; http://%s%s%s:%d/health says \"loading\" until it is ready\n",
            v6 ? "[" : "", s.o.host, v6 ? "]" : "", port);
    if (pt_models_load(&s, &s.slots[0], err)) goto out;
    event_base_dispatch(s.base);
    rc = 0;
out:
    if (s.load_failed) {
        snprintf(err->msg, sizeof err->msg, "%s", s.load_err.msg);
        rc = -1;
    } else if (rc == 0) {
        pt_server_log(&s, "stopped after %llu request(s)", (unsigned long long)s.n_served);
    }
    stop(&s);
    return rc;
}
