/*
 * tp.c - tensor parallel: a loaded model split over N ranks, Megatron's
 * way, and the forward that runs the ranks together (docs/tensor-parallel.md).
 *
 * Per layer, each rank holds:
 *   q, k, v   column-parallel: its n_heads / N query heads and their KV
 *             heads (rows of Wq, Wk, Wv: views).  With N > n_kv_heads a KV
 *             head goes to N / n_kv_heads ranks (replicated), so every rank
 *             still holds exactly the one its query heads read.
 *   o         row-parallel: the columns of Wo its heads feed (a copy), so
 *             its output is a partial sum: all_reduce, then Wo's bias.
 *   gate, up  column-parallel: ffn_dim / N intermediate rows (views).
 *   down      row-parallel: the matching columns (a copy); all_reduce.
 *   experts   expert parallel when N divides n_experts: rank r holds
 *             experts [r E/N, (r+1) E/N) whole (views of the stacks).  The
 *             router is whole on every rank, so every rank picks the same
 *             experts with the same weights; moe_local keeps the slots of
 *             its own experts (others weigh 0), and the combined partial
 *             outputs are summed by one all_reduce, as the dense FFN's.
 *             Otherwise each expert's intermediate rows split as the dense
 *             FFN's (each rank 1/N of every expert: copies).
 *   norms     whole on every rank (the residual stream x is replicated).
 * The embedding table is whole on every rank (a view); the output head is
 * split by vocabulary rows (a view), and each rank writes its columns of
 * the logits straight into the caller's buffer: no collective.
 *
 * Views are plain pt_weights pointing into the front model's weights
 * (host memory, the mapped file); copies are the rank's own, made once
 * here.  The front keeps the file's layout (keep_layout: a repacked matrix
 * cannot be sliced by columns).
 *
 * The KV cache of a split model (pt_tp_kv_config) has N x n_layers layers
 * of n_kv_heads / N heads (or 1): rank r's layer l is layer r * n_layers +
 * l.  One pool of page ids and one block table per sequence serve every
 * rank, and everything that copies, spills or counts pages (copy on write,
 * the disk tier, budgets) sees every rank's layers without knowing.
 *
 * The forward: for each chunk of rows, the front uploads every rank's
 * batch, then each rank runs the family's forward on a thread of its own
 * (rank 0 on the caller's), the ranks meeting at each all_reduce.  A
 * forward of N ranks computes the same function as the unsplit one; only
 * the order of the additions inside the row-parallel matmuls differs
 * (tests/model/test_tensor_parallel.c: logits within 1e-4 of their range
 * for float weights, greedy tokens identical).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "backend/comm.h"
#include "model/model_int.h"

/* One rank's forward of one chunk, on its thread. */
typedef struct rank_job {
    pt_model *m;
    const pt_step *s;
} rank_job;

struct pt_tp {
    int n;
    bool ep; /* MoE layers expert parallel (else each expert sliced) */
    pt_comm *comm;
    pt_backend **be; /* [n] the ranks' backends (owned) */
    pt_model **rank; /* [n] */
    int kv_heads;    /* KV heads each rank holds */
    /* one chunk's per-rank state, kept so that a step allocates nothing */
    pt_kv_cache *kv;      /* [n] each rank's view of the cache */
    pt_batch_view *views; /* [2n] */
    pt_step *steps;       /* [n] */
    rank_job *jobs;       /* [n] */
    pthread_t *threads;   /* [n] (0 unused: rank 0 runs on the caller's) */
};

/* Families whose layers are the shared attention and FFN blocks
 * (blocks.c), which is where the all_reduce calls are: the pre-norm layer
 * (llama, qwen3moe), and Gemma 2/3's, whose norms after each block read
 * the summed output. */
static const char *const tp_families[] = {"llama", "qwen3moe", "gemma"};

int pt_model_tp_ranks(const pt_model *m) {
    return m->tp ? m->tp->n : PT_MAX(m->n_ranks, 1);
}

void pt_model_attach_comm(pt_model *m, pt_comm *c, int rank, bool owned) {
    m->comm = c;
    m->rank = rank;
    m->n_ranks = pt_comm_size(c);
    m->comm_owned = owned;
}

/* ---- What splits ------------------------------------------------------------- */

/* Bytes of the first n columns of one row of w (n on a block boundary). */
static size_t col_bytes(const pt_weight *w, int64_t n) {
    if (w->dtype == PT_AFFINE) return (size_t)n * (size_t)w->bits / 8;
    return pt_dtype_bytes(w->dtype, (uint64_t)n);
}

/* Whether columns split at multiples of n fall on w's block boundaries. */
static bool cols_split(const pt_weight *w, int64_t n) {
    if (w->dtype == PT_AFFINE) return n % w->group_size == 0 && n * w->bits % 32 == 0;
    return n % pt_dtype_get(w->dtype)->block == 0;
}

static int split_fail(pt_err *err, int n, const char *what, int64_t count) {
    return pt_fail(err, "--tensor-parallel %d: %s (%lld) do not split evenly over %d ranks", n,
                   what, (long long)count, n);
}

/* Refuses what the split cannot run, with the reason, before any copy. */
static int check_split(const pt_model *m, int n, pt_err *err) {
    const pt_model_config *c = &m->cfg;
    bool known = false;
    for (size_t i = 0; i < PT_ARRAY_LEN(tp_families); i++)
        known |= strcmp(m->family->name, tp_families[i]) == 0;
    if (!known)
        return pt_fail(err,
                       "--tensor-parallel %d: the %s family (%s) is not split yet; the llama "
                       "(llama, mistral, qwen2, qwen3), qwen3moe and gemma (gemma2, "
                       "gemma3_text) families are",
                       n, m->family->name, c->arch);
    if (!m->be->host_memory)
        return pt_fail(err, "--tensor-parallel %d: splitting runs on the cpu backend only so far",
                       n);
    if ((int64_t)n * c->n_layers > 64 * 16)
        return pt_fail(err,
                       "--tensor-parallel %d: %d layers x %d ranks is more than the KV "
                       "cache's 1024 layers",
                       n, c->n_layers, n);
    if (c->n_heads % n) return split_fail(err, n, "attention heads", c->n_heads);
    if (n <= c->n_kv_heads ? c->n_kv_heads % n : n % c->n_kv_heads)
        return pt_fail(err,
                       "--tensor-parallel %d: %d KV heads neither split evenly over %d ranks "
                       "nor replicate evenly onto them (N must divide n_kv_heads or be a "
                       "multiple of it)",
                       n, c->n_kv_heads, n);
    if (c->expert_bias)
        return pt_fail(err, "--tensor-parallel %d: biased experts are not split yet", n);
    for (int l = 0; l < c->n_layers; l++) {
        const pt_layer_plan *p = &m->plan[l];
        const pt_layer *L = &m->layers[l];
        if (p->n_kv_heads != c->n_kv_heads || p->head_dim != c->head_dim || p->kv_layer != l)
            return pt_fail(err, "--tensor-parallel %d: layers of other shapes are not split yet",
                           n);
        if (!cols_split(&L->wo, (int64_t)c->n_heads / n * p->head_dim))
            return pt_fail(err,
                           "--tensor-parallel %d: the o projection's %s blocks do not split "
                           "at %d heads",
                           n, pt_dtype_name(L->wo.dtype), c->n_heads / n);
        if (L->wo.layout != PT_LAYOUT_FILE)
            return pt_fail(err, "--tensor-parallel %d: repacked weights cannot be split", n);
        if (p->ffn == PT_FFN_MOE && c->n_experts % n == 0) continue; /* whole experts each */
        int64_t f = p->ffn == PT_FFN_MOE ? c->expert_ffn_dim : p->ffn_dim;
        if (f % n) return split_fail(err, n, "FFN intermediate rows", f);
        if (!cols_split(&L->w_down, f / n))
            return pt_fail(err,
                           "--tensor-parallel %d: the down projection's %s blocks do not "
                           "split at %lld columns",
                           n, pt_dtype_name(L->w_down.dtype), (long long)(f / n));
        if (L->w_down.layout != PT_LAYOUT_FILE)
            return pt_fail(err, "--tensor-parallel %d: repacked weights cannot be split", n);
    }
    return 0;
}

/* ---- Placing a rank's weights ------------------------------------------------ */

/* A vector of the front model as rank memory: the same floats, since the
 * ranks and the front share host memory (check_split).  A rank on a GPU
 * will upload its copy here. */
static const float *place(const float *src) {
    return src;
}

/* Rows [first, first + rows) of the plain matrix w: a view. */
static pt_weight rows_view(const pt_weight *w, int64_t first, int64_t rows) {
    pt_weight v = *w;
    size_t rb = col_bytes(w, w->cols);
    v.data = (const char *)w->data + (size_t)first * rb;
    v.rows = rows;
    v.nbytes = (size_t)rows * rb;
    if (w->dtype == PT_AFFINE) { /* scales and biases [rows][cols / group] */
        size_t sb = (size_t)(w->cols / w->group_size) * (w->scale_dtype == PT_F32 ? 4 : 2);
        v.scales = (const char *)w->scales + (size_t)first * sb;
        v.biases = (const char *)w->biases + (size_t)first * sb;
        v.nbytes += 2 * (size_t)rows * sb;
    }
    return v;
}

/* Experts [first, first + count) of the stack w: a view (a stack keeps
 * each expert's codes, and its scales and biases, in one run). */
static pt_weight experts_view(const pt_weight *w, int first, int count) {
    pt_weight v = *w;
    v.data = (const char *)w->data + (size_t)first * w->expert_stride;
    v.n_experts = count;
    v.nbytes = (size_t)count * w->expert_stride;
    if (w->dtype == PT_AFFINE) {
        size_t sb = (size_t)w->rows * (size_t)(w->cols / w->group_size) *
                    (w->scale_dtype == PT_F32 ? 4 : 2); /* one expert's scales */
        v.scales = (const char *)w->scales + (size_t)first * sb;
        v.biases = (const char *)w->biases + (size_t)first * sb;
        v.nbytes += 2 * (size_t)count * sb;
    }
    return v;
}

/* Rows [r0, r0 + nr) and columns [c0, c0 + nc) of w (of every expert of
 * a stack) as a new contiguous weight in rm's memory: a column slice is
 * strided in the file, and a stack's slice needs its own expert stride. */
static int copy_slice(pt_model *rm, const pt_weight *w, int64_t r0, int64_t nr, int64_t c0,
                      int64_t nc, pt_weight *out, pt_err *err) {
    int E = PT_MAX(w->n_experts, 1);
    bool aff = w->dtype == PT_AFFINE;
    size_t src_rb = col_bytes(w, w->cols), rb = col_bytes(w, nc), off = col_bytes(w, c0);
    size_t sb = aff ? (w->scale_dtype == PT_F32 ? 4 : 2) : 0; /* bytes of a scale */
    size_t src_g = aff ? (size_t)(w->cols / w->group_size) : 0,
           g = aff ? (size_t)(nc / w->group_size) : 0;
    size_t g0 = aff ? (size_t)(c0 / w->group_size) : 0;
    size_t data_e = (size_t)nr * rb, scales_e = (size_t)nr * g * sb; /* per expert */
    size_t total = (size_t)E * (data_e + 2 * scales_e);
    char *host = pt_alloc_big(total);
    if (!host)
        return pt_fail(err, "cannot allocate %.1f MiB for a rank's weight", total / 1048576.0);
    char *hs = host + (size_t)E * data_e, *hb = hs + (size_t)E * scales_e;
    for (int e = 0; e < E; e++) {
        const char *src = (const char *)w->data + (size_t)e * w->expert_stride;
        for (int64_t r = 0; r < nr; r++)
            memcpy(host + e * data_e + (size_t)r * rb, src + (size_t)(r0 + r) * src_rb + off, rb);
        for (int64_t r = 0; aff && r < nr; r++) {
            size_t from = ((size_t)e * (size_t)w->rows + (size_t)(r0 + r)) * src_g + g0;
            memcpy(hs + e * scales_e + (size_t)r * g * sb, (const char *)w->scales + from * sb,
                   g * sb);
            memcpy(hb + e * scales_e + (size_t)r * g * sb, (const char *)w->biases + from * sb,
                   g * sb);
        }
    }
    char *dst = pt_model_alloc(rm, total);
    if (dst) rm->be->ops->upload(rm->be, dst, host, total);
    pt_free_big(host, total);
    if (!dst) return pt_fail(err, "out of memory for a rank's weights");
    *out = *w;
    out->rows = nr, out->cols = nc;
    out->data = dst;
    out->expert_stride = w->n_experts ? data_e : 0;
    out->nbytes = total;
    if (aff)
        out->scales = dst + (size_t)E * data_e, out->biases = dst + (size_t)E * (data_e + scales_e);
    return 0;
}

/* The first KV head rank r holds: its own block of them, or (replicated)
 * the one its query heads read. */
static int kv_first(int n_kv, int n, int r) {
    return n <= n_kv ? r * (n_kv / n) : r / (n / n_kv);
}

static int shard_layer(const pt_tp *tp, const pt_model *m, pt_model *rm, int r, int l,
                       pt_err *err) {
    const pt_model_config *c = &m->cfg;
    const pt_layer *L = &m->layers[l];
    const pt_layer_plan *p = &m->plan[l];
    pt_layer *R = &rm->layers[l];
    int n = tp->n, hd = p->head_dim, q = c->n_heads / n * hd, kv = tp->kv_heads * hd;
    int q0 = r * q, kv0 = kv_first(c->n_kv_heads, n, r) * hd;

    R->attn_norm = place(L->attn_norm);
    R->ffn_norm = place(L->ffn_norm);
    R->q_norm = place(L->q_norm);
    R->k_norm = place(L->k_norm);
    R->post_attn_norm = place(L->post_attn_norm); /* Gemma's, after each block */
    R->post_ffn_norm = place(L->post_ffn_norm);
    R->wq = rows_view(&L->wq, q0, q);
    R->wk = rows_view(&L->wk, kv0, kv);
    R->wv = rows_view(&L->wv, kv0, kv);
    R->bq = L->bq ? place(L->bq + q0) : NULL;
    R->bk = L->bk ? place(L->bk + kv0) : NULL;
    R->bv = L->bv ? place(L->bv + kv0) : NULL;
    R->bo = place(L->bo); /* added once, after the sum */
    if (copy_slice(rm, &L->wo, 0, L->wo.rows, q0, q, &R->wo, err)) return -1;
    if (p->ffn == PT_FFN_MOE && tp->ep) {
        int e = c->n_experts / n;
        R->w_router = L->w_router; /* whole: every rank routes alike */
        R->w_gate = experts_view(&L->w_gate, r * e, e);
        R->w_up = experts_view(&L->w_up, r * e, e);
        R->w_down = experts_view(&L->w_down, r * e, e);
    } else if (p->ffn == PT_FFN_MOE) {
        int64_t f = c->expert_ffn_dim / n;
        R->w_router = L->w_router;
        if (copy_slice(rm, &L->w_gate, r * f, f, 0, L->w_gate.cols, &R->w_gate, err) ||
            copy_slice(rm, &L->w_up, r * f, f, 0, L->w_up.cols, &R->w_up, err) ||
            copy_slice(rm, &L->w_down, 0, L->w_down.rows, r * f, f, &R->w_down, err))
            return -1;
    } else {
        int64_t f = p->ffn_dim / n;
        R->w_gate = rows_view(&L->w_gate, r * f, f);
        R->w_up = rows_view(&L->w_up, r * f, f);
        if (copy_slice(rm, &L->w_down, 0, L->w_down.rows, r * f, f, &R->w_down, err)) return -1;
    }
    return 0;
}

/* Rank r of the split: its config and plan (its share of the heads and
 * FFN rows), its weights, its workspace. */
static int make_rank(pt_tp *tp, const pt_model *m, int r, pt_err *err) {
    const pt_model_config *c = &m->cfg;
    int n = tp->n;
    pt_model *rm = pt_xcalloc(1, sizeof *rm);
    tp->rank[r] = rm;
    rm->cfg = *c;
    rm->cfg.n_heads = c->n_heads / n;
    rm->cfg.n_kv_heads = tp->kv_heads;
    rm->cfg.ffn_dim = c->ffn_dim / n;
    rm->cfg.expert_ffn_dim = tp->ep ? c->expert_ffn_dim : c->expert_ffn_dim / n;
    if (tp->ep) rm->expert_first = r * (c->n_experts / n), rm->expert_count = c->n_experts / n;
    rm->family = m->family;
    rm->be = tp->be[r];
    rm->max_batch = m->max_batch;
    pt_model_attach_comm(rm, tp->comm, r, false);
    rm->plan = pt_xcalloc((size_t)c->n_layers, sizeof *rm->plan);
    rm->layers = pt_xcalloc((size_t)c->n_layers, sizeof *rm->layers);
    for (int l = 0; l < c->n_layers; l++) {
        pt_layer_plan *p = &rm->plan[l];
        *p = m->plan[l];
        p->n_kv_heads = tp->kv_heads;
        p->ffn_dim = m->plan[l].ffn_dim / n;
        p->rope.inv_freq = place(p->rope.inv_freq);
        if (shard_layer(tp, m, rm, r, l, err)) return -1;
    }
    int64_t v0 = (int64_t)c->vocab_size * r / n, v1 = (int64_t)c->vocab_size * (r + 1) / n;
    rm->tok_embd = m->tok_embd;
    rm->output = rows_view(&m->output, v0, v1 - v0);
    rm->vocab_first = (int)v0;
    rm->output_norm = place(m->output_norm);
    return pt_model_workspace_init(rm, rm->max_batch, err);
}

void pt_tp_free(pt_tp *tp) {
    if (!tp) return;
    for (int r = 0; r < tp->n; r++) {
        if (tp->rank[r]) pt_model_free(tp->rank[r]);
        if (tp->be[r]) tp->be[r]->ops->destroy(tp->be[r]);
    }
    pt_comm_free(tp->comm);
    free(tp->rank);
    free(tp->be);
    free(tp->kv);
    free(tp->views);
    free(tp->steps);
    free(tp->jobs);
    free(tp->threads);
    free(tp);
}

int pt_model_split(pt_model *m, int n, const char *kernels, pt_err *err) {
    if (check_split(m, n, err)) return -1;
    pt_tp *tp = pt_xcalloc(1, sizeof *tp);
    tp->n = n;
    tp->kv_heads = n <= m->cfg.n_kv_heads ? m->cfg.n_kv_heads / n : 1;
    tp->ep = m->cfg.n_experts > 0 && m->cfg.n_experts % n == 0;
    tp->comm = pt_comm_host_new(n);
    tp->be = pt_xcalloc((size_t)n, sizeof *tp->be);
    tp->rank = pt_xcalloc((size_t)n, sizeof *tp->rank);
    tp->kv = pt_xcalloc((size_t)n, sizeof *tp->kv);
    tp->views = pt_xcalloc(2 * (size_t)n, sizeof *tp->views);
    tp->steps = pt_xcalloc((size_t)n, sizeof *tp->steps);
    tp->jobs = pt_xcalloc((size_t)n, sizeof *tp->jobs);
    tp->threads = pt_xcalloc((size_t)n, sizeof *tp->threads);
    int threads = PT_MAX(1, m->be->n_threads / n);
    for (int r = 0; r < n; r++)
        if (!(tp->be[r] = pt_backend_cpu_new(threads, kernels ? kernels : "auto", err)) ||
            make_rank(tp, m, r, err)) {
            pt_tp_free(tp);
            return -1;
        }
    m->tp = tp;
    const pt_model_config *c = &m->cfg;
    if (tp->ep)
        pt_log(PT_LOG_INFO, "tensor parallel: %d ranks of %d heads, %d KV heads, %d whole experts",
               n, c->n_heads / n, tp->kv_heads, c->n_experts / n);
    else
        pt_log(PT_LOG_INFO, "tensor parallel: %d ranks of %d heads, %d KV heads, %d FFN rows%s", n,
               c->n_heads / n, tp->kv_heads, (c->n_experts ? c->expert_ffn_dim : c->ffn_dim) / n,
               c->n_experts ? " of each expert" : "");
    return 0;
}

/* ---- The KV cache ------------------------------------------------------------- */

void pt_tp_kv_config(const pt_model *m, pt_kv_config *kc) {
    const pt_tp *tp = m->tp;
    int L = kc->n_layers, n = tp->n;
    kc->n_layers = L * n;
    kc->n_kv_heads = tp->kv_heads;
    if (kc->window_n_kv_heads > 0) kc->window_n_kv_heads = tp->kv_heads;
    uint64_t win[16];
    memcpy(win, kc->window_layers, sizeof win);
    for (int r = 1; r < n; r++)
        for (int l = 0; l < L; l++)
            if (win[l / 64] >> (l % 64) & 1) {
                int v = r * L + l;
                kc->window_layers[v / 64] |= 1ull << (v % 64);
            }
}

/* Rank r's cache: its n_layers layers of the cache's n x n_layers. */
static pt_kv_cache *rank_kv(pt_tp *tp, const pt_kv_cache *kv, int r) {
    pt_kv_cache *v = &tp->kv[r];
    int L = kv->cfg.n_layers / tp->n;
    *v = *kv;
    v->k = kv->k + (size_t)r * L;
    v->v = kv->v + (size_t)r * L;
    v->cfg.n_layers = L;
    return v;
}

/* ---- The forward -------------------------------------------------------------- */

static void *rank_main(void *arg) {
    rank_job *j = arg;
    j->m->family->forward(j->m, j->s);
    return NULL;
}

int pt_tp_forward(pt_model *m, pt_kv_cache *kv, const pt_batch *b, float *logits, pt_err *err) {
    pt_tp *tp = m->tp;
    int n = tp->n;
    for (int first = 0; first < b->n_tokens; first += m->max_batch) {
        int rows = PT_MIN(m->max_batch, b->n_tokens - first), n_out = 0;
        for (int r = 0; r < n; r++) {
            pt_kv_cache *kr = rank_kv(tp, kv, r);
            pt_batch_view *v = &tp->views[2 * r];
            if (pt_model_upload_batch(tp->rank[r], kr, b, first, rows, v, &n_out, err)) return -1;
            tp->steps[r] = (pt_step){
                .kv = kr, .b = &v[0], .bw = &v[1], .n = rows, .n_out = n_out, .logits = logits};
        }
        /* every rank runs the whole forward; they meet at each all_reduce */
        rank_job jobs[n];
        pthread_t th[n];
        for (int r = 0; r < n; r++)
            jobs[r] = (rank_job){tp->rank[r], &tp->steps[r]};
        for (int r = 1; r < n; r++)
            if (pthread_create(&th[r], NULL, rank_main, &jobs[r]) != 0) {
                fprintf(stderr, "petrel: cannot start a tensor-parallel rank thread\n");
                abort(); /* the started ranks would wait for it at their first sum */
            }
        rank_main(&jobs[0]);
        for (int r = 1; r < n; r++)
            pthread_join(th[r], NULL);
        if (n_out) logits += (size_t)n_out * m->cfg.vocab_size;
    }
    int rc = 0;
    for (int r = 0; r < n; r++) {
        pt_backend *be = tp->rank[r]->be;
        pt_err other = {{0}};
        if (be->ops->sync(be)) rc = pt_be_take_error(be, rc ? &other : err);
    }
    return rc;
}
