/*
 * core.c - requests, the step, and the finish rules (see core.h).
 *
 * The core keeps two ordered lists of live requests: run[] (RUNNING, in
 * admission order) and wait[] (WAITING and PREEMPTED, in queue order, the
 * preempted at the front).  A step turns both into the policy's plain
 * numbers, asks for a plan, and applies it.
 */
#include "engine/core.h"

#include <stdio.h>
#include <stdlib.h>

#include "engine/draft.h"
#include "engine/runner.h"
#include "engine/sched_policy.h"

#define SPEC_MAX 16  /* drafts per step at most */
#define PAUSE_MAX 32 /* decode steps without drafts at most, after rejections */

typedef struct req {
    uint64_t id;
    int state; /* enum pt_req_state */
    pt_sched_job d;
    int32_t *prompt, *bias_ids; /* our copies */
    float *bias_vals;
    int max_new; /* generated tokens at most */
    bool started; /* seq initialized and the prompt pushed (at first admission) */
    pt_seq seq;
    int n_generated, n_preempted;
    int n_cached; /* prompt positions reused from the prefix cache at first admission */
    uint64_t *hashes; /* keys of the sequence's full pages, in order */
    int n_hashed, cap_hashes;
    int n_published; /* leading pages of its table that carry their key */
    int n_hit; /* hybrid models: leading prompt pages the pool held at admission,
                * with or without a state snapshot (the pause points below) */
    /* speculative decoding (d.params.spec) */
    int32_t *prediction, *oracle; /* our copies */
    int32_t draft[SPEC_MAX];
    int n_draft;   /* drafts proposed for this step */
    int n_in_seq;  /* of them, appended to seq.tokens for the runner */
    int k_cur;     /* adaptive draft length */
    int pause, pause_len; /* steps left without drafts, and the last pause's length */
    int n_drafted, n_accepted;
    bool jf;       /* this step's drafts are the grammar's forced tokens */
    int n_forced;  /* forced tokens emitted (jump-forward) */
    pt_rng rng;    /* the oracle's corruption */
    /* --spec draft: the draft model's copy of the sequence, in its own KV
     * pool; its tokens [0, d_real) are known to equal seq's */
    pt_seq dseq;
    bool d_started, d_broken; /* broken: its draft model failed; no more drafts */
    int d_real;
    int n_pre, k_want; /* drafts the draft model made for the coming step, of k_want */
    double t_submit, t_admit, t_first, t_last;
} req;

struct pt_core {
    pt_engine *e;
    pt_core_opts o;
    int max_rows;
    req **run, **wait;
    int n_run, n_wait, cap;
    /* step scratch */
    pt_policy_req *pr;
    int *run_idx, *wait_idx;
    req **idx_req; /* policy index -> request */
    int *cached_pages; /* policy index -> cached pages a waiting request starts with */
    pt_step_plan plan;
    pt_run_item *items;
    req **item_req;
    pt_runner runner;
    pt_core_timing timing;
    /* the model keeps recurrent state (hybrid): prefix reuse needs a state
     * snapshot where the reused pages end, and speculation rolls back
     * through a checkpoint of the state (kvcache.h) */
    bool recurrent;
    /* --spec draft: the draft model's runner and step scratch (NULL: none) */
    pt_engine *draft;
    pt_runner drunner;
    pt_run_item *ditems;
    req **dreq;
};

static int room_for(const pt_core *c);

/* ---- lists ----------------------------------------------------------------- */

static void grow(pt_core *c, int need) {
    if (need <= c->cap) return;
    c->cap = PT_MAX(need, 2 * c->cap);
    size_t n = (size_t)c->cap;
    c->run = pt_xrealloc(c->run, sizeof(req *) * n);
    c->wait = pt_xrealloc(c->wait, sizeof(req *) * n);
    c->pr = pt_xrealloc(c->pr, sizeof *c->pr * n);
    c->run_idx = pt_xrealloc(c->run_idx, sizeof(int) * n);
    c->wait_idx = pt_xrealloc(c->wait_idx, sizeof(int) * n);
    c->idx_req = pt_xrealloc(c->idx_req, sizeof(req *) * n);
    c->cached_pages = pt_xrealloc(c->cached_pages, sizeof(int) * n);
    c->plan.items = pt_xrealloc(c->plan.items, sizeof *c->plan.items * n);
    c->plan.preempt = pt_xrealloc(c->plan.preempt, sizeof(int) * n);
    c->plan.admit = pt_xrealloc(c->plan.admit, sizeof(int) * n);
    c->plan.order = pt_xrealloc(c->plan.order, sizeof(int) * n);
    c->plan.gone = pt_xrealloc(c->plan.gone, sizeof(bool) * n);
    c->items = pt_xrealloc(c->items, sizeof *c->items * n);
    c->item_req = pt_xrealloc(c->item_req, sizeof(req *) * n);
    c->ditems = pt_xrealloc(c->ditems, sizeof *c->ditems * n);
    c->dreq = pt_xrealloc(c->dreq, sizeof(req *) * n);
}

static void list_remove(req **list, int *n, const req *r) {
    for (int i = 0; i < *n; i++)
        if (list[i] == r) {
            memmove(list + i, list + i + 1, sizeof(req *) * (size_t)(*n - i - 1));
            (*n)--;
            return;
        }
}

/* Drops FINISHED requests from both lists and frees them. */
static void sweep(pt_core *c) {
    req **lists[2] = {c->run, c->wait};
    int *counts[2] = {&c->n_run, &c->n_wait};
    for (int l = 0; l < 2; l++) {
        int k = 0;
        for (int i = 0; i < *counts[l]; i++) {
            req *r = lists[l][i];
            if (r->state != PT_REQ_FINISHED) {
                lists[l][k++] = r;
                continue;
            }
            free(r->prompt), free(r->bias_ids), free(r->bias_vals);
            free(r->hashes);
            free(r->prediction), free(r->oracle);
            free(r);
        }
        *counts[l] = k;
    }
}

/* ---- transitions ----------------------------------------------------------- */

/* any -> FINISHED: gives the pages back, then reports. */
static void finish(pt_core *c, req *r, int reason, const char *error) {
    if (r->state == PT_REQ_FINISHED) return;
    pt_sched_stats st = {0};
    st.n_prompt = r->d.n_prompt;
    st.n_generated = r->n_generated;
    st.n_preempted = r->n_preempted;
    st.n_cached = r->n_cached;
    st.n_drafted = r->n_drafted;
    st.n_accepted = r->n_accepted;
    st.n_forced = r->n_forced;
    st.finish = reason;
    st.t_queue = (r->t_admit > 0 ? r->t_admit : pt_now()) - r->t_submit;
    if (r->n_generated > 0) {
        st.ttft = r->t_first - r->t_submit;
        st.t_prefill = r->t_first - r->t_admit;
        st.t_decode = r->t_last - r->t_first;
    }
    if (error) snprintf(st.error, sizeof st.error, "%s", error);
    if (r->started) pt_seq_free(&r->seq, c->e);
    if (r->d_started) pt_seq_free(&r->dseq, c->draft);
    r->started = r->d_started = false;
    r->state = PT_REQ_FINISHED;
    if (r->d.on_done) r->d.on_done(r->d.user, &st);
}

/* RUNNING -> PREEMPTED: pages back, tokens and sampler kept, to the front
 * of the queue. */
static void preempt(pt_core *c, req *r) {
    pt_kv_seq_truncate(&c->e->kv, &r->seq.kv, 0); /* its keyed pages stay cached */
    if (r->d_started) pt_kv_seq_truncate(&c->draft->kv, &r->dseq.kv, 0);
    r->n_published = 0;
    r->state = PT_REQ_PREEMPTED;
    r->n_preempted++;
    list_remove(c->run, &c->n_run, r);
    memmove(c->wait + 1, c->wait, sizeof(req *) * (size_t)c->n_wait);
    c->wait[0] = r;
    c->n_wait++;
}

/* ---- the prefix cache ---------------------------------------------------------- */

/* The key of r's full page b (the ones before it are known). */
static uint64_t page_key(pt_core *c, req *r, int b) {
    int ps = c->e->kv.cfg.page_size;
    if (b == r->cap_hashes) {
        r->cap_hashes = r->cap_hashes ? 2 * r->cap_hashes : 16;
        r->hashes = pt_xrealloc(r->hashes, sizeof(uint64_t) * (size_t)r->cap_hashes);
    }
    if (b == r->n_hashed) {
        const int32_t *toks = r->started ? r->seq.tokens : r->prompt;
        uint64_t parent = b ? r->hashes[b - 1] : 0;
        r->hashes[r->n_hashed++] = pt_block_hash(parent, toks + (size_t)b * ps, ps, c->e->cache_salt);
    }
    return r->hashes[b];
}

/* How many of r's leading full pages the pool holds (never the page of
 * its last token: at least one row is computed, so the step has logits),
 * and how many of those are free (reviving them takes from the free
 * count).  With sliding-window layers the run ends where the window
 * pages its last page needs are gone (pt_kv_prefix_window); with
 * recurrent layers, at the last page whose state was snapshotted
 * (pt_kv_prefix_state; r->n_hit keeps the run before that cut).  Looks
 * only; a request with pages of its own probes nothing. */
static int probe_prefix(pt_core *c, req *r, int *n_revive) {
    pt_kv_cache *kv = &c->e->kv;
    int n_tokens = r->started ? r->seq.n_tokens : r->d.n_prompt;
    int ps = kv->cfg.page_size, max_pages = (n_tokens - 1) / ps, b = 0;
    *n_revive = 0;
    if (!c->e->prefix_cache || (r->started && r->seq.kv.n_pages > 0)) return 0;
    for (; b < max_pages; b++) {
        uint64_t key = page_key(c, r, b);
        int32_t id = pt_block_lookup(&kv->pool, key);
        if (id < 0 && !(kv->disk && pt_disk_has(kv->disk, key))) break;
    }
    b = pt_kv_prefix_window(kv, r->hashes, b);
    r->n_hit = b;
    b = pt_kv_prefix_state(kv, r->hashes, b);
    for (int i = 0; i < b; i++) {
        int32_t id = pt_block_lookup(&kv->pool, r->hashes[i]);
        *n_revive += id < 0 || pt_block_refs(&kv->pool, id) == 0; /* < 0: read back from disk */
    }
    return b;
}

/* Takes the first n_pages of r's keys, as probe_prefix found them in this
 * step: from the pool, or read back from the disk tier.  A page that is no
 * longer there (another admission in this step evicted it) or fails its
 * checksum ends the run early; the step then computes those positions,
 * which costs the same free pages. */
static void reuse_prefix(pt_core *c, req *r, int n_pages) {
    r->n_published = pt_kv_seq_adopt(&c->e->kv, &r->seq.kv, r->hashes, n_pages);
}

/* Gives r's newly full pages their keys, so later requests find them;
 * only pages of real tokens (not drafts still being verified). */
static void publish_pages(pt_core *c, req *r) {
    pt_kv_cache *kv = &c->e->kv;
    int ps = kv->cfg.page_size;
    int limit = PT_MIN(r->seq.kv.n_tokens, r->seq.n_tokens - r->n_in_seq);
    if (!c->e->prefix_cache) return;
    for (; (r->n_published + 1) * ps <= limit; r->n_published++)
        pt_kv_seq_set_key(kv, &r->seq.kv, r->n_published, page_key(c, r, r->n_published));
}

/* Hybrid models: where r's prompt computation pauses for a state snapshot
 * (0: nowhere ahead of n_computed).  Two page boundaries are worth one:
 * where the pages the pool held at admission end (another prompt branched
 * off there, so a third sharing that prefix will reuse it: a system
 * prompt), and the prompt's last full page (the next turn of the same
 * conversation extends it).  A pause costs one more forward for the
 * prompt, never a row. */
static int pause_at(pt_core *c, const req *r, int n_computed) {
    if (!c->recurrent || !c->e->prefix_cache || !c->e->kv.n_snaps) return 0;
    int ps = c->e->kv.cfg.page_size, n_prompt = r->d.n_prompt;
    int at[2] = {r->n_hit * ps, (n_prompt - 1) / ps * ps};
    for (int i = 0; i < 2; i++)
        if (at[i] > n_computed) return at[i];
    return 0;
}

/* Hybrid models: after a step, a prompt chunk that ended on a page
 * boundary leaves the state the prefix cache wants there. */
static void snapshot_state(pt_core *c, req *r) {
    pt_kv_cache *kv = &c->e->kv;
    int ps = kv->cfg.page_size, at = r->seq.kv.state_pos;
    if (!c->recurrent || !c->e->prefix_cache || !kv->n_snaps || at <= 0 || at % ps ||
        at > (r->d.n_prompt - 1) / ps * ps)
        return;
    pt_kv_seq_snapshot(kv, &r->seq.kv, page_key(c, r, at / ps - 1));
}

/* WAITING / PREEMPTED -> RUNNING, starting past the n_cached_pages the
 * plan counted on. */
static void admit(pt_core *c, req *r, int n_cached_pages) {
    if (!r->started) {
        pt_seq_init(&r->seq, c->e, &r->d.params.sampling);
        if (r->d.n_bias) pt_sampler_set_bias(r->seq.sampler, r->bias_ids, r->bias_vals, r->d.n_bias);
        for (int i = 0; i < r->d.n_prompt; i++) pt_seq_push(&r->seq, r->prompt[i]);
        if (r->d.add_procs) r->d.add_procs(r->d.proc_arg, r->seq.sampler);
        r->seq.n_prompt = r->d.n_prompt;
        r->started = true;
    }
    reuse_prefix(c, r, n_cached_pages);
    if (r->t_admit == 0) {
        r->t_admit = pt_now();
        r->n_cached = PT_MIN(r->seq.kv.n_tokens, r->d.n_prompt);
    }
    r->state = PT_REQ_RUNNING;
    list_remove(c->wait, &c->n_wait, r);
    c->run[c->n_run++] = r;
}

/* ---- output ------------------------------------------------------------------ */

/* A token came out for r: report it and decide whether r goes on. */
static void on_sampled(pt_core *c, req *r, const pt_sample_result *s) {
    double now = pt_now();
    if (r->n_generated++ == 0) r->t_first = now;
    r->t_last = now;
    const pt_tokenizer *tok = c->e->tok;
    if (tok && !r->d.params.ignore_eos && s->id < pt_tokenizer_n_vocab(tok) &&
        pt_tokenizer_is_eog(tok, s->id)) {
        finish(c, r, PT_FINISH_STOP, NULL);
        return;
    }
    if (r->d.on_token && r->d.on_token(r->d.user, s)) {
        finish(c, r, PT_FINISH_STOP, NULL);
        return;
    }
    if (r->n_generated >= r->max_new) {
        finish(c, r, PT_FINISH_LENGTH, NULL);
        return;
    }
    pt_seq_push(&r->seq, s->id); /* computed in a later step */
}

/* ---- the step ------------------------------------------------------------------ */

/* How many tokens r may draft this step (0: none), never more than may still be emitted, nor past the context. */
static int draft_room(pt_core *c, req *r) {
    if (!r->started || r->seq.kv.n_tokens != r->seq.n_tokens - 1 || r->pause > 0) return 0;
    int k = PT_MIN(r->k_cur, r->max_new - r->n_generated - 1);
    return PT_MIN(k, room_for(c) - r->seq.n_tokens);
}

/* Jump-forward: the tokens r's grammar forces next, as drafts.  They skip
 * the per-token forwards (all are computed in one) and are verified like
 * any draft, so the output is what plain decoding gives.  Not bound by the
 * adaptive k nor the pause: they are almost always accepted. */
static int draft_forced(pt_core *c, req *r) {
    r->jf = false;
    if (!r->d.params.spec.jump_forward || !r->started || r->seq.kv.n_tokens != r->seq.n_tokens - 1)
        return 0;
    int k = PT_MIN(SPEC_MAX, r->max_new - r->n_generated - 1);
    k = PT_MIN(k, room_for(c) - r->seq.n_tokens);
    if (k <= 0) return 0;
    r->n_draft = pt_sampler_forced(r->seq.sampler, r->draft, k);
    r->jf = r->n_draft > 0;
    return r->n_draft;
}

/* Drafts for r's next step, if it speculates and is one token behind. */
static int draft(pt_core *c, req *r) {
    const pt_spec_params *sp = &r->d.params.spec;
    r->n_draft = 0;
    if (draft_forced(c, r) > 0) return r->n_draft;
    int k = sp->kind == PT_SPEC_OFF ? 0 : draft_room(c, r);
    if (k <= 0) return 0;
    /* a hybrid model rolls a rejected draft back to a checkpoint of its
     * state: no slot for one, no drafts */
    if (c->recurrent && !pt_kv_seq_ckpt_reserve(&c->e->kv, &r->seq.kv)) return 0;
    if (sp->kind == PT_SPEC_DRAFT) /* made before the plan (draft_model_pass) */
        r->n_draft = PT_MIN(r->n_pre, k);
    else if (sp->kind == PT_SPEC_NGRAM)
        r->n_draft = pt_draft_ngram(r->seq.tokens, r->seq.n_tokens, r->prediction,
                                    sp->n_prediction, r->seq.n_tokens - r->d.n_prompt,
                                    sp->ngram_min, sp->ngram_max, k, r->draft);
    else
        r->n_draft = pt_draft_oracle(r->oracle, sp->n_oracle, r->seq.n_tokens - r->d.n_prompt,
                                     sp->oracle_accept, c->e->model->cfg.vocab_size, k, &r->rng,
                                     r->draft);
    return r->n_draft;
}

/* ---- the draft model (--spec draft) ------------------------------------------------ */

/* Brings r's draft sequence in step with its target: the draft model's
 * positions past the first token that differs from the target's real
 * tokens (rejected drafts) are rolled back, and the real tokens become the
 * draft's input.  Returns the rows the draft model must compute before it
 * can propose (the catch-up, at least the last real token). */
static int draft_sync(pt_core *c, req *r) {
    pt_seq *d = &r->dseq, *t = &r->seq;
    if (!r->d_started) {
        pt_sampling greedy = pt_sampling_default();
        greedy.temperature = 0;
        pt_seq_init(d, c->draft, &greedy);
        r->d_started = true;
    }
    int same = PT_MIN(r->d_real, d->n_tokens);
    while (same < d->n_tokens && same < t->n_tokens && d->tokens[same] == t->tokens[same]) same++;
    if (d->kv.n_tokens > same) pt_kv_seq_truncate(&c->draft->kv, &d->kv, same);
    d->n_tokens = PT_MIN(d->n_tokens, same);
    for (int i = d->n_tokens; i < t->n_tokens; i++) pt_seq_push(d, t->tokens[i]);
    r->d_real = t->n_tokens;
    return d->n_tokens - d->kv.n_tokens;
}

/* The draft model's proposals for every running request of --spec draft,
 * made before the plan: one batched forward per drafted position, each
 * taking the draft's greedy token.  A request whose draft sequence is far
 * behind (a new prompt) first catches up in chunks, proposing nothing
 * until it has.  Correctness never depends on this: a failure here only
 * means fewer drafts. */
static void draft_model_pass(pt_core *c) {
    int n = 0, k_max = 0, budget = c->draft->model->max_batch;
    for (int i = 0; i < c->n_run; i++) {
        req *r = c->run[i];
        r->n_pre = 0;
        if (r->d.params.spec.kind != PT_SPEC_DRAFT || r->d_broken) continue;
        int k = draft_room(c, r);
        if (k <= 0) continue;
        int behind = draft_sync(c, r);
        if (behind > budget) { /* catch up now, draft in a later step */
            if (budget > 0) {
                c->ditems[n] = (pt_run_item){&r->dseq, budget, 0};
                c->dreq[n++] = r;
                budget = 0;
            }
            continue;
        }
        if (behind <= 0) continue;
        budget -= behind;
        r->k_want = k;
        k_max = PT_MAX(k_max, k);
        c->ditems[n] = (pt_run_item){&r->dseq, behind, 1};
        c->dreq[n++] = r;
    }
    size_t vocab = (size_t)c->draft->model->cfg.vocab_size;
    c->drunner.want_ids = true; /* drafts are the draft model's greedy picks */
    for (int step = 0; step < PT_MAX(k_max, 1) && n > 0; step++) {
        pt_err err = {{0}};
        int failed;
        if (pt_runner_run(&c->drunner, c->ditems, n, &failed, &err)) {
            pt_warn("engine: the draft model failed (%s); %s", err.msg,
                    failed >= 0 ? "that request drafts no more" : "no drafts this step");
            if (failed >= 0) c->dreq[failed]->d_broken = true;
            for (int i = 0; i < n; i++) c->dreq[i]->n_pre = 0;
            return;
        }
        const float *logits = c->drunner.logits;
        const int32_t *ids = c->drunner.have_ids ? c->drunner.ids : NULL;
        int m = 0;
        for (int i = 0; i < n; i++) {
            req *r = c->dreq[i];
            if (c->ditems[i].n_logits == 0) continue; /* catching up */
            int32_t best = 0;
            if (ids) {
                best = *ids++;
            } else {
                for (size_t v = 1; v < vocab; v++)
                    if (logits[v] > logits[best]) best = (int32_t)v;
                logits += vocab;
            }
            r->draft[r->n_pre++] = best;
            if (r->n_pre >= r->k_want) continue;
            pt_seq_push(&r->dseq, best); /* the next draft row */
            c->ditems[m] = (pt_run_item){&r->dseq, 1, 1};
            c->dreq[m++] = r;
        }
        n = m;
    }
}

static void describe(pt_core *c, pt_policy_req *p, req *r) {
    p->arrival = r->id;
    p->priority = 0;
    p->n_computed = r->started ? r->seq.kv.n_tokens : 0;
    p->n_tokens = r->started ? r->seq.n_tokens : r->d.n_prompt;
    p->n_spec = r->state == PT_REQ_RUNNING ? draft(c, r) : 0;
    p->pages_held = r->started ? r->seq.kv.n_pages : 0;
    p->pause_at = pause_at(c, r, p->n_computed);
    p->pages_own = p->pages_revive = 0;
    for (int i = 0; i < p->pages_held; i++)
        p->pages_own += pt_block_refs(&c->e->kv.pool, r->seq.kv.pages[i]) == 1;
}

/* A waiting request as it would start: past its cached pages. */
static void describe_waiting(pt_core *c, pt_policy_req *p, req *r, int *n_cached_pages) {
    describe(c, p, r);
    *n_cached_pages = probe_prefix(c, r, &p->pages_revive);
    p->n_computed = *n_cached_pages * c->e->kv.cfg.page_size;
    p->pages_held = *n_cached_pages;
    p->pause_at = pause_at(c, r, p->n_computed);
}

static void make_plan(pt_core *c) {
    int n = 0;
    for (int i = 0; i < c->n_run; i++, n++) {
        describe(c, &c->pr[n], c->run[i]);
        c->idx_req[n] = c->run[i];
        c->run_idx[i] = n;
    }
    /* only the queue's head can start this step: max_seqs bounds it */
    int n_wait = PT_MIN(c->n_wait, PT_MAX(0, c->o.max_seqs - c->n_run));
    for (int i = 0; i < n_wait; i++, n++) {
        describe_waiting(c, &c->pr[n], c->wait[i], &c->cached_pages[n]);
        c->idx_req[n] = c->wait[i];
        c->wait_idx[i] = n;
    }
    pt_policy_limits lim = {.max_rows = c->max_rows,
                            .max_prefill = c->o.max_prefill,
                            .max_seqs = c->o.max_seqs,
                            .page_size = c->e->kv.cfg.page_size,
                            .free_pages = pt_kv_free_pages(&c->e->kv)};
    pt_sched_plan(c->pr, c->run_idx, c->n_run, c->wait_idx, n_wait, &lim, &c->plan);
}

/* The drafts the plan granted go into the sequence's tokens, unaccepted,
 * so the runner feeds them as the rows after the last real token. */
static void append_drafts(req *r, int n) {
    pt_seq *q = &r->seq;
    if (q->n_tokens + n > q->cap) {
        q->cap = PT_MAX(q->n_tokens + n, 2 * q->cap);
        q->tokens = pt_xrealloc(q->tokens, sizeof(int32_t) * (size_t)q->cap);
    }
    memcpy(q->tokens + q->n_tokens, r->draft, sizeof(int32_t) * (size_t)n);
    q->n_tokens += n;
    r->n_in_seq = n;
}

/* Verifies r's drafts against the k+1 rows of logits: each row either
 * confirms the next draft (emitted, go on) or gives the target's own token
 * (emitted, stop); after all drafts, the last row gives one more.  The
 * finish rules apply to every emitted token.  Positions computed for
 * rejected drafts are rolled back, and k adapts to the acceptance. */
static void verify(pt_core *c, req *r, float *logits, const int32_t *ids, int n_rows) {
    size_t vocab = (size_t)c->e->model->cfg.vocab_size;
    int n_drafts = r->n_in_seq, accepted = 0;
    r->seq.n_tokens -= n_drafts; /* real tokens only; accepted ones are pushed again */
    r->n_in_seq = 0;
    for (int i = 0; i < n_rows; i++) {
        pt_sample_result s;
        bool ok = false;
        if (ids) /* the backend's argmax: pt_sampler_verify's greedy pick */
            s = (pt_sample_result){.id = ids[i]}, ok = i < n_drafts && ids[i] == r->draft[i];
        else if (i < n_drafts)
            pt_sampler_verify(r->seq.sampler, logits + (size_t)i * vocab, r->draft[i], &s, &ok);
        else
            pt_sampler_sample(r->seq.sampler, logits + (size_t)i * vocab, &s);
        accepted += ok;
        on_sampled(c, r, &s);
        if (r->state == PT_REQ_FINISHED || !ok) break;
    }
    if (r->jf) { /* forced tokens: not speculation, and k does not adapt to them */
        r->n_forced += accepted;
        r->jf = false;
        n_drafts = accepted = 0;
    }
    r->n_drafted += n_drafts;
    r->n_accepted += accepted;
    if (n_drafts > 0) {
        int k = r->d.params.spec.k;
        /* a draft of one token rejected: pause drafting, for twice as
         * many steps each time it happens again, so that a drafter that is
         * always wrong costs almost nothing; anything accepted ends that */
        if (accepted == 0 && r->k_cur == 1)
            r->pause = r->pause_len = PT_MIN(PAUSE_MAX, PT_MAX(1, 2 * r->pause_len));
        else if (accepted > 0)
            r->pause_len = 0;
        r->k_cur = accepted == n_drafts ? PT_MIN(k, r->k_cur + 1)
                   : 2 * accepted < n_drafts ? PT_MAX(1, r->k_cur / 2) : r->k_cur;
    }
    if (r->state != PT_REQ_FINISHED) /* the last token is not computed yet */
        pt_kv_seq_truncate(&c->e->kv, &r->seq.kv, r->seq.n_tokens - 1);
}

/* Whether every row the step samples from is a plain greedy pick, so the
 * backend can take the argmax and bring back ids instead of logits. */
static bool argmax_only(const pt_core *c, int n_items) {
    for (int i = 0; i < n_items; i++)
        if (c->items[i].n_logits > 0 && !pt_sampler_is_argmax(c->item_req[i]->seq.sampler))
            return false;
    return true;
}

static void sample_outputs(pt_core *c, int n_items) {
    size_t vocab = (size_t)c->e->model->cfg.vocab_size;
    float *logits = c->runner.logits;
    const int32_t *ids = c->runner.have_ids ? c->runner.ids : NULL;
    for (int i = 0; i < n_items; i++) {
        int k = c->items[i].n_logits;
        req *r = c->item_req[i];
        if (k == 0) continue;
        if (r->n_in_seq > 0 || k > 1) {
            verify(c, r, logits, ids, k);
        } else {
            pt_sample_result s;
            if (ids) s = (pt_sample_result){.id = ids[0]};
            else pt_sampler_sample(r->seq.sampler, logits + (size_t)(k - 1) * vocab, &s);
            on_sampled(c, r, &s);
            if (r->pause > 0 && k == 1) r->pause--; /* a decode step without drafts */
        }
        if (ids) ids += k;
        else logits += (size_t)k * vocab;
    }
}

int pt_core_step(pt_core *c) {
    if (c->n_run + c->n_wait == 0) return 0;
    double t0 = pt_now(), t1 = t0, t2 = t0;
    if (c->draft) draft_model_pass(c);
    make_plan(c);
    pt_step_plan *p = &c->plan;
    for (int i = 0; i < p->n_preempt; i++) preempt(c, c->idx_req[p->preempt[i]]);
    for (int i = 0; i < p->n_items; i++) {
        const pt_step_item *it = &p->items[i];
        req *r = c->idx_req[it->req];
        int end = c->pr[it->req].n_computed + it->n_rows; /* as planned */
        if (r->state != PT_REQ_RUNNING) admit(c, r, c->cached_pages[it->req]);
        if (c->pr[it->req].n_spec > 0 && it->n_rows > 1) {
            append_drafts(r, it->n_rows - 1);
            if (c->recurrent) pt_kv_seq_checkpoint(&c->e->kv, &r->seq.kv); /* for verify */
        }
        c->item_req[i] = r;
        c->items[i] = (pt_run_item){&r->seq, end - r->seq.kv.n_tokens, it->n_logits};
    }
    if (p->n_items > 0) {
        pt_err err = {{0}};
        int failed;
        t1 = pt_now();
        c->runner.want_ids = argmax_only(c, p->n_items);
        int rc = pt_runner_run(&c->runner, c->items, p->n_items, &failed, &err);
        t2 = pt_now();
        if (rc) {
            pt_warn("engine: step failed: %s", err.msg);
            for (int i = 0; i < p->n_items; i++)
                if (failed < 0 || failed == i) finish(c, c->item_req[i], PT_FINISH_NONE, err.msg);
        } else {
            for (int i = 0; i < p->n_items; i++) {
                publish_pages(c, c->item_req[i]);
                snapshot_state(c, c->item_req[i]);
            }
            sample_outputs(c, p->n_items);
        }
    }
    double t3 = pt_now();
    sweep(c);
    double t4 = pt_now();
    c->timing.n_steps++;
    c->timing.t_host += (t1 - t0) + (t4 - t3);
    c->timing.t_forward += t2 - t1;
    c->timing.t_sample += t3 - t2;
    return c->n_run + c->n_wait;
}

/* ---- the public side ------------------------------------------------------------ */

/* The draft model's pool holds what the target's does, plus each running
 * request's drafts in flight; grown here, when no core runs on it. */
static void draft_init(pt_core *c) {
    pt_engine *d = c->e->draft;
    const pt_kv_config *kc = &c->e->kv.cfg;
    if (pt_model_recurrent(d->model)) {
        pt_warn("engine: a hybrid recurrent draft model is not supported (its drafts' state is "
                "not checkpointed); no drafts");
        return;
    }
    int need = kc->n_pages * kc->page_size + c->o.max_seqs * (SPEC_MAX + kc->page_size);
    pt_err err = {{0}};
    if (d->kv.cfg.n_pages * d->kv.cfg.page_size < need && pt_engine_kv_init(d, need, &err)) {
        pt_warn("engine: no KV pool for the draft model (%s); --spec draft drafts nothing", err.msg);
        return;
    }
    d->prefix_cache = false; /* its pages are private and short-lived */
    c->draft = d;
    pt_runner_init(&c->drunner, d);
}

pt_core *pt_core_new(pt_engine *e, const pt_core_opts *o) {
    pt_core *c = pt_xcalloc(1, sizeof *c);
    c->e = e;
    c->o = *o;
    c->max_rows = e->model->max_batch;
    if (c->o.max_seqs <= 0) c->o.max_seqs = 8;
    if (c->o.max_seqs > c->max_rows) c->o.max_seqs = c->max_rows;
    if (c->o.n_ctx <= 0 || c->o.n_ctx > e->n_ctx) c->o.n_ctx = e->n_ctx;
    if (c->o.max_prefill <= 0) c->o.max_prefill = c->max_rows;
    /* a window group is sized for so many sequences at once (kvcache.h) */
    int fit = PT_MIN(pt_kv_max_seqs(&e->kv), e->draft ? pt_kv_max_seqs(&e->draft->kv) : INT32_MAX);
    if (c->o.max_seqs > fit) {
        pt_warn("engine: the KV cache's sliding-window pages hold %d sequence(s) at once; "
                "running %d instead of %d", fit, PT_MAX(fit, 1), c->o.max_seqs);
        c->o.max_seqs = PT_MAX(fit, 1);
    }
    c->recurrent = pt_model_recurrent(e->model);
    /* one recurrent-state slot per running sequence */
    if (c->recurrent && c->o.max_seqs > e->kv.cfg.n_state_slots)
        c->o.max_seqs = PT_MAX(1, e->kv.cfg.n_state_slots);
    grow(c, 16);
    pt_runner_init(&c->runner, e);
    if (e->draft) draft_init(c);
    return c;
}

void pt_core_cancel_all(pt_core *c) {
    for (int i = 0; i < c->n_run; i++) finish(c, c->run[i], PT_FINISH_CANCEL, NULL);
    for (int i = 0; i < c->n_wait; i++) finish(c, c->wait[i], PT_FINISH_CANCEL, NULL);
    sweep(c);
}

void pt_core_free(pt_core *c) {
    if (!c) return;
    pt_core_cancel_all(c);
    free(c->run), free(c->wait), free(c->pr), free(c->run_idx), free(c->wait_idx);
    free(c->idx_req), free(c->cached_pages), free(c->plan.items), free(c->plan.preempt), free(c->plan.admit);
    free(c->plan.order), free(c->plan.gone);
    free(c->items), free(c->item_req);
    pt_runner_free(&c->runner);
    if (c->draft) pt_runner_free(&c->drunner);
    free(c->ditems), free(c->dreq);
    free(c);
}

/* Positions a request may use: its context, and never more than the pool
 * holds, so that alone it always fits. */
static int room_for(const pt_core *c) {
    const pt_kv_config *kc = &c->e->kv.cfg;
    int64_t pool = (int64_t)kc->n_pages * kc->page_size;
    return (int)PT_MIN((int64_t)c->o.n_ctx, pool);
}

int pt_core_check(const pt_core *c, const pt_sched_job *d, pt_err *err) {
    int vocab = c->e->model->cfg.vocab_size, room = room_for(c);
    if (d->n_prompt <= 0) return pt_fail(err, "empty prompt");
    if (d->n_prompt >= c->o.n_ctx)
        return pt_fail(err, "prompt of %d tokens does not fit the context of %d", d->n_prompt,
                       c->o.n_ctx);
    if (d->n_prompt >= room)
        return pt_fail(err, "prompt of %d tokens does not fit the KV pool of %d positions "
                            "(raise --kv-budget)", d->n_prompt, room);
    for (int i = 0; i < d->n_prompt; i++)
        if (d->prompt[i] < 0 || d->prompt[i] >= vocab)
            return pt_fail(err, "prompt token %d (at position %d) is out of range (vocabulary %d)",
                           d->prompt[i], i, vocab);
    return 0;
}

void pt_core_add(pt_core *c, const pt_sched_job *d, uint64_t id) {
    grow(c, c->n_run + c->n_wait + 1);
    req *r = pt_xcalloc(1, sizeof *r);
    r->id = id;
    r->state = PT_REQ_WAITING;
    r->d = *d;
    r->prompt = pt_xmalloc(sizeof(int32_t) * (size_t)d->n_prompt);
    memcpy(r->prompt, d->prompt, sizeof(int32_t) * (size_t)d->n_prompt);
    r->d.prompt = r->prompt;
    if (d->n_bias > 0) {
        r->bias_ids = pt_xmalloc(sizeof(int32_t) * (size_t)d->n_bias);
        r->bias_vals = pt_xmalloc(sizeof(float) * (size_t)d->n_bias);
        memcpy(r->bias_ids, d->bias_ids, sizeof(int32_t) * (size_t)d->n_bias);
        memcpy(r->bias_vals, d->bias_vals, sizeof(float) * (size_t)d->n_bias);
    }
    r->d.bias_ids = r->bias_ids;
    r->d.bias_vals = r->bias_vals;
    int left = room_for(c) - d->n_prompt;
    r->max_new = d->params.max_tokens > 0 ? PT_MIN(d->params.max_tokens, left) : left;
    const pt_spec_params *sp = &d->params.spec;
    if (sp->kind != PT_SPEC_OFF) {
        r->d.params.spec.k = PT_MAX(1, PT_MIN(sp->k > 0 ? sp->k : 4, SPEC_MAX));
        r->k_cur = r->d.params.spec.k;
        if (sp->ngram_min <= 0) r->d.params.spec.ngram_min = 2;
        if (sp->ngram_max < r->d.params.spec.ngram_min) r->d.params.spec.ngram_max = PT_MAX(4, r->d.params.spec.ngram_min);
        if (sp->n_prediction > 0) {
            r->prediction = pt_xmalloc(sizeof(int32_t) * (size_t)sp->n_prediction);
            memcpy(r->prediction, sp->prediction, sizeof(int32_t) * (size_t)sp->n_prediction);
        }
        if (sp->n_oracle > 0) {
            r->oracle = pt_xmalloc(sizeof(int32_t) * (size_t)sp->n_oracle);
            memcpy(r->oracle, sp->oracle, sizeof(int32_t) * (size_t)sp->n_oracle);
        }
        r->d.params.spec.prediction = r->prediction;
        r->d.params.spec.oracle = r->oracle;
        pt_rng_seed(&r->rng, d->params.sampling.seed ^ 0x5eedull);
    }
    r->t_submit = pt_now();
    c->wait[c->n_wait++] = r;
}

bool pt_core_cancel(pt_core *c, uint64_t id) {
    req **lists[2] = {c->run, c->wait};
    int counts[2] = {c->n_run, c->n_wait};
    for (int l = 0; l < 2; l++)
        for (int i = 0; i < counts[l]; i++)
            if (lists[l][i]->id == id && lists[l][i]->state != PT_REQ_FINISHED) {
                finish(c, lists[l][i], PT_FINISH_CANCEL, NULL);
                sweep(c);
                return true;
            }
    return false;
}

static int count_live(req *const *list, int n) {
    int k = 0;
    for (int i = 0; i < n; i++) k += list[i]->state != PT_REQ_FINISHED;
    return k;
}

void pt_core_counts(const pt_core *c, int *n_waiting, int *n_running) {
    if (n_waiting) *n_waiting = count_live(c->wait, c->n_wait);
    if (n_running) *n_running = count_live(c->run, c->n_run);
}

pt_core_timing pt_core_get_timing(const pt_core *c) {
    return c->timing;
}

const pt_core_opts *pt_core_options(const pt_core *c) {
    return &c->o;
}
