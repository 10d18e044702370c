// Element types of IR values.
#pragma once

#include <cstdint>
#include <string_view>

namespace k3::ir {

enum class DType : uint8_t { kF32, kBF16, kF16, kI32, kI64 };

inline uint64_t dtype_size(DType t) {
  switch (t) {
    case DType::kF32: return 4;
    case DType::kBF16: return 2;
    case DType::kF16: return 2;
    case DType::kI32: return 4;
    case DType::kI64: return 8;
  }
  return 0;
}

inline std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "f32";
    case DType::kBF16: return "bf16";
    case DType::kF16: return "f16";
    case DType::kI32: return "i32";
    case DType::kI64: return "i64";
  }
  return "?";
}

}  // namespace k3::ir
