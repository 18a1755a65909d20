#!/usr/bin/python3
"""deepseek2.py - a tiny random DeepSeek-V3-style GGUF (llama.cpp arch deepseek2).

Usage: PYTHONPATH=build-llama/llama.cpp/gguf-py scripts/llama-ref/deepseek2.py [--yarn] [--legacy] OUT.gguf

Multi-head latent attention in llama.cpp's MLA layout (attn_q_a / q_a_norm /
q_b, attn_kv_a_mqa, kv_a_norm, per-head attn_k_b and attn_v_b), three layers:
the first dense (leading_dense_block_count 1), then routed experts with V3's
routing (sigmoid scores, a selection bias exp_probs_b, 8 experts in 4 groups
of which 2 are used, top 3, weights renormalized and scaled by 2.5) and one
shared expert.  The value head (12) differs from the no-rope key part (16).
f32, tied embeddings, the 512-token vocabulary of the stories260k fixture
(only ids matter: the reference is logits for token ids).  Deterministic:
numpy seed 17.  scripts/llama-ref/record.py then writes its reference,
with tolerance 2e-4: the random tied embeddings give logits up to about
40, so f32 summation-order differences (seen up to 8.5e-5) are a few 1e-6
of them, ordinary f32 rounding, but too close to the usual 1e-4.

--yarn adds V2-Lite's kind of YaRN rope scaling, shrunk to the fixture:
factor 4 over an original context of 512 positions (the correction range,
pairs 0.4 to 1.9 of the 4 rope pairs, is rounded outwards to 0 and 2, so
the rounding shows), yarn_log_multiplier 0.0707 (the converter's 0.1 x
mscale_all_dim 0.707): frequencies interpolated and scores scaled by
YaRN's mscale^2.

--legacy writes the layout from before llama.cpp split attn_kv_b: one
attn_kv_b [heads x (16 + 12)][32] per layer, key/value_length the head
sizes, head_count_kv 4 and no key_length_mla; llama.cpp then runs it as
plain multi-head attention (its non-MLA path), Petrel splits kv_b at load
and runs it absorbed.
"""
import os
import sys

import numpy as np
import gguf

DIM, LAYERS, HEADS = 48, 3, 4
Q_LORA, KV_LORA, NOPE, ROPE, VHEAD = 24, 32, 16, 8, 12
FFN, EXPERTS, TOPK, EFFN, SHARED = 64, 8, 3, 16, 1
GROUPS, GROUPS_USED, SCALE = 4, 2, 2.5


def main():
    yarn = "--yarn" in sys.argv[1:]
    legacy = "--legacy" in sys.argv[1:]
    args = [a for a in sys.argv[1:] if a not in ("--yarn", "--legacy")]
    if len(args) != 1:
        sys.exit(__doc__)
    rng = np.random.default_rng(17)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    vocab_src = gguf.GGUFReader(os.path.join(root, "tests/fixtures/gguf/stories260k/model.gguf"))

    def field(name):
        f = vocab_src.fields[name]
        return [f.parts[i] for i in f.data]

    tokens = [bytes(t).decode("utf-8") for t in field("tokenizer.ggml.tokens")]
    scores = [float(s[0]) for s in field("tokenizer.ggml.scores")]
    types = [int(t[0]) for t in field("tokenizer.ggml.token_type")]
    vocab = len(tokens)

    w = gguf.GGUFWriter(args[0], "deepseek2")
    w.add_name("tiny-deepseek2")
    w.add_block_count(LAYERS)
    w.add_context_length(2048)
    w.add_embedding_length(DIM)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    if legacy:
        w.add_head_count_kv(HEADS)
        w.add_key_length(NOPE + ROPE)
        w.add_value_length(VHEAD)
    else:
        w.add_head_count_kv(1)
        w.add_key_length(KV_LORA + ROPE)
        w.add_value_length(KV_LORA)
        w.add_key_length_mla(NOPE + ROPE)
        w.add_value_length_mla(VHEAD)
    w.add_rope_dimension_count(ROPE)
    w.add_rope_freq_base(10000.0)
    if yarn:
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(4.0)
        w.add_rope_scaling_orig_ctx_len(512)
        w.add_rope_scaling_yarn_log_mul(0.1 * 0.707)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_q_lora_rank(Q_LORA)
    w.add_kv_lora_rank(KV_LORA)
    w.add_leading_dense_block_count(1)
    w.add_expert_count(EXPERTS)
    w.add_expert_used_count(TOPK)
    w.add_expert_feed_forward_length(EFFN)
    w.add_expert_shared_count(SHARED)
    w.add_expert_weights_scale(SCALE)
    w.add_expert_weights_norm(True)
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    w.add_expert_group_count(GROUPS)
    w.add_expert_group_used_count(GROUPS_USED)
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

    w.add_tensor("token_embd.weight", rng.standard_normal((vocab, DIM)).astype(np.float32))
    w.add_tensor("output_norm.weight", gain(DIM))
    for l in range(LAYERS):
        b = f"blk.{l}."
        w.add_tensor(b + "attn_norm.weight", gain(DIM))
        w.add_tensor(b + "attn_q_a.weight", mat(Q_LORA, DIM))
        w.add_tensor(b + "attn_q_a_norm.weight", gain(Q_LORA))
        w.add_tensor(b + "attn_q_b.weight", mat(HEADS * (NOPE + ROPE), Q_LORA) * 2)
        w.add_tensor(b + "attn_kv_a_mqa.weight", mat(KV_LORA + ROPE, DIM) * 2)
        w.add_tensor(b + "attn_kv_a_norm.weight", gain(KV_LORA))
        if legacy:
            w.add_tensor(b + "attn_kv_b.weight", mat(HEADS * (NOPE + VHEAD), KV_LORA))
        else:
            w.add_tensor(b + "attn_k_b.weight", mat(HEADS, KV_LORA, NOPE))
            w.add_tensor(b + "attn_v_b.weight", mat(HEADS, VHEAD, KV_LORA))
        w.add_tensor(b + "attn_output.weight", mat(DIM, HEADS * VHEAD))
        w.add_tensor(b + "ffn_norm.weight", gain(DIM))
        if l == 0:
            w.add_tensor(b + "ffn_gate.weight", mat(FFN, DIM))
            w.add_tensor(b + "ffn_up.weight", mat(FFN, DIM))
            w.add_tensor(b + "ffn_down.weight", mat(DIM, FFN))
            continue
        w.add_tensor(b + "ffn_gate_inp.weight", mat(EXPERTS, DIM) * 2)
        w.add_tensor(b + "exp_probs_b.bias", (0.1 * rng.standard_normal(EXPERTS)).astype(np.float32))
        w.add_tensor(b + "ffn_gate_exps.weight", mat(EXPERTS, EFFN, DIM))
        w.add_tensor(b + "ffn_up_exps.weight", mat(EXPERTS, EFFN, DIM))
        w.add_tensor(b + "ffn_down_exps.weight", mat(EXPERTS, DIM, EFFN))
        w.add_tensor(b + "ffn_gate_shexp.weight", mat(SHARED * EFFN, DIM))
        w.add_tensor(b + "ffn_up_shexp.weight", mat(SHARED * EFFN, DIM))
        w.add_tensor(b + "ffn_down_shexp.weight", mat(DIM, SHARED * EFFN))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
