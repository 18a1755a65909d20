/*
 * safetensors_write.c - writing a .safetensors file (the format is in
 * safetensors.h and docs/formats.md).
 *
 * The header lists tensors in the order of their data, which is packed with
 * no gaps (the reference implementation rejects holes).  We order the data
 * by element size, largest first, and pad the header with spaces to a
 * multiple of 8, as the reference writer does: then every tensor starts at
 * a multiple of its element size and mmap'd readers may use it in place.
 * Data goes to PATH.tmp with pwrite, so the caller may produce tensors in
 * any order; close fsyncs and renames (atomic on POSIX file systems).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "io/safetensors.h"

struct pt_st_writer {
    int fd;
    char *path, *tmp;
    int n;
    size_t data_start;
    size_t *begin, *size, *written; /* per entry, in the caller's order */
};

static const char *st_dtype(pt_dtype t) {
    const pt_dtype_info *d = pt_dtype_get(t);
    return d ? d->st_name : NULL;
}

static size_t elem_size(pt_dtype t) {
    return pt_dtype_bytes(t, 1);
}

/* Entry indices ordered by element size, descending; stable. */
static int *layout_order(const pt_st_entry *e, int n) {
    int *order = pt_xmalloc(sizeof(int) * (size_t)(n ? n : 1)), k = 0;
    for (size_t es = 8; es >= 1; es /= 2)
        for (int i = 0; i < n; i++)
            if (elem_size(e[i].dtype) == es) order[k++] = i;
    return order;
}

static int check_entries(const pt_st_entry *e, int n, size_t *sizes, pt_err *err) {
    for (int i = 0; i < n; i++) {
        if (!st_dtype(e[i].dtype))
            return pt_fail(err, "safetensors: tensor %s: dtype %s has no safetensors name", e[i].name,
                           pt_dtype_name(e[i].dtype));
        if (e[i].ndim < 0 || e[i].ndim > 4)
            return pt_fail(err, "safetensors: tensor %s: %d dimensions", e[i].name, e[i].ndim);
        uint64_t count = 1;
        for (int d = 0; d < e[i].ndim; d++)
            if (e[i].shape[d] < 0 || __builtin_mul_overflow(count, (uint64_t)e[i].shape[d], &count))
                return pt_fail(err, "safetensors: tensor %s: bad shape", e[i].name);
        sizes[i] = pt_dtype_bytes(e[i].dtype, count);
        if (count && !sizes[i]) return pt_fail(err, "safetensors: tensor %s: too large", e[i].name);
    }
    return 0;
}

/* The header JSON, padded with spaces to a multiple of 8. */
static char *header_text(const pt_st_entry *e, const int *order, int n, const size_t *begin,
                         const size_t *sizes, const json_t *metadata, size_t *len) {
    json_t *h = json_object();
    if (metadata) json_object_set(h, "__metadata__", (json_t *)metadata);
    for (int k = 0; k < n; k++) {
        int i = order[k];
        json_t *shape = json_array();
        for (int d = 0; d < e[i].ndim; d++) json_array_append_new(shape, json_integer(e[i].shape[d]));
        json_object_set_new(h, e[i].name,
                            json_pack("{s:s, s:o, s:[I, I]}", "dtype", st_dtype(e[i].dtype), "shape",
                                      shape, "data_offsets", (json_int_t)begin[i],
                                      (json_int_t)(begin[i] + sizes[i])));
    }
    char *text = json_dumps(h, JSON_PRESERVE_ORDER | JSON_COMPACT);
    json_decref(h);
    size_t n0 = strlen(text), padded = (n0 + 7) / 8 * 8;
    text = pt_xrealloc(text, padded + 1);
    memset(text + n0, ' ', padded - n0);
    text[padded] = 0;
    *len = padded;
    return text;
}

static int write_all(int fd, const void *p, size_t n, off_t off, const char *path, pt_err *err) {
    const uint8_t *b = p;
    while (n) {
        ssize_t k = pwrite(fd, b, n, off);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return pt_fail(err, "%s: write failed: %s", path, k < 0 ? strerror(errno) : "no space");
        b += k, n -= (size_t)k, off += k;
    }
    return 0;
}

int pt_st_writer_open(pt_st_writer **out, const char *path, const pt_st_entry *entries, int n,
                      const json_t *metadata, pt_err *err) {
    *out = NULL;
    pt_st_writer *w = pt_xcalloc(1, sizeof *w);
    w->fd = -1;
    w->n = n;
    w->begin = pt_xcalloc((size_t)(n ? n : 1), sizeof(size_t));
    w->size = pt_xcalloc((size_t)(n ? n : 1), sizeof(size_t));
    w->written = pt_xcalloc((size_t)(n ? n : 1), sizeof(size_t));
    w->path = pt_xstrdup(path);
    w->tmp = pt_xmalloc(strlen(path) + 5);
    sprintf(w->tmp, "%s.tmp", path);
    if (check_entries(entries, n, w->size, err)) goto fail;
    int *order = layout_order(entries, n);
    size_t at = 0;
    for (int k = 0; k < n; k++) w->begin[order[k]] = at, at += w->size[order[k]];
    size_t hlen;
    char *h = header_text(entries, order, n, w->begin, w->size, metadata, &hlen);
    free(order);
    w->fd = open(w->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    uint64_t le = hlen; /* the length prefix is little-endian; so is every target we build for */
    int rc = w->fd < 0 ? pt_fail(err, "%s: %s", w->tmp, strerror(errno))
                       : write_all(w->fd, &le, 8, 0, w->tmp, err) ||
                             write_all(w->fd, h, hlen, 8, w->tmp, err);
    free(h);
    if (rc) goto fail;
    w->data_start = 8 + hlen;
    /* size the file now: a full disk fails here rather than halfway */
    if (ftruncate(w->fd, (off_t)(w->data_start + at)) != 0) {
        pt_fail(err, "%s: cannot size to %zu bytes: %s", w->tmp, w->data_start + at, strerror(errno));
        goto fail;
    }
    *out = w;
    return 0;
fail:
    pt_st_writer_abort(w);
    return -1;
}

int pt_st_writer_put(pt_st_writer *w, int i, size_t off, const void *data, size_t n, pt_err *err) {
    if (i < 0 || i >= w->n || off > w->size[i] || n > w->size[i] - off)
        return pt_fail(err, "safetensors writer: bytes [%zu, %zu) outside tensor %d", off, off + n, i);
    if (write_all(w->fd, data, n, (off_t)(w->data_start + w->begin[i] + off), w->tmp, err)) return -1;
    w->written[i] += n;
    return 0;
}

static void writer_free(pt_st_writer *w) {
    if (w->fd >= 0) close(w->fd);
    free(w->path), free(w->tmp), free(w->begin), free(w->size), free(w->written);
    free(w);
}

int pt_st_writer_close(pt_st_writer *w, pt_err *err) {
    for (int i = 0; i < w->n; i++)
        if (w->written[i] != w->size[i]) {
            pt_fail(err, "safetensors writer: tensor %d got %zu of %zu bytes", i, w->written[i], w->size[i]);
            pt_st_writer_abort(w);
            return -1;
        }
    if (fsync(w->fd) != 0 || rename(w->tmp, w->path) != 0) {
        pt_fail(err, "%s: %s", w->path, strerror(errno));
        pt_st_writer_abort(w);
        return -1;
    }
    writer_free(w);
    return 0;
}

void pt_st_writer_abort(pt_st_writer *w) {
    if (!w) return;
    unlink(w->tmp);
    writer_free(w);
}
