/*
 * cuda_backend.c - the CUDA backend: device memory, one stream, the op
 * switch and the op table.  Ops arrive as pt_op records (backend.h): run
 * checks what the kernels take, grows scratch, and records the op
 * (cuda_graph.c replays decode-sized bursts as CUDA graphs) or, with graphs
 * off, launches it at once.  cuda_exec_op is the one switch from a record
 * to its launcher in the .cu file of its family (ops.cu, matmul.cu,
 * qmatmul.cu, attention.cu, attn_kvq.cu, family_ops.cu, moe.cu) or to cuBLAS.
 *
 * The model-family ops (attention_ext, geglu, scale, softcap, moe_route,
 * matmul_id, moe_combine, swiglu_oai, add_id; the Gated DeltaNet ops
 * gather_cols, sigmoid_mul, conv1d_silu, gated_delta, rmsnorm_gated; and
 * DeepSeek's copy_cols and moe_route_grouped; cuda_family.h) have first,
 * plain kernels:
 * moe_ffn (the routed FFN as one op) runs as two fused kernels at decode,
 * else as the launchers of the ops it stands for;
 * matmul_id sorts the (row, slot) pairs by expert on the device (the ids
 * never come to the host, so a decode step stays one graph) and launches
 * blocks only for the experts some row chose (moe.cu); the state ops walk
 * each sequence's rows in order inside one launch (positions and sequences
 * stay on the device, so they too stay in the graph).  argmax (ops.cu)
 * picks greedy tokens, so a decode step downloads ids instead of logits.
 *
 * Nothing here waits for the GPU except download (the caller reads the
 * bytes next) and sync, so the host runs ahead.  Ops return nothing, so a
 * CUDA error found later (a failed launch, a fault inside a kernel) cannot
 * be handed to the op that caused it: every failure (CUDA and cuBLAS
 * errors, scratch that cannot grow, a shape no kernel takes) goes to the
 * backend's sticky error (backend.h), later ops are dropped, and download
 * and sync return -1 rather than hand back numbers from a broken device.
 * Errors inside kernels leave the CUDA context unusable: every later call
 * fails too, and the server answers each request with the error.
 * PETREL_CUDA_SYNC=1 runs every op at once and synchronizes after it,
 * which names the op that failed.
 *
 * Matmul: up to gemv_max token rows (PETREL_CUDA_GEMV_MAX, default 16) run
 * the weight-streaming GEMV kernels with f32 activations; more rows go to
 * cuBLAS: f32 weights by cublasSgemm (no TF32), f16/bf16 weights by
 * cublasGemmEx after the activations are rounded to the weights' type, with
 * f32 accumulation and f32 output.
 *
 * Quantized weights (GGUF q8_0/q4_0/q4_k/q5_k/q6_k, MLX affine) stay as the
 * file stores them, except q4_0/q8_0 matrices, which the loader has this
 * backend rewrite in place (weight_layout, repack: each
 * row's codes, then its scales; PETREL_CUDA_REPACK=0 keeps the file's):
 * up to qgemv_max token rows (PETREL_CUDA_QGEMV_MAX,
 * default 16) run the quantized GEMV of qmatmul.cu; q4_0/q8_0 weights
 * in the split layout up to PETREL_CUDA_QMMS_MAX rows (default 128 for
 * q4_0, 64 for q8_0; PETREL_CUDA_QMMS=0 turns it off) run the tensor-core GEMM of
 * qmms.cu, which reads the weight once and writes no copy of it; in the
 * file's layout, with PETREL_CUDA_QMMA=1, up to qmma_max rows
 * (PETREL_CUDA_QMMA_MAX, default 256) qmma.cu's; other calls dequantize
 * the weight to f16 in a scratch
 * buffer and run cublasGemmEx; quantized embedding tables are dequantized
 * row by row.
 *
 * Knobs (environment, read when the backend is created): PETREL_CUDA_GRAPHS,
 * PETREL_CUDA_PDL, PETREL_CUDA_GEMV_MAX, PETREL_CUDA_QGEMV_MAX, PETREL_CUDA_GEMV_PERSIST,
 * PETREL_CUDA_GEMV_PDL, PETREL_CUDA_QMMA, PETREL_CUDA_QMMA_MAX, PETREL_CUDA_QMMS,
 * PETREL_CUDA_QMMS_MAX, PETREL_CUDA_QMMS_MT, PETREL_CUDA_REPACK,
 * PETREL_CUDA_ATTN=simple|tiled, PETREL_CUDA_SYNC, PETREL_CUDA_FUSE (0: every
 * recorded op launched alone, not fused by cuda_fuse.c; a mask of what to
 * fuse, cuda_host.h),
 * PETREL_CUDA_MOE_FUSED (token rows up to which moe_ffn with quantized
 * experts runs as moe.cu's two fused kernels, default 8; 0: never),
 * PETREL_CUDA_MOE_RPW (gate rows per warp of that up kernel, 1..4,
 * default 2: more rows, fewer blocks and more bytes in flight each),
 * PETREL_CUDA_MOE_FFN (1: session 9's two fused kernels instead of session
 * 11's, same bits; for A/B),
 * PETREL_CUDA_MOE_MMA (token rows from which matmul_id with quantized
 * experts, and so moe_ffn past the fused rows, runs moe_mma.cu's grouped
 * GEMM on the tensor cores, default 32; 0: never),
 * PETREL_CUDA_GDN_CHUNK (rows per sequence from which the gated delta rule
 * runs chunkwise, default 16; 0: always row by row), PETREL_CUDA_KVQ_MMA
 * (0: TurboQuant k8 caches keep attn_kvq.cu's FMA kernel, not its
 * tensor-core one).
 */
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "backend/comm.h"
#include "backend/repack.h"
#include "backend/cuda/cuda_family.h"
#include "backend/cuda/cuda_host.h"
#include "backend/cuda/qmma.h"

#define CUBLAS_WORKSPACE ((size_t)32 << 20)

void cuda_use_device(cuda_backend *cb) {
    int cur = -1;
    if (cudaGetDevice(&cur) != cudaSuccess || cur != cb->device) cudaSetDevice(cb->device);
}

cuda_backend *cb_of(pt_backend *be) {
    if (be) cuda_use_device((cuda_backend *)be);
    return (cuda_backend *)be;
}

int cuda_fail(cuda_backend *cb, const char *what, const char *msg) {
    return pt_be_fail(&cb->base, what, "%s", msg);
}

bool cuda_ok(cuda_backend *cb, cudaError_t e, const char *what) {
    if (e == cudaSuccess) return true;
    cuda_fail(cb, what, cudaGetErrorString(e));
    return false;
}

static void check_blas(cuda_backend *cb, cublasStatus_t st, const char *what) {
    if (st != CUBLAS_STATUS_SUCCESS) cuda_fail(cb, what, cublasGetStatusString(st));
}

/* After each op: a launch error now, or with PETREL_CUDA_SYNC any error. */
static void op_done(cuda_backend *cb, const char *op) {
    if (cuda_ok(cb, cudaGetLastError(), op) && cb->sync_each)
        cuda_ok(cb, cudaStreamSynchronize(cb->ctx.s), op);
}

static int dtype_code(pt_dtype t) {
    switch (t) {
    case PT_F32: return CU_F32;
    case PT_F16: return CU_F16;
    case PT_BF16: return CU_BF16;
    default: return -1;
    }
}

/* Grows a device scratch buffer (rarely: by half again); -1 (sticky
 * error set) when the device is out of memory. */
static int scratch(cuda_backend *cb, void **buf, size_t *cap, size_t need, const char *what) {
    if (need <= *cap) return 0;
    cuda_use_device(cb); /* run records without switching devices: this allocates */
    if (!cuda_ok(cb, cudaStreamSynchronize(cb->ctx.s), what)) return -1;
    if (*buf) cudaFree(*buf);
    size_t n = need + need / 2;
    if (cudaMalloc(buf, n) != cudaSuccess) {
        cudaGetLastError(); /* out of memory is not sticky in CUDA: the device is fine */
        *buf = NULL;
        *cap = 0;
        return pt_be_fail(&cb->base, what, "cannot allocate %.1f MiB of device scratch",
                          n / 1048576.0);
    }
    *cap = n;
    return 0;
}

/* ---- Memory --------------------------------------------------------------- */

static void *cuda_alloc(pt_backend *be, size_t nbytes) {
    cuda_backend *cb = cb_of(be);
    cuda_flush(cb);
    void *p = NULL;
    if (cudaMalloc(&p, nbytes ? nbytes : 1) != cudaSuccess) {
        cudaGetLastError(); /* clear the error: a failed alloc is reported by NULL */
        return NULL;
    }
    if (cudaMemsetAsync(p, 0, nbytes, cb->ctx.s) != cudaSuccess) {
        cudaGetLastError();
        cudaFree(p);
        return NULL;
    }
    return p;
}

static void cuda_free(pt_backend *be, void *p, size_t nbytes) {
    (void)nbytes;
    if (!p) return;
    cuda_backend *cb = cb_of(be);
    cuda_flush(cb);
    cuda_ok(cb, cudaStreamSynchronize(cb->ctx.s), "free");
    cuda_ok(cb, cudaFree(p), "free");
}

/* From pageable host memory the copy returns once the bytes are staged, so
 * the caller may reuse src at once; it runs in stream order. */
static void cuda_upload(pt_backend *be, void *dst, const void *src, size_t nbytes) {
    if (!nbytes) return;
    cuda_backend *cb = cb_of(be);
    cuda_flush(cb); /* recorded ops come first in stream order */
    cuda_ok(cb, cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyHostToDevice, cb->ctx.s), "upload");
}

static int cuda_download(pt_backend *be, void *dst, const void *src, size_t nbytes) {
    cuda_backend *cb = cb_of(be);
    cuda_flush(cb);
    if (nbytes && !cb->base.failed)
        cuda_ok(cb, cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToHost, cb->ctx.s), "download");
    cuda_ok(cb, cudaStreamSynchronize(cb->ctx.s), "download");
    return cb->base.failed ? -1 : 0;
}

static void cuda_copy(pt_backend *be, void *dst, const void *src, size_t nbytes) {
    if (!nbytes) return;
    cuda_backend *cb = cb_of(be);
    cuda_flush(cb);
    cuda_ok(cb, cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToDevice, cb->ctx.s), "copy");
}

static size_t cuda_free_memory(pt_backend *be) {
    size_t free_b = 0, total = 0;
    cb_of(be); /* of this backend's device */
    return cudaMemGetInfo(&free_b, &total) == cudaSuccess ? free_b : 0;
}

static int cuda_sync(pt_backend *be) {
    cuda_backend *cb = cb_of(be);
    cuda_flush(cb);
    if (cuda_ok(cb, cudaStreamSynchronize(cb->ctx.s), "sync"))
        cuda_ok(cb, cudaGetLastError(), "sync");
    return cb->base.failed ? -1 : 0;
}

/* ---- Ops: checked, recorded, then run directly or as a CUDA graph ---------- */

static bool is_quantized(pt_dtype t) {
    return t == PT_Q8_0 || t == PT_Q4_0 || t == PT_Q4_K || t == PT_Q5_K || t == PT_Q6_K ||
           t == PT_AFFINE || t == PT_MXFP4;
}

/* The kernels' view of a quantized weight (fmt -1: not a format they know). */
static cu_qweight qweight_of(const pt_weight *w) {
    cu_qweight q = {w->data, w->scales, w->biases, w->rows, w->cols, -1, 0, 0, 0, CU_LAYOUT_FILE};
    if (w->layout == PT_LAYOUT_ROWSPLIT) q.layout = CU_LAYOUT_SPLIT;
    else if (w->layout != PT_LAYOUT_FILE) q.layout = -1; /* another backend's: refused */
    switch (w->dtype) {
    case PT_Q8_0: q.fmt = CU_Q8_0; break;
    case PT_Q4_0: q.fmt = CU_Q4_0; break;
    case PT_Q4_K: q.fmt = CU_Q4_K; break;
    case PT_Q5_K: q.fmt = CU_Q5_K; break;
    case PT_Q6_K: q.fmt = CU_Q6_K; break;
    case PT_MXFP4: q.fmt = CU_MXFP4; break; /* matmul_id only (cu_qweight_ok refuses it) */
    case PT_AFFINE:
        q.fmt = w->bits == 4 ? CU_AFF4 : w->bits == 8 ? CU_AFF8 : CU_AFFN;
        q.bits = w->bits, q.group = w->group_size, q.scale_type = dtype_code(w->scale_dtype);
        break;
    default: break;
    }
    return q;
}

/* -1 (sticky error) if the kernels do not take this quantized weight. */
static int check_qweight(cuda_backend *cb, const pt_weight *w, const char *op) {
    cu_qweight q = qweight_of(w);
    if (q.fmt < 0) return cuda_fail(cb, op, "weight type not supported by the CUDA backend");
    if (!cu_qweight_ok(&q))
        return pt_be_fail(&cb->base, op, "%s weight of %lldx%lld (bits %d, group %d) not "
                          "supported by the CUDA kernels", pt_dtype_name(w->dtype),
                          (long long)w->rows, (long long)w->cols, w->bits, w->group_size);
    return 0;
}

static cu_attn_args attn_args(const cuda_backend *cb, const pt_op_attention *a) {
    const pt_kv_view *kv = &a->kv;
    cu_attn_args r = {
        .out = a->out, .q = a->q, .k = kv->k, .v = kv->v, .dtype = dtype_code(kv->dtype),
        .page_size = kv->page_size, .n_kv_heads = kv->n_kv_heads, .head_dim = kv->head_dim,
        .pos = a->b.pos, .seq = a->b.seq, .block_table = a->b.block_table,
        .max_pages = a->b.max_pages, .n = a->b.n_tokens, .n_heads = a->n_heads,
        .n_seqs = a->b.n_seqs, .scale = a->scale, .tiled_only = cb->tiled_attn,
    };
    return r;
}

/* A quantized-cache op's arguments (out and q are NULL for kv_store). */
static cu_kvq_args kvq_args(const pt_kv_view *kv, const pt_batch_view *b, float *out,
                            const float *q, int n_heads, float scale) {
    cu_kvq_args a = {
        .out = out, .q = q, .k = kv->k, .v = kv->v, .tables = kv->tables, .kvq = kv->kvq,
        .k_bits = kv->k_bits, .v_bits = kv->v_bits, .group = kv->group, .k_row = kv->k_row,
        .v_row = kv->v_row, .page_size = kv->page_size, .n_kv_heads = kv->n_kv_heads,
        .head_dim = kv->head_dim, .pos = b->pos, .seq = b->seq, .block_table = b->block_table,
        .max_pages = b->max_pages, .n = b->n_tokens, .n_heads = n_heads, .scale = scale,
    };
    return a;
}

static cu_kvq_args kvq_attention_args(const pt_op_attention *a) {
    return kvq_args(&a->kv, &a->b, a->out, a->q, a->n_heads, a->scale);
}

static void exec_matmul(cuda_backend *cb, const pt_op_matmul *a) {
    const pt_weight *w = &a->w;
    int wt = dtype_code(w->dtype), rows = (int)w->rows, cols = (int)w->cols, n = a->n;
    if (n <= cb->gemv_max && cu_gemv(&cb->ctx, a->y, a->x, w->data, wt, rows, cols, n) == 0)
        return;
    const float one = 1.0f, zero = 0.0f;
    if (wt == CU_F32) {
        check_blas(cb, cublasSgemm(cb->cublas, CUBLAS_OP_T, CUBLAS_OP_N, rows, n, cols, &one, w->data,
                               cols, a->x, cols, &zero, a->y, rows),
                   "matmul (cublasSgemm)");
        return;
    }
    cu_convert_from_f32(&cb->ctx, cb->act16, wt, a->x, (size_t)n * cols);
    cudaDataType_t t = wt == CU_BF16 ? CUDA_R_16BF : CUDA_R_16F;
    check_blas(cb, cublasGemmEx(cb->cublas, CUBLAS_OP_T, CUBLAS_OP_N, rows, n, cols, &one, w->data, t,
                            cols, cb->act16, t, cols, &zero, a->y, CUDA_R_32F, rows,
                            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               "matmul (cublasGemmEx)");
}

/* Whether an n-row matmul of x by w takes the tensor-core GEMM (qmma.cu);
 * decided the same way when the op is recorded (its scratch) and run, so
 * a call it takes never falls back to the cuBLAS path, whose weight
 * scratch was not grown. */
static bool use_qmma(const cuda_backend *cb, const cu_qweight *w, const float *x, int n) {
    return w->layout == CU_LAYOUT_FILE && n > cb->qgemv_max && n <= cb->qmma_max && cb->qmma_cnt &&
           ((uintptr_t)x & 15) == 0 &&
           cu_qmma_takes(w, n);
}

/* The same for the split layout's tensor-core GEMM (qmms.cu): past the
 * GEMV up to PETREL_CUDA_QMMS_MAX rows, by default 128 for q4_0 and 64 for
 * q8_0, where it measured faster than dequantize + cuBLAS on the H200 for
 * the 8B shapes (docs/cuda.md, "Batched decode": q4_0 1.00-2.03x at 128
 * rows but gpt-oss's 4096x2880 0.96x; q8_0 at 128 rows 0.75-0.99x on
 * three of six shapes; both slower at 512). */
static bool use_qmms(const cuda_backend *cb, const cu_qweight *w, const float *x, int n) {
    int max = cb->qmms_max > 0 ? cb->qmms_max : w->fmt == CU_Q4_0 ? 128 : 64;
    return cb->qmms && w->layout == CU_LAYOUT_SPLIT && n > cb->qgemv_max && n <= max &&
           ((uintptr_t)x & 15) == 0 && cu_qmms_takes(w, n);
}

static void exec_qmatmul(cuda_backend *cb, const pt_op_matmul *a) {
    cu_qweight w = qweight_of(&a->w);
    int n = a->n;
    if (n <= cb->qgemv_max && cu_qgemv(&cb->ctx, a->y, a->x, &w, n) == 0) return;
    if (use_qmms(cb, &w, a->x, n)) {
        if (cu_qmms(&cb->ctx, a->y, a->x, &w, n, cb->act16))
            cuda_fail(cb, "matmul", "the tensor-core GEMM refused a call it was planned for");
        return;
    }
    if (use_qmma(cb, &w, a->x, n)) {
        if (cu_qmma(&cb->ctx, a->y, a->x, &w, n, cb->act16, cb->qmma_part, cb->qmma_cnt))
            cuda_fail(cb, "matmul", "the tensor-core GEMM refused a call it was planned for");
        return;
    }
    /* Prefill and batches past the GEMV: the weight as f16 into scratch,
     * then the tensor cores.  (Dequantizing a slice of rows at a time, so
     * that cuBLAS would read each from the L2, measured slower: 2,908 and
     * 2,327 tok/s at 64 sequences with 32 and 16 MiB slices against 3,108
     * whole; docs/cuda.md, "Batched decode".) */
    if (cu_qdequant_f16(&cb->ctx, cb->wdeq, &w)) {
        cuda_fail(cb, "matmul", "no kernel for this quantized weight's shape");
        return;
    }
    if (cb->profile && cb->prof_step >= 0)
        cb->prof_deq = cudaEventRecord(cb->prof_ev[2], cb->ctx.s) == cudaSuccess;
    cu_convert_from_f32(&cb->ctx, cb->act16, CU_F16, a->x, (size_t)n * (size_t)w.cols);
    const float one = 1.0f, zero = 0.0f;
    int rows = (int)w.rows, cols = (int)w.cols;
    check_blas(cb, cublasGemmEx(cb->cublas, CUBLAS_OP_T, CUBLAS_OP_N, rows, n, cols, &one, cb->wdeq,
                            CUDA_R_16F, cols, cb->act16, CUDA_R_16F, cols, &zero, a->y, CUDA_R_32F,
                            rows, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               "matmul (quantized weights, cublasGemmEx)");
}

static void exec_embed(cuda_backend *cb, const pt_op_embed *a) {
    const pt_weight *t = &a->table;
    if (is_quantized(t->dtype)) {
        cu_qweight w = qweight_of(t);
        if (cu_qembed(&cb->ctx, a->y, &w, a->ids, a->n))
            cuda_fail(cb, "embed", "no kernel for this quantized table's shape");
        return;
    }
    cu_embed(&cb->ctx, a->y, t->data, dtype_code(t->dtype), t->rows, t->cols, a->ids, a->n);
}

static void exec_kv_store(cuda_backend *cb, const pt_op_kv_store *a) {
    const pt_kv_view *kv = &a->kv;
    const pt_batch_view *b = &a->b;
    if (kv->codec) { /* formats were checked when the op was recorded: -1 is a bug */
        cu_kvq_args q = kvq_args(kv, b, NULL, NULL, kv->n_kv_heads, 0);
        if (cu_kvq_store(&cb->ctx, &q, a->k, a->v))
            cuda_fail(cb, "kv_store", "no kernel for this quantized cache's shape");
        return;
    }
    cu_kv_store(&cb->ctx, kv->k, kv->v, dtype_code(kv->dtype), kv->page_size, kv->n_kv_heads,
                kv->head_dim, b->pos, b->seq, b->block_table, b->max_pages, b->n_tokens, a->k,
                a->v);
}

static void exec_attention(cuda_backend *cb, const pt_op_attention *a) {
    if (a->kv.codec) {
        cu_kvq_args q = kvq_attention_args(a);
        if (cu_kvq_attention(&cb->ctx, &q, cb->ctx.n_sm, cb->attn_scratch))
            cuda_fail(cb, "attention", "no kernel for this quantized cache's shape");
        return;
    }
    cu_attn_args r = attn_args(cb, a);
    if (cb->simple_attn) cu_attention_simple(&cb->ctx, &r);
    else cu_attention(&cb->ctx, &r, cb->ctx.n_sm, cb->attn_scratch);
}

/* Windows and soft-caps take attention.cu's kernels where they have
 * them (the wide kernel: head_dim 256, latent rows; Gemma 2/3), which
 * hand other shapes to the ext kernel; sinks (gpt-oss) go to it always. */
static cu_attn_args ext_args(const cuda_backend *cb, const pt_op_attention_ext *a) {
    pt_op_attention plain = {a->out, a->q, a->kv, a->b, a->n_heads, a->p.scale};
    cu_attn_args r = attn_args(cb, &plain);
    r.window = a->p.window;
    r.softcap = a->p.softcap;
    return r;
}

static bool ext_fast(const cuda_backend *cb, const pt_op_attention_ext *a) {
    return !a->p.sinks && !cb->simple_attn;
}

static void exec_attention_ext(cuda_backend *cb, const pt_op_attention_ext *a) {
    cu_attn_args r = ext_args(cb, a);
    if (ext_fast(cb, a)) cu_attention(&cb->ctx, &r, cb->ctx.n_sm, cb->attn_scratch);
    else cu_attention_ext(&cb->ctx, &r, a->p.window, a->p.softcap, a->p.sinks);
}

/* Activation block the quantized experts round x by: an affine group, or
 * the 32 elements of a GGUF block; 0 for f32/f16/bf16 experts. */
static int moe_group(const pt_weight *w) {
    if (!is_quantized(w->dtype)) return 0;
    return w->dtype == PT_AFFINE ? w->group_size : 32;
}

/* Whether matmul_id over w at n token rows takes the grouped GEMM. */
static bool moe_mma_rows(const cuda_backend *cb, const pt_weight *w, int n) {
    return cb->moe_mma > 0 && n >= cb->moe_mma && is_quantized(w->dtype);
}

/* y = x · W[ids]ᵀ: at many rows the grouped GEMM (moe_mma.cu), else the
 * sort and codes (cu_moe_prep), then the matmul. */
static void run_matmul_id(cuda_backend *cb, float *y, const float *x, const pt_weight *w,
                          const int32_t *ids, int n, int k, int x_slots) {
    int pairs = n * k, rc;
    if (moe_mma_rows(cb, w, n)) {
        pt_weight e0 = pt_weight_expert(w, 0);
        cu_qweight q = qweight_of(&e0);
        if (cu_moe_mma(&cb->ctx, y, x, &q, w->expert_stride, w->n_experts, ids, cb->moe_scratch,
                       pairs, k, x_slots) == 0)
            return;
    }
    if (cu_moe_prep(&cb->ctx, cb->moe_scratch, ids, pairs, w->n_experts, x, n * x_slots,
                    (int)w->cols, moe_group(w))) {
        cuda_fail(cb, "matmul_id", "no kernel for this stack of experts (too many experts, or an "
                                   "input that is not 16-byte aligned)");
        return;
    }
    if (is_quantized(w->dtype)) {
        pt_weight e0 = pt_weight_expert(w, 0);
        cu_qweight q = qweight_of(&e0);
        rc = cu_qmatmul_id(&cb->ctx, y, &q, w->expert_stride, w->n_experts, cb->moe_scratch,
                           pairs, k, x_slots);
    } else {
        rc = cu_matmul_id(&cb->ctx, y, x, w->data, dtype_code(w->dtype), w->expert_stride,
                          (int)w->rows, (int)w->cols, w->n_experts, cb->moe_scratch, pairs, k,
                          x_slots);
    }
    if (rc) cuda_fail(cb, "matmul_id", "no kernel for this stack of experts");
}

static void exec_matmul_id(cuda_backend *cb, const pt_op_matmul_id *a) {
    run_matmul_id(cb, a->y, a->x, &a->w, a->ids, a->n, a->k, a->x_slots);
}

/* The two fused kernels of moe.cu (decode, quantized experts); -1 when
 * they do not take the op. */
static int moe_ffn_fused(cuda_backend *cb, const pt_op_moe_ffn *a) {
    const pt_weight *w[3] = {a->w_gate, a->w_up, a->w_down};
    if (a->n > cb->moe_fused) return -1;
    for (int i = 0; i < 3; i++)
        if (!is_quantized(w[i]->dtype)) return -1;
    pt_weight g0 = pt_weight_expert(a->w_gate, 0), u0 = pt_weight_expert(a->w_up, 0);
    pt_weight d0 = pt_weight_expert(a->w_down, 0);
    cu_moe_ffn_args f = {
        .y = a->y, .x = a->x, .logits = a->logits, .gate = qweight_of(&g0),
        .up = qweight_of(&u0), .down = qweight_of(&d0), .gate_stride = a->w_gate->expert_stride,
        .up_stride = a->w_up->expert_stride, .down_stride = a->w_down->expert_stride,
        .gate_bias = a->gate_bias, .up_bias = a->up_bias, .down_bias = a->down_bias,
        .ids = a->ids, .weights = a->weights, .act = a->gate, .n = a->n,
        .n_experts = a->n_experts, .k = a->k, .act_kind = a->act, .renorm = a->renorm,
        .alpha = a->alpha, .limit = a->limit, .rows_per_warp = cb->moe_rpw,
        .kernels = cb->moe_kernels};
    return cu_moe_ffn(&cb->ctx, &f);
}

/* moe_ffn: two kernels at decode, else the op sequence it stands for
 * (backend.h), launcher by launcher. */
static void exec_moe_ffn(cuda_backend *cb, const pt_op_moe_ffn *a) {
    const cu_ctx *c = &cb->ctx;
    int n = a->n, k = a->k, f = (int)a->w_gate->rows, d = (int)a->w_down->rows;
    size_t count = (size_t)n * k * f;
    if (moe_ffn_fused(cb, a) == 0) return;
    if (cu_moe_route(c, a->ids, a->weights, a->logits, n, a->n_experts, k, a->renorm)) {
        pt_be_fail(&cb->base, "moe_ffn", "no kernel for top %d of %d experts", k, a->n_experts);
        return;
    }
    run_matmul_id(cb, a->gate, a->x, a->w_gate, a->ids, n, k, 1);
    run_matmul_id(cb, a->up, a->x, a->w_up, a->ids, n, k, 1);
    if (a->gate_bias) cu_add_id(c, a->gate, a->gate_bias, a->ids, n, k, f);
    if (a->up_bias) cu_add_id(c, a->up, a->up_bias, a->ids, n, k, f);
    if (a->act == PT_MOE_SWIGLU_OAI)
        cu_swiglu_oai(c, a->gate, a->gate, a->up, count, a->alpha, a->limit);
    else if (a->act == PT_MOE_GEGLU)
        cu_geglu(c, a->gate, a->gate, a->up, count);
    else
        cu_swiglu(c, a->gate, a->gate, a->up, count);
    run_matmul_id(cb, a->out, a->gate, a->w_down, a->ids, n, k, k);
    if (a->down_bias) cu_add_id(c, a->out, a->down_bias, a->ids, n, k, d);
    cu_moe_combine(c, a->y, a->out, a->weights, n, k, d);
}

/* The rows of a batch as the state ops read them. */
static cu_rows rows_of(const pt_batch_view *b) {
    cu_rows r = {.pos = b->pos, .seq = b->seq, .state_slot = b->state_slot, .n = b->n_tokens,
                 .n_seqs = b->n_seqs};
    return r;
}

static void exec_gated_delta(cuda_backend *cb, const pt_op_gated_delta *a) {
    cu_delta_args d = {.out = a->out, .qkv = a->qkv, .ba = a->ba, .A = a->A,
                       .dt_bias = a->dt_bias, .state = a->state, .r = rows_of(&a->b),
                       .n_k_heads = a->n_k_heads, .n_v_heads = a->n_v_heads, .dk = a->dk,
                       .dv = a->dv, .stride = a->stride, .tiled = a->tiled, .l2_eps = a->l2_eps};
    /* Chunkwise when the op allows chunks and the step's sequences bring
     * gdn_chunk rows each on average (a prefill); a decode step (a row per
     * sequence) stays recurrent. */
    d.chunked = a->chunk > 1 && cb->gdn_chunk > 0 &&
                (int64_t)a->b.n_tokens >= (int64_t)cb->gdn_chunk * a->b.n_seqs;
    if (cu_gated_delta(&cb->ctx, &d)) /* shapes were checked when the op was recorded */
        cuda_fail(cb, "gated_delta", "no kernel for this head shape");
}

static void exec_moe_route_grouped(cuda_backend *cb, const pt_op_moe_route_grouped *a) {
    cu_route_grouped_args r = {.ids = a->ids, .weights = a->weights, .logits = a->logits,
                               .bias = a->bias, .n = a->n, .n_experts = a->n_experts, .k = a->k,
                               .n_groups = a->n_groups, .groups_used = a->groups_used,
                               .gating = a->gating, .renorm = a->renorm, .scale = a->scale};
    if (cu_moe_route_grouped(&cb->ctx, &r))
        cuda_fail(cb, "moe_route_grouped", "no kernel for this routing");
}

static void exec_moe_route(cuda_backend *cb, const pt_op_moe_route *a) {
    if (cu_moe_route(&cb->ctx, a->ids, a->weights, a->logits, a->n, a->n_experts, a->k, a->renorm))
        pt_be_fail(&cb->base, "moe_route", "no kernel for top %d of %d experts", a->k, a->n_experts);
}

/* Enqueues one recorded op on the stream: the one switch from a record to
 * its launcher. */
void cuda_exec_op(cuda_backend *cb, const pt_op *o) {
    const cu_ctx *c = &cb->ctx;
    switch (o->kind) {
    case PT_OP_ALL_REDUCE: cuda_all_reduce(cb, &o->all_reduce); break;
    case PT_OP_MATMUL:
        if (is_quantized(o->matmul.w.dtype)) exec_qmatmul(cb, &o->matmul);
        else exec_matmul(cb, &o->matmul);
        break;
    case PT_OP_EMBED: exec_embed(cb, &o->embed); break;
    case PT_OP_RMSNORM: {
        const pt_op_rmsnorm *a = &o->rmsnorm;
        cu_rmsnorm(c, a->y, a->x, a->g, a->n, a->d, a->eps);
        break;
    }
    case PT_OP_ADD: cu_add(c, o->add.y, o->add.a, o->add.b, o->add.count); break;
    case PT_OP_ADD_BIAS: cu_add_bias(c, o->add_bias.y, o->add_bias.bias, o->add_bias.n, o->add_bias.d); break;
    case PT_OP_SWIGLU: cu_swiglu(c, o->swiglu.y, o->swiglu.gate, o->swiglu.up, o->swiglu.count); break;
    case PT_OP_ROPE: {
        const pt_op_rope *a = &o->rope;
        cu_rope(c, a->x, a->b.pos, a->b.n_tokens, a->n_heads, a->head_dim, a->rope.style,
                a->rope.n_rot, a->rope.inv_freq, a->rope.mscale);
        break;
    }
    case PT_OP_KV_STORE: exec_kv_store(cb, &o->kv_store); break;
    case PT_OP_ATTENTION: exec_attention(cb, &o->attention); break;
    case PT_OP_GATHER_ROWS: {
        const pt_op_gather_rows *a = &o->gather_rows;
        cu_gather_rows(c, a->dst, a->src, a->idx, a->n, a->d);
        break;
    }
    case PT_OP_ATTENTION_EXT: exec_attention_ext(cb, &o->attention_ext); break;
    case PT_OP_GEGLU: cu_geglu(c, o->geglu.y, o->geglu.gate, o->geglu.up, o->geglu.count); break;
    case PT_OP_SCALE: cu_scale(c, o->scale.x, o->scale.s, o->scale.count, 0); break;
    case PT_OP_SOFTCAP: cu_scale(c, o->scale.x, o->scale.s, o->scale.count, 1); break;
    case PT_OP_MOE_ROUTE: exec_moe_route(cb, &o->moe_route); break;
    case PT_OP_MATMUL_ID: exec_matmul_id(cb, &o->matmul_id); break;
    case PT_OP_MOE_COMBINE: {
        const pt_op_moe_combine *a = &o->moe_combine;
        cu_moe_combine(c, a->y, a->x, a->weights, a->n, a->k, a->d);
        break;
    }
    case PT_OP_SWIGLU_OAI: {
        const pt_op_swiglu_oai *a = &o->swiglu_oai;
        cu_swiglu_oai(c, a->y, a->gate, a->up, a->count, a->alpha, a->limit);
        break;
    }
    case PT_OP_ADD_ID: {
        const pt_op_add_id *a = &o->add_id;
        cu_add_id(c, a->y, a->bias, a->ids, a->n, a->k, a->d);
        break;
    }
    case PT_OP_GATHER_COLS: {
        const pt_op_gather_cols *a = &o->gather_cols;
        cu_gather_cols(c, a->dst, a->src, a->idx, a->n, a->d_src, a->d_dst);
        break;
    }
    case PT_OP_SIGMOID_MUL: {
        const pt_op_sigmoid_mul *a = &o->sigmoid_mul;
        cu_sigmoid_mul(c, a->y, a->x, a->g, a->n, a->d, a->g_d);
        break;
    }
    case PT_OP_CONV1D_SILU: {
        const pt_op_conv1d_silu *a = &o->conv1d_silu;
        cu_conv1d_silu(c, a->y, a->x, a->w, a->state, rows_of(&a->b), a->C, a->K);
        break;
    }
    case PT_OP_GATED_DELTA: exec_gated_delta(cb, &o->gated_delta); break;
    case PT_OP_RMSNORM_GATED: {
        const pt_op_rmsnorm_gated *a = &o->rmsnorm_gated;
        cu_rmsnorm_gated(c, a->y, a->x, a->z, a->w, a->n, a->d, a->eps);
        break;
    }
    case PT_OP_COPY_COLS: {
        const pt_op_copy_cols *a = &o->copy_cols;
        cu_copy_cols(c, a->dst, a->d_dst, a->dst_off, a->src, a->d_src, a->src_off, a->width, a->n);
        break;
    }
    case PT_OP_MOE_ROUTE_GROUPED: exec_moe_route_grouped(cb, &o->moe_route_grouped); break;
    case PT_OP_MOE_FFN: exec_moe_ffn(cb, &o->moe_ffn); break;
    case PT_OP_ARGMAX: cu_argmax(c, o->argmax.ids, o->argmax.x, o->argmax.n, o->argmax.d); break;
    default: cuda_fail(cb, pt_op_name(o->kind), "op has no CUDA implementation");
    }
}

/* Token rows an op works on: a burst of ops on few rows may become a graph.
 * 0 for ops whose cost does not grow with rows (elementwise, and per-head
 * norms, which have many short rows). */
static int op_rows(const pt_op *o) {
    switch (o->kind) {
    case PT_OP_MATMUL: return o->matmul.n;
    case PT_OP_EMBED: return o->embed.n;
    case PT_OP_ADD_BIAS: return o->add_bias.n;
    case PT_OP_ROPE: return o->rope.b.n_tokens;
    case PT_OP_KV_STORE: return o->kv_store.b.n_tokens;
    case PT_OP_ATTENTION: return o->attention.b.n_tokens;
    case PT_OP_GATHER_ROWS: return o->gather_rows.n;
    case PT_OP_ATTENTION_EXT: return o->attention_ext.b.n_tokens;
    case PT_OP_MATMUL_ID: return o->matmul_id.n;
    case PT_OP_GATHER_COLS: return o->gather_cols.n;
    case PT_OP_SIGMOID_MUL: return o->sigmoid_mul.n;
    case PT_OP_CONV1D_SILU: return o->conv1d_silu.b.n_tokens;
    case PT_OP_GATED_DELTA: return o->gated_delta.b.n_tokens;
    case PT_OP_MOE_ROUTE_GROUPED: return o->moe_route_grouped.n;
    case PT_OP_MOE_FFN: return o->moe_ffn.n;
    case PT_OP_ARGMAX: return o->argmax.n;
    default: return 0;
    }
}

/* check_op for the recurrent and latent-attention ops: the CPU backend's
 * refusals (it stops the process; here the step fails with the message),
 * and the limits of the CUDA kernels. */
static int check_family_op(cuda_backend *cb, const pt_op *o, const char *name) {
    char msg[160];
    switch (o->kind) {
    case PT_OP_SIGMOID_MUL:
        if (o->sigmoid_mul.g_d != 1 && o->sigmoid_mul.g_d != o->sigmoid_mul.d) {
            snprintf(msg, sizeof msg, "gate rows of %d for rows of %d", o->sigmoid_mul.g_d,
                     o->sigmoid_mul.d);
            return cuda_fail(cb, name, msg);
        }
        return 0;
    case PT_OP_CONV1D_SILU: {
        const pt_op_conv1d_silu *a = &o->conv1d_silu;
        if (a->K < 1 || a->C < 1) {
            snprintf(msg, sizeof msg, "kernel %d over %d channels", a->K, a->C);
            return cuda_fail(cb, name, msg);
        }
        if (a->y == a->x) return cuda_fail(cb, name, "y must not alias x");
        if (!a->b.state_slot) return cuda_fail(cb, name, "the batch has no recurrent-state slots");
        return 0;
    }
    case PT_OP_GATED_DELTA: {
        const pt_op_gated_delta *a = &o->gated_delta;
        if (!a->b.state_slot) return cuda_fail(cb, name, "the batch has no recurrent-state slots");
        if (a->n_k_heads < 1 || a->n_v_heads % a->n_k_heads) {
            snprintf(msg, sizeof msg, "%d value heads over %d key heads", a->n_v_heads,
                     a->n_k_heads);
            return cuda_fail(cb, name, msg);
        }
        if (a->dk < 1 || a->dk > CU_DELTA_MAX_DK || a->dv < 1) {
            snprintf(msg, sizeof msg, "key head dim %d (value %d): the CUDA kernel takes key heads "
                     "of 1 to %d", a->dk, a->dv, CU_DELTA_MAX_DK);
            return cuda_fail(cb, name, msg);
        }
        return 0;
    }
    case PT_OP_COPY_COLS: {
        const pt_op_copy_cols *a = &o->copy_cols;
        if (a->width < 0 || a->src_off < 0 || a->dst_off < 0 || a->src_off + a->width > a->d_src ||
            a->dst_off + a->width > a->d_dst) {
            snprintf(msg, sizeof msg, "columns [%d, %d) of %d into [%d, %d) of %d", a->src_off,
                     a->src_off + a->width, a->d_src, a->dst_off, a->dst_off + a->width, a->d_dst);
            return cuda_fail(cb, name, msg);
        }
        return 0;
    }
    case PT_OP_MOE_ROUTE_GROUPED: {
        const pt_op_moe_route_grouped *a = &o->moe_route_grouped;
        bool grouped = a->n_groups > 1;
        if (a->n_experts <= 0 || a->n_experts > CU_MOE_MAX_EXPERTS || a->k <= 0 ||
            (grouped && (a->n_experts % a->n_groups || a->groups_used <= 0 ||
                         a->groups_used > a->n_groups ||
                         a->k > a->groups_used * (a->n_experts / a->n_groups))) ||
            (!grouped && a->k > a->n_experts)) {
            snprintf(msg, sizeof msg, "top %d of %d experts in %d groups (%d used)", a->k,
                     a->n_experts, a->n_groups, a->groups_used);
            return cuda_fail(cb, name, msg);
        }
        return 0;
    }
    default: return 0;
    }
}

/* -1 (sticky error) for a stack of experts matmul_id's kernels do not take. */
static int check_experts(cuda_backend *cb, const pt_weight *w, const char *name) {
    if (w->n_experts < 1 || w->n_experts > CU_MOE_MAX_EXPERTS)
        return pt_be_fail(&cb->base, name, "a stack of %d experts is not supported", w->n_experts);
    if (is_quantized(w->dtype)) {
        pt_weight e0 = pt_weight_expert(w, 0);
        cu_qweight q = qweight_of(&e0);
        if (q.fmt < 0 || !cu_moe_qweight_ok(&q))
            return pt_be_fail(&cb->base, name, "%s experts of %lldx%lld (bits %d, group %d) not "
                              "supported by the CUDA kernels", pt_dtype_name(w->dtype),
                              (long long)w->rows, (long long)w->cols, w->bits, w->group_size);
        if (w->expert_stride % 2 && w->dtype != PT_MXFP4)
            return cuda_fail(cb, name, "quantized experts at odd byte offsets");
    } else if (dtype_code(w->dtype) < 0) {
        return cuda_fail(cb, name, "weight type not supported by the CUDA backend");
    }
    return 0;
}

/* -1 (sticky error) for arguments the kernels do not take, before anything
 * is queued. */
static int check_op(cuda_backend *cb, const pt_op *o) {
    const char *name = pt_op_name(o->kind);
    if (o->kind == PT_OP_MATMUL || o->kind == PT_OP_EMBED) {
        const pt_weight *w = o->kind == PT_OP_MATMUL ? &o->matmul.w : &o->embed.table;
        if (is_quantized(w->dtype)) return check_qweight(cb, w, name);
        if (dtype_code(w->dtype) < 0)
            return cuda_fail(cb, name, "weight type not supported by the CUDA backend");
    }
    if (o->kind == PT_OP_MATMUL_ID) {
        const pt_op_matmul_id *a = &o->matmul_id;
        if (a->k < 1 || (a->x_slots != 1 && a->x_slots != a->k))
            return pt_be_fail(&cb->base, name, "%d input slots for top %d", a->x_slots, a->k);
        return check_experts(cb, &a->w, name);
    }
    if (o->kind == PT_OP_MOE_FFN) {
        const pt_op_moe_ffn *a = &o->moe_ffn;
        if (a->n_experts > CU_MOE_MAX_EXPERTS || a->k < 1 || a->k > 32 || a->k > a->n_experts)
            return pt_be_fail(&cb->base, name, "top %d of %d experts is not supported", a->k,
                              a->n_experts);
        if (a->w_up->rows != a->w_gate->rows || a->w_up->cols != a->w_gate->cols ||
            a->w_down->cols != a->w_gate->rows || a->w_down->rows != a->w_gate->cols ||
            a->w_gate->n_experts != a->n_experts || a->w_up->n_experts != a->n_experts ||
            a->w_down->n_experts != a->n_experts)
            return cuda_fail(cb, name, "gate, up and down stacks of mismatched shapes");
        if (check_experts(cb, a->w_gate, name) || check_experts(cb, a->w_up, name))
            return -1;
        return check_experts(cb, a->w_down, name);
    }
    if (o->kind == PT_OP_MOE_ROUTE) {
        const pt_op_moe_route *a = &o->moe_route;
        if (a->n_experts > CU_MOE_MAX_EXPERTS || a->k < 1 || a->k > 32 || a->k > a->n_experts)
            return pt_be_fail(&cb->base, name, "top %d of %d experts is not supported", a->k, a->n_experts);
    }
    if (o->kind >= PT_OP_GATHER_COLS && o->kind <= PT_OP_MOE_ROUTE_GROUPED)
        return check_family_op(cb, o, name);
    if (o->kind == PT_OP_ATTENTION_EXT) {
        const pt_kv_view *kv = &o->attention_ext.kv;
        if (kv->codec)
            return cuda_fail(cb, name, "a quantized KV cache takes no window or soft-cap");
        if (dtype_code(kv->dtype) < 0)
            return cuda_fail(cb, name, "cache type not supported by the CUDA backend");
        if (kv->head_dim > 512) return cuda_fail(cb, name, "head_dim over 512 is not supported");
    }
    if (o->kind == PT_OP_KV_STORE || o->kind == PT_OP_ATTENTION) {
        const pt_kv_view *kv = o->kind == PT_OP_KV_STORE ? &o->kv_store.kv : &o->attention.kv;
        if (kv->codec) {
            if (!cu_kvq_supported(kv->kvq, kv->k_bits, kv->v_bits, kv->group, kv->head_dim))
                return cuda_fail(cb, name, "quantized KV format not supported by the CUDA kernels");
            int nh = o->kind == PT_OP_ATTENTION ? o->attention.n_heads : kv->n_kv_heads;
            if (nh % kv->n_kv_heads || nh / kv->n_kv_heads > 8)
                return cuda_fail(cb, name, "quantized KV caches take at most 8 query heads per KV "
                                           "head on the CUDA backend");
        } else {
            if (dtype_code(kv->dtype) < 0)
                return cuda_fail(cb, name, "cache type not supported by the CUDA backend");
            if (o->kind == PT_OP_ATTENTION && kv->head_dim > CU_ATTN_MAX_HEAD_DIM)
                return cuda_fail(cb, name, "head_dim over 576 is not supported");
        }
    }
    return 0;
}

/* Grows the scratch buffer *buf to need bytes; a cached graph holds the
 * old pointer, so growth drops the graphs first. */
static int grow(cuda_backend *cb, void **buf, size_t *cap, size_t need, const char *what) {
    if (need <= *cap) return 0;
    cuda_drop_graphs(cb);
    return scratch(cb, buf, cap, need, what);
}

/* Scratch the op will need, grown now (never while a graph is captured);
 * -1 if it cannot grow. */
static int prepare_scratch(cuda_backend *cb, const pt_op *o) {
    const char *name = pt_op_name(o->kind);
    if (o->kind == PT_OP_MATMUL) {
        const pt_op_matmul *a = &o->matmul;
        size_t act = (size_t)a->n * (size_t)a->w.cols * 2;
        if (is_quantized(a->w.dtype)) {
            if (a->n <= cb->qgemv_max) return 0;
            cu_qweight w = qweight_of(&a->w);
            if (use_qmms(cb, &w, a->x, a->n))
                return grow(cb, &cb->act16, &cb->act16_cap, cu_qmms_act_bytes(&w, a->n), name);
            if (use_qmma(cb, &w, a->x, a->n)) {
                size_t part = cu_qmma_part_bytes(&cb->ctx, &w, a->n);
                if (grow(cb, &cb->act16, &cb->act16_cap, cu_qmma_act_bytes(&w, a->n), name))
                    return -1;
                return grow(cb, &cb->qmma_part, &cb->qmma_part_cap, part, name);
            }
            size_t wneed = (size_t)a->w.rows * (size_t)a->w.cols * 2;
            return grow(cb, &cb->wdeq, &cb->wdeq_cap, wneed, name) ||
                   grow(cb, &cb->act16, &cb->act16_cap, act, name) ? -1 : 0;
        }
        if (a->w.dtype != PT_F32 && a->n > cb->gemv_max)
            return grow(cb, &cb->act16, &cb->act16_cap, act, name);
    } else if (o->kind == PT_OP_MATMUL_ID) {
        const pt_op_matmul_id *a = &o->matmul_id;
        int64_t codes = moe_group(&a->w) ? (int64_t)a->n * a->x_slots * a->w.cols : 0;
        size_t need = cu_moe_scratch(a->n * a->k, a->w.n_experts, codes);
        if (moe_mma_rows(cb, &a->w, a->n))
            need = PT_MAX(need, cu_moe_mma_scratch(a->n * a->k, a->w.n_experts,
                                                   a->n * a->x_slots, a->w.cols));
        return grow(cb, &cb->moe_scratch, &cb->moe_cap, need, name);
    } else if (o->kind == PT_OP_MOE_FFN) { /* the op sequence's matmul_id calls */
        const pt_op_moe_ffn *a = &o->moe_ffn;
        int pairs = a->n * a->k;
        int64_t up = moe_group(a->w_gate) ? (int64_t)a->n * a->w_gate->cols : 0;
        int64_t down = moe_group(a->w_down) ? (int64_t)pairs * a->w_down->cols : 0;
        size_t need = cu_moe_scratch(pairs, a->n_experts, up > down ? up : down);
        if (moe_mma_rows(cb, a->w_gate, a->n))
            need = PT_MAX(need, cu_moe_mma_scratch(pairs, a->n_experts, a->n, a->w_gate->cols));
        if (moe_mma_rows(cb, a->w_down, a->n))
            need = PT_MAX(need, cu_moe_mma_scratch(pairs, a->n_experts, pairs, a->w_down->cols));
        return grow(cb, &cb->moe_scratch, &cb->moe_cap, need, name);
    } else if (o->kind == PT_OP_ATTENTION) {
        size_t need;
        if (o->attention.kv.codec) {
            cu_kvq_args q = kvq_attention_args(&o->attention);
            need = cu_kvq_attention_scratch(&q, cb->ctx.n_sm);
        } else if (!cb->simple_attn) {
            cu_attn_args r = attn_args(cb, &o->attention);
            need = cu_attention_scratch(&r, cb->ctx.n_sm);
        } else {
            return 0;
        }
        return grow(cb, &cb->attn_scratch, &cb->attn_cap, need, name);
    } else if (o->kind == PT_OP_ATTENTION_EXT && ext_fast(cb, &o->attention_ext)) {
        cu_attn_args r = ext_args(cb, &o->attention_ext);
        size_t need = cu_attention_scratch(&r, cb->ctx.n_sm);
        return grow(cb, &cb->attn_scratch, &cb->attn_cap, need, name);
    }
    return 0;
}

/* The profile slot of op o (slot PT_OP_COUNT: matmuls past the GEMV rows). */
static int prof_slot(const cuda_backend *cb, const pt_op *o) {
    if (o->kind == PT_OP_MATMUL &&
        o->matmul.n > (is_quantized(o->matmul.w.dtype) ? cb->qgemv_max : cb->gemv_max))
        return PT_OP_COUNT;
    return o->kind;
}

/* Runs ops[i] (fused with the records after it where cuda_fuse.c can):
 * how many records it took, and their profile slot. */
static int exec_one(cuda_backend *cb, const pt_op *ops, int i, int n, int *slot) {
    int used = cb->fuse ? cuda_exec_fused(cb, ops, i, n, slot) : 0;
    if (used) return used;
    cuda_exec_op(cb, &ops[i]);
    *slot = prof_slot(cb, &ops[i]);
    return 1;
}

/* PETREL_CUDA_PROFILE: a step of a profiled number of tokens (its embed op
 * says how many) runs each launch alone between two events and adds its
 * time to its slot's sum in that count's table. */
void cuda_exec_ops(cuda_backend *cb, const pt_op *ops, int n, bool check) {
    for (int i = 0, used; i < n && !cb->base.failed; i += used) {
        int slot;
        if (ops[i].kind == PT_OP_EMBED && cb->profile) {
            cb->prof_step = -1;
            for (int t = 0; t < cb->profile; t++)
                if (ops[i].embed.n == cb->prof_n[t]) cb->prof_step = t;
        }
        bool timed = cb->prof_step >= 0 && check;
        if (timed) {
            cb->prof_deq = false;
            cudaEventRecord(cb->prof_ev[0], cb->ctx.s);
        }
        used = exec_one(cb, ops, i, n, &slot);
        if (check) op_done(cb, pt_op_name(ops[i].kind));
        if (!timed) continue;
        cudaEventRecord(cb->prof_ev[1], cb->ctx.s);
        float ms = 0, deq = 0;
        if (!cuda_ok(cb, cudaEventSynchronize(cb->prof_ev[1]), pt_op_name(ops[i].kind)) ||
            cudaEventElapsedTime(&ms, cb->prof_ev[0], cb->prof_ev[1]) != cudaSuccess)
            continue;
        double *sum = cb->prof_ms[cb->prof_step];
        uint64_t *calls = cb->prof_calls[cb->prof_step];
        sum[slot] += ms, calls[slot]++;
        if (cb->prof_deq && cudaEventElapsedTime(&deq, cb->prof_ev[0], cb->prof_ev[2]) == cudaSuccess)
            sum[PROF_DEQ] += deq, calls[PROF_DEQ]++;
    }
}

/* A table per profiled token count.  Its row "of which dequant" is part
 * of the "matmul (gemm)" row above it (not added to the total). */
static void print_profile(const cuda_backend *cb) {
    for (int t = 0; t < cb->profile; t++) {
        const double *sum = cb->prof_ms[t];
        const uint64_t *calls = cb->prof_calls[t];
        double total = 0;
        for (int k = 0; k < PROF_SLOTS; k++) total += sum[k];
        fprintf(stderr, "cuda profile (steps of %d tokens, each launch timed alone, no graphs): "
                        "%.1f ms in all\n", cb->prof_n[t], total);
        fprintf(stderr, "  %-22s %10s %11s %9s %6s\n", "op", "calls", "total ms", "us/call",
                "share");
        for (int j = 0; j <= PROF_SLOTS; j++) { /* PROF_DEQ right after the gemm row */
            const int k = j <= PT_OP_COUNT ? j : j == PT_OP_COUNT + 1 ? PROF_DEQ : j - 1;
            if (!calls[k]) continue;
            char buf[48];
            const char *name = k == PT_OP_COUNT ? "matmul (gemm)"
                               : k == PROF_DEQ  ? "  of which dequant"
                               : k < PT_OP_COUNT ? pt_op_name(k)
                                                 : cuda_fuse_slot_name(k, buf, sizeof buf);
            fprintf(stderr, "  %-22s %10llu %11.2f %9.2f %5.1f%%\n", name,
                    (unsigned long long)calls[k], sum[k], 1e3 * sum[k] / (double)calls[k],
                    total > 0 ? 100 * sum[k] / total : 0.0);
        }
    }
}

/* The op entry: checks, grows scratch, then records the op or, with graphs
 * and fusion off, runs it now. */
static void cuda_run(pt_backend *be, const pt_op *o) {
    cuda_backend *cb = (cuda_backend *)be; /* recording needs no current device */
    if (o->kind == PT_OP_MATMUL && o->matmul.n <= 0) return;
    if (check_op(cb, o) || prepare_scratch(cb, o)) return;
    if (!cb->use_graphs && !cb->fuse) {
        cuda_use_device(cb);
        cuda_exec_ops(cb, o, 1, true);
        return;
    }
    cuda_record(cb, o, op_rows(o));
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

/* ---- Lifetime ---------------------------------------------------------------- */

static void cuda_destroy(pt_backend *be) {
    cuda_backend *cb = cb_of(be);
    if (!cb) return;
    cuda_flush(cb);
    cudaStreamSynchronize(cb->ctx.s);
    if (cb->n_captures || cb->n_replays)
        pt_debug("cuda: %llu graph captures, %llu replays, %zu nodes in the last graph",
                 (unsigned long long)cb->n_captures, (unsigned long long)cb->n_replays,
                 cb->graph_nodes);
    cuda_drop_graphs(cb);
    if (cb->profile) {
        print_profile(cb);
        cudaEventDestroy(cb->prof_ev[0]);
        cudaEventDestroy(cb->prof_ev[1]);
        cudaEventDestroy(cb->prof_ev[2]);
    }
    free(cb->list);
    if (cb->cublas_ws) cudaFree(cb->cublas_ws);
    if (cb->act16) cudaFree(cb->act16);
    if (cb->attn_scratch) cudaFree(cb->attn_scratch);
    if (cb->moe_scratch) cudaFree(cb->moe_scratch);
    if (cb->wdeq) cudaFree(cb->wdeq);
    if (cb->qmma_part) cudaFree(cb->qmma_part);
    if (cb->qmma_cnt) cudaFree(cb->qmma_cnt);
    if (cb->cublas) cublasDestroy(cb->cublas);
    if (cb->ctx.s) cudaStreamDestroy(cb->ctx.s);
    free(cb);
}

/* The kinds cuda_exec_op launches: all of them today.  A kind added to
 * backend.h without a CUDA kernel stays out of this range, so the loader
 * refuses a model that needs it, naming the op, instead of failing
 * mid-forward. */
static bool cuda_has_op(pt_backend *be, int kind) {
    (void)be;
    return (kind >= 0 && kind <= PT_OP_MOE_ROUTE_GROUPED) || kind == PT_OP_MOE_FFN ||
           kind == PT_OP_ARGMAX || (kind == PT_OP_ALL_REDUCE && pt_comm_have_nccl());
}

/* q4_0 and q8_0 matrices are rewritten at load, in groups of 1-8 rows in
 * place, as their codes then their scales (repack.c), for the split GEMV
 * (qmatmul.cu); the same size, so views of whole row groups stay valid.
 * PETREL_CUDA_REPACK=0 keeps the file's layout (A/B runs). */
static int cuda_weight_layout(pt_backend *be, const pt_weight *w) {
    cuda_backend *cb = (cuda_backend *)be;
    if (!cb->repack || w->n_experts ||
        !pt_layout_fits(PT_LAYOUT_ROWSPLIT, w->dtype, w->rows, w->cols))
        return PT_LAYOUT_FILE;
    cu_qweight q = qweight_of(w);
    return cu_qsplit_ok(&q) ? PT_LAYOUT_ROWSPLIT : PT_LAYOUT_FILE;
}

/* Rewrites w in place through a scratch copy: the kernel writes the new
 * layout into scratch, which is copied back over w.  -1 (w untouched, no
 * error) when the scratch cannot be had. */
static int cuda_repack(pt_backend *be, const pt_weight *w, int layout) {
    cuda_backend *cb = cb_of(be);
    cu_qweight q = qweight_of(w);
    if (layout != PT_LAYOUT_ROWSPLIT || cb->base.failed || !cu_qsplit_ok(&q)) return -1;
    cuda_flush(cb);
    void *tmp = NULL;
    if (cudaMalloc(&tmp, w->nbytes) != cudaSuccess) {
        cudaGetLastError(); /* out of memory is not sticky: keep the file's layout */
        return -1;
    }
    int rc = cu_qrepack(&cb->ctx, tmp, &q);
    if (rc == 0 && cuda_ok(cb, cudaGetLastError(), "repack") &&
        cuda_ok(cb, cudaMemcpyAsync((void *)w->data, tmp, w->nbytes, cudaMemcpyDeviceToDevice,
                                    cb->ctx.s), "repack") &&
        cuda_ok(cb, cudaStreamSynchronize(cb->ctx.s), "repack"))
        rc = 0;
    else
        rc = -1;
    cudaFree(tmp);
    return rc;
}

/* Kernels (and copies) of the last decode-sized step captured as a graph:
 * the kernels a decode step launches; 0 before any. */
static int cuda_step_kernels(pt_backend *be) {
    return (int)((cuda_backend *)be)->graph_nodes;
}

static const pt_backend_ops cuda_ops = {
    .alloc = cuda_alloc,
    .free = cuda_free,
    .upload = cuda_upload,
    .download = cuda_download,
    .copy = cuda_copy,
    .sync = cuda_sync,
    .run = cuda_run,
    .has_op = cuda_has_op,
    .kv_quant_check = cuda_kv_quant_check,
    .free_memory = cuda_free_memory,
    .read_bandwidth = cuda_read_bandwidth,
    .weight_layout = cuda_weight_layout,
    .repack = cuda_repack,
    .step_kernels = cuda_step_kernels,
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
    cb->ctx.n_sm = prop.multiProcessorCount;
    if ((e = cudaStreamCreateWithFlags(&cb->ctx.s, cudaStreamNonBlocking)) != cudaSuccess) {
        pt_fail(err, "CUDA stream: %s", cudaGetErrorString(e));
        free(cb);
        return NULL;
    }
    cublasStatus_t st = cublasCreate(&cb->cublas);
    if (st != CUBLAS_STATUS_SUCCESS) {
        pt_fail(err, "cuBLAS: %s", cublasGetStatusString(st));
        cudaStreamDestroy(cb->ctx.s);
        free(cb);
        return NULL;
    }
    cublasSetStream(cb->cublas, cb->ctx.s);
    cublasSetMathMode(cb->cublas, CUBLAS_DEFAULT_MATH); /* no TF32 for f32 weights */
    /* Our own workspace: cuBLAS then allocates nothing inside graph capture. */
    if (cudaMalloc(&cb->cublas_ws, CUBLAS_WORKSPACE) == cudaSuccess)
        cublasSetWorkspace(cb->cublas, cb->cublas_ws, CUBLAS_WORKSPACE);
    else
        cb->cublas_ws = NULL;
    cb->ctx.pdl = prop.major >= 9 && env_int("PETREL_CUDA_PDL", 1) != 0;
    cb->ctx.clusters = prop.major >= 9;
    cb->ctx.gemv_mode = (env_int("PETREL_CUDA_GEMV_PERSIST", 1) != 0) |
                        (env_int("PETREL_CUDA_GEMV_PDL", 0) != 0) << 1;
    /* the coalesced GEMV: 0 off, 1 q4_0 (default), 2 q4_0 and q8_0; 4, 8,
     * 16: both, with that many rows per warp at 1-2 token rows */
    cb->ctx.qgemv_co = env_int("PETREL_CUDA_QGEMV_CO", 1);
    cb->ctx.kvq_mma = env_int("PETREL_CUDA_KVQ_MMA", 1);
    cu_attention_init();
    cu_kvq_init(&cb->ctx);
    cu_gemv_init(&cb->ctx);
    cu_qgemv_init(&cb->ctx);
    cu_recurrent_init();
    cu_moe_init(&cb->ctx);
    cu_moe_mma_init(&cb->ctx);
    cb->gemv_max = env_int("PETREL_CUDA_GEMV_MAX", CU_GEMV_DEFAULT_ROWS);
    if (cb->gemv_max > CU_GEMV_MAX_ROWS) cb->gemv_max = CU_GEMV_MAX_ROWS;
    cb->repack = env_int("PETREL_CUDA_REPACK", 1) != 0;
    cb->qgemv_max = env_int("PETREL_CUDA_QGEMV_MAX", CU_QGEMV_DEFAULT_ROWS);
    if (cb->qgemv_max > CU_QGEMV_MAX_ROWS) cb->qgemv_max = CU_QGEMV_MAX_ROWS;
    cb->gdn_chunk = PT_MAX(env_int("PETREL_CUDA_GDN_CHUNK", 16), 0);
    cb->moe_fused = PT_MAX(env_int("PETREL_CUDA_MOE_FUSED", 8), 0);
    cb->moe_mma = PT_MAX(env_int("PETREL_CUDA_MOE_MMA", 32), 0);
    cb->moe_rpw = env_int("PETREL_CUDA_MOE_RPW", 2);
    cb->moe_kernels = env_int("PETREL_CUDA_MOE_FFN", 2);
    /* the tensor-core GEMM (qmma.cu) only when asked: on the H200 (session
     * 8) it ran 124.5 us/call at 64 decoding sequences of the 8B shape,
     * against 81.6 for dequantize + cuBLAS (docs/cuda.md, "Tensor-core
     * GEMM"); PETREL_CUDA_QMMA=1 takes it up to PETREL_CUDA_QMMA_MAX rows */
    cb->qmma_max = env_int("PETREL_CUDA_QMMA", 0) ? env_int("PETREL_CUDA_QMMA_MAX", 256) : 0;
    if (cb->qmma_max > 0 && cu_qmma_init(&cb->qmma_cnt)) cb->qmma_max = 0;
    /* the tensor-core GEMM on the split layout (qmms.cu), default past the
     * GEMV (use_qmms says up to how many rows); PETREL_CUDA_QMMS=0 turns it
     * off, PETREL_CUDA_QMMS_MAX sets the rows, PETREL_CUDA_QMMS_MT=1|2 the
     * m16 tiles a warp (default: 1 for q4_0, 2 for q8_0; qmms.cu) */
    cb->qmms = env_int("PETREL_CUDA_QMMS", 1) != 0;
    cb->qmms_max = env_int("PETREL_CUDA_QMMS_MAX", 0);
    cb->ctx.qmms_mt = env_int("PETREL_CUDA_QMMS_MT", 0);
    if (cb->qmms) cu_qmms_init();
    const char *attn = getenv("PETREL_CUDA_ATTN");
    cb->simple_attn = attn && strcmp(attn, "simple") == 0;
    cb->tiled_attn = attn && strcmp(attn, "tiled") == 0;
    cb->sync_each = env_int("PETREL_CUDA_SYNC", 0) != 0;
    /* PETREL_CUDA_PROFILE=8,32,64: up to PROF_SIZES token counts */
    cb->prof_step = -1;
    for (const char *p = getenv("PETREL_CUDA_PROFILE"); p && *p && cb->profile < PROF_SIZES;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p) break;
        if (v > 0) cb->prof_n[cb->profile++] = (int)v;
        p = *end == ',' ? end + 1 : end;
    }
    if (cb->profile && (cudaEventCreate(&cb->prof_ev[0]) != cudaSuccess ||
                        cudaEventCreate(&cb->prof_ev[1]) != cudaSuccess ||
                        cudaEventCreate(&cb->prof_ev[2]) != cudaSuccess))
        cb->profile = 0;
    cb->use_graphs = !cb->sync_each && !cb->profile && env_int("PETREL_CUDA_GRAPHS", 1) != 0;
    /* the fused decode step (cuda_fuse.c); not with PETREL_CUDA_SYNC, which
     * is there to name the op that failed */
    cb->fuse = cb->sync_each ? 0 : env_int("PETREL_CUDA_FUSE", CUDA_FUSE_DEFAULT) & CUDA_FUSE_ALL;
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
