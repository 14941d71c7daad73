"""Minimal safetensors reader/writer for the golden tools.

The writer takes raw little-endian bytes per tensor (so it needs neither the
`safetensors` package nor numpy); the reader is pure standard library and is
used by check_fixture.py.

File layout: u64 little-endian header length N, N bytes of JSON header padded
with spaces to a multiple of 8, then the data section.  Tensors are laid out
by decreasing element size, then by name (as the safetensors library does), so
every tensor is naturally aligned inside the data section.
"""

import json
import struct

DTYPE_SIZE = {
    "F64": 8, "I64": 8, "U64": 8,
    "F32": 4, "I32": 4, "U32": 4,
    "F16": 2, "BF16": 2, "I16": 2, "U16": 2,
    "I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1,
}


def _numel(shape):
    n = 1
    for d in shape:
        n *= int(d)
    return n


def write_safetensors(path, tensors, metadata=None):
    """tensors: dict name -> (dtype_str, shape list, raw bytes)."""
    if not tensors:
        raise ValueError(f"{path}: refusing to write an empty safetensors file")
    names = sorted(tensors, key=lambda k: (-DTYPE_SIZE[tensors[k][0]], k))
    header = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    offset = 0
    for name in names:
        dtype, shape, raw = tensors[name]
        if dtype not in DTYPE_SIZE:
            raise ValueError(f"{path}: {name}: unknown dtype {dtype}")
        shape = [int(d) for d in shape]
        want = _numel(shape) * DTYPE_SIZE[dtype]
        if len(raw) != want:
            raise ValueError(f"{path}: {name}: {len(raw)} bytes for {dtype}{shape}, expected {want}")
        if want == 0:
            raise ValueError(f"{path}: {name}: zero-sized tensor {shape}")
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + want]}
        offset += want
    hjson = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hjson += b" " * ((8 - len(hjson) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hjson)))
        f.write(hjson)
        for name in names:
            f.write(tensors[name][2])
    return 8 + len(hjson) + offset


def read_safetensors_header(path):
    """Returns (header dict without __metadata__, metadata or None, data_start, file_size)."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise ValueError(f"{path}: too short")
    (n,) = struct.unpack("<Q", blob[:8])
    if 8 + n > len(blob):
        raise ValueError(f"{path}: header length {n} past end of file")
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    meta = header.pop("__metadata__", None)
    return header, meta, 8 + n, blob


def read_tensor_values(blob, data_start, entry):
    """Decode F32 / I64 / I32 / I8 / U8 tensors to a flat Python list (for checks)."""
    s, e = entry["data_offsets"]
    raw = blob[data_start + s:data_start + e]
    fmt = {"F32": "f", "I64": "q", "I32": "i", "I8": "b", "U8": "B", "F8_E8M0": "B", "F8_E4M3": "B"}.get(entry["dtype"])
    if fmt is None:
        if entry["dtype"] == "BF16":
            vals = struct.unpack("<%dH" % (len(raw) // 2), raw)
            return [struct.unpack("<f", struct.pack("<I", v << 16))[0] for v in vals]
        raise ValueError(f"cannot decode dtype {entry['dtype']}")
    size = struct.calcsize(fmt)
    return list(struct.unpack("<%d%s" % (len(raw) // size, fmt), raw))
