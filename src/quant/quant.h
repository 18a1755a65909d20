/*
 * quant.h - quantized weight formats: what each one is, and the scalar
 * reference code that quantizes and dequantizes it.
 *
 * Two families (docs/formats.md has the byte layouts and worked examples):
 *
 *   - MLX affine group quantization (PT_AFFINE).  A row of `cols` weights is
 *     cut into groups of group_size (32, 64, 128); each group has a scale s
 *     and a bias b (f16, bf16 or f32) and each weight a `bits`-bit code q
 *     (2, 3, 4, 5, 6, 8), w = s * q + b.  Codes form one little-endian bit
 *     stream per row (code i at bit i * bits), stored as uint32 words.
 *   - GGUF block quants (PT_Q8_0, PT_Q4_0, PT_Q4_K, PT_Q5_K, PT_Q6_K): fixed
 *     blocks of 32 or 256 weights with their scales inside, as llama.cpp
 *     defines them.
 *
 * The code here is the reference: plain C, one element at a time, written
 * to be read against the format description.  The fast kernels live in
 * src/backend/cpu/quant_*.c and are tested against these functions.
 */
#ifndef PETREL_QUANT_H
#define PETREL_QUANT_H

#include "backend/backend.h"
#include "base/base.h"
#include "base/dtype.h"

/* ---- MLX affine ------------------------------------------------------------ */

/* bits in {2,3,4,5,6,8} and group_size in {32,64,128}: what MLX supports. */
bool pt_affine_supported(int bits, int group_size);
/* uint32 words of one packed row (cols must be a multiple of 32). */
int64_t pt_affine_row_words(int64_t cols, int bits);
/* Bytes of the packed codes, and of the scales (or biases), of a matrix. */
size_t pt_affine_code_bytes(int64_t rows, int64_t cols, int bits);
size_t pt_affine_scale_bytes(int64_t rows, int64_t cols, int group_size, pt_dtype scale_dtype);

/* Scale and bias of one group as MLX computes them (in f32, before they are
 * rounded to the stored dtype).  See docs/formats.md for the formula. */
void pt_affine_group_params(const float *w, int group_size, int bits, float *scale, float *bias);
/* Quantizes one row: codes into q (pt_affine_row_words words, fully
 * written), cols / group_size scales and biases stored as scale_dtype. */
void pt_affine_quantize_row(const float *w, int64_t cols, int bits, int group_size,
                            pt_dtype scale_dtype, uint32_t *q, void *scales, void *biases);
/* w[i] = scale * code + bias, in f32 from the stored scale and bias. */
void pt_affine_dequantize_row(const uint32_t *q, const void *scales, const void *biases,
                              pt_dtype scale_dtype, int64_t cols, int bits, int group_size,
                              float *out);

/* Code i of a packed row, and setting it (the word must start zeroed or
 * hold the old code). */
static inline unsigned pt_affine_code(const uint32_t *q, int64_t i, int bits) {
    uint64_t bit = (uint64_t)i * (unsigned)bits;
    uint64_t w = q[bit / 32];
    if (bit % 32 + (unsigned)bits > 32) w |= (uint64_t)q[bit / 32 + 1] << 32;
    return (unsigned)(w >> (bit % 32)) & ((1u << bits) - 1);
}
void pt_affine_set_code(uint32_t *q, int64_t i, int bits, unsigned code);

/* ---- GGUF blocks ----------------------------------------------------------- */

/* Whether t is one of the GGUF block formats above. */
bool pt_gguf_quant_type(pt_dtype t);
/* n elements (a multiple of the type's block) from blocks to f32. */
void pt_gguf_dequantize(pt_dtype t, const void *blocks, float *out, int64_t n);
/* n elements of f32 to blocks.  Q8_0 and Q4_0 round exactly as llama.cpp's
 * reference quantizers do; the k-quants use a simpler min/max search (good
 * for tests and dummy weights; see quant_gguf.c). */
void pt_gguf_quantize(pt_dtype t, const float *x, void *blocks, int64_t n);

/* ---- any weight ------------------------------------------------------------ */

/* Scalar loads and stores of the float types scales come in. */
float pt_quant_load(const void *p, int64_t i, pt_dtype t);
void pt_quant_store(void *p, int64_t i, pt_dtype t, float v);

/* Row r of w (any dtype a pt_weight may hold) as f32. */
void pt_weight_dequantize_row(const pt_weight *w, int64_t r, float *out);
/* Bits per weight of a format, scales included ("4.5" for affine 4/64 with
 * f16 scales; 4.5 for q4_0). */
double pt_weight_bpw(pt_dtype t, int bits, int group_size, pt_dtype scale_dtype);

/* Parses a weight format name: f32, f16, bf16, q8_0, q4_0, q4_k, q5_k,
 * q6_k, affineB (group 64) or affineBgG (e.g. affine4g32).  Scales of
 * affine formats are f16.  Returns -1 on an unknown name. */
typedef struct pt_weight_format {
    pt_dtype dtype;
    int bits, group_size;
    pt_dtype scale_dtype;
} pt_weight_format;
int pt_weight_format_parse(const char *name, pt_weight_format *out);
/* Total bytes of a rows x cols matrix in this format (0 if it does not fit:
 * cols not a multiple of the block or group). */
size_t pt_weight_format_bytes(const pt_weight_format *f, int64_t rows, int64_t cols);

#endif
