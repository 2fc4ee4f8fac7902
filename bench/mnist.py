#!/usr/bin/env python3
"""beautiful_mnist training: tinygrad.c vs PyTorch (2 threads), and tinygrad when it is installed,
measured in one run, each in its own process, one after the other.

  /usr/bin/python3 bench/mnist.py                 (needs `make`: build/examples/beautiful_mnist)
  STEPS=10 BS=512 /usr/bin/python3 bench/mnist.py

Environment: STEPS (default 20), BS (default 512), COLD (first-step runs, default 3), TINYGRAD=0 skips tinygrad even if importable,
LLVM=0 skips the DEV=CPU:LLVM run, TIMEOUT (seconds per child process, default 1800).
tinygrad.c runs twice: DEV=CPU (C kernels through the system compiler) and DEV=CPU:LLVM (LLVM IR
compiled in process), each with its own empty kernel cache; a column gives LLVM / C.

With DEV=CL it compares the OpenCL device instead: tinygrad.c on CL against tinygrad.c on the CPU
and tinygrad on DEV=CL (PoCL here), in one run (PyTorch is not run then):
  DEV=CL STEPS=10 /usr/bin/python3 bench/mnist.py
With DEV=CUDA (or NV) it compares tinygrad.c on the GPU with PyTorch CUDA eager (bench/mnist_torch.py
with TORCH_DEVICE=cuda, in this script's interpreter, which needs a CUDA build of torch):
  DEV=CUDA STEPS=20 /opt/torch/.venv/bin/python3 bench/mnist.py
MNIST_DIR points both at the dataset where the Debian package is not installed.

For each framework it prints
  step        median train-step time over steps 2..STEPS (the first step is reported apart)
  eval        one pass over the 10 000 test images (tinygrad.c / tinygrad: the last of several
              TinyJit'd calls, a replay; PyTorch: one call under no_grad after training)
  peak RSS    the child process's maximum resident set size (os.wait4)
  first step  the first train step with an empty kernel cache (tinygrad.c: a fresh
              TINYGRAD_CACHE_DIR; tinygrad: a fresh CACHEDB; both with a fresh POCL_CACHE_DIR, PoCL's
              own cache of built kernels, under DEV=CL) and, for tinygrad.c, again with the
              cache that run filled (PyTorch compiles nothing: its first step appears in both rows).
              The empty-cache row is the median over COLD fresh processes (default 3), for
              tinygrad.c and PyTorch alike: on a shared host one first step can take twice another's
and the ratios tinygrad.c / other (below 1 is better for tinygrad.c).

tinygrad.c runs examples/beautiful_mnist with BENCH=1 (it prints "bench step=<i> ms=<t>" and
"bench eval=<k> ms=<t>"); PyTorch runs bench/mnist_torch.py; tinygrad runs the script below, the
model of tinygrad's examples/beautiful_mnist.py. All three read Fashion-MNIST from
/usr/share/datasets/fashion-mnist (Debian's dataset-fashion-mnist).
"""
import os, re, shutil, statistics, subprocess, sys, tempfile, threading, time

STEPS = int(os.environ.get("STEPS", "20"))
COLD = max(1, int(os.environ.get("COLD", "3")))
BS = int(os.environ.get("BS", "512"))
TIMEOUT = float(os.environ.get("TIMEOUT", "1800"))
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
EXE = os.path.join(ROOT, "build", "examples", "beautiful_mnist")
PY = sys.executable

# tinygrad's examples/beautiful_mnist.py, timed the way BENCH=1 times ours.
TINYGRAD_SCRIPT = r'''
import gzip, sys, time
import numpy as np
from tinygrad import Tensor, TinyJit, nn
STEPS, BS = int(sys.argv[1]), int(sys.argv[2])
D = "/usr/share/datasets/fashion-mnist/"
def idx(name, off):  # a writable copy: tinygrad's CL device copies in only from writable memory
  with gzip.open(D + name) as f: return np.frombuffer(f.read(), np.uint8, offset=off).copy()
X_train = Tensor(idx("train-images-idx3-ubyte.gz", 16).reshape(-1, 1, 28, 28)).realize()
Y_train = Tensor(idx("train-labels-idx1-ubyte.gz", 8).copy()).realize()
X_test = Tensor(idx("t10k-images-idx3-ubyte.gz", 16).reshape(-1, 1, 28, 28)).realize()
Y_test = Tensor(idx("t10k-labels-idx1-ubyte.gz", 8).copy()).realize()
class Model:
  def __init__(self):
    self.layers = [nn.Conv2d(1, 32, 5), Tensor.relu, nn.Conv2d(32, 32, 5), Tensor.relu, nn.BatchNorm(32), Tensor.max_pool2d,
                   nn.Conv2d(32, 64, 3), Tensor.relu, nn.Conv2d(64, 64, 3), Tensor.relu, nn.BatchNorm(64), Tensor.max_pool2d,
                   lambda x: x.flatten(1), nn.Linear(576, 10)]
  def __call__(self, x): return x.sequential(self.layers)
try:  # tinygrad >= 0.11: Context(TRAINING=1); before: Tensor.train()
  from tinygrad.helpers import Context, TRAINING  # noqa: F401
  training = lambda: Context(TRAINING=1)
except ImportError:
  training = Tensor.train
model = Model()
opt = nn.optim.Adam(nn.state.get_parameters(model))
@TinyJit
def train_step():
  with training():
    opt.zero_grad()
    samples = Tensor.randint(BS, high=X_train.shape[0])
    loss = model(X_train[samples]).sparse_categorical_crossentropy(Y_train[samples]).backward()
    return loss.realize(*opt.schedule_step())
@TinyJit
def get_test_acc(): return ((model(X_test).argmax(axis=1) == Y_test).mean() * 100).realize()
for i in range(STEPS):
  t = time.perf_counter(); train_step().item(); print(f"bench step={i} ms={(time.perf_counter() - t) * 1e3:.3f}", flush=True)
for k in range(3):
  t = time.perf_counter(); get_test_acc().item(); print(f"bench eval={k} ms={(time.perf_counter() - t) * 1e3:.3f}", flush=True)
'''


def run_child(cmd, env, stop_at=None, cwd=None):
  """Runs cmd to the end (or until a stdout line matches stop_at, then kills it).
  Returns (stdout lines, peak RSS in MB, exit code); raises on failure."""
  err = tempfile.TemporaryFile(mode="w+")
  p = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=err, text=True)
  timer = threading.Timer(TIMEOUT, p.kill)
  timer.start()
  lines, stopped = [], False
  for line in p.stdout:
    lines.append(line.rstrip("\n"))
    if stop_at and re.match(stop_at, line):
      p.kill()
      stopped = True
      break
  p.stdout.close()
  _, status, ru = os.wait4(p.pid, 0)
  timer.cancel()
  p.returncode = os.waitstatus_to_exitcode(status)
  if p.returncode != 0 and not stopped:
    err.seek(0)
    tail = err.read()[-2000:]
    raise RuntimeError(f"{' '.join(cmd)} exited with {p.returncode}:\n{tail}")
  return lines, ru.ru_maxrss / 1024, p.returncode


def parse_bench(lines):
  steps = [float(m.group(1)) for l in lines if (m := re.match(r"bench step=\d+ ms=([0-9.]+)", l))]
  evals = [float(m.group(1)) for l in lines if (m := re.match(r"bench eval=\d+ ms=([0-9.]+)", l))]
  return steps, evals


def summary(steps, evals, rss, first_cold, first_warm):
  return {"step": statistics.median(steps[1:]) if len(steps) > 1 else steps[0], "eval": evals[-1] if evals else None,
          "rss": rss, "first_cold": first_cold, "first_warm": first_warm}


def tinygrad_c(dev="CPU"):
  if not os.access(EXE, os.X_OK): sys.exit(f"{EXE} not found: run `make` first")
  cache = tempfile.mkdtemp(prefix="tinygrad.c-bench-cache-")
  try:
    # POCL_CACHE_DIR: on CL the empty-cache run also starts without PoCL's own cache of built kernels
    env = dict(os.environ, BENCH="1", STEPS=str(STEPS), BS=str(BS), MNIST_SAVE="", TINYGRAD_CACHE_DIR=cache, DEV=dev,
               POCL_CACHE_DIR=os.path.join(cache, "pocl"))
    for k in ("DISABLE_COMPILER_CACHE", "DEBUG", "BEAM", "NOOPT", "JIT", "GPU_OPTS"): env.pop(k, None)
    t = time.perf_counter()
    lines, rss, _ = run_child([EXE], env)  # empty cache: the first step compiles every kernel
    wall = time.perf_counter() - t
    steps, evals = parse_bench(lines)
    if len(steps) != STEPS or not evals: raise RuntimeError("beautiful_mnist printed no BENCH lines:\n" + "\n".join(lines))
    warm, _, _ = run_child([EXE], dict(env, STEPS="1"), stop_at=r"bench step=0 ")  # the same cache, now full
    cold = [steps[0]]
    for k in range(COLD - 1):  # more first steps, each in a fresh process with a cache of its own
      d = os.path.join(cache, f"cold{k}")
      more, _, _ = run_child([EXE], dict(env, STEPS="1", TINYGRAD_CACHE_DIR=d, POCL_CACHE_DIR=os.path.join(d, "pocl")),
                             stop_at=r"bench step=0 ")
      cold.append(parse_bench(more)[0][0])
    r = summary(steps, evals, rss, statistics.median(cold), parse_bench(warm)[0][0])
    r["eval_first"], r["wall"] = evals[0], wall
    return r
  finally:
    shutil.rmtree(cache, ignore_errors=True)


def pytorch(device="cpu"):
  lines, rss, _ = run_child([PY, os.path.join(HERE, "mnist_torch.py"), str(STEPS), str(BS)], dict(os.environ, TORCH_DEVICE=device))
  m = re.search(r"step_ms=([0-9.]+) eval_ms=([0-9.]+) first_step_ms=([0-9.]+)", "\n".join(lines))
  if not m: raise RuntimeError("mnist_torch.py printed no result:\n" + "\n".join(lines))
  step, ev, first = (float(x) for x in m.groups())
  firsts = [first]
  for _ in range(COLD - 1):  # more first steps, each in a fresh process
    more, _, _ = run_child([PY, os.path.join(HERE, "mnist_torch.py"), "1", str(BS)], dict(os.environ, TORCH_DEVICE=device))
    firsts.append(float(re.search(r"first_step_ms=([0-9.]+)", "\n".join(more)).group(1)))
  first = statistics.median(firsts)
  return {"step": step, "eval": ev, "rss": rss, "first_cold": first, "first_warm": first}


def tinygrad(dev="CPU"):
  # not from bench/ or tests/ (tests/tinygrad.py is our ctypes binding, not tinygrad)
  if subprocess.run([PY, "-c", "import tinygrad"], cwd=tempfile.gettempdir(), capture_output=True).returncode != 0:
    return None
  db = tempfile.mkdtemp(prefix="tinygrad-bench-cachedb-")
  try:
    env = dict(os.environ, CACHEDB=os.path.join(db, "cache.db"), DEV=dev, POCL_CACHE_DIR=os.path.join(db, "pocl"))
    for k in ("DEBUG", "BEAM", "JIT"): env.pop(k, None)
    lines, rss, _ = run_child([PY, "-c", TINYGRAD_SCRIPT, str(STEPS), str(BS)], env, cwd=tempfile.gettempdir())
    steps, evals = parse_bench(lines)
    return summary(steps, evals, rss, steps[0], None)
  finally:
    shutil.rmtree(db, ignore_errors=True)


ROWS = [("train step, median (ms)", "step"), ("eval, 10000 images (ms)", "eval"), ("peak RSS (MB)", "rss"),
        ("first step, empty cache (ms)", "first_cold"), ("first step, warm cache (ms)", "first_warm")]
fmt = lambda v: f"{v:14.1f}" if v is not None else f"{'-':>14}"
ratio = lambda a, b: f"{a / b:13.2f}x" if a is not None and b else f"{'-':>14}"


def main_cl(dev):
  """DEV=CL: tinygrad.c on the OpenCL device against tinygrad.c on the CPU and tinygrad on CL."""
  print(f"beautiful_mnist on Fashion-MNIST, BS={BS}, STEPS={STEPS}, {os.cpu_count()} CPUs, {dev} against CPU and tinygrad {dev}", flush=True)
  cl = tinygrad_c(dev)
  cpu = tinygrad_c("CPU")
  tg = None
  if os.environ.get("TINYGRAD", "1") != "0":
    try:
      tg = tinygrad(dev.split(":")[0].upper())
      if tg is None: print("(tinygrad not installed: pip install tinygrad to compare)")
    except Exception as e:  # tinygrad is optional: report and go on
      print(f"(tinygrad failed: {str(e).splitlines()[0]})")
  head = ["tinygrad.c CL", "tinygrad.c CPU"] + (["tinygrad CL"] if tg else []) + ["c CL/c CPU"] + (["c CL/tg CL"] if tg else [])
  print(f"{'':30}" + "".join(f" {h:>14}" for h in head))
  for label, k in ROWS:
    line = f"{label:30} {fmt(cl[k])} {fmt(cpu[k])}" + (f" {fmt(tg[k])}" if tg else "") + f" {ratio(cl[k], cpu[k])}"
    if tg: line += f" {ratio(cl[k], tg[k])}"
    print(line)
  print(f"(tinygrad.c on CL: first evaluation, compiling its kernels, {cl['eval_first']:.1f} ms; whole empty-cache run {cl['wall']:.1f} s. "
        "Ratios are times (RSS: sizes), tinygrad.c on CL / other: below 1 is faster or smaller.)")


def main_cuda(dev):
  """DEV=CUDA (or NV): tinygrad.c on the GPU against PyTorch CUDA eager, in one run. PyTorch runs in
  the interpreter that runs this script, which must have a CUDA build of torch."""
  print(f"beautiful_mnist on Fashion-MNIST, BS={BS}, STEPS={STEPS}, {dev} against PyTorch CUDA", flush=True)
  ours = tinygrad_c(dev)
  try:
    ref = pytorch("cuda")
  except Exception as e:  # a torch without CUDA: report and show ours alone
    print(f"(PyTorch CUDA failed: {str(e).splitlines()[-1] if str(e) else e})")
    ref = None
  print(f"{'':30} {'tinygrad.c':>14}" + (f" {'PyTorch CUDA':>14} {'c/PyTorch':>14}" if ref else ""))
  for label, k in ROWS:
    print(f"{label:30} {fmt(ours[k])}" + (f" {fmt(ref[k])} {ratio(ours[k], ref[k])}" if ref else ""))
  print(f"(tinygrad.c on {dev}: first evaluation, compiling its kernels, {ours['eval_first']:.1f} ms; whole empty-cache run "
        f"{ours['wall']:.1f} s. Ratios are tinygrad.c / PyTorch: below 1 is faster or smaller.)")


def main():
  dev = os.environ.get("DEV", "CPU")
  if dev.split(":")[0].upper() == "CL": return main_cl(dev)
  if dev.split(":")[0].upper() in ("CUDA", "NV"): return main_cuda(dev)
  print(f"beautiful_mnist on Fashion-MNIST, BS={BS}, STEPS={STEPS}, {os.cpu_count()} CPUs", flush=True)
  ours = tinygrad_c("CPU")
  llvm = None
  if os.environ.get("LLVM", "1") != "0":
    try:
      llvm = tinygrad_c("CPU:LLVM")
    except Exception as e:  # libLLVM is optional: report and go on
      print(f"(DEV=CPU:LLVM failed: {str(e).splitlines()[0]})")
  torch = pytorch()
  tg = None
  if os.environ.get("TINYGRAD", "1") != "0":
    try:
      tg = tinygrad()
      if tg is None: print("(tinygrad not installed: pip install tinygrad to compare)")
    except Exception as e:  # tinygrad is optional: report and go on
      print(f"(tinygrad failed: {str(e).splitlines()[0]})")
  rows = [("train step, median (ms)", "step"), ("eval, 10000 images (ms)", "eval"), ("peak RSS (MB)", "rss"),
          ("first step, empty cache (ms)", "first_cold"), ("first step, warm cache (ms)", "first_warm")]
  fmt = lambda v: f"{v:10.1f}" if v is not None else f"{'-':>10}"
  ratio = lambda a, b: f"{a / b:9.2f}x" if a is not None and b else f"{'-':>10}"
  print(f"{'':30} {'tinygrad.c':>10}" + (f" {'CPU:LLVM':>10}" if llvm else "") + f" {'PyTorch':>10}" +
        (f" {'tinygrad':>10}" if tg else "") + f" {'c/PyTorch':>10}" + (f" {'LLVM/c':>10} {'LLVM/PyT':>10}" if llvm else "") +
        (f" {'c/tinygrad':>10}" if tg else ""))
  for label, k in rows:
    line = f"{label:30} {fmt(ours[k])}" + (f" {fmt(llvm[k])}" if llvm else "") + f" {fmt(torch[k])}" + \
        (f" {fmt(tg[k])}" if tg else "") + f" {ratio(ours[k], torch[k])}"
    if llvm: line += f" {ratio(llvm[k], ours[k])} {ratio(llvm[k], torch[k])}"
    if tg: line += f" {ratio(ours[k], tg[k])}"
    print(line)
  print(f"(tinygrad.c: first evaluation, compiling its kernels, {ours['eval_first']:.1f} ms; whole empty-cache run {ours['wall']:.1f} s; "
        f"the warm-cache first step spends {ours['first_warm'] - ours['step']:.1f} ms more than a median step before and around "
        "its kernels. Ratios are tinygrad.c / other: below 1 is faster or smaller.)")


if __name__ == "__main__":
  main()
