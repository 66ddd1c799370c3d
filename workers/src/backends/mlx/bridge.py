"""switchyard's MLX bridge: one model, driven over JSON Lines on stdin/stdout.

Written to the cache and run by the `metal` worker (workers/src/backends/mlx/) with a
Python that has mlx-lm. Every request is one JSON object per line with an `id` and an
`op`; every answer is one JSON object per line carrying the same `id`. The protocol is
docs/protocol.md §14 (the MLX bridge). Logs go to stderr, never stdout.

Ops (a prompt is one of `prompt` (text), `messages` (chat) or `tokens`):
  load          {path, device, max_sessions}  -> {event: "loaded", info}
  generate      {prompt.., config}            -> {event: "token", token, text}* then
                                                 {event: "done", finish, metrics}
                (config: GenerateConfig fields, and `constraint`, below)
  classify      {prompt.., logits}            -> {event: "classified", token, text, logits?}
  embed         {prompt..}                    -> {event: "embedded", embedding, tokens}
                (the final hidden states, after the model's norm, averaged over the
                tokens and L2-normalised, as base64 float32)
  inspect       {prompt..}                    -> {event: "inspected", seq_len, keys, ..}
  tokenize      {text, bos}                   -> {event: "tokens", tokens}
  session_open  {}                            -> {event: "session", session}
  set_resident  {session, tokens, invalidate} -> {event: "resident", reused, computed, dropped}
  decode        {session, config}             -> like generate
  resident      {session}                     -> {event: "tokens", tokens}
  session_close {session}                     -> {event: "closed"}
  cancel        {target}                      -> (the target ends with finish "cancelled")
  info          {}                            -> {event: "info", info}
  render        {prompt..}                    -> {event: "rendered", rendered, tokens}
  kv_held       {tokens, adapter}             -> {event: "kv_held", tokens}
  kv_export     {tokens, adapter, first_block, blocks}
                                              -> {event: "kv", blocks, held_blocks, data}
  kv_import     {tokens, adapter, first_block, blocks, data}
                                              -> {event: "kv_imported", held_blocks}
                (`tail`: true on either: the KV of `tokens` past its last whole block)
  quit          {}                            -> {event: "bye"}, then exit 0
  anything that fails                         -> {event: "error", code, message}

Every event but `token` ends its request. One request runs at a time (the worker
announces capacity 1); a reader thread keeps taking lines meanwhile, so a cancel lands
at the next token boundary, and `render` and the KV exchange's ops (`kv_*`) are
answered between two tokens of a running generation (a peer pulling from a busy
worker is not kept waiting for its whole answer).

Constraints: `config.constraint` ({type: json_object | json_schema (schema: JSON text) |
regex (pattern) | lark (grammar)}) is compiled by llguidance (the grammar library the
CPU engine uses) against this model's tokenizer and masks the logits at every step;
a constraint that does not compile fails the request before any token.

Prefix reuse: plain generations share one prompt cache; a new prompt keeps the longest
prefix it shares with what the cache holds (mlx-lm's trimmable KV cache) and computes
only the rest (`cached_tokens` in the metrics). Each session owns its own cache.

KV exchange (docs/kv-transfer.md): `kv_export` reads whole blocks of KV_BLOCK tokens
of a prefix out of whichever cache holds it (the shared one, also while a generation
runs on it, a session's, or one imported), each block its keys then its values,
`[layer][kv_head][position][head_dim]` at the cache's dtype, little-endian;
`kv_import` keeps a peer's blocks (bounded) until a `generate` whose prompt starts
with them takes them as its shared cache. Only plain `KVCache` layers travel (no
rotating window, no quantized cache).
"""
import base64
import json
import os
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


def f32_base64(array):
    """An MLX array as base64 of little-endian float32, row-major."""
    import mlx.core as mx
    import numpy as np

    return base64.b64encode(np.array(array.astype(mx.float32)).astype("<f4").tobytes()).decode("ascii")


# The LoRA adapter the current request runs with (None: the base model). Requests run
# one at a time, so one global switch serves every wrapped projection.
ACTIVE = [None]


def lora_switch(base):
    """`base` (a Linear or QuantizedLinear) as a module that adds the active
    adapter's update, `scale * (x @ A.T) @ B.T`, when it has one for this
    projection."""
    import mlx.nn as nn

    class LoraSwitch(nn.Module):
        def __init__(self, base):
            super().__init__()
            self.base = base
            # Off the module tree: not parameters, no effect on the base's.
            object.__setattr__(self, "loras", {})

        def __call__(self, x):
            y = self.base(x)
            lo = self.loras.get(ACTIVE[0])
            if lo is not None:
                a, b, scale = lo
                y = y + (scale * ((x @ a) @ b)).astype(y.dtype)
            return y

    return LoraSwitch(base)


def load_peft(model, name, path, scale):
    """Adds the PEFT adapter at `path` as `name` to `model`'s projections; returns how
    many it adapts. Errors name what is wrong; on one, nothing is added."""
    import mlx.core as mx

    try:
        with open(os.path.join(path, "adapter_config.json")) as f:
            config = json.load(f)
    except (OSError, ValueError) as e:
        raise BridgeError("bad_request", f"LoRA adapter {name!r} ({path}): {e} (MLX loads PEFT directories)")
    if config.get("peft_type", "LORA") != "LORA":
        raise BridgeError("bad_request", f"LoRA adapter {name!r}: it is a {config.get('peft_type')} adapter, not LoRA")
    alpha = float(config.get("lora_alpha", 8))
    rslora = bool(config.get("use_rslora", False))
    weights = mx.load(os.path.join(path, "adapter_model.safetensors"))
    modules = dict(model.named_modules())
    pairs = {}
    for key, w in weights.items():
        for part in (".lora_A.weight", ".lora_B.weight"):
            if key.endswith(part):
                target = key[: -len(part)].removeprefix("base_model.model.")
                pairs.setdefault(target, {})[part[6]] = w
    updates = []
    for target, ab in sorted(pairs.items()):
        if "A" not in ab or "B" not in ab:
            raise BridgeError("bad_request", f"LoRA adapter {name!r}: {target}: A or B is missing")
        module = modules.get(target)
        base = getattr(module, "base", module)
        if base is None or not hasattr(base, "weight"):
            raise BridgeError("bad_request", f"LoRA adapter {name!r}: the model has no projection {target}")
        a, b = ab["A"], ab["B"]
        rank = a.shape[0]
        out_dim, in_dim = base.weight.shape[0], a.shape[1]
        if b.shape != (out_dim, rank) or getattr(base, "bits", None) is None and base.weight.shape != (out_dim, in_dim):
            raise BridgeError(
                "bad_request",
                f"LoRA adapter {name!r}: {target}: A is {list(a.shape)} and B {list(b.shape)}, "
                f"the model's projection is {list(base.weight.shape)} (an adapter for another model?)",
            )
        factor = 1.0 if alpha == 0 else (alpha / rank ** 0.5 if rslora else alpha / rank)
        updates.append((target, module, a.T.astype(mx.float32), b.T.astype(mx.float32), scale * factor))
    if not updates:
        raise BridgeError("bad_request", f"LoRA adapter {name!r} ({path}): it holds no LoRA tensors")
    unload_lora(model, name)  # replaced only once the new one is known good
    for target, module, a, b, s in updates:
        if not hasattr(module, "loras"):
            parent, attr = target.rsplit(".", 1)
            module = lora_switch(module)
            setattr(modules[parent], attr, module)
        module.loras[name] = (a, b, s)
    return len(updates)


def unload_lora(model, name):
    found = False
    for _, module in model.named_modules():
        loras = getattr(module, "loras", None)
        if isinstance(loras, dict) and loras.pop(name, None) is not None:
            found = True
    return found


class BridgeError(Exception):
    def __init__(self, code, message, **extra):
        super().__init__(message)
        self.code = code
        self.message = message
        self.extra = extra


class Cache:
    """A prompt cache and the tokens it holds, position by position."""

    def __init__(self, model):
        from mlx_lm.models.cache import make_prompt_cache

        self.layers = make_prompt_cache(model)
        self.tokens = []
        # While a generation runs on it: every token fed or to be fed (the prompt,
        # then each one sampled); its first `offset()` are what the KV holds.
        self.live = None

    def held(self):
        """The tokens whose KV the cache holds now."""
        if self.live is not None:
            return self.live[: min(self.offset(), len(self.live))]
        return self.tokens

    def offset(self):
        return self.layers[0].offset if self.layers else 0

    def keep(self, n):
        """Keeps the first `n` tokens (trims the rest); returns how many are kept."""
        from mlx_lm.models.cache import can_trim_prompt_cache, trim_prompt_cache

        held = self.offset()
        n = min(n, held)
        if n < held:
            if not can_trim_prompt_cache(self.layers):
                return None
            trim_prompt_cache(self.layers, held - n)
        self.tokens = self.tokens[:n]
        return n


def common_prefix(a, b):
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


# The KV exchange's block (tokens) and what pulled KV may take while it waits for its
# generation: at most this many prefixes, this many bytes, this long.
KV_BLOCK = 16
KV_MAX_IMPORTS = 4
KV_MAX_IMPORT_BYTES = 1 << 30
KV_IMPORT_FOR = 60.0

# The exchange's names of MLX's storage types, and the integer type of each one's width
# (bfloat16 has no numpy type: its bits travel as uint16).
KV_DTYPES = {"float16": ("f16", "uint16"), "bfloat16": ("bf16", "uint16"), "float32": ("f32", "uint32")}


def kv_bits(array):
    """An MLX array's storage as little-endian bytes."""
    import mlx.core as mx
    import numpy as np

    _, bits = KV_DTYPES[str(array.dtype).removeprefix("mlx.core.")]
    return np.array(array.view(getattr(mx, bits))).astype("<" + np.dtype(bits).str[1:]).tobytes()


def kv_array(data, shape, dtype):
    """`kv_bits`' bytes back as an MLX array of `shape` and `dtype`."""
    import mlx.core as mx
    import numpy as np

    _, bits = KV_DTYPES[str(dtype).removeprefix("mlx.core.")]
    return mx.array(np.frombuffer(data, dtype="<" + np.dtype(bits).str[1:]).reshape(shape)).view(dtype)


class Imported:
    """A peer's blocks of one prefix, waiting for the generation they were pulled for."""

    def __init__(self, tokens, adapter):
        self.tokens = tokens  # the whole prefix the puller asked for
        self.adapter = adapter
        self.parts = []  # bytes of consecutive blocks, from block 0
        self.blocks = 0
        self.tail = []  # tokens past the last block, and their KV (a block of fewer positions)
        self.tail_data = b""
        self.at = time.time()

    def nbytes(self):
        return sum(len(p) for p in self.parts) + len(self.tail_data)

    def held(self):
        return self.tokens[: self.blocks * KV_BLOCK] + self.tail


CONSTRAINT_KINDS = ("json_object", "json_schema", "regex", "lark")


# Whitespace JSON may hold between tokens: one space, or one or two newlines and up to
# 20 spaces or tabs of indent (llama.cpp's rule). Unbounded whitespace lets a small
# model at temperature 1 write newlines until max_tokens. The CPU engine uses the
# same pattern (engine/src/constraint.rs, JSON_WHITESPACE).
JSON_WHITESPACE = r"[\x20\x09]|\x0A{1,2}[\x20\x09]{0,20}"


def bounded_whitespace(schema):
    """The schema with llguidance's whitespace option set, unless it sets its own."""
    if isinstance(schema, dict) and "x-guidance" not in schema:
        schema = dict(schema, **{"x-guidance": {"whitespace_pattern": JSON_WHITESPACE}})
    return schema


def grammar_of(constraint):
    """The llguidance grammar (its JSON text) of a `config.constraint`; BridgeError
    `bad_request` when the constraint is malformed or llguidance is missing."""
    if not isinstance(constraint, dict):
        raise BridgeError("bad_request", "config.constraint must be an object with a `type`")
    kind = constraint.get("type")
    if kind not in CONSTRAINT_KINDS:
        raise BridgeError("bad_request", f"config.constraint of type {kind!r} is not supported by the MLX bridge")
    try:
        from llguidance import LLMatcher
    except ImportError as e:
        raise BridgeError(
            "bad_request",
            f"config.constraint ({kind}) needs the Python package llguidance, which {sys.executable} "
            f"lacks (scripts/setup.sh installs it): {e}",
        )

    def field(name):
        v = constraint.get(name)
        if not isinstance(v, str):
            raise BridgeError("bad_request", f"config.constraint ({kind}): `{name}` must be a string")
        return v

    try:
        if kind == "json_object":
            return LLMatcher.grammar_from_json_schema(json.dumps(bounded_whitespace({"type": "object"})))
        if kind == "json_schema":
            text = field("schema")
            try:
                schema = json.loads(text)
            except ValueError as e:
                raise BridgeError("bad_request", f"config.constraint (json_schema): the schema is not JSON: {e}")
            return LLMatcher.grammar_from_json_schema(json.dumps(bounded_whitespace(schema)))
        if kind == "regex":
            return LLMatcher.grammar_from_regex(field("pattern"))
        return LLMatcher.grammar_from_lark(field("grammar"))
    except (ValueError, TypeError) as e:
        raise BridgeError("bad_request", f"config.constraint ({kind}): {e}")


class Guide:
    """One generation's constraint: an llguidance matcher that consumes every sampled
    token, and (as an mlx-lm logits processor) masks each step's logits to the tokens
    the grammar allows. llguidance's mask holds the end-of-generation ids exactly
    where the text is complete. Tokens are counted from the first one mlx-lm feeds
    (`fed` prompt tokens, then the generated ones)."""

    def __init__(self, matcher, lltok, kind):
        import numpy as np

        self.matcher = matcher
        self.kind = kind
        self.fed = 0  # prompt tokens mlx-lm is given before the generated ones
        self.consumed = 0  # generated tokens the matcher has consumed
        self.words = np.full((1, (lltok.vocab_size + 31) // 32), -1, dtype=np.int32)
        self.error = None

    def catch_up(self, generated):
        """Consumes what of `generated` (every token generated so far) it has not yet."""
        self.consume(generated[self.consumed:])

    def consume(self, new):
        for t in new:
            self.consumed += 1
            if self.error is None and not self.matcher.consume_token(int(t)):
                lines = self.matcher.get_error().strip().splitlines()  # the first names the token
                self.error = lines[0] if lines else f"token {t} does not fit the grammar"

    def stopped(self):
        """Whether the grammar is complete and allows nothing more (but EOS)."""
        return self.matcher.is_stopped()

    def __call__(self, tokens, logits):
        """mlx-lm's logits processor: `tokens` is what it has fed so far."""
        import mlx.core as mx
        import numpy as np
        from llguidance.numpy import fill_next_token_bitmask

        start = self.fed + self.consumed
        if tokens.size > start:
            self.consume(tokens[start:].tolist())  # waits for the token just sampled
        if self.error is not None:
            return logits  # the run loop ends the generation at this token
        fill_next_token_bitmask(self.matcher, self.words)
        bits = np.unpackbits(self.words.view(np.uint8), axis=-1, bitorder="little")[0]
        vocab = logits.shape[-1]
        if bits.size >= vocab:
            bits = bits[:vocab]
        else:  # logit rows past the tokenizer's vocabulary (padding) are never allowed
            bits = np.concatenate([bits, np.zeros(vocab - bits.size, dtype=bits.dtype)])
        return mx.where(mx.array(bits.astype(np.bool_)), logits, -float("inf"))


class Bridge:
    def __init__(self):
        self.model = None
        self.tokenizer = None
        self.info = None
        self.cancelled = set()
        self.lock = threading.Lock()
        self.shared = None
        self.sessions = {}
        self.next_session = 1
        self.max_sessions = 8
        self.lltok = None  # llguidance's view of the loaded tokenizer, built on first use
        self.adapters = set()
        self.shared_adapter = None  # the adapter the shared cache's KV was computed with
        self.kv = None  # the KV exchange's layout ({dtype, layers, kv_heads, head_dim}), if any
        self.imported = []  # Imported, oldest first
        self.urgent = queue.Queue()  # KV exchange ops answered between two tokens

    def load(self, req):
        import mlx.core as mx
        import mlx_lm

        device = req.get("device", "")
        if device == "cpu":
            mx.set_default_device(mx.cpu)
        elif device == "gpu":
            mx.set_default_device(mx.gpu)
        self.max_sessions = int(req.get("max_sessions", 8))
        path = req["path"]
        started = time.time()
        self.model, self.tokenizer = mlx_lm.load(path)
        self.lltok = None
        quant = {}
        try:
            with open(f"{path}/config.json") as f:
                raw = json.load(f)
            quant = raw.get("quantization") or {}
        except OSError:
            raw = {}
        args = getattr(self.model, "args", None)
        heads = int(raw.get("num_attention_heads", 0))
        hidden = int(raw.get("hidden_size", 0))
        self.info = {
            "architecture": raw.get("model_type", ""),
            "vocab_size": int(raw.get("vocab_size", 0)),
            "num_layers": int(raw.get("num_hidden_layers", 0)),
            "hidden_size": hidden,
            "context_len": int(raw.get("max_position_embeddings", 0)),
            "kv_heads": int(raw.get("num_key_value_heads", heads)),
            "head_dim": int(raw.get("head_dim", getattr(args, "head_dim", 0) or (hidden // heads if heads else 0))),
            "quant_bits": int(quant.get("bits", 0)),
            "quant_group": int(quant.get("group_size", 0)),
            "device": str(mx.default_device()),
            "eos": sorted(int(t) for t in self.tokenizer.eos_token_ids),
            # mlx-lm's models keep the decoder (embeddings → blocks → norm) as `.model`.
            "embedding_dim": hidden if callable(getattr(self.model, "model", None)) else 0,
        }
        self.shared = Cache(self.model)
        self.imported = []
        self.kv, why = self.kv_layout(raw)
        if self.kv is None:
            self.info["kv_why"] = why
        else:
            self.info["kv"] = self.kv
        log(f"loaded {path} on {self.info['device']} in {time.time() - started:.2f} s")
        return {"event": "loaded", "info": self.info}

    def need_model(self):
        if self.model is None:
            raise BridgeError("not_loaded", "no model is loaded")

    def tokens_of(self, req):
        """The prompt's token ids: given, a chat rendered by the model's template, or
        text (with BOS as mlx-lm adds it)."""
        return self.rendered(req)[1]

    def rendered(self, req):
        """The prompt as text (a chat rendered by the model's template; None for token
        ids) and its token ids."""
        rendered = None
        if req.get("tokens") is not None:
            tokens = [int(t) for t in req["tokens"]]
        elif req.get("messages") is not None:
            kwargs = req.get("chat_template_kwargs") or {}
            rendered = self.tokenizer.apply_chat_template(
                req["messages"], add_generation_prompt=True, tokenize=False, **kwargs
            )
            tokens = self.tokenizer.encode(rendered, add_special_tokens=False)
        else:
            rendered = req.get("prompt") or ""
            tokens = self.encode(rendered, None)
        if not tokens:
            raise BridgeError("bad_request", "empty prompt")
        vocab = self.info.get("vocab_size") or 0
        if vocab and any(t < 0 or t >= vocab for t in tokens):
            raise BridgeError("bad_request", f"a token id is outside the vocabulary of {vocab}")
        return rendered, list(tokens)

    def encode(self, text, bos):
        if bos is None:
            bos_text = self.tokenizer.bos_token
            bos = bos_text is not None and not text.startswith(bos_text)
        if not text:
            return []
        return list(self.tokenizer.encode(text, add_special_tokens=bool(bos)))

    def session(self, req):
        s = self.sessions.get(req.get("session"))
        if s is None:
            raise BridgeError("bad_request", f"no session {req.get('session')!r} (closed, or the bridge restarted)")
        return s

    def fit_max_tokens(self, n, cfg):
        """`config.max_tokens`, or with `fit_max_tokens` (a default the caller did not
        choose) at most what the context leaves after `n` prompt tokens; written back
        into `cfg` for the generation."""
        max_tokens = int(cfg.get("max_tokens", 256))
        want_logprobs = cfg.get("logprobs")
        ctx = self.info.get("context_len") or 0
        if cfg.get("fit_max_tokens") and ctx:
            max_tokens = max(1, min(max_tokens, ctx - n))
            cfg["max_tokens"] = max_tokens
        return max_tokens

    def check_context(self, n, max_tokens):
        ctx = self.info.get("context_len") or 0
        if ctx and n + max_tokens > ctx:
            raise BridgeError("context_overflow", f"This model's maximum context length is {ctx} tokens. However, "
                              f"you requested {n + max_tokens} tokens ({n} in the prompt, {max_tokens} for the "
                              "completion). Please reduce the length of the prompt or of max_tokens.",
                              prompt_tokens=n, max_tokens=max_tokens, context_len=ctx)

    def grammar_tokenizer(self):
        """llguidance's tokenizer for the loaded model (built once: ~0.3 s for a 49k
        vocabulary), from the Hugging Face tokenizer mlx-lm's wrapper holds; every
        end-of-generation id ends the grammar."""
        if self.lltok is None:
            import llguidance
            import llguidance.hf

            hf = getattr(self.tokenizer, "_tokenizer", self.tokenizer)
            started = time.time()
            try:
                self.lltok = llguidance.hf.from_tokenizer(hf, eos_token=list(self.info["eos"]) or None)
            except Exception as e:
                raise BridgeError("backend_error", f"building llguidance's tokenizer from {type(hf).__name__}: {e}")
            log(f"llguidance tokenizer: {self.lltok.vocab_size} tokens in {time.time() - started:.2f} s")
        return self.lltok

    def guide(self, cfg):
        """The Guide of `config.constraint` (None without one); bad_request when it does
        not compile. Compiled before any cache is touched."""
        constraint = cfg.get("constraint")
        if constraint is None:
            return None
        grammar = grammar_of(constraint)
        kind = constraint["type"]
        from llguidance import LLMatcher

        lltok = self.grammar_tokenizer()
        matcher = LLMatcher(lltok, grammar, log_level=0)
        if matcher.is_error():
            raise BridgeError("bad_request", f"config.constraint ({kind}): {matcher.get_error().strip()}")
        return Guide(matcher, lltok, kind)

    def generate(self, rid, req):
        self.need_model()
        tokens = self.tokens_of(req)
        cfg = req.get("config") or {}
        max_tokens = self.fit_max_tokens(len(tokens), cfg)
        self.check_context(len(tokens), max_tokens)
        started = time.time()
        guide = self.guide(cfg)
        # Keys and values of another adapter (or none) are not this request's.
        if ACTIVE[0] != self.shared_adapter:
            self.shared = Cache(self.model)
            self.shared_adapter = ACTIVE[0]
        # KV a peer computed for this prompt, pulled for it, replaces the shared cache
        # when it holds more of the prompt.
        if self.imported:
            claimed = self.claim_import(tokens[:-1], ACTIVE[0], common_prefix(self.shared.tokens, tokens))
            if claimed is not None:
                self.shared = claimed
        # Keep what the shared cache shares with this prompt, but feed at least one
        # token: the last prompt token's logits pick the first new token.
        keep = self.shared.keep(min(common_prefix(self.shared.tokens, tokens), len(tokens) - 1))
        if keep is None:
            self.shared = Cache(self.model)
            keep = 0
        if guide is not None:
            guide.fed = len(tokens) - keep
        return self.run(rid, self.shared, tokens, keep, cfg, guide=guide, started=started)

    def decode(self, rid, req):
        self.need_model()
        s = self.session(req)
        if not s.tokens:
            raise BridgeError("bad_request", "the session holds no tokens to decode from")
        cfg = req.get("config") or {}
        self.check_context(len(s.tokens), int(cfg.get("max_tokens", 256)))
        tokens = list(s.tokens)
        started = time.time()
        guide = self.guide(cfg)
        keep = s.keep(len(tokens) - 1)
        if keep is None:
            raise BridgeError("backend_error", "this model's cache cannot be trimmed; sessions need one that can")
        if guide is not None:
            guide.fed = len(tokens) - keep
        return self.run(rid, s, tokens, keep, cfg, settle=True, guide=guide, started=started)

    def run(self, rid, cache, tokens, keep, cfg, settle=False, guide=None, started=None):
        """Generates after `tokens`, of which `cache` already holds the first `keep`;
        streams tokens, and leaves in `cache.tokens` exactly what its KV holds. With a
        `guide`, every step is masked to its grammar and the generation stops (finish
        `stop`) once the grammar is complete and allows nothing more."""
        import mlx.core as mx
        import mlx_lm
        import numpy as np
        from mlx_lm.sample_utils import make_logits_processors, make_sampler

        max_tokens = int(cfg.get("max_tokens", 256))
        want_logprobs = cfg.get("logprobs")
        seed = cfg.get("seed")
        if seed is not None:
            mx.random.seed(int(seed))
        sampler = make_sampler(
            temp=float(cfg.get("temperature", 0.0)),
            top_p=float(cfg.get("top_p", 1.0)) if cfg.get("top_p", 1.0) < 1.0 else 0.0,
            min_p=float(cfg.get("min_p", 0.0)),
            top_k=int(cfg.get("top_k", 0)),
        )
        penalty = float(cfg.get("repeat_penalty") or 0.0)
        processors = []
        bias = {int(k): float(v) for k, v in (cfg.get("logit_bias") or {}).items()}
        if bias:
            vocab = self.info.get("vocab_size") or 0
            bad = [k for k in bias if k < 0 or (vocab and k >= vocab)]
            if bad:
                raise BridgeError("bad_request", f"logit_bias: token id {bad[0]} is outside the vocabulary of {vocab}")
            dense = {}

            def add_bias(seen, logits):
                # First, like the CPU engine: the bias, then penalties and the guide.
                n = logits.shape[-1]
                if n not in dense:
                    v = np.zeros(n, dtype=np.float32)
                    for k, b in bias.items():
                        if k < n:
                            v[k] = b
                    dense[n] = mx.array(v)
                return logits + dense[n].astype(logits.dtype)

            processors.append(add_bias)
        if penalty > 0.0 and penalty != 1.0:
            # mlx-lm's processor sees only the tokens fed in this call; give it the
            # cached prefix too, so reuse does not change what is penalised.
            window = int(cfg.get("repeat_last_n", 64)) or 64
            (inner,) = make_logits_processors(repetition_penalty=penalty, repetition_context_size=window)
            prefix = mx.array(tokens[:keep]) if keep else None
            processors.append(lambda seen, logits: inner(seen if prefix is None else mx.concat([prefix, seen]), logits))
        presence = float(cfg.get("presence_penalty") or 0.0)
        frequency = float(cfg.get("frequency_penalty") or 0.0)
        if presence or frequency:
            # OpenAI's: over the tokens generated so far (what follows the fed
            # prompt), no window, as the CPU engine does.
            fed = len(tokens) - keep

            def penalize(seen, logits):
                generated = seen[fed:].tolist()
                if not generated:
                    return logits
                ids, counts = np.unique(np.array(generated), return_counts=True)
                delta = mx.array(presence + frequency * counts.astype(np.float32))
                ids = mx.array(ids)
                logits[..., ids] = logits[..., ids] - delta.astype(logits.dtype)
                return logits

            processors.append(penalize)
        if guide is not None:
            processors.append(guide)  # last: what it masks stays masked
        stop_ids = set(int(t) for t in cfg.get("stop_tokens", [])) | set(self.info["eos"])
        started = started or time.time()
        seen = list(tokens)
        cache.live = seen  # a peer may read the KV computed so far between two tokens
        try:
            finish, n, first = self.stream(rid, cache, tokens[keep:], max_tokens, sampler, processors, stop_ids,
                                           seen, guide, want_logprobs)
        finally:
            cache.live = None
        done = time.time()
        # The KV holds the prompt and the generated tokens fed back so far (mlx-lm
        # feeds each token one step ahead); a stop token or a cancelled step is cut.
        cache.tokens = seen[: cache.offset()]
        cache.keep(len(tokens) + n)
        if settle and len(cache.tokens) < len(tokens) + n:
            # A session keeps every generated token (not a stop token) resident:
            # feed what mlx-lm had not fed back yet.
            rest = seen[len(cache.tokens): len(tokens) + n]
            self.model(mx.array(rest)[None], cache=cache.layers)
            mx.eval([c.state for c in cache.layers])
            cache.tokens = seen[: len(tokens) + n]
        metrics = {
            "prompt_tokens": len(tokens),
            "cached_tokens": keep,
            "cache_tokens": len(cache.tokens),
            "generated_tokens": n,
            "prefill_us": int(((first or done) - started) * 1e6),
            "decode_us": int((done - (first or done)) * 1e6),
            "total_us": int((done - started) * 1e6),
            "peak_memory_bytes": int(mx.get_peak_memory()),
            "active_memory_bytes": int(mx.get_active_memory()),
        }
        if guide is not None and guide.error is not None:
            # Only a sampler that ignored the mask gets here; the caches are settled.
            raise BridgeError("backend_error", f"config.constraint ({guide.kind}): {guide.error}")
        return {"event": "done", "finish": finish, "metrics": metrics}

    def stream(self, rid, cache, feed, max_tokens, sampler, processors, stop_ids, seen, guide, want_logprobs):
        """The token loop of `run`: feeds `feed` (the prompt tokens the cache lacks),
        sends each token sampled and appends it to `seen`; returns (finish, tokens
        sent, when the first came). Between two tokens the KV exchange's waiting ops
        are answered."""
        import mlx.core as mx
        import mlx_lm

        first = None
        n = 0
        finish = "length"
        prompt = len(seen)
        for r in mlx_lm.stream_generate(
            self.model, self.tokenizer, mx.array(feed), max_tokens=max_tokens,
            sampler=sampler, logits_processors=processors or None, prompt_cache=cache.layers,
        ):
            seen.append(int(r.token))
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
            if guide is not None:
                # mlx-lm computes the next step before it yields this token, so the
                # guide has usually consumed it already; this catches up otherwise.
                guide.catch_up(seen[prompt:])
                if guide.error is not None:
                    break
            n += 1
            event = {"id": rid, "event": "token", "token": int(r.token), "text": r.text}
            if want_logprobs is not None:
                event["logprob"] = self.logprob_of(r, want_logprobs)
            send(event)
            if guide is not None and guide.stopped():
                finish = "stop"
                break
            self.serve_urgent()
        return finish, n, first

    def logprob_of(self, r, top):
        """The token's log-probability and the `top` most likely tokens, from
        mlx-lm's `logprobs` (the log-softmax after the logits processors: the same as
        the raw logits' unless the request has a bias, a penalty or a constraint)."""
        import mlx.core as mx

        lp = r.logprobs.astype(mx.float32)
        best = []
        if top > 0:
            order = mx.argsort(-lp)[:top].tolist()
            vals = lp[mx.array(order)].tolist()
            best = sorted(zip(order, vals), key=lambda p: (-p[1], p[0]))

        def raw(i):
            return list(self.tokenizer.decode([int(i)]).encode("utf-8", "surrogatepass"))

        return {
            "logprob": float(lp[int(r.token)].item()),
            "bytes": raw(r.token),
            "top": [{"id": int(i), "bytes": raw(i), "logprob": float(v)} for i, v in best],
        }

    def forward(self, tokens):
        """A fresh cache with `tokens` computed; returns (cache, last-position logits)."""
        import mlx.core as mx

        cache = Cache(self.model)
        logits = self.model(mx.array(tokens)[None], cache=cache.layers)[0, -1, :]
        mx.eval(logits)
        cache.tokens = list(tokens)
        return cache, logits

    def classify(self, req):
        import mlx.core as mx

        self.need_model()
        tokens = self.tokens_of(req)
        self.check_context(len(tokens), 0)
        _, logits = self.forward(tokens)
        token = int(mx.argmax(logits).item())
        out = {"event": "classified", "token": token, "text": self.tokenizer.decode([token])}
        if req.get("logits"):
            out["logits"] = f32_base64(logits)
        return out

    def embed(self, req):
        """Mean of the final hidden states (after the norm) over the tokens, L2-normalised:
        llama.cpp's `--pooling mean`, and the CPU engine's embeddings."""
        import mlx.core as mx

        self.need_model()
        if not self.info.get("embedding_dim"):
            raise BridgeError("unavailable", "this mlx-lm model exposes no hidden states")
        tokens = self.tokens_of(req)
        self.check_context(len(tokens), 0)
        hidden = self.model.model(mx.array(tokens)[None])[0].astype(mx.float32)
        mean = mx.mean(hidden, axis=0)
        norm = mx.sqrt(mx.sum(mean * mean))
        vector = mx.where(norm > 0, mean / norm, mean)
        mx.eval(vector)
        return {"event": "embedded", "embedding": f32_base64(vector), "tokens": len(tokens)}

    def inspect(self, req):
        self.need_model()
        tokens = self.tokens_of(req)
        self.check_context(len(tokens), 0)
        cache, _ = self.forward(tokens)
        n = len(tokens)
        keys = []
        for layer in cache.layers:
            k = getattr(layer, "keys", None)
            if k is None:
                raise BridgeError("backend_error", f"{type(layer).__name__} does not expose its keys")
            keys.append(f32_base64(k[0, :, :n, :]))  # [kv_heads, seq, head_dim]
        k0 = cache.layers[0].keys
        return {"event": "inspected", "num_layers": len(keys), "num_heads": int(k0.shape[1]),
                "seq_len": n, "head_dim": int(k0.shape[3]), "keys": keys}

    # The KV exchange (docs/kv-transfer.md). A block is KV_BLOCK positions: its keys
    # then its values, each [layer][kv_head][position][head_dim].

    def kv_layout(self, raw):
        """The exchange's layout of this model's prompt cache, learned from one token
        computed on a fresh cache; (None, why) when its KV cannot travel."""
        import mlx.core as mx
        import mlx_lm
        from mlx_lm.models.cache import KVCache

        cache = Cache(self.model)
        kinds = sorted({type(c).__name__ for c in cache.layers})
        if not cache.layers or kinds != ["KVCache"] or any(type(c) is not KVCache for c in cache.layers):
            return None, f"its prompt cache is {', '.join(kinds) or 'empty'}, not plain KVCache layers"
        self.model(mx.array([0])[None], cache=cache.layers)
        k0, v0 = cache.layers[0].keys, cache.layers[0].values
        mx.eval(k0, v0)
        dtype = str(k0.dtype).removeprefix("mlx.core.")
        if dtype not in KV_DTYPES or v0.dtype != k0.dtype or v0.shape[3] != k0.shape[3]:
            return None, f"keys {k0.dtype} {list(k0.shape)} and values {v0.dtype} {list(v0.shape)}"
        rope = raw.get("rope_theta", "")
        scaling = json.dumps(raw.get("rope_scaling"), sort_keys=True) if raw.get("rope_scaling") else "none"
        return {
            "dtype": KV_DTYPES[dtype][0],
            "layers": len(cache.layers),
            "kv_heads": int(k0.shape[1]),
            "head_dim": int(k0.shape[3]),
            "block_tokens": KV_BLOCK,
            "engine": f"mlx-{mx.__version__}/mlx_lm-{mlx_lm.__version__}/{'gpu' if 'gpu' in str(mx.default_device()) else 'cpu'}",
            "params": f"rope={rope},scaling={scaling}",
        }, None

    def kv_block_bytes(self):
        width = 4 if self.kv["dtype"] == "f32" else 2
        return 2 * self.kv["layers"] * self.kv["kv_heads"] * self.kv["head_dim"] * KV_BLOCK * width

    def need_kv(self):
        self.need_model()
        if self.kv is None:
            raise BridgeError("unavailable", f"this model's KV does not travel: {self.info.get('kv_why')}")

    def kv_caches(self, adapter):
        """The caches holding KV computed with `adapter` (None: the base model)."""
        out = []
        if self.shared is not None and self.shared_adapter == adapter:
            out.append(self.shared)
        if adapter is None:  # sessions run without one
            out.extend(self.sessions.values())
        return out

    def kv_expire(self):
        now = time.time()
        self.imported = [e for e in self.imported if now - e.at < KV_IMPORT_FOR]

    def kv_held(self, req):
        """How many leading tokens of `tokens` a generation would not compute: what the
        shared cache or a waiting import holds."""
        self.need_kv()
        tokens, adapter = [int(t) for t in req.get("tokens", [])], req.get("adapter")
        self.kv_expire()
        held = common_prefix(self.shared.held(), tokens) if self.shared_adapter == adapter else 0
        for e in self.imported:
            if e.adapter == adapter:
                held = max(held, common_prefix(e.held(), tokens))
        return {"event": "kv_held", "tokens": held}

    def kv_export(self, req):
        """Blocks `first_block..first_block + blocks` of the prefix `tokens`, from the
        cache that holds most of it (none: 0 blocks)."""
        import mlx.core as mx

        self.need_kv()
        tokens, adapter = [int(t) for t in req.get("tokens", [])], req.get("adapter")
        if req.get("tail"):
            return self.kv_export_tail(tokens, adapter)
        first, want = int(req.get("first_block", 0)), int(req.get("blocks", 0))
        best, held = None, 0
        for c in self.kv_caches(adapter):
            n = common_prefix(c.held(), tokens)
            if n > held:
                best, held = c, n
        held_blocks = held // KV_BLOCK
        count = max(0, min(want, held_blocks - first))
        if count == 0:
            return {"event": "kv", "blocks": 0, "held_blocks": held_blocks, "data": ""}
        lo, hi = first * KV_BLOCK, (first + count) * KV_BLOCK
        heads, dim = self.kv["kv_heads"], self.kv["head_dim"]

        def blocks_of(arrays):  # [layer][head][count * KV_BLOCK][dim] -> [count][layer][head][KV_BLOCK][dim]
            x = mx.stack([a[0, :, lo:hi, :] for a in arrays])
            return x.reshape(len(arrays), heads, count, KV_BLOCK, dim).transpose(2, 0, 1, 3, 4)

        kv = mx.stack([blocks_of([c.keys for c in best.layers]), blocks_of([c.values for c in best.layers])], axis=1)
        data = kv_bits(kv)
        return {"event": "kv", "blocks": count, "held_blocks": held_blocks,
                "data": base64.b64encode(data).decode("ascii")}

    def kv_export_tail(self, tokens, adapter):
        """The KV of `tokens` past its last whole block (fewer than a block), from a
        cache holding all of `tokens`; none ("data" empty) otherwise."""
        import mlx.core as mx

        lo, hi = len(tokens) // KV_BLOCK * KV_BLOCK, len(tokens)
        best = next((c for c in self.kv_caches(adapter) if common_prefix(c.held(), tokens) == hi), None)
        if best is None or lo == hi:
            return {"event": "kv", "blocks": 0, "held_blocks": 0, "tail": 0, "data": ""}
        kv = mx.stack([mx.stack([c.keys[0, :, lo:hi, :] for c in best.layers]),
                       mx.stack([c.values[0, :, lo:hi, :] for c in best.layers])])
        return {"event": "kv", "blocks": 0, "held_blocks": lo // KV_BLOCK, "tail": hi - lo,
                "data": base64.b64encode(kv_bits(kv)).decode("ascii")}

    def kv_import_tail(self, tokens, adapter, data):
        """Adds the KV of `tokens` past its last whole block to the waiting import of
        those blocks; whether one took it."""
        whole = len(tokens) // KV_BLOCK * KV_BLOCK
        width = self.kv_block_bytes() // KV_BLOCK
        if whole == len(tokens) or len(data) != (len(tokens) - whole) * width:
            raise BridgeError("bad_request", f"kv_import: {len(data)} bytes for a tail of "
                              f"{len(tokens) - whole} tokens ({width} bytes a token)")
        self.kv_expire()
        entry = next((e for e in self.imported if e.adapter == adapter and e.blocks * KV_BLOCK == whole
                      and e.tokens[:whole] == tokens[:whole]), None)
        if entry is None:
            return {"event": "kv_imported", "held_blocks": 0, "taken": False}
        entry.tail, entry.tail_data = tokens[whole:], data
        return {"event": "kv_imported", "held_blocks": entry.blocks, "taken": True}

    def kv_import(self, req):
        """Keeps blocks a peer computed for the prefix `tokens` until a generation over
        it; returns the leading blocks of the prefix held for it now."""
        self.need_kv()
        tokens, adapter = [int(t) for t in req.get("tokens", [])], req.get("adapter")
        first, count = int(req.get("first_block", 0)), int(req.get("blocks", 0))
        try:
            data = base64.b64decode(req.get("data", ""), validate=True)
        except ValueError as e:
            raise BridgeError("bad_request", f"kv_import: bad base64: {e}")
        if req.get("tail"):
            return self.kv_import_tail(tokens, adapter, data)
        if len(data) != count * self.kv_block_bytes() or (first + count) * KV_BLOCK > len(tokens):
            raise BridgeError("bad_request", f"kv_import: {len(data)} bytes for blocks {first}..{first + count} "
                              f"of a {len(tokens)}-token prefix ({self.kv_block_bytes()} bytes a block)")
        self.kv_expire()
        entry = next((e for e in self.imported if e.tokens == tokens and e.adapter == adapter), None)
        if entry is None:
            entry = Imported(tokens, adapter)
            if first > 0:
                # The puller holds the first blocks already: copy them from its cache.
                req = {"tokens": tokens[: first * KV_BLOCK], "adapter": adapter, "first_block": 0, "blocks": first}
                have = self.kv_export(req)
                if have["blocks"] != first:
                    raise BridgeError("bad_request", f"kv_import: block {first} of a prefix whose first blocks "
                                      "are not held here")
                entry.parts.append(base64.b64decode(have["data"]))
                entry.blocks = first
            if len(self.imported) >= KV_MAX_IMPORTS:
                self.imported.pop(0)
            self.imported.append(entry)
        if first != entry.blocks:
            raise BridgeError("bad_request", f"kv_import: block {first} after {entry.blocks} blocks")
        entry.parts.append(data)
        entry.blocks += count
        entry.at = time.time()
        while sum(e.nbytes() for e in self.imported) > KV_MAX_IMPORT_BYTES and self.imported:
            dropped = self.imported.pop(0)  # the oldest first, this one too if it alone is over
            if dropped is entry:
                raise BridgeError("overloaded", f"pulled KV waiting here is over {KV_MAX_IMPORT_BYTES >> 20} MiB")
        return {"event": "kv_imported", "held_blocks": entry.blocks}

    def claim_import(self, tokens, adapter, have):
        """The cache of the waiting import that holds more of `tokens` than `have`
        (leading tokens), and the most (None: none does); it is taken off the list."""
        import mlx.core as mx

        self.kv_expire()
        best, most = None, have
        for e in self.imported:
            n = common_prefix(e.held(), tokens)
            if e.adapter == adapter and n == len(e.held()) and n > most:
                best, most = e, n
        if best is None:
            return None
        self.imported.remove(best)
        layers, heads, dim = self.kv["layers"], self.kv["kv_heads"], self.kv["head_dim"]
        dtype = {"f16": mx.float16, "bf16": mx.bfloat16, "f32": mx.float32}[self.kv["dtype"]]
        n, t = best.blocks, len(best.tail)
        x = kv_array(b"".join(best.parts), (n, 2, layers, heads, KV_BLOCK, dim), dtype)
        y = kv_array(best.tail_data, (2, layers, heads, t, dim), dtype) if t else None
        cache = Cache(self.model)
        for i, layer in enumerate(cache.layers):
            # [block][layer][head][position][dim] -> [1][head][block * position][dim]
            k = x[:, 0, i].transpose(1, 0, 2, 3).reshape(1, heads, n * KV_BLOCK, dim)
            v = x[:, 1, i].transpose(1, 0, 2, 3).reshape(1, heads, n * KV_BLOCK, dim)
            if y is not None:
                k = mx.concatenate([k, y[0, i][None]], axis=2)
                v = mx.concatenate([v, y[1, i][None]], axis=2)
            layer.keys, layer.values, layer.offset = k, v, n * KV_BLOCK + t
        mx.eval([c.keys for c in cache.layers] + [c.values for c in cache.layers])
        cache.tokens = best.held()
        return cache

    def serve_urgent(self):
        """Answers the KV exchange's ops waiting (between two tokens, or idle)."""
        while True:
            try:
                req = self.urgent.get_nowait()
            except queue.Empty:
                return
            rid = req.get("id")
            try:
                send({"id": rid, **self.urgent_op(req)})
            except BridgeError as e:
                send({"id": rid, "event": "error", "code": e.code, "message": e.message, **e.extra})
            except Exception as e:
                log(traceback.format_exc())
                send({"id": rid, "event": "error", "code": "backend_error", "message": f"{type(e).__name__}: {e}"})

    def urgent_op(self, req):
        op = req.get("op")
        if op == "render":
            self.need_model()
            rendered, tokens = self.rendered(req)
            return {"event": "rendered", "rendered": rendered, "tokens": tokens}
        if op == "kv_held":
            return self.kv_held(req)
        if op == "kv_export":
            return self.kv_export(req)
        return self.kv_import(req)

    def session_open(self):
        self.need_model()
        if len(self.sessions) >= self.max_sessions:
            raise BridgeError("overloaded", f"all {self.max_sessions} MLX session caches are in use")
        sid = f"s{self.next_session}"
        self.next_session += 1
        self.sessions[sid] = Cache(self.model)
        return {"event": "session", "session": sid}

    def set_resident(self, req):
        import mlx.core as mx

        s = self.session(req)
        sid = req.get("session")
        target = [int(t) for t in req.get("tokens", [])]
        if not target:
            raise BridgeError("bad_request", "empty prompt")
        self.check_context(len(target), 0)
        had = len(s.tokens)
        keep = 0 if req.get("invalidate") else common_prefix(s.tokens, target)
        if self.imported and not req.get("invalidate"):
            # KV pulled for this session (one moving here from a draining peer).
            claimed = self.claim_import(target, None, keep)
            if claimed is not None:
                s = self.sessions[sid] = claimed
                keep = len(claimed.tokens)
        kept = s.keep(keep)
        if kept is None:  # a cache that cannot be trimmed starts again
            s = self.sessions[sid] = Cache(self.model)
            kept = 0
        if kept < len(target):
            self.model(mx.array(target[kept:])[None], cache=s.layers)
            mx.eval([c.state for c in s.layers])
        s.tokens = list(target)
        return {"event": "resident", "reused": kept, "computed": len(target) - kept, "dropped": had - kept}


# Ops a running generation answers between two tokens (Bridge.serve_urgent).
URGENT_OPS = ("render", "kv_held", "kv_export", "kv_import")


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
            if req.get("op") in URGENT_OPS:
                bridge.urgent.put(req)
                req = {"op": "urgent", "id": None}  # wakes an idle main loop
            work.put(req)
        work.put({"op": "quit", "id": None})

    threading.Thread(target=reader, daemon=True).start()
    send({"id": None, "event": "ready"})
    while True:
        req = work.get()
        rid, op = req.get("id"), req.get("op")
        bridge.serve_urgent()
        if op == "urgent":
            continue
        try:
            if op == "quit":
                send({"id": rid, "event": "bye"})
                return
            elif op == "load":
                out = bridge.load(req)
            elif op == "info":
                out = {"event": "info", "info": bridge.info}
            elif op == "generate":
                adapter = req.get("adapter")
                if adapter is not None and adapter not in bridge.adapters:
                    raise BridgeError("bad_request", f"no LoRA adapter {adapter!r} is loaded")
                ACTIVE[0] = adapter
                out = bridge.generate(rid, req)
            elif op == "load_adapter":
                bridge.need_model()
                name = req.get("name", "")
                n = load_peft(bridge.model, name, req.get("path", ""), float(req.get("scale", 1.0)))
                bridge.adapters.add(name)
                # A replaced adapter's KV is stale.
                bridge.shared = Cache(bridge.model)
                bridge.shared_adapter = None
                out = {"event": "adapter", "name": name, "projections": n}
            elif op == "unload_adapter":
                name = req.get("name", "")
                if not unload_lora(bridge.model, name) and name not in bridge.adapters:
                    raise BridgeError("bad_request", f"no LoRA adapter {name!r} is loaded")
                bridge.adapters.discard(name)
                out = {"event": "adapter", "name": name}
            elif op == "decode":
                out = bridge.decode(rid, req)
            elif op == "classify":
                out = bridge.classify(req)
            elif op == "inspect":
                out = bridge.inspect(req)
            elif op == "embed":
                out = bridge.embed(req)
            elif op == "tokenize":
                bridge.need_model()
                out = {"event": "tokens", "tokens": bridge.encode(req.get("text", ""), bool(req.get("bos")))}
            elif op == "session_open":
                out = bridge.session_open()
            elif op == "set_resident":
                out = bridge.set_resident(req)
            elif op == "resident":
                out = {"event": "tokens", "tokens": bridge.session(req).tokens}
            elif op == "session_close":
                bridge.sessions.pop(req.get("session"), None)
                out = {"event": "closed"}
            else:
                raise BridgeError("bad_request", f"unknown op {op!r}")
            send({"id": rid, **out})
        except BridgeError as e:
            send({"id": rid, "event": "error", "code": e.code, "message": e.message, **e.extra})
        except Exception as e:  # a bug or an MLX failure: this request fails, the bridge lives
            log(traceback.format_exc())
            send({"id": rid, "event": "error", "code": "backend_error", "message": f"{type(e).__name__}: {e}"})
        finally:
            ACTIVE[0] = None
            with bridge.lock:
                bridge.cancelled.discard(rid)


if __name__ == "__main__":
    main()
