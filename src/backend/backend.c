/*
 * backend.c - choosing a backend by name ("cpu", "cuda", "cuda:N"), and the
 * names of ops.
 */
#include <stdio.h>
#include <stdlib.h>

#include "backend/backend.h"

static const char *const op_names[PT_OP_COUNT] = {
    [PT_OP_MATMUL] = "matmul",       [PT_OP_EMBED] = "embed",       [PT_OP_RMSNORM] = "rmsnorm",
    [PT_OP_ADD] = "add",             [PT_OP_ADD_BIAS] = "add_bias", [PT_OP_SWIGLU] = "swiglu",
    [PT_OP_ROPE] = "rope",           [PT_OP_KV_STORE] = "kv_store", [PT_OP_ATTENTION] = "attention",
    [PT_OP_GATHER_ROWS] = "gather_rows",
    [PT_OP_ATTENTION_EXT] = "attention_ext", [PT_OP_GEGLU] = "geglu", [PT_OP_SCALE] = "scale",
    [PT_OP_SOFTCAP] = "softcap",     [PT_OP_MOE_ROUTE] = "moe_route",
    [PT_OP_MATMUL_ID] = "matmul_id", [PT_OP_MOE_COMBINE] = "moe_combine",
    [PT_OP_SWIGLU_OAI] = "swiglu_oai", [PT_OP_ADD_ID] = "add_id",
    [PT_OP_GATHER_COLS] = "gather_cols", [PT_OP_SIGMOID_MUL] = "sigmoid_mul",
    [PT_OP_CONV1D_SILU] = "conv1d_silu", [PT_OP_GATED_DELTA] = "gated_delta",
    [PT_OP_RMSNORM_GATED] = "rmsnorm_gated", [PT_OP_COPY_COLS] = "copy_cols",
    [PT_OP_MOE_ROUTE_GROUPED] = "moe_route_grouped", [PT_OP_ALL_REDUCE] = "all_reduce",
    [PT_OP_MOE_LOCAL] = "moe_local", [PT_OP_MOE_FFN] = "moe_ffn",
    [PT_OP_ARGMAX] = "argmax",
};

const char *pt_op_name(int kind) {
    return kind >= 0 && kind < PT_OP_COUNT && op_names[kind] ? op_names[kind] : "?";
}

int pt_be_fail(pt_backend *be, const char *what, const char *fmt, ...) {
    char msg[384];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (be->failed) { /* the first failure is the cause; later ones follow from it */
        pt_debug("%s backend: also failed: %s: %s", be->name, what, msg);
        return -1;
    }
    be->failed = true;
    snprintf(be->error.msg, sizeof be->error.msg, "%s backend: %s: %s", be->name, what, msg);
    pt_warn("%s", be->error.msg);
    return -1;
}

int pt_be_take_error(pt_backend *be, pt_err *err) {
    if (!be->failed) return 0;
    pt_fail(err, "%s", be->error.msg);
    be->failed = false;
    be->error.msg[0] = 0;
    return -1;
}

/* "cuda" is device 0, "cuda:N" device N; -1 (with err set) otherwise. */
static int cuda_ordinal(const char *device, pt_err *err) {
    if (strcmp(device, "cuda") == 0) return 0;
    const char *p = device + 5; /* after "cuda:" */
    char *end = NULL;
    long n = *p >= '0' && *p <= '9' ? strtol(p, &end, 10) : -1;
    if (n < 0 || n > 1023 || !end || *end)
        return pt_fail(err, "device '%s': expected cuda or cuda:N with N a device number "
                            "(0, 1, ...)", device);
    return (int)n;
}

pt_backend *pt_backend_open(const char *device, int n_threads, const char *kernels, pt_err *err) {
    if (!device || strcmp(device, "cpu") == 0)
        return pt_backend_cpu_new(n_threads, kernels ? kernels : "auto", err);
    if (strcmp(device, "cuda") == 0 || strncmp(device, "cuda:", 5) == 0) {
        int ordinal = cuda_ordinal(device, err);
        if (ordinal < 0) return NULL;
#ifdef PETREL_CUDA
        return pt_backend_cuda_new(ordinal, err);
#else
        pt_fail(err, "this build has no CUDA backend (rebuild with -DPETREL_CUDA=ON where nvcc "
                     "is installed)");
        return NULL;
#endif
    }
    pt_fail(err, "unknown device '%s' (cpu, cuda or cuda:N)", device);
    return NULL;
}

bool pt_backend_is_cuda(const char *device) {
    return device && (strcmp(device, "cuda") == 0 || strncmp(device, "cuda:", 5) == 0);
}

#ifndef PETREL_CUDA
int pt_backend_cuda_devices(void) {
    return 0;
}
#endif
