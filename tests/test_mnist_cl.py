"""test_mnist_cl.py -- examples/beautiful_mnist trained on OpenCL (DEV=CL, PoCL in `make test`) follows
the CPU run of the same seed.

The full recipe (70 steps at BS=512, then the test set) costs several minutes on PoCL here (seconds
per train step, see docs/performance.md), too long for `make test`; so both devices train
MNIST_CL_STEPS steps (default 4) at BS=MNIST_CL_BS (default 128) from SEED=42, with MNIST_TRACE,
and measure the test accuracy on the first MNIST_CL_EVAL_N (default 1000) test images (the whole
test set takes minutes on PoCL); the test checks that they start from the same weights and draw the same batches, that the CL
losses follow the CPU's step by step (the first to 1e-5, later ones to 1e-3 relative: the two
devices' kernels round differently and training amplifies that), and that the final test accuracies
are within half a point. Skips, saying why, only when no OpenCL device opens here.
Last line: "test_mnist_cl: N passed, N failed"; exit 1 on any failure.

Run: /usr/bin/python3 tests/test_mnist_cl.py   (after `make`)
"""
import json
import os
import re
import struct
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.path.join(ROOT, os.environ.get("BUILD", "build"))  # run_tests.sh passes it relative to ROOT
EXE = os.path.join(BUILD, "examples", "beautiful_mnist")
DEVICES = os.path.join(BUILD, "examples", "devices")
STEPS = int(os.environ.get("MNIST_CL_STEPS", "4"))
BS = int(os.environ.get("MNIST_CL_BS", "128"))
EVAL_N = int(os.environ.get("MNIST_CL_EVAL_N", "1000"))


def tensors(blob):
  """safetensors bytes -> {name: (dtype, shape, list of float32 values)} (F32 tensors only)"""
  n = struct.unpack("<Q", blob[:8])[0]
  head = json.loads(blob[8:8 + n])
  out = {}
  for k, v in head.items():
    if k == "__metadata__": continue
    a, b = v["data_offsets"]
    raw = blob[8 + n + a:8 + n + b]
    vals = list(struct.unpack(f"<{len(raw) // 4}f", raw)) if v["dtype"] == "F32" else raw
    out[k] = (v["dtype"], v["shape"], vals)
  return out


def close_weights(x, y):
  """the same tensors; float32 values equal to a few ulps (the devices round the initializers'
  arithmetic, a scale of uniform samples, each in its own way)"""
  if sorted(x) != sorted(y): return False
  for k in x:
    if x[k][:2] != y[k][:2]: return False
    if x[k][0] != "F32":
      if x[k][2] != y[k][2]: return False
      continue
    if any(abs(a - b) > 1e-6 * (1 + abs(a)) for a, b in zip(x[k][2], y[k][2])): return False
  return True


def run(dev, d):
  env = dict(os.environ, DEV=dev, SEED="42", STEPS=str(STEPS), BS=str(BS), EVAL_N=str(EVAL_N), MNIST_TRACE=d, MNIST_SAVE="")
  env.pop("IMAGE", None)
  r = subprocess.run([EXE], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=d)
  m = re.search(r"test accuracy ([0-9.]+)%", r.stdout)
  if r.returncode != 0 or not m:
    raise RuntimeError(f"beautiful_mnist on {dev} failed (exit {r.returncode}):\n{r.stdout}\n{r.stderr[-2000:]}")
  with open(os.path.join(d, "losses.txt")) as f:
    losses = [float(x) for x in f.read().split()]
  with open(os.path.join(d, "samples.bin"), "rb") as f:
    samples = f.read()
  with open(os.path.join(d, "init.safetensors"), "rb") as f:
    init = tensors(f.read())
  return float(m.group(1)), losses, samples, init


def main():
  passed = failed = 0
  if not os.path.exists(EXE):
    print(f"{EXE} is missing: run `make` first\ntest_mnist_cl: 0 passed, 1 failed")
    sys.exit(1)
  dv = subprocess.run([DEVICES], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  if "on CL" not in dv.stdout:
    print("test_mnist_cl: SKIPPED -- no OpenCL device opens here:\n" + dv.stdout)
    print("test_mnist_cl: 0 passed, 0 failed")
    return
  with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
    try:
      cpu = run("CPU", a)
      cl = run("CL", b)
    except RuntimeError as e:
      print(e)
      print("test_mnist_cl: 0 passed, 1 failed")
      sys.exit(1)
  checks = [
      ("same initial weights", close_weights(cpu[3], cl[3])),
      ("same batches", cpu[2] == cl[2] and len(cpu[2]) == 4 * STEPS * BS),
      (f"{STEPS} losses each", len(cpu[1]) == STEPS and len(cl[1]) == STEPS),
      ("first loss to 1e-5", abs(cpu[1][0] - cl[1][0]) <= 1e-5 * abs(cpu[1][0])),
      ("losses to 1e-3", all(abs(x - y) <= 1e-3 * abs(x) for x, y in zip(cpu[1], cl[1]))),
      ("the loss falls", cl[1][-1] < 0.8 * cl[1][0]),
      ("test accuracy within 0.5 points", abs(cpu[0] - cl[0]) <= 0.5),
  ]
  print(f"beautiful_mnist SEED=42 BS={BS} {STEPS} steps, EVAL_N={EVAL_N}: CPU losses {cpu[1]}, accuracy {cpu[0]:.2f}%")
  print(f"                                    CL  losses {cl[1]}, accuracy {cl[0]:.2f}%")
  for name, ok in checks:
    print(f"  {'ok  ' if ok else 'FAIL'} {name}")
    passed += ok
    failed += not ok
  print(f"test_mnist_cl: {passed} passed, {failed} failed")
  sys.exit(1 if failed else 0)


if __name__ == "__main__":
  main()
