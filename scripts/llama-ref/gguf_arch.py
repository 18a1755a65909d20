"""gguf_arch.py - what llama.cpp's GGUF layout says about each family, from a
Hugging Face config.json: the architecture name and the hyperparameter keys.

Shared by hf_to_gguf.py (a tiny transformers fixture as GGUF) and
dummy_gguf.py (random weights of a real model's shapes).  The keys and
their meaning are read from llama.cpp's gguf-py (constants.py) and
src/models/*.cpp (load_arch_hparams); nothing is copied from its converter.
Each meta_* function writes one family's keys into a gguf.GGUFWriter and
returns the head size it used.
"""
import sys

import gguf

# Hugging Face model_type -> llama.cpp general.architecture
ARCH = {"llama": "llama", "qwen3": "qwen3", "qwen3_moe": "qwen3moe", "gemma2": "gemma2",
        "gemma3_text": "gemma3", "gpt_oss": "gpt-oss", "deepseek_v2": "deepseek2",
        "deepseek_v3": "deepseek2", "qwen3_5_text": "qwen35", "qwen3_5_moe_text": "qwen35moe",
        "minicpm3": "minicpm3"}


def swa_period(types):
    """llama.cpp's scalar sliding_window_pattern that gives these layer types."""
    swa = [t == "sliding_attention" for t in types]
    for p in range(0, len(swa) + 2):
        if [p == 0 or l % p < p - 1 for l in range(len(swa))] == swa:
            return p
    sys.exit(f"layer_types {types} is not a period llama.cpp can express")


def add_vocab(w, n, cfg):
    """A SentencePiece-style vocabulary of n pieces (<unk> <s> </s>, 256 byte
    tokens, then filler pieces): llama.cpp wants one to load, and the
    references are logits for token ids, so the pieces themselves do not
    matter."""
    if n < 3 + 256:
        sys.exit(f"vocab {n} too small for the byte tokens")
    toks, types = ["<unk>", "<s>", "</s>"], [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL,
                                              gguf.TokenType.CONTROL]
    toks += [f"<0x{b:02X}>" for b in range(256)]
    types += [gguf.TokenType.BYTE] * 256
    toks += [f"t{i}" for i in range(len(toks), n)]
    types += [gguf.TokenType.NORMAL] * (n - len(types))
    w.add_tokenizer_model("llama")
    w.add_token_list(toks)
    w.add_token_scores([-float(i) for i in range(n)])
    w.add_token_types(types)
    w.add_bos_token_id(cfg.get("bos_token_id") or 1)
    w.add_eos_token_id(cfg.get("eos_token_id") or 2)


def head_dim(cfg):
    return cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]


def add_common(w, cfg, ffn):
    hd = head_dim(cfg)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(ffn)
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg.get("num_key_value_heads") or cfg["num_attention_heads"])
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    return hd


def rope_params(cfg, layer_type=None):
    rp = cfg.get("rope_parameters") or {}
    if layer_type and layer_type in rp:
        rp = rp[layer_type]
    theta = cfg.get("rope_theta") or rp.get("rope_theta") or 10000.0
    scaling = cfg.get("rope_scaling") or (rp if rp.get("rope_type", "default") != "default" else None)
    return theta, scaling


def meta_llama(w, cfg):
    """llama and qwen3 (dense).  Llama 3.1's rope scaling would be a
    rope_freqs tensor, which Petrel does not read yet: left out (the shapes
    and bytes are the same)."""
    hd = add_common(w, cfg, cfg["intermediate_size"])
    w.add_rope_freq_base(rope_params(cfg)[0])
    return hd


def meta_gemma(w, cfg, gemma3):
    hd = add_common(w, cfg, cfg["intermediate_size"])
    types = cfg.get("layer_types")
    theta, scaling = rope_params(cfg, "full_attention")
    w.add_rope_freq_base(theta)
    if scaling:
        if scaling.get("rope_type", scaling.get("type")) != "linear":
            sys.exit(f"rope scaling {scaling} not handled")
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(scaling["factor"])
    if cfg.get("sliding_window"):
        w.add_sliding_window(cfg["sliding_window"])
        w.add_sliding_window_pattern(swa_period(types) if types else
                                     cfg.get("sliding_window_pattern") or (6 if gemma3 else 2))
        if gemma3:
            w.add_rope_freq_base_swa(rope_params(cfg, "sliding_attention")[0]
                                     if "sliding_attention" in (cfg.get("rope_parameters") or {})
                                     else cfg.get("rope_local_base_freq", 10000.0))
    if cfg.get("attn_logit_softcapping"):
        w.add_attn_logit_softcapping(cfg["attn_logit_softcapping"])
    if cfg.get("final_logit_softcapping"):
        w.add_final_logit_softcapping(cfg["final_logit_softcapping"])
    return hd


def meta_gpt_oss(w, cfg, yarn=True):
    """yarn False leaves YaRN out: a model both engines rope alike (llama.cpp
    rounds the correction range outwards whatever "truncate" says)."""
    hd = add_common(w, cfg, cfg["intermediate_size"])
    w.add_expert_count(cfg["num_local_experts"])
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    w.add_expert_feed_forward_length(cfg["intermediate_size"])
    w.add_sliding_window(cfg["sliding_window"])
    if cfg.get("layer_types"):
        w.add_sliding_window_pattern(swa_period(cfg["layer_types"]))
    theta, rs = rope_params(cfg)
    w.add_rope_freq_base(theta)
    if rs and yarn:
        if rs.get("rope_type") != "yarn" or rs.get("beta_fast", 32) != 32 or rs.get("beta_slow", 1) != 1:
            sys.exit(f"rope scaling {rs} not handled")
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(rs["factor"])
        w.add_rope_scaling_orig_ctx_len(rs["original_max_position_embeddings"])
    return hd


def meta_qwen3_moe(w, cfg):
    hd = add_common(w, cfg, cfg["intermediate_size"])
    w.add_expert_count(cfg.get("num_experts") or cfg["num_local_experts"])
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    w.add_rope_freq_base(rope_params(cfg)[0])
    return hd


def meta_deepseek2(w, cfg):
    """Multi-head latent attention as llama.cpp's converter writes it since it
    split attn_kv_b: head_count_kv 1, key/value_length the cached row (kv
    rank + rope key / kv rank), *_mla the per-head sizes.  YaRN's mscale as
    yarn_log_multiplier 0.1 x mscale_all_dim, as the converter writes it."""
    nope, rope, vh = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    kv_lora = cfg["kv_lora_rank"]
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(1)
    w.add_key_length(kv_lora + rope)
    w.add_value_length(kv_lora)
    w.add_key_length_mla(nope + rope)
    w.add_value_length_mla(vh)
    w.add_rope_dimension_count(rope)
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    if cfg.get("q_lora_rank"):
        w.add_q_lora_rank(cfg["q_lora_rank"])
    w.add_kv_lora_rank(kv_lora)
    w.add_leading_dense_block_count(cfg.get("first_k_dense_replace", 0))
    w.add_expert_count(cfg["n_routed_experts"])
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    w.add_expert_shared_count(cfg.get("n_shared_experts") or 0)
    w.add_expert_weights_scale(cfg.get("routed_scaling_factor", 1.0))
    w.add_expert_weights_norm(bool(cfg.get("norm_topk_prob", False)))
    sigmoid = cfg.get("scoring_func", "softmax") == "sigmoid"
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID if sigmoid
                             else gguf.ExpertGatingFuncType.SOFTMAX)
    if cfg.get("n_group", 1) > 1:
        w.add_expert_group_count(cfg["n_group"])
        w.add_expert_group_used_count(cfg["topk_group"])
    theta, rs = rope_params(cfg)
    w.add_rope_freq_base(theta)
    if rs and rs.get("rope_type", rs.get("type")) == "yarn":
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(rs["factor"])
        w.add_rope_scaling_orig_ctx_len(rs["original_max_position_embeddings"])
        w.add_rope_scaling_yarn_log_mul(0.1 * rs.get("mscale_all_dim", 0))
    return nope + rope


def minicpm3_v_head(cfg):
    return cfg.get("v_head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]


def meta_minicpm3(w, cfg):
    """The keys llama.cpp's converter (MiniCPM3Model) writes: key_length the
    query/key head (no-rope + rope dims), head_count_kv the config's, no
    value_length (llama.cpp then takes hidden / heads; written only for a
    config whose v_head_dim differs) and no rope scaling keys: LongRoPE's
    factors are tensors (rope_factors_short / _long), not written here (the
    presets have none).  scale_emb, scale_depth and dim_model_base have no
    keys: llama.cpp uses MiniCPM3-4B's 12, 1.4 and 256 for every file."""
    rs = cfg.get("rope_scaling") or {}
    if rs.get("short_factor") or rs.get("long_factor"):
        sys.exit("minicpm3: LongRoPE factors are not written by this script")
    for k, v in (("scale_emb", 12), ("scale_depth", 1.4), ("dim_model_base", 256)):
        if cfg.get(k, v) != v:
            sys.exit(f"minicpm3: {k} {cfg[k]}: a GGUF cannot say it (llama.cpp uses {v})")
    nope, rope = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"]
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg.get("num_key_value_heads") or cfg["num_attention_heads"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_vocab_size(cfg["vocab_size"])
    if cfg.get("q_lora_rank"):
        w.add_q_lora_rank(cfg["q_lora_rank"])
    w.add_kv_lora_rank(cfg["kv_lora_rank"])
    w.add_key_length(nope + rope)
    if minicpm3_v_head(cfg) != cfg["hidden_size"] // cfg["num_attention_heads"]:
        w.add_value_length(minicpm3_v_head(cfg))
    w.add_rope_dimension_count(rope)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    return nope + rope


def qwen35_shapes(cfg):
    """(n_rot, full_attention_interval, rope sections) of a Qwen3.5 config."""
    rp = cfg.get("rope_parameters") or {}
    partial = cfg.get("partial_rotary_factor") or rp.get("partial_rotary_factor", 1.0)
    n_rot = int(head_dim(cfg) * partial)
    every = cfg.get("full_attention_interval")
    if not every and cfg.get("layer_types"):
        every = cfg["layer_types"].index("full_attention") + 1
    sect = list(rp.get("mrope_section") or [])
    if not sect:  # as Qwen3.5's [11, 11, 10] for 32 pairs: every pair on the text position
        pairs = n_rot // 2
        sect = [(pairs + 2) // 3, (pairs + 1) // 3]
        sect.append(pairs - sum(sect))
    return n_rot, every or 4, (sect + [0, 0, 0, 0])[:4]


def meta_qwen35(w, cfg):
    """qwen35 / qwen35moe: Gated DeltaNet layers (ssm.*) and every
    full_attention_interval-th layer gated full attention."""
    hd = head_dim(cfg)
    moe = bool(cfg.get("num_experts"))
    n_rot, every, sect = qwen35_shapes(cfg)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    if not moe:
        w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_rope_dimension_count(n_rot)
    w.add_rope_dimension_sections(sect)
    w.add_rope_freq_base(rope_params(cfg)[0])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    if cfg["linear_key_head_dim"] != cfg["linear_value_head_dim"]:
        sys.exit("qwen35: llama.cpp's GGUF has one ssm.state_size for key and value heads")
    w.add_ssm_conv_kernel(cfg["linear_conv_kernel_dim"])
    w.add_ssm_inner_size(cfg["linear_num_value_heads"] * cfg["linear_value_head_dim"])
    w.add_ssm_state_size(cfg["linear_key_head_dim"])
    w.add_ssm_time_step_rank(cfg["linear_num_value_heads"])
    w.add_ssm_group_count(cfg["linear_num_key_heads"])
    w.add_full_attention_interval(every)
    if moe:
        w.add_expert_count(cfg["num_experts"])
        w.add_expert_used_count(cfg["num_experts_per_tok"])
        w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
        w.add_expert_shared_feed_forward_length(cfg["shared_expert_intermediate_size"])
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    return hd
