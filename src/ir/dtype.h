// Element types of IR values.
//
// The first five are what checkpoints and the fused ops use; kF64, kI8, kU8
// and kBool exist for imported ONNX graphs (masks, Cast targets, test data).
// kBool is stored as one byte holding 0 or 1.
#pragma once

#include <cstdint>
#include <string_view>

namespace k3::ir {

enum class DType : uint8_t { kF32, kBF16, kF16, kI32, kI64, kF64, kI8, kU8, kBool };

inline uint64_t dtype_size(DType t) {
  switch (t) {
    case DType::kF32:
      return 4;
    case DType::kBF16:
      return 2;
    case DType::kF16:
      return 2;
    case DType::kI32:
      return 4;
    case DType::kI64:
      return 8;
    case DType::kF64:
      return 8;
    case DType::kI8:
      return 1;
    case DType::kU8:
      return 1;
    case DType::kBool:
      return 1;
  }
  return 0;
}

inline std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::kF32:
      return "f32";
    case DType::kBF16:
      return "bf16";
    case DType::kF16:
      return "f16";
    case DType::kI32:
      return "i32";
    case DType::kI64:
      return "i64";
    case DType::kF64:
      return "f64";
    case DType::kI8:
      return "i8";
    case DType::kU8:
      return "u8";
    case DType::kBool:
      return "bool";
  }
  return "?";
}

inline bool dtype_is_float(DType t) {
  return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16 || t == DType::kF64;
}
inline bool dtype_is_int(DType t) {
  return t == DType::kI32 || t == DType::kI64 || t == DType::kI8 || t == DType::kU8;
}

}  // namespace k3::ir
