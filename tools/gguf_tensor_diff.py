#!/usr/bin/env python3
"""Compares two GGUF files tensor by tensor: names, order, types, shapes and
data bytes, and the metadata keys. Prints one line per difference and a
summary; exit status 0 when the tensors are identical, 1 otherwise.

Used to check `quern quantize` against llama.cpp's llama-quantize on the
same input (bench/quantize.md). Needs the `gguf` package (pip install gguf).

  tools/gguf_tensor_diff.py quern-q4_k_m.gguf llama-q4_k_m.gguf
"""
import argparse
import sys

import gguf


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("a")
    ap.add_argument("b")
    args = ap.parse_args()
    ra, rb = gguf.GGUFReader(args.a), gguf.GGUFReader(args.b)
    ta = {t.name: t for t in ra.tensors}
    tb = {t.name: t for t in rb.tensors}
    diffs = 0
    if [t.name for t in ra.tensors] != [t.name for t in rb.tensors]:
        print("tensor order or names differ")
        diffs += 1
    same = 0
    for name, x in ta.items():
        y = tb.get(name)
        if y is None:
            print(f"{name}: only in {args.a}")
            diffs += 1
            continue
        if x.tensor_type != y.tensor_type or list(x.shape) != list(y.shape):
            print(f"{name}: {x.tensor_type.name} {list(x.shape)} vs {y.tensor_type.name} {list(y.shape)}")
            diffs += 1
        elif x.data.tobytes() != y.data.tobytes():
            print(f"{name}: {x.tensor_type.name} data differ")
            diffs += 1
        else:
            same += 1
    for name in tb:
        if name not in ta:
            print(f"{name}: only in {args.b}")
            diffs += 1
    ka = {f.name for f in ra.fields.values()}
    kb = {f.name for f in rb.fields.values()}
    for k in sorted(ka ^ kb):
        if not k.startswith("GGUF."):
            print(f"metadata key {k}: only in {args.a if k in ka else args.b}")
    print(f"{same} of {len(ta)} tensors identical")
    return 0 if diffs == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
