#!/usr/bin/env bash
# Random-weight GGUFs with the exact layer shapes of the models people run, for
# `switchyard bench llama`: Qwen2.5-0.5B, -1.5B and -3B (tied embeddings, SmolLM2's
# vocabulary), written as F16 by scripts/make-random-qwen-gguf.py and quantized by
# llama.cpp's own llama-quantize (built from the same source as the reference
# llama-server, scripts/build-llama-server.sh quantize). Usage:
#
#   scripts/make-sized-models.sh [SHAPE ...]        (default: qwen2.5-0.5b qwen2.5-1.5b)
#
# SHAPE: qwen2.5-0.5b | qwen2.5-1.5b | qwen2.5-3b. $QUANTS picks the types (default:
# Q4_0 Q4_1 Q4_K_M Q5_K_M Q6_K Q8_0). Files land in
# $SWITCHYARD_CACHE/models/sized/random-SHAPE-QUANT.gguf and are reused when present
# (the F16 source is deleted once every type is made). Prints one path per model made
# or found, in order; progress goes to stderr. Random weights make meaningless text
# but honest timings: the bench runs a fixed number of tokens with end-of-generation
# ignored.
set -euo pipefail

CACHE="${SWITCHYARD_CACHE:-$HOME/.cache/switchyard}"
OUT="$CACHE/models/sized"
HERE="$(cd "$(dirname "$0")" && pwd)"
QUANTS="${QUANTS:-Q4_0 Q4_1 Q4_K_M Q5_K_M Q6_K Q8_0}"
say() { printf '[sized-models] %s\n' "$*" >&2; }

[ $# -eq 0 ] && set -- qwen2.5-0.5b qwen2.5-1.5b
for shape in "$@"; do
  case "$shape" in
    qwen2.5-0.5b | qwen2.5-1.5b | qwen2.5-3b) ;;
    *) say "unknown shape '$shape' (qwen2.5-0.5b | qwen2.5-1.5b | qwen2.5-3b)"; exit 2 ;;
  esac
done

mkdir -p "$OUT"
env_of() { bash "$HERE/setup.sh" 2>/dev/null | sed -n "s/^$1=//p"; }
PY="${SWITCHYARD_PYTHON:-$(env_of SWITCHYARD_PYTHON)}"
VOCAB="${SWITCHYARD_DEMO_MODEL:-$(env_of SWITCHYARD_DEMO_MODEL)}"
[ -x "$PY" ] && [ -f "$VOCAB" ] || { say "scripts/setup.sh did not give a Python with gguf and the demo model"; exit 1; }
QUANTIZE=""

for shape in "$@"; do
  f16="$OUT/random-$shape-F16.gguf"
  for q in $QUANTS; do
    out="$OUT/random-$shape-$q.gguf"
    if [ ! -f "$out" ]; then
      [ -n "$QUANTIZE" ] || QUANTIZE=$(bash "$HERE/build-llama-server.sh" quantize)
      if [ ! -f "$f16" ]; then
        say "$shape: writing random F16 weights (a minute or two per billion)"
        "$PY" "$HERE/make-random-qwen-gguf.py" "$VOCAB" "$f16.part" qwen2 1234 f16 "$shape" >/dev/null
        mv "$f16.part" "$f16"
      fi
      say "$shape: llama-quantize to $q"
      "$QUANTIZE" "$f16" "$out.part" "$q" "$(nproc)" >/dev/null 2>"$OUT/quantize.log" || {
        tail -5 "$OUT/quantize.log" >&2; exit 1; }
      mv "$out.part" "$out"
    fi
    echo "$out"
  done
  rm -f "$f16"
done
