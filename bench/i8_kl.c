/*
 * i8_kl.c - what int8 activations cost a whole model: the same GGUF run
 * twice in one process, quantized prefill on the int8 GEMM (A) and on the
 * int16 row kernels (B, PETREL_CPU_INT8=0), compared with pt_eval_kl on
 * token ids (KL of the next-token distributions, top-1 agreement).  Not a
 * test and not in the build:
 *
 *   gcc -O2 -std=c11 -D_GNU_SOURCE -Isrc -Iinclude bench/i8_kl.c build/libpetrel_eval.a \
 *       build/libpetrel_engine.a build/libpetrel_model.a build/libpetrel_kv.a \
 *       build/libpetrel_sample.a build/libpetrel_backend.a build/libpetrel_quant.a \
 *       build/libpetrel_io.a build/libpetrel_tokenizer.a build/libpetrel_base.a \
 *       -ljansson -lpcre2-8 -lutf8proc -lxxhash -lpthread -lm -o /tmp/i8_kl
 *   /tmp/i8_kl MODEL.gguf IDS.txt [window] [threads]
 */
#include <stdio.h>
#include <stdlib.h>

#include "eval/eval.h"

static pt_engine *open_engine(const char *path, const char *i8, int window, int threads) {
    setenv("PETREL_CPU_INT8", i8, 1); /* read when the backend is created */
    pt_engine_opts o = {.model_path = path, .n_threads = threads, .n_ctx = window,
                        .max_batch = window, .kv_dtype = PT_F16, .no_tokenizer = true};
    pt_engine *e;
    pt_err err = {{0}};
    if (pt_engine_open(&e, &o, &err)) {
        fprintf(stderr, "i8_kl: %s\n", err.msg);
        exit(1);
    }
    fprintf(stderr, "i8_kl: %s backend: %s\n", i8[0] == '1' ? "A" : "B", e->be->detail);
    return e;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: i8_kl MODEL.gguf IDS.txt [window] [threads]\n");
        return 2;
    }
    int window = argc > 3 ? atoi(argv[3]) : 128, threads = argc > 4 ? atoi(argv[4]) : 0;
    FILE *f = fopen(argv[2], "r");
    if (!f) return perror(argv[2]), 1;
    int32_t *ids = malloc(sizeof(int32_t) * 1000000);
    int n = 0, v;
    while (n < 1000000 && fscanf(f, "%d", &v) == 1) ids[n++] = v;
    fclose(f);
    pt_engine *a = open_engine(argv[1], "1", window, threads), *b = open_engine(argv[1], "0", window, threads);
    for (int i = 0; i < n; i++) ids[i] = ids[i] % a->model->cfg.vocab_size;
    pt_eval_result r;
    pt_err err = {{0}};
    if (pt_eval_kl(a, b, ids, n, window, NULL, NULL, &r, &err)) {
        fprintf(stderr, "i8_kl: %s\n", err.msg);
        return 1;
    }
    printf("%s: %d tokens scored, window %d: KL mean %.3g, p99 %.3g, max %.3g, top-1 agree %.4f, "
           "ppl %.4f\n", argv[1], r.n_scored, window, r.kl_mean, r.kl_p99, r.kl_max, r.top1_agree, r.ppl);
    pt_engine_close(a);
    pt_engine_close(b);
    free(ids);
    return 0;
}
