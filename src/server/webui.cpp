#include "server/webui.h"

namespace quern::server {

const WebAsset* find_web_asset(std::string_view path) {
    for (size_t i = 0; i < kWebAssetCount; ++i)
        if (kWebAssets[i].path == path) return &kWebAssets[i];
    return nullptr;
}

bool webui_has_markdown() { return find_web_asset("/webui/marked.min.js") != nullptr; }

}  // namespace quern::server
