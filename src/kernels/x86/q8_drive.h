// The int8 GEMM's driver (gemm_nt_q8), shared by the AVX2 and AVX-512
// tables: rows of A are rounded to int8 and laid out the way the table's
// tiles read them ("prepared rows", act_bytes_per_block bytes per block of
// 32; the table's PreparedGemm, kernels.h), then every W row is streamed
// once per call over all of them. Up to far_max_m rows first run far tiles
// (avx2.cc, kFarMaxM, explains them), then adjacent ones. The tables supply
// their own row preparation and tiles. No intrinsics; an anonymous
// namespace, so each ISA translation unit compiles its own copy with its own
// flags.
#pragma once

#include <cstdint>

#include "kernels/kernels.h"
#include "kernels/x86/tables.h"

namespace k3::kernels {
namespace {

// A tile: mr prepared rows (qa_stride bytes apart) against the W rows at w,
// w_stride bytes apart; output j of row i goes to c[i * ldc + j * cs];
// prefetch, if set, is the next tile's first W row.
using Q8TileFn = void (*)(int64_t K, const uint8_t* qa, int64_t qa_stride, const uint8_t* w, int64_t w_stride, float* c,
                          int64_t ldc, int64_t cs, const uint8_t* prefetch);

struct Q8Tiling {
  int64_t max_mr;               // rows of A per tile
  int64_t far_max_m;            // chunks of at most this many rows use far tiles first
  int64_t far_nr_row1;          // far streams (W rows per tile) of a one-row chunk
  int64_t far_nr;               // far streams of larger chunks
  int64_t adj_nr_row1;          // W rows per adjacent tile, one-row chunk
  int64_t adj_nr;               // W rows per adjacent tile, larger chunks
  int64_t act_bytes_per_block;  // bytes of a prepared activation row per block of 32
  int64_t far_ahead;            // far tiles prefetch each stream this many rows ahead (0: none)
  bool spread_prefill;          // chunks over far_max_m rows: row tiles prefetch the next tile (gemm_q8_drive)
};

// The kQ8 layout's interleave (util/quant.h, q8_offset): r consecutive
// blocks of 32 bytes in natural order -> for t = 0..7, bytes 4t..4t+3 of each
// block in turn. Used on the activations so they line up with the weights.
inline void q8_interleave_group(const uint8_t* blocks, int64_t r, uint8_t* out) {
  for (int64_t l = 0; l < r; ++l)
    for (int64_t t = 0; t < 8; ++t) __builtin_memcpy(out + t * 4 * r + 4 * l, blocks + 32 * l + 4 * t, 4);
}

// Byte offsets, within a kQ8 row, of group g's int8 values and of its
// scales (r: the group's blocks), as util/quant.h lays them out (q8_offset,
// q8_scale_offset; not included: baseline code).
constexpr int64_t q8_group_values(int64_t g) {
  return g * kQ8GroupBytes;
}
constexpr int64_t q8_group_scales(int64_t g, int64_t r) {
  return g * kQ8GroupBytes + 32 * r;
}

// W rows of at most this many bytes are prefetched into L1 by prefill
// chunks (gemm_q8_drive), longer ones into L2. One thread on the Zen 4 host
// (bench_kernels avx512/gemm_nt_q8_stream, 2 rounds in turn, GOP/s), each
// row tile fetching whole rows of the next W tile: 544-byte rows (K 512) at
// M 24-56 ran 265-276 into L1 and 225-256 into L2 (M 64: 247-270 against
// 254-261); 1632-byte rows (K 1536) ran 141-192 into L1 at M 12-16 and 213
// at M 24, against 227-267 into L2.
constexpr int64_t kQ8L1PrefetchRowBytes = 1024;

// Columns [k0, k1) of M rows of A -> their part of the prepared rows, row i
// at qa + i * K / 32 * act_bytes (the whole rows: k0 0, k1 K). Both tables
// interleave 16 blocks at a time, each group independent of the others, so
// k0 is a multiple of kQ8PrepareColGroup and k1 one too or K (kernels.h,
// PreparedGemm::prepare_cols). groups(a, K, g0, g1, row) does groups
// [g0, g1) of one row in the table's own layout.
template <class PrepareGroups>
void prepare_q8_cols(int64_t M, int64_t K, int64_t k0, int64_t k1, const float* A, int64_t lda, uint8_t* qa,
                     int64_t act_bytes, PrepareGroups groups) {
  static_assert(kQ8PrepareColGroup == 16 * 32, "a column group is one group of 16 blocks");
  const int64_t g0 = k0 / kQ8PrepareColGroup, g1 = (k1 + kQ8PrepareColGroup - 1) / kQ8PrepareColGroup;
  for (int64_t i = 0; i < M; ++i) groups(A + i * lda, K, g0, g1, qa + i * (K / 32 * act_bytes));
}

// C[M, n0..n1) from M prepared rows. tile(mr, nr): the table's Q8TileFn for
// mr rows against nr W rows (every mr <= max_mr with the nr the tiling asks
// for).
template <class TileFor>
void gemm_q8_drive(const Q8Tiling& t, int64_t M, int64_t n0, int64_t n1, int64_t K, const uint8_t* qa, const uint8_t* W,
                   float* C, int64_t ldc, TileFor tile) {
  const int64_t rb = K + K / 32 * 2;  // ir::q8_row_bytes: f16 scales (not included: baseline code)
  const int64_t stride = K / 32 * t.act_bytes_per_block;
  // Chunks of more than far_max_m rows (prefill; all their tiles adjacent):
  // row tile i fetches rows i, i + ntiles, ... of the next W tile before it
  // runs, so a tile's rows arrive whole and spread over the row tiles. With
  // the first row tile fetching all of them among its own loads (as smaller
  // chunks still do), one thread on the Zen 4 host (bench_kernels
  // avx512/gemm_nt_q8_stream/M32, 2-4 rounds in turn) ran N1536 K512 at
  // 222-241 GOP/s, and 208-211 into L1; spread, 270-286 (into L1).
  // N512 K1536: 246-262 -> 262-270 (into L2). Spreading the rows' lines
  // evenly over all 8 row tiles instead gave 262-266 and 260-262. The loops
  // are written out here: as an inline helper taking the level as a bool,
  // the L1 case measured as no prefetch at all (205-211), and GCC 12's code
  // for this path held only the prefetcht1 loop.
  // Tables whose tiling does not ask for it (the L1 prefetch level, chosen
  // on Zen 5 and Intel, where the bf16 dot tile measured the burst better;
  // docs/performance.md) keep the first row tile's burst.
  const bool spread = t.spread_prefill && M > t.far_max_m;
  const int64_t ntiles = (M + t.max_mr - 1) / t.max_mr;
  const bool into_l1 = rb <= kQ8L1PrefetchRowBytes;
  // Every row tile against nr W rows starting at w; only the first row tiles
  // prefetch, the later ones find the rows in cache.
  auto row_tiles = [&](int64_t nr, const uint8_t* w, int64_t w_stride, int64_t n, int64_t cs, const uint8_t* next) {
    for (int64_t m = 0, i = 0; m < M; m += t.max_mr, ++i) {
      const int64_t mr = M - m < t.max_mr ? M - m : t.max_mr;
      if (spread && next != nullptr)
        for (int64_t j = i; j < nr; j += ntiles) {
          const uint8_t* p = next + j * rb;
          if (into_l1)
            for (int64_t o = 0; o < rb; o += 64) __builtin_prefetch(p + o, 0, 3);
          else
            for (int64_t o = 0; o < rb; o += 64) __builtin_prefetch(p + o, 0, 2);
        }
      tile(mr, nr)(K, qa + m * stride, stride, w, w_stride, C + m * ldc + n, ldc, cs,
                   m == 0 && !spread ? next : nullptr);
    }
  };
  int64_t n_adj = n0;
  if (M <= t.far_max_m) {
    const int64_t nr = M == 1 ? t.far_nr_row1 : t.far_nr;
    const int64_t q = (n1 - n0) / nr;
    for (int64_t i = 0; i < q; ++i) {
      const uint8_t* w = W + (n0 + i) * rb;
      // The row far_ahead rows on in every stream.
      row_tiles(nr, w, q * rb, n0 + i, q, t.far_ahead > 0 && i + t.far_ahead < q ? w + t.far_ahead * rb : nullptr);
    }
    n_adj = n0 + q * nr;
  }
  const int64_t adj = M == 1 ? t.adj_nr_row1 : t.adj_nr;
  for (int64_t n = n_adj; n < n1; n += adj) {
    const int64_t nr = n1 - n < adj ? n1 - n : adj;
    const uint8_t* w = W + n * rb;
    // Prefetch the next tile only when it is a full one (all its rows exist).
    row_tiles(nr, w, rb, n, 1, n + 2 * adj <= n1 ? w + adj * rb : nullptr);
  }
}

}  // namespace
}  // namespace k3::kernels
