#!/usr/bin/env bash
# `plumb chat` in a real pseudo-terminal (tmux): three turns on the bundled model, checking that each reply
# appears, that the model remembers the first turn in the third (the cache is kept), and that /stats after the
# second turn reports a prefill of exactly that turn's own tokens (the previous reply's closing EOS + the user
# turn + the assistant opening), not the whole history; then Ctrl-C during a reply, during a prefill and during a
# /retry's prefill (then /undo). Exit 77 (CTest SKIP_RETURN_CODE) without tmux.
# Usage: tests/cli/chat_tmux.sh [PLUMB_BINARY]
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
plumb=$(realpath "${1:-$root/build/plumb}")
command -v tmux >/dev/null || { echo "SKIP: tmux is not installed (apt-get install tmux)"; exit 77; }
cd "$root"
sock="plumb-chat-test-$$"
sess=chat
tmp=$(mktemp -d)
cleanup() { tmux -L "$sock" kill-server 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
. "$root/tests/cli/lib.sh"

# A private tmux server (-L) so a user's own sessions are never touched; a wide pane so nothing wraps.
tmux -L "$sock" -f /dev/null new-session -d -s "$sess" -x 250 -y 60 \
  "cd '$root' && '$plumb' chat -q --temperature 0 --seed 1; echo CHAT-EXITED; sleep 60"
pane() { tmux -L "$sock" capture-pane -p -J -S -1000 -t "$sess"; }
prompts() { pane | grep -c '^> '; }
# Waits (up to 30 s) until the pane shows N prompts "> " (the chat is waiting for input again).
wait_prompts() {
  for _ in $(seq 300); do
    [ "$(prompts)" -ge "$1" ] && return 0
    sleep 0.1
  done
  echo "timed out waiting for prompt $1; pane:"
  pane
  return 1
}
say() { tmux -L "$sock" send-keys -t "$sess" -l "$1" && tmux -L "$sock" send-keys -t "$sess" Enter; }
# The reply to the turn typed at prompt N: the lines between "> <text>" and the next prompt.
reply() { pane | awk -v n="$1" '/^> /{k++; next} k==n && NF' | head -n 20; }

wait_prompts 1 || exit 1
say "Hello!"
wait_prompts 2 || exit 1
r1=$(reply 1)
[ -n "$r1" ] && ok "turn 1 reply: $r1" || bad "turn 1: no reply"

turn2="My name is Tom."
say "$turn2"
wait_prompts 3 || exit 1
r2=$(reply 2)
[ -n "$r2" ] && ok "turn 2 reply: $r2" || bad "turn 2: no reply"

say "/stats"
wait_prompts 4 || exit 1
stats=$(reply 3)
echo "$stats" | sed 's/^/     /'
got=$(echo "$stats" | sed -n 's/^last turn: prefill tokens: \([0-9]*\),.*/\1/p')
cached=$(echo "$stats" | sed -n 's/.* \([0-9]*\) tokens cached.*/\1/p')
# What turn 2 had to prefill: turn 1's reply ended with EOS (greedy, a short answer), which was sampled but
# not yet fed, then the user turn and the assistant opening. Counted with the model's own tokenizer.
want=$(printf '%s\n' "<｜end▁of▁sentence｜><｜User｜>${turn2}<｜Assistant｜></think>" \
  | "$plumb" tokenize -t models/tiny/tokenizer.json | wc -w)
if [ -n "$got" ] && [ "$got" -eq "$want" ]; then
  ok "turn 2 prefilled its own $got tokens"
else
  bad "turn 2 prefilled '$got' tokens, expected $want (its own tokens only)"
fi
if [ -n "$cached" ] && [ -n "$got" ] && [ "$cached" -gt "$got" ]; then
  ok "the session holds $cached tokens: the history was not prefilled again"
else
  bad "session tokens '$cached' vs last prefill '$got'"
fi

say "What is my name?"
wait_prompts 5 || exit 1
r3=$(reply 4)
[ -n "$r3" ] && ok "turn 3 reply: $r3" || bad "turn 3: no reply"
[[ "$r3" == *Tom* ]] && ok "turn 3 remembers turn 2 (kept cache)" || bad "turn 3 does not mention Tom: $r3"

say "/save $tmp/transcript.json"
wait_prompts 6 || exit 1
grep -q '"content": "My name is Tom."' "$tmp/transcript.json" 2>/dev/null && ok "/save wrote the transcript" \
  || bad "/save: $(reply 5)"

say "/quit"
for _ in $(seq 100); do pane | grep -q CHAT-EXITED && break; sleep 0.1; done
pane | grep -q CHAT-EXITED && ok "/quit leaves" || bad "/quit did not leave"
if pane | grep -qiE 'error|terminate|abort|segmentation'; then bad "errors in the pane"; pane; fi

# Ctrl-C while a reply streams stops the reply, not the chat. A hot, untruncated sampler keeps the reply long
# (seed 1: 1343 tokens before a stop token, seconds on any machine); Ctrl-C goes once its text has started.
sess=chat2
tmux -L "$sock" new-session -d -s "$sess" -x 250 -y 60 \
  "cd '$root' && '$plumb' chat -q --temperature 5 --top-k 0 --top-p 1 --min-p 0 -n 1500 --seed 1; echo CHAT-EXITED; sleep 60"
wait_prompts 1 || exit 1
say "Tell me a story"
for _ in $(seq 300); do [ -n "$(reply 1)" ] && break; sleep 0.1; done
tmux -L "$sock" send-keys -t "$sess" C-c
wait_prompts 2 || exit 1
pane | grep -q '^(reply stopped: Ctrl-C; the conversation goes on)$' && ok "Ctrl-C stopped the reply" ||
  { bad "Ctrl-C during a reply:"; pane | tail -5; }
say "/stats"
wait_prompts 3 || exit 1
generated=$(reply 2 | sed -n 's/^last turn: .*generated tokens: \([0-9]*\) (cancelled).*/\1/p')
[ -n "$generated" ] && [ "$generated" -lt 1343 ] && ok "/stats: the reply was cancelled after $generated tokens" ||
  bad "/stats after Ctrl-C: $(reply 2)"
say "/quit"
for _ in $(seq 100); do pane | grep -q CHAT-EXITED && break; sleep 0.1; done
pane | grep -q CHAT-EXITED && ok "the chat went on and /quit left" || bad "after Ctrl-C the chat did not /quit"

# Ctrl-C while a message prefills takes the message back: the session is put back (/stats: no turn, 0 tokens
# cached) and the chat goes on. A prefill of ~1700 tokens in one-token passes (--prefill-chunk 1: a stop point after
# each layer of each) takes seconds; Ctrl-C goes once its progress line shows. The pane's terminal is non-canonical
# (stty -icanon) so that a line may pass the 4095 bytes a canonical tty line holds; Ctrl-C still raises SIGINT.
sess=chat3
long=$(python3 -c "
import random
random.seed(1)
w = ['the', 'fox', 'river', 'stone', 'blue', 'quick', 'small', 'house', 'tree', 'sky']
print(' '.join(random.choice(w) for _ in range(1600)))")
tmux -L "$sock" new-session -d -s "$sess" -x 250 -y 60 \
  "cd '$root' && stty -icanon && '$plumb' chat --temperature 0 -n 1 --prefill-chunk 1; echo CHAT-EXITED; sleep 60"
wait_prompts 1 || exit 1
say "$long"
for _ in $(seq 300); do pane | grep -q 'prefill: [0-9]* / [0-9]* tokens' && break; sleep 0.1; done
tmux -L "$sock" send-keys -t "$sess" C-c
wait_prompts 2 || exit 1
pane | grep -q '^(message not sent: Ctrl-C stopped its prefill; the conversation is as it was)$' &&
  ok "Ctrl-C during the prefill took the message back" || { bad "Ctrl-C during a prefill:"; pane | tail -5; }
say "/stats"
wait_prompts 3 || exit 1
reply 2 | grep -q '^no turn yet; session: 0 tokens cached' && ok "/stats: no turn, nothing cached" ||
  bad "/stats after a stopped prefill: $(reply 2)"
say "Hello!"
wait_prompts 4 || exit 1
[ -n "$(reply 3)" ] && ok "the next message is answered: $(reply 3)" || bad "no reply after a stopped prefill"
# A /retry stopped in its prefill leaves its turn taken back; /undo then takes back the turn before it (the undo
# list's entry of the taken-back turn goes first), so /stats shows no turn and nothing cached. The long message is
# sent in full this time, then drawn again and stopped once the retry's own progress line shows.
# The long message in full at prompt N, then /retry, stopped by Ctrl-C once the K-th "(drawing the reply again)"
# has a live progress line after it (the retry's own prefill): the chat is back at prompt N + 2 after it.
long_then_stopped_retry() {
  say "$long"
  wait_prompts $(($1 + 1)) || exit 1
  say "/retry"
  for _ in $(seq 300); do
    pane | awk -v k="$2" '/^\(drawing the reply again\)$/ {d++} d == k && /prefill: [0-9]* \/ [0-9]* tokens/ {f = 1} END {exit !f}' && break
    sleep 0.1
  done
  tmux -L "$sock" send-keys -t "$sess" C-c
  wait_prompts $(($1 + 2)) || exit 1
}
long_then_stopped_retry 4 1
pane | grep -q '^(retry stopped: Ctrl-C during its prefill; the last turn stays taken back: /retry draws it again)$' &&
  ok "Ctrl-C during a /retry's prefill left the turn taken back" || { bad "Ctrl-C during a retry's prefill:"; pane | tail -5; }
say "/undo"
wait_prompts 7 || exit 1
say "/stats"
wait_prompts 8 || exit 1
[ "$(reply 6)" = "(took back the turn before the one taken back already; the conversation is as it was before it)" ] &&
  reply 7 | grep -q '^no turn yet; session: 0 tokens cached' && ok "/undo after it took back the turn before: no turn, nothing cached" ||
  bad "/undo after a stopped retry: $(reply 6) / $(reply 7)"
# A new message after such a stopped retry takes the taken-back turn's place: /undo then goes back to before it (one
# turn left), and again to before the first.
say "Hello!"
wait_prompts 9 || exit 1
long_then_stopped_retry 9 2
say "What is my name?"
wait_prompts 12 || exit 1
say "/undo"
wait_prompts 13 || exit 1
say "/stats"
wait_prompts 14 || exit 1
say "/undo"
wait_prompts 15 || exit 1
say "/stats"
wait_prompts 16 || exit 1
[ "$(pane | grep -c '^(retry stopped: Ctrl-C during its prefill; the last turn stays taken back: /retry draws it again)$')" = 2 ] &&
  [ "$(reply 12)" = "(took back the last turn; the conversation is as it was before it)" ] &&
  reply 13 | grep -q '^session: 1 turn, ' && reply 15 | grep -q '^no turn yet; session: 0 tokens cached' &&
  ok "a message after a stopped retry took its place: /undo twice went back one turn, then to none" ||
  bad "a message after a stopped retry: $(reply 12) / $(reply 13) / $(reply 15)"
say "/quit"
for _ in $(seq 100); do pane | grep -q CHAT-EXITED && break; sleep 0.1; done
pane | grep -q CHAT-EXITED && ok "/quit left" || bad "after a stopped prefill the chat did not /quit"

finish chat_tmux
