/*
 * model_file.c - a model on disk, whichever format: one GGUF file, or a
 * Hugging Face directory of JSON configs and safetensors shards.
 *
 * Whatever the format, the result is the same flat table of pt_tensor_info
 * (views into read-only mappings) plus a sorted index for lookups by name.
 * Which weights a directory holds is decided as transformers decides it:
 * model.safetensors, else model.safetensors.index.json and its shards, else
 * (our addition) every *.safetensors file in the directory.  A directory with
 * a config.json and no weights at all opens with zero tensors, so that a
 * config preset can be loaded with dummy weights (DESIGN.md §6).
 */
#include "io/model_file.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/gguf.h"
#include "io/safetensors.h"

/* Config files are small, but a tokenizer_config.json may carry a long chat
 * template and a table of added tokens. */
#define MF_JSON_MAX ((size_t)64 << 20)
#define MF_INDEX_NAME "model.safetensors.index.json"

typedef struct mf_priv {
    int n_shards;
    pt_safetensors **shards;
    char **shard_names;             /* file names within the directory */
    int *tensor_shard;              /* mf->tensors[i] comes from shards[tensor_shard[i]] */
    const pt_tensor_info **by_name; /* sorted, for bsearch */
} mf_priv;

static char *join(const char *dir, const char *name) {
    size_t dl = strlen(dir), nl = strlen(name);
    bool slash = dl && dir[dl - 1] == '/';
    char *p = pt_xmalloc(dl + nl + 2);
    memcpy(p, dir, dl);
    if (!slash) p[dl++] = '/';
    memcpy(p + dl, name, nl + 1);
    return p;
}

static bool is_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* ---- reading small files ------------------------------------------------- */

static int read_all(int fd, const char *path, size_t max_bytes, size_t hint, char **out,
                    size_t *len, pt_err *err) {
    size_t cap = PT_MIN(hint, max_bytes) + 1, n = 0;
    char *buf = pt_xmalloc(cap + 1);
    for (;;) {
        if (n == cap) { /* only for files whose size stat did not tell */
            if (cap > max_bytes) break;
            cap = cap > max_bytes / 2 ? max_bytes + 1 : cap * 2;
            buf = pt_xrealloc(buf, cap + 1);
        }
        ssize_t r = read(fd, buf + n, cap - n);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            free(buf);
            return pt_fail(err, "%s: %s", path, strerror(errno));
        }
        if (r == 0) break;
        n += (size_t)r;
    }
    if (n > max_bytes) {
        free(buf);
        return pt_fail(err, "%s: larger than the %zu-byte limit", path, max_bytes);
    }
    buf[n] = 0;
    *out = buf;
    if (len) *len = n;
    return 0;
}

int pt_read_file(const char *path, size_t max_bytes, char **out, size_t *len, pt_err *err) {
    *out = NULL;
    if (max_bytes > SIZE_MAX / 4) max_bytes = SIZE_MAX / 4; /* keeps cap arithmetic exact */
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return pt_fail(err, "%s: %s", path, strerror(errno));
    struct stat st;
    int rc;
    if (fstat(fd, &st) != 0)
        rc = pt_fail(err, "%s: %s", path, strerror(errno));
    else if (S_ISDIR(st.st_mode))
        rc = pt_fail(err, "%s: is a directory", path);
    else if (S_ISREG(st.st_mode) && (uint64_t)st.st_size > max_bytes)
        rc = pt_fail(err, "%s: %lld bytes, larger than the %zu-byte limit", path,
                     (long long)st.st_size, max_bytes);
    else
        rc = read_all(fd, path, max_bytes, S_ISREG(st.st_mode) ? (size_t)st.st_size : 4096, out,
                      len, err);
    close(fd);
    return rc;
}

/* Parses dir/name into a JSON object.  A missing optional file gives NULL.
 * Integers too large for 64 bits (tokenizer_config.json writes
 * model_max_length as 1e30 spelled out) are read as reals rather than
 * failing the whole file. */
static int load_json(const char *dir, const char *name, bool required, json_t **out, pt_err *err) {
    *out = NULL;
    char *path = join(dir, name), *text;
    size_t len;
    int rc = 0;
    if (!required && access(path, F_OK) != 0) goto done;
    if ((rc = pt_read_file(path, MF_JSON_MAX, &text, &len, err))) goto done;
    json_error_t je;
    *out = json_loadb(text, len, 0, &je);
    if (!*out && je.position > 0 && strstr(je.text, "too big"))
        *out = json_loadb(text, len, JSON_DECODE_INT_AS_REAL, &je);
    free(text);
    if (!*out)
        rc = pt_fail(err, "%s: line %d, column %d: %s", path, je.line, je.column, je.text);
    else if (!json_is_object(*out))
        rc = pt_fail(err, "%s: not a JSON object", path);
done:
    free(path);
    return rc;
}

/* ---- shards -------------------------------------------------------------- */

static int find_shard(const mf_priv *p, const char *fname) {
    for (int i = 0; i < p->n_shards; i++)
        if (strcmp(p->shard_names[i], fname) == 0) return i;
    return -1;
}

/* Opens dir/fname once; returns its index or -1. */
static int add_shard(pt_model_file *mf, const char *fname, pt_err *err) {
    mf_priv *p = mf->priv;
    int i = find_shard(p, fname);
    if (i >= 0) return i;
    char *path = join(mf->path, fname);
    pt_safetensors *st;
    int rc = pt_safetensors_open(&st, path, err);
    free(path);
    if (rc) return -1;
    p->shards = pt_xrealloc(p->shards, (size_t)(p->n_shards + 1) * sizeof *p->shards);
    p->shard_names = pt_xrealloc(p->shard_names, (size_t)(p->n_shards + 1) * sizeof(char *));
    p->shards[p->n_shards] = st;
    p->shard_names[p->n_shards] = pt_xstrdup(fname);
    return p->n_shards++;
}

/* A shard named by the index must be a plain file name: the weights of a
 * model live in its directory, not wherever a downloaded JSON points. */
static bool plain_file_name(const char *s) {
    return *s && !strchr(s, '/') && strcmp(s, ".") != 0 && strcmp(s, "..") != 0;
}

static int open_index(pt_model_file *mf, pt_err *err) {
    json_t *index;
    if (load_json(mf->path, MF_INDEX_NAME, true, &index, err)) return -1;
    const json_t *map = json_object_get(index, "weight_map");
    int rc = 0;
    if (!json_is_object(map))
        rc = pt_fail(err, "%s: weight_map missing or not an object", MF_INDEX_NAME);
    const char *name;
    json_t *v;
    /* first open every shard named, then check each tensor is where the map says */
    json_object_foreach((json_t *)map, name, v) {
        const char *fname = json_string_value(v);
        if (rc) break;
        if (!fname || !plain_file_name(fname))
            rc = pt_fail(err,
                         "%s: weight_map: tensor %s: shard must be a file name in the "
                         "model directory",
                         MF_INDEX_NAME, name);
        else if (add_shard(mf, fname, err) < 0)
            rc = pt_failp(err, "%s: weight_map names shard %s", MF_INDEX_NAME, fname);
    }
    mf_priv *p = mf->priv;
    json_object_foreach((json_t *)map, name, v) {
        if (rc) break;
        const char *fname = json_string_value(v);
        if (!pt_safetensors_find(p->shards[find_shard(p, fname)], name))
            rc = pt_fail(err, "%s: tensor %s: not found in shard %s", MF_INDEX_NAME, name, fname);
    }
    json_decref(index);
    return rc;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* No model.safetensors and no index: take every *.safetensors, in name order. */
static int open_all_safetensors(pt_model_file *mf, pt_err *err) {
    DIR *d = opendir(mf->path);
    if (!d) return pt_fail(err, "%s: %s", mf->path, strerror(errno));
    char **names = NULL;
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.' || !ends_with(e->d_name, ".safetensors")) continue;
        names = pt_xrealloc(names, (n + 1) * sizeof *names);
        names[n++] = pt_xstrdup(e->d_name);
    }
    closedir(d);
    if (n) qsort(names, n, sizeof *names, cmp_str);
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        if (!rc && add_shard(mf, names[i], err) < 0) rc = -1;
        free(names[i]);
    }
    free(names);
    return rc;
}

static int open_weights(pt_model_file *mf, pt_err *err) {
    char *single = join(mf->path, "model.safetensors");
    char *index = join(mf->path, MF_INDEX_NAME);
    int rc;
    if (is_file(single))
        rc = add_shard(mf, "model.safetensors", err) < 0 ? -1 : 0;
    else if (is_file(index))
        rc = open_index(mf, err);
    else
        rc = open_all_safetensors(mf, err);
    free(single);
    free(index);
    return rc;
}

/* Concatenates the shards' tensor tables. */
static int gather_shard_tensors(pt_model_file *mf, pt_err *err) {
    mf_priv *p = mf->priv;
    size_t total = 0;
    for (int i = 0; i < p->n_shards; i++)
        total += (size_t)pt_safetensors_n_tensors(p->shards[i]);
    if (total > INT_MAX) return pt_fail(err, "%s: too many tensors", mf->path);
    mf->tensors = pt_xcalloc(total ? total : 1, sizeof *mf->tensors);
    p->tensor_shard = pt_xcalloc(total ? total : 1, sizeof *p->tensor_shard);
    for (int i = 0; i < p->n_shards; i++)
        for (int j = 0; j < pt_safetensors_n_tensors(p->shards[i]); j++) {
            p->tensor_shard[mf->n_tensors] = i;
            mf->tensors[mf->n_tensors++] = *pt_safetensors_tensor(p->shards[i], j);
        }
    return 0;
}

/* ---- the two kinds ------------------------------------------------------- */

static int open_hf(pt_model_file *mf, pt_err *err) {
    mf->kind = PT_FILE_HF;
    char *cfg = join(mf->path, "config.json");
    bool has_config = access(cfg, F_OK) == 0;
    free(cfg);
    if (!has_config)
        return pt_fail(err, "%s: not a GGUF file or a model directory (no config.json)", mf->path);
    if (load_json(mf->path, "config.json", true, &mf->config, err) ||
        load_json(mf->path, "generation_config.json", false, &mf->generation_config, err) ||
        load_json(mf->path, "tokenizer_config.json", false, &mf->tokenizer_config, err))
        return -1;
    char *tok = join(mf->path, "tokenizer.json");
    if (is_file(tok))
        mf->tokenizer_json = tok;
    else
        free(tok);
    tok = join(mf->path, "tokenizer.gguf");
    if (!mf->tokenizer_json && is_file(tok))
        mf->tokenizer_gguf = tok;
    else
        free(tok);
    if (open_weights(mf, err)) return -1;
    return gather_shard_tensors(mf, err);
}

static int open_gguf(pt_model_file *mf, pt_err *err) {
    mf->kind = PT_FILE_GGUF;
    if (pt_gguf_open(&mf->gguf, mf->path, err)) return -1;
    int n = pt_gguf_n_tensors(mf->gguf);
    mf->tensors = pt_xcalloc(n ? (size_t)n : 1, sizeof *mf->tensors);
    for (int i = 0; i < n; i++)
        mf->tensors[i] = *pt_gguf_tensor(mf->gguf, i);
    mf->n_tensors = n;
    return 0;
}

static bool has_gguf_magic(const char *path) {
    char magic[4];
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    bool ok = read(fd, magic, 4) == 4 && memcmp(magic, "GGUF", 4) == 0;
    close(fd);
    return ok;
}

/* ---- the index by name --------------------------------------------------- */

static int cmp_by_name(const void *a, const void *b) {
    return strcmp((*(const pt_tensor_info *const *)a)->name,
                  (*(const pt_tensor_info *const *)b)->name);
}

static const char *source_of(const pt_model_file *mf, const pt_tensor_info *t) {
    const mf_priv *p = mf->priv;
    if (!p->tensor_shard) return mf->path;
    return p->shard_names[p->tensor_shard[t - mf->tensors]];
}

/* Sorts the index and refuses two tensors with one name: shards of one
 * model must partition its weights. */
static int index_tensors(pt_model_file *mf, pt_err *err) {
    mf_priv *p = mf->priv;
    int n = mf->n_tensors;
    p->by_name = pt_xmalloc((size_t)(n ? n : 1) * sizeof *p->by_name);
    for (int i = 0; i < n; i++)
        p->by_name[i] = &mf->tensors[i];
    qsort(p->by_name, (size_t)n, sizeof *p->by_name, cmp_by_name);
    for (int i = 1; i < n; i++)
        if (strcmp(p->by_name[i - 1]->name, p->by_name[i]->name) == 0)
            return pt_fail(err, "%s: tensor %s is in both %s and %s", mf->path, p->by_name[i]->name,
                           source_of(mf, p->by_name[i - 1]), source_of(mf, p->by_name[i]));
    return 0;
}

/* ---- the interface ------------------------------------------------------- */

int pt_model_file_open(pt_model_file **out, const char *path, pt_err *err) {
    *out = NULL;
    struct stat st;
    if (stat(path, &st) != 0) return pt_fail(err, "%s: %s", path, strerror(errno));
    pt_model_file *mf = pt_xcalloc(1, sizeof *mf);
    mf->path = pt_xstrdup(path);
    mf->priv = pt_xcalloc(1, sizeof(mf_priv));
    int rc;
    if (S_ISDIR(st.st_mode))
        rc = open_hf(mf, err);
    else if (S_ISREG(st.st_mode) && has_gguf_magic(path))
        rc = open_gguf(mf, err);
    else if (S_ISREG(st.st_mode) && ends_with(path, ".safetensors"))
        rc = pt_fail(err,
                     "%s: a .safetensors file alone is not a model; open the directory "
                     "that holds it and its config.json",
                     path);
    else
        rc = pt_fail(err, "%s: not a GGUF file or a model directory (no config.json)", path);
    if (!rc) rc = index_tensors(mf, err);
    if (rc) {
        pt_model_file_close(mf);
        return -1;
    }
    *out = mf;
    return 0;
}

void pt_model_file_close(pt_model_file *mf) {
    if (!mf) return;
    mf_priv *p = mf->priv;
    for (int i = 0; p && i < p->n_shards; i++) {
        pt_safetensors_close(p->shards[i]);
        free(p->shard_names[i]);
    }
    if (p) {
        free(p->shards);
        free(p->shard_names);
        free(p->tensor_shard);
        free(p->by_name);
        free(p);
    }
    pt_gguf_close(mf->gguf);
    json_decref(mf->config);
    json_decref(mf->generation_config);
    json_decref(mf->tokenizer_config);
    free(mf->tokenizer_json);
    free(mf->tokenizer_gguf);
    free(mf->tensors);
    free(mf->path);
    free(mf);
}

static int cmp_name_key(const void *key, const void *elem) {
    return strcmp(key, (*(const pt_tensor_info *const *)elem)->name);
}

const pt_tensor_info *pt_model_file_tensor(const pt_model_file *mf, const char *name) {
    const mf_priv *p = mf->priv;
    const pt_tensor_info *const *t =
        bsearch(name, p->by_name, (size_t)mf->n_tensors, sizeof *p->by_name, cmp_name_key);
    return t ? *t : NULL;
}

size_t pt_model_file_bytes(const pt_model_file *mf) {
    size_t total = 0;
    for (int i = 0; i < mf->n_tensors; i++)
        total += mf->tensors[i].nbytes;
    return total;
}
