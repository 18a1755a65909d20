/*
 * main.c - `petrel SUBCOMMAND ...`: a table of subcommands.
 */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"

static const struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *help;
} commands[] = {
    {"generate", cmd_generate, "generate text from a prompt (argument or stdin)"},
    {"tokenize", cmd_tokenize, "print the token ids of a text"},
    {"bench", cmd_bench, "measure prefill and decode speed against the memory roofline"},
    {"eval", cmd_eval, "perplexity of a text, or KL divergence between two models"},
    {"convert", cmd_convert, "quantize a model to an MLX-layout affine directory"},
    {"chat", cmd_chat, "chat with the model in the terminal, through its chat template"},
    {"serve", cmd_serve, "serve the model over an OpenAI-compatible HTTP API"},
    {"kvcodec", cmd_kvcodec, "encode/decode KV rows with a KV-cache codec (JSON in and out)"},
    {"version", cmd_version, "version, git commit, build type, CUDA and CPU kernels (also --version)"},
};

static void usage(FILE *f) {
    fprintf(f, "petrel - LLM inference engine\n\nusage: petrel COMMAND [options]\n\ncommands:\n");
    for (size_t i = 0; i < PT_ARRAY_LEN(commands); i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].help);
    fprintf(f, "\n`petrel COMMAND --help` lists a command's options.  Flags llama.cpp users\n"
               "type work where they mean the same: -m, -c/--ctx-size, -n, -p/--prompt,\n"
               "-t, -b, -ngl/--gpu-layers (device selection), --host, --port, --temp,\n"
               "--top-k, --top-p, --min-p, --seed.\n");
}

int main(int argc, char **argv) {
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (strcmp(argv[1], "--version") == 0) return cmd_version(argc - 1, argv + 1);
    for (size_t i = 0; i < PT_ARRAY_LEN(commands); i++)
        if (strcmp(argv[1], commands[i].name) == 0) return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "petrel: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
