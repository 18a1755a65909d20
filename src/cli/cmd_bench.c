/*
 * cmd_bench.c - `petrel bench`: prefill and decode speed, each against its
 * roofline measured in the same run.
 *
 * Decode is memory-bound: a step reads every weight matrix once plus the
 * KV cache up to its depth, so its floor is bytes / read bandwidth.  We
 * measure the machine's read bandwidth here, time real steps, and report
 * achieved/roofline.  Prefill is reported in tok/s and GFLOP/s.
 */
#include <stdio.h>
#include <stdlib.h>

#include "cli/cli.h"
#include "engine/bench.h"

static struct {
    const char *prompt_lens, *depths, *json, *parallel;
    int gen, reps, par_prompt, par_gen, max_seqs;
} b;

static const cli_opt bench_opts[] = {
    {"prompt-lens", 'p', CLI_STR, &b.prompt_lens, "L,L..", "prefill lengths (default 64,256,512)"},
    {"depths", 'd', CLI_STR, &b.depths, "D,D..", "decode context depths (default 0,512)"},
    {"gen", 'g', CLI_INT, &b.gen, "N", "decode steps timed per depth (default 32)"},
    {"reps", 'r', CLI_INT, &b.reps, "N", "repetitions; the best is kept (default 3)"},
    {"json", 'o', CLI_STR, &b.json, "FILE", "also write the results as JSON"},
    {"parallel", 'P', CLI_STR, &b.parallel, "N,N..",
     "also run N concurrent requests through the scheduler and report aggregate decode "
     "(like llama-batched-bench -npl; e.g. 1,8,32,64)"},
    {"parallel-prompt", 0, CLI_INT, &b.par_prompt, "N", "prompt tokens per request of --parallel (default 128)"},
    {"parallel-gen", 0, CLI_INT, &b.par_gen, "N", "tokens generated per request of --parallel (default 128)"},
    {"max-seqs", 0, CLI_INT, &b.max_seqs, "N", "requests running at once in --parallel runs (default: all)"},
    {NULL, 0, 0, NULL, NULL, NULL},
};

static int parse_list(const char *s, int *out, int max) {
    int n = 0;
    while (*s && n < max) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 0 || v > 1 << 20) return -1;
        out[n++] = (int)v;
        s = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') return -1;
    }
    return n;
}

/* Bytes a decode step must read at a given depth: every matrix except the
 * embedding table (one row of it is read), and the KV cache so far. */
static double decode_bytes(const pt_engine *e, int depth) {
    const pt_model *m = e->model;
    double w = (double)m->weight_bytes;
    if (!m->cfg.tied_embeddings) w -= (double)m->tok_embd.nbytes;
    return w + (double)depth * (double)pt_kv_bytes_per_token(&e->kv.cfg);
}

/* Multiply-adds per token are the matrix parameters (every layer's
 * projections and the output head), whatever their storage format. */
static double flops_per_token(const pt_model *m) {
    const pt_model_config *c = &m->cfg;
    double q = (double)c->n_heads * c->head_dim, kv = (double)c->n_kv_heads * c->head_dim;
    double layer = c->dim * (q + 2 * kv) + q * c->dim + 3.0 * c->dim * c->ffn_dim;
    return 2.0 * (layer * c->n_layers + (double)c->vocab_size * c->dim);
}

/* Times a prefill of len tokens on a fresh request (through the core). */
static int time_prefill(pt_engine *e, int len, double *sec, pt_err *err) {
    pt_bench_run r;
    if (pt_bench_requests(e, 1, len, 1, (uint64_t)len, &r, 0, err)) return -1;
    *sec = r.t_prefill;
    return 0;
}

/* Fills depth positions, then times gen decode steps: seconds per token. */
static int time_decode(pt_engine *e, int depth, int gen, double *sec, pt_err *err) {
    pt_bench_run r;
    if (pt_bench_requests(e, 1, depth + 1, gen + 1, 7, &r, 0, err)) return -1;
    *sec = r.t_decode / gen;
    return 0;
}

/* N concurrent requests through the scheduler, for each N of --parallel. */
static int run_parallel(pt_engine *e, const int *ns, int n_ns, json_t *j, pt_err *err) {
    json_t *ja = json_array();
    json_object_set_new(j, "parallel", ja);
    printf("\n%-10s %8s %8s %12s %12s %12s %14s\n", "parallel", "seqs", "pp+tg", "prefill t/s",
           "decode t/s", "per seq t/s", "host ms/step");
    for (int i = 0; i < n_ns; i++) {
        int n = ns[i], need = n * (b.par_prompt + b.par_gen + 1);
        if (!e->kv_budgeted && e->kv.cfg.n_pages * e->kv.cfg.page_size < need &&
            pt_engine_kv_init(e, need, err))
            return -1;
        pt_bench_run r;
        if (pt_bench_requests(e, n, b.par_prompt, b.par_gen, 11, &r, b.max_seqs, err)) return -1;
        double host_ms = r.timing.n_steps ? 1e3 * r.timing.t_host / r.timing.n_steps : 0;
        printf("%-10s %8d %4d+%-3d %12.1f %12.1f %12.2f %14.3f\n", "", n, b.par_prompt, b.par_gen,
               r.prefill_tok_s, r.decode_tok_s, r.decode_tok_s / n, host_ms);
        json_array_append_new(
            ja, json_pack("{s:i, s:i, s:i, s:f, s:f, s:f, s:I, s:f, s:f, s:f}", "seqs", n,
                          "prompt", b.par_prompt, "gen", b.par_gen, "prefill_tok_s",
                          r.prefill_tok_s, "decode_tok_s", r.decode_tok_s, "t_decode",
                          r.t_decode, "steps", (json_int_t)r.timing.n_steps, "host_s",
                          r.timing.t_host, "forward_s", r.timing.t_forward, "sample_s",
                          r.timing.t_sample));
    }
    return 0;
}

int cmd_bench(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "grammar")) return cmd_bench_grammar(argc - 1, argv + 1);
    cli_model_defaults();
    memset(&b, 0, sizeof b);
    b.prompt_lens = "64,256,512", b.depths = "0,512", b.gen = 32, b.reps = 3;
    b.par_prompt = 128, b.par_gen = 128;
    const cli_opt *tables[] = {bench_opts, cli_model_opts, NULL};
    int n_pos, rc = cli_parse(argc, argv, "petrel bench [options]", tables, NULL, 0, &n_pos);
    if (rc) return rc < 0 ? 2 : 0;
    int lens[16], depths[16], pars[16], n_pars = 0;
    int n_lens = parse_list(b.prompt_lens, lens, 16), n_depths = parse_list(b.depths, depths, 16);
    if (n_lens < 0 || n_depths < 0 || b.gen < 1 || b.reps < 1) {
        fprintf(stderr, "petrel bench: bad --prompt-lens, --depths, --gen or --reps\n");
        return 2;
    }
    if (b.parallel && ((n_pars = parse_list(b.parallel, pars, 16)) <= 0 || b.par_prompt < 1 ||
                       b.par_gen < 2 || b.max_seqs < 0)) {
        fprintf(stderr, "petrel bench: --parallel takes counts like 1,8,32,64 (each >= 1); "
                        "--parallel-prompt >= 1, --parallel-gen >= 2\n");
        return 2;
    }
    for (int i = 0; i < n_pars; i++)
        if (pars[i] < 1) {
            fprintf(stderr, "petrel bench: --parallel counts must be >= 1\n");
            return 2;
        }
    int need_ctx = 0;
    for (int i = 0; i < n_lens; i++) need_ctx = PT_MAX(need_ctx, lens[i] + 1);
    for (int i = 0; i < n_depths; i++) need_ctx = PT_MAX(need_ctx, depths[i] + b.gen + 2);
    if (n_pars) need_ctx = PT_MAX(need_ctx, b.par_prompt + b.par_gen + 2);
    if (cli_margs.ctx < need_ctx) cli_margs.ctx = need_ctx;

    pt_engine *e;
    if (cli_open_engine(&e)) return 1;
    const pt_model *m = e->model;
    char desc[256];
    pt_config_describe(&m->cfg, desc, sizeof desc);
    fprintf(stderr, "petrel bench: %s\n  weights %.1f MiB (%s), %s backend: %s\n", desc,
            m->weight_bytes / 1048576.0, pt_dtype_name(m->layers[0].wq.dtype), e->be->name,
            e->be->detail ? e->be->detail : "");
    char kv_format[32];
    size_t kv_token = pt_kv_bytes_per_token(&e->kv.cfg);
    pt_kv_format_name(&e->kv.cfg, kv_format, sizeof kv_format);
    fprintf(stderr, "  KV cache %s: %zu bytes per token (%.1f per token per layer and kv head)\n",
            kv_format, kv_token, (double)kv_token / m->cfg.n_layers / m->cfg.n_kv_heads);
    double bw = e->be->ops->read_bandwidth(e->be);
    fprintf(stderr, "  measured read bandwidth: %.2f GB/s\n\n", bw / 1e9);

    pt_err err = {{0}};
    json_t *j = json_pack("{s:s, s:s, s:s, s:I, s:s, s:s, s:s, s:i, s:f}", "model", cli_margs.model,
                          "config", desc, "weight_dtype", pt_dtype_name(m->layers[0].wq.dtype),
                          "weight_bytes", (json_int_t)m->weight_bytes, "kv_type",
                          pt_dtype_name(e->kv.cfg.dtype), "backend", e->be->name,
                          "backend_detail", e->be->detail ? e->be->detail : "", "threads",
                          e->be->n_threads, "read_bandwidth_gbs", bw / 1e9);
    json_object_set_new(j, "kv_format", json_string(kv_format));
    json_object_set_new(j, "kv_bytes_per_token", json_integer((json_int_t)kv_token));
    json_t *jp = json_array(), *jd = json_array();
    json_object_set_new(j, "prefill", jp);
    json_object_set_new(j, "decode", jd);

    printf("%-10s %8s %12s %12s\n", "prefill", "tokens", "tok/s", "GFLOP/s");
    for (int i = 0; i < n_lens; i++) {
        double best = 1e30, t;
        for (int r = 0; r < b.reps; r++) {
            if (time_prefill(e, lens[i], &t, &err)) goto fail;
            if (t < best) best = t;
        }
        double tps = lens[i] / best, gflops = tps * flops_per_token(m) / 1e9;
        printf("%-10s %8d %12.1f %12.2f\n", "", lens[i], tps, gflops);
        json_array_append_new(jp, json_pack("{s:i, s:f, s:f}", "tokens", lens[i], "tok_s", tps,
                                            "gflops", gflops));
    }
    printf("\n%-10s %8s %12s %12s %12s %10s\n", "decode", "depth", "tok/s", "MB/token",
           "roofline", "fraction");
    for (int i = 0; i < n_depths; i++) {
        double best = 1e30, t;
        for (int r = 0; r < b.reps; r++) {
            if (time_decode(e, depths[i], b.gen, &t, &err)) goto fail;
            if (t < best) best = t;
        }
        double bytes = decode_bytes(e, depths[i]), roof = bw / bytes, tps = 1 / best;
        printf("%-10s %8d %12.2f %12.2f %12.2f %9.1f%%\n", "", depths[i], tps, bytes / 1e6, roof,
               100 * tps / roof);
        json_array_append_new(jd, json_pack("{s:i, s:f, s:f, s:f, s:f}", "depth", depths[i],
                                            "tok_s", tps, "bytes_per_token", bytes,
                                            "roofline_tok_s", roof, "fraction", tps / roof));
    }
    if (n_pars && run_parallel(e, pars, n_pars, j, &err)) goto fail;
    /* The bandwidth probe's buffer is freed by now: current RSS is the
     * model's own footprint (weights touched + KV pool + workspace). */
    double rss = pt_current_rss() / 1048576.0, peak = pt_peak_rss() / 1048576.0;
    printf("\nresident memory: %.1f MiB (peak %.1f MiB, including the bandwidth probe)\n", rss,
           peak);
    json_object_set_new(j, "rss_mib", json_real(rss));
    json_object_set_new(j, "peak_rss_mib", json_real(peak));
    if (b.json && json_dump_file(j, b.json, JSON_INDENT(1))) {
        fprintf(stderr, "petrel bench: cannot write %s\n", b.json);
        json_decref(j);
        pt_engine_close(e);
        return 1;
    }
    json_decref(j);
    pt_engine_close(e);
    return 0;
fail:
    fprintf(stderr, "petrel bench: %s\n", err.msg);
    json_decref(j);
    pt_engine_close(e);
    return 1;
}
