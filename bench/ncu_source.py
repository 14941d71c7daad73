#!/usr/bin/env python3
"""Summary of ncu's source page: where a kernel's instructions and warp stalls are, by opcode, by stall reason and
by instruction.

Input: `ncu -i REPORT --page source --csv --print-source sass` (bench/gpu_forward.sh writes it with NCU_SOURCE=1),
plain or gzipped; one section per profiled launch. For each launch (or those whose name matches --kernel): the
SASS instructions executed (warp level) and the stall samples, the samples by stall reason, the executed
instructions and samples by opcode, and the --top instructions with the most samples. Usage:
  ncu_source.py ncu-source.csv[.gz] [--kernel REGEX] [--top N]
"""
import argparse
import csv
import gzip
import re
import sys
from collections import defaultdict


def sections(lines):
    """Yields (kernel name, header, rows) per launch: a section starts with a "Kernel Name" line."""
    name, header, rows = None, None, []
    for rec in csv.reader(lines):
        if not rec:
            continue
        if rec[0] == "Kernel Name":
            if name is not None and header:
                yield name, header, rows
            name, header, rows = rec[1] if len(rec) > 1 else "?", None, []
        elif name is not None and header is None and rec[0] == "Address":
            header = rec
        elif header is not None and len(rec) == len(header):
            rows.append(rec)
    if name is not None and header:
        yield name, header, rows


def as_int(s):
    try:
        return int(float(s.replace(",", ""))) if s not in ("", "-") else 0
    except ValueError:
        return 0


def opcode(sass):
    """The opcode of a SASS line without its predicate and modifiers: '@!P0 LDG.E.128 R4, ...' -> 'LDG'."""
    toks = sass.strip().split()
    if toks and toks[0].startswith("@"):
        toks = toks[1:]
    return toks[0].split(".")[0] if toks else "?"


def short(name):
    name = re.sub(r"\(anonymous namespace\)::|<unnamed>::|plumb::cuda::detail::|\((int|bool|long)\)", "", name)
    return name.replace("void ", "").split("(")[0].strip()


def summarize(name, header, rows, top, out):
    col = {h: i for i, h in enumerate(header)}
    src, ex, smp = col.get("Source"), col.get("Instructions Executed"), col.get("Warp Stall Sampling (All Samples)")
    if src is None or ex is None or smp is None:
        out.write(f"{short(name)}: the source page lacks its columns (Source, Instructions Executed, samples)\n")
        return
    stall_cols = [(h, i) for h, i in col.items() if h.startswith("stall_") and "Not Issued" not in h]
    total_ex = sum(as_int(r[ex]) for r in rows)
    total_smp = sum(as_int(r[smp]) for r in rows)
    out.write(f"== {short(name)}\n")
    out.write(f"   {len(rows)} SASS instructions, {total_ex:,} executed (warp level), {total_smp:,} stall samples\n")
    if total_smp:
        by_reason = sorted(((sum(as_int(r[i]) for r in rows), h[len("stall_"):]) for h, i in stall_cols), reverse=True)
        out.write("   samples by stall reason: " +
                  ", ".join(f"{n} {100.0 * v / total_smp:.1f} %" for v, n in by_reason if v) + "\n")
    ops = defaultdict(lambda: [0, 0])
    for r in rows:
        o = ops[opcode(r[src])]
        o[0] += as_int(r[ex])
        o[1] += as_int(r[smp])
    out.write("   opcode        executed      %   samples      %\n")
    for op, (e, s) in sorted(ops.items(), key=lambda kv: -kv[1][0])[:20]:
        out.write(f"   {op:<10} {e:>11,} {100.0 * e / max(total_ex, 1):6.1f} {s:>9,} {100.0 * s / max(total_smp, 1):6.1f}\n")
    hot = sorted(range(len(rows)), key=lambda i: -as_int(rows[i][smp]))[:top]
    out.write(f"   the {len(hot)} instructions with the most samples (index: executed, samples, top reasons, SASS):\n")
    for i in sorted(hot):
        r = rows[i]
        reasons = sorted(((as_int(r[j]), h[len("stall_"):]) for h, j in stall_cols), reverse=True)[:2]
        why = ", ".join(f"{n} {v}" for v, n in reasons if v)
        out.write(f"   {i:5d}: {as_int(r[ex]):>9,} {as_int(r[smp]):>6,}  {why:<28} {r[src].strip()}\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("file")
    ap.add_argument("--kernel", default="", help="only launches whose name matches this regex")
    ap.add_argument("--top", type=int, default=15, help="hottest instructions listed per launch")
    a = ap.parse_args()
    opener = gzip.open if a.file.endswith(".gz") else open
    try:
        with opener(a.file, "rt", newline="") as f:
            lines = [l for l in f if l.startswith('"')]  # ncu may print other lines too
    except OSError as e:
        print(f"ncu_source.py: cannot read {a.file}: {e}", file=sys.stderr)
        return 2
    found, prev = 0, None
    for name, header, rows in sections(lines):
        if (name, rows) == prev:  # ncu's source page lists each launch twice
            continue
        prev = (name, rows)
        if a.kernel and not re.search(a.kernel, name):
            continue
        found += 1
        summarize(name, header, rows, a.top, sys.stdout)
    if not found:
        print(f"ncu_source.py: no launch{' matching ' + a.kernel if a.kernel else ''} in {a.file}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
