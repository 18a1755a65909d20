/*
 * affine.c - MLX affine group quantization, the reference implementation.
 *
 * What MLX computes for one group of g weights at b bits (its CPU quantize
 * and Metal kernel agree; the documentation gives the simpler min/max form,
 * which this refines so that the group's larger-magnitude edge, and hence
 * zero, land exactly on a code):
 *
 *     n      = 2^b - 1
 *     s      = max((max - min) / n, 1e-7)
 *     if |min| > |max|:  edge = min          (s stays positive)
 *     else:              edge = max, s = -s  (codes count down from max)
 *     q0     = rint(edge / s)
 *     if q0 != 0:        s = edge / q0, bias = edge
 *     else:              bias = 0
 *     code_i = clamp(rint((w_i - bias) / s), 0, n)
 *
 * The codes use the f32 scale; the stored scale and bias are that scale
 * and bias rounded to the scale dtype (the weights' dtype in MLX), and the
 * weight is read back as w = scale * code + bias.  rint rounds halfway
 * cases to even, as MLX's CPU path does.
 */
#include <math.h>

#include "quant/quant.h"

bool pt_affine_supported(int bits, int group_size) {
    static const int ok_bits[] = {2, 3, 4, 5, 6, 8}, ok_groups[] = {32, 64, 128};
    bool b = false, g = false;
    for (size_t i = 0; i < PT_ARRAY_LEN(ok_bits); i++) b |= ok_bits[i] == bits;
    for (size_t i = 0; i < PT_ARRAY_LEN(ok_groups); i++) g |= ok_groups[i] == group_size;
    return b && g;
}

int64_t pt_affine_row_words(int64_t cols, int bits) {
    return cols * bits / 32;
}

size_t pt_affine_code_bytes(int64_t rows, int64_t cols, int bits) {
    return (size_t)rows * (size_t)pt_affine_row_words(cols, bits) * 4;
}

size_t pt_affine_scale_bytes(int64_t rows, int64_t cols, int group_size, pt_dtype scale_dtype) {
    return (size_t)rows * (size_t)(cols / group_size) * pt_dtype_bytes(scale_dtype, 1);
}

void pt_affine_set_code(uint32_t *q, int64_t i, int bits, unsigned code) {
    uint64_t bit = (uint64_t)i * (unsigned)bits, mask = (1u << bits) - 1;
    unsigned sh = (unsigned)(bit % 32);
    uint32_t *w = q + bit / 32;
    w[0] = (uint32_t)((w[0] & ~(mask << sh)) | ((uint64_t)(code & mask) << sh));
    if (sh + (unsigned)bits > 32) /* straddles into the next word (3, 5, 6 bits) */
        w[1] = (uint32_t)((w[1] & ~(mask >> (32 - sh))) | ((code & mask) >> (32 - sh)));
}

void pt_affine_group_params(const float *w, int group_size, int bits, float *scale, float *bias) {
    float n_bins = (float)((1 << bits) - 1);
    float lo = INFINITY, hi = -INFINITY;
    for (int j = 0; j < group_size; j++) {
        lo = fminf(lo, w[j]);
        hi = fmaxf(hi, w[j]);
    }
    bool min_edge = fabsf(lo) > fabsf(hi);
    float s = fmaxf((hi - lo) / n_bins, 1e-7f);
    if (!min_edge) s = -s;
    float edge = min_edge ? lo : hi;
    float q0 = rintf(edge / s), b = 0;
    if (q0 != 0) {
        s = edge / q0;
        b = edge;
    }
    *scale = s;
    *bias = b;
}

void pt_affine_quantize_row(const float *w, int64_t cols, int bits, int group_size,
                            pt_dtype scale_dtype, uint32_t *q, void *scales, void *biases) {
    float n_bins = (float)((1 << bits) - 1);
    memset(q, 0, (size_t)pt_affine_row_words(cols, bits) * 4);
    for (int64_t g = 0; g < cols / group_size; g++) {
        const float *x = w + g * group_size;
        float s, b;
        pt_affine_group_params(x, group_size, bits, &s, &b);
        for (int j = 0; j < group_size; j++) {
            float c = fminf(fmaxf(rintf((x[j] - b) / s), 0.0f), n_bins);
            pt_affine_set_code(q, g * group_size + j, bits, (unsigned)c);
        }
        pt_quant_store(scales, g, scale_dtype, s);
        pt_quant_store(biases, g, scale_dtype, b);
    }
}

void pt_affine_dequantize_row(const uint32_t *q, const void *scales, const void *biases,
                              pt_dtype scale_dtype, int64_t cols, int bits, int group_size,
                              float *out) {
    for (int64_t g = 0; g < cols / group_size; g++) {
        float s = pt_quant_load(scales, g, scale_dtype), b = pt_quant_load(biases, g, scale_dtype);
        for (int j = 0; j < group_size; j++) {
            int64_t i = g * group_size + j;
            out[i] = s * (float)pt_affine_code(q, i, bits) + b;
        }
    }
}
