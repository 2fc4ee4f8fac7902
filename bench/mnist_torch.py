#!/usr/bin/env python3
"""The beautiful_mnist model and train step in PyTorch (2 threads), for bench/mnist.py.

Prints one line: `torch step_ms=<median> eval_ms=<ms> first_step_ms=<ms> rss_mb=<peak> acc=<pct>`.
Usage: /usr/bin/python3 bench/mnist_torch.py STEPS BS   (SEED=n seeds torch; default 0)
TORCH_DEVICE=cuda runs it on the GPU (data and model there, each step timed to its completion with
torch.cuda.synchronize): the PyTorch CUDA eager reference of bench/mnist.py under DEV=CUDA.

bench/mnist_lockstep.py imports load() and make_model().
"""
import gzip, os, resource, sys, time
import numpy as np
import torch, torch.nn as nn, torch.nn.functional as F

D = (os.environ.get("MNIST_DIR") or "/usr/share/datasets/fashion-mnist").rstrip("/") + "/"


def load():
  """Fashion-MNIST as float32 images (N, 1, 28, 28) with values 0..255 and int64 labels."""
  def idx(name, off):
    with gzip.open(D + name) as f: return np.frombuffer(f.read(), np.uint8, offset=off)
  return (torch.tensor(idx("train-images-idx3-ubyte.gz", 16).reshape(-1, 1, 28, 28)).float(),
          torch.tensor(idx("train-labels-idx1-ubyte.gz", 8).astype(np.int64)),
          torch.tensor(idx("t10k-images-idx3-ubyte.gz", 16).reshape(-1, 1, 28, 28)).float(),
          torch.tensor(idx("t10k-labels-idx1-ubyte.gz", 8).astype(np.int64)))


def make_model():
  """tinygrad's layer list; the state dict's "<i>.weight" is tinygrad.c's "layers.<i>.weight"."""
  return nn.Sequential(nn.Conv2d(1, 32, 5), nn.ReLU(), nn.Conv2d(32, 32, 5), nn.ReLU(), nn.BatchNorm2d(32),
                       nn.MaxPool2d(2), nn.Conv2d(32, 64, 3), nn.ReLU(), nn.Conv2d(64, 64, 3), nn.ReLU(),
                       nn.BatchNorm2d(64), nn.MaxPool2d(2), nn.Flatten(1), nn.Linear(576, 10))


def main():
  torch.set_num_threads(2)
  STEPS, BS = int(sys.argv[1]), int(sys.argv[2])
  dev = os.environ.get("TORCH_DEVICE", "cpu")
  sync = torch.cuda.synchronize if dev.startswith("cuda") else (lambda: None)
  X_train, Y_train, X_test, Y_test = (t.to(dev) for t in load())
  torch.manual_seed(int(os.environ.get("SEED", "0")))
  model = make_model().to(dev)
  opt = torch.optim.Adam(model.parameters())

  def step():
    model.train()
    samples = torch.randint(0, X_train.shape[0], (BS,), device=dev)
    opt.zero_grad()
    loss = F.cross_entropy(model(X_train[samples]), Y_train[samples])
    loss.backward()
    opt.step()
    return loss

  times = []
  for i in range(STEPS):
    t = time.perf_counter(); step(); sync(); times.append(time.perf_counter() - t)
  model.eval()
  t = time.perf_counter()
  with torch.no_grad():
    acc = (model(X_test).argmax(1) == Y_test).float().mean().item() * 100  # (.item() waits for the GPU)
  ev = time.perf_counter() - t
  rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
  print(f"torch step_ms={np.median(times[1:]) * 1e3:.1f} eval_ms={ev * 1e3:.1f} first_step_ms={times[0] * 1e3:.1f} rss_mb={rss:.1f} acc={acc:.2f}")


if __name__ == "__main__":
  main()
