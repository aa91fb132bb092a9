"""An independent safetensors reader/writer for the reference test (json + struct only; torch,
when importable, cross-checks the decoded values).

  check_safetensors.py verify <file written by Shardwise>
      Parses the file per the format spec, checks the layout rules Shardwise promises (8-byte
      aligned data section, header padded with spaces, tensors packed in declaration order
      without gaps or overlaps) and the values of the tensors test_safetensors_reference.cpp
      wrote. Exits non-zero with a message on any difference.
  check_safetensors.py write <path>
      Writes a file by hand for Shardwise's reader: tensors declared out of offset order,
      an unpadded header, metadata.
"""
import json
import struct
import sys


def fail(msg):
    print("check_safetensors: " + msg)
    sys.exit(1)


SIZES = {"F32": 4, "F16": 2, "BF16": 2, "I32": 4, "F64": 8, "I64": 8, "U8": 1}


def decode(dtype, raw):
    n = len(raw) // SIZES[dtype]
    if dtype == "F32":
        return list(struct.unpack("<%df" % n, raw))
    if dtype == "F16":
        return list(struct.unpack("<%de" % n, raw))
    if dtype == "BF16":
        halves = struct.unpack("<%dH" % n, raw)
        return [struct.unpack("<f", struct.pack("<I", h << 16))[0] for h in halves]
    if dtype == "I32":
        return list(struct.unpack("<%di" % n, raw))
    fail("unexpected dtype " + dtype)


def expected():
    """The tensors test_safetensors_reference.cpp writes (keep in sync)."""
    return {
        "layer.f32": ("F32", [3, 5], [0.25 * i - 1.5 for i in range(15)]),
        "layer.bf16": ("BF16", [2, 4], [0.5 * i - 2.0 for i in range(8)]),
        "layer.f16": ("F16", [7], [0.125 * i for i in range(7)]),
        "ids": ("I32", [2, 3], [7 * i - 3 for i in range(6)]),
        "empty": ("F32", [0], []),
    }


def verify(path):
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        fail("file too short")
    (hlen,) = struct.unpack("<Q", blob[:8])
    if 8 + hlen > len(blob):
        fail("header length %d beyond file size %d" % (hlen, len(blob)))
    header_bytes = blob[8 : 8 + hlen]
    if (8 + hlen) % 8 != 0:
        fail("data section starts at %d, not 8-byte aligned" % (8 + hlen))
    text = header_bytes.decode("utf-8")
    if text.rstrip(" ") != text.rstrip(" ").strip() or not text.startswith("{"):
        fail("header is not a JSON object padded with spaces: %r" % text[:40])
    header = json.loads(text)
    meta = header.pop("__metadata__", {})
    if meta != {"format": "pt", "writer": "shardwise-test"}:
        fail("metadata %r" % meta)
    data = blob[8 + hlen :]
    want = expected()
    if sorted(header) != sorted(want):
        fail("tensor names %r, expected %r" % (sorted(header), sorted(want)))
    # Declaration order = key order in the JSON text (json keeps it); packed without gaps.
    off = 0
    for name, info in header.items():
        b, e = info["data_offsets"]
        if b != off:
            fail("tensor %s starts at %d, expected %d (packed in declaration order)" % (name, b, off))
        off = e
    if off != len(data):
        fail("data section is %d bytes, tensors cover %d" % (len(data), off))
    for name, (dtype, shape, values) in want.items():
        info = header[name]
        if info["dtype"] != dtype or info["shape"] != shape:
            fail("%s: %s %r, expected %s %r" % (name, info["dtype"], info["shape"], dtype, shape))
        b, e = info["data_offsets"]
        n = 1
        for d in shape:
            n *= d
        if e - b != n * SIZES[dtype]:
            fail("%s: %d bytes for %d elements" % (name, e - b, n))
        got = decode(dtype, data[b:e])
        if got != values:
            fail("%s: values %r, expected %r" % (name, got[:8], values[:8]))
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        tdt = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "I32": torch.int32}
        for name, (dtype, shape, values) in want.items():
            b, e = header[name]["data_offsets"]
            if e == b:
                continue
            t = torch.frombuffer(bytearray(data[b:e]), dtype=tdt[dtype]).reshape(shape)
            ref = torch.tensor(values, dtype=torch.float64).reshape(shape)
            if not torch.equal(t.to(torch.float64), ref):
                fail("%s: torch decodes %r" % (name, t))
    print("verified %s (%d tensors%s)" % (path, len(want), ", torch cross-check" if torch else ""))


def write(path):
    # Data: b (4 x F32) first, then a (3 x I32), then c (2 x BF16); declared a, c, b.
    b_vals = [1.5, -2.25, 1e-3, 6.0e4]
    a_vals = [-1, 0, 2147483647]
    c_vals = [3.0, -0.5]
    data = struct.pack("<4f", *b_vals) + struct.pack("<3i", *a_vals)
    data += b"".join(struct.pack("<H", struct.unpack("<I", struct.pack("<f", v))[0] >> 16) for v in c_vals)
    header = {
        "a": {"dtype": "I32", "shape": [3], "data_offsets": [16, 28]},
        "c": {"dtype": "BF16", "shape": [1, 2], "data_offsets": [28, 32]},
        "__metadata__": {"source": "python"},
        "b": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
    }
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    if (8 + len(text)) % 8 == 0:
        text += b"\n"  # keep it unaligned: readers must not assume padding
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)
    print("wrote " + path)


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("verify", "write"):
        fail("usage: check_safetensors.py verify|write <path>")
    (verify if sys.argv[1] == "verify" else write)(sys.argv[2])
