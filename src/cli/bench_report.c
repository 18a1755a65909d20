/*
 * bench_report.c - the HTML report of `petrel bench serve`: one offline
 * page (inline CSS and SVG; no script, no network) drawn from the run's
 * JSON document alone.
 *
 * Plots are drawn by svg_plot(), a small chart of line/dot series on linear
 * or log axes.  Every series becomes one <path class="series"> (dots: one
 * <circle class="dot"> each), so a test can count what was drawn; an empty
 * plot says "no data" instead of drawing nothing silently.
 */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/bench_serve.h"

#define W 680
#define H 360
#define ML 70 /* margins: room for tick labels and axis titles */
#define MR 20
#define MT 34
#define MB 68 /* and the legend, a row under the axis title */

typedef struct series {
    const char *name, *color;
    double *x, *y;
    int n, cap;
    int count; /* what the legend counts when not points (requests of a CDF) */
    bool line, dots;
} series;

typedef struct plot {
    const char *id, *title, *xlabel, *ylabel;
    bool xlog, ylog;
    series s[4];
    int ns;
    /* shaded x spans with labels (workload phases on the RSS plot) */
    const json_t *spans;
} plot;

static void add(series *s, double x, double y) {
    if (!isfinite(x) || !isfinite(y)) return;
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 64;
        s->x = realloc(s->x, s->cap * sizeof *s->x);
        s->y = realloc(s->y, s->cap * sizeof *s->y);
    }
    s->x[s->n] = x, s->y[s->n] = y, s->n++;
}

static void html_text(FILE *f, const char *s) {
    for (; s && *s; s++)
        switch (*s) {
        case '<':
            fputs("&lt;", f);
            break;
        case '>':
            fputs("&gt;", f);
            break;
        case '&':
            fputs("&amp;", f);
            break;
        case '"':
            fputs("&quot;", f);
            break;
        default:
            fputc(*s, f);
        }
}

/* ---- axes --------------------------------------------------------------------------- */

typedef struct axis {
    double lo, hi; /* in axis units (log10 of the value on log axes) */
    bool log;
} axis;

static double to_axis(const axis *a, double v) {
    return a->log ? log10(v) : v;
}

/* A "nice" step (1, 2 or 5 x 10^k) giving about n ticks over span. */
static double nice_step(double span, int n) {
    double raw = span / n, p = pow(10, floor(log10(raw))), m = raw / p;
    return p * (m < 1.5 ? 1 : m < 3.5 ? 2 : m < 7.5 ? 5 : 10);
}

static void fit(axis *a, const plot *p, bool x_axis) {
    double lo = INFINITY, hi = -INFINITY;
    for (int i = 0; i < p->ns; i++)
        for (int k = 0; k < p->s[i].n; k++) {
            double v = x_axis ? p->s[i].x[k] : p->s[i].y[k];
            if (a->log && v <= 0) continue;
            v = to_axis(a, v);
            lo = v < lo ? v : lo, hi = v > hi ? v : hi;
        }
    if (!a->log && !x_axis && lo > 0) lo = 0; /* linear y from zero: ratios read true */
    if (!(hi > lo)) lo -= a->log ? 0.5 : 1, hi += a->log ? 0.5 : 1;
    if (a->log) {
        lo = floor(lo * 2) / 2, hi = ceil(hi * 2) / 2;
    } else {
        double st = nice_step(hi - lo, 5);
        lo = floor(lo / st) * st, hi = ceil(hi / st) * st;
    }
    a->lo = lo, a->hi = hi;
}

static double px(const axis *a, double v) {
    return ML + (to_axis(a, v) - a->lo) / (a->hi - a->lo) * (W - ML - MR);
}
static double py(const axis *a, double v) {
    return H - MB - (to_axis(a, v) - a->lo) / (a->hi - a->lo) * (H - MT - MB);
}

static void label(char *b, size_t cap, double v) {
    double m = fabs(v);
    if (m >= 1e6)
        snprintf(b, cap, "%.3gM", v / 1e6);
    else if (m >= 1e4)
        snprintf(b, cap, "%.3gk", v / 1e3);
    else
        snprintf(b, cap, "%.4g", v);
}

/* Tick values: 1-2-5 steps, or on log axes the decades (and 2, 5 between
 * them when the range is short). */
static int ticks(const axis *a, double *t, int cap) {
    int n = 0;
    if (!a->log) {
        double st = nice_step(a->hi - a->lo, 5);
        for (double v = a->lo; v <= a->hi + st * 1e-9 && n < cap; v += st)
            t[n++] = fabs(v) < st * 1e-9 ? 0 : v;
        return n;
    }
    bool fine = a->hi - a->lo <= 2.01;
    for (int d = (int)floor(a->lo); d <= (int)ceil(a->hi) && n < cap; d++)
        for (int m = 1; m <= 5 && n < cap; m += (m == 1 ? 1 : 3)) {
            if (m > 1 && !fine) break;
            double v = m * pow(10, d), e = log10(v);
            if (e >= a->lo - 1e-9 && e <= a->hi + 1e-9) t[n++] = v;
        }
    return n;
}

static void svg_plot(FILE *f, const plot *p) {
    axis ax = {.log = p->xlog}, ay = {.log = p->ylog};
    fit(&ax, p, true);
    fit(&ay, p, false);
    int points = 0;
    for (int i = 0; i < p->ns; i++)
        points += p->s[i].n;
    fprintf(f,
            "<figure id=\"%s\"><svg class=\"plot\" xmlns=\"http://www.w3.org/2000/svg\" "
            "viewBox=\"0 0 %d %d\" width=\"%d\" height=\"%d\" role=\"img\" aria-label=\"",
            p->id, W, H, W, H);
    html_text(f, p->title);
    fprintf(f, "\">\n<rect class=\"bg\" x=\"0\" y=\"0\" width=\"%d\" height=\"%d\"/>\n", W, H);
    fprintf(f, "<text class=\"title\" x=\"%d\" y=\"20\">", ML);
    html_text(f, p->title);
    fprintf(f, "</text>\n");
    for (size_t i = 0; p->spans && i < json_array_size(p->spans); i++) {
        const json_t *s = json_array_get(p->spans, i);
        double a = json_number_value(json_object_get(s, "t_begin_s"));
        double b = json_number_value(json_object_get(s, "t_end_s"));
        if (b <= a || a < ax.lo || b > ax.hi + 1e-9) continue;
        double xa = px(&ax, a), xb = px(&ax, b);
        fprintf(f,
                "<rect class=\"span s%zu\" x=\"%.1f\" y=\"%d\" width=\"%.1f\" height=\"%d\"/>"
                "<text class=\"spanlabel\" x=\"%.1f\" y=\"%d\">",
                i % 2, xa, MT, xb - xa, H - MT - MB, xa + 3, MT + 12);
        html_text(f, json_string_value(json_object_get(s, "name")));
        fprintf(f, "</text>\n");
    }
    double t[64];
    char b[32];
    int n = ticks(&ax, t, 64);
    for (int i = 0; i < n; i++) {
        double x = px(&ax, t[i]);
        label(b, sizeof b, t[i]);
        fprintf(f,
                "<line class=\"grid\" x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\"/>"
                "<text class=\"tick\" x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%s</text>\n",
                x, MT, x, H - MB, x, H - MB + 16, b);
    }
    n = ticks(&ay, t, 64);
    for (int i = 0; i < n; i++) {
        double y = py(&ay, t[i]);
        label(b, sizeof b, t[i]);
        fprintf(f,
                "<line class=\"grid\" x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\"/>"
                "<text class=\"tick\" x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n",
                ML, y, W - MR, y, ML - 6, y + 4, b);
    }
    fprintf(f,
            "<line class=\"axis\" x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\"/>"
            "<line class=\"axis\" x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\"/>\n",
            ML, H - MB, W - MR, H - MB, ML, MT, ML, H - MB);
    fprintf(f, "<text class=\"label\" x=\"%d\" y=\"%d\" text-anchor=\"middle\">", (ML + W - MR) / 2,
            H - 32);
    html_text(f, p->xlabel);
    fprintf(f, "%s</text>\n", p->xlog ? " (log)" : "");
    fprintf(f,
            "<text class=\"label\" transform=\"translate(16 %d) rotate(-90)\" "
            "text-anchor=\"middle\">",
            (MT + H - MB) / 2);
    html_text(f, p->ylabel);
    fprintf(f, "%s</text>\n", p->ylog ? " (log)" : "");

    for (int i = 0; i < p->ns; i++) {
        const series *s = &p->s[i];
        if (s->line && s->n) {
            fprintf(f, "<path class=\"series\" fill=\"none\" stroke=\"%s\" d=\"", s->color);
            for (int k = 0; k < s->n; k++)
                fprintf(f, "%c%.1f %.1f", k ? 'L' : 'M', px(&ax, s->x[k]), py(&ay, s->y[k]));
            fprintf(f, "\"/>\n");
        }
        if (s->dots)
            for (int k = 0; k < s->n; k++)
                fprintf(f,
                        "<circle class=\"dot\" cx=\"%.1f\" cy=\"%.1f\" r=\"%.1f\" fill=\"%s\"/>\n",
                        px(&ax, s->x[k]), py(&ay, s->y[k]), s->line ? 3.0 : 2.2, s->color);
    }
    /* the legend: a row under the plot, where it can hide no data */
    double lx = ML;
    for (int i = 0; i < p->ns; i++) {
        const series *s = &p->s[i];
        char text[96];
        snprintf(text, sizeof text, "%s (%d)", s->name, s->count ? s->count : s->n);
        fprintf(f,
                "<rect x=\"%.0f\" y=\"%d\" width=\"10\" height=\"10\" fill=\"%s\"/>"
                "<text class=\"legend\" x=\"%.0f\" y=\"%d\">",
                lx, H - 18, s->color, lx + 15, H - 9);
        html_text(f, text);
        fprintf(f, "</text>\n");
        lx += 15 + 6.2 * strlen(text) + 18;
    }
    if (!points)
        fprintf(f,
                "<text class=\"nodata\" x=\"%d\" y=\"%d\" text-anchor=\"middle\">no data</text>\n",
                (ML + W - MR) / 2, (MT + H - MB) / 2);
    fprintf(f, "</svg></figure>\n");
    for (int i = 0; i < p->ns; i++)
        free(p->s[i].x), free(p->s[i].y);
}

/* ---- the plots ---------------------------------------------------------------------- */

static const char *const colors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd"};

/* An empirical CDF of v as a step line. */
static void cdf(series *s, double *v, int n) {
    bs_percentile(v, n, 50); /* sorts */
    s->count = n;
    for (int i = 0; i < n; i++) {
        add(s, v[i], (double)i / n);
        add(s, v[i], (double)(i + 1) / n);
    }
}

static double num(const json_t *o, const char *k) {
    const json_t *v = json_object_get(o, k);
    return json_is_number(v) ? json_number_value(v) : NAN;
}

static const char *str(const json_t *o, const char *k) {
    const char *s = json_string_value(json_object_get(o, k));
    return s ? s : "";
}

/* The CDF of a request field, one series per cache class. */
static void plot_cdf(FILE *f, const json_t *reqs, const char *field, const char *id,
                     const char *title, const char *xlabel) {
    static const char *const cls[] = {"cold", "ram", "ssd"};
    static const char *const names[] = {"cold", "RAM-cached", "SSD-restored"};
    plot p = {
        .id = id, .title = title, .xlabel = xlabel, .ylabel = "fraction of requests", .xlog = true};
    for (int c = 0; c < 3; c++) {
        double *v = malloc((json_array_size(reqs) + 1) * sizeof *v);
        int n = 0;
        size_t i;
        const json_t *r;
        json_array_foreach(reqs, i, r) {
            double x = num(r, field);
            if (strcmp(str(r, "workload"), "probe") && !strcmp(str(r, "cache"), cls[c]) && x > 0)
                v[n++] = x;
        }
        if (n) {
            series *s = &p.s[p.ns++];
            *s = (series){.name = names[c], .color = colors[c], .line = true};
            cdf(s, v, n);
        }
        free(v);
    }
    svg_plot(f, &p);
}

static void plot_sweep(FILE *f, const json_t *sweep) {
    plot p = {.id = "throughput",
              .title = "Aggregate decode throughput vs concurrency",
              .xlabel = "concurrent clients",
              .ylabel = "completion tokens/s (all clients)",
              .xlog = true,
              .ns = 1};
    p.s[0] = (series){.name = "aggregate tok/s", .color = colors[0], .line = true, .dots = true};
    size_t i;
    const json_t *lv;
    json_array_foreach(sweep, i, lv) add(&p.s[0], num(lv, "concurrency"), num(lv, "tok_s"));
    svg_plot(f, &p);

    plot q = {.id = "sweep-ttft",
              .title = "TTFT vs concurrency",
              .xlabel = "concurrent clients",
              .ylabel = "TTFT (ms)",
              .xlog = true,
              .ylog = true,
              .ns = 2};
    q.s[0] = (series){.name = "p50", .color = colors[0], .line = true, .dots = true};
    q.s[1] = (series){.name = "p90", .color = colors[1], .line = true, .dots = true};
    json_array_foreach(sweep, i, lv) {
        const json_t *t = json_object_get(lv, "ttft_ms");
        add(&q.s[0], num(lv, "concurrency"), num(t, "p50"));
        add(&q.s[1], num(lv, "concurrency"), num(t, "p90"));
    }
    svg_plot(f, &q);
}

static void plot_depth(FILE *f, const json_t *reqs, const json_t *bins) {
    plot p = {.id = "decode-depth",
              .title = "Decode speed vs context depth",
              .xlabel = "context depth (prompt tokens)",
              .ylabel = "decode tokens/s (per request)",
              .ns = 2};
    p.s[0] =
        (series){.name = "alone (depth workload)", .color = colors[1], .line = true, .dots = true};
    p.s[1] = (series){.name = "other requests, under load", .color = "#9bb7d4", .dots = true};
    size_t i;
    const json_t *r;
    (void)bins; /* the summary bins the same requests the line joins */
    json_array_foreach(reqs, i, r) {
        bool alone = !strcmp(str(r, "workload"), "depth");
        add(&p.s[alone ? 0 : 1], num(r, "prompt_tokens"), num(r, "decode_tps"));
    }
    svg_plot(f, &p);
}

static void plot_rss(FILE *f, const json_t *samples, const json_t *phases) {
    plot p = {.id = "rss",
              .title = "Server memory over the run",
              .xlabel = "time (s)",
              .ylabel = "resident set (MiB)",
              .ns = 1,
              .spans = phases};
    p.s[0] = (series){.name = "RSS", .color = colors[0], .line = true};
    size_t i;
    const json_t *s;
    json_array_foreach(samples, i, s) add(&p.s[0], num(s, "t_s"), num(s, "rss_mb"));
    svg_plot(f, &p);
    plot q = {.id = "kv",
              .title = "KV pages reserved by running requests",
              .xlabel = "time (s)",
              .ylabel = "pages",
              .ns = 1,
              .spans = phases};
    q.s[0] = (series){.name = "reserved", .color = colors[2], .line = true};
    json_array_foreach(samples, i, s) add(&q.s[0], num(s, "t_s"), num(s, "kv_pages_reserved"));
    svg_plot(f, &q);
}

/* ---- tables --------------------------------------------------------------------------- */

static void cell(FILE *f, double v, const char *fmt) {
    if (isfinite(v)) {
        fprintf(f, "<td>");
        fprintf(f, fmt, v);
        fprintf(f, "</td>");
    } else {
        fprintf(f, "<td class=\"na\">–</td>");
    }
}

static void workload_table(FILE *f, const json_t *sum) {
    fprintf(f, "<table><tr><th>workload</th><th>requests</th><th>failed</th><th>prompt tok</th>"
               "<th>cache hit</th><th>TTFT cold p50/p90/p99 (ms)</th>"
               "<th>TTFT RAM p50/p90/p99</th><th>TTFT SSD p50/p90/p99</th>"
               "<th>ITL p50/p99 (ms)</th><th>decode tok/s p50</th></tr>\n");
    const char *k;
    const json_t *w;
    const json_t *all = json_object_get(sum, "all");
    json_t *rows = json_deep_copy(json_object_get(sum, "workloads"));
    if (all) json_object_set(rows, "all", (json_t *)all);
    json_object_foreach(rows, k, w) {
        fprintf(f, "<tr%s><td>", strcmp(k, "all") ? "" : " class=\"total\"");
        html_text(f, k);
        fprintf(f, "</td>");
        cell(f, num(w, "requests"), "%.0f");
        cell(f, num(w, "failed"), "%.0f");
        cell(f, num(w, "prompt_tokens"), "%.0f");
        cell(f, 100 * num(w, "cache_hit_rate"), "%.1f%%");
        const json_t *tt = json_object_get(w, "ttft_ms");
        static const char *const cls[] = {"cold", "ram", "ssd"};
        for (int c = 0; c < 3; c++) {
            const json_t *d = json_object_get(tt, cls[c]);
            if (num(d, "n") > 0)
                fprintf(f, "<td>%.1f / %.1f / %.1f <small>(n=%.0f)</small></td>", num(d, "p50"),
                        num(d, "p90"), num(d, "p99"), num(d, "n"));
            else
                fprintf(f, "<td class=\"na\">–</td>");
        }
        const json_t *itl = json_object_get(w, "itl_ms");
        if (num(itl, "n") > 0)
            fprintf(f, "<td>%.2f / %.2f</td>", num(itl, "p50"), num(itl, "p99"));
        else
            fprintf(f, "<td class=\"na\">–</td>");
        cell(f, num(json_object_get(w, "decode_tps"), "p50"), "%.1f");
        fprintf(f, "</tr>\n");
    }
    json_decref(rows);
    fprintf(f, "</table>\n");
}

static void sweep_table(FILE *f, const json_t *sweep) {
    fprintf(f, "<table><tr><th>concurrency</th><th>requests</th><th>completion tokens</th>"
               "<th>wall (s)</th><th>aggregate tok/s</th><th>req/s</th><th>TTFT p50 (ms)</th>"
               "<th>TTFT p90 (ms)</th></tr>\n");
    size_t i;
    const json_t *lv;
    json_array_foreach(sweep, i, lv) {
        fprintf(f, "<tr>");
        cell(f, num(lv, "concurrency"), "%.0f");
        cell(f, num(lv, "requests"), "%.0f");
        cell(f, num(lv, "completion_tokens"), "%.0f");
        cell(f, num(lv, "wall_s"), "%.2f");
        cell(f, num(lv, "tok_s"), "%.1f");
        cell(f, num(lv, "req_s"), "%.2f");
        cell(f, num(json_object_get(lv, "ttft_ms"), "p50"), "%.1f");
        cell(f, num(json_object_get(lv, "ttft_ms"), "p90"), "%.1f");
        fprintf(f, "</tr>\n");
    }
    fprintf(f, "</table>\n");
}

static void request_table(FILE *f, const json_t *reqs) {
    fprintf(f,
            "<details><summary>All %zu requests (the JSON file has bodies and responses)"
            "</summary>\n<table class=\"reqs\"><tr><th>id</th><th>workload</th><th>phase</th>"
            "<th>user</th><th>turn</th><th>conc.</th><th>prompt</th><th>cached</th>"
            "<th>completion</th><th>finish</th><th>TTFT (ms)</th><th>total (ms)</th>"
            "<th>ITL (ms)</th><th>error</th></tr>\n",
            json_array_size(reqs));
    size_t i;
    const json_t *r;
    json_array_foreach(reqs, i, r) {
        fprintf(f, "<tr>");
        cell(f, num(r, "id"), "%.0f");
        fprintf(f, "<td>");
        html_text(f, str(r, "workload"));
        fprintf(f, "</td><td>");
        html_text(f, str(r, "phase"));
        fprintf(f, "</td>");
        cell(f, num(r, "user"), "%.0f");
        cell(f, num(r, "turn"), "%.0f");
        cell(f, num(r, "concurrency"), "%.0f");
        cell(f, num(r, "prompt_tokens"), "%.0f");
        cell(f, num(r, "cached_tokens"), "%.0f");
        cell(f, num(r, "completion_tokens"), "%.0f");
        fprintf(f, "<td>");
        html_text(f, str(r, "finish_reason"));
        fprintf(f, "</td>");
        cell(f, num(r, "ttft_ms"), "%.1f");
        cell(f, num(r, "e2e_ms"), "%.1f");
        cell(f, num(r, "itl_ms"), "%.2f");
        fprintf(f, "<td>");
        html_text(f, str(r, "error"));
        fprintf(f, "</td></tr>\n");
    }
    fprintf(f, "</table></details>\n");
}

static const char css[] =
    "body{font:14px/1.45 system-ui,sans-serif;margin:24px auto;max-width:1440px;color:#222;"
    "padding:0 16px}h1{font-size:22px}h2{font-size:17px;margin-top:28px;border-bottom:1px solid "
    "#ddd}table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ddd;padding:3px "
    "8px;text-align:right}th{background:#f4f6f8}td:first-child{text-align:left}tr.total{font-"
    "weight:600;background:#fafafa}.na{color:#aaa}.grid{display:flex;flex-wrap:wrap;gap:12px}"
    "figure{margin:0;border:1px solid #e4e4e4;border-radius:6px;background:#fff}svg.plot "
    "rect.bg{fill:#fff}svg.plot .grid{stroke:#eee}svg.plot .axis{stroke:#888}svg.plot "
    "text{font:11px system-ui,sans-serif;fill:#555}svg.plot .title{font-size:13px;font-weight:"
    "600;fill:#222}svg.plot .label{font-size:12px}svg.plot .series{stroke-width:2}svg.plot "
    ".span{fill:#f3f6fb}svg.plot .span.s1{fill:#eef7ee}svg.plot .spanlabel{font-size:10px;fill:"
    "#889}svg.plot .nodata{font-size:16px;fill:#c33}.notes li{color:#a35200}code{background:"
    "#f4f4f4;padding:1px 4px}table.reqs td{font-size:12px}";

int bs_report_html(const json_t *run, FILE *f) {
    const json_t *sum = json_object_get(run, "summary"), *reqs = json_object_get(run, "requests");
    if (!json_is_object(sum) || !json_is_array(reqs)) return -1;
    const json_t *srv = json_object_get(run, "server");
    fprintf(f, "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
               "<title>petrel bench serve: ");
    html_text(f, str(srv, "model_id"));
    fprintf(f, "</title>\n<style>%s</style></head><body>\n<h1>petrel bench serve: ", css);
    html_text(f, str(srv, "model_id"));
    fprintf(f, "</h1>\n<p>Run of %s, %.0f s, %zu requests; server: ", str(run, "created"),
            num(run, "duration_s"), json_array_size(reqs));
    html_text(f, str(srv, "address"));
    if (json_is_true(json_object_get(srv, "self_started"))) {
        fprintf(f, " <code>");
        html_text(f, json_string_value(json_object_get(srv, "bin")) ? str(srv, "bin") : "petrel");
        fprintf(f, " serve -m ");
        html_text(f, str(srv, "model"));
        size_t i;
        const json_t *a;
        json_array_foreach(json_object_get(srv, "args"), i, a) {
            fputc(' ', f);
            html_text(f, json_string_value(a));
        }
        fprintf(f, "</code>");
    }
    fprintf(f,
            "; context %.0f tokens; peak RSS %.1f MiB. Token counts are the server's "
            "<code>usage</code> (cached: <code>usage.prompt_tokens_details.cached_tokens"
            "</code>).</p>\n",
            num(srv, "n_ctx"), num(sum, "peak_rss_mb"));
    fprintf(f, "<p>A request counts as <i>cached</i> when at least half of its prompt came from "
               "the prefix cache; after a restart those are <i>SSD-restored</i>.</p>\n");
    const json_t *notes = json_object_get(run, "notes");
    if (json_array_size(notes)) {
        fprintf(f, "<ul class=\"notes\">\n");
        size_t i;
        const json_t *n;
        json_array_foreach(notes, i, n) {
            fprintf(f, "<li>");
            html_text(f, json_string_value(n));
            fprintf(f, "</li>\n");
        }
        fprintf(f, "</ul>\n");
    }
    fprintf(f, "<h2>Workloads</h2>\n");
    workload_table(f, sum);
    fprintf(f, "<h2>Time to first token and inter-token latency</h2><div class=\"grid\">\n");
    plot_cdf(f, reqs, "ttft_ms", "ttft", "TTFT distribution: cold vs cached prompts",
             "time to first token (ms)");
    plot_cdf(f, reqs, "itl_ms", "itl", "Inter-token latency distribution (per request mean)",
             "inter-token latency (ms)");
    fprintf(f, "</div>\n<h2>Throughput vs concurrency</h2>\n");
    sweep_table(f, json_object_get(sum, "sweep"));
    fprintf(f, "<div class=\"grid\">\n");
    plot_sweep(f, json_object_get(sum, "sweep"));
    fprintf(f, "</div>\n<h2>Decode speed by context depth</h2><div class=\"grid\">\n");
    plot_depth(f, reqs, json_object_get(sum, "decode_by_depth"));
    fprintf(f, "</div>\n<h2>Server memory</h2><div class=\"grid\">\n");
    plot_rss(f, json_object_get(run, "samples"), json_object_get(run, "phases"));
    fprintf(f, "</div>\n<h2>Requests</h2>\n");
    request_table(f, reqs);
    fprintf(f, "<h2>Configuration</h2><pre>");
    char *cfg = json_dumps(json_object_get(run, "config"), JSON_INDENT(1));
    html_text(f, cfg);
    free(cfg);
    fprintf(f, "</pre>\n</body></html>\n");
    return ferror(f) ? -1 : 0;
}
