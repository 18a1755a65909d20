/*
 * dtype.h - element types of tensors, plain and block-quantized.
 *
 * A quantized type stores `block` elements in `block_bytes` bytes; plain types
 * have block = 1.  The table in dtype.c is the one place that knows the sizes.
 * GGUF type ids are mapped here too, so the file parser needs no switch.
 */
#ifndef PETREL_DTYPE_H
#define PETREL_DTYPE_H

#include <stddef.h>
#include <stdint.h>

typedef enum pt_dtype {
    PT_F32,
    PT_F16,
    PT_BF16,
    PT_I8,
    PT_I16,
    PT_I32,
    PT_I64,
    PT_U8,
    PT_U32,
    PT_F64,
    PT_BOOL,
    PT_Q8_0, /* GGUF: 32 x int8 + f16 scale */
    PT_Q4_0, /* GGUF: 32 x 4-bit + f16 scale */
    PT_Q4_K, /* GGUF k-quants: 256-element super-blocks */
    PT_Q5_K,
    PT_Q6_K,
    PT_AFFINE, /* MLX affine group quantization: see pt_weight bits/group_size */
    PT_MXFP4,  /* OCP MXFP4 as ggml's block_mxfp4: e8m0 scale byte, then 16 bytes of
                * e2m1 codes (element i low nibble of byte i, i + 16 high) */
    PT_DTYPE_COUNT
} pt_dtype;

typedef struct pt_dtype_info {
    const char *name;   /* "f32", "bf16", "q4_k", ... */
    int block;          /* elements per block */
    int block_bytes;    /* bytes per block */
    int gguf_id;        /* GGUF ggml_type id, -1 if none */
    const char *st_name; /* safetensors dtype string, NULL if none */
} pt_dtype_info;

const pt_dtype_info *pt_dtype_get(pt_dtype t);
const char *pt_dtype_name(pt_dtype t);
/* Returns -1 if the GGUF type id / safetensors name is not one we load. */
int pt_dtype_from_gguf(uint32_t ggml_type);
int pt_dtype_from_safetensors(const char *name);
/* Bytes for n elements (n must be a multiple of the block); 0 on bad input
 * or overflow. */
size_t pt_dtype_bytes(pt_dtype t, uint64_t n);

#endif
