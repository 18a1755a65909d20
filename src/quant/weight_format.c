/*
 * weight_format.c - formats by name, their sizes, and reading any weight
 * row back as f32 (the oracle that tests and the sensitivity sweep use).
 */
#include <stdio.h>
#include <stdlib.h>

#include "backend/repack.h"
#include "quant/quant.h"

float pt_quant_load(const void *p, int64_t i, pt_dtype t) {
    uint16_t h;
    float f;
    switch (t) {
    case PT_F16: memcpy(&h, (const uint8_t *)p + 2 * i, 2); return pt_f16_to_f32(h);
    case PT_BF16: memcpy(&h, (const uint8_t *)p + 2 * i, 2); return pt_bf16_to_f32(h);
    default: memcpy(&f, (const uint8_t *)p + 4 * i, 4); return f;
    }
}

void pt_quant_store(void *p, int64_t i, pt_dtype t, float v) {
    uint16_t h;
    switch (t) {
    case PT_F16: h = pt_f32_to_f16(v); memcpy((uint8_t *)p + 2 * i, &h, 2); break;
    case PT_BF16: h = pt_f32_to_bf16(v); memcpy((uint8_t *)p + 2 * i, &h, 2); break;
    default: memcpy((uint8_t *)p + 4 * i, &v, 4); break;
    }
}

void pt_weight_dequantize_row(const pt_weight *w, int64_t r, float *out) {
    if (w->dtype == PT_AFFINE) {
        int64_t words = pt_affine_row_words(w->cols, w->bits), groups = w->cols / w->group_size;
        size_t ss = pt_dtype_bytes(w->scale_dtype, 1);
        pt_affine_dequantize_row((const uint32_t *)w->data + r * words,
                                 (const uint8_t *)w->scales + (size_t)(r * groups) * ss,
                                 (const uint8_t *)w->biases + (size_t)(r * groups) * ss,
                                 w->scale_dtype, w->cols, w->bits, w->group_size, out);
        return;
    }
    if (w->layout == PT_LAYOUT_Q4_0X8) { /* block by block back to the file's bytes */
        uint8_t b[18];
        for (int64_t c = 0; c < w->cols / 32; c++) {
            pt_q4_0x8_block(b, w->data, w->cols, r, c);
            pt_gguf_dequantize(PT_Q4_0, b, out + 32 * c, 32);
        }
        return;
    }
    const uint8_t *row = (const uint8_t *)w->data + pt_dtype_bytes(w->dtype, (uint64_t)(r * w->cols));
    if (pt_gguf_quant_type(w->dtype)) {
        pt_gguf_dequantize(w->dtype, row, out, w->cols);
        return;
    }
    for (int64_t i = 0; i < w->cols; i++) out[i] = pt_quant_load(row, i, w->dtype);
}

double pt_weight_bpw(pt_dtype t, int bits, int group_size, pt_dtype scale_dtype) {
    if (t == PT_AFFINE)
        return bits + 2.0 * 8 * (double)pt_dtype_bytes(scale_dtype, 1) / group_size;
    const pt_dtype_info *d = pt_dtype_get(t);
    return d && d->block ? 8.0 * d->block_bytes / d->block : 0;
}

int pt_weight_format_parse(const char *name, pt_weight_format *out) {
    memset(out, 0, sizeof *out);
    out->scale_dtype = PT_F16;
    if (strncmp(name, "affine", 6) == 0) {
        char *end;
        long bits = strtol(name + 6, &end, 10), gs = 64;
        if (end == name + 6) return -1;
        if (*end == 'g') gs = strtol(end + 1, &end, 10);
        if (*end || !pt_affine_supported((int)bits, (int)gs)) return -1;
        out->dtype = PT_AFFINE;
        out->bits = (int)bits;
        out->group_size = (int)gs;
        return 0;
    }
    static const pt_dtype plain[] = {PT_F32, PT_F16, PT_BF16, PT_Q8_0, PT_Q4_0, PT_Q4_K, PT_Q5_K, PT_Q6_K};
    for (size_t i = 0; i < PT_ARRAY_LEN(plain); i++)
        if (strcmp(pt_dtype_name(plain[i]), name) == 0) {
            out->dtype = plain[i];
            return 0;
        }
    return -1;
}

size_t pt_weight_format_bytes(const pt_weight_format *f, int64_t rows, int64_t cols) {
    if (f->dtype == PT_AFFINE) {
        if (cols % f->group_size) return 0;
        return pt_affine_code_bytes(rows, cols, f->bits) +
               2 * pt_affine_scale_bytes(rows, cols, f->group_size, f->scale_dtype);
    }
    const pt_dtype_info *d = pt_dtype_get(f->dtype);
    if (!d || !d->block || cols % d->block) return 0;
    return pt_dtype_bytes(f->dtype, (uint64_t)rows * (uint64_t)cols);
}
