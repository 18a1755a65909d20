/*
 * progress.h - progress of a long job measured in bytes (loading weights,
 * converting a model): a bar with bytes, rate and ETA redrawn in place on
 * a terminal, or a plain line at every tenth of the way (and every 10 s)
 * when stderr is a file or a pipe, so logs stay readable.
 *
 * PETREL_PROGRESS: unset = shown once the job has taken 1 s (quick loads
 * print nothing); 1 = shown from the start; 0 = never.  The style follows
 * isatty(stderr) in every case.
 *
 * One thread drives one pt_progress; it allocates nothing.
 */
#ifndef PETREL_PROGRESS_H
#define PETREL_PROGRESS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

enum { PT_PROGRESS_OFF, PT_PROGRESS_BAR, PT_PROGRESS_LINES };

typedef struct pt_progress {
    char what[48];
    uint64_t total, done;
    FILE *out;
    int style;         /* PT_PROGRESS_* */
    double delay;      /* seconds before anything is shown */
    double t0, t_drawn; /* pt_now() at begin, at the last draw or line */
    int tenths;        /* tenths of the way already reported (lines) */
    bool shown;        /* something was printed */
} pt_progress;

/* Starts a job of total bytes on stderr, as PETREL_PROGRESS says. */
void pt_progress_begin(pt_progress *p, const char *what, uint64_t total);
/* The same on out with a given style and delay (tests). */
void pt_progress_begin_to(pt_progress *p, const char *what, uint64_t total, FILE *out, int style,
                          double delay);
/* done bytes of total so far (absolute), or n more. */
void pt_progress_set(pt_progress *p, uint64_t done);
void pt_progress_add(pt_progress *p, uint64_t n);
/* The job finished: the last state and a newline, if anything was shown. */
void pt_progress_end(pt_progress *p);

#endif
