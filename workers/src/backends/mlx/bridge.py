"""switchyard's MLX bridge: one model, driven over JSON Lines on stdin/stdout.

Written to the cache and run by the `metal` worker (workers/src/backends/mlx/) with a
Python that has mlx-lm. Every request is one JSON object per line with an `id` and an
`op`; every answer is one JSON object per line carrying the same `id`. The protocol is
docs/protocol.md §14 (the MLX bridge). Logs go to stderr, never stdout.

Ops:
  load      {path, device}            -> {event: "loaded", info: {...}}
  generate  {prompt | messages | tokens, config}
                                      -> {event: "token", token, text}* then
                                         {event: "done", finish, metrics}
  cancel    {target}                  -> (the target ends with finish "cancelled")
  info      {}                        -> {event: "info", info: {...}}
  quit      {}                        -> {event: "bye"}, then exit 0
  anything that fails                 -> {event: "error", code, message}

One generation runs at a time (the worker announces capacity 1); a reader thread keeps
taking lines meanwhile, so a cancel lands at the next token boundary.
"""
import json
import queue
import sys
import threading
import time
import traceback

OUT_LOCK = threading.Lock()


def send(obj):
    line = json.dumps(obj, ensure_ascii=False)
    with OUT_LOCK:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def log(msg):
    sys.stderr.write(f"mlx-bridge: {msg}\n")
    sys.stderr.flush()


class Bridge:
    def __init__(self):
        self.model = None
        self.tokenizer = None
        self.info = None
        self.cancelled = set()
        self.lock = threading.Lock()

    def load(self, req):
        import mlx.core as mx
        import mlx_lm

        device = req.get("device", "")
        if device == "cpu":
            mx.set_default_device(mx.cpu)
        elif device == "gpu":
            mx.set_default_device(mx.gpu)
        path = req["path"]
        started = time.time()
        self.model, self.tokenizer = mlx_lm.load(path)
        quant = {}
        try:
            with open(f"{path}/config.json") as f:
                raw = json.load(f)
            quant = raw.get("quantization") or {}
        except OSError:
            raw = {}
        self.info = {
            "architecture": raw.get("model_type", ""),
            "vocab_size": int(raw.get("vocab_size", 0)),
            "num_layers": int(raw.get("num_hidden_layers", 0)),
            "hidden_size": int(raw.get("hidden_size", 0)),
            "context_len": int(raw.get("max_position_embeddings", 0)),
            "quant_bits": int(quant.get("bits", 0)),
            "quant_group": int(quant.get("group_size", 0)),
            "device": str(mx.default_device()),
            "eos": sorted(int(t) for t in self.tokenizer.eos_token_ids),
        }
        log(f"loaded {path} on {self.info['device']} in {time.time() - started:.2f} s")
        return {"event": "loaded", "info": self.info}

    def generate(self, rid, req):
        import mlx.core as mx
        import mlx_lm
        from mlx_lm.sample_utils import make_logits_processors, make_sampler

        if self.model is None:
            raise BridgeError("not_loaded", "no model is loaded")
        cfg = req.get("config", {})
        if req.get("tokens") is not None:
            tokens = [int(t) for t in req["tokens"]]
            if not tokens:
                raise BridgeError("bad_request", "empty prompt")
        elif "messages" in req and req["messages"] is not None:
            prompt = self.tokenizer.apply_chat_template(req["messages"], add_generation_prompt=True, tokenize=False)
            tokens = self.tokenizer.encode(prompt, add_special_tokens=False)
        else:
            prompt = req.get("prompt") or ""
            if not prompt:
                raise BridgeError("bad_request", "empty prompt")
            tokens = self.tokenizer.encode(prompt, add_special_tokens=False)
        ctx = self.info.get("context_len") or 0
        max_tokens = int(cfg.get("max_tokens", 256))
        if ctx and len(tokens) + max_tokens > ctx:
            raise BridgeError(
                "context_overflow", f"{len(tokens)} prompt tokens + {max_tokens} exceed the context of {ctx}"
            )
        seed = cfg.get("seed")
        if seed is not None:
            mx.random.seed(int(seed))
        sampler = make_sampler(
            temp=float(cfg.get("temperature", 0.0)),
            top_p=float(cfg.get("top_p", 1.0)) if cfg.get("top_p", 1.0) < 1.0 else 0.0,
            min_p=float(cfg.get("min_p", 0.0)),
            top_k=int(cfg.get("top_k", 0)),
        )
        processors = make_logits_processors(
            repetition_penalty=float(cfg["repeat_penalty"]) if cfg.get("repeat_penalty", 1.0) != 1.0 else None,
        )
        stop_ids = set(int(t) for t in cfg.get("stop_tokens", [])) | set(self.info["eos"])
        started = time.time()
        first = None
        n = 0
        finish = "length"
        for r in mlx_lm.stream_generate(
            self.model, self.tokenizer, mx.array(tokens), max_tokens=max_tokens,
            sampler=sampler, logits_processors=processors,
        ):
            with self.lock:
                if rid in self.cancelled:
                    self.cancelled.discard(rid)
                    finish = "cancelled"
                    break
            if first is None:
                first = time.time()
            if r.token in stop_ids:
                finish = "stop"
                break
            n += 1
            send({"id": rid, "event": "token", "token": int(r.token), "text": r.text})
        done = time.time()
        metrics = {
            "prompt_tokens": len(tokens),
            "generated_tokens": n,
            "prefill_us": int(((first or done) - started) * 1e6),
            "decode_us": int((done - (first or done)) * 1e6),
            "total_us": int((done - started) * 1e6),
            "peak_memory_bytes": int(mx.get_peak_memory()),
            "active_memory_bytes": int(mx.get_active_memory()),
        }
        return {"event": "done", "finish": finish, "metrics": metrics}


class BridgeError(Exception):
    def __init__(self, code, message):
        super().__init__(message)
        self.code = code
        self.message = message


def main():
    bridge = Bridge()
    work = queue.Queue()

    def reader():
        for line in sys.stdin:
            line = line.strip()
            if not line:
                continue
            try:
                req = json.loads(line)
            except ValueError as e:
                send({"id": None, "event": "error", "code": "bad_request", "message": f"not JSON: {e}"})
                continue
            if req.get("op") == "cancel":
                with bridge.lock:
                    bridge.cancelled.add(req.get("target"))
                continue
            work.put(req)
        work.put({"op": "quit", "id": None})

    threading.Thread(target=reader, daemon=True).start()
    send({"id": None, "event": "ready"})
    while True:
        req = work.get()
        rid, op = req.get("id"), req.get("op")
        try:
            if op == "quit":
                send({"id": rid, "event": "bye"})
                return
            elif op == "load":
                send({"id": rid, **bridge.load(req)})
            elif op == "info":
                send({"id": rid, "event": "info", "info": bridge.info})
            elif op == "generate":
                send({"id": rid, **bridge.generate(rid, req)})
            else:
                raise BridgeError("bad_request", f"unknown op {op!r}")
        except BridgeError as e:
            send({"id": rid, "event": "error", "code": e.code, "message": e.message})
        except Exception as e:  # a bug or an MLX failure: this request fails, the bridge lives
            log(traceback.format_exc())
            send({"id": rid, "event": "error", "code": "backend_error", "message": f"{type(e).__name__}: {e}"})


if __name__ == "__main__":
    main()
