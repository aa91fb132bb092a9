"""Two SHARDWISE_CUDA_OP_TIMES tables side by side, per step: each op's (and part's) device
milliseconds per step in OLD and NEW, the difference, and the ratio, largest change first;
then the totals. Ops named differently in the two (a *_set form replacing its accumulating
op, say) appear on rows of their own.

    python3 bench/op_times_diff.py OLD.tsv NEW.tsv [--steps-old 5] [--steps-new 5]

The tables are the ones bench/gpu_vs_torch.sh writes (op_times_MODEL.tsv): tab-separated op,
calls, total_ms, ...; parts are indented under their op."""
import argparse
import sys


def read(path):
    ops = {}
    with open(path) as f:
        for line in f:
            if line.startswith("#") or line.startswith("op\t") or not line.strip():
                continue
            cols = line.rstrip("\n").split("\t")
            if len(cols) < 3:
                continue
            name = cols[0].strip()
            part = cols[0].startswith(" ")
            try:
                ops[name] = (float(cols[2]), part)
            except ValueError:
                continue
    return ops


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--steps-old", type=float, default=5)
    ap.add_argument("--steps-new", type=float, default=5)
    a = ap.parse_args()
    old, new = read(a.old), read(a.new)
    if not old or not new:
        sys.exit("op_times_diff: no op rows in " + (a.old if not old else a.new))
    rows = []
    for name in sorted(set(old) | set(new)):
        o = old.get(name, (0.0, False))
        n = new.get(name, (0.0, False))
        rows.append((name, o[0] / a.steps_old, n[0] / a.steps_new, o[1] or n[1]))
    rows.sort(key=lambda r: -abs(r[2] - r[1]))
    print(f"{'op (ms per step)':40} {'old':>9} {'new':>9} {'new-old':>9} {'new/old':>8}")
    for name, o, n, part in rows:
        ratio = f"{n / o:8.2f}" if o > 0 else f"{'-':>8}"
        label = ("  " if part else "") + name
        print(f"{label:40} {o:9.2f} {n:9.2f} {n - o:9.2f} {ratio}")
    to = sum(o for _, o, _, p in rows if not p)
    tn = sum(n for _, _, n, p in rows if not p)
    print(f"{'all ops (parts not added)':40} {to:9.2f} {tn:9.2f} {tn - to:9.2f} {tn / to:8.2f}")


main()
