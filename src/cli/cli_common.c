/*
 * cli_common.c - option tables, parsing, and opening the engine from flags.
 */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "cli/cli.h"

#ifndef PETREL_DEFAULT_MODEL
#define PETREL_DEFAULT_MODEL "models/stories260K.gguf"
#endif

cli_model_args cli_margs;

/* Ranges of the numeric flags that are not generation parameters (those
 * are in engine/gen_limits.c).  0 is the default where a help line says so. */
static const pt_gen_limit k_cli_limits[] = {
    {"threads", "threads", 0, 4096, true},
    {"tensor-parallel", "tensor-parallel", 1, 64, true},
    {"gpu-layers", "gpu-layers", 0, INT_MAX, true},
    {"ctx", "ctx", 0, INT_MAX, true},
    {"batch", "batch", 0, 1 << 20, true},
    {"gen", "gen", 1, 1 << 20, true},               /* bench */
    {"reps", "reps", 1, 1000, true},                /* bench */
    {"window", "window", 4, 1 << 20, true},         /* eval */
    {"max-tokens", "max-tokens", 0, INT_MAX, true}, /* eval; 0 = all */
};

/* Flags that are another name of a flag with a range: {alias, flag}. */
static const char *const k_aliases[][2] = {
    {"max-seqs", "parallel"}, {"ctx-size", "ctx"}, {"n-gpu-layers", "gpu-layers"}};

/* llama.cpp's spellings that are neither one letter nor long: {as typed,
 * the long flag it means}. */
static const char *const k_dash_words[][2] = {{"-ngl", "gpu-layers"}};

const pt_gen_limit *cli_flag_range(const char *name) {
    for (size_t i = 0; i < PT_ARRAY_LEN(k_aliases); i++)
        if (strcmp(name, k_aliases[i][0]) == 0) name = k_aliases[i][1];
    const pt_gen_limit *l = pt_gen_limit_of_flag(name);
    for (size_t i = 0; !l && i < PT_ARRAY_LEN(k_cli_limits); i++)
        if (strcmp(k_cli_limits[i].flag, name) == 0) l = &k_cli_limits[i];
    return l;
}

const cli_opt cli_model_opts[] = {
    {"model", 'm', CLI_STR, &cli_margs.model, "PATH",
     "GGUF file, Hugging Face directory, or dummy:PRESET|CONFIG.json (default: bundled stories260K)"},
    {"device", 0, CLI_STR, &cli_margs.device, "DEV", "cpu (default), cuda or cuda:N (GPU number N)"},
    {"gpu-layers", 0, CLI_INT, &cli_margs.gpu_layers, "N", "llama.cpp's -ngl/--n-gpu-layers, as device selection: N > 0 runs the whole model on cuda (no partial offload), 0 on the cpu"},
    {"n-gpu-layers", 0, CLI_INT, &cli_margs.gpu_layers, "N", "the same as --gpu-layers (also -ngl)"},
    {"threads", 't', CLI_INT, &cli_margs.threads, "N", "CPU threads (default: one per core)"},
    {"tensor-parallel", 0, CLI_INT, &cli_margs.tensor_parallel, "N", "split the model over N ranks (Megatron-style: heads and FFN rows, one sum per block; docs/tensor-parallel.md). cpu: N > 1 runs the split reference forward, one thread per rank (for correctness, not speed); cuda: 1 runs through a one-rank NCCL communicator, N > 1 needs N GPUs and is not implemented yet (default: not split)"},
    {"kernels", 0, CLI_STR, &cli_margs.kernels, "K", "CPU kernels: auto, avx512, avx2, portable"},
    {"ctx", 'c', CLI_INT, &cli_margs.ctx, "N", "KV cache positions (default: min(model, 4096))"},
    {"ctx-size", 0, CLI_INT, &cli_margs.ctx, "N", "the same as --ctx (llama.cpp's spelling)"},
    {"batch", 'b', CLI_INT, &cli_margs.batch, "N", "rows per forward pass (default 512)"},
    {"kv-type", 0, CLI_STR, &cli_margs.kv_type, "T", "KV cache element type: f32, f16 (default), bf16"},
    {"kv-quant", 0, CLI_STR, &cli_margs.kv_quant, "Q", "KV cache codec: none (default), 8, 4 (affine), turbo[:k<bits>v<bits>][:anydim] (TurboQuant, k8v3)"},
    {"kv-budget", 0, CLI_STR, &cli_margs.kv_budget, "SIZE", "KV pool size: bytes (6G, 512M) or a percentage of free memory (80%); requests grow into it and are preempted when it is full (default: --ctx positions, x --parallel for serve)"},
    {"prefix-cache", 0, CLI_STR, &cli_margs.prefix_cache, "on|off", "reuse the KV pages of identical prompt prefixes across requests (default on)"},
    {"kv-disk", 0, CLI_STR, &cli_margs.kv_disk, "DIR", "keep the prefix cache's pages on disk too: evicted ones, and all at exit; a restart on the same model reuses them"},
    {"kv-disk-size", 0, CLI_STR, &cli_margs.kv_disk_size, "SIZE", "most bytes --kv-disk may hold, least recently used go first (default: 8G or half the free space)"},
    {"dummy-dtype", 0, CLI_STR, &cli_margs.dummy_dtype, "T", "weights of dummy models: bf16, f16, f32, q8_0, q4_0, q4_k, q5_k, q6_k, affineB[gG]"},
    {"dummy-seed", 0, CLI_U64, &cli_margs.dummy_seed, "S", "seed of dummy weights"},
    {"verbose", 'v', CLI_FLAG, &cli_margs.verbose, NULL, "log more"},
    {NULL, 0, 0, NULL, NULL, NULL},
};

cli_spec_args cli_sargs;

const cli_opt cli_spec_opts[] = {
    {"spec", 0, CLI_STR, &cli_sargs.spec, "KIND", "speculative decoding: off (default), ngram (prompt lookup: drafts copied from earlier in the text, verified in one forward) or draft (a smaller model with the same tokenizer drafts: --draft-model)"},
    {"draft-model", 0, CLI_STR, &cli_sargs.draft_model, "PATH", "the draft model of --spec draft (implies it): GGUF, Hugging Face directory or dummy:PRESET, with the model's vocabulary"},
    {"spec-k", 0, CLI_INT, &cli_sargs.k, "N", "drafted tokens per step at most (default 4; adapted per sequence to its acceptance)"},
    {"ngram-min", 0, CLI_INT, &cli_sargs.ngram_min, "N", "shortest suffix the n-gram drafter matches (default 2)"},
    {"ngram-max", 0, CLI_INT, &cli_sargs.ngram_max, "N", "longest suffix it tries first (default 4)"},
    {"jump-forward", 0, CLI_FLAG, &cli_sargs.jump_forward, NULL, "where a grammar (--json-schema, response_format, forced tools) allows one continuation, compute its tokens in one forward instead of one each; verified, so the output is unchanged"},
    {NULL, 0, 0, NULL, NULL, NULL},
};

int cli_spec_params(pt_spec_params *out, bool allow_oracle, float *oracle_accept) {
    const cli_spec_args *a = &cli_sargs;
    memset(out, 0, sizeof *out);
    out->k = a->k > 0 ? a->k : 4;
    out->ngram_min = a->ngram_min > 0 ? a->ngram_min : 2;
    out->ngram_max = a->ngram_max > 0 ? a->ngram_max : PT_MAX(4, out->ngram_min);
    out->jump_forward = a->jump_forward;
    if (a->k < 0 || a->k > 16 || out->ngram_max < out->ngram_min || a->ngram_min < 0) {
        fprintf(stderr, "petrel: --spec-k takes 1..16, and --ngram-min <= --ngram-max\n");
        return -1;
    }
    if (a->draft_model && (!a->spec || strcmp(a->spec, "draft") == 0)) {
        out->kind = PT_SPEC_DRAFT;
        return 0;
    }
    if (a->draft_model) {
        fprintf(stderr, "petrel: --draft-model drafts for --spec draft, not --spec %s\n", a->spec);
        return -1;
    }
    if (a->spec && strcmp(a->spec, "draft") == 0) {
        fprintf(stderr, "petrel: --spec draft needs --draft-model PATH (a smaller model with the "
                        "same tokenizer)\n");
        return -1;
    }
    if (!a->spec || strcmp(a->spec, "off") == 0) return 0;
    if (strcmp(a->spec, "ngram") == 0) {
        out->kind = PT_SPEC_NGRAM;
        return 0;
    }
    char *end;
    if (allow_oracle && strncmp(a->spec, "oracle:", 7) == 0) {
        float acc = strtof(a->spec + 7, &end);
        if (end != a->spec + 7 && !*end && acc >= 0 && acc <= 1) {
            out->kind = PT_SPEC_ORACLE;
            *oracle_accept = acc;
            return 0;
        }
    }
    fprintf(stderr, "petrel: --spec %s: expected off, ngram or draft%s\n", a->spec,
            allow_oracle ? ", or oracle:A with A in [0, 1]" : "");
    return -1;
}

void cli_model_defaults(void) {
    memset(&cli_sargs, 0, sizeof cli_sargs);
    cli_model_args *a = &cli_margs;
    memset(a, 0, sizeof *a);
    a->model = getenv("PETREL_MODEL") ? getenv("PETREL_MODEL") : PETREL_DEFAULT_MODEL;
    a->device = NULL; /* cpu, unless --device or -ngl says otherwise */
    a->gpu_layers = -1;
    a->kernels = "auto";
    a->kv_type = "f16";
    a->dummy_dtype = "bf16";
    a->dummy_seed = 1;
}

static const cli_opt *find_opt(const cli_opt *const *tables, const char *name, char short_name);

static void print_help(const char *usage, const cli_opt *const *tables) {
    printf("usage: %s\n\noptions:\n", usage);
    for (int t = 0; tables[t]; t++)
        for (const cli_opt *o = tables[t]; o->name; o++) {
            if (find_opt(tables, o->name, 0) != o) continue; /* shadowed by an earlier table */
            char left[64];
            snprintf(left, sizeof left, "%s%c%s--%s %s", o->short_name ? "-" : "",
                     o->short_name ? o->short_name : ' ', o->short_name ? ", " : "  ", o->name,
                     o->arg ? o->arg : "");
            char range[64] = "";
            const pt_gen_limit *l = cli_flag_range(o->name);
            if (l) {
                char r[48];
                snprintf(range, sizeof range, " [%s]", pt_gen_range_text(l, r, sizeof r));
            }
            printf("  %-28s %s%s\n", left + (o->short_name ? 0 : 1), o->help, range);
        }
    printf("  %-28s %s\n", "-h, --help", "show this help");
}

static const cli_opt *find_opt(const cli_opt *const *tables, const char *name, char short_name) {
    for (int t = 0; tables[t]; t++)
        for (const cli_opt *o = tables[t]; o->name; o++)
            if (name ? strcmp(o->name, name) == 0 : o->short_name == short_name) return o;
    return NULL;
}

/* The flag as a user may have typed it: "-n/--n-predict" or "--temp". */
static const char *flag_name(const cli_opt *o, char *buf, size_t cap) {
    if (o->short_name)
        snprintf(buf, cap, "-%c/--%s", o->short_name, o->name);
    else
        snprintf(buf, cap, "--%s", o->name);
    return buf;
}

int cli_check_range(const char *flag, const char *value, double x, const pt_gen_limit *l,
                    const char *note) {
    if (pt_gen_in_range(l, x)) return 0;
    char r[64];
    fprintf(stderr, "petrel: %s %s is out of range: it must be %s%s%s\n", flag, value,
            pt_gen_range_text(l, r, sizeof r), note ? " " : "", note ? note : "");
    return -1;
}

static int set_value(const cli_opt *o, const char *v) {
    char *end, flag[80];
    flag_name(o, flag, sizeof flag);
    const pt_gen_limit *range = cli_flag_range(o->name);
    errno = 0;
    switch (o->kind) {
    case CLI_INT: {
        long x = strtol(v, &end, 10);
        if (*end || errno || end == v || x < -2147483647 || x > 2147483647) break;
        if (range && cli_check_range(flag, v, (double)x, range, NULL)) return -1;
        *(int *)o->dst = (int)x;
        return 0;
    }
    case CLI_U64: {
        unsigned long long x = strtoull(v, &end, 10);
        if (*end || errno || *v == '-') break;
        *(uint64_t *)o->dst = x;
        return 0;
    }
    case CLI_FLOAT: {
        /* checked as typed, before rounding to float (0.01f < 0.01); strtod
         * takes "nan" and "inf", which the range check refuses */
        double x = strtod(v, &end);
        if (*end || end == v || (errno && !range)) break;
        if (range && cli_check_range(flag, v, x, range, NULL)) return -1;
        if (errno || (isfinite(x) && !isfinite((float)x))) break; /* beyond a float */
        *(float *)o->dst = (float)x;
        return 0;
    }
    case CLI_STR: *(const char **)o->dst = v; return 0;
    case CLI_LIST: {
        cli_list *l = o->dst;
        if (l->n == CLI_LIST_MAX) {
            fprintf(stderr, "petrel: %s: given more than %d times\n", flag, CLI_LIST_MAX);
            return -1;
        }
        l->v[l->n++] = v;
        return 0;
    }
    }
    fprintf(stderr, "petrel: %s: '%s' is not a valid %s\n", flag, v,
            o->kind == CLI_FLOAT ? "number" : "integer");
    return -1;
}

int cli_parse(int argc, char **argv, const char *usage, const cli_opt *const *tables,
              const char **pos, int max_pos, int *n_pos) {
    *n_pos = 0;
    bool only_pos = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (only_pos || a[0] != '-' || a[1] == 0) {
            if (*n_pos == max_pos) {
                fprintf(stderr, "petrel: unexpected argument '%s' (see --help)\n", a);
                return -1;
            }
            pos[(*n_pos)++] = a;
            continue;
        }
        if (strcmp(a, "--") == 0) {
            only_pos = true;
            continue;
        }
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            print_help(usage, tables);
            return 1;
        }
        char name[64];
        const char *val = NULL;
        const cli_opt *o;
        if (a[1] == '-') {
            const char *eq = strchr(a + 2, '=');
            size_t len = eq ? (size_t)(eq - a - 2) : strlen(a + 2);
            snprintf(name, sizeof name, "%.*s", (int)PT_MIN(len, sizeof name - 1), a + 2);
            if (eq) val = eq + 1;
            o = find_opt(tables, name, 0);
        } else if (a[2]) {
            o = NULL;
            for (size_t k = 0; k < PT_ARRAY_LEN(k_dash_words); k++)
                if (strcmp(a, k_dash_words[k][0]) == 0) o = find_opt(tables, k_dash_words[k][1], 0);
        } else {
            o = find_opt(tables, NULL, a[1]);
        }
        if (!o) {
            fprintf(stderr, "petrel: unknown option '%s' (see --help)\n", a);
            return -1;
        }
        if (o->kind == CLI_FLAG) {
            *(bool *)o->dst = true;
            continue;
        }
        if (!val) {
            if (i + 1 >= argc) {
                fprintf(stderr, "petrel: --%s needs a value (%s)\n", o->name, o->arg);
                return -1;
            }
            val = argv[++i];
        }
        if (set_value(o, val)) return -1;
    }
    return 0;
}

/* --draft-model: a second engine on the same device, its context as long
 * as the model's; its KV pool is sized by the core (a private pool, never
 * cached or spilled to disk). */
static int open_draft(pt_engine *e, const pt_engine_opts *target) {
    pt_engine_opts o = *target;
    o.model_path = cli_sargs.draft_model;
    o.n_ctx = e->n_ctx;
    o.kv_budget = NULL, o.kv_disk = NULL, o.kv_disk_size = NULL;
    o.no_prefix_cache = true;
    o.no_tokenizer = true; /* pt_engine_attach_draft loads it to compare */
    o.tensor_parallel = 0; /* the draft model runs whole */
    pt_engine *d;
    pt_err err = {{0}};
    if (pt_engine_open(&d, &o, &err)) {
        fprintf(stderr, "petrel: --draft-model %s: %s\n", cli_sargs.draft_model, err.msg);
        return -1;
    }
    if (pt_engine_attach_draft(e, d, &err)) {
        fprintf(stderr, "petrel: %s\n", err.msg);
        pt_engine_close(d);
        return -1;
    }
    return 0;
}

/* --device, or what llama.cpp's -ngl N means here: the whole model on the
 * GPU or none of it.  Both given and disagreeing is an error, not a guess. */
static const char *device_of(const cli_model_args *a) {
    if (a->gpu_layers < 0) return a->device ? a->device : "cpu";
    const char *ngl = a->gpu_layers > 0 ? "cuda" : "cpu";
    if (a->device && strncmp(a->device, ngl, strlen(ngl)) == 0) return a->device; /* cuda:N */
    if (a->device) {
        fprintf(stderr, "petrel: -ngl %d means --device %s, but --device %s was given; give one\n",
                a->gpu_layers, ngl, a->device);
        return NULL;
    }
    return ngl;
}

int cli_open_engine(pt_engine **e) {
    return cli_open_engine_at(cli_margs.model, e);
}

int cli_open_engine_at(const char *path, pt_engine **e) {
    const cli_model_args *a = &cli_margs;
    if (a->verbose) pt_log_level = PT_LOG_DEBUG;
    const char *device = device_of(a);
    if (!device) return -1;
    pt_engine_opts o = {.model_path = path,
                        .device = device,
                        .n_threads = a->threads,
                        .kernels = a->kernels,
                        .n_ctx = a->ctx,
                        .max_batch = a->batch,
                        .kv_quant = a->kv_quant,
                        .kv_budget = a->kv_budget,
                        .kv_disk = a->kv_disk,
                        .kv_disk_size = a->kv_disk_size,
                        .no_prefix_cache = a->prefix_cache && strcmp(a->prefix_cache, "off") == 0,
                        .no_tokenizer = a->no_tokenizer,
                        .max_seqs = a->max_seqs,
                        .dummy_dtype = a->dummy_dtype,
                        .dummy_seed = a->dummy_seed,
                        .tensor_parallel = a->tensor_parallel};
    int kt = pt_parse_kv_dtype(a->kv_type);
    if (kt < 0) {
        fprintf(stderr, "petrel: --kv-type '%s' is not f32, f16 or bf16\n", a->kv_type);
        return -1;
    }
    o.kv_dtype = (pt_dtype)kt;
    if (a->prefix_cache && strcmp(a->prefix_cache, "on") && strcmp(a->prefix_cache, "off")) {
        fprintf(stderr, "petrel: --prefix-cache takes on or off, not '%s'\n", a->prefix_cache);
        return -1;
    }
    pt_err err = {{0}};
    if (pt_engine_open(e, &o, &err)) {
        fprintf(stderr, "petrel: %s\n", err.msg);
        return -1;
    }
    if (cli_sargs.draft_model && open_draft(*e, &o)) {
        pt_engine_close(*e);
        *e = NULL;
        return -1;
    }
    return 0;
}
