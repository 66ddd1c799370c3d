#!/usr/bin/env python3
"""Cross-language MessagePack fixture for switchyard's wire contract.

    python examples/python/write_fixture.py OUT.msgpack [RUST_CHUNK.msgpack]

Writes to OUT.msgpack one MessagePack array of three maps encoded by Python's
`msgpack` (an implementation independent of rmp-serde):
  [0] a GenerateRequest (generate) with a full config, non-ASCII text and an unknown
      extra field that the Rust decoder must ignore;
  [1] a chat GenerateRequest with no `config` at all (defaults must apply);
  [2] a final StreamChunk with metrics.
Python floats are float64 on the wire; Rust's f32 fields (temperature, top_p) must
still decode them.

If RUST_CHUNK.msgpack is given, it is decoded (a StreamChunk written by Rust) and
printed to stdout as one JSON object, so a Rust test can check Python reads Rust bytes.
"""

import json
import sys

import msgpack

FIXTURES = [
    {
        "v": 1,
        "request_id": "py-1",
        "model": "smollm2",
        "prompt": "Hello, naïve café 🚀",
        "config": {
            "max_tokens": 7,
            "temperature": 0.5,
            "top_k": 40,
            "top_p": 0.9,
            "seed": 123,
            "stop": ["\n\n"],
            "stop_tokens": [2],
        },
        "backend": "cpu",
        "unknown_extra_field": {"nested": [1, 2, 3]},
    },
    {
        "v": 1,
        "request_id": "py-2",
        "model": "",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
        ],
    },
    {
        "v": 1,
        "request_id": "py-1",
        "seq": 4,
        "tokens": [{"id": 17, "text": "é"}],
        "done": True,
        "finish_reason": "length",
        "metrics": {
            "prompt_tokens": 5,
            "generated_tokens": 7,
            "prefill_us": 1000,
            "decode_us": 2000,
            "total_us": 3500,
            "queue_us": 0,
            "prefill_tokens_per_sec": 5000.0,
            "decode_tokens_per_sec": 3000.0,
            "peak_memory_bytes": 0,
            "active_memory_bytes": 0,
        },
        "error": None,
        "worker_id": "cpu-1",
    },
]


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__.strip(), file=sys.stderr)
        return 1
    with open(argv[1], "wb") as f:
        # use_bin_type=True: str → MessagePack str, bytes → bin (the modern spec).
        f.write(msgpack.packb(FIXTURES, use_bin_type=True))
    if len(argv) > 2:
        with open(argv[2], "rb") as f:
            chunk = msgpack.unpackb(f.read(), raw=False)
        print(json.dumps(chunk, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
