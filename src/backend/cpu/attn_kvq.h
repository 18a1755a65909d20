/*
 * attn_kvq.h - the CPU backend's kv_store and attention for quantized KV
 * caches (pt_kv_view.codec != NULL; formats in src/kv/kv_codec.h).
 *
 * kv_store encodes each row with the codec's scalar encoder.  Attention is
 * fused: it reads the packed codes and fp16 planes of each cached row
 * directly, dequantizes 8 elements at a time in registers, and never builds
 * a dequantized copy of the window.  TurboQuant values are summed in their
 * rotated domain and the output row is un-rotated once (the deferred inverse
 * transform).  Kernels come as a table, portable C and AVX2, like
 * cpu_kernels.h; the driver (attn_kvq.c) is shared.
 */
#ifndef PETREL_ATTN_KVQ_H
#define PETREL_ATTN_KVQ_H

#include "backend/backend.h"
#include "kv/kv_codec.h"

/* Kernels work on a chunk of cnt consecutive slots of one page: slot r
 * starts slot_bytes * r after `slots` and holds n_kv rows (kv head g at
 * g * row bytes).  Query heads g * G .. g * G + G - 1 share kv head g. */
typedef struct pt_kvq_kernels {
    const char *name;
    /* sc[h * ld + r] = q[h * head_dim ...] . K^(slot r, kv head h / G). */
    void (*k_scores)(const pt_kv_codec *c, const uint8_t *slots, size_t slot_bytes, int cnt,
                     int n_kv, const float *q, int G, float *sc, int ld);
    /* acc[h * head_dim ...] += sum over r of w[h * ld + r] * V(slot r, kv
     * head h / G), V as stored (decode_v_raw: rotated for TurboQuant). */
    void (*v_accum)(const pt_kv_codec *c, const uint8_t *slots, size_t slot_bytes, int cnt,
                    int n_kv, const float *w, int ld, int G, float *acc);
} pt_kvq_kernels;

const pt_kvq_kernels *pt_kvq_kernels_portable(void);
/* NULL when the build has no AVX2 set; the backend has checked the CPU. */
const pt_kvq_kernels *pt_kvq_kernels_avx2(void);

/* The ops, with pt_backend_ops' signatures, for views with a codec. */
void pt_cpu_kvq_store(pt_backend *be, const pt_kv_view *kv, const pt_batch_view *b, const float *k,
                      const float *v);
void pt_cpu_kvq_attention(pt_backend *be, float *out, const float *q, const pt_kv_view *kv,
                          const pt_batch_view *b, int n_heads, float scale);

#endif
