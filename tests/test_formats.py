"""test_formats.py -- model-state file formats against their reference implementations.

  * tg_state_dict: set / get / replace / metadata, lifetimes across scopes, errors.
  * safetensors: files written by the `safetensors` package (numpy API; torch for bfloat16) for every
    dtype read back bit-exactly by tg_safe_load and tg_safe_load_mmap; files written by tg_safe_save
    read back by the package (tensors and __metadata__); round trips of lazy and strided tensors;
    atomic saving (a failed save leaves an existing file untouched, no temporary files remain);
    hostile files (truncated, huge header length, bad JSON, bad UTF-8, overlapping / out-of-range
    offsets, holes, size mismatches, unknown dtypes, duplicates) fail with a clear error.
  * GGUF: files written by gguf.GGUFWriter with F32/F16/BF16/F64/integer tensors and Q4_0, Q4_1,
    Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, MXFP4 blocks (from gguf.quants.quantize, or random blocks for
    the K-quants, which it cannot quantize) compared against gguf.quants.dequantize; every metadata
    value type; custom alignment; hostile files built byte by byte, and every truncation of a valid
    file.
  * tar: archives written by Python's tarfile in ustar, GNU and pax formats (long names, prefixes,
    directories, links, empty and odd-sized members) extracted exactly; hostile archives.

Every failure must name the function and the file. The live handle count must be 0 at the end.
Last line: "test_formats: N passed, N failed"; exit 1 on any failure.

Run: /usr/bin/python3 tests/test_formats.py   (TINYGRAD_LIB selects the library; TEST_FILTER=substr)
"""
import ctypes
import io
import os
import shutil
import struct
import sys
import tarfile
import tempfile
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy as np  # noqa: E402

import tinygrad as tg  # noqa: E402
from tinygrad import Tensor, _T, call, lib  # noqa: E402

RNG = np.random.default_rng(4321)

# ---- prototypes of the state-dict / formats section of include/tinygrad.h ------------------------
_P, _S, _I = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int
for _name, (_res, _args) in {
    "tg_state_dict_new": (_P, []), "tg_state_dict_free": (None, [_P]), "tg_state_dict_len": (_I, [_P]),
    "tg_state_dict_name": (_S, [_P, _I]), "tg_state_dict_tensor": (_T, [_P, _I]), "tg_state_dict_get": (_T, [_P, _S]), "tg_state_dict_has": (ctypes.c_bool, [_P, _S]), "tg_state_dict_cast": (_I, [_P, _I]),
    "tg_state_dict_set": (_I, [_P, _S, _T]), "tg_state_dict_meta_set": (_I, [_P, _S, _S]),
    "tg_state_dict_meta_get": (_S, [_P, _S]), "tg_state_dict_meta_len": (_I, [_P]),
    "tg_state_dict_meta_key": (_S, [_P, _I]), "tg_state_dict_meta_value": (_S, [_P, _I]),
    "tg_safe_load": (_P, [_S]), "tg_safe_load_mmap": (_P, [_S]), "tg_safe_save": (_I, [_P, _S]),
    "tg_gguf_load": (_P, [_S]), "tg_tar_extract": (_P, [_S]),
}.items():
  _f = getattr(lib, _name)
  _f.restype, _f.argtypes = _res, _args

TMP = tempfile.mkdtemp(prefix="tg-formats-")


class LoadError(Exception):
  pass


def load(fn, path):
  """Calls tg_<fn>(path); returns the dict pointer or raises LoadError with tg_last_error()."""
  lib.tg_clear_error()
  sd = getattr(lib, "tg_" + fn)(path.encode() if isinstance(path, str) else path)
  if not sd:
    msg = tg.last_error()
    lib.tg_clear_error()
    raise LoadError(msg or "(no error message)")
  if tg.last_error():
    msg = tg.last_error()
    lib.tg_clear_error()
    lib.tg_state_dict_free(sd)
    raise AssertionError(f"tg_{fn} succeeded but recorded an error: {msg}")
  return sd


def sd_items(sd):
  """[(name, Tensor)] in dict order (borrowed handles)."""
  return [(lib.tg_state_dict_name(sd, i).decode(), Tensor(_h=lib.tg_state_dict_tensor(sd, i)))
          for i in range(lib.tg_state_dict_len(sd))]


def sd_meta(sd):
  return {lib.tg_state_dict_meta_key(sd, i).decode(): lib.tg_state_dict_meta_value(sd, i).decode()
          for i in range(lib.tg_state_dict_meta_len(sd))}


def sd_raw(sd):
  """{name: (tg dtype, raw numpy storage array)}."""
  return {n: (t.dtype, t.raw()) for n, t in sd_items(sd)}


def expect_fail(fn, path, *phrases):
  """tg_<fn>(path) must fail; the message must name the function, the file and each phrase."""
  try:
    sd = load(fn, path)
  except LoadError as e:
    msg = str(e)
    assert f"tg_{fn}" in msg, f"message does not name tg_{fn}: {msg}"
    assert os.path.basename(path) in msg, f"message does not name the file: {msg}"
    for p in phrases:
      assert p.lower() in msg.lower(), f"message lacks {p!r}: {msg}"
    return msg
  lib.tg_state_dict_free(sd)
  raise AssertionError(f"tg_{fn} accepted a hostile file {path}")


def write(name, data):
  p = os.path.join(TMP, name)
  with open(p, "wb") as f:
    f.write(data)
  return p


# ---- test registry --------------------------------------------------------------------------------
CASES = []


def case(fn):
  CASES.append((fn.__name__, fn))
  return fn


def add_case(name, fn):
  CASES.append((name, fn))


def assert_eq_arr(got, want, what=""):
  """Same shape, dtype and bytes (so nan payloads, -0.0 and bfloat16 bits count)."""
  assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
  assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
  if np.ascontiguousarray(got).tobytes() != np.ascontiguousarray(want).tobytes():
    raise AssertionError(f"{what}: values differ: {got.reshape(-1)[:8]} vs {want.reshape(-1)[:8]}")


# ==================================================================================================
# state dict
# ==================================================================================================
@case
def test_state_dict_api():
  sd = lib.tg_state_dict_new()
  try:
    assert lib.tg_state_dict_len(sd) == 0 and lib.tg_state_dict_name(sd, 0) is None
    with tg.scope():
      a = Tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
      b = Tensor(np.array([1, 2, 3], dtype=np.int64))
      assert lib.tg_state_dict_set(sd, b"w", a.h) == 0
      assert lib.tg_state_dict_set(sd, b"b", b.h) == 0
      lazy = a + 1
      assert lib.tg_state_dict_set(sd, b"lazy", lazy.h) == 0
    # entries outlive the scope that made their tensors
    assert lib.tg_state_dict_len(sd) == 3
    assert [lib.tg_state_dict_name(sd, i) for i in range(3)] == [b"w", b"b", b"lazy"]
    w = Tensor(_h=lib.tg_state_dict_get(sd, b"w"))
    assert np.array_equal(w.numpy(), np.arange(6, dtype=np.float32).reshape(2, 3))
    assert np.array_equal(Tensor(_h=lib.tg_state_dict_get(sd, b"lazy")).numpy(), np.arange(6, dtype=np.float32).reshape(2, 3) + 1)
    assert lib.tg_state_dict_get(sd, b"missing").id == 0
    assert tg.last_error() == "tg_state_dict_get: no tensor named 'missing' (did you mean 'w'?)", tg.last_error()
    lib.tg_clear_error()
    assert lib.tg_state_dict_get(sd, b"lazzy").id == 0 and "did you mean 'lazy'?" in tg.last_error(), tg.last_error()
    lib.tg_clear_error()
    assert lib.tg_state_dict_has(sd, b"lazy") and not lib.tg_state_dict_has(sd, b"missing") and tg.last_error() is None
    assert Tensor(_h=lib.tg_state_dict_get(sd, b"b")).is_realized(), "a realized tensor stored in a dict must stay realized"
    # replace keeps the position and frees the old handle
    live = tg.live_count()
    with tg.scope():
      assert lib.tg_state_dict_set(sd, b"b", Tensor(np.array([7], dtype=np.int32)).h) == 0
    assert tg.live_count() == live
    assert lib.tg_state_dict_name(sd, 1) == b"b"
    assert Tensor(_h=lib.tg_state_dict_get(sd, b"b")).numpy().tolist() == [7]
    # metadata
    assert lib.tg_state_dict_meta_get(sd, b"k") is None
    assert lib.tg_state_dict_meta_set(sd, b"k", b"v1") == 0 and lib.tg_state_dict_meta_set(sd, b"k2", b"") == 0
    assert lib.tg_state_dict_meta_set(sd, b"k", b"v2") == 0
    assert sd_meta(sd) == {"k": "v2", "k2": ""} and lib.tg_state_dict_meta_key(sd, 0) == b"k"
    # errors
    assert lib.tg_state_dict_set(sd, b"", w.h) < 0 and "tg_state_dict_set" in tg.last_error()
    lib.tg_clear_error()
    assert lib.tg_state_dict_set(sd, b"x", _T(0)) < 0 and "tg_state_dict_set" in tg.last_error()
    lib.tg_clear_error()
    assert lib.tg_state_dict_set(None, b"x", w.h) < 0
    lib.tg_clear_error()
    assert lib.tg_state_dict_meta_set(sd, b"", b"v") < 0
    lib.tg_clear_error()
    assert lib.tg_state_dict_len(None) == 0 and lib.tg_state_dict_get(None, b"w").id == 0
  finally:
    lib.tg_state_dict_free(sd)
  lib.tg_state_dict_free(None)
  assert tg.live_count() == 0, f"{tg.live_count()} live handles after freeing the dict"


@case
def test_state_dict_cast():
  sd = make_sd({"w": np.arange(6, dtype=np.float32).reshape(2, 3) / 4, "idx": np.array([1, 2], np.int64),
                "h": np.array([0.5, -2], np.float16), "mask": np.array([True, False])})
  try:
    live = tg.live_count()
    assert lib.tg_state_dict_cast(sd, tg.FLOAT16) == 0, tg.last_error()
    assert tg.live_count() == live, "the replaced entries' handles must be freed"
    got = {n: (t.dtype, t.numpy()) for n, t in sd_items(sd)}
    assert [lib.tg_state_dict_name(sd, i) for i in range(4)] == [b"w", b"idx", b"h", b"mask"]
    assert got["w"][0] == tg.FLOAT16 and got["w"][1].tolist() == (np.arange(6).reshape(2, 3) / 4).tolist()
    assert got["idx"][0] == tg.INT64 and got["idx"][1].tolist() == [1, 2]
    assert got["h"][0] == tg.FLOAT16 and got["mask"][0] == tg.BOOL
    assert all(t.is_realized() for _, t in sd_items(sd))
    assert lib.tg_state_dict_cast(sd, tg.FLOAT64) == 0 and sd_items(sd)[0][1].dtype == tg.FLOAT64
    lib.tg_clear_error()
    assert lib.tg_state_dict_cast(sd, tg.INT32) < 0 and "not a floating-point dtype" in tg.last_error()
    lib.tg_clear_error()
    assert lib.tg_state_dict_cast(None, tg.FLOAT16) < 0
    lib.tg_clear_error()
  finally:
    lib.tg_state_dict_free(sd)


@case
def test_state_dict_many_names():
  sd = lib.tg_state_dict_new()
  try:
    with tg.scope():
      t = Tensor(np.zeros(1, dtype=np.float32))
      for i in range(3000): assert lib.tg_state_dict_set(sd, f"layer.{i}.weight".encode(), t.h) == 0
      for i in range(0, 3000, 7): assert lib.tg_state_dict_set(sd, f"layer.{i}.weight".encode(), t.h) == 0
    assert lib.tg_state_dict_len(sd) == 3000
    assert all(lib.tg_state_dict_get(sd, f"layer.{i}.weight".encode()).id for i in range(3000))
    assert lib.tg_state_dict_name(sd, 2999) == b"layer.2999.weight"
  finally:
    lib.tg_state_dict_free(sd)
  assert tg.live_count() == 0


# ==================================================================================================
# safetensors
# ==================================================================================================
import safetensors  # noqa: E402
import safetensors.numpy  # noqa: E402

NP_CASES = {
    "BOOL": (np.bool_, tg.BOOL), "U8": (np.uint8, tg.UINT8), "I8": (np.int8, tg.INT8), "I16": (np.int16, tg.INT16),
    "U16": (np.uint16, tg.UINT16), "I32": (np.int32, tg.INT32), "U32": (np.uint32, tg.UINT32),
    "I64": (np.int64, tg.INT64), "U64": (np.uint64, tg.UINT64), "F16": (np.float16, tg.FLOAT16),
    "F32": (np.float32, tg.FLOAT32), "F64": (np.float64, tg.FLOAT64),
}
SHAPES = [(), (0,), (1,), (5,), (2, 3), (2, 0, 3), (3, 1, 4, 2)]


def sample(dt, shape):
  dt = np.dtype(dt)
  n = int(np.prod(shape)) if shape else 1
  if dt == np.bool_: a = RNG.integers(0, 2, n).astype(np.bool_)
  elif dt.kind in "iu":
    info = np.iinfo(dt)
    a = RNG.integers(info.min, info.max, n, dtype=dt, endpoint=True)
    if n >= 2: a[0], a[1] = info.min, info.max
  else:
    a = RNG.standard_normal(n).astype(dt) * 100
    special = np.array([np.nan, np.inf, -np.inf, -0.0, np.finfo(dt).tiny, np.finfo(dt).max], dtype=dt)
    a[:min(n, len(special))] = special[:min(n, len(special))]
  return a.reshape(shape)


def _safe_load_dtype(st_name, npdt, tgdt):
  if True:
    tensors = {f"{st_name.lower()}_{i}": sample(npdt, s) for i, s in enumerate(SHAPES)}
    meta = {"format": "np", "dtype": st_name, "unicode": "h\u00e9llo \u2603 \U0001f600", "quote\"back\\slash": "line\nbreak"}
    path = os.path.join(TMP, f"st_{st_name}.safetensors")
    safetensors.numpy.save_file(tensors, path, metadata=meta)
    for fn in ("safe_load", "safe_load_mmap"):
      sd = load(fn, path)
      try:
        got = sd_raw(sd)
        assert sorted(got) == sorted(tensors), f"{fn}: names {sorted(got)}"
        for k, want in tensors.items():
          d, arr = got[k]
          assert d == tgdt, f"{fn} {k}: dtype {tg.dtype_name(d)}"
          assert_eq_arr(arr, want, f"{fn} {k}")
        assert sd_meta(sd) == meta, f"{fn}: metadata {sd_meta(sd)}"
      finally:
        lib.tg_state_dict_free(sd)


for _k, (_npdt, _tgdt) in NP_CASES.items():
  add_case(f"safe_load[{_k}]", lambda k=_k, a=_npdt, b=_tgdt: _safe_load_dtype(k, a, b))


@case
def test_safe_load_bf16_torch():
  import safetensors.torch
  import torch
  t = torch.randn(4, 33, dtype=torch.float32).to(torch.bfloat16)
  t[0, :4] = torch.tensor([float("nan"), float("inf"), -0.0, 1e38])
  f16 = torch.randn(7, dtype=torch.float16)
  path = os.path.join(TMP, "bf16.safetensors")
  safetensors.torch.save_file({"bf": t, "h": f16, "b": torch.tensor([True, False])}, path, metadata={"framework": "pt"})
  want_bits = t.view(torch.int16).numpy().view(np.uint16)
  for fn in ("safe_load", "safe_load_mmap"):
    sd = load(fn, path)
    try:
      got = sd_raw(sd)
      assert got["bf"][0] == tg.BFLOAT16
      assert_eq_arr(got["bf"][1], want_bits, "bf16 bits")
      assert_eq_arr(got["h"][1], f16.numpy(), "f16")
      assert got["b"][1].tolist() == [True, False]
      # bfloat16 math on the loaded tensor matches torch
      bf = Tensor(_h=lib.tg_state_dict_get(sd, b"bf"))
      with tg.scope():
        assert np.array_equal(bf.cast(tg.FLOAT32).numpy(), t.float().numpy(), equal_nan=True)
    finally:
      lib.tg_state_dict_free(sd)


@case
def test_safe_load_order_and_padding():
  # the reference writer sorts by dtype alignment and pads the header with spaces; file order is
  # data order, dict order is header order (what the JSON lists)
  tensors = {"z": np.ones(3, np.uint8), "a": np.arange(5, dtype=np.float64), "m": np.arange(3, dtype=np.int16)}
  path = os.path.join(TMP, "order.safetensors")
  safetensors.numpy.save_file(tensors, path)
  raw = open(path, "rb").read()
  hlen = struct.unpack("<Q", raw[:8])[0]
  import json
  header_names = [k for k in json.loads(raw[8:8 + hlen]) if k != "__metadata__"]
  sd = load("safe_load", path)
  try:
    assert [n for n, _ in sd_items(sd)] == header_names
  finally:
    lib.tg_state_dict_free(sd)


def make_sd(tensors, meta=None):
  """A tg_state_dict from {name: numpy array or (tg dtype, values)}; tensors built in a scope."""
  sd = lib.tg_state_dict_new()
  with tg.scope():
    for k, v in tensors.items():
      t = Tensor(v[1], dtype=v[0]) if isinstance(v, tuple) else Tensor(v)
      assert lib.tg_state_dict_set(sd, k.encode(), t.h) == 0
  for k, v in (meta or {}).items(): assert lib.tg_state_dict_meta_set(sd, k.encode(), v.encode()) == 0
  return sd


@case
def test_safe_save_read_by_reference():
  import safetensors.torch
  import torch
  tensors = {}
  for st_name, (npdt, _) in NP_CASES.items():
    for i, s in enumerate(SHAPES): tensors[f"{st_name}.{i}"] = sample(npdt, s)
  bf = RNG.standard_normal((3, 5)).astype(np.float32)
  meta = {"a": "1", "unicode": "\u00e9\u2603\U0001f600", "esc": "tab\tquote\"nl\n\x01"}
  sd = make_sd({**tensors, "bf16": (tg.BFLOAT16, bf)}, meta)
  path = os.path.join(TMP, "ours.safetensors")
  try:
    assert lib.tg_safe_save(sd, path.encode()) == 0, tg.last_error()
  finally:
    lib.tg_state_dict_free(sd)
  assert open(path, "rb").read(8) and (struct.unpack("<Q", open(path, "rb").read(8))[0] % 8) == 0, "header not padded to 8"
  # header in dict order, data laid out so that every tensor is aligned for its dtype
  import json
  raw = open(path, "rb").read()
  hdr = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])
  assert [k for k in hdr if k != "__metadata__"] == list(tensors) + ["bf16"], "header order is not dict order"
  isz = {"BOOL": 1, "U8": 1, "I8": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4,
         "I64": 8, "U64": 8, "F64": 8}
  for k, v in hdr.items():
    if k != "__metadata__": assert v["data_offsets"][0] % isz[v["dtype"]] == 0, f"{k} misaligned: {v}"
  # numpy for every dtype (torch 1.13 has no uint16/32/64), torch for bfloat16
  with safetensors.safe_open(path, framework="np") as f:
    assert f.metadata() == meta, f.metadata()
    assert sorted(f.keys()) == sorted(list(tensors) + ["bf16"])
    for k, want in tensors.items(): assert_eq_arr(f.get_tensor(k), want, f"reference read of {k}")
  with safetensors.safe_open(path, framework="pt") as f:
    bgot = f.get_tensor("bf16")
    assert bgot.dtype == torch.bfloat16
    assert np.array_equal(bgot.float().numpy(), tg.bf16_round(bf))


@case
def test_safe_roundtrip_lazy_and_strided():
  sd = lib.tg_state_dict_new()
  base = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
  with tg.scope():
    x = Tensor(base)
    views = {"permuted": x.permute(2, 0, 1), "lazy_sum": x * 2 + 1, "int_cast": x.cast(tg.INT16),
             "flipped": x.flip([1]), "shrunk": x.shrink([(0, 2), (1, 3), (0, 4)])}
    for k, v in views.items(): assert lib.tg_state_dict_set(sd, k.encode(), v.h) == 0
  want = {"permuted": base.transpose(2, 0, 1), "lazy_sum": base * 2 + 1, "int_cast": base.astype(np.int16),
          "flipped": base[:, ::-1], "shrunk": base[:, 1:3]}
  path = os.path.join(TMP, "lazy.safetensors")
  try:
    assert lib.tg_safe_save(sd, path.encode()) == 0, tg.last_error()
  finally:
    lib.tg_state_dict_free(sd)
  got = safetensors.numpy.load_file(path)
  for k, v in got.items(): assert_eq_arr(v, want[k], k)
  sd = load("safe_load", path)
  try:
    for k, (d, arr) in sd_raw(sd).items(): assert_eq_arr(arr, want[k], "ours " + k)
  finally:
    lib.tg_state_dict_free(sd)


@case
def test_safe_roundtrip_large_and_empty():
  big = RNG.standard_normal(1 << 20).astype(np.float32)
  for tensors in ({"big": big, "tiny": np.array(3, dtype=np.int8)}, {}):
    sd = make_sd(tensors)
    path = os.path.join(TMP, "rt.safetensors")
    try:
      assert lib.tg_safe_save(sd, path.encode()) == 0, tg.last_error()
    finally:
      lib.tg_state_dict_free(sd)
    for fn in ("safe_load", "safe_load_mmap"):
      sd = load(fn, path)
      try:
        got = sd_raw(sd)
        assert sorted(got) == sorted(tensors)
        for k, v in tensors.items(): assert_eq_arr(got[k][1], v, k)
      finally:
        lib.tg_state_dict_free(sd)
    assert safetensors.numpy.load_file(path).keys() == tensors.keys()


@case
def test_safe_load_mmap_is_private():
  a = np.arange(16, dtype=np.float32)
  path = os.path.join(TMP, "mm.safetensors")
  safetensors.numpy.save_file({"a": a}, path)
  before = open(path, "rb").read()
  sd = load("safe_load_mmap", path)
  try:
    t = Tensor(_h=lib.tg_state_dict_get(sd, b"a"))
    with tg.scope():
      r = Tensor(_h=call("assign", t.h, Tensor(np.full(16, 7, np.float32)).h))
      call("realize", r.h)
      assert np.all(Tensor(_h=lib.tg_state_dict_get(sd, b"a")).numpy() == 7)
  finally:
    lib.tg_state_dict_free(sd)
  assert open(path, "rb").read() == before, "assigning to a mapped tensor changed the file"


@case
def test_safe_save_atomic():
  d = os.path.join(TMP, "atomic")
  os.makedirs(d, exist_ok=True)
  path = os.path.join(d, "model.safetensors")
  safetensors.numpy.save_file({"old": np.arange(4, dtype=np.float32)}, path)
  os.chmod(path, 0o640)
  before = open(path, "rb").read()
  # failures before and after the temporary file exists leave the old file and no litter
  bad_meta = lib.tg_state_dict_new()
  with tg.scope():
    assert lib.tg_state_dict_set(bad_meta, b"x", Tensor(np.ones(2, np.float32)).h) == 0
  lib.tg_state_dict_meta_set(bad_meta, b"k", b"\xff\xfe")
  bad_name = make_sd({"__metadata__": np.ones(1, np.float32)})
  # the dict's own handle cannot be freed behind its back: tg_free refuses it, the entry stays valid
  borrowed = make_sd({"a": np.ones(3, np.float32)})
  lib.tg_clear_error()
  lib.tg_free(lib.tg_state_dict_tensor(borrowed, 0))
  assert "tg_free" in tg.last_error() and "borrowed from a state dict" in tg.last_error(), tg.last_error()
  lib.tg_clear_error()
  assert Tensor(_h=lib.tg_state_dict_tensor(borrowed, 0)).numpy().tolist() == [1, 1, 1]
  lib.tg_state_dict_free(borrowed)
  try:
    for sd, phrase in ((bad_meta, "utf-8"), (bad_name, "__metadata__")):
      lib.tg_clear_error()
      assert lib.tg_safe_save(sd, path.encode()) < 0
      msg = tg.last_error()
      lib.tg_clear_error()
      assert msg and "tg_safe_save" in msg and phrase.lower() in msg.lower(), msg
      assert open(path, "rb").read() == before, "a failed save changed the existing file"
      assert os.listdir(d) == ["model.safetensors"], os.listdir(d)
    # an unwritable directory: error, file intact (skipped as root, who can write anyway)
    if os.geteuid() != 0:
      os.chmod(d, 0o500)
      try:
        good = make_sd({"new": np.zeros(2, np.float32)})
        assert lib.tg_safe_save(good, path.encode()) < 0 and "tg_safe_save" in tg.last_error()
        lib.tg_clear_error()
        lib.tg_state_dict_free(good)
      finally:
        os.chmod(d, 0o700)
    # a missing directory
    assert lib.tg_safe_save(bad_name, os.path.join(d, "nodir", "x.safetensors").encode()) < 0
    lib.tg_clear_error()
    # success replaces the contents atomically, keeps the mode and leaves nothing else behind
    good = make_sd({"new": np.arange(3, dtype=np.int32)}, {"v": "2"})
    assert lib.tg_safe_save(good, path.encode()) == 0, tg.last_error()
    lib.tg_state_dict_free(good)
    assert os.listdir(d) == ["model.safetensors"]
    assert (os.stat(path).st_mode & 0o777) == 0o640
    assert list(safetensors.numpy.load_file(path)) == ["new"]
    assert lib.tg_safe_save(None, path.encode()) < 0
    lib.tg_clear_error()
  finally:
    for sd in (bad_meta, bad_name): lib.tg_state_dict_free(sd)


def st_file(header, data=b"", hlen=None, raw_header=False):
  import json
  h = header if raw_header else json.dumps(header).encode()
  if isinstance(h, str): h = h.encode()
  return struct.pack("<Q", len(h) if hlen is None else hlen) + h + data


ST_HOSTILE = [
    ("empty", b"", ["too short"]),
    ("seven_bytes", b"\x10\0\0\0\0\0\0", ["too short"]),
    ("huge_hlen", struct.pack("<Q", 1 << 62) + b"{}", ["header length", "limit"]),
    ("hlen_past_end", struct.pack("<Q", 1000) + b'{"a":1}', ["past the end"]),
    ("hlen_max", struct.pack("<Q", 2**64 - 1) + b"{}", ["header length"]),
    ("not_object", st_file(b"[1,2]", raw_header=True), ["'{'"]),
    ("truncated_json", st_file(b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]', raw_header=True, data=b"\0" * 4),
     ["unexpected end"]),
    ("trailing_comma", st_file(b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},}', raw_header=True, data=b"\0" * 4),
     ["expected a string"]),
    ("single_quotes", st_file(b"{'a':1}", raw_header=True), ["expected"]),
    ("unterminated_string", st_file(b'{"abc', raw_header=True), ["unterminated"]),
    ("bad_escape", st_file(b'{"a\\q":{}}', raw_header=True), ["escape"]),
    ("control_char", st_file(b'{"a\x01":{}}', raw_header=True), ["control character"]),
    ("lone_surrogate", st_file(b'{"\\udc00":{}}', raw_header=True), ["surrogate"]),
    ("bad_utf8_name", st_file(b'{"\xff\xfe":{"dtype":"U8","shape":[0],"data_offsets":[0,0]}}', raw_header=True), ["utf-8"]),
    ("overlong_utf8", st_file(b'{"\xc0\xaf":{"dtype":"U8","shape":[0],"data_offsets":[0,0]}}', raw_header=True), ["utf-8"]),
    ("garbage_after", st_file(b'{} x', raw_header=True), ["trailing"]),
    ("two_objects", st_file(b'{}{}', raw_header=True), ["trailing"]),
    ("nul_in_name", st_file(b'{"a\\u0000b":{"dtype":"U8","shape":[0],"data_offsets":[0,0]}}', raw_header=True), ["nul"]),
    ("wrong_dtype", st_file({"a": {"dtype": "F33", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4), ["dtype", "F33"]),
    ("unknown_dtype", st_file({"a": {"dtype": "F8_E8M0", "shape": [1], "data_offsets": [0, 1]}}, b"\0"), ["F8_E8M0"]),
    ("dtype_not_string", st_file({"a": {"dtype": 5, "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4), ["string"]),
    ("negative_dim", st_file({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, b"\0" * 4), ["negative"]),
    ("float_dim", st_file({"a": {"dtype": "F32", "shape": [1.5], "data_offsets": [0, 4]}}, b"\0" * 4), ["integer"]),
    ("huge_dim", st_file({"a": {"dtype": "F32", "shape": [2**40, 2**40], "data_offsets": [0, 4]}}, b"\0" * 4), ["too many"]),
    ("dim_overflow", st_file(b'{"a":{"dtype":"F32","shape":[99999999999999999999],"data_offsets":[0,4]}}', raw_header=True,
                             data=b"\0" * 4), ["too large"]),
    ("missing_offsets", st_file({"a": {"dtype": "F32", "shape": [1]}}, b"\0" * 4), ["data_offsets"]),
    ("missing_shape", st_file({"a": {"dtype": "F32", "data_offsets": [0, 4]}}, b"\0" * 4), ["shape"]),
    ("offsets_three", st_file({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4, 8]}}, b"\0" * 8), ["two entries"]),
    ("offsets_reversed", st_file({"a": {"dtype": "F32", "shape": [0], "data_offsets": [4, 0]}}, b"\0" * 4), ["end before begin"]),
    ("out_of_range", st_file({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 4), ["past the end"]),
    ("size_mismatch", st_file({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, b"\0" * 8), ["need 12"]),
    ("overlap", st_file({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                         "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, b"\0" * 12), ["overlaps"]),
    ("same_range", st_file({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                            "b": {"dtype": "I32", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 8), ["overlaps"]),
    ("hole", st_file({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, b"\0" * 8), ["belong to no tensor"]),
    ("trailing_data", st_file({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 12), ["cover 4"]),
    ("duplicate_name", st_file(b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],'
                               b'"data_offsets":[1,2]}}', raw_header=True, data=b"\0\0"), ["duplicate"]),
    ("duplicate_field", st_file(b'{"a":{"dtype":"U8","dtype":"U8","shape":[1],"data_offsets":[0,1]}}', raw_header=True,
                                data=b"\0"), ["duplicate"]),
    ("duplicate_metadata", st_file(b'{"__metadata__":{},"__metadata__":{}}', raw_header=True), ["duplicate"]),
    ("metadata_not_string", st_file({"__metadata__": {"a": 1}}), ["not a string"]),
    ("metadata_dup_key", st_file(b'{"__metadata__":{"k":"1","k":"2"}}', raw_header=True), ["duplicate"]),
    ("metadata_array", st_file({"__metadata__": ["a"]}), ["'{'"]),
    ("deep_nesting", st_file(b'{"a":{"x":' + b"[" * 200 + b"]" * 200 + b',"dtype":"U8","shape":[0],"data_offsets":[0,0]}}',
                             raw_header=True), ["nesting"]),
    ("nan_literal", st_file(b'{"a":{"x":NaN,"dtype":"U8","shape":[0],"data_offsets":[0,0]}}', raw_header=True),
     ["expected a value"]),
    ("leading_zero", st_file(b'{"a":{"dtype":"U8","shape":[01],"data_offsets":[0,1]}}', raw_header=True, data=b"\0"),
     ["leading zero"]),
    ("info_not_object", st_file({"a": [1, 2]}), ["tensor info"]),
    # a zero dimension does not excuse the others: 0 elements, but tg_from_data's limit is passed
    ("zero_beside_huge", st_file({"a": {"dtype": "F32", "shape": [0, 2**48, 2**48], "data_offsets": [0, 0]}}),
     ["too many elements", "non-zero dimensions"]),
]


def _safe_hostile(name, data, phrases):
  path = write(f"hostile_{name}.safetensors", data)
  for fn in ("safe_load", "safe_load_mmap"): expect_fail(fn, path, *phrases)


for _n, _d, _p in ST_HOSTILE: add_case(f"safe_hostile[{_n}]", lambda n=_n, d=_d, p=_p: _safe_hostile(n, d, p))


@case
def test_safe_hostile_truncations():
  tensors = {"a": np.arange(10, dtype=np.float32), "b": np.arange(3, dtype=np.int64)}
  path = os.path.join(TMP, "trunc_src.safetensors")
  safetensors.numpy.save_file(tensors, path, metadata={"k": "v"})
  full = open(path, "rb").read()
  for cut in range(len(full)):
    p = write("trunc.safetensors", full[:cut])
    try:
      expect_fail("safe_load", p)
    except AssertionError as e:
      raise AssertionError(f"cut at {cut}: {e}") from None


@case
def test_safe_accepts_extras():
  # unknown tensor fields are ignored (as the reference does); whitespace around the header is fine;
  # bool bytes other than 0/1 read as true
  hdr = b'  {"a" : {"extra": {"x": [1, 2.5e3, true, null, "s"]}, "dtype":"BOOL","shape":[3],"data_offsets":[0,3]} }   '
  path = write("extras.safetensors", st_file(hdr, raw_header=True, data=b"\x00\x01\x07"))
  for fn in ("safe_load", "safe_load_mmap"):
    sd = load(fn, path)
    try:
      assert sd_raw(sd)["a"][1].tolist() == [False, True, True]
      with tg.scope():
        t = Tensor(_h=lib.tg_state_dict_get(sd, b"a"))
        assert t.cast(tg.INT32).numpy().tolist() == [0, 1, 1]
    finally:
      lib.tg_state_dict_free(sd)


@case
def test_safe_misaligned_mmap():
  # an odd-length header makes every tensor misaligned in the mapping: the mmap loader must copy
  import json
  h = json.dumps({"a": {"dtype": "F64", "shape": [3], "data_offsets": [0, 24]},
                  "b": {"dtype": "I32", "shape": [2], "data_offsets": [24, 32]}}).encode()
  if len(h) % 2 == 0: h += b" "
  data = np.arange(3, dtype=np.float64).tobytes() + np.array([5, -6], np.int32).tobytes()
  path = write("misaligned.safetensors", struct.pack("<Q", len(h)) + h + data)
  sd = load("safe_load_mmap", path)
  try:
    got = sd_raw(sd)
    assert got["a"][1].tolist() == [0.0, 1.0, 2.0] and got["b"][1].tolist() == [5, -6]
  finally:
    lib.tg_state_dict_free(sd)


@case
def test_file_errors():
  for fn in ("safe_load", "safe_load_mmap", "gguf_load", "tar_extract"):
    expect_fail(fn, os.path.join(TMP, "does_not_exist.bin"), "cannot open")
    expect_fail(fn, TMP, "directory")
    lib.tg_clear_error()
    assert not getattr(lib, "tg_" + fn)(None)
    assert "NULL" in tg.last_error()
    lib.tg_clear_error()


@case
def test_load_from_fifo_refused():
  # non-regular files (a FIFO without a writer) are refused at once: no blocking open, no endless read
  fifo = os.path.join(TMP, "fifo")
  if os.path.exists(fifo): os.unlink(fifo)
  os.mkfifo(fifo)
  try:
    for fn in ("safe_load", "safe_load_mmap", "gguf_load", "tar_extract"):
      expect_fail(fn, fifo, "is not a regular file (a FIFO)")
  finally:
    os.unlink(fifo)


def _peak_growth_mib(fn, path):
  """Runs tg_<fn>(path) in a fresh process; returns how much the load raised its peak RSS (MiB)."""
  import subprocess
  code = f"""
import ctypes, sys
sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
import tinygrad as tg
from tinygrad import lib
f = lib.tg_{fn}; f.restype = ctypes.c_void_p; f.argtypes = [ctypes.c_char_p]
lib.tg_state_dict_free.argtypes = [ctypes.c_void_p]
def status(key):
  for line in open("/proc/self/status"):
    if line.startswith(key): return int(line.split()[1]) / 1024
with open("/proc/self/clear_refs", "w") as c: c.write("5")  # restart the peak (VmHWM) from here
before = status("VmRSS:")
sd = f({path!r}.encode())
assert sd, tg.last_error()
print(status("VmHWM:") - before)
lib.tg_state_dict_free(sd)
"""
  r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, r.stderr[-2000:]
  return float(r.stdout.strip().splitlines()[-1])


@case
def test_copying_loaders_peak_memory():
  # 16 tensors of 4 MiB: a loader that held the whole file while copying it would peak at 128 MiB
  # over its start; reading in parts (safetensors) or giving back each tensor's pages once copied
  # (GGUF, tar, .pt) keeps it near the 64 MiB the tensors need
  arrs = {f"t{i}": np.full(1 << 20, i, np.float32) for i in range(16)}
  st = os.path.join(TMP, "peak.safetensors")
  safetensors.numpy.save_file(arrs, st)
  gg = os.path.join(TMP, "peak.gguf")
  gguf_write(gg, [(k, v, None) for k, v in arrs.items()])
  tr = os.path.join(TMP, "peak.tar")
  with tarfile.open(tr, "w", format=tarfile.USTAR_FORMAT) as t:
    for k, v in arrs.items():
      b = v.tobytes()
      ti = tarfile.TarInfo(k)
      ti.size = len(b)
      t.addfile(ti, io.BytesIO(b))
  import torch
  pz, pl = os.path.join(TMP, "peak.zip.pt"), os.path.join(TMP, "peak.legacy.pt")
  torch.save({k: torch.from_numpy(v) for k, v in arrs.items()}, pz)
  torch.save({k: torch.from_numpy(v) for k, v in arrs.items()}, pl, _use_new_zipfile_serialization=False)
  for fn, path in (("safe_load", st), ("gguf_load", gg), ("tar_extract", tr), ("torch_load", pz), ("torch_load", pl)):
    grew = _peak_growth_mib(fn, path)
    assert grew < 100, f"tg_{fn} of a 64 MiB file raised the peak memory by {grew:.0f} MiB"


# ==================================================================================================
# GGUF
# ==================================================================================================
import gguf  # noqa: E402
from gguf import GGMLQuantizationType as Q  # noqa: E402


def gguf_write(path, tensors, kv=(), alignment=None):
  """tensors: [(name, array, raw_dtype or None)], kv: [(adder name, key, value)]."""
  w = gguf.GGUFWriter(path, "testarch")
  if alignment: w.add_custom_alignment(alignment)
  for adder, key, val in kv: getattr(w, "add_" + adder)(key, val)
  for name, arr, raw in tensors:
    if raw is None: w.add_tensor(name, arr)
    else: w.add_tensor(name, arr, raw_dtype=raw)
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()


def random_blocks(qtype, nblocks):
  """Random K-quant blocks with finite, moderate fp16 scales at the right places."""
  blck, tsize = gguf.GGML_QUANT_SIZES[qtype]
  b = RNG.integers(0, 256, (nblocks, tsize), dtype=np.uint8)
  scales = (RNG.uniform(0.001, 0.5, (nblocks, 2)) * RNG.choice([-1, 1], (nblocks, 2))).astype(np.float16).view(np.uint8)
  if qtype in (Q.Q4_K, Q.Q5_K): b[:, 0:4] = scales.reshape(nblocks, 4)
  elif qtype == Q.Q6_K: b[:, 208:210] = scales[:, 0:2]
  return b


@case
def test_gguf_plain_and_metadata():
  path = os.path.join(TMP, "plain.gguf")
  f32 = RNG.standard_normal((3, 8)).astype(np.float32)
  f16 = RNG.standard_normal((2, 2, 4)).astype(np.float16)
  f64 = RNG.standard_normal(5)
  ints = {np.int8: sample(np.int8, (7,)), np.int16: sample(np.int16, (2, 3)), np.int32: sample(np.int32, (4,)),
          np.int64: sample(np.int64, (3, 1))}
  bf = RNG.standard_normal((4, 6)).astype(np.float32)
  bf_bytes = gguf.quants.quantize(bf, Q.BF16)
  kv = [("uint8", "k.u8", 200), ("int8", "k.i8", -100), ("uint16", "k.u16", 65535), ("int16", "k.i16", -32768),
        ("uint32", "k.u32", 4000000000), ("int32", "k.i32", -2000000000), ("float32", "k.f32", 0.1),
        ("uint64", "k.u64", 2**64 - 1), ("int64", "k.i64", -2**63), ("float64", "k.f64", 1 / 3),
        ("bool", "k.true", True), ("bool", "k.false", False), ("string", "k.str", "h\u00e9llo \"w\"\norld"),
        ("array", "k.arr_i", [1, 2, 3]), ("array", "k.arr_s", ["a", "b\"q", "\u2603"]),
        ("array", "k.arr_f", [0.5, -1.25]), ("array", "k.arr_b", [True, False]),
        ("array", "k.nested", [[1, 2], [3]]), ("float32", "k.f32tiny", 1e-45), ("float64", "k.f64tiny", 5e-324)]
  tensors = [("f32", f32, None), ("f16", f16, None), ("f64", f64, None), ("bf16", bf_bytes, Q.BF16)]
  tensors += [(f"i{np.dtype(d).itemsize * 8}", a, None) for d, a in ints.items()]
  gguf_write(path, tensors, kv)
  sd = load("gguf_load", path)
  try:
    got = sd_raw(sd)
    assert_eq_arr(got["f32"][1], f32, "f32")
    assert_eq_arr(got["f16"][1], f16, "f16")
    assert_eq_arr(got["f64"][1], f64, "f64")
    assert got["bf16"][0] == tg.BFLOAT16 and got["bf16"][1].shape == (4, 6)
    assert np.array_equal(tg.bf16_bits_to_f32(got["bf16"][1]), gguf.quants.dequantize(bf_bytes, Q.BF16))
    for d, a in ints.items(): assert_eq_arr(got[f"i{np.dtype(d).itemsize * 8}"][1], a, str(d))
    assert [n for n, _ in sd_items(sd)] == [t[0] for t in tensors], "tensor order"
    m = sd_meta(sd)
    want = {"general.architecture": "testarch", "k.u8": "200", "k.i8": "-100", "k.u16": "65535", "k.i16": "-32768",
            "k.u32": "4000000000", "k.i32": "-2000000000", "k.f32": "0.1", "k.u64": str(2**64 - 1),
            "k.i64": str(-2**63), "k.f64": "0.3333333333333333", "k.true": "true", "k.false": "false",
            "k.str": "h\u00e9llo \"w\"\norld", "k.arr_i": "[1, 2, 3]", "k.arr_s": '["a", "b\\"q", "\u2603"]',
            "k.arr_f": "[0.5, -1.25]", "k.arr_b": "[true, false]", "k.nested": "[[1, 2], [3]]",
            "k.f32tiny": "1e-45", "k.f64tiny": "5e-324"}  # the shortest decimal that reads back exactly
    for k, v in want.items(): assert m.get(k) == v, f"metadata {k}: {m.get(k)!r} != {v!r}"
    assert list(m)[:2] == ["general.architecture", "k.u8"], list(m)[:3]
    # cross-check the key set against gguf's own reader
    r = gguf.GGUFReader(path)
    assert set(m) == set(r.fields) - {"GGUF.version", "GGUF.tensor_count", "GGUF.kv_count"}, set(m) ^ set(r.fields)
  finally:
    lib.tg_state_dict_free(sd)


QUANT_CASES = [Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.MXFP4]
KQUANT_CASES = [Q.Q4_K, Q.Q5_K, Q.Q6_K]


def _gguf_quantized(qt):
  shapes = [(64,), (3, 32), (2, 4, 96)]
  if True:
    tensors, want = [], {}
    for i, s in enumerate(shapes):
      x = (RNG.standard_normal(s) * RNG.uniform(0.01, 10)).astype(np.float32)
      if i == 0: x[:32] = 0  # an all-zero block
      q = gguf.quants.quantize(x, qt)
      tensors.append((f"t{i}", q, qt))
      want[f"t{i}"] = gguf.quants.dequantize(q, qt).reshape(s).astype(np.float32)
    path = os.path.join(TMP, f"q_{qt.name}.gguf")
    gguf_write(path, tensors)
    sd = load("gguf_load", path)
    try:
      got = sd_raw(sd)
      for k, w in want.items():
        assert got[k][0] == tg.FLOAT32
        assert_eq_arr(got[k][1], w, f"{qt.name} {k}")
    finally:
      lib.tg_state_dict_free(sd)


for _qt in QUANT_CASES: add_case(f"gguf_dequant[{_qt.name}]", lambda q=_qt: _gguf_quantized(q))


def _gguf_kquant(qt):
  if True:
    tensors, want = [], {}
    for i, s in enumerate([(256,), (3, 512)]):
      nb = int(np.prod(s)) // 256
      b = random_blocks(qt, nb)
      tensors.append((f"t{i}", b.reshape(s[:-1] + (-1,)), qt))
      want[f"t{i}"] = gguf.quants.dequantize(b.reshape(-1), qt).reshape(s).astype(np.float32)
    path = os.path.join(TMP, f"k_{qt.name}.gguf")
    gguf_write(path, tensors)
    sd = load("gguf_load", path)
    try:
      got = sd_raw(sd)
      for k, w in want.items():
        g = got[k][1]
        assert g.shape == w.shape, (g.shape, w.shape)
        if not np.array_equal(g, w):
          err = np.max(np.abs(g - w) / (np.abs(w) + 1e-6))
          assert err < 1e-6, f"{qt.name} {k}: max relative error {err}"
    finally:
      lib.tg_state_dict_free(sd)


for _qt in KQUANT_CASES: add_case(f"gguf_dequant[{_qt.name}]", lambda q=_qt: _gguf_kquant(q))


@case
def test_gguf_alignment_and_mixed():
  path = os.path.join(TMP, "align.gguf")
  a = RNG.standard_normal(3).astype(np.float32)  # 12 bytes: the next tensor needs padding
  x = RNG.standard_normal((2, 32)).astype(np.float32)
  q = gguf.quants.quantize(x, Q.Q8_0)
  b = np.arange(5, dtype=np.int16)
  gguf_write(path, [("a", a, None), ("q", q, Q.Q8_0), ("b", b, None)], alignment=64)
  sd = load("gguf_load", path)
  try:
    got = sd_raw(sd)
    assert_eq_arr(got["a"][1], a, "a")
    assert_eq_arr(got["q"][1], gguf.quants.dequantize(q, Q.Q8_0).reshape(2, 32), "q")
    assert_eq_arr(got["b"][1], b, "b")
    assert sd_meta(sd)["general.alignment"] == "64"
  finally:
    lib.tg_state_dict_free(sd)


@case
def test_gguf_no_tensors():
  path = os.path.join(TMP, "meta_only.gguf")
  gguf_write(path, [], [("string", "tokenizer.model", "gpt2")])
  sd = load("gguf_load", path)
  try:
    assert lib.tg_state_dict_len(sd) == 0 and sd_meta(sd)["tokenizer.model"] == "gpt2"
  finally:
    lib.tg_state_dict_free(sd)


def gs(s):
  b = s.encode() if isinstance(s, str) else s
  return struct.pack("<Q", len(b)) + b


def gguf_bytes(kvs=(), tensors=(), version=3, data=b"", align=32, ntensors=None, nkv=None, magic=b"GGUF"):
  """Hand-built GGUF. kvs: raw kv byte strings; tensors: (name, dims, type, offset)."""
  out = magic + struct.pack("<IQQ", version, len(tensors) if ntensors is None else ntensors, len(kvs) if nkv is None else nkv)
  for kv in kvs: out += kv
  for name, dims, typ, off in tensors:
    out += gs(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims) + struct.pack("<IQ", typ, off)
  out += b"\0" * ((-len(out)) % align)
  return out + data


def kv_u32(key, v): return gs(key) + struct.pack("<II", 4, v)


@case
def test_gguf_huge_array_summarized():
  # 12M int8 values would render as ~70 MB of text: the value becomes a summary, later keys still load
  n = 12_000_000
  kv = [gs("big") + struct.pack("<IIQ", 9, 1, n) + b"\x80" * n, gs("small") + struct.pack("<IIQ", 9, 1, 2) + b"\x01\xff",
        kv_u32("after", 7)]
  path = write("bigarray.gguf", gguf_bytes(kv))
  sd = load("gguf_load", path)
  try:
    m = sd_meta(sd)
    assert m["big"].startswith("[array of 12000000 int8") and "too large" in m["big"], m["big"][:100]
    assert m["small"] == "[1, -1]" and m["after"] == "7", m
  finally:
    lib.tg_state_dict_free(sd)


GGUF_HOSTILE = [
    ("empty", b"", ["not a GGUF"]),
    ("bad_magic", b"GGUG" + b"\0" * 40, ["not a GGUF"]),
    ("version1", gguf_bytes(version=1), ["version 1"]),
    ("version4", gguf_bytes(version=4), ["version 4"]),
    ("big_endian", b"GGUF" + struct.pack(">IQQ", 3, 0, 0), ["big-endian"]),
    ("truncated_counts", b"GGUF" + struct.pack("<I", 3) + b"\0" * 5, ["truncated"]),
    ("huge_kv_count", gguf_bytes(nkv=2**63), ["metadata count"]),
    ("huge_tensor_count", gguf_bytes(ntensors=2**60), ["tensor count"]),
    ("key_len_huge", b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 2**63) + b"abc" + b"\0" * 20, ["length"]),
    ("key_empty", gguf_bytes([gs("") + struct.pack("<IB", 0, 1)]), ["empty"]),
    ("key_dup", gguf_bytes([gs("a") + struct.pack("<IB", 0, 1), gs("a") + struct.pack("<IB", 0, 2)]), ["duplicate"]),
    ("bad_value_type", gguf_bytes([gs("a") + struct.pack("<IB", 13, 1) + b"\0" * 12]), ["unknown type 13"]),
    ("bad_bool", gguf_bytes([gs("a") + struct.pack("<IB", 7, 2) + b"\0" * 12]), ["bool"]),
    ("string_nul", gguf_bytes([gs("a") + struct.pack("<I", 8) + gs(b"x\0y")]), ["NUL"]),
    ("string_past_end", gguf_bytes([gs("a") + struct.pack("<IQ", 8, 1000) + b"abc"]), ["length 1000"]),
    # strings are UTF-8 (gguf's reader and tinygrad decode them so): keys, values, tensor names
    ("key_not_utf8", gguf_bytes([gs(b"k\xfe") + struct.pack("<IB", 0, 1)]), ["metadata key is not valid UTF-8"]),
    ("string_not_utf8", gguf_bytes([gs("a") + struct.pack("<I", 8) + gs(b"\xc3\x28")]), ["metadata string is not valid UTF-8"]),
    ("name_not_utf8", gguf_bytes(tensors=[(b"t\xff", [1], 0, 0)], data=b"\0" * 4), ["tensor name is not valid UTF-8"]),
    ("array_huge", gguf_bytes([gs("a") + struct.pack("<IIQ", 9, 4, 2**61) + b"\0" * 16]), ["does not fit"]),
    ("array_bad_elem", gguf_bytes([gs("a") + struct.pack("<IIQ", 9, 99, 1) + b"\0" * 16]), ["element type 99"]),
    ("array_nested_deep", gguf_bytes([gs("a") + struct.pack("<I", 9) + struct.pack("<IQ", 9, 1) * 20 + struct.pack("<IQ", 0, 0)]),
     ["nested deeper"]),
    ("align_zero", gguf_bytes([kv_u32("general.alignment", 0)]), ["power of two"]),
    ("align_odd", gguf_bytes([kv_u32("general.alignment", 48)]), ["power of two"]),
    ("align_type", gguf_bytes([gs("general.alignment") + struct.pack("<IQ", 10, 32)]), ["uint32"]),
    ("too_many_dims", gguf_bytes(tensors=[("t", [1] * 9, 0, 0)], data=b"\0" * 4), ["dimensions"]),
    ("unknown_type", gguf_bytes(tensors=[("t", [4], 77, 0)], data=b"\0" * 16), ["unknown ggml type 77"]),
    ("unsupported_type", gguf_bytes(tensors=[("t", [256], 10, 0)], data=b"\0" * 84), ["Q2_K", "not supported"]),
    ("block_mismatch", gguf_bytes(tensors=[("t", [33], 2, 0)], data=b"\0" * 64), ["block size"]),
    ("dims_overflow", gguf_bytes(tensors=[("t", [2**40, 2**40], 0, 0)], data=b"\0" * 4), ["too large"]),
    ("zero_beside_huge", gguf_bytes(tensors=[("t", [0, 2**48, 2**48], 0, 0)], data=b""), ["too large", "non-zero"]),
    ("misaligned", gguf_bytes(tensors=[("t", [1], 0, 4)], data=b"\0" * 40), ["alignment"]),
    ("past_end", gguf_bytes(tensors=[("t", [16], 0, 0)], data=b"\0" * 60), ["past the end"]),
    ("offset_huge", gguf_bytes(tensors=[("t", [1], 0, 2**64 - 32)], data=b"\0" * 4), ["past the end"]),
    ("overlap", gguf_bytes(tensors=[("a", [16], 0, 0), ("b", [16], 0, 32)], data=b"\0" * 96), ["overlap"]),
    ("dup_tensor", gguf_bytes(tensors=[("a", [1], 0, 0), ("a", [1], 0, 32)], data=b"\0" * 64), ["duplicate"]),
    ("empty_name", gguf_bytes(tensors=[("", [1], 0, 0)], data=b"\0" * 4), ["empty name"]),
    ("no_data", gguf_bytes(tensors=[("a", [1], 0, 0)], align=1)[:-0 or None], ["truncated"]),
]


for _n, _d, _p in GGUF_HOSTILE:
  add_case(f"gguf_hostile[{_n}]", lambda n=_n, d=_d, p=_p: expect_fail("gguf_load", write(f"hostile_{n}.gguf", d), *p))


@case
def test_gguf_truncations():
  path = os.path.join(TMP, "trunc_src.gguf")
  x = RNG.standard_normal((2, 32)).astype(np.float32)
  gguf_write(path, [("q", gguf.quants.quantize(x, Q.Q4_0), Q.Q4_0), ("f", x[0], None)],
             [("array", "k.arr", ["x", "yy"]), ("uint32", "k.n", 5)])
  full = open(path, "rb").read()
  sd = load("gguf_load", path)
  lib.tg_state_dict_free(sd)
  for cut in range(len(full)):
    p = write("trunc.gguf", full[:cut])
    try:
      expect_fail("gguf_load", p)
    except AssertionError as e:
      raise AssertionError(f"cut at {cut} of {len(full)}: {e}") from None


# ==================================================================================================
# tar
# ==================================================================================================
def tar_bytes(members, fmt):
  """members: [(name, bytes | 'dir' | ('sym', target))]."""
  bio = io.BytesIO()
  with tarfile.open(fileobj=bio, mode="w", format=fmt) as tf:
    for name, content in members:
      ti = tarfile.TarInfo(name)
      if content == "dir":
        ti.type = tarfile.DIRTYPE
        tf.addfile(ti)
      elif isinstance(content, tuple):
        ti.type = tarfile.SYMTYPE if content[0] == "sym" else tarfile.LNKTYPE
        ti.linkname = content[1]
        tf.addfile(ti)
      else:
        ti.size = len(content)
        tf.addfile(ti, io.BytesIO(content))
  return bio.getvalue()


def tar_reference(data):
  with tarfile.open(fileobj=io.BytesIO(data)) as tf:
    out = {}
    for m in tf.getmembers():
      if m.isreg(): out[m.name] = tf.extractfile(m).read()
    return out


def rand_bytes(n): return RNG.integers(0, 256, n, dtype=np.uint8).tobytes()


TAR_MEMBERS = [
    ("a.txt", b"hello\n"), ("empty", b""), ("dir", "dir"), ("dir/b.bin", rand_bytes(511)), ("dir/c.bin", rand_bytes(512)),
    ("dir/sub/d.bin", rand_bytes(513)), ("big.bin", rand_bytes(70000)), ("link", ("sym", "a.txt")),
    ("hard", ("lnk", "a.txt")), ("long/" + "x" * 120 + "/file.npy", rand_bytes(100)),
    ("p" * 60 + "/" + "q" * 60 + "/r.bin", rand_bytes(3)),  # fits ustar's prefix + name
    ("very/" * 60 + "deep.bin", rand_bytes(10)), ("unicod\u00e9/\u2603.txt", b"snow"), ("a.txt", b"second copy wins"),
]


@case
def test_tar_formats():
  for fmt_name, fmt in (("ustar", tarfile.USTAR_FORMAT), ("gnu", tarfile.GNU_FORMAT), ("pax", tarfile.PAX_FORMAT)):
    members = TAR_MEMBERS
    if fmt == tarfile.USTAR_FORMAT:  # ustar cannot store names over 255 bytes
      members = [m for m in TAR_MEMBERS if len(m[0].encode()) <= 100 or (len(m[0].encode()) <= 255 and "/" in m[0][-101:])]
    data = tar_bytes(members, fmt)
    want = tar_reference(data)
    path = write(f"t_{fmt_name}.tar", data)
    sd = load("tar_extract", path)
    try:
      items = sd_items(sd)
      names = [n for n, _ in items]
      first_order = list(dict.fromkeys(m[0] for m in members if isinstance(m[1], bytes)))
      assert names == first_order, f"{fmt_name}: names {names} != {first_order}"
      for n, t in items:
        assert t.dtype == tg.UINT8 and t.ndim == 1
        assert t.raw().tobytes() == want[n], f"{fmt_name}: contents of {n}"
      assert sorted(names) == sorted(want)
    finally:
      lib.tg_state_dict_free(sd)


@case
def test_tar_compressed_is_rejected():
  bio = io.BytesIO()
  with tarfile.open(fileobj=bio, mode="w:gz") as tf:
    ti = tarfile.TarInfo("a")
    ti.size = 1
    tf.addfile(ti, io.BytesIO(b"x"))
  expect_fail("tar_extract", write("c.tar.gz", bio.getvalue()), "gzip")


def tar_header(name=b"f", size=0, typ=b"0", magic=b"ustar\x0000", fix_checksum=True, size_field=None, prefix=b""):
  h = bytearray(512)
  h[0:len(name)] = name
  h[100:108] = b"0000644\0"
  h[124:136] = size_field if size_field is not None else b"%011o\0" % size
  h[136:148] = b"00000000000\0"
  h[156:157] = typ
  h[257:265] = magic
  h[345:345 + len(prefix)] = prefix
  if fix_checksum:
    h[148:156] = b" " * 8
    h[148:156] = b"%06o\0 " % sum(h)
  return bytes(h)


def pad512(b): return b + b"\0" * ((-len(b)) % 512)


TAR_HOSTILE = [
    ("empty", b"", ["empty file"]),
    ("short", b"x" * 100, ["truncated header"]),
    ("zero_first", b"\0" * 1024, ["end-of-archive"]),
    ("bad_checksum", tar_header(fix_checksum=False) + b"\0" * 1024, ["checksum"]),
    ("random", rand_bytes(2048), []),
    ("size_past_end", tar_header(size=5000) + b"\0" * 1024, ["only"]),
    ("size_garbage", tar_header(size_field=b"12x4567\0\0\0\0\0") + b"\0" * 1024, ["size field"]),
    ("base256_huge", tar_header(size_field=b"\x80" + b"\xff" * 11) + b"\0" * 1024, ["size"]),
    ("base256_negative", tar_header(size_field=b"\xff" * 12) + b"\0" * 1024, ["size field"]),
    ("longname_huge", tar_header(b"././@LongLink", size=10**9, typ=b"L") + b"\0" * 1024, ["only"]),
    ("longname_nul", tar_header(b"././@LongLink", size=4, typ=b"L") + pad512(b"a\0b\0") + tar_header(b"x") + b"\0" * 1024,
     []),
    ("longname_at_end", tar_header(b"././@LongLink", size=4, typ=b"L") + pad512(b"abc\0") + b"\0" * 1024, ["no member"]),
    ("pax_at_end", tar_header(b"pax", size=12, typ=b"x") + pad512(b"12 path=abc\n"), ["no member"]),
    ("pax_bad_length", tar_header(b"pax", size=12, typ=b"x") + pad512(b"99 path=abc\n") + tar_header() + b"\0" * 1024,
     ["pax"]),
    ("pax_no_newline", tar_header(b"pax", size=12, typ=b"x") + pad512(b"12 path=abcd") + tar_header() + b"\0" * 1024,
     ["pax"]),
    ("pax_size_huge", tar_header(b"pax", size=30, typ=b"x") + pad512(b"30 size=99999999999999999999\n") + tar_header() +
     b"\0" * 1024, ["pax"]),
    ("pax_size_past_end", tar_header(b"pax", size=15, typ=b"x") + pad512(b"15 size=100000\n") + tar_header() + b"\0" * 1024,
     ["only"]),
    ("data_truncated", tar_header(size=600) + b"x" * 300, ["only"]),
    ("padding_truncated", tar_header(size=600) + b"x" * 700, ["padding"]),
    ("empty_name", tar_header(b"", size=1) + pad512(b"x") + b"\0" * 1024, ["empty name"]),
]


def _tar_hostile(name, data, phrases):
  path = write(f"hostile_{name}.tar", data)
  if name == "longname_nul":  # GNU long names end at the first NUL, as tarfile reads them
    sd = load("tar_extract", path)
    got = {n: t.raw().tobytes() for n, t in sd_items(sd)}
    lib.tg_state_dict_free(sd)
    assert got == tar_reference(data) == {"a": b""}, got
    return
  expect_fail("tar_extract", path, *phrases)


for _n, _d, _p in TAR_HOSTILE: add_case(f"tar_hostile[{_n}]", lambda n=_n, d=_d, p=_p: _tar_hostile(n, d, p))


@case
def test_tar_lenient_endings():
  # no end-of-archive blocks and an old v7 header still extract
  body = tar_header(b"v7file", size=3, magic=b"\0" * 8) + pad512(b"abc") + tar_header(b"b", size=2) + pad512(b"hi")
  path = write("lenient.tar", body)
  sd = load("tar_extract", path)
  try:
    got = {n: t.raw().tobytes() for n, t in sd_items(sd)}
    assert got == {"v7file": b"abc", "b": b"hi"}, got
  finally:
    lib.tg_state_dict_free(sd)
  # ustar prefix joins with '/'; a base-256 size field is read
  h = tar_header(b"name.bin", size_field=b"\x80" + b"\0" * 10 + b"\x05", prefix=b"some/prefix")
  sd = load("tar_extract", write("prefix.tar", h + pad512(b"12345") + b"\0" * 1024))
  try:
    got = {n: t.raw().tobytes() for n, t in sd_items(sd)}
    assert got == {"some/prefix/name.bin": b"12345"}, got
  finally:
    lib.tg_state_dict_free(sd)


@case
def test_tar_truncations():
  data = tar_bytes([("a" * 150, b"x" * 700), ("b", b"yy")], tarfile.PAX_FORMAT)
  for cut in list(range(0, len(data), 37)) + [512, 1024, 1536, 2047]:
    p = write("trunc.tar", data[:cut])
    lib.tg_clear_error()
    sd = lib.tg_tar_extract(p.encode())
    if sd:  # a cut on a block boundary after complete members is a valid (unterminated) archive
      got = {n: t.raw().tobytes() for n, t in sd_items(sd)}
      try:
        want = tar_reference(data[:cut])
      except tarfile.TarError as e:
        lib.tg_state_dict_free(sd)
        raise AssertionError(f"cut {cut}: we extracted {list(got)} but tarfile says {e}") from None
      lib.tg_state_dict_free(sd)
      assert got == want, f"cut {cut}: {list(got)} vs {list(want)}"
    else:
      msg = tg.last_error()
      lib.tg_clear_error()
      assert msg and "tg_tar_extract" in msg, f"cut {cut}: {msg}"


# ==================================================================================================
def main():
  flt = os.environ.get("TEST_FILTER", "")
  passed = failed = 0
  for name, fn in CASES:
    if flt and flt not in name: continue
    lib.tg_clear_error()
    try:
      with tg.scope():
        fn()
      passed += 1
      print(f"ok   {name}")
    except Exception:
      failed += 1
      print(f"FAIL {name}")
      traceback.print_exc(file=sys.stdout)
  live = tg.live_count()
  if live == 0:
    passed += 1
    print("ok   live handles: 0")
  else:
    failed += 1
    print(f"FAIL live handles at the end: {live}")
  shutil.rmtree(TMP, ignore_errors=True)
  print(f"test_formats: {passed} passed, {failed} failed")
  sys.exit(1 if failed else 0)


if __name__ == "__main__":
  main()
