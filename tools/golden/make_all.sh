#!/usr/bin/env bash
# Generate every golden preset into OUTROOT/<preset>/, replay each fixture from its files
# (independent round trip), run the structural checker, and pack everything into OUTROOT.tar.
#
#   tools/golden/make_all.sh OUTROOT
#
# Needs python3 with torch and transformers 5.17.  The log is OUTROOT/make_golden.log (inside the
# tar too).  The tar is written even when a step fails; the exit status is non-zero then.
set -uo pipefail

if [ $# -ne 1 ]; then
    echo "usage: $0 OUTROOT" >&2
    exit 2
fi
OUTROOT="${1%/}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PY="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1

mkdir -p "$OUTROOT" || exit 2
LOG="$OUTROOT/make_golden.log"
: > "$LOG"
status=0

echo "== generate" | tee -a "$LOG"
"$PY" "$HERE/make_golden.py" --all "$OUTROOT" 2>&1 | tee -a "$LOG" || status=1

dirs=()
for d in "$OUTROOT"/*/; do
    [ -f "$d/golden.json" ] && dirs+=("${d%/}")
done
if [ ${#dirs[@]} -gt 0 ]; then
    echo "== replay (rebuild from the files, compare with the stored golden)" | tee -a "$LOG"
    "$PY" "$HERE/make_golden.py" --replay "${dirs[@]}" 2>&1 | tee -a "$LOG" || status=1
    echo "== structural check" | tee -a "$LOG"
    "$PY" "$HERE/check_fixture.py" "${dirs[@]}" 2>&1 | tee -a "$LOG" || status=1
else
    echo "no fixture was generated" | tee -a "$LOG"
    status=1
fi

PARENT="$(dirname "$OUTROOT")"
BASE="$(basename "$OUTROOT")"
if tar -C "$PARENT" -cf "$OUTROOT.tar" "$BASE"; then
    echo "wrote $OUTROOT.tar ($(du -h "$OUTROOT.tar" | cut -f1)); status $status"
else
    echo "tar failed" >&2
    status=1
fi
exit $status
