#!/usr/bin/env python3
"""Writes a copy of a model folder whose vocabulary is made huge (vocab_size VOCAB): its embedding and head (as F32)
and the hash layers' tid2eid (as I32, every token to expert 0) in a sparse safetensors file, ~160 GB declared by
default, a few MB on disk. It binds like the original, so it tests what a backend does with weights larger than its
device (run_smoke.sh: --backend cuda must refuse it before uploading). Binding reads the tid2eid tables (~1.2 GB
of zeros, 2.5 GB in memory).
Usage: oversize_model.py SRC_DIR DST_DIR [VOCAB]"""
import json
import shutil
import struct
import sys
from pathlib import Path

src, dst = Path(sys.argv[1]), Path(sys.argv[2])
vocab = int(sys.argv[3]) if len(sys.argv) > 3 else 155_000_000
dst.mkdir(parents=True, exist_ok=True)
for name in ("tokenizer.json", "tokenizer_config.json"):
    if (src / name).exists():
        shutil.copy(src / name, dst / name)
cfg = json.loads((src / "config.json").read_text())
cfg["vocab_size"] = vocab
cfg["tie_word_embeddings"] = False
(dst / "config.json").write_text(json.dumps(cfg, indent=2))

with open(src / "model.safetensors", "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    header = json.loads(f.read(n))
    data = f.read()
meta = header.pop("__metadata__", None)
old_vocab = json.loads((src / "config.json").read_text())["vocab_size"]
huge = [k for k, t in header.items() if t["shape"] and t["shape"][0] == old_vocab]  # embed, head, tid2eid
out, blobs, offset = {}, [], 0
for name, t in header.items():  # the other tensors first, as they are
    if name in huge:
        continue
    a, b = t["data_offsets"]
    out[name] = {"dtype": t["dtype"], "shape": t["shape"], "data_offsets": [offset, offset + b - a]}
    blobs.append(data[a:b])
    offset += b - a
for name in huge:  # then the vocabulary-sized ones, left as a hole (zeros)
    t = header[name]
    dtype = "I32" if t["dtype"].startswith(("I", "U")) else "F32"
    shape = [vocab] + t["shape"][1:]
    size = 4
    for d in shape:
        size *= d
    out[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
    offset += size
if meta is not None:
    out["__metadata__"] = meta
text = json.dumps(out).encode()
text += b" " * (-len(text) % 8)
with open(dst / "model.safetensors", "wb") as f:
    f.write(struct.pack("<Q", len(text)))
    f.write(text)
    for blob in blobs:
        f.write(blob)
    f.truncate(8 + len(text) + offset)  # sparse: the huge tensors take no disk
print(f"{dst}: {', '.join(huge)} [{vocab}, ...], {offset / 1e9:.1f} GB of weights declared")
