#!/usr/bin/env bash
# The whole test suite: installs what the tests need (nats-server, the demo model, the
# Python client's packages, and llama.cpp's llama-server as the reference — all cached
# in ~/.cache/switchyard) and runs every test binary to the end (--no-fail-fast), then
# prints a summary of what failed.
#
# Two llama-server builds serve as references on x86-64:
#   SWITCHYARD_LLAMA_SERVER         the AVX2 build: the exact reference. switchyard's CPU
#                                   engine computes ggml's AVX2 arithmetic with every
#                                   kernel variant, so it is checked exactly on any host.
#   SWITCHYARD_LLAMA_SERVER_NATIVE  the -march=native build, only where this CPU has more
#                                   than AVX2 (AVX-512, AVX-VNNI): checked by the
#                                   tolerance rules (ggml itself changes near ties there).
# SWITCHYARD_SKIP_LLAMA=1 skips the llama.cpp reference (its tests say so).
# Skipped tests are listed in the summary with their reasons (switchyard-testkit's `skip`
# writes them to $SWITCHYARD_SKIP_LOG). A "Fixable" skip — a tool scripts/setup.sh
# installs, root for namespaces or mounts — fails the run when SWITCHYARD_STRICT_SKIPS
# is set, as .ci/run sets it on a Linux root machine; "Expected" ones (a GPU present, a
# CPU feature, SWITCHYARD_SKIP_* set) never do.
# Extra arguments go to `cargo test`.
set -uo pipefail
cd "$(dirname "$0")/.."
# Its status is setup's own (an eval's would be that of the text it runs): a failed
# setup stops here, naming itself, not later as unrelated test failures.
setup_env=$(bash scripts/setup.sh) || { echo "[test] scripts/setup.sh failed (its last step is above); the tests were not run" >&2; exit 1; }
eval "$(printf '%s\n' "$setup_env" | sed 's/^/export /')"

if [ -z "${SWITCHYARD_SKIP_LLAMA:-}" ] && [ -z "${SWITCHYARD_LLAMA_SERVER:-}" ]; then
  variants=(native)
  if [ "$(uname -m)" = x86_64 ] && grep -qw avx2 /proc/cpuinfo; then
    variants=(avx2)
    grep -qwE 'avx512_vnni|avx_vnni' /proc/cpuinfo && variants+=(native)
  fi
  mapfile -t bins < <(bash scripts/build-llama-server.sh "${variants[@]}") \
    && [ ${#bins[@]} -eq ${#variants[@]} ] || { echo "scripts/build-llama-server.sh failed" >&2; exit 1; }
  export SWITCHYARD_LLAMA_SERVER="${bins[0]}"
  [ ${#bins[@]} -gt 1 ] && export SWITCHYARD_LLAMA_SERVER_NATIVE="${bins[1]}"
fi
echo "[test] cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs);" \
  "reference llama-server: ${SWITCHYARD_LLAMA_SERVER:-none}; native: ${SWITCHYARD_LLAMA_SERVER_NATIVE:-none}" >&2

log=$(mktemp)
SWITCHYARD_SKIP_LOG=$(mktemp)
export SWITCHYARD_SKIP_LOG
trap 'rm -f "$log" "$SWITCHYARD_SKIP_LOG"' EXIT
cargo test --workspace --all-targets --no-fail-fast "$@" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}

echo
echo "== summary"
passed=$(grep -Eo 'test result: [a-zA-Z]+\. [0-9]+ passed' "$log" | awk '{s += $4} END {print s + 0}')
failed=$(grep -Eo '[0-9]+ failed;' "$log" | awk '{s += $1} END {print s + 0}')
skipped=$(sort -u "$SWITCHYARD_SKIP_LOG" | grep -c . || true)
echo "$passed passed, $failed failed, $skipped skipped (in whole or in part)"
if [ "$skipped" -gt 0 ]; then
  echo "skipped tests:"
  sort -u "$SWITCHYARD_SKIP_LOG" | awk -F'\t' '{ printf "  %s (%s): %s\n", $2, $1, $3 }'
fi
fixable=$(sort -u "$SWITCHYARD_SKIP_LOG" | grep -c '^Fixable' || true)
if [ -n "${SWITCHYARD_STRICT_SKIPS:-}" ] && [ "$fixable" -gt 0 ]; then
  echo "$fixable test(s) skipped for a reason this machine should have fixed (SWITCHYARD_STRICT_SKIPS is set)"
  [ "$status" -eq 0 ] && status=1
fi
if [ "$status" -ne 0 ]; then
  echo "failed tests:"
  # The last "failures:" block before each "test result:" lists the failed tests.
  awk '/^ *Running / { bin = $2 }
       /^failures:$/ { buf = ""; inblock = 1; next }
       /^test result:/ { if (inblock) printf "%s", buf; inblock = 0; next }
       inblock && /^    [^ ]/ && !/^---- / { sub(/^ +/, ""); buf = buf "  " bin ": " $0 "\n" }' "$log"
  # Test binaries that did not build or run at all.
  grep -E '^error: (could not compile|[0-9]+ targets? failed)' -A 20 "$log" | grep -E '^error|^    `' | sed 's/^/  /'
  # Why: each panic with its message (the processes' own log lines, "[name] ...", left
  # out), so the end of the log says what failed even where the rest is cut.
  echo "panics:"
  awk '/panicked at/ { n = 8; print "  " substr($0, 1, 300); next }
       n > 0 && !/^\[/ && !/^note: run with/ { print "    " substr($0, 1, 300); n-- }' "$log" | head -80
  exit "$status"
fi
echo "all tests passed"
