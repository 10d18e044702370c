// The tile-layout bf16 dot product (PreparedGemm::gemm of a table's
// bf16dot_tiles_prepared, ir::DType::kBF16DotT16) for tables without a tile
// kernel of their own: blocks of W rows are unpacked into rows on the stack
// and multiplied by the table's row-layout bf16 dot product, so each element
// is, bit for bit, what that table computes on the row layout (the gemm_nt
// contract: no element depends on the column split). Only the amx table
// reads the tiles directly (x86/avx512_amx.cc); the layout exists for it.
// No intrinsics; an anonymous namespace, so each translation unit compiles
// its own copy with its flags.
#pragma once

#include <cstdint>

#include "util/tiles.h"

namespace k3::kernels {
namespace {

inline constexpr int64_t kTileUnpackValues = 65536;  // 128 KiB of bf16 rows on the stack

template <void (*RowGemm)(int64_t, int64_t, int64_t, int64_t, const uint8_t*, const void*, int64_t, float*, int64_t)>
void gemm_tiles_via_rows(int64_t M, int64_t n0, int64_t n1, int64_t K, const uint8_t* P, const void* W,
                         int64_t /*ldw: implied by K*/, float* C, int64_t ldc) {
  alignas(64) uint16_t rows[kTileUnpackValues];
  const int64_t chunk = K <= 0 ? n1 - n0 : (K >= kTileUnpackValues ? 1 : kTileUnpackValues / K);
  for (int64_t n = n0; n < n1; n += chunk) {
    const int64_t r = n1 - n < chunk ? n1 - n : chunk;
    unpack_tile_rows(static_cast<const uint16_t*>(W), n, r, K, rows);
    RowGemm(M, 0, r, K, P, rows, K, C + n, ldc);
  }
}

}  // namespace
}  // namespace k3::kernels
