#!/usr/bin/env python3
"""bench/sanitize_each.py without a GPU: a stand-in gtest binary (four tests: one passing, one skipping itself, one
slow that prints sanitizer progress lines and never ends, one the stand-in tool reports a hazard in) and a stand-in
compute-sanitizer on PATH. The verdicts must be clean / SKIPPED / TIMEOUT / ERRORS, the TIMEOUT line must name the
last case the slow test started, the tests must see PLUMB_TEST_SANITIZER_SIZES=1 (0 with --full-sizes), and the
exit status must be 1 (not every test passed)."""
import os
import re
import stat
import subprocess
import sys
import tempfile

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "sanitize_each.py")

FAKE_TEST = r'''#!/usr/bin/env python3
import fnmatch, os, sys, time
args = sys.argv[1:]
if "--gtest_list_tests" in args:
    pats = [a for a in args if a.startswith("--gtest_filter=")][0].split("=", 1)[1].split(":")
    names = [n for n in ("Passes", "Skips", "Slow", "Racy") if any(fnmatch.fnmatchcase("Suite." + n, q) for q in pats)]
    print("Suite.\n" + "".join(f"  {n}\n" for n in names), end="")
    sys.exit(0)
name = [a for a in args if a.startswith("--gtest_filter=")][0].split(".", 1)[1]
print("[==========] Running 1 test from 1 test suite.", flush=True)
sizes = os.environ.get("PLUMB_TEST_SANITIZER_SIZES")
want = os.environ["WANT_SIZES"]
if sizes != want:
    print(f"[  FAILED  ] 1 test (PLUMB_TEST_SANITIZER_SIZES={sizes}, want {want})", flush=True)
    sys.exit(1)
if name == "Skips":
    print("[  SKIPPED ] 1 test, listed below:", flush=True)
elif name == "Slow":
    sys.stderr.write("[sanitizer subset]     0.0 s: case one\n"); sys.stderr.flush()
    sys.stderr.write("[sanitizer subset]     0.1 s: case two, n 30\n"); sys.stderr.flush()
    time.sleep(60)
else:
    if name == "Racy":
        print("RACY", flush=True)
    print("[  PASSED  ] 1 test.", flush=True)
'''

FAKE_TOOL = r'''#!/usr/bin/env bash
# compute-sanitizer --tool T --print-limit N --error-exitcode 9 BINARY ARGS...
shift 6
out=$("$@" 2>&1 | tee /dev/stderr)
rc=${PIPESTATUS[0]}
if grep -q RACY <<<"$out"; then
  echo "========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)"; exit 9
fi
echo "========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)"
exit $rc
'''


def write_exe(path, text):
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)


def run(tmp, full):
    out = os.path.join(tmp, "full" if full else "subset")
    env = dict(os.environ, PATH=tmp + os.pathsep + os.environ.get("PATH", ""), WANT_SIZES="0" if full else "1")
    # (--full-sizes: only the passing test, which checks the variable; the slow one would cost its 6 s again)
    cmd = [sys.executable, SCRIPT, "--bin", os.path.join(tmp, "fake_tests"), "--tools", "racecheck", "--jobs", "4",
           "--per-test", "6", "--deadline", "30", "--out", out] + (["--full-sizes", "--filter", "Suite.Passes"] if full else [])
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    with open(os.path.join(out, "sanitize-summary.tsv")) as f:
        rows = {line.split("\t")[1]: line.split("\t")[2] for line in f.read().splitlines()[1:]}
    return p, rows


def main():
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        write_exe(os.path.join(tmp, "fake_tests"), FAKE_TEST)
        write_exe(os.path.join(tmp, "compute-sanitizer"), FAKE_TOOL)
        p, rows = run(tmp, False)
        want = {"Suite.Passes": "clean", "Suite.Skips": "SKIPPED", "Suite.Slow": "TIMEOUT", "Suite.Racy": "ERRORS"}
        if rows != want:
            failures.append(f"verdicts {rows}, want {want}\n{p.stdout}{p.stderr}")
        if p.returncode != 1:
            failures.append(f"exit status {p.returncode}, want 1 (not every test passed)")
        if not re.search(r"TIMEOUT +Suite\.Slow \(0 tool errors, gtest \?, \d+ s\); stopped in: 0\.1 s: case two, n 30$",
                         p.stdout, re.M):
            failures.append(f"the TIMEOUT line does not name the slow test's last case:\n{p.stdout}")
        p, rows = run(tmp, True)
        if rows != {"Suite.Passes": "clean"} or p.returncode != 0:
            failures.append(f"--full-sizes: verdicts {rows}, exit status {p.returncode}\n{p.stdout}{p.stderr}")
    if failures:
        print("\n".join("FAIL " + f for f in failures))
        return 1
    print("ok   sanitize_each: verdicts, the stopped-in case, PLUMB_TEST_SANITIZER_SIZES with and without --full-sizes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
