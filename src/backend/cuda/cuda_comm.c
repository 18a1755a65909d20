/*
 * cuda_comm.c - the CUDA side of tensor parallel: NCCL communicators
 * (comm.h's nccl kind) and the all_reduce op, enqueued on the backend's
 * stream like any kernel (so it joins a recorded decode graph; NCCL
 * allows stream capture).
 *
 * NCCL is opened at run time (dlopen of libnccl.so.2, else the library
 * cmake found), not linked: every binary starts on a machine without it
 * (218 MB that a staged build does not carry), and only a communicator
 * needs it.  Without it, or in a build without nccl.h (cmake PETREL_NCCL),
 * the CUDA backend lacks the all_reduce op (has_op) and asking for a
 * communicator says why.
 *
 * Not yet run on a GPU: tests/cuda/test_nccl_comm.c is the self-check
 * (a one-rank communicator, and every device's when there are several).
 */
#include <stdio.h>
#include <stdlib.h>

#include "backend/comm.h"
#include "backend/cuda/cuda_host.h"

#ifdef PETREL_NCCL
#include <dlfcn.h>
#include <nccl.h>
#include <pthread.h>

#ifndef PETREL_NCCL_LIB
#define PETREL_NCCL_LIB "libnccl.so.2"
#endif

/* The four NCCL calls Petrel makes, resolved once. */
static struct {
    void *lib;
    ncclResult_t (*init_all)(ncclComm_t *comms, int ndev, const int *devlist);
    ncclResult_t (*all_reduce)(const void *send, void *recv, size_t count, ncclDataType_t type,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
    ncclResult_t (*destroy)(ncclComm_t comm);
    const char *(*error_string)(ncclResult_t r);
} nccl;
static pthread_once_t nccl_once = PTHREAD_ONCE_INIT;

static void nccl_open(void) {
    void *lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!lib) lib = dlopen(PETREL_NCCL_LIB, RTLD_NOW | RTLD_LOCAL);
    if (!lib) return;
    *(void **)&nccl.init_all = dlsym(lib, "ncclCommInitAll");
    *(void **)&nccl.all_reduce = dlsym(lib, "ncclAllReduce");
    *(void **)&nccl.destroy = dlsym(lib, "ncclCommDestroy");
    *(void **)&nccl.error_string = dlsym(lib, "ncclGetErrorString");
    if (nccl.init_all && nccl.all_reduce && nccl.destroy && nccl.error_string)
        nccl.lib = lib;
    else
        dlclose(lib);
}

bool pt_cuda_nccl_available(void) {
    pthread_once(&nccl_once, nccl_open);
    return nccl.lib != NULL;
}

int pt_cuda_nccl_init_all(void **comms, const int *devices, int n, char *msg, size_t cap) {
    if (!pt_cuda_nccl_available())
        return snprintf(msg, cap, "libnccl.so.2 was not found (LD_LIBRARY_PATH)"), -1;
    ncclComm_t *c = calloc((size_t)n, sizeof *c);
    if (!c) return snprintf(msg, cap, "out of memory"), -1;
    ncclResult_t r = nccl.init_all(c, n, devices);
    if (r != ncclSuccess) {
        snprintf(msg, cap, "ncclCommInitAll: %s", nccl.error_string(r));
        free(c);
        return -1;
    }
    for (int i = 0; i < n; i++)
        comms[i] = c[i];
    free(c);
    return 0;
}

void pt_cuda_nccl_destroy(void *comm) {
    if (pt_cuda_nccl_available()) nccl.destroy((ncclComm_t)comm);
}
#endif

void cuda_all_reduce(cuda_backend *cb, const pt_op_all_reduce *a) {
#ifdef PETREL_NCCL
    ncclComm_t comm = pt_comm_nccl_handle(a->comm, a->rank);
    if (!comm) {
        cuda_fail(cb, "all_reduce", "the communicator is not an NCCL one");
        return;
    }
    ncclResult_t r = nccl.all_reduce(a->buf, a->buf, a->count, ncclFloat, ncclSum, comm, cb->ctx.s);
    if (r != ncclSuccess) cuda_fail(cb, "all_reduce", nccl.error_string(r));
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
