"""What the scripts that write Hugging Face model directories share:
model.safetensors, and a byte-level BPE tokenizer.json for a GGUF vocabulary.
(Imported by make-random-hf-model.py and gguf-to-hf.py, which sit beside it.)"""
import json
import os
import struct

# llama.cpp's byte-level pre-tokenizers, as the `tokenizers` library's JSON.
GPT2 = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
PRE_TOKENIZERS = {
    "smollm": {"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": True}, GPT2]},
    "gpt2": GPT2,
    "default": GPT2,
}


def write_safetensors(out_dir, tensors, encode):
    """Writes `tensors` (name -> array) to OUT_DIR/model.safetensors; `encode(array)`
    gives (safetensors dtype, raw little-endian bytes)."""
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name, a in tensors.items():
        st_dtype, data = encode(a)
        header[name] = {"dtype": st_dtype, "shape": list(a.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    with open(os.path.join(out_dir, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(head)))
        f.write(head)
        for b in blobs:
            f.write(b)


def write_bpe_tokenizer(out_dir, tokens, merges, types, pre, added_types=(3,)):
    """Writes OUT_DIR/tokenizer.json: a byte-level BPE over the GGUF vocabulary
    `tokens`/`merges`, pre-tokenizer `pre` (a key of PRE_TOKENIZERS), and the tokens
    whose GGUF type is in `added_types` as added tokens (control ones, type 3, special)."""
    added = [
        {"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
         "special": ty == 3}
        for i, (t, ty) in enumerate(zip(tokens, types)) if ty in added_types
    ]
    tokenizer = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
        "pre_tokenizer": PRE_TOKENIZERS[pre], "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                  "vocab": {t: i for i, t in enumerate(tokens)}, "merges": list(merges)},
    }
    json.dump(tokenizer, open(os.path.join(out_dir, "tokenizer.json"), "w"))
