#!/usr/bin/env python3
"""TinyJit replay benchmark: a jitted one-kernel function, ((x+1)*2).relu() on 16x16, called after its
capture. Runs build/bench/jit (tinygrad.c), PyTorch (eager and torch.jit.trace, 2 threads) and, when
importable, tinygrad's TinyJit, in one run; prints microseconds per call and the ratios.
Usage: make bench && /usr/bin/python3 bench/jit.py
"""
import os, re, subprocess, time

here = os.path.dirname(os.path.abspath(__file__))
exe = os.path.join(here, "..", "build", "bench", "jit")


def best_of(fn, iters, reps=5):
  best = 1e9
  for _ in range(reps):
    t0 = time.perf_counter()
    for _ in range(iters): fn()
    best = min(best, (time.perf_counter() - t0) / iters * 1e6)
  return best


out = subprocess.run([exe, "10000"], capture_output=True, text=True, check=True).stdout
ours = float(re.search(r"([0-9.]+) us/call", out).group(1))
print(f"tinygrad.c TinyJit     {ours:9.2f} us/call   ({out.strip()})")

import numpy as np
data = (np.arange(256) % 17 - 8).astype(np.float32).reshape(16, 16)
try:
  import torch
  torch.set_num_threads(2)
  tx = torch.tensor(data)
  f = lambda x: ((x + 1) * 2).relu()
  t = best_of(lambda: f(tx), 10000)
  print(f"PyTorch eager          {t:9.2f} us/call   ratio tinygrad.c/PyTorch eager = {ours / t:.2f}x")
  tf = torch.jit.trace(f, tx)
  for _ in range(3): tf(tx)
  t = best_of(lambda: tf(tx), 10000)
  print(f"PyTorch torch.jit      {t:9.2f} us/call   ratio tinygrad.c/torch.jit = {ours / t:.2f}x")
except ImportError:
  print("PyTorch not installed")
try:
  from tinygrad import Tensor, TinyJit
  gx = Tensor(data).realize()
  jf = TinyJit(lambda x: ((x + 1) * 2).relu().realize())
  for _ in range(3): jf(gx)
  t = best_of(lambda: jf(gx), 300, reps=3)
  print(f"tinygrad TinyJit       {t:9.2f} us/call   ratio tinygrad.c/tinygrad = {ours / t:.3f}x")
except ImportError:
  print("tinygrad not installed (pip install tinygrad to compare)")
