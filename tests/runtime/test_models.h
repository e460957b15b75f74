// Test models written once per process with make_model (the real loader reads them).
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <string>

#include "msinfer/model/make_model.h"

namespace msinfer::runtime::testing {

inline std::string test_model_dir(const std::string& preset, uint64_t seed = 0) {
  static std::map<std::string, std::string> made;
  const std::string key = preset + "-" + std::to_string(seed);
  auto it = made.find(key);
  if (it != made.end()) return it->second;
  const std::string dir = (std::filesystem::path(::testing::TempDir()) /
                           ("msinfer_" + key + "_" + std::to_string(::getpid())))
                              .string();
  model::MakeModelOptions o;
  o.preset = preset;
  o.out_dir = dir;
  o.seed = seed;
  Status s = model::make_model(o);
  EXPECT_TRUE(s.ok()) << s.to_string();
  made[key] = dir;
  return dir;
}

}  // namespace msinfer::runtime::testing
