/*
 * kv_codec.h - how a quantized KV cache stores one key or value row.
 *
 * A codec turns the head_dim floats of one (position, kv head) row into a
 * fixed number of bytes and back.  The KV cache (kvcache.h) sizes its pages
 * from the codec's row sizes; the backends' kv_store and attention ops read
 * and write those bytes (pt_kv_view.codec).  Three kinds:
 *
 *   none   elements of the cache dtype (f32/f16/bf16); no codec object.
 *   affine `--kv-quant 8` / `4`: per group along head_dim, unsigned codes
 *          with an fp16 scale and bias, x^ = code * scale + bias (the MLX
 *          affine convention our weights use).  Group 32, or 16/8 for head
 *          dims that 32 does not divide.
 *   turbo  `--kv-quant turbo[:k<b>v<b>]`: TurboQuant as its reference
 *          computes it (turboquant.h); keys affine and unrotated, values
 *          rotated and Lloyd-Max coded.  Default k8v3.
 *
 * Row layout, the same for every kind and for K and V:
 *
 *   [packed codes: head_dim * bits / 8 bytes][fp16 scales: n_groups]
 *   [fp16 zero points (turbo K) or biases (affine K and V): n_groups]
 *
 * TurboQuant value rows have no third plane.  Codes are an LSB-first
 * bitstream (element i at bits [i*b, i*b + b)), so every group of 8
 * elements starts on a byte.  Everything is little-endian; rows are not
 * aligned beyond a byte.
 *
 * The name (pt_kvq_name) is part of the cache's identity: pages written by
 * one codec are never read by another.
 */
#ifndef PETREL_KV_CODEC_H
#define PETREL_KV_CODEC_H

#include "base/base.h"
#include "kv/turboquant.h"

typedef enum pt_kvq_kind { PT_KVQ_NONE, PT_KVQ_AFFINE, PT_KVQ_TURBO } pt_kvq_kind;

/* What --kv-quant asks for, before a head dim is known. */
typedef struct pt_kvq_spec {
    int kind; /* pt_kvq_kind */
    int k_bits, v_bits;
    bool any_dim; /* turbo: also head dims 8/16/32 (outside the reference) */
} pt_kvq_spec;

/* Parses "none", "8", "4", "turbo", "turbo:k<b>v<b>", each turbo form
 * optionally followed by ":anydim".  NULL or "" mean none. */
int pt_kvq_parse(const char *s, pt_kvq_spec *out, pt_err *err);
/* Canonical name, the codec's part of a cache key: "none", "affine8",
 * "affine4", "turbo-k8v3". */
const char *pt_kvq_name(const pt_kvq_spec *s, char *buf, size_t cap);

typedef struct pt_kv_codec pt_kv_codec;
typedef void (*pt_kv_encode_fn)(const pt_kv_codec *c, const float *x, uint8_t *row);
typedef void (*pt_kv_decode_fn)(const pt_kv_codec *c, const uint8_t *row, float *x);

/* A codec bound to a head dim: geometry, constant tables, and the scalar
 * reference encode/decode.  A backend in host memory calls the functions
 * through these pointers (it links no code of this layer). */
struct pt_kv_codec {
    pt_kvq_spec spec;
    int head_dim, group, n_groups;
    int k_codes, v_codes;       /* bytes of packed codes in a K / V row */
    int k_row, v_row;           /* bytes of a whole K / V row */
    bool k_signed;              /* K codes are two's complement (turbo k8) */
    bool v_rotated;             /* V rows hold the rotated domain (turbo) */
    float inv_sqrt_d;           /* turbo: float32(1/sqrt(head_dim)) */
    const float *centroids;     /* turbo: V Lloyd-Max centroids [1 << v_bits] */
    float signs[PT_TQ_MAX_DIM]; /* turbo: the sign vector [head_dim] */
    pt_kv_encode_fn encode_k, encode_v;
    pt_kv_decode_fn decode_k;
    /* V rows as stored: the rotated domain for turbo (r = centroid * scale;
     * attention sums these and un-rotates once), x^ itself otherwise. */
    pt_kv_decode_fn decode_v_raw;
    /* V rows back to the model's domain (eager). */
    pt_kv_decode_fn decode_v;
    /* turbo only (NULL otherwise): the deferred inverse transform of a sum
     * of raw V rows, out <- signs * H(out) / sqrt(d) * mul, once per output
     * row instead of once per cached token. */
    void (*unrotate)(const pt_kv_codec *c, float *out, float mul);
};

/* Binds spec to head_dim; refuses (with the reason) what the codec cannot
 * store, e.g. TurboQuant on head_dim 80. */
int pt_kv_codec_init(pt_kv_codec *c, const pt_kvq_spec *spec, int head_dim, pt_err *err);

/* Where a row's planes start. */
static inline const uint8_t *pt_kv_row_scales(const uint8_t *row, int codes_bytes) {
    return row + codes_bytes;
}
static inline const uint8_t *pt_kv_row_zeros(const uint8_t *row, int codes_bytes, int n_groups) {
    return row + codes_bytes + 2 * n_groups;
}

#endif
