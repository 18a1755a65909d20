/*
 * bpw.c - the greedy multiple-choice knapsack behind --target-bpw (bpw.h).
 *
 * An upgrade may jump several candidates at once (4 -> 6 bits when 5 bits
 * happens to measure no better than 4), so measured curves need not be
 * convex.  Ties go to the smaller module, then the earlier one, so the
 * result is deterministic.
 */
#include "quant/bpw.h"

static double total_bits(const pt_bpw_problem *p) {
    double b = 0;
    for (int i = 0; i < p->n_modules; i++)
        b += (double)p->modules[i].params * p->bpw[p->modules[i].choice];
    return b;
}

int pt_bpw_allocate(pt_bpw_problem *p, double *achieved, pt_err *err) {
    double params = 0;
    for (int i = 0; i < p->n_modules; i++) {
        p->modules[i].choice = 0;
        params += (double)p->modules[i].params;
    }
    if (params == 0) return pt_fail(err, "target bpw: no quantizable weights");
    double budget = p->target_bpw * params, used = total_bits(p);
    if (used > budget * (1 + 1e-12))
        return pt_fail(err, "target of %.3f bits per weight is below the cheapest format's %.3f",
                       p->target_bpw, used / params);
    for (;;) {
        int best_m = -1, best_c = -1;
        double best_ratio = 0;
        for (int i = 0; i < p->n_modules; i++) {
            const pt_bpw_module *m = &p->modules[i];
            for (int c = m->choice + 1; c < p->n_choices; c++) {
                double extra = (double)m->params * (p->bpw[c] - p->bpw[m->choice]);
                double saved = m->cost[m->choice] - m->cost[c];
                if (extra <= 0 || saved <= 0 || used + extra > budget * (1 + 1e-12)) continue;
                double ratio = saved / extra;
                if (ratio > best_ratio ||
                    (ratio == best_ratio && best_m >= 0 && m->params < p->modules[best_m].params)) {
                    best_ratio = ratio;
                    best_m = i;
                    best_c = c;
                }
            }
        }
        if (best_m < 0) break;
        pt_bpw_module *m = &p->modules[best_m];
        used += (double)m->params * (p->bpw[best_c] - p->bpw[m->choice]);
        m->choice = best_c;
    }
    *achieved = used / params;
    return 0;
}
