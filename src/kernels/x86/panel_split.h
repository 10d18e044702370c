// Column ranges of the panel GEMMs (gemm_nt_p16 / gemm_nt_bf16p16), and the
// prefetch spread of their prefill tiles, shared by the AVX2 and AVX-512
// tables: a range [n0, n1) is split into the whole
// panels the table's tiles run over and the partial panels at its edges
// (a thread's share may cut a panel), which are computed whole into a stack
// tile and copied out. No intrinsics. Everything is in an anonymous
// namespace, so each ISA translation unit compiles its own copy with its own
// flags and no inline function is shared between them at link time.
#pragma once

#include <cstdint>

#include "kernels/kernels.h"

namespace k3::kernels {
namespace {

constexpr int64_t kPanel = 16;  // rows of W per panel (ir::kPanelRows)

// Cache lines a prefill tile pulls into L2 for the weights that come after
// its own (the next panel group, or the caller's next matrix), spread over
// its k steps so that memory streams while the tile computes.
struct PanelSpread {
  const char* next = nullptr;
  int64_t lines = 0;
};

// The lines go out as kSpreadStreams interleaved sequential streams, one per
// quarter of the range (a quarter's boundary line may be fetched twice or
// left to the demand loads). One stream per tile kept one core at about 9
// GB/s, the rate its line fill buffers allow for software prefetches alone;
// four let the L2 streamer run ahead on each, and one thread's f32 M 32
// stream rose from 136-139 to 150-161 GFLOP/s (2 streams: 134-152, 8:
// 138-145; bench_kernels avx512/gemm_nt_p16_stream/M32_*).
constexpr int kSpreadStreams = 4;
struct SpreadState {
  const char* p[kSpreadStreams];
  int q = 0;
  int64_t acc = 0;
  explicit SpreadState(const PanelSpread& s) {
    for (int i = 0; i < kSpreadStreams; ++i) p[i] = s.next + 64 * (i * s.lines / kSpreadStreams);
  }
};

// What the row tiles of a panel group prefetch while they compute it: the
// `bytes` of W after the group in the thread's range (at `next`), or, after
// the range's last group (bytes == 0), the first `cap` bytes of the
// caller's next weights (ReadNext).
inline PanelSpread panel_spread_after(const void* next, int64_t bytes, ReadNext read_next, int64_t cap) {
  const int64_t n = bytes > 0 ? bytes : (read_next.bytes < cap ? read_next.bytes : cap);
  return {static_cast<const char*>(bytes > 0 ? next : read_next.data), n > 0 ? (n + 63) / 64 : 0};
}

// Row tile r of `tiles` over M rows: rows [m, m + mr), heights within one
// of each other (32 rows in 3 tiles: 10, 11, 11 rows), and its share of the
// group's spread.
struct RowTile {
  int64_t m, mr;
  PanelSpread spread;
};
inline RowTile row_tile(int64_t M, int64_t r, int64_t tiles, const PanelSpread& s) {
  const int64_t m = r * M / tiles, l0 = r * s.lines / tiles, l1 = (r + 1) * s.lines / tiles;
  return {m, (r + 1) * M / tiles - m, {s.next + 64 * l0, l1 - l0}};
}

// One k step of a tile with `steps` k steps: after step k, (k + 1) * lines /
// steps of the spread's lines have been prefetched (Bresenham, no division).
inline void panel_spread_step(const PanelSpread& s, SpreadState& st, int64_t steps) {
  st.acc += s.lines;
  while (st.acc >= steps) {
    st.acc -= steps;
    __builtin_prefetch(st.p[st.q], 0, 2);  // prefetcht1: into L2
    st.p[st.q] += 64;
    st.q = st.q + 1 == kSpreadStreams ? 0 : st.q + 1;
  }
}

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
