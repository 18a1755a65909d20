/*
 * scheduler.c - the scheduler thread: a FIFO of waiting jobs, a list of
 * running sequences, and one batched forward per step (see scheduler.h).
 *
 * Locking: s->mu guards the queue, the running list's membership, the
 * reserved-page count and the cancelled flags.  Everything else about a
 * running job (its pt_seq, counters, timings) belongs to the scheduler
 * thread alone.  Callbacks are always called without the lock held, so they
 * may call pt_sched_cancel or pt_sched_submit.
 */
#include "engine/scheduler.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct job {
    struct job *next; /* queue link */
    uint64_t id;
    pt_sched_job d;
    int32_t *prompt; /* our copies */
    int32_t *bias_ids;
    float *bias_vals;
    int max_new;    /* generated tokens at most, clamped to the context */
    int pages;      /* pages reserved against the pool while running */
    bool cancelled; /* under s->mu */

    /* scheduler thread only */
    bool started;  /* seq initialized and the prompt pushed */
    bool finished; /* on_done delivered, to be swept from the running list */
    pt_seq seq;
    int n_fed; /* tokens of seq already run through the model */
    int n_generated;
    double t_submit, t_admit, t_first, t_last;
} job;

struct pt_sched {
    pt_engine *e;
    pt_sched_opts o;
    int max_rows; /* rows of one forward */
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;

    /* under mu */
    job *q_head, *q_tail;
    int n_waiting;
    job **run; /* [max_seqs], in admission order */
    int n_run;
    int pages_reserved;
    int n_finished; /* jobs in run[] that finished but are not swept yet */
    uint64_t next_id;
    bool quit;
    bool cancel_all;

    /* batch scratch, scheduler thread only */
    int32_t *b_tok, *b_pos, *b_seq;
    bool *b_want;
    pt_kv_seq **b_kv; /* [max_seqs] */
    job **b_job;      /* [max_seqs] job of each sequence slot */
    int *b_rows;      /* [max_seqs] rows each slot contributed */
    job **w_job;      /* [max_seqs] job of each wanted logits row */
    float *logits;    /* [max_seqs][vocab] */
};

int pt_sched_pages_for(const pt_engine *e, int n_positions) {
    int ps = e->kv.cfg.page_size;
    return (n_positions + ps - 1) / ps;
}

/* ---- finishing ------------------------------------------------------------ */

static void free_job(job *j) {
    free(j->prompt);
    free(j->bias_ids);
    free(j->bias_vals);
    free(j);
}

/* Reports the end of a job and gives its pages back.  The job stays in the
 * running list (marked finished) until sweep() removes it, so the list can
 * be walked while jobs finish. */
static void finish(pt_sched *s, job *j, int reason, const char *error) {
    pt_sched_stats st = {0};
    st.n_prompt = j->d.n_prompt;
    st.n_generated = j->n_generated;
    st.finish = reason;
    if (j->t_admit > 0)
        st.t_queue = j->t_admit - j->t_submit;
    else
        st.t_queue = pt_now() - j->t_submit;
    if (j->n_generated > 0) {
        st.ttft = j->t_first - j->t_submit;
        st.t_prefill = j->t_first - j->t_admit;
        st.t_decode = j->t_last - j->t_first;
    }
    if (error) snprintf(st.error, sizeof st.error, "%s", error);
    if (j->started) pt_seq_free(&j->seq, s->e);
    /* Account before telling the caller, so that whoever on_done wakes sees
     * the pages back in the budget and the job no longer running. */
    pthread_mutex_lock(&s->mu);
    if (j->t_admit > 0) { /* in the running list, not dropped from the queue */
        s->pages_reserved -= j->pages;
        s->n_finished++;
    }
    j->pages = 0;
    j->finished = true;
    pthread_mutex_unlock(&s->mu);
    if (j->d.on_done) j->d.on_done(j->d.user, &st);
}

/* Removes finished jobs from the running list, keeping admission order. */
static void sweep(pt_sched *s) {
    pthread_mutex_lock(&s->mu);
    int k = 0;
    for (int i = 0; i < s->n_run; i++) {
        job *j = s->run[i];
        if (j->finished) {
            s->n_finished--;
            free_job(j);
        } else {
            s->run[k++] = j;
        }
    }
    s->n_run = k;
    pthread_mutex_unlock(&s->mu);
}

/* ---- admission ------------------------------------------------------------ */

/* Under mu: moves queued jobs into the running list while there is room,
 * and unlinks cancelled queued jobs onto *dropped. */
static void admit(pt_sched *s, job **dropped) {
    int pool = s->e->kv.cfg.n_pages;
    while (s->q_head) {
        job *j = s->q_head;
        bool drop = j->cancelled || s->cancel_all || s->quit;
        if (!drop && (s->n_run == s->o.max_seqs || s->pages_reserved + j->pages > pool)) break;
        s->q_head = j->next;
        if (!s->q_head) s->q_tail = NULL;
        s->n_waiting--;
        if (drop) {
            j->next = *dropped;
            *dropped = j;
            continue;
        }
        j->next = NULL;
        j->t_admit = pt_now();
        s->pages_reserved += j->pages;
        s->run[s->n_run++] = j;
    }
}

/* One pass under the lock: admit, and note which running jobs to cancel.
 * Returns false when the thread should exit. */
static bool plan_step(pt_sched *s, job **dropped, bool *cancel) {
    pthread_mutex_lock(&s->mu);
    while (!s->quit && !s->cancel_all && s->n_run == 0 && !s->q_head)
        pthread_cond_wait(&s->cv, &s->mu);
    admit(s, dropped);
    for (int i = 0; i < s->n_run; i++)
        cancel[i] = s->run[i]->cancelled || s->cancel_all || s->quit;
    s->cancel_all = false;
    bool go_on = !(s->quit && s->q_head == NULL);
    pthread_mutex_unlock(&s->mu);
    return go_on;
}

/* ---- one step --------------------------------------------------------------- */

static void start_job(pt_sched *s, job *j) {
    pt_seq_init(&j->seq, s->e, &j->d.params.sampling);
    if (j->d.n_bias) pt_sampler_set_bias(j->seq.sampler, j->bias_ids, j->bias_vals, j->d.n_bias);
    for (int i = 0; i < j->d.n_prompt; i++)
        pt_seq_push(&j->seq, j->prompt[i]);
    j->seq.n_prompt = j->d.n_prompt;
    j->started = true;
}

/* Adds up to max rows of j's unfed tokens to the batch.  Returns the rows
 * added. */
static int add_rows(pt_sched *s, job *j, int *n_rows, int *n_slots, int *n_want, int max) {
    int unfed = j->seq.n_tokens - j->n_fed;
    int k = PT_MIN(unfed, max);
    if (k <= 0) return 0;
    int slot = (*n_slots)++;
    s->b_kv[slot] = &j->seq.kv;
    s->b_job[slot] = j;
    s->b_rows[slot] = k;
    for (int i = 0; i < k; i++) {
        int t = j->n_fed + i, r = (*n_rows)++;
        s->b_tok[r] = j->seq.tokens[t];
        s->b_pos[r] = t;
        s->b_seq[r] = slot;
        s->b_want[r] = t == j->seq.n_tokens - 1;
        if (s->b_want[r]) s->w_job[(*n_want)++] = j;
    }
    return k;
}

/* A token came out for j: report it and decide whether j goes on. */
static void on_sampled(pt_sched *s, job *j, const pt_sample_result *r) {
    double now = pt_now();
    if (j->n_generated++ == 0) j->t_first = now;
    j->t_last = now;
    const pt_tokenizer *tok = s->e->tok;
    if (tok && !j->d.params.ignore_eos && r->id < pt_tokenizer_n_vocab(tok) &&
        pt_tokenizer_is_eog(tok, r->id)) {
        finish(s, j, PT_FINISH_STOP, NULL);
        return;
    }
    if (j->d.on_token && j->d.on_token(j->d.user, r)) {
        finish(s, j, PT_FINISH_STOP, NULL);
        return;
    }
    if (j->n_generated >= j->max_new) {
        finish(s, j, PT_FINISH_LENGTH, NULL);
        return;
    }
    pt_seq_push(&j->seq, r->id); /* fed in the next step */
}

/* Reserves the pages the batch will write, failing only the job whose
 * reservation fails (which the admission budget should make impossible). */
static void reserve(pt_sched *s, int n_slots) {
    pt_err err = {{0}};
    for (int i = 0; i < n_slots; i++) {
        job *j = s->b_job[i];
        if (pt_kv_seq_reserve(&s->e->kv, &j->seq.kv, j->n_fed + s->b_rows[i], &err))
            finish(s, j, PT_FINISH_NONE, err.msg);
    }
}

static void run_batch(pt_sched *s) {
    int n_rows = 0, n_slots = 0, n_want = 0;
    int rows_left = s->max_rows;
    /* running sequences first: one row each keeps every stream moving */
    for (int i = 0; i < s->n_run && rows_left > 0; i++) {
        job *j = s->run[i];
        if (!j->finished && j->started && j->n_fed >= j->d.n_prompt)
            rows_left -= add_rows(s, j, &n_rows, &n_slots, &n_want, 1);
    }
    /* then prompt chunks, oldest first, within the prefill budget */
    int prefill_left = PT_MIN(rows_left, s->o.max_prefill);
    for (int i = 0; i < s->n_run && prefill_left > 0; i++) {
        job *j = s->run[i];
        if (j->finished) continue;
        if (!j->started) start_job(s, j);
        if (j->n_fed < j->d.n_prompt)
            prefill_left -= add_rows(s, j, &n_rows, &n_slots, &n_want, prefill_left);
    }
    if (n_rows == 0) return;
    reserve(s, n_slots);
    for (int i = 0; i < n_slots; i++)
        if (s->b_job[i]->finished) return; /* reservation failed: replan */

    pt_batch b = {n_rows, s->b_tok, s->b_pos, s->b_seq, s->b_want, n_slots, s->b_kv};
    pt_err err = {{0}};
    if (pt_model_forward(s->e->model, &s->e->kv, &b, s->logits, &err)) {
        pt_warn("scheduler: forward failed: %s", err.msg);
        for (int i = 0; i < n_slots; i++)
            finish(s, s->b_job[i], PT_FINISH_NONE, err.msg);
        return;
    }
    for (int i = 0; i < n_slots; i++)
        s->b_job[i]->n_fed += s->b_rows[i];
    size_t vocab = (size_t)s->e->model->cfg.vocab_size;
    for (int w = 0; w < n_want; w++) {
        job *j = s->w_job[w];
        pt_sample_result r;
        pt_sampler_sample(j->seq.sampler, s->logits + (size_t)w * vocab, &r);
        on_sampled(s, j, &r);
    }
}

static void *sched_main(void *arg) {
    pt_sched *s = arg;
    bool *cancel = pt_xcalloc((size_t)s->o.max_seqs, sizeof(bool));
    for (;;) {
        job *dropped = NULL;
        bool go_on = plan_step(s, &dropped, cancel);
        while (dropped) {
            job *j = dropped;
            dropped = j->next;
            finish(s, j, PT_FINISH_CANCEL, NULL);
            free_job(j);
        }
        for (int i = 0; i < s->n_run; i++)
            if (cancel[i] && !s->run[i]->finished) finish(s, s->run[i], PT_FINISH_CANCEL, NULL);
        sweep(s);
        if (!go_on && s->n_run == 0) break;
        run_batch(s);
        sweep(s);
    }
    free(cancel);
    return NULL;
}

/* ---- the public side -------------------------------------------------------- */

int pt_sched_start(pt_sched **out, pt_engine *e, const pt_sched_opts *o, pt_err *err) {
    *out = NULL;
    pt_sched *s = pt_xcalloc(1, sizeof *s);
    s->e = e;
    s->o = *o;
    s->max_rows = e->model->max_batch;
    if (s->o.max_seqs <= 0) s->o.max_seqs = 8;
    if (s->o.max_seqs > s->max_rows) s->o.max_seqs = s->max_rows;
    if (s->o.n_ctx <= 0) s->o.n_ctx = e->n_ctx;
    if (s->o.max_prefill <= 0) s->o.max_prefill = s->max_rows;
    if (s->o.max_queue <= 0) s->o.max_queue = 4096;
    int ms = s->o.max_seqs;
    s->run = pt_xcalloc((size_t)ms, sizeof *s->run);
    s->b_tok = pt_xmalloc(sizeof(int32_t) * (size_t)s->max_rows);
    s->b_pos = pt_xmalloc(sizeof(int32_t) * (size_t)s->max_rows);
    s->b_seq = pt_xmalloc(sizeof(int32_t) * (size_t)s->max_rows);
    s->b_want = pt_xmalloc(sizeof(bool) * (size_t)s->max_rows);
    s->b_kv = pt_xcalloc((size_t)ms, sizeof *s->b_kv);
    s->b_job = pt_xcalloc((size_t)ms, sizeof *s->b_job);
    s->b_rows = pt_xcalloc((size_t)ms, sizeof *s->b_rows);
    s->w_job = pt_xcalloc((size_t)ms, sizeof *s->w_job);
    s->logits = pt_xmalloc(sizeof(float) * (size_t)ms * (size_t)e->model->cfg.vocab_size);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    if (pthread_create(&s->thread, NULL, sched_main, s)) {
        pthread_mutex_destroy(&s->mu);
        pthread_cond_destroy(&s->cv);
        free(s->run);
        free(s->b_tok), free(s->b_pos), free(s->b_seq), free(s->b_want);
        free(s->b_kv), free(s->b_job), free(s->b_rows), free(s->w_job), free(s->logits);
        free(s);
        return pt_fail(err, "cannot start the scheduler thread");
    }
    *out = s;
    return 0;
}

uint64_t pt_sched_submit(pt_sched *s, const pt_sched_job *d, pt_err *err) {
    int n_ctx = s->o.n_ctx, vocab = s->e->model->cfg.vocab_size;
    if (d->n_prompt <= 0) {
        pt_fail(err, "empty prompt");
        return 0;
    }
    if (d->n_prompt >= n_ctx) {
        pt_fail(err, "prompt of %d tokens does not fit the context of %d", d->n_prompt, n_ctx);
        return 0;
    }
    for (int i = 0; i < d->n_prompt; i++)
        if (d->prompt[i] < 0 || d->prompt[i] >= vocab) {
            pt_fail(err, "token id %d out of range (vocabulary %d)", d->prompt[i], vocab);
            return 0;
        }
    job *j = pt_xcalloc(1, sizeof *j);
    j->d = *d;
    j->prompt = pt_xmalloc(sizeof(int32_t) * (size_t)d->n_prompt);
    memcpy(j->prompt, d->prompt, sizeof(int32_t) * (size_t)d->n_prompt);
    j->d.prompt = j->prompt;
    if (d->n_bias > 0) {
        j->bias_ids = pt_xmalloc(sizeof(int32_t) * (size_t)d->n_bias);
        j->bias_vals = pt_xmalloc(sizeof(float) * (size_t)d->n_bias);
        memcpy(j->bias_ids, d->bias_ids, sizeof(int32_t) * (size_t)d->n_bias);
        memcpy(j->bias_vals, d->bias_vals, sizeof(float) * (size_t)d->n_bias);
    }
    j->d.bias_ids = j->bias_ids;
    j->d.bias_vals = j->bias_vals;
    int room = n_ctx - d->n_prompt;
    j->max_new = d->params.max_tokens > 0 ? PT_MIN(d->params.max_tokens, room) : room;
    j->pages = pt_sched_pages_for(s->e, d->n_prompt + j->max_new);
    if (j->pages > s->e->kv.cfg.n_pages) {
        pt_fail(err, "a sequence of %d positions needs %d KV pages; the pool has %d",
                d->n_prompt + j->max_new, j->pages, s->e->kv.cfg.n_pages);
        free_job(j);
        return 0;
    }
    j->t_submit = pt_now();
    pthread_mutex_lock(&s->mu);
    const char *refuse = s->quit                          ? "the server is shutting down"
                         : s->n_waiting >= s->o.max_queue ? "too many requests are waiting"
                                                          : NULL;
    if (refuse) {
        pthread_mutex_unlock(&s->mu);
        free_job(j);
        pt_fail(err, "%s", refuse);
        return 0;
    }
    j->id = ++s->next_id;
    if (s->q_tail)
        s->q_tail->next = j;
    else
        s->q_head = j;
    s->q_tail = j;
    s->n_waiting++;
    uint64_t id = j->id;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return id;
}

void pt_sched_cancel(pt_sched *s, uint64_t id) {
    pthread_mutex_lock(&s->mu);
    bool found = false;
    for (job *j = s->q_head; j && !found; j = j->next)
        if (j->id == id) j->cancelled = found = true;
    for (int i = 0; i < s->n_run && !found; i++)
        if (s->run[i]->id == id) s->run[i]->cancelled = found = true;
    if (found) pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

void pt_sched_cancel_all(pt_sched *s) {
    pthread_mutex_lock(&s->mu);
    s->cancel_all = true;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

void pt_sched_load(pt_sched *s, int *n_waiting, int *n_running, int *pages_reserved) {
    pthread_mutex_lock(&s->mu);
    if (n_waiting) *n_waiting = s->n_waiting;
    if (n_running) *n_running = s->n_run - s->n_finished;
    if (pages_reserved) *pages_reserved = s->pages_reserved;
    pthread_mutex_unlock(&s->mu);
}

void pt_sched_stop(pt_sched *s) {
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    s->quit = true;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s->run);
    free(s->b_tok), free(s->b_pos), free(s->b_seq), free(s->b_want);
    free(s->b_kv), free(s->b_job), free(s->b_rows), free(s->w_job), free(s->logits);
    free(s);
}
