/*
 * base.h - the few things every layer of Petrel uses: errors with a message a
 * user can act on, logging, checked allocation, half-precision conversion and
 * a monotonic clock.
 *
 * Error convention: a fallible function returns 0 on success and -1 on
 * failure, and fills the caller's pt_err with one sentence that names the
 * thing that is wrong ("tensor blk.3.attn_q.weight: expected 64x64, file has
 * 64x32").  pt_fail() does both in one line: `return pt_fail(err, "...");`.
 */
#ifndef PETREL_BASE_H
#define PETREL_BASE_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef struct pt_err {
    char msg[512];
} pt_err;

/* Sets err->msg (if err is not NULL) and returns -1. */
int pt_fail(pt_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Prefixes an existing message: "loading x: <old message>".  Returns -1. */
int pt_failp(pt_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Logging to stderr.  Level is set once from PETREL_LOG or --verbose. */
enum { PT_LOG_ERROR, PT_LOG_WARN, PT_LOG_INFO, PT_LOG_DEBUG };
extern int pt_log_level;
void pt_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#define pt_warn(...) pt_log(PT_LOG_WARN, __VA_ARGS__)
#define pt_info(...) pt_log(PT_LOG_INFO, __VA_ARGS__)
#define pt_debug(...) pt_log(PT_LOG_DEBUG, __VA_ARGS__)

/* Allocation that cannot fail: aborts with a message on out-of-memory.  Use
 * for small bookkeeping; large buffers (weights, KV pool) use pt_alloc_big()
 * so a model that does not fit is reported, not aborted. */
void *pt_xmalloc(size_t n);
void *pt_xcalloc(size_t n, size_t size);
void *pt_xrealloc(void *p, size_t n);
char *pt_xstrdup(const char *s);
/* 64-byte aligned, zeroed, NULL on failure.  Free with pt_free_big(). */
void *pt_alloc_big(size_t n);
void pt_free_big(void *p, size_t n);

/* Overflow-checked size arithmetic: returns false on overflow. */
static inline bool pt_mul_ok(size_t a, size_t b, size_t *out) {
    return !__builtin_mul_overflow(a, b, out);
}
static inline bool pt_add_ok(size_t a, size_t b, size_t *out) {
    return !__builtin_add_overflow(a, b, out);
}

/* IEEE half and bfloat16 <-> float. */
static inline float pt_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline uint16_t pt_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffff) > 0x7f800000) return (uint16_t)((u >> 16) | 64); /* quiet NaN */
    u += 0x7fff + ((u >> 16) & 1); /* round to nearest even */
    return (uint16_t)(u >> 16);
}
float pt_f16_to_f32(uint16_t h);
uint16_t pt_f32_to_f16(float f);

/* Seconds from a monotonic clock. */
double pt_now(void);

/* Peak and current resident set size of this process in bytes (0 if
 * unknown). */
size_t pt_peak_rss(void);
size_t pt_current_rss(void);
/* Physical memory available to this process in bytes (0 if unknown). */
size_t pt_mem_available(void);

/* Small deterministic RNG (xoshiro256**), for sampling and dummy weights. */
typedef struct pt_rng {
    uint64_t s[4];
} pt_rng;
void pt_rng_seed(pt_rng *r, uint64_t seed);
uint64_t pt_rng_next(pt_rng *r);
/* Uniform in [0, 1). */
static inline double pt_rng_uniform(pt_rng *r) {
    return (double)(pt_rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
}

#define PT_MIN(a, b) ((a) < (b) ? (a) : (b))
#define PT_MAX(a, b) ((a) > (b) ? (a) : (b))
#define PT_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

#endif
