#!/usr/bin/env python3
"""Writes a small GGUF file with the reference `gguf` package (gguf.GGUFWriter):
one value of every metadata type, flat and nested arrays, 64-byte alignment
and F32 / F16 / Q8_0 tensors. tests/unit/gguf_test.cpp reads it with quern's
reader and checks every value below; keep the two in step.

Usage: gguf_write_sample.py OUT.gguf
"""
import sys

import numpy as np
import gguf


def main():
    w = gguf.GGUFWriter(sys.argv[1], arch="quern-test")
    w.add_custom_alignment(64)
    w.add_uint8("test.u8", 200)
    w.add_int8("test.i8", -100)
    w.add_uint16("test.u16", 60000)
    w.add_int16("test.i16", -30000)
    w.add_uint32("test.u32", 4000000000)
    w.add_int32("test.i32", -2000000000)
    w.add_float32("test.f32", 0.25)
    w.add_uint64("test.u64", 2**64 - 1)
    w.add_int64("test.i64", -2**63)
    w.add_float64("test.f64", 3.141592653589793)
    w.add_bool("test.bool", True)
    w.add_string("test.str", "h\u00e9llo \u2713")
    w.add_array("test.strings", ["a", "", "ccc"])
    w.add_array("test.ints", [1, -2, 3])
    w.add_array("test.floats", [0.5, -1.5])
    w.add_array("test.bools", [True, False])
    w.add_array("test.nested", [[1, 2], [3]])
    w.add_tensor("t.f32", np.arange(6, dtype=np.float32).reshape(2, 3))
    w.add_tensor("t.f16", np.array([1, 2, 3, 4], dtype=np.float16))
    q8 = (np.arange(2 * 34) % 251).astype(np.uint8).reshape(2, 34)
    w.add_tensor("t.q8_0", q8, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
