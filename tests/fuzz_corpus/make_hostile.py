"""make_hostile.py -- writes the small hostile seed files of tests/fuzz_corpus/ (run from the repo root:
/usr/bin/python3 tests/fuzz_corpus/make_hostile.py). Each is a tiny member of a class of file that once
broke a loader: a chain of legacy storage views, pickles that only fill memory, a storage behind a
member that inflates far past it, a zip member with a wrong CRC-32, a truncated zip, a zero dimension
beside huge ones, garbage after a gzip stream, a gzip bomb, gzip members back to back.
"""
import gzip
import os
import pickle
import struct
import sys
import zlib

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(ROOT))
from zipbytes import raw_zip  # noqa: E402


def put(target, name, data):
  with open(os.path.join(ROOT, target, name), "wb") as f: f.write(data)


def deflate(data):
  co = zlib.compressobj(9, zlib.DEFLATED, -15)
  return co.compress(data) + co.flush()


def s(text): return b"X" + struct.pack("<I", len(text)) + text.encode()


# the pickle of {"a": tensor over storage "0" (4 floats), offset 0, shape, stride}
def tensor_pickle(shape, stride, key="0"):
  shp = b"(" + b"".join(b"J" + struct.pack("<i", d) if d < 2 ** 31 else b"\x8a\x08" + struct.pack("<q", d) for d in shape) + b"t"
  std = b"(" + b"".join(b"J" + struct.pack("<i", d) for d in stride) + b"t"
  return (b"\x80\x02}" + s("a") + b"ctorch._utils\n_rebuild_tensor_v2\n(" + b"(" + s("storage") + b"ctorch\nFloatStorage\n" +
          s(key) + s("cpu") + b"K\x04tQK\x00" + shp + std + b"\x89ccollections\nOrderedDict\n)RtRs.")


def legacy(pkl, storages):
  out = pickle.dumps(0x1950a86a20f9469cfc6c, protocol=2) + pickle.dumps(1001, protocol=2)
  out += pickle.dumps({"protocol_version": 1001, "little_endian": True, "type_sizes": {"short": 2, "int": 4, "long": 4}},
                      protocol=2)
  out += pkl + pickle.dumps(list(storages), protocol=2)
  for data in storages.values(): out += struct.pack("<q", len(data) // 4) + data
  return out


def torch_zip(pkl, data, method=0, crc=None):
  payload = deflate(data) if method == 8 else data
  return raw_zip([("archive/data.pkl", 0, pkl, len(pkl), zlib.crc32(pkl)),
                  ("archive/data/0", method, payload, len(data), zlib.crc32(data) if crc is None else crc)])


T = "fuzz_torch_load"
glob = b"ctorch\nFloatStorage\nq\x00"
links = b"".join(b"(" + s("storage") + b"h\x00" + s("%02d" % i) + s("cpu") + b"K\x04(" + s("%02d" % (i + 1)) + b"K\x00K\x04ttQ0"
                 for i in range(8))
put(T, "view_chain.legacy.pt", legacy(b"\x80\x02(" + glob + b"0" + links + b"1N.", {"00": b"\0" * 16}))
put(T, "dict_bomb.zip.pt", raw_zip([("archive/data.pkl", 0, b"\x80\x02" + b"}" * 2000 + b".", 2003, 0)]))
pk = b"\x80\x02" + b"N" * 200000 + b"."
put(T, "none_bomb.zip.pt", raw_zip([("archive/data.pkl", 8, deflate(pk), len(pk), zlib.crc32(pk))]))
put(T, "deflate_bomb.zip.pt", torch_zip(tensor_pickle((4,), (1,)), b"\1" * 16 + b"\0" * 65536, method=8))
put(T, "bad_crc.zip.pt", torch_zip(tensor_pickle((4,), (1,)), b"\1" * 16, crc=0x12345678))
put(T, "zero_dim.zip.pt", torch_zip(tensor_pickle((0, 2 ** 48, 2 ** 48), (1, 1, 1)), b"\0" * 16))
whole = torch_zip(tensor_pickle((4,), (1,)), b"\2" * 16)
put(T, "truncated.zip.pt", whole[:len(whole) * 2 // 3])

put("fuzz_safetensors", "zero_dim.safetensors",
    (lambda h: struct.pack("<Q", len(h)) + h)(b'{"a":{"dtype":"F32","shape":[0,281474976710656,281474976710656],"data_offsets":[0,0]}}'))

g = b"GGUF" + struct.pack("<IQQ", 3, 1, 0) + struct.pack("<Q", 1) + b"t" + struct.pack("<I", 3) + \
    struct.pack("<QQQ", 0, 2 ** 48, 2 ** 48) + struct.pack("<IQ", 0, 0)
put("fuzz_gguf", "zero_dim.gguf", g + b"\0" * ((-len(g)) % 32))

idx = bytes([0, 0, 8, 1, 0, 0, 0, 6, 1, 2, 3, 4, 5, 6])
put("fuzz_idx", "garbage_after.idx.gz", gzip.compress(idx, mtime=0) + b"garbage!")
put("fuzz_idx", "bomb.idx.gz", gzip.compress(idx + b"\0" * 200000, mtime=0))
put("fuzz_idx", "two_members.idx.gz", gzip.compress(idx[:5], mtime=0) + gzip.compress(idx[5:], mtime=0))
put("fuzz_idx", "zero_dim.idx", bytes([0, 0, 8, 3, 0, 0, 0, 0]) + b"\xff" * 8)
