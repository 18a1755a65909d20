/*
 * cmd_bench_serve.c - `petrel bench serve`: a load generator and reporter
 * for an OpenAI-compatible server (ours, or any that reports `usage`).
 *
 * It drives a running server (--url) or starts this binary's `serve` on a
 * free port (--model, with server flags after `--`), runs seeded workloads
 * that each stress one kind of reuse, and writes every request (body,
 * token counts, finish reason, timings) to a JSON file plus an offline HTML
 * report (bench_report.c).
 *
 * Workloads, in the order they run:
 *   chat     users holding multi-turn conversations; history grows each turn
 *   shared   many users behind one long system prompt
 *   agent    a long tool-schema prefix, then short tool-result turns
 *   long     long prompts near the context, each sent cold then again
 *   depth    one request at a time at growing context depths: decode speed
 *            by depth without other requests sharing the steps
 *   sweep    aggregate throughput at each --concurrency level
 *   restart  stop and restart a self-started server on the same --kv-disk,
 *            then resend (skipped with a note if the server refuses it)
 *
 * Invariants the numbers rest on:
 *   - token counts come only from the server's `usage` (streamed with
 *     stream_options.include_usage); a response without it is a failed
 *     request, never estimated from SSE chunks;
 *   - every text is drawn from one PRNG seeded by --seed and the workload,
 *     user and turn, so two runs with one seed send the same requests;
 *   - times are taken on one monotonic clock the moment bytes are read;
 *   - a request is "cached" when usage says at least half its prompt came
 *     from the cache (a shared template header alone does not make a turn
 *     warm); after a restart those are "ssd" (the RAM cache died with the
 *     old process).  The exact cached_tokens is kept in every record.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli/bench_http.h"
#include "cli/bench_serve.h"
#include "cli/cli.h"

/* ---- options ---------------------------------------------------------------------- */

static struct {
    const char *url, *model, *server_bin, *json, *html, *workloads, *conc, *kv_disk, *api_key,
        *report_from;
    int users, turns, max_tokens, shared_users, clients, agents, agent_turns, long_reqs;
    int long_tokens, sweep_reqs, sweep_tokens, restart_reqs, timeout, rss_ms;
    uint64_t seed;
    bool eos;
} o;

static const cli_opt bs_opts[] = {
    {"url", 0, CLI_STR, &o.url, "URL", "server to drive, e.g. http://127.0.0.1:8080"},
    {"model", 'm', CLI_STR, &o.model, "M",
     "start `petrel serve -m M` on a free port instead (server flags after --)"},
    {"server-bin", 0, CLI_STR, &o.server_bin, "PATH",
     "the petrel binary whose `serve` --model starts (default: this one; e.g. another build)"},
    {"workloads", 'w', CLI_STR, &o.workloads, "W,..",
     "chat,shared,agent,long,depth,sweep,restart (default: all)"},
    {"seed", 's', CLI_U64, &o.seed, "N", "seed of every prompt (default 1)"},
    {"json", 'o', CLI_STR, &o.json, "FILE",
     "every request and the summary (default bench-serve.json)"},
    {"html", 0, CLI_STR, &o.html, "FILE", "the offline report (default: --json with .html)"},
    {"max-tokens", 'n', CLI_INT, &o.max_tokens, "N", "tokens generated per request (default 32)"},
    {"stop-at-eos", 0, CLI_FLAG, &o.eos, NULL,
     "let the model end replies early (default: ignore_eos, so every reply has --max-tokens)"},
    {"users", 0, CLI_INT, &o.users, "N", "chat: conversations (default 4)"},
    {"turns", 0, CLI_INT, &o.turns, "N", "chat: turns per conversation (default 4)"},
    {"shared-users", 0, CLI_INT, &o.shared_users, "N",
     "shared: users of one system prompt (default 8)"},
    {"clients", 'c', CLI_INT, &o.clients, "N",
     "requests in flight in the chat, shared and agent workloads (default 4)"},
    {"agents", 0, CLI_INT, &o.agents, "N", "agent: agent loops (default 2)"},
    {"agent-turns", 0, CLI_INT, &o.agent_turns, "N", "agent: turns per loop (default 4)"},
    {"long-requests", 0, CLI_INT, &o.long_reqs, "N", "long: distinct long prompts (default 2)"},
    {"long-tokens", 0, CLI_INT, &o.long_tokens, "N",
     "long: prompt tokens (default: what the context leaves, at most 4096)"},
    {"concurrency", 'C', CLI_STR, &o.conc, "N,..", "sweep: levels (default 1,2,4,8,16,32,64)"},
    {"sweep-requests", 0, CLI_INT, &o.sweep_reqs, "N", "sweep: requests per client (default 2)"},
    {"sweep-tokens", 0, CLI_INT, &o.sweep_tokens, "N", "sweep: prompt tokens (default 128)"},
    {"restart-requests", 0, CLI_INT, &o.restart_reqs, "N", "restart: prompts resent (default 4)"},
    {"kv-disk", 0, CLI_STR, &o.kv_disk, "DIR",
     "the server's SSD tier directory (restart uses a fresh one if not given)"},
    {"api-key", 0, CLI_STR, &o.api_key, "KEY", "bearer key (default: $PETREL_API_KEY)"},
    {"timeout", 0, CLI_INT, &o.timeout, "S", "give up on a silent request after S s (default 600)"},
    {"rss-interval", 0, CLI_INT, &o.rss_ms, "MS",
     "server memory sampled every MS ms (default 250)"},
    {"report-from", 0, CLI_STR, &o.report_from, "FILE", "only re-render the HTML of a saved run"},
    {NULL, 0, 0, NULL, NULL, NULL},
};

/* ---- the run's shared state ------------------------------------------------------- */

typedef struct server {
    char host[256];
    int port;
    pid_t pid;       /* 0 when not ours */
    pid_t watch_pid; /* a --url server's process on this machine, for its RSS */
    char model_id[256];
    int n_ctx;
} server;

static struct {
    pthread_mutex_t mu;
    server srv;
    double t0;              /* the run's clock origin */
    json_t *requests;       /* every request, in completion order */
    json_t *samples;        /* server memory over time */
    json_t *phases, *notes; /* workload spans; things skipped or odd */
    int n_failed;
    double words_per_token; /* from the probe: prompt words -> tokens */
    double chars_per_token; /* the same in bytes, for texts not made of words */
    bool after_restart;     /* cached tokens now come from disk */
    /* self-started server */
    char workdir[256], exe[4096];
    char **srv_args;
    int n_srv_args;
    volatile int sampling;
} R = {.mu = PTHREAD_MUTEX_INITIALIZER};

static void note(const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "bench serve: %s\n", msg);
    pthread_mutex_lock(&R.mu);
    json_array_append_new(R.notes, json_string(msg));
    pthread_mutex_unlock(&R.mu);
}

static server current_server(void) {
    pthread_mutex_lock(&R.mu);
    server s = R.srv;
    pthread_mutex_unlock(&R.mu);
    return s;
}

/* ---- seeded text -------------------------------------------------------------------- */

static uint64_t mix(uint64_t x) { /* splitmix64 */
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* One PRNG per (workload, user, turn): texts do not depend on scheduling. */
static uint64_t stream_seed(const char *what, int a, int b) {
    uint64_t h = mix(o.seed);
    for (const char *p = what; *p; p++)
        h = mix(h ^ (unsigned char)*p);
    return mix(mix(h ^ (uint64_t)a) ^ (uint64_t)b);
}

static unsigned rnd(uint64_t *s, unsigned n) {
    *s = mix(*s);
    return (unsigned)(*s % n);
}

/* Simple English words, so small story models tokenize them compactly. */
static const char *const words[] = {
    "the",   "a",      "little", "girl",  "boy",   "dog",   "cat",   "bird",  "tree",  "park",
    "sun",   "ball",   "happy",  "sad",   "big",   "small", "red",   "blue",  "green", "house",
    "mom",   "dad",    "friend", "play",  "run",   "jump",  "look",  "find",  "want",  "like",
    "went",  "saw",    "said",   "was",   "had",   "day",   "time",  "fun",   "toy",   "box",
    "water", "flower", "garden", "car",   "truck", "cake",  "tea",   "book",  "bed",   "night",
    "star",  "moon",   "rain",   "hill",  "river", "fish",  "boat",  "shoe",  "hat",   "door",
    "and",   "then",   "with",   "to",    "in",    "on",    "of",    "very",  "they",  "she",
    "he",    "it",     "could",  "would", "help",  "share", "smile", "laugh", "walk",  "home",
};

/* Appends about n words of sentences to b (cap bytes, NUL-terminated). */
static void gen_text(uint64_t *s, int n, char *b, size_t cap) {
    size_t len = strlen(b);
    int in_sentence = 0, target = 0;
    for (int i = 0; i < n && len + 16 < cap; i++) {
        if (in_sentence == 0) target = 6 + (int)rnd(s, 8);
        const char *w = words[rnd(s, PT_ARRAY_LEN(words))];
        int k = snprintf(b + len, cap - len, "%s%c%s", len ? " " : "",
                         in_sentence ? w[0] : (char)(w[0] - 'a' + 'A'), w + 1);
        len += (size_t)k;
        if (++in_sentence == target || i == n - 1) {
            b[len++] = '.', b[len] = 0;
            in_sentence = 0;
        }
    }
}

/* Words that make about t prompt tokens (the probe's ratio, with margin). */
static int words_for(int t) {
    int w = (int)(t * R.words_per_token * 0.95);
    return w < 1 ? 1 : w;
}

/* Prompt tokens a text adds, by the probe's ratio. */
static int est_tokens(const char *text) {
    return (int)(strlen(text) / R.chars_per_token) + 1;
}

static json_t *msg(const char *role, const char *text) {
    return json_pack("{s:s, s:s}", "role", role, "content", text);
}

/* ---- one request -------------------------------------------------------------------- */

typedef struct stream_state {
    double t_send, t_first, t_last;
    json_t *chunk_ms;
    char *text;
    size_t len, cap;
    json_t *usage, *timings;
    char finish[32], err[512];
    bool done;
} stream_state;

static void text_add(stream_state *st, const char *s, size_t n) {
    if (st->len + n + 1 > st->cap) {
        st->cap = (st->len + n + 1) * 2;
        st->text = realloc(st->text, st->cap);
    }
    memcpy(st->text + st->len, s, n);
    st->len += n;
    st->text[st->len] = 0;
}

static int on_event(void *ctx, const char *data, size_t len, double t) {
    stream_state *st = ctx;
    if (len == 6 && memcmp(data, "[DONE]", 6) == 0) {
        st->done = true;
        return 1;
    }
    json_error_t je;
    json_t *v = json_loadb(data, len, 0, &je);
    if (!v) {
        snprintf(st->err, sizeof st->err, "an event is not JSON: %s", je.text);
        return 1;
    }
    json_t *e = json_object_get(v, "error");
    if (e) {
        const char *m = json_string_value(json_object_get(e, "message"));
        snprintf(st->err, sizeof st->err, "error event: %.400s", m ? m : "(no message)");
    }
    json_t *c0 = json_array_get(json_object_get(v, "choices"), 0);
    if (c0) {
        json_t *delta = json_object_get(c0, "delta");
        json_t *tx = delta ? json_object_get(delta, "content") : json_object_get(c0, "text");
        size_t n = json_string_length(tx);
        if (n) {
            text_add(st, json_string_value(tx), n);
            if (st->t_first == 0) st->t_first = t;
            st->t_last = t;
            json_array_append_new(st->chunk_ms, json_real((t - st->t_send) * 1e3));
        }
        const char *f = json_string_value(json_object_get(c0, "finish_reason"));
        if (f) snprintf(st->finish, sizeof st->finish, "%s", f);
    }
    json_t *u = json_object_get(v, "usage");
    if (json_is_object(u)) json_decref(st->usage), st->usage = json_incref(u);
    json_t *tm = json_object_get(v, "timings");
    if (json_is_object(tm)) json_decref(st->timings), st->timings = json_incref(tm);
    json_decref(v);
    return 0;
}

static int usage_int(const json_t *u, const char *k) {
    return (int)json_integer_value(json_object_get(u, k));
}

/* Sends one streamed chat completion; records it (tags: workload, user,
 * turn, concurrency...).  Returns the reply text (malloc'd) or NULL when it
 * failed; the record is kept either way. */
static char *chat(const char *workload, json_t *messages, int max_tokens, json_t *tags,
                  int *prompt_tokens) {
    server s = current_server();
    json_t *body = json_pack("{s:s, s:O, s:i, s:f, s:I, s:b, s:b, s:{s:b}}", "model", s.model_id,
                             "messages", messages, "max_tokens", max_tokens, "temperature", 0.0,
                             "seed", (json_int_t)(o.seed & 0x7fffffff), "ignore_eos", !o.eos,
                             "stream", 1, "stream_options", "include_usage", 1);
    char *text = json_dumps(body, JSON_COMPACT);
    stream_state st = {.chunk_ms = json_array()};
    bs_http_result hr;
    st.t_send = bs_now();
    int rc = bs_http(s.host, s.port, "POST", "/v1/chat/completions", text, o.api_key, o.timeout,
                     on_event, &st, &hr);
    double t_end = bs_now();
    free(text);

    if (rc)
        snprintf(st.err, sizeof st.err, "%s", hr.err);
    else if (hr.status != 200)
        snprintf(st.err, sizeof st.err, "HTTP %d: %.400s", hr.status, hr.body ? hr.body : "");
    else if (!st.err[0] && !st.done)
        snprintf(st.err, sizeof st.err, "the stream ended without data: [DONE]");
    if (!st.err[0] && !json_is_object(st.usage))
        snprintf(st.err, sizeof st.err,
                 "the response has no usage (stream_options.include_usage): token counts are read "
                 "only from it, so the request is refused");
    if (!st.err[0] && !st.finish[0]) snprintf(st.err, sizeof st.err, "no finish_reason");
    bs_http_result_free(&hr);

    int n_prompt = usage_int(st.usage, "prompt_tokens");
    int n_gen = usage_int(st.usage, "completion_tokens");
    int n_cached = usage_int(json_object_get(st.usage, "prompt_tokens_details"), "cached_tokens");
    json_t *rec =
        json_pack("{s:s, s:o, s:f, s:f, s:i}", "workload", workload, "body", body, "t_start_s",
                  st.t_send - R.t0, "e2e_ms", (t_end - st.t_send) * 1e3, "status", hr.status);
    json_object_update(rec, tags);
    json_decref(tags);
    if (st.t_first > 0)
        json_object_set_new(rec, "ttft_ms", json_real((st.t_first - st.t_send) * 1e3));
    json_object_set_new(rec, "chunk_ms", st.chunk_ms);
    if (!st.err[0]) {
        json_object_set_new(rec, "prompt_tokens", json_integer(n_prompt));
        json_object_set_new(rec, "completion_tokens", json_integer(n_gen));
        json_object_set_new(rec, "cached_tokens", json_integer(n_cached));
        json_object_set_new(rec, "cache",
                            json_string(2 * n_cached < n_prompt ? "cold"
                                        : R.after_restart       ? "ssd"
                                                                : "ram"));
        json_object_set_new(rec, "finish_reason", json_string(st.finish));
        /* decode rate: tokens after the first over the time they took, as
         * the client saw them; when they all came in one chunk (a busy
         * server batches a stream's tokens), the server's own figure */
        double server_tps = st.timings ? json_number_value(json_object_get(
                                             st.timings, "decode_tokens_per_second"))
                                       : 0;
        if (n_gen > 1 && st.t_last > st.t_first) {
            double span = st.t_last - st.t_first;
            json_object_set_new(rec, "itl_ms", json_real(span * 1e3 / (n_gen - 1)));
            json_object_set_new(rec, "decode_tps", json_real((n_gen - 1) / span));
        } else if (n_gen > 1 && server_tps > 0) {
            json_object_set_new(rec, "itl_ms", json_real(1e3 / server_tps));
            json_object_set_new(rec, "decode_tps", json_real(server_tps));
            json_object_set_new(rec, "decode_from", json_string("server timings"));
        }
    }
    json_object_set_new(rec, "usage", st.usage ? st.usage : json_null());
    json_object_set_new(rec, "server_timings", st.timings ? st.timings : json_null());
    json_object_set_new(rec, "response", json_stringn(st.text ? st.text : "", st.len));
    if (st.err[0]) json_object_set_new(rec, "error", json_string(st.err));

    pthread_mutex_lock(&R.mu);
    json_object_set_new(rec, "id", json_integer((json_int_t)json_array_size(R.requests)));
    json_array_append_new(R.requests, rec);
    if (st.err[0]) R.n_failed++;
    pthread_mutex_unlock(&R.mu);
    if (prompt_tokens) *prompt_tokens = n_prompt;
    if (st.err[0]) {
        fprintf(stderr, "bench serve: %s request failed: %s\n", workload, st.err);
        free(st.text);
        return NULL;
    }
    return st.text ? st.text : calloc(1, 1);
}

static json_t *tags(const char *phase, int user, int turn) {
    return json_pack("{s:s, s:i, s:i}", "phase", phase, "user", user, "turn", turn);
}

/* ---- a pool of client threads ------------------------------------------------------- */

/* Runs job(i) for i in [0, n) on k threads; each thread takes the next i. */
typedef void (*job_fn)(int i, void *ctx);
typedef struct pool {
    job_fn fn;
    void *ctx;
    int n, next;
    pthread_mutex_t mu;
} pool;

static void *pool_thread(void *arg) {
    pool *p = arg;
    for (;;) {
        pthread_mutex_lock(&p->mu);
        int i = p->next < p->n ? p->next++ : -1;
        pthread_mutex_unlock(&p->mu);
        if (i < 0) return NULL;
        p->fn(i, p->ctx);
    }
}

static void run_pool(int n, int k, job_fn fn, void *ctx) {
    pool p = {.fn = fn, .ctx = ctx, .n = n, .mu = PTHREAD_MUTEX_INITIALIZER};
    if (k > n) k = n;
    pthread_t *t = calloc((size_t)(k > 0 ? k : 1), sizeof *t);
    int started = 0;
    for (int i = 0; i < k; i++)
        if (pthread_create(&t[i], NULL, pool_thread, &p) == 0)
            started++;
        else
            break;
    if (started == 0) pool_thread(&p); /* no threads: run them here */
    for (int i = 0; i < started; i++)
        pthread_join(t[i], NULL);
    free(t);
}

/* ---- workloads ---------------------------------------------------------------------- */

/* Prompt tokens a conversation may reach before its next reply no longer
 * fits the context (a margin for the template's own tokens). */
static int ctx_budget(void) {
    int b = R.srv.n_ctx - o.max_tokens - 16;
    return b > 32 ? b : 32;
}

/* A conversation: each turn adds a user message and the model's reply, and
 * stops before the history outgrows the context. */
static void conversation(const char *workload, json_t *msgs, int user, int turns, int min_words,
                         int span_words, const char *prefix) {
    int last_prompt = 0;
    for (int t = 0; t < turns; t++) {
        uint64_t s = stream_seed(workload, user, t + 1);
        char text[8192];
        snprintf(text, sizeof text, "%s", prefix ? prefix : "");
        gen_text(&s, min_words + (int)rnd(&s, (unsigned)span_words), text, sizeof text);
        /* the next prompt: the last one, its reply, and this message */
        int est = last_prompt + o.max_tokens + est_tokens(text) + 8;
        if (t > 0 && est > ctx_budget()) {
            note("%s user %d stopped after %d turns: the next turn would not fit the context "
                 "(%d tokens)",
                 workload, user, t, R.srv.n_ctx);
            break;
        }
        json_array_append_new(msgs, msg("user", text));
        char *reply =
            chat(workload, msgs, o.max_tokens, tags(t ? "warm" : "first", user, t), &last_prompt);
        if (!reply) break;
        json_array_append_new(msgs, msg("assistant", reply));
        free(reply);
    }
}

static void chat_user(int u, void *ctx) {
    (void)ctx;
    json_t *msgs = json_array();
    conversation("chat", msgs, u, o.turns, 10, 20, NULL);
    json_decref(msgs);
}

static void wl_chat(void) {
    run_pool(o.users, o.clients, chat_user, NULL);
}

/* shared: one system prompt of half the context, then many short users */
static char *shared_system;

static void shared_user(int u, void *ctx) {
    (void)ctx;
    uint64_t s = stream_seed("shared", u, 0);
    char q[1024] = "";
    gen_text(&s, 8 + (int)rnd(&s, 12), q, sizeof q);
    json_t *msgs = json_pack("[o, o]", msg("system", shared_system), msg("user", q));
    char *reply = chat("shared", msgs, o.max_tokens, tags(u ? "warm" : "first", u, 0), NULL);
    free(reply);
    json_decref(msgs);
}

static void shared_user_rest(int u, void *ctx) {
    shared_user(u + 1, ctx);
}

static void wl_shared(void) {
    int n = words_for(ctx_budget() / 2);
    shared_system = calloc(1, (size_t)n * 12 + 64);
    uint64_t s = stream_seed("shared-system", 0, 0);
    strcpy(shared_system, "You are a helpful story teller. ");
    gen_text(&s, n, shared_system, (size_t)n * 12 + 64);
    shared_user(0, NULL); /* the first fills the cache; the rest may reuse it */
    run_pool(o.shared_users - 1, o.clients, shared_user_rest, NULL);
    free(shared_system);
}

/* agent: a long tool-schema prefix (a third of the context), then turns of
 * short tool results; each loop's history grows by a little per turn. */
static char *agent_prefix;

static void agent_loop(int a, void *ctx) {
    (void)ctx;
    json_t *msgs = json_pack("[o]", msg("system", agent_prefix));
    conversation("agent", msgs, a, o.agent_turns, 4, 10, "Tool result: ");
    json_decref(msgs);
}

static void wl_agent(void) {
    int budget = words_for(ctx_budget() / 3);
    size_t cap = (size_t)budget * 16 + 256;
    agent_prefix = calloc(1, cap);
    strcpy(agent_prefix, "You are an agent. Call one of these tools by name.\n");
    uint64_t s = stream_seed("agent-tools", 0, 0);
    /* JSON punctuation splits into more tokens per byte than words do */
    for (int k = 0;
         est_tokens(agent_prefix) * 1.4 < ctx_budget() / 3 && strlen(agent_prefix) + 512 < cap;
         k++) {
        char desc[256] = "", arg[128] = "";
        gen_text(&s, 6, desc, sizeof desc);
        gen_text(&s, 3, arg, sizeof arg);
        size_t n = strlen(agent_prefix);
        snprintf(agent_prefix + n, cap - n,
                 "{\"name\": \"%s_%d\", \"description\": \"%s\", \"parameters\": {\"type\": "
                 "\"object\", \"properties\": {\"%s\": {\"type\": \"string\", \"description\": "
                 "\"%s\"}}}}\n",
                 words[rnd(&s, PT_ARRAY_LEN(words))], k, desc, words[rnd(&s, PT_ARRAY_LEN(words))],
                 arg);
    }
    run_pool(o.agents, o.clients, agent_loop, NULL);
    free(agent_prefix);
}

/* long: each prompt sent cold, then again (its whole prefix cached). */
static void wl_long(void) {
    int tokens = o.long_tokens ? o.long_tokens : ctx_budget() < 4096 ? ctx_budget() : 4096;
    int n = words_for(tokens);
    size_t cap = (size_t)n * 12 + 64;
    char *text = malloc(cap);
    for (int i = 0; i < o.long_reqs; i++) {
        uint64_t s = stream_seed("long", i, 0);
        text[0] = 0;
        gen_text(&s, n, text, cap);
        for (int rep = 0; rep < 2; rep++) {
            json_t *msgs = json_pack("[o]", msg("user", text));
            free(chat("long", msgs, o.max_tokens, tags(rep ? "repeat" : "first", i, rep), NULL));
            json_decref(msgs);
        }
    }
    free(text);
}

/* depth: alone on the server, prompts of 64, 128, ... tokens up to the
 * context; the decode rate of each is the model's at that depth. */
static void wl_depth(void) {
    int i = 0;
    for (int t = 64;; t *= 2, i++) {
        int tokens = t < ctx_budget() ? t : ctx_budget();
        int n = words_for(tokens);
        size_t cap = (size_t)n * 12 + 64;
        char *text = calloc(1, cap);
        uint64_t s = stream_seed("depth", i, 0);
        gen_text(&s, n, text, cap);
        json_t *msgs = json_pack("[o]", msg("user", text));
        json_t *tg = tags("depth", i, 0);
        json_object_set_new(tg, "concurrency", json_integer(1));
        free(chat("depth", msgs, o.max_tokens, tg, NULL));
        json_decref(msgs);
        free(text);
        if (tokens == ctx_budget() || i == 16) break;
    }
}

/* sweep: C clients each send --sweep-requests distinct prompts. */
static int *levels, n_levels;
static json_t *sweep_levels;

static void sweep_job(int i, void *ctx) {
    int c = *(int *)ctx;
    uint64_t s = stream_seed("sweep", c, i);
    int n = words_for(o.sweep_tokens < ctx_budget() ? o.sweep_tokens : ctx_budget());
    size_t cap = (size_t)n * 12 + 64;
    char *text = calloc(1, cap);
    gen_text(&s, n, text, cap);
    json_t *msgs = json_pack("[o]", msg("user", text));
    json_t *t = tags("sweep", i, 0);
    json_object_set_new(t, "concurrency", json_integer(c));
    free(chat("sweep", msgs, o.max_tokens, t, NULL));
    json_decref(msgs);
    free(text);
}

static void wl_sweep(void) {
    for (int l = 0; l < n_levels; l++) {
        int c = levels[l];
        double t = bs_now();
        run_pool(c * o.sweep_reqs, c, sweep_job, &c);
        json_array_append_new(sweep_levels,
                              json_pack("{s:i, s:f, s:f}", "concurrency", c, "t_begin_s", t - R.t0,
                                        "wall_s", bs_now() - t));
    }
}

/* ---- the server we start ------------------------------------------------------------ */

static void log_tail(char *out, size_t cap) {
    char path[300];
    snprintf(path, sizeof path, "%s/server.log", R.workdir);
    out[0] = 0;
    FILE *f = fopen(path, "r");
    if (!f) return;
    fseek(f, 0, SEEK_END);
    long end = ftell(f);
    fseek(f, end > (long)cap - 1 ? end - (long)cap + 1 : 0, SEEK_SET);
    size_t n = fread(out, 1, cap - 1, f);
    out[n] = 0;
    while (n && out[n - 1] == '\n')
        out[--n] = 0;
    char *nl = strrchr(out, '\n'); /* the last line says why it stopped */
    if (nl) memmove(out, nl + 1, strlen(nl + 1) + 1);
    fclose(f);
}

/* Asks /v1/models for the model id and context (falls back to 4096). */
static int query_model(server *s) {
    bs_http_result hr;
    if (bs_http(s->host, s->port, "GET", "/v1/models", NULL, o.api_key, 30, NULL, NULL, &hr) ||
        hr.status != 200) {
        fprintf(stderr, "bench serve: GET /v1/models on %s:%d failed: %s (HTTP %d)\n", s->host,
                s->port,
                hr.err[0] ? hr.err
                : hr.body ? hr.body
                          : "",
                hr.status);
        bs_http_result_free(&hr);
        return -1;
    }
    json_t *v = json_loads(hr.body, 0, NULL);
    bs_http_result_free(&hr);
    json_t *m = json_array_get(json_object_get(v, "data"), 0);
    const char *id = json_string_value(json_object_get(m, "id"));
    snprintf(s->model_id, sizeof s->model_id, "%s", id ? id : "default");
    s->n_ctx = (int)json_integer_value(json_object_get(json_object_get(m, "meta"), "n_ctx"));
    json_decref(v);
    if (s->n_ctx <= 0) {
        s->n_ctx = 4096;
        note("the server does not report meta.n_ctx in /v1/models; assuming 4096");
    }
    return 0;
}

/* Starts `petrel serve` on a free port and waits until it listens.  On
 * failure (the process exited: a refused flag, a model that does not
 * load), returns -1 with the log's tail in why. */
static int start_server(const char *kv_disk, char *why, size_t cap) {
    char port_file[300], log[300];
    snprintf(port_file, sizeof port_file, "%s/port", R.workdir);
    snprintf(log, sizeof log, "%s/server.log", R.workdir);
    unlink(port_file);
    const char *argv[64 + 16];
    int n = 0;
    argv[n++] = R.exe, argv[n++] = "serve", argv[n++] = "-m", argv[n++] = o.model;
    argv[n++] = "--port", argv[n++] = "0", argv[n++] = "--port-file", argv[n++] = port_file;
    bool has_parallel = false;
    for (int i = 0; i < R.n_srv_args; i++)
        has_parallel |= !strcmp(R.srv_args[i], "-P") || !strcmp(R.srv_args[i], "--parallel") ||
                        !strcmp(R.srv_args[i], "--max-seqs");
    char par[16];
    if (!has_parallel) { /* the sweep's top level should run, not queue */
        int top = 8;
        for (int i = 0; i < n_levels; i++)
            top = levels[i] > top ? levels[i] : top;
        snprintf(par, sizeof par, "%d", top);
        argv[n++] = "--parallel", argv[n++] = par;
    }
    if (kv_disk) argv[n++] = "--kv-disk", argv[n++] = kv_disk;
    for (int i = 0; i < R.n_srv_args && n < 64 + 14; i++)
        argv[n++] = R.srv_args[i];
    argv[n] = NULL;

    fprintf(stderr, "bench serve: starting");
    for (int i = 1; i < n; i++)
        fprintf(stderr, " %s", argv[i]);
    fprintf(stderr, "\n");
    int fd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) return snprintf(why, cap, "cannot write %s: %s", log, strerror(errno)), -1;
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fd, 1), dup2(fd, 2);
        execv(R.exe, (char **)argv);
        _exit(127);
    }
    close(fd);
    if (pid < 0) return snprintf(why, cap, "fork: %s", strerror(errno)), -1;

    server s = {.pid = pid};
    strcpy(s.host, "127.0.0.1");
    for (double t = bs_now(); bs_now() - t < 600;) {
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) {
            char tail[600];
            log_tail(tail, sizeof tail);
            snprintf(why, cap, "the server exited (status %d): %s",
                     WIFEXITED(st) ? WEXITSTATUS(st) : -1, tail);
            return -1;
        }
        FILE *f = fopen(port_file, "r");
        int port = 0;
        char nl = 0;
        if (f) {
            if (fscanf(f, "%d%c", &port, &nl) != 2 || nl != '\n') port = 0;
            fclose(f);
        }
        if (port > 0) {
            s.port = port;
            if (query_model(&s)) break;
            pthread_mutex_lock(&R.mu);
            R.srv = s;
            pthread_mutex_unlock(&R.mu);
            return 0;
        }
        usleep(50 * 1000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    snprintf(why, cap, "the server did not start listening within 600 s");
    return -1;
}

/* SIGTERM, as an operator stops it (the SSD tier writes its hot blocks). */
static void stop_server(void) {
    pthread_mutex_lock(&R.mu);
    pid_t pid = R.srv.pid;
    R.srv.pid = 0, R.srv.port = 0;
    pthread_mutex_unlock(&R.mu);
    if (pid <= 0) return;
    kill(pid, SIGTERM);
    for (int i = 0; i < 600; i++) { /* 60 s, then it is killed */
        if (waitpid(pid, NULL, WNOHANG) == pid) return;
        usleep(100 * 1000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

/* restart: prompts sent, the server stopped and started on the same disk
 * tier, the prompts sent again (from disk), and once more (from RAM). */
static void wl_restart(void) {
    char why[800], dir[300];
    if (!o.model) {
        note("restart skipped: it stops and starts the server, so it needs one this command "
             "started (--model), not --url");
        return;
    }
    snprintf(dir, sizeof dir, "%s", o.kv_disk ? o.kv_disk : "");
    if (!o.kv_disk) { /* the other workloads ran without a disk tier */
        snprintf(dir, sizeof dir, "%s/kv-disk", R.workdir);
        mkdir(dir, 0755);
        stop_server();
        if (start_server(dir, why, sizeof why)) {
            note("restart skipped: the server refused --kv-disk %s (%s)", dir, why);
            if (start_server(NULL, why, sizeof why))
                note("and could not be started again: %s", why);
            return;
        }
    }
    int n = words_for(ctx_budget() / 2);
    size_t cap = (size_t)n * 12 + 64;
    char *text = malloc(cap);
    static const char *const passes[] = {"before-restart", "after-restart", "after-restart-2"};
    for (int pass = 0; pass < 3; pass++) {
        if (pass == 1) {
            stop_server();
            if (start_server(dir, why, sizeof why)) {
                note("restart: the server did not come back on --kv-disk %s: %s", dir, why);
                break;
            }
        }
        R.after_restart = pass == 1; /* the second resend hits RAM again */
        for (int i = 0; i < o.restart_reqs; i++) {
            uint64_t s = stream_seed("restart", i, 0);
            text[0] = 0;
            gen_text(&s, n, text, cap);
            json_t *msgs = json_pack("[o]", msg("user", text));
            free(chat("restart", msgs, o.max_tokens, tags(passes[pass], i, pass), NULL));
            json_decref(msgs);
        }
    }
    R.after_restart = false;
    free(text);
}

/* ---- server memory over time -------------------------------------------------------- */

static double proc_rss_mb(pid_t pid) {
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    double kb = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %lf kB", &kb) == 1) break;
    fclose(f);
    return kb < 0 ? -1 : kb / 1024;
}

/* The process listening on a local TCP port (a --url server on this
 * machine): the socket's inode from /proc/net/tcp{,6}, then the process
 * holding a descriptor to it.  0 when not found or not ours to read. */
static pid_t listener_pid(int port) {
    unsigned long inode = 0;
    static const char *const tables[] = {"/proc/net/tcp", "/proc/net/tcp6"};
    for (size_t t = 0; t < PT_ARRAY_LEN(tables) && !inode; t++) {
        FILE *f = fopen(tables[t], "r");
        char line[512], local[64];
        unsigned st;
        unsigned long ino;
        while (f && fgets(line, sizeof line, f)) {
            if (sscanf(line, " %*d: %63s %*s %x %*s %*s %*s %*d %*d %lu", local, &st, &ino) != 3)
                continue;
            char *c = strrchr(local, ':');
            if (c && st == 0x0A /* LISTEN */ && strtol(c + 1, NULL, 16) == port) {
                inode = ino;
                break;
            }
        }
        if (f) fclose(f);
    }
    if (!inode) return 0;
    char want[64];
    snprintf(want, sizeof want, "socket:[%lu]", inode);
    pid_t found = 0;
    DIR *procs = opendir("/proc");
    struct dirent *e;
    while (!found && procs && (e = readdir(procs))) {
        if (e->d_name[0] < '1' || e->d_name[0] > '9') continue;
        char dir[300], link[600], target[64];
        snprintf(dir, sizeof dir, "/proc/%s/fd", e->d_name);
        DIR *fds = opendir(dir);
        struct dirent *x;
        while (!found && fds && (x = readdir(fds))) {
            snprintf(link, sizeof link, "%s/%s", dir, x->d_name);
            ssize_t n = readlink(link, target, sizeof target - 1);
            if (n > 0 && (target[n] = 0, strcmp(target, want) == 0)) found = atoi(e->d_name);
        }
        if (fds) closedir(fds);
    }
    if (procs) closedir(procs);
    return found;
}

/* Samples RSS (/proc when the server is ours or local; /health's rss_bytes when it
 * reports one) and the KV pages /health shows, until R.sampling drops. */
static void *sampler(void *arg) {
    (void)arg;
    while (R.sampling) {
        server s = current_server();
        pid_t pid = s.pid > 0 ? s.pid : s.watch_pid;
        double t = bs_now() - R.t0, rss = pid > 0 ? proc_rss_mb(pid) : -1;
        json_t *smp = NULL;
        bs_http_result hr;
        if (s.port > 0 &&
            bs_http(s.host, s.port, "GET", "/health", NULL, o.api_key, 5, NULL, NULL, &hr) == 0) {
            json_t *h = json_loads(hr.body, 0, NULL);
            if (json_is_object(h)) {
                smp = json_object();
                static const char *const keys[] = {"running", "waiting", "kv_pages_reserved",
                                                   "kv_pages"};
                for (size_t k = 0; k < PT_ARRAY_LEN(keys); k++)
                    if (json_is_integer(json_object_get(h, keys[k])))
                        json_object_set(smp, keys[k], json_object_get(h, keys[k]));
                json_t *rb = json_object_get(h, "rss_bytes");
                if (rss < 0 && json_is_number(rb)) rss = json_number_value(rb) / 1048576.0;
            }
            json_decref(h);
        }
        bs_http_result_free(&hr);
        if (rss >= 0 || smp) {
            if (!smp) smp = json_object();
            json_object_set_new(smp, "t_s", json_real(t));
            if (rss >= 0) json_object_set_new(smp, "rss_mb", json_real(rss));
            pthread_mutex_lock(&R.mu);
            json_array_append_new(R.samples, smp);
            pthread_mutex_unlock(&R.mu);
        }
        usleep((useconds_t)o.rss_ms * 1000);
    }
    return NULL;
}

/* ---- the summary ---------------------------------------------------------------------- */

typedef struct vec {
    double *v;
    int n, cap;
} vec;

static void vec_add(vec *a, double x) {
    if (a->n == a->cap)
        a->cap = a->cap ? a->cap * 2 : 64, a->v = realloc(a->v, a->cap * sizeof *a->v);
    a->v[a->n++] = x;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double bs_percentile(double *v, int n, double p) {
    if (n <= 0) return NAN;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    double x = p / 100.0 * (n - 1);
    int i = (int)x;
    return i + 1 < n ? v[i] + (x - i) * (v[i + 1] - v[i]) : v[n - 1];
}

static json_t *dist(vec *a) {
    json_t *d = json_pack("{s:i}", "n", a->n);
    if (a->n) {
        json_object_set_new(d, "p50", json_real(bs_percentile(a->v, a->n, 50)));
        json_object_set_new(d, "p90", json_real(bs_percentile(a->v, a->n, 90)));
        json_object_set_new(d, "p99", json_real(bs_percentile(a->v, a->n, 99)));
        double s = 0;
        for (int i = 0; i < a->n; i++)
            s += a->v[i];
        json_object_set_new(d, "mean", json_real(s / a->n));
    }
    free(a->v);
    *a = (vec){0};
    return d;
}

static const char *const cache_classes[] = {"cold", "ram", "ssd"};

/* Statistics over the records r matches (workload == w, or all but the
 * probe when w is NULL). */
static json_t *summarize(const char *w) {
    vec ttft[3] = {{0}}, itl = {0}, tps = {0};
    long prompt = 0, cached = 0, gen = 0;
    int n = 0, failed = 0;
    size_t i;
    json_t *r;
    json_array_foreach(R.requests, i, r) {
        const char *rw = json_string_value(json_object_get(r, "workload"));
        if (w ? strcmp(rw, w) != 0 : strcmp(rw, "probe") == 0) continue;
        n++;
        if (json_object_get(r, "error")) {
            failed++;
            continue;
        }
        prompt += json_integer_value(json_object_get(r, "prompt_tokens"));
        cached += json_integer_value(json_object_get(r, "cached_tokens"));
        gen += json_integer_value(json_object_get(r, "completion_tokens"));
        const char *c = json_string_value(json_object_get(r, "cache"));
        json_t *t = json_object_get(r, "ttft_ms");
        for (int k = 0; k < 3; k++)
            if (t && strcmp(c, cache_classes[k]) == 0) vec_add(&ttft[k], json_real_value(t));
        if (json_object_get(r, "itl_ms")) {
            vec_add(&itl, json_real_value(json_object_get(r, "itl_ms")));
            vec_add(&tps, json_real_value(json_object_get(r, "decode_tps")));
        }
    }
    json_t *tt = json_object();
    for (int k = 0; k < 3; k++)
        json_object_set_new(tt, cache_classes[k], dist(&ttft[k]));
    return json_pack("{s:i, s:i, s:I, s:I, s:I, s:f, s:o, s:o, s:o}", "requests", n, "failed",
                     failed, "prompt_tokens", (json_int_t)prompt, "cached_tokens",
                     (json_int_t)cached, "completion_tokens", (json_int_t)gen, "cache_hit_rate",
                     prompt ? (double)cached / prompt : 0.0, "ttft_ms", tt, "itl_ms", dist(&itl),
                     "decode_tps", dist(&tps));
}

/* Aggregate throughput per sweep level: tokens of its requests over its
 * wall time. */
static json_t *sweep_summary(void) {
    json_t *out = json_array(), *lv;
    size_t i, j;
    json_array_foreach(sweep_levels, i, lv) {
        int c = (int)json_integer_value(json_object_get(lv, "concurrency"));
        double wall = json_real_value(json_object_get(lv, "wall_s"));
        long gen = 0;
        int n = 0;
        vec ttft = {0};
        json_t *r;
        json_array_foreach(R.requests, j, r) {
            if (json_integer_value(json_object_get(r, "concurrency")) != c ||
                json_object_get(r, "error") ||
                strcmp(json_string_value(json_object_get(r, "workload")), "sweep"))
                continue;
            n++;
            gen += json_integer_value(json_object_get(r, "completion_tokens"));
            if (json_object_get(r, "ttft_ms"))
                vec_add(&ttft, json_real_value(json_object_get(r, "ttft_ms")));
        }
        json_array_append_new(out, json_pack("{s:i, s:i, s:I, s:f, s:f, s:f, s:o}", "concurrency",
                                             c, "requests", n, "completion_tokens", (json_int_t)gen,
                                             "wall_s", wall, "tok_s", wall > 0 ? gen / wall : 0.0,
                                             "req_s", wall > 0 ? n / wall : 0.0, "ttft_ms",
                                             dist(&ttft)));
    }
    return out;
}

/* Decode tok/s by context depth (prompt tokens), in power-of-two bins, of
 * the depth workload's requests (each alone on the server). */
static json_t *depth_summary(void) {
    vec bins[24] = {{0}};
    size_t i;
    json_t *r;
    json_array_foreach(R.requests, i, r) {
        json_t *d = json_object_get(r, "decode_tps");
        if (!d || strcmp(json_string_value(json_object_get(r, "workload")), "depth")) continue;
        int depth = (int)json_integer_value(json_object_get(r, "prompt_tokens")), b = 0;
        while (b < 23 && (64 << b) <= depth)
            b++;
        vec_add(&bins[b], json_real_value(d));
    }
    json_t *out = json_array();
    for (int b = 0; b < 24; b++) {
        if (!bins[b].n) continue;
        json_t *d = dist(&bins[b]);
        json_object_set_new(d, "depth_lo", json_integer(b ? 64 << (b - 1) : 0));
        json_object_set_new(d, "depth_hi", json_integer(64 << b));
        json_array_append(out, d);
        json_decref(d);
    }
    return out;
}

/* ---- the run -------------------------------------------------------------------------- */

/* Two prompts of 20 and 120 words give the server's tokens per word, so
 * workloads can size prompts to its context without a tokenizer here. */
static int probe(void) {
    int p[2];
    size_t len[2];
    static const int n_words[2] = {20, 120};
    for (int i = 0; i < 2; i++) {
        char text[2048] = "";
        uint64_t s = stream_seed("probe", i, 0);
        gen_text(&s, n_words[i], text, sizeof text);
        len[i] = strlen(text);
        json_t *msgs = json_pack("[o]", msg("user", text));
        char *reply = chat("probe", msgs, 1, tags("probe", i, 0), &p[i]);
        json_decref(msgs);
        if (!reply) return -1;
        free(reply);
    }
    R.words_per_token = p[1] > p[0] ? 100.0 / (p[1] - p[0]) : 0.5;
    R.chars_per_token = p[1] > p[0] ? (double)(len[1] - len[0]) / (p[1] - p[0]) : 2;
    return 0;
}

static const struct {
    const char *name;
    void (*run)(void);
} workloads[] = {
    {"chat", wl_chat},   {"shared", wl_shared}, {"agent", wl_agent},     {"long", wl_long},
    {"depth", wl_depth}, {"sweep", wl_sweep},   {"restart", wl_restart},
};

static bool wanted(const char *name) {
    if (!o.workloads) return true;
    size_t n = strlen(name);
    for (const char *p = o.workloads; (p = strstr(p, name)); p += n)
        if ((p == o.workloads || p[-1] == ',') && (p[n] == 0 || p[n] == ',')) return true;
    return false;
}

static int parse_levels(void) {
    const char *s = o.conc ? o.conc : "1,2,4,8,16,32,64";
    levels = calloc(strlen(s) + 1, sizeof *levels);
    n_levels = 0;
    while (*s) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 1 || v > 1024 || (*end && *end != ',')) {
            fprintf(stderr, "petrel bench serve: --concurrency takes levels 1..1024 like 1,4,16\n");
            return -1;
        }
        levels[n_levels++] = (int)v;
        s = *end ? end + 1 : end;
    }
    return n_levels ? 0 : -1;
}

static int write_html(const json_t *run, const char *path) {
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "petrel bench serve: cannot write %s: %s\n", path, strerror(errno));
        return -1;
    }
    int rc = bs_report_html(run, f);
    if (fclose(f) || rc) {
        fprintf(stderr, "petrel bench serve: writing %s failed\n", path);
        return -1;
    }
    return 0;
}

static json_t *config_json(void) {
    json_t *c = json_pack(
        "{s:I, s:i, s:b, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:s}", "seed",
        (json_int_t)o.seed, "max_tokens", o.max_tokens, "ignore_eos", !o.eos, "users", o.users,
        "turns", o.turns, "shared_users", o.shared_users, "clients", o.clients, "agents", o.agents,
        "agent_turns", o.agent_turns, "long_requests", o.long_reqs, "sweep_requests", o.sweep_reqs,
        "sweep_tokens", o.sweep_tokens, "restart_requests", o.restart_reqs, "workloads",
        o.workloads ? o.workloads : "chat,shared,agent,long,depth,sweep,restart");
    json_t *lv = json_array();
    for (int i = 0; i < n_levels; i++)
        json_array_append_new(lv, json_integer(levels[i]));
    json_object_set_new(c, "concurrency", lv);
    return c;
}

static void print_summary(const json_t *sum) {
    printf("%-8s %5s %6s %9s %9s %9s %9s %8s %8s   (0: none measured)\n", "workload", "reqs",
           "hit%", "cold p50", "cold p99", "cache p50", "cache p99", "itl p50", "tok/s");
    const char *k;
    json_t *w;
    json_object_foreach(json_object_get(sum, "workloads"), k, w) {
        json_t *tt = json_object_get(w, "ttft_ms");
        json_t *cold = json_object_get(tt, "cold"), *ram = json_object_get(tt, "ram");
        if (!json_integer_value(json_object_get(ram, "n"))) ram = json_object_get(tt, "ssd");
#define P(d, q) (json_object_get(d, q) ? json_real_value(json_object_get(d, q)) : 0)
        printf("%-8s %5d %5.1f%% %7.1fms %7.1fms %7.1fms %7.1fms %6.2fms %8.1f\n", k,
               (int)json_integer_value(json_object_get(w, "requests")),
               100 * json_real_value(json_object_get(w, "cache_hit_rate")), P(cold, "p50"),
               P(cold, "p99"), P(ram, "p50"), P(ram, "p99"), P(json_object_get(w, "itl_ms"), "p50"),
               P(json_object_get(w, "decode_tps"), "p50"));
    }
    json_t *lv;
    size_t i;
    json_array_foreach(json_object_get(sum, "sweep"), i, lv) printf(
        "concurrency %3d: %8.1f tok/s aggregate, %6.2f req/s, TTFT p50 %.1f ms\n",
        (int)json_integer_value(json_object_get(lv, "concurrency")),
        json_real_value(json_object_get(lv, "tok_s")),
        json_real_value(json_object_get(lv, "req_s")), P(json_object_get(lv, "ttft_ms"), "p50"));
#undef P
}

static int report_only(void) {
    json_error_t je;
    json_t *run = json_load_file(o.report_from, 0, &je);
    if (!run) {
        fprintf(stderr, "petrel bench serve: %s: %s (line %d)\n", o.report_from, je.text, je.line);
        return 1;
    }
    int rc = write_html(run, o.html);
    json_decref(run);
    return rc ? 1 : 0;
}

static void defaults(void) {
    memset(&o, 0, sizeof o);
    o.seed = 1, o.max_tokens = 32, o.users = 4, o.turns = 4, o.shared_users = 8, o.clients = 4;
    o.agents = 2, o.agent_turns = 4, o.long_reqs = 2, o.sweep_reqs = 2, o.sweep_tokens = 128;
    o.restart_reqs = 4, o.timeout = 600, o.rss_ms = 250, o.json = "bench-serve.json";
}

/* Everything after a bare "--" goes to the server we start. */
static int split_server_args(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--") == 0) {
            R.srv_args = argv + i + 1, R.n_srv_args = argc - i - 1;
            return i;
        }
    return argc;
}

static int check_opts(void) {
    int ints[] = {o.max_tokens,   o.users,       o.turns,     o.shared_users, o.clients,
                  o.agents,       o.agent_turns, o.long_reqs, o.sweep_reqs,   o.sweep_tokens,
                  o.restart_reqs, o.timeout,     o.rss_ms};
    for (size_t i = 0; i < PT_ARRAY_LEN(ints); i++)
        if (ints[i] < 1 || ints[i] > 1 << 20) {
            fprintf(stderr, "petrel bench serve: counts, sizes and times must be 1..1048576\n");
            return -1;
        }
    if (o.long_tokens < 0) return fprintf(stderr, "petrel bench serve: --long-tokens < 0\n"), -1;
    if (!!o.url == !!o.model) {
        fprintf(stderr, "petrel bench serve: give --url URL (a running server) or --model M (start "
                        "one), not both\n");
        return -1;
    }
    if (o.url && (R.n_srv_args || o.server_bin)) {
        fprintf(stderr, "petrel bench serve: server flags after -- and --server-bin need --model "
                        "(a server this command starts)\n");
        return -1;
    }
    for (const char *p = o.workloads; p && *p;) {
        size_t n = strcspn(p, ",");
        bool ok = false;
        for (size_t i = 0; i < PT_ARRAY_LEN(workloads); i++)
            ok |= strlen(workloads[i].name) == n && !strncmp(p, workloads[i].name, n);
        if (!ok) {
            fprintf(stderr,
                    "petrel bench serve: unknown workload '%.*s' (chat, shared, agent, "
                    "long, depth, sweep, restart)\n",
                    (int)n, p);
            return -1;
        }
        p += n + (p[n] == ',');
    }
    return parse_levels();
}

static int remove_entry(const char *path, const struct stat *st, int type, struct FTW *ftw) {
    (void)st, (void)type, (void)ftw;
    return remove(path);
}

static char html_default[4096];

int cmd_bench_serve(int argc, char **argv) {
    defaults();
    int n_own = split_server_args(argc, argv);
    const cli_opt *tables[] = {bs_opts, NULL};
    int n_pos;
    int rc = cli_parse(
        n_own, argv,
        "petrel bench serve (--url URL | --model M [-- SERVER FLAGS]) [options]\n\n"
        "Load-tests an OpenAI-compatible server with seeded workloads (multi-turn chat, a shared\n"
        "system prompt, an agent loop, long prompts, decode by depth, a concurrency sweep, a\n"
        "restart on the same --kv-disk) and writes every request to --json and an offline\n"
        "HTML report to --html.  Token counts come from the server's usage; a response\n"
        "without it fails the run.  A self-started server gets --parallel of the highest\n"
        "--concurrency unless the flags after -- set it (its KV pool is --ctx x --parallel\n"
        "unless --kv-budget says otherwise).",
        tables, NULL, 0, &n_pos);
    if (rc) return rc < 0 ? 2 : 0;
    if (!o.html) { /* FILE.json -> FILE.html */
        size_t n = strlen(o.json);
        if (n > 5 && !strcmp(o.json + n - 5, ".json")) n -= 5;
        snprintf(html_default, sizeof html_default, "%.*s.html", (int)n, o.json);
        o.html = html_default;
    }
    if (o.report_from) return report_only();
    if (!o.api_key) o.api_key = getenv("PETREL_API_KEY");
    if (check_opts()) return 2;

    R.t0 = bs_now();
    R.requests = json_array(), R.samples = json_array(), R.phases = json_array();
    R.notes = json_array(), sweep_levels = json_array();
    char why[800];
    if (o.model) {
        ssize_t n = o.server_bin ? snprintf(R.exe, sizeof R.exe, "%s", o.server_bin)
                                 : readlink("/proc/self/exe", R.exe, sizeof R.exe - 1);
        snprintf(R.workdir, sizeof R.workdir, "%s/petrel-bench-XXXXXX",
                 getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
        if (n <= 0 || !mkdtemp(R.workdir)) {
            fprintf(stderr,
                    "petrel bench serve: cannot find this binary or make a temporary "
                    "directory: %s\n",
                    strerror(errno));
            return 1;
        }
        R.exe[n] = 0;
        if (start_server(o.kv_disk, why, sizeof why)) {
            fprintf(stderr, "petrel bench serve: could not start the server: %s\n", why);
            nftw(R.workdir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
            return 1;
        }
    } else {
        if (bs_parse_url(o.url, R.srv.host, sizeof R.srv.host, &R.srv.port)) {
            fprintf(stderr, "petrel bench serve: --url %s: expected http://HOST:PORT\n", o.url);
            return 2;
        }
        if (query_model(&R.srv)) return 1;
        const char *h = R.srv.host;
        if (!strcmp(h, "127.0.0.1") || !strcmp(h, "localhost") || !strcmp(h, "::1"))
            R.srv.watch_pid = listener_pid(R.srv.port);
        if (!R.srv.watch_pid)
            note("the server's process is not readable here: its memory comes from /health's "
                 "rss_bytes, if it reports one");
    }

    pthread_t smp;
    R.sampling = 1;
    bool sampling = pthread_create(&smp, NULL, sampler, NULL) == 0;
    int n_ctx = R.srv.n_ctx;
    if (probe() == 0) {
        fprintf(stderr, "bench serve: %s, context %d, %.2f words per token\n", R.srv.model_id,
                n_ctx, R.words_per_token);
        for (size_t i = 0; i < PT_ARRAY_LEN(workloads); i++) {
            if (!wanted(workloads[i].name)) continue;
            fprintf(stderr, "bench serve: workload %s\n", workloads[i].name);
            double t = bs_now() - R.t0;
            workloads[i].run();
            json_array_append_new(R.phases, json_pack("{s:s, s:f, s:f}", "name", workloads[i].name,
                                                      "t_begin_s", t, "t_end_s", bs_now() - R.t0));
        }
    } else {
        note("the probe requests failed; no workload ran");
    }
    R.sampling = 0;
    if (sampling) pthread_join(smp, NULL);
    server last = R.srv;
    stop_server();

    json_t *sum =
        json_pack("{s:o, s:o, s:o, s:o}", "all", summarize(NULL), "workloads", json_object(),
                  "sweep", sweep_summary(), "decode_by_depth", depth_summary());
    for (size_t i = 0; i < PT_ARRAY_LEN(workloads); i++)
        if (wanted(workloads[i].name))
            json_object_set_new(json_object_get(sum, "workloads"), workloads[i].name,
                                summarize(workloads[i].name));
    double peak = 0;
    size_t i;
    json_t *s;
    json_array_foreach(R.samples, i, s) {
        double r = json_real_value(json_object_get(s, "rss_mb"));
        peak = r > peak ? r : peak;
    }
    json_object_set_new(sum, "peak_rss_mb", json_real(peak));
    time_t now = time(NULL);
    char when[32];
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    json_t *srv_args = json_array();
    for (int k = 0; k < R.n_srv_args; k++)
        json_array_append_new(srv_args, json_string(R.srv_args[k]));
    json_t *run = json_pack(
        "{s:s, s:i, s:s, s:{s:s, s:s, s:i, s:b, s:o, s:s?, s:s?}, s:o, s:f, s:f, s:o, s:o, s:o, "
        "s:o, s:o, s:o}",
        "tool", "petrel bench serve", "format", 1, "created", when, "server", "model_id",
        last.model_id, "address", o.url ? o.url : "self-started", "n_ctx", n_ctx, "self_started",
        o.model != NULL, "args", srv_args, "model", o.model, "bin", o.server_bin, "config",
        config_json(), "words_per_token", R.words_per_token, "duration_s", bs_now() - R.t0, "notes",
        R.notes, "phases", R.phases, "summary", sum, "sweep_levels", sweep_levels, "samples",
        R.samples, "requests", R.requests);
    print_summary(sum);
    rc = 0;
    if (json_dump_file(run, o.json, JSON_COMPACT)) {
        fprintf(stderr, "petrel bench serve: cannot write %s\n", o.json);
        rc = 1;
    }
    if (write_html(run, o.html)) rc = 1;
    fprintf(stderr, "bench serve: %zu requests, %d failed; wrote %s and %s\n",
            json_array_size(R.requests), R.n_failed, o.json, o.html);
    json_decref(run);
    free(levels);
    if (R.workdir[0]) { /* the server's log stays when something failed */
        if (R.n_failed)
            fprintf(stderr, "bench serve: the server's log is in %s/server.log\n", R.workdir);
        else
            nftw(R.workdir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    }
    return rc ? 1 : R.n_failed ? 1 : 0;
}
