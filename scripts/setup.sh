#!/usr/bin/env bash
# Set up a new machine for repro: the CPU torch wheel first (a looser spec would pull a multi-GB CUDA build),
# then the project with its test tools. Idempotent. On a GPU cluster, install your CUDA torch first and skip
# the first step with REPRO_KEEP_TORCH=1.
set -euo pipefail
cd "$(dirname "$0")/.."
PIP="${PIP:-python3 -m pip}"
if [ "${REPRO_KEEP_TORCH:-0}" != "1" ] && ! python3 -c 'import torch' 2>/dev/null; then
  echo "== installing torch 2.13.0 (CPU build)"
  $PIP install --quiet torch==2.13.0
fi
echo "== installing repro and its test tools"
# torch stays whatever is installed: the project's own spec is torch>=2.4.1 (scripts/torch_versions.sh proves it)
$PIP install --quiet -e ".[dev]"
python3 -c 'import torch, repro; print(f"repro {repro.__version__}, torch {torch.__version__}")'
