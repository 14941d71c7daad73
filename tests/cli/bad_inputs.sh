#!/usr/bin/env bash
# Bad inputs give one clear `error:` line and a non-zero exit, never a crash: a corrupt or truncated safetensors
# file, a config with an unknown layer type, a token id outside the vocabulary, a NaN in golden.json (not JSON), a
# missing fixture file.
# Usage: bad_inputs.sh PLUMB_BINARY FIXTURE_DIR
set -u
plumb=$1
src=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
. "$(dirname "$0")/lib.sh"

# expect NAME PATTERN CMD...: exit status 2 (an error, not a check that failed, nor a signal), exactly one stderr
# line "error: ...PATTERN..."
expect() {
  local name=$1 pattern=$2
  shift 2
  "$@" >"$work/out" 2>"$work/err"
  local rc=$?
  local lines
  lines=$(grep -c . "$work/err")
  if [ "$rc" -eq 2 ] && [ "$lines" -eq 1 ] && grep -q "^error: .*$pattern" "$work/err"; then
    ok "$name: $(cat "$work/err")"
  else
    bad "$name: exit $rc, stderr:"
    cat "$work/err"
  fi
}

fresh() {  # a writable copy of the fixture
  rm -rf "$work/fx"
  cp -r "$src" "$work/fx"
  chmod -R u+w "$work/fx"
}

fresh
size=$(stat -c %s "$work/fx/model.safetensors")
head -c $((size / 2)) "$src/model.safetensors" >"$work/fx/model.safetensors"
expect "truncated model.safetensors" "model.safetensors" "$plumb" verify-golden "$work/fx"

fresh
printf '\x10\x00\x00\x00\x00\x00\x00\x00{"a": [1, 2' >"$work/fx/model.safetensors"
expect "corrupt safetensors header" "model.safetensors" "$plumb" verify-golden "$work/fx"

fresh
python3 - "$work/fx/config.json" <<'PY'
import json, sys
p = sys.argv[1]; c = json.load(open(p)); c["layer_types"][1] = "dense_attention"; json.dump(c, open(p, "w"))
PY
expect "unknown layer type" "dense_attention" "$plumb" verify-golden "$work/fx"

fresh
python3 - "$work/fx/golden.json" <<'PY'
import json, sys
p = sys.argv[1]; g = json.load(open(p)); g["steps"][0]["tokens"][2] = 100000; json.dump(g, open(p, "w"))
PY
expect "token outside the vocabulary, with its fixture and step" "$work/fx: step s0: token 100000 at position 2" \
  "$plumb" verify-golden "$work/fx"
expect "an empty item in a patch list" "patch list 'moe.rsf_in_topk,,router.bf16': an empty item" \
  "$plumb" verify-golden "$work/fx" --patches 'moe.rsf_in_topk,,router.bf16'
expect "trace: the same token, with its input and step" "fixture $work/fx: step s0: token 100000 at position 2" \
  "$plumb" trace --fixture "$work/fx" -o "$work/t.safetensors"

fresh
sed -i '0,/"seed": [0-9]*/s//"seed": NaN/' "$work/fx/golden.json"  # what Python's json writes for a NaN
expect "NaN in golden.json" "golden.json: not valid JSON.*line" "$plumb" verify-golden "$work/fx"

fresh
rm "$work/fx/model.safetensors"
expect "missing weights" "model.safetensors" "$plumb" verify-golden "$work/fx"

fresh
expect "unknown patch" "unknown patch" "$plumb" verify-golden --patches moe.nonexistent "$work/fx"

fresh
expect "numerics.fixture outside verify-golden" "numerics.fixture is verify-golden's" "$plumb" diff --a numerics.fixture --fixture "$work/fx"

fresh
expect "two numerics modes" "numerics.reference and numerics.official are two numerics modes: choose one" \
  "$plumb" verify-golden --patches numerics.reference,numerics.official "$work/fx"

# Sampling options are checked before the model loads: with a model folder that does not exist, the option is what
# the error names (a typo in --top-p must not wait for a 100 GB load to be reported).
expect "run: --top-p before the load" "top_p (--top-p) must be in (0, 1\]" "$plumb" run --model "$work/no-such-model" -p hi --top-p 0
expect "run: NaN --presence-penalty" "presence_penalty (--presence-penalty) must be a finite number" \
  "$plumb" run --model "$work/no-such-model" -p hi --presence-penalty nan
expect "run: --max-tokens before the load" "max_tokens (--max-tokens) must be at least 1" "$plumb" run --model "$work/no-such-model" -p hi --max-tokens 0
expect "run: an empty item in --ids" "--ids: the comma at column 3 has no token id before it" \
  "$plumb" run --model "$work/no-such-model" --ids '1,,2'
expect "chat: --temperature before the load" "temperature (--temperature) must be a number >= 0" \
  "$plumb" chat --model "$work/no-such-model" --temperature -1 </dev/null

# The toolkit's input files: a directory is refused by name (it read as an empty file: --text DIR ran on BOS alone).
fresh
expect "kld: --text a directory" "text file $work is a folder" "$plumb" kld -m "$work/fx" --text "$work"
expect "trace: --tokens a directory" "token file $work is a folder" "$plumb" trace -m "$work/fx" --tokens "$work" -o "$work/t"
expect "kld: -m a file" "-m $work/fx/config.json is not a folder" "$plumb" kld -m "$work/fx/config.json" --text "$work/fx/config.json"
expect "kld: --text missing" "cannot open text file $work/none.txt" "$plumb" kld -m "$work/fx" --text "$work/none.txt"
# Output files are checked when the options are parsed, before any run (a long kld must not end in "cannot write").
expect "trace: -o a folder" "--out: $work is a folder" "$plumb" trace -m "$work/fx" --tokens "$work/none" -o "$work"
expect "kld: --json in a missing folder" "--json: folder $work/none (of $work/none/k.json) does not exist" \
  "$plumb" kld -m "$work/fx" --text "$work/none.txt" --json "$work/none/k.json"

# A filter that names what the run does not have is refused, not traced as (almost) nothing: the layers, steps and
# positions before the run, the --taps globs against the taps the model offered (trace) or the table (diff).
fresh
expect "trace: --layers past the model" "--layers: layer 9 is beyond the model's 4 layers (0-3)" \
  "$plumb" trace --fixture "$work/fx" --layers 9 -o "$work/t.safetensors"
expect "trace: --steps naming no step" "--steps: s99 names no step of fixture $work/fx" \
  "$plumb" trace --fixture "$work/fx" --steps s0,s99 -o "$work/t.safetensors"
expect "trace: --positions past the input" "--positions: position 500 is beyond the" \
  "$plumb" trace --fixture "$work/fx" --positions 500-600 -o "$work/t.safetensors"
expect "trace: a --taps typo" "--taps: 'L0.atn.\*' matches no tap of this run" \
  "$plumb" trace --fixture "$work/fx" --taps 'L0.atn.*' -o "$work/t.safetensors"
expect "diff: --taps outside --layers" "--taps: 'L0.\*' matches no tap of this run in the layers --layers keeps" \
  "$plumb" diff --fixture "$work/fx" --a '' --b '' --taps 'L0.*' --layers 1
expect "diff: --positions past the input" "--positions: position 500 is beyond the" \
  "$plumb" diff --fixture "$work/fx" --a '' --b '' --positions 500
expect "diff: --positions not a number" "--positions 'x': 'x' is not" \
  "$plumb" diff --fixture "$work/fx" --a '' --b '' --positions x
"$plumb" trace --fixture "$work/fx" --positions 0-1 -o "$work/p.safetensors" >/dev/null 2>&1
expect "diff: --positions a recorded trace did not keep" "--positions: trace $work/p.safetensors holds no row of position 5 (it holds 2 rows, of positions 0-1)" \
  "$plumb" diff "$work/p.safetensors" "$work/p.safetensors" --positions 5
rm -f "$work/p.safetensors" "$work/p.json"
expect "trace: --steps and --positions that keep no row" "--steps s0 and --positions 20 keep no row of fixture $work/fx" \
  "$plumb" trace --fixture "$work/fx" --steps s0 --positions 20 -o "$work/t.safetensors"
expect "--positions with a sign" "--positions '-1': '-1' is not a non-negative integer or a range a-b" \
  "$plumb" diff --fixture "$work/fx" --positions -1
# Options that the run would ignore are refused by name.
expect "kld: --topk without --save-ref" "--topk requires --save-ref" "$plumb" kld --fixture "$work/fx" --topk 5
expect "kld: --save-ref beside --b" "--b excludes --save-ref" "$plumb" kld --fixture "$work/fx" --save-ref "$work/r.st" --b ''
expect "kld: --chunk with a fixture" "--chunk splits a --text input into prefill chunks; --fixture has its own steps" \
  "$plumb" kld --fixture "$work/fx" --chunk 5
expect "diff: two traces beside a configuration" "two recorded traces are compared as they are" \
  "$plumb" diff "$work/fx" "$work/fx" --b fault.rsf_twice
expect "bisect: a backend prefix on the patches" "bisect takes patch names; the backend is --backend cuda" \
  "$plumb" bisect --fixture "$work/fx" --patches cuda:cuda.fp8_gemv
expect "bisect: a CUDA patch on the CPU" "patch cuda.fp8_gemv is a CUDA kernel: bisect it with --backend cuda" \
  "$plumb" bisect --fixture "$work/fx" --patches cuda.fp8_gemv
# A saved kld reference run against another model's folder names the vocabularies before running.
"$plumb" kld --fixture "$work/fx" --save-ref "$work/r.st" >/dev/null 2>&1
bundled=$(cd "$(dirname "$0")/../.." && pwd)/models/tiny
expect "kld --ref against another model" "saved for a vocabulary of 256 .* but $bundled has 1216: another model" \
  "$plumb" kld --ref "$work/r.st" -m "$bundled"
[ ! -e "$work/t.safetensors" ] && ok "no trace file written by a refused filter" || bad "a refused filter wrote $work/t.safetensors"

finish bad_inputs
