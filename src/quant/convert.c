/*
 * convert.c - writing an MLX affine-quantized model directory (convert.h).
 *
 * For each source tensor: quantized ones become three tensors,
 *   <m>.weight  u32  [rows][cols * bits / 32]   codes, little-endian bit stream per row
 *   <m>.scales  S    [rows][cols / group_size]
 *   <m>.biases  S    [rows][cols / group_size]
 * and the rest are copied (GGUF block types expanded to f32).  Rows are
 * quantized in parallel on the pool; the safetensors writer takes each
 * tensor as soon as it is done, at its place in the file.
 *
 * The tokenizer comes along: a Hugging Face source's files are copied; a
 * GGUF source's tokenizer.* keys go, byte for byte, into tokenizer.gguf (a
 * GGUF file without tensors, which model_file.c finds when there is no
 * tokenizer.json), so the directory encodes exactly as its source did.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/gguf.h"
#include "io/safetensors.h"
#include "quant/convert.h"

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

bool pt_convert_quantizable(const pt_tensor_info *t, int group_size) {
    return t->ndim == 2 && ends_with(t->name, ".weight") && t->shape[1] % group_size == 0 &&
           t->shape[0] > 0;
}

int pt_convert_layer_of(const char *name) {
    const char *p = strstr(name, "layers.");
    return p ? atoi(p + 7) : -1;
}

void pt_convert_plan_mixed(pt_convert_tensor *t, int n, int n_layers, int high_bits) {
    for (int i = 0; i < n; i++) {
        if (!t[i].bits) continue;
        int l = pt_convert_layer_of(t[i].name);
        bool edge = l >= 0 && (l < n_layers / 8 || l >= 7 * n_layers / 8 ||
                               (l - n_layers / 8) % 3 == 2);
        bool sensitive = strstr(t[i].name, "v_proj") || strstr(t[i].name, "down_proj");
        if (l < 0 || (edge && sensitive)) t[i].bits = PT_MAX(t[i].bits, high_bits);
    }
}

void pt_convert_read_row(const pt_tensor_info *t, int64_t r, float *out) {
    pt_weight w = {.dtype = t->dtype, .rows = t->shape[0], .cols = t->ndim > 1 ? t->shape[1] : t->shape[0],
                   .data = t->data};
    pt_weight_dequantize_row(&w, r, out);
}

/* ---- quantizing one tensor on the pool ------------------------------------ */

typedef struct qjob {
    const pt_convert_tensor *t;
    pt_dtype sd;
    int64_t rows, cols;
    uint8_t *codes, *scales, *biases;
} qjob;

/* Source row of output row o: GGUF's rope pairs (2i, 2i+1) of a head become
 * Hugging Face's (i, i + head_dim / 2). */
static int64_t source_row(const pt_convert_tensor *t, int64_t o) {
    int hd = t->rope_head_dim;
    if (hd <= 0) return o;
    int64_t h = o / hd, j = o % hd;
    return h * hd + (j < hd / 2 ? 2 * j : 2 * (j - hd / 2) + 1);
}

static void quant_rows(void *ctx, int ith, int nth) {
    qjob *j = ctx;
    int64_t r0 = j->rows * ith / nth, r1 = j->rows * (ith + 1) / nth;
    int bits = j->t->bits, gs = j->t->group_size;
    size_t words = (size_t)pt_affine_row_words(j->cols, bits), groups = (size_t)(j->cols / gs);
    size_t ss = pt_dtype_bytes(j->sd, 1);
    float *row = pt_xmalloc(sizeof(float) * (size_t)j->cols);
    for (int64_t r = r0; r < r1; r++) {
        pt_convert_read_row(j->t->src, source_row(j->t, r), row);
        pt_affine_quantize_row(row, j->cols, bits, gs, j->sd, (uint32_t *)j->codes + (size_t)r * words,
                               j->scales + (size_t)r * groups * ss, j->biases + (size_t)r * groups * ss);
    }
    free(row);
}

static bool float_dtype(pt_dtype t) {
    return t == PT_F32 || t == PT_F16 || t == PT_BF16;
}

/* ---- the file ---------------------------------------------------------------- */

/* Header entries: 3 per quantized tensor, 1 per copied one.  first[i] is
 * the index of tensor i's first entry. */
static pt_st_entry *make_entries(const pt_convert_tensor *t, int n, pt_dtype sd, int *first,
                                 int *n_entries, char ***names) {
    pt_st_entry *e = pt_xcalloc((size_t)n * 3 + 1, sizeof *e);
    *names = pt_xcalloc((size_t)n * 3 + 1, sizeof(char *));
    int k = 0;
    for (int i = 0; i < n; i++) {
        const pt_tensor_info *s = t[i].src;
        first[i] = k;
        if (!t[i].bits) {
            e[k] = (pt_st_entry){.name = t[i].name, .dtype = float_dtype(s->dtype) ? s->dtype : PT_F32,
                                 .ndim = s->ndim};
            memcpy(e[k].shape, s->shape, sizeof s->shape);
            k++;
            continue;
        }
        size_t base = strlen(t[i].name) - strlen(".weight");
        static const char *const suffix[3] = {".weight", ".scales", ".biases"};
        for (int q = 0; q < 3; q++) {
            char *nm = pt_xmalloc(base + 8);
            snprintf(nm, base + 8, "%.*s%s", (int)base, t[i].name, suffix[q]);
            (*names)[k] = nm;
            e[k] = (pt_st_entry){.name = nm, .dtype = q ? sd : PT_U32, .ndim = 2,
                                 .shape = {s->shape[0], q ? s->shape[1] / t[i].group_size
                                                          : s->shape[1] * t[i].bits / 32}};
            k++;
        }
    }
    *n_entries = k;
    return e;
}

static int write_copied(pt_st_writer *w, int entry, const pt_convert_tensor *t, pt_err *err) {
    const pt_tensor_info *s = t->src;
    if (float_dtype(s->dtype)) return pt_st_writer_put(w, entry, 0, s->data, s->nbytes, err);
    int64_t rows = s->ndim > 1 ? s->shape[0] : 1, cols = s->ndim > 1 ? s->shape[1] : s->shape[0];
    float *row = pt_xmalloc(sizeof(float) * (size_t)cols);
    int rc = 0;
    for (int64_t r = 0; r < rows && !rc; r++) {
        pt_convert_read_row(s, r, row);
        rc = pt_st_writer_put(w, entry, (size_t)r * (size_t)cols * 4, row, (size_t)cols * 4, err);
    }
    free(row);
    return rc;
}

static int write_quantized(pt_st_writer *w, int entry, const pt_convert_tensor *t, pt_dtype sd,
                           pt_pool *pool, size_t *out_bytes, pt_err *err) {
    const pt_tensor_info *s = t->src;
    qjob j = {.t = t, .sd = sd, .rows = s->shape[0], .cols = s->shape[1]};
    size_t cb = pt_affine_code_bytes(j.rows, j.cols, t->bits);
    size_t sb = pt_affine_scale_bytes(j.rows, j.cols, t->group_size, sd);
    j.codes = pt_alloc_big(cb);
    j.scales = pt_xmalloc(sb);
    j.biases = pt_xmalloc(sb);
    if (!j.codes) {
        free(j.scales), free(j.biases);
        return pt_fail(err, "%s: cannot allocate %zu bytes", t->name, cb);
    }
    if (pool) pt_pool_run(pool, quant_rows, &j);
    else quant_rows(&j, 0, 1);
    int rc = pt_st_writer_put(w, entry, 0, j.codes, cb, err) ||
             pt_st_writer_put(w, entry + 1, 0, j.scales, sb, err) ||
             pt_st_writer_put(w, entry + 2, 0, j.biases, sb, err);
    *out_bytes = cb + 2 * sb;
    pt_free_big(j.codes, cb);
    free(j.scales), free(j.biases);
    return rc ? -1 : 0;
}

/* config.json: the source's, plus "quantization" (and the same object as
 * "quantization_config", as mlx-lm writes it): the defaults, an object for
 * each module whose bits or group differ, false for modules left whole. */
static json_t *quant_entry(const pt_convert_tensor *t, int n, const pt_convert_opts *o) {
    json_t *q = json_pack("{s:i, s:i, s:s}", "group_size", o->group_size, "bits", o->bits, "mode", "affine");
    for (int i = 0; i < n; i++) {
        char module[192];
        snprintf(module, sizeof module, "%.*s", (int)(strlen(t[i].name) - strlen(".weight")), t[i].name);
        if (t[i].bits && (t[i].bits != o->bits || t[i].group_size != o->group_size))
            json_object_set_new(q, module, json_pack("{s:i, s:i}", "group_size", t[i].group_size,
                                                     "bits", t[i].bits));
        else if (!t[i].bits && pt_convert_quantizable(t[i].src, o->group_size))
            json_object_set_new(q, module, json_false());
    }
    return q;
}

static int write_config(const char *dst, const json_t *config, const pt_convert_tensor *t, int n,
                        const pt_convert_opts *o, pt_err *err) {
    json_t *c = json_deep_copy(config);
    json_t *q = quant_entry(t, n, o);
    json_object_set(c, "quantization", q);
    json_object_set_new(c, "quantization_config", q);
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dst);
    int rc = json_dump_file(c, path, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(c);
    return rc ? pt_fail(err, "%s: cannot write", path) : 0;
}

int pt_convert_write(const char *dst, const json_t *config, const pt_convert_tensor *t, int n,
                     const pt_convert_opts *o, pt_convert_stats *st, pt_err *err) {
    memset(st, 0, sizeof *st);
    int *first = pt_xmalloc(sizeof(int) * (size_t)(n ? n : 1)), n_entries;
    char **names;
    pt_st_entry *e = make_entries(t, n, o->scale_dtype, first, &n_entries, &names);
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", dst);
    json_t *meta = json_pack("{s:s}", "format", "mlx");
    pt_st_writer *w;
    int rc = pt_st_writer_open(&w, path, e, n_entries, meta, err);
    json_decref(meta);
    size_t total = 0, done = 0;
    for (int i = 0; i < n; i++) total += t[i].src->nbytes;
    double qbits = 0;
    for (int i = 0; i < n && !rc; i++) {
        const pt_tensor_info *s = t[i].src;
        int64_t count = 1;
        for (int d = 0; d < s->ndim; d++) count *= s->shape[d];
        size_t out = 0;
        if (o->progress) o->progress(o->user, done, total, t[i].name);
        if (t[i].bits) {
            rc = write_quantized(w, first[i], &t[i], o->scale_dtype, o->pool, &out, err);
            st->quantized_params += count;
            qbits += 8.0 * (double)out;
        } else {
            rc = write_copied(w, first[i], &t[i], err);
            out = float_dtype(s->dtype) ? s->nbytes : (size_t)count * 4;
        }
        st->params += count;
        st->bytes_out += out;
        done += s->nbytes;
    }
    st->bytes_in = total;
    st->quantized_bpw = st->quantized_params ? qbits / (double)st->quantized_params : 0;
    if (o->progress && !rc) o->progress(o->user, total, total, "");
    if (!rc) rc = pt_st_writer_close(w, err);
    else if (w) pt_st_writer_abort(w);
    if (!rc) rc = write_config(dst, config, t, n, o, err);
    for (int i = 0; i < n_entries; i++) free(names[i]);
    free(names), free(e), free(first);
    return rc;
}

/* ---- the other files ----------------------------------------------------------- */

static bool is_weights_or_config(const char *name) {
    return ends_with(name, ".safetensors") || ends_with(name, ".safetensors.index.json") ||
           ends_with(name, ".bin") || ends_with(name, ".pt") || ends_with(name, ".pth") ||
           ends_with(name, ".gguf") || strcmp(name, "config.json") == 0;
}

static int copy_file(const char *from, const char *to, pt_err *err) {
    int in = open(from, O_RDONLY | O_CLOEXEC), out = -1, rc = 0;
    if (in < 0) return pt_fail(err, "%s: %s", from, strerror(errno));
    out = open(to, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (out < 0) rc = pt_fail(err, "%s: %s", to, strerror(errno));
    char buf[1 << 16];
    ssize_t k;
    while (!rc && (k = read(in, buf, sizeof buf)) != 0) {
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 || write(out, buf, (size_t)k) != k) rc = pt_fail(err, "copying %s: %s", from, strerror(errno));
    }
    close(in);
    if (out >= 0) close(out);
    return rc;
}

int pt_convert_copy_files(const char *src_dir, const char *dst_dir, int *n_copied, pt_err *err) {
    *n_copied = 0;
    DIR *d = opendir(src_dir);
    if (!d) return pt_fail(err, "%s: %s", src_dir, strerror(errno));
    struct dirent *e;
    int rc = 0;
    while (!rc && (e = readdir(d)) != NULL) {
        char from[4096], to[4096];
        struct stat s;
        snprintf(from, sizeof from, "%s/%s", src_dir, e->d_name);
        if (e->d_name[0] == '.' || is_weights_or_config(e->d_name) || stat(from, &s) || !S_ISREG(s.st_mode))
            continue;
        snprintf(to, sizeof to, "%s/%s", dst_dir, e->d_name);
        if (!(rc = copy_file(from, to, err))) (*n_copied)++;
    }
    closedir(d);
    return rc;
}

/* ---- a GGUF source's tokenizer ------------------------------------------------------- */

static bool is_tokenizer_key(const pt_gguf *g, uint64_t i) {
    pt_gguf_str k;
    static const char prefix[] = "tokenizer.";
    return pt_gguf_kv_at(g, i, &k, NULL) && k.len > sizeof prefix - 1 &&
           memcmp(k.s, prefix, sizeof prefix - 1) == 0;
}

static int write_all(FILE *f, const void *p, size_t n) {
    return fwrite(p, 1, n, f) == n ? 0 : -1;
}

/* GGUF v3: header with no tensors, the records as the source has them,
 * padding to the default alignment where tensor data would start. */
static int write_tokenizer_gguf(const pt_gguf *g, const char *path, pt_err *err) {
    uint64_t n_kv = 0, n = pt_gguf_n_kv(g), zero = 0;
    for (uint64_t i = 0; i < n; i++) n_kv += is_tokenizer_key(g, i);
    FILE *f = fopen(path, "wb");
    if (!f) return pt_fail(err, "%s: %s", path, strerror(errno));
    uint32_t version = 3;
    int rc = write_all(f, "GGUF", 4) || write_all(f, &version, 4) || write_all(f, &zero, 8) ||
             write_all(f, &n_kv, 8);
    size_t at = 24;
    for (uint64_t i = 0; i < n && !rc; i++) {
        const void *rec;
        size_t len;
        if (!is_tokenizer_key(g, i) || !pt_gguf_kv_record(g, i, &rec, &len)) continue;
        rc = write_all(f, rec, len);
        at += len;
    }
    static const uint8_t pad[32];
    if (!rc && at % 32) rc = write_all(f, pad, 32 - at % 32);
    if (fclose(f) || rc) return pt_fail(err, "%s: cannot write: %s", path, strerror(errno));
    return 0;
}

/* tokenizer_config.json with the chat template, where HF tools (and the
 * server, for a directory) look for it. */
static int write_tokenizer_config(const pt_gguf *g, const char *path, pt_err *err) {
    pt_gguf_str t;
    if (!pt_gguf_get_str(g, "tokenizer.chat_template", &t)) return 0;
    json_t *tmpl = json_stringn(t.s, (size_t)t.len);
    if (!tmpl) {
        pt_warn("tokenizer.chat_template is not valid UTF-8; not carried over");
        return 0;
    }
    json_t *c = json_pack("{s:o}", "chat_template", tmpl);
    int rc = json_dump_file(c, path, JSON_INDENT(2));
    json_decref(c);
    return rc ? pt_fail(err, "%s: cannot write", path) : 0;
}

int pt_convert_write_gguf_tokenizer(const pt_gguf *g, const char *dst, bool *written, pt_err *err) {
    *written = false;
    pt_gguf_str model;
    if (!pt_gguf_get_str(g, "tokenizer.ggml.model", &model)) return 0; /* none to carry */
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.gguf", dst);
    if (write_tokenizer_gguf(g, path, err)) return -1;
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dst);
    if (write_tokenizer_config(g, path, err)) return -1;
    *written = true;
    return 0;
}
