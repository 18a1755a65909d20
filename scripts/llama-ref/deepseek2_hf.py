#!/usr/bin/python3
"""deepseek2_hf.py - the deepseek2_legacy fixture's weights as a Hugging Face checkpoint.

Usage: PYTHONPATH=build-llama/llama.cpp/gguf-py scripts/llama-ref/deepseek2_hf.py \\
           tests/fixtures/gguf/deepseek2_legacy

Reads CASE/model.gguf (written by deepseek2.py --legacy: fused attn_kv_b)
and writes CASE/hf/config.json and CASE/hf/model.safetensors with
transformers' DeepseekV3 names: the same numbers, so llama.cpp's reference
for the GGUF is the reference for the checkpoint too.  The mapping is the
inverse of llama.cpp's converter for this architecture, which copies every
matrix as is (no q/k permutation: transformers de-interleaves the rope part
itself), stacks the experts (here unstacked again, one tensor each) and
names e_score_correction_bias exp_probs_b.  config.json restates the
GGUF's hyperparameters (deepseek2.py's constants).
"""
import json
import os
import struct
import sys

import numpy as np
import gguf

HF = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
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
    "ffn_gate_inp.weight": "mlp.gate.weight",
    "exp_probs_b.bias": "mlp.gate.e_score_correction_bias",
    "ffn_gate_shexp.weight": "mlp.shared_experts.gate_proj.weight",
    "ffn_up_shexp.weight": "mlp.shared_experts.up_proj.weight",
    "ffn_down_shexp.weight": "mlp.shared_experts.down_proj.weight",
}
EXPERTS = {"ffn_gate_exps.weight": "gate_proj", "ffn_up_exps.weight": "up_proj",
           "ffn_down_exps.weight": "down_proj"}

CONFIG = {
    "model_type": "deepseek_v3", "architectures": ["DeepseekV3ForCausalLM"],
    "hidden_size": 48, "num_hidden_layers": 3, "num_attention_heads": 4,
    "num_key_value_heads": 4, "intermediate_size": 64, "q_lora_rank": 24, "kv_lora_rank": 32,
    "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 12,
    "moe_intermediate_size": 16, "n_routed_experts": 8, "n_shared_experts": 1,
    "num_experts_per_tok": 3, "first_k_dense_replace": 1, "n_group": 4, "topk_group": 2,
    "topk_method": "noaux_tc", "scoring_func": "sigmoid", "norm_topk_prob": True,
    "routed_scaling_factor": 2.5, "vocab_size": 512, "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "rope_interleave": True,
    "tie_word_embeddings": True, "hidden_act": "silu", "torch_dtype": "float32",
}


def write_safetensors(path, tensors):
    header, off = {}, 0
    for name, a in tensors:
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [off, off + a.nbytes]}
        off += a.nbytes
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for _, a in tensors:
            f.write(np.ascontiguousarray(a, dtype=np.float32).tobytes())


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    case = sys.argv[1]
    r = gguf.GGUFReader(os.path.join(case, "model.gguf"))
    out = []
    for t in r.tensors:
        a = np.array(t.data, dtype=np.float32).reshape([int(d) for d in reversed(t.shape)])
        if t.name in HF:
            out.append((HF[t.name], a))
            continue
        layer, rest = t.name.split(".", 2)[1:]
        if rest in EXPERTS:
            for e in range(a.shape[0]):
                out.append((f"model.layers.{layer}.mlp.experts.{e}.{EXPERTS[rest]}.weight", a[e]))
        else:
            out.append((f"model.layers.{layer}.{HF[rest]}", a))
    os.makedirs(os.path.join(case, "hf"), exist_ok=True)
    write_safetensors(os.path.join(case, "hf", "model.safetensors"), sorted(out))
    with open(os.path.join(case, "hf", "config.json"), "w") as f:
        json.dump(CONFIG, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
