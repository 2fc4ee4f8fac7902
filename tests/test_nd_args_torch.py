"""test_nd_args_torch.py -- differential tests against PyTorch of tinygrad's arguments that go beyond
the 2-d / default forms: n-d convolutions, transposed convolutions and pools (1-d and 3-d), exact
gelu, softmin, normalize, one-sided isinf, parametrized selu / hardsigmoid, masked_select, nonzero
with size / fill_value, batchnorm over any axes, attention with grouped-query heads, dtype arguments
of softmax / matmul / einsum / the convolutions, the Muon optimizer and the fp8 dtypes.

Forward values and gradients (tg_backward of sum(out * w)) against torch; errors must name the
function. Every case runs in its own tg scope and the live handle count must be 0 at the end. Last
line: "test_nd_args_torch: N passed, N failed"; exit 1 on any failure.

Run: /usr/bin/python3 tests/test_nd_args_torch.py   (TINYGRAD_LIB selects the library; TEST_FILTER=substr)
"""
import ctypes
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import tinygrad as tg  # noqa: E402
from tinygrad import Tensor, _T, call, lib  # noqa: E402
from torchcheck import backward, expect_error, grad, kernels, set_rg  # noqa: E402
import torchcheck  # noqa: E402

torch.set_num_threads(1)
RNG = np.random.default_rng(4321)
_I, _I64, _B, _D = ctypes.c_int, ctypes.c_int64, ctypes.c_bool, ctypes.c_double
MAXW = 8


def rnd(*shape, **kw): return torchcheck.rnd(*shape, rng=RNG, **kw)
def close(ours, ref, atol=1e-5, rtol=1e-3, what="value"): return torchcheck.close(ours, ref, atol, rtol, what)


class WindowOpts(ctypes.Structure):
  _fields_ = [("kernel_size", _I64 * MAXW), ("stride", _I64 * MAXW), ("dilation", _I64 * MAXW),
              ("padding", _I64 * (2 * MAXW)), ("npadding", _I), ("groups", _I64), ("output_padding", _I64 * MAXW),
              ("noutput_padding", _I), ("ceil_mode", _B), ("exclude_pad", _B), ("dtype", _I)]


class SdpaOpts(ctypes.Structure):
  _fields_ = [("is_causal", _B), ("dropout_p", _D), ("enable_gqa", _B)]


class MuonOpts(ctypes.Structure):
  _fields_ = [("lr", _D), ("momentum", _D), ("weight_decay", _D), ("ns_steps", _I), ("ns_coefficients", _D * 8),
              ("n_ns_coefficients", _I), ("nesterov", _B)]


def muon_opts(lr=0.001, momentum=0.95, weight_decay=0.1, ns_steps=5, coefs=(3.4445, -4.775, 2.0315), nesterov=True):
  """TG_MUON_OPTS(...): every field as given, tinygrad's defaults for the rest."""
  return MuonOpts(lr, momentum, weight_decay, ns_steps, tuple(coefs) + (0,) * (8 - len(coefs)), len(coefs), nesterov)


class ConvOpts(ctypes.Structure):
  _fields_ = [("groups", _I64), ("stride", _I64 * 2), ("dilation", _I64 * 2), ("padding", _I64 * 4), ("npadding", _I),
              ("dtype", _I)]


class ConvTOpts(ctypes.Structure):
  _fields_ = [("groups", _I64), ("stride", _I64 * 2), ("dilation", _I64 * 2), ("padding", _I64 * 4), ("npadding", _I),
              ("output_padding", _I64 * 2), ("noutput_padding", _I), ("dtype", _I)]


_WP = ctypes.POINTER(WindowOpts)
_SIGS = {
    "tg_conv_nd": (_T, [_T, _T, _T, _WP]), "tg_conv_transpose_nd": (_T, [_T, _T, _T, _WP]),
    "tg_max_pool_nd": (_T, [_T, _I, _WP]), "tg_avg_pool_nd": (_T, [_T, _I, _WP]),
    "tg_conv2d": (_T, [_T, _T, _T, ctypes.POINTER(ConvOpts)]),
    "tg_conv_transpose2d": (_T, [_T, _T, _T, ctypes.POINTER(ConvTOpts)]),
    "tg_gelu_ex": (_T, [_T, ctypes.c_char_p]), "tg_selu_ex": (_T, [_T, _D, _D]), "tg_hardsigmoid_ex": (_T, [_T, _D, _D]),
    "tg_isinf_ex": (_T, [_T, _B, _B]), "tg_softmax_dtype": (_T, [_T, _I, _I]), "tg_log_softmax_dtype": (_T, [_T, _I, _I]),
    "tg_softmin": (_T, [_T, _I, _I]), "tg_normalize": (_T, [_T, _D, _I, _D]),
    "tg_masked_select_size": (_T, [_T, _T, _I64, _D]), "tg_nonzero_size": (_T, [_T, _I64, _D]),
    "tg_batchnorm_axes": (_T, [_T, _T, _T, _T, _T, ctypes.POINTER(_I), _I]),
    "tg_scaled_dot_product_attention": (_T, [_T, _T, _T, _T, ctypes.POINTER(SdpaOpts)]),
    "tg_matmul_dtype": (_T, [_T, _T, _I]), "tg_dot_dtype": (_T, [_T, _T, _I]), "tg_linear_dtype": (_T, [_T, _T, _T, _I]),
    "tg_einsum_dtype": (_T, [ctypes.c_char_p, ctypes.POINTER(_T), _I, _I]),
    "tg_newton_schulz": (_T, [_T, _I, ctypes.POINTER(_D), _I, _D]),
    "tg_optim_muon": (ctypes.c_void_p, [ctypes.POINTER(_T), _I, ctypes.POINTER(MuonOpts)]),
    "tg_optim_step": (_I, [ctypes.c_void_p]), "tg_optim_zero_grad": (None, [ctypes.c_void_p]),
    "tg_optim_free": (None, [ctypes.c_void_p]),
    "tg_dtype_promote": (_I, [_I, _I]), "tg_dtype_name": (ctypes.c_char_p, [_I]), "tg_dtype_itemsize": (ctypes.c_size_t, [_I]),
    "tg_dtype_is_float": (_B, [_I]),
    "tg_set_requires_grad": (_T, [_T, _B]), "tg_backward": (_I, [_T]), "tg_grad": (_T, [_T]),
}
for _n, (_r, _a) in _SIGS.items():
  _f = getattr(lib, _n)
  _f.restype, _f.argtypes = _r, _a

W = Tensor._wrap
NONE_T = _T(0)
def _h(t): return t.h if t is not None else NONE_T


def _dims(v):
  if v is None: return (0,) * MAXW
  if isinstance(v, int): v = (v,)
  return tuple(v) + (0,) * (MAXW - len(v))


def wopts(kernel_size=None, stride=None, dilation=None, padding=None, groups=0, output_padding=None, ceil_mode=False,
          exclude_pad=False, dtype=0):
  if padding is None: pads, npad = (0,), 0
  elif isinstance(padding, int): pads, npad = (padding,), 1
  else: pads, npad = tuple(padding), len(padding)
  if output_padding is None: op, nop = (0,), 0
  elif isinstance(output_padding, int): op, nop = (output_padding,), 1
  else: op, nop = tuple(output_padding), len(output_padding)
  return WindowOpts(_dims(kernel_size), _dims(stride), _dims(dilation), pads + (0,) * (2 * MAXW - len(pads)), npad,
                    groups, _dims(op), nop, ceil_mode, exclude_pad, dtype)


def conv_nd(x, w, b=None, **kw): return W(call("conv_nd", x.h, w.h, _h(b), ctypes.byref(wopts(**kw))))
def conv_transpose_nd(x, w, b=None, **kw): return W(call("conv_transpose_nd", x.h, w.h, _h(b), ctypes.byref(wopts(**kw))))
def max_pool_nd(x, nk, **kw): return W(call("max_pool_nd", x.h, nk, ctypes.byref(wopts(**kw))))
def avg_pool_nd(x, nk, **kw): return W(call("avg_pool_nd", x.h, nk, ctypes.byref(wopts(**kw))))


CASES = []
def case(name, fn, *args, **kw): CASES.append((name, fn, args, kw))


def check_fwd_bwd(f_tg, f_torch, arrays, atol=1e-5, rtol=1e-3, gatol=None, grad_of=None):
  """Forward of f_tg(tensors) vs f_torch(torch tensors); backward of sum(out * w) for the float inputs."""
  if grad_of is None: grad_of = [i for i, a in enumerate(arrays) if np.issubdtype(a.dtype, np.floating)]
  ts = [Tensor(a) for a in arrays]
  for i in grad_of: set_rg(ts[i])
  out = f_tg(*ts)
  tt = [torch.tensor(a, requires_grad=(i in grad_of)) for i, a in enumerate(arrays)]
  ref = f_torch(*tt)
  if grad_of:
    wv = RNG.uniform(0.5, 1.5, size=ref.shape).astype(np.float32)
    backward((out * Tensor(wv)).sum())
    (ref * torch.tensor(wv, dtype=ref.dtype)).sum().backward()
  close(out.numpy(), ref, atol, rtol, "forward")
  for i in grad_of:
    close(grad(ts[i]).numpy(), tt[i].grad, gatol if gatol is not None else max(atol, 1e-5), rtol, f"grad of input {i}")


# =====================================================================================================
# n-d convolutions and pools
TORCH_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
TORCH_CONVT = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}
TORCH_MAX = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}
TORCH_AVG = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}


def _t_pad(x, pads):  # tinygrad's 2*n padding order (from the last dim back) for torch
  return F.pad(x, tuple(pads))


CONV_ND = [
    ((2, 3, 9), (4, 3, 3), {}), ((2, 4, 10), (6, 2, 3), {"groups": 2, "stride": 2, "padding": 1}),
    ((1, 2, 11), (3, 2, 2), {"dilation": 3, "padding": (2, 1)}), ((2, 2, 7), (2, 2, 5), {"padding": -1}),
    ((1, 2, 5, 6, 5), (3, 2, 3, 2, 3), {}), ((2, 2, 6, 5, 7), (4, 2, 3, 3, 3), {"padding": 1, "stride": (2, 1, 2)}),
    ((1, 4, 7, 7, 6), (4, 2, 2, 3, 2), {"groups": 2, "dilation": (2, 1, 2), "padding": (1, 0, 1)}),
    ((1, 1, 4, 5, 6), (2, 1, 2, 2, 2), {"padding": (1, 0, 0, 1, 2, 0)}), ((0, 2, 4, 4, 4), (3, 2, 2, 2, 2), {}),
    ((1, 2, 3, 4, 3, 4), (2, 2, 2, 2, 2, 2), {"stride": 2}),  # 4 spatial dims (no torch conv4d: compared below)
    ((2, 3, 6, 7), (4, 3, 3, 2), {"stride": (2, 1), "padding": (1, 2)}),  # 2-d via tg_conv_nd
]


def _torch_conv_nd(x, w, b, kw):
  nsp = w.dim() - 2
  p = kw.get("padding", 0)
  if isinstance(p, tuple) and len(p) == 2 * nsp:
    x, p = _t_pad(x, p), 0
  elif isinstance(p, int) and p < 0:
    x, p = x[(slice(None), slice(None)) + (slice(-p, p),) * nsp], 0
  kws = dict(stride=kw.get("stride", 1), padding=p, dilation=kw.get("dilation", 1), groups=kw.get("groups", 1))
  if nsp in TORCH_CONV: return TORCH_CONV[nsp](x, w, b, **kws)
  # 4 spatial dims: sum of 3-d convolutions over the first spatial dim of the kernel
  assert kws["padding"] == 0 and kws["dilation"] == 1 and kws["groups"] == 1
  s = kws["stride"]
  kd, D = w.shape[2], x.shape[2]
  outs = []
  for od in range(0, D - kd + 1, s):
    acc = sum(F.conv3d(x[:, :, od + i], w[:, :, i], None, stride=s) for i in range(kd))
    outs.append(acc if b is None else acc + b.reshape(1, -1, 1, 1, 1))
  return torch.stack(outs, 2)


for xs, ws, kw in CONV_ND:
  for with_bias in ([False, True] if xs[0] else [False]):
    def _cv(xs=xs, ws=ws, kw=kw, with_bias=with_bias):
      arrs = [rnd(*xs), rnd(*ws)] + ([rnd(ws[0])] if with_bias else [])
      check_fwd_bwd(lambda x, w, b=None: conv_nd(x, w, b, **kw), lambda x, w, b=None: _torch_conv_nd(x, w, b, kw), arrs,
                    atol=1e-4, gatol=3e-4)
    case(f"conv_nd x{xs} w{ws} {kw}{' +bias' if with_bias else ''}", _cv)


def _conv2d_takes_nd():
  # tg_conv2d (tinygrad's conv2d) with a 1-d and a 3-d weight and uniform options
  for xs, ws, kw in [((2, 3, 9), (4, 3, 3), {"padding": 1, "stride": 2}), ((1, 2, 5, 6, 5), (3, 2, 3, 2, 3), {"padding": 1}),
                     ((1, 4, 6, 6, 6), (2, 2, 3, 3, 3), {"groups": 2, "dilation": 2})]:
    x, w, b = rnd(*xs), rnd(*ws), rnd(ws[0])
    o = ConvOpts(kw.get("groups", 0), (kw.get("stride", 0), 0), (kw.get("dilation", 0), 0), (kw.get("padding", 0), 0, 0, 0), 1)
    tx, tw = Tensor(x), Tensor(w)
    set_rg(tx), set_rg(tw)
    r = W(call("conv2d", tx.h, tw.h, Tensor(b).h, ctypes.byref(o)))
    xt, wt = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    ref = _torch_conv_nd(xt, wt, torch.tensor(b), kw)
    backward(r.sum())
    ref.sum().backward()
    close(r.numpy(), ref, 1e-4, what=f"conv2d {xs} {ws}")
    close(grad(tx).numpy(), xt.grad, 3e-4, what="grad x")
    close(grad(tw).numpy(), wt.grad, 3e-4, what="grad w")
  # per-dim values need tg_conv_nd
  o = ConvOpts(0, (1, 2), (0, 0), (0, 0, 0, 0), 0)
  expect_error("tg_conv2d", lambda: W(call("conv2d", Tensor(rnd(1, 1, 4, 4, 4)).h, Tensor(rnd(1, 1, 2, 2, 2)).h, NONE_T,
                                           ctypes.byref(o))), "tg_conv_nd")


case("tg_conv2d takes 1-d and 3-d convolutions with uniform options", _conv2d_takes_nd)

CONVT_ND = [
    ((2, 3, 5), (3, 2, 3), {}), ((1, 4, 6), (4, 3, 3), {"stride": 2, "padding": 1, "output_padding": 1}),
    ((2, 4, 5), (4, 1, 2), {"groups": 2, "dilation": 2}),
    ((1, 2, 3, 4, 3), (2, 3, 2, 3, 2), {}), ((1, 2, 3, 3, 4), (2, 2, 3, 2, 3), {"stride": (2, 1, 3), "padding": (1, 0, 1)}),
    ((2, 2, 3, 3, 3), (2, 1, 2, 2, 2), {"groups": 2, "stride": 2, "output_padding": (1, 0, 1), "dilation": (1, 2, 1)}),
    ((2, 3, 4, 5), (3, 2, 3, 3), {"stride": (2, 1), "padding": (1, 1)}),
]


def _torch_convt(x, w, b, kw):
  nsp = w.dim() - 2
  return TORCH_CONVT[nsp](x, w, b, stride=kw.get("stride", 1), padding=kw.get("padding", 0),
                          output_padding=kw.get("output_padding", 0), groups=kw.get("groups", 1),
                          dilation=kw.get("dilation", 1))


for xs, ws, kw in CONVT_ND:
  for with_bias in [False, True]:
    def _ct(xs=xs, ws=ws, kw=kw, with_bias=with_bias):
      cout = ws[1] * kw.get("groups", 1)
      arrs = [rnd(*xs), rnd(*ws)] + ([rnd(cout)] if with_bias else [])
      check_fwd_bwd(lambda x, w, b=None: conv_transpose_nd(x, w, b, **kw), lambda x, w, b=None: _torch_convt(x, w, b, kw), arrs,
                    atol=1e-4, gatol=3e-4)
    case(f"conv_transpose_nd x{xs} w{ws} {kw}{' +bias' if with_bias else ''}", _ct)


def _conv_transpose2d_takes_nd():
  x, w = rnd(1, 2, 3, 4, 3), rnd(2, 3, 2, 2, 2)
  o = ConvTOpts(0, (2, 0), (0, 0), (1, 0, 0, 0), 1, (1, 0), 1)
  r = W(call("conv_transpose2d", Tensor(x).h, Tensor(w).h, NONE_T, ctypes.byref(o)))
  close(r.numpy(), F.conv_transpose3d(torch.tensor(x), torch.tensor(w), stride=2, padding=1, output_padding=1), 1e-4)
  x, w = rnd(2, 3, 7), rnd(3, 2, 3)
  o = ConvTOpts(0, (3, 0), (0, 0), (0, 0, 0, 0), 0, (0, 0), 0)
  r = W(call("conv_transpose2d", Tensor(x).h, Tensor(w).h, NONE_T, ctypes.byref(o)))
  close(r.numpy(), F.conv_transpose1d(torch.tensor(x), torch.tensor(w), stride=3), 1e-4)


case("tg_conv_transpose2d takes 1-d and 3-d weights with uniform options", _conv_transpose2d_takes_nd)

POOL_ND = [
    ((2, 3, 8), 1, {}), ((2, 3, 9), 1, {"kernel_size": 3, "stride": 2, "padding": 1}), ((1, 2, 10), 1, {"kernel_size": 2, "dilation": 3}),
    ((1, 1, 7), 1, {"kernel_size": 2, "ceil_mode": True}), ((3, 7), 1, {"kernel_size": 3, "stride": 1}),
    ((1, 2, 4, 4, 4), 3, {}), ((2, 1, 5, 6, 7), 3, {"kernel_size": (3, 2, 3), "stride": (1, 2, 2), "padding": (1, 0, 1)}),
    ((1, 2, 6, 6, 6), 3, {"kernel_size": 2, "dilation": (1, 2, 1), "stride": 1}),
    ((1, 1, 5, 5, 5), 3, {"kernel_size": 2, "ceil_mode": True}), ((1, 1, 7, 6, 5), 3, {"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True}),
    ((0, 2, 4, 4, 4), 3, {}), ((2, 3, 6, 6), 2, {"kernel_size": 3, "stride": 2, "padding": 1}),
    ((1, 1, 2), 1, {"kernel_size": 3, "stride": 3, "ceil_mode": True}),
]


def _torch_pool_kw(kw, maxpool):
  r = {"kernel_size": kw.get("kernel_size", 2)}
  for k in ["stride", "padding", "dilation", "ceil_mode"]:
    if k in kw and (maxpool or k != "dilation"): r[k] = kw[k]
  return r


for shape, nk, kw in POOL_ND:
  def _mp(shape=shape, nk=nk, kw=kw):
    check_fwd_bwd(lambda t: max_pool_nd(t, nk, **kw), lambda t: TORCH_MAX[nk](t, **_torch_pool_kw(kw, True)), [rnd(*shape)])
  case(f"max_pool_nd {nk}-d {shape} {kw}", _mp)
  if "dilation" in kw: continue
  def _ap(shape=shape, nk=nk, kw=kw):
    check_fwd_bwd(lambda t: avg_pool_nd(t, nk, **kw), lambda t: TORCH_AVG[nk](t, **_torch_pool_kw(kw, False)), [rnd(*shape)])
  case(f"avg_pool_nd {nk}-d {shape} {kw}", _ap)
  if "padding" in kw:
    def _ap2(shape=shape, nk=nk, kw=kw):
      check_fwd_bwd(lambda t: avg_pool_nd(t, nk, exclude_pad=True, **kw),
                    lambda t: TORCH_AVG[nk](t, count_include_pad=False, **_torch_pool_kw(kw, False)), [rnd(*shape)])
    case(f"avg_pool_nd exclude_pad {nk}-d {shape} {kw}", _ap2)


def _avg_pool_dilation():
  # tinygrad's avg_pool2d takes a dilation (torch's does not): the mean of the dilated window
  x = rnd(1, 2, 9)
  r = avg_pool_nd(Tensor(x), 1, kernel_size=3, dilation=2, stride=1).numpy()
  ref = np.stack([x[..., i:i + 5:2].mean(-1) for i in range(9 - 4)], -1)
  close(r, ref)


case("avg_pool_nd with a dilation (tinygrad's, no torch equivalent)", _avg_pool_dilation)


def _int_max_pool_nd():
  a = RNG.integers(-50, 50, size=(1, 2, 4, 4, 4)).astype(np.int32)
  r = max_pool_nd(Tensor(a), 3, kernel_size=3, stride=1, padding=1)
  assert r.dtype == tg.INT32
  close(r.numpy(), F.max_pool3d(torch.tensor(a.astype(np.float32)), 3, 1, 1).numpy().astype(np.int32))


case("max_pool_nd of int32 pads with the dtype's minimum", _int_max_pool_nd)

ND_ERRS = [
    ("tg_conv_nd", lambda: conv_nd(Tensor(rnd(1, 2, 5, 5, 5)), Tensor(rnd(3, 2, 2, 2))), "spatial"),
    ("tg_conv_nd", lambda: conv_nd(Tensor(rnd(1, 2, 5, 5, 5)), Tensor(rnd(3, 2, 2, 2, 2)), stride=(1, 2)), None),
    ("tg_conv_nd", lambda: conv_nd(Tensor(rnd(1, 2, 5, 5, 5)), Tensor(rnd(3, 2, 2, 2, 2)), stride=(1, 2, 1, 1)), "spatial dims"),
    ("tg_conv_nd", lambda: conv_nd(Tensor(rnd(1, 2, 5, 5, 5)), Tensor(rnd(3, 2, 2, 2, 2)), padding=(1, 1, 1, 1)), "npadding"),
    ("tg_conv_nd", lambda: conv_nd(Tensor(rnd(1, 2, 5, 5, 5)), Tensor(rnd(3, 2, 2, 2, 2)), kernel_size=2), "pool option"),
    ("tg_conv_nd", lambda: conv_nd(Tensor(rnd(1, 2, 5, 5, 1)), Tensor(rnd(3, 2, 2, 2, 2))), "larger than the padded"),
    ("tg_conv_nd", lambda: conv_nd(Tensor(rnd(1, 3, 5, 5, 5)), Tensor(rnd(4, 2, 2, 2, 2)), groups=2), "groups"),
    ("tg_conv_nd", lambda: conv_nd(Tensor(rnd(1, 2, 5, 5, 5)), Tensor(rnd(3, 2, 2, 2, 2)), output_padding=1), "output_padding"),
    ("tg_conv_transpose_nd", lambda: conv_transpose_nd(Tensor(rnd(1, 2, 5, 5)), Tensor(rnd(2, 2, 2, 2, 2))), "spatial"),
    ("tg_conv_transpose_nd", lambda: conv_transpose_nd(Tensor(rnd(1, 2, 5)), Tensor(rnd(2, 2, 2)), output_padding=-1), "output_padding"),
    ("tg_max_pool_nd", lambda: max_pool_nd(Tensor(rnd(2, 3)), 3), "dimensions"),
    ("tg_max_pool_nd", lambda: max_pool_nd(Tensor(rnd(2, 3, 4)), 0), "spatial dims"),
    ("tg_max_pool_nd", lambda: max_pool_nd(Tensor(rnd(2, 3, 4)), 1, groups=2), "convolution"),
    ("tg_avg_pool_nd", lambda: avg_pool_nd(Tensor(rnd(2, 3, 4)), 1, kernel_size=5), "larger than the padded"),
    ("tg_avg_pool_nd", lambda: avg_pool_nd(Tensor(rnd(2, 3, 4, 4)), 2, kernel_size=(2, -1)), "positive"),
]
for i, (fname, f, sub) in enumerate(ND_ERRS):
  case(f"error: {fname} #{i} ({sub or 'names the function'})", lambda fname=fname, f=f, sub=sub: expect_error(fname, f, sub))


# =====================================================================================================
# activations and math with tinygrad's arguments
def _gelu_exact():
  for dt, atol in [(np.float32, 2e-7 * 4), (np.float64, 2e-7 * 4)]:
    x = np.concatenate([rnd(40, lo=-6, hi=6), np.array([0.0, -0.0, 10.0, -10.0, 1e-8], np.float32)]).astype(dt)
    check_fwd_bwd(lambda t: W(call("gelu_ex", t.h, b"none")), lambda t: F.gelu(t, approximate="none"), [x], atol=atol, gatol=2e-6)
  check_fwd_bwd(lambda t: W(call("gelu_ex", t.h, b"tanh")), lambda t: F.gelu(t, approximate="tanh"), [rnd(30, lo=-5, hi=5)], atol=1e-6)
  # half precision computes in float32 and rounds once
  x = rnd(64, lo=-4, hi=4)
  r = W(call("gelu_ex", Tensor(x.astype(np.float16)).h, b"none"))
  assert r.dtype == tg.FLOAT16
  close(r.numpy(), F.gelu(torch.tensor(x.astype(np.float16).astype(np.float32))).numpy().astype(np.float16), atol=1e-3)
  # integer input: DEFAULT_FLOAT
  r = W(call("gelu_ex", Tensor(np.array([-2, 0, 3], np.int32)).h, b"none"))
  assert r.dtype == tg.FLOAT32
  close(r.numpy(), F.gelu(torch.tensor([-2.0, 0.0, 3.0])), atol=1e-6)
  expect_error("tg_gelu_ex", lambda: W(call("gelu_ex", Tensor(x).h, b"erf")), "none")


case("gelu approximate='none' (exact erf) and 'tanh': values and gradients", _gelu_exact)


def _softmin():
  for shape, axis in [((4, 7), -1), ((3, 5, 2), 1), ((6,), 0), ((2, 0, 3), -1), ((1, 1), 0)]:
    check_fwd_bwd(lambda t: W(call("softmin", t.h, axis, 0)), lambda t: F.softmin(t, dim=axis), [rnd(*shape)], atol=1e-6)
  check_fwd_bwd(lambda t: W(call("softmin", t.h, 0, tg.FLOAT64)), lambda t: F.softmin(t.double(), dim=0), [rnd(5, 3)], atol=1e-9)
  r = W(call("softmin", Tensor(np.array([1, 2, 3], np.int32)).h, 0, 0))
  assert r.dtype == tg.FLOAT32
  close(r.numpy(), F.softmin(torch.tensor([1.0, 2.0, 3.0]), 0))
  expect_error("tg_softmin", lambda: W(call("softmin", Tensor(rnd(3)).h, 1, 0)))


case("softmin (default and float64 dtype): values and gradients", _softmin)


def _normalize():
  for shape, p, dim, eps in [((4, 5), 2.0, 1, 1e-12), ((3, 4, 2), 1.0, 0, 1e-12), ((3, 6), 3.0, -1, 1e-12),
                             ((5, 3), 0.5, 0, 1e-12), ((2, 3), 2.0, 1, 10.0), ((4, 0), 2.0, 0, 1e-12), ((6,), 2.0, 0, 1e-12)]:
    check_fwd_bwd(lambda t: W(call("normalize", t.h, p, dim, eps)), lambda t: F.normalize(t, p=p, dim=dim, eps=eps), [rnd(*shape)],
                  atol=1e-6, gatol=2e-5)
  # a zero row: divided by eps, gradient finite
  x = np.array([[0.0, 0.0, 0.0], [3.0, 4.0, 0.0]], np.float32)
  close(W(call("normalize", Tensor(x).h, 2.0, 1, 1e-12)).numpy(), F.normalize(torch.tensor(x), dim=1))
  # p = 0 counts the non-zero elements (tinygrad's), torch has no p=0 normalize
  close(W(call("normalize", Tensor(x).h, 0.0, 1, 1e-12)).numpy(), x / np.maximum((x != 0).sum(1, keepdims=True), 1e-12))
  expect_error("tg_normalize", lambda: W(call("normalize", Tensor(x).h, -1.0, 1, 1e-12)), "p")
  expect_error("tg_normalize", lambda: W(call("normalize", Tensor(x).h, 2.0, 2, 1e-12)))


case("normalize (Lp, dim, eps): values and gradients", _normalize)


def _isinf_sides():
  x = np.array([1.0, np.inf, -np.inf, np.nan, 0.0, -1e38, 3e38], np.float32)
  x16 = np.array([1.0, np.inf, -np.inf, np.nan, 0.0, -6e4, 6e4], np.float16)
  for pos in [False, True]:
    for neg in [False, True]:
      for a in [x, x16, x.astype(np.float64)]:
        r = W(call("isinf_ex", Tensor(a).h, pos, neg))
        assert r.dtype == tg.BOOL
        ref = (np.isposinf(a) & pos) | (np.isneginf(a) & neg)
        close(r.numpy(), ref, what=f"pos={pos} neg={neg} {a.dtype}")
  r = W(call("isinf_ex", Tensor(np.array([1, -5], np.int32)).h, True, True))
  close(r.numpy(), np.array([False, False]))


case("isinf with detect_positive / detect_negative", _isinf_sides)


def _selu_params():
  x = np.concatenate([rnd(40, lo=-5, hi=5), np.array([0.0, 100.0, -100.0], np.float32)])
  for alpha, gamma in [(1.67326, 1.0507), (2.0, 0.5), (0.3, 3.0)]:
    check_fwd_bwd(lambda t: W(call("selu_ex", t.h, alpha, gamma)),
                  lambda t: gamma * torch.where(t >= 0, t, alpha * (torch.exp(t.clamp(max=0)) - 1)), [x], atol=1e-5)
  # tinygrad's defaults (rounded constants) vs torch's selu: close, not equal
  r = W(call("selu_ex", Tensor(x).h, 1.67326, 1.0507)).numpy()
  close(r, torch.selu(torch.tensor(x)), atol=1e-3, rtol=1e-4)
  r = W(call("selu_ex", Tensor(np.array([-1, 2], np.int32)).h, 2.0, 0.5))
  assert r.dtype == tg.FLOAT32
  close(r.numpy(), np.array([0.5 * 2.0 * (np.exp(-1.0) - 1), 1.0], np.float32))


case("selu(alpha, gamma) with non-default parameters: values and gradients (finite at x = 100)", _selu_params)


def _hardsigmoid_params():
  x = np.concatenate([rnd(40, lo=-8, hi=8), np.array([np.inf, -np.inf], np.float32)])
  for alpha, beta in [(1 / 6, 0.5), (0.2, 0.5), (0.5, 0.1), (-0.25, 0.3)]:
    xf = x if alpha == 1 / 6 else x[:-2]
    check_fwd_bwd(lambda t: W(call("hardsigmoid_ex", t.h, alpha, beta)),
                  lambda t: torch.clamp(alpha * t + beta, 0, 1), [xf], atol=1e-6)
  close(W(call("hardsigmoid_ex", Tensor(x).h, 1 / 6, 0.5)).numpy(), F.hardsigmoid(torch.tensor(x)), atol=1e-6)
  r = W(call("hardsigmoid_ex", Tensor(np.array([-4, 0, 1, 9], np.int32)).h, 0.25, 0.5))
  assert r.dtype == tg.FLOAT32
  close(r.numpy(), np.array([0.0, 0.5, 0.75, 1.0], np.float32))


case("hardsigmoid(alpha, beta) with non-default parameters: values and gradients", _hardsigmoid_params)


def _softmax_dtype():
  x = rnd(4, 9)
  for fn, tf in [("softmax_dtype", F.softmax), ("log_softmax_dtype", F.log_softmax)]:
    check_fwd_bwd(lambda t: W(call(fn, t.h, -1, tg.FLOAT64)), lambda t: tf(t.double(), -1), [x], atol=1e-9)
    r = W(call(fn, Tensor(x.astype(np.float16)).h, 1, tg.FLOAT32))
    assert r.dtype == tg.FLOAT32
    x16 = x.astype(np.float16)  # x - max(x) is rounded in float16, then cast (tinygrad's order)
    close(r.numpy(), tf(torch.tensor(x16 - x16.max(1, keepdims=True)).float(), 1), atol=1e-6)
    r = W(call(fn, Tensor(x).h, 0, tg.FLOAT16))
    assert r.dtype == tg.FLOAT16
    close(r.numpy(), tf(torch.tensor(x), 0), atol=3e-3, rtol=3e-3)
    r = W(call(fn, Tensor(x).h, 0, 0))
    assert r.dtype == tg.FLOAT32
    close(r.numpy(), tf(torch.tensor(x), 0), atol=1e-6)
    expect_error("tg_" + fn, lambda: W(call(fn, Tensor(x).h, 0, tg.INT32)), "float")


case("softmax / log_softmax with a dtype argument", _softmax_dtype)


# =====================================================================================================
# fixed-size selection
def _ref_masked_select(x, m, size, fill):
  sel = x[np.broadcast_to(m, x.shape)]
  out = np.full(size, fill).astype(x.dtype)
  k = min(size, sel.size)
  out[:k] = sel[:k]
  return out


def _masked_select_size():
  for shape, mshape, size, fill in [((3, 4), (3, 4), 5, 0), ((3, 4), (3, 4), 20, -1.5), ((2, 3, 4), (3, 1), 7, 9),
                                    ((6,), (6,), 0, 0), ((0, 3), (0, 3), 4, 2), ((5,), (1,), 3, 7), ((4, 4), (4, 4), 16, 0)]:
    x, m = rnd(*shape), RNG.random(mshape) < 0.5
    ref = _ref_masked_select(x, m, size, fill)
    tx = set_rg(Tensor(x))
    r = W(call("masked_select_size", tx.h, Tensor(m).h, size, float(fill)))
    assert r.dtype == tg.FLOAT32
    close(r.numpy(), ref, what=f"masked_select {shape} {mshape} size={size}")
    if size and x.size:
      wv = RNG.uniform(0.5, 1.5, size=size).astype(np.float32)
      backward((r * Tensor(wv)).sum())
      xt = torch.tensor(x, requires_grad=True)
      sel = torch.masked_select(xt, torch.tensor(m))
      k = min(size, sel.numel())
      (sel[:k] * torch.tensor(wv[:k])).sum().backward()
      close(grad(tx).numpy(), xt.grad, what="grad")
  # integer x, fill converted to its dtype; nothing realized before the result
  xi = np.arange(12, dtype=np.int32).reshape(3, 4)
  m = xi % 3 == 0
  txi, tm = Tensor(xi), Tensor(m)
  tg.counters_reset()
  r = W(call("masked_select_size", txi.h, tm.h, 6, -1.0))
  nz = W(call("nonzero_size", txi.h, 6, -1.0))
  assert tg.counters().kernel_count == 0, "a fixed-size selection realized something"
  assert r.dtype == tg.INT32
  close(nz.numpy()[:, 0], np.array([1, 2, 3, 4, 5, 6]) // 4)
  close(r.numpy(), np.array([0, 3, 6, 9, -1, -1], np.int32))
  expect_error("tg_masked_select_size", lambda: W(call("masked_select_size", Tensor(xi).h, Tensor(xi).h, 3, 0.0)), "bool")
  expect_error("tg_masked_select_size", lambda: W(call("masked_select_size", Tensor(xi).h, Tensor(m).h, -1, 0.0)), "size")
  expect_error("tg_masked_select_size", lambda: W(call("masked_select_size", Tensor(xi).h, Tensor(np.ones(5, bool)).h, 3, 0.0)))


case("masked_select with size / fill_value: values and gradients", _masked_select_size)


def _nonzero_size():
  for shape, size, fill in [((3, 4), 4, 0), ((3, 4), 15, -1), ((2, 3, 2), 5, 7), ((7,), 3, 0), ((0, 2), 3, -2),
                            ((4, 5), 0, 0), ((2, 2), 4, 0)]:
    x = np.where(RNG.random(shape) < 0.4, rnd(*shape), 0).astype(np.float32)
    if shape == (2, 2): x = np.array([[1, 0], [np.nan, 2]], np.float32)  # nan counts as non-zero
    nz = np.argwhere(x != 0)
    ref = np.full((size, len(shape)), fill, np.int32)
    k = min(size, len(nz))
    ref[:k] = nz[:k]
    r = W(call("nonzero_size", Tensor(x).h, size, float(fill)))
    assert r.dtype == tg.INT32, r.dtype
    close(r.numpy(), ref, what=f"nonzero {shape} size={size}")
  r = W(call("nonzero_size", Tensor(np.array(3.0, np.float32)).h, 2, 0.0))
  assert r.shape == (2, 0), r.shape
  r = W(call("nonzero_size", Tensor(np.array([0, 5, 0, 9], np.uint8)).h, 3, 4.0))
  close(r.numpy(), np.array([[1], [3], [4]], np.int32))
  # tinygrad's own results for the documented example
  close(W(call("nonzero_size", Tensor(np.array([[1, 0], [0, 2]], np.int32)).h, 3, -1.0)).numpy(),
        np.array([[0, 0], [1, 1], [-1, -1]], np.int32))


case("nonzero with size / fill_value (int32, as tinygrad)", _nonzero_size)


# =====================================================================================================
# norms and attention
def batchnorm_axes(x, w, b, mean, invstd, axes):
  arr = (_I * max(len(axes), 1))(*axes)
  return W(call("batchnorm_axes", x.h, _h(w), _h(b), mean.h, invstd.h, arr, len(axes)))


def _batchnorm_axes():
  for shape, axes, per_invstd in [((4, 3, 5), (1,), True), ((2, 3, 4, 5), (1, 3), True), ((6, 5), (-1,), True),
                                  ((3, 4, 5), (0, 2), False), ((2, 3, 4), (), False), ((2, 3, 4), (0, 1, 2), True)]:
    kshape = tuple(shape[a] for a in axes)
    bshape = tuple(shape[i] if (i in axes or i - len(shape) in axes) else 1 for i in range(len(shape)))
    x, w, b, m = rnd(*shape), rnd(*kshape), rnd(*kshape), rnd(*kshape)
    iv = RNG.uniform(0.5, 2, size=kshape if per_invstd else bshape).astype(np.float32)

    def ref(x, w, b, m, iv):
      r = (x - m.reshape(bshape)) * w.reshape(bshape)
      return r * (iv.reshape(bshape) if per_invstd else iv) + b.reshape(bshape)
    check_fwd_bwd(lambda x, w, b, m, iv: batchnorm_axes(x, w, b, m, iv, axes), ref, [x, w, b, m, iv], atol=1e-5)
  # no weight / bias; the channel form equals tg_batchnorm's
  x, m, iv = rnd(2, 3, 4), rnd(4), RNG.uniform(0.5, 2, 4).astype(np.float32)
  close(batchnorm_axes(Tensor(x), None, None, Tensor(m), Tensor(iv), [2]).numpy(), (x - m) * iv)
  expect_error("tg_batchnorm_axes", lambda: batchnorm_axes(Tensor(x), None, None, Tensor(rnd(3)), Tensor(iv), [2]), "mean")
  expect_error("tg_batchnorm_axes", lambda: batchnorm_axes(Tensor(x), None, None, Tensor(m), Tensor(iv), [2, -1]), "twice")
  expect_error("tg_batchnorm_axes", lambda: batchnorm_axes(Tensor(x), None, None, Tensor(m), Tensor(iv), [3]))


case("batchnorm over any axes: values and gradients", _batchnorm_axes)


def sdpa(q, k, v, mask=None, is_causal=False, enable_gqa=False):
  return W(call("scaled_dot_product_attention", q.h, k.h, v.h, _h(mask), ctypes.byref(SdpaOpts(is_causal, 0.0, enable_gqa))))


def _torch_sdpa_gqa(q, k, v, mask=None, is_causal=False):
  r = q.shape[-3] // k.shape[-3]
  k, v = k.repeat_interleave(r, dim=-3), v.repeat_interleave(q.shape[-3] // v.shape[-3], dim=-3)
  s = q @ k.transpose(-2, -1) / np.sqrt(q.shape[-1])
  if is_causal: mask = torch.ones(s.shape[-2:], dtype=torch.bool).tril()
  if mask is not None: s = s + (torch.where(mask, 0.0, -float("inf")) if mask.dtype == torch.bool else mask)
  return s.softmax(-1) @ v


def _sdpa_gqa():
  for qs, ks, vs, causal, with_mask in [((2, 4, 5, 8), (2, 2, 6, 8), (2, 2, 6, 3), False, False),
                                        ((1, 6, 4, 4), (1, 3, 4, 4), (1, 3, 4, 4), True, False),
                                        ((2, 8, 3, 4), (2, 1, 5, 4), (2, 1, 5, 4), False, True),
                                        ((4, 3, 6), (2, 3, 6), (2, 3, 6), False, False),
                                        ((2, 2, 3, 4), (2, 2, 3, 4), (2, 2, 3, 4), False, False)]:
    arrs = [rnd(*qs), rnd(*ks), rnd(*vs)]
    mask = RNG.random((qs[-2], ks[-2])) < 0.7 if with_mask else None
    if mask is not None: mask[:, 0] = True
    check_fwd_bwd(lambda q, k, v: sdpa(q, k, v, Tensor(mask) if mask is not None else None, causal, True),
                  lambda q, k, v: _torch_sdpa_gqa(q, k, v, torch.tensor(mask) if mask is not None else None, causal), arrs,
                  atol=1e-5, gatol=2e-5)
  q, k = Tensor(rnd(1, 4, 3, 2)), Tensor(rnd(1, 3, 3, 2))
  expect_error("tg_scaled_dot_product_attention", lambda: sdpa(q, k, k, enable_gqa=True), "multiple")
  expect_error("tg_scaled_dot_product_attention", lambda: sdpa(q, k, k), "batch")  # without enable_gqa heads must broadcast
  expect_error("tg_scaled_dot_product_attention", lambda: sdpa(Tensor(rnd(3, 2)), Tensor(rnd(3, 2)), Tensor(rnd(3, 2)), enable_gqa=True),
               "heads")


case("scaled_dot_product_attention with enable_gqa: values and gradients", _sdpa_gqa)


# =====================================================================================================
# dtype arguments of matmul, dot, linear and einsum
def _np_dot_dtype(x, w, dt):
  """tinygrad 0.14's dot(dtype=): products in the operands' promoted dtype, then cast to dt and summed --
  except where dt is a wider integer, or float32/float64 for 8- and 16-bit floats: those products are exact
  (the operands widened first; measured on tinygrad 0.14: int8 dot dtype=int32 does not wrap, float16 dot
  dtype=float32 equals the float32 product of the widened operands)."""
  w2 = w if w.ndim >= 2 else w[:, None]
  src, to = np.result_type(x, w2), np.dtype(dt)
  wide = (src.kind in "iu" and to.kind in "iu" and to.itemsize > src.itemsize) or \
         (src.kind == "f" and src.itemsize <= 2 and to.kind == "f" and to.itemsize >= 4)
  p = (x.astype(dt)[..., :, None] * w2.astype(dt)) if wide else (x[..., :, None] * w2)  # (..., k, m)
  r = p.astype(dt).sum(-2, dtype=dt)
  return r if w.ndim >= 2 else r[..., 0]


def _matmul_dtype():
  cases = [((3, 5), (5, 4), np.float16, tg.FLOAT32, np.float32), ((2, 3, 6), (6, 2), np.float16, tg.FLOAT64, np.float64),
           ((4, 7), (7, 3), np.float32, tg.FLOAT64, np.float64), ((5,), (5, 3), np.float16, tg.FLOAT32, np.float32),
           ((3, 4), (4,), np.float32, tg.FLOAT64, np.float64)]
  for xs, ws, sdt, tdt, ndt in cases:
    x, w = rnd(*xs).astype(sdt), rnd(*ws).astype(sdt)
    for name in ["matmul_dtype", "dot_dtype"]:
      r = W(call(name, Tensor(x).h, Tensor(w).h, tdt))
      assert r.dtype == tdt, (name, r.dtype)
      close(r.numpy(), _np_dot_dtype(x, w, ndt), atol=1e-6, rtol=1e-6, what=f"{name} {xs} {ws} {sdt}")
  # integers: int8 products summed as int32 are exact (they wrapped in int8; tinygrad 0.14 gives the exact sums)
  x, w = RNG.integers(-100, 100, (4, 6)).astype(np.int8), RNG.integers(-100, 100, (6, 3)).astype(np.int8)
  r = W(call("matmul_dtype", Tensor(x).h, Tensor(w).h, tg.INT32))
  assert r.dtype == tg.INT32
  close(r.numpy(), x.astype(np.int32) @ w.astype(np.int32))
  close(r.numpy(), _np_dot_dtype(x, w, np.int32))
  # int8 summed as float32 too (each product wrapped in int8: 100 * 100 gave 32), by matmul and einsum
  big = np.full((1, 2), 100, np.int8)
  close(W(call("matmul_dtype", Tensor(big).h, Tensor(big.T.copy()).h, tg.FLOAT32)).numpy(), np.array([[20000.0]]))
  close(einsum_dtype("ij,jk->ik", [Tensor(big), Tensor(big.T.copy())], tg.FLOAT32).numpy(), np.array([[20000.0]]))
  # einsum widens by the operands' promoted dtype, as matmul: float16 x float32 into float64 keeps float32
  # products (it widened the float16 operand alone, making one float64 product)
  h, f = np.array([[2047]], np.float16), np.array([[0.1]], np.float32)
  e = einsum_dtype("ij,jk->ik", [Tensor(h), Tensor(f)], tg.FLOAT64).numpy()
  m = W(call("matmul_dtype", Tensor(h).h, Tensor(f).h, tg.FLOAT64)).numpy()
  assert e[0, 0] == m[0, 0] == float(np.float32(2047) * np.float32(0.1)), (e, m)
  # and so does an int8 convolution summed as int32 (tinygrad 0.14: the exact sums)
  xc, wc = RNG.integers(-100, 100, (1, 3, 5, 5)).astype(np.int8), RNG.integers(-100, 100, (2, 3, 3, 3)).astype(np.int8)
  opts = ConvOpts(1, (1, 1), (1, 1), (0, 0, 0, 0), 0, tg.INT32)
  r = W(lib.tg_conv2d(Tensor(xc).h, Tensor(wc).h, NONE_T, ctypes.byref(opts)))
  assert r.dtype == tg.INT32
  close(r.numpy(), F.conv2d(torch.tensor(xc, dtype=torch.float64), torch.tensor(wc, dtype=torch.float64)).numpy())
  r = W(call("matmul_dtype", Tensor(x[0]).h, Tensor(w).h, tg.INT8))  # 1-d @ 2-d keeps the 1-d shape
  assert r.dtype == tg.INT8 and r.shape == (3,), (r.dtype, r.shape)
  close(r.numpy(), _np_dot_dtype(x[0], w, np.int8))
  # gradients flow back to the operands' dtype
  check_fwd_bwd(lambda a, b: W(call("matmul_dtype", a.h, b.h, tg.FLOAT64)), lambda a, b: a.double() @ b.double(),
                [rnd(3, 4), rnd(4, 5)], atol=1e-6)
  # TG_DTYPE_DEFAULT is the plain matmul
  x, w = rnd(3, 4), rnd(4, 2)
  close(W(call("matmul_dtype", Tensor(x).h, Tensor(w).h, 0)).numpy(), x @ w, atol=1e-6)
  expect_error("tg_matmul_dtype", lambda: W(call("matmul_dtype", Tensor(x).h, Tensor(w).h, 99)), "dtype")
  expect_error("tg_dot_dtype", lambda: W(call("dot_dtype", Tensor(x).h, Tensor(x).h, tg.FLOAT64)), "inner")


case("matmul / dot with a dtype argument (tinygrad's accumulation semantics)", _matmul_dtype)


def _linear_dtype():
  x, w, b = rnd(3, 6), rnd(4, 6), rnd(4)
  r = W(call("linear_dtype", Tensor(x).h, Tensor(w).h, Tensor(b).h, tg.FLOAT16))
  assert r.dtype == tg.FLOAT16
  x16, w16, b16 = x.astype(np.float16), w.astype(np.float16), b.astype(np.float16)
  close(r.numpy(), (_np_dot_dtype(x16, w16.T, np.float32) + b16).astype(np.float16), atol=1e-2, rtol=2e-3)
  check_fwd_bwd(lambda x, w, b: W(call("linear_dtype", x.h, w.h, b.h, tg.FLOAT64)),
                lambda x, w, b: F.linear(x.double(), w.double(), b.double()), [x, w, b], atol=1e-6)
  r = W(call("linear_dtype", Tensor(x).h, Tensor(rnd(6)).h, NONE_T, tg.FLOAT64))  # a 1-d weight scales
  assert r.dtype == tg.FLOAT64
  expect_error("tg_linear_dtype", lambda: W(call("linear_dtype", Tensor(x).h, Tensor(w.T.copy()).h, NONE_T, tg.FLOAT64)), "weight")


case("linear with a dtype argument: values and gradients", _linear_dtype)


def einsum_dtype(formula, ts, dt):
  arr = (_T * len(ts))(*[t.h for t in ts])
  return W(call("einsum_dtype", formula.encode(), arr, len(ts), dt))


def _einsum_dtype():
  x, w = RNG.integers(-100, 100, (4, 6)).astype(np.int8), RNG.integers(-100, 100, (6, 3)).astype(np.int8)
  r = einsum_dtype("ij,jk->ik", [Tensor(x), Tensor(w)], tg.INT32)
  assert r.dtype == tg.INT32
  close(r.numpy(), _np_dot_dtype(x, w, np.int32))
  a, b = rnd(2, 3, 4).astype(np.float16), rnd(2, 4, 5).astype(np.float16)
  r = einsum_dtype("bij,bjk->bki", [Tensor(a), Tensor(b)], tg.FLOAT32)
  assert r.dtype == tg.FLOAT32
  # (float16 products into float32 are exact, as tinygrad 0.14's)
  ref = (a.astype(np.float32)[:, :, :, None] * b.astype(np.float32)[:, None, :, :]).sum(2).transpose(0, 2, 1)
  close(r.numpy(), ref, atol=1e-6)
  r = einsum_dtype("ij->ji", [Tensor(rnd(2, 3))], tg.FLOAT64)  # no summation: a cast
  assert r.dtype == tg.FLOAT64
  check_fwd_bwd(lambda p, q: einsum_dtype("ij,jk->ik", [p, q], tg.FLOAT64), lambda p, q: p.double() @ q.double(),
                [rnd(3, 4), rnd(4, 2)], atol=1e-6)
  expect_error("tg_einsum_dtype", lambda: einsum_dtype("ij,jk->ik", [Tensor(x)], tg.INT32), "operand")


case("einsum with a dtype argument: values and gradients", _einsum_dtype)


# =====================================================================================================
# conv2d(dtype=): tinygrad's accumulation dtype of a convolution (tg_conv2d_opts / tg_conv_transpose2d_opts
# / tg_window_opts .dtype)
def conv2d_dt(x, w, b=None, dtype=0, groups=0, stride=0, dilation=0, padding=None):
  if padding is None: pads, npad = (0, 0, 0, 0), 0
  elif isinstance(padding, int): pads, npad = (padding, 0, 0, 0), 1
  else: pads, npad = tuple(padding) + (0,) * (4 - len(padding)), len(padding)
  o = ConvOpts(groups, (stride, 0), (dilation, 0), pads, npad, dtype)
  return W(call("conv2d", x.h, w.h, _h(b), ctypes.byref(o)))


def conv_transpose2d_dt(x, w, b=None, dtype=0, groups=0, stride=0, padding=0, output_padding=0):
  o = ConvTOpts(groups, (stride, 0), (0, 0), (padding, 0, 0, 0), 1, (output_padding, 0), 1, dtype)
  return W(call("conv_transpose2d", x.h, w.h, _h(b), ctypes.byref(o)))


def _tg_conv_inputs():
  """Deterministic inputs of the tinygrad 0.14 reference below (int8 products fit in int8, the sums do not)."""
  xi = ((np.arange(1 * 4 * 5 * 5).reshape(1, 4, 5, 5) * 7) % 23 - 11).astype(np.int8)
  wi = ((np.arange(3 * 4 * 3 * 3).reshape(3, 4, 3, 3) * 5) % 21 - 10).astype(np.int8)
  bi = np.array([100, -100, 7], np.int8)
  xh = (((np.arange(1 * 2 * 5 * 6).reshape(1, 2, 5, 6) * 37) % 101) / 16.0 - 3.1).astype(np.float16)
  wh = (((np.arange(4 * 2 * 3 * 3).reshape(4, 2, 3, 3) * 53) % 97) / 32.0 - 1.45).astype(np.float16)
  bh = np.array([0.5, -0.25, 1.0, 2.0], np.float16)
  return xi, wi, bi, xh, wh, bh


# tinygrad 0.14 (DEV=CPU): Tensor(xi).conv2d(Tensor(wi), Tensor(bi), padding=1, dtype=dtypes.int32) -> int32 (1, 3, 5, 5)
TG_CONV_I32 = [111, -298, 137, 204, 155, -95, 523, 226, -163, 56, 82, -134, 305, 284, 7, 121, 290, 16, -97, 188, -9, -6, 8,
               -162, -19, 22, -78, -21, 151, -144, -25, -115, -190, -150, -147, -82, -76, -174, -249, -223, -70, 78, -250,
               66, -69, -275, -32, -42, 40, 69, -75, 71, -208, -372, 53, 100, 163, 16, 191, -64, -212, -89, -52, 8, 295,
               235, -226, 64, 32, -82, -45, 39, 47, -60, -145]
# Tensor(xi).conv2d(Tensor(wi2), stride=2, dtype=dtypes.int32) -> (1, 3, 2, 2), wi2 the weight below
TG_CONV_I32_S2 = [423, -263, 190, -197, -15, -50, 178, 166, 156, 184, -233, 25]
# Tensor(xh).conv2d(Tensor(wh), Tensor(bh), padding=(1, 0), dtype=dtypes.float32) -> float32 (1, 4, 5, 4), bit patterns
TG_CONV_F32_BITS = [
    1083046187, 3208190888, 3210019624, 1090824006, 1095412650, 3234444545, 1089656350, 3233348680, 3237374540, 1076436820,
    1083924211, 3231626604, 3235652211, 1088449026, 3234556390, 1082073624, 1092117271, 3221162348, 1065815796, 1088213597,
    3210908912, 1077400648, 3240742516, 1093228473, 1094783616, 3246240711, 1084364298, 1084310013, 1084381903, 3246209624,
    1100410201, 3246264396, 3246230133, 1084385471, 1084331186, 3246233318, 3231058263, 1093230213, 3240803151, 1077216399,
    3236318406, 1089198612, 1069884176, 3217573008, 1078120920, 1083054500, 3233549144, 1089339584, 1092013268, 3230547927,
    1084902356, 1078146603, 1084304501, 3232299258, 1090554450, 3233464398, 3242412966, 1091389182, 3199611216, 3194749608,
    1046556608, 1083326846, 1083174894, 3233116690, 3234215482, 1093146126, 3235491122, 1085978897, 1086297510, 1082674619,
    3233359647, 1093034832, 1093193691, 3235396232, 1086073978, 1082451068, 3231326615, 1077284157, 1085761070, 3236992900]


def _conv_dtype_tinygrad():
  xi, wi, bi, xh, wh, bh = _tg_conv_inputs()
  r = conv2d_dt(Tensor(xi), Tensor(wi), Tensor(bi), dtype=tg.INT32, padding=1)
  assert r.dtype == tg.INT32 and r.shape == (1, 3, 5, 5), (r.dtype, r.shape)
  assert r.numpy().ravel().tolist() == TG_CONV_I32
  wi2 = ((np.arange(4 * 3 * 3 * 3).reshape(3, 4, 3, 3) * 5) % 21 - 10).astype(np.int8)
  r = conv2d_dt(Tensor(xi), Tensor(wi2), dtype=tg.INT32, stride=2)
  assert r.numpy().ravel().tolist() == TG_CONV_I32_S2
  want = np.array(TG_CONV_F32_BITS, np.uint32).view(np.float32)
  for wino in (0, 1):
    with tg.context(WINO=wino):
      r = conv2d_dt(Tensor(xh), Tensor(wh), Tensor(bh), dtype=tg.FLOAT32, padding=(1, 0))
      assert r.dtype == tg.FLOAT32 and r.shape == (1, 4, 5, 4), (r.dtype, r.shape)
      close(r.numpy().ravel(), want, atol=2e-6 if not wino else 1e-4, rtol=1e-6, what=f"float16 -> float32 WINO={wino}")


case("conv2d(dtype=) equals tinygrad 0.14's own results (int8 -> int32, float16 -> float32)", _conv_dtype_tinygrad)


def _conv_int_default_dtype():
  # without dtype= the result of an integer or bool convolution is the sum's accumulation dtype, as
  # tinygrad 0.14's conv2d(...).dtype (DEV=CPU): int8 -> int32 (the values above), uint8 -> uint32,
  # bool -> int32; it was cast back to int8 and wrapped
  xi, wi, bi, _, _, _ = _tg_conv_inputs()
  r = conv2d_dt(Tensor(xi), Tensor(wi), Tensor(bi), padding=1)
  assert r.dtype == tg.INT32 and r.numpy().ravel().tolist() == TG_CONV_I32, r.dtype
  r = conv2d_dt(Tensor(np.abs(xi).astype(np.uint8)), Tensor(np.abs(wi).astype(np.uint8)))
  assert r.dtype == tg.UINT32 and r.numpy().ravel()[:4].tolist() == [1121, 1070, 1071, 1076], r.dtype
  r = conv2d_dt(Tensor(xi > 0), Tensor(wi > 0))
  assert r.dtype == tg.INT32 and r.numpy().ravel()[:4].tolist() == [10, 9, 7, 6], r.dtype
  # dtype=int8, the operands' own, is tinygrad's sum(dtype=int8): summed in int8, wrapping
  r = conv2d_dt(Tensor(xi), Tensor(wi), dtype=tg.INT8, padding=1)
  want = (np.array(TG_CONV_I32).reshape(1, 3, 5, 5) - bi.astype(np.int64).reshape(1, 3, 1, 1)).astype(np.int8)
  assert r.dtype == tg.INT8 and np.array_equal(r.numpy(), want), r.dtype


case("an integer or bool conv2d without dtype= keeps its accumulation dtype, as tinygrad's", _conv_int_default_dtype)


def _torch_conv2d_ref(x, w, b, kw):
  """The exact convolution of the values (float64); None options as torch's defaults."""
  r = F.conv2d(torch.tensor(x.astype(np.float64)), torch.tensor(w.astype(np.float64)),
               None if b is None else torch.tensor(b.astype(np.float64)), stride=kw.get("stride") or 1,
               padding=kw.get("padding") or 0, dilation=kw.get("dilation") or 1, groups=kw.get("groups") or 1)
  return r.numpy()


def _conv_dtype_values():
  # products exact in the operands' dtype (small integers, halves computed in float32), so the exact
  # convolution is the reference; the result has the sum's dtype, then promoted with the bias's
  ints = lambda *s, lo=-11, hi=12, dt=np.int8: RNG.integers(lo, hi, s).astype(dt)  # noqa: E731
  cases = [((2, 4, 7, 6), (8, 4, 3, 3), {"padding": 1}), ((1, 4, 8, 9), (6, 2, 3, 2), {"groups": 2, "stride": 2}),
           ((2, 3, 9, 9), (4, 3, 2, 3), {"dilation": 2, "padding": 2}), ((1, 16, 6, 6), (8, 16, 3, 3), {})]
  for xs, ws, kw in cases:
    for with_bias in (False, True):
      x, w = ints(*xs), ints(*ws)
      b = ints(ws[0]) if with_bias else None
      r = conv2d_dt(Tensor(x), Tensor(w), Tensor(b) if with_bias else None, dtype=tg.INT32, **kw)
      assert r.dtype == tg.INT32, r.dtype
      ref = _torch_conv2d_ref(x, w, b, kw)
      assert np.array_equal(r.numpy(), ref.astype(np.int32)), f"int8 -> int32 {xs} {ws} {kw}"
      assert np.abs(ref).max() > 127  # the int8 sum would have wrapped
      xu, wu = ints(*xs, lo=0, hi=16, dt=np.uint8), ints(*ws, lo=0, hi=16, dt=np.uint8)
      r = conv2d_dt(Tensor(xu), Tensor(wu), dtype=tg.INT64, **kw)
      assert r.dtype == tg.INT64
      assert np.array_equal(r.numpy(), _torch_conv2d_ref(xu, wu, None, kw).astype(np.int64)), f"uint8 -> int64 {xs}"
      for tdt, ndt in ((tg.FLOAT32, np.float32), (tg.FLOAT64, np.float64)):
        xh, wh = rnd(*xs).astype(np.float16), rnd(*ws).astype(np.float16)
        bh = rnd(ws[0]).astype(np.float16) if with_bias else None
        r = conv2d_dt(Tensor(xh), Tensor(wh), Tensor(bh) if with_bias else None, dtype=tdt, **kw)
        assert r.dtype == tdt, (r.dtype, tdt)
        close(r.numpy(), _torch_conv2d_ref(xh, wh, bh, kw).astype(ndt), atol=1e-5 if ndt == np.float32 else 1e-12,
              rtol=1e-6, what=f"float16 -> {ndt.__name__} {xs} {ws} {kw}")
  # float32 -> float64: values and gradients (back in float32), direct and through WINO's tiles
  for wino in (0, 1):
    with tg.context(WINO=wino):
      for xs, ws, kw in [((2, 3, 7, 6), (8, 3, 3, 3), {"padding": 1}), ((1, 4, 6, 6), (4, 2, 3, 3), {"groups": 2})]:
        check_fwd_bwd(lambda x, w, b: conv2d_dt(x, w, b, dtype=tg.FLOAT64, **kw),
                      lambda x, w, b: F.conv2d(x.double(), w.double(), b.double(), **kw),
                      [rnd(*xs), rnd(*ws), rnd(ws[0])], atol=1e-5 if wino else 1e-6, gatol=1e-4 if wino else 1e-5)
        x, w = Tensor(rnd(*xs)), Tensor(rnd(*ws))
        assert conv2d_dt(x, w, dtype=tg.FLOAT64, **kw).dtype == tg.FLOAT64
  with tg.context(WINO=1):  # the tiles honour it: their transforms and channel sums are kernels of their own
    x, w = Tensor(rnd(2, 3, 8, 8)).realize(), Tensor(rnd(4, 3, 3, 3)).realize()
    assert kernels(lambda: conv2d_dt(x, w, dtype=tg.FLOAT64)) >= 4
    xi, wi = Tensor(ints(2, 3, 8, 8)).realize(), Tensor(ints(4, 3, 3, 3)).realize()
    assert kernels(lambda: conv2d_dt(xi, wi, dtype=tg.INT32)) == 1  # integer sums: direct
  # TG_DTYPE_DEFAULT and the promoted dtype itself are the plain convolution
  x, w = rnd(2, 3, 6, 6), rnd(4, 3, 3, 3)
  plain = conv2d_dt(Tensor(x), Tensor(w)).numpy()
  same = conv2d_dt(Tensor(x), Tensor(w), dtype=tg.FLOAT32)
  assert same.dtype == tg.FLOAT32 and np.array_equal(same.numpy(), plain)
  r = conv2d_dt(Tensor(x.astype(np.float16)), Tensor(w.astype(np.float16)), dtype=tg.FLOAT16)
  assert r.dtype == tg.FLOAT16
  assert np.array_equal(r.numpy(), conv2d_dt(Tensor(x.astype(np.float16)), Tensor(w.astype(np.float16))).numpy())


case("conv2d(dtype=): integer and float16 inputs summed in a wider dtype, values, gradients, WINO", _conv_dtype_values)


def _conv_transpose_nd_dtype():
  ints = lambda *s: RNG.integers(-11, 12, s).astype(np.int8)  # noqa: E731
  for xs, ws, kw in [((2, 4, 5, 5), (4, 3, 3, 3), {"stride": 2, "padding": 1, "output_padding": 1}),
                     ((1, 4, 4, 6), (4, 2, 3, 3), {"groups": 2})]:
    x, w, b = ints(*xs), ints(*ws), ints(ws[1] * kw.get("groups", 1))
    r = conv_transpose2d_dt(Tensor(x), Tensor(w), Tensor(b), dtype=tg.INT32, **kw)
    assert r.dtype == tg.INT32
    ref = F.conv_transpose2d(torch.tensor(x).double(), torch.tensor(w).double(), torch.tensor(b).double(), **kw).numpy()
    assert np.array_equal(r.numpy(), ref.astype(np.int32)) and np.abs(ref).max() > 127, f"conv_transpose2d int8 {xs}"
    xh, wh = rnd(*xs).astype(np.float16), rnd(*ws).astype(np.float16)
    r = conv_transpose2d_dt(Tensor(xh), Tensor(wh), dtype=tg.FLOAT32, **kw)
    assert r.dtype == tg.FLOAT32
    close(r.numpy(), F.conv_transpose2d(torch.tensor(xh).double(), torch.tensor(wh).double(), **kw).numpy(), atol=1e-5,
          rtol=1e-6, what=f"conv_transpose2d float16 -> float32 {xs}")
  # float32 -> float64 transposed: values and gradients
  check_fwd_bwd(lambda x, w: conv_transpose2d_dt(x, w, dtype=tg.FLOAT64, stride=2),
                lambda x, w: F.conv_transpose2d(x.double(), w.double(), stride=2), [rnd(1, 3, 4, 4), rnd(3, 2, 3, 3)],
                atol=1e-6)
  # n-d: tg_conv_nd / tg_conv_transpose_nd (3 spatial dims: the generic window form) and tg_conv2d with a 1-d weight
  x, w = ints(1, 3, 4, 5, 4), ints(4, 3, 2, 3, 2)
  r = conv_nd(Tensor(x), Tensor(w), padding=1, dtype=tg.INT32)
  assert r.dtype == tg.INT32
  ref = F.conv3d(torch.tensor(x).double(), torch.tensor(w).double(), padding=1).numpy()
  assert np.array_equal(r.numpy(), ref.astype(np.int32)) and np.abs(ref).max() > 127
  wt = ints(3, 2, 2, 2, 2)
  r = conv_transpose_nd(Tensor(x), Tensor(wt), stride=(2, 1, 2), dtype=tg.INT32)
  ref = F.conv_transpose3d(torch.tensor(x).double(), torch.tensor(wt).double(), stride=(2, 1, 2)).numpy()
  assert r.dtype == tg.INT32 and np.array_equal(r.numpy(), ref.astype(np.int32))
  xh, wh = rnd(2, 3, 9).astype(np.float16), rnd(4, 3, 3).astype(np.float16)
  r = conv2d_dt(Tensor(xh), Tensor(wh), dtype=tg.FLOAT32, padding=1)
  assert r.dtype == tg.FLOAT32
  close(r.numpy(), F.conv1d(torch.tensor(xh).double(), torch.tensor(wh).double(), padding=1).numpy(), atol=1e-5, rtol=1e-6)
  r = conv_nd(Tensor(xh), Tensor(wh), dtype=tg.FLOAT64)
  assert r.dtype == tg.FLOAT64
  close(r.numpy(), F.conv1d(torch.tensor(xh).double(), torch.tensor(wh).double()).numpy(), atol=1e-12, rtol=1e-12)
  # errors name the function; a pool takes no dtype
  x, w = Tensor(rnd(1, 2, 5, 5)), Tensor(rnd(3, 2, 3, 3))
  expect_error("tg_conv2d", lambda: conv2d_dt(x, w, dtype=99), "dtype")
  expect_error("tg_conv2d", lambda: conv2d_dt(x, w, dtype=-3), "dtype")
  expect_error("tg_conv_transpose2d", lambda: conv_transpose2d_dt(x, Tensor(rnd(2, 3, 3, 3)), dtype=99), "dtype")
  expect_error("tg_conv_nd", lambda: conv_nd(x, w, dtype=99), "dtype")
  expect_error("tg_conv_transpose_nd", lambda: conv_transpose_nd(x, Tensor(rnd(2, 3, 3, 3)), dtype=99), "dtype")
  expect_error("tg_max_pool_nd", lambda: max_pool_nd(x, 2, dtype=tg.FLOAT64), "dtype")
  expect_error("tg_avg_pool_nd", lambda: avg_pool_nd(x, 2, dtype=tg.FLOAT64), "dtype")


case("conv_transpose2d / conv_nd / conv_transpose_nd with a dtype; bad dtypes are errors", _conv_transpose_nd_dtype)


# =====================================================================================================
# Newton-Schulz and the Muon optimizer (reference: tinygrad's algorithm written out in torch, float64)
MUON_COEFS = (3.4445, -4.775, 2.0315)


def ref_newton_schulz(x, steps, coefs, eps=1e-7):
  if x.shape[-2] > x.shape[-1]: return ref_newton_schulz(x.transpose(-2, -1), steps, coefs, eps).transpose(-2, -1)
  g = x / (x.square().sum((-2, -1), keepdim=True).sqrt() + eps)
  for _ in range(steps):
    acc = 0
    for i, c in enumerate(coefs):
      t = g
      for _ in range(i): t = (g @ g.transpose(-2, -1)) @ t
      acc = acc + c * t
    g = acc
  return g


def newton_schulz(x, steps, coefs, eps=1e-7):
  arr = (_D * len(coefs))(*coefs)
  return W(call("newton_schulz", x.h, steps, arr, len(coefs), eps))


def _newton_schulz():
  for shape, steps, coefs in [((4, 6), 5, MUON_COEFS), ((7, 3), 5, MUON_COEFS), ((2, 3, 5), 3, (2, -1.5, 0.5)),
                              ((5, 5), 1, (1.5, -0.5)), ((3, 4), 0, MUON_COEFS), ((1, 8), 2, (3.0,))]:
    x = rnd(*shape)
    r = newton_schulz(Tensor(x), steps, coefs)
    close(r.numpy(), ref_newton_schulz(torch.tensor(x, dtype=torch.float64), steps, coefs), atol=2e-5, what=f"ns {shape}")
  # Muon's quintic drives every singular value of a random matrix into about [0.68, 1.13]
  x = rnd(16, 32)
  sv = np.linalg.svd(newton_schulz(Tensor(x), 5, MUON_COEFS).numpy().astype(np.float64), compute_uv=False)
  assert sv.min() > 0.6 and sv.max() < 1.25, sv
  # differentiable (a composition of matmuls)
  check_fwd_bwd(lambda t: newton_schulz(t, 2, (2, -1.5, 0.5)), lambda t: ref_newton_schulz(t, 2, (2, -1.5, 0.5)), [rnd(3, 4)],
                atol=1e-5, gatol=1e-4)
  expect_error("tg_newton_schulz", lambda: newton_schulz(Tensor(rnd(4)), 5, MUON_COEFS), "dims")
  expect_error("tg_newton_schulz", lambda: newton_schulz(Tensor(rnd(4, 4)), -1, MUON_COEFS), "steps")


case("newton_schulz (tinygrad's): values, singular values, gradient", _newton_schulz)


def ref_muon(params, grads_fn, steps, lr=0.001, momentum=0.95, wd=0.1, ns_steps=5, coefs=MUON_COEFS, nesterov=True):
  """tinygrad's LARS._step with Muon's settings (classic=False, pre_wd=False, tcoef=0), in float64."""
  ps = [torch.tensor(p, dtype=torch.float64) for p in params]
  bufs = [torch.zeros_like(p) for p in ps]
  hist = []
  for _ in range(steps):
    gs = grads_fn(ps)
    for i, (p, g) in enumerate(zip(ps, gs)):
      if momentum:
        bufs[i] = momentum * bufs[i] + g
        g = g + momentum * bufs[i] if nesterov else bufs[i]
      g = ref_newton_schulz(g.reshape(g.shape[0], -1), ns_steps, coefs).reshape(g.shape)
      g = g * lr
      if wd > 0: g = g + wd * lr * p
      ps[i] = p - g
    hist.append([p.numpy().copy() for p in ps])
  return hist


def _muon_loss_consts():
  r = np.random.default_rng(7)
  return [r.uniform(-1, 1, s).astype(np.float32) for s in [(4, 6), (6, 3), (5,)]]


def _muon_grads(consts):
  def f(ps):
    tps = [p.clone().requires_grad_(True) for p in ps]
    c = [torch.tensor(x, dtype=torch.float64) for x in consts]
    loss = (torch.sin(tps[0]) * c[0]).sum() + ((tps[1] - c[1]) ** 2).sum() + (tps[2] ** 2 * c[2]).sum() + tps[0].sum() * tps[2].sum()
    loss.backward()
    return [t.grad for t in tps]
  return f


def _muon_loss_tg(ps, consts):
  c = [Tensor(x) for x in consts]
  d = ps[1] - c[1]
  return (ps[0].unary("sin") * c[0]).sum() + (d * d).sum() + (ps[2] * ps[2] * c[2]).sum() + ps[0].sum() * ps[2].sum()


def _muon():
  consts = _muon_loss_consts()
  init = [np.random.default_rng(3).uniform(-1, 1, s).astype(np.float32) for s in [(4, 6), (6, 3), (5,)]]
  for kw, o in [({}, None), ({"lr": 0.02}, muon_opts(lr=0.02)),
                ({"lr": 0.05, "momentum": 0.9, "wd": 0.0, "nesterov": False}, muon_opts(lr=0.05, momentum=0.9, weight_decay=0.0, nesterov=False)),
                ({"lr": 0.01, "momentum": 0.0, "wd": 0.2, "ns_steps": 3, "coefs": (2.0, -1.5, 0.5)},
                 muon_opts(lr=0.01, momentum=0.0, weight_decay=0.2, ns_steps=3, coefs=(2.0, -1.5, 0.5)))]:
    ref = ref_muon(init, _muon_grads(consts), 3, **kw)
    ps = [Tensor(a).persist() for a in init]
    for p in ps: set_rg(p)
    arr = (_T * 3)(*[p.h for p in ps])
    op = lib.tg_optim_muon(arr, 3, ctypes.byref(o) if o is not None else None)
    try:
      if not op: tg._raise("tg_optim_muon")
      with tg.context(TRAINING=1):
        for step in range(3):
          with tg.scope():
            lib.tg_optim_zero_grad(op)
            backward(_muon_loss_tg(ps, consts))
            assert lib.tg_optim_step(op) == 0, tg.last_error()
          for i, p in enumerate(ps): close(p.numpy(), ref[step][i], atol=2e-5, what=f"Muon {kw} step {step} param {i}")
    finally:
      lib.tg_optim_free(op)
      for p in ps: p.free()
  # a 0-d parameter has no (shape[0], -1) view
  p0 = set_rg(Tensor(np.float32(1.0)))
  assert not lib.tg_optim_muon((_T * 1)(p0.h), 1, None)
  msg = tg.last_error()
  lib.tg_clear_error()
  assert "tg_optim_muon" in msg and "0-d" in msg, msg
  bad = muon_opts(lr=0.01, momentum=0.0, weight_decay=0.0, ns_steps=0, coefs=(float("inf"),))
  assert not lib.tg_optim_muon((_T * 1)(set_rg(Tensor(rnd(2, 2))).h), 1, ctypes.byref(bad))
  msg = tg.last_error()
  lib.tg_clear_error()
  assert "ns_coefficients" in msg, msg


case("Muon optimizer: 3 steps against tinygrad's algorithm (defaults, lr, no nesterov / wd, custom NS)", _muon)


# =====================================================================================================
# fp8 dtypes. The reference is written from the formats with tinygrad's choices: nearest, ties to the
# even code, finite values saturate to the largest code. OCP e4m3 has no inf (inf and nan -> nan 0x7f |
# sign) and saturates to 448; OCP e5m2 keeps inf / nan (nan -> 0x7f | sign) and saturates to 57344. The
# fnuz formats (AMD's: bias 8 / 16, max 240 / 57344) use every exponent for finite values; 0x80 is their
# one NaN, they have no inf (inf and nan -> 0x80) and no -0 (a zero result is 0x00).
from fractions import Fraction  # noqa: E402

FP8 = {tg.FP8E4M3: (3, 7, "e4m3"), tg.FP8E5M2: (2, 15, "ieee"),  # mantissa bits, bias, kind
       tg.FP8E4M3FNUZ: (3, 8, "fnuz"), tg.FP8E5M2FNUZ: (2, 16, "fnuz")}


def fp8_decode(b, dt):
  m_bits, bias, kind = FP8[dt]
  if kind == "fnuz" and b == 0x80: return float("nan")
  emax = (1 << (7 - m_bits)) - 1
  e, m, neg = (b >> m_bits) & emax, b & ((1 << m_bits) - 1), b & 0x80
  if kind == "ieee" and e == emax: v = float("nan") if m else float("inf")
  elif kind == "e4m3" and e == emax and m == (1 << m_bits) - 1: v = float("nan")
  elif e == 0: v = m * 2.0 ** (1 - bias - m_bits)
  else: v = (m | (1 << m_bits)) * 2.0 ** (e - bias - m_bits)
  return -v if neg else v


def _finite_codes(dt):
  codes = [c for c in range(0x80) if np.isfinite(fp8_decode(c, dt))]
  return codes, [fp8_decode(c, dt) for c in codes]


def fp8_encode(x, dt):
  """float (double) -> fp8 bits: the nearest finite code, ties to the even code (saturating)."""
  kind = FP8[dt][2]
  neg = 0x80 if np.signbit(x) else 0
  if kind == "fnuz" and not np.isfinite(x): return 0x80
  if np.isnan(x): return neg | 0x7f
  if np.isinf(x): return neg | (0x7c if kind == "ieee" else 0x7f)
  codes, vals = _finite_codes(dt)
  a = Fraction(abs(float(x)))
  import bisect
  i = bisect.bisect_left(vals, float(a))
  best = None
  for j in (i - 1, i):
    if 0 <= j < len(vals):
      d = abs(Fraction(vals[j]) - a)
      if best is None or d < best[0] or (d == best[0] and codes[j] % 2 == 0): best = (d, codes[j])
  return 0 if kind == "fnuz" and best[1] == 0 else neg | best[1]


def _fp8_probe_values(dt):
  """float32 probes: every finite fp8 value, the midpoints between neighbours, one float32 ulp either
  side of each midpoint, the overflow thresholds, inf / nan, float32 subnormals; with both signs."""
  _, vals = _finite_codes(dt)
  vals = sorted(set(vals))
  big = vals[-1]
  nxt = big + (big - vals[-2])  # the next value the format would have
  mids = [(a + b) / 2 for a, b in zip(vals, vals[1:])] + [(big + nxt) / 2]
  ps = list(vals) + mids
  for m in mids:
    m32 = np.float32(m)
    ps += [np.nextafter(m32, np.float32(0)), np.nextafter(m32, np.float32(np.inf))]
  ps += [nxt, nxt * 1.5, 1e5, 3e38, np.float32(1e-45), np.float32(1e-40), np.inf, np.nan]
  ps = np.array(ps, np.float32)
  return np.concatenate([ps, -ps])


def _fp8_devices():
  """CPU, CPU:LLVM and, where this machine has one, CL (a device with float64 computes fp8)."""
  devs = ["CPU", "CPU:LLVM"]
  with tg.scope():
    try:
      if float(Tensor(np.array([2.0], np.float32), device="CL").cast(tg.FP8E4M3FNUZ).numpy()[0]) == 2.0: devs.append("CL")
    except Exception:  # noqa: BLE001 (no OpenCL device)
      pass
  lib.tg_clear_error()
  return devs


# sha256 of tinygrad 0.14's conversions of the fnuz formats (tinygrad.dtype's fp8_to_float of the 256
# codes as float32, then float_to_fp8 of every _fp8_probe_values probe), computed once with tinygrad
# itself: the reference above agrees with tinygrad's own code, not only with this file's reading of it.
TINYGRAD_FNUZ_SHA256 = {tg.FP8E4M3FNUZ: "22659bfadf4cefaabca1f3246f79f87aefcf544a7042ee4e74b5ee92b1d0638c",
                        tg.FP8E5M2FNUZ: "0f54b76402abdf7cbcad306160c4e8eb1fd4f618af472aae74f11acf6bc9ed18"}


def _fp8_reference_is_tinygrads():
  import hashlib
  for dt, want in TINYGRAD_FNUZ_SHA256.items():
    dec = np.array([fp8_decode(b, dt) for b in range(256)], np.float32)
    enc = np.array([fp8_encode(float(v), dt) for v in _fp8_probe_values(dt)], np.uint8)
    got = hashlib.sha256(dec.tobytes() + enc.tobytes()).hexdigest()
    assert got == want, (tg.DTYPE_NAMES[dt], got)


case("fp8 fnuz reference: tinygrad 0.14's fp8_to_float / float_to_fp8 on every code and probe", _fp8_reference_is_tinygrads)


def _fp8_casts_exhaustive(dev):
  for dt in FP8:
    name = f"{tg.DTYPE_NAMES[dt]} on {dev}"
    assert lib.tg_dtype_itemsize(dt) == 1 and lib.tg_dtype_is_float(dt)
    assert lib.tg_dtype_name(dt).decode() == tg.DTYPE_NAMES[dt], lib.tg_dtype_name(dt)
    # every bit pattern -> float32 (the kernel's conversion), bit for bit (NaN's too, 0x7fc00000 for fnuz)
    bits = np.arange(256, dtype=np.uint8)
    got = Tensor(bits, device=dev).bitcast(dt).cast(tg.FLOAT32).numpy()
    ref = np.array([fp8_decode(int(b), dt) for b in bits], np.float32)
    bad = np.nonzero(got.view(np.uint32) != ref.view(np.uint32))[0]
    assert bad.size == 0, f"{name} -> float32: codes {bad[:5]} give {got[bad[:5]]}, reference {ref[bad[:5]]}"
    # float32 -> fp8 (kernel), every code round-trips and every rounding boundary is right
    ps = _fp8_probe_values(dt)
    got = Tensor(ps, device=dev).cast(dt).bitcast(tg.UINT8).numpy()
    ref = np.array([fp8_encode(float(v), dt) for v in ps], np.uint8)
    bad = np.nonzero(got != ref)[0]
    assert bad.size == 0, f"{name}: float32 {ps[bad[:5]]} -> {got[bad[:5]]}, reference {ref[bad[:5]]}"
    rt = Tensor(bits, device=dev).bitcast(dt).cast(tg.FLOAT32).cast(dt).bitcast(tg.UINT8).numpy()
    nan = np.isnan(np.array([fp8_decode(int(b), dt) for b in bits]))
    assert np.array_equal(rt[~nan], bits[~nan]), f"{name}: a code does not round-trip"
    # float64 -> fp8 rounds once from the double (not through float32): just above a tie goes up
    _, vals = _finite_codes(dt)
    tie = (vals[9] + vals[10]) / 2
    for v in [tie + tie * 2.0 ** -40, tie - tie * 2.0 ** -40, tie, -tie, -2.0 ** -30, 1e300, -np.inf, np.nan]:
      g = int(Tensor(np.array([v], np.float64), device=dev).cast(dt).bitcast(tg.UINT8).numpy()[0])
      assert g == fp8_encode(v, dt), (name, v, g, fp8_encode(v, dt))
    # host-side stores (tg_full) use the same rounding
    for v in [0.3, -1000.0, 1e-6, -1e-9, 244.0, 248.0, 460.0, 465.0, 60000.0, 62000.0, float("inf"), float("nan")]:
      g = int(Tensor.full((2,), v, dtype=dt, device=dev).bitcast(tg.UINT8).numpy()[0])
      assert g == fp8_encode(v, dt), (name, "full", v, g, fp8_encode(v, dt))
    # integers -> fp8
    ints = np.array([0, 1, -3, 17, 240, 248, 255, 448, 449, 1000, -70000], np.int32)
    g = Tensor(ints, device=dev).cast(dt).bitcast(tg.UINT8).numpy()
    close(g, np.array([fp8_encode(float(v), dt) for v in ints], np.uint8), what=f"int32 -> {name}")
    # fp8 -> fp8 goes through the value (no -0 / NaN code is carried over as bits)
    for dt2 in FP8:
      g = Tensor(bits, device=dev).bitcast(dt).cast(dt2).bitcast(tg.UINT8).numpy()
      want = np.array([fp8_encode(fp8_decode(int(b), dt), dt2) for b in bits], np.uint8)
      bad = np.nonzero(g != want)[0]
      assert bad.size == 0, f"{name} -> {tg.DTYPE_NAMES[dt2]}: codes {bad[:5]} give {g[bad[:5]]}, want {want[bad[:5]]}"


for _dev in _fp8_devices():
  case(f"fp8 casts on {_dev}: all 256 codes, every rounding boundary, saturation, inf / nan, float64, int and fp8 "
       "sources, OCP and fnuz", _fp8_casts_exhaustive, _dev)


def _fp8_promotion():
  P = lambda a, b: lib.tg_dtype_promote(a, b)  # noqa: E731
  E4, E5 = tg.FP8E4M3, tg.FP8E5M2
  for a, b, r in [(E4, E5, tg.FLOAT16), (E4, E4, E4), (tg.INT32, E4, E4), (tg.UINT8, E5, E5), (tg.BOOL, E4, E4),
                  (tg.INT64, E5, E5), (E4, tg.FLOAT16, tg.FLOAT16), (E5, tg.BFLOAT16, tg.BFLOAT16),
                  (E4, tg.FLOAT32, tg.FLOAT32), (E5, tg.FLOAT64, tg.FLOAT64)]:
    assert P(a, b) == r and P(b, a) == r, (a, b, P(a, b), r)
  # the fnuz fp8s (tinygrad 0.14's least_upper_dtype): an fp8 of another format meets them at half
  Z4, Z5 = tg.FP8E4M3FNUZ, tg.FP8E5M2FNUZ
  for a, b, r in [(Z4, Z5, tg.FLOAT16), (Z4, Z4, Z4), (Z5, Z5, Z5), (Z4, E4, tg.FLOAT16), (Z4, E5, tg.FLOAT16),
                  (Z5, E4, tg.FLOAT16), (Z5, E5, tg.FLOAT16), (tg.INT8, Z4, Z4), (tg.UINT64, Z5, Z5), (tg.BOOL, Z5, Z5),
                  (Z4, tg.BFLOAT16, tg.BFLOAT16), (Z5, tg.FLOAT16, tg.FLOAT16), (Z4, tg.FLOAT32, tg.FLOAT32),
                  (Z5, tg.FLOAT64, tg.FLOAT64)]:
    assert P(a, b) == r and P(b, a) == r, (a, b, P(a, b), r)
  # a Python-float scalar keeps the fp8 dtype (weak float below the fp8s)
  for dt in FP8:
    x = Tensor(np.array([1.0, 2.5, -3.0], np.float32)).cast(dt)
    assert (x * 2.0).dtype == dt and (x + Tensor(np.array([1], np.int32))).dtype == dt


case("fp8 promotion rules (tinygrad's lattice)", _fp8_promotion)


def _fp8_arith():
  for dt in FP8:
    name = tg.DTYPE_NAMES[dt]
    codes, vals = _finite_codes(dt)
    allv = np.array(vals + [-v for v in vals], np.float32)
    rng = np.random.default_rng(5)
    a = rng.choice(allv, 600).astype(np.float32)
    b = rng.choice(allv, 600).astype(np.float32)
    ta, tb = Tensor(a).cast(dt), Tensor(b).cast(dt)
    enc = np.vectorize(lambda v: fp8_encode(float(v), dt))
    for op, f in [("+", np.add), ("*", np.multiply), ("-", np.subtract)]:
      r = {"+": ta + tb, "*": ta * tb, "-": ta - tb}[op]
      assert r.dtype == dt
      ref = enc(f(a, b).astype(np.float32))  # computed in float32, rounded once to fp8
      got = r.bitcast(tg.UINT8).numpy()
      bad = np.nonzero(got != ref)[0]
      assert bad.size == 0, f"{name} {a[bad[:3]]} {op} {b[bad[:3]]}: {got[bad[:3]]} != {ref[bad[:3]]}"
    # a chain rounds after every op, as a true fp8 computation does
    r = (ta * tb + ta).bitcast(tg.UINT8).numpy()
    step = np.array([fp8_decode(int(c), dt) for c in enc(a * b)], np.float32)
    close(r, enc((step + a).astype(np.float32)), what=f"{name} chain")
    # reductions accumulate in float32 and round once (tinygrad's sum of fp8 keeps the fp8 dtype)
    s = ta.sum()
    assert s.dtype == dt
    assert int(s.bitcast(tg.UINT8).numpy()) == fp8_encode(float(np.sum(a.astype(np.float64))), dt) or \
        abs(float(s.numpy()) - float(a.sum())) <= abs(float(a.sum())) * 2 ** -3
    # mean: summed and scaled in float32, rounded once (tinygrad's numerator.div(n).cast(dtype))
    mu = ta.mean()
    assert mu.dtype == dt
    assert int(mu.bitcast(tg.UINT8).numpy()) == fp8_encode(float(np.float32(a.astype(np.float64).sum()) * np.float32(1 / a.size)), dt)
    # exp goes through float32
    e = Tensor(np.array([0.5, -1.0, 2.0], np.float32)).cast(dt).exp()
    assert e.dtype == dt
    close(e.bitcast(tg.UINT8).numpy(), enc(np.exp(np.array([fp8_decode(fp8_encode(v, dt), dt) for v in [0.5, -1.0, 2.0]], np.float32))))


case("fp8 arithmetic through float32: +, -, * of random codes, chains, sum, exp", _fp8_arith)


# =====================================================================================================
def main(): return tg.run_cases(CASES, "test_nd_args_torch")


if __name__ == "__main__":
  sys.exit(main())
