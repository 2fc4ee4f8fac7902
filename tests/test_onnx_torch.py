"""test_onnx_torch.py -- the ONNX runner (src/nn/onnx.c) against PyTorch.

Each case builds a small torch model, exports it with torch.onnx.export (torch's own exporter, no
onnx package) into a temporary directory at opset 13 and 17, loads it with tg_onnx_load, runs it
with tg_onnx_run and compares the outputs with the torch model's (rtol 1e-4): an MLP, a CNN with
BatchNormalization kept as a node, a ResNet basic block, a 2-layer nn.TransformerEncoder, a model
whose shapes come from Shape ops (dynamic batch, run at two batch sizes), and models covering the
remaining ops (Split, Where, Expand, Range, ConstantOfShape, reductions with axes as input,
ArgMax, Pad, ConvTranspose, ...), Resize/Upsample as torch exports interpolation, TopK, GroupNorm,
PixelShuffle and max_pool2d with indices. Hand-built single-node models (a small protobuf writer)
cover attribute corners torch does not export: Resize against the spec's formulas in numpy,
Upsample, GroupNormalization, DepthToSpace, SpaceToDepth, Hardmax, MaxPool's Indices, and the refused
attribute values. Also the graph description accessors and error messages. Each
case runs in its own scope and the live handle count must be 0 at the end.

Run: TINYGRAD_LIB=build/libtinygrad.so /usr/bin/python3 tests/test_onnx_torch.py   (TEST_FILTER=substr)
"""
import os
import sys
import tempfile
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import tinygrad as tg  # noqa: E402
from tinygrad import Tensor, TGError  # noqa: E402

torch.set_num_threads(1)
warnings.filterwarnings("ignore")
TMP = tempfile.mkdtemp(prefix="tg_onnx_")
CASES = []


def case(name, fn, *args, **kw): CASES.append((name, fn, args, kw))


def export(model, args, opset, name, dynamic=None, **kw):
  path = os.path.join(TMP, f"{name}_{opset}.onnx")
  nin = len(args)
  in_names = [f"in{i}" for i in range(nin)]
  torch.onnx.export(model, tuple(args), path, opset_version=opset, input_names=in_names, dynamic_axes=dynamic, **kw)
  return path


def to_tg(a):
  a = a.detach().numpy() if isinstance(a, torch.Tensor) else a
  return Tensor(np.ascontiguousarray(a))


def check_model(model, args, opset, name, rtol=1e-4, atol=1e-5, dynamic=None, extra_args=(), **kw):
  model.eval()
  path = export(model, args, opset, name, dynamic=dynamic, **kw)
  with tg.OnnxModel(path) as m:
    for a in [args, *extra_args]:
      with torch.no_grad():
        ref = model(*a)
      refs = ref if isinstance(ref, (tuple, list)) else (ref,)
      outs = m.run(*[to_tg(x) for x in a])
      assert len(outs) == len(refs), (len(outs), len(refs))
      for o, r in zip(outs, refs):
        got, want = o.numpy(), r.detach().numpy()
        assert got.shape == want.shape, f"shape {got.shape} != {want.shape}"
        if want.dtype in (np.int64, np.int32, np.bool_):
          assert np.array_equal(got, want), f"{got} != {want}"
        else:
          np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


# ---- models ----------------------------------------------------------------------------------------
class MLP(nn.Module):
  def __init__(self):
    super().__init__()
    self.l1, self.l2, self.l3 = nn.Linear(8, 32), nn.Linear(32, 16), nn.Linear(16, 4)

  def forward(self, x): return F.log_softmax(self.l3(torch.sigmoid(self.l2(torch.tanh(self.l1(x))))), -1)


class CNN(nn.Module):
  def __init__(self):
    super().__init__()
    self.c1 = nn.Conv2d(3, 8, 3, padding=1, stride=2)
    self.bn = nn.BatchNorm2d(8)
    self.c2 = nn.Conv2d(8, 8, 3, padding=2, dilation=2, groups=2)
    self.fc = nn.Linear(8 * 2 * 2, 5)

  def forward(self, x):
    x = F.relu(self.bn(self.c1(x)))
    x = F.max_pool2d(x, 2)
    x = F.leaky_relu(self.c2(x), 0.1)
    x = F.avg_pool2d(x, 2)
    return self.fc(x.view(x.shape[0], -1))


class BasicBlock(nn.Module):
  def __init__(self, c=8):
    super().__init__()
    self.c1, self.b1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
    self.c2, self.b2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
    self.c3, self.b3 = nn.Conv2d(c, 2 * c, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(2 * c)
    self.down = nn.Sequential(nn.Conv2d(c, 2 * c, 1, stride=2, bias=False), nn.BatchNorm2d(2 * c))
    self.fc = nn.Linear(2 * c, 3)

  def forward(self, x):
    y = F.relu(self.b1(self.c1(x)))
    y = F.relu(self.b2(self.c2(y)) + x)
    z = F.relu(self.b3(self.c3(y)) + self.down(y))
    return self.fc(torch.flatten(F.adaptive_avg_pool2d(z, 1), 1))


def randomize_bn(model):
  g = torch.Generator().manual_seed(7)
  for mod in model.modules():
    if isinstance(mod, nn.BatchNorm2d):
      mod.running_mean.copy_(torch.randn(mod.num_features, generator=g) * 0.1)
      mod.running_var.copy_(torch.rand(mod.num_features, generator=g) + 0.5)
      mod.weight.data.copy_(torch.rand(mod.num_features, generator=g) + 0.5)
      mod.bias.data.copy_(torch.randn(mod.num_features, generator=g) * 0.1)
  return model


class Encoder(nn.Module):
  def __init__(self, act="gelu"):
    super().__init__()
    self.emb = nn.Embedding(11, 16)
    layer = nn.TransformerEncoderLayer(16, 4, 32, dropout=0.1, batch_first=True, activation=act)
    self.enc = nn.TransformerEncoder(layer, 2)
    self.head = nn.Linear(16, 3)

  def forward(self, ids): return self.head(self.enc(self.emb(ids)))


class Attention(nn.Module):
  """hand-written attention: Split, Transpose, MatMul, Div by sqrt(d), Softmax, causal mask via Where"""

  def __init__(self, d=16, h=2):
    super().__init__()
    self.qkv, self.o, self.h, self.ln = nn.Linear(d, 3 * d), nn.Linear(d, d), h, nn.LayerNorm(d)
    self.register_buffer("mask", torch.ones(5, 5, dtype=torch.bool).tril())

  def forward(self, x):
    b, t, d = x.shape
    q, k, v = self.qkv(self.ln(x)).split(d, dim=-1)
    q, k, v = [y.reshape(b, t, self.h, d // self.h).transpose(1, 2) for y in (q, k, v)]
    att = (q @ k.transpose(-2, -1)) / (d // self.h) ** 0.5
    att = torch.where(self.mask[:t, :t], att, torch.tensor(float("-inf"))).softmax(-1)
    y = (att @ v).transpose(1, 2).reshape(b, t, d)
    return x + self.o(y) * torch.erf(y)


class DynFlatten(nn.Module):
  def __init__(self):
    super().__init__()
    self.c = nn.Conv2d(2, 4, 3, padding=1)
    self.fc = nn.Linear(4 * 5 * 5, 6)

  def forward(self, x):
    y = self.c(x)
    y = y.view(y.shape[0], -1)  # Shape -> Gather -> Unsqueeze -> Concat -> Reshape
    return self.fc(y), y.sum(1, keepdim=True).expand(x.shape[0], 3)


class Misc(nn.Module):
  def forward(self, x):
    a, b = x.split([3, 5], dim=1)
    r = torch.arange(x.shape[1], dtype=torch.float32)  # Range from a Shape
    z = torch.zeros(x.shape[0], 2)  # ConstantOfShape
    m = torch.where(a > 0, a, a * 0.5).sum(1, keepdim=True) + b.amax(1, keepdim=True) + b.mean(1, keepdim=True)
    c = torch.cat([x * r, z, m.expand(-1, 2)], 1) + torch.arange(x.shape[0], dtype=torch.float32).unsqueeze(1)
    c = torch.clamp(c, -1.5, 2.0) + torch.exp(-c.abs()) - torch.sqrt(c.abs() + 1) + torch.log(c.abs() + 2) ** 2
    return c, c.argmax(1), (c - c.max()) / (c.min() - 3)


class PadConvT(nn.Module):
  def __init__(self):
    super().__init__()
    self.ct = nn.ConvTranspose2d(4, 3, 3, stride=2, padding=1, output_padding=1)
    self.ct2 = nn.ConvTranspose2d(3, 2, 2, stride=1, groups=1)

  def forward(self, x):
    y = F.pad(x, (1, 2, 0, 1), value=0.5)
    y = F.pad(y, (1, 1, 1, 1), mode="reflect")
    y = self.ct2(torch.relu(self.ct(y)))
    return y[:, :, 1:-1:2, ::3], y.unsqueeze(1).squeeze(1).permute(0, 2, 3, 1).flatten(1)


class Gathers(nn.Module):
  def forward(self, x, idx):
    g = x[:, idx]  # Gather along axis 1 with a tensor index
    h = x[1]  # Gather with a constant
    return g * 2, h.neg(), (x == x[0:1]).int(), x.pow(3) - x.pow(0.5 * x.abs())


class Resizes(nn.Module):
  """Resize as torch exports it: nn.Upsample / F.interpolate nearest (scales and sizes), bilinear
  with align_corners False and True, bicubic"""

  def forward(self, x):
    return (nn.Upsample(scale_factor=2, mode="nearest")(x), F.interpolate(x, size=(7, 9), mode="nearest"),
            F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False),
            F.interpolate(x, size=(3, 8), mode="bilinear", align_corners=False),
            F.interpolate(x, size=(9, 4), mode="bilinear", align_corners=True),
            F.interpolate(x, scale_factor=(1.5, 2.5), mode="bilinear", align_corners=True),
            F.interpolate(x, size=(8, 11), mode="bicubic", align_corners=False),
            F.interpolate(x, size=(3, 7), mode="bicubic", align_corners=True),
            F.interpolate(x[:, :, 0], scale_factor=3, mode="linear", align_corners=False))


class TopKs(nn.Module):
  def forward(self, x):
    v, i = torch.topk(x, 3, dim=1)
    w, j = torch.topk(x, 2, dim=-1, largest=False)
    return v, i, w * 2, j, torch.topk(x, x.shape[0], dim=0)[1]


class Blocks(nn.Module):
  """GroupNorm (exported as InstanceNormalization + Reshape), PixelShuffle, PixelUnshuffle, max_pool2d
  with indices"""

  def __init__(self):
    super().__init__()
    self.gn = nn.GroupNorm(4, 8)
    self.gn.weight.data.uniform_(0.5, 1.5)
    self.gn.bias.data.uniform_(-0.5, 0.5)

  def forward(self, x):
    y = self.gn(x)
    p, idx = F.max_pool2d(y, 2, return_indices=True)
    q, idx2 = F.max_pool2d(y, 3, stride=2, padding=1, return_indices=True)
    return y, F.pixel_shuffle(y, 2), F.pixel_unshuffle(y, 2), p, idx, q, idx2


# ---- cases -----------------------------------------------------------------------------------------
RNG = np.random.default_rng(0)


def rn(*shape): return torch.tensor(RNG.standard_normal(shape).astype(np.float32))


for opset in (13, 17):
  torch.manual_seed(opset)
  case(f"mlp opset {opset}", check_model, MLP(), (rn(4, 8),), opset, "mlp")
  case(f"cnn + BatchNormalization opset {opset}", check_model, randomize_bn(CNN()), (rn(2, 3, 16, 16),), opset, "cnn",
       do_constant_folding=False, training=torch.onnx.TrainingMode.PRESERVE)
  case(f"resnet basic block opset {opset}", check_model, randomize_bn(BasicBlock()), (rn(2, 8, 8, 8),), opset, "block")
  case(f"transformer encoder (2 layers) opset {opset}", check_model, Encoder(), (torch.randint(0, 11, (2, 5)),), opset,
       "enc", rtol=2e-4, atol=2e-5)
  case(f"attention block opset {opset}", check_model, Attention(), (rn(2, 5, 16),), opset, "attn", rtol=2e-4, atol=2e-5)
  case(f"dynamic batch via Shape ops opset {opset}", check_model, DynFlatten(), (rn(3, 2, 5, 5),), opset, "dyn",
       dynamic={"in0": {0: "batch"}}, extra_args=[(rn(5, 2, 5, 5),)])
  case(f"misc ops opset {opset}", check_model, Misc(), (rn(4, 8),), opset, "misc", dynamic={"in0": {0: "batch"}},
       extra_args=[(rn(6, 8),)])
  case(f"pad + conv transpose opset {opset}", check_model, PadConvT(), (rn(2, 4, 5, 6),), opset, "padct")
  case(f"gather, equal, pow opset {opset}", check_model, Gathers(), (rn(3, 6).abs(), torch.tensor([[0, 5], [2, 2]])),
       opset, "gather")
  case(f"resize / upsample opset {opset}", check_model, Resizes(), (rn(2, 3, 5, 6),), opset, "resize")
  perm = torch.tensor(RNG.permutation(40).reshape(5, 8).astype(np.float32))  # distinct values
  case(f"topk opset {opset}", check_model, TopKs(), (perm,), opset, "topk")
  case(f"group norm, pixel shuffle, max pool indices opset {opset}", check_model, Blocks(), (rn(2, 8, 6, 6),), opset,
       "blocks")


def _describe():
  m = nn.Linear(8, 3)
  path = export(m, (rn(2, 8),), 13, "describe", dynamic={"in0": {0: "batch"}})
  with tg.OnnxModel(path) as om:
    assert om.inputs() == [("in0", tg.FLOAT32, (-1, 8))], om.inputs()
    outs = om.outputs()
    assert len(outs) == 1 and outs[0][1] == tg.FLOAT32 and outs[0][2][1] == 3, outs
    assert tg.lib.tg_onnx_input_dim_param(om.m, 0, 0) == b"batch"
    # wrong input count, dtype, shape
    for args, words in [((), ["tg_onnx_run", "1 input"]),
                        ((Tensor(np.zeros((2, 8), np.float64)),), ["tg_onnx_run", "double", "float"]),
                        ((Tensor(np.zeros((2, 7), np.float32)),), ["tg_onnx_run", "in0", "dim 1"]),
                        ((Tensor(np.zeros((8,), np.float32)),), ["tg_onnx_run", "dims"])]:
      try:
        om.run(*args)
        raise AssertionError("no error")
      except TGError as e:
        assert all(w in str(e) for w in words), str(e)


case("inputs/outputs description and input checks", _describe)


def _errors():
  bad = os.path.join(TMP, "bad.onnx")
  with open(bad, "wb") as f: f.write(b"\x08\x07\x3a\xff\xff\x03")  # graph length past the end
  try:
    tg.OnnxModel(bad)
    raise AssertionError("no error")
  except TGError as e:
    assert "tg_onnx_load" in str(e) and "ModelProto.graph" in str(e) and "past the end" in str(e), str(e)

  class Unsup(nn.Module):
    def forward(self, x): return torch.nonzero(x)
  path = export(Unsup(), (rn(2, 3),), 13, "unsup")
  try:
    tg.OnnxModel(path)
    raise AssertionError("no error")
  except TGError as e:
    assert "tg_onnx_load" in str(e) and "NonZero" in str(e) and "not supported" in str(e), str(e)


case("load errors: truncated file, unsupported op", _errors)


def _outputs_owned():
  # outputs are new handles of the caller: freeing the model leaves them valid
  model = MLP().eval()
  path = export(model, (rn(2, 8),), 13, "own")
  m = tg.OnnxModel(path)
  x = rn(2, 8)
  (out,) = m.run(to_tg(x))
  m.free()
  with torch.no_grad():
    np.testing.assert_allclose(out.numpy(), model(x).numpy(), rtol=1e-4, atol=1e-5)


case("outputs outlive the model", _outputs_owned)


# ---- hand-built single-node models (attribute corners torch does not export) ------------------------
def _varint(v):
  v &= (1 << 64) - 1
  out = bytearray()
  while True:
    b = v & 0x7f
    v >>= 7
    out.append(b | (0x80 if v else 0))
    if not v: return bytes(out)


def _fld(num, payload):  # length-delimited field
  return _varint(num << 3 | 2) + _varint(len(payload)) + payload


def _int(num, v): return _varint(num << 3) + _varint(v)


def _attr(name, v):
  a = _fld(1, name.encode())
  if isinstance(v, float): return a + _varint(2 << 3 | 5) + np.float32(v).tobytes() + _int(20, 1)
  if isinstance(v, int): return a + _int(3, v) + _int(20, 2)
  if isinstance(v, str): return a + _fld(4, v.encode()) + _int(20, 3)
  if all(isinstance(e, float) for e in v):
    return a + b"".join(_varint(7 << 3 | 5) + np.float32(e).tobytes() for e in v) + _int(20, 6)
  return a + b"".join(_int(8, e) for e in v) + _int(20, 7)


_ONNX_DT = {np.dtype(np.float32): 1, np.dtype(np.uint8): 2, np.dtype(np.int8): 3, np.dtype(np.int32): 6,
            np.dtype(np.int64): 7, np.dtype(np.float64): 11}


def _tensor(name, a):
  a = np.ascontiguousarray(a)
  head = b"".join(_int(1, d) for d in a.shape) + _int(2, _ONNX_DT[a.dtype])
  return head + _fld(8, name.encode()) + _fld(9, a.tobytes())


def _vinfo(name, a=None):
  if a is None: return _fld(1, name.encode())
  shape = b"".join(_fld(1, _int(1, d)) for d in a.shape)
  return _fld(1, name.encode()) + _fld(2, _fld(1, _int(1, _ONNX_DT[a.dtype]) + _fld(2, shape)))


def node_model(op, inputs, consts=(), attrs=None, nout=1, opset=13):
  """A model of one node: inputs [(name, array)] are graph inputs, consts [(name, array)] initializers
  (an empty name is an omitted optional input); outputs y0..y{nout-1}. Returns the file's path."""
  names = [n for n, _ in inputs] + [n for n, _ in consts]
  node = b"".join(_fld(1, n.encode()) for n in names) + b"".join(_fld(2, f"y{i}".encode()) for i in range(nout))
  node += _fld(4, op.encode()) + b"".join(_fld(5, _attr(k, v)) for k, v in (attrs or {}).items())
  g = _fld(1, node) + _fld(2, b"g") + b"".join(_fld(5, _tensor(n, a)) for n, a in consts if n)
  g += b"".join(_fld(11, _vinfo(n, a)) for n, a in inputs) + b"".join(_fld(12, _vinfo(f"y{i}")) for i in range(nout))
  model = _int(1, 8) + _fld(8, _fld(1, b"") + _int(2, opset)) + _fld(7, g)
  path = os.path.join(TMP, f"node_{len(os.listdir(TMP))}.onnx")
  with open(path, "wb") as f: f.write(model)
  return path


def run_node(op, inputs, consts=(), attrs=None, nout=1, opset=13):
  with tg.OnnxModel(node_model(op, inputs, consts, attrs, nout, opset)) as m:
    return [o.numpy() for o in m.run(*[to_tg(a) for _, a in inputs])]


def expect_error(words, *a, **kw):
  try:
    run_node(*a, **kw)
  except TGError as e:
    assert all(w in str(e) for w in words), str(e)
    return
  raise AssertionError(f"no error (wanted {words})")


def np_resize(x, sizes, scales, mode="nearest", ctm="half_pixel", nearest_mode="round_prefer_floor", a=-0.75,
              exclude=False):
  """the ONNX spec's Resize, one axis at a time, one output point at a time"""
  for ax in range(x.ndim):
    n_in, n_out, sc = x.shape[ax], sizes[ax], scales[ax]
    if n_in == n_out and sc == 1 and ctm != "tf_half_pixel_for_nn": continue
    xt = np.moveaxis(x, ax, -1)
    y = np.zeros(xt.shape[:-1] + (n_out,), np.float64)
    for i in range(n_out):
      if ctm == "half_pixel": xo = (i + 0.5) / sc - 0.5
      elif ctm == "pytorch_half_pixel": xo = (i + 0.5) / sc - 0.5 if n_out > 1 else 0.0
      elif ctm == "align_corners": xo = i * (n_in - 1) / (n_out - 1) if n_out > 1 else 0.0
      elif ctm == "asymmetric": xo = i / sc
      elif ctm == "tf_half_pixel_for_nn": xo = (i + 0.5) / sc
      elif ctm == "half_pixel_symmetric": xo = n_in / 2 * (1 - n_out / (sc * n_in)) + (i + 0.5) / sc - 0.5
      if mode == "nearest":
        f = np.floor(xo)
        k = {"floor": f, "ceil": np.ceil(xo), "round_prefer_floor": f + 1 if xo - f > 0.5 else f,
             "round_prefer_ceil": f + 1 if xo - f >= 0.5 else f}[nearest_mode]
        y[..., i] = xt[..., int(min(max(k, 0), n_in - 1))]
        continue
      f = int(np.floor(xo))
      t = xo - f
      if mode == "linear": taps, w = [f, f + 1], [1 - t, t]
      else:
        def k(d): return ((a + 2) * d - (a + 3)) * d * d + 1 if d <= 1 else ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
        taps, w = [f - 1, f, f + 1, f + 2], [k(t + 1), k(t), k(1 - t), k(2 - t)]
      w = np.array(w)
      if exclude:
        w = np.where([0 <= p < n_in for p in taps], w, 0)
        w = w / w.sum()
      y[..., i] = sum(wj * xt[..., min(max(p, 0), n_in - 1)] for wj, p in zip(w, taps))
    x = np.moveaxis(y, -1, ax)
  return x


def _resize_nodes():
  x = RNG.standard_normal((2, 3, 5, 7)).astype(np.float32)
  X = [("x", x)]
  f32 = lambda *v: np.array(v, np.float32)  # noqa: E731
  i64 = lambda *v: np.array(v, np.int64)  # noqa: E731
  roi = ("", None)
  for mode in ("nearest", "linear", "cubic"):
    for ctm in ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "half_pixel_symmetric"):
      for nm in (("round_prefer_floor", "round_prefer_ceil", "floor", "ceil") if mode == "nearest" else ("",)):
        for sizes, scales in [((2, 3, 9, 4), None), (None, (1.0, 1.0, 1.7, 0.6)), (None, (1.0, 1.0, 2.0, 3.0)),
                              ((2, 3, 1, 10), None)]:
          attrs = {"mode": mode, "coordinate_transformation_mode": ctm}
          if nm: attrs["nearest_mode"] = nm
          for ex in ((0, 1) if mode == "cubic" else (0,)):
            if ex: attrs["exclude_outside"] = 1
            if mode == "cubic": attrs["cubic_coeff_a"] = -0.5
            c = [roi, ("scales", f32(*scales))] if scales else [roi, ("", None), ("sizes", i64(*sizes))]
            (got,) = run_node("Resize", X, c, attrs, opset=13)
            szs = sizes or tuple(int(np.floor(s * sc)) for s, sc in zip(x.shape, np.float32(scales)))
            scs = [float(np.float32(s)) for s in scales] if scales else [o / i for o, i in zip(sizes, x.shape)]
            want = np_resize(x.astype(np.float64), szs, scs, mode, ctm, nm or "round_prefer_floor",
                             -0.5 if mode == "cubic" else -0.75, bool(ex))
            assert got.shape == want.shape, (attrs, got.shape, want.shape)
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=str((attrs, sizes, scales)))
  # tf_half_pixel_for_nn (opset 11's nearest) at scale 1 still shifts
  (got,) = run_node("Resize", X, [roi, ("scales", f32(1, 1, 1, 1))],
                    {"coordinate_transformation_mode": "tf_half_pixel_for_nn", "nearest_mode": "ceil"}, opset=11)
  np.testing.assert_array_equal(got, np_resize(x, x.shape, [1] * 4, "nearest", "tf_half_pixel_for_nn", "ceil"))
  # opset 10: (X, scales); opset 18: axes and keep_aspect_ratio_policy
  (got,) = run_node("Resize", X, [("scales", f32(1, 1, 2, 2))], opset=10)
  np.testing.assert_array_equal(got, np_resize(x, (2, 3, 10, 14), [1, 1, 2, 2], "nearest", "half_pixel"))
  (got,) = run_node("Resize", X, [roi, ("", None), ("sizes", i64(8, 3))], {"axes": [3, -2], "mode": "linear"},
                    opset=18)
  np.testing.assert_allclose(got, np_resize(x, (2, 3, 3, 8), [1, 1, 3 / 5, 8 / 7], "linear"), rtol=1e-5, atol=1e-6)
  for pol, s in (("not_larger", 8 / 7), ("not_smaller", 9 / 5)):
    (got,) = run_node("Resize", X, [roi, ("", None), ("sizes", i64(9, 8))],
                      {"axes": [2, 3], "mode": "linear", "keep_aspect_ratio_policy": pol}, opset=18)
    want = np_resize(x, (2, 3, int(5 * s + 0.5), int(7 * s + 0.5)), [1, 1, s, s], "linear")
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  # integer input, resizing the channel dim too
  xi = RNG.integers(0, 255, (1, 2, 3, 4)).astype(np.uint8)
  (got,) = run_node("Resize", [("x", xi)], [roi, ("scales", f32(1, 2, 2, 1.5))], {"mode": "nearest"})
  assert got.dtype == np.uint8
  np.testing.assert_array_equal(got, np_resize(xi, (1, 4, 6, 6), [1, 2, 2, 1.5]).astype(np.uint8))
  # scales computed at run time (a graph input, read from the tensor)
  with tg.OnnxModel(node_model("Resize", [("x", x), ("roi", f32()), ("scales", f32(1, 1, 0.5, 2))], [],
                               {"mode": "linear", "coordinate_transformation_mode": "asymmetric"})) as m:
    (got,) = m.run(to_tg(x), to_tg(f32()), to_tg(f32(1, 1, 0.5, 2)))
    np.testing.assert_allclose(got.numpy(), np_resize(x, (2, 3, 2, 14), [1, 1, 0.5, 2], "linear", "asymmetric"),
                               rtol=1e-5, atol=1e-6)
  # Upsample: scales as attribute (opset 7) and as input (opset 9); asymmetric, nearest = floor
  for mode in ("nearest", "linear"):
    want = np_resize(x, (2, 3, 15, 14), [1, 1, 3, 2], mode, "asymmetric", "floor")
    (got,) = run_node("Upsample", X, [], {"mode": mode, "scales": [1.0, 1.0, 3.0, 2.0]}, opset=7)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    (got,) = run_node("Upsample", X, [("scales", f32(1, 1, 3, 2))], {"mode": mode}, opset=9)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  # refused attribute values
  sc = [roi, ("scales", f32(1, 1, 2, 2))]
  expect_error(["antialias"], "Resize", X, sc, {"mode": "linear", "antialias": 1}, opset=18)
  expect_error(["tf_crop_and_resize"], "Resize", X, sc, {"coordinate_transformation_mode": "tf_crop_and_resize"})
  expect_error(["nearest_mode", "round"], "Resize", X, sc, {"nearest_mode": "round"})
  expect_error(["mode", "area"], "Resize", X, sc, {"mode": "area"})
  expect_error(["Upsample", "cubic"], "Upsample", X, [], {"mode": "cubic", "scales": [1.0, 1.0, 2.0, 2.0]}, opset=7)
  expect_error(["scales and sizes"], "Resize", X, [roi, ("scales", f32(1, 1, 2, 2)), ("sizes", i64(2, 3, 4, 4))])
  expect_error(["scales", "3 entries", "4 axes"], "Resize", X, [roi, ("scales", f32(1, 2, 2))])


case("Resize / Upsample nodes: every mode, coordinate mode, nearest mode against the spec", _resize_nodes)


def _other_nodes():
  x = RNG.permutation(2 * 3 * 4 * 5).reshape(2, 3, 4, 5).astype(np.float32)
  X = [("x", x)]
  # TopK: k attribute (opset 1) and input, largest/sorted, axis
  for opset, kin, attrs in ((1, None, {"k": 3, "axis": 2}), (11, 3, {"axis": -2, "largest": 0}),
                            (11, 2, {"axis": 3, "sorted": 1})):
    v, i = run_node("TopK", X, [("k", np.array([kin], np.int64))] if kin else [], attrs, nout=2, opset=opset)
    t = torch.topk(torch.tensor(x), kin or 3, dim=attrs["axis"], largest=bool(attrs.get("largest", 1)))
    np.testing.assert_array_equal(v, t.values.numpy())
    assert i.dtype == np.int64
    np.testing.assert_array_equal(i, t.indices.numpy())
  expect_error(["K", "out of range"], "TopK", X, [("k", np.array([9], np.int64))], {"axis": 2}, nout=2)
  # GroupNormalization: per-group scale (opset 18) and per-channel (opset 21)
  xg = RNG.standard_normal((2, 6, 3, 4)).astype(np.float32)
  sg, bg = RNG.standard_normal(3).astype(np.float32), RNG.standard_normal(3).astype(np.float32)
  sc, bc = RNG.standard_normal(6).astype(np.float32), RNG.standard_normal(6).astype(np.float32)
  gn = F.group_norm(torch.tensor(xg), 3, None, None, 1e-3).numpy()
  (got,) = run_node("GroupNormalization", [("x", xg)], [("s", sg), ("b", bg)], {"num_groups": 3, "epsilon": 1e-3},
                    opset=18)
  np.testing.assert_allclose(got, gn * np.repeat(sg, 2)[:, None, None] + np.repeat(bg, 2)[:, None, None], rtol=1e-4,
                             atol=1e-5)
  (got,) = run_node("GroupNormalization", [("x", xg)], [("s", sc), ("b", bc)], {"num_groups": 3, "epsilon": 1e-3},
                    opset=21)
  want = F.group_norm(torch.tensor(xg), 3, torch.tensor(sc), torch.tensor(bc), 1e-3).numpy()
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
  expect_error(["num_groups 4"], "GroupNormalization", [("x", xg)], [("s", sc), ("b", bc)], {"num_groups": 4},
               opset=21)
  # DepthToSpace DCR / CRD and SpaceToDepth, against the spec's reshape/transpose
  xd = RNG.standard_normal((2, 8, 3, 2)).astype(np.float32)
  (got,) = run_node("DepthToSpace", [("x", xd)], [], {"blocksize": 2})
  want = xd.reshape(2, 2, 2, 2, 3, 2).transpose(0, 3, 4, 1, 5, 2).reshape(2, 2, 6, 4)
  np.testing.assert_array_equal(got, want)
  (got,) = run_node("DepthToSpace", [("x", xd)], [], {"blocksize": 2, "mode": "CRD"})
  np.testing.assert_array_equal(got, F.pixel_shuffle(torch.tensor(xd), 2).numpy())
  xs = x[..., :4]
  (got,) = run_node("SpaceToDepth", [("x", xs)], [], {"blocksize": 2})
  want = xs.reshape(2, 3, 2, 2, 2, 2).transpose(0, 3, 5, 1, 2, 4).reshape(2, 12, 2, 2)
  np.testing.assert_array_equal(got, want)
  expect_error(["blocksize 3"], "SpaceToDepth", [("x", xg)], [], {"blocksize": 3})
  # Hardmax: opset 13 along the axis (first maximum), opset 11 on the 2-D flattening
  xh = np.array([[[1, 3, 3], [2, 0, 1]], [[5, 5, 5], [0, 9, 1]]], np.float32)
  (got,) = run_node("Hardmax", [("x", xh)], [], {"axis": 1}, opset=13)
  np.testing.assert_array_equal(got, np.array([[[0, 1, 1], [1, 0, 0]], [[1, 0, 1], [0, 1, 0]]], np.float32))
  (got,) = run_node("Hardmax", [("x", xh)], [], {"axis": 1}, opset=11)
  want = np.zeros(12, np.float32).reshape(2, 6)
  want[0, 1] = want[1, 4] = 1
  np.testing.assert_array_equal(got, want.reshape(2, 2, 3))
  # MaxPool's Indices: flat over the whole input, row-major and (storage_order=1) column-major planes
  xm = RNG.standard_normal((2, 3, 5, 6)).astype(np.float32)
  v, i = run_node("MaxPool", [("x", xm)], [], {"kernel_shape": [2, 3], "strides": [2, 2], "pads": [1, 0, 0, 1]},
                  nout=2)
  flat = xm.reshape(-1)
  np.testing.assert_array_equal(flat[i], v)
  tv, ti = F.max_pool2d(F.pad(torch.tensor(xm), (0, 1, 1, 0), value=-np.inf), (2, 3), 2, return_indices=True)
  np.testing.assert_array_equal(v, tv.numpy())
  v2, i2 = run_node("MaxPool", [("x", xm)], [], {"kernel_shape": [2, 2], "storage_order": 1}, nout=2)
  h, w = (i2 % 30) % 5, (i2 % 30) // 5
  np.testing.assert_array_equal(xm.reshape(6, 5, 6)[(i2 // 30).reshape(-1), h.reshape(-1), w.reshape(-1)],
                                v2.reshape(-1))
  expect_error(["Indices", "4-d"], "MaxPool", [("x", xm[0])], [], {"kernel_shape": [2]}, nout=2)


case("TopK, GroupNormalization, DepthToSpace, SpaceToDepth, Hardmax, MaxPool Indices nodes", _other_nodes)


def _corner_nodes():
  x = np.arange(20, dtype=np.float32).reshape(4, 5)
  # Trilu: a diagonal far past the matrix (int64 max / min) selects all or nothing, as numpy (the cast of
  # 2^63 from a double was undefined, and the node failed "diagonal ... out of range")
  for k, upper in ((2**63 - 1, 1), (-2**63, 1), (2**63 - 1, 0), (-2**63, 0), (2**40, 1)):
    (y,) = run_node("Trilu", [("x", x)], [("k", np.array(k, np.int64))], {"upper": upper}, opset=14)
    want = np.triu(x, max(min(k, 99), -99)) if upper else np.tril(x, max(min(k, 99), -99))
    np.testing.assert_array_equal(y, want)
  # Pad: a constant_value beside another mode is ignored (ONNX), not an error
  for mode in ("reflect", "edge", "wrap"):
    (y,) = run_node("Pad", [("x", x)], [("p", np.array([2, 3, 1, 2], np.int64)), ("c", np.array(1.5, np.float32))],
                    {"mode": mode}, opset=19)
    np.testing.assert_array_equal(y, np.pad(x, ((2, 1), (3, 2)), mode=mode))
  # Range of int64 constants past 2^53: its length in exact integers (doubles made it 0 here)
  for a, b, d in ((2**60 + 1, 2**60 + 10, 3), (2**60 + 10, 2**60 + 1, -4), (-2**62, -2**62 + 7, 2)):
    (y,) = run_node("Range", [], [("a", np.array(a, np.int64)), ("b", np.array(b, np.int64)), ("d", np.array(d, np.int64))],
                    opset=13)
    np.testing.assert_array_equal(y, np.arange(a, b, d, dtype=np.int64))


case("Trilu with a diagonal past the matrix, Pad's constant_value beside another mode, int64 Range past 2^53", _corner_nodes)


def _quant_nodes():
  x = (RNG.standard_normal((2, 3, 4)) * 3).astype(np.float32)
  for dt, lo, hi in ((np.uint8, 0, 255), (np.int8, -128, 127)):
    for scale, zp, axis in ((np.float32(0.05), dt(3), 1), (np.array([0.02, 0.1, 0.03], np.float32),
                                                           np.array([1, 0, 2], dt), 1),
                            (np.array([0.05, 0.07, 0.01, 0.2], np.float32), np.array([0, 5, 2, 1], dt), -1)):
      shp = [1, 1, 1]
      if np.ndim(scale): shp[axis] = -1
      s, z = np.reshape(scale, shp), np.reshape(zp, shp).astype(np.float32)
      want = np.clip(np.round(x / s) + z, lo, hi).astype(dt)  # np.round: half to even, as the spec
      (q,) = run_node("QuantizeLinear", [("x", x)], [("s", np.array(scale)), ("z", np.array(zp))], {"axis": axis})
      assert q.dtype == dt
      np.testing.assert_array_equal(q, want)
      (d,) = run_node("DequantizeLinear", [("q", q)], [("s", np.array(scale)), ("z", np.array(zp))], {"axis": axis})
      np.testing.assert_allclose(d, (q.astype(np.float32) - z) * s, rtol=1e-6)
  (q,) = run_node("QuantizeLinear", [("x", x)], [("s", np.array(0.1, np.float32))])  # no zero point: uint8
  np.testing.assert_array_equal(q, np.clip(np.round(x / np.float32(0.1)), 0, 255).astype(np.uint8))
  expect_error(["blocked"], "DequantizeLinear", [("q", q)], [("s", np.ones((2, 3), np.float32))])
  a = RNG.integers(0, 255, (3, 5)).astype(np.uint8)
  b = RNG.integers(-128, 127, (5, 4)).astype(np.int8)
  for zps in ([], [("az", np.array(7, np.uint8))],
              [("az", np.array([1, 2, 3], np.uint8)), ("bz", np.array([4, -1, 0, 2], np.int8))]):
    (y,) = run_node("MatMulInteger", [("a", a), ("b", b)], zps)
    az = zps[0][1].astype(np.int32).reshape(-1, 1) if zps else 0
    bz = zps[1][1].astype(np.int32) if len(zps) > 1 else 0
    assert y.dtype == np.int32
    np.testing.assert_array_equal(y, (a.astype(np.int32) - az) @ (b.astype(np.int32) - bz))


case("QuantizeLinear, DequantizeLinear (per tensor, per axis), MatMulInteger nodes", _quant_nodes)


def main():
  import shutil
  try:
    return tg.run_cases(CASES, "test_onnx_torch")
  finally:
    shutil.rmtree(TMP, ignore_errors=True)


if __name__ == "__main__":
  sys.exit(main())
