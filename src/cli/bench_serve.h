/*
 * bench_serve.h - what the parts of `petrel bench serve` share: the
 * command (cmd_bench_serve.c: workloads, server control, measurements, the
 * JSON) and the report (bench_report.c: the JSON turned into one offline
 * HTML page with inline SVG plots).
 *
 * The report reads only the JSON the command wrote, so a saved run can be
 * re-rendered (`petrel bench serve --report-from FILE.json --html OUT`).
 */
#ifndef PETREL_BENCH_SERVE_H
#define PETREL_BENCH_SERVE_H

#include <jansson.h>
#include <stdio.h>

int cmd_bench_serve(int argc, char **argv);

/* The p-th percentile (0..100) of v[0..n) by linear interpolation between
 * order statistics; sorts v.  NAN when n == 0. */
double bs_percentile(double *v, int n, double p);

/* Writes the HTML report of a run (the JSON document cmd_bench_serve
 * writes) to f.  Returns 0, or -1 when the document lacks its sections. */
int bs_report_html(const json_t *run, FILE *f);

#endif
