/*
 * gguf.h - GGUF v2/v3 files: header, metadata key/values, tensor infos.
 *
 * pt_gguf_open() maps the file and validates the whole header before it
 * returns: counts against the file size, string lengths, array lengths and
 * element types, tensor dims, types, offsets (aligned, in bounds, not
 * overlapping the header) and byte sizes.  Accessors below never fail on a
 * well-formed pt_gguf; they return false when a key is absent or has a type
 * that cannot convert.
 */
#ifndef PETREL_GGUF_H
#define PETREL_GGUF_H

#include "io/model_file.h"

enum pt_gguf_type {
    PT_GGUF_U8 = 0,
    PT_GGUF_I8 = 1,
    PT_GGUF_U16 = 2,
    PT_GGUF_I16 = 3,
    PT_GGUF_U32 = 4,
    PT_GGUF_I32 = 5,
    PT_GGUF_F32 = 6,
    PT_GGUF_BOOL = 7,
    PT_GGUF_STRING = 8,
    PT_GGUF_ARRAY = 9,
    PT_GGUF_U64 = 10,
    PT_GGUF_I64 = 11,
    PT_GGUF_F64 = 12,
};

/* A string inside the mapping: not NUL-terminated. */
typedef struct pt_gguf_str {
    const char *s;
    uint64_t len;
} pt_gguf_str;

/* Parses a GGUF image in memory (data must outlive the result).  Used by
 * pt_gguf_open and by the fuzzer. */
int pt_gguf_parse(pt_gguf **out, const void *data, size_t size, const char *name, pt_err *err);
/* Maps and parses a file. */
int pt_gguf_open(pt_gguf **out, const char *path, pt_err *err);
void pt_gguf_close(pt_gguf *g);

uint32_t pt_gguf_version(const pt_gguf *g);
int pt_gguf_n_tensors(const pt_gguf *g);
const pt_tensor_info *pt_gguf_tensor(const pt_gguf *g, int i);

/* Scalars: any integer type converts to int64, any number to double. */
bool pt_gguf_get_int(const pt_gguf *g, const char *key, int64_t *out);
bool pt_gguf_get_float(const pt_gguf *g, const char *key, double *out);
bool pt_gguf_get_bool(const pt_gguf *g, const char *key, bool *out);
bool pt_gguf_get_str(const pt_gguf *g, const char *key, pt_gguf_str *out);
/* Arrays: element type and count; elements via the typed getters. */
bool pt_gguf_get_arr(const pt_gguf *g, const char *key, int *elem_type, uint64_t *count);
bool pt_gguf_arr_str(const pt_gguf *g, const char *key, uint64_t i, pt_gguf_str *out);
bool pt_gguf_arr_int(const pt_gguf *g, const char *key, uint64_t i, int64_t *out);
bool pt_gguf_arr_float(const pt_gguf *g, const char *key, uint64_t i, double *out);
bool pt_gguf_arr_bool(const pt_gguf *g, const char *key, uint64_t i, bool *out);

/* Added by the io layer: layout and metadata iteration. */
/* general.alignment (default 32) and the file offset where tensor data starts. */
size_t pt_gguf_alignment(const pt_gguf *g);
size_t pt_gguf_data_offset(const pt_gguf *g);
/* Metadata in file order: key and value type (enum pt_gguf_type) of entry i. */
uint64_t pt_gguf_n_kv(const pt_gguf *g);
bool pt_gguf_kv_at(const pt_gguf *g, uint64_t i, pt_gguf_str *key, int *type);
/* Entry i exactly as the file holds it (key, value type, value), for
 * copying metadata into another GGUF file. */
bool pt_gguf_kv_record(const pt_gguf *g, uint64_t i, const void **bytes, size_t *len);
/* "u32", "string", "array", ...; "unknown" outside the enum. */
const char *pt_gguf_type_name(int type);

#endif
