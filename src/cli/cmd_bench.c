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
 * 1 means a probe is not a ceiling, and is flagged.
 */
#include <stdio.h>
#include <stdlib.h>

#include "cli/cli.h"

static struct {
    const char *prompt_lens, *depths, *json;
    int gen, reps;
} b;

static const cli_opt bench_opts[] = {
    {"prompt-lens", 'p', CLI_STR, &b.prompt_lens, "L,L..", "prefill lengths (default 64,256,512)"},
    {"depths", 'd', CLI_STR, &b.depths, "D,D..", "decode context depths (default 0,512)"},
    {"gen", 'g', CLI_INT, &b.gen, "N", "decode steps timed per depth (default 32)"},
    {"reps", 'r', CLI_INT, &b.reps, "N", "repetitions; the best is kept (default 3)"},
    {"json", 'o', CLI_STR, &b.json, "FILE", "also write the results as JSON"},
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

static void fill_tokens(pt_seq *s, int n, int vocab, pt_rng *rng) {
    for (int i = 0; i < n; i++) pt_seq_push(s, (int32_t)(pt_rng_next(rng) % (uint64_t)vocab));
}

/* Times a prefill of len tokens on a fresh sequence. */
static int time_prefill(pt_engine *e, int len, double *sec, pt_err *err) {
    pt_sampling sp = pt_sampling_default();
    sp.temperature = 0;
    sp.n_logprobs = -1;
    pt_seq s;
    pt_seq_init(&s, e, &sp);
    pt_rng rng;
    pt_rng_seed(&rng, (uint64_t)len);
    fill_tokens(&s, len, e->model->cfg.vocab_size, &rng);
    pt_sample_result r;
    double t0 = pt_now();
    int rc = pt_seq_prefill(e, &s, &r, err);
    *sec = pt_now() - t0;
    pt_seq_free(&s, e);
    return rc;
}

/* Fills depth positions, then times gen decode steps. */
static int time_decode(pt_engine *e, int depth, int gen, double *sec, pt_err *err) {
    pt_sampling sp = pt_sampling_default();
    sp.temperature = 0;
    sp.n_logprobs = -1;
    pt_seq s;
    pt_seq_init(&s, e, &sp);
    pt_rng rng;
    pt_rng_seed(&rng, 7);
    fill_tokens(&s, depth + 1, e->model->cfg.vocab_size, &rng);
    pt_sample_result r;
    int rc = pt_seq_prefill(e, &s, &r, err);
    double t0 = pt_now();
    for (int i = 0; i < gen && rc == 0; i++) {
        pt_seq_push(&s, r.id);
        rc = pt_seq_decode(e, &s, &r, err);
    }
    *sec = (pt_now() - t0) / gen;
    pt_seq_free(&s, e);
    return rc;
}

int cmd_bench(int argc, char **argv) {
    cli_model_defaults();
    memset(&b, 0, sizeof b);
    b.prompt_lens = "64,256,512", b.depths = "0,512", b.gen = 32, b.reps = 3;
    const cli_opt *tables[] = {bench_opts, cli_model_opts, NULL};
    int n_pos, rc = cli_parse(argc, argv, "petrel bench [options]", tables, NULL, 0, &n_pos);
    if (rc) return rc < 0 ? 2 : 0;
    int lens[16], depths[16];
    int n_lens = parse_list(b.prompt_lens, lens, 16), n_depths = parse_list(b.depths, depths, 16);
    if (n_lens < 0 || n_depths < 0 || b.gen < 1 || b.reps < 1) {
        fprintf(stderr, "petrel bench: bad --prompt-lens, --depths, --gen or --reps\n");
        return 2;
    }
    int need_ctx = 0;
    for (int i = 0; i < n_lens; i++) need_ctx = PT_MAX(need_ctx, lens[i] + 1);
    for (int i = 0; i < n_depths; i++) need_ctx = PT_MAX(need_ctx, depths[i] + b.gen + 2);
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
    double bw = e->be->ops->read_bandwidth(e->be), cpeak = 0;
    char peak_note[256] = "";
    if (e->be->ops->compute_peak)
        cpeak = e->be->ops->compute_peak(e->be, m->layers[0].wq.dtype, peak_note, sizeof peak_note);
    fprintf(stderr, "  measured read bandwidth: %.2f GB/s\n", bw / 1e9);
    if (cpeak > 0) fprintf(stderr, "  measured compute peak: %.1f GOP/s (%s)\n", cpeak / 1e9, peak_note);
    fputc('\n', stderr);

    pt_err err = {{0}};
    json_t *j = json_pack("{s:s, s:s, s:s, s:I, s:s, s:s, s:s, s:i, s:f}", "model", cli_margs.model,
                          "config", desc, "weight_dtype", pt_dtype_name(m->layers[0].wq.dtype),
                          "weight_bytes", (json_int_t)m->weight_bytes, "kv_type",
                          pt_dtype_name(e->kv.cfg.dtype), "backend", e->be->name,
                          "backend_detail", e->be->detail ? e->be->detail : "", "threads",
                          e->be->n_threads, "read_bandwidth_gbs", bw / 1e9);
    json_object_set_new(j, "kv_format", json_string(kv_format));
    json_object_set_new(j, "compute_peak_gops", json_real(cpeak / 1e9));
    json_object_set_new(j, "probe_note", json_string(peak_note));
    json_object_set_new(j, "kv_bytes_per_token", json_integer((json_int_t)kv_token));
    json_t *jp = json_array(), *jd = json_array();
    json_object_set_new(j, "prefill", jp);
    json_object_set_new(j, "decode", jd);

    printf("%-10s %8s %12s %12s %10s\n", "prefill", "tokens", "tok/s", "GFLOP/s", "of peak");
    for (int i = 0; i < n_lens; i++) {
        double best = 1e30, t;
        for (int r = 0; r < b.reps; r++) {
            if (time_prefill(e, lens[i], &t, &err)) goto fail;
            if (t < best) best = t;
        }
        double tps = lens[i] / best, gflops = tps * flops_per_token(m) / 1e9;
        double frac = cpeak > 0 ? gflops * 1e9 / cpeak : 0;
        printf("%-10s %8d %12.1f %12.2f %9.1f%%%s\n", "", lens[i], tps, gflops, 100 * frac,
               frac > 1 ? "  (above the peak probe: not a ceiling)" : "");
        json_array_append_new(jp, json_pack("{s:i, s:f, s:f, s:f}", "tokens", lens[i], "tok_s", tps,
                                            "gflops", gflops, "fraction", frac));
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
        printf("%-10s %8d %12.2f %12.2f %12.2f %9.1f%%%s\n", "", depths[i], tps, bytes / 1e6, roof,
               100 * tps / roof, tps > roof ? "  (above the bandwidth probe: not a ceiling)" : "");
        json_array_append_new(jd, json_pack("{s:i, s:f, s:f, s:f, s:f}", "depth", depths[i],
                                            "tok_s", tps, "bytes_per_token", bytes,
                                            "roofline_tok_s", roof, "fraction", tps / roof));
    }
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
