#!/usr/bin/env python3
"""Independent (de)quantization with the `gguf` package, for tests/unit/quant_test.cpp.

Usage: dequant_check.py MANIFEST

Each MANIFEST line is `MODE TYPE INPUT OUTPUT`:
  dequant TYPE in out   in holds raw blocks of TYPE; out gets float32 values
                        from gguf.quants.dequantize
  quant   TYPE in out   in holds float32 values (a multiple of the block size);
                        out gets the raw blocks from gguf.quants.quantize
TYPE is a GGML type name such as Q4_K, BF16, F16. All data is little endian.

Exit status: 0 on success, 3 when numpy or gguf cannot be imported (the test
then skips), 1 on any other error.
"""
import sys

try:
    import numpy as np
    from gguf import GGMLQuantizationType, quants
except Exception as e:  # pragma: no cover - environment check
    print(f"dequant_check.py: cannot import numpy/gguf: {e}", file=sys.stderr)
    sys.exit(3)


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 1
    with open(sys.argv[1], encoding="utf-8") as f:
        jobs = [line.split() for line in f if line.strip()]
    for job in jobs:
        if len(job) != 4:
            print(f"dequant_check.py: bad manifest line {job}", file=sys.stderr)
            return 1
        mode, type_name, src, dst = job
        qtype = GGMLQuantizationType[type_name]
        if mode == "dequant":
            raw = np.fromfile(src, dtype=np.uint8)
            out = quants.dequantize(raw, qtype)
        elif mode == "quant":
            data = np.fromfile(src, dtype=np.float32)
            with np.errstate(all="ignore"):
                out = quants.quantize(data, qtype)
        else:
            print(f"dequant_check.py: unknown mode {mode!r}", file=sys.stderr)
            return 1
        np.ascontiguousarray(out).tofile(dst)
    return 0


if __name__ == "__main__":
    sys.exit(main())
