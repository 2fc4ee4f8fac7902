"""test_onnx_torch.py -- the ONNX runner (src/nn/onnx.c) against PyTorch.

Each case builds a small torch model, exports it with torch.onnx.export (torch's own exporter, no
onnx package) into a temporary directory at opset 13 and 17, loads it with tg_onnx_load, runs it
with tg_onnx_run and compares the outputs with the torch model's (rtol 1e-4): an MLP, a CNN with
BatchNormalization kept as a node, a ResNet basic block, a 2-layer nn.TransformerEncoder, a model
whose shapes come from Shape ops (dynamic batch, run at two batch sizes), and models covering the
remaining ops (Split, Where, Expand, Range, ConstantOfShape, reductions with axes as input,
ArgMax, Pad, ConvTranspose, ...). Also the graph description accessors and error messages. Each
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
  case(f"topk opset {opset}", check_model, TopKs(), (torch.tensor(RNG.permutation(40).reshape(5, 8).astype(np.float32)),),
       opset, "topk")
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


def main():
  import shutil
  try:
    return tg.run_cases(CASES, "test_onnx_torch")
  finally:
    shutil.rmtree(TMP, ignore_errors=True)


if __name__ == "__main__":
  sys.exit(main())
