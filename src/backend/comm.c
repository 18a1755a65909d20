/*
 * comm.c - communicators (comm.h): the host kind, and the NCCL kind's
 * setup (NCCL itself, opened at run time, and its all_reduce are the CUDA
 * backend's: cuda/cuda_comm.c).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "backend/comm.h"

struct pt_comm {
    int kind, n;
    /* host: the ranks meet at the barrier twice per all_reduce; bufs[r] is
     * rank r's buffer while one runs */
    pthread_barrier_t barrier;
    float **bufs;
    /* nccl: one ncclComm_t per rank */
    void **nccl;
};

pt_comm *pt_comm_host_new(int n) {
    pt_comm *c = pt_xcalloc(1, sizeof *c);
    c->kind = PT_COMM_HOST;
    c->n = n;
    c->bufs = pt_xcalloc((size_t)n, sizeof *c->bufs);
    if (pthread_barrier_init(&c->barrier, NULL, (unsigned)n) != 0) { /* only EAGAIN/ENOMEM */
        fprintf(stderr, "petrel: cannot make a barrier of %d threads\n", n);
        abort();
    }
    return c;
}

int pt_comm_size(const pt_comm *c) {
    return c->n;
}

int pt_comm_kind(const pt_comm *c) {
    return c->kind;
}

/* Rank r owns the slice [count*r/n, count*(r+1)/n) of every buffer: it
 * reads that slice from all of them and writes the sum into all of them.
 * No two ranks touch the same floats, so the only waits are the two
 * barriers: everyone's partial result is ready, everyone's sum is written. */
void pt_comm_host_all_reduce(pt_comm *c, int rank, float *buf, size_t count) {
    int n = c->n;
    c->bufs[rank] = buf;
    pthread_barrier_wait(&c->barrier);
    size_t lo = count * (size_t)rank / (size_t)n, hi = count * (size_t)(rank + 1) / (size_t)n;
    for (size_t i = lo; i < hi; i++) {
        float s = c->bufs[0][i];
        for (int r = 1; r < n; r++)
            s += c->bufs[r][i];
        for (int r = 0; r < n; r++)
            c->bufs[r][i] = s;
    }
    pthread_barrier_wait(&c->barrier);
}

/* ---- NCCL ------------------------------------------------------------------- */

#ifdef PETREL_NCCL
/* cuda/cuda_comm.c: NCCL, opened at run time */
bool pt_cuda_nccl_available(void);
int pt_cuda_nccl_init_all(void **comms, const int *devices, int n, char *msg, size_t cap);
void pt_cuda_nccl_destroy(void *comm);
#endif

bool pt_comm_have_nccl(void) {
#ifdef PETREL_NCCL
    return pt_cuda_nccl_available();
#else
    return false;
#endif
}

int pt_comm_nccl_new(pt_comm **out, const int *devices, int n, pt_err *err) {
    *out = NULL;
#ifdef PETREL_NCCL
    pt_comm *c = pt_xcalloc(1, sizeof *c);
    c->kind = PT_COMM_NCCL;
    c->n = n;
    c->nccl = pt_xcalloc((size_t)n, sizeof *c->nccl);
    char msg[256];
    if (pt_cuda_nccl_init_all(c->nccl, devices, n, msg, sizeof msg)) {
        free(c->nccl);
        free(c);
        return pt_fail(err, "NCCL communicator of %d rank%s: %s", n, n == 1 ? "" : "s", msg);
    }
    *out = c;
    return 0;
#else
    (void)devices;
    return pt_fail(err,
                   "tensor parallel on CUDA (%d rank%s) needs NCCL, and this build has none "
                   "(cmake -DPETREL_NCCL=ON where nccl.h and libnccl are installed)",
                   n, n == 1 ? "" : "s");
#endif
}

void *pt_comm_nccl_handle(const pt_comm *c, int rank) {
    return c->kind == PT_COMM_NCCL && rank >= 0 && rank < c->n ? c->nccl[rank] : NULL;
}

void pt_comm_free(pt_comm *c) {
    if (!c) return;
    if (c->kind == PT_COMM_HOST) pthread_barrier_destroy(&c->barrier);
#ifdef PETREL_NCCL
    for (int r = 0; c->kind == PT_COMM_NCCL && r < c->n; r++)
        if (c->nccl[r]) pt_cuda_nccl_destroy(c->nccl[r]);
#endif
    free(c->bufs);
    free(c->nccl);
    free(c);
}
