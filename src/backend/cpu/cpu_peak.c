/*
 * cpu_peak.c - the compute ceiling prefill is judged against (DESIGN.md §1,
 * §6): the rate at which all threads together issue the multiply-adds the
 * prefill GEMM for a weight format uses.
 *
 * f32, f16 and bf16 weights run the packed f32 GEMM (cpu_matmul.c): its
 * ceiling is f32 FMAs.  Quantized weights with an int8 GEMM (q8_0, q4_0 on
 * AVX2: q8_0, q4_0, q4_k, q5_k, q6_k, affine 4-bit) run u8 x s8 multiply-adds: its ceiling is vpmaddubsw's rate, 32
 * products per instruction (on the avx512 set vpdpbusd's, 64 per
 * instruction, accumulated in 32 bits).  That kernel needs vpmaddwd, a sign and a
 * convert beside each vpmaddubsw, so its practical ceiling is below this
 * one; the peak is an upper bound, never a target that can be beaten.
 * Other quantized formats run int16 row kernels (vpmaddwd, half the rate
 * per instruction); their fraction is taken against the int8 peak too.
 *
 * Each probe is a register-only loop (cpu_kernels.h peak_f32 / peak_i8)
 * run on every thread at once, best of REPS short passes (on a shared
 * machine a long pass always meets a preemption), measured once per
 * backend.  Each thread's rate is its operations over its own CPU time,
 * and the rates are summed: on a machine shared with other jobs, wall time
 * would count the time a thread waited for a core and set the ceiling
 * below what the cores do when they run.
 */
#include <stdio.h>
#include <time.h>

#include "backend/cpu/cpu_backend.h"

#define REPS 30
#define ITERS 300000 /* ~1 ms per pass per thread: short, so some passes run undisturbed */

typedef struct peak_job {
    double (*loop)(int64_t iters, float *sink);
    double rate[256]; /* ops per second of this thread's CPU time */
    float sink[256];
} peak_job;

static double thread_cpu_time(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void peak_task(void *ctx, int ith, int nth) {
    peak_job *j = ctx;
    (void)nth;
    double t0 = thread_cpu_time(), ops = j->loop(ITERS, &j->sink[ith % 256]);
    double dt = thread_cpu_time() - t0;
    j->rate[ith % 256] = dt > 0 ? ops / dt : 0;
}

static double measure(pt_cpu_backend *cb, double (*loop)(int64_t, float *)) {
    peak_job j = {.loop = loop};
    int nth = cb->base.n_threads;
    double best = 0;
    for (int r = 0; r < REPS; r++) {
        pt_pool_run(cb->pool, peak_task, &j);
        double sum = 0;
        for (int i = 0; i < nth && i < 256; i++) sum += j.rate[i];
        best = PT_MAX(best, sum);
    }
    return best;
}

double pt_cpu_compute_peak(pt_backend *be, pt_dtype wt, char *note, size_t note_len) {
    pt_cpu_backend *cb = pt_cpu(be);
    bool quant = pt_qk_handles(wt) && cb->k->peak_i8;
    int kind = quant ? 1 : 0;
    if (cb->peak[kind] <= 0) cb->peak[kind] = measure(cb, quant ? cb->k->peak_i8 : cb->k->peak_f32);
    if (note && note_len)
        snprintf(note, note_len, "%s %s multiply-adds, %d thread%s; bandwidth probe: %s",
                 cb->k->name, !quant ? "f32 fma" : cb->quant.avx512 ? "u8 x s8 (vpdpbusd)" : "u8 x s8 (vpmaddubsw)", be->n_threads,
                 be->n_threads == 1 ? "" : "s", cb->bandwidth_how[0] ? cb->bandwidth_how : "not run");
    return cb->peak[kind];
}
