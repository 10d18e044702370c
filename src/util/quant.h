// The int8 weight format (ir::DType::kQ8), scalar: quantize at compile time,
// dequantize for the reference ops and tests.
//
// Symmetric absmax per block of 32 consecutive weights of a row:
//   scale = max|w| / 127 rounded up to an f16,  q = round-to-nearest-even(w / scale) in [-127, 127]
//   (an all-zero block has scale 0 and q 0; a block holding NaN or inf, or a
//   weight beyond kQ8MaxAbs, has scale NaN and q 0, so it yields NaN as f32
//   would for NaN and inf, and never a silently zeroed block).
// A row of K weights (K % 32 == 0) is stored in groups of 16 blocks (512
// weights; the row's last group holds the r = 1..16 blocks that are left):
// a group's r * 32 int8 values, then its r f16 scales, so q8_row_bytes(K) =
// 1.0625 K bytes and a row is read front to back, its scales inside the
// stream. (Up to .k3m version 3 all K/32 scales followed all K values: a
// 1536-wide row then read its scales 1.5 KiB ahead of its values, and one
// AVX2 thread streamed the experts' down projections at 10-13 GB/s against
// 14-18 with the scales in cache; docs/performance.md.) These are
// llama.cpp's Q8_0 bytes (32 int8 + an f16 scale per block), in another
// order. The scale is rounded up, so max|w| / scale <= 127
// and no weight is clamped; a block with max|w| < 7.8e-3 gets a subnormal
// scale (a coarser grid, steps no finer than 6e-8), and one whose scale would
// overflow f16 (max|w| > kQ8MaxAbs) is not quantized at all: the compiler
// keeps such a matrix f32.
//
// The int8 values are interleaved four bytes at a time across a group's
// blocks: group g's values store, for t = 0..7, bytes 4t..4t+3 of each of its
// r blocks in turn. So one 64-byte load of a full group gives 4 consecutive
// weights of 16 different blocks: a 32-bit lane per block, which is what
// VNNI's vpdpbusd accumulates (lane l sums block l's 32 products exactly in 8
// steps), and a group's 16 scales are one vector. q8_offset has the map.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "ir/dtype.h"
#include "util/half.h"

namespace k3 {

// Largest weight magnitude the int8 format stores: 127 x the largest f16.
inline constexpr float kQ8MaxAbs = 127.0f * 65504.0f;

// Blocks in group g of a kQ8 row of k_dim weights: 16, or what is left.
inline int64_t q8_group_blocks(int64_t g, int64_t k_dim) {
  const int64_t blocks = k_dim / ir::kQ8Block - g * ir::kQ8GroupBlocks;
  return blocks < ir::kQ8GroupBlocks ? blocks : ir::kQ8GroupBlocks;
}

// Byte offset of weight k within a kQ8 row of k_dim weights (the layout above).
inline int64_t q8_offset(int64_t k, int64_t k_dim) {
  const int64_t g = k / 512, r = q8_group_blocks(g, k_dim);
  const int64_t l = k % 512 / ir::kQ8Block, i = k % ir::kQ8Block;
  return g * ir::kQ8GroupBytes + i / 4 * (4 * r) + 4 * l + i % 4;
}

// Byte offset of block b's f16 scale within a kQ8 row of k_dim weights:
// after its group's values.
inline int64_t q8_scale_offset(int64_t b, int64_t k_dim) {
  const int64_t g = b / ir::kQ8GroupBlocks;
  return g * ir::kQ8GroupBytes + q8_group_blocks(g, k_dim) * ir::kQ8Block + b % ir::kQ8GroupBlocks * ir::kQ8ScaleBytes;
}

// The f16 scale of weights whose largest magnitude is amax (finite: all of
// them are): amax / 127 rounded up, so amax / scale <= 127 and no weight is
// clamped; NaN when a weight is NaN or inf, or beyond kQ8MaxAbs (the scale
// would overflow to inf and zero every weight: poison them instead; the
// compiler never gets there, it keeps such matrices f32).
inline uint16_t q8_scale_for(float amax, bool finite) {
  // A NaN or inf weight makes the scale NaN (q 0), so the products it feeds
  // are NaN, as in f32, instead of a clamped finite value.
  if (!finite || !(amax <= kQ8MaxAbs)) return f32_to_f16(std::numeric_limits<float>::quiet_NaN());
  uint16_t h = f32_to_f16(amax / 127.0f);
  if (f16_to_f32(h) < amax / 127.0f) ++h;  // round up: |w| / scale <= 127
  return h;
}

// Block b of a kQ8 row of k_dim weights (dst) <- x[0..32) on the f16 scale h.
inline void quantize_q8_block(const float* x, uint16_t h, int64_t b, int64_t k_dim, uint8_t* dst) {
  const float scale = f16_to_f32(h);
  for (int64_t i = 0; i < ir::kQ8Block; ++i) {
    // scale NaN (poisoned) or 0 (all-zero weights): q 0.
    const float q = !(scale > 0.0f) ? 0.0f : std::nearbyint(x[i] / scale);
    const float clamped = std::fmin(127.0f, std::fmax(-127.0f, q));
    dst[q8_offset(b * ir::kQ8Block + i, k_dim)] = static_cast<uint8_t>(static_cast<int8_t>(clamped));
  }
  std::memcpy(dst + q8_scale_offset(b, k_dim), &h, 2);
}

// Largest magnitude of x[0..n), and whether every value is finite.
inline float q8_absmax(const float* x, int64_t n, bool& finite) {
  float amax = 0.0f;
  finite = true;
  for (int64_t i = 0; i < n; ++i) {
    finite = finite && std::isfinite(x[i]);
    amax = std::fmax(amax, std::fabs(x[i]));
  }
  return amax;
}

// src: [K] f32; dst: q8_row_bytes(K) bytes, one scale per block of 32.
inline void quantize_q8_row(const float* src, int64_t k_dim, uint8_t* dst) {
  for (int64_t b = 0; b < k_dim / ir::kQ8Block; ++b) {
    bool finite;
    const float amax = q8_absmax(src + b * ir::kQ8Block, ir::kQ8Block, finite);
    quantize_q8_block(src + b * ir::kQ8Block, q8_scale_for(amax, finite), b, k_dim, dst);
  }
}

// The same row quantized with one scale for the whole row (a per-output-
// channel scale, `--precision int8-channel`): the row's absmax / 127 rounded
// up to an f16, written into every block's scale slot, so the row kernels
// read it as any kQ8 row and the panel packer (util/q8_panel.h,
// pack_q8c_panels) keeps it once. A NaN or inf weight poisons the whole row,
// as it makes the row's every output NaN in f32.
inline void quantize_q8_row_channel(const float* src, int64_t k_dim, uint8_t* dst) {
  bool finite;
  const float amax = q8_absmax(src, k_dim, finite);
  const uint16_t h = q8_scale_for(amax, finite);
  for (int64_t b = 0; b < k_dim / ir::kQ8Block; ++b) quantize_q8_block(src + b * ir::kQ8Block, h, b, k_dim, dst);
}

// Block `block`'s scale, widened to f32.
inline float q8_scale(const uint8_t* row, int64_t k_dim, int64_t block) {
  uint16_t h;
  std::memcpy(&h, row + q8_scale_offset(block, k_dim), 2);
  return f16_to_f32(h);
}

// The f32 weight the kernels compute with: float(q) * scale.
inline float q8_weight(const uint8_t* row, int64_t k_dim, int64_t k) {
  const float scale = q8_scale(row, k_dim, k / ir::kQ8Block);
  return static_cast<float>(static_cast<int8_t>(row[q8_offset(k, k_dim)])) * scale;
}

// src: q8_row_bytes(K) bytes; dst: [K] f32.
inline void dequantize_q8_row(const uint8_t* src, int64_t k_dim, float* dst) {
  for (int64_t k = 0; k < k_dim; ++k) dst[k] = q8_weight(src, k_dim, k);
}

// The kernels' rounding of one activation row to int8 per block of 32
// (kernels.h, gemm_nt_q8; llama.cpp's Q8_0 activations): scale = max|a| /
// 127, q = round-to-nearest-even(a * (127 / max|a|)) in [-127, 127], in
// natural order; a block whose largest magnitude is below 2^-100 counts as
// all zero (scale 0, q 0: 127 / max|a| could overflow), a block holding NaN or inf
// has scale NaN and q 0 (the row's results are NaN, as in f32, not a
// saturated finite value). The SIMD tables do the same float operations (one
// division, one multiply, one rounding), so the integers agree exactly.
inline void quantize_a8_row(const float* a, int64_t k_dim, int8_t* q, float* scales) {
  for (int64_t b = 0; b < k_dim / ir::kQ8Block; ++b) {
    const float* x = a + b * ir::kQ8Block;
    bool finite;
    const float amax = q8_absmax(x, ir::kQ8Block, finite);
    if (!finite) {  // NaN or inf: the block's scale is NaN, so every product it feeds is NaN
      scales[b] = std::numeric_limits<float>::quiet_NaN();
      for (int64_t i = 0; i < ir::kQ8Block; ++i) q[b * ir::kQ8Block + i] = 0;
      continue;
    }
    const bool zero = amax < 0x1p-100f;
    const float inv = zero ? 0.0f : 127.0f / amax;
    scales[b] = zero ? 0.0f : amax / 127.0f;
    for (int64_t i = 0; i < ir::kQ8Block; ++i)
      q[b * ir::kQ8Block + i] = static_cast<int8_t>(std::nearbyint(x[i] * inv));
  }
}

}  // namespace k3
