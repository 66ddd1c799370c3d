#!/usr/bin/env python3
"""Converts a Llama-family GGUF (the demo model, SmolLM2) into a Hugging Face model
directory that MLX, transformers and switchyard's own safetensors loader read:
dequantized weights in model.safetensors (f32 or f16), config.json from the GGUF's
metadata, tokenizer.json built from the GGUF's vocabulary and merges, and the GGUF's
chat template in tokenizer_config.json.

Q and K come back to Hugging Face's "rotate half" order (convert_hf_to_gguf.py permutes
them for llama.cpp's RoPE; this undoes it). The tokenizer is a byte-level BPE with the
pre-tokenizer llama.cpp uses for `tokenizer.ggml.pre`; only the pre-tokenizers written
out below are supported, anything else is refused by name.

usage: gguf-to-hf.py GGUF OUT_DIR [f32|f16]
"""
import json
import os
import sys

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize
from hf_dir import PRE_TOKENIZERS, write_bpe_tokenizer, write_safetensors

if len(sys.argv) < 3:
    sys.exit(__doc__)
src_path, out_dir = sys.argv[1:3]
dtype = sys.argv[3] if len(sys.argv) > 3 else "f32"
if dtype not in ("f32", "f16"):
    sys.exit(f"unsupported dtype {dtype!r}: use f32 or f16")

r = GGUFReader(src_path)


def field(key, default=None):
    f = r.fields.get(key)
    return default if f is None else f.contents()


arch = field("general.architecture")
if arch != "llama":
    sys.exit(f"{src_path}: architecture {arch!r} is not supported (llama only)")
if field("tokenizer.ggml.model") != "gpt2":
    sys.exit(f"{src_path}: tokenizer model {field('tokenizer.ggml.model')!r} is not supported (gpt2 BPE only)")
pre = field("tokenizer.ggml.pre", "default")
if pre not in PRE_TOKENIZERS:
    sys.exit(f"{src_path}: pre-tokenizer {pre!r} is not supported (supported: {', '.join(PRE_TOKENIZERS)})")

n_head = field(f"{arch}.attention.head_count")
n_head_kv = field(f"{arch}.attention.head_count_kv", n_head)
n_embd = field(f"{arch}.embedding_length")
tokens = field("tokenizer.ggml.tokens")
types = field("tokenizer.ggml.token_type")
merges = field("tokenizer.ggml.merges")
bos, eos = field("tokenizer.ggml.bos_token_id"), field("tokenizer.ggml.eos_token_id")


def unpermute(w, heads):
    """Inverse of convert_hf_to_gguf.py's permute for Q and K."""
    return w.reshape(heads, w.shape[0] // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


NAMES = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
         "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "ffn_norm": "post_attention_layernorm",
         "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
hf = {}
for t in r.tensors:
    rows = int(np.prod(t.shape[1:])) if len(t.shape) > 1 else 1
    a = dequantize(t.data, t.tensor_type).astype(np.float32).reshape(rows, int(t.shape[0]))
    if len(t.shape) == 1:
        a = a.reshape(-1)
    if t.name == "token_embd.weight":
        name = "model.embed_tokens.weight"
    elif t.name == "output_norm.weight":
        name = "model.norm.weight"
    elif t.name == "output.weight":
        name = "lm_head.weight"
    elif t.name.startswith("blk."):
        _, i, part, kind = t.name.split(".")
        if part not in NAMES:
            sys.exit(f"{src_path}: tensor {t.name} has no Hugging Face name here")
        name = f"model.layers.{i}.{NAMES[part]}.{kind}"
        if part == "attn_q":
            a = unpermute(a, n_head)
        elif part == "attn_k":
            a = unpermute(a, n_head_kv)
    else:
        sys.exit(f"{src_path}: unexpected tensor {t.name}")
    hf[name] = a
    if len(hf) % 50 == 0 or len(hf) == len(r.tensors):
        print(f"{src_path}: {len(hf)}/{len(r.tensors)} tensors dequantized", file=sys.stderr)
tied = "lm_head.weight" not in hf

os.makedirs(out_dir, exist_ok=True)
write_safetensors(
    out_dir, hf, lambda a: (dtype.upper(), a.astype(np.float16 if dtype == "f16" else np.float32).tobytes())
)

config = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": n_embd,
    "num_hidden_layers": field(f"{arch}.block_count"),
    "num_attention_heads": n_head,
    "num_key_value_heads": n_head_kv,
    "head_dim": n_embd // n_head,
    "intermediate_size": field(f"{arch}.feed_forward_length"),
    "rms_norm_eps": float(field(f"{arch}.attention.layer_norm_rms_epsilon")),
    "rope_theta": float(field(f"{arch}.rope.freq_base", 10000.0)),
    "max_position_embeddings": field(f"{arch}.context_length"),
    "hidden_act": "silu",
    "tie_word_embeddings": tied,
    "vocab_size": len(tokens),
    "bos_token_id": bos,
    "eos_token_id": eos,
    "torch_dtype": {"f32": "float32", "f16": "float16"}[dtype],
}
json.dump(config, open(os.path.join(out_dir, "config.json"), "w"), indent=1)
# Control (3) and user-defined (4) tokens are added tokens, matched before the BPE.
write_bpe_tokenizer(out_dir, tokens, merges, types, pre, added_types=(3, 4))
json.dump({"chat_template": field("tokenizer.chat_template", ""), "bos_token": tokens[bos],
           "eos_token": tokens[eos], "add_bos_token": bool(field("tokenizer.ggml.add_bos_token", False)),
           "tokenizer_class": "PreTrainedTokenizerFast"},
          open(os.path.join(out_dir, "tokenizer_config.json"), "w"))
print(out_dir)
