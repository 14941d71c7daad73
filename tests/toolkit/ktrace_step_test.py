#!/usr/bin/env python3
"""bench/ktrace/ktrace_step.py on a synthetic trace: three steps of five kernels on three streams (one step slower,
one warm-up step of another shape first, a side kernel on a stream and at a start that change from step to step, an
eager step of another set last); the table must hold the median of the matching steps, kernel by kernel, and each
kernel's ext (how far it pushed the step's end) must sum to the step's span."""
import os
import subprocess
import sys
import tempfile

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "ktrace", "ktrace_step.py")

HEADER = "start_ns,end_ns,stream,graph,node,grid,block,cluster,regs,smem,name\n"


def step(t0, scale, side_stream, side_start):
    # embed (stream 7), hc_pre (stream 7), a GEMV on stream 9 overlapping hc_pre, then route (stream 7); a side
    # branch's one kernel (hc_gates) on a stream and at a start that change from step to step, as a graph's replays
    # run it (it must still be one row of the table)
    rows = [(0, 2000, 7, "embed_kernel"), (3000, 13000, 7, "hc_pre_kernel<4; true; 1; true>"),
            (5000, 20000, 9, "gemv_kernel<1; 2>"), (side_start, side_start + 1000, side_stream, "hc_gates_kernel<4>"),
            (21000, 25000, 7, "route_warp_kernel<8>")]
    return [f"{t0 + int(a * scale)},{t0 + int(b * scale)},{s},1,{i},16,256,0,64,0,{n}\n" for i, (a, b, s, n) in enumerate(rows)]


def main():
    lines = [HEADER]
    lines += [f"{100 + i},{200 + i},7,1,0,1,32,0,16,0,warmup_kernel\n" for i in range(3)]
    lines += [f"500,900,7,1,0,1,32,0,16,0,embed_kernel\n"]  # a step of one kernel: too short to count
    t = 10_000
    for scale, side_stream, side_start in ((1.0, 11, 4000), (1.0, 12, 14000), (2.0, 13, 6000)):
        lines += step(t, scale, side_stream, side_start)
        t += 100_000
    # an eager step of as many kernels, another set (the bench's per-op timing): left out of the table
    lines += [f"{t + a},{t + a + 500},7,0,0,1,32,0,16,0,{n}\n"
              for a, n in ((0, "embed_kernel"), (1000, "hc_pre_kernel<4>"), (2000, "hc_post_kernel"), (3000, "gemv_kernel<1; 2>"),
                           (4000, "route_warp_kernel<8>"))]
    with tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False) as f:
        f.write(HEADER)
        f.writelines(reversed(lines[1:]))  # unsorted on purpose: the script sorts by start
    out = subprocess.run([sys.executable, SCRIPT, f.name, "--min-kernels", "3"], capture_output=True, text=True)
    os.unlink(f.name)
    text = out.stdout + out.stderr
    print(text)
    checks = [
        out.returncode == 0,
        "4 steps in the trace" in text,
        "the 3 steps of 5 kernels (1 more of that count ran another set of kernels: left out)" in text,
        "median 25.0 us (min 25.0, max 50.0)" in text,  # span of a step: 0 .. 25000 ns, the slow one 50000
        "GPU busy (any kernel running) median 23.0 us, idle 2.0 us" in text,  # idle 2..3 and 20..21 us
    ]
    rows = [l for l in text.splitlines() if l.strip().endswith(("embed_kernel", "route_warp_kernel<8>", "gemv_kernel<1; 2>"))
            or "hc_pre_kernel" in l]
    order = ["embed_kernel", "hc_pre_kernel", "gemv_kernel", "route_warp_kernel"]
    checks.append(len(rows) >= 4 and all(k in r for k, r in zip(order, rows[:4])))  # in start order
    gemv = next((l for l in rows if "gemv_kernel" in l), "")
    checks.append(gemv.split()[:5] == ["5.0", "15.0", "20.0", "-8.0", "7.0"])  # start, length, end, gap (from hc_pre's end), ext
    ext = {k: next((l.split()[4] for l in rows if k in l), "") for k in ("embed_kernel", "hc_pre_kernel", "route_warp_kernel")}
    checks.append(ext == {"embed_kernel": "2.0", "hc_pre_kernel": "11.0", "route_warp_kernel": "5.0"})
    checks.append("all kernels: 25.0)" in text)  # 2 + 11 + 7 + 0 (hc_gates, inside gemv's time) + 5: the span
    checks.append("<-- sublayer" in next((l for l in rows if "hc_pre" in l), ""))
    gates = [l for l in text.splitlines() if "hc_gates_kernel" in l]
    checks.append(len(gates) == 2 and gates[0].split()[:2] == ["12.0", "1.0"] and gates[0].split()[4] == "0.0")  # one row (median of starts 4, 14, 12 us) + the total
    checks.append("hc_post_kernel" not in text)
    if not all(checks):
        print("FAILED checks:", [i for i, c in enumerate(checks) if not c])
        return 1
    print("ktrace_step: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
