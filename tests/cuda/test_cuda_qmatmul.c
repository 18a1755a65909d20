/*
 * test_cuda_qmatmul.c - quantized weights on the CUDA backend (qmatmul.cu)
 * against the CPU backend, on the same bytes: GGUF q8_0, q4_0, q4_k, q5_k,
 * q6_k and MLX affine at 4 and 8 bits (groups 32/64/128, f16 and bf16
 * scales) plus 3 and 6 bits (the plain decoder).
 *
 * matmul: up to PETREL_CUDA_QGEMV_MAX token rows (default 16) take the
 * GEMV, more dequantize to f16 and run cuBLAS.  The GEMV's rows are
 * batch-invariant: test_qbatch_invariance compares each row of 2..16-row
 * calls with the row alone, bit for bit.
 * Tolerances, per output, from the arithmetic (S = sum_k |w_k x_k|,
 * W = sum_k |w_k|), against a double-precision product of the dequantized
 * weights and against the CPU backend alike: the activations' rounding to
 * int16 codes (the staged GEMV and the CPU; <= max|x| / 65534 per
 * element) times W, plus 1e-5 S (f32 scaling and sums) for the GEMV or
 * 2^-9 S for the cuBLAS path (w and x rounded to f16, 2^-11 each).
 * Shapes: one tile, two and three tiles with a partial last one, rows that
 * are not whole 16-byte chunks (the plain kernel), row counts that are not
 * a multiple of the rows per block, and rows long enough that a warp of
 * the coalesced q4_0/q8_0 GEMV takes two steps (20736 columns).
 *
 * test_qmma: q4_0 and q8_0 at 17..256 token rows on a backend with the
 * tensor-core GEMM (PETREL_CUDA_QMMA=1, off by default; qmma.cu; 257
 * rows: cuBLAS), same bounds as the cuBLAS path (w and
 * x rounded to f16): rows not a multiple of its 256-row tiles, token rows
 * not a multiple of its 8/32/64-token tiles, K a multiple of 256 and not
 * (2880, 1056: rows not 16-byte aligned, a partial last stage), K split
 * across blocks and not; and it must differ from the cuBLAS path
 * somewhere in each format's cases, or the test did not run it.
 *
 * test_qmms: q4_0 and q8_0 in the row-split layout at 17..512 token rows
 * through the tensor-core GEMM of qmms.cu (the default from 17 to 128 rows
 * for q4_0, 64 for q8_0), with two m16 tiles a warp and with one
 * (PETREL_CUDA_QMMS_MT=2, 1), the same
 * bound as the cuBLAS path (2^-9 S): shapes below it; it must differ from
 * the cuBLAS path somewhere in each format's cases.
 *
 * test_qmatmul_coalesced_q8_0: q8_0 through the coalesced GEMV, which
 * only q4_0 takes by default (PETREL_CUDA_QGEMV_CO=2), the same checks.
 *
 * matmul_id (mixture of experts): stacks of experts of every format, the
 * same bounds as matmul's GEMV; 128 experts top 8 at 1, 4 and 16 rows
 * (rows sharing experts), 2880 columns (gpt-oss; q4_0 rows not 16-byte
 * aligned), rows of two warp passes.  test_qmatmul_id_invariance: each
 * row of a 9- or 16-row call against the row alone, bit for bit.
 * test_qmatmul_id_mxfp4: gpt-oss's MXFP4 experts, decoded bit for bit as
 * the CPU dequantizes them, and matmul_id against the CPU.
 * test_qmatmul_id_mma: the grouped tensor-core GEMM that takes matmul_id
 * from PETREL_CUDA_MOE_MMA token rows (moe_mma.cu), every format and
 * MXFP4, the bounds above plus 2^-9 S (w and x rounded to f16).
 *
 * embed: rows of each format against the CPU's dequantization, 1e-6
 * relative (the same products; the GPU fuses one multiply-add).
 *
 * The split GEMV (q4_0/q8_0 rewritten at load as each row's codes then its
 * scales, PT_LAYOUT_ROWSPLIT, the CUDA backend's default for rows of 256 * k
 * columns): test_qmatmul_split (the same bounds as the GEMV; odd row
 * counts, partial steps, K split and not, persistent blocks, token tiles;
 * 17 and 40 rows: qmms.cu),
 * test_qbatch_invariance_split (bit for bit), test_qrepack_split (the
 * device's rewrite equals repack.c's, embeddings from it).  The other
 * tests keep the file's layout (tensor parallel ranks, PETREL_CUDA_REPACK=0).
 *
 * Without a CUDA device the test exits 77 (skipped).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <cmocka.h>

#include "backend/backend.h"
#include "backend/cpu/quant_kernels.h"
#include "backend/repack.h"
#include "quant/quant.h"

enum { CPU, GPU, N_BE };
static pt_backend *be[N_BE];
static pt_rng rng;

typedef struct fmt {
    pt_dtype t;
    int bits, group;
    pt_dtype st; /* affine scales */
} fmt;

static const fmt formats[] = {
    {PT_Q8_0, 0, 0, 0},       {PT_Q4_0, 0, 0, 0},         {PT_Q4_K, 0, 0, 0},
    {PT_Q5_K, 0, 0, 0},       {PT_Q6_K, 0, 0, 0},         {PT_AFFINE, 4, 64, PT_BF16},
    {PT_AFFINE, 4, 32, PT_F16}, {PT_AFFINE, 4, 128, PT_F16}, {PT_AFFINE, 8, 64, PT_F16},
    {PT_AFFINE, 8, 32, PT_BF16}, {PT_AFFINE, 8, 128, PT_F16}, {PT_AFFINE, 3, 64, PT_F16},
    {PT_AFFINE, 6, 32, PT_BF16},
};

static const char *fname(const fmt *f, char *buf, size_t n) {
    if (f->t == PT_AFFINE)
        snprintf(buf, n, "affine%dg%d/%s", f->bits, f->group, pt_dtype_name(f->st));
    else
        snprintf(buf, n, "%s", pt_dtype_name(f->t));
    return buf;
}

static int fmt_block(const fmt *f) {
    return f->t == PT_AFFINE ? f->group : pt_dtype_get(f->t)->block;
}

/* A quantized matrix: host bytes, a copy on each backend, and its f32
 * dequantization (host). */
typedef struct qmat {
    pt_weight w[N_BE];
    void *d[N_BE][3];
    size_t nb[3];
    float *deq;
} qmat;

static float frand(float lo, float hi) {
    return lo + (hi - lo) * (float)pt_rng_uniform(&rng);
}

static void *to_backend(int b, const void *h, size_t n) {
    void *d = be[b]->ops->alloc(be[b], n);
    assert_non_null(d);
    be[b]->ops->upload(be[b], d, h, n);
    return d;
}

static qmat qmat_new(const fmt *f, int rows, int cols) {
    qmat m;
    memset(&m, 0, sizeof m);
    size_t n = (size_t)rows * cols;
    float *x = malloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++) x[i] = frand(-1, 1) * (1 + (float)(i % 7)); /* uneven groups */
    void *h[3] = {0};
    if (f->t == PT_AFFINE) {
        m.nb[0] = pt_affine_code_bytes(rows, cols, f->bits);
        m.nb[1] = m.nb[2] = pt_affine_scale_bytes(rows, cols, f->group, f->st);
        for (int i = 0; i < 3; i++) h[i] = calloc(1, m.nb[i]);
        int64_t words = pt_affine_row_words(cols, f->bits), gs = cols / f->group;
        size_t ss = pt_dtype_bytes(f->st, 1);
        for (int r = 0; r < rows; r++)
            pt_affine_quantize_row(x + (size_t)r * cols, cols, f->bits, f->group, f->st,
                                   (uint32_t *)h[0] + r * words, (uint8_t *)h[1] + r * gs * ss,
                                   (uint8_t *)h[2] + r * gs * ss);
    } else {
        m.nb[0] = pt_dtype_bytes(f->t, n);
        h[0] = malloc(m.nb[0]);
        pt_gguf_quantize(f->t, x, h[0], (int64_t)n);
    }
    for (int b = 0; b < N_BE; b++) {
        for (int i = 0; i < 3; i++)
            if (h[i]) m.d[b][i] = to_backend(b, h[i], m.nb[i]);
        m.w[b] = (pt_weight){.dtype = f->t, .rows = rows, .cols = cols, .data = m.d[b][0],
                             .nbytes = m.nb[0] + m.nb[1] + m.nb[2], .bits = f->bits,
                             .group_size = f->group, .scales = m.d[b][1], .biases = m.d[b][2],
                             .scale_dtype = f->st};
    }
    /* the host view, for the dequantized reference */
    pt_weight hw = m.w[CPU];
    hw.data = h[0], hw.scales = h[1], hw.biases = h[2];
    m.deq = malloc(sizeof(float) * n);
    for (int r = 0; r < rows; r++) pt_qk_dequant_row(&hw, r, m.deq + (size_t)r * cols);
    for (int i = 0; i < 3; i++) free(h[i]);
    free(x);
    return m;
}

static void qmat_free(qmat *m) {
    for (int b = 0; b < N_BE; b++)
        for (int i = 0; i < 3; i++)
            if (m->d[b][i]) be[b]->ops->free(be[b], m->d[b][i], m->nb[i]);
    free(m->deq);
}

static float *download(int b, const void *d, size_t n) {
    float *h = malloc(sizeof(float) * n);
    be[b]->ops->download(be[b], h, d, sizeof(float) * n);
    return h;
}

static void one_matmul(const fmt *f, const qmat *m, int n) {
    int rows = (int)m->w[0].rows, cols = (int)m->w[0].cols;
    size_t nx = (size_t)n * cols, ny = (size_t)n * rows;
    float *x = malloc(sizeof(float) * nx), *poison = malloc(sizeof(float) * ny);
    for (size_t i = 0; i < nx; i++) x[i] = frand(-1, 1);
    memset(poison, 0xff, sizeof(float) * ny); /* NaN: an output never written fails */
    void *dx[N_BE], *dy[N_BE];
    for (int b = 0; b < N_BE; b++) {
        dx[b] = to_backend(b, x, sizeof(float) * nx);
        dy[b] = to_backend(b, poison, sizeof(float) * ny);
        pt_be_matmul(be[b], dy[b], dx[b], &m->w[b], n);
    }
    float *yc = download(CPU, dy[CPU], ny), *yg = download(GPU, dy[GPU], ny);
    double u = n <= 16 ? 1e-5 : ldexp(1.0, -9);
    char fb[48];
    for (int t = 0; t < n; t++) {
        const float *xr = x + (size_t)t * cols;
        float xmax = 0;
        for (int k = 0; k < cols; k++) xmax = fmaxf(xmax, fabsf(xr[k]));
        for (int r = 0; r < rows; r++) {
            const float *wr = m->deq + (size_t)r * cols;
            double ref = 0, S = 0, W = 0;
            for (int k = 0; k < cols; k++) {
                ref += (double)wr[k] * xr[k];
                S += fabs((double)wr[k] * xr[k]);
                W += fabs(wr[k]);
            }
            double g = yg[(size_t)t * rows + r], c = yc[(size_t)t * rows + r];
            double tol = u * S + 1e-6 + 1.01 * xmax / 65534 * W, tol_cpu = tol;
            if (!(fabs(g - ref) <= tol))
                fail_msg("matmul %s %dx%d n=%d: y[%d][%d] = %.9g, exact %.9g (bound %.3g)",
                         fname(f, fb, sizeof fb), rows, cols, n, t, r, g, ref, tol);
            if (!(fabs(g - c) <= tol_cpu))
                fail_msg("matmul %s %dx%d n=%d: y[%d][%d] = %.9g, cpu %.9g (bound %.3g)",
                         fname(f, fb, sizeof fb), rows, cols, n, t, r, g, c, tol_cpu);
        }
    }
    for (int b = 0; b < N_BE; b++) {
        be[b]->ops->free(be[b], dx[b], sizeof(float) * nx);
        be[b]->ops->free(be[b], dy[b], sizeof(float) * ny);
    }
    free(x), free(poison), free(yc), free(yg);
}

static void test_qmatmul(void **state) {
    (void)state;
    /* cols: 1 tile; 2 tiles, the second partial (4096 + 512); 3 tiles;
     * 96 (q4_0: 54-byte rows, the plain kernel); 768 (q6_k: 630-byte rows);
     * 20736 (q4_0/q8_0's coalesced GEMV: 11 steps of 2048 columns over 8
     * warps, two per warp, the last partial, through a ring of 1 or 2) */
    static const int shapes[][2] = {{1, 256}, {37, 512}, {301, 4096}, {67, 4608},
                                    {13, 10240}, {40, 96}, {21, 768}, {9, 20736}};
    static const int ns[] = {1, 2, 3, 4, 5, 8, 9, 16, 17, 40};
    char fb[48];
    for (size_t fi = 0; fi < PT_ARRAY_LEN(formats); fi++) {
        const fmt *f = &formats[fi];
        int tested = 0;
        for (size_t si = 0; si < PT_ARRAY_LEN(shapes); si++) {
            int rows = shapes[si][0], cols = shapes[si][1];
            if (cols % fmt_block(f)) continue;
            qmat m = qmat_new(f, rows, cols);
            for (size_t ni = 0; ni < PT_ARRAY_LEN(ns); ni++) one_matmul(f, &m, ns[ni]);
            qmat_free(&m);
            tested++;
        }
        print_message("matmul %s: %d shapes x %zu token counts\n", fname(f, fb, sizeof fb), tested,
                      PT_ARRAY_LEN(ns));
        assert_true(tested >= 4);
    }
}

/* Batch invariance (speculative verification): each row of an n-row
 * matmul on the GPU is the same bits as that row alone, for every format
 * and every n up to 16. */
static void invariant_qmatmul(const fmt *f, const qmat *m, int n) {
    int rows = (int)m->w[0].rows, cols = (int)m->w[0].cols;
    size_t nx = (size_t)n * cols, ny = (size_t)n * rows;
    float *x = malloc(sizeof(float) * nx), *yn = malloc(sizeof(float) * ny),
          *y1 = malloc(sizeof(float) * rows);
    for (size_t i = 0; i < nx; i++) x[i] = frand(-1, 1) * (1 + (float)(i % 5));
    void *dx = to_backend(GPU, x, sizeof(float) * nx), *dy = to_backend(GPU, yn, sizeof(float) * ny);
    pt_be_matmul(be[GPU], dy, dx, &m->w[GPU], n);
    be[GPU]->ops->download(be[GPU], yn, dy, sizeof(float) * ny);
    char fb[48];
    for (int i = 0; i < n; i++) {
        void *dxi = to_backend(GPU, x + (size_t)i * cols, sizeof(float) * cols);
        void *dyi = to_backend(GPU, y1, sizeof(float) * rows);
        pt_be_matmul(be[GPU], dyi, dxi, &m->w[GPU], 1);
        be[GPU]->ops->download(be[GPU], y1, dyi, sizeof(float) * rows);
        if (memcmp(y1, yn + (size_t)i * rows, sizeof(float) * rows)) {
            int r = 0;
            while (y1[r] == yn[(size_t)i * rows + r]) r++;
            fail_msg("matmul %s %dx%d: row %d of %d differs from the row alone at [%d]: %.9g vs %.9g",
                     fname(f, fb, sizeof fb), rows, cols, i, n, r, yn[(size_t)i * rows + r], y1[r]);
        }
        be[GPU]->ops->free(be[GPU], dxi, sizeof(float) * cols);
        be[GPU]->ops->free(be[GPU], dyi, sizeof(float) * rows);
    }
    be[GPU]->ops->free(be[GPU], dx, sizeof(float) * nx);
    be[GPU]->ops->free(be[GPU], dy, sizeof(float) * ny);
    free(x), free(yn), free(y1);
}

static void test_qbatch_invariance(void **state) {
    (void)state;
    static const int shapes[][2] = {{301, 4096}, {67, 4608}, {40, 96}, {9, 20736}};
    static const int ns[] = {2, 5, 9, 16};
    for (size_t fi = 0; fi < PT_ARRAY_LEN(formats); fi++) {
        const fmt *f = &formats[fi];
        for (size_t si = 0; si < PT_ARRAY_LEN(shapes); si++) {
            if (shapes[si][1] % fmt_block(f)) continue;
            qmat m = qmat_new(f, shapes[si][0], shapes[si][1]);
            for (size_t ni = 0; ni < PT_ARRAY_LEN(ns); ni++) invariant_qmatmul(f, &m, ns[ni]);
            qmat_free(&m);
        }
    }
}

/* The GPU copy of m rewritten as the CUDA backend does at load
 * (PT_LAYOUT_ROWSPLIT: each row's codes, then its scales); fails unless it
 * took the layout, so a test cannot pass on the file's layout. */
static void qmat_split(qmat *m) {
    pt_be_repack_weight(be[GPU], &m->w[GPU]);
    assert_int_equal(m->w[GPU].layout, PT_LAYOUT_ROWSPLIT);
}

static void embed_rows(const fmt *f, bool split) {
    char fb[48];
    {
        int rows = 301, cols = 512, n = 19;
        qmat m = qmat_new(f, rows, cols);
        if (split) qmat_split(&m);
        int32_t ids[19];
        for (int i = 0; i < n; i++) ids[i] = (int32_t)(pt_rng_next(&rng) % rows);
        ids[3] = ids[7]; /* a repeat */
        ids[0] = rows - 1;
        size_t ny = (size_t)n * cols;
        float *poison = malloc(sizeof(float) * ny);
        memset(poison, 0xff, sizeof(float) * ny);
        void *di[N_BE], *dy[N_BE];
        for (int b = 0; b < N_BE; b++) {
            di[b] = to_backend(b, ids, sizeof ids);
            dy[b] = to_backend(b, poison, sizeof(float) * ny);
            pt_be_embed(be[b], dy[b], &m.w[b], di[b], n);
        }
        float *yc = download(CPU, dy[CPU], ny), *yg = download(GPU, dy[GPU], ny);
        for (size_t i = 0; i < ny; i++)
            if (!(fabs((double)yg[i] - yc[i]) <= 1e-6 * fabs(yc[i]) + 1e-30))
                fail_msg("embed %s: [%zu][%zu] = %.9g, cpu %.9g", fname(f, fb, sizeof fb),
                         i / cols, i % cols, yg[i], yc[i]);
        for (int b = 0; b < N_BE; b++) {
            be[b]->ops->free(be[b], di[b], sizeof ids);
            be[b]->ops->free(be[b], dy[b], sizeof(float) * ny);
        }
        free(poison), free(yc), free(yg);
        qmat_free(&m);
    }
}

static void test_qembed(void **state) {
    (void)state;
    for (size_t fi = 0; fi < PT_ARRAY_LEN(formats); fi++) embed_rows(&formats[fi], false);
}

/* ---- the split GEMV (q4_0, q8_0 rewritten at load) ----------------------------- */

/* Shapes: one step (q4_0: 32 blocks, q8_0: 16) and less; partial last
 * steps (4352: 136 q4_0 blocks, 5 steps, the last of 8 lanes); K split
 * over 2-8 warps (few rows) and not (2500 and 4500 rows: more warps than
 * 16 an SM, persistent blocks taking several row groups); rows not a
 * multiple of a block's 16; 14336 columns (4 token rows a launch: 5 and 16
 * rows take 2 and 4 launches); gpt-oss's 2880 columns (rows in groups of 4,
 * 3 q4_0 steps, the last of 26 lanes) and 1056 (groups of 8). */
static const int split_shapes[][2] = {{1, 256},    {37, 512},   {301, 4096}, {67, 4608},
                                      {13, 10240}, {21, 768},   {9, 20736},  {5, 4352},
                                      {70, 14336}, {4500, 512}, {2500, 2048}, {260, 2880},
                                      {8, 1056},   {1000, 2880}};
static const fmt *split_formats[] = {&formats[1], &formats[0]}; /* q4_0, q8_0 */

/* Against the double product and the CPU at 1..16 rows (17 and 40: the
 * tensor-core GEMM of qmms.cu reading the split rows). */
static void test_qmatmul_split(void **state) {
    (void)state;
    static const int ns[] = {1, 2, 3, 4, 5, 8, 9, 16, 17, 40};
    char fb[48];
    for (size_t fi = 0; fi < PT_ARRAY_LEN(split_formats); fi++) {
        const fmt *f = split_formats[fi];
        for (size_t si = 0; si < PT_ARRAY_LEN(split_shapes); si++) {
            qmat m = qmat_new(f, split_shapes[si][0], split_shapes[si][1]);
            qmat_split(&m);
            for (size_t ni = 0; ni < PT_ARRAY_LEN(ns); ni++) one_matmul(f, &m, ns[ni]);
            qmat_free(&m);
        }
        print_message("split matmul %s: %zu shapes x %zu token counts\n", fname(f, fb, sizeof fb),
                      PT_ARRAY_LEN(split_shapes), PT_ARRAY_LEN(ns));
    }
}

/* Each row of 2..16-row calls bit for bit the row alone (the token tiles
 * of 14336 columns included). */
static void test_qbatch_invariance_split(void **state) {
    (void)state;
    static const int ns[] = {2, 5, 9, 16};
    for (size_t fi = 0; fi < PT_ARRAY_LEN(split_formats); fi++)
        for (size_t si = 0; si < PT_ARRAY_LEN(split_shapes); si++) {
            if (split_shapes[si][0] > 2000) continue; /* n + 1 calls each: long enough below */
            qmat m = qmat_new(split_formats[fi], split_shapes[si][0], split_shapes[si][1]);
            qmat_split(&m);
            for (size_t ni = 0; ni < PT_ARRAY_LEN(ns); ni++)
                invariant_qmatmul(split_formats[fi], &m, ns[ni]);
            qmat_free(&m);
        }
}

/* The device's rewrite, byte for byte the host's (repack.c), and the
 * embedding rows read from it. */
static void test_qrepack_split(void **state) {
    (void)state;
    for (size_t fi = 0; fi < PT_ARRAY_LEN(split_formats); fi++) {
        const fmt *f = split_formats[fi];
        static const int shapes[][2] = {{37, 512}, {3, 4352}, {1, 256}, {12, 2880}, {16, 1056}};
        for (size_t si = 0; si < PT_ARRAY_LEN(shapes); si++) {
            qmat m = qmat_new(f, shapes[si][0], shapes[si][1]);
            size_t nb = m.nb[0];
            uint8_t *file = malloc(nb), *want = malloc(nb), *got = malloc(nb);
            be[GPU]->ops->download(be[GPU], file, m.d[GPU][0], nb);
            qmat_split(&m);
            be[GPU]->ops->download(be[GPU], got, m.d[GPU][0], nb);
            pt_rowsplit_repack(want, file, f->t, shapes[si][0], shapes[si][1]);
            assert_memory_equal(got, want, nb);
            assert_memory_not_equal(got, file, nb);
            free(file), free(want), free(got);
            qmat_free(&m);
        }
        embed_rows(f, true);
    }
}

/* k distinct experts per row, drawn at random (rows share experts). */
static void random_ids(int32_t *ids, int n, int k, int E) {
    for (int t = 0; t < n; t++)
        for (int j = 0; j < k; j++) {
            bool dup;
            do {
                ids[t * k + j] = (int32_t)(pt_rng_next(&rng) % (uint64_t)E);
                dup = false;
                for (int i = 0; i < j; i++) dup |= ids[t * k + i] == ids[t * k + j];
            } while (dup);
        }
}

/* matmul_id over a stack of quantized experts (a tall matrix of E * R
 * rows cut into E experts of R), against the double-precision product of
 * the dequantized experts and the CPU backend, with one_matmul's bounds
 * (the GPU decodes to f32 and sums in f32: u = 1e-5). */
/* The grouped GEMM's test (moe_mma.cu): its f16 rounding (id_f16 S more
 * in each bound), and a second backend whose outputs are counted where
 * they differ (id_other: the exact kernels). */
static double id_f16;
static pt_backend *id_other;
static size_t id_differ;

static void one_qmatmul_id(const fmt *f, int E, int R, int cols, int n, int k, int x_slots,
                           bool rand_ids) {
    qmat m = qmat_new(f, E * R, cols);
    size_t nx = (size_t)n * x_slots * cols, ny = (size_t)n * k * R;
    float *x = malloc(sizeof(float) * nx), *poison = malloc(sizeof(float) * ny);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)n * k);
    for (size_t i = 0; i < nx; i++) x[i] = frand(-1, 1);
    memset(poison, 0xff, sizeof(float) * ny);
    for (int t = 0; t < n; t++) /* k distinct experts per row, the last one always chosen once */
        for (int j = 0; j < k; j++) ids[t * k + j] = (int32_t)((t + 2 * j + (t == 0 && j == 0 ? E - 1 : 0)) % E);
    if (rand_ids) /* a router's choice: distinct in a row, rows sharing experts */
        random_ids(ids, n, k, E);
    void *dx[N_BE], *dy[N_BE], *di[N_BE];
    for (int b = 0; b < N_BE; b++) {
        pt_weight w = m.w[b];
        w.rows = R, w.n_experts = E, w.expert_stride = m.nb[0] / (size_t)E;
        dx[b] = to_backend(b, x, sizeof(float) * nx);
        dy[b] = to_backend(b, poison, sizeof(float) * ny);
        di[b] = to_backend(b, ids, sizeof(int32_t) * (size_t)n * k);
        pt_be_matmul_id(be[b], dy[b], dx[b], &w, di[b], n, k, x_slots);
    }
    float *yc = download(CPU, dy[CPU], ny), *yg = download(GPU, dy[GPU], ny);
    if (id_other) {
        pt_weight w = m.w[GPU];
        w.rows = R, w.n_experts = E, w.expert_stride = m.nb[0] / (size_t)E;
        void *d2 = to_backend(GPU, poison, sizeof(float) * ny);
        pt_be_matmul_id(id_other, d2, dx[GPU], &w, di[GPU], n, k, x_slots);
        float *y2 = malloc(sizeof(float) * ny);
        id_other->ops->download(id_other, y2, d2, sizeof(float) * ny);
        for (size_t i = 0; i < ny; i++) id_differ += memcmp(&y2[i], &yg[i], sizeof(float)) != 0;
        be[GPU]->ops->free(be[GPU], d2, sizeof(float) * ny);
        free(y2);
    }
    char fb[48];
    for (int t = 0; t < n; t++)
        for (int j = 0; j < k; j++) {
            const float *xr = x + ((size_t)t * x_slots + (x_slots > 1 ? j : 0)) * cols;
            float xmax = 0;
            for (int c = 0; c < cols; c++) xmax = fmaxf(xmax, fabsf(xr[c]));
            for (int r = 0; r < R; r++) {
                const float *wr = m.deq + ((size_t)ids[t * k + j] * R + r) * cols;
                double ref = 0, S = 0, W = 0;
                for (int c = 0; c < cols; c++) {
                    ref += (double)wr[c] * xr[c];
                    S += fabs((double)wr[c] * xr[c]);
                    W += fabs(wr[c]);
                }
                size_t o = ((size_t)t * k + j) * R + r;
                double tol = (1e-5 + id_f16) * S + 1e-6 + 1.01 * xmax / 65534 * W;
                if (!(fabs(yg[o] - ref) <= tol) || !(fabs((double)yg[o] - yc[o]) <= tol))
                    fail_msg("matmul_id %s E=%d %dx%d n=%d k=%d: y[%d][%d][%d] = %.9g, exact %.9g, "
                             "cpu %.9g (bound %.3g)", fname(f, fb, sizeof fb), E, R, cols, n, k, t,
                             j, r, yg[o], ref, yc[o], tol);
            }
        }
    for (int b = 0; b < N_BE; b++) {
        be[b]->ops->free(be[b], dx[b], sizeof(float) * nx);
        be[b]->ops->free(be[b], dy[b], sizeof(float) * ny);
        be[b]->ops->free(be[b], di[b], sizeof(int32_t) * (size_t)n * k);
    }
    free(x), free(poison), free(ids), free(yc), free(yg);
    qmat_free(&m);
}

/* matmul_id on the GPU alone: each token row of an n-row call (rows
 * sharing experts) against the same row computed alone, bit for bit. */
static void invariant_qmatmul_id(const fmt *f, int E, int R, int cols, int n, int k) {
    qmat m = qmat_new(f, E * R, cols);
    pt_weight w = m.w[GPU];
    w.rows = R, w.n_experts = E, w.expert_stride = m.nb[0] / (size_t)E;
    size_t nx = (size_t)n * cols, ny = (size_t)n * k * R;
    float *x = malloc(sizeof(float) * nx), *poison = malloc(sizeof(float) * ny);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)n * k);
    for (size_t i = 0; i < nx; i++) x[i] = frand(-1, 1);
    memset(poison, 0xff, sizeof(float) * ny);
    random_ids(ids, n, k, E);
    void *dx = to_backend(GPU, x, sizeof(float) * nx), *dy = to_backend(GPU, poison, sizeof(float) * ny);
    void *di = to_backend(GPU, ids, sizeof(int32_t) * (size_t)n * k);
    pt_be_matmul_id(be[GPU], dy, dx, &w, di, n, k, 1);
    float *yn = download(GPU, dy, ny);
    char fb[48];
    for (int t = 0; t < n; t++) {
        void *dxt = to_backend(GPU, x + (size_t)t * cols, sizeof(float) * cols);
        void *dyt = to_backend(GPU, poison, sizeof(float) * k * R);
        void *dit = to_backend(GPU, ids + (size_t)t * k, sizeof(int32_t) * k);
        pt_be_matmul_id(be[GPU], dyt, dxt, &w, dit, 1, k, 1);
        float *y1 = download(GPU, dyt, (size_t)k * R);
        for (int i = 0; i < k * R; i++)
            if (memcmp(&y1[i], &yn[(size_t)t * k * R + i], sizeof(float)))
                fail_msg("matmul_id %s E=%d %dx%d: row %d of %d, [%d] = %.9g alone, %.9g in the batch",
                         fname(f, fb, sizeof fb), E, R, cols, t, n, i, y1[i], yn[(size_t)t * k * R + i]);
        free(y1);
        be[GPU]->ops->free(be[GPU], dxt, sizeof(float) * cols);
        be[GPU]->ops->free(be[GPU], dyt, sizeof(float) * k * R);
        be[GPU]->ops->free(be[GPU], dit, sizeof(int32_t) * k);
    }
    be[GPU]->ops->free(be[GPU], dx, sizeof(float) * nx);
    be[GPU]->ops->free(be[GPU], dy, sizeof(float) * ny);
    be[GPU]->ops->free(be[GPU], di, sizeof(int32_t) * (size_t)n * k);
    free(x), free(poison), free(ids), free(yn);
    qmat_free(&m);
}

static void test_qmatmul_id(void **state) {
    (void)state;
    for (size_t fi = 0; fi < PT_ARRAY_LEN(formats); fi++) {
        const fmt *f = &formats[fi];
        one_qmatmul_id(f, 5, 37, 512, 1, 2, 1, false);  /* decode */
        one_qmatmul_id(f, 5, 37, 512, 1, 2, 2, false);  /* an input per slot (down projection) */
        one_qmatmul_id(f, 6, 20, 256, 30, 3, 1, false); /* prefill: many pairs per expert */
        if (96 % fmt_block(f) == 0) one_qmatmul_id(f, 4, 9, 96, 3, 2, 1, false); /* 2-byte aligned experts */
        one_qmatmul_id(f, 3, 24, 4096, 15, 2, 1, false); /* two warp passes per row, two pair groups */
        /* 128 experts, top 8, decode-sized batches (16: rows share experts) */
        one_qmatmul_id(f, 128, 16, 512, 1, 8, 1, true);
        one_qmatmul_id(f, 128, 16, 512, 4, 8, 8, true);
        one_qmatmul_id(f, 128, 16, 512, 16, 8, 1, true);
        if (2880 % fmt_block(f) == 0) { /* gpt-oss: 2880 columns, rows not 16-byte aligned in q4_0 */
            one_qmatmul_id(f, 32, 12, 2880, 1, 4, 1, true);
            one_qmatmul_id(f, 32, 12, 2880, 5, 4, 4, true);
        }
    }
}

/* A stack of E MXFP4 experts [R][cols] on every backend: random codes,
 * scale bytes e0 .. e0 + span - 1 (2^(e - 128)); deq gets the CPU's
 * dequantization (embed of the stack as a table). */
typedef struct mxfp4_stack {
    uint8_t *host;
    size_t nb;
    void *dw[N_BE];
    pt_weight w[N_BE];
    float *deq;
} mxfp4_stack;

static mxfp4_stack mxfp4_new(int E, int R, int cols, int e0, int span) {
    mxfp4_stack m;
    const size_t row_bytes = (size_t)cols / 32 * 17;
    m.nb = (size_t)E * R * row_bytes;
    m.host = malloc(m.nb);
    for (size_t i = 0; i < m.nb; i++) m.host[i] = (uint8_t)pt_rng_next(&rng);
    for (size_t i = 0; i < m.nb; i += 17) m.host[i] = (uint8_t)(e0 + pt_rng_next(&rng) % (uint64_t)span);
    for (int b = 0; b < N_BE; b++) {
        m.dw[b] = to_backend(b, m.host, m.nb);
        m.w[b] = (pt_weight){.dtype = PT_MXFP4, .rows = R, .cols = cols, .data = m.dw[b],
                             .nbytes = m.nb, .n_experts = E, .expert_stride = (size_t)R * row_bytes};
    }
    int nt = E * R;
    int32_t *tid = malloc(sizeof(int32_t) * (size_t)nt);
    for (int i = 0; i < nt; i++) tid[i] = i;
    pt_weight table = {.dtype = PT_MXFP4, .rows = nt, .cols = cols, .data = m.dw[CPU], .nbytes = m.nb};
    void *dti = to_backend(CPU, tid, sizeof(int32_t) * (size_t)nt);
    void *ddq = be[CPU]->ops->alloc(be[CPU], sizeof(float) * (size_t)nt * cols);
    pt_be_embed(be[CPU], ddq, &table, dti, nt);
    m.deq = download(CPU, ddq, (size_t)nt * cols);
    be[CPU]->ops->free(be[CPU], dti, sizeof(int32_t) * (size_t)nt);
    be[CPU]->ops->free(be[CPU], ddq, sizeof(float) * (size_t)nt * cols);
    free(tid);
    return m;
}

static void mxfp4_free(mxfp4_stack *m) {
    for (int b = 0; b < N_BE; b++) be[b]->ops->free(be[b], m->dw[b], m->nb);
    free(m->host), free(m->deq);
}

/* matmul_id of n random rows, top k, on every backend: the GPU against
 * the CPU with one_qmatmul_id's bound (id_f16 included). */
static void mxfp4_rows(const mxfp4_stack *m, int n, int k) {
    const int E = (int)m->w[GPU].n_experts, R = (int)m->w[GPU].rows, cols = (int)m->w[GPU].cols;
    size_t nx = (size_t)n * cols, ny = (size_t)n * k * R;
    float *x = malloc(sizeof(float) * nx), *poison = malloc(sizeof(float) * ny);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)n * k);
    for (size_t i = 0; i < nx; i++) x[i] = frand(-1, 1);
    memset(poison, 0xff, sizeof(float) * ny);
    random_ids(ids, n, k, E);
    void *bx[N_BE], *by[N_BE], *bi[N_BE];
    for (int b = 0; b < N_BE; b++) {
        bx[b] = to_backend(b, x, sizeof(float) * nx);
        by[b] = to_backend(b, poison, sizeof(float) * ny);
        bi[b] = to_backend(b, ids, sizeof(int32_t) * (size_t)n * k);
        pt_be_matmul_id(be[b], by[b], bx[b], &m->w[b], bi[b], n, k, 1);
    }
    float *yc = download(CPU, by[CPU], ny), *yg = download(GPU, by[GPU], ny);
    for (int t = 0; t < n; t++)
        for (int j = 0; j < k; j++) {
            const float *xr = x + (size_t)t * cols;
            float xmax = 0;
            for (int c = 0; c < cols; c++) xmax = fmaxf(xmax, fabsf(xr[c]));
            for (int r = 0; r < R; r++) {
                const float *wr = m->deq + ((size_t)ids[t * k + j] * R + r) * cols;
                double S = 0, W = 0;
                for (int c = 0; c < cols; c++) S += fabs((double)wr[c] * xr[c]), W += fabs(wr[c]);
                size_t o = ((size_t)t * k + j) * R + r;
                double tol = (1e-5 + id_f16) * S + 1e-6 + 1.01 * xmax / 65534 * W;
                if (!(fabs((double)yg[o] - yc[o]) <= tol))
                    fail_msg("matmul_id mxfp4 E=%d %dx%d n=%d: y[%d][%d][%d] = %.9g, cpu %.9g", E,
                             R, cols, n, t, j, r, yg[o], yc[o]);
            }
        }
    for (int b = 0; b < N_BE; b++) {
        be[b]->ops->free(be[b], bx[b], sizeof(float) * nx);
        be[b]->ops->free(be[b], by[b], sizeof(float) * ny);
        be[b]->ops->free(be[b], bi[b], sizeof(int32_t) * (size_t)n * k);
    }
    free(x), free(poison), free(ids), free(yc), free(yg);
}

/* MXFP4 experts (gpt-oss), random codes and scales 2^-28 .. 2^22.
 * Decoding, bit for bit: x row t = 32767 at column t, 0 elsewhere, every
 * row choosing every expert, so y[t][j][r] = 32767 * W_j[r][t] exactly
 * (the activation scale is 1, every other term an exact 0), against the
 * CPU's dequantization (embed of the stack as a table).  Then random x
 * against the CPU's matmul_id with one_qmatmul_id's bound. */
static void one_mxfp4(int E, int R, int cols) {
    mxfp4_stack m = mxfp4_new(E, R, cols, 100, 51);
    int n = cols, k = E;
    size_t nx = (size_t)n * cols, ny = (size_t)n * k * R;
    float *x = calloc(nx, sizeof(float)), *poison = malloc(sizeof(float) * ny);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)n * k);
    for (int t = 0; t < n; t++) {
        x[(size_t)t * cols + t] = 32767.f;
        for (int j = 0; j < k; j++) ids[t * k + j] = j;
    }
    memset(poison, 0xff, sizeof(float) * ny);
    void *dx = to_backend(GPU, x, sizeof(float) * nx), *dy = to_backend(GPU, poison, sizeof(float) * ny);
    void *di = to_backend(GPU, ids, sizeof(int32_t) * (size_t)n * k);
    pt_be_matmul_id(be[GPU], dy, dx, &m.w[GPU], di, n, k, 1);
    float *yg = download(GPU, dy, ny);
    for (int t = 0; t < n; t++)
        for (int j = 0; j < k; j++)
            for (int r = 0; r < R; r++) {
                float want = 32767.f * m.deq[((size_t)j * R + r) * cols + t];
                float got = yg[((size_t)t * k + j) * R + r];
                if (!(got == want))
                    fail_msg("mxfp4 decode E=%d %dx%d: expert %d [%d][%d] = %.9g, cpu %.9g", E, R,
                             cols, j, r, t, got / 32767.f, want / 32767.f);
            }
    be[GPU]->ops->free(be[GPU], dx, sizeof(float) * nx);
    be[GPU]->ops->free(be[GPU], dy, sizeof(float) * ny);
    be[GPU]->ops->free(be[GPU], di, sizeof(int32_t) * (size_t)n * k);
    free(yg), free(ids), free(poison), free(x);
    static const int ns[] = {1, 5, 16};
    for (size_t ni = 0; ni < PT_ARRAY_LEN(ns); ni++) mxfp4_rows(&m, ns[ni], E < 4 ? E : 4);
    mxfp4_free(&m);
}

static void test_qmatmul_id_mxfp4(void **state) {
    (void)state;
    one_mxfp4(4, 8, 96);    /* rows of 51 bytes: odd addresses */
    one_mxfp4(3, 5, 2880);  /* gpt-oss's width: two warp passes */
    one_mxfp4(32, 6, 2880); /* 32 experts, top 4 */
}

/* MXFP4 experts on the grouped GEMM: scales 2^-10 .. 2^2 (f16 holds every
 * product), random rows with the f16 bound (id_f16). */
static void one_mxfp4_mma(int E, int R, int cols, int n, int k) {
    mxfp4_stack m = mxfp4_new(E, R, cols, 118, 13);
    mxfp4_rows(&m, n, k);
    mxfp4_free(&m);
}

/* The grouped GEMM (moe_mma.cu) on a backend that takes it from one row
 * (PETREL_CUDA_MOE_MMA=1; the other tests keep the exact kernels, =0):
 * every format against the double product and the CPU with the f16
 * bound, experts of one pair to several 64-pair tiles, weight rows not a
 * multiple of its 128-row tiles, a tail step of 32 columns (96), an input
 * per slot (the down projection), gpt-oss's 2880 columns; and the results
 * must differ from the exact kernels' somewhere, or it did not run. */
static void test_qmatmul_id_mma(void **state) {
    (void)state;
    pt_err err = {{0}};
    setenv("PETREL_CUDA_MOE_MMA", "1", 1);
    pt_backend *on = pt_backend_cuda_new(0, &err), *off = be[GPU];
    unsetenv("PETREL_CUDA_MOE_MMA");
    assert_non_null(on);
    be[GPU] = on, id_other = off, id_f16 = 1.0 / 512;
    for (size_t fi = 0; fi < PT_ARRAY_LEN(formats); fi++) {
        const fmt *f = &formats[fi];
        id_differ = 0;
        one_qmatmul_id(f, 5, 37, 512, 1, 2, 1, false);   /* one pair per expert */
        one_qmatmul_id(f, 6, 20, 256, 30, 3, 1, false);  /* 15 pairs per expert */
        one_qmatmul_id(f, 4, 130, 512, 150, 2, 1, true); /* ~75: two tiles; two row tiles */
        one_qmatmul_id(f, 4, 150, 512, 40, 2, 2, true);  /* an input per slot */
        one_qmatmul_id(f, 128, 16, 512, 64, 8, 1, true); /* Qwen3-MoE's routing */
        if (96 % fmt_block(f) == 0) one_qmatmul_id(f, 4, 9, 96, 40, 2, 1, true);
        if (2880 % fmt_block(f) == 0) one_qmatmul_id(f, 32, 12, 2880, 33, 4, 4, true);
        char fb[48];
        print_message("matmul_id grouped %s: %zu outputs differ from the exact kernels\n",
                      fname(f, fb, sizeof fb), id_differ);
        assert_true(id_differ > 0);
    }
    one_mxfp4_mma(8, 20, 2880, 40, 4);
    one_mxfp4_mma(4, 130, 96, 70, 2);
    be[GPU] = off, id_other = NULL, id_f16 = 0;
    on->ops->destroy(on);
}

/* Rows sharing experts: a pair's bits do not depend on the other pairs. */
static void test_qmatmul_id_invariance(void **state) {
    (void)state;
    for (size_t fi = 0; fi < PT_ARRAY_LEN(formats); fi++) {
        const fmt *f = &formats[fi];
        invariant_qmatmul_id(f, 16, 24, 512, 9, 4);
        if (2880 % fmt_block(f) == 0) invariant_qmatmul_id(f, 8, 8, 2880, 16, 2);
    }
}

/* The coalesced GEMV takes q4_0 by default and q8_0 only when asked
 * (PETREL_CUDA_QGEMV_CO=2): q8_0 through it, on a second GPU backend
 * standing in for the first, against the CPU and bit-invariant in n. */
static void test_qmatmul_coalesced_q8_0(void **state) {
    (void)state;
    pt_err err = {{0}};
    setenv("PETREL_CUDA_QGEMV_CO", "2", 1);
    pt_backend *co = pt_backend_cuda_new(0, &err), *saved = be[GPU];
    unsetenv("PETREL_CUDA_QGEMV_CO");
    assert_non_null(co);
    be[GPU] = co;
    static const int shapes[][2] = {{37, 512}, {301, 4096}, {67, 4608}, {9, 20736}};
    static const int ns[] = {1, 2, 3, 5, 9, 16};
    const fmt *f = &formats[0]; /* q8_0 */
    for (size_t si = 0; si < PT_ARRAY_LEN(shapes); si++) {
        qmat m = qmat_new(f, shapes[si][0], shapes[si][1]);
        for (size_t ni = 0; ni < PT_ARRAY_LEN(ns); ni++) one_matmul(f, &m, ns[ni]);
        for (size_t ni = 1; ni < PT_ARRAY_LEN(ns); ni++) invariant_qmatmul(f, &m, ns[ni]);
        qmat_free(&m);
    }
    be[GPU] = saved;
    co->ops->destroy(co);
}

/* Outputs of an n-row matmul that differ between be[GPU] and `other`. */
static size_t count_differing(const qmat *m, int n, pt_backend *other) {
    int rows = (int)m->w[GPU].rows, cols = (int)m->w[GPU].cols;
    size_t nx = (size_t)n * cols, ny = (size_t)n * rows;
    float *x = malloc(sizeof(float) * nx);
    for (size_t i = 0; i < nx; i++)
        x[i] = frand(-1, 1);
    void *dx = to_backend(GPU, x, sizeof(float) * nx);
    void *y1 = be[GPU]->ops->alloc(be[GPU], sizeof(float) * ny);
    void *y2 = be[GPU]->ops->alloc(be[GPU], sizeof(float) * ny);
    pt_be_matmul(be[GPU], y1, dx, &m->w[GPU], n);
    float *h1 = download(GPU, y1, ny);
    pt_be_matmul(other, y2, dx, &m->w[GPU], n); /* same device: same pointers */
    float *h2 = malloc(sizeof(float) * ny);
    other->ops->download(other, h2, y2, sizeof(float) * ny);
    size_t diff = 0;
    for (size_t i = 0; i < ny; i++)
        diff += h1[i] != h2[i];
    be[GPU]->ops->free(be[GPU], dx, sizeof(float) * nx);
    be[GPU]->ops->free(be[GPU], y1, sizeof(float) * ny);
    be[GPU]->ops->free(be[GPU], y2, sizeof(float) * ny);
    free(x), free(h1), free(h2);
    return diff;
}

static void test_qmma(void **state) {
    (void)state;
    pt_err err = {{0}};
    setenv("PETREL_CUDA_QMMA", "1", 1); /* off by default: a backend with it */
    pt_backend *on = pt_backend_cuda_new(0, &err), *off = be[GPU];
    unsetenv("PETREL_CUDA_QMMA");
    assert_non_null(on);
    be[GPU] = on;
    /* rows, cols, token counts (0 ends): 300 rows = one full and one
     * partial 256-row tile, 16 K stages split over blocks; 2880 columns:
     * 1620-byte q4_0 rows (4-byte aligned), 11.25 stages; 1056: 594-byte
     * rows (2-byte aligned), one full and one 1-block stage; 40000 rows of
     * 256: 157 row tiles, one stage, no split */
    static const struct {
        int rows, cols, ns[8];
    } cases[] = {
        {300, 4096, {17, 33, 64, 100, 256, 257, 0}},
        {260, 2880, {17, 31, 64, 65, 0}},
        {37, 1056, {17, 40, 200, 0}},
        {513, 512, {24, 64, 129, 0}},
        {40000, 256, {17, 64, 0}},
    };
    const fmt *fs[] = {&formats[1], &formats[0]}; /* q4_0, q8_0 */
    char fb[48];
    for (size_t fi = 0; fi < PT_ARRAY_LEN(fs); fi++) {
        size_t differ = 0;
        for (size_t ci = 0; ci < PT_ARRAY_LEN(cases); ci++) {
            qmat m = qmat_new(fs[fi], cases[ci].rows, cases[ci].cols);
            for (int i = 0; cases[ci].ns[i]; i++)
                one_matmul(fs[fi], &m, cases[ci].ns[i]);
            size_t d = count_differing(&m, cases[ci].ns[0], off);
            print_message("qmma %s %dx%d: %zu of %d outputs differ from the cuBLAS path\n",
                          fname(fs[fi], fb, sizeof fb), cases[ci].rows, cases[ci].cols, d,
                          cases[ci].rows * cases[ci].ns[0]);
            differ += d;
            qmat_free(&m);
        }
        /* K = 256 is one stage of 16 mma steps, which may sum exactly as
         * cuBLAS does (H200: 0 of 680000 differed), so only the format's
         * cases together must show the kernel ran */
        assert_true(differ > 0);
    }
    be[GPU] = off;
    on->ops->destroy(on);
}

/* The split layout's tensor-core GEMM (qmms.cu), the default for q4_0 and
 * q8_0 past 16 token rows: on a backend that takes it at every row count
 * (PETREL_CUDA_QMMS_MAX), against the double product and the CPU with the
 * cuBLAS path's bound (w and x rounded to f16: 2^-9 S), outputs poisoned
 * first.  Cases: 300 rows (one full and one partial 256-row tile; K split
 * over a cluster of 8), 2880 columns (gpt-oss: rows in groups of 4, 22.5
 * chunks of 128, the last half empty), 1056 (groups of 8, 8.25 chunks),
 * 14336 (w_down's), 40000 x 256 (157 row tiles: no K split), 4500 rows of
 * 512 (18 tiles, K split over 4); token rows of 32 and 64 a tile, 17, 40,
 * 64, 130, 256 and others not a multiple of a tile, and 512 (a prefill).
 * Each format's cases must differ from the cuBLAS path somewhere, or the
 * test did not run the kernel. */
static void test_qmms(void **state) {
    (void)state;
    pt_err err = {{0}};
    setenv("PETREL_CUDA_QMMS", "0", 1);
    pt_backend *off = pt_backend_cuda_new(0, &err), *saved = be[GPU];
    unsetenv("PETREL_CUDA_QMMS");
    assert_non_null(off);
    static const struct {
        int rows, cols, ns[8];
    } cases[] = {
        {300, 4096, {17, 40, 64, 130, 256, 512, 0}},
        {260, 2880, {17, 33, 64, 130, 0}},
        {40, 1056, {17, 40, 200, 0}},
        {70, 14336, {17, 64, 0}},
        {40000, 256, {17, 64, 0}},
        {4500, 512, {40, 256, 0}},
    };
    char fb[48];
    /* both tilings: two m16 tiles a warp (q8_0's default) and one (q4_0's) */
    for (int mt = 2; mt >= 1; mt--) {
        setenv("PETREL_CUDA_QMMS_MAX", "100000", 1);
        setenv("PETREL_CUDA_QMMS_MT", mt == 2 ? "2" : "1", 1);
        pt_backend *on = pt_backend_cuda_new(0, &err);
        unsetenv("PETREL_CUDA_QMMS_MAX");
        unsetenv("PETREL_CUDA_QMMS_MT");
        assert_non_null(on);
        be[GPU] = on;
        for (size_t fi = 0; fi < PT_ARRAY_LEN(split_formats); fi++) {
            const fmt *f = split_formats[fi];
            size_t differ = 0;
            for (size_t ci = 0; ci < PT_ARRAY_LEN(cases); ci++) {
                qmat m = qmat_new(f, cases[ci].rows, cases[ci].cols);
                pt_be_repack_weight(on, &m.w[GPU]);
                assert_int_equal(m.w[GPU].layout, PT_LAYOUT_ROWSPLIT);
                for (int i = 0; cases[ci].ns[i]; i++)
                    one_matmul(f, &m, cases[ci].ns[i]);
                size_t d = count_differing(&m, cases[ci].ns[0], off);
                print_message("qmms (%d m-tiles a warp) %s %dx%d: %zu of %d outputs differ from "
                              "the cuBLAS path\n",
                              mt, fname(f, fb, sizeof fb), cases[ci].rows, cases[ci].cols, d,
                              cases[ci].rows * cases[ci].ns[0]);
                differ += d;
                qmat_free(&m);
            }
            assert_true(differ > 0);
        }
        be[GPU] = saved;
        on->ops->destroy(on);
    }
    off->ops->destroy(off);
}

int main(void) {
    pt_err err = {{0}};
    /* GEMV up to 16 rows: the default; matmul_id's exact kernels at every
     * row count (test_qmatmul_id_mma makes its own backend) */
    setenv("PETREL_CUDA_MOE_MMA", "0", 1);
    be[GPU] = pt_backend_cuda_new(0, &err);
    unsetenv("PETREL_CUDA_MOE_MMA");
    if (!be[GPU]) {
        printf("test_cuda_qmatmul: skipped: %s\n", err.msg);
        fflush(stdout);
        _exit(77); /* not exit(): leak checkers would count the runtime's buffers */
    }
    /* the GEMV copies the CPU's int16 kernels; the CPU's int8 prefill GEMM
     * (8+ rows) rounds otherwise, so the reference stays on int16 */
    setenv("PETREL_CPU_INT8", "0", 1);
    be[CPU] = pt_backend_cpu_new(4, "auto", &err);
    if (!be[CPU]) {
        fprintf(stderr, "test_cuda_qmatmul: %s\n", err.msg);
        return 1;
    }
    pt_rng_seed(&rng, 4242);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_qmatmul),
        cmocka_unit_test(test_qbatch_invariance),
        cmocka_unit_test(test_qmatmul_coalesced_q8_0),
        cmocka_unit_test(test_qmma),
        cmocka_unit_test(test_qmms),
        cmocka_unit_test(test_qembed),
        cmocka_unit_test(test_qmatmul_split),
        cmocka_unit_test(test_qbatch_invariance_split),
        cmocka_unit_test(test_qrepack_split),
        cmocka_unit_test(test_qmatmul_id),
        cmocka_unit_test(test_qmatmul_id_invariance),
        cmocka_unit_test(test_qmatmul_id_mxfp4),
        cmocka_unit_test(test_qmatmul_id_mma),
    };
    /* CMOCKA_FILTER / CMOCKA_SKIP (patterns with * and ?): a subset, for
     * short device runs */
    if (getenv("CMOCKA_FILTER")) cmocka_set_test_filter(getenv("CMOCKA_FILTER"));
    if (getenv("CMOCKA_SKIP")) cmocka_set_skip_filter(getenv("CMOCKA_SKIP"));
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    for (int b = 0; b < N_BE; b++) be[b]->ops->destroy(be[b]);
    return rc;
}
