/*
 * weights.c - a family's weight table, and binding it to a file's tensors
 * by name.
 *
 * A family lists every weight once (model_int.h: pt_weight_spec) with its
 * GGUF and Hugging Face names, its shape in terms of the config, and the
 * config setting that makes it present.  This file resolves those specs
 * (dimensions, names, where a weight lands in pt_model / pt_layer) for
 * itself and dummy.c, binds them from a file, and maps names back to specs.
 *
 * Matrices stay in the file's dtype and, on a backend whose memory is host
 * memory, point straight into the mapping (zero copy), unless the backend
 * asks for another layout (q4_0 on AVX2: pt_model_repack_weight).  Vectors (norm
 * gains, biases) are small and converted to f32.
 *
 * Quantized matrices: GGUF block types (q8_0, q4_0, q4_k, q5_k, q6_k) bind
 * like any other dtype; an MLX affine matrix is three tensors, <m>.weight
 * (packed uint32 codes), <m>.scales and <m>.biases, with its bits and group
 * size from config.json's "quantization" (src/quant/mlx_config.c).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "backend/repack.h"
#include "base/progress.h"
#include "io/mmap_file.h"
#include "model/model_int.h"
#include "quant/mlx_config.h"
#include "quant/quant.h"

/* ---- Specs ------------------------------------------------------------------- */

int64_t pt_spec_dim(const pt_model_config *c, int d, int l) {
    switch (d) {
    case D_DIM: return c->dim;
    case D_Q: return (int64_t)c->n_heads * pt_config_layer_head_dim(c, l);
    case D_KV: return (int64_t)pt_config_layer_kv_heads(c, l) * pt_config_layer_head_dim(c, l);
    case D_FFN: return pt_config_layer_ffn(c, l);
    case D_VOCAB: return c->vocab_size;
    case D_HEAD: return pt_config_layer_head_dim(c, l);
    case D_PLE: return c->ple_dim;
    case D_PLE_ALL: return (int64_t)c->ple_dim * c->n_layers;
    case D_ROT2: return c->n_rot / 2;
    case D_EFFN2: return 2 * (int64_t)c->expert_ffn_dim;
    case D_EXPERTS: return c->n_experts;
    case D_EFFN: return c->expert_ffn_dim;
    case D_HEADS: return c->n_heads;
    case D_Q2: return 2 * (int64_t)c->n_heads * c->head_dim;
    case D_SFFN: return c->shared_ffn_dim;
    case D_ONE: return 1;
    case D_LQKVZ:
        return 2 * ((int64_t)c->lin_k_heads * c->lin_k_dim + (int64_t)c->lin_v_heads * c->lin_v_dim);
    case D_LBA: return 2 * (int64_t)c->lin_v_heads;
    case D_LV: return (int64_t)c->lin_v_heads * c->lin_v_dim;
    case D_LVHEADS: return c->lin_v_heads;
    case D_LVDIM: return c->lin_v_dim;
    case D_LCONV:
        return (2 * (int64_t)c->lin_k_heads * c->lin_k_dim + (int64_t)c->lin_v_heads * c->lin_v_dim) *
               c->lin_conv_kernel;
    case D_LQKV:
        return 2 * (int64_t)c->lin_k_heads * c->lin_k_dim + (int64_t)c->lin_v_heads * c->lin_v_dim;
    case D_QLORA: return c->q_lora_rank;
    case D_KVLORA: return c->kv_lora_rank;
    case D_KVA: return (int64_t)c->kv_lora_rank + c->n_rot;
    case D_NOPE: return c->head_dim - c->n_rot;
    case D_VHEAD: return c->v_head_dim;
    case D_OV: return (int64_t)c->n_heads * c->v_head_dim;
    default: return 0;
    }
}

bool pt_spec_needed(const pt_model_config *c, int need, int layer) {
    switch (need) {
    case NEED_ATTN: return !pt_config_layer_recurrent(c, layer);
    case NEED_RECURRENT: return pt_config_layer_recurrent(c, layer);
    case NEED_SHARED: return c->shared_ffn_dim > 0;
    case NEED_QKV_BIAS: return c->qkv_bias;
    case NEED_O_BIAS: return c->o_bias;
    case NEED_QK_NORM: return c->qk_norm;
    case NEED_UNTIED: return !c->tied_embeddings;
    case NEED_Q_LORA: return c->q_lora_rank > 0;
    case NEED_Q_DIRECT: return c->q_lora_rank <= 0;
    case NEED_DENSE: return layer < c->n_dense_lead || c->n_experts <= 0;
    case NEED_MOE: return layer >= c->n_dense_lead && c->n_experts > 0;
    case NEED_MOE_SHARED: return c->shared_ffn_dim > 0 && layer >= c->n_dense_lead && c->n_experts > 0;
    case NEED_KV_B_SPLIT: return !c->kv_b_fused;
    case NEED_ROUTER_BIAS: return c->router_bias && layer >= c->n_dense_lead && c->n_experts > 0;
    case NEED_OWN_KV: return pt_config_layer_own_kv(c, layer);
    case NEED_V:
        return pt_config_layer_own_kv(c, layer) && !(c->v_from_k[layer / 64] >> (layer % 64) & 1);
    case NEED_PLE: return c->ple_dim > 0;
    case NEED_ROPE_FREQS: return c->rope_freq_factors;
    case NEED_OPTIONAL: return false;
    case NEED_EXPS_SPLIT:
        return c->n_experts > 0 && !(c->experts_fused[layer / 64] >> (layer % 64) & 1);
    case NEED_EXPS_FUSED:
        return c->n_experts > 0 && (c->experts_fused[layer / 64] >> (layer % 64) & 1);
    default: return true;
    }
}

/* A per-expert name gets expert 0 (its second %d). */
void pt_spec_name(const pt_weight_spec *s, bool gguf, int layer, char *buf, size_t cap) {
    snprintf(buf, cap, gguf ? s->gguf : s->hf, layer, 0);
}

/* Whether s is one Hugging Face tensor per expert (two %d in its name). */
static bool per_expert_names(const pt_weight_spec *s) {
    const char *d = s->hf ? strstr(s->hf, "%d") : NULL;
    return s->experts == D_EXPERTS && d && strstr(d + 2, "%d");
}

void *pt_spec_target(pt_model *m, const pt_weight_spec *s, int layer) {
    return (char *)(s->per_layer ? (void *)&m->layers[layer] : (void *)m) + s->off;
}

pt_weight pt_weight_expert_rows(const pt_weight *w, int64_t first, int64_t rows) {
    pt_weight v = *w;
    size_t row_bytes = pt_dtype_bytes(w->dtype, (uint64_t)w->cols);
    v.data = (const char *)w->data + (size_t)first * row_bytes;
    v.rows = rows;
    v.nbytes = w->nbytes / (size_t)(w->rows / rows);
    return v;
}

/* ---- From a file ---------------------------------------------------------- */

/* Converts a vector tensor to f32 and places it in backend memory. */
static int bind_vector(pt_model *m, const pt_tensor_info *t, int64_t n, const float **out,
                       pt_err *err) {
    int64_t count = 1;
    for (int i = 0; i < t->ndim; i++) count *= t->shape[i];
    if (count != n)
        return pt_fail(err, "tensor %s: expected %lld elements, file has %lld", t->name,
                       (long long)n, (long long)count);
    float *host = pt_xmalloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) {
        const uint8_t *p = t->data;
        uint16_t h;
        switch (t->dtype) {
        case PT_F32: memcpy(&host[i], p + 4 * i, 4); break;
        case PT_F16: memcpy(&h, p + 2 * i, 2); host[i] = pt_f16_to_f32(h); break;
        case PT_BF16: memcpy(&h, p + 2 * i, 2); host[i] = pt_bf16_to_f32(h); break;
        default:
            free(host);
            return pt_fail(err, "tensor %s: vector of type %s is not supported", t->name,
                           pt_dtype_name(t->dtype));
        }
    }
    float *dev = pt_model_alloc(m, sizeof(float) * (size_t)n);
    if (!dev) {
        free(host);
        return pt_fail(err, "out of backend memory for tensor %s", t->name);
    }
    m->be->ops->upload(m->be, dev, host, sizeof(float) * (size_t)n);
    free(host);
    *out = dev;
    return 0;
}

static bool matrix_dtype_ok(pt_dtype t) {
    static const pt_dtype ok[] = {PT_F32, PT_F16, PT_BF16, PT_Q8_0, PT_Q4_0, PT_Q4_K, PT_Q5_K, PT_Q6_K};
    for (size_t i = 0; i < PT_ARRAY_LEN(ok); i++)
        if (ok[i] == t) return true;
    return false;
}

/* Places a tensor's bytes in backend memory (or points into the mapping). */
static const void *bind_bytes(pt_model *m, const pt_tensor_info *t, pt_err *err) {
    if (m->progress) pt_progress_add(m->progress, t->nbytes);
    if (m->be->host_memory) return t->data;
    void *dev = pt_model_alloc(m, t->nbytes);
    if (!dev) {
        pt_fail(err, "out of backend memory for tensor %s", t->name);
        return NULL;
    }
    m->be->ops->upload(m->be, dev, t->data, t->nbytes);
    return dev;
}

static bool is_scale_dtype(pt_dtype t) {
    return t == PT_F16 || t == PT_BF16 || t == PT_F32;
}

/* An MLX affine matrix: <module>.weight holds rows x (cols * bits / 32)
 * uint32 codes; <module>.scales and .biases rows x (cols / group_size).
 * Checks their shapes and describes them in *w with pointers into the
 * file's mapping (host memory). */
int pt_model_file_affine(pt_model *m, const pt_tensor_info *t, const pt_tensor_info *sc,
                         int64_t rows, int64_t cols, pt_weight *w, pt_err *err) {
    char module[160];
    snprintf(module, sizeof module, "%.*s", (int)(strlen(t->name) - strlen(".weight")), t->name);
    int bits, gs;
    if (pt_mlx_module_params(m->file->config, module, &bits, &gs, err)) return -1;
    char bname[176];
    snprintf(bname, sizeof bname, "%s.biases", module);
    const pt_tensor_info *bi = pt_model_file_tensor(m->file, bname);
    if (!bi) return pt_fail(err, "%s: has scales but no biases (%s)", module, bname);
    if (cols % gs)
        return pt_fail(err, "%s: %lld columns is not a multiple of group size %d", module,
                       (long long)cols, gs);
    int64_t words = cols * bits / 32, groups = cols / gs;
    if (t->dtype != PT_U32 || t->ndim != 2 || t->shape[0] != rows || t->shape[1] != words)
        return pt_fail(err, "tensor %s: expected %lldx%lld u32 (%lldx%lld at %d bits), file has "
                            "%s %lldx%lld",
                       t->name, (long long)rows, (long long)words, (long long)rows, (long long)cols,
                       bits, pt_dtype_name(t->dtype), (long long)t->shape[0],
                       (long long)(t->ndim > 1 ? t->shape[1] : 1));
    const pt_tensor_info *sb[2] = {sc, bi};
    for (int i = 0; i < 2; i++)
        if (!is_scale_dtype(sb[i]->dtype) || sb[i]->dtype != sc->dtype || sb[i]->ndim != 2 ||
            sb[i]->shape[0] != rows || sb[i]->shape[1] != groups)
            return pt_fail(err, "tensor %s: expected %lldx%lld %s (group size %d), file has %s "
                                "%lldx%lld",
                           sb[i]->name, (long long)rows, (long long)groups,
                           pt_dtype_name(sc->dtype), gs, pt_dtype_name(sb[i]->dtype),
                           (long long)sb[i]->shape[0],
                           (long long)(sb[i]->ndim > 1 ? sb[i]->shape[1] : 1));
    *w = (pt_weight){.dtype = PT_AFFINE, .rows = rows, .cols = cols, .bits = bits,
                     .group_size = gs, .scale_dtype = sc->dtype, .data = t->data,
                     .scales = sc->data, .biases = bi->data,
                     .nbytes = t->nbytes + sc->nbytes + bi->nbytes};
    return 0;
}

static int bind_affine(pt_model *m, const pt_tensor_info *t, const pt_tensor_info *sc,
                       int64_t rows, int64_t cols, pt_weight *w, pt_err *err) {
    if (pt_model_file_affine(m, t, sc, rows, cols, w, err)) return -1;
    char bname[176];
    snprintf(bname, sizeof bname, "%.*s.biases", (int)(strlen(t->name) - strlen(".weight")),
             t->name);
    const pt_tensor_info *bi = pt_model_file_tensor(m->file, bname);
    if (!(w->data = bind_bytes(m, t, err)) || !(w->scales = bind_bytes(m, sc, err)) ||
        !(w->biases = bind_bytes(m, bi, err)))
        return -1;
    m->weight_bytes += w->nbytes;
    return 0;
}

int pt_model_repack_weight(pt_model *m, pt_weight *w, bool owned, pt_err *err) {
    const pt_backend_ops *ops = m->be->ops;
    if (!ops->weight_layout || w->n_experts || w->layout != PT_LAYOUT_FILE || m->keep_layout)
        return 0;
    if (!m->be->host_memory) { /* in backend memory already: rearranged there, in place */
        pt_be_repack_weight(m->be, w);
        return 0;
    }
    int layout = ops->weight_layout(m->be, w);
    if (layout == PT_LAYOUT_FILE) return 0;
    void *dst = owned ? pt_alloc_big(w->nbytes) : pt_model_alloc(m, w->nbytes);
    if (!dst) return pt_fail(err, "cannot allocate %.1f MiB to repack a %lldx%lld %s matrix",
                             w->nbytes / 1048576.0, (long long)w->rows, (long long)w->cols,
                             pt_dtype_name(w->dtype));
    pt_weight_repack(layout, dst, w);
    if (owned) {
        memcpy((void *)w->data, dst, w->nbytes);
        pt_free_big(dst, w->nbytes);
    } else { /* the mapping's pages were read once: keep resident memory at one copy */
        pt_mmap_release(w->data, w->nbytes);
        w->data = dst;
    }
    w->layout = layout;
    return 0;
}

/* A plain matrix [rows][cols], or with n_experts > 0 a 3-D stack of them
 * [n_experts][rows][cols] in one tensor (experts one after another). */
static int bind_matrix(pt_model *m, const pt_tensor_info *t, int64_t n_experts, int64_t rows,
                       int64_t cols, pt_weight *w, pt_err *err) {
    if (n_experts && (t->ndim != 3 || t->shape[0] != n_experts || t->shape[1] != rows ||
                      t->shape[2] != cols))
        return pt_fail(err, "tensor %s: expected %lldx%lldx%lld (experts x rows x cols), file "
                            "has a %d-D tensor",
                       t->name, (long long)n_experts, (long long)rows, (long long)cols, t->ndim);
    /* a one-row matrix may be stored as a vector (GGUF ffn_gate_inp_shexp) */
    bool row_vector = rows == 1 && t->ndim == 1 && t->shape[0] == cols;
    if (!n_experts && !row_vector && (t->ndim != 2 || t->shape[0] != rows || t->shape[1] != cols))
        return pt_fail(err, "tensor %s: expected %lldx%lld, file has %s%lldx%lld", t->name,
                       (long long)rows, (long long)cols, t->ndim == 2 ? "" : "a non-matrix ",
                       (long long)t->shape[0], (long long)(t->ndim > 1 ? t->shape[1] : 1));
    if (!matrix_dtype_ok(t->dtype))
        return pt_fail(err, "tensor %s: weight type %s is not supported", t->name,
                       pt_dtype_name(t->dtype));
    if (cols % pt_dtype_get(t->dtype)->block)
        return pt_fail(err, "tensor %s: %lld columns is not a whole number of %s blocks", t->name,
                       (long long)cols, pt_dtype_name(t->dtype));
    w->dtype = t->dtype;
    w->rows = rows;
    w->cols = cols;
    w->nbytes = t->nbytes;
    w->n_experts = (int)n_experts;
    w->expert_stride = n_experts ? t->nbytes / (size_t)n_experts : 0;
    if (!(w->data = bind_bytes(m, t, err))) return -1;
    m->weight_bytes += t->nbytes;
    return pt_model_repack_weight(m, w, false, err);
}

/* Expert e's MLX affine parts beside its codes t: the module's bits and
 * group size, and its scales and biases (checked against the shape). */
static int expert_affine(pt_model *m, const pt_tensor_info *t, int64_t rows, int64_t cols,
                         const pt_tensor_info **sb, int *bits, int *gs, pt_err *err) {
    char module[192], name[208];
    snprintf(module, sizeof module, "%.*s", (int)(strlen(t->name) - strlen(".weight")), t->name);
    if (pt_mlx_module_params(m->file->config, module, bits, gs, err)) return -1;
    static const char *const part[2] = {"scales", "biases"};
    for (int i = 0; i < 2; i++) {
        snprintf(name, sizeof name, "%s.%s", module, part[i]);
        sb[i] = pt_model_file_tensor(m->file, name);
        if (!sb[i] || !is_scale_dtype(sb[i]->dtype) || sb[i]->ndim != 2 || sb[i]->shape[0] != rows ||
            cols % *gs || sb[i]->shape[1] != cols / *gs)
            return pt_fail(err, "%s: missing or misshapen (expected %lldx%lld at group size %d)",
                           name, (long long)rows, (long long)(cols / *gs), *gs);
    }
    if (t->dtype != PT_U32 || t->ndim != 2 || t->shape[0] != rows ||
        t->shape[1] != cols * *bits / 32 || sb[1]->dtype != sb[0]->dtype)
        return pt_fail(err, "tensor %s: expected %lldx%lld u32 codes (%d bits)", t->name,
                       (long long)rows, (long long)(cols * *bits / 32), *bits);
    return 0;
}

/* Experts saved one tensor each (Hub MoE checkpoints: ...experts.<e>.
 * gate_proj.weight), plain or MLX affine, gathered into one stack
 * [n_experts][rows][cols] in backend memory (codes, and scales and biases
 * likewise): expert matmuls take a stack.  Every expert must share the
 * first one's format. */
static int bind_expert_list(pt_model *m, const pt_weight_spec *s, int layer, int64_t n_experts,
                            int64_t rows, int64_t cols, pt_weight *w, pt_err *err) {
    char name[192];
    char *dev[3] = {NULL, NULL, NULL}; /* codes, scales, biases */
    for (int64_t e = 0; e < n_experts; e++) {
        snprintf(name, sizeof name, s->hf, layer, (int)e);
        const pt_tensor_info *t = pt_model_file_tensor(m->file, name), *sb[2] = {NULL, NULL};
        if (!t) return pt_fail(err, "%s: missing tensor %s", m->file->path, name);
        char sname[208];
        snprintf(sname, sizeof sname, "%.*s.scales", (int)(strlen(name) - strlen(".weight")), name);
        bool affine = pt_model_file_tensor(m->file, sname) != NULL;
        int bits = 0, gs = 0;
        if (affine ? expert_affine(m, t, rows, cols, sb, &bits, &gs, err) != 0
                   : (t->ndim != 2 || t->shape[0] != rows || t->shape[1] != cols))
            return affine ? -1
                          : pt_fail(err, "tensor %s: expected %lldx%lld, file has a %d-D tensor",
                                    name, (long long)rows, (long long)cols, t->ndim);
        pt_dtype dt = affine ? PT_AFFINE : t->dtype;
        if (e == 0) {
            if (!affine && !matrix_dtype_ok(t->dtype))
                return pt_fail(err, "tensor %s: weight type %s is not supported", name,
                               pt_dtype_name(t->dtype));
            *w = (pt_weight){.dtype = dt, .rows = rows, .cols = cols, .bits = bits,
                             .group_size = gs, .scale_dtype = affine ? sb[0]->dtype : PT_F32,
                             .n_experts = (int)n_experts, .expert_stride = t->nbytes};
            size_t sizes[3] = {t->nbytes, affine ? sb[0]->nbytes : 0, affine ? sb[1]->nbytes : 0};
            for (int i = 0; i < 3 && sizes[i]; i++)
                if (!(dev[i] = pt_model_alloc(m, sizes[i] * (size_t)n_experts)))
                    return pt_fail(err, "out of backend memory for the experts of %s", name);
            w->data = dev[0], w->scales = dev[1], w->biases = dev[2];
            w->nbytes = (sizes[0] + sizes[1] + sizes[2]) * (size_t)n_experts;
        } else if (dt != w->dtype || t->nbytes != w->expert_stride || bits != w->bits ||
                   gs != w->group_size || (affine && sb[0]->dtype != w->scale_dtype)) {
            return pt_fail(err, "tensor %s: stored unlike expert 0 (%s)", name,
                           pt_dtype_name(w->dtype));
        }
        m->be->ops->upload(m->be, dev[0] + (size_t)e * t->nbytes, t->data, t->nbytes);
        for (int i = 0; affine && i < 2; i++)
            m->be->ops->upload(m->be, dev[1 + i] + (size_t)e * sb[i]->nbytes, sb[i]->data,
                               sb[i]->nbytes);
    }
    m->weight_bytes += w->nbytes;
    return 0;
}

/* mlx-lm's name for a per-expert spec: the experts of one projection as
 * one 3-D tensor, "...mlp.experts.%d.gate_proj" -> "...mlp.switch_mlp.
 * gate_proj" (its MoE checkpoints, quantized or not). */
static bool switch_mlp_name(const pt_weight_spec *s, int layer, char *out, size_t cap) {
    const char *e = strstr(s->hf, "experts.%d.");
    if (!e) return false;
    char fmt[192];
    snprintf(fmt, sizeof fmt, "%.*sswitch_mlp.%s", (int)(e - s->hf), s->hf, e + strlen("experts.%d."));
    snprintf(out, cap, fmt, layer);
    return true;
}

/* A 3-D MLX affine stack: codes [E][rows][cols * bits / 32] u32, scales
 * and biases [E][rows][cols / group_size]; zero copy on host memory. */
static int bind_affine_stack(pt_model *m, const pt_tensor_info *t, int64_t n_experts, int64_t rows,
                             int64_t cols, pt_weight *w, pt_err *err) {
    char module[192], name[208];
    snprintf(module, sizeof module, "%.*s", (int)(strlen(t->name) - strlen(".weight")), t->name);
    int bits, gs;
    if (pt_mlx_module_params(m->file->config, module, &bits, &gs, err)) return -1;
    const pt_tensor_info *sb[2];
    static const char *const part[2] = {"scales", "biases"};
    for (int i = 0; i < 2; i++) {
        snprintf(name, sizeof name, "%s.%s", module, part[i]);
        sb[i] = pt_model_file_tensor(m->file, name);
        if (!sb[i] || !is_scale_dtype(sb[i]->dtype) || sb[i]->dtype != sb[0]->dtype ||
            sb[i]->ndim != 3 || sb[i]->shape[0] != n_experts || sb[i]->shape[1] != rows ||
            cols % gs || sb[i]->shape[2] != cols / gs)
            return pt_fail(err, "%s: missing or misshapen (expected %lldx%lldx%lld)", name,
                           (long long)n_experts, (long long)rows, (long long)(cols / gs));
    }
    if (t->dtype != PT_U32 || t->ndim != 3 || t->shape[0] != n_experts || t->shape[1] != rows ||
        t->shape[2] != cols * bits / 32)
        return pt_fail(err, "tensor %s: expected %lldx%lldx%lld u32 codes (%d bits)", t->name,
                       (long long)n_experts, (long long)rows, (long long)(cols * bits / 32), bits);
    *w = (pt_weight){.dtype = PT_AFFINE, .rows = rows, .cols = cols, .bits = bits,
                     .group_size = gs, .scale_dtype = sb[0]->dtype, .n_experts = (int)n_experts,
                     .expert_stride = t->nbytes / (size_t)n_experts};
    if (!(w->data = bind_bytes(m, t, err)) || !(w->scales = bind_bytes(m, sb[0], err)) ||
        !(w->biases = bind_bytes(m, sb[1], err)))
        return -1;
    w->nbytes = t->nbytes + sb[0]->nbytes + sb[1]->nbytes;
    m->weight_bytes += w->nbytes;
    return 0;
}

/* A per-expert spec from a file: one tensor per expert (Hub), or mlx-lm's
 * switch_mlp stack. */
static int bind_experts(pt_model *m, const pt_weight_spec *s, int layer, pt_err *err) {
    const pt_model_config *c = &m->cfg;
    int64_t E = pt_spec_dim(c, s->experts, layer), rows = pt_spec_dim(c, s->rows, layer),
            cols = pt_spec_dim(c, s->cols, layer);
    pt_weight *w = pt_spec_target(m, s, layer);
    char name[208], sname[224];
    const pt_tensor_info *t = NULL;
    if (switch_mlp_name(s, layer, name, sizeof name)) t = pt_model_file_tensor(m->file, name);
    if (!t) return bind_expert_list(m, s, layer, E, rows, cols, w, err);
    snprintf(sname, sizeof sname, "%.*s.scales", (int)(strlen(name) - strlen(".weight")), name);
    if (pt_model_file_tensor(m->file, sname)) return bind_affine_stack(m, t, E, rows, cols, w, err);
    return bind_matrix(m, t, E, rows, cols, w, err);
}

static int bind_one(pt_model *m, const pt_weight_spec *s, int layer, pt_err *err) {
    const pt_model_config *c = &m->cfg;
    bool gguf = m->file->kind == PT_FILE_GGUF;
    if (!gguf && per_expert_names(s)) /* a dense layer of a MoE model has none */
        return pt_spec_needed(c, s->need, layer) ? bind_experts(m, s, layer, err) : 0;
    if (!(gguf ? s->gguf : s->hf)) { /* a weight files of this kind do not name */
        if (!pt_spec_needed(c, s->need, layer)) return 0;
        return pt_fail(err, "%s: %s needs a weight (%s) that %s files do not name", m->file->path,
                       c->arch, s->gguf ? s->gguf : s->hf, gguf ? "GGUF" : "Hugging Face");
    }
    char name[160];
    pt_spec_name(s, gguf, layer, name, sizeof name);
    const pt_tensor_info *t = pt_model_file_tensor(m->file, name);
    if (!t) {
        if (!pt_spec_needed(c, s->need, layer)) return 0;
        return pt_fail(err, "%s: missing tensor %s", m->file->path, name);
    }
    if (!pt_spec_needed(c, s->need, layer) && s->need != NEED_UNTIED && s->need != NEED_OPTIONAL)
        return 0; /* e.g. unused bias */
    int64_t rows = pt_spec_dim(c, s->rows, layer), cols = pt_spec_dim(c, s->cols, layer);
    int64_t n_experts = pt_spec_dim(c, s->experts, layer);
    if (s->cols == D_NONE) return bind_vector(m, t, rows, pt_spec_target(m, s, layer), err);
    pt_weight *w = pt_spec_target(m, s, layer);
    if (!gguf) { /* MLX affine: a "<module>.scales" beside "<module>.weight" */
        char sname[176];
        snprintf(sname, sizeof sname, "%.*s.scales", (int)(strlen(name) - strlen(".weight")), name);
        const pt_tensor_info *sc = pt_model_file_tensor(m->file, sname);
        if (sc && n_experts)
            return pt_fail(err, "tensor %s: MLX-quantized expert stacks are not supported yet",
                           name);
        if (sc) return bind_affine(m, t, sc, rows, cols, w, err);
    }
    return bind_matrix(m, t, n_experts, rows, cols, w, err);
}

/* Progress counts the file's tensor bytes: on a host-memory backend they
 * are only mapped (fast), on a device each is uploaded. */
int pt_model_bind_file_weights(pt_model *m, pt_err *err) {
    const pt_family *f = m->family;
    uint64_t total = 0;
    for (int i = 0; i < m->file->n_tensors; i++)
        total += m->file->tensors[i].nbytes;
    pt_progress progress;
    pt_progress_begin(&progress, "loading weights", total);
    m->progress = &progress;
    int rc = 0;
    for (size_t i = 0; i < f->n_weights && !rc; i++) {
        int n = f->weights[i].per_layer ? m->cfg.n_layers : 1;
        for (int l = 0; l < n && !rc; l++)
            rc = bind_one(m, &f->weights[i], l, err);
    }
    m->progress = NULL;
    if (rc) return -1;
    pt_progress_end(&progress);
    if (!m->output.data) m->output = m->tok_embd; /* tied */
    return 0;
}

/* ---- Names ---------------------------------------------------------------- */

/* Matches name against a spec's pattern (one %d, the layer). */
static bool spec_match(const char *pattern, const char *name, int *layer) {
    const char *d = strstr(pattern, "%d");
    if (!d) return strcmp(pattern, name) == 0 && (*layer = 0, true);
    size_t pre = (size_t)(d - pattern);
    if (strncmp(pattern, name, pre) != 0) return false;
    char *end;
    long l = strtol(name + pre, &end, 10);
    if (end == name + pre || l < 0 || l > 100000 || strcmp(end, d + 2) != 0) return false;
    *layer = (int)l;
    return true;
}

/* The spec of family f called name (either spelling), or NULL. */
static const pt_weight_spec *spec_named(const pt_family *f, const char *name, int *layer,
                                        bool *gguf) {
    for (size_t i = 0; i < f->n_weights; i++) {
        const pt_weight_spec *s = &f->weights[i];
        if (spec_match(s->gguf, name, layer)) return *gguf = true, s;
        if (s->hf && spec_match(s->hf, name, layer)) return *gguf = false, s;
    }
    return NULL;
}

/* GGUF names do not say the family; the first family that knows one wins
 * (the names are the same in every family that shares them). */
int pt_weight_hf_name(const char *gguf_name, char *out, size_t cap) {
    int layer;
    bool gguf;
    for (size_t f = 0; f < pt_n_families; f++) {
        const pt_weight_spec *s = spec_named(pt_families[f], gguf_name, &layer, &gguf);
        if (s && gguf && s->hf) {
            pt_spec_name(s, false, layer, out, cap);
            return 0;
        }
    }
    return -1;
}

pt_weight *pt_model_weight_named(pt_model *m, const char *name) {
    int layer;
    bool gguf;
    const pt_weight_spec *s = spec_named(m->family, name, &layer, &gguf);
    if (!s || s->cols == D_NONE || (s->per_layer && layer >= m->cfg.n_layers)) return NULL;
    return pt_spec_target(m, s, layer);
}
