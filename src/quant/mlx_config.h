/*
 * mlx_config.h - reading the "quantization" entry of an MLX config.json
 * (mlx_config.c explains its shape).
 */
#ifndef PETREL_MLX_CONFIG_H
#define PETREL_MLX_CONFIG_H

#include <jansson.h>

#include "quant/quant.h"

/* Validates config["quantization"] (bits, group sizes, per-module entries,
 * mode) and refuses other quantization_config methods (GPTQ, AWQ...). */
int pt_mlx_quant_check(json_t *config, pt_err *err);
/* bits and group size of a quantized module ("model.layers.0.mlp.up_proj"). */
int pt_mlx_module_params(json_t *config, const char *module, int *bits, int *gs, pt_err *err);

#endif
