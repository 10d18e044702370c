// Element types of IR values.
//
// The first five are what checkpoints and the fused ops use; kF64, kI8, kU8
// and kBool exist for imported ONNX graphs (masks, Cast targets, test data).
// kBool is stored as one byte holding 0 or 1.
//
// kQ8 is the compiler's int8 weight format (`k3 compile --precision int8`),
// a block-quantized matrix [N, K] with K a multiple of kQ8Block: each row is
// groups of 16 blocks, a group's int8 values followed by its f16 scales
// (util/quant.h), weight[n, k] = float(q[n, k]) * scale[n, k / 32]. It is not per-element sized, so byte
// counts go through dtype_bytes(), never numel * dtype_size().
//
// kF32P16 and kBF16P16 are the compiler's panel layouts of a matrix [N, K]
// (util/panel.h): column panels of 16 rows of W, each stored k-major
// ([K][16]), the last panel zero-padded to 16. Also not per-element sized.
//
// kQ8P16 is a kQ8 matrix in the compiler's int8 panel layout (`k3 compile
// --precision int8 --weight-layout panels`, util/q8_panel.h): panels of 16
// rows, each block of 32 columns stored as 8 steps of 4 weights of the 16
// rows (offset by 128), then the panel's f16 scales; the last panel padded
// with zero weights. The same weights as the kQ8 rows; not per-element sized.
//
// kQ8CP16 is the int8 panel layout of a matrix quantized with one scale per
// output channel (`k3 compile --precision int8-channel --weight-layout
// panels`, util/q8_panel.h): each panel's 16 K int8 values in kQ8P16's
// order, then its 16 rows' f32 scales (64 bytes, so every panel starts
// 64-byte aligned), weight[n, k] = float(q[n, k]) * scale[n]. With one
// weight scale per output the panel kernel applies it once, after the
// blocks, instead of once per block. Not per-element sized.
//
// kBF16Dot is a bf16 matrix stored exactly as kBF16 (rows of K bf16) whose
// products take the activations rounded to bf16 too (`k3 compile
// --precision bf16`; kernels.h, gemm_nt_bf16dot): bf16 x bf16 dot products,
// f32 sums, as vdpbf16ps computes them. kBF16 weights (a bf16 checkpoint)
// multiply f32 activations.
//
// kBF16DotT16 is a kBF16Dot matrix in the compiler's tile layout
// (`k3 compile --weight-layout tiles`, util/tiles.h): blocks of 16 rows, each
// stored as its 32-column steps one after another, a step's 16 rows of 32
// values contiguous (1 KiB, one AMX tile); rows padded to 16 and columns to
// 32 with zeros. The same products as kBF16Dot, read in the order the AMX
// tile loads take them.
//
// kBF16DotP16 is a kBF16Dot matrix in kBF16P16's panel layout (`k3 compile
// --precision bf16 --weight-layout panels`, util/panel.h): the same bytes
// as bf16 panels, multiplied with the activations rounded to bf16 first
// (kernels.h, bf16dotp16_prepared), so the products stay those of
// `--precision bf16` while the panel kernels compute them with FMAs.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

#include "util/checked.h"

namespace k3::ir {

enum class DType : uint8_t {
  kF32,
  kBF16,
  kF16,
  kI32,
  kI64,
  kF64,
  kI8,
  kU8,
  kBool,
  kQ8,
  kF32P16,
  kBF16P16,
  kBF16Dot,
  kBF16DotT16,
  kQ8P16,
  kQ8CP16,
  kBF16DotP16
};

// Elements per kQ8 scale (a block of one row).
inline constexpr int64_t kQ8Block = 32;
// Longest kBF16Dot row (kernels::kBf16DotMaxK; the kernels round a chunk
// of activation rows into a stack buffer).
inline constexpr int64_t kBF16DotMaxCols = 32768;
// Rows of W per panel of the kF32P16 / kBF16P16 / kBF16DotP16 layouts.
inline constexpr int64_t kPanelRows = 16;
// Rows and columns of one kBF16DotT16 tile (16 x 32 bf16 = 1 KiB).
inline constexpr int64_t kTileRows = 16;
inline constexpr int64_t kTileCols = 32;
// Linear splits are multiples of kPanelRows (shape_rules.cc), so a split's
// first row starts a tile block too (runtime/ops/op_call.h, gemm_weight).
static_assert(kTileRows == kPanelRows);

// Longest kQ8 row the int8 kernels take (their rounded activations live on
// the stack): kernels::kQ8MaxK, checked equal in kernels/ref/scalar.cc.
inline constexpr int64_t kQ8MaxCols = 32768;
// Bytes of one kQ8 block scale (f16, util/quant.h).
inline constexpr int64_t kQ8ScaleBytes = 2;
// Blocks of a kQ8 row group, and the bytes of a full one: its int8 values,
// then their scales (util/quant.h).
inline constexpr int64_t kQ8GroupBlocks = 16;
inline constexpr int64_t kQ8GroupBytes = kQ8GroupBlocks * (kQ8Block + kQ8ScaleBytes);
// Bytes of one kQ8CP16 channel scale (f32, util/q8_panel.h).
inline constexpr int64_t kQ8ChannelScaleBytes = 4;
// Bytes of one kQ8 row of k elements (k % kQ8Block == 0).
inline constexpr uint64_t q8_row_bytes(uint64_t k) {
  return k + k / kQ8Block * kQ8ScaleBytes;
}

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
    case DType::kQ8:
      return 1;  // the int8 values only; see dtype_bytes()
    case DType::kF32P16:
      return 4;  // per stored element; see dtype_bytes() for the padding
    case DType::kBF16P16:
    case DType::kBF16DotP16:
      return 2;
    case DType::kBF16Dot:
      return 2;
    case DType::kBF16DotT16:
      return 2;  // per stored element; see dtype_bytes() for the padding
    case DType::kQ8P16:
    case DType::kQ8CP16:
      return 1;  // the int8 values only; see dtype_bytes()
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
    case DType::kQ8:
      return "q8";
    case DType::kF32P16:
      return "f32p16";
    case DType::kBF16P16:
      return "bf16p16";
    case DType::kBF16Dot:
      return "bf16dot";
    case DType::kBF16DotT16:
      return "bf16dot_t16";
    case DType::kQ8P16:
      return "q8p16";
    case DType::kQ8CP16:
      return "q8cp16";
    case DType::kBF16DotP16:
      return "bf16dot_p16";
  }
  return "?";
}

// Bytes of a tensor of this dtype and shape, or nullopt when the shape is
// invalid for it (negative dims, overflow, an int8 tensor whose rows are
// not whole blocks, a panel or tile tensor that is not a matrix).
inline std::optional<uint64_t> dtype_bytes(DType t, std::span<const int64_t> shape) {
  if (t == DType::kF32P16 || t == DType::kBF16P16 || t == DType::kBF16DotP16 || t == DType::kQ8P16 ||
      t == DType::kQ8CP16) {
    if (shape.size() != 2 || shape[0] < 0 || shape[0] > INT64_MAX - kPanelRows) return std::nullopt;
    const int64_t padded[2] = {(shape[0] + kPanelRows - 1) / kPanelRows * kPanelRows, shape[1]};
    // int8 panels: whole panels of 16 kQ8 rows (util/q8_panel.h).
    if (t == DType::kQ8P16) return dtype_bytes(DType::kQ8, padded);
    if (t == DType::kQ8CP16) {  // 16 K int8 values and 16 f32 scales a panel
      if (shape[1] < 0 || shape[1] % kQ8Block != 0) return std::nullopt;
      const auto q = checked_numel_bytes(padded, 1);
      if (!q) return std::nullopt;
      const auto scales = checked_mul(static_cast<uint64_t>(padded[0]), uint64_t{kQ8ChannelScaleBytes});
      if (!scales) return std::nullopt;
      return checked_add(*q, *scales);
    }
    return checked_numel_bytes(padded, dtype_size(t));
  }
  if (t == DType::kBF16DotT16) {
    if (shape.size() != 2 || shape[0] < 0 || shape[1] < 0 || shape[0] > INT64_MAX - kTileRows ||
        shape[1] > INT64_MAX - kTileCols)
      return std::nullopt;
    const int64_t padded[2] = {(shape[0] + kTileRows - 1) / kTileRows * kTileRows,
                               (shape[1] + kTileCols - 1) / kTileCols * kTileCols};
    return checked_numel_bytes(padded, dtype_size(t));
  }
  if (t != DType::kQ8) return checked_numel_bytes(shape, dtype_size(t));
  if (shape.empty() || shape.back() % kQ8Block != 0) return std::nullopt;
  auto n = checked_numel_bytes(shape, 1);
  if (!n) return std::nullopt;
  return *n + *n / kQ8Block * kQ8ScaleBytes;
}

// The compiler's int8 weight formats (rows, panels, channel-scale panels):
// the int8 kernels' products, whose activations are rounded to int8.
inline bool dtype_is_q8(DType t) {
  return t == DType::kQ8 || t == DType::kQ8P16 || t == DType::kQ8CP16;
}

inline bool dtype_is_float(DType t) {
  return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16 || t == DType::kF64;
}
inline bool dtype_is_int(DType t) {
  return t == DType::kI32 || t == DType::kI64 || t == DType::kI8 || t == DType::kU8;
}

}  // namespace k3::ir
