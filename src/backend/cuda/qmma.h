/*
 * qmma.h - the tensor-core GEMM for q4_0/q8_0 weights (qmma.cu), for the
 * backend's matmul dispatch (cuda_backend.c).  Its own header so that
 * changing it recompiles one kernel file, not every one.
 */
#ifndef PETREL_QMMA_H
#define PETREL_QMMA_H

#include "backend/cuda/cuda_internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Sets the kernels' shared-memory limits and allocates the split
 * counters (*counters, device memory: free it with cudaFree); once per
 * device, before any capture.  -1: no counters (cu_qmma takes nothing). */
int cu_qmma_init(int **counters);
/* Whether cu_qmma takes this weight: q4_0 or q8_0 that the kernels take. */
int cu_qmma_takes(const cu_qweight *w, int n);
/* Scratch of an n-row call: the activations as f16, and the partial sums
 * of K splits (0: none). */
size_t cu_qmma_act_bytes(const cu_qweight *w, int n);
size_t cu_qmma_part_bytes(const cu_ctx *c, const cu_qweight *w, int n);
/* y[n][rows] = x[n][cols] · wᵀ, weights decoded in shared memory and
 * multiplied on the tensor cores (f16 operands, f32 sums); -1: not taken. */
int cu_qmma(const cu_ctx *c, float *y, const float *x, const cu_qweight *w, int n, void *act,
            void *part, int *counters);

/* qmms.cu: the tensor-core GEMM on the row-split layout (CU_LAYOUT_SPLIT).
 * cu_qmms_init sets its shared-memory limits (once per device, before any
 * capture); cu_qmms_takes: whether it takes w (q4_0/q8_0, split layout);
 * cu_qmms_act_bytes: its scratch for an n-row call (the activations as
 * f16); cu_qmms: y[n][rows] = x[n][cols] · wᵀ, -1 if not taken. */
void cu_qmms_init(void);
int cu_qmms_takes(const cu_qweight *w, int n);
size_t cu_qmms_act_bytes(const cu_qweight *w, int n);
int cu_qmms(const cu_ctx *c, float *y, const float *x, const cu_qweight *w, int n, void *act);

#ifdef __cplusplus
}
#endif

#endif
