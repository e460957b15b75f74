#include "msinfer/model/safetensors.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "msinfer/core/json.h"

namespace msinfer::model {
namespace {

constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

StatusOr<DType> parse_dtype(const std::string& s) {
  if (s == "BF16") return DType::kBF16;
  if (s == "F16") return DType::kF16;
  if (s == "F32") return DType::kF32;
  if (s == "F8_E4M3") return DType::kF8E4M3;
  if (s == "U8") return DType::kU8;
  return invalid_argument("dtype '" + s + "' is not supported (BF16, F16, F32, F8_E4M3, U8)");
}

// Bytes outside printable ASCII as \xNN.
std::string escape_bytes(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02X", c);
      out += buf;
    }
  }
  return out;
}

}  // namespace

const char* dtype_name(DType d) {
  switch (d) {
    case DType::kBF16: return "BF16";
    case DType::kF16: return "F16";
    case DType::kF32: return "F32";
    case DType::kF8E4M3: return "F8_E4M3";
    case DType::kU8: return "U8";
  }
  return "?";
}

size_t dtype_size(DType d) {
  switch (d) {
    case DType::kF32: return 4;
    case DType::kF8E4M3:
    case DType::kU8: return 1;
    case DType::kBF16:
    case DType::kF16: return 2;
  }
  return 0;
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string TensorView::shape_string() const {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

StatusOr<std::vector<TensorView>> parse_safetensors(const uint8_t* data, size_t size,
                                                    const std::string& file) {
  if (size < 8) return invalid_argument(file + ": too short for a safetensors header");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | data[i];
  if (n > kMaxHeaderBytes || n > size - 8) {
    return invalid_argument(file + ": header length " + std::to_string(n) +
                            " exceeds the file (" + std::to_string(size) + " bytes); truncated?");
  }
  std::string_view text(reinterpret_cast<const char*>(data + 8), n);
  // A tensor name given twice: the JSON parser would keep one of them silently,
  // so the top-level keys are collected as they are read.
  std::vector<std::string> keys;
  std::string duplicate;
  Json::parser_callback_t on_key = [&](int depth, Json::parse_event_t event, Json& parsed) {
    if (depth == 1 && event == Json::parse_event_t::key && duplicate.empty()) {
      std::string k = parsed.get<std::string>();
      if (std::find(keys.begin(), keys.end(), k) != keys.end()) duplicate = k;
      keys.push_back(std::move(k));
    }
    return true;
  };
  StatusOr<Json> j = invalid_argument("");
  try {
    j = Json::parse(text.begin(), text.end(), on_key);
  } catch (const Json::exception& e) {
    // e.what() quotes the offending bytes: escaped, never raw bytes in a message.
    return invalid_argument(file + ": header: not valid JSON (" + escape_bytes(e.what()) + ")");
  }
  if (!j->is_object()) return invalid_argument(file + ": header is not a JSON object");
  if (!duplicate.empty()) {
    return invalid_argument(file + ": tensor '" + duplicate + "' appears twice in the header");
  }
  const uint8_t* base = data + 8 + n;
  const size_t data_size = size - 8 - n;
  std::vector<TensorView> out;
  for (const auto& [name, v] : j->items()) {
    if (name == "__metadata__") continue;
    const std::string where = file + ": tensor '" + name + "'";
    if (!v.is_object()) return invalid_argument(where + ": entry is not an object");
    JsonFields f(v, where);
    MSI_ASSIGN_OR_RETURN(std::string dts, f.string("dtype"));
    auto dt = parse_dtype(dts);
    if (!dt.ok()) return dt.status().with_context(where);
    TensorView t;
    t.name = name;
    t.dtype = *dt;
    t.file = file;
    if (!v.contains("shape") || !v.at("shape").is_array()) {
      return invalid_argument(where + ": 'shape' must be a list");
    }
    uint64_t numel = 1;
    for (const auto& d : v.at("shape")) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0) {
        return invalid_argument(where + ": shape entries must be non-negative integers");
      }
      uint64_t dim = d.get<uint64_t>();
      if (dim != 0 && numel > (1ull << 48) / dim) {
        return invalid_argument(where + ": shape is implausibly large");
      }
      numel *= dim;
      t.shape.push_back(static_cast<int64_t>(dim));
    }
    const Json& off = v.contains("data_offsets") ? v.at("data_offsets") : Json();
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() ||
        !off[1].is_number_unsigned()) {
      return invalid_argument(where + ": 'data_offsets' must be [begin, end]");
    }
    uint64_t b = off[0].get<uint64_t>(), e = off[1].get<uint64_t>();
    if (b > e) {
      return invalid_argument(where + ": data_offsets [" + std::to_string(b) + ", " +
                              std::to_string(e) + "]: begin is after end");
    }
    if (e > data_size) {
      return invalid_argument(where + ": data_offsets [" + std::to_string(b) + ", " +
                              std::to_string(e) + "] outside the " + std::to_string(data_size) +
                              " data bytes; truncated file?");
    }
    if (e - b != numel * dtype_size(t.dtype)) {
      return invalid_argument(where + ": " + std::to_string(e - b) + " bytes for shape " +
                              t.shape_string() + " of " + dts);
    }
    t.data = base + b;
    t.bytes = e - b;
    t.file_offset = 8 + n + b;
    out.push_back(std::move(t));
  }
  // Tensors must not overlap.
  std::vector<const TensorView*> sorted;
  for (const auto& t : out) sorted.push_back(&t);
  std::sort(sorted.begin(), sorted.end(),
            [](const TensorView* a, const TensorView* b) { return a->data < b->data; });
  for (size_t i = 1; i < sorted.size(); ++i) {
    if (sorted[i - 1]->data + sorted[i - 1]->bytes > sorted[i]->data) {
      return invalid_argument(file + ": tensors '" + sorted[i - 1]->name + "' and '" +
                              sorted[i]->name + "' overlap");
    }
  }
  return out;
}

StatusOr<Checkpoint> Checkpoint::open(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return not_found(dir + ": not a model directory");
  std::vector<std::string> files;
  std::map<std::string, std::string> index;  // tensor -> shard file name
  const fs::path index_path = fs::path(dir) / "model.safetensors.index.json";
  if (fs::exists(index_path, ec)) {
    MSI_ASSIGN_OR_RETURN(Json j, read_json_file(index_path.string()));
    if (!j.is_object() || !j.contains("weight_map") || !j.at("weight_map").is_object()) {
      return invalid_argument(index_path.string() + ": field 'weight_map' must be an object");
    }
    for (const auto& [name, shard] : j.at("weight_map").items()) {
      if (!shard.is_string() || shard.get<std::string>().find('/') != std::string::npos) {
        return invalid_argument(index_path.string() + ": weight_map['" + name +
                                "'] must be a file name in the model directory");
      }
      index[name] = shard.get<std::string>();
      if (std::find(files.begin(), files.end(), shard.get<std::string>()) == files.end()) {
        files.push_back(shard.get<std::string>());
      }
    }
  } else if (fs::exists(fs::path(dir) / "model.safetensors", ec)) {
    files.push_back("model.safetensors");
  } else {
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      if (e.path().extension() == ".safetensors") files.push_back(e.path().filename().string());
    }
    std::sort(files.begin(), files.end());
  }
  if (files.empty()) return not_found(dir + ": no *.safetensors files");
  Checkpoint c;
  for (const auto& name : files) {
    const std::string path = (fs::path(dir) / name).string();
    // A directory named model.safetensors used to fail as "mmap failed (No such device)".
    if (fs::exists(path, ec) && !fs::is_regular_file(path, ec)) {
      return invalid_argument(path + ": not a regular file");
    }
    MSI_ASSIGN_OR_RETURN(MappedFile mf, MappedFile::open(path));
    auto file = std::make_unique<MappedFile>(std::move(mf));
    MSI_ASSIGN_OR_RETURN(std::vector<TensorView> views,
                         parse_safetensors(file->data(), file->size(), path));
    for (auto& v : views) {
      if (c.tensors_.count(v.name)) {
        return invalid_argument(path + ": tensor '" + v.name + "' also appears in " +
                                c.tensors_.at(v.name).file);
      }
      if (!index.empty()) {
        auto it = index.find(v.name);
        if (it == index.end() || it->second != name) {
          return invalid_argument(path + ": tensor '" + v.name +
                                  "' is not listed for this shard in model.safetensors.index.json");
        }
      }
      c.tensors_[v.name] = std::move(v);
    }
    c.files_.push_back(std::move(file));
  }
  for (const auto& [name, shard] : index) {
    if (!c.tensors_.count(name)) {
      return invalid_argument(dir + ": tensor '" + name + "' listed in the index is missing from " +
                              shard);
    }
  }
  return c;
}

const TensorView* Checkpoint::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

void Checkpoint::release(const TensorView& t) const {
  for (const auto& f : files_) {
    if (f->path() == t.file) f->release(t.file_offset, t.bytes);
  }
}

Status write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                         const std::map<std::string, std::string>& metadata) {
  Json header = Json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    uint64_t numel = 1;
    for (int64_t d : t.shape) numel *= static_cast<uint64_t>(d);
    uint64_t bytes = numel * dtype_size(t.dtype);
    header[t.name] = {{"dtype", dtype_name(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  while ((text.size() + 8) % 8 != 0) text.push_back(' ');
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return not_found(path + ": cannot open for writing");
  uint64_t n = text.size();
  char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  out.write(len, 8);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  for (const auto& t : tensors) {
    uint64_t numel = 1;
    for (int64_t d : t.shape) numel *= static_cast<uint64_t>(d);
    out.write(static_cast<const char*>(t.data),
              static_cast<std::streamsize>(numel * dtype_size(t.dtype)));
  }
  out.close();
  if (!out) return internal_error(path + ": write failed");
  return ok_status();
}

}  // namespace msinfer::model
