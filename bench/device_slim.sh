#!/usr/bin/env bash
# Before and after a device-tool run, on the development machine: the tool copies the tracked tree plus `carry`, at
# most 64 MiB, and the tracked tree (fixtures, logs) plus build-carry/ is over that. `out` moves what the GPU machine
# never reads (bench/results/, tests/data/tokenizer/, tests/fuzz/corpus/) to $SLIM (default /tmp/plumb-slim) and prints the size that
# will travel; `back` returns them. Nothing is deleted: `back` merges into a folder that is there again and refuses to overwrite
# an entry of it.
#
#   bench/device_slim.sh out && <run the device command> ; bench/device_slim.sh back   (the same SLIM_REF both times)
set -euo pipefail
cd "$(dirname "$0")/.."
SLIM=${SLIM:-/tmp/plumb-slim}
paths=(bench/results tests/data/tokenizer tests/fuzz/corpus)
# SLIM_REF=1: also the official-code fixtures that only OFFICIAL=1 runs read (the CUDA tests read csa-long-ref,
# tiny-official-ref, wide-window-ref and wide-prefill-ref: they stay; v-yarn-both-ref stays too, for GpuNumericsGolden's
# glob: the official numerics' plain sliding-window rope on the GPU, 0.9 MB), for a carry with a third binary; gpu_forward.sh
# skips the moved ones (their folders may still arrive, empty). `back` returns them whether SLIM_REF is set
# or not (session 49 once left them out by calling `back` without it).
if [ -n "${SLIM_REF:-}" ] || [ "${1:-}" = back ]; then
  for d in tests/data/golden/*-ref "$SLIM"/tests/data/golden/*-ref; do  # in the tree (out) or moved (back)
    [ -e "$d" ] || continue
    d=tests/data/golden/$(basename "$d")
    case "$d" in */csa-long-ref | */tiny-official-ref | */wide-window-ref | */wide-prefill-ref | */v-yarn-both-ref) ;; *) paths+=("$d") ;; esac
  done
fi
case "${1:-}" in
  out)
    mkdir -p "$SLIM"
    for p in "${paths[@]}"; do
      [ -e "$p" ] || continue
      [ ! -e "$SLIM/$p" ] || { echo "device_slim: $SLIM/$p exists already (a run not moved back?)" >&2; exit 1; }
      mkdir -p "$SLIM/$(dirname "$p")" && mv "$p" "$SLIM/$p"
    done
    # (du counts a file behind several links once, as the copy holds it once; the moved files are missing: || true)
    bytes=$( (git ls-files -z | du -cbL --files0-from=- 2>/dev/null || true) | tail -n 1 | cut -f1)
    carry=$(du -cb build-carry 2>/dev/null | tail -n 1 | cut -f1)
    echo "device_slim: moved to $SLIM; tracked files present $((bytes / 1000000)) MB + build-carry $((carry / 1000000)) MB (limit 67 MB)"
    ;;
  back)
    # A folder made again meanwhile (a new bench/results/<run>/ written while the rest was out) is merged entry by
    # entry; only an entry that exists on both sides is refused (and left in $SLIM).
    for p in "${paths[@]}"; do
      [ -e "$SLIM/$p" ] || continue
      if [ -d "$p" ] && [ -d "$SLIM/$p" ]; then
        for e in "$SLIM/$p"/* "$SLIM/$p"/.[!.]*; do
          [ -e "$e" ] || continue
          [ ! -e "$p/$(basename "$e")" ] || { echo "device_slim: $p/$(basename "$e") exists in the tree; $e left where it is" >&2; exit 1; }
          mv "$e" "$p/"
        done
        rmdir "$SLIM/$p"
        continue
      fi
      [ ! -e "$p" ] || { echo "device_slim: $p exists in the tree; $SLIM/$p left where it is" >&2; exit 1; }
      mkdir -p "$(dirname "$p")" && mv "$SLIM/$p" "$p"
    done
    echo "device_slim: back in the tree"
    ;;
  *)
    echo "usage: $0 out|back" >&2
    exit 2
    ;;
esac
