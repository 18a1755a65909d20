/*
 * mlx_config.c - the "quantization" object of an MLX model's config.json.
 *
 *   "quantization": {"group_size": 64, "bits": 4, "mode": "affine",
 *                    "model.layers.0.mlp.down_proj": {"group_size": 64, "bits": 8},
 *                    "model.embed_tokens": false, ...}
 *
 * The top-level group_size and bits apply to every quantized module; a key
 * naming a module (its path, without ".weight") overrides them with an
 * object, or says false for a module left unquantized.  Which modules are
 * quantized at all is told by the weights themselves (a module is quantized
 * when "<module>.scales" exists), as mlx-lm decides when it loads.
 * mlx-lm also writes the same object as "quantization_config".
 */
#include "quant/mlx_config.h"

static json_t *quant_object(json_t *config) {
    json_t *q = json_object_get(config, "quantization");
    return json_is_object(q) ? q : NULL;
}

static int read_params(json_t *o, const char *where, int *bits, int *gs, pt_err *err) {
    json_t *b = json_object_get(o, "bits"), *g = json_object_get(o, "group_size");
    json_t *mode = json_object_get(o, "mode");
    if (mode && (!json_is_string(mode) || strcmp(json_string_value(mode), "affine") != 0))
        return pt_fail(err, "config.json: %s: quantization mode %s is not supported (only affine)",
                       where, json_is_string(mode) ? json_string_value(mode) : "(not a string)");
    if (b && !json_is_integer(b)) return pt_fail(err, "config.json: %s: bits is not an integer", where);
    if (g && !json_is_integer(g))
        return pt_fail(err, "config.json: %s: group_size is not an integer", where);
    if (b) *bits = (int)json_integer_value(b);
    if (g) *gs = (int)json_integer_value(g);
    if (!pt_affine_supported(*bits, *gs))
        return pt_fail(err, "config.json: %s: %d bits with group size %d is not supported "
                            "(bits 2, 3, 4, 5, 6, 8; group size 32, 64, 128)",
                       where, *bits, *gs);
    return 0;
}

int pt_mlx_quant_check(json_t *config, pt_err *err) {
    json_t *q = json_object_get(config, "quantization");
    if (!q || json_is_null(q)) {
        json_t *hf = json_object_get(config, "quantization_config");
        const char *method = json_string_value(json_object_get(hf, "quant_method"));
        if (method)
            return pt_fail(err, "config.json: quantization_config method '%s' is not supported "
                                "(Petrel loads MLX affine and GGUF quantized models)",
                           method);
        return 0;
    }
    if (!json_is_object(q)) return pt_fail(err, "config.json: quantization is not an object");
    int bits = 4, gs = 64;
    if (read_params(q, "quantization", &bits, &gs, err)) return -1;
    const char *key;
    json_t *v;
    json_object_foreach(q, key, v) {
        if (json_is_object(v)) {
            int b = bits, g = gs;
            if (read_params(v, key, &b, &g, err)) return -1;
        } else if (!json_is_boolean(v) && strcmp(key, "bits") && strcmp(key, "group_size") &&
                   strcmp(key, "mode")) {
            return pt_fail(err, "config.json: quantization.%s must be an object or false", key);
        }
    }
    return 0;
}

int pt_mlx_module_params(json_t *config, const char *module, int *bits, int *gs, pt_err *err) {
    json_t *q = quant_object(config);
    *bits = 4;
    *gs = 64;
    if (!q) return pt_fail(err, "%s is quantized (it has scales) but config.json has no "
                                "\"quantization\" entry giving its bits and group size",
                           module);
    if (read_params(q, "quantization", bits, gs, err)) return -1;
    json_t *o = json_object_get(q, module);
    if (json_is_false(o))
        return pt_fail(err, "config.json: quantization.%s is false but the weights have %s.scales",
                       module, module);
    if (json_is_object(o) && read_params(o, module, bits, gs, err)) return -1;
    return 0;
}
