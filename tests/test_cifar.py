"""test_cifar.py -- tg_cifar_load (tinygrad's nn.datasets.cifar) on small synthetic CIFAR-10 files.

Writes, in a temporary directory, both published versions with a few records per batch: the binary
one (data_batch_1.bin .. 5, test_batch.bin: 3073-byte records) and the python one (pickled dicts of a
(N, 3072) uint8 numpy array and a label list, pickle protocols 2 to 5, and a Python-2-style pickle
of str keys and data as cPickle wrote the real files), each as .tar.gz, plain .tar and an extracted
directory; checks every value and dtype against what tinygrad's cifar() computes from the same bytes
(train = the five batches concatenated; X = record[1:].reshape(3, 32, 32), Y = record[0], uint8),
the device argument, and that truncated, corrupt and foreign files are TG_ERR_IO errors naming
tg_cifar_load and the file. Every case runs in its own scope; the live handle count must be 0 at the end.

Run: /usr/bin/python3 tests/test_cifar.py   (TINYGRAD_LIB selects the library; TEST_FILTER=substr)
"""
import ctypes
import gzip
import io
import os
import pickle
import sys
import tarfile
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy as np  # noqa: E402

import tinygrad as tg  # noqa: E402
from tinygrad import Tensor, _T, lib  # noqa: E402
from torchcheck import expect_error  # noqa: E402

lib.tg_cifar_load.restype = ctypes.c_int
lib.tg_cifar_load.argtypes = [ctypes.c_char_p, ctypes.c_char_p] + [ctypes.POINTER(_T)] * 4
RNG = np.random.default_rng(7)
TMP = tempfile.mkdtemp(prefix="tg_cifar_")
NAMES = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
SIZES = [3, 1, 4, 2, 5, 6]  # records per batch


def batches():
  """(pixels (N, 3072) uint8, labels (N,)) per batch, fixed for the whole run."""
  return [(RNG.integers(0, 256, (n, 3072), dtype=np.uint8), RNG.integers(0, 10, n).astype(np.uint8)) for n in SIZES]


BATCHES = batches()


def expected():
  """tinygrad's cifar() on the binary records: the five training batches concatenated, then the test one."""
  recs = [np.concatenate([lab[:, None], px], 1) for px, lab in BATCHES]
  train, test = np.concatenate(recs[:5]), recs[5]
  return train[:, 1:].reshape(-1, 3, 32, 32), train[:, 0], test[:, 1:].reshape(-1, 3, 32, 32), test[:, 0]


def bin_member(px, lab): return np.concatenate([lab[:, None], px], 1).tobytes()


def py_member(px, lab, proto):
  return pickle.dumps({b"batch_label": b"training batch", b"labels": [int(v) for v in lab], b"data": px,
                       b"filenames": [b"x.png"] * len(lab)}, protocol=proto)


def py2_member(px, lab):
  """A pickle as Python 2's cPickle wrote the real batches: str keys and data as SHORT_BINSTRING / BINSTRING
  ('U' / 'T'), numpy's _reconstruct + BUILD, a dtype built with its byte order."""
  out = io.BytesIO()
  w = out.write

  def s(b): w((b"U" + bytes([len(b)]) if len(b) < 256 else b"T" + len(b).to_bytes(4, "little")) + b)
  w(b"\x80\x02}q\x00(")
  s(b"data")
  w(b"cnumpy.core.multiarray\n_reconstruct\nq\x01cnumpy\nndarray\nq\x02K\x00\x85q\x03")
  s(b"b")
  w(b"\x87q\x04Rq\x05(K\x01")
  w(b"M" + len(lab).to_bytes(2, "little") + b"M\x00\x0c\x86q\x06")
  w(b"cnumpy\ndtype\nq\x07")
  s(b"u1")
  w(b"K\x00K\x01\x87q\x08Rq\x09(K\x03")
  s(b"|")
  w(b"NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00tq\x0abK\x00")  # dtype state, BUILD; is_fortran False
  s(px.tobytes())
  w(b"tq\x0bb")  # array state (1, shape, dtype, False, data), BUILD
  s(b"labels")
  w(b"]q\x0c(" + b"".join(b"K" + bytes([int(v)]) for v in lab) + b"e")
  w(b"u.")
  return out.getvalue()


def write_tar(path, members, gz):
  with tarfile.open(path, "w:gz" if gz else "w") as tf:
    for name, data in members:
      ti = tarfile.TarInfo(name)
      ti.size = len(data)
      tf.addfile(ti, io.BytesIO(data))


def members(kind):
  if kind == "bin": return [(f"cifar-10-batches-bin/{n}.bin", bin_member(*b)) for n, b in zip(NAMES, BATCHES)]
  if kind == "py2": return [(f"cifar-10-batches-py/{n}", py2_member(*b)) for n, b in zip(NAMES, BATCHES)]
  proto = int(kind[2:])
  return [(f"cifar-10-batches-py/{n}", py_member(*b, proto)) for n, b in zip(NAMES, BATCHES)]


def write_dir(root, mem, sub=True):
  for name, data in mem:
    p = os.path.join(root, name if sub else os.path.basename(name))
    os.makedirs(os.path.dirname(p), exist_ok=True)
    with open(p, "wb") as f: f.write(data)


def load(path, device=None):
  outs = [_T() for _ in range(4)]
  st = lib.tg_cifar_load(None if path is None else path.encode(), None if device is None else device.encode(),
                         *[ctypes.byref(o) for o in outs])
  if st != 0:
    assert all(o.id == 0 for o in outs), "outputs must be none on error"
    msg = tg.last_error()
    lib.tg_clear_error()
    raise tg.TGError(msg)
  return [Tensor._wrap(o) for o in outs]


def check(path, device=None):
  got = load(path, device)
  for g, want, what in zip(got, expected(), ["X_train", "Y_train", "X_test", "Y_test"]):
    assert g.dtype == tg.UINT8, (what, g.dtype)
    assert g.shape == want.shape, (what, g.shape, want.shape)
    assert np.array_equal(g.numpy(), want), f"{what} of {path} differs"


CASES = []
def case(name, fn, *args): CASES.append((name, fn, args, {}))


for kind in ["bin", "py2", "py2_", "py3", "py4", "py5"]:
  def _formats(kind=kind):
    k = "py2" if kind == "py2_" else kind
    mem = members(k)
    if kind == "py2_": mem = [(n, py_member(*b, 2)) for (n, _), b in zip(mem, BATCHES)]  # python 3's protocol 2
    d = tempfile.mkdtemp(dir=TMP)
    write_tar(os.path.join(d, "c.tar.gz"), mem, True)
    write_tar(os.path.join(d, "c.tar"), mem, False)
    write_dir(os.path.join(d, "x"), mem)
    write_dir(os.path.join(d, "flat"), mem, sub=False)
    for p in ["c.tar.gz", "c.tar", "x", os.path.join("x", os.path.dirname(mem[0][0])), "flat"]:
      check(os.path.join(d, p))
  case(f"{kind}: tarball, tar, extracted directory (and its batches directory), every value", _formats)


def _device():
  d = tempfile.mkdtemp(dir=TMP)
  write_tar(os.path.join(d, "c.tar.gz"), members("bin"), True)
  got = load(os.path.join(d, "c.tar.gz"), "CPU:1")
  for g in got: assert g.device == "CPU:1", g.device
  assert np.array_equal(got[0].numpy(), expected()[0])


case("device argument: the tensors are made there", _device)


def _errors():
  d = tempfile.mkdtemp(dir=TMP)
  fn = "tg_cifar_load"

  def bad(name, mem, substr, gz=True, tar=True):
    p = os.path.join(d, name)
    if tar: write_tar(p, mem, gz)
    else: write_dir(p, mem)
    expect_error(fn, lambda: load(p), substr)
    return p

  b = members("bin")
  # a binary batch that is not whole records (names the member), a label outside 0..9
  bad("trunc.tar.gz", [(n, v[:-5] if i == 2 else v) for i, (n, v) in enumerate(b)], "data_batch_3.bin")
  bad("trunc_dir", [(n, v[:-5] if i == 5 else v) for i, (n, v) in enumerate(b)], "3073-byte records", tar=False)
  lab = bytearray(b[0][1])
  lab[3073] = 10
  bad("label.tar", [(b[0][0], bytes(lab))] + b[1:], "label 10", gz=False)
  bad("missing.tar.gz", b[:4] + b[5:], "data_batch_5.bin")
  bad("missing_dir", b[1:], "data_batch_1", tar=False)
  # python batches: truncated pickle, wrong shapes / dtypes / lengths, foreign and forbidden contents
  pb = members("py4")
  bad("ptrunc.tar.gz", [(n, v[:len(v) // 2] if i == 1 else v) for i, (n, v) in enumerate(pb)], "truncated pickle")
  px, lb = BATCHES[0]
  for what, blob, sub in [
      ("shape", pickle.dumps({b"data": px.reshape(-1, 3, 1024), b"labels": list(map(int, lb))}, protocol=4), "(N, 3072)"),
      ("dtype", pickle.dumps({b"data": px.astype(np.int16), b"labels": list(map(int, lb))}, protocol=4), "uint8"),
      ("count", pickle.dumps({b"data": px, b"labels": list(map(int, lb))[:-1]}, protocol=4), "labels"),
      ("nolabels", pickle.dumps({b"data": px}, protocol=4), "no key 'labels'"),
      ("notdict", pickle.dumps([px], protocol=4), "not a dict"),
      ("labelrange", pickle.dumps({b"data": px, b"labels": [11] * len(lb)}, protocol=4), "label 0 is 11"),
      ("listdata", pickle.dumps({b"data": [1, 2], b"labels": []}, protocol=4), "not a numpy array"),
      ("forbidden", pickle.dumps({b"data": px, b"labels": list(map(int, lb)), b"x": os.getcwd}, protocol=4), "forbidden"),
      ("fortran", pickle.dumps({b"data": np.asfortranarray(px), b"labels": list(map(int, lb))}, protocol=2), "Fortran"),
      ("trailing", pickle.dumps({b"data": px, b"labels": list(map(int, lb))}, protocol=4) + b"xx", "follow the pickle"),
      ("proto0", pickle.dumps({b"data": px, b"labels": list(map(int, lb))}, protocol=0), "pickle")]:
    bad(f"p_{what}.tar.gz", [(pb[0][0], blob)] + pb[1:], sub)
  # the archive itself: truncated gzip, garbage after it, not a tar, not CIFAR, empty, no file, NULL
  good = os.path.join(d, "good.tar.gz")
  write_tar(good, b, True)
  raw = open(good, "rb").read()
  for name, data, sub in [("cut.tar.gz", raw[:len(raw) // 2], "truncated gzip"), ("junk.tar.gz", raw + b"junk", "garbage"),
                          ("nottar.gz", gzip.compress(b"hello" * 300), fn),
                          ("empty.tar.gz", b"", "empty")]:
    p = os.path.join(d, name)
    with open(p, "wb") as f: f.write(data)
    expect_error(fn, lambda p=p: load(p), sub)
    expect_error(fn, lambda p=p: load(p), name)
  bad("other.tar.gz", [("foo/bar.txt", b"x")], "not cifar-10-binary.tar.gz")
  expect_error(fn, lambda: load(os.path.join(d, "nonexistent")), "nonexistent")
  expect_error(fn, lambda: load(None), "not packaged")
  outs = [_T() for _ in range(3)]
  assert lib.tg_cifar_load(good.encode(), None, *[ctypes.byref(o) for o in outs], None) != 0
  assert "output pointer 4" in tg.last_error() and all(o.id == 0 for o in outs)
  lib.tg_clear_error()


case("truncated, corrupt and foreign files are errors naming tg_cifar_load and the file", _errors)


def main():
  try:
    return tg.run_cases(CASES, "test_cifar")
  finally:
    import shutil
    shutil.rmtree(TMP, ignore_errors=True)


if __name__ == "__main__":
  sys.exit(main())
