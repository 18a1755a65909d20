/*
 * model_file.h - opening a model from disk, whatever its format.
 *
 * A model is either one GGUF file or a Hugging Face directory (config.json,
 * model.safetensors or model.safetensors.index.json with shards,
 * tokenizer.json, tokenizer_config.json, generation_config.json; or, for a
 * directory converted from GGUF, tokenizer.gguf in place of tokenizer.json).  Files are
 * mmap'd read-only; every tensor is a view into a mapping (zero copy).  Every
 * size, offset and count read from a file is checked before use: a damaged
 * file is an error that names the field or tensor, never a crash.
 */
#ifndef PETREL_MODEL_FILE_H
#define PETREL_MODEL_FILE_H

#include <jansson.h>

#include "base/base.h"
#include "base/dtype.h"

typedef struct pt_gguf pt_gguf;

typedef struct pt_tensor_info {
    const char *name;
    pt_dtype dtype;
    int ndim;
    int64_t shape[4]; /* row-major, outermost first (numpy order) */
    const void *data; /* inside a read-only mapping */
    size_t nbytes;
} pt_tensor_info;

enum pt_file_kind { PT_FILE_GGUF, PT_FILE_HF };

typedef struct pt_model_file {
    int kind;                 /* enum pt_file_kind */
    char *path;               /* the file or directory given */
    pt_gguf *gguf;            /* GGUF: header, metadata; NULL for HF */
    json_t *config;           /* HF: config.json; NULL for GGUF */
    json_t *generation_config; /* HF: generation_config.json, may be NULL */
    json_t *tokenizer_config; /* HF: tokenizer_config.json, may be NULL */
    char *tokenizer_json;     /* HF: path of tokenizer.json, may be NULL */
    char *tokenizer_gguf;     /* HF without tokenizer.json: path of tokenizer.gguf
                               * (a GGUF source's tokenizer.* keys, no tensors,
                               * as `petrel convert` writes it), or NULL */
    int n_tensors;
    pt_tensor_info *tensors;
    void *priv; /* mappings, owned */
} pt_model_file;

/* Opens a .gguf file or a Hugging Face directory. */
int pt_model_file_open(pt_model_file **out, const char *path, pt_err *err);
void pt_model_file_close(pt_model_file *mf);
/* The tensor called name, or NULL. */
const pt_tensor_info *pt_model_file_tensor(const pt_model_file *mf, const char *name);
/* Total bytes of tensor data. */
size_t pt_model_file_bytes(const pt_model_file *mf);

/* Reads a whole (small) file, NUL-terminated.  Fails past max_bytes. */
int pt_read_file(const char *path, size_t max_bytes, char **out, size_t *len, pt_err *err);

#endif
