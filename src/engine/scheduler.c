/*
 * scheduler.c - the scheduler thread: a queue of submitted jobs and
 * cancellations in front of the engine core (see scheduler.h).
 *
 * Locking: s->mu guards the pending queue, the cancel list, the flags and
 * the published counts.  The core belongs to the scheduler thread alone.
 * Callbacks run on the scheduler thread without the lock held, so they may
 * call pt_sched_cancel or pt_sched_submit.
 */
#include "engine/scheduler.h"

#include <pthread.h>
#include <stdlib.h>

typedef struct pending {
    struct pending *next;
    uint64_t id;
    pt_sched_job d; /* prompt and bias point into our copies below */
    int32_t *prompt, *bias_ids, *prediction, *oracle;
    float *bias_vals;
} pending;

/* Stands between the core and a job's on_done: publishes the counts first,
 * so whoever on_done wakes sees the job gone and its pages back. */
typedef struct done_hook {
    pt_sched *s;
    pt_sched_done_fn on_done;
    pt_sched_token_fn on_token;
    void *user;
} done_hook;

struct pt_sched {
    pt_engine *e;
    pt_core *core; /* scheduler thread only */
    int max_queue;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;

    /* under mu */
    pending *q_head, *q_tail;
    int n_pending;
    uint64_t *cancels;
    int n_cancels, cap_cancels;
    uint64_t next_id;
    bool quit, cancel_all;
    int hold; /* pt_sched_opts.hold until the first step, then 0 */
    int n_waiting, n_running, pages_held, pages_cached; /* published after each step */
};

int pt_sched_pages_for(const pt_engine *e, int n_positions) {
    int ps = e->kv.cfg.page_size;
    return (n_positions + ps - 1) / ps;
}

static void pending_free(pending *p) {
    free(p->prompt), free(p->bias_ids), free(p->bias_vals);
    free(p->prediction), free(p->oracle);
    free(p);
}

static void *dup_array(const void *src, size_t n, size_t size) {
    if (n == 0) return NULL;
    void *p = pt_xmalloc(n * size);
    memcpy(p, src, n * size);
    return p;
}

/* Under mu: opts.hold keeps the first step back until that many jobs are
 * queued; anything else that wants the thread (a cancel, a stop) lifts it. */
static bool held(const pt_sched *s) {
    return s->hold > 0 && s->n_pending < s->hold && !s->quit && !s->cancel_all && !s->n_cancels;
}

/* Waits for work, then takes the pending jobs and cancels.  Returns false
 * when the thread should exit (quit, and nothing left). */
static bool take_work(pt_sched *s, pending **jobs, uint64_t **cancels, int *n_cancels,
                      bool *cancel_all) {
    int live_w, live_r;
    pt_core_counts(s->core, &live_w, &live_r);
    pthread_mutex_lock(&s->mu);
    while (held(s) ||
           (!s->quit && !s->cancel_all && !s->q_head && !s->n_cancels && live_w + live_r == 0))
        pthread_cond_wait(&s->cv, &s->mu);
    s->hold = 0;
    *jobs = s->q_head;
    s->q_head = s->q_tail = NULL;
    s->n_pending = 0;
    *n_cancels = s->n_cancels;
    *cancels = dup_array(s->cancels, (size_t)s->n_cancels, sizeof(uint64_t));
    s->n_cancels = 0;
    *cancel_all = s->cancel_all || s->quit;
    s->cancel_all = false;
    bool go_on = !(s->quit && live_w + live_r == 0 && !*jobs);
    pthread_mutex_unlock(&s->mu);
    return go_on;
}

static void publish(pt_sched *s) {
    int w, r;
    pt_core_counts(s->core, &w, &r);
    int held = s->e->kv.cfg.n_pages - pt_kv_free_pages(&s->e->kv);
    int cached = s->e->kv.pool.n_cached;
    pthread_mutex_lock(&s->mu);
    s->pages_cached = cached;
    s->n_waiting = w;
    s->n_running = r;
    s->pages_held = held;
    pthread_mutex_unlock(&s->mu);
}

static int hook_token(void *user, const pt_sample_result *r) {
    done_hook *h = user;
    return h->on_token ? h->on_token(h->user, r) : 0;
}

static void hook_done(void *user, const pt_sched_stats *st) {
    done_hook *h = user;
    publish(h->s);
    if (h->on_done) h->on_done(h->user, st);
    free(h);
}

static void *sched_main(void *arg) {
    pt_sched *s = arg;
    for (;;) {
        pending *jobs;
        uint64_t *cancels;
        int n_cancels;
        bool cancel_all;
        bool go_on = take_work(s, &jobs, &cancels, &n_cancels, &cancel_all);
        while (jobs) {
            pending *p = jobs;
            jobs = p->next;
            pt_core_add(s->core, &p->d, p->id);
            pending_free(p);
        }
        for (int i = 0; i < n_cancels; i++) pt_core_cancel(s->core, cancels[i]);
        free(cancels);
        if (cancel_all) pt_core_cancel_all(s->core);
        if (!go_on) break;
        pt_core_step(s->core);
        publish(s);
    }
    return NULL;
}

/* ---- the public side -------------------------------------------------------- */

int pt_sched_start(pt_sched **out, pt_engine *e, const pt_sched_opts *o, pt_err *err) {
    *out = NULL;
    pt_sched *s = pt_xcalloc(1, sizeof *s);
    s->e = e;
    pt_core_opts co = {.max_seqs = o->max_seqs, .n_ctx = o->n_ctx, .max_prefill = o->max_prefill};
    s->core = pt_core_new(e, &co);
    s->max_queue = o->max_queue > 0 ? o->max_queue : 4096;
    s->hold = o->hold;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    if (pthread_create(&s->thread, NULL, sched_main, s)) {
        pthread_mutex_destroy(&s->mu);
        pthread_cond_destroy(&s->cv);
        pt_core_free(s->core);
        free(s);
        return pt_fail(err, "cannot start the scheduler thread");
    }
    *out = s;
    return 0;
}

int pt_sched_check(pt_sched *s, const pt_sched_job *job, pt_err *err) {
    return pt_core_check(s->core, job, err); /* reads only what never changes */
}

uint64_t pt_sched_submit(pt_sched *s, const pt_sched_job *d, pt_err *err) {
    if (pt_core_check(s->core, d, err)) return 0; /* reads only what never changes */
    pending *p = pt_xcalloc(1, sizeof *p);
    p->d = *d;
    p->prompt = dup_array(d->prompt, (size_t)d->n_prompt, sizeof(int32_t));
    p->bias_ids = dup_array(d->bias_ids, (size_t)PT_MAX(d->n_bias, 0), sizeof(int32_t));
    p->bias_vals = dup_array(d->bias_vals, (size_t)PT_MAX(d->n_bias, 0), sizeof(float));
    p->d.prompt = p->prompt, p->d.bias_ids = p->bias_ids, p->d.bias_vals = p->bias_vals;
    /* the drafters' sources too: the caller's arrays are gone when the job starts */
    p->prediction = dup_array(d->params.spec.prediction,
                              (size_t)PT_MAX(d->params.spec.n_prediction, 0), sizeof(int32_t));
    p->oracle = dup_array(d->params.spec.oracle, (size_t)PT_MAX(d->params.spec.n_oracle, 0),
                          sizeof(int32_t));
    p->d.params.spec.prediction = p->prediction, p->d.params.spec.oracle = p->oracle;
    done_hook *h = pt_xmalloc(sizeof *h);
    *h = (done_hook){s, d->on_done, d->on_token, d->user};
    p->d.on_done = hook_done, p->d.on_token = hook_token, p->d.user = h;
    pthread_mutex_lock(&s->mu);
    const char *refuse = s->quit ? "the server is shutting down"
                         : s->n_waiting + s->n_pending >= s->max_queue
                             ? "too many requests are waiting"
                             : NULL;
    if (refuse) {
        pthread_mutex_unlock(&s->mu);
        free(h);
        pending_free(p);
        pt_fail(err, "%s", refuse);
        return 0;
    }
    uint64_t id = p->id = ++s->next_id;
    if (s->q_tail)
        s->q_tail->next = p;
    else
        s->q_head = p;
    s->q_tail = p;
    s->n_pending++;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return id;
}

void pt_sched_cancel(pt_sched *s, uint64_t id) {
    pthread_mutex_lock(&s->mu);
    if (id > 0 && id <= s->next_id) {
        if (s->n_cancels == s->cap_cancels) {
            s->cap_cancels = s->cap_cancels ? 2 * s->cap_cancels : 16;
            s->cancels = pt_xrealloc(s->cancels, sizeof(uint64_t) * (size_t)s->cap_cancels);
        }
        s->cancels[s->n_cancels++] = id;
        pthread_cond_signal(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
}

void pt_sched_cancel_all(pt_sched *s) {
    pthread_mutex_lock(&s->mu);
    s->cancel_all = true;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

void pt_sched_load(pt_sched *s, int *n_waiting, int *n_running, int *pages_held) {
    pthread_mutex_lock(&s->mu);
    if (n_waiting) *n_waiting = s->n_waiting + s->n_pending;
    if (n_running) *n_running = s->n_running;
    if (pages_held) *pages_held = s->pages_held;
    pthread_mutex_unlock(&s->mu);
}

int pt_sched_cached_pages(pt_sched *s) {
    pthread_mutex_lock(&s->mu);
    int n = s->pages_cached;
    pthread_mutex_unlock(&s->mu);
    return n;
}

void pt_sched_stop(pt_sched *s) {
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    s->quit = true;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);
    pt_core_free(s->core);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s->cancels);
    free(s);
}
