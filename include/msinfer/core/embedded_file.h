// A file embedded in the binary at build time (cmake/embed.cmake,
// msinfer_embed_files). The bytes live in the binary's read-only data for the
// life of the process.
#pragma once

#include <string_view>
#include <vector>

namespace msinfer::embedded {

struct File {
  std::string_view name;   // the file's name, without its directory
  std::string_view bytes;  // its content, as it was when the binary was built
};

}  // namespace msinfer::embedded
