#!/usr/bin/env python3
"""PyTorch DistributedDataParallel peer for `mpirun -np N bench_step`: N processes (spawned
here, gloo over localhost), each training the GPT-2-style model of torch_step.py on its own
micro-batch of B rows with `threads` threads, DDP's bucketed gradient all-reduce overlapping
backward. Prints one JSON line: tokens/s counts all ranks (N*B*T per step), step_s is rank 0's
median, peak_rss_mib the largest resident set of any rank.

Run with Debian's torch: /usr/bin/python3 bench/torch_ddp.py --ranks 2 --threads 1 ...
(OMP_WAIT_POLICY=PASSIVE, as for torch_step.py)."""
import argparse
import json
import os
import resource
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_step import GPT, add_shape_args  # noqa: E402  (same model, initialisation, flags)


def worker(rank, a, port, out):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(a.threads)
    dist.init_process_group("gloo", rank=rank, world_size=a.ranks)
    torch.manual_seed(0)  # the same initial weights on every rank
    model = GPT(a.vocab, a.d, a.layers, a.heads, a.T)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-4, weight_decay=0.1)
    g = torch.Generator().manual_seed(1 + rank)
    idx = torch.randint(0, a.vocab, (a.B, a.T), generator=g)
    tgt = torch.randint(0, a.vocab, (a.B, a.T), generator=g)
    times = []
    for i in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = ddp(idx, tgt)
        loss.backward()
        opt.step()
        if i >= a.warmup:
            times.append(time.perf_counter() - t0)
    rss = torch.tensor([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0])
    dist.all_reduce(rss, op=dist.ReduceOp.MAX)
    if rank == 0:
        times.sort()
        med = times[len(times) // 2]
        n_params = sum(p.numel() for p in model.parameters())
        out.put({"peer": "pytorch-ddp " + torch.__version__, "ranks": a.ranks,
                 "threads": a.threads, "params": n_params, "step_s": med,
                 "tokens_per_s": a.ranks * a.B * a.T / med, "loss": float(loss),
                 "peak_rss_mib": float(rss[0])})
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=2)
    add_shape_args(ap, threads=1)
    ap.add_argument("--port", type=int, default=29517)
    a = ap.parse_args()
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    mp.start_processes(worker, args=(a, a.port, out), nprocs=a.ranks, join=True,
                       start_method="spawn")
    print(json.dumps(out.get()))


if __name__ == "__main__":
    main()
