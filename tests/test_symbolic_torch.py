"""test_symbolic_torch.py -- symbolic sizes (tinygrad's Variable) against PyTorch on the first v
elements: reductions, softmax, mean and variance over a symbolic axis, attention over v keys (a KV
cache read through a shrink to [0:v]) and a window at a symbolic offset, for random inputs and several
values of v. Each case also checks that the symbolic kernels were compiled once for all values.

Run: /usr/bin/python3 tests/test_symbolic_torch.py   (TINYGRAD_LIB selects the library; TEST_FILTER=substr)
Last line: "test_symbolic_torch: N passed, N failed"; exit 1 on any failure.
"""
import ctypes
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import tinygrad as tg  # noqa: E402
from tinygrad import Tensor, lib  # noqa: E402

torch.set_num_threads(1)
RNG = np.random.default_rng(2024)


class SymVar(ctypes.Structure):
  _fields_ = [("id", ctypes.c_uint64)]


lib.tg_variable.restype, lib.tg_variable.argtypes = SymVar, [ctypes.c_char_p, ctypes.c_int64, ctypes.c_int64]
lib.tg_var_bind.restype, lib.tg_var_bind.argtypes = SymVar, [SymVar, ctypes.c_int64]
lib.tg_sym.restype, lib.tg_sym.argtypes = ctypes.c_int64, [SymVar, ctypes.c_int64]


def variable(name, lo, hi):
  v = lib.tg_variable(name.encode(), lo, hi)
  assert v.id != 0, tg.last_error()
  return v


def sym(v, val, off=0):
  """tg_sym of v bound to val, plus off."""
  b = lib.tg_var_bind(v, val)
  assert b.id != 0, tg.last_error()
  return lib.tg_sym(b, off)


def compiles(): return lib.tg_global_counters().compile_count


def close(got, want, atol=1e-5, rtol=1e-4):
  want = want.detach().numpy() if isinstance(want, torch.Tensor) else want
  assert got.shape == want.shape, (got.shape, want.shape)
  err = np.abs(got - want) - (atol + rtol * np.abs(want))
  assert np.all(err <= 0), f"max error {np.max(np.abs(got - want)):.3g}"


CASES = []
def case(name, fn, *args, **kw): CASES.append((name, fn, args, kw))


def over_values(values, build):
  """For each value: build(v) returns (tensors, check); the tensors are realized -- the kernels
  compiled for the second value serve every later one -- then check() compares them (reading
  symbolic-shaped data copies it out by a kernel of its own, not counted)."""
  for i, val in enumerate(values):
    with tg.scope():
      outs, check = build(val)
      before = compiles()
      tg.realize_many(*outs)
      if i >= 2: assert compiles() == before, f"v={val}: compiled {compiles() - before} kernels"
      check()


def _reductions(maxn):
  a = RNG.standard_normal((5, maxn)).astype(np.float32)
  var = variable("n", 2, maxn)
  ta = torch.tensor(a)
  xa = Tensor(a)

  def build(val):
    x = xa.shrink(((0, 5), (0, sym(var, val))))
    outs = [x.sum(axis=1), x.max(axis=1), x.mean(axis=1), x.softmax(1), x.log_softmax(1)]

    def check():
      t = ta[:, :val]
      close(outs[0].numpy(), t.sum(1))
      close(outs[1].numpy(), t.max(1).values)
      close(outs[2].numpy(), t.mean(1))
      close(outs[3].numpy(), F.softmax(t, 1))
      close(outs[4].numpy(), F.log_softmax(t, 1))
    return outs, check
  over_values([2, 3, maxn // 2, maxn - 1, maxn], build)


case("sum, max, mean, softmax, log_softmax over x[:, 0:v]", _reductions, 37)


def _attention(maxc, h, d):
  q = RNG.standard_normal((1, h, 1, d)).astype(np.float32)
  k = RNG.standard_normal((1, maxc, h, d)).astype(np.float32)
  v = RNG.standard_normal((1, maxc, h, d)).astype(np.float32)
  var = variable("start_pos", 1, maxc - 1)
  tq, tk, tv = torch.tensor(q), torch.tensor(k), torch.tensor(v)
  qa, ka, va = Tensor(q), Tensor(k), Tensor(v)

  def build(val):
    n = sym(var, val, 1)  # keys [0, start_pos + 1)
    ks = ka.shrink(((0, 1), (0, n), (0, h), (0, d))).transpose(1, 2)
    vs = va.shrink(((0, 1), (0, n), (0, h), (0, d))).transpose(1, 2)
    s = qa.matmul(ks.transpose(2, 3)) * (1.0 / np.sqrt(d))
    o = s.softmax(-1).matmul(vs)

    def check():
      ref = F.softmax(tq @ tk[:, :val + 1].transpose(1, 2).transpose(2, 3) / np.sqrt(d), -1) @ tv[:, :val + 1].transpose(1, 2)
      close(o.numpy(), ref)
    return [o], check
  over_values([1, 2, 7, maxc // 2, maxc - 1], build)


case("attention of one query over start_pos + 1 keys of a cache", _attention, 24, 3, 16)


def _window(maxn):
  a = RNG.standard_normal((maxn, 6)).astype(np.float32)
  var = variable("off", 0, maxn - 4)
  ta = torch.tensor(a)
  xa = Tensor(a)

  def build(val):
    w = xa.shrink(((sym(var, val), sym(var, val, 4)), (0, 6))).relu().sum(axis=0)
    return [w], lambda: close(w.numpy(), ta[val:val + 4].relu().sum(0))
  over_values([0, 1, 5, maxn - 4], build)


case("a window x[v:v+4] at a symbolic offset", _window, 20)


def main(): return tg.run_cases(CASES, "test_symbolic_torch")


if __name__ == "__main__":
  sys.exit(main())
