/*
 * engine.c - opening a model for generation, and the single-sequence loop.
 */
#include "engine/engine.h"

#include <stdio.h>
#include <stdlib.h>

pt_dtype pt_parse_kv_dtype(const char *s) {
    if (strcmp(s, "f32") == 0) return PT_F32;
    if (strcmp(s, "f16") == 0) return PT_F16;
    if (strcmp(s, "bf16") == 0) return PT_BF16;
    return (pt_dtype)-1;
}

int pt_engine_kv_init(pt_engine *e, int n_positions, pt_err *err) {
    if (e->kv.k) pt_kv_cache_free(&e->kv);
    return pt_model_kv_init(e->model, &e->kv, n_positions, e->kv_dtype, &e->kv_quant, err);
}

int pt_engine_open(pt_engine **out, const pt_engine_opts *o, pt_err *err) {
    *out = NULL;
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
                        .dummy_seed = o->dummy_seed};
    if (pt_model_load(&e->model, o->model_path, &mo, err)) goto fail;
    if (e->model->file && !o->no_tokenizer && pt_tokenizer_load(&e->tok, e->model->file, err))
        goto fail;
    if (e->tok && pt_tokenizer_n_vocab(e->tok) > e->model->cfg.vocab_size)
        pt_warn("tokenizer has %d tokens, model only %d", pt_tokenizer_n_vocab(e->tok),
                e->model->cfg.vocab_size);
    e->n_ctx = o->n_ctx > 0 ? o->n_ctx : PT_MIN(e->model->cfg.max_ctx, 4096);
    e->kv_dtype = o->kv_dtype;
    if (pt_kvq_parse(o->kv_quant, &e->kv_quant, err)) goto fail;
    if (pt_engine_kv_init(e, e->n_ctx, err)) goto fail;
    e->logits = pt_xmalloc(sizeof(float) * (size_t)e->model->cfg.vocab_size);
    e->b_pos = pt_xmalloc(sizeof(int32_t) * (size_t)e->model->max_batch);
    e->b_seq = pt_xcalloc((size_t)e->model->max_batch, sizeof(int32_t));
    e->b_want = pt_xcalloc((size_t)e->model->max_batch, sizeof(bool));
    e->load_seconds = pt_now() - t0;
    *out = e;
    return 0;
fail:
    pt_engine_close(e);
    return -1;
}

void pt_engine_close(pt_engine *e) {
    if (!e) return;
    if (e->kv.k) pt_kv_cache_free(&e->kv);
    if (e->tok) pt_tokenizer_free(e->tok);
    if (e->model) pt_model_free(e->model);
    if (e->be) e->be->ops->destroy(e->be);
    free(e->logits);
    free(e->b_pos);
    free(e->b_seq);
    free(e->b_want);
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
 * the last, and samples from them.  Chunks of max_batch rows reuse the
 * model's workspace. */
static int run_tail(pt_engine *e, pt_seq *s, pt_sample_result *r, pt_err *err) {
    int first = s->kv.n_tokens, n = s->n_tokens - first;
    if (n <= 0) return pt_fail(err, "nothing to run");
    if (s->n_tokens > e->n_ctx)
        return pt_fail(err, "context full: %d tokens, the context holds %d (raise --ctx)",
                       s->n_tokens, e->n_ctx);
    int chunk = e->model->max_batch;
    int32_t *pos = e->b_pos, *seq = e->b_seq;
    bool *want = e->b_want;
    pt_kv_seq *seqs[1] = {&s->kv};
    int rc = 0;
    for (int i = first; i < s->n_tokens && rc == 0; i += chunk) {
        int k = PT_MIN(chunk, s->n_tokens - i);
        for (int j = 0; j < k; j++) {
            pos[j] = i + j;
            seq[j] = 0;
            want[j] = i + j == s->n_tokens - 1;
        }
        pt_batch b = {k, s->tokens + i, pos, seq, want, 1, seqs};
        rc = pt_model_forward(e->model, &e->kv, &b, e->logits, err);
    }
    if (rc) return -1;
    pt_sampler_sample(s->sampler, e->logits, r);
    return 0;
}

int pt_seq_prefill(pt_engine *e, pt_seq *s, pt_sample_result *r, pt_err *err) {
    return run_tail(e, s, r, err);
}

int pt_seq_decode(pt_engine *e, pt_seq *s, pt_sample_result *r, pt_err *err) {
    return run_tail(e, s, r, err);
}

int pt_generate(pt_engine *e, const int32_t *prompt, int n_prompt, const pt_gen_params *p,
                pt_token_cb cb, void *user, pt_gen_stats *st, pt_err *err) {
    memset(st, 0, sizeof *st);
    if (n_prompt <= 0) return pt_fail(err, "empty prompt");
    if (n_prompt >= e->n_ctx)
        return pt_fail(err, "prompt of %d tokens does not fit the context of %d", n_prompt,
                       e->n_ctx);
    pt_seq s;
    pt_seq_init(&s, e, &p->sampling);
    for (int i = 0; i < n_prompt; i++) pt_seq_push(&s, prompt[i]);
    s.n_prompt = n_prompt;
    st->n_prompt = n_prompt;

    pt_detok dt;
    if (e->tok) pt_detok_init(&dt, e->tok);
    char text[1024];
    pt_sample_result r;
    double t0 = pt_now();
    int rc = pt_seq_prefill(e, &s, &r, err);
    st->t_prefill = st->ttft = pt_now() - t0;
    double t1 = pt_now();
    while (rc == 0) {
        st->n_generated++;
        bool eog = e->tok && pt_tokenizer_is_eog(e->tok, r.id) && !p->ignore_eos;
        size_t len = e->tok && !eog ? pt_detok_push(&dt, r.id, text, sizeof text) : 0;
        if (eog) {
            st->finish = PT_FINISH_STOP;
            len = e->tok ? pt_detok_flush(&dt, text, sizeof text) : 0;
        }
        if (cb && cb(user, &r, text, len)) {
            st->finish = PT_FINISH_STOP;
            break;
        }
        if (eog) break;
        if (st->n_generated >= p->max_tokens || s.n_tokens + 1 >= e->n_ctx) {
            st->finish = PT_FINISH_LENGTH;
            break;
        }
        pt_seq_push(&s, r.id);
        rc = pt_seq_decode(e, &s, &r, err);
    }
    if (rc == 0 && e->tok && st->finish == PT_FINISH_LENGTH) {
        size_t len = pt_detok_flush(&dt, text, sizeof text);
        if (len && cb) cb(user, NULL, text, len);
    }
    /* the first token came out of prefill; decode covers the rest */
    st->t_decode = pt_now() - t1;
    pt_seq_free(&s, e);
    return rc;
}
