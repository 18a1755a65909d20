#!/usr/bin/python3
"""dummy_gguf.py - a GGUF file of a real model's shapes with random weights,
in llama.cpp's layout, so that Petrel and llama.cpp can be timed on the same
file (issues 16 and 17: "llama.cpp on the same GGUF, as ratios").

Usage (after scripts/llama-ref/make.sh gguf-py, which unpacks llama.cpp's
gguf-py from the anchors, or with it on PYTHONPATH; numpy from Debian's
python3-numpy):
  /usr/bin/python3 scripts/llama-ref/dummy_gguf.py PRESET|CONFIG.json --type Q4_0|Q8_0|F16 \\
      [--seed S] [--shapes] [--decoded] OUT.gguf
  ... dummy_gguf.py --list [--type T]     the presets, their file sizes and
                                          the H200 commands (below)
  ... dummy_gguf.py PRESET --bytes [--type T]   three numbers, no file: the
      matrix bytes all in T (Petrel's dummy count), as the file types them
      (Petrel's count when it loads the file), and all the tensor data

PRESET is a name from Petrel's src/model/registry.c (the shapes `petrel bench
-m dummy:PRESET` runs, read from that file's table); CONFIG.json a Hugging
Face config.json of a handled model_type (gguf_arch.ARCH: llama, qwen3,
qwen3_moe, gemma2, gemma3_text, gpt_oss, deepseek_v2/v3, qwen3_5_text,
qwen3_5_moe_text, minicpm3).  --shapes prints every tensor (name, ggml type, ne,
bytes), and the matrix bytes as `petrel bench -m dummy:PRESET --dummy-dtype`
counts them (every matrix in one format) beside the file's.  --decoded
writes the same model unquantized: each quantized tensor as the f32 values
its blocks decode to (a reference that isolates kernels' rounding).

What is written.  The keys come from gguf_arch.py (shared with
hf_to_gguf.py); the tensors are the family's, named and shaped as llama.cpp
loads them (src/models/*.cpp), and typed as llama-quantize --pure would:
every 2-D / 3-D weight in --type, except what llama-quantize never
quantizes - norms, 1-D tensors and biases (F32), the MoE routers
(ffn_gate_inp, F32) and the Gated DeltaNet conv (ssm_conv1d, F32) - and
gpt-oss's experts, which are MXFP4 as the released model's are.  A matrix
whose row length no 32-block divides would be F16 (no preset has one).
The vocabulary is a SentencePiece-style list of vocab_size pieces
(gguf_arch.add_vocab): benchmarks feed token ids, so only its size matters.
Two departures from the real models, both without effect on shapes or
bytes: Llama 3.1's rope scaling (a rope_freqs tensor Petrel does not read
yet) is left out, and Gemma's query_pre_attn_scalar is taken as llama.cpp
takes it (head_dim^-1/2; the presets' value).

The weights.  Quantized blocks are random bytes made in large numpy buffers
and streamed tensor by tensor (nothing like the model is held in memory):
Q4_0 nibbles are made odd (1, 3, .., 15: values -7..7 by twos, mean zero;
ggml's -8 would give every row a mean, and through many layers every token
the same direction), Q8_0 bytes likewise odd (-127..127), MXFP4 nibbles are
symmetric as they come; the block scale makes each element's RMS
1/sqrt(cols) (times 0.75-1.25 per block), so a matrix keeps its input's
scale and activations stay O(1) through the layers; the embedding's
elements have RMS 1 (1/sqrt(dim) where the output head is tied to it, so
the logits stay O(1)).  F16 weights are normal with that RMS.  Norm gains
are 1 + 0.1 u, biases 0.02 n, gpt-oss's sinks n, the Gated DeltaNet decay
terms as scripts/llama-ref/qwen35.py sets them.  Seeded: one seed, one file.

Speed: numpy's integers() makes the bytes, in 64 MiB chunks on up to 16
threads (each chunk from its own generator, seeded by seed, tensor and
chunk: the same file at any thread count).  The 16 GiB qwen3-30b-a3b Q4_0
file took 28 s of user CPU time on this project's 2-core VM; the disk
sets the pace.

Checked (docs/benchmarks.md, "The same GGUF in both engines"): tiny
configs of every family load and run in llama.cpp 34af94cd and in Petrel,
whose logits agree (tests/fixtures/gguf/dummy_*, test_hf_reference); every
preset's matrix bytes equal what `petrel bench -m dummy:PRESET
--dummy-dtype q4_0|q8_0` allocates (test_dummy_preset_bytes).  One count
differs by design, in no preset: qwen35moe's shared-expert gate
(ffn_gate_inp_shexp) is a 1-D f32 vector as llama.cpp loads it, a 1 x dim
matrix in Petrel's dummy.

H200 recipe (--list prints it with the sizes; the coordinator runs it):
  PYTHONPATH=$GGUF_PY python3 scripts/llama-ref/dummy_gguf.py PRESET --type Q4_0 $F
  llama-bench -m $F -p 512 -n 128 -d 0 -fa 1 -ngl 99 -o json
  petrel bench --device cuda -m $F -p 512 -d 0 -g 128
"""
import collections
import concurrent.futures
import json
import math
import os
import re
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
try:
    import gguf
except ImportError:  # gguf-py where scripts/llama-ref/make.sh env unpacks it
    sys.path.insert(0, os.path.join(ROOT, "build-llama/llama.cpp/gguf-py"))
    import gguf

from gguf_arch import (ARCH, add_vocab, head_dim, meta_deepseek2, meta_gemma, meta_gpt_oss,
                       meta_llama, meta_minicpm3, meta_qwen35, meta_qwen3_moe, minicpm3_v_head,
                       qwen35_shapes)

Q = gguf.GGMLQuantizationType
TYPES = {"Q4_0": Q.Q4_0, "Q8_0": Q.Q8_0, "F16": Q.F16}


# ---- the presets ------------------------------------------------------------------

def presets():
    """{name: config} from the table in src/model/registry.c: each entry is
    {"name", /* comment */ "json" "json" ...}, adjacent C string literals."""
    src = open(os.path.join(ROOT, "src/model/registry.c")).read()
    table = src[src.index("} presets[] = {"):]
    table = table[:table.index("};")]
    out = {}
    for m in re.finditer(r'\{"([^"]+)",\s*(?:/\*.*?\*/)?\s*((?:"(?:[^"\\]|\\.)*"\s*)+)\}', table, re.S):
        parts = re.findall(r'"((?:[^"\\]|\\.)*)"', m.group(2))
        out[m.group(1)] = json.loads("".join(p.replace('\\"', '"') for p in parts))
    return out


def load_config(spec):
    if os.path.exists(spec):
        return json.load(open(spec))
    table = presets()
    if spec not in table:
        sys.exit(f"{spec}: neither a config.json nor a preset ({', '.join(table)})")
    return table[spec]


# ---- tensors, family by family ------------------------------------------------------
# Each entry: (name, numpy shape (ggml ne reversed: [experts,] rows, cols), role).
# Roles: embd, mat, norm, bias, router, conv, ssm_a, ssm_dt, sinks; "exps" is a
# matrix that gpt-oss stores as MXFP4.

def attn(p, cfg, qk_norm, q_rows=None):
    hd, d = head_dim(cfg), cfg["hidden_size"]
    h, kv = cfg["num_attention_heads"], cfg.get("num_key_value_heads") or cfg["num_attention_heads"]
    t = [(p + "attn_q.weight", (q_rows or h * hd, d), "mat"),
         (p + "attn_k.weight", (kv * hd, d), "mat"),
         (p + "attn_v.weight", (kv * hd, d), "mat"),
         (p + "attn_output.weight", (d, h * hd), "mat")]
    if qk_norm:
        t += [(p + "attn_q_norm.weight", (hd,), "norm"), (p + "attn_k_norm.weight", (hd,), "norm")]
    return t


def ffn(p, d, f, suffix=""):
    return [(p + f"ffn_gate{suffix}.weight", (f, d), "mat"),
            (p + f"ffn_up{suffix}.weight", (f, d), "mat"),
            (p + f"ffn_down{suffix}.weight", (d, f), "mat")]


def experts(p, d, f, e, role="mat"):
    return [(p + "ffn_gate_exps.weight", (e, f, d), role),
            (p + "ffn_up_exps.weight", (e, f, d), role),
            (p + "ffn_down_exps.weight", (e, d, f), role)]


def io(cfg, tied):
    v, d = cfg["vocab_size"], cfg["hidden_size"]
    t = [("token_embd.weight", (v, d), "embd"), ("output_norm.weight", (d,), "norm")]
    return t if tied else t + [("output.weight", (v, d), "mat")]


def t_llama(cfg):
    d, qwen3 = cfg["hidden_size"], cfg["model_type"] == "qwen3"
    t = io(cfg, cfg.get("tie_word_embeddings", False))
    for l in range(cfg["num_hidden_layers"]):
        p = f"blk.{l}."
        t += [(p + "attn_norm.weight", (d,), "norm")] + attn(p, cfg, qwen3)
        t += [(p + "ffn_norm.weight", (d,), "norm")] + ffn(p, d, cfg["intermediate_size"])
    return t


def t_qwen3_moe(cfg):
    d = cfg["hidden_size"]
    e = cfg.get("num_experts") or cfg["num_local_experts"]
    t = io(cfg, cfg.get("tie_word_embeddings", False))
    for l in range(cfg["num_hidden_layers"]):
        p = f"blk.{l}."
        t += [(p + "attn_norm.weight", (d,), "norm")] + attn(p, cfg, True)
        t += [(p + "ffn_norm.weight", (d,), "norm"), (p + "ffn_gate_inp.weight", (e, d), "router")]
        t += experts(p, d, cfg["moe_intermediate_size"], e)
    return t


def t_gemma(cfg):
    d, gemma3 = cfg["hidden_size"], cfg["model_type"] == "gemma3_text"
    t = io(cfg, cfg.get("tie_word_embeddings", True))
    for l in range(cfg["num_hidden_layers"]):
        p = f"blk.{l}."
        t += [(p + "attn_norm.weight", (d,), "norm")] + attn(p, cfg, gemma3)
        t += [(p + n, (d,), "norm") for n in ("post_attention_norm.weight", "ffn_norm.weight",
                                              "post_ffw_norm.weight")]
        t += ffn(p, d, cfg["intermediate_size"])
    return t


def t_gpt_oss(cfg):
    d, e, f = cfg["hidden_size"], cfg["num_local_experts"], cfg["intermediate_size"]
    hd, h = head_dim(cfg), cfg["num_attention_heads"]
    kv = cfg["num_key_value_heads"]
    t = io(cfg, False)
    for l in range(cfg["num_hidden_layers"]):
        p = f"blk.{l}."
        t += [(p + "attn_norm.weight", (d,), "norm")] + attn(p, cfg, False)
        t += [(p + "attn_q.bias", (h * hd,), "bias"), (p + "attn_k.bias", (kv * hd,), "bias"),
              (p + "attn_v.bias", (kv * hd,), "bias"), (p + "attn_output.bias", (d,), "bias"),
              (p + "attn_sinks.weight", (h,), "sinks"),
              (p + "post_attention_norm.weight", (d,), "norm"),
              (p + "ffn_gate_inp.weight", (e, d), "router"), (p + "ffn_gate_inp.bias", (e,), "bias")]
        t += experts(p, d, f, e, "exps")
        t += [(p + "ffn_gate_exps.bias", (e, f), "bias"), (p + "ffn_up_exps.bias", (e, f), "bias"),
              (p + "ffn_down_exps.bias", (e, d), "bias")]
    return t


def t_deepseek2(cfg):
    d, h = cfg["hidden_size"], cfg["num_attention_heads"]
    nope, rope, vh = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    kvl, ql = cfg["kv_lora_rank"], cfg.get("q_lora_rank")
    e, ef = cfg["n_routed_experts"], cfg["moe_intermediate_size"]
    shared = cfg.get("n_shared_experts") or 0
    t = io(cfg, cfg.get("tie_word_embeddings", False))
    for l in range(cfg["num_hidden_layers"]):
        p = f"blk.{l}."
        t += [(p + "attn_norm.weight", (d,), "norm")]
        if ql:
            t += [(p + "attn_q_a.weight", (ql, d), "mat"), (p + "attn_q_a_norm.weight", (ql,), "norm"),
                  (p + "attn_q_b.weight", (h * (nope + rope), ql), "mat")]
        else:
            t += [(p + "attn_q.weight", (h * (nope + rope), d), "mat")]
        t += [(p + "attn_kv_a_mqa.weight", (kvl + rope, d), "mat"),
              (p + "attn_kv_a_norm.weight", (kvl,), "norm"),
              (p + "attn_k_b.weight", (h, kvl, nope), "mat"),
              (p + "attn_v_b.weight", (h, vh, kvl), "mat"),
              (p + "attn_output.weight", (d, h * vh), "mat"),
              (p + "ffn_norm.weight", (d,), "norm")]
        if l < cfg.get("first_k_dense_replace", 0):
            t += ffn(p, d, cfg["intermediate_size"])
            continue
        t += [(p + "ffn_gate_inp.weight", (e, d), "router")]
        if cfg.get("topk_method") == "noaux_tc":
            t += [(p + "exp_probs_b.bias", (e,), "bias")]
        t += experts(p, d, ef, e)
        if shared:
            t += ffn(p, d, shared * ef, "_shexp")
    return t


def t_minicpm3(cfg):
    """llama.cpp's minicpm3 tensors: the q bottleneck, the fused attn_kv_b
    [heads x (no-rope + value)][kv rank] (Petrel splits it at load), a
    dense FFN in every layer."""
    d, h = cfg["hidden_size"], cfg["num_attention_heads"]
    nope, rope, vh = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], minicpm3_v_head(cfg)
    kvl, ql = cfg["kv_lora_rank"], cfg.get("q_lora_rank")
    t = io(cfg, cfg.get("tie_word_embeddings", False))
    for l in range(cfg["num_hidden_layers"]):
        p = f"blk.{l}."
        t += [(p + "attn_norm.weight", (d,), "norm")]
        if ql:
            t += [(p + "attn_q_a.weight", (ql, d), "mat"), (p + "attn_q_a_norm.weight", (ql,), "norm"),
                  (p + "attn_q_b.weight", (h * (nope + rope), ql), "mat")]
        else:
            t += [(p + "attn_q.weight", (h * (nope + rope), d), "mat")]
        t += [(p + "attn_kv_a_mqa.weight", (kvl + rope, d), "mat"),
              (p + "attn_kv_a_norm.weight", (kvl,), "norm"),
              (p + "attn_kv_b.weight", (h * (nope + vh), kvl), "mat"),
              (p + "attn_output.weight", (d, h * vh), "mat"),
              (p + "ffn_norm.weight", (d,), "norm")]
        t += ffn(p, d, cfg["intermediate_size"])
    return t


def t_qwen35(cfg):
    d, moe = cfg["hidden_size"], bool(cfg.get("num_experts"))
    hk, hv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    kd, vd = hk * cfg["linear_key_head_dim"], hv * cfg["linear_value_head_dim"]
    every = qwen35_shapes(cfg)[1]
    t = io(cfg, cfg.get("tie_word_embeddings", False))
    for l in range(cfg["num_hidden_layers"]):
        p = f"blk.{l}."
        t += [(p + "attn_norm.weight", (d,), "norm"), (p + "post_attention_norm.weight", (d,), "norm")]
        if (l + 1) % every:  # Gated DeltaNet
            t += [(p + "attn_qkv.weight", (2 * kd + vd, d), "mat"),
                  (p + "attn_gate.weight", (vd, d), "mat"),
                  (p + "ssm_beta.weight", (hv, d), "mat"),
                  (p + "ssm_alpha.weight", (hv, d), "mat"),
                  (p + "ssm_conv1d.weight", (2 * kd + vd, cfg["linear_conv_kernel_dim"]), "conv"),
                  (p + "ssm_dt.bias", (hv,), "ssm_dt"),
                  (p + "ssm_a", (hv,), "ssm_a"),
                  (p + "ssm_norm.weight", (cfg["linear_value_head_dim"],), "norm"),
                  (p + "ssm_out.weight", (d, vd), "mat")]
        else:  # gated attention: the q projection gives queries and gates
            t += attn(p, cfg, True, 2 * cfg["num_attention_heads"] * head_dim(cfg))
        if moe:
            e, sf = cfg["num_experts"], cfg["shared_expert_intermediate_size"]
            t += [(p + "ffn_gate_inp.weight", (e, d), "router")]
            t += experts(p, d, cfg["moe_intermediate_size"], e)
            t += ffn(p, d, sf, "_shexp") + [(p + "ffn_gate_inp_shexp.weight", (d,), "bias")]
        else:
            t += ffn(p, d, cfg["intermediate_size"])
    return t


# model_type -> (metadata, tensors)
FAMILIES = {
    "llama": (meta_llama, t_llama), "qwen3": (meta_llama, t_llama),
    "qwen3_moe": (meta_qwen3_moe, t_qwen3_moe),
    "gemma2": (lambda w, c: meta_gemma(w, c, False), t_gemma),
    "gemma3_text": (lambda w, c: meta_gemma(w, c, True), t_gemma),
    "gpt_oss": (meta_gpt_oss, t_gpt_oss),
    "deepseek_v2": (meta_deepseek2, t_deepseek2), "deepseek_v3": (meta_deepseek2, t_deepseek2),
    "qwen3_5_text": (meta_qwen35, t_qwen35), "qwen3_5_moe_text": (meta_qwen35, t_qwen35),
    "minicpm3": (meta_minicpm3, t_minicpm3),
}


# ---- types and bytes ------------------------------------------------------------------

def type_of(name, shape, role, qtype):
    """The ggml type llama-quantize --pure would give (module docstring)."""
    if len(shape) == 1 or role in ("norm", "bias", "router", "conv", "ssm_a", "ssm_dt", "sinks"):
        return Q.F32
    if role == "exps":
        return Q.MXFP4
    block = gguf.GGML_QUANT_SIZES[qtype][0]
    return qtype if shape[-1] % block == 0 else Q.F16


def nbytes(shape, qtype):
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    return math.prod(shape) // block * size


# ---- values ---------------------------------------------------------------------------

# E[q^2] of one element's code: odd nibbles -7..7, odd int8 -127..127, E2M1 values
CODE_MS = {Q.Q4_0: 21.0, Q.Q8_0: (127 * 128 * 129 / 3 * 2 / 256), Q.MXFP4: 8.5625}
CHUNK = 1 << 26  # bytes made and written at a time


# Each chunk of a tensor has its own generator, seeded by (seed, tensor,
# chunk): the threads that make them in parallel give the same file at any
# thread count.

def block_chunk(key, qtype, n, d):
    """n random blocks of qtype whose elements have RMS about d x the code's."""
    size = gguf.GGML_QUANT_SIZES[qtype][1]
    rng = np.random.default_rng(key)
    raw = rng.integers(0, 1 << 64, size=(n * size + 7) // 8, dtype=np.uint64,
                       endpoint=False).view(np.uint8)[:n * size].reshape(n, size)
    if qtype == Q.MXFP4:  # e8m0 scale, then 16 bytes of E2M1 nibbles
        raw[:, 0] = 127 + round(math.log2(d))
    else:
        var = 0.75 + raw[:, 0].astype(np.float32) / 512  # per-block scale spread
        raw[:, 2:] |= 0x11 if qtype == Q.Q4_0 else 0x01  # odd codes: mean zero
        raw[:, 0:2] = (var * np.float32(d)).astype("<f2").view(np.uint8).reshape(n, 2)
    return raw


def float_chunk(key, role, n, rms, dtype):
    rng = np.random.default_rng(key)
    if role == "norm":
        x = 1 + 0.1 * (rng.random(n, dtype=np.float32) * 2 - 1)
    elif role == "bias":
        x = 0.02 * rng.standard_normal(n, dtype=np.float32)
    elif role == "sinks":
        x = rng.standard_normal(n, dtype=np.float32)
    elif role == "conv":
        x = 0.5 * rng.standard_normal(n, dtype=np.float32)
    elif role == "ssm_dt":  # slow decays: softplus(a + dt) about 0.05 (qwen35.py)
        x = rng.uniform(-5, -1, n).astype(np.float32)
    elif role == "ssm_a":  # -exp(A_log), A_log = log(U(1, 16)), damped as qwen35.py does
        x = (-rng.uniform(1, 16, n) / 8).astype(np.float32)
    else:
        x = np.float32(rms) * rng.standard_normal(n, dtype=np.float32)
    return x.astype(dtype)


def chunks(seed, ti, shape, role, ty, rms):
    """The jobs (function, arguments) that make tensor ti's bytes in order."""
    if ty in (Q.F32, Q.F16):
        n, per = math.prod(shape), CHUNK // 4
        dt = np.float32 if ty == Q.F32 else np.float16
        return [(float_chunk, ((seed, ti, at), role, min(per, n - at), rms, dt))
                for at in range(0, n, per)]
    block, size = gguf.GGML_QUANT_SIZES[ty]
    n, per = math.prod(shape) // block, max(1, CHUNK // size)
    d = rms / math.sqrt(CODE_MS[ty])
    return [(block_chunk, ((seed, ti, at), ty, min(per, n - at), d)) for at in range(0, n, per)]


def plan(cfg, qtype):
    """[(name, shape, role, ggml type)] and whether the head is tied."""
    fam = FAMILIES.get(cfg["model_type"])
    if not fam:
        sys.exit(f"model_type {cfg['model_type']} not handled (handled: {', '.join(FAMILIES)})")
    ts = fam[1](cfg)
    return [(n, s, r, type_of(n, s, r, qtype)) for n, s, r in ts]


def rms_of(cfg, shape, role, tied):
    if role == "embd":
        return 1 / math.sqrt(cfg["hidden_size"]) if tied else 1.0
    return 1 / math.sqrt(shape[-1])


def write(cfg, qtype, seed, path, name, decoded=False):
    """decoded: every quantized tensor as the f32 values its blocks decode
    to (the same model, unquantized: the same seed gives the same blocks)."""
    ts = plan(cfg, qtype)
    tied = not any(n == "output.weight" for n, _, _, _ in ts)
    w = gguf.GGUFWriter(path, ARCH[cfg["model_type"]])
    w.add_name(name)
    FAMILIES[cfg["model_type"]][0](w, cfg)
    w.remove_key(gguf.Keys.General.FILE_TYPE)  # the meta_* functions' ALL_F32
    w.add_file_type({Q.Q4_0: gguf.LlamaFileType.MOSTLY_Q4_0, Q.Q8_0: gguf.LlamaFileType.MOSTLY_Q8_0,
                     Q.F16: gguf.LlamaFileType.MOSTLY_F16}[qtype])
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    add_vocab(w, cfg["vocab_size"], cfg)
    for n, s, r, ty in ts:
        if decoded and ty not in (Q.F32, Q.F16):
            w.add_tensor_info(n, s, np.dtype(np.float32), nbytes(s, Q.F32))
        elif ty in (Q.F32, Q.F16):
            w.add_tensor_info(n, s, np.dtype(np.float32 if ty == Q.F32 else np.float16),
                              nbytes(s, ty))
        else:  # a byte shape: rows of blocks
            bs = gguf.GGML_QUANT_SIZES[ty]
            w.add_tensor_info(n, s[:-1] + (s[-1] // bs[0] * bs[1],), np.dtype(np.uint8),
                              nbytes(s, ty), raw_dtype=ty)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    f = w.fout[0]
    w.write_padding(f, f.tell())
    total, workers = 0, min(16, os.cpu_count() or 1)
    ahead = collections.deque()  # (tensor, its last chunk?, chunk being made), in file order

    def drain(keep):
        nonlocal total
        while len(ahead) > keep:
            ti, last, fut = ahead.popleft()
            n, s, r, ty = ts[ti]
            quant = ty not in (Q.F32, Q.F16)
            x = fut.result()
            (gguf.quants.dequantize(x, ty) if decoded and quant else x).tofile(f)
            if last:
                n_out = nbytes(s, Q.F32 if decoded and quant else ty)
                total += n_out
                w.write_padding(f, n_out)

    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        for ti, (n, s, r, ty) in enumerate(ts):
            jobs = chunks(seed, ti, s, r, ty, rms_of(cfg, s, r, tied))
            for k, (fn, a) in enumerate(jobs):
                ahead.append((ti, k == len(jobs) - 1, pool.submit(fn, *a)))
                drain(2 * workers)
        drain(0)
    w.close()
    return ts, total


# ---- reports ----------------------------------------------------------------------------

def petrel_matrix_bytes(ts, qtype):
    """Matrix bytes as `petrel bench -m dummy:... --dummy-dtype` counts them:
    every 2-D / 3-D weight in one format (routers and MXFP4 experts too),
    1-D tensors and biases not counted."""
    return sum(nbytes(s, qtype) for n, s, r, ty in ts if len(s) > 1 and r not in ("bias", "conv"))


def file_matrix_bytes(ts):
    """The same matrices in the types this file gives them: what Petrel
    reports as weight bytes when it loads the file."""
    return sum(nbytes(s, ty) for n, s, r, ty in ts if len(s) > 1 and r not in ("bias", "conv"))


LLAMA_ARCHS = {"llama", "qwen3", "qwen3moe", "gemma2", "gemma3", "gpt-oss", "deepseek2", "qwen35",
               "qwen35moe", "minicpm3"}  # load in llama.cpp 34af94cd (docs/benchmarks.md)


def list_presets(qtype_name):
    qtype = TYPES[qtype_name]
    print(f"{'preset':18} {'arch':10} {'llama.cpp':9} {'file GiB':>8}  matrices")
    for name, cfg in presets().items():
        if cfg["model_type"] not in FAMILIES:
            continue
        ts = plan(cfg, qtype)
        size = sum(nbytes(s, ty) for _, s, _, ty in ts) / 2**30
        types = sorted({ty.name for _, s, r, ty in ts if len(s) > 1 and r != "bias"})
        arch = ARCH[cfg["model_type"]]
        print(f"{name:18} {arch:10} {'yes' if arch in LLAMA_ARCHS else 'no':9} {size:8.2f}  "
              f"{'+'.join(types)}")
    t = qtype_name.lower()
    print(f"""
H200, per preset P, one file at a time (the largest is 16 GiB of a 64 GiB
disk); gpu-run.sh's llama phase has LLB (the anchors' CUDA tools) and
GGUF_PY (gguf-py), and its python3 has numpy (make-llama8b-gguf.py uses it):
  PYTHONPATH=$GGUF_PY python3 scripts/llama-ref/dummy_gguf.py P --type {qtype_name} /tmp/P-{t}.gguf
  $LLB/llama-bench -m /tmp/P-{t}.gguf -p 512 -n 128 -d 0 -fa 1 -ngl 99 -r 3 -o json
  $BIN/petrel bench --device cuda -m /tmp/P-{t}.gguf -p 512 -d 0 -g 128 -r 3 -o P.json
  (depth: -d 0,32768 in both; issue 17 wants qwen3.5-27b and deepseek-v2-lite at 32k)
  rm /tmp/P-{t}.gguf""")


def main():
    args, flags = [], {}
    it = iter(sys.argv[1:])
    for a in it:
        if a in ("--type", "--seed"):
            flags[a] = next(it, None)
        elif a in ("--list", "--shapes", "--decoded", "--bytes"):
            flags[a] = True
        else:
            args.append(a)
    qname = (flags.get("--type") or "Q4_0").upper()
    if qname not in TYPES:
        sys.exit(f"--type {qname}: one of {', '.join(TYPES)}")
    if flags.get("--list"):
        return list_presets(qname)
    if flags.get("--bytes") and len(args) == 1:  # sizes only, nothing written
        ts = plan(load_config(args[0]), TYPES[qname])
        print(petrel_matrix_bytes(ts, TYPES[qname]), file_matrix_bytes(ts),
              sum(nbytes(s, ty) for _, s, _, ty in ts))
        return 0
    if len(args) != 2:
        sys.exit(__doc__)
    cfg = load_config(args[0])
    qtype = TYPES[qname]
    t0 = time.time()
    ts, total = write(cfg, qtype, int(flags.get("--seed") or 0), args[1],
                      f"petrel-dummy-{os.path.basename(args[0]).removesuffix('.json')}",
                      bool(flags.get("--decoded")))
    dt = time.time() - t0
    if flags.get("--shapes"):
        for n, s, r, ty in ts:
            print(f"  {n:34} {ty.name:6} ne {list(reversed(s))} {nbytes(s, ty)}")
    print(f"{args[1]}: {ARCH[cfg['model_type']]}, {len(ts)} tensors, {total / 2**30:.2f} GiB "
          f"of tensor data in {dt:.1f} s")
    print(f"  matrix bytes: {file_matrix_bytes(ts)} as written (Petrel's weight bytes for this "
          f"file); {petrel_matrix_bytes(ts, qtype)} all in {qname} (petrel bench -m dummy:... "
          f"--dummy-dtype {qname.lower()})")


if __name__ == "__main__":
    sys.exit(main())
