/*
 * test_cpu_ops.c - every op of the CPU backend against a naive double
 * precision reference written here, on both kernel sets (portable, and avx2
 * where the CPU has it) and 1, 2 and 3 threads (3 catches partitions that
 * only work for even splits).
 *
 * Inputs are random and never zero, from a fresh seed each run (printed;
 * PETREL_TEST_SEED=<n> replays one).  Every output buffer is filled with NaN
 * before a call and followed by guard elements: afterwards every element
 * must have been written and no guard touched.  Shapes are deliberately odd:
 * columns that are not multiples of 8 or 16, rows that are not multiples of
 * a tile, n = 1, 2, 3, 7, 33 and a prefill larger than one token block.
 *
 * Tolerances follow the arithmetic: f32 sums are checked against
 * 1e-5 * sum |terms| (the weights' own rounding is exact, since the
 * reference reads the same f16/bf16 bits), element-wise ops against a few
 * f32 ulps, exp-based ones against the 1e-6 the kernels promise.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <cmocka.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/quant_kernels.h"

#define N_GUARD 16

/* ---- fixtures: the backends under test, one RNG ---------------------------------- */

static pt_backend *backends[12]; /* 3 sets x 1..3 threads */
static int n_backends;
static pt_rng rng;
/* The largest error seen as a fraction of its bound, per check: printed so
 * a tolerance that is too loose (or nearly hit) is visible. */
static double worst_matmul, worst_attention;

/* The backend's own check, seen from outside: an explicit set is refused
 * exactly when the CPU lacks it. */
static bool have_set(const char *name) {
    pt_err err;
    pt_backend *be = pt_backend_cpu_new(1, name, &err);
    if (be) be->ops->destroy(be);
    return be != NULL;
}
static bool have_avx2(void) {
    return have_set("avx2");
}
static bool have_avx512(void) {
    return have_set("avx512");
}

static int setup(void **state) {
    (void)state;
    const char *s = getenv("PETREL_TEST_SEED");
    uint64_t seed = s ? strtoull(s, NULL, 10) : (uint64_t)time(NULL) ^ ((uint64_t)clock() << 20);
    print_message("seed %llu (PETREL_TEST_SEED=%llu replays it)\n", (unsigned long long)seed,
                  (unsigned long long)seed);
    pt_rng_seed(&rng, seed);
    const char *sets[] = {"portable", "avx2", "avx512"};
    for (int k = 0; k < 3; k++) {
        if (!have_set(sets[k])) {
            print_message("note: no %s on this CPU; its kernels are not tested\n", sets[k]);
            continue;
        }
        for (int nth = 1; nth <= 3; nth++) {
            pt_err err = {{0}};
            pt_backend *be = pt_backend_cpu_new(nth, sets[k], &err);
            if (!be) fail_msg("%s", err.msg);
            backends[n_backends++] = be;
        }
    }
    return 0;
}

static int teardown(void **state) {
    (void)state;
    for (int i = 0; i < n_backends; i++) backends[i]->ops->destroy(backends[i]);
    return 0;
}

/* Uniform in +-[0.05, 1): random sign, never zero. */
static float rnd(void) {
    float m = (float)(0.05 + 0.95 * pt_rng_uniform(&rng));
    return pt_rng_next(&rng) & 1 ? m : -m;
}

static int rnd_int(int n) {
    return (int)(pt_rng_next(&rng) % (uint64_t)n);
}

static float *rnd_floats(size_t n, float scale) {
    float *p = malloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) p[i] = rnd() * scale;
    return p;
}

/* An output buffer of n floats plus guards, all NaN. */
static float *poisoned(size_t n) {
    float *p = malloc((n + N_GUARD) * sizeof(float));
    for (size_t i = 0; i < n + N_GUARD; i++) p[i] = NAN;
    return p;
}

/* Every element written (not NaN), no guard touched. */
static void check_written(const float *p, size_t n, const char *what, const pt_backend *be) {
    for (size_t i = 0; i < n; i++)
        if (isnan(p[i])) fail_msg("%s [%s]: element %zu of %zu not written", what, be->detail, i, n);
    for (size_t i = n; i < n + N_GUARD; i++)
        if (!isnan(p[i])) fail_msg("%s [%s]: wrote past the end (guard %zu)", what, be->detail, i - n);
}

/* ---- element types ----------------------------------------------------------------- */

static const pt_dtype float_types[] = {PT_F32, PT_F16, PT_BF16};

/* Stores v as dtype dt at index i (rounding as base.h does). */
static void store_elt(pt_dtype dt, void *p, size_t i, float v) {
    if (dt == PT_F32) ((float *)p)[i] = v;
    else if (dt == PT_F16) ((uint16_t *)p)[i] = pt_f32_to_f16(v);
    else ((uint16_t *)p)[i] = pt_f32_to_bf16(v);
}

/* The exact value stored at index i. */
static double load_elt(pt_dtype dt, const void *p, size_t i) {
    if (dt == PT_F32) return ((const float *)p)[i];
    if (dt == PT_F16) return pt_f16_to_f32(((const uint16_t *)p)[i]);
    return pt_bf16_to_f32(((const uint16_t *)p)[i]);
}

static size_t elt_size(pt_dtype dt) {
    return dt == PT_F32 ? 4 : 2;
}

/* A rows x cols weight of random values, in backend memory. */
static pt_weight make_weight(pt_backend *be, pt_dtype dt, int64_t rows, int64_t cols) {
    size_t nbytes = (size_t)(rows * cols) * elt_size(dt);
    void *host = malloc(nbytes ? nbytes : 1);
    for (int64_t i = 0; i < rows * cols; i++) store_elt(dt, host, (size_t)i, rnd());
    void *dev = be->ops->alloc(be, nbytes);
    be->ops->upload(be, dev, host, nbytes);
    free(host);
    return (pt_weight){.dtype = dt, .rows = rows, .cols = cols, .data = dev, .nbytes = nbytes};
}

static void free_weight(pt_backend *be, pt_weight *w) {
    be->ops->free(be, (void *)w->data, w->nbytes);
}

/* ---- matmul ------------------------------------------------------------------------- */

static void check_matmul(pt_backend *be, pt_dtype dt, int64_t rows, int64_t cols, int n) {
    pt_weight w = make_weight(be, dt, rows, cols);
    float *x = rnd_floats((size_t)(n * cols), 1.0f), *y = poisoned((size_t)(n * rows));
    pt_be_matmul(be, y, x, &w, n);
    char what[96];
    snprintf(what, sizeof what, "matmul %s %lldx%lld n=%d", pt_dtype_name(dt), (long long)rows,
             (long long)cols, n);
    check_written(y, (size_t)(n * rows), what, be);
    for (int t = 0; t < n; t++)
        for (int64_t r = 0; r < rows; r++) {
            double ref = 0, mag = 0;
            for (int64_t k = 0; k < cols; k++) {
                double term = (double)x[t * cols + k] * load_elt(dt, w.data, (size_t)(r * cols + k));
                ref += term;
                mag += fabs(term);
            }
            double got = y[t * rows + r];
            worst_matmul = fmax(worst_matmul, fabs(got - ref) / (1e-5 * mag));
            if (!(fabs(got - ref) <= 1e-5 * mag))
                fail_msg("%s [%s]: y[%d][%lld] = %.8g, reference %.8g (|terms| %.3g)", what, be->detail,
                         t, (long long)r, got, ref, mag);
        }
    free(x);
    free(y);
    free_weight(be, &w);
}

static void test_matmul(void **state) {
    (void)state;
    /* (rows, cols): single elements, sub-vector columns, tile remainders,
     * and more columns than one packed block (256). */
    static const int64_t shapes[][2] = {{1, 1},   {5, 7},   {16, 8},   {17, 15}, {37, 33},
                                        {100, 64}, {33, 300}, {70, 515}, {19, 1030}};
    static const int ns[] = {1, 2, 3, 4, 5, 7, 9, 11, 17, 21, 33};
    for (int b = 0; b < n_backends; b++)
        for (size_t d = 0; d < PT_ARRAY_LEN(float_types); d++)
            for (size_t s = 0; s < PT_ARRAY_LEN(shapes); s++)
                for (size_t i = 0; i < PT_ARRAY_LEN(ns); i++)
                    check_matmul(backends[b], float_types[d], shapes[s][0], shapes[s][1], ns[i]);
    print_message("matmul: worst error %.2f of the bound\n", worst_matmul);
}

/* Prefill larger than one token block (192), several row panels per thread,
 * and a small projection at large n (the tokens are split then).  The
 * larger shapes cross the GEMM's row chunks (128 rows) with a ragged last
 * chunk and panel, ragged column blocks (256) and a last token block that is
 * not a whole number of tiles: 203 = 192 + 11, 389 = 2 * 192 + 5. */
static void test_matmul_prefill(void **state) {
    (void)state;
    for (int b = 0; b < n_backends; b++)
        for (size_t d = 0; d < PT_ARRAY_LEN(float_types); d++) {
            check_matmul(backends[b], float_types[d], 67, 260, 200);
            check_matmul(backends[b], float_types[d], 8, 40, 77);
            check_matmul(backends[b], float_types[d], 300, 520, 203);
            check_matmul(backends[b], float_types[d], 261, 47, 389);
        }
}

/* The packed GEMM runs the same FMAs per output in the same order in the
 * avx2 set (6 x 16 tiles) and the avx512 set (6 x 32 tiles, 32-row
 * panels): prefill results are equal bit for bit, ragged panels, column
 * blocks and token tiles included. */
static void test_matmul_prefill_sets_agree(void **state) {
    (void)state;
    if (!have_avx512()) {
        print_message("note: no AVX-512 on this CPU; nothing to compare\n");
        return;
    }
    pt_err err;
    pt_backend *a2 = pt_backend_cpu_new(2, "avx2", &err), *a5 = pt_backend_cpu_new(2, "avx512", &err);
    assert_non_null(a2);
    assert_non_null(a5);
    static const int64_t shapes[][3] = {{67, 260, 200}, {261, 47, 389}, {300, 520, 203}, {8, 40, 77}, {33, 515, 64}};
    for (size_t d = 0; d < PT_ARRAY_LEN(float_types); d++)
        for (size_t s = 0; s < PT_ARRAY_LEN(shapes); s++) {
            int64_t rows = shapes[s][0], cols = shapes[s][1];
            int n = (int)shapes[s][2];
            pt_weight w = make_weight(a2, float_types[d], rows, cols);
            float *x = rnd_floats((size_t)(n * cols), 1.0f), *y2 = poisoned((size_t)(n * rows));
            float *y5 = poisoned((size_t)(n * rows));
            pt_be_matmul(a2, y2, x, &w, n);
            pt_be_matmul(a5, y5, x, &w, n);
            check_written(y5, (size_t)(n * rows), "matmul avx512", a5);
            for (int64_t i = 0; i < n * rows; i++)
                if (memcmp(&y2[i], &y5[i], sizeof(float)))
                    fail_msg("matmul %s %lldx%lld n=%d: output %lld avx512 %.9g, avx2 %.9g", pt_dtype_name(float_types[d]),
                             (long long)rows, (long long)cols, n, (long long)i, y5[i], y2[i]);
            free(x), free(y2), free(y5);
            free_weight(a2, &w);
        }
    a2->ops->destroy(a2);
    a5->ops->destroy(a5);
}

/* Quantized weights are not computed here but handed to quant_kernels.h
 * (tested in tests/quant): the backend's matmul and embed must give exactly
 * what that driver gives with the same kernel flavour. */
static void test_quantized_handoff(void **state) {
    (void)state;
    const int64_t rows = 13, cols = 96; /* 3 q8_0 blocks of 32 per row */
    const size_t block = 34, rb = (size_t)cols / 32 * block;
    uint8_t *wq = malloc(rb * (size_t)rows);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols / 32; c++) {
            uint8_t *blk = wq + (size_t)r * rb + (size_t)c * block;
            uint16_t d = pt_f32_to_f16(0.01f + 0.02f * (float)pt_rng_uniform(&rng));
            memcpy(blk, &d, 2);
            for (int i = 0; i < 32; i++) blk[2 + i] = (uint8_t)(int8_t)(rnd_int(255) - 127);
        }
    pt_weight w = {.dtype = PT_Q8_0, .rows = rows, .cols = cols, .data = wq, .nbytes = rb * (size_t)rows};
    for (int b = 0; b < n_backends; b++) {
        pt_backend *be = backends[b];
        bool avx512 = strstr(be->detail, "avx512") != NULL;
        pt_qk_ctx ctx = {.avx2 = avx512 || strstr(be->detail, "avx2") != NULL,
                         .avx512 = avx512,
                         .i8 = strstr(be->detail, "int8") != NULL,
                         .i8_decode = strstr(be->detail, "int8 quantized matmuls") != NULL};
        for (int n = 1; n <= 9; n += 4) {
            float *x = rnd_floats((size_t)(n * cols), 1.0f), *y = poisoned((size_t)(n * rows));
            float *want = malloc(sizeof(float) * (size_t)(n * rows));
            pt_be_matmul(be, y, x, &w, n);
            check_written(y, (size_t)(n * rows), "matmul q8_0", be);
            pt_qk_matmul(&ctx, NULL, want, x, &w, n);
            assert_memory_equal(y, want, sizeof(float) * (size_t)(n * rows));
            free(x), free(y), free(want);
        }
        int32_t ids[3] = {4, 0, 12};
        float *e = poisoned((size_t)(3 * cols)), *row = malloc(sizeof(float) * (size_t)cols);
        pt_be_embed(be, e, &w, ids, 3);
        check_written(e, (size_t)(3 * cols), "embed q8_0", be);
        for (int i = 0; i < 3; i++) {
            pt_qk_dequant_row(&w, ids[i], row);
            assert_memory_equal(e + i * cols, row, sizeof(float) * (size_t)cols);
        }
        free(e), free(row);
        pt_qk_ctx_free(&ctx);
    }
    free(wq);
}

/* ---- embed, gather_rows --------------------------------------------------------------- */

static void test_embed(void **state) {
    (void)state;
    static const int64_t cols_list[] = {1, 7, 64, 301};
    static const int ns[] = {1, 3, 33};
    for (int b = 0; b < n_backends; b++)
        for (size_t d = 0; d < PT_ARRAY_LEN(float_types); d++)
            for (size_t c = 0; c < PT_ARRAY_LEN(cols_list); c++)
                for (size_t i = 0; i < PT_ARRAY_LEN(ns); i++) {
                    pt_backend *be = backends[b];
                    int64_t rows = 50, cols = cols_list[c];
                    int n = ns[i];
                    pt_weight w = make_weight(be, float_types[d], rows, cols);
                    int32_t *ids = malloc(sizeof(int32_t) * (size_t)n);
                    for (int k = 0; k < n; k++) ids[k] = k == 1 ? ids[0] : rnd_int((int)rows); /* a repeat */
                    float *y = poisoned((size_t)(n * cols));
                    pt_be_embed(be, y, &w, ids, n);
                    check_written(y, (size_t)(n * cols), "embed", be);
                    for (int k = 0; k < n; k++)
                        for (int64_t j = 0; j < cols; j++)
                            assert_true(y[k * cols + j] ==
                                        (float)load_elt(w.dtype, w.data, (size_t)(ids[k] * cols + j)));
                    free(ids);
                    free(y);
                    free_weight(be, &w);
                }
}

static void test_gather_rows(void **state) {
    (void)state;
    for (int b = 0; b < n_backends; b++) {
        pt_backend *be = backends[b];
        int src_rows = 40, d = 37, n = 9;
        float *src = rnd_floats((size_t)(src_rows * d), 1.0f), *dst = poisoned((size_t)(n * d));
        int32_t idx[9];
        for (int i = 0; i < n; i++) idx[i] = rnd_int(src_rows);
        pt_be_gather_rows(be, dst, src, idx, n, d);
        check_written(dst, (size_t)(n * d), "gather_rows", be);
        for (int i = 0; i < n; i++) assert_memory_equal(dst + i * d, src + idx[i] * d, sizeof(float) * (size_t)d);
        free(src);
        free(dst);
    }
}

/* ---- rmsnorm, add, add_bias, swiglu ---------------------------------------------------- */

static void test_rmsnorm(void **state) {
    (void)state;
    static const int ns[] = {1, 2, 3, 7, 33};
    static const int ds[] = {1, 7, 8, 64, 300, 515, 2048};
    for (int b = 0; b < n_backends; b++)
        for (size_t i = 0; i < PT_ARRAY_LEN(ns); i++)
            for (size_t k = 0; k < PT_ARRAY_LEN(ds); k++)
                for (int alias = 0; alias < 2; alias++) {
                    pt_backend *be = backends[b];
                    int n = ns[i], d = ds[k];
                    float eps = 1e-5f;
                    float *x = rnd_floats((size_t)(n * d), 3.0f), *g = rnd_floats((size_t)d, 1.0f);
                    float *x0 = malloc(sizeof(float) * (size_t)(n * d));
                    memcpy(x0, x, sizeof(float) * (size_t)(n * d));
                    float *y = alias ? x : poisoned((size_t)(n * d));
                    pt_be_rmsnorm(be, y, x, g, n, d, eps);
                    if (!alias) check_written(y, (size_t)(n * d), "rmsnorm", be);
                    for (int t = 0; t < n; t++) {
                        double ss = 0;
                        for (int j = 0; j < d; j++) ss += (double)x0[t * d + j] * x0[t * d + j];
                        double s = 1 / sqrt(ss / d + eps);
                        for (int j = 0; j < d; j++) {
                            double ref = x0[t * d + j] * s * g[j], got = y[t * d + j];
                            if (!(fabs(got - ref) <= 1e-6 * fabs(ref)))
                                fail_msg("rmsnorm [%s] n=%d d=%d alias=%d: [%d][%d] %.9g vs %.9g",
                                         be->detail, n, d, alias, t, j, got, ref);
                        }
                    }
                    free(x), free(g), free(x0);
                    if (!alias) free(y);
                }
}

static const size_t counts[] = {1, 7, 8, 15, 16, 17, 100, 20000, 70001};

static void test_add(void **state) {
    (void)state;
    for (int b = 0; b < n_backends; b++)
        for (size_t c = 0; c < PT_ARRAY_LEN(counts); c++)
            for (int alias = 0; alias < 3; alias++) { /* y separate, y = a, y = b */
                pt_backend *be = backends[b];
                size_t n = counts[c];
                float *a = rnd_floats(n, 1.0f), *bb = rnd_floats(n, 1.0f);
                float *ref = malloc(sizeof(float) * n);
                for (size_t i = 0; i < n; i++) ref[i] = a[i] + bb[i];
                float *y = alias == 1 ? a : alias == 2 ? bb : poisoned(n);
                pt_be_add(be, y, a, bb, n);
                if (!alias) check_written(y, n, "add", be);
                assert_memory_equal(y, ref, sizeof(float) * n);
                free(a), free(bb), free(ref);
                if (!alias) free(y);
            }
}

static void test_add_bias(void **state) {
    (void)state;
    static const int shapes[][2] = {{1, 1}, {3, 7}, {7, 64}, {33, 515}, {40, 1000}};
    for (int b = 0; b < n_backends; b++)
        for (size_t s = 0; s < PT_ARRAY_LEN(shapes); s++) {
            pt_backend *be = backends[b];
            int n = shapes[s][0], d = shapes[s][1];
            float *y = rnd_floats((size_t)(n * d) + N_GUARD, 1.0f), *bias = rnd_floats((size_t)d, 1.0f);
            float *y0 = malloc(sizeof(float) * ((size_t)(n * d) + N_GUARD));
            for (int i = 0; i < N_GUARD; i++) y[n * d + i] = NAN;
            memcpy(y0, y, sizeof(float) * ((size_t)(n * d) + N_GUARD));
            pt_be_add_bias(be, y, bias, n, d);
            check_written(y, (size_t)(n * d), "add_bias", be);
            for (int t = 0; t < n; t++)
                for (int j = 0; j < d; j++) assert_true(y[t * d + j] == y0[t * d + j] + bias[j]);
            free(y), free(bias), free(y0);
        }
}

static void test_swiglu(void **state) {
    (void)state;
    for (int b = 0; b < n_backends; b++)
        for (size_t c = 0; c < PT_ARRAY_LEN(counts); c++)
            for (int alias = 0; alias < 3; alias++) { /* y separate, y = gate, y = up */
                pt_backend *be = backends[b];
                size_t n = counts[c];
                /* Gates over +-80: both tails of silu, where exp over- or
                 * underflows for a careless kernel. */
                float *g = rnd_floats(n, 80.0f), *u = rnd_floats(n, 2.0f);
                for (size_t i = 0; i < n; i += 2) g[i] /= 20; /* and small ones */
                double *ref = malloc(sizeof(double) * n);
                for (size_t i = 0; i < n; i++) ref[i] = g[i] / (1 + exp(-(double)g[i])) * u[i];
                float *y = alias == 1 ? g : alias == 2 ? u : poisoned(n);
                pt_be_swiglu(be, y, g, u, n);
                if (!alias) check_written(y, n, "swiglu", be);
                for (size_t i = 0; i < n; i++)
                    if (!(fabs(y[i] - ref[i]) <= 2e-6 * fabs(ref[i])))
                        fail_msg("swiglu [%s] n=%zu: [%zu] %.9g vs %.9g", be->detail, n, i, y[i], ref[i]);
                free(g), free(u), free(ref);
                if (!alias) free(y);
            }
}

/* The kernels' exp (behind swiglu and softmax) directly, on a dense grid
 * over the whole range whose result is a normal float. */
static void test_exp_accuracy(void **state) {
    (void)state;
    const pt_cpu_kernels *sets[3] = {pt_cpu_kernels_portable(), have_avx2() ? pt_cpu_kernels_avx2() : NULL,
                                     have_avx512() ? pt_cpu_kernels_avx512() : NULL};
    const int64_t n = 1 << 20;
    float *x = malloc(sizeof(float) * (size_t)n);
    for (int s = 0; s < 3; s++) {
        if (!sets[s]) continue;
        for (int64_t i = 0; i < n; i++) x[i] = -87.0f + 175.0f * (float)i / (float)n;
        float *in = malloc(sizeof(float) * (size_t)n);
        memcpy(in, x, sizeof(float) * (size_t)n);
        sets[s]->exp_sum(x, n, 0.0f);
        double worst = 0;
        for (int64_t i = 0; i < n; i++) {
            double ref = exp((double)in[i]);
            worst = fmax(worst, fabs(x[i] - ref) / ref);
        }
        print_message("%s exp: max relative error %.3g\n", sets[s]->name, worst);
        assert_true(worst < 1e-6);
        /* The sum as softmax uses it: a chunk of scores minus their max. */
        for (int len = 1; len <= 67; len += 11) {
            double ref_sum = 0;
            for (int i = 0; i < len; i++) x[i] = in[i] = -30.0f * (float)pt_rng_uniform(&rng);
            float sum = sets[s]->exp_sum(x, len, 0.5f);
            for (int i = 0; i < len; i++) ref_sum += exp((double)in[i] - 0.5);
            assert_true(fabs(sum - ref_sum) <= 1e-6 * ref_sum);
        }
        free(in);
    }
    free(x);
}

/* Every f16 and bf16 bit pattern converts exactly as base.h does, in both
 * kernel sets (NaNs only need to stay NaNs). */
static void test_half_conversions(void **state) {
    (void)state;
    const pt_cpu_kernels *sets[3] = {pt_cpu_kernels_portable(), have_avx2() ? pt_cpu_kernels_avx2() : NULL,
                                     have_avx512() ? pt_cpu_kernels_avx512() : NULL};
    uint16_t *h = malloc(sizeof(uint16_t) * 65536);
    float *f = malloc(sizeof(float) * 65536);
    for (int i = 0; i < 65536; i++) h[i] = (uint16_t)i;
    for (int s = 0; s < 3; s++) {
        if (!sets[s]) continue;
        for (int t = 0; t < 2; t++) {
            pt_dtype dt = t ? PT_BF16 : PT_F16;
            sets[s]->w[dt].to_f32(f, h, 65536);
            for (int i = 0; i < 65536; i++) {
                float want = t ? pt_bf16_to_f32((uint16_t)i) : pt_f16_to_f32((uint16_t)i);
                if (isnan(want) ? !isnan(f[i]) : memcmp(&f[i], &want, 4) != 0)
                    fail_msg("%s %s: 0x%04x -> %g, want %g", sets[s]->name, pt_dtype_name(dt), i, f[i], want);
            }
        }
    }
    free(h), free(f);
}

/* ---- rope ------------------------------------------------------------------------------ */

static void check_rope(pt_backend *be, int style, int head_dim, int n_rot, int n, float mscale) {
    int n_heads = 3;
    size_t count = (size_t)n * n_heads * head_dim;
    float *x = rnd_floats(count, 1.0f), *x0 = malloc(sizeof(float) * count);
    memcpy(x0, x, sizeof(float) * count);
    float *inv = malloc(sizeof(float) * (size_t)(n_rot / 2 + 1));
    for (int i = 0; i < n_rot / 2; i++) inv[i] = (float)pow(10000.0, -2.0 * i / n_rot);
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)n), *seq = calloc((size_t)n, sizeof(int32_t));
    for (int t = 0; t < n; t++) pos[t] = t == 0 ? 131071 : rnd_int(131072); /* up to 128k */
    pt_batch_view bv = {.n_tokens = n, .pos = pos, .seq = seq, .n_seqs = 1};
    pt_rope r = {.style = style, .n_rot = n_rot, .inv_freq = inv, .mscale = mscale};
    pt_be_rope(be, x, &bv, n_heads, head_dim, &r);
    int half = n_rot / 2;
    for (int t = 0; t < n; t++)
        for (int h = 0; h < n_heads; h++) {
            const float *a = x0 + (t * n_heads + h) * head_dim;
            const float *got = x + (t * n_heads + h) * head_dim;
            for (int i = 0; i < half; i++) {
                int i0 = style == PT_ROPE_NEOX ? i : 2 * i, i1 = style == PT_ROPE_NEOX ? i + half : 2 * i + 1;
                double th = (double)pos[t] * (double)inv[i], c = cos(th) * mscale, s = sin(th) * mscale;
                double r0 = a[i0] * c - a[i1] * s, r1 = a[i0] * s + a[i1] * c;
                double tol = 1e-6 * (fabs(a[i0]) + fabs(a[i1]));
                if (!(fabs(got[i0] - r0) <= tol && fabs(got[i1] - r1) <= tol))
                    fail_msg("rope [%s] style %d hd %d n_rot %d pos %d pair %d: (%.8g, %.8g) vs (%.8g, %.8g)",
                             be->detail, style, head_dim, n_rot, pos[t], i, got[i0], got[i1], r0, r1);
            }
            for (int i = n_rot; i < head_dim; i++) assert_true(got[i] == a[i]); /* untouched */
        }
    free(x), free(x0), free(inv), free(pos), free(seq);
}

static void test_rope(void **state) {
    (void)state;
    static const int dims[][2] = {{8, 8}, {64, 64}, {128, 128}, {64, 32}, {80, 40}, {6, 6}, {10, 4}};
    static const int ns[] = {1, 2, 7, 33};
    for (int b = 0; b < n_backends; b++)
        for (int style = PT_ROPE_NORM; style <= PT_ROPE_NEOX; style++)
            for (size_t d = 0; d < PT_ARRAY_LEN(dims); d++)
                for (size_t i = 0; i < PT_ARRAY_LEN(ns); i++)
                    check_rope(backends[b], style, dims[d][0], dims[d][1], ns[i], i % 2 ? 0.75f : 1.0f);
}

/* ---- the paged KV cache ------------------------------------------------------------------ */

/* A batch over several sequences with a shuffled page pool: seq s owns
 * pages of a random permutation, so consecutive pages are never adjacent. */
typedef struct kv_fixture {
    pt_kv_view kv;
    size_t n_pages, cache_elts;
    int n_seqs, max_pages;
    int32_t *block_table;
    int seq_len[8]; /* positions 0..seq_len-1 hold data */
} kv_fixture;

static void kv_fixture_init(kv_fixture *f, pt_dtype dt, int page_size, int n_kv, int hd,
                            const int *lens, int n_seqs) {
    memset(f, 0, sizeof *f);
    f->n_seqs = n_seqs;
    int maxlen = 0;
    for (int s = 0; s < n_seqs; s++) maxlen = PT_MAX(maxlen, lens[s]), f->seq_len[s] = lens[s];
    f->max_pages = (maxlen + page_size - 1) / page_size + 1;
    f->n_pages = (size_t)(n_seqs * f->max_pages) + 3;
    int32_t *perm = malloc(sizeof(int32_t) * f->n_pages);
    for (size_t i = 0; i < f->n_pages; i++) perm[i] = (int32_t)i;
    for (size_t i = f->n_pages - 1; i > 0; i--) {
        size_t j = (size_t)rnd_int((int)i + 1);
        int32_t tmp = perm[i];
        perm[i] = perm[j], perm[j] = tmp;
    }
    f->block_table = malloc(sizeof(int32_t) * (size_t)(n_seqs * f->max_pages));
    for (int i = 0; i < n_seqs * f->max_pages; i++) f->block_table[i] = perm[i];
    free(perm);
    f->cache_elts = f->n_pages * (size_t)page_size * n_kv * hd;
    f->kv = (pt_kv_view){.k = malloc(f->cache_elts * elt_size(dt)), .v = malloc(f->cache_elts * elt_size(dt)),
                         .dtype = dt, .page_size = page_size, .n_kv_heads = n_kv, .head_dim = hd};
    for (size_t i = 0; i < f->cache_elts; i++) {
        store_elt(dt, f->kv.k, i, rnd());
        store_elt(dt, f->kv.v, i, rnd());
    }
}

static void kv_fixture_free(kv_fixture *f) {
    free(f->kv.k), free(f->kv.v), free(f->block_table);
}

static size_t kv_index(const kv_fixture *f, int s, int p, int head, int i) {
    const pt_kv_view *kv = &f->kv;
    int32_t page = f->block_table[s * f->max_pages + p / kv->page_size];
    return (((size_t)page * kv->page_size + (size_t)(p % kv->page_size)) * kv->n_kv_heads + head) *
               kv->head_dim + i;
}

static void test_kv_store(void **state) {
    (void)state;
    for (int b = 0; b < n_backends; b++)
        for (size_t d = 0; d < PT_ARRAY_LEN(float_types); d++) {
            pt_backend *be = backends[b];
            pt_dtype dt = float_types[d];
            int lens[3] = {23, 5, 40}, n_kv = 2, hd = 24;
            kv_fixture f;
            kv_fixture_init(&f, dt, 7, n_kv, hd, lens, 3);
            size_t bytes = f.cache_elts * elt_size(dt);
            void *k0 = malloc(bytes), *v0 = malloc(bytes);
            memcpy(k0, f.kv.k, bytes), memcpy(v0, f.kv.v, bytes);
            /* Rows: a prefill run of seq 2, a decode row of seq 0 and 1. */
            int n = 0;
            int32_t pos[16], seq[16];
            for (int p = 30; p < 40; p++) pos[n] = p, seq[n++] = 2;
            pos[n] = 22, seq[n++] = 0;
            pos[n] = 4, seq[n++] = 1;
            float *k = rnd_floats((size_t)(n * n_kv * hd), 2.0f), *v = rnd_floats((size_t)(n * n_kv * hd), 2.0f);
            pt_batch_view bv = {.n_tokens = n, .pos = pos, .seq = seq, .block_table = f.block_table, .max_pages = f.max_pages, .n_seqs = 3};
            pt_be_kv_store(be, &f.kv, &bv, k, v);
            /* Expected: the old cache with exactly these slots replaced. */
            for (int t = 0; t < n; t++)
                for (int h = 0; h < n_kv; h++)
                    for (int i = 0; i < hd; i++) {
                        size_t at = kv_index(&f, seq[t], pos[t], h, i);
                        store_elt(dt, k0, at, k[(t * n_kv + h) * hd + i]);
                        store_elt(dt, v0, at, v[(t * n_kv + h) * hd + i]);
                    }
            if (memcmp(k0, f.kv.k, bytes) || memcmp(v0, f.kv.v, bytes))
                fail_msg("kv_store %s [%s]: cache differs from the expected one", pt_dtype_name(dt), be->detail);
            free(k0), free(v0), free(k), free(v);
            kv_fixture_free(&f);
        }
}

/* The reference: softmax over positions p0..pos in double (p0 > 0 under a
 * window), scores soft-capped when softcap > 0, and with sinks one more
 * term exp(sinks[h]) in the denominator (gpt-oss). */
static void attention_ref(const kv_fixture *f, const float *q, int s, int pos, int h, int group,
                          const pt_attn_params *ap, double *out, double *mag) {
    const pt_kv_view *kv = &f->kv;
    int hd = kv->head_dim, g = h / group, p0 = ap->window > 0 ? pos + 1 - ap->window : 0;
    if (p0 < 0) p0 = 0;
    double *w = malloc(sizeof(double) * (size_t)(pos + 1)), mx = -INFINITY, sum = 0;
    for (int p = p0; p <= pos; p++) {
        double d = 0;
        for (int i = 0; i < hd; i++) d += (double)q[i] * load_elt(kv->dtype, kv->k, kv_index(f, s, p, g, i));
        w[p] = d * ap->scale;
        if (ap->softcap > 0) w[p] = ap->softcap * tanh(w[p] / ap->softcap);
        mx = fmax(mx, w[p]);
    }
    if (ap->sinks) mx = fmax(mx, ap->sinks[h]);
    for (int p = p0; p <= pos; p++) sum += w[p] = exp(w[p] - mx);
    if (ap->sinks) sum += exp(ap->sinks[h] - mx);
    for (int i = 0; i < hd; i++) {
        out[i] = mag[i] = 0;
        for (int p = p0; p <= pos; p++) {
            double v = load_elt(kv->dtype, kv->v, kv_index(f, s, p, g, i));
            out[i] += w[p] / sum * v;
            mag[i] += w[p] / sum * fabs(v);
        }
    }
    free(w);
}

/* > 0: check_attention_p gives every head a sink logit of about this size. */
static float sink_scale;

/* Rows: for each sequence, its last `tail` positions (a prefill chunk when
 * tail > 1, a decode row when 1). */
static void check_attention_p(pt_backend *be, pt_dtype dt, int page_size, int n_kv, int group, int hd,
                              const int *lens, const int *tails, int n_seqs, int window, float softcap) {
    kv_fixture f;
    kv_fixture_init(&f, dt, page_size, n_kv, hd, lens, n_seqs);
    int n_heads = n_kv * group, n = 0;
    int32_t pos[256], seq[256];
    for (int s = 0; s < n_seqs; s++)
        for (int p = lens[s] - tails[s]; p < lens[s]; p++) pos[n] = p, seq[n++] = s;
    /* Larger queries make the softmax far from flat. */
    float *q = rnd_floats((size_t)(n * n_heads * hd), 4.0f), *out = poisoned((size_t)(n * n_heads * hd));
    pt_attn_params ap = {.scale = 1.0f / sqrtf((float)hd), .window = window, .softcap = softcap};
    float *sinks = sink_scale > 0 ? rnd_floats((size_t)n_heads, sink_scale) : NULL;
    ap.sinks = sinks; /* host memory is the CPU backend's */
    pt_batch_view bv = {.n_tokens = n, .pos = pos, .seq = seq, .block_table = f.block_table, .max_pages = f.max_pages, .n_seqs = n_seqs};
    if (window || softcap > 0 || sinks)
        pt_be_attention_ext(be, out, q, &f.kv, &bv, n_heads, &ap);
    else
        pt_be_attention(be, out, q, &f.kv, &bv, n_heads, ap.scale);
    char what[160];
    snprintf(what, sizeof what, "attention %s page %d kv %d group %d hd %d window %d softcap %g%s",
             pt_dtype_name(dt), page_size, n_kv, group, hd, window, (double)softcap,
             sinks ? " sinks" : "");
    check_written(out, (size_t)(n * n_heads * hd), what, be);
    double *ref = malloc(sizeof(double) * (size_t)hd), *mag = malloc(sizeof(double) * (size_t)hd);
    for (int t = 0; t < n; t++)
        for (int h = 0; h < n_heads; h++) {
            attention_ref(&f, q + (t * n_heads + h) * hd, seq[t], pos[t], h, group, &ap, ref, mag);
            for (int i = 0; i < hd; i++) {
                double got = out[(t * n_heads + h) * hd + i];
                worst_attention = fmax(worst_attention, fabs(got - ref[i]) / (2e-5 * mag[i] + 1e-7));
                if (!(fabs(got - ref[i]) <= 2e-5 * mag[i] + 1e-7))
                    fail_msg("%s [%s]: row %d (seq %d pos %d) head %d [%d] = %.8g, reference %.8g", what,
                             be->detail, t, seq[t], pos[t], h, i, got, ref[i]);
            }
        }
    free(ref), free(mag), free(q), free(out), free(sinks);
    kv_fixture_free(&f);
}

static void check_attention(pt_backend *be, pt_dtype dt, int page_size, int n_kv, int group, int hd,
                            const int *lens, const int *tails, int n_seqs) {
    check_attention_p(be, dt, page_size, n_kv, group, hd, lens, tails, n_seqs, 0, 0);
}

/* attention_ext: windows of 1 (only itself), shorter than a page, longer
 * than some rows, and one that starts mid-page inside a long decode row
 * split across threads; with and without soft-capping (cap 2.5 bites on
 * scores of this size). */
static void test_attention_ext(void **state) {
    (void)state;
    static const int windows[] = {0, 1, 4, 17, 700};
    static const float caps[] = {0, 2.5f};
    static const int lens[] = {37, 1, 90, 13}, tails[] = {6, 1, 1, 13};
    int long_lens[3] = {1500, 37, 701}, long_tails[3] = {1, 3, 1};
    for (int b = 0; b < n_backends; b++)
        for (size_t d = 0; d < PT_ARRAY_LEN(float_types); d++)
            for (size_t wi = 0; wi < PT_ARRAY_LEN(windows); wi++)
                for (size_t ci = 0; ci < PT_ARRAY_LEN(caps); ci++) {
                    if (!windows[wi] && !caps[ci]) continue;
                    check_attention_p(backends[b], float_types[d], 5, 2, 2, 64, lens, tails, 4,
                                      windows[wi], caps[ci]);
                    check_attention_p(backends[b], float_types[d], 16, 1, 4, 32, long_lens,
                                      long_tails, 3, windows[wi], caps[ci]);
                }
}

/* Attention sinks (gpt-oss): alone, under windows, in long decode rows
 * split across threads (the merge adds the sink once), and sinks larger
 * than every score (the sink dominates the denominator). */
static void test_attention_sinks(void **state) {
    (void)state;
    static const int windows[] = {0, 4, 17};
    static const float scales[] = {1.0f, 40.0f};
    static const int lens[] = {37, 1, 90, 13}, tails[] = {6, 1, 1, 13};
    int long_lens[3] = {1500, 37, 701}, long_tails[3] = {1, 3, 1};
    for (int b = 0; b < n_backends; b++)
        for (size_t si = 0; si < PT_ARRAY_LEN(scales); si++)
            for (size_t wi = 0; wi < PT_ARRAY_LEN(windows); wi++) {
                sink_scale = scales[si];
                check_attention_p(backends[b], PT_BF16, 5, 2, 2, 64, lens, tails, 4, windows[wi], 0);
                check_attention_p(backends[b], PT_F32, 16, 1, 4, 32, long_lens, long_tails, 3,
                                  windows[wi], 0);
            }
    sink_scale = 0;
}

/* gpt-oss's clamped SwiGLU against double precision, over values well
 * past the limit on both sides; and add_id, a bias by expert id. */
static void test_swiglu_oai_add_id(void **state) {
    (void)state;
    static const size_t ns[] = {1, 17, 1000, 70001};
    const double alpha = 1.702, limit = 7.0;
    for (int b = 0; b < n_backends; b++) {
        pt_backend *be = backends[b];
        for (size_t c = 0; c < PT_ARRAY_LEN(ns); c++) {
            size_t n = ns[c];
            float *g = rnd_floats(n, 20.0f), *u = rnd_floats(n, 20.0f), *y = poisoned(n);
            pt_be_swiglu_oai(be, y, g, u, n, (float)alpha, (float)limit);
            check_written(y, n, "swiglu_oai", be);
            int clamped = 0;
            for (size_t i = 0; i < n; i++) {
                double gg = fmin(g[i], limit), uu = fmax(-limit, fmin(u[i], limit));
                double ref = (uu + 1) * gg / (1 + exp(-alpha * gg));
                clamped += g[i] > limit || fabs(u[i]) > limit;
                if (!(fabs(y[i] - ref) <= 4e-6 * fabs(ref) + 1e-6))
                    fail_msg("swiglu_oai [%s]: [%zu] gate %g up %g: %.9g vs %.9g", be->detail, i,
                             (double)g[i], (double)u[i], y[i], ref);
            }
            if (n >= 1000) assert_true(clamped > 0);
            free(g), free(u), free(y);
        }
        int n = 13, k = 3, d = 33, E = 5;
        float *x = rnd_floats((size_t)n * k * d, 1.0f), *bias = rnd_floats((size_t)E * d, 1.0f);
        float *y = malloc(sizeof(float) * (size_t)n * k * d);
        int32_t ids[13 * 3];
        for (int i = 0; i < n * k; i++) ids[i] = rnd_int(E);
        memcpy(y, x, sizeof(float) * (size_t)n * k * d);
        pt_be_add_id(be, y, bias, ids, n, k, d);
        for (int i = 0; i < n * k; i++)
            for (int c = 0; c < d; c++)
                if (y[i * d + c] != x[i * d + c] + bias[ids[i] * d + c])
                    fail_msg("add_id [%s]: [%d][%d]", be->detail, i, c);
        free(x), free(bias), free(y);
    }
}

static void test_attention(void **state) {
    (void)state;
    static const int groups[] = {1, 2, 4}, hds[] = {8, 64, 128}, pages[] = {5, 16};
    /* Lengths not divisible by the page size; a prefill chunk, decode rows. */
    static const int lens[] = {37, 1, 90, 13}, tails[] = {6, 1, 1, 13};
    for (int b = 0; b < n_backends; b++)
        for (size_t d = 0; d < PT_ARRAY_LEN(float_types); d++)
            for (size_t gi = 0; gi < PT_ARRAY_LEN(groups); gi++)
                for (size_t hi = 0; hi < PT_ARRAY_LEN(hds); hi++)
                    for (size_t pi = 0; pi < PT_ARRAY_LEN(pages); pi++)
                        check_attention(backends[b], float_types[d], pages[pi], 2, groups[gi], hds[hi], lens,
                                        tails, 4);
    print_message("attention: worst error %.2f of the bound\n", worst_attention);
}

/* Long decode rows: with more than one thread they are split into position
 * ranges and merged (flash-decoding); splits land mid-page.  Also a group
 * of 12 query heads per kv head, and pages larger than a chunk. */
static void test_attention_long_decode(void **state) {
    (void)state;
    for (int b = 0; b < n_backends; b++)
        for (size_t d = 0; d < PT_ARRAY_LEN(float_types); d++) {
            int len[1] = {1500}, tail[1] = {1};
            int lens[3] = {1500, 37, 701}, tails[3] = {1, 3, 1};
            check_attention(backends[b], float_types[d], 16, 1, 4, 64, len, tail, 1);
            check_attention(backends[b], float_types[d], 5, 2, 1, 8, lens, tails, 3);
            check_attention(backends[b], float_types[d], 16, 1, 12, 64, lens, tails, 3);
            check_attention(backends[b], float_types[d], 256, 2, 2, 128, len, tail, 1);
        }
}

/* ---- Gemma's element-wise ops ------------------------------------------------------------ */

static void test_geglu_scale_softcap(void **state) {
    (void)state;
    static const size_t ns[] = {1, 15, 17, 1000, 70001};
    for (int b = 0; b < n_backends; b++)
        for (size_t c = 0; c < PT_ARRAY_LEN(ns); c++) {
            pt_backend *be = backends[b];
            size_t n = ns[c];
            float *g = rnd_floats(n, 8.0f), *u = rnd_floats(n, 2.0f), *y = poisoned(n);
            pt_be_geglu(be, y, g, u, n);
            check_written(y, n, "geglu", be);
            for (size_t i = 0; i < n; i++) {
                double x = g[i], ref = 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))) * u[i];
                if (!(fabs(y[i] - ref) <= 4e-6 * fabs(ref) + 1e-7))
                    fail_msg("geglu [%s]: [%zu] %.9g vs %.9g", be->detail, i, y[i], ref);
            }
            memcpy(y, g, n * sizeof(float));
            pt_be_scale(be, y, 3.5f, n);
            for (size_t i = 0; i < n; i++)
                if (y[i] != g[i] * 3.5f) fail_msg("scale [%s]: [%zu]", be->detail, i);
            memcpy(y, g, n * sizeof(float));
            pt_be_softcap(be, y, 3.0f, n);
            for (size_t i = 0; i < n; i++) {
                double ref = 3.0 * tanh(g[i] / 3.0);
                if (!(fabs(y[i] - ref) <= 2e-6 * fabs(ref) + 1e-7))
                    fail_msg("softcap [%s]: [%zu] %.9g vs %.9g", be->detail, i, y[i], ref);
            }
            free(g), free(u), free(y);
        }
}

/* Argmax (greedy picks on the backend): rows with known answers (ties go
 * to the first, NaN never wins, nothing above -inf gives 0), then random
 * rows of a 128k vocabulary with the maximum planted twice. */
static void test_argmax(void **state) {
    (void)state;
    static const float fixed[][5] = {
        {NAN, 1, 3, 3, NAN},  {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY},
        {NAN, NAN, NAN, NAN, NAN}, {-INFINITY, NAN, -5, NAN, -6},
        {INFINITY, 1, INFINITY, NAN, 2}, {-1, -2, -3, -4, -0.5f},
    };
    static const int32_t want[] = {2, 0, 0, 2, 0, 4};
    enum { V = 128256, N = 5 };
    float *rows = rnd_floats((size_t)N * V, 4.0f);
    int32_t truth[N];
    for (int i = 0; i < N; i++) {
        truth[i] = (int32_t)(pt_rng_next(&rng) % (V - 1));
        rows[(size_t)i * V + truth[i]] = 9.0f;
        rows[(size_t)i * V + truth[i] + 1 + pt_rng_next(&rng) % (V - 1 - truth[i])] = 9.0f;
    }
    for (int b = 0; b < n_backends; b++) {
        pt_backend *be = backends[b];
        int32_t ids[PT_ARRAY_LEN(want) + N_GUARD];
        memset(ids, 0xff, sizeof ids);
        pt_be_argmax(be, ids, &fixed[0][0], (int)PT_ARRAY_LEN(want), 5);
        for (size_t i = 0; i < PT_ARRAY_LEN(want); i++)
            if (ids[i] != want[i])
                fail_msg("argmax [%s]: fixed row %zu gave %d, want %d", be->detail, i, ids[i],
                         want[i]);
        for (size_t i = PT_ARRAY_LEN(want); i < PT_ARRAY_LEN(ids); i++)
            if (ids[i] != -1) fail_msg("argmax [%s]: wrote past the end", be->detail);
        memset(ids, 0xff, sizeof ids);
        pt_be_argmax(be, ids, rows, N, V);
        for (int i = 0; i < N; i++)
            if (ids[i] != truth[i])
                fail_msg("argmax [%s]: row %d gave %d, want %d", be->detail, i, ids[i], truth[i]);
    }
    free(rows);
}

/* ---- mixture-of-experts ops ------------------------------------------------------------- */

/* Routing: softmax, the k most probable in descending order, renormalized
 * or not, against double precision.  Random logits can tie (24-bit
 * uniforms, 128 per row); equal logits may come in either order. */
static void test_moe_route(void **state) {
    (void)state;
    static const int shapes[][2] = {{4, 1}, {4, 2}, {9, 4}, {64, 8}, {128, 8}};
    for (int b = 0; b < n_backends; b++)
        for (size_t s = 0; s < PT_ARRAY_LEN(shapes); s++)
            for (int renorm = 0; renorm < 2; renorm++) {
                pt_backend *be = backends[b];
                int E = shapes[s][0], k = shapes[s][1], n = 37;
                float *l = rnd_floats((size_t)n * E, 6.0f), *w = poisoned((size_t)n * k);
                int32_t *ids = malloc(sizeof(int32_t) * (size_t)n * k);
                pt_be_moe_route(be, ids, w, l, n, E, k, renorm);
                check_written(w, (size_t)n * k, "moe_route", be);
                for (int t = 0; t < n; t++) {
                    const float *r = l + (size_t)t * E;
                    double mx = -INFINITY, sum = 0, kept = 0;
                    for (int e = 0; e < E; e++) mx = fmax(mx, r[e]);
                    for (int e = 0; e < E; e++) sum += exp(r[e] - mx);
                    for (int j = 0; j < k; j++) {
                        int e = ids[t * k + j], above = 0, tied = 0;
                        assert_true(e >= 0 && e < E);
                        for (int o = 0; o < E; o++) above += r[o] > r[e], tied += o != e && r[o] == r[e];
                        for (int i = 0; i < j; i++) assert_int_not_equal(ids[t * k + i], e);
                        if (j < above || j > above + tied)
                            fail_msg("moe_route [%s]: row %d slot %d is expert %d, rank %d (%d tied)",
                                     be->detail, t, j, e, above, tied);
                        kept += exp(r[e] - mx) / sum;
                    }
                    /* renormalized, it is gpt-oss's router: top k of the logits, then a
                     * softmax over those k alone */
                    double mk = r[ids[t * k]], sk = 0;
                    for (int j = 0; j < k; j++) sk += exp(r[ids[t * k + j]] - mk);
                    for (int j = 0; j < k; j++) {
                        double ref = exp(r[ids[t * k + j]] - mx) / sum / (renorm ? kept : 1);
                        double oai = exp(r[ids[t * k + j]] - mk) / sk;
                        if (renorm && !(fabs(w[t * k + j] - oai) <= 2e-6 * oai))
                            fail_msg("moe_route [%s]: row %d slot %d weight %.8g, top-k softmax %.8g",
                                     be->detail, t, j, w[t * k + j], oai);
                        if (!(fabs(w[t * k + j] - ref) <= 2e-6 * ref))
                            fail_msg("moe_route [%s]: row %d slot %d weight %.8g vs %.8g", be->detail, t,
                                     j, w[t * k + j], ref);
                    }
                }
                free(l), free(w), free(ids);
            }
}

/* DeepSeek routing against a double-precision reference: probabilities
 * (softmax or sigmoid), selection scores with a bias, the best groups by
 * the sum of their two best scores, the top k eligible experts, weights
 * renormalized or not and scaled.  Ids must match the reference in order
 * except in rows where two candidates at a selection boundary are within
 * 1e-5 (float vs double may order them either way); weights always
 * match the reference's probabilities of the chosen ids. */
typedef struct route_case {
    int E, k, groups, used, gating;
    bool bias, renorm;
    float scale;
} route_case;

/* indices of v[0..n) by descending value (ties: lower index first) */
static void order_desc(const double *v, int n, int *idx) {
    for (int i = 0; i < n; i++) idx[i] = i;
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && v[idx[j]] > v[idx[j - 1]]; j--) {
            int t = idx[j];
            idx[j] = idx[j - 1], idx[j - 1] = t;
        }
}

static void check_route_grouped(pt_backend *be, const route_case *rc) {
    int E = rc->E, k = rc->k, n = 41, per = rc->groups > 1 ? E / rc->groups : E, ambiguous = 0;
    float *l = rnd_floats((size_t)n * E, 4.0f), *w = poisoned((size_t)n * k);
    float *bias = rc->bias ? rnd_floats((size_t)E, 0.3f) : NULL;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)n * k);
    pt_op_moe_route_grouped a = {.ids = ids, .weights = w, .logits = l, .bias = bias, .n = n,
                                 .n_experts = E, .k = k, .n_groups = rc->groups,
                                 .groups_used = rc->used, .gating = rc->gating,
                                 .scale = rc->scale, .renorm = rc->renorm};
    pt_be_moe_route_grouped(be, &a);
    char what[128];
    snprintf(what, sizeof what, "moe_route_grouped E=%d k=%d groups %d/%d %s%s%s", E, k,
             rc->groups, rc->used, rc->gating ? "sigmoid" : "softmax", rc->bias ? " bias" : "",
             rc->renorm ? " renorm" : "");
    check_written(w, (size_t)n * k, what, be);
    double p[256], sel[256], gs[64];
    int order[256], gorder[64];
    for (int t = 0; t < n; t++) {
        const float *r = l + (size_t)t * E;
        double mx = -INFINITY, sum = 0;
        for (int e = 0; e < E; e++) mx = fmax(mx, r[e]);
        for (int e = 0; e < E; e++) sum += exp(r[e] - mx);
        for (int e = 0; e < E; e++) {
            p[e] = rc->gating == PT_MOE_SIGMOID ? 1 / (1 + exp(-(double)r[e])) : exp(r[e] - mx) / sum;
            sel[e] = p[e] + (bias ? bias[e] : 0);
        }
        bool amb = false;
        if (rc->groups > 1) {
            for (int g = 0; g < rc->groups; g++) {
                order_desc(sel + g * per, per, order);
                gs[g] = sel[g * per + order[0]] + sel[g * per + order[1]];
            }
            order_desc(gs, rc->groups, gorder);
            amb |= gs[gorder[rc->used - 1]] - gs[gorder[rc->used]] < 1e-5;
            bool keep[64] = {0};
            for (int i = 0; i < rc->used; i++) keep[gorder[i]] = true;
            for (int e = 0; e < E; e++)
                if (!keep[e / per]) sel[e] = -INFINITY;
        }
        order_desc(sel, E, order);
        for (int j = 0; j < k && !amb; j++) amb |= sel[order[j]] - sel[order[j + 1]] < 1e-5;
        ambiguous += amb;
        double kept = 0;
        for (int j = 0; j < k; j++) {
            int e = ids[t * k + j];
            assert_true(e >= 0 && e < E);
            for (int i = 0; i < j; i++) assert_int_not_equal(ids[t * k + i], e);
            if (!amb && e != order[j])
                fail_msg("%s [%s]: row %d slot %d is expert %d, the reference's %d", what, be->detail,
                         t, j, e, order[j]);
            kept += p[e];
        }
        for (int j = 0; j < k; j++) {
            double ref = p[ids[t * k + j]] / (rc->renorm ? kept : 1) * rc->scale;
            if (!(fabs(w[t * k + j] - ref) <= 3e-6 * ref))
                fail_msg("%s [%s]: row %d slot %d weight %.8g, reference %.8g", what, be->detail, t,
                         j, w[t * k + j], ref);
        }
    }
    if (ambiguous > n / 4) fail_msg("%s: %d of %d rows near a tie", what, ambiguous, n);
    free(l), free(w), free(bias), free(ids);
}

static void test_moe_route_grouped(void **state) {
    (void)state;
    static const route_case cases[] = {
        {8, 2, 0, 0, PT_MOE_SOFTMAX, false, false, 1.0f},  /* V2: softmax, no groups */
        {64, 6, 1, 1, PT_MOE_SOFTMAX, false, false, 1.0f}, /* V2-Lite's shape */
        {8, 3, 4, 2, PT_MOE_SIGMOID, true, true, 2.5f},    /* the fixture's */
        {64, 8, 8, 4, PT_MOE_SIGMOID, true, true, 2.5f},   /* V3's shape, 4x fewer experts */
        {16, 4, 4, 1, PT_MOE_SIGMOID, false, false, 1.0f}, /* k = one whole group */
        {32, 5, 4, 3, PT_MOE_SOFTMAX, true, true, 16.0f},
    };
    for (int b = 0; b < n_backends; b++)
        for (size_t i = 0; i < PT_ARRAY_LEN(cases); i++) check_route_grouped(backends[b], &cases[i]);
}

/* copy_cols: each row's column range lands at its offset in dst, and the
 * rest of dst is left as it was. */
static void test_copy_cols(void **state) {
    (void)state;
    static const int cases[][5] = { /* d_src, d_dst, src_off, dst_off, width */
        {24, 16, 0, 0, 16}, {24, 8, 16, 0, 8}, {32, 40, 0, 0, 32}, {8, 40, 0, 32, 8},
        {7, 5, 3, 1, 4},    {64, 64, 0, 0, 64}, {5, 9, 2, 6, 0},
    };
    for (int b = 0; b < n_backends; b++)
        for (size_t i = 0; i < PT_ARRAY_LEN(cases); i++)
            for (int n = 1; n <= 300; n += 299) {
                pt_backend *be = backends[b];
                int ds = cases[i][0], dd = cases[i][1], so = cases[i][2], doff = cases[i][3];
                int wd = cases[i][4];
                float *src = rnd_floats((size_t)n * ds, 1.0f), *dst = rnd_floats((size_t)n * dd, 1.0f);
                float *before = malloc(sizeof(float) * (size_t)n * dd);
                memcpy(before, dst, sizeof(float) * (size_t)n * dd);
                pt_be_copy_cols(be, dst, dd, doff, src, ds, so, wd, n);
                for (int t = 0; t < n; t++)
                    for (int c = 0; c < dd; c++) {
                        bool in = c >= doff && c < doff + wd;
                        float want = in ? src[(size_t)t * ds + so + c - doff] : before[(size_t)t * dd + c];
                        if (dst[(size_t)t * dd + c] != want)
                            fail_msg("copy_cols %d->%d [%d,+%d)->%d n=%d [%s]: [%d][%d] = %g, want %g",
                                     ds, dd, so, wd, doff, n, be->detail, t, c,
                                     dst[(size_t)t * dd + c], want);
                    }
                free(src), free(dst), free(before);
            }
}

/* A stack of E experts; those no row selects are filled with NaN, so a
 * kernel that used one would show it. */
static pt_weight make_stack(pt_backend *be, pt_dtype dt, int E, int64_t rows, int64_t cols,
                            const bool *used) {
    size_t per = (size_t)(rows * cols), nbytes = per * E * elt_size(dt);
    void *host = malloc(nbytes);
    for (int e = 0; e < E; e++)
        for (size_t i = 0; i < per; i++) store_elt(dt, host, e * per + i, used[e] ? rnd() : NAN);
    void *dev = be->ops->alloc(be, nbytes);
    be->ops->upload(be, dev, host, nbytes);
    free(host);
    return (pt_weight){.dtype = dt, .rows = rows, .cols = cols, .data = dev, .nbytes = nbytes,
                       .n_experts = E, .expert_stride = per * elt_size(dt)};
}

static void check_matmul_id(pt_backend *be, pt_dtype dt, int E, int64_t rows, int64_t cols, int n,
                            int k, int x_slots) {
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)n * k);
    bool used[64] = {0};
    for (int t = 0; t < n; t++) /* k distinct experts per row, from the first E - 1 */
        for (int j = 0; j < k; j++) {
            int e, dup;
            do {
                e = rnd_int(E - 1);
                dup = 0;
                for (int o = 0; o < j; o++) dup |= ids[t * k + o] == e;
            } while (dup);
            ids[t * k + j] = e;
            used[e] = true;
        }
    pt_weight w = make_stack(be, dt, E, rows, cols, used);
    float *x = rnd_floats((size_t)n * x_slots * cols, 1.0f), *y = poisoned((size_t)n * k * rows);
    pt_be_matmul_id(be, y, x, &w, ids, n, k, x_slots);
    char what[128];
    snprintf(what, sizeof what, "matmul_id %s %d x %lldx%lld n=%d k=%d slots=%d", pt_dtype_name(dt), E,
             (long long)rows, (long long)cols, n, k, x_slots);
    check_written(y, (size_t)n * k * rows, what, be);
    for (int t = 0; t < n; t++)
        for (int j = 0; j < k; j++) {
            const float *xr = x + ((size_t)t * x_slots + (x_slots > 1 ? j : 0)) * cols;
            size_t base = (size_t)ids[t * k + j] * rows * cols;
            for (int64_t r = 0; r < rows; r++) {
                double ref = 0, mag = 0;
                for (int64_t c = 0; c < cols; c++) {
                    double term = xr[c] * load_elt(dt, w.data, base + r * cols + c);
                    ref += term, mag += fabs(term);
                }
                double got = y[((size_t)t * k + j) * rows + r];
                if (!(fabs(got - ref) <= 1e-5 * mag))
                    fail_msg("%s [%s]: y[%d][%d][%lld] = %.8g, reference %.8g", what, be->detail, t, j,
                             (long long)r, got, ref);
            }
        }
    free(ids), free(x), free(y);
    free_weight(be, &w);
}

/* Decode (one row: each expert alone, in place), small batches, and a
 * prefill where experts gather many rows; gate/up (one input per row) and
 * down (one input per slot). */
static void test_matmul_id(void **state) {
    (void)state;
    static const int ns[] = {1, 3, 33, 200};
    for (int b = 0; b < n_backends; b++)
        for (size_t d = 0; d < PT_ARRAY_LEN(float_types); d++)
            for (size_t i = 0; i < PT_ARRAY_LEN(ns); i++) {
                check_matmul_id(backends[b], float_types[d], 6, 17, 33, ns[i], 2, 1);
                check_matmul_id(backends[b], float_types[d], 6, 33, 17, ns[i], 2, 2);
                check_matmul_id(backends[b], float_types[d], 9, 40, 64, ns[i], 1, 1);
                check_matmul_id(backends[b], float_types[d], 9, 64, 40, ns[i], 3, 3);
            }
}

/* MXFP4 stacks (gpt-oss's experts): random codes and scales, decoded by
 * matmul_id on the fly, against a reference that dequantizes each block
 * in double from the OCP definition (e2m1 value x 2^(e - 127)).  The
 * quantized kernels round activations per block of 32, d = max|x| / 32767
 * (int16) or / 127 (int8: the "int8" sets, decode and prefill alike): the
 * error is within sum |w| * d / 2 plus f32 rounding (tests/quant). */
static double mxfp4_elem(const uint8_t *row, int64_t c) {
    static const double fp4[16] = {0, 0.5, 1, 1.5, 2, 3, 4, 6, 0, -0.5, -1, -1.5, -2, -3, -4, -6};
    const uint8_t *b = row + (c / 32) * 17;
    int i = (int)(c % 32), code = i < 16 ? b[1 + i] & 15 : b[1 + i - 16] >> 4;
    return fp4[code] * ldexp(1.0, b[0] - 127);
}

static void test_matmul_id_mxfp4(void **state) {
    (void)state;
    static const int ns[] = {1, 3, 33, 200};
    const int E = 5, k = 2;
    const int64_t rows = 40, cols = 96, row_bytes = cols / 32 * 17;
    for (int bi = 0; bi < n_backends; bi++)
        for (size_t ni = 0; ni < PT_ARRAY_LEN(ns); ni++) {
            pt_backend *be = backends[bi];
            int n = ns[ni];
            size_t nbytes = (size_t)(E * rows * row_bytes);
            uint8_t *host = malloc(nbytes);
            for (size_t i = 0; i < nbytes; i++) host[i] = (uint8_t)rnd_int(256);
            for (size_t i = 0; i < nbytes; i += 17) host[i] = (uint8_t)(120 + rnd_int(14)); /* scales */
            pt_weight w = {.dtype = PT_MXFP4, .rows = rows, .cols = cols, .data = host,
                           .nbytes = nbytes, .n_experts = E, .expert_stride = (size_t)(rows * row_bytes)};
            int32_t *ids = malloc(sizeof(int32_t) * (size_t)n * k);
            for (int t = 0; t < n; t++) ids[t * k] = rnd_int(E), ids[t * k + 1] = (ids[t * k] + 1 + rnd_int(E - 1)) % E;
            float *x = rnd_floats((size_t)n * cols, 1.0f), *y = poisoned((size_t)n * k * rows);
            pt_be_matmul_id(be, y, x, &w, ids, n, k, 1);
            check_written(y, (size_t)n * k * rows, "matmul_id mxfp4", be);
            for (int t = 0; t < n; t++)
                for (int j = 0; j < k; j++)
                    for (int64_t r = 0; r < rows; r++) {
                        const uint8_t *row = host + (size_t)ids[t * k + j] * w.expert_stride + (size_t)(r * row_bytes);
                        double ref = 0, mag = 0, bound = 0, qmax = strstr(be->detail, "int8") ? 127 : 32767;
                        for (int64_t c = 0; c < cols; c++) {
                            const float *xb = x + (size_t)t * cols + c / 32 * 32;
                            double amax = 0, wv = mxfp4_elem(row, c), term = x[(size_t)t * cols + c] * wv;
                            for (int i = 0; i < 32; i++) amax = fmax(amax, fabs(xb[i]));
                            ref += term, mag += fabs(term), bound += fabs(wv) * amax / qmax / 2;
                        }
                        double got = y[((size_t)t * k + j) * rows + r];
                        if (!(fabs(got - ref) <= bound + 1e-5 * mag + 1e-6))
                            fail_msg("matmul_id mxfp4 n=%d [%s]: y[%d][%d][%lld] = %.8g, reference %.8g",
                                     n, be->detail, t, j, (long long)r, got, ref);
                    }
            free(host), free(ids), free(x), free(y);
        }
}

/* moe_ffn (the routed FFN as one op, backend.h) against the whole FFN
 * computed here in double from its definition: softmax, the top k (ties:
 * lower expert), renormalized or not, gate and up by expert with their
 * biases, the activation, down with its bias, the weighted sum.  The ids
 * must be the reference's and y within 1e-5 of it (relative, over the
 * output: every product here is an f32 sum of a few hundred terms). */
static double act_ref(int act, double g, double u) {
    if (act == PT_MOE_SWIGLU_OAI) {
        g = fmin(g, 7.0), u = fmax(-7.0, fmin(u, 7.0));
        return (u + 1) * g / (1 + exp(-1.702 * g));
    }
    if (act == PT_MOE_GEGLU)
        return 0.5 * g * (1 + tanh(0.7978845608028654 * (g + 0.044715 * g * g * g))) * u;
    return g / (1 + exp(-g)) * u;
}

static void check_moe_ffn(pt_backend *be, pt_dtype dt, int E, int dim, int f, int n, int k,
                          int act, bool bias, bool renorm) {
    bool used[64];
    for (int e = 0; e < E; e++) used[e] = true;
    pt_weight wg = make_stack(be, dt, E, f, dim, used), wu = make_stack(be, dt, E, f, dim, used);
    pt_weight wd = make_stack(be, dt, E, dim, f, used);
    float *x = rnd_floats((size_t)n * dim, 1.0f), *lg = rnd_floats((size_t)n * E, 4.0f);
    float *gb = rnd_floats((size_t)E * f, 1.0f), *ub = rnd_floats((size_t)E * f, 1.0f);
    float *db = rnd_floats((size_t)E * dim, 1.0f), *y = poisoned((size_t)n * dim);
    float *wts = poisoned((size_t)n * k), *g = poisoned((size_t)n * k * f);
    float *u = poisoned((size_t)n * k * f), *o = poisoned((size_t)n * k * dim);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)n * k);
    pt_op_moe_ffn a = {.y = y, .x = x, .logits = lg, .w_gate = &wg, .w_up = &wu, .w_down = &wd,
                       .gate_bias = bias ? gb : NULL, .up_bias = bias ? ub : NULL,
                       .down_bias = bias ? db : NULL, .ids = ids, .weights = wts, .gate = g,
                       .up = u, .out = o, .n = n, .n_experts = E, .k = k, .act = act,
                       .alpha = 1.702f, .limit = 7.0f, .renorm = renorm};
    pt_be_moe_ffn(be, &a);
    char what[128];
    snprintf(what, sizeof what, "moe_ffn %s E=%d %dx%d n=%d k=%d act=%d bias=%d renorm=%d",
             pt_dtype_name(dt), E, dim, f, n, k, act, bias, renorm);
    check_written(y, (size_t)n * dim, what, be);
    double *h = malloc(sizeof(double) * (size_t)k * f), num = 0, den = 0;
    for (int t = 0; t < n; t++) {
        const float *l = lg + (size_t)t * E;
        double mx = -INFINITY, sum = 0, kept = 0, p[32];
        int sel[32];
        for (int e = 0; e < E; e++) mx = fmax(mx, l[e]);
        for (int e = 0; e < E; e++) sum += exp(l[e] - mx);
        for (int j = 0; j < k; j++) { /* the j-th largest, lower expert first among equals */
            sel[j] = -1;
            for (int e = 0; e < E; e++) {
                bool taken = false;
                for (int i = 0; i < j; i++) taken |= sel[i] == e;
                if (!taken && (sel[j] < 0 || l[e] > l[sel[j]])) sel[j] = e;
            }
            p[j] = exp(l[sel[j]] - mx) / sum, kept += p[j];
            if (ids[t * k + j] != sel[j])
                fail_msg("%s [%s]: row %d slot %d is expert %d, reference %d", what, be->detail, t,
                         j, ids[t * k + j], sel[j]);
        }
        for (int j = 0; j < k; j++) /* each slot's activations */
            for (int i = 0; i < f; i++) {
                size_t e = (size_t)sel[j], row = e * f + i;
                double gs = bias ? gb[row] : 0, us = bias ? ub[row] : 0;
                for (int c = 0; c < dim; c++) {
                    gs += load_elt(dt, wg.data, row * dim + c) * x[(size_t)t * dim + c];
                    us += load_elt(dt, wu.data, row * dim + c) * x[(size_t)t * dim + c];
                }
                h[(size_t)j * f + i] = act_ref(act, gs, us);
            }
        for (int r = 0; r < dim; r++) {
            double ref = 0;
            for (int j = 0; j < k; j++) {
                size_t e = (size_t)sel[j];
                double od = bias ? db[e * dim + r] : 0;
                for (int i = 0; i < f; i++)
                    od += load_elt(dt, wd.data, (e * dim + r) * f + i) * h[(size_t)j * f + i];
                ref += (renorm ? p[j] / kept : p[j]) * od;
            }
            double d = y[(size_t)t * dim + r] - ref;
            num += d * d, den += ref * ref;
        }
    }
    if (!(sqrt(num / den) <= 1e-5))
        fail_msg("%s [%s]: y off the reference by %.3g (relative)", what, be->detail,
                 sqrt(num / den));
    free(h), free(x), free(lg), free(gb), free(ub), free(db), free(y), free(wts), free(g), free(u),
        free(o), free(ids);
    free_weight(be, &wg), free_weight(be, &wu), free_weight(be, &wd);
}

static void test_moe_ffn(void **state) {
    (void)state;
    for (int b = 0; b < n_backends; b++) {
        check_moe_ffn(backends[b], PT_F32, 16, 64, 48, 1, 4, PT_MOE_SWIGLU, false, true);
        check_moe_ffn(backends[b], PT_F32, 8, 40, 24, 5, 2, PT_MOE_SWIGLU_OAI, true, true);
        check_moe_ffn(backends[b], PT_BF16, 12, 32, 16, 3, 3, PT_MOE_GEGLU, false, false);
    }
}

static void test_moe_combine(void **state) {
    (void)state;
    static const int shapes[][3] = {{1, 2, 64}, {7, 3, 17}, {200, 8, 33}}; /* n, k, d */
    for (int b = 0; b < n_backends; b++)
        for (size_t s = 0; s < PT_ARRAY_LEN(shapes); s++) {
            pt_backend *be = backends[b];
            int n = shapes[s][0], k = shapes[s][1], d = shapes[s][2];
            float *x = rnd_floats((size_t)n * k * d, 2.0f), *w = rnd_floats((size_t)n * k, 1.0f);
            float *y = poisoned((size_t)n * d);
            pt_be_moe_combine(be, y, x, w, n, k, d);
            check_written(y, (size_t)n * d, "moe_combine", be);
            for (int t = 0; t < n; t++)
                for (int i = 0; i < d; i++) {
                    double ref = 0, mag = 0;
                    for (int j = 0; j < k; j++) {
                        double term = (double)w[t * k + j] * x[((size_t)t * k + j) * d + i];
                        ref += term, mag += fabs(term);
                    }
                    if (!(fabs(y[(size_t)t * d + i] - ref) <= 1e-6 * mag))
                        fail_msg("moe_combine [%s]: y[%d][%d] %.8g vs %.8g", be->detail, t, i,
                                 y[(size_t)t * d + i], ref);
                }
            free(x), free(w), free(y);
        }
}

/* ---- the backend object ------------------------------------------------------------------- */

static void test_kernel_choice(void **state) {
    (void)state;
    pt_err err = {{0}};
    assert_null(pt_backend_cpu_new(1, "sse9", &err));
    assert_non_null(strstr(err.msg, "sse9"));

    unsetenv("PETREL_CPU_KERNELS");
    pt_backend *be = pt_backend_cpu_new(2, "auto", &err);
    assert_non_null(be);
    assert_string_equal(be->name, "cpu");
    assert_true(be->host_memory);
    assert_int_equal(be->n_threads, 2);
    /* auto: the widest set the CPU has */
    assert_non_null(strstr(be->detail, have_avx512() ? "avx512" : have_avx2() ? "avx2" : "portable"));
    assert_true(have_avx512() == pt_qk_cpu_has_avx512());
    assert_true(!have_avx512() || have_avx2());
    be->ops->destroy(be);

    setenv("PETREL_CPU_KERNELS", "portable", 1);
    be = pt_backend_cpu_new(1, "auto", &err);
    assert_non_null(strstr(be->detail, "portable"));
    be->ops->destroy(be);
    if (have_avx2()) { /* an explicit choice beats the environment */
        be = pt_backend_cpu_new(1, "avx2", &err);
        assert_non_null(strstr(be->detail, "avx2"));
        be->ops->destroy(be);
    }
    setenv("PETREL_CPU_KERNELS", "avx512", 1);
    be = pt_backend_cpu_new(1, "auto", &err);
    if (have_avx512()) { /* the environment names a set like --kernels does */
        assert_non_null(be);
        assert_string_equal(be->detail, "avx512 + int8 quantized matmuls, 1 thread");
        be->ops->destroy(be);
    } else { /* and is refused, never silently replaced, where the CPU lacks it */
        assert_null(be);
        assert_non_null(strstr(err.msg, "avx512"));
    }
    unsetenv("PETREL_CPU_KERNELS");

    be = pt_backend_cpu_new(0, NULL, &err);
    assert_true(be->n_threads >= 1);
    unsigned char *p = be->ops->alloc(be, 1000);
    for (int i = 0; i < 1000; i++) assert_int_equal(p[i], 0);
    be->ops->free(be, p, 1000);
    be->ops->sync(be);
    be->ops->destroy(be);
}

static void test_read_bandwidth(void **state) {
    (void)state;
    pt_backend *be = backends[n_backends - 2]; /* best kernels, 2 threads */
    double bw = be->ops->read_bandwidth(be);
    print_message("read bandwidth [%s]: %.1f GB/s\n", be->detail, bw / 1e9);
    assert_true(bw > 1e8 && bw < 1e13);
    assert_true(be->ops->read_bandwidth(be) == bw); /* measured once */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kernel_choice),
        cmocka_unit_test(test_matmul),
        cmocka_unit_test(test_matmul_prefill),
        cmocka_unit_test(test_matmul_prefill_sets_agree),
        cmocka_unit_test(test_quantized_handoff),
        cmocka_unit_test(test_embed),
        cmocka_unit_test(test_gather_rows),
        cmocka_unit_test(test_rmsnorm),
        cmocka_unit_test(test_add),
        cmocka_unit_test(test_add_bias),
        cmocka_unit_test(test_swiglu),
        cmocka_unit_test(test_exp_accuracy),
        cmocka_unit_test(test_half_conversions),
        cmocka_unit_test(test_rope),
        cmocka_unit_test(test_kv_store),
        cmocka_unit_test(test_attention),
        cmocka_unit_test(test_attention_long_decode),
        cmocka_unit_test(test_attention_ext),
        cmocka_unit_test(test_attention_sinks),
        cmocka_unit_test(test_swiglu_oai_add_id),
        cmocka_unit_test(test_geglu_scale_softcap),
        cmocka_unit_test(test_argmax),
        cmocka_unit_test(test_moe_route),
        cmocka_unit_test(test_moe_route_grouped),
        cmocka_unit_test(test_copy_cols),
        cmocka_unit_test(test_matmul_id),
        cmocka_unit_test(test_matmul_id_mxfp4),
        cmocka_unit_test(test_moe_combine),
        cmocka_unit_test(test_moe_ffn),
        cmocka_unit_test(test_read_bandwidth),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
