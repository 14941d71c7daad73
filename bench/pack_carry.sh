#!/usr/bin/env bash
# Packs the binaries a device run needs into build-carry/bins.tar.xz (what bench/gpu_forward.sh unpacks): plumb and
# plumb_cuda_tests from BUILD (default build-cuda, configured with -DPLUMB_CUDA=ON and built here), stripped, with
# bench/ktrace's libktrace.so and the toolkit's libcupti.so.13 beside them (KTRACE=1 runs). One solid xz archive:
# the two binaries share most of their code, and the device tool carries at most 64 MiB with the tracked tree.
# Usage: bench/pack_carry.sh [BUILD]    then bench/device_slim.sh out, the device run, bench/device_slim.sh back
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-cuda}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for b in "$build/plumb" "$build/tests/cuda/plumb_cuda_tests"; do
  [ -x "$b" ] || { echo "pack_carry: $b not built (cmake --build $build --target plumb plumb_cuda_tests)" >&2; exit 1; }
  cp "$b" "$tmp/"
done
kt=$(find "$build" -name libktrace.so | head -1)
[ -n "$kt" ] && cp "$kt" "$tmp/" || echo "pack_carry: no libktrace.so in $build (KTRACE runs will lack it)" >&2
cupti=$(find /usr/local/cuda/ -name 'libcupti.so.13' 2>/dev/null | head -1)
[ -n "$cupti" ] && cp "$cupti" "$tmp/" || echo "pack_carry: no libcupti.so.13 under /usr/local/cuda (KTRACE runs will lack it)" >&2
# plumb serve's HTTP library and the compression libraries it links: a GPU machine may lack them (lib/ is first on
# gpu_forward.sh's LD_LIBRARY_PATH).
mkdir -p "$tmp/lib"
for l in libcpp-httplib.so.0.11 libbrotlicommon.so.1 libbrotlidec.so.1 libbrotlienc.so.1; do
  f=$(ldd "$build/plumb" | awk -v l="$l" '$1 == l { print $3 }')
  [ -n "$f" ] && cp -L "$f" "$tmp/lib/"
done
strip "$tmp/plumb" "$tmp/plumb_cuda_tests"
mkdir -p build-carry
rm -f build-carry/*
tar -C "$tmp" -cf - . | xz -T2 -9 >build-carry/bins.tar.xz
ls -la build-carry
