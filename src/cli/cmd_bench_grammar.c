/*
 * cmd_bench_grammar.c - `petrel bench grammar DIR --tokenizer FILE`:
 * MaskBench's method (JSONSchemaBench maskbench) on a folder of its files.
 *
 * Per file: compile the schema (TTFM = compile + first mask); for each
 * valid instance, tokenize its JSON text and walk the tokens, computing the
 * mask before each one (TBM per mask): a token outside the mask is a
 * validation error; for each invalid instance the matcher must refuse a
 * token or not accept at the end, else it is an invalidation error.  A
 * file passes when it compiles and every instance is judged right.
 * Instances are serialized compactly with UTF-8 kept (serde_json style).
 * Times are wall clock (MaskBench's measure) and this thread's CPU time
 * (what the engine costs when the core is shared); --slow US lists the
 * masks above US of CPU time in the --failures file.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "cli/cli.h"
#include "grammar/grammar.h"
#include "tokenizer/tokenizer.h"

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef struct { double *v; size_t n, cap; } dvec;

static void dv_push(dvec *d, double x) {
    if (d->n == d->cap) {
        d->cap = d->cap ? 2 * d->cap : 1024;
        d->v = realloc(d->v, d->cap * sizeof *d->v);
    }
    d->v[d->n++] = x;
}

static double pct(dvec *d, double p) {
    if (!d->n) return 0;
    size_t i = (size_t)(p * (double)(d->n - 1) + 0.5);
    return d->v[i];
}

/* This thread's CPU time: on a shared machine the wall clock also counts
 * the time other processes held the core, so both are reported. */
static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

int cmd_bench_grammar(int argc, char **argv) {
    const char *dir = NULL, *tokp = NULL, *failures = NULL;
    int limit = -1, stride = 1;
    double slow_us = -1; /* --slow US: list masks slower than this (--failures) */
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--tokenizer") && i + 1 < argc) tokp = argv[++i];
        else if (!strcmp(argv[i], "--limit") && i + 1 < argc) limit = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--stride") && i + 1 < argc) stride = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--failures") && i + 1 < argc) failures = argv[++i];
        else if (!strcmp(argv[i], "--slow") && i + 1 < argc) slow_us = atof(argv[++i]);
        else if (!dir && argv[i][0] != '-') dir = argv[i];
        else {
            fprintf(stderr, "usage: petrel bench grammar DIR --tokenizer tokenizer.json [--limit N] [--stride K] "
                            "[--failures FILE [--slow US]]\n");
            return 2;
        }
    }
    if (!dir || !tokp) {
        fprintf(stderr, "usage: petrel bench grammar DIR --tokenizer tokenizer.json\n");
        return 2;
    }
    pt_err err = {{0}};
    pt_tokenizer *tok;
    if (pt_tokenizer_load_json(&tok, tokp, NULL, &err) < 0) {
        fprintf(stderr, "petrel bench grammar: %s\n", err.msg);
        return 1;
    }
    pt_gvocab *voc = pt_gvocab_from_tokenizer(tok);
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr, "petrel bench grammar: cannot open %s\n", dir);
        return 1;
    }
    char **files = NULL;
    size_t nf = 0, capf = 0;
    for (struct dirent *e; (e = readdir(d));) {
        size_t l = strlen(e->d_name);
        if (l < 6 || strcmp(e->d_name + l - 5, ".json")) continue;
        if (nf == capf) files = realloc(files, (capf = capf ? 2 * capf : 1024) * sizeof *files);
        files[nf++] = pt_xstrdup(e->d_name);
    }
    closedir(d);
    qsort(files, nf, sizeof *files, cmp_str);
    if (stride > 1) { /* a deterministic sample: every stride-th file */
        size_t k = 0;
        for (size_t i = 0; i < nf; i++) {
            if (i % (size_t)stride == 0) files[k++] = files[i];
            else free(files[i]);
        }
        nf = k;
    }
    if (limit >= 0 && (size_t)limit < nf) nf = (size_t)limit;
    FILE *ff = failures ? fopen(failures, "w") : NULL;
    uint32_t *mask = pt_xmalloc((size_t)(pt_gvocab_n_vocab(voc) + 31) / 32 * 4);
    long passing = 0, compile_err = 0, val_err = 0, inval_err = 0, n_tests = 0, n_tokens = 0;
    dvec tbm = {0}, ttfm = {0}, tbm_cpu = {0}, ttfm_cpu = {0};
    for (size_t fi = 0; fi < nf; fi++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, files[fi]);
        json_error_t je;
        json_t *doc = json_load_file(path, JSON_DECODE_ANY, &je);
        if (!doc) continue;
        json_t *schema = json_object_get(doc, "schema"), *tests = json_object_get(doc, "tests");
        double t0 = pt_now(), c0 = cpu_now();
        pt_grammar *g;
        if (pt_grammar_from_schema(&g, schema, &err) < 0) {
            compile_err++;
            if (ff) fprintf(ff, "%s\tcompile\t%s\n", files[fi], err.msg);
            json_decref(doc);
            continue;
        }
        pt_gmatcher *m = pt_gmatcher_new(g, voc);
        pt_gmatcher_mask(m, mask);
        dv_push(&ttfm, (pt_now() - t0) * 1e6);
        dv_push(&ttfm_cpu, (cpu_now() - c0) * 1e6);
        bool pass = true;
        size_t ti;
        json_t *t;
        json_array_foreach(tests, ti, t) {
            bool valid = json_is_true(json_object_get(t, "valid"));
            char *text = json_dumps(json_object_get(t, "data"), JSON_ENCODE_ANY | JSON_COMPACT);
            int32_t *ids;
            size_t n_ids;
            if (!text || pt_tokenize(tok, text, strlen(text), false, false, &ids, &n_ids, &err) < 0) {
                free(text);
                continue;
            }
            n_tests++;
            pt_gmatcher_reset(m);
            bool ok = true;
            size_t k = 0;
            for (; k < n_ids; k++) {
                double s = pt_now(), cs = cpu_now();
                pt_gmatcher_mask(m, mask);
                double us = (pt_now() - s) * 1e6, cpu_us = (cpu_now() - cs) * 1e6;
                dv_push(&tbm, us);
                dv_push(&tbm_cpu, cpu_us);
                if (ff && slow_us >= 0 && cpu_us > slow_us)
                    fprintf(ff, "%s\tslow\ttest %zu token %zu\t%.0f us CPU\n", files[fi], ti, k, cpu_us);
                n_tokens++;
                int32_t id = ids[k];
                bool in_mask = (mask[id >> 5] >> (id & 31)) & 1;
                bool acc = pt_gmatcher_accept(m, id);
                if (in_mask != acc && ff)
                    fprintf(ff, "%s\tBUG mask/accept disagree at token %zu\n", files[fi], k);
                if (!acc) {
                    ok = false;
                    break;
                }
            }
            if (ok && !pt_gmatcher_is_accepting(m)) ok = false;
            if (valid && !ok) {
                val_err++;
                pass = false;
                if (ff) fprintf(ff, "%s\tvalidation\ttest %zu token %zu\t%.200s\n", files[fi], ti, k, text);
            } else if (!valid && ok) {
                inval_err++;
                pass = false;
                if (ff) fprintf(ff, "%s\tinvalidation\ttest %zu\t%.200s\n", files[fi], ti, text);
            }
            free(ids);
            free(text);
        }
        passing += pass;
        if ((fi + 1) % 250 == 0) /* progress, for long runs */
            fprintf(stderr, "%zu/%zu files: passing %ld, compile %ld, validation %ld, invalidation %ld\n",
                    fi + 1, nf, passing, compile_err, val_err, inval_err);
        pt_gmatcher_free(m);
        pt_grammar_free(g);
        json_decref(doc);
    }
    qsort(tbm.v, tbm.n, sizeof *tbm.v, cmp_double);
    qsort(ttfm.v, ttfm.n, sizeof *ttfm.v, cmp_double);
    qsort(tbm_cpu.v, tbm_cpu.n, sizeof *tbm_cpu.v, cmp_double);
    qsort(ttfm_cpu.v, ttfm_cpu.n, sizeof *ttfm_cpu.v, cmp_double);
    printf("files %zu, tests %ld, tokens %ld\n", nf, n_tests, n_tokens);
    printf("| metric | Petrel |\n|---|---:|\n");
    printf("| passing | %ld (%.1f%%) |\n", passing, nf ? 100.0 * (double)passing / (double)nf : 0);
    printf("| compile error | %ld |\n| validation error | %ld |\n| invalidation error | %ld |\n",
           compile_err, val_err, inval_err);
    printf("| TBM p50 / p95 / p99 (us) | %.0f / %.0f / %.0f |\n", pct(&tbm, .5), pct(&tbm, .95),
           pct(&tbm, .99));
    printf("| TTFM p50 / p99 (us) | %.0f / %.0f |\n", pct(&ttfm, .5), pct(&ttfm, .99));
    printf("| TBM p50 / p95 / p99, thread CPU time (us) | %.0f / %.0f / %.0f |\n", pct(&tbm_cpu, .5),
           pct(&tbm_cpu, .95), pct(&tbm_cpu, .99));
    printf("| TTFM p50 / p99, thread CPU time (us) | %.0f / %.0f |\n", pct(&ttfm_cpu, .5), pct(&ttfm_cpu, .99));
    if (ff) fclose(ff);
    for (size_t i = 0; i < nf; i++) free(files[i]);
    free(files);
    free(mask);
    free(tbm.v);
    free(ttfm.v);
    free(tbm_cpu.v);
    free(ttfm_cpu.v);
    pt_gvocab_free(voc);
    pt_tokenizer_free(tok);
    return 0;
}
