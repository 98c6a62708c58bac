// Human- and machine-readable reports of a safetensors checkpoint (used by
// `quern inspect` for .safetensors files, index files and model folders).
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "formats/safetensors.h"

namespace quern {

/// Plain-text report: the checkpoint (index or file), each file (size, header
/// size, tensor count), the index's metadata and each file's "__metadata__"
/// (printed once when every shard has the same), a tensor table (name, dtype,
/// shape AS STORED — outermost first, PyTorch's order, the reverse of GGUF
/// listings —, bytes, shard when sharded, absolute offset in its file) and
/// totals (parameters, bytes, bits per weight, and the same per dtype).
std::string safetensors_inspect_text(const SafetensorsModel& m);

/// The same report as JSON:
///   {"format": "safetensors", "index": PATH | null, "index_metadata": {...},
///    "files": [{path, size, header_size, data_offset, tensors, metadata: {k: v}}],
///    "shape_order": "outermost first (as stored)",
///    "tensors": [{name, dtype, shape, ne, elements, bytes, file, offset}],
///    "totals": {tensors, parameters, bytes, bits_per_weight,
///               by_type: {DTYPE: {tensors, parameters, bytes}}}}
/// "shape" is as stored (outermost first); "ne" is quern's innermost-first
/// order (absent for ranks above 4); "dtype" is the header's string (quern's
/// DType has the same name); "file" indexes "files"; "offset" is absolute.
nlohmann::json safetensors_inspect_json(const SafetensorsModel& m);

}  // namespace quern
