/*
 * sched_policy.c - the step plan (see sched_policy.h for the policy).
 */
#include "engine/sched_policy.h"

#include <stdlib.h>

typedef struct {
    const pt_policy_req *reqs;
    const pt_policy_limits *lim;
    pt_step_plan *plan;
    int *order; /* running requests, most important first */
    int n_order;
    bool *gone; /* [n_order] preempted this step */
    int free_pages, rows_left, prefill_left, n_live;
} planner;

/* Positive when a should run before b (and be preempted after it). */
static int more_important(const pt_policy_req *a, const pt_policy_req *b) {
    if (a->priority != b->priority) return a->priority > b->priority;
    return a->arrival < b->arrival;
}

static int pages_to(const planner *p, const pt_policy_req *r, int n_positions) {
    int ps = p->lim->page_size;
    return PT_MAX(0, (n_positions + ps - 1) / ps - r->pages_held);
}

/* Rows still owed to reach the request's next logits. */
static int behind(const pt_policy_req *r) {
    return r->n_tokens + r->n_spec - r->n_computed;
}

static bool catching_up(const pt_policy_req *r) {
    return behind(r) > 1 + r->n_spec;
}

/* n rows of a catching-up chunk, ending at the request's pause if they
 * would pass it. */
static int stop_at_pause(const pt_policy_req *r, int n) {
    if (r->pause_at > r->n_computed && r->n_computed + n > r->pause_at) return r->pause_at - r->n_computed;
    return n;
}

static void add_item(planner *p, int req, int n_rows) {
    const pt_policy_req *r = &p->reqs[req];
    pt_step_item *it = &p->plan->items[p->plan->n_items++];
    it->req = req;
    it->n_rows = n_rows;
    /* a request one step from its logits wants every row's (1 + the drafts
     * granted: a budget may cut the drafts short); a catching-up chunk only
     * when it reaches the end */
    it->n_logits = !catching_up(r) ? n_rows : n_rows == behind(r) ? 1 + r->n_spec : 0;
    it->new_pages = pages_to(p, r, r->n_computed + n_rows);
    p->free_pages -= it->new_pages;
    p->rows_left -= n_rows;
    if (catching_up(r)) p->prefill_left -= n_rows;
    p->plan->n_rows += n_rows;
}

/* Preempts the least important running request not yet preempted whose
 * preemption returns pages (one holding only shared pages frees nothing:
 * it is left alone), or else `self`, the request short of pages.  Rows it
 * was granted earlier in this pass are withdrawn.  Returns its index in
 * order[], or -1 if none is left. */
static int preempt_last(planner *p, int self) {
    for (int k = p->n_order - 1; k >= 0; k--) {
        if (p->gone[k] || (k != self && p->reqs[p->order[k]].pages_own == 0)) continue;
        int req = p->order[k];
        for (int i = 0; i < p->plan->n_items; i++) {
            pt_step_item *it = &p->plan->items[i];
            if (it->req != req) continue;
            /* it was granted rows earlier in this pass: give them back */
            p->free_pages += it->new_pages;
            p->rows_left += it->n_rows;
            if (catching_up(&p->reqs[req])) p->prefill_left += it->n_rows;
            p->plan->n_rows -= it->n_rows;
            *it = p->plan->items[--p->plan->n_items];
            break;
        }
        p->gone[k] = true;
        p->free_pages += p->reqs[req].pages_own; /* shared pages stay with the others */
        p->plan->preempt[p->plan->n_preempt++] = req;
        p->n_live--;
        return k;
    }
    return -1;
}

/* Grants rows to the running request at order[k], preempting others (or
 * itself) when the pool is short. */
static void schedule_running(planner *p, int k, bool catching) {
    int req = p->order[k];
    const pt_policy_req *r = &p->reqs[req];
    if (p->gone[k] || catching_up(r) != catching) return;
    int n = PT_MIN(behind(r), p->rows_left);
    if (catching) {
        /* a chunk shrinks to the pages there are before anyone is preempted */
        int fit = (r->pages_held + p->free_pages) * p->lim->page_size - r->n_computed;
        n = stop_at_pause(r, PT_MIN(n, p->prefill_left));
        if (fit > 0) n = PT_MIN(n, fit);
    }
    if (n <= 0) return;
    while (pages_to(p, r, r->n_computed + n) > p->free_pages) {
        int victim = preempt_last(p, k);
        if (victim == k || victim < 0) return;
    }
    add_item(p, req, n);
}

static int cmp_order(const void *a, const void *b, void *ctx) {
    const pt_policy_req *reqs = ctx;
    const pt_policy_req *x = &reqs[*(const int *)a], *y = &reqs[*(const int *)b];
    return more_important(x, y) ? -1 : more_important(y, x) ? 1 : 0;
}

void pt_sched_plan(const pt_policy_req *reqs, const int *running, int n_running,
                   const int *waiting, int n_waiting, const pt_policy_limits *lim,
                   pt_step_plan *plan) {
    plan->n_items = plan->n_preempt = plan->n_admit = plan->n_rows = 0;
    planner p = {reqs, lim, plan, NULL, n_running, NULL, lim->free_pages, lim->max_rows,
                 lim->max_prefill, n_running};
    p.order = plan->order;
    p.gone = plan->gone;
    memset(p.gone, 0, sizeof(bool) * (size_t)n_running);
    memcpy(p.order, running, sizeof(int) * (size_t)n_running);
    qsort_r(p.order, (size_t)n_running, sizeof(int), cmp_order, (void *)reqs);

    for (int k = 0; k < n_running; k++) schedule_running(&p, k, false);
    for (int k = 0; k < n_running; k++) schedule_running(&p, k, true);

    for (int i = 0; i < n_waiting && plan->n_preempt == 0; i++) {
        int req = waiting[i];
        const pt_policy_req *r = &reqs[req];
        int n = PT_MIN(PT_MIN(behind(r), p.rows_left), p.prefill_left);
        if (catching_up(r)) n = stop_at_pause(r, n);
        if (p.n_live >= lim->max_seqs || n <= 0 ||
            pages_to(&p, r, r->n_computed + n) + r->pages_revive > p.free_pages)
            break;
        plan->admit[plan->n_admit++] = req;
        p.n_live++;
        p.free_pages -= r->pages_revive;
        add_item(&p, req, n);
    }
}
