/*
 * cuda_internal.h - what the CUDA backend's host code (cuda_backend.c) and
 * its kernels (*.cu) share: the launchers, one per op, each enqueueing its
 * kernels on the given stream.
 *
 * Launchers take plain pointers and sizes (no Petrel structs) so the .cu
 * files need only this header, and a cu_ctx: the stream and the launch
 * state of one backend instance on one device (no process globals, so two
 * backends on two devices do not share grid sizes or flags).  A launcher returns 0 when it enqueued the
 * op and -1 when the shapes, dtypes or alignment are ones it has no kernel
 * for; the caller then takes another path.  Element types are pt_dtype
 * values: 0 = f32, 1 = f16, 2 = bf16 (checked in cuda_backend.c).
 */
#ifndef PETREL_CUDA_INTERNAL_H
#define PETREL_CUDA_INTERNAL_H

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum { CU_F32 = 0, CU_F16 = 1, CU_BF16 = 2 };

/* Largest row count the GEMV kernels take (they keep one accumulator per
 * row per thread), and the default of PETREL_CUDA_GEMV_MAX: every row count
 * up to 16 takes the GEMV, whose rows are batch-invariant (cuBLAS is
 * faster from ~8 rows but rounds differently from the GEMV). */
#define CU_GEMV_MAX_ROWS 16
#define CU_GEMV_DEFAULT_ROWS 16
/* Quantized weight formats (CU_Q8_0 .. CU_AFFN below). */
#define CU_QFMT_COUNT 8

/* One backend instance's launch state, filled when the backend is created
 * (the *_init calls below, after cudaSetDevice) and read by launchers. */
typedef struct cu_ctx {
    cudaStream_t s;
    int n_sm;       /* multiprocessors of the device */
    int pdl;        /* launch with programmatic dependent launch (sm_90+,
                       PETREL_CUDA_PDL) */
    int gemv_mode;  /* bit 0 persistent GEMV grid (PETREL_CUDA_GEMV_PERSIST,
                       default on), bit 1 PDL for the GEMV itself
                       (PETREL_CUDA_GEMV_PDL, default off: a persistent grid
                       launched early lands unevenly on the SMs) */
    int smem_optin; /* the device's opt-in shared memory per block */
    int qgemv_co;   /* the coalesced q4_0/q8_0 GEMV (PETREL_CUDA_QGEMV_CO,
                       default on; 0: the register GEMV, for comparison) */
    int qmms_mt;    /* qmms.cu's m16 tiles a warp: 1 (two blocks an SM) or 2
                       (one); 0: by format (PETREL_CUDA_QMMS_MT) */
    int clusters;   /* thread-block clusters (sm_90+): qmms.cu's K splits */
    int kvq_mma;    /* tensor-core attention over TurboQuant k8 caches
                       (PETREL_CUDA_KVQ_MMA, default on; 0: the FMA kernel) */
    /* Persistent grids: blocks of each kernel resident on the whole device
     * at once (0: not measured, the launcher guesses). */
    int gemv_fit[3][CU_GEMV_MAX_ROWS];  /* [CU_F32/F16/BF16][token rows - 1] */
    int qgemv_fit[CU_QFMT_COUNT][5];    /* [fmt - CU_Q8_0][1, 2, 4, 8, 16 rows] */
    /* The split GEMV (qmatmul.cu): its blocks per SM as its registers allow
     * ([q4_0, q8_0][1, 2, 4, 8, 16 rows]), and shared memory per SM. */
    int qsplit_fit[2][5];
    int smem_sm;
} cu_ctx;

/* ---- matmul.cu ---------------------------------------------------------- */

/* y[n][rows] = x[n][cols] · wᵀ for n <= CU_GEMV_MAX_ROWS: weight-streaming
 * kernels with 16-byte loads (needs rows of 16-byte multiples and 16-byte
 * aligned x, w) or, for any shape, a plain one. */
int cu_gemv(const cu_ctx *c, float *y, const float *x, const void *w, int wtype, int rows,
            int cols, int n);
/* Sizes the persistent GEMV grids for c's device; once, before capture. */
void cu_gemv_init(cu_ctx *c);
/* dst[i] = (f16 or bf16) src[i], rounding to nearest even. */
void cu_convert_from_f32(const cu_ctx *c, void *dst, int dtype, const float *src, size_t count);

/* ---- qmatmul.cu: quantized weights, as stored in their files ------------- */

/* Weight formats (cu_qweight.fmt).  CU_AFF4/CU_AFF8: MLX affine at 4/8
 * bits (the tuned paths); CU_AFFN: any other width 2..8 (plain decoding).
 * CU_MXFP4 (gpt-oss's experts) only as a stack of experts for matmul_id
 * (moe.cu): cu_qweight_ok refuses it, so no dense kernel sees it. */
enum { CU_Q8_0 = 16, CU_Q4_0, CU_Q4_K, CU_Q5_K, CU_Q6_K, CU_AFF4, CU_AFF8, CU_AFFN, CU_MXFP4 };

/* cu_qweight.layout: the file's, or PT_LAYOUT_ROWSPLIT (backend.h): q4_0 and
 * q8_0 row groups rewritten at load as their codes then their f16 scales. */
enum { CU_LAYOUT_FILE = 0, CU_LAYOUT_SPLIT = 1 };

typedef struct cu_qweight {
    const void *data;            /* rows of blocks (GGUF) or packed u32 codes (affine) */
    const void *scales, *biases; /* affine: [rows][cols / group] of scale_type */
    int64_t rows, cols;
    int fmt, bits, group, scale_type; /* scale_type: CU_F32, CU_F16 or CU_BF16 */
    int layout;                       /* CU_LAYOUT_* */
} cu_qweight;

/* Token rows up to which the quantized GEMV runs (it keeps one accumulator
 * per weight row and token row per thread). */
#define CU_QGEMV_MAX_ROWS 16
/* Default of PETREL_CUDA_QGEMV_MAX: all of them, so a token row gets the
 * same bits at every row count up to 16 (speculative verification). */
#define CU_QGEMV_DEFAULT_ROWS 16

/* Sets the GEMV's shared-memory limits and sizes its persistent grids;
 * once per device, before any capture. */
void cu_qgemv_init(cu_ctx *c);
/* Whether the kernels take this weight (format, shape, 16-byte aligned). */
int cu_qweight_ok(const cu_qweight *w);
/* Whether the split GEMV takes w once repacked (q4_0/q8_0, rows a whole
 * number of row groups, one token row's codes within shared memory). */
int cu_qsplit_ok(const cu_qweight *w);
/* Writes w (file layout) into dst (w's size) as CU_LAYOUT_SPLIT. */
int cu_qrepack(const cu_ctx *c, void *dst, const cu_qweight *w);
/* y[n][rows] = x[n][cols] · wᵀ for n <= CU_QGEMV_MAX_ROWS; -1: not taken. */
int cu_qgemv(const cu_ctx *c, float *y, const float *x, const cu_qweight *w, int n);
/* The whole weight as f16 [rows][cols] into out (prefill: then cuBLAS). */
int cu_qdequant_f16(const cu_ctx *c, void *out, const cu_qweight *w);
/* y[i] = row ids[i] of w as f32 (an id out of range gives zeros). */
int cu_qembed(const cu_ctx *c, float *y, const cu_qweight *w, const int32_t *ids, int n);

/* ---- fused decode matmuls (cuda_fuse.c plans them) ---------------------- */

/* One GEMV launch standing for several recorded ops (docs/cuda.md, "The
 * fused decode step"): up to CU_FUSE_MAX_W matrices of the same columns
 * on the same input (QKV; gate and up), each a segment of the grid; the
 * input made on the fly from the op before them (pro: rmsnorm of x times
 * g, or silu(x) * up), each matrix's bias added to its output and, with
 * one matrix, its output also added into a residual (res_out = res_in + y).  Every value is computed as the ops it
 * replaces compute it, in the same order: bit for bit the unfused result. */
#define CU_FUSE_MAX_W 3
enum { CU_PRO_NONE = 0, CU_PRO_NORM, CU_PRO_SWIGLU };
typedef struct cu_fused {
    const float *x; /* [n][cols]: the input, or what pro makes it from */
    int n, nw;
    float *y[CU_FUSE_MAX_W];
    cu_qweight w[CU_FUSE_MAX_W]; /* f32/f16/bf16: fmt is the CU_F* type */
    int pro;
    const float *g;  /* CU_PRO_NORM: the gain (cols floats) ... */
    float eps;
    float *norm_y;   /* ... and where the normed rows go too (NULL: nowhere) */
    const float *up; /* CU_PRO_SWIGLU: the input is silu(x) * up */
    float *res_out;  /* nw == 1: res_out = res_in + y (NULL: no residual) */
    const float *res_in;
    /* each matrix's bias (NULL: none), added to its rows as add_bias adds
     * it (y = v + b), before the residual */
    const float *bias[CU_FUSE_MAX_W];
} cu_fused;

/* The fused launch for f32/f16/bf16 (matmul.cu) or split q4_0/q8_0
 * (qmatmul.cu) weights; -1 (nothing launched) when the kernels do not
 * take it, and the ops then run one by one. */
int cu_gemv_fused(const cu_ctx *c, const cu_fused *f);
int cu_qgemv_fused(const cu_ctx *c, const cu_fused *f);

/* ---- ops.cu ------------------------------------------------------------- */

void cu_embed(const cu_ctx *c, float *y, const void *table, int dtype, int64_t rows, int64_t cols,
              const int32_t *ids, int n);
void cu_rmsnorm(const cu_ctx *c, float *y, const float *x, const float *g, int n, int d,
                float eps);
void cu_add(const cu_ctx *c, float *y, const float *a, const float *b, size_t count);
void cu_add_bias(const cu_ctx *c, float *y, const float *bias, int n, int d);
void cu_swiglu(const cu_ctx *c, float *y, const float *gate, const float *up, size_t count);
void cu_rope(const cu_ctx *c, float *x, const int32_t *pos, int n, int n_heads, int head_dim,
             int style, int n_rot, const float *inv_freq, float mscale);
void cu_kv_store(const cu_ctx *c, void *kc, void *vc, int dtype, int page_size, int n_kv_heads,
                 int head_dim, const int32_t *pos, const int32_t *seq, const int32_t *block_table,
                 int max_pages, int n, const float *k, const float *v);
/* The per-head q/k norms (optional), rope of q and of k, and the store of
 * k and v into the cache, as one launch (cuda_fuse.c): each value as
 * cu_rmsnorm, cu_rope and cu_kv_store compute it.  -1: not taken. */
typedef struct cu_rope_store_args {
    float *q, *k;        /* [n][n_heads][head_dim], [n][n_kv_heads][head_dim]: in place */
    const float *v;      /* [n][n_kv_heads][head_dim] */
    const float *q_norm, *k_norm; /* gains of head_dim floats, or NULL: no norm */
    float eps;
    const int32_t *pos;  /* the rotation's positions */
    int n, n_heads, n_kv_heads, head_dim, style, n_rot;
    const float *inv_freq;
    float mscale;
    void *kc, *vc;       /* the cache (CU_F32/F16/BF16 of dtype) and its pages */
    int dtype, page_size, max_pages;
    const int32_t *kv_pos, *seq, *block_table;
} cu_rope_store_args;
int cu_rope_store(const cu_ctx *c, const cu_rope_store_args *a);
void cu_gather_rows(const cu_ctx *c, float *dst, const float *src, const int32_t *idx, int n,
                    int d);
/* ids[i] = the first index of row i's largest element (backend.h, argmax). */
void cu_argmax(const cu_ctx *c, int32_t *ids, const float *x, int n, int d);
/* Reads nbytes (a multiple of 16) and writes a checksum to *out. */
void cu_read_kernel(const cu_ctx *c, const void *src, size_t nbytes, float *out);

/* ---- attention.cu -------------------------------------------------------- */

typedef struct cu_attn_args {
    float *out;
    const float *q;
    const void *k, *v; /* paged cache of one layer */
    int dtype, page_size, n_kv_heads, head_dim;
    const int32_t *pos, *seq, *block_table;
    int max_pages, n, n_heads;
    int n_seqs; /* sequences the n rows belong to (block_table rows) */
    float scale;
    int tiled_only; /* never the tensor-core kernel (PETREL_CUDA_ATTN=tiled) */
    int window;     /* > 0: row t sees positions pos[t] - window + 1 .. pos[t] */
    float softcap;  /* > 0: scores are softcap * tanh(score / softcap) */
} cu_attn_args;

/* Device scratch the attention of this shape needs (0: none), for the
 * split-context partial results.  n_sm: multiprocessors of the device. */
size_t cu_attention_scratch(const cu_attn_args *a, int n_sm);
/* Sets kernel attributes on the current device (attributes are per
 * device); once per backend, before any capture. */
void cu_attention_init(void);
/* Enqueues the attention; scratch must hold cu_attention_scratch() bytes. */
void cu_attention(const cu_ctx *c, const cu_attn_args *a, int n_sm, void *scratch);
/* The plain kernel (one warp per row and head), for tests and odd shapes. */
void cu_attention_simple(const cu_ctx *c, const cu_attn_args *a);

/* ---- attn_kvq.cu: quantized KV caches (formats of src/kv/kv_codec.h) ------ */

typedef struct cu_kvq_args {
    float *out;          /* [n][n_heads][head_dim] */
    const float *q;      /* [n][n_heads][head_dim] */
    uint8_t *k, *v;      /* the layer's paged rows */
    const float *tables; /* TurboQuant: signs [head_dim], centroids [1 << v_bits],
                            boundaries [(1 << v_bits) - 1] */
    int kvq;             /* 1 affine, 2 TurboQuant (enum pt_kvq_kind) */
    int k_bits, v_bits, group, k_row, v_row;
    int page_size, n_kv_heads, head_dim;
    const int32_t *pos, *seq, *block_table;
    int max_pages, n, n_heads;
    float scale;
} cu_kvq_args;

/* Whether the kernels take this format: group 32, head_dim 64/128/256/512,
 * TurboQuant k{2,4,5,8} v{2,3,4,5,8} or affine 8/8 and 4/4. */
int cu_kvq_supported(int kvq, int k_bits, int v_bits, int group, int head_dim);
/* Sets kernel attributes on the current device and c->smem_optin; once
 * per backend, before any capture. */
void cu_kvq_init(cu_ctx *c);
/* Encodes n rows of k and v ([n][n_kv_heads][head_dim]) into the cache,
 * bit-identical to the CPU encoders.  -1: a shape it does not take. */
int cu_kvq_store(const cu_ctx *c, const cu_kvq_args *a, const float *k, const float *v);
/* Device scratch cu_kvq_attention needs (0: none). */
size_t cu_kvq_attention_scratch(const cu_kvq_args *a, int n_sm);
/* Attention over the packed pages (G = n_heads / n_kv_heads <= 8).
 * -1: a shape it does not take. */
int cu_kvq_attention(const cu_ctx *c, const cu_kvq_args *a, int n_sm, void *scratch);

#ifdef __cplusplus
}
#endif

#endif
