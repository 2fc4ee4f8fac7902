"""test_mnist_mpi.py -- examples/beautiful_mnist trained data-parallel over 2 MPI ranks
(`mpirun -np 2`: each rank trains on half of the same global batch, BatchNorm statistics and
gradients allreduced inside the jitted step) follows one process with the same global batch and seed:
a few steps (MNIST_MPI_STEPS, default 3, at MNIST_MPI_BS, default 32), each loss equal to 1e-4
relative (sums in another order), the same initial weights and batches (MNIST_TRACE), the same test
accuracy on the first 128 test images, and the checkpoint: written once (rank 0 alone), with every
tensor equal to the one-process checkpoint's to 1e-4. The first steps also run the eager and the
capturing call of the jit, the later ones replays.
Last line: "test_mnist_mpi: N passed, N failed"; exit 1 on any failure.

Run: /usr/bin/python3 tests/test_mnist_mpi.py   (after `make`; needs mpirun, as make test installs)
"""
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.path.join(ROOT, os.environ.get("BUILD", "build"))
EXE = os.path.join(BUILD, "examples", "beautiful_mnist")
STEPS = int(os.environ.get("MNIST_MPI_STEPS", "3"))
BS = int(os.environ.get("MNIST_MPI_BS", "32"))


def read_safetensors(path):
  """{name: list of floats} of a float32 safetensors file"""
  with open(path, "rb") as f:
    data = f.read()
  (n,) = struct.unpack("<Q", data[:8])
  header = json.loads(data[8:8 + n])
  out = {}
  for name, info in header.items():
    if name == "__metadata__": continue
    a, b = info["data_offsets"]
    raw = data[8 + n + a:8 + n + b]
    fmt = {"F32": "f", "I64": "q", "I32": "i"}[info["dtype"]]
    out[name] = list(struct.unpack("<%d%s" % (len(raw) // struct.calcsize(fmt), fmt), raw))
  return out


def run(ranks, work):
  trace = os.path.join(work, f"trace{ranks}")
  os.makedirs(trace)
  save = os.path.join(work, f"ranks{ranks}.safetensors")
  env = dict(os.environ, BS=str(BS), STEPS=str(STEPS), EVAL_N="128", SEED="42", DEV="CPU", MNIST_SAVE=save,
             MNIST_TRACE=trace, THREADS="1", ASAN_OPTIONS="detect_leaks=0")
  cmd = [EXE]
  if ranks > 1:
    cmd = ["mpirun", "--oversubscribe", "-np", str(ranks)] + (["--allow-run-as-root"] if os.geteuid() == 0 else []) + cmd
  p = subprocess.run(["timeout", "300"] + cmd, env=env, capture_output=True, text=True, cwd=work)
  if p.returncode != 0:
    raise RuntimeError(f"{ranks} rank(s) exited {p.returncode}: {(p.stdout + p.stderr).strip()[-800:]}")
  with open(os.path.join(trace, "losses.txt")) as f:
    losses = [float(x) for x in f.read().split()]
  with open(os.path.join(trace, "samples.bin"), "rb") as f:
    samples = f.read()
  with open(os.path.join(trace, "init.safetensors"), "rb") as f:
    init = f.read()
  acc = re.search(r"^final: loss \S+, test accuracy (\S+)%", p.stdout, re.M)
  return {"losses": losses, "samples": samples, "init": init, "acc": float(acc.group(1)) if acc else None,
          "out": p.stdout, "saves": p.stdout.count("saved weights to"), "ckpt": read_safetensors(save)}


def close(a, b):
  return len(a) == len(b) and all(abs(x - y) <= 1e-4 * max(1.0, abs(x)) for x, y in zip(a, b))


def main():
  if not shutil.which("mpirun"):
    print("  FAIL: mpirun is not installed (scripts/deps.sh installs openmpi-bin)")
    print("test_mnist_mpi: 0 passed, 1 failed")
    return 1
  work = tempfile.mkdtemp(prefix="mnist-mpi.")
  passed = failed = 0
  try:
    one, two = run(1, work), run(2, work)
  except Exception as e:  # noqa: BLE001 -- reported as a failure
    print(f"  FAIL: {e}")
    print("test_mnist_mpi: 0 passed, 1 failed")
    shutil.rmtree(work, ignore_errors=True)
    return 1
  checks = [
    ("2 ranks ran data-parallel", "data-parallel over 2 MPI ranks" in two["out"]),
    ("same initial weights and batches", one["init"] == two["init"] and one["samples"] == two["samples"]),
    (f"{STEPS} losses each", len(one["losses"]) == STEPS and len(two["losses"]) == STEPS),
    ("losses match", close(one["losses"], two["losses"])),
    ("losses finite and falling", all(x == x for x in two["losses"]) and two["losses"][-1] < two["losses"][0]),
    ("test accuracy matches", one["acc"] is not None and two["acc"] is not None and abs(one["acc"] - two["acc"]) < 1e-6),
    ("one checkpoint written (rank 0)", two["saves"] == 1),
    ("checkpoints match", one["ckpt"].keys() == two["ckpt"].keys() and
     all(close(one["ckpt"][k], two["ckpt"][k]) for k in one["ckpt"])),
  ]
  for name, ok in checks:
    if ok: passed += 1
    else:
      failed += 1
      print(f"  FAIL: {name}: 1 process losses {one['losses']} acc {one['acc']}, 2 ranks {two['losses']} acc {two['acc']}")
  shutil.rmtree(work, ignore_errors=True)
  print(f"test_mnist_mpi: {passed} passed, {failed} failed")
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())
