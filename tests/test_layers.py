#!/usr/bin/env python3
"""test_layers.py -- the library's layers depend one way: nn -> tensor -> engine -> schedule ->
renderer -> codegen -> runtime -> uop -> src/*.h (helpers, dtypes). A file may include headers of its
own folder and of folders below it, never above (the engine never sees handles or autograd; the
runtime never sees kernels' ASTs). C needs a declaration for every call (-Werror), so the includes
are the dependencies.

  /usr/bin/python3 tests/test_layers.py      (run by tests/run_tests.sh)

Ends with "test_layers: N passed, N failed".
"""
import os, re, sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = os.path.join(ROOT, "src")
ORDER = ["nn", "tensor", "engine", "schedule", "renderer", "codegen", "runtime", "uop", ""]
RANK = {name: len(ORDER) - i for i, name in enumerate(ORDER)}  # higher: closer to the user

passed = failed = 0


def check(ok, what):
  global passed, failed
  if ok:
    passed += 1
  else:
    failed += 1
    print(f"FAIL {what}")


def layer(path):
  rel = os.path.relpath(path, SRC)
  return rel.split(os.sep)[0] if os.sep in rel else ""


files = []
for d, _, names in os.walk(SRC):
  files += [os.path.join(d, n) for n in names if n.endswith((".c", ".h"))]
check(len(files) > 50, f"found the sources ({len(files)} files)")
unknown = sorted({layer(f) for f in files} - set(RANK))
check(not unknown, f"every folder of src/ has a place in the order (unplaced: {unknown})")
edges = set()
for f in sorted(files):
  here = layer(f)
  for inc in re.findall(r'^\s*#\s*include\s+"([^"]+)"', open(f, encoding="utf-8").read(), re.M):
    target = os.path.normpath(os.path.join(os.path.dirname(f), inc))
    if not target.startswith(SRC + os.sep):
      continue  # the public header (include/tinygrad.h) or a generated file
    there = layer(target)
    if there != here:
      edges.add((here, there))
    check(RANK.get(there, 0) <= RANK.get(here, 0),
          f"{os.path.relpath(f, ROOT)} includes {inc}: {there or 'src/'} is above {here or 'src/'}")
# the order is what the code does, not a looser list: the engine uses the schedule, the tensor layer
# the engine, the scheduler the runtime's buffers
for e in [("tensor", "engine"), ("engine", "schedule"), ("engine", "codegen"), ("nn", "tensor")]:
  check(e in edges, f"{e[0]} includes {e[1]}")
print(f"test_layers: {passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
