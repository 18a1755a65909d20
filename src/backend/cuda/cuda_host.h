/*
 * cuda_host.h - what the CUDA backend's host files share: the backend
 * object, its error helpers, and the split between them:
 *   cuda_backend.c   memory, the op switch (exec_op), the op table, setup;
 *   cuda_graph.c     recording ops and replaying them as CUDA graphs;
 *   cuda_bandwidth.c the read-bandwidth probe.
 * Host C only: the kernels (*.cu) see cuda_internal.h, never this.
 *
 * Invariant: cb->list holds pt_op records exactly as the op wrappers
 * zeroed and filled them (copied with memcpy), so two recordings of the
 * same calls are equal byte for byte; graph reuse depends on it.
 */
#ifndef PETREL_CUDA_HOST_H
#define PETREL_CUDA_HOST_H

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_internal.h"

/* CUDA graphs of recorded op sequences (see cuda_flush). */
#define GRAPH_SLOTS 4
#define PROF_SIZES 8 /* PETREL_CUDA_PROFILE: token counts profiled at most */
#define GRAPH_MIN_OPS 8   /* shorter bursts (tests, benchmarks) run directly */
#define GRAPH_MAX_ROWS 64 /* prefill-sized steps run directly: each is new */
/* What cuda_fuse.c fuses (bits of PETREL_CUDA_FUSE): the matmuls of one
 * input and a residual add after one; an rmsnorm before them; a swiglu;
 * whether q4_0/q8_0 (split) weights take part, or only f32/f16/bf16; and
 * the q/k norms, rope and kv_store of an attention layer.
 * The default, CUDA_FUSE_DEFAULT, is what measured faster on the H200's
 * 8B decode (docs/cuda.md, "The fused decode step"). */
#define CUDA_FUSE_MM 1
#define CUDA_FUSE_NORM 2
#define CUDA_FUSE_SWIGLU 4
#define CUDA_FUSE_QUANT 8
#define CUDA_FUSE_ROPE 16 /* [q/k norms,] rope of q and k, kv_store: one kernel */
#define CUDA_FUSE_DEFAULT (CUDA_FUSE_MM | CUDA_FUSE_QUANT | CUDA_FUSE_ROPE)
#define CUDA_FUSE_ALL 31

/* PETREL_CUDA_PROFILE's sums: op kinds, matmuls past the GEMV rows, then
 * the fused launches (cuda_fuse.c: prologue x matrices x residual). */
#define PROF_FUSE_ROPE (PT_OP_COUNT + 1 + 3 * CU_FUSE_MAX_W * 2) /* and + 1: with q/k norms */
#define PROF_SLOTS (PROF_FUSE_ROPE + 2)
#define PROF_DEQ PROF_SLOTS /* the dequantizing part of "matmul (gemm)" */

typedef struct graph_slot {
    cudaGraphExec_t exec;
    pt_op *recs; /* the op sequence it runs */
    int n;
    uint64_t last_use;
} graph_slot;

typedef struct cuda_backend {
    pt_backend base;
    int device;   /* the ordinal every entry point makes current first */
    cu_ctx ctx;   /* stream and launch state the .cu launchers read */
    cublasHandle_t cublas;
    void *cublas_ws;
    void *act16; /* activations rounded to f16/bf16 for cuBLAS */
    size_t act16_cap;
    void *wdeq; /* a quantized weight dequantized to f16 (prefill) */
    size_t wdeq_cap;
    void *qmma_part; /* qmma.cu: partial sums of K splits */
    size_t qmma_part_cap;
    int *qmma_cnt;      /* qmma.cu: a counter per tile whose K is split */
    void *attn_scratch; /* split-context partial results */
    size_t attn_cap;
    void *moe_scratch; /* matmul_id: pairs sorted by expert */
    size_t moe_cap;
    int gemv_max;     /* token rows up to which matmul uses the GEMV kernels */
    int qgemv_max;    /* the same for quantized weights (PETREL_CUDA_QGEMV_MAX) */
    int repack;       /* q4_0/q8_0 matrices rewritten at load for the split GEMV
                         (PETREL_CUDA_REPACK, default 1; 0: the file's layout) */
    int gdn_chunk;    /* rows per sequence from which gated_delta runs chunkwise
                         (PETREL_CUDA_GDN_CHUNK; 0: never) */
    int moe_fused;    /* moe_ffn with quantized experts runs as two kernels up to
                         this many token rows (PETREL_CUDA_MOE_FUSED; 0: never) */
    int moe_rpw;      /* gate rows a warp of moe_ffn's up kernel (PETREL_CUDA_MOE_RPW) */
    int moe_kernels;  /* 1: moe_ffn's session 9 kernels (PETREL_CUDA_MOE_FFN=1); else session 11's */
    int moe_mma;      /* matmul_id with quantized experts from this many token rows
                         is moe_mma.cu's grouped GEMM (PETREL_CUDA_MOE_MMA; 0: never) */
    int qmma_max;     /* past qgemv_max and up to this many rows, q4_0/q8_0 take the
                         tensor-core GEMM of qmma.cu (PETREL_CUDA_QMMA=0: never;
                         PETREL_CUDA_QMMA_MAX) */
    bool qmms;        /* q4_0/q8_0 in the split layout past qgemv_max rows take the
                         tensor-core GEMM of qmms.cu (PETREL_CUDA_QMMS=0: never) */
    int qmms_max;     /* ... up to this many rows (PETREL_CUDA_QMMS_MAX; 0: 128 for
                         q4_0, 64 for q8_0) */
    bool simple_attn; /* PETREL_CUDA_ATTN=simple: the plain kernel only */
    bool tiled_attn;  /* PETREL_CUDA_ATTN=tiled: no tensor-core kernel */
    bool sync_each;   /* PETREL_CUDA_SYNC=1 */
    bool use_graphs;  /* PETREL_CUDA_GRAPHS=0 turns them off */
    int fuse;         /* cuda_fuse.c's pass over recorded bursts: CUDA_FUSE_* bits
                         (PETREL_CUDA_FUSE, default CUDA_FUSE_DEFAULT; 0 with PETREL_CUDA_SYNC,
                         which is there to name the op that failed) */
    /* PETREL_CUDA_PROFILE=N[,N...]: the launches of forward steps of
     * exactly N tokens (the step's embed op says how many) each timed alone
     * (events around it, then a wait; no graphs), summed per slot
     * (PROF_SLOTS), one table per N (up to PROF_SIZES), printed when the
     * backend goes; matmuls split by token rows: the GEMV (<= gemv_max) or
     * not, and of the latter the part that dequantizes quantized weights to
     * f16 (PROF_DEQ: event 2 after it, how the cuBLAS path's time splits).
     * Other steps run untimed. */
    int profile;                /* sizes profiled; 0: off */
    int prof_n[PROF_SIZES];     /* their token counts */
    int prof_step;              /* the current step's table; -1: untimed */
    bool prof_deq; /* the launch being timed recorded prof_ev[2] after its dequantization */
    cudaEvent_t prof_ev[3];
    double prof_ms[PROF_SIZES][PROF_SLOTS + 1];
    uint64_t prof_calls[PROF_SIZES][PROF_SLOTS + 1];
    pt_op *list;      /* ops recorded since the last flush */
    int n_list, list_cap, list_rows;
    graph_slot graphs[GRAPH_SLOTS];
    uint64_t clock, n_captures, n_replays;
    size_t graph_nodes; /* kernels and copies of the last graph captured */
    double read_bw;
    char detail[192];
} cuda_backend;

/* The backend of be, with its device made current: every entry point that
 * calls CUDA comes through here (or cuda_use_device), so two backends on
 * two devices can share a thread. */
cuda_backend *cb_of(pt_backend *be);
void cuda_use_device(cuda_backend *cb);

/* Set the backend's sticky error (backend.h) for a failure in what (an op
 * or a memory call); cuda_fail returns -1, cuda_ok whether e is success. */
int cuda_fail(cuda_backend *cb, const char *what, const char *msg);
bool cuda_ok(cuda_backend *cb, cudaError_t e, const char *what);

/* cuda_backend.c: enqueues one op's kernels on the stream; cuda_exec_ops
 * a burst of them, fused where cuda_fuse.c can (check: the launch error
 * of each, after it). */
void cuda_exec_op(cuda_backend *cb, const pt_op *o);
void cuda_exec_ops(cuda_backend *cb, const pt_op *ops, int n, bool check);

/* cuda_fuse.c: runs ops[i..n) from i as one fused launch where it can:
 * the records it stood for (0: none, nothing launched) and its profile
 * slot; the name of such a slot. */
int cuda_exec_fused(cuda_backend *cb, const pt_op *ops, int i, int n, int *slot);
const char *cuda_fuse_slot_name(int slot, char *buf, size_t len);

/* cuda_graph.c */
/* Appends a record (rows: token rows it works on, which decides whether
 * the burst may become a graph). */
void cuda_record(cuda_backend *cb, const pt_op *o, int rows);
/* Runs what was recorded, as a graph when the burst is decode-sized. */
void cuda_flush(cuda_backend *cb);
/* Forgets every captured graph (they hold scratch pointers that moved). */
void cuda_drop_graphs(cuda_backend *cb);

/* cuda_comm.c: enqueues ncclAllReduce (fails the op without NCCL). */
void cuda_all_reduce(cuda_backend *cb, const pt_op_all_reduce *a);

/* cuda_bandwidth.c */
double cuda_read_bandwidth(pt_backend *be);

#endif
