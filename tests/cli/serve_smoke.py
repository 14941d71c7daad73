#!/usr/bin/env python3
"""`plumb serve` as a process on the bundled model: it prints its address (port 0: a free one), answers the
OpenAI endpoints with the official Python client's shapes (urllib here: no packages needed), a seeded request gives
`plumb run`'s text with --no-prefix-cache, --parallel 4 gives four requests at once what one at a time gives (with patches: complete replies),
SIGTERM and SIGINT stop it with status 0 and a summary line, and its usage errors are one "error:" line with status 2.

Usage: tests/cli/serve_smoke.py PLUMB_BINARY   (run from the repository root: the default model is models/tiny)
PLUMB_SERVE_ARGS: more options for every run and serve ("--backend cuda --patches cuda.fast" on the GPU machine:
bench/gpu_forward.sh SERVE=1).
"""
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

plumb = sys.argv[1] if len(sys.argv) > 1 else "build/plumb"
extra = shlex.split(os.environ.get("PLUMB_SERVE_ARGS", ""))
passes = fails = 0


def check(cond, msg):
    global passes, fails
    print(("ok   " if cond else "FAIL ") + msg)
    if cond:
        passes += 1
    else:
        fails += 1


def start(*args):
    """plumb serve on a free port; returns (process, port) once it listens (its stderr names the port)."""
    p = subprocess.Popen([plumb, "serve", "--port", "0", "-q", *extra, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         text=True)
    deadline = time.time() + 60
    while time.time() < deadline:
        line = p.stderr.readline()
        if not line:
            break
        m = re.search(r"^plumb serve: .* on http://127\.0\.0\.1:(\d+) \(", line)
        if m:  # (the ready line: after the load)
            return p, int(m.group(1))
    p.kill()
    raise SystemExit("FAIL plumb serve printed no address: " + p.stderr.read())


def request(port, path, body=None, key=None):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method="POST" if body is not None else "GET",
                                 data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Content-Type": "application/json"})
    if key:
        req.add_header("Authorization", "Bearer " + key)
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, r.headers.get("Content-Type", ""), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type", ""), e.read().decode()


def stop(p, sig):
    p.send_signal(sig)
    try:
        rc = p.wait(timeout=30)
    except subprocess.TimeoutExpired:
        p.kill()
        return -1, ""
    return rc, p.stderr.read()


# --- a seeded completion is plumb run's text (no prefix cache: the prompt prefilled in one call, as run does) ---
run = subprocess.run([plumb, "run", "-q", *extra, "-p", "Once upon a time", "--seed", "7", "-n", "30"], capture_output=True,
                     text=True)
p, port = start("--no-prefix-cache", "--seed", "7")
status, ctype, body = request(port, "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 30})
check(status == 200 and ctype.startswith("application/json"), f"POST /v1/completions: {status} {ctype}")
text = json.loads(body)["choices"][0]["text"] if status == 200 else ""
check(text == run.stdout.rstrip("\n") or text + "\n" == run.stdout, f"the server's text is plumb run's for --seed 7: {text[:60]!r}")
status, _, body = request(port, "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 10, "temperature": 0,
                                                   "logprobs": 2})
greedy = json.loads(body)["choices"][0] if status == 200 else {}
lp = greedy.get("logprobs") or {}
check(status == 200 and "".join(lp.get("tokens", [])) == greedy["text"] and
      all(-50 < v <= 0 and v == max(t.values()) for v, t in zip(lp["token_logprobs"], lp["top_logprobs"])),
      f"logprobs: greedy's tokens the most likely, their texts the reply: {lp.get('token_logprobs', [])[:3]}")
# A prompt scored as lm-evaluation-harness's loglikelihood requests ask (token ids, echo, one generated token): an entry
# per prompt token (the first null) and one for the generated token, greedy's the most likely.
ids = [int(x) for x in subprocess.run([plumb, "tokenize", "-t", "models/tiny/tokenizer.json"], input="Once upon a time the",
                                      capture_output=True, text=True).stdout.split()]
status, _, body = request(port, "/v1/completions", {"prompt": [ids], "max_tokens": 1, "temperature": 0, "logprobs": 1,
                                                   "echo": True})
lp = json.loads(body)["choices"][0]["logprobs"] if status == 200 else {}
values = lp.get("token_logprobs", [])
check(status == 200 and len(values) == len(ids) + 1 and values[0] is None and lp["top_logprobs"][0] is None and
      all(v is not None and -50 < v <= 0 for v in values[1:]) and values[-1] == max(lp["top_logprobs"][-1].values()),
      f"echo with logprobs scores the {len(ids)} prompt tokens, then the generated one: {values[:3]}")
status, _, body = request(port, "/v1/completions", {"prompt": ["Once upon a time", "The sea"], "n": 2, "max_tokens": 5})
choices = json.loads(body)["choices"] if status == 200 else []
check([c["index"] for c in choices] == [0, 1, 2, 3] and all(c["text"] for c in choices),
      f"two prompts, n 2: {len(choices)} choices in order")
tools = [{"type": "function", "function": {"name": "now", "description": "The time.", "parameters": {"type": "object", "properties": {}}}}]
call = {"id": "c1", "type": "function", "function": {"name": "now", "arguments": "{}"}}
status, _, body = request(port, "/v1/chat/completions", {"tools": tools, "max_tokens": 8, "messages": [
    {"role": "user", "content": "Time?"}, {"role": "assistant", "content": None, "tool_calls": [call]},
    {"role": "tool", "tool_call_id": "c1", "content": "12:00"}]})
msg = json.loads(body)["choices"][0]["message"] if status == 200 else {}
check(status == 200 and (isinstance(msg.get("content"), str) or msg.get("tool_calls")),
      f"a chat with tools and a tool's result: {status} {str(msg)[:60]}")
# tool_choice "required": the reply is the whole call block (a tool without parameters: its call is fixed text);
# parallel_tool_calls false, as the bundled model, never trained on calls, would go on calling.
closed = [{"type": "function", "function": {"name": "now", "description": "The time.",
                                            "parameters": {"type": "object", "properties": {}, "additionalProperties": False}}}]
status, _, body = request(port, "/v1/chat/completions", {"tools": closed, "tool_choice": "required", "max_tokens": 200,
                                                        "parallel_tool_calls": False,
                                                        "messages": [{"role": "user", "content": "Time?"}]})
choice = json.loads(body)["choices"][0] if status == 200 else {}
calls = choice.get("message", {}).get("tool_calls") or []
check(status == 200 and choice.get("finish_reason") == "tool_calls" and len(calls) == 1 and
      calls[0]["function"]["name"] == "now" and json.loads(calls[0]["function"]["arguments"]) == {},
      f"tool_choice required: the reply is a call of the tool: {status} {str(choice.get('message'))[:90]!r}")
status, _, body = request(port, "/v1/chat/completions", {"messages": [{"role": "user", "content": "A cat, as JSON."}],
                                                        "response_format": {"type": "json_object"}, "max_tokens": 16})
text = json.loads(body)["choices"][0]["message"]["content"] if status == 200 else ""
check(status == 200 and text.lstrip(" \n").startswith("{") and "<｜" not in text,
      f"JSON mode (response_format json_object): {text[:60]!r}")
schema = {"type": "object", "required": ["color"], "additionalProperties": False,
          "properties": {"color": {"enum": ["blue", "red"]}}}
status, _, body = request(port, "/v1/chat/completions", {
    "messages": [{"role": "user", "content": "What color is the sky? As JSON."}], "temperature": 0, "max_tokens": 30,
    "response_format": {"type": "json_schema", "json_schema": {"name": "sky", "schema": schema}}})
text = json.loads(body)["choices"][0]["message"]["content"] if status == 200 else ""
try:
    value = json.loads(text)
except ValueError:
    value = None
check(isinstance(value, dict) and list(value) == ["color"] and value["color"] in ("blue", "red"),
      f"structured output (response_format json_schema): {text[:60]!r}")
status, _, body = request(port, "/v1/models")
check(status == 200 and json.loads(body)["data"][0]["id"] == "tiny", f"GET /v1/models names the folder: {body[:80]}")
status, _, body = request(port, "/v1/chat/completions",
                          {"messages": [{"role": "user", "content": "Hi"}], "stream": True, "max_tokens": 8})
events = [l[6:] for l in body.split("\n\n") if l.startswith("data: ")]
check(status == 200 and events[-1] == "[DONE]" and json.loads(events[0])["choices"][0]["delta"]["role"] == "assistant",
      f"a chat stream: {len(events)} events, the last [DONE]")
status, _, body = request(port, "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "top_p": 7})
check(status == 400 and "top_p" in json.loads(body)["error"]["message"], f"a bad field is a 400 naming it: {body[:100]}")
turns = [{"role": "user", "content": "What is a lighthouse?"}]
status, _, body = request(port, "/v1/chat/completions", {"messages": turns, "temperature": 0, "max_tokens": 12})
turns += [{"role": "assistant", "content": json.loads(body)["choices"][0]["message"]["content"]},
          {"role": "user", "content": "And a harbour?"}]
_, _, uncached = request(port, "/v1/chat/completions", {"messages": turns, "temperature": 0, "max_tokens": 12})
rc, err = stop(p, signal.SIGTERM)
check(rc == 0, f"SIGTERM: exit status {rc}")
check(re.search(r"^plumb serve: 11 requests answered, \d+ generated tokens, 0 prompt tokens from the cache, 0 cancelled$", err,
                re.M) is not None, "the closing summary: " + err.strip().splitlines()[-1] if err.strip() else "no summary")

# --- the prefix cache: the second turn fed from the first's session, the same reply as on an empty cache ---
p, port = start()
request(port, "/v1/chat/completions", {"messages": turns[:1], "temperature": 0, "max_tokens": 12})
status, _, body = request(port, "/v1/chat/completions", {"messages": turns, "temperature": 0, "max_tokens": 12})
cached = json.loads(body)
check(cached["usage"]["prompt_tokens_details"]["cached_tokens"] > 0 and
      cached["choices"][0]["message"] == json.loads(uncached)["choices"][0]["message"],
      f"prefix cache: {cached['usage']['prompt_tokens_details']['cached_tokens']} of {cached['usage']['prompt_tokens']} "
      f"prompt tokens cached, the reply as on an empty cache: {cached['choices'][0]['message']['content'][:50]!r}")
stop(p, signal.SIGTERM)

# --- --parallel 4: four seeded requests at once get what one generation at a time gives; their steps ran batched ---
bodies = [{"prompt": pr, "max_tokens": 40 + 10 * i, "ignore_eos": True, "seed": 20 + i}
          for i, pr in enumerate(["Once upon a time", "The sea", "A lighthouse", "Zebras"])]
p, port = start("--no-prefix-cache")
one_at_a_time = [request(port, "/v1/completions", b)[2] for b in bodies]
stop(p, signal.SIGTERM)
p, port = start("--no-prefix-cache", "--parallel", "4")
import threading
together = [None] * len(bodies)
threads = [threading.Thread(target=lambda i=i: together.__setitem__(i, request(port, "/v1/completions", bodies[i])[2]))
           for i in range(len(bodies))]
for t in threads:
    t.start()
for t in threads:
    t.join()
rc, err = stop(p, signal.SIGTERM)
texts = lambda rs: [json.loads(r)["choices"][0]["text"] if r else None for r in rs]
# With patches (the GPU machine's cuda.fast) a batch's rows take the batched kernels and a single step the one-token
# ones, whose fp32 sums run in other orders (the logits within the fast kernels' tolerance: GpuTest.ForwardBatch*), so
# a seeded draw may land on another token and the texts part from there: each reply is then checked whole (every
# requested token generated), and how many equal one at a time is printed.
same = sum(a == b for a, b in zip(texts(together), texts(one_at_a_time)))
if "--patches" in extra:
    full = [r is not None and json.loads(r)["usage"]["completion_tokens"] == b["max_tokens"] for r, b in zip(together, bodies)]
    check(all(full), f"--parallel 4 (with patches): every reply complete ({sum(full)} of 4); {same} of 4 as one at a time")
else:
    check(same == len(bodies), f"--parallel 4: each reply as one at a time: {[t[:20] for t in texts(together) if t]}")
m = re.search(r"; (\d+) batched decode steps of ([\d.]+) sessions on average \(at most (\d+)\), (\d+) of their (\d+) rows "
              r"sampled in the step$", err, re.M)
# (no request asks for logprobs: every batched row is drawn in the step, on the GPU there)
check(m is not None and int(m.group(3)) >= 2 and m.group(4) == m.group(5), "--parallel 4: the summary counts batched steps and "
      "their rows sampled in the step: " + (err.strip().splitlines()[-1] if err.strip() else "no summary"))

# --- an API key; SIGINT ---
p, port = start("--api-key", "k1", "--model-id", "my-model")
check(request(port, "/v1/models")[0] == 401, "no key: 401")
status, _, body = request(port, "/v1/models", key="k1")
check(status == 200 and json.loads(body)["data"][0]["id"] == "my-model", "the key and --model-id: " + body[:80])
check(request(port, "/health")[0] == 200, "/health needs no key")
rc, err = stop(p, signal.SIGINT)
check(rc == 0 and "SIGINT, stopping" in err, f"SIGINT: exit status {rc}")

# --- usage errors: one line, status 2, before any load ---
busy = socket.socket()
busy.bind(("127.0.0.1", 0))
busy.listen(1)
used = busy.getsockname()[1]
for args, want in [(["--port", "70000"], "--port"),
                   (["--port", str(used)], f"cannot listen on 127.0.0.1:{used}"),
                   (["--temperature", "-1"], "temperature"),
                   (["-m", "/nonexistent"], "model folder /nonexistent does not exist"),
                   (["--max-queue", "-2"], "--max-queue"),
                   (["--parallel", "0"], "--parallel")]:
    r = subprocess.run([plumb, "serve", "-q", *extra, *args], capture_output=True, text=True, timeout=60)
    lines = r.stderr.strip().splitlines()
    check(r.returncode == 2 and len(lines) == 1 and lines[0].startswith("error:") and want in lines[0],
          f"serve {' '.join(args)}: status {r.returncode}, {r.stderr.strip()[:120]}")
busy.close()

print(f"serve_smoke: {passes} passed, {fails} failed")
sys.exit(1 if fails else 0)
