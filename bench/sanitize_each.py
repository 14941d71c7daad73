#!/usr/bin/env python3
"""compute-sanitizer over a gtest binary one test per process, several at once, under a deadline.

One process per (tool, test): a tool that aborts a launch (synccheck does) then fails only that test, not every
test after it, and the tests run in parallel on the machine's cores (the tools are slow on the host side).
Writes OUT/sanitize-summary.tsv (tool, test, verdict, tool errors, gtest result, seconds) and
OUT/sanitize-logs.txt.gz (the output of every pair that was not clean, first lines only), and prints a summary (for a
test stopped by a time limit, the last case its progress lines name).
Verdicts: clean, ERRORS (the tool reported something), FAILED (gtest failed without a tool report), TIMEOUT
(over its own time), CUT (started so late that the run's deadline stopped it first), NOT-RUN (the deadline came
before it started), SKIPPED (the test skipped itself), no-gpu (it passed without a CUDA call).
The tests run with PLUMB_TEST_SANITIZER_SIZES=1 (unless --full-sizes): the longest kernel tests then take a subset of
their shapes that keeps every kernel path (each test says which), so that racecheck finishes them.
"""
import argparse
import concurrent.futures as cf
import gzip
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter

# Verdicts that pass, and those that need no log (NOT-RUN is not a pass: the deadline came first).
PASSING = ("clean", "SKIPPED", "no-gpu")
QUIET = PASSING + ("NOT-RUN",)


def list_tests(binary, gfilter):
    out = subprocess.run([binary, "--gtest_list_tests", f"--gtest_filter={gfilter}"], capture_output=True, text=True,
                         check=True).stdout
    tests, suite = [], None
    for line in out.splitlines():
        if not line.strip():
            continue
        if not line.startswith(" "):
            suite = line.split("#")[0].strip()
        else:
            tests.append(suite + line.split("#")[0].strip())
    return tests


def tool_errors(tool, text):
    if tool == "racecheck":
        m = re.search(r"RACECHECK SUMMARY: (\d+) hazards? displayed \((\d+) errors?, (\d+) warnings?\)", text)
        if m:
            return int(m.group(2)) + int(m.group(3))
    m = re.search(r"ERROR SUMMARY: (\d+) errors?", text)
    return int(m.group(1)) if m else None


def run_one(args, tool, test, t_end):
    budget = min(args.per_test, t_end - time.monotonic())
    if budget < 5:
        return tool, test, "NOT-RUN", "", "", 0.0, ""
    cmd = ["compute-sanitizer", "--tool", tool, "--print-limit", "20", "--error-exitcode", "9", args.bin,
           "--gtest_color=no", f"--gtest_filter={test}"]
    t0 = time.monotonic()
    # A session of its own, so that a timeout kills the tool and the test process it started.
    # PLUMB_TEST_SANITIZER_SIZES: the longest kernel tests take their subset of shapes (tests/cuda/cuda_test_util.h)
    env = dict(os.environ, PLUMB_TEST_SANITIZER_SIZES="0" if args.full_sizes else "1")
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
                         start_new_session=True, env=env)
    try:
        text, _ = p.communicate(timeout=budget)
        timed_out = False
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        text, _ = p.communicate()
        timed_out = True
    dt = time.monotonic() - t0
    errs = tool_errors(tool, text)
    gres = "passed" if "[  PASSED  ] 1 test" in text else "failed" if "[  FAILED  ]" in text else \
        "skipped" if "[  SKIPPED ]" in text else "?"
    if errs:
        verdict = "ERRORS"
    elif timed_out:
        # CUT: stopped by the run's deadline before its own time was up (it started late), not over its time
        verdict = "TIMEOUT" if budget >= args.per_test else "CUT"
    elif gres == "failed":
        verdict = "FAILED"
    elif gres == "skipped":
        verdict = "SKIPPED"
    elif gres == "passed" and errs == 0:
        verdict = "clean"
    elif gres == "passed" and "terminated before first instrumented API call" in text:
        verdict = "no-gpu"  # a host-only test: the tool had nothing to check
    else:
        verdict = "?"
    return tool, test, verdict, "" if errs is None else str(errs), gres, dt, text


def stopped_in(r):
    """For a test stopped by its time or the deadline: the last case it had started, from the progress lines the
    long tests print under the sanitizer subset (tests/cuda/cuda_test_util.h, sanitizer_progress)."""
    if r[2] not in ("TIMEOUT", "CUT"):
        return ""
    started = [ln for ln in r[6].splitlines() if ln.startswith("[sanitizer subset]")]
    return f"; stopped in: {started[-1][len('[sanitizer subset]'):].strip()}" if started else ""


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", required=True)
    ap.add_argument("--tools", default="memcheck")
    ap.add_argument("--filter", default="*")
    ap.add_argument("--first", default="", help="regex: tests started first")
    ap.add_argument("--last", default="", help="regex: tests started last (the long ones, so that a deadline costs them, "
                    "not every short test)")
    ap.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2) - 2))
    ap.add_argument("--per-test", type=float, default=300, help="seconds per (tool, test)")
    ap.add_argument("--deadline", type=float, default=540, help="seconds for everything")
    ap.add_argument("--full-sizes", action="store_true", help="every test's whole shape list (by default the longest "
                    "kernel tests take their sanitizer subset: PLUMB_TEST_SANITIZER_SIZES)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    t_end = time.monotonic() + args.deadline
    tests = list_tests(args.bin, args.filter)
    first, last = re.compile(args.first or "(?!)"), re.compile(args.last or "(?!)")
    tests.sort(key=lambda t: 0 if first.search(t) else 2 if last.search(t) else 1)  # stable: gtest's order within
    pairs = [(tool, t) for t in tests for tool in args.tools.split()]
    print(f"sanitize: {len(tests)} tests x {len(args.tools.split())} tools, {args.jobs} at once, "
          f"{args.per_test:.0f} s each, {args.deadline:.0f} s in all", flush=True)
    results = []
    with cf.ThreadPoolExecutor(args.jobs) as ex:
        futs = [ex.submit(run_one, args, tool, t, t_end) for tool, t in pairs]
        for f in cf.as_completed(futs):
            results.append(f.result())
    results.sort(key=lambda r: (r[0], r[1]))
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "sanitize-summary.tsv"), "w") as f:
        f.write("tool\ttest\tverdict\ttool_errors\tgtest\tseconds\n")
        for tool, test, verdict, errs, gres, dt, _ in results:
            f.write(f"{tool}\t{test}\t{verdict}\t{errs}\t{gres}\t{dt:.1f}\n")
    with gzip.open(os.path.join(args.out, "sanitize-logs.txt.gz"), "wt") as f:
        for tool, test, verdict, errs, gres, dt, text in results:
            if verdict not in QUIET:
                lines = text.splitlines()
                f.write(f"===== {tool} {test}: {verdict} ({errs or 0} tool errors, gtest {gres}, {dt:.1f} s)\n")
                f.write("\n".join(lines[:400]) + ("\n... (%d more lines)\n" % (len(lines) - 400) if len(lines) > 400 else "\n"))
    for tool in args.tools.split():
        rs = [r for r in results if r[0] == tool]
        counts = Counter(r[2] for r in rs)
        print(f"{tool}: " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())), flush=True)
        for r in rs:
            if r[2] not in QUIET:
                print(f"  {r[2]:8s} {r[1]} ({r[3] or 0} tool errors, gtest {r[4]}, {r[5]:.0f} s){stopped_in(r)}")
    return 0 if all(r[2] in PASSING for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
