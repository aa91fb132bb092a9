#!/bin/bash
# Runs "$@" while every other user-space thread on the machine is reniced to 19 and every other
# scheduler autogroup (/proc/PID/autogroup: with sched_autogroup on, nice only ranks threads
# within their session's group, and groups share the cores equally) is set to nice 19; "$@"
# and its descendants stay at nice 0. Re-applied each second, so new processes of other jobs
# are caught too. Kernel threads are left alone. Timing aid for a shared 2-core machine; needs
# root (it renices other users' processes and writes their /proc/PID/autogroup).
#   bench/quiet.sh COMMAND [ARGS...]   e.g. bench/quiet.sh bash bench/offload_step.sh /mnt/nvme
case "${1:-}" in -h | --help) awk 'NR > 1 && /^#/ {sub(/^# ?/, ""); print; next} NR > 1 {exit}' "$0"; exit 0 ;; esac
"$@" &
pid=$!
mine=$(cat /proc/$pid/autogroup 2>/dev/null | cut -d' ' -f1)
( while kill -0 $pid 2>/dev/null; do
    all=$(ps -eLo tid=,pid=,ppid= | awk '$2 != 2 && $3 != 2 && $2 != 1 {print $1}')  # not kthreadd's
    desc=" $(pstree -pt $pid | grep -o '([0-9]*)' | tr -d '()' | tr '\n' ' ') "
    for t in $desc; do renice -n 0 -p $t >/dev/null 2>&1; done
    for t in $all; do
      case "$desc" in *" $t "*) continue;; esac
      renice -n 19 -p $t >/dev/null 2>&1
    done
    for p in $(ps -eo pid= | awk '$1 != 1'); do
      g=$(cut -d' ' -f1 /proc/$p/autogroup 2>/dev/null) || continue
      [ -n "$g" ] && [ "$g" != "$mine" ] && echo 19 > /proc/$p/autogroup 2>/dev/null
    done
    sleep 1
  done ) &
wait $pid
