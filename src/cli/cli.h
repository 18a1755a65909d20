/*
 * cli.h - the petrel command line: subcommands and a small table-driven
 * option parser shared by all of them.
 *
 * Each subcommand declares its flags as a table of cli_opt rows (name,
 * value kind, where to store it, help text); parsing and --help come from
 * the table, so a flag is documented where it is defined.
 *
 * Numeric flags have ranges, looked up by flag name: the generation
 * parameters in engine/gen_limits.h (the table the OpenAI server checks
 * too), the rest in cli_common.c.  So a flag name means one thing in every
 * command.  A value outside its range is an error naming the flag and the
 * range, never clamped; --help prints each range.
 */
#ifndef PETREL_CLI_H
#define PETREL_CLI_H

#include "engine/engine.h"
#include "engine/gen_limits.h"

enum cli_kind { CLI_FLAG, CLI_INT, CLI_FLOAT, CLI_STR, CLI_U64, CLI_LIST };

/* A flag given several times (CLI_LIST): every value, in order. */
#define CLI_LIST_MAX 64
typedef struct cli_list {
    const char *v[CLI_LIST_MAX];
    int n;
} cli_list;

typedef struct cli_opt {
    const char *name; /* long name without dashes */
    char short_name;  /* 0 if none */
    int kind;         /* enum cli_kind */
    void *dst;        /* bool, int, float, const char *, uint64_t, cli_list */
    const char *arg;  /* value name in help, e.g. "N" */
    const char *help;
} cli_opt;

/* Parses argv[1..argc) against the tables (NULL-terminated list of tables
 * each ended by a row with name NULL; a row shadows later ones of the same
 * name, in parsing and in --help).  Positional arguments are collected
 * in order into pos (at most max_pos).  Returns -1 and prints a message on
 * a bad flag; 1 if --help was given (after printing it). */
int cli_parse(int argc, char **argv, const char *usage, const cli_opt *const *tables,
              const char **pos, int max_pos, int *n_pos);

/* The range of a flag (by its long name), or NULL if it has none. */
const pt_gen_limit *cli_flag_range(const char *name);
/* If x is outside l, prints "petrel: FLAG VALUE is out of range: it must be
 * RANGE" (RANGE from l, then note if not NULL) and returns -1; else 0. */
int cli_check_range(const char *flag, const char *value, double x, const pt_gen_limit *l,
                    const char *note);

/* Flags every model-using subcommand takes, and turning them into options. */
typedef struct cli_model_args {
    const char *model, *device, *kernels, *kv_type, *kv_quant, *kv_budget, *prefix_cache,
        *kv_disk, *kv_disk_size, *dummy_dtype;
    int threads, ctx, batch;
    int gpu_layers; /* -ngl; -1: not given */
    int tensor_parallel; /* --tensor-parallel; 0: not given */
    uint64_t dummy_seed;
    bool verbose;
    bool no_tokenizer; /* set by commands that read token ids, not a flag */
    int max_seqs;      /* set by commands that run one sequence (pt_engine_opts.max_seqs) */
} cli_model_args;

/* The values behind cli_model_opts; cli_model_defaults() resets them. */
extern cli_model_args cli_margs;
extern const cli_opt cli_model_opts[];
void cli_model_defaults(void);
/* Opens the engine the flags describe; prints the error and returns -1. */
int cli_open_engine(pt_engine **e);
/* The same with the model at path instead of --model. */
int cli_open_engine_at(const char *path, pt_engine **e);

/* Speculative decoding flags (generate, serve, bench): --spec, --spec-k,
 * --ngram-min, --ngram-max, --draft-model (which cli_open_engine opens
 * beside the model and attaches as its drafter). */
typedef struct cli_spec_args {
    const char *spec, *draft_model;
    int k, ngram_min, ngram_max;
    bool jump_forward;
} cli_spec_args;
extern cli_spec_args cli_sargs;
extern const cli_opt cli_spec_opts[];
/* The flags as parameters; "oracle:A" only where allow_oracle.  Prints
 * the error and returns -1 on a bad value. */
int cli_spec_params(pt_spec_params *out, bool allow_oracle, float *oracle_accept);

int cmd_generate(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_bench_grammar(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_convert(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_kvcodec(int argc, char **argv);
int cmd_version(int argc, char **argv);
int cmd_chat(int argc, char **argv);

#endif
