/*
 * convert.h - writing an MLX-layout affine-quantized model directory from a
 * full-precision one (`petrel convert`), and choosing bits per module.
 *
 * The caller lists the source tensors with their output names and the bits
 * each gets (a plan: uniform, mixed precision, or chosen by measured
 * sensitivity under a bits-per-weight budget, bpw.c); pt_convert_write
 * quantizes and writes DST/model.safetensors and DST/config.json with the
 * "quantization" entry MLX and Petrel read.  Sources may be f32, f16, bf16
 * or GGUF block types; quantization starts from f32 values.
 */
#ifndef PETREL_CONVERT_H
#define PETREL_CONVERT_H

#include <jansson.h>

#include "base/threadpool.h"
#include "io/model_file.h"
#include "quant/quant.h"

typedef struct pt_convert_tensor {
    const pt_tensor_info *src;
    char name[192]; /* output name ("model.layers.0.mlp.up_proj.weight") */
    int bits;       /* 0: written unquantized (f32/f16/bf16 as it is) */
    int group_size;
    int rope_head_dim; /* > 0: rows are heads of this size in GGUF's interleaved rope
                        * order; written in Hugging Face's half-split order */
} pt_convert_tensor;

typedef struct pt_convert_opts {
    int bits, group_size;  /* the defaults config.json records */
    pt_dtype scale_dtype;  /* of scales and biases: f16, bf16 or f32 */
    pt_pool *pool;         /* quantizes rows in parallel; may be NULL */
    void (*progress)(void *user, size_t done, size_t total, const char *name);
    void *user;
} pt_convert_opts;

typedef struct pt_convert_stats {
    int64_t params, quantized_params;
    size_t bytes_in, bytes_out;
    double quantized_bpw; /* bits per quantized weight, scales and biases included */
} pt_convert_stats;

/* A tensor MLX would quantize: a 2-D "*.weight" whose rows are whole groups. */
bool pt_convert_quantizable(const pt_tensor_info *t, int group_size);

/* The module of a weight name: "model.layers.3.mlp.up_proj.weight" ->
 * layer 3, kind "mlp.up_proj"; layer -1 outside the layers. */
int pt_convert_layer_of(const char *name);

/* --mixed-precision: embeddings, the output head, and v_proj / down_proj of
 * the first and last eighths of the layers and every third layer between
 * get high_bits; the rest keep their bits. */
void pt_convert_plan_mixed(pt_convert_tensor *t, int n, int n_layers, int high_bits);

/* Writes dst/model.safetensors and dst/config.json (config plus the
 * quantization entry).  dst must exist. */
int pt_convert_write(const char *dst, const json_t *config, const pt_convert_tensor *t, int n,
                     const pt_convert_opts *o, pt_convert_stats *st, pt_err *err);

/* Copies the other files of a Hugging Face directory (tokenizer, generation
 * config, chat template...): every regular file except config.json, weights
 * and their index. */
int pt_convert_copy_files(const char *src_dir, const char *dst_dir, int *n_copied, pt_err *err);

/* A GGUF source's tokenizer for dst: its tokenizer.* keys as dst/tokenizer.gguf
 * (a GGUF file without tensors, which the loader reads when a directory has
 * no tokenizer.json) and its chat template in dst/tokenizer_config.json.
 * *written is false when the source has no tokenizer. */
int pt_convert_write_gguf_tokenizer(const pt_gguf *g, const char *dst, bool *written, pt_err *err);

/* Row r of a 2-D source tensor as f32 (any float or GGUF block dtype). */
void pt_convert_read_row(const pt_tensor_info *t, int64_t r, float *out);

#endif
