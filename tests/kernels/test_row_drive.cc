// The row-layout tile walk (kernels/x86/row_drive.h) with a recording tile:
// every output written exactly once by a tile that read its W row, and the
// prefetch each tile is handed (which rows, from which row tiles). The walk
// holds no intrinsics, so it is tested here without the ISA tables.
#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <vector>

#include "kernels/x86/row_drive.h"

namespace k3::kernels {
namespace {

// The AVX-512 and AVX2 tables' tiling (x86/avx512.cc, x86/avx2.cc).
constexpr RowTiling kTiling = {.max_mr = 4, .adj_nr = 4, .far_max_m = 8, .far_nr_m2 = 4, .far_nr = 4};

struct Call {
  int64_t mr, nr, a_row, w_row, w_stride_rows, cs;
  int64_t prefetch_row;  // -1: none
};

struct Walk {
  std::vector<Call> calls;
  std::vector<int> writes;  // per output (i * N + n)
};

// Runs the walk over rows [n0, n1) of an N-row W (K 1: a row is one float)
// and M rows of A; each tile call writes its outputs into C and is recorded.
Walk walk(int64_t M, int64_t n0, int64_t n1, int64_t N) {
  std::vector<float> A(static_cast<size_t>(M)), W(static_cast<size_t>(N)), C(static_cast<size_t>(M * N), 0.0f);
  Walk out;
  out.writes.assign(static_cast<size_t>(M * N), 0);
  const float* a0 = A.data();
  const float* w0 = W.data();
  float* c0 = C.data();
  auto tile_for = [&](int64_t mr, int64_t nr) {
    // A recording tile for (mr, nr): the walk calls it at once, as it calls a table tile.
    return [&, mr, nr](int64_t, const float* a, int64_t lda, const float* w, int64_t w_stride, float* c, int64_t ldc,
                       int64_t cs, const float* prefetch) {
      EXPECT_EQ(lda, 1);
      EXPECT_EQ(ldc, N);
      const int64_t a_row = a - a0, w_row = w - w0;
      out.calls.push_back({mr, nr, a_row, w_row, w_stride, cs, prefetch != nullptr ? prefetch - w0 : -1});
      const int64_t c_off = c - c0;
      for (int64_t i = 0; i < mr; ++i)
        for (int64_t j = 0; j < nr; ++j) {
          // The output a tile writes for W row w_row + j * w_stride is that row's column.
          const int64_t at = c_off + i * ldc + j * cs;
          EXPECT_EQ(at % N, w_row + j * w_stride);
          EXPECT_EQ(at / N, a_row + i);
          ++out.writes[static_cast<size_t>(at)];
        }
    };
  };
  drive_row_tiles(kTiling, M, n0, n1, int64_t{1}, a0, int64_t{1}, w0, int64_t{1}, c0, N, tile_for);
  return out;
}

TEST(RowDrive, EveryOutputOnceForEveryM) {
  for (int64_t M = 1; M <= 12; ++M)
    for (auto [n0, n1] : {std::pair<int64_t, int64_t>{0, 37}, {5, 64}, {3, 4}, {0, 16}}) {
      const int64_t N = 64;
      const Walk w = walk(M, n0, n1, N);
      for (int64_t i = 0; i < M; ++i)
        for (int64_t n = 0; n < N; ++n)
          EXPECT_EQ(w.writes[static_cast<size_t>(i * N + n)], n >= n0 && n < n1 ? 1 : 0)
              << "M " << M << " n " << n << " in [" << n0 << ", " << n1 << ")";
    }
}

// Decode with one row tile (M <= 4): 4 far streams, only that tile prefetches,
// and it fetches the next row of every stream.
TEST(RowDrive, OneRowTilePrefetchesTheNextRow) {
  for (int64_t M : {1, 3, 4}) {
    const Walk w = walk(M, 0, 40, 40);  // q = 10 rows per stream
    int64_t far = 0;
    for (const Call& c : w.calls) {
      if (c.w_stride_rows != 10) continue;  // only the far tiles
      ++far;
      EXPECT_EQ(c.a_row, 0);
      EXPECT_EQ(c.nr, 4);
      EXPECT_EQ(c.prefetch_row, c.w_row + 1 < 10 ? c.w_row + 1 : -1) << "M " << M << " row " << c.w_row;
    }
    EXPECT_EQ(far, 10);
  }
}

// Decode with two row tiles (M 5-8): both prefetch, two rows ahead.
TEST(RowDrive, TwoRowTilesBothPrefetchTwoRowsAhead) {
  for (int64_t M : {5, 8}) {
    const Walk w = walk(M, 0, 40, 40);
    std::map<int64_t, int> tiles_per_row;
    for (const Call& c : w.calls) {
      ASSERT_EQ(c.w_stride_rows, 10);  // 40 rows: all in far tiles
      ++tiles_per_row[c.w_row];
      EXPECT_EQ(c.prefetch_row, c.w_row + 2 < 10 ? c.w_row + 2 : -1)
          << "M " << M << " row " << c.w_row << " A row " << c.a_row;
    }
    EXPECT_EQ(tiles_per_row.size(), 10u);
    for (const auto& [row, n] : tiles_per_row) EXPECT_EQ(n, 2) << "row " << row;
  }
}

// Prefill (M > 8): adjacent tiles, only the first row tile prefetches, and
// only a next tile that is whole.
TEST(RowDrive, PrefillFirstRowTilePrefetchesTheNextWholeTile) {
  const Walk w = walk(12, 0, 10, 10);  // W tiles at rows 0, 4, 8 (the last of 2 rows)
  for (const Call& c : w.calls) {
    EXPECT_EQ(c.w_stride_rows, 1);
    const int64_t expect = c.a_row == 0 && c.w_row + 8 <= 10 ? c.w_row + 4 : -1;
    EXPECT_EQ(c.prefetch_row, expect) << "W row " << c.w_row << " A row " << c.a_row;
  }
}

}  // namespace
}  // namespace k3::kernels
