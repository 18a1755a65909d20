/*
 * dtype.c - the table of element types.
 */
#include "base/dtype.h"

#include "base/base.h"

static const pt_dtype_info infos[PT_DTYPE_COUNT] = {
    [PT_F32] = {"f32", 1, 4, 0, "F32"},
    [PT_F16] = {"f16", 1, 2, 1, "F16"},
    [PT_BF16] = {"bf16", 1, 2, 30, "BF16"},
    [PT_I8] = {"i8", 1, 1, 24, "I8"},
    [PT_I16] = {"i16", 1, 2, 25, "I16"},
    [PT_I32] = {"i32", 1, 4, 26, "I32"},
    [PT_I64] = {"i64", 1, 8, 27, "I64"},
    [PT_U8] = {"u8", 1, 1, -1, "U8"},
    [PT_U32] = {"u32", 1, 4, -1, "U32"},
    [PT_F64] = {"f64", 1, 8, 28, "F64"},
    [PT_BOOL] = {"bool", 1, 1, -1, "BOOL"},
    [PT_Q8_0] = {"q8_0", 32, 34, 8, NULL},
    [PT_Q4_0] = {"q4_0", 32, 18, 2, NULL},
    [PT_Q4_K] = {"q4_k", 256, 144, 12, NULL},
    [PT_Q5_K] = {"q5_k", 256, 176, 13, NULL},
    [PT_Q6_K] = {"q6_k", 256, 210, 14, NULL},
    /* bits and group size vary per tensor: sizes come from src/quant/ */
    [PT_AFFINE] = {"affine", 0, 0, -1, NULL},
    [PT_MXFP4] = {"mxfp4", 32, 17, 39, NULL},
};

const pt_dtype_info *pt_dtype_get(pt_dtype t) {
    return (unsigned)t < PT_DTYPE_COUNT ? &infos[t] : NULL;
}

const char *pt_dtype_name(pt_dtype t) {
    return (unsigned)t < PT_DTYPE_COUNT ? infos[t].name : "invalid";
}

int pt_dtype_from_gguf(uint32_t ggml_type) {
    for (int t = 0; t < PT_DTYPE_COUNT; t++)
        if (infos[t].gguf_id >= 0 && (uint32_t)infos[t].gguf_id == ggml_type) return t;
    return -1;
}

int pt_dtype_from_safetensors(const char *name) {
    for (int t = 0; t < PT_DTYPE_COUNT; t++)
        if (infos[t].st_name && strcmp(infos[t].st_name, name) == 0) return t;
    return -1;
}

size_t pt_dtype_bytes(pt_dtype t, uint64_t n) {
    const pt_dtype_info *d = pt_dtype_get(t);
    size_t out;
    if (!d || d->block == 0 || n % (uint64_t)d->block) return 0;
    if (!pt_mul_ok((size_t)(n / (uint64_t)d->block), (size_t)d->block_bytes, &out)) return 0;
    return out;
}
