/*
 * backend.c - choosing a backend by name.
 */
#include "backend/backend.h"

pt_backend *pt_backend_open(const char *device, int n_threads, const char *kernels, pt_err *err) {
    if (!device || strcmp(device, "cpu") == 0)
        return pt_backend_cpu_new(n_threads, kernels ? kernels : "auto", err);
    if (strcmp(device, "cuda") == 0) {
#ifdef PETREL_CUDA
        return pt_backend_cuda_new(0, err);
#else
        pt_fail(err, "this build has no CUDA backend (rebuild with -DPETREL_CUDA=ON where nvcc "
                     "is installed)");
        return NULL;
#endif
    }
    pt_fail(err, "unknown device '%s' (cpu or cuda)", device);
    return NULL;
}
