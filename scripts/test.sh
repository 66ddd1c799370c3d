#!/usr/bin/env bash
# The whole test suite: installs what the tests need (nats-server, the demo model,
# the Python client's packages; cached in ~/.cache/switchyard) and runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."
eval "$(bash scripts/setup.sh | sed 's/^/export /')"
cargo test --workspace --all-targets "$@"
