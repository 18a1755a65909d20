/*
 * repack.h - weight layouts other than the file's (enum pt_weight_layout in
 * backend.h), made once at load for kernels that read them faster.  The
 * arrangement of each is described in repack.c.
 */
#ifndef PETREL_REPACK_H
#define PETREL_REPACK_H

#include "backend/backend.h"

/* Whether a rows x cols matrix of dtype t can take the layout. */
bool pt_layout_fits(int layout, pt_dtype t, int64_t rows, int64_t cols);
/* Writes w's data (file layout) into dst (w->nbytes bytes, not
 * overlapping it) in the layout. */
void pt_weight_repack(int layout, void *dst, const pt_weight *w);
/* PT_LAYOUT_Q4_0X8: the whole matrix; and back, file block c of row r
 * (18 bytes) out of a repacked matrix src of cols columns. */
void pt_q4_0x8_repack(void *dst, const void *src, int64_t rows, int64_t cols);
void pt_q4_0x8_block(void *dst, const void *src, int64_t cols, int64_t r, int64_t c);
/* PT_LAYOUT_ROWSPLIT of a q4_0/q8_0 matrix (src: the file's layout), and
 * the rows of its groups. */
int pt_rowsplit_group(pt_dtype t, int64_t cols);
void pt_rowsplit_repack(void *dst, const void *src, pt_dtype t, int64_t rows, int64_t cols);

#endif
