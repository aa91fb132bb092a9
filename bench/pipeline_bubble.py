#!/usr/bin/env python3
"""The pipeline bubble from the profiler's traces of one pipelined GPT-2 run (issue 37).

  pipeline_bubble.py PROFILE_DIR --P P --M M [--V V] --schedule NAME --bounds "0 5 10"

PROFILE_DIR holds trace_rank<r>.json for r = 0..P-1 (pipeline degree P, one rank per stage);
--bounds is the trainer's line "stage bounds (schedule positions) ..." (P*V + 1 numbers).
Prints one JSON line:
  wall      per profiled step, 1 - sum over ranks of compute busy / (P * window), where busy is
            the summed duration of the rank's forward / backward / backward_weight / recompute
            actions inside the pipeline segment and window runs from the first rank's segment
            start to the last rank's segment end (one clock for all ranks on one machine);
            wall_rank: per rank 1 - busy / its own segment; wall_step: per rank
            1 - busy / its whole optimizer step (the "step" action: grad norm and optimizer in)
  replay    the same ops replayed with their measured durations, each rank one core, no
            communication time: every rank runs its ops in the traced order, F(m, g) after
            F(m, g-1), B/I(m, g) after B/I(m, g+1); 1 - sum busy / (P * makespan). This is the
            bubble in compute-action time (what oversubscribed ranks still measure honestly).
  theory    (P-1)/(M+P-1) for GPipe / 1F1B, (P-1)/(V M+P-1) for Interleaved1F1B,
            (P-1)/(3 V M+P-1) for InterleavedZeroBubble (sharding/pipeline_schedule.h: f = i = w)
Ops are cut from the trace's compute actions: a forward op is a run of forwards of one chunk
with rising schedule positions, a backward op one of backwards with falling positions, each
backward_weight an op of its own (the zero-bubble W). A micro-batch is counted per
(kind, chunk) in order; positions are GPT-2's (embed_head call 0, h.0 .. h.L-1, embed_head
call 1).
"""
import argparse
import json
import statistics
import sys

COMPUTE = {"forward", "backward", "backward_weight", "recompute"}  # busy time


def load(path):
    d = json.load(open(path))
    ev = d["traceEvents"] if isinstance(d, dict) else d
    return [e for e in ev if e.get("ph") == "X"]


def position(e, L):
    name, call = e["name"], e["args"].get("call", 0)
    unit = name.split(" ", 1)[1] if " " in name else ""
    if unit == "embed_head":
        return 0 if call == 0 else L + 1
    if unit.startswith("h."):
        return int(unit[2:]) + 1
    raise SystemExit(f"pipeline_bubble: unknown unit in '{name}' (GPT-2 only)")


def stage_of(pos, bounds):
    for g in range(len(bounds) - 1):
        if bounds[g] <= pos < bounds[g + 1]:
            return g
    raise SystemExit(f"pipeline_bubble: position {pos} outside the bounds {bounds}")


def cut_ops(acts, rank, P, bounds, L):
    """acts: this rank's compute actions of one step's pipeline segment, in order."""
    ops = []  # [kind, chunk, micro, dur]
    prev = None  # (kind, chunk, pos)
    for e in acts:
        kind = e["name"].split(" ")[0]
        dur = e["dur"] * 1e-6
        if kind == "backward_weight":
            ops.append(["W", -1, -1, dur])
            prev = None
            continue
        if kind == "recompute":
            raise SystemExit("pipeline_bubble: recompute actions (activation checkpointing) are "
                             "not cut into ops; profile without checkpointing")
        pos = position(e, L)
        g = stage_of(pos, bounds)
        chunk = g // P
        if g % P != rank:
            raise SystemExit(f"pipeline_bubble: rank {rank} ran position {pos} of stage {g}")
        k = "F" if kind == "forward" else "B"
        same = (prev is not None and prev[0] == k and prev[1] == chunk
                and (pos > prev[2] if k == "F" else pos < prev[2]))
        if same:
            ops[-1][3] += dur
        else:
            ops.append([k, chunk, -1, dur])
        prev = (k, chunk, pos)
    seen = {}
    for op in ops:
        if op[0] == "W":
            continue
        key = (op[0], op[1])
        op[2] = seen.get(key, 0)
        seen[key] = op[2] + 1
    return ops


def replay(orders, P, V):
    """orders[r]: ops of rank r. Returns (makespan, busy per rank)."""
    G = P * V
    done = {}  # (kind, micro, stage) -> end time
    ptr = [0] * P
    free = [0.0] * P
    busy = [sum(o[3] for o in orders[r]) for r in range(P)]
    total = sum(len(o) for o in orders)
    finished = 0
    while finished < total:
        progressed = False
        for r in range(P):
            while ptr[r] < len(orders[r]):
                kind, chunk, micro, dur = orders[r][ptr[r]]
                deps = []
                if kind in ("F", "B"):
                    g = chunk * P + r
                    if kind == "F" and g > 0:
                        deps.append(("F", micro, g - 1))
                    if kind == "B":
                        deps.append(("F", micro, g))
                        if g < G - 1:
                            deps.append(("B", micro, g + 1))
                if any(d not in done for d in deps):
                    break
                start = max([free[r]] + [done[d] for d in deps])
                free[r] = start + dur
                if kind in ("F", "B"):
                    done[(kind, micro, chunk * P + r)] = free[r]
                ptr[r] += 1
                finished += 1
                progressed = True
        if not progressed:
            raise SystemExit(f"pipeline_bubble: replay deadlock at {ptr} (ops cut wrongly?)")
    return max(free), busy


def theory(schedule, P, V, M):
    if schedule in ("GPipe", "1F1B"):
        return (P - 1) / (M + P - 1)
    if schedule == "Interleaved1F1B":
        return (P - 1) / (V * M + P - 1)
    if schedule == "InterleavedZeroBubble":
        return (P - 1) / (3 * V * M + P - 1)
    raise SystemExit(f"pipeline_bubble: unknown schedule {schedule}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("profile")
    ap.add_argument("--P", type=int, required=True)
    ap.add_argument("--V", type=int, default=1)
    ap.add_argument("--M", type=int, required=True)
    ap.add_argument("--schedule", required=True)
    ap.add_argument("--bounds", required=True)
    a = ap.parse_args()
    bounds = [int(x) for x in a.bounds.split()]
    if len(bounds) != a.P * a.V + 1:
        raise SystemExit(f"pipeline_bubble: {len(bounds)} bounds for P={a.P} V={a.V}")
    L = bounds[-1] - 2
    traces = [load(f"{a.profile}/trace_rank{r}.json") for r in range(a.P)]
    steps = sorted({e["args"]["step"] for e in traces[0] if e["name"] == "pipeline"})
    out = {"schedule": a.schedule, "P": a.P, "V": a.V, "M": a.M, "steps": steps,
           "theory": theory(a.schedule, a.P, a.V, a.M)}
    walls, wall_rank, wall_step, replays, replay_rank, ops_per_rank = [], [], [], [], [], None
    for s in steps:
        segs, busy, orders, stept = [], [], [], []
        for r, ev in enumerate(traces):
            seg = [e for e in ev if e["name"] == "pipeline" and e["args"]["step"] == s][0]
            st = [e for e in ev if e["name"] == "step" and e["args"]["step"] == s][0]
            b0, b1 = seg["ts"], seg["ts"] + seg["dur"]
            acts = [e for e in ev if e["tid"] == seg["tid"] and e["args"]["step"] == s
                    and e["name"].split(" ")[0] in COMPUTE and b0 <= e["ts"] <= b1]
            acts.sort(key=lambda e: e["ts"])
            segs.append((b0, b1))
            busy.append(sum(e["dur"] for e in acts) * 1e-6)
            stept.append(st["dur"] * 1e-6)
            orders.append(cut_ops(acts, r, a.P, bounds, L))
        window = (max(x[1] for x in segs) - min(x[0] for x in segs)) * 1e-6
        walls.append(1 - sum(busy) / (a.P * window))
        wall_rank.append([1 - busy[r] / ((segs[r][1] - segs[r][0]) * 1e-6) for r in range(a.P)])
        wall_step.append([1 - busy[r] / stept[r] for r in range(a.P)])
        mk, rb = replay(orders, a.P, a.V)
        replays.append(1 - sum(rb) / (a.P * mk))
        replay_rank.append([1 - b / mk for b in rb])
        ops_per_rank = [len(o) for o in orders]
        out.setdefault("busy_s", []).append([round(b, 4) for b in busy])
        out.setdefault("window_s", []).append(round(window, 4))
        out.setdefault("makespan_s", []).append(round(mk, 4))
    med = statistics.median
    out["wall"] = round(med(walls), 4)
    out["wall_rank"] = [round(med(w[r] for w in wall_rank), 4) for r in range(a.P)]
    out["wall_step"] = [round(med(w[r] for w in wall_step), 4) for r in range(a.P)]
    out["replay"] = round(med(replays), 4)
    out["replay_rank"] = [round(med(w[r] for w in replay_rank), 4) for r in range(a.P)]
    out["ops_per_rank"] = ops_per_rank
    out["theory"] = round(out["theory"], 4)
    print(json.dumps(out))


if __name__ == "__main__":
    sys.exit(main())
