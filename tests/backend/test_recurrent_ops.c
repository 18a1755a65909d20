/*
 * test_recurrent_ops.c - the CPU ops of hybrid recurrent layers (Gated
 * DeltaNet) against double precision references written here from the
 * definitions, not from the kernels:
 *
 *   conv1d_silu   the convolution over the whole history of each sequence,
 *                 zero before position 0 (no tail state at all);
 *   gated_delta   the state update in matrix form,
 *                 S' = (I - beta k kᵀ) (e^g S) + beta k vᵀ,  out = S'ᵀ q,
 *                 over the whole history (the kernel's order differs),
 *                 token by token and in the chunkwise form (chunks of 4,
 *                 16 and 64 rows, a chunk continuing an earlier state),
 *                 with value heads grouped or tiled over key heads and
 *                 either l2norm epsilon;
 *   rmsnorm_gated, gather_cols, sigmoid_mul element by element.
 *
 * State ops are run the way the engine runs them: a prefill of several rows
 * of two interleaved sequences in one call, then decode calls of one row
 * each, and a sequence restarted at position 0 on a slot full of another
 * sequence's state (which must be ignored).  1 and 3 threads.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

#include "backend/backend.h"

static pt_rng rng;

static float rnd(double scale) {
    return (float)((pt_rng_uniform(&rng) * 2 - 1) * scale);
}

static double sigm(double x) {
    return 1.0 / (1.0 + exp(-x));
}

static void check_close(const float *got, const double *want, size_t n, double tol,
                        const char *what) {
    for (size_t i = 0; i < n; i++) {
        double d = fabs(got[i] - want[i]);
        if (!(d <= tol * (1.0 + fabs(want[i]))))
            fail_msg("%s: element %zu is %.8g, reference %.8g", what, i, got[i], want[i]);
    }
}

/* ---- conv1d_silu ---------------------------------------------------------------- */

enum { C = 37, K = 4, T = 9 };

/* y of sequence input u [T][C] at time t, all history, zero before 0. */
static double conv_ref(const float *u, const float *w, int t, int c) {
    double acc = 0;
    for (int j = 0; j < K; j++) {
        int s = t - (K - 1) + j;
        if (s >= 0) acc += (double)w[c * K + j] * u[s * C + c];
    }
    return acc * sigm(acc);
}

static void test_conv1d(void **state) {
    (void)state;
    for (int threads = 1; threads <= 3; threads += 2) {
        pt_err err;
        pt_backend *be = pt_backend_cpu_new(threads, "auto", &err);
        assert_non_null(be);
        float w[C * K], u[2][T * C], st[3 * (K - 1) * C], y[T * 2 * C], x[T * 2 * C];
        for (int i = 0; i < C * K; i++) w[i] = rnd(1);
        for (int s = 0; s < 2; s++)
            for (int i = 0; i < T * C; i++) u[s][i] = rnd(2);
        for (size_t i = 0; i < PT_ARRAY_LEN(st); i++) st[i] = 1e3f; /* garbage: pos 0 ignores it */
        int32_t slots[2] = {2, 0}; /* sequence 0 in slot 2, sequence 1 in slot 0 */
        /* prefill: 5 rows of each sequence, interleaved */
        int32_t pos[T * 2], seq[T * 2];
        int n = 0;
        for (int t = 0; t < 5; t++)
            for (int s = 0; s < 2; s++) {
                pos[n] = t, seq[n] = s;
                memcpy(x + n * C, u[s] + t * C, sizeof(float) * C);
                n++;
            }
        pt_batch_view b = {.pos = pos, .seq = seq, .state_slot = slots, .n_tokens = n, .n_seqs = 2};
        pt_be_conv1d_silu(be, y, x, w, st, &b, C, K);
        double want[T * 2 * C];
        for (int r = 0; r < n; r++)
            for (int c = 0; c < C; c++) want[r * C + c] = conv_ref(u[seq[r]], w, pos[r], c);
        check_close(y, want, (size_t)n * C, 1e-5, "conv1d prefill");
        /* decode: one row per call, the tail state carries the history */
        for (int t = 5; t < T; t++)
            for (int s = 0; s < 2; s++) {
                int32_t p1 = t, s1 = s;
                pt_batch_view d = {.pos = &p1, .seq = &s1, .state_slot = slots, .n_tokens = 1, .n_seqs = 2};
                pt_be_conv1d_silu(be, y, u[s] + t * C, w, st, &d, C, K);
                for (int c = 0; c < C; c++) want[c] = conv_ref(u[s], w, t, c);
                check_close(y, want, C, 1e-5, "conv1d decode");
            }
        assert_false(be->failed);
        be->ops->destroy(be);
    }
}

/* ---- gated_delta --------------------------------------------------------------- */

enum { NK = 2, NV = 4, DK = 8, DV = 6, QKV = 2 * NK * DK + NV * DV };

typedef struct delta_ref {
    double S[NV][DK][DV];
} delta_ref;

/* The op's variants under test: value heads tiled over key heads (h % NK,
 * llama.cpp's qwen35 layout) or grouped (h / (NV / NK)); l2norm with the
 * epsilon inside the root (0) or as a floor on the norm (ggml). */
static bool tiled;
static float l2_eps;

/* The decay rates the op takes, -exp(A_log). */
static void rates(float *A, const float *A_log) {
    for (int h = 0; h < NV; h++) A[h] = -expf(A_log[h]);
}

/* One token of one sequence into ref (matrix form) and its output. */
static void delta_ref_step(delta_ref *r, const float *row, const float *ba, const float *A_log,
                           const float *dt_bias, double out[NV][DV]) {
    for (int h = 0; h < NV; h++) {
        int kh = tiled ? h % NK : h / (NV / NK);
        double q[DK], k[DK], v[DV], nq = 0, nk = 0;
        for (int i = 0; i < DK; i++) {
            q[i] = row[kh * DK + i], k[i] = row[(NK + kh) * DK + i];
            nq += q[i] * q[i], nk += k[i] * k[i];
        }
        nq = l2_eps > 0 ? fmax(sqrt(nq), l2_eps) : sqrt(nq + 1e-6);
        nk = l2_eps > 0 ? fmax(sqrt(nk), l2_eps) : sqrt(nk + 1e-6);
        for (int i = 0; i < DK; i++) q[i] /= nq * sqrt((double)DK), k[i] /= nk;
        for (int j = 0; j < DV; j++) v[j] = row[2 * NK * DK + h * DV + j];
        double a = (double)ba[NV + h] + dt_bias[h];
        double sp = a > 20 ? a : log1p(exp(a));
        double decay = exp(-exp((double)A_log[h]) * sp), beta = sigm(ba[h]);
        double D[DK][DV], P[DK][DK];
        for (int i = 0; i < DK; i++)
            for (int m = 0; m < DK; m++) P[i][m] = (i == m) - beta * k[i] * k[m];
        for (int i = 0; i < DK; i++)
            for (int j = 0; j < DV; j++) {
                double acc = beta * k[i] * v[j];
                for (int m = 0; m < DK; m++) acc += P[i][m] * decay * r->S[h][m][j];
                D[i][j] = acc;
            }
        memcpy(r->S[h], D, sizeof D);
        for (int j = 0; j < DV; j++) {
            double o = 0;
            for (int i = 0; i < DK; i++) o += r->S[h][i][j] * q[i];
            out[h][j] = o;
        }
    }
}

static void check_gated_delta(int chunk) {
    for (int threads = 1; threads <= 3; threads += 2) {
        pt_err err;
        pt_backend *be = pt_backend_cpu_new(threads, "auto", &err);
        assert_non_null(be);
        float A_log[NV], A[NV], dt_bias[NV];
        for (int h = 0; h < NV; h++) A_log[h] = rnd(1.5), dt_bias[h] = rnd(1);
        rates(A, A_log);
        enum { TT = 7 };
        static float qkv[2][TT][QKV], ba[2][TT][2 * NV];
        for (int s = 0; s < 2; s++)
            for (int t = 0; t < TT; t++) {
                for (int i = 0; i < QKV; i++) qkv[s][t][i] = rnd(1);
                for (int i = 0; i < 2 * NV; i++) ba[s][t][i] = rnd(3);
            }
        ba[0][1][NV] = 25; /* softplus above its threshold */
        float *st = malloc(sizeof(float) * 2 * NV * DK * DV);
        for (int i = 0; i < 2 * NV * DK * DV; i++) st[i] = 7; /* garbage: pos 0 ignores it */
        int32_t slots[2] = {1, 0};
        delta_ref ref[2];
        memset(ref, 0, sizeof ref);
        double want[NV][DV];
        float out[2 * 4][NV * DV], xin[2 * 4][QKV], bin[2 * 4][2 * NV];
        /* prefill of 4 rows each, interleaved as s0 s1 s1 s0 ... */
        int32_t pos[8], seq[8];
        int n = 0;
        for (int t = 0; t < 4; t++)
            for (int s = 0; s < 2; s++) {
                int sq = t % 2 ? 1 - s : s;
                pos[n] = t, seq[n] = sq;
                memcpy(xin[n], qkv[sq][t], sizeof xin[n]);
                memcpy(bin[n], ba[sq][t], sizeof bin[n]);
                n++;
            }
        pt_batch_view b = {.pos = pos, .seq = seq, .state_slot = slots, .n_tokens = n, .n_seqs = 2};
        pt_op_gated_delta op = {.out = &out[0][0], .qkv = &xin[0][0], .ba = &bin[0][0],
                                .A = A, .dt_bias = dt_bias, .state = st, .b = b,
                                .n_k_heads = NK, .n_v_heads = NV, .dk = DK, .dv = DV,
                                .stride = QKV, .chunk = chunk, .tiled = tiled, .l2_eps = l2_eps};
        pt_be_gated_delta(be, &op);
        for (int r = 0; r < n; r++) {
            delta_ref_step(&ref[seq[r]], xin[r], bin[r], A_log, dt_bias, want);
            check_close(out[r], &want[0][0], NV * DV, 2e-5, "gated_delta prefill");
        }
        for (int t = 4; t < TT; t++)
            for (int s = 0; s < 2; s++) {
                int32_t p1 = t, s1 = s;
                op.b = (pt_batch_view){.pos = &p1, .seq = &s1, .state_slot = slots, .n_tokens = 1, .n_seqs = 2};
                op.qkv = qkv[s][t], op.ba = ba[s][t];
                pt_be_gated_delta(be, &op);
                delta_ref_step(&ref[s], qkv[s][t], ba[s][t], A_log, dt_bias, want);
                check_close(out[0], &want[0][0], NV * DV, 2e-5, "gated_delta decode");
            }
        /* sequence 1 restarts at position 0 in its slot: the old state is gone */
        int32_t p0 = 0, s1 = 1;
        op.b = (pt_batch_view){.pos = &p0, .seq = &s1, .state_slot = slots, .n_tokens = 1, .n_seqs = 2};
        op.qkv = qkv[0][3], op.ba = ba[0][3];
        pt_be_gated_delta(be, &op);
        memset(&ref[1], 0, sizeof ref[1]);
        delta_ref_step(&ref[1], qkv[0][3], ba[0][3], A_log, dt_bias, want);
        check_close(out[0], &want[0][0], NV * DV, 2e-5, "gated_delta restart");
        assert_false(be->failed);
        free(st);
        be->ops->destroy(be);
    }
}

/* Token by token, and chunked (runs of 2 rows in the interleaved prefill). */
static void test_gated_delta(void **state) {
    (void)state;
    check_gated_delta(0);
    check_gated_delta(4);
}

/* A long prefill of one sequence in the chunkwise form, chunks of 16 and
 * 64 rows (40 rows: 16 + 16 + 8, and one chunk), continuing a state left
 * by an earlier call, against the matrix-form reference. */
static void test_gated_delta_chunked(void **state) {
    (void)state;
    enum { LEN = 40, PRE = 3 };
    static float qkv[PRE + LEN][QKV], ba[PRE + LEN][2 * NV], out[LEN][NV * DV];
    float A_log[NV], A[NV], dt_bias[NV];
    for (int h = 0; h < NV; h++) A_log[h] = rnd(1.5), dt_bias[h] = rnd(1);
    rates(A, A_log);
    for (int t = 0; t < PRE + LEN; t++) {
        for (int i = 0; i < QKV; i++) qkv[t][i] = rnd(1);
        for (int i = 0; i < 2 * NV; i++) ba[t][i] = rnd(3) - 1.0f; /* slower decays too */
    }
    static const int chunks[] = {16, 64};
    for (size_t ci = 0; ci < PT_ARRAY_LEN(chunks); ci++)
        for (int threads = 1; threads <= 3; threads += 2) {
            pt_err err;
            pt_backend *be = pt_backend_cpu_new(threads, "auto", &err);
            assert_non_null(be);
            float *st = calloc(NV * DK * DV, sizeof(float));
            int32_t slot = 0, pos[PRE + LEN], seq[PRE + LEN] = {0};
            for (int t = 0; t < PRE + LEN; t++) pos[t] = t;
            delta_ref ref;
            memset(&ref, 0, sizeof ref);
            double want[NV][DV];
            /* the first PRE rows token by token, then the prefill */
            pt_op_gated_delta op = {.A = A, .dt_bias = dt_bias, .state = st,
                                    .n_k_heads = NK, .n_v_heads = NV, .dk = DK, .dv = DV,
                                    .stride = QKV, .chunk = chunks[ci], .tiled = tiled,
                                    .l2_eps = l2_eps};
            for (int t = 0; t < PRE; t++) {
                op.out = out[0], op.qkv = qkv[t], op.ba = ba[t];
                op.b = (pt_batch_view){.pos = pos + t, .seq = seq, .state_slot = &slot, .n_tokens = 1, .n_seqs = 1};
                pt_be_gated_delta(be, &op);
                delta_ref_step(&ref, qkv[t], ba[t], A_log, dt_bias, want);
            }
            op.out = out[0], op.qkv = qkv[PRE], op.ba = ba[PRE];
            op.b = (pt_batch_view){.pos = pos + PRE, .seq = seq, .state_slot = &slot, .n_tokens = LEN, .n_seqs = 1};
            pt_be_gated_delta(be, &op);
            for (int t = 0; t < LEN; t++) {
                delta_ref_step(&ref, qkv[PRE + t], ba[PRE + t], A_log, dt_bias, want);
                check_close(out[t], &want[0][0], NV * DV, 5e-5, "gated_delta chunked");
            }
            for (int h = 0; h < NV; h++) /* the state it leaves */
                for (int i = 0; i < DK; i++)
                    for (int e = 0; e < DV; e++) {
                        double w = ref.S[h][i][e], g = st[(h * DK + i) * DV + e];
                        if (!(fabs(g - w) <= 5e-5 * (1 + fabs(w))))
                            fail_msg("chunk %d: state [%d][%d][%d] %.8g, reference %.8g", chunks[ci], h, i, e, g, w);
                    }
            free(st);
            be->ops->destroy(be);
        }
}

/* llama.cpp's variant (qwen35 GGUF): value heads tiled over key heads and
 * ggml's l2norm, its floor set high (1.0) so that some rows' norms fall
 * under it; token by token and chunked, against the same reference. */
static void test_gated_delta_tiled(void **state) {
    tiled = true, l2_eps = 1.0f;
    test_gated_delta(state);
    test_gated_delta_chunked(state);
    tiled = false, l2_eps = 0;
}

/* ---- rmsnorm_gated, gather_cols, sigmoid_mul -------------------------------------- */

static void test_elementwise(void **state) {
    (void)state;
    pt_err err;
    pt_backend *be = pt_backend_cpu_new(3, "auto", &err);
    assert_non_null(be);
    enum { N = 5, D = 13 };
    float x[N * D], z[N * D], w[D], y[N * D], g1[N];
    double want[N * D];
    for (int i = 0; i < N * D; i++) x[i] = rnd(3), z[i] = rnd(4);
    for (int i = 0; i < D; i++) w[i] = rnd(2);
    for (int i = 0; i < N; i++) g1[i] = rnd(5);
    pt_be_rmsnorm_gated(be, y, x, z, w, N, D, 1e-6f);
    for (int r = 0; r < N; r++) {
        double ss = 0;
        for (int i = 0; i < D; i++) ss += (double)x[r * D + i] * x[r * D + i];
        for (int i = 0; i < D; i++) {
            double zz = z[r * D + i];
            want[r * D + i] = x[r * D + i] / sqrt(ss / D + 1e-6) * w[i] * zz * sigm(zz);
        }
    }
    check_close(y, want, N * D, 1e-5, "rmsnorm_gated");

    int32_t idx[7] = {12, 0, 5, 5, 3, 11, 1};
    pt_be_gather_cols(be, y, x, idx, N, D, 7);
    for (int r = 0; r < N; r++)
        for (int j = 0; j < 7; j++) assert_true(y[r * 7 + j] == x[r * D + idx[j]]);

    pt_be_sigmoid_mul(be, y, x, z, N, D, D); /* a gate per element */
    for (int i = 0; i < N * D; i++) want[i] = x[i] * sigm(z[i]);
    check_close(y, want, N * D, 1e-6, "sigmoid_mul");
    memcpy(y, x, sizeof y);
    pt_be_sigmoid_mul(be, y, y, g1, N, D, 1); /* one gate per row, in place */
    for (int i = 0; i < N * D; i++) want[i] = x[i] * sigm(g1[i / D]);
    check_close(y, want, N * D, 1e-6, "sigmoid_mul per row");
    assert_false(be->failed);
    be->ops->destroy(be);
}

int main(void) {
    pt_rng_seed(&rng, 17);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conv1d),
        cmocka_unit_test(test_gated_delta),
        cmocka_unit_test(test_gated_delta_chunked),
        cmocka_unit_test(test_gated_delta_tiled),
        cmocka_unit_test(test_elementwise),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
