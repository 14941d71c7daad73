#!/usr/bin/env bash
# `plumb verify-golden` over several fixtures: folders named one by one or through a root whose subfolders hold
# them (a folder without golden.json there is skipped); a summary line with the counts, every fixture that failed
# or could not be loaded named, exit 0 only when all pass; a folder with no fixture at all is one clear error;
# each fixture runs in its own numerics unless `--patches` names a numerics mode (`numerics.fixture` says so).
# Usage: verify_many.sh PLUMB_BINARY GOLDEN_DIR (tests/data/golden)
set -u
plumb=$1
golden=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
. "$(dirname "$0")/lib.sh"

check() {  # check NAME COND: COND is a shell test on the last run's rc and files
  if eval "$2"; then
    ok "$1"
  else
    bad "$1 (exit $rc); stdout tail:"
    tail -5 "$work/out"
    echo "stderr:"
    cat "$work/err"
  fi
}
run() {
  "$plumb" verify-golden -q "$@" >"$work/out" 2>"$work/err"
  rc=$?
}

run "$golden/tiny" "$golden/swa-hash"
check "two fixtures pass" '[ $rc -eq 0 ] && grep -q "^verify-golden: 2 fixtures, 2 pass, 0 fail, 0 could not run" "$work/out"'

mkdir -p "$work/root/notes"
cp -r "$golden/tiny" "$work/root/a-tiny"
cp -r "$golden/tiny" "$work/root/b-broken"
chmod -R u+w "$work/root"
rm "$work/root/b-broken/model.safetensors"
cp -r "$golden/swa-hash" "$work/root/c-swa"
run "$work/root"
check "a root: its fixtures in name order, the broken one reported, the others run (exit 2: one could not run)" \
  '[ $rc -eq 2 ] && grep -q "^verify-golden: 3 fixtures, 2 pass, 0 fail, 1 could not run" "$work/out" &&
   grep -q "ERROR  .*b-broken: .*model.safetensors" "$work/out" && grep -q "^error: .*model.safetensors" "$work/err" &&
   [ "$(grep -c "^=== \[" "$work/out")" -eq 3 ] && grep -n "^=== \[" "$work/out" | head -1 | grep -q "a-tiny"'

# Options that no fixture could run with are one error, not one per fixture.
run --patches bogus "$work/root"
check "an unknown patch: one error line before any fixture" \
  '[ $rc -eq 2 ] && [ "$(grep -c . "$work/err")" -eq 1 ] && grep -q "^error: unknown patch .bogus." "$work/err" &&
   ! grep -q "^=== \[" "$work/out"'
run -q "$work/root/a-tiny" "$work/root/c-swa"
check "-q: no step heading or tap table where every tap passes" \
  '[ $rc -eq 0 ] && ! grep -q "^step s0 (" "$work/out" && ! grep -q "max|err|" "$work/out" && grep -q "^  step s0: all ok" "$work/out"'

run --patches fault.rsf_twice "$work/root/a-tiny" "$work/root/c-swa"
check "a fault fails every fixture, each named" \
  '[ $rc -eq 1 ] && grep -q "2 fixtures, 0 pass, 2 fail, 0 could not run (patches \[fault.rsf_twice\])" "$work/out" &&
   [ "$(grep -c "^  FAIL   " "$work/out")" -eq 2 ]'

# Each fixture in its own numerics unless --patches names a numerics mode: an official-code golden passes beside a
# transformers one; in the reference numerics (numerics.reference) the official one fails: the gap between the two.
run "$golden/tiny" "$golden/tiny-official-ref"
check "no numerics named: each fixture's own, said in its header" \
  '[ $rc -eq 0 ] && grep -q "2 fixtures, 2 pass, 0 fail" "$work/out" &&
   grep -q "^numerics numerics.official, the fixture.s own (DeepSeek.s official code computed it" "$work/out" &&
   grep -q "^numerics numerics.reference, the fixture.s own (an fp32 reference computed it" "$work/out"'
run --patches numerics.reference "$golden/tiny" "$golden/tiny-official-ref"
check "official-code golden in the reference numerics: fails, named" \
  '[ $rc -eq 1 ] && grep -q "2 fixtures, 1 pass, 1 fail" "$work/out" && grep -q "FAIL   .*tiny-official-ref" "$work/out" &&
   ! grep -q "^numerics " "$work/out"'
run --patches fault.rsf_twice "$golden/tiny-official-ref"
check "a patch without a numerics mode runs in the fixture's numerics (a fault still fails there)" \
  '[ $rc -eq 1 ] && grep -q "patches \[numerics.official,fault.rsf_twice\]" "$work/out"'
run --patches numerics.fixture "$golden/tiny" "$golden/tiny-official-ref" "$golden/tiny-official-initial-ref"
check "numerics.fixture: each in its own numerics" \
  '[ $rc -eq 0 ] && grep -q "3 fixtures, 3 pass, 0 fail" "$work/out" && grep -q "patches \[numerics.official\]" "$work/out" &&
   grep -q "patches \[numerics.official_initial\]" "$work/out"'

# A failure prints the toolkit's diagnosis command; run as printed, it names the fault's first diverging op.
run --patches fault.rsf_twice "$golden/tiny"
diag=$(sed -n 's/^diagnose: //p' "$work/out" | sed "s#plumb #$plumb #g; s#run.safetensors#$work/run.safetensors#g")
eval "$diag" >"$work/diag" 2>&1
check "the diagnose line runs and names the fault" \
  '[ -n "$diag" ] && grep -q "^first divergence: L0.ffn.routed" "$work/diag" &&
   grep -q "^diagnosis: routed_scaling_factor applied twice" "$work/diag"'

mkdir -p "$work/empty/sub"
run "$work/empty"
check "no fixture: one error line" \
  '[ $rc -eq 2 ] && [ "$(grep -c . "$work/err")" -eq 1 ] && grep -q "^error: .*empty: no golden.json" "$work/err"'

finish verify_many
