#!/usr/bin/env bash
# The whole device command of the GPU fidelity run (benchmarks/gpu_fidelity.py run), for one call
# on a lent GPU machine (PyTorch, transformers and aiohttp there; no network, no vLLM):
#   bash benchmarks/gpu_fidelity.sh            # on the GPU machine, from the repository root
# Writes into $OUT: gpu_run.tar.gz (the run folder, packed again after every stage), run.log,
# nvidia-smi.txt, server.err. Extra arguments go to `gpu_fidelity.py run` (a CPU rehearsal:
#   OUT=/tmp/o bash benchmarks/gpu_fidelity.sh --device cpu --model tiny:256x2 --dtype fp32 --small).
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
(nvidia-smi || true) > "$OUT/nvidia-smi.txt" 2>&1
$PY -c "import sys, torch, transformers, aiohttp, numpy, scipy, pyarrow; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'transformers', transformers.__version__, 'aiohttp', aiohttp.__version__, 'numpy', numpy.__version__)" 2>&1 | tee "$OUT/run.log"
set -o pipefail
$PY benchmarks/gpu_fidelity.py run --out /tmp/gpu_run "$@" 2>&1 | grep --line-buffered -v "^  profile: " | tee -a "$OUT/run.log"
rc=$?
cp /tmp/gpu_run/server.err "$OUT/server.err" 2>/dev/null
tail -c 3000000 "$OUT/server.err" > "$OUT/server.err.tail" 2>/dev/null && mv "$OUT/server.err.tail" "$OUT/server.err"
exit $rc
