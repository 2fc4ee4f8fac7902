#!/usr/bin/env python3
"""A BERT-style encoder forward (6 layers, hidden 384, 12 heads, FFN 1536, exact GELU, post-layernorm,
random weights): build/bench/bert (tinygrad.c, the public API used plainly) and the same model in
PyTorch (2 threads) in one run; prints the median ms of each and the ratio tinygrad.c / PyTorch, for
the model called directly and as a TinyJit function (with and without its constant work skipped).
Usage: make bench && /usr/bin/python3 bench/bert.py [batch tokens [runs]] (defaults 32 128 10)
"""
import os, subprocess, sys, time
import torch
import torch.nn.functional as F

torch.set_num_threads(2)
torch.manual_seed(1)
here = os.path.dirname(os.path.abspath(__file__))
B, T = (int(sys.argv[1]), int(sys.argv[2])) if len(sys.argv) > 2 else (32, 128)
RUNS = int(sys.argv[3]) if len(sys.argv) > 3 else 10
LAYERS, HID, HEADS, FFN = 6, 384, 12, 1536

out = subprocess.run([os.path.join(here, "..", "build", "bench", "bert"), str(B), str(T), str(RUNS)], capture_output=True,
                     text=True, check=True).stdout
rows = {l.split()[0]: l.split()[1:] for l in out.splitlines()}
ours = float(out.split()[1])
jit_ms, jit_k, jit_c = float(rows["jit"][0]), int(rows["jit"][1]), int(rows["jit"][2])
rerun_ms = float(rows["jit_rerun"][0])

r = lambda *s: torch.randn(*s) * 0.05
layers = [dict(wq=r(HID, HID), bq=r(HID), wk=r(HID, HID), bk=r(HID), wv=r(HID, HID), bv=r(HID), wo=r(HID, HID), bo=r(HID),
               g1=torch.ones(HID), b1=r(HID), w1=r(FFN, HID), c1=r(FFN), w2=r(HID, FFN), c2=r(HID), g2=torch.ones(HID), b2=r(HID))
          for _ in range(LAYERS)]
sdpa = getattr(F, "scaled_dot_product_attention", None) or \
    (lambda q, k, v: (q @ k.transpose(-1, -2) / (q.shape[-1] ** 0.5)).softmax(-1) @ v)


def layer(w, x):
  hd = lambda t: t.reshape(B, T, HEADS, HID // HEADS).transpose(1, 2)
  a = sdpa(hd(F.linear(x, w["wq"], w["bq"])), hd(F.linear(x, w["wk"], w["bk"])), hd(F.linear(x, w["wv"], w["bv"])))
  x = F.layer_norm(x + F.linear(a.transpose(1, 2).reshape(B, T, HID), w["wo"], w["bo"]), (HID,), w["g1"], w["b1"], 1e-12)
  h = F.linear(F.gelu(F.linear(x, w["w1"], w["c1"])), w["w2"], w["c2"])
  return F.layer_norm(x + h, (HID,), w["g2"], w["b2"], 1e-12)


X = torch.randn(B, T, HID)
ts = []
with torch.no_grad():
  for i in range(RUNS):
    t = time.perf_counter()
    x = X
    for w in layers: x = layer(w, x)
    ts.append(time.perf_counter() - t)
tm = sorted(ts[1:])[(RUNS - 1) // 2] * 1e3
print(f"{'model':<16} {'tinygrad.c':>11} {'PyTorch':>9} {'ratio':>7}")
print(f"bert_{B}x{T:<8} {ours:11.3f} {tm:9.3f} {ours / tm:7.2f}")
print(f"{'  TinyJit':<16} {jit_ms:11.3f} {tm:9.3f} {jit_ms / tm:7.2f}   ({jit_k} kernels, {jit_c} of them constant work"
      f" on the weights, skipped while those are unchanged)")
print(f"{'  ...rerun':<16} {rerun_ms:11.3f} {tm:9.3f} {rerun_ms / tm:7.2f}   (the same jit running its constant work every"
      f" replay: tg_jit_opts.rerun_constants)")
