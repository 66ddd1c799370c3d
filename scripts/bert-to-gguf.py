#!/usr/bin/env python3
"""Converts a sentence-transformers BERT directory (config.json, model.safetensors,
tokenizer.json, modules.json, 1_Pooling/config.json) to a GGUF file that llama.cpp
loads as architecture `bert`.

    bert-to-gguf.py MODEL_DIR OUT.gguf [f32|f16|q8_0]

It writes what llama.cpp's own converter (`convert_hf_to_gguf.py`, class `BertModel`
in `conversion/bert.py`) writes for such a model: the same metadata keys, the same
tensor names and types, the vocabulary in llama.cpp's "phantom space" form (`##ab` ->
`ab`, `ab` -> `\u2581ab`, special tokens unchanged). That converter imports torch
(several GB from PyPI) even to copy F32 tensors; this script needs only numpy and
llama.cpp's `gguf` package (pass the llama.cpp source tree's `gguf-py` on
`PYTHONPATH`, or use the PyPI `gguf`).
"""

import json
import struct
import sys
from pathlib import Path

import numpy as np
import gguf

# Hugging Face name (without "bert." and ".weight"/".bias") -> GGUF name, as
# gguf-py's TensorNameMap maps them for MODEL_ARCH.BERT.
FIXED = {
    "embeddings.word_embeddings": "token_embd",
    "embeddings.token_type_embeddings": "token_types",
    "embeddings.position_embeddings": "position_embd",
    "embeddings.LayerNorm": "token_embd_norm",
}
PER_LAYER = {
    "attention.self.query": "attn_q",
    "attention.self.key": "attn_k",
    "attention.self.value": "attn_v",
    "attention.output.dense": "attn_output",
    "attention.output.LayerNorm": "attn_output_norm",
    "intermediate.dense": "ffn_up",
    "output.dense": "ffn_down",
    "output.LayerNorm": "layer_output_norm",
}
SKIPPED = ("embeddings.position_ids", "pooler.", "cls.")
FILE_TYPES = {
    "f32": gguf.LlamaFileType.ALL_F32,
    "f16": gguf.LlamaFileType.MOSTLY_F16,
    "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
}
DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": None, "I64": np.int64}


def read_safetensors(path):
    """name -> numpy array, read with the format's own 8-byte header length + JSON."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        start, end = t["data_offsets"]
        buf = raw[8 + n + start : 8 + n + end]
        if t["dtype"] == "BF16":
            bits = np.frombuffer(buf, dtype=np.uint16).astype(np.uint32) << 16
            arr = bits.view(np.float32)
        else:
            arr = np.frombuffer(buf, dtype=DTYPES[t["dtype"]])
        out[name] = arr.reshape(t["shape"])
    return out


def gguf_name(name):
    """The GGUF name of a BERT tensor, or None for one llama.cpp does not use."""
    if name.startswith("bert."):
        name = name[5:]
    name = name.replace(".gamma", ".weight").replace(".beta", ".bias")
    if name.startswith(SKIPPED):
        return None
    stem, kind = name.rsplit(".", 1)
    if stem in FIXED:
        return f"{FIXED[stem]}.{kind}"
    if stem.startswith("encoder.layer."):
        layer, rest = stem[len("encoder.layer.") :].split(".", 1)
        if rest in PER_LAYER:
            return f"blk.{layer}.{PER_LAYER[rest]}.{kind}"
    raise SystemExit(f"bert-to-gguf: unexpected tensor {name}")


def pooling(model_dir):
    """The pooling the sentence-transformers modules name (llama.cpp's `_try_set_pooling_type`)."""
    modules = model_dir / "modules.json"
    if not modules.is_file():
        return None
    for mod in json.loads(modules.read_text()):
        if mod["type"].endswith("Pooling"):
            cfg = json.loads((model_dir / mod["path"] / "config.json").read_text())
            if cfg.get("pooling_mode_mean_tokens"):
                return gguf.PoolingType.MEAN
            if cfg.get("pooling_mode_cls_token"):
                return gguf.PoolingType.CLS
            if cfg.get("pooling_mode_lasttoken"):
                return gguf.PoolingType.LAST
            raise SystemExit("bert-to-gguf: only mean, cls and last-token pooling are supported")
    return None


def vocabulary(model_dir, vocab_size):
    """Tokens in phantom-space form, their types, and the special ids."""
    tj = json.loads((model_dir / "tokenizer.json").read_text())
    if tj["model"]["type"] != "WordPiece":
        raise SystemExit(f"bert-to-gguf: tokenizer model {tj['model']['type']}, expected WordPiece")
    by_id = {i: t for t, i in tj["model"]["vocab"].items()}
    special = {a["id"]: a["content"] for a in tj.get("added_tokens", []) if a.get("special")}
    for i, t in special.items():
        by_id[i] = t
    tokens, types = [], []
    for i in range(vocab_size):
        tok = by_id.get(i)
        if tok is None:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
        elif i in special:
            tokens.append(tok)
            types.append(gguf.TokenType.CONTROL)
        else:
            tokens.append(tok[2:] if tok.startswith("##") else "\u2581" + tok)
            types.append(gguf.TokenType.NORMAL)
    ids = {t: i for i, t in special.items()}
    norm = tj.get("normalizer") or {}
    return tokens, types, ids, bool(norm.get("lowercase", False))


def main():
    if len(sys.argv) not in (3, 4):
        raise SystemExit(__doc__)
    model_dir, out = Path(sys.argv[1]), Path(sys.argv[2])
    outtype = sys.argv[3] if len(sys.argv) == 4 else "f32"
    if outtype not in FILE_TYPES:
        raise SystemExit(f"bert-to-gguf: outtype {outtype!r}: f32, f16 or q8_0")
    cfg = json.loads((model_dir / "config.json").read_text())
    if cfg.get("model_type") != "bert":
        raise SystemExit(f"bert-to-gguf: model_type {cfg.get('model_type')!r}, expected 'bert'")
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise SystemExit(f"bert-to-gguf: no *.safetensors in {model_dir}")

    w = gguf.GGUFWriter(str(out) + ".part", "bert")
    w.add_name(model_dir.name)
    w.add_file_type(FILE_TYPES[outtype])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_layer_norm_eps(cfg.get("layer_norm_eps", 1e-12))
    w.add_causal_attention(False)
    if (p := pooling(model_dir)) is not None:
        w.add_pooling_type(p)

    tokens, types, ids, lowercase = vocabulary(model_dir, cfg["vocab_size"])
    w.add_token_type_count(cfg.get("type_vocab_size", 1))
    w.add_tokenizer_model("bert")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    # gguf-py has no key for [CLS]: llama.cpp puts BOS (= [CLS]) first.
    for name, add in [
        ("[CLS]", w.add_bos_token_id),
        ("[SEP]", w.add_eos_token_id),
        ("[UNK]", w.add_unk_token_id),
        ("[SEP]", w.add_sep_token_id),
        ("[PAD]", w.add_pad_token_id),
        ("[MASK]", w.add_mask_token_id),
    ]:
        if name in ids:
            add(ids[name])
    w.add_add_bos_token(True)
    w.add_add_eos_token(True)
    w.add_add_sep_token(False)
    w.add_bool("tokenizer.ggml.normalizer.lowercase", lowercase)

    for f in files:
        for name, arr in read_safetensors(f).items():
            target = gguf_name(name)
            if target is None:
                continue
            arr = arr.astype(np.float32)
            # llama.cpp keeps vectors, norms, positions and token types in F32.
            keep_f32 = (
                arr.ndim == 1
                or target.endswith("_norm.weight")
                or target.startswith(("position_embd", "token_types"))
            )
            if outtype == "f16" and not keep_f32:
                arr = arr.astype(np.float16)
            if outtype == "q8_0" and not keep_f32:
                # gguf-py's reference Q8_0, as the converter's `--outtype q8_0`.
                q = gguf.quants.quantize(arr, gguf.GGMLQuantizationType.Q8_0)
                w.add_tensor(target, q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
                continue
            w.add_tensor(target, arr)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file(progress=False)
    w.close()
    Path(str(out) + ".part").rename(out)


if __name__ == "__main__":
    main()
