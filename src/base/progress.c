/*
 * progress.c - the bar and the plain lines of progress.h.
 *
 * The bar is one line rewritten with '\r' at most ten times a second (a
 * terminal is slow and the job is not); the lines mode writes when another
 * tenth is done or 10 s have passed since the last line.  Rates and ETAs
 * are the average since the start: steadier than an instant rate, and
 * right for jobs (reading, uploading) whose speed does not change much.
 */
#include "base/progress.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/base.h"

#define BAR_WIDTH 24
#define REDRAW_S 0.1
#define LINE_EVERY_S 10.0
#define DEFAULT_DELAY_S 1.0

/* "1.21 GiB", "512.0 MiB", "12.0 KiB", "17 B". */
static void fmt_bytes(char *out, size_t cap, double b) {
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (b >= 1024 && u < 4)
        b /= 1024, u++;
    if (u == 0)
        snprintf(out, cap, "%.0f B", b);
    else
        snprintf(out, cap, "%.*f %s", b < 10 ? 2 : 1, b, units[u]);
}

/* "7 s", "3 min 20 s", "1 h 05 min". */
static void fmt_secs(char *out, size_t cap, double s) {
    long t = (long)(s + 0.5);
    if (t < 60)
        snprintf(out, cap, "%ld s", t);
    else if (t < 3600)
        snprintf(out, cap, "%ld min %02ld s", t / 60, t % 60);
    else
        snprintf(out, cap, "%ld h %02ld min", t / 3600, t / 60 % 60);
}

void pt_progress_begin_to(pt_progress *p, const char *what, uint64_t total, FILE *out, int style,
                          double delay) {
    memset(p, 0, sizeof *p);
    snprintf(p->what, sizeof p->what, "%s", what);
    p->total = total;
    p->out = out;
    p->style = style;
    p->delay = delay;
    p->t0 = p->t_drawn = pt_now();
}

void pt_progress_begin(pt_progress *p, const char *what, uint64_t total) {
    const char *env = getenv("PETREL_PROGRESS");
    int style = isatty(STDERR_FILENO) ? PT_PROGRESS_BAR : PT_PROGRESS_LINES;
    double delay = DEFAULT_DELAY_S;
    if (env && strcmp(env, "0") == 0) style = PT_PROGRESS_OFF;
    if (env && strcmp(env, "1") == 0) delay = 0;
    pt_progress_begin_to(p, what, total, stderr, style, delay);
}

/* The state as text: "45%  1.21 GiB of 2.70 GiB, 350.0 MiB/s, ETA 4 s". */
static void state(const pt_progress *p, double now, char *out, size_t cap) {
    double frac = p->total ? (double)p->done / (double)p->total : 1.0;
    double el = now - p->t0, rate = el > 0 ? (double)p->done / el : 0;
    char d[32], t[32], r[32], eta[48] = "?";
    fmt_bytes(d, sizeof d, (double)p->done);
    fmt_bytes(t, sizeof t, (double)p->total);
    fmt_bytes(r, sizeof r, rate);
    if (p->done >= p->total)
        fmt_secs(eta, sizeof eta, 0);
    else if (rate > 0)
        fmt_secs(eta, sizeof eta, (double)(p->total - p->done) / rate);
    snprintf(out, cap, "%3.0f%%  %s of %s, %s/s, ETA %s", 100 * frac, d, t, r, eta);
}

static void draw_bar(pt_progress *p, double now) {
    double frac = p->total ? (double)p->done / (double)p->total : 1.0;
    int fill = (int)(frac * BAR_WIDTH);
    char bar[BAR_WIDTH + 1], s[192];
    for (int i = 0; i < BAR_WIDTH; i++) bar[i] = i < fill ? '#' : '.';
    bar[BAR_WIDTH] = 0;
    state(p, now, s, sizeof s);
    fprintf(p->out, "\r%s [%s] %-60s", p->what, bar, s); /* padding erases a longer old line */
    fflush(p->out);
}

static void write_line(pt_progress *p, double now) {
    char s[192];
    state(p, now, s, sizeof s);
    fprintf(p->out, "petrel: %s: %s\n", p->what, s);
    fflush(p->out);
}

static void update(pt_progress *p, bool final) {
    if (p->style == PT_PROGRESS_OFF) return;
    double now = pt_now();
    if (!p->shown && now - p->t0 < p->delay) return;
    if (p->style == PT_PROGRESS_BAR) {
        if (final || !p->shown || now - p->t_drawn >= REDRAW_S) {
            draw_bar(p, now);
            p->t_drawn = now;
            p->shown = true;
        }
        return;
    }
    int tenths = p->total ? (int)(10 * (double)p->done / (double)p->total) : 10;
    if (tenths > p->tenths || now - p->t_drawn >= LINE_EVERY_S || (final && !p->shown)) {
        p->tenths = tenths;
        write_line(p, now);
        p->t_drawn = now;
        p->shown = true;
    }
}

void pt_progress_set(pt_progress *p, uint64_t done) {
    p->done = done > p->total ? p->total : done;
    update(p, false);
}

void pt_progress_add(pt_progress *p, uint64_t n) {
    pt_progress_set(p, p->done + n);
}

void pt_progress_end(pt_progress *p) {
    if (p->style == PT_PROGRESS_OFF || !p->shown) return;
    p->done = p->total;
    if (p->style == PT_PROGRESS_BAR) {
        draw_bar(p, pt_now());
        fputc('\n', p->out);
    } else if (p->tenths < 10) {
        p->tenths = 10;
        write_line(p, pt_now());
    }
    char t[48];
    fmt_secs(t, sizeof t, pt_now() - p->t0);
    fprintf(p->out, "petrel: %s: done in %s\n", p->what, t);
    fflush(p->out);
}
