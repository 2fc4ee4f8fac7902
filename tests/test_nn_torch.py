"""test_nn_torch.py -- differential tests of the nn ops (src/tensor/nnops.c) against PyTorch.

For each op: forward against torch / torch.nn.functional over shapes that include 0-sized, 1-sized,
broadcast and non-contiguous (permuted, flipped, shrunk, padded views) inputs; backward through
tg_backward(tg_sum(out * w)) (w random, so that sum-invariant gradients still show) against torch
autograd; error cases (the message must name the function); kernel counts (conv2d is one kernel,
linear + relu one, softmax at most three). Every case runs in its own tg scope and the live handle
count must be 0 at the end. Last line: "test_nn_torch: N passed, N failed"; exit 1 on any failure.

Run: /usr/bin/python3 tests/test_nn_torch.py   (TINYGRAD_LIB selects the library; TEST_FILTER=substr)
"""
import ctypes
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import tinygrad as tg  # noqa: E402
from tinygrad import Tensor, TGError, _T, call, lib  # noqa: E402
from torchcheck import backward, expect_error, grad, kernels, set_rg, view_of, status as _status, pair as _pair  # noqa: E402
import torchcheck  # noqa: E402

torch.set_num_threads(1)
RNG = np.random.default_rng(1234)


def rnd(*shape, **kw): return torchcheck.rnd(*shape, rng=RNG, **kw)


def close(ours, ref, atol=1e-5, rtol=1e-3, what="value"): return torchcheck.close(ours, ref, atol, rtol, what)

# ---- prototypes of the nn section of include/tinygrad.h ------------------------------------------
_i64p, _intp, _tp = ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_int), ctypes.POINTER(_T)
_I, _I64, _B, _D = ctypes.c_int, ctypes.c_int64, ctypes.c_bool, ctypes.c_double


class PoolOpts(ctypes.Structure):
  _fields_ = [("kernel_size", ctypes.c_int64 * 2), ("stride", ctypes.c_int64 * 2), ("dilation", ctypes.c_int64 * 2),
              ("padding", ctypes.c_int64 * 4), ("npadding", _I), ("ceil_mode", _B), ("exclude_pad", _B)]


class ConvOpts(ctypes.Structure):
  _fields_ = [("groups", _I64), ("stride", ctypes.c_int64 * 2), ("dilation", ctypes.c_int64 * 2),
              ("padding", ctypes.c_int64 * 4), ("npadding", _I), ("dtype", _I)]


class SdpaOpts(ctypes.Structure):
  _fields_ = [("is_causal", _B), ("dropout_p", _D), ("enable_gqa", _B)]


class LossOpts(ctypes.Structure):
  _fields_ = [("reduction", _I), ("label_smoothing", _D), ("use_ignore_index", _B), ("ignore_index", _I64),
              ("weight", _T), ("pos_weight", _T)]


class MeshOpts(ctypes.Structure):
  _fields_ = [("xy", _B)]


_RED = [_T, [_T, _intp, _I, _B]]
_SIGS = {
    "tg_cat": (_T, [_tp, _I, _I]), "tg_stack": (_T, [_tp, _I, _I]), "tg_repeat": (_T, [_T, _i64p, _I]),
    "tg_split": (_I, [_T, _i64p, _I, _I, _tp, _I]), "tg_chunk": (_I, [_T, _I, _I, _tp, _I]),
    "tg_gather": (_T, [_T, _I, _T]), "tg_meshgrid": (_I, [_tp, _I, _tp, ctypes.POINTER(MeshOpts)]),
    "tg_var": (_T, [_T, _intp, _I, _B, _D]), "tg_std": (_T, [_T, _intp, _I, _B, _D]),
    "tg_var_mean": (_I, [_T, _intp, _I, _B, _D, _tp, _tp]), "tg_std_mean": (_I, [_T, _intp, _I, _B, _D, _tp, _tp]),
    "tg_logsumexp": tuple(_RED), "tg_argmax": tuple(_RED), "tg_argmin": tuple(_RED), "tg_any": tuple(_RED),
    "tg_all": tuple(_RED), "tg_cumsum": (_T, [_T, _I]), "tg_triu": (_T, [_T, _I64]), "tg_tril": (_T, [_T, _I64]),
    "tg_max_pool2d": (_T, [_T, ctypes.POINTER(PoolOpts)]), "tg_avg_pool2d": (_T, [_T, ctypes.POINTER(PoolOpts)]),
    "tg_conv2d": (_T, [_T, _T, _T, ctypes.POINTER(ConvOpts)]), "tg_dot": (_T, [_T, _T]), "tg_linear": (_T, [_T, _T, _T]),
    "tg_one_hot": (_T, [_T, _I64]), "tg_layernorm": (_T, [_T, _I, _D]), "tg_batchnorm": (_T, [_T, _T, _T, _T, _T]),
    "tg_dropout": (_T, [_T, _D]),
    "tg_scaled_dot_product_attention": (_T, [_T, _T, _T, _T, ctypes.POINTER(SdpaOpts)]),
    "tg_binary_crossentropy": (_T, [_T, _T, ctypes.POINTER(LossOpts)]),
    "tg_binary_crossentropy_logits": (_T, [_T, _T, ctypes.POINTER(LossOpts)]),
    "tg_sparse_categorical_crossentropy": (_T, [_T, _T, ctypes.POINTER(LossOpts)]),
    "tg_cross_entropy": (_T, [_T, _T, ctypes.POINTER(LossOpts)]), "tg_nll_loss": (_T, [_T, _T, ctypes.POINTER(LossOpts)]),
    # autograd
    "tg_set_requires_grad": (_T, [_T, _B]), "tg_backward": (_I, [_T]), "tg_grad": (_T, [_T]),
}
for _n, (_r, _a) in _SIGS.items():
  _f = getattr(lib, _n)
  _f.restype, _f.argtypes = _r, _a

W = Tensor._wrap
NONE_T = _T(0)


def _axes(axis):
  if axis is None: return None, 0
  if isinstance(axis, int): axis = [axis]
  arr = (ctypes.c_int * len(axis))(*axis)
  return arr, len(axis)


def _tarr(ts): return (_T * max(len(ts), 1))(*[t.h for t in ts])
def _h(t): return t.h if t is not None else NONE_T


# thin Python wrappers (each raises TGError with the library's message on failure)
def cat(ts, dim=0): return W(call("cat", _tarr(ts), len(ts), dim))
def stack(ts, dim=0): return W(call("stack", _tarr(ts), len(ts), dim))
def repeat(x, reps): return W(call("repeat", x.h, (ctypes.c_int64 * max(len(reps), 1))(*reps), len(reps)))


def split(x, sizes, dim=0):
  if isinstance(sizes, int): sizes = [sizes]
  arr = (ctypes.c_int64 * len(sizes))(*sizes)
  n = _status("tg_split", lib.tg_split(x.h, arr, len(sizes), dim, None, 0))
  out = (_T * max(n, 1))()
  _status("tg_split", lib.tg_split(x.h, arr, len(sizes), dim, out, n))
  return [W(out[i]) for i in range(n)]


def chunk(x, chunks, dim=0):
  n = _status("tg_chunk", lib.tg_chunk(x.h, chunks, dim, None, 0))
  out = (_T * max(n, 1))()
  _status("tg_chunk", lib.tg_chunk(x.h, chunks, dim, out, n))
  return [W(out[i]) for i in range(n)]


def gather(x, dim, idx): return W(call("gather", x.h, dim, idx.h))


def meshgrid(ts, xy=False):
  out = (_T * len(ts))()
  _status("tg_meshgrid", lib.tg_meshgrid(_tarr(ts), len(ts), out, ctypes.byref(MeshOpts(xy))))
  return [W(out[i]) for i in range(len(ts))]


def var(x, axis=None, keepdim=False, correction=1): return W(call("var", x.h, *_axes(axis), keepdim, float(correction)))
def std(x, axis=None, keepdim=False, correction=1): return W(call("std", x.h, *_axes(axis), keepdim, float(correction)))


def var_mean(x, axis=None, keepdim=False, correction=1, fn="var_mean"):
  a, b = _T(), _T()
  _status("tg_" + fn, getattr(lib, "tg_" + fn)(x.h, *_axes(axis), keepdim, float(correction), ctypes.byref(a), ctypes.byref(b)))
  return W(a), W(b)


def red(name, x, axis=None, keepdim=False): return W(call(name, x.h, *_axes(axis), keepdim))
def cumsum(x, axis=0): return W(call("cumsum", x.h, axis))
def triu(x, d=0): return W(call("triu", x.h, d))
def tril(x, d=0): return W(call("tril", x.h, d))


def _pads(p):
  if p is None or isinstance(p, int): return (p or 0, 0, 0, 0), (1 if p else 0)
  p = tuple(p)
  return p + (0,) * (4 - len(p)), len(p)


def pool_opts(kernel_size=None, stride=None, dilation=None, padding=None, ceil_mode=False, exclude_pad=False):
  pads, np_ = _pads(padding)
  return PoolOpts(_pair(kernel_size), _pair(stride), _pair(dilation), pads, np_, ceil_mode, exclude_pad)


def max_pool2d(x, **kw): return W(call("max_pool2d", x.h, ctypes.byref(pool_opts(**kw))))
def avg_pool2d(x, **kw): return W(call("avg_pool2d", x.h, ctypes.byref(pool_opts(**kw))))


def conv2d(x, w, b=None, groups=0, stride=None, dilation=None, padding=None):
  pads, np_ = _pads(padding)
  o = ConvOpts(groups, _pair(stride), _pair(dilation), pads, np_)
  return W(call("conv2d", x.h, w.h, _h(b), ctypes.byref(o)))


def linear(x, w, b=None): return W(call("linear", x.h, w.h, _h(b)))
def dot(x, w): return W(call("dot", x.h, w.h))
def one_hot(x, n): return W(call("one_hot", x.h, n))
def layernorm(x, naxes=1, eps=1e-5): return W(call("layernorm", x.h, naxes, eps))
def batchnorm(x, w, b, mean, invstd): return W(call("batchnorm", x.h, _h(w), _h(b), mean.h, invstd.h))
def dropout(x, p=0.5): return W(call("dropout", x.h, p))


def sdpa(q, k, v, mask=None, is_causal=False, dropout_p=0.0):
  return W(call("scaled_dot_product_attention", q.h, k.h, v.h, _h(mask), ctypes.byref(SdpaOpts(is_causal, dropout_p))))


RED_MODES = {"mean": 0, "sum": 1, "none": 2}


def loss(name, x, y, reduction="mean", label_smoothing=0.0, ignore_index=None, weight=None, pos_weight=None):
  o = LossOpts(RED_MODES[reduction], label_smoothing, ignore_index is not None, ignore_index or 0, _h(weight), _h(pos_weight))
  return W(call(name, x.h, y.h, ctypes.byref(o)))


# ---- input makers ---------------------------------------------------------------------------------


VIEWS = ["contig", "permuted", "flipped", "shrunk", "padded"]

# ---- test registry ---------------------------------------------------------------------------------
CASES = []


def case(name, fn, *args, **kw): CASES.append((name, fn, args, kw))


def check_fwd_bwd(f_tg, f_torch, arrays, atol=1e-5, rtol=1e-3, gatol=None, grad_of=None, nondiff=()):
  """Forward of f_tg(tensors) vs f_torch(torch tensors); then backward of sum(out * w) for the float
  inputs (indices in grad_of, default all float inputs not in nondiff)."""
  if grad_of is None:
    grad_of = [i for i, a in enumerate(arrays) if np.issubdtype(a.dtype, np.floating) and i not in nondiff]
  ts = [Tensor(a) for a in arrays]
  for i in grad_of: set_rg(ts[i])
  out = f_tg(*ts)
  tt = [torch.tensor(a, requires_grad=(i in grad_of)) for i, a in enumerate(arrays)]
  ref = f_torch(*tt)
  if grad_of:  # the loss must be built before `out` is realized (realizing cuts its graph, as in tinygrad)
    wv = RNG.uniform(0.5, 1.5, size=ref.shape).astype(np.float32)
    backward((out * Tensor(wv)).sum())
    (ref * torch.tensor(wv)).sum().backward()
  close(out.numpy(), ref, atol, rtol, "forward")
  for i in grad_of:
    close(grad(ts[i]).numpy(), tt[i].grad, gatol if gatol is not None else max(atol, 1e-5), rtol, f"grad of input {i}")


def torch_of(a): return torch.tensor(a)


# =====================================================================================================
# movement
for shapes, dim in [([(2, 3), (4, 3)], 0), ([(2, 3), (2, 1), (2, 5)], 1), ([(2, 3, 4), (2, 3, 4)], -1), ([(0, 3), (2, 3)], 0),
                    ([(1,), (1,), (1,)], 0), ([(2, 0, 3), (2, 2, 3)], 1), ([(3, 2)], 1)]:
  def _c(shapes=shapes, dim=dim):
    arrs = [rnd(*s) for s in shapes]
    check_fwd_bwd(lambda *ts: cat(list(ts), dim), lambda *ts: torch.cat(ts, dim), arrs)
  case(f"cat {shapes} dim={dim}", _c)


def _cat_views():
  a, b = rnd(3, 4), rnd(2, 4)
  for kind in VIEWS:
    close(cat([view_of(a, kind), view_of(b, kind)], 0).numpy(), np.concatenate([a, b], 0), what=kind)


case("cat of non-contiguous views", _cat_views)


def _cat_dtypes():
  a, b = np.arange(6, dtype=np.int32).reshape(2, 3), rnd(1, 3)
  r = cat([Tensor(a), Tensor(b)], 0)
  assert r.dtype == tg.FLOAT32, r.dtype
  close(r.numpy(), np.concatenate([a.astype(np.float32), b], 0))
  ba, bb = np.array([True, False]), np.array([False, True, True])
  r = cat([Tensor(ba), Tensor(bb)])
  assert r.dtype == tg.BOOL
  close(r.numpy(), np.concatenate([ba, bb]))


case("cat promotes dtypes (int+float, bool)", _cat_dtypes)

for shape, n, dim in [((2, 3), 3, 0), ((2, 3), 2, 1), ((2, 3), 2, 2), ((2, 3), 4, -1), ((), 3, 0), ((0, 2), 2, 1), ((4,), 1, 0)]:
  def _s(shape=shape, n=n, dim=dim):
    arrs = [rnd(*shape) for _ in range(n)]
    check_fwd_bwd(lambda *ts: stack(list(ts), dim), lambda *ts: torch.stack(ts, dim), arrs)
  case(f"stack {n}x{shape} dim={dim}", _s)

for shape, reps in [((3,), (2,)), ((2, 3), (2, 2)), ((2, 3), (1, 3, 1)), ((2, 1, 3), (1, 4, 2)), ((0, 2), (3, 2)), ((2, 2), (0, 1)),
                    ((), (3,))]:
  def _r(shape=shape, reps=reps):
    check_fwd_bwd(lambda t: repeat(t, reps), lambda t: t.repeat(*reps), [rnd(*shape)])
  case(f"repeat {shape} x {reps}", _r)


def _repeat_view():
  a = rnd(2, 3)
  for kind in VIEWS:
    close(repeat(view_of(a, kind), (2, 1, 2)).numpy(), np.tile(a, (2, 1, 2)), what=kind)


case("repeat of non-contiguous views", _repeat_view)

for shape, sizes, dim in [((5, 2), 2, 0), ((5, 2), [1, 4], 0), ((6, 4), 3, 1), ((6, 4), [1, 1, 2], 1), ((3,), 5, 0), ((0, 3), 2, 0),
                          ((4, 3), [0, 4], 0), ((7,), 1, -1)]:
  def _sp(shape=shape, sizes=sizes, dim=dim):
    a = rnd(*shape)
    x = Tensor(a)
    parts = split(x, sizes, dim)
    ref = torch.tensor(a).split(sizes, dim)
    assert len(parts) == len(ref), f"{len(parts)} pieces, torch {len(ref)}"
    for p, r in zip(parts, ref): close(p.numpy(), r)
  case(f"split {shape} {sizes} dim={dim}", _sp)

for shape, chunks, dim in [((11,), 6, 0), ((12,), 6, 0), ((13,), 6, 0), ((5, 4), 2, 1), ((3, 2), 5, 0), ((0, 2), 3, 0), ((4, 6), 4, -1)]:
  def _ch(shape=shape, chunks=chunks, dim=dim):
    a = rnd(*shape)
    parts = chunk(Tensor(a), chunks, dim)
    if 0 in shape:  # tinygrad: chunks pieces of size 0 (torch returns one)
      assert len(parts) == chunks and all(p.shape == shape for p in parts)
      return
    ref = torch.tensor(a).chunk(chunks, dim)
    assert len(parts) == len(ref), f"{len(parts)} pieces, torch {len(ref)}"
    for p, r in zip(parts, ref): close(p.numpy(), r)
  case(f"chunk {shape} {chunks} dim={dim}", _ch)


def _split_grad():
  a = rnd(6, 3)
  x = set_rg(Tensor(a))
  p = split(x, [2, 4], 0)
  backward(((p[0] * 2).sum() + (p[1] * p[1]).sum()))
  t = torch.tensor(a, requires_grad=True)
  q = t.split([2, 4], 0)
  ((q[0] * 2).sum() + (q[1] * q[1]).sum()).backward()
  close(grad(x).numpy(), t.grad)


case("split backward", _split_grad)

for shape, ishape, dim in [((3, 4), (3, 2), 1), ((3, 4), (2, 4), 0), ((2, 3, 4), (2, 3, 5), 2), ((2, 3, 4), (1, 2, 4), 1),
                           ((5,), (8,), 0), ((3, 4), (0, 4), 0), ((3, 1), (3, 3), -1)]:
  def _g(shape=shape, ishape=ishape, dim=dim):
    a = rnd(*shape)
    idx = RNG.integers(0, shape[dim], size=ishape).astype(np.int64)
    check_fwd_bwd(lambda t, i: gather(t, dim, i), lambda t, i: torch.gather(t, dim, i), [a, idx])
  case(f"gather {shape} dim={dim} index {ishape}", _g)


def _gather_views_dtypes():
  a = rnd(4, 5)
  idx = RNG.integers(0, 5, size=(4, 3)).astype(np.int32)
  ref = np.take_along_axis(a, idx.astype(np.int64), 1)
  for kind in VIEWS: close(gather(view_of(a, kind), 1, view_of(idx, kind)).numpy(), ref, what=kind)
  ai = np.arange(20, dtype=np.int16).reshape(4, 5)
  r = gather(Tensor(ai), 1, Tensor(idx))
  assert r.dtype == tg.INT16
  close(r.numpy(), np.take_along_axis(ai, idx.astype(np.int64), 1))


case("gather of views, int16 data, int32 index", _gather_views_dtypes)


def _gather_out_of_range_and_cost():
  # tinygrad's gather reads 0 where an index is negative or past the dim (no wrap, no error), and
  # those positions pass no gradient; the forward is one load per element, not a one-hot sum
  a = rnd(3, 5)
  idx = np.array([[0, -1, 4, 5], [7, 2, 2, -6], [1, 1, 3, 0]], np.int64)
  ok = (idx >= 0) & (idx < 5)
  ref = np.where(ok, np.take_along_axis(a, np.where(ok, idx, 0), 1), 0)
  x = set_rg(Tensor(a))
  out = gather(x, 1, Tensor(idx))
  wv = RNG.uniform(0.5, 1.5, size=idx.shape).astype(np.float32)
  backward((out * Tensor(wv)).sum())
  close(out.numpy(), ref, what="forward")
  g = np.zeros_like(a)
  rows = np.nonzero(ok)
  np.add.at(g, (rows[0], idx[ok]), wv[ok])
  close(grad(x).numpy(), g, what="grad")
  big, bidx = rnd(64, 1000), RNG.integers(0, 1000, size=(64, 1000)).astype(np.int32)
  tg.counters_reset()
  r = gather(Tensor(big), 1, Tensor(bidx))
  close(r.numpy(), np.take_along_axis(big, bidx.astype(np.int64), 1), what="64x1000")
  ops = tg.counters().global_ops
  assert ops < 20 * bidx.size, f"{ops} ops for {bidx.size} elements: a one-hot reduction?"
  # a lazy source read about once per element is stored first; value and gradient unchanged
  la, li = rnd(4, 6, 5), RNG.integers(0, 6, size=(4, 9, 5)).astype(np.int64)
  check_fwd_bwd(lambda t, i: gather((t * t + 1).exp2(), 1, i), lambda t, i: torch.gather(torch.exp2(t * t + 1), 1, i), [la, li])


case("gather: out-of-range indices read 0 and get no gradient; one load per element", _gather_out_of_range_and_cost)


def _gather_computed_index():
  # indices computed from positions (aranges) load without the range check only where their bounds
  # prove them in range; elsewhere out-of-range positions still read 0, and int32 arithmetic that
  # wraps is not mistaken for its unwrapped value
  a = rnd(4, 12)
  ar = lambda n, dt=tg.INT64: Tensor.arange(0, n, 1, dtype=dt)
  cases = [
      ("clamped", (ar(16) * 3).idiv(4).minimum(11).reshape(1, 16).expand(4, 16), np.minimum(np.arange(16) * 3 // 4, 11)),
      ("past the end", (ar(16) + 2).reshape(1, 16).expand(4, 16), np.arange(16) + 2),
      ("negative", (ar(16) - 5).reshape(1, 16).expand(4, 16), np.arange(16) - 5),
      ("mod", ((ar(16) * 7) % 12).reshape(1, 16).expand(4, 16), (np.arange(16) * 7) % 12),
      ("int32 wrap", ((ar(16, tg.INT32) + 1) * 1073741824).idiv(1073741824).reshape(1, 16).expand(4, 16),
       (((np.arange(16) + 1) * 1073741824).astype(np.int64).astype(np.int32)) // 1073741824),
  ]
  # 40 nested clamps: every operand is read twice (by the comparison and by the select), so the
  # conversion must visit shared subexpressions once (2^40 paths otherwise)
  deep, deep_np = ar(16), np.arange(16)
  for _ in range(40): deep, deep_np = (deep + 1).minimum(11), np.minimum(deep_np + 1, 11)
  cases.append(("40 nested clamps", deep.reshape(1, 16).expand(4, 16), deep_np))
  for name, it, iv in cases:
    iv = np.broadcast_to(iv, (4, 16))
    ok = (iv >= 0) & (iv < 12)
    ref = np.where(ok, np.take_along_axis(a, np.where(ok, iv, 0), 1), 0)
    close(gather(Tensor(a), 1, it).numpy(), ref, what=name)


case("gather with indices computed from aranges: in range, past the end, negative, mod, int32 wrap", _gather_computed_index)


def _meshgrid():
  x, y, z = rnd(3), rnd(4), rnd(2)
  for ix in ["ij", "xy"]:
    ours = meshgrid([Tensor(x), Tensor(y), Tensor(z)], xy=(ix == "xy"))
    ref = torch.meshgrid(torch.tensor(x), torch.tensor(y), torch.tensor(z), indexing=ix)
    for o, r in zip(ours, ref): close(o.numpy(), r, what=ix)


case("meshgrid ij / xy", _meshgrid)

# =====================================================================================================
# reductions
for shape, axis, keepdim, corr in [((4, 5), None, False, 1), ((4, 5), 1, True, 1), ((4, 5), 0, False, 0), ((2, 3, 4), (0, 2), False, 1),
                                   ((2, 3, 4), -1, True, 2), ((1, 6), 0, False, 0), ((7,), 0, False, 1), ((3, 1, 2), 1, False, 0)]:
  for op in ["var", "std"]:
    def _v(shape=shape, axis=axis, keepdim=keepdim, corr=corr, op=op):
      dims = axis if axis is not None else tuple(range(len(shape)))

      def tf(t):  # torch 1.13's var has no `correction`: the formula, differentiable
        n = int(np.prod([shape[d] for d in ([dims] if isinstance(dims, int) else dims)]))
        v = ((t - t.mean(dim=dims, keepdim=True)) ** 2).sum(dim=dims, keepdim=keepdim) / max(n - corr, 0)
        return v if op == "var" else v.sqrt()

      check_fwd_bwd(lambda t: (var if op == "var" else std)(t, axis, keepdim, corr), tf, [rnd(*shape)], atol=1e-5)
      if corr == 1:
        a = rnd(*shape)
        close((var if op == "var" else std)(Tensor(a), axis, keepdim).numpy(), getattr(torch, op)(torch.tensor(a), dim=dims, keepdim=keepdim),
              atol=1e-5, what="vs torch." + op)
    case(f"{op} {shape} axis={axis} keepdim={keepdim} correction={corr}", _v)


def _var_single():
  # one element with correction 1: 0/0 = nan (as torch)
  v = var(Tensor(np.array([3.0], np.float32)), 0).numpy()
  assert np.isnan(v), v
  v = var(Tensor(np.arange(6, dtype=np.int32).reshape(2, 3)), 1)
  assert v.dtype == tg.FLOAT32
  close(v.numpy(), np.var(np.arange(6).reshape(2, 3), 1, ddof=1))


case("var of one element is nan; int input gives float", _var_single)


def _var_views():
  a = rnd(4, 6)
  for kind in VIEWS:
    close(var(view_of(a, kind), 1).numpy(), np.var(a, 1, ddof=1), atol=1e-5, what=kind)
    close(std(view_of(a, kind), 0, correction=0).numpy(), np.std(a, 0), atol=1e-5, what=kind)


case("var/std of non-contiguous views", _var_views)

for fn_name, tf in [("var_mean", torch.var_mean), ("std_mean", torch.std_mean)]:
  for axis, keepdim in [(None, False), (1, True), ((0, 1), False)]:
    def _vm(fn_name=fn_name, tf=tf, axis=axis, keepdim=keepdim):
      a = rnd(3, 4, 2)
      v, m = var_mean(Tensor(a), axis, keepdim, 1, fn=fn_name)
      dims = axis if axis is not None else (0, 1, 2)
      rv, rm = tf(torch.tensor(a), dim=dims, keepdim=keepdim, unbiased=True)
      close(v.numpy(), rv, what="var/std")
      close(m.numpy(), rm, what="mean")
    case(f"{fn_name} axis={axis} keepdim={keepdim}", _vm)

for shape, axis, keepdim in [((3, 4), 1, False), ((3, 4), None, False), ((3, 4), 0, True), ((2, 3, 4), (0, 2), False), ((5,), 0, True),
                             ((1, 1), None, True), ((2, 0, 3), 2, False)]:
  def _lse(shape=shape, axis=axis, keepdim=keepdim):
    dims = axis if axis is not None else tuple(range(len(shape)))
    check_fwd_bwd(lambda t: red("logsumexp", t, axis, keepdim), lambda t: torch.logsumexp(t, dim=dims, keepdim=keepdim),
                  [rnd(*shape, lo=-5, hi=5)], atol=1e-5)
  case(f"logsumexp {shape} axis={axis} keepdim={keepdim}", _lse)


def _lse_large():
  a = np.array([[1000.0, 1000.0, 999.0], [-1000.0, -1001.0, -999.5]], np.float32)
  close(red("logsumexp", Tensor(a), 1).numpy(), torch.logsumexp(torch.tensor(a), 1), atol=1e-3)


case("logsumexp is stable for large magnitudes", _lse_large)

for op in ["argmax", "argmin"]:
  for shape, axis, keepdim in [((4, 5), 1, False), ((4, 5), 0, True), ((4, 5), None, False), ((2, 3, 4), -1, False), ((7,), 0, False),
                               ((1, 3), 0, False), ((3, 2, 2), 1, True)]:
    def _am(op=op, shape=shape, axis=axis, keepdim=keepdim):
      a = RNG.integers(0, 4, size=shape).astype(np.float32)  # many ties: the first index wins
      r = red(op, Tensor(a), axis, keepdim)
      assert r.dtype == tg.INT32, r.dtype
      ref = getattr(torch, op)(torch.tensor(a)) if axis is None else getattr(torch, op)(torch.tensor(a), dim=axis, keepdim=keepdim)
      # torch's argmax/argmin return the first index of ties on CPU too
      close(r.numpy(), ref, what=op)
    case(f"{op} {shape} axis={axis} keepdim={keepdim} (ties -> first)", _am)


def _arg_dtypes_views():
  for dt in [np.int8, np.uint8, np.int32, np.int64, np.float16, np.bool_]:
    a = RNG.integers(0, 3, size=(3, 5)).astype(dt)
    close(red("argmax", Tensor(a), 1).numpy(), torch.tensor(a.astype(np.float32)).argmax(1), what=str(dt))
    close(red("argmin", Tensor(a), 0).numpy(), torch.tensor(a.astype(np.float32)).argmin(0), what=str(dt))
  a = rnd(4, 6)
  for kind in VIEWS:
    close(red("argmax", view_of(a, kind), 1).numpy(), a.argmax(1), what=kind)
    close(red("argmin", view_of(a, kind), None).numpy(), a.argmin(), what=kind)
  r = red("argmax", Tensor(a), None, True)  # every dim kept, of size 1, as torch
  want = torch.tensor(a.astype(np.float32)).argmax(dim=None, keepdim=True)
  assert r.shape == tuple(want.shape) == (1,) * a.ndim, (r.shape, want.shape)
  close(r.numpy(), want.numpy(), what="argmax keepdim")


case("argmax/argmin over dtypes (int8, uint8, int64, half, bool) and views", _arg_dtypes_views)


def _arg_of_expressions():
  # argmax/argmin and max's gradient over computed expressions (a*b + c, exp): the comparison with
  # the maximum must see the bits the maximum was taken from, so every row has a valid index and
  # every gradient row sums to its weight
  a, b, c = rnd(64, 48), rnd(64, 48), rnd(64, 48)
  e = Tensor(a) * Tensor(b) + Tensor(c)
  ref = a.astype(np.float64) * b + c
  close(red("argmax", e, 1).numpy(), ref.argmax(1), what="argmax of a*b+c")
  close(red("argmin", (Tensor(a) * Tensor(b)).exp(), 0).numpy(), np.exp(a.astype(np.float64) * b).argmin(0), what="argmin of exp")
  x = set_rg(Tensor(a))
  m = (x * Tensor(b) + Tensor(c)).max(axis=1)
  backward(m.sum())
  g = grad(x).numpy()
  assert np.isfinite(g).all(), "non-finite gradient of max"
  close((g != 0).sum(1), np.ones(64), what="one nonzero gradient per row")


case("argmax/argmin and max gradient over computed expressions", _arg_of_expressions)

for op in ["any", "all"]:
  for shape, axis, keepdim in [((3, 4), 1, False), ((3, 4), None, False), ((3, 4), 0, True), ((0, 3), 0, False), ((0, 3), None, False),
                               ((2, 3, 2), (0, 2), False)]:
    def _aa(op=op, shape=shape, axis=axis, keepdim=keepdim):
      a = RNG.random(size=shape) < 0.3
      for arr in [a, a.astype(np.float32) * 2.5, a.astype(np.int32)]:
        r = red(op, Tensor(arr), axis, keepdim)
        assert r.dtype == tg.BOOL
        tt = torch.tensor(arr)
        if axis is None: ref = getattr(tt, op)()
        elif isinstance(axis, int): ref = getattr(tt, op)(dim=axis, keepdim=keepdim)
        else: ref = torch.tensor(getattr(np, op)(arr, axis=axis))
        close(r.numpy(), ref, what=str(arr.dtype))
    case(f"{op} {shape} axis={axis} keepdim={keepdim}", _aa)

for shape, axis in [((5,), 0), ((3, 4), 1), ((3, 4), 0), ((2, 3, 4), -2), ((1,), 0), ((0, 3), 1), ((3, 0), 1), ((600,), 0), ((2, 1030), 1),
                    ((513, 2), 0), ((2, 33), 1), ((3, 65), 1), ((17, 3), 0), ((1, 70001), 1)]:
  def _cs(shape=shape, axis=axis):
    check_fwd_bwd(lambda t: cumsum(t, axis), lambda t: torch.cumsum(t, axis), [rnd(*shape)], atol=2e-4)
  case(f"cumsum {shape} axis={axis}", _cs)


def _cumsum_dtypes():
  a = RNG.integers(-3, 4, size=(4, 5)).astype(np.int8)
  r = cumsum(Tensor(a), 1)
  assert r.dtype == tg.INT32, tg.dtype_name(r.dtype)
  close(r.numpy(), np.cumsum(a.astype(np.int64), 1))
  b = RNG.random((6,)) < 0.5
  close(cumsum(Tensor(b), 0).numpy(), np.cumsum(b))
  close(cumsum(Tensor(np.array(2.5, np.float32)), 0).numpy(), np.array(2.5, np.float32))
  a = rnd(3, 5)
  for kind in VIEWS: close(cumsum(view_of(a, kind), 1).numpy(), np.cumsum(a, 1), atol=1e-5, what=kind)


case("cumsum of int8 (-> int32), bool, 0-d and views", _cumsum_dtypes)

for op in ["triu", "tril"]:
  for shape, d in [((4, 4), 0), ((3, 5), 1), ((5, 3), -1), ((2, 3, 4), 2), ((3, 3), -5), ((0, 3), 0), ((1, 1), 0)]:
    def _tr(op=op, shape=shape, d=d):
      check_fwd_bwd(lambda t: (triu if op == "triu" else tril)(t, d), lambda t: getattr(torch, op)(t, d), [rnd(*shape)])
    case(f"{op} {shape} diagonal={d}", _tr)


def _tri_views():
  a = rnd(4, 5)
  for kind in VIEWS:
    close(triu(view_of(a, kind), 1).numpy(), np.triu(a, 1), what=kind)
    close(tril(view_of(a, kind), -1).numpy(), np.tril(a, -1), what=kind)
  ai = np.arange(12, dtype=np.int32).reshape(3, 4)
  r = tril(Tensor(ai))
  assert r.dtype == tg.INT32
  close(r.numpy(), np.tril(ai))
  ab = RNG.random((4, 3)) < 0.7
  r = triu(Tensor(ab), -1)
  assert r.dtype == tg.BOOL, tg.dtype_name(r.dtype)
  close(r.numpy(), np.triu(ab, -1))


case("triu/tril of views, int32 and bool keep their dtype", _tri_views)

# =====================================================================================================
# pooling and convolution
POOL_CASES = [
    ((1, 1, 4, 4), {}), ((2, 3, 5, 5), {"kernel_size": 3}), ((2, 2, 6, 7), {"kernel_size": (2, 3), "stride": (1, 2)}),
    ((1, 2, 7, 7), {"kernel_size": 3, "stride": 2, "padding": 1}), ((1, 1, 8, 8), {"kernel_size": 2, "dilation": 2}),
    ((2, 1, 5, 6), {"kernel_size": 3, "stride": 1, "padding": (1, 0)}), ((1, 1, 5, 5), {"kernel_size": 2, "ceil_mode": True}),
    ((1, 2, 7, 6), {"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True}), ((0, 2, 4, 4), {}), ((3, 4, 4), {"kernel_size": 4}),
    ((1, 1, 1, 1), {"kernel_size": 1}),
    # ceil_mode: one window larger than the padded input, hanging over its end
    ((1, 1, 1, 5), {"kernel_size": 3, "stride": (3, 2), "padding": (0, 1), "ceil_mode": True}),
    ((2, 1, 2, 2), {"kernel_size": 3, "stride": 2, "ceil_mode": True}),
]


def _torch_pool_kw(kw, maxpool):
  r = {"kernel_size": kw.get("kernel_size", 2)}
  for k in ["stride", "padding", "dilation", "ceil_mode"]:
    if k in kw:
      if k == "dilation" and not maxpool: continue
      r[k] = kw[k]
  return r


for shape, kw in POOL_CASES:
  def _mp(shape=shape, kw=kw):
    check_fwd_bwd(lambda t: max_pool2d(t, **kw), lambda t: F.max_pool2d(t, **_torch_pool_kw(kw, True)), [rnd(*shape)])
  case(f"max_pool2d {shape} {kw}", _mp)
  if "dilation" not in kw:
    def _ap(shape=shape, kw=kw):
      check_fwd_bwd(lambda t: avg_pool2d(t, **kw), lambda t: F.avg_pool2d(t, **_torch_pool_kw(kw, False)), [rnd(*shape)])
    case(f"avg_pool2d {shape} {kw}", _ap)
    if "padding" in kw:
      def _ap2(shape=shape, kw=kw):
        check_fwd_bwd(lambda t: avg_pool2d(t, exclude_pad=True, **kw),
                      lambda t: F.avg_pool2d(t, count_include_pad=False, **_torch_pool_kw(kw, False)), [rnd(*shape)])
      case(f"avg_pool2d count_include_pad=False {shape} {kw}", _ap2)


def _pool_views_ints():
  a = rnd(2, 3, 6, 6)
  ref_m = F.max_pool2d(torch.tensor(a), 2).numpy()
  ref_a = F.avg_pool2d(torch.tensor(a), 3, 1, 1).numpy()
  for kind in VIEWS:
    close(max_pool2d(view_of(a, kind)).numpy(), ref_m, what=kind)
    close(avg_pool2d(view_of(a, kind), kernel_size=3, stride=1, padding=1).numpy(), ref_a, what=kind)
  ai = RNG.integers(-50, 50, size=(1, 2, 4, 4)).astype(np.int32)
  r = max_pool2d(Tensor(ai), kernel_size=3, stride=1, padding=1)  # int padding uses the dtype's minimum
  assert r.dtype == tg.INT32
  close(r.numpy(), F.max_pool2d(torch.tensor(ai.astype(np.float32)), 3, 1, 1).numpy().astype(np.int32))
  au = RNG.integers(0, 200, size=(1, 1, 4, 4)).astype(np.uint8)
  close(max_pool2d(Tensor(au)).numpy(), F.max_pool2d(torch.tensor(au.astype(np.float32)), 2).numpy().astype(np.uint8))


case("pools of non-contiguous views, int32 and uint8 max_pool", _pool_views_ints)

CONV_CASES = [
    ((1, 1, 5, 5), (1, 1, 3, 3), {}), ((2, 3, 7, 6), (4, 3, 3, 2), {"padding": 1}),
    ((2, 4, 8, 8), (6, 2, 3, 3), {"groups": 2, "stride": 2, "padding": 1}), ((1, 2, 9, 9), (3, 2, 3, 3), {"dilation": 2}),
    ((1, 3, 6, 7), (2, 3, 1, 1), {}), ((2, 2, 5, 6), (4, 2, 3, 3), {"stride": (2, 1), "padding": (1, 2)}),
    ((1, 1, 6, 6), (2, 1, 3, 3), {"padding": (1, 0, 2, 1)}), ((1, 6, 5, 5), (6, 1, 3, 3), {"groups": 6, "padding": 1}),
    ((0, 2, 4, 4), (3, 2, 3, 3), {}), ((1, 2, 4, 4), (3, 2, 4, 4), {}), ((2, 3, 8, 8), (4, 3, 3, 3), {"stride": 3, "dilation": 2, "padding": 2}),
    ((1, 2, 6, 6), (2, 2, 2, 2), {"padding": -1}),
]


def _torch_conv(x, w, b, kw):
  p = kw.get("padding", 0)
  if isinstance(p, tuple) and len(p) == 4:
    x = F.pad(x, p)
    p = 0
  elif isinstance(p, int) and p < 0:
    x = x[:, :, -p:p, -p:p]
    p = 0
  return F.conv2d(x, w, b, stride=kw.get("stride", 1), padding=p, dilation=kw.get("dilation", 1), groups=kw.get("groups", 1))


for xs, ws, kw in CONV_CASES:
  for with_bias in ([False, True] if xs[0] != 0 else [False]):
    def _cv(xs=xs, ws=ws, kw=kw, with_bias=with_bias):
      arrs = [rnd(*xs), rnd(*ws)] + ([rnd(ws[0])] if with_bias else [])
      check_fwd_bwd(lambda x, w, b=None: conv2d(x, w, b, **kw), lambda x, w, b=None: _torch_conv(x, w, b, kw), arrs, atol=1e-4,
                    gatol=2e-4)
    case(f"conv2d x{xs} w{ws} {kw}{' +bias' if with_bias else ''}", _cv)


def _conv_views():
  a, w = rnd(2, 3, 6, 5), rnd(4, 3, 3, 3)
  ref = F.conv2d(torch.tensor(a), torch.tensor(w), padding=1).numpy()
  for kind in VIEWS:
    close(conv2d(view_of(a, kind), view_of(w, kind), padding=1).numpy(), ref, atol=1e-4, what=kind)


case("conv2d of non-contiguous input and weight", _conv_views)


def _conv_kernel_count():
  for xs, ws, kw in [((2, 3, 8, 8), (4, 3, 3, 3), {}), ((2, 3, 8, 8), (4, 3, 3, 3), {"padding": 1}),
                     ((1, 4, 9, 9), (4, 2, 3, 3), {"groups": 2, "stride": 2, "dilation": 2, "padding": 2})]:
    x, w = Tensor(rnd(*xs)).realize(), Tensor(rnd(*ws)).realize()
    n = kernels(lambda: conv2d(x, w, **kw))
    assert n == 1, f"conv2d {xs} {ws} {kw} took {n} kernels (expected 1: no im2col buffer)"


case("conv2d forward is ONE kernel (realized input and weight, no bias)", _conv_kernel_count)


def _linear_relu_kernel_count():
  x, w, b = Tensor(rnd(8, 16)).realize(), Tensor(rnd(4, 16)).realize(), Tensor(rnd(4)).realize()
  n = kernels(lambda: linear(x, w, b).relu())
  assert n == 1, f"linear + relu took {n} kernels"
  n = kernels(lambda: Tensor(rnd(6, 10)).realize().softmax(-1))
  assert n <= 3, f"softmax took {n} kernels"
  n = kernels(lambda: max_pool2d(Tensor(rnd(1, 2, 6, 6)).realize(), kernel_size=3, stride=1, padding=1))
  assert n == 1, f"max_pool2d took {n} kernels"


case("kernel counts: linear+relu = 1, softmax <= 3, max_pool2d = 1", _linear_relu_kernel_count)

for xs, ws, bias in [((4, 3), (5, 3), True), ((2, 3, 4), (6, 4), False), ((4,), (2, 4), True), ((0, 3), (2, 3), True), ((3, 1), (1, 1), True)]:
  def _ln(xs=xs, ws=ws, bias=bias):
    arrs = [rnd(*xs), rnd(*ws)] + ([rnd(ws[0])] if bias else [])
    check_fwd_bwd(lambda x, w, b=None: linear(x, w, b), lambda x, w, b=None: F.linear(x, w, b), arrs, atol=1e-5)
  case(f"linear x{xs} w{ws} bias={bias}", _ln)


def _dot():
  for xs, ws in [((3, 4), (4, 5)), ((4,), (4,)), ((2, 3, 4), (4, 2)), ((4,), (4, 3))]:
    check_fwd_bwd(lambda x, w: dot(x, w), lambda x, w: torch.matmul(x, w), [rnd(*xs), rnd(*ws)])


case("dot (matmul semantics) incl. 1-d", _dot)

# =====================================================================================================
# functional nn
for shape, n in [((5,), 5), ((2, 3), 4), ((0,), 3), ((3,), 0), ((2, 2, 2), 3)]:
  def _oh(shape=shape, n=n):
    a = RNG.integers(0, max(n, 1), size=shape).astype(np.int32) if n else np.zeros(shape, np.int32)
    r = one_hot(Tensor(a), n)
    assert r.dtype == tg.INT32
    close(r.numpy(), F.one_hot(torch.tensor(a.astype(np.int64)), n) if n else np.zeros(shape + (0,), np.int32))
  case(f"one_hot {shape} classes={n}", _oh)


def _oh_auto():
  # tinygrad rejects num_classes=-1 (PyTorch infers it): a lazy library cannot infer it unrealized
  a = np.array([0, 3, 1], np.int64)
  for bad in (-1, -2): expect_error("tg_one_hot", lambda bad=bad: one_hot(Tensor(a), bad), "num_classes")
  close(one_hot(view_of(np.array([[2, 0], [1, 1]], np.int32), "permuted"), 3).numpy(),
        F.one_hot(torch.tensor([[2, 0], [1, 1]]), 3))


case("one_hot rejects num_classes=-1; a permuted view", _oh_auto)

for shape, n in [((4, 6), 1), ((2, 3, 4), 2), ((2, 3, 4), 3), ((5, 1), 1), ((0, 4), 1), ((3, 7), 1)]:
  def _lnorm(shape=shape, n=n):
    check_fwd_bwd(lambda t: layernorm(t, n, 1e-5), lambda t: F.layer_norm(t, shape[-n:], eps=1e-5), [rnd(*shape, lo=-3, hi=5)],
                  atol=1e-4, gatol=1e-4)
  case(f"layernorm {shape} last {n} dims", _lnorm)


def _lnorm_views():
  a = rnd(4, 6)
  ref = F.layer_norm(torch.tensor(a), (6,)).numpy()
  for kind in VIEWS: close(layernorm(view_of(a, kind)).numpy(), ref, atol=1e-4, what=kind)


case("layernorm of views", _lnorm_views)

for shape, affine, inv2d in [((4, 3), True, False), ((2, 3, 5, 5), True, False), ((2, 3, 5, 5), False, False), ((2, 4, 6), True, True),
                             ((0, 2, 3), True, False)]:
  def _bn(shape=shape, affine=affine, inv2d=inv2d):
    c = shape[1]
    x, w, b, m = rnd(*shape), rnd(c), rnd(c), rnd(c)
    var_ = RNG.uniform(0.5, 2.0, size=c).astype(np.float32)
    inv = (1.0 / np.sqrt(var_ + 1e-5)).astype(np.float32)
    bshape = (1, c) + (1,) * (len(shape) - 2)
    invarg = inv.reshape(bshape) if inv2d else inv

    def tgf(x, m, iv, w=None, b=None): return batchnorm(x, w, b, m, iv)

    def tf(x, m, iv, w=None, b=None):
      r = (x - m.reshape(bshape)) * (iv if inv2d else iv.reshape(bshape))
      if w is not None: r = r * w.reshape(bshape) + b.reshape(bshape)
      return r

    arrs = [x, m, invarg] + ([w, b] if affine else [])
    check_fwd_bwd(tgf, tf, arrs, atol=1e-5)
    # and against torch's batch_norm in eval mode
    ref = F.batch_norm(torch.tensor(x), torch.tensor(m), torch.tensor(var_), torch.tensor(w) if affine else None,
                       torch.tensor(b) if affine else None, training=False, eps=1e-5)
    close(batchnorm(Tensor(x), Tensor(w) if affine else None, Tensor(b) if affine else None, Tensor(m), Tensor(invarg)).numpy(), ref,
          atol=1e-4, what="vs F.batch_norm")
  case(f"batchnorm {shape} affine={affine} invstd_broadcast={inv2d}", _bn)


def _dropout():
  a = rnd(64, 64, lo=1, hi=2)
  r = dropout(Tensor(a), 0.5).numpy()  # not training: unchanged
  close(r, a)
  with tg.context(TRAINING=1):
    x = set_rg(Tensor(a))
    out = dropout(x, 0.25)
    backward(out.sum())
    g = grad(x).numpy()
    o = out.numpy()
    kept = o != 0
    frac = kept.mean()
    assert 0.7 < frac < 0.8, f"kept fraction {frac}"
    close(o[kept], a[kept] / 0.75, what="scaled kept values")
    close(g, kept.astype(np.float32) / 0.75, what="dropout gradient matches its mask")
    close(dropout(Tensor(a), 1.0).numpy(), np.zeros_like(a))
    close(dropout(Tensor(a), 0.0).numpy(), a)


case("dropout: identity unless TRAINING; mask, scale and gradient", _dropout)

for qs, ks, vs, mask, causal in [((2, 4, 8), (2, 4, 8), (2, 4, 8), None, False), ((2, 3, 5, 4), (2, 3, 6, 4), (2, 3, 6, 7), None, False),
                                 ((1, 2, 5, 4), (1, 2, 5, 4), (1, 2, 5, 4), None, True), ((2, 4, 6, 8), (2, 4, 6, 8), (2, 4, 6, 8), None, True),
                                 ((2, 3, 4), (2, 5, 4), (2, 5, 3), "bool", False), ((2, 3, 4), (2, 5, 4), (2, 5, 3), "float", False),
                                 ((3, 4), (5, 4), (5, 2), None, False), ((2, 1, 3, 4), (1, 2, 3, 4), (1, 2, 3, 4), None, False)]:
  def _at(qs=qs, ks=ks, vs=vs, mask=mask, causal=causal):
    arrs = [rnd(*qs), rnd(*ks), rnd(*vs)]
    L, S = qs[-2], ks[-2]
    if mask == "bool":
      m = RNG.random((L, S)) < 0.7
      m[:, 0] = True
      margs = [m]
    elif mask == "float":
      margs = [rnd(L, S)]
    else:
      margs = []

    def tgf(q, k, v, m=None): return sdpa(q, k, v, m, causal)
    def tf(q, k, v, m=None):  # torch 1.13 has no F.scaled_dot_product_attention: its documented formula
      s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
      if causal: m = torch.ones(L, S, dtype=torch.bool).tril()
      if m is not None: s = s + (torch.where(m, 0.0, float("-inf")) if m.dtype == torch.bool else m)
      return torch.softmax(s, -1) @ v

    check_fwd_bwd(tgf, tf, arrs + margs, atol=1e-5, gatol=1e-4, nondiff=(3,))
  case(f"scaled_dot_product_attention q{qs} k{ks} v{vs} mask={mask} causal={causal}", _at)

# =====================================================================================================
# losses
for shape, red_ in [((5,), "mean"), ((3, 4), "sum"), ((3, 4), "none"), ((1,), "mean"), ((2, 3, 2), "mean")]:
  def _bce(shape=shape, red_=red_):
    x, y = rnd(*shape, lo=0.05, hi=0.95), (RNG.random(shape) < 0.5).astype(np.float32)
    check_fwd_bwd(lambda a, b: loss("binary_crossentropy", a, b, red_), lambda a, b: F.binary_cross_entropy(a, b, reduction=red_), [x, y],
                  atol=1e-5, nondiff=(1,))
  case(f"binary_crossentropy {shape} {red_}", _bce)

  def _bcel(shape=shape, red_=red_):
    x, y = rnd(*shape, lo=-30, hi=30), RNG.random(shape).astype(np.float32)
    check_fwd_bwd(lambda a, b: loss("binary_crossentropy_logits", a, b, red_),
                  lambda a, b: F.binary_cross_entropy_with_logits(a, b, reduction=red_), [x, y], atol=1e-4)
  case(f"binary_crossentropy_logits {shape} {red_} (large logits)", _bcel)


def _bcel_pos_weight():
  x, y, pw = rnd(4, 3), (RNG.random((4, 3)) < 0.5).astype(np.float32), RNG.uniform(0.5, 3, size=3).astype(np.float32)
  check_fwd_bwd(lambda a, b, p: loss("binary_crossentropy_logits", a, b, pos_weight=p),
                lambda a, b, p: F.binary_cross_entropy_with_logits(a, b, pos_weight=p), [x, y, pw], nondiff=(1, 2))


case("binary_crossentropy_logits pos_weight", _bcel_pos_weight)

for shape, ls, ign, red_ in [((4, 5), 0.0, None, "mean"), ((4, 5), 0.1, None, "mean"), ((3, 4, 6), 0.0, None, "sum"), ((6, 3), 0.0, 1, "mean"),
                             ((6, 3), 0.2, 2, "mean"), ((5, 4), 0.0, None, "none"), ((2, 7), 0.3, 0, "sum"), ((1, 3), 0.0, None, "mean")]:
  def _scce(shape=shape, ls=ls, ign=ign, red_=red_):
    x = rnd(*shape, lo=-4, hi=4)
    y = RNG.integers(0, shape[-1], size=shape[:-1]).astype(np.int64)
    if ign is not None: y.flat[0], y.flat[-1] = ign, (ign + 1) % shape[-1]  # one ignored, one counted

    def tf(a, b):
      C = shape[-1]
      kw = {"ignore_index": ign} if ign is not None else {}
      r = F.cross_entropy(a.reshape(-1, C), b.reshape(-1), label_smoothing=ls, reduction=red_, **kw)
      return r.reshape(shape[:-1]) if red_ == "none" else r

    check_fwd_bwd(lambda a, b: loss("sparse_categorical_crossentropy", a, b, red_, ls, ign), tf, [x, y], atol=1e-5)
  case(f"sparse_categorical_crossentropy {shape} smoothing={ls} ignore={ign} {red_}", _scce)

# a non-finite logit outside the label's column: NaN and +inf make the loss NaN; -inf (probability
# 0) leaves it finite without smoothing and makes it inf with smoothing -- PyTorch's results, and
# tinygrad's (whose rewrites fold the one-hot product into a select)
def _ce_nonfinite():
  for bad in (np.nan, np.inf, -np.inf):
    for ls in (0.0, 0.1):
      x = rnd(3, 4, lo=-2, hi=2)
      x[1, 2] = bad
      y = np.array([0, 1, 3], np.int64)
      ref = F.cross_entropy(torch.tensor(x), torch.tensor(y), label_smoothing=ls)
      close(loss("sparse_categorical_crossentropy", Tensor(x), Tensor(y), label_smoothing=ls).numpy(), ref,
            what=f"sparse_categorical_crossentropy, logit {bad}, smoothing {ls}")
      close(loss("cross_entropy", Tensor(x), Tensor(y), label_smoothing=ls).numpy(), ref,
            what=f"cross_entropy, logit {bad}, smoothing {ls}")


case("cross-entropy losses with a non-finite logit", _ce_nonfinite)


for shape, ls, red_, probs in [((4, 5), 0.0, "mean", False), ((4, 5), 0.2, "sum", False), ((2, 3, 4), 0.0, "none", False), ((5,), 0.0, "mean", False),
                               ((3, 4), 0.0, "mean", True), ((2, 3, 2, 2), 0.1, "mean", False), ((3, 4), 0.25, "none", True)]:
  def _ce(shape=shape, ls=ls, red_=red_, probs=probs):
    x = rnd(*shape, lo=-3, hi=3)
    cd = 0 if len(shape) == 1 else 1
    if probs:
      y = RNG.random(shape).astype(np.float32)
      y /= y.sum(cd, keepdims=True)
    else:
      y = RNG.integers(0, shape[cd], size=shape[:cd] + shape[cd + 1:]).astype(np.int64)
    check_fwd_bwd(lambda a, b: loss("cross_entropy", a, b, red_, ls), lambda a, b: F.cross_entropy(a, b, reduction=red_, label_smoothing=ls),
                  [x, y], atol=1e-5, nondiff=(1,))
  case(f"cross_entropy {shape} smoothing={ls} {red_} {'probs' if probs else 'indices'}", _ce)

for shape, red_, weighted, ign in [((4, 5), "mean", False, None), ((4, 5), "sum", True, None), ((4, 5), "none", False, None),
                                   ((3, 4), "mean", True, 2), ((2, 3, 4), "mean", False, None), ((2, 3, 4), "none", True, 1),
                                   ((5,), "mean", False, None), ((5,), "none", True, None), ((6, 3), "mean", False, -100)]:
  def _nll(shape=shape, red_=red_, weighted=weighted, ign=ign):
    x = np.log(RNG.uniform(0.05, 1, size=shape)).astype(np.float32)
    cd = 0 if len(shape) == 1 else 1
    y = RNG.integers(0, shape[cd], size=shape[:cd] + shape[cd + 1:]).astype(np.int64)
    if ign is not None and y.size: y.flat[0] = ign
    arrs = [x, y] + ([RNG.uniform(0.5, 2, size=shape[cd]).astype(np.float32)] if weighted else [])

    def tgf(a, b, w=None): return loss("nll_loss", a, b, red_, ignore_index=ign, weight=w)

    def tf(a, b, w=None): return F.nll_loss(a, b, weight=w, reduction=red_, ignore_index=ign if ign is not None else -100)

    check_fwd_bwd(tgf, tf, arrs, atol=1e-5, nondiff=(1, 2))
  case(f"nll_loss {shape} {red_} weight={weighted} ignore={ign}", _nll)


def _loss_views():
  x = rnd(4, 5)
  y = RNG.integers(0, 5, size=(4,)).astype(np.int64)
  ref = F.cross_entropy(torch.tensor(x), torch.tensor(y)).numpy()
  for kind in VIEWS:
    close(loss("sparse_categorical_crossentropy", view_of(x, kind), view_of(y, kind)).numpy(), ref, what=kind)
    close(loss("cross_entropy", view_of(x, kind), view_of(y, kind)).numpy(), ref, what=kind)


case("losses of non-contiguous logits and labels", _loss_views)


def _training_step():
  # a tiny conv net trained for a few SGD steps decreases its loss, and the grads match torch's
  x = rnd(4, 1, 6, 6)
  y = RNG.integers(0, 3, size=(4,)).astype(np.int64)
  w1, b1, w2 = rnd(2, 1, 3, 3, lo=-0.5, hi=0.5), rnd(2, lo=-0.1, hi=0.1), rnd(3, 18, lo=-0.5, hi=0.5)

  def net_tg(x, w1, b1, w2):
    h = max_pool2d(conv2d(x, w1, b1, padding=1).relu())
    return linear(h.reshape(4, -1), w2)

  def net_t(x, w1, b1, w2):
    h = F.max_pool2d(F.relu(F.conv2d(x, w1, b1, padding=1)), 2)
    return F.linear(h.reshape(4, -1), w2)

  ps = [set_rg(Tensor(a)) for a in (w1, b1, w2)]
  l_tg = loss("sparse_categorical_crossentropy", net_tg(Tensor(x), *ps), Tensor(y))
  tps = [torch.tensor(a, requires_grad=True) for a in (w1, b1, w2)]
  l_t = F.cross_entropy(net_t(torch.tensor(x), *tps), torch.tensor(y))
  backward(l_tg)
  l_t.backward()
  close(l_tg.numpy(), l_t, atol=1e-5)
  for p, tp in zip(ps, tps): close(grad(p).numpy(), tp.grad, atol=1e-5)


case("conv -> relu -> max_pool -> linear -> sparse CE: loss and grads match torch", _training_step)


def _mnist_block():
  # beautiful_mnist's block -- conv, relu, batchnorm with batch statistics, max_pool2d -- at a size
  # where the scheduler materializes shared backward results and stores intermediates channels-last:
  # max_pool2d's backward compares recomputed values with the maximum, which must still match
  x = rnd(16, 32, 18, 18)
  y = RNG.integers(0, 10, size=(16,)).astype(np.int64)
  w1, b1 = rnd(32, 32, 3, 3, lo=-0.1, hi=0.1), rnd(32, lo=-0.1, hi=0.1)
  g, bb, w2 = rnd(32, lo=0.5, hi=1.5), rnd(32, lo=-0.1, hi=0.1), rnd(10, 32 * 8 * 8, lo=-0.05, hi=0.05)

  def net_tg(x, w1, b1, g, bb, w2):
    h = conv2d(x, w1, b1).relu()
    m = h.mean(axis=(0, 2, 3), keepdim=True)
    v = ((h - m) * (h - m)).mean(axis=(0, 2, 3), keepdim=True)
    hn = (h - m) * (v + 1e-5).sqrt().reciprocal() * g.reshape(1, 32, 1, 1) + bb.reshape(1, 32, 1, 1)
    return linear(max_pool2d(hn).reshape(16, -1), w2)

  def net_t(x, w1, b1, g, bb, w2):
    h = F.relu(F.conv2d(x, w1, b1))
    hn = F.batch_norm(h, None, None, g, bb, training=True, eps=1e-5)
    return F.linear(F.max_pool2d(hn, 2).reshape(16, -1), w2)

  ps = [set_rg(Tensor(a)) for a in (w1, b1, g, bb, w2)]
  l_tg = loss("sparse_categorical_crossentropy", net_tg(Tensor(x), *ps), Tensor(y))
  tps = [torch.tensor(a, requires_grad=True) for a in (w1, b1, g, bb, w2)]
  l_t = F.cross_entropy(net_t(torch.tensor(x), *tps), torch.tensor(y))
  backward(l_tg)
  l_t.backward()
  close(l_tg.numpy(), l_t, atol=1e-4)
  for p, tp in zip(ps, tps):
    gp = grad(p).numpy()
    assert np.isfinite(gp).all(), "non-finite gradient"
    close(gp, tp.grad, atol=1e-4, rtol=1e-2)


case("conv -> relu -> batchnorm (batch stats) -> max_pool -> linear, training-sized: grads match torch", _mnist_block)

def _broadcast_views():
  # inputs that are expanded (stride-0) views of a smaller buffer
  a = np.broadcast_to(rnd(1, 3, 5, 5), (2, 3, 5, 5)).copy()
  w = rnd(4, 3, 3, 3)
  x = view_of(a, "expanded")
  close(conv2d(x, Tensor(w), padding=1).numpy(), F.conv2d(torch.tensor(a), torch.tensor(w), padding=1), atol=1e-4, what="conv2d")
  close(max_pool2d(x).numpy(), F.max_pool2d(torch.tensor(a), 2), what="max_pool2d")
  b = np.broadcast_to(rnd(1, 6), (4, 6)).copy()
  close(cumsum(view_of(b, "expanded"), 0).numpy(), np.cumsum(b, 0), atol=1e-5, what="cumsum along the expanded dim")
  close(layernorm(view_of(b, "expanded")).numpy(), F.layer_norm(torch.tensor(b), (6,)), atol=1e-4, what="layernorm")
  close(red("logsumexp", view_of(b, "expanded"), 0).numpy(), torch.logsumexp(torch.tensor(b), 0), atol=1e-5, what="logsumexp")
  close(var(view_of(b, "expanded"), 0).numpy(), np.zeros(6), atol=1e-6, what="var of equal rows")
  close(red("argmax", view_of(b, "expanded"), 0).numpy(), np.zeros(6), what="argmax ties -> first")
  # binary cross-entropy with a broadcast target (tinygrad broadcasts)
  p, y = rnd(3, 4, lo=0.1, hi=0.9), (RNG.random((1, 4)) < 0.5).astype(np.float32)
  ref = F.binary_cross_entropy(torch.tensor(p), torch.tensor(np.broadcast_to(y, (3, 4)).copy()))
  close(loss("binary_crossentropy", Tensor(p), Tensor(y)).numpy(), ref, what="bce broadcast target")


case("ops on expanded (broadcast) views and broadcast targets", _broadcast_views)


def _dtypes():
  # float64 keeps its precision; float16 computes in half (tolerances as tinygrad's for half)
  for dt, atol in [(np.float64, 1e-9), (np.float16, 2e-2)]:
    x, w = rnd(1, 2, 5, 5).astype(dt), rnd(3, 2, 3, 3).astype(dt)
    tx, tw = torch.tensor(x.astype(np.float64)), torch.tensor(w.astype(np.float64))
    r = conv2d(Tensor(x), Tensor(w), padding=1)
    assert r.dtype == tg.np_dtype_to_tg(dt), tg.dtype_name(r.dtype)
    close(r.numpy(), F.conv2d(tx, tw, padding=1), atol=atol * 10, rtol=1e-2 if dt == np.float16 else 1e-7, what=f"conv2d {dt}")
    close(max_pool2d(Tensor(x)).numpy(), F.max_pool2d(tx, 2), atol=atol, what=f"max_pool2d {dt}")
    close(avg_pool2d(Tensor(x), kernel_size=3, stride=1, padding=1).numpy(), F.avg_pool2d(tx, 3, 1, 1), atol=atol, rtol=1e-2,
          what=f"avg_pool2d {dt}")
    a = rnd(4, 6).astype(dt)
    ta = torch.tensor(a.astype(np.float64))
    close(cumsum(Tensor(a), 1).numpy(), torch.cumsum(ta, 1), atol=atol * 5, rtol=1e-2, what=f"cumsum {dt}")
    close(red("logsumexp", Tensor(a), 1).numpy(), torch.logsumexp(ta, 1), atol=atol * 5, rtol=1e-2, what=f"logsumexp {dt}")
    close(var(Tensor(a), 1).numpy(), torch.var(ta, 1), atol=atol * 5, rtol=1e-2, what=f"var {dt}")
    close(layernorm(Tensor(a)).numpy(), F.layer_norm(ta, (6,)), atol=atol * 5, rtol=1e-2, what=f"layernorm {dt}")
    y = RNG.integers(0, 6, size=(4,)).astype(np.int64)
    close(loss("sparse_categorical_crossentropy", Tensor(a), Tensor(y)).numpy(), F.cross_entropy(ta, torch.tensor(y)), atol=atol * 5,
          rtol=1e-2, what=f"sparse CE {dt}")
    for t in [var(Tensor(a), 1), layernorm(Tensor(a)), cumsum(Tensor(a), 0)]:
      assert t.dtype == tg.np_dtype_to_tg(dt), tg.dtype_name(t.dtype)


case("float64 and float16 inputs keep their dtype (conv2d, pools, cumsum, logsumexp, var, layernorm, CE)", _dtypes)


def _half_kernels():
  # float16 and bfloat16 at sizes whose kernels run in vector lanes (matmul, sums, conv2d, softmax,
  # elementwise): against PyTorch in float64 on the same half-precision inputs (PyTorch 1.13 has no
  # CPU float16 matmul or conv), with tolerances for one half rounding per operation; bfloat16 also
  # against PyTorch's own bfloat16 matmul
  for dt, name, tol in [(tg.FLOAT16, "float16", 2e-3), (tg.BFLOAT16, "bfloat16", 1.6e-2)]:
    def half(a):
      t = Tensor(a.astype(np.float32), dtype=dt)
      return t, torch.tensor(t.numpy().astype(np.float64))
    (x, tx), (w, tw) = half(rnd(64, 96)), half(rnd(96, 48))
    mag = torch.abs(tx) @ torch.abs(tw)  # the scale of each dot product's rounding
    got = dot(x, w)
    assert got.dtype == dt, tg.dtype_name(got.dtype)
    close(got.numpy(), tx @ tw, atol=float(mag.max()) * tol * 2, rtol=tol * 2, what=f"matmul {name}")
    if dt == tg.BFLOAT16:
      tb = torch.tensor(x.numpy()).bfloat16() @ torch.tensor(w.numpy()).bfloat16()
      close(got.numpy(), tb.float(), atol=float(mag.max()) * tol * 2, rtol=tol * 2, what="matmul bfloat16 vs torch bfloat16")
    a, ta = half(rnd(128, 256))
    close(red("sum", a, 1).numpy(), ta.sum(1), atol=float(ta.abs().sum(1).max()) * tol, rtol=tol, what=f"sum rows {name}")
    close(red("sum", a, 0).numpy(), ta.sum(0), atol=float(ta.abs().sum(0).max()) * tol, rtol=tol, what=f"sum cols {name}")
    close(a.softmax(-1).numpy(), torch.softmax(ta, -1), atol=tol, rtol=tol * 4, what=f"softmax {name}")
    close((a * a + a).exp().numpy(), torch.exp(ta * ta + ta), atol=tol, rtol=tol * 4, what=f"elementwise {name}")
    (c, tc), (k, tk) = half(rnd(2, 16, 12, 12)), half(rnd(32, 16, 3, 3))
    r = conv2d(c, k, padding=1)
    assert r.dtype == dt, tg.dtype_name(r.dtype)
    cmag = F.conv2d(torch.abs(tc), torch.abs(tk), padding=1)
    close(r.numpy(), F.conv2d(tc, tk, padding=1), atol=float(cmag.max()) * tol * 2, rtol=tol * 2, what=f"conv2d {name}")


case("float16 and bfloat16 matmul, sums, softmax, elementwise and conv2d in vector lanes", _half_kernels)


def _half_matmul_products():
  # tinygrad's float16 matmul keeps each product unrounded in the float32 sum (one rounding at the
  # end); measured there on this 64x512x64 case: 8 of 4096 results differ from exact products summed
  # (by the order of the sum), 1712 from products rounded to float16 first
  a = RNG.standard_normal((64, 512)).astype(np.float16)
  b = RNG.standard_normal((512, 64)).astype(np.float16)
  got = dot(Tensor(a), Tensor(b)).numpy()
  prod = a.astype(np.float32)[:, :, None] * b.astype(np.float32)[None, :, :]  # exact
  exact = prod.sum(1, dtype=np.float64).astype(np.float32).astype(np.float16)
  rounded = prod.astype(np.float16).astype(np.float64).sum(1).astype(np.float32).astype(np.float16)
  n_exact, n_rounded = int((got != exact).sum()), int((got != rounded).sum())
  assert n_exact < 100 and n_rounded > 1000, f"{n_exact} differ from exact products, {n_rounded} from rounded ones"


case("float16 matmul: products summed unrounded, as tinygrad computes", _half_matmul_products)


def _half_conv_products():
  # the same for convolutions (tinygrad: (x * w).sum(dtype=float32) then the cast): 0 of the results
  # differ from the exact products summed and rounded once, where rounding each product made 174 of
  # 420 differ in this 1x1 case; 3x3, grouped, strided, 1-d and 3-d too, and a bias added after the
  # rounding, in the half dtype
  for dt, tdt in [(tg.FLOAT16, torch.float16), (tg.BFLOAT16, torch.bfloat16)]:
    for xs, ws, kw in [((2, 4, 7, 5), (6, 4, 1, 1), {}), ((2, 4, 9, 8), (6, 2, 3, 3), {"groups": 2, "stride": (2, 1)}),
                       ((2, 3, 11), (5, 3, 3), {}), ((1, 2, 5, 4, 6), (3, 2, 2, 3, 2), {})]:
      x64 = torch.tensor(RNG.standard_normal(xs)).to(tdt).double()
      w64 = torch.tensor(RNG.standard_normal(ws)).to(tdt).double()
      b64 = torch.tensor(RNG.standard_normal(ws[0])).to(tdt).double()
      conv = {3: F.conv1d, 4: F.conv2d, 5: F.conv3d}[len(xs)]
      exact = conv(x64, w64, None, stride=kw.get("stride", 1), groups=kw.get("groups", 1))
      want = (exact.to(tdt).double() + b64.reshape(-1, *[1] * (len(xs) - 2))).to(tdt).float().numpy()
      tx, tw, tb = (Tensor(t.float().numpy()).cast(dt) for t in (x64, w64, b64))
      got = conv2d(tx, tw, tb, groups=kw.get("groups", 0), stride=kw.get("stride"))
      assert got.dtype == dt, tg.dtype_name(got.dtype)
      g = got.cast(tg.FLOAT32).numpy()
      assert (g != want).sum() == 0, f"{tg.dtype_name(dt)} {xs} {ws}: {(g != want).sum()} of {g.size} differ from the exact sum rounded once"


case("float16 and bfloat16 convolutions: products summed unrounded, bias after the rounding", _half_conv_products)


def _winograd():
  # WINO=1 (tinygrad's): convolutions with 3-wide kernels, stride and dilation 1, go through Winograd's
  # F(4, 3) tiles; the values and gradients are PyTorch's direct convolution's up to float rounding,
  # in 1, 2 and 3 spatial dims, grouped, padded unevenly, with sizes the 4-wide tiles do not divide
  cases = [((1, 1, 5, 5), (1, 1, 3, 3), {}), ((2, 3, 7, 6), (4, 3, 3, 3), {"padding": 1}),
           ((2, 4, 9, 10), (6, 2, 3, 3), {"groups": 2, "padding": (1, 0, 2, 1)}), ((1, 2, 4, 4), (3, 2, 3, 3), {"padding": 2}),
           ((3, 8, 12, 12), (16, 8, 3, 3), {"padding": 1}), ((2, 3, 11), (5, 3, 3), {"padding": 1}),
           ((1, 2, 6, 5, 7), (3, 2, 3, 3, 3), {"padding": 1})]
  with tg.context(WINO=1):
    for xs, ws, kw in cases:
      conv = {3: F.conv1d, 4: _torch_conv, 5: F.conv3d}[len(xs)]
      for with_bias in (False, True):
        arrs = [rnd(*xs), rnd(*ws)] + ([rnd(ws[0])] if with_bias else [])
        ref = (lambda x, w, b=None, kw=kw, conv=conv: conv(x, w, b, kw) if conv is _torch_conv else
               conv(x, w, b, padding=kw.get("padding", 0), groups=kw.get("groups", 1)))
        check_fwd_bwd(lambda x, w, b=None, kw=kw: conv2d(x, w, b, **kw), ref, arrs, atol=2e-4, gatol=5e-4)
    # it is the Winograd path: the input and weight transforms, the channel sums and the output
    # transform are kernels of their own (the direct convolution is one kernel); a 5x5 kernel or a
    # stride of 2 stays direct
    x, w = Tensor(rnd(2, 3, 8, 8)).realize(), Tensor(rnd(4, 3, 3, 3)).realize()
    assert kernels(lambda: conv2d(x, w)) >= 4
    assert kernels(lambda: conv2d(x, Tensor(rnd(4, 3, 5, 5)).realize())) == 1
    assert kernels(lambda: conv2d(x, w, stride=2)) == 1
  with tg.context(WINO=0):
    assert kernels(lambda: conv2d(x, w)) == 1
  # WINO=2: 5-wide kernels too (F(4, 5), 1 and 2 dims), where the tiles pay: at least 8 channels per
  # group in and out, at least 12 outputs along every spatial dim
  with tg.context(WINO=2):
    for xs, ws, kw in [((2, 8, 16, 14), (12, 8, 5, 5), {"padding": 2}), ((2, 16, 13, 12), (16, 8, 5, 5), {"groups": 2, "padding": 2}),
                       ((2, 8, 22), (8, 8, 5), {"padding": 1}), ((2, 8, 14, 13), (8, 8, 3, 3), {"padding": 1})]:
      conv = F.conv1d if len(xs) == 3 else _torch_conv
      arrs = [rnd(*xs), rnd(*ws), rnd(ws[0])]
      ref = (lambda x, w, b, kw=kw, conv=conv: conv(x, w, b, kw) if conv is _torch_conv else conv(x, w, b, padding=kw["padding"]))
      check_fwd_bwd(lambda x, w, b, kw=kw: conv2d(x, w, b, **kw), ref, arrs, atol=5e-4, gatol=1e-3)
    x5 = Tensor(rnd(2, 8, 16, 16)).realize()
    assert kernels(lambda: conv2d(x5, Tensor(rnd(8, 8, 5, 5)).realize(), padding=2)) >= 7
    assert kernels(lambda: conv2d(x5, Tensor(rnd(8, 8, 5, 5)).realize(), padding=0)) >= 7  # 12 x 12 outputs: Winograd
    assert kernels(lambda: conv2d(Tensor(rnd(2, 8, 14, 16)).realize(), Tensor(rnd(8, 8, 5, 5)).realize())) <= 3  # 10 outputs: direct


case("WINO=1: Winograd F(4, 3) convolutions equal the direct ones, forward and backward; WINO=2: F(4, 5) too, where it pays", _winograd)


def _cumsum_kernels():
  for shape, most in [((4, 64), 1), ((4, 100), 3), ((2, 1000), 3), ((1, 100000), 7)]:
    x = Tensor(rnd(*shape)).realize()
    n = kernels(lambda: cumsum(x, 1))
    assert n <= most, f"cumsum of {shape} took {n} kernels, expected at most {most}"


case("kernel counts: cumsum = 1 kernel up to 64, <= 3 to 1024, <= 7 at 100000", _cumsum_kernels)


def _cumsum_inf_nan():
  # an inf or NaN reaches only the outputs at and after it (a 0/1 matrix product would spread it)
  for n in [5, 40, 300, 5000]:
    a = rnd(2, n)
    a[0, n // 2] = np.inf
    a[1, n // 3] = np.nan
    if n > 4: a[0, n - 2] = -np.inf
    with np.errstate(invalid="ignore"): want = np.cumsum(a.astype(np.float64), 1).astype(np.float32)
    close(cumsum(Tensor(a), 1).numpy(), want, atol=1e-3, rtol=1e-4, what=f"n={n}")


case("cumsum with inf and NaN inside long and short rows", _cumsum_inf_nan)


def _cumsum_half_long():
  # float16/bfloat16 rows longer than 64: the levels in float32, one rounding (torch's float
  # accumulation on GPUs): each level rounded to 16 bits ended a bfloat16 cumsum of 100000 ones at 99328
  for dt, tdt, n, v in [(tg.BFLOAT16, torch.bfloat16, 100000, 1.0), (tg.FLOAT16, torch.float16, 20000, 0.7), (tg.FLOAT16, torch.float16, 300, -1.3)]:
    want = torch.cumsum(torch.full((n,), v).to(tdt).double(), 0).to(tdt).float().numpy()  # exact, rounded once
    got = cumsum(Tensor(np.full(n, v, np.float32)).cast(dt), 0)
    assert got.dtype == dt
    g = got.cast(tg.FLOAT32).numpy()
    assert (g != want).sum() == 0, f"{tg.dtype_name(dt)} n={n}: {(g != want).sum()} differ, last {g[-1]} vs {want[-1]}"


case("float16/bfloat16 cumsum of long rows rounds once", _cumsum_half_long)


def _cumsum_long():
  # above 64 * 512 elements the chunk totals are split again (three levels for 70000): exact for
  # integers, float64 to rounding, and the gradient (a reversed cumsum) too
  a = RNG.integers(-100, 100, size=(2, 70000)).astype(np.int32)
  close(cumsum(Tensor(a), 1).numpy(), np.cumsum(a, 1), what="int32")
  d = rnd(70000).astype(np.float64)
  x = set_rg(Tensor(d))
  r = cumsum(x, 0)
  w = rnd(70000).astype(np.float64)
  backward((r * Tensor(w)).sum())
  close(r.numpy(), np.cumsum(d), atol=1e-9, rtol=1e-9, what="float64")
  close(grad(x).numpy(), np.cumsum(w[::-1])[::-1], atol=1e-9, rtol=1e-9, what="grad")


case("cumsum of 70000 (chunk totals split again): int32 exact, float64, gradient", _cumsum_long)


# =====================================================================================================
# errors: every message names the function
ERRS = [
    ("tg_cat", lambda: cat([Tensor(rnd(2, 3)), Tensor(rnd(2, 4))], 0), "shape"),
    ("tg_cat", lambda: cat([Tensor(rnd(2, 3)), Tensor(rnd(2, 3))], 2), "axis"),
    ("tg_cat", lambda: cat([Tensor(rnd(2, 3)), Tensor(rnd(2, 3, 1))], 0), None),
    ("tg_stack", lambda: stack([Tensor(rnd(2, 3)), Tensor(rnd(3, 2))], 0), "equal shapes"),
    ("tg_repeat", lambda: repeat(Tensor(rnd(2, 3)), (2,)), None),
    ("tg_repeat", lambda: repeat(Tensor(rnd(2, 3)), (2, -1)), "negative"),
    ("tg_split", lambda: split(Tensor(rnd(5, 2)), [2, 2], 0), "sum"),
    ("tg_split", lambda: split(Tensor(rnd(5, 2)), 2, 3), "axis"),
    ("tg_chunk", lambda: chunk(Tensor(rnd(5, 2)), 0, 0), "chunks"),
    ("tg_gather", lambda: gather(Tensor(rnd(3, 4)), 1, Tensor(np.zeros((3,), np.int64))), "same number of dimensions"),
    ("tg_gather", lambda: gather(Tensor(rnd(3, 4)), 1, Tensor(np.zeros((4, 2), np.int64))), "larger"),
    ("tg_gather", lambda: gather(Tensor(rnd(3, 4)), 1, Tensor(np.zeros((3, 2), np.float32))), "integer"),
    ("tg_var", lambda: var(Tensor(rnd(3, 4)), 2), "axis"),
    ("tg_std", lambda: std(Tensor(rnd(3, 4)), (0, 0)), "twice"),
    ("tg_logsumexp", lambda: red("logsumexp", Tensor(rnd(3, 4)), 5), "axis"),
    ("tg_argmax", lambda: red("argmax", Tensor(rnd(3, 4)), (0, 1)), "one axis"),
    ("tg_argmax", lambda: red("argmax", Tensor(rnd(3, 0)), 1), "empty"),
    ("tg_argmin", lambda: red("argmin", Tensor(rnd(3, 4)), -3), "axis"),
    ("tg_cumsum", lambda: cumsum(Tensor(rnd(3, 4)), 2), "axis"),
    ("tg_triu", lambda: triu(Tensor(rnd(4))), "2 dimensions"),
    ("tg_max_pool2d", lambda: max_pool2d(Tensor(rnd(1, 1, 2, 2)), kernel_size=3), "larger than the padded input"),
    ("tg_max_pool2d", lambda: max_pool2d(Tensor(rnd(4))), "(..., height, width)"),
    ("tg_avg_pool2d", lambda: avg_pool2d(Tensor(rnd(1, 1, 4, 4)), padding=(1, 1, 1)), "npadding"),
    ("tg_avg_pool2d", lambda: avg_pool2d(Tensor(rnd(1, 1, 4, 4)), stride=(0, 2)), "stride"),
    ("tg_conv2d", lambda: conv2d(Tensor(rnd(1, 3, 5, 5)), Tensor(rnd(2, 2, 3, 3))), "channels"),
    ("tg_conv2d", lambda: conv2d(Tensor(rnd(1, 4, 5, 5)), Tensor(rnd(3, 2, 3, 3)), groups=2), "divisible"),
    ("tg_conv2d", lambda: conv2d(Tensor(rnd(3, 5, 5)), Tensor(rnd(2, 3, 3, 3))), "(batch, cin"),
    ("tg_conv2d", lambda: conv2d(Tensor(rnd(1, 3, 5, 5)), Tensor(rnd(2, 3, 3, 3)), Tensor(rnd(3))), "bias"),
    ("tg_conv2d", lambda: conv2d(Tensor(rnd(1, 3, 2, 2)), Tensor(rnd(2, 3, 3, 3))), "larger"),
    ("tg_linear", lambda: linear(Tensor(rnd(4, 3)), Tensor(rnd(3, 5))), "in_features"),
    ("tg_linear", lambda: linear(Tensor(rnd(4, 3)), Tensor(rnd(5, 3)), Tensor(rnd(4))), "bias"),
    ("tg_dot", lambda: dot(Tensor(rnd(4, 3)), Tensor(rnd(4, 3))), None),
    ("tg_one_hot", lambda: one_hot(Tensor(rnd(3)), 3), "integer"),
    ("tg_one_hot", lambda: one_hot(Tensor(np.zeros(3, np.int32)), -2), "num_classes"),
    ("tg_layernorm", lambda: layernorm(Tensor(rnd(3, 4)), 3), "naxes"),
    ("tg_batchnorm", lambda: batchnorm(Tensor(rnd(2, 3, 4)), None, None, Tensor(rnd(4)), Tensor(rnd(3))), "mean"),
    ("tg_dropout", lambda: dropout(Tensor(rnd(3)), 1.5), "p="),
    ("tg_scaled_dot_product_attention", lambda: sdpa(Tensor(rnd(2, 3, 4)), Tensor(rnd(2, 3, 5)), Tensor(rnd(2, 3, 4))), "last dim"),
    ("tg_scaled_dot_product_attention", lambda: sdpa(Tensor(rnd(3, 4)), Tensor(rnd(3, 4)), Tensor(rnd(3, 4)), Tensor(rnd(3, 3) > 0), True),
     "is_causal"),
    ("tg_scaled_dot_product_attention", lambda: sdpa(Tensor(rnd(3, 4)), Tensor(rnd(5, 4)), Tensor(rnd(5, 4)), Tensor(rnd(3, 4))),
     "attn_mask"),
    ("tg_binary_crossentropy", lambda: loss("binary_crossentropy", Tensor(rnd(3, 4)), Tensor(rnd(3, 5))), "broadcast"),
    ("tg_binary_crossentropy", lambda: loss("binary_crossentropy", Tensor(rnd(3)), Tensor(rnd(3)), label_smoothing=0.1), "label_smoothing"),
    ("tg_sparse_categorical_crossentropy",
     lambda: loss("sparse_categorical_crossentropy", Tensor(rnd(3, 4)), Tensor(np.zeros(4, np.int64))), "labels have shape"),
    ("tg_sparse_categorical_crossentropy",
     lambda: loss("sparse_categorical_crossentropy", Tensor(rnd(3, 4)), Tensor(np.zeros(3, np.int64)), label_smoothing=1.5), "[0, 1]"),
    ("tg_cross_entropy", lambda: loss("cross_entropy", Tensor(rnd(3, 4)), Tensor(np.zeros(4, np.int64))), "labels have shape"),
    ("tg_nll_loss", lambda: loss("nll_loss", Tensor(rnd(3, 4)), Tensor(np.zeros(3, np.int64)), weight=Tensor(rnd(3))), "weight"),
    ("tg_nll_loss", lambda: loss("nll_loss", Tensor(rnd(3, 4)), Tensor(np.zeros(3, np.float32))), "integer"),
]
for i, (fname, f, sub) in enumerate(ERRS):
  case(f"error: {fname} #{i} ({sub or 'message names the function'})", lambda fname=fname, f=f, sub=sub: expect_error(fname, f, sub))


def _err_none_propagates():
  # a none input propagates without overwriting the first error; a stale handle is reported by name
  lib.tg_clear_error()
  r = lib.tg_cumsum(NONE_T, 0)
  assert r.id == 0
  msg = tg.last_error()
  assert msg and "tg_cumsum" in msg, msg
  lib.tg_clear_error()
  lib.tg_scope_begin()
  t = Tensor(rnd(2, 2))
  lib.tg_scope_end()
  try:
    conv2d(t, t)
    raise AssertionError("stale handle accepted")
  except TGError as e:
    assert "tg_conv2d" in str(e) and "stale" in str(e), str(e)
  lib.tg_clear_error()
  x = Tensor(rnd(3, 4))
  assert lib.tg_split(x.h, (ctypes.c_int64 * 1)(2), 1, 0, (_T * 1)(), 1) == -1  # 2 pieces, room for 1
  msg = tg.last_error()
  assert msg and "tg_split" in msg and "room" in msg, msg
  lib.tg_clear_error()


case("error: none input propagates; stale handle and small out array are reported", _err_none_propagates)


# =====================================================================================================
def main(): return tg.run_cases(CASES, "test_nn_torch")


if __name__ == "__main__":
  sys.exit(main())
