#!/bin/bash
# Two hosts on one machine (label mpi): two network namespaces joined by a veth pair
# (scripts/netns_hosts.sh), mpirun inside the first, orted started in the second through
# scripts/netns_rsh, every byte between the hosts over TCP on the veth (btl tcp,self).
# Usage: twohost.sh MODE SHARDWISE MPIEXEC [mpirun flags...]; MODE is one of
#   parity     FULL_SHARD over 2 ranks (one per host) and HYBRID_SHARD over 4 (2 per host,
#              shard_group_size 2: shard inside a host, replicate across) equal one rank;
#              so does tensor 2 x FULL_SHARD 2 over 4 (2 per host: each tensor group inside a
#              host); with a batch whose activations outweigh the parameters (16 rows a data
#              rank), fewer bytes cross the link than with the ranks placed round-robin
#              (--map-by node: the tensor groups then cross the link, the data groups do not)
#   lossy      both runs again over a slow, lossy link: `netem delay 20ms loss 1%` on both ends,
#              or, where the kernel has no netem, `tbf rate 4mbit burst 4kb latency 20ms` (drops)
#   partition  the link taken down mid-run (FULL_SHARD over 2 ranks, then HYBRID_SHARD over 4;
#              comm_timeout_s 5): every rank prints its watchdog line naming unreachable ranks within
#              comm_timeout_s + 10 s (read from its own output file, written on its own host),
#              exits non-zero, mpirun returns (scripts/mpirun_guard.sh) and no orted, rank or
#              launcher is left in either namespace
#   slowlink   issue 38 across the hosts (2 per host, HYBRID 2 x 2: shard inside a host, replica
#              groups across; the link at tbf 100 Mbit/s): FedAvg with one inner SGD step
#              (local_sgd.sync_every 1, outer lr 1, no momentum) equals HYBRID with that SGD
#              (losses and exported weights within 1e-5); streaming DiLoCo (2 fragments, the
#              update one step late, int8 pseudo-gradients, int8 gradients inside each replica)
#              resumed from its step-3 and step-6 checkpoints equals the uninterrupted run
#              bitwise (every later loss, every exported weight)
# Exits 77 (skipped) where namespaces cannot be made (not root, no CAP_SYS_ADMIN).
set -u
mode=$1 sw=$2 mpiexec=$3
shift 3
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
scripts=$(cd "$here/../../scripts" && pwd)
source "$scripts/netns_hosts.sh"
name="twohost_$mode"
fail() { echo "$name: FAIL: $*"; exit 1; }

why=$(netns_check) || { echo "$name: SKIP: $why"; exit 77; }
prefix="sw$$"
A="$prefix-a" B="$prefix-b" V="$prefix-v"
work=$(mktemp -d)
cleanup() {
  netns_down "$prefix"
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

source "$here/../common/text_run.sh"
prepare_text 4000
tiny_gpt_config "$work/cfg.json"
export OMP_NUM_THREADS=1

# mpirun inside host a, ranks placed by --host; all MPI and ORTE traffic on the veth's subnet.
across=(ip netns exec "$A" "$mpiexec" "$@" --mca plm_rsh_agent "$scripts/netns_rsh"
        --mca btl tcp,self --mca btl_tcp_if_include "$NETNS_SUBNET"
        --mca oob_tcp_if_include "$NETNS_SUBNET" -x OMP_NUM_THREADS)
hosts2="$NETNS_IP_A:1,$NETNS_IP_B:1" hosts4="$NETNS_IP_A:2,$NETNS_IP_B:2"
full=(--set train_micro_batch_size_per_gpu=2 --set sharding_strategy=FULL_SHARD)
hybrid=(--set train_micro_batch_size_per_gpu=1 --set sharding_strategy=HYBRID_SHARD
        --set shard_group_size=2)
train_across() {  # name hosts np overrides... ($map: extra mpirun placement flags)
  local name=$1 hosts=$2 np=$3
  shift 3
  timeout 300 "${across[@]}" ${map:-} --host "$hosts" -np "$np" \
    "$sw" train "$work/cfg.json" --quiet --set run_dir="$work/$name" "$@" >"$work/$name.log" 2>&1
  local rc=$?
  [ "$rc" -eq 0 ] || { cat "$work/$name.log"; fail "$name: exit status $rc"; }
}
veth_bytes() { ip netns exec "$B" cat "/sys/class/net/$V/statistics/rx_bytes"; }

compare() {  # runs... : losses, grad norms, val losses and exported weights against r1
  PYTHONPATH="$here/../common" /usr/bin/python3 - "$work" "$@" <<'PY' || exit 1
import sys
import numpy as np
import run_files
work, names = sys.argv[1], sys.argv[2:]
def metrics(run): return run_files.metrics(work, run)
def weights(run): return run_files.weights(work, run)
ref, wref = metrics("r1"), weights("r1")
bad = []
for run in names:
    m, w = metrics(run), weights(run)
    if len(m) != len(ref):
        bad.append(f"{run}: {len(m)} metrics lines, expected {len(ref)}")
        continue
    for a, b in zip(m, ref):
        for key, tol in (("loss", 1e-5), ("grad_norm", 1e-4), ("val_loss", 1e-5)):
            if key in b and abs(a[key] - b[key]) > tol * abs(b[key]):
                bad.append(f"{run} step {b['step']}: {key} {a[key]} vs one rank {b[key]}")
    if sorted(w) != sorted(wref):
        bad.append(f"{run}: exported tensors differ in names")
        continue
    worst = max(float(np.max(np.abs(w[k] - wref[k]))) for k in w)
    if worst > 1e-4:
        bad.append(f"{run}: exported weights differ by up to {worst}")
    rel = max(abs(a["loss"] - b["loss"]) / abs(b["loss"]) for a, b in zip(m, ref))
    print(f"twohost: {run}: final loss {m[-1]['loss']:.6f} (one rank {ref[-1]['loss']:.6f}), "
          f"max relative loss difference {rel:.1e}, weights within {worst:.1e}")
if bad:
    print("twohost: FAIL:\n  " + "\n  ".join(bad))
    sys.exit(1)
PY
}

"$sw" train "$work/cfg.json" --quiet >"$work/r1.log" 2>&1 || { cat "$work/r1.log"; fail "one-rank run"; }

# partition_run TAG HOSTS NP OVERRIDES...: a fresh pair of hosts, a long run, the link cut after
# 3 steps; checks and prints the figures.
partition_run() {
  local tag=$1 hosts=$2 np=$3
  shift 3
  netns_up "$prefix" || fail "netns_hosts up"
  timeout_s=5
  # ssh-like keepalives for the agent (10 s: after the ranks' own detection, which ends
  # at about timeout_s + 2 x grace = 7.5 s); the guard ends mpirun 5 s after the abort.
  export NETNS_RSH_ALIVE="2 5"
  mkdir -p "$work/out_$tag"
  timeout 120 "$scripts/mpirun_guard.sh" -g 5 "${across[@]}" --host "$hosts" -np "$np" \
    --output-filename "$work/out_$tag" \
    "$sw" train "$work/cfg.json" --quiet --set run_dir="$work/cut_$tag" "$@" \
    --set train_steps=1000000 --set eval_every_steps=0 --set log_every_steps=1 \
    --set comm_timeout_s=$timeout_s >"$work/cut_$tag.log" 2>&1 &
  job=$!
  # Cut once a few steps have run.
  while [ "$(cat "$work/cut_$tag/metrics.jsonl" 2>/dev/null | wc -l)" -lt 3 ]; do
    kill -0 "$job" 2>/dev/null || { cat "$work/cut_$tag.log"; fail "the run ended before the cut"; }
    sleep 0.05
  done
  tcut=$(date +%s.%N)
  netns_cut "$prefix"
  # Each rank's detection time: when its own output file (written on its own host) first
  # holds its watchdog line.
  local -A seen=()
  while kill -0 "$job" 2>/dev/null; do
    for r in $(seq 0 $((np - 1))); do
      [ -n "${seen[$r]:-}" ] && continue
      if grep -qs "did not complete within" "$work"/out_$tag/*/rank.$r/stderr; then
        seen[$r]=$(echo "$(date +%s.%N) - $tcut" | bc)
      fi
    done
    sleep 0.05
  done
  wait "$job"
  rc=$?
  tret=$(echo "$(date +%s.%N) - $tcut" | bc)
  [ "$rc" -ne 124 ] || { cat "$work/cut_$tag.log"; fail "mpirun did not return within 120 s"; }
  [ "$rc" -ne 0 ] || { cat "$work/cut_$tag.log"; fail "mpirun exited 0 after the partition"; }
  # Nothing of the job may stay behind on either host (the far side's orted is ended by the
  # agent's keepalive, as sshd's ClientAliveInterval would).
  left=
  for k in $(seq 1 100); do
    left=$(for ns in "$A" "$B"; do ip netns pids "$ns"; done | xargs -r ps -o comm= -p |
           grep -E "orted|shardwise|mpirun" | sort | uniq -c | tr -s ' \n' ' ')
    [ -z "$left" ] && break
    sleep 0.2
  done
  tclean=$(echo "$(date +%s.%N) - $tcut" | bc)
  [ -z "$left" ] || { cat "$work/cut_$tag.log"; fail "left running 20 s after mpirun returned: $left"; }
  report=
  for r in $(seq 0 $((np - 1))); do
    line=$(grep -hs "did not complete within" "$work"/out_$tag/*/rank.$r/stderr | head -1)
    [ -n "$line" ] || { cat "$work/cut_$tag.log"; fail "rank $r printed no watchdog line"; }
    echo "$line" | grep -q "ranks not reached: \[[0-9]" ||
      fail "rank $r names no unreachable rank: $line"
    d=${seen[$r]:-}
    [ -n "$d" ] && [ "$(echo "$d <= $timeout_s + 10" | bc)" = 1 ] ||
      fail "rank $r reported ${d:-after mpirun returned} s after the cut (limit $((timeout_s + 10)) s)"
    report+=" rank $r $(printf %.1f "$d") s ($(echo "$line" | sed 's/.*\(ranks not reached: \[[^]]*\]\).*/\1/'));"
  done
  echo "$name: $tag: detection after the cut:$report mpirun returned (status $rc) after $(printf %.1f "$tret") s," \
    "nothing left after $(printf %.1f "$tclean") s"
  netns_down "$prefix"
}

case $mode in
  parity)
    netns_up "$prefix" || fail "netns_hosts up"
    b0=$(veth_bytes)
    t0=$SECONDS
    train_across full "$hosts2" 2 "${full[@]}"
    bf=$(veth_bytes)
    t1=$SECONDS
    train_across hybrid "$hosts4" 4 "${hybrid[@]}"
    b1=$(veth_bytes)
    t2=$SECONDS
    tp=(--set train_micro_batch_size_per_gpu=2 --set sharding_strategy=FULL_SHARD
        --set parallelism.tensor_parallel_degree=2)
    train_across tensor "$hosts4" 4 "${tp[@]}"
    compare full hybrid tensor
    big=(--set train_micro_batch_size_per_gpu=16 --set train_steps=4 --set eval_every_steps=0)
    b2=$(veth_bytes)
    train_across tensor_in "$hosts4" 4 "${tp[@]}" "${big[@]}"
    b3=$(veth_bytes)
    map="--map-by node" train_across tensor_across "$hosts4" 4 "${tp[@]}" "${big[@]}"
    b4=$(veth_bytes)
    cmp <(cut -d, -f1-3 "$work/tensor_in/metrics.jsonl") \
        <(cut -d, -f1-3 "$work/tensor_across/metrics.jsonl") ||
      fail "tensor 2 x FULL_SHARD 2: the two placements' losses differ"
    # Every all-gather and reduce-scatter of the FULL_SHARD run crosses the link.
    [ "$((b1 - b0))" -gt 100000 ] || fail "only $((b1 - b0)) bytes crossed the veth"
    [ "$((b3 - b2))" -lt "$((b4 - b3))" ] ||
      fail "tensor 2 x FULL_SHARD 2: $((b3 - b2)) bytes crossed the veth with the tensor groups" \
        "inside the hosts, $((b4 - b3)) with them across"
    echo "$name: ok (FULL_SHARD 2 ranks $((t1 - t0)) s, HYBRID_SHARD 4 ranks $((t2 - t1)) s," \
      "$(((b1 - b0) / 1024)) KiB received by host b ($(((bf - b0) / 1024)) KiB for FULL_SHARD 2);" \
      "tensor 2 x FULL_SHARD 2 over 4 ranks, 16 rows a data rank: $(((b3 - b2) / 1024)) KiB" \
      "received by host b with the tensor groups inside the hosts, $(((b4 - b3) / 1024)) KiB" \
      "with them across)"
    ;;
  lossy)
    # A slow, lossy link: netem's delay and loss where the kernel has sch_netem; otherwise (this
    # VM's kernel has no netem) a token bucket at 4 Mbit/s whose 20 ms queue overflows: queueing
    # delay and tail drops, i.e. retransmissions, at every collective.
    link="netem delay 20ms loss 1%"
    if ! netns_up "$prefix" $link 2>"$work/tc.err"; then
      grep -q "qdisc kind is unknown" "$work/tc.err" || { cat "$work/tc.err"; fail "netns_hosts up with netem"; }
      echo "$name: this kernel has no netem qdisc; using tbf instead"
      netns_down "$prefix"
      link="tbf rate 4mbit burst 4kb latency 20ms"
      netns_up "$prefix" $link || fail "netns_hosts up with $link"
    fi
    t0=$SECONDS
    train_across link_full "$hosts2" 2 "${full[@]}"
    t1=$SECONDS
    train_across link_hybrid "$hosts4" 4 "${hybrid[@]}"
    compare link_full link_hybrid
    drops=$(ip netns exec "$A" tc -s qdisc show dev "$V" | sed -n 's/.*dropped \([0-9]*\).*/\1/p' | head -1)
    drops_b=$(ip netns exec "$B" tc -s qdisc show dev "$V" | sed -n 's/.*dropped \([0-9]*\).*/\1/p' | head -1)
    retrans=$(ip netns exec "$A" cat /proc/net/snmp | awk '/^Tcp:/ {n++; if (n == 1) for (i = 1; i <= NF; i++) h[i] = $i; else for (i = 1; i <= NF; i++) if (h[i] == "RetransSegs") print $i}')
    [ "${drops:-0}" -gt 0 ] || [ "${drops_b:-0}" -gt 0 ] || fail "the link dropped no packet ($link)"
    echo "$name: ok over '$link' (FULL_SHARD 2 ranks $((t1 - t0)) s, HYBRID_SHARD 4 ranks" \
      "$((SECONDS - t1)) s; dropped ${drops:-?} packets on host a, ${drops_b:-?} on host b;" \
      "host a retransmitted ${retrans:-?} TCP segments)"
    ;;
  slowlink)
    netns_up "$prefix" tbf rate 100mbit burst 256kb latency 200ms || fail "netns_hosts up with tbf"
    sgd=(--set optimizer.type=SGD --set optimizer.params.lr=0.05 --set optimizer.params.momentum=0
         --set optimizer.params.weight_decay=0 --set gradient_clipping=0)
    fedavg=(--set local_sgd.sync_every=1 --set local_sgd.outer_optimizer.params.lr=1
            --set local_sgd.outer_optimizer.params.momentum=0)
    train_across sl_hybrid "$hosts4" 4 "${hybrid[@]}" "${sgd[@]}"
    train_across sl_fedavg "$hosts4" 4 "${hybrid[@]}" "${sgd[@]}" "${fedavg[@]}"
    st=("${hybrid[@]}" --set local_sgd.sync_every=4 --set local_sgd.fragments=2
        --set local_sgd.fragment_sync_delay=1 --set local_sgd.outer_dtype=int8
        --set zero_optimization.zero_quantized_gradients=true
        --set zero_optimization.quantized_scope=all
        --set checkpoint.every_steps=3 --set checkpoint.keep_last=0)
    train_across sl_full "$hosts4" 4 "${st[@]}" --set checkpoint.dir="$work/ck_full"
    for at in 3 6; do
      mkdir -p "$work/ck_$at" && cp -r "$work/ck_full/step_$at" "$work/ck_$at/"
      train_across sl_from$at "$hosts4" 4 "${st[@]}" --set checkpoint.dir="$work/ck_$at" \
        --set checkpoint.resume=auto
    done
    PYTHONPATH="$here/../common" /usr/bin/python3 - "$work" <<'PY' || fail "slowlink"
import sys
import numpy as np
import run_files
work = sys.argv[1]
def metrics(run): return run_files.metrics(work, run)
def weights(run): return run_files.weights(work, run)
bad = []
m, r = metrics("sl_fedavg"), metrics("sl_hybrid")
rel = max(abs(a[k] - b[k]) / abs(b[k]) for a, b in zip(m, r) for k in ("loss", "val_loss") if k in b)
wa, wb = weights("sl_fedavg"), weights("sl_hybrid")
dw = max(float(np.max(np.abs(wa[k] - wb[k]))) for k in wb)
print(f"twohost: FedAvg H=1 vs HYBRID across hosts: losses within {rel:.1e} relative, weights within {dw:.1e}")
if len(m) != len(r) or rel > 1e-5 or dw > 1e-5:
    bad.append(f"FedAvg H=1 differs from HYBRID: {rel:.1e} relative loss, {dw:.1e} weights")
full, wf = metrics("sl_full"), weights("sl_full")
for at in (3, 6):
    got = [(x["step"], x["loss"]) for x in metrics(f"sl_from{at}")]
    want = [(x["step"], x["loss"]) for x in full if x["step"] > at]
    w = weights(f"sl_from{at}")
    same = sum(np.array_equal(w[k], wf[k]) for k in wf)
    print(f"twohost: streaming DiLoCo resumed at step {at}: losses {'equal' if got == want else 'DIFFER'}, "
          f"{same}/{len(wf)} weights equal bitwise")
    if got != want or same != len(wf):
        bad.append(f"resumed at {at}: not bitwise equal to the uninterrupted run")
if bad:
    print("twohost: FAIL: " + "; ".join(bad)); sys.exit(1)
PY
    echo "$name: ok"
    ;;
  partition)
    partition_run FULL_SHARD "$hosts2" 2 "${full[@]}"
    partition_run HYBRID_SHARD "$hosts4" 4 "${hybrid[@]}"
    ;;
  *) fail "unknown mode $mode" ;;
esac
