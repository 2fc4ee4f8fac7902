"""test_examples.py -- the examples' command lines and environment as a careless user gives them.

  - examples/export_mnist (1 training step): an EXPORT_DIR holding a quote, and one holding a shell
    command, is one directory (the command never runs) and the exported classifier agrees with the
    library; an EXPORT_BS of the whole test set or more (a jit captures on its second call; a huge
    one overflowed the buffers' size) is a clear error;
  - examples/onnx_run: an argument that is neither --rand nor a positive size is an error.
Last line: "test_examples: N passed, N failed"; exit 1 on any failure.

Run: /usr/bin/python3 tests/test_examples.py   (after `make`)
"""
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.environ.get("BUILD", "build")
EXAMPLES = os.path.join(BUILD if os.path.isabs(BUILD) else os.path.join(ROOT, BUILD), "examples")
TMP = tempfile.mkdtemp(prefix="tg-examples-")
CASES = []


def case(fn):
  CASES.append(fn)
  return fn


def run(exe, *args, env=None, cwd=None):
  e = dict(os.environ)
  e.update(env or {})
  r = subprocess.run([os.path.join(EXAMPLES, exe), *map(str, args)], capture_output=True, env=e, cwd=cwd, timeout=600)
  return r.returncode, r.stdout.decode("utf-8", "replace"), r.stderr.decode("utf-8", "replace")


@case
def export_mnist_dir_with_quotes():
  work = os.path.join(TMP, "export")
  os.makedirs(work)
  for d in ("it's here", "x';touch PWNED;'"):
    rc, out, err = run("export_mnist", env={"STEPS": "1", "EXPORT_DIR": d, "MNIST_LOAD": ""}, cwd=work)
    assert rc == 0, f"EXPORT_DIR={d!r}: exit {rc}: {err.strip()[-300:]}"
    assert "standalone and library agree on 10000 of 10000" in out, f"EXPORT_DIR={d!r}: {out[-300:]!r}"
    assert os.path.isfile(os.path.join(work, d, "classify")), f"no classify in {d!r}"
  assert not os.path.exists(os.path.join(work, "PWNED")), "a command in EXPORT_DIR ran"


@case
def export_mnist_batch_too_large():
  for bs in ("10000", "4611686018427377905", "9223372036854775807"):
    rc, _, err = run("export_mnist", env={"STEPS": "0", "EXPORT_BS": bs, "EXPORT_DIR": os.path.join(TMP, "big"), "MNIST_LOAD": ""},
                     cwd=TMP)
    assert rc == 1 and "must be below the test set's 10000 images" in err, f"EXPORT_BS={bs}: exit {rc}, {err.strip()[-300:]!r}"


@case
def onnx_run_bad_arguments():
  for arg in ("--rnd", "abc", "0", "-4", "2x"):
    rc, _, err = run("onnx_run", "model.onnx", arg)
    assert rc == 2 and "neither --rand nor a positive dynamic-dim size" in err, f"{arg}: exit {rc}, {err!r}"


def main():
  t0 = time.time()
  passed = failed = 0
  flt = os.environ.get("TEST_FILTER", "")
  for fn in CASES:
    if flt and flt not in fn.__name__:
      continue
    t1 = time.time()
    try:
      fn()
      passed += 1
      print(f"ok   {fn.__name__} ({time.time() - t1:.1f} s)")
    except Exception as e:  # noqa: BLE001
      failed += 1
      print(f"FAIL {fn.__name__}: {e}")
      if os.environ.get("VERBOSE"):
        traceback.print_exc()
  shutil.rmtree(TMP, ignore_errors=True)
  print(f"({time.time() - t0:.1f} s)")
  print(f"test_examples: {passed} passed, {failed} failed")
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())
