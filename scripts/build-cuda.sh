#!/usr/bin/env bash
# Builds switchyard with `--features cuda` (candle's CUDA device on cudarc) on a machine
# without a CUDA toolkit, a GPU or an NVIDIA driver, using NVIDIA's compiler from PyPI
# wheels, and caches the toolkit outside the clone. Usage:
#
#   scripts/build-cuda.sh [--compute-cap N] [CARGO_ARGS ...]   cargo build --release --features cuda
#   scripts/build-cuda.sh [--compute-cap N] --check [CLIPPY_ARGS ...]
#       CI: cargo clippy --all-targets --features cuda -D warnings, then an unoptimised
#       cargo build --features cuda --bin switchyard (the link)
#
# --compute-cap N (else $CUDA_COMPUTE_CAP, else 90 = H100/H200) is the GPU generation the
# kernels are compiled for. candle-kernels compiles most kernels to PTX, which the driver
# JIT-compiles when the binary first loads them, and its quantized matmul kernels to
# machine code (SASS) in a static library; for 90 and above candle's build picks the
# arch-specific target (sm_90a), so a build for 90 runs on compute capability 9.0 GPUs
# only. PTX from CUDA 13.0 needs a driver that supports CUDA 13.0 (R580 or newer).
#
# What it sets up in $SWITCHYARD_CACHE/cuda/<nvcc version>/ (reused when present):
#   toolkit/   the wheels nvidia-cuda-nvcc, -cuda-crt, -nvvm, -cuda-runtime, -cuda-cccl
#              (pinned, about 105 MB downloaded, 270 MB unpacked), installed with
#              `pip install --target`; toolkit/nvidia/cu13 is a CUDA root: bin/nvcc (which
#              accepts gcc 12), nvvm/bin/cicc, include/, lib/libcudart.so.13.
#   stubs-cudarc-<version>/lib/
#              link stubs: libcuda.so (SONAME libcuda.so.1), libcublas.so (.13),
#              libcublasLt.so (.13), libcurand.so (.10), libnvrtc.so (.13). cudarc links
#              these dynamically; the real ones are the driver (in no wheel) and about
#              850 MB of math libraries we never run here. Each stub defines, as empty
#              functions, every symbol cudarc's bindings declare for that library (read
#              from cudarc's src/*/sys/mod.rs), which is what NVIDIA's own lib64/stubs are:
#              the binary records the SONAME, and on the GPU box the loader binds it to the
#              real library. libcudart is the real one from the runtime wheel.
#
# Pinned to CUDA 13.0 on purpose: 12.x wheels carry no nvcc, cudarc 0.19 knows CUDA up to
# 13.4, and PTX from the oldest 13.x runs on the widest range of drivers.
#
# The build goes to target/cuda ($CARGO_TARGET_DIR overrides), apart from the default
# build. Progress goes to stderr; prints the built binary's path on stdout (with --check:
# nothing). Needs python3 with pip, gcc and cargo; reaches only PyPI and crates.io.
set -euo pipefail
cd "$(dirname "$0")/.."

CACHE="${SWITCHYARD_CACHE:-$HOME/.cache/switchyard}"
NVCC_VERSION=13.0.88
WHEELS=(
  "nvidia-cuda-nvcc==$NVCC_VERSION"
  "nvidia-cuda-crt==$NVCC_VERSION"
  "nvidia-nvvm==$NVCC_VERSION"
  "nvidia-cuda-runtime==13.0.96"
  "nvidia-cuda-cccl==13.0.85"
)
# library (as cudarc links it) : its SONAME : cudarc's bindings for it
STUBS=(
  "cuda:libcuda.so.1:driver"
  "cublas:libcublas.so.13:cublas"
  "cublasLt:libcublasLt.so.13:cublaslt"
  "curand:libcurand.so.10:curand"
  "nvrtc:libnvrtc.so.13:nvrtc"
)
BASE="$CACHE/cuda/$NVCC_VERSION"
say() { printf '[build-cuda] %s\n' "$*" >&2; }

cap="${CUDA_COMPUTE_CAP:-90}"
check=0
cargo_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --compute-cap) [ $# -ge 2 ] || { say "--compute-cap needs a value"; exit 2; }; cap="$2"; shift 2 ;;
    --compute-cap=*) cap="${1#*=}"; shift ;;
    --check) check=1; shift ;;
    *) cargo_args+=("$1"); shift ;;
  esac
done
cap="${cap//./}" # 9.0 -> 90
if ! [[ "$cap" =~ ^[0-9]{2,3}[af]?$ ]]; then
  say "bad compute capability '$cap' (e.g. 80, 89, 90, 100)"; exit 2
fi

# --- the toolkit wheels ----------------------------------------------------------------
TOOLKIT="$BASE/toolkit"
CUDA_ROOT="$TOOLKIT/nvidia/cu13"
if [ -f "$TOOLKIT/.complete" ]; then
  say "nvcc $NVCC_VERSION: cached at $CUDA_ROOT"
else
  PY=$(command -v python3 || command -v python)
  say "nvcc $NVCC_VERSION: installing the wheels (about 105 MB) into $TOOLKIT"
  mkdir -p "$BASE"
  rm -rf "$TOOLKIT" "$TOOLKIT.part"
  PIP_ROOT_USER_ACTION=ignore "$PY" -m pip install -q --disable-pip-version-check --no-deps --only-binary :all: \
    --target "$TOOLKIT.part" "${WHEELS[@]}" >&2
  # nvcc finds cicc, the headers and libraries relative to itself (bin/nvcc.profile).
  ln -s libcudart.so.13 "$TOOLKIT.part/nvidia/cu13/lib/libcudart.so"
  ln -s lib "$TOOLKIT.part/nvidia/cu13/lib64"
  touch "$TOOLKIT.part/.complete"
  mv "$TOOLKIT.part" "$TOOLKIT"
fi
"$CUDA_ROOT/bin/nvcc" --version | grep -q "release 13.0" || { say "$CUDA_ROOT/bin/nvcc does not run"; exit 1; }

# --- link stubs for the libraries cudarc links -------------------------------------------
# cudarc's sources, where this workspace's lockfile resolves them.
read -r CUDARC_VERSION CUDARC_DIR < <(cargo metadata --format-version 1 --locked --features cuda | python3 -c '
import json, os, sys
for p in json.load(sys.stdin)["packages"]:
    if p["name"] == "cudarc":
        print(p["version"], os.path.dirname(p["manifest_path"]))
        break
') || { say "cudarc is not in the workspace's dependencies (cargo metadata)"; exit 1; }
STUB_ROOT="$BASE/stubs-cudarc-$CUDARC_VERSION"
if [ -f "$STUB_ROOT/.complete" ]; then
  say "link stubs: cached at $STUB_ROOT/lib"
else
  say "link stubs: generating from cudarc $CUDARC_VERSION's bindings"
  rm -rf "$STUB_ROOT.part" && mkdir -p "$STUB_ROOT.part/lib"
  for entry in "${STUBS[@]}"; do
    IFS=: read -r lib soname bindings <<<"$entry"
    src="$STUB_ROOT.part/lib/$lib.c"
    # Every `fn name(` declared inside an `extern "C" {` block of the bindings.
    {
      echo "/* Link stub for $soname: cudarc $CUDARC_VERSION's $bindings bindings. Never run. */"
      awk '/extern "C" \{/ { inside = 1; next }
           inside && /^[[:space:]]*\}/ { inside = 0 }
           inside && match($0, /fn [A-Za-z_][A-Za-z0-9_]*\(/) { print substr($0, RSTART + 3, RLENGTH - 4) }' \
        "$CUDARC_DIR/src/$bindings/sys/mod.rs" | LC_ALL=C sort -u | sed 's/.*/void &(void) {}/'
    } >"$src"
    n=$(grep -c '^void' "$src")
    [ "$n" -gt 0 ] || { say "no symbols found for $lib in $CUDARC_DIR/src/$bindings/sys/mod.rs"; exit 1; }
    gcc -shared -fPIC -nostdlib -Wl,-soname,"$soname" -o "$STUB_ROOT.part/lib/lib$lib.so" "$src"
    say "  lib$lib.so ($soname): $n symbols"
  done
  touch "$STUB_ROOT.part/.complete"
  rm -rf "$STUB_ROOT" && mv "$STUB_ROOT.part" "$STUB_ROOT"
fi

# --- cargo ---------------------------------------------------------------------------------
# cudarc asks `nvcc --version` for the CUDA version and adds <root>/lib (and lib64,
# lib/stubs, ...) to the link search for each root named by CUDA_HOME, CUDA_PATH,
# CUDA_ROOT, CUDA_TOOLKIT_ROOT_DIR, CUDNN_LIB (and only those when any is set): the
# toolkit (libcudart) and the stubs. candle-kernels runs the first nvcc on PATH for
# CUDA_COMPUTE_CAP.
unset CUDA_PATH CUDNN_LIB NVCC
export CUDA_HOME="$CUDA_ROOT" CUDA_ROOT="$CUDA_ROOT" CUDA_TOOLKIT_ROOT_DIR="$STUB_ROOT"
export CUDA_COMPUTE_CAP="$cap" PATH="$CUDA_ROOT/bin:$PATH"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target/cuda}"

if [ "$check" = 1 ]; then
  # Unoptimised and without debug info, for both commands: the build generates code in a
  # fraction of the dev profile's time (it has opt-level 3), and with these settings it
  # reuses clippy's run of candle-kernels' build script, so nvcc compiles the kernels once
  # (with the dev profile's own settings the build ran them again: 14 minutes, not 1.5).
  lean=(--config 'profile.dev.package."*".opt-level=0'
    --config 'profile.dev.package.switchyard-workers.opt-level=0' --config 'profile.dev.debug=false')
  say "cargo clippy --features cuda --all-targets -D warnings (compute capability $cap, into $CARGO_TARGET_DIR)"
  cargo clippy --workspace --all-targets --features cuda --locked "${lean[@]}" "${cargo_args[@]}" -- -D warnings >&2
  say "cargo build --features cuda --bin switchyard (unoptimised: the link against the stubs)"
  cargo build --features cuda --locked "${lean[@]}" --bin switchyard >&2
  say "clippy clean and linked with --features cuda"
  exit 0
fi

say "cargo build --release --features cuda ${cargo_args[*]} (compute capability $cap, into $CARGO_TARGET_DIR)"
cargo build --release --features cuda --locked "${cargo_args[@]}" >&2
bin="$CARGO_TARGET_DIR/release/switchyard"
[ -x "$bin" ] || { say "no $bin after the build"; exit 1; }
needed=$(readelf -d "$bin" 2>/dev/null | grep -oE 'lib(cuda|cudart|cublas|cublasLt|curand|nvrtc)\.so\.[0-9]+' | tr '\n' ' ' || true)
say "built $bin; on the GPU box it needs ${needed:-libcuda.so.1 and CUDA 13 libraries }(libcuda from" \
  "an R580+ driver, the rest from a CUDA 13.x toolkit: docs/cuda.md)"
echo "$bin"
