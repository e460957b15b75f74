// Safetensors checkpoints: memory-mapped reading with full validation, and writing.
//
// File layout: u64 little-endian N, then N bytes of JSON header
//   {"<name>": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {...}}
// then the data; offsets are relative to the first byte after the header.
// Every field is checked: a truncated or corrupt file gives one error naming the
// file and tensor, never a crash.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "msinfer/core/mapped_file.h"
#include "msinfer/core/status.h"

namespace msinfer::model {

// kF8E4M3: float8_e4m3fn (msinfer/core/fp8.h), the block-scaled weights of
// DeepSeek-V3 checkpoints (ModelConfig::fp8_weights); never a GEMM input as is.
// kU8: raw bytes, the MXFP4 blocks and e8m0 scales of gpt-oss experts
// (ModelConfig::mxfp4_experts); never a float tensor.
enum class DType { kBF16, kF16, kF32, kF8E4M3, kU8 };
const char* dtype_name(DType d);  // "BF16", "F16", "F32", "F8_E4M3", "U8"
size_t dtype_size(DType d);

struct TensorView {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;  // inside a MappedFile owned by the Checkpoint
  size_t bytes = 0;
  std::string file;
  size_t file_offset = 0;  // of data in the file (for MappedFile::release)

  int64_t numel() const;
  std::string shape_string() const;  // "[512, 256]"
};

// Parses and validates a whole safetensors image (header and data bounds).
// `file` names it in errors. Views point into `data`.
StatusOr<std::vector<TensorView>> parse_safetensors(const uint8_t* data, size_t size,
                                                    const std::string& file);

// One or more safetensors files of a model directory: model.safetensors, or the
// shards listed by model.safetensors.index.json (every listed tensor must be in
// the shard the index names), or every *.safetensors in the directory.
class Checkpoint {
 public:
  static StatusOr<Checkpoint> open(const std::string& dir);

  // nullptr when absent.
  const TensorView* find(const std::string& name) const;
  const std::map<std::string, TensorView>& tensors() const { return tensors_; }
  // Drops the mapped pages of a tensor from the resident set (after converting it).
  void release(const TensorView& t) const;

 private:
  std::vector<std::unique_ptr<MappedFile>> files_;
  std::map<std::string, TensorView> tensors_;
};

struct TensorToWrite {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  const void* data;  // numel * dtype_size bytes
};
// Writes one safetensors file (tensors in the given order, 8-byte aligned header).
Status write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                         const std::map<std::string, std::string>& metadata = {});

}  // namespace msinfer::model
