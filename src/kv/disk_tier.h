/*
 * disk_tier.h - the KV cache's cold tier: full pages as files keyed by
 * their content hash, reused across restarts.
 *
 * A page evicted from RAM (its block taken for new content) is copied and
 * written by a background thread; at shutdown the pages still cached in RAM
 * are written too.  A later lookup that misses in RAM can find the page on
 * disk and read it back, so a restarted server on the same model reuses
 * what the last one computed.
 *
 * File format (one file per page, DIR/<key as 16 hex digits>.kv):
 *
 *     offset  size  field
 *          0     8  magic "PETRELKV"
 *          8     4  version (1)
 *         12     4  page_size (positions)
 *         16     8  salt: the engine's cache salt (weights, config, KV format)
 *         24     8  key
 *         32     8  payload bytes (every layer's K then V of the page)
 *         40     8  XXH3-64 of the payload
 *         48    16  zero
 *         64     -  payload
 *
 * Crash safety: a file is written under a temporary name, fsync'd, then
 * renamed; the directory is fsync'd after renames in batches.  At open,
 * temporary files (an interrupted write) are removed, and files whose
 * header is wrong or whose size disagrees with it are removed; files of
 * another salt (another model or KV format) are left alone and never read.
 * The payload checksum is verified on every read; a mismatch removes the
 * file and the read fails (the page is recomputed).  Nothing on disk is
 * trusted before it is checked.
 *
 * One process per directory: a lock file (flock) refuses a second one.
 * A write error (a full disk, a directory gone read-only) turns writing
 * off with one warning; reading what is there continues.
 */
#ifndef PETREL_DISK_TIER_H
#define PETREL_DISK_TIER_H

#include "base/base.h"

typedef struct pt_disk pt_disk;

typedef struct pt_disk_stats {
    int64_t n_files, bytes;             /* reusable files of our salt */
    int64_t n_partial, n_corrupt, n_other; /* found at open: removed, removed, left */
    int64_t n_written, n_read, n_bad_reads, n_dropped, n_evicted;
    bool write_off; /* a write failed: no more writes */
} pt_disk_stats;

/* Opens (creating) dir for pages of payload_bytes under salt, holding at
 * most cap_bytes of files (least recently used removed first). */
int pt_disk_open(pt_disk **out, const char *dir, int64_t cap_bytes, uint64_t salt,
                 size_t payload_bytes, int page_size, pt_err *err);
/* Writes what is queued, then closes.  NULL is a no-op. */
void pt_disk_close(pt_disk *d);

/* Whether a page of this key is on disk, ready to read. */
bool pt_disk_has(pt_disk *d, uint64_t key);
/* Whether writing this key would add something: not on disk, not queued,
 * and writing is on. */
bool pt_disk_wants(pt_disk *d, uint64_t key);
/* Reads key's payload into buf (payload_bytes) and checks it; -1 if it is
 * absent, unreadable or corrupt (then the file is removed). */
int pt_disk_read(pt_disk *d, uint64_t key, void *buf);
/* Queues buf (payload_bytes, malloc'd; the tier frees it) to be written
 * under key; waits for the writer when 256 MiB of copies already wait.
 * Dropped if writing is off or the key is there already. */
void pt_disk_write(pt_disk *d, uint64_t key, void *buf);
/* Bytes of copies that may wait for the writer (tests). */
void pt_disk_set_queue_limit(pt_disk *d, size_t bytes);
/* Waits until everything queued so far is on disk. */
void pt_disk_sync(pt_disk *d);
pt_disk_stats pt_disk_get_stats(pt_disk *d);

#endif
