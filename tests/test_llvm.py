#!/usr/bin/env python3
"""test_llvm.py -- DEV=CPU:LLVM (LLVM IR compiled in process) and DEBUG=5..7 on both CPU renderers.

  /usr/bin/python3 tests/test_llvm.py      (run by tests/run_tests.sh)

Checks: CPU:LLVM computes what numpy computes (elementwise, reductions, a matmul, half and int
kernels) and what DEV=CPU computes; arch strings select the target (znver2 without AVX-512 has no
zmm register in its assembly, the host's has where the host has AVX-512F) and bad ones are clear
errors; a missing libLLVM names its package; DEBUG=5 prints each kernel's AST with its ops, DEBUG=6
the loop nest, DEBUG=7 assembly with an FMA for a matmul (objdump for the C renderer, the target
machine's asm for LLVM); program objects land in the kernel cache; a cold DEV=CPU schedule runs
CPU:LLVM stand-ins while gcc builds in the background, and exiting leaves no compiler or file behind.
Ends with
"test_llvm: N passed, N failed".
"""
import os, re, subprocess, sys, tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import numpy as np  # noqa: E402
import tinygrad as tg  # noqa: E402

passed = failed = 0


def check(ok, what, detail=""):
  global passed, failed
  if ok:
    passed += 1
    print(f"ok   {what}")
  else:
    failed += 1
    print(f"FAIL {what}{(': ' + detail) if detail else ''}")


def host_has_avx512f():
  try:
    return " avx512f" in open("/proc/cpuinfo").read()
  except OSError:
    return False


# a child process: one realize under the given environment; its stderr is the DEBUG output
SNIPPET = r"""
import sys; sys.path.insert(0, %r)
import numpy as np, tinygrad as tg
a = tg.Tensor(np.arange(64 * 64, dtype=np.float32).reshape(64, 64) / 4096)
b = tg.Tensor(np.ones((64, 64), dtype=np.float32))
c = (a @ b).numpy()
assert abs(float(c[3, 5]) - float((np.arange(64 * 64, dtype=np.float32).reshape(64, 64) / 4096)[3].sum())) < 1e-3
print("ok")
""" % HERE


def child(env_extra, code=SNIPPET):
  env = dict(os.environ)
  env.update(env_extra)
  r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
  return r.returncode, r.stdout, r.stderr


def test_results():
  rng = np.random.RandomState(1)
  x = rng.randn(37, 130).astype(np.float32)
  y = rng.randn(130, 19).astype(np.float32)
  for dev in ("CPU:LLVM", "CPU"):
    with tg.scope():
      X, Y = tg.Tensor(x, device=dev), tg.Tensor(y, device=dev)
      got = (X @ Y).numpy()
      check(np.allclose(got, x @ y, rtol=1e-4, atol=1e-4), f"{dev}: 37x130 @ 130x19 matmul")
      got = (X.exp() * 2 + X.relu()).sum(axis=1).numpy()
      want = (np.exp(x) * 2 + np.maximum(x, 0)).sum(axis=1)
      check(np.allclose(got, want, rtol=1e-4), f"{dev}: fused exp/relu/sum")
      h = tg.Tensor(x, device=dev).cast(tg.FLOAT16)
      got = (h * h).cast(tg.FLOAT32).numpy()
      want = (x.astype(np.float16) * x.astype(np.float16)).astype(np.float32)
      check(np.array_equal(got, want), f"{dev}: float16 multiply rounds as numpy's")
      i = tg.Tensor(np.arange(-20, 20, dtype=np.int32), device=dev)
      d = np.array([3, -3, 0, 7] * 10, dtype=np.int32)
      got = i.idiv(tg.Tensor(d, device=dev)).numpy()
      ref = tg.Tensor(np.arange(-20, 20, dtype=np.int32), device="CPU").idiv(tg.Tensor(d, device="CPU")).numpy()
      check(np.array_equal(got, ref) and int(got[2]) == 0, f"{dev}: integer division as CPU's, by zero gives 0")
  with tg.scope():
    a = tg.Tensor(x, device="CPU:LLVM").softmax(1).numpy()
    b = tg.Tensor(x, device="CPU").softmax(1).numpy()
    check(np.allclose(a, b, rtol=1e-6, atol=1e-7), "CPU:LLVM softmax equals CPU's (within an ulp)")


def test_arch_errors():
  bad = [
      ("CPU:LLVM:aarch64,cortex-a72", "not this machine"),
      ("CPU:LLVM:x86_64,znver2,+nosuchfeature", "no 'nosuchfeature'"),
      ("CPU:LLVM:x86_64,zn ver2", "bad CPU name"),
      ("CPU:LLVM:x86_64,znver2,av$x", "bad feature"),
      ("CPU:LLVM:x86_64,x86-64,-sse,-sse2", "'-sse' leaves LLVM no registers"),  # (LLVM stopped the process)
      ("CPU:LLVM:,znver2", "bad architecture name"),
      ("CPU:LLVM:x86_64,znver3,-64bit-mode", "the code's mode"),  # (LLVM stopped the process)
      ("CPU:LLVM:x86_64,znver3,+32bit-mode", "the code's mode"),
      ("CPU:LLVM:x86_64,znver3,-64bit", "needs the 64-bit instructions"),
      ("CPU:C:x86_64", "has no arch"),
      ("CPU:FORTRAN", "no renderer 'FORTRAN'"),
  ]
  for name, want in bad:
    try:
      with tg.scope():
        tg.Tensor.zeros(3, device=name).numpy()
      check(False, f"{name} is refused", "no error")
    except tg.TGError as e:
      check(want in str(e), f"{name} is refused: ...{want}...", str(e))
    tg.clear_error()
  with tg.scope():
    ok = tg.Tensor.ones(4, device="CPU:LLVM:x86_64,znver2,avx2,-avx512f").sum().numpy()
    check(float(ok) == 4.0, "CPU:LLVM:x86_64,znver2,avx2,-avx512f opens and computes")
  # a 32-bit CPU or one LLVM does not know only tunes: the 64-bit instructions are asked for (LLVM's
  # back end stopped the process on the first kernel); in a child, as an abort would end this one
  code = ("import sys; sys.path.insert(0, %r)\nimport numpy as np, tinygrad as tg\n"
          "print(float(tg.Tensor(np.arange(8, dtype=np.float32) / 8).exp().sum().numpy()))\n" % os.path.dirname(os.path.abspath(__file__)))
  want = float(np.exp(np.arange(8, dtype=np.float32) / 8).sum())
  for cpu in ("pentium", "i386", "native"):
    rc, out, err = child({"DEV": f"CPU:LLVM:x86_64,{cpu}"}, code)
    check(rc == 0 and abs(float(out.strip() or "nan") - want) < 1e-4, f"CPU:LLVM:x86_64,{cpu} computes", f"rc {rc}: {err[-300:]}")


def test_missing_library():
  rc, out, err = child({"DEV": "CPU:LLVM", "TG_LLVM_LIB": "/nonexistent/libLLVM-15.so.1"},
                       "import sys; sys.path.insert(0, %r)\nimport tinygrad as tg\n"
                       "try:\n  tg.Tensor.ones(3).numpy()\nexcept tg.TGError as e:\n  print('ERR', e)\n" % HERE)
  check("ERR" in out and "libllvm15" in out and "/nonexistent/libLLVM-15.so.1" in out,
        "a missing libLLVM is an error naming the library and its package", out + err)


def test_debug_levels():
  for dev in ("CPU", "CPU:LLVM"):
    rc, out, err = child({"DEV": dev, "DEBUG": "5"})
    check(rc == 0 and "*** r_" in err and " AST" in err, f"{dev} DEBUG=5 prints the AST", err[-400:])
    ops = all(f" {op} " in err for op in ("DEFINE_GLOBAL", "RANGE", "LOAD", "MUL", "REDUCE", "STORE"))
    check(ops and "float" in err and "(64,64,64)" in err, f"{dev} DEBUG=5 names the ops, dtypes and loop sizes", err[-600:])
    rc, out, err = child({"DEV": dev, "DEBUG": "6"})
    check(rc == 0 and "for ridx0 in [gstart, gend)" in err and "reduce ADD" in err and "instructions (" in err,
          f"{dev} DEBUG=6 shows the loop nest and instruction list", err[-600:])
    rc, out, err = child({"DEV": dev, "DEBUG": "7"})
    check(rc == 0 and " assembly (" in err, f"{dev} DEBUG=7 prints assembly", err[-600:])
    check("vfmadd" in err or "vfmadd" in err.lower(), f"{dev} DEBUG=7 of a matmul has an FMA instruction", err[-800:])
    if dev == "CPU" and " avx" in open("/proc/cpuinfo").read() and not os.environ.get("CC"):
      # gcc: the register tile's operand vectors are pinned in registers (TG_PIN), so no FMA of the
      # matmul reloads a whole vector from memory (an embedded scalar broadcast, {1toN}, may stay)
      folded = [ln for ln in err.splitlines() if re.search(r"vfmadd\w*\s+-?(0x)?[0-9a-f]*\(%", ln) and "{1to" not in ln]
      check(" TG_PIN32(" in err or " TG_PIN64(" in err, "CPU: the matmul's source pins its operand vectors", err[-800:])
      check(not folded, "CPU (gcc): no FMA of the matmul loads its vector operand from memory", "\n".join(folded[:6]))
  if host_has_avx512f():
    rc, out, err = child({"DEV": "CPU:LLVM", "DEBUG": "7"})
    check("zmm" in err, "host CPU:LLVM (AVX-512F) uses zmm registers", err[-400:])
  rc, out, err = child({"DEV": "CPU:LLVM:x86_64,znver2,avx2,-avx512f", "DEBUG": "7"})
  check(rc == 0 and "vfmadd" in err and "ymm" in err and "zmm" not in err,
        "CPU:LLVM:x86_64,znver2,avx2,-avx512f: FMA on ymm, no zmm register", err[-800:])
  rc, out, err = child({"DEV": "CPU", "DEBUG": "7", "OBJDUMP": "/nonexistent/objdump"})
  check(rc == 0 and err.count("objdump not found") == 1, "without objdump DEBUG=7 says so once", err[-400:])


# a 2x2 max-pool written as a reshape and a max over the two window axes (reduce loops of 2 steps)
POOL_SNIPPET = r"""
import sys; sys.path.insert(0, %r)
import numpy as np, tinygrad as tg
x = np.random.RandomState(3).randn(2, 8, 16, 32).astype(np.float32)
y = tg.Tensor(x).reshape(2, 8, 8, 2, 16, 2).max(axis=(3, 5)).numpy()
assert np.array_equal(y, x.reshape(2, 8, 8, 2, 16, 2).max(axis=(3, 5)))
print("ok")
""" % HERE


def test_short_loops():
  # a vector kernel whose reduce loops are this short is marked, and LLVM unrolls them whole: one
  # NaN-aware max (an unordered compare) per window position in the kernel's assembly, not one in a
  # loop taken four times
  rc, out, err = child({"DEV": "CPU:LLVM", "DEBUG": "7", "DISABLE_COMPILER_CACHE": "1"}, POOL_SNIPPET)
  check(rc == 0 and out.strip() == "ok", "CPU:LLVM 2x2 window max equals numpy's", (out + err)[-600:])
  check("; tinygrad.c: unroll-short-loops" in err, "a kernel with 2-step reduce loops is marked for unrolling", err[-600:])
  asm = err[err.find(" assembly ("):] if " assembly (" in err else ""
  check(asm.count("vcmpunordps") >= 4, "its window loops are unrolled (4 max steps in the assembly)",
        f"{asm.count('vcmpunordps')} unordered compares")


# float16 arithmetic in vector lanes, special values included, against numpy's (which rounds after
# every operation, as tinygrad does)
HALF_SNIPPET = r"""
import sys; sys.path.insert(0, %r)
import numpy as np, tinygrad as tg
rng = np.random.RandomState(5)
h = (rng.randn(64, 256) * 300).astype(np.float16)
h.reshape(-1)[:8] = [np.inf, -np.inf, np.nan, 6e-8, -6e-8, 65504, 1e-5, 0]
y = ((tg.Tensor(h) * tg.Tensor(h) + tg.Tensor(h)) / 3).numpy()
with np.errstate(all="ignore"):
  want = (h * h + h) / np.float16(3)
assert y.dtype == np.float16 and np.array_equal(y, want, equal_nan=True), np.argwhere(~((y == want) | np.isnan(want)))[:4]
print("ok")
""" % HERE


def test_half_lanes():
  # CPU:LLVM computes float16 in float vector lanes: loads, rounding and stores converted as vectors,
  # with the CPU's F16C where it has it and the arch keeps it, else with integer vector code
  if not os.path.exists("/proc/cpuinfo") or " f16c" not in open("/proc/cpuinfo").read():
    return
  rc, out, err = child({"DEV": "CPU:LLVM", "DEBUG": "7", "DISABLE_COMPILER_CACHE": "1"}, HALF_SNIPPET)
  check(rc == 0 and out.strip() == "ok", "CPU:LLVM float16 arithmetic equals numpy's", (out + err)[-600:])
  check(re.search(r"fpext <\d+ x half>", err) is not None and "vcvtph2ps" in err and "vcvtps2ph" in err,
        "its kernel converts float16 vectors with F16C", err[-600:])
  arch = "CPU:LLVM:x86_64,x86-64-v3,-f16c"
  rc, out, err = child({"DEV": arch, "DEBUG": "7", "DISABLE_COMPILER_CACHE": "1"}, HALF_SNIPPET)
  check(rc == 0 and out.strip() == "ok", f"{arch}: float16 arithmetic equals numpy's", (out + err)[-600:])
  check("@tg_vh2f_" in err and "@tg_vf2h_" in err and "vcvtph2ps" not in err and "vcvtps2ph" not in err,
        f"{arch}: its kernel converts float16 vectors with integer code, not F16C", err[-600:])


def test_cache():
  with tempfile.TemporaryDirectory() as d:
    env = {"DEV": "CPU:LLVM", "TINYGRAD_CACHE_DIR": d}
    rc, out, err = child(env)
    files = os.listdir(os.path.join(d, "kernels")) if os.path.isdir(os.path.join(d, "kernels")) else []
    check(rc == 0 and len(files) >= 1, "CPU:LLVM objects are written to the kernel cache", str(files))
    blob = open(os.path.join(d, "kernels", files[0]), "rb").read() if files else b""
    check(b"TGLL" in blob and b"\x7fELF" in blob, "a cache entry holds the kernel's ELF object")
    rc2, out2, err2 = child(dict(env, DEBUG="2"))
    check(rc2 == 0 and out2.strip() == "ok", "a second process runs from the cache", err2[-400:])


# one kernel on two CPU:LLVM devices: each loads the same object, which the JIT holds once (a second
# copy's symbol was a "Duplicate definition" error on the second device)
TWO_DEVICES_SNIPPET = r"""
import sys; sys.path.insert(0, %r)
import numpy as np, tinygrad as tg
x = np.arange(8, dtype=np.float32)
with tg.scope():
  r = [((tg.Tensor(x, device=d) * 2) + 1).numpy() for d in ("CPU:LLVM", "CPU:1:LLVM", "CPU:LLVM", "CPU:2:LLVM")]
assert all((v == x * 2 + 1).all() for v in r), r
print("ok")
""" % HERE


def test_two_devices():
  for cache in ("0", "1"):
    with tempfile.TemporaryDirectory() as d:
      env = {"TINYGRAD_CACHE_DIR": d, "DISABLE_COMPILER_CACHE": cache}
      rc, out, err = child(env, TWO_DEVICES_SNIPPET)
      rc2, out2, err2 = child(env, TWO_DEVICES_SNIPPET)  # (from the disk cache, unless disabled)
      check(rc == 0 and out.strip() == "ok" and rc2 == 0 and out2.strip() == "ok",
            f"one kernel on CPU:LLVM, CPU:1:LLVM and CPU:2:LLVM (DISABLE_COMPILER_CACHE={cache})", (err + err2)[-600:])


# LLVM's loop strength reduction is left out of code generation (compile time); TG_LLVM_LSR=1 keeps
# it: the same results, and kernels built either way are kept apart in the cache
def test_lsr_switch():
  with tempfile.TemporaryDirectory() as d:
    env = {"DEV": "CPU:LLVM", "TINYGRAD_CACHE_DIR": d, "DEBUG": "3"}
    rc, out, err = child(env)
    check(rc == 0 and out.strip() == "ok" and "CPU:LLVM: compiled" in err, "CPU:LLVM without LSR computes the product", err[-400:])
    rc2, out2, err2 = child(dict(env, TG_LLVM_LSR="1"))
    check(rc2 == 0 and out2.strip() == "ok", "CPU:LLVM with TG_LLVM_LSR=1 computes the product", err2[-400:])
    check("CPU:LLVM: compiled" in err2, "a kernel built with LSR is not taken from the cache entry of one built without")
    rc3, out3, err3 = child(env)
    check(rc3 == 0 and "CPU:LLVM: compiled" not in err3, "the cache entry built without LSR is found again", err3[-400:])


# several kernels in one schedule: a cold CPU:LLVM realize compiles them as batches (one module,
# one object, one JIT entry shared by their programs)
BATCH_SNIPPET = r"""
import sys; sys.path.insert(0, %r)
import numpy as np, tinygrad as tg
rng = np.random.RandomState(3)
x, w1, w2 = (rng.randn(*s).astype(np.float32) for s in ((16, 40), (40, 32), (32, 10)))
for _ in range(3):
  h = (tg.Tensor(x) @ tg.Tensor(w1)).relu()
  y = (h @ tg.Tensor(w2)).softmax(1) + (h.exp() * 0.5).mean(0).sum()
  got = y.numpy()
e = np.maximum(x @ w1, 0)
z = e @ w2
sm = np.exp(z - z.max(1, keepdims=True))
want = sm / sm.sum(1, keepdims=True) + (np.exp(e) * 0.5).mean(0).sum()
assert np.allclose(got, want, rtol=1e-4, atol=1e-4), abs(got - want).max()
print("sum %%.6f" %% float(got.sum()))
""" % HERE


def test_batch():
  with tempfile.TemporaryDirectory() as d:
    env = {"DEV": "CPU:LLVM", "TINYGRAD_CACHE_DIR": d, "DEBUG": "3"}
    rc, out, err = child(env, BATCH_SNIPPET)
    check(rc == 0 and "compiled a batch of " in err, "a cold CPU:LLVM schedule compiles its kernels as a batch",
          (out + err)[-800:])
    rc2, out2, err2 = child(env, BATCH_SNIPPET)
    check(rc2 == 0 and out2 == out and "CPU:LLVM: compiled" not in err2,
          "a second process loads the batch from the cache and computes the same", (out2 + err2)[-800:])
    # one loaded program at a time: every batch's programs are unloaded (the shared object goes with
    # the last) and reloaded one by one
    rc3, out3, err3 = child(dict(env, MAX_LOADED_KERNELS="1", DEBUG="0"), BATCH_SNIPPET)
    check(rc3 == 0 and out3 == out, "batched programs unload and reload with MAX_LOADED_KERNELS=1", (out3 + err3)[-800:])
  rc4, out4, err4 = child({"DEV": "CPU"}, BATCH_SNIPPET)
  check(rc4 == 0 and out4.strip() and abs(float(out4.split()[1]) - float(out.split()[1])) < 1e-3,
        "the batch computes what DEV=CPU computes", out4 + out)


def procs_mentioning(text):
  found = []
  for pid in os.listdir("/proc"):
    if not pid.isdigit():
      continue
    try:
      cmd = open(f"/proc/{pid}/cmdline", "rb").read().decode(errors="replace")
    except OSError:
      continue
    if text in cmd:
      found.append(cmd.replace("\0", " "))
  return found


# tiered compilation (DEV=CPU, default CC): a cold schedule runs CPU:LLVM stand-ins while the C
# compiler builds in the background; a process that exits at once leaves no compiler running and no
# file behind, and computes what TIERED=0 computes
def test_tiered():
  with tempfile.TemporaryDirectory() as d, tempfile.TemporaryDirectory() as tmp, tempfile.TemporaryDirectory() as d0:
    env = {"DEV": "CPU", "CC": "cc", "TINYGRAD_CACHE_DIR": d, "TMPDIR": tmp, "DEBUG": "3"}
    rc, out, err = child(env, BATCH_SNIPPET)
    check(rc == 0 and "CPU:LLVM: compiled" in err, "a cold DEV=CPU schedule runs CPU:LLVM stand-ins", (out + err)[-800:])
    left = [f for f in os.listdir(tmp) if f.startswith("tgk-")]
    check(not left, "a process exiting with background compiles pending leaves no compiler file", str(left))
    running = procs_mentioning(tmp)
    check(not running, "and no compiler process running", str(running))
    rc0, out0, err0 = child(dict(env, TIERED="0", DEBUG="0", TINYGRAD_CACHE_DIR=d0), BATCH_SNIPPET)
    check(rc0 == 0 and out0.strip() and out.strip() and abs(float(out0.split()[1]) - float(out.split()[1])) < 1e-3,
          "tiered and TIERED=0 compute the same", out + out0 + err0[-400:])
    check("CPU:LLVM: compiled" not in err0, "TIERED=0 compiles no stand-in", err0[-400:])
    rc2, out2, err2 = child(dict(env, TG_LLVM_LIB="/nonexistent/libLLVM-15.so.1", TINYGRAD_CACHE_DIR=d0 + "/x"), BATCH_SNIPPET)
    check(rc2 == 0 and out2 == out0, "without libLLVM DEV=CPU compiles with the C compiler alone", (out2 + err2)[-400:])


def main():
  for f in (test_results, test_arch_errors, test_missing_library, test_debug_levels, test_short_loops, test_half_lanes, test_cache, test_two_devices, test_lsr_switch, test_batch,
            test_tiered):
    try:
      f()
    except Exception as e:  # noqa: BLE001
      check(False, f.__name__, f"{type(e).__name__}: {e}")
  check(tg.live_count() == 0, "no live handles at the end", str(tg.live_count()))
  print(f"test_llvm: {passed} passed, {failed} failed")
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())
