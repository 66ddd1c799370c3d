#!/usr/bin/env bash
# The whole test suite: installs what the tests need (nats-server, the demo model,
# the Python client's packages, and llama.cpp's llama-server as the reference — all
# cached in ~/.cache/switchyard) and runs every test.
# SWITCHYARD_SKIP_LLAMA=1 skips the llama.cpp reference (its tests say so).
set -euo pipefail
cd "$(dirname "$0")/.."
eval "$(bash scripts/setup.sh | sed 's/^/export /')"
if [ -z "${SWITCHYARD_SKIP_LLAMA:-}" ] && [ -z "${SWITCHYARD_LLAMA_SERVER:-}" ]; then
  SWITCHYARD_LLAMA_SERVER=$(bash scripts/build-llama-server.sh)
  export SWITCHYARD_LLAMA_SERVER
fi
cargo test --workspace --all-targets "$@"
