/*
 * petrel.h - the public C API of Petrel (libpetrel; docs/api.md).
 *
 * Load a model, tokenize, generate with a callback per piece of text, and
 * run many requests at once through a scheduler that batches them into one
 * forward pass per step (continuous batching, as `petrel serve` does).
 *
 *     char err[256];
 *     petrel_model *m = petrel_open("model.gguf", NULL, err, sizeof err);
 *     petrel_params p = petrel_default_params();
 *     petrel_generate(m, "Once upon a time", &p, on_text, user, NULL, err, sizeof err);
 *     petrel_close(m);
 *
 * Link with `pkg-config --cflags --libs petrel`.  Only the functions below
 * are exported from libpetrel.so; everything else is internal.
 *
 * Errors: a function that can fail takes (char *err, size_t err_cap) and on
 * failure writes a message a user can act on there (err may be NULL).
 *
 * Thread-safety rules:
 *   - petrel_version, petrel_default_params: any thread, any time.
 *   - A petrel_model is opened and closed by one thread; petrel_close must
 *     not run while any other call on that model (or its scheduler) does.
 *   - petrel_tokenize, petrel_token_text, petrel_n_vocab, petrel_n_ctx and
 *     petrel_token_eos only read the model: any threads, concurrently.
 *   - petrel_generate runs on the calling thread and owns the model while
 *     it runs: one call at a time per model, and not while a scheduler is
 *     started on it (it returns an error then).  Different models are
 *     independent.
 *   - A petrel_scheduler owns its model from petrel_scheduler_start until
 *     petrel_scheduler_stop, both called by one thread.  petrel_submit and
 *     petrel_cancel may be called from any thread, concurrently.  The
 *     callbacks of every request run on the scheduler's own thread, one at
 *     a time; they must return quickly and must not call
 *     petrel_scheduler_stop or petrel_close (submit and cancel are fine).
 */
#ifndef PETREL_H
#define PETREL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__) || defined(__clang__)
#define PETREL_API __attribute__((visibility("default")))
#else
#define PETREL_API
#endif

typedef struct petrel_model petrel_model;

typedef struct petrel_open_opts {
    int n_threads;      /* <= 0: one per core */
    int n_ctx;          /* positions per sequence; 0: min(model's context, 4096) */
    const char *device; /* "cpu" (default) or "cuda" */
} petrel_open_opts;

/* Sampling and limits of one generation.  Start from petrel_default_params:
 * the ranges are `petrel generate`'s and the server's (temperature 0..2,
 * top_p 0..1, ...); a value outside is an error, never clamped. */
typedef struct petrel_params {
    int max_tokens;    /* generated tokens at most */
    float temperature; /* 0 = greedy */
    int top_k;         /* 0 = off */
    float top_p, min_p;
    float repetition_penalty, frequency_penalty, presence_penalty;
    uint64_t seed;
    int add_bos; /* nonzero: add BOS as the model's tokenizer says */
} petrel_params;

typedef struct petrel_stats {
    int prompt_tokens, completion_tokens;
    double prefill_seconds, decode_seconds;
    int stopped_at_eos; /* an end-of-text token, or the callback asked to stop */
    int cancelled;      /* petrel_cancel or petrel_scheduler_stop ended it */
} petrel_stats;

/* Called with each piece of valid UTF-8 text (never a partial character);
 * return nonzero to stop the generation. */
typedef int (*petrel_text_cb)(void *user, const char *text, size_t len);

/* The library's version, e.g. "0.1.0". */
PETREL_API const char *petrel_version(void);

/* Opens a GGUF file or a Hugging Face directory.  NULL on failure, with a
 * message in err.  opts may be NULL (defaults). */
PETREL_API petrel_model *petrel_open(const char *path, const petrel_open_opts *opts, char *err,
                                     size_t err_cap);
/* Frees the model; NULL is a no-op.  Stop its scheduler first. */
PETREL_API void petrel_close(petrel_model *m);

PETREL_API petrel_params petrel_default_params(void);

/* ---- tokens ---- */

PETREL_API int petrel_n_vocab(const petrel_model *m);
/* Positions per sequence (prompt + output). */
PETREL_API int petrel_n_ctx(const petrel_model *m);
/* The end-of-text token, or -1 if the model has none. */
PETREL_API int32_t petrel_token_eos(const petrel_model *m);
/* Encodes len bytes of text.  Writes up to cap ids into ids (may be NULL
 * when cap is 0) and returns how many the text has: more than cap means
 * call again with a larger array.  -1 on failure (message in err). */
PETREL_API int petrel_tokenize(const petrel_model *m, const char *text, size_t len, int add_bos,
                               int32_t *ids, int cap, char *err, size_t err_cap);
/* The bytes one token stands for (not NUL-terminated; a piece of a UTF-8
 * character for byte tokens), or NULL if id is not in the vocabulary. */
PETREL_API const char *petrel_token_text(const petrel_model *m, int32_t id, size_t *len);

/* ---- one generation on the calling thread ---- */

/* Generates a continuation of prompt, calling cb with each piece of text.
 * Returns 0, or -1 with a message in err.  stats may be NULL. */
PETREL_API int petrel_generate(petrel_model *m, const char *prompt, const petrel_params *p,
                               petrel_text_cb cb, void *user, petrel_stats *stats, char *err,
                               size_t err_cap);

/* ---- many requests at once ---- */

typedef struct petrel_scheduler petrel_scheduler;

/* Called once per accepted request when it ends: error is NULL on success
 * (stats then say why it ended), else why it failed.  Runs on the
 * scheduler's thread; after it, no callback of that request runs again. */
typedef void (*petrel_done_cb)(void *user, const petrel_stats *stats, const char *error);

/* Starts the scheduler's thread on m, with room in the KV cache for
 * max_parallel sequences of the model's n_ctx positions decoded together
 * (more requests wait in a queue).  NULL on failure (message in err). */
PETREL_API petrel_scheduler *petrel_scheduler_start(petrel_model *m, int max_parallel, char *err,
                                                    size_t err_cap);
/* Queues a request.  on_text (may be NULL) gets its text as it is made,
 * on_done its end; both get user.  Returns the request's id (> 0), or 0
 * with a message in err if it cannot run (a bad parameter, a prompt longer
 * than the context, a full queue); then no callback is called. */
PETREL_API uint64_t petrel_submit(petrel_scheduler *s, const char *prompt, const petrel_params *p,
                                  petrel_text_cb on_text, petrel_done_cb on_done, void *user,
                                  char *err, size_t err_cap);
/* Ends a request early; its on_done follows with stats->cancelled set.
 * An id that already finished is ignored. */
PETREL_API void petrel_cancel(petrel_scheduler *s, uint64_t id);
/* Cancels what is still running or queued, waits until every on_done has
 * run, joins the thread and frees the scheduler.  NULL is a no-op. */
PETREL_API void petrel_scheduler_stop(petrel_scheduler *s);

#ifdef __cplusplus
}
#endif

#endif
