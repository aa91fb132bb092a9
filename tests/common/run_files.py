"""What a `shardwise train` run directory holds, for the shell tests' Python checks.

metrics(work, run): metrics.jsonl of <work>/<run> as a list of dicts (None when absent, with
missing_ok). weights(work, run): the end-of-run export <work>/<run>/hf/model.safetensors as
{name: float32 array} (the exports are one fp32 file at these sizes).
"""
import json
import struct

import numpy as np


def metrics(work, run, missing_ok=False):
    try:
        with open(f"{work}/{run}/metrics.jsonl") as f:
            return [json.loads(line) for line in f]
    except OSError:
        if missing_ok:
            return None
        raise


def weights(work, run):
    with open(f"{work}/{run}/hf/model.safetensors", "rb") as f:
        b = f.read()
    n = struct.unpack("<Q", b[:8])[0]
    head = json.loads(b[8:8 + n])
    return {k: np.frombuffer(b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]],
                             dtype=np.float32)
            for k, v in head.items() if k != "__metadata__"}
