"""test_torch_load.py -- tg_torch_load against files written by PyTorch itself.

  * Files from torch.save in both formats (zip, the default, and the legacy format written with
    _use_new_zipfile_serialization=False): every supported dtype (bfloat16 compared by its bits),
    special values, 0-d and empty tensors, strided / offset / transposed / expanded / overlapping
    views, shared storages and shared tensor objects, nested dicts, lists and tuples, nn.Parameter,
    nn.Module state dicts, non-tensor values (metadata). Loaded values must match bit for bit.
  * Variants built from real files: deflated members, zip64 records, a big-endian byteorder record.
  * Hostile files: every truncation of small checkpoints, random byte corruption, unknown opcodes,
    corrupt pickles, huge declared sizes and views, deep nesting, cycles, exponential sharing,
    zip bombs -- and pickles that call os.system / builtins.eval (GLOBAL, STACK_GLOBAL, INST, OBJ,
    NEWOBJ forms) must fail with the "forbidden global" message and must NOT run: each would create a
    marker file, and plain pickle.loads of the same bytes is shown to create it.

Every failure must name tg_torch_load and the file. The live handle count must be 0 at the end.
Last line: "test_torch_load: N passed, N failed"; exit 1 on any failure.

Run: /usr/bin/python3 tests/test_torch_load.py   (TINYGRAD_LIB selects the library; TEST_FILTER=substr)
"""
import collections
import ctypes
import io
import os
import pickle
import shutil
import struct
import sys
import tempfile
import traceback
import zipfile
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy as np  # noqa: E402
import torch  # noqa: E402

import tinygrad as tg  # noqa: E402
from tinygrad import Tensor, _T, lib  # noqa: E402
from zipbytes import raw_zip  # noqa: E402

# ---- prototypes of the state-dict / torch_load section of include/tinygrad.h ---------------------
_P, _S, _I = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int
for _name, (_res, _args) in {
    "tg_state_dict_free": (None, [_P]), "tg_state_dict_len": (_I, [_P]), "tg_state_dict_name": (_S, [_P, _I]),
    "tg_state_dict_tensor": (_T, [_P, _I]), "tg_state_dict_meta_len": (_I, [_P]),
    "tg_state_dict_meta_key": (_S, [_P, _I]), "tg_state_dict_meta_value": (_S, [_P, _I]),
    "tg_torch_load": (_P, [_S]),
}.items():
  _f = getattr(lib, _name)
  _f.restype, _f.argtypes = _res, _args

TMP = tempfile.mkdtemp(prefix="tg-torch-load-")
torch.manual_seed(1234)
RNG = np.random.default_rng(1234)

TORCH_TO_TG = {torch.float32: tg.FLOAT32, torch.float64: tg.FLOAT64, torch.float16: tg.FLOAT16,
               torch.bfloat16: tg.BFLOAT16, torch.int64: tg.INT64, torch.int32: tg.INT32, torch.int16: tg.INT16,
               torch.int8: tg.INT8, torch.uint8: tg.UINT8, torch.bool: tg.BOOL}


class LoadError(Exception):
  pass


def tg_load(path):
  """tg_torch_load(path) -> ({name: (tg dtype, raw numpy array)}, {meta key: value}, [names in order])."""
  lib.tg_clear_error()
  sd = lib.tg_torch_load(path.encode())
  if not sd:
    msg = tg.last_error()
    lib.tg_clear_error()
    raise LoadError(msg or "(no error message)")
  try:
    if tg.last_error(): raise AssertionError(f"tg_torch_load succeeded but recorded an error: {tg.last_error()}")
    names = [lib.tg_state_dict_name(sd, i).decode() for i in range(lib.tg_state_dict_len(sd))]
    out = {}
    for i, n in enumerate(names):
      t = Tensor(_h=lib.tg_state_dict_tensor(sd, i))
      assert t.is_realized, f"{n} is not realized"
      out[n] = (t.dtype, t.raw())
    meta = {lib.tg_state_dict_meta_key(sd, i).decode(): lib.tg_state_dict_meta_value(sd, i).decode()
            for i in range(lib.tg_state_dict_meta_len(sd))}
    return out, meta, names
  finally:
    lib.tg_clear_error()
    lib.tg_state_dict_free(sd)


def torch_raw(t):
  """(tg dtype, numpy array of the storage bits) of a torch tensor, as tg's Tensor.raw() gives them."""
  t = t.detach().contiguous()
  if t.dtype == torch.bfloat16: return tg.BFLOAT16, t.view(torch.int16).numpy().view(np.uint16)
  return TORCH_TO_TG[t.dtype], t.numpy()


def flatten(obj, prefix=""):
  """The names tg_torch_load gives the tensors of obj: dict keys and list indices joined with dots."""
  if isinstance(obj, torch.Tensor): return {prefix or "tensor": obj}
  out = {}
  items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, (list, tuple)) else []
  for k, v in items:
    name = f"{prefix}.{k}" if prefix else f"{k}"
    if isinstance(v, (torch.Tensor, dict, list, tuple)): out.update(flatten(v, name))
  return out


def check_same(obj, loaded):
  exp = flatten(obj)
  assert set(exp) == set(loaded), f"names differ: expected {sorted(exp)}, got {sorted(loaded)}"
  for n, t in exp.items():
    edt, e = torch_raw(t)
    gdt, g = loaded[n]
    assert gdt == edt, f"{n}: dtype {tg.dtype_name(gdt)}, expected {tg.dtype_name(edt)}"
    assert tuple(g.shape) == tuple(e.shape), f"{n}: shape {g.shape}, expected {e.shape}"
    assert g.tobytes() == e.tobytes(), f"{n}: values differ\n got {g.ravel()[:8]}\n exp {e.ravel()[:8]}"


def save_both(obj, name, protocol=2):
  """torch.save in both formats; returns [(format, path)]."""
  out = []
  for fmt in ("zip", "legacy"):
    p = os.path.join(TMP, f"{name}.{fmt}.pt")
    torch.save(obj, p, _use_new_zipfile_serialization=(fmt == "zip"), pickle_protocol=protocol)
    out.append((fmt, p))
  return out


def expect_fail(path, *phrases):
  try:
    r = tg_load(path)
  except LoadError as e:
    msg = str(e)
    assert "tg_torch_load" in msg, f"message does not name tg_torch_load: {msg}"
    assert path in msg, f"message does not name the file: {msg}"
    for ph in phrases: assert ph in msg, f"message lacks {ph!r}: {msg}"
    return msg
  raise AssertionError(f"loading {path} succeeded (expected an error with {phrases}); got {sorted(r[0])[:5]}")


def write(name, data):
  p = os.path.join(TMP, name)
  with open(p, "wb") as f: f.write(data)
  return p


# ---- crafting checkpoints ------------------------------------------------------------------------
class FakeStorage:
  """Pickles as the persistent id of a storage: ('storage', <torch.XStorage>, key, 'cpu', numel)."""

  def __init__(self, key, stype, numel, legacy=False, view=None):
    self.pid = ("storage", stype, key, "cpu", numel) + ((view,) if legacy else ())


class Call:
  """Pickles as REDUCE(fn, args) for any fn picklable by reference."""

  def __init__(self, fn, args): self.fn, self.args = fn, args
  def __reduce__(self): return (self.fn, self.args)


def rebuild(storage, offset, size, stride):
  return Call(torch._utils._rebuild_tensor_v2, (storage, offset, tuple(size), tuple(stride), False,
                                                collections.OrderedDict()))


class _Pickler(pickle.Pickler):
  def persistent_id(self, obj): return obj.pid if isinstance(obj, FakeStorage) else None


def pickle_obj(obj, protocol=2):
  b = io.BytesIO()
  _Pickler(b, protocol=protocol).dump(obj)
  return b.getvalue()


def make_zip(pkl, storages, prefix="archive", compress=zipfile.ZIP_STORED, extra=()):
  """A torch-style zip: <prefix>/data.pkl, <prefix>/data/<key> for each storage, <prefix>/version."""
  b = io.BytesIO()
  with zipfile.ZipFile(b, "w", compress) as z:
    z.writestr(f"{prefix}/data.pkl", pkl)
    for k, v in storages.items(): z.writestr(f"{prefix}/data/{k}", v)
    for n, v in extra: z.writestr(n, v)
    z.writestr(f"{prefix}/version", "3\n")
  return b.getvalue()


def make_legacy(pkl, storages, counts=None):
  """The legacy layout: magic, protocol, sys info, object pickle, key list, (count, bytes) per key."""
  out = pickle.dumps(0x1950a86a20f9469cfc6c, protocol=2) + pickle.dumps(1001, protocol=2)
  out += pickle.dumps({"protocol_version": 1001, "little_endian": True, "type_sizes": {"short": 2, "int": 4, "long": 4}},
                      protocol=2)
  out += pkl + pickle.dumps(list(storages.keys()), protocol=2)
  for k, (data, itemsize) in storages.items():
    n = counts[k] if counts and k in counts else len(data) // itemsize
    out += struct.pack("<q", n) + data
  return out


def crafted(obj_fn, storages, name):
  """Builds obj in zip and legacy form: obj_fn(legacy) returns the object to pickle; storages maps key
  -> (bytes, itemsize). Returns [(format, path)]."""
  zp = write(name + ".zip.pt", make_zip(pickle_obj(obj_fn(False)), {k: v[0] for k, v in storages.items()}))
  lp = write(name + ".legacy.pt", make_legacy(pickle_obj(obj_fn(True)), storages))
  return [("zip", zp), ("legacy", lp)]


# ---- the test runner ------------------------------------------------------------------------------
CASES = []


def case(fn):
  CASES.append(fn)
  return fn


def rand_tensor(dtype, shape):
  if dtype == torch.bool: return torch.rand(shape) > 0.5
  if dtype.is_floating_point:
    t = (torch.randn(shape, dtype=torch.float64) * 100).to(dtype)
    flat = t.view(-1)
    specials = [float("inf"), float("-inf"), float("nan"), -0.0, 0.0, 1e-30, 65504.0]
    for i, v in enumerate(specials[:flat.numel()]): flat[i] = v
    return t
  info = torch.iinfo(dtype)
  t = torch.randint(info.min, info.max, shape, dtype=torch.int64).to(dtype)
  flat = t.view(-1)
  for i, v in enumerate([info.min, info.max, 0, -1 if info.min < 0 else 1][:flat.numel()]): flat[i] = v
  return t


DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
          torch.int8, torch.uint8, torch.bool]


@case
def every_dtype():
  obj = {str(dt).replace("torch.", ""): rand_tensor(dt, (3, 5)) for dt in DTYPES}
  for fmt, p in save_both(obj, "dtypes"):
    out, _, names = tg_load(p)
    check_same(obj, out)
    assert names == list(obj), f"{fmt}: order {names}"


@case
def shapes_0d_empty_large():
  obj = {"scalar_f": torch.tensor(3.5), "scalar_i": torch.tensor(-7, dtype=torch.int64), "scalar_b": torch.tensor(True),
         "empty": torch.zeros(0, 3), "empty_view": torch.arange(10.)[5:5], "one": torch.ones(1),
         "big": torch.randn(513, 769), "five_d": torch.randn(2, 1, 3, 1, 4)}
  for fmt, p in save_both(obj, "shapes"): check_same(obj, tg_load(p)[0])


@case
def strided_views():
  base = torch.arange(4 * 5 * 6, dtype=torch.float32).reshape(4, 5, 6)
  obj = {"transposed": base[0].t(), "sliced": base[1:, 2:, 3:], "stepped": base[::2, ::3, 1::2],
         "permuted": base.permute(2, 0, 1), "row": base[2, 3], "col": base[:, 1, 4], "narrow": base.view(-1)[17:40],
         "expanded": torch.tensor([1.5, 2.5]).reshape(2, 1).expand(2, 7),
         "overlap": torch.arange(12, dtype=torch.int32).as_strided((4, 4), (2, 1), 1),
         "bool_view": (base > 50)[1:3].transpose(0, 2), "bf16_view": base.bfloat16()[::2].permute(1, 2, 0),
         "half_offset": base.half().view(-1)[7:].view(113)[:112].view(7, 16)[:, 3:]}
  for k, v in obj.items():
    if k not in ("expanded", "overlap", "bool_view"): assert not v.is_contiguous() or v.storage_offset() > 0, k
  for fmt, p in save_both(obj, "views"): check_same(obj, tg_load(p)[0])


@case
def shared_storage_and_objects():
  x = torch.randn(6, 4)
  obj = {"a": x[0], "b": x[1:3], "c": x, "same1": x, "t": x.t()}
  for fmt, p in save_both(obj, "shared"):
    out, _, names = tg_load(p)
    check_same(obj, out)
    assert names == ["a", "b", "c", "same1", "t"], names
  # tied weights in a module: both names, same values
  emb = torch.nn.Embedding(11, 4)
  head = torch.nn.Linear(4, 11, bias=False)
  head.weight = emb.weight
  sd = torch.nn.ModuleDict({"emb": emb, "head": head}).state_dict()
  for fmt, p in save_both(sd, "tied"):
    out = tg_load(p)[0]
    check_same(sd, out)
    assert out["emb.weight"][1].tobytes() == out["head.weight"][1].tobytes()


class Net(torch.nn.Module):
  def __init__(self):
    super().__init__()
    self.conv = torch.nn.Conv2d(1, 4, 3)
    self.bn = torch.nn.BatchNorm2d(4)
    self.fc = torch.nn.Linear(16, 10)
    self.layers = torch.nn.ModuleList([torch.nn.Linear(10, 10) for _ in range(2)])


@case
def module_state_dict():
  net = Net()
  net.bn.running_mean.uniform_()
  net.bn.num_batches_tracked += 3
  sd = net.state_dict()
  for fmt, p in save_both(sd, "module"):
    out, meta, names = tg_load(p)
    check_same(sd, out)
    assert names == list(sd.keys()), names
    assert out["bn.num_batches_tracked"][0] == tg.INT64 and out["bn.num_batches_tracked"][1].shape == ()
    assert not meta, f"a plain state dict has no metadata, got {meta}"
  # the half-precision model too
  sdh = {k: v.half() if v.is_floating_point() else v for k, v in sd.items()}
  for fmt, p in save_both(sdh, "module_half"): check_same(sdh, tg_load(p)[0])
  # pickle protocol 4 and 5 (FRAME, MEMOIZE, SHORT_BINUNICODE, STACK_GLOBAL)
  for proto in (4, 5):
    p = os.path.join(TMP, f"module_p{proto}.pt")
    for zipfmt in (True, False):
      torch.save(sd, p, pickle_protocol=proto, _use_new_zipfile_serialization=zipfmt)
      check_same(sd, tg_load(p)[0])


@case
def nested_checkpoint_and_metadata():
  net = Net()
  opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
  loss = net.fc(torch.randn(3, 16)).sum()
  loss.backward()
  opt.step()
  ckpt = {"model": net.state_dict(), "optimizer": opt.state_dict(), "epoch": 7, "lr": 0.1, "name": "résumé run",
          "flags": [1, 2.5, None, True], "ids": (3, "x"), "nothing": None, "big": 2 ** 80, "raw": b"\x00\xffab",
          "tensors": [torch.ones(2), (torch.zeros(1, dtype=torch.int8), {"deep": torch.arange(3)})]}
  for fmt, p in save_both(ckpt, "ckpt"):
    out, meta, _ = tg_load(p)
    check_same(ckpt, out)
    assert "model.fc.weight" in out and "optimizer.state.4.momentum_buffer" in out, sorted(out)[:8]
    assert "tensors.1.1.deep" in out
    exp = {"epoch": "7", "lr": "0.1", "name": "résumé run", "flags": "[1, 2.5, None, True]", "ids": "(3, 'x')",
           "nothing": "None", "raw": "b'\\x00\\xffab'"}
    for k, v in exp.items(): assert meta.get(k) == v, f"{fmt}: meta[{k}] = {meta.get(k)!r}, expected {v!r}"
    assert meta["big"] == str(2 ** 80), meta["big"]
    assert "optimizer.param_groups" in meta and "'lr': 0.1" in meta["optimizer.param_groups"], meta.get("optimizer.param_groups")


@case
def every_pickle_protocol():
  """protocols 1 to 5 in both formats (1: the INT and LONG opcodes are text, the legacy format's magic
  number among them); protocol 0, which torch.load cannot read either, is refused with the reason"""
  sd = collections.OrderedDict(w=torch.arange(6.).reshape(2, 3), b=torch.tensor([True, False]), n=torch.tensor(-5),
                               i=torch.arange(4).reshape(2, 2).t())
  obj = {"model": sd, "epoch": 3, "lr": 0.1, "flag": True, "off": False, "big": 2 ** 70, "neg": -2 ** 70, "nb": -129,
         "edge": [2 ** 63, -2 ** 63, 255, -128, 2 ** 64 - 1], "t": (1, 2.5)}
  for proto in (1, 2, 3, 4, 5):
    for fmt, p in save_both(obj, f"proto{proto}", protocol=proto):
      out, meta, _ = tg_load(p)
      check_same(obj, out)
      want = {"epoch": "3", "lr": "0.1", "flag": "True", "off": "False", "big": str(2 ** 70), "neg": str(-2 ** 70),
              "nb": "-129", "edge": repr(obj["edge"]), "t": "(1, 2.5)"}
      for k, v in want.items(): assert meta.get(k) == v, f"protocol {proto} {fmt}: meta[{k}] = {meta.get(k)!r}, expected {v!r}"
  for fmt, p in save_both({"w": torch.ones(2)}, "proto0", protocol=0):
    expect_fail(p, "pickle protocol 0", "pickle_protocol 1 or later")


@case
def weights_only_values():
  """values torch's own weights_only loader takes: a dtype and a torch.Size (metadata: their repr, the
  Size as its tuple), a tuple key (named by its repr); each refused the whole file"""
  obj = {"t": torch.arange(6.), "dtype": torch.float16, "shape": torch.Size([2, 3]), "grid": {(1, 2): torch.ones(2)},
         "seeds": [2 ** 63, -2 ** 64, -2 ** 63 - 1, 2 ** 200 + 12345]}
  for fmt, p in save_both(obj, "weights_only"):
    out, meta, _ = tg_load(p)
    check_same(obj, out)
    assert meta.get("dtype") == "torch.float16" and meta.get("shape") == "(2, 3)", f"{fmt}: {meta}"
    assert meta.get("seeds") == repr(obj["seeds"]), f"{fmt}: big ints {meta.get('seeds')}"


@case
def bare_tensor_list_tuple_parameter():
  t = torch.randn(3, 2)
  for fmt, p in save_both(t, "bare"): check_same(t, tg_load(p)[0])
  lst = [torch.ones(2), torch.arange(5, dtype=torch.int16), {"k": torch.zeros(1)}]
  for fmt, p in save_both(lst, "list"):
    out, _, names = tg_load(p)
    check_same(lst, out)
    assert names == ["0", "1", "2.k"], names
  tup = (torch.ones(1), torch.zeros(2))
  for fmt, p in save_both(tup, "tuple"): check_same(tup, tg_load(p)[0])
  par = {"w": torch.nn.Parameter(torch.randn(4, 3)), "frozen": torch.nn.Parameter(torch.randn(2), requires_grad=False)}
  for fmt, p in save_both(par, "param"): check_same(par, tg_load(p)[0])
  keys = {7: torch.ones(1), True: {"x": torch.zeros(1)}, None: torch.ones(2)}
  for fmt, p in save_both(keys, "keys"):
    out, _, names = tg_load(p)
    assert names == ["7", "True.x", "None"], names
  for fmt, p in save_both({}, "empty_dict"):
    out, meta, _ = tg_load(p)
    assert out == {} and meta == {}


@case
def deflated_and_zip64_and_big_endian():
  obj = {"w": torch.randn(40, 30), "i": torch.arange(-50, 50, dtype=torch.int64).view(10, 10)[::3],
         "h": torch.randn(7).half(), "b": torch.randn(5, 5) > 0}
  src = os.path.join(TMP, "src.pt")
  torch.save(obj, src)
  with zipfile.ZipFile(src) as z:
    members = [(i.filename, z.read(i.filename)) for i in z.infolist()]
  # deflate every member
  b = io.BytesIO()
  with zipfile.ZipFile(b, "w", zipfile.ZIP_DEFLATED) as z:
    for n, d in members: z.writestr(n, d)
  check_same(obj, tg_load(write("deflated.pt", b.getvalue()))[0])
  # zip64: force zip64 local headers, and rewrite the central directory with zip64 fields
  check_same(obj, tg_load(write("zip64.pt", zip64_archive(members)))[0])
  # big-endian: storages byte-swapped, a byteorder record saying "big"
  swapped = []
  dtypes = {}
  with zipfile.ZipFile(src) as z:
    pk = z.read("src/data.pkl")
  for n, d in members:
    swapped.append((n, d))
  itemsize_of = storage_itemsizes(pk)
  out_members = []
  for n, d in members:
    key = n.split("/data/")[-1] if "/data/" in n else None
    if key is not None:
      isz = itemsize_of[key]
      d = np.frombuffer(d, dtype=np.dtype(f"<u{isz}") if isz > 1 else np.uint8).byteswap().tobytes()
    out_members.append((n, d))
  out_members.append(("src/byteorder", b"big"))
  b = io.BytesIO()
  with zipfile.ZipFile(b, "w") as z:
    for n, d in out_members: z.writestr(n, d)
  check_same(obj, tg_load(write("bigendian.pt", b.getvalue()))[0])
  del swapped, dtypes


def storage_itemsizes(pkl):
  """{storage key: itemsize} from a torch data.pkl (read with a persistent_load that records them)."""
  sizes = {}

  class U(pickle.Unpickler):
    def persistent_load(self, pid):
      sizes[pid[2]] = {"FloatStorage": 4, "LongStorage": 8, "HalfStorage": 2, "BoolStorage": 1}[pid[1].__name__]
      return torch.zeros(0)

    def find_class(self, mod, name):
      if name == "_rebuild_tensor_v2": return lambda *a: None
      return super().find_class(mod, name)
  U(io.BytesIO(pkl)).load()
  return sizes


def zip64_archive(members):
  """A zip whose central directory uses zip64 extra fields for sizes and offsets and ends with zip64
  end-of-central-directory records (what PyTorch writes for files over 4 GiB)."""
  import zlib
  out, cd = bytearray(), bytearray()
  for name, data in members:
    nb = name.encode()
    off = len(out)
    crc = zlib.crc32(data)
    ex = struct.pack("<HHQQ", 1, 16, len(data), len(data))
    out += struct.pack("<IHHHHHIIIHH", 0x04034b50, 45, 0, 0, 0, 0, crc, 0xFFFFFFFF, 0xFFFFFFFF, len(nb), len(ex)) + nb + ex
    out += data
    cex = struct.pack("<HHQQQ", 1, 24, len(data), len(data), off)
    cd += struct.pack("<IHHHHHHIIIHHHHHII", 0x02014b50, 45, 45, 0, 0, 0, 0, crc, 0xFFFFFFFF, 0xFFFFFFFF, len(nb), len(cex),
                      0, 0, 0, 0, 0xFFFFFFFF) + nb + cex
  cd_off = len(out)
  out += cd
  e64 = len(out)
  out += struct.pack("<IQHHIIQQQQ", 0x06064b50, 44, 45, 45, 0, 0, len(members), len(members), len(cd), cd_off)
  out += struct.pack("<IIQI", 0x07064b50, 0, e64, 1)
  out += struct.pack("<IHHHHIIH", 0x06054b50, 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0)
  return bytes(out)


@case
def crafted_views_and_legacy_storage_view():
  data = np.arange(24, dtype=np.float32)
  st = {"s0": (data.tobytes(), 4)}

  def obj(legacy):
    s = FakeStorage("s0", torch.FloatStorage, 24, legacy, None)
    return {"a": rebuild(s, 3, (2, 3), (6, 2)), "b": rebuild(s, 23, (), ()), "c": rebuild(s, 0, (3, 0, 2), (1, 1, 1)),
            "d": rebuild(s, 5, (4,), (0,))}
  exp = {"a": data[3:].reshape(-1)[:12].reshape(2, 6)[:, ::2], "b": np.array(23, np.float32),
         "c": np.zeros((3, 0, 2), np.float32), "d": np.full(4, 5, np.float32)}
  for fmt, p in crafted(obj, st, "crafted_views"):
    out = tg_load(p)[0]
    for k, v in exp.items():
      assert out[k][1].shape == v.shape and np.array_equal(out[k][1], v), f"{fmt} {k}: {out[k][1]} vs {v}"
  # an old-style legacy storage view ('storage', type, root, loc, numel, (view_key, offset, size))
  s = FakeStorage("root", torch.FloatStorage, 24, True, ("view1", 10, 6))
  p = write("legacy_view.pt", make_legacy(pickle_obj({"v": rebuild(s, 1, (2, 2), (2, 1))}), {"root": (data.tobytes(), 4)}))
  out = tg_load(p)[0]
  assert np.array_equal(out["v"][1], np.array([[11, 12], [13, 14]], np.float32)), out["v"][1]
  # bool storage bytes other than 0/1 come back as true (1)
  st = {"b": (bytes([0, 1, 2, 255]), 1)}
  for fmt, p in crafted(lambda lg: {"m": rebuild(FakeStorage("b", torch.BoolStorage, 4, lg), 0, (4,), (1,))}, st, "bools"):
    out = tg_load(p)[0]
    assert out["m"][1].view(np.uint8).tolist() == [0, 1, 1, 1], out["m"][1].view(np.uint8)
  # protocol 4 (STACK_GLOBAL, MEMOIZE, FRAME) and protocol 5
  for proto in (4, 5):
    s = FakeStorage("s0", torch.FloatStorage, 24)
    p = write(f"proto{proto}.pt", make_zip(pickle_obj({"a": rebuild(s, 0, (4, 6), (6, 1))}, proto), {"s0": data.tobytes()}))
    assert np.array_equal(tg_load(p)[0]["a"][1], data.reshape(4, 6))
  # _rebuild_from_type_v2 (tensor subclasses in newer torch)
  s = FakeStorage("s0", torch.FloatStorage, 24)
  inner = (s, 0, (24,), (1,), False, collections.OrderedDict())
  o = {"p": Call(torch._tensor._rebuild_from_type_v2, (torch._utils._rebuild_tensor_v2, torch.nn.Parameter, inner, {}))}
  p = write("from_type.pt", make_zip(pickle_obj(o), {"s0": data.tobytes()}))
  assert np.array_equal(tg_load(p)[0]["p"][1], data)


# ---- hostile files -------------------------------------------------------------------------------
MARKER = os.path.join(TMP, "PWNED")


class Evil:
  def __init__(self, fn, arg): self.fn, self.arg = fn, arg
  def __reduce__(self): return (self.fn, (self.arg,))


def evil_cmd(): return f"touch {MARKER}"


def assert_malicious(pkl):
  """Positive control: Python's own pickle.loads of these bytes runs the payload (creates MARKER)."""
  if os.path.exists(MARKER): os.unlink(MARKER)

  class U(pickle.Unpickler):
    def persistent_load(self, pid): return None
  try:
    U(io.BytesIO(pkl)).load()
  except Exception:
    pass
  assert os.path.exists(MARKER), "the crafted pickle is not actually malicious (control failed)"
  os.unlink(MARKER)


def hostile_pickles():
  """[(label, pickle bytes, expected phrase)] that would run `touch MARKER` under pickle.loads."""
  cmd = evil_cmd().encode()
  # {'a': os.system(cmd)}
  raw_global = b"\x80\x02}X\x01\x00\x00\x00acos\nsystem\nX" + struct.pack("<I", len(cmd)) + cmd + b"\x85Rs."
  code = f"__import__('os').system('{evil_cmd()}')".encode()
  eval_p = b"\x80\x02}X\x01\x00\x00\x00acbuiltins\neval\nX" + struct.pack("<I", len(code)) + code + b"\x85Rs."
  stack_global = b"\x80\x04\x95\x00\x00\x00\x00\x00\x00\x00\x00\x8c\x02os\x94\x8c\x06system\x94\x93\x94X" + \
      struct.pack("<I", len(cmd)) + cmd + b"\x85R."
  inst = b"(X" + struct.pack("<I", len(cmd)) + cmd + b"ios\nsystem\n."
  obj = b"(cos\nsystem\nX" + struct.pack("<I", len(cmd)) + cmd + b"o."
  return [
      ("os.system via GLOBAL+REDUCE", raw_global, "forbidden global 'os.system'"),
      ("builtins.eval via GLOBAL+REDUCE", eval_p, "forbidden global 'builtins.eval'"),
      ("posix.system from a real pickler", pickle.dumps({"x": Evil(os.system, evil_cmd())}, protocol=2),
       "forbidden global 'posix.system'"),
      ("os.system via STACK_GLOBAL (protocol 4)", stack_global, "forbidden global 'os.system'"),
      ("os.system via INST", inst, "unsupported pickle opcode 0x69"),
      ("os.system via OBJ", obj, "forbidden global 'os.system'"),
  ]


@case
def forbidden_globals_never_execute():
  for label, pkl, phrase in hostile_pickles():
    assert_malicious(pkl)
    for fmt, data in (("zip", make_zip(pkl, {})), ("legacy", make_legacy(pkl, {}))):
      p = write("evil.pt", data)
      msg = expect_fail(p, phrase)
      if "forbidden" in phrase: assert "only tensors can be loaded" in msg, msg
      assert not os.path.exists(MARKER), f"{label} ({fmt}): the payload RAN"
  # a genuine torch.save checkpoint carrying a payload next to real tensors
  p = os.path.join(TMP, "evil_real.pt")
  for zipfmt in (True, False):
    torch.save({"w": torch.ones(2), "x": Evil(os.system, evil_cmd())}, p, _use_new_zipfile_serialization=zipfmt)
    expect_fail(p, "forbidden global 'posix.system'; only tensors can be loaded")
    assert not os.path.exists(MARKER)
  # a whole model (its class is a global that is not allowed)
  torch.save(torch.nn.Linear(2, 2), p)
  expect_fail(p, "forbidden global 'torch.nn.modules.linear.Linear'")
  # allowed names used the wrong way
  s = FakeStorage("s", torch.FloatStorage, 1)
  for label, o, phrase in [
      ("calling a storage type", {"a": Call(torch.FloatStorage, (3,))}, "not a tensor rebuild function"),
      ("NEWOBJ of a forbidden class", None, "forbidden global"),
      ("unsupported storage type", {"a": rebuild(FakeStorage("s", torch.ComplexFloatStorage, 1), 0, (1,), (1,))},
       "unsupported storage type 'torch.ComplexFloatStorage'"),
      ("getattr", b"\x80\x02cbuiltins\ngetattr\ncos\nsystem\nX\x01\x00\x00\x00x\x86R.",
       "forbidden global 'builtins.getattr'"),
      ("torch.load itself", {"a": Call(torch.load, ("x",))}, "forbidden global 'torch.serialization.load'"),
      ("rebuild with a non-storage", {"a": Call(torch._utils._rebuild_tensor_v2, (1, 0, (1,), (1,), False, {}))},
       "not a storage"),
  ]:
    if o is None:
      pk = b"\x80\x02cos\nsystem\n)\x81."
    elif isinstance(o, bytes):
      pk = o
    else:
      pk = pickle_obj(o)
    msg = expect_fail(write("wrong.pt", make_zip(pk, {"s": b"\0" * 8})), phrase)
    assert not os.path.exists(MARKER), label
  del s


def small_checkpoints():
  obj = {"w": torch.arange(6, dtype=torch.float32).view(2, 3), "b": torch.tensor([1, 2], dtype=torch.int64),
         "m": {"h": torch.ones(3).half()}}
  return obj, save_both(obj, "small")


@case
def every_truncation_fails_cleanly():
  obj, files = small_checkpoints()
  for fmt, p in files:
    data = open(p, "rb").read()
    check_same(obj, tg_load(p)[0])
    for cut in range(len(data)):
      q = write("cut.pt", data[:cut])
      try:
        tg_load(q)
      except LoadError as e:
        assert "tg_torch_load" in str(e) and q in str(e), str(e)
        continue
      raise AssertionError(f"{fmt}: truncated to {cut} of {len(data)} bytes and still loaded")
  # a truncated data.pkl inside an intact archive
  pk = pickle_obj({"a": rebuild(FakeStorage("s", torch.FloatStorage, 2), 0, (2,), (1,))})
  for cut in range(0, len(pk), 3):
    expect_fail(write("cutpkl.pt", make_zip(pk[:cut], {"s": b"\0" * 8})))


@case
def random_corruption_never_crashes():
  obj, files = small_checkpoints()
  rng = np.random.default_rng(7)
  outcomes = {"loaded": 0, "failed": 0}
  for fmt, p in files:
    data = bytearray(open(p, "rb").read())
    for it in range(400):
      d = bytearray(data)
      for _ in range(int(rng.integers(1, 6))):
        d[int(rng.integers(0, len(d)))] = int(rng.integers(0, 256))
      q = write("corrupt.pt", bytes(d))
      try:
        tg_load(q)
        outcomes["loaded"] += 1
      except LoadError as e:
        assert "tg_torch_load" in str(e), str(e)
        outcomes["failed"] += 1
  assert outcomes["failed"] > 0, outcomes


@case
def bad_opcodes_and_corrupt_pickles():
  cases = [
      (b"\x80\x02\xff.", "unsupported pickle opcode 0xff"),
      (b"\x80\x09}.", "unsupported pickle protocol 9"),
      (b"\x80\x02}", "no STOP"),
      (b"\x80\x02.", "stack underflow"),
      (b"\x80\x02s.", "stack underflow"),
      (b"\x80\x02h\x05.", "memo entry 5 is not defined"),
      (b"\x80\x02X\xff\xff\xff\x7f.", "truncated pickle"),
      (b"\x80\x02\x8d\xff\xff\xff\xff\xff\xff\xff\xff.", "truncated pickle"),
      (b"\x80\x02\x8b\xff\xff\xff\xff.", "negative LONG4"),
      (b"\x80\x02t.", "without MARK"),
      (b"\x80\x02(K\x01u.", "stack underflow"),
      (b"\x80\x02]K\x01K\x02s.", "SETITEM on a list"),
      (b"\x80\x02K\x01K\x02a.", "APPEND on a int"),
      (b"\x80\x02K\x01K\x02b.", "BUILD on a int"),
      (b"\x80\x02K\x01)R.", "not callable"),
      (b"\x80\x02K\x01Q.", "unsupported persistent id"),
      (b"\x80\x02P0\n.", "unsupported pickle opcode 0x50"),
      (b"\x80\x02cos\nsys", "truncated pickle"),
      (b"\x80\x021.", "POP_MARK without MARK"),
      (b"\x80\x02(d.", "stack underflow" if False else ""),
  ]
  for i, (pk, phrase) in enumerate(cases):
    for fmt, data in (("zip", make_zip(pk, {})), ("legacy", make_legacy(pk, {}))):
      p = write(f"bad{i}.pt", data)
      if pk == b"\x80\x02(d.":  # an empty dict: loads, nothing in it
        out, meta, _ = tg_load(p)
        assert out == {} and meta == {}
        continue
      expect_fail(p, phrase)
  # not a checkpoint at all; missing file; directory; empty file
  expect_fail(write("junk.pt", b"hello world, not a checkpoint"), "not a PyTorch checkpoint")
  expect_fail(write("empty.pt", b""), "not a PyTorch checkpoint")
  expect_fail(os.path.join(TMP, "does-not-exist.pt"), "cannot open")
  expect_fail(TMP, "directory")
  b = io.BytesIO()
  with zipfile.ZipFile(b, "w") as z: z.writestr("archive/other.txt", "x")
  expect_fail(write("nopkl.pt", b.getvalue()), "no archive/data.pkl")
  expect_fail(write("badmagic.pt", pickle.dumps(12345, protocol=2) + b"rest"), "wrong magic")
  # a storage member that is missing or too short; a legacy count that disagrees; a key never used
  pk = pickle_obj({"a": rebuild(FakeStorage("s", torch.FloatStorage, 4), 0, (4,), (1,))})
  expect_fail(write("nostorage.pt", make_zip(pk, {})), "storage 's' is missing")
  expect_fail(write("short.pt", make_zip(pk, {"s": b"\0" * 15})), "holds 15 bytes")
  pkl = pickle_obj({"a": rebuild(FakeStorage("s", torch.FloatStorage, 4, True), 0, (4,), (1,))})
  expect_fail(write("count.pt", make_legacy(pkl, {"s": (b"\0" * 16, 4)}, counts={"s": 5})), "5 elements in the file")
  expect_fail(write("lshort.pt", make_legacy(pkl, {"s": (b"\0" * 12, 4)}, counts={"s": 4})), "truncated file")
  expect_fail(write("unused.pt", make_legacy(pkl, {"s": (b"\0" * 16, 4), "zz": (b"", 4)})), "no tensor uses it")
  expect_fail(write("nodata.pt", make_legacy(pkl, {})), "has no data")
  # CRC mismatch, unsupported compression, duplicate member names
  good = make_zip(pk, {"s": b"\1" * 16}, compress=zipfile.ZIP_DEFLATED)
  e = bytes(good).rindex(b"archive/data/s") - 46  # the storage's central-directory entry: spoil its CRC
  expect_fail(write("crc.pt", good[:e + 16] + bytes([good[e + 16] ^ 1]) + good[e + 17:]), "CRC mismatch")
  # stored members are not CRC-checked (torch's reader doesn't, and may write none): a zeroed CRC loads
  good = bytearray(make_zip(pk, {"s": b"\1" * 16}))
  cd = good.index(b"PK\x01\x02")
  while cd >= 0:
    struct.pack_into("<I", good, cd + 16, 0)
    cd = good.find(b"PK\x01\x02", cd + 4)
  assert tg_load(write("nocrc.pt", bytes(good)))[0]["a"][1].tobytes() == b"\1" * 16
  # two members over the same bytes (storage 't''s directory entry pointing at 's''s local header):
  # refused, where the second tensor read the pages the loader gave back after copying the first
  two = {"a": rebuild(FakeStorage("s", torch.FloatStorage, 4096), 0, (4096,), (1,)),
         "b": rebuild(FakeStorage("t", torch.FloatStorage, 4096), 0, (4096,), (1,))}
  good = bytearray(make_zip(pickle_obj(two), {"s": np.arange(4096, dtype=np.float32).tobytes(),
                                              "t": np.arange(4096, dtype=np.float32).tobytes()}))
  ents = {i.filename: i for i in zipfile.ZipFile(io.BytesIO(bytes(good))).infolist()}
  cd = good.index(b"PK\x01\x02")
  while cd >= 0:
    nlen = struct.unpack_from("<H", good, cd + 28)[0]
    if good[cd + 46:cd + 46 + nlen] == b"archive/data/t":
      struct.pack_into("<I", good, cd + 42, ents["archive/data/s"].header_offset)
    cd = good.find(b"PK\x01\x02", cd + 4)
  expect_fail(write("alias.pt", bytes(good)), "entries 'archive/data/s' and 'archive/data/t' overlap")
  # a dict that names two tensors the same way after flattening
  s = FakeStorage("s", torch.FloatStorage, 4)
  expect_fail(write("dup.pt", make_zip(pickle_obj({"a.b": rebuild(s, 0, (4,), (1,)), "a": {"b": rebuild(s, 0, (4,), (1,))}}),
                                       {"s": b"\0" * 16})), "duplicate tensor name 'a.b'")
  # the same storage key used with two dtypes
  s2 = FakeStorage("s", torch.IntStorage, 4)
  expect_fail(write("twotypes.pt", make_zip(pickle_obj({"a": rebuild(s, 0, (4,), (1,)), "b": rebuild(s2, 0, (4,), (1,))}),
                                            {"s": b"\0" * 16})), "two different types")


@case
def huge_declared_sizes():
  s = FakeStorage("s", torch.FloatStorage, 4)
  data = {"s": b"\0" * 16}
  for label, obj, phrase in [
      ("view past the storage", {"a": rebuild(s, 2, (3,), (1,))}, "lies outside its storage"),
      ("huge offset", {"a": rebuild(s, 2 ** 62, (1,), (1,))}, "lies outside its storage"),
      ("huge stride", {"a": rebuild(s, 0, (2,), (2 ** 62,))}, "lies outside"),
      ("overflowing stride", {"a": rebuild(s, 0, (4,), (2 ** 63 - 1,))}, "too large"),
      ("huge shape", {"a": rebuild(s, 0, (2 ** 31, 2 ** 31), (0, 0))}, "tensor shape is too large"),
      ("huge expanded shape", {"a": rebuild(s, 0, (2 ** 20, 2 ** 20), (0, 0))}, "expand to more than"),
      ("overflowing shape", {"a": rebuild(s, 0, (2 ** 40, 2 ** 40, 2 ** 40), (0, 0, 0))}, "too large"),
      ("expansion budget", {"a": rebuild(s, 0, (2 ** 30,), (0,))}, "expand to more than"),
      ("negative size", {"a": rebuild(s, 0, (-1,), (1,))}, "not a non-negative int"),
      ("negative offset", {"a": rebuild(s, -1, (1,), (1,))}, "storage offset"),
      ("rank mismatch", {"a": rebuild(s, 0, (1, 1), (1,))}, "stride has 1"),
      ("too many dims", {"a": rebuild(s, 0, (1,) * 65, (1,) * 65)}, "65 dimensions"),
      ("huge storage", {"a": rebuild(FakeStorage("s", torch.FloatStorage, 2 ** 62), 0, (1,), (1,))}, "too many"),
      ("storage bigger than its member", {"a": rebuild(FakeStorage("s", torch.DoubleStorage, 2 ** 40), 0, (1,), (1,))},
       "holds 16 bytes"),
  ]:
    expect_fail(write("huge.pt", make_zip(pickle_obj(obj), data)), phrase)
  # a deflated member that claims an impossible size (zip bomb header)
  good = make_zip(pickle_obj({"a": rebuild(s, 0, (4,), (1,))}), data, compress=zipfile.ZIP_DEFLATED)
  b = bytearray(good)
  cd = b.index(b"PK\x01\x02")  # the first central-directory entry (data.pkl)
  struct.pack_into("<I", b, cd + 24, 0x7FFFFFFF)  # its uncompressed size
  expect_fail(write("bomb.pt", bytes(b)), "impossible")
  # the central directory claims more entries than it has room for
  e = bytes(b).rindex(b"PK\x05\x06")
  b2 = bytearray(good)
  struct.pack_into("<HH", b2, e + 8, 60000, 60000)
  expect_fail(write("entries.pt", bytes(b2)), "declares 60000 entries")


def deflate_raw(chunks):
  """Raw deflate of the concatenated chunks (an iterable) -> (compressed bytes, size, crc)."""
  co = zlib.compressobj(9, zlib.DEFLATED, -15)
  out, n, crc = [], 0, 0
  for ch in chunks:
    out.append(co.compress(ch))
    n += len(ch)
    crc = zlib.crc32(ch, crc)
  out.append(co.flush())
  return b"".join(out), n, crc


def max_rss_mib():
  import resource
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@case
def hostile_chains_and_bombs():
  # a legacy storage view of a view of a view ... (a million links): refused at the second link,
  # without recursing (a recursive resolver overflowed the stack here)
  links = 1_000_000
  glob = b"ctorch\nFloatStorage\nq\x00"
  body = [b"\x80\x02(" + glob + b"0"]  # the storage type, memoized as 0
  for i in range(links):
    body.append(b"(X\x07\x00\x00\x00storageh\x00X\x08\x00\x00\x00" + b"%08d" % i + b"X\x03\x00\x00\x00cpuK\x04"
                b"(X\x08\x00\x00\x00" + b"%08d" % (i + 1) + b"K\x00K\x04ttQ0")
  body.append(b"1N.")
  p = write("chain.pt", make_legacy(b"".join(body), {"00000000": (b"\0" * 16, 4)}))
  assert os.path.getsize(p) > 50 * links, os.path.getsize(p)
  expect_fail(p, "is a view and cannot be the base of another view")
  # one level of views still loads (torch writes those)
  s = FakeStorage("root", torch.FloatStorage, 4, True, ("v", 1, 2))
  out = tg_load(write("one_view.pt", make_legacy(pickle_obj({"v": rebuild(s, 0, (2,), (1,))}),
                                                 {"root": (np.arange(4, dtype=np.float32).tobytes(), 4)})))[0]
  assert out["v"][1].tolist() == [1.0, 2.0], out["v"][1]

  # pickle memory bombs: 3 million empty dicts (1 byte each) in a stored data.pkl ...
  rss0 = max_rss_mib()
  expect_fail(write("dicts.pt", make_zip(b"\x80\x02" + b"}" * 3_000_000 + b".", {})), "bytes of memory")
  # ... and 3e7 None opcodes deflated into a ~30 KB file: the budget follows the file, not the pickle
  pk, n, crc = deflate_raw([b"\x80\x02"] + [b"N" * (1 << 20)] * 28 + [b"."])
  data = raw_zip([("archive/data.pkl", 8, pk, n, crc), ("archive/version", 0, b"3\n", 2, zlib.crc32(b"3\n"))])
  assert len(data) < 64 * 1024, len(data)
  expect_fail(write("nones.pt", data), "bytes of memory")
  # the budget is a multiple of the pickle: a real checkpoint with many tensors and metadata loads
  big = {f"layer{i}.weight": torch.randn(2, 2) for i in range(3000)}
  big["hist"] = list(range(5000))
  for fmt, p in save_both(big, "many_tensors"): check_same({k: v for k, v in big.items() if k != "hist"}, tg_load(p)[0])

  # a deflate bomb: a 16-byte storage whose member inflates to 512 MiB; only 16 bytes are inflated
  pk, n, crc = deflate_raw([b"\x01" * 16] + [b"\0" * (1 << 20)] * 512)
  s = FakeStorage("0", torch.FloatStorage, 4)
  pkl = pickle_obj({"a": rebuild(s, 0, (4,), (1,))})
  data = raw_zip([("archive/data.pkl", 0, pkl, len(pkl), zlib.crc32(pkl)), ("archive/data/0", 8, pk, n, crc)])
  out = tg_load(write("deflate_bomb.pt", data))[0]
  assert out["a"][1].view(np.uint8).tolist() == [1] * 16, out["a"][1]
  # a member that inflates past its declared size is an error
  pk2, n2, crc2 = deflate_raw([b"\0" * 32])
  data = raw_zip([("archive/data.pkl", 0, pkl, len(pkl), zlib.crc32(pkl)), ("archive/data/0", 8, pk2, 16, crc2)])
  expect_fail(write("too_long.pt", data), "inflates to more than its declared 16 bytes")
  grew = max_rss_mib() - rss0
  assert grew < 200, f"the bombs raised the peak memory by {grew:.0f} MiB"

  # CRC-32: a stored or a deflated member whose bytes do not match is corrupt; a CRC of 0 means none
  good = np.arange(4, dtype=np.float32).tobytes()
  bad = b"\xff" + good[1:]
  for method, payload in ((0, bad), (8, deflate_raw([bad])[0])):
    data = raw_zip([("archive/data.pkl", 0, pkl, len(pkl), zlib.crc32(pkl)), ("archive/data/0", method, payload, 16,
                                                                             zlib.crc32(good))])
    expect_fail(write(f"crc{method}.pt", data), "CRC mismatch")
  data = raw_zip([("archive/data.pkl", 0, pkl, len(pkl), 0), ("archive/data/0", 0, good, 16, 0)])
  assert tg_load(write("nocrc.pt", data))[0]["a"][1].tolist() == [0, 1, 2, 3]

  # a truncated zip checkpoint says so
  (_, p), = [x for x in save_both({"w": torch.randn(64, 64)}, "to_truncate") if x[0] == "zip"]
  with open(p, "rb") as f: whole = f.read()
  expect_fail(write("half.pt", whole[:len(whole) // 2]), "truncated?")

  # a zero dimension beside huge ones: an IO error naming the file, not tg_from_data's
  s = FakeStorage("s", torch.FloatStorage, 4)
  expect_fail(write("zero_dim.pt", make_zip(pickle_obj({"a": rebuild(s, 0, (0, 2 ** 48, 2 ** 48), (1, 1, 1))}),
                                            {"s": b"\0" * 16})), "non-zero dimensions multiply past 2^48")


def nested_pickle(depth, leaf):
  """A pickle of depth nested one-element lists around leaf (raw opcodes: no recursion in Python)."""
  return b"\x80\x02" + b"]" * depth + leaf + b"a" * depth + b"."


@case
def deep_nesting_cycles_and_sharing():
  s = FakeStorage("s", torch.FloatStorage, 4)
  data = {"s": b"\0" * 16}
  tensor_pk = pickle_obj(rebuild(s, 0, (4,), (1,)))[2:-1]  # the tensor's opcodes without PROTO and STOP
  # deep but tensor-free: loads (as metadata), no crash
  for depth in (50, 1000, 200000):
    out, meta, _ = tg_load(write("deep.pt", make_zip(b"\x80\x02}X\x01\x00\x00\x00k" + nested_pickle(depth, b"K\x01")[2:-1] +
                                                     b"s.", {})))
    assert out == {} and meta["k"].startswith("[[["), meta["k"][:20]
  # a tensor 99 levels down loads (name "0.0.0...0"); 150 levels down is an error
  out = tg_load(write("deep_ok.pt", make_zip(nested_pickle(99, tensor_pk), data)))[0]
  assert list(out) == [".".join(["0"] * 99)], list(out)[:1]
  expect_fail(write("deep_bad.pt", make_zip(nested_pickle(150, tensor_pk), data)), "nested more than 100")
  expect_fail(write("deep_worse.pt", make_zip(nested_pickle(300000, tensor_pk), data)), "nested more than 100")
  # a list that contains itself next to a tensor
  cyc = b"\x80\x02]q\x00(h\x00" + tensor_pk + b"e."
  expect_fail(write("cycle.pt", make_zip(cyc, data)), "nested more than 100")
  # exponential sharing: L0 = [t]; Lk = [Lk-1, Lk-1]: 2^40 paths from a few hundred bytes
  pk = b"\x80\x02]" + tensor_pk + b"aq\x00"
  for k in range(1, 41):
    pk += b"](h\x00h\x00eq\x00"
  pk += b"."
  expect_fail(write("bomb_dag.pt", make_zip(pk, data)), "more than")
  # the same object under a few names is fine
  x = torch.randn(3)
  shared = {"a": x, "b": [x, x], "c": {"d": x}}
  for fmt, p in save_both(shared, "shared_names"): check_same(shared, tg_load(p)[0])
  # memo indices far apart
  pk = b"\x80\x02}r\xff\xff\xff\xff(X\x01\x00\x00\x00aj\xff\xff\xff\xffu."
  out, meta, _ = tg_load(write("memo.pt", make_zip(pk, {})))
  assert meta["a"].startswith("{'a': {'a': {'a'") and "..." in meta["a"], meta["a"][:40]


@case
def no_live_handles_left():
  import gc
  gc.collect()
  assert tg.live_count() == 0, f"{tg.live_count()} live handles"


def main():
  flt = os.environ.get("TEST_FILTER", "")
  passed = failed = 0
  for fn in CASES:
    if flt and flt not in fn.__name__: continue
    try:
      fn()
      print(f"ok   {fn.__name__}")
      passed += 1
    except Exception:
      print(f"FAIL {fn.__name__}")
      traceback.print_exc()
      failed += 1
    lib.tg_clear_error()
  shutil.rmtree(TMP, ignore_errors=True)
  print(f"test_torch_load: {passed} passed, {failed} failed")
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())
