/*
 * repack.c - weight layouts other than the file's (enum pt_weight_layout),
 * made once at load for kernels that read them faster.
 *
 * PT_LAYOUT_Q4_0X8: a q4_0 matrix with rows a multiple of 8.  Rows are taken
 * 8 at a time (a group); for group g and block c (32 columns) one unit of
 * 144 bytes, the 8 file blocks' bytes rearranged:
 *
 *     unit (g, c) at ((g * (cols / 32)) + c) * 144
 *       [0, 16)            f16 d of rows 8g .. 8g+7
 *       [16 + 32v + 4j, +4)  qs bytes 4v .. 4v+3 of row 8g+j   (v < 4, j < 8)
 *
 * So one 32-byte load (v) holds, in 32-bit lane j, row j's low nibbles of
 * columns 4v..4v+3 and its high nibbles of columns 16+4v..16+4v+3: masked
 * or shifted, it meets 4 activation codes broadcast to every lane and the
 * 8 rows' sums of a block come out in 8 lanes, with no horizontal sums, and
 * the 8 rows' scales convert in one instruction.  The units of a group
 * follow each other, so a group streams as one sequential read.  The size
 * is the file's (8 * 18 = 144 bytes per unit).  The same idea as
 * llama.cpp's CPU_REPACK; this arrangement is Petrel's own.
 *
 * PT_LAYOUT_ROWSPLIT (the CUDA backend's, made on the device): a q4_0 or
 * q8_0 matrix in groups of g rows (pt_rowsplit_group: the fewest rows whose
 * bytes are whole 16-byte words, 1 at 256 * k columns, 4 at 2880, at most
 * 8), each group where the file had it: its rows' block codes first (16 or
 * 32 bytes a block, in block order, each row's 16-byte aligned: one 16-byte
 * load a q4_0 block or half a q8_0 block), then their f16 scales, row after
 * row.  Views of whole groups of rows stay valid.  pt_rowsplit_repack is
 * the host's version, the reference the CUDA test checks the device's
 * against.
 */
#include "backend/repack.h"

#include <string.h>

#define Q4_0_BYTES 18

void pt_q4_0x8_repack(void *dst, const void *src, int64_t rows, int64_t cols) {
    int64_t nc = cols / 32;
    size_t rb = (size_t)nc * Q4_0_BYTES;
    uint8_t *out = dst;
    for (int64_t g = 0; g < rows / 8; g++)
        for (int64_t c = 0; c < nc; c++) {
            uint8_t *u = out + (size_t)(g * nc + c) * 144;
            for (int j = 0; j < 8; j++) {
                const uint8_t *b = (const uint8_t *)src + (size_t)(8 * g + j) * rb + (size_t)c * Q4_0_BYTES;
                memcpy(u + 2 * j, b, 2);
                for (int v = 0; v < 4; v++) memcpy(u + 16 + 32 * v + 4 * j, b + 2 + 4 * v, 4);
            }
        }
}

void pt_q4_0x8_block(void *dst, const void *src, int64_t cols, int64_t r, int64_t c) {
    int64_t nc = cols / 32;
    const uint8_t *u = (const uint8_t *)src + (size_t)((r / 8) * nc + c) * 144;
    int j = (int)(r % 8);
    uint8_t *b = dst;
    memcpy(b, u + 2 * j, 2);
    for (int v = 0; v < 4; v++) memcpy(b + 2 + 4 * v, u + 16 + 32 * v + 4 * j, 4);
}

bool pt_layout_fits(int layout, pt_dtype t, int64_t rows, int64_t cols) {
    switch (layout) {
    case PT_LAYOUT_FILE: return true;
    case PT_LAYOUT_Q4_0X8: return t == PT_Q4_0 && rows > 0 && rows % 8 == 0 && cols % 32 == 0;
    case PT_LAYOUT_ROWSPLIT:
        return (t == PT_Q4_0 || t == PT_Q8_0) && rows > 0 && cols % 32 == 0 &&
               rows % pt_rowsplit_group(t, cols) == 0;
    default: return false;
    }
}

int pt_rowsplit_group(pt_dtype t, int64_t cols) {
    size_t rb = (size_t)(cols / 32) * (t == PT_Q4_0 ? 18 : 34);
    int g = 1;
    while ((rb * (size_t)g) % 16) g *= 2;
    return g;
}

void pt_rowsplit_repack(void *dst, const void *src, pt_dtype t, int64_t rows, int64_t cols) {
    int64_t nb = cols / 32, g = pt_rowsplit_group(t, cols);
    size_t bb = t == PT_Q4_0 ? 18 : 34, cb = bb - 2, rb = (size_t)nb * bb;
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t *s = (const uint8_t *)src + (size_t)r * rb;
        uint8_t *grp = (uint8_t *)dst + (size_t)(r / g) * g * rb;
        uint8_t *codes = grp + (size_t)(r % g) * nb * cb;
        uint8_t *scales = grp + (size_t)g * nb * cb + (size_t)(r % g) * nb * 2;
        for (int64_t c = 0; c < nb; c++) {
            memcpy(codes + (size_t)c * cb, s + (size_t)c * bb + 2, cb);
            memcpy(scales + 2 * (size_t)c, s + (size_t)c * bb, 2);
        }
    }
}

void pt_weight_repack(int layout, void *dst, const pt_weight *w) {
    if (layout == PT_LAYOUT_Q4_0X8) pt_q4_0x8_repack(dst, w->data, w->rows, w->cols);
    else if (layout == PT_LAYOUT_ROWSPLIT)
        pt_rowsplit_repack(dst, w->data, w->dtype, w->rows, w->cols);
}
