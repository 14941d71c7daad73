#!/usr/bin/env python3
"""Per-kernel device time of one forward step, from `ncu --csv --metrics gpu__time_duration.sum` output.

The forward's first kernel is the embedding gather (embed_kernel): the log is split there and one complete
forward is listed in launch order (name, grid, block, us), then summed by kernel name. `plumb bench --layers` runs
plain steps (graph replays under cuda.graph), then tapped steps, whose taps undo fusions (the norms outside hc_pre,
one stream): the forward listed is the last of those with the fewest kernels after the first (the context's
prefill), a plain step. Usage:
  ncu --csv --metrics gpu__time_duration.sum plumb bench --layers 2 ... > ncu.csv; kernel_times.py ncu.csv
"""
import csv
import sys
from collections import OrderedDict


def main(path):
    rows = []
    with open(path, newline="") as f:
        lines = [l for l in f if l.startswith('"')]  # ncu prints the program's own output too
    for r in csv.DictReader(lines):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        v = float(r["Metric Value"].replace(",", ""))
        unit = r.get("Metric Unit", "")
        us = v / 1e3 if unit in ("nsecond", "ns") else v * 1e3 if unit in ("msecond", "ms") else v
        name = r["Kernel Name"].replace("(anonymous namespace)::", "").replace("<unnamed>::", "").replace("void ", "")
        name = name.split("(")[0].split("<")[0].strip().split("::")[-1]
        rows.append((name, r.get("Grid Size", ""), r.get("Block Size", ""), us))
    starts = [i for i, r in enumerate(rows) if r[0].endswith("embed_kernel")]
    if len(starts) < 2:
        print("fewer than two forwards in the log")
        return 1
    steps = [rows[a:b] for a, b in zip(starts, starts[1:])]  # complete forwards (the last one may be cut short)
    if len(steps) > 1:
        steps = steps[1:]  # not the context's prefill
    fewest = min(len(s) for s in steps)
    step = [s for s in steps if len(s) == fewest][-1]
    total = sum(r[3] for r in step)
    print(f"{len(steps)} complete forwards of {sorted(set(len(s) for s in steps))} kernels; listed: one of {fewest}")
    print(f"one forward: {len(step)} kernels, {total:.1f} us of kernel time")
    for name, grid, block, us in step:
        print(f"  {us:8.1f}  {name}  grid {grid} block {block}")
    by = OrderedDict()
    for name, _, _, us in step:
        c, t = by.get(name, (0, 0.0))
        by[name] = (c + 1, t + us)
    print("by kernel (count, us, share):")
    for name, (c, t) in sorted(by.items(), key=lambda kv: -kv[1][1]):
        print(f"  {t:8.1f}  {100 * t / total:5.1f}%  x{c}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
