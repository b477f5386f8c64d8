#!/usr/bin/python3
"""Run under `mpirun -np N python3 mpi_grad.py MODEL GROUP OUT.npz [flag=value ...]`: the
gradient of GROUP through the Python API with CP (or CP x EP with ep=K) over the N ranks;
rank 0 writes OUT.npz.
(tests/python/test_api.py compares it with `mpirun -np N longstraw grad`.)"""
import json
import sys

import numpy as np

import longstraw as ls

model, group, out = sys.argv[1:4]
flags = dict(a.split("=", 1) for a in sys.argv[4:])
at_open = {k: flags.pop(k) for k in list(flags) if k in ("ep", "lora_rank")}  # fixed when the policy opens
ctx = ls.Context(threads=1)
assert ctx.world_size > 1, "not under mpirun"
with open(group) as f:
    g = ctx.policy(model, **at_open).grad(json.load(f), **flags)
if ctx.rank == 0:
    np.savez(out, **g)
