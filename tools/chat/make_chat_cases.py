#!/usr/bin/env python3
"""Renders tools/chat/chat_inputs.json with DeepSeek's own chat encoder (the model repository's
encoding/encoding_dsv4.py, given by path: run it, it is not part of plumb) into tests/data/chat/cases.json, the
expected prompts and parsed replies that tests/unit/test_chat.cpp compares plumb's encode_chat and parse_reply with.

A request's top-level tools go on the first system message, or on an empty system message put first (plumb's rule,
include/plumb/text.h ChatOptions::tools; the encoder itself reads tools from a message).

Usage: tools/chat/make_chat_cases.py PATH/TO/encoding_dsv4.py [tools/chat/chat_inputs.json] [tests/data/chat/cases.json]
"""
import copy
import importlib.util
import json
import sys

enc_path = sys.argv[1]
inputs = sys.argv[2] if len(sys.argv) > 2 else "tools/chat/chat_inputs.json"
output = sys.argv[3] if len(sys.argv) > 3 else "tests/data/chat/cases.json"
spec = importlib.util.spec_from_file_location("encoding_dsv4", enc_path)
enc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(enc)

data = json.load(open(inputs, encoding="utf-8"))
out = {"source": "tools/chat/make_chat_cases.py over tools/chat/chat_inputs.json", "cases": [], "replies": []}
for c in data["cases"]:
    msgs = copy.deepcopy(c["messages"])
    if c.get("tools"):
        target = next((m for m in msgs if m["role"] == "system"), None)
        if target is None:
            target = {"role": "system", "content": ""}
            msgs.insert(0, target)
        target["tools"] = c["tools"]
    prompt = enc.encode_messages(msgs, thinking_mode="thinking" if c["thinking"] else "chat",
                                 drop_thinking=c.get("drop_thinking", True), reasoning_effort=c.get("reasoning_effort"))
    out["cases"].append({**c, "prompt": prompt})
for r in data["replies"]:
    parsed = enc.parse_message_from_completion_text(r["text"] + enc.eos_token,
                                                    thinking_mode="thinking" if r["thinking"] else "chat")
    calls = [{"name": t["function"]["name"], "arguments": json.loads(t["function"]["arguments"])} for t in parsed["tool_calls"]]
    out["replies"].append({**r, "content": parsed["content"], "reasoning_content": parsed["reasoning_content"],
                           "tool_calls": calls})
with open(output, "w", encoding="utf-8") as f:
    json.dump(out, f, ensure_ascii=False, indent=1)
    f.write("\n")
print(f"{output}: {len(out['cases'])} prompts, {len(out['replies'])} replies")
