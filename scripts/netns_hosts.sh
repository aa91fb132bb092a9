#!/usr/bin/env bash
# Two "hosts" on one machine: two network namespaces joined by a veth pair (root only).
#
#   netns_hosts.sh up PREFIX [QDISC...]   create PREFIX-a (10.231.0.1) and PREFIX-b (10.231.0.2),
#                                         joined by the veth PREFIX-v (same name on both sides);
#                                         QDISC, if given, is a root qdisc for both ends, e.g.
#                                         `netem delay 20ms loss 1%` (needs sch_netem in the
#                                         kernel) or `tbf rate 4mbit burst 4kb latency 20ms`
#   netns_hosts.sh cut PREFIX             take the link down on host a's side (a partition)
#   netns_hosts.sh down PREFIX            kill every process left in either namespace (by pid),
#                                         delete both namespaces (which deletes the veth pair)
#   netns_hosts.sh check                  exit 0 if namespaces can be made here, else 77 with
#                                         a line saying why
#
# The addresses are the same for every PREFIX: each pair lives in its own two namespaces, so
# two pairs never see each other. PREFIX should be short (the veth name is PREFIX-v, at most
# 15 characters). scripts/netns_rsh is the rsh agent that lets `mpirun --host` (run inside
# PREFIX-a) start orted inside PREFIX-b.
set -u
NETNS_SUBNET=10.231.0.0/24
NETNS_IP_A=10.231.0.1
NETNS_IP_B=10.231.0.2

netns_check() {
  if [ "$(id -u)" -ne 0 ]; then
    echo "netns_hosts: network namespaces need root (uid $(id -u))"
    return 77
  fi
  command -v ip >/dev/null || { echo "netns_hosts: no 'ip' command (iproute2)"; return 77; }
  local probe="swprobe$$"
  if ! ip netns add "$probe" 2>/dev/null; then
    echo "netns_hosts: 'ip netns add' is not permitted here"
    return 77
  fi
  ip netns del "$probe"
  return 0
}

netns_up() {  # PREFIX [QDISC...]
  local p=$1
  shift
  local a="$p-a" b="$p-b" v="$p-v"
  ip netns add "$a" || return 1
  ip netns add "$b" || { ip netns del "$a"; return 1; }
  # Both ends are created straight inside their namespaces, so the name may be the same.
  ip link add "$v" netns "$a" type veth peer name "$v" netns "$b" || return 1
  ip -n "$a" addr add "$NETNS_IP_A/24" dev "$v" &&
    ip -n "$b" addr add "$NETNS_IP_B/24" dev "$v" &&
    ip -n "$a" link set lo up && ip -n "$b" link set lo up &&
    ip -n "$a" link set "$v" up && ip -n "$b" link set "$v" up || return 1
  if [ $# -gt 0 ]; then
    ip netns exec "$a" tc qdisc add dev "$v" root "$@" &&
      ip netns exec "$b" tc qdisc add dev "$v" root "$@" || return 1
  fi
  # The link is up once both ends have a carrier (veth's comes up asynchronously).
  local i
  for i in $(seq 1 50); do
    ip -n "$a" -o link show "$v" | grep -q LOWER_UP && ip -n "$b" -o link show "$v" | grep -q LOWER_UP &&
      return 0
    sleep 0.1
  done
  echo "netns_hosts: the link $v did not come up"
  return 1
}

netns_cut() {  # PREFIX
  ip -n "$1-a" link set "$1-v" down
}

netns_down() {  # PREFIX
  local p=$1 ns pids
  for ns in "$p-a" "$p-b"; do
    ip netns list 2>/dev/null | grep -q "^$ns\b" || continue
    # Deleting a namespace does not end the processes in it: end them first, by pid.
    pids=$(ip netns pids "$ns" 2>/dev/null)
    [ -n "$pids" ] && kill -9 $pids 2>/dev/null
  done
  sleep 0.2
  for ns in "$p-a" "$p-b"; do
    ip netns list 2>/dev/null | grep -q "^$ns\b" && ip netns del "$ns"
  done
  return 0
}

# Sourced by the tests: define the functions only.
if [ "${BASH_SOURCE[0]}" != "$0" ]; then return 0; fi

case "${1:-}" in
  check) netns_check ;;
  up) shift; netns_up "$@" ;;
  cut) netns_cut "$2" ;;
  down) netns_down "$2" ;;
  *) sed -n '2,18p' "$0"; exit 2 ;;
esac
