"""zipbytes.py -- zip archives written byte by byte, for tests that need members a zip library would
refuse to write (a wrong CRC-32, a size that lies, a method it does not know). Shared by
tests/test_torch_load.py and tests/fuzz_corpus/make_hostile.py."""
import struct


def raw_zip(members):
  """A zip built byte by byte: members are (name, method, payload as stored, uncompressed size, crc)."""
  out, cd = b"", b""
  for name, method, payload, usize, crc in members:
    nb = name.encode()
    off = len(out)
    out += struct.pack("<IHHHHHIIIHH", 0x04034b50, 20, 0, method, 0, 0, crc, len(payload), usize, len(nb), 0) + nb + payload
    cd += struct.pack("<IHHHHHHIIIHHHHHII", 0x02014b50, 20, 20, 0, method, 0, 0, crc, len(payload), usize, len(nb), 0, 0, 0,
                      0, 0, off) + nb
  return out + cd + struct.pack("<IHHHHIIH", 0x06054b50, 0, 0, len(members), len(members), len(cd), len(out), 0)
