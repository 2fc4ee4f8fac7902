#!/usr/bin/env python3
"""beautiful_mnist in tinygrad.c and in PyTorch from the same start: same initial weights, same batches.

  /usr/bin/python3 bench/mnist_lockstep.py        (needs `make`: build/examples/beautiful_mnist)
  SEED=42 STEPS=70 BS=512 RUNS=6 /usr/bin/python3 bench/mnist_lockstep.py
  (reads safetensors with the `safetensors` package, which `make deps` installs for the tests)

Runs examples/beautiful_mnist with MNIST_TRACE (it writes its initial weights, every step's batch
indices and losses), then trains PyTorch's model (float32, 2 threads) from those weights on those
batches, and RUNS - 1 more times from the weights multiplied by (1 + 1e-7 * N(0, 1)) -- a change of
about one unit in the last place. It prints the loss of the first steps side by side and every
run's test accuracy.

What it shows: whether the two libraries compute the same training step (the first losses agree to
float32 rounding; the trajectories part slowly after that, as any two float32 implementations'
do), and how far a run's final accuracy moves when nothing but rounding differs -- the spread
against which a single run's accuracy (the 83% target at the defaults) has to be read.
"""
import os, re, statistics, subprocess, sys, tempfile
import numpy as np
import torch, torch.nn.functional as F
from safetensors.torch import load_file as safe_load  # the reader tests/test_formats.py checks us with
from mnist_torch import load, make_model

SEED = int(os.environ.get("SEED", "42"))
STEPS = int(os.environ.get("STEPS", "70"))
BS = int(os.environ.get("BS", "512"))
RUNS = max(1, int(os.environ.get("RUNS", "6")))
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXE = os.path.join(ROOT, "build", "examples", "beautiful_mnist")


def train(init, samples, data, perturb):
  """PyTorch's model from init (perturbed when perturb is a seed), Adam over the given batches.
  Returns the losses, the test accuracy and the trained model."""
  X_train, Y_train, X_test, Y_test = data
  model = make_model()
  sd = {k: init["layers." + k] for k in model.state_dict()}  # in the model's order: the perturbations follow it
  if perturb:
    g = torch.Generator().manual_seed(perturb)
    sd = {k: v * (1 + 1e-7 * torch.randn(v.shape, generator=g)) if v.is_floating_point() else v for k, v in sd.items()}
  model.load_state_dict(sd)
  opt = torch.optim.Adam(model.parameters())
  losses = []
  for s in samples:
    model.train()
    s = torch.tensor(s.astype(np.int64))
    opt.zero_grad()
    loss = F.cross_entropy(model(X_train[s]), Y_train[s])
    loss.backward()
    opt.step()
    losses.append(loss.item())
  model.eval()
  with torch.no_grad(): acc = (model(X_test).argmax(1) == Y_test).float().mean().item() * 100
  return losses, acc, model


def trace(seed, steps, bs, d, save=""):
  """Runs beautiful_mnist with MNIST_TRACE=d. Returns its test accuracy, losses, batch indices and
  initial weights."""
  env = dict(os.environ, SEED=str(seed), STEPS=str(steps), BS=str(bs), MNIST_TRACE=d, MNIST_SAVE=save)
  r = subprocess.run([EXE], env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
  m = re.search(r"test accuracy ([0-9.]+)%", r.stdout)
  if r.returncode != 0 or not m: raise RuntimeError(f"beautiful_mnist failed (exit {r.returncode}):\n{r.stdout}")
  with open(os.path.join(d, "losses.txt")) as f: losses = [float(x) for x in f.read().split()]
  samples = np.fromfile(os.path.join(d, "samples.bin"), np.int32).reshape(steps, bs)
  return float(m.group(1)), losses, samples, safe_load(os.path.join(d, "init.safetensors"))


def main():
  torch.set_num_threads(2)
  if not os.path.exists(EXE): sys.exit(f"{EXE} is missing: run `make` first")
  with tempfile.TemporaryDirectory() as d:
    try:
      ours_acc, ours, samples, init = trace(SEED, STEPS, BS, d)
    except RuntimeError as e:
      sys.exit(str(e))
  data = load()
  torch_losses, torch_acc, _ = train(init, samples, data, 0)
  print(f"beautiful_mnist, SEED={SEED}, BS={BS}, {STEPS} steps: tinygrad.c, then PyTorch from its weights and batches")
  print("step   tinygrad.c loss   PyTorch loss   difference")
  for i in range(min(STEPS, 5)):
    print(f"{i:4d}   {ours[i]:15.6f}   {torch_losses[i]:12.6f}   {ours[i] - torch_losses[i]:+.2e}")
  if STEPS:
    print(f"largest loss difference over all {STEPS} steps: {max(abs(a - b) for a, b in zip(ours, torch_losses)):.3f}")
  print(f"test accuracy: tinygrad.c {ours_acc:.2f}%, PyTorch {torch_acc:.2f}%")
  accs = [torch_acc]
  for k in range(1, RUNS):
    accs.append(train(init, samples, data, k)[1])
    print(f"PyTorch, weights perturbed by ~1 ulp (#{k}): {accs[-1]:.2f}%", flush=True)
  if RUNS > 1:
    print(f"PyTorch over {RUNS} runs that differ only in rounding: {min(accs):.2f}-{max(accs):.2f}%, "
          f"mean {statistics.mean(accs):.2f}%")


if __name__ == "__main__":
  main()
