#!/usr/bin/env bash
# Stop the local Slurm started by slurm/local/start.sh: every slurmd (one per emulated node), slurmctld, munged,
# each by its pid file.
set -uo pipefail

stop_pidfile() {  # name pidfile
  local name="$1" pidfile="$2" pid
  [ -s "$pidfile" ] || return 0
  pid="$(cat "$pidfile")"
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid" 2>/dev/null
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then kill -9 "$pid" 2>/dev/null; fi
    echo "stopped $name (pid $pid)"
  fi
  rm -f "$pidfile"
}

for pidfile in /run/slurmd.pid /run/slurmd-*.pid; do  # /run/slurmd.pid: written by an older start.sh
  [ -e "$pidfile" ] || continue
  name="${pidfile#/run/}"
  stop_pidfile "${name%.pid}" "$pidfile"
done
stop_pidfile slurmctld /run/slurmctld.pid
stop_pidfile munged /run/munge/munged.pid
exit 0
