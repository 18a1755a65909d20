/*
 * cpu_bandwidth.c - the machine's streaming read bandwidth, the roofline
 * decode is judged against (DESIGN.md §1, §6).
 *
 * Every thread sums its slice of a buffer much larger than any cache (1 GiB,
 * less on a small machine), a few times; the best pass counts.  The buffer
 * is written first: untouched anonymous pages all map the one zero page and
 * would be read from cache.  The result is measured once per backend.
 *
 * A roofline must be a ceiling: no engine may stream faster than it in the
 * same run.  Which read pattern is fastest depends on the CPU (one stream
 * per core leaves the prefetchers idle on some parts; on others software
 * prefetch only adds work), so the probe tries several and keeps the best:
 *   - STREAMS rows side by side, as the matvec reads weights (measured on a
 *     Xeon: one thread 6.7 GB/s with one stream, 17.6 GB/s with four);
 *   - one sequential stream, hardware prefetch only;
 *   - the same with software prefetch far ahead, normal and non-temporal
 *     (prefetchnta: lines bypass the outer caches on some CPUs);
 *   - two streams from the two halves of the slice;
 *   - 16 rows side by side, and 8 prefetched further ahead: added on a
 *     Zen 5 EPYC where llama.cpp's decode streamed faster than the first
 *     six patterns read (issue 20).
 * The sum runs on the backend's kernel set: 512-bit loads where the set is
 * avx512, so the probe reads with the widest loads the engine uses.
 * The winner's name is kept for `petrel bench` to print.
 */
#include <stdio.h>

#include "backend/cpu/cpu_backend.h"

#define TARGET_BYTES ((size_t)1 << 30)
#define MIN_BYTES ((size_t)64 << 20)
#define REPS 4
#define ROW_FLOATS 1024 /* 4 KiB rows (a 2048-column bf16 matrix) */
#define STEP_FLOATS 64  /* 256 bytes of each row in turn */
#define CHUNK_FLOATS (16 * ROW_FLOATS) /* a thread's slice: whole blocks of the widest pattern */

/* A read pattern: streams rows read side by side (rows of ROW_FLOATS, or
 * the slice cut in `streams` parts when rows is false), each prefetched
 * ahead floats ahead (0: none), nta: the non-temporal hint. */
typedef struct pattern {
    const char *name;
    int streams;
    bool rows;
    int ahead;
    bool nta;
} pattern;

static const pattern patterns[] = {
    {"16 rows interleaved, prefetch 1 KiB", 16, true, 256, false},
    {"8 rows interleaved, prefetch 1 KiB", 8, true, 256, false},
    {"8 rows interleaved, prefetch 4 KiB", 8, true, 1024, false},
    {"4 rows interleaved, prefetch 2 KiB", 4, true, 512, false},
    {"1 stream, hardware prefetch", 1, false, 0, false},
    {"1 stream, prefetch 4 KiB", 1, false, 1024, false},
    {"1 stream, prefetchnta 4 KiB", 1, false, 1024, true},
    {"2 streams, prefetch 2 KiB", 2, false, 512, false},
};

typedef struct bw_job {
    const pt_cpu_kernels *k;
    const pattern *pat;
    float *buf;
    size_t n;
    bool fill;
    float sums[256]; /* stored, so the compiler cannot drop the loads */
} bw_job;

static void prefetch(const float *p, bool nta) {
    if (nta) __builtin_prefetch(p, 0, 0);
    else __builtin_prefetch(p, 0, 3);
}

/* Sums x[0, n) reading STEP_FLOATS from each of the pattern's streams in
 * turn, each prefetched pat->ahead floats ahead (one request per line,
 * never past the end). */
static float sum_pattern(const pt_cpu_kernels *k, const pattern *pat, const float *x, size_t n) {
    size_t len = pat->rows ? ROW_FLOATS : n / (size_t)pat->streams / STEP_FLOATS * STEP_FLOATS;
    size_t block = len * (size_t)pat->streams, nb = len ? n / block : 0;
    float s = 0;
    for (size_t b = 0; b < nb; b++) {
        const float *blk = x + b * block;
        for (size_t off = 0; off < len; off += STEP_FLOATS)
            for (int i = 0; i < pat->streams; i++) {
                const float *c = blk + (size_t)i * len + off;
                size_t ahead = (size_t)pat->ahead;
                if (pat->rows && off + ahead >= len) ahead += block - len; /* into the next block */
                if (ahead && (size_t)(c - x) + ahead + STEP_FLOATS <= n)
                    for (int l = 0; l < STEP_FLOATS; l += 16) prefetch(c + ahead + l, pat->nta);
                s += k->sum(c, STEP_FLOATS);
            }
    }
    return s + k->sum(x + nb * block, n - nb * block);
}

static void bw_task(void *ctx, int ith, int nth) {
    bw_job *j = ctx;
    int64_t lo, hi;
    pt_cpu_split((int64_t)j->n, ith, nth, CHUNK_FLOATS, &lo, &hi);
    if (j->fill) {
        for (int64_t i = lo; i < hi; i++) j->buf[i] = 1.0f;
    } else if (hi > lo) {
        j->sums[ith % 256] += sum_pattern(j->k, j->pat, j->buf + lo, (size_t)(hi - lo));
    }
}

double pt_cpu_read_bandwidth(pt_backend *be) {
    pt_cpu_backend *cb = pt_cpu(be);
    if (cb->bandwidth > 0) return cb->bandwidth;
    size_t bytes = TARGET_BYTES, avail = pt_mem_available();
    if (avail && bytes > avail / 4) bytes = PT_MAX(MIN_BYTES, avail / 4);
    bw_job j = {.k = cb->k, .buf = pt_alloc_big(bytes), .n = bytes / sizeof(float), .fill = true};
    if (!j.buf) return 0;
    pt_pool_run(cb->pool, bw_task, &j); /* first touch on the threads that read */
    j.fill = false;
    double best = 1e30;
    int won = 0;
    /* Rounds over all patterns rather than each pattern's passes in a row,
     * so a burst of load from elsewhere does not sink one pattern. */
    for (int r = 0; r < REPS; r++)
        for (int p = 0; p < (int)PT_ARRAY_LEN(patterns); p++) {
            j.pat = &patterns[p];
            double t0 = pt_now();
            pt_pool_run(cb->pool, bw_task, &j);
            double dt = pt_now() - t0;
            if (dt < best) best = dt, won = p;
        }
    pt_free_big(j.buf, bytes);
    cb->bandwidth = (double)bytes / best;
    snprintf(cb->bandwidth_how, sizeof cb->bandwidth_how, "%s, %.0f MiB, best of %d x %d",
             patterns[won].name, bytes / 1048576.0, REPS, (int)PT_ARRAY_LEN(patterns));
    return cb->bandwidth;
}
