/*
 * metrics.c - the counters and histograms behind GET /metrics, and their
 * Prometheus text exposition (format 0.0.4).
 *
 * Names follow vLLM's where they mean the same (vllm:X becomes petrel:X),
 * so dashboards built for it need only the prefix changed.  Every series
 * carries model_name.  Histograms are cumulative on output (_bucket{le}),
 * kept per bucket here so that an observation is one increment.
 *
 * With a model pool every model has its own counters and series; a model
 * not loaded shows zero gauges and model_loaded 0.
 *
 * The counters count what the client was told: tokens are the usage
 * numbers of the response, finished reasons its finish_reason (a client
 * that left or a shutdown is "abort").  Requests refused before they
 * reached the scheduler (a bad prompt, a full queue) are not counted.
 */
#include "server/metrics.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/server_int.h"

/* Bounds in seconds: vLLM's, with finer ones below 10 ms where a small
 * model on a fast machine lives. */
static const double k_ttft_le[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25, 0.5,
                                   0.75,  1.0,   2.5,  5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0};
static const double k_itl_le[] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075,
                                  0.1,    0.15,  0.2,    0.3,   0.4,  0.5,   0.75, 1.0,
                                  2.5,    5.0,   7.5,    10.0,  20.0, 40.0,  80.0};
static const double k_e2e_le[] = {0.01, 0.05, 0.1,  0.3,  0.5,  0.8,  1.0,   1.5,   2.0,  2.5,
                                  5.0,  10.0, 15.0, 20.0, 30.0, 40.0, 50.0,  60.0,  120.0, 240.0,
                                  480.0, 960.0, 1920.0};

static void hist_init(pt_hist *h, const double *le, int n) {
    memset(h, 0, sizeof *h);
    h->le = le;
    h->n_le = n;
}

/* Caller holds the metrics mutex. */
static void hist_observe(pt_hist *h, double x) {
    int i = 0;
    while (i < h->n_le && x > h->le[i])
        i++;
    h->count[i]++;
    h->n++;
    h->sum += x;
}

void pt_metrics_init(pt_metrics *m) {
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
    hist_init(&m->ttft, k_ttft_le, (int)PT_ARRAY_LEN(k_ttft_le));
    hist_init(&m->itl, k_itl_le, (int)PT_ARRAY_LEN(k_itl_le));
    hist_init(&m->e2e, k_e2e_le, (int)PT_ARRAY_LEN(k_e2e_le));
    hist_init(&m->queue, k_e2e_le, (int)PT_ARRAY_LEN(k_e2e_le));
}

void pt_metrics_free(pt_metrics *m) {
    pthread_mutex_destroy(&m->mu);
}

/* ---- recording ----------------------------------------------------------------- */

void pt_metrics_arrival(pt_req_clock *c) {
    c->t_arrival = pt_now();
    c->t_last = 0;
}

void pt_metrics_token(pt_metrics *m, pt_req_clock *c) {
    double now = pt_now();
    if (c->t_last > 0) {
        pthread_mutex_lock(&m->mu);
        hist_observe(&m->itl, now - c->t_last);
        pthread_mutex_unlock(&m->mu);
    }
    c->t_last = now; /* only the scheduler thread touches it while the job runs */
}

static int reason_of(int finish) {
    switch (finish) {
    case PT_FINISH_STOP: return PT_MR_STOP;
    case PT_FINISH_LENGTH: return PT_MR_LENGTH;
    case PT_FINISH_CANCEL: return PT_MR_ABORT;
    default: return PT_MR_ERROR;
    }
}

void pt_metrics_done(pt_metrics *m, const pt_req_clock *c, const pt_sched_stats *st, bool first) {
    double e2e = pt_now() - c->t_arrival;
    pthread_mutex_lock(&m->mu);
    m->generation_tokens += (uint64_t)st->n_generated;
    m->drafted += (uint64_t)st->n_drafted;
    m->accepted += (uint64_t)st->n_accepted;
    m->preemptions += (uint64_t)st->n_preempted;
    if (first) {
        m->finished[reason_of(st->finish)]++;
        m->prompt_tokens += (uint64_t)st->n_prompt;
        m->prefix_queries += (uint64_t)st->n_prompt;
        m->prefix_hits += (uint64_t)st->n_cached;
        if (st->n_generated > 0) hist_observe(&m->ttft, st->ttft);
        hist_observe(&m->queue, st->t_queue);
        hist_observe(&m->e2e, e2e);
    }
    pthread_mutex_unlock(&m->mu);
}

/* ---- exposition ----------------------------------------------------------------- */

static void head(FILE *f, const char *name, const char *type, const char *help) {
    fprintf(f, "# HELP petrel:%s %s\n# TYPE petrel:%s %s\n", name, help, name, type);
}

static void sample_u(FILE *f, const char *name, const char *labels, uint64_t v) {
    fprintf(f, "petrel:%s{%s} %llu\n", name, labels, (unsigned long long)v);
}

/* One histogram's samples (its head written by the caller). */
static void histogram(FILE *f, const char *name, const char *labels, const pt_hist *h) {
    uint64_t cum = 0;
    for (int i = 0; i <= h->n_le; i++) {
        cum += h->count[i];
        if (i < h->n_le)
            fprintf(f, "petrel:%s_bucket{%s,le=\"%g\"} %llu\n", name, labels, h->le[i],
                    (unsigned long long)cum);
        else
            fprintf(f, "petrel:%s_bucket{%s,le=\"+Inf\"} %llu\n", name, labels,
                    (unsigned long long)cum);
    }
    fprintf(f, "petrel:%s_sum{%s} %.17g\n", name, labels, h->sum);
    fprintf(f, "petrel:%s_count{%s} %llu\n", name, labels, (unsigned long long)h->n);
}

/* model_name="..." with the value escaped as the format requires. */
static void model_label(char *out, size_t cap, const char *model) {
    size_t k = (size_t)snprintf(out, cap, "model_name=\"");
    for (const char *p = model; *p && k + 4 < cap; p++) {
        if (*p == '\\' || *p == '"') out[k++] = '\\';
        if (*p == '\n') {
            out[k++] = '\\', out[k++] = 'n';
            continue;
        }
        out[k++] = *p;
    }
    out[k++] = '"';
    out[k] = 0;
}

/* The families, each with one series per model.  Gauges and counters
 * are read through offsets into pt_metrics_model (gauges) and pt_metrics
 * (counters), so that a family is one loop over the models. */
typedef struct family {
    const char *name, *help;
    size_t off; /* into pt_metrics_gauges (gauges) or pt_metrics (counters) */
} family;

#define G(name, field, help) {name, help, offsetof(pt_metrics_gauges, field)}
static const family k_gauges[] = {
    G("num_requests_running", running, "Requests in the running batch."),
    G("num_requests_waiting", waiting,
      "Requests queued or preempted, waiting for a slot (or for their model to load)."),
    G("kv_blocks_total", kv_blocks, "KV cache blocks (pages) in the pool."),
    G("kv_blocks_used", kv_used, "KV cache blocks held by requests."),
    G("kv_blocks_cached", kv_cached, "Free KV cache blocks that still hold a cached prefix."),
    G("model_loaded", loaded, "1 if the model is loaded (in the model pool), else 0."),
};
#undef G
#define C(name, field, help) {name, help, offsetof(pt_metrics, field)}
static const family k_counters[] = {
    C("prompt_tokens_total", prompt_tokens, "Prompt tokens of finished requests."),
    C("generation_tokens_total", generation_tokens,
      "Generated tokens of finished requests (usage)."),
    C("prefix_cache_queries_total", prefix_queries, "Prompt tokens looked up in the prefix cache."),
    C("prefix_cache_hits_total", prefix_hits, "Prompt tokens whose KV came from the prefix cache."),
    C("spec_decode_num_draft_tokens_total", drafted, "Speculative tokens drafted."),
    C("spec_decode_num_accepted_tokens_total", accepted, "Speculative tokens accepted."),
    C("num_preemptions_total", preemptions, "Times a request was preempted and recomputed."),
    C("model_loads_total", loads, "Times the model was loaded (the model pool)."),
};
#undef C
static const struct {
    const char *name, *help;
    size_t off;
} k_hists[] = {
    {"time_to_first_token_seconds", "Request queued to first token sampled.",
     offsetof(pt_metrics, ttft)},
    {"inter_token_latency_seconds", "Time between two sampled tokens of a request.",
     offsetof(pt_metrics, itl)},
    {"e2e_request_latency_seconds", "Request parsed to its last token.", offsetof(pt_metrics, e2e)},
    {"request_queue_time_seconds", "Request queued to admitted into the batch.",
     offsetof(pt_metrics, queue)},
};

char *pt_metrics_render(const pt_metrics_model *models, int n, size_t *len) {
    char *buf = NULL;
    FILE *f = open_memstream(&buf, len);
    if (!f) return NULL;
    char(*lab)[600] = pt_xmalloc(sizeof *lab * (size_t)n);
    char lr[700];
    for (int k = 0; k < n; k++)
        model_label(lab[k], sizeof lab[k], models[k].name);
    for (size_t i = 0; i < PT_ARRAY_LEN(k_gauges); i++) {
        head(f, k_gauges[i].name, "gauge", k_gauges[i].help);
        for (int k = 0; k < n; k++)
            fprintf(f, "petrel:%s{%s} %d\n", k_gauges[i].name, lab[k],
                    *(const int *)((const char *)&models[k].g + k_gauges[i].off));
    }
    head(f, "kv_blocks_free", "gauge", "KV cache blocks not held by a request (cached ones included).");
    for (int k = 0; k < n; k++)
        fprintf(f, "petrel:kv_blocks_free{%s} %d\n", lab[k], models[k].g.kv_blocks - models[k].g.kv_used);
    head(f, "kv_cache_usage_perc", "gauge", "Fraction of the KV cache blocks in use (1 = full).");
    for (int k = 0; k < n; k++) {
        const pt_metrics_gauges *g = &models[k].g;
        fprintf(f, "petrel:kv_cache_usage_perc{%s} %.17g\n", lab[k],
                g->kv_blocks > 0 ? (double)g->kv_used / g->kv_blocks : 0.0);
    }
    for (int k = 0; k < n; k++) /* in index order: nothing else takes two */
        pthread_mutex_lock(&models[k].m->mu);
    static const char *const reasons[PT_MR_N] = {"stop", "length", "abort", "error"};
    head(f, "request_success_total", "counter", "Finished requests, by finish reason.");
    for (int k = 0; k < n; k++)
        for (int r = 0; r < PT_MR_N; r++) {
            snprintf(lr, sizeof lr, "%s,finished_reason=\"%s\"", lab[k], reasons[r]);
            sample_u(f, "request_success_total", lr, models[k].m->finished[r]);
        }
    for (size_t i = 0; i < PT_ARRAY_LEN(k_counters); i++) {
        head(f, k_counters[i].name, "counter", k_counters[i].help);
        for (int k = 0; k < n; k++)
            sample_u(f, k_counters[i].name, lab[k],
                     *(const uint64_t *)((const char *)models[k].m + k_counters[i].off));
    }
    for (size_t i = 0; i < PT_ARRAY_LEN(k_hists); i++) {
        head(f, k_hists[i].name, "histogram", k_hists[i].help);
        for (int k = 0; k < n; k++)
            histogram(f, k_hists[i].name, lab[k],
                      (const pt_hist *)((const char *)models[k].m + k_hists[i].off));
    }
    for (int k = n - 1; k >= 0; k--)
        pthread_mutex_unlock(&models[k].m->mu);
    free(lab);
    if (fclose(f)) {
        free(buf);
        return NULL;
    }
    return buf;
}

/* ---- the route -------------------------------------------------------------------- */

void pt_handle_metrics(pt_conn *c, const char *body, size_t len) {
    (void)body, (void)len;
    pt_server *s = pt_conn_server(c);
    pt_metrics_model *mm = pt_xcalloc((size_t)s->n_slots, sizeof *mm);
    for (int k = 0; k < s->n_slots; k++) {
        pt_slot *m = &s->slots[k];
        pt_metrics_gauges *g = &mm[k].g;
        mm[k].name = m->id;
        mm[k].m = &m->metrics;
        g->loaded = m->state == SLOT_LOADED || m->state == SLOT_EVICTING;
        g->waiting = pt_models_n_waiting(m);
        if (m->sched) {
            int waiting;
            pt_sched_load(m->sched, &waiting, &g->running, &g->kv_used);
            g->waiting += waiting;
            g->kv_cached = pt_sched_cached_pages(m->sched);
        }
        if (m->e) g->kv_blocks = m->e->kv.cfg.n_pages;
    }
    size_t n = 0;
    char *text = pt_metrics_render(mm, s->n_slots, &n);
    free(mm);
    if (!text) {
        pt_http_error(c, 500, NULL, "out_of_memory", NULL, "cannot render the metrics");
        return;
    }
    pt_http_reply(c, 200, "text/plain; version=0.0.4; charset=utf-8", NULL, text, n);
    free(text);
}
