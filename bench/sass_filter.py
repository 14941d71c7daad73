#!/usr/bin/env python3
"""Filter cuobjdump -sass output (stdin) to the functions whose mangled names match a regex; print them (stdout) and
append an opcode count per function to a summary file. Usage: sass_filter.py REGEX LABEL SUMMARY_FILE"""
import collections
import re
import sys


def main() -> None:
    pat, label, summary = re.compile(sys.argv[1]), sys.argv[2], sys.argv[3]
    name, keep, counts = None, False, {}
    for line in sys.stdin:
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            name = m.group(1)
            keep = bool(pat.search(name))
            if keep:
                counts[name] = collections.Counter()
        if not keep:
            continue
        sys.stdout.write(line)
        # "        /*0120*/                   LOP3.LUT R4, R2, 0x8e8e8e8e, RZ, 0xc0, !PT ;"
        ins = re.match(r"\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", line)
        if ins:
            counts[name][ins.group(1).split(".")[0]] += 1
    with open(summary, "a") as f:
        for name, c in counts.items():
            f.write(f"== {label} {name}: {sum(c.values())} instructions\n")
            f.write("   " + ", ".join(f"{k} {v}" for k, v in c.most_common()) + "\n")


if __name__ == "__main__":
    main()
