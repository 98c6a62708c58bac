// Read-only memory mapping of a whole file.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace quern {

/// A file mapped read-only into memory for the lifetime of the object.
/// Errors (missing file, permission, not a regular file) throw quern::Error
/// naming the path and the system's reason. An empty file maps to size()==0.
class MappedFile {
public:
    explicit MappedFile(const std::string& path);
    ~MappedFile();
    MappedFile(const MappedFile&) = delete;
    MappedFile& operator=(const MappedFile&) = delete;

    const uint8_t* data() const { return data_; }
    size_t size() const { return size_; }
    const std::string& path() const { return path_; }

private:
    std::string path_;
    const uint8_t* data_ = nullptr;
    size_t size_ = 0;
};

}  // namespace quern
