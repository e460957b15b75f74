// Memory maps, move-only, unmapped on destruction.
//
// MappedFile: a read-only memory map of a whole file. Pages are loaded on
// first touch, so mapping a checkpoint costs no memory until tensors are read
// (and the kernel may drop clean pages again).
//
// ZeroPages: read-write anonymous memory that reads as zeros. The kernel
// supplies each page at its first touch, so a large buffer costs memory (and
// time) only where it is written: a KV cache's unused blocks cost nothing,
// and creating one does not fill it (a std::vector of 256 MiB wrote every
// byte: 1.4-2 s of a tiny model's 2-process start on a loaded 2-core VM).
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

class ZeroPages {
 public:
  ZeroPages() = default;
  ~ZeroPages();
  ZeroPages(ZeroPages&& o) noexcept;
  ZeroPages& operator=(ZeroPages&& o) noexcept;
  ZeroPages(const ZeroPages&) = delete;
  ZeroPages& operator=(const ZeroPages&) = delete;

  // RESOURCE_EXHAUSTED when the kernel refuses the mapping; 0 bytes is empty.
  static StatusOr<ZeroPages> allocate(size_t bytes);

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  template <class T>
  T* as() const {
    return reinterpret_cast<T*>(data_);
  }

 private:
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace msinfer
