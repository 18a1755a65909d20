/*
 * fuzz_safetensors.c - libFuzzer target for the safetensors parser.
 * fuzz-layer: io
 *
 * Arbitrary bytes as a .safetensors image.  Parsing must fail with an error
 * or give tensors whose views lie inside the input, in data order, without
 * overlaps, each found again by name.  Seeds: fuzz/corpus/safetensors/.
 */
#include <stdlib.h>

#include "io/safetensors.h"

static volatile uint8_t sink;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    pt_safetensors *st;
    pt_err err;
    if (pt_safetensors_parse(&st, data, size, "fuzz.safetensors", &err)) return 0;
    const uint8_t *prev_end = data + pt_safetensors_data_offset(st);
    for (int i = 0; i < pt_safetensors_n_tensors(st); i++) {
        const pt_tensor_info *t = pt_safetensors_tensor(st, i);
        const uint8_t *p = t->data;
        if (p < data + pt_safetensors_data_offset(st) || p + t->nbytes > data + size)
            __builtin_trap();
        if (pt_safetensors_find(st, t->name) != t) __builtin_trap();
        if (t->nbytes) {
            if (p < prev_end) __builtin_trap(); /* overlap */
            prev_end = p + t->nbytes;
            sink ^= p[0] ^ p[t->nbytes - 1];
        }
    }
    const char *fmt = pt_safetensors_meta_str(st, "format");
    if (fmt) sink ^= (uint8_t)fmt[0];
    pt_safetensors_close(st);
    return 0;
}
