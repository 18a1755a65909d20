/*
 * cuda_comm.c - the CUDA side of tensor parallel: NCCL communicators
 * (comm.h's nccl kind) and the all_reduce op, enqueued on the backend's
 * stream like any kernel (so it joins a recorded decode graph; NCCL
 * allows stream capture).  Without NCCL (cmake PETREL_NCCL off or not
 * found) the op is missing (has_op says so) and only the device count is
 * here.
 *
 * Not yet run on a GPU: tests/cuda/test_nccl_comm.c is the self-check
 * (a one-rank communicator, and every device's when there are several).
 */
#include <stdio.h>
#include <stdlib.h>

#include "backend/comm.h"
#include "backend/cuda/cuda_host.h"

#ifdef PETREL_NCCL
#include <nccl.h>

int pt_cuda_nccl_init_all(void **comms, const int *devices, int n, char *msg, size_t cap) {
    ncclComm_t *c = calloc((size_t)n, sizeof *c);
    if (!c) return snprintf(msg, cap, "out of memory"), -1;
    ncclResult_t r = ncclCommInitAll(c, n, devices);
    if (r != ncclSuccess) {
        snprintf(msg, cap, "ncclCommInitAll: %s", ncclGetErrorString(r));
        free(c);
        return -1;
    }
    for (int i = 0; i < n; i++)
        comms[i] = c[i];
    free(c);
    return 0;
}

void pt_cuda_nccl_destroy(void *comm) {
    ncclCommDestroy((ncclComm_t)comm);
}
#endif

void cuda_all_reduce(cuda_backend *cb, const pt_op_all_reduce *a) {
#ifdef PETREL_NCCL
    ncclComm_t comm = pt_comm_nccl_handle(a->comm, a->rank);
    if (!comm) {
        cuda_fail(cb, "all_reduce", "the communicator is not an NCCL one");
        return;
    }
    ncclResult_t r = ncclAllReduce(a->buf, a->buf, a->count, ncclFloat, ncclSum, comm, cb->ctx.s);
    if (r != ncclSuccess) cuda_fail(cb, "all_reduce", ncclGetErrorString(r));
#else
    cuda_fail(cb, "all_reduce", "this build has no NCCL");
#endif
}

int pt_backend_cuda_devices(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError(); /* no driver or no device: clear the error, count none */
        return 0;
    }
    return n;
}
