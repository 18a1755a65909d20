/*
 * cmd_convert.c - `petrel convert SRC DST`: a full-precision model (Hugging
 * Face directory, or a GGUF file of the Llama family) to an MLX-layout
 * affine-quantized directory.
 *
 * The work is src/quant's (convert.c writes, bpw.c allocates); this file
 * decides the plan and measures:
 *   - uniform: every quantizable matrix at --bits / --group-size;
 *   - --mixed-precision: embeddings, head and the sensitive v_proj /
 *     down_proj layers at --high-bits;
 *   - --target-bpw X: each matrix alone is quantized at each candidate
 *     width and the KL divergence from the full-precision model on the
 *     calibration text is measured; bpw.c then picks widths under the
 *     budget;
 *   - --eval TEXT: afterwards, perplexity of both models and their KL.
 * DST is staged (staged_dir.h): written in a hidden sibling directory and
 * renamed into place only when everything, --eval included, succeeded; an
 * interrupted run leaves nothing behind.
 * Measuring runs the model through the engine.  A model without a tokenizer
 * (test fixtures) is measured on token ids taken from the text's bytes.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/progress.h"
#include "cli/cli.h"
#include "cli/staged_dir.h"
#include "engine/runner.h"
#include "eval/eval.h"
#include "quant/bpw.h"
#include "quant/convert.h"

static struct {
    int bits, group_size, high_bits, threads, window, calib_tokens;
    float target_bpw;
    bool mixed, force;
    const char *scale_dtype, *calib, *eval, *json, *candidates;
} cv;

static const cli_opt convert_opts[] = {
    {"bits", 'q', CLI_INT, &cv.bits, "B", "bits per weight: 2, 3, 4, 5, 6, 8 (default 4)"},
    {"group-size", 'g', CLI_INT, &cv.group_size, "G", "weights per scale and bias: 32, 64, 128 (default 64)"},
    {"mixed-precision", 0, CLI_FLAG, &cv.mixed, NULL,
     "embeddings, head and sensitive layers (v_proj, down_proj of edge layers) at --high-bits"},
    {"high-bits", 0, CLI_INT, &cv.high_bits, "B", "bits of the kept layers (default 6, or 8 if --bits >= 6)"},
    {"target-bpw", 0, CLI_FLOAT, &cv.target_bpw, "X",
     "choose bits per matrix by measured KL under X bits per weight (scales included)"},
    {"calib", 0, CLI_STR, &cv.calib, "TEXT", "calibration text for --target-bpw (default: --eval's)"},
    {"calib-tokens", 0, CLI_INT, &cv.calib_tokens, "N", "tokens of it to use (default 512)"},
    {"candidates", 0, CLI_STR, &cv.candidates, "B,B..", "widths --target-bpw may pick (default 2,3,4,5,6,8)"},
    {"scale-dtype", 0, CLI_STR, &cv.scale_dtype, "T", "scales and biases: f16, bf16, f32 (default: bf16 for bf16 sources, else f16)"},
    {"eval", 0, CLI_STR, &cv.eval, "TEXT", "afterwards: perplexity of both models and their KL on TEXT"},
    {"window", 'w', CLI_INT, &cv.window, "N", "evaluation window in tokens (default 256)"},
    {"json", 'o', CLI_STR, &cv.json, "FILE", "write the plan, sizes and measurements as JSON"},
    {"threads", 't', CLI_INT, &cv.threads, "N", "threads (default: one per core)"},
    {"force", 'f', CLI_FLAG, &cv.force, NULL, "replace DST if it exists"},
    {NULL, 0, 0, NULL, NULL, NULL},
};

/* ---- an engine for measuring: the model and a KV cache, no tokenizer ---- */

static int probe_open(pt_engine **out, const char *path, int n_ctx, pt_err *err) {
    pt_engine *e = pt_xcalloc(1, sizeof *e);
    *out = e;
    if (!(e->be = pt_backend_open("cpu", cv.threads, "auto", err))) return -1;
    pt_model_opts mo = {.backend = e->be, .max_batch = n_ctx};
    if (pt_model_load(&e->model, path, &mo, err)) return -1;
    e->n_ctx = n_ctx;
    if (pt_model_kv_init(e->model, &e->kv, n_ctx, PT_F32, NULL, err)) return -1;
    e->runner = pt_xmalloc(sizeof *e->runner);
    pt_runner_init(e->runner, e);
    return 0;
}

/* The text as token ids: the source's tokenizer if it has one, else one id
 * per byte (modulo the vocabulary), which any model can score. */
static int text_ids(const pt_model_file *src, int vocab, const char *path, int max, int32_t **ids,
                    int *n, bool *bytes, pt_err *err) {
    char *text;
    size_t len, nn = 0;
    if (pt_read_file(path, (size_t)64 << 20, &text, &len, err)) return -1;
    pt_tokenizer *tok = NULL;
    pt_err terr;
    *bytes = !src || pt_tokenizer_load(&tok, src, &terr) != 0;
    int rc = 0;
    if (!*bytes) {
        rc = pt_tokenize(tok, text, len, true, false, ids, &nn, err);
        pt_tokenizer_free(tok);
    } else {
        *ids = pt_xmalloc(sizeof(int32_t) * (len ? len : 1));
        for (size_t i = 0; i < len; i++) (*ids)[i] = (int32_t)((uint8_t)text[i] % (unsigned)vocab);
        nn = len;
    }
    free(text);
    *n = (int)PT_MIN(nn, (size_t)max);
    return rc;
}

/* ---- the source -------------------------------------------------------------------- */

/* config.json for a GGUF source, from what the registry read. */
static json_t *config_of_gguf(const pt_model_config *c) {
    json_t *j = json_pack("{s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:f, s:b, s:s}",
                          "model_type", c->arch, "hidden_size", c->dim, "num_hidden_layers",
                          c->n_layers, "num_attention_heads", c->n_heads, "num_key_value_heads",
                          c->n_kv_heads, "head_dim", c->head_dim, "intermediate_size", c->ffn_dim,
                          "vocab_size", c->vocab_size, "max_position_embeddings", c->max_ctx,
                          "rms_norm_eps", (double)c->norm_eps, "rope_theta", (double)c->rope_theta,
                          "tie_word_embeddings", c->tied_embeddings, "hidden_act", "silu");
    if (c->rope_scaling == PT_ROPE_SCALING_LINEAR)
        json_object_set_new(j, "rope_scaling", json_pack("{s:s, s:f}", "rope_type", "linear", "factor",
                                                         (double)c->rope_factor));
    return j;
}

/* Output names, and which tensors MLX would quantize, at the default width. */
static int build_list(const pt_model_file *mf, const pt_model_config *c, pt_convert_tensor **out,
                      int *n_out, pt_err *err) {
    bool gguf = mf->kind == PT_FILE_GGUF;
    /* config_of_gguf writes the dense Llama family's keys, and GGUF names
     * map to Hugging Face ones one to one only there: a Gemma GGUF (gains
     * stored 1 + w), gpt-oss or MoE one would come out another model. */
    static const char *const dense[] = {"llama", "mistral", "qwen2", "qwen3"};
    bool dense_ok = false;
    for (size_t i = 0; i < PT_ARRAY_LEN(dense); i++) dense_ok |= strcmp(c->arch, dense[i]) == 0;
    if (gguf && !dense_ok)
        return pt_fail(err, "%s: converting a GGUF %s model is not supported (llama, mistral, "
                            "qwen2, qwen3); convert its Hugging Face directory instead",
                       mf->path, c->arch);
    if (gguf && c->n_rot != c->head_dim)
        return pt_fail(err, "%s: partial rotary embeddings (%d of %d dims) cannot be converted",
                       mf->path, c->n_rot, c->head_dim);
    pt_convert_tensor *t = pt_xcalloc((size_t)mf->n_tensors + 1, sizeof *t);
    int n = 0;
    for (int i = 0; i < mf->n_tensors; i++) {
        const pt_tensor_info *s = &mf->tensors[i];
        pt_convert_tensor *x = &t[n];
        x->src = s;
        if (gguf && pt_weight_hf_name(s->name, x->name, sizeof x->name)) {
            free(t);
            return pt_fail(err, "%s: GGUF tensor %s has no Hugging Face counterpart", mf->path, s->name);
        }
        if (!gguf) snprintf(x->name, sizeof x->name, "%s", s->name);
        x->group_size = cv.group_size;
        x->bits = pt_convert_quantizable(s, cv.group_size) ? cv.bits : 0;
        /* GGUF llama rotates adjacent pairs; Hugging Face layout splits halves */
        if (gguf && c->rope_style == PT_ROPE_NORM && (strstr(x->name, "q_proj.weight") || strstr(x->name, "k_proj.weight")))
            x->rope_head_dim = c->head_dim;
        n++;
    }
    *out = t;
    *n_out = n;
    return 0;
}

/* ---- --target-bpw: the sensitivity sweep --------------------------------------------- */

/* w quantized to bits (rows in the source's order, as the probe model uses them). */
static void quantize_into(const pt_tensor_info *s, int bits, int gs, pt_dtype sd, pt_weight *w,
                          void **bufs) {
    int64_t rows = s->shape[0], cols = s->shape[1];
    size_t sb = pt_affine_scale_bytes(rows, cols, gs, sd), ss = pt_dtype_bytes(sd, 1);
    bufs[0] = pt_xmalloc(pt_affine_code_bytes(rows, cols, bits));
    bufs[1] = pt_xmalloc(sb);
    bufs[2] = pt_xmalloc(sb);
    float *row = pt_xmalloc(sizeof(float) * (size_t)cols);
    for (int64_t r = 0; r < rows; r++) {
        pt_convert_read_row(s, r, row);
        pt_affine_quantize_row(row, cols, bits, gs, sd,
                               (uint32_t *)bufs[0] + r * pt_affine_row_words(cols, bits),
                               (uint8_t *)bufs[1] + (size_t)r * (size_t)(cols / gs) * ss,
                               (uint8_t *)bufs[2] + (size_t)r * (size_t)(cols / gs) * ss);
    }
    free(row);
    *w = (pt_weight){.dtype = PT_AFFINE, .rows = rows, .cols = cols, .data = bufs[0], .bits = bits,
                     .group_size = gs, .scales = bufs[1], .biases = bufs[2], .scale_dtype = sd};
}

static int parse_candidates(const char *s, int *bits, int max) {
    int n = 0;
    for (const char *p = s; *p && n < max;) {
        char *end;
        long b = strtol(p, &end, 10);
        if (end == p || !pt_affine_supported((int)b, cv.group_size)) return -1;
        if (n && b <= bits[n - 1]) return -1; /* ascending */
        bits[n++] = (int)b;
        p = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') return -1;
    }
    return n;
}

/* Measures every (matrix, width) and fills t[].bits from the allocation. */
static int plan_target_bpw(const char *src, pt_convert_tensor *t, int n, pt_dtype sd,
                           json_t *report, pt_err *err) {
    int cand[PT_BPW_MAX_CHOICES], nc = parse_candidates(cv.candidates, cand, PT_BPW_MAX_CHOICES);
    if (nc <= 0) return pt_fail(err, "--candidates '%s': ascending widths among 2,3,4,5,6,8", cv.candidates);
    if (!cv.calib) return pt_fail(err, "--target-bpw needs a calibration text (--calib or --eval)");
    pt_engine *ref = NULL, *probe = NULL;
    int32_t *ids = NULL;
    int n_ids, rc = -1;
    bool bytes;
    pt_bpw_module *mods = pt_xcalloc((size_t)n + 1, sizeof *mods);
    int *which = pt_xcalloc((size_t)n + 1, sizeof(int)), nm = 0;
    if (probe_open(&ref, src, cv.calib_tokens, err) || probe_open(&probe, src, cv.calib_tokens, err))
        goto out;
    if (text_ids(ref->model->file, ref->model->cfg.vocab_size, cv.calib, cv.calib_tokens, &ids, &n_ids,
                 &bytes, err))
        goto out;
    int window = PT_MIN(n_ids, cv.calib_tokens);
    fprintf(stderr, "petrel convert: sensitivity of each matrix at %d widths on %d calibration tokens%s\n",
            nc, window, bytes ? " (byte ids: the source has no tokenizer)" : "");
    pt_bpw_problem p = {.n_choices = nc, .target_bpw = cv.target_bpw, .modules = mods};
    for (int c = 0; c < nc; c++) p.bpw[c] = pt_weight_bpw(PT_AFFINE, cand[c], cv.group_size, sd);
    bool tied = probe->model->cfg.tied_embeddings;
    json_t *sens = json_object();
    for (int i = 0; i < n; i++) {
        if (!t[i].bits) continue;
        pt_weight *w = pt_model_weight_named(probe->model, t[i].src->name);
        if (!w) continue; /* a matrix the model does not use */
        bool embed = w == &probe->model->tok_embd;
        pt_weight saved = *w, saved_out = probe->model->output;
        json_t *row = json_array();
        for (int c = 0; c < nc; c++) {
            void *bufs[3];
            quantize_into(t[i].src, cand[c], cv.group_size, sd, w, bufs);
            if (embed && tied) probe->model->output = *w;
            pt_eval_result r;
            rc = pt_eval_kl(ref, probe, ids, window, window, NULL, NULL, &r, err);
            *w = saved;
            probe->model->output = saved_out;
            for (int k = 0; k < 3; k++) free(bufs[k]);
            if (rc) goto out;
            mods[nm].cost[c] = r.kl_mean;
            json_array_append_new(row, json_real(r.kl_mean));
        }
        mods[nm].params = t[i].src->shape[0] * t[i].src->shape[1];
        which[nm++] = i;
        json_object_set_new(sens, t[i].name, row);
        fprintf(stderr, "\r  %d matrices measured", nm);
    }
    fprintf(stderr, "\n");
    p.n_modules = nm;
    double achieved;
    if ((rc = pt_bpw_allocate(&p, &achieved, err))) goto out;
    for (int k = 0; k < nm; k++) t[which[k]].bits = cand[mods[k].choice];
    fprintf(stderr, "petrel convert: allocation reaches %.3f bits per weight (target %.3f)\n", achieved,
            (double)cv.target_bpw);
    json_object_set_new(report, "sensitivity_kl", sens);
    json_object_set_new(report, "allocated_bpw", json_real(achieved));
    rc = 0;
out:
    pt_engine_close(ref);
    pt_engine_close(probe);
    free(ids), free(mods), free(which);
    return rc;
}

/* ---- --eval --------------------------------------------------------------------------- */

static int evaluate(const char *src, const char *dst, json_t *report, pt_err *err) {
    pt_engine *a = NULL, *b = NULL;
    int32_t *ids = NULL;
    int n, rc = -1;
    bool bytes;
    if (probe_open(&a, src, cv.window, err) || probe_open(&b, dst, cv.window, err)) goto out;
    if (text_ids(a->model->file, a->model->cfg.vocab_size, cv.eval, 1 << 20, &ids, &n, &bytes, err))
        goto out;
    pt_eval_result ra, rb, kl;
    fprintf(stderr, "petrel convert: evaluating on %d tokens%s\n", n, bytes ? " (byte ids)" : "");
    if (pt_eval_ppl(a, ids, n, PT_MIN(cv.window, n), NULL, NULL, &ra, err) ||
        pt_eval_ppl(b, ids, n, PT_MIN(cv.window, n), NULL, NULL, &rb, err) ||
        pt_eval_kl(a, b, ids, n, PT_MIN(cv.window, n), NULL, NULL, &kl, err))
        goto out;
    printf("perplexity     source %.4f, converted %.4f\nKL mean        %.6f\nKL p99         %.6f\n"
           "top-1 agree    %.4f\n",
           ra.ppl, rb.ppl, kl.kl_mean, kl.kl_p99, kl.top1_agree);
    json_object_set_new(report, "eval", json_pack("{s:i, s:b, s:f, s:f, s:f, s:f, s:f}", "tokens_scored",
                                                  kl.n_scored, "byte_ids", bytes, "ppl_source", ra.ppl,
                                                  "ppl_converted", rb.ppl, "kl_mean", kl.kl_mean,
                                                  "kl_p99", kl.kl_p99, "top1_agree", kl.top1_agree));
    rc = 0;
out:
    pt_engine_close(a);
    pt_engine_close(b);
    free(ids);
    return rc;
}

/* ---- the command ------------------------------------------------------------------------- */

/* pt_convert_write's progress: bytes of source tensors done (a bar on a
 * terminal, a line per tenth otherwise; base/progress.h). */
static void progress(void *user, size_t done, size_t total, const char *name) {
    pt_progress *p = user;
    (void)name;
    if (!p->t0) pt_progress_begin(p, "converting", total);
    pt_progress_set(p, done);
}

static pt_dtype scale_dtype_of(const pt_convert_tensor *t, int n) {
    if (cv.scale_dtype) return (pt_dtype)pt_dtype_from_safetensors(strcmp(cv.scale_dtype, "f16") == 0    ? "F16"
                                                                   : strcmp(cv.scale_dtype, "bf16") == 0 ? "BF16"
                                                                   : strcmp(cv.scale_dtype, "f32") == 0  ? "F32"
                                                                                                         : "?");
    for (int i = 0; i < n; i++)
        if (t[i].bits && t[i].src->dtype == PT_BF16) return PT_BF16;
    return PT_F16;
}

/* The tokenizer and other files the weights need: a Hugging Face source's
 * are copied, a GGUF source's tokenizer is written from its keys. */
static int carry_files(const pt_model_file *mf, const char *src, const char *out, int *copied,
                       const char **note, pt_err *err) {
    *copied = 0;
    *note = "";
    if (mf->kind == PT_FILE_HF) return pt_convert_copy_files(src, out, copied, err);
    bool tok;
    if (pt_convert_write_gguf_tokenizer(mf->gguf, out, &tok, err)) return -1;
    *copied = tok;
    *note = tok ? " (tokenizer.gguf: the GGUF source's tokenizer)" : " (the GGUF source has no tokenizer)";
    return 0;
}

static int run(const char *src, const char *dst) {
    pt_err err = {{0}};
    pt_model_file *mf = NULL;
    pt_convert_tensor *t = NULL;
    json_t *config = NULL, *report = json_object();
    pt_pool *pool = NULL;
    pt_progress prog = {0};
    int n = 0, rc = 1;
    pt_model_config cfg;
    const char *out; /* the staging directory, renamed to dst at the end */
    if (pt_model_file_open(&mf, src, &err) || pt_config_from_file(mf, &cfg, &err)) goto out;
    if (build_list(mf, &cfg, &t, &n, &err)) goto out;
    pt_dtype sd = scale_dtype_of(t, n);
    if ((int)sd < 0) {
        pt_fail(&err, "--scale-dtype '%s' is not f16, bf16 or f32", cv.scale_dtype);
        goto out;
    }
    config = mf->kind == PT_FILE_GGUF ? config_of_gguf(&cfg) : json_deep_copy(mf->config);
    if (json_object_get(config, "quantization")) {
        pt_fail(&err, "%s is already quantized; convert needs full-precision weights", src);
        goto out;
    }
    if (staged_begin(dst, cv.force, &out, &err)) goto out; /* before a long sweep: DST may exist */
    if (cv.target_bpw > 0) {
        if (plan_target_bpw(src, t, n, sd, report, &err)) goto out;
    } else if (cv.mixed) {
        pt_convert_plan_mixed(t, n, cfg.n_layers, cv.high_bits);
    }
    pool = pt_pool_new(cv.threads);
    pt_convert_opts o = {.bits = cv.bits, .group_size = cv.group_size, .scale_dtype = sd,
                         .pool = pool, .progress = progress, .user = &prog};
    pt_convert_stats st;
    fprintf(stderr, "petrel convert: %s -> %s, %d bits, group %d, %s scales%s\n", src, dst, cv.bits,
            cv.group_size, pt_dtype_name(sd), cv.target_bpw > 0 ? ", bits per matrix by sensitivity"
                                                                 : cv.mixed ? ", mixed precision" : "");
    if (pt_convert_write(out, config, t, n, &o, &st, &err)) goto out;
    pt_progress_end(&prog);
    int copied;
    const char *note;
    if (carry_files(mf, src, out, &copied, &note, &err)) goto out;
    printf("parameters     %lld (%lld quantized)\nsize           %.2f MiB -> %.2f MiB\n"
           "bits/weight    %.3f over quantized matrices, %.3f overall\nfiles copied   %d%s\n",
           (long long)st.params, (long long)st.quantized_params, st.bytes_in / 1048576.0,
           st.bytes_out / 1048576.0, st.quantized_bpw, 8.0 * (double)st.bytes_out / (double)st.params,
           copied, note);
    json_t *plan = json_object();
    for (int i = 0; i < n; i++)
        if (t[i].bits) json_object_set_new(plan, t[i].name, json_integer(t[i].bits));
    json_object_set_new(report, "plan_bits", plan);
    json_object_set_new(report, "size", json_pack("{s:I, s:I, s:I, s:I, s:f}", "params", (json_int_t)st.params,
                                                  "quantized_params", (json_int_t)st.quantized_params,
                                                  "bytes_in", (json_int_t)st.bytes_in, "bytes_out",
                                                  (json_int_t)st.bytes_out, "quantized_bpw", st.quantized_bpw));
    if (cv.eval && evaluate(src, out, report, &err)) goto out;
    if (staged_commit(&err)) goto out;
    if (cv.json && json_dump_file(report, cv.json, JSON_INDENT(1) | JSON_PRESERVE_ORDER)) {
        pt_fail(&err, "cannot write %s (the model is written)", cv.json);
        goto out;
    }
    rc = 0;
out:
    if (rc) {
        staged_abort();
        fprintf(stderr, "petrel convert: %s\n", err.msg);
    }
    pt_pool_free(pool);
    json_decref(config);
    json_decref(report);
    free(t);
    pt_model_file_close(mf);
    return rc;
}

int cmd_convert(int argc, char **argv) {
    memset(&cv, 0, sizeof cv);
    cv.bits = 4, cv.group_size = 64, cv.window = 256, cv.calib_tokens = 512;
    cv.candidates = "2,3,4,5,6,8";
    const cli_opt *tables[] = {convert_opts, NULL};
    const char *pos[2];
    int n_pos, rc = cli_parse(argc, argv,
                              "petrel convert [options] SRC DST\n"
                              "  SRC: a Hugging Face directory (f32/f16/bf16 safetensors) or a GGUF file\n"
                              "  DST: the MLX-layout quantized directory to write",
                              tables, pos, 2, &n_pos);
    if (rc) return rc < 0 ? 2 : 0;
    if (n_pos != 2) {
        fprintf(stderr, "petrel convert: expected SRC and DST (see --help)\n");
        return 2;
    }
    if (!cv.high_bits) cv.high_bits = cv.bits >= 6 ? 8 : 6;
    if (!cv.calib) cv.calib = cv.eval;
    if (!pt_affine_supported(cv.bits, cv.group_size) || !pt_affine_supported(cv.high_bits, cv.group_size)) {
        fprintf(stderr, "petrel convert: bits must be 2, 3, 4, 5, 6 or 8 and the group size 32, 64 or 128\n");
        return 2;
    }
    if (cv.window < 8 || cv.calib_tokens < 8) {
        fprintf(stderr, "petrel convert: --window and --calib-tokens must be at least 8\n");
        return 2;
    }
    return run(pos[0], pos[1]);
}
