// The tile weight layout (ir::DType::kBF16DotT16), scalar: packing at
// compile time (passes/pack_weights.cc), element access and unpacking for the
// reference ops, the kernels without AMX and the tests.
//
// A bf16 matrix W [N, K] is cut into blocks of 16 rows (kTileRows), each
// block into steps of 32 columns (kTileCols); step s of block b is one AMX
// tile, 16 rows of 32 values, 1 KiB, stored contiguously:
//   W[n, k] at (n / 16) * 16 * Kp + (k / 32) * 512 + (n % 16) * 32 + k % 32
// with Kp = K rounded up to 32. Padding rows and columns are zero. The tile
// kernel then reads each block front to back, one sequential stream, where
// the row layout has it touch 16 rows at once (kernels/x86/avx512_amx.cc
// has the measurements).
#pragma once

#include <algorithm>
#include <cstdint>

#include "ir/dtype.h"

namespace k3 {

inline int64_t tile_block_count(int64_t n_rows) {
  return (n_rows + ir::kTileRows - 1) / ir::kTileRows;
}
// Columns of a tile matrix's rows as stored: K rounded up to 32.
inline int64_t tile_padded_cols(int64_t K) {
  return (K + ir::kTileCols - 1) / ir::kTileCols * ir::kTileCols;
}

// Offset, in elements, of W[n, k] in a tile tensor with K columns.
inline int64_t tile_index(int64_t n, int64_t k, int64_t K) {
  return n / ir::kTileRows * ir::kTileRows * tile_padded_cols(K) + k / ir::kTileCols * ir::kTileRows * ir::kTileCols +
         n % ir::kTileRows * ir::kTileCols + k % ir::kTileCols;
}

// dst (tile_block_count(N) * 16 * tile_padded_cols(K) values) <- src [N, K]
// row-major bf16 bits; padding is zero.
inline void pack_tiles(const uint16_t* src, int64_t N, int64_t K, uint16_t* dst) {
  // std::fill, not memset: an empty tensor's buffer may be null.
  std::fill(dst, dst + tile_block_count(N) * ir::kTileRows * tile_padded_cols(K), uint16_t{0});
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) dst[tile_index(n, k, K)] = src[n * K + k];
}

// dst [rows, K] row-major <- rows n0 .. n0 + rows of the tile tensor src
// (the inverse of pack_tiles for those rows).
inline void unpack_tile_rows(const uint16_t* src, int64_t n0, int64_t rows, int64_t K, uint16_t* dst) {
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t n = n0 + r;
    const uint16_t* block =
        src + n / ir::kTileRows * ir::kTileRows * tile_padded_cols(K) + n % ir::kTileRows * ir::kTileCols;
    for (int64_t k0 = 0; k0 < K; k0 += ir::kTileCols)
      std::copy_n(block + k0 * ir::kTileRows, std::min(ir::kTileCols, K - k0), dst + r * K + k0);
  }
}

}  // namespace k3
