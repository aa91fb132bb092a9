#!/usr/bin/env bash
# mpirun_guard.sh [-g GRACE] mpirun ARGS...
# Runs mpirun (its output untouched) and makes sure it returns once its job has begun to end.
# OpenMPI 4.1's mpirun, once a rank has called MPI_Abort or exited non-zero, orders every
# daemon to kill its ranks and waits for all of them to confirm; a daemon on the far side of a
# network partition never does, and mpirun waits forever (from then on it even ignores that
# the daemon's ssh has exited). The guard watches mpirun's own children (the ranks on this
# host and the ssh/rsh agents of the remote daemons): once one of them has exited, mpirun gets
# GRACE seconds (default 10) to return; then it is sent SIGTERM twice, 2 s apart (OpenMPI:
# "hit ctrl-c again to forcibly terminate"), then SIGKILL. Exit status: mpirun's (non-zero
# after a teardown). A normal end returns well within GRACE, so the guard never acts on it.
# The remote daemon is not the guard's to end: ssh's keepalives are (sshd_config
# ClientAliveInterval / ClientAliveCountMax), or scripts/netns_rsh's NETNS_RSH_ALIVE in the
# namespace tests. Under Slurm use `srun --kill-on-bad-exit=1` instead (README).
set -u
grace=10
if [ "${1:-}" = "-g" ]; then grace=$2; shift 2; fi
[ $# -gt 0 ] || { sed -n '2,14p' "$0"; exit 2; }
"$@" &
pid=$!
trap 'kill -TERM "$pid" 2>/dev/null' INT TERM
children() { ps -o pid= --ppid "$pid" 2>/dev/null | tr -d ' '; }
declare -A seen
ending=
while kill -0 "$pid" 2>/dev/null; do
  now=" $(children | tr '\n' ' ') "
  if [ -z "$ending" ]; then
    for c in "${!seen[@]}"; do
      case $now in *" $c "*) ;; *) ending=$SECONDS ;; esac
    done
    for c in $now; do seen[$c]=1; done
  elif [ $((SECONDS - ending)) -ge "$grace" ]; then
    echo "mpirun_guard: mpirun still running ${grace} s after its job began to end: terminating it" >&2
    kill -TERM "$pid" 2>/dev/null
    sleep 2
    kill -TERM "$pid" 2>/dev/null
    sleep 2
    kill -KILL "$pid" 2>/dev/null
    break
  fi
  sleep 0.2
done
wait "$pid"
