// Writing and reading float32 .npy files (NumPy's format, version 1.0), for
// tensor dumps that Python tools compare against.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "util/status.h"

namespace k3 {

Status write_npy_f32(const std::string& path, const float* data, const std::vector<int64_t>& shape);

struct NpyArray {
  std::vector<int64_t> shape;
  std::vector<float> data;
};
// Reads a little-endian float32, C-order .npy file.
StatusOr<NpyArray> read_npy_f32(const std::string& path);

}  // namespace k3
