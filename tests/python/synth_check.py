#!/usr/bin/env python3
"""Reads a GGUF file written by `quern synth` with the `gguf` package and prints
a JSON summary for tests/unit/synth_test.cpp to compare with quern's own view:
architecture keys, vocabulary size, and for every tensor its type id, shape and
the sum of its dequantized first row (via gguf.quants.dequantize).

Usage: synth_check.py FILE.gguf
"""
import json
import sys

import numpy as np
import gguf
from gguf.quants import dequantize

r = gguf.GGUFReader(sys.argv[1])
def field(k):
    f = r.fields[k]
    return f.contents()
out = {
    "arch": field("general.architecture"),
    "block_count": int(field("llama.block_count")),
    "n_vocab_tokens": len(r.fields["tokenizer.ggml.tokens"].data),
    "tensors": {},
}
for t in r.tensors:
    qt = gguf.GGMLQuantizationType(int(t.tensor_type))
    ne = [int(x) for x in t.shape]
    rows = ne[1] if len(ne) > 1 else 1
    data = np.asarray(t.data).reshape(rows, -1)
    row0 = np.asarray(dequantize(data[0:1], qt), dtype=np.float64).reshape(-1)
    assert row0.size == ne[0], (t.name, row0.size, ne)
    out["tensors"][t.name] = {"type": int(t.tensor_type), "ne": ne, "row0_sum": float(row0.sum())}
print(json.dumps(out))
