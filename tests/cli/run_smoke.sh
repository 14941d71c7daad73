#!/usr/bin/env bash
# `plumb run` end to end on the bundled model: streamed output and the summary line, seeded determinism, the prompt
# from a file or stdin, chat mode, stop strings, the loading lines, and every user error as one "error:" line with
# exit status 2 (no crash; the option parser's errors, plumb's own checks and errors in the input or the model alike),
# and plumb bench without a usable GPU as one with status 3.
# Usage: tests/cli/run_smoke.sh [PLUMB_BINARY]   (run from anywhere; it works in the repository root)
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
plumb=$(realpath "${1:-$root/build/plumb}")
cd "$root"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
. "$root/tests/cli/lib.sh"

# --- generation ---------------------------------------------------------------------------------------------
"$plumb" run -p "Once upon a time" --seed 7 --max-tokens 40 >"$tmp/a.out" 2>"$tmp/a.err"
rc=$?
[ $rc -eq 0 ] && ok "run exits 0" || bad "run exit status $rc: $(cat "$tmp/a.err")"
grep -q '[A-Za-z]\{3,\}' "$tmp/a.out" && ok "run prints text: $(head -c 80 "$tmp/a.out" | tr '\n' ' ')" || bad "no text on stdout"
summary='^[0-9]+ prompt tokens, [0-9]+ generated tokens \(.*\), prefill [0-9.]+ tok/s, decode [0-9.]+ tok/s, seed 7$'
tail -n 1 "$tmp/a.err" | grep -Eq "$summary" && ok "summary line: $(tail -n 1 "$tmp/a.err")" || bad "summary line: $(tail -n 1 "$tmp/a.err")"
grep -q '^loaded models/tiny: .*of weights in 1 file, mapped in' "$tmp/a.err" && ok "loading line" || bad "no loading line"
grep -q '^memory: RSS .* anonymous + .* file-backed' "$tmp/a.err" && ok "memory line" || bad "no memory line"
grep -q 'error' "$tmp/a.err" && bad "an error on a good run: $(cat "$tmp/a.err")"

"$plumb" run -q -p "Once upon a time" --seed 7 --max-tokens 40 >"$tmp/b.out" 2>/dev/null
cmp -s "$tmp/a.out" "$tmp/b.out" && ok "same seed, same output" || bad "same seed gave different outputs"
# A built-in fault in a model that generates text is said (its output is wrong on purpose).
"$plumb" run -q -p hi -n 2 --patches fault.rsf_twice >/dev/null 2>"$tmp/fault.err"
grep -q '^warning: fault.rsf_twice is a built-in fault, a deliberate bug for testing the precision toolkit' "$tmp/fault.err" &&
  ok "a fault in run is said: $(head -n 1 "$tmp/fault.err")" || bad "run with a fault, no warning: $(cat "$tmp/fault.err")"
# One token comes with the prefill: no decode rate to give; a greedy run names no seed.
"$plumb" run -q -p "Once upon a time" -n 1 --temperature 0 >/dev/null 2>"$tmp/one.err"
grep -qE '^[0-9]+ prompt tokens, 1 generated token \(max tokens\), prefill [0-9.]+ tok/s, decode n/a \(the one token came with the prefill\), greedy$' "$tmp/one.err" &&
  ok "one token: $(cat "$tmp/one.err")" || bad "one-token summary: $(cat "$tmp/one.err")"
# Only the seed differs: the run must succeed, print text, and sample another continuation.
"$plumb" run -q -p "Once upon a time" --seed 8 --max-tokens 40 >"$tmp/c.out" 2>"$tmp/c.err"
rc=$?
if [ $rc -ne 0 ] || ! grep -q '[A-Za-z]\{3,\}' "$tmp/c.out"; then
  bad "another seed: exit status $rc, stdout '$(head -c 80 "$tmp/c.out")', stderr $(cat "$tmp/c.err")"
elif cmp -s "$tmp/a.out" "$tmp/c.out"; then
  bad "another seed gave the same output"
else
  ok "another seed, another output"
fi

# A prompt fed in passes of 3 tokens continues exactly as one pass (greedy, the same story).
"$plumb" run -q -p "Once upon a time there was a little fox who" --temperature 0 --max-tokens 30 >"$tmp/p1.out" 2>/dev/null
"$plumb" run -q -p "Once upon a time there was a little fox who" --temperature 0 --max-tokens 30 --prefill-chunk 3 \
  >"$tmp/p3.out" 2>/dev/null
[ -s "$tmp/p1.out" ] && cmp -s "$tmp/p1.out" "$tmp/p3.out" && ok "--prefill-chunk 3: same continuation" \
  || bad "--prefill-chunk 3 changed the continuation: $(cat "$tmp/p1.out") / $(cat "$tmp/p3.out")"

# -f FILE and -f - (stdin) give the prompt's bytes as -p does: the same seeded output.
printf 'Once upon a time' >"$tmp/prompt.txt"
"$plumb" run -q -f "$tmp/prompt.txt" --seed 7 --max-tokens 40 >"$tmp/f.out" 2>/dev/null
printf 'Once upon a time' | "$plumb" run -q -f - --seed 7 --max-tokens 40 >"$tmp/fs.out" 2>/dev/null
[ -s "$tmp/f.out" ] && cmp -s "$tmp/a.out" "$tmp/f.out" && cmp -s "$tmp/a.out" "$tmp/fs.out" &&
  ok "-f FILE and -f -: the output of -p" || bad "-f: $(cat "$tmp/f.out") / $(cat "$tmp/fs.out")"

out=$("$plumb" run -q --chat -p "What color is the sky?" --temperature 0 2>/dev/null)
[[ "$out" == *blue* ]] && ok "chat mode answers: $out" || bad "chat mode: $out"
printf '{"type": "object", "required": ["color"], "additionalProperties": false, "properties": {"color": {"enum": ["blue", "red"]}}}' \
  >"$tmp/schema.json"
out=$("$plumb" run -q --chat --json-schema "$tmp/schema.json" -p "What color is the sky? As JSON." --temperature 0 \
  --max-tokens 30 2>/dev/null)
python3 -c 'import json, sys; v = json.loads(sys.argv[1]); assert list(v) == ["color"] and v["color"] in ("blue", "red")' "$out" &&
  ok "--json-schema: the reply is an instance: $out" || bad "--json-schema: $out"
out=$("$plumb" run -q --chat --json -p "A cat, as JSON." --temperature 0 --max-tokens 20 2>/dev/null)
[[ "$out" =~ ^[[:space:]]*\{ && "$out" != *"<｜"* ]] && ok "--json: the reply opens a JSON object: $out" || bad "--json: $out"
# plumb chat --json-schema: every reply of the conversation is an instance (one per line).
out=$(printf 'What color is the sky? As JSON.\nAnd the grass?\n' |
  "$plumb" chat -q --json-schema "$tmp/schema.json" --temperature 0 --max-tokens 30 2>/dev/null)
python3 -c '
import json, sys
lines = sys.argv[1].splitlines()
assert len(lines) == 2, lines
for l in lines: v = json.loads(l); assert list(v) == ["color"] and v["color"] in ("blue", "red")' "$out" &&
  ok "chat --json-schema: each reply an instance: $(echo $out)" || bad "chat --json-schema: $out"
out=$("$plumb" run -q --think -p "What is 3 plus 4?" --temperature 0 --max-tokens 60 2>/dev/null)
[[ "$out" == *"</think>"* ]] && ok "thinking mode reply has a reasoning block: $out" || bad "thinking mode: $out"

"$plumb" run -q -p "Once upon a time" --temperature 0 --stop "named" >"$tmp/s.out" 2>"$tmp/s.err"
if [ -s "$tmp/s.out" ] && ! grep -q named "$tmp/s.out" && grep -q '(stop string)' "$tmp/s.err"; then
  ok "stop string: $(cat "$tmp/s.out")"
else
  bad "stop string: $(cat "$tmp/s.out") / $(cat "$tmp/s.err")"
fi
"$plumb" run -q -p "Once upon a time" --max-tokens 5 >/dev/null 2>"$tmp/m.err"
grep -q '5 generated tokens (max tokens)' "$tmp/m.err" && ok "max tokens" || bad "max tokens: $(cat "$tmp/m.err")"

# --- errors: one line, "error: ...", exit status 2 ---------------------------------------------------------
mkdir -p "$tmp/notok" "$tmp/badtok"
cp models/tiny/config.json models/tiny/model.safetensors "$tmp/notok/"
cp models/tiny/config.json models/tiny/model.safetensors "$tmp/badtok/"
printf '{"model": {"type": "BPE", "vocab": {' >"$tmp/badtok/tokenizer.json"
long=$(python3 -c 'print("Once upon a time " * 700)' 2>/dev/null || printf 'Once upon a time %.0s' $(seq 700))
check_error() {  # name, expected text in the message, then the command (exit status 2; EXPECT_RC overrides)
  local name=$1 want=$2
  shift 2
  "$@" >"$tmp/e.out" 2>"$tmp/e.err"
  local rc=$? lines
  lines=$(wc -l <"$tmp/e.err")
  if [ $rc -eq "${EXPECT_RC:-2}" ] && [ "$lines" -eq 1 ] && grep -qF -- "$want" "$tmp/e.err" && grep -q '^error: ' "$tmp/e.err"; then
    ok "$name: $(cat "$tmp/e.err")"
  else
    bad "$name: exit status $rc, stderr: $(cat "$tmp/e.err")"
  fi
}
check_error "no tokenizer.json" "has no tokenizer.json" "$plumb" run -q -m "$tmp/notok" -p hi
check_error "malformed tokenizer.json" "badtok/tokenizer.json" "$plumb" run -q -m "$tmp/badtok" -p hi
check_error "empty prompt" "empty prompt: -p gives no text" "$plumb" run -q -p ""
check_error "empty --ids" "empty prompt: --ids lists no token ids" "$plumb" run -q --ids ""
check_error "prompt longer than the context" "context is 2048 tokens" "$plumb" run -q -p "$long"
check_error "token id outside the vocabulary" "outside the model's vocabulary" "$plumb" run -q --ids "0 99999"
check_error "stop token outside the vocabulary" "outside the model's vocabulary" "$plumb" run -q -p hi --stop-token 70000
check_error "missing model folder" "does not exist" "$plumb" run -q -m "$tmp/nothing" -p hi
check_error "bad sampling option" "top-p" "$plumb" run -q -p hi --top-p 2
check_error "negative prefill chunk" "prefill-chunk" "$plumb" run -q -p hi --prefill-chunk -1
# --seed: -1 is a random seed (llama.cpp's reading); a seed that does not fit was wrapped or saturated by the parser
for bad_seed in -2 18446744073709551615 1e3; do
  "$plumb" run -q -p hi -n 1 --seed "$bad_seed" >/dev/null 2>"$tmp/seed.err"
  rc=$?
  [ $rc -eq 2 ] && grep -qF -- "--seed: expected an integer from 0 to 9223372036854775807 (or -1: random), got '$bad_seed'" "$tmp/seed.err" &&
    ok "--seed $bad_seed refused" || bad "--seed $bad_seed: exit status $rc, stderr: $(cat "$tmp/seed.err")"
done
"$plumb" run -p hi -n 1 --seed -1 >/dev/null 2>"$tmp/seed.err" && grep -q 'seed [0-9]' "$tmp/seed.err" &&
  ! grep -q 'seed 18446744073709551615' "$tmp/seed.err" && ok "--seed -1: $(grep -o 'seed [0-9]*' "$tmp/seed.err")" ||
  bad "--seed -1: $(cat "$tmp/seed.err")"
: >"$tmp/empty.txt"
check_error "empty prompt file" "empty prompt: $tmp/empty.txt holds no text" "$plumb" run -q -f "$tmp/empty.txt"
check_error "prompt file a directory" "prompt file $tmp is a folder" "$plumb" run -q -f "$tmp"
check_error "missing prompt file" "cannot open prompt file $tmp/nothing.txt" "$plumb" run -q -f "$tmp/nothing.txt"
# Usage errors found by the option parser: one "error:" line naming the subcommand's help, status 2.
check_error "-f with -p" "error: --prompt excludes --file (plumb run --help lists the options)" \
  "$plumb" run -q -f "$tmp/prompt.txt" -p hi
check_error "an unknown option" "not expected: --bogus (plumb run --help lists the options)" "$plumb" run --bogus
check_error "a number that is not one" "--top-k = abc" "$plumb" run -p hi --top-k abc
check_error "no subcommand" "A subcommand is required (plumb --help lists the options)" "$plumb"
# Numbers that would read as "not given" downstream (NaN compares false; the tolerance overrides only above 0).
# Two traces named as diff(1) names its files: a trace against its own fixture agrees (exit 0), one with a planted
# fault diverges (exit 1) at a layer tap.
"$plumb" trace --fixture tests/data/golden/tiny -o "$tmp/tr.safetensors" >/dev/null 2>&1
"$plumb" trace --fixture tests/data/golden/tiny --patches fault.rsf_twice -o "$tmp/tr2.safetensors" >/dev/null 2>&1
out=$("$plumb" diff "$tmp/tr.safetensors" tests/data/golden/tiny 2>&1); rc=$?
out2=$("$plumb" diff "$tmp/tr.safetensors" "$tmp/tr2.safetensors" 2>&1); rc2=$?
[ $rc -eq 0 ] && [[ "$out" == *"first divergence: none"* ]] && [ $rc2 -eq 1 ] && [[ "$out2" == *"first divergence: L"* ]] &&
  ok "diff TRACE_A TRACE_B: none (0), then a divergence (1)" || bad "diff positional: $rc / $rc2: $out / $out2"
check_error "diff --tol nan" "--tol: expected a finite number above 0, got 'nan'" \
  "$plumb" diff --fixture tests/data/golden/tiny --a '' --b '' --tol nan
check_error "bisect --threshold-kld -1" "--threshold-kld: expected a finite number >= 0, got '-1'" \
  "$plumb" bisect --fixture tests/data/golden/tiny --patches fault.rsf_twice --threshold-kld -1
check_error "bisect --criterion bogus" "--criterion: bogus not in {local,free,kld}" \
  "$plumb" bisect --fixture tests/data/golden/tiny --patches fault.rsf_twice --criterion bogus
# (the command, not check_error, runs in $tmp: a subshell around check_error would keep its count to itself)
check_error "no bundled model in the current directory" "models/tiny" \
  bash -c 'cd "$1" && exec "$2" run -q -p hi' _ "$tmp" "$plumb"
check_error "chat without a tokenizer" "has no tokenizer.json" "$plumb" chat -q -m "$tmp/notok"
check_error "chat --json with --think" "--json cannot be combined with --think" "$plumb" chat -q --json --think
# An error inside a chat (a /save that cannot be written) is an error line, and the conversation goes on.
printf 'hi\n/save %s\n/save %s\n/quit\n' "$tmp/nothing/t.json" "$tmp/t.json" |
  "$plumb" chat -q -n 3 --seed 1 >"$tmp/c.out" 2>"$tmp/c.err"
rc=$?
[ $rc -eq 0 ] && [ "$(cat "$tmp/c.err")" = "error: /save: folder $tmp/nothing (of $tmp/nothing/t.json) does not exist" ] &&
  grep -q "saved 2 messages to $tmp/t.json" "$tmp/c.out" && ok "chat: a /save that fails, then one that works" ||
  bad "chat /save: exit status $rc, stderr: $(cat "$tmp/c.err"), stdout: $(cat "$tmp/c.out")"
# A line starting with "//" is a message starting with "/" (in the transcript as typed, less one slash); any other
# "/word" that is no command is an error line, and the chat goes on.
printf '/usr\n//usr is a folder\n/save %s\n' "$tmp/slash.json" | "$plumb" chat -q -n 2 --seed 1 >"$tmp/c.out" 2>"$tmp/c.err"
rc=$?
[ $rc -eq 0 ] && [ "$(cat "$tmp/c.err")" = "error: unknown command /usr (/help lists them; a message that starts with / is written //...)" ] &&
  python3 -c 'import json,sys; m=json.load(open(sys.argv[1]))["messages"]; sys.exit(m[0]["content"] != "/usr is a folder")' "$tmp/slash.json" &&
  ok "chat: //text sends /text, /usr is an unknown command" ||
  bad "chat slash lines: exit status $rc, stderr: $(cat "$tmp/c.err"), transcript: $(cat "$tmp/slash.json" 2>&1)"
# A command after blanks is still a command: "  /quit" leaves before the message after it (which would print a reply).
printf '  /save %s \n\t/quit\nhi\n' "$tmp/blank.json" | "$plumb" chat -q -n 2 --seed 1 >"$tmp/c.out" 2>"$tmp/c.err"
rc=$?
[ $rc -eq 0 ] && [ "$(cat "$tmp/c.out")" = "saved 0 messages to $tmp/blank.json" ] && [ ! -s "$tmp/c.err" ] &&
  ok "chat: '  /save F ' and a tab before /quit are commands" ||
  bad "chat commands after blanks: exit status $rc, stdout: $(cat "$tmp/c.out"), stderr: $(cat "$tmp/c.err")"
# Logits without a finite value are an error (never a token); here a repeat penalty overflows the bundled model's
# finite logits, which the message says. In a chat the failed turn's tokens were fed: the turn's checkpoint takes
# them back, so the cache matches the transcript again (/stats: nothing cached) and the chat goes on; the blanks
# before an escaped slash stay ("  //x" sends "  /x").
check_error "run: a penalty that overflows the logits" "the penalties made the model's finite logits so (repeat_penalty (--repeat-penalty) 1e-40" \
  "$plumb" run -q -p "Once upon a time" --repeat-penalty 1e-40 -n 5 --temperature 0
printf 'hi\nhello\n/stats\n/save %s\n' "$tmp/failed.json" |
  "$plumb" chat -q -n 3 --repeat-penalty 1e-40 --seed 1 >"$tmp/c.out" 2>"$tmp/c.err"
rc=$?
[ $rc -eq 0 ] && [ "$(grep -c "^(the turn was taken back: the conversation is as it was before it)$" "$tmp/c.err")" = 2 ] &&
  [ "$(grep -c "^error: prefilling the prompt's .* the penalties made the model's finite logits so" "$tmp/c.err")" = 2 ] &&
  grep -q "no turn yet; session: 0 tokens cached" "$tmp/c.out" && grep -q "saved 0 messages" "$tmp/c.out" &&
  ok "chat: a reply that fails after feeding is taken back and the chat goes on" ||
  bad "chat after a failed reply: exit status $rc, stdout: $(cat "$tmp/c.out"), stderr: $(cat "$tmp/c.err")"
# /undo takes back the last turn: the session goes back to its checkpoint, so the same message again gets the same
# greedy reply (the cache as it was), and the transcript loses the turn; /retry draws the last reply again (greedy:
# the same reply); with no turn to go back to, both are error lines and the chat goes on.
printf '/undo\nMy name is Tom.\nWhat is my name?\n/undo\n/stats\n/save %s\nWhat is my name?\n/retry\n/save %s\n' \
  "$tmp/undo.json" "$tmp/retry.json" | "$plumb" chat -q -n 12 --temperature 0 >"$tmp/c.out" 2>"$tmp/c.err"
rc=$?
n_msgs() { python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["messages"]))' "$1" 2>/dev/null; }
last_reply() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["messages"][-1]["content"])' "$1" 2>/dev/null; }
mapfile -t lines <"$tmp/c.out"
# stdout: reply 1, reply 2, "(took back ...)", 2 /stats lines, "saved", reply 2 again, the retry's reply, "saved"
[ $rc -eq 0 ] && [ "$(head -1 "$tmp/c.err")" = "error: /undo: no turn to take back (none yet; /reset starts over)" ] &&
  [ "${lines[2]}" = "(took back the last turn; the conversation is as it was before it)" ] &&
  [[ "${lines[4]}" == "session: 1 turn, "* ]] && [ "$(n_msgs "$tmp/undo.json")" = 2 ] &&
  [ "${lines[1]}" = "${lines[6]}" ] && [ "${lines[6]}" = "${lines[7]}" ] && [ "$(n_msgs "$tmp/retry.json")" = 4 ] &&
  [ "$(last_reply "$tmp/retry.json")" = "${lines[7]}" ] && grep -q "^(drawing the reply again)$" "$tmp/c.err" &&
  ok "chat: /undo takes back the last turn (the same reply after it), /retry draws it again" ||
  bad "chat /undo and /retry: exit status $rc, stdout: $(cat "$tmp/c.out"), stderr: $(cat "$tmp/c.err")"
# The penalties see the whole conversation (what the session holds, GenerateOptions::history_before), and /undo takes
# the taken-back turn's tokens out of it: with a presence penalty over every token, the same message after an /undo
# gets the same reply (checked to fail when /undo leaves them in).
printf 'Tell me a story.\nTell me a story.\n/undo\nTell me a story.\n' |
  "$plumb" chat -q -n 12 --temperature 0 --presence-penalty 5 --repeat-last-n -1 >"$tmp/p.out" 2>"$tmp/p.err"
rc=$?
mapfile -t lines <"$tmp/p.out"
[ $rc -eq 0 ] && [ -n "${lines[1]}" ] && [ "${lines[1]}" = "${lines[3]}" ] &&
  ok "chat: penalties over the conversation, /undo takes its turn out of them: ${lines[1]}" ||
  bad "chat penalties: exit status $rc, stdout: $(cat "$tmp/p.out"), stderr: $(cat "$tmp/p.err")"
# /undo again takes back the turn before (each turn's checkpoint kept, up to --undo-depth): after two turns, two
# /undo leave no turn and an empty cache, and the first message again gets the first reply; a third is an error line.
# With --undo-depth 1 the second /undo is refused: only the last turn's checkpoint was kept.
printf 'My name is Tom.\nWhat is my name?\n/undo\n/undo\n/stats\n/undo\nMy name is Tom.\n' |
  "$plumb" chat -q -n 12 --temperature 0 >"$tmp/u.out" 2>"$tmp/u.err"
rc=$?
printf 'My name is Tom.\nWhat is my name?\n/undo\n/undo\n/stats\n' | "$plumb" chat -q -n 12 --temperature 0 --undo-depth 1 \
  >"$tmp/u1.out" 2>"$tmp/u1.err"
rc1=$?
mapfile -t lines <"$tmp/u.out"
[ $rc -eq 0 ] && [ $rc1 -eq 0 ] && [ "${lines[2]}" = "(took back the last turn; the conversation is as it was before it)" ] &&
  [ "${lines[3]}" = "${lines[2]}" ] && [[ "${lines[4]}" == "no turn yet; session: 0 tokens cached"* ]] &&
  [ -n "${lines[0]}" ] && [ "${lines[5]}" = "${lines[0]}" ] &&
  [ "$(cat "$tmp/u.err")" = "error: /undo: no turn to take back (none yet; /reset starts over)" ] &&
  [ "$(cat "$tmp/u1.err")" = "error: /undo: no turn to take back (--undo-depth keeps the last 1 turn; /reset starts over)" ] &&
  grep -q "^session: 1 turn, " "$tmp/u1.out" &&
  ok "chat: /undo twice takes back two turns (the first reply again after them); --undo-depth 1 keeps one" ||
  bad "chat /undo twice: exit status $rc / $rc1, stdout: $(cat "$tmp/u.out") / $(cat "$tmp/u1.out"), stderr: $(cat "$tmp/u.err") / $(cat "$tmp/u1.err")"
# /retry's draws: the k-th retry of turn t samples with the seed + t + 1000003 k, so the first retry of a chat's first
# turn is what a chat seeded 1000003 further draws for it (and, here, another reply than the first draw).
printf 'Tell me a story\n/retry\n' | "$plumb" chat -q -n 10 --seed 5 --temperature 1 >"$tmp/r1.out" 2>/dev/null
printf 'Tell me a story\n' | "$plumb" chat -q -n 10 --seed 1000008 --temperature 1 >"$tmp/r2.out" 2>/dev/null
[ -n "$(sed -n 2p "$tmp/r1.out")" ] && [ "$(sed -n 2p "$tmp/r1.out")" = "$(sed -n 1p "$tmp/r2.out")" ] &&
  [ "$(sed -n 1p "$tmp/r1.out")" != "$(sed -n 2p "$tmp/r1.out")" ] &&
  ok "chat /retry: a new draw, with the seed + 1000003" ||
  bad "chat /retry's seed: seed 5 and its retry: $(cat "$tmp/r1.out"); seed 1000008: $(cat "$tmp/r2.out")"
# /load (and --load) goes on with a conversation /save wrote: the next turn's greedy reply is the one the saved chat
# gave (the same tokens in the cache); a file that is no transcript, or of the other mode, is an error line and the
# conversation stays as it was; --load of such a file ends the chat with exit status 2.
printf 'My name is Tom.\n/save %s\nWhat is my name?\n' "$tmp/tom.json" | "$plumb" chat -q -n 12 --temperature 0 >"$tmp/c1.out" 2>&1
printf 'What is my name?\n/stats\n/undo\n/undo\n' | "$plumb" chat -q -n 12 --temperature 0 --load "$tmp/tom.json" >"$tmp/c2.out" 2>"$tmp/c.err"
rc=$?
# (the turn after the load can be taken back, the loaded ones not: the second /undo names the /load)
[ $rc -eq 0 ] && [ "$(sed -n 3p "$tmp/c1.out")" = "$(sed -n 2p "$tmp/c2.out")" ] && [ -n "$(sed -n 2p "$tmp/c2.out")" ] &&
  grep -q "^loaded 2 messages from $tmp/tom.json (" "$tmp/c2.out" && grep -q "^session: 2 turns, " "$tmp/c2.out" &&
  grep -q "^(took back the last turn; the conversation is as it was before it)$" "$tmp/c2.out" &&
  [ "$(cat "$tmp/c.err")" = "error: /undo: no turn to take back (none before a /load; /reset starts over)" ] &&
  ok "chat --load: the next turn's reply is the saved chat's ($(sed -n 2p "$tmp/c2.out")); /undo stops at the load" ||
  bad "chat --load: exit status $rc, first chat: $(cat "$tmp/c1.out"), loaded: $(cat "$tmp/c2.out"), stderr: $(cat "$tmp/c.err")"
printf '{"messages": [{"role": "user", "content": "hi"}, {"role": "user", "content": "hi"}]}' >"$tmp/order.json"
printf 'not json' >"$tmp/notjson.json"
printf '/load %s\n/load %s\n/load %s/none.json\n/load %s\n/stats\n' "$tmp/order.json" "$tmp/notjson.json" "$tmp" "$tmp/tom.json" |
  "$plumb" chat -q -n 2 --think >"$tmp/c.out" 2>"$tmp/c.err"
rc=$?
[ $rc -eq 0 ] && sed -n 1p "$tmp/c.err" | grep -q '^error: /load: .*order.json: message 2 is a "user" message where the turns need "assistant"$' &&
  sed -n 2p "$tmp/c.err" | grep -q '^error: /load: .*notjson.json is not valid JSON' &&
  sed -n 3p "$tmp/c.err" | grep -q '^error: /load: cannot read .*/none.json$' &&
  sed -n 4p "$tmp/c.err" | grep -q '^error: /load: .*tom.json was saved in chat mode and this chat is in thinking mode (start plumb chat without --think)$' &&
  grep -q "no turn yet; session: 0 tokens cached" "$tmp/c.out" &&
  ok "chat /load: a file that is no transcript (or of the other mode) is an error line; nothing changes" ||
  bad "chat /load errors: exit status $rc, stdout: $(cat "$tmp/c.out"), stderr: $(cat "$tmp/c.err")"
check_error "chat --load of a file that is no transcript" '--load: '"$tmp"'/order.json: message 2 is a "user" message' \
  "$plumb" chat -q --load "$tmp/order.json" </dev/null
printf '  //hi there\n/save %s\n' "$tmp/esc.json" | "$plumb" chat -q -n 2 --seed 1 >/dev/null 2>&1
python3 -c 'import json,sys; m=json.load(open(sys.argv[1]))["messages"]; sys.exit(m[0]["content"] != "  /hi there")' "$tmp/esc.json" &&
  ok "chat: '  //hi there' sends '  /hi there'" || bad "chat escaped slash after blanks: $(cat "$tmp/esc.json" 2>&1)"
check_error "tokenize with a malformed tokenizer.json" "badtok/tokenizer.json is not valid JSON" \
  "$plumb" tokenize -t "$tmp/badtok/tokenizer.json" <<<"hi"
check_error "tokenize --decode of an id outside the vocabulary" \
  "stdin line 2: --decode: id 99999 (number 2 on the line) is outside the tokenizer's vocabulary [0, 1185)" \
  "$plumb" tokenize -t models/tiny/tokenizer.json --decode <<<$'1 2\n1 99999'
check_error "tokenize --decode of a word" "stdin line 1: --decode: 'x' at column 3 is not a token id" \
  "$plumb" tokenize -t models/tiny/tokenizer.json --decode <<<"1 x"
check_error "unknown backend" "unknown backend 'tpu' (available: cpu, cuda)" "$plumb" run -q -p hi --backend tpu
check_error "a CUDA patch on the CPU backend" "cuda.fp8_gemv is a CUDA kernel: it needs --backend cuda" \
  "$plumb" run -q -p hi --patches cuda.fp8_gemv
check_error "run --raw --no-think" "--raw cannot be combined with --chat, --system, --think, --no-think" \
  "$plumb" run -q -p hi --raw --no-think
check_error "run --reasoning-effort without --think" "--reasoning-effort requires --think" \
  "$plumb" run -q -p hi --reasoning-effort max
check_error "run --json --think" "--json cannot be combined with --think: the reasoning would be held to JSON too" \
  "$plumb" run -q -p hi --json --think
printf '{"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]+$"}}}' >"$tmp/pattern.json"
check_error "run --json-schema with a keyword plumb does not support" \
  "JSON schema: keyword \"pattern\" at #/properties/code is not supported" \
  "$plumb" run -q -p hi --json-schema "$tmp/pattern.json"
check_error "bisect --threshold-kld beside another criterion" "--threshold-kld is the kld criterion's: it cannot be combined with --criterion local" \
  "$plumb" bisect --fixture tests/data/golden/tiny --patches fault.rsf_twice --criterion local --threshold-kld 1
check_error "bench --skeleton without --layers" "--skeleton applies to the layer bench: it needs --layers N" \
  "$plumb" bench --skeleton
check_error "bench --batches without --layers" "--batches applies to the layer bench: it needs --layers N" \
  "$plumb" bench --batches 8
check_error "bench --only with --layers" "--only applies to the kernel bench, which runs without --layers" \
  "$plumb" bench --layers 1 --only moe
check_error "bench --skeleton on the CPU backend" "--skeleton skips the CUDA forward's weight launches: it needs --backend cuda" \
  "$plumb" bench --layers 1 --backend cpu --skeleton
check_error "bench --cold-l2 on the CPU backend" "--cold-l2 flushes the GPU's L2 between the layer bench's steps: it needs --backend cuda" \
  "$plumb" bench --layers 1 --backend cpu --cold-l2
check_error "bench --batches with an empty item" "--batches '1,,8': an empty item (sizes are separated by single commas)" \
  "$plumb" bench --layers 1 --backend cpu --batches 1,,8
check_error "bench --batches with a sign" "--batches '+8': '+8' is not a size" \
  "$plumb" bench --layers 1 --backend cpu --batches +8
check_error "bench --batches 0" "--batches '1,0': a decode batch has at least one sequence" \
  "$plumb" bench --layers 1 --backend cpu --batches 1,0
check_error "bench --prefill ''" "--prefill '': an empty item" "$plumb" bench --layers 1 --backend cpu --prefill ''
check_error "bench --layers --warmup 0" "--warmup 0: the layer bench takes at least 1 warm-up step" \
  "$plumb" bench --layers 1 --backend cpu --warmup 0
check_error "unknown backend in a toolkit configuration" "unknown backend 'tpu' in 'tpu:'" \
  "$plumb" kld --fixture tests/data/golden/tiny --a '' --b tpu:
# The toolkit's --text input: the tokenizer comes from the model folder unless --tokenizer names one.
printf 'Once upon a time there was a fox.' >"$tmp/story.txt"
"$plumb" kld -m models/tiny --text "$tmp/story.txt" --a '' --b '' >"$tmp/k.out" 2>"$tmp/k.err" &&
  grep -q 'KL divergence statistics' "$tmp/k.out" && ok "kld --text without --tokenizer: $(grep -m1 '^input' "$tmp/k.out")" ||
  bad "kld --text without --tokenizer: $(cat "$tmp/k.err")"
# kld names its maximum's position and the diff that examines it, as a command with the input's own options; that
# command, run as printed, compares that position's rows alone and names the position of the largest error (the
# fault scales every row: the one kept).
"$plumb" kld -m models/tiny --text "$tmp/story.txt" --chunk 4 --b fault.rsf_twice >"$tmp/km.out" 2>&1
pos=$(sed -n "s/^Maximum KLD: .* (position \([0-9]*\))$/\1/p" "$tmp/km.out")
hint=$(sed -n 's/^examine   plumb //p' "$tmp/km.out")
want="diff -m models/tiny --text $tmp/story.txt --chunk 4 --a '' --b fault.rsf_twice --positions $pos --local"
eval "\"\$plumb\" $hint" >"$tmp/dp.out" 2>&1
rc=$?
[ -n "$pos" ] && [ "$hint" = "$want" ] && [ "$rc" -eq 1 ] && grep -q "^note: positions $pos only (1 row in 1 of " "$tmp/dp.out" &&
  grep -q "^where: L0.ffn.routed first exceeds tolerance .*(position $pos): " "$tmp/dp.out" &&
  grep -q "^diagnosis: routed_scaling_factor applied twice" "$tmp/dp.out" &&
  ok "kld's maximum (position $pos) examined by the diff it prints: $(grep '^where' "$tmp/dp.out")" ||
  bad "kld -> diff --positions: pos '$pos', hint '$hint' (want '$want'), rc $rc: $(cat "$tmp/km.out" "$tmp/dp.out")"
# A text longer than the model's context runs (both configurations see the same positions), with a note saying so.
printf '%s' "$long" >"$tmp/long.txt"
"$plumb" trace -m models/tiny --text "$tmp/long.txt" -o "$tmp/long.safetensors" --taps logits >/dev/null 2>"$tmp/l.err" &&
  grep -q "^note: text .* is [0-9]* tokens, beyond the model's context of 2048 (max_position_embeddings)" "$tmp/l.err" &&
  ok "a text beyond the context: $(cat "$tmp/l.err")" || bad "a text beyond the context: $(cat "$tmp/l.err")"
check_error "--text with a model folder without a tokenizer" "has no tokenizer.json" \
  "$plumb" kld -m "$tmp/notok" --text "$tmp/story.txt" --a '' --b ''
# --backend cuda: on a machine without a usable GPU (or a build without CUDA) one error line that says why;
# with a GPU it runs.
"$plumb" run -q -p hi -n 3 --seed 1 --backend cuda >"$tmp/g.out" 2>"$tmp/g.err"
rc=$?
if [ $rc -eq 0 ]; then
  ok "backend cuda runs here: $(head -c 60 "$tmp/g.out" | tr '\n' ' ')"
  # The loading lines say what the upload took of the GPU.
  "$plumb" run -p hi -n 1 --backend cuda --patches cuda.fast >/dev/null 2>"$tmp/m.err"
  grep -q '^gpu memory: the weights took [0-9.]* [MG]B of the GPU (.*); [0-9.]* GB free of [0-9.]* GB for the caches$' "$tmp/m.err" &&
    ok "backend cuda: $(grep '^gpu memory' "$tmp/m.err")" || bad "backend cuda, no gpu memory line: $(cat "$tmp/m.err")"
  grep -q '^loaded models/tiny: .*, mapped and uploaded to the GPU in ' "$tmp/m.err" &&
    ok "backend cuda: the loaded line names the upload" || bad "backend cuda, loaded line: $(grep '^loaded' "$tmp/m.err")"
  # On a terminal (script(1) gives it one) the live loading line is redrawn below the backend's notes ("backend
  # cuda: ..."), which must each start a line of their own, not run on after the line's text.
  if ! command -v script >/dev/null 2>&1; then
    echo "skip backend cuda on a terminal: no script(1) here"
  else
    script -qfc "$plumb run -p hi -n 1 --backend cuda --patches cuda.fast" "$tmp/tty.txt" >/dev/null 2>&1
    if python3 - "$tmp/tty.txt" <<'PY'; then
import re, sys
text = open(sys.argv[1], "rb").read().decode("utf-8", "replace")
# What each terminal line shows last: the text after its last carriage return, the clear-line sequence removed.
shown = [re.sub(r"\x1b\[K", "", line.rstrip("\r").split("\r")[-1]) for line in text.split("\n")]
notes = [s for s in shown if "backend cuda:" in s]
sys.exit(0 if notes and all(s.startswith("backend cuda:") for s in notes) else 1)
PY
      ok "backend cuda on a terminal: each note on a line of its own"
    else
      bad "backend cuda on a terminal, a note run into the loading line: $(tr '\r' '|' <"$tmp/tty.txt" | head -c 600)"
    fi
  fi
  # Without --patches (and without -q) it says that this is the fp32 twin and names the fast preset; with patches
  # not. (After the load: without a GPU the error line stands alone, checked below.)
  "$plumb" run -p hi -n 1 --seed 1 --backend cuda >/dev/null 2>"$tmp/n.err"
  grep -q '^note: --backend cuda without --patches runs the GPU.s fp32 twin.*--patches cuda.fast' "$tmp/n.err" &&
    ok "backend cuda without patches: the note" || bad "backend cuda without patches, no note: $(cat "$tmp/n.err")"
  "$plumb" run -p hi -n 1 --seed 1 --backend cuda --patches cuda.fast >/dev/null 2>"$tmp/n2.err"
  grep -q '^note: ' "$tmp/n2.err" && bad "a note with --patches: $(cat "$tmp/n2.err")" || ok "backend cuda with patches: no note"
  # bisect on the GPU: every subset against the GPU's own fp32 twin, so the fast kernels beside a planted fault
  # leave the fault alone as the culprit.
  "$plumb" bisect --fixture tests/data/golden/tiny --patches cuda.fast,fault.rsf_twice --backend cuda -q >"$tmp/bi.out" 2>&1
  grep -q '^plumb bisect: .* (backend cuda), criterion: ' "$tmp/bi.out" && grep -q '^bisect: 1 culprit: fault.rsf_twice ' "$tmp/bi.out" &&
    ok "bisect --backend cuda: $(grep '^bisect:' "$tmp/bi.out")" || bad "bisect --backend cuda: $(cat "$tmp/bi.out")"
  # A whole list the backend refuses at load is an error naming why, not a list that "does not diverge" (the
  # backend's load notes come before it on stderr).
  "$plumb" bisect --fixture tests/data/golden/tiny --patches cuda.hc_fold,fault.rsf_twice --backend cuda -q >"$tmp/br.out" 2>"$tmp/br.err"
  rc=$?
  [ $rc -eq 2 ] && tail -n 1 "$tmp/br.err" | grep -q '^error: backend cuda: cuda.hc_fold folds' &&
    ok "bisect --backend cuda, a list the backend refuses: $(tail -n 1 "$tmp/br.err")" ||
    bad "bisect --backend cuda, a refused list: exit $rc: $(cat "$tmp/br.out" "$tmp/br.err")"
  # A model whose weights cannot fit the GPU (~160 GB declared in a sparse file) is refused before the upload.
  if python3 "$(dirname "$0")/oversize_model.py" models/tiny "$tmp/huge" >"$tmp/huge.log" 2>&1; then
    check_error "a model larger than the GPU" "does not fit one GPU" \
      "$plumb" run -q -m "$tmp/huge" -p hi -n 1 --backend cuda --patches cuda.fast
  else
    bad "oversize_model.py could not build the model: $(tail -n 3 "$tmp/huge.log")"
  fi
  rm -rf "$tmp/huge"
elif [ $rc -eq 2 ] && [ "$(wc -l <"$tmp/g.err")" -eq 1 ] && grep -q '^error: backend cuda: ' "$tmp/g.err"; then
  ok "backend cuda without a GPU: $(cat "$tmp/g.err")"
  # Then plumb bench has no GPU either: it says why in one error line, with status 3 (scripts tell it from a failure).
  EXPECT_RC=3 check_error "bench without a usable GPU" "error: plumb bench: " "$plumb" bench
  EXPECT_RC=3 check_error "bench --layers without a usable GPU" "error: plumb bench --layers: " "$plumb" bench --layers 1
else
  bad "backend cuda: exit status $rc, stderr: $(cat "$tmp/g.err")"
fi

finish run_smoke
