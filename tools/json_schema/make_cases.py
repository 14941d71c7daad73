#!/usr/bin/env python3
"""Cases for plumb's structured outputs (src/generate/json_schema.cpp), labelled by an independent validator.

Random schemas in the subset plumb supports (type and type arrays, properties, required, additionalProperties,
items, minItems / maxItems, minLength / maxLength, integer minimum / maximum (and exclusive), enum / const of scalars, anyOf / oneOf, $ref to $defs), instances
made valid by construction, and mutations of them (a value of another type, a required key dropped, an unknown key,
too many or too few items, a fraction where an integer goes, a value outside an enum, a string too long or short, an
integer moved out of its bounds), each written compactly as JSON (nlohmann's
form: no spaces, keys as the schema spells them) and labelled valid or not by Python's `jsonschema` (Draft 2020-12).
tests/unit/test_json_schema.cpp checks that the recognizer accepts every valid text whole and no invalid one.

Usage: python3 tools/json_schema/make_cases.py > tests/data/json_schema/cases.json  (needs jsonschema: pip or
Debian's python3-jsonschema)
"""
import copy
import json
import math
import random
import sys

import jsonschema

R = random.Random(79)
STRINGS = ["", "Ben", "a \"quoted\" word", "line\nbreak", "caf\u00e9 \u2615", "\\", "\U0001F600\U0001F600", "ab", "x",
           "\u4e2d\u6587\u5b57"]
WORDS = ["name", "age", "tags", "ok", "score", "kind", "items", "note", "id", "we\"ird", "caf\u00e9"]


def scalar_schema(depth):
    k = R.randrange(9)
    if k == 0:
        s = {"type": "string"}
        if R.random() < 0.7:
            s["minLength"] = R.randrange(0, 4)
        if R.random() < 0.7:
            s["maxLength"] = s.get("minLength", 0) + R.randrange(0, 5)
        return s
    if k == 1:
        s = {"type": "integer"}
        if R.random() < 0.8:
            lo = R.choice([-10, 0, 5, 0.5, -2.5])
            s["exclusiveMinimum" if R.random() < 0.3 else "minimum"] = lo
            if R.random() < 0.6:
                s["exclusiveMaximum" if R.random() < 0.3 else "maximum"] = lo + R.choice([2, 10, 50, 1e6])
        return s
    if k == 2:
        return {"type": "number"}
    if k == 3:
        return {"type": "boolean"}
    if k == 4:
        return {"type": ["string", "null"]}
    if k == 5:
        return {"enum": R.sample(["red", "green", "blue", 1, 2, 10, True, None, "r"], R.randrange(1, 4))}
    if k == 6:
        return {"const": R.choice(["x", 7, False, None])}
    if k == 7:
        return {"anyOf": [scalar_schema(depth), {"type": "null"}]}
    return {}


def schema(depth=0):
    k = R.randrange(10)
    if depth < 3 and k < 3:
        return object_schema(depth + 1)
    if depth < 3 and k < 5:
        s = {"type": "array", "items": schema(depth + 1)}
        if R.random() < 0.5:
            s["minItems"] = R.randrange(0, 3)
        if R.random() < 0.5:
            s["maxItems"] = s.get("minItems", 0) + R.randrange(0, 3)
        return s
    if depth < 3 and k == 5:
        return {"anyOf": [object_schema(depth + 1), scalar_schema(depth)]}
    return scalar_schema(depth)


def object_schema(depth):
    props = {}
    for w in R.sample(WORDS, R.randrange(0, 5)):
        props[w] = schema(depth)
    s = {"type": "object", "properties": props}
    if props and R.random() < 0.7:
        s["required"] = R.sample(sorted(props), R.randrange(1, len(props) + 1))
    a = R.random()
    if a < 0.4:
        s["additionalProperties"] = False
    elif a < 0.55:
        s["additionalProperties"] = scalar_schema(depth)
    return s


def int_ok(s, v):
    return (v >= s.get("minimum", -math.inf) and v > s.get("exclusiveMinimum", -math.inf) and
            v <= s.get("maximum", math.inf) and v < s.get("exclusiveMaximum", math.inf))


def resolve(s, root):
    while "$ref" in s:
        s = root["$defs"][s["$ref"].split("/")[-1]]
    return s


def instance(s, root, depth=0):
    s = resolve(s, root)
    if "anyOf" in s:
        return instance(R.choice(s["anyOf"]), root, depth)
    if "enum" in s:
        return R.choice(s["enum"])
    if "const" in s:
        return s["const"]
    t = s.get("type")
    if isinstance(t, list):
        t = R.choice(t)
    if t is None:
        t = R.choice(["string", "integer", "boolean", "null"])
    if t == "object":
        out = {}
        props = s.get("properties", {})
        for k in props:
            if k in s.get("required", []) or R.random() < 0.5:
                out[k] = instance(props[k], root, depth + 1)
        extra = s.get("additionalProperties", True)
        if extra is not False and R.random() < 0.3:
            out["x_extra"] = instance(extra if isinstance(extra, dict) else {}, root, depth + 1)
        keys = list(out)
        R.shuffle(keys)
        return {k: out[k] for k in keys}
    if t == "array":
        lo, hi = s.get("minItems", 0), s.get("maxItems", s.get("minItems", 0) + 3)
        return [instance(s.get("items", {}), root, depth + 1) for _ in range(R.randint(lo, hi))]
    if t == "string":
        lo, hi = s.get("minLength", 0), s.get("maxLength", 1000)
        fits = [w for w in STRINGS if lo <= len(w) <= hi]
        return R.choice(fits) if fits else "\u00e9" * lo
    if t == "integer":
        fits = [v for v in [0, -3, 42, 1000000, 1, 7, -10, 5, 12, 55] if int_ok(s, v)]
        return R.choice(fits) if fits else int(math.ceil(s.get("minimum", s.get("exclusiveMinimum", 0) + 0.5)))
    if t == "number":
        return R.choice([0, 1.5, -0.25, 7, 3.0e-5])
    if t == "boolean":
        return R.choice([True, False])
    return None


def mutate(v):
    """A copy of v with one change somewhere inside it."""
    v = copy.deepcopy(v)
    spots = []

    def walk(x, parent, key):
        spots.append((parent, key, x))
        if isinstance(x, dict):
            for k in list(x):
                walk(x[k], x, k)
        elif isinstance(x, list):
            for i in range(len(x)):
                walk(x[i], x, i)

    walk(v, None, None)
    scalars = [sp for sp in spots if sp[0] is not None and isinstance(sp[2], (str, int)) and not isinstance(sp[2], bool)]
    parent, key, x = R.choice(scalars if scalars and R.random() < 0.4 else spots)
    k = R.randrange(6)
    if isinstance(x, dict) and k < 2:
        if x and k == 0:
            del x[R.choice(list(x))]
        else:
            x["zz_unknown"] = 1
        return v
    if isinstance(x, list) and k < 2:
        if x and k == 0:
            x.pop()
        else:
            x.append(x[0] if x else 5)
        return v
    if parent is None:
        return {"wrapped": v}
    if isinstance(x, int) and not isinstance(x, bool) and k < 3:  # (an integer moved: minimum / maximum)
        parent[key] = x + R.choice([1, -1, 1000, -1000])
        return v
    if isinstance(x, str) and k < 3:  # (a string made longer or shorter: minLength / maxLength)
        parent[key] = x + "\u00e9zz\U0001F600" if k < 2 or not x else x[:-1]
        return v
    parent[key] = R.choice(["str", 2.5, -1, True, None, [], {}, "blue", 10, "", "a much longer text", "\U0001F600" * 5])
    return v


def text(v):
    return json.dumps(v, separators=(",", ":"), ensure_ascii=False)


def main():
    schemas, cases = [], []
    for _ in range(100):
        root = object_schema(0)
        if R.random() < 0.3:  # one property through $ref (recursive when the def holds itself)
            root["$defs"] = {"Node": {"type": "object", "properties": {"v": {"type": "integer"},
                                                                         "next": {"anyOf": [{"$ref": "#/$defs/Node"}, {"type": "null"}]}},
                                      "required": ["v"], "additionalProperties": False}}
            root.setdefault("properties", {})["node"] = {"$ref": "#/$defs/Node"}
        if R.random() < 0.2:
            root.setdefault("title", "T")
            root.setdefault("description", "a schema")
        validator = jsonschema.Draft202012Validator(root)
        schemas.append(root)
        seen = set()
        for _ in range(6):
            v = instance(root, root)
            for candidate in (v, mutate(v), mutate(v)):
                t = text(candidate)
                if t in seen or not isinstance(candidate, dict):
                    continue
                seen.add(t)
                cases.append({"schema": len(schemas) - 1, "text": t, "valid": validator.is_valid(candidate)})
    json.dump({"generator": "tools/json_schema/make_cases.py (seed 79), labelled by jsonschema " +
               __import__("importlib.metadata").metadata.version("jsonschema") + " Draft 2020-12",
               "schemas": schemas, "cases": cases}, sys.stdout, ensure_ascii=False, separators=(",", ":"))
    print(f"{len(cases)} cases, {sum(c['valid'] for c in cases)} valid", file=sys.stderr)


if __name__ == "__main__":
    main()
