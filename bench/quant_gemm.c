/*
 * quant_gemm.c - quantized prefill kernels in isolation: pt_qk_matmul for
 * q8_0 / q4_0 / q4_k / q6_k weights of the TinyLlama FFN shape (5632 x 2048,
 * and 2048 x 5632) at n tokens, the int8 GEMM against the int16 row kernels,
 * arms alternated, best of REPS per arm.  Not a test and not in the build:
 *
 *   gcc -O2 -std=c11 -D_GNU_SOURCE -Isrc bench/quant_gemm.c build/libpetrel_backend.a \
 *       build/libpetrel_quant.a build/libpetrel_base.a -lpthread -lm -o /tmp/quant_gemm
 *   /tmp/quant_gemm [threads] [n] [reps]
 *
 * One thread is timed by its CPU time (a shared machine), several by wall
 * time.  Prints GOP/s (2 per multiply-add) per arm and their ratio (and,
 * on a CPU with AVX-512 VNNI, its int8 kernels against AVX2's); for
 * q4_0 also the int8 kernels on the load-time layout (PT_LAYOUT_Q4_0X8)
 * against the file layout.  Under
 * `valgrind --tool=callgrind` use reps 1 to count instructions per arm.
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#ifndef DECODE_SCALE
#define DECODE_SCALE 8
#endif

#include "backend/cpu/quant_kernels.h"
#include "backend/repack.h"
#include "quant/quant.h"

/* One thread: this thread's CPU time, which the other jobs of a shared
 * machine do not inflate as much as wall time; several: wall time. */
static double now(bool cpu) {
    struct timespec ts;
    if (!cpu) return pt_now();
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double run(pt_qk_ctx *ctx, pt_pool *pool, float *y, const float *x, const pt_weight *w, int n) {
    double t0 = now(!pool);
    pt_qk_matmul(ctx, pool, y, x, w, n);
    return now(!pool) - t0;
}

static double ops_of(int64_t rows, int64_t cols, int n) {
    return 2.0 * (double)rows * (double)cols * n;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 1, n = argc > 2 ? atoi(argv[2]) : 128;
    int reps = argc > 3 ? atoi(argv[3]) : 5;
    static const pt_dtype ts[] = {PT_Q8_0, PT_Q4_0, PT_Q4_K, PT_Q6_K};
    static const int64_t shapes[][2] = {{5632, 2048}, {2048, 5632}};
    pt_pool *pool = threads > 1 ? pt_pool_new(threads) : NULL;
    pt_rng rng;
    pt_rng_seed(&rng, 1);
    for (size_t s = 0; s < 2; s++) {
        /* decode (n below the GEMM's minimum) streams 8x the rows, 46-104 MB:
         * past the L3, as a model's weights are */
        int64_t rows = shapes[s][0] * (n < PT_QK_I8_MIN_TOKENS ? DECODE_SCALE : 1), cols = shapes[s][1];
        float *src = malloc(sizeof(float) * (size_t)cols), *x = malloc(sizeof(float) * (size_t)(n * cols));
        float *y = malloc(sizeof(float) * (size_t)(n * rows));
        for (int64_t i = 0; i < n * cols; i++) x[i] = (float)(pt_rng_uniform(&rng) * 2 - 1);
        for (size_t f = 0; f < PT_ARRAY_LEN(ts); f++) {
            size_t rb = pt_dtype_bytes(ts[f], (uint64_t)cols);
            uint8_t *data = malloc(rb * (size_t)rows);
            for (int64_t r = 0; r < rows; r++) {
                for (int64_t i = 0; i < cols; i++) src[i] = (float)(pt_rng_uniform(&rng) * 2 - 1);
                pt_gguf_quantize(ts[f], src, data + rb * (size_t)r, cols);
            }
            pt_weight w = {.dtype = ts[f], .rows = rows, .cols = cols, .data = data};
            pt_qk_ctx i8 = {.avx2 = true, .i8 = true, .i8_decode = true}, i16 = {.avx2 = true};
            pt_qk_ctx i8z = {.avx2 = true, .avx512 = true, .i8 = true, .i8_decode = true};
            bool z = pt_qk_cpu_has_avx512();
            double b8 = 1e30, b16 = 1e30, bz = 1e30;
            for (int r = 0; r < reps; r++) {
                b8 = PT_MIN(b8, run(&i8, pool, y, x, &w, n));
                b16 = PT_MIN(b16, run(&i16, pool, y, x, &w, n));
                if (z) bz = PT_MIN(bz, run(&i8z, pool, y, x, &w, n));
            }
            if (z) /* the AVX-512 VNNI kernels against the AVX2 int8 ones */
                printf("%-5s %5lldx%-5lld n=%d t=%d  %-17s %7.1f GOP/s %5.1f GB/s   avx2 int8 %7.1f GOP/s   ratio %.2f\n",
                       pt_dtype_name(ts[f]), (long long)rows, (long long)cols, n, threads, pt_qk_path(&i8z, &w, n),
                       ops_of(rows, cols, n) / bz / 1e9, (double)(rb * (size_t)rows) / bz / 1e9,
                       ops_of(rows, cols, n) / b8 / 1e9, b8 / bz);
            double ops = 2.0 * (double)rows * (double)cols * n;
            printf("%-5s %5lldx%-5lld n=%d t=%d  %-15s %7.1f GOP/s %5.1f GB/s   avx2 int16 %7.1f GOP/s %5.1f GB/s   ratio %.2f\n",
                   pt_dtype_name(ts[f]), (long long)rows, (long long)cols, n, threads,
                   pt_qk_path(&i8, &w, n), ops / b8 / 1e9, (double)(rb * (size_t)rows) / b8 / 1e9,
                   ops / b16 / 1e9, (double)(rb * (size_t)rows) / b16 / 1e9, b16 / b8);
            if (pt_layout_fits(PT_LAYOUT_Q4_0X8, ts[f], rows, cols)) { /* the load-time repack */
                if (z) i8 = i8z; /* the widest int8 kernels on both layouts */
                pt_weight wl = w;
                wl.data = malloc(rb * (size_t)rows);
                wl.layout = PT_LAYOUT_Q4_0X8;
                pt_weight_repack(PT_LAYOUT_Q4_0X8, (void *)wl.data, &w);
                double bf = 1e30, bl = 1e30;
                for (int r = 0; r < reps; r++) {
                    bf = PT_MIN(bf, run(&i8, pool, y, x, &w, n));
                    bl = PT_MIN(bl, run(&i8, pool, y, x, &wl, n));
                }
                printf("%-5s %5lldx%-5lld n=%d t=%d  q4_0x8 layout    %7.1f GOP/s %5.1f GB/s   file layout %7.1f GOP/s %5.1f GB/s   ratio %.2f\n",
                       pt_dtype_name(ts[f]), (long long)rows, (long long)cols, n, threads, ops / bl / 1e9,
                       (double)(rb * (size_t)rows) / bl / 1e9, ops / bf / 1e9,
                       (double)(rb * (size_t)rows) / bf / 1e9, bf / bl);
                free((void *)wl.data);
            }
            pt_qk_ctx_free(&i8), pt_qk_ctx_free(&i16);
            free(data);
        }
        free(src), free(x), free(y);
    }
    if (pool) pt_pool_free(pool);
    return 0;
}
