#!/usr/bin/env python3
"""fp32 matmul: tinygrad.c (default opts) vs OpenBLAS through numpy vs PyTorch (2 threads), and
tinygrad (default and BEAM=2) when installed, measured in one run. Prints GFLOPS and ratios.

Debian's OpenBLAS 0.3.21 misdetects AVX-512 Zen CPUs and runs 4-5x slower unless OPENBLAS_CORETYPE=SkylakeX
is set, so numpy runs in a child process with that variable (and nothing else) changed, where the CPU has
AVX-512 (elsewhere OpenBLAS's own detection is kept).
Usage: /usr/bin/python3 bench/matmul.py [N ...]

With DEV=CL it measures the OpenCL device instead: tinygrad.c on CL against tinygrad.c on the CPU
and against tinygrad on DEV=CL (both on PoCL here), in one run; the CPU libraries are not run then.
  DEV=CL /usr/bin/python3 bench/matmul.py 512 1024

With DEV=CUDA (or NV) it measures the NVIDIA GPU: tinygrad.c on it against PyTorch's CUDA matmul
(cuBLAS, TF32 off) when the Python running it has a CUDA PyTorch:
  DEV=CUDA python3 bench/matmul.py 1024 4096
and MATMUL_DTYPE=float16 or bfloat16 times half matmuls there (operands and result in that dtype,
float32 sums: the tensor cores' work; PyTorch's a.half() @ b.half()):
  DEV=CUDA MATMUL_DTYPE=bfloat16 python3 bench/matmul.py 4096 8192
"""
import os, subprocess, sys, time

sizes = [int(x) for x in sys.argv[1:]] or [256, 512, 1024, 2048, 4096]
here = os.path.dirname(os.path.abspath(__file__))
exe = os.path.join(here, "..", "build", "bench", "matmul")

CHILD = r'''
import sys, time, numpy as np
n = int(sys.argv[1]); a = np.random.rand(n, n).astype(np.float32); b = np.random.rand(n, n).astype(np.float32)
best = 1e30; end = time.perf_counter() + 3
for i in range(20):
  t = time.perf_counter(); a @ b; t = time.perf_counter() - t
  if i > 0: best = min(best, t)
  if i > 2 and time.perf_counter() > end: break
print(2 * n**3 / best * 1e-9)
'''

def _has_avx512():
  try:
    with open("/proc/cpuinfo") as f:
      return any(l.startswith("flags") and " avx512f" in l for l in f)
  except OSError:
    return False
HAS_AVX512 = _has_avx512()

def numpy_gflops(n):
  env = dict(os.environ); env.pop("OPENBLAS_L2_SIZE", None)
  # Debian's OpenBLAS takes Zen 4/5 for an older core and skips its AVX-512 kernels: name the core
  # only where the CPU has AVX-512 (elsewhere that core type would die on an illegal instruction)
  if HAS_AVX512: env["OPENBLAS_CORETYPE"] = "SkylakeX"
  env["OPENBLAS_NUM_THREADS"] = "2"
  return float(subprocess.run([sys.executable, "-c", CHILD, str(n)], env=env, capture_output=True, text=True, check=True).stdout)

def torch_gflops(n):
  import torch
  torch.set_num_threads(2)
  a, b = torch.rand(n, n), torch.rand(n, n)
  best, end = 1e30, time.perf_counter() + 3
  for i in range(20):
    t = time.perf_counter(); a @ b; t = time.perf_counter() - t
    if i > 0: best = min(best, t)
    if i > 2 and time.perf_counter() > end: break
  return 2 * n**3 / best * 1e-9

def tinygrad_gflops(n, beam, dev="CPU"):
  # the time runs until the device has finished (a GPU-like device only queues the kernel)
  code = ("import time\nfrom tinygrad import Tensor, Device\nfrom tinygrad.helpers import Context\n"
          f"n={n}\na=Tensor.rand(n,n).realize(); b=Tensor.rand(n,n).realize()\nbest=1e30\n"
          f"with Context(BEAM={beam}):\n  for i in range(5):\n"
          "    t=time.perf_counter(); (a@b).realize(); Device[Device.DEFAULT].synchronize(); t=time.perf_counter()-t\n"
          "    if i>0: best=min(best,t)\nprint(2*n**3/best*1e-9)\n")
  env = dict(os.environ, DEV=dev)
  for k in ("DEBUG", "BEAM", "NOOPT"): env.pop(k, None)
  r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600, cwd="/tmp")
  return float(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 and r.stdout.strip() else None

try:
  import tinygrad  # noqa: F401
  have_tinygrad = True
except ImportError:
  have_tinygrad = False

def ours_gflops(dev):
  env = dict(os.environ, DEV=dev)
  for k in ("DEBUG", "BEAM", "NOOPT", "GPU_OPTS"): env.pop(k, None)
  out = subprocess.run([exe] + [str(n) for n in sizes], capture_output=True, text=True, check=True, env=env).stdout
  return {int(n): float(g) for n, g in (line.split() for line in out.splitlines())}

if os.environ.get("DEV", "CPU").split(":")[0].upper() == "CL":
  cl, cpu = ours_gflops(os.environ["DEV"]), ours_gflops("CPU")
  print(f"{'N':>6} {'tinygrad.c CL':>13} {'tinygrad.c CPU':>14} {'tinygrad CL':>11} {'CL/CPU':>7} {'c/tinygrad CL':>13}")
  for n in sizes:
    tg = tinygrad_gflops(n, 0, "CL") if have_tinygrad and n <= 2048 else None
    print(f"{n:>6} {cl[n]:>13.1f} {cpu[n]:>14.1f} {tg or float('nan'):>11.1f} {cl[n] / cpu[n]:>7.2f} "
          f"{cl[n] / tg if tg else float('nan'):>13.2f}", flush=True)
  print("(GFLOPS, fp32, default opts; ratios are throughputs, tinygrad.c on CL / other, measured in this run)")
  sys.exit(0)

DTYPE = os.environ.get("MATMUL_DTYPE", "float32") or "float32"

def torch_cuda_gflops(n):
  """PyTorch's matmul on the GPU in DTYPE (fp32 with TF32 off, as tinygrad.c computes in fp32);
  None without CUDA."""
  try:
    import torch
    if not torch.cuda.is_available(): return None
  except ImportError:
    return None
  torch.backends.cuda.matmul.allow_tf32 = False
  dt = {"float16": torch.float16, "half": torch.float16, "bfloat16": torch.bfloat16}.get(DTYPE, torch.float32)
  a, b = torch.rand(n, n, device="cuda").to(dt), torch.rand(n, n, device="cuda").to(dt)
  best, end = 1e30, time.perf_counter() + 3
  for i in range(20):
    torch.cuda.synchronize(); t = time.perf_counter(); a @ b; torch.cuda.synchronize(); t = time.perf_counter() - t
    if i > 0: best = min(best, t)
    if i > 2 and time.perf_counter() > end: break
  return 2 * n**3 / best * 1e-9

if os.environ.get("DEV", "CPU").split(":")[0].upper() in ("CUDA", "NV"):
  # an NVIDIA GPU: tinygrad.c on it against PyTorch on it (cuBLAS), in one run
  gpu = ours_gflops(os.environ["DEV"])
  print(f"{'N':>6} {'tinygrad.c CUDA':>15} {'PyTorch CUDA':>12} {'c/torch':>7}")
  for n in sizes:
    tt = torch_cuda_gflops(n)
    print(f"{n:>6} {gpu[n]:>15.1f} {tt or float('nan'):>12.1f} {gpu[n] / tt if tt else float('nan'):>7.3f}", flush=True)
  what = "fp32 without TF32" if DTYPE in ("float32", "float") else f"{DTYPE} operands and result, float32 sums"
  print(f"(GFLOPS, {what}, default opts; c/torch: tinygrad.c's throughput / PyTorch's, measured in this run)")
  sys.exit(0)

sys.path.insert(0, here)
import machine  # noqa: E402
lim = machine.limits()
print(machine.describe(lim))
ours = ours_gflops("CPU")

print(f"{'N':>6} {'tinygrad.c':>11} {'of peak':>7} {'OpenBLAS':>9} {'of peak':>7} {'PyTorch':>9} {'ratio/BLAS':>10} {'ratio/torch':>11}" + (" tinygrad  tg BEAM=2" if have_tinygrad else ""))
for n in sizes:
  nb, tt = numpy_gflops(n), torch_gflops(n)
  pk = (lambda g: f"{100 * g / lim['fma']:>6.0f}%") if lim else (lambda g: f"{'':>7}")
  line = f"{n:>6} {ours[n]:>11.1f} {pk(ours[n])} {nb:>9.1f} {pk(nb)} {tt:>9.1f} {ours[n] / nb:>10.2f} {ours[n] / tt:>11.2f}"
  if have_tinygrad and n <= 1024:
    g0, g2 = tinygrad_gflops(n, 0), tinygrad_gflops(n, 2)
    line += f" {g0 or float('nan'):>8.1f} {g2 or float('nan'):>8.1f}"
  print(line, flush=True)
print("(GFLOPS, fp32; ratios are tinygrad.c / other; of peak: of the FMA peak above; all measured in this run)")
