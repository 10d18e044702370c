// The int8 panel layout, scalar: packing a kQ8 matrix (util/quant.h) into
// panels of 16 rows, element access for the reference kernel and tests.
//
// The kQ8 row layout gives each W row's blocks one 32-bit vpdpbusd lane, so
// a tile's output is spread over 16 lanes: every (row of A, row of W) pair
// ends in a scale product per lane and a horizontal sum, and every weight
// load is xored with 0x80. That epilogue costs a third of the VNNI tile's
// time (docs/performance.md, "What bounds the int8 tile"). Panels give the
// lanes to 16 rows of W instead: one 64-byte load holds 4 consecutive
// weights of 16 rows, the activation's 4 bytes are broadcast, and each lane
// is one output, so a block ends in one scale product per 16 outputs and
// nothing is summed across lanes.
//
// Panel p holds rows 16p .. 16p + 15 of W [N, K] (K % 32 == 0) in
// q8_panel_bytes(K) = 17 K bytes (16 rows of q8_row_bytes(K)); the last
// panel is padded with rows of weight 0 and scale 0. Within a panel:
//   block b (k in [32b, 32b + 32)), at b * 512: for t = 0..7, 64 bytes:
//     row r's weights k = 32b + 4t .. 32b + 4t + 3 at 64t + 4r, each stored
//     as q + 128 (q ^ 0x80: vpdpbusd's unsigned operand; the activations
//     carry -128 x their block sum to take the offset out, as for kQ8);
//   then, at 16 K + 32 b, the 16 rows' f16 scales of block b.
// The same values and scales as the kQ8 rows they come from: weight[n, k]
// = q * scale[n, k / 32] in both.
//
// The channel-scale panels (ir::DType::kQ8CP16, `--precision int8-channel`)
// come from kQ8 rows whose blocks all hold one scale (util/quant.h,
// quantize_q8_row_channel): the same 16 K bytes of weights, then the 16
// rows' scales once, widened to f32 (64 bytes), q8c_panel_bytes(K) = 16 K +
// 64 bytes a panel; the last panel's padding rows have scale 0. The kernel
// sums each output's blocks scaled by the activations' block scales only
// and multiplies by the weight scale once at the end.
#pragma once

#include <cstdint>
#include <cstring>

#include "ir/dtype.h"
#include "util/half.h"
#include "util/panel.h"
#include "util/quant.h"

namespace k3 {

// Bytes of one panel of 16 rows of K int8 weights with their scales.
inline constexpr int64_t q8_panel_bytes(int64_t K) {
  return ir::kPanelRows * K + K / ir::kQ8Block * ir::kPanelRows * ir::kQ8ScaleBytes;
}

// Offset of weight (row c of a panel, column k) within its panel.
inline int64_t q8_panel_offset(int64_t c, int64_t k) {
  return k / ir::kQ8Block * 512 + k % ir::kQ8Block / 4 * 64 + 4 * c + k % 4;
}

// Block b's scale of row c of a panel, widened to f32.
inline float q8_panel_scale(const uint8_t* panel, int64_t K, int64_t c, int64_t b) {
  uint16_t h;
  std::memcpy(&h, panel + ir::kPanelRows * K + (b * ir::kPanelRows + c) * ir::kQ8ScaleBytes, 2);
  return f16_to_f32(h);
}

// The int8 value of row c, column k of a panel (either int8 panel kind:
// they store the values alike).
inline int8_t q8_panel_value(const uint8_t* panel, int64_t c, int64_t k) {
  return static_cast<int8_t>(panel[q8_panel_offset(c, k)] ^ 0x80);
}

// The int8 value of W[n, k] in a panel tensor with K columns.
inline int8_t q8_panel_q(const uint8_t* W, int64_t K, int64_t n, int64_t k) {
  return q8_panel_value(W + n / ir::kPanelRows * q8_panel_bytes(K), n % ir::kPanelRows, k);
}

// The f32 weight the kernels compute with: float(q) * scale (q8_weight's
// twin for panels).
inline float q8_panel_weight(const uint8_t* W, int64_t K, int64_t n, int64_t k) {
  const uint8_t* panel = W + n / ir::kPanelRows * q8_panel_bytes(K);
  return static_cast<float>(q8_panel_q(W, K, n, k)) * q8_panel_scale(panel, K, n % ir::kPanelRows, k / ir::kQ8Block);
}

// Bytes of one channel-scale panel (kQ8CP16) of 16 rows of K weights.
inline constexpr int64_t q8c_panel_bytes(int64_t K) {
  return ir::kPanelRows * K + ir::kPanelRows * ir::kQ8ChannelScaleBytes;
}

// Row c's scale in a channel-scale panel of K columns.
inline float q8c_panel_scale(const uint8_t* panel, int64_t K, int64_t c) {
  float s;
  std::memcpy(&s, panel + ir::kPanelRows * K + c * ir::kQ8ChannelScaleBytes, 4);
  return s;
}

// The int8 value of W[n, k] in a channel-scale panel tensor with K columns.
inline int8_t q8c_panel_q(const uint8_t* W, int64_t K, int64_t n, int64_t k) {
  return q8_panel_value(W + n / ir::kPanelRows * q8c_panel_bytes(K), n % ir::kPanelRows, k);
}

// The f32 weight a channel-scale panel holds: float(q) * scale[n].
inline float q8c_panel_weight(const uint8_t* W, int64_t K, int64_t n, int64_t k) {
  const uint8_t* panel = W + n / ir::kPanelRows * q8c_panel_bytes(K);
  return static_cast<float>(q8c_panel_q(W, K, n, k)) * q8c_panel_scale(panel, K, n % ir::kPanelRows);
}

// Whether each of the N kQ8 rows (src) holds one scale in all its blocks
// (bit for bit), as quantize_q8_row_channel writes them: what
// pack_q8c_panels needs.
inline bool q8_rows_share_scale(const uint8_t* src, int64_t N, int64_t K) {
  const auto rb = static_cast<int64_t>(ir::q8_row_bytes(static_cast<uint64_t>(K)));
  for (int64_t n = 0; n < N; ++n) {
    const uint8_t* row = src + n * rb;
    for (int64_t b = 1; b < K / ir::kQ8Block; ++b)
      if (std::memcmp(row + q8_scale_offset(0, K), row + q8_scale_offset(b, K), ir::kQ8ScaleBytes) != 0) return false;
  }
  return true;
}

// The int8 values of N kQ8 rows (src) into panels whose rows start pb bytes
// apart (q8_panel_offset's order, stored q + 128); padding rows hold q 0.
inline void pack_q8_panel_values(const uint8_t* src, int64_t N, int64_t K, int64_t pb, uint8_t* dst) {
  const auto rb = static_cast<int64_t>(ir::q8_row_bytes(static_cast<uint64_t>(K)));
  for (int64_t p = 0; p < panel_count(N); ++p) {
    uint8_t* panel = dst + p * pb;
    std::memset(panel, 0x80, static_cast<size_t>(ir::kPanelRows * K));  // q 0
    for (int64_t c = 0; c < ir::kPanelRows && p * ir::kPanelRows + c < N; ++c) {
      const uint8_t* row = src + (p * ir::kPanelRows + c) * rb;
      for (int64_t k = 0; k < K; ++k) panel[q8_panel_offset(c, k)] = row[q8_offset(k, K)] ^ 0x80;
    }
  }
}

// dst (panel_count(N) * q8c_panel_bytes(K) bytes) <- src, N kQ8 rows that
// share a scale each (q8_rows_share_scale; block 0's is the row's, and a
// row of no blocks, K = 0, has none: scale 0).
inline void pack_q8c_panels(const uint8_t* src, int64_t N, int64_t K, uint8_t* dst) {
  const int64_t pb = q8c_panel_bytes(K);
  const auto rb = static_cast<int64_t>(ir::q8_row_bytes(static_cast<uint64_t>(K)));
  pack_q8_panel_values(src, N, K, pb, dst);
  for (int64_t p = 0; p < panel_count(N); ++p) {
    uint8_t* scales = dst + p * pb + ir::kPanelRows * K;
    for (int64_t c = 0; c < ir::kPanelRows; ++c) {
      const int64_t n = p * ir::kPanelRows + c;
      const float s = n < N && K > 0 ? q8_scale(src + n * rb, K, 0) : 0.0f;
      std::memcpy(scales + c * ir::kQ8ChannelScaleBytes, &s, 4);
    }
  }
}

// dst (panel_count(N) * q8_panel_bytes(K) bytes) <- src, N kQ8 rows.
inline void pack_q8_panels(const uint8_t* src, int64_t N, int64_t K, uint8_t* dst) {
  const int64_t pb = q8_panel_bytes(K);
  const auto rb = static_cast<int64_t>(ir::q8_row_bytes(static_cast<uint64_t>(K)));
  pack_q8_panel_values(src, N, K, pb, dst);
  for (int64_t p = 0; p < panel_count(N); ++p) {
    uint8_t* panel = dst + p * pb;
    std::memset(panel + ir::kPanelRows * K, 0, static_cast<size_t>(pb - ir::kPanelRows * K));  // scale 0
    for (int64_t c = 0; c < ir::kPanelRows && p * ir::kPanelRows + c < N; ++c) {
      const uint8_t* row = src + (p * ir::kPanelRows + c) * rb;
      for (int64_t b = 0; b < K / ir::kQ8Block; ++b)
        std::memcpy(panel + ir::kPanelRows * K + (b * ir::kPanelRows + c) * ir::kQ8ScaleBytes,
                    row + q8_scale_offset(b, K), ir::kQ8ScaleBytes);
    }
  }
}

}  // namespace k3
