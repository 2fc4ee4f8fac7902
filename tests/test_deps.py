#!/usr/bin/env python3
"""test_deps.py -- scripts/deps.sh asks for the right packages in each mode, and `make mnist` uses the
mode that asks only for what training needs.

  /usr/bin/python3 tests/test_deps.py      (run by tests/run_tests.sh)

deps.sh runs with a stand-in dpkg-query first in PATH that records the packages it is asked about
and reports all of them installed (so nothing is installed, nothing needs root), and with a Python
stand-in that imports anything. Ends with "test_deps: N passed, N failed".
"""
import os, subprocess, sys, tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEST_ONLY = {"python3-torch", "python3-numpy", "libfuzzer-14-dev", "libclang-rt-14-dev", "clang"}
MNIST = {"build-essential", "zlib1g-dev", "dataset-fashion-mnist"}

passed = failed = 0


def check(ok, what):
  global passed, failed
  if ok:
    passed += 1
    print(f"ok   {what}")
  else:
    failed += 1
    print(f"FAIL {what}")


def asked(mode, tmp):
  """Packages deps.sh asks dpkg-query about in `mode`, and whether it tried pip/python imports."""
  log, pylog = os.path.join(tmp, "dpkg.log"), os.path.join(tmp, "py.log")
  for p in (log, pylog):
    if os.path.exists(p): os.unlink(p)
  fake = os.path.join(tmp, "bin")
  os.makedirs(fake, exist_ok=True)
  with open(os.path.join(fake, "dpkg-query"), "w") as f:
    f.write('#!/bin/sh\n# -W -f=FORMAT PKG...: every package reported installed\nshift 2\n'
            f'for p in "$@"; do echo "$p" >> {log}; echo "$p install ok installed"; done\n')
  with open(os.path.join(fake, "fakepython"), "w") as f:
    f.write(f'#!/bin/sh\necho "$*" >> {pylog}\nexit 0\n')
  for n in ("dpkg-query", "fakepython"):
    os.chmod(os.path.join(fake, n), 0o755)
  env = dict(os.environ, PATH=fake + ":" + os.environ.get("PATH", ""), PYTHON=os.path.join(fake, "fakepython"))
  env.pop("TG_SKIP_DEPS", None)
  args = ["bash", os.path.join(ROOT, "scripts", "deps.sh")] + ([mode] if mode else [])
  r = subprocess.run(args, env=env, capture_output=True, text=True, timeout=60)
  pkgs = set(open(log).read().split()) if os.path.exists(log) else set()
  return r.returncode, pkgs - {"pkgconf"}, os.path.exists(pylog)


with tempfile.TemporaryDirectory() as tmp:
  rc, pkgs, py = asked("mnist", tmp)
  check(rc == 0, f"deps.sh mnist exits 0 (got {rc})")
  check(pkgs == MNIST, f"deps.sh mnist asks only for {sorted(MNIST)} (asked {sorted(pkgs)})")
  check(not py, "deps.sh mnist checks no Python packages")
  rc, pkgs, py = asked(None, tmp)
  check(rc == 0 and MNIST | TEST_ONLY <= pkgs, f"deps.sh (make test) still asks for the test oracle and fuzzers ({sorted(pkgs)})")
  check(py, "deps.sh (make test) checks the PyPI packages")
  rc, pkgs, _ = asked("bench", tmp)
  check(rc == 0 and "libopenblas0-pthread" in pkgs, "deps.sh bench adds OpenBLAS")
  rc, _, _ = asked("no-such-mode", tmp)
  check(rc == 2, f"deps.sh with an unknown mode fails (exit {rc})")

# make mnist runs deps.sh in mnist mode (make -n prints the recipe without running it)
r = subprocess.run(["make", "-n", "--no-print-directory", "mnist"], cwd=ROOT, capture_output=True, text=True,
                   env=dict(os.environ, MAKEFLAGS=""), timeout=120)
lines = r.stdout.splitlines()
check(any("scripts/deps.sh mnist" in l for l in lines), "make mnist runs scripts/deps.sh mnist")
check(not any(l.strip() == "bash scripts/deps.sh" or l.strip().endswith("deps.sh") for l in lines),
      "make mnist does not run the full deps.sh")

print(f"test_deps: {passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
