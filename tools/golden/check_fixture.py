#!/usr/bin/env python3
"""Structural check of `dsv4-golden/1` fixtures, standard library only (no torch).

    python3 check_fixture.py DIR [DIR ...]

Checks: the four files exist and parse; safetensors headers are consistent (dtypes, sizes,
contiguous offsets); model.safetensors holds exactly the hub tensor names the config implies
(transformers `attn.norm` or official `attn.kv_norm` naming, F32 or official storage); golden.json
has the required keys; every step has `<step>.logits` [n, vocab] and every listed tap with the
shape FORMAT.md gives; float taps are finite; indices are in range.
"""

import json
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from st_io import DTYPE_SIZE, read_safetensors_header, read_tensor_values  # noqa: E402

SWA, CSA, HCA = "sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"
RATIO_TYPE = {0: SWA, 4: CSA, 128: HCA}


def fail(msg):
    raise SystemExit(f"FAIL: {msg}")


def layer_schedule(cfg):
    n = cfg["num_hidden_layers"]
    if cfg.get("layer_types"):
        lt = list(cfg["layer_types"][:n])
    else:
        lt = [RATIO_TYPE[r] for r in cfg["compress_ratios"][:n]]
    if cfg.get("mlp_layer_types"):
        mt = list(cfg["mlp_layer_types"][:n])
    else:
        h = cfg.get("num_hash_layers", 3)
        mt = ["hash_moe"] * min(n, h) + ["moe"] * max(0, n - h)
    return lt, mt


def expected_model_names(cfg, official):
    lt, mt = layer_schedule(cfg)
    E = cfg["n_routed_experts"]
    names = {"embed.weight", "head.weight", "norm.weight", "hc_head_fn", "hc_head_base", "hc_head_scale"}
    for i, (a, m) in enumerate(zip(lt, mt)):
        p = f"layers.{i}."
        names |= {p + s for s in ("attn_norm.weight", "ffn_norm.weight", "hc_attn_fn", "hc_attn_base", "hc_attn_scale",
                                  "hc_ffn_fn", "hc_ffn_base", "hc_ffn_scale", "attn.wq_a.weight", "attn.q_norm.weight",
                                  "attn.wq_b.weight", "attn.wkv.weight", "attn.wo_a.weight", "attn.wo_b.weight",
                                  "attn.attn_sink", "ffn.gate.weight", "ffn.shared_experts.w1.weight",
                                  "ffn.shared_experts.w2.weight", "ffn.shared_experts.w3.weight")}
        names.add(p + ("attn.kv_norm.weight" if official else "attn.norm.weight"))
        if a != SWA:
            names |= {p + "attn.compressor." + s for s in ("wkv.weight", "wgate.weight", "ape", "norm.weight")}
        if a == CSA:
            names |= {p + "attn.indexer." + s for s in ("wq_b.weight", "weights_proj.weight", "compressor.wkv.weight",
                                                        "compressor.wgate.weight", "compressor.ape",
                                                        "compressor.norm.weight")}
        names.add(p + ("ffn.gate.tid2eid" if m == "hash_moe" else "ffn.gate.bias"))
        for e in range(E):
            for w in ("w1", "w2", "w3"):
                names.add(f"{p}ffn.experts.{e}.{w}.weight")
    if official:
        fp8 = [n for n in names if any(n.endswith(s) for s in (
            "attn.wq_a.weight", "attn.wq_b.weight", "attn.wkv.weight", "attn.wo_a.weight", "attn.wo_b.weight",
            "indexer.wq_b.weight", "shared_experts.w1.weight", "shared_experts.w2.weight", "shared_experts.w3.weight"))]
        fp4 = [n for n in names if ".ffn.experts." in n]
        names |= {n[:-len(".weight")] + ".scale" for n in fp8 + fp4}
    return names


def check_header(path, header, data_start, blob):
    end = 0
    spans = []
    for name, e in header.items():
        if e["dtype"] not in DTYPE_SIZE:
            fail(f"{path}: {name}: dtype {e['dtype']}")
        s, t = e["data_offsets"]
        n = 1
        for d in e["shape"]:
            n *= d
        if t - s != n * DTYPE_SIZE[e["dtype"]]:
            fail(f"{path}: {name}: {t - s} bytes for {e['dtype']}{e['shape']}")
        spans.append((s, t, name))
        end = max(end, t)
    spans.sort()
    pos = 0
    for s, t, name in spans:
        if s != pos:
            fail(f"{path}: gap/overlap before {name} ({s} vs {pos})")
        pos = t
    if data_start + end != len(blob):
        fail(f"{path}: data section {end} bytes but file has {len(blob) - data_start}")
    if data_start % 8:
        fail(f"{path}: header not padded to 8 bytes")


def check(d):
    for fn in ("config.json", "model.safetensors", "golden.json", "golden.safetensors"):
        if not os.path.isfile(os.path.join(d, fn)):
            fail(f"{d}: missing {fn}")
    cfg = json.load(open(os.path.join(d, "config.json")))
    gj = json.load(open(os.path.join(d, "golden.json")))
    for k in ("format", "reference", "seed", "steps", "taps"):
        if k not in gj:
            fail(f"{d}/golden.json: missing key {k}")
    if gj["format"] != "dsv4-golden/1":
        fail(f"{d}: format {gj['format']}")
    mh, meta, mstart, mblob = read_safetensors_header(os.path.join(d, "model.safetensors"))
    check_header("model.safetensors", mh, mstart, mblob)
    official = any(e["dtype"] in ("F8_E4M3", "I8") for e in mh.values())
    want = expected_model_names(cfg, official)
    got = set(mh)
    if got != want:
        fail(f"{d}: model tensor names differ: missing {sorted(want - got)[:10]}, unexpected {sorted(got - want)[:10]}")
    for name, e in mh.items():
        if official:
            if name.endswith(".scale") and e["dtype"] != "F8_E8M0":
                fail(f"{name}: {e['dtype']}")
        elif e["dtype"] not in ("F32", "I64"):
            fail(f"{name}: {e['dtype']} in an F32 fixture")
    gh, _, gstart, gblob = read_safetensors_header(os.path.join(d, "golden.safetensors"))
    check_header("golden.safetensors", gh, gstart, gblob)
    lt, _ = layer_schedule(cfg)
    Dm, H, E, K, V = (cfg["hidden_size"], cfg["hc_mult"], cfg["n_routed_experts"], cfg["num_experts_per_tok"],
                      cfg["vocab_size"])
    pos = 0
    nvals = 0
    for st in gj["steps"]:
        n = len(st["tokens"])
        if st["start_pos"] != pos:
            fail(f"{st['name']}: start_pos {st['start_pos']} != {pos}")
        if st["kind"] not in ("prefill", "decode") or (st["kind"] == "decode" and n != 1) or n < 1:
            fail(f"{st['name']}: kind {st['kind']} with {n} tokens")
        pos += n
        for tap in ["logits"] + gj["taps"]:
            key = f"{st['name']}.{tap}"
            if key not in gh:
                fail(f"{d}: missing {key}")
            e = gh[key]
            shp = e["shape"]
            parts = tap.split(".")
            if tap == "logits":
                exp = [n, V]
            elif tap == "hc_head.out":
                exp = [n, Dm]
            elif parts[1] in ("hc_attn", "hc_ffn"):
                exp = {"post": [n, H], "comb": [n, H, H], "collapsed": [n, Dm]}[parts[2]]
            elif tap.endswith(".attn.indexer.topk"):
                exp = [n, shp[1]]
                if not 1 <= shp[1] <= cfg["index_topk"]:
                    fail(f"{key}: width {shp[1]}")
                if lt[int(parts[0][1:])] != CSA:
                    fail(f"{key}: indexer tap on a non-CSA layer")
            elif parts[1] == "ffn" and parts[2] == "gate":
                exp = [n, E] if parts[3] == "logits" else [n, K]
            elif parts[1] in ("attn", "ffn"):
                exp = [n, Dm]
            elif parts[1] == "out":
                exp = [n, H, Dm]
            else:
                fail(f"unknown tap {tap}")
            if shp != exp:
                fail(f"{key}: shape {shp}, expected {exp}")
            want_dt = "I64" if tap.endswith(".indices") or tap.endswith(".topk") else "F32"
            if e["dtype"] != want_dt:
                fail(f"{key}: dtype {e['dtype']}")
            vals = read_tensor_values(gblob, gstart, e)
            nvals += len(vals)
            if want_dt == "F32":
                if not all(math.isfinite(v) for v in vals):
                    fail(f"{key}: non-finite")
            elif tap.endswith(".indices"):
                if not all(0 <= v < E for v in vals):
                    fail(f"{key}: expert index out of range")
                for r in range(n):
                    row = vals[r * K:(r + 1) * K]
                    if row != sorted(row) or len(set(row)) != K:
                        fail(f"{key}: row {r} not sorted/distinct: {row}")
            else:
                if not all(v >= -1 for v in vals):
                    fail(f"{key}: bad topk index")
    for i, a in enumerate(lt):
        has = f"L{i}.attn.indexer.topk" in gj["taps"]
        if has != (a == CSA):
            fail(f"{d}: layer {i} ({a}) indexer tap presence {has}")
    total = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
    print(f"ok {d}: {len(gj['steps'])} steps, {pos} tokens, {len(mh)} weights "
          f"({'official' if official else 'f32'}), {len(gh)} golden tensors, {total / 1e6:.2f} MB")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    for d in sys.argv[1:]:
        check(d)
