#!/usr/bin/python3
"""minicpm3_hf.py - the minicpm3 fixture's weights as a Hugging Face checkpoint.

Usage: PYTHONPATH=build-llama/llama.cpp/gguf-py scripts/llama-ref/minicpm3_hf.py \\
           tests/fixtures/gguf/minicpm3

Reads CASE/model.gguf (written by minicpm3.py) and writes CASE/hf/config.json
and CASE/hf/model.safetensors with the names of the Hub's MiniCPM3 code
(openbmb/MiniCPM3-4B, model_type minicpm3): the same numbers, so llama.cpp's
reference for the GGUF is the reference for the checkpoint too.  The
mapping is the inverse of llama.cpp's converter for this architecture,
which copies every matrix as is (both rope with rotate-half) and moves
rope_scaling's short_factor / long_factor into the rope_factors_short /
_long tensors: here they go back into config.json.  config.json restates
the GGUF's hyperparameters as the Hub config writes them (no v_head_dim:
hidden / heads), with the scalings llama.cpp assumes for every minicpm3
file (scale_emb 12, scale_depth 1.4, dim_model_base 256).
"""
import json
import os
import sys

import numpy as np
import gguf

from deepseek2_hf import write_safetensors

HF = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q_a.weight": "self_attn.q_a_proj.weight",
    "attn_q_a_norm.weight": "self_attn.q_a_layernorm.weight",
    "attn_q_b.weight": "self_attn.q_b_proj.weight",
    "attn_kv_a_mqa.weight": "self_attn.kv_a_proj_with_mqa.weight",
    "attn_kv_a_norm.weight": "self_attn.kv_a_layernorm.weight",
    "attn_kv_b.weight": "self_attn.kv_b_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}

CONFIG = {
    "model_type": "minicpm3", "architectures": ["MiniCPM3ForCausalLM"],
    "hidden_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4,
    "num_key_value_heads": 4, "intermediate_size": 96, "q_lora_rank": 24, "kv_lora_rank": 32,
    "qk_nope_head_dim": 12, "qk_rope_head_dim": 8, "vocab_size": 512,
    "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
    "scale_emb": 12, "scale_depth": 1.4, "dim_model_base": 256,
    "tie_word_embeddings": False, "hidden_act": "silu", "torch_dtype": "float32",
}


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    case = sys.argv[1]
    r = gguf.GGUFReader(os.path.join(case, "model.gguf"))
    out, factors = [], {}
    for t in r.tensors:
        a = np.array(t.data, dtype=np.float32).reshape([int(d) for d in reversed(t.shape)])
        if t.name.startswith("rope_factors_"):
            factors[t.name.split(".")[0][len("rope_factors_"):]] = [float(x) for x in a]
        elif t.name in HF:
            out.append((HF[t.name], a))
        else:
            layer, rest = t.name.split(".", 2)[1:]
            out.append((f"model.layers.{layer}.{HF[rest]}", a))
    cfg = dict(CONFIG)
    cfg["rope_scaling"] = {"type": "longrope", "short_factor": factors["short"],
                           "long_factor": factors["long"],
                           "original_max_position_embeddings": CONFIG["max_position_embeddings"]}
    os.makedirs(os.path.join(case, "hf"), exist_ok=True)
    write_safetensors(os.path.join(case, "hf", "model.safetensors"), sorted(out))
    with open(os.path.join(case, "hf", "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
