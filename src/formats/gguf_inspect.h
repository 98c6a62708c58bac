// Human- and machine-readable reports of a GGUF file (used by `quern inspect`).
#pragma once
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "formats/gguf.h"

namespace quern {

/// Plain-text report: file facts, metadata (key, type, value, with arrays longer
/// than `max_items` abbreviated), a tensor table (name, type, shape innermost
/// first, bytes, offset) and totals (parameters, bytes, bits per weight).
std::string gguf_inspect_text(const GgufFile& f, size_t max_items = 5);

/// The same report as JSON:
///   {"file": {path, size, version, alignment, data_offset},
///    "metadata": [{key, type, value, [count], [truncated]}],
///    "tensors": [{name, type, shape, elements, bytes, offset}],
///    "totals": {tensors, parameters, bytes, bits_per_weight, by_type: {TYPE: {tensors, parameters, bytes}}}}
/// Arrays are cut to `max_items` items (SIZE_MAX for all); "truncated" marks an
/// entry whose value (or a nested array) was cut, "count" an array's length.
nlohmann::json gguf_inspect_json(const GgufFile& f, size_t max_items = SIZE_MAX);

/// A metadata value as JSON; arrays are cut to `max_items` items and
/// `*truncated` (when given) is set if any was.
nlohmann::json gguf_value_to_json(const GgufValue& v, size_t max_items = SIZE_MAX, bool* truncated = nullptr);

/// Counts and sizes for reports: "135.0M", "1.23B"; "92.3 MiB", "512 B".
std::string human_count(uint64_t n);
std::string human_bytes(uint64_t n);

}  // namespace quern
