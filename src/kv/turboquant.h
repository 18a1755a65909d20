/*
 * turboquant.h - the TurboQuant KV codec, exactly as its reference computes
 * it (vllm-metal's Python module on float32 input, pinned down in
 * ../shared/reference/turboquant/README.md and constants.json).
 *
 * Keys are never rotated: per group of 32 along head_dim they get an
 * asymmetric affine code (signed int8 at 8 bits, unsigned at 2/4/5 bits)
 * with an fp16 scale and an fp16 zero point; x^ = (code + zero) * scale.
 * Values are multiplied by a fixed +-1 sign vector, Walsh-Hadamard
 * transformed (normalized by 1/sqrt(d)), divided by the RMS of each 32-group
 * and replaced by the index of their Lloyd-Max cell for N(0,1); the RMS is
 * stored as fp16.  Codes of fewer than 8 bits are packed as one LSB-first
 * bitstream per row (element i at bits [i*b, i*b + b)).
 *
 * Every float32 operation here rounds where the reference rounds, so codes,
 * packed bytes, scales and zero points are bit-identical to the reference
 * wherever its output is finite (tests/kv/test_turboquant.c checks that
 * against goldens from an independent model, tests/fixtures/turboquant/).
 *
 * Where the reference stores a non-finite value we do not: a key group whose
 * fp16 scale or zero point would be +-Inf/NaN (a constant group such as all
 * 0.5, a group far from zero compared with its spread, a range beyond fp16,
 * or a non-finite input) is re-encoded with a scale widened until the zero
 * point is at most 1024 in magnitude, rounded up to fp16, codes computed with
 * the stored values; a value row with a non-finite input is clamped into the
 * fp16 range first, and a group RMS beyond fp16 is stored as 65504.  These
 * repairs are counted in the return value of the encoders.  See
 * docs/kv-quant.md.
 *
 * Outside the reference (opt-in, "any_dim"): head dims 8, 16 and 32 use one
 * group per 8/16/32 elements and the first d signs of the d = 64 vector.
 */
#ifndef PETREL_TURBOQUANT_H
#define PETREL_TURBOQUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PT_TQ_GROUP 32
#define PT_TQ_MAX_DIM 512

/* The reference's sets: head dims {64,128,256,512}, key bits {2,4,5,8},
 * value bits {2,3,4,5,8}.  pt_tq_dim_ok(d, true) also takes 8, 16, 32. */
bool pt_tq_dim_ok(int d, bool any_dim);
bool pt_tq_k_bits_ok(int bits);
bool pt_tq_v_bits_ok(int bits);
/* Group size for a head dim: 32, or d itself below 32. */
int pt_tq_group(int d);

/* The +-1 sign vector for head dim d (out[d]); -1 if d is not valid. */
int pt_tq_signs(int d, float *out);
/* float32(1/sqrt(d)), the normalization the reference applies once. */
float pt_tq_inv_sqrt(int d);
/* Lloyd-Max tables for N(0,1) at value bits b: 2^b centroids and 2^b - 1
 * boundaries, float32 as the reference holds them. */
const float *pt_tq_centroids(int bits);
const float *pt_tq_boundaries(int bits);

/* Bitstream packing of n codes (n * bits a multiple of 8).  8-bit codes are
 * plain bytes (signed keys as two's complement). */
void pt_tq_pack(const int32_t *codes, int n, int bits, uint8_t *out);
void pt_tq_unpack(const uint8_t *in, int n, int bits, bool is_signed, int32_t *codes);

/* Unnormalized Walsh-Hadamard transform in place (d a power of two), as
 * float32 radix-2 butterflies at strides 1, 2, ... d/2: lower = a + b,
 * upper = a - b.  Its own inverse up to the factor d. */
void pt_tq_fwht(float *x, int d);

/* Keys: one row of d elements in groups of `group`.  Writes packed codes
 * (d * bits / 8 bytes) and one fp16 scale and zero point per group.
 * Returns the number of groups repaired (see the file comment). */
int pt_tq_encode_k(const float *x, int d, int group, int bits, uint8_t *codes, uint16_t *scales,
                   uint16_t *zeros);
/* x^ = (code + zero) * scale in float32. */
void pt_tq_decode_k(const uint8_t *codes, const uint16_t *scales, const uint16_t *zeros, int d,
                    int group, int bits, float *x);

/* Values: rotation, per-group RMS and Lloyd-Max codes.  signs is
 * pt_tq_signs(d).  Returns the number of groups repaired. */
int pt_tq_encode_v(const float *x, int d, int group, int bits, const float *signs, uint8_t *codes,
                   uint16_t *scales);
/* Eager decode: r = centroid[code] * scale, x^ = signs * H(r) / sqrt(d). */
void pt_tq_decode_v(const uint8_t *codes, const uint16_t *scales, int d, int group, int bits,
                    const float *signs, float *x);
/* The rotated-domain part of decode alone: r = centroid[code] * scale. */
void pt_tq_dequant_rotated(const uint8_t *codes, const uint16_t *scales, int d, int group, int bits,
                           float *r);
/* The deferred inverse transform: acc <- signs * H(acc) * inv_sqrt(d) * mul.
 * Attention is linear in V, so the weighted sum of rotated-domain rows is
 * un-rotated once per output row instead of once per cached token. */
void pt_tq_unrotate(float *acc, int d, const float *signs, float mul);

#endif
