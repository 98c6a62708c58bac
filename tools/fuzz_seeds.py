#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz harnesses (tests/fuzz/) from the test
data, one folder per harness:

    gguf         small GGUF files written here with the gguf package: every
                 metadata type, a LLaMA config, a BPE vocabulary, tensors of
                 F32 / F16 / Q8_0
    safetensors  the Hugging Face fixtures of tests/data/hf (model.safetensors,
                 config.json, a small tokenizer.json, generation_config.json)
                 joined by the harness's separator
    jinja        every chat template of ../shared/testdata/chat-templates
    tokenizer    the tokenizer test inputs of ../shared/testdata/vocab, one
                 seed per case
    requests     request bodies of every API quern serve answers

    tools/fuzz_seeds.py OUT_DIR
"""
import glob
import json
import os
import sys

import numpy as np

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
TESTDATA = os.path.join(ROOT, "..", "shared", "testdata")
SPLIT = b"\n--8<--\n"  # tests/fuzz/fuzz_common.h kSplit


def gguf_seeds(out):
    import gguf
    # A LLaMA shape with every metadata value type and three tensor types.
    w = gguf.GGUFWriter(os.path.join(out, "llama.gguf"), "llama")
    w.add_uint32("llama.context_length", 64)
    w.add_uint32("llama.embedding_length", 32)
    w.add_uint32("llama.feed_forward_length", 64)
    w.add_uint32("llama.block_count", 1)
    w.add_uint32("llama.attention.head_count", 4)
    w.add_uint32("llama.attention.head_count_kv", 2)
    w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_float32("llama.rope.freq_base", 10000.0)
    w.add_uint8("test.u8", 7)
    w.add_int8("test.i8", -7)
    w.add_uint16("test.u16", 700)
    w.add_int16("test.i16", -700)
    w.add_int32("test.i32", -70000)
    w.add_uint64("test.u64", 1 << 40)
    w.add_int64("test.i64", -(1 << 40))
    w.add_float64("test.f64", 0.5)
    w.add_bool("test.bool", True)
    w.add_string("test.str", "héllo")
    w.add_array("test.arr", [1, 2, 3])
    w.add_array("test.strs", ["a", "bc"])
    tokens = ["<s>", "</s>"] + [chr(c) for c in range(97, 123)] + ["ab", "abc", "Ġa", "Ġb"]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens)
    w.add_token_types([3, 3] + [1] * (len(tokens) - 2))
    w.add_token_merges(["a b", "ab c", "Ġ a", "Ġ b"])
    w.add_bos_token_id(0)
    w.add_eos_token_id(1)
    w.add_chat_template("{% for m in messages %}{{ m.content }}{% endfor %}")
    rng = np.random.default_rng(1)
    w.add_tensor("token_embd.weight", rng.standard_normal((len(tokens), 32), dtype=np.float32))
    w.add_tensor("output_norm.weight", np.ones(32, dtype=np.float16))
    q = gguf.quants.quantize(rng.standard_normal((64, 32), dtype=np.float32), gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("blk.0.ffn_up.weight", q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    # A vocabulary-only file in SentencePiece form.
    w = gguf.GGUFWriter(os.path.join(out, "spm-vocab.gguf"), "llama")
    pieces = ["<unk>", "<s>", "</s>", "▁", "▁a", "b", "<0x0A>", "<0xE4>"]
    w.add_tokenizer_model("llama")
    w.add_token_list(pieces)
    w.add_token_scores([0.0, 0.0, 0.0, -1.0, -2.0, -3.0, -4.0, -5.0])
    w.add_token_types([2, 3, 3, 1, 1, 1, 6, 6])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()


TOKENIZER_JSON = json.dumps({
    "version": "1.0", "added_tokens": [{"id": 0, "content": "<|endoftext|>", "special": True, "single_word": False,
                                        "lstrip": False, "rstrip": False, "normalized": False}],
    "normalizer": None, "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                                          "use_regex": True},
    "post_processor": None, "decoder": {"type": "ByteLevel"},
    "model": {"type": "BPE", "vocab": {"<|endoftext|>": 0, "a": 1, "b": 2, "ab": 3, "Ġ": 4, "Ġa": 5},
              "merges": ["a b", "Ġ a"]}}).encode()


def safetensors_seeds(out):
    def read(path):
        return open(path, "rb").read() if os.path.exists(path) else b"{}"

    for d in sorted(glob.glob(os.path.join(ROOT, "tests", "data", "hf", "*", "bf16"))):
        parts = [read(os.path.join(d, "model.safetensors")), read(os.path.join(d, "config.json")), TOKENIZER_JSON,
                 b"{}", read(os.path.join(d, "generation_config.json"))]
        with open(os.path.join(out, os.path.basename(os.path.dirname(d))), "wb") as f:
            f.write(SPLIT.join(parts))


def jinja_seeds(out):
    for p in sorted(glob.glob(os.path.join(TESTDATA, "chat-templates", "*.jinja"))):
        with open(p, "rb") as src, open(os.path.join(out, os.path.basename(p)), "wb") as dst:
            dst.write(src.read())


def tokenizer_seeds(out):
    n = 0
    for p in sorted(glob.glob(os.path.join(TESTDATA, "vocab", "*.inp")))[:1]:  # the inputs are the same per vocab
        for case in open(p, "rb").read().split(b"\n__ggml_vocab_test__\n"):
            with open(os.path.join(out, f"case{n:03d}"), "wb") as f:
                f.write(case)
            n += 1


REQUESTS = [
    {"model": "m", "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
     "temperature": 0.7, "top_p": 0.9, "max_tokens": 16, "stream": True, "stream_options": {"include_usage": True},
     "stop": ["\n\n"], "logit_bias": {"5": -100}, "logprobs": True, "top_logprobs": 2, "seed": 1, "n": 2},
    {"messages": [{"role": "user", "content": "Weather?"}],
     "tools": [{"type": "function", "function": {"name": "w", "parameters": {"type": "object", "properties": {
         "city": {"type": "string", "maxLength": 20}}, "required": ["city"]}}}], "tool_choice": "required"},
    {"messages": [{"role": "user", "content": [{"type": "text", "text": "JSON"}]}],
     "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
         "type": "object", "properties": {"a": {"type": "integer", "minimum": 3}, "b": {"type": "array", "items": {
             "type": "string", "format": "date"}, "maxItems": 3}}, "required": ["a"]}}}},
    {"messages": [{"role": "user", "content": "x"}], "grammar": "root ::= \"yes\" | \"no\""},
    {"prompt": ["Once", [1, 2, 3]], "max_tokens": 8, "echo": False, "ignore_eos": True},
    {"model": "m", "max_tokens": 64, "system": "terse", "messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "w", "input": {"city": "P"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "sunny"}]}],
     "tools": [{"name": "w", "input_schema": {"type": "object"}}], "thinking": {"type": "enabled",
                                                                              "budget_tokens": 1024}},
    {"model": "m", "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}],
     "instructions": "terse", "max_output_tokens": 32, "text": {"format": {"type": "json_object"}}},
    {"input": ["one", "two"], "encoding_format": "base64"},
]


def requests_seeds(out):
    for i, r in enumerate(REQUESTS):
        with open(os.path.join(out, f"req{i:02d}.json"), "w") as f:
            json.dump(r, f)


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    for name, fn in (("gguf", gguf_seeds), ("safetensors", safetensors_seeds), ("jinja", jinja_seeds),
                     ("tokenizer", tokenizer_seeds), ("requests", requests_seeds)):
        d = os.path.join(sys.argv[1], name)
        os.makedirs(d, exist_ok=True)
        fn(d)


if __name__ == "__main__":
    main()
