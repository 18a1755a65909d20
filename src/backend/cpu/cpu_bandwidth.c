/*
 * cpu_bandwidth.c - the machine's streaming read bandwidth, the roofline
 * decode is judged against (DESIGN.md §1, §6).
 *
 * Every thread sums its slice of a buffer much larger than any cache (1 GiB,
 * less on a small machine), a few times; the best pass counts.  The buffer
 * is written first: untouched anonymous pages all map the one zero page and
 * would be read from cache.  The result is measured once per backend.
 *
 * Each thread reads its slice as the matvec kernels read weights (see
 * sum_streams).  One stream per core understates the machine: the hardware
 * prefetcher keeps only so many lines in flight per stream, and a matvec
 * reads several weight rows at once (measured on a Xeon: one thread 6.7
 * GB/s with one stream, 17.6 GB/s with four).
 */
#include "backend/cpu/cpu_backend.h"

#define TARGET_BYTES ((size_t)1 << 30)
#define MIN_BYTES ((size_t)64 << 20)
#define REPS 10
#define STREAMS 8
#define ROW_FLOATS 1024  /* 4 KiB rows (a 2048-column bf16 matrix) */
#define STEP_FLOATS 64   /* 256 bytes of each row in turn */
#define AHEAD_FLOATS 256 /* prefetch distance, 1 KiB (the matvec's) */
#define CHUNK_FLOATS (STREAMS * ROW_FLOATS) /* a thread's slice: whole blocks */

typedef struct bw_job {
    const pt_cpu_kernels *k;
    float *buf;
    size_t n;
    bool fill;
    float sums[256]; /* stored, so the compiler cannot drop the loads */
} bw_job;

/* Sums x[0, n) the way a matvec reads a weight matrix: blocks of STREAMS
 * consecutive rows of ROW_FLOATS, the rows of a block read side by side a
 * STEP_FLOATS piece of each in turn, each row prefetched AHEAD_FLOATS
 * ahead (into the next block near a row's end), one request per 64-byte
 * line.  Far-apart streams or no prefetch read slower than the bf16 matvec
 * streams its weights, and decode would "beat" its roofline. */
static float sum_streams(const pt_cpu_kernels *k, const float *x, size_t n) {
    const size_t block = (size_t)STREAMS * ROW_FLOATS, nb = n / block;
    float s = 0;
    for (size_t b = 0; b < nb; b++) {
        const float *blk = x + b * block;
        for (size_t off = 0; off < ROW_FLOATS; off += STEP_FLOATS)
            for (int i = 0; i < STREAMS; i++) {
                const float *c = blk + (size_t)i * ROW_FLOATS + off;
                size_t ahead = off + AHEAD_FLOATS < ROW_FLOATS ? AHEAD_FLOATS : AHEAD_FLOATS + block - ROW_FLOATS;
                if ((size_t)(c - x) + ahead + STEP_FLOATS <= n)
                    for (int l = 0; l < STEP_FLOATS; l += 16) __builtin_prefetch(c + ahead + l);
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
        j->sums[ith % 256] += sum_streams(j->k, j->buf + lo, (size_t)(hi - lo));
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
    for (int r = 0; r < REPS; r++) {
        double t0 = pt_now();
        pt_pool_run(cb->pool, bw_task, &j);
        best = PT_MIN(best, pt_now() - t0);
    }
    pt_free_big(j.buf, bytes);
    cb->bandwidth = (double)bytes / best;
    return cb->bandwidth;
}
