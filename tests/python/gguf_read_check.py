#!/usr/bin/env python3
"""Reads a GGUF file with the reference `gguf` package (gguf.GGUFReader) and
checks its metadata and tensors against an expected JSON description.
tests/unit/gguf_test.cpp uses it to check that files written by quern's
GgufWriter read back correctly in an independent implementation.

Usage: gguf_read_check.py FILE.gguf EXPECTED.json [--print]

EXPECTED.json:
  {"alignment": 32, "data_offset": 1024,
   "metadata": [{"key": "test.u8", "value": V}, ...],       # in file order
   "tensors": [{"name": "w", "type": 12, "ne": [256, 2],     # ggml type id, innermost first
                "offset": 1024, "nbytes": 288, "data_hex": "..."}]}   # offset: absolute
  V = {"type": "uint8" | ... | "string", "value": x}
    | {"type": "array", "elem": "int32", "items": [V, ...]}

Prints one line per mismatch and exits 1, or prints "OK ..." and exits 0.
"""
import json
import sys

import gguf
from gguf import GGUFValueType as T

TYPE_NAMES = {
    T.UINT8: "uint8", T.INT8: "int8", T.UINT16: "uint16", T.INT16: "int16",
    T.UINT32: "uint32", T.INT32: "int32", T.FLOAT32: "float32", T.BOOL: "bool",
    T.STRING: "string", T.ARRAY: "array", T.UINT64: "uint64", T.INT64: "int64",
    T.FLOAT64: "float64",
}


def decode(parts, i, vtype):
    """Rebuilds one typed value from a ReaderField's parts, starting at parts[i].
    Returns (value, index after it). Handles arrays of arrays, which the
    reader's contents() flattens."""
    vtype = T(int(vtype))
    if vtype == T.STRING:
        return {"type": "string", "value": bytes(parts[i + 1]).decode("utf-8")}, i + 2
    if vtype == T.ARRAY:
        elem = T(int(parts[i][0]))
        n = int(parts[i + 1][0])
        i += 2
        items = []
        for _ in range(n):
            v, i = decode(parts, i, elem)
            items.append(v)
        return {"type": "array", "elem": TYPE_NAMES[elem], "items": items}, i
    return {"type": TYPE_NAMES[vtype], "value": parts[i][0].item()}, i + 1


def plain(v):
    """The value as contents() returns it (flat arrays only)."""
    if v["type"] == "array":
        return [plain(x) for x in v["items"]]
    return v["value"]


def is_nested(v):
    return v["type"] == "array" and v["elem"] == "array"


def main():
    if len(sys.argv) < 3:
        print(__doc__)
        return 2
    reader = gguf.GGUFReader(sys.argv[1])
    with open(sys.argv[2], encoding="utf-8") as f:
        want = json.load(f)
    show = "--print" in sys.argv[3:]
    errors = []

    if int(reader.alignment) != want["alignment"]:
        errors.append(f"alignment: reader {reader.alignment}, expected {want['alignment']}")
    if int(reader.data_offset) != want["data_offset"]:
        errors.append(f"data_offset: reader {reader.data_offset}, expected {want['data_offset']}")

    fields = [(k, f) for k, f in reader.fields.items() if not k.startswith("GGUF.")]
    got_keys = [k for k, _ in fields]
    want_keys = [m["key"] for m in want["metadata"]]
    if got_keys != want_keys:
        errors.append(f"keys: reader {got_keys}, expected {want_keys}")
    for (key, field), m in zip(fields, want["metadata"]):
        value, end = decode(field.parts, 3, field.parts[2][0])
        if end != len(field.parts):
            errors.append(f"{key}: {len(field.parts) - end} unused parts")
        if value != m["value"]:
            errors.append(f"{key}: reader {value}, expected {m['value']}")
        elif not is_nested(value) and field.contents() != plain(value):
            errors.append(f"{key}: contents() {field.contents()!r}, expected {plain(value)!r}")
        if show:
            print(f"{key}: {plain(value)!r}"[:200])

    if len(reader.tensors) != len(want["tensors"]):
        errors.append(f"tensor count: reader {len(reader.tensors)}, expected {len(want['tensors'])}")
    for t, w in zip(reader.tensors, want["tensors"]):
        got = {"name": t.name, "type": int(t.tensor_type), "ne": [int(x) for x in t.shape],
               "offset": int(t.data_offset), "nbytes": int(t.n_bytes), "data_hex": t.data.tobytes().hex()}
        for k in got:
            if got[k] != w[k]:
                errors.append(f"tensor {w['name']}: {k}: reader {got[k]!r}, expected {w[k]!r}")
        if show:
            print(f"tensor {t.name}: {t.tensor_type.name} {got['ne']} at {got['offset']}, {got['nbytes']} bytes")

    for e in errors:
        print(e if len(e) <= 400 else e[:400] + " ...")
    if errors:
        return 1
    print(f"OK {len(fields)} keys, {len(reader.tensors)} tensors")
    return 0


if __name__ == "__main__":
    sys.exit(main())
