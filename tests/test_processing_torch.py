"""test_processing_torch.py -- differential tests of src/tensor/processing.c against PyTorch 1.13.

isclose / allclose, cumprod / logcumsumexp / cummax / cummin, max_pool2d with indices and
max_unpool2d, einsum, interpolate, sort / argsort / topk, multinomial, qr and svd. Forward against
torch (numpy's linalg for the decompositions: reconstruction, orthogonality, singular values), backward
through tg_backward(sum(out * w)) (w random) against torch autograd where the op is differentiable,
over shapes with 0-sized, 1-sized and non-contiguous (permuted, flipped, shrunk, padded) inputs; error
cases (the message must name the function); kernel counts where fusion is the point. Every case runs in
its own tg scope and the live handle count must be back where it started at the end.
Last line: "test_processing_torch: N passed, N failed"; exit status 1 on any failure.

Run: /usr/bin/python3 tests/test_processing_torch.py   (TINYGRAD_LIB selects the library; TEST_FILTER=substr)
"""
import ctypes
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import tinygrad as tg  # noqa: E402
from tinygrad import Tensor, TGError, _T, call, lib  # noqa: E402
from torchcheck import close, backward, expect_error, grad, kernels, set_rg, view_of, status as _status, pair as _pair  # noqa: E402
import torchcheck  # noqa: E402

torch.set_num_threads(1)
RNG = np.random.default_rng(4321)


def rnd(*shape, **kw): return torchcheck.rnd(*shape, rng=RNG, **kw)

# ---- prototypes of the processing section of include/tinygrad.h ---------------------------------
_i64p, _tp = ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(_T)
_I, _I64, _B, _D = ctypes.c_int, ctypes.c_int64, ctypes.c_bool, ctypes.c_double


class PoolOpts(ctypes.Structure):
  _fields_ = [("kernel_size", ctypes.c_int64 * 2), ("stride", ctypes.c_int64 * 2), ("dilation", ctypes.c_int64 * 2),
              ("padding", ctypes.c_int64 * 4), ("npadding", _I), ("ceil_mode", _B), ("exclude_pad", _B)]


class InterpOpts(ctypes.Structure):
  _fields_ = [("mode", _I), ("align_corners", _B)]


_PO, _IO = ctypes.POINTER(PoolOpts), ctypes.POINTER(InterpOpts)
_SIGS = {
    "tg_isclose": (_T, [_T, _T, _D, _D, _B]), "tg_allclose": (_I, [_T, _T, _D, _D, _B, ctypes.POINTER(_B)]),
    "tg_cumprod": (_T, [_T, _I]), "tg_logcumsumexp": (_T, [_T, _I]),
    "tg_cummax": (_I, [_T, _I, _tp, _tp]), "tg_cummin": (_I, [_T, _I, _tp, _tp]),
    "tg_max_pool2d_with_indices": (_I, [_T, _PO, _tp, _tp]), "tg_max_pool2d": (_T, [_T, _PO]),
    "tg_max_unpool2d": (_T, [_T, _T, _PO, _i64p, _I]),
    "tg_einsum": (_T, [ctypes.c_char_p, _tp, _I]),
    "tg_interpolate": (_T, [_T, _i64p, _I, _IO]),
    "tg_sort": (_I, [_T, _I, _B, _tp, _tp]), "tg_argsort": (_T, [_T, _I, _B]),
    "tg_topk": (_I, [_T, _I64, _I, _B, _B, _tp, _tp]),
    "tg_multinomial": (_T, [_T, _I64, _B]),
    "tg_qr": (_I, [_T, _tp, _tp]), "tg_svd": (_I, [_T, _B, _tp, _tp, _tp]),
    "tg_cumsum": (_T, [_T, _I]), "tg_abs": (_T, [_T]),
    "tg_set_requires_grad": (_T, [_T, _B]), "tg_backward": (_I, [_T]), "tg_grad": (_T, [_T]),
}
for _n, (_r, _a) in _SIGS.items():
  _f = getattr(lib, _n)
  _f.restype, _f.argtypes = _r, _a

W = Tensor._wrap
NONE_T = _T(0)


def _outs(n): return [_T() for _ in range(n)]


# thin wrappers (each raises TGError with the library's message on failure)
def isclose(x, y, rtol=1e-5, atol=1e-8, equal_nan=False): return W(call("isclose", x.h, y.h, rtol, atol, equal_nan))


def allclose(x, y, rtol=1e-5, atol=1e-8, equal_nan=False):
  b = _B()
  _status("tg_allclose", lib.tg_allclose(x.h, y.h, rtol, atol, equal_nan, ctypes.byref(b)))
  return b.value


def cumprod(x, axis=0): return W(call("cumprod", x.h, axis))
def logcumsumexp(x, axis=0): return W(call("logcumsumexp", x.h, axis))


def _two(name, fn_args, want2=True):
  v, i = _T(), _T()
  _status("tg_" + name, getattr(lib, "tg_" + name)(*fn_args, ctypes.byref(v), ctypes.byref(i) if want2 else None))
  return (W(v), W(i)) if want2 else W(v)


def cummax(x, axis=0, idx=True): return _two("cummax", (x.h, axis), idx)
def cummin(x, axis=0, idx=True): return _two("cummin", (x.h, axis), idx)


def pool_opts(kernel_size=None, stride=None, dilation=None, padding=None, ceil_mode=False):
  if padding is None or isinstance(padding, int): pads, npad = (padding or 0, 0, 0, 0), (1 if padding else 0)
  else: pads, npad = tuple(padding) + (0,) * (4 - len(padding)), len(padding)
  return PoolOpts(_pair(kernel_size), _pair(stride), _pair(dilation), pads, npad, ceil_mode, False)


def max_pool2d_idx(x, **kw): return _two("max_pool2d_with_indices", (x.h, ctypes.byref(pool_opts(**kw))))


def max_unpool2d(x, idx, output_size=None, **kw):
  os_ = (ctypes.c_int64 * len(output_size))(*output_size) if output_size else None
  return W(call("max_unpool2d", x.h, idx.h, ctypes.byref(pool_opts(**kw)), os_, len(output_size) if output_size else 0))


def einsum(formula, *ts):
  arr = (_T * max(len(ts), 1))(*[t.h for t in ts])
  return W(call("einsum", formula.encode(), arr, len(ts)))


MODES = {"linear": 0, "nearest": 1, "nearest-exact": 2, "bilinear": 3, "trilinear": 4}


def interpolate(x, size, mode="linear", align_corners=False):
  arr = (ctypes.c_int64 * len(size))(*size)
  return W(call("interpolate", x.h, arr, len(size), ctypes.byref(InterpOpts(MODES[mode], align_corners))))


def sort(x, dim=-1, descending=False): return _two("sort", (x.h, dim, descending))
def argsort(x, dim=-1, descending=False): return W(call("argsort", x.h, dim, descending))
def topk(x, k, dim=-1, largest=True, sorted_=True): return _two("topk", (x.h, k, dim, largest, sorted_))
def multinomial(p, n, replacement=False): return W(call("multinomial", p.h, n, replacement))


def qr(x):
  q, r = _T(), _T()
  _status("tg_qr", lib.tg_qr(x.h, ctypes.byref(q), ctypes.byref(r)))
  return W(q), W(r)


def svd(x, full_matrices=True):
  u, s, vt = _T(), _T(), _T()
  _status("tg_svd", lib.tg_svd(x.h, full_matrices, ctypes.byref(u), ctypes.byref(s), ctypes.byref(vt)))
  return W(u), W(s), W(vt)


# ---- input makers ---------------------------------------------------------------------------------


def distinct(*shape, dtype=np.float32):
  """Values without ties (a shuffled arange, scaled), so that indices are unambiguous."""
  n = int(np.prod(shape))
  return (RNG.permutation(n).astype(np.float64) * 0.37 - n * 0.15).astype(dtype).reshape(shape)


VIEWS = ["contig", "permuted", "flipped", "shrunk", "padded"]

# ---- test registry ---------------------------------------------------------------------------------
CASES = []


def case(name, fn, *args, **kw): CASES.append((name, fn, args, kw))


def check_fwd_bwd(f_tg, f_torch, arrays, atol=1e-5, rtol=1e-4, gatol=None, grad_of=None, views=None):
  """Forward of f_tg(tensors) vs f_torch(torch tensors), then backward of sum(out * w) for the float
  inputs (grad_of: indices; default all float inputs). views: per-input view kinds (no grads then)."""
  if grad_of is None: grad_of = [i for i, a in enumerate(arrays) if np.issubdtype(a.dtype, np.floating)]
  if views: grad_of = []
  ts = [view_of(a, views[i]) if views else Tensor(a) for i, a in enumerate(arrays)]
  for i in grad_of: set_rg(ts[i])
  out = f_tg(*ts)
  tt = [torch.tensor(a, requires_grad=(i in grad_of)) for i, a in enumerate(arrays)]
  ref = f_torch(*tt)
  if grad_of:  # the loss is built before `out` is realized
    wv = RNG.uniform(0.5, 1.5, size=ref.shape).astype(np.float32)
    backward((out * Tensor(wv)).sum())
    (ref * torch.tensor(wv)).sum().backward()
  close(out.numpy(), ref, atol, rtol, "forward")
  for i in grad_of:
    close(grad(ts[i]).numpy(), tt[i].grad, gatol if gatol is not None else max(atol, 1e-5), rtol, f"grad of input {i}")


# =====================================================================================================
# isclose / allclose
for sa, sb, rtol, atol in [((3, 4), (3, 4), 1e-5, 1e-8), ((3, 4), (4,), 1e-2, 1e-3), ((2, 1, 3), (4, 1), 0.0, 0.5),
                           ((0, 3), (3,), 1e-5, 1e-8), ((), (5,), 0.1, 0.0)]:
  def _c(sa=sa, sb=sb, rtol=rtol, atol=atol):
    full = np.broadcast_shapes(sa, sb)
    a, b = rnd(*sa), rnd(*sb)
    noise = RNG.choice([0.0, 1e-9, 1e-6, 1e-4, 1e-2, 0.3], size=full).astype(np.float32)
    if full == sb: b = (np.broadcast_to(a, full) + noise).astype(np.float32)  # some elements close, some not
    elif full == sa: a = (np.broadcast_to(b, full) + noise).astype(np.float32)
    close(isclose(Tensor(a), Tensor(b), rtol, atol).numpy(), torch.isclose(torch.tensor(a), torch.tensor(b), rtol, atol))
  case(f"isclose {sa} vs {sb} rtol={rtol} atol={atol}", _c)


def _isclose_special():
  inf, nan = float("inf"), float("nan")
  a = np.array([1.0, inf, -inf, inf, nan, nan, 0.0, 1e-9, -0.0, 3.0], np.float32)
  b = np.array([1.0, inf, inf, 1.0, nan, 1.0, 1e-9, 0.0, 0.0, nan], np.float32)
  for eq in (False, True):
    close(isclose(Tensor(a), Tensor(b), equal_nan=eq).numpy(), torch.isclose(torch.tensor(a), torch.tensor(b), equal_nan=eq),
          what=f"equal_nan={eq}")


case("isclose: inf, -inf, nan (equal_nan both ways), signed zero", _isclose_special)


def _isclose_ints():
  a = np.array([0, 5, -7, 100, 2**20], np.int32)
  b = np.array([0, 6, -7, 101, 2**20 + 3], np.int32)
  for rtol, atol in [(1e-5, 1e-8), (0.01, 0.0), (0.0, 1.0)]:
    close(isclose(Tensor(a), Tensor(b), rtol, atol).numpy(), torch.isclose(torch.tensor(a), torch.tensor(b), rtol, atol))
  # exact where torch's float32 arithmetic rounds 2^30 + 3 to 2^30
  big = isclose(Tensor(np.array([2**30], np.int32)), Tensor(np.array([2**30 + 3], np.int32)), 0.0, 1.0)
  close(big.numpy(), np.array([False]))
  ua, ub = np.array([3, 5, 200], np.uint8), np.array([5, 3, 200], np.uint8)  # |3 - 5| must not wrap to 254
  close(isclose(Tensor(ua), Tensor(ub), 0.0, 2.0).numpy(), np.array([True, True, True]))
  close(isclose(Tensor(ua), Tensor(ub), 0.0, 1.0).numpy(), np.array([False, False, True]))


case("isclose: int32 and uint8 (no wrap-around), int vs torch", _isclose_ints)


def _isclose_mixed():
  a = rnd(4, 3).astype(np.float16)
  b = (a.astype(np.float32) + rnd(4, 3) * 1e-3).astype(np.float32)
  r = isclose(Tensor(a), Tensor(b), 1e-3, 1e-3)
  assert r.dtype == tg.BOOL, r.dtype
  close(r.numpy(), np.isclose(a.astype(np.float32), b, 1e-3, 1e-3))
  i = np.array([1, 2, 3], np.int32)
  f = np.array([1.0, 2.5, 3.0000001], np.float32)
  close(isclose(Tensor(i), Tensor(f)).numpy(), torch.isclose(torch.tensor(i).float(), torch.tensor(f)))


case("isclose: float16 vs float32 and int vs float promote", _isclose_mixed)


def _isclose_views():
  a = rnd(3, 5)
  b = a + rnd(3, 5) * np.float32(1e-3)
  for kind in VIEWS:
    close(isclose(view_of(a, kind), view_of(b, kind), 1e-3, 1e-4).numpy(),
          torch.isclose(torch.tensor(a), torch.tensor(b), 1e-3, 1e-4), what=kind)


case("isclose on non-contiguous views", _isclose_views)


def _isclose_one_kernel():
  a, b = Tensor(rnd(16, 16)).realize(), Tensor(rnd(16, 16)).realize()
  k = kernels(lambda: isclose(a, b, 1e-2, 1e-2))
  assert k == 1, f"isclose took {k} kernels (expected 1)"


case("isclose is one fused kernel", _isclose_one_kernel)


def _allclose():
  a = rnd(4, 5)
  assert allclose(Tensor(a), Tensor(a.copy())) is True
  b = a.copy()
  b[2, 3] += 1e-3
  assert allclose(Tensor(a), Tensor(b)) == torch.allclose(torch.tensor(a), torch.tensor(b)) == False  # noqa: E712
  assert allclose(Tensor(a), Tensor(b), atol=1e-2) == torch.allclose(torch.tensor(a), torch.tensor(b), atol=1e-2) == True  # noqa: E712
  n = np.array([np.nan, 1.0], np.float32)
  assert not allclose(Tensor(n), Tensor(n)) and allclose(Tensor(n), Tensor(n), equal_nan=True)
  assert allclose(Tensor(rnd(0, 3)), Tensor(rnd(3)))  # empty: all of nothing is true
  assert allclose(Tensor(a[:1]), Tensor(np.broadcast_to(a[:1], (4, 5)).copy()))  # broadcasts


case("allclose: true, false, atol, nan, empty, broadcast (vs torch)", _allclose)

# =====================================================================================================
# scans
for shape, axis in [((6,), 0), ((3, 4), 0), ((3, 4), 1), ((2, 3, 5), -2), ((1, 7), 1), ((4, 1), 1), ((600,), 0),
                    ((3, 530), 1)]:
  def _c(shape=shape, axis=axis):
    a = rnd(*shape, lo=0.85, hi=1.15)  # no zeros: the gradient divides by x (as tinygrad)
    a = a * np.where(RNG.uniform(size=shape) < 0.3, -1, 1).astype(np.float32)
    check_fwd_bwd(lambda t: cumprod(t, axis), lambda t: torch.cumprod(t, axis), [a], atol=1e-5, rtol=2e-4)
  case(f"cumprod {shape} axis={axis} (+ backward)", _c)


def _cumprod_edge():
  for shape, axis in [((0,), 0), ((2, 0), 1), ((0, 3), 1), ((), 0), ((1,), 0)]:
    a = rnd(*shape)
    close(cumprod(Tensor(a), axis).numpy(), torch.cumprod(torch.tensor(a), axis), what=str(shape))
  i = np.array([[1, 2, 3], [-1, 4, -2]], np.int32)
  r = cumprod(Tensor(i), 1)
  close(r.numpy(), np.cumprod(i, 1))
  for kind in VIEWS:
    a = rnd(3, 4, lo=0.5, hi=1.5)
    close(cumprod(view_of(a, kind), 1).numpy(), np.cumprod(a, 1), what=kind)


case("cumprod: 0-sized, 0-d, 1-sized, int32, non-contiguous views", _cumprod_edge)


def _cumprod_one_kernel():
  a = Tensor(rnd(8, 32)).realize()
  k = kernels(lambda: cumprod(a, 1))
  assert k == 1, f"cumprod of (8, 32) took {k} kernels (expected 1)"


case("cumprod of a short axis is one kernel", _cumprod_one_kernel)

for shape, axis in [((5,), 0), ((3, 4), 0), ((3, 4), 1), ((2, 3, 6), -1), ((1, 1), 0), ((700,), 0)]:
  def _c(shape=shape, axis=axis):
    a = rnd(*shape, lo=-5, hi=5)
    check_fwd_bwd(lambda t: logcumsumexp(t, axis), lambda t: torch.logcumsumexp(t, axis), [a], atol=2e-5, rtol=1e-4)
  case(f"logcumsumexp {shape} axis={axis} (+ backward)", _c)


def _lcse_edge():
  a = np.array([100.0, -100.0, 80.0, 100.0], np.float32)  # large values: no overflow
  close(logcumsumexp(Tensor(a), 0).numpy(), torch.logcumsumexp(torch.tensor(a), 0))
  inf = np.array([[-np.inf, -np.inf, 1.0, np.inf, 2.0], [-np.inf, 0.0, -np.inf, -1.0, np.inf]], np.float32)
  close(logcumsumexp(Tensor(inf), 1).numpy(), torch.logcumsumexp(torch.tensor(inf), 1), what="+-inf inputs")
  for shape in [(0,), (3, 0)]:
    close(logcumsumexp(Tensor(rnd(*shape)), -1).numpy(), torch.logcumsumexp(torch.tensor(rnd(*shape)), -1))
  close(logcumsumexp(Tensor(np.float32(1.5)), 0).numpy(), np.float32(1.5))
  i = np.array([1, 2, 3], np.int32)
  r = logcumsumexp(Tensor(i), 0)
  assert r.dtype == tg.FLOAT32, r.dtype
  close(r.numpy(), torch.logcumsumexp(torch.tensor(i, dtype=torch.float32), 0))
  a = rnd(4, 3)
  for kind in VIEWS: close(logcumsumexp(view_of(a, kind), 0).numpy(), torch.logcumsumexp(torch.tensor(a), 0), what=kind)
  a64 = rnd(3, 5, dtype=np.float64)
  r = logcumsumexp(Tensor(a64), 1)
  assert r.dtype == tg.FLOAT64
  close(r.numpy(), torch.logcumsumexp(torch.tensor(a64), 1), atol=1e-12, rtol=1e-12)


case("logcumsumexp: large values, 0-sized, 0-d, int -> float, views, float64", _lcse_edge)

for name, tfn, ofn in [("cummax", torch.cummax, cummax), ("cummin", torch.cummin, cummin)]:
  for shape, axis in [((7,), 0), ((4, 5), 0), ((4, 5), 1), ((2, 3, 4), -1), ((1,), 0), ((600,), 0)]:
    def _c(shape=shape, axis=axis, tfn=tfn, ofn=ofn):
      a = distinct(*shape)
      x = set_rg(Tensor(a))
      v, i = ofn(x, axis)
      t = torch.tensor(a, requires_grad=True)
      rv, ri = tfn(t, axis)
      wv = rnd(*rv.shape, lo=0.5, hi=1.5)
      backward((v * Tensor(wv)).sum())
      (rv * torch.tensor(wv)).sum().backward()
      close(v.numpy(), rv, what="values")
      close(i.numpy(), ri, what="indices")
      assert i.dtype == tg.INT32
      close(grad(x).numpy(), t.grad, what="grad")
    case(f"{name} {shape} axis={axis} values, indices, backward", _c)

  def _ties(tfn=tfn, ofn=ofn):
    a = np.array([[1, 1, 0, 1, 2, 2, -3, 2], [5, 5, 5, 4, 6, 6, 6, 0]], np.int32)
    for axis in (0, 1):
      v, i = ofn(Tensor(a), axis)
      rv, ri = tfn(torch.tensor(a), axis)
      close(v.numpy(), rv, what="values")
      close(i.numpy(), ri, what="indices (ties: the latest, as torch)")
    b = np.array([True, False, True, True], np.bool_)
    v, i = ofn(Tensor(b), 0)
    rv, ri = tfn(torch.tensor(b), 0)
    close(v.numpy(), rv, what="bool values")
    close(i.numpy(), ri, what="bool indices")

  case(f"{name} with ties (int32, bool) matches torch's indices", _ties)

  def _edge(tfn=tfn, ofn=ofn, name=name):
    for shape, axis in [((0,), 0), ((3, 0), 1), ((0, 4), 1), ((), 0)]:
      a = rnd(*shape)
      v, i = ofn(Tensor(a), axis)
      rv, ri = tfn(torch.tensor(a), axis)
      close(v.numpy(), rv, what=f"{shape} values")
      close(i.numpy(), ri, what=f"{shape} indices")
    a = np.array([-128, 127, -5, 127, -128], np.int8)
    v, i = ofn(Tensor(a), 0)
    rv, ri = tfn(torch.tensor(a), 0)
    close(v.numpy(), rv), close(i.numpy(), ri)
    a = np.array([3, 0, 255, 7], np.uint8)
    v = ofn(Tensor(a), 0, idx=False)
    close(v.numpy(), np.maximum.accumulate(a) if name == "cummax" else np.minimum.accumulate(a))
    a = distinct(3, 4)
    for kind in VIEWS:
      v, i = ofn(view_of(a, kind), 1)
      rv, ri = tfn(torch.tensor(a), 1)
      close(v.numpy(), rv, what=kind), close(i.numpy(), ri, what=kind)

  case(f"{name}: 0-sized, 0-d, int8 extremes, uint8, no indices, views", _edge)

# =====================================================================================================
# max_pool2d with indices, max_unpool2d
POOLS = [
    ((1, 1, 4, 4), dict(kernel_size=2)),
    ((2, 3, 5, 6), dict(kernel_size=3, stride=2)),
    ((1, 2, 7, 7), dict(kernel_size=3, stride=2, padding=1)),
    ((1, 1, 8, 7), dict(kernel_size=(3, 2), stride=(2, 1), dilation=(2, 1))),
    ((2, 1, 5, 5), dict(kernel_size=2, ceil_mode=True)),
    ((1, 1, 6, 6), dict(kernel_size=3, stride=1, padding=1)),
    ((3, 4, 4), dict(kernel_size=2, stride=1)),
]
for shape, kw in POOLS:
  def _c(shape=shape, kw=kw):
    a = distinct(*shape)
    x = set_rg(Tensor(a))
    v, i = max_pool2d_idx(x, **kw)
    tkw = dict(kw)
    t = torch.tensor(a, requires_grad=True)
    rv, ri = F.max_pool2d(t, return_indices=True, **tkw)
    wv = rnd(*rv.shape, lo=0.5, hi=1.5)
    backward((v * Tensor(wv)).sum())
    (rv * torch.tensor(wv)).sum().backward()
    close(v.numpy(), rv, what="values")
    close(i.numpy(), ri, what="indices")
    close(grad(x).numpy(), t.grad, what="grad")
    close(v.numpy(), W(call("max_pool2d", Tensor(a).h, ctypes.byref(pool_opts(**kw)))).numpy(), what="== tg_max_pool2d")
  case(f"max_pool2d_with_indices {shape} {kw} (+ backward)", _c)


def _pool_idx_ties_ints():
  a = np.array([[[[1, 3, 3, 0], [3, 2, 1, 1], [0, 0, 5, 5], [0, 0, 5, 5]]]], np.int32)
  v, i = max_pool2d_idx(Tensor(a), kernel_size=2)
  rv, ri = F.max_pool2d(torch.tensor(a, dtype=torch.float32), 2, return_indices=True)
  close(v.numpy(), rv.int()), close(i.numpy(), ri, what="first maximum in row-major order")
  z = np.zeros((2, 0, 4, 4), np.float32)
  v, i = max_pool2d_idx(Tensor(z), kernel_size=2)
  assert v.shape == (2, 0, 2, 2) and i.shape == (2, 0, 2, 2)
  a = distinct(1, 2, 6, 5)
  for kind in VIEWS:
    v, i = max_pool2d_idx(view_of(a, kind), kernel_size=2, stride=1)
    rv, ri = F.max_pool2d(torch.tensor(a), 2, 1, return_indices=True)
    close(v.numpy(), rv, what=kind), close(i.numpy(), ri, what=kind)


case("max_pool2d_with_indices: ties (int32), 0-sized batch, non-contiguous views", _pool_idx_ties_ints)

UNPOOLS = [((1, 1, 4, 4), dict(kernel_size=2), None), ((2, 3, 6, 5), dict(kernel_size=2, stride=2), (6, 5)),
           ((1, 2, 5, 5), dict(kernel_size=2, stride=2), (5, 5)), ((1, 1, 7, 7), dict(kernel_size=3, stride=3, padding=1), None),
           ((2, 4, 4), dict(kernel_size=2), None)]
for shape, kw, osz in UNPOOLS:
  def _c(shape=shape, kw=kw, osz=osz):
    a = distinct(*shape)
    rv, ri = F.max_pool2d(torch.tensor(a), return_indices=True, **kw)
    pv = rv.detach().numpy()
    x = set_rg(Tensor(pv))
    out = max_unpool2d(x, Tensor(ri.numpy()), output_size=osz, **kw)
    t = torch.tensor(pv, requires_grad=True)
    ukw = {k: v for k, v in kw.items() if k in ("kernel_size", "stride", "padding")}
    ref = F.max_unpool2d(t, ri, output_size=osz, **ukw)
    wv = rnd(*ref.shape, lo=0.5, hi=1.5)
    backward((out * Tensor(wv)).sum())
    (ref * torch.tensor(wv)).sum().backward()
    close(out.numpy(), ref, what="forward")
    close(grad(x).numpy(), t.grad, what="grad")
  case(f"max_unpool2d {shape} {kw} output_size={osz} (+ backward)", _c)


def _unpool_overlap():
  # overlapping windows repeat indices: torch keeps one value, we average equal values (tinygrad would add)
  a = distinct(2, 2, 6, 6)
  rv, ri = F.max_pool2d(torch.tensor(a), 3, 1, return_indices=True)
  assert len(np.unique(ri.numpy()[0, 0])) < ri.numpy()[0, 0].size, "test needs repeated indices"
  out = max_unpool2d(Tensor(rv.numpy()), Tensor(ri.numpy().astype(np.int32)), kernel_size=3, stride=1)
  close(out.numpy(), F.max_unpool2d(rv, ri, 3, 1))
  # a round trip through our own pooling, int64 indices, int dtype values
  ai = (distinct(1, 1, 4, 6) * 10).astype(np.int32)
  v, i = max_pool2d_idx(Tensor(ai), kernel_size=2)
  out = max_unpool2d(v, i.cast(tg.INT64), kernel_size=2)
  rv, ri = F.max_pool2d(torch.tensor(ai, dtype=torch.float64), 2, return_indices=True)
  close(out.numpy(), F.max_unpool2d(rv, ri, 2).int())


case("max_unpool2d: overlapping windows, round trip with int32 values / int64 indices", _unpool_overlap)

# =====================================================================================================
# einsum
EINSUMS = [
    ("ij,jk->ik", [(3, 4), (4, 5)]), ("ij,jk", [(2, 3), (3, 2)]), ("i,j->ij", [(3,), (4,)]), ("i,i->", [(5,), (5,)]),
    ("ij->ji", [(3, 4)]), ("ij->", [(3, 4)]), ("ij->j", [(3, 4)]), ("ii", [(4, 4)]), ("ii->i", [(3, 3)]),
    ("iij->ij", [(3, 3, 2)]), ("jii->ij", [(2, 3, 3)]), ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 2)]), ("...ij,...jk->...ik", [(2, 1, 3, 4), (5, 4, 2)]),
    ("...ij,...jk", [(2, 3, 4), (4, 2)]), ("i...->...", [(3, 2, 4)]), ("Ab,bC", [(2, 3), (3, 4)]),
    ("bhqd,bhkd->bhqk", [(2, 2, 3, 4), (2, 2, 5, 4)]), ("ij,ij->ij", [(3, 4), (3, 4)]), ("ij,jk->ik", [(2, 1), (3, 4)]),
    ("i,->i", [(4,), ()]), ("ij,kj->ik", [(0, 3), (2, 3)]), ("ij,jk->ik", [(2, 0), (0, 3)]), ("iji->j", [(2, 3, 2)]),
    ("a b , b c -> a c", [(2, 3), (3, 2)]), ("ba,ca->", [(1, 4), (3, 4)]),
]
for formula, shapes in EINSUMS:
  def _c(formula=formula, shapes=shapes):
    arrs = [rnd(*s) for s in shapes]
    check_fwd_bwd(lambda *ts: einsum(formula, *ts), lambda *ts: torch.einsum(formula.replace(" ", ""), *ts), arrs,
                  atol=1e-5, rtol=1e-4)
  case(f"einsum \"{formula}\" {shapes} (+ backward)", _c)


def _einsum_views():
  a, b = rnd(3, 4), rnd(4, 5)
  for kind in VIEWS:
    close(einsum("ij,jk->ki", view_of(a, kind), view_of(b, kind)).numpy(), np.einsum("ij,jk->ki", a, b), what=kind)
  i = RNG.integers(-5, 5, size=(3, 3)).astype(np.int32)
  r = einsum("ii", Tensor(i))
  assert r.dtype == tg.INT32, r.dtype
  close(r.numpy(), np.trace(i))


case("einsum on non-contiguous views; int32 trace keeps int", _einsum_views)


def _einsum_one_kernel():
  a, b = Tensor(rnd(8, 16)).realize(), Tensor(rnd(16, 8)).realize()
  k = kernels(lambda: einsum("ij,jk->ik", a, b))
  assert k == 1, f"einsum matmul took {k} kernels (expected 1)"
  c = Tensor(rnd(8, 8)).realize()
  k = kernels(lambda: einsum("ij,jk,kl->il", a, b, c))
  assert k == 1, f"einsum of three took {k} kernels (expected 1)"


case("einsum contraction is one fused kernel", _einsum_one_kernel)

# =====================================================================================================
# interpolate
INTERPS = [
    ((1, 2, 5), (8,), "linear", False), ((1, 2, 8), (3,), "linear", False), ((1, 2, 5), (8,), "linear", True),
    ((2, 3, 4, 5), (7, 3), "bilinear", False), ((2, 3, 4, 5), (7, 3), "bilinear", True), ((1, 1, 3, 3), (6, 6), "bilinear", False),
    ((1, 1, 6, 7), (2, 3), "bilinear", False), ((1, 1, 4, 4), (1, 1), "bilinear", True), ((1, 1, 4, 4), (1, 5), "bilinear", False),
    ((1, 2, 3, 4, 5), (4, 2, 6), "trilinear", False), ((1, 2, 3, 4, 5), (4, 2, 6), "trilinear", True),
    ((1, 2, 5), (9,), "nearest", False), ((1, 2, 9), (4,), "nearest", False), ((2, 1, 5, 7), (3, 11), "nearest", False),
    ((1, 2, 5), (9,), "nearest-exact", False), ((2, 1, 5, 7), (3, 11), "nearest-exact", False), ((0, 2, 3, 3), (5, 5), "bilinear", False),
    ((1, 1, 1, 1), (3, 2), "bilinear", False), ((1, 1, 2, 2), (2, 2), "nearest", False),
]
for shape, size, mode, ac in INTERPS:
  def _c(shape=shape, size=size, mode=mode, ac=ac):
    a = rnd(*shape)
    tkw = dict(align_corners=ac) if mode in ("linear", "bilinear", "trilinear") else {}
    check_fwd_bwd(lambda t: interpolate(t, size, mode, ac), lambda t: F.interpolate(t, size=size, mode=mode, **tkw), [a],
                  atol=1e-5, rtol=1e-4)
  case(f"interpolate {shape} -> {size} {mode} align_corners={ac} (+ backward)", _c)


def _interp_misc():
  a = rnd(2, 3, 4, 5)
  # LINEAR on the last two dims is bilinear
  close(interpolate(Tensor(a), (6, 2), "linear").numpy(), F.interpolate(torch.tensor(a), size=(6, 2), mode="bilinear"))
  u8 = RNG.integers(0, 256, size=(1, 3, 4, 4)).astype(np.uint8)
  r = interpolate(Tensor(u8), (7, 9), "nearest")
  assert r.dtype == tg.UINT8
  close(r.numpy(), F.interpolate(torch.tensor(u8), size=(7, 9), mode="nearest"))
  for kind in VIEWS:
    close(interpolate(view_of(a, kind), (3, 7), "bilinear", True).numpy(),
          F.interpolate(torch.tensor(a), size=(3, 7), mode="bilinear", align_corners=True), what=kind)
  h = rnd(1, 1, 3, 4).astype(np.float16)
  r = interpolate(Tensor(h), (5, 6), "bilinear")
  assert r.dtype == tg.FLOAT16
  close(r.numpy(), F.interpolate(torch.tensor(h).float(), size=(5, 6), mode="bilinear"), atol=2e-3, rtol=2e-3)
  # no batch dims at all (tinygrad accepts 0..N batch dims)
  v = rnd(5)
  close(interpolate(Tensor(v), (9,), "linear").numpy(), F.interpolate(torch.tensor(v)[None, None], size=9, mode="linear")[0, 0])


case("interpolate: linear == bilinear, uint8 nearest, views, float16, no batch dims", _interp_misc)


def _interp_int_linear():
  # linear modes on integer tensors follow tinygrad (the reference; PyTorch refuses them): uint8 goes
  # through tinygrad's fixed-point uint8 lerp, other ints lerp in float and truncate back. Expected
  # values are tinygrad's own output for these inputs.
  x = np.array([10, 0, 20, 5]).reshape(1, 1, 1, 4)
  for dt, want in ((np.uint8, [10, 6, 1, 10, 19, 10, 5]), (np.uint16, [10, 6, 0, 10, 18, 10, 5]),
                   (np.int32, [10, 6, 0, 10, 18, 10, 5])):
    r = interpolate(Tensor(x.astype(dt)), (1, 7), "linear")
    assert r.dtype == tg.np_dtype_to_tg(dt), tg.dtype_name(r.dtype)
    np.testing.assert_array_equal(r.numpy().reshape(-1), want, err_msg=str(dt))
  u = np.array([[[[171, 206, 5, 206, 120], [131, 161, 73, 250, 13], [71, 98, 146, 104, 33]],
                 [[11, 0, 12, 38, 255], [48, 167, 192, 60, 72], [111, 67, 249, 45, 229]]]], np.uint8)
  want = [[[[171, 191, 222, 5, 222, 169, 120], [146, 164, 168, 48, 254, 225, 53], [109, 125, 127, 100, 54, 29, 21],
            [71, 86, 112, 146, 116, 73, 33]],
           [[11, 5, 3, 12, 30, 21, 255], [34, 74, 206, 221, 26, 49, 45], [72, 105, 126, 213, 26, 46, 35],
            [111, 86, 46, 249, 30, 14, 229]]]]
  np.testing.assert_array_equal(interpolate(Tensor(u), (4, 7), "bilinear").numpy(), want)
  want = [[[[171, 194, 224, 5, 224, 177, 120], [144, 165, 162, 50, 3, 229, 49], [111, 130, 125, 98, 54, 27, 20],
            [71, 89, 114, 146, 118, 80, 33]],
           [[11, 4, 4, 12, 29, 25, 255], [36, 86, 204, 218, 22, 51, 47], [69, 112, 216, 211, 21, 50, 39],
            [111, 82, 42, 249, 28, 21, 229]]]]
  np.testing.assert_array_equal(interpolate(Tensor(u), (4, 7), "bilinear", True).numpy(), want)


case("interpolate: integer linear modes as tinygrad (uint8 fixed-point lerp, others through float)", _interp_int_linear)


def _interp_kernels():
  # each resized dim is one kernel over the data: its two gathers fuse into the lerp that reads them;
  # the last dim's source positions and weights are three small tables (one kernel each)
  a = Tensor(rnd(2, 3, 8, 9)).realize()
  k = kernels(lambda: interpolate(a, (16, 18), "bilinear"))
  assert k == 5, f"bilinear took {k} kernels"
  # a gather read by a reduction keeps its own kernel (no data-dependent loads in the reduce loop)
  idx = Tensor(RNG.integers(0, 8, size=(2, 3, 8, 9)).astype(np.int64)).realize()
  lib.tg_gather.restype, lib.tg_gather.argtypes = _T, [_T, ctypes.c_int, _T]
  k = kernels(lambda: W(lib.tg_gather(a.h, 2, idx.h)).sum())
  assert k == 2, f"gather + sum took {k} kernels"


case("kernel counts: a bilinear resize is a kernel per dim; a gather under a sum is its own", _interp_kernels)

# =====================================================================================================
# sort, argsort, topk
SORTS = [((5,), -1, False), ((5,), -1, True), ((8,), 0, False), ((3, 7), 1, True), ((3, 7), 0, False), ((2, 3, 9), 1, True),
         ((4, 16), -1, False), ((2, 1), 1, True), ((1, 33), 1, False), ((2, 100), 1, True)]
for shape, dim, desc in SORTS:
  def _c(shape=shape, dim=dim, desc=desc):
    a = distinct(*shape)
    x = set_rg(Tensor(a))
    v, i = sort(x, dim, desc)
    t = torch.tensor(a, requires_grad=True)
    rv, ri = torch.sort(t, dim, desc)
    wv = rnd(*rv.shape, lo=0.5, hi=1.5)
    backward((v * Tensor(wv)).sum())
    (rv * torch.tensor(wv)).sum().backward()
    close(v.numpy(), rv, what="values")
    close(i.numpy(), ri, what="indices")
    assert i.dtype == tg.INT32
    close(grad(x).numpy(), t.grad, what="grad")
  case(f"sort {shape} dim={dim} descending={desc} (+ backward)", _c)


def _sort_ties():
  a = RNG.integers(0, 4, size=(3, 13)).astype(np.int32)
  for desc in (False, True):
    v, i = sort(Tensor(a), 1, desc)
    rv, ri = torch.sort(torch.tensor(a), dim=1, descending=desc, stable=True)
    close(v.numpy(), rv, what="values"), close(i.numpy(), ri, what="stable indices")
  f = np.array([1.0, 0.0, 1.0, -0.0, 1.0, 2.0, 0.0], np.float32)
  for desc in (False, True):
    v, i = sort(Tensor(f), 0, desc)
    rv, ri = torch.sort(torch.tensor(f), dim=0, descending=desc, stable=True)
    close(v.numpy(), rv), close(i.numpy(), ri)


case("sort with ties: values match, indices stable (as torch stable=True, both directions)", _sort_ties)


def _sort_dtypes():
  for dt, lo, hi in [(np.int8, -128, 128), (np.uint8, 0, 256), (np.int16, -5, 5), (np.int64, -2**62, 2**62),
                     (np.uint32, 0, 2**32)]:
    a = RNG.integers(lo, hi, size=(2, 11), dtype=np.int64 if dt != np.uint32 else np.uint64).astype(dt)
    for desc in (False, True):
      v, i = sort(Tensor(a), -1, desc)
      ref = np.sort(a, -1, kind="stable")
      ri = np.argsort(a, -1, kind="stable")
      if desc: ref, ri = ref[:, ::-1], np.argsort(-a.astype(np.float64), -1, kind="stable")
      assert v.dtype == tg.np_dtype_to_tg(dt)
      close(v.numpy(), ref, what=f"{np.dtype(dt).name} desc={desc}")
      close(i.numpy(), ri, what=f"{np.dtype(dt).name} desc={desc} indices")
  ex = np.array([2**63 - 1, -2**63, 0, 2**63 - 1, -2**63 + 1], np.int64)  # the pads never beat real extremes
  close(sort(Tensor(ex), 0, False)[0].numpy(), np.sort(ex))
  close(sort(Tensor(ex), 0, True)[0].numpy(), np.sort(ex)[::-1])
  b = np.array([True, False, True, False, False], np.bool_)
  v, i = sort(Tensor(b), 0, False)
  rv, ri = torch.sort(torch.tensor(b), stable=True)
  close(v.numpy(), rv), close(i.numpy(), ri)
  h = distinct(3, 6).astype(np.float16)
  v, i = sort(Tensor(h), 1, True)
  rv, ri = torch.sort(torch.tensor(h).float(), 1, True)
  close(v.numpy(), rv), close(i.numpy(), ri)
  inf = np.array([np.inf, -np.inf, 1.0, -np.inf, 0.5], np.float32)
  for desc in (False, True):
    v, i = sort(Tensor(inf), 0, desc)
    rv, ri = torch.sort(torch.tensor(inf), dim=0, descending=desc, stable=True)
    close(v.numpy(), rv), close(i.numpy(), ri)


case("sort: int8/uint8/int16/int64 (extremes)/uint32, bool, float16, +-inf", _sort_dtypes)


def _sort_edge():
  for shape, dim in [((0,), 0), ((3, 0), 1), ((0, 4), 1), ((), 0), ((1,), 0), ((5, 1), 1)]:
    a = rnd(*shape)
    v, i = sort(Tensor(a), dim, True)
    rv, ri = torch.sort(torch.tensor(a), dim, True)
    close(v.numpy(), rv, what=str(shape)), close(i.numpy(), ri, what=str(shape))
  a = distinct(4, 6)
  for kind in VIEWS:
    v, i = sort(view_of(a, kind), 1)
    rv, ri = torch.sort(torch.tensor(a), 1)
    close(v.numpy(), rv, what=kind), close(i.numpy(), ri, what=kind)
  close(argsort(Tensor(a), 0, True).numpy(), torch.argsort(torch.tensor(a), 0, True))
  close(argsort(Tensor(a)).numpy(), torch.argsort(torch.tensor(a)))
  # values only
  v = _two("sort", (Tensor(a).h, 1, False), want2=False)
  close(v.numpy(), np.sort(a, 1))


case("sort: 0-sized, 0-d, 1-sized, views, argsort, values only", _sort_edge)


def _sort_long():
  a = distinct(2, 300)
  v, i = sort(Tensor(a), 1, True)
  rv, ri = torch.sort(torch.tensor(a), 1, True)
  close(v.numpy(), rv), close(i.numpy(), ri)
  a = RNG.integers(-50, 50, size=(700,)).astype(np.int32)  # many ties, 10 stages
  v, i = sort(Tensor(a), 0)
  rv, ri = torch.sort(torch.tensor(a), stable=True)
  close(v.numpy(), rv), close(i.numpy(), ri)


case("sort of 300 floats (9 stages) and of 700 ints with ties", _sort_long)


def _sort_big():
  # from 256 elements on, the stages at distances below 16 run in a transposed layout (processing.c
  # bitonic_desc): 3 rows of 5000 floats with infinities and ties, and 65536 ints, both directions
  a = RNG.standard_normal((3, 5000)).astype(np.float32)
  a[0, :40], a[1, 100:140], a[2, -7:] = np.inf, -np.inf, 0.5
  for desc in (True, False):
    v, _ = sort(Tensor(a), 1, desc)
    close(v.numpy(), torch.sort(torch.tensor(a), 1, desc)[0])
  b = RNG.integers(-1000, 1000, size=(65536,)).astype(np.int32)
  for desc in (False, True):
    v, _ = sort(Tensor(b), 0, desc)
    close(v.numpy(), torch.sort(torch.tensor(b), 0, desc)[0])


case("sort of 3 x 5000 floats with infinities and of 65536 ints", _sort_big)


def _sort_nan():
  # NaN ranks above everything (first descending, last ascending, as torch); a comparator exchanges
  # values, so NaNs and a -0.0 tied with a 0.0 are never duplicated; indices stay stable. 360 values
  # (padded to 512: the transposed layout too), every NaN-free run, and 3 rows of 5000 with NaNs.
  a = np.tile(np.array([1.0, np.nan, -0.0, 0.0, np.inf, -np.inf, 2.0, np.nan, 1.0], np.float32), 40)
  for desc in (False, True):
    v, i = sort(Tensor(a), 0, desc)
    rv, ri = torch.sort(torch.tensor(a), dim=0, descending=desc, stable=True)
    close(v.numpy(), rv, what=f"values desc={desc}"), close(i.numpy(), ri, what=f"indices desc={desc}")
    assert np.signbit(v.numpy()[v.numpy() == 0]).sum() == np.signbit(a[a == 0]).sum(), "as many -0.0 as in the input"
  b = RNG.standard_normal((3, 5000)).astype(np.float32)
  b[0, ::7], b[1, 4000:], b[2, :3] = np.nan, np.nan, np.nan
  for desc in (False, True):
    v, _ = sort(Tensor(b), 1, desc)
    close(v.numpy(), torch.sort(torch.tensor(b), 1, desc)[0], what=f"5000 with NaN desc={desc}")
  h = np.array([np.nan, 1.0, -np.inf, np.nan, 0.5], np.float16)
  for desc in (False, True):
    v, i = sort(Tensor(h), 0, desc)
    rv, ri = torch.sort(torch.tensor(h).float(), dim=0, descending=desc, stable=True)
    close(v.numpy(), rv), close(i.numpy(), ri)


case("sort with NaN (both directions, float32 and float16, transposed layout) and signed zeros", _sort_nan)


def _sort_kernels():
  a = Tensor(distinct(4, 8)).realize()
  k = kernels(lambda: sort(a, 1)[0])
  assert k == 6, f"bitonic sort of 8 took {k} kernels (expected log2(8)*(log2(8)+1)/2 = 6)"


case("sort of 8 values is 6 comparator kernels", _sort_kernels)

TOPKS = [((10,), 3, -1, True), ((10,), 3, -1, False), ((4, 7), 7, 1, True), ((4, 7), 1, 0, False), ((3, 5, 6), 2, 1, True),
         ((6,), 0, 0, True), ((2, 50), 5, 1, False)]
for shape, k, dim, largest in TOPKS:
  def _c(shape=shape, k=k, dim=dim, largest=largest):
    a = distinct(*shape)
    x = set_rg(Tensor(a))
    v, i = topk(x, k, dim, largest)
    t = torch.tensor(a, requires_grad=True)
    rv, ri = torch.topk(t, k, dim, largest)
    if rv.numel():
      wv = rnd(*rv.shape, lo=0.5, hi=1.5)
      backward((v * Tensor(wv)).sum())
      (rv * torch.tensor(wv)).sum().backward()
    close(v.numpy(), rv, what="values")
    close(i.numpy(), ri, what="indices")
    if rv.numel(): close(grad(x).numpy(), t.grad, what="grad")
  case(f"topk {shape} k={k} dim={dim} largest={largest} (+ backward)", _c)


def _topk_ties():
  a = np.array([[1.0, 3.0, 1.0, 3.0, 2.0, 3.0]], np.float32)
  v, i = topk(Tensor(a), 2)
  rv, _ = torch.topk(torch.tensor(a), 2)
  close(v.numpy(), rv, what="values match torch")
  close(i.numpy(), np.array([[1, 3]]), what="ties: the earliest positions")
  v, i = topk(Tensor(a), 4, largest=False, sorted_=False)
  close(v.numpy(), np.array([[1.0, 1.0, 2.0, 3.0]])), close(i.numpy(), np.array([[0, 2, 4, 1]]))
  v, i = topk(Tensor(np.float32(3.0)), 1, 0)
  assert v.shape == () and i.numpy() == 0


case("topk with ties: torch's values, the earliest indices; sorted=False; 0-d", _topk_ties)


def _topk_selection():
  # k <= 64 selects k times instead of sorting: the same answers as the sort (k = 65 and up), torch's
  # values and earliest indices, on long rows, integer / bool / float64 rows, -inf and nan
  a = distinct(6, 1000)
  for k in (1, 10, 64, 65):
    for largest in (True, False):
      v, i = topk(Tensor(a), k, 1, largest)
      rv, ri = torch.topk(torch.tensor(a), k, 1, largest)
      close(v.numpy(), rv, what=f"k={k} largest={largest}"), close(i.numpy(), ri, what=f"k={k} indices")
  x = set_rg(Tensor(a))
  v, i = topk(x, 5, 0)  # along dim 0, with a gradient to exactly the chosen positions
  t = torch.tensor(a, requires_grad=True)
  rv, ri = torch.topk(t, 5, 0)
  backward(v.sum()), rv.sum().backward()
  close(v.numpy(), rv), close(i.numpy(), ri), close(grad(x).numpy(), t.grad, what="grad")
  r = RNG.integers(-20, 20, size=(4, 300)).astype(np.int64)  # many ties
  for largest in (True, False):
    v, i = topk(Tensor(r), 12, 1, largest)
    order = np.argsort(-r if largest else r, 1, kind="stable")[:, :12]
    close(i.numpy(), order, what=f"int64 ties largest={largest}"), close(v.numpy(), np.take_along_axis(r, order, 1))
  r32 = RNG.integers(-2**31, 2**31 - 1, size=(3, 300), dtype=np.int64).astype(np.int32)
  r32[:, ::7] = r32[:, :1]  # ties, and the int32 extremes
  r32[0, 5], r32[1, 9], r32[2, 3] = -2**31, 2**31 - 1, -2**31
  for largest in (True, False):
    v, i = topk(Tensor(r32), 20, 1, largest)
    order = np.argsort(-r32.astype(np.int64) if largest else r32, 1, kind="stable")[:, :20]
    close(i.numpy(), order, what=f"int32 largest={largest}"), close(v.numpy(), np.take_along_axis(r32, order, 1))
  z = np.array([[0.0, -0.0, 1.0, -0.0, 0.0, -1.0] * 8], np.float32)  # -0 ties with +0: earliest first
  for largest in (True, False):
    v, i = topk(Tensor(z), 12, 1, largest)
    order = np.argsort(-z if largest else z, 1, kind="stable")[:, :12]
    close(i.numpy(), order, what=f"-0 and +0 largest={largest}")
  b = RNG.integers(0, 2, size=(3, 40)).astype(np.bool_)
  v, i = topk(Tensor(b), 7, 1)
  order = np.argsort(~b, 1, kind="stable")[:, :7]
  close(i.numpy(), order, what="bool"), close(v.numpy(), np.take_along_axis(b, order, 1))
  d = distinct(2, 90).astype(np.float64)
  v, i = topk(Tensor(d), 9, 1, False)
  rv, ri = torch.topk(torch.tensor(d), 9, 1, False)
  close(v.numpy(), rv), close(i.numpy(), ri)
  inf = np.array([[-np.inf, 1.0, -np.inf, -np.inf, 2.0]], np.float32)  # the rest all -inf: in position order
  v, i = topk(Tensor(inf), 5 - 1, 1)
  close(i.numpy(), np.array([[4, 1, 0, 2]])), close(v.numpy(), np.array([[2.0, 1.0, -np.inf, -np.inf]]))
  nan = np.array([[1.0, np.nan, 3.0, np.inf, np.nan, 0.0]], np.float32)
  v, i = topk(Tensor(nan), 3, 1)
  close(i.numpy(), np.array([[1, 4, 3]]), what="nan counts as the largest (as torch)")
  v, i = topk(Tensor(nan), 3, 1, False)
  close(i.numpy(), np.array([[5, 0, 2]]), what="smallest: nan taken last")
  # smallest with +inf and nan: every inf before any nan (both are -inf once inverted)
  m = np.array([[np.nan, np.inf, 1.0, -np.inf, np.inf, 2.0, np.nan, 0.5] * 4], np.float32)
  v, i = topk(Tensor(m), 31, 1, False)
  rv, ri = torch.topk(torch.tensor(m), 31, 1, False)
  close(v.numpy(), rv, what="smallest with inf and nan")
  close(np.take_along_axis(m, i.numpy().astype(np.int64), 1), rv, what="smallest with inf and nan: indices")
  # a lazily computed row (exp) is compared with its own maximum in every round: the same bits each
  # time, so every round finds its element (it read past the row when kernels rounded differently)
  e = (RNG.standard_normal((2, 2, 65)) * 3).astype(np.float32)
  v, i = topk(Tensor(e).exp(), 20, 2)
  rv, ri = torch.topk(torch.tensor(e).exp(), 20, 2)
  assert (i.numpy() >= 0).all() and (i.numpy() < 65).all(), f"indices {i.numpy().min()}..{i.numpy().max()}"
  close(v.numpy(), rv, what="topk of exp"), close(i.numpy(), ri, what="topk of exp: indices")


case("topk by selection (k <= 64): long rows, k=64/65 agree with the sort, ints with ties, bool, float64, -inf, nan",
     _topk_selection)


def _topk_chunked():
  # rows of n >= 32 k (n a multiple of 8) are cut into chunks of 8: one pass takes each chunk's
  # maximum, k chunks are selected, the final selection runs on their 8 k elements. Ties across and
  # inside chunks, NaN (largest: first; smallest: last, after +inf), +-inf, ints, k at the limit of
  # the chunked path (n = 32 k) and just past it, gradients to the chosen positions.
  def ref_order(r, k, largest):
    nan = np.isnan(r) if r.dtype.kind == "f" else np.zeros(r.shape, bool)
    key = np.where(nan, np.inf, r).astype(np.float64)  # NaN ties with +inf, then comes first (largest)
    rank, nrank = (-key, -nan.astype(np.int8)) if largest else (key, nan.astype(np.int8))  # or last
    order = np.lexsort((np.broadcast_to(np.arange(r.shape[-1]), r.shape), nrank, rank), axis=-1)
    return order[..., :k]
  for n, k in [(1024, 10), (320, 10), (328, 10), (256, 8), (512, 16), (2048, 64), (4096, 3)]:
    a = RNG.integers(-6, 6, size=(5, n)).astype(np.float32)  # many ties inside and across chunks
    a[1, ::37], a[2, 5::11], a[3, :] = np.nan, np.inf, -np.inf
    a[3, 100 % n], a[3, (n - 1)] = np.nan, 7.0
    a[2, n - 3] = np.nan  # after k chunks with +inf: its chunk must rank first (largest)
    a[4, :], a[4, :24] = np.inf, np.nan  # chunks of only NaN before chunks of +inf: they rank last (smallest)
    for largest in (True, False):
      v, i = topk(Tensor(a), k, 1, largest)
      order = ref_order(a, k, largest)
      close(i.numpy(), order, what=f"n={n} k={k} largest={largest} indices")
      close(v.numpy(), np.take_along_axis(a, order, 1), what=f"n={n} k={k} largest={largest} values")
  r = RNG.integers(-50, 50, size=(3, 640)).astype(np.int32)
  for largest in (True, False):
    v, i = topk(Tensor(r), 20, 1, largest)
    order = ref_order(r, 20, largest)
    close(i.numpy(), order, what=f"int32 largest={largest}"), close(v.numpy(), np.take_along_axis(r, order, 1))
  h = RNG.standard_normal((2, 800)).astype(np.float16)
  h[0, 3::50] = np.nan
  for largest in (True, False):
    v, i = topk(Tensor(h), 9, 1, largest)
    order = ref_order(h, 9, largest)
    close(i.numpy(), order, what=f"float16 largest={largest}")
  d = distinct(600, 3)  # along dim 0, with the gradient
  x = set_rg(Tensor(d))
  v, i = topk(x, 12, 0)
  t = torch.tensor(d, requires_grad=True)
  rv, ri = torch.topk(t, 12, 0)
  wv = rnd(*rv.shape, lo=0.5, hi=1.5)
  backward((v * Tensor(wv)).sum()), (rv * torch.tensor(wv)).sum().backward()
  close(v.numpy(), rv), close(i.numpy(), ri), close(grad(x).numpy(), t.grad, what="grad")


case("topk of long rows by chunks of 8 (n >= 32 k): ties, NaN, inf, ints, float16, dim 0 + backward", _topk_chunked)

# =====================================================================================================
# multinomial


def _mn_replacement():
  tg.manual_seed(7)
  p = np.array([0.1, 0.0, 0.2, 0.3, 0.4], np.float32)
  s = multinomial(Tensor(p), 20000, True)
  assert s.dtype == tg.INT32 and s.shape == (20000,)
  x = s.numpy()
  assert x.min() >= 0 and x.max() <= 4 and not (x == 1).any(), "zero-weight category drawn"
  freq = np.bincount(x, minlength=5) / x.size
  assert np.abs(freq - p).max() < 0.015, f"frequencies {freq} vs {p}"


case("multinomial with replacement: frequencies, zero weight never drawn", _mn_replacement)


def _mn_batch():
  tg.manual_seed(3)
  w = np.array([[1, 0, 0, 3], [0, 0, 5, 0], [2, 2, 2, 2]], np.float32)  # unnormalized weights
  s = multinomial(Tensor(w), 4000, True).numpy()
  assert s.shape == (3, 4000)
  assert set(np.unique(s[0])) <= {0, 3} and (s[1] == 2).all()
  f0 = (s[0] == 3).mean()
  assert abs(f0 - 0.75) < 0.03, f0
  assert np.abs(np.bincount(s[2], minlength=4) / 4000 - 0.25).max() < 0.03
  wi = np.array([0, 1, 0], np.int32)  # integer weights, one sample
  assert (multinomial(Tensor(wi), 1).numpy() == 1).all()


case("multinomial 2-d unnormalized weights, integer weights, one sample", _mn_batch)


def _mn_no_replacement():
  tg.manual_seed(11)
  w = rnd(4, 10, lo=0.1, hi=1.0)
  s = multinomial(Tensor(w), 10, False).numpy()
  assert s.shape == (4, 10)
  for row in s: assert sorted(row.tolist()) == list(range(10)), row
  w2 = np.array([0.0, 5.0, 0.0, 1.0, 0.0], np.float32)
  s = multinomial(Tensor(w2), 2, False).numpy()
  assert sorted(s.tolist()) == [1, 3], s
  counts = np.zeros(3)
  w3 = np.array([8.0, 1.0, 1.0], np.float32)
  for seed in range(40):
    tg.manual_seed(seed)
    counts[multinomial(Tensor(w3), 1, False).numpy()[0]] += 1
  assert counts[0] > 20, counts


case("multinomial without replacement: distinct, zero weights last", _mn_no_replacement)


def _mn_seed():
  p = Tensor(np.array([0.2, 0.3, 0.5], np.float32))
  tg.manual_seed(5)
  a = multinomial(p, 50, True).numpy()
  tg.manual_seed(5)
  b = multinomial(p, 50, True).numpy()
  assert np.array_equal(a, b)
  c = multinomial(p, 50, True).numpy()
  assert not np.array_equal(a, c)


case("multinomial: tg_manual_seed makes it repeatable", _mn_seed)

# =====================================================================================================
# qr / svd


def _check_qr(a, tol):
  q, r = qr(Tensor(a))
  Q, R = q.numpy().astype(np.float64), r.numpy().astype(np.float64)
  m, n = a.shape[-2:]
  assert Q.shape == a.shape[:-2] + (m, m) and R.shape == a.shape[:-2] + (m, n), (Q.shape, R.shape)
  close(Q @ R, a, atol=tol, rtol=tol, what="q @ r")
  close(np.swapaxes(Q, -1, -2) @ Q, np.broadcast_to(np.eye(m), Q.shape), atol=tol, rtol=tol, what="q^T q")
  close(np.tril(R, -1), np.zeros_like(R), atol=tol, what="r upper triangular")
  k = min(m, n)
  if k: close(np.abs(np.diagonal(R, axis1=-2, axis2=-1))[..., :k],
              np.abs(np.diagonal(np.linalg.qr(a.astype(np.float64), mode="complete")[1], axis1=-2, axis2=-1))[..., :k],
              atol=tol, rtol=tol, what="|diag r| vs numpy")


for shape, dt in [((4, 4), np.float32), ((5, 3), np.float32), ((3, 5), np.float32), ((2, 3, 3), np.float32),
                  ((6, 6), np.float64), ((1, 1), np.float32), ((2, 4, 2), np.float64)]:
  def _c(shape=shape, dt=dt):
    _check_qr(rnd(*shape, dtype=dt), 2e-5 if dt == np.float32 else 1e-10)
  case(f"qr {shape} {np.dtype(dt).name}: q @ r, orthogonality, triangular, |diag| vs numpy", _c)


def _qr_special():
  a = rnd(4, 3)
  a[:, 1] = 0  # a zero column: the reflector is skipped, nothing is nan
  _check_qr(a, 2e-5)
  _check_qr(np.zeros((3, 3), np.float32), 1e-6)
  i = np.array([[2, 1], [1, 3]], np.int32)
  q, r = qr(Tensor(i))
  assert q.dtype == tg.FLOAT32
  close(q.numpy() @ r.numpy(), i.astype(np.float32), atol=1e-5)
  a = rnd(4, 4)
  q, r = qr(view_of(a, "permuted"))
  close(q.numpy() @ r.numpy(), a, atol=2e-5)


case("qr: zero column, zero matrix, int input, non-contiguous", _qr_special)


def _check_svd(a, tol, full=True):
  u, s, vt = svd(Tensor(a), full)
  U, S, VT = (t.numpy().astype(np.float64) for t in (u, s, vt))
  m, n = a.shape[-2:]
  k = min(m, n)
  bs = a.shape[:-2]
  assert S.shape == bs + (k,)
  assert U.shape == bs + ((m, m) if full else (m, k)), U.shape
  assert VT.shape == bs + ((n, n) if full else (k, n)), VT.shape
  close(S, np.linalg.svd(a.astype(np.float64), compute_uv=False), atol=tol, rtol=tol, what="singular values")
  close((U[..., :, :k] * S[..., None, :]) @ VT[..., :k, :], a, atol=tol, rtol=tol, what="u diag(s) vt")
  close(np.swapaxes(U, -1, -2) @ U, np.broadcast_to(np.eye(U.shape[-1]), bs + (U.shape[-1],) * 2), atol=tol, rtol=tol,
        what="u orthonormal columns")
  close(VT @ np.swapaxes(VT, -1, -2), np.broadcast_to(np.eye(VT.shape[-2]), bs + (VT.shape[-2],) * 2), atol=tol, rtol=tol,
        what="vt orthonormal rows")


for shape, dt, full in [((4, 4), np.float32, True), ((6, 3), np.float32, True), ((3, 6), np.float32, True),
                        ((5, 3), np.float32, False), ((3, 5), np.float32, False), ((2, 4, 3), np.float32, True),
                        ((5, 5), np.float64, True), ((1, 1), np.float32, True), ((3, 1), np.float32, True), ((7, 7), np.float32, False),
                        ((16, 16), np.float32, True), ((9, 9), np.float64, True)]:
  def _c(shape=shape, dt=dt, full=full):
    _check_svd(rnd(*shape, dtype=dt), 5e-5 if dt == np.float32 else 1e-9, full)
  case(f"svd {shape} {np.dtype(dt).name} full_matrices={full}: s vs numpy, reconstruction, orthogonality", _c)


def _svd_special():
  a = rnd(5, 2) @ rnd(2, 4)  # rank 2
  u, s, vt = svd(Tensor(a.astype(np.float32)))
  S = s.numpy()
  close(S, np.linalg.svd(a.astype(np.float64), compute_uv=False), atol=5e-5, what="rank-deficient singular values")
  close((u.numpy()[:, :4] * S) @ vt.numpy(), a, atol=5e-5, what="rank-deficient reconstruction")
  d = np.diag(np.array([3.0, -1.0, 2.0], np.float32))
  close(svd(Tensor(d))[1].numpy(), np.array([3.0, 2.0, 1.0]), atol=1e-6, what="diagonal matrix")
  z = np.zeros((3, 3), np.float32)
  close(svd(Tensor(z))[1].numpy(), np.zeros(3), what="zero matrix")


case("svd: rank-deficient, diagonal with negative entry, zero matrix", _svd_special)


def _linalg_empty():
  for shape in [(3, 0), (0, 3), (0, 0), (2, 0, 4)]:
    a = rnd(*shape)
    q, r = qr(Tensor(a))
    m, n = shape[-2:]
    assert q.numpy().shape == shape[:-2] + (m, m) and r.numpy().shape == shape, (shape, q.shape, r.shape)
    u, s, vt = svd(Tensor(a))
    assert u.numpy().shape == shape[:-2] + (m, m) and s.numpy().shape == shape[:-2] + (0,), (shape, u.shape, s.shape)
    assert vt.numpy().shape == shape[:-2] + (n, n), (shape, vt.shape)
    if m: close(u.numpy() @ np.swapaxes(u.numpy(), -1, -2), np.broadcast_to(np.eye(m), u.shape), what="u orthogonal")


case("qr / svd of matrices with a 0-sized dim", _linalg_empty)

# =====================================================================================================
# errors
ERRS = [
    ("tg_isclose", lambda: isclose(Tensor(rnd(3, 4)), Tensor(rnd(5,))), "broadcast"),
    ("tg_isclose", lambda: isclose(Tensor(rnd(3)), Tensor(rnd(3)), -1.0), "non-negative"),
    ("tg_allclose", lambda: allclose(Tensor(rnd(3)), Tensor(rnd(4))), "broadcast"),
    ("tg_cumprod", lambda: cumprod(Tensor(rnd(3, 4)), 2), "axis"),
    ("tg_logcumsumexp", lambda: logcumsumexp(Tensor(rnd(3)), -2), "axis"),
    ("tg_cummax", lambda: cummax(Tensor(rnd(3)), 1), "axis"),
    ("tg_cummin", lambda: cummin(Tensor(np.float32(1.0)), 1), "axis"),
    ("tg_max_pool2d_with_indices", lambda: max_pool2d_idx(Tensor(rnd(4))), "(..., height, width)"),
    ("tg_max_pool2d_with_indices", lambda: max_pool2d_idx(Tensor(rnd(1, 1, 2, 2)), kernel_size=3), "larger than the padded"),
    ("tg_max_pool2d_with_indices", lambda: max_pool2d_idx(Tensor(rnd(1, 1, 4, 4)), stride=(-1, 2)), "stride"),
    ("tg_max_unpool2d", lambda: max_unpool2d(Tensor(rnd(1, 1, 2, 2)), Tensor(rnd(1, 1, 2, 2))), "integers"),
    ("tg_max_unpool2d", lambda: max_unpool2d(Tensor(rnd(1, 1, 2, 2)), Tensor(np.zeros((1, 1, 2, 3), np.int32))), "shape"),
    ("tg_max_unpool2d", lambda: max_unpool2d(Tensor(rnd(1, 1, 2, 2)), Tensor(np.zeros((1, 1, 2, 2), np.int32)), output_size=(4,)),
     "output_size"),
    ("tg_einsum", lambda: einsum("ij,jk->ik", Tensor(rnd(2, 3))), "2 operands but 1 tensor"),
    ("tg_einsum", lambda: einsum("ij,jk->ik", Tensor(rnd(2, 3)), Tensor(rnd(4, 5))), "size"),
    ("tg_einsum", lambda: einsum("ijk->i", Tensor(rnd(2, 3))), "3 subscript letters"),
    ("tg_einsum", lambda: einsum("ij->k", Tensor(rnd(2, 3))), "does not appear"),
    ("tg_einsum", lambda: einsum("ij->ii", Tensor(rnd(2, 3))), "more than once"),
    ("tg_einsum", lambda: einsum("i1->i", Tensor(rnd(2, 3))), "invalid character"),
    ("tg_einsum", lambda: einsum("ii->i", Tensor(rnd(2, 3))), "diagonal"),
    ("tg_einsum", lambda: einsum("i->i->i", Tensor(rnd(2))), "->"),
    ("tg_einsum", lambda: einsum("...i...->i", Tensor(rnd(2, 3))), "more than one"),
    ("tg_interpolate", lambda: interpolate(Tensor(rnd(1, 1, 4)), (3,), "nearest", True), "align_corners"),
    ("tg_interpolate", lambda: interpolate(Tensor(rnd(1, 1, 4)), (0,)), "positive"),
    ("tg_interpolate", lambda: interpolate(Tensor(rnd(1, 1, 4)), (3,), "bilinear"), "bilinear"),
    ("tg_interpolate", lambda: interpolate(Tensor(rnd(4)), (3, 3)), "size has 2 entries"),
    ("tg_sort", lambda: sort(Tensor(rnd(3, 4)), 2), "axis"),
    ("tg_argsort", lambda: argsort(Tensor(rnd(3, 4)), -3), "axis"),
    ("tg_topk", lambda: topk(Tensor(rnd(3, 4)), 5), "out of range"),
    ("tg_topk", lambda: topk(Tensor(rnd(3, 4)), -1), "out of range"),
    ("tg_multinomial", lambda: multinomial(Tensor(rnd(2, 2, 2, lo=0, hi=1)), 1), "1-d"),
    ("tg_multinomial", lambda: multinomial(Tensor(rnd(3, lo=0, hi=1)), 4, False), "without replacement"),
    ("tg_multinomial", lambda: multinomial(Tensor(rnd(3, lo=0, hi=1)), 0, True), "positive"),
    ("tg_qr", lambda: qr(Tensor(rnd(4))), "(..., m, n)"),
    ("tg_svd", lambda: svd(Tensor(np.float32(1.0))), "(..., m, n)"),
]
for i, (fname, f, sub) in enumerate(ERRS):
  case(f"error: {fname} #{i} ({sub or 'message names the function'})", lambda fname=fname, f=f, sub=sub: expect_error(fname, f, sub))


def _err_none_and_outs():
  # a none input propagates without overwriting the first error; out-pointers get none on error
  lib.tg_clear_error()
  r = lib.tg_cumprod(NONE_T, 0)
  assert r.id == 0
  msg = tg.last_error()
  assert msg and "tg_cumprod" in msg, msg
  v, i = _T(123), _T(456)
  st = lib.tg_sort(NONE_T, 0, False, ctypes.byref(v), ctypes.byref(i))
  assert st < 0 and v.id == 0 and i.id == 0
  assert "tg_cumprod" in tg.last_error()  # the first error stays
  lib.tg_clear_error()
  q, r = _T(1), _T(2)
  assert lib.tg_qr(Tensor(rnd(3)).h, ctypes.byref(q), ctypes.byref(r)) < 0 and q.id == 0 and r.id == 0
  lib.tg_clear_error()
  assert lib.tg_sort(Tensor(rnd(3)).h, 0, False, None, None) < 0 and "tg_sort" in tg.last_error()
  lib.tg_clear_error()
  assert lib.tg_allclose(Tensor(rnd(3)).h, Tensor(rnd(3)).h, 1e-5, 1e-8, False, None) < 0 and "tg_allclose" in tg.last_error()
  lib.tg_clear_error()
  assert lib.tg_einsum(None, None, 0).id == 0 and "tg_einsum" in tg.last_error()
  lib.tg_clear_error()
  lib.tg_scope_begin()
  t = Tensor(rnd(2, 2))
  lib.tg_scope_end()
  try:
    einsum("ij->ji", t)
    raise AssertionError("stale handle accepted")
  except TGError as e:
    assert "tg_einsum" in str(e), str(e)
  lib.tg_clear_error()


case("error: none input propagates; out-pointers get none; NULL outs; stale handle", _err_none_and_outs)


# =====================================================================================================
def main(): return tg.run_cases(CASES, "test_processing_torch")


if __name__ == "__main__":
  sys.exit(main())
