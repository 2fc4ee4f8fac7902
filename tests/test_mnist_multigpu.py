"""test_mnist_multigpu.py -- examples/beautiful_mnist_multigpu trained data-parallel on 2 CPU devices
(GPUS=2: weights replicated, batch sharded on axis 0, the step TinyJit'd) follows the single-device
run (GPUS=1) of the same seed: a few steps at a small batch (MNIST_MULTI_STEPS, default 3, at
MNIST_MULTI_BS, default 32), each loss equal to 1e-4 relative (the allreduce sums the gradient in
another order, so the last digits may differ), and the same test accuracy on the first 128 test
images. The first steps also run the eager and the capturing call of the jit, the later ones replays.
Last line: "test_mnist_multigpu: N passed, N failed"; exit 1 on any failure.

Run: /usr/bin/python3 tests/test_mnist_multigpu.py   (after `make`)
"""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.path.join(ROOT, os.environ.get("BUILD", "build"))
EXE = os.path.join(BUILD, "examples", "beautiful_mnist_multigpu")
STEPS = int(os.environ.get("MNIST_MULTI_STEPS", "3"))
BS = int(os.environ.get("MNIST_MULTI_BS", "32"))


def run(gpus):
  env = dict(os.environ, GPUS=str(gpus), BS=str(BS), STEPS=str(STEPS), EVAL_N="128", SEED="42", DEV="CPU")
  p = subprocess.run([EXE], env=env, capture_output=True, text=True, timeout=600)
  if p.returncode != 0:
    raise RuntimeError(f"GPUS={gpus} exited {p.returncode}: {p.stderr.strip()[-500:]}")
  losses = [float(m.group(1)) for m in re.finditer(r"^step \d+ loss (\S+)$", p.stdout, re.M)]
  acc = re.search(r"^test_accuracy (\S+)%$", p.stdout, re.M)
  return losses, float(acc.group(1)) if acc else None, p.stdout


def main():
  passed = failed = 0
  try:
    one, acc1, _ = run(1)
    two, acc2, out2 = run(2)
  except Exception as e:  # noqa: BLE001 -- reported as a failure
    print(f"  FAIL: {e}")
    print("test_mnist_multigpu: 0 passed, 1 failed")
    return 1
  checks = [
    ("2 devices opened", "2 devices (CPU:0, CPU:1)" in out2),
    (f"{STEPS} losses each", len(one) == STEPS and len(two) == STEPS),
    ("losses match", len(one) == len(two) and all(abs(a - b) <= 1e-4 * max(1.0, abs(a)) for a, b in zip(one, two))),
    ("losses finite and falling", all(x == x for x in two) and len(two) > 1 and two[-1] < two[0]),
    ("test accuracy matches", acc1 is not None and acc2 is not None and abs(acc1 - acc2) < 1e-6),
  ]
  for name, ok in checks:
    if ok: passed += 1
    else:
      failed += 1
      print(f"  FAIL: {name}: 1 device {one} acc {acc1}, 2 devices {two} acc {acc2}")
  print(f"test_mnist_multigpu: {passed} passed, {failed} failed")
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())
