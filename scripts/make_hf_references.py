#!/usr/bin/env python3
"""Build tiny random-weight Hugging Face models and record reference logits.

DESIGN.md section 5: transformers builds small random-weight models from a
config, saves them as safetensors, and records reference logits; Petrel must
load the same files and match.  See docs/hf-references.md for the layout of
what this writes and for the exact command used to regenerate it.

Modes:
  make_hf_references.py [--out DIR] [--cases a,b]   needs torch + transformers
  make_hf_references.py --check DIR                  pure python, no torch:
        parses every safetensors header, checks tensor names/shapes/dtypes
        against config.json, checks reference.json for internal consistency
  make_hf_references.py --selftest                   pure python, no torch

Output: DIR/<case>/{config.json, model.safetensors | model-0000N-of-0000M.
safetensors + model.safetensors.index.json, generation_config.json (when
save_pretrained writes one), reference.json}.
"""

import argparse
import copy
import json
import math
import os
import random
import shutil
import struct
import sys
import time

FORMAT_VERSION = 1
N_GREEDY = 32
PROMPT_LENGTHS = (5, 17, 40)
BOS, EOS = 1, 2

# One entry per fixture.  Shapes are tiny so the fixtures stay small; they
# vary on purpose (MHA vs GQA, head_dim != hidden/heads, a non power-of-two
# hidden size, 3 layers) so a loader that hard-codes a relation is caught.
CASES = {
    "llama2": dict(
        architecture="LlamaForCausalLM", model_type="llama", dtype="float32",
        vocab=320, hidden=64, inter=160, layers=2, heads=4, kv_heads=4, head_dim=16,
        rope_theta=10000.0, rope_scaling=None, tie=False, eps=1e-5,
        max_pos=4096, config_style="native", shard=None, seed0=1000),
    "llama3": dict(
        architecture="LlamaForCausalLM", model_type="llama", dtype="bfloat16",
        vocab=320, hidden=64, inter=160, layers=2, heads=4, kv_heads=2, head_dim=16,
        rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
        tie=True, eps=1e-5, max_pos=131072, config_style="legacy", shard=None, seed0=2000),
    "mistral": dict(
        architecture="MistralForCausalLM", model_type="mistral", dtype="float16",
        vocab=320, hidden=96, inter=224, layers=2, heads=6, kv_heads=2, head_dim=16,
        rope_theta=1000000.0, rope_scaling=None, tie=False, eps=1e-5,
        max_pos=4096, config_style="legacy", shard=None, seed0=3000),
    "qwen2": dict(
        architecture="Qwen2ForCausalLM", model_type="qwen2", dtype="bfloat16",
        vocab=320, hidden=64, inter=160, layers=3, heads=4, kv_heads=2, head_dim=16,
        rope_theta=1000000.0, rope_scaling=None, tie=True, eps=1e-6,
        max_pos=4096, config_style="legacy", shard=None, seed0=4000),
    "qwen3": dict(
        architecture="Qwen3ForCausalLM", model_type="qwen3", dtype="bfloat16",
        vocab=320, hidden=64, inter=160, layers=2, heads=4, kv_heads=2, head_dim=32,
        rope_theta=1000000.0, rope_scaling=None, tie=False, eps=1e-6,
        max_pos=4096, config_style="native", shard=None, seed0=5000),
    "llama_sharded": dict(
        architecture="LlamaForCausalLM", model_type="llama", dtype="float32",
        vocab=320, hidden=64, inter=160, layers=2, heads=4, kv_heads=4, head_dim=16,
        rope_theta=10000.0, rope_scaling=None, tie=False, eps=1e-5,
        max_pos=4096, config_style="native", shard="200KB", seed0=6000),
    # Model families I (issue 16).  Every layer of qwen3_moe is sparse: 6
    # experts, 2 per token, renormalized; head_dim 64 so GPU kernels fit.
    "qwen3_moe": dict(
        architecture="Qwen3MoeForCausalLM", model_type="qwen3_moe", dtype="bfloat16",
        vocab=320, hidden=64, inter=96, layers=3, heads=4, kv_heads=2, head_dim=64,
        rope_theta=1000000.0, rope_scaling=None, tie=False, eps=1e-6,
        max_pos=4096, config_style="native", shard=None, seed0=7000,
        extra=dict(num_experts=6, num_experts_per_tok=2, moe_intermediate_size=32,
                   norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[])),
    # Gemma 2: soft-capped attention scores (cap 4 so it bites) and logits,
    # query_pre_attn_scalar != head_dim, a window of 8 on even layers.
    "gemma2": dict(
        architecture="Gemma2ForCausalLM", model_type="gemma2", dtype="float16",
        vocab=320, hidden=64, inter=128, layers=4, heads=4, kv_heads=2, head_dim=32,
        rope_theta=10000.0, rope_scaling=None, tie=True, eps=1e-6,
        max_pos=4096, config_style="legacy", shard=None, seed0=8000,
        extra=dict(query_pre_attn_scalar=48, attn_logit_softcapping=4.0,
                   final_logit_softcapping=15.0, sliding_window=8,
                   layer_types=["sliding_attention", "full_attention"] * 2)),
    # Gemma 3: q/k norms, local layers (window 12, base 1e4) and a global
    # one (base 1e6).
    "gemma3_text": dict(
        architecture="Gemma3ForCausalLM", model_type="gemma3_text", dtype="bfloat16",
        vocab=320, hidden=64, inter=128, layers=4, heads=4, kv_heads=2, head_dim=64,
        rope_theta=1000000.0, rope_scaling=None, tie=True, eps=1e-6,
        max_pos=4096, config_style="native", shard=None, seed0=9000,
        extra=dict(query_pre_attn_scalar=40, sliding_window=12, rope_local_base_freq=10000.0,
                   layer_types=["sliding_attention", "sliding_attention", "full_attention",
                                "sliding_attention"])),
    # Model families I (issue 16): gpt-oss.  Experts stay fused as the Hub's
    # unquantized checkpoints store them ([E][in][2*I] gate/up interleaved,
    # with biases); attention sinks, a window of 8 on even layers, biased
    # attention and YaRN rope as the released config has it.
    "gpt_oss": dict(
        architecture="GptOssForCausalLM", model_type="gpt_oss", dtype="bfloat16",
        vocab=320, hidden=64, inter=64, layers=4, heads=4, kv_heads=2, head_dim=32,
        rope_theta=150000.0,
        rope_scaling={"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                      "truncate": False, "original_max_position_embeddings": 4096},
        tie=False, eps=1e-5, max_pos=131072, config_style="native", shard=None, seed0=10000,
        extra=dict(num_local_experts=6, num_experts_per_tok=2, sliding_window=8,
                   layer_types=["sliding_attention", "full_attention"] * 2)),
    # Model families II (issue 17): Qwen3-Next, three Gated DeltaNet layers
    # then one gated full-attention layer (partial rotary, a quarter of
    # head_dim); every layer's FFN is sparse with a gated shared expert.
    "qwen3_next": dict(
        architecture="Qwen3NextForCausalLM", model_type="qwen3_next", dtype="bfloat16",
        vocab=320, hidden=64, inter=96, layers=4, heads=4, kv_heads=2, head_dim=32,
        rope_theta=10000000.0, rope_scaling={"rope_type": "default", "partial_rotary_factor": 0.25},
        tie=False, eps=1e-6, max_pos=4096, config_style="native", shard=None, seed0=11000,
        extra=dict(linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16,
                   linear_num_key_heads=2, linear_num_value_heads=4,
                   num_experts=6, num_experts_per_tok=2, moe_intermediate_size=32,
                   shared_expert_intermediate_size=48, norm_topk_prob=True,
                   decoder_sparse_step=1, mlp_only_layers=[],
                   layer_types=["linear_attention"] * 3 + ["full_attention"])),
    # Model families I (issue 16): Gemma 4 text, E2B-like.  Per-layer inputs
    # (a second token table + a projection, 16 wide per layer), sliding
    # layers (window 8, head_dim 32, rope 1e4) and full ones (global_head_dim
    # 64, proportional rope over a quarter of it, base 1e6), the last two
    # layers reuse the K/V of the last earlier layer of their kind and have
    # the double-wide MLP; final soft-cap 15 so it bites.
    "gemma4_text": dict(
        architecture="Gemma4ForCausalLM", model_type="gemma4_text", dtype="bfloat16",
        vocab=320, hidden=64, inter=96, layers=6, heads=4, kv_heads=2, head_dim=32,
        rope_theta=1000000.0, rope_scaling=None, tie=True, eps=1e-6,
        max_pos=4096, config_style="native", shard=None, seed0=12000,
        rope_per_type={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                       "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                          "rope_theta": 1000000.0}},
        extra=dict(global_head_dim=64, sliding_window=8, final_logit_softcapping=15.0,
                   hidden_size_per_layer_input=16, vocab_size_per_layer_input=320,
                   num_kv_shared_layers=2, use_double_wide_mlp=True,
                   layer_types=["sliding_attention", "sliding_attention", "full_attention"] * 2)),
    # Gemma 4 text, 26B-A4B-like: every layer runs the dense MLP and 6
    # routed experts (top 2, router scale and per-expert scales) side by
    # side; full layers take V = K (attention_k_eq_v) with one KV head of 64;
    # no per-layer inputs; window 12.
    "gemma4_text_moe": dict(
        architecture="Gemma4ForCausalLM", model_type="gemma4_text", dtype="bfloat16",
        vocab=320, hidden=64, inter=96, layers=4, heads=4, kv_heads=2, head_dim=32,
        rope_theta=1000000.0, rope_scaling=None, tie=True, eps=1e-6,
        max_pos=4096, config_style="native", shard=None, seed0=13000,
        rope_per_type={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                       "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                          "rope_theta": 1000000.0}},
        extra=dict(global_head_dim=64, num_global_key_value_heads=1, attention_k_eq_v=True,
                   sliding_window=12, final_logit_softcapping=15.0, hidden_size_per_layer_input=0,
                   enable_moe_block=True, num_experts=6, top_k_experts=2, moe_intermediate_size=32,
                   layer_types=["sliding_attention", "full_attention"] * 2)),
    # Model families II (issue 17): Qwen3.5 text (dense FFN), three Gated
    # DeltaNet layers then a gated full-attention one; unfused in-projections
    # (in_proj_qkv, in_proj_z, in_proj_b, in_proj_a); 2 key heads, 4 value
    # heads (grouped); interleaved M-RoPE over a quarter of head_dim.  A 72
    # token prompt crosses the delta rule's 64-token chunk.
    "qwen3_5": dict(
        architecture="Qwen3_5ForCausalLM", model_type="qwen3_5_text", dtype="bfloat16",
        vocab=320, hidden=64, inter=96, layers=4, heads=4, kv_heads=2, head_dim=64,
        rope_theta=10000000.0,
        rope_scaling={"rope_type": "default", "partial_rotary_factor": 0.25,
                      "mrope_section": [3, 3, 2], "mrope_interleaved": True},
        tie=False, eps=1e-6, max_pos=4096, config_style="native", shard=None, seed0=14000,
        prompt_lengths=PROMPT_LENGTHS + (72,),
        extra=dict(linear_conv_kernel_dim=4, linear_key_head_dim=32, linear_value_head_dim=32,
                   linear_num_key_heads=2, linear_num_value_heads=4,
                   layer_types=["linear_attention"] * 3 + ["full_attention"])),
    # Qwen3.5-MoE text: the same hybrid with 6 routed experts (top 2) and a
    # gated shared expert in every layer.
    "qwen3_5_moe": dict(
        architecture="Qwen3_5MoeForCausalLM", model_type="qwen3_5_moe_text", dtype="bfloat16",
        vocab=320, hidden=64, inter=96, layers=4, heads=4, kv_heads=2, head_dim=64,
        rope_theta=10000000.0,
        rope_scaling={"rope_type": "default", "partial_rotary_factor": 0.25,
                      "mrope_section": [3, 3, 2], "mrope_interleaved": True},
        tie=False, eps=1e-6, max_pos=4096, config_style="native", shard=None, seed0=15000,
        prompt_lengths=PROMPT_LENGTHS + (72,),
        extra=dict(linear_conv_kernel_dim=4, linear_key_head_dim=32, linear_value_head_dim=32,
                   linear_num_key_heads=2, linear_num_value_heads=4,
                   num_experts=6, num_experts_per_tok=2, moe_intermediate_size=32,
                   shared_expert_intermediate_size=48,
                   layer_types=["linear_attention"] * 3 + ["full_attention"])),
    # Model families II (issue 17): DeepSeek-V3.  MLA with a low-rank query
    # (q_lora_rank 48), latent 64, rope key 32 (interleaved), no-rope 32,
    # value 32; layer 0 dense, layers 1-2 sparse: 8 experts in 4 groups, top
    # 2 groups, 2 experts per token by sigmoid score plus a selection bias
    # (e_score_correction_bias), renormalized, times 2.5, and one shared
    # expert.  V3's YaRN rope (factor 40, mscale_all_dim 1: the softmax
    # scale changes too).  head_dim is qk_rope_head_dim, as the config sets.
    "deepseek_v3": dict(
        architecture="DeepseekV3ForCausalLM", model_type="deepseek_v3", dtype="bfloat16",
        vocab=320, hidden=64, inter=128, layers=3, heads=4, kv_heads=4, head_dim=32,
        rope_theta=10000.0,
        rope_scaling={"rope_type": "yarn", "factor": 40.0, "beta_fast": 32.0, "beta_slow": 1.0,
                      "mscale": 1.0, "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096},
        tie=False, eps=1e-6, max_pos=163840, config_style="native", shard=None, seed0=16000,
        extra=dict(q_lora_rank=48, kv_lora_rank=64, qk_rope_head_dim=32, qk_nope_head_dim=32,
                   v_head_dim=32, n_routed_experts=8, n_group=4, topk_group=2,
                   num_experts_per_tok=2, n_shared_experts=1, moe_intermediate_size=32,
                   routed_scaling_factor=2.5, first_k_dense_replace=1, norm_topk_prob=True,
                   rope_interleave=True)),
}

# Families whose tensor names check_case does not spell out (it checks their
# dtypes and the reference only).
LOOSE_NAMES = ("gpt_oss", "qwen3_next", "gemma4_text", "qwen3_5_text", "qwen3_5_moe_text",
               "deepseek_v3")
# Families whose Hub checkpoints store one tensor per expert.
SPLIT_EXPERTS = ("qwen3_moe", "qwen3_next", "deepseek_v3")
# Families whose RMSNorm computes x * (1 + w): w is stored near 0.  Gemma 4's
# norms multiply by w itself (initialized to ones), as Qwen3.5's gated norm.
NORM_PLUS_ONE = ("gemma2", "gemma3_text", "qwen3_next", "qwen3_5_text", "qwen3_5_moe_text")
# Config keys some transformers versions move into per_layer_config (Gemma 4:
# full layers' head_dim and KV heads) instead of keeping them as attributes.
PER_LAYER_KEYS = {"global_head_dim": "head_dim", "num_global_key_value_heads": "num_key_value_heads"}

# Random init (overrides whatever transformers does, so it does not depend on
# the transformers version): matrices N(0, (GAIN/sqrt(fan_in))^2), embeddings
# and lm_head N(0, EMB_STD^2) (logit spread ~ EMB_STD*sqrt(hidden)), RMSNorm
# weights 1 + N(0, NORM_STD^2) (so a loader that ignores them is caught),
# biases N(0, BIAS_STD^2).
GAIN = 1.2
EMB_STD = 0.5
NORM_STD = 0.2
BIAS_STD = 0.5
INITIALIZER_RANGE = 0.15  # written to config.json only; our init overrides it


def make_prompts(vocab, lengths=PROMPT_LENGTHS):
    """Fixed prompts, first id BOS, other ids in [3, vocab).  Extra lengths
    come after PROMPT_LENGTHS, so the first three prompts are the same for
    every case."""
    rng = random.Random(20240601)
    return [[BOS] + [rng.randrange(3, vocab) for _ in range(n - 1)] for n in lengths]


def r7(x):
    """Round to 7 significant digits (JSON keeps the shortest repr)."""
    if not math.isfinite(x):
        raise ValueError("non-finite value %r" % (x,))
    return float("%.7g" % x)


def dumps(obj, ind=0):
    """JSON with one line per numeric row: small diffs, easy to eyeball."""
    pad, pad1 = " " * ind, " " * (ind + 1)
    if isinstance(obj, dict):
        if not obj:
            return "{}"
        items = ["%s%s: %s" % (pad1, json.dumps(k), dumps(v, ind + 1)) for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(obj, (list, tuple)):
        if all(not isinstance(x, (list, tuple, dict)) for x in obj):
            return json.dumps(list(obj), separators=(",", ":"), allow_nan=False)
        items = [pad1 + dumps(x, ind + 1) for x in obj]
        return "[\n" + ",\n".join(items) + "\n" + pad + "]"
    return json.dumps(obj, allow_nan=False)


def to_legacy_config(cfg):
    """Rewrite a transformers-v5 style config dict (rope_parameters, dtype) the
    way most Hub checkpoints look (rope_theta + rope_scaling, torch_dtype)."""
    out = {}
    rp = cfg.get("rope_parameters")
    for k, v in cfg.items():
        if k == "rope_parameters":
            continue
        if k == "dtype":
            out["torch_dtype"] = v
            continue
        out[k] = v
    if isinstance(rp, dict) and "rope_theta" in rp and not any(isinstance(v, dict) for v in rp.values()):
        out.setdefault("rope_theta", rp["rope_theta"])
        rt = rp.get("rope_type", rp.get("type", "default"))
        if rt == "default":
            out["rope_scaling"] = None
        else:
            out["rope_scaling"] = {k: v for k, v in rp.items() if k != "rope_theta"}
    elif rp is not None:
        out["rope_parameters"] = rp  # nested / unexpected: keep as is
    return out


# ---------------------------------------------------------------------------
# Pure-python checks (no torch)
# ---------------------------------------------------------------------------

ST_DTYPE_SIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}
HF_TO_ST = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}


def read_st_header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        if n > 100 * 1024 * 1024:
            raise ValueError("%s: header length %d too large" % (path, n))
        hdr = json.loads(f.read(n).decode("utf-8"))
    size = os.path.getsize(path)
    meta = hdr.pop("__metadata__", None)
    spans = []
    for name, t in hdr.items():
        a, b = t["data_offsets"]
        nel = 1
        for d in t["shape"]:
            nel *= d
        if b - a != nel * ST_DTYPE_SIZE[t["dtype"]]:
            raise ValueError("%s: %s size mismatch" % (path, name))
        spans.append((a, b))
    spans.sort()
    pos = 0
    for a, b in spans:
        if a != pos:
            raise ValueError("%s: data not contiguous at %d" % (path, a))
        pos = b
    if 8 + n + pos != size:
        raise ValueError("%s: file size %d != 8 + %d + %d" % (path, size, n, pos))
    return hdr, meta, n


def expected_tensors(cfg):
    mt = cfg["model_type"]
    H = cfg["hidden_size"]
    nh = cfg["num_attention_heads"]
    nkv = cfg.get("num_key_value_heads") or nh
    hd = cfg.get("head_dim") or H // nh
    I = cfg["intermediate_size"]
    V = cfg["vocab_size"]
    exp = {"model.embed_tokens.weight": [V, H], "model.norm.weight": [H]}
    if not cfg.get("tie_word_embeddings", False):
        exp["lm_head.weight"] = [V, H]
    for i in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % i
        exp[p + "input_layernorm.weight"] = [H]
        exp[p + "post_attention_layernorm.weight"] = [H]
        exp[p + "self_attn.q_proj.weight"] = [nh * hd, H]
        exp[p + "self_attn.k_proj.weight"] = [nkv * hd, H]
        exp[p + "self_attn.v_proj.weight"] = [nkv * hd, H]
        exp[p + "self_attn.o_proj.weight"] = [H, nh * hd]
        if mt == "qwen3_moe":  # Hub layout: one tensor per expert
            E = cfg.get("num_experts") or cfg["num_local_experts"]  # v5 writes the latter
            MI = cfg["moe_intermediate_size"]
            exp[p + "mlp.gate.weight"] = [E, H]
            for e in range(E):
                exp[p + "mlp.experts.%d.gate_proj.weight" % e] = [MI, H]
                exp[p + "mlp.experts.%d.up_proj.weight" % e] = [MI, H]
                exp[p + "mlp.experts.%d.down_proj.weight" % e] = [H, MI]
        else:
            exp[p + "mlp.gate_proj.weight"] = [I, H]
            exp[p + "mlp.up_proj.weight"] = [I, H]
            exp[p + "mlp.down_proj.weight"] = [H, I]
        if mt.startswith("gemma"):
            exp[p + "pre_feedforward_layernorm.weight"] = [H]
            exp[p + "post_feedforward_layernorm.weight"] = [H]
        if mt in ("qwen3", "qwen3_moe", "gemma3_text"):
            exp[p + "self_attn.q_norm.weight"] = [hd]
            exp[p + "self_attn.k_norm.weight"] = [hd]
        if mt == "qwen2" or cfg.get("attention_bias"):
            exp[p + "self_attn.q_proj.bias"] = [nh * hd]
            exp[p + "self_attn.k_proj.bias"] = [nkv * hd]
            exp[p + "self_attn.v_proj.bias"] = [nkv * hd]
    return exp


def check_case(d):
    """Validate one fixture directory; returns a one-line summary."""
    case = os.path.basename(os.path.normpath(d))
    cfg = json.load(open(os.path.join(d, "config.json")))
    ref = json.load(open(os.path.join(d, "reference.json")))
    idx_path = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(idx_path):
        idx = json.load(open(idx_path))
        files = sorted(set(idx["weight_map"].values()))
        if len(files) < 2:
            raise ValueError("%s: index names fewer than 2 shards" % case)
    else:
        idx, files = None, ["model.safetensors"]
    tensors = {}
    for fn in files:
        hdr, meta, _ = read_st_header(os.path.join(d, fn))
        for name, t in hdr.items():
            if name in tensors:
                raise ValueError("%s: %s in two shards" % (case, name))
            tensors[name] = (fn, t)
            if idx is not None and idx["weight_map"].get(name) != fn:
                raise ValueError("%s: index maps %s elsewhere" % (case, name))
    if idx is not None and set(idx["weight_map"]) != set(tensors):
        raise ValueError("%s: index weight_map != shard contents" % case)
    if cfg["model_type"] in LOOSE_NAMES:
        exp = {n: list(t["shape"]) for n, (fn, t) in tensors.items()}
    else:
        exp = expected_tensors(cfg)
    missing = sorted(set(exp) - set(tensors))
    extra = sorted(set(tensors) - set(exp))
    if missing or extra:
        raise ValueError("%s: missing %s extra %s" % (case, missing, extra))
    want_dt = HF_TO_ST[ref["dtype"]]
    for name, shape in exp.items():
        fn, t = tensors[name]
        if list(t["shape"]) != shape:
            raise ValueError("%s: %s shape %s != %s" % (case, name, t["shape"], shape))
        if t["dtype"] != want_dt and not (cfg["model_type"] in LOOSE_NAMES and t["dtype"] == "F32"):
            raise ValueError("%s: %s dtype %s != %s" % (case, name, t["dtype"], want_dt))
    # reference.json consistency
    V = cfg["vocab_size"]
    thr = ref["margin_threshold"]
    mins = []
    for p in ref["prompts"]:
        toks, lg, am = p["tokens"], p["logits"], p["argmax"]
        if len(lg) != len(toks) or len(am) != len(toks):
            raise ValueError("%s: prompt rows" % case)
        if any(not (0 <= t < V) for t in toks):
            raise ValueError("%s: token out of range" % case)
        for rows, args, margins in ((lg, am, p["margins"]), (p["greedy_logits"], p["greedy"], p["greedy_margins"])):
            for row, a, m in zip(rows, args, margins):
                if len(row) != V:
                    raise ValueError("%s: row width" % case)
                s = sorted(row, reverse=True)
                if row.index(s[0]) != a or abs((s[0] - s[1]) - m) > 1e-4:
                    raise ValueError("%s: argmax/margin inconsistent" % case)
        g = p["greedy"]
        if len(g) != N_GREEDY or len(p["greedy_logits"]) != N_GREEDY:
            raise ValueError("%s: greedy length" % case)
        if p["greedy_logits"][0] != lg[-1]:
            raise ValueError("%s: greedy_logits[0] != logits[-1]" % case)
        if g[0] != am[-1]:
            raise ValueError("%s: greedy[0] != argmax[-1]" % case)
        mins.append(min(p["margins"] + p["greedy_margins"]))
    mm = min(mins)
    sizes = sum(os.path.getsize(os.path.join(d, f)) for f in files)
    return ("%-14s %-20s %-9s tensors=%3d shards=%d weights=%7d B reference=%7d B min_margin=%.4f%s lm_head=%s"
            % (case, ref["architecture"], ref["dtype"], len(tensors), len(files), sizes,
               os.path.getsize(os.path.join(d, "reference.json")), mm,
               "" if mm >= thr else " (BELOW THRESHOLD %g)" % thr,
               "present" if "lm_head.weight" in tensors else "absent(tied)"))


def check_dir(root):
    ok = True
    for case in sorted(os.listdir(root)):
        d = os.path.join(root, case)
        if not os.path.isdir(d):
            continue
        try:
            print(check_case(d))
        except Exception as e:  # report every case, then fail
            ok = False
            print("FAIL %s: %s" % (case, e))
    return ok


def selftest():
    ps = make_prompts(320)
    assert [len(p) for p in ps] == list(PROMPT_LENGTHS) and all(p[0] == BOS for p in ps)
    assert all(3 <= t < 320 for p in ps for t in p[1:])
    assert r7(1.23456789) == 1.234568 and r7(-12.3456789) == -12.34568
    s = dumps({"a": [1.5, 2], "b": [[1, 2], [3]], "c": {"d": None, "e": "x"}, "f": []})
    assert json.loads(s) == {"a": [1.5, 2], "b": [[1, 2], [3]], "c": {"d": None, "e": "x"}, "f": []}
    v5 = {"model_type": "llama", "dtype": "bfloat16", "rope_parameters": {
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0}}
    lg = to_legacy_config(v5)
    assert lg == {"model_type": "llama", "torch_dtype": "bfloat16", "rope_theta": 500000.0,
                  "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, lg
    lg = to_legacy_config({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4}})
    assert lg == {"rope_theta": 1e4, "rope_scaling": None}, lg
    assert to_legacy_config({"rope_theta": 1e4, "rope_scaling": None}) == {"rope_theta": 1e4, "rope_scaling": None}
    assert _is_norm("model.layers.0.post_feedforward_layernorm_2.weight") and _is_norm("model.norm.weight")
    assert not _is_norm("model.layers.0.mlp.down_proj.weight") and not _is_norm("x.norm_2.bias")
    lp = make_prompts(320, PROMPT_LENGTHS + (72,))
    assert lp[:3] == ps and len(lp[3]) == 72
    for name, c in CASES.items():
        cfg = {"model_type": c["model_type"], "hidden_size": c["hidden"], "num_attention_heads": c["heads"],
               "num_key_value_heads": c["kv_heads"], "head_dim": c["head_dim"], "intermediate_size": c["inter"],
               "vocab_size": c["vocab"], "num_hidden_layers": c["layers"], "tie_word_embeddings": c["tie"]}
        cfg.update(c.get("extra", {}))
        exp = expected_tensors(cfg)
        assert ("lm_head.weight" in exp) == (not c["tie"]), name
    # a fake safetensors file round trip
    import tempfile
    with tempfile.TemporaryDirectory() as td:
        p = os.path.join(td, "x.safetensors")
        hdr = {"__metadata__": {"format": "pt"}, "a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
               "b": {"dtype": "BF16", "shape": [4], "data_offsets": [24, 32]}}
        hb = json.dumps(hdr).encode()
        hb += b" " * ((8 - len(hb) % 8) % 8)
        with open(p, "wb") as f:
            f.write(struct.pack("<Q", len(hb)) + hb + bytes(32))
        h, meta, _ = read_st_header(p)
        assert meta == {"format": "pt"} and set(h) == {"a", "b"}
    print("selftest ok")
    return True


# ---------------------------------------------------------------------------
# Generation (torch + transformers)
# ---------------------------------------------------------------------------

def build_config(tf, c):
    major = int(tf.__version__.split(".")[0])
    cls = {"llama": "LlamaConfig", "mistral": "MistralConfig", "qwen2": "Qwen2Config",
           "qwen3": "Qwen3Config", "qwen3_moe": "Qwen3MoeConfig", "gemma2": "Gemma2Config",
           "gemma3_text": "Gemma3TextConfig", "gpt_oss": "GptOssConfig",
           "qwen3_next": "Qwen3NextConfig", "gemma4_text": "Gemma4TextConfig",
           "qwen3_5_text": "Qwen3_5TextConfig", "qwen3_5_moe_text": "Qwen3_5MoeTextConfig",
           "deepseek_v3": "DeepseekV3Config"}[c["model_type"]]
    cls = getattr(tf, cls)
    mt = c["model_type"]
    kw = dict(vocab_size=c["vocab"], hidden_size=c["hidden"], intermediate_size=c["inter"],
              num_hidden_layers=c["layers"], num_attention_heads=c["heads"],
              num_key_value_heads=c["kv_heads"], head_dim=c["head_dim"],
              max_position_embeddings=c["max_pos"], rms_norm_eps=c["eps"],
              initializer_range=INITIALIZER_RANGE, tie_word_embeddings=c["tie"],
              bos_token_id=BOS, eos_token_id=EOS, attention_dropout=0.0, use_cache=True)
    if mt.startswith("gemma"):
        kw["hidden_activation"] = "gelu_pytorch_tanh"
        kw["pad_token_id"] = 0
    else:
        kw["hidden_act"] = "silu"
    kw.update(c.get("extra", {}))
    local_base = kw.pop("rope_local_base_freq", None)
    if major >= 5:
        rp = {"rope_type": "default", "rope_theta": c["rope_theta"]}
        if c["rope_scaling"]:
            rp = dict(c["rope_scaling"])
            rp["rope_theta"] = c["rope_theta"]
        kw["rope_parameters"] = rp
        if local_base is not None:  # gemma3: one rope per layer type
            kw["rope_parameters"] = {"full_attention": rp, "sliding_attention": {
                "rope_type": "default", "rope_theta": local_base}}
    else:
        kw["rope_theta"] = c["rope_theta"]
        kw["rope_scaling"] = c["rope_scaling"]
        if local_base is not None:
            kw["rope_local_base_freq"] = local_base
    if c["model_type"] in ("mistral", "qwen2", "qwen3"):
        kw["sliding_window"] = None
    if c["model_type"] in ("qwen2", "qwen3"):
        kw["use_sliding_window"] = False
    if c.get("rope_per_type") and major >= 5:  # gemma4: one rope per layer type
        kw["rope_parameters"] = copy.deepcopy(c["rope_per_type"])
    if mt == "deepseek_v3":  # the config sets head_dim = qk_rope_head_dim itself
        kw.pop("head_dim")
    fields = getattr(cls, "__dataclass_fields__", None)
    if fields:  # v5 dataclass configs: leave out common keys this family does not declare
        for k in ("intermediate_size", "head_dim"):
            if k in kw and k not in fields and k not in c.get("extra", {}):
                kw.pop(k)
    cfg = cls(**kw)
    for k, v in c.get("extra", {}).items():  # a silently dropped setting is a wrong fixture
        if k != "rope_local_base_freq" and getattr(cfg, k, None) != v and not _per_layer_kept(cfg, k, v):
            raise RuntimeError("%s: config did not keep %s=%r (has %r)" % (mt, k, v, getattr(cfg, k, None)))
    if mt == "deepseek_v3" and cfg.head_dim != c["head_dim"]:
        raise RuntimeError("deepseek_v3: head_dim %r != qk_rope_head_dim %r" % (cfg.head_dim, c["head_dim"]))
    cfg.architectures = [c["architecture"]]
    return cfg


def _per_layer_kept(cfg, k, v):
    """True if a PER_LAYER_KEYS setting landed in every full layer's entry of
    cfg.per_layer_config, as some transformers versions keep Gemma 4's."""
    plc = getattr(cfg, "per_layer_config", None)
    if k not in PER_LAYER_KEYS or not plc:
        return False
    full = [i for i, t in enumerate(cfg.layer_types) if t == "full_attention"]
    def get(i):
        d = plc.get(i, plc.get(str(i))) if isinstance(plc, dict) else plc[i]
        return d.get(PER_LAYER_KEYS[k]) if isinstance(d, dict) else getattr(d, PER_LAYER_KEYS[k], None)
    return bool(full) and all(get(i) == v for i in full)


# transformers 5 runs MoE experts through torch grouped_mm by default, which
# takes no float64; its "eager" loop over experts does.
EAGER = dict(attn_implementation="eager", experts_implementation="eager")


def make_model(tf, torch, cfg):
    try:
        m = tf.AutoModelForCausalLM.from_config(cfg, **EAGER)
    except TypeError:
        cfg._attn_implementation = "eager"
        m = tf.AutoModelForCausalLM.from_config(cfg)
    return m.to(torch.float32).eval()


def init_params(torch, model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        _init_params(torch, model, g)
        if model.config.tie_word_embeddings and model.lm_head.weight is not model.model.embed_tokens.weight:
            model.lm_head.weight.copy_(model.model.embed_tokens.weight)
        # Persistent buffers that change the function (saved with the weights):
        # Gemma 4's per-layer output scalar, DeepSeek-V3's expert selection
        # bias.  Rounded to bf16 so the saved and in-memory models agree.
        for name, b in model.named_buffers():
            if name.endswith("layer_scalar") or name.endswith("e_score_correction_bias"):
                r = torch.randn(tuple(b.shape), generator=g, dtype=torch.float64)
                v = (1.0 + NORM_STD * r).clamp(min=0.5) if name.endswith("layer_scalar") else BIAS_STD * r
                b.copy_(v.to(torch.bfloat16).to(b.dtype))


def _is_norm(name):
    """An RMSNorm gain: *norm.weight, or Gemma 4's *layernorm_1/_2.weight."""
    stem = name[: -len(".weight")] if name.endswith(".weight") else ""
    return stem.endswith("norm") or (stem[-2:] in ("_1", "_2") and stem[:-2].endswith("norm"))


def _init_params(torch, model, g):
    mt = model.config.model_type
    for name, p in model.named_parameters():  # a tied lm_head appears once
        shape = tuple(p.shape)
        r = torch.randn(shape, generator=g, dtype=torch.float64)
        if name.endswith("embed_tokens.weight") or name == "lm_head.weight":
            v = r * EMB_STD
        elif name.endswith("embed_tokens_per_layer.weight"):  # Gemma 4: scaled by sqrt(ple) in use
            v = r / math.sqrt(model.config.hidden_size_per_layer_input)
        elif name.endswith("router.scale") or name.endswith("router.per_expert_scale"):  # Gemma 4
            v = 1.0 + NORM_STD * r
        elif name.endswith("A_log"):  # Gated DeltaNet decay: A = exp(A_log) in about [1, 16]
            v = math.log(4.0) + 0.5 * r
        elif name.endswith("self_attn.sinks"):  # gpt-oss: one logit per head in the softmax
            v = r
        elif _is_norm(name) and mt in NORM_PLUS_ONE and ".linear_attn." not in name:
            # Gemma stores w of x * (1 + w): N(0, NORM_STD^2) gives the same gains
            # Gemma stores w of x * (1 + w).  Its post-block norms get gains
            # near 3: with tied embeddings scaled by sqrt(hidden) the token's
            # own embedding otherwise dominates and greedy repeats the input.
            v = NORM_STD * r + (2.0 if mt.startswith("gemma") and ".post_" in name else 0.0)
        elif _is_norm(name):
            # Gemma 4 multiplies by w itself: gains near 3 on its post-block norms, as above
            v = 1.0 + NORM_STD * r + (2.0 if mt == "gemma4_text" and ".post_" in name else 0.0)
        elif name.endswith(".bias") or name.endswith("_bias"):
            v = BIAS_STD * r
        elif len(shape) == 3 and shape[1] == 1:  # depthwise conv1d [C][1][K]
            v = r * (GAIN / math.sqrt(shape[-1]))
        elif len(shape) in (2, 3):  # 3-D: fused experts [E][out][in] (or [E][in][out])
            fan_in = shape[-1] if len(shape) == 2 else _expert_fan_in(name, shape, model.config)
            v = r * (GAIN / math.sqrt(fan_in))
        else:
            raise RuntimeError("no init rule for %s %s" % (name, shape))
        p.copy_(v.to(p.dtype))


def _expert_fan_in(name, shape, cfg):
    """Input width of a fused expert tensor, whichever way round it is stored."""
    H = cfg.hidden_size
    MI = getattr(cfg, "moe_intermediate_size", None) or cfg.intermediate_size
    if name.endswith("down_proj"):
        return MI
    return H


def split_fused_experts(torch, d, cfg, notes):
    """Rewrite fused expert tensors (transformers 5 keeps experts as one 3-D
    parameter) into the per-expert names Hub checkpoints use, so the fixture
    looks like Qwen3-30B-A3B's files.  No-op when save_pretrained already did."""
    from safetensors.torch import load_file, save_file
    path = os.path.join(d, "model.safetensors")
    sd = load_file(path)
    fused = [k for k in sd if k.endswith("mlp.experts.gate_up_proj") or k.endswith("mlp.experts.down_proj")]
    notes.append("save_pretrained wrote expert tensors %s" % (
        "fused (%s); split into per-expert Hub names" % sorted(set(k.split(".")[-1] + str(list(sd[k].shape)) for k in fused))
        if fused else "per expert (Hub names)"))
    if not fused:
        return
    E = getattr(cfg, "num_experts", None) or cfg.n_routed_experts  # deepseek_v3: n_routed_experts
    H, MI = cfg.hidden_size, cfg.moe_intermediate_size
    out = {}
    for k, v in sd.items():
        if k.endswith("mlp.experts.gate_up_proj"):
            pre = k[: -len("gate_up_proj")]
            if tuple(v.shape) == (E, H, 2 * MI):  # [E][in][out]
                v = v.transpose(1, 2)
            assert tuple(v.shape) == (E, 2 * MI, H), v.shape
            for e in range(E):
                out[pre + "%d.gate_proj.weight" % e] = v[e, :MI].contiguous()
                out[pre + "%d.up_proj.weight" % e] = v[e, MI:].contiguous()
        elif k.endswith("mlp.experts.down_proj"):
            pre = k[: -len("down_proj")]
            if tuple(v.shape) == (E, MI, H):
                v = v.transpose(1, 2)
            assert tuple(v.shape) == (E, H, MI), v.shape
            for e in range(E):
                out[pre + "%d.down_proj.weight" % e] = v[e].contiguous()
        else:
            out[k] = v
    save_file(out, path, metadata={"format": "pt"})


def stored_f64(torch, base, store):
    """float64 copy of base whose parameters are rounded to the storage dtype.
    Only parameters: model.to(bfloat16) would also round the float32 rotary
    inv_freq buffer, which a model loaded from disk recomputes in float32."""
    m = copy.deepcopy(base)
    with torch.no_grad():
        for p in m.parameters():
            p.data = p.data.to(store).to(torch.float64)
    return m.to(torch.float64).eval()


def top2(torch, rows):
    t = torch.topk(rows, 2, dim=-1).values
    return (t[..., 0] - t[..., 1])


def run_prompts(torch, model, prompts, thr=None, dev="cpu"):
    """Prompt logits at every position + N_GREEDY greedy steps, no KV cache
    (each step re-runs the whole sequence).  With thr set, returns None as soon
    as a margin below thr is seen (seed search)."""
    out = []
    with torch.no_grad():
        for p in prompts:
            lg = model(input_ids=torch.tensor([p], device=dev), use_cache=False).logits[0]
            marg = top2(torch, lg)
            if thr is not None and float(marg.min()) < thr:
                return None
            seq = list(p)
            glog, gtok, gmar = [], [], []
            row = lg[-1]
            for step in range(N_GREEDY):
                if step > 0:
                    row = model(input_ids=torch.tensor([seq], device=dev), use_cache=False).logits[0, -1]
                m = float(top2(torch, row))
                if thr is not None and m < thr:
                    return None
                t = int(torch.argmax(row))
                glog.append(row.detach().to("cpu", torch.float64))
                gtok.append(t)
                gmar.append(m)
                seq.append(t)
            out.append(dict(tokens=list(p), logits=lg.detach().to("cpu", torch.float64),
                            margins=marg.to("cpu", torch.float64).tolist(),
                            greedy=gtok, greedy_logits=torch.stack(glog), greedy_margins=gmar))
    return out


def min_margin(res):
    return min(min(r["margins"] + r["greedy_margins"]) for r in res)


def kv_cache_greedy(torch, model, prompt, dev):
    """Greedy decode through the model's own KV cache (prefill, then one token per step)."""
    with torch.no_grad():
        out = model(input_ids=torch.tensor([prompt], device=dev), use_cache=True)
        past, rows, toks = out.past_key_values, [], []
        row = out.logits[0, -1]
        for step in range(N_GREEDY):
            rows.append(row.to("cpu", torch.float64))
            t = int(torch.argmax(row))
            toks.append(t)
            if step + 1 < N_GREEDY:
                out = model(input_ids=torch.tensor([[t]], device=dev), past_key_values=past, use_cache=True)
                past, row = out.past_key_values, out.logits[0, -1]
    return toks, torch.stack(rows)


def write_shards(torch, model, d, max_bytes):
    """Manual sharding fallback (HF layout) if save_pretrained did not shard."""
    from safetensors.torch import save_file
    sd = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        sd.pop("lm_head.weight", None)
    groups, cur, size = [], {}, 0
    for k in sorted(sd):
        nb = sd[k].numel() * sd[k].element_size()
        if cur and size + nb > max_bytes:
            groups.append(cur)
            cur, size = {}, 0
        cur[k] = sd[k]
        size += nb
    groups.append(cur)
    for f in os.listdir(d):
        if f.endswith(".safetensors") or f == "model.safetensors.index.json":
            os.remove(os.path.join(d, f))
    wm, total = {}, 0
    for i, g in enumerate(groups):
        fn = "model-%05d-of-%05d.safetensors" % (i + 1, len(groups))
        save_file(g, os.path.join(d, fn), metadata={"format": "pt"})
        for k, v in g.items():
            wm[k] = fn
            total += v.numel() * v.element_size()
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": wm}, f, indent=2, sort_keys=True)
        f.write("\n")


def save_model(tf, torch, base, store, d, shard, notes):
    to_save = copy.deepcopy(base).to(store)
    for attempt in ([shard, 150000, 100000] if shard else [None]):
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        to_save.save_pretrained(d, **({"max_shard_size": attempt} if attempt else {}))
        files = os.listdir(d)
        nshards = len([f for f in files if f.endswith(".safetensors")])
        if not shard or (nshards >= 2 and "model.safetensors.index.json" in files):
            return
    notes.append("save_pretrained did not shard; shards written with safetensors.torch.save_file")
    write_shards(torch, to_save, d, 150000)


def load_saved(tf, torch, d, tie, notes):
    try:
        r = tf.AutoModelForCausalLM.from_pretrained(d, **EAGER)
    except TypeError:
        r = tf.AutoModelForCausalLM.from_pretrained(d)
    loaded_dtype = str(next(r.parameters()).dtype).replace("torch.", "")
    r = r.to(torch.float64).eval()
    if tie and r.lm_head.weight is not r.model.embed_tokens.weight:
        notes.append("reloaded tied model: lm_head is a separate tensor")
        if not torch.equal(r.lm_head.weight, r.model.embed_tokens.weight):
            raise RuntimeError("reloaded tied model has lm_head != embed_tokens")
    return r, loaded_dtype


def compare(torch, a_res, b_res):
    diff = 0.0
    for a, b in zip(a_res, b_res):
        diff = max(diff, float((a["logits"] - b["logits"]).abs().max()))
        if a["greedy"] == b["greedy"]:
            diff = max(diff, float((a["greedy_logits"] - b["greedy_logits"]).abs().max()))
    return diff, all(a["greedy"] == b["greedy"] for a, b in zip(a_res, b_res))


def generate_case(tf, torch, name, c, outroot, thr, max_seeds, case_budget_s):
    t0 = time.time()
    store = getattr(torch, c["dtype"])
    cfg = build_config(tf, c)
    base = make_model(tf, torch, cfg)
    notes = []
    tied_shared = base.lm_head.weight is base.model.embed_tokens.weight
    if c["tie"] and not tied_shared:
        notes.append("tied model built with lm_head not sharing embed_tokens; copied explicitly")
    if not c["tie"] and tied_shared:
        raise RuntimeError("untied config produced a shared lm_head")
    prompts = make_prompts(c["vocab"], c.get("prompt_lengths", PROMPT_LENGTHS))
    # --- seed search: first seed whose margins are all >= thr (evaluated on the
    # weights rounded to the storage dtype, in float64)
    best = None  # (min_margin, seed)
    chosen = None
    tried = 0
    for seed in range(c["seed0"], c["seed0"] + max_seeds):
        tried += 1
        init_params(torch, base, seed)
        m64 = stored_f64(torch, base, store)
        res = run_prompts(torch, m64, prompts, thr=thr)
        if res is not None:
            chosen = seed
            break
        if time.time() - t0 > case_budget_s:
            break
    if chosen is None:
        # fall back: best min margin among a few seeds, evaluated fully
        for seed in range(c["seed0"], c["seed0"] + min(tried, 4)):
            init_params(torch, base, seed)
            m64 = stored_f64(torch, base, store)
            mm = min_margin(run_prompts(torch, m64, prompts))
            if best is None or mm > best[0]:
                best = (mm, seed)
        chosen = best[1]
        print("[%s] WARNING: no seed reached margin %g in %d tries; using seed %d (min margin %.4g)"
              % (name, thr, tried, chosen, best[0]), flush=True)
    init_params(torch, base, chosen)
    # --- save in the storage dtype
    d = os.path.join(outroot, name)
    save_model(tf, torch, base, store, d, c["shard"], notes)
    if c["model_type"] in SPLIT_EXPERTS:
        split_fused_experts(torch, d, cfg, notes)
        r_split, _ = load_saved(tf, torch, d, c["tie"], [])
        diff_split, same_split = compare(torch, run_prompts(torch, r_split, prompts),
                                         run_prompts(torch, stored_f64(torch, base, store), prompts))
        if not (same_split and diff_split <= 1e-6):  # transformers cannot read them back: keep fused
            notes.append("per-expert tensors did not load back in transformers (diff %g); fused kept" % diff_split)
            save_model(tf, torch, base, store, d, c["shard"], notes)
    cfg_path = os.path.join(d, "config.json")
    native_cfg = json.load(open(cfg_path))
    # --- reload the SAVED model; the reference is computed from it (float64, CPU)
    r, loaded_dtype = load_saved(tf, torch, d, c["tie"], notes)
    res = run_prompts(torch, r, prompts)
    # sanity: the in-memory model of the seed search gives the same thing
    res_mem = run_prompts(torch, stored_f64(torch, base, store), prompts)
    reload_diff, reload_same_tokens = compare(torch, res, res_mem)
    if not (reload_same_tokens and reload_diff <= 1e-6):
        msg = ("reloaded model differs from the in-memory one (max abs diff %g, same greedy %s); "
               "reference is taken from the reloaded model" % (reload_diff, reload_same_tokens))
        print("[%s] WARNING: %s" % (name, msg), flush=True)
        notes.append(msg)
    config_style = "native"
    if c["config_style"] == "legacy":
        with open(cfg_path, "w") as f:
            json.dump(to_legacy_config(native_cfg), f, indent=2, sort_keys=True)
            f.write("\n")
        r2, _ = load_saved(tf, torch, d, c["tie"], notes)
        res2 = run_prompts(torch, r2, prompts)
        diff2, same2 = compare(torch, res2, res)
        if same2 and diff2 == 0.0:
            config_style = "legacy"
        else:
            print("[%s] legacy config.json changes the model (diff %g); keeping the native one"
                  % (name, diff2), flush=True)
            notes.append("legacy-style config.json did not reproduce the model; native config kept")
            with open(cfg_path, "w") as f:
                json.dump(native_cfg, f, indent=2, sort_keys=True)
                f.write("\n")
    # --- float32 cross-checks (CUDA, TF32 off): full-sequence teacher forcing,
    # and greedy decode through HF's KV cache
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    m32 = copy.deepcopy(r).to(torch.float32).to(dev).eval()
    f32_prompt, f32_greedy, kv_diff, kv_tokens_ok, kv_err = 0.0, 0.0, None, None, None
    with torch.no_grad():
        for x in res:
            T = len(x["tokens"])
            full = x["tokens"] + x["greedy"][:-1]
            lg = m32(input_ids=torch.tensor([full], device=dev), use_cache=False).logits[0].to("cpu", torch.float64)
            f32_prompt = max(f32_prompt, float((lg[:T] - x["logits"]).abs().max()))
            f32_greedy = max(f32_greedy, float((lg[T - 1:] - x["greedy_logits"]).abs().max()))
        try:
            kv_diff, kv_tokens_ok = 0.0, True
            for x in res:
                toks, rows = kv_cache_greedy(torch, m32, x["tokens"], dev)
                kv_tokens_ok = kv_tokens_ok and toks == x["greedy"]
                kv_diff = max(kv_diff, float((rows - x["greedy_logits"]).abs().max()))
        except Exception as e:  # informational only
            kv_diff, kv_tokens_ok, kv_err = None, None, "%s: %s" % (type(e).__name__, e)
    # --- write reference.json
    prompts_out = []
    absmax = 0.0
    for x in res:
        absmax = max(absmax, float(x["logits"].abs().max()), float(x["greedy_logits"].abs().max()))
        prompts_out.append({
            "tokens": x["tokens"],
            "argmax": [int(v) for v in x["logits"].argmax(-1).tolist()],
            "margins": [r7(v) for v in x["margins"]],
            "min_margin": r7(min(x["margins"])),
            "greedy": x["greedy"],
            "greedy_margins": [r7(v) for v in x["greedy_margins"]],
            "greedy_min_margin": r7(min(x["greedy_margins"])),
            "logits": [[r7(v) for v in row] for row in x["logits"].tolist()],
            "greedy_logits": [[r7(v) for v in row] for row in x["greedy_logits"].tolist()],
        })
    weights = sorted(f for f in os.listdir(d) if f.endswith(".safetensors"))
    ref = {
        "format_version": FORMAT_VERSION,
        "case": name,
        "architecture": c["architecture"],
        "model_type": c["model_type"],
        "dtype": c["dtype"],
        "weight_files": weights,
        "sharded": bool(c["shard"]),
        "tie_word_embeddings": c["tie"],
        "config_style": config_style,
        "shapes": {"vocab_size": c["vocab"], "hidden_size": c["hidden"], "intermediate_size": c["inter"],
                   "num_hidden_layers": c["layers"], "num_attention_heads": c["heads"],
                   "num_key_value_heads": c["kv_heads"], "head_dim": c["head_dim"]},
        "extra": c.get("extra", {}),
        "rope_theta": c["rope_theta"],
        "rope_scaling": c["rope_scaling"],
        "rms_norm_eps": c["eps"],
        "bos_token_id": BOS,
        "eos_token_id": EOS,
        "seed": chosen,
        "seeds_tried": tried,
        "init": {"matrix_std": "%g/sqrt(fan_in)" % GAIN, "embedding_std": EMB_STD,
                 "norm_weight": "1 + %g*N(0,1)" % NORM_STD, "bias_std": BIAS_STD},
        "torch_version": torch.__version__,
        "transformers_version": tf.__version__,
        "reference_compute": "reloaded saved model, float64 on CPU, eager attention, no KV cache "
                             "(HF upcasts/downcasts RMSNorm, softmax and RoPE cos/sin through float32 internally)",
        "loaded_dtype": loaded_dtype,
        "n_greedy": N_GREEDY,
        "margin_threshold": thr,
        "min_margin": r7(min_margin(res)),
        "logit_absmax": r7(absmax),
        "crosscheck": {
            "reload_vs_in_memory_max_abs_diff": reload_diff,
            "reload_vs_in_memory_same_greedy": reload_same_tokens,
            "float32_device": dev + ("" if dev == "cpu" else " (TF32 off)"),
            "float32_prompt_logits_max_abs_diff": r7(f32_prompt),
            "float32_greedy_logits_max_abs_diff": r7(f32_greedy),
            "float32_kv_cache_greedy_logits_max_abs_diff": None if kv_diff is None else r7(kv_diff),
            "float32_kv_cache_same_greedy": kv_tokens_ok,
            "float32_kv_cache_error": kv_err,
        },
        "notes": notes,
        "prompts": prompts_out,
    }
    with open(os.path.join(d, "reference.json"), "w") as f:
        f.write(dumps(ref))
        f.write("\n")
    summary = dict(case=name, seed=chosen, tried=tried, min_margin=ref["min_margin"], files=sorted(os.listdir(d)),
                   config_style=config_style, loaded_dtype=loaded_dtype, logit_absmax=ref["logit_absmax"],
                   **ref["crosscheck"], secs=round(time.time() - t0, 1))
    print("[%s] %s" % (name, json.dumps(summary)), flush=True)
    return summary


def generate(args):
    import torch
    import transformers as tf
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        torch.set_float32_matmul_precision("highest")
    except Exception:
        pass
    torch.set_num_threads(max(1, min(8, os.cpu_count() or 1)))
    try:
        tf.logging.set_verbosity_error()
    except Exception:
        pass
    print("torch %s transformers %s cuda %s" % (torch.__version__, tf.__version__, torch.cuda.is_available()), flush=True)
    names = args.cases.split(",") if args.cases else list(CASES)
    os.makedirs(args.out, exist_ok=True)
    summaries, failed = [], []
    t0 = time.time()
    for i, n in enumerate(names):
        left = args.total_budget - (time.time() - t0)
        budget = max(3.0, min(args.case_budget, 0.6 * left / (len(names) - i)))
        try:
            summaries.append(generate_case(tf, torch, n, CASES[n], args.out, args.threshold,
                                           args.max_seeds, budget))
        except Exception:
            import traceback
            traceback.print_exc()
            failed.append(n)
            sys.stdout.flush()
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump({"torch_version": torch.__version__, "transformers_version": tf.__version__,
                   "cases": summaries, "failed": failed}, f, indent=1)
    ok = check_dir(args.out)
    return ok and not failed


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "hf"))
    ap.add_argument("--cases", default="", help="comma-separated subset of: " + ",".join(CASES))
    ap.add_argument("--threshold", type=float, default=0.02, help="min top1-top2 logit margin")
    ap.add_argument("--max-seeds", type=int, default=300)
    ap.add_argument("--case-budget", type=float, default=20.0, help="seconds of seed search per case")
    ap.add_argument("--total-budget", type=float, default=150.0, help="seconds for all cases (seed search shrinks)")
    ap.add_argument("--check", metavar="DIR", help="validate fixtures in DIR (no torch)")
    ap.add_argument("--selftest", action="store_true")
    a = ap.parse_args()
    if a.selftest:
        return 0 if selftest() else 1
    if a.check:
        return 0 if check_dir(a.check) else 1
    return 0 if generate(a) else 1


if __name__ == "__main__":
    sys.exit(main())
