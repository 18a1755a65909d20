#!/usr/bin/python3
"""minicpm3.py - a tiny random MiniCPM3 GGUF (llama.cpp arch minicpm3).

Usage: PYTHONPATH=build-llama/llama.cpp/gguf-py scripts/llama-ref/minicpm3.py OUT.gguf

Written as llama.cpp's converter (convert_hf_to_gguf.py, MiniCPM3Model)
writes a MiniCPM3 checkpoint: context_length, key_length (no-rope + rope
dims), rope.dimension_count, q_lora_rank, kv_lora_rank, head_count_kv =
heads, no value_length (the value head is then hidden / heads, 16 here),
no rope scaling keys, and LongRoPE's factors as the global tensors
rope_factors_short / rope_factors_long; the fused attn_kv_b
[heads x (no-rope + value)][kv_lora] per layer, which llama.cpp
(src/models/minicpm3.cpp) runs as plain multi-head attention and Petrel
splits at load and runs absorbed.  Three layers, dense SiLU FFNs, an
untied output head, f32, the 512-token vocabulary of the stories260k
fixture (only ids matter).  The no-rope key part (12), the rope dims (8)
and the value head (16) all differ, so a mixed-up split shows.

LongRoPE: the short factors are 1 to 4 (random), the long ones 8 to 16;
the context (4096) is the original one, so llama.cpp takes the short ones
for its contexts (and Petrel does), and a file read with the long ones, or
none, gives other logits (by up to 24.8: docs/model.md).  llama.cpp's
hard-coded scalings apply (scale_emb 12, scale_depth 1.4, n_embd_base
256: the normed output times 256 / 64 = 4), so the embeddings are drawn
at 0.1 (x starts at RMS 1.2) and the logits reach about 34.

Deterministic: numpy seed 23.  scripts/llama-ref/record.py then writes the
reference (tests/fixtures/gguf/minicpm3: prompts of 5, 23 and 80 tokens,
the deepseek2 fixture's, 32 greedy tokens each, tolerance 2e-4: about 3.5x
the 5.8e-5 measured).
"""
import os
import sys

import numpy as np
import gguf

DIM, LAYERS, HEADS, FFN = 64, 3, 4, 96
Q_LORA, KV_LORA, NOPE, ROPE = 24, 32, 12, 8
VHEAD = DIM // HEADS  # what llama.cpp assumes without value_length
CTX = 4096


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    rng = np.random.default_rng(23)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    vocab_src = gguf.GGUFReader(os.path.join(root, "tests/fixtures/gguf/stories260k/model.gguf"))

    def field(name):
        f = vocab_src.fields[name]
        return [f.parts[i] for i in f.data]

    tokens = [bytes(t).decode("utf-8") for t in field("tokenizer.ggml.tokens")]
    scores = [float(s[0]) for s in field("tokenizer.ggml.scores")]
    types = [int(t[0]) for t in field("tokenizer.ggml.token_type")]
    vocab = len(tokens)

    w = gguf.GGUFWriter(sys.argv[1], "minicpm3")
    w.add_name("tiny-minicpm3")
    w.add_context_length(CTX)
    w.add_embedding_length(DIM)
    w.add_block_count(LAYERS)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(HEADS)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(vocab)
    w.add_q_lora_rank(Q_LORA)
    w.add_kv_lora_rank(KV_LORA)
    w.add_key_length(NOPE + ROPE)
    w.add_rope_dimension_count(ROPE)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)

    def mat(*shape):  # rows of the last dim, scaled so activations stay O(1)
        return (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)

    def gain(n):
        return (1.0 + 0.2 * rng.standard_normal(n)).astype(np.float32)

    w.add_tensor("token_embd.weight", (0.1 * rng.standard_normal((vocab, DIM))).astype(np.float32))
    w.add_tensor("output_norm.weight", gain(DIM))
    w.add_tensor("output.weight", mat(vocab, DIM) * 2)
    w.add_tensor("rope_factors_long.weight", rng.uniform(8, 16, ROPE // 2).astype(np.float32))
    w.add_tensor("rope_factors_short.weight", rng.uniform(1, 4, ROPE // 2).astype(np.float32))
    for l in range(LAYERS):
        b = f"blk.{l}."
        w.add_tensor(b + "attn_norm.weight", gain(DIM))
        w.add_tensor(b + "attn_q_a.weight", mat(Q_LORA, DIM))
        w.add_tensor(b + "attn_q_a_norm.weight", gain(Q_LORA))
        w.add_tensor(b + "attn_q_b.weight", mat(HEADS * (NOPE + ROPE), Q_LORA) * 2)
        w.add_tensor(b + "attn_kv_a_mqa.weight", mat(KV_LORA + ROPE, DIM) * 2)
        w.add_tensor(b + "attn_kv_a_norm.weight", gain(KV_LORA))
        w.add_tensor(b + "attn_kv_b.weight", mat(HEADS * (NOPE + VHEAD), KV_LORA))
        w.add_tensor(b + "attn_output.weight", mat(DIM, HEADS * VHEAD))
        w.add_tensor(b + "ffn_norm.weight", gain(DIM))
        w.add_tensor(b + "ffn_gate.weight", mat(FFN, DIM))
        w.add_tensor(b + "ffn_up.weight", mat(FFN, DIM))
        w.add_tensor(b + "ffn_down.weight", mat(DIM, FFN))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
