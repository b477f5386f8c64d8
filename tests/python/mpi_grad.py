#!/usr/bin/python3
"""Run under `mpirun -np N python3 mpi_grad.py MODEL GROUP OUT.npz [flag=value ...]`: the
gradient of GROUP through the Python API with CP over the N ranks; rank 0 writes OUT.npz.
(tests/python/test_api.py compares it with `mpirun -np N longstraw grad`.)"""
import json
import sys

import numpy as np

import longstraw as ls

model, group, out = sys.argv[1:4]
flags = dict(a.split("=", 1) for a in sys.argv[4:])
ctx = ls.Context(threads=1)
assert ctx.world_size > 1, "not under mpirun"
with open(group) as f:
    g = ctx.policy(model).grad(json.load(f), **flags)
if ctx.rank == 0:
    np.savez(out, **g)
