/*
 * gen_gguf_golden.c - writes tests/quant/data/gguf_golden.json from
 * llama.cpp's own quantizers and dequantizers, so that our GGUF block code
 * is checked against an implementation nobody here wrote.
 *
 * The reference is libggml-base.so as shipped, prebuilt, in the npm package
 * @node-llama-cpp/linux-x64 (llama.cpp built by that project); we dlopen it
 * and call quantize_row_<t>_ref and dequantize_row_<t>.  Run by hand, via
 * tests/quant/gen_gguf_golden.sh, which fetches the package with npm.  The
 * JSON holds, per type and input vector: the input floats, the blocks that
 * llama.cpp's reference quantizer wrote (hex), and the floats its
 * dequantizer reads back (hex of the f32 bits, so the comparison is exact).
 *
 *   cc -O2 -o gen tests/quant/gen_gguf_golden.c -ldl -lm
 *   ./gen path/to/libggml-base.so > tests/quant/data/gguf_golden.json
 */
#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef void (*quant_fn)(const float *x, void *y, int64_t k);
typedef void (*dequant_fn)(const void *x, float *y, int64_t k);

static const struct {
    const char *name;
    int block, bytes;
} types[] = {
    {"q8_0", 32, 34}, {"q4_0", 32, 18}, {"q4_K", 256, 144}, {"q5_K", 256, 176}, {"q6_K", 256, 210},
};

/* Deterministic inputs that reach the corners: smooth values, a constant
 * block, zeros, a block with one outlier, huge and tiny magnitudes. */
static void make_input(int kind, float *x, int n) {
    uint32_t s = 12345u + (uint32_t)kind;
    for (int i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        float u = (float)(s >> 8) / 16777216.0f * 2 - 1; /* [-1, 1) */
        switch (kind) {
        case 0: x[i] = u; break;
        case 1: x[i] = 0.02f * sinf(0.37f * (float)i) + 0.005f * u; break;
        case 2: x[i] = i < n / 2 ? 0.25f : 0.0f; break;            /* constant, then zeros */
        case 3: x[i] = (i % 97 == 5 ? 40.0f : 0.1f * u); break;      /* outliers */
        case 4: x[i] = (i & 1 ? 1000.0f : 1e-3f) * u; break;         /* wide range */
        default: x[i] = u > 0 ? u * u : -0.5f * u * u; break;        /* skewed */
        }
    }
}

static void hex(const uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++) printf("%02x", p[i]);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s libggml-base.so\n", argv[0]);
        return 2;
    }
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "%s\n", dlerror());
        return 1;
    }
    const int n = 512, n_kinds = 6;
    printf("{\n \"source\": \"libggml-base.so from npm @node-llama-cpp/linux-x64 (see "
           "tests/quant/gen_gguf_golden.sh)\",\n \"cases\": [\n");
    int first = 1;
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        char qn[64], dn[64];
        snprintf(qn, sizeof qn, "quantize_row_%s_ref", types[t].name);
        snprintf(dn, sizeof dn, "dequantize_row_%s", types[t].name);
        quant_fn q = (quant_fn)dlsym(lib, qn);
        dequant_fn d = (dequant_fn)dlsym(lib, dn);
        if (!q || !d) {
            fprintf(stderr, "missing %s or %s\n", qn, dn);
            return 1;
        }
        for (int k = 0; k < n_kinds; k++) {
            float x[512], y[512];
            size_t nb = (size_t)(n / types[t].block) * (size_t)types[t].bytes;
            uint8_t *blocks = calloc(1, nb);
            make_input(k, x, n);
            q(x, blocks, n);
            d(blocks, y, n);
            printf("%s  {\"type\": \"%s\", \"kind\": %d, \"n\": %d,\n   \"input\": [", first ? "" : ",\n",
                   types[t].name, k, n);
            for (int i = 0; i < n; i++) printf("%s%.9g", i ? "," : "", (double)x[i]);
            printf("],\n   \"blocks\": \"");
            hex(blocks, nb);
            printf("\",\n   \"dequant_f32_hex\": \"");
            hex((const uint8_t *)y, sizeof y);
            printf("\"}");
            first = 0;
            free(blocks);
        }
    }
    printf("\n ]\n}\n");
    dlclose(lib);
    return 0;
}
