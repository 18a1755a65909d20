#!/usr/bin/python3
"""hf_to_gguf.py - a tiny Hugging Face fixture as GGUF, in llama.cpp's layout.

Usage: PYTHONPATH=build-llama/llama.cpp/gguf-py scripts/llama-ref/hf_to_gguf.py \
           HF_DIR OUT.gguf [--experts-f32] [--experts=mxfp4|mxfp4-values]
           [--no-rope-scaling]

Writes tests/fixtures/hf/<case> (gemma2, gemma3_text, gpt_oss, qwen3_moe)
the way llama.cpp's convert_hf_to_gguf.py lays these families out, so that
llama.cpp runs the same model transformers did and its logits can be the
reference for Petrel's GGUF loader (scripts/llama-ref/record.py).  The
names, hyperparameter keys and conventions are read from llama.cpp's
gguf-py (constants.py, tensor_mapping.py) and src/models/*.cpp; nothing is
copied from its converter.  Needs numpy and gguf-py, nothing else:
safetensors are parsed here.

Conventions, family by family:
  every family  weights f32 (the fixtures store bf16/f16: exact in f32);
                q/k not permuted (these families rope NEOX-style); the
                vocabulary a plain SentencePiece-style list (<unk> <s> </s>,
                256 byte tokens, then filler pieces): only token ids are used.
  gemma2/3      every *norm.weight stored as 1 + w (llama.cpp runs a plain
                RMSNorm); the window layers as attention.sliding_window_pattern
                (a period: layer l slides iff l % p < p - 1).  llama.cpp has
                no key for query_pre_attn_scalar: it scales scores by
                head_dim^-1/2 (dim/heads for the 27B layer counts).  Where
                the config says otherwise the ratio is folded into the query
                (Gemma 2: q_proj; Gemma 3: the q norm gain, after its norm),
                which is the same model.
  gpt_oss       experts as 3-D ffn_{gate,up,down}_exps (+ .bias), gate and up
                de-interleaved from gate_up_proj; the checkpoint's MXFP4
                blocks repacked into ggml's block_mxfp4 (scale byte, then
                element i in the low nibble of byte i, i + 16 in the high),
                or with --experts-f32 decoded to f32 (exact) - a path no
                fixture exercises (theirs are bf16).  Unquantized
                experts (the bf16 fixture) stay f32, or --experts=mxfp4
                quantizes them as ggml does, and --experts=mxfp4-values
                writes those MXFP4 values decoded to f32: the exact model a
                quantized file stands for, to judge kernels by; yarn rope as
                rope.scaling.* (llama.cpp rounds the correction range
                outwards whatever the config's "truncate" says;
                --no-rope-scaling leaves YaRN out: a model both engines
                rope alike, for checks against llama.cpp alone).
  qwen3_moe     experts stacked into 3-D ffn_*_exps.
"""
import json
import math
import os
import struct
import sys

import numpy as np
import gguf

from gguf_arch import add_vocab, meta_gemma, meta_gpt_oss, meta_qwen3_moe


# ---- safetensors ---------------------------------------------------------------

def read_safetensors(hf_dir):
    index = os.path.join(hf_dir, "model.safetensors.index.json")
    files = (sorted(set(json.load(open(index))["weight_map"].values()))
             if os.path.exists(index) else ["model.safetensors"])
    out = {}
    for fn in files:
        raw = open(os.path.join(hf_dir, fn), "rb").read()
        (n,) = struct.unpack("<Q", raw[:8])
        header = json.loads(raw[8:8 + n])
        for name, info in header.items():
            if name == "__metadata__":
                continue
            a, b = info["data_offsets"]
            buf = raw[8 + n + a:8 + n + b]
            dt = info["dtype"]
            if dt == "BF16":
                x = (np.frombuffer(buf, "<u2").astype(np.uint32) << 16).view(np.float32)
            elif dt == "F16":
                x = np.frombuffer(buf, "<f2").astype(np.float32)
            elif dt == "F32":
                x = np.frombuffer(buf, "<f4").copy()
            elif dt == "U8":
                x = np.frombuffer(buf, np.uint8)
            else:
                sys.exit(f"{fn}: tensor {name}: dtype {dt} not handled")
            out[name] = x.reshape(info["shape"])
    return out


# ---- common pieces ---------------------------------------------------------------

ATTN = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
        "self_attn.k_norm": "attn_k_norm", "input_layernorm": "attn_norm",
        "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
PER_FAMILY = {
    "gemma": {"post_attention_layernorm": "post_attention_norm",
              "pre_feedforward_layernorm": "ffn_norm",
              "post_feedforward_layernorm": "post_ffw_norm"},
    "gpt_oss": {"post_attention_layernorm": "post_attention_norm", "mlp.router": "ffn_gate_inp"},
    "qwen3_moe": {"post_attention_layernorm": "ffn_norm", "mlp.gate": "ffn_gate_inp"},
}


def gguf_name(hf, family):
    """model.layers.3.self_attn.q_proj.weight -> blk.3.attn_q.weight; None: handled elsewhere."""
    top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
           "lm_head.weight": "output.weight"}
    if hf in top:
        return top[hf]
    parts = hf.split(".")
    if parts[:2] != ["model", "layers"]:
        return None
    layer, rest = parts[2], ".".join(parts[3:])
    if family == "gpt_oss" and rest == "self_attn.sinks":
        return f"blk.{layer}.attn_sinks.weight"
    module, kind = rest.rsplit(".", 1)
    table = dict(ATTN, **PER_FAMILY[family])
    return f"blk.{layer}.{table[module]}.{kind}" if module in table else None


# ---- families ---------------------------------------------------------------------

def gemma(w, cfg, t, gemma3):
    L, H = cfg["num_hidden_layers"], cfg["hidden_size"]
    hd = meta_gemma(w, cfg, gemma3)
    # llama.cpp's score scale (src/models/gemma{2,3}.cpp): 1/sqrt(head_dim),
    # or 1/sqrt(dim/heads) for the 27B layer counts.
    big = L == (62 if gemma3 else 46)
    implied = H / cfg["num_attention_heads"] if big else hd
    fold = math.sqrt(implied / cfg.get("query_pre_attn_scalar", hd))
    out = {}
    for name, x in t.items():
        g = gguf_name(name, "gemma")
        if g is None:
            sys.exit(f"{name}: no GGUF name")
        x = x.astype(np.float32)
        if g.endswith("norm.weight"):
            x = x + np.float32(1)
        if fold != 1 and (g.endswith("attn_q_norm.weight") if gemma3 else g.endswith("attn_q.weight")):
            x = x * np.float32(fold)
        out[g] = x
    if cfg.get("tie_word_embeddings", True):
        out.pop("output.weight", None)
    return out


def mxfp4_to_ggml(blocks, scales):
    """[..., nb, 16] checkpoint nibbles (element 2j low, 2j + 1 high of byte j)
    and [..., nb] e8m0 scales -> [..., nb, 17] ggml block_mxfp4."""
    el = np.stack([blocks & 15, blocks >> 4], axis=-1).reshape(blocks.shape[:-1] + (32,))
    packed = (el[..., :16] | (el[..., 16:] << 4)).astype(np.uint8)
    return np.concatenate([scales[..., None], packed], axis=-1)


E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], np.float32)


def mxfp4_to_f32(blocks, scales):
    el = np.stack([blocks & 15, blocks >> 4], axis=-1).reshape(blocks.shape[:-1] + (32,))
    v = E2M1[el] * np.ldexp(np.float32(1), scales.astype(np.int32) - 127)[..., None]
    return v.reshape(blocks.shape[:-2] + (-1,)).astype(np.float32)


def gpt_oss(w, cfg, t, experts_f32, requant):
    meta_gpt_oss(w, cfg, "--no-rope-scaling" not in sys.argv)
    L = cfg["num_hidden_layers"]
    out = {}
    for name, x in t.items():
        if ".mlp.experts." in name:
            continue
        g = gguf_name(name, "gpt_oss")
        if g is None:
            sys.exit(f"{name}: no GGUF name")
        out[g] = x.astype(np.float32)
    for l in range(L):
        p = f"model.layers.{l}.mlp.experts."
        if p + "gate_up_proj_blocks" in t:
            conv = mxfp4_to_f32 if experts_f32 else mxfp4_to_ggml
            gu = conv(t[p + "gate_up_proj_blocks"], t[p + "gate_up_proj_scales"])  # [E][2F][...]
            dn = conv(t[p + "down_proj_blocks"], t[p + "down_proj_scales"])
            if not experts_f32:
                gu, dn = gu.reshape(gu.shape[:2] + (-1,)), dn.reshape(dn.shape[:2] + (-1,))
            gate, up = gu[:, 0::2], gu[:, 1::2]
        else:  # unquantized: gate_up [E][D][2F] input-major, down [E][F][D]
            gu = t[p + "gate_up_proj"].astype(np.float32)
            gate, up = gu[:, :, 0::2].transpose(0, 2, 1), gu[:, :, 1::2].transpose(0, 2, 1)
            dn = t[p + "down_proj"].astype(np.float32).transpose(0, 2, 1)
        for kind, x in (("gate", gate), ("up", up), ("down", dn)):
            x = np.ascontiguousarray(x)
            if requant and x.dtype == np.float32:  # ggml's MXFP4 (gguf-py's port of it)
                x = gguf.quants.quantize(x, gguf.GGMLQuantizationType.MXFP4)
                if requant == "mxfp4-values":  # the same values, decoded: exact in f32
                    x = gguf.quants.dequantize(x, gguf.GGMLQuantizationType.MXFP4)
            out[f"blk.{l}.ffn_{kind}_exps.weight"] = x
        gub = t[p + "gate_up_proj_bias"].astype(np.float32)
        out[f"blk.{l}.ffn_gate_exps.bias"] = np.ascontiguousarray(gub[:, 0::2])
        out[f"blk.{l}.ffn_up_exps.bias"] = np.ascontiguousarray(gub[:, 1::2])
        out[f"blk.{l}.ffn_down_exps.bias"] = t[p + "down_proj_bias"].astype(np.float32)
    return out


def qwen3_moe(w, cfg, t):
    meta_qwen3_moe(w, cfg)
    E, L = cfg.get("num_experts") or cfg["num_local_experts"], cfg["num_hidden_layers"]
    out = {}
    for name, x in t.items():
        if ".mlp.experts." in name:
            continue
        g = gguf_name(name, "qwen3_moe")
        if g is None:
            sys.exit(f"{name}: no GGUF name")
        out[g] = x.astype(np.float32)
    for l in range(L):
        for proj, kind in (("gate_proj", "gate"), ("up_proj", "up"), ("down_proj", "down")):
            out[f"blk.{l}.ffn_{kind}_exps.weight"] = np.stack(
                [t[f"model.layers.{l}.mlp.experts.{e}.{proj}.weight"].astype(np.float32) for e in range(E)])
    return out


ARCH = {"gemma2": "gemma2", "gemma3_text": "gemma3", "gpt_oss": "gpt-oss", "qwen3_moe": "qwen3moe"}


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    if len(args) != 2:
        sys.exit(__doc__)
    hf_dir, out_path = args
    cfg = json.load(open(os.path.join(hf_dir, "config.json")))
    mt = cfg["model_type"]
    if mt not in ARCH:
        sys.exit(f"model_type {mt} not handled (handled: {', '.join(ARCH)})")
    t = read_safetensors(hf_dir)
    w = gguf.GGUFWriter(out_path, ARCH[mt])
    w.add_name(os.path.basename(os.path.normpath(hf_dir)))
    if mt in ("gemma2", "gemma3_text"):
        tensors = gemma(w, cfg, t, mt == "gemma3_text")
    elif mt == "gpt_oss":
        requant = next((a[len("--experts="):] for a in sys.argv if a.startswith("--experts=")), None)
        tensors = gpt_oss(w, cfg, t, "--experts-f32" in sys.argv, requant)
    else:
        tensors = qwen3_moe(w, cfg, t)
    add_vocab(w, cfg["vocab_size"], cfg)
    for name in sorted(tensors, key=lambda n: (n.startswith("blk."), n)):
        x = tensors[name]
        if x.dtype == np.uint8:
            w.add_tensor(name, x, raw_dtype=gguf.GGMLQuantizationType.MXFP4)
        else:
            w.add_tensor(name, np.ascontiguousarray(x, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"{out_path}: {ARCH[mt]}, {len(tensors)} tensors")


if __name__ == "__main__":
    main()
