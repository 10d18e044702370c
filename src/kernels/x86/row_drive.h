// The tile walk of the row-layout GEMMs (gemm_nt, gemm_nt_bf16 and
// gemm_nt_bf16dot of the AVX2 and AVX-512 tables): which W rows each tile
// reads, in which order, and what it prefetches. The tables supply their own
// tiles. No intrinsics; an anonymous namespace, so each ISA translation unit
// compiles its own copy with its own flags.
//
// Decode (M <= far_max_m) reads W rows that lie far apart: a tile's nr rows
// are n0 + i, n0 + i + q, n0 + i + 2q, ... (q = (n1 - n0) / nr), so each
// thread keeps nr sequential streams open instead of the one that adjacent
// rows make for the prefetchers (avx2.cc, kFarMaxM, has the measurements).
// The rows left over, and every row at larger M, go through adjacent tiles.
// The M loop sits inside the N loop so each tile of W is read from memory
// once and reused from L1 by every row tile of A: for decode W is streamed
// exactly once. None of this changes any element's arithmetic (the gemm_nt
// contract).
#pragma once

#include <cstdint>

namespace k3::kernels {
namespace {

struct RowTiling {
  int64_t max_mr;     // rows of A per tile
  int64_t adj_nr;     // W rows per adjacent tile
  int64_t far_max_m;  // calls of at most this many rows use far tiles first
  int64_t far_nr_m2;  // far streams (W rows per tile) when M <= 2
  int64_t far_nr;     // far streams when 2 < M <= far_max_m
};

// tile(mr, nr) is the table's tile for mr rows of A against nr W rows, called
// as tile(mr, nr)(K, a, lda, w, w_stride, c, ldc, cs, prefetch): output j of
// row i goes to c[i * ldc + j * cs]; prefetch, if set, is the next tile's
// first W row (same stride).
template <class AT, class WT, class TileFor>
void drive_row_tiles(const RowTiling& t, int64_t M, int64_t n0, int64_t n1, int64_t K, const AT* A, int64_t lda,
                     const WT* W, int64_t ldw, float* C, int64_t ldc, TileFor tile) {
  auto row_tiles = [&](int64_t nr, const WT* w, int64_t w_stride, int64_t n, int64_t cs, const WT* next) {
    for (int64_t m = 0; m < M; m += t.max_mr) {
      const int64_t mr = M - m < t.max_mr ? M - m : t.max_mr;
      // Only the first row tile prefetches; the later ones find the rows in cache.
      tile(mr, nr)(K, A + m * lda, lda, w, w_stride, C + m * ldc + n, ldc, cs, m == 0 ? next : nullptr);
    }
  };
  if (M <= t.far_max_m) {
    const int64_t nr = M <= 2 ? t.far_nr_m2 : t.far_nr;
    const int64_t q = (n1 - n0) / nr;
    for (int64_t i = 0; i < q; ++i) {
      const WT* w = W + (n0 + i) * ldw;
      row_tiles(nr, w, q * ldw, n0 + i, q, i + 1 < q ? w + ldw : nullptr);  // the next row of every stream
    }
    n0 += q * nr;
  }
  for (int64_t n = n0; n < n1; n += t.adj_nr) {
    const int64_t nr = n1 - n < t.adj_nr ? n1 - n : t.adj_nr;
    const WT* w = W + n * ldw;
    // Prefetch the next tile only when it is a full one (all its rows exist).
    row_tiles(nr, w, ldw, n, 1, n + 2 * t.adj_nr <= n1 ? w + t.adj_nr * ldw : nullptr);
  }
}

}  // namespace
}  // namespace k3::kernels
