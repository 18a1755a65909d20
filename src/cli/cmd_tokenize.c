/*
 * cmd_tokenize.c - `petrel tokenize`: token ids (and pieces) of a text.
 */
#include <stdio.h>
#include <stdlib.h>

#include "cli/cli.h"

static struct {
    bool no_bos, special, pieces;
} t;

static const cli_opt tok_opts[] = {
    {"no-bos", 0, CLI_FLAG, &t.no_bos, NULL, "do not add the BOS token"},
    {"special", 0, CLI_FLAG, &t.special, NULL, "parse special-token text"},
    {"pieces", 0, CLI_FLAG, &t.pieces, NULL, "print each id with its text"},
    {NULL, 0, 0, NULL, NULL, NULL},
};

int cmd_tokenize(int argc, char **argv) {
    cli_model_defaults();
    memset(&t, 0, sizeof t);
    const cli_opt *tables[] = {tok_opts, cli_model_opts, NULL};
    const char *pos[1];
    int n_pos;
    int rc = cli_parse(argc, argv, "petrel tokenize [options] TEXT", tables, pos, 1, &n_pos);
    if (rc) return rc < 0 ? 2 : 0;
    if (n_pos != 1) {
        fprintf(stderr, "petrel tokenize: give one TEXT argument\n");
        return 2;
    }
    pt_err err = {{0}};
    pt_model_file *mf;
    pt_tokenizer *tok;
    /* Only the tokenizer is needed: no weights are bound. */
    if (pt_model_file_open(&mf, cli_margs.model, &err)) {
        fprintf(stderr, "petrel: %s\n", err.msg);
        return 1;
    }
    if (pt_tokenizer_load(&tok, mf, &err)) {
        fprintf(stderr, "petrel: %s\n", err.msg);
        pt_model_file_close(mf);
        return 1;
    }
    int32_t *ids;
    size_t n;
    if (pt_tokenize(tok, pos[0], strlen(pos[0]), !t.no_bos, t.special, &ids, &n, &err)) {
        fprintf(stderr, "petrel: %s\n", err.msg);
        rc = 1;
    } else {
        for (size_t i = 0; i < n; i++) {
            if (t.pieces) {
                size_t len;
                const char *b = pt_token_bytes(tok, ids[i], &len);
                printf("%d\t'%.*s'\n", ids[i], (int)len, b);
            } else {
                printf("%s%d", i ? " " : "", ids[i]);
            }
        }
        if (!t.pieces) printf("\n");
        free(ids);
    }
    pt_tokenizer_free(tok);
    pt_model_file_close(mf);
    return rc;
}
