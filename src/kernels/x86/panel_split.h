// Column ranges of the panel GEMMs (gemm_nt_p16 / gemm_nt_bf16p16 and the
// int8 panels), the int8 panels' driver, and the prefetch spread of their
// prefill tiles, shared by the AVX2 and AVX-512 tables: a range [n0, n1) is
// split into the whole panels the table's tiles run over and the partial
// panels at its edges (a thread's share may cut a panel), which are
// computed whole into a stack tile and copied out. No intrinsics.
// Everything is in an anonymous namespace, so each ISA translation unit
// compiles its own copy with its own flags and no inline function is shared
// between them at link time.
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

// The 4 bytes at p (a prepared activation row's word, broadcast by the int8
// panel tiles), unaligned.
inline int32_t load_i32(const uint8_t* p) {
  int32_t v;
  __builtin_memcpy(&v, p, 4);
  return v;
}

// Bytes of one int8 panel of K columns: q8_panel_bytes / q8c_panel_bytes
// (util/q8_panel.h, not included: baseline code).
template <bool kChannel>
constexpr int64_t q8p_panel_bytes(int64_t K) {
  return kChannel ? 16 * K + 64 : 17 * K;
}

// An int8 panel tile: prepared rows qa[0..mr) (qa_stride bytes apart) .
// (np panels from W, ps bytes apart)^T, panel j's 16 outputs of row i at
// C + i * ldc + j * pcs; spreads `spread`'s prefetches over its blocks.
using Q8PTileFn = void (*)(int64_t K, const uint8_t* qa, int64_t qa_stride, const uint8_t* W, int64_t ps, float* C,
                           int64_t ldc, int64_t pcs, PanelSpread spread);

// C[M, 16 * p0 .. 16 * p1) over whole int8 panels (gemm_nt_q8p16 and
// gemm_nt_q8cp16, shared by the AVX2 and VNNI tables): up to kRowChunk rows
// at a time, over groups of kNp panels, each reused from cache by all the
// chunk's row tiles (heights within one of each other), which prefetch the
// next group into L2 while they compute. tile(mr, np): the table's tile
// for mr <= kMr rows and np <= kNp panels.
template <int64_t kRowChunk, int kMr, int kNp, bool kChannel, class TileFor>
void drive_q8_panels(int64_t M, int64_t p0, int64_t p1, int64_t K, const uint8_t* qa, int64_t stride, const uint8_t* W,
                     float* C, int64_t ldc, TileFor tile) {
  const int64_t ps = q8p_panel_bytes<kChannel>(K);
  for (int64_t m0 = 0; m0 < M; m0 += kRowChunk) {
    const int64_t mc = M - m0 < kRowChunk ? M - m0 : kRowChunk, ntiles = (mc + kMr - 1) / kMr;
    const uint8_t* a = qa + m0 * stride;
    float* c = C + m0 * ldc;
    for (int64_t p = p0; p < p1; p += kNp) {
      const int64_t np = p1 - p < kNp ? p1 - p : kNp, left = p1 - p - np, nn = left < kNp ? left : kNp;
      const PanelSpread spread = panel_spread_after(W + (p + np) * ps, nn * ps, ReadNext{}, 0);
      for (int64_t r = 0; r < ntiles; ++r) {
        const RowTile rt = row_tile(mc, r, ntiles, spread);
        tile(rt.mr, np)(K, a + rt.m * stride, stride, W + p * ps, ps, c + rt.m * ldc + kPanel * p, ldc, kPanel,
                        rt.spread);
      }
    }
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

// The int8 panel GEMM on prepared rows (PreparedGemm::gemm of q8p16_prepared
// and q8cp16_prepared), P's rows `stride` bytes apart: [n0, n1) split as
// gemm_panels_split splits it, the whole panels through drive_q8_panels, a
// panel the range cuts by tile(mr, 1) on the stack.
template <int64_t kRowChunk, int kMr, int kNp, bool kChannel, class TileFor>
void gemm_q8_panels_prepared(int64_t M, int64_t n0, int64_t n1, int64_t K, const uint8_t* P, int64_t stride,
                             const uint8_t* W, float* C, int64_t ldc, TileFor tile) {
  const int64_t ps = q8p_panel_bytes<kChannel>(K);
  gemm_panels_split<kMr>(
      M, n0, n1, C, ldc,
      [&](int64_t p0, int64_t p1) {
        drive_q8_panels<kRowChunk, kMr, kNp, kChannel>(M, p0, p1, K, P, stride, W, C, ldc, tile);
      },
      [&](int64_t m, int64_t mr, int64_t p, float* out) {
        tile(mr, 1)(K, P + m * stride, stride, W + p * ps, ps, out, kPanel, kPanel, PanelSpread{});
      });
}

}  // namespace
}  // namespace k3::kernels
