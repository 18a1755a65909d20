/*
 * disk_tier.c - page files, their index and the writer thread (see
 * disk_tier.h for the format and the crash-safety rules).
 *
 * Locking: d->mu guards the index, the write queue and the counters.
 * Reads run on the caller's thread (the engine's), writes on the writer
 * thread; both take the lock only around index and queue changes, never
 * during I/O.
 */
#include "kv/disk_tier.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#define HEADER_BYTES 64
#define VERSION 1
#define MAX_QUEUED_BYTES ((size_t)256 << 20) /* copies waiting to be written */

typedef struct entry {
    uint64_t key;
    int64_t bytes;
    uint64_t used; /* clock of the last write or read */
    int state;     /* 0 empty, 1 on disk, 2 queued, 3 deleted (tombstone) */
} entry;

typedef struct job {
    struct job *next;
    uint64_t key;
    void *buf;
} job;

struct pt_disk {
    char *dir;
    int lock_fd, dir_fd;
    uint64_t salt;
    size_t payload;
    int page_size;
    int64_t cap;
    pthread_mutex_t mu;
    pthread_cond_t cv, idle, room;
    size_t max_queued; /* bytes of copies that may wait; a writer beyond it waits for room */
    pthread_t writer;
    /* under mu */
    entry *map;
    uint32_t mask;
    int64_t n_used_slots; /* live + tombstones */
    uint64_t clock;
    job *q_head, *q_tail;
    size_t q_bytes;
    bool busy, quit;
    pt_disk_stats st;
};

/* ---- the index ------------------------------------------------------------- */

static entry *find(pt_disk *d, uint64_t key, bool insert) {
    entry *tomb = NULL;
    for (uint32_t i = (uint32_t)(key ^ (key >> 32)) & d->mask;; i = (i + 1) & d->mask) {
        entry *e = &d->map[i];
        if (e->state == 0) {
            if (!insert) return NULL;
            if (tomb) e = tomb;
            else d->n_used_slots++;
            *e = (entry){.key = key};
            return e;
        }
        if (e->state == 3) {
            if (!tomb) tomb = e;
        } else if (e->key == key) {
            return e;
        }
    }
}

static void grow_map(pt_disk *d) {
    if ((d->n_used_slots + 1) * 2 <= (int64_t)d->mask + 1) return;
    entry *old = d->map;
    uint32_t n_old = d->mask + 1, n_new = n_old;
    int64_t live = 0;
    for (uint32_t i = 0; i < n_old; i++) live += old[i].state == 1 || old[i].state == 2;
    while ((live + 1) * 4 > (int64_t)n_new) n_new *= 2;
    d->map = pt_xcalloc(n_new, sizeof *d->map);
    d->mask = n_new - 1;
    d->n_used_slots = 0;
    for (uint32_t i = 0; i < n_old; i++)
        if (old[i].state == 1 || old[i].state == 2) *find(d, old[i].key, true) = old[i];
    free(old);
}

static void path_of(const pt_disk *d, uint64_t key, char *buf, size_t cap, bool tmp) {
    snprintf(buf, cap, "%s/%016llx.kv%s", d->dir, (unsigned long long)key, tmp ? ".tmp" : "");
}

/* Under mu: removes the least recently used files until the total is
 * under 90% of the cap. */
static void evict_lru(pt_disk *d) {
    while (d->st.bytes > d->cap * 9 / 10) {
        entry *victim = NULL;
        for (uint32_t i = 0; i <= d->mask; i++)
            if (d->map[i].state == 1 && (!victim || d->map[i].used < victim->used))
                victim = &d->map[i];
        if (!victim) return;
        char path[4200];
        path_of(d, victim->key, path, sizeof path, false);
        unlink(path);
        d->st.bytes -= victim->bytes;
        d->st.n_files--;
        d->st.n_evicted++;
        victim->state = 3;
    }
}

/* ---- writing ------------------------------------------------------------------ */

static void put_u32(unsigned char *p, uint32_t v) { memcpy(p, &v, 4); }
static void put_u64(unsigned char *p, uint64_t v) { memcpy(p, &v, 8); }
static uint32_t get_u32(const unsigned char *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static uint64_t get_u64(const unsigned char *p) { uint64_t v; memcpy(&v, p, 8); return v; }

static void make_header(const pt_disk *d, uint64_t key, const void *payload, unsigned char *h) {
    memset(h, 0, HEADER_BYTES);
    memcpy(h, "PETRELKV", 8);
    put_u32(h + 8, VERSION);
    put_u32(h + 12, (uint32_t)d->page_size);
    put_u64(h + 16, d->salt);
    put_u64(h + 24, key);
    put_u64(h + 32, d->payload);
    put_u64(h + 40, XXH3_64bits(payload, d->payload));
}

static int write_all(int fd, const void *buf, size_t n) {
    const char *p = buf;
    while (n > 0) {
        ssize_t k = write(fd, p, n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return -1;
        p += k, n -= (size_t)k;
    }
    return 0;
}

/* Writes one page file: temporary name, fsync, rename.  Returns errno on
 * failure (the temporary file is removed). */
static int write_file(pt_disk *d, uint64_t key, const void *payload) {
    char tmp[4200], final[4200];
    path_of(d, key, tmp, sizeof tmp, true);
    path_of(d, key, final, sizeof final, false);
    unsigned char h[HEADER_BYTES];
    make_header(d, key, payload, h);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return errno;
    int rc = 0;
    if (write_all(fd, h, sizeof h) || write_all(fd, payload, d->payload) || fsync(fd)) rc = errno;
    if (close(fd) && !rc) rc = errno;
    if (!rc && rename(tmp, final)) rc = errno;
    if (rc) unlink(tmp);
    return rc;
}

static void *writer_main(void *arg) {
    pt_disk *d = arg;
    int since_dir_sync = 0;
    pthread_mutex_lock(&d->mu);
    for (;;) {
        while (!d->q_head && !d->quit) {
            if (since_dir_sync) { /* renames are durable once the directory is */
                pthread_mutex_unlock(&d->mu);
                fsync(d->dir_fd);
                pthread_mutex_lock(&d->mu);
                since_dir_sync = 0;
                continue; /* a job queued while the lock was free signalled no one */
            }
            pthread_cond_broadcast(&d->idle);
            pthread_cond_wait(&d->cv, &d->mu);
        }
        if (!d->q_head) break;
        job *j = d->q_head;
        d->q_head = j->next;
        if (!d->q_head) d->q_tail = NULL;
        d->busy = true;
        bool off = d->st.write_off;
        pthread_mutex_unlock(&d->mu);
        int err = off ? 0 : write_file(d, j->key, j->buf);
        pthread_mutex_lock(&d->mu);
        d->busy = false;
        d->q_bytes -= d->payload;
        pthread_cond_broadcast(&d->room);
        entry *e = find(d, j->key, false);
        if (!off && !err && e) {
            e->state = 1;
            e->bytes = (int64_t)(d->payload + HEADER_BYTES);
            e->used = ++d->clock;
            d->st.n_files++;
            d->st.bytes += e->bytes;
            d->st.n_written++;
            since_dir_sync++;
            evict_lru(d);
        } else {
            if (e) e->state = 3;
            if (err && !d->st.write_off) {
                d->st.write_off = true;
                pthread_cond_broadcast(&d->room);
                pt_warn("--kv-disk %s: cannot write (%s); the disk tier stops writing, serving "
                        "goes on", d->dir, strerror(err));
            }
            d->st.n_dropped++;
        }
        free(j->buf);
        free(j);
    }
    pthread_cond_broadcast(&d->idle);
    pthread_mutex_unlock(&d->mu);
    if (since_dir_sync) fsync(d->dir_fd);
    return NULL;
}

/* A full queue makes the caller wait for the writer rather than drop the
 * page: evictions come deepest page first (sequences free their pages from
 * the end), so dropping would lose the roots of the chains and with them
 * every page after. */
void pt_disk_write(pt_disk *d, uint64_t key, void *buf) {
    pthread_mutex_lock(&d->mu);
    while (!d->st.write_off && d->q_head && d->q_bytes + d->payload > d->max_queued)
        pthread_cond_wait(&d->room, &d->mu);
    entry *e = find(d, key, false);
    bool skip = d->st.write_off || (e && (e->state == 1 || e->state == 2));
    if (skip) {
        pthread_mutex_unlock(&d->mu);
        free(buf);
        return;
    }
    grow_map(d);
    e = find(d, key, true);
    e->state = 2;
    job *j = pt_xmalloc(sizeof *j);
    *j = (job){NULL, key, buf};
    if (d->q_tail)
        d->q_tail->next = j;
    else
        d->q_head = j;
    d->q_tail = j;
    d->q_bytes += d->payload;
    pthread_cond_signal(&d->cv);
    pthread_mutex_unlock(&d->mu);
}

void pt_disk_sync(pt_disk *d) {
    pthread_mutex_lock(&d->mu);
    while (d->q_head || d->busy) pthread_cond_wait(&d->idle, &d->mu);
    pthread_mutex_unlock(&d->mu);
}

/* ---- reading ------------------------------------------------------------------- */

bool pt_disk_has(pt_disk *d, uint64_t key) {
    pthread_mutex_lock(&d->mu);
    entry *e = find(d, key, false);
    bool has = e && e->state == 1;
    pthread_mutex_unlock(&d->mu);
    return has;
}

bool pt_disk_wants(pt_disk *d, uint64_t key) {
    pthread_mutex_lock(&d->mu);
    entry *e = find(d, key, false);
    bool wants = !d->st.write_off && !(e && (e->state == 1 || e->state == 2));
    pthread_mutex_unlock(&d->mu);
    return wants;
}

/* Checks a header against this tier; the reason it is not ours, or NULL. */
static const char *check_header(const pt_disk *d, const unsigned char *h, uint64_t *salt,
                                uint64_t *key) {
    if (memcmp(h, "PETRELKV", 8) || get_u32(h + 8) != VERSION) return "not a page file";
    *salt = get_u64(h + 16);
    *key = get_u64(h + 24);
    if (*salt != d->salt) return NULL; /* another model's: the caller tells */
    if (get_u32(h + 12) != (uint32_t)d->page_size || get_u64(h + 32) != d->payload)
        return "wrong geometry";
    return NULL;
}

static void forget(pt_disk *d, uint64_t key, bool bad) {
    char path[4200];
    path_of(d, key, path, sizeof path, false);
    unlink(path);
    pthread_mutex_lock(&d->mu);
    entry *e = find(d, key, false);
    if (e && e->state == 1) {
        e->state = 3;
        d->st.bytes -= e->bytes;
        d->st.n_files--;
    }
    if (bad) d->st.n_bad_reads++;
    pthread_mutex_unlock(&d->mu);
}

int pt_disk_read(pt_disk *d, uint64_t key, void *buf) {
    if (!pt_disk_has(d, key)) return -1;
    char path[4200];
    path_of(d, key, path, sizeof path, false);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        forget(d, key, true);
        return -1;
    }
    unsigned char h[HEADER_BYTES];
    uint64_t salt, k;
    bool ok = pread(fd, h, sizeof h, 0) == (ssize_t)sizeof h && !check_header(d, h, &salt, &k) &&
              salt == d->salt && k == key &&
              pread(fd, buf, d->payload, HEADER_BYTES) == (ssize_t)d->payload &&
              XXH3_64bits(buf, d->payload) == get_u64(h + 40);
    close(fd);
    if (!ok) {
        pt_warn("--kv-disk: %s is damaged (header or checksum); removed, the page is recomputed",
                path);
        forget(d, key, true);
        return -1;
    }
    pthread_mutex_lock(&d->mu);
    entry *e = find(d, key, false);
    if (e) e->used = ++d->clock;
    d->st.n_read++;
    pthread_mutex_unlock(&d->mu);
    return 0;
}

/* ---- opening ---------------------------------------------------------------------- */

static bool has_suffix(const char *s, const char *suf) {
    size_t n = strlen(s), k = strlen(suf);
    return n >= k && strcmp(s + n - k, suf) == 0;
}

/* Indexes our files, removes the interrupted and the broken ones. */
static void scan(pt_disk *d) {
    DIR *dir = opendir(d->dir);
    if (!dir) return;
    struct dirent *de;
    int64_t expect = (int64_t)(d->payload + HEADER_BYTES);
    while ((de = readdir(dir))) {
        char path[4200];
        snprintf(path, sizeof path, "%s/%s", d->dir, de->d_name);
        if (has_suffix(de->d_name, ".kv.tmp")) {
            unlink(path);
            d->st.n_partial++;
            continue;
        }
        if (!has_suffix(de->d_name, ".kv")) continue;
        unsigned char h[HEADER_BYTES];
        struct stat sb;
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        bool read_ok = fd >= 0 && fstat(fd, &sb) == 0 && pread(fd, h, sizeof h, 0) == (ssize_t)sizeof h;
        if (fd >= 0) close(fd);
        uint64_t salt = 0, key = 0;
        const char *why = read_ok ? check_header(d, h, &salt, &key) : "unreadable";
        if (!why && salt != d->salt) {
            d->st.n_other++;
            continue;
        }
        char name[32];
        snprintf(name, sizeof name, "%016llx.kv", (unsigned long long)key);
        if (why || sb.st_size != expect || strcmp(name, de->d_name)) {
            unlink(path);
            d->st.n_corrupt++;
            continue;
        }
        grow_map(d);
        entry *e = find(d, key, true);
        e->state = 1;
        e->bytes = expect;
        e->used = (uint64_t)sb.st_mtime; /* older files go first */
        d->st.n_files++;
        d->st.bytes += expect;
    }
    closedir(dir);
    uint64_t newest = 0;
    for (uint32_t i = 0; i <= d->mask; i++)
        if (d->map[i].state == 1 && d->map[i].used > newest) newest = d->map[i].used;
    d->clock = newest;
    evict_lru(d);
}

int pt_disk_open(pt_disk **out, const char *dir, int64_t cap_bytes, uint64_t salt,
                 size_t payload_bytes, int page_size, pt_err *err) {
    *out = NULL;
    if (mkdir(dir, 0755) && errno != EEXIST)
        return pt_fail(err, "--kv-disk %s: cannot create it: %s", dir, strerror(errno));
    pt_disk *d = pt_xcalloc(1, sizeof *d);
    d->dir = pt_xstrdup(dir);
    d->lock_fd = d->dir_fd = -1;
    char lock[4200];
    snprintf(lock, sizeof lock, "%s/LOCK", dir);
    d->lock_fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    d->dir_fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (d->lock_fd < 0 || d->dir_fd < 0) {
        int e = errno;
        if (d->lock_fd >= 0) close(d->lock_fd);
        if (d->dir_fd >= 0) close(d->dir_fd);
        free(d->dir), free(d);
        return pt_fail(err, "--kv-disk %s: %s", dir, strerror(e));
    }
    if (flock(d->lock_fd, LOCK_EX | LOCK_NB)) {
        close(d->lock_fd), close(d->dir_fd);
        free(d->dir), free(d);
        return pt_fail(err, "--kv-disk %s is in use by another petrel process (it holds %s); "
                            "give each server its own directory", dir, lock);
    }
    d->salt = salt;
    d->payload = payload_bytes;
    d->page_size = page_size;
    d->cap = cap_bytes;
    d->map = pt_xcalloc(1024, sizeof *d->map);
    d->mask = 1023;
    pthread_mutex_init(&d->mu, NULL);
    pthread_cond_init(&d->cv, NULL);
    pthread_cond_init(&d->idle, NULL);
    pthread_cond_init(&d->room, NULL);
    d->max_queued = PT_MAX(MAX_QUEUED_BYTES, 2 * payload_bytes);
    scan(d);
    if (pthread_create(&d->writer, NULL, writer_main, d)) {
        pt_disk_close(d);
        return pt_fail(err, "--kv-disk: cannot start the writer thread");
    }
    *out = d;
    return 0;
}

void pt_disk_close(pt_disk *d) {
    if (!d) return;
    pthread_mutex_lock(&d->mu);
    bool started = !d->quit;
    d->quit = true;
    pthread_cond_signal(&d->cv);
    pthread_mutex_unlock(&d->mu);
    if (started && d->writer) pthread_join(d->writer, NULL);
    close(d->lock_fd); /* releases the lock */
    close(d->dir_fd);
    pthread_mutex_destroy(&d->mu);
    pthread_cond_destroy(&d->cv);
    pthread_cond_destroy(&d->idle);
    pthread_cond_destroy(&d->room);
    free(d->map);
    free(d->dir);
    free(d);
}

void pt_disk_set_queue_limit(pt_disk *d, size_t bytes) {
    pthread_mutex_lock(&d->mu);
    d->max_queued = bytes;
    pthread_mutex_unlock(&d->mu);
}

pt_disk_stats pt_disk_get_stats(pt_disk *d) {
    pthread_mutex_lock(&d->mu);
    pt_disk_stats st = d->st;
    pthread_mutex_unlock(&d->mu);
    return st;
}
