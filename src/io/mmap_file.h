/*
 * mmap_file.h - a whole file mapped read-only.
 *
 * Model weights are never copied on load: the parsers validate the header of a
 * mapping and hand out pointers into it.  A mapping stays valid until
 * pt_mmap_close(); every pt_tensor_info.data points into one.
 */
#ifndef PETREL_MMAP_FILE_H
#define PETREL_MMAP_FILE_H

#include "base/base.h"

typedef struct pt_mmap {
    const void *data; /* NULL for an empty file */
    size_t size;
} pt_mmap;

/* Maps a regular file read-only.  An empty file maps to {NULL, 0}.  Anything
 * that is not a regular file (directory, device, fifo) is refused. */
int pt_mmap_open(pt_mmap *m, const char *path, pt_err *err);
/* Drops the whole pages inside [p, p + n) of a mapping from this
 * process's resident memory (a copy of them is kept elsewhere, e.g. a
 * repacked weight); a later read faults them back in from the file. */
void pt_mmap_release(const void *p, size_t n);
/* Unmaps; safe on a zeroed or already closed pt_mmap. */
void pt_mmap_close(pt_mmap *m);

#endif
