// Helpers of the libFuzzer harnesses (tests/fuzz/, built by tools/fuzz.sh):
// inputs become files where the code under test reads files, and one input
// may carry several files split by kSplit.
#pragma once
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

namespace quern::fuzz {

/// Separates the files of one input (tools/fuzz.sh joins seed files with it).
inline constexpr std::string_view kSplit = "\n--8<--\n";

/// A folder of this process's own for the files of the input being run
/// (under $TMPDIR, else /dev/shm: memory, so each run costs no disk I/O).
inline const std::string& scratch_dir() {
    static const std::string dir = [] {
        const char* base = std::getenv("TMPDIR");
        const std::string d = std::string(base ? base : "/dev/shm") + "/quern-fuzz-" + std::to_string(::getpid());
        std::filesystem::create_directories(d);
        return d;
    }();
    return dir;
}

/// Writes `bytes` to scratch_dir()/name and returns the path.
inline std::string write_file(const std::string& name, std::string_view bytes) {
    const std::string path = scratch_dir() + "/" + name;
    std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    return path;
}

/// The parts of an input split at kSplit (at most `max` parts; the last
/// keeps any further separators).
inline std::vector<std::string_view> split(const uint8_t* data, size_t size, size_t max) {
    std::string_view rest(reinterpret_cast<const char*>(data), size);
    std::vector<std::string_view> parts;
    while (parts.size() + 1 < max) {
        const size_t at = rest.find(kSplit);
        if (at == std::string_view::npos) break;
        parts.push_back(rest.substr(0, at));
        rest.remove_prefix(at + kSplit.size());
    }
    parts.push_back(rest);
    return parts;
}

}  // namespace quern::fuzz
