// AVX-512 kernel table (F/BW/DQ/VL + FMA), 16 floats per zmm register.
//
// This file is compiled with AVX-512 flags while the rest of the binary is
// baseline x86-64, so everything here has internal linkage and avoids inline
// library functions (std::min, std::exp(float), numeric_limits, ...): an
// out-of-line copy of one of those built with these flags could be picked by
// the linker for baseline code and fault on older CPUs. Tails of every loop
// use masked loads/stores, which never touch memory outside the mask.

#include <math.h>

#include <array>
#include <cstdint>
#include <limits>
#include <utility>

#include "kernels/prepared_chunks.h"
#include "kernels/tiles_via_rows.h"
#include "kernels/x86/avx512_util.h"
#include "kernels/x86/bf16dot_round.h"
#include "kernels/x86/panel_split.h"
#include "kernels/x86/row_drive.h"
#include "kernels/x86/tables.h"

namespace k3::kernels {
namespace {

constexpr int64_t kW = 16;      // floats per vector
constexpr int64_t kGemmMr = 4;  // rows of A per gemm micro-tile
// Rows of W per prefill micro-tile: 4 x 6 accumulators + 6 W + 1 A = 31 zmm.
// Against 4 x 4, each A load feeds 6 FMAs instead of 4, which cut the L2
// traffic for A by a third: bench_kernels avx512/gemm_nt(_bf16)_(hot|stream)
// at M 32 and 128 (one thread, 2 rounds in turn on the 480 MiB-L3 Intel
// host) rose 5-17% in every shape, k3 profile --phase prefill on fp32
// k3-base 3-6%. Decode's far tiles keep their own 4 streams.
constexpr int64_t kGemmNr = 6;

// exp(x): x = n*ln2 + r with |r| <= ln2/2 (ln2 split in two for accuracy),
// exp(r) from the Cephes degree-7 polynomial, then scaled by 2^n. About
// 1-2 ulp. Inputs are clamped so the result stays finite and normal:
// exp(-87.3) ~ 1.2e-38 stands in for underflow, exp(88.3) ~ 2.2e38 for
// overflow, so callers never see inf from here, nor NaN but for a NaN x.
inline __m512 exp_ps(__m512 x) {
  // x second: max and min return their second operand when either is NaN,
  // so NaN passes through (exp(NaN) = NaN) instead of clamping to a finite
  // value, which would let a NaN score weigh in as exp(-87.3).
  x = _mm512_min_ps(_mm512_set1_ps(88.3f), _mm512_max_ps(_mm512_set1_ps(-87.3f), x));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  const __m512 e = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(e, n);
}

// erf(x) as an odd/even rational function on [-4, 4] (the Eigen/XLA float
// fit). It evaluates to exactly +-1 at +-4 and erf rounds to +-1 in float
// beyond, so the clamp is exact. Max abs error 3.7e-7 (measured vs double erf).
// No exp needed, unlike the erfc-based Abramowitz-Stegun forms.
inline __m512 erf_ps(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-4.0f)), _mm512_set1_ps(4.0f));
  const __m512 x2 = _mm512_mul_ps(x, x);
  __m512 p = _mm512_set1_ps(-2.72614225801306e-10f);
  p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(2.77068142495902e-08f));
  p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(-2.10102402082508e-06f));
  p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(-5.69250639462346e-05f));
  p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(-7.34990630326855e-04f));
  p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(-2.95459980854025e-03f));
  p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(-1.60960333262415e-02f));
  __m512 q = _mm512_set1_ps(-1.45660718464996e-05f);
  q = _mm512_fmadd_ps(q, x2, _mm512_set1_ps(-2.13374055278905e-04f));
  q = _mm512_fmadd_ps(q, x2, _mm512_set1_ps(-1.68282697438203e-03f));
  q = _mm512_fmadd_ps(q, x2, _mm512_set1_ps(-7.37332916720468e-03f));
  q = _mm512_fmadd_ps(q, x2, _mm512_set1_ps(-1.42647390514189e-02f));
  return _mm512_div_ps(_mm512_mul_ps(p, x), q);
}

// ---- gemm_nt ---------------------------------------------------------------

// C[0..MR, 0..NR) = A[0..MR, :K] . W[0..NR, :K]^T, one micro-tile.
// Per element: acc = 0; acc = fma(a, w, acc) for each 16-wide block of K, the
// last block zero-filled by masked loads; C = hsum(acc). Nothing in that
// sequence depends on MR, NR or the tile's position, which is what makes
// gemm_nt independent of M and of the column split. `prefetch`, if set,
// points at the next tile's W rows (same ldw), fetched one line per row per
// K step so the stream of W stays ahead of the FMAs.
// W rows are f32, or bf16 (uint16_t bits) widened exactly to f32 as they
// are loaded: the FMAs, and so the results' bits, are those of gemm_nt on
// the widened matrix, while memory traffic for W halves.
inline __m512 load_w(const float* p) {
  return _mm512_loadu_ps(p);
}
inline __m512 load_w_tail(__mmask16 m, const float* p) {
  return _mm512_maskz_loadu_ps(m, p);
}
inline __m512 widen_bf16(__m256i h) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
inline __m512 load_w(const uint16_t* p) {
  return widen_bf16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline __m512 load_w_tail(__mmask16 m, const uint16_t* p) {
  return widen_bf16(_mm256_maskz_loadu_epi16(m, p));
}

template <class WT, Prefetch P, int MR, int NR>
void gemm_tile(int64_t K, const float* A, int64_t lda, const WT* W, int64_t ldw, float* C, int64_t ldc, int64_t cs,
               const WT* prefetch) {
  // One 64-byte line of each W row is prefetched per 64 bytes of K consumed,
  // into P's level. Into L1 (_MM_HINT_T0) a Zen 5 core streamed f32 rows
  // 8-13% faster than into L2 (bench_kernels avx512/gemm_nt_stream, N 1536,
  // K 512, one thread, medians of 4 rounds in turn: M1 35.1 -> 38.1 GB/s, M8
  // 17.5 -> 19.7; bf16 rows 31.0 -> 33.0 and 17.9 -> 18.6); a Zen 4 core ran
  // them 9-57% faster into L2 (docs/performance.md).
  constexpr int64_t kPrefetchMask = 64 / sizeof(WT) - 1;
  __m512 acc[MR][NR];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_setzero_ps();

  int64_t k = 0;
  for (; k + kW <= K; k += kW) {
    if (prefetch != nullptr && (k & kPrefetchMask) == 0) {
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j) _mm_prefetch(reinterpret_cast<const char*>(prefetch + j * ldw + k), kHintOf<P>);
    }
    __m512 w[NR];
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) w[j] = load_w(W + j * ldw + k);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m512 a = _mm512_loadu_ps(A + i * lda + k);
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_fmadd_ps(a, w[j], acc[i][j]);
    }
  }
  if (k < K) {
    const __mmask16 mask = tail_mask(K - k);
    __m512 w[NR];
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) w[j] = load_w_tail(mask, W + j * ldw + k);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m512 a = _mm512_maskz_loadu_ps(mask, A + i * lda + k);
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_fmadd_ps(a, w[j], acc[i][j]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) store_hsums(acc[i], C + i * ldc, cs);
}

template <class WT>
using GemmTileFn = void (*)(int64_t, const float*, int64_t, const WT*, int64_t, float*, int64_t, int64_t, const WT*);

// kGemmTiles<WT, P>[mr - 1][nr - 1] covers an mr x nr block (edges use the smaller ones).
template <class WT, Prefetch P>
constexpr GemmTileFn<WT> kGemmTiles[kGemmMr][kGemmNr] = {
    {gemm_tile<WT, P, 1, 1>, gemm_tile<WT, P, 1, 2>, gemm_tile<WT, P, 1, 3>, gemm_tile<WT, P, 1, 4>,
     gemm_tile<WT, P, 1, 5>, gemm_tile<WT, P, 1, 6>},
    {gemm_tile<WT, P, 2, 1>, gemm_tile<WT, P, 2, 2>, gemm_tile<WT, P, 2, 3>, gemm_tile<WT, P, 2, 4>,
     gemm_tile<WT, P, 2, 5>, gemm_tile<WT, P, 2, 6>},
    {gemm_tile<WT, P, 3, 1>, gemm_tile<WT, P, 3, 2>, gemm_tile<WT, P, 3, 3>, gemm_tile<WT, P, 3, 4>,
     gemm_tile<WT, P, 3, 5>, gemm_tile<WT, P, 3, 6>},
    {gemm_tile<WT, P, 4, 1>, gemm_tile<WT, P, 4, 2>, gemm_tile<WT, P, 4, 3>, gemm_tile<WT, P, 4, 4>,
     gemm_tile<WT, P, 4, 5>, gemm_tile<WT, P, 4, 6>},
};

// Decode (M <= 8) reads W rows that lie far apart, as the AVX2 table does
// (row_drive.h; avx2.cc, kFarMaxM, has the measurements): 4 sequential
// streams per thread. Before this the table ran 1 x 8 adjacent rows at M = 1
// with partly unrolled loops, and decoded k3-base bf16 1.28x slower than the
// AVX2 table on a Zen 4 host (k3 bench, 17.4 vs 13.6 ms). Tiles of 3 x 8,
// 4 x 6 and 6 x 4 (streams x rows of A) were measured too (bench_kernels
// avx512/gemm_nt*_stream, k3 bench -b 1,4,8): 3 x 8 lost a third at M = 8,
// the others were within this host's noise of 4 x 4.
constexpr int64_t kFarMaxM = 8;
constexpr RowTiling kRowTiling = {
    .max_mr = kGemmMr, .adj_nr = kGemmNr, .far_max_m = kFarMaxM, .far_nr_m2 = 4, .far_nr = 4};

template <class WT, Prefetch P>
void gemm_nt_t(int64_t M, int64_t n0, int64_t n1, int64_t K, const float* A, int64_t lda, const WT* W, int64_t ldw,
               float* C, int64_t ldc) {
  drive_row_tiles(kRowTiling, M, n0, n1, K, A, lda, W, ldw, C, ldc,
                  [](int64_t mr, int64_t nr) { return kGemmTiles<WT, P>[mr - 1][nr - 1]; });
}

template <Prefetch P>
void gemm_nt(int64_t M, int64_t n0, int64_t n1, int64_t K, const float* A, int64_t lda, const float* W, int64_t ldw,
             float* C, int64_t ldc) {
  gemm_nt_t<float, P>(M, n0, n1, K, A, lda, W, ldw, C, ldc);
}

template <Prefetch P>
void gemm_nt_bf16(int64_t M, int64_t n0, int64_t n1, int64_t K, const float* A, int64_t lda, const uint16_t* W,
                  int64_t ldw, float* C, int64_t ldc) {
  gemm_nt_t<uint16_t, P>(M, n0, n1, K, A, lda, W, ldw, C, ldc);
}

// bf16 dot products without vdpbf16ps (x86/bf16dot_round.h).
template <Prefetch P>
void gemm_nt_bf16dot(int64_t M, int64_t n0, int64_t n1, int64_t K, const float* A, int64_t lda, const uint16_t* W,
                     int64_t ldw, float* C, int64_t ldc) {
  gemm_prepared_chunks<bf16dot_rounded_row_bytes, prepare_bf16dot_rounded, gemm_bf16dot_rounded<gemm_nt_bf16<P>>>(
      M, n0, n1, K, A, lda, W, ldw, C, ldc);
}

// ---- gemm_nt over panels (gemm_nt_p16 / gemm_nt_bf16p16) -------------------

// W in the panel layout (util/panel.h): panel p = rows 16p..16p+15 of W
// stored k-major, so one k step of a panel is 16 contiguous weights, exactly
// one zmm. The tiles broadcast A[i, k] and FMA it into one accumulator per
// row and panel: each output is one FMA chain over k from k = 0, whatever
// the tile, M or column range (the kernels.h contract), so results equal the
// scalar reference bit for bit and equal the AVX2 table's, with no
// horizontal sums.

// Decode tiles prefetch each stream this far ahead (as the AVX2 tiles do).
constexpr int64_t kPanelPrefetchBytes = 1024;

// bf16 panels store columns 4-7 and 8-11 swapped (for AVX2's in-lane
// unpack). Widening 16 bf16 with vpmovzxwd keeps that slot order, so the
// accumulators hold the columns permuted; panel_columns puts them back in
// order as a tile is stored (the swap is its own inverse).
inline __m512 load_panel_row(const float* p) {
  return _mm512_loadu_ps(p);
}
inline __m512 load_panel_row(const uint16_t* p) {
  return widen_bf16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline __m512 panel_columns(const float*, __m512 acc) {
  return acc;
}
inline __m512 panel_columns(const uint16_t*, __m512 acc) {
  const __m512i unslot = _mm512_set_epi32(15, 14, 13, 12, 7, 6, 5, 4, 11, 10, 9, 8, 3, 2, 1, 0);
  return _mm512_permutexvar_ps(unslot, acc);
}

// One k step of a panel tile: acc[i][j] += A[i, k] * (panel j's 16
// weights at k), with a[i] at row i's A[i, k0] and w[j] at panel j's k0,
// k = k0 + t.
template <class WT, int MR, int NP>
__attribute__((always_inline)) inline void panel_step(const float* const (&a)[MR], const WT* const (&w)[NP], int64_t t,
                                                      __m512 (&acc)[MR][NP]) {
  __m512 wv[NP];
#pragma GCC unroll 4
  for (int j = 0; j < NP; ++j) wv[j] = load_panel_row(w[j] + t * kPanel);
#pragma GCC unroll 24
  for (int i = 0; i < MR; ++i) {
    const __m512 av = _mm512_set1_ps(a[i][t]);
#pragma GCC unroll 4
    for (int j = 0; j < NP; ++j) acc[i][j] = _mm512_fmadd_ps(av, wv[j], acc[i][j]);
  }
}

// C[0..MR, 16 * NP columns) = A[0..MR, :K] . (NP panels)^T. Panel j starts
// at W + j * ps and its 16 outputs at C + j * pcs. If `prefetch`, each
// panel's stream is prefetched into L2 kPanelPrefetchBytes ahead (past a
// panel's end that is the next panel in memory; prefetches never fault).
// Registers: MR * NP accumulators + NP weights (<= 28 of the 32 zmm).
template <class WT, int MR, int NP>
void panel_tile(int64_t K, const float* A, int64_t lda, const WT* W, int64_t ps, float* C, int64_t ldc, int64_t pcs,
                bool prefetch, PanelSpread spread) {
  static_assert(MR * NP + NP <= 28, "tile must fit in registers");
  SpreadState spread_state(spread);
  __m512 acc[MR][NP];
#pragma GCC unroll 24
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NP; ++j) acc[i][j] = _mm512_setzero_ps();
  constexpr int64_t kRowsPerLine = 64 / (kPanel * static_cast<int64_t>(sizeof(WT)));
  constexpr int64_t kAhead = kPanelPrefetchBytes / (kPanel * static_cast<int64_t>(sizeof(WT)));
  // Blocks of 16 k (a cache line of each row of A), a whole block
  // unrolled, so each broadcast and weight load is one load off a pointer
  // plus a constant, and the prefetch and spread bookkeeping runs once a
  // block. The last block may be shorter.
  constexpr int64_t kB = 16;
  const int64_t blocks = (K + kB - 1) / kB;  // spread steps: one a block
  for (int64_t k = 0; k < K; k += kB) {
    const float* a[MR];
#pragma GCC unroll 24
    for (int i = 0; i < MR; ++i) a[i] = A + i * lda + k;
    const WT* w[NP];
#pragma GCC unroll 4
    for (int j = 0; j < NP; ++j) w[j] = W + j * ps + k * kPanel;
      // Opaque to the optimizer: GCC 12 otherwise strength-reduces the rows'
      // addresses across k and keeps several in xmm registers or on the
      // stack, a vmovq (port 0, which the FMAs need) or a reload for a
      // broadcast of every k. One thread, bench_kernels
      // avx512/gemm_nt_(p16|bf16p16)_(hot|stream)/M(32|128)_N1536_K512: f32
      // 4-24% more GFLOP/s, bf16 1-11% (docs/performance.md). Copying each
      // block of rows to the stack instead, to broadcast off one pointer, was
      // slower for f32 (M32 hot 143-145 against 159-165).
#pragma GCC unroll 24
    for (int i = 0; i < MR; ++i) __asm__("" : "+r"(a[i]));
#pragma GCC unroll 4
    for (int j = 0; j < NP; ++j) __asm__("" : "+r"(w[j]));
    if (prefetch) {  // a short last block prefetches past K: hints never fault
#pragma GCC unroll 16
      for (int64_t t = 0; t < kB; t += kRowsPerLine)
#pragma GCC unroll 4
        for (int j = 0; j < NP; ++j)
          _mm_prefetch(reinterpret_cast<const char*>(w[j] + (t + kAhead) * kPanel), _MM_HINT_T1);
    }
    if (spread.lines > 0) panel_spread_step(spread, spread_state, blocks);
    if (K - k >= kB) {
#pragma GCC unroll 16
      for (int64_t t = 0; t < kB; ++t) panel_step(a, w, t, acc);
    } else {
      for (int64_t t = 0; t < K - k; ++t) panel_step(a, w, t, acc);
    }
  }
#pragma GCC unroll 24
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NP; ++j) _mm512_storeu_ps(C + i * ldc + j * pcs, panel_columns(W, acc[i][j]));
}

template <class WT>
using PanelTileFn = void (*)(int64_t, const float*, int64_t, const WT*, int64_t, float*, int64_t, int64_t, bool,
                             PanelSpread);

// Prefill (M > 8): tiles of up to kPanelMr rows x kPanelGroup adjacent
// panels, 24 FMAs per 2 weight loads and 12 broadcasts; each group of
// panels is reused from cache by every row tile. Rows and panels left over
// use the smaller tiles of the same tables. (8 rows x 3 panels measured the
// same within noise, end to end and in bench_kernels.) The first row tile
// that brings a thread's first group from memory prefetches its own
// streams: one thread with W from DRAM, M 32, went from 135-138 to 148-159
// GFLOP/s for bf16 panels and 107-113 to 117-128 for f32 (bench_kernels
// avx512/gemm_nt_(bf16p16|p16)_stream/M32_*). Every later group arrives by
// the spread prefetch (gemm_panels_whole).
constexpr int64_t kPanelMr = 12;
constexpr int kPanelGroup = 2;
template <class WT, int NP, size_t... I>
constexpr std::array<PanelTileFn<WT>, sizeof...(I)> make_panel_tiles(std::index_sequence<I...>) {
  return {panel_tile<WT, static_cast<int>(I) + 1, NP>...};
}
template <class WT, int NP>
constexpr auto kPanelTiles = make_panel_tiles<WT, NP>(std::make_index_sequence<kPanelMr>());
// The row tiles of np panels, 1 <= np <= kPanelGroup.
static_assert(kPanelGroup == 2, "panel_tiles picks between the 1- and 2-panel tables");
template <class WT>
const PanelTileFn<WT>* panel_tiles(int64_t np) {
  return np == 2 ? kPanelTiles<WT, 2>.data() : kPanelTiles<WT, 1>.data();
}

// Decode (M <= 8): every row of A in one tile over far(M) panels a
// (p1 - p0) / far(M) apart, so W is read once and each thread keeps far(M)
// memory streams open, as the row kernel's far tiles do: 4 up to 4 rows
// (4 x 4 accumulators + 4 weights), 3 above (8 x 3 + 3 = 27 zmm). 4 streams
// instead of 3 at M <= 4 read 5-8% faster (bench_kernels
// avx512/gemm_nt_(bf16p16|p16)_stream/M(1|4), one thread; 8 streams at M 1
// were no better) and took k3-base bf16-f32 panel decode from 91-93% of the
// read bandwidth to 92-98% at batch 1 (docs/performance.md).
constexpr int64_t panel_far(int64_t M) {
  return M <= 4 ? 4 : 3;
}
template <class WT>
constexpr PanelTileFn<WT> kPanelFarTiles[kFarMaxM] = {panel_tile<WT, 1, panel_far(1)>, panel_tile<WT, 2, panel_far(2)>,
                                                      panel_tile<WT, 3, panel_far(3)>, panel_tile<WT, 4, panel_far(4)>,
                                                      panel_tile<WT, 5, panel_far(5)>, panel_tile<WT, 6, panel_far(6)>,
                                                      panel_tile<WT, 7, panel_far(7)>, panel_tile<WT, 8, panel_far(8)>};

// C[M, 16 * p0 .. 16 * p1) over whole panels p0 <= p < p1.
template <class WT>
void gemm_panels_whole(int64_t M, int64_t p0, int64_t p1, int64_t K, const float* A, int64_t lda, const WT* W, float* C,
                       int64_t ldc, ReadNext read_next) {
  const int64_t ps = K * kPanel;
  if (M <= kFarMaxM) {
    const int64_t far = panel_far(M);
    const int64_t q = (p1 - p0) / far;
    for (int64_t i = 0; i < q; ++i) {
      const int64_t p = p0 + i;
      kPanelFarTiles<WT>[M - 1](K, A, lda, W + p * ps, q * ps, C + p * kPanel, ldc, q * kPanel, true, {});
    }
    for (int64_t p = p0 + far * q; p < p1; ++p)
      kPanelTiles<WT, 1>[M - 1](K, A, lda, W + p * ps, ps, C + p * kPanel, ldc, kPanel, true, {});
    return;
  }
  // Row tiles of near-equal height (32 rows: 10, 11, 11), so no tile is
  // left with a row or two that cannot hide the FMA latency. While row tile
  // r of R multiplies panel group g, it prefetches the r-th R-th of group
  // g + 1 into L2 (PanelSpread, panel_split.h), and the last group prefetches
  // the start of the caller's next weights (read_next). Memory so streams
  // for as long as the arithmetic runs, where before it waited on the first
  // row tile of each group and sat idle in the others. One thread, W from
  // DRAM, M 32: f32 115-129 -> 150-161 GFLOP/s, bf16 146-158 -> 163-175
  // (bench_kernels avx512/gemm_nt_(p16|bf16p16)_stream/M32_*); k3-base fp32
  // panel prefill 46 -> 51% of the FMA peak (docs/performance.md).
  const int64_t tiles = (M + kPanelMr - 1) / kPanelMr;
  const int64_t panel_bytes = ps * static_cast<int64_t>(sizeof(WT));
  for (int64_t p = p0; p < p1; p += kPanelGroup) {
    const int64_t np = min64(kPanelGroup, p1 - p), nn = min64(kPanelGroup, p1 - p - np);
    const PanelSpread after =
        panel_spread_after(W + (p + np) * ps, nn * panel_bytes, read_next, kPanelGroup * panel_bytes);
    const PanelTileFn<WT>* row_tiles = panel_tiles<WT>(np);
    for (int64_t r = 0; r < tiles; ++r) {
      const RowTile t = row_tile(M, r, tiles, after);
      row_tiles[t.mr - 1](K, A + t.m * lda, lda, W + p * ps, ps, C + t.m * ldc + p * kPanel, ldc, kPanel,
                          p == p0 && r == 0, t.spread);
    }
  }
}

template <class WT>
void gemm_panels(int64_t M, int64_t n0, int64_t n1, int64_t K, const float* A, int64_t lda, const WT* W, float* C,
                 int64_t ldc, ReadNext next) {
  const int64_t ps = K * kPanel;
  gemm_panels_split<kPanelMr>(
      M, n0, n1, C, ldc, [&](int64_t p0, int64_t p1) { gemm_panels_whole(M, p0, p1, K, A, lda, W, C, ldc, next); },
      [&](int64_t m, int64_t mr, int64_t p, float* out) {
        kPanelTiles<WT, 1>[mr - 1](K, A + m * lda, lda, W + p * ps, ps, out, kPanel, kPanel, false, {});
      });
}

void gemm_nt_p16(int64_t M, int64_t n0, int64_t n1, int64_t K, const float* A, int64_t lda, const float* W, float* C,
                 int64_t ldc, ReadNext next) {
  gemm_panels(M, n0, n1, K, A, lda, W, C, ldc, next);
}

void gemm_nt_bf16p16(int64_t M, int64_t n0, int64_t n1, int64_t K, const float* A, int64_t lda, const uint16_t* W,
                     float* C, int64_t ldc, ReadNext next) {
  gemm_panels(M, n0, n1, K, A, lda, W, C, ldc, next);
}

// ---- element-wise ----------------------------------------------------------

// y[i] = f(x[i]) for i < n, 16 lanes at a time, masked tail. y may alias x.
template <class F>
inline void map1(const float* x, int64_t n, float* y, F f) {
  int64_t i = 0;
  for (; i + kW <= n; i += kW) _mm512_storeu_ps(y + i, f(_mm512_loadu_ps(x + i)));
  if (i < n) {
    const __mmask16 mask = tail_mask(n - i);
    _mm512_mask_storeu_ps(y + i, mask, f(_mm512_maskz_loadu_ps(mask, x + i)));
  }
}

// y[i] = f(a[i], b[i]) for i < n. y may alias a or b.
template <class F>
inline void map2(const float* a, const float* b, int64_t n, float* y, F f) {
  int64_t i = 0;
  for (; i + kW <= n; i += kW) _mm512_storeu_ps(y + i, f(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i)));
  if (i < n) {
    const __mmask16 mask = tail_mask(n - i);
    _mm512_mask_storeu_ps(y + i, mask, f(_mm512_maskz_loadu_ps(mask, a + i), _mm512_maskz_loadu_ps(mask, b + i)));
  }
}

// y[i] = 0 for i < n.
inline void zero(float* y, int64_t n) {
  int64_t i = 0;
  for (; i + kW <= n; i += kW) _mm512_storeu_ps(y + i, _mm512_setzero_ps());
  if (i < n) _mm512_mask_storeu_ps(y + i, tail_mask(n - i), _mm512_setzero_ps());
}

// x, y: [n]. 0.5 * x * (1 + erf(x / sqrt(2))).
void gelu(const float* x, int64_t n, float* y) {
  map1(x, n, y, [](__m512 v) {
    const __m512 e = erf_ps(_mm512_mul_ps(v, _mm512_set1_ps(0.70710678118654752f)));
    return _mm512_mul_ps(_mm512_mul_ps(v, _mm512_set1_ps(0.5f)), _mm512_add_ps(e, _mm512_set1_ps(1.0f)));
  });
}

// g, u, y: [n]. g / (1 + exp(-g)) * u; exp_ps's clamp keeps g = -100 at a
// tiny negative value and g = +100 at exactly 100.
void silu_mul(const float* g, const float* u, int64_t n, float* y) {
  map2(g, u, n, y, [](__m512 gv, __m512 uv) {
    const __m512 den = _mm512_add_ps(_mm512_set1_ps(1.0f), exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), gv)));
    return _mm512_mul_ps(_mm512_div_ps(gv, den), uv);
  });
}

// a, b, y: [n].
void add(const float* a, const float* b, int64_t n, float* y) {
  map2(a, b, n, y, [](__m512 av, __m512 bv) { return _mm512_add_ps(av, bv); });
}

// x, y: [n]; y += alpha * x.
void axpy(float alpha, const float* x, int64_t n, float* y) {
  const __m512 va = _mm512_set1_ps(alpha);
  map2(x, y, n, y, [va](__m512 xv, __m512 yv) { return _mm512_fmadd_ps(va, xv, yv); });
}

// x: [n]. Two passes over x (one vocabulary row of logits, in L1/L2): the
// largest value, then its first index. vmaxps returns its second operand
// when either is NaN, so a NaN never replaces the running maxima (which
// start at -inf), and the tail's masked-off lanes load -inf.
int64_t argmax(const float* x, int64_t n) {
  if (n <= 0) return 0;
  const __m512 ninf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __m512 m[4] = {ninf, ninf, ninf, ninf};  // 4 chains: vmaxps latency
  int64_t i = 0;
  for (; i + 4 * kW <= n; i += 4 * kW)
    for (int j = 0; j < 4; ++j) m[j] = _mm512_max_ps(_mm512_loadu_ps(x + i + j * kW), m[j]);
  for (; i + kW <= n; i += kW) m[0] = _mm512_max_ps(_mm512_loadu_ps(x + i), m[0]);
  if (i < n) m[0] = _mm512_max_ps(_mm512_mask_loadu_ps(ninf, tail_mask(n - i), x + i), m[0]);
  const __m512 best =
      _mm512_set1_ps(_mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(m[0], m[1]), _mm512_max_ps(m[2], m[3]))));
  for (i = 0; i < n; i += kW) {
    const __mmask16 in = lanes_before(i, n);
    const __mmask16 eq = _mm512_mask_cmp_ps_mask(in, _mm512_maskz_loadu_ps(in, x + i), best, _CMP_EQ_OQ);
    if (eq != 0) return i + __builtin_ctz(eq);
  }
  return 0;  // every value NaN
}

// x: [n] -> out: [count]. A compare mask per 16 values, the matching
// indices packed with vpcompressd into a register (its store-to-memory
// form is slow on Zen 4) and stored under a mask of their count.
int64_t indices_at_least(const float* x, int64_t n, float t, int32_t base, int32_t* out) {
  const __m512 vt = _mm512_set1_ps(t);
  __m512i idx = _mm512_add_epi32(_mm512_set1_epi32(base),
                                 _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
  const __m512i step = _mm512_set1_epi32(static_cast<int32_t>(kW));
  int64_t c = 0;
  for (int64_t i = 0; i < n; i += kW) {
    const __mmask16 in = lanes_before(i, n);
    const __mmask16 m = _mm512_mask_cmp_ps_mask(in, _mm512_maskz_loadu_ps(in, x + i), vt, _CMP_GE_OQ);
    if (m != 0) {
      const int k = __builtin_popcount(m);
      _mm512_mask_storeu_epi32(out + c, static_cast<__mmask16>((1u << k) - 1), _mm512_maskz_compress_epi32(m, idx));
      c += k;
    }
    idx = _mm512_add_epi32(idx, step);
  }
  return c;
}

// x, p: [n]. exp_ps per 16 values, 0 where d is below the floor (or NaN).
float exp_shifted(const float* x, int64_t n, float mx, float inv_t, float* p) {
  const __m512 vmx = _mm512_set1_ps(mx), vt = _mm512_set1_ps(inv_t), floor = _mm512_set1_ps(kExpShiftedMin);
  __m512 sum = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += kW) {
    const __mmask16 in = lanes_before(i, n);
    const __m512 d = _mm512_mul_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(in, x + i), vmx), vt);
    const __m512 e = _mm512_maskz_mov_ps(_mm512_mask_cmp_ps_mask(in, d, floor, _CMP_GE_OQ), exp_ps(d));
    _mm512_mask_storeu_ps(p + i, in, e);
    sum = _mm512_add_ps(sum, e);
  }
  return _mm512_reduce_add_ps(sum);
}

// ---- normalisation ---------------------------------------------------------

// sum_i x[i] over [n].
inline float sum(const float* x, int64_t n) {
  __m512 s = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + kW <= n; i += kW) s = _mm512_add_ps(s, _mm512_loadu_ps(x + i));
  if (i < n) s = _mm512_add_ps(s, _mm512_maskz_loadu_ps(tail_mask(n - i), x + i));
  return hsum(s);
}

// sum_i (x[i] - c)^2 over [n]; masked-off tail lanes must add 0, not c^2.
inline float sum_sq_dev(const float* x, int64_t n, float c) {
  const __m512 vc = _mm512_set1_ps(c);
  __m512 s = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + kW <= n; i += kW) {
    const __m512 d = _mm512_sub_ps(_mm512_loadu_ps(x + i), vc);
    s = _mm512_fmadd_ps(d, d, s);
  }
  if (i < n) {
    const __mmask16 mask = tail_mask(n - i);
    const __m512 d = _mm512_maskz_sub_ps(mask, _mm512_maskz_loadu_ps(mask, x + i), vc);
    s = _mm512_fmadd_ps(d, d, s);
  }
  return hsum(s);
}

// x, w, b, y: [n]. Two passes: mean, then variance of the centred values.
void layernorm(const float* x, const float* w, const float* b, float eps, int64_t n, float* y) {
  if (n == 0) return;
  const float mean = sum(x, n) / static_cast<float>(n);
  const float rstd = 1.0f / sqrtf(sum_sq_dev(x, n, mean) / static_cast<float>(n) + eps);
  const __m512 vm = _mm512_set1_ps(mean);
  const __m512 vr = _mm512_set1_ps(rstd);
  int64_t i = 0;
  for (; i + kW <= n; i += kW) {
    const __m512 xn = _mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(x + i), vm), vr);
    _mm512_storeu_ps(y + i, _mm512_fmadd_ps(xn, _mm512_loadu_ps(w + i), _mm512_loadu_ps(b + i)));
  }
  if (i < n) {
    const __mmask16 mask = tail_mask(n - i);
    const __m512 xn = _mm512_mul_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(mask, x + i), vm), vr);
    _mm512_mask_storeu_ps(y + i, mask,
                          _mm512_fmadd_ps(xn, _mm512_maskz_loadu_ps(mask, w + i), _mm512_maskz_loadu_ps(mask, b + i)));
  }
}

// x, w, y: [n].
void rmsnorm(const float* x, const float* w, float eps, int64_t n, float* y) {
  if (n == 0) return;
  const float rstd = 1.0f / sqrtf(sum_sq_dev(x, n, 0.0f) / static_cast<float>(n) + eps);
  const __m512 vr = _mm512_set1_ps(rstd);
  map2(x, w, n, y, [vr](__m512 xv, __m512 wv) { return _mm512_mul_ps(_mm512_mul_ps(xv, vr), wv); });
}

// ---- attention -------------------------------------------------------------

// Lanes of a K or V cache row as f32: f32 rows as stored, bf16 rows
// widened (exact: a bf16 value is the top half of its f32).
inline __m512 load_cache(__mmask16 m, const float* p) {
  return _mm512_maskz_loadu_ps(m, p);
}
inline __m512 load_cache(__mmask16 m, const uint16_t* p) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16));
}

// Software prefetch distance of attend, in positions. With the cache in
// memory (bench_kernels avx512/attend_stream, hd 64, one thread, 3 rounds)
// no prefetch read 16.6-22.2 GB/s at len 128 and 18.3-22.9 at len 1024;
// 4 positions ahead 24.4-29.3 and 25.9-30.4; 8 ahead 24.5-29.4 and
// 26.9-31.3; 16 and 32 ahead no better than none.
constexpr int64_t kAttendAhead = 8;

// Lane b of the result = the sum of d[b]'s 16 lanes: a transpose-add tree,
// 30 shuffles and 15 adds for 16 sums (16 separate horizontal sums take
// about 4 times as many).
inline __m512 hsum16(const __m512 (&d)[16]) {
  __m512 x[8];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i)  // per 128-bit lane: [a0+a2, b0+b2, a1+a3, b1+b3]
    x[i] = _mm512_add_ps(_mm512_unpacklo_ps(d[2 * i], d[2 * i + 1]), _mm512_unpackhi_ps(d[2 * i], d[2 * i + 1]));
  __m512 y[4];
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {  // per 128-bit lane L: the lane-L sums of d[4i .. 4i+3]
    const __m512d a = _mm512_castps_pd(x[2 * i]), b = _mm512_castps_pd(x[2 * i + 1]);
    y[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
  }
  // 128-bit lanes [L0, L2 | L0, L2] + [L1, L3 | L1, L3] of two y's: lane
  // pairs summed; then the same across the two results.
  const __m512 u01 = _mm512_add_ps(_mm512_shuffle_f32x4(y[0], y[1], 0x88), _mm512_shuffle_f32x4(y[0], y[1], 0xDD));
  const __m512 u23 = _mm512_add_ps(_mm512_shuffle_f32x4(y[2], y[3], 0x88), _mm512_shuffle_f32x4(y[2], y[3], 0xDD));
  return _mm512_add_ps(_mm512_shuffle_f32x4(u01, u23, 0x88), _mm512_shuffle_f32x4(u01, u23, 0xDD));
}

// Online softmax for hd <= NV * 16: the running output (unnormalised) lives in
// NV registers, with the running max `mx` and running sum `l`. Positions are
// taken in blocks of up to 4 so their dot products overlap; the accumulator
// is rescaled only when a block raises the max (exp(mx - new) <= 1, never
// overflows), so large scores are as safe as in attend_dense's passes.
template <int NV, class T>
struct OnlineSoftmax {
  __m512 acc[NV];
  float mx;  // running max score (-inf before the first position)
  float l;   // running sum of exp(s - mx)

  // Lanes used in vector `vi` of a row of hd floats.
  static __mmask16 lanes(int vi, int64_t hd) {
    return vi < NV - 1 ? static_cast<__mmask16>(0xFFFF) : tail_mask(hd - (NV - 1) * kW);
  }

  template <int B>
  void block(const float* q, const T* k, const T* v, int64_t hd, int64_t stride, float scale) {
    float s[B];
    __m512 d[B];
#pragma GCC unroll 4
    for (int b = 0; b < B; ++b) d[b] = _mm512_setzero_ps();
#pragma GCC unroll 16
    for (int vi = 0; vi < NV; ++vi) {
      const __mmask16 m = lanes(vi, hd);
      const __m512 qv = _mm512_maskz_loadu_ps(m, q + vi * kW);
#pragma GCC unroll 4
      for (int b = 0; b < B; ++b) d[b] = _mm512_fmadd_ps(qv, load_cache(m, k + b * stride + vi * kW), d[b]);
    }
    float bmax = -__builtin_inff();
#pragma GCC unroll 4
    for (int b = 0; b < B; ++b) {
      s[b] = scale * hsum(d[b]);
      bmax = s[b] > bmax ? s[b] : bmax;
    }
    // exp_ps (inline) rather than expf: a libm call would force every
    // accumulator register to be spilled around it.
    if (bmax > mx) {
      // exp(mx - bmax) <= 1; on the first block mx = -inf clamps to ~1e-38,
      // harmless as acc and l are still 0.
      const __m512 va = exp_ps(_mm512_set1_ps(mx - bmax));
#pragma GCC unroll 16
      for (int vi = 0; vi < NV; ++vi) acc[vi] = _mm512_mul_ps(acc[vi], va);
      l *= _mm512_cvtss_f32(va);
      mx = bmax;
    }
    // Lane b of pv = exp(s[b] - mx), the block's weights from one vector exp.
    static_assert(B == 1 || B == 4, "blocks are 4 positions, or 1 for the tail");
    __m128 sv;
    if constexpr (B == 4) {
      sv = _mm_setr_ps(s[0], s[1], s[2], s[3]);
    } else {
      sv = _mm_set1_ps(s[0]);
    }
    const __m512 pv = exp_ps(_mm512_sub_ps(_mm512_broadcast_f32x4(sv), _mm512_set1_ps(mx)));
    __m128 p4 = _mm512_castps512_ps128(pv);
    if constexpr (B == 4) {
      p4 = _mm_add_ps(p4, _mm_movehl_ps(p4, p4));
      p4 = _mm_add_ss(p4, _mm_movehdup_ps(p4));
    }
    l += _mm_cvtss_f32(p4);
#pragma GCC unroll 4
    for (int b = 0; b < B; ++b) {
      const __m512 vp = _mm512_permutexvar_ps(_mm512_set1_epi32(b), pv);
#pragma GCC unroll 16
      for (int vi = 0; vi < NV; ++vi)
        acc[vi] = _mm512_fmadd_ps(vp, load_cache(lanes(vi, hd), v + b * stride + vi * kW), acc[vi]);
    }
  }
};

// q: [hd]; k, v: [len, hd] with row stride `stride` (elements of T); out:
// [hd]; hd <= NV * 16. Rows of other lengths than the cache's (attend_dense).
template <int NV, class T>
AttendStats attend_regs(const float* q, const T* k, const T* v, int64_t len, int64_t hd, int64_t stride, float scale,
                        float* out) {
  // One prefetch per 64-byte line: a line holds 16 f32 or 32 bf16 values.
  constexpr int kLineVectors = sizeof(T) == 2 ? 2 : 1;
  OnlineSoftmax<NV, T> st;
#pragma GCC unroll 16
  for (int vi = 0; vi < NV; ++vi) st.acc[vi] = _mm512_setzero_ps();
  st.mx = -__builtin_inff();
  st.l = 0.0f;
  int64_t j = 0;
  for (; j + 4 <= len; j += 4) {
    // K and V rows kAttendAhead positions on, into L1: a decode step reads
    // the cache from memory, one K and one V stream per call.
    if (j + kAttendAhead + 4 <= len) {
#pragma GCC unroll 4
      for (int b = 0; b < 4; ++b)
#pragma GCC unroll 16
        for (int vi = 0; vi < NV; vi += kLineVectors) {
          _mm_prefetch(reinterpret_cast<const char*>(k + (j + kAttendAhead + b) * stride + vi * kW), _MM_HINT_T0);
          _mm_prefetch(reinterpret_cast<const char*>(v + (j + kAttendAhead + b) * stride + vi * kW), _MM_HINT_T0);
        }
    }
    st.template block<4>(q, k + j * stride, v + j * stride, hd, stride, scale);
  }
  for (; j < len; ++j) st.template block<1>(q, k + j * stride, v + j * stride, hd, stride, scale);
  const __m512 vl = _mm512_set1_ps(st.l);
#pragma GCC unroll 16
  for (int vi = 0; vi < NV; ++vi)
    _mm512_mask_storeu_ps(out + vi * kW, OnlineSoftmax<NV, T>::lanes(vi, hd), _mm512_div_ps(st.acc[vi], vl));
  return {st.mx, st.l};
}

// Positions per chunk of attend_dense's scores: 2 KiB on the stack.
constexpr int64_t kScoreChunk = 512;

// Rows exactly NV vectors long (stride == hd == NV * 16, as the attention
// op's cache rows are), in three passes over chunks of kScoreChunk
// positions instead of one online pass:
//   1. s[j] = scale * dot(q, K[j]), 16 positions per transpose-add tree
//      (hsum16), and their max;
//   2. s[j] = exp(s[j] - max), 16 at a time, and their sum;
//   3. acc += s[j] * V[j], in two sets of accumulators (even and odd j)
//      so the chains of dependent FMAs are half as long.
// The max is known before any exp, so no block rescales the accumulators
// or takes a data-dependent branch (only a later chunk with a larger max
// rescales, once). kPrefetch: passes 1 and 3 fetch the K and the V rows 16
// positions ahead into P's level (a decode step reads the cache from
// memory); rows in cache (a prefill chunk's) leave the hints out.
// One thread, hd 64 (bench_kernels avx512/attend*, 2 rounds in turn,
// GFLOP/s at len 128 / 1024), against the online softmax this replaced
// (16-position blocks, hints for both rows 16 ahead in the one pass):
// in cache, 37.2-37.3 / 36.5-36.6 -> 50.2-50.5 / 52.1-52.2 without hints
// (37.5 / 39.8 with them); streamed, 10.2-10.3 / 10.8-10.9 -> 10.3 /
// 11.5-11.6. With V fetched into L2 during pass 1 instead, streaming ran
// 8.6-9.0 / 9.0-9.2.
template <int NV, class T, Prefetch P, bool kPrefetch>
AttendStats attend_dense(const float* q, const T* k, const T* v, int64_t len, float scale, float* out) {
  constexpr int64_t hd = NV * kW;
  constexpr int kLineVectors = sizeof(T) == 2 ? 2 : 1;  // a 64-byte line holds 16 f32 or 32 bf16
  constexpr __mmask16 kAll = 0xFFFF;
  __m512 qv[NV], acc0[NV], acc1[NV];
#pragma GCC unroll 8
  for (int vi = 0; vi < NV; ++vi) {
    qv[vi] = _mm512_loadu_ps(q + vi * kW);
    acc0[vi] = _mm512_setzero_ps();
    acc1[vi] = _mm512_setzero_ps();
  }
  float mx = -__builtin_inff();  // running max score
  float l = 0.0f;                // running sum of exp(s - mx)
  alignas(64) float s[kScoreChunk];
  for (int64_t c0 = 0; c0 < len; c0 += kScoreChunk) {
    const int64_t n = min64(kScoreChunk, len - c0);
    const T* kc = k + c0 * hd;
    const T* vc = v + c0 * hd;
    // 1. Scores and their max.
    __m512 vmax = _mm512_set1_ps(-__builtin_inff());
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) {
      if (kPrefetch && j + 32 <= n) {
#pragma GCC unroll 16
        for (int b = 0; b < 16; ++b)
#pragma GCC unroll 8
          for (int vi = 0; vi < NV; vi += kLineVectors)
            _mm_prefetch(reinterpret_cast<const char*>(kc + (j + 16 + b) * hd + vi * kW), kHintOf<P>);
      }
      __m512 d[16];
#pragma GCC unroll 16
      for (int b = 0; b < 16; ++b) d[b] = _mm512_setzero_ps();
#pragma GCC unroll 8
      for (int vi = 0; vi < NV; ++vi)
#pragma GCC unroll 16
        for (int b = 0; b < 16; ++b)
          d[b] = _mm512_fmadd_ps(qv[vi], load_cache(kAll, kc + (j + b) * hd + vi * kW), d[b]);
      const __m512 sv = _mm512_mul_ps(_mm512_set1_ps(scale), hsum16(d));
      _mm512_store_ps(s + j, sv);
      vmax = _mm512_max_ps(vmax, sv);
    }
    float cmax = _mm512_reduce_max_ps(vmax);
    for (; j < n; ++j) {  // the last n % 16 positions, one at a time
      __m512 d = _mm512_setzero_ps();
#pragma GCC unroll 8
      for (int vi = 0; vi < NV; ++vi) d = _mm512_fmadd_ps(qv[vi], load_cache(kAll, kc + j * hd + vi * kW), d);
      s[j] = scale * hsum(d);
      cmax = s[j] > cmax ? s[j] : cmax;
    }
    // A larger max than the earlier chunks': rescale what they summed
    // (exp(mx - cmax) <= 1; on the first chunk mx = -inf clamps to ~1e-38,
    // harmless as acc and l are still 0).
    if (cmax > mx) {
      const __m512 va = exp_ps(_mm512_set1_ps(mx - cmax));
#pragma GCC unroll 8
      for (int vi = 0; vi < NV; ++vi) {
        acc0[vi] = _mm512_mul_ps(acc0[vi], va);
        acc1[vi] = _mm512_mul_ps(acc1[vi], va);
      }
      l *= _mm512_cvtss_f32(va);
      mx = cmax;
    }
    // 2. Weights and their sum.
    const __m512 vmx = _mm512_set1_ps(mx);
    __m512 vsum = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i += 16) {
      const __mmask16 m = tail_mask(min64(16, n - i));
      const __m512 pv = _mm512_maskz_mov_ps(m, exp_ps(_mm512_sub_ps(_mm512_load_ps(s + i), vmx)));
      _mm512_store_ps(s + i, pv);
      vsum = _mm512_add_ps(vsum, pv);
    }
    l += _mm512_reduce_add_ps(vsum);
    // 3. The weighted sum of V rows.
    int64_t i = 0;
    for (; i + 2 <= n; i += 2) {
      if (kPrefetch && i + 18 <= n) {
#pragma GCC unroll 8
        for (int vi = 0; vi < NV; vi += kLineVectors) {
          _mm_prefetch(reinterpret_cast<const char*>(vc + (i + 16) * hd + vi * kW), kHintOf<P>);
          _mm_prefetch(reinterpret_cast<const char*>(vc + (i + 17) * hd + vi * kW), kHintOf<P>);
        }
      }
      const __m512 p0 = _mm512_set1_ps(s[i]), p1 = _mm512_set1_ps(s[i + 1]);
#pragma GCC unroll 8
      for (int vi = 0; vi < NV; ++vi) {
        acc0[vi] = _mm512_fmadd_ps(p0, load_cache(kAll, vc + i * hd + vi * kW), acc0[vi]);
        acc1[vi] = _mm512_fmadd_ps(p1, load_cache(kAll, vc + (i + 1) * hd + vi * kW), acc1[vi]);
      }
    }
    if (i < n) {
      const __m512 p0 = _mm512_set1_ps(s[i]);
#pragma GCC unroll 8
      for (int vi = 0; vi < NV; ++vi) acc0[vi] = _mm512_fmadd_ps(p0, load_cache(kAll, vc + i * hd + vi * kW), acc0[vi]);
    }
  }
  const __m512 vl = _mm512_set1_ps(l);
#pragma GCC unroll 8
  for (int vi = 0; vi < NV; ++vi) _mm512_storeu_ps(out + vi * kW, _mm512_div_ps(_mm512_add_ps(acc0[vi], acc1[vi]), vl));
  return {mx, l};
}

// Any hd, len >= 1: attend_regs's online softmax one position at a time,
// accumulating in `out` itself (L1-resident) instead of registers.
template <class T>
AttendStats attend_any(const float* q, const T* k, const T* v, int64_t len, int64_t hd, int64_t stride, float scale,
                       float* out) {
  zero(out, hd);
  float mx = -__builtin_inff();
  float l = 0.0f;
  for (int64_t j = 0; j < len; ++j) {
    const T* kj = k + j * stride;
    const T* vj = v + j * stride;
    __m512 d = _mm512_setzero_ps();
    for (int64_t i = 0; i < hd; i += kW) {
      const __mmask16 mask = tail_mask(min64(kW, hd - i));
      d = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mask, q + i), load_cache(mask, kj + i), d);
    }
    const float s = scale * hsum(d);
    if (s > mx) {
      const float alpha = expf(mx - s);  // 0 on the first position
      const __m512 va = _mm512_set1_ps(alpha);
      map1(out, hd, out, [va](__m512 o) { return _mm512_mul_ps(o, va); });
      l *= alpha;
      mx = s;
    }
    const float p = expf(s - mx);
    l += p;
    const __m512 vp = _mm512_set1_ps(p);
    for (int64_t i = 0; i < hd; i += kW) {
      const __mmask16 mask = tail_mask(min64(kW, hd - i));
      _mm512_mask_storeu_ps(out + i, mask,
                            _mm512_fmadd_ps(vp, load_cache(mask, vj + i), _mm512_maskz_loadu_ps(mask, out + i)));
    }
  }
  const __m512 vl = _mm512_set1_ps(l);
  map1(out, hd, out, [vl](__m512 o) { return _mm512_div_ps(o, vl); });
  return {mx, l};
}

template <class T>
using AttendFn = AttendStats (*)(const float*, const T*, const T*, int64_t, int64_t, int64_t, float, float*);
template <class T>
using DenseAttendFn = AttendStats (*)(const float*, const T*, const T*, int64_t, float, float*);

// kAttendRegs<T>[nv - 1] handles hd in ((nv - 1) * 16, nv * 16], i.e. up to 256.
template <class T>
constexpr AttendFn<T> kAttendRegs[] = {
    attend_regs<1, T>,  attend_regs<2, T>,  attend_regs<3, T>,  attend_regs<4, T>,
    attend_regs<5, T>,  attend_regs<6, T>,  attend_regs<7, T>,  attend_regs<8, T>,
    attend_regs<9, T>,  attend_regs<10, T>, attend_regs<11, T>, attend_regs<12, T>,
    attend_regs<13, T>, attend_regs<14, T>, attend_regs<15, T>, attend_regs<16, T>,
};
constexpr int64_t kMaxRegVectors = 16;
// kAttendDense<T, P, kPrefetch>[nv - 1]: rows of exactly nv vectors.
template <class T, Prefetch P, bool kPrefetch>
constexpr DenseAttendFn<T> kAttendDense[] = {
    attend_dense<1, T, P, kPrefetch>, attend_dense<2, T, P, kPrefetch>, attend_dense<3, T, P, kPrefetch>,
    attend_dense<4, T, P, kPrefetch>, attend_dense<5, T, P, kPrefetch>, attend_dense<6, T, P, kPrefetch>,
    attend_dense<7, T, P, kPrefetch>, attend_dense<8, T, P, kPrefetch>,
};
constexpr int64_t kMaxDenseVectors = 8;

// q: [hd]; k, v: [len, hd] with row stride `stride`; out: [hd]. len == 0
// gives zeros, as in the reference. kPrefetch: rows read from memory (the
// table's attend) or in cache (attend_cached); the same bits either way.
template <class T, Prefetch P, bool kPrefetch>
AttendStats attend_rows(const float* q, const T* k, const T* v, int64_t len, int64_t hd, int64_t stride, float scale,
                        float* out) {
  if (len == 0) {
    zero(out, hd);
    return {-__builtin_inff(), 0.0f};
  }
  const int64_t nv = (hd + kW - 1) / kW;
  if (nv == 0) return {0.0f, static_cast<float>(len)};  // hd 0: every score 0
  if (nv > kMaxRegVectors) return attend_any(q, k, v, len, hd, stride, scale, out);
  if (nv <= kMaxDenseVectors && hd == nv * kW && stride == hd)
    return kAttendDense<T, P, kPrefetch>[nv - 1](q, k, v, len, scale, out);
  return kAttendRegs<T>[nv - 1](q, k, v, len, hd, stride, scale, out);
}

template <Prefetch P>
constexpr KernelTable kTable = {
    .isa = Isa::kAvx512,
    .prefetch = P,
    .gemm_nt = gemm_nt<P>,
    .gemm_nt_bf16 = gemm_nt_bf16<P>,
    .gemm_nt_bf16dot = gemm_nt_bf16dot<P>,  // with_features below replaces it
    .gemm_nt_q8 = gemm_nt_q8_avx2,          // with_features below replaces it
    .q8_prepared = {q8_row_bytes_avx2, prepare_q8_avx2, gemm_q8_prepared_avx2, prepare_q8_cols_avx2,
                    kQ8PrepareColGroup},
    .bf16dot_prepared = {bf16dot_rounded_row_bytes, prepare_bf16dot_rounded, gemm_bf16dot_rounded<gemm_nt_bf16<P>>,
                         prepare_bf16dot_rounded_cols, kBf16DotRoundedColGroup},
    .bf16dot_tiles_prepared = {bf16dot_rounded_row_bytes, prepare_bf16dot_rounded,
                               gemm_tiles_via_rows<gemm_bf16dot_rounded<gemm_nt_bf16<P>>>, prepare_bf16dot_rounded_cols,
                               kBf16DotRoundedColGroup},
    .gemm_nt_p16 = gemm_nt_p16,
    .gemm_nt_bf16p16 = gemm_nt_bf16p16,
    .bf16dotp16_prepared = {bf16dot_rounded_row_bytes, prepare_bf16dot_rounded,
                            gemm_bf16dot_panels_rounded<gemm_nt_bf16p16>, prepare_bf16dot_rounded_cols,
                            kBf16DotRoundedColGroup},
    .gemm_nt_q8p16 = gemm_nt_q8p_avx2<false>,  // the VNNI table below replaces it
    .q8p16_prepared = {q8_row_bytes_avx2, prepare_q8_avx2, gemm_q8p_prepared_avx2<false>, prepare_q8_cols_avx2,
                       kQ8PrepareColGroup},
    .gemm_nt_q8cp16 = gemm_nt_q8p_avx2<true>,  // the VNNI table below replaces it
    .q8cp16_prepared = {q8_row_bytes_avx2, prepare_q8_avx2, gemm_q8p_prepared_avx2<true>, prepare_q8_cols_avx2,
                        kQ8PrepareColGroup},
    .layernorm = layernorm,
    .rmsnorm = rmsnorm,
    .gelu = gelu,
    .silu_mul = silu_mul,
    .add = add,
    .axpy = axpy,
    .argmax = argmax,
    .indices_at_least = indices_at_least,
    .exp_shifted = exp_shifted,
    .attend = attend_rows<float, P, true>,
    .attend_bf16 = attend_rows<uint16_t, P, true>,
    .attend_cached = attend_rows<float, P, false>,
    .attend_bf16_cached = attend_rows<uint16_t, P, false>,
};

// The table with the VNNI int8 GEMM (x86/avx512_vnni.cc) for CPUs that
// have avx512vnni (without it, as on Skylake-SP, int8 runs the AVX2 kernel),
// and with the bf16 dot-product GEMM (x86/avx512_bf16.cc) for CPUs that have
// avx512bf16 (without it, gemm_nt_bf16dot rounds A and widens W).
template <Prefetch P>
constexpr KernelTable with_features(bool vnni, bool bf16) {
  KernelTable t = kTable<P>;
  if (vnni) {
    t.gemm_nt_q8 = gemm_nt_q8_avx512vnni<P>;
    t.q8_prepared = {q8_row_bytes_avx512vnni, prepare_q8_avx512vnni, gemm_q8_prepared_avx512vnni<P>,
                     prepare_q8_cols_avx512vnni, kQ8PrepareColGroup};
    t.gemm_nt_q8p16 = gemm_nt_q8p_avx512vnni<false>;
    t.q8p16_prepared = {q8_row_bytes_avx512vnni, prepare_q8_avx512vnni, gemm_q8p_prepared_avx512vnni<false>,
                        prepare_q8_cols_avx512vnni, kQ8PrepareColGroup};
    t.gemm_nt_q8cp16 = gemm_nt_q8p_avx512vnni<true>;
    t.q8cp16_prepared = {q8_row_bytes_avx512vnni, prepare_q8_avx512vnni, gemm_q8p_prepared_avx512vnni<true>,
                         prepare_q8_cols_avx512vnni, kQ8PrepareColGroup};
  }
  if (bf16) {
    t.gemm_nt_bf16dot = gemm_nt_bf16dot_avx512bf16<P>;
    t.bf16dot_prepared = {bf16dot_row_bytes_avx512bf16, prepare_bf16dot_avx512bf16, gemm_bf16dot_prepared_avx512bf16<P>,
                          prepare_bf16dot_cols_avx512bf16, kBf16DotPrepareColGroup};
    t.bf16dot_tiles_prepared = {bf16dot_row_bytes_avx512bf16, prepare_bf16dot_avx512bf16,
                                gemm_tiles_via_rows<gemm_bf16dot_prepared_avx512bf16<P>>,
                                prepare_bf16dot_cols_avx512bf16, kBf16DotPrepareColGroup};
  }
  return t;
}
// kTables[prefetch][vnni][bf16].
constexpr KernelTable kTables[2][2][2] = {
    {{with_features<Prefetch::kL1>(false, false), with_features<Prefetch::kL1>(false, true)},
     {with_features<Prefetch::kL1>(true, false), with_features<Prefetch::kL1>(true, true)}},
    {{with_features<Prefetch::kL2>(false, false), with_features<Prefetch::kL2>(false, true)},
     {with_features<Prefetch::kL2>(true, false), with_features<Prefetch::kL2>(true, true)}},
};

}  // namespace

const KernelTable& avx512_table(bool vnni, bool bf16, Prefetch prefetch) {
  return kTables[prefetch == Prefetch::kL2 ? 1 : 0][vnni ? 1 : 0][bf16 ? 1 : 0];
}

}  // namespace k3::kernels
