#!/usr/bin/env bash
# Renders `plumb diff --html` in headless Chromium, takes a screenshot and checks it is not blank and shows the
# chart. Usage: tests/toolkit/html_screenshot.sh [PLUMB_BINARY] [FIXTURE_DIR] [OUT_DIR]
# Needs Debian's chromium (apt-get install -y chromium) and python3 (standard library only).
set -euo pipefail
plumb=${1:-build/plumb}
fixture=${2:-tests/data/golden/tiny}
out=${3:-$(mktemp -d)}
mkdir -p "$out"
browser=$(command -v chromium || command -v chromium-browser || true)
[ -n "$browser" ] || { echo "html_screenshot: chromium not found (apt-get install -y chromium)"; exit 2; }

# A fault with a known divergence, so the chart has free-running and teacher-forced series to draw.
rc=0
"$plumb" diff --fixture "$fixture" --a "" --b fault.rsf_missing_hash_layers --local --html "$out/report.html" >"$out/diff.txt" || rc=$?
[ "$rc" -eq 1 ] || { echo "html_screenshot: plumb diff exited $rc (expected 1: a divergence)"; cat "$out/diff.txt"; exit 1; }

# Self-contained: no scripts, no external references (the SVG namespace URI is not a fetch).
if grep -Eo "(src|href)=['\"][^'\"]*" "$out/report.html" | grep -q .; then
  echo "html_screenshot: the report references external resources"; exit 1
fi
grep -q "<polyline" "$out/report.html" || { echo "html_screenshot: no chart lines in the report"; exit 1; }

"$browser" --headless --no-sandbox --disable-gpu --hide-scrollbars --screenshot="$out/report.png" \
  --window-size=1200,900 "file://$(realpath "$out/report.html")" >"$out/chromium.log" 2>&1 || true
[ -s "$out/report.png" ] || { echo "html_screenshot: chromium wrote no screenshot"; cat "$out/chromium.log"; exit 1; }

python3 - "$out/report.png" <<'PY'
# Decodes the PNG (8-bit RGB/RGBA, non-interlaced, as Chromium writes) and checks that the page is not blank and
# that the chart's series colors are on it.
import struct, sys, zlib
data = open(sys.argv[1], "rb").read()
assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
pos, idat, w = 8, b"", 0
while pos < len(data):
    n, kind = struct.unpack(">I4s", data[pos:pos + 8])
    body = data[pos + 8:pos + 8 + n]
    if kind == b"IHDR":
        w, h, depth, ctype, _, _, inter = struct.unpack(">IIBBBBB", body)
        assert depth == 8 and ctype in (2, 6) and inter == 0, f"unsupported PNG {depth} {ctype} {inter}"
        bpp = 3 if ctype == 2 else 4
    elif kind == b"IDAT":
        idat += body
    pos += 12 + n
raw, stride = zlib.decompress(idat), w * bpp
rows, prev, i = [], bytearray(stride), 0
for _ in range(h):
    f, line = raw[i], bytearray(raw[i + 1:i + 1 + stride])
    i += 1 + stride
    for x in range(stride):
        a = line[x - bpp] if x >= bpp else 0
        b, c = prev[x], prev[x - bpp] if x >= bpp else 0
        if f == 1: line[x] = (line[x] + a) & 255
        elif f == 2: line[x] = (line[x] + b) & 255
        elif f == 3: line[x] = (line[x] + (a + b) // 2) & 255
        elif f == 4:
            p = a + b - c
            pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
    rows.append(line)
    prev = line
px = [tuple(r[x:x + 3]) for r in rows for x in range(0, stride, bpp)]
dark = sum(1 for p in px if sum(p) < 600) / len(px)
colors = set(px)
def near(rgb):  # pixels within 40 of a series color
    return sum(1 for p in px if all(abs(p[k] - rgb[k]) <= 40 for k in range(3)))
red, blue, green = near((0xd6, 0x27, 0x28)), near((0x1f, 0x77, 0xb4)), near((0x2c, 0xa0, 0x2c))
print(f"html_screenshot: {w}x{h}, {len(colors)} colors, {100 * dark:.1f}% non-background, series pixels red {red} blue {blue} green {green}")
assert len(colors) > 50 and dark > 0.02, "the screenshot is blank"
assert red > 200 and blue > 200 and green > 200, "the chart's series are not visible"
PY
echo "html_screenshot: ok ($out/report.png)"
