/*
 * cmd_kvcodec.c - `petrel kvcodec encode|decode`: the KV codecs on rows of
 * JSON, so they can be checked against any other implementation.
 *
 *   petrel kvcodec encode --kv-quant turbo:k8v3 rows.json
 *       in:  {"keys": [[x, ...], ...], "values": [[x, ...], ...]}  (either
 *            may be absent; every row has head_dim numbers; "nan", "inf"
 *            and "-inf" as strings for the values JSON cannot hold)
 *       out: {"codec", "head_dim", "group", "keys": [row...], "values": [...]}
 *            each row {"codes": [...], "packed": "hex", "scales": [...],
 *            "scales_f16": ["hex"...], and for K (and affine V) "zeros" /
 *            "zeros_f16" (TurboQuant zero points, affine biases)}
 *   petrel kvcodec decode --kv-quant turbo:k8v3 encoded.json
 *       in:  encode's output (per row "packed" or "codes", and the f16
 *            planes as "scales_f16"/"zeros_f16" hex or "scales"/"zeros")
 *       out: {"codec", "head_dim", "keys": [[x...]], "values": [[x...]]}
 *            values decoded eagerly (back in the model's domain).
 *
 * FILE "-" or none reads stdin.  Output numbers JSON cannot hold (NaN, the
 * infinities: a row of inf inputs, a NaN scale) are written as the strings
 * the input side reads, so every row keeps head_dim entries; any failure
 * to build or write the output is an error, never a shorter row.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include <jansson.h>

#include "cli/cli.h"
#include "kv/kv_codec.h"

static struct { const char *quant; } kc;

static const cli_opt kvcodec_opts[] = {
    {"kv-quant", 0, CLI_STR, &kc.quant, "Q",
     "codec: 8, 4, turbo[:k<bits>v<bits>][:anydim] (default turbo)"},
    {NULL, 0, 0, NULL, NULL, NULL},
};

/* Which half of the cache a row belongs to, and the codec's facts for it. */
typedef struct part {
    const char *name; /* "keys", "values" */
    bool is_k;
} part;

static const part parts[] = {{"keys", true}, {"values", false}};

static int part_bits(const pt_kv_codec *c, const part *p) {
    return p->is_k ? c->spec.k_bits : c->spec.v_bits;
}
static int part_codes(const pt_kv_codec *c, const part *p) {
    return p->is_k ? c->k_codes : c->v_codes;
}
/* TurboQuant values carry only scales; every other row has a third plane. */
static bool part_has_zeros(const pt_kv_codec *c, const part *p) {
    return p->is_k || c->spec.kind != PT_KVQ_TURBO;
}

/* ---- JSON helpers ----------------------------------------------------------------- */

static int fail(const char *fmt, const char *what) {
    fprintf(stderr, "petrel kvcodec: ");
    fprintf(stderr, fmt, what);
    fputc('\n', stderr);
    return -1;
}

/* A number for the output: JSON has no NaN or infinities (json_real()
 * refuses them), so those become "nan", "inf", "-inf", as number() reads. */
static json_t *json_number_out(double x) {
    if (isnan(x)) return json_string("nan");
    if (isinf(x)) return json_string(x > 0 ? "inf" : "-inf");
    return json_real(x);
}

/* Appends v (taking it); false when v is NULL or the append fails, which
 * the caller must report: a silently skipped entry shortens a row. */
static bool push(json_t *array, json_t *v) {
    return v && json_array_append_new(array, v) == 0;
}

static int number(json_t *v, float *out) {
    if (json_is_number(v)) {
        *out = (float)json_number_value(v);
        return 0;
    }
    static const struct {
        const char *s;
        float v;
    } special[] = {{"nan", NAN}, {"inf", INFINITY}, {"-inf", -INFINITY}};
    for (size_t i = 0; json_is_string(v) && i < PT_ARRAY_LEN(special); i++)
        if (strcmp(json_string_value(v), special[i].s) == 0) {
            *out = special[i].v;
            return 0;
        }
    return -1;
}

static json_t *hex_string(const uint8_t *p, size_t n) {
    char *s = pt_xmalloc(2 * n + 1);
    for (size_t i = 0; i < n; i++)
        snprintf(s + 2 * i, 3, "%02x", p[i]);
    json_t *j = json_string(s);
    free(s);
    return j;
}

static int parse_hex(const char *s, uint8_t *out, size_t n) {
    if (strlen(s) != 2 * n) return -1;
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        if (sscanf(s + 2 * i, "%2x", &v) != 1) return -1;
        out[i] = (uint8_t)v;
    }
    return 0;
}

/* ---- encode ------------------------------------------------------------------------ */

/* The fp16 plane at p as numbers and as hex bit patterns. */
static int put_plane(json_t *row, const char *name, const uint8_t *p, int n) {
    json_t *vals = json_array(), *bits = json_array();
    char key[32], hex[8];
    bool ok = vals && bits;
    for (int g = 0; g < n && ok; g++) {
        uint16_t h;
        memcpy(&h, p + 2 * g, 2);
        snprintf(hex, sizeof hex, "%04x", h);
        ok = push(vals, json_number_out(pt_f16_to_f32(h))) && push(bits, json_string(hex));
    }
    snprintf(key, sizeof key, "%s_f16", name);
    ok = ok && json_object_set(row, name, vals) == 0 && json_object_set(row, key, bits) == 0;
    json_decref(vals);
    json_decref(bits);
    return ok ? 0 : fail("%s: cannot build the output", name);
}

static json_t *encode_row(const pt_kv_codec *c, const part *p, const float *x) {
    uint8_t row[2048];
    int32_t codes[PT_TQ_MAX_DIM];
    int nc = part_codes(c, p);
    (p->is_k ? c->encode_k : c->encode_v)(c, x, row);
    pt_tq_unpack(row, c->head_dim, part_bits(c, p), p->is_k && c->k_signed, codes);
    json_t *j = json_object(), *cj = json_array();
    bool ok = j && cj;
    for (int i = 0; i < c->head_dim && ok; i++) ok = push(cj, json_integer(codes[i]));
    ok = ok && json_object_set(j, "codes", cj) == 0 &&
         json_object_set_new(j, "packed", hex_string(row, (size_t)nc)) == 0 &&
         put_plane(j, "scales", row + nc, c->n_groups) == 0 &&
         (!part_has_zeros(c, p) || put_plane(j, "zeros", row + nc + 2 * c->n_groups, c->n_groups) == 0);
    json_decref(cj);
    if (!ok) json_decref(j);
    return ok ? j : NULL;
}

static int read_row(json_t *r, int d, float *x) {
    if (!json_is_array(r) || (int)json_array_size(r) != d) return -1;
    for (int i = 0; i < d; i++)
        if (number(json_array_get(r, (size_t)i), &x[i])) return -1;
    return 0;
}

/* head_dim from the first row of either part. */
static int head_dim_of(json_t *in) {
    for (size_t i = 0; i < PT_ARRAY_LEN(parts); i++) {
        json_t *rows = json_object_get(in, parts[i].name);
        if (json_array_size(rows) && json_is_array(json_array_get(rows, 0)))
            return (int)json_array_size(json_array_get(rows, 0));
    }
    return 0;
}

static int bind_codec(pt_kv_codec *c, int d) {
    pt_kvq_spec spec;
    pt_err err = {{0}};
    if (pt_kvq_parse(kc.quant, &spec, &err) ||
        (spec.kind == PT_KVQ_NONE && pt_fail(&err, "--kv-quant none has no codec")) ||
        pt_kv_codec_init(c, &spec, d, &err))
        return fail("%s", err.msg);
    return 0;
}

static json_t *header(const pt_kv_codec *c) {
    char name[32];
    return json_pack("{s:s, s:i, s:i}", "codec", pt_kvq_name(&c->spec, name, sizeof name),
                     "head_dim", c->head_dim, "group", c->group);
}

static int encode(json_t *in, json_t **out) {
    pt_kv_codec c;
    if (bind_codec(&c, head_dim_of(in))) return -1;
    *out = header(&c);
    float x[PT_TQ_MAX_DIM];
    for (size_t i = 0; i < PT_ARRAY_LEN(parts); i++) {
        json_t *rows = json_object_get(in, parts[i].name), *r;
        size_t k;
        if (!rows) continue;
        json_t *enc = json_array();
        json_object_set_new(*out, parts[i].name, enc);
        json_array_foreach(rows, k, r) {
            if (read_row(r, c.head_dim, x))
                return fail("%s: every row must be an array of head_dim numbers", parts[i].name);
            if (!push(enc, encode_row(&c, &parts[i], x)))
                return fail("%s: cannot build the encoded row", parts[i].name);
        }
    }
    return 0;
}

/* ---- decode ------------------------------------------------------------------------ */

/* An fp16 plane from "<name>_f16" (hex) or "<name>" (numbers). */
static int get_plane(json_t *row, const char *name, uint8_t *p, int n) {
    char key[32];
    snprintf(key, sizeof key, "%s_f16", name);
    json_t *bits = json_object_get(row, key), *vals = json_object_get(row, name);
    for (int g = 0; g < n; g++) {
        uint16_t h;
        float f;
        const char *hex = json_string_value(json_array_get(bits, (size_t)g));
        if (json_array_size(bits) == (size_t)n && hex)
            h = (uint16_t)strtoul(hex, NULL, 16);
        else if (json_array_size(vals) == (size_t)n && !number(json_array_get(vals, (size_t)g), &f))
            h = pt_f32_to_f16(f);
        else
            return -1;
        memcpy(p + 2 * g, &h, 2);
    }
    return 0;
}

/* A row's code plane from "packed" (hex) or "codes" (integers). */
static int get_codes(const pt_kv_codec *c, const part *p, json_t *row, uint8_t *out) {
    json_t *packed = json_object_get(row, "packed"), *codes = json_object_get(row, "codes");
    if (json_is_string(packed))
        return parse_hex(json_string_value(packed), out, (size_t)part_codes(c, p));
    if (json_array_size(codes) != (size_t)c->head_dim) return -1;
    int32_t v[PT_TQ_MAX_DIM];
    for (int i = 0; i < c->head_dim; i++)
        v[i] = (int32_t)json_integer_value(json_array_get(codes, (size_t)i));
    pt_tq_pack(v, c->head_dim, part_bits(c, p), out);
    return 0;
}

static int decode_row(const pt_kv_codec *c, const part *p, json_t *r, json_t *out) {
    uint8_t row[2048];
    float x[PT_TQ_MAX_DIM];
    int nc = part_codes(c, p);
    if (get_codes(c, p, r, row) || get_plane(r, "scales", row + nc, c->n_groups) ||
        (part_has_zeros(c, p) && get_plane(r, "zeros", row + nc + 2 * c->n_groups, c->n_groups)))
        return fail(
            "%s: a row needs packed (or codes), scales and, but for TurboQuant values, zeros",
            p->name);
    (p->is_k ? c->decode_k : c->decode_v)(c, row, x);
    json_t *xs = json_array();
    bool ok = xs != NULL;
    for (int i = 0; i < c->head_dim && ok; i++) ok = push(xs, json_number_out(x[i]));
    if (!ok) {
        json_decref(xs);
        return fail("%s: cannot build the decoded row", p->name);
    }
    return push(out, xs) ? 0 : fail("%s: cannot build the decoded row", p->name);
}

static int decode(json_t *in, json_t **out) {
    pt_kv_codec c;
    json_t *hd = json_object_get(in, "head_dim");
    if (!json_is_integer(hd)) return fail("%s", "decode input needs \"head_dim\"");
    if (bind_codec(&c, (int)json_integer_value(hd))) return -1;
    *out = header(&c);
    for (size_t i = 0; i < PT_ARRAY_LEN(parts); i++) {
        json_t *rows = json_object_get(in, parts[i].name), *r;
        size_t k;
        if (!rows) continue;
        json_t *dec = json_array();
        json_object_set_new(*out, parts[i].name, dec);
        json_array_foreach(rows, k, r) {
            if (decode_row(&c, &parts[i], r, dec)) return -1;
        }
    }
    return 0;
}

/* ---- command ----------------------------------------------------------------------- */

static const struct {
    const char *name;
    int (*run)(json_t *in, json_t **out);
} modes[] = {{"encode", encode}, {"decode", decode}};

int cmd_kvcodec(int argc, char **argv) {
    memset(&kc, 0, sizeof kc);
    kc.quant = "turbo";
    const cli_opt *tables[] = {kvcodec_opts, NULL};
    const char *pos[2];
    int n_pos, rc = cli_parse(argc, argv, "petrel kvcodec encode|decode [--kv-quant Q] [FILE]",
                              tables, pos, 2, &n_pos);
    if (rc) return rc < 0 ? 2 : 0;
    for (size_t m = 0; n_pos >= 1 && m < PT_ARRAY_LEN(modes); m++) {
        if (strcmp(pos[0], modes[m].name)) continue;
        const char *path = n_pos == 2 ? pos[1] : "-";
        json_error_t jerr;
        json_t *in =
            strcmp(path, "-") ? json_load_file(path, 0, &jerr) : json_loadf(stdin, 0, &jerr);
        if (!json_is_object(in)) {
            fprintf(stderr, "petrel kvcodec: %s: %s\n", path,
                    in ? "expected a JSON object" : jerr.text);
            json_decref(in);
            return 1;
        }
        json_t *out = NULL;
        rc = modes[m].run(in, &out);
        if (rc == 0 && (json_dumpf(out, stdout, JSON_INDENT(1) | JSON_PRESERVE_ORDER) ||
                        putchar('\n') == EOF || fflush(stdout) == EOF))
            rc = fail("%s", "cannot write the output");
        json_decref(in);
        json_decref(out);
        return rc ? 1 : 0;
    }
    fprintf(stderr, "petrel kvcodec: expected `encode` or `decode` (see --help)\n");
    return 2;
}
