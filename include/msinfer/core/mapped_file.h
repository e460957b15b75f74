// A read-only memory map of a whole file. Move-only; unmaps on destruction.
// Pages are loaded on first touch, so mapping a checkpoint costs no memory
// until tensors are read (and the kernel may drop clean pages again).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "msinfer/core/status.h"

namespace msinfer {

class MappedFile {
 public:
  MappedFile() = default;
  ~MappedFile();
  MappedFile(MappedFile&& o) noexcept;
  MappedFile& operator=(MappedFile&& o) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  // NOT_FOUND if the file cannot be opened; an empty file maps to size 0.
  static StatusOr<MappedFile> open(const std::string& path);

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // Tells the kernel the range will not be needed soon (drops its clean pages
  // from this process's resident set). Offsets are clamped to the file.
  void release(size_t offset, size_t length) const;

 private:
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::string path_;
};

}  // namespace msinfer
