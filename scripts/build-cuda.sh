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
#   candle-<version>-dynamic-loading/
#              candle-core and candle-kernels copied from cargo's registry with one
#              change each, so the binary links no NVIDIA library and starts on any
#              Linux box (below); the driver and cuBLAS/cuRAND are loaded when the CUDA
#              engine first runs (docs/cuda.md says which binary to ship where).
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

# --- candle, made to load CUDA at run time ------------------------------------------------
# candle-core turns on cudarc's `dynamic-linking` (the binary then needs libcuda.so.1 and
# the CUDA libraries to start at all) and candle-kernels links libcudart dynamically. For
# one binary that starts on every box, both are built from copies of their crates.io
# sources with one change each: cudarc's `dynamic-loading` (it dlopens the driver and the
# libraries when first used) and the static libcudart (which dlopens the driver itself,
# at first use). Cargo builds them in their place through [patch.crates-io] (--config),
# which rewrites Cargo.lock; the committed one is put back when the script ends.
read -r CANDLE_VERSION CANDLE_CORE_DIR CANDLE_KERNELS_DIR < <(cargo metadata --format-version 1 --locked --features cuda | python3 -c '
import json, os, sys
found = {p["name"]: p for p in json.load(sys.stdin)["packages"] if p["name"] in ("candle-core", "candle-kernels")}
core, kernels = found["candle-core"], found["candle-kernels"]
print(core["version"], os.path.dirname(core["manifest_path"]), os.path.dirname(kernels["manifest_path"]))
') || { say "candle-core or candle-kernels is not in the workspace's dependencies (cargo metadata)"; exit 1; }
PATCHED="$BASE/candle-$CANDLE_VERSION-dynamic-loading"
if [ -f "$PATCHED/.complete" ]; then
  say "candle $CANDLE_VERSION for run-time loading: cached at $PATCHED"
else
  say "candle $CANDLE_VERSION for run-time loading: copying candle-core and candle-kernels into $PATCHED"
  rm -rf "$PATCHED.part" && mkdir -p "$PATCHED.part"
  cp -r "$CANDLE_CORE_DIR" "$PATCHED.part/candle-core"
  cp -r "$CANDLE_KERNELS_DIR" "$PATCHED.part/candle-kernels"
  manifest="$PATCHED.part/candle-core/Cargo.toml"
  grep -q '"dynamic-linking",' "$manifest" || { say "candle-core's Cargo.toml no longer names cudarc's dynamic-linking"; exit 1; }
  sed -i 's/"dynamic-linking",/"dynamic-loading",/' "$manifest"
  build_rs="$PATCHED.part/candle-kernels/build.rs"
  grep -q 'rustc-link-lib=dylib=cudart' "$build_rs" || { say "candle-kernels' build.rs no longer links cudart"; exit 1; }
  sed -i 's|println!("cargo:rustc-link-lib=dylib=cudart");|if let Ok(root) = env::var("CUDA_HOME") { println!("cargo:rustc-link-search=native={root}/lib"); } println!("cargo:rustc-link-lib=static=cudart_static"); println!("cargo:rustc-link-lib=dylib=dl"); println!("cargo:rustc-link-lib=dylib=rt"); println!("cargo:rustc-link-lib=dylib=pthread");|' "$build_rs"
  touch "$PATCHED.part/.complete"
  rm -rf "$PATCHED" && mv "$PATCHED.part" "$PATCHED"
fi
patch_args=(--config "patch.crates-io.candle-core.path=\"$PATCHED/candle-core\""
  --config "patch.crates-io.candle-kernels.path=\"$PATCHED/candle-kernels\"")
lock_backup=$(mktemp)
cp Cargo.lock "$lock_backup"
trap 'cp "$lock_backup" Cargo.lock; rm -f "$lock_backup"' EXIT

# --- cargo ---------------------------------------------------------------------------------
# cudarc asks `nvcc --version` for the CUDA version (the bindings it compiles in);
# candle-kernels runs the first nvcc on PATH for CUDA_COMPUTE_CAP and, patched, finds
# libcudart_static.a under CUDA_HOME/lib.
unset CUDA_PATH CUDNN_LIB NVCC CUDA_TOOLKIT_ROOT_DIR
export CUDA_HOME="$CUDA_ROOT" CUDA_ROOT="$CUDA_ROOT"
export CUDA_COMPUTE_CAP="$cap" PATH="$CUDA_ROOT/bin:$PATH"
# candle-kernels' builder (cudaforge) runs nvcc on half the cores by default: one at a
# time on a 2-core CI host, where the kernels are most of a cold build.
export CUDAFORGE_THREADS="${CUDAFORGE_THREADS:-$(nproc)}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target/cuda}"

# A binary that names an NVIDIA library as NEEDED does not start without it.
no_nvidia_needed() {
  local needed
  needed=$(readelf -d "$1" | grep NEEDED | grep -oE 'lib(cuda|cudart|cublas|cublasLt|curand|nvrtc)\.so[.0-9]*' | tr '\n' ' ' || true)
  [ -z "$needed" ] || { say "$1 links $needed: it would not start without them"; exit 1; }
}

if [ "$check" = 1 ]; then
  # Unoptimised and without debug info, for both commands: the build generates code in a
  # fraction of the dev profile's time (it has opt-level 3), and with these settings it
  # reuses clippy's run of candle-kernels' build script, so nvcc compiles the kernels once
  # (with the dev profile's own settings the build ran them again: 14 minutes, not 1.5).
  lean=(--config 'profile.dev.package."*".opt-level=0'
    --config 'profile.dev.package.switchyard-workers.opt-level=0' --config 'profile.dev.debug=false')
  say "cargo clippy --features cuda --all-targets -D warnings (compute capability $cap, into $CARGO_TARGET_DIR)"
  cargo clippy --workspace --all-targets --features cuda "${patch_args[@]}" "${lean[@]}" "${cargo_args[@]}" -- -D warnings >&2
  say "cargo build --features cuda --bin switchyard (unoptimised: the link)"
  cargo build --features cuda "${patch_args[@]}" "${lean[@]}" --bin switchyard >&2
  bin="$CARGO_TARGET_DIR/debug/switchyard"
  no_nvidia_needed "$bin"
  "$bin" --help >/dev/null || { say "$bin --help failed"; exit 1; }
  # Where there is no GPU (CI), a cuda worker refuses at start: exit 1, the reason, no panic.
  if [ ! -e /dev/nvidiactl ]; then
    if out=$(timeout 60 "$bin" worker --backend cuda --cuda-engine native --model /nonexistent.gguf \
        --nats nats://127.0.0.1:1 2>&1); then
      say "a cuda worker started without a GPU"; exit 1
    fi
    if ! grep -q 'cuda: no /dev/nvidiactl' <<<"$out" || grep -qi 'panicked' <<<"$out"; then
      say "a cuda worker without a GPU did not refuse clearly: $out"; exit 1
    fi
  fi
  say "clippy clean and linked with --features cuda; the binary starts without NVIDIA libraries, and a cuda worker refuses without a GPU"
  exit 0
fi

say "cargo build --release --features cuda ${cargo_args[*]} (compute capability $cap, into $CARGO_TARGET_DIR)"
cargo build --release --features cuda "${patch_args[@]}" "${cargo_args[@]}" >&2
bin="$CARGO_TARGET_DIR/release/switchyard"
[ -x "$bin" ] || { say "no $bin after the build"; exit 1; }
no_nvidia_needed "$bin"
say "built $bin: it starts anywhere; the CUDA engine needs, when it first runs, libcuda.so.1 (an" \
  "R580+ driver) and libcublas.so.13, libcublasLt.so.13, libcurand.so.10 (a CUDA 13.x toolkit or pip's" \
  "nvidia-cublas/-curand) on the loader's path: docs/cuda.md"
echo "$bin"
