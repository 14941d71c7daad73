#!/usr/bin/env python3
"""Where one decode step's kernels stall, from ncu's warp-state metrics: per launch of the step, its time, warps,
instructions per warp, warp latency per issued instruction (cycles) and the stall cycles per instruction on
no_inst (waiting for instructions), long scoreboard (memory), barrier, wait (fixed latency) and membar; then per
kernel its time and that time weighted by the no_inst share of its latency (cold instruction fetch: session 38 found
the one-token compressor launch spending two thirds of its time there).

Input: `ncu --csv --metrics <the METRICS below> plumb bench --layers ...` (bench/gpu_forward.sh, NCU_STALLS=1), plain
or gzipped. The step is the last complete one: the launches between the last two embed_kernel launches. Usage:
  ncu_stalls.py ncu.csv[.gz] [--step K]   (K: which step from the end, 1 = the last complete one)
  ncu_stalls.py --metrics                 (prints the metric list to give ncu)
ncu flushes the caches before each profiled kernel by default, so these are cold-cache figures.
"""
import argparse
import collections
import csv
import gzip

STALL = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"
COLUMNS = [("noinst", "no_instruction"), ("lsb", "long_scoreboard"), ("bar", "barrier"), ("wait", "wait"), ("membar", "membar")]
METRICS = ",".join(["gpu__time_duration.sum", "smsp__inst_executed.sum", "launch__grid_size", "launch__block_size",
                    "smsp__average_warp_latency_per_inst_issued.ratio"] + [STALL.format(m) for _, m in COLUMNS])


def launches(path):
    """The profiled launches in order: {metric: value, 'name': kernel name} each."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", errors="replace") as f:
        rows = list(csv.reader(f))
    head = next((i for i, r in enumerate(rows) if r and r[0] == "ID"), None)
    if head is None:
        raise SystemExit(f"{path}: no ncu CSV table (a line starting with \"ID\")")
    h = rows[head]
    ii, ki, mi, vi = h.index("ID"), h.index("Kernel Name"), h.index("Metric Name"), h.index("Metric Value")
    out = collections.OrderedDict()
    for r in rows[head + 1:]:
        if len(r) <= vi:
            continue
        d = out.setdefault(r[ii], {"name": r[ki]})
        try:
            d[r[mi]] = float(r[vi].replace(",", ""))
        except ValueError:
            d[r[mi]] = 0.0
    return list(out.values())


def short(name):
    return name.split("(")[0].replace("plumb::<unnamed>::", "").replace("plumb::cuda::detail::", "")[:44]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv", nargs="?")
    ap.add_argument("--step", type=int, default=1)
    ap.add_argument("--metrics", action="store_true", help="print the metrics to give ncu and exit")
    args = ap.parse_args()
    if args.metrics:
        print(METRICS)
        return
    if not args.csv:
        ap.error("an ncu CSV is needed")
    ls = launches(args.csv)
    starts = [i for i, d in enumerate(ls) if "embed_kernel" in d["name"]]
    if len(starts) < args.step + 1:
        raise SystemExit(f"{args.csv}: {len(starts)} steps (embed_kernel launches) profiled, step {args.step} from the end asked")
    step = ls[starts[-1 - args.step]:starts[-args.step]]
    total = sum(d.get("gpu__time_duration.sum", 0.0) for d in step) / 1000
    print(f"step {args.step} from the end: {len(step)} kernels, {total:.1f} us")
    print("%-44s %7s %6s %7s %6s" % ("kernel", "us", "warps", "ins/wp", "lat") + "".join(" %6s" % c for c, _ in COLUMNS))
    by_kernel = collections.defaultdict(lambda: [0.0, 0.0])
    for d in step:
        us = d.get("gpu__time_duration.sum", 0.0) / 1000
        warps = int(d.get("launch__grid_size", 0.0)) * ((int(d.get("launch__block_size", 0.0)) + 31) // 32)
        lat = d.get("smsp__average_warp_latency_per_inst_issued.ratio", 0.0)
        stalls = [d.get(STALL.format(m), 0.0) for _, m in COLUMNS]
        ipw = d.get("smsp__inst_executed.sum", 0.0) / warps if warps else 0.0
        print("%-44s %7.1f %6d %7.0f %6.1f" % (short(d["name"]), us, warps, ipw, lat) + "".join(" %6.2f" % s for s in stalls))
        k = by_kernel[short(d["name"])]
        k[0] += us
        k[1] += us * (stalls[0] / lat if lat else 0.0)
    print("by kernel: us in the step, us x the no_inst share of the latency")
    for name, (us, noinst) in sorted(by_kernel.items(), key=lambda kv: -kv[1][1]):
        print("%-44s %7.1f %7.1f" % (name, us, noinst))


if __name__ == "__main__":
    main()
