#!/usr/bin/env python3
"""Writes tests/sharding/data/optimizer_reference.json: the parameters after 1 and 50 steps
of each optimizer configuration below on fixed gradients, computed by PyTorch (fp32, CPU):
torch.optim.SGD itself for SGD; for LARS and Lamb, whose torch versions do not exist, the
published formulas written out here (LARS: LARC / timm's trust ratio with biases and norms
excluded; Lamb: DeepSpeed's FusedLamb kernel). test_optimizers.cpp reads the file and compares
Shardwise's updates with it. Run with Debian's python3-torch: /usr/bin/python3 <this file>.

Parameters and gradients are dyadic rationals given by integer formulas (param_init, grad_at),
which the C++ test evaluates the same way, so both sides start from identical bits."""
import json
import os

import torch

# (name, shape, weight decay applies): two units of two tensors each, as the test's model.
TENSORS = [("a.w", (7, 13), True), ("a.b", (13,), False), ("b.w", (5, 11), True),
           ("b.g", (11,), False)]
STEPS = 50
SAVE_AT = (1, 50)

CONFIGS = [
    {"name": "sgd_momentum", "type": "SGD", "lr": 0.05, "momentum": 0.9, "dampening": 0.0,
     "nesterov": False, "weight_decay": 0.01, "grad_mult": 1.0},
    {"name": "sgd_nesterov", "type": "SGD", "lr": 0.02, "momentum": 0.8, "dampening": 0.0,
     "nesterov": True, "weight_decay": 0.05, "grad_mult": 0.5},
    {"name": "sgd_dampening", "type": "SGD", "lr": 0.1, "momentum": 0.5, "dampening": 0.3,
     "nesterov": False, "weight_decay": 0.0, "grad_mult": 1.0},
    {"name": "sgd_plain", "type": "SGD", "lr": 0.1, "momentum": 0.0, "dampening": 0.0,
     "nesterov": False, "weight_decay": 0.0, "grad_mult": 1.0},
    {"name": "lars", "type": "LARS", "lr": 0.5, "momentum": 0.9, "dampening": 0.0,
     "nesterov": False, "weight_decay": 0.01, "trust_coefficient": 0.02, "eps": 1e-8,
     "grad_mult": 0.5},
    {"name": "lars_nesterov", "type": "LARS", "lr": 1.0, "momentum": 0.9, "dampening": 0.0,
     "nesterov": True, "weight_decay": 0.0005, "trust_coefficient": 0.001, "eps": 1e-8,
     "grad_mult": 1.0},
    {"name": "lamb", "type": "Lamb", "lr": 0.01, "beta1": 0.9, "beta2": 0.999, "eps": 1e-6,
     "weight_decay": 0.01, "max_coeff": 10.0, "min_coeff": 0.01, "bias_correction": True,
     "grad_mult": 1.0},
    {"name": "lamb_clamped", "type": "Lamb", "lr": 0.02, "beta1": 0.8, "beta2": 0.99,
     "eps": 1e-8, "weight_decay": 0.1, "max_coeff": 0.5, "min_coeff": 0.3,
     "bias_correction": False, "grad_mult": 0.25},
]


def param_init(k, i):
    return ((i * 37 + k * 11) % 41 - 20) / 32.0


def grad_at(k, i, t):
    return ((i * 13 + k * 7 + t * 29) % 31 - 15) / 64.0


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def initial():
    return [torch.tensor([param_init(k, i) for i in range(numel(s))], dtype=torch.float32)
            for k, (_, s, _) in enumerate(TENSORS)]


def grads(t, mult):
    return [torch.tensor([grad_at(k, i, t) for i in range(numel(s))], dtype=torch.float32) * mult
            for k, (_, s, _) in enumerate(TENSORS)]


def run_sgd(c):
    ps = [torch.nn.Parameter(p) for p in initial()]
    decay = [p for p, (_, _, d) in zip(ps, TENSORS) if d]
    rest = [p for p, (_, _, d) in zip(ps, TENSORS) if not d]
    opt = torch.optim.SGD([{"params": decay, "weight_decay": c["weight_decay"]},
                           {"params": rest, "weight_decay": 0.0}], lr=c["lr"],
                          momentum=c["momentum"], dampening=c["dampening"],
                          nesterov=c["nesterov"])
    out = {}
    for t in range(1, STEPS + 1):
        for p, g in zip(ps, grads(t, c["grad_mult"])):
            p.grad = g
        opt.step()
        if t in SAVE_AT:
            out[t] = [p.detach().clone() for p in ps]
    return out


def run_lars(c):
    ps = initial()
    bufs = [None] * len(ps)
    mom, damp, wd, eta, eps = c["momentum"], c["dampening"], c["weight_decay"], \
        c["trust_coefficient"], c["eps"]
    out = {}
    for t in range(1, STEPS + 1):
        for k, g in enumerate(grads(t, c["grad_mult"])):
            p = ps[k]
            if TENSORS[k][2]:  # biases and norms (no weight decay) are excluded
                w_norm, g_norm = p.norm(2.0), g.norm(2.0)
                trust = eta * w_norm / (g_norm + wd * w_norm + eps) \
                    if w_norm > 0 and g_norm > 0 else torch.tensor(1.0)
                d = (g + wd * p) * trust
            else:
                d = g.clone()
            if mom != 0:
                if bufs[k] is None:
                    bufs[k] = d.clone()
                else:
                    bufs[k].mul_(mom).add_(d, alpha=1 - damp)
                d = d.add(bufs[k], alpha=mom) if c["nesterov"] else bufs[k]
            p.add_(d, alpha=-c["lr"])
        if t in SAVE_AT:
            out[t] = [p.clone() for p in ps]
    return out


def run_lamb(c):
    ps = initial()
    ms = [torch.zeros_like(p) for p in ps]
    vs = [torch.zeros_like(p) for p in ps]
    b1, b2, eps = c["beta1"], c["beta2"], c["eps"]
    out = {}
    for t in range(1, STEPS + 1):
        step_size = c["lr"]
        if c["bias_correction"]:
            step_size = c["lr"] * (1 - b2 ** t) ** 0.5 / (1 - b1 ** t)
        for k, g in enumerate(grads(t, c["grad_mult"])):
            p = ps[k]
            wd = c["weight_decay"] if TENSORS[k][2] else 0.0
            ms[k].mul_(b1).add_(g, alpha=1 - b1)
            vs[k].mul_(b2).addcmul_(g, g, value=1 - b2)
            u = ms[k] / (vs[k].sqrt() + eps) + wd * p
            w_norm, u_norm = p.norm(2.0), u.norm(2.0)
            coeff = 1.0
            if w_norm > 0 and u_norm > 0:
                coeff = min(max(float(w_norm / u_norm), c["min_coeff"]), c["max_coeff"])
            p.add_(u, alpha=-step_size * coeff)
        if t in SAVE_AT:
            out[t] = [p.clone() for p in ps]
    return out


def main():
    runs = {"SGD": run_sgd, "LARS": run_lars, "Lamb": run_lamb}
    doc = {"generator": "tests/sharding/gen_optimizer_reference.py", "torch": torch.__version__,
           "steps": STEPS,
           "tensors": [{"name": n, "shape": list(s), "weight_decay": d} for n, s, d in TENSORS],
           "configs": []}
    for c in CONFIGS:
        res = runs[c["type"]](c)
        entry = dict(c)
        entry["after"] = {str(t): {TENSORS[k][0]: [float(x) for x in res[t][k]]
                                   for k in range(len(TENSORS))} for t in SAVE_AT}
        doc["configs"].append(entry)
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data",
                        "optimizer_reference.json")
    with open(path, "w") as f:
        json.dump(doc, f)
        f.write("\n")
    print("wrote", path)


if __name__ == "__main__":
    main()
