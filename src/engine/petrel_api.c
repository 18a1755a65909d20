/*
 * petrel_api.c - the public API (include/petrel/petrel.h) over the engine
 * and the scheduler.  It is also the one source of libpetrel.so: the
 * linker pulls the layers it needs from their archives, and only what the
 * header marks PETREL_API is exported (the rest is built hidden).
 *
 * Ownership: a petrel_model owns its engine.  While a scheduler is started
 * on it, the scheduler's thread owns the engine (scheduler.h), so
 * petrel_generate refuses to run then; the model remembers its scheduler
 * for that check.  Each submitted request has a small record (its
 * callbacks and streaming detokenizer) that the scheduler thread frees
 * after on_done.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include "engine/engine.h"
#include "engine/gen_limits.h"
#include "engine/scheduler.h"
#include "petrel/petrel.h"

#ifndef PETREL_VERSION
#define PETREL_VERSION "0.0.0"
#endif

struct petrel_model {
    pt_engine *e;
    _Atomic(petrel_scheduler *) sched; /* the scheduler started on it, or NULL */
};

struct petrel_scheduler {
    petrel_model *m;
    pt_sched *s;
};

const char *petrel_version(void) {
    return PETREL_VERSION; /* CMakeLists.txt's project() version */
}

static void copy_err(char *dst, size_t cap, const char *msg) {
    if (dst && cap) snprintf(dst, cap, "%s", msg);
}

petrel_model *petrel_open(const char *path, const petrel_open_opts *opts, char *err,
                          size_t err_cap) {
    if (!path) {
        copy_err(err, err_cap, "petrel_open: no model path");
        return NULL;
    }
    pt_engine_opts o = {.model_path = path, .kv_dtype = PT_F16, .kernels = "auto"};
    if (opts) {
        o.n_threads = opts->n_threads;
        o.n_ctx = opts->n_ctx;
        o.device = opts->device;
    }
    pt_err e = {{0}};
    petrel_model *m = pt_xcalloc(1, sizeof *m);
    if (pt_engine_open(&m->e, &o, &e)) {
        copy_err(err, err_cap, e.msg);
        free(m);
        return NULL;
    }
    return m;
}

void petrel_close(petrel_model *m) {
    if (!m) return;
    pt_engine_close(m->e);
    free(m);
}

petrel_params petrel_default_params(void) {
    petrel_params p = {.max_tokens = 128, .temperature = 0.8f, .top_k = 40, .top_p = 0.95f,
                       .min_p = 0.05f, .repetition_penalty = 1, .add_bos = 1};
    return p;
}

/* ---- tokens ------------------------------------------------------------------- */

int petrel_n_vocab(const petrel_model *m) {
    return m->e->tok ? pt_tokenizer_n_vocab(m->e->tok) : m->e->model->cfg.vocab_size;
}

int petrel_n_ctx(const petrel_model *m) {
    return m->e->n_ctx;
}

int32_t petrel_token_eos(const petrel_model *m) {
    return m->e->tok ? pt_tokenizer_eos(m->e->tok) : -1;
}

int petrel_tokenize(const petrel_model *m, const char *text, size_t len, int add_bos,
                    int32_t *ids, int cap, char *err, size_t err_cap) {
    if (!m->e->tok) {
        copy_err(err, err_cap, "this model has no tokenizer (dummy weights)");
        return -1;
    }
    int32_t *all;
    size_t n;
    pt_err e = {{0}};
    if (pt_tokenize(m->e->tok, text, len, add_bos != 0, false, &all, &n, &e)) {
        copy_err(err, err_cap, e.msg);
        return -1;
    }
    if (n > (size_t)INT32_MAX) {
        free(all);
        copy_err(err, err_cap, "the text has more than 2^31 tokens");
        return -1;
    }
    if (ids && cap > 0) memcpy(ids, all, sizeof *all * PT_MIN(n, (size_t)cap));
    free(all);
    return (int)n;
}

const char *petrel_token_text(const petrel_model *m, int32_t id, size_t *len) {
    if (!m->e->tok || id < 0 || id >= pt_tokenizer_n_vocab(m->e->tok)) return NULL;
    return pt_token_bytes(m->e->tok, id, len);
}

/* ---- parameters -------------------------------------------------------------------- */

/* The generation parameters, checked against the ranges `petrel generate`
 * and the server enforce (gen_limits.h). */
static int gen_params(const petrel_params *p, pt_gen_params *gp, pt_err *e) {
    memset(gp, 0, sizeof *gp);
    gp->max_tokens = p->max_tokens;
    gp->sampling = pt_sampling_default();
    gp->sampling.temperature = p->temperature;
    gp->sampling.top_k = p->top_k;
    gp->sampling.top_p = p->top_p;
    gp->sampling.min_p = p->min_p;
    gp->sampling.repetition_penalty = p->repetition_penalty;
    gp->sampling.frequency_penalty = p->frequency_penalty;
    gp->sampling.presence_penalty = p->presence_penalty;
    gp->sampling.seed = p->seed;
    gp->sampling.n_logprobs = -1;
    return pt_gen_params_check(gp, e);
}

/* The prompt's ids (malloc'd), or -1 with err set. */
static int prompt_ids(petrel_model *m, const char *prompt, const petrel_params *p, int32_t **ids,
                      size_t *n, pt_err *e) {
    if (!m->e->tok) return pt_fail(e, "this model has no tokenizer (dummy weights)");
    if (!prompt) return pt_fail(e, "no prompt");
    return pt_tokenize(m->e->tok, prompt, strlen(prompt), p->add_bos, false, ids, n, e);
}

/* ---- one generation ----------------------------------------------------------------- */

typedef struct relay {
    petrel_text_cb cb;
    void *user;
} relay;

static int relay_text(void *user, const pt_sample_result *r, const char *text, size_t len) {
    relay *rl = user;
    (void)r;
    return len && rl->cb ? rl->cb(rl->user, text, len) : 0;
}

int petrel_generate(petrel_model *m, const char *prompt, const petrel_params *p,
                    petrel_text_cb cb, void *user, petrel_stats *stats, char *err,
                    size_t err_cap) {
    pt_err e = {{0}};
    if (atomic_load(&m->sched)) {
        copy_err(err, err_cap,
                 "a scheduler is running on this model: use petrel_submit, or stop it first");
        return -1;
    }
    pt_gen_params gp;
    int32_t *ids;
    size_t n;
    if (gen_params(p, &gp, &e) || prompt_ids(m, prompt, p, &ids, &n, &e)) {
        copy_err(err, err_cap, e.msg);
        return -1;
    }
    relay rl = {cb, user};
    pt_gen_stats st;
    int rc = pt_generate(m->e, ids, (int)n, &gp, relay_text, &rl, &st, &e);
    free(ids);
    if (rc) {
        copy_err(err, err_cap, e.msg);
        return -1;
    }
    if (stats) {
        *stats = (petrel_stats){.prompt_tokens = st.n_prompt,
                                .completion_tokens = st.n_generated,
                                .prefill_seconds = st.t_prefill,
                                .decode_seconds = st.t_decode,
                                .stopped_at_eos = st.finish == PT_FINISH_STOP,
                                .cancelled = st.finish == PT_FINISH_CANCEL};
    }
    return 0;
}

/* ---- many requests: the scheduler ----------------------------------------------------- */

/* One submitted request; the scheduler thread owns it after submit. */
typedef struct api_req {
    petrel_text_cb on_text;
    petrel_done_cb on_done;
    void *user;
    const pt_tokenizer *tok;
    pt_detok dt;
    bool stopped; /* on_text asked to stop */
} api_req;

static int req_token(void *user, const pt_sample_result *r) {
    api_req *q = user;
    size_t plen = 0;
    if (r->id >= pt_tokenizer_n_vocab(q->tok)) return 0;
    pt_token_bytes(q->tok, r->id, &plen);
    char stack[1024];
    size_t cap = plen + 72;
    char *buf = cap <= sizeof stack ? stack : pt_xmalloc(cap);
    size_t len = pt_detok_push(&q->dt, r->id, buf, cap);
    if (len && q->on_text && q->on_text(q->user, buf, len)) q->stopped = true;
    if (buf != stack) free(buf);
    return q->stopped;
}

static void req_done(void *user, const pt_sched_stats *st) {
    api_req *q = user;
    if (st->finish == PT_FINISH_LENGTH || st->finish == PT_FINISH_STOP) {
        char tail[80];
        size_t len = pt_detok_flush(&q->dt, tail, sizeof tail);
        if (len && q->on_text && !q->stopped) q->on_text(q->user, tail, len);
    }
    petrel_stats ps = {.prompt_tokens = st->n_prompt,
                       .completion_tokens = st->n_generated,
                       .prefill_seconds = st->t_prefill,
                       .decode_seconds = st->t_decode,
                       .stopped_at_eos = st->finish == PT_FINISH_STOP,
                       .cancelled = st->finish == PT_FINISH_CANCEL};
    if (q->on_done) q->on_done(q->user, &ps, st->finish == PT_FINISH_NONE ? st->error : NULL);
    free(q);
}

/* Without a budget the pool holds n_ctx positions; max_parallel sequences
 * that may each reach the full context need that many times more (what
 * `petrel serve` sizes too). */
static int size_pool(pt_engine *e, int parallel, pt_err *err) {
    if (e->kv_budgeted) return 0;
    int need = pt_sched_pages_for(e, e->n_ctx) * parallel;
    if (e->kv.cfg.n_pages >= need) return 0;
    return pt_engine_kv_init(e, need * e->kv.cfg.page_size, err);
}

petrel_scheduler *petrel_scheduler_start(petrel_model *m, int max_parallel, char *err,
                                         size_t err_cap) {
    pt_err e = {{0}};
    if (atomic_load(&m->sched)) {
        copy_err(err, err_cap, "a scheduler is already running on this model");
        return NULL;
    }
    if (!m->e->tok) {
        copy_err(err, err_cap, "this model has no tokenizer (dummy weights)");
        return NULL;
    }
    if (max_parallel < 1 || max_parallel > m->e->model->max_batch) {
        snprintf(e.msg, sizeof e.msg, "max_parallel %d: it must be 1..%d (the batch size)",
                 max_parallel, m->e->model->max_batch);
        copy_err(err, err_cap, e.msg);
        return NULL;
    }
    petrel_scheduler *s = pt_xcalloc(1, sizeof *s);
    s->m = m;
    pt_sched_opts so = {.max_seqs = max_parallel, .n_ctx = m->e->n_ctx};
    if (size_pool(m->e, max_parallel, &e) || pt_sched_start(&s->s, m->e, &so, &e)) {
        copy_err(err, err_cap, e.msg);
        free(s);
        return NULL;
    }
    atomic_store(&m->sched, s);
    return s;
}

uint64_t petrel_submit(petrel_scheduler *s, const char *prompt, const petrel_params *p,
                       petrel_text_cb on_text, petrel_done_cb on_done, void *user, char *err,
                       size_t err_cap) {
    pt_err e = {{0}};
    pt_gen_params gp;
    int32_t *ids;
    size_t n;
    if (gen_params(p, &gp, &e) || prompt_ids(s->m, prompt, p, &ids, &n, &e)) {
        copy_err(err, err_cap, e.msg);
        return 0;
    }
    api_req *q = pt_xcalloc(1, sizeof *q);
    q->on_text = on_text;
    q->on_done = on_done;
    q->user = user;
    q->tok = s->m->e->tok;
    pt_detok_init(&q->dt, q->tok);
    pt_sched_job job = {.prompt = ids,
                        .n_prompt = (int)n,
                        .params = gp,
                        .on_token = req_token,
                        .on_done = req_done,
                        .user = q};
    uint64_t id = pt_sched_submit(s->s, &job, &e); /* copies the prompt */
    free(ids);
    if (!id) {
        free(q); /* refused: no callback will run */
        copy_err(err, err_cap, e.msg);
    }
    return id;
}

void petrel_cancel(petrel_scheduler *s, uint64_t id) {
    pt_sched_cancel(s->s, id);
}

void petrel_scheduler_stop(petrel_scheduler *s) {
    if (!s) return;
    pt_sched_stop(s->s); /* cancels what is left; every on_done has run */
    atomic_store(&s->m->sched, NULL);
    free(s);
}
