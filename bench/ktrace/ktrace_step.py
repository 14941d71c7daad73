#!/usr/bin/env python3
"""The timeline of replayed decode steps from ktrace's CSV (bench/ktrace/ktrace.cpp): each kernel's start, length and
stream, the median over the last steps, with the GPU's idle time and how many kernels ran at once, and how far each
kernel pushed the end of the step's work (ext: its end minus the latest end among the kernels that started before it,
if later). The exts sum to the step's span, idle time included. They are not the critical path: the trace has no
graph edges, and a side kernel that ends last for a while (a one-block norm beside a GEMV) takes that time from the
chain kernel it runs beside. Read that as slack: the chain kernel ends only its own ext after the side kernel, so a
faster chain kernel would leave the side kernel on the path.

A step starts at each kernel whose name matches --step-start (the embedding gather, the forward's first kernel). Steps
are matched kernel by kernel through (name, occurrence in the step), so the table's row is one kernel node of the
replayed graph; --last N takes the last N steps (steady state: warm-up and prefill come first), of which those with
the most common kernel count and set.

Usage: ktrace_step.py k.csv [--last 20] [--step-start embed_kernel] [--min-kernels 20]
"""
import argparse
import csv
import re
import statistics
import sys


def short(name):
    name = re.sub(r"plumb::cuda::detail::|\(anonymous namespace\)::|plumb::cuda::", "", name)
    return name if len(name) <= 60 else name[:57] + "..."


def load(path):
    with open(path) as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        for k in ("start_ns", "end_ns", "stream", "graph", "grid", "block", "cluster", "regs", "smem"):
            r[k] = int(r[k])
    rows.sort(key=lambda r: r["start_ns"])
    return rows


def split_steps(rows, start_re, min_kernels):
    steps, cur = [], None
    for r in rows:
        if re.search(start_re, r["name"]):
            if cur and len(cur) >= min_kernels:
                steps.append(cur)
            cur = []
        if cur is not None:
            cur.append(r)
    if cur and len(cur) >= min_kernels:
        steps.append(cur)
    return steps


def keyed(step):
    """(name, occurrence in the step by start) -> kernel. Not by stream: a graph's replays run a node on different
    streams from step to step once branches fork (CUPTI reports the executor's streams), and concurrent branches
    start in a different order; two launches of one kernel that start together may swap rows, which moves little."""
    occ, out = {}, {}
    for r in step:
        k = (r["name"], occ.get(r["name"], 0))
        occ[r["name"]] = k[1] + 1
        out[k] = r
    return out


def busy_union(step):
    t0 = step[0]["start_ns"]
    ivs = sorted((r["start_ns"] - t0, r["end_ns"] - t0) for r in step)
    busy, cs, ce = 0, None, None
    for s, e in ivs:
        if ce is None or s > ce:
            if ce is not None:
                busy += ce - cs
            cs, ce = s, e
        else:
            ce = max(ce, e)
    busy += ce - cs
    return busy


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--last", type=int, default=20)
    ap.add_argument("--step-start", default=r"^embed_kernel")
    ap.add_argument("--min-kernels", type=int, default=20)
    ap.add_argument("--kernels", type=int, default=0,
                    help="the steps of this many kernels instead of the most common count (e.g. a compressor window's last step)")
    a = ap.parse_args()
    rows = load(a.csv)
    steps = split_steps(rows, a.step_start, a.min_kernels)
    if not steps:
        sys.exit(f"no step found: no kernel matches {a.step_start!r} (or fewer than {a.min_kernels} kernels per step)")
    # The last steps with the most common kernel count (a step that completes a compressor window has more or
    # other kernels; those are reported separately by count).
    tail = steps[-a.last:]
    counts = statistics.multimode(len(s) for s in tail)
    n_main = a.kernels or max(counts)
    if not any(len(s) == n_main for s in tail):
        sys.exit(f"no step of {n_main} kernels among the last {len(tail)}")
    same = [s for s in tail if len(s) == n_main]
    # Of those, the steps with the most common set of kernels (an eager step of the same count, e.g. the bench's
    # per-op timing after its replays, runs other kernels).
    ks = [keyed(s) for s in same]
    sets = [frozenset(d) for d in ks]
    mode = statistics.mode(sets)
    other = len(sets) - sets.count(mode)
    same = [s for s, k in zip(same, sets) if k == mode]
    ks = [d for d, k in zip(ks, sets) if k == mode]
    print(f"{len(steps)} steps in the trace; the last {len(tail)}: kernel counts "
          + ", ".join(f"{n} x{sum(1 for s in tail if len(s) == n)}" for n in sorted({len(s) for s in tail}))
          + f"; the table: the {len(same)} steps of {n_main} kernels"
          + (f" ({other} more of that count ran another set of kernels: left out)" if other else ""))
    spans = [max(r["end_ns"] for r in s) - s[0]["start_ns"] for s in same]
    busies = [busy_union(s) for s in same]
    print(f"step (first start to last end): median {statistics.median(spans) / 1e3:.1f} us "
          f"(min {min(spans) / 1e3:.1f}, max {max(spans) / 1e3:.1f}); GPU busy (any kernel running) median "
          f"{statistics.median(busies) / 1e3:.1f} us, idle {statistics.median(spans) / 1e3 - statistics.median(busies) / 1e3:.1f} us")
    common = [k for k in ks[-1] if all(k in d for d in ks)]
    if not common:
        sys.exit("no kernel is common to the selected steps")
    rowsout = []
    for k in common:
        starts = [d[k]["start_ns"] - s[0]["start_ns"] for d, s in zip(ks, same)]
        durs = [d[k]["end_ns"] - d[k]["start_ns"] for d in ks]
        r = ks[-1][k]
        rowsout.append((statistics.median(starts) / 1e3, statistics.median(durs) / 1e3, None, r))
    rowsout.sort(key=lambda x: x[0])
    srank = {}  # the last step's streams, numbered in the order of their first kernel in the table
    for x in rowsout:
        srank.setdefault(x[3]["stream"], len(srank))
    rowsout = [(st, du, srank[r["stream"]], r) for st, du, _, r in rowsout]
    print(f"{'start':>8} {'us':>7} {'end':>8} {'gap':>6} {'ext':>6} {'conc':>4} st  {'grid':>6}x{'blk':<4} {'cl':>2} {'reg':>3}  kernel")
    exts = []
    for i, (st, du, srank, r) in enumerate(rowsout):
        en = st + du
        # gap: from the latest end among the kernels that started before this one (negative: it started while one
        # of them still ran, e.g. a PDL launch or another stream's kernel); ext: how far past that end this one ends
        prev_end = max((x[0] + x[1] for x in rowsout[:i]), default=0.0)
        gap, ext = st - prev_end, max(0.0, en - prev_end)
        exts.append(ext)
        conc = sum(1 for x in rowsout if x[0] < en and x[0] + x[1] > st and x is not rowsout[i])
        mark = "  <-- sublayer" if r["name"].startswith("hc_pre") else ""
        print(f"{st:8.1f} {du:7.1f} {en:8.1f} {gap:6.1f} {ext:6.1f} {conc:4d} s{srank}  {r['grid']:6d}x{r['block']:<4d} "
              f"{r['cluster']:2d} {r['regs']:3d}  {short(r['name'])}{mark}")
    # Per kernel name: total time, count and the step's time it accounts for (the sum of its ext).
    agg = {}
    for (st, du, srank, r), ext in zip(rowsout, exts):
        n = short(r["name"])
        t, c, e = agg.get(n, (0.0, 0, 0.0))
        agg[n] = (t + du, c + 1, e + ext)
    print(f"\nper kernel (median step): total us, launches, us of the step's span (ext; all kernels: {sum(exts):.1f})")
    for n, (t, c, e) in sorted(agg.items(), key=lambda x: -x[1][0]):
        print(f"{t:8.1f} {c:4d} {e:8.1f}  {n}")


if __name__ == "__main__":
    main()
