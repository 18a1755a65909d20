/*
 * cmd_generate.c - `petrel generate`: stream a continuation of a prompt.
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "cli/cli.h"
#include "server/structured.h"

static struct {
    int n;
    float temp, top_p, min_p, rep, freq, pres;
    int top_k, logprobs;
    uint64_t seed;
    bool seed_set, no_bos, ignore_eos, special, no_echo;
    const char *json_schema, *grammar, *regex, *prediction;
    const char *prompt;
} g;

/* The sampling flags take the ranges the server takes: cli_parse looks
 * each up by name in engine/gen_limits.h. */
static const cli_opt gen_opts[] = {
    {"n-predict", 'n', CLI_INT, &g.n, "N",
     "tokens to generate; end of text or a full context stops earlier (default 128)"},
    {"prompt", 'p', CLI_STR, &g.prompt, "TEXT", "the prompt, as llama.cpp's -p (else the arguments, else stdin)"},
    {"temp", 0, CLI_FLOAT, &g.temp, "T", "temperature; 0 = greedy (default 0.8)"},
    {"top-k", 0, CLI_INT, &g.top_k, "K", "keep the K most likely tokens; 0 = off (default 40)"},
    {"top-p", 0, CLI_FLOAT, &g.top_p, "P", "nucleus sampling; 1 = off (default 0.95)"},
    {"min-p", 0, CLI_FLOAT, &g.min_p, "P",
     "drop tokens below P x the best; 0 = off (default 0.05)"},
    {"repeat-penalty", 0, CLI_FLOAT, &g.rep, "R", "repetition penalty; 1 = off (default 1)"},
    {"frequency-penalty", 0, CLI_FLOAT, &g.freq, "F", "OpenAI frequency penalty (default 0)"},
    {"presence-penalty", 0, CLI_FLOAT, &g.pres, "P", "OpenAI presence penalty (default 0)"},
    {"seed", 's', CLI_U64, &g.seed, "S", "sampling seed (default: from the clock, printed)"},
    {"logprobs", 0, CLI_INT, &g.logprobs, "N", "print each token's logprob and N alternatives"},
    {"no-bos", 0, CLI_FLAG, &g.no_bos, NULL, "do not add the BOS token"},
    {"special", 0, CLI_FLAG, &g.special, NULL, "parse special-token text in the prompt"},
    {"ignore-eos", 0, CLI_FLAG, &g.ignore_eos, NULL, "keep generating past end-of-text"},
    {"no-echo", 0, CLI_FLAG, &g.no_echo, NULL, "do not print the prompt before the output"},
    {"json-schema", 0, CLI_STR, &g.json_schema, "FILE", "constrain the output to JSON valid against the schema in FILE"},
    {"grammar", 0, CLI_STR, &g.grammar, "FILE", "constrain the output to the GBNF grammar in FILE"},
    {"regex", 0, CLI_STR, &g.regex, "RE", "constrain the output to match the regular expression RE"},
    {"prediction", 0, CLI_STR, &g.prediction, "FILE", "Predicted Output: text the output is expected to repeat (as in code edits), drafted from first (implies --spec ngram unless --spec is given)"},
    {NULL, 0, 0, NULL, NULL, NULL},
};

/* The whole of a file, or NULL after printing why not. */
static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "petrel: cannot open %s\n", path);
        return NULL;
    }
    size_t cap = 1 << 16, n;
    char *buf = pt_xmalloc(cap);
    *len = 0;
    while ((n = fread(buf + *len, 1, cap - *len, f)) > 0)
        if ((*len += n) == cap) buf = pt_xrealloc(buf, cap *= 2);
    fclose(f);
    return buf;
}

/* --prediction FILE: its tokens as the request's Predicted Output (*ids
 * owns them).  Nonzero after printing why not. */
static int prediction_load(const pt_tokenizer *tok, pt_spec_params *sp, int32_t **ids) {
    if (!g.prediction) return 0;
    size_t len, n = 0;
    char *text = slurp(g.prediction, &len);
    if (!text) return 1;
    if (sp->kind == PT_SPEC_DRAFT) {
        fprintf(stderr, "petrel: --prediction drafts by n-gram lookup; it does not go with --spec "
                        "draft\n");
        free(text);
        return 1;
    }
    pt_err err = {{0}};
    int rc = pt_tokenize(tok, text, len, false, false, ids, &n, &err);
    free(text);
    if (rc) {
        fprintf(stderr, "petrel: --prediction %s: %s\n", g.prediction, err.msg);
        return 1;
    }
    if (sp->kind == PT_SPEC_OFF && !cli_sargs.spec) sp->kind = PT_SPEC_NGRAM;
    sp->prediction = *ids;
    sp->n_prediction = (int)n;
    return 0;
}

/* --json-schema / --grammar / --regex: the grammar the output must follow
 * (*out stays NULL when none is given).  Nonzero after printing why not. */
static int structured_load(const pt_tokenizer *tok, pt_structured **out) {
    *out = NULL;
    if (!!g.json_schema + !!g.grammar + !!g.regex > 1) {
        fprintf(stderr, "petrel: give at most one of --json-schema, --grammar, --regex\n");
        return 1;
    }
    if (!g.json_schema && !g.grammar && !g.regex) return 0;
    pt_err err = {{0}};
    pt_grammar *gr = NULL;
    int rc;
    if (g.regex) {
        rc = pt_grammar_from_regex(&gr, g.regex, &err);
    } else {
        const char *path = g.json_schema ? g.json_schema : g.grammar;
        size_t len;
        char *buf = slurp(path, &len);
        if (!buf) return 1;
        if (g.json_schema) {
            json_error_t je;
            json_t *js = json_loadb(buf, len, 0, &je);
            rc = js ? pt_grammar_from_schema_ws(&gr, js, 1, &err)
                    : pt_fail(&err, "%s: %s (line %d)", path, je.text, je.line);
            json_decref(js);
        } else {
            rc = pt_grammar_from_gbnf(&gr, buf, len, &err);
        }
        free(buf);
    }
    if (rc) {
        fprintf(stderr, "petrel: %s\n", err.msg);
        return 1;
    }
    *out = pt_structured_new(gr, tok);
    return 0;
}

/* All of stdin.  A prompt is text: a NUL byte in it is refused rather
 * than letting the C strings downstream cut the prompt there. */
static char *read_stdin(void) {
    size_t cap = 4096, len = 0;
    char *buf = pt_xmalloc(cap);
    size_t n;
    while ((n = fread(buf + len, 1, cap - len - 1, stdin)) > 0) {
        len += n;
        if (cap - len < 2) buf = pt_xrealloc(buf, cap *= 2);
    }
    buf[len] = 0;
    const char *nul = memchr(buf, 0, len);
    if (nul) {
        fprintf(stderr,
                "petrel: the prompt read from stdin has a NUL byte at offset %zu (of %zu "
                "bytes); a prompt must be text\n",
                (size_t)(nul - buf), len);
        free(buf);
        return NULL;
    }
    return buf;
}

typedef struct printer {
    const pt_tokenizer *tok;
    int logprobs;
} printer;

static int on_token(void *user, const pt_sample_result *r, const char *text, size_t len) {
    printer *p = user;
    fwrite(text, 1, len, stdout);
    if (p->logprobs >= 0 && r) {
        fprintf(stderr, "[%d %.4f", r->id, r->logprob);
        for (int i = 0; i < r->n_top; i++) fprintf(stderr, " %d:%.4f", r->top[i].id, r->top[i].logprob);
        fprintf(stderr, "]\n");
    }
    fflush(stdout);
    return 0;
}

int cmd_generate(int argc, char **argv) {
    cli_model_defaults();
    memset(&g, 0, sizeof g);
    g.n = 128, g.temp = 0.8f, g.top_k = 40, g.top_p = 0.95f, g.min_p = 0.05f, g.rep = 1;
    g.logprobs = -1, g.seed = UINT64_MAX;
    const cli_opt *tables[] = {gen_opts, cli_spec_opts, cli_model_opts, NULL};
    const char *pos[64];
    int n_pos;
    int rc = cli_parse(argc, argv, "petrel generate [options] [PROMPT...]   (no PROMPT: read stdin)\n\n"
                       "llama.cpp's spellings work where they mean the same: -m, -p/--prompt,\n"
                       "-n/--n-predict, -c/--ctx-size, -t, -b, -s/--seed, -ngl/--gpu-layers\n"
                       "(device selection), --temp, --top-k, --top-p, --min-p, --repeat-penalty.",
                       tables, pos, 64, &n_pos);
    if (rc) return rc < 0 ? 2 : 0;

    char *prompt;
    if (g.prompt && n_pos > 0) {
        fprintf(stderr, "petrel: a prompt was given twice (-p and as arguments); give one\n");
        return 2;
    }
    if (g.prompt) {
        prompt = pt_xmalloc(strlen(g.prompt) + 1);
        strcpy(prompt, g.prompt);
    } else if (n_pos == 0 || (n_pos == 1 && strcmp(pos[0], "-") == 0)) {
        prompt = read_stdin();
        if (!prompt) return 2;
    } else { /* words joined by spaces, as a shell user expects */
        size_t len = 1;
        for (int i = 0; i < n_pos; i++) len += strlen(pos[i]) + 1;
        prompt = pt_xcalloc(len, 1);
        for (int i = 0; i < n_pos; i++) {
            if (i) strcat(prompt, " ");
            strcat(prompt, pos[i]);
        }
    }
    if (g.seed == UINT64_MAX) {
        g.seed = (uint64_t)time(NULL);
        if (g.temp > 0) fprintf(stderr, "petrel: seed %llu\n", (unsigned long long)g.seed);
    }

    pt_engine *e;
    cli_margs.max_seqs = 1; /* pt_generate runs one sequence */
    if (cli_open_engine(&e)) {
        free(prompt);
        return 1;
    }
    if (!e->tok) {
        fprintf(stderr, "petrel: this model has no tokenizer (dummy weights): use petrel bench\n");
        pt_engine_close(e);
        free(prompt);
        return 1;
    }
    pt_err err = {{0}};
    int32_t *ids = NULL, *pred = NULL;
    size_t n_ids = 0;
    pt_structured *so = NULL;
    rc = 1;
    if (pt_tokenize(e->tok, prompt, strlen(prompt), !g.no_bos, g.special, &ids, &n_ids, &err)) {
        fprintf(stderr, "petrel: %s\n", err.msg);
        goto out;
    }
    pt_gen_params p = {.max_tokens = g.n, .ignore_eos = g.ignore_eos};
    if (cli_spec_params(&p.spec, false, NULL)) {
        rc = 2;
        goto out;
    }
    if (prediction_load(e->tok, &p.spec, &pred)) goto out;
    p.sampling = pt_sampling_default();
    p.sampling.temperature = g.temp;
    p.sampling.top_k = g.top_k;
    p.sampling.top_p = g.top_p;
    p.sampling.min_p = g.min_p;
    p.sampling.repetition_penalty = g.rep;
    p.sampling.frequency_penalty = g.freq;
    p.sampling.presence_penalty = g.pres;
    p.sampling.seed = g.seed;
    p.sampling.n_logprobs = g.logprobs; /* -1 unless given; given is 0..20 */
    if (!g.no_echo) {
        fputs(prompt, stdout);
        fflush(stdout);
    }
    if (structured_load(e->tok, &so)) goto out;
    if (so) p.add_procs = pt_structured_add_procs, p.proc_arg = so;
    printer pr = {e->tok, g.logprobs};
    pt_gen_stats st;
    if (pt_generate(e, ids, (int)n_ids, &p, on_token, &pr, &st, &err)) {
        fprintf(stderr, "\npetrel: %s\n", err.msg);
        goto out;
    }
    int n_dec = st.n_generated - 1;
    fprintf(stderr, "\n\npetrel: prompt %d tokens in %.3f s (%.1f tok/s); generated %d tokens, "
                    "decode %.1f tok/s; %s\n",
            st.n_prompt, st.t_prefill, st.n_prompt / (st.t_prefill > 0 ? st.t_prefill : 1e-9),
            st.n_generated, n_dec > 0 && st.t_decode > 0 ? n_dec / st.t_decode : 0.0,
            st.finish == PT_FINISH_STOP ? "stopped at end of text" : "length limit");
    if (st.n_forced)
        fprintf(stderr, "petrel: jump-forward: %d tokens forced by the grammar\n", st.n_forced);
    if (st.n_drafted)
        fprintf(stderr, "petrel: speculative: %d of %d drafted tokens accepted (%.0f%%)\n",
                st.n_accepted, st.n_drafted, 100.0 * st.n_accepted / st.n_drafted);
    rc = 0;
out:
    pt_structured_free(so);
    free(ids);
    free(pred);
    free(prompt);
    pt_engine_close(e);
    return rc;
}
