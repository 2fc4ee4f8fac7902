"""
torchcheck.py -- what the differential test programs (test_indexing_torch, test_processing_torch,
test_nn_torch) share: status checks, gradients, inputs built as views of other buffers, comparison with
PyTorch's results, expected errors and kernel counts. Built on tinygrad.py, the ctypes binding.
"""
import numpy as np
import torch

import tinygrad as tg
from tinygrad import Tensor, TGError, call, lib


def status(fn, st):
  """Raises the library's error for a negative status or a recorded error; returns st."""
  if st < 0: tg._raise(fn, st)
  if lib.tg_last_error(): tg._raise(fn)
  return st


def set_rg(t):
  call("set_requires_grad", t.h, True)
  return t


def backward(t): status("tg_backward", lib.tg_backward(t.h))


def grad(t):
  h = lib.tg_grad(t.h)
  if h.id == 0: raise AssertionError("no gradient")
  return Tensor._wrap(h)


def rnd(*shape, lo=-2.0, hi=2.0, dtype=np.float32, rng=None):
  return rng.uniform(lo, hi, size=shape).astype(dtype)


def view_of(arr, kind):
  """A tg Tensor equal to arr built as a (non-contiguous) view of another buffer."""
  if kind == "contig" or arr.ndim == 0: return Tensor(arr)
  if kind == "permuted":
    order = list(range(arr.ndim))[::-1]
    return Tensor(np.ascontiguousarray(arr.transpose(order))).permute(order)
  if kind == "flipped": return Tensor(np.ascontiguousarray(np.flip(arr, 0))).flip(0)
  if kind == "shrunk":
    big = np.zeros(tuple(s + 3 for s in arr.shape), dtype=arr.dtype)
    big[tuple(slice(1, 1 + s) for s in arr.shape)] = arr
    return Tensor(big).shrink([(1, 1 + s) for s in arr.shape])
  if kind == "padded":  # a pad view that is then cropped back (pad + shrink chain)
    t = Tensor(arr).pad([(2, 1)] + [(0, 0)] * (arr.ndim - 1))
    return t.shrink([(2, 2 + arr.shape[0])] + [(0, s) for s in arr.shape[1:]])
  if kind == "expanded":  # broadcast view: arr must have a size-1 leading dim in the source
    src = arr[:1]
    if not np.array_equal(np.broadcast_to(src, arr.shape), arr): raise ValueError("not expandable")
    return Tensor(np.ascontiguousarray(src)).expand(*arr.shape)
  raise ValueError(kind)


def close(ours, ref, atol=1e-5, rtol=1e-4, what="value"):
  """ours (numpy) against PyTorch's (or numpy's) ref: exact for integers and bools, else within
  atol + rtol * |ref|; NaNs must match."""
  ref = ref.detach().cpu().numpy() if isinstance(ref, torch.Tensor) else np.asarray(ref)
  ours = np.asarray(ours)
  if ours.shape != ref.shape: raise AssertionError(f"{what}: shape {ours.shape} != reference {ref.shape}")
  if ref.dtype == np.bool_ or np.issubdtype(ref.dtype, np.integer):
    if not np.array_equal(ours.astype(np.int64), ref.astype(np.int64)):
      raise AssertionError(f"{what}: {ours} != reference {ref}")
    return
  np.testing.assert_allclose(ours.astype(np.float64), ref.astype(np.float64), atol=atol, rtol=rtol, err_msg=what,
                             equal_nan=True)


def expect_error(fn_name, f, substr=None):
  """f() must raise the library's error, naming fn_name (and containing substr)."""
  try:
    r = f()
  except TGError as e:
    msg = str(e)
    if fn_name not in msg: raise AssertionError(f"error message does not name {fn_name}: {msg!r}")
    if substr and substr not in msg: raise AssertionError(f"error message lacks {substr!r}: {msg!r}")
    return
  raise AssertionError(f"expected an error from {fn_name}, got {r!r}")


def kernels(f):
  """Kernels launched while realizing the tensor f() returns (inputs are realized by f first)."""
  t = f()
  tg.counters_reset()
  t.realize()
  return tg.counters().kernel_count


def pair(v):
  """A (size, 0) spec from an int, (0, 0) from None, the pair itself otherwise."""
  if v is None: return (0, 0)
  if isinstance(v, int): return (v, 0)
  return tuple(v)
