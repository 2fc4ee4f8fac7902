#!/usr/bin/env python3
"""Common single ops on realistic sizes: tinygrad.c (build/bench/ops) and PyTorch (2 threads) in one
run; prints the median ms of each and the ratio tinygrad.c / PyTorch (below 1 is faster), and how close
each op comes to the machine's limits (bench/machine.py: FMA peak and triad bandwidth, measured first).
Usage: make bench && /usr/bin/python3 bench/ops.py [substring of op names]
Each op is built and realized (tinygrad.c) or called (PyTorch) 10 times, the first dropped.
With DEV=CPU:LLVM[:ARCH] the ops run on that device and on DEV=CPU (the C renderer) in the same run,
ROUNDS times alternately (default 5; each op's median over the rounds), and a column gives the
ratio LLVM / C (below 1: the LLVM kernels are faster).
"""
import os, subprocess, sys, time
import torch
import torch.nn.functional as F

torch.set_num_threads(2)
torch.manual_seed(1)
here = os.path.dirname(os.path.abspath(__file__))
flt = sys.argv[1:] and sys.argv[1] or ""
dev = os.environ.get("DEV", "")
llvm = dev.upper().startswith("CPU:LLVM")


def run_ops(env_dev):
  env = dict(os.environ)
  if env_dev: env["DEV"] = env_dev
  out = subprocess.run([os.path.join(here, "..", "build", "bench", "ops")] + ([flt] if flt else []), capture_output=True,
                       text=True, check=True, env=env).stdout
  rows = [l.split() for l in out.splitlines()]
  return {r[0]: float(r[1]) for r in rows}, {r[0]: (int(r[2]), int(r[3])) for r in rows if len(r) >= 4}


sys.path.insert(0, here)
import machine  # noqa: E402
lim = machine.limits()
print(machine.describe(lim))
ours, work = run_ops(None)
cref = None
if llvm:
  # LLVM against C: ROUNDS (default 5) alternating runs of both, each op's median over them, so that
  # the host's speed drifting between two back-to-back runs does not land on one side
  import statistics
  rounds = max(1, int(os.environ.get("ROUNDS", "5")))
  runs_l, runs_c = [ours], [run_ops("CPU")[0]]
  for _ in range(rounds - 1):
    runs_l.append(run_ops(None)[0])
    runs_c.append(run_ops("CPU")[0])
  med = lambda runs: {k: statistics.median(r[k] for r in runs if k in r) for k in runs[0]}
  ours, cref = med(runs_l), med(runs_c)

r = torch.randn
A, B, M2k, S, L, V, M1k = r(1 << 22), r(1 << 22), r(2048, 2048), r(256, 4096), r(1024, 1024), r(1 << 20), r(1024, 1024)
P, C, Wc, E = r(64, 32, 56, 56), r(16, 64, 56, 56), r(64, 64, 3, 3), r(50000, 512)
IDX, Q, K, Vv = torch.randint(0, 50000, (4096,)), r(4, 8, 256, 64), r(4, 8, 256, 64), r(4, 8, 256, 64)
LG, LB, IMG, S64k, T4 = r(512, 1000), torch.randint(0, 1000, (512,)), r(16, 32, 56, 56), r(65536), r(64, 64, 56, 56)
sdpa = getattr(F, "scaled_dot_product_attention", None) or (lambda q, k, v: (q @ k.transpose(-1, -2) / 8).softmax(-1) @ v)
TORCH = {
    "add_4M": lambda: A + B, "gelu_4M": lambda: F.gelu(A, approximate="tanh"), "sigmoid_4M": lambda: A.sigmoid(),
    "exp_4M": lambda: A.exp(), "log_4M": lambda: A.abs().log(), "where_4M": lambda: torch.where(A > B, A, B),
    "sum_4M": lambda: A.sum(), "sum_rows_2048x2048": lambda: M2k.sum(1), "sum_cols_2048x2048": lambda: M2k.sum(0),
    "softmax_256x4096": lambda: S.softmax(-1), "log_softmax_256x4096": lambda: S.log_softmax(-1),
    "layernorm_1024x1024": lambda: F.layer_norm(L, (1024,)), "var_rows_2048x2048": lambda: M2k.var(1),
    "matmul_1024": lambda: M1k @ M1k, "argmax_rows_1024x1024": lambda: M1k.argmax(1), "cumsum_1M": lambda: V.cumsum(0),
    "maxpool2_64x32x56x56": lambda: F.max_pool2d(P, 2), "conv3x3_16x64x56x56": lambda: F.conv2d(C, Wc, padding=1),
    "transpose_2048x2048": lambda: M2k.t().contiguous(), "nchw_to_nhwc_64x64x56x56": lambda: T4.permute(0, 2, 3, 1).contiguous(),
    "embedding_4096_of_50000x512": lambda: E[IDX], "gather_rows_1024x1024": lambda: M1k.gather(1, M1k.argmax(1, keepdim=True)),
    "sort_64k": lambda: S64k.sort(), "topk10_1024x1024": lambda: M1k.topk(10, 1), "sdpa_4x8x256x64": lambda: sdpa(Q, K, Vv),
    "xent_512x1000": lambda: F.cross_entropy(LG, LB),
    "interpolate_16x32x56->112": lambda: F.interpolate(IMG, size=(112, 112), mode="bilinear"),
    "rand_4M": lambda: torch.rand(1 << 22), "randn_4M": lambda: torch.randn(1 << 22),
}


def of_limit(name, ms):
  """The op's GB/s and GFLOPS (its kernels' counts over its time) as the larger fraction of the machine's
  bandwidth or FMA peak, e.g. ' 83% mem'."""
  if not lim or name not in work or ms <= 0: return ""
  nbytes, flops = work[name]
  m, f = nbytes / ms * 1e-6 / lim["bw"], flops / ms * 1e-6 / lim["fma"]
  return f"{100 * max(m, f):>5.0f}% {'mem' if m >= f else 'fma'}"


if llvm: print(f"{'op':<30} {'CPU:LLVM':>11} {'CPU (C)':>11} {'LLVM/C':>7} {'PyTorch':>9} {'ratio':>7}")
else: print(f"{'op':<30} {'tinygrad.c':>11} {'PyTorch':>9} {'ratio':>7} {'of limit':>9}")
worst = 0.0
for name, ms in ours.items():
  ts = []
  for i in range(10):
    t = time.perf_counter(); TORCH[name](); ts.append(time.perf_counter() - t)
  tm = sorted(ts[1:])[4] * 1e3
  if llvm:
    c = cref.get(name, float("nan"))
    worst = max(worst, ms / c)
    print(f"{name:<30} {ms:>9.3f}ms {c:>9.3f}ms {ms / c:>7.2f} {tm:>7.3f}ms {ms / tm:>7.2f}")
  else:
    print(f"{name:<30} {ms:>9.3f}ms {tm:>7.3f}ms {ms / tm:>7.2f} {of_limit(name, ms):>9}")
if llvm: print(f"(worst LLVM/C ratio {worst:.2f}; ratio columns: ours / PyTorch, all in this run on this machine)")
print("(ms: median of 9 runs; ratio tinygrad.c / PyTorch, both in this run on this machine; of limit: the op's\n"
      " GB/s or GFLOPS, by its kernels' byte and FLOP counts (DEBUG=2's), as a fraction of the triad bandwidth or FMA peak)")
