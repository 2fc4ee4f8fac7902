"""test_indexing_torch.py -- differential tests of src/tensor/indexing.c against PyTorch and numpy.

Covers tg_getitem (ints, slices with positive and negative steps, None, ellipsis, integer tensors alone
and combined), tg_setitem, tg_pad_mode (reflect, replicate, circular), repeat_interleave, unfold,
unflatten, diag, diagonal, roll, rearrange, masked_fill, masked_select, nonzero, scatter,
scatter_reduce, element_size / nbytes / is_floating_point and contiguous_backward.

Each op: forward against torch (numpy where torch 1.13 lacks the feature: negative slice steps, pad
modes on any rank, rearrange), backward through tg_backward(tg_sum(op(x) * w)) against torch autograd
(or the numpy adjoint: np.add.at for indexing), shapes with 0-sized and 1-sized dims, non-contiguous
inputs (permuted, flipped, shrunk, padded views), negative indices and steps; error cases (the message
must name the function). Every case runs in its own tg scope and the live handle count must be back
where it started. Last line: "test_indexing_torch: N passed, N failed"; exit 1 on any failure.

Run: /usr/bin/python3 tests/test_indexing_torch.py   (TINYGRAD_LIB selects the library; TEST_FILTER=substr)
"""
import ctypes
import os
import sys
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import tinygrad as tg  # noqa: E402
from tinygrad import Tensor, TGError, _T, call, lib  # noqa: E402
from torchcheck import close, backward, expect_error, grad, kernels, set_rg, view_of, status as _status  # noqa: E402
import torchcheck  # noqa: E402

warnings.filterwarnings("ignore")  # torch's "scatter_reduce is in beta"
torch.set_num_threads(1)
RNG = np.random.default_rng(4321)


def rnd(*shape, **kw): return torchcheck.rnd(*shape, rng=RNG, **kw)

# ---- prototypes of the indexing section of include/tinygrad.h -------------------------------------
_i64p, _intp, _tp = ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_int), ctypes.POINTER(_T)
_I, _I64, _B, _D, _S = ctypes.c_int, ctypes.c_int64, ctypes.c_bool, ctypes.c_double, ctypes.c_char_p
SLICE, INT, NEWAXIS, ELLIPSIS, TENSOR = range(5)
PAD_CONSTANT, PAD_REFLECT, PAD_REPLICATE, PAD_CIRCULAR = range(4)
RED = {"sum": 0, "prod": 1, "mean": 2, "amax": 3, "amin": 4}
DIM_NONE = -2**31


class Spec(ctypes.Structure):
  _fields_ = [("kind", _I), ("index", _I64), ("start", _I64), ("stop", _I64), ("step", _I64), ("has_start", _B),
              ("has_stop", _B), ("tensor", _T)]


class AxisSize(ctypes.Structure):
  _fields_ = [("name", _S), ("size", _I64)]


_SIGS = {
    "tg_getitem": (_T, [_T, ctypes.POINTER(Spec), _I]),
    "tg_setitem": (_I, [_T, ctypes.POINTER(Spec), _I, _T]),
    "tg_setitem_s": (_I, [_T, ctypes.POINTER(Spec), _I, _D]),
    "tg_pad_mode": (_T, [_T, _i64p, _I, _I, _D]),
    "tg_repeat_interleave": (_T, [_T, _I64, _I]),
    "tg_unfold": (_T, [_T, _I, _I64, _I64]),
    "tg_unflatten": (_T, [_T, _I, _i64p, _I]),
    "tg_diag": (_T, [_T]),
    "tg_diagonal": (_T, [_T, _I64, _I, _I]),
    "tg_roll": (_T, [_T, _i64p, _I, _intp, _I]),
    "tg_rearrange": (_T, [_T, _S, ctypes.POINTER(AxisSize), _I]),
    "tg_masked_fill": (_T, [_T, _T, _T]),
    "tg_masked_fill_s": (_T, [_T, _T, _D]),
    "tg_masked_select": (_T, [_T, _T]),
    "tg_nonzero": (_T, [_T]),
    "tg_scatter": (_T, [_T, _I, _T, _T]),
    "tg_scatter_s": (_T, [_T, _I, _T, _D]),
    "tg_scatter_reduce": (_T, [_T, _I, _T, _T, _I, _B]),
    "tg_element_size": (_I64, [_T]),
    "tg_nbytes": (_I64, [_T]),
    "tg_is_floating_point": (_B, [_T]),
    "tg_contiguous_backward": (_T, [_T]),
    "tg_set_requires_grad": (_T, [_T, _B]),
    "tg_backward": (_I, [_T]),
    "tg_grad": (_T, [_T]),
    "tg_index": (_T, [_T, _T]),
}
for _n, (_r, _a) in _SIGS.items():
  _f = getattr(lib, _n)
  _f.restype, _f.argtypes = _r, _a

W = Tensor._wrap


def _i64arr(v): return (ctypes.c_int64 * max(len(v), 1))(*[int(x) for x in v])
def _iarr(v): return (ctypes.c_int * max(len(v), 1))(*[int(x) for x in v])


def spec_of(idx):
  """A Python index (tuple of int, slice, None, Ellipsis, Tensor) -> (Spec array, n)."""
  if not isinstance(idx, tuple): idx = (idx,)
  out = []
  for e in idx:
    if e is None: out.append(Spec(kind=NEWAXIS))
    elif e is Ellipsis: out.append(Spec(kind=ELLIPSIS))
    elif isinstance(e, Tensor): out.append(Spec(kind=TENSOR, tensor=e.h))
    elif isinstance(e, slice):
      out.append(Spec(kind=SLICE, start=e.start or 0, stop=e.stop or 0, step=e.step or 0, has_start=e.start is not None,
                      has_stop=e.stop is not None))
    elif isinstance(e, (int, np.integer)): out.append(Spec(kind=INT, index=int(e)))
    else: raise TypeError(type(e))
  return (Spec * max(len(out), 1))(*out), len(out)


# thin wrappers (each raises TGError with the library's message on failure)
def getitem(x, idx): return W(call("getitem", x.h, *spec_of(idx)))
def setitem(x, idx, v):
  if isinstance(v, Tensor): _status("tg_setitem", lib.tg_setitem(x.h, *spec_of(idx), v.h))
  else: _status("tg_setitem_s", lib.tg_setitem_s(x.h, *spec_of(idx), float(v)))
def pad_mode(x, pads, mode, value=0.0): return W(call("pad_mode", x.h, _i64arr(pads), len(pads), mode, float(value)))
def repeat_interleave(x, r, dim=None): return W(call("repeat_interleave", x.h, r, DIM_NONE if dim is None else dim))
def unfold(x, dim, size, step): return W(call("unfold", x.h, dim, size, step))
def unflatten(x, dim, sizes): return W(call("unflatten", x.h, dim, _i64arr(sizes), len(sizes)))
def diag(x): return W(call("diag", x.h))
def diagonal(x, offset=0, d1=0, d2=1): return W(call("diagonal", x.h, offset, d1, d2))
def roll(x, shifts, dims=None):
  shifts = [shifts] if isinstance(shifts, int) else list(shifts)
  dims = [] if dims is None else ([dims] if isinstance(dims, int) else list(dims))
  return W(call("roll", x.h, _i64arr(shifts), len(shifts), _iarr(dims), len(dims)))
def rearrange(x, formula, **sizes):
  arr = (AxisSize * max(len(sizes), 1))(*[AxisSize(k.encode(), v) for k, v in sizes.items()])
  return W(call("rearrange", x.h, formula.encode(), arr, len(sizes)))
def masked_fill(x, m, v):
  if isinstance(v, Tensor): return W(call("masked_fill", x.h, m.h, v.h))
  return W(call("masked_fill_s", x.h, m.h, float(v)))
def masked_select(x, m): return W(call("masked_select", x.h, m.h))
def nonzero(x): return W(call("nonzero", x.h))
def scatter(x, dim, idx, src):
  if isinstance(src, Tensor): return W(call("scatter", x.h, dim, idx.h, src.h))
  return W(call("scatter_s", x.h, dim, idx.h, float(src)))
def scatter_reduce(x, dim, idx, src, reduce, include_self=True):
  return W(call("scatter_reduce", x.h, dim, idx.h, src.h, RED[reduce] if isinstance(reduce, str) else reduce, include_self))
def contiguous_backward(x): return W(call("contiguous_backward", x.h))


# ---- inputs, comparisons ----------------------------------------------------------------------------


VIEWS = ["contig", "permuted", "flipped", "shrunk", "padded"]


def weights(shape): return RNG.uniform(0.5, 1.5, size=shape).astype(np.float32)


def check_torch(f_tg, f_torch, arrays, grad_of=None, atol=1e-5, rtol=1e-4, views=None):
  """Forward f_tg(tensors) vs f_torch(torch tensors), then the gradients of sum(out * w) for the float
  inputs (grad_of: indices; default all float inputs). views: optional view kind per input."""
  if grad_of is None: grad_of = [i for i, a in enumerate(arrays) if np.issubdtype(a.dtype, np.floating)]
  views = views or ["contig"] * len(arrays)
  ts = [view_of(a, k) for a, k in zip(arrays, views)]
  for i in grad_of: set_rg(ts[i])
  out = f_tg(*ts)
  tt = [torch.tensor(a, requires_grad=(i in grad_of)) for i, a in enumerate(arrays)]
  ref = f_torch(*tt)
  if grad_of:
    w = weights(tuple(ref.shape))
    backward((out * Tensor(w)).sum())
    (ref * torch.tensor(w)).sum().backward()
  close(out.numpy(), ref, atol, rtol, "forward")
  for i in grad_of:
    close(grad(ts[i]).numpy(), tt[i].grad, atol, rtol, f"grad of input {i}")


# ---- test registry ------------------------------------------------------------------------------------
CASES = []


def case(name, fn, *args, **kw): CASES.append((name, fn, args, kw))


def np_index(idx):
  """Our index (Tensors allowed) -> the numpy equivalent (arrays)."""
  if not isinstance(idx, tuple): idx = (idx,)
  return tuple(e.numpy() if isinstance(e, Tensor) else e for e in idx)


def torch_index(idx):
  if not isinstance(idx, tuple): idx = (idx,)
  return tuple(torch.tensor(e.numpy().astype(np.int64)) if isinstance(e, Tensor) else e for e in idx)


# =====================================================================================================
# getitem: basic indexing against numpy (values and the np.add.at adjoint)
def _mk_idx(idx, shape):  # index entries given as ("t", values) become int32 tensors
  if not isinstance(idx, tuple): idx = (idx,)
  return tuple(Tensor(np.array(e[1], dtype=np.int32)) if isinstance(e, list) and e and e[0] == "t" else e for e in idx)


BASIC = [
    ((5,), (2,)), ((5,), (-1,)), ((5,), (-5,)), ((5,), (slice(1, 4),)), ((5,), (slice(None, None, 2),)),
    ((5,), (slice(None, None, -1),)), ((5,), (slice(None, None, -2),)), ((5,), (slice(3, 0, -2),)),
    ((5,), (slice(-2, None),)), ((5,), (slice(-100, 100),)), ((5,), (slice(4, 1),)), ((5,), (slice(1, 4, -1),)),
    ((5,), (slice(1, 3, 7),)), ((5,), (slice(None, None, 100),)), ((5,), (slice(None, None, -100),)),
    ((5,), (slice(-1, -6, -1),)), ((5,), (slice(2, 2),)), ((5,), (None,)), ((5,), (Ellipsis,)), ((5,), ()),
    ((3, 4), (1, 2)), ((3, 4), (-1, slice(None, None, -1))), ((3, 4), (slice(None), 0)),
    ((3, 4), (None, slice(1, None), None, slice(None, None, 3))), ((3, 4), (Ellipsis, 1)),
    ((3, 4), (1, Ellipsis)), ((3, 4), (Ellipsis, None)), ((3, 4), (None, Ellipsis, None)),
    ((2, 3, 4), (slice(None, None, -1), slice(None, None, 2), slice(None, None, -3))),
    ((2, 3, 4), (1, Ellipsis, slice(1, 3))), ((2, 3, 4), (Ellipsis, slice(None, None, -2), 0)),
    ((2, 3, 4), (slice(1, 2), slice(0, 0), slice(None))), ((2, 3, 4, 5), (0, slice(None), -1, slice(4, 0, -3))),
    ((6, 7), (slice(5, 0, -3), slice(1, 7, 4))), ((1, 1, 3), (0, 0, slice(None, None, -1))),
    ((0, 3), (slice(None), 1)), ((0, 3), (slice(None, None, -1), slice(None, None, 2))), ((4, 0), (2,)),
    ((), ()), ((), (None,)), ((), (Ellipsis, None)),
]
for shape, idx in BASIC:
  def _basic(shape=shape, idx=idx):
    a = rnd(*shape)
    x = set_rg(Tensor(a))
    r = getitem(x, idx)
    ref = a[idx]
    close(r.numpy(), ref, what="forward")
    w = weights(ref.shape)
    backward((getitem(x, idx) * Tensor(w)).sum())
    g = np.zeros_like(a)
    np.add.at(g, idx, w)
    close(grad(x).numpy(), g, what="grad")
  case(f"getitem basic {shape}{idx}", _basic)


def _basic_views():
  a = rnd(4, 5, 3)
  for kind in VIEWS:
    for idx in [(slice(None, None, -2), 1), (Ellipsis, slice(2, 0, -1)), (slice(1, 3), None, slice(None, None, 2), -1)]:
      close(getitem(view_of(a, kind), idx).numpy(), a[idx], what=f"{kind} {idx}")


case("getitem basic of non-contiguous views (permuted, flipped, shrunk, padded)", _basic_views)


def _basic_views_grad():
  a = rnd(4, 5)
  for kind in ["permuted", "flipped"]:
    x = set_rg(view_of(a, kind))
    w = weights((2, 5))
    backward((getitem(x, (slice(3, None, -2),)) * Tensor(w)).sum())
    g = np.zeros_like(a)
    g[3::-2] = w
    close(grad(x).numpy(), g, what=kind)


case("getitem backward through permuted / flipped leaves", _basic_views_grad)


def _basic_dtypes():
  for dt in [np.int8, np.int32, np.int64, np.uint8, np.float16, np.float64, np.bool_]:
    a = (RNG.uniform(0, 50, size=(4, 6)) > 25) if dt == np.bool_ else RNG.uniform(0, 50, size=(4, 6)).astype(dt)
    r = getitem(Tensor(a), (slice(None, None, -1), slice(1, None, 2)))
    assert r.dtype == tg.np_dtype_to_tg(a.dtype), r.dtype
    close(r.numpy(), a[::-1, 1::2], what=str(dt))


case("getitem keeps every dtype (ints, uints, bool, half, double)", _basic_dtypes)


def _basic_is_view():
  # basic indexing adds no kernel of its own: realizing x[::-2, 1] + 1 is one kernel on x's buffer
  a = rnd(6, 4)
  n = kernels(lambda: getitem(Tensor(a).realize(), (slice(None, None, -2), 1)) + 1)
  assert n == 1, n
  # and the result of a pure view realizes as one copy kernel
  n = kernels(lambda: getitem(Tensor(a).realize(), (slice(4, 0, -3), None, Ellipsis)))
  assert n <= 1, n


case("getitem basic indexing is a view (fuses: one kernel)", _basic_is_view)

# getitem: tensor (advanced) indexing against torch (forward and autograd)
ADV = [
    ((5,), (["t", [0, 2, 4, 2]],)), ((5,), (["t", [-1, -5, 3]],)), ((4, 3), (["t", [[0, 1], [3, 3]]],)),
    ((4, 3), (slice(None), ["t", [2, 0]])), ((4, 3), (["t", [1, 3]], ["t", [2, 0]])),
    ((4, 3), (["t", [[1], [3]]], ["t", [2, 0, 1]])), ((3, 4, 5), (slice(None), ["t", [0, 3]], ["t", [4, 1]])),
    ((3, 4, 5), (["t", [2, 0]], slice(None), ["t", [4, 1]])), ((3, 4, 5), (slice(None), ["t", [3, 1]], 0)),
    ((3, 4, 5, 6), (slice(None), ["t", [3, 1]], slice(None), 0)), ((3, 4, 5), (0, slice(None), ["t", [1, 4]])),
    ((3, 4, 5), (["t", [1, 2]], None, ["t", [0, 3]])), ((3, 4, 5), (slice(None), None, ["t", [0, 3]])),
    ((3, 4, 5), (Ellipsis, ["t", [4, -1, 0]])), ((3, 4, 5), (slice(1, None), ["t", [[0], [2]]], slice(None, None, 2))),
    ((3, 4, 5), (["t", 2],)), ((3, 4, 5), (["t", [0, 1]], ["t", [1, 2]], ["t", [2, 3]])),
    ((3, 4, 5), (["t", [0, 2]], 1, ["t", [4, 3]])), ((1, 4), (["t", [0, 0, 0]], slice(None))),
    ((3, 0), (["t", [1, 2]],)), ((3, 4), (["t", np.zeros((0,), np.int32)],)),
    ((3, 4), (["t", np.zeros((2, 0), np.int32)], ["t", [1]])),
]
for shape, idx in ADV:
  def _adv(shape=shape, idx=idx):
    a = rnd(*shape)
    ix = _mk_idx(idx, shape)
    check_torch(lambda x: getitem(x, ix), lambda x: x[torch_index(ix)], [a])
  case(f"getitem tensor index {shape} {idx}", _adv)


def _adv_views():
  a = rnd(4, 5, 3)
  ix = (Tensor(np.array([3, 0, -2], np.int32)), slice(None, None, -1), Tensor(np.array([2, 1, 0], np.int64)))
  for kind in VIEWS:
    close(getitem(view_of(a, kind), ix).numpy(), a[[3, 0, -2], ::-1, [2, 1, 0]], what=kind)


case("getitem tensor index of non-contiguous views, with a negative-step slice", _adv_views)


def _adv_index_views():
  # the index tensors themselves are views (flipped, expanded) and of small int dtypes
  a = rnd(6, 4)
  it = Tensor(np.array([1, 5, 2], np.int8)).flip(0)
  jt = Tensor(np.array([[3]], np.int16)).expand(2, 3)
  close(getitem(Tensor(a), (it,)).numpy(), a[[2, 5, 1]], what="flipped int8 index")
  close(getitem(Tensor(a), (it, jt)).numpy(), a[np.array([2, 5, 1]), np.full((2, 3), 3)], what="expanded int16 index")
  close(getitem(Tensor(a), (Tensor(np.array([5, 1], np.uint8)),)).numpy(), a[[5, 1]], what="uint8 index")


case("getitem with index tensors that are views and of small int dtypes", _adv_index_views)


def _adv_out_of_range():
  a = rnd(4, 3)
  r = getitem(Tensor(a), (Tensor(np.array([1, 4, -5, 7, -1], np.int32)),)).numpy()
  ref = np.stack([a[1], np.zeros(3), np.zeros(3), np.zeros(3), a[3]]).astype(np.float32)
  close(r, ref, what="rows")
  r = getitem(Tensor(a), (Tensor(np.array([0, 3, 1], np.int32)), Tensor(np.array([2, 0, 3], np.int32)))).numpy()
  close(r, np.array([a[0, 2], a[3, 0], 0], np.float32), what="pairs")  # (1, 3): the column is out of range
  r = getitem(Tensor(a), (slice(None), Tensor(np.array([-4, 2], np.int32)))).numpy()
  close(r, np.stack([np.zeros(4), a[:, 2]], 1).astype(np.float32), what="column")


case("getitem tensor index out of range reads 0 (tinygrad), negative wraps once", _adv_out_of_range)


def _adv_empty_dim():
  # indexing an empty dim: every index is out of range, so the result is zeros (torch raises)
  x = set_rg(Tensor(np.zeros((0, 3), np.float32)))
  r = getitem(x, (Tensor(np.array([1, -2], np.int32)),))
  close(r.numpy(), np.zeros((2, 3), np.float32), what="zeros")
  backward((getitem(x, (Tensor(np.array([1, -2], np.int32)),)) * 2).sum())
  assert grad(x).numpy().shape == (0, 3)
  # tinygrad's docstring example: Tensor([1, 2, 3])[Tensor([4, 3, 2])] -> [0, 0, 3]
  close(getitem(Tensor(np.array([1, 2, 3], np.int32)), (Tensor(np.array([4, 3, 2], np.int32)),)).numpy(), [0, 0, 3])


case("getitem tensor index into an empty dim gives zeros (and an empty gradient)", _adv_empty_dim)


def _adv_dup_grad():
  a = rnd(5, 3)
  idx = np.array([[0, 4, 0], [4, 4, 2]], np.int32)
  x = set_rg(Tensor(a))
  w = weights((2, 3, 3))
  backward((getitem(x, (Tensor(idx),)) * Tensor(w)).sum())
  g = np.zeros_like(a)
  np.add.at(g, idx, w)
  close(grad(x).numpy(), g, what="grad with repeated rows")
  y = set_rg(Tensor(a))
  i1, i2 = np.array([0, 0, 3, 9], np.int32), np.array([1, 1, 2, 0], np.int32)
  w2 = weights((4,))
  backward((getitem(y, (Tensor(i1), Tensor(i2))) * Tensor(w2)).sum())
  g2 = np.zeros_like(a)
  np.add.at(g2, (i1[:3], i2[:3]), w2[:3])  # the out-of-range (9, 0) gets nothing
  close(grad(y).numpy(), g2, what="grad with pairs")


case("getitem tensor index backward accumulates repeated indices, ignores out-of-range", _adv_dup_grad)


def _adv_kernels():
  # two index tensors are one gather (no one-hot reductions): at most the gather's kernel (the
  # scheduler gives data-dependent loads their own) and the elementwise op after it
  a = rnd(6, 5, 4)
  i1, i2 = np.array([1, 2, 5], np.int32), np.array([0, 4, 4], np.int32)
  n = kernels(lambda: getitem(Tensor(a).realize(), (Tensor(i1).realize(), slice(None, None, -1), Tensor(i2).realize())) * 2)
  assert n <= 2, n
  n1 = kernels(lambda: W(call("index", Tensor(a).realize().h, Tensor(i1).realize().h)) * 2)
  assert n == n1, (n, n1)


case("getitem two index tensors: one gather, as many kernels as a plain tg_index", _adv_kernels)

# getitem errors
ERRS = [
    ("index 3 is out of range for dim 1 of size 3", (2, 3), (0, 3)), ("index -4", (2, 3), (slice(None), -4)),
    ("too many indices", (2, 3), (0, 0, 0)), ("only one ellipsis", (2, 3), (Ellipsis, Ellipsis)),
    ("out of range for dim 0 of size 0", (0,), (0,)), ("too many indices (1) for a 0-d", (), (0,)),
]
for substr, shape, idx in ERRS:
  def _err(substr=substr, shape=shape, idx=idx):
    expect_error("tg_getitem", lambda: getitem(Tensor(rnd(*shape)), idx), substr)
  case(f"getitem error: {substr}", _err)


def _err_tensor_dtypes():
  x = Tensor(rnd(3, 3))
  expect_error("tg_getitem", lambda: getitem(x, (Tensor(np.array([0.0, 1.0], np.float32)),)), "integer tensor")
  expect_error("tg_getitem", lambda: getitem(x, (Tensor(np.array([True, False, True])),)), "tg_masked_select")
  expect_error("tg_getitem", lambda: getitem(x, (Tensor(np.array([0, 1], np.int32)), Tensor(np.array([0, 1, 2], np.int32)))),
               "cannot broadcast")
  bad = (Spec * 1)(Spec(kind=9))
  expect_error("tg_getitem", lambda: W(call("getitem", x.h, bad, 1)), "unknown kind")
  expect_error("tg_getitem", lambda: W(call("getitem", x.h, None, 2)), "NULL")


case("getitem error: float / bool / non-broadcasting index tensors, bad kind, NULL spec", _err_tensor_dtypes)


def _err_stale():
  lib.tg_scope_begin()
  t = Tensor(np.array([0], np.int32))
  lib.tg_scope_end()
  expect_error("tg_getitem", lambda: getitem(Tensor(rnd(3)), (t,)), "stale")
  x = Tensor(rnd(3))
  lib.tg_clear_error()
  assert lib.tg_getitem(_T(0), *spec_of((0,))).id == 0  # none in, none out
  lib.tg_clear_error()
  assert getitem(x, (1,)).numpy().shape == ()


case("getitem error: stale index tensor handle, none input", _err_stale)

# =====================================================================================================
# setitem


def _set_np(a, idx, v):
  b = a.copy()
  b[np_index(idx)] = v
  return b


SETS = [
    ((5,), (2,), 7.0), ((5,), (slice(1, 4),), [1.0, 2.0, 3.0]), ((5,), (slice(None, None, 2),), -1.0),
    ((5,), (slice(None, None, -1),), [1.0, 2.0, 3.0, 4.0, 5.0]), ((6,), (slice(4, 0, -3),), [8.0, 9.0]),
    ((6,), (slice(1, 3, 7),), 5.0), ((3, 4), (1,), [1.0, 2.0, 3.0, 4.0]), ((3, 4), (slice(None), -1), 0.5),
    ((3, 4), (slice(None, None, -2), slice(1, None, 2)), [[1.0, 2.0], [3.0, 4.0]]),
    ((3, 4), (Ellipsis, None, slice(None, None, 3)), [[[9.0]], [[8.0]], [[7.0]]]), ((2, 3, 4), (None, 1, Ellipsis), 3.0),
    ((2, 3, 4), (slice(None), slice(None, None, -1), slice(3, 0, -2)), [1.0, 2.0]), ((2, 3), (), 4.0),
    ((2, 3), (slice(0, 0),), 1.0), ((), (), 2.5), ((0, 3), (slice(None), 1), 1.0),
]
for shape, idx, v in SETS:
  def _set(shape=shape, idx=idx, v=v):
    a = rnd(*shape)
    x = Tensor(a).realize()
    setitem(x, idx, Tensor(np.array(v, np.float32)) if isinstance(v, list) else v)
    close(x.numpy(), _set_np(a, idx, np.array(v, np.float32)), what="after setitem")
  case(f"setitem basic {shape}{idx} = {v}", _set)


def _set_handles():
  # the target's handle sees the write lazily; a value read before keeps the old contents
  a = rnd(4, 3)
  x = Tensor(a).realize()
  old = x + 0
  setitem(x, (slice(1, 3),), Tensor(np.ones((1, 3), np.float32)))
  assert not x.is_realized()
  close(old.numpy(), a, what="value built before the setitem, read before x")
  b = a.copy()
  b[1:3] = 1
  close(x.numpy(), b, what="x")
  setitem(x, (0, slice(None, None, -1)), Tensor(np.array([5.0, 6.0, 7.0], np.float32)))
  b[0] = [7, 6, 5]
  close(x.numpy(), b, what="second setitem")


case("setitem updates x lazily; earlier results keep the old values; chains", _set_handles)


def _set_cast_and_dtypes():
  a = np.arange(12, dtype=np.int32).reshape(3, 4)
  x = Tensor(a).realize()
  setitem(x, (slice(None), 1), 2.7)  # float into int truncates, as torch
  setitem(x, (2,), Tensor(np.array([1.9, -1.9, 3.0, 4.0], np.float64)))
  b = a.copy()
  b[:, 1] = 2
  b[2] = [1, -1, 3, 4]
  close(x.numpy(), b, what="int32")
  assert x.dtype == tg.INT32
  m = Tensor(np.zeros((2, 3), np.bool_)).realize()
  setitem(m, (slice(None), slice(None, None, 2)), 1.0)
  close(m.numpy(), np.array([[1, 0, 1], [1, 0, 1]], np.bool_), what="bool")
  h = Tensor(np.zeros(4, np.float16)).realize()
  setitem(h, (slice(1, None),), Tensor(np.array([0.1, 0.2, 0.3], np.float32)))
  close(h.numpy(), np.array([0, 0.1, 0.2, 0.3], np.float16), what="half")


case("setitem casts the value to x's dtype (int, bool, half)", _set_cast_and_dtypes)


def _set_alias():
  a = rnd(6)
  x = Tensor(a).realize()
  setitem(x, (slice(1, None),), getitem(x, (slice(None, -1),)))  # x[1:] = x[:-1]
  b = a.copy()
  b[1:] = a[:-1].copy()
  close(x.numpy(), b, what="shift right")
  y = Tensor(a).realize()
  setitem(y, (slice(None),), getitem(y, (slice(None, None, -1),)))  # y[:] = y[::-1]
  close(y.numpy(), a[::-1], what="reverse in place")


case("setitem with a value read from x itself (x[1:] = x[:-1], x[:] = x[::-1])", _set_alias)


def _set_lazy_target():
  a = rnd(3, 3)
  x = Tensor(a) * 2  # lazy
  setitem(x, (1, 1), 0.0)
  b = a * 2
  b[1, 1] = 0
  close(x.numpy(), b, what="lazy target")


case("setitem on a lazy target", _set_lazy_target)


def _set_through_views():
  # the write lands in the storage the view reads, as torch (and tinygrad for realized tensors) do
  # (numpy's views are the reference: torch's flip copies)
  for name, view, idx, v in [("x.T[1, 0] = 5", lambda t: t.T, (1, 0), 5.0),
                             ("x[::-1][0] = 5", lambda t: t[::-1], (0,), 5.0),
                             ("x[1][2] = 5", lambda t: t[1], (2,), 5.0),
                             ("x.reshape(-1)[3:5] = [8, 9]", lambda t: t.reshape(-1), (slice(3, 5),), [8.0, 9.0])]:
    a = rnd(3, 4)
    x = Tensor(a).realize()
    if name.startswith("x[1]"): xv = getitem(x, (1,))
    elif name.startswith("x[::-1]"): xv = getitem(x, (slice(None, None, -1),))
    elif name.startswith("x.T"): xv = x.permute(1, 0)
    else: xv = x.reshape(12)
    setitem(xv, idx, Tensor(np.array(v, np.float32)) if isinstance(v, list) else v)
    ta = a.copy()
    view(ta)[idx] = np.array(v, np.float32)
    close(x.numpy(), ta, what=name)
    close(xv.numpy(), view(ta), what=name + " (the view)")
  # x[:3] *= 10 on a realized tensor
  a = rnd(5)
  x = Tensor(a).realize()
  v = getitem(x, (slice(None, 3),))
  setitem(v, (slice(None),), v * 10.0)
  ta = torch.tensor(a)
  ta[:3] *= 10
  close(x.numpy(), ta.numpy(), what="x[:3] *= 10")


case("setitem through a view writes the tensor it views (x.T[1,0], x[::-1][0], x[1][2], x[:3] *= 10)", _set_through_views)


def _set_grad():
  # y = x * 2 (no storage yet); y[1:3] = v * 2 -> gradients to v and to the untouched part of x
  a, b, w = rnd(4), rnd(2), rnd(4)
  x, v = Tensor(a), Tensor(b)
  y = x * 2.0
  setitem(y, (slice(1, 3),), v * 2.0)
  gx, gv = tg_gradient((y * Tensor(w)).sum(), [x, v])
  tx, tv = torch.tensor(a, requires_grad=True), torch.tensor(b, requires_grad=True)
  ty = tx * 2
  ty[1:3] = tv * 2
  (ty * torch.tensor(w)).sum().backward()
  close(gx.numpy(), tx.grad.numpy(), what="d/dx"), close(gv.numpy(), tv.grad.numpy(), what="d/dv")
  close(y.numpy(), ty.detach().numpy(), what="value")


def tg_gradient(loss, targets):
  arr, out = (_T * len(targets))(*[t.h for t in targets]), (_T * len(targets))()
  lib.tg_gradient.restype, lib.tg_gradient.argtypes = ctypes.c_int, [_T, ctypes.POINTER(_T), ctypes.c_int, ctypes.POINTER(_T)]
  _status("tg_gradient", lib.tg_gradient(loss.h, arr, len(targets), out))
  return [W(out[i]) for i in range(len(targets))]


case("setitem is differentiable (value and untouched part of the target), as torch", _set_grad)


def _set_kernels():
  # a basic setitem is one kernel: the masked where fused into the assign
  x = Tensor(rnd(8, 8)).realize()
  v = Tensor(rnd(3, 8)).realize()
  setitem(x, (slice(1, 7, 2),), v)
  tg.counters_reset()
  x.realize()
  assert tg.counters().kernel_count == 1, tg.counters().kernel_count


case("setitem basic is one kernel", _set_kernels)

ADV_SETS = [
    ((5,), (["t", [0, 3]],), [1.0, 2.0]), ((5,), (["t", [-1, 1]],), 9.0), ((4, 3), (["t", [2, 0]],), [[1.0, 2.0, 3.0]]),
    ((4, 3), (slice(None), ["t", [2, 0]]), [7.0, 8.0]), ((4, 3), (["t", [1, 3]], ["t", [2, 0]]), [5.0, 6.0]),
    ((3, 4, 5), (["t", [2, 0]], slice(1, None, 2), ["t", [4, 1]]), [[1.0, 2.0], [3.0, 4.0]]),
    ((3, 4, 5), (slice(None, None, -1), ["t", [[0], [3]]], 2), 1.5), ((3, 4, 5), (Ellipsis, ["t", [1, 3]]), -2.0),
    ((3, 4), (["t", 1], slice(None, None, -2)), [1.0, 2.0]),
]
for shape, idx, v in ADV_SETS:
  def _aset(shape=shape, idx=idx, v=v):
    a = rnd(*shape)
    ix = _mk_idx(idx, shape)
    x = Tensor(a).realize()
    setitem(x, ix, Tensor(np.array(v, np.float32)) if isinstance(v, list) else v)
    ref = a.copy()  # numpy places the broadcast dims as torch / tinygrad do for these indices; no duplicates
    ref[np_index(ix)] = np.array(v, np.float32)
    close(x.numpy(), ref, what="after advanced setitem")
  case(f"setitem tensor index {shape} {idx} = {v}", _aset)


def _aset_dups_oob():
  a = rnd(5)
  x = Tensor(a).realize()
  setitem(x, (Tensor(np.array([1, 3, 1, 9, -9], np.int32)),), Tensor(np.array([10.0, 20.0, 30.0, 40.0, 50.0], np.float32)))
  b = a.copy()
  b[3], b[1] = 20, 30  # the last write to position 1 wins; 9 and -9 are out of range: nothing written
  close(x.numpy(), b, what="duplicates and out of range")
  y = Tensor(np.zeros((3, 3), np.float32)).realize()
  setitem(y, (Tensor(np.array([0, 0, 2], np.int32)), Tensor(np.array([1, 1, 2], np.int32))), Tensor(np.array([1.0, 2.0, 3.0], np.float32)))
  close(y.numpy(), np.array([[0, 2, 0], [0, 0, 0], [0, 0, 3]], np.float32), what="2-d duplicates")


case("setitem tensor index: the last duplicate wins, out-of-range writes nothing", _aset_dups_oob)


def _set_errors():
  x = Tensor(rnd(3, 4)).realize()
  expect_error("tg_setitem", lambda: setitem(x, (slice(None), 1), Tensor(rnd(4))), "cannot broadcast")
  expect_error("tg_setitem", lambda: setitem(x, (5,), Tensor(rnd(4))), "index 5 is out of range for dim 0")
  expect_error("tg_setitem_s", lambda: setitem(x, (0, 0, 0), 1.0), "too many indices")
  v = x.expand(2, 3, 4)  # a broadcast view: its elements share storage
  expect_error("tg_setitem", lambda: setitem(v, (0,), Tensor(rnd(3, 4))), "expanded")
  close(x.shape, (3, 4))


case("setitem errors: value shape, index range, too many indices, a broadcast view target", _set_errors)

# =====================================================================================================
# pad modes against numpy (forward, any rank) and torch (backward)
NP_MODE = {PAD_REFLECT: "reflect", PAD_REPLICATE: "edge", PAD_CIRCULAR: "wrap"}
MODE_NAME = {PAD_REFLECT: "reflect", PAD_REPLICATE: "replicate", PAD_CIRCULAR: "circular"}


def np_pad(a, pads, mode):
  """Reference with negative pads as tinygrad: reflect/replicate pad first then crop; circular crops first."""
  nd = a.ndim
  p = [(0, 0)] * (nd - len(pads) // 2) + [(pads[2 * i], pads[2 * i + 1]) for i in range(len(pads) // 2)]
  crop = [slice(-b if b < 0 else 0, e if e < 0 else None) for b, e in p]
  pos = [(max(b, 0), max(e, 0)) for b, e in p]
  if mode == PAD_CIRCULAR: return np.pad(a[tuple(crop)], pos, mode="wrap")
  return np.pad(a, pos, mode=NP_MODE[mode])[tuple(crop)]


PADS = [
    ((5,), [2, 3]), ((5,), [4, 4]), ((3, 4), [1, 2, 3, 0]), ((3, 4), [0, 0, 2, 2]), ((2, 3, 4), [1, 1]),
    ((2, 3, 4), [1, 0, 2, 1, 0, 3]), ((1, 5), [0, 0, 1, 1]), ((4,), [-1, 2]), ((4, 5), [2, -1, -2, 1]),
    ((3, 3), [0, 0, 0, 0]), ((1, 1, 4, 5), [1, 2, 3, 1]),
]
for shape, pads in PADS:
  for mode in [PAD_REFLECT, PAD_REPLICATE, PAD_CIRCULAR]:
    if mode == PAD_REFLECT and any(p >= s for i, s in enumerate(shape[len(shape) - len(pads) // 2:])
                                    for p in pads[2 * i:2 * i + 2]): continue
    if mode == PAD_CIRCULAR and any(p > s for i, s in enumerate(shape[len(shape) - len(pads) // 2:])
                                     for p in pads[2 * i:2 * i + 2]): continue
    def _pad(shape=shape, pads=pads, mode=mode):
      a = rnd(*shape)
      for kind in ["contig", "permuted"]:
        close(pad_mode(view_of(a, kind), pads, mode).numpy(), np_pad(a, pads, mode), what=kind)
    case(f"pad {MODE_NAME[mode]} {shape} {pads}", _pad)

TORCH_PADS = [((2, 3, 5), [2, 1]), ((2, 2, 4, 5), [1, 2, 3, 1]), ((1, 2, 3, 4), [0, 3, 1, 0]), ((1, 1, 5), [4, 0])]
for shape, pads in TORCH_PADS:
  for mode in [PAD_REFLECT, PAD_REPLICATE, PAD_CIRCULAR]:
    if mode == PAD_REFLECT and max(pads) >= min(shape[-len(pads) // 2:]): continue
    if mode == PAD_CIRCULAR and len(shape) == 3 and pads == [4, 0]: continue
    def _tpad(shape=shape, pads=pads, mode=mode):
      torch_pads = []
      for i in range(len(pads) // 2 - 1, -1, -1): torch_pads += pads[2 * i:2 * i + 2]  # last dim first
      check_torch(lambda x: pad_mode(x, pads, mode), lambda x: F.pad(x, torch_pads, mode=MODE_NAME[mode]), [rnd(*shape)])
    case(f"pad {MODE_NAME[mode]} vs torch F.pad with backward {shape} {pads}", _tpad)


def _pad_constant():
  a = rnd(2, 3)
  close(pad_mode(Tensor(a), [1, 2], PAD_CONSTANT, 7.5).numpy(), np.pad(a, [(0, 0), (1, 2)], constant_values=7.5))
  close(pad_mode(Tensor(a), [1, 0, -1, 1], PAD_CONSTANT).numpy(), np.pad(a, [(1, 0), (0, 1)])[:, 1:])


case("pad constant (tg_pad through tg_pad_mode, negative pads crop)", _pad_constant)


def _pad_dtypes():
  a = np.arange(6, dtype=np.int32).reshape(2, 3)
  for mode in [PAD_REFLECT, PAD_REPLICATE, PAD_CIRCULAR]:
    r = pad_mode(Tensor(a), [2, 1], mode)
    assert r.dtype == tg.INT32
    close(r.numpy(), np_pad(a, [2, 1], mode), what=MODE_NAME[mode])
  b = np.array([True, False, False])
  close(pad_mode(Tensor(b), [1, 2], PAD_REFLECT).numpy(), np.pad(b, (1, 2), mode="reflect"), what="bool reflect")


case("pad modes keep int and bool dtypes", _pad_dtypes)


def _pad_errors():
  x = Tensor(rnd(2, 3))
  expect_error("tg_pad_mode", lambda: pad_mode(x, [3, 0], PAD_REFLECT), "less than")
  expect_error("tg_pad_mode", lambda: pad_mode(x, [0, 4], PAD_CIRCULAR), "wrap around")
  expect_error("tg_pad_mode", lambda: pad_mode(x, [1, 1, 1], PAD_REFLECT), "pairs")
  expect_error("tg_pad_mode", lambda: pad_mode(x, [1, 1] * 3, PAD_REFLECT), "pairs")
  expect_error("tg_pad_mode", lambda: pad_mode(x, [1, 1], 7), "unknown mode")
  expect_error("tg_pad_mode", lambda: pad_mode(x, [1, 1], PAD_REPLICATE, 2.0), "TG_PAD_CONSTANT")
  expect_error("tg_pad_mode", lambda: pad_mode(Tensor(rnd(2, 0)), [1, 0], PAD_REPLICATE), "empty")


case("pad mode errors: reflect too wide, circular wraps twice, odd / too many pads, bad mode, value, empty dim", _pad_errors)

# =====================================================================================================
# movement ops against torch
for shape, r, dim in [((3,), 2, 0), ((2, 3), 3, 1), ((2, 3), 2, -2), ((2, 3), 2, None), ((2, 0, 3), 2, 1), ((4,), 0, 0),
                      ((1, 2), 1, 0), ((), 3, None)]:
  def _ri(shape=shape, r=r, dim=dim):
    check_torch(lambda x: repeat_interleave(x, r, dim), lambda x: torch.repeat_interleave(x, r, dim), [rnd(*shape)])
  case(f"repeat_interleave {shape} x{r} dim={dim}", _ri)


def _ri_view_err():
  a = rnd(3, 2)
  close(repeat_interleave(view_of(a, "permuted"), 2, 0).numpy(), np.repeat(a, 2, 0))
  expect_error("tg_repeat_interleave", lambda: repeat_interleave(Tensor(a), -1, 0), "non-negative")
  expect_error("tg_repeat_interleave", lambda: repeat_interleave(Tensor(a), 2, 2), "out of range")


case("repeat_interleave of a permuted view; errors", _ri_view_err)

for shape, dim, size, step in [((8,), 0, 2, 2), ((8,), 0, 3, 1), ((7,), 0, 3, 2), ((3, 3, 3), -1, 2, 3), ((4, 6), 1, 6, 1),
                               ((4, 6), 0, 2, 5), ((2, 9, 3), 1, 4, 3), ((5,), 0, 0, 1), ((5,), 0, 1, 10), ((0, 3), 1, 2, 1),
                               ((3,), 0, 3, 1)]:
  def _unf(shape=shape, dim=dim, size=size, step=step):
    check_torch(lambda x: unfold(x, dim, size, step), lambda x: x.unfold(dim, size, step), [rnd(*shape)])
  case(f"unfold {shape} dim={dim} size={size} step={step}", _unf)


def _unfold_views_err():
  a = rnd(5, 7)
  for kind in VIEWS:
    close(unfold(view_of(a, kind), 1, 3, 2).numpy(), torch.tensor(a).unfold(1, 3, 2), what=kind)
  expect_error("tg_unfold", lambda: unfold(Tensor(a), 1, 8, 1), "larger than dim 1")
  expect_error("tg_unfold", lambda: unfold(Tensor(a), 1, 2, 0), "step")
  expect_error("tg_unfold", lambda: unfold(Tensor(a), 1, -1, 1), "non-negative")
  expect_error("tg_unfold", lambda: unfold(Tensor(a), 2, 1, 1), "out of range")


case("unfold of non-contiguous views; errors", _unfold_views_err)

for shape, dim, sizes in [((6,), 0, (2, 3)), ((2, 12, 3), 1, (3, -1, 2)), ((4, 6), -1, (6,)), ((4, 6), 0, (1, 4, 1)),
                          ((0, 6), 1, (2, 3)), ((3, 0), 1, (0, 5))]:
  def _unfl(shape=shape, dim=dim, sizes=sizes):
    check_torch(lambda x: unflatten(x, dim, sizes), lambda x: x.unflatten(dim, sizes), [rnd(*shape)])
  case(f"unflatten {shape} dim={dim} {sizes}", _unfl)


def _unflatten_err():
  x = Tensor(rnd(4, 6))
  expect_error("tg_unflatten", lambda: unflatten(x, 1, (4, 2)), "multiply")
  expect_error("tg_unflatten", lambda: unflatten(x, 1, (-1, -1)), "only one")
  expect_error("tg_unflatten", lambda: unflatten(x, 1, (5, -1)), "multiply")
  expect_error("tg_unflatten", lambda: unflatten(Tensor(np.float32(1)), 0, (1,)), "0-d")


case("unflatten errors", _unflatten_err)

for n in [1, 3, 5, 0]:
  case(f"diag ({n},)", lambda n=n: check_torch(diag, torch.diag, [rnd(n)]))


def _diag_err():
  expect_error("tg_diag", lambda: diag(Tensor(rnd(2, 2))), "1-d")
  close(diag(Tensor(np.array([1, 2, 3], np.int32))).numpy(), np.diag([1, 2, 3]), what="int")


case("diag of ints; error on 2-d", _diag_err)

for shape, off, d1, d2 in [((3, 3), 0, 0, 1), ((3, 4), 1, 0, 1), ((4, 3), -2, 0, 1), ((3, 4), 5, 0, 1), ((3, 4), -3, 0, 1),
                           ((2, 3, 4), 0, 1, 2), ((2, 3, 4), 1, 0, 2), ((2, 3, 4), -1, 2, 0), ((2, 3, 4, 5), 2, -1, 1),
                           ((0, 3), 0, 0, 1), ((1, 1), 0, 1, 0)]:
  def _dg(shape=shape, off=off, d1=d1, d2=d2):
    check_torch(lambda x: diagonal(x, off, d1, d2), lambda x: torch.diagonal(x, off, d1, d2), [rnd(*shape)])
  case(f"diagonal {shape} offset={off} dims=({d1},{d2})", _dg)


def _diagonal_views_err():
  a = rnd(4, 5, 3)
  for kind in VIEWS:
    close(diagonal(view_of(a, kind), -1, 0, 1).numpy(), torch.diagonal(torch.tensor(a), -1, 0, 1), what=kind)
  expect_error("tg_diagonal", lambda: diagonal(Tensor(a), 0, 1, -2), "must differ")
  expect_error("tg_diagonal", lambda: diagonal(Tensor(rnd(3)), 0, 0, 1), "at least 2")


case("diagonal of non-contiguous views; errors", _diagonal_views_err)

for shape, shifts, dims in [((5,), 2, 0), ((5,), -7, 0), ((3, 4), 1, None), ((3, 4), (1, -2), (0, 1)), ((3, 4), (5,), (1,)),
                            ((2, 3, 4), (1, 1), (2, 2)), ((2, 0), 3, 1), ((3, 4), 13, None), ((1,), 4, 0), ((2, 3), 0, -1)]:
  def _roll(shape=shape, shifts=shifts, dims=dims):
    check_torch(lambda x: roll(x, shifts, dims), lambda x: torch.roll(x, shifts, dims), [rnd(*shape)])
  case(f"roll {shape} shifts={shifts} dims={dims}", _roll)


def _roll_views_err():
  a = rnd(4, 5)
  for kind in VIEWS:
    close(roll(view_of(a, kind), (2, -1), (0, 1)).numpy(), np.roll(a, (2, -1), (0, 1)), what=kind)
  expect_error("tg_roll", lambda: roll(Tensor(a), (1, 2), (0,)), "one shift per dim")
  expect_error("tg_roll", lambda: roll(Tensor(a), (1, 2)), "exactly one shift")
  expect_error("tg_roll", lambda: roll(Tensor(a), 1, 3), "out of range")


case("roll of non-contiguous views; errors", _roll_views_err)

# rearrange against numpy-written references
REARR = [
    ((2, 3, 4, 5), "b c h w -> b (h w) c", {}, lambda a: a.transpose(0, 2, 3, 1).reshape(2, 20, 3)),
    ((2, 6), "b (h p) -> b h p", {"p": 2}, lambda a: a.reshape(2, 3, 2)),
    ((2, 6), "b (h p) -> (p b) h", {"h": 3}, lambda a: a.reshape(2, 3, 2).transpose(2, 0, 1).reshape(4, 3)),
    ((2, 3), "batch channel -> (batch channel)", {}, lambda a: a.reshape(6)),
    ((2, 3, 4), "... c -> c ...", {}, lambda a: a.transpose(2, 0, 1)),
    ((2, 3, 4), "a ... -> (...) a", {}, lambda a: a.transpose(1, 2, 0).reshape(12, 2)),
    ((3, 4), "h w -> 1 h w 1", {}, lambda a: a.reshape(1, 3, 4, 1)),
    ((1, 3, 1), "1 h 1 -> h", {}, lambda a: a.reshape(3)),
    ((3, 4), "h w -> w h", {}, lambda a: a.T),
    ((2, 3, 4), "a b c -> a b c", {}, lambda a: a),
    ((6,), "... (a b) -> ... b a", {"a": 2}, lambda a: a.reshape(2, 3).T),
    ((2, 12), "x (a b c) -> (c x) b a", {"a": 2, "c": 3}, lambda a: a.reshape(2, 2, 2, 3).transpose(3, 0, 2, 1).reshape(6, 2, 2)),
    ((2, 3, 4), "a b c -> (a b c) ()", {}, lambda a: a.reshape(24, 1)),
    ((0, 3), "a b -> b a", {}, lambda a: a.T),
    ((2, 3, 4), "a \u2026 -> \u2026 a", {}, lambda a: a.transpose(1, 2, 0)),
]
for shape, formula, sizes, ref in REARR:
  def _ra(shape=shape, formula=formula, sizes=sizes, ref=ref):
    a = rnd(*shape)
    x = set_rg(Tensor(a))
    r = rearrange(x, formula, **sizes)
    close(r.numpy(), ref(a), what="forward")
    w = weights(ref(a).shape)
    backward((rearrange(x, formula, **sizes) * Tensor(w)).sum())
    # the adjoint of a permutation of elements: scatter w back through the same map
    pos = ref(np.arange(a.size, dtype=np.int64).reshape(a.shape))
    g = np.zeros(a.size, np.float32)
    g[pos.reshape(-1)] = w.reshape(-1)
    close(grad(x).numpy(), g.reshape(a.shape), what="grad")
  case(f"rearrange {shape} '{formula}' {sizes}", _ra)


def _rearrange_view():
  a = rnd(3, 4, 5)
  for kind in VIEWS:
    close(rearrange(view_of(a, kind), "a b c -> c (a b)").numpy(), a.transpose(2, 0, 1).reshape(5, 12), what=kind)


case("rearrange of non-contiguous views", _rearrange_view)

RA_ERRS = [
    ("a b -> a", (2, 3), {}, "not on the right"), ("a b -> a b c", (2, 3), {}, "not on the left"),
    ("a a -> a a", (2, 3), {}, "appears twice"), ("a b c -> a b c", (2, 3), {}, "describes 3 dims"),
    ("(a b) -> a b", (6,), {}, "cannot infer both"), ("(a b) -> a b", (6,), {"a": 4}, "cannot split"),
    ("a b", (2, 3), {}, "exactly one"), ("a -> b -> a", (2,), {}, "exactly one"), ("(a -> a", (2,), {}, "parentheses"),
    ("((a)) -> a", (2,), {}, "parentheses"), ("a b -> a b", (2, 3), {"z": 2}, "not on the left"),
    ("a b -> a b", (2, 3), {"a": 5}, "was given size 5"), ("_a b -> b _a", (2, 3), {}, "invalid axis name"),
    ("a 2 -> a", (2, 2), {}, "invalid axis name"), ("(a ...) -> a ...", (2, 3), {}, "ellipsis"),
    ("a 1 -> a", (2, 3), {}, "needs size 1"),
]
for formula, shape, sizes, substr in RA_ERRS:
  def _rae(formula=formula, shape=shape, sizes=sizes, substr=substr):
    expect_error("tg_rearrange", lambda: rearrange(Tensor(rnd(*shape)), formula, **sizes), substr)
  case(f"rearrange error '{formula}': {substr}", _rae)

# =====================================================================================================
# masks
for xs, ms in [((3, 4), (3, 4)), ((3, 4), (4,)), ((3, 4), (3, 1)), ((2, 0), (2, 1)), ((), ())]:
  def _mf(xs=xs, ms=ms):
    a, m = rnd(*xs), RNG.uniform(size=ms) > 0.5
    check_torch(lambda x: masked_fill(x, Tensor(m), -3.5), lambda x: x.masked_fill(torch.tensor(m), -3.5), [a])
    v = np.float32(2.25)
    check_torch(lambda x, v: masked_fill(x, Tensor(m), v), lambda x, v: x.masked_fill(torch.tensor(m), v), [a, np.array(v)])
  case(f"masked_fill {xs} mask {ms} (scalar and 0-d tensor value)", _mf)


def _mf_extra():
  a = np.arange(6, dtype=np.int32).reshape(2, 3)
  m = np.array([True, False, True])
  r = masked_fill(Tensor(a), Tensor(m), 7)
  assert r.dtype == tg.INT32
  close(r.numpy(), np.where(m, 7, a))
  close(masked_fill(view_of(rnd(3, 4), "permuted"), Tensor(np.eye(3, 4, dtype=bool)), 0.0).numpy().diagonal(), np.zeros(3))
  expect_error("tg_masked_fill_s", lambda: masked_fill(Tensor(a), Tensor(np.ones(3, np.int32)), 1.0), "bool")
  expect_error("tg_masked_fill_s", lambda: masked_fill(Tensor(a), Tensor(np.ones(4, bool)), 1.0), "cannot broadcast")
  expect_error("tg_masked_fill", lambda: masked_fill(Tensor(a), Tensor(m), Tensor(rnd(5))), "cannot broadcast")


case("masked_fill keeps int dtype, works on views; errors", _mf_extra)

for xs, ms, p in [((3, 4), (3, 4), 0.5), ((3, 4), (4,), 0.5), ((5,), (5,), 0.0), ((5,), (5,), 1.0), ((2, 0, 3), (2, 0, 3), 0.5),
                  ((2, 3), (2, 1), 0.5), ((), (), 1.0)]:
  def _ms(xs=xs, ms=ms, p=p):
    a, m = rnd(*xs), RNG.uniform(size=ms) < p
    check_torch(lambda x: masked_select(x, Tensor(m)), lambda x: torch.masked_select(x, torch.tensor(m)), [a],
                grad_of=[0] if np.broadcast_to(m, xs).any() else [])
  case(f"masked_select {xs} mask {ms} p={p}", _ms)


def _ms_extra():
  a = rnd(4, 3)
  m = a > 0
  for kind in VIEWS:
    close(masked_select(view_of(a, kind), view_of(m, kind)).numpy(), a[m], what=kind)
  mk = Tensor(a).gt(0.5)  # a lazy mask realizes inside
  close(masked_select(Tensor(a), mk).numpy(), a[a > 0.5], what="lazy mask")
  b = np.arange(6, dtype=np.int64)
  close(masked_select(Tensor(b), Tensor(b % 2 == 0)).numpy(), b[b % 2 == 0], what="int64")
  expect_error("tg_masked_select", lambda: masked_select(Tensor(a), Tensor(np.ones((4, 3), np.float32))), "bool")
  expect_error("tg_masked_select", lambda: masked_select(Tensor(rnd(3)), Tensor(np.ones((2, 3), bool))), "cannot broadcast")


case("masked_select of views, lazy masks, int64; errors", _ms_extra)

for shape, density in [((5,), 0.5), ((3, 4), 0.4), ((2, 3, 4), 0.3), ((4,), 0.0), ((0, 3), 0.5), ((), 1.0), ((), 0.0)]:
  def _nz(shape=shape, density=density):
    a = np.where(RNG.uniform(size=shape) < density, rnd(*shape), 0).astype(np.float32)
    r = nonzero(Tensor(a))
    assert r.dtype == tg.INT32, r.dtype  # tinygrad returns int32 (PyTorch int64)
    close(r.numpy(), torch.nonzero(torch.tensor(a)))
  case(f"nonzero {shape} density={density}", _nz)


def _nz_extra():
  a = np.array([[0, np.nan, -0.0], [np.inf, 0, 1]], np.float32)
  close(nonzero(Tensor(a)).numpy(), torch.nonzero(torch.tensor(a)), what="nan / inf / -0")
  b = np.array([[True, False], [False, True]])
  close(nonzero(view_of(b, "permuted")).numpy(), torch.nonzero(torch.tensor(b)), what="bool permuted")
  c = np.array([0, 3, 0, -2], np.int8)
  close(nonzero(Tensor(c) * 2).numpy(), torch.nonzero(torch.tensor(c)), what="lazy int8")


case("nonzero: nan/inf/-0, bool views, lazy int input", _nz_extra)

# =====================================================================================================
# scatter / scatter_reduce against torch


def uniq_index(shape, n, dim):
  """An index of `shape` whose entries along dim are distinct values in [0, n) (no duplicate targets)."""
  idx = np.zeros(shape, np.int64)
  moved = np.moveaxis(idx, dim, -1)
  for pos in np.ndindex(moved.shape[:-1]): moved[pos] = RNG.permutation(n)[:moved.shape[-1]]
  return np.moveaxis(moved, -1, dim).copy()


SCATTERS = [((4, 5), 0, (2, 5), (3, 5)), ((4, 5), 1, (4, 3), (4, 5)), ((3, 4, 5), 2, (2, 3, 4), (3, 4, 5)),
            ((3, 4, 5), -3, (3, 2, 2), (3, 3, 3)), ((5,), 0, (5,), (5,)), ((5,), 0, (0,), (2,)), ((2, 3), 1, (2, 1), (2, 1))]
for xs, dim, ixs, ss in SCATTERS:
  def _sc(xs=xs, dim=dim, ixs=ixs, ss=ss):
    idx = uniq_index(ixs, xs[dim], dim)
    cut = tuple(slice(0, k) for k in ixs)  # torch 1.13's backward wants src cut to the index shape
    check_torch(lambda x, s: scatter(x, dim, Tensor(idx), s), lambda x, s: x.scatter(dim, torch.tensor(idx), s[cut]), [rnd(*xs), rnd(*ss)])
  case(f"scatter x{xs} dim={dim} index{ixs} src{ss}", _sc)


def _scatter_scalar_dups():
  a = rnd(3, 4)
  idx = np.array([[0, 2], [1, 1]], np.int64)
  check_torch(lambda x: scatter(x, 1, Tensor(idx), 9.5), lambda x: x.scatter(1, torch.tensor(idx), 9.5), [a])
  # duplicates: the last write (along the index dim) wins, as tinygrad
  x = Tensor(np.zeros(4, np.float32))
  r = scatter(x, 0, Tensor(np.array([1, 3, 1, 1, 7, -1], np.int32)), Tensor(np.array([1, 2, 3, 4, 5, 6], np.float32)))
  close(r.numpy(), np.array([0, 4, 0, 2], np.float32), what="duplicates; out-of-range and negative ignored")
  b = np.arange(12, dtype=np.int32).reshape(3, 4)
  close(scatter(Tensor(b), 0, Tensor(np.array([[2, 0, 1, 2]])), Tensor(-b)).numpy(),
        torch.tensor(b).scatter(0, torch.tensor([[2, 0, 1, 2]]), torch.tensor(-b)), what="int32")


case("scatter: scalar src, duplicates (last wins), out-of-range ignored, int dtype", _scatter_scalar_dups)


def _scatter_views_values():
  a, s = rnd(4, 5), rnd(3, 5)
  ix = uniq_index((3, 5), 4, 0)
  ref = torch.tensor(a).scatter(0, torch.tensor(ix), torch.tensor(s))
  for kind in VIEWS:
    close(scatter(view_of(a, kind), 0, Tensor(ix), view_of(s, kind)).numpy(), ref, what=kind)


case("scatter of non-contiguous views", _scatter_views_values)


def _scatter_errors():
  x, s = Tensor(rnd(3, 4)), Tensor(rnd(3, 4))
  expect_error("tg_scatter", lambda: scatter(x, 0, Tensor(np.zeros((2, 4), np.float32)), s), "integer")
  expect_error("tg_scatter", lambda: scatter(x, 0, Tensor(np.zeros((4,), np.int32)), s), "same number of dimensions")
  expect_error("tg_scatter", lambda: scatter(x, 0, Tensor(np.zeros((2, 5), np.int32)), s), "larger than x's shape")
  expect_error("tg_scatter", lambda: scatter(x, 1, Tensor(np.zeros((4, 2), np.int32)), s), "larger than")
  expect_error("tg_scatter", lambda: scatter(x, 0, Tensor(np.zeros((2, 2), np.int32)), Tensor(np.ones((3, 4), np.int32))), "dtype")
  expect_error("tg_scatter", lambda: scatter(x, 2, Tensor(np.zeros((2, 2), np.int32)), s), "out of range")
  expect_error("tg_scatter_reduce", lambda: scatter_reduce(x, 0, Tensor(np.zeros((2, 2), np.int32)), s, 9), "unknown reduce")


case("scatter errors: index dtype / ndim / shape, src dtype, dim, reduce", _scatter_errors)

for red in ["sum", "prod", "mean", "amax", "amin"]:
  for inc in [True, False]:
    for xs, dim, ixs, ss in [((4, 5), 0, (3, 5), (3, 5)), ((3, 6), 1, (3, 4), (3, 5)), ((2, 3, 4), 1, (2, 5, 2), (2, 5, 3))]:
      def _sr(red=red, inc=inc, xs=xs, dim=dim, ixs=ixs, ss=ss):
        idx = RNG.integers(0, xs[dim], size=ixs)  # duplicates on purpose: reductions combine them
        a, s = rnd(*xs, lo=0.5, hi=2.0), rnd(*ss, lo=0.5, hi=2.0)
        if red in ("amax", "amin"):  # distinct values, so the gradient has no ties to split
          vals = RNG.permutation(a.size + s.size).astype(np.float32) / 7
          a, s = vals[:a.size].reshape(a.shape), vals[a.size:].reshape(s.shape)
        check_torch(lambda x, y: scatter_reduce(x, dim, Tensor(idx), y, red, inc),
                    lambda x, y: x.scatter_reduce(dim, torch.tensor(idx), y[tuple(slice(0, k) for k in ixs)], red, include_self=inc),
                    [a, s], rtol=1e-4)
      case(f"scatter_reduce {red} include_self={inc} x{xs} dim={dim} index{ixs}", _sr)


def _sr_ints():
  a = np.array([[3, -7, 5, 0]], np.int32).repeat(2, 0)
  s = np.array([[-7, 4, 9, 1], [2, -3, -8, 6]], np.int32)
  idx = np.array([[0, 1, 0, 1], [1, 1, 0, 0]], np.int64)
  for red in RED:
    for inc in [True, False]:
      r = scatter_reduce(Tensor(a), 0, Tensor(idx), Tensor(s), red, inc)
      assert r.dtype == tg.INT32
      close(r.numpy(), torch.tensor(a).scatter_reduce(0, torch.tensor(idx), torch.tensor(s), red, include_self=inc),
            what=f"{red} include_self={inc}")


case("scatter_reduce on int32 (every reduce; integer mean rounds toward -inf as torch)", _sr_ints)


def _sr_empty_untouched():
  a = rnd(3, 4)
  for red in RED:
    r = scatter_reduce(Tensor(a), 0, Tensor(np.zeros((0, 4), np.int64)), Tensor(rnd(1, 4)), red, False)
    close(r.numpy(), a, what=f"{red} with an empty index")
  r = scatter_reduce(Tensor(a), 1, Tensor(np.array([[3]], np.int64)), Tensor(np.array([[10.0]], np.float32)), "amin", False)
  b = a.copy()
  b[0, 3] = 10.0
  close(r.numpy(), b, what="amin without self: only the scattered value counts")


case("scatter_reduce with an empty index and untouched targets keeps x", _sr_empty_untouched)

# =====================================================================================================
# properties, contiguous_backward


def _props():
  for dt in tg.ALL_DTYPES:
    x = Tensor.zeros(2, 3, dtype=dt)
    assert lib.tg_element_size(x.h) == tg.itemsize(dt), dt
    assert lib.tg_nbytes(x.h) == 6 * tg.itemsize(dt), dt
    assert lib.tg_is_floating_point(x.h) == (dt in tg.FLOATS), dt
    ref = torch.zeros(2, 3, dtype={tg.BOOL: torch.bool, tg.INT8: torch.int8, tg.INT16: torch.int16, tg.INT32: torch.int32,
                                   tg.INT64: torch.int64, tg.UINT8: torch.uint8, tg.FLOAT16: torch.float16,
                                   tg.BFLOAT16: torch.bfloat16, tg.FLOAT32: torch.float32, tg.FLOAT64: torch.float64}.get(dt, torch.int64))
    if dt not in tg.UINTS[1:]:
      assert ref.element_size() == lib.tg_element_size(x.h) and ref.is_floating_point() == lib.tg_is_floating_point(x.h)
  assert lib.tg_nbytes(Tensor.zeros(0, 5).h) == 0
  assert lib.tg_nbytes(Tensor.scalar(1.0, dtype=tg.FLOAT64).h) == 8
  for name, bad in [("tg_element_size", -1), ("tg_nbytes", -1), ("tg_is_floating_point", False)]:
    assert getattr(lib, name)(_T(0)) == bad, name
    assert name in tg.last_error(), tg.last_error()
    lib.tg_clear_error()


case("element_size, nbytes, is_floating_point for every dtype (and errors)", _props)


def _cb():
  a = rnd(3, 4)
  check_torch(lambda x: contiguous_backward(x.permute(1, 0)) * 3, lambda x: x.permute(1, 0) * 3, [a])
  x = Tensor(np.array([-0.0, np.inf, np.nan], np.float32))
  r = contiguous_backward(x).numpy()
  assert np.signbit(r[0]) and np.isinf(r[1]) and np.isnan(r[2])
  i = Tensor(np.array([1, 2], np.int32))
  close(contiguous_backward(i).numpy(), np.array([1, 2]))
  # forward: no extra kernel; backward: the gradient is materialized (one more kernel than without)
  assert kernels(lambda: contiguous_backward(Tensor(a).realize()) * 2) == 1
  def nk(use):
    y = set_rg(Tensor(a).realize())
    z = y.permute(1, 0)
    z = contiguous_backward(z) if use else z
    backward((z.exp() * Tensor(weights((4, 3)))).sum())
    return kernels(lambda: grad(y))
  assert nk(True) == nk(False) + 1, (nk(True), nk(False))


case("contiguous_backward: identity forward (bitwise), contiguous gradient, same values", _cb)


def _pad_not_regression():
  # regression (schedule.c): NEG of a bool is logical not, which maps false to true, so a PAD above it
  # must gate it like any op that is not zero-preserving (it padded with true before)
  lib.tg_logical_not.restype, lib.tg_logical_not.argtypes = _T, [_T]
  b = np.array([True, False])
  r = W(call("logical_not", Tensor(b).h)).pad([(1, 2)]).numpy()
  close(r, np.array([False, False, True, False, False]), what="pad(logical_not(x))")
  a = rnd(3)
  close(Tensor(a).ge(Tensor(np.float32(0))).pad([(2, 0)]).numpy(), np.pad(a >= 0, (2, 0)), what="pad(x >= 0)")
  # the advanced setitem that exposed it (hit masks are logical nots, un-strided by pads)
  x = Tensor(np.zeros((3, 4), np.float32) + 5).realize()
  setitem(x, (Tensor(np.array([2, 0], np.int32)), slice(1, None, 2)), 1.0)
  ref = np.full((3, 4), 5, np.float32)
  ref[[2, 0], 1::2] = 1
  close(x.numpy(), ref, what="setitem")


case("regression: pad over logical not / tg_ge pads with false", _pad_not_regression)


def _none_propagates():
  for f in [lambda: W(call("diag", _T(0))), lambda: rearrange(W(_T(0)), "a -> a"), lambda: nonzero(W(_T(0)))]:
    try:
      f()
      raise AssertionError("none accepted")
    except TGError as e:
      assert "tg_" in str(e)
  lib.tg_clear_error()


case("ops given none report the function", _none_propagates)


def _uint64_index_past_int64():
  # an index of 2^63 or more is out of range (reads 0, writes nothing), not a negative index counted
  # from the end (2^64 - 1 read and wrote the last element)
  x = Tensor(np.arange(10, 15, dtype=np.float32))
  idx = Tensor(np.array([2 ** 64 - 1, 2 ** 63, 1], dtype=np.uint64))
  assert np.array_equal(getitem(x, (idx,)).numpy(), [0, 0, 11]), getitem(x, (idx,)).numpy()
  y = Tensor(np.zeros(5, np.float32))
  setitem(y, (idx,), 1.0)
  assert np.array_equal(y.numpy(), [0, 1, 0, 0, 0]), y.numpy()


case("uint64 indices of 2^63 and more are out of range", _uint64_index_past_int64)


def _views_read_pending_writes():
  # a view taken before a setitem, read before the tensor, sees the write (it read the old values);
  # and the tensor sees a write made through a view that is the tensor itself (t[:, :], a no-op
  # reshape), also before that view is read
  base = np.arange(12, dtype=np.float32).reshape(3, 4)
  t = Tensor(base.copy()); t.realize()
  v = getitem(t, (1,))
  setitem(t, (1, 2), -5.0)
  assert np.array_equal(v.numpy(), [4, 5, -5, 7]), v.numpy()
  t = Tensor(base.copy()); t.realize()
  v, u = getitem(t, (1,)), getitem(t, (1,))
  setitem(u, (2,), -5.0)
  assert np.array_equal(v.numpy(), [4, 5, -5, 7]), v.numpy()
  for spec in [(slice(None), slice(None)), (Ellipsis,)]:
    t = Tensor(base.copy()); t.realize()
    r = getitem(t, spec)
    setitem(r, (0, 0), 42.0)
    assert t.numpy()[0, 0] == 42 and r.numpy()[0, 0] == 42, (spec, t.numpy()[0])


case("views read the writes pending into their buffer", _views_read_pending_writes)


# =====================================================================================================
def main(): return tg.run_cases(CASES, "test_indexing_torch")


if __name__ == "__main__":
  sys.exit(main())
