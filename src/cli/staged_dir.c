/*
 * staged_dir.c - an output directory that appears whole or not at all
 * (staged_dir.h says the contract).
 *
 * State is static: one staged directory per process, and the signal handler
 * needs the staging path without taking a lock or allocating.  The handler
 * removes the directory with raw system calls only (open, getdents64,
 * unlinkat, rmdir), then raises the signal again with its default action
 * restored, so the exit status still says which signal ended the run.
 * Thread-pool workers block these signals (threadpool.c), so the handler
 * runs on the thread that writes the files: no file can be created in the
 * directory while it is being emptied.
 */
#include "cli/staged_dir.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum { N_SIGNALS = 3 };
static const int signals[N_SIGNALS] = {SIGINT, SIGTERM, SIGHUP};

static struct {
    char dst[2048], parent[2048], tmp[2400];
    char prefix[300]; /* ".NAME.petrel-tmp-": the staging names for this DST */
    bool replace, staged;
    bool installed[N_SIGNALS];
    struct sigaction saved[N_SIGNALS];
} st;

static volatile sig_atomic_t armed; /* the handler may remove st.tmp */

static bool is_dot(const char *n) {
    return n[0] == '.' && (!n[1] || (n[1] == '.' && !n[2]));
}

/* Unlinks every file of a flat directory, then the directory, with
 * async-signal-safe calls only.  Unlinking while listing can hide entries
 * from the listing, so it lists again until a pass removes nothing. */
static int remove_flat(const char *path) {
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return errno == ENOENT ? 0 : -1;
    _Alignas(8) char buf[4096];
    for (int pass = 0; pass < 64; pass++) {
        bool removed = false;
        ssize_t n;
        lseek(fd, 0, SEEK_SET);
        while ((n = getdents64(fd, buf, sizeof buf)) > 0)
            for (ssize_t off = 0; off < n;) {
                struct dirent64 *d = (struct dirent64 *)(buf + off);
                off += d->d_reclen;
                if (!is_dot(d->d_name) && unlinkat(fd, d->d_name, 0) == 0) removed = true;
            }
        if (!removed) break;
    }
    close(fd);
    return rmdir(path);
}

static void on_signal(int sig) {
    if (armed) remove_flat(st.tmp);
    armed = 0;
    /* SA_RESETHAND restored the default action; the signal is blocked while
     * this handler runs and ends the process as soon as it returns. */
    raise(sig);
}

/* Installs the handler, except for a signal the parent chose to ignore (a
 * background job's SIGINT, nohup's SIGHUP): that choice stands. */
static void install_handlers(void) {
    struct sigaction sa = {.sa_handler = on_signal, .sa_flags = SA_RESETHAND | SA_RESTART};
    sigemptyset(&sa.sa_mask);
    for (int i = 0; i < N_SIGNALS; i++) sigaddset(&sa.sa_mask, signals[i]);
    for (int i = 0; i < N_SIGNALS; i++) {
        st.installed[i] = false;
        if (sigaction(signals[i], NULL, &st.saved[i]) || st.saved[i].sa_handler == SIG_IGN) continue;
        st.installed[i] = sigaction(signals[i], &sa, NULL) == 0;
    }
}

static void restore_handlers(void) {
    armed = 0;
    for (int i = 0; i < N_SIGNALS; i++)
        if (st.installed[i]) sigaction(signals[i], &st.saved[i], NULL);
    st.staged = false;
}

static void block_signals(sigset_t *old) {
    sigset_t s;
    sigemptyset(&s);
    for (int i = 0; i < N_SIGNALS; i++) sigaddset(&s, signals[i]);
    pthread_sigmask(SIG_BLOCK, &s, old);
}

/* Staging directories of this DST whose process is gone: a run that was
 * killed outright (SIGKILL) or crashed.  A live pid's is left alone. */
static void sweep_stale(void) {
    DIR *d = opendir(st.parent);
    if (!d) return;
    size_t plen = strlen(st.prefix);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, st.prefix, plen) != 0) continue;
        char *end, path[8192];
        long pid = strtol(e->d_name + plen, &end, 10);
        if (*end || pid <= 0 || pid == (long)getpid() || kill((pid_t)pid, 0) == 0 || errno != ESRCH)
            continue;
        snprintf(path, sizeof path, "%s/%s", st.parent, e->d_name);
        if (remove_flat(path) == 0) fprintf(stderr, "petrel: removed %s, left by an interrupted run\n", path);
    }
    closedir(d);
}

/* Splits DST (trailing slashes dropped) into parent and name. */
static int split_dst(const char *dst, pt_err *err) {
    size_t n = strlen(dst);
    while (n > 1 && dst[n - 1] == '/') n--;
    if (n == 0 || n >= 2048) return pt_fail(err, "'%s' is not a usable output path", dst);
    memcpy(st.dst, dst, n);
    st.dst[n] = 0;
    char *slash = strrchr(st.dst, '/');
    const char *name = slash ? slash + 1 : st.dst;
    if (!*name || is_dot(name)) return pt_fail(err, "'%s': name the directory to create", dst);
    if (slash) snprintf(st.parent, sizeof st.parent, "%.*s", slash == st.dst ? 1 : (int)(slash - st.dst), st.dst);
    else snprintf(st.parent, sizeof st.parent, ".");
    snprintf(st.prefix, sizeof st.prefix, ".%.250s.petrel-tmp-", name);
    snprintf(st.tmp, sizeof st.tmp, "%s/%s%ld", st.parent, st.prefix, (long)getpid());
    return 0;
}

int staged_begin(const char *dst, bool replace, const char **tmp, pt_err *err) {
    if (st.staged) return pt_fail(err, "internal: a directory is already staged");
    if (split_dst(dst, err)) return -1;
    struct stat s;
    if (lstat(st.dst, &s) == 0) {
        if (!replace) return pt_fail(err, "%s exists (use --force to replace it)", st.dst);
        if (!S_ISDIR(s.st_mode)) return pt_fail(err, "%s exists and is not a directory", st.dst);
    } else if (errno != ENOENT) {
        return pt_fail(err, "%s: %s", st.dst, strerror(errno));
    }
    sweep_stale();
    install_handlers();
    if (mkdir(st.tmp, 0755)) {
        int e = errno;
        restore_handlers();
        if (e == ENOENT) return pt_fail(err, "%s: the directory it goes in, %s, does not exist", st.dst, st.parent);
        return pt_fail(err, "cannot create %s beside %s: %s", st.tmp, st.dst, strerror(e));
    }
    st.replace = replace;
    st.staged = true;
    armed = 1;
    *tmp = st.tmp;
    return 0;
}

static int remove_entry(const char *path, const struct stat *s, int flag, struct FTW *f) {
    (void)s, (void)flag, (void)f;
    return remove(path);
}

int staged_commit(pt_err *err) {
    if (!st.staged) return pt_fail(err, "internal: nothing is staged");
    /* a signal now would find the directory half renamed: it waits */
    sigset_t old;
    block_signals(&old);
    char old_dst[8192] = "";
    struct stat s;
    int rc = 0;
    if (st.replace && lstat(st.dst, &s) == 0) {
        snprintf(old_dst, sizeof old_dst, "%s/%s%ld.old", st.parent, st.prefix, (long)getpid());
        if (rename(st.dst, old_dst)) rc = pt_fail(err, "%s: cannot move it aside: %s", st.dst, strerror(errno));
    }
    if (!rc && rename(st.tmp, st.dst)) {
        rc = pt_fail(err, "%s: cannot rename %s to it: %s", st.dst, st.tmp, strerror(errno));
        if (*old_dst) rename(old_dst, st.dst);
        *old_dst = 0;
    }
    if (rc) remove_flat(st.tmp);
    restore_handlers();
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (*old_dst && nftw(old_dst, remove_entry, 16, FTW_DEPTH | FTW_PHYS))
        fprintf(stderr, "petrel: the old %s is left at %s: %s\n", st.dst, old_dst, strerror(errno));
    return rc;
}

void staged_abort(void) {
    if (!st.staged) return;
    sigset_t old;
    block_signals(&old);
    if (remove_flat(st.tmp) && errno != ENOENT)
        fprintf(stderr, "petrel: cannot remove %s: %s\n", st.tmp, strerror(errno));
    restore_handlers();
    pthread_sigmask(SIG_SETMASK, &old, NULL);
}
