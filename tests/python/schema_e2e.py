#!/usr/bin/env python3
"""Structured output end to end: N random JSON schemas (nested objects and
arrays, enums, required and optional members, string lengths, patterns,
formats, integer bounds, array lengths, anyOf with null) sent to `quern serve`
as response_format json_schema through the official `openai` client; every
reply must finish ("stop") and be JSON that the schema accepts, checked by the
`jsonschema` package (Draft 2020-12, formats asserted).

Usage: schema_e2e.py --quern build/quern [--model FILE] [--count 200] [--seed S]
Prints the seed, failures with their schema and reply, and a summary line
("schema_e2e: N/N valid"); exits 1 unless every reply is valid.
"""
import argparse
import concurrent.futures as cf
import json
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from server_e2e import Server  # noqa: E402

import jsonschema  # noqa: E402
import openai  # noqa: E402

PATTERNS = [r"^[A-Z]{3}-\d{4}$", r"^(red|green|blue)(-(light|dark))?$", r"^\d{3}-\d{3}-\d{4}$",
            r"^[a-z]{2,8}(_[a-z]{2,8}){0,2}$", r"^#[0-9a-fA-F]{6}$", r"^v\d{1,2}\.\d{1,2}\.\d{1,3}$"]
FORMATS = ["date", "date-time", "time", "uuid", "email", "ipv4", "hostname", "uri"]
WORDS = ["name", "city", "id", "score", "tags", "kind", "owner", "items", "color", "when", "size", "notes",
         "level", "email", "version", "active"]


def random_schema(rng, depth=0):
    """A schema whose every instance is bounded (so a reply always fits)."""
    k = rng.randrange(9 if depth < 2 else 7)
    if k == 0:
        return {"type": "string", "maxLength": rng.randint(1, 24), **({"minLength": 1} if rng.random() < 0.5 else {})}
    if k == 1:
        return {"type": "string", "pattern": rng.choice(PATTERNS)}
    if k == 2:
        return {"type": "string", "format": rng.choice(FORMATS)}
    if k == 3:
        lo = rng.randint(-1000, 1000)
        return {"type": "integer", "minimum": lo, "maximum": lo + rng.choice([0, 9, 99, 12345])}
    if k == 4:
        return rng.choice([{"type": "boolean"}, {"type": "number", "minimum": 0}, {"type": "integer"}])
    if k == 5:
        return {"enum": rng.sample(["alpha", "beta", "gamma", 1, 2.5, None, True, "a b"], rng.randint(1, 4))}
    if k == 6:
        return {"anyOf": [random_schema(rng, depth + 1), {"type": "null"}]}
    if k == 7:  # items are never arrays themselves: a reply stays within max_tokens even where the model rambles
        lo = rng.randint(0, 2)
        items = random_schema(rng, depth + 1)
        while items.get("type") == "array":
            items = random_schema(rng, depth + 1)
        return {"type": "array", "items": items, "minItems": lo, "maxItems": lo + rng.randint(0, 2)}
    props, req = {}, []
    for name in rng.sample(WORDS, rng.randint(1, 4)):
        props[name] = random_schema(rng, depth + 1)
        if rng.random() < 0.6:
            req.append(name)
    return {"type": "object", "properties": props, "required": req, "additionalProperties": False}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quern", required=True)
    ap.add_argument("--model")
    ap.add_argument("--count", type=int, default=200)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--parallel", type=int, default=8)
    a = ap.parse_args()
    seed = a.seed if a.seed is not None else random.randrange(1 << 30)
    print(f"schema_e2e: seed {seed}, {a.count} schemas")
    rng = random.Random(seed)
    schemas = []
    for _ in range(a.count):
        s = random_schema(rng)
        if s.get("type") != "object":  # a reply is an object, as clients send them
            s = {"type": "object", "properties": {"value": s}, "required": ["value"], "additionalProperties": False}
        schemas.append(s)
    srv = Server(a.quern, ["--parallel", str(a.parallel), "-q", "-c", "8192"], a.model)
    checker = jsonschema.Draft202012Validator.FORMAT_CHECKER
    for f in FORMATS:  # the checks must run, not pass for want of a package
        if f not in checker.checkers:
            sys.exit(f"schema_e2e: jsonschema cannot check the format {f!r} here (pip install 'jsonschema[format-nongpl]')")
    failures = []
    tokens = 0

    def one(i):
        c = openai.OpenAI(base_url=srv.url, api_key="none", max_retries=0, timeout=900)  # a loaded CI machine is slow
        s = schemas[i]
        r = c.chat.completions.create(
            model=srv.model_id, max_tokens=4096, temperature=0 if i % 2 else 0.9, seed=i,
            messages=[{"role": "user", "content": "Reply with JSON for this schema: " + json.dumps(s)}],
            response_format={"type": "json_schema", "json_schema": {"name": f"s{i}", "schema": s, "strict": True}})
        ch = r.choices[0]
        return i, ch.finish_reason, ch.message.content, r.usage.completion_tokens

    t0 = time.time()
    try:
        with cf.ThreadPoolExecutor(a.parallel) as pool:
            for i, finish, text, n in pool.map(one, range(a.count)):
                tokens += n
                why = None
                if finish != "stop":
                    why = f"finish_reason {finish}"
                else:
                    try:
                        jsonschema.validate(json.loads(text), schemas[i], cls=jsonschema.Draft202012Validator,
                                            format_checker=checker)
                    except (ValueError, jsonschema.ValidationError) as e:
                        why = str(e).split("\n")[0]
                if why:
                    failures.append(i)
                    print(f"schema_e2e: #{i} invalid ({why})\n  schema {json.dumps(schemas[i])}\n  reply  {text!r}")
    finally:
        srv.stop()
    dt = time.time() - t0
    valid = a.count - len(failures)
    print(f"schema_e2e: {valid}/{a.count} valid ({tokens} tokens in {dt:.0f} s, {tokens / dt:.0f} tok/s, seed {seed})")
    sys.exit(0 if not failures else 1)


if __name__ == "__main__":
    main()
