/*
 * sched_policy.h - what to run in the next step: a pure function from the
 * requests' progress and the free KV pages to a step plan.
 *
 * There is no prefill phase and no decode phase.  Each request has
 * n_computed positions in the cache and n_tokens known tokens (prompt, then
 * the generated ones, the last of which is not computed yet), plus n_spec
 * draft tokens to verify; a step computes some of the difference for some
 * requests.  A prompt is a request far behind, a decode one token behind,
 * speculative verification 1 + n_spec behind: the same plan covers chunked
 * prefill, decode, mixed steps and verification.
 *
 * The policy, in order:
 *   1. running requests that are one step from their next token (decode and
 *      verify rows) get their rows first, oldest first, so every stream
 *      moves each step; then running requests still catching up (prompt
 *      chunks, or recompute after preemption) within the prefill budget;
 *   2. pages are allocated lazily: a request is granted only the pages the
 *      rows of this step need.  When the pool cannot supply them, the
 *      lowest-priority running request (latest arrival among the lowest
 *      priority) is preempted by recompute - its pages go back and it
 *      rejoins the front of the waiting queue with its tokens kept - until
 *      the request fits, or until it is itself the one preempted;
 *   3. only when nothing was preempted, waiting requests are admitted in
 *      queue order (a head that does not fit blocks the rest: FIFO, no
 *      starvation), within max_seqs, the row budget and the pages left.
 *      A waiting request may start past cached pages (the prefix cache):
 *      its n_computed and pages_held say so, and pages_revive counts the
 *      free ones among them, which its admission takes from the pool.
 *
 * Nothing here touches a model, a cache or a thread: tests drive it with
 * plain numbers (tests/engine/test_sched_policy.c).
 */
#ifndef PETREL_SCHED_POLICY_H
#define PETREL_SCHED_POLICY_H

#include "base/base.h"

/* A request as the policy sees it. */
typedef struct pt_policy_req {
    uint64_t arrival;  /* submission order; earlier wins ties */
    int priority;      /* higher runs first and is preempted last */
    int n_computed;    /* positions whose KV is stored */
    int n_tokens;      /* known tokens, the last not yet computed */
    int n_spec;        /* draft tokens after them, verified this step */
    int pages_held;    /* pages in its block table (growth starts past them) */
    int pages_own;     /* of those, held by it alone: what preemption returns */
    int pages_revive;  /* waiting: cached free pages it starts with (they
                        * leave the free count when it is admitted) */
    int pause_at;      /* a catching-up chunk ends here if it would pass it
                        * (a state snapshot is taken there); 0: none */
} pt_policy_req;

typedef struct pt_policy_limits {
    int max_rows;    /* rows of one forward (token budget) */
    int max_prefill; /* rows of catching-up requests per step */
    int max_seqs;    /* running requests at most */
    int page_size;   /* positions per KV page */
    int free_pages;  /* pages in the pool nobody holds */
} pt_policy_limits;

/* One request's part of a step: rows [n_computed, n_computed + n_rows) of
 * its tokens, the logits of the last n_logits of them, new_pages taken. */
typedef struct pt_step_item {
    int req;      /* index into the request array */
    int n_rows;
    int n_logits; /* 1 + n_spec when the rows reach the end, else 0 */
    int new_pages;
} pt_step_item;

typedef struct pt_step_plan {
    pt_step_item *items; /* [n_reqs] capacity, in batch order */
    int n_items;
    int *preempt; /* [n_reqs] capacity: running requests to preempt, in order */
    int n_preempt;
    int *admit; /* [n_reqs] capacity: waiting requests that start running */
    int n_admit;
    int n_rows; /* sum of the items' rows */
    int *order;  /* [n_reqs] scratch, so planning allocates nothing */
    bool *gone;  /* [n_reqs] scratch */
} pt_step_plan;

/* Plans one step.  running[] and waiting[] index reqs; running is in any
 * order (the policy sorts by priority and arrival), waiting in queue order.
 * plan's arrays (scratch included) need room for n_running + n_waiting
 * entries each. */
void pt_sched_plan(const pt_policy_req *reqs, const int *running, int n_running,
                   const int *waiting, int n_waiting, const pt_policy_limits *lim,
                   pt_step_plan *plan);

#endif
