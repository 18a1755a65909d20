/*
 * test_disk_tier.c - the disk tier's files: written atomically and read
 * back exactly; what a crash or a damaged disk leaves (temporary files,
 * truncated or flipped files) is removed at open or at read and never
 * returned; another salt's files are left alone; one process per
 * directory; the size cap evicts the least recently used; a failed write
 * turns writing off and nothing else.
 */
#include <dirent.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "kv/disk_tier.h"

enum { PAYLOAD = 4096, PS = 16 };

static char dir[256];

static void fresh_dir(void) {
    snprintf(dir, sizeof dir, "%s/disk-tier-test-%d", PETREL_BINARY_DIR, (int)getpid());
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

static void *page(uint64_t seed) {
    unsigned char *p = malloc(PAYLOAD);
    for (int i = 0; i < PAYLOAD; i++) p[i] = (unsigned char)((seed * 131 + (uint64_t)i * 7) >> 3);
    return p;
}

static int count_files(const char *suffix) {
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *de;
    while (d && (de = readdir(d))) {
        size_t l = strlen(de->d_name), k = strlen(suffix);
        n += l >= k && strcmp(de->d_name + l - k, suffix) == 0;
    }
    if (d) closedir(d);
    return n;
}

static pt_disk *open_tier(uint64_t salt, int64_t cap) {
    pt_disk *d;
    pt_err err = {{0}};
    if (pt_disk_open(&d, dir, cap, salt, PAYLOAD, PS, &err)) fail_msg("open: %s", err.msg);
    return d;
}

static void test_round_trip_and_restart(void **state) {
    (void)state;
    fresh_dir();
    pt_disk *d = open_tier(7, 1 << 20);
    for (uint64_t k = 1; k <= 5; k++) pt_disk_write(d, k, page(k));
    pt_disk_sync(d);
    assert_true(pt_disk_has(d, 3));
    assert_false(pt_disk_wants(d, 3));
    assert_true(pt_disk_wants(d, 9));
    pt_disk_close(d);

    /* a new process finds them; another salt does not */
    pt_disk *other = open_tier(8, 1 << 20);
    assert_false(pt_disk_has(other, 3));
    pt_disk_stats so = pt_disk_get_stats(other);
    assert_int_equal(so.n_other, 5);
    pt_disk_close(other);
    d = open_tier(7, 1 << 20);
    pt_disk_stats st = pt_disk_get_stats(d);
    assert_int_equal(st.n_files, 5);
    unsigned char *buf = malloc(PAYLOAD), *want = page(4);
    assert_int_equal(pt_disk_read(d, 4, buf), 0);
    assert_memory_equal(buf, want, PAYLOAD);
    assert_int_equal(pt_disk_read(d, 99, buf), -1);
    free(buf), free(want);
    pt_disk_close(d);
}

/* What a crash leaves: a temporary file, a truncated file.  And a byte
 * flipped on disk: found by the checksum at read, removed, not returned. */
static void test_damage(void **state) {
    (void)state;
    fresh_dir();
    pt_disk *d = open_tier(7, 1 << 20);
    for (uint64_t k = 1; k <= 3; k++) pt_disk_write(d, k, page(k));
    pt_disk_close(d);
    char path[600];
    /* an interrupted write */
    snprintf(path, sizeof path, "%s/00000000000000aa.kv.tmp", dir);
    FILE *f = fopen(path, "w");
    fputs("half a page", f);
    fclose(f);
    /* a truncated page file */
    snprintf(path, sizeof path, "%s/0000000000000002.kv", dir);
    assert_int_equal(truncate(path, 100), 0);
    /* a flipped payload byte */
    snprintf(path, sizeof path, "%s/0000000000000003.kv", dir);
    int fd = open(path, O_RDWR);
    unsigned char b;
    assert_int_equal(pread(fd, &b, 1, 64 + 1000), 1);
    b ^= 0x10;
    assert_int_equal(pwrite(fd, &b, 1, 64 + 1000), 1);
    close(fd);

    d = open_tier(7, 1 << 20);
    pt_disk_stats st = pt_disk_get_stats(d);
    assert_int_equal(st.n_partial, 1);
    assert_int_equal(st.n_corrupt, 1); /* the truncated one */
    assert_int_equal(st.n_files, 2);
    assert_int_equal(count_files(".tmp"), 0);
    unsigned char *buf = malloc(PAYLOAD);
    assert_int_equal(pt_disk_read(d, 3, buf), -1); /* the checksum catches the flip */
    assert_false(pt_disk_has(d, 3));
    assert_int_equal(count_files(".kv"), 1);
    assert_int_equal(pt_disk_read(d, 1, buf), 0);
    st = pt_disk_get_stats(d);
    assert_int_equal(st.n_bad_reads, 1);
    free(buf);
    pt_disk_close(d);
}

static void test_one_process(void **state) {
    (void)state;
    fresh_dir();
    pt_disk *d = open_tier(7, 1 << 20), *e;
    pt_err err = {{0}};
    assert_int_not_equal(pt_disk_open(&e, dir, 1 << 20, 7, PAYLOAD, PS, &err), 0);
    assert_non_null(strstr(err.msg, "in use"));
    pt_disk_close(d);
    e = open_tier(7, 1 << 20); /* free again once closed */
    pt_disk_close(e);
}

/* The cap: files beyond it go, least recently used (written or read) first. */
static void test_cap_lru(void **state) {
    (void)state;
    fresh_dir();
    int64_t file = PAYLOAD + 64;
    pt_disk *d = open_tier(7, 4 * file);
    unsigned char *buf = malloc(PAYLOAD);
    for (uint64_t k = 1; k <= 3; k++) {
        pt_disk_write(d, k, page(k));
        pt_disk_sync(d);
    }
    assert_int_equal(pt_disk_read(d, 1, buf), 0); /* 1 is now the most recent */
    pt_disk_write(d, 4, page(4));                 /* 4 files > 90% of 4: evict to 3 */
    pt_disk_sync(d);
    assert_true(pt_disk_has(d, 1));
    assert_false(pt_disk_has(d, 2)); /* the least recently used */
    assert_true(pt_disk_has(d, 3) && pt_disk_has(d, 4));
    free(buf);
    pt_disk_close(d);
}

/* A full file system: the write fails, writing turns off, reads go on. */
static void test_write_error(void **state) {
    (void)state;
    fresh_dir();
    pt_disk *d = open_tier(7, 1 << 20);
    pt_disk_write(d, 1, page(1));
    pt_disk_sync(d);
    /* take the directory away under the writer: the rename target is gone */
    char cmd[700];
    snprintf(cmd, sizeof cmd, "mv '%s' '%s.gone'", dir, dir);
    assert_int_equal(system(cmd), 0);
    pt_disk_write(d, 2, page(2));
    pt_disk_sync(d);
    pt_disk_stats st = pt_disk_get_stats(d);
    assert_true(st.write_off);
    assert_false(pt_disk_wants(d, 3));
    pt_disk_write(d, 3, page(3)); /* dropped quietly */
    pt_disk_sync(d);
    pt_disk_close(d);
    snprintf(cmd, sizeof cmd, "rm -rf '%s.gone'", dir);
    assert_int_equal(system(cmd), 0);
}

/* A queue smaller than the burst: the producer waits for the writer and
 * nothing is dropped (evictions come deepest page first; a drop would lose
 * the chain's root). */
static void test_backpressure(void **state) {
    (void)state;
    fresh_dir();
    pt_disk *d = open_tier(7, 1 << 24);
    pt_disk_set_queue_limit(d, 2 * PAYLOAD);
    for (uint64_t k = 1; k <= 64; k++) pt_disk_write(d, k, page(k));
    pt_disk_sync(d);
    pt_disk_stats st = pt_disk_get_stats(d);
    assert_int_equal(st.n_written, 64);
    assert_int_equal(st.n_dropped, 0);
    for (uint64_t k = 1; k <= 64; k++) assert_true(pt_disk_has(d, k));
    pt_disk_close(d);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip_and_restart), cmocka_unit_test(test_damage),
        cmocka_unit_test(test_one_process),            cmocka_unit_test(test_cap_lru),
        cmocka_unit_test(test_write_error),
        cmocka_unit_test(test_backpressure),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    fresh_dir(); /* leave nothing behind */
    return rc;
}
