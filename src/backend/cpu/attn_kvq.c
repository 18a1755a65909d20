/*
 * attn_kvq.c - kv_store and fused attention over quantized KV pages, and the
 * portable kernels (the reference for attn_kvq_avx2.c).
 *
 * Layout (kv_codec.h): position p of sequence s, kv head g is the row at
 * ((page * page_size + p % page_size) * n_kv_heads + g) * row_bytes of the
 * layer's K (or V) buffer, page = block_table[s][p / page_size].  Within a
 * page the rows of one kv head are therefore n_kv_heads * row_bytes apart,
 * which is the stride the kernels take.
 *
 * The driver follows cpu_attention.c: a work item is a range of positions
 * covering every head, so a chunk's slots (all kv heads) are one sequential
 * read; each packed K/V row is dequantized once for all the query vectors
 * that share it - the query heads of its GQA group and, in a prefill, up to
 * MAX_BLOCK consecutive rows of the sequence (each row then finishes its
 * own few newest positions alone).  A long decode row is split into parts
 * whose (max, sum, accumulator) are merged afterwards.  Softmax is online, over
 * chunks of at most CHUNK positions within a page.  For TurboQuant the
 * value accumulator stays in the rotated domain and each output row is
 * un-rotated once at the end (codec->unrotate), after any merge, which turns
 * O(positions * d log d) transforms into O(d log d).
 */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "backend/cpu/attn_kvq.h"
#include "backend/cpu/cpu_backend.h"

/* Positions per chunk at most (a chunk never crosses a page). */
#define CHUNK 64

/* ---- portable kernels ------------------------------------------------------------- */

/* One row at a time through the codec's scalar decoder into a head_dim
 * buffer on the stack: simple, and exactly the codec's arithmetic. */
static void portable_k_scores(const pt_kv_codec *c, const uint8_t *slots, size_t slot_bytes,
                              int cnt, int n_kv, const float *q, int G, float *sc, int ld) {
    float x[PT_TQ_MAX_DIM];
    int d = c->head_dim;
    for (int r = 0; r < cnt; r++)
        for (int g = 0; g < n_kv; g++) {
            c->decode_k(c, slots + (size_t)r * slot_bytes + (size_t)g * c->k_row, x);
            for (int h = g * G; h < g * G + G; h++) {
                float s = 0;
                for (int i = 0; i < d; i++)
                    s += q[h * d + i] * x[i];
                sc[h * ld + r] = s;
            }
        }
}

static void portable_v_accum(const pt_kv_codec *c, const uint8_t *slots, size_t slot_bytes, int cnt,
                             int n_kv, const float *w, int ld, int G, float *acc) {
    float x[PT_TQ_MAX_DIM];
    int d = c->head_dim;
    for (int r = 0; r < cnt; r++)
        for (int g = 0; g < n_kv; g++) {
            c->decode_v_raw(c, slots + (size_t)r * slot_bytes + (size_t)g * c->v_row, x);
            for (int h = g * G; h < g * G + G; h++)
                for (int i = 0; i < d; i++)
                    acc[h * d + i] += w[h * ld + r] * x[i];
        }
}

const pt_kvq_kernels *pt_kvq_kernels_portable(void) {
    static const pt_kvq_kernels k = {"portable", portable_k_scores, portable_v_accum};
    return &k;
}

/* ---- shared checks ------------------------------------------------------------------- */

static const pt_kv_codec *checked_codec(const pt_kv_view *kv, const char *op) {
    const pt_kv_codec *c = kv->codec;
    if (!c || c->head_dim != kv->head_dim || kv->k_row != c->k_row || kv->v_row != c->v_row)
        pt_cpu_die("%s: the view's codec does not match its geometry", op);
    if (kv->page_size <= 0 || kv->n_kv_heads <= 0) pt_cpu_die("%s: bad KV geometry", op);
    return c;
}

/* Byte offset of (position p of sequence s, kv head 0) for rows of row_bytes. */
static size_t slot_offset(const pt_kv_view *kv, const pt_batch_view *b, int s, int p,
                          size_t row_bytes) {
    return pt_cpu_kv_slot(kv, b, s, p) * kv->n_kv_heads * row_bytes;
}

/* ---- kv_store ------------------------------------------------------------------------- */

typedef struct store_job {
    const pt_kv_codec *c;
    const pt_kv_view *kv;
    const pt_batch_view *b;
    const float *k, *v;
} store_job;

static void store_task(void *ctx, int ith, int nth) {
    const store_job *j = ctx;
    const pt_kv_codec *c = j->c;
    int n_kv = j->kv->n_kv_heads, d = c->head_dim;
    int64_t lo, hi;
    pt_cpu_split((int64_t)j->b->n_tokens * n_kv, ith, nth, 1, &lo, &hi);
    for (int64_t i = lo; i < hi; i++) {
        int t = (int)(i / n_kv), g = (int)(i % n_kv), s = j->b->seq[t], p = j->b->pos[t];
        uint8_t *krow =
            (uint8_t *)j->kv->k + slot_offset(j->kv, j->b, s, p, c->k_row) + (size_t)g * c->k_row;
        uint8_t *vrow =
            (uint8_t *)j->kv->v + slot_offset(j->kv, j->b, s, p, c->v_row) + (size_t)g * c->v_row;
        c->encode_k(c, j->k + (size_t)i * d, krow);
        c->encode_v(c, j->v + (size_t)i * d, vrow);
    }
}

void pt_cpu_kvq_store(pt_backend *be, const pt_kv_view *kv, const pt_batch_view *b, const float *k,
                      const float *v) {
    store_job j = {checked_codec(kv, "kv_store"), kv, b, k, v};
    pt_cpu_check_rows("kv_store", kv, b);
    /* Encoding costs tens of operations per element (TurboQuant values: a
     * transform and a table search), hence the weight on the estimate. */
    pt_cpu_run(pt_cpu(be), store_task, &j, 32.0 * b->n_tokens * kv->n_kv_heads * kv->head_dim);
}

/* ---- attention -------------------------------------------------------------------------- */

/* A row is split into parts of at least MIN_PART positions, about
 * ITEMS_PER_THREAD items per thread over the batch (as cpu_attention.c). */
#define MIN_PART 512
#define ITEMS_PER_THREAD 4
/* Prefill rows of one sequence go in blocks that share each decoded K/V
 * row: up to MAX_BLOCK rows, and at most BLOCK_HEADS query vectors (rows
 * times heads) per block, so the per-thread state stays in L2. */
#define MAX_BLOCK 8
#define BLOCK_HEADS 64

/* Rows t .. t + nr - 1 (consecutive positions of one sequence) over the
 * positions [p0, p1) they all see; each row of a block then also takes its
 * own tail, p1 .. its position.  part < 0: the item writes out; otherwise
 * (single rows only) its partial result goes to parts. */
typedef struct attn_item {
    int32_t t, nr, p0, p1, part;
} attn_item;

/* A split row: its parts are first .. first + count - 1. */
typedef struct attn_split {
    int32_t t, first, count;
} attn_split;

typedef struct attn_job {
    const pt_cpu_kernels *k;
    const pt_kvq_kernels *qk;
    const pt_kv_codec *c;
    const pt_kv_view *kv;
    const pt_batch_view *b;
    float *out;
    const float *q;
    int n_heads, group, max_rows; /* max_rows: rows per block at most */
    float scale;
    const attn_item *items;
    int n_items;
    const attn_split *splits;
    int n_splits;
    float *parts; /* [part][n_heads][hd + 2]: accumulator, then max and sum */
    float *const *scratch;
    _Atomic int next;
} attn_job;

/* Running softmax state of an item's query vectors (per-thread scratch).
 * Vector (g, r, h) - kv head g, row r of the block, head h of g's group -
 * is index (g * nr + r) * G + h, so the vectors of one kv head are
 * contiguous and a kernel call serves all the block's rows at once. */
typedef struct attn_state {
    int nr;
    float *q;   /* [n_vec][hd] queries, pre-multiplied by scale */
    float *acc; /* [n_vec][hd] unnormalized outputs (rotated for turbo) */
    float *m;   /* [n_vec] running max */
    float *l;   /* [n_vec] running sum */
    float *sc;  /* [n_vec][CHUNK] scores, then weights */
} attn_state;

/* Folds a chunk's scores of vectors [v0, v0 + nv) into their running max
 * and sum; turns the scores into weights and rescales the accumulators. */
static void chunk_softmax(const attn_job *j, attn_state *st, int v0, int nv, int cnt) {
    int hd = j->kv->head_dim;
    for (int v = v0; v < v0 + nv; v++) {
        float *s = st->sc + (size_t)v * CHUNK, mx = s[0];
        for (int c = 1; c < cnt; c++)
            mx = s[c] > mx ? s[c] : mx;
        if (mx > st->m[v]) {
            float corr = expf(st->m[v] - mx); /* 0 on the first chunk (m = -inf) */
            st->l[v] *= corr;
            j->k->scale(st->acc + (size_t)v * hd, corr, hd);
            st->m[v] = mx;
        }
        st->l[v] += j->k->exp_sum(s, cnt, st->m[v]);
    }
}

static int chunk_len(const pt_kv_view *kv, int p, int p1) {
    return PT_MIN(CHUNK, PT_MIN(kv->page_size - p % kv->page_size, p1 - p));
}

/* Every vector of the block against one chunk of positions, every kv head:
 * the chunk's slots are contiguous, one sequential read of K and of V. */
static void attend_chunk(const attn_job *j, attn_state *st, const uint8_t *kb, const uint8_t *vb,
                         int cnt) {
    const pt_kv_codec *c = j->c;
    int n_kv = j->kv->n_kv_heads, gv = st->nr * j->group;
    j->qk->k_scores(c, kb, (size_t)n_kv * c->k_row, cnt, n_kv, st->q, gv, st->sc, CHUNK);
    chunk_softmax(j, st, 0, n_kv * gv, cnt);
    j->qk->v_accum(c, vb, (size_t)n_kv * c->v_row, cnt, n_kv, st->sc, CHUNK, gv, st->acc);
}

/* Row r of the block alone against one chunk (its tail). */
static void attend_chunk_row(const attn_job *j, attn_state *st, int r, const uint8_t *kb,
                             const uint8_t *vb, int cnt) {
    const pt_kv_codec *c = j->c;
    int n_kv = j->kv->n_kv_heads, G = j->group, hd = c->head_dim;
    size_t ks = (size_t)n_kv * c->k_row, vs = (size_t)n_kv * c->v_row;
    for (int g = 0; g < n_kv; g++) {
        int v0 = (g * st->nr + r) * G;
        j->qk->k_scores(c, kb + (size_t)g * c->k_row, ks, cnt, 1, st->q + (size_t)v0 * hd, G,
                        st->sc + (size_t)v0 * CHUNK, CHUNK);
        chunk_softmax(j, st, v0, G, cnt);
        j->qk->v_accum(c, vb + (size_t)g * c->v_row, vs, cnt, 1, st->sc + (size_t)v0 * CHUNK, CHUNK,
                       G, st->acc + (size_t)v0 * hd);
    }
}

/* Runs positions [p0, p1) of sequence s through one of the two above
 * (r < 0: the whole block). */
static void attend_range(const attn_job *j, attn_state *st, int s, int p0, int p1, int r) {
    const pt_kv_view *kv = j->kv;
    const pt_kv_codec *c = j->c;
    size_t k_slot = (size_t)kv->n_kv_heads * c->k_row, v_slot = (size_t)kv->n_kv_heads * c->v_row;
    for (int p = p0, cnt; p < p1; p += cnt) {
        cnt = chunk_len(kv, p, p1);
        const uint8_t *kb = (const uint8_t *)kv->k + slot_offset(kv, j->b, s, p, c->k_row);
        const uint8_t *vb = (const uint8_t *)kv->v + slot_offset(kv, j->b, s, p, c->v_row);
        if (p + cnt < p1) {
            int next = chunk_len(kv, p + cnt, p1);
            size_t at = pt_cpu_kv_slot(kv, j->b, s, p + cnt);
            pt_cpu_prefetch_start((const uint8_t *)kv->k + at * k_slot, next * k_slot);
            pt_cpu_prefetch_start((const uint8_t *)kv->v + at * v_slot, next * v_slot);
        }
        if (r < 0)
            attend_chunk(j, st, kb, vb, cnt);
        else
            attend_chunk_row(j, st, r, kb, vb, cnt);
    }
}

/* out = acc / l, un-rotated once per output row for TurboQuant. */
static void write_row(const pt_kv_codec *c, float *o, const float *acc, float l) {
    if (c->unrotate) {
        memcpy(o, acc, sizeof(float) * (size_t)c->head_dim);
        c->unrotate(c, o, 1.0f / l);
    } else {
        for (int i = 0; i < c->head_dim; i++)
            o[i] = acc[i] / l;
    }
}

/* The state index of (row r, query head h) and back. */
static int vec_of(const attn_job *j, int nr, int r, int h) {
    return (h / j->group * nr + r) * j->group + h % j->group;
}

static void attend_item(const attn_job *j, attn_state *st, const attn_item *it) {
    int hd = j->kv->head_dim, nr = it->nr, nv = nr * j->n_heads, s = j->b->seq[it->t];
    st->nr = nr;
    for (int r = 0; r < nr; r++)
        for (int h = 0; h < j->n_heads; h++) {
            const float *qh = j->q + ((size_t)(it->t + r) * j->n_heads + h) * hd;
            float *qs = st->q + (size_t)vec_of(j, nr, r, h) * hd;
            for (int i = 0; i < hd; i++)
                qs[i] = qh[i] * j->scale;
        }
    for (int v = 0; v < nv; v++)
        st->m[v] = -INFINITY, st->l[v] = 0;
    memset(st->acc, 0, (size_t)nv * hd * sizeof(float));
    attend_range(j, st, s, it->p0, it->p1, -1);
    for (int r = 0; nr > 1 && r < nr; r++)
        attend_range(j, st, s, it->p1, j->b->pos[it->t + r] + 1, r);
    for (int r = 0; r < nr; r++)
        for (int h = 0; h < j->n_heads; h++) {
            int v = vec_of(j, nr, r, h);
            if (it->part < 0) {
                float *o = j->out + ((size_t)(it->t + r) * j->n_heads + h) * hd;
                write_row(j->c, o, st->acc + (size_t)v * hd, st->l[v]);
                continue;
            }
            float *part = j->parts + ((size_t)it->part * j->n_heads + h) * (hd + 2);
            memcpy(part, st->acc + (size_t)v * hd, (size_t)hd * sizeof(float));
            part[hd] = st->m[v];
            part[hd + 1] = st->l[v];
        }
}

static size_t state_floats(int n_vec, int hd) {
    return (size_t)n_vec * (2 * (size_t)hd + 2 + CHUNK) + 16;
}

static void attn_task(void *ctx, int ith, int nth) {
    attn_job *j = ctx;
    int hd = j->kv->head_dim, nv = j->max_rows * j->n_heads;
    attn_state st;
    st.q = j->scratch[ith];
    st.acc = st.q + (size_t)nv * hd;
    st.m = st.acc + (size_t)nv * hd;
    st.l = st.m + nv;
    st.sc = st.l + nv;
    for (;;) {
        int i = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
        if (i >= j->n_items) break;
        attend_item(j, &st, &j->items[i]);
    }
    (void)nth;
}

/* Merges the parts of each split row (rescaled to their common max).  The
 * parts of a TurboQuant row are in the rotated domain; merging is linear,
 * so the one un-rotation happens after it. */
static void merge_task(void *ctx, int ith, int nth) {
    const attn_job *j = ctx;
    int hd = j->kv->head_dim;
    float acc[PT_TQ_MAX_DIM];
    int64_t lo, hi;
    pt_cpu_split(j->n_splits, ith, nth, 1, &lo, &hi);
    for (int64_t r = lo; r < hi; r++) {
        const attn_split *sp = &j->splits[r];
        for (int h = 0; h < j->n_heads; h++) {
            float mx = -INFINITY, sum = 0;
            for (int i = 0; i < sp->count; i++)
                mx = PT_MAX(mx,
                            j->parts[((size_t)(sp->first + i) * j->n_heads + h) * (hd + 2) + hd]);
            memset(acc, 0, sizeof(float) * (size_t)hd);
            for (int i = 0; i < sp->count; i++) {
                const float *part =
                    j->parts + ((size_t)(sp->first + i) * j->n_heads + h) * (hd + 2);
                float w = expf(part[hd] - mx);
                sum += w * part[hd + 1];
                for (int d = 0; d < hd; d++)
                    acc[d] += w * part[d];
            }
            write_row(j->c, j->out + ((size_t)sp->t * j->n_heads + h) * hd, acc, sum);
        }
    }
}

/* Item and part buffers, grown by the dispatching thread and only used
 * during its dispatch: per thread, so backends on different threads never
 * share them, and never freed (they are as large as the largest batch). */
static _Thread_local void *meta_buf, *parts_buf;
static _Thread_local size_t meta_cap, parts_cap;

/* Rows of a block starting at batch row t: consecutive positions of one
 * sequence, at most max_rows. */
static int block_rows(const pt_batch_view *b, int t, int max_rows) {
    int nr = 1;
    while (nr < max_rows && t + nr < b->n_tokens && b->seq[t + nr] == b->seq[t] &&
           b->pos[t + nr] == b->pos[t] + nr)
        nr++;
    return nr;
}

static int row_parts(int64_t n_pos, int64_t target) {
    return (int)((n_pos + target - 1) / target);
}

/* Cuts the batch into items.  Prefill rows go in blocks (see MAX_BLOCK);
 * a single row much longer than its share of the work (one long decode
 * row) is split into parts merged afterwards, the flash-decoding way.
 * Items are written to items (when not NULL); returns their count and
 * counts splits and parts. */
static int cut_items(const attn_job *j, int max_rows, int64_t target, attn_item *items,
                     attn_split *splits, int *n_splits, int *n_parts) {
    const pt_batch_view *b = j->b;
    int n = 0;
    *n_splits = *n_parts = 0;
    for (int t = 0, nr; t < b->n_tokens; t += nr) {
        nr = block_rows(b, t, max_rows);
        int n_pos = b->pos[t] + 1, parts = nr == 1 ? row_parts(n_pos, target) : 1;
        if (parts > 1 && splits) splits[*n_splits] = (attn_split){t, *n_parts, parts};
        *n_splits += parts > 1;
        for (int c = 0; c < parts; c++, n++)
            if (items)
                items[n] = (attn_item){t, nr, (int32_t)((int64_t)n_pos * c / parts),
                                       (int32_t)((int64_t)n_pos * (c + 1) / parts),
                                       parts > 1 ? *n_parts + c : -1};
        *n_parts += parts > 1 ? parts : 0;
    }
    return n;
}

static void plan_items(int n_threads, attn_job *j) {
    const pt_batch_view *b = j->b;
    int max_rows = j->max_rows;
    int64_t total = 0;
    for (int t = 0; t < b->n_tokens; t++)
        total += b->pos[t] + 1;
    int64_t target =
        n_threads == 1 ? INT32_MAX : PT_MAX(MIN_PART, total / (ITEMS_PER_THREAD * n_threads) + 1);
    int n_splits, n_parts,
        n_items = cut_items(j, max_rows, target, NULL, NULL, &n_splits, &n_parts);
    attn_item *items =
        pt_cpu_grow(&meta_buf, &meta_cap,
             (size_t)n_items * sizeof(attn_item) + (size_t)n_splits * sizeof(attn_split));
    attn_split *splits = (attn_split *)(items + n_items);
    cut_items(j, max_rows, target, items, splits, &n_splits, &n_parts);
    j->items = items, j->n_items = n_items;
    j->splits = splits, j->n_splits = n_splits;
    size_t part_bytes = (size_t)n_parts * j->n_heads * (j->kv->head_dim + 2) * sizeof(float);
    j->parts = n_parts ? pt_cpu_grow(&parts_buf, &parts_cap, part_bytes) : NULL;
}

void pt_cpu_kvq_attention(pt_backend *be, float *out, const float *q, const pt_kv_view *kv,
                          const pt_batch_view *b, int n_heads, float scale) {
    pt_cpu_backend *cb = pt_cpu(be);
    const pt_kv_codec *c = checked_codec(kv, "attention");
    if (n_heads <= 0 || n_heads % kv->n_kv_heads)
        pt_cpu_die("attention: %d query heads do not group over %d kv heads", n_heads,
                   kv->n_kv_heads);
    pt_cpu_check_rows("attention", kv, b);
    if (b->n_tokens <= 0) return;
    const pt_kvq_kernels *qk = pt_kvq_kernels_avx2();
    if (!qk || !cb->quant.avx2) qk = pt_kvq_kernels_portable(); /* the avx2 and avx512 sets */
    int max_rows = PT_MAX(1, PT_MIN(MAX_BLOCK, BLOCK_HEADS / n_heads));
    if (pt_cpu_scratch_reserve(cb, state_floats(max_rows * n_heads, kv->head_dim), "attention"))
        return;
    attn_job j = {
        .k = cb->k,
        .qk = qk,
        .c = c,
        .kv = kv,
        .b = b,
        .out = out,
        .q = q,
        .n_heads = n_heads,
        .group = n_heads / kv->n_kv_heads,
        .max_rows = max_rows,
        .scale = scale,
        .scratch = cb->scratch,
    };
    atomic_init(&j.next, 0);
    plan_items(be->n_threads, &j);
    double work = 0;
    for (int t = 0; t < b->n_tokens; t++)
        work += (double)(b->pos[t] + 1) * n_heads * kv->head_dim * 2;
    pt_cpu_run(cb, attn_task, &j, work);
    if (j.n_splits) pt_cpu_run(cb, merge_task, &j, (double)j.n_splits * n_heads * kv->head_dim * 4);
}
