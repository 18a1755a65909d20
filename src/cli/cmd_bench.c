/*
 * cmd_bench.c - `petrel bench`: prefill and decode speed, each against its
 * roofline measured in the same run.
 *
 * Decode is memory-bound: a step reads every weight matrix once plus the
 * KV cache up to its depth, so its floor is bytes / read bandwidth.  We
 * measure the machine's read bandwidth here, time real steps, and report
 * achieved/roofline.  Prefill is compute-bound: it is reported in tok/s and
 * GFLOP/s against the backend's measured peak for the multiply-adds that
 * format's prefill runs (compute_peak; f32 FMA or int8).  A fraction above
 * 1 means a probe is not a ceiling, and is flagged.  Bench feeds token ids
 * and never text, so it loads no tokenizer: any model that runs can be
 * measured, with or without one.
 */
#include <stdio.h>
#include <stdlib.h>

#include "cli/cli.h"
#include "cli/bench_serve.h"
#include "engine/bench.h"

static struct {
    const char *prompt_lens, *depths, *json, *parallel;
    int gen, reps, warmup, par_prompt, par_gen, max_seqs, reuse;
} b;

static const cli_opt bench_opts[] = {
    {"prompt-lens", 'p', CLI_STR, &b.prompt_lens, "L,L..", "prefill lengths (default 64,256,512)"},
    {"depths", 'd', CLI_STR, &b.depths, "D,D..", "decode context depths (default 0,512)"},
    {"gen", 'g', CLI_INT, &b.gen, "N", "decode steps timed per depth (default 32)"},
    {"reps", 'r', CLI_INT, &b.reps, "N", "repetitions; the best is kept (default 3)"},
    {"warmup", 0, CLI_INT, &b.warmup, "N",
     "untimed prefills and decodes before the timed ones (default 0; llama-bench does 1: the first "
     "pass over mmap'd weights pays their page faults)"},
    {"json", 'o', CLI_STR, &b.json, "FILE", "also write the results as JSON"},
    {"parallel", 'P', CLI_STR, &b.parallel, "N,N..",
     "also run N concurrent requests through the scheduler and report aggregate decode "
     "(like llama-batched-bench -npl; e.g. 1,8,32,64)"},
    {"parallel-prompt", 0, CLI_INT, &b.par_prompt, "N", "prompt tokens per request of --parallel (default 128)"},
    {"parallel-gen", 0, CLI_INT, &b.par_gen, "N", "tokens generated per request of --parallel (default 128)"},
    {"prefix-reuse", 0, CLI_INT, &b.reuse, "N",
     "also time a prompt of N tokens cold, again from the RAM prefix cache, and (with --kv-disk) "
     "from disk after reopening the engine, plus decode after it with the cache on and off"},
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

/* The context length the KV report quotes, a common long context. */
#define KV_REPORT_CTX 32768

/* KV by cache group: the full-attention layers pay for every position,
 * the sliding-window group only for its window.  At KV_REPORT_CTX: what
 * one sequence's pages hold once decoding has reached it (the window
 * group: ceil(window / page) + 1 pages, cost.c), and what the engine
 * reserves for it (the window pool: a window plus one step's rows). */
static void kv_groups_figures(const pt_engine *e, size_t kv_token, size_t *win, double *held,
                              double *reserved, double *all_global) {
    *win = pt_kv_window_bytes_per_token(&e->kv);
    int page = e->kv.cfg.page_size;
    double ctx = (double)((KV_REPORT_CTX + page - 1) / page * page);
    *held = pt_model_kv_resident(e->model, KV_REPORT_CTX, kv_token, page);
    *reserved = (double)(kv_token - *win) * ctx +
                (double)*win * page * pt_kv_window_pages_per_seq(&e->kv.cfg);
    *all_global = (double)kv_token * ctx;
}

static void kv_groups_report(const pt_engine *e, size_t kv_token) {
    size_t win;
    double held, reserved, all;
    kv_groups_figures(e, kv_token, &win, &held, &reserved, &all);
    if (!win) return;
    fprintf(stderr,
            "  KV by cache group: full attention %zu bytes per token of context; sliding window "
            "%zu bytes per position of its last %d\n"
            "  one sequence at %d tokens: %.1f MiB of KV held, %.1f MiB reserved with its window "
            "pool (%.1f MiB if every layer were full attention)\n",
            kv_token - win, win, e->kv.cfg.window, KV_REPORT_CTX, held / 1048576.0,
            reserved / 1048576.0, all / 1048576.0);
}

static json_t *kv_groups_json(const pt_engine *e, size_t kv_token) {
    size_t win;
    double held, reserved, all;
    kv_groups_figures(e, kv_token, &win, &held, &reserved, &all);
    return json_pack("{s:I, s:I, s:i, s:i, s:f, s:f, s:f}", "full_bytes_per_token",
                     (json_int_t)(kv_token - win), "window_bytes_per_position", (json_int_t)win,
                     "window", win ? e->kv.cfg.window : 0, "context", KV_REPORT_CTX,
                     "held_bytes_at_context", held, "reserved_bytes_at_context", reserved,
                     "all_global_bytes_at_context", all);
}

/* Bytes a decode step must read at a given depth: every matrix except the
 * embedding table (one row of it is read) and the idle experts, and the KV
 * cache so far (a window of it in sliding-window layers): cost.c. */
static double decode_bytes(const pt_engine *e, int depth) {
    return pt_model_step_bytes(e->model, depth, pt_kv_bytes_per_token(&e->kv.cfg));
}

/* Multiply-adds per token: every layer's projections (a MoE layer's router
 * and its active experts) and the output head, whatever their format. */
static double flops_per_token(const pt_model *m) {
    return pt_model_token_flops(m);
}

/* Times a prefill of len tokens on a fresh request (through the core).
 * Each repetition gets other tokens: the same prompt again would be served
 * from the prefix cache (measured: stories260K, 256 tokens, best of 3 was
 * 20x the single run). */
static int time_prefill(pt_engine *e, int len, int rep, double *sec, pt_err *err) {
    pt_bench_run r;
    if (pt_bench_requests(e, 1, len, 1, (uint64_t)len * 1000003u + (uint64_t)rep, &r, 0, err)) return -1;
    *sec = r.t_prefill;
    return 0;
}

/* Fills depth positions, then times gen decode steps: seconds per token;
 * *fill: seconds the fill (a prefill of depth + 1 tokens) took. */
static int time_decode(pt_engine *e, int depth, int gen, double *sec, double *fill, pt_err *err) {
    pt_bench_run r;
    if (pt_bench_requests(e, 1, depth + 1, gen + 1, 7, &r, 0, err)) return -1;
    *sec = r.t_decode / gen;
    *fill = r.t_prefill;
    return 0;
}

/* --prefix-reuse: TTFT of one prompt cold, from RAM, and from disk after
 * a restart (the engine closed and opened again: what a new process on the
 * same --kv-disk sees); decode after it with the cache on and off. */
static int run_reuse(pt_engine **ep, json_t *j, pt_err *err) {
    pt_engine *e = *ep;
    int n = b.reuse, vocab = e->model->cfg.vocab_size, cached[3] = {0};
    int32_t *prompt = pt_xmalloc(sizeof(int32_t) * (size_t)n);
    pt_rng rng;
    pt_rng_seed(&rng, (uint64_t)(pt_now() * 1e9)); /* a prompt no earlier run has cached */
    for (int i = 0; i < n; i++) prompt[i] = (int32_t)(pt_rng_next(&rng) % (uint64_t)vocab);
    double ttft[3] = {0}, dec_on = 0, dec_off = 0, t;
    int rc = -1;
    if (pt_bench_prompt(e, prompt, n, 2, &ttft[0], &t, &cached[0], err)) goto out;
    if (pt_bench_prompt(e, prompt, n, b.gen + 1, &ttft[1], &dec_on, &cached[1], err)) goto out;
    e->prefix_cache = false;
    if (pt_bench_prompt(e, prompt, n, b.gen + 1, &t, &dec_off, &cached[2], err)) goto out;
    e->prefix_cache = true;
    if (cli_margs.kv_disk) {
        pt_engine_close(e); /* writes the cached pages, as a server's exit does */
        *ep = e = NULL;
        if (cli_open_engine(ep)) {
            pt_fail(err, "reopening the engine failed");
            goto out;
        }
        e = *ep;
        if (pt_bench_prompt(e, prompt, n, 2, &ttft[2], &t, &cached[2], err)) goto out;
    }
    printf("\n%-10s %8s %12s %12s %10s\n", "reuse", "tokens", "TTFT ms", "cached", "vs cold");
    const char *rows[3] = {"cold", "RAM", "disk"};
    for (int i = 0; i < (cli_margs.kv_disk ? 3 : 2); i++)
        printf("%-10s %8d %12.2f %12d %9.1fx\n", rows[i], n, ttft[i] * 1e3, cached[i],
               ttft[i] > 0 ? ttft[0] / ttft[i] : 0.0);
    printf("decode after it: %.2f tok/s with the prefix cache, %.2f without\n",
           dec_on > 0 ? 1 / dec_on : 0.0, dec_off > 0 ? 1 / dec_off : 0.0);
    json_object_set_new(j, "prefix_reuse",
                        json_pack("{s:i, s:f, s:f, s:f, s:i, s:i, s:f, s:f}", "tokens", n,
                                  "ttft_cold_ms", ttft[0] * 1e3, "ttft_ram_ms", ttft[1] * 1e3,
                                  "ttft_disk_ms", ttft[2] * 1e3, "cached_ram", cached[1],
                                  "cached_disk", cached[2], "decode_tok_s_cache_on",
                                  dec_on > 0 ? 1 / dec_on : 0.0, "decode_tok_s_cache_off",
                                  dec_off > 0 ? 1 / dec_off : 0.0));
    rc = 0;
out:
    free(prompt);
    return rc;
}

/* --spec: speculative decode against plain decode at each depth. */
static int run_spec(pt_engine *e, const pt_spec_params *spec, const int *depths, int n_depths,
                    json_t *j, pt_err *err) {
    json_t *ja = json_array();
    json_object_set_new(j, "speculative", ja);
    /* the CPU-time speed-up: what the wall clock shows on an idle machine
     * (with --threads 1; worker threads that spin count too) */
    printf("\n%-10s %8s %12s %12s %9s %10s %12s %12s\n", "spec", "depth", "plain t/s", "spec t/s",
           "speed-up", "accepted", "tokens/step", "cpu speed-up");
    for (int i = 0; i < n_depths; i++) {
        pt_bench_spec_run r;
        int gen = PT_MAX(b.gen, 64);
        if (pt_bench_spec(e, depths[i] + 1, gen, spec, &r, err)) return -1;
        double acc = r.n_drafted ? (double)r.n_accepted / r.n_drafted : 0;
        /* tokens after the prefill's, per step after the prefill */
        double per_step = r.steps_spec > 1 ? (double)(r.n_generated - 1) / (r.steps_spec - 1) : 0;
        double cpu_x = r.cpu_tok_s_plain > 0 ? r.cpu_tok_s_spec / r.cpu_tok_s_plain : 0;
        printf("%-10s %8d %12.2f %12.2f %8.2fx %9.0f%% %12.2f %11.2fx\n", "", depths[i],
               r.tok_s_plain, r.tok_s_spec, r.tok_s_plain > 0 ? r.tok_s_spec / r.tok_s_plain : 0,
               100 * acc, per_step, cpu_x);
        json_array_append_new(ja, json_pack("{s:i, s:i, s:f, s:f, s:i, s:i, s:I}", "depth",
                                            depths[i], "k", spec->k, "tok_s_plain",
                                            r.tok_s_plain, "tok_s_spec", r.tok_s_spec,
                                            "drafted", r.n_drafted, "accepted", r.n_accepted,
                                            "steps", (json_int_t)r.steps_spec));
        json_object_set_new(json_array_get(ja, json_array_size(ja) - 1), "cpu_speedup",
                            json_real(cpu_x));
    }
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
    if (argc > 1 && strcmp(argv[1], "serve") == 0) return cmd_bench_serve(argc - 1, argv + 1);
    if (argc > 1 && strcmp(argv[1], "grammar") == 0) return cmd_bench_grammar(argc - 1, argv + 1);
    setvbuf(stdout, NULL, _IOLBF, 0); /* each row as it completes, into a pipe or a file too */
    cli_model_defaults();
    memset(&b, 0, sizeof b);
    b.prompt_lens = "64,256,512", b.depths = "0,512", b.gen = 32, b.reps = 3;
    b.par_prompt = 128, b.par_gen = 128;
    const cli_opt *tables[] = {bench_opts, cli_spec_opts, cli_model_opts, NULL};
    int n_pos, rc = cli_parse(argc, argv, "petrel bench [options]", tables, NULL, 0, &n_pos);
    if (rc) return rc < 0 ? 2 : 0;
    int lens[16], depths[16], pars[16], n_pars = 0;
    int n_lens = parse_list(b.prompt_lens, lens, 16), n_depths = parse_list(b.depths, depths, 16);
    if (n_lens < 0 || n_depths < 0 || b.gen < 1 || b.reps < 1 || b.warmup < 0) {
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
    pt_spec_params spec;
    float oracle_accept = 0;
    if (cli_spec_params(&spec, true, &oracle_accept)) return 2;
    spec.oracle_accept = oracle_accept;
    int need_ctx = 0;
    for (int i = 0; i < n_lens; i++) need_ctx = PT_MAX(need_ctx, lens[i] + 1);
    for (int i = 0; i < n_depths; i++) need_ctx = PT_MAX(need_ctx, depths[i] + b.gen + 2);
    for (int i = 0; spec.kind && i < n_depths; i++) /* run_spec generates 64 at least */
        need_ctx = PT_MAX(need_ctx, depths[i] + PT_MAX(b.gen, 64) + 2);
    if (n_pars) need_ctx = PT_MAX(need_ctx, b.par_prompt + b.par_gen + 2);
    if (b.reuse < 0) {
        fprintf(stderr, "petrel bench: --prefix-reuse takes a prompt length >= 1\n");
        return 2;
    }
    if (b.reuse) need_ctx = PT_MAX(need_ctx, b.reuse + b.gen + 2);
    if (cli_margs.ctx < need_ctx) cli_margs.ctx = need_ctx;

    pt_engine *e;
    cli_margs.no_tokenizer = true;
    if (cli_open_engine(&e)) return 1;
    const pt_model *m = e->model;
    /* a hybrid's layer 0 may be recurrent: its first matrix is another */
    const pt_weight *w0 = m->layers[0].wq.data ? &m->layers[0].wq : &m->layers[0].w_qkvz;
    char desc[256];
    pt_config_describe(&m->cfg, desc, sizeof desc);
    fprintf(stderr, "petrel bench: %s\n  weights %.1f MiB (%s), %s backend: %s\n", desc,
            m->weight_bytes / 1048576.0, pt_dtype_name(w0->dtype), e->be->name,
            e->be->detail ? e->be->detail : "");
    char kv_format[32];
    size_t kv_token = pt_kv_bytes_per_token(&e->kv.cfg);
    int kv_layers = 0;
    for (int l = 0; l < m->cfg.n_layers; l++) kv_layers += !pt_kv_layer_recurrent(&e->kv.cfg, l);
    pt_kv_format_name(&e->kv.cfg, kv_format, sizeof kv_format);
    fprintf(stderr, "  KV cache %s: %zu bytes per token (%.1f per token per layer and kv head)\n",
            kv_format, kv_token, (double)kv_token / PT_MAX(kv_layers, 1) / m->cfg.n_kv_heads);
    kv_groups_report(e, kv_token);
    if (e->kv.cfg.n_state_slots > 0)
        fprintf(stderr, "  recurrent state (f32): %.1f KiB per sequence over %d of %d layers, "
                        "whatever the depth\n",
                pt_kv_state_bytes(&e->kv.cfg) / 1024.0, m->cfg.n_layers - kv_layers,
                m->cfg.n_layers);
    double bw = e->be->ops->read_bandwidth(e->be), cpeak = 0;
    char peak_note[256] = "";
    if (e->be->ops->compute_peak)
        cpeak = e->be->ops->compute_peak(e->be, w0->dtype, peak_note, sizeof peak_note);
    fprintf(stderr, "  measured read bandwidth: %.2f GB/s\n", bw / 1e9);
    if (cpeak > 0) fprintf(stderr, "  measured compute peak: %.1f GOP/s (%s)\n", cpeak / 1e9, peak_note);
    fputc('\n', stderr);

    pt_err err = {{0}};
    json_t *j = json_pack("{s:s, s:s, s:s, s:I, s:s, s:s, s:s, s:i, s:f}", "model", cli_margs.model,
                          "config", desc, "weight_dtype", pt_dtype_name(w0->dtype),
                          "weight_bytes", (json_int_t)m->weight_bytes, "kv_type",
                          pt_dtype_name(e->kv.cfg.dtype), "backend", e->be->name,
                          "backend_detail", e->be->detail ? e->be->detail : "", "threads",
                          e->be->n_threads, "read_bandwidth_gbs", bw / 1e9);
    json_object_set_new(j, "kv_format", json_string(kv_format));
    json_object_set_new(j, "compute_peak_gops", json_real(cpeak / 1e9));
    json_object_set_new(j, "probe_note", json_string(peak_note));
    json_object_set_new(j, "kv_bytes_per_token", json_integer((json_int_t)kv_token));
    json_object_set_new(j, "kv_groups", kv_groups_json(e, kv_token));
    json_t *jp = json_array(), *jd = json_array();
    json_object_set_new(j, "prefill", jp);
    json_object_set_new(j, "decode", jd);

    printf("%-10s %8s %12s %12s %10s\n", "prefill", "tokens", "tok/s", "GFLOP/s", "of peak");
    for (int i = 0; i < n_lens; i++) {
        double best = 1e30, t;
        for (int r = 0; r < b.warmup; r++)
            if (time_prefill(e, lens[i], b.reps + r, &t, &err)) goto fail;
        for (int r = 0; r < b.reps; r++) {
            if (time_prefill(e, lens[i], r, &t, &err)) goto fail;
            if (t < best) best = t;
        }
        double tps = lens[i] / best, gflops = tps * flops_per_token(m) / 1e9;
        double frac = cpeak > 0 ? gflops * 1e9 / cpeak : 0;
        printf("%-10s %8d %12.1f %12.2f %9.1f%%%s\n", "", lens[i], tps, gflops, 100 * frac,
               frac > 1 ? "  (above the peak probe: not a ceiling)" : "");
        json_array_append_new(jp, json_pack("{s:i, s:f, s:f, s:f}", "tokens", lens[i], "tok_s", tps,
                                            "gflops", gflops, "fraction", frac));
    }
    printf("\n%-10s %8s %12s %12s %12s %10s %10s\n", "decode", "depth", "tok/s", "MB/token",
           "roofline", "fraction", "fill s");
    for (int i = 0; i < n_depths; i++) {
        double best = 1e30, t, fill, best_fill = 0;
        for (int r = 0; r < b.warmup; r++)
            if (time_decode(e, depths[i], b.gen, &t, &fill, &err)) goto fail;
        for (int r = 0; r < b.reps; r++) {
            if (time_decode(e, depths[i], b.gen, &t, &fill, &err)) goto fail;
            if (t < best) best = t, best_fill = fill;
        }
        double bytes = decode_bytes(e, depths[i]), roof = bw / bytes, tps = 1 / best;
        /* fill s: the prefill of the depth's context before the timed steps */
        printf("%-10s %8d %12.2f %12.2f %12.2f %9.1f%% %10.2f%s\n", "", depths[i], tps, bytes / 1e6,
               roof, 100 * tps / roof, best_fill,
               tps > roof ? "  (above the bandwidth probe: not a ceiling)" : "");
        json_array_append_new(
            jd, json_pack("{s:i, s:f, s:f, s:f, s:f, s:f, s:f}", "depth", depths[i], "tok_s", tps,
                          "bytes_per_token", bytes, "roofline_tok_s", roof, "fraction", tps / roof,
                          "fill_s", best_fill, "kv_held_bytes",
                          pt_model_kv_resident(e->model, depths[i], kv_token,
                                               e->kv.cfg.page_size)));
    }
    /* the launches of one decode step (issue 15: the fused step's count) */
    int kernels = e->be->ops->step_kernels ? e->be->ops->step_kernels(e->be) : 0;
    if (kernels > 0 && n_depths > 0) {
        printf("\nkernels per decode step: %d (%.1f per layer)\n", kernels,
               (double)kernels / m->cfg.n_layers);
        json_object_set_new(j, "step_kernels", json_integer(kernels));
    }
    if (n_pars && run_parallel(e, pars, n_pars, j, &err)) goto fail;
    if (b.reuse && run_reuse(&e, j, &err)) goto fail;
    if (spec.kind != PT_SPEC_OFF && run_spec(e, &spec, depths, n_depths, j, &err)) goto fail;
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
