/*
 * petrel.h - the public C API of Petrel.
 *
 * Load a model, generate from a prompt with a callback per token, close.
 * Everything else (server, scheduler, backends) is built on the internal
 * layers under src/; this header is the stable surface for embedding.
 *
 *     petrel_model *m = petrel_open("model.gguf", NULL, err, sizeof err);
 *     petrel_params p = petrel_default_params();
 *     petrel_generate(m, "Once upon a time", &p, on_text, user, err, sizeof err);
 *     petrel_close(m);
 */
#ifndef PETREL_H
#define PETREL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct petrel_model petrel_model;

typedef struct petrel_open_opts {
    int n_threads;      /* <= 0: one per core */
    int n_ctx;          /* 0: min(model's context, 4096) */
    const char *device; /* "cpu" (default) */
} petrel_open_opts;

typedef struct petrel_params {
    int max_tokens;
    float temperature; /* 0 = greedy */
    int top_k;
    float top_p, min_p;
    float repetition_penalty, frequency_penalty, presence_penalty;
    uint64_t seed;
    int add_bos; /* nonzero: add BOS as the model's tokenizer says */
} petrel_params;

typedef struct petrel_stats {
    int prompt_tokens, completion_tokens;
    double prefill_seconds, decode_seconds;
    int stopped_at_eos; /* else the length limit was hit */
} petrel_stats;

/* Called with each piece of valid UTF-8 text; return nonzero to stop. */
typedef int (*petrel_text_cb)(void *user, const char *text, size_t len);

/* NULL on failure, with a message in err. opts may be NULL. */
petrel_model *petrel_open(const char *path, const petrel_open_opts *opts, char *err,
                          size_t err_cap);
void petrel_close(petrel_model *m);
petrel_params petrel_default_params(void);
/* Returns 0 on success, -1 on failure (message in err). stats may be NULL. */
int petrel_generate(petrel_model *m, const char *prompt, const petrel_params *p,
                    petrel_text_cb cb, void *user, petrel_stats *stats, char *err,
                    size_t err_cap);
const char *petrel_version(void);

#ifdef __cplusplus
}
#endif

#endif
