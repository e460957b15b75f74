#include "msinfer/model/demo_model.h"

#include <filesystem>
#include <fstream>

namespace msinfer::embedded {
// Generated from data/demo-model by msinfer_embed_files (src/model/CMakeLists.txt).
std::vector<File> demo_model_files();
}  // namespace msinfer::embedded

namespace msinfer::model {

std::vector<embedded::File> demo_model_files() { return embedded::demo_model_files(); }

Status write_demo_model(const std::string& out_dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) return not_found("--out " + out_dir + ": cannot create (" + ec.message() + ")");
  for (const embedded::File& f : demo_model_files()) {
    const std::string path = (fs::path(out_dir) / f.name).string();
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    if (!out) return not_found(path + ": cannot open for writing");
    out.write(f.bytes.data(), static_cast<std::streamsize>(f.bytes.size()));
    out.close();
    if (!out) return internal_error(path + ": write failed");
  }
  return ok_status();
}

}  // namespace msinfer::model
