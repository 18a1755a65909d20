/*
 * backend.c - choosing a backend by name, and the names of ops.
 */
#include "backend/backend.h"

static const char *const op_names[PT_OP_COUNT] = {
    [PT_OP_MATMUL] = "matmul",       [PT_OP_EMBED] = "embed",       [PT_OP_RMSNORM] = "rmsnorm",
    [PT_OP_ADD] = "add",             [PT_OP_ADD_BIAS] = "add_bias", [PT_OP_SWIGLU] = "swiglu",
    [PT_OP_ROPE] = "rope",           [PT_OP_KV_STORE] = "kv_store", [PT_OP_ATTENTION] = "attention",
    [PT_OP_GATHER_ROWS] = "gather_rows",
};

const char *pt_op_name(int kind) {
    return kind >= 0 && kind < PT_OP_COUNT && op_names[kind] ? op_names[kind] : "?";
}

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
