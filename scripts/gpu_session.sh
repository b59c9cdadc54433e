#!/usr/bin/env bash
# The GPU measurements of issue 11 on one GPU machine, in one command: provenance, then each named part, each
# bounded in time, results (JSONL runs with provenance) and logs under $OUT (default /tmp/repro-gpu-out).
#
#   bash scripts/gpu_session.sh [PART ...]     PART: env megatron_smoke megatron megatron_no_ckpt gna zero tests
#
# Run from the repository root with PyTorch + CUDA installed (PYTHONPATH=. is enough; nothing is installed).
set -uo pipefail
OUT="${OUT:-/tmp/repro-gpu-out}"
mkdir -p "$OUT/results"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 REPRO_RESULTS_DIR="$OUT/results"
[ -d .gpu_shared/data ] && export REPRO_DATA="$PWD/.gpu_shared/data"
LOG="$OUT/session.log"
parts=("$@")
[ ${#parts[@]} -eq 0 ] && parts=(env megatron_smoke megatron gna zero tests)

run() {  # run NAME SECONDS CMD...: one bounded part, its status logged
  local name=$1 limit=$2; shift 2
  echo "=== $name (limit ${limit}s) $(date -u +%H:%M:%S)" | tee -a "$LOG"
  local t0=$SECONDS
  timeout --signal=TERM --kill-after=15 "$limit" "$@" >>"$LOG" 2>&1
  local rc=$?
  echo "=== $name rc=$rc in $((SECONDS - t0))s" | tee -a "$LOG"
}

for part in "${parts[@]}"; do
  case "$part" in
    env)
      run env 60 bash -c 'nvidia-smi; python3 -c "import torch, triton; print(torch.__version__, torch.version.cuda, triton.__version__, torch.cuda.get_device_name(0))"; python3 -c "from repro.dist.device import describe; print(describe(\"cuda\"))"; nproc; free -g' ;;
    megatron_smoke)
      run megatron_smoke 240 python3 -m repro run megatron_weak_scaling_gpu --scale smoke --device cuda ;;
    megatron)
      run megatron 420 python3 -m repro run megatron_weak_scaling_gpu --scale paper --point 1p2B_1gpu --device cuda ;;
    megatron_no_ckpt)
      run megatron_no_ckpt 420 python3 -m repro run megatron_weak_scaling_gpu --scale paper --point 1p2B_1gpu_no_ckpt --device cuda ;;
    gna)
      run gna 480 python3 -m repro run gna_speedup_gpu --scale paper --device cuda ;;
    zero)
      run zero 540 python3 -m repro run zero_gpu --scale paper --point "${ZERO_POINT:-offload_1gpu}" --device cuda ;;
    tests)
      run tests 420 python3 -m pytest -q -n 8 --timeout 300 -p no:cacheprovider --junitxml="$OUT/tests-cuda.xml" tests ;;
    *) echo "unknown part $part" | tee -a "$LOG" ;;
  esac
done
tar czf "$OUT/results.tgz" -C "$OUT" results 2>/dev/null
grep -E "^=== |passed|failed|FAIL|Error" "$LOG" | tail -60
