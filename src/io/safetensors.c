/*
 * safetensors.c - the safetensors reader (format in safetensors.h).
 *
 * The JSON header is parsed with jansson and kept alive: tensor names and the
 * metadata point into it.  Each entry is checked on its own (dtype known,
 * shape sane, shape x dtype size == the byte range, range inside the data
 * section), then all ranges together (no two tensors share a byte).  Gaps
 * between tensors are allowed; see docs/formats.md for why.
 */
#include "io/safetensors.h"

#include <stdio.h>
#include <stdlib.h>

#include "io/mmap_file.h"

struct pt_safetensors {
    const uint8_t *base;
    size_t size;
    pt_mmap map; /* owned when opened from a path */
    size_t data_offset;
    json_t *header; /* owns the names */
    const json_t *metadata;
    int n_tensors;
    pt_tensor_info *tensors;        /* in data order */
    const pt_tensor_info **by_name; /* sorted, for bsearch */
};

/* Reads a JSON integer in [0, INT64_MAX]. */
static bool json_uint(const json_t *v, uint64_t *out) {
    if (!json_is_integer(v) || json_integer_value(v) < 0) return false;
    *out = (uint64_t)json_integer_value(v);
    return true;
}

static int read_shape(const char *name, const json_t *shape, pt_tensor_info *ti, uint64_t *n,
                      pt_err *err) {
    if (!json_is_array(shape))
        return pt_fail(err, "tensor %s: shape missing or not an array", name);
    size_t nd = json_array_size(shape);
    if (nd > 4)
        return pt_fail(err, "tensor %s: shape has %zu dimensions (at most 4 supported)", name, nd);
    *n = 1;
    for (size_t d = 0; d < nd; d++) {
        uint64_t v;
        if (!json_uint(json_array_get(shape, d), &v))
            return pt_fail(err, "tensor %s: shape[%zu] is not a non-negative integer", name, d);
        if (__builtin_mul_overflow(*n, v, n))
            return pt_fail(err, "tensor %s: element count overflows", name);
        ti->shape[d] = (int64_t)v;
    }
    ti->ndim = (int)nd;
    return 0;
}

static int read_offsets(const char *name, const json_t *offs, uint64_t *begin, uint64_t *end,
                        pt_err *err) {
    if (!json_is_array(offs) || json_array_size(offs) != 2 ||
        !json_uint(json_array_get(offs, 0), begin) || !json_uint(json_array_get(offs, 1), end) ||
        *begin > *end)
        return pt_fail(err, "tensor %s: data_offsets must be [begin, end] with 0 <= begin <= end",
                       name);
    return 0;
}

/* Validates one header entry and fills ti (data pointer included). */
static int read_entry(pt_safetensors *st, const char *name, const json_t *e, pt_tensor_info *ti,
                      pt_err *err) {
    if (!*name) return pt_fail(err, "tensor with an empty name");
    if (!json_is_object(e)) return pt_fail(err, "tensor %s: entry is not an object", name);
    const char *ds = json_string_value(json_object_get(e, "dtype"));
    if (!ds) return pt_fail(err, "tensor %s: dtype missing or not a string", name);
    int dt = pt_dtype_from_safetensors(ds);
    if (dt < 0) return pt_fail(err, "tensor %s: unknown or unsupported dtype \"%s\"", name, ds);
    uint64_t n = 0, begin = 0, end = 0;
    if (read_shape(name, json_object_get(e, "shape"), ti, &n, err) ||
        read_offsets(name, json_object_get(e, "data_offsets"), &begin, &end, err))
        return -1;
    size_t data_size = st->size - st->data_offset;
    if (end > data_size)
        return pt_fail(err,
                       "tensor %s: data_offsets [%llu, %llu] run past the end of the data "
                       "section (%zu bytes)",
                       name, (unsigned long long)begin, (unsigned long long)end, data_size);
    /* safetensors dtypes are all one element per block, so n == 0 is the only
     * way pt_dtype_bytes() returns 0 without overflowing */
    size_t nbytes = pt_dtype_bytes((pt_dtype)dt, n);
    if (n && !nbytes) return pt_fail(err, "tensor %s: byte size overflows", name);
    if (nbytes != end - begin)
        return pt_fail(err,
                       "tensor %s: %llu elements of %s are %zu bytes but data_offsets [%llu, "
                       "%llu] span %llu",
                       name, (unsigned long long)n, ds, nbytes, (unsigned long long)begin,
                       (unsigned long long)end, (unsigned long long)(end - begin));
    ti->name = name;
    ti->dtype = (pt_dtype)dt;
    ti->nbytes = nbytes;
    ti->data = st->base + st->data_offset + begin;
    return 0;
}

static int cmp_by_data(const void *a, const void *b) {
    const pt_tensor_info *x = a, *y = b;
    const char *xd = x->data, *yd = y->data;
    if (xd != yd) return (xd > yd) - (xd < yd);
    if (x->nbytes != y->nbytes) return (x->nbytes > y->nbytes) - (x->nbytes < y->nbytes);
    return strcmp(x->name, y->name);
}

static int cmp_by_name(const void *a, const void *b) {
    return strcmp((*(const pt_tensor_info *const *)a)->name,
                  (*(const pt_tensor_info *const *)b)->name);
}

/* Sorts the tensors into data order and refuses overlapping ranges.  Empty
 * tensors occupy no bytes and may sit anywhere. */
static int check_overlap(pt_safetensors *st, pt_err *err) {
    qsort(st->tensors, (size_t)st->n_tensors, sizeof *st->tensors, cmp_by_data);
    const pt_tensor_info *prev = NULL;
    for (int i = 0; i < st->n_tensors; i++) {
        const pt_tensor_info *t = &st->tensors[i];
        if (!t->nbytes) continue;
        if (prev && (const char *)prev->data + prev->nbytes > (const char *)t->data)
            return pt_fail(err, "tensors %s and %s overlap", prev->name, t->name);
        prev = t;
    }
    return 0;
}

static void index_names(pt_safetensors *st) {
    st->by_name = pt_xmalloc((size_t)(st->n_tensors ? st->n_tensors : 1) * sizeof *st->by_name);
    for (int i = 0; i < st->n_tensors; i++)
        st->by_name[i] = &st->tensors[i];
    qsort(st->by_name, (size_t)st->n_tensors, sizeof *st->by_name, cmp_by_name);
}

static int read_header_json(pt_safetensors *st, size_t n, pt_err *err) {
    json_error_t je;
    /* duplicate names would leave one entry's bytes unaccounted for */
    st->header = json_loadb((const char *)st->base + 8, n, JSON_REJECT_DUPLICATES, &je);
    if (!st->header)
        return pt_fail(err, "header JSON: %s (line %d, column %d)", je.text, je.line, je.column);
    if (!json_is_object(st->header)) return pt_fail(err, "header is not a JSON object");
    return 0;
}

static int read_entries(pt_safetensors *st, pt_err *err) {
    size_t n = json_object_size(st->header);
    st->tensors = pt_xcalloc(n ? n : 1, sizeof *st->tensors);
    const char *name;
    json_t *e;
    json_object_foreach(st->header, name, e) {
        if (strcmp(name, "__metadata__") == 0) {
            if (!json_is_object(e)) return pt_fail(err, "__metadata__ is not an object");
            st->metadata = e;
            continue;
        }
        if (st->n_tensors == INT32_MAX) return pt_fail(err, "too many tensors");
        if (read_entry(st, name, e, &st->tensors[st->n_tensors], err)) return -1;
        st->n_tensors++;
    }
    return 0;
}

static int parse(pt_safetensors *st, pt_err *err) {
    if (st->size < 8)
        return pt_fail(err, "file is %zu bytes, too small for the 8-byte header length", st->size);
    uint64_t n;
    memcpy(&n, st->base, 8); /* little-endian; hosts are too (see gguf.c) */
    if (n > PT_SAFETENSORS_MAX_HEADER)
        return pt_fail(err, "header length %llu exceeds the %zu-byte limit", (unsigned long long)n,
                       PT_SAFETENSORS_MAX_HEADER);
    if (n > st->size - 8)
        return pt_fail(err, "header length %llu runs past end of file (size %zu)",
                       (unsigned long long)n, st->size);
    st->data_offset = 8 + (size_t)n;
    if (read_header_json(st, (size_t)n, err) || read_entries(st, err) || check_overlap(st, err))
        return -1;
    index_names(st);
    return 0;
}

void pt_safetensors_close(pt_safetensors *st) {
    if (!st) return;
    free(st->by_name);
    free(st->tensors);
    json_decref(st->header);
    pt_mmap_close(&st->map);
    free(st);
}

int pt_safetensors_parse(pt_safetensors **out, const void *data, size_t size, const char *name,
                         pt_err *err) {
    *out = NULL;
    pt_safetensors *st = pt_xcalloc(1, sizeof *st);
    st->base = data;
    st->size = size;
    if (parse(st, err)) {
        pt_safetensors_close(st);
        return pt_failp(err, "%s", name ? name : "safetensors");
    }
    *out = st;
    return 0;
}

int pt_safetensors_open(pt_safetensors **out, const char *path, pt_err *err) {
    pt_mmap m;
    *out = NULL;
    if (pt_mmap_open(&m, path, err)) return -1;
    if (pt_safetensors_parse(out, m.data, m.size, path, err)) {
        pt_mmap_close(&m);
        return -1;
    }
    (*out)->map = m;
    return 0;
}

int pt_safetensors_n_tensors(const pt_safetensors *st) {
    return st->n_tensors;
}

const pt_tensor_info *pt_safetensors_tensor(const pt_safetensors *st, int i) {
    return i >= 0 && i < st->n_tensors ? &st->tensors[i] : NULL;
}

static int cmp_name_key(const void *key, const void *elem) {
    return strcmp(key, (*(const pt_tensor_info *const *)elem)->name);
}

const pt_tensor_info *pt_safetensors_find(const pt_safetensors *st, const char *name) {
    const pt_tensor_info *const *p =
        bsearch(name, st->by_name, (size_t)st->n_tensors, sizeof *st->by_name, cmp_name_key);
    return p ? *p : NULL;
}

const json_t *pt_safetensors_metadata(const pt_safetensors *st) {
    return st->metadata;
}

const char *pt_safetensors_meta_str(const pt_safetensors *st, const char *key) {
    return st->metadata ? json_string_value(json_object_get(st->metadata, key)) : NULL;
}

size_t pt_safetensors_data_offset(const pt_safetensors *st) {
    return st->data_offset;
}
