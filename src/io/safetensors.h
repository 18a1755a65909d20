/*
 * safetensors.h - one .safetensors file: header, tensor infos, metadata.
 *
 * A file is an 8-byte little-endian header length N, N bytes of JSON
 *   {"name": {"dtype": "BF16", "shape": [4096, 4096], "data_offsets": [b, e]},
 *    ..., "__metadata__": {"format": "pt"}}
 * and the data section, to which [b, e) is relative.  pt_safetensors_open()
 * maps the file and validates every entry before it returns (see
 * docs/formats.md); tensors are views into the mapping.
 *
 * Tensor data is only guaranteed byte-aligned: the format pads nothing
 * between tensors, so a consumer that needs aligned floats must check the
 * pointer (or copy).
 */
#ifndef PETREL_SAFETENSORS_H
#define PETREL_SAFETENSORS_H

#include "io/model_file.h"

/* Largest JSON header accepted (the reference implementation uses 100 MB). */
#define PT_SAFETENSORS_MAX_HEADER ((size_t)100 << 20)

typedef struct pt_safetensors pt_safetensors;

/* Parses an image in memory (data must outlive the result).  name is used in
 * error messages.  Used by pt_safetensors_open and by the fuzzer. */
int pt_safetensors_parse(pt_safetensors **out, const void *data, size_t size, const char *name,
                         pt_err *err);
/* Maps and parses a file. */
int pt_safetensors_open(pt_safetensors **out, const char *path, pt_err *err);
void pt_safetensors_close(pt_safetensors *st);

/* Tensors in the order of their data in the file. */
int pt_safetensors_n_tensors(const pt_safetensors *st);
const pt_tensor_info *pt_safetensors_tensor(const pt_safetensors *st, int i);
/* The tensor called name, or NULL. */
const pt_tensor_info *pt_safetensors_find(const pt_safetensors *st, const char *name);

/* The "__metadata__" object (string -> string by the spec), or NULL. */
const json_t *pt_safetensors_metadata(const pt_safetensors *st);
/* One metadata string (e.g. "format" -> "mlx"), or NULL if absent or not a
 * string. */
const char *pt_safetensors_meta_str(const pt_safetensors *st, const char *key);
/* Offset of the data section in the file: 8 + header length. */
size_t pt_safetensors_data_offset(const pt_safetensors *st);

/* ---- writing (safetensors_write.c) ----------------------------------------
 * Declare every tensor first (the header needs all of them), then write each
 * one's bytes, in any order and in pieces; close checks that every byte was
 * written, fsyncs and renames the temporary file into place, so a reader
 * never sees half a file.  Tensors are laid out by element size, largest
 * first, so each starts aligned to its element (the header is padded to 8). */
typedef struct pt_st_entry {
    const char *name;
    pt_dtype dtype;
    int ndim;
    int64_t shape[4];
} pt_st_entry;

typedef struct pt_st_writer pt_st_writer;

/* metadata: an object of strings for "__metadata__", or NULL. */
int pt_st_writer_open(pt_st_writer **out, const char *path, const pt_st_entry *entries, int n,
                      const json_t *metadata, pt_err *err);
/* Writes n bytes of entry i's data, starting at byte off of that tensor. */
int pt_st_writer_put(pt_st_writer *w, int i, size_t off, const void *data, size_t n, pt_err *err);
int pt_st_writer_close(pt_st_writer *w, pt_err *err);
/* Gives up: removes the temporary file. */
void pt_st_writer_abort(pt_st_writer *w);

#endif
