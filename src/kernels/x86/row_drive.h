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
//
// Far tiles with more rows than one row tile (5 to 8: two row tiles per W
// tile) prefetch each stream two rows ahead from every row tile; with fewer
// rows the one row tile prefetches the next row. When only the first of two
// row tiles prefetched the next row, the second (all its W in L1) left the
// memory idle: one Zen 4 core (bench_kernels --benchmark_filter=
// 'gemm_nt_(stream|bf16dot_stream)/M8' --benchmark_min_time=0.3, 2 rounds
// in turn, GB/s) streamed AVX-512 f32 rows of N1536 K512 at 13.9-14.4 ->
// 18.9-19.3, bf16 dot 12.5-12.8 -> 18.6-19.4, N512 K1536 13.9-14.0 ->
// 16.2-16.4 and 13.8-14.1 -> 18.9; AVX2 f32 16.6-17.1 -> 19.3-19.4, AVX2
// bf16 8.7-8.8 -> 9.8-10.0. Every row tile prefetching the next row gave
// less (f32 17.0-17.3, bf16 dot 12.6-12.8); two rows ahead at M <= 4 too
// lost 12-16% at M 1 (bf16 dot 27.4-28.5 -> 23.9-24.3). k3-base batch-8
// decode (k3 bench -b 4,8 -p 128 -n 32 -r 3 -t 2, old and new builds in
// turn, pairs with both vCPUs on one L3):
// f32 52.1-52.2 -> 50.3-50.4 ms a token, bf16 30.8-32.2 -> 30.3-31.1;
// batch 4 (unchanged walk) the same within 3%. int8 (x86/q8_drive.h, not
// changed: its M 8 tiles are bound by compute, +6% in the same benchmark)
// decoded the same within noise.
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
// row i goes to c[i * ldc + j * cs]; prefetch, if set, is the first of the
// W rows (same stride) the tile fetches ahead: a row or two on in each far
// stream, the next tile's first row for adjacent tiles.
template <class AT, class WT, class TileFor>
void drive_row_tiles(const RowTiling& t, int64_t M, int64_t n0, int64_t n1, int64_t K, const AT* A, int64_t lda,
                     const WT* W, int64_t ldw, float* C, int64_t ldc, TileFor tile) {
  // every: all row tiles prefetch `next`, else only the first (the later
  // ones find the rows in cache).
  auto row_tiles = [&](int64_t nr, const WT* w, int64_t w_stride, int64_t n, int64_t cs, const WT* next, bool every) {
    for (int64_t m = 0; m < M; m += t.max_mr) {
      const int64_t mr = M - m < t.max_mr ? M - m : t.max_mr;
      tile(mr, nr)(K, A + m * lda, lda, w, w_stride, C + m * ldc + n, ldc, cs, m == 0 || every ? next : nullptr);
    }
  };
  if (M <= t.far_max_m) {
    const int64_t nr = M <= 2 ? t.far_nr_m2 : t.far_nr;
    const int64_t q = (n1 - n0) / nr;
    const bool two_row_tiles = M > t.max_mr;      // then every row tile prefetches (above)
    const int64_t ahead = two_row_tiles ? 2 : 1;  // rows ahead in every stream
    for (int64_t i = 0; i < q; ++i) {
      const WT* w = W + (n0 + i) * ldw;
      row_tiles(nr, w, q * ldw, n0 + i, q, i + ahead < q ? w + ahead * ldw : nullptr, two_row_tiles);
    }
    n0 += q * nr;
  }
  for (int64_t n = n0; n < n1; n += t.adj_nr) {
    const int64_t nr = n1 - n < t.adj_nr ? n1 - n : t.adj_nr;
    const WT* w = W + n * ldw;
    // Prefetch the next tile only when it is a full one (all its rows exist).
    row_tiles(nr, w, ldw, n, 1, n + 2 * t.adj_nr <= n1 ? w + t.adj_nr * ldw : nullptr, false);
  }
}

}  // namespace
}  // namespace k3::kernels
