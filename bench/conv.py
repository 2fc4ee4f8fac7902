#!/usr/bin/env python3
"""The four convolutions of beautiful_mnist (batch 512), forward and backward (input and weight
gradients), in tinygrad.c (build/bench/conv) and PyTorch (2 threads) in one run; prints ms and ratios.
Usage: make bench && /usr/bin/python3 bench/conv.py
"""
import os, subprocess, time
import torch

torch.set_num_threads(2)
here = os.path.dirname(os.path.abspath(__file__))
out = subprocess.run([os.path.join(here, "..", "build", "bench", "conv")], capture_output=True, text=True, check=True).stdout
ours = {l.split()[0]: (float(l.split()[1]), float(l.split()[2])) for l in out.splitlines()}
shapes = {"conv1_1x28_32k5": (1, 28, 32, 5), "conv2_32x24_32k5": (32, 24, 32, 5),
          "conv3_32x10_64k3": (32, 10, 64, 3), "conv4_64x8_64k3": (64, 8, 64, 3)}
print(f"{'conv':<18} {'fwd ms':>8} {'torch':>8} {'ratio':>6}   {'bwd ms':>8} {'torch':>8} {'ratio':>6}")
for name, (cin, hw, cout, k) in shapes.items():
  x = torch.rand(512, cin, hw, hw, requires_grad=True); w = torch.rand(cout, cin, k, k, requires_grad=True)
  fwd = bwd = 1e30
  for i in range(5):
    t = time.perf_counter(); y = torch.nn.functional.conv2d(x, w); t1 = time.perf_counter()
    r = torch.rand_like(y); x.grad = w.grad = None
    t2 = time.perf_counter(); (y * r).sum().backward(); t3 = time.perf_counter()
    if i: fwd, bwd = min(fwd, t1 - t), min(bwd, t3 - t2)
  f, b = ours[name]
  print(f"{name:<18} {f:>8.1f} {fwd*1e3:>8.1f} {f/(fwd*1e3):>6.2f}   {b:>8.1f} {bwd*1e3:>8.1f} {b/(bwd*1e3):>6.2f}")
print("(ratios are tinygrad.c / PyTorch, measured in this run; torch's backward includes its elementwise (y*r).sum())")
