// Column ranges of the panel GEMMs (gemm_nt_p16 / gemm_nt_bf16p16), shared by
// the AVX2 and AVX-512 tables: a range [n0, n1) is split into the whole
// panels the table's tiles run over and the partial panels at its edges
// (a thread's share may cut a panel), which are computed whole into a stack
// tile and copied out. No intrinsics. Everything is in an anonymous
// namespace, so each ISA translation unit compiles its own copy with its own
// flags and no inline function is shared between them at link time.
#pragma once

#include <cstdint>

namespace k3::kernels {
namespace {

constexpr int64_t kPanel = 16;  // rows of W per panel (ir::kPanelRows)

// whole(p0, p1): C[M, 16 * p0 .. 16 * p1) over whole panels.
// tile(m, mr, panel, out): rows m .. m + mr of A (mr <= kTileMr) against one
// whole panel into out[mr, 16] (row stride 16).
template <int64_t kTileMr, class WholeFn, class TileFn>
void gemm_panels_split(int64_t M, int64_t n0, int64_t n1, float* C, int64_t ldc, WholeFn whole, TileFn tile) {
  if (n0 >= n1 || M <= 0) return;
  // Columns [c0, c1) of panel p.
  auto part = [&](int64_t p, int64_t c0, int64_t c1) {
    alignas(64) float tmp[kTileMr * kPanel];
    for (int64_t m = 0; m < M; m += kTileMr) {
      const int64_t mr = M - m < kTileMr ? M - m : kTileMr;
      tile(m, mr, p, tmp);
      for (int64_t i = 0; i < mr; ++i)
        for (int64_t c = c0; c < c1; ++c) C[(m + i) * ldc + p * kPanel + c] = tmp[i * kPanel + c];
    }
  };
  const int64_t first_whole = (n0 + kPanel - 1) / kPanel, end_whole = n1 / kPanel;
  if (first_whole > end_whole) {  // the range lies inside one panel
    part(n0 / kPanel, n0 % kPanel, n1 % kPanel);
    return;
  }
  if (n0 % kPanel != 0) part(n0 / kPanel, n0 % kPanel, kPanel);
  whole(first_whole, end_whole);
  if (n1 % kPanel != 0) part(end_whole, 0, n1 % kPanel);
}

}  // namespace
}  // namespace k3::kernels
