#!/usr/bin/env python3
"""Writes a LoRA adapter for a Llama-family GGUF (the demo model, SmolLM2) with fixed
random A and B (B non-zero, so the output changes), in both formats adapters come in:

  OUT_DIR/adapter_config.json + OUT_DIR/adapter_model.safetensors   PEFT
  OUT_DIR/adapter.gguf                                              llama.cpp's GGUF LoRA

Both hold the same numbers. PEFT keeps Hugging Face's layout; the GGUF permutes B's rows
of Q and K as convert_hf_to_gguf.py permutes the base model's Q and K for llama.cpp's
RoPE, as llama.cpp's convert_lora_to_gguf.py does. (That converter needs torch, whose
PyPI build for Linux is the CUDA one, gigabytes; gguf-py writes the same file.)

usage: make-lora.py GGUF OUT_DIR [--seed N] [--rank R] [--alpha A]
                    [--targets q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj]
"""
import argparse
import json
import os

import numpy as np
from gguf import GGUFReader, GGUFWriter
from safetensors.numpy import save_file

# Hugging Face module name -> llama.cpp tensor name and which side is which width.
MODULES = {
    "q_proj": ("self_attn", "attn_q"),
    "k_proj": ("self_attn", "attn_k"),
    "v_proj": ("self_attn", "attn_v"),
    "o_proj": ("self_attn", "attn_output"),
    "gate_proj": ("mlp", "ffn_gate"),
    "up_proj": ("mlp", "ffn_up"),
    "down_proj": ("mlp", "ffn_down"),
}

p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
p.add_argument("gguf")
p.add_argument("out_dir")
p.add_argument("--seed", type=int, default=1)
p.add_argument("--rank", type=int, default=8)
p.add_argument("--alpha", type=float, default=16.0)
p.add_argument("--targets", default=",".join(MODULES))
args = p.parse_args()
targets = [t for t in args.targets.split(",") if t]
unknown = [t for t in targets if t not in MODULES]
if unknown:
    raise SystemExit(f"unknown target modules {unknown}: use {', '.join(MODULES)}")

r = GGUFReader(args.gguf)


def field(key, default=None):
    f = r.fields.get(key)
    return default if f is None else f.contents()


arch = field("general.architecture")
if arch != "llama":
    raise SystemExit(f"{args.gguf}: architecture {arch!r} is not supported (llama only)")
n_layer = field(f"{arch}.block_count")
n_head = field(f"{arch}.attention.head_count")
n_head_kv = field(f"{arch}.attention.head_count_kv", n_head)
shapes = {t.name: [int(d) for d in t.shape] for t in r.tensors}  # GGUF order: [in, out]


def permute(w, heads):
    """convert_hf_to_gguf.py's permute of Q and K rows (here B's rows)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


rng = np.random.default_rng(args.seed)
peft, ggufs = {}, []
for i in range(n_layer):
    for module in targets:
        group, name = MODULES[module]
        d_in, d_out = shapes[f"blk.{i}.{name}.weight"]
        # A ~ N(0, 1/d_in): A·x is O(1) for a normalised x; B small and non-zero.
        a = (rng.standard_normal((args.rank, d_in)) / np.sqrt(d_in)).astype(np.float32)
        b = (rng.standard_normal((d_out, args.rank)) * 0.04).astype(np.float32)
        hf = f"base_model.model.model.layers.{i}.{group}.{module}"
        peft[f"{hf}.lora_A.weight"] = a
        peft[f"{hf}.lora_B.weight"] = b
        if module == "q_proj":
            b = permute(b, n_head)
        elif module == "k_proj":
            b = permute(b, n_head_kv)
        ggufs.append((f"blk.{i}.{name}.weight", a, np.ascontiguousarray(b)))

os.makedirs(args.out_dir, exist_ok=True)
save_file(peft, os.path.join(args.out_dir, "adapter_model.safetensors"))
config = {
    "peft_type": "LORA",
    "task_type": "CAUSAL_LM",
    "base_model_name_or_path": field("general.name", os.path.basename(args.gguf)),
    "r": args.rank,
    "lora_alpha": args.alpha,
    "lora_dropout": 0.0,
    "target_modules": targets,
    "bias": "none",
    "fan_in_fan_out": False,
    "use_rslora": False,
}
with open(os.path.join(args.out_dir, "adapter_config.json"), "w") as f:
    json.dump(config, f, indent=2)

w = GGUFWriter(os.path.join(args.out_dir, "adapter.gguf"), arch)
w.add_type("adapter")
w.add_string("adapter.type", "lora")
w.add_float32("adapter.lora.alpha", args.alpha)
w.add_name(f"{config['base_model_name_or_path']} test LoRA (seed {args.seed})")
for base, a, b in ggufs:
    w.add_tensor(f"{base}.lora_a", a)
    w.add_tensor(f"{base}.lora_b", b)
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
print(f"{args.out_dir}: rank {args.rank}, alpha {args.alpha}, {len(ggufs)} projections, seed {args.seed}")
