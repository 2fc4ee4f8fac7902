#!/usr/bin/env python3
"""Un-JIT'd dispatch benchmark: ((a+1)*2).relu().sum() on 16x16, realized 1000 times.

Runs build/bench/dispatch (tinygrad.c), PyTorch eager (2 threads) and, when importable, tinygrad, in
one run, and prints microseconds per realize and the ratios. Usage: /usr/bin/python3 bench/dispatch.py
"""
import os, re, subprocess, sys, time

ITERS = 1000
here = os.path.dirname(os.path.abspath(__file__))
exe = os.path.join(here, "..", "build", "bench", "dispatch")

def best_of(fn, reps=5):
  best = 1e9
  for _ in range(reps):
    t0 = time.perf_counter()
    for _ in range(ITERS): fn()
    best = min(best, (time.perf_counter() - t0) / ITERS * 1e6)
  return best

out = subprocess.run([exe, str(ITERS)], capture_output=True, text=True, check=True).stdout
ours = float(re.search(r"([0-9.]+) us/realize", out).group(1))
print(f"tinygrad.c        {ours:9.2f} us/realize")

import numpy as np
data = (np.arange(256) % 17 - 8).astype(np.float32).reshape(16, 16)
try:
  import torch
  torch.set_num_threads(2)
  ta = torch.tensor(data)
  t = best_of(lambda: ((ta + 1) * 2).relu().sum())
  print(f"PyTorch eager     {t:9.2f} us/op     ratio tinygrad.c/PyTorch = {ours / t:.2f}x")
except ImportError:
  print("PyTorch not installed")
try:
  from tinygrad import Tensor
  ga = Tensor(data).realize()
  ITERS = 100
  t = best_of(lambda: ((ga + 1) * 2).relu().sum().realize(), reps=3)
  print(f"tinygrad          {t:9.2f} us/realize ratio tinygrad.c/tinygrad = {ours / t:.3f}x")
except ImportError:
  print("tinygrad not installed (pip install tinygrad to compare)")
