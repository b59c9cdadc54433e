#!/usr/bin/env bash
# Shared launcher of every slurm/<experiment>.sbatch and of slurm/train.sbatch: runs the work inside the allocation,
# and requeues the job when it is preempted.
#
#   launch.sh EXPERIMENT [SCALE]              (called by the experiment .sbatch files; SCALE defaults to ci)
#   launch.sh --train [REPRO TRAIN OPTIONS]   (called by slurm/train.sbatch)
#
# Experiments: for each point (one point per array task when the job is an array, else every point of the scale):
#   * world size 1:  srun -n1 python -m repro.harness.worker EXP --point P
#   * world size W:  srun, one task per node, each running torchrun with c10d rendezvous on the first node of the
#                    allocation (REPRO_LAUNCHER=torchrun, the default), or srun with W tasks that read
#                    SLURM_PROCID/SLURM_NTASKS and MASTER_ADDR/MASTER_PORT (REPRO_LAUNCHER=srun).
#   Ranks per node = GPUs on the node when GPUs are allocated, else the tasks per node of the allocation.
#   Rows go to $REPRO_RESULTS_DIR (default: results/ of the checkout) with the job id in their provenance.
# Training: srun starts `python -m repro.training OPTIONS` on every task of the allocation (one rank per task, from
#   SLURM_PROCID/SLURM_NTASKS), with --save and --load defaulting to <results>/checkpoints/<job name>-<job id>.
#
# Preemption. SIGUSR1 (#SBATCH --signal=B:USR1@120 two minutes before the time limit, or
# `scancel --full --signal=USR1 JOB`) and SIGTERM (the time limit itself) that reach this shell are passed on to the
# running step: srun hands them to its tasks, and a multi-rank point's torchrun runs under repro.dist.torchrun,
# which hands them to torchrun's agent, the agent to its workers. `scancel --signal=USR1 JOB` (without
# --full) skips this shell and signals the step's processes directly. A training rank finishes its step, saves and
# exits 75 (EX_TEMPFAIL, repro.training.preemption.EXIT_PREEMPTED); an experiment point, which keeps no state, stops,
# and repro.dist.torchrun exits 75 for it (plain torchrun would say 1).
# A step that exits 75, or that ends unsuccessfully after a signal reached this shell, ends the attempt with
# `scontrol requeue`: Slurm starts the job again under the same job id (SLURM_RESTART_COUNT counts the requeues),
# appending to the same log (#SBATCH --open-mode=append); a job cancelled by scancel (which sends SIGTERM too) is
# not requeued. The next attempt of a training loads the checkpoint; the next attempt of an experiment keeps the run
# id of the first (stored in <results>/slurm-logs/<job id>.run_id) and skips the points an earlier attempt of the
# job already wrote to it.
#
# Environment: REPRO_ROOT (checkout; default $SLURM_SUBMIT_DIR), REPRO_PYTHON (default python3),
#   REPRO_DEVICE (auto | cpu | cuda; cpu runs GPU points on CPU), REPRO_LAUNCHER (torchrun | srun),
#   REPRO_RESULTS_DIR, REPRO_RUN_ID (append to this run), REPRO_MASTER_PORT, REPRO_MAX_REQUEUES (default 5: a job
#   requeued that many times ends with 75 instead, so one that runs past its --time every attempt stops).
#   Each is checked before anything runs (and SLURM_JOB_ID, SLURM_ARRAY_TASK_ID, SLURM_ARRAY_JOB_ID,
#   SLURM_RESTART_COUNT): a bad one is one line `repro launch: error: NAME=value ...` and exit code 2, as is an
#   experiment, scale or array index the planning worker refuses (its one line after `cannot plan EXP at scale S:`).
# Every srun step passes --cpus-per-task (srun no longer inherits it from the allocation since Slurm 22.05) and, on a
# GPU allocation, its GPUs (--gpus-per-node with --gpu-bind=none: every rank picks cuda:LOCAL_RANK of all of them).
set -euo pipefail

die() { echo "repro launch: error: $1" >&2; exit "${2:-2}"; }

[ $# -ge 1 ] || die "usage: launch.sh EXPERIMENT [SCALE] | launch.sh --train [REPRO TRAIN OPTIONS]"
MODE=experiment
EXP=""
SCALE=""
if [ "$1" = --train ]; then
  MODE=train
  shift
else
  EXP="$1"
  SCALE="${2:-ci}"
fi
if [ -z "${SLURM_JOB_ID:-}" ]; then
  if [ "$MODE" = train ]; then
    die "not inside a Slurm allocation; submit with: sbatch slurm/train.sbatch [REPRO TRAIN OPTIONS]"
  fi
  die "not inside a Slurm allocation; submit with: sbatch slurm/${EXP}.sbatch ${SCALE}"
fi

# --- the environment, checked before anything runs: one line naming the variable, exit code 2 -----------------------
# quoted VALUE: VALUE as a message names it, quoted when it is empty or holds a blank (which would not be seen)
quoted() {
  if [ -z "$1" ] || [[ "$1" == *[[:space:]]* ]]; then echo "'$1'"; else echo "$1"; fi
}
# shown NAME: NAME=value, the value quoted as above
shown() { echo "$1=$(quoted "${!1-}")"; }
# whole NAME [EMPTY_OK]: NAME, when set, must be a whole number (Slurm's ids and counts: bash arithmetic and the
# worker's provenance would misread anything else); with EMPTY_OK an empty NAME counts as unset
whole() {
  [ -z "${!1+set}" ] || { [ -n "${2:-}" ] && [ -z "${!1}" ]; } || [[ "${!1}" =~ ^[0-9]+$ ]] \
    || die "$(shown "$1") must be a whole number >= 0"
}
# writable_dir LABEL DIR: DIR is a directory (created when missing) that takes a new file
writable_dir() {
  local dir="$2" up
  [ -n "${dir//[[:space:]]/}" ] || die "$1 is empty: give a path (or leave it unset)"
  [ ! -e "$dir" ] || [ -d "$dir" ] || die "$1 is a file; it must be a directory (created when missing)"
  up="$(dirname -- "$dir")"
  while [ ! -e "$up" ] && [ "$up" != "$(dirname -- "$up")" ]; do up="$(dirname -- "$up")"; done
  [ -d "$up" ] || die "$1 is under $up, which is a file"
  mkdir -p -- "$dir" 2>/dev/null && [ -w "$dir" ] && [ -x "$dir" ] || die "$1 is not a writable directory"
}
whole SLURM_JOB_ID empty-ok
whole SLURM_ARRAY_TASK_ID
whole SLURM_ARRAY_JOB_ID
whole SLURM_RESTART_COUNT empty-ok
if [ -n "${REPRO_MASTER_PORT:-}" ]; then
  [[ "$REPRO_MASTER_PORT" =~ ^[0-9]{1,5}$ ]] && [ $(( 10#$REPRO_MASTER_PORT )) -ge 1 ] \
    && [ $(( 10#$REPRO_MASTER_PORT )) -le 65535 ] || die "$(shown REPRO_MASTER_PORT) must be a port number 1-65535"
fi
# a run id as repro.provenance.RUN_ID_PATTERN has it: a UTC time (microseconds optional), Z, a dash, 6 hex digits
if [ -n "${REPRO_RUN_ID:-}" ] && ! [[ "$REPRO_RUN_ID" =~ ^[0-9]{8}T[0-9]{6}(\.[0-9]{6})?Z-[0-9a-f]{6}$ ]]; then
  die "$(shown REPRO_RUN_ID) is not a timestamp run id like 20261127T222905.210778Z-4c66fb (a UTC time, Z, a dash, \
6 hex digits): leave it unset for a new run, or name a run to append to"
fi
DEVICE_REQ="${REPRO_DEVICE:-auto}"
LAUNCHER="${REPRO_LAUNCHER:-torchrun}"
case "$DEVICE_REQ" in auto|cpu|cuda) ;; *) die "REPRO_DEVICE=$DEVICE_REQ must be auto, cpu or cuda" ;; esac
case "$LAUNCHER" in torchrun|srun) ;; *) die "REPRO_LAUNCHER=$LAUNCHER must be torchrun or srun" ;; esac
# A job that is preempted or runs past its --time every attempt would be requeued forever: at most this many times
MAX_REQUEUES="${REPRO_MAX_REQUEUES:-5}"
case "$MAX_REQUEUES" in ''|*[!0-9]*) die "REPRO_MAX_REQUEUES=$MAX_REQUEUES must be a whole number >= 0" ;; esac

ROOT="${REPRO_ROOT:-${SLURM_SUBMIT_DIR:-$PWD}}"
PY="${REPRO_PYTHON:-python3}"
command -v -- "$PY" >/dev/null 2>&1 || die "REPRO_PYTHON=$(quoted "$PY") is not a command here (not on PATH, or not an \
executable file); set it to the Python that has repro's requirements (default python3)"
[ -d "$ROOT" ] || die "REPRO_ROOT=$ROOT is not a directory; submit from the checkout or set REPRO_ROOT"
# a checkout, or (repro installed from a wheel) the folder that holds slurm/ and results/
[ -d "$ROOT/repro" ] || "$PY" -c "import repro" 2>/dev/null \
  || die "REPRO_ROOT=$ROOT is not a repro checkout (no repro/ there) and $PY cannot import repro; submit from the checkout, set REPRO_ROOT, or install repro"
cd "$ROOT"
RESULTS="${REPRO_RESULTS_DIR:-$ROOT/results}"
if [ -n "${REPRO_RESULTS_DIR:-}" ]; then
  writable_dir "REPRO_RESULTS_DIR=$RESULTS" "$RESULTS"
else
  writable_dir "$RESULTS (the results folder when REPRO_RESULTS_DIR is not set)" "$RESULTS"
fi

JOB="${SLURM_JOB_ID}"
TASK="${SLURM_ARRAY_TASK_ID:-}"
# scontrol's name of this job: an array task as <array job>_<task>, since the first task's own job id is also the
# array's, and `scontrol requeue <array job id>` requeues every task of the array
JOB_REF="$JOB"
[ -n "$TASK" ] && [ -n "${SLURM_ARRAY_JOB_ID:-}" ] && JOB_REF="${SLURM_ARRAY_JOB_ID}_${TASK}"
RESTART="$(( 10#${SLURM_RESTART_COUNT:-0} ))"
ATTEMPT=$(( RESTART + 1 ))

NODES="${SLURM_JOB_NUM_NODES:-1}"
HEAD="$(scontrol show hostnames "${SLURM_JOB_NODELIST:-$(hostname -s)}" 2>/dev/null | head -n1)"
HEAD="${HEAD:-$(hostname -s)}"
# Another port on each attempt: the previous attempt's store may still hold its port for a moment.
BASE_PORT="$(( 10#${REPRO_MASTER_PORT:-$(( 20000 + (10#$JOB * 7 + RESTART * 101) % 20000 ))} ))"

leading_int() { echo "${1%%[^0-9]*}"; }
CPUS_NODE="$(leading_int "${SLURM_CPUS_ON_NODE:-1}")"
CPUS_NODE="${CPUS_NODE:-1}"
GPUS="$(leading_int "${SLURM_GPUS_ON_NODE:-0}")"
GPUS="${GPUS:-0}"
# GPU_BIND: the GPUs of every srun step, named on the step rather than left to what the allocation's options make of
# it: each task sees all of its node's allocated GPUs (--gpu-bind=none) and takes cuda:LOCAL_RANK itself
# (repro.dist.launch); a task shown only its own GPU (CUDA_VISIBLE_DEVICES of one, as --gpus-per-task=1 gives)
# would close NCCL's peer-to-peer (NVLink) paths to the other ranks of its node. Empty on a CPU allocation.
GPU_BIND=()
[ "$GPUS" -gt 0 ] && GPU_BIND=(--gpus-per-node="$GPUS" --gpu-bind=none)
# cpus_per_task TASKS_PER_NODE: the CPUs each task of a step gets. Since Slurm 22.05 srun no longer inherits
# the allocation's --cpus-per-task, so every step passes it: the job's own when it set one, else the node's share.
cpus_per_task() {
  local per="${SLURM_CPUS_PER_TASK:-$(( CPUS_NODE / ${1:-1} ))}"
  [ "$per" -ge 1 ] 2>/dev/null || per=1
  echo "$per"
}

# --- preemption: pass a signal on to the running step, requeue when the step stopped for it -----------------------
EXIT_PREEMPTED=75
STOP_SIGNAL=""    # USR1 or TERM, once one reached this shell
SIGNALS_SEEN=0
STEP_PID=""
STEP_RC=0
REQUEUEING=""

on_signal() {  # SIGNAL
  [ -z "$REQUEUEING" ] || return 0  # scontrol requeue ends this shell with SIGTERM: nothing is left to stop
  STOP_SIGNAL="$1"
  SIGNALS_SEEN=$(( SIGNALS_SEEN + 1 ))
  if [ -n "$STEP_PID" ]; then
    echo "repro launch: got SIG$1: passing it to the running step (srun pid $STEP_PID)" >&2
    kill -s "$1" "$STEP_PID" 2>/dev/null || true
  else
    echo "repro launch: got SIG$1 between steps" >&2
  fi
}
trap 'on_signal USR1' USR1
trap 'on_signal TERM' TERM

# run_step COMMAND...: run an srun command and wait for it; STEP_RC is its exit code. The step runs in the background
# because bash runs a trap only between commands: a foreground srun would hold the signal until the step had ended.
run_step() {
  "$@" </dev/null &
  STEP_PID=$!
  local seen rc waits=0
  while :; do
    seen=$SIGNALS_SEEN
    rc=0
    wait "$STEP_PID" || rc=$?
    waits=$(( waits + 1 ))
    # 127 on a second wait: the first one already collected the step's status (it ended as the signal came)
    if [ "$waits" -gt 1 ] && [ "$rc" -eq 127 ]; then break; fi
    STEP_RC=$rc
    # A wait cut short by a trapped signal returns 128 + its number while the step goes on: wait again.
    if [ "$SIGNALS_SEEN" -eq "$seen" ] || [ "$rc" -le 128 ]; then break; fi
  done
  STEP_PID=""
}

# stopped_for_preemption: the step saved and asked to be run again (75), or a signal stopped it
stopped_for_preemption() {
  [ "$STEP_RC" -eq "$EXIT_PREEMPTED" ] || { [ -n "$STOP_SIGNAL" ] && [ "$STEP_RC" -ne 0 ]; }
}

job_field() {  # FIELD: its value in `scontrol show job` (empty when the controller does not answer)
  scontrol -o show job "$JOB_REF" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$1=//p" | head -n1
}

requeue() {  # WHY
  REQUEUEING=1
  # scancel sends SIGTERM as well, and `scontrol requeue` would bring a cancelled job back: a job that is no longer
  # RUNNING ends here unless its time limit is what ended it (Reason=TimeLimit)
  local state reason
  state="$(job_field JobState)"
  reason="$(job_field Reason)"
  if [ -n "$state" ] && [ "$state" != RUNNING ] && [ "$reason" != TimeLimit ]; then
    echo "repro launch: $1, but job $JOB_REF was cancelled (JobState=$state Reason=$reason): not requeued" >&2
    exit "$STEP_RC"
  fi
  if [ "$RESTART" -ge "$MAX_REQUEUES" ]; then
    echo "repro launch: $1, but job $JOB_REF was requeued $RESTART time(s) already (REPRO_MAX_REQUEUES=$MAX_REQUEUES): \
not requeued; resubmit it to go on (a training job resumes from its checkpoints), or raise --time" >&2
    exit "$EXIT_PREEMPTED"
  fi
  echo "repro launch: $1: attempt $ATTEMPT of job $JOB_REF ends here; scontrol requeue $JOB_REF (the next attempt appends to this log)"
  if scontrol requeue "$JOB_REF"; then
    exit 0
  fi
  die "scontrol requeue $JOB_REF failed: the job ends with exit code $EXIT_PREEMPTED; resubmit it to go on" "$EXIT_PREEMPTED"
}

# --- training ----------------------------------------------------------------------------------------------------
if [ "$MODE" = train ]; then
  ARGS=("$@")
  SAVE=""
  LOAD=""
  for (( i = 0; i < ${#ARGS[@]}; i++ )); do
    case "${ARGS[i]}" in
      --save) SAVE="${ARGS[i + 1]:-}" ;;
      --save=*) SAVE="${ARGS[i]#--save=}" ;;
      --load) LOAD="${ARGS[i + 1]:-}" ;;
      --load=*) LOAD="${ARGS[i]#--load=}" ;;
    esac
  done
  if [ -z "$SAVE" ]; then
    SAVE="$RESULTS/checkpoints/${SLURM_JOB_NAME:-repro-train}-$JOB"
    ARGS+=(--save "$SAVE")
  fi
  if [ -z "$LOAD" ]; then
    LOAD="$SAVE"
    ARGS+=(--load "$LOAD")
  elif [ "$RESTART" -gt 0 ] && [ "$LOAD" != "$SAVE" ]; then
    # the first attempt started from --load; later ones go on from this job's own checkpoints (argparse: last wins)
    echo "repro launch: attempt $ATTEMPT resumes from --save $SAVE instead of --load $LOAD"
    LOAD="$SAVE"
    ARGS+=(--load "$LOAD")
  fi
  NTASKS="${SLURM_NTASKS:-1}"
  export MASTER_ADDR="$HEAD" MASTER_PORT="$BASE_PORT"
  # one compute thread per CPU of the task (as torchrun does for its workers): ranks that each start a thread per
  # core of the node slow one another down many times over
  export OMP_NUM_THREADS="${OMP_NUM_THREADS:-${SLURM_CPUS_PER_TASK:-1}}"
  echo "repro launch: train job=$JOB attempt=$ATTEMPT nodes=$NODES head=$HEAD ranks=$NTASKS save=$SAVE load=$LOAD"
  # Ranks that stop for a preemption save together and leave one after the other: --kill-on-bad-exit would end the
  # slower ones (and turn the step's exit code 75 into 143). A rank that fails alone ends the others through the
  # trainer's fail-fast; --wait bounds how long the rest may outlive the first rank to exit.
  TASKS_NODE="$(leading_int "${SLURM_NTASKS_PER_NODE:-$(( (NTASKS + NODES - 1) / NODES ))}")"
  run_step srun --kill-on-bad-exit=0 --wait=120 --cpus-per-task="$(cpus_per_task "${TASKS_NODE:-1}")" \
    ${GPU_BIND[@]+"${GPU_BIND[@]}"} "$PY" -m repro.training ${ARGS[@]+"${ARGS[@]}"}
  if stopped_for_preemption; then
    requeue "training stopped for preemption (exit code $STEP_RC${STOP_SIGNAL:+ after SIG$STOP_SIGNAL})"
  fi
  [ "$STEP_RC" -eq 0 ] || echo "repro launch: training FAILED with exit code $STEP_RC" >&2
  exit "$STEP_RC"
fi

# --- experiments -------------------------------------------------------------------------------------------------
# The run id: REPRO_RUN_ID, or a new one on the first attempt, kept in a file so that a requeued attempt appends to
# the same run. A first attempt always writes a new one (a cluster that was reset may hand out a job id again).
RUN_ID_FILE="$RESULTS/slurm-logs/$JOB.run_id"
if [ -n "${REPRO_RUN_ID:-}" ]; then
  RUN_ID="$REPRO_RUN_ID"
elif [ "$RESTART" -gt 0 ] && [ -s "$RUN_ID_FILE" ]; then
  RUN_ID="$(cat "$RUN_ID_FILE")"
else
  [ "$RESTART" -eq 0 ] || echo "repro launch: attempt $ATTEMPT finds no $RUN_ID_FILE: this attempt starts a new run" >&2
  RUN_ID="$(date -u +%Y%m%dT%H%M%S.%6NZ)-$(od -An -N3 -tx1 /dev/urandom | tr -d ' \n')"
  mkdir -p "$(dirname "$RUN_ID_FILE")"
  echo "$RUN_ID" > "$RUN_ID_FILE"
fi
RESULTS_ARGS=()
[ -n "${REPRO_RESULTS_DIR:-}" ] && RESULTS_ARGS=(--results-dir "$REPRO_RESULTS_DIR")
SELECT=()
[ -n "$TASK" ] && SELECT=(--point-index "$TASK")
SKIP=()
[ "$RESTART" -gt 0 ] && SKIP=(--run-id "$RUN_ID" --skip-done)

# The plan validates the experiment, scale and array index before anything is launched; a requeued attempt leaves
# out the points that an earlier attempt of this job wrote. The worker's messages go to stderr as they came when
# it plans; a refusal (exit code 2) is one line, its own, after this script's prefix; a crash keeps its whole output.
mkdir -p "$RESULTS/slurm-logs"
WHAT="$(quoted "$EXP") at scale $(quoted "$SCALE")"
PLAN_ERR="$(mktemp "$RESULTS/slurm-logs/$JOB.plan.XXXXXX")"
plan_rc=0
PLAN="$("$PY" -m repro.harness.worker "$EXP" --scale "$SCALE" ${SELECT[@]+"${SELECT[@]}"} ${SKIP[@]+"${SKIP[@]}"} \
  --plan 2>"$PLAN_ERR")" || plan_rc=$?
plan_said="$(cat "$PLAN_ERR")"
rm -f -- "$PLAN_ERR"
if [ "$plan_rc" -ne 0 ]; then
  last="$(printf '%s\n' "$plan_said" | sed '/^[[:space:]]*$/d' | tail -n1)"
  [ -n "$last" ] || die "cannot plan $WHAT: $PY exited with code $plan_rc and said nothing"
  if [ "$plan_rc" -eq 2 ]; then
    die "cannot plan $WHAT: ${last#*: error: }"
  fi
  printf '%s\n' "$plan_said" >&2
  die "cannot plan $WHAT: $PY exited with code $plan_rc (see the message above)"
fi
[ -z "$plan_said" ] || printf '%s\n' "$plan_said" >&2
# each point takes the next port after REPRO_MASTER_PORT: the last one must still be a port
points="$(printf '%s\n' "$PLAN" | grep -c . || true)"
if [ "$points" -gt 0 ] && [ $(( BASE_PORT + points - 1 )) -gt 65535 ]; then
  die "$(shown REPRO_MASTER_PORT) leaves no port for the last of the $points point(s) (each takes the next port): \
give one <= $(( 65536 - points ))"
fi

if [ "$GPUS" -gt 0 ]; then
  PER_NODE="$GPUS"
else
  PER_NODE="$(leading_int "${SLURM_NTASKS_PER_NODE:-${SLURM_CPUS_ON_NODE:-1}}")"
fi
# Multi-rank points start torchrun through repro.dist.torchrun: torchrun's agent dies of SIGUSR1 unless told to
# handle it, and reports a worker's 75 (or a stop by a signal) as its own 1; the wrapper has the agent handle
# SIGUSR1 where it can, passes the signals on, waits for every rank, and exits 75 when the point stopped for one.

echo "repro launch: $EXP scale=$SCALE job=$JOB${TASK:+ array_task=$TASK} attempt=$ATTEMPT nodes=$NODES head=$HEAD gpus/node=$GPUS ranks/node=$PER_NODE run_id=$RUN_ID"

status=0
index=0
while IFS=$'\t' read -r -u 3 NAME WS NEEDS_GPU MEM; do
  [ -n "$NAME" ] || continue
  if [ -n "$STOP_SIGNAL" ]; then
    requeue "stopped by SIG$STOP_SIGNAL before point $NAME"
  fi
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
  WORKER=(-m repro.harness.worker "$EXP" --scale "$SCALE" --point "$NAME" --run-id "$RUN_ID"
          --device "$DEVICE" ${RESULTS_ARGS[@]+"${RESULTS_ARGS[@]}"})
  PORT=$(( BASE_PORT + index ))
  export MASTER_ADDR="$HEAD" MASTER_PORT="$PORT"
  echo "repro launch: point $NAME: $WS rank(s) on $DEVICE (needs ~${MEM} GiB per rank)"
  if [ "$WS" -eq 1 ]; then
    run_step srun --nodes=1 --ntasks=1 --cpus-per-task="$CPUS_NODE" ${GPU_BIND[@]+"${GPU_BIND[@]}"} \
      --kill-on-bad-exit=1 "$PY" "${WORKER[@]}"
  else
    NN=$(( (WS + PER_NODE - 1) / PER_NODE ))
    [ "$NN" -le "$NODES" ] || die "point $NAME needs $WS ranks = $NN node(s) of $PER_NODE; the allocation has \
$NODES node(s): resubmit with --nodes=$NN (repro submit sizes this)" 4
    [ $(( WS % NN )) -eq 0 ] || die "point $NAME: $WS ranks do not split evenly over $NN nodes" 4
    PPN=$(( WS / NN ))
    if [ "$LAUNCHER" = torchrun ]; then
      run_step srun --nodes="$NN" --ntasks="$NN" --ntasks-per-node=1 --cpus-per-task="$CPUS_NODE" --kill-on-bad-exit=1 \
        ${GPU_BIND[@]+"${GPU_BIND[@]}"} "$PY" -m repro.dist.torchrun --nnodes="$NN" --nproc-per-node="$PPN" \
        --rdzv-backend=c10d --rdzv-endpoint="$HEAD:$PORT" --rdzv-id="repro-$JOB-$RESTART-$index" \
        "${WORKER[@]}"
    else
      run_step srun --nodes="$NN" --ntasks="$WS" --ntasks-per-node="$PPN" --cpus-per-task="$(cpus_per_task "$PPN")" \
        ${GPU_BIND[@]+"${GPU_BIND[@]}"} --kill-on-bad-exit=1 "$PY" "${WORKER[@]}"
    fi
  fi
  rc=$STEP_RC
  if stopped_for_preemption; then
    requeue "point $NAME stopped for preemption (exit code $rc${STOP_SIGNAL:+ after SIG$STOP_SIGNAL}); it runs again"
  fi
  if [ "$rc" -ne 0 ]; then
    echo "repro launch: point $NAME of $EXP FAILED with exit code $rc" >&2
    [ "$status" -ne 0 ] || status=$rc
  fi
  index=$(( index + 1 ))
done 3<<< "$PLAN"

exit "$status"
