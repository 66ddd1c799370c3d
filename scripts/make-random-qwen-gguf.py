#!/usr/bin/env python3
"""Writes a small random-weight Qwen2 or Qwen3 GGUF for reference tests.

No small Qwen GGUF ships on PyPI, so the test suite makes one: 2 layers, width 128,
4 query / 2 KV heads, F32 weights from a fixed seed. The vocabulary (byte-level BPE
tokens, merges, token types) is copied from another GGUF (the SmolLM2 demo model), and
the pre-tokenizer is set to "qwen2", so llama.cpp and switchyard tokenize with Qwen's
split regex.

usage: make-random-qwen-gguf.py VOCAB_GGUF OUT_GGUF {qwen2|qwen3} [SEED] [f32|f16|q8_0|q4_0|q4_1|q5_0|q5_1|q4_k|q5_k|bf16] [SHAPE] [TEMPLATE]

The fifth argument stores every 2-D weight in that type (norms and biases stay F32).
gguf-py cannot quantize K-quants, so q4_k and q5_k are quantized here (a plain
min/max fit per 32-value sub-block, not llama-quantize's search: any valid blocks
serve a reference test); their rows must be multiples of 256, so the tiny model is
256 wide (feed-forward 512) for them.
SHAPE (default `tiny`, the test model above) gives the layer shapes of a real model
for benchmarks instead — `qwen2.5-0.5b`, `qwen2.5-1.5b`, `qwen2.5-3b` — with tied
embeddings as those models have, at their full width and depth; only the vocabulary
is the donor's (49,152 tokens for SmolLM2 instead of Qwen's 151,936). Random weights
make meaningless text but honest timings (scripts/make-sized-models.sh).
TEMPLATE, a Jinja file, becomes the GGUF's `tokenizer.chat_template` (none by default:
engines fall back to ChatML) — tests/fixtures/qwen3-chat-template.jinja makes a model
that is templated as Qwen3 is (tools, `<think>` sections, `enable_thinking`).
"""
import sys

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter, quants

vocab_path, out_path, arch = sys.argv[1], sys.argv[2], sys.argv[3]
seed = int(sys.argv[4]) if len(sys.argv) > 4 else 1234
wtype = sys.argv[5] if len(sys.argv) > 5 else "f32"
QTYPES = {
    "q8_0": GGMLQuantizationType.Q8_0,
    "q4_0": GGMLQuantizationType.Q4_0,
    "q4_1": GGMLQuantizationType.Q4_1,
    "q5_0": GGMLQuantizationType.Q5_0,
    "q5_1": GGMLQuantizationType.Q5_1,
    "bf16": GGMLQuantizationType.BF16,
}
KQUANTS = {"q4_k": (GGMLQuantizationType.Q4_K, 4), "q5_k": (GGMLQuantizationType.Q5_K, 5)}
if wtype not in ("f32", "f16", *QTYPES, *KQUANTS):
    sys.exit(f"unsupported weight type {wtype!r}: use f32, f16, {', '.join(QTYPES)}")
if arch not in ("qwen2", "qwen3"):
    sys.exit(f"unsupported architecture {arch!r}: use qwen2 or qwen3")

src = GGUFReader(vocab_path)
tokens = src.fields["tokenizer.ggml.tokens"].contents()
merges = src.fields["tokenizer.ggml.merges"].contents()
types = src.fields["tokenizer.ggml.token_type"].contents()
# name: (width, layers, feed-forward, query heads, KV heads, tied embeddings)
SHAPES = {
    "tiny": (128, 2, 256, 4, 2, False),
    "qwen2.5-0.5b": (896, 24, 4864, 14, 2, True),
    "qwen2.5-1.5b": (1536, 28, 8960, 12, 2, True),
    "qwen2.5-3b": (2048, 36, 11008, 16, 2, True),
}
shape = sys.argv[6] if len(sys.argv) > 6 else "tiny"
if shape not in SHAPES:
    sys.exit(f"unknown shape {shape!r}: use {', '.join(SHAPES)}")
n_embd, n_layer, n_ff, n_head, n_head_kv, tied = SHAPES[shape]
if shape == "tiny" and wtype in KQUANTS:
    n_embd, n_ff = 256, 512
n_vocab = len(tokens)
head_dim = n_embd // n_head

rng = np.random.default_rng(seed)


def mat(rows, cols, std):
    if shape == "tiny":
        return (rng.standard_normal((rows, cols)) * std).astype(np.float32)
    # Faster for billions of weights (and a different stream than the tiny model's).
    out = rng.standard_normal((rows, cols), dtype=np.float32)
    out *= std
    return out


def quantize_k(data, bits):
    """Q4_K (bits 4) or Q5_K (bits 5) blocks of `data` (rows a multiple of 256 long),
    as bytes in ggml's block_q4_K / block_q5_K layout, one row of blocks per row."""
    rows = data.shape[0]
    nmax = (1 << bits) - 1
    x = data.reshape(-1, 8, 32).astype(np.float32)
    lo = np.minimum(x.min(axis=2), 0.0)
    scale = (x.max(axis=2) - lo) / nmax
    d = (scale.max(axis=1) / 63).astype(np.float16)
    dmin = (np.max(-lo, axis=1) / 63).astype(np.float16)
    df, dminf = d.astype(np.float32)[:, None], dmin.astype(np.float32)[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(df > 0, np.clip(np.round(scale / df), 0, 63), 0).astype(np.uint8)
        m = np.where(dminf > 0, np.clip(np.round(-lo / dminf), 0, 63), 0).astype(np.uint8)
        step = (df * sc)[:, :, None]
        q = np.where(step > 0, np.round((x + (dminf * m)[:, :, None]) / step), 0)
    q = np.clip(q, 0, nmax).astype(np.uint8)
    scales = np.concatenate(
        [
            sc[:, :4] | ((sc[:, 4:] >> 4) << 6),
            m[:, :4] | ((m[:, 4:] >> 4) << 6),
            (sc[:, 4:] & 0xF) | ((m[:, 4:] & 0xF) << 4),
        ],
        axis=1,
    )
    qs = ((q[:, 0::2] & 0xF) | ((q[:, 1::2] & 0xF) << 4)).reshape(-1, 128)
    parts = [d.view(np.uint8).reshape(-1, 2), dmin.view(np.uint8).reshape(-1, 2), scales]
    if bits == 5:
        qh = np.zeros((x.shape[0], 32), dtype=np.uint8)
        for j in range(8):
            qh |= ((q[:, j] >> 4) & 1) << j
        parts.append(qh)
    parts.append(qs)
    return np.concatenate(parts, axis=1).reshape(rows, -1)


def add_weight(name, data):
    """Adds a 2-D weight in the chosen storage type."""
    if wtype in KQUANTS:
        qtype, bits = KQUANTS[wtype]
        w.add_tensor(name, quantize_k(data, bits), raw_dtype=qtype)
    elif wtype == "f32":
        w.add_tensor(name, data)
    elif wtype == "f16":
        w.add_tensor(name, data.astype(np.float16))
    else:
        qtype = QTYPES[wtype]
        w.add_tensor(name, quants.quantize(data, qtype), raw_dtype=qtype)


def vec(n, mean=0.0, std=0.1):
    return (mean + rng.standard_normal(n) * std).astype(np.float32)


w = GGUFWriter(out_path, arch)
w.add_name(f"random-{arch}" if shape == "tiny" else f"random-{shape}")
w.add_context_length(512 if shape == "tiny" else 32768)
w.add_embedding_length(n_embd)
w.add_block_count(n_layer)
w.add_feed_forward_length(n_ff)
w.add_head_count(n_head)
w.add_head_count_kv(n_head_kv)
w.add_layer_norm_rms_eps(1e-6)
w.add_rope_freq_base(10000.0 if shape == "tiny" else 1000000.0)
if arch == "qwen3":
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
w.add_tokenizer_model("gpt2")
w.add_tokenizer_pre("qwen2")
w.add_token_list(tokens)
w.add_token_merges(merges)
w.add_token_types(types)
w.add_bos_token_id(1)
w.add_eos_token_id(2)
w.add_add_bos_token(False)
if len(sys.argv) > 7:
    with open(sys.argv[7], encoding="utf-8") as f:
        w.add_chat_template(f.read())

add_weight("token_embd.weight", mat(n_vocab, n_embd, 1.0))
w.add_tensor("output_norm.weight", vec(n_embd, 1.0))
if not tied:
    add_weight("output.weight", mat(n_vocab, n_embd, 0.2))
for i in range(n_layer):
    b = f"blk.{i}"
    w.add_tensor(f"{b}.attn_norm.weight", vec(n_embd, 1.0))
    add_weight(f"{b}.attn_q.weight", mat(n_head * head_dim, n_embd, 0.15))
    add_weight(f"{b}.attn_k.weight", mat(n_head_kv * head_dim, n_embd, 0.15))
    add_weight(f"{b}.attn_v.weight", mat(n_head_kv * head_dim, n_embd, 0.15))
    add_weight(f"{b}.attn_output.weight", mat(n_embd, n_head * head_dim, 0.1))
    if arch == "qwen2":
        w.add_tensor(f"{b}.attn_q.bias", vec(n_head * head_dim))
        w.add_tensor(f"{b}.attn_k.bias", vec(n_head_kv * head_dim))
        w.add_tensor(f"{b}.attn_v.bias", vec(n_head_kv * head_dim))
    else:
        w.add_tensor(f"{b}.attn_q_norm.weight", vec(head_dim, 1.0))
        w.add_tensor(f"{b}.attn_k_norm.weight", vec(head_dim, 1.0))
    w.add_tensor(f"{b}.ffn_norm.weight", vec(n_embd, 1.0))
    add_weight(f"{b}.ffn_gate.weight", mat(n_ff, n_embd, 0.1))
    add_weight(f"{b}.ffn_up.weight", mat(n_ff, n_embd, 0.1))
    add_weight(f"{b}.ffn_down.weight", mat(n_embd, n_ff, 0.1))

w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
print(out_path)
