/*
 * mmap_file.c - read-only file mappings (see mmap_file.h).
 */
#include "io/mmap_file.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

int pt_mmap_open(pt_mmap *m, const char *path, pt_err *err) {
    m->data = NULL;
    m->size = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return pt_fail(err, "%s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return pt_fail(err, "%s: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return pt_fail(err, "%s: not a regular file", path);
    }
    if (st.st_size == 0) { /* mmap of length 0 is an error; an empty file is not */
        close(fd);
        return 0;
    }
    if ((uint64_t)st.st_size > SIZE_MAX) {
        close(fd);
        return pt_fail(err, "%s: file too large to map", path);
    }
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd); /* the mapping keeps its own reference to the file */
    if (p == MAP_FAILED) return pt_fail(err, "%s: mmap: %s", path, strerror(e));
    m->data = p;
    m->size = (size_t)st.st_size;
    return 0;
}

void pt_mmap_close(pt_mmap *m) {
    if (m->data) munmap((void *)m->data, m->size);
    m->data = NULL;
    m->size = 0;
}

void pt_mmap_release(const void *p, size_t n) {
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t lo = ((uintptr_t)p + page - 1) & ~(page - 1), hi = ((uintptr_t)p + n) & ~(page - 1);
    if (hi > lo) madvise((void *)lo, hi - lo, MADV_DONTNEED); /* advice: failure changes nothing */
}
