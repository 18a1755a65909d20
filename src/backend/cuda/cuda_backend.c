/*
 * cuda_backend.c - the CUDA backend: device memory, one stream, and the op
 * table.  Ops are recorded (op + flattened arguments) and flushed at the
 * next download, sync, upload, alloc or free: a decode-sized step replays
 * the CUDA graph captured for the same op sequence, or captures one; other
 * steps launch their kernels (ops.cu, matmul.cu, attention.cu) or cuBLAS
 * calls directly.  Positions and tokens live in device memory, so
 * consecutive decode steps record identical sequences.
 *
 * Nothing here waits for the GPU except download (the caller reads the
 * bytes next) and sync, so the host runs ahead.  Ops return nothing, so a
 * CUDA error found later (a failed launch, a fault inside a kernel) cannot
 * be handed to the op that caused it: download and sync check the stream
 * and abort with the error's name rather than hand back numbers from a
 * broken device.  PETREL_CUDA_SYNC=1 runs every op at once and synchronizes
 * after it, which names the op that failed.
 *
 * Matmul: up to gemv_max token rows (PETREL_CUDA_GEMV_MAX, default 16) run
 * the weight-streaming GEMV kernels with f32 activations; more rows go to
 * cuBLAS: f32 weights by cublasSgemm (no TF32), f16/bf16 weights by
 * cublasGemmEx after the activations are rounded to the weights' type, with
 * f32 accumulation and f32 output.
 *
 * Quantized weights (GGUF q8_0/q4_0/q4_k/q5_k/q6_k, MLX affine) stay as the
 * file stores them: up to qgemv_max token rows (PETREL_CUDA_QGEMV_MAX,
 * default 16) run the quantized GEMV of qmatmul.cu, more rows dequantize
 * the weight to f16 in a scratch buffer and run cublasGemmEx; quantized
 * embedding tables are dequantized row by row.
 *
 * Knobs (environment, read when the backend is created): PETREL_CUDA_GRAPHS,
 * PETREL_CUDA_PDL, PETREL_CUDA_GEMV_MAX, PETREL_CUDA_QGEMV_MAX, PETREL_CUDA_GEMV_PERSIST,
 * PETREL_CUDA_GEMV_PDL, PETREL_CUDA_ATTN=simple|tiled, PETREL_CUDA_SYNC.
 */
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_internal.h"

/* CUDA graphs of recorded op sequences (see flush). */
#define GRAPH_SLOTS 4
#define GRAPH_MIN_OPS 8    /* shorter bursts (tests, benchmarks) run directly */
#define GRAPH_MAX_ROWS 64  /* prefill-sized steps run directly: each is new */
#define CUBLAS_WORKSPACE ((size_t)32 << 20)

typedef struct op_rec op_rec;
typedef struct graph_slot {
    cudaGraphExec_t exec;
    op_rec *recs; /* the op sequence it runs */
    int n;
    uint64_t last_use;
} graph_slot;

typedef struct cuda_backend {
    pt_backend base;
    int device, n_sm;
    cudaStream_t stream;
    cublasHandle_t cublas;
    void *cublas_ws;
    void *act16; /* activations rounded to f16/bf16 for cuBLAS */
    size_t act16_cap;
    void *wdeq; /* a quantized weight dequantized to f16 (prefill) */
    size_t wdeq_cap;
    void *attn_scratch; /* split-context partial results */
    size_t attn_cap;
    int gemv_max;     /* token rows up to which matmul uses the GEMV kernels */
    int qgemv_max;    /* the same for quantized weights (PETREL_CUDA_QGEMV_MAX) */
    bool simple_attn; /* PETREL_CUDA_ATTN=simple: the plain kernel only */
    bool tiled_attn;  /* PETREL_CUDA_ATTN=tiled: no tensor-core kernel */
    bool sync_each;   /* PETREL_CUDA_SYNC=1 */
    bool use_graphs;  /* PETREL_CUDA_GRAPHS=0 turns them off */
    op_rec *list;     /* ops recorded since the last flush */
    int n_list, list_cap, list_rows;
    graph_slot graphs[GRAPH_SLOTS];
    uint64_t clock, n_captures, n_replays;
    double read_bw;
    char detail[192];
} cuda_backend;

static cuda_backend *cb_of(pt_backend *be) {
    return (cuda_backend *)be;
}

static void cuda_fatal(const char *what, const char *msg) {
    pt_log(PT_LOG_ERROR, "cuda: %s: %s", what, msg);
    fprintf(stderr, "petrel: fatal CUDA error in %s: %s\n", what, msg);
    abort();
}

static void check(cudaError_t e, const char *what) {
    if (e != cudaSuccess) cuda_fatal(what, cudaGetErrorString(e));
}

static void check_blas(cublasStatus_t st, const char *what) {
    if (st != CUBLAS_STATUS_SUCCESS) cuda_fatal(what, cublasGetStatusString(st));
}

/* After each op: a launch error now, or with PETREL_CUDA_SYNC any error. */
static void op_done(cuda_backend *cb, const char *op) {
    check(cudaGetLastError(), op);
    if (cb->sync_each) check(cudaStreamSynchronize(cb->stream), op);
}

static int dtype_code(pt_dtype t) {
    switch (t) {
    case PT_F32: return CU_F32;
    case PT_F16: return CU_F16;
    case PT_BF16: return CU_BF16;
    default: return -1;
    }
}

/* Grows a device scratch buffer (rarely: by half again). */
static void *scratch(cuda_backend *cb, void **buf, size_t *cap, size_t need, const char *what) {
    if (need <= *cap) return *buf;
    check(cudaStreamSynchronize(cb->stream), what);
    if (*buf) cudaFree(*buf);
    size_t n = need + need / 2;
    if (cudaMalloc(buf, n) != cudaSuccess) {
        *buf = NULL;
        *cap = 0;
        char msg[96];
        snprintf(msg, sizeof msg, "cannot allocate %.1f MiB of scratch", n / 1048576.0);
        cuda_fatal(what, msg);
    }
    *cap = n;
    return *buf;
}

/* ---- Memory --------------------------------------------------------------- */

static void flush(cuda_backend *cb);

static void *cuda_alloc(pt_backend *be, size_t nbytes) {
    cuda_backend *cb = cb_of(be);
    flush(cb);
    void *p = NULL;
    if (cudaMalloc(&p, nbytes ? nbytes : 1) != cudaSuccess) {
        cudaGetLastError(); /* clear the error: a failed alloc is reported by NULL */
        return NULL;
    }
    if (cudaMemsetAsync(p, 0, nbytes, cb->stream) != cudaSuccess) {
        cudaGetLastError();
        cudaFree(p);
        return NULL;
    }
    return p;
}

static void cuda_free(pt_backend *be, void *p, size_t nbytes) {
    (void)nbytes;
    if (!p) return;
    flush(cb_of(be));
    check(cudaStreamSynchronize(cb_of(be)->stream), "free");
    check(cudaFree(p), "free");
}

/* From pageable host memory the copy returns once the bytes are staged, so
 * the caller may reuse src at once; it runs in stream order. */
static void cuda_upload(pt_backend *be, void *dst, const void *src, size_t nbytes) {
    if (!nbytes) return;
    flush(cb_of(be)); /* recorded ops come first in stream order */
    check(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyHostToDevice, cb_of(be)->stream), "upload");
}

static void cuda_download(pt_backend *be, void *dst, const void *src, size_t nbytes) {
    cuda_backend *cb = cb_of(be);
    flush(cb);
    if (nbytes) check(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToHost, cb->stream), "download");
    check(cudaStreamSynchronize(cb->stream), "download");
}

static void cuda_copy(pt_backend *be, void *dst, const void *src, size_t nbytes) {
    if (!nbytes) return;
    flush(cb_of(be));
    check(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToDevice, cb_of(be)->stream), "copy");
}

static size_t cuda_free_memory(pt_backend *be) {
    size_t free_b = 0, total = 0;
    (void)be;
    return cudaMemGetInfo(&free_b, &total) == cudaSuccess ? free_b : 0;
}

static void cuda_sync(pt_backend *be) {
    flush(cb_of(be));
    check(cudaStreamSynchronize(cb_of(be)->stream), "sync");
    check(cudaGetLastError(), "sync");
}

/* ---- Ops: recorded, then run directly or as a CUDA graph ----------------- */

/* One op call with its arguments, flattened so two calls compare with
 * memcmp (the record is zeroed before filling: no stray padding bytes). */
enum { OP_MATMUL, OP_EMBED, OP_RMSNORM, OP_ADD, OP_ADD_BIAS, OP_SWIGLU, OP_ROPE, OP_KV_STORE,
       OP_ATTENTION, OP_GATHER, OP_KVQ_STORE, OP_KVQ_ATTENTION, OP_QMATMUL, OP_QEMBED };

typedef struct op_rec {
    int64_t kind, rows; /* rows: token rows the op works on (graphs only for few) */
    const void *p[8];
    int64_t i[8];
    float f[2];
    cu_kvq_args kvq; /* quantized caches: all of the op's arguments but k, v */
    cu_qweight qw;   /* quantized weights: the matrix */
} op_rec;

static const char *const op_names[] = {"matmul", "embed", "rmsnorm", "add", "add_bias",
                                       "swiglu", "rope", "kv_store", "attention", "gather_rows",
                                       "kv_store (quantized)", "attention (quantized)",
                                       "matmul (quantized weights)", "embed (quantized table)"};

static cu_attn_args attn_args(const op_rec *r) {
    cu_attn_args a = {(float *)r->p[0], r->p[1], r->p[2], r->p[3], (int)r->i[0], (int)r->i[1],
                      (int)r->i[2], (int)r->i[3], r->p[4], r->p[5], r->p[6], (int)r->i[4],
                      (int)r->i[5], (int)r->i[6], r->f[0], (int)r->i[7]};
    return a;
}

/* Enqueues one recorded op on the stream. */
static void exec_op(cuda_backend *cb, const op_rec *r) {
    cudaStream_t s = cb->stream;
    switch (r->kind) {
    case OP_MATMUL: {
        float *y = (float *)r->p[0];
        const float *x = r->p[1];
        const void *w = r->p[2];
        int wt = (int)r->i[0], rows = (int)r->i[1], cols = (int)r->i[2], n = (int)r->i[3];
        if (n <= cb->gemv_max && cu_gemv(s, y, x, w, wt, rows, cols, n) == 0) break;
        const float one = 1.0f, zero = 0.0f;
        if (wt == CU_F32) {
            check_blas(cublasSgemm(cb->cublas, CUBLAS_OP_T, CUBLAS_OP_N, rows, n, cols, &one, w, cols,
                                   x, cols, &zero, y, rows),
                       "matmul (cublasSgemm)");
        } else {
            cu_convert_from_f32(s, cb->act16, wt, x, (size_t)n * cols);
            cudaDataType_t t = wt == CU_BF16 ? CUDA_R_16BF : CUDA_R_16F;
            check_blas(cublasGemmEx(cb->cublas, CUBLAS_OP_T, CUBLAS_OP_N, rows, n, cols, &one, w, t,
                                    cols, cb->act16, t, cols, &zero, y, CUDA_R_32F, rows,
                                    CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                       "matmul (cublasGemmEx)");
        }
        break;
    }
    case OP_QMATMUL: {
        float *y = (float *)r->p[0];
        const float *x = r->p[1];
        int n = (int)r->i[0];
        const cu_qweight *w = &r->qw;
        if (n <= cb->qgemv_max && cu_qgemv(s, y, x, w, n) == 0) break;
        /* Prefill: the weight as f16 into scratch, then the tensor cores. */
        if (cu_qdequant_f16(s, cb->wdeq, w))
            cuda_fatal("matmul", "no kernel for this quantized weight's shape");
        cu_convert_from_f32(s, cb->act16, CU_F16, x, (size_t)n * (size_t)w->cols);
        const float one = 1.0f, zero = 0.0f;
        int rows = (int)w->rows, cols = (int)w->cols;
        check_blas(cublasGemmEx(cb->cublas, CUBLAS_OP_T, CUBLAS_OP_N, rows, n, cols, &one, cb->wdeq,
                                CUDA_R_16F, cols, cb->act16, CUDA_R_16F, cols, &zero, y, CUDA_R_32F,
                                rows, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                   "matmul (quantized weights, cublasGemmEx)");
        break;
    }
    case OP_QEMBED:
        if (cu_qembed(s, (float *)r->p[0], &r->qw, r->p[1], (int)r->i[0]))
            cuda_fatal("embed", "no kernel for this quantized table's shape");
        break;
    case OP_EMBED:
        cu_embed(s, (float *)r->p[0], r->p[1], (int)r->i[0], r->i[1], r->i[2], r->p[2], (int)r->i[3]);
        break;
    case OP_RMSNORM:
        cu_rmsnorm(s, (float *)r->p[0], r->p[1], r->p[2], (int)r->i[0], (int)r->i[1], r->f[0]);
        break;
    case OP_ADD: cu_add(s, (float *)r->p[0], r->p[1], r->p[2], (size_t)r->i[0]); break;
    case OP_ADD_BIAS: cu_add_bias(s, (float *)r->p[0], r->p[1], (int)r->i[0], (int)r->i[1]); break;
    case OP_SWIGLU: cu_swiglu(s, (float *)r->p[0], r->p[1], r->p[2], (size_t)r->i[0]); break;
    case OP_ROPE:
        cu_rope(s, (float *)r->p[0], r->p[1], (int)r->i[0], (int)r->i[1], (int)r->i[2], (int)r->i[3],
                (int)r->i[4], r->p[2], r->f[0]);
        break;
    case OP_KV_STORE:
        cu_kv_store(s, (void *)r->p[0], (void *)r->p[1], (int)r->i[0], (int)r->i[1], (int)r->i[2],
                    (int)r->i[3], r->p[2], r->p[3], r->p[4], (int)r->i[4], (int)r->i[5], r->p[5],
                    r->p[6]);
        break;
    case OP_ATTENTION: {
        cu_attn_args a = attn_args(r);
        if (cb->simple_attn) cu_attention_simple(s, &a);
        else cu_attention(s, &a, cb->n_sm, cb->attn_scratch);
        break;
    }
    case OP_GATHER:
        cu_gather_rows(s, (float *)r->p[0], r->p[1], r->p[2], (int)r->i[0], (int)r->i[1]);
        break;
    case OP_KVQ_STORE: /* formats were checked when the op was recorded: -1 is a bug */
        if (cu_kvq_store(s, &r->kvq, r->p[0], r->p[1]))
            cuda_fatal("kv_store", "no kernel for this quantized cache's shape");
        break;
    case OP_KVQ_ATTENTION:
        if (cu_kvq_attention(s, &r->kvq, cb->n_sm, cb->attn_scratch))
            cuda_fatal("attention", "no kernel for this quantized cache's shape");
        break;
    }
}

/* Scratch an op will need, grown now (never while a graph is captured).
 * A cached graph holds the old scratch pointers, so growth drops them. */
static void drop_graphs(cuda_backend *cb);

static void prepare_scratch(cuda_backend *cb, const op_rec *r) {
    size_t need = 0;
    void **buf = NULL;
    size_t *cap = NULL;
    if (r->kind == OP_MATMUL && (int)r->i[0] != CU_F32 && r->i[3] > cb->gemv_max) {
        need = (size_t)r->i[3] * (size_t)r->i[2] * 2;
        buf = &cb->act16, cap = &cb->act16_cap;
    } else if (r->kind == OP_ATTENTION && !cb->simple_attn) {
        cu_attn_args a = attn_args(r);
        need = cu_attention_scratch(&a, cb->n_sm);
        buf = &cb->attn_scratch, cap = &cb->attn_cap;
    } else if (r->kind == OP_KVQ_ATTENTION) {
        need = cu_kvq_attention_scratch(&r->kvq, cb->n_sm);
        buf = &cb->attn_scratch, cap = &cb->attn_cap;
    }
    if (r->kind == OP_QMATMUL && r->i[0] > cb->qgemv_max) {
        need = (size_t)r->i[0] * (size_t)r->qw.cols * 2;
        buf = &cb->act16, cap = &cb->act16_cap;
        size_t wneed = (size_t)r->qw.rows * (size_t)r->qw.cols * 2;
        if (wneed > cb->wdeq_cap) {
            drop_graphs(cb);
            scratch(cb, &cb->wdeq, &cb->wdeq_cap, wneed, op_names[r->kind]);
        }
    }
    if (buf && need > *cap) {
        drop_graphs(cb);
        scratch(cb, buf, cap, need, op_names[r->kind]);
    }
}

static void drop_graphs(cuda_backend *cb) {
    for (int i = 0; i < GRAPH_SLOTS; i++) {
        graph_slot *g = &cb->graphs[i];
        if (g->exec) cudaGraphExecDestroy(g->exec);
        free(g->recs);
        memset(g, 0, sizeof *g);
    }
}

/* Records the op, or with graphs off runs it now. */
static void submit(cuda_backend *cb, op_rec *r) {
    prepare_scratch(cb, r);
    if (!cb->use_graphs) {
        exec_op(cb, r);
        op_done(cb, op_names[r->kind]);
        return;
    }
    if (cb->n_list == cb->list_cap) {
        cb->list_cap = cb->list_cap ? 2 * cb->list_cap : 256;
        cb->list = pt_xrealloc(cb->list, sizeof(op_rec) * (size_t)cb->list_cap);
    }
    cb->list[cb->n_list++] = *r;
    if (r->rows > cb->list_rows) cb->list_rows = (int)r->rows;
}

/* Captures the recorded ops into a graph in the least recently used slot
 * (updating its executable in place when the shape allows).  NULL if
 * capture failed: graphs are then turned off for good. */
static graph_slot *capture(cuda_backend *cb) {
    cudaGraph_t graph = NULL;
    cudaError_t e = cudaStreamBeginCapture(cb->stream, cudaStreamCaptureModeThreadLocal);
    if (e == cudaSuccess) {
        for (int i = 0; i < cb->n_list; i++) exec_op(cb, &cb->list[i]);
        e = cudaStreamEndCapture(cb->stream, &graph);
    }
    if (e != cudaSuccess || !graph) {
        cudaGetLastError();
        pt_warn("cuda: graph capture failed (%s); running ops one by one from now on",
                cudaGetErrorString(e));
        cb->use_graphs = false;
        return NULL;
    }
    graph_slot *g = &cb->graphs[0];
    for (int i = 1; i < GRAPH_SLOTS; i++)
        if (cb->graphs[i].last_use < g->last_use) g = &cb->graphs[i];
    cudaGraphExecUpdateResultInfo info;
    if (!g->exec || cudaGraphExecUpdate(g->exec, graph, &info) != cudaSuccess) {
        cudaGetLastError();
        if (g->exec) cudaGraphExecDestroy(g->exec);
        g->exec = NULL;
        e = cudaGraphInstantiate(&g->exec, graph, 0);
        if (e != cudaSuccess) {
            cudaGetLastError();
            cudaGraphDestroy(graph);
            pt_warn("cuda: graph instantiation failed (%s); running ops one by one from now on",
                    cudaGetErrorString(e));
            g->exec = NULL;
            cb->use_graphs = false;
            return NULL;
        }
    }
    cudaGraphDestroy(graph);
    g->recs = pt_xrealloc(g->recs, sizeof(op_rec) * (size_t)cb->n_list);
    memcpy(g->recs, cb->list, sizeof(op_rec) * (size_t)cb->n_list);
    g->n = cb->n_list;
    cb->n_captures++;
    return g;
}

/* Runs what was recorded: a decode-sized step replays the graph captured
 * for the same op sequence, or captures one; anything else runs directly. */
static void flush(cuda_backend *cb) {
    if (!cb->n_list) return;
    graph_slot *g = NULL;
    if (cb->use_graphs && cb->n_list >= GRAPH_MIN_OPS && cb->list_rows <= GRAPH_MAX_ROWS) {
        for (int i = 0; i < GRAPH_SLOTS && !g; i++)
            if (cb->graphs[i].exec && cb->graphs[i].n == cb->n_list &&
                memcmp(cb->graphs[i].recs, cb->list, sizeof(op_rec) * (size_t)cb->n_list) == 0)
                g = &cb->graphs[i];
        if (g) cb->n_replays++;
        else g = capture(cb);
    }
    if (g) {
        g->last_use = ++cb->clock;
        check(cudaGraphLaunch(g->exec, cb->stream), "graph launch");
    } else {
        for (int i = 0; i < cb->n_list; i++) {
            exec_op(cb, &cb->list[i]);
            check(cudaGetLastError(), op_names[cb->list[i].kind]);
        }
    }
    cb->n_list = 0;
    cb->list_rows = 0;
}

/* The kernels' view of a quantized weight; fatal if they do not take it
 * (a model that loads must not fail half-way through a forward pass). */
static cu_qweight qweight_of(const pt_weight *w, const char *op) {
    cu_qweight q = {w->data, w->scales, w->biases, w->rows, w->cols, -1, 0, 0, 0};
    switch (w->dtype) {
    case PT_Q8_0: q.fmt = CU_Q8_0; break;
    case PT_Q4_0: q.fmt = CU_Q4_0; break;
    case PT_Q4_K: q.fmt = CU_Q4_K; break;
    case PT_Q5_K: q.fmt = CU_Q5_K; break;
    case PT_Q6_K: q.fmt = CU_Q6_K; break;
    case PT_AFFINE:
        q.fmt = w->bits == 4 ? CU_AFF4 : w->bits == 8 ? CU_AFF8 : CU_AFFN;
        q.bits = w->bits, q.group = w->group_size, q.scale_type = dtype_code(w->scale_dtype);
        break;
    default: break;
    }
    if (q.fmt < 0) cuda_fatal(op, "weight type not supported by the CUDA backend");
    if (!cu_qweight_ok(&q)) {
        char msg[160];
        snprintf(msg, sizeof msg, "%s weight of %lldx%lld (bits %d, group %d) not supported by "
                 "the CUDA kernels", pt_dtype_name(w->dtype), (long long)w->rows,
                 (long long)w->cols, w->bits, w->group_size);
        cuda_fatal(op, msg);
    }
    return q;
}

static bool is_quantized(pt_dtype t) {
    return t == PT_Q8_0 || t == PT_Q4_0 || t == PT_Q4_K || t == PT_Q5_K || t == PT_Q6_K ||
           t == PT_AFFINE;
}

static void cuda_matmul(pt_backend *be, float *y, const float *x, const pt_weight *w, int n) {
    if (n <= 0) return;
    if (is_quantized(w->dtype)) {
        op_rec r = {0};
        r.kind = OP_QMATMUL, r.rows = n;
        r.p[0] = y, r.p[1] = x, r.i[0] = n;
        r.qw = qweight_of(w, "matmul");
        submit(cb_of(be), &r);
        return;
    }
    int wt = dtype_code(w->dtype);
    if (wt < 0) cuda_fatal("matmul", "weight type not supported by the CUDA backend");
    op_rec r = {0};
    r.kind = OP_MATMUL, r.rows = n;
    r.p[0] = y, r.p[1] = x, r.p[2] = w->data;
    r.i[0] = wt, r.i[1] = w->rows, r.i[2] = w->cols, r.i[3] = n;
    submit(cb_of(be), &r);
}

static void cuda_embed(pt_backend *be, float *y, const pt_weight *table, const int32_t *ids,
                       int n) {
    if (is_quantized(table->dtype)) {
        op_rec r = {0};
        r.kind = OP_QEMBED, r.rows = n;
        r.p[0] = y, r.p[1] = ids, r.i[0] = n;
        r.qw = qweight_of(table, "embed");
        submit(cb_of(be), &r);
        return;
    }
    int t = dtype_code(table->dtype);
    if (t < 0) cuda_fatal("embed", "table type not supported by the CUDA backend");
    op_rec r = {0};
    r.kind = OP_EMBED, r.rows = n;
    r.p[0] = y, r.p[1] = table->data, r.p[2] = ids;
    r.i[0] = t, r.i[1] = table->rows, r.i[2] = table->cols, r.i[3] = n;
    submit(cb_of(be), &r);
}

static void cuda_rmsnorm(pt_backend *be, float *y, const float *x, const float *g, int n, int d,
                         float eps) {
    op_rec r = {0};
    r.kind = OP_RMSNORM, r.rows = 0; /* per-head norms have many short rows */
    r.p[0] = y, r.p[1] = x, r.p[2] = g;
    r.i[0] = n, r.i[1] = d, r.f[0] = eps;
    submit(cb_of(be), &r);
}

static void cuda_add(pt_backend *be, float *y, const float *a, const float *b, size_t count) {
    op_rec r = {0};
    r.kind = OP_ADD;
    r.p[0] = y, r.p[1] = a, r.p[2] = b, r.i[0] = (int64_t)count;
    submit(cb_of(be), &r);
}

static void cuda_add_bias(pt_backend *be, float *y, const float *bias, int n, int d) {
    op_rec r = {0};
    r.kind = OP_ADD_BIAS, r.rows = n;
    r.p[0] = y, r.p[1] = bias, r.i[0] = n, r.i[1] = d;
    submit(cb_of(be), &r);
}

static void cuda_swiglu(pt_backend *be, float *y, const float *gate, const float *up,
                        size_t count) {
    op_rec r = {0};
    r.kind = OP_SWIGLU;
    r.p[0] = y, r.p[1] = gate, r.p[2] = up, r.i[0] = (int64_t)count;
    submit(cb_of(be), &r);
}

static void cuda_rope(pt_backend *be, float *x, const pt_batch_view *b, int n_heads, int head_dim,
                      const pt_rope *rope) {
    op_rec r = {0};
    r.kind = OP_ROPE, r.rows = b->n_tokens;
    r.p[0] = x, r.p[1] = b->pos, r.p[2] = rope->inv_freq;
    r.i[0] = b->n_tokens, r.i[1] = n_heads, r.i[2] = head_dim, r.i[3] = rope->style;
    r.i[4] = rope->n_rot, r.f[0] = rope->mscale;
    submit(cb_of(be), &r);
}

/* The record of a quantized-cache op: every argument lives in r->kvq (the
 * memset keeps padding bytes zero, so records compare with memcmp). */
static void kvq_record(op_rec *r, int kind, const pt_kv_view *kv, const pt_batch_view *b,
                       float *out, const float *q, int n_heads, float scale) {
    memset(r, 0, sizeof *r);
    r->kind = kind, r->rows = b->n_tokens;
    cu_kvq_args *a = &r->kvq;
    a->out = out, a->q = q, a->k = kv->k, a->v = kv->v, a->tables = kv->tables;
    a->kvq = kv->kvq, a->k_bits = kv->k_bits, a->v_bits = kv->v_bits, a->group = kv->group;
    a->k_row = kv->k_row, a->v_row = kv->v_row;
    a->page_size = kv->page_size, a->n_kv_heads = kv->n_kv_heads, a->head_dim = kv->head_dim;
    a->pos = b->pos, a->seq = b->seq, a->block_table = b->block_table;
    a->max_pages = b->max_pages, a->n = b->n_tokens, a->n_heads = n_heads, a->scale = scale;
}

static void cuda_kv_store(pt_backend *be, const pt_kv_view *kv, const pt_batch_view *b,
                          const float *k, const float *v) {
    if (kv->codec) {
        op_rec r;
        kvq_record(&r, OP_KVQ_STORE, kv, b, NULL, NULL, kv->n_kv_heads, 0);
        if (!cu_kvq_supported(kv->kvq, kv->k_bits, kv->v_bits, kv->group, kv->head_dim))
            cuda_fatal("kv_store", "quantized KV format not supported by the CUDA kernels");
        r.p[0] = k, r.p[1] = v;
        submit(cb_of(be), &r);
        return;
    }
    int t = dtype_code(kv->dtype);
    if (t < 0) cuda_fatal("kv_store", "cache type not supported by the CUDA backend");
    op_rec r = {0};
    r.kind = OP_KV_STORE, r.rows = b->n_tokens;
    r.p[0] = kv->k, r.p[1] = kv->v, r.p[2] = b->pos, r.p[3] = b->seq, r.p[4] = b->block_table;
    r.p[5] = k, r.p[6] = v;
    r.i[0] = t, r.i[1] = kv->page_size, r.i[2] = kv->n_kv_heads, r.i[3] = kv->head_dim;
    r.i[4] = b->max_pages, r.i[5] = b->n_tokens;
    submit(cb_of(be), &r);
}

static void cuda_attention(pt_backend *be, float *out, const float *q, const pt_kv_view *kv,
                           const pt_batch_view *b, int n_heads, float scale) {
    if (kv->codec) {
        op_rec r;
        kvq_record(&r, OP_KVQ_ATTENTION, kv, b, out, q, n_heads, scale);
        if (!cu_kvq_supported(kv->kvq, kv->k_bits, kv->v_bits, kv->group, kv->head_dim))
            cuda_fatal("attention", "quantized KV format not supported by the CUDA kernels");
        if (n_heads % kv->n_kv_heads || n_heads / kv->n_kv_heads > 8)
            cuda_fatal("attention", "quantized KV caches take at most 8 query heads per KV head "
                                    "on the CUDA backend");
        submit(cb_of(be), &r);
        return;
    }
    int t = dtype_code(kv->dtype);
    if (t < 0) cuda_fatal("attention", "cache type not supported by the CUDA backend");
    if (kv->head_dim > 512) cuda_fatal("attention", "head_dim over 512 is not supported");
    op_rec r = {0};
    r.kind = OP_ATTENTION, r.rows = b->n_tokens;
    r.p[0] = out, r.p[1] = q, r.p[2] = kv->k, r.p[3] = kv->v;
    r.p[4] = b->pos, r.p[5] = b->seq, r.p[6] = b->block_table;
    r.i[0] = t, r.i[1] = kv->page_size, r.i[2] = kv->n_kv_heads, r.i[3] = kv->head_dim;
    r.i[4] = b->max_pages, r.i[5] = b->n_tokens, r.i[6] = n_heads, r.f[0] = scale;
    r.i[7] = cb_of(be)->tiled_attn;
    submit(cb_of(be), &r);
}

static void cuda_gather_rows(pt_backend *be, float *dst, const float *src, const int32_t *idx,
                             int n, int d) {
    op_rec r = {0};
    r.kind = OP_GATHER, r.rows = n;
    r.p[0] = dst, r.p[1] = src, r.p[2] = idx, r.i[0] = n, r.i[1] = d;
    submit(cb_of(be), &r);
}

/* Quantized KV formats the kernels take (checked when a cache is created). */
static int cuda_kv_quant_check(pt_backend *be, int kvq, int k_bits, int v_bits, int group,
                               int head_dim, pt_err *err) {
    (void)be;
    if (cu_kvq_supported(kvq, k_bits, v_bits, group, head_dim)) return 0;
    return pt_fail(err, "the CUDA backend's quantized-KV kernels take groups of 32 at head_dim "
                        "64, 128, 256 or 512 (this cache: groups of %d, head_dim %d)",
                   group, head_dim);
}

/* ---- Bandwidth ------------------------------------------------------------- */

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Median seconds of reps runs of a read kernel (kind 0) or a device-to-
 * device copy of half the buffer onto the other half (kind 1). */
static double time_median(cuda_backend *cb, int kind, void *buf, size_t nbytes, float *sink,
                          int reps) {
    cudaEvent_t e0, e1;
    check(cudaEventCreate(&e0), "read_bandwidth");
    check(cudaEventCreate(&e1), "read_bandwidth");
    double t[32];
    if (reps > 32) reps = 32;
    for (int i = -2; i < reps; i++) { /* two warm-ups */
        check(cudaEventRecord(e0, cb->stream), "read_bandwidth");
        if (kind == 0) cu_read_kernel(cb->stream, buf, nbytes, sink);
        else
            check(cudaMemcpyAsync((char *)buf + nbytes / 2, buf, nbytes / 2,
                                  cudaMemcpyDeviceToDevice, cb->stream),
                  "read_bandwidth");
        check(cudaEventRecord(e1, cb->stream), "read_bandwidth");
        check(cudaEventSynchronize(e1), "read_bandwidth");
        float ms = 0;
        check(cudaEventElapsedTime(&ms, e0, e1), "read_bandwidth");
        if (i >= 0) t[i] = ms / 1e3;
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    qsort(t, (size_t)reps, sizeof t[0], cmp_double);
    return t[reps / 2];
}

/* Bytes/s of a streaming read kernel over 2 GiB (16-byte loads that skip
 * L1, far larger than L2): the roofline of decode, which only reads.  The
 * device-to-device copy rate (bytes read + written) is logged beside it. */
static double cuda_read_bandwidth(pt_backend *be) {
    cuda_backend *cb = cb_of(be);
    if (cb->read_bw > 0) return cb->read_bw;
    flush(cb);
    size_t nbytes = (size_t)2 << 30;
    void *buf = NULL;
    while (nbytes >= ((size_t)64 << 20) && cudaMalloc(&buf, nbytes) != cudaSuccess) {
        cudaGetLastError();
        nbytes /= 2;
    }
    if (!buf) return 0;
    float *sink = NULL;
    check(cudaMalloc((void **)&sink, 16), "read_bandwidth");
    check(cudaMemsetAsync(buf, 0x5a, nbytes, cb->stream), "read_bandwidth");
    double tr = time_median(cb, 0, buf, nbytes, sink, 15);
    double tc = time_median(cb, 1, buf, nbytes, sink, 15);
    cudaFree(sink);
    cudaFree(buf);
    cb->read_bw = (double)nbytes / tr;
    pt_info("cuda: read kernel %.0f GB/s; device-to-device copy %.0f GB/s (read + written), "
            "%.2f GiB buffer",
            cb->read_bw / 1e9, (double)nbytes / tc / 1e9, nbytes / 1073741824.0);
    size_t len = strlen(cb->detail);
    snprintf(cb->detail + len, sizeof cb->detail - len, "; read %.0f GB/s, copy %.0f GB/s",
             cb->read_bw / 1e9, (double)nbytes / tc / 1e9);
    return cb->read_bw;
}

/* ---- Lifetime ---------------------------------------------------------------- */

static void cuda_destroy(pt_backend *be) {
    cuda_backend *cb = cb_of(be);
    if (!cb) return;
    flush(cb);
    cudaStreamSynchronize(cb->stream);
    if (cb->n_captures || cb->n_replays)
        pt_debug("cuda: %llu graph captures, %llu replays", (unsigned long long)cb->n_captures,
                 (unsigned long long)cb->n_replays);
    drop_graphs(cb);
    free(cb->list);
    if (cb->cublas_ws) cudaFree(cb->cublas_ws);
    if (cb->act16) cudaFree(cb->act16);
    if (cb->attn_scratch) cudaFree(cb->attn_scratch);
    if (cb->wdeq) cudaFree(cb->wdeq);
    if (cb->cublas) cublasDestroy(cb->cublas);
    if (cb->stream) cudaStreamDestroy(cb->stream);
    free(cb);
}

static const pt_backend_ops cuda_ops = {
    .alloc = cuda_alloc,
    .free = cuda_free,
    .upload = cuda_upload,
    .download = cuda_download,
    .copy = cuda_copy,
    .sync = cuda_sync,
    .matmul = cuda_matmul,
    .embed = cuda_embed,
    .rmsnorm = cuda_rmsnorm,
    .add = cuda_add,
    .add_bias = cuda_add_bias,
    .swiglu = cuda_swiglu,
    .rope = cuda_rope,
    .kv_store = cuda_kv_store,
    .attention = cuda_attention,
    .gather_rows = cuda_gather_rows,
    .kv_quant_check = cuda_kv_quant_check,
    .free_memory = cuda_free_memory,
    .read_bandwidth = cuda_read_bandwidth,
    .destroy = cuda_destroy,
};

static int env_int(const char *name, int def) {
    const char *s = getenv(name);
    return s && *s ? atoi(s) : def;
}

pt_backend *pt_backend_cuda_new(int device, pt_err *err) {
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
        cudaGetLastError();
        pt_fail(err, "no CUDA device available (%s)",
                e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
        return NULL;
    }
    if (device < 0 || device >= count) {
        pt_fail(err, "CUDA device %d does not exist (%d found)", device, count);
        return NULL;
    }
    struct cudaDeviceProp prop;
    if ((e = cudaSetDevice(device)) != cudaSuccess ||
        (e = cudaGetDeviceProperties(&prop, device)) != cudaSuccess) {
        pt_fail(err, "CUDA device %d: %s", device, cudaGetErrorString(e));
        return NULL;
    }
    if (prop.major < 8) {
        pt_fail(err, "CUDA device %d (%s) has compute capability %d.%d; Petrel needs 8.0 or newer",
                device, prop.name, prop.major, prop.minor);
        return NULL;
    }
    cuda_backend *cb = pt_xcalloc(1, sizeof *cb);
    cb->device = device;
    cb->n_sm = prop.multiProcessorCount;
    if ((e = cudaStreamCreateWithFlags(&cb->stream, cudaStreamNonBlocking)) != cudaSuccess) {
        pt_fail(err, "CUDA stream: %s", cudaGetErrorString(e));
        free(cb);
        return NULL;
    }
    cublasStatus_t st = cublasCreate(&cb->cublas);
    if (st != CUBLAS_STATUS_SUCCESS) {
        pt_fail(err, "cuBLAS: %s", cublasGetStatusString(st));
        cudaStreamDestroy(cb->stream);
        free(cb);
        return NULL;
    }
    cublasSetStream(cb->cublas, cb->stream);
    cublasSetMathMode(cb->cublas, CUBLAS_DEFAULT_MATH); /* no TF32 for f32 weights */
    /* Our own workspace: cuBLAS then allocates nothing inside graph capture. */
    if (cudaMalloc(&cb->cublas_ws, CUBLAS_WORKSPACE) == cudaSuccess)
        cublasSetWorkspace(cb->cublas, cb->cublas_ws, CUBLAS_WORKSPACE);
    else
        cb->cublas_ws = NULL;
    cu_attention_init();
    cu_kvq_init();
    cu_gemv_init(cb->n_sm);
    cu_qgemv_init(cb->n_sm);
    cb->gemv_max = env_int("PETREL_CUDA_GEMV_MAX", CU_GEMV_DEFAULT_ROWS);
    if (cb->gemv_max > CU_GEMV_MAX_ROWS) cb->gemv_max = CU_GEMV_MAX_ROWS;
    cb->qgemv_max = env_int("PETREL_CUDA_QGEMV_MAX", CU_QGEMV_DEFAULT_ROWS);
    if (cb->qgemv_max > CU_QGEMV_MAX_ROWS) cb->qgemv_max = CU_QGEMV_MAX_ROWS;
    const char *attn = getenv("PETREL_CUDA_ATTN");
    cb->simple_attn = attn && strcmp(attn, "simple") == 0;
    cb->tiled_attn = attn && strcmp(attn, "tiled") == 0;
    cb->sync_each = env_int("PETREL_CUDA_SYNC", 0) != 0;
    cb->use_graphs = !cb->sync_each && env_int("PETREL_CUDA_GRAPHS", 1) != 0;
    cu_pdl = prop.major >= 9 && env_int("PETREL_CUDA_PDL", 1) != 0;
    cu_gemv_mode = (env_int("PETREL_CUDA_GEMV_PERSIST", 1) != 0) |
                   (env_int("PETREL_CUDA_GEMV_PDL", 0) != 0) << 1;
    snprintf(cb->detail, sizeof cb->detail, "%.100s, sm_%d%d, %d SMs, %.0f GiB", prop.name,
             prop.major, prop.minor, prop.multiProcessorCount,
             prop.totalGlobalMem / 1073741824.0);
    cb->base.ops = &cuda_ops;
    cb->base.name = "cuda";
    cb->base.detail = cb->detail;
    cb->base.n_threads = 1;
    cb->base.host_memory = false;
    return &cb->base;
}
