#!/bin/bash
# The C++ facade (shardwise/trainer.h) under `mpirun -np 2` against `mpirun -np 2 shardwise
# train` on the same JSON (label mpi). Usage: mpi_trainer_api.sh SHARDWISE FACADE_BIN MPIEXEC
# [mpirun flags...]
#   1. the facade's RunConfig made in code (test_trainer_api_mpi.cpp) and tiny_gpt_config's
#      file: metrics.jsonl's losses, grad norms and validation losses equal bitwise, and what
#      each rank's callback saw equals them too
#   2. rank 1 alone asks to stop at step 5: both ranks stop there, 5 metrics lines, step_5 saved
#   3. rank 1's callback throws at step 3: exit 1, one line with its text and "step 3", and
#      step_2 (saved before) still resumes: `shardwise train --resume` runs steps 3-8 as the
#      uninterrupted run did, bitwise
set -u
api=$2
set -- "$1" "${@:3}"
source "$(dirname "${BASH_SOURCE[0]}")/mpi_common.sh" mpi_trainer_api "$@"
py=/usr/bin/python3

prepare_text 4000
tiny_gpt_config "$work/cfg.json"
export OMP_NUM_THREADS=1
timeout 120 "${mpirun[@]}" -np 2 "$sw" train "$work/cfg.json" --quiet --set run_dir="$work/cli" \
  >"$work/cli.log" 2>&1 || { cat "$work/cli.log"; fail "shardwise train: exit status $?"; }
timeout 120 "${mpirun[@]}" -np 2 "$api" "$work" "$work/api" >"$work/api.log" 2>&1 ||
  { cat "$work/api.log"; fail "facade: exit status $?"; }
timeout 120 "${mpirun[@]}" -np 2 "$api" "$work" "$work/stop" stop 1 5 >"$work/stop.log" 2>&1 ||
  { cat "$work/stop.log"; fail "facade with a stop on rank 1: exit status $?"; }
[ -f "$work/stop/checkpoints/step_5/metadata.json" ] || fail "no checkpoint step_5 after the stop"
timeout 120 "${mpirun[@]}" -np 2 "$api" "$work" "$work/throw" throw 1 3 >"$work/throw.log" 2>&1 &&
  { cat "$work/throw.log"; fail "a throwing callback: exit status 0"; }
grep -q "step 3: rank 1 gave up" "$work/throw.log" || { cat "$work/throw.log"; fail "no line naming step 3 and the text"; }
[ "$(cat "$work/throw/checkpoints/latest")" = step_2 ] || fail "latest is not step_2 after the throw"
timeout 120 "${mpirun[@]}" -np 2 "$sw" train "$work/cfg.json" --quiet --set run_dir="$work/resumed" \
  --resume "$work/throw/checkpoints" >"$work/resumed.log" 2>&1 ||
  { cat "$work/resumed.log"; fail "resume from the checkpoint before the throw: exit status $?"; }

"$py" - "$work" <<'PY' || exit 1
import json, sys
work = sys.argv[1]
def metrics(run):
    return [json.loads(l) for l in open(f"{work}/{run}/metrics.jsonl")]
def steps(run, r):
    return [[float(x) for x in l.split()] for l in open(f"{work}/{run}.steps_rank{r}")]
cli, api, stop, resumed = metrics("cli"), metrics("api"), metrics("stop"), metrics("resumed")
bad = []
if len(cli) != 8 or len(api) != 8: bad.append(f"lines: cli {len(cli)}, api {len(api)}")
for c, a in zip(cli, api):
    for k in ("loss", "grad_norm", "lr", "val_loss"):
        if c.get(k) != a.get(k): bad.append(f"step {c['step']} {k}: cli {c.get(k)} api {a.get(k)}")
for r in (0, 1):
    for (s, loss, norm), c in zip(steps("api", r), cli):
        if (s, loss, norm) != (c["step"], c["loss"], c["grad_norm"]):
            bad.append(f"rank {r} callback step {s}: {loss} {norm} vs {c['loss']} {c['grad_norm']}")
    if len(steps("stop", r)) != 5: bad.append(f"stop: rank {r} saw {len(steps('stop', r))} steps")
if len(stop) != 5 or [m["loss"] for m in stop] != [m["loss"] for m in cli[:5]]:
    bad.append(f"stop: {len(stop)} metrics lines, or losses differ from the full run's")
if [m["step"] for m in resumed] != list(range(3, 9)) or any(
        m["loss"] != cli[m["step"] - 1]["loss"] for m in resumed):
    bad.append("resumed after the throw: steps or losses differ from the uninterrupted run's")
if bad:
    print("mpi_trainer_api: FAIL:\n  " + "\n  ".join(bad)); sys.exit(1)
print("mpi_trainer_api: ok (8 steps bitwise on 2 ranks; a stop on rank 1 stopped both at step 5;"
      " a throw on rank 1 ended the job at step 3, and step_2 resumed bitwise)")
PY
