#!/usr/bin/env bash
# Sourced by the bench/*_link.sh scripts, from the repository root after `set -euo pipefail`:
# the set-up they share of two namespace "hosts" (scripts/netns_hosts.sh, which this sources)
# joined by a veth shaped by tc, and of mpirun across them. Run on its own it only prints this.
#   link_check NAME                  exit 77 (skipped) with NAME's reason where namespaces can't
#                                    be made here
#   link_init NAME TAG [TEMPLATE]    link_check NAME; exports OpenMPI's run-as-root and yield
#                                    settings and OMP_NUM_THREADS=1; sets prefix (TAG and the
#                                    PID), A, B and V (the namespaces and the veth) and, with
#                                    TEMPLATE, work (mktemp -d TEMPLATE); on exit removes the
#                                    namespaces and work (also on error or Ctrl-C)
#   link_up NAME PREFIX RATE BURST NETEM_ARGS...
#                                    netns_up PREFIX with `netem rate RATE NETEM_ARGS...` on both
#                                    ends, else (no netem) `tbf rate RATE burst BURST latency
#                                    200ms`; sets qdisc to the one used; exit 1 if neither works
#   link_across NS BTL RPH VAR...    sets the array across: mpirun from namespace NS over TCP
#                                    on the veth, RPH ranks per host, exporting each VAR
#   link_bytes NS DEV                rx + tx bytes so far of DEV in namespace NS
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  awk 'NR > 1 && /^#/ {sub(/^# ?/, ""); print; next} NR > 1 {exit}' "$0"
  exit 0
fi
# shellcheck source=scripts/netns_hosts.sh
source scripts/netns_hosts.sh

link_check() {
  local why
  why=$(netns_check) || { echo "$1: $why"; exit 77; }
}

link_init() {
  link_check "$1"
  export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  export OMPI_MCA_mpi_yield_when_idle=1
  prefix="$2$$"
  # shellcheck disable=SC2034  # (used by the scripts that source this)
  A="$prefix-a" B="$prefix-b" V="$prefix-v"
  work=
  if [ -n "${3:-}" ]; then work=$(mktemp -d "$3"); fi
  trap link_cleanup EXIT
  trap 'exit 1' INT TERM
}

link_cleanup() {
  netns_down "$prefix" >/dev/null 2>&1 || true
  if [ -n "$work" ]; then rm -rf "$work"; fi
}

link_up() {
  local name=$1 prefix=$2 rate=$3 burst=$4
  shift 4
  if netns_up "$prefix" netem rate "$rate" "$@" 2>/dev/null; then
    qdisc="netem rate $rate $*"
  else
    netns_down "$prefix" >/dev/null 2>&1 || true
    qdisc="tbf rate $rate burst $burst latency 200ms"
    # shellcheck disable=SC2086
    netns_up "$prefix" $qdisc || { echo "$name: netns_hosts up failed"; exit 1; }
  fi
}

link_across() {
  local ns=$1 btl=$2 rph=$3 v
  shift 3
  # shellcheck disable=SC2054  # (commas inside MCA values)
  across=(ip netns exec "$ns" mpirun --oversubscribe --bind-to none --mca plm_rsh_agent "$(pwd)/scripts/netns_rsh"
          --mca btl "$btl" --mca btl_tcp_if_include "$NETNS_SUBNET"
          --mca oob_tcp_if_include "$NETNS_SUBNET")
  for v in "$@"; do across+=(-x "$v"); done
  across+=(--host "$NETNS_IP_A:$rph,$NETNS_IP_B:$rph" -np $((2 * rph)))
}

link_bytes() {
  echo $(($(ip netns exec "$1" cat "/sys/class/net/$2/statistics/rx_bytes") +
          $(ip netns exec "$1" cat "/sys/class/net/$2/statistics/tx_bytes")))
}
