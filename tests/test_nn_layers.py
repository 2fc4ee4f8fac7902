"""test_nn_layers.py -- differential tests of the nn layers, initializers, optimizers and model-state
helpers (src/nn/layers.c, src/nn/optim.c) against PyTorch.

Layers: our layer is initialised, its parameters are copied into the torch.nn layer, the same input
goes through both; the outputs and the gradients (of the input and of every parameter) of
sum(out * w) must match. BatchNorm also in training mode over several steps (running statistics,
num_batches_tracked) and in eval. Initializers: bounds and moments of the distributions tinygrad
uses. Optimizers: SGD / Adam / AdamW against torch.optim over 5 steps of a loss whose gradient
depends on the parameters; LARS, LAMB and classic SGD against a numpy transcription of tinygrad's
optim.py. State: tg_load_state_dict strict errors (missing / unexpected / mis-shaped keys, nothing
written), a torch state_dict loaded into our model gives torch's outputs, tg_state_dict_parameters.
Every case runs in its own tg scope; tg_live_count() must be back to its start at the end.
Last line: "test_nn_layers: N passed, N failed"; exit 1 on any failure.

Run: /usr/bin/python3 tests/test_nn_layers.py   (TINYGRAD_LIB selects the library; TEST_FILTER=substr)
"""
import contextlib
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
from torchcheck import backward, grad, set_rg, status as _check  # noqa: E402

torch.set_num_threads(1)
RNG = np.random.default_rng(4321)

# ---- prototypes of the nn section of include/tinygrad.h ------------------------------------------
_I, _I64, _B, _D, _S, _P = ctypes.c_int, ctypes.c_int64, ctypes.c_bool, ctypes.c_double, ctypes.c_char_p, ctypes.c_void_p
_i64p, _intp, _tp = ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_int), ctypes.POINTER(_T)
_i64x2, _i64x4 = ctypes.c_int64 * 2, ctypes.c_int64 * 4


class Opts(ctypes.Structure):
  _fields_ = [("dtype", _I), ("device", _S), ("requires_grad", ctypes.c_int8)]


class ConvOpts(ctypes.Structure):
  _fields_ = [("groups", _I64), ("stride", _i64x2), ("dilation", _i64x2), ("padding", _i64x4), ("npadding", _I), ("dtype", _I)]


class ConvTOpts(ctypes.Structure):
  _fields_ = [("groups", _I64), ("stride", _i64x2), ("dilation", _i64x2), ("padding", _i64x4), ("npadding", _I),
              ("output_padding", _i64x2), ("noutput_padding", _I), ("dtype", _I)]


class Conv1dOpts(ctypes.Structure):
  _fields_ = [("stride", _I64), ("padding", _I64), ("dilation", _I64), ("groups", _I64), ("output_padding", _I64)]


# The C option macros fill in tinygrad's defaults; these Python builders do the same with keyword defaults.
class NormOpts(ctypes.Structure):
  _fields_ = [("eps", _D), ("affine", _B)]
  def __init__(self, eps=1e-5, affine=True): super().__init__(eps, affine)


class RMSNormOpts(ctypes.Structure):
  _fields_ = [("eps", _D), ("affine", _B)]
  def __init__(self, eps=1e-6, affine=True): super().__init__(eps, affine)


class BatchNormOpts(ctypes.Structure):
  _fields_ = [("eps", _D), ("affine", _B), ("track_running_stats", _B), ("momentum", _D), ("unsynced", _B), ("dist", _B)]
  def __init__(self, eps=1e-5, affine=True, track_running_stats=True, momentum=0.1):
    super().__init__(eps, affine, track_running_stats, momentum)


class Linear_(ctypes.Structure):
  _fields_ = [("in_features", _I64), ("out_features", _I64), ("weight", _T), ("bias", _T)]


class Conv2d_(ctypes.Structure):
  _fields_ = [("in_channels", _I64), ("out_channels", _I64), ("kernel_size", _i64x2), ("opts", ConvOpts), ("weight", _T),
              ("bias", _T)]


class ConvT2d_(ctypes.Structure):
  _fields_ = [("in_channels", _I64), ("out_channels", _I64), ("kernel_size", _i64x2), ("opts", ConvTOpts), ("weight", _T),
              ("bias", _T)]


class Conv1d_(ctypes.Structure):
  _fields_ = [("in_channels", _I64), ("out_channels", _I64), ("kernel_size", _I64), ("opts", Conv1dOpts), ("weight", _T),
              ("bias", _T)]


class BatchNorm_(ctypes.Structure):
  _fields_ = [("num_features", _I64), ("eps", _D), ("momentum", _D), ("affine", _B), ("track_running_stats", _B),
              ("weight", _T), ("bias", _T), ("running_mean", _T), ("running_var", _T), ("num_batches_tracked", _T)]


class GroupNorm_(ctypes.Structure):
  _fields_ = [("num_groups", _I64), ("num_channels", _I64), ("eps", _D), ("weight", _T), ("bias", _T)]


class LayerNorm_(ctypes.Structure):
  _fields_ = [("ndim", _I), ("normalized_shape", ctypes.c_int64 * 8), ("eps", _D), ("weight", _T), ("bias", _T)]


class RMSNorm_(ctypes.Structure):
  _fields_ = [("dim", _I64), ("eps", _D), ("weight", _T)]


class Embedding_(ctypes.Structure):
  _fields_ = [("vocab_size", _I64), ("embed_size", _I64), ("weight", _T)]


class LSTMCell_(ctypes.Structure):
  _fields_ = [("input_size", _I64), ("hidden_size", _I64), ("weight_ih", _T), ("weight_hh", _T), ("bias_ih", _T),
              ("bias_hh", _T)]


class SGDOpts(ctypes.Structure):
  _fields_ = [("lr", _D), ("momentum", _D), ("weight_decay", _D), ("nesterov", _B), ("classic", _B)]
  def __init__(self, lr=0.001, momentum=0.0, weight_decay=0.0, nesterov=False, classic=False):
    super().__init__(lr, momentum, weight_decay, nesterov, classic)


class LARSOpts(ctypes.Structure):
  _fields_ = [("lr", _D), ("momentum", _D), ("weight_decay", _D), ("tcoef", _D), ("nesterov", _B), ("classic", _B)]
  def __init__(self, lr=0.001, momentum=0.9, weight_decay=1e-4, tcoef=0.001, nesterov=False, classic=True):
    super().__init__(lr, momentum, weight_decay, tcoef, nesterov, classic)


class AdamOpts(ctypes.Structure):
  _fields_ = [("lr", _D), ("b1", _D), ("b2", _D), ("eps", _D)]
  def __init__(self, lr=0.001, b1=0.9, b2=0.999, eps=1e-8): super().__init__(lr, b1, b2, eps)


class AdamWOpts(ctypes.Structure):
  _fields_ = [("lr", _D), ("b1", _D), ("b2", _D), ("eps", _D), ("weight_decay", _D)]
  def __init__(self, lr=0.001, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.01): super().__init__(lr, b1, b2, eps, weight_decay)


class LAMBOpts(ctypes.Structure):
  _fields_ = [("lr", _D), ("b1", _D), ("b2", _D), ("eps", _D), ("weight_decay", _D)]
  def __init__(self, lr=0.001, b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.0): super().__init__(lr, b1, b2, eps, weight_decay)


_optp, _ctp = ctypes.POINTER(Opts), ctypes.POINTER(ConvTOpts)
_SIGS = {
    "tg_kaiming_uniform": (_T, [_i64p, _I, _D, _optp]), "tg_kaiming_normal": (_T, [_i64p, _I, _D, _optp]),
    "tg_glorot_uniform": (_T, [_i64p, _I, _optp]), "tg_scaled_uniform": (_T, [_i64p, _I, _optp]),
    "tg_randperm": (_T, [_I64, _optp]), "tg_rand_like": (_T, [_T, _optp]), "tg_randn_like": (_T, [_T, _optp]),
    "tg_conv_transpose2d": (_T, [_T, _T, _T, _ctp]), "tg_conv2d": (_T, [_T, _T, _T, ctypes.POINTER(ConvOpts)]),
    "tg_set_requires_grad": (_T, [_T, _B]), "tg_requires_grad": (_B, [_T]), "tg_backward": (_I, [_T]), "tg_grad": (_T, [_T]),
    "tg_zero_grad": (None, [_T]),
    # state dicts
    "tg_state_dict_new": (_P, []), "tg_state_dict_free": (None, [_P]), "tg_state_dict_len": (_I, [_P]),
    "tg_state_dict_name": (_S, [_P, _I]), "tg_state_dict_tensor": (_T, [_P, _I]), "tg_state_dict_get": (_T, [_P, _S]),
    "tg_state_dict_set": (_I, [_P, _S, _T]), "tg_load_state_dict": (_I, [_P, _P, _B]),
    "tg_state_dict_parameters": (_I, [_P, _B, _tp, _I]),
    # optimizers
    "tg_optim_sgd": (_P, [_tp, _I, ctypes.POINTER(SGDOpts)]), "tg_optim_lars": (_P, [_tp, _I, ctypes.POINTER(LARSOpts)]),
    "tg_optim_adam": (_P, [_tp, _I, ctypes.POINTER(AdamOpts)]), "tg_optim_adamw": (_P, [_tp, _I, ctypes.POINTER(AdamWOpts)]),
    "tg_optim_lamb": (_P, [_tp, _I, ctypes.POINTER(LAMBOpts)]), "tg_optim_zero_grad": (None, [_P]),
    "tg_optim_schedule_step": (_I, [_P, _tp, _I]), "tg_optim_step": (_I, [_P]), "tg_optim_set_lr": (_I, [_P, _D]),
    "tg_optim_get_lr": (_D, [_P]), "tg_optim_lr": (_T, [_P]), "tg_optim_state": (_I, [_P, _P, _S]),
    "tg_optim_free": (None, [_P]),
}
_LAYERS = {  # name: (struct, init argtypes after the struct pointer, forward kind)
    "linear": (Linear_, [_I64, _I64, _B]),
    "conv2d": (Conv2d_, [_I64, _I64, _i64p, _B, ctypes.POINTER(ConvOpts)]),
    "conv_transpose2d": (ConvT2d_, [_I64, _I64, _i64p, _B, _ctp]),
    "conv1d": (Conv1d_, [_I64, _I64, _I64, _B, ctypes.POINTER(Conv1dOpts)]),
    "conv_transpose1d": (Conv1d_, [_I64, _I64, _I64, _B, ctypes.POINTER(Conv1dOpts)]),
    "batchnorm": (BatchNorm_, [_I64, ctypes.POINTER(BatchNormOpts)]),
    "groupnorm": (GroupNorm_, [_I64, _I64, ctypes.POINTER(NormOpts)]),
    "instancenorm": (GroupNorm_, [_I64, ctypes.POINTER(NormOpts)]),
    "layernorm": (LayerNorm_, [_i64p, _I, ctypes.POINTER(NormOpts)]),
    "layernorm2d": (LayerNorm_, [_I64, ctypes.POINTER(NormOpts)]),
    "rmsnorm": (RMSNorm_, [_I64, ctypes.POINTER(RMSNormOpts)]),
    "embedding": (Embedding_, [_I64, _I64]),
    "lstmcell": (LSTMCell_, [_I64, _I64, _B]),
}
for _name, (_st, _args) in _LAYERS.items():
  _SIGS[f"tg_nn_{_name}_init"] = (_I, [ctypes.POINTER(_st)] + _args)
  _SIGS[f"tg_nn_{_name}_state"] = (_I, [ctypes.POINTER(_st), _P, _S])
  _SIGS[f"tg_nn_{_name}_free"] = (None, [ctypes.POINTER(_st)])
  if _name != "lstmcell": _SIGS[f"tg_nn_{_name}_forward"] = (_T, [ctypes.POINTER(_st), _T])
_SIGS["tg_nn_lstmcell_forward"] = (_I, [ctypes.POINTER(LSTMCell_), _T, _T, _T, _tp, _tp])
for _n, (_r, _a) in _SIGS.items():
  _f = getattr(lib, _n)
  _f.restype, _f.argtypes = _r, _a

W = Tensor._wrap
NONE_T = _T(0)


def _tarr(ts): return (_T * max(len(ts), 1))(*[t.h if isinstance(t, Tensor) else t for t in ts])
def _shape(s): return (ctypes.c_int64 * max(len(s), 1))(*s), len(s)
def _h(t): return t.h if t is not None else NONE_T
def opts(dtype=0, requires_grad=None):  # None: TG_GRAD_UNSET
  return ctypes.byref(Opts(dtype, None, -1 if requires_grad is None else int(bool(requires_grad))))


# ---- layers --------------------------------------------------------------------------------------
LIVE_LAYERS = []


class Layer:
  """A tg_nn_<kind> layer: Layer(kind, *init_args). Freed by free() (the test harness frees leftovers)."""

  def __init__(self, kind, *args):
    self.kind = kind
    self.s = _LAYERS[kind][0]()
    _check(f"tg_nn_{kind}_init", getattr(lib, f"tg_nn_{kind}_init")(ctypes.byref(self.s), *args))
    LIVE_LAYERS.append(self)

  def __call__(self, x): return W(call(f"nn_{self.kind}_forward", ctypes.byref(self.s), x.h))

  def p(self, name):
    h = getattr(self.s, name)
    return None if h.id == 0 else W(h)  # borrowed: owned by the layer

  def state(self, sd, prefix=""): _check(f"tg_nn_{self.kind}_state", getattr(lib, f"tg_nn_{self.kind}_state")(ctypes.byref(self.s), sd.p, prefix.encode()))

  def free(self):
    getattr(lib, f"tg_nn_{self.kind}_free")(ctypes.byref(self.s))
    if self in LIVE_LAYERS: LIVE_LAYERS.remove(self)


class StateDict:
  def __init__(self):
    self.p = lib.tg_state_dict_new()

  def set(self, name, t): _check("tg_state_dict_set", lib.tg_state_dict_set(self.p, name.encode(), t.h))
  def get(self, name):
    h = lib.tg_state_dict_get(self.p, name.encode())
    return None if h.id == 0 else W(h)
  def names(self): return [lib.tg_state_dict_name(self.p, i).decode() for i in range(lib.tg_state_dict_len(self.p))]
  def free(self): lib.tg_state_dict_free(self.p)


@contextlib.contextmanager
def state_dict():
  sd = StateDict()
  try:
    yield sd
  finally:
    sd.free()


def load_state_dict(model, loaded, strict=True): _check("tg_load_state_dict", lib.tg_load_state_dict(model.p, loaded.p, strict))


def parameters(sd, trainable_only=True):
  n = _check("tg_state_dict_parameters", lib.tg_state_dict_parameters(sd.p, trainable_only, None, 0))
  out = (_T * max(n, 1))()
  _check("tg_state_dict_parameters", lib.tg_state_dict_parameters(sd.p, trainable_only, out, n))
  return [W(out[i]) for i in range(n)]


def np_of(t): return t.numpy().copy()


def copy_into_torch(layer, tmod, names):
  with torch.no_grad():
    for ours, theirs in names.items():
      getattr(tmod, theirs).copy_(torch.tensor(layer.p(ours).numpy()))


# ---- comparison ------------------------------------------------------------------------------------
CASES = []


def case(name, fn, *args, **kw): CASES.append((name, fn, args, kw))


def rnd(*shape, lo=-2.0, hi=2.0): return RNG.uniform(lo, hi, size=shape).astype(np.float32)


def close(ours, ref, atol=1e-5, rtol=1e-4, what="value"):
  ref = ref.detach().cpu().numpy() if isinstance(ref, torch.Tensor) else np.asarray(ref)
  ours = np.asarray(ours)
  if ours.shape != ref.shape: raise AssertionError(f"{what}: shape {ours.shape} != reference {ref.shape}")
  np.testing.assert_allclose(ours.astype(np.float64), ref.astype(np.float64), atol=atol, rtol=rtol, err_msg=what)


def expect_error(fn_name, f, *substrs):
  try:
    r = f()
  except TGError as e:
    msg = str(e)
    if fn_name not in msg: raise AssertionError(f"error message does not name {fn_name}: {msg!r}")
    for s in substrs:
      if s not in msg: raise AssertionError(f"error message lacks {s!r}: {msg!r}")
    return msg
  raise AssertionError(f"expected an error from {fn_name}, got {r!r}")


def check_layer(layer, tmod, pmap, x_np, atol=1e-5, rtol=1e-4, int_input=False, fwd=None, tfwd=None):
  """Copies our parameters into tmod (pmap: our name -> torch name), runs both on x, compares the
  output and the gradients of sum(out * w) w.r.t. x (if float) and every parameter."""
  copy_into_torch(layer, tmod, pmap)
  x = Tensor(x_np)
  if not int_input: set_rg(x)
  out = fwd(x) if fwd else layer(x)
  tx = torch.tensor(x_np, requires_grad=not int_input)
  ref = tfwd(tx) if tfwd else tmod(tx)
  wv = RNG.uniform(0.5, 1.5, size=tuple(ref.shape)).astype(np.float32)
  backward((out * Tensor(wv)).sum())
  (ref * torch.tensor(wv)).sum().backward()
  close(out.numpy(), ref, atol, rtol, "forward")
  if not int_input: close(grad(x).numpy(), tx.grad, atol, rtol, "grad of input")
  for ours, theirs in pmap.items():
    tp = getattr(tmod, theirs)
    if tp.grad is None: continue
    close(grad(layer.p(ours)).numpy(), tp.grad, atol * 10, rtol * 10, f"grad of {ours}")


# =====================================================================================================
# Linear
for (inf, outf, bias, xs) in [(5, 4, True, (3, 5)), (5, 4, False, (3, 5)), (3, 7, True, (2, 4, 3)), (1, 1, True, (6, 1)),
                              (8, 2, True, (8,))]:
  def _lin(inf=inf, outf=outf, bias=bias, xs=xs):
    l = Layer("linear", inf, outf, bias)
    assert Tensor._wrap(l.s.weight).shape == (outf, inf)
    assert (l.s.bias.id != 0) == bias
    tm = torch.nn.Linear(inf, outf, bias=bias)
    check_layer(l, tm, {"weight": "weight", **({"bias": "bias"} if bias else {})}, rnd(*xs))
    l.free()
  case(f"Linear({inf}, {outf}, bias={bias}) on {xs}", _lin)

# Conv2d
for (cin, cout, k, kw) in [(3, 4, (3, 3), {}), (2, 6, (3, 2), dict(stride=(2, 1), padding=(1, 0))),
                           (4, 4, (3, 3), dict(groups=2, padding=1)), (2, 3, (2, 2), dict(dilation=2, stride=2)),
                           (3, 2, (1, 1), dict(bias=False)), (4, 8, (3, 3), dict(groups=4, padding=2, dilation=2))]:
  def _conv(cin=cin, cout=cout, k=k, kw=kw):
    stride, padding, dilation, groups = kw.get("stride", 1), kw.get("padding", 0), kw.get("dilation", 1), kw.get("groups", 1)
    bias = kw.get("bias", True)
    pair = lambda v: (v, v) if isinstance(v, int) else v  # noqa: E731
    o = ConvOpts(groups, pair(stride), pair(dilation), (*pair(padding), 0, 0), 2)
    l = Layer("conv2d", cin, cout, _shape(k)[0], bias, ctypes.byref(o))
    assert Tensor._wrap(l.s.weight).shape == (cout, cin // groups, *k)
    tm = torch.nn.Conv2d(cin, cout, k, stride=stride, padding=padding, dilation=dilation, groups=groups, bias=bias)
    check_layer(l, tm, {"weight": "weight", **({"bias": "bias"} if bias else {})}, rnd(2, cin, 9, 8), atol=1e-4)
    l.free()
  case(f"Conv2d({cin}, {cout}, {k}, {kw})", _conv)

# Conv1d / ConvTranspose1d
for (cin, cout, k, kw) in [(3, 4, 3, {}), (2, 4, 3, dict(stride=2, padding=1)), (4, 6, 2, dict(groups=2, dilation=2)),
                           (2, 2, 1, dict(bias=False))]:
  def _c1(cin=cin, cout=cout, k=k, kw=kw):
    stride, padding, dilation, groups = kw.get("stride", 1), kw.get("padding", 0), kw.get("dilation", 1), kw.get("groups", 1)
    bias = kw.get("bias", True)
    l = Layer("conv1d", cin, cout, k, bias, ctypes.byref(Conv1dOpts(stride, padding, dilation, groups, 0)))
    assert Tensor._wrap(l.s.weight).shape == (cout, cin // groups, k)
    tm = torch.nn.Conv1d(cin, cout, k, stride=stride, padding=padding, dilation=dilation, groups=groups, bias=bias)
    check_layer(l, tm, {"weight": "weight", **({"bias": "bias"} if bias else {})}, rnd(2, cin, 11), atol=1e-4)
    l.free()
  case(f"Conv1d({cin}, {cout}, {k}, {kw})", _c1)

for (cin, cout, k, kw) in [(3, 4, 3, {}), (2, 4, 3, dict(stride=2, padding=1, output_padding=1)), (4, 6, 2, dict(groups=2, dilation=2)),
                           (2, 3, 4, dict(stride=3, padding=2, bias=False))]:
  def _ct1(cin=cin, cout=cout, k=k, kw=kw):
    stride, padding, dilation, groups = kw.get("stride", 1), kw.get("padding", 0), kw.get("dilation", 1), kw.get("groups", 1)
    op, bias = kw.get("output_padding", 0), kw.get("bias", True)
    l = Layer("conv_transpose1d", cin, cout, k, bias, ctypes.byref(Conv1dOpts(stride, padding, dilation, groups, op)))
    assert Tensor._wrap(l.s.weight).shape == (cin, cout // groups, k)
    tm = torch.nn.ConvTranspose1d(cin, cout, k, stride=stride, padding=padding, output_padding=op, dilation=dilation,
                                  groups=groups, bias=bias)
    check_layer(l, tm, {"weight": "weight", **({"bias": "bias"} if bias else {})}, rnd(2, cin, 7), atol=1e-4)
    l.free()
  case(f"ConvTranspose1d({cin}, {cout}, {k}, {kw})", _ct1)

# ConvTranspose2d layer and functional
for (cin, cout, k, kw) in [(3, 4, (3, 3), {}), (2, 4, (3, 3), dict(stride=2, padding=1, output_padding=1)),
                           (4, 6, (2, 3), dict(groups=2, dilation=(2, 1))), (2, 2, (3, 2), dict(stride=(2, 3), padding=(1, 0), output_padding=(1, 2))),
                           (4, 4, (3, 3), dict(stride=2, groups=4, bias=False))]:
  def _ct2(cin=cin, cout=cout, k=k, kw=kw):
    pair = lambda v: (v, v) if isinstance(v, int) else tuple(v)  # noqa: E731
    stride, padding, dilation = pair(kw.get("stride", 1)), pair(kw.get("padding", 0)), pair(kw.get("dilation", 1))
    groups, op, bias = kw.get("groups", 1), pair(kw.get("output_padding", 0)), kw.get("bias", True)
    o = ConvTOpts(groups, stride, dilation, (*padding, 0, 0), 2, op, 2)
    l = Layer("conv_transpose2d", cin, cout, _shape(k)[0], bias, ctypes.byref(o))
    assert Tensor._wrap(l.s.weight).shape == (cin, cout // groups, *k)
    tm = torch.nn.ConvTranspose2d(cin, cout, k, stride=stride, padding=padding, output_padding=op, dilation=dilation,
                                  groups=groups, bias=bias)
    check_layer(l, tm, {"weight": "weight", **({"bias": "bias"} if bias else {})}, rnd(2, cin, 5, 6), atol=1e-4)
    l.free()
  case(f"ConvTranspose2d({cin}, {cout}, {k}, {kw})", _ct2)


def _convt_functional():
  # padding forms (4-tuple = left, right, top, bottom), negative effective padding, 1x1 input
  x_np, w_np, b_np = rnd(1, 2, 4, 3), rnd(2, 3, 3, 3), rnd(3)
  for pads, npad, tpad in [((1, 0, 0, 0), 1, 1), ((2, 1, 0, 0), 2, (2, 1)), ((2, 2, 1, 1), 4, (1, 2)), ((0, 0, 0, 0), 0, 0)]:
    x, w, b = set_rg(Tensor(x_np)), set_rg(Tensor(w_np)), set_rg(Tensor(b_np))
    o = ConvTOpts(1, (2, 2), (1, 1), pads, npad, (1, 0), 1)
    out = W(call("conv_transpose2d", x.h, w.h, b.h, ctypes.byref(o)))
    tx, tw, tb = (torch.tensor(a, requires_grad=True) for a in (x_np, w_np, b_np))
    ref = F.conv_transpose2d(tx, tw, tb, stride=2, padding=tpad, output_padding=1)
    backward(out.sum())
    ref.sum().backward()
    close(out.numpy(), ref, 1e-4, what=f"forward pads={pads}")
    for ours, theirs, nm in [(x, tx, "x"), (w, tw, "w"), (b, tb, "b")]: close(grad(ours).numpy(), theirs.grad, 1e-4, what=f"grad {nm}")
  r = W(call("conv_transpose2d", Tensor(rnd(1, 1, 1, 1)).h, Tensor(rnd(1, 1, 2, 2)).h, NONE_T, None))
  assert r.shape == (1, 1, 2, 2)
  expect_error("tg_conv_transpose2d", lambda: W(call("conv_transpose2d", Tensor(rnd(1, 3, 4, 4)).h, Tensor(rnd(2, 3, 3, 3)).h,
                                                     NONE_T, None)), "channels")
  expect_error("tg_conv_transpose2d", lambda: W(call("conv_transpose2d", Tensor(rnd(1, 2, 4, 4)).h, Tensor(rnd(2, 3, 3, 3)).h,
                                                     NONE_T, ctypes.byref(ConvTOpts(0, (0, 0), (0, 0), (0, 0, 0, 0), 0, (1, 2), 0)))),
               "noutput_padding")


case("tg_conv_transpose2d functional: padding forms, grads, errors", _convt_functional)


# BatchNorm
def bn_torch_of(l, tm):
  with torch.no_grad():
    if l.p("weight") is not None:
      tm.weight.copy_(torch.tensor(l.p("weight").numpy()))
      tm.bias.copy_(torch.tensor(l.p("bias").numpy()))


for shape, affine, track in [((4, 3), True, True), ((2, 3, 5, 4), True, True), ((3, 2, 6), False, True), ((2, 3, 4, 4), True, False)]:
  def _bn_train(shape=shape, affine=affine, track=track):
    C = shape[1]
    l = Layer("batchnorm", C, ctypes.byref(BatchNormOpts(affine=affine, track_running_stats=track, momentum=0.2)))
    tm = {2: torch.nn.BatchNorm1d, 3: torch.nn.BatchNorm1d, 4: torch.nn.BatchNorm2d}[len(shape)](C, momentum=0.2, affine=affine,
                                                                                                   track_running_stats=track)
    # perturb the affine parameters so they matter
    if affine:
      with tg.scope():
        l.p("weight").assign(Tensor(rnd(C, lo=0.5, hi=1.5))).realize()
        l.p("bias").assign(Tensor(rnd(C))).realize()
    bn_torch_of(l, tm)
    tm.train()
    with tg.context(TRAINING=1):
      for step in range(3):
        x_np = rnd(*shape) * (step + 1) + step
        x = set_rg(Tensor(x_np))
        out = l(x)
        tx = torch.tensor(x_np, requires_grad=True)
        ref = tm(tx)
        wv = rnd(*shape, lo=0.5, hi=1.5)
        backward((out * Tensor(wv)).sum())
        (ref * torch.tensor(wv)).sum().backward()
        close(out.numpy(), ref, 1e-4, 1e-4, f"forward step {step}")
        close(grad(x).numpy(), tx.grad, 1e-4, 1e-3, f"grad x step {step}")
        if affine:
          close(grad(l.p("weight")).numpy(), tm.weight.grad, 1e-3, 1e-3, "grad weight")
          close(grad(l.p("bias")).numpy(), tm.bias.grad, 1e-3, 1e-3, "grad bias")
          lib.tg_zero_grad(l.s.weight), lib.tg_zero_grad(l.s.bias)
          tm.weight.grad = None
          tm.bias.grad = None
    if track:
      close(l.p("running_mean").numpy(), tm.running_mean, 1e-5, 1e-4, "running_mean")
      close(l.p("running_var").numpy(), tm.running_var, 1e-4, 1e-4, "running_var")
      assert l.p("num_batches_tracked").numpy() == 3 == tm.num_batches_tracked.item()
      assert l.p("num_batches_tracked").dtype == tg.INT64
    else:
      assert l.s.running_mean.id == 0 and l.p("num_batches_tracked").numpy() == 0
    # eval: running statistics (or batch statistics without tracking)
    tm.eval()
    x_np = rnd(*shape) * 3 + 1
    close(l(Tensor(x_np)).numpy(), tm(torch.tensor(x_np)), 1e-4, 1e-4, "eval forward")
    l.free()
  case(f"BatchNorm {shape} affine={affine} track_running_stats={track}: train 3 steps + eval vs torch", _bn_train)


def _bn_errors_and_init():
  l = Layer("batchnorm", 3, None)
  close(l.p("weight").numpy(), np.ones(3)), close(l.p("bias").numpy(), np.zeros(3))
  close(l.p("running_mean").numpy(), np.zeros(3)), close(l.p("running_var").numpy(), np.ones(3))
  assert l.s.eps == 1e-5 and abs(l.s.momentum - 0.1) < 1e-12
  assert lib.tg_requires_grad(l.s.weight) and lib.tg_requires_grad(l.s.bias)
  assert not lib.tg_requires_grad(l.s.running_mean) and not lib.tg_requires_grad(l.s.running_var)
  # each parameter has its own buffer: writing the weight does not change running_var (both start as ones)
  l.p("weight").assign(Tensor(np.full(3, 7, np.float32))).realize()
  close(l.p("running_var").numpy(), np.ones(3), what="running_var after writing weight")
  expect_error("tg_nn_batchnorm_forward", lambda: l(Tensor(rnd(2, 4))), "channels")
  with tg.context(TRAINING=1):
    expect_error("tg_nn_batchnorm_forward", lambda: l(Tensor(rnd(1, 3))), "more than one value")
  # an empty batch in training, as PyTorch: an empty output, the running statistics unchanged, one
  # more batch counted (it was the "more than one value" error)
  tm = torch.nn.BatchNorm1d(3)
  tm.train()
  ty = tm(torch.zeros(0, 3, 4))
  rm, rv, nb = l.p("running_mean").numpy().copy(), l.p("running_var").numpy().copy(), l.p("num_batches_tracked").numpy().item()
  with tg.context(TRAINING=1):
    y = l(Tensor(np.zeros((0, 3, 4), np.float32)))
    assert y.shape == tuple(ty.shape) == (0, 3, 4), y.shape
  close(l.p("running_mean").numpy(), rm, what="running_mean after an empty batch")
  close(l.p("running_var").numpy(), rv, what="running_var after an empty batch")
  assert l.p("num_batches_tracked").numpy().item() == nb + 1 and tm.num_batches_tracked.item() == 1
  l.free()
  expect_error("tg_nn_batchnorm_forward", lambda: l(Tensor(rnd(2, 3))), "not initialised")
  expect_error("tg_nn_batchnorm_init", lambda: Layer("batchnorm", 0, None), "num_features")


case("BatchNorm: init values, own buffers, requires_grad flags, errors", _bn_errors_and_init)

# GroupNorm / InstanceNorm / LayerNorm / LayerNorm2d / RMSNorm
for G, C, shape, affine in [(2, 6, (3, 6, 4, 4), True), (3, 3, (2, 3, 5), True), (1, 4, (2, 4, 3, 2), False), (4, 8, (2, 8), True)]:
  def _gn(G=G, C=C, shape=shape, affine=affine):
    l = Layer("groupnorm", G, C, ctypes.byref(NormOpts(1e-5, affine)))
    if affine:
      l.p("weight").assign(Tensor(rnd(C))).realize()
      l.p("bias").assign(Tensor(rnd(C))).realize()
    tm = torch.nn.GroupNorm(G, C, eps=1e-5, affine=affine)
    check_layer(l, tm, {"weight": "weight", "bias": "bias"} if affine else {}, rnd(*shape) * 2 + 1, 1e-4, 1e-3)
    l.free()
  case(f"GroupNorm({G}, {C}) on {shape} affine={affine}", _gn)

for C, shape in [(3, (2, 3, 4, 5)), (2, (4, 2, 7))]:
  def _in(C=C, shape=shape):
    l = Layer("instancenorm", C, None)
    assert l.s.weight.id and l.s.bias.id  # tinygrad: affine by default
    l.p("weight").assign(Tensor(rnd(C))).realize()
    l.p("bias").assign(Tensor(rnd(C))).realize()
    tm = (torch.nn.InstanceNorm2d if len(shape) == 4 else torch.nn.InstanceNorm1d)(C, affine=True)
    check_layer(l, tm, {"weight": "weight", "bias": "bias"}, rnd(*shape) * 2 + 1, 1e-4, 1e-3)
    l.free()
  case(f"InstanceNorm({C}) on {shape}", _in)

for ns, shape, affine, eps in [((5,), (3, 5), True, 1e-5), ((4,), (2, 3, 4), True, 1e-3), ((3, 4), (2, 3, 4), True, 1e-5),
                               ((6,), (2, 6), False, 1e-5)]:
  def _ln(ns=ns, shape=shape, affine=affine, eps=eps):
    arr, n = _shape(ns)
    l = Layer("layernorm", arr, n, ctypes.byref(NormOpts(eps, affine)))
    if affine:
      l.p("weight").assign(Tensor(rnd(*ns))).realize()
      l.p("bias").assign(Tensor(rnd(*ns))).realize()
    tm = torch.nn.LayerNorm(ns, eps=eps, elementwise_affine=affine)
    check_layer(l, tm, {"weight": "weight", "bias": "bias"} if affine else {}, rnd(*shape) * 3, 1e-4, 1e-3)
    l.free()
  case(f"LayerNorm({ns}) on {shape} affine={affine} eps={eps}", _ln)


def _ln_errors():
  arr, n = _shape((4,))
  l = Layer("layernorm", arr, n, None)
  expect_error("tg_nn_layernorm_forward", lambda: l(Tensor(rnd(2, 5))), "must match")
  l.free()
  expect_error("tg_nn_layernorm_init", lambda: Layer("layernorm", arr, 0, None), "1..8")


case("LayerNorm errors", _ln_errors)


def _ln2d():
  l = Layer("layernorm2d", 3, None)
  l.p("weight").assign(Tensor(rnd(3))).realize()
  l.p("bias").assign(Tensor(rnd(3))).realize()
  tm = torch.nn.LayerNorm(3)
  check_layer(l, tm, {"weight": "weight", "bias": "bias"}, rnd(2, 3, 4, 5) * 2, 1e-4, 1e-3,
              tfwd=lambda t: tm(t.permute(0, 2, 3, 1)).permute(0, 3, 1, 2))
  l.free()


case("LayerNorm2d(3) on (2, 3, 4, 5) = LayerNorm over channels", _ln2d)


class TorchRMSNorm(torch.nn.Module):  # torch 1.13 has no nn.RMSNorm: tinygrad's formula
  def __init__(self, dim, eps):
    super().__init__()
    self.eps, self.weight = eps, torch.nn.Parameter(torch.ones(dim))

  def forward(self, x): return (x.float() * torch.rsqrt(x.float().square().mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


for dim, shape, eps in [(4, (3, 4), None), (6, (2, 3, 6), 1e-3)]:
  def _rms(dim=dim, shape=shape, eps=eps):
    l = Layer("rmsnorm", dim, ctypes.byref(RMSNormOpts() if eps is None else RMSNormOpts(eps)))
    assert l.s.eps == (eps or 1e-6)
    l.p("weight").assign(Tensor(rnd(dim))).realize()
    tm = TorchRMSNorm(dim, eps or 1e-6)
    check_layer(l, tm, {"weight": "weight"}, rnd(*shape), 1e-4, 1e-3)
    l.free()
  case(f"RMSNorm({dim}) on {shape} eps={eps or 1e-6}", _rms)


def _rms_half():
  l = Layer("rmsnorm", 4, ctypes.byref(RMSNormOpts(affine=False)))
  assert l.s.weight.id == 0
  x = rnd(3, 4)
  out = l(Tensor(x).cast(tg.FLOAT16))
  assert out.dtype == tg.FLOAT16
  ref = (x / np.sqrt((x.astype(np.float16).astype(np.float32) ** 2).mean(-1, keepdims=True) + 1e-6))
  close(out.numpy().astype(np.float32), ref, 2e-3, 2e-3)
  l.free()


case("RMSNorm without weight keeps a float16 input's dtype", _rms_half)


# Embedding
for V, E, ishape in [(10, 4, (5,)), (7, 3, (2, 6)), (50, 8, (3, 2, 4)), (3, 2, (0,))]:
  def _emb(V=V, E=E, ishape=ishape):
    l = Layer("embedding", V, E)
    tm = torch.nn.Embedding(V, E)
    idx = RNG.integers(0, V, size=ishape).astype(np.int32)
    if idx.size > 2: idx.flat[1] = idx.flat[0]  # a repeated index: its gradient rows add up
    check_layer(l, tm, {"weight": "weight"}, idx, int_input=True, tfwd=lambda t: tm(t.long()))
    l.free()
  case(f"Embedding({V}, {E}) on {ishape}", _emb)


def _emb_errors():
  l = Layer("embedding", 5, 2)
  expect_error("tg_nn_embedding_forward", lambda: l(Tensor(rnd(3))), "integer")
  out = l(Tensor(np.array([7, 5, 2, -1], np.int32))).numpy()
  close(out[:2], np.zeros((2, 2)), what="out of range rows are zero")
  close(out[2:], l.p("weight").numpy()[[2, 4]], what="rows 2 and -1 (the last)")
  l.free()


case("Embedding: float indices are an error, rows >= vocab are zero, negative count from the end", _emb_errors)


# LSTMCell
def lstm_fwd(l, x, h=None, c=None):
  ho, co = _T(), _T()
  _check("tg_nn_lstmcell_forward", lib.tg_nn_lstmcell_forward(ctypes.byref(l.s), x.h, _h(h), _h(c), ctypes.byref(ho), ctypes.byref(co)))
  return W(ho), W(co)


for ins, hid, bias, with_state in [(3, 4, True, False), (5, 2, True, True), (2, 3, False, True)]:
  def _lstm(ins=ins, hid=hid, bias=bias, with_state=with_state):
    l = Layer("lstmcell", ins, hid, bias)
    if bias:  # tinygrad initialises the biases to zero; make them matter
      assert not l.p("bias_ih").numpy().any()
      l.p("bias_ih").assign(Tensor(rnd(4 * hid))).realize()
      l.p("bias_hh").assign(Tensor(rnd(4 * hid))).realize()
    tm = torch.nn.LSTMCell(ins, hid, bias=bias)
    names = ["weight_ih", "weight_hh"] + (["bias_ih", "bias_hh"] if bias else [])
    copy_into_torch(l, tm, {n: n for n in names})
    x_np, h_np, c_np = rnd(3, ins), rnd(3, hid), rnd(3, hid)
    x = set_rg(Tensor(x_np))
    h, c = (set_rg(Tensor(h_np)), set_rg(Tensor(c_np))) if with_state else (None, None)
    ho, co = lstm_fwd(l, x, h, c)
    tx, th, tc = (torch.tensor(a, requires_grad=True) for a in (x_np, h_np, c_np))
    rh, rc = tm(tx, (th, tc)) if with_state else tm(tx)
    w1, w2 = rnd(3, hid), rnd(3, hid)
    backward((ho * Tensor(w1)).sum() + (co * Tensor(w2)).sum())
    ((rh * torch.tensor(w1)).sum() + (rc * torch.tensor(w2)).sum()).backward()
    close(ho.numpy(), rh, 1e-5, 1e-4, "h"), close(co.numpy(), rc, 1e-5, 1e-4, "c")
    close(grad(x).numpy(), tx.grad, 1e-5, 1e-4, "grad x")
    if with_state: close(grad(h).numpy(), th.grad, 1e-5, 1e-4, "grad h"), close(grad(c).numpy(), tc.grad, 1e-5, 1e-4, "grad c")
    for n in names: close(grad(l.p(n)).numpy(), getattr(tm, n).grad, 1e-4, 1e-3, f"grad {n}")
    l.free()
  case(f"LSTMCell({ins}, {hid}, bias={bias}) state={with_state}", _lstm)


def _lstm_errors():
  l = Layer("lstmcell", 2, 3, True)
  expect_error("tg_nn_lstmcell_forward", lambda: lstm_fwd(l, Tensor(rnd(4, 2)), Tensor(rnd(4, 3))), "both")
  expect_error("tg_nn_lstmcell_forward", lambda: lstm_fwd(l, Tensor(rnd(4, 3))), "(batch, 2)")
  l.free()


case("LSTMCell errors", _lstm_errors)


# =====================================================================================================
# initialization
def _uniform_ok(a, bound, what):
  a = np.asarray(a, np.float64).ravel()
  assert a.min() >= -bound - 1e-7 and a.max() <= bound + 1e-7, f"{what}: values outside +-{bound}: [{a.min()}, {a.max()}]"
  assert a.max() > 0.8 * bound and a.min() < -0.8 * bound, f"{what}: does not fill +-{bound}: [{a.min()}, {a.max()}]"
  assert abs(a.mean()) < 0.1 * bound, f"{what}: mean {a.mean()} not near 0"
  assert abs(a.std() - bound / math.sqrt(3)) < 0.1 * bound, f"{what}: std {a.std()} != {bound / math.sqrt(3)}"


def _init_layers():
  tg.manual_seed(7)
  l = Layer("linear", 64, 128, True)
  _uniform_ok(l.p("weight").numpy(), 1 / 8, "Linear weight"), _uniform_ok(l.p("bias").numpy(), 1 / 8, "Linear bias")
  assert lib.tg_requires_grad(l.s.weight) and l.p("weight").is_realized()
  l.free()
  c = Layer("conv2d", 8, 64, _shape((3, 3))[0], True, None)
  b = 1 / math.sqrt(8 * 9)
  _uniform_ok(c.p("weight").numpy(), b, "Conv2d weight"), _uniform_ok(c.p("bias").numpy(), b, "Conv2d bias")
  c.free()
  ct = Layer("conv_transpose2d", 16, 8, _shape((2, 2))[0], True, None)
  assert ct.p("weight").shape == (16, 8, 2, 2)
  _uniform_ok(ct.p("weight").numpy(), 1 / math.sqrt(16 * 4), "ConvTranspose2d weight")
  ct.free()
  e = Layer("embedding", 100, 60)
  _uniform_ok(e.p("weight").numpy(), math.sqrt(6 / 160), "Embedding weight (glorot)")
  e.free()
  lstm = Layer("lstmcell", 10, 25, True)
  _uniform_ok(lstm.p("weight_ih").numpy(), 0.2, "LSTMCell weight_ih"), _uniform_ok(lstm.p("weight_hh").numpy(), 0.2, "LSTMCell weight_hh")
  assert not lstm.p("bias_ih").numpy().any() and not lstm.p("bias_hh").numpy().any()
  lstm.free()
  # two layers of the same shape draw different numbers
  l1, l2 = Layer("linear", 4, 4, True), Layer("linear", 4, 4, True)
  assert not np.array_equal(l1.p("weight").numpy(), l2.p("weight").numpy())
  l1.free(), l2.free()


case("init: Linear / Conv2d / ConvTranspose2d / Embedding / LSTMCell distributions as tinygrad", _init_layers)


def _initializers():
  tg.manual_seed(11)
  s, n = _shape((256, 32, 3))
  fan = 32 * 3
  a = W(call("kaiming_uniform", s, n, math.sqrt(5), None)).numpy()
  _uniform_ok(a, 1 / math.sqrt(fan), "kaiming_uniform(a=sqrt(5))")
  a = W(call("kaiming_uniform", s, n, 0.01, None)).numpy()
  _uniform_ok(a, math.sqrt(6 / (1 + 1e-4) / fan), "kaiming_uniform(a=0.01)")
  a = W(call("kaiming_normal", s, n, 0.0, None)).numpy().astype(np.float64)
  assert abs(a.std() - math.sqrt(2 / fan)) < 0.02 * math.sqrt(2 / fan) * 5 and abs(a.mean()) < 0.01, (a.mean(), a.std())
  a = W(call("glorot_uniform", s, n, None)).numpy()
  _uniform_ok(a, math.sqrt(6 / (256 + fan)), "glorot_uniform")
  a = W(call("scaled_uniform", s, n, None)).numpy()
  _uniform_ok(a, (256 * fan) ** -0.5, "scaled_uniform")
  t = W(call("kaiming_uniform", s, n, 1.0, opts(tg.FLOAT16, True)))
  assert t.dtype == tg.FLOAT16 and lib.tg_requires_grad(t.h)
  t = W(call("scaled_uniform", s, n, opts(0, True)))
  assert lib.tg_requires_grad(t.h)
  for k in (0, 1, 5, 200):
    p = W(call("randperm", k, None))
    assert p.dtype == tg.INT32 and sorted(p.numpy().tolist()) == list(range(k)), p.numpy()
  p1, p2 = W(call("randperm", 50, opts(tg.INT64))).numpy(), W(call("randperm", 50, None)).numpy()
  assert p1.dtype == np.int64 and not np.array_equal(p1, p2)
  base = Tensor(rnd(30, 40)).cast(tg.FLOAT16)
  r = W(call("rand_like", base.h, None))
  assert r.shape == (30, 40) and r.dtype == tg.FLOAT16 and 0 <= r.numpy().min() and r.numpy().max() <= 1
  r = W(call("rand_like", Tensor(rnd(300, 40)).h, None)).numpy()
  assert r.dtype == np.float32 and 0 <= r.min() and r.max() < 1 and abs(r.mean() - 0.5) < 0.01
  r = W(call("randn_like", base.h, opts(tg.FLOAT32)))
  assert r.dtype == tg.FLOAT32 and abs(r.numpy().std() - 1) < 0.1
  expect_error("tg_rand_like", lambda: W(call("rand_like", Tensor(np.zeros(3, np.int32)).h, None)), "float")
  expect_error("tg_glorot_uniform", lambda: W(call("glorot_uniform", None, 0, None)), "dimension")
  expect_error("tg_randperm", lambda: W(call("randperm", 3, opts(tg.FLOAT32))), "integer")
  expect_error("tg_kaiming_uniform", lambda: W(call("kaiming_uniform", *_shape((3, 0)), 0.01, None)), "bound")


case("initializers: kaiming_uniform/normal, glorot, scaled_uniform, randperm, rand_like, randn_like", _initializers)


# =====================================================================================================
# optimizers
class Optim:
  def __init__(self, ctor, params, o):
    self.p = getattr(lib, f"tg_optim_{ctor}")(_tarr(params), len(params), ctypes.byref(o) if o is not None else None)
    if not self.p: tg._raise(f"tg_optim_{ctor}")

  def zero_grad(self): lib.tg_optim_zero_grad(self.p)
  def step(self): _check("tg_optim_step", lib.tg_optim_step(self.p))

  def schedule_step(self):
    n = _check("tg_optim_schedule_step", lib.tg_optim_schedule_step(self.p, None, 0))
    out = (_T * max(n, 1))()
    _check("tg_optim_schedule_step", lib.tg_optim_schedule_step(self.p, out, n))
    return [W(out[i]) for i in range(n)]

  def free(self): lib.tg_optim_free(self.p)


@contextlib.contextmanager
def optim(ctor, params, o=None):
  op = Optim(ctor, params, o)
  try:
    yield op
  finally:
    op.free()


P_SHAPES = [(4, 3), (3,), ()]


def make_params(seed=0):
  r = np.random.default_rng(seed)
  return [r.uniform(-1, 1, size=s).astype(np.float32) for s in P_SHAPES]


def loss_np_fn(ps, consts):
  """the same loss in torch (ps: torch tensors)"""
  c0, c1 = consts
  return (torch.sin(ps[0]) * c0).sum() + ((ps[1] - c1) ** 2).sum() + ps[2] * ps[2] * 3 + (ps[0].sum() * ps[2])


def loss_tg(ps, consts):
  c0, c1 = Tensor(consts[0]), Tensor(consts[1])
  s0 = (ps[0].unary("sin") * c0).sum()
  d = ps[1] - c1
  return s0 + (d * d).sum() + ps[2] * ps[2] * 3 + ps[0].sum() * ps[2]


def run_ours(ctor, o, steps=5, seed=0, persist=True):
  """5 steps of our optimizer on make_params(seed); returns the params (numpy) after each step."""
  r = np.random.default_rng(100 + seed)
  consts = (r.uniform(-1, 1, size=(4, 3)).astype(np.float32), r.uniform(-1, 1, size=3).astype(np.float32))
  ps = [Tensor(a).persist() for a in make_params(seed)]
  for p in ps: set_rg(p)
  hist = []
  try:
    with optim(ctor, ps, o) as op, tg.context(TRAINING=1):
      for _ in range(steps):
        with tg.scope():
          op.zero_grad()
          backward(loss_tg(ps, consts))
          op.step()
        hist.append([p.numpy().copy() for p in ps])
  finally:
    for p in ps: p.free()
  return hist, consts


def grads_np(ps, consts):
  tps = [torch.tensor(p, requires_grad=True) for p in ps]
  loss_np_fn(tps, [torch.tensor(c) for c in consts]).backward()
  return [t.grad.numpy().astype(np.float64) for t in tps]


def run_torch(make_opt, steps, seed, consts):
  tps = [torch.nn.Parameter(torch.tensor(a)) for a in make_params(seed)]
  opt = make_opt(tps)
  hist = []
  tc = [torch.tensor(c) for c in consts]
  for _ in range(steps):
    opt.zero_grad()
    loss_np_fn(tps, tc).backward()
    opt.step()
    hist.append([t.detach().numpy().copy() for t in tps])
  return hist


for name, ctor, o, make in [
    ("SGD lr=0.1", "sgd", SGDOpts(0.1), lambda p: torch.optim.SGD(p, lr=0.1)),
    ("SGD default lr", "sgd", None, lambda p: torch.optim.SGD(p, lr=0.001)),
    ("SGD momentum=0.9", "sgd", SGDOpts(0.05, 0.9), lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9)),
    ("SGD momentum nesterov", "sgd", SGDOpts(0.05, 0.8, 0, True), lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.8, nesterov=True)),
    ("SGD weight_decay", "sgd", SGDOpts(0.1, 0, 0.1), lambda p: torch.optim.SGD(p, lr=0.1, weight_decay=0.1)),
    ("SGD momentum+nesterov+weight_decay", "sgd", SGDOpts(0.05, 0.9, 0.01, True),
     lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01)),
    ("Adam default", "adam", None, lambda p: torch.optim.Adam(p)),
    ("Adam lr=0.05 betas", "adam", AdamOpts(0.05, 0.8, 0.99, 1e-6), lambda p: torch.optim.Adam(p, lr=0.05, betas=(0.8, 0.99), eps=1e-6)),
    ("AdamW default", "adamw", None, lambda p: torch.optim.AdamW(p)),
    ("AdamW lr=0.05 wd=0.1", "adamw", AdamWOpts(0.05, weight_decay=0.1), lambda p: torch.optim.AdamW(p, lr=0.05, weight_decay=0.1)),
]:
  def _opt_torch(ctor=ctor, o=o, make=make):
    hist, consts = run_ours(ctor, o)
    ref = run_torch(make, 5, 0, consts)
    for s, (ours, theirs) in enumerate(zip(hist, ref)):
      for i, (a, b) in enumerate(zip(ours, theirs)): close(a, b, 1e-6, 1e-5, f"step {s} param {i}")
  case(f"optim {name} vs torch.optim, 5 steps", _opt_torch)


# numpy transcriptions of tinygrad's optim.py (LARS, LAMB)
def np_lars(steps, seed, consts, lr=0.001, momentum=0.9, wd=1e-4, nesterov=False, classic=True, tcoef=0.001):
  ps = [p.astype(np.float64) for p in make_params(seed)]
  b = [np.zeros_like(p) for p in ps]
  hist = []
  for _ in range(steps):
    gs = grads_np([p.astype(np.float32) for p in ps], consts)
    for i, (t, g) in enumerate(zip(ps, gs)):
      if tcoef != 0:
        r1, r2 = np.sqrt((t * t).sum()), np.sqrt((g * g).sum())
        r = (tcoef * r1 / (r2 + wd * r1)) if (r1 > 0 and r2 > 0) else 1.0
      else:
        r = 1.0
      if wd > 0: g = g + wd * t
      if classic: g = g * r * lr
      if momentum:
        b[i] = momentum * b[i] + g
        g = (g + momentum * b[i]) if nesterov else b[i]
      if not classic: g = g * r * lr
      ps[i] = t - g
    hist.append([p.copy() for p in ps])
  return hist


def np_lamb(steps, seed, consts, lr=0.001, b1=0.9, b2=0.999, eps=1e-6, wd=0.0, adam=False):
  ps = [p.astype(np.float64) for p in make_params(seed)]
  m, v = [np.zeros_like(p) for p in ps], [np.zeros_like(p) for p in ps]
  b1t = b2t = 1.0
  hist = []
  for _ in range(steps):
    gs = grads_np([p.astype(np.float32) for p in ps], consts)
    b1t, b2t = b1t * b1, b2t * b2
    for i, (t, g) in enumerate(zip(ps, gs)):
      m[i] = b1 * m[i] + (1 - b1) * g
      v[i] = b2 * v[i] + (1 - b2) * g * g
      up = (m[i] / (1 - b1t)) / (np.sqrt(v[i] / (1 - b2t)) + eps) + wd * t
      if not adam:
        r1, r2 = np.sqrt((t * t).sum()), np.sqrt((up * up).sum())
        r = r1 / r2 if (r1 > 0 and r2 > 0) else 1.0
      else:
        r = 1.0
      ps[i] = t - lr * r * up
    hist.append([p.copy() for p in ps])
  return hist


for name, ctor, o, ref in [
    ("LARS default", "lars", None, lambda c: np_lars(5, 0, c)),
    ("LARS lr=0.5 tcoef=0.02", "lars", LARSOpts(0.5, tcoef=0.02), lambda c: np_lars(5, 0, c, lr=0.5, tcoef=0.02)),
    ("LARS classic=False nesterov", "lars", LARSOpts(0.5, 0.8, 0.01, 0.01, True, False),
     lambda c: np_lars(5, 0, c, lr=0.5, momentum=0.8, wd=0.01, tcoef=0.01, nesterov=True, classic=False)),
    ("LARS no momentum, no weight decay", "lars", LARSOpts(0.5, 0, 0, 0.05),
     lambda c: np_lars(5, 0, c, lr=0.5, momentum=0, wd=0, tcoef=0.05)),
    ("SGD classic momentum", "sgd", SGDOpts(0.1, 0.9, 0.01, False, True),
     lambda c: np_lars(5, 0, c, lr=0.1, momentum=0.9, wd=0.01, tcoef=0.0, classic=True)),
    ("LAMB default", "lamb", None, lambda c: np_lamb(5, 0, c)),
    ("LAMB lr=0.05 wd=0.1", "lamb", LAMBOpts(0.05, 0.85, 0.99, 1e-5, 0.1), lambda c: np_lamb(5, 0, c, 0.05, 0.85, 0.99, 1e-5, 0.1)),
]:
  def _opt_np(ctor=ctor, o=o, ref=ref):
    hist, consts = run_ours(ctor, o)
    for s, (ours, theirs) in enumerate(zip(hist, ref(consts))):
      for i, (a, b) in enumerate(zip(ours, theirs)): close(a, b, 1e-6, 1e-4, f"step {s} param {i}")
  case(f"optim {name} vs numpy transcription of tinygrad, 5 steps", _opt_np)


def _opt_lifecycle():
  w = set_rg(Tensor(rnd(3)).persist())
  buf = Tensor(np.zeros(3, np.float32)).persist()  # requires_grad false: a buffer, realized with the step
  call("set_requires_grad", buf.h, False)
  try:
    with optim("adam", [w, w, buf], AdamOpts(0.1)) as op:
      n = lib.tg_optim_schedule_step(op.p, None, 0)
      assert n == 2 + 2 + 1 + 1, n  # b1_t, b2_t, m, v, the (deduplicated) param, the buffer
      expect_error("tg_optim_schedule_step", lambda: op.schedule_step(), "TRAINING")
      with tg.context(TRAINING=1):
        expect_error("tg_optim_schedule_step", lambda: op.schedule_step(), "no gradient")
        with tg.scope():
          backward((w * w).sum())
          small = (_T * 2)()
          assert lib.tg_optim_schedule_step(op.p, small, 2) == -1
          msg = tg.last_error()
          lib.tg_clear_error()
          assert "room" in msg, msg
          buf.assign(buf + 1)  # a pending buffer update is realized by the step
          ts = op.schedule_step()
          assert ts[-2].h.id == w.h.id and ts[-1].h.id == buf.h.id
          loss = (w * 0).sum()
          tg.realize_many(*ts, loss)
        close(buf.numpy(), np.ones(3), what="buffer realized with the step")
        assert abs(lib.tg_optim_get_lr(op.p) - 0.1) < 1e-7
        _check("tg_optim_set_lr", lib.tg_optim_set_lr(op.p, 0.25))
        assert abs(lib.tg_optim_get_lr(op.p) - 0.25) < 1e-7
        lr = W(lib.tg_optim_lr(op.p))
        assert lr.shape == (1,) and lr.dtype == tg.FLOAT32
        with state_dict() as sd:
          _check("tg_optim_state", lib.tg_optim_state(op.p, sd.p, b"opt"))
          assert sd.names() == ["opt.lr", "opt.b1_t", "opt.b2_t", "opt.m.0", "opt.v.0"], sd.names()
          close(sd.get("opt.b1_t").numpy(), [0.9]), close(sd.get("opt.lr").numpy(), [0.25])
    # two optimizers with the same lr have separate lr tensors
    with optim("sgd", [w], SGDOpts(0.5)) as o1, optim("sgd", [w], SGDOpts(0.5)) as o2:
      _check("tg_optim_set_lr", lib.tg_optim_set_lr(o1.p, 0.125))
      assert abs(lib.tg_optim_get_lr(o2.p) - 0.5) < 1e-7
    for ctor, o, sub in [("sgd", SGDOpts(-1.0), "learning rate"), ("adam", AdamOpts(0.1, 1.0), "betas"),
                         ("lamb", LAMBOpts(0.1, weight_decay=-0.5), "weight_decay"), ("sgd", SGDOpts(0.1, -0.5), "momentum"),
                         ("adamw", AdamWOpts(0.1, eps=-1.0), "eps")]:
      expect_error(f"tg_optim_{ctor}", lambda ctor=ctor, o=o: Optim(ctor, [w], o), sub)
    expect_error("tg_optim_sgd", lambda: Optim("sgd", [buf], None), "at least one param")
  finally:
    w.free(), buf.free()


case("optim: buffers, dedup, counts, TRAINING / no-grad / cap errors, set_lr, state names, bad options", _opt_lifecycle)


# =====================================================================================================
# model state
class Net:
  """conv(3->4, 3x3, pad 1) -> relu -> BatchNorm -> flatten -> Linear(4*5*5 -> 6); torch's names"""

  def __init__(self):
    o = ConvOpts(1, (1, 1), (1, 1), (1, 0, 0, 0), 1)
    self.conv = Layer("conv2d", 3, 4, _shape((3, 3))[0], True, ctypes.byref(o))
    self.bn = Layer("batchnorm", 4, None)
    self.fc = Layer("linear", 100, 6, True)

  def state(self, sd):
    self.conv.state(sd, "features.0")
    self.bn.state(sd, "features.2")
    self.fc.state(sd, "classifier")

  def __call__(self, x):
    return self.fc(self.bn(self.conv(x).relu()).reshape(x.shape[0], -1))

  def free(self): self.conv.free(), self.bn.free(), self.fc.free()


class TorchNet(torch.nn.Module):
  def __init__(self):
    super().__init__()
    self.features = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.BatchNorm2d(4))
    self.classifier = torch.nn.Linear(100, 6)

  def forward(self, x): return self.classifier(self.features(x).flatten(1))


def _torch_state_dict_loads():
  torch.manual_seed(0)
  tm = TorchNet()
  tm.train()
  for _ in range(2): tm(torch.randn(8, 3, 5, 5) * 2 + 1)  # non-trivial running statistics
  tm.eval()
  net = Net()
  with state_dict() as model, state_dict() as loaded:
    net.state(model)
    assert model.names() == list(tm.state_dict().keys()), (model.names(), list(tm.state_dict().keys()))
    for k, v in tm.state_dict().items(): loaded.set(k, Tensor(v.numpy()))
    load_state_dict(model, loaded, strict=True)
    x = rnd(2, 3, 5, 5)
    close(net(Tensor(x)).numpy(), tm(torch.tensor(x)), 1e-4, 1e-4, "eval output after loading torch's state_dict")
    assert net.bn.p("num_batches_tracked").numpy() == 2 and net.bn.p("num_batches_tracked").dtype == tg.INT64
    # the dict reads the loaded values too
    close(model.get("classifier.weight").numpy(), tm.classifier.weight, what="dict entry after load")
  net.free()


case("load_state_dict: a torch state_dict (conv/bn/linear) loads strictly and gives torch's outputs", _torch_state_dict_loads)


def _load_errors():
  net = Net()
  with state_dict() as model:
    net.state(model)
    before = {k: model.get(k).numpy().copy() for k in model.names()}
    with state_dict() as bad:
      for k in model.names():
        if k != "features.2.running_var": bad.set(k, Tensor(np.zeros(model.get(k).shape, np.float32)))
      bad.set("extra.weight", Tensor(rnd(2)))
      bad.set("classifier.bias", Tensor(rnd(7)))
      msg = expect_error("tg_load_state_dict", lambda: load_state_dict(model, bad, True), "missing keys", "'features.2.running_var'",
                         "unexpected keys", "'extra.weight'", "shape mismatch", "'classifier.bias'", "(6,)", "(7,)")
      assert "strict=false" in msg
      for k in model.names(): close(model.get(k).numpy(), before[k], what=f"{k} untouched after a failed load")
      # non-strict still rejects the wrong shape (as tinygrad and torch do), and still writes nothing
      expect_error("tg_load_state_dict", lambda: load_state_dict(model, bad, False), "shape mismatch")
      for k in model.names(): close(model.get(k).numpy(), before[k], what=f"{k} untouched after a failed load")
      bad.set("classifier.bias", Tensor(rnd(6)))
      load_state_dict(model, bad, False)  # skips running_var and extra.weight
      close(net.fc.p("weight").numpy(), np.zeros((6, 100)), what="loaded weight")
      close(net.bn.p("running_var").numpy(), before["features.2.running_var"], what="skipped key kept")
  net.free()


case("load_state_dict: strict errors name missing / unexpected / mis-shaped keys; nothing written on error; non-strict", _load_errors)


def _load_dtype_shape():
  l = Layer("linear", 3, 2, True)
  bn = Layer("batchnorm", 2, None)
  with state_dict() as model, state_dict() as loaded:
    l.state(model, "")
    bn.state(model, "bn.")
    assert model.names() == ["weight", "bias", "bn.weight", "bn.bias", "bn.running_mean", "bn.running_var", "bn.num_batches_tracked"]
    w64 = RNG.uniform(-1, 1, size=(2, 3))
    loaded.set("weight", Tensor(w64))  # float64 -> cast to the model's float32
    loaded.set("bias", Tensor(np.array([1.5, -2], np.float16)))
    loaded.set("bn.num_batches_tracked", Tensor(np.array([5], np.int64)))  # (1,) into () is accepted
    load_state_dict(model, loaded, strict=False)
    assert l.p("weight").dtype == tg.FLOAT32
    close(l.p("weight").numpy(), w64.astype(np.float32), 0, 0)
    close(l.p("bias").numpy(), [1.5, -2.0], 0, 0)
    assert bn.p("num_batches_tracked").numpy() == 5 and bn.p("num_batches_tracked").shape == ()
    # the layer's forward uses the loaded values, also through expressions built before the load
    x = rnd(4, 3)
    close(l(Tensor(x)).numpy(), x @ w64.astype(np.float32).T + np.array([1.5, -2], np.float32), 1e-5)
    # loading the dict into itself changes nothing; unknown dict is an error
    load_state_dict(model, model, True)
    close(l.p("weight").numpy(), w64.astype(np.float32), 0, 0)
  l.free(), bn.free()


case("load_state_dict: dtype cast, () vs (1,), prefixes, forward sees loaded values, self-load", _load_dtype_shape)


def _parameters():
  net = Net()
  with state_dict() as sd:
    net.state(sd)
    ps = parameters(sd, True)
    assert [p.h.id for p in ps] == [net.conv.s.weight.id, net.conv.s.bias.id, net.bn.s.weight.id, net.bn.s.bias.id,
                                    net.fc.s.weight.id, net.fc.s.bias.id]
    allp = parameters(sd, False)
    assert len(allp) == 9 and allp[4].h.id == net.bn.s.running_mean.id and allp[6].h.id == net.bn.s.num_batches_tracked.id
    sd.set("tied", W(net.fc.s.weight))  # the same tensor under a second name counts once
    assert len(parameters(sd, True)) == 6
    small = (_T * 2)()
    assert lib.tg_state_dict_parameters(sd.p, True, small, 2) == -1
    assert "room" in tg.last_error()
    lib.tg_clear_error()
  net.free()


case("state_dict_parameters: the layers' own handles, trainable_only, dedup, cap error", _parameters)


def _train_net_with_buffers():
  # a few Adam steps on the conv/bn/linear net against torch, with BatchNorm running stats realized by the step
  torch.manual_seed(1)
  tm = TorchNet()
  net = Net()
  with state_dict() as model, state_dict() as loaded:
    net.state(model)
    for k, v in tm.state_dict().items(): loaded.set(k, Tensor(v.numpy()))
    load_state_dict(model, loaded)
    params = parameters(model, False)
    topt = torch.optim.Adam(tm.parameters(), lr=0.01)
    xs = [rnd(4, 3, 5, 5) for _ in range(3)]
    ys = [RNG.integers(0, 6, size=4) for _ in range(3)]
    with optim("adam", params, AdamOpts(0.01)) as op, tg.context(TRAINING=1):
      for x, y in zip(xs, ys):
        with tg.scope():
          op.zero_grad()
          logits = net(Tensor(x))
          lp = logits.log_softmax(-1)
          loss = -(lp * Tensor(np.eye(6, dtype=np.float32)[y])).sum() * (1 / 4)
          backward(loss)
          ts = op.schedule_step()
          tg.realize_many(loss, *ts)
        topt.zero_grad()
        tl = F.cross_entropy(tm(torch.tensor(x)), torch.tensor(y))
        tl.backward()
        topt.step()
    for k, v in tm.state_dict().items():
      close(model.get(k).numpy(), v, 2e-4, 2e-3, f"{k} after 3 training steps")
  net.free()


case("training: 3 Adam steps of conv/bn/linear vs torch (BatchNorm running stats realized by the step)", _train_net_with_buffers)


# =====================================================================================================
def main(): return tg.run_cases(CASES, "test_nn_layers", after_case=lambda: [l.free() for l in list(LIVE_LAYERS)])


if __name__ == "__main__":
  sys.exit(main())
