/*
 * kv_codec.c - parsing --kv-quant, binding a codec to a head dim, and the
 * scalar encode/decode of rows for each kind (affine here; TurboQuant's
 * arithmetic lives in turboquant.c).
 */
#include "kv/kv_codec.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#define F16_MAX 65504.0f

/* ---- parsing ---------------------------------------------------------------- */

/* "k<b>v<b>" -> bits; -1 if malformed. */
static int parse_kv_bits(const char *s, int *kb, int *vb) {
    char *end;
    if (*s != 'k') return -1;
    long k = strtol(s + 1, &end, 10);
    if (end == s + 1 || *end != 'v') return -1;
    const char *v = end + 1;
    long vv = strtol(v, &end, 10);
    if (end == v || *end) return -1;
    *kb = (int)k, *vb = (int)vv;
    return 0;
}

/* spec is the whole --kv-quant value ("turbo" or "turbo:..."): errors quote
 * it whole, and the part in it that is wrong. */
static int parse_turbo(const char *spec, pt_kvq_spec *out, pt_err *err) {
    *out = (pt_kvq_spec){.kind = PT_KVQ_TURBO, .k_bits = 8, .v_bits = 3};
    char buf[64];
    snprintf(buf, sizeof buf, "%s", spec[5] ? spec + 6 : "");
    for (char *save = NULL, *part = strtok_r(buf, ":", &save); part;
         part = strtok_r(NULL, ":", &save)) {
        if (strcmp(part, "anydim") == 0)
            out->any_dim = true;
        else if (parse_kv_bits(part, &out->k_bits, &out->v_bits))
            return pt_fail(err,
                           "--kv-quant '%.64s': '%s' is neither k<bits>v<bits> (e.g. k8v3) nor "
                           "anydim",
                           spec, part);
    }
    if (!pt_tq_k_bits_ok(out->k_bits))
        return pt_fail(err, "--kv-quant '%.64s': key bits %d are not one of 2, 4, 5, 8", spec,
                       out->k_bits);
    if (!pt_tq_v_bits_ok(out->v_bits))
        return pt_fail(err, "--kv-quant '%.64s': value bits %d are not one of 2, 3, 4, 5, 8", spec,
                       out->v_bits);
    return 0;
}

int pt_kvq_parse(const char *s, pt_kvq_spec *out, pt_err *err) {
    memset(out, 0, sizeof *out);
    if (!s || !*s || strcmp(s, "none") == 0) return 0;
    if (strcmp(s, "8") == 0 || strcmp(s, "4") == 0) {
        *out = (pt_kvq_spec){.kind = PT_KVQ_AFFINE, .k_bits = s[0] - '0', .v_bits = s[0] - '0'};
        return 0;
    }
    if (strcmp(s, "turbo") == 0 || strncmp(s, "turbo:", 6) == 0) return parse_turbo(s, out, err);
    return pt_fail(err, "--kv-quant '%s': expected none, 8, 4 or turbo[:k<bits>v<bits>]", s);
}

const char *pt_kvq_name(const pt_kvq_spec *s, char *buf, size_t cap) {
    if (s->kind == PT_KVQ_AFFINE)
        snprintf(buf, cap, "affine%d", s->k_bits);
    else if (s->kind == PT_KVQ_TURBO)
        snprintf(buf, cap, "turbo-k%dv%d", s->k_bits, s->v_bits);
    else
        snprintf(buf, cap, "none");
    return buf;
}

/* ---- fp16 planes ----------------------------------------------------------------- */

/* Rows are byte-aligned: the fp16 planes go through memcpy. */
static void put_f16s(uint8_t *dst, const uint16_t *src, int n) {
    memcpy(dst, src, 2 * (size_t)n);
}

static void get_f16s(uint16_t *dst, const uint8_t *src, int n) {
    memcpy(dst, src, 2 * (size_t)n);
}

/* ---- affine ----------------------------------------------------------------------- */

/* The smallest half >= s (s >= 0, finite, below 65504). */
static uint16_t f16_up(float s) {
    uint16_t h = pt_f32_to_f16(s);
    return pt_f16_to_f32(h) < s ? (uint16_t)(h + 1) : h;
}

static float clamp_f16_range(float v) {
    return isnan(v) ? 0.0f : v < -F16_MAX ? -F16_MAX : v > F16_MAX ? F16_MAX : v;
}

/* One group: scale rounded up so that bias + max_code * scale reaches the
 * maximum, codes computed with the stored fp16 values so decode sees what
 * encode assumed.  A constant group gets scale 0 and decodes to its bias. */
static void affine_group(const float *x0, int n, int bits, int32_t *codes, uint16_t *s16,
                         uint16_t *b16) {
    float x[PT_TQ_GROUP] = {0}, mn, mx;
    int hi = (1 << bits) - 1;
    for (int i = 0; i < n; i++)
        x[i] = clamp_f16_range(x0[i]);
    mn = mx = x[0];
    for (int i = 1; i < n; i++) {
        mn = x[i] < mn ? x[i] : mn;
        mx = x[i] > mx ? x[i] : mx;
    }
    *b16 = pt_f32_to_f16(mn);
    *s16 = f16_up((mx - mn) / (float)hi);
    float b = pt_f16_to_f32(*b16), s = pt_f16_to_f32(*s16);
    for (int i = 0; i < n; i++) {
        float q = s > 0 ? rintf((x[i] - b) / s) : 0;
        codes[i] = q < 0 ? 0 : q > (float)hi ? hi : (int32_t)q;
    }
}

static void affine_encode(const pt_kv_codec *c, int bits, int codes_bytes, const float *x,
                          uint8_t *row) {
    int32_t q[PT_TQ_MAX_DIM];
    uint16_t s16[PT_TQ_MAX_DIM / 8], b16[PT_TQ_MAX_DIM / 8];
    for (int g = 0; g < c->n_groups; g++)
        affine_group(x + g * c->group, c->group, bits, q + g * c->group, &s16[g], &b16[g]);
    pt_tq_pack(q, c->head_dim, bits, row);
    put_f16s(row + codes_bytes, s16, c->n_groups);
    put_f16s(row + codes_bytes + 2 * c->n_groups, b16, c->n_groups);
}

static void affine_decode(const pt_kv_codec *c, int bits, int codes_bytes, const uint8_t *row,
                          float *x) {
    int32_t q[PT_TQ_MAX_DIM];
    uint16_t s16[PT_TQ_MAX_DIM / 8], b16[PT_TQ_MAX_DIM / 8];
    pt_tq_unpack(row, c->head_dim, bits, false, q);
    get_f16s(s16, row + codes_bytes, c->n_groups);
    get_f16s(b16, row + codes_bytes + 2 * c->n_groups, c->n_groups);
    for (int i = 0; i < c->head_dim; i++) {
        int g = i / c->group;
        x[i] = (float)q[i] * pt_f16_to_f32(s16[g]) + pt_f16_to_f32(b16[g]);
    }
}

static void affine_encode_k(const pt_kv_codec *c, const float *x, uint8_t *row) {
    affine_encode(c, c->spec.k_bits, c->k_codes, x, row);
}
static void affine_encode_v(const pt_kv_codec *c, const float *x, uint8_t *row) {
    affine_encode(c, c->spec.v_bits, c->v_codes, x, row);
}
static void affine_decode_k(const pt_kv_codec *c, const uint8_t *row, float *x) {
    affine_decode(c, c->spec.k_bits, c->k_codes, row, x);
}
static void affine_decode_v(const pt_kv_codec *c, const uint8_t *row, float *x) {
    affine_decode(c, c->spec.v_bits, c->v_codes, row, x);
}

/* ---- TurboQuant ------------------------------------------------------------------- */

static void turbo_encode_k(const pt_kv_codec *c, const float *x, uint8_t *row) {
    uint16_t s16[PT_TQ_MAX_DIM / 8], z16[PT_TQ_MAX_DIM / 8];
    pt_tq_encode_k(x, c->head_dim, c->group, c->spec.k_bits, row, s16, z16);
    put_f16s(row + c->k_codes, s16, c->n_groups);
    put_f16s(row + c->k_codes + 2 * c->n_groups, z16, c->n_groups);
}

static void turbo_decode_k(const pt_kv_codec *c, const uint8_t *row, float *x) {
    uint16_t s16[PT_TQ_MAX_DIM / 8], z16[PT_TQ_MAX_DIM / 8];
    get_f16s(s16, row + c->k_codes, c->n_groups);
    get_f16s(z16, row + c->k_codes + 2 * c->n_groups, c->n_groups);
    pt_tq_decode_k(row, s16, z16, c->head_dim, c->group, c->spec.k_bits, x);
}

static void turbo_encode_v(const pt_kv_codec *c, const float *x, uint8_t *row) {
    uint16_t s16[PT_TQ_MAX_DIM / 8];
    pt_tq_encode_v(x, c->head_dim, c->group, c->spec.v_bits, c->signs, row, s16);
    put_f16s(row + c->v_codes, s16, c->n_groups);
}

static void turbo_decode_v_raw(const pt_kv_codec *c, const uint8_t *row, float *x) {
    uint16_t s16[PT_TQ_MAX_DIM / 8];
    get_f16s(s16, row + c->v_codes, c->n_groups);
    pt_tq_dequant_rotated(row, s16, c->head_dim, c->group, c->spec.v_bits, x);
}

static void turbo_decode_v(const pt_kv_codec *c, const uint8_t *row, float *x) {
    uint16_t s16[PT_TQ_MAX_DIM / 8];
    get_f16s(s16, row + c->v_codes, c->n_groups);
    pt_tq_decode_v(row, s16, c->head_dim, c->group, c->spec.v_bits, c->signs, x);
}

static void turbo_unrotate(const pt_kv_codec *c, float *out, float mul) {
    pt_tq_unrotate(out, c->head_dim, c->signs, mul);
}

/* ---- binding ------------------------------------------------------------------------ */

/* Affine groups: 32 where it divides head_dim, else 16 or 8. */
static int affine_group_for(int d) {
    static const int sizes[] = {32, 16, 8};
    for (size_t i = 0; i < PT_ARRAY_LEN(sizes); i++)
        if (d % sizes[i] == 0) return sizes[i];
    return 0;
}

static int bind_affine(pt_kv_codec *c, pt_err *err) {
    int d = c->head_dim;
    c->group = d > 0 ? affine_group_for(d) : 0;
    if (!c->group || d > PT_TQ_MAX_DIM)
        return pt_fail(err, "--kv-quant %d: head_dim %d is not a multiple of 8 up to %d",
                       c->spec.k_bits, d, PT_TQ_MAX_DIM);
    c->n_groups = d / c->group;
    c->k_codes = d * c->spec.k_bits / 8, c->v_codes = d * c->spec.v_bits / 8;
    c->k_row = c->k_codes + 4 * c->n_groups;
    c->v_row = c->v_codes + 4 * c->n_groups;
    c->encode_k = affine_encode_k, c->encode_v = affine_encode_v;
    c->decode_k = affine_decode_k;
    c->decode_v_raw = c->decode_v = affine_decode_v;
    return 0;
}

static int bind_turbo(pt_kv_codec *c, pt_err *err) {
    int d = c->head_dim;
    if (!pt_tq_dim_ok(d, c->spec.any_dim)) {
        if (pt_tq_dim_ok(d, true))
            return pt_fail(err,
                           "--kv-quant turbo: head_dim %d is outside TurboQuant's 64, 128, 256, "
                           "512; add ':anydim' to use Petrel's extension (group %d, signs from "
                           "the d=64 vector)",
                           d, pt_tq_group(d));
        return pt_fail(err, "--kv-quant turbo: head_dim %d is not one of 64, 128, 256, 512", d);
    }
    c->group = pt_tq_group(d);
    c->n_groups = d / c->group;
    c->k_codes = d * c->spec.k_bits / 8, c->v_codes = d * c->spec.v_bits / 8;
    c->k_row = c->k_codes + 4 * c->n_groups; /* scale + zero point */
    c->v_row = c->v_codes + 2 * c->n_groups; /* scale */
    c->k_signed = c->spec.k_bits == 8;
    c->v_rotated = true;
    c->inv_sqrt_d = pt_tq_inv_sqrt(d);
    c->centroids = pt_tq_centroids(c->spec.v_bits);
    pt_tq_signs(d, c->signs);
    c->encode_k = turbo_encode_k, c->encode_v = turbo_encode_v;
    c->decode_k = turbo_decode_k;
    c->decode_v_raw = turbo_decode_v_raw, c->decode_v = turbo_decode_v;
    c->unrotate = turbo_unrotate;
    return 0;
}

int pt_kv_codec_init(pt_kv_codec *c, const pt_kvq_spec *spec, int head_dim, pt_err *err) {
    memset(c, 0, sizeof *c);
    c->spec = *spec;
    c->head_dim = head_dim;
    switch (spec->kind) {
    case PT_KVQ_AFFINE:
        if ((spec->k_bits != 8 && spec->k_bits != 4) || (spec->v_bits != 8 && spec->v_bits != 4))
            return pt_fail(err, "--kv-quant: affine bits must be 8 or 4");
        return bind_affine(c, err);
    case PT_KVQ_TURBO:
        return bind_turbo(c, err);
    default:
        return pt_fail(err, "--kv-quant none has no codec");
    }
}
