#!/usr/bin/env bash
# The headline 1-GPU measurements within a 540 s deadline: a thin wrapper over `python -m repro.gpu_session`
# (see its --help). Run from anywhere; nothing is installed. Results, logs and the summary go to $OUT (or --out).
#
#   bash scripts/gpu_session.sh [--rehearse] [--deadline-s S] [--part NAME ...]
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
[ -d .gpu_shared/data ] && [ -z "${REPRO_DATA:-}" ] && export REPRO_DATA="$PWD/.gpu_shared/data"
exec python3 -m repro.gpu_session "$@"
