/*
 * gguf.c - the GGUF v2/v3 reader.
 *
 * Layout of a file (all integers little-endian):
 *
 *   "GGUF" u32 version  u64 n_tensors  u64 n_kv
 *   n_kv x      { string key, u32 type, value }
 *   n_tensors x { string name, u32 n_dims, u64 ne[n_dims], u32 ggml_type, u64 offset }
 *   padding to general.alignment (default 32)
 *   tensor data; each tensor at data_start + offset
 *
 * where a string is u64 length + bytes (no NUL) and an array value is
 * u32 element type, u64 count, elements.  Version 1 used u32 counts and is
 * refused.
 *
 * Everything in the file is untrusted.  The parse is one forward pass through
 * a bounds-checked cursor; every count is checked against the bytes that
 * remain before anything is allocated for it, so the memory a parse takes is
 * bounded by a small multiple of the file size.  Metadata stays in the
 * mapping (values are read with memcpy, they are unaligned); only tensor
 * names are copied, because pt_tensor_info wants NUL-terminated names.
 */
#include "io/gguf.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>

#include "io/mmap_file.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the GGUF reader assumes a little-endian host"
#endif

enum {
    GGUF_MAX_DIMS = 4,
    GGUF_MAX_NESTING = 8, /* arrays of arrays deeper than this are refused */
    GGUF_DEFAULT_ALIGNMENT = 32,
    GGUF_NAME_SHOWN = 128, /* longest name quoted in an error message */
    GGUF_TYPE_COUNT = 13,
};

typedef struct gguf_kv {
    pt_gguf_str key;
    uint32_t type;
    uint32_t elem_type; /* arrays only */
    uint64_t count;     /* arrays only */
    const uint8_t *val; /* the scalar, or the first array element */
    pt_gguf_str *strs;  /* arrays of strings: every element, for O(1) access */
    const uint8_t *rec; /* the whole record as in the file: key, type, value */
    size_t rec_len;
} gguf_kv;

struct pt_gguf {
    const uint8_t *base;
    size_t size;
    pt_mmap map; /* owned when opened from a path */
    uint32_t version;
    size_t alignment;
    size_t data_offset;
    uint64_t n_kv;
    gguf_kv *kv;
    int n_tensors;
    pt_tensor_info *tensors;
    char *names; /* every tensor name, NUL-terminated, back to back */
};

/* Bytes of one scalar of each value type; 0 for string and array. */
static const uint8_t scalar_bytes[GGUF_TYPE_COUNT] = {
    [PT_GGUF_U8] = 1,  [PT_GGUF_I8] = 1,  [PT_GGUF_U16] = 2, [PT_GGUF_I16] = 2,
    [PT_GGUF_U32] = 4, [PT_GGUF_I32] = 4, [PT_GGUF_F32] = 4, [PT_GGUF_BOOL] = 1,
    [PT_GGUF_U64] = 8, [PT_GGUF_I64] = 8, [PT_GGUF_F64] = 8,
};

static const char *const type_names[GGUF_TYPE_COUNT] = {
    "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64",
};

const char *pt_gguf_type_name(int type) {
    return type >= 0 && type < GGUF_TYPE_COUNT ? type_names[type] : "unknown";
}

static bool valid_type(uint32_t t) {
    return t < GGUF_TYPE_COUNT;
}

/* The least number of bytes a value of type t can occupy, used to reject
 * counts that could not possibly fit in the rest of the file. */
static size_t min_value_bytes(uint32_t t) {
    if (t == PT_GGUF_STRING) return 8;
    if (t == PT_GGUF_ARRAY) return 12;
    return scalar_bytes[t];
}

/* ---- the cursor ---------------------------------------------------------- */

/* Errors from the cursor do not name the file; pt_gguf_parse prefixes it. */
typedef struct rd {
    const uint8_t *p;
    size_t size, pos;
    pt_err *err;
} rd;

static size_t rd_left(const rd *r) {
    return r->size - r->pos;
}

static int rd_bytes(rd *r, size_t n, const char *what, const uint8_t **out) {
    if (n > rd_left(r))
        return pt_fail(r->err, "%s at offset %zu runs past end of file (size %zu)", what, r->pos,
                       r->size);
    *out = r->p + r->pos;
    r->pos += n;
    return 0;
}

static int rd_u32(rd *r, const char *what, uint32_t *v) {
    const uint8_t *b = NULL;
    if (rd_bytes(r, 4, what, &b)) return -1;
    memcpy(v, b, 4);
    return 0;
}

static int rd_u64(rd *r, const char *what, uint64_t *v) {
    const uint8_t *b = NULL;
    if (rd_bytes(r, 8, what, &b)) return -1;
    memcpy(v, b, 8);
    return 0;
}

/* Errors say "string length N at offset X runs past..."; callers prefix what
 * the string is (key, element, tensor name). */
static int rd_str(rd *r, pt_gguf_str *s) {
    uint64_t len;
    size_t at = r->pos;
    if (rd_u64(r, "string length", &len)) return -1;
    if (len > rd_left(r))
        return pt_fail(r->err, "string length %llu at offset %zu runs past end of file (size %zu)",
                       (unsigned long long)len, at, r->size);
    s->s = (const char *)r->p + r->pos;
    s->len = len;
    r->pos += (size_t)len;
    return 0;
}

/* Fails unless count values of at least `each` bytes fit in what is left. */
static int rd_check_count(rd *r, uint64_t count, size_t each, const char *what) {
    if (count > rd_left(r) / each)
        return pt_fail(r->err,
                       "%s %llu at offset %zu cannot fit in the %zu bytes left (at least %zu "
                       "bytes each); truncated or corrupt file",
                       what, (unsigned long long)count, r->pos, rd_left(r), each);
    return 0;
}

/* ---- metadata ------------------------------------------------------------ */

static int skip_value(rd *r, uint32_t type, int depth);

/* Reads an array header and validates (skips) its elements.  strs, when not
 * NULL, receives a malloc'd index of the elements of a string array. */
static int read_array(rd *r, int depth, uint32_t *elem_type, uint64_t *count, const uint8_t **first,
                      pt_gguf_str **strs) {
    if (depth > GGUF_MAX_NESTING)
        return pt_fail(r->err, "arrays nested more than %d deep", GGUF_MAX_NESTING);
    if (rd_u32(r, "array element type", elem_type)) return -1;
    if (!valid_type(*elem_type))
        return pt_fail(r->err, "array of unknown value type %u", *elem_type);
    if (rd_u64(r, "array length", count)) return -1;
    if (rd_check_count(r, *count, min_value_bytes(*elem_type), "array length")) return -1;
    *first = r->p + r->pos;
    size_t each = scalar_bytes[*elem_type];
    if (each) { /* fixed-size elements: checked above, skip them in one step */
        r->pos += (size_t)*count * each;
        return 0;
    }
    pt_gguf_str *index = NULL;
    if (strs && *elem_type == PT_GGUF_STRING) index = pt_xmalloc((size_t)*count * sizeof *index);
    for (uint64_t i = 0; i < *count; i++) {
        pt_gguf_str s;
        int rc =
            *elem_type == PT_GGUF_STRING ? rd_str(r, &s) : skip_value(r, *elem_type, depth + 1);
        if (rc) {
            free(index);
            return pt_failp(r->err, "element %llu", (unsigned long long)i);
        }
        if (index) index[i] = s;
    }
    if (strs) *strs = index;
    return 0;
}

static int skip_value(rd *r, uint32_t type, int depth) {
    const uint8_t *b;
    if (type == PT_GGUF_STRING) {
        pt_gguf_str s;
        return rd_str(r, &s);
    }
    if (type == PT_GGUF_ARRAY) {
        uint32_t et;
        uint64_t n;
        return read_array(r, depth, &et, &n, &b, NULL);
    }
    return rd_bytes(r, scalar_bytes[type], pt_gguf_type_name((int)type), &b);
}

static int read_kv(rd *r, uint64_t i, gguf_kv *kv) {
    size_t start = r->pos;
    if (rd_str(r, &kv->key)) return pt_failp(r->err, "key %llu", (unsigned long long)i);
    int rc = rd_u32(r, "value type", &kv->type);
    if (!rc && !valid_type(kv->type)) rc = pt_fail(r->err, "unknown value type %u", kv->type);
    if (!rc && kv->type == PT_GGUF_ARRAY) {
        rc = read_array(r, 1, &kv->elem_type, &kv->count, &kv->val, &kv->strs);
    } else if (!rc) {
        kv->val = r->p + r->pos;
        rc = skip_value(r, kv->type, 1);
    }
    if (rc)
        return pt_failp(r->err, "key %.*s", (int)PT_MIN(kv->key.len, GGUF_NAME_SHOWN), kv->key.s);
    kv->rec = r->p + start;
    kv->rec_len = r->pos - start;
    return 0;
}

static int cmp_kv_key(const void *a, const void *b) {
    const gguf_kv *x = *(const gguf_kv *const *)a, *y = *(const gguf_kv *const *)b;
    int c = memcmp(x->key.s, y->key.s, (size_t)PT_MIN(x->key.len, y->key.len));
    if (c) return c;
    return (x->key.len > y->key.len) - (x->key.len < y->key.len);
}

/* llama.cpp refuses duplicate keys too; a lookup would silently take one. */
static int check_duplicate_keys(pt_gguf *g, pt_err *err) {
    if (g->n_kv < 2) return 0;
    const gguf_kv **sorted = pt_xmalloc((size_t)g->n_kv * sizeof *sorted);
    for (uint64_t i = 0; i < g->n_kv; i++)
        sorted[i] = &g->kv[i];
    qsort(sorted, (size_t)g->n_kv, sizeof *sorted, cmp_kv_key);
    int rc = 0;
    for (uint64_t i = 1; i < g->n_kv && !rc; i++)
        if (cmp_kv_key(&sorted[i - 1], &sorted[i]) == 0)
            rc = pt_fail(err, "key %.*s appears more than once",
                         (int)PT_MIN(sorted[i]->key.len, GGUF_NAME_SHOWN), sorted[i]->key.s);
    free(sorted);
    return rc;
}

static int read_metadata(rd *r, pt_gguf *g) {
    /* smallest key/value: empty key (8), type (4), one-byte value */
    if (rd_check_count(r, g->n_kv, 13, "key/value count")) return -1;
    g->kv = pt_xcalloc((size_t)g->n_kv ? (size_t)g->n_kv : 1, sizeof *g->kv);
    for (uint64_t i = 0; i < g->n_kv; i++)
        if (read_kv(r, i, &g->kv[i])) return -1;
    return check_duplicate_keys(g, r->err);
}

static const gguf_kv *find_kv(const pt_gguf *g, const char *key) {
    size_t n = strlen(key);
    for (uint64_t i = 0; i < g->n_kv; i++)
        if (g->kv[i].key.len == n && memcmp(g->kv[i].key.s, key, n) == 0) return &g->kv[i];
    return NULL;
}

static int read_alignment(pt_gguf *g, pt_err *err) {
    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    const gguf_kv *kv = find_kv(g, "general.alignment");
    if (!kv) return 0;
    int64_t a;
    if (!pt_gguf_get_int(g, "general.alignment", &a))
        return pt_fail(err, "general.alignment: must be an integer, has type %s",
                       pt_gguf_type_name((int)kv->type));
    if (a <= 0 || (a & (a - 1)) != 0)
        return pt_fail(err, "general.alignment: %lld is not a power of two", (long long)a);
    g->alignment = (size_t)a;
    return 0;
}

/* ---- tensor infos -------------------------------------------------------- */

/* A tensor info as it appears in the file, before validation. */
typedef struct raw_tensor {
    pt_gguf_str name;
    uint32_t n_dims;
    uint64_t ne[GGUF_MAX_DIMS];
    uint32_t type;
    uint64_t offset;
} raw_tensor;

static int read_tensor_info(rd *r, int i, raw_tensor *t) {
    if (rd_str(r, &t->name)) return pt_failp(r->err, "tensor %d: name", i);
    int nn = (int)PT_MIN(t->name.len, GGUF_NAME_SHOWN);
    if (rd_u32(r, "n_dims", &t->n_dims)) goto fail;
    if (t->n_dims > GGUF_MAX_DIMS) {
        pt_fail(r->err, "%u dimensions (at most %d supported)", t->n_dims, GGUF_MAX_DIMS);
        goto fail;
    }
    for (uint32_t d = 0; d < t->n_dims; d++)
        if (rd_u64(r, "dimension", &t->ne[d])) goto fail;
    if (rd_u32(r, "type", &t->type) || rd_u64(r, "data offset", &t->offset)) goto fail;
    return 0;
fail:
    return pt_failp(r->err, "tensor %.*s", nn, t->name.s);
}

/* Name, shape and byte size of one tensor; data bounds are checked later. */
static int check_tensor(const raw_tensor *t, pt_tensor_info *ti, pt_err *err) {
    int nn = (int)PT_MIN(t->name.len, GGUF_NAME_SHOWN);
    if (t->name.len == 0) return pt_fail(err, "tensor with an empty name");
    if (memchr(t->name.s, 0, (size_t)t->name.len))
        return pt_fail(err, "tensor %.*s: name contains a NUL byte", nn, t->name.s);
    int dt = pt_dtype_from_gguf(t->type);
    if (dt < 0)
        return pt_fail(err, "tensor %.*s: unknown or unsupported ggml type %u", nn, t->name.s,
                       t->type);
    uint64_t n = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        if (t->ne[d] == 0 || t->ne[d] > INT64_MAX)
            return pt_fail(err, "tensor %.*s: dimension %u is %lld", nn, t->name.s, d,
                           (long long)t->ne[d]);
        if (__builtin_mul_overflow(n, t->ne[d], &n) || n > INT64_MAX)
            return pt_fail(err, "tensor %.*s: element count overflows", nn, t->name.s);
        /* GGUF lists the fastest-varying dimension first; we store numpy order */
        ti->shape[t->n_dims - 1 - d] = (int64_t)t->ne[d];
    }
    const pt_dtype_info *di = pt_dtype_get((pt_dtype)dt);
    uint64_t row = t->n_dims ? t->ne[0] : 1;
    if (row % (uint64_t)di->block)
        return pt_fail(err, "tensor %.*s: row length %llu is not a multiple of the %s block (%d)",
                       nn, t->name.s, (unsigned long long)row, di->name, di->block);
    ti->dtype = (pt_dtype)dt;
    ti->ndim = (int)t->n_dims;
    ti->nbytes = pt_dtype_bytes((pt_dtype)dt, n);
    if (ti->nbytes == 0) return pt_fail(err, "tensor %.*s: byte size overflows", nn, t->name.s);
    return 0;
}

static int check_tensor_data(pt_gguf *g, const raw_tensor *t, pt_tensor_info *ti, pt_err *err) {
    if (t->offset % g->alignment)
        return pt_fail(err, "tensor %s: data offset %llu is not a multiple of the alignment %zu",
                       ti->name, (unsigned long long)t->offset, g->alignment);
    size_t begin, end;
    if (t->offset > SIZE_MAX || !pt_add_ok(g->data_offset, (size_t)t->offset, &begin) ||
        !pt_add_ok(begin, ti->nbytes, &end) || end > g->size)
        return pt_fail(
            err, "tensor %s: data [offset %llu, %zu bytes] runs past end of file (size %zu)",
            ti->name, (unsigned long long)g->data_offset + t->offset, ti->nbytes, g->size);
    ti->data = g->base + begin;
    return 0;
}

/* Copies the names into one block so pt_tensor_info gets C strings. */
static void copy_names(pt_gguf *g, const raw_tensor *raw) {
    size_t total = 1;
    for (int i = 0; i < g->n_tensors; i++)
        total += (size_t)raw[i].name.len + 1;
    char *p = g->names = pt_xmalloc(total);
    for (int i = 0; i < g->n_tensors; i++) {
        memcpy(p, raw[i].name.s, (size_t)raw[i].name.len);
        p[raw[i].name.len] = 0;
        g->tensors[i].name = p;
        p += raw[i].name.len + 1;
    }
}

static int cmp_by_name(const void *a, const void *b) {
    return strcmp((*(const pt_tensor_info *const *)a)->name,
                  (*(const pt_tensor_info *const *)b)->name);
}

static int cmp_by_data(const void *a, const void *b) {
    const pt_tensor_info *x = *(const pt_tensor_info *const *)a;
    const pt_tensor_info *y = *(const pt_tensor_info *const *)b;
    return ((const char *)x->data > (const char *)y->data) -
           ((const char *)x->data < (const char *)y->data);
}

/* Two tensors may not share a name, nor bytes: a name lookup would be
 * ambiguous, and aliased weights are a sign of a damaged or forged file. */
static int check_unique(pt_gguf *g, pt_err *err) {
    if (g->n_tensors < 2) return 0;
    const pt_tensor_info **v = pt_xmalloc((size_t)g->n_tensors * sizeof *v);
    for (int i = 0; i < g->n_tensors; i++)
        v[i] = &g->tensors[i];
    int rc = 0;
    qsort(v, (size_t)g->n_tensors, sizeof *v, cmp_by_name);
    for (int i = 1; i < g->n_tensors && !rc; i++)
        if (strcmp(v[i - 1]->name, v[i]->name) == 0)
            rc = pt_fail(err, "tensor %s appears more than once", v[i]->name);
    qsort(v, (size_t)g->n_tensors, sizeof *v, cmp_by_data);
    for (int i = 1; i < g->n_tensors && !rc; i++)
        if ((const char *)v[i - 1]->data + v[i - 1]->nbytes > (const char *)v[i]->data)
            rc = pt_fail(err, "tensors %s and %s overlap", v[i - 1]->name, v[i]->name);
    free(v);
    return rc;
}

static int read_tensors(rd *r, pt_gguf *g, uint64_t n) {
    /* smallest tensor info: empty name (8), n_dims (4), type (4), offset (8) */
    if (rd_check_count(r, n, 24, "tensor count")) return -1;
    if (n > INT_MAX)
        return pt_fail(r->err, "tensor count %llu is too large", (unsigned long long)n);
    g->n_tensors = (int)n;
    g->tensors = pt_xcalloc(n ? (size_t)n : 1, sizeof *g->tensors);
    raw_tensor *raw = pt_xcalloc(n ? (size_t)n : 1, sizeof *raw);
    int rc = 0;
    for (int i = 0; i < g->n_tensors && !rc; i++)
        rc = read_tensor_info(r, i, &raw[i]);
    if (!rc && !pt_add_ok(r->pos, g->alignment - 1, &g->data_offset))
        rc = pt_fail(r->err, "general.alignment %zu is too large", g->alignment);
    g->data_offset &= ~(g->alignment - 1);
    for (int i = 0; i < g->n_tensors && !rc; i++)
        rc = check_tensor(&raw[i], &g->tensors[i], r->err);
    if (!rc) copy_names(g, raw);
    for (int i = 0; i < g->n_tensors && !rc; i++)
        rc = check_tensor_data(g, &raw[i], &g->tensors[i], r->err);
    if (!rc) rc = check_unique(g, r->err);
    free(raw);
    return rc;
}

/* ---- header ------------------------------------------------------------- */

static int read_version(rd *r, pt_gguf *g) {
    if (rd_u32(r, "version", &g->version)) return -1;
    uint32_t v = g->version;
    if (v == 2 || v == 3) return 0;
    if (v == 1)
        return pt_fail(r->err, "GGUF version 1 is not supported (only versions 2 and 3); "
                               "re-convert the model with a current llama.cpp");
    if (v && (v & 0xffff) == 0)
        return pt_fail(r->err,
                       "GGUF version 0x%08x: looks like a big-endian file, which is "
                       "not supported",
                       v);
    return pt_fail(r->err, "unsupported GGUF version %u (only versions 2 and 3)", v);
}

static int parse(rd *r, pt_gguf *g) {
    const uint8_t *magic = NULL;
    if (rd_bytes(r, 4, "magic", &magic)) return -1;
    if (memcmp(magic, "GGUF", 4) != 0)
        return pt_fail(r->err, "not a GGUF file (magic %02x %02x %02x %02x, expected \"GGUF\")",
                       magic[0], magic[1], magic[2], magic[3]);
    uint64_t n_tensors;
    if (read_version(r, g) || rd_u64(r, "tensor count", &n_tensors) ||
        rd_u64(r, "key/value count", &g->n_kv))
        return -1;
    if (read_metadata(r, g) || read_alignment(g, r->err)) return -1;
    return read_tensors(r, g, n_tensors);
}

void pt_gguf_close(pt_gguf *g) {
    if (!g) return;
    for (uint64_t i = 0; g->kv && i < g->n_kv; i++)
        free(g->kv[i].strs);
    free(g->kv);
    free(g->tensors);
    free(g->names);
    pt_mmap_close(&g->map);
    free(g);
}

int pt_gguf_parse(pt_gguf **out, const void *data, size_t size, const char *name, pt_err *err) {
    *out = NULL;
    pt_gguf *g = pt_xcalloc(1, sizeof *g);
    g->base = data;
    g->size = size;
    rd r = {data, size, 0, err};
    if (parse(&r, g)) {
        pt_gguf_close(g);
        return pt_failp(err, "%s", name ? name : "gguf");
    }
    *out = g;
    return 0;
}

int pt_gguf_open(pt_gguf **out, const char *path, pt_err *err) {
    pt_mmap m;
    *out = NULL;
    if (pt_mmap_open(&m, path, err)) return -1;
    if (pt_gguf_parse(out, m.data, m.size, path, err)) {
        pt_mmap_close(&m);
        return -1;
    }
    (*out)->map = m;
    return 0;
}

/* ---- accessors ----------------------------------------------------------- */

uint32_t pt_gguf_version(const pt_gguf *g) {
    return g->version;
}

size_t pt_gguf_alignment(const pt_gguf *g) {
    return g->alignment;
}

size_t pt_gguf_data_offset(const pt_gguf *g) {
    return g->data_offset;
}

int pt_gguf_n_tensors(const pt_gguf *g) {
    return g->n_tensors;
}

const pt_tensor_info *pt_gguf_tensor(const pt_gguf *g, int i) {
    return i >= 0 && i < g->n_tensors ? &g->tensors[i] : NULL;
}

uint64_t pt_gguf_n_kv(const pt_gguf *g) {
    return g->n_kv;
}

bool pt_gguf_kv_at(const pt_gguf *g, uint64_t i, pt_gguf_str *key, int *type) {
    if (i >= g->n_kv) return false;
    if (key) *key = g->kv[i].key;
    if (type) *type = (int)g->kv[i].type;
    return true;
}

bool pt_gguf_kv_record(const pt_gguf *g, uint64_t i, const void **bytes, size_t *len) {
    if (i >= g->n_kv) return false;
    *bytes = g->kv[i].rec;
    *len = g->kv[i].rec_len;
    return true;
}

/* One scalar of type t at p (unaligned) as int64; false if t is not an
 * integer type or a u64 does not fit. */
static bool scalar_int(uint32_t t, const uint8_t *p, int64_t *out) {
    union {
        uint8_t u8;
        int8_t i8;
        uint16_t u16;
        int16_t i16;
        uint32_t u32;
        int32_t i32;
        uint64_t u64;
        int64_t i64;
    } v;
    if (t >= GGUF_TYPE_COUNT || !scalar_bytes[t]) return false;
    memcpy(&v, p, scalar_bytes[t]);
    switch (t) {
    case PT_GGUF_U8:
        *out = v.u8;
        return true;
    case PT_GGUF_I8:
        *out = v.i8;
        return true;
    case PT_GGUF_U16:
        *out = v.u16;
        return true;
    case PT_GGUF_I16:
        *out = v.i16;
        return true;
    case PT_GGUF_U32:
        *out = v.u32;
        return true;
    case PT_GGUF_I32:
        *out = v.i32;
        return true;
    case PT_GGUF_I64:
        *out = v.i64;
        return true;
    case PT_GGUF_U64:
        if (v.u64 > INT64_MAX) return false;
        *out = (int64_t)v.u64;
        return true;
    default:
        return false;
    }
}

static bool scalar_float(uint32_t t, const uint8_t *p, double *out) {
    if (t == PT_GGUF_F32) {
        float f;
        memcpy(&f, p, 4);
        *out = f;
        return true;
    }
    if (t == PT_GGUF_F64) {
        memcpy(out, p, 8);
        return true;
    }
    int64_t i;
    if (!scalar_int(t, p, &i)) return false;
    *out = (double)i;
    return true;
}

bool pt_gguf_get_int(const pt_gguf *g, const char *key, int64_t *out) {
    const gguf_kv *kv = find_kv(g, key);
    return kv && scalar_int(kv->type, kv->val, out);
}

bool pt_gguf_get_float(const pt_gguf *g, const char *key, double *out) {
    const gguf_kv *kv = find_kv(g, key);
    return kv && scalar_float(kv->type, kv->val, out);
}

bool pt_gguf_get_bool(const pt_gguf *g, const char *key, bool *out) {
    const gguf_kv *kv = find_kv(g, key);
    if (!kv || kv->type != PT_GGUF_BOOL) return false;
    *out = kv->val[0] != 0;
    return true;
}

bool pt_gguf_get_str(const pt_gguf *g, const char *key, pt_gguf_str *out) {
    const gguf_kv *kv = find_kv(g, key);
    if (!kv || kv->type != PT_GGUF_STRING) return false;
    memcpy(&out->len, kv->val, 8);
    out->s = (const char *)kv->val + 8;
    return true;
}

bool pt_gguf_get_arr(const pt_gguf *g, const char *key, int *elem_type, uint64_t *count) {
    const gguf_kv *kv = find_kv(g, key);
    if (!kv || kv->type != PT_GGUF_ARRAY) return false;
    if (elem_type) *elem_type = (int)kv->elem_type;
    if (count) *count = kv->count;
    return true;
}

/* Element i of a fixed-size array, or NULL. */
static const uint8_t *arr_elem(const pt_gguf *g, const char *key, uint64_t i, uint32_t *type) {
    const gguf_kv *kv = find_kv(g, key);
    if (!kv || kv->type != PT_GGUF_ARRAY || i >= kv->count || !scalar_bytes[kv->elem_type])
        return NULL;
    *type = kv->elem_type;
    return kv->val + (size_t)i * scalar_bytes[kv->elem_type];
}

bool pt_gguf_arr_str(const pt_gguf *g, const char *key, uint64_t i, pt_gguf_str *out) {
    const gguf_kv *kv = find_kv(g, key);
    if (!kv || kv->type != PT_GGUF_ARRAY || kv->elem_type != PT_GGUF_STRING || i >= kv->count)
        return false;
    *out = kv->strs[i];
    return true;
}

bool pt_gguf_arr_int(const pt_gguf *g, const char *key, uint64_t i, int64_t *out) {
    uint32_t t;
    const uint8_t *p = arr_elem(g, key, i, &t);
    return p && scalar_int(t, p, out);
}

bool pt_gguf_arr_bool(const pt_gguf *g, const char *key, uint64_t i, bool *out) {
    uint32_t t;
    const uint8_t *p = arr_elem(g, key, i, &t);
    if (!p || t != PT_GGUF_BOOL) return false;
    *out = *p != 0;
    return true;
}

bool pt_gguf_arr_float(const pt_gguf *g, const char *key, uint64_t i, double *out) {
    uint32_t t;
    const uint8_t *p = arr_elem(g, key, i, &t);
    return p && scalar_float(t, p, out);
}
