/*
 * cpu_attention.c - writing K/V into the paged cache, and causal attention
 * over it.
 *
 * Cache layout (backend.h): position p of sequence s is slot p % page_size of
 * page block_table[s * max_pages + p / page_size]; a slot holds
 * [n_kv_heads][head_dim] elements of the cache dtype, so the slots of one
 * page form one contiguous block.
 *
 * Attention work item = (row, range of positions), covering every head.
 * Reading whole slots keeps each page one sequential stream (the hardware
 * prefetchers follow it; a per-kv-head walk would touch a short piece of
 * every slot and run at a fraction of the bandwidth once the context
 * outgrows the caches).  Positions go in chunks that never cross a page; a
 * chunk's K (then V) is converted to f32 once - read in place for an f32
 * cache - and serves every query head of each group through two
 * register-blocked kernels, attn_scores (q · k, 8 rows at a time) and
 * attn_accum (acc += w · V, 64 dims held in registers).
 *
 * Softmax is online: each chunk's scores are exponentiated against the
 * running max, and the running sum and accumulator are rescaled when the
 * max grows.  All accumulation is f32.
 *
 * Parallelism: items are handed out from an atomic counter, since rows
 * differ in length.  A row much longer than its share of the batch (one
 * long decode row, two threads) is split into position ranges whose partial
 * (max, sum, accumulator) are merged afterwards, the flash-decoding way.
 *
 * attention_ext is the same walk over a window's positions only (a
 * sliding-window layer), with scores optionally soft-capped (Gemma 2), and
 * optionally a sink logit per head added to the softmax's denominator at
 * the end (gpt-oss): o = acc / (l + exp(sink - m)).
 *
 * Quantized caches (kv->codec set) have their own fused kernels in
 * attn_kvq.c; the two ops here only hand them over.
 */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "backend/cpu/attn_kvq.h"
#include "backend/cpu/cpu_backend.h"

#define CHUNK 64
/* Query heads per work item at most (bounds the per-item stack arrays). */
#define MAX_HEADS_PER_ITEM 8

/* ---- kv_store ------------------------------------------------------------------- */

typedef struct store_job {
    const pt_cpu_wops *wo;
    const pt_kv_view *kv;
    const pt_batch_view *b;
    const float *k, *v;
    size_t esize;
} store_job;

/* Element offset of (position p of sequence s, kv head 0) in the cache. */
static size_t slot_offset(const pt_kv_view *kv, const pt_batch_view *b, int s, int p) {
    return pt_cpu_kv_slot(kv, b, s, p) * kv->n_kv_heads * kv->head_dim;
}

static void store_task(void *ctx, int ith, int nth) {
    const store_job *j = ctx;
    int64_t width = (int64_t)j->kv->n_kv_heads * j->kv->head_dim, lo, hi;
    pt_cpu_split(j->b->n_tokens, ith, nth, 1, &lo, &hi);
    for (int64_t t = lo; t < hi; t++) {
        size_t off = slot_offset(j->kv, j->b, j->b->seq[t], j->b->pos[t]) * j->esize;
        j->wo->from_f32((char *)j->kv->k + off, j->k + t * width, width);
        j->wo->from_f32((char *)j->kv->v + off, j->v + t * width, width);
    }
}

void pt_cpu_check_rows(const char *op, const pt_kv_view *kv, const pt_batch_view *b) {
    for (int t = 0; t < b->n_tokens; t++) {
        if (b->seq[t] < 0 || b->seq[t] >= b->n_seqs)
            pt_cpu_die("%s: row %d has sequence %d of %d", op, t, b->seq[t], b->n_seqs);
        if (b->pos[t] < 0 || b->pos[t] / kv->page_size >= b->max_pages)
            pt_cpu_die("%s: row %d position %d is beyond %d pages of %d", op, t, b->pos[t],
                       b->max_pages, kv->page_size);
    }
}

static const pt_cpu_wops *kv_wops(const pt_cpu_backend *cb, const pt_kv_view *kv, const char *op) {
    if (kv->dtype != PT_F32 && kv->dtype != PT_F16 && kv->dtype != PT_BF16)
        pt_cpu_die("%s: KV dtype %s is not supported", op, pt_dtype_name(kv->dtype));
    if (kv->page_size <= 0 || kv->n_kv_heads <= 0 || kv->head_dim <= 0)
        pt_cpu_die("%s: bad KV geometry", op);
    return pt_cpu_wops_for(cb, kv->dtype, op);
}

void pt_cpu_kv_store(pt_backend *be, const pt_kv_view *kv, const pt_batch_view *b, const float *k,
                     const float *v) {
    pt_cpu_backend *cb = pt_cpu(be);
    if (kv->codec) { /* quantized cache: attn_kvq.c */
        pt_cpu_kvq_store(be, kv, b, k, v);
        return;
    }
    store_job j = {kv_wops(cb, kv, "kv_store"), kv, b, k, v, pt_dtype_bytes(kv->dtype, 1)};
    pt_cpu_check_rows("kv_store", kv, b);
    pt_cpu_run(cb, store_task, &j, 2.0 * b->n_tokens * kv->n_kv_heads * kv->head_dim);
}

/* ---- attention -------------------------------------------------------------------- */

/* Positions per softmax step (the scores of all heads for a chunk are kept).
 * A chunk may span pages; K and V are read page segment by segment. */
#define CHUNK 64
/* A row is split only into parts of at least this many positions, and into
 * about ITEMS_PER_THREAD items per thread over the batch. */
#define MIN_PART 512
#define ITEMS_PER_THREAD 4

/* A work item: positions [p0, p1) of row t.  part < 0: the item covers the
 * whole row and writes out; otherwise its partial result goes to parts. */
typedef struct attn_item {
    int32_t t, p0, p1, part;
} attn_item;

/* A split row: its parts are first .. first + count - 1. */
typedef struct attn_split {
    int32_t t, first, count;
} attn_split;

typedef struct attn_job {
    const pt_cpu_kernels *k;
    const pt_cpu_wops *wo;
    const pt_kv_view *kv;
    const pt_batch_view *b;
    float *out;
    const float *q;
    int n_heads, group, seg_max; /* seg_max: longest page segment in a chunk */
    float scale;
    float softcap; /* > 0: scores become softcap * tanh(score / softcap) */
    int window;    /* > 0: row t sees positions pos[t] - window + 1 .. pos[t] */
    const float *sinks; /* [n_heads] one more logit in each head's denominator, or NULL */
    size_t esize;
    const attn_item *items;
    int n_items;
    const attn_split *splits;
    int n_splits;
    float *parts; /* [part][n_heads][hd + 2]: accumulator, then max and sum */
    float *const *scratch;
    _Atomic int next;
} attn_job;

/* Running softmax state of all heads of one item (per-thread scratch). */
typedef struct attn_state {
    float *q;    /* [n_heads][hd] queries, pre-multiplied by scale */
    float *acc;  /* [n_heads][hd] unnormalized outputs */
    float *m;    /* [n_heads] running max */
    float *l;    /* [n_heads] running sum */
    float *sc;   /* [n_heads][CHUNK] scores, then weights */
    float *buf;  /* [seg_max][n_kv_heads * hd] one segment's K or V in f32 */
} attn_state;

/* A segment's slots (all kv heads) as f32: in place for an f32 cache, else
 * converted into buf with one call (the slots of a page are contiguous). */
static const float *segment_f32(const attn_job *j, float *buf, const void *pool, size_t off, int cnt,
                                int64_t width) {
    if (j->kv->dtype == PT_F32) return (const float *)pool + off / sizeof(float);
    j->wo->to_f32(buf, (const char *)pool + off, cnt * width);
    return buf;
}

/* Folds a chunk's scores into the running max and sum; turns the scores into
 * weights relative to the new max and rescales the accumulator. */
static void chunk_softmax(const attn_job *j, attn_state *st, int cnt) {
    int hd = j->kv->head_dim;
    for (int h = 0; h < j->n_heads; h++) {
        float *s = st->sc + h * CHUNK, mx = j->k->max(s, cnt);
        if (mx > st->m[h]) {
            float corr = expf(st->m[h] - mx); /* 0 on the first chunk (m = -inf) */
            st->l[h] *= corr;
            j->k->scale(st->acc + h * hd, corr, hd);
            st->m[h] = mx;
        }
        st->l[h] += j->k->exp_sum(s, cnt, st->m[h]);
    }
}

/* The page segment at position p of sequence s: its length (at most
 * `left`) and its byte offset in the K or V pool. */
static int segment(const attn_job *j, int s, int p, int left, size_t *off) {
    int ps = j->kv->page_size;
    *off = slot_offset(j->kv, j->b, s, p) * j->esize;
    return PT_MIN(ps - p % ps, left);
}

/* Scores of every head against positions p .. p+cnt-1, into sc[h][0..cnt). */
static void chunk_scores(const attn_job *j, attn_state *st, int s, int p, int cnt) {
    const pt_kv_view *kv = j->kv;
    int hd = kv->head_dim;
    int64_t width = (int64_t)kv->n_kv_heads * hd;
    for (int c = 0, seg; c < cnt; c += seg) {
        size_t off, next;
        seg = segment(j, s, p + c, cnt - c, &off);
        size_t bytes = (size_t)seg * width * j->esize;
        pt_cpu_prefetch_start((const char *)kv->v + off, bytes); /* read right after the scores */
        if (c + seg < cnt) {
            segment(j, s, p + c + seg, cnt - c - seg, &next);
            pt_cpu_prefetch_start((const char *)kv->k + next, bytes);
        }
        const float *kr = segment_f32(j, st->buf, kv->k, off, seg, width);
        for (int h = 0; h < j->n_heads; h++)
            j->k->attn_scores(st->sc + h * CHUNK + c, st->q + h * hd, kr + (h / j->group) * hd, width, seg, hd);
    }
}

/* acc[h] += weights · V over positions p .. p+cnt-1. */
static void chunk_values(const attn_job *j, attn_state *st, int s, int p, int cnt) {
    const pt_kv_view *kv = j->kv;
    int hd = kv->head_dim;
    int64_t width = (int64_t)kv->n_kv_heads * hd;
    for (int c = 0, seg; c < cnt; c += seg) {
        size_t off;
        seg = segment(j, s, p + c, cnt - c, &off);
        const float *vr = segment_f32(j, st->buf, kv->v, off, seg, width);
        for (int h = 0; h < j->n_heads; h++)
            j->k->attn_accum(st->acc + h * hd, st->sc + h * CHUNK + c, vr + (h / j->group) * hd, width, seg, hd);
    }
}

/* Gemma 2's soft-capping of the (already scaled) scores of a chunk. */
static void chunk_softcap(const attn_job *j, attn_state *st, int cnt) {
    for (int h = 0; h < j->n_heads; h++)
        for (int i = 0; i < cnt; i++) {
            float *x = &st->sc[h * CHUNK + i];
            *x = j->softcap * tanhf(*x / j->softcap);
        }
}

static void attend_item(const attn_job *j, attn_state *st, const attn_item *it) {
    int hd = j->kv->head_dim, s = j->b->seq[it->t];
    for (int h = 0; h < j->n_heads; h++) {
        const float *qh = j->q + ((size_t)it->t * j->n_heads + h) * hd;
        for (int i = 0; i < hd; i++) st->q[h * hd + i] = qh[i] * j->scale;
        st->m[h] = -INFINITY;
        st->l[h] = 0;
    }
    memset(st->acc, 0, (size_t)j->n_heads * hd * sizeof(float));
    for (int p = it->p0, cnt; p < it->p1; p += cnt) {
        cnt = PT_MIN(CHUNK, it->p1 - p);
        chunk_scores(j, st, s, p, cnt);
        if (j->softcap > 0) chunk_softcap(j, st, cnt);
        chunk_softmax(j, st, cnt);
        chunk_values(j, st, s, p, cnt);
    }
    if (it->part < 0) {
        for (int h = 0; h < j->n_heads; h++) {
            float *o = j->out + ((size_t)it->t * j->n_heads + h) * hd;
            float l = st->l[h] + (j->sinks ? expf(j->sinks[h] - st->m[h]) : 0.0f);
            for (int i = 0; i < hd; i++) o[i] = st->acc[h * hd + i] / l;
        }
        return;
    }
    float *part = j->parts + (size_t)it->part * j->n_heads * (hd + 2);
    for (int h = 0; h < j->n_heads; h++) {
        memcpy(part + h * (hd + 2), st->acc + h * hd, (size_t)hd * sizeof(float));
        part[h * (hd + 2) + hd] = st->m[h];
        part[h * (hd + 2) + hd + 1] = st->l[h];
    }
}

static void attn_task(void *ctx, int ith, int nth) {
    attn_job *j = ctx;
    int hd = j->kv->head_dim, nh = j->n_heads;
    attn_state st;
    st.q = j->scratch[ith];
    st.acc = st.q + (size_t)nh * hd;
    st.m = st.acc + (size_t)nh * hd;
    st.l = st.m + nh;
    st.sc = st.l + nh;
    st.buf = st.sc + (size_t)nh * CHUNK;
    for (;;) {
        int i = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
        if (i >= j->n_items) break;
        attend_item(j, &st, &j->items[i]);
    }
    (void)nth;
}

/* Merges the parts of each split row: rescale every part to the common max,
 * then sum accumulators and sums. */
static void merge_task(void *ctx, int ith, int nth) {
    const attn_job *j = ctx;
    int hd = j->kv->head_dim;
    int64_t lo, hi;
    pt_cpu_split(j->n_splits, ith, nth, 1, &lo, &hi);
    for (int64_t r = lo; r < hi; r++) {
        const attn_split *sp = &j->splits[r];
        for (int h = 0; h < j->n_heads; h++) {
            float *o = j->out + ((size_t)sp->t * j->n_heads + h) * hd;
            float mx = -INFINITY, sum = 0;
            for (int i = 0; i < sp->count; i++)
                mx = PT_MAX(mx, j->parts[((size_t)(sp->first + i) * j->n_heads + h) * (hd + 2) + hd]);
            memset(o, 0, (size_t)hd * sizeof(float));
            for (int i = 0; i < sp->count; i++) {
                const float *part = j->parts + ((size_t)(sp->first + i) * j->n_heads + h) * (hd + 2);
                float w = expf(part[hd] - mx);
                sum += w * part[hd + 1];
                for (int d = 0; d < hd; d++) o[d] += w * part[d];
            }
            if (j->sinks) sum += expf(j->sinks[h] - mx);
            for (int d = 0; d < hd; d++) o[d] /= sum;
        }
    }
}

void *pt_cpu_grow(void **buf, size_t *cap, size_t bytes) {
    if (bytes > *cap) {
        free(*buf);
        *cap = PT_MAX(bytes, *cap * 2);
        *buf = pt_xmalloc(*cap);
    }
    return *buf;
}

static int row_parts(int64_t n_pos, int64_t target) {
    return (int)((n_pos + target - 1) / target);
}

/* The first position row t attends to (its window's start). */
static int32_t row_start(const attn_job *j, int t) {
    return j->window > 0 ? PT_MAX(0, j->b->pos[t] + 1 - j->window) : 0;
}

/* Cuts the batch into items: a row is split into parts of about `target`
 * positions when it is that much longer than its share of the work. */
static void plan_items(pt_cpu_backend *cb, attn_job *j) {
    const pt_batch_view *b = j->b;
    int nth = cb->base.n_threads;
    int64_t total = 0;
    for (int t = 0; t < b->n_tokens; t++) total += b->pos[t] + 1 - row_start(j, t);
    int64_t target = nth == 1 ? INT32_MAX : PT_MAX(MIN_PART, total / (ITEMS_PER_THREAD * nth) + 1);
    int n_items = 0, n_splits = 0;
    for (int t = 0; t < b->n_tokens; t++) {
        int parts = row_parts(b->pos[t] + 1 - row_start(j, t), target);
        n_items += parts;
        n_splits += parts > 1;
    }
    size_t meta = (size_t)n_items * sizeof(attn_item) + (size_t)n_splits * sizeof(attn_split);
    attn_item *items = pt_cpu_grow(&cb->attn_meta, &cb->attn_meta_cap, meta);
    attn_split *splits = (attn_split *)(items + n_items);
    int i = 0, part = 0, k = 0;
    for (int t = 0; t < b->n_tokens; t++) {
        int32_t p0 = row_start(j, t);
        int n_pos = b->pos[t] + 1 - p0, parts = row_parts(n_pos, target);
        if (parts > 1) splits[k++] = (attn_split){t, part, parts};
        for (int c = 0; c < parts; c++)
            items[i++] = (attn_item){t, p0 + (int32_t)((int64_t)n_pos * c / parts),
                                     p0 + (int32_t)((int64_t)n_pos * (c + 1) / parts),
                                     parts > 1 ? part++ : -1};
    }
    j->items = items;
    j->n_items = n_items;
    j->splits = splits;
    j->n_splits = n_splits;
    size_t part_bytes = (size_t)part * j->n_heads * (j->kv->head_dim + 2) * sizeof(float);
    j->parts = part ? pt_cpu_grow(&cb->attn_parts, &cb->attn_parts_cap, part_bytes) : NULL;
}

void pt_cpu_attention(pt_backend *be, float *out, const float *q, const pt_kv_view *kv,
                      const pt_batch_view *b, int n_heads, float scale) {
    if (kv->codec) { /* quantized cache: attn_kvq.c */
        pt_cpu_kvq_attention(be, out, q, kv, b, n_heads, scale);
        return;
    }
    pt_attn_params p = {.scale = scale};
    pt_cpu_attention_ext(be, out, q, kv, b, n_heads, &p);
}

void pt_cpu_attention_ext(pt_backend *be, float *out, const float *q, const pt_kv_view *kv,
                          const pt_batch_view *b, int n_heads, const pt_attn_params *prm) {
    pt_cpu_backend *cb = pt_cpu(be);
    if (kv->codec) /* the model refuses this pairing at pt_model_kv_init */
        pt_cpu_die("attention_ext: a quantized KV cache takes no window or soft-cap");
    const pt_cpu_wops *wo = kv_wops(cb, kv, "attention");
    if (n_heads <= 0 || n_heads % kv->n_kv_heads)
        pt_cpu_die("attention: %d query heads do not group over %d kv heads", n_heads, kv->n_kv_heads);
    pt_cpu_check_rows("attention", kv, b);
    if (b->n_tokens <= 0) return;

    int64_t width = (int64_t)kv->n_kv_heads * kv->head_dim;
    attn_job j = {
        .k = cb->k,
        .wo = wo,
        .kv = kv,
        .b = b,
        .out = out,
        .q = q,
        .n_heads = n_heads,
        .group = n_heads / kv->n_kv_heads,
        .seg_max = PT_MIN(CHUNK, kv->page_size),
        .scale = prm->scale,
        .softcap = prm->softcap,
        .window = prm->window,
        .sinks = prm->sinks,
        .esize = pt_dtype_bytes(kv->dtype, 1),
        .scratch = cb->scratch,
    };
    atomic_init(&j.next, 0);
    plan_items(cb, &j);
    size_t hd = (size_t)kv->head_dim;
    if (pt_cpu_scratch_reserve(cb, (size_t)n_heads * (2 * hd + 2 + CHUNK) + (size_t)j.seg_max * width + 16,
                               "attention"))
        return;
    j.scratch = cb->scratch; /* reserve may have moved it */

    double work = 0;
    for (int t = 0; t < b->n_tokens; t++)
        work += (double)(b->pos[t] + 1 - row_start(&j, t)) * n_heads * kv->head_dim * 2;
    pt_cpu_run(cb, attn_task, &j, work);
    if (j.n_splits) pt_cpu_run(cb, merge_task, &j, (double)j.n_splits * n_heads * kv->head_dim * 4);
}
