#!/usr/bin/env python3
"""Differential cases for minLength/maxLength and integer bounds, labelled by jsonschema (Draft 2020-12), for
tests/unit/test_schema_bounds_review.cpp (written by session 80's review):
  python3 tools/json_schema/make_bounds_cases.py > tests/data/json_schema/bounds_review.json
Writes {"schemas": [schema text, ...], "cases": [{"schema": i, "text": ..., "valid": bool}]}; schemas are kept as text
(exact big integers). Texts stay within the recognizer's documented bounds (compact, numbers <= 64 bytes, integers
without fraction/exponent, enum values in nlohmann's compact spelling)."""
import json, math, random, sys
from fractions import Fraction
import jsonschema

R = random.Random(int(sys.argv[1]) if len(sys.argv) > 1 else 2024)
V = jsonschema.Draft202012Validator

CHARS = ["a", "b", "Z", " ", "\"", "\\", "/", "\n", "\t", "\u0001", "\u00e9", "\u20ac", "\u4e2d", "\U0001F600", "\U00010348",
         "\ud83d", "\ude00", "\udbff", "\udc00"]  # (the last four: lone surrogates, only escaped)
ENUM_STRS = ["", "a", "ab", "abc", "abcd", "\u00e9", "\u00e9\u00e9", "\U0001F600", "\U0001F600x", "a\"b", "\n\n", "\u4e2d\u6587\u5b57",
             "caf\u00e9!", "\u0001"]

def spell_char(ch):
    o = ord(ch)
    if 0xD800 <= o <= 0xDFFF:
        h = "%04x" % o
        return "\\u" + (h.upper() if R.random() < 0.3 else h)
    opts = []
    if ch == "\"": return R.choice(["\\\"", "\\u0022"])
    if ch == "\\": return R.choice(["\\\\", "\\u005c", "\\u005C"])
    if o < 0x20:
        short = {"\n": "\\n", "\t": "\\t"}.get(ch)
        return R.choice([short, "\\u%04x" % o] if short else ["\\u%04x" % o])
    opts.append(ch)
    if ch == "/": opts.append("\\/")
    if o < 0x10000:
        opts.append("\\u%04x" % o)
    else:
        hi, lo = 0xD800 + ((o - 0x10000) >> 10), 0xDC00 + ((o - 0x10000) & 0x3FF)
        opts.append("\\u%04x\\u%04x" % (hi, lo))
        opts.append("\\u%04X\\u%04X" % (hi, lo))
    return R.choice(opts)

def spell_string(s):
    return "\"" + "".join(spell_char(c) for c in s) + "\""

def rand_string(n):
    s = "".join(R.choice(CHARS) for _ in range(n))
    return s

def str_schema():
    s = {"type": R.choice(["string", "string", ["string", "null"], ["string", "integer"]])}
    if R.random() < 0.75: s["minLength"] = R.randrange(0, 4)
    if R.random() < 0.75: s["maxLength"] = s.get("minLength", 0) + R.randrange(0, 4)
    if R.random() < 0.25:
        s["enum"] = R.sample(ENUM_STRS, R.randrange(1, 6)) + ([7] if R.random() < 0.3 else [])
        if not any(ok_len(s, e) for e in s["enum"] if isinstance(e, str)) and not (7 in s["enum"] and "integer" in s["type"]):
            s["enum"].append("a" * s.get("minLength", 0))
    return s

def ok_len(s, e):
    return s.get("minLength", 0) <= len(e) <= s.get("maxLength", 10**9)

BOUND_POOL = [0, 1, -1, 2, 3, 5, -5, 9, 10, 11, 99, 100, -99, -100, 0.5, -0.5, 2.5, -2.5, 9.99, -9.99, 1e2, -1e2, 0.0, -0.0,
              1e20, -1e20, 2**53 + 1, -(2**53 + 1), 2**63 - 1, 2**63, 2**64 - 1, -(2**63), -(2**63) + 1, 1.5e19, -1.5e18,
              9007199254740993.0, 1e15 + 0.5, 123456789012, 1e63, -1e62]

def int_range(s):
    lo, hi = None, None
    def up(v): return math.ceil(Fraction(v))
    def dn(v): return math.floor(Fraction(v))
    if "minimum" in s: lo = up(s["minimum"])
    if "exclusiveMinimum" in s:
        b = dn(s["exclusiveMinimum"]) + 1
        lo = b if lo is None else max(lo, b)
    if "maximum" in s: hi = dn(s["maximum"])
    if "exclusiveMaximum" in s:
        b = up(s["exclusiveMaximum"]) - 1
        hi = b if hi is None else min(hi, b)
    return lo, hi

def fits64(v): return len(str(v)) <= 64

def int_schema():
    while True:
        s = {"type": R.choice(["integer", "integer", "integer", ["integer", "null"], ["integer", "string"]])}
        keys = [k for k in ["minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"] if R.random() < 0.45]
        for k in keys:
            s[k] = R.choice(BOUND_POOL)
        # a close pair now and then: tight ranges around a pivot
        if R.random() < 0.3:
            p = R.choice([0, 7, -7, 10, -10, 2**63, -(2**63), 1e20])
            s[R.choice(["minimum", "exclusiveMinimum"])] = p + R.choice([0, -1, 0.5, -0.5]) if not isinstance(p, float) else p
            s[R.choice(["maximum", "exclusiveMaximum"])] = (p + R.choice([0, 1, 2, 1.5])) if not isinstance(p, float) else p * 1.0000001
        if any(isinstance(s[k], int) and not (-(2**63) <= s[k] < 2**64) for k in s if k != "type"): continue
        # (a float bound past 2^53 is refused by plumb: a literal nlohmann would round)
        if any(isinstance(s[k], float) and abs(s[k]) >= 2**53 for k in s if k != "type"): continue
        lo, hi = int_range(s)
        if lo is not None and hi is not None and lo > hi: continue
        if lo is not None and not fits64(lo) and lo > 0: continue
        if hi is not None and not fits64(hi) and hi < 0: continue
        if R.random() < 0.2:
            vals = list({R.choice([0, 1, -1, 5, 10, 100, -100, 2**63, 12]) for _ in range(4)})
            inb = [v for v in vals if (lo is None or v >= lo) and (hi is None or v <= hi)]
            if not inb:
                fb = lo if lo is not None else (hi if hi is not None else 0)
                if abs(fb) < 2**53: vals.append(fb)
                else: vals = None
            if vals: s["enum"] = vals
        return s

def int_texts(s):
    lo, hi = int_range(s)
    vals = {0, 1, -1, 7, -7, 10, 100, -100, 2**63, -(2**63), 2**64, 10**20, -(10**20), 2**53 + 1}
    for b in (lo, hi):
        if b is not None:
            for d in (-2, -1, 0, 1, 2): vals.add(b + d)
            vals.add(b * 10); vals.add(b // 10)
    if lo is not None and hi is not None and hi - lo < 10**6:
        for _ in range(3): vals.add(R.randint(lo, hi))
    out = [str(v) for v in vals if len(str(v)) <= 64]
    out.append("-0")
    return out

def holder(inner):
    k = R.randrange(3)
    if k == 0:
        return {"type": "object", "properties": {"v": inner}, "required": ["v"], "additionalProperties": False}, lambda t: "{\"v\":" + t + "}"
    if k == 1:
        return ({"type": "object", "properties": {"v": {"type": "array", "items": inner, "maxItems": 3}}, "required": ["v"],
                 "additionalProperties": False}, lambda t: "{\"v\":[" + t + "]}")
    return {"type": "object", "properties": {"v": inner, "w": {"type": "boolean"}}}, lambda t: "{\"v\":" + t + ",\"w\":true}"

schemas, cases = [], []

def add_schema(schema, texts):
    i = len(schemas)
    schemas.append(json.dumps(schema, ensure_ascii=False))
    v = V(schema)
    has_enum = "enum" in json.dumps(schema)
    seen = set()
    for t in texts:
        if t in seen: continue
        seen.add(t)
        try:
            inst = json.loads(t)
        except ValueError:
            valid = False
        else:
            valid = v.is_valid(inst)
            # (enum values are matched in nlohmann's compact spelling only: other spellings of a value are outside)
            if valid and has_enum and json.dumps(inst, ensure_ascii=False, separators=(",", ":")) != t: continue
        cases.append([i, t, valid])

def string_candidates(s):
    out = []
    for _ in range(9):
        n = R.randrange(0, 7)
        out.append(spell_string(rand_string(n)))
    for e in s.get("enum", []):
        if isinstance(e, str): out.append(json.dumps(e, ensure_ascii=False))
    for e in ENUM_STRS[:6]: out.append(json.dumps(e, ensure_ascii=False))
    # pairs and lone halves around the bounds
    for pre in range(0, 4):
        base = "x" * pre
        out.append("\"" + base + "\\ud83d\\ude00\"")
        out.append("\"" + base + "\\ud83d\"")
        out.append("\"" + base + "\\ud83d\\ud83d\\ude00\"")
        out.append("\"" + base + "\\ude00\\ud83d\"")
        out.append("\"" + base + "\\ud83dz\"")
        out.append("\"" + base + "\\ud83d\\n\"")
    return out

for _ in range(45):
    s = str_schema()
    sch, wrap = holder(s)
    texts = [wrap(t) for t in string_candidates(s)]
    if "integer" in s["type"]: texts += [wrap(t) for t in ["7", "0", "-1"]]
    if "null" in s["type"]: texts.append(wrap("null"))
    add_schema(sch, texts)

for _ in range(45):
    s = int_schema()
    sch, wrap = holder(s)
    texts = [wrap(t) for t in int_texts(s)]
    if "string" in s["type"]: texts += [wrap("\"ab\""), wrap("\"\"")]
    add_schema(sch, texts)

# unions: anyOf of two string / integer schemas (alternatives in parallel, merged where equal)
for _ in range(45):
    a = R.choice([str_schema, int_schema])()
    b = R.choice([str_schema, int_schema])()
    for x in (a, b):  # (keep the branches to one type each: simpler to reason about)
        x["type"] = "string" if "string" in (x["type"] if isinstance(x["type"], list) else [x["type"]]) and ("minLength" in x or "maxLength" in x or "enum" in x and all(isinstance(e, str) for e in x["enum"])) else x["type"]
    inner = {"anyOf": [a, b]}
    sch, wrap = holder(inner)
    texts = []
    for x in (a, b):
        texts += int_texts(x) if "minimum" in x or "maximum" in x or "exclusiveMinimum" in x or "exclusiveMaximum" in x or x["type"] in ("integer", ["integer", "null"], ["integer", "string"]) else []
        texts += string_candidates(x) if "string" in (x["type"] if isinstance(x["type"], list) else [x["type"]]) else []
    add_schema(sch, [wrap(t) for t in texts])

sys.stdout.write('{"schemas": [\n' + ",\n".join(json.dumps(s) for s in schemas) + '],\n"cases": [\n' +
                 ",\n".join(json.dumps(c) for c in cases) + "]}\n")
n_valid = sum(c[2] for c in cases)
print(f"{len(schemas)} schemas, {len(cases)} cases, {n_valid} valid", file=sys.stderr)
