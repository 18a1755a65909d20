/*
 * cpu_backend.c - the CPU backend object: memory, the op table, the choice of
 * kernel set, per-thread scratch and dispatch onto the thread pool.
 *
 * The ops themselves live in cpu_matmul.c, cpu_elementwise.c,
 * cpu_attention.c, cpu_moe.c, cpu_recurrent.c and cpu_bandwidth.c; this file only wires them up.  "Backend
 * memory" on the CPU is ordinary memory, so upload/download are memcpy and
 * sync has nothing to wait for (every op returns when its work is done).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/cpu/cpu_backend.h"
#include "backend/comm.h"
#include "backend/repack.h"

/* Below this many elements an op runs on the calling thread alone: waking
 * the workers (~1-2 us) would cost more than the work. */
#define MIN_PARALLEL_WORK 16384.0

_Noreturn void pt_cpu_die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("petrel: cpu backend: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    abort();
}

const pt_cpu_wops *pt_cpu_wops_for(const pt_cpu_backend *cb, pt_dtype dt, const char *op) {
    /* Callers send pt_qk_handles() formats to quant_kernels.h first. */
    if ((unsigned)dt >= PT_DTYPE_COUNT || !cb->k->w[dt].matvec)
        pt_cpu_die("%s: %s weights are not supported by the %s kernels", op, pt_dtype_name(dt),
                   cb->k->name);
    return &cb->k->w[dt];
}

int pt_cpu_scratch_reserve(pt_cpu_backend *cb, size_t floats, const char *op) {
    if (floats <= cb->scratch_floats) return 0;
    floats = PT_MAX(floats, cb->scratch_floats * 2); /* amortize growth */
    for (int i = 0; i < cb->base.n_threads; i++) {
        free(cb->scratch[i]);
        size_t bytes = (floats * sizeof(float) + 63) & ~(size_t)63;
        cb->scratch[i] = aligned_alloc(64, bytes);
        if (!cb->scratch[i]) {
            for (int j = 0; j < cb->base.n_threads; j++) free(cb->scratch[j]), cb->scratch[j] = NULL;
            cb->scratch_floats = 0;
            return pt_be_fail(&cb->base, op, "out of memory for %zu bytes of scratch per thread",
                              bytes);
        }
    }
    cb->scratch_floats = floats;
    return 0;
}

void pt_cpu_run(pt_cpu_backend *cb, pt_pool_fn fn, void *ctx, double work) {
    if (work < MIN_PARALLEL_WORK || cb->base.n_threads == 1)
        fn(ctx, 0, 1);
    else
        pt_pool_run(cb->pool, fn, ctx);
}

/* ---- memory ---------------------------------------------------------------- */

static void *cpu_alloc(pt_backend *be, size_t nbytes) {
    (void)be;
    return pt_alloc_big(nbytes);
}

static void cpu_free(pt_backend *be, void *p, size_t nbytes) {
    (void)be;
    pt_free_big(p, nbytes);
}

static void cpu_copy(pt_backend *be, void *dst, const void *src, size_t nbytes) {
    (void)be;
    if (nbytes) memcpy(dst, src, nbytes);
}

static int cpu_download(pt_backend *be, void *dst, const void *src, size_t nbytes) {
    cpu_copy(be, dst, src, nbytes);
    return be->failed ? -1 : 0;
}

/* Ops ran when they were called: only the sticky error is left to report. */
static int cpu_sync(pt_backend *be) {
    return be->failed ? -1 : 0;
}

/* PETREL_FAULT_OP=name:N (tests): which op kind fails, and at which call. */
static void read_fault(pt_cpu_backend *cb) {
    cb->fault_kind = -1;
    const char *s = getenv("PETREL_FAULT_OP");
    const char *colon = s ? strchr(s, ':') : NULL;
    if (!colon) return;
    for (int k = 0; k < PT_OP_COUNT; k++) {
        const char *name = pt_op_name(k);
        if (strlen(name) == (size_t)(colon - s) && strncmp(s, name, (size_t)(colon - s)) == 0) {
            cb->fault_kind = k;
            cb->fault_at = strtol(colon + 1, NULL, 10);
            pt_warn("cpu backend: PETREL_FAULT_OP: call %ld of %s will fail", cb->fault_at, name);
        }
    }
}

/* Whether this op is the one PETREL_FAULT_OP names. */
static bool injected_fault(pt_cpu_backend *cb, const pt_op *o) {
    return (int)o->kind == cb->fault_kind && ++cb->fault_seen == cb->fault_at;
}

/* The model-family ops (issue 16); false for any other kind. */
static bool run_family_op(pt_backend *be, const pt_op *o) {
    switch (o->kind) {
    case PT_OP_ATTENTION_EXT: {
        const pt_op_attention_ext *a = &o->attention_ext;
        pt_cpu_attention_ext(be, a->out, a->q, &a->kv, &a->b, a->n_heads, &a->p);
        return true;
    }
    case PT_OP_GEGLU: pt_cpu_geglu(be, o->geglu.y, o->geglu.gate, o->geglu.up, o->geglu.count); return true;
    case PT_OP_SCALE: pt_cpu_scale(be, o->scale.x, o->scale.s, o->scale.count); return true;
    case PT_OP_SOFTCAP: pt_cpu_softcap(be, o->scale.x, o->scale.s, o->scale.count); return true;
    case PT_OP_MOE_ROUTE: {
        const pt_op_moe_route *a = &o->moe_route;
        pt_cpu_moe_route(be, a->ids, a->weights, a->logits, a->n, a->n_experts, a->k, a->renorm);
        return true;
    }
    case PT_OP_MATMUL_ID: {
        const pt_op_matmul_id *a = &o->matmul_id;
        pt_cpu_matmul_id(be, a->y, a->x, &a->w, a->ids, a->n, a->k, a->x_slots);
        return true;
    }
    case PT_OP_MOE_COMBINE: {
        const pt_op_moe_combine *a = &o->moe_combine;
        pt_cpu_moe_combine(be, a->y, a->x, a->weights, a->n, a->k, a->d);
        return true;
    }
    case PT_OP_SWIGLU_OAI: {
        const pt_op_swiglu_oai *a = &o->swiglu_oai;
        pt_cpu_swiglu_oai(be, a->y, a->gate, a->up, a->count, a->alpha, a->limit);
        return true;
    }
    case PT_OP_ADD_ID: {
        const pt_op_add_id *a = &o->add_id;
        pt_cpu_add_id(be, a->y, a->bias, a->ids, a->n, a->k, a->d);
        return true;
    }
    case PT_OP_GATHER_COLS: {
        const pt_op_gather_cols *a = &o->gather_cols;
        pt_cpu_gather_cols(be, a->dst, a->src, a->idx, a->n, a->d_src, a->d_dst);
        return true;
    }
    case PT_OP_SIGMOID_MUL: {
        const pt_op_sigmoid_mul *a = &o->sigmoid_mul;
        pt_cpu_sigmoid_mul(be, a->y, a->x, a->g, a->n, a->d, a->g_d);
        return true;
    }
    case PT_OP_CONV1D_SILU: {
        const pt_op_conv1d_silu *a = &o->conv1d_silu;
        pt_cpu_conv1d_silu(be, a->y, a->x, a->w, a->state, &a->b, a->C, a->K);
        return true;
    }
    case PT_OP_GATED_DELTA: pt_cpu_gated_delta(be, &o->gated_delta); return true;
    case PT_OP_RMSNORM_GATED: pt_cpu_rmsnorm_gated(be, &o->rmsnorm_gated); return true;
    case PT_OP_COPY_COLS: pt_cpu_copy_cols(be, &o->copy_cols); return true;
    case PT_OP_MOE_ROUTE_GROUPED: pt_cpu_moe_route_grouped(be, &o->moe_route_grouped); return true;
    case PT_OP_MOE_FFN: pt_cpu_moe_ffn(be, &o->moe_ffn); return true;
    case PT_OP_ARGMAX: {
        const pt_op_argmax *a = &o->argmax;
        pt_cpu_argmax(be, a->ids, a->x, a->n, a->d);
        return true;
    }
    case PT_OP_ALL_REDUCE: {
        const pt_op_all_reduce *a = &o->all_reduce;
        if (pt_comm_kind(a->comm) != PT_COMM_HOST)
            pt_cpu_die("all_reduce: the cpu backend takes host communicators only");
        pt_comm_host_all_reduce(a->comm, a->rank, a->buf, a->count);
        return true;
    }
    case PT_OP_MOE_LOCAL: {
        const pt_op_moe_local *a = &o->moe_local;
        pt_cpu_moe_local(a->ids, a->weights, a->n, a->k, a->first, a->count);
        return true;
    }
    default: return false;
    }
}

/* One op record, run now on the thread pool: the CPU's only op entry. */
static void cpu_run_op(pt_backend *be, const pt_op *o) {
    if (o->kind != PT_OP_ALL_REDUCE && injected_fault(pt_cpu(be), o)) {
        pt_be_fail(be, pt_op_name(o->kind), "injected fault (PETREL_FAULT_OP)");
        return;
    }
    switch (o->kind) {
    case PT_OP_MATMUL: pt_cpu_matmul(be, o->matmul.y, o->matmul.x, &o->matmul.w, o->matmul.n); break;
    case PT_OP_EMBED: pt_cpu_embed(be, o->embed.y, &o->embed.table, o->embed.ids, o->embed.n); break;
    case PT_OP_RMSNORM: {
        const pt_op_rmsnorm *a = &o->rmsnorm;
        pt_cpu_rmsnorm(be, a->y, a->x, a->g, a->n, a->d, a->eps);
        break;
    }
    case PT_OP_ADD: pt_cpu_add(be, o->add.y, o->add.a, o->add.b, o->add.count); break;
    case PT_OP_ADD_BIAS:
        pt_cpu_add_bias(be, o->add_bias.y, o->add_bias.bias, o->add_bias.n, o->add_bias.d);
        break;
    case PT_OP_SWIGLU: pt_cpu_swiglu(be, o->swiglu.y, o->swiglu.gate, o->swiglu.up, o->swiglu.count); break;
    case PT_OP_ROPE: {
        const pt_op_rope *a = &o->rope;
        pt_cpu_rope(be, a->x, &a->b, a->n_heads, a->head_dim, &a->rope);
        break;
    }
    case PT_OP_KV_STORE: {
        const pt_op_kv_store *a = &o->kv_store;
        pt_cpu_kv_store(be, &a->kv, &a->b, a->k, a->v);
        break;
    }
    case PT_OP_ATTENTION: {
        const pt_op_attention *a = &o->attention;
        pt_cpu_attention(be, a->out, a->q, &a->kv, &a->b, a->n_heads, a->scale);
        break;
    }
    case PT_OP_GATHER_ROWS: {
        const pt_op_gather_rows *a = &o->gather_rows;
        pt_cpu_gather_rows(be, a->dst, a->src, a->idx, a->n, a->d);
        break;
    }
    default:
        if (!run_family_op(be, o)) pt_cpu_die("op kind %d has no CPU implementation", (int)o->kind);
    }
}

static void cpu_destroy(pt_backend *be) {
    pt_cpu_backend *cb = pt_cpu(be);
    if (!cb) return;
    pt_pool_free(cb->pool);
    pt_qk_ctx_free(&cb->quant);
    free(cb->attn_meta);
    free(cb->attn_parts);
    free(cb->moe_buf);
    free(cb->xpack);
    for (int i = 0; cb->scratch && i < be->n_threads; i++) free(cb->scratch[i]);
    free(cb->scratch);
    free(cb);
}

/* q4_0 rows interleaved 8 at a time where the int8 kernels run every
 * call (quant_i8_avx2.c reads that layout for decode and prefill; llama.cpp
 * repacks q4_0 on AVX2 too).  PETREL_CPU_REPACK=0 keeps the file's layout
 * (A/B runs; the weights then stay in the mapped file). */
static int cpu_weight_layout(pt_backend *be, const pt_weight *w) {
    pt_cpu_backend *cb = pt_cpu(be);
    const char *env = getenv("PETREL_CPU_REPACK");
    if ((env && strcmp(env, "0") == 0) || !cb->quant.i8_decode || w->n_experts) return PT_LAYOUT_FILE;
    return pt_layout_fits(PT_LAYOUT_Q4_0X8, w->dtype, w->rows, w->cols) ? PT_LAYOUT_Q4_0X8
                                                                         : PT_LAYOUT_FILE;
}

static const pt_backend_ops cpu_ops = {
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_copy,
    .download = cpu_download,
    .copy = cpu_copy,
    .sync = cpu_sync,
    .run = cpu_run_op,
    .read_bandwidth = pt_cpu_read_bandwidth,
    .compute_peak = pt_cpu_compute_peak,
    .weight_layout = cpu_weight_layout,
    .destroy = cpu_destroy,
};

/* ---- choosing a kernel set -------------------------------------------------- */

/* "auto" (or NULL/empty) may be overridden by PETREL_CPU_KERNELS, then
 * picks the widest set this CPU runs; an explicit request is taken as is
 * and fails if this CPU cannot run it (never a silent fallback). */
static const pt_cpu_kernels *choose_kernels(const char *want, pt_err *err) {
    if (!want || !*want || strcmp(want, "auto") == 0) {
        const char *env = getenv("PETREL_CPU_KERNELS");
        want = env && *env ? env : "auto";
    }
    bool any = strcmp(want, "auto") == 0;
    if (strcmp(want, "portable") == 0) return pt_cpu_kernels_portable();
    if (any || strcmp(want, "avx512") == 0) {
        if (pt_qk_cpu_has_avx512()) return pt_cpu_kernels_avx512();
        if (!any) {
            pt_fail(err, "cpu kernels \"avx512\": this CPU lacks AVX-512 F/BW/VL/DQ/VNNI (or AVX2, FMA, F16C)");
            return NULL;
        }
    }
    if (any || strcmp(want, "avx2") == 0) {
        if (pt_qk_cpu_has_avx2()) return pt_cpu_kernels_avx2();
        if (any) return pt_cpu_kernels_portable();
        pt_fail(err, "cpu kernels \"avx2\": this CPU lacks AVX2, FMA or F16C");
        return NULL;
    }
    pt_fail(err, "cpu kernels \"%s\": expected auto, avx512, avx2 or portable", want);
    return NULL;
}

pt_backend *pt_backend_cpu_new(int n_threads, const char *kernels, pt_err *err) {
    const pt_cpu_kernels *k = choose_kernels(kernels, err);
    if (!k) return NULL;
    if (n_threads <= 0) {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = cores > 0 ? (int)cores : 1;
    }
    pt_cpu_backend *cb = pt_xcalloc(1, sizeof *cb);
    cb->k = k;
    cb->pool = pt_pool_new(n_threads);
    if (!cb->pool) {
        free(cb);
        pt_fail(err, "cpu backend: cannot start %d threads", n_threads);
        return NULL;
    }
    cb->scratch = pt_xcalloc((size_t)n_threads, sizeof *cb->scratch);
    read_fault(cb);
    cb->quant.avx512 = k == pt_cpu_kernels_avx512();
    cb->quant.avx2 = cb->quant.avx512 || k == pt_cpu_kernels_avx2();
    /* PETREL_CPU_INT8=0 keeps quantized matmuls on the int16 kernels,
     * =prefill keeps only decode there (A/B runs, docs/quantization.md). */
    const char *i8 = getenv("PETREL_CPU_INT8");
    cb->quant.i8 = cb->quant.avx2 && !(i8 && strcmp(i8, "0") == 0);
    cb->quant.i8_decode = cb->quant.i8 && !(i8 && strcmp(i8, "prefill") == 0);
    snprintf(cb->detail, sizeof cb->detail, "%s%s, %d thread%s", k->name,
             cb->quant.i8_decode ? " + int8 quantized matmuls"
             : cb->quant.i8      ? " + int8 gemm for quantized prefill"
                                 : "",
             n_threads,
             n_threads == 1 ? "" : "s");
    cb->base = (pt_backend){
        .ops = &cpu_ops, .name = "cpu", .detail = cb->detail, .n_threads = n_threads,
        .host_memory = true, /* weights may stay in the mmap'd file */
    };
    return &cb->base;
}
