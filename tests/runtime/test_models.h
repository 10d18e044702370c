// Test checkpoints written once per test process with `init_model`.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <map>
#include <string>

#include "frontend/checkpoint/checkpoint.h"

namespace k3::testing {

// The per-process directory the checkpoints below go into, removed when the
// process exits (ctest runs each test in a process of its own: without the
// removal every run left a directory of checkpoints in /tmp).
struct TestModelRoot {
  std::filesystem::path path = std::filesystem::temp_directory_path() / ("k3-test-" + std::to_string(getpid()));
  ~TestModelRoot() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

// Directory of a checkpoint of `preset` (seed 7), created on first use in a
// per-process temporary directory.
inline std::string model_dir(const std::string& preset, ir::DType dtype = ir::DType::kF32) {
  static std::map<std::string, std::string> made;
  static const TestModelRoot root;
  const std::string key = preset + (dtype == ir::DType::kBF16 ? "-bf16" : "");
  auto it = made.find(key);
  if (it != made.end()) return it->second;
  const auto dir = root.path / key;
  auto cfg = preset_config(preset);
  if (!cfg.ok() || !init_model(*cfg, 7, dtype, dir.string()).ok()) return "";
  made[key] = dir.string();
  return dir.string();
}

}  // namespace k3::testing
