#!/usr/bin/env bash
# Shared launcher of every slurm/<experiment>.sbatch: runs the experiment's points inside the allocation.
#
#   launch.sh EXPERIMENT [SCALE]          (called by the .sbatch files; SCALE defaults to ci)
#
# For each point (one point per array task when the job is an array, else every point of the scale):
#   * world size 1:  srun -n1 python -m repro.experiments.worker EXP --point P
#   * world size W:  srun, one task per node, each running torchrun with c10d rendezvous on the first node of the
#                    allocation (REPRO_LAUNCHER=torchrun, the default), or srun with W tasks that read
#                    SLURM_PROCID/SLURM_NTASKS and MASTER_ADDR/MASTER_PORT (REPRO_LAUNCHER=srun).
#   Ranks per node = GPUs on the node when GPUs are allocated, else the tasks per node of the allocation.
# Rows go to $REPRO_RESULTS_DIR (default: results/ of the checkout) with the job id in their provenance.
#
# Environment: REPRO_ROOT (checkout; default $SLURM_SUBMIT_DIR), REPRO_PYTHON (default python3),
#   REPRO_DEVICE (auto | cpu | cuda; cpu runs GPU points on CPU), REPRO_LAUNCHER (torchrun | srun),
#   REPRO_RESULTS_DIR, REPRO_RUN_ID (append to this run), REPRO_MASTER_PORT.
set -euo pipefail

die() { echo "repro launch: error: $*" >&2; exit "${2:-2}"; }

[ $# -ge 1 ] || die "usage: launch.sh EXPERIMENT [SCALE]"
EXP="$1"
SCALE="${2:-ci}"
[ -n "${SLURM_JOB_ID:-}" ] || die "not inside a Slurm allocation; submit with: sbatch slurm/${EXP}.sbatch ${SCALE}"

ROOT="${REPRO_ROOT:-${SLURM_SUBMIT_DIR:-$PWD}}"
[ -d "$ROOT/repro" ] || die "REPRO_ROOT=$ROOT is not a repro checkout (no repro/ there); submit from the checkout or set REPRO_ROOT"
cd "$ROOT"
PY="${REPRO_PYTHON:-python3}"
DEVICE_REQ="${REPRO_DEVICE:-auto}"
LAUNCHER="${REPRO_LAUNCHER:-torchrun}"
case "$DEVICE_REQ" in auto|cpu|cuda) ;; *) die "REPRO_DEVICE=$DEVICE_REQ must be auto, cpu or cuda" ;; esac
case "$LAUNCHER" in torchrun|srun) ;; *) die "REPRO_LAUNCHER=$LAUNCHER must be torchrun or srun" ;; esac

JOB="${SLURM_JOB_ID}"
TASK="${SLURM_ARRAY_TASK_ID:-}"
RUN_ID="${REPRO_RUN_ID:-$(date -u +%Y%m%dT%H%M%S.%6NZ)-$(od -An -N3 -tx1 /dev/urandom | tr -d ' \n')}"
RESULTS_ARGS=()
[ -n "${REPRO_RESULTS_DIR:-}" ] && RESULTS_ARGS=(--results-dir "$REPRO_RESULTS_DIR")
SELECT=()
[ -n "$TASK" ] && SELECT=(--point-index "$TASK")

# The plan validates the experiment, scale and array index before anything is launched.
PLAN="$("$PY" -m repro.experiments.worker "$EXP" --scale "$SCALE" ${SELECT[@]+"${SELECT[@]}"} --plan)" \
  || die "cannot plan $EXP at scale $SCALE (see the message above)"

NODES="${SLURM_JOB_NUM_NODES:-1}"
HEAD="$(scontrol show hostnames "${SLURM_JOB_NODELIST:-$(hostname -s)}" 2>/dev/null | head -n1)"
HEAD="${HEAD:-$(hostname -s)}"
BASE_PORT="${REPRO_MASTER_PORT:-$(( 20000 + (JOB * 7) % 20000 ))}"

leading_int() { echo "${1%%[^0-9]*}"; }
GPUS="$(leading_int "${SLURM_GPUS_ON_NODE:-0}")"
GPUS="${GPUS:-0}"
if [ "$GPUS" -gt 0 ]; then
  PER_NODE="$GPUS"
else
  PER_NODE="$(leading_int "${SLURM_NTASKS_PER_NODE:-${SLURM_CPUS_ON_NODE:-1}}")"
fi
CPUS_NODE="$(leading_int "${SLURM_CPUS_ON_NODE:-1}")"

echo "repro launch: $EXP scale=$SCALE job=$JOB${TASK:+ array_task=$TASK} nodes=$NODES head=$HEAD gpus/node=$GPUS ranks/node=$PER_NODE run_id=$RUN_ID"

status=0
index=0
while IFS=$'\t' read -r -u 3 NAME WS NEEDS_GPU MEM; do
  [ -n "$NAME" ] || continue
  DEVICE="$DEVICE_REQ"
  if [ "$DEVICE" = auto ]; then
    if [ "$GPUS" -gt 0 ]; then DEVICE=cuda; else DEVICE=cpu; fi
    if [ "$NEEDS_GPU" = 1 ] && [ "$GPUS" -eq 0 ]; then
      die "point $NAME of $EXP needs GPUs but this allocation has none. Resubmit with GPUs, e.g. \
sbatch --gpus-per-node=8 slurm/${EXP}.sbatch $SCALE (or repro submit $EXP --scale $SCALE --gpus-per-node 8), \
or set REPRO_DEVICE=cpu to run it on CPU anyway" 3
    fi
  elif [ "$DEVICE" = cuda ] && [ "$GPUS" -eq 0 ]; then
    die "REPRO_DEVICE=cuda but no GPUs are allocated to this job (add --gpus-per-node=N to sbatch)" 3
  fi
  WORKER=(-m repro.experiments.worker "$EXP" --scale "$SCALE" --point "$NAME" --run-id "$RUN_ID"
          --device "$DEVICE" ${RESULTS_ARGS[@]+"${RESULTS_ARGS[@]}"})
  PORT=$(( BASE_PORT + index ))
  export MASTER_ADDR="$HEAD" MASTER_PORT="$PORT"
  echo "repro launch: point $NAME: $WS rank(s) on $DEVICE (needs ~${MEM} GiB per rank)"
  rc=0
  if [ "$WS" -eq 1 ]; then
    srun --nodes=1 --ntasks=1 --kill-on-bad-exit=1 "$PY" "${WORKER[@]}" </dev/null || rc=$?
  else
    NN=$(( (WS + PER_NODE - 1) / PER_NODE ))
    [ "$NN" -le "$NODES" ] || die "point $NAME needs $WS ranks = $NN node(s) of $PER_NODE; the allocation has \
$NODES node(s): resubmit with --nodes=$NN (repro submit sizes this)" 4
    [ $(( WS % NN )) -eq 0 ] || die "point $NAME: $WS ranks do not split evenly over $NN nodes" 4
    PPN=$(( WS / NN ))
    if [ "$LAUNCHER" = torchrun ]; then
      srun --nodes="$NN" --ntasks="$NN" --ntasks-per-node=1 --cpus-per-task="$CPUS_NODE" --kill-on-bad-exit=1 \
        "$PY" -m torch.distributed.run --nnodes="$NN" --nproc-per-node="$PPN" \
        --rdzv-backend=c10d --rdzv-endpoint="$HEAD:$PORT" --rdzv-id="repro-$JOB-$index" \
        "${WORKER[@]}" </dev/null || rc=$?
    else
      srun --nodes="$NN" --ntasks="$WS" --ntasks-per-node="$PPN" --kill-on-bad-exit=1 \
        "$PY" "${WORKER[@]}" </dev/null || rc=$?
    fi
  fi
  if [ "$rc" -ne 0 ]; then
    echo "repro launch: point $NAME of $EXP FAILED with exit code $rc" >&2
    [ "$status" -ne 0 ] || status=$rc
  fi
  index=$(( index + 1 ))
done 3<<< "$PLAN"

exit "$status"
