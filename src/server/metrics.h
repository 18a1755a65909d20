/*
 * metrics.h - what `petrel serve` counts for GET /metrics (Prometheus text
 * format, docs/server.md "Metrics"): finished requests by reason, prompt and
 * generated tokens, prefix-cache and speculative-decoding totals, and the
 * TTFT / inter-token / end-to-end latency histograms.  Gauges (requests
 * running and waiting, KV blocks) are read from the scheduler when scraped.
 *
 * Threads: pt_metrics_token runs on the scheduler thread (it times each
 * token as it is sampled), the rest on the event loop; one mutex guards the
 * counters, held only for a few additions.  Counters only grow.
 */
#ifndef PETREL_SERVER_METRICS_H
#define PETREL_SERVER_METRICS_H

#include <pthread.h>
#include <stdint.h>

#include "engine/core.h"

#define PT_HIST_MAX 32 /* bucket bounds per histogram, at most */

typedef struct pt_hist {
    const double *le; /* upper bounds, ascending; +Inf is implied */
    int n_le;
    uint64_t count[PT_HIST_MAX + 1]; /* per bucket, not cumulative; [n_le] is +Inf */
    uint64_t n;
    double sum;
} pt_hist;

/* Finished requests, by the reason vLLM names. */
enum { PT_MR_STOP, PT_MR_LENGTH, PT_MR_ABORT, PT_MR_ERROR, PT_MR_N };

typedef struct pt_metrics {
    pthread_mutex_t mu;
    uint64_t finished[PT_MR_N];
    uint64_t prompt_tokens, generation_tokens;
    uint64_t prefix_queries, prefix_hits; /* prompt tokens looked up / found cached */
    uint64_t drafted, accepted;           /* speculative tokens */
    uint64_t preemptions;
    uint64_t loads; /* times the model was loaded (the pool) */
    pt_hist ttft, itl, e2e, queue;
} pt_metrics;

/* One request's clock, kept in the request. */
typedef struct pt_req_clock {
    double t_arrival; /* the request was parsed */
    double t_last;    /* the last token was sampled; 0 before the first */
} pt_req_clock;

void pt_metrics_init(pt_metrics *m);
void pt_metrics_free(pt_metrics *m);

/* A request arrived (event loop). */
void pt_metrics_arrival(pt_req_clock *c);
/* A token was sampled for it (scheduler thread): one inter-token interval
 * from the second token on. */
void pt_metrics_token(pt_metrics *m, pt_req_clock *c);
/* Its job ended with these stats (event loop; the stats as the client sees
 * them, after stop strings).  With n > 1 each choice is a job: generated
 * tokens count for every one, the request itself (finish reason, prompt
 * and cached tokens, latencies) for the first only, as usage does. */
void pt_metrics_done(pt_metrics *m, const pt_req_clock *c, const pt_sched_stats *st, bool first);

/* The gauges a scrape reads besides the counters. */
typedef struct pt_metrics_gauges {
    int running, waiting;
    int kv_blocks, kv_used, kv_cached; /* pages in the pool, held by requests, free but cached */
    int loaded;                        /* 1: the model is loaded */
} pt_metrics_gauges;

/* One model's part of a scrape. */
typedef struct pt_metrics_model {
    const char *name;
    pt_metrics *m;
    pt_metrics_gauges g;
} pt_metrics_model;

/* The exposition text: each family once, with a series per model labelled
 * model_name="name"; malloc'd, its length in *len; NULL if out of memory. */
char *pt_metrics_render(const pt_metrics_model *models, int n, size_t *len);

#endif
