/*
 * cuda_bandwidth.c - the read-bandwidth probe: what decode, which only
 * streams weights and cache, can reach on this device (for rooflines).
 * Measured once per backend and kept.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_host.h"

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Median seconds of reps runs of a read kernel (kind 0) or a device-to-
 * device copy of half the buffer onto the other half (kind 1); 0 if a
 * CUDA call failed (the backend's sticky error says which). */
static double time_median(cuda_backend *cb, int kind, void *buf, size_t nbytes, float *sink,
                          int reps) {
    const char *what = "read_bandwidth";
    cudaEvent_t e0, e1;
    if (!cuda_ok(cb, cudaEventCreate(&e0), what)) return 0;
    if (!cuda_ok(cb, cudaEventCreate(&e1), what)) {
        cudaEventDestroy(e0);
        return 0;
    }
    double t[32];
    if (reps > 32) reps = 32;
    bool ok = true;
    for (int i = -2; i < reps && ok; i++) { /* two warm-ups */
        ok = cuda_ok(cb, cudaEventRecord(e0, cb->ctx.s), what);
        if (kind == 0) cu_read_kernel(&cb->ctx, buf, nbytes, sink);
        else
            ok = ok && cuda_ok(cb, cudaMemcpyAsync((char *)buf + nbytes / 2, buf, nbytes / 2,
                                                   cudaMemcpyDeviceToDevice, cb->ctx.s),
                               what);
        ok = ok && cuda_ok(cb, cudaEventRecord(e1, cb->ctx.s), what) &&
             cuda_ok(cb, cudaEventSynchronize(e1), what);
        float ms = 0;
        ok = ok && cuda_ok(cb, cudaEventElapsedTime(&ms, e0, e1), what);
        if (i >= 0) t[i] = ms / 1e3;
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    if (!ok) return 0;
    qsort(t, (size_t)reps, sizeof t[0], cmp_double);
    return t[reps / 2];
}

/* Bytes/s of a streaming read kernel over 2 GiB (16-byte loads that skip
 * L1, far larger than L2): the roofline of decode, which only reads.  The
 * device-to-device copy rate (bytes read + written) is logged beside it.
 * 0: not measured. */
double cuda_read_bandwidth(pt_backend *be) {
    cuda_backend *cb = cb_of(be);
    if (cb->read_bw > 0) return cb->read_bw;
    cuda_flush(cb);
    size_t nbytes = (size_t)2 << 30;
    void *buf = NULL;
    while (nbytes >= ((size_t)64 << 20) && cudaMalloc(&buf, nbytes) != cudaSuccess) {
        cudaGetLastError();
        nbytes /= 2;
    }
    if (!buf) return 0;
    float *sink = NULL;
    double tr = 0, tc = 0;
    if (cuda_ok(cb, cudaMalloc((void **)&sink, 16), "read_bandwidth") &&
        cuda_ok(cb, cudaMemsetAsync(buf, 0x5a, nbytes, cb->ctx.s), "read_bandwidth")) {
        tr = time_median(cb, 0, buf, nbytes, sink, 15);
        tc = time_median(cb, 1, buf, nbytes, sink, 15);
    }
    if (sink) cudaFree(sink);
    cudaFree(buf);
    if (tr <= 0 || tc <= 0) return 0;
    cb->read_bw = (double)nbytes / tr;
    pt_info("cuda: read kernel %.0f GB/s; device-to-device copy %.0f GB/s (read + written), "
            "%.2f GiB buffer",
            cb->read_bw / 1e9, (double)nbytes / tc / 1e9, nbytes / 1073741824.0);
    size_t len = strlen(cb->detail);
    snprintf(cb->detail + len, sizeof cb->detail - len, "; read %.0f GB/s, copy %.0f GB/s",
             cb->read_bw / 1e9, (double)nbytes / tc / 1e9);
    return cb->read_bw;
}
