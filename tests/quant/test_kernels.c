/*
 * test_kernels.c - the CPU backend's quantized matmul kernels (AVX2 and
 * portable) against the scalar reference of src/quant.
 *
 * For every format (MLX affine at every bits x group size, with f16, bf16
 * and f32 scales; GGUF q8_0, q4_0, q4_k, q5_k, q6_k; MXFP4, whose
 * reference is its OCP definition here: src/quant has no MXFP4), odd
 * shapes (1, 7, 13 and 37 rows; several blocks per row) and token counts
 * (1, 2, 3, 5, 9):
 *   - against the reference weights times the activations as the kernels
 *     quantize them (int16, blocks of 32 or of the group), in double: equal
 *     to f32 rounding;
 *   - against the reference weights times the exact activations: within
 *     the activation-rounding bound sum |w_i| * d_x / 2;
 *   - the threaded driver (2 threads) gives what one thread gives;
 *   - row dequantization (embeddings) equals the reference's.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

#include "backend/cpu/quant_kernels.h"
#include "backend/repack.h"
#include "quant/quant.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
/* quant_i8.h's e8m0 scale decoders, compiled here for AVX2 (called only
 * where the CPU has it). */
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#include "backend/cpu/quant_i8.h"
static bool e8m0_matches_ldexpf(void) {
    (void)row_bytes_of; /* the header's, unused here */
    for (int e = 0; e < 256; e++) {
        float want = ldexpf(1.0f, e - 128), v[4];
        _mm_storeu_ps(v, e8m0_half4(_mm_setr_epi32(e, 255 - e, e / 2, 1)));
        if (memcmp(&want, (float[]){e8m0_half((uint8_t)e)}, 4) || memcmp(&want, &v[0], 4)) return false;
        float other = ldexpf(1.0f, 255 - e - 128), half = ldexpf(1.0f, e / 2 - 128);
        if (memcmp(&other, &v[1], 4) || memcmp(&half, &v[2], 4) || v[3] != ldexpf(1.0f, -127)) return false;
    }
    return true;
}
#pragma GCC pop_options
#define HAVE_E8M0_CHECK 1
#endif

typedef struct fmt {
    pt_dtype t;
    int bits, gs;
    pt_dtype st;
} fmt;

/* A rows x cols weight of format f made from random values (owned buffers). */
typedef struct qw {
    pt_weight w;
    void *data, *s, *b;
} qw;

static void make_weight(qw *q, fmt f, int64_t rows, int64_t cols, pt_rng *rng) {
    memset(q, 0, sizeof *q);
    float *row = malloc(sizeof(float) * (size_t)cols);
    q->w = (pt_weight){.dtype = f.t, .rows = rows, .cols = cols, .bits = f.bits, .group_size = f.gs,
                       .scale_dtype = f.st};
    if (f.t == PT_AFFINE) {
        size_t ss = pt_dtype_bytes(f.st, 1), groups = (size_t)(cols / f.gs);
        q->data = malloc(pt_affine_code_bytes(rows, cols, f.bits));
        q->s = malloc((size_t)rows * groups * ss);
        q->b = malloc((size_t)rows * groups * ss);
        for (int64_t r = 0; r < rows; r++) {
            for (int64_t i = 0; i < cols; i++) row[i] = (float)(pt_rng_uniform(rng) - 0.3) * (1 + (float)(r % 3));
            pt_affine_quantize_row(row, cols, f.bits, f.gs, f.st,
                                   (uint32_t *)q->data + r * pt_affine_row_words(cols, f.bits),
                                   (uint8_t *)q->s + (size_t)r * groups * ss,
                                   (uint8_t *)q->b + (size_t)r * groups * ss);
        }
        q->w.scales = q->s;
        q->w.biases = q->b;
    } else if (f.t == PT_MXFP4) { /* no quantizer here: random codes, scales 2^-17..2^6 */
        size_t nb = pt_dtype_bytes(f.t, (uint64_t)(rows * cols));
        q->data = malloc(nb);
        for (size_t i = 0; i < nb; i++) ((uint8_t *)q->data)[i] = (uint8_t)(pt_rng_next(rng) >> 24);
        for (size_t i = 0; i < nb; i += 17) ((uint8_t *)q->data)[i] = (uint8_t)(110 + pt_rng_next(rng) % 24);
        ((uint8_t *)q->data)[0] = 1; /* subnormal half scales: 2^-127 and 2^-128 */
        if (nb > 17) ((uint8_t *)q->data)[17] = 0;
    } else {
        size_t rb = pt_dtype_bytes(f.t, (uint64_t)cols);
        q->data = malloc(rb * (size_t)rows);
        for (int64_t r = 0; r < rows; r++) {
            for (int64_t i = 0; i < cols; i++) row[i] = (float)(pt_rng_uniform(rng) * 2 - 1) * (1 + (float)(r % 3));
            pt_gguf_quantize(f.t, row, (uint8_t *)q->data + rb * (size_t)r, cols);
        }
    }
    q->w.data = q->data;
    free(row);
}

/* Row r of w as f32 by the reference: src/quant, or for MXFP4 (which it
 * lacks) the OCP definition, e2m1 value x 2^(e - 127), in double. */
static void ref_row(const pt_weight *w, int64_t r, float *out) {
    if (w->dtype != PT_MXFP4) {
        pt_weight_dequantize_row(w, r, out);
        return;
    }
    static const double fp4[16] = {0, 0.5, 1, 1.5, 2, 3, 4, 6, 0, -0.5, -1, -1.5, -2, -3, -4, -6};
    const uint8_t *row = (const uint8_t *)w->data + (size_t)r * (size_t)(w->cols / 32) * 17;
    for (int64_t c = 0; c < w->cols; c++) {
        const uint8_t *b = row + (c / 32) * 17;
        int i = (int)(c % 32), code = i < 16 ? b[1 + i] & 15 : b[1 + i - 16] >> 4;
        out[c] = (float)(fp4[code] * ldexp(1.0, b[0] - 127));
    }
}

static void free_weight(qw *q) {
    free(q->data), free(q->s), free(q->b);
}

/* The activations as the kernels round them (blocks of `block`, d = amax/qmax:
 * 32767 for the int16 kernels, 127 for the int8 GEMM). */
static void round_acts(const float *x, float *xr, float *dx, int64_t n, int block, float qmax) {
    for (int64_t b = 0; b < n / block; b++) {
        float amax = 0;
        for (int i = 0; i < block; i++) amax = fmaxf(amax, fabsf(x[block * b + i]));
        float d = amax / qmax, id = d > 0 ? 1 / d : 0;
        for (int i = 0; i < block; i++) {
            xr[block * b + i] = d * (float)lrintf(x[block * b + i] * id);
            dx[block * b + i] = d;
        }
    }
}

static void check_format(fmt f, const char *label) {
    static const int64_t row_counts[] = {1, 7, 13, 37};
    static const int ns[] = {1, 2, 3, 5, 9};
    int block = f.t == PT_AFFINE ? f.gs : pt_dtype_get(f.t)->block;
    int64_t cols = block * (block >= 256 ? 2 : 3);
    pt_rng rng;
    pt_rng_seed(&rng, (uint64_t)(f.t * 100 + f.bits * 10 + f.gs + f.st));
    pt_pool *pool = pt_pool_new(2);
    bool avx2 = pt_qk_cpu_has_avx2();
    for (size_t ri = 0; ri < PT_ARRAY_LEN(row_counts); ri++) {
        int64_t rows = row_counts[ri];
        qw q;
        make_weight(&q, f, rows, cols, &rng);
        float *wref = malloc(sizeof(float) * (size_t)(rows * cols)), *wk = malloc(sizeof(float) * (size_t)cols);
        for (int64_t r = 0; r < rows; r++) {
            ref_row(&q.w, r, wref + r * cols);
            pt_qk_dequant_row(&q.w, r, wk);
            for (int64_t i = 0; i < cols; i++) {
                float a = wref[r * cols + i], b = wk[i];
                if (!(fabsf(a - b) <= 1e-6f * fabsf(a))) /* q6_k folds its scales in another order */
                    fail_msg("%s: dequant row %lld col %lld: kernel %.9g, reference %.9g", label,
                             (long long)r, (long long)i, b, a);
            }
        }
        for (size_t ni = 0; ni < PT_ARRAY_LEN(ns); ni++) {
            int n = ns[ni];
            float *x = malloc(sizeof(float) * (size_t)(n * cols)), *xr = malloc(sizeof(float) * (size_t)(n * cols));
            float *dx = malloc(sizeof(float) * (size_t)(n * cols));
            float *y[3];
            for (int k = 0; k < 3; k++) y[k] = malloc(sizeof(float) * (size_t)(n * rows));
            for (int64_t i = 0; i < n * cols; i++) x[i] = (float)(pt_rng_uniform(&rng) * 2 - 1);
            for (int t = 0; t < n; t++)
                round_acts(x + t * cols, xr + t * cols, dx + t * cols, cols, pt_qk_act_block(&q.w), 32767);

            pt_qk_ctx portable = {.avx2 = false}, fast = {.avx2 = true};
            pt_qk_matmul(&portable, NULL, y[0], x, &q.w, n);
            pt_qk_matmul(&portable, pool, y[1], x, &q.w, n);
            if (avx2) pt_qk_matmul(&fast, pool, y[2], x, &q.w, n);
            for (int t = 0; t < n; t++)
                for (int64_t r = 0; r < rows; r++) {
                    double same = 0, exact = 0, mag = 0, bound = 0;
                    for (int64_t i = 0; i < cols; i++) {
                        double wv = wref[r * cols + i];
                        same += wv * xr[t * cols + i];
                        exact += wv * x[t * cols + i];
                        mag += fabs(wv * xr[t * cols + i]);
                        bound += fabs(wv) * dx[t * cols + i] * 0.5;
                    }
                    double tol = 1e-5 * mag + 1e-6;
                    for (int k = 0; k < (avx2 ? 3 : 2); k++) {
                        double got = y[k][(size_t)t * (size_t)rows + (size_t)r];
                        if (!(fabs(got - same) <= tol))
                            fail_msg("%s %s, %lldx%lld, n=%d, token %d row %lld: %.7g, want %.7g (tol %.2g)",
                                     label, k == 2 ? "avx2" : k ? "portable/2 threads" : "portable",
                                     (long long)rows, (long long)cols, n, t, (long long)r, got, same, tol);
                        if (!(fabs(got - exact) <= bound + tol))
                            fail_msg("%s: error %.3g vs exact beyond the activation bound %.3g", label,
                                     fabs(got - exact), bound);
                    }
                    assert_true(y[0][(size_t)t * (size_t)rows + (size_t)r] == y[1][(size_t)t * (size_t)rows + (size_t)r]);
                }
            pt_qk_ctx_free(&portable);
            pt_qk_ctx_free(&fast);
            free(x), free(xr), free(dx);
            for (int k = 0; k < 3; k++) free(y[k]);
        }
        free(wref), free(wk);
        free_weight(&q);
    }
    pt_pool_free(pool);
}

static void test_affine_all(void **state) {
    (void)state;
    static const int bits[] = {2, 3, 4, 5, 6, 8}, gss[] = {32, 64, 128};
    static const pt_dtype sts[] = {PT_F16, PT_BF16, PT_F32};
    for (int b = 0; b < 6; b++)
        for (int g = 0; g < 3; g++)
            for (int s = 0; s < 3; s++) {
                char label[64];
                snprintf(label, sizeof label, "affine %d-bit g%d %s", bits[b], gss[g], pt_dtype_name(sts[s]));
                check_format((fmt){PT_AFFINE, bits[b], gss[g], sts[s]}, label);
            }
}

static void test_gguf_all(void **state) {
    (void)state;
    static const pt_dtype ts[] = {PT_Q8_0, PT_Q4_0, PT_Q4_K, PT_Q5_K, PT_Q6_K, PT_MXFP4};
    for (size_t i = 0; i < PT_ARRAY_LEN(ts); i++) check_format((fmt){ts[i], 0, 0, PT_F16}, pt_dtype_name(ts[i]));
}

/* The int8-activation GEMM (q8_0, q4_0, q4_k, q5_k, q6_k, affine 4-bit prefill), AVX2 and
 * (where the CPU has it) AVX-512 VNNI, whose every output must equal AVX2's bit for bit,
 * against the reference
 * weights times the activations rounded as it rounds them (to f32 rounding,
 * 1e-5 of sum |w x|), and against the exact activations within the int8
 * rounding bound sum |w_i| * d_x / 2, d_x = max|x| / 127.  Shapes cover
 * every tile remainder (rows 1..5 and 37, tokens 8..11, 13 and 33), more rows
 * than one cache block (1000), and extreme codes (q8_0 -128, a zero block). */
/* Repacks q (q4_0, rows % 8 == 0) into PT_LAYOUT_Q4_0X8, checking on the
 * way that every file block comes back out of the layout unchanged, and
 * that row dequantization (embeddings: the kernels' and the reference's)
 * and the portable int16 kernel give the file layout's results bit for bit
 * (same codes, same order of sums): a repacked weight is the same weight
 * on every path.  Returns the repacked buffer, now q->w.data. */
static void *repack_q4_0x8(qw *q, pt_pool *pool) {
    const pt_weight file = q->w;
    int64_t rows = file.rows, cols = file.cols;
    size_t rb = pt_dtype_bytes(PT_Q4_0, (uint64_t)cols);
    assert_true(pt_layout_fits(PT_LAYOUT_Q4_0X8, PT_Q4_0, rows, cols));
    assert_false(pt_layout_fits(PT_LAYOUT_Q4_0X8, PT_Q4_0, rows + 4, cols));
    assert_false(pt_layout_fits(PT_LAYOUT_Q4_0X8, PT_Q8_0, rows, cols));
    void *data = malloc(rb * (size_t)rows);
    pt_weight_repack(PT_LAYOUT_Q4_0X8, data, &file);
    pt_weight w = file;
    w.data = data;
    w.layout = PT_LAYOUT_Q4_0X8;
    uint8_t blk[18];
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols / 32; c++) {
            pt_q4_0x8_block(blk, data, cols, r, c);
            assert_memory_equal(blk, (const uint8_t *)file.data + (size_t)r * rb + 18 * (size_t)c, 18);
        }
    float *a = malloc(sizeof(float) * (size_t)cols), *b = malloc(sizeof(float) * (size_t)cols);
    for (int64_t r = 0; r < rows; r += 7) {
        pt_qk_dequant_row(&file, r, a);
        pt_qk_dequant_row(&w, r, b);
        assert_memory_equal(a, b, sizeof(float) * (size_t)cols);
        pt_weight_dequantize_row(&file, r, a); /* the reference: -0 where the kernels give 0 */
        pt_weight_dequantize_row(&w, r, b);
        assert_memory_equal(a, b, sizeof(float) * (size_t)cols);
    }
    free(a), free(b);
    int n = 3;
    float *x = malloc(sizeof(float) * (size_t)(n * cols)), *y0 = malloc(sizeof(float) * (size_t)(n * rows));
    float *y1 = malloc(sizeof(float) * (size_t)(n * rows));
    for (int64_t i = 0; i < n * cols; i++) x[i] = (float)sin((double)i);
    pt_qk_ctx ctx = {.avx2 = false}; /* the portable kernels, as without AVX2 */
    assert_string_equal(pt_qk_path(&ctx, &w, n), "portable int16");
    pt_qk_matmul(&ctx, pool, y0, x, &file, n);
    pt_qk_matmul(&ctx, pool, y1, x, &w, n);
    assert_memory_equal(y0, y1, sizeof(float) * (size_t)(n * rows));
    pt_qk_ctx_free(&ctx);
    free(x), free(y0), free(y1);
    q->w = w;
    return data;
}

static void check_i8(fmt f, bool decode, bool repack) {
    pt_dtype t = f.t;
    int block = f.t == PT_AFFINE ? f.gs : pt_dtype_get(f.t)->block;
    static const int64_t row_counts[] = {1, 2, 3, 5, 37, 1000};
    static const int gemm_ns[] = {PT_QK_I8_MIN_TOKENS, 9, 10, 11, 13, 33}; /* every tile remainder */
    static const int decode_ns[] = {1, 2, 3, 5, PT_QK_I8_MIN_TOKENS - 1};
    const int *ns = decode ? decode_ns : gemm_ns;
    size_t n_ns = decode ? PT_ARRAY_LEN(decode_ns) : PT_ARRAY_LEN(gemm_ns);
    pt_rng rng;
    pt_rng_seed(&rng, 77 + (uint64_t)t * 10 + (uint64_t)f.gs + (uint64_t)f.st);
    pt_pool *pool = pt_pool_new(2);
    bool avx512 = pt_qk_cpu_has_avx512();
    for (size_t ri = 0; ri < PT_ARRAY_LEN(row_counts); ri++)
        for (int64_t cols = 32; cols <= 4096; cols *= 8) {
            int64_t rows = row_counts[ri] * (repack ? 8 : 1); /* the layout takes groups of 8 */
            if (cols % block) continue;
            qw q;
            make_weight(&q, f, rows, cols, &rng);
            if (t == PT_Q8_0) ((int8_t *)q.data)[2] = -128; /* row 0, element 0: |w| = 128 */
            float *wref = malloc(sizeof(float) * (size_t)(rows * cols));
            for (int64_t r = 0; r < rows; r++) ref_row(&q.w, r, wref + r * cols);
            void *repacked = repack ? repack_q4_0x8(&q, pool) : NULL;
            for (size_t ni = 0; ni < n_ns; ni++) {
                int n = ns[ni];
                size_t nx = (size_t)(n * cols);
                float *x = malloc(sizeof(float) * nx), *xr = malloc(sizeof(float) * nx);
                float *dx = malloc(sizeof(float) * nx), *y = malloc(sizeof(float) * (size_t)(n * rows));
                float *y1 = malloc(sizeof(float) * (size_t)(n * rows));
                for (size_t i = 0; i < nx; i++) x[i] = (float)(pt_rng_uniform(&rng) * 2 - 1);
                for (int i = 0; i < 32; i++) x[i] = 0; /* a zero block: d = 0 */
                for (int k = 0; k < n; k++) round_acts(x + k * cols, xr + k * cols, dx + k * cols, cols, 32, 127);
                pt_qk_ctx ctx = {.avx2 = true, .i8 = true, .i8_decode = decode};
                assert_string_equal(pt_qk_path(&ctx, &q.w, n), decode ? "avx2 int8 rows" : "avx2 int8 gemm");
                pt_qk_matmul(&ctx, pool, y, x, &q.w, n);
                pt_qk_matmul(&ctx, NULL, y1, x, &q.w, n);
                if (avx512) { /* the same integer sums scaled the same way: equal bit for bit */
                    pt_qk_ctx c5 = {.avx2 = true, .avx512 = true, .i8 = true, .i8_decode = decode};
                    float *y5 = malloc(sizeof(float) * (size_t)(n * rows));
                    assert_string_equal(pt_qk_path(&c5, &q.w, n), decode ? "avx512 int8 rows" : "avx512 int8 gemm");
                    pt_qk_matmul(&c5, pool, y5, x, &q.w, n);
                    for (int64_t i = 0; i < (int64_t)n * rows; i++)
                        if (memcmp(&y5[i], &y[i], sizeof(float)))
                            fail_msg("%s/%d avx512 int8 %s %lldx%lld n=%d, output %lld: %.9g, avx2 %.9g",
                                     pt_dtype_name(t), f.gs, decode ? "rows" : "gemm", (long long)rows,
                                     (long long)cols, n, (long long)i, y5[i], y[i]);
                    pt_qk_ctx_free(&c5);
                    free(y5);
                }
                for (int k = 0; k < n; k++)
                    for (int64_t r = 0; r < rows; r++) {
                        double same = 0, exact = 0, mag = 0, bound = 0;
                        for (int64_t i = 0; i < cols; i++) {
                            double wv = wref[r * cols + i];
                            same += wv * xr[k * cols + i];
                            exact += wv * x[k * cols + i];
                            mag += fabs(wv * xr[k * cols + i]);
                            bound += fabs(wv) * dx[k * cols + i] * 0.5;
                        }
                        double tol = 1e-5 * mag + 1e-6, got = y[(size_t)k * (size_t)rows + (size_t)r];
                        if (!(fabs(got - same) <= tol))
                            fail_msg("%s/%d int8 gemm %lldx%lld n=%d token %d row %lld: %.7g, want %.7g (tol %.2g)",
                                     pt_dtype_name(t), f.gs, (long long)rows, (long long)cols, n, k,
                                     (long long)r, got, same, tol);
                        if (!(fabs(got - exact) <= bound + tol))
                            fail_msg("%s int8 gemm: error %.3g vs exact beyond the bound %.3g",
                                     pt_dtype_name(t), fabs(got - exact), bound);
                        assert_true(got == y1[(size_t)k * (size_t)rows + (size_t)r]); /* threads agree */
                    }
                pt_qk_ctx_free(&ctx);
                free(x), free(xr), free(dx), free(y), free(y1);
            }
            free(wref);
            free(repacked);
            free_weight(&q);
        }
    pt_pool_free(pool);
}

static void test_i8_gemm(void **state) {
    (void)state;
    if (!pt_qk_cpu_has_avx2()) {
        print_message("note: no AVX2 on this CPU; int8 GEMM not tested\n");
        return;
    }
    static const pt_dtype ts[] = {PT_Q8_0, PT_Q4_0, PT_Q4_K, PT_Q5_K, PT_Q6_K, PT_MXFP4};
    for (size_t i = 0; i < PT_ARRAY_LEN(ts); i++) check_i8((fmt){ts[i], 0, 0, PT_F16}, false, false);
    static const int gss[] = {32, 64, 128};
    static const pt_dtype sts[] = {PT_F16, PT_BF16, PT_F32};
    for (int g = 0; g < 3; g++) check_i8((fmt){PT_AFFINE, 4, gss[g], sts[g]}, false, false);
    /* below the token threshold, and for other formats, the int16 kernels run */
    pt_qk_ctx ctx = {.avx2 = true, .i8 = true};
    pt_weight w = {.dtype = PT_Q8_0, .rows = 1, .cols = 32};
    assert_string_equal(pt_qk_path(&ctx, &w, PT_QK_I8_MIN_TOKENS - 1), "avx2 int16");
    w = (pt_weight){.dtype = PT_AFFINE, .rows = 1, .cols = 64, .bits = 8, .group_size = 64};
    assert_string_equal(pt_qk_path(&ctx, &w, 64), "avx2 int16");
}

/* The int8 decode rows (q8_0, q4_0, MXFP4, below PT_QK_I8_MIN_TOKENS
 * tokens) by the same two bounds as the GEMM; every other format stays on
 * int16 there. */
static void test_i8_decode(void **state) {
    (void)state;
    if (!pt_qk_cpu_has_avx2()) {
        print_message("note: no AVX2 on this CPU; int8 decode not tested\n");
        return;
    }
    check_i8((fmt){PT_Q8_0, 0, 0, PT_F16}, true, false);
    check_i8((fmt){PT_Q4_0, 0, 0, PT_F16}, true, false);
    check_i8((fmt){PT_MXFP4, 0, 0, PT_F16}, true, false);
    pt_qk_ctx ctx = {.avx2 = true, .i8 = true, .i8_decode = true};
    pt_weight w = {.dtype = PT_Q4_K, .rows = 1, .cols = 256};
    assert_string_equal(pt_qk_path(&ctx, &w, 1), "avx2 int16");
    ctx.i8_decode = false;
    w.dtype = PT_Q4_0;
    assert_string_equal(pt_qk_path(&ctx, &w, 1), "avx2 int16");
}

/* q4_0 repacked 8 rows at a time (PT_LAYOUT_Q4_0X8, what the CPU backend
 * does at load on AVX2): decode (int8 rows) and prefill (int8 GEMM) on the
 * layout against the same double references and bounds as the file
 * layout, 8 to 8000 rows; every file block round-trips through the layout;
 * dequantized rows and the portable kernel (forced) equal the file
 * layout's bit for bit (repack_q4_0x8). */
static void test_q4_0x8_layout(void **state) {
    (void)state;
    if (!pt_qk_cpu_has_avx2()) {
        print_message("note: no AVX2 on this CPU; the q4_0x8 kernels not tested\n");
        return;
    }
    check_i8((fmt){PT_Q4_0, 0, 0, PT_F16}, true, true);
    check_i8((fmt){PT_Q4_0, 0, 0, PT_F16}, false, true);
}

/* The CPU backend asks for the q4_0 layout exactly where its int8 kernels
 * read it: q4_0, rows a multiple of 8, no expert stack, AVX2 with int8
 * decode, and not under PETREL_CPU_REPACK=0; the portable set never. */
static void test_layout_choice(void **state) {
    (void)state;
    pt_err err;
    pt_backend *port = pt_backend_cpu_new(1, "portable", &err);
    assert_non_null(port);
    pt_weight w = {.dtype = PT_Q4_0, .rows = 16, .cols = 64};
    assert_int_equal(port->ops->weight_layout(port, &w), PT_LAYOUT_FILE);
    port->ops->destroy(port);
    if (!pt_qk_cpu_has_avx2()) return;
    pt_backend *be = pt_backend_cpu_new(1, "avx2", &err);
    assert_non_null(be);
    assert_int_equal(be->ops->weight_layout(be, &w), PT_LAYOUT_Q4_0X8);
    w.rows = 12;
    assert_int_equal(be->ops->weight_layout(be, &w), PT_LAYOUT_FILE);
    w.rows = 16, w.dtype = PT_Q8_0;
    assert_int_equal(be->ops->weight_layout(be, &w), PT_LAYOUT_FILE);
    w.dtype = PT_Q4_0, w.n_experts = 2;
    assert_int_equal(be->ops->weight_layout(be, &w), PT_LAYOUT_FILE);
    w.n_experts = 0;
    setenv("PETREL_CPU_REPACK", "0", 1);
    assert_int_equal(be->ops->weight_layout(be, &w), PT_LAYOUT_FILE);
    unsetenv("PETREL_CPU_REPACK");
    be->ops->destroy(be);
    if (!pt_qk_cpu_has_avx512()) return;
    be = pt_backend_cpu_new(1, "avx512", &err); /* its int8 kernels read the layout too */
    assert_non_null(be);
    assert_int_equal(be->ops->weight_layout(be, &w), PT_LAYOUT_Q4_0X8);
    be->ops->destroy(be);
}

/* The AVX2 activation quantizer gives the portable one's codes, scales and
 * sums bit for bit: random rows, a zero block, halfway cases (x / d =
 * k + 0.5 rounds to even) and negative zero. */
static void test_i8_quantize_same(void **state) {
    (void)state;
    if (!pt_qk_cpu_has_avx2()) return;
    enum { N = 3, COLS = 256 };
    float x[N * COLS];
    pt_rng rng;
    pt_rng_seed(&rng, 5);
    for (int i = 0; i < N * COLS; i++) x[i] = (float)(pt_rng_uniform(&rng) * 2 - 1) * (1 + i / 64);
    for (int i = 32; i < 64; i++) x[i] = 0;
    x[64] = 127; /* block 2: d = 1, so x / d is x itself */
    for (int i = 65; i < 96; i++) x[i] = (float)(i - 80) + 0.5f;
    x[95] = -0.0f;
    static _Alignas(32) uint8_t s1[4096], s2[4096];
    pt_qact8 a, b;
    assert_true(pt_qk_act8_bytes(N, COLS) <= sizeof s1);
    pt_qk_act8_init(&a, s1, N, COLS);
    pt_qk_act8_init(&b, s2, N, COLS);
    pt_qk_quantize_act8(&a, x, 0, N);
    pt_qk_avx2_quantize_act8(&b, x, 0, N);
    assert_memory_equal(a.q, b.q, N * COLS);
    assert_memory_equal(a.d, b.d, sizeof(float) * N * COLS / 32);
    assert_memory_equal(a.ds, b.ds, sizeof(float) * N * COLS / 32);
    assert_memory_equal(a.sq, b.sq, sizeof(int32_t) * 2 * N * COLS / 32);
    for (int c = 0; c < N * COLS / 32; c++) { /* the half sums, and ds from their total */
        int lo = 0, hi = 0;
        for (int i = 0; i < 16; i++) lo += a.q[32 * c + i], hi += a.q[32 * c + 16 + i];
        assert_int_equal(a.sq[2 * c], lo);
        assert_int_equal(a.sq[2 * c + 1], hi);
        assert_true(a.ds[c] == a.d[c] * (float)(lo + hi));
    }
    assert_int_equal(a.q[65], -14); /* -14.5 -> -14 */
    assert_int_equal(a.q[66], -14); /* -13.5 -> -14 */
}

/* The int8 kernels' MXFP4 block scale, 2^(e - 128) built from exponent
 * bits (scalar and 4 lanes), equals ldexpf's for every byte, the
 * subnormals 2^-128 and 2^-127 included: their contribution to a
 * product is below any tolerance the matmul tests could apply. */
static void test_e8m0_scale(void **state) {
    (void)state;
#ifdef HAVE_E8M0_CHECK
    if (pt_qk_cpu_has_avx2()) assert_true(e8m0_matches_ldexpf());
#endif
}

static void test_handles(void **state) {
    (void)state;
    print_message("this CPU: avx2 %s, avx512 (F/BW/VL/DQ/VNNI) %s\n", pt_qk_cpu_has_avx2() ? "yes" : "no",
                  pt_qk_cpu_has_avx512() ? "yes" : "no");
    if (pt_qk_cpu_has_avx512()) assert_true(pt_qk_cpu_has_avx2());
    assert_true(pt_qk_handles(PT_AFFINE) && pt_qk_handles(PT_Q4_K) && pt_qk_handles(PT_Q8_0));
    assert_false(pt_qk_handles(PT_F32) || pt_qk_handles(PT_BF16));
    if (!pt_qk_cpu_has_avx2()) print_message("note: no AVX2 on this CPU; only portable kernels tested\n");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_handles),
        cmocka_unit_test(test_affine_all),
        cmocka_unit_test(test_gguf_all),
        cmocka_unit_test(test_i8_gemm),
        cmocka_unit_test(test_i8_decode),
        cmocka_unit_test(test_q4_0x8_layout),
        cmocka_unit_test(test_layout_choice),
        cmocka_unit_test(test_i8_quantize_same),
        cmocka_unit_test(test_e8m0_scale),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
