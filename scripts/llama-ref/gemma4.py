#!/usr/bin/python3
"""gemma4.py - a tiny random Gemma 4 text model as a GGUF file (llama.cpp's layout).

Usage: PYTHONPATH=build-llama/llama.cpp/gguf-py /usr/bin/python3 scripts/llama-ref/gemma4.py OUT.gguf [--moe]

Every piece of llama.cpp's gemma4 text path is exercised (src/models/gemma4.cpp):
sliding and global layers with different head dims, KV head counts and rope
dims (key_length_swa, a per-layer head_count_kv array); global layers' rope
divided by rope_freqs (some factors 1e30: dims that do not rotate, as the
converter writes partial "proportional" rope); the last two layers reading
the K/V of the last earlier layer of their kind (shared_kv_layers); one
global layer without attn_v (V is K); per-layer inputs (embedding_length_
per_layer_input); a layer output scale per layer; final logit soft-capping;
the shared-KV layers' FFNs twice as wide (a feed_forward_length array, the
double-wide MLP).
A 4-token window, shorter than the recorded prompts.  f32, vocab 256,
seed fixed.  --moe makes the 26B-A4B kind (tests/fixtures/gguf/gemma4_moe):
every layer also has 4 routed experts, top 2, beside its dense MLP, with
gate|up fused on even layers and apart on odd ones, and a per-expert output
scale (ffn_down_exps.scale) on odd layers.

Recorded (tests/fixtures/gguf/gemma4) with
  scripts/llama-ref/record.py tests/fixtures/gguf/gemma4 32 0.03 0.03 \
    63,80,29,187,104 125,42,26,20,8,105,143,237,77,207,198,18,59,136,140,95,73 \
    202,47,214,30,70,57,244,240,9,215,167,209,69,207,72,52,45,82,77,163,225,190,248,221,220,228,98,25,219,158,89,174,102,132,66,48,66,124,74,25
Why 0.03, not 1e-4: llama.cpp's CPU GELU is a table lookup at fp16
(ggml-cpu vec.h, GGML_GELU_FP16: input and output rounded to fp16), and this
model runs GELU twice per layer.  A float64 numpy forward with the exact
tanh GELU differs from llama.cpp by 0.0020 / 0.0030 / 0.0098 (prompts of 5,
17, 40) - Petrel's figures to three digits - and by 3e-6 / 4e-4 / 6e-4 with
the fp16 table emulated.  Embeddings at 0.2 keep greedy continuations
varied; the smallest top-2 margins are 0.0018 (prompt) and 0.0039
(greedy), and Petrel's argmax agrees at every one.

tests/fixtures/gguf/gemma4_moe: the same command with --moe and 0.1 0.1.
The experts add two GELUs a layer: numpy with the exact GELU differs from
llama.cpp by 0.014 / 0.012 / 0.054 (Petrel: the same), with the fp16 table
by 8e-4 / 4e-3 / 7e-3.  Two greedy steps there are closer than the
tolerance decides (top-2 margins 0.0018): the test feeds the reference's
token and accepts either argmax where the margin is under 2 x tolerance
(test_hf_reference.c, same_argmax).  Swapping the fused gate|up halves or
dropping the per-expert scale moves the logits by 2.4 / 0.99: caught.
"""
import sys

import numpy as np
import gguf

ARCH = "gemma4"
VOCAB, DIM, FFN, HEADS, PLE = 256, 32, 48, 2, 8
SWA = [True, False, True, True, False, True, False]  # layer kinds
N_LAYERS = len(SWA)
N_SHARED = 2                          # layers 5, 6 read layers 3, 4's K/V
HD, HD_SWA = 16, 8                     # head dims: global, sliding
KV_HEADS = [2 if s else 1 for s in SWA]
WINDOW = 4
NO_V = {1}                            # global layer 1 has no attn_v: V = K
N_EXP, TOP_K, EXP_FFN = 4, 2, 16      # --moe


def main():
    out = sys.argv[1]
    moe = "--moe" in sys.argv[2:]
    rng = np.random.default_rng(20261203 if moe else 20261202)

    def mat(rows, cols, scale=None):
        s = scale if scale is not None else 1.0 / np.sqrt(cols)
        return (rng.standard_normal((rows, cols)) * s).astype(np.float32)

    def gain(n):
        return (1.0 + 0.2 * rng.standard_normal(n)).astype(np.float32)

    w = gguf.GGUFWriter(out, ARCH)
    w.add_name("petrel-gemma4-tiny")
    w.add_block_count(N_LAYERS)
    w.add_context_length(256)
    w.add_embedding_length(DIM)
    # the double-wide MLP in the shared-KV layers (dense model only)
    ffn = [FFN if moe or l < N_LAYERS - N_SHARED else 2 * FFN for l in range(N_LAYERS)]
    w.add_feed_forward_length(ffn)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_key_length(HD)
    w.add_value_length(HD)
    w.add_key_length_swa(HD_SWA)
    w.add_value_length_swa(HD_SWA)
    w.add_rope_dimension_count(HD)
    w.add_rope_dimension_count_swa(HD_SWA)
    w.add_rope_freq_base(1000.0)
    w.add_rope_freq_base_swa(100.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_sliding_window(WINDOW)
    w.add_sliding_window_pattern(SWA)
    w.add_shared_kv_layers(N_SHARED)
    w.add_embedding_length_per_layer_input(PLE)
    w.add_final_logit_softcapping(30.0)
    if moe:
        w.add_expert_count(N_EXP)
        w.add_expert_used_count(TOP_K)
        w.add_expert_feed_forward_length(EXP_FFN)
    # a byte-level SentencePiece vocabulary: llama.cpp wants one to load
    w.add_tokenizer_model("llama")
    toks = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(VOCAB - 3)]
    w.add_token_list(toks)
    w.add_token_scores([0.0] * VOCAB)
    w.add_token_types([2, 3, 3] + [6] * (VOCAB - 3))
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)

    w.add_tensor("token_embd.weight", mat(VOCAB, DIM, 0.2))
    w.add_tensor("output_norm.weight", gain(DIM))
    w.add_tensor("per_layer_token_embd.weight", mat(VOCAB, N_LAYERS * PLE, 0.5))
    w.add_tensor("per_layer_model_proj.weight", mat(N_LAYERS * PLE, DIM))
    w.add_tensor("per_layer_proj_norm.weight", gain(PLE))
    # global layers' rope: pairs 0..4 rotate at base^(-2i/d) / f, 5..7 not at all
    freqs = np.concatenate([1.0 + rng.random(5), np.full(HD // 2 - 5, 1e30)]).astype(np.float32)
    w.add_tensor("rope_freqs.weight", freqs)
    for l in range(N_LAYERS):
        hd = HD_SWA if SWA[l] else HD
        kv = KV_HEADS[l] * hd
        p = f"blk.{l}."
        w.add_tensor(p + "attn_norm.weight", gain(DIM))
        w.add_tensor(p + "attn_q.weight", mat(HEADS * hd, DIM))
        w.add_tensor(p + "attn_q_norm.weight", gain(hd))
        if l < N_LAYERS - N_SHARED:
            w.add_tensor(p + "attn_k.weight", mat(kv, DIM))
            w.add_tensor(p + "attn_k_norm.weight", gain(hd))
            if l not in NO_V:
                w.add_tensor(p + "attn_v.weight", mat(kv, DIM))
        w.add_tensor(p + "attn_output.weight", mat(DIM, HEADS * hd))
        w.add_tensor(p + "post_attention_norm.weight", gain(DIM))
        w.add_tensor(p + "ffn_norm.weight", gain(DIM))
        w.add_tensor(p + "ffn_gate.weight", mat(ffn[l], DIM))
        w.add_tensor(p + "ffn_up.weight", mat(ffn[l], DIM))
        w.add_tensor(p + "ffn_down.weight", mat(DIM, ffn[l]))
        w.add_tensor(p + "post_ffw_norm.weight", gain(DIM))
        if moe:
            w.add_tensor(p + "post_ffw_norm_1.weight", gain(DIM))
            w.add_tensor(p + "pre_ffw_norm_2.weight", gain(DIM))
            w.add_tensor(p + "post_ffw_norm_2.weight", gain(DIM))
            w.add_tensor(p + "ffn_gate_inp.weight", mat(N_EXP, DIM, 1.0))
            w.add_tensor(p + "ffn_gate_inp.scale", gain(DIM))
            gate = np.stack([mat(EXP_FFN, DIM) for _ in range(N_EXP)])
            up = np.stack([mat(EXP_FFN, DIM) for _ in range(N_EXP)])
            if l % 2 == 0:  # llama.cpp splits gate first, then up
                w.add_tensor(p + "ffn_gate_up_exps.weight", np.concatenate([gate, up], axis=1))
            else:
                w.add_tensor(p + "ffn_gate_exps.weight", gate)
                w.add_tensor(p + "ffn_up_exps.weight", up)
            w.add_tensor(p + "ffn_down_exps.weight", np.stack([mat(DIM, EXP_FFN) for _ in range(N_EXP)]))
            if l % 2 == 1:
                w.add_tensor(p + "ffn_down_exps.scale",
                             (0.5 + rng.random(N_EXP)).astype(np.float32))
        w.add_tensor(p + "inp_gate.weight", mat(PLE, DIM))
        w.add_tensor(p + "proj.weight", mat(DIM, PLE))
        w.add_tensor(p + "post_norm.weight", gain(DIM))
        w.add_tensor(p + "layer_output_scale.weight",
                     np.array([0.6 + 0.8 * rng.random()], dtype=np.float32))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
