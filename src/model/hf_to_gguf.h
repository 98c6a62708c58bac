// A Hugging Face folder as the GGUF file llama.cpp's convert_hf_to_gguf.py
// would write from it, for `quern quantize FOLDER OUT TYPE`: the weights as
// the HF loader binds them (model/hf_model.h: GGUF names, Gemma's 1 + w
// norms, FP8 / NVFP4 matrices repacked, then dequantized by the quantizer),
// with the layout GGUF files have where a checkpoint's differs — expert
// banks stacked into one 3-D tensor per layer, q/k rows permuted for
// interleaved RoPE in the families whose GGUF files store them so
// (ArchDef::gguf_permutes_qk), RoPE frequency factors as rope_freqs.weight —
// and the metadata: the config's keys (ModelConfig::write_gguf), the
// tokenizer (tokenizer.ggml.*) and the chat templates.
#pragma once
#include <string>

#include "model/quantize.h"

namespace quern {

/// The source of `folder` (or a file inside it: hf_model.h). quern::Error,
/// before any work, for what the HF loader refuses, a folder without
/// tokenizer.json, a tokenizer GGUF cannot describe (a pre-tokenizer
/// llama.cpp has no name for, a SentencePiece-style vocabulary without byte
/// fallback, one whose GGUF form — byte-level BPE, or SentencePiece with
/// scores derived from the merges — would encode a probe text differently),
/// more tokens than the
/// embedding has rows, and RoPE factors in a family whose GGUF files have no
/// place for them.
QuantizeSource hf_quantize_source(const std::string& folder);

}  // namespace quern
