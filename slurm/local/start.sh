#!/usr/bin/env bash
# Start a real Slurm on this machine for tests and CI (no systemd needed): one node, or N emulated nodes.
#
#   slurm/local/start.sh              one node, named `hostname -s`
#   slurm/local/start.sh --nodes 2    two emulated nodes, <host>-n1 and <host>-n2 (also: REPRO_SLURM_NODES=2)
#   slurm/local/start.sh [--nodes N] --dry-run   print the slurm.conf it would write; change and start nothing
#
# Installs Debian's Slurm (slurmctld, slurmd, slurm-client, munge) when sbatch is missing, writes the config, starts
# munged, slurmctld and one slurmd per node by hand and waits until every node is idle. Needs root.
# Emulated nodes: every slurmd runs on this machine, started as `slurmd -N NODE`, with its own port (Port=, from
# 6818 up), spool folder, pid file and log (%n in slurm.conf), as Slurm's multiple-slurmd mode has it (Debian's
# build has it: `scontrol show config` says MULTIPLE_SLURMD = Yes). Their names are added to /etc/hosts (127.0.0.1)
# so that a job's head node resolves: it is the job's MASTER_ADDR and torchrun's rendezvous host.
# Stop everything again with slurm/local/stop.sh.
#
# Environment (all optional):
#   REPRO_SLURM_NODES    nodes to emulate (default 1; --nodes N wins)
#   REPRO_SLURM_CPUS     CPUs each node declares (default 8; more than the real cores is fine, so 4- and 8-task
#                        jobs can run: SlurmdParameters=config_overrides keeps the node from going INVAL)
#   REPRO_SLURM_MEM_MB   RealMemory of each node in MB (default: 90% of MemTotal; emulated nodes share it)
#   REPRO_SLURM_WAIT_S   how long to wait for the nodes to become idle (default 60)
#   REPRO_SLURM_REQUEUE_DELAY_S  how long a requeued job waits before it may start again (default 10). Slurm takes
#                        it from AuthInfo=cred_expire (also the lifetime of a step credential; 120 s by default
#                        on a real cluster): the preemption tests requeue jobs and should not wait two minutes.
set -euo pipefail

die() { echo "slurm/local/start.sh: $*" >&2; exit 1; }
usage_error() { echo "slurm/local/start.sh: $*" >&2; exit 2; }

NODES="${REPRO_SLURM_NODES:-1}"
DRY_RUN=""
while [ $# -gt 0 ]; do
  case "$1" in
    --nodes) [ $# -ge 2 ] || usage_error "--nodes needs a number"; NODES="$2"; shift 2 ;;
    --nodes=*) NODES="${1#--nodes=}"; shift ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) usage_error "unknown argument '$1' (usage: start.sh [--nodes N] [--dry-run])" ;;
  esac
done
case "$NODES" in
  ''|*[!0-9]*) usage_error "--nodes / REPRO_SLURM_NODES must be a whole number from 1 to 16, not '$NODES'" ;;
esac
NODES=$(( 10#$NODES ))
[ "$NODES" -ge 1 ] && [ "$NODES" -le 16 ] || usage_error "--nodes / REPRO_SLURM_NODES must be from 1 to 16, not $NODES"

CPUS="${REPRO_SLURM_CPUS:-8}"
WAIT_S="${REPRO_SLURM_WAIT_S:-60}"
CRED_EXPIRE_S="${REPRO_SLURM_REQUEUE_DELAY_S:-10}"
MEM_TOTAL_KB=$(awk '/^MemTotal:/ {print $2}' /proc/meminfo)
MEM_MB="${REPRO_SLURM_MEM_MB:-$(( MEM_TOTAL_KB * 9 / 10 / 1024 ))}"
HOST="$(hostname -s)"
CONF_DIR=/etc/slurm
LOG_DIR=/var/log/slurm
SPOOL=/var/spool/slurm-repro
SLURMD_PORT=6818

# The nodes: this host itself, or N emulated ones named <host>-n1..<host>-nN
NAMES=()
if [ "$NODES" -eq 1 ]; then
  NAMES=("$HOST")
  NODE_SET="$HOST"
else
  for (( i = 1; i <= NODES; i++ )); do NAMES+=("$HOST-n$i"); done
  NODE_SET="$HOST-n[1-$NODES]"
fi

slurm_conf() {  # the slurm.conf of this cluster, on stdout
  local i
  cat <<CONF
# Written by repro slurm/local/start.sh: a ${NODES}-node cluster on one machine, for tests and CI.
ClusterName=repro
SlurmctldHost=${HOST}(127.0.0.1)
AuthType=auth/munge
AuthInfo=cred_expire=${CRED_EXPIRE_S}
SlurmUser=root
SlurmdUser=root
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
MailProg=/bin/true
EnforcePartLimits=ALL
SchedulerParameters=defer_batch=0,sched_interval=2,bf_interval=2
StateSaveLocation=${SPOOL}/ctld
SlurmdSpoolDir=${SPOOL}/d-%n
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd-%n.pid
SlurmctldLogFile=${LOG_DIR}/slurmctld.log
SlurmdLogFile=${LOG_DIR}/slurmd-%n.log
JobCompType=jobcomp/filetxt
JobCompLoc=${LOG_DIR}/jobcomp.log
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
InactiveLimit=0
DefMemPerCPU=$(( MEM_MB / CPUS ))
KillWait=5
MinJobAge=300
SlurmctldTimeout=30
SlurmdTimeout=30
CONF
  for (( i = 0; i < NODES; i++ )); do
    echo "NodeName=${NAMES[i]} NodeHostname=${NAMES[i]} NodeAddr=127.0.0.1 Port=$(( SLURMD_PORT + i )) CPUs=${CPUS} RealMemory=${MEM_MB} State=UNKNOWN"
  done
  echo "PartitionName=debug Nodes=${NODE_SET} Default=YES MaxTime=INFINITE State=UP"
}
# No cgroup.conf is written: proctrack/linuxproc with task/none needs none, and a cgroup.conf naming a plugin
# this build lacks (e.g. CgroupPlugin=disabled) stops slurmd at start.

if [ -n "$DRY_RUN" ]; then
  echo "# $CONF_DIR/slurm.conf that slurm/local/start.sh would write (--dry-run: nothing changed or started)"
  slurm_conf
  [ "$NODES" -eq 1 ] || echo "# /etc/hosts, unless they resolve already: 127.0.0.1 ${NAMES[*]}"
  exit 0
fi

[ "$(id -u)" -eq 0 ] || die "needs root (it installs packages and starts system daemons)"

if ! command -v sbatch >/dev/null || ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null \
    || ! command -v munged >/dev/null; then
  echo "installing slurmctld slurmd slurm-client munge (Debian packages)..."
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null 2>&1 \
    || { apt-get update >/dev/null && apt-get install -y --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null; } \
    || die "apt-get install of slurmctld slurmd slurm-client munge failed"
fi

# A daemon from an earlier start would hold the ports: stop it first (by pid file only).
"$(dirname "$0")/stop.sh" >/dev/null 2>&1 || true

mkdir -p "$CONF_DIR" "$LOG_DIR" "$SPOOL/ctld" /run/munge /etc/munge
for name in "${NAMES[@]}"; do mkdir -p "$SPOOL/d-$name"; done
if [ ! -s /etc/munge/munge.key ]; then
  dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key status=none
fi
chown -R munge:munge /etc/munge /run/munge /var/lib/munge /var/log/munge 2>/dev/null || true
chmod 0700 /etc/munge; chmod 0400 /etc/munge/munge.key; chmod 0755 /run/munge

# Emulated nodes must resolve (a job's head node is its MASTER_ADDR and torchrun's rendezvous host)
if [ "$NODES" -gt 1 ]; then
  missing=()
  for name in "${NAMES[@]}"; do getent hosts "$name" >/dev/null || missing+=("$name"); done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "127.0.0.1 ${missing[*]}  # emulated Slurm nodes of repro slurm/local/start.sh" >> /etc/hosts \
      || die "cannot add ${missing[*]} to /etc/hosts"
  fi
fi

slurm_conf > "$CONF_DIR/slurm.conf"

runuser -u munge -- /usr/sbin/munged --force >/dev/null 2>&1 || die "munged did not start (see /var/log/munge/munged.log)"
/usr/sbin/slurmctld -c -i >/dev/null 2>&1 || die "slurmctld did not start (see $LOG_DIR/slurmctld.log)"
for name in "${NAMES[@]}"; do
  /usr/sbin/slurmd -N "$name" >/dev/null 2>&1 || die "slurmd -N $name did not start (see $LOG_DIR/slurmd-$name.log)"
done

deadline=$(( $(date +%s) + WAIT_S ))
states=""
while [ "$(date +%s)" -lt "$deadline" ]; do
  states="$(sinfo -h -N -o '%N %T' 2>/dev/null || true)"
  idle=0
  while read -r name state; do
    [ -n "$name" ] || continue
    case "$state" in
      idle*) idle=$(( idle + 1 )) ;;
      inval*|drain*|down*) scontrol update nodename="$name" state=resume >/dev/null 2>&1 || true ;;
    esac
  done <<< "$states"
  if [ "$idle" -eq "$NODES" ]; then
    echo "slurm is up: $NODES node(s) $NODE_SET idle ($CPUS CPUs, ${MEM_MB} MB each); stop it with slurm/local/stop.sh"
    exit 0
  fi
  sleep 0.5
done
die "the nodes did not all become idle within ${WAIT_S}s (last states: '$(echo ${states:-none})'); logs in $LOG_DIR"
