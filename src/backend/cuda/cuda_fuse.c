/*
 * cuda_fuse.c - the fused decode step: a peephole over the recorded op
 * records that runs neighbouring ops as one GEMV launch.
 *
 * Model code emits the same op sequence for every backend (the CPU runs
 * it as the reference); here, when a burst is run (captured into a graph
 * or launched directly), these runs of records become one launch
 * (cu_fused, matmul.cu and qmatmul.cu):
 *
 *   rmsnorm(h, x) then 1-3 matmuls of h   the norm made in the GEMV's
 *                                         input, the matmuls one launch
 *   swiglu(g, g, u) then a matmul of g    silu(g) * u made in the input
 *                                         (split q4_0/q8_0 only)
 *   1-3 matmuls of one input              one launch (QKV, gate and up)
 *   a matmul into h, then add(x, x, h)    x += h as the GEMV stores h
 *   a matmul, then add_bias of its output the bias added as it stores
 *   [rmsnorm(q), rmsnorm(k),] rope(q),    one kernel a token row (ops.cu,
 *   rope(k), kv_store(k, v)               cu_rope_store): the angles once
 *                                         a row, not once a head
 *
 * Each fused value is computed as the op it replaces computes it, in the
 * same order, so the fused step is bit for bit the unfused one (test_cuda_
 * model test_fused_step).  An op's output that the fused launch does not
 * store (the norm's h, the swiglu's g) must be dead: the records after the
 * run overwrite it before anything reads it (dead_after; any op kind it
 * does not know counts as a reader).  Decode-sized matmuls only: those
 * the GEMV kernels run unfused; anything the fused kernels refuse runs op
 * by op.  PETREL_CUDA_FUSE=0 turns the pass off; it is a mask: 1 the
 * matmuls of one input and the residual, 2 the rmsnorm, 4 the swiglu, 8
 * q4_0/q8_0 weights too, 16 the rope and kv_store (31: everything).  The
 * default is 25, the matmuls and the residual for every weight type and
 * the rope launch: on the H200's 8B decode the rmsnorm and swiglu
 * prologues, recomputed by every block, cost more than the launches they
 * save (docs/cuda.md, "The fused decode step").
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "backend/cuda/cuda_host.h"

static bool overlap(const void *p, size_t pb, const void *q, size_t qb) {
    uintptr_t a = (uintptr_t)p, b = (uintptr_t)q;
    return pb && qb && a < b + qb && b < a + pb;
}

#define F4(n) ((size_t)(n) * sizeof(float))
#define ALL ((size_t)1 << 62) /* a read whose extent the record does not say */

/* Whether op o reads [p, p + bytes): 1 yes, 0 no, -1 not known. */
static int op_reads(const pt_op *o, const void *p, size_t bytes) {
    switch (o->kind) {
    case PT_OP_EMBED: return 0;
    case PT_OP_MATMUL:
        return overlap(o->matmul.x, F4((size_t)o->matmul.n * o->matmul.w.cols), p, bytes);
    case PT_OP_RMSNORM: {
        const pt_op_rmsnorm *a = &o->rmsnorm;
        return overlap(a->x, F4((size_t)a->n * a->d), p, bytes) ||
               overlap(a->g, F4(a->d), p, bytes);
    }
    case PT_OP_ADD:
        return overlap(o->add.a, F4(o->add.count), p, bytes) ||
               overlap(o->add.b, F4(o->add.count), p, bytes);
    case PT_OP_ADD_BIAS:
        return overlap(o->add_bias.y, F4((size_t)o->add_bias.n * o->add_bias.d), p, bytes);
    case PT_OP_SWIGLU:
        return overlap(o->swiglu.gate, F4(o->swiglu.count), p, bytes) ||
               overlap(o->swiglu.up, F4(o->swiglu.count), p, bytes);
    case PT_OP_ROPE: {
        const pt_op_rope *a = &o->rope;
        return overlap(a->x, F4((size_t)a->b.n_tokens * a->n_heads * a->head_dim), p, bytes);
    }
    case PT_OP_KV_STORE: {
        const pt_op_kv_store *a = &o->kv_store;
        size_t nb = F4((size_t)a->b.n_tokens * a->kv.n_kv_heads * a->kv.head_dim);
        return overlap(a->k, nb, p, bytes) || overlap(a->v, nb, p, bytes);
    }
    case PT_OP_ATTENTION: {
        const pt_op_attention *a = &o->attention;
        return overlap(a->q, F4((size_t)a->b.n_tokens * a->n_heads * a->kv.head_dim), p, bytes);
    }
    case PT_OP_ATTENTION_EXT: {
        const pt_op_attention_ext *a = &o->attention_ext;
        return overlap(a->q, F4((size_t)a->b.n_tokens * a->n_heads * a->kv.head_dim), p, bytes);
    }
    case PT_OP_GATHER_ROWS: return overlap(o->gather_rows.src, ALL, p, bytes);
    case PT_OP_SCALE:
    case PT_OP_SOFTCAP: return overlap(o->scale.x, F4(o->scale.count), p, bytes);
    default: return -1;
    }
}

/* Whether op o overwrites all of [p, p + bytes) (without reading it). */
static bool op_covers(const pt_op *o, const void *p, size_t bytes) {
    uintptr_t a = (uintptr_t)p;
    const void *y = NULL;
    size_t yb = 0;
    switch (o->kind) {
    case PT_OP_MATMUL: y = o->matmul.y, yb = F4((size_t)o->matmul.n * o->matmul.w.rows); break;
    case PT_OP_RMSNORM: y = o->rmsnorm.y, yb = F4((size_t)o->rmsnorm.n * o->rmsnorm.d); break;
    case PT_OP_ADD: y = o->add.y, yb = F4(o->add.count); break;
    case PT_OP_SWIGLU: y = o->swiglu.y, yb = F4(o->swiglu.count); break;
    case PT_OP_EMBED: y = o->embed.y, yb = F4((size_t)o->embed.n * o->embed.table.cols); break;
    default: return false;
    }
    return a >= (uintptr_t)y && a + bytes <= (uintptr_t)y + yb;
}

/* Whether [p, p + bytes) is dead from ops[from]: overwritten before any
 * op of the burst reads it.  Live at the burst's end (the host may read
 * it, the next burst too). */
static bool dead_after(const pt_op *ops, int from, int n, const void *p, size_t bytes) {
    for (int i = from; i < n; i++) {
        int r = op_reads(&ops[i], p, bytes);
        if (r != 0) return false; /* read, or not known */
        if (op_covers(&ops[i], p, bytes)) return true;
    }
    return false;
}

static bool is_quant(pt_dtype t) {
    return t == PT_Q8_0 || t == PT_Q4_0 || t == PT_Q4_K || t == PT_Q5_K || t == PT_Q6_K ||
           t == PT_AFFINE || t == PT_MXFP4;
}

/* Whether matmul m runs the GEMV kernels unfused (decode-sized). */
static bool gemv_sized(const cuda_backend *cb, const pt_op_matmul *m) {
    return m->n >= 1 && m->n <= (is_quant(m->w.dtype) ? cb->qgemv_max : cb->gemv_max);
}

static cu_qweight kweight(const pt_weight *w) {
    cu_qweight q = {w->data, w->scales, w->biases, w->rows, w->cols, -1, 0, 0, 0, CU_LAYOUT_FILE};
    switch (w->dtype) {
    case PT_F32: q.fmt = CU_F32; break;
    case PT_F16: q.fmt = CU_F16; break;
    case PT_BF16: q.fmt = CU_BF16; break;
    case PT_Q8_0: q.fmt = CU_Q8_0; break;
    case PT_Q4_0: q.fmt = CU_Q4_0; break;
    default: break; /* other formats have no fused kernel */
    }
    if (w->layout == PT_LAYOUT_ROWSPLIT) q.layout = CU_LAYOUT_SPLIT;
    else if (w->layout != PT_LAYOUT_FILE) q.fmt = -1;
    return q;
}

/* Matmul b joins matmul a's launch: same input, rows, type, columns;
 * its output touches no input. */
static bool same_input(const pt_op_matmul *a, const pt_op_matmul *b) {
    return a->x == b->x && a->n == b->n && a->w.dtype == b->w.dtype && a->w.cols == b->w.cols &&
           a->w.layout == b->w.layout;
}

/* The profile slot of a fused launch (cuda_fuse_slot_name). */
static int fuse_slot(const cu_fused *f) {
    return PT_OP_COUNT + 1 + (f->pro * CU_FUSE_MAX_W + f->nw - 1) * 2 + (f->res_out != NULL);
}

const char *cuda_fuse_slot_name(int slot, char *buf, size_t len) {
    if (slot >= PROF_FUSE_ROPE)
        return slot == PROF_FUSE_ROPE ? "rope+kv_store" : "qk_norm+rope+kv_store";
    int k = slot - PT_OP_COUNT - 1, res = k & 1, nw = (k >> 1) % CU_FUSE_MAX_W + 1;
    int pro = (k >> 1) / CU_FUSE_MAX_W;
    static const char *pros[] = {"", "rmsnorm+", "swiglu+"};
    snprintf(buf, len, "%smatmul%s%s", pros[pro % 3], nw > 1 ? (nw == 2 ? "x2" : "x3") : "",
             res ? "+add" : "");
    return buf;
}

/* Plans the fused launch for ops[i..n): how many records it stands for
 * (0: none), with f filled. */
static int plan(const cuda_backend *cb, const pt_op *ops, int i, int n, cu_fused *f) {
    memset(f, 0, sizeof *f);
    int j = i; /* the first matmul */
    const void *made = NULL; /* the prologue's output: not stored */
    size_t made_b = 0;
    if ((ops[i].kind == PT_OP_RMSNORM && (cb->fuse & CUDA_FUSE_NORM)) ||
        (ops[i].kind == PT_OP_SWIGLU && (cb->fuse & CUDA_FUSE_SWIGLU))) {
        if (i + 1 >= n || ops[i + 1].kind != PT_OP_MATMUL) return 0;
        const pt_op_matmul *m = &ops[i + 1].matmul;
        if (ops[i].kind == PT_OP_RMSNORM) {
            const pt_op_rmsnorm *r = &ops[i].rmsnorm;
            if (m->x != r->y || m->n != r->n || m->w.cols != r->d) return 0;
            f->pro = CU_PRO_NORM, f->x = r->x, f->g = r->g, f->eps = r->eps;
            f->norm_y = r->y, made = r->y, made_b = F4((size_t)r->n * r->d);
        } else {
            const pt_op_swiglu *s = &ops[i].swiglu;
            if (m->x != s->y || (size_t)m->n * m->w.cols != s->count) return 0;
            if (s->y != s->gate && overlap(s->y, F4(s->count), s->gate, F4(s->count))) return 0;
            f->pro = CU_PRO_SWIGLU, f->x = s->gate, f->up = s->up;
            made = s->y, made_b = F4(s->count);
        }
        j = i + 1;
    } else if (ops[i].kind != PT_OP_MATMUL || !(cb->fuse & CUDA_FUSE_MM)) {
        return 0;
    }
    const pt_op_matmul *m0 = &ops[j].matmul;
    /* decode-sized, and x aligned as the unfused GEMV needs to take the
     * kernel the fused one is a copy of */
    if (!gemv_sized(cb, m0) || ((uintptr_t)m0->x & 15)) return 0;
    if (!f->pro) f->x = m0->x;
    f->n = m0->n;
    size_t x_b = F4((size_t)m0->n * m0->w.cols);
    int k = j;
    int most = cb->fuse & CUDA_FUSE_MM ? CU_FUSE_MAX_W : 1;
    while (k < n && k - j < most && ops[k].kind == PT_OP_MATMUL &&
           same_input(m0, &ops[k].matmul)) {
        const pt_op_matmul *m = &ops[k].matmul;
        size_t y_b = F4((size_t)m->n * m->w.rows);
        /* its output must not be an input of this launch or of the ones before it */
        bool clash = overlap(m->y, y_b, f->x, x_b) || overlap(m->y, y_b, m->x, x_b) ||
                     (f->g && overlap(m->y, y_b, f->g, F4(m->w.cols))) ||
                     (f->up && overlap(m->y, y_b, f->up, x_b));
        for (int q = 0; q < f->nw && !clash; q++)
            clash = overlap(m->y, y_b, f->y[q], F4((size_t)f->n * f->w[q].rows));
        if (clash) break;
        f->y[f->nw] = m->y, f->w[f->nw] = kweight(&m->w);
        k++;
        /* its bias, added right after it (q, k, v of Qwen2 and gpt-oss) */
        const pt_op_add_bias *b = k < n && ops[k].kind == PT_OP_ADD_BIAS ? &ops[k].add_bias : NULL;
        if (b && b->y == m->y && b->n == m->n && b->d == m->w.rows &&
            !overlap(b->bias, F4(b->d), m->y, y_b))
            f->bias[f->nw] = b->bias, k++;
        f->nw++;
    }
    if (!f->nw || f->w[0].fmt < 0) return 0;
    if ((f->w[0].fmt == CU_Q4_0 || f->w[0].fmt == CU_Q8_0) && !(cb->fuse & CUDA_FUSE_QUANT))
        return 0;
    /* the residual: add(x, x, y) (or x + y into another buffer) right after */
    if (f->nw == 1 && k < n && ops[k].kind == PT_OP_ADD && (cb->fuse & CUDA_FUSE_MM)) {
        const pt_op_add *a = &ops[k].add;
        size_t y_b = F4((size_t)f->n * f->w[0].rows);
        const float *other = a->a == f->y[0] ? a->b : a->b == f->y[0] ? a->a : NULL;
        if (other && a->count * sizeof(float) == y_b && other != f->y[0] &&
            !overlap(a->y, y_b, f->x, x_b) && !overlap(a->y, y_b, f->y[0], y_b) &&
            !(f->up && overlap(a->y, y_b, f->up, x_b)) &&
            !(f->g && overlap(a->y, y_b, f->g, F4(f->w[0].cols))) &&
            !(f->norm_y && overlap(a->y, y_b, f->norm_y, x_b)) &&
            (a->y == other || !overlap(a->y, y_b, other, y_b))) {
            f->res_out = a->y, f->res_in = other;
            k++;
        }
    }
    if (made) {
        bool dead = dead_after(ops, k, n, made, made_b);
        if (f->pro == CU_PRO_SWIGLU && !dead) return 0; /* its output is never stored */
        if (f->pro == CU_PRO_NORM) {
            if (dead) f->norm_y = NULL;
            else if (overlap(f->norm_y, made_b, f->x, x_b)) return 0; /* in place and read */
        }
    }
    return k - i;
}

/* The per-head norms of q and k (qk_norm models, both in place), rope of
 * q and of k, and the store of k and v into a plain cache: one launch
 * (cu_rope_store) for ops[i..), or 0 records.  The launch writes q and k
 * back as the ops do, so nothing need be dead after it. */
static int plan_rope(const cuda_backend *cb, const pt_op *ops, int i, int n,
                     cu_rope_store_args *r) {
    if (!(cb->fuse & CUDA_FUSE_ROPE)) return 0;
    const pt_op_rmsnorm *nq = NULL, *nk = NULL;
    int j = i;
    if (j + 1 < n && ops[j].kind == PT_OP_RMSNORM && ops[j + 1].kind == PT_OP_RMSNORM)
        nq = &ops[j].rmsnorm, nk = &ops[j + 1].rmsnorm, j += 2;
    if (j + 2 >= n || ops[j].kind != PT_OP_ROPE || ops[j + 1].kind != PT_OP_ROPE ||
        ops[j + 2].kind != PT_OP_KV_STORE)
        return 0;
    const pt_op_rope *rq = &ops[j].rope, *rk = &ops[j + 1].rope;
    const pt_op_kv_store *st = &ops[j + 2].kv_store;
    const pt_kv_view *kv = &st->kv;
    const pt_rope *a = &rq->rope, *b = &rk->rope;
    int t = rq->b.n_tokens, d = rq->head_dim;
    int dt = kv->dtype == PT_F32 ? CU_F32 : kv->dtype == PT_F16 ? CU_F16
           : kv->dtype == PT_BF16 ? CU_BF16 : -1;
    if (kv->codec || dt < 0 || st->k != rk->x || rk->head_dim != d || kv->head_dim != d ||
        kv->n_kv_heads != rk->n_heads || rk->b.n_tokens != t || st->b.n_tokens != t ||
        rk->b.pos != rq->b.pos || a->style != b->style || a->n_rot != b->n_rot ||
        a->inv_freq != b->inv_freq || a->mscale != b->mscale)
        return 0;
    size_t qb = F4((size_t)t * rq->n_heads * d), kb = F4((size_t)t * rk->n_heads * d);
    if (overlap(rq->x, qb, rk->x, kb) || overlap(st->v, kb, rq->x, qb) ||
        overlap(st->v, kb, rk->x, kb))
        return 0;
    if (nq && (nq->x != nq->y || nq->y != rq->x || nq->n != t * rq->n_heads || nq->d != d ||
               nk->x != nk->y || nk->y != rk->x || nk->n != t * rk->n_heads || nk->d != d ||
               nk->eps != nq->eps || overlap(nq->g, F4(d), rq->x, qb) ||
               overlap(nk->g, F4(d), rk->x, kb)))
        return 0;
    *r = (cu_rope_store_args){
        .q = rq->x, .k = rk->x, .v = st->v,
        .q_norm = nq ? nq->g : NULL, .k_norm = nk ? nk->g : NULL, .eps = nq ? nq->eps : 0,
        .pos = rq->b.pos, .n = t, .n_heads = rq->n_heads, .n_kv_heads = rk->n_heads,
        .head_dim = d, .style = a->style, .n_rot = a->n_rot, .inv_freq = a->inv_freq,
        .mscale = a->mscale, .kc = kv->k, .vc = kv->v, .dtype = dt,
        .page_size = kv->page_size, .max_pages = st->b.max_pages, .kv_pos = st->b.pos,
        .seq = st->b.seq, .block_table = st->b.block_table,
    };
    return j + 3 - i;
}

int cuda_exec_fused(cuda_backend *cb, const pt_op *ops, int i, int n, int *slot) {
    cu_rope_store_args r;
    int used = plan_rope(cb, ops, i, n, &r);
    if (used) {
        if (cu_rope_store(&cb->ctx, &r) != 0) return 0;
        *slot = PROF_FUSE_ROPE + (r.q_norm != NULL);
        return used;
    }
    cu_fused f;
    used = plan(cb, ops, i, n, &f);
    if (used < 2) return 0;
    bool quant = f.w[0].fmt == CU_Q4_0 || f.w[0].fmt == CU_Q8_0;
    /* refused: the first op runs alone (after a prologue the kernels
     * refuse, the matmuls are tried again without it) */
    if ((quant ? cu_qgemv_fused(&cb->ctx, &f) : cu_gemv_fused(&cb->ctx, &f)) != 0) return 0;
    *slot = fuse_slot(&f);
    return used;
}
