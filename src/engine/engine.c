/*
 * engine.c - opening a model for generation, and the single-sequence loop.
 */
#include "engine/engine.h"

#include "backend/comm.h"
#include "engine/core.h"
#include "engine/runner.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/statvfs.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>

pt_dtype pt_parse_kv_dtype(const char *s) {
    if (strcmp(s, "f32") == 0) return PT_F32;
    if (strcmp(s, "f16") == 0) return PT_F16;
    if (strcmp(s, "bf16") == 0) return PT_BF16;
    return (pt_dtype)-1;
}

int pt_parse_budget(const char *s, size_t free_bytes, size_t *out, pt_err *err) {
    char *end;
    double v = strtod(s, &end);
    double mult = 1;
    if (*end == '%') {
        if (!(v > 0 && v <= 100) || end[1])
            return pt_fail(err, "--kv-budget %s: a percentage must be in (0, 100]", s);
        if (!free_bytes) return pt_fail(err, "--kv-budget %s: free memory is unknown here", s);
        *out = (size_t)(v / 100 * (double)free_bytes);
        return 0;
    }
    switch (*end) {
    case 'k': case 'K': mult = 1024.0, end++; break;
    case 'm': case 'M': mult = 1048576.0, end++; break;
    case 'g': case 'G': mult = 1073741824.0, end++; break;
    case 't': case 'T': mult = 1099511627776.0, end++; break;
    }
    if (*end == 'i' || *end == 'B') end += *end == 'i' && end[1] == 'B' ? 2 : 1;
    if (end == s || *end || !(v > 0) || v * mult > 1e15)
        return pt_fail(err, "--kv-budget %s: expected a size like 6G, 512M, 1.5G or a "
                            "percentage like 80%%", s);
    *out = (size_t)(v * mult);
    return 0;
}

/* Positions the --kv-budget buys in the engine's KV format.  A model with
 * a window group sized for max_seqs sequences pays for their windows
 * first; each position then costs its full-attention layers only. */
static int budget_positions(pt_engine *e, const char *budget, int *positions, pt_err *err) {
    pt_kv_cache probe;
    if (pt_model_kv_init_seqs(e->model, &probe, 1, e->max_seqs, e->kv_slack, e->kv_dtype,
                              &e->kv_quant, err))
        return -1;
    size_t per_token = pt_kv_bytes_per_token(&probe.cfg), fixed = 0;
    int page = probe.cfg.page_size;
    if (probe.grouped && e->max_seqs > 0) {
        size_t win = pt_kv_window_bytes_per_token(&probe);
        per_token -= win;
        fixed = win * (size_t)page * (size_t)e->max_seqs *
                (size_t)pt_kv_window_pages_per_seq(&probe.cfg);
    }
    pt_kv_cache_free(&probe);
    size_t free_b = e->be->ops->free_memory ? e->be->ops->free_memory(e->be) : pt_mem_available();
    size_t bytes;
    if (pt_parse_budget(budget, free_b, &bytes, err)) return -1;
    bytes = bytes > fixed ? bytes - fixed : 0;
    size_t pages = bytes / (per_token * (size_t)page);
    if (pages < 1)
        return pt_fail(err, "--kv-budget %s holds no KV page (one is %zu bytes)", budget,
                       per_token * (size_t)page);
    if (pages > (1u << 28)) pages = 1u << 28;
    *positions = (int)pages * page;
    if (*positions < e->n_ctx)
        pt_warn("--kv-budget %s holds %d positions, fewer than the context of %d: a request "
                "ends (finish_reason length) when it needs more", budget, *positions, e->n_ctx);
    return 0;
}

int pt_engine_kv_init(pt_engine *e, int n_positions, pt_err *err) {
    if (e->kv.k) {
        pt_kv_flush_to_disk(&e->kv); /* what the old pool cached stays reusable */
        pt_kv_cache_free(&e->kv);
    }
    if (pt_model_kv_init_seqs(e->model, &e->kv, n_positions, e->max_seqs, e->kv_slack,
                              e->kv_dtype, &e->kv_quant, err))
        return -1;
    /* a hybrid model's prefix cache reuses pages that end in a state
     * snapshot (kvcache.h) */
    if (e->prefix_cache && pt_kv_snaps_init(&e->kv, PT_ENGINE_STATE_SNAPS, err)) return -1;
    pt_kv_attach_disk(&e->kv, e->disk);
    return 0;
}

/* --kv-disk: opens the directory for pages of this engine's salt. */
static int open_disk(pt_engine *e, const pt_engine_opts *o, pt_err *err) {
    if (!e->prefix_cache)
        return pt_fail(err, "--kv-disk keeps the prefix cache's pages: it needs --prefix-cache on");
    if (e->kv.n_snaps) /* disk pages would come back without their states */
        return pt_fail(err, "--kv-disk with a hybrid recurrent model (its recurrent states are "
                            "not kept on disk) is not implemented yet");
    if (e->kv.grouped) /* disk pages hold group 0's layers only (kvcache.h) */
        return pt_fail(err, "--kv-disk with a sliding-window model (its window layers keep "
                            "their own pages) is not implemented yet");
    struct statvfs vfs;
    int64_t cap = (int64_t)8 << 30;
    if (statvfs(o->kv_disk, &vfs) == 0)
        cap = PT_MIN(cap, (int64_t)((double)vfs.f_bavail * vfs.f_frsize / 2));
    if (o->kv_disk_size) {
        size_t bytes;
        if (pt_parse_budget(o->kv_disk_size, 0, &bytes, err))
            return pt_failp(err, "--kv-disk-size");
        cap = (int64_t)bytes;
    }
    if (pt_disk_open(&e->disk, o->kv_disk, cap, e->cache_salt, pt_kv_page_bytes(&e->kv),
                     e->kv.cfg.page_size, err))
        return -1;
    pt_kv_attach_disk(&e->kv, e->disk);
    pt_disk_stats st = pt_disk_get_stats(e->disk);
    /* a crash or a damaged disk left files behind: worth a warning */
    pt_log(st.n_partial || st.n_corrupt ? PT_LOG_WARN : PT_LOG_INFO,"--kv-disk %s: %lld reusable pages (%.1f MiB, cap %.1f MiB); removed %lld "
            "interrupted and %lld damaged files; left %lld of other models or formats",
            o->kv_disk, (long long)st.n_files, st.bytes / 1048576.0, cap / 1048576.0,
            (long long)st.n_partial, (long long)st.n_corrupt, (long long)st.n_other);
    return 0;
}

uint64_t pt_engine_cache_salt(const pt_engine *e, const char *dummy_dtype, uint64_t dummy_seed) {
    XXH3_state_t st;
    XXH3_64bits_reset(&st);
    const pt_model_config *c = &e->model->cfg;
    XXH3_64bits_update(&st, c, sizeof *c); /* zero-initialized: padding is stable */
    const pt_model_file *mf = e->model->file;
    if (!mf) {
        XXH3_64bits_update(&st, dummy_dtype, strlen(dummy_dtype));
        XXH3_64bits_update(&st, &dummy_seed, sizeof dummy_seed);
    }
    for (int i = 0; mf && i < mf->n_tensors; i++) {
        const pt_tensor_info *t = &mf->tensors[i];
        XXH3_64bits_update(&st, t->name, strlen(t->name));
        XXH3_64bits_update(&st, &t->dtype, sizeof t->dtype);
        XXH3_64bits_update(&st, t->shape, sizeof t->shape);
        /* a few bytes from each end of every tensor tell checkpoints apart
         * without reading gigabytes */
        size_t k = PT_MIN(t->nbytes, (size_t)64);
        XXH3_64bits_update(&st, t->data, k);
        XXH3_64bits_update(&st, (const char *)t->data + t->nbytes - k, k);
    }
    int ranks = pt_model_tp_ranks(e->model); /* a split model's pages hold its ranks' layers */
    if (ranks > 1) XXH3_64bits_update(&st, &ranks, sizeof ranks);
    char fmt[64];
    pt_kv_format_name(&e->kv.cfg, fmt, sizeof fmt);
    XXH3_64bits_update(&st, fmt, strlen(fmt));
    XXH3_64bits_update(&st, &e->kv.cfg.page_size, sizeof e->kv.cfg.page_size);
    return XXH3_64bits_digest(&st);
}

/* What --tensor-parallel N asks of the device, checked before any load. */
static int check_tensor_parallel(const pt_engine_opts *o, pt_err *err) {
    int n = o->tensor_parallel;
    if (n < 0 || n > 64) return pt_fail(err, "--tensor-parallel %d: expected 1..64 ranks", n);
    if (n <= 1 || !pt_backend_is_cuda(o->device)) return 0;
    int found = pt_backend_cuda_devices();
    if (found < n)
        return pt_fail(err, "--tensor-parallel %d on cuda needs %d CUDA devices, found %d", n, n,
                       found);
    return pt_fail(err, "--tensor-parallel %d on cuda: the multi-GPU forward is not implemented "
                        "yet (docs/tensor-parallel.md); --device cpu runs the split model's "
                        "reference forward", n);
}

/* --tensor-parallel 1 on cuda: the model is the one rank of an NCCL
 * communicator, so the forward runs the all_reduce ops (a sum over one
 * rank) the way each GPU of a split model will. */
static int attach_one_rank(pt_engine *e, const pt_engine_opts *o, pt_err *err) {
    int device = strcmp(o->device, "cuda") == 0 ? 0 : atoi(o->device + 5);
    pt_comm *c;
    if (pt_comm_nccl_new(&c, &device, 1, err)) return -1;
    pt_model_attach_comm(e->model, c, 0, true);
    return pt_model_check_ops(e->model, err);
}

int pt_engine_open(pt_engine **out, const pt_engine_opts *o, pt_err *err) {
    *out = NULL;
    if (check_tensor_parallel(o, err)) return -1;
    double t0 = pt_now();
    pt_engine *e = pt_xcalloc(1, sizeof *e);
    e->be = pt_backend_open(o->device, o->n_threads, o->kernels, err);
    if (!e->be) {
        free(e);
        return -1;
    }
    pt_model_opts mo = {.backend = e->be,
                        .max_batch = o->max_batch,
                        .dummy_dtype = o->dummy_dtype,
                        .dummy_seed = o->dummy_seed,
                        .tensor_parallel = e->be->host_memory ? o->tensor_parallel : 0,
                        .kernels = o->kernels};
    if (pt_model_load(&e->model, o->model_path, &mo, err)) goto fail;
    if (o->tensor_parallel == 1 && pt_backend_is_cuda(o->device) && attach_one_rank(e, o, err))
        goto fail;
    if (e->model->file && !o->no_tokenizer && pt_tokenizer_load(&e->tok, e->model->file, err))
        goto fail;
    if (e->tok && pt_tokenizer_n_vocab(e->tok) > e->model->cfg.vocab_size)
        pt_warn("tokenizer has %d tokens, model only %d", pt_tokenizer_n_vocab(e->tok),
                e->model->cfg.vocab_size);
    e->n_ctx = o->n_ctx > 0 ? o->n_ctx : PT_MIN(e->model->cfg.max_ctx, 4096);
    /* LongRoPE's rope table holds the short factors (registry.c); past the
     * original context llama.cpp and the Hub code use the long ones */
    const pt_model_config *mc = &e->model->cfg;
    if (mc->rope_scaling == PT_ROPE_SCALING_LONGROPE && e->n_ctx > mc->rope_orig_ctx) {
        pt_fail(err, "a context of %d is beyond this model's LongRoPE original context %d, "
                     "where its long rope factors would apply (not supported yet); use "
                     "--ctx %d or less",
                e->n_ctx, mc->rope_orig_ctx, mc->rope_orig_ctx);
        goto fail;
    }
    e->kv_dtype = o->kv_dtype;
    e->max_seqs = o->max_seqs;
    if (pt_kvq_parse(o->kv_quant, &e->kv_quant, err)) goto fail;
    e->prefix_cache = !o->no_prefix_cache;
    int positions = e->n_ctx;
    if (o->kv_budget && budget_positions(e, o->kv_budget, &positions, err)) goto fail;
    e->kv_budgeted = o->kv_budget != NULL;
    if (pt_engine_kv_init(e, positions, err)) goto fail;
    if (e->kv.n_snaps)
        pt_log(PT_LOG_INFO, "prefix cache: %d recurrent-state snapshots of %.1f MiB each",
               e->kv.n_snaps, (double)pt_kv_state_bytes(&e->kv.cfg) / 1048576.0);
    e->cache_salt = pt_engine_cache_salt(e, o->dummy_dtype ? o->dummy_dtype : "", o->dummy_seed);
    if (o->kv_disk && open_disk(e, o, err)) goto fail;
    e->runner = pt_xmalloc(sizeof *e->runner);
    pt_runner_init(e->runner, e);
    e->load_seconds = pt_now() - t0;
    *out = e;
    return 0;
fail:
    pt_engine_close(e);
    return -1;
}

void pt_engine_close(pt_engine *e) {
    if (!e) return;
    pt_engine_close(e->draft);
    if (e->kv.k) {
        pt_kv_flush_to_disk(&e->kv); /* the hot pages survive a restart too */
        pt_kv_cache_free(&e->kv);
    }
    pt_disk_close(e->disk);
    if (e->tok) pt_tokenizer_free(e->tok);
    if (e->model) pt_model_free(e->model);
    if (e->be) e->be->ops->destroy(e->be);
    if (e->runner) pt_runner_free(e->runner);
    free(e->runner);
    free(e);
}

void pt_seq_init(pt_seq *s, pt_engine *e, const pt_sampling *sp) {
    memset(s, 0, sizeof *s);
    s->sampler = pt_sampler_new(sp, e->model->cfg.vocab_size);
}

void pt_seq_free(pt_seq *s, pt_engine *e) {
    pt_kv_seq_release(&e->kv, &s->kv);
    pt_sampler_free(s->sampler);
    free(s->tokens);
    memset(s, 0, sizeof *s);
}

void pt_seq_push(pt_seq *s, int32_t id) {
    if (s->n_tokens == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 256;
        s->tokens = pt_xrealloc(s->tokens, sizeof(int32_t) * (size_t)s->cap);
    }
    s->tokens[s->n_tokens++] = id;
    pt_sampler_accept(s->sampler, id);
}

/* Runs tokens [kv.n_tokens, n_tokens) of one sequence, wanting the logits of
 * the last, and samples from them. */
static int run_tail(pt_engine *e, pt_seq *s, pt_sample_result *r, pt_err *err) {
    int n = s->n_tokens - s->kv.n_tokens, failed;
    if (n <= 0) return pt_fail(err, "nothing to run");
    if (s->n_tokens > e->n_ctx)
        return pt_fail(err, "context full: %d tokens, the context holds %d (raise --ctx)",
                       s->n_tokens, e->n_ctx);
    pt_run_item it = {s, n, 1};
    e->runner->want_ids = pt_sampler_is_argmax(s->sampler);
    if (pt_runner_run(e->runner, &it, 1, &failed, err)) return -1;
    if (e->runner->have_ids) /* the backend's argmax is the sampler's pick */
        *r = (pt_sample_result){.id = e->runner->ids[0]};
    else
        pt_sampler_sample(s->sampler, e->runner->logits, r);
    return 0;
}

int pt_seq_prefill(pt_engine *e, pt_seq *s, pt_sample_result *r, pt_err *err) {
    return run_tail(e, s, r, err);
}

int pt_seq_decode(pt_engine *e, pt_seq *s, pt_sample_result *r, pt_err *err) {
    return run_tail(e, s, r, err);
}

/* pt_generate on the core: detokenizes each token for the callback, and
 * turns end-of-generation into a stop itself so that the callback sees
 * that token too (it prints logprobs for it). */
typedef struct gen_run {
    pt_engine *e;
    const pt_gen_params *p;
    pt_token_cb cb;
    void *user;
    pt_detok dt;
    pt_sched_stats st;
    bool done, eog;
} gen_run;

static int gen_token(void *user, const pt_sample_result *r) {
    gen_run *g = user;
    const pt_tokenizer *tok = g->e->tok;
    char text[1024];
    g->eog = tok && !g->p->ignore_eos && r->id < pt_tokenizer_n_vocab(tok) &&
             pt_tokenizer_is_eog(tok, r->id);
    size_t len = 0;
    if (tok) len = g->eog ? pt_detok_flush(&g->dt, text, sizeof text)
                          : pt_detok_push(&g->dt, r->id, text, sizeof text);
    int stop = g->cb ? g->cb(g->user, r, text, len) : 0;
    return stop || g->eog;
}

static void gen_done(void *user, const pt_sched_stats *st) {
    gen_run *g = user;
    g->st = *st;
    g->done = true;
    if (st->finish == PT_FINISH_LENGTH && g->e->tok) {
        char text[1024];
        size_t len = pt_detok_flush(&g->dt, text, sizeof text);
        if (len && g->cb) g->cb(g->user, NULL, text, len);
    }
}

int pt_generate(pt_engine *e, const int32_t *prompt, int n_prompt, const pt_gen_params *p,
                pt_token_cb cb, void *user, pt_gen_stats *st, pt_err *err) {
    memset(st, 0, sizeof *st);
    gen_run g = {.e = e, .p = p, .cb = cb, .user = user};
    if (e->tok) pt_detok_init(&g.dt, e->tok);
    pt_core_opts co = {.max_seqs = 1};
    pt_core *c = pt_core_new(e, &co);
    pt_sched_job job = {.prompt = prompt,
                        .n_prompt = n_prompt,
                        .params = *p,
                        .on_token = gen_token,
                        .on_done = gen_done,
                        .user = &g,
                        .add_procs = p->add_procs,
                        .proc_arg = p->proc_arg};
    job.params.ignore_eos = true; /* gen_token stops at end of generation */
    job.params.max_tokens = PT_MAX(p->max_tokens, 1);
    if (pt_core_check(c, &job, err)) {
        pt_core_free(c);
        return -1;
    }
    pt_core_add(c, &job, 1);
    while (pt_core_step(c) > 0) {}
    pt_core_free(c);
    st->n_prompt = g.st.n_prompt;
    st->n_generated = g.st.n_generated;
    st->n_cached = g.st.n_cached;
    st->n_drafted = g.st.n_drafted;
    st->n_accepted = g.st.n_accepted;
    st->n_forced = g.st.n_forced;
    st->t_prefill = st->ttft = g.st.t_prefill;
    st->t_decode = g.st.t_decode;
    st->finish = g.st.finish;
    if (g.st.finish == PT_FINISH_NONE) return pt_fail(err, "%s", g.st.error);
    return 0;
}
