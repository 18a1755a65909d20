/*
 * test_sched_policy.c - the step planner on plain numbers, no model: lazy
 * page growth, decode rows before prompt chunks, the token and prefill
 * budgets, preemption order, FIFO admission, resumption after preemption,
 * k+1 logits rows for speculative verification, and prompt chunks that
 * pause at a page boundary (a hybrid model's state snapshot).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>

#include <cmocka.h>

#include "engine/sched_policy.h"

enum { CAP = 16 };

typedef struct {
    pt_policy_req r[CAP];
    int running[CAP], waiting[CAP];
    int n_running, n_waiting;
    pt_step_item items[CAP];
    int preempt[CAP], admit[CAP], order[CAP];
    bool gone[CAP];
    pt_step_plan plan;
    pt_policy_limits lim;
} world;

static void world_init(world *w, int free_pages) {
    memset(w, 0, sizeof *w);
    w->plan = (pt_step_plan){.items = w->items, .preempt = w->preempt, .admit = w->admit,
                             .order = w->order, .gone = w->gone};
    w->lim = (pt_policy_limits){.max_rows = 64, .max_prefill = 64, .max_seqs = 8,
                                .page_size = 4, .free_pages = free_pages};
}

/* A running request: n_tokens known, n_computed stored, pages to match. */
static int add_running(world *w, uint64_t arrival, int n_computed, int n_tokens) {
    int i = w->n_running + w->n_waiting;
    w->r[i] = (pt_policy_req){.arrival = arrival, .n_computed = n_computed, .n_tokens = n_tokens,
                              .pages_held = (n_computed + 3) / 4, .pages_own = (n_computed + 3) / 4};
    w->running[w->n_running++] = i;
    return i;
}

static int add_waiting(world *w, uint64_t arrival, int n_tokens) {
    int i = w->n_running + w->n_waiting;
    w->r[i] = (pt_policy_req){.arrival = arrival, .n_tokens = n_tokens};
    w->waiting[w->n_waiting++] = i;
    return i;
}

static void plan(world *w) {
    pt_sched_plan(w->r, w->running, w->n_running, w->waiting, w->n_waiting, &w->lim, &w->plan);
}

static const pt_step_item *item_of(const world *w, int req) {
    for (int i = 0; i < w->plan.n_items; i++)
        if (w->plan.items[i].req == req) return &w->plan.items[i];
    return NULL;
}

/* Pages are taken only for this step's rows, not the request's worst case. */
static void test_lazy_growth(void **state) {
    (void)state;
    world w;
    world_init(&w, 100);
    int a = add_waiting(&w, 1, 10); /* 10-token prompt, max_tokens irrelevant */
    plan(&w);
    assert_int_equal(w.plan.n_admit, 1);
    const pt_step_item *it = item_of(&w, a);
    assert_non_null(it);
    assert_int_equal(it->n_rows, 10);
    assert_int_equal(it->n_logits, 1);
    assert_int_equal(it->new_pages, 3); /* ceil(10 / 4) */

    /* decoding at a page boundary takes one page; inside a page none */
    world_init(&w, 100);
    int b = add_running(&w, 1, 12, 13), c = add_running(&w, 2, 13, 14);
    plan(&w);
    assert_int_equal(item_of(&w, b)->new_pages, 1);
    assert_int_equal(item_of(&w, c)->new_pages, 0);
    assert_int_equal(w.plan.n_rows, 2);
}

/* Decode rows come first; prompt chunks share what is left of the budgets. */
static void test_budgets(void **state) {
    (void)state;
    world w;
    world_init(&w, 100);
    w.lim.max_rows = 8;
    w.lim.max_prefill = 5;
    int p = add_running(&w, 1, 4, 30); /* older, still catching up */
    int d1 = add_running(&w, 2, 9, 10), d2 = add_running(&w, 3, 5, 6);
    int q = add_waiting(&w, 4, 7);
    plan(&w);
    assert_int_equal(w.plan.items[0].req, d1); /* decode rows first, by arrival */
    assert_int_equal(w.plan.items[1].req, d2);
    assert_int_equal(item_of(&w, p)->n_rows, 5); /* prefill budget */
    assert_int_equal(item_of(&w, p)->n_logits, 0); /* mid-prompt: no logits */
    assert_null(item_of(&w, q));                 /* no rows left */
    assert_int_equal(w.plan.n_admit, 0);
    assert_int_equal(w.plan.n_rows, 7);
}

/* A catching-up chunk ends at its pause (without logits: the prompt is
 * not done) and the next one goes on past it; a pause behind the
 * computed positions changes nothing. */
static void test_pause(void **state) {
    (void)state;
    world w;
    world_init(&w, 100);
    int a = add_waiting(&w, 1, 30);
    w.r[a].pause_at = 12;
    int b = add_running(&w, 2, 4, 30);
    w.r[b].pause_at = 8;
    plan(&w);
    assert_int_equal(item_of(&w, a)->n_rows, 12);
    assert_int_equal(item_of(&w, a)->n_logits, 0);
    assert_int_equal(item_of(&w, b)->n_rows, 4);
    assert_int_equal(item_of(&w, b)->n_logits, 0);
    world_init(&w, 100);
    int c = add_running(&w, 1, 12, 30);
    w.r[c].pause_at = 12;
    plan(&w);
    assert_int_equal(item_of(&w, c)->n_rows, 18);
    assert_int_equal(item_of(&w, c)->n_logits, 1);
}

/* Short of pages, the latest arrival is preempted first, only as many as
 * needed, and nothing is admitted in that step. */
static void test_preemption_order(void **state) {
    (void)state;
    world w;
    world_init(&w, 0); /* pool exhausted */
    int a = add_running(&w, 1, 8, 9);  /* needs a page (at a boundary) */
    int b = add_running(&w, 2, 8, 9);  /* needs a page */
    int c = add_running(&w, 3, 6, 7);  /* fits its page */
    int d = add_running(&w, 4, 3, 4);  /* fits its page, holds 1 */
    add_waiting(&w, 5, 2);
    plan(&w);
    /* a needs 1: d (latest, holds 1) goes; b needs 1: c (holds 2) goes */
    assert_int_equal(w.plan.n_preempt, 2);
    assert_int_equal(w.plan.preempt[0], d);
    assert_int_equal(w.plan.preempt[1], c);
    assert_non_null(item_of(&w, a));
    assert_non_null(item_of(&w, b));
    assert_null(item_of(&w, c));
    assert_null(item_of(&w, d));
    assert_int_equal(w.plan.n_admit, 0);

    /* higher priority outranks arrival */
    world_init(&w, 0);
    a = add_running(&w, 1, 8, 9);
    b = add_running(&w, 2, 8, 9);
    w.r[a].priority = -1;
    plan(&w);
    assert_int_equal(w.plan.n_preempt, 1);
    assert_int_equal(w.plan.preempt[0], a);
    assert_non_null(item_of(&w, b));
}

/* When the request short of pages is itself the least important, it is the
 * one preempted, and its rows are not planned. */
static void test_self_preemption(void **state) {
    (void)state;
    world w;
    world_init(&w, 0);
    int a = add_running(&w, 1, 5, 6); /* fits */
    int b = add_running(&w, 2, 8, 9); /* needs a page; nobody later */
    plan(&w);
    assert_int_equal(w.plan.n_preempt, 1);
    assert_int_equal(w.plan.preempt[0], b);
    assert_non_null(item_of(&w, a));
    assert_null(item_of(&w, b));
}

/* A catching-up chunk shrinks to the free pages before it preempts. */
static void test_chunk_shrinks(void **state) {
    (void)state;
    world w;
    world_init(&w, 2);
    int a = add_running(&w, 1, 4, 40); /* holds 1 page, 2 free: room to 12 */
    int b = add_running(&w, 2, 2, 3);
    plan(&w);
    assert_int_equal(w.plan.n_preempt, 0);
    assert_int_equal(item_of(&w, b)->n_rows, 1);
    assert_int_equal(item_of(&w, a)->n_rows, 8);
    assert_int_equal(item_of(&w, a)->new_pages, 2);
}

/* Admission is FIFO: a head that does not fit blocks the ones behind it;
 * max_seqs caps running requests. */
static void test_fifo_admission(void **state) {
    (void)state;
    world w;
    world_init(&w, 3);
    add_waiting(&w, 1, 20); /* needs 5 pages */
    add_waiting(&w, 2, 2);  /* would fit */
    plan(&w);
    assert_int_equal(w.plan.n_admit, 0);
    assert_int_equal(w.plan.n_items, 0);

    world_init(&w, 100);
    w.lim.max_seqs = 2;
    add_running(&w, 1, 4, 5);
    int x = add_waiting(&w, 2, 3), y = add_waiting(&w, 3, 3);
    plan(&w);
    assert_int_equal(w.plan.n_admit, 1);
    assert_int_equal(w.plan.admit[0], x);
    assert_null(item_of(&w, y));
}

/* A preempted request waits at the queue's front with its tokens and no
 * pages; once admitted it recomputes them all and gets its next logits
 * from the same step. */
static void test_resumption(void **state) {
    (void)state;
    world w;
    world_init(&w, 100);
    int r = add_waiting(&w, 1, 25); /* prompt 20 + 5 generated, preempted */
    plan(&w);
    assert_int_equal(w.plan.n_admit, 1);
    const pt_step_item *it = item_of(&w, r);
    assert_int_equal(it->n_rows, 25);
    assert_int_equal(it->n_logits, 1);
    assert_int_equal(it->new_pages, 7);
}

/* Verification: a request with n_spec drafts computes 1 + n_spec rows and
 * wants every one of their logits. */
static void test_spec_rows(void **state) {
    (void)state;
    world w;
    world_init(&w, 100);
    int a = add_running(&w, 1, 10, 11);
    w.r[a].n_spec = 3;
    int b = add_running(&w, 2, 10, 11);
    plan(&w);
    assert_int_equal(item_of(&w, a)->n_rows, 4);
    assert_int_equal(item_of(&w, a)->n_logits, 4);
    assert_int_equal(item_of(&w, a)->new_pages, 1); /* positions 10..13 cross into page 3 */
    assert_int_equal(item_of(&w, b)->n_logits, 1);
}

/* Preempting a request returns only the pages it alone holds: requests
 * whose pages are all shared free nothing and are left running; the one
 * short of pages goes itself. */
static void test_shared_pages_not_counted(void **state) {
    (void)state;
    world w;
    world_init(&w, 0);
    int a = add_running(&w, 1, 8, 9);  /* needs a page */
    int b = add_running(&w, 2, 6, 7);  /* fits; 2 pages, both shared with c */
    int c = add_running(&w, 3, 3, 4);  /* fits; holds 1 of its own */
    w.r[b].pages_own = 0;
    w.r[c].pages_own = 0; /* its page is shared too */
    plan(&w);
    assert_int_equal(w.plan.n_preempt, 1);
    assert_int_equal(w.plan.preempt[0], a);
    assert_non_null(item_of(&w, b));
    assert_non_null(item_of(&w, c));
    /* with a page of its own, c is preempted for a as before */
    w.r[c].pages_own = 1;
    plan(&w);
    assert_int_equal(w.plan.n_preempt, 1);
    assert_int_equal(w.plan.preempt[0], c);
    assert_non_null(item_of(&w, a));
}

/* A waiting request that starts past cached pages computes only the rest;
 * the free cached pages it revives count against the pool. */
static void test_cached_start(void **state) {
    (void)state;
    for (int free_pages = 4; free_pages >= 3; free_pages--) {
        world w;
        world_init(&w, free_pages);
        int a = add_waiting(&w, 1, 20);
        w.r[a].n_computed = 16, w.r[a].pages_held = 4; /* 4 cached pages of 4 positions */
        w.r[a].pages_revive = 3;                      /* 3 of them free */
        plan(&w);
        if (free_pages == 4) { /* 3 revived + 1 new page for positions 16..19 */
            assert_int_equal(w.plan.n_admit, 1);
            assert_int_equal(item_of(&w, a)->n_rows, 4);
            assert_int_equal(item_of(&w, a)->new_pages, 1);
        } else {
            assert_int_equal(w.plan.n_admit, 0); /* it waits for one more */
        }
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lazy_growth),       cmocka_unit_test(test_budgets),
        cmocka_unit_test(test_pause),
        cmocka_unit_test(test_preemption_order),  cmocka_unit_test(test_self_preemption),
        cmocka_unit_test(test_chunk_shrinks),     cmocka_unit_test(test_fifo_admission),
        cmocka_unit_test(test_resumption),        cmocka_unit_test(test_spec_rows),
        cmocka_unit_test(test_shared_pages_not_counted),
        cmocka_unit_test(test_cached_start),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
