/*
 * bpw.h - choosing bits per module under a bits-per-weight budget
 * (`petrel convert --target-bpw`), from measured sensitivities.
 *
 * Each module has a measured cost at each candidate format: the KL
 * divergence of the model's next-token distribution on a calibration text
 * when that module alone is quantized so (the exact-KL sweep the seed's
 * sensitivity.ts ran).  Treating the costs as additive, pt_bpw_allocate
 * solves the multiple-choice knapsack greedily: every module starts at the
 * cheapest candidate, then the upgrade with the largest KL saved per extra
 * bit is taken, again and again, while the budget holds.
 */
#ifndef PETREL_BPW_H
#define PETREL_BPW_H

#include "base/base.h"

#define PT_BPW_MAX_CHOICES 8

typedef struct pt_bpw_module {
    int64_t params;                   /* weights in the module */
    double cost[PT_BPW_MAX_CHOICES];  /* measured KL at each candidate */
    int choice;                       /* result: index into the candidates */
} pt_bpw_module;

typedef struct pt_bpw_problem {
    int n_choices;
    double bpw[PT_BPW_MAX_CHOICES]; /* bits per weight of each candidate, overhead included, ascending */
    int n_modules;
    pt_bpw_module *modules;
    double target_bpw;
} pt_bpw_problem;

/* Fills each module's choice.  Fails if even the cheapest candidates
 * exceed the budget.  *achieved gets the resulting bits per weight. */
int pt_bpw_allocate(pt_bpw_problem *p, double *achieved, pt_err *err);

#endif
