/*
 * fuzz_gguf.c - libFuzzer target for the GGUF parser.
 * fuzz-layer: io
 *
 * Arbitrary bytes as a GGUF image.  Parsing must fail with an error or give a
 * pt_gguf whose every accessor is safe: each key is read through every typed
 * getter, arrays element by element, and each tensor's first and last data
 * byte is touched, so ASan sees any view that escapes the input.  Seeds:
 * fuzz/corpus/gguf/ (small files of every value type, the stories260K
 * metadata with tiny tensors).
 */
#include <stdio.h>
#include <stdlib.h>

#include "io/gguf.h"

static volatile uint8_t sink;

/* Touches up to 64 elements of the array at key (the first and the last). */
static void walk_array(const pt_gguf *g, const char *key) {
    int et;
    uint64_t n;
    if (!pt_gguf_get_arr(g, key, &et, &n)) __builtin_trap();
    for (uint64_t i = 0; i < n && i < 64; i++) {
        uint64_t k = i == 63 ? n - 1 : i;
        pt_gguf_str s;
        int64_t v;
        double f;
        if (pt_gguf_arr_str(g, key, k, &s) && s.len) sink ^= (uint8_t)(s.s[0] ^ s.s[s.len - 1]);
        if (pt_gguf_arr_int(g, key, k, &v)) sink ^= (uint8_t)v;
        if (pt_gguf_arr_float(g, key, k, &f)) sink ^= (uint8_t)(f != f);
    }
    pt_gguf_str s;
    if (pt_gguf_arr_str(g, key, n, &s)) __builtin_trap(); /* one past the end */
}

static void walk_keys(const pt_gguf *g) {
    for (uint64_t i = 0; i < pt_gguf_n_kv(g); i++) {
        pt_gguf_str k;
        int type;
        if (!pt_gguf_kv_at(g, i, &k, &type)) __builtin_trap();
        char key[256];
        snprintf(key, sizeof key, "%.*s", (int)(k.len < 255 ? k.len : 255), k.s);
        int64_t v;
        double f;
        bool b;
        pt_gguf_str s;
        if (pt_gguf_get_int(g, key, &v)) sink ^= (uint8_t)v;
        if (pt_gguf_get_float(g, key, &f)) sink ^= (uint8_t)(f != f);
        if (pt_gguf_get_bool(g, key, &b)) sink ^= b;
        if (pt_gguf_get_str(g, key, &s) && s.len) sink ^= (uint8_t)s.s[s.len - 1];
        if (type == PT_GGUF_ARRAY && pt_gguf_get_arr(g, key, NULL, NULL)) walk_array(g, key);
        sink ^= (uint8_t)pt_gguf_type_name(type)[0];
    }
}

static void walk_tensors(const pt_gguf *g, const uint8_t *data, size_t size) {
    for (int i = 0; i < pt_gguf_n_tensors(g); i++) {
        const pt_tensor_info *t = pt_gguf_tensor(g, i);
        const uint8_t *p = t->data;
        if (t->nbytes == 0 || p < data || p + t->nbytes > data + size) __builtin_trap();
        if ((size_t)(p - data) % pt_gguf_alignment(g)) __builtin_trap();
        sink ^= p[0] ^ p[t->nbytes - 1] ^ (uint8_t)t->name[0];
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    pt_gguf *g;
    pt_err err;
    if (pt_gguf_parse(&g, data, size, "fuzz.gguf", &err)) return 0;
    walk_keys(g);
    walk_tensors(g, data, size);
    pt_gguf_close(g);
    return 0;
}
