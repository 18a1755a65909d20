/*
 * petrel_logits.c - Petrel's logits for given token ids, printed as
 * llama_ref_logits.c prints llama.cpp's, so scripts/llama-ref/crosscheck.py
 * and kl.py compare the two engines (or two files in one engine) on the
 * same ids: each prompt in one batch, the logits at every position, then
 * greedy decoding one token at a time through the KV cache (f32), with the
 * logits each greedy token was chosen from.  Not part of the build; after
 * building Petrel (build/):
 *
 *   cc -O2 -std=c11 -D_GNU_SOURCE -Isrc -Iinclude scripts/llama-ref/petrel_logits.c \
 *       build/libpetrel_model.a build/libpetrel_kv.a build/libpetrel_backend.a \
 *       build/libpetrel_quant.a build/libpetrel_io.a build/libpetrel_base.a \
 *       -ljansson -lxxhash -lpthread -lm -o build/petrel-logits
 *   build/petrel-logits MODEL N_GREEDY IDS [IDS...]     (IDS: 1,2,3)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"

#define REF_TOOL "petrel-logits"
#include "ref_print.h"

static void run_prompt(pt_model *m, pt_kv_cache *kv, const int32_t *ids, int n, int n_greedy) {
    int vocab = m->cfg.vocab_size;
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)n), *pos = malloc(sizeof(int32_t) * (size_t)n);
    int32_t *seq = calloc((size_t)n, sizeof(int32_t)), *am = malloc(sizeof(int32_t) * (size_t)n);
    int32_t *greedy = malloc(sizeof(int32_t) * (size_t)(n_greedy + 1));
    bool *want = malloc((size_t)n);
    float *logits = malloc(sizeof(float) * (size_t)n * (size_t)vocab);
    memcpy(tok, ids, sizeof(int32_t) * (size_t)n);
    for (int i = 0; i < n; i++) pos[i] = i, want[i] = true;
    pt_kv_seq s = {0};
    pt_kv_seq *seqs[1] = {&s};
    pt_batch b = {n, tok, pos, seq, want, 1, seqs};
    pt_err err = {{0}};
    if (pt_model_run(m, kv, &b, logits, &err)) die(err.msg);
    printf("\"logits\":[");
    for (int i = 0; i < n; i++) {
        if (i) putchar(',');
        print_row(logits + (size_t)i * vocab, vocab);
        am[i] = argmax(logits + (size_t)i * vocab, vocab);
    }
    printf("],");
    print_ids("argmax", am, n);
    printf(",\"greedy_logits\":[");
    int32_t next = am[n - 1];
    print_row(logits + (size_t)(n - 1) * vocab, vocab);
    for (int step = 0; step < n_greedy; step++) {
        greedy[step] = next;
        if (step == n_greedy - 1) break;
        int32_t p1 = n + step, s0 = 0;
        bool w = true;
        pt_batch d = {1, &next, &p1, &s0, &w, 1, seqs};
        if (pt_model_run(m, kv, &d, logits, &err)) die(err.msg);
        putchar(',');
        print_row(logits, vocab);
        next = argmax(logits, vocab);
    }
    printf("],");
    print_ids("greedy", greedy, n_greedy);
    putchar('}');
    pt_kv_seq_release(kv, &s);
    free(tok), free(pos), free(seq), free(am), free(greedy), free(want), free(logits);
}

int main(int argc, char **argv) {
    if (argc < 4) die("usage: petrel-logits MODEL N_GREEDY IDS [IDS...]");
    int n_greedy = atoi(argv[2]);
    if (n_greedy < 1) die("N_GREEDY must be at least 1");
    pt_err err = {{0}};
    pt_backend *be = pt_backend_cpu_new(2, "auto", &err);
    if (!be) die(err.msg);
    pt_model_opts o = {.backend = be};
    pt_model *m;
    if (pt_model_load(&m, argv[1], &o, &err)) die(err.msg);
    pt_kv_cache kv;
    if (pt_model_kv_init(m, &kv, 256, PT_F32, NULL, &err)) die(err.msg);
    printf("{\"reference\":\"petrel\",\"vocab\":%d,\"n_greedy\":%d,\"prompts\":[", m->cfg.vocab_size,
           n_greedy);
    static int32_t ids[4096];
    for (int a = 3; a < argc; a++) {
        int n = parse_ids(argv[a], ids, 4096);
        if (a > 3) putchar(',');
        printf("{");
        print_ids("tokens", ids, n);
        printf(",");
        run_prompt(m, &kv, ids, n, n_greedy);
    }
    printf("]}\n");
    pt_kv_cache_free(&kv);
    pt_model_free(m);
    be->ops->destroy(be);
    return 0;
}
