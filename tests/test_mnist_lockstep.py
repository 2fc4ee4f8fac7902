"""test_mnist_lockstep.py -- examples/beautiful_mnist's train step against PyTorch from the same start.

The example (built by `make`) runs one train step at a small batch with MNIST_TRACE, which writes its
initial weights, the step's batch indices and loss, and saves the trained weights; PyTorch's model
(bench/mnist_torch.py) is loaded with those weights and takes one Adam step on that batch
(bench/mnist_lockstep.py). The whole path -- layers, loss, autograd, Adam, BatchNorm's running
statistics, safe_save -- must give PyTorch's numbers: the loss and the running statistics to float32
rounding, and the weights to rounding too except where a gradient component is so close to zero that
rounding flips its sign (Adam's first step moves every weight by lr = 1e-3 against its gradient's
sign, whatever the gradient's size): a few per thousand at most. Later steps are not compared: those
few flipped weights make two float32 trajectories part within a few steps (bench/mnist_lockstep.py
shows how far).
Last line: "test_mnist_lockstep: N passed, N failed"; exit 1 on any failure.

Run: /usr/bin/python3 tests/test_mnist_lockstep.py   (after `make`)
"""
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "bench"))
import numpy as np  # noqa: E402
import torch  # noqa: E402

import tinygrad as tg  # noqa: E402
from mnist_lockstep import safe_load, trace, train  # noqa: E402
from mnist_torch import load  # noqa: E402

BS = 64
CASES = []


def _lockstep():
  torch.set_num_threads(2)
  with tempfile.TemporaryDirectory() as d:
    final = os.path.join(d, "final.safetensors")
    _, ours, samples, init = trace(7, 1, BS, d, save=final)
    trained = safe_load(final)
  assert len(ours) == 1 and samples.shape == (1, BS), "trace incomplete"
  assert samples.min() >= 0 and samples.max() < 60000 and len(np.unique(samples)) > BS // 2, "batch indices"
  losses, _, model = train(init, samples, load(), 0)
  assert abs(ours[0] - losses[0]) <= 1e-5 * abs(losses[0]), f"loss {ours[0]} vs PyTorch {losses[0]}"
  ref = {"layers." + k: v for k, v in model.state_dict().items()}
  assert sorted(ref) == sorted(trained), f"saved keys {sorted(trained)}"
  for k, v in ref.items():
    a, b = trained[k].double(), v.double()
    if k.endswith("num_batches_tracked"):
      assert a.item() == b.item() == 1, f"{k}: {a.item()} vs {b.item()}"
      continue
    assert (b - init[k].double()).abs().max().item() > 0, f"{k} did not change"
    diff = (a - b).abs()
    if "running" in k:
      assert diff.max().item() <= 1e-5 * b.abs().max().item(), f"{k}: difference {diff.max().item():.3g}"
      continue
    assert diff.median().item() <= 1e-7, f"{k}: median difference {diff.median().item():.3g}"
    flipped = (diff > 1e-5).sum().item()
    assert flipped <= max(1, diff.numel() // 200), f"{k}: {flipped} of {diff.numel()} differ by > 1e-5"


CASES.append(("beautiful_mnist's train step matches PyTorch's from the same weights and batch", _lockstep, (), {}))

if __name__ == "__main__":
  sys.exit(tg.run_cases(CASES, "test_mnist_lockstep"))
