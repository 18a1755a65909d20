/*
 * petrel_api.c - the public API (include/petrel/petrel.h) over the engine.
 */
#include <stdio.h>
#include <stdlib.h>

#include "engine/engine.h"
#include "engine/gen_limits.h"
#include "petrel/petrel.h"

struct petrel_model {
    pt_engine *e;
};

const char *petrel_version(void) {
    return PETREL_VERSION; /* CMakeLists.txt's project() version */
}

static void copy_err(char *dst, size_t cap, const char *msg) {
    if (dst && cap) snprintf(dst, cap, "%s", msg);
}

petrel_model *petrel_open(const char *path, const petrel_open_opts *opts, char *err,
                          size_t err_cap) {
    pt_engine_opts o = {.model_path = path, .kv_dtype = PT_F16, .kernels = "auto"};
    if (opts) {
        o.n_threads = opts->n_threads;
        o.n_ctx = opts->n_ctx;
        o.device = opts->device;
    }
    pt_err e = {{0}};
    petrel_model *m = pt_xcalloc(1, sizeof *m);
    if (pt_engine_open(&m->e, &o, &e)) {
        copy_err(err, err_cap, e.msg);
        free(m);
        return NULL;
    }
    return m;
}

void petrel_close(petrel_model *m) {
    if (!m) return;
    pt_engine_close(m->e);
    free(m);
}

petrel_params petrel_default_params(void) {
    petrel_params p = {.max_tokens = 128, .temperature = 0.8f, .top_k = 40, .top_p = 0.95f,
                       .min_p = 0.05f, .repetition_penalty = 1, .add_bos = 1};
    return p;
}

typedef struct relay {
    petrel_text_cb cb;
    void *user;
} relay;

static int relay_text(void *user, const pt_sample_result *r, const char *text, size_t len) {
    relay *rl = user;
    (void)r;
    return len && rl->cb ? rl->cb(rl->user, text, len) : 0;
}

int petrel_generate(petrel_model *m, const char *prompt, const petrel_params *p,
                    petrel_text_cb cb, void *user, petrel_stats *stats, char *err,
                    size_t err_cap) {
    pt_err e = {{0}};
    if (!m->e->tok) {
        copy_err(err, err_cap, "this model has no tokenizer");
        return -1;
    }
    pt_gen_params gp = {.max_tokens = p->max_tokens};
    gp.sampling = pt_sampling_default();
    gp.sampling.temperature = p->temperature;
    gp.sampling.top_k = p->top_k;
    gp.sampling.top_p = p->top_p;
    gp.sampling.min_p = p->min_p;
    gp.sampling.repetition_penalty = p->repetition_penalty;
    gp.sampling.frequency_penalty = p->frequency_penalty;
    gp.sampling.presence_penalty = p->presence_penalty;
    gp.sampling.seed = p->seed;
    gp.sampling.n_logprobs = -1;
    /* the ranges `petrel generate` and the server enforce (gen_limits.h) */
    if (pt_gen_params_check(&gp, &e)) {
        copy_err(err, err_cap, e.msg);
        return -1;
    }
    int32_t *ids;
    size_t n;
    if (pt_tokenize(m->e->tok, prompt, strlen(prompt), p->add_bos, false, &ids, &n, &e)) {
        copy_err(err, err_cap, e.msg);
        return -1;
    }
    relay rl = {cb, user};
    pt_gen_stats st;
    int rc = pt_generate(m->e, ids, (int)n, &gp, relay_text, &rl, &st, &e);
    free(ids);
    if (rc) {
        copy_err(err, err_cap, e.msg);
        return -1;
    }
    if (stats) {
        stats->prompt_tokens = st.n_prompt;
        stats->completion_tokens = st.n_generated;
        stats->prefill_seconds = st.t_prefill;
        stats->decode_seconds = st.t_decode;
        stats->stopped_at_eos = st.finish == PT_FINISH_STOP;
    }
    return 0;
}
