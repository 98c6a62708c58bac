#!/usr/bin/env python3
"""Rewrites a ModelOpt NVFP4 checkpoint folder as a compressed-tensors one.

Both formats hold the same numbers in different packaging:

  ModelOpt (hf_quant_config.json / quant_method "modelopt", quant_algo NVFP4)
    NAME.weight            U8 [N, K/2]      two E2M1 codes per byte, element 2i low
    NAME.weight_scale      F8_E4M3 [N, K/16]
    NAME.weight_scale_2    F32 []           w = e2m1 * e4m3(scale) * weight_scale_2
    NAME.input_scale       F32 []

  compressed-tensors (quant_method "compressed-tensors", format
  "nvfp4-pack-quantized", as llm-compressor writes it)
    NAME.weight_packed     U8 [N, K/2]      same codes, same nibble order
    NAME.weight_scale      F8_E4M3 [N, K/16]
    NAME.weight_global_scale F32 [1]        w = e2m1 * e4m3(scale) / weight_global_scale
    NAME.input_global_scale  F32 [1]

weight_global_scale is the reciprocal of weight_scale_2. It is chosen among
the float32 neighbours of 1/weight_scale_2 so that float32(1 / it) gives
weight_scale_2 back exactly when such a value exists, so a reader that turns
the divisor into a multiplier decodes the same floats as from the ModelOpt
folder (the tool says which tensors have no such value).

Used to make tests/data/hf/llama/nvfp4_ct from tests/data/hf/llama/nvfp4:
  python3 tools/nvfp4_modelopt_to_ct.py tests/data/hf/llama/nvfp4 tests/data/hf/llama/nvfp4_ct
Needs only the Python standard library and numpy.
"""
import json
import os
import shutil
import struct
import sys

import numpy as np


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    meta = header.pop("__metadata__", None)
    tensors = {}
    for name, h in header.items():
        a, b = h["data_offsets"]
        tensors[name] = (h["dtype"], h["shape"], data[a:b])
    return meta, tensors


def write_safetensors(path, meta, tensors):
    header, blobs, off = {}, [], 0
    if meta is not None:
        header["__metadata__"] = meta
    for name in sorted(tensors):
        dtype, shape, raw = tensors[name]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    hj = json.dumps(header, separators=(",", ":")).encode()
    hj += b" " * (-len(hj) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        for b in blobs:
            f.write(b)


def f32(x):
    return np.float32(x)


def reciprocal_that_roundtrips(g):
    """A float32 r with float32(1 / r) == g if one exists near 1/g, else float32(1/g)."""
    r0 = f32(1.0) / f32(g)
    cands = [r0]
    up, down = r0, r0
    for _ in range(4):
        up = np.nextafter(up, np.float32(np.inf))
        down = np.nextafter(down, np.float32(0))
        cands += [up, down]
    for r in cands:
        if f32(1.0) / r == f32(g):
            return r, True
    return r0, False


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    src, dst = sys.argv[1], sys.argv[2]
    shutil.rmtree(dst, ignore_errors=True)
    os.makedirs(dst)
    meta, t = read_safetensors(os.path.join(src, "model.safetensors"))
    out, inexact = {}, []
    for name, (dtype, shape, raw) in t.items():
        if name.endswith(".weight_scale_2"):
            module = name[: -len(".weight_scale_2")]
            g = np.frombuffer(raw, dtype="<f4")[0]
            r, ok = reciprocal_that_roundtrips(g)
            if not ok:
                inexact.append(module)
            out[module + ".weight_global_scale"] = ("F32", [1], np.array([r], dtype="<f4").tobytes())
        elif name.endswith(".input_scale"):
            module = name[: -len(".input_scale")]
            s = np.frombuffer(raw, dtype="<f4")[0]
            out[module + ".input_global_scale"] = ("F32", [1], np.array([f32(1.0) / f32(s)], dtype="<f4").tobytes())
        elif name.endswith(".weight") and dtype == "U8":
            out[name[: -len(".weight")] + ".weight_packed"] = (dtype, shape, raw)
        else:
            out[name] = (dtype, shape, raw)
    write_safetensors(os.path.join(dst, "model.safetensors"), meta, out)

    with open(os.path.join(src, "config.json")) as f:
        cfg = json.load(f)
    scheme = {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16, "symmetric": True,
              "dynamic": False, "observer": "minmax", "actorder": None, "block_structure": None}
    acts = dict(scheme, dynamic="local")
    cfg["quantization_config"] = {
        "quant_method": "compressed-tensors",
        "format": "nvfp4-pack-quantized",
        "quantization_status": "compressed",
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": scheme, "input_activations": acts,
                                      "output_activations": None, "format": "nvfp4-pack-quantized"}},
        "ignore": ["lm_head"],
        "kv_cache_scheme": None,
        "sparsity_config": {},
        "transform_config": {},
        "global_compression_ratio": None,
        "version": "0.12.2",
    }
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    for extra in ("generation_config.json",):
        if os.path.exists(os.path.join(src, extra)):
            shutil.copy(os.path.join(src, extra), os.path.join(dst, extra))
    print(f"{dst}: {len(out)} tensors; global scales without an exact reciprocal: {inexact or 'none'}")


if __name__ == "__main__":
    main()
