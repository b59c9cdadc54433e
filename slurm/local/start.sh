#!/usr/bin/env bash
# Start a real one-node Slurm on this machine for tests and CI (no systemd needed).
#
# Installs Debian's Slurm (slurmctld, slurmd, slurm-client, munge) when sbatch is missing, writes a one-node
# config, starts munged, slurmctld and slurmd by hand and waits until the node is idle. Needs root.
# Stop everything again with slurm/local/stop.sh.
#
# Environment (all optional):
#   REPRO_SLURM_CPUS     CPUs the node declares (default 8; more than the real cores is fine, so 4- and 8-task
#                        jobs can run: SlurmdParameters=config_overrides keeps the node from going INVAL)
#   REPRO_SLURM_MEM_MB   RealMemory of the node in MB (default: 90% of MemTotal)
#   REPRO_SLURM_WAIT_S   how long to wait for the node to become idle (default 60)
#   REPRO_SLURM_REQUEUE_DELAY_S  how long a requeued job waits before it may start again (default 10). Slurm takes
#                        it from AuthInfo=cred_expire (also the lifetime of a step credential; 120 s by default
#                        on a real cluster): the preemption tests requeue jobs and should not wait two minutes.
set -euo pipefail

die() { echo "slurm/local/start.sh: $*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || die "needs root (it installs packages and starts system daemons)"

CPUS="${REPRO_SLURM_CPUS:-8}"
WAIT_S="${REPRO_SLURM_WAIT_S:-60}"
CRED_EXPIRE_S="${REPRO_SLURM_REQUEUE_DELAY_S:-10}"
MEM_TOTAL_KB=$(awk '/^MemTotal:/ {print $2}' /proc/meminfo)
MEM_MB="${REPRO_SLURM_MEM_MB:-$(( MEM_TOTAL_KB * 9 / 10 / 1024 ))}"
NODE="$(hostname -s)"
CONF_DIR=/etc/slurm
LOG_DIR=/var/log/slurm
SPOOL=/var/spool/slurm-repro

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

mkdir -p "$CONF_DIR" "$LOG_DIR" "$SPOOL/ctld" "$SPOOL/d" /run/munge /etc/munge
if [ ! -s /etc/munge/munge.key ]; then
  dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key status=none
fi
chown -R munge:munge /etc/munge /run/munge /var/lib/munge /var/log/munge 2>/dev/null || true
chmod 0700 /etc/munge; chmod 0400 /etc/munge/munge.key; chmod 0755 /run/munge

cat > "$CONF_DIR/slurm.conf" <<CONF
# Written by repro slurm/local/start.sh: a one-node cluster for tests and CI.
ClusterName=repro
SlurmctldHost=${NODE}(127.0.0.1)
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
SlurmdSpoolDir=${SPOOL}/d
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=${LOG_DIR}/slurmctld.log
SlurmdLogFile=${LOG_DIR}/slurmd.log
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
NodeName=${NODE} NodeAddr=127.0.0.1 CPUs=${CPUS} RealMemory=${MEM_MB} State=UNKNOWN
PartitionName=debug Nodes=${NODE} Default=YES MaxTime=INFINITE State=UP
CONF
# No cgroup.conf is written: proctrack/linuxproc with task/none needs none, and a cgroup.conf naming a plugin
# this build lacks (e.g. CgroupPlugin=disabled) stops slurmd at start.

runuser -u munge -- /usr/sbin/munged --force >/dev/null 2>&1 || die "munged did not start (see /var/log/munge/munged.log)"
/usr/sbin/slurmctld -c -i >/dev/null 2>&1 || die "slurmctld did not start (see $LOG_DIR/slurmctld.log)"
/usr/sbin/slurmd >/dev/null 2>&1 || die "slurmd did not start (see $LOG_DIR/slurmd.log)"

deadline=$(( $(date +%s) + WAIT_S ))
state=""
while [ "$(date +%s)" -lt "$deadline" ]; do
  state="$(sinfo -h -n "$NODE" -o %T 2>/dev/null | head -n1 || true)"
  case "$state" in
    idle*) echo "slurm is up: node $NODE is $state ($CPUS CPUs, ${MEM_MB} MB); stop it with slurm/local/stop.sh"; exit 0 ;;
    inval*|drain*|down*) scontrol update nodename="$NODE" state=resume >/dev/null 2>&1 || true ;;
  esac
  sleep 0.5
done
die "node $NODE did not become idle within ${WAIT_S}s (last state: '${state:-none}'); logs in $LOG_DIR"
