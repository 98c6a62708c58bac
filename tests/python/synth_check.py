#!/usr/bin/env python3
"""Reads a GGUF file written by `quern synth` with the `gguf` package and prints
a JSON summary for tests/unit/synth_test.cpp to compare with quern's own view:
architecture keys, vocabulary size, and for every tensor its type id, shape and
the sum of its dequantized first row (via gguf.quants.dequantize). Also the
tensor names that llama.cpp's table for the architecture
(gguf.constants.MODEL_TENSORS) does not list, and the metadata keys that are
none of the package's key templates (gguf.constants.Keys) for it: both lists
are empty for a file llama.cpp's loader recognises.

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
arch = field("general.architecture")

# Keys llama.cpp's loader reads (src/llama-arch.cpp) that the newest gguf
# package on PyPI (0.19.0) does not list yet.
NEWER_KEYS = {"{arch}.attention.recurrent_layers"}

def known_keys(arch):
    keys = {k.format(arch=arch) for k in NEWER_KEYS}
    for group in vars(gguf.Keys).values():
        if isinstance(group, type):
            for v in vars(group).values():
                if isinstance(v, str) and "." in v and "{" not in v.replace("{arch}", ""):
                    keys.add(v.format(arch=arch))
    return keys

# Tensors llama.cpp's table lists for an architecture (gguf-py/gguf/constants.py
# in llama.cpp) that the newest gguf package on PyPI (0.19.0) does not yet.
NEWER_TENSORS = {
    "qwen35": {"blk.{bid}.nextn.eh_proj", "blk.{bid}.nextn.enorm", "blk.{bid}.nextn.hnorm",
               "blk.{bid}.nextn.shared_head_norm"},
}
NEWER_TENSORS["qwen35moe"] = NEWER_TENSORS["qwen35"]

def tensor_patterns(arch):
    a = next(m for m, name in gguf.MODEL_ARCH_NAMES.items() if name == arch)
    return {gguf.TENSOR_NAMES[t] for t in gguf.MODEL_TENSORS[a]} | NEWER_TENSORS.get(arch, set())

def known_tensor(name, patterns):
    def generic(n):
        parts = n.split(".")
        if len(parts) >= 2 and parts[0] == "blk" and parts[1].isdigit():
            return ".".join(["blk", "{bid}"] + parts[2:])
        return n
    # Without .weight / .bias, or whole (ssm_a has no suffix).
    return generic(name.rsplit(".", 1)[0]) in patterns or generic(name) in patterns

keys = known_keys(arch)
patterns = tensor_patterns(arch)
out = {
    "arch": arch,
    "block_count": int(field(arch + ".block_count")),
    "unknown_keys": sorted(k for k in r.fields if not k.startswith("GGUF.") and k not in keys),
    "unknown_tensors": sorted(t.name for t in r.tensors if not known_tensor(t.name, patterns)),
    "n_vocab_tokens": len(r.fields["tokenizer.ggml.tokens"].data),
    "tensors": {},
}
for t in r.tensors:
    qt = gguf.GGMLQuantizationType(int(t.tensor_type))
    ne = [int(x) for x in t.shape]
    rows = 1
    for n in ne[1:]:
        rows *= n  # 3-D expert banks: every expert's rows
    data = np.asarray(t.data).reshape(rows, -1)
    row0 = np.asarray(dequantize(data[0:1], qt), dtype=np.float64).reshape(-1)
    assert row0.size == ne[0], (t.name, row0.size, ne)
    out["tensors"][t.name] = {"type": int(t.tensor_type), "ne": ne, "row0_sum": float(row0.sum())}
print(json.dumps(out))
