/*
 * test_nccl_comm.c - tensor parallel's NCCL side, for a machine with GPUs
 * (docs/tensor-parallel.md; not run where it was written, which had none).
 *
 * 1. A one-rank NCCL communicator on device 0: the all_reduce op on the
 *    CUDA backend leaves the buffer as it was (a sum over one rank).
 * 2. With two or more GPUs, a communicator of all of them: each rank, on
 *    a thread of its own, sums a buffer whose values are small integers
 *    (exact in any order NCCL adds them); every rank must hold the sum.
 * 3. A model through the one-rank communicator (what --tensor-parallel 1
 *    on cuda runs): a dummy Qwen3 prompt and 12 decode steps (long enough
 *    for the decode steps to be replayed as CUDA graphs, so the NCCL call
 *    is captured too) give bit-identical logits to the same model without
 *    the communicator.
 *
 * Exits 77 (skipped) without a CUDA device, or without NCCL (a build
 * without nccl.h, or libnccl.so.2 not on the library path).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/comm.h"
#include "model/model.h"

#define COUNT 1000
#define SKIP 77

static int failures;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                   \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            failures++;                                                                            \
        }                                                                                          \
    } while (0)

typedef struct rank_arg {
    pt_comm *comm;
    pt_backend *be;
    int rank, n;
    float *got; /* [COUNT] host */
} rank_arg;

static float value(int rank, int i) {
    return (float)((rank + 1) * (i % 17)); /* small integers: exact sums */
}

static void *rank_main(void *p) {
    rank_arg *a = p;
    float *host = malloc(sizeof(float) * COUNT);
    for (int i = 0; i < COUNT; i++)
        host[i] = value(a->rank, i);
    float *dev = a->be->ops->alloc(a->be, sizeof(float) * COUNT);
    a->be->ops->upload(a->be, dev, host, sizeof(float) * COUNT);
    pt_be_all_reduce(a->be, a->comm, a->rank, dev, COUNT);
    if (a->be->ops->download(a->be, a->got, dev, sizeof(float) * COUNT))
        fprintf(stderr, "rank %d: %s\n", a->rank, a->be->error.msg);
    a->be->ops->free(a->be, dev, sizeof(float) * COUNT);
    free(host);
    return NULL;
}

/* All-reduce over devices 0..n-1, one thread per rank. */
static void check_ranks(int n) {
    pt_err err = {{0}};
    int *devs = calloc((size_t)n, sizeof *devs);
    for (int i = 0; i < n; i++)
        devs[i] = i;
    pt_comm *comm;
    if (pt_comm_nccl_new(&comm, devs, n, &err)) {
        CHECK(0, "%d ranks: %s", n, err.msg);
        free(devs);
        return;
    }
    rank_arg *a = calloc((size_t)n, sizeof *a);
    pthread_t *th = calloc((size_t)n, sizeof *th);
    for (int r = 0; r < n; r++) {
        a[r] = (rank_arg){.comm = comm, .rank = r, .n = n};
        a[r].got = calloc(COUNT, sizeof(float));
        a[r].be = pt_backend_cuda_new(r, &err);
        CHECK(a[r].be != NULL, "device %d: %s", r, err.msg);
        CHECK(pt_be_has_op(a[r].be, PT_OP_ALL_REDUCE), "the cuda backend lacks all_reduce");
    }
    for (int r = 0; r < n; r++)
        pthread_create(&th[r], NULL, rank_main, &a[r]);
    for (int r = 0; r < n; r++)
        pthread_join(th[r], NULL);
    int bad = 0;
    for (int r = 0; r < n; r++)
        for (int i = 0; i < COUNT; i++) {
            float want = 0;
            for (int q = 0; q < n; q++)
                want += value(q, i);
            bad += a[r].got[i] != want;
        }
    CHECK(bad == 0, "%d ranks: %d of %d sums wrong", n, bad, n * COUNT);
    printf("all_reduce over %d rank%s: %s\n", n, n == 1 ? "" : "s", bad ? "WRONG" : "ok");
    for (int r = 0; r < n; r++) {
        a[r].be->ops->destroy(a[r].be);
        free(a[r].got);
    }
    pt_comm_free(comm);
    free(a);
    free(th);
    free(devs);
}

/* Runs the prompt then decode steps, every row's logits into out. */
static int run_model(pt_model *m, float *out, int n_prompt, int n_gen, pt_err *err) {
    pt_kv_cache kv;
    if (pt_model_kv_init(m, &kv, 64, PT_F32, NULL, err)) return -1;
    pt_kv_seq seq = {0};
    pt_kv_seq *seqs[1] = {&seq};
    int32_t tok[64], pos[64], sid[64] = {0};
    bool want[64];
    for (int i = 0; i < n_prompt + n_gen; i++)
        tok[i] = (i * 131 + 7) % 2000, pos[i] = i, want[i] = true;
    int V = m->cfg.vocab_size, rc = 0;
    pt_batch b = {.n_tokens = n_prompt,
                  .tokens = tok,
                  .pos = pos,
                  .seq = sid,
                  .logits = want,
                  .n_seqs = 1,
                  .seqs = seqs};
    rc = pt_model_run(m, &kv, &b, out, err);
    for (int g = 0; g < n_gen && !rc; g++) {
        int i = n_prompt + g;
        pt_batch d = {.n_tokens = 1,
                      .tokens = tok + i,
                      .pos = pos + i,
                      .seq = sid,
                      .logits = want,
                      .n_seqs = 1,
                      .seqs = seqs};
        rc = pt_model_run(m, &kv, &d, out + (size_t)i * V, err);
    }
    pt_kv_seq_release(&kv, &seq);
    pt_kv_cache_free(&kv);
    return rc;
}

static void check_model(void) {
    enum { PROMPT = 9, GEN = 12 };
    pt_err err = {{0}};
    pt_backend *be = pt_backend_cuda_new(0, &err);
    CHECK(be != NULL, "%s", err.msg);
    if (!be) return;
    pt_model_opts o = {.backend = be, .max_batch = 64, .dummy_dtype = "bf16", .dummy_seed = 3};
    pt_model *m;
    if (pt_model_load(&m, "dummy:" PETREL_SOURCE_DIR "/tests/cuda/tiny-qwen3.json", &o, &err)) {
        CHECK(0, "%s", err.msg);
        be->ops->destroy(be);
        return;
    }
    size_t n = (size_t)(PROMPT + GEN) * m->cfg.vocab_size;
    float *a = calloc(n, sizeof(float)), *b = calloc(n, sizeof(float));
    CHECK(run_model(m, a, PROMPT, GEN, &err) == 0, "whole: %s", err.msg);
    int dev = 0;
    pt_comm *c;
    if (pt_comm_nccl_new(&c, &dev, 1, &err) == 0) {
        pt_model_attach_comm(m, c, 0, true);
        CHECK(pt_model_check_ops(m, &err) == 0, "%s", err.msg);
        CHECK(run_model(m, b, PROMPT, GEN, &err) == 0, "one rank: %s", err.msg);
        CHECK(memcmp(a, b, n * sizeof(float)) == 0,
              "logits through a one-rank NCCL communicator differ from the whole model's");
        printf("model through a one-rank communicator: %s\n",
               memcmp(a, b, n * sizeof(float)) ? "DIFFERS" : "bit-identical");
    } else {
        CHECK(0, "%s", err.msg);
    }
    free(a);
    free(b);
    pt_model_free(m);
    be->ops->destroy(be);
}

int main(void) {
    if (!pt_comm_have_nccl()) {
        printf("no NCCL (a build without nccl.h, or libnccl.so.2 not found): skipped\n");
        return SKIP;
    }
    int devices = pt_backend_cuda_devices();
    if (devices < 1) {
        printf("no CUDA device: skipped\n");
        return SKIP;
    }
    check_ranks(1);
    if (devices > 1) check_ranks(devices);
    check_model();
    printf("%s\n", failures ? "FAILED" : "passed");
    return failures ? 1 : 0;
}
