// Writing and reading .k3m files (format: k3m_format.h, docs/k3m-format.md).
#pragma once

#include <string>

#include "compiled/compiled_model.h"
#include "util/mapped_file.h"
#include "util/status.h"

namespace k3 {

// Writes atomically (to PATH.tmp, then renamed). Weights are copied from
// wherever the graphs' weight values point.
Status write_k3m(const CompiledModel& model, const std::string& path);

struct K3mReadOptions {
  // Hash the whole weight section at load. It touches every page once (the
  // first decode steps would anyway); turn off only for tools that read the
  // metadata alone.
  bool verify_data = true;
  // kMap: map the file (instant, shares the page cache). kRead: read it into
  // 2 MiB-page memory, faster to stream at decode (util/mapped_file.h).
  FileLoad load = FileLoad::kMap;
};

// Maps (or reads) and validates the file; weight values point into that
// memory, which the returned model's `storage` keeps alive.
StatusOr<CompiledModel> read_k3m(const std::string& path, const K3mReadOptions& options = {});

// True when `path` is a regular file that starts with the .k3m magic.
bool is_k3m_file(const std::string& path);

}  // namespace k3
