// The panel weight layouts (ir::DType::kF32P16 / kBF16P16), scalar: packing
// at compile time (passes/pack_weights.cc), element access for the reference
// ops and kernels, unpacking for tests and tools.
//
// A matrix W [N, K] (PyTorch [out, in]) is cut into panels of 16 rows
// (kPanelRows); panel p holds rows 16p .. 16p+15 stored k-major: element
// (n, k) sits at p * K * 16 + k * 16 + slot(n % 16). The last panel is zero-
// padded to 16 rows. One k step of a panel is then 16 contiguous weights,
// which the gemm kernels multiply by one broadcast activation: every output
// is a single FMA chain over k, with no horizontal sums (kernels.h).
//
// f32 panels use slot(c) = c. bf16 panels swap columns 4-7 and 8-11, so that
// interleaving zeros below the 16-bit values inside each 128-bit half (AVX2
// unpacklo/unpackhi) widens one 32-byte load to columns 0-7 and 8-15 in order.
#pragma once

#include <algorithm>
#include <cstdint>

#include "ir/dtype.h"

namespace k3 {

inline constexpr int kBf16PanelSlot[ir::kPanelRows] = {0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15};

inline int64_t panel_count(int64_t n_rows) {
  return (n_rows + ir::kPanelRows - 1) / ir::kPanelRows;
}

// Offset, in elements, of W[n, k] in a panel tensor with K columns.
inline int64_t panel_index(int64_t n, int64_t k, int64_t K, bool bf16) {
  const int64_t c = n % ir::kPanelRows;
  return n / ir::kPanelRows * K * ir::kPanelRows + k * ir::kPanelRows + (bf16 ? kBf16PanelSlot[c] : c);
}

// dst (panel_count(N) * 16 * K elements) <- src [N, K] row-major; T is float
// or uint16_t (bf16 bits). Padding rows are zero.
template <class T>
void pack_panels(const T* src, int64_t N, int64_t K, T* dst) {
  const bool bf16 = sizeof(T) == 2;
  // std::fill, not memset: an empty tensor's buffer may be null.
  std::fill(dst, dst + panel_count(N) * ir::kPanelRows * K, T{0});
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) dst[panel_index(n, k, K, bf16)] = src[n * K + k];
}

// dst [N, K] row-major <- src panels (the inverse of pack_panels).
template <class T>
void unpack_panels(const T* src, int64_t N, int64_t K, T* dst) {
  const bool bf16 = sizeof(T) == 2;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) dst[n * K + k] = src[panel_index(n, k, K, bf16)];
}

}  // namespace k3
