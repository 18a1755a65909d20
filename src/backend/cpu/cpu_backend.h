/*
 * cpu_backend.h - what the CPU backend's files share: the backend struct,
 * per-thread scratch, work splitting, and the op entry points each file
 * implements.  Not for use outside src/backend/cpu/.
 */
#ifndef PETREL_CPU_BACKEND_H
#define PETREL_CPU_BACKEND_H

#include "backend/backend.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/quant_kernels.h"
#include "base/threadpool.h"

typedef struct pt_cpu_backend {
    pt_backend base; /* first, so a pt_backend * is a pt_cpu_backend * */
    const pt_cpu_kernels *k;
    pt_pool *pool;
    /* Per-thread scratch, grown (never shrunk) by pt_cpu_scratch_reserve on
     * the calling thread before a dispatch; ops never allocate inside one. */
    float **scratch;
    size_t scratch_floats;
    pt_qk_ctx quant;  /* quantized weights' driver state (quant_kernels.h) */
    /* Attention's work list and split-row partials (cpu_attention.c), grown
     * on the calling thread like scratch. */
    void *attn_meta, *attn_parts;
    size_t attn_meta_cap, attn_parts_cap;
    /* matmul_id's gathered rows and expert order (cpu_moe.c), grown on the
     * calling thread. */
    void *moe_buf;
    size_t moe_cap;
    /* The packed GEMM's token tiles (cpu_matmul.c), shared by all threads
     * and grown on the calling thread. */
    void *xpack;
    size_t xpack_cap;
    /* Test-only fault injection (PETREL_FAULT_OP=name:N, read at creation):
     * the N-th op of kind fault_kind (counting from 1) fails instead of
     * running.  fault_kind -1: off. */
    int fault_kind;
    long fault_at, fault_seen;
    double bandwidth; /* bytes/s, 0 until measured */
    char bandwidth_how[96]; /* the probe variant that read fastest */
    double peak[2];   /* ops/s: f32 fma, int8 multiply-add; 0 until measured */
    char detail[128];
} pt_cpu_backend;

static inline pt_cpu_backend *pt_cpu(pt_backend *be) {
    return (pt_cpu_backend *)be;
}

/* Makes every thread's scratch at least floats long (64-byte aligned);
 * -1 with the backend's sticky error set if memory ran out (the op must
 * then return without running). */
int pt_cpu_scratch_reserve(pt_cpu_backend *cb, size_t floats, const char *op);

/* Runs fn on all threads, or on the caller alone when the op is too small
 * for a dispatch to pay off (work is a rough count of elements touched). */
void pt_cpu_run(pt_cpu_backend *cb, pt_pool_fn fn, void *ctx, double work);

/* This thread's share [*lo, *hi) of n items, in whole multiples of align
 * (the last share takes the remainder). */
static inline void pt_cpu_split(int64_t n, int ith, int nth, int64_t align, int64_t *lo,
                                int64_t *hi) {
    int64_t units = (n + align - 1) / align;
    *lo = PT_MIN(n, units * ith / nth * align);
    *hi = PT_MIN(n, units * (ith + 1) / nth * align);
}

/* Aborts with a message: the op was called with arguments the model code
 * must never produce (a format this backend lacks, an id out of range).
 * Failures the caller can survive (memory) go to the sticky error. */
_Noreturn void pt_cpu_die(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* The kernel entry for a weight/KV dtype, or death if the set lacks it. */
const pt_cpu_wops *pt_cpu_wops_for(const pt_cpu_backend *cb, pt_dtype dt, const char *op);

/* Ops, one file each (cpu_matmul.c, cpu_elementwise.c, cpu_attention.c,
 * cpu_bandwidth.c); signatures as in pt_backend_ops. */
void pt_cpu_matmul(pt_backend *be, float *y, const float *x, const pt_weight *w, int n);
void pt_cpu_embed(pt_backend *be, float *y, const pt_weight *table, const int32_t *ids, int n);
void pt_cpu_rmsnorm(pt_backend *be, float *y, const float *x, const float *g, int n, int d, float eps);
void pt_cpu_add(pt_backend *be, float *y, const float *a, const float *b, size_t count);
void pt_cpu_add_bias(pt_backend *be, float *y, const float *bias, int n, int d);
void pt_cpu_swiglu(pt_backend *be, float *y, const float *gate, const float *up, size_t count);
void pt_cpu_rope(pt_backend *be, float *x, const pt_batch_view *b, int n_heads, int head_dim,
                 const pt_rope *rope);
void pt_cpu_gather_rows(pt_backend *be, float *dst, const float *src, const int32_t *idx, int n, int d);
void pt_cpu_kv_store(pt_backend *be, const pt_kv_view *kv, const pt_batch_view *b, const float *k,
                     const float *v);
void pt_cpu_attention(pt_backend *be, float *out, const float *q, const pt_kv_view *kv,
                      const pt_batch_view *b, int n_heads, float scale);
void pt_cpu_attention_ext(pt_backend *be, float *out, const float *q, const pt_kv_view *kv,
                          const pt_batch_view *b, int n_heads, const pt_attn_params *p);
void pt_cpu_geglu(pt_backend *be, float *y, const float *gate, const float *up, size_t count);
void pt_cpu_swiglu_oai(pt_backend *be, float *y, const float *gate, const float *up, size_t count,
                       float alpha, float limit);
void pt_cpu_add_id(pt_backend *be, float *y, const float *bias, const int32_t *ids, int n, int k,
                   int d);
void pt_cpu_scale(pt_backend *be, float *x, float s, size_t count);
void pt_cpu_softcap(pt_backend *be, float *x, float cap, size_t count);
void pt_cpu_argmax(pt_backend *be, int32_t *ids, const float *x, int n, int d);
void pt_cpu_moe_route(pt_backend *be, int32_t *ids, float *weights, const float *logits, int n,
                      int n_experts, int k, bool renorm);
void pt_cpu_matmul_id(pt_backend *be, float *y, const float *x, const pt_weight *w,
                      const int32_t *ids, int n, int k, int x_slots);
/* Expert parallel: keeps the slots of experts [first, first + count),
 * renumbered; others become id -1, weight 0 (backend.h: moe_local). */
void pt_cpu_moe_local(int32_t *ids, float *weights, int n, int k, int first, int count);
void pt_cpu_moe_combine(pt_backend *be, float *y, const float *x, const float *weights, int n,
                        int k, int d);
void pt_cpu_moe_ffn(pt_backend *be, const pt_op_moe_ffn *a);
/* cpu_recurrent.c: hybrid recurrent layers (Gated DeltaNet) */
void pt_cpu_gather_cols(pt_backend *be, float *dst, const float *src, const int32_t *idx, int n,
                        int d_src, int d_dst);
void pt_cpu_sigmoid_mul(pt_backend *be, float *y, const float *x, const float *g, int n, int d,
                        int g_d);
void pt_cpu_conv1d_silu(pt_backend *be, float *y, const float *x, const float *w, float *state,
                        const pt_batch_view *b, int C, int K);
void pt_cpu_gated_delta(pt_backend *be, const pt_op_gated_delta *a);
void pt_cpu_rmsnorm_gated(pt_backend *be, const pt_op_rmsnorm_gated *a);
/* cpu_mla.c: multi-head latent attention's column copies, DeepSeek routing */
void pt_cpu_copy_cols(pt_backend *be, const pt_op_copy_cols *a);
void pt_cpu_moe_route_grouped(pt_backend *be, const pt_op_moe_route_grouped *a);
double pt_cpu_read_bandwidth(pt_backend *be);
double pt_cpu_compute_peak(pt_backend *be, pt_dtype wt, char *note, size_t note_len);

/* ---- shared by the attention drivers (cpu_attention.c, attn_kvq.c) ---- */

/* Slot of position p of sequence s in the paged cache (backend.h):
 * page * page_size + p % page_size; a slot holds every kv head. */
static inline size_t pt_cpu_kv_slot(const pt_kv_view *kv, const pt_batch_view *b, int s, int p) {
    int32_t page = b->block_table[(size_t)s * b->max_pages + p / kv->page_size];
    return (size_t)page * kv->page_size + (size_t)(p % kv->page_size);
}

/* Pages are scattered, so the prefetchers cannot guess where the next
 * segment starts: asks for its first lines, they stream the rest. */
static inline void pt_cpu_prefetch_start(const void *p, size_t bytes) {
    for (size_t off = 0; off < PT_MIN(bytes, (size_t)1024); off += 64)
        __builtin_prefetch((const char *)p + off);
}

/* Rows must name a sequence and a position the block table covers; the
 * scheduler guarantees it, so a violation is a bug worth stopping on. */
void pt_cpu_check_rows(const char *op, const pt_kv_view *kv, const pt_batch_view *b);

/* Makes *buf hold at least bytes (contents are not kept). */
void *pt_cpu_grow(void **buf, size_t *cap, size_t bytes);

#endif
