/*
 * base.c - errors, logging, allocation, half floats, clock, RNG.
 */
#include "base/base.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

int pt_log_level = PT_LOG_WARN;

int pt_fail(pt_err *err, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
    }
    return -1;
}

int pt_failp(pt_err *err, const char *fmt, ...) {
    if (err) {
        char prefix[256], old[sizeof err->msg];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(prefix, sizeof prefix, fmt, ap);
        va_end(ap);
        memcpy(old, err->msg, sizeof old);
        /* Truncation is fine: the end of a long message is the least useful. */
        size_t n = strlen(prefix);
        if (n > sizeof err->msg - 3) n = sizeof err->msg - 3;
        memcpy(err->msg, prefix, n);
        memcpy(err->msg + n, ": ", 2);
        size_t room = sizeof err->msg - n - 3, len = strnlen(old, room);
        memcpy(err->msg + n + 2, old, len);
        err->msg[n + 2 + len] = 0;
    }
    return -1;
}

void pt_log(int level, const char *fmt, ...) {
    static const char *names[] = {"error", "warning", "info", "debug"};
    if (level > pt_log_level) return;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "petrel: %s: ", names[level]);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

static void out_of_memory(size_t n) {
    fprintf(stderr, "petrel: out of memory allocating %zu bytes\n", n);
    abort();
}

void *pt_xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) out_of_memory(n);
    return p;
}

void *pt_xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) out_of_memory(n * size);
    return p;
}

void *pt_xrealloc(void *p, size_t n) {
    p = realloc(p, n ? n : 1);
    if (!p) out_of_memory(n);
    return p;
}

char *pt_xstrdup(const char *s) {
    size_t n = strlen(s) + 1;
    return memcpy(pt_xmalloc(n), s, n);
}

/* Big buffers come straight from mmap: zeroed, page-aligned, and returned to
 * the system on free, so resident memory tracks what is really in use. */
void *pt_alloc_big(size_t n) {
    if (n == 0) n = 1;
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

void pt_free_big(void *p, size_t n) {
    if (p) munmap(p, n ? n : 1);
}

float pt_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: normalize */
            exp = 127 - 15 + 1;
            while (!(man & 0x400)) {
                man <<= 1;
                exp--;
            }
            u = sign | (exp << 23) | ((man & 0x3ff) << 13);
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000 | (man << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t pt_f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000;
    int32_t exp = (int32_t)((u >> 23) & 0xff) - 127 + 15;
    uint32_t man = u & 0x7fffff;
    if (((u >> 23) & 0xff) == 0xff) /* inf or nan */
        return (uint16_t)(sign | 0x7c00 | (man ? 0x200 : 0));
    if (exp >= 31) return (uint16_t)(sign | 0x7c00);
    if (exp <= 0) {
        if (exp < -10) return (uint16_t)sign;
        man |= 0x800000;
        uint32_t shift = (uint32_t)(14 - exp);
        uint32_t half = man >> shift, rem = man & ((1u << shift) - 1), mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1))) half++;
        return (uint16_t)(sign | half);
    }
    uint32_t h = sign | ((uint32_t)exp << 10) | (man >> 13), rem = man & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++; /* carries into exponent correctly */
    return (uint16_t)h;
}

double pt_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

size_t pt_peak_rss(void) {
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
    return (size_t)ru.ru_maxrss * 1024;
}

size_t pt_current_rss(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f) return 0;
    unsigned long pages = 0, rss = 0;
    int n = fscanf(f, "%lu %lu", &pages, &rss);
    fclose(f);
    return n == 2 ? (size_t)rss * (size_t)sysconf(_SC_PAGESIZE) : 0;
}

size_t pt_mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    size_t kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %zu kB", &kb) == 1) break;
    fclose(f);
    return kb * 1024;
}

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void pt_rng_seed(pt_rng *r, uint64_t seed) {
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&seed);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t pt_rng_next(pt_rng *r) {
    uint64_t *s = r->s, result = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}
