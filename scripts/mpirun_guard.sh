#!/usr/bin/env bash
# mpirun_guard.sh [-g GRACE] mpirun ARGS...
# Runs mpirun and makes sure it returns once the job is being torn down. OpenMPI 4.1's mpirun,
# once a rank has called MPI_Abort or exited non-zero, orders every daemon to kill its ranks
# and then waits for all of them to confirm; a daemon on the far side of a network partition
# never does, and mpirun waits forever (it also ignores, from then on, that the daemon's ssh
# has gone). This wrapper watches mpirun's output (stdout and stderr, passed through merged
# on stdout) for the lines OpenMPI prints when it starts such a teardown; GRACE seconds later
# (default 10) it sends SIGTERM twice, 2 s apart ("hit ctrl-c again to forcibly terminate"),
# then SIGKILL. It exits with mpirun's status (non-zero after a teardown).
# The remote daemon is not this wrapper's to end: ssh's keepalives are (sshd_config
# ClientAliveInterval / ClientAliveCountMax), or scripts/netns_rsh's NETNS_RSH_ALIVE in the
# namespace tests. Under Slurm use `srun --kill-on-bad-exit=1` instead (README).
set -u
grace=10
if [ "${1:-}" = "-g" ]; then grace=$2; shift 2; fi
[ $# -gt 0 ] || { sed -n '2,13p' "$0"; exit 2; }
fifo=$(mktemp -u /tmp/mpirun_guard.XXXXXX)
mkfifo "$fifo" || exit 2
"$@" >"$fifo" 2>&1 &
pid=$!
killer=
forward() { kill -TERM "$pid" 2>/dev/null; }
trap forward INT TERM
while IFS= read -r line; do
  printf '%s\n' "$line"
  [ -n "$killer" ] && continue
  case $line in
    *"MPI_ABORT was invoked"* | *"returned a non-zero exit code"* | *"exited on signal"* | \
      *"lost communication with a remote daemon"* | *"has lost communication"*)
      (
        end=$((SECONDS + grace))
        while [ $SECONDS -lt $end ]; do kill -0 "$pid" 2>/dev/null || exit 0; sleep 0.2; done
        echo "mpirun_guard: mpirun still running ${grace} s after the job began to end: terminating it" >&2
        kill -TERM "$pid" 2>/dev/null; sleep 2
        kill -TERM "$pid" 2>/dev/null; sleep 2
        kill -KILL "$pid" 2>/dev/null
      ) &
      killer=$!
      ;;
  esac
done <"$fifo"
wait "$pid"
rc=$?
rm -f "$fifo"
[ -n "$killer" ] && wait "$killer"
exit $rc
