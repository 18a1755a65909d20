/*
 * cmd_eval.c - `petrel eval ppl [MODEL] TEXT` and
 * `petrel eval kl [MODEL_A] MODEL_B TEXT`: quality numbers with progress.
 *
 * The model (model A of kl) is given with -m like every other command, or
 * positionally as it always could be; neither means the default model.
 *
 * With --ids, TEXT is a file of whitespace-separated token ids instead of
 * text: models without a tokenizer (Hugging Face fixtures, dummy weights)
 * can be evaluated on a fixed token stream.
 */
#include <stdio.h>
#include <stdlib.h>

#include "cli/cli.h"
#include "eval/eval.h"

static struct {
    int window, max_tokens;
    const char *b_kv_type, *b_kv_quant, *json;
    bool ids;
} ev;

static const cli_opt eval_opts[] = {
    {"window", 'w', CLI_INT, &ev.window, "N", "tokens per window; stride is half (default 512)"},
    {"max-tokens", 0, CLI_INT, &ev.max_tokens, "N",
     "score at most the first N tokens of TEXT; 0 = all"},
    {"b-kv-type", 0, CLI_STR, &ev.b_kv_type, "T", "kl: KV cache type of model B (default: as A)"},
    {"b-kv-quant", 0, CLI_STR, &ev.b_kv_quant, "Q",
     "kl: KV cache codec of model B (default: as A)"},
    {"ids", 0, CLI_FLAG, &ev.ids, NULL,
     "TEXTFILE holds token ids (whitespace-separated), not text"},
    {"json", 'o', CLI_STR, &ev.json, "FILE", "also write the result as JSON"},
    {NULL, 0, 0, NULL, NULL, NULL},
};

static void progress(void *user, int done, int total) {
    (void)user;
    fprintf(stderr, "\r  %d / %d tokens (%.0f%%)", done, total, 100.0 * done / total);
    if (done >= total) fprintf(stderr, "\n");
}

/* Token ids as text: "1 234 17 ...", each below the vocabulary size. */
static int parse_ids(const char *text, int vocab, int32_t **ids, size_t *n, pt_err *err) {
    size_t cap = 0;
    *n = 0;
    for (const char *p = text;;) {
        char *end;
        while (*p == ' ' || *p == '\n' || *p == '\t' || *p == '\r') p++;
        if (!*p) return 0;
        long v = strtol(p, &end, 10);
        if (end == p || v < 0 || v >= vocab)
            return pt_fail(err, "token id %zu is not an integer in [0, %d)", *n, vocab);
        if (*n == cap) *ids = pt_xrealloc(*ids, sizeof(int32_t) * (cap = cap ? 2 * cap : 1024));
        (*ids)[(*n)++] = (int32_t)v;
        p = end;
    }
}

static int tokenize_file(pt_engine *e, const char *path, int32_t **ids, size_t *n) {
    char *text;
    size_t len;
    pt_err err = {{0}};
    if (pt_read_file(path, (size_t)1 << 30, &text, &len, &err)) {
        fprintf(stderr, "petrel eval: %s\n", err.msg);
        return -1;
    }
    int rc = ev.ids ? parse_ids(text, e->model->cfg.vocab_size, ids, n, &err)
                    : pt_tokenize(e->tok, text, len, true, false, ids, n, &err);
    free(text);
    if (rc) {
        fprintf(stderr, "petrel eval: %s\n", err.msg);
        return -1;
    }
    if (ev.max_tokens > 0 && *n > (size_t)ev.max_tokens) *n = (size_t)ev.max_tokens;
    return 0;
}

int cmd_eval(int argc, char **argv) {
    cli_model_defaults();
    memset(&ev, 0, sizeof ev);
    ev.window = 512;
    const cli_opt *tables[] = {eval_opts, cli_model_opts, NULL};
    const char *pos[4], *default_model = cli_margs.model;
    int n_pos;
    cli_margs.model = NULL; /* to tell -m MODEL from no model flag at all */
    int rc = cli_parse(argc, argv,
                       "petrel eval ppl [options] [MODEL] TEXTFILE\n"
                       "       petrel eval kl [options] [MODEL_A] MODEL_B TEXTFILE\n\n"
                       "MODEL (or MODEL_A) is given with -m or in its place here; with neither,\n"
                       "the default model (see -m).",
                       tables, pos, 4, &n_pos);
    if (rc) return rc < 0 ? 2 : 0;
    bool kl = n_pos >= 1 && strcmp(pos[0], "kl") == 0;
    int want = kl ? 3 : 2; /* positionals besides the model: mode, [MODEL_B], TEXTFILE */
    if ((!kl && !(n_pos >= 1 && strcmp(pos[0], "ppl") == 0)) || n_pos < want || n_pos > want + 1) {
        fprintf(stderr, "petrel eval: expected `ppl [MODEL] TEXTFILE` or `kl [MODEL_A] MODEL_B "
                        "TEXTFILE` (see --help)\n");
        return 2;
    }
    if (n_pos == want + 1) { /* the model positionally */
        if (cli_margs.model) {
            fprintf(stderr, "petrel eval: the model is given twice (-m %s and %s): give one\n",
                    cli_margs.model, pos[1]);
            return 2;
        }
        cli_margs.model = pos[1];
        for (int i = 1; i < n_pos - 1; i++)
            pos[i] = pos[i + 1];
        n_pos--;
    }
    if (!cli_margs.model) cli_margs.model = default_model;
    /* now pos is: mode, [MODEL_B,] TEXTFILE */
    if (cli_margs.ctx < ev.window) cli_margs.ctx = ev.window;
    cli_margs.no_tokenizer = ev.ids;
    pt_engine *a = NULL, *b = NULL;
    if (cli_open_engine(&a)) return 1;
    if (kl) {
        cli_margs.model = pos[1];
        if (ev.b_kv_type) cli_margs.kv_type = ev.b_kv_type;
        if (ev.b_kv_quant) cli_margs.kv_quant = ev.b_kv_quant;
        if (cli_open_engine(&b)) {
            pt_engine_close(a);
            return 1;
        }
    }
    int32_t *ids = NULL;
    size_t n = 0;
    pt_eval_result r;
    pt_err err = {{0}};
    rc = 1;
    if (!a->tok && !ev.ids) {
        fprintf(stderr, "petrel eval: model A has no tokenizer (give token ids with --ids)\n");
        goto out;
    }
    if (tokenize_file(a, pos[kl ? 2 : 1], &ids, &n)) goto out;
    fprintf(stderr, "petrel eval: %zu tokens, window %d\n", n, ev.window);
    if (kl ? pt_eval_kl(a, b, ids, (int)n, ev.window, progress, NULL, &r, &err)
           : pt_eval_ppl(a, ids, (int)n, ev.window, progress, NULL, &r, &err)) {
        fprintf(stderr, "petrel eval: %s\n", err.msg);
        goto out;
    }
    printf("tokens scored  %d\nperplexity     %.4f\n", r.n_scored, r.ppl);
    if (kl)
        printf("KL mean        %.6f\nKL p99         %.6f\nKL max         %.6f\n"
               "top-1 agree    %.4f\n",
               r.kl_mean, r.kl_p99, r.kl_max, r.top1_agree);
    if (ev.json) {
        json_t *j = json_pack("{s:s, s:i, s:f, s:f}", "mode", kl ? "kl" : "ppl", "tokens_scored",
                              r.n_scored, "ppl", r.ppl, "nll_mean", r.nll_mean);
        char fmt[32];
        json_object_set_new(j, "kv_a", json_string(pt_kv_format_name(&a->kv.cfg, fmt, sizeof fmt)));
        if (kl) {
            json_object_set_new(j, "kv_b", json_string(pt_kv_format_name(&b->kv.cfg, fmt, sizeof fmt)));
            json_object_set_new(j, "kl_mean", json_real(r.kl_mean));
            json_object_set_new(j, "kl_p99", json_real(r.kl_p99));
            json_object_set_new(j, "kl_max", json_real(r.kl_max));
            json_object_set_new(j, "top1_agree", json_real(r.top1_agree));
        }
        if (json_dump_file(j, ev.json, JSON_INDENT(1))) fprintf(stderr, "petrel eval: cannot write %s\n", ev.json);
        json_decref(j);
    }
    rc = 0;
out:
    free(ids);
    pt_engine_close(a);
    pt_engine_close(b);
    return rc;
}
