// The AMX bf16 matrix product: gemm_nt_bf16dot of the "amx" table (the
// AVX-512 table with this product swapped in, on CPUs with AMX-BF16 whose OS
// lets the process use the tile registers; dispatch.cc asks both). Its own
// translation unit because it is compiled with -mamx-tile -mamx-bf16.
// Same rules as avx512.cc: internal linkage, no inline library functions.
//
// One TDPBF16PS multiplies a 16 x 32 bf16 tile by a 32 x 16 one into 16 x 16
// f32: 16 times the work of a vdpbf16ps, so prefill stops being bound by the
// dot-product units (on the Xeon that has it, vdpbf16ps runs at half the f32
// FMA rate). The second operand must hold k pairs per row
// ([16 pairs][16 columns][2]), which W's rows ([N, K] bf16, as stored) are
// not, but the first operand takes rows as they lie in memory. So W is the
// first operand, read straight from its rows, and the activations, which
// the call has in hand anyway, are interleaved into pair rows:
//   Ct[n][m] += sum_k W[n][k] * bf16(A[m][k])   (16 n x 16 m per tile)
// and the transposed tile is written into C. A row of one activation
// (decode, M = 1) is already in pair form: read as a tile with a 4-byte
// stride, it needs no interleaving, and its column of results is a row of C.
//
// Arithmetic: the tile unit sums in its own order, so results differ from
// the avx512bf16 table's in the last bits (docs/performance.md, "AMX tiles
// for the bf16 product"). Each
// element's result depends only on its row of W, its row of A and the steps
// over k (32 at a time, from 0, in chunks of kChunkK added in order), never
// on M, the tile shapes or the column split: the gemm_nt contract.
#include <cstdint>

#include "kernels/prepared_chunks.h"
#include "kernels/tiles_via_rows.h"
#include "kernels/x86/amx_tile_config.h"
#include "kernels/x86/avx512_util.h"
#include "kernels/x86/tables.h"

namespace k3::kernels {
namespace {

constexpr int64_t kStep = 32;         // k per tile step: 16 pairs
constexpr int64_t kChunkK = 2048;     // k per pass; longer rows add their passes' sums in order
constexpr int64_t kScratch = 131072;  // bytes of interleaved activations per pass (stack)
constexpr int64_t kTileBytes = 1024;  // one 16 x 64-byte tile
// W is prefetched 8 k-steps ahead, into L1: one thread streaming W from
// DRAM at M 1 read 13.5 GB/s without prefetches, 14.5 with these; 4 or 16
// steps ahead, or into L2, or the next rows in memory order instead, were no
// better or worse (bench_kernels amx/gemm_nt_bf16dot_stream).
constexpr int64_t kPrefetchSteps = 8;
constexpr auto kHint = _MM_HINT_T0;
// In the tile layout a block is one sequential stream: its whole tiles are
// prefetched 2 steps ahead (1, 2 and 4 steps ahead all streamed M 1 at
// 14.5-15.3 GB/s: bench_kernels amx/gemm_bf16dot_tiles_stream).
constexpr int64_t kTiledPrefetchSteps = 2;

// Row stride of the prepared rows, in bf16 values: K rounded up to a step
// (the avx512bf16 prepare's layout, which this table shares).
inline int64_t padded_k(int64_t K) {
  return (K + kStep - 1) / kStep * kStep;
}

// Tiles: C00 = 0 (W0 x B0), C10 = 1 (W1 x B0), C01 = 2 (W0 x B1),
// C11 = 3 (W1 x B1); W0 = 4, W1 = 5 (16 W rows each); B0 = 6, B1 = 7 (16
// pairs of up to 16 activation rows each). r0, r1: W rows in W0, W1 (r1 may
// be 0); c0, c1: activation rows in B0, B1 (c1 may be 0).
struct Shape {
  int r0 = -1, r1 = -1, c0 = -1, c1 = -1;
  bool operator==(const Shape&) const = default;
};

void configure(const Shape& s) {
  TileConfig cfg;
  auto set = [&](int t, int rows, int colsb) {
    if (rows == 0 || colsb == 0) return;
    cfg.rows[t] = static_cast<uint8_t>(rows);
    cfg.colsb[t] = static_cast<uint16_t>(colsb);
  };
  set(0, s.r0, 4 * s.c0);
  set(1, s.r1, 4 * s.c0);
  set(4, s.r0, 64);
  set(5, s.r1, 64);
  set(6, 16, 4 * s.c0);
  if (s.c1 > 0) {
    set(2, s.r0, 4 * s.c1);
    set(3, s.r1, 4 * s.c1);
    set(7, 16, 4 * s.c1);
  } else {  // odd steps' W and activation tiles (see the k loop)
    set(2, s.r0, 64);
    set(3, s.r1, 64);
    set(7, 16, 4 * s.c0);
  }
  load_tile_config(cfg);
}

// dst[c][r] = src[r][c] for a 16 x 16 block of 32-bit values; src rows are
// `stride` bytes apart and rows >= rows_valid read as zero.
void transpose16(const uint8_t* src, int64_t stride, int64_t rows_valid, uint32_t* dst) {
  __m512i r[16];
  for (int i = 0; i < 16; ++i) r[i] = i < rows_valid ? _mm512_loadu_si512(src + i * stride) : _mm512_setzero_si512();
  __m512i t[16], u[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  // u[4g + j], lane L: column 4L + j of rows 4g..4g+3.
  for (int g = 0; g < 4; ++g) {
    u[4 * g + 0] = _mm512_unpacklo_epi64(t[4 * g + 0], t[4 * g + 2]);
    u[4 * g + 1] = _mm512_unpackhi_epi64(t[4 * g + 0], t[4 * g + 2]);
    u[4 * g + 2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
    u[4 * g + 3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
  }
  for (int j = 0; j < 4; ++j) {
    const __m512i x0 = _mm512_shuffle_i32x4(u[j], u[4 + j], 0x88);  // u0.L0 u0.L2 u1.L0 u1.L2
    const __m512i x1 = _mm512_shuffle_i32x4(u[j], u[4 + j], 0xDD);  // u0.L1 u0.L3 u1.L1 u1.L3
    const __m512i y0 = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0x88);
    const __m512i y1 = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0xDD);
    _mm512_storeu_si512(dst + 16 * (0 + j), _mm512_shuffle_i32x4(x0, y0, 0x88));
    _mm512_storeu_si512(dst + 16 * (8 + j), _mm512_shuffle_i32x4(x0, y0, 0xDD));
    _mm512_storeu_si512(dst + 16 * (4 + j), _mm512_shuffle_i32x4(x1, y1, 0x88));
    _mm512_storeu_si512(dst + 16 * (12 + j), _mm512_shuffle_i32x4(x1, y1, 0xDD));
  }
}

// A transposed result tile (t[n][m], 16 floats per row as stored) into C:
// C[m * ldc + n] for m < cols, n < rows; added to C's values when `add`.
void write_tile(const float* t, int64_t rows, int64_t cols, float* C, int64_t ldc, bool add) {
  alignas(64) uint32_t tt[256];
  transpose16(reinterpret_cast<const uint8_t*>(t), 64, rows, tt);
  const __mmask16 mask = tail_mask(rows);
  for (int64_t m = 0; m < cols; ++m) {
    __m512 v = _mm512_castsi512_ps(_mm512_load_si512(tt + 16 * m));
    if (add) v = _mm512_add_ps(_mm512_maskz_loadu_ps(mask, C + m * ldc), v);
    _mm512_mask_storeu_ps(C + m * ldc, mask, v);
  }
}

// The k-step's W rows that end past K (only the last step when K % 32 != 0):
// copied into a zero-padded tile so the load reads nothing beyond each row.
const uint16_t* w_tail(const uint16_t* w, int64_t ldw, int64_t rows, int64_t k_left, uint16_t* buf) {
  for (int64_t r = 0; r < rows; ++r) {
    const __mmask32 m = static_cast<__mmask32>((uint64_t{1} << k_left) - 1u);
    _mm512_store_si512(buf + 32 * r, _mm512_maskz_loadu_epi16(m, w + r * ldw));
  }
  return buf;
}

// _tile_stored takes its tile number as a constant.
void store_tile(int i, void* dst, int64_t stride) {
  switch (i) {
    case 0:
      _tile_stored(0, dst, stride);
      break;
    case 1:
      _tile_stored(1, dst, stride);
      break;
    case 2:
      _tile_stored(2, dst, stride);
      break;
    default:
      _tile_stored(3, dst, stride);
      break;
  }
}

// C[M, n0..n1) from prepared rows P and W in rows ([N, K], ldw apart) or,
// kTiled, in the tile layout (util/tiles.h; n0 a multiple of 16). The two
// run the same tile products in the same order, so they agree bit for bit.
template <bool kTiled>
void amx_gemm(int64_t M, int64_t n0, int64_t n1, int64_t K, const uint8_t* P, const void* Wv, int64_t ldw, float* C,
              int64_t ldc) {
  if (M <= 0 || n1 <= n0) return;
  const auto* W = static_cast<const uint16_t*>(Wv);
  const int64_t kp = padded_k(K);
  const int64_t rb = 2 * kp;  // prepared row bytes
  alignas(64) uint8_t scratch[kScratch];
  alignas(64) float tbuf[256] = {};
  alignas(64) uint16_t wbuf[2][512];
  Shape cur;
  for (int64_t kc0 = 0; kc0 < kp; kc0 += kChunkK) {
    const int64_t kc = min64(kChunkK, kp - kc0), nkb = kc / kStep;
    const bool add = kc0 > 0;
    // Rows interleaved per pass: as many 32-row groups as the scratch holds.
    const int64_t mc_rows = M == 1 ? 1 : (kScratch / (2 * kc)) / 32 * 32;
    for (int64_t mc0 = 0; mc0 < M; mc0 += mc_rows) {
      const int64_t mcl = min64(mc_rows, M - mc0);
      const uint8_t* prow = P + mc0 * rb + 2 * kc0;
      if (M > 1) {
        // Block b (16 rows), step kb: tile [16 pairs][16 rows] at (b * nkb + kb) * 1 KiB.
        for (int64_t b = 0; b * 16 < mcl; ++b)
          for (int64_t kb = 0; kb < nkb; ++kb)
            transpose16(prow + 16 * b * rb + 64 * kb, rb, min64(16, mcl - 16 * b),
                        reinterpret_cast<uint32_t*>(scratch + (b * nkb + kb) * kTileBytes));
      }
      for (int64_t n = n0; n < n1;) {
        // 2 x 2 tiles of 16 x 16: 32 rows of W against 32 rows of A. (Four
        // W tiles against one activation tile at M <= 16, four chains in
        // flight instead of two, streamed W 10-15% slower.)
        const int64_t n_step = 32;
        // Tile j of step kb: w0 + j * w_next + kb * w_step, rows w_stride bytes apart.
        const uint16_t* w0 = kTiled ? W + n * kp + kc0 * 16 : W + n * ldw + kc0;
        constexpr int64_t w_step = kTiled ? 512 : kStep;
        const int64_t w_next = kTiled ? 16 * kp : 16 * ldw;
        const int64_t next_rows = min64(32, n1 - n - n_step);
        for (int64_t mb = 0; mb < mcl; mb += 32) {
          const int c0 = static_cast<int>(min64(16, mcl - mb));
          const int c1 = static_cast<int>(mcl - mb > 16 ? min64(16, mcl - mb - 16) : 0);
          const int r0 = static_cast<int>(min64(16, n1 - n));
          const int r1 = static_cast<int>(n1 - n > 16 ? min64(16, n1 - n - 16) : 0);
          const Shape s{r0, r1, c0, c1};
          if (!(s == cur)) {
            configure(s);
            cur = s;
          }
          // Accumulator i holds W rows 16 wr[i].. against activation rows 16 ac[i]..
          constexpr int wr[4] = {0, 1, 0, 1}, ac[4] = {0, 0, 1, 1};
          const int rows_of[4] = {r0, r1, r0, r1}, cols_of[4] = {c0, c0, c1, c1};
          if (rows_of[0] && cols_of[0]) _tile_zero(0);
          if (rows_of[1] && cols_of[1]) _tile_zero(1);
          if (rows_of[2] && cols_of[2]) _tile_zero(2);
          if (rows_of[3] && cols_of[3]) _tile_zero(3);
          const uint8_t* b0 = scratch + (mb / 16) * nkb * kTileBytes;
          const uint8_t* b1 = b0 + nkb * kTileBytes;
          for (int64_t kb = 0; kb < nkb; ++kb) {
            const int64_t k = kc0 + kb * kStep;
            if (mb == 0 && kTiled) {
              // The two tiles kTiledPrefetchSteps steps ahead, 16 lines
              // each; past the pass's end, the next rows' first tiles.
              const int64_t pk = kb + kTiledPrefetchSteps;
              const uint16_t* pw = pk < nkb ? w0 + pk * w_step : w0 + 2 * w_next + (pk - nkb) * w_step;
              const int64_t tiles = pk < nkb ? (s.r1 ? 2 : 1) : (next_rows > 16 ? 2 : next_rows > 0 ? 1 : 0);
              for (int64_t j = 0; j < tiles; ++j)
                for (int64_t l = 0; l < 16; ++l)
                  _mm_prefetch(reinterpret_cast<const char*>(pw + j * w_next + l * 32), kHint);
            } else if (mb == 0) {
              // One line of each W row, kPrefetchSteps steps ahead; past the
              // pass's end, the same line of the next rows' first steps.
              const int64_t pk = (kb + kPrefetchSteps) * kStep;
              const uint16_t* pw = pk < kc ? w0 + pk : w0 + n_step * ldw + (pk - kc);
              const int64_t pf_rows = pk < kc ? min64(n_step, n1 - n) : next_rows;
              for (int64_t r = 0; r < pf_rows; ++r) _mm_prefetch(reinterpret_cast<const char*>(pw + r * ldw), kHint);
            }
            // W rows of tile j: w0 + 16 j rows, this step; the last step of a
            // row whose K is not a multiple of 32 goes through a padded copy.
            // (The tile layout is zero-padded: no copy.)
            const bool tail = !kTiled && k + kStep > K;
            auto w_at = [&](int j, int rows) -> const uint16_t* {
              const uint16_t* w = w0 + j * w_next + kb * w_step;
              return tail ? w_tail(w, ldw, rows, K - k, wbuf[j]) : w;
            };
            const int64_t w_stride = tail || kTiled ? 64 : 2 * ldw;
            const uint8_t* bk = M == 1 ? prow + 64 * kb : b0 + kb * kTileBytes;
            const int64_t b_stride = M == 1 ? 4 : 64;
            if (c1 == 0 && (kb & 1)) {
              // At most 16 rows of A: odd steps load into tiles 2, 3 and 7
              // (idle here), so their loads need not wait for the even
              // step's products to release 4, 5 and 6. One thread at M 1
              // with W in L2: 49 -> 63 GB/s; streamed from DRAM, no change.
              _tile_loadd(7, bk, b_stride);
              _tile_loadd(2, w_at(0, r0), w_stride);
              if (r1) _tile_loadd(3, w_at(1, r1), w_stride);
              _tile_dpbf16ps(0, 2, 7);
              if (r1) _tile_dpbf16ps(1, 3, 7);
              continue;
            }
            _tile_loadd(6, bk, b_stride);
            _tile_loadd(4, w_at(0, r0), w_stride);
            if (r1) _tile_loadd(5, w_at(1, r1), w_stride);
            _tile_dpbf16ps(0, 4, 6);
            if (r1) _tile_dpbf16ps(1, 5, 6);
            if (c1) {
              _tile_loadd(7, b1 + kb * kTileBytes, 64);
              _tile_dpbf16ps(2, 4, 7);
              if (r1) _tile_dpbf16ps(3, 5, 7);
            }
          }
          float* c = C + (mc0 + mb) * ldc + n;
          for (int i = 0; i < 4; ++i) {
            const int rows = rows_of[i], cols = cols_of[i];
            if (rows == 0 || cols == 0) continue;
            float* ci = c + 16 * ac[i] * ldc + 16 * wr[i];
            if (M == 1 && !add) {  // one column: the tile's rows are C's row
              store_tile(i, ci, 4);
            } else {
              store_tile(i, tbuf, 64);
              write_tile(tbuf, rows, cols, ci, ldc, add);
            }
          }
        }
        n += n_step;
      }
    }
  }
  _tile_release();
}

}  // namespace

void gemm_bf16dot_prepared_amx(int64_t M, int64_t n0, int64_t n1, int64_t K, const uint8_t* P, const void* W,
                               int64_t ldw, float* C, int64_t ldc) {
  amx_gemm<false>(M, n0, n1, K, P, W, ldw, C, ldc);
}

void gemm_bf16dot_tiles_amx(int64_t M, int64_t n0, int64_t n1, int64_t K, const uint8_t* P, const void* W, int64_t ldw,
                            float* C, int64_t ldc) {
  if (n0 % ir::kTileRows == 0)
    amx_gemm<true>(M, n0, n1, K, P, W, ldw, C, ldc);
  else  // a range that starts inside a block: unpacked rows, the same tile products
    gemm_tiles_via_rows<gemm_bf16dot_prepared_amx>(M, n0, n1, K, P, W, ldw, C, ldc);
}

void gemm_nt_bf16dot_amx(int64_t M, int64_t n0, int64_t n1, int64_t K, const float* A, int64_t lda, const uint16_t* W,
                         int64_t ldw, float* C, int64_t ldc) {
  gemm_prepared_chunks<bf16dot_row_bytes_avx512bf16, prepare_bf16dot_avx512bf16, gemm_bf16dot_prepared_amx>(
      M, n0, n1, K, A, lda, W, ldw, C, ldc);
}

}  // namespace k3::kernels
