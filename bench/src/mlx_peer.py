"""`switchyard bench mlx`'s peer: mlx-lm called directly, no switchyard in between.

Loads the model given as argv[1] on MLX's default device (the CPU on Linux), then for
each line on stdin (a JSON object {prompt, max_tokens}) runs mlx_lm.stream_generate
greedily with a fresh cache and prints one JSON line: time to first token, decode time
after it, tokens, prompt tokens, and mlx-lm's own prompt tok/s.
"""
import json
import sys
import time

import mlx.core as mx
import mlx_lm

model, tokenizer = mlx_lm.load(sys.argv[1])
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    req = json.loads(line)
    start = time.perf_counter()
    first = last = None
    n = 0
    prompt_tokens = 0
    prompt_tps = 0.0
    for r in mlx_lm.stream_generate(model, tokenizer, req["prompt"], max_tokens=req["max_tokens"]):
        now = time.perf_counter()
        if r.token in tokenizer.eos_token_ids:
            break
        first = first or now
        last = now
        n += 1
        prompt_tokens, prompt_tps = r.prompt_tokens, r.prompt_tps
    print(json.dumps({
        "ttft_s": (first or start) - start,
        "decode_s": (last or start) - (first or start),
        "tokens": n,
        "prompt_tokens": prompt_tokens,
        "prompt_tps": prompt_tps,
        "peak_memory_bytes": int(mx.get_peak_memory()),
    }), flush=True)
