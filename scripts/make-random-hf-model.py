#!/usr/bin/env python3
"""Writes a small random-weight model twice: as a Hugging Face directory
(config.json, tokenizer.json, tokenizer_config.json, model.safetensors) and as the GGUF
file llama.cpp's converter would make from it, for the safetensors loader's tests.

The vocabulary comes from another GGUF (the SmolLM2 demo model): tokenizer.json is a
byte-level BPE with SmolLM2's pre-tokenizer (single digits, then GPT-2's byte-level
split), its control tokens as special added tokens. Weights come from a fixed seed;
for `llama` the GGUF gets Q and K permuted as convert_hf_to_gguf.py does (HF keeps
them in "rotate half" order).

usage: make-random-hf-model.py VOCAB_GGUF OUT_DIR OUT_GGUF {llama|qwen2|qwen3} [f32|f16|bf16]

The safetensors weights are stored in the given type (default f32); the GGUF stores
the same values, as F16 for f16 and as F32 otherwise (bf16 → f32 is exact).
"""
import json
import os
import sys

import numpy as np
from gguf import GGUFReader, GGUFWriter
from hf_dir import write_bpe_tokenizer, write_safetensors

vocab_path, out_dir, gguf_path, arch = sys.argv[1:5]
dtype = sys.argv[5] if len(sys.argv) > 5 else "f32"
if arch not in ("llama", "qwen2", "qwen3"):
    sys.exit(f"unsupported architecture {arch!r}: use llama, qwen2 or qwen3")
if dtype not in ("f32", "f16", "bf16"):
    sys.exit(f"unsupported dtype {dtype!r}: use f32, f16 or bf16")
os.makedirs(out_dir, exist_ok=True)

src = GGUFReader(vocab_path)
tokens = src.fields["tokenizer.ggml.tokens"].contents()
merges = src.fields["tokenizer.ggml.merges"].contents()
types = src.fields["tokenizer.ggml.token_type"].contents()
template = src.fields["tokenizer.chat_template"].contents()
n_vocab, n_embd, n_layer, n_ff, n_head, n_head_kv = len(tokens), 128, 2, 256, 4, 2
head_dim = n_embd // n_head
eos = 2

rng = np.random.default_rng(7)


def mat(rows, cols, std):
    return (rng.standard_normal((rows, cols)) * std).astype(np.float32)


def vec(n, mean=0.0, std=0.1):
    return (mean + rng.standard_normal(n) * std).astype(np.float32)


def stored(a):
    """The values the safetensors file holds, as float32 (bf16: truncated mantissa, rounded)."""
    if dtype == "f16":
        return a.astype(np.float16).astype(np.float32)
    if dtype == "bf16":
        bits = a.astype(np.float32).view(np.uint32)
        rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint32) << 16
        return rounded.view(np.float32)
    return a


def raw(a):
    if dtype == "f16":
        return "F16", a.astype(np.float16).tobytes()
    if dtype == "bf16":
        return "BF16", (stored(a).view(np.uint32) >> 16).astype(np.uint16).tobytes()
    return "F32", a.astype(np.float32).tobytes()


hf = {"model.embed_tokens.weight": mat(n_vocab, n_embd, 1.0), "model.norm.weight": vec(n_embd, 1.0)}
hf["lm_head.weight"] = mat(n_vocab, n_embd, 0.2)
for i in range(n_layer):
    p = f"model.layers.{i}"
    hf[f"{p}.input_layernorm.weight"] = vec(n_embd, 1.0)
    hf[f"{p}.self_attn.q_proj.weight"] = mat(n_head * head_dim, n_embd, 0.15)
    hf[f"{p}.self_attn.k_proj.weight"] = mat(n_head_kv * head_dim, n_embd, 0.15)
    hf[f"{p}.self_attn.v_proj.weight"] = mat(n_head_kv * head_dim, n_embd, 0.15)
    hf[f"{p}.self_attn.o_proj.weight"] = mat(n_embd, n_head * head_dim, 0.1)
    if arch == "qwen2":
        hf[f"{p}.self_attn.q_proj.bias"] = vec(n_head * head_dim)
        hf[f"{p}.self_attn.k_proj.bias"] = vec(n_head_kv * head_dim)
        hf[f"{p}.self_attn.v_proj.bias"] = vec(n_head_kv * head_dim)
    if arch == "qwen3":
        hf[f"{p}.self_attn.q_norm.weight"] = vec(head_dim, 1.0)
        hf[f"{p}.self_attn.k_norm.weight"] = vec(head_dim, 1.0)
    hf[f"{p}.post_attention_layernorm.weight"] = vec(n_embd, 1.0)
    hf[f"{p}.mlp.gate_proj.weight"] = mat(n_ff, n_embd, 0.1)
    hf[f"{p}.mlp.up_proj.weight"] = mat(n_ff, n_embd, 0.1)
    hf[f"{p}.mlp.down_proj.weight"] = mat(n_embd, n_ff, 0.1)

# --- model.safetensors ---------------------------------------------------------------------
write_safetensors(out_dir, hf, raw)

# --- config.json, tokenizer.json, tokenizer_config.json -------------------------------------
model_type = arch
config = {
    "architectures": [{"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}[arch]],
    "model_type": model_type,
    "hidden_size": n_embd,
    "num_hidden_layers": n_layer,
    "num_attention_heads": n_head,
    "num_key_value_heads": n_head_kv,
    "head_dim": head_dim,
    "intermediate_size": n_ff,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "max_position_embeddings": 512,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "vocab_size": n_vocab,
    "bos_token_id": 1,
    "eos_token_id": eos,
    "torch_dtype": {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}[dtype],
}
json.dump(config, open(os.path.join(out_dir, "config.json"), "w"), indent=1)

write_bpe_tokenizer(out_dir, tokens, merges, types, "smollm")
json.dump({"chat_template": template, "bos_token": tokens[1], "eos_token": tokens[eos],
           "add_bos_token": False}, open(os.path.join(out_dir, "tokenizer_config.json"), "w"))

# --- the same model as GGUF ----------------------------------------------------------------


def permute(w, heads):
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


w = GGUFWriter(gguf_path, arch)
w.add_name(f"random-hf-{arch}")
w.add_context_length(512)
w.add_embedding_length(n_embd)
w.add_block_count(n_layer)
w.add_feed_forward_length(n_ff)
w.add_head_count(n_head)
w.add_head_count_kv(n_head_kv)
w.add_layer_norm_rms_eps(1e-6)
w.add_rope_freq_base(10000.0)
w.add_key_length(head_dim)
w.add_value_length(head_dim)
w.add_tokenizer_model("gpt2")
w.add_tokenizer_pre("smollm")
w.add_token_list(tokens)
w.add_token_merges(merges)
w.add_token_types(types)
w.add_bos_token_id(1)
w.add_eos_token_id(eos)
w.add_add_bos_token(False)
w.add_chat_template(template)


def gguf_weight(name, a):
    a = stored(a)
    w.add_tensor(name, a.astype(np.float16) if dtype == "f16" and a.ndim == 2 else a)


names = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
         "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
         "self_attn.k_norm": "attn_k_norm", "post_attention_layernorm": "ffn_norm",
         "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
gguf_weight("token_embd.weight", hf["model.embed_tokens.weight"])
gguf_weight("output_norm.weight", hf["model.norm.weight"])
gguf_weight("output.weight", hf["lm_head.weight"])
for i in range(n_layer):
    for hf_part, g in names.items():
        for kind in ("weight", "bias"):
            key = f"model.layers.{i}.{hf_part}.{kind}"
            if key not in hf:
                continue
            a = hf[key]
            if arch == "llama" and hf_part == "self_attn.q_proj":
                a = permute(a, n_head)
            if arch == "llama" and hf_part == "self_attn.k_proj":
                a = permute(a, n_head_kv)
            gguf_weight(f"blk.{i}.{g}.{kind}", a)
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
print(out_dir)
