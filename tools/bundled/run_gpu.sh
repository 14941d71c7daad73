#!/usr/bin/env bash
# One command for the GPU machine (see tools/bundled/README.md): a smoke run of the whole pipeline, then, if it
# passed, the real training within what is left of BUDGET seconds. Leaves in OUT: smoke.tar / tiny.tar (model
# folders), smoke.log / train.log, model_state.pt (fp32 weights, to redo the export without retraining).
# Usage: run_gpu.sh OUT [BUDGET_SECONDS]
set -uo pipefail
out=${1:?usage: run_gpu.sh OUT [BUDGET]}
budget=${2:-400}
cd "$(dirname "$0")/../.."
start=$(date +%s)
work=/tmp/bundled
rm -rf "$work" && mkdir -p "$work/smoke" "$work/tiny"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
export PYTHONUNBUFFERED=1
python3 tools/bundled/train_tiny.py --smoke --out "$work/smoke" 2>&1 | tee "$out/smoke.log"
rc=${PIPESTATUS[0]}
tar -C "$work" -cf "$out/smoke.tar" smoke
if [ "$rc" -eq 0 ]; then
  left=$((budget - ($(date +%s) - start) - 20))
  echo "smoke passed; full run with a deadline of $left s"
  python3 tools/bundled/train_tiny.py --out "$work/tiny" --deadline "$left" 2>&1 | tee "$out/train.log"
  rc=${PIPESTATUS[0]}
  tar -C "$work" -cf "$out/tiny.tar" tiny
  [ -f "$work/model_state.pt" ] && cp "$work/model_state.pt" "$out/"
fi
ls -la "$work"/* "$out"
echo "exit status $rc after $(($(date +%s) - start)) s"
exit "$rc"
