#!/usr/bin/env python3
"""Writes a Hugging Face Llama directory with random bf16 weights and a
tokenizer copied in: a model that `petrel generate` can run with real text
(the dummy:PRESET models have no tokenizer).  The weights say nothing; the
point is a forward that costs what a model of this shape costs, e.g. for
jump-forward's speed-up (docs/benchmarks.md).

    scripts/dummy-hf-model.py OUT_DIR TOKENIZER_DIR [hidden layers intermediate]

TOKENIZER_DIR holds tokenizer.json (and tokenizer_config.json); its vocab
size sets the model's.  Standard library only (no numpy).
"""
import json, os, random, shutil, struct, sys

out, tokdir = sys.argv[1], sys.argv[2]
H, L, I = (int(x) for x in sys.argv[3:6]) if len(sys.argv) >= 6 else (1024, 8, 2816)
tok = json.load(open(os.path.join(tokdir, "tokenizer.json")))
V = max(tok["model"]["vocab"].values()) + 1
V = max([V] + [t["id"] + 1 for t in tok.get("added_tokens", [])])
HD = 64
NH, NKV = H // HD, max(1, H // HD // 2)
os.makedirs(out, exist_ok=True)
for f in ("tokenizer.json", "tokenizer_config.json"):
    if os.path.exists(os.path.join(tokdir, f)):
        shutil.copy(os.path.join(tokdir, f), out)
cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": H,
       "intermediate_size": I, "num_hidden_layers": L, "num_attention_heads": NH,
       "num_key_value_heads": NKV, "head_dim": HD, "vocab_size": V, "rms_norm_eps": 1e-5,
       "rope_theta": 500000.0, "max_position_embeddings": 8192, "tie_word_embeddings": True,
       "torch_dtype": "bfloat16"}
json.dump(cfg, open(os.path.join(out, "config.json"), "w"))
random.seed(1)
tile = bytearray()  # 1 MiB of bf16 values with |x| in [2^-7, 2^-4), repeated
for _ in range(1 << 19):
    tile += struct.pack("<H", random.getrandbits(1) << 15 | random.randint(120, 122) << 7 | random.getrandbits(7))
tensors = [("model.embed_tokens.weight", V * H, False), ("model.norm.weight", H, True)]
for l in range(L):
    p = f"model.layers.{l}."
    tensors += [(p + "self_attn.q_proj.weight", NH * HD * H, False), (p + "self_attn.k_proj.weight", NKV * HD * H, False),
                (p + "self_attn.v_proj.weight", NKV * HD * H, False), (p + "self_attn.o_proj.weight", H * NH * HD, False),
                (p + "mlp.gate_proj.weight", I * H, False), (p + "mlp.up_proj.weight", I * H, False),
                (p + "mlp.down_proj.weight", H * I, False), (p + "input_layernorm.weight", H, True),
                (p + "post_attention_layernorm.weight", H, True)]
shapes = {"model.embed_tokens.weight": [V, H]}
hdr, off = {}, 0
for n, cnt, _ in tensors:
    if n.endswith("norm.weight"): shape = [H]
    elif n in shapes: shape = shapes[n]
    elif "q_proj" in n: shape = [NH * HD, H]
    elif "k_proj" in n or "v_proj" in n: shape = [NKV * HD, H]
    elif "o_proj" in n: shape = [H, NH * HD]
    elif "down_proj" in n: shape = [H, I]
    else: shape = [I, H]
    hdr[n] = {"dtype": "BF16", "shape": shape, "data_offsets": [off, off + 2 * cnt]}
    off += 2 * cnt
h = json.dumps(hdr).encode()
h += b" " * ((8 - len(h) % 8) % 8)
with open(os.path.join(out, "model.safetensors"), "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h)
    for n, cnt, ones in tensors:
        if ones:
            f.write(struct.pack("<H", 0x3F80) * cnt)
            continue
        nb = 2 * cnt
        while nb > 0:
            k = min(nb, len(tile))
            f.write(tile[:k])
            nb -= k
print(f"{out}: {off / 1e6:.0f} MB of bf16 weights, vocab {V}, hidden {H}, {L} layers")
