// The web chat page `quern serve` answers at / (src/server/webui/), with the
// markdown and code-highlighting libraries it uses, embedded in the binary at
// build time (cmake/embed_files.cmake), so nothing is read from disk or built
// when the server runs.
#pragma once

#include <cstddef>
#include <string_view>

namespace quern::server {

/// One embedded file: the URL path it is served at ("/" or "/webui/NAME"),
/// its Content-Type and its bytes.
struct WebAsset {
    std::string_view path;
    std::string_view content_type;
    std::string_view body;
};

/// Defined by the generated source (build/generated/webui_assets.cpp).
extern const WebAsset kWebAssets[];
extern const size_t kWebAssetCount;

/// The embedded file served at `path`; null when there is none.
const WebAsset* find_web_asset(std::string_view path);

/// Whether the markdown library (marked) was found at build time; without it
/// the page shows replies as plain text.
bool webui_has_markdown();

}  // namespace quern::server
