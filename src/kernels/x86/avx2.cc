// AVX2 + FMA kernel table, 8 floats per ymm register.
//
// This file is compiled with AVX2 flags while the rest of the binary is
// baseline x86-64, so everything here has internal linkage and avoids inline
// library functions (std::min, std::exp(float), numeric_limits, ...): an
// out-of-line copy of one of those built with these flags could be picked by
// the linker for baseline code and fault on older CPUs. Loop tails use
// vmaskmov loads/stores, which never touch memory outside the mask.
#include <immintrin.h>
#include <math.h>

#include <cstdint>
#include <limits>

#include "kernels/prepared_chunks.h"
#include "kernels/tiles_via_rows.h"
#include "kernels/x86/bf16dot_round.h"
#include "kernels/x86/panel_split.h"
#include "kernels/x86/q8_drive.h"
#include "kernels/x86/row_drive.h"
#include "kernels/x86/tables.h"

namespace k3::kernels {
namespace {

constexpr int64_t kW = 8;       // floats per vector
constexpr int64_t kGemmMr = 4;  // rows of A per gemm micro-tile
constexpr int64_t kGemmNr = 3;  // rows of W per micro-tile: 4x3 acc + 3 W + 1 A = 16 ymm

// Lanes [0, n) set (all bits of each 32-bit lane), 0 <= n <= 8.
alignas(32) constexpr int32_t kMaskTable[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
inline __m256i tail_mask(int64_t n) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kMaskTable + 8 - n));
}

inline int64_t min64(int64_t a, int64_t b) {
  return a < b ? a : b;
}

// Sum of the 8 lanes in one fixed order (halving tree). gemm_nt relies on
// this being the same instruction sequence for every output element.
inline float hsum(__m256 v) {
  __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  s4 = _mm_add_ss(s4, _mm_movehdup_ps(s4));
  return _mm_cvtss_f32(s4);
}

// Largest of the 8 lanes (a halving tree, as hsum's).
inline float hmax(__m256 v) {
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
  return _mm_cvtss_f32(m4);
}

// exp(x): x = n*ln2 + r with |r| <= ln2/2 (ln2 split in two for accuracy),
// exp(r) from the Cephes degree-7 polynomial, then scaled by 2^n built in the
// exponent field. About 1-2 ulp. The clamp keeps n in [-126, 127] so 2^n is
// a normal float: exp(-87.3) ~ 1.2e-38 stands in for underflow, exp(88.3) ~
// 2.2e38 for overflow, so callers never see inf from here, nor NaN but
// for a NaN x.
inline __m256 exp_ps(__m256 x) {
  // x second: max and min return their second operand when either is NaN,
  // so NaN passes through (exp(NaN) = NaN) instead of clamping to a finite
  // value, which would let a NaN score weigh in as exp(-87.3).
  x = _mm256_min_ps(_mm256_set1_ps(88.3f), _mm256_max_ps(_mm256_set1_ps(-87.3f), x));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  const __m256 e = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(e, _mm256_castsi256_ps(bits));
}

// erf(x) as an odd/even rational function on [-4, 4] (the Eigen/XLA float
// fit). It evaluates to exactly +-1 at +-4 and erf rounds to +-1 in float
// beyond, so the clamp is exact. Max abs error 3.7e-7 (measured vs double erf).
// No exp needed, unlike the erfc-based Abramowitz-Stegun forms.
inline __m256 erf_ps(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-4.0f)), _mm256_set1_ps(4.0f));
  const __m256 x2 = _mm256_mul_ps(x, x);
  __m256 p = _mm256_set1_ps(-2.72614225801306e-10f);
  p = _mm256_fmadd_ps(p, x2, _mm256_set1_ps(2.77068142495902e-08f));
  p = _mm256_fmadd_ps(p, x2, _mm256_set1_ps(-2.10102402082508e-06f));
  p = _mm256_fmadd_ps(p, x2, _mm256_set1_ps(-5.69250639462346e-05f));
  p = _mm256_fmadd_ps(p, x2, _mm256_set1_ps(-7.34990630326855e-04f));
  p = _mm256_fmadd_ps(p, x2, _mm256_set1_ps(-2.95459980854025e-03f));
  p = _mm256_fmadd_ps(p, x2, _mm256_set1_ps(-1.60960333262415e-02f));
  __m256 q = _mm256_set1_ps(-1.45660718464996e-05f);
  q = _mm256_fmadd_ps(q, x2, _mm256_set1_ps(-2.13374055278905e-04f));
  q = _mm256_fmadd_ps(q, x2, _mm256_set1_ps(-1.68282697438203e-03f));
  q = _mm256_fmadd_ps(q, x2, _mm256_set1_ps(-7.37332916720468e-03f));
  q = _mm256_fmadd_ps(q, x2, _mm256_set1_ps(-1.42647390514189e-02f));
  return _mm256_div_ps(_mm256_mul_ps(p, x), q);
}

// ---- gemm_nt ---------------------------------------------------------------

// C[0..MR, 0..NR) = A[0..MR, :K] . W[0..NR, :K]^T, one micro-tile.
// Per element: acc = 0; acc = fma(a, w, acc) for each 8-wide block of K, the
// last block zero-filled by masked loads; C = hsum(acc). Nothing in that
// sequence depends on MR, NR or the tile's position, which is what makes
// gemm_nt independent of M and of the column split. `prefetch`, if set,
// points at the next tile's W rows (same ldw), one line per row per 16 floats.
// W rows are f32, or bf16 (uint16_t bits) widened exactly to f32 as they
// are loaded: the FMAs, and so the results' bits, are those of gemm_nt on
// the widened matrix, while memory traffic for W halves.
inline __m256 load_w(const float* p) {
  return _mm256_loadu_ps(p);
}
inline __m256 load_w_tail(__m256i mask, int64_t, const float* p) {
  return _mm256_maskload_ps(p, mask);
}
inline __m256 widen_bf16(__m128i h) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline __m256 load_w(const uint16_t* p) {
  return widen_bf16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
// AVX2 has no masked 16-bit load: the tail goes through a zeroed copy.
inline __m256 load_w_tail(__m256i, int64_t n, const uint16_t* p) {
  alignas(16) uint16_t buf[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int64_t i = 0; i < n; ++i) buf[i] = p[i];
  return widen_bf16(_mm_load_si128(reinterpret_cast<const __m128i*>(buf)));
}

template <class WT, int MR, int NR>
void gemm_tile(int64_t K, const float* A, int64_t lda, const WT* W, int64_t ldw, float* C, int64_t ldc, int64_t cs,
               const WT* prefetch) {
  __m256 acc[MR][NR];
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_setzero_ps();

  int64_t k = 0;
  for (; k + kW <= K; k += kW) {
    if (prefetch != nullptr && (k & 15) == 0) {
#pragma GCC unroll 4
      for (int j = 0; j < NR; ++j) _mm_prefetch(reinterpret_cast<const char*>(prefetch + j * ldw + k), _MM_HINT_T1);
    }
    __m256 w[NR];
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) w[j] = load_w(W + j * ldw + k);
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i) {
      const __m256 a = _mm256_loadu_ps(A + i * lda + k);
#pragma GCC unroll 4
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_fmadd_ps(a, w[j], acc[i][j]);
    }
  }
  if (k < K) {
    const __m256i mask = tail_mask(K - k);
    __m256 w[NR];
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) w[j] = load_w_tail(mask, K - k, W + j * ldw + k);
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i) {
      const __m256 a = _mm256_maskload_ps(A + i * lda + k, mask);
#pragma GCC unroll 4
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_fmadd_ps(a, w[j], acc[i][j]);
    }
  }
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) C[i * ldc + j * cs] = hsum(acc[i][j]);
}

template <class WT>
using GemmTileFn = void (*)(int64_t, const float*, int64_t, const WT*, int64_t, float*, int64_t, int64_t, const WT*);

// kGemmTiles<WT>[mr - 1][nr - 1] covers an mr x nr block (edges use the smaller ones).
template <class WT>
constexpr GemmTileFn<WT> kGemmTiles[kGemmMr][kGemmNr] = {
    {gemm_tile<WT, 1, 1>, gemm_tile<WT, 1, 2>, gemm_tile<WT, 1, 3>},
    {gemm_tile<WT, 2, 1>, gemm_tile<WT, 2, 2>, gemm_tile<WT, 2, 3>},
    {gemm_tile<WT, 3, 1>, gemm_tile<WT, 3, 2>, gemm_tile<WT, 3, 3>},
    {gemm_tile<WT, 4, 1>, gemm_tile<WT, 4, 2>, gemm_tile<WT, 4, 3>},
};

// Decode (M <= kFarMaxM) reads W rows that lie far apart: a tile's NR rows
// are n0 + i, n0 + i + q, n0 + i + 2q, ... (q = (n1 - n0) / NR), so each
// thread keeps NR independent sequential streams open instead of one: rows
// of the usual tile are adjacent, one stream to the prefetchers. Measured
// here with adjacent and far tiles built from the two commits, run in turn
// (bench_kernels --benchmark_filter='avx2/gemm_nt(_bf16|_q8)?_stream/M1_N1536'
// --benchmark_min_time=0.2, one thread, two rounds): f32 5.8/6.6 -> 9.8/10.2
// GB/s, bf16 5.4/4.8 -> 11.4/13.8, int8 4.5/4.9 -> 8.8/11.2. The grouping
// changes nothing in any element's arithmetic (the gemm_nt contract), so
// results are bit-identical.
// One-row and two-row A tiles can hold 4 streams (4 or 8 acc + 4 W + A);
// larger ones keep kGemmNr.
constexpr int64_t kFarMaxM = 8;
constexpr RowTiling kRowTiling = {
    .max_mr = kGemmMr, .adj_nr = kGemmNr, .far_max_m = kFarMaxM, .far_nr_m2 = 4, .far_nr = kGemmNr};
template <class WT>
constexpr GemmTileFn<WT> kFarTiles4[2] = {gemm_tile<WT, 1, 4>, gemm_tile<WT, 2, 4>};

// C[M, n0..n1) = A[M, K] . W[n0..n1, K]^T (row_drive.h walks the tiles).
template <class WT>
void gemm_nt_t(int64_t M, int64_t n0, int64_t n1, int64_t K, const float* A, int64_t lda, const WT* W, int64_t ldw,
               float* C, int64_t ldc) {
  drive_row_tiles(kRowTiling, M, n0, n1, K, A, lda, W, ldw, C, ldc, [](int64_t mr, int64_t nr) {
    return nr == 4 ? kFarTiles4<WT>[mr - 1] : kGemmTiles<WT>[mr - 1][nr - 1];
  });
}

void gemm_nt(int64_t M, int64_t n0, int64_t n1, int64_t K, const float* A, int64_t lda, const float* W, int64_t ldw,
             float* C, int64_t ldc) {
  gemm_nt_t(M, n0, n1, K, A, lda, W, ldw, C, ldc);
}

void gemm_nt_bf16(int64_t M, int64_t n0, int64_t n1, int64_t K, const float* A, int64_t lda, const uint16_t* W,
                  int64_t ldw, float* C, int64_t ldc) {
  gemm_nt_t(M, n0, n1, K, A, lda, W, ldw, C, ldc);
}

// bf16 dot products without vdpbf16ps (x86/bf16dot_round.h).
void gemm_nt_bf16dot(int64_t M, int64_t n0, int64_t n1, int64_t K, const float* A, int64_t lda, const uint16_t* W,
                     int64_t ldw, float* C, int64_t ldc) {
  gemm_prepared_chunks<bf16dot_rounded_row_bytes, prepare_bf16dot_rounded, gemm_bf16dot_rounded<gemm_nt_bf16>>(
      M, n0, n1, K, A, lda, W, ldw, C, ldc);
}

// ---- gemm_nt_q8 ------------------------------------------------------------

// int8 weights (util/quant.h: 16-block groups interleaved 4 bytes at a time,
// each followed by its f16 scales) against activations rounded to int8 per
// block of 32 (kernels.h has the exact semantics). A prepared activation row is its int8
// values in the weights' interleaved order, their magnitudes in the same
// order, then its K/32 scales (68 bytes per block). One ymm step of a group
// holds 4 weights of 8 blocks, a 32-bit lane per block, so per W row,
// activation row and half group (8 blocks, 8 steps):
//   acc += madd16(maddubs(|a|, sign(w, a)), 1)   (lane l: block l's dot, exact)
// then facc = fma(w_scale * a_scale, float(acc), facc) for the 8 blocks, and
// C = hsum(facc). maddubs multiplies unsigned |a| by w carrying a's sign; no
// pair sum can saturate (2 * 127 * 127 < 2^15) and a block's dot (at most
// 32 * 127^2 < 2^24) converts to f32 exactly. Nothing depends on M, the
// tile or the column split (the gemm_nt contract).

constexpr int64_t kQ8ActBytes = 68;  // per block: int8, |int8|, f32 scale

// Groups [g0, g1) of 16 blocks of one row of A (a: the row's first value)
// -> their part of the prepared form (above), which depends on their blocks
// alone. Blocks are rounded in natural order into a group buffer, then
// interleaved like the weights.
void prepare_groups_q8(const float* a, int64_t K, int64_t g0, int64_t g1, uint8_t* out) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256 inf = _mm256_set1_ps(__builtin_inff());
  const int64_t nb = K / 32;
  uint8_t* qabs = out + K;
  float* qs = reinterpret_cast<float*>(out + 2 * K);
  alignas(32) uint8_t blocks[512];
  for (int64_t g = g0; g < g1; ++g) {
    const int64_t r = min64(16, nb - g * 16);
    for (int64_t l = 0; l < r; ++l) {
      const int64_t b = g * 16 + l;
      __m256 x[4], ax[4];
      for (int s = 0; s < 4; ++s) x[s] = _mm256_loadu_ps(a + b * 32 + s * kW);
      for (int s = 0; s < 4; ++s) ax[s] = _mm256_andnot_ps(sign, x[s]);
      // NaN or inf anywhere in the block: scale NaN, q 0 (util/quant.h). The
      // unordered compare is true for NaN, >= for inf.
      const __m256 bad =
          _mm256_or_ps(_mm256_or_ps(_mm256_cmp_ps(ax[0], inf, _CMP_NLT_UQ), _mm256_cmp_ps(ax[1], inf, _CMP_NLT_UQ)),
                       _mm256_or_ps(_mm256_cmp_ps(ax[2], inf, _CMP_NLT_UQ), _mm256_cmp_ps(ax[3], inf, _CMP_NLT_UQ)));
      const float amax = hmax(_mm256_max_ps(_mm256_max_ps(ax[0], ax[1]), _mm256_max_ps(ax[2], ax[3])));
      const bool zero = amax < 0x1p-100f;  // counts as all zero (util/quant.h, quantize_a8_row)
      if (_mm256_movemask_ps(bad) != 0 || zero) [[unlikely]] {
        qs[b] = zero ? 0.0f : __builtin_nanf("");
        _mm256_store_si256(reinterpret_cast<__m256i*>(blocks + l * 32), _mm256_setzero_si256());
        continue;
      }
      qs[b] = amax / 127.0f;
      const __m256 vinv = _mm256_set1_ps(127.0f / amax);
      // cvtps rounds to nearest even (the default MXCSR mode), like nearbyint.
      __m256i q[4];
      for (int s = 0; s < 4; ++s) q[s] = _mm256_cvtps_epi32(_mm256_mul_ps(x[s], vinv));
      const __m256i q8 = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
      // The packs interleave 4-byte pieces across 128-bit lanes: restore order.
      _mm256_store_si256(reinterpret_cast<__m256i*>(blocks + l * 32),
                         _mm256_permutevar8x32_epi32(q8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    }
    q8_interleave_group(blocks, r, out + g * 512);
    for (int64_t i = 0; i < r; ++i) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(out + g * 512 + i * 32));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(qabs + g * 512 + i * 32), _mm256_abs_epi8(v));
    }
  }
}

// `lanes` (1..8) f16 block scales at p, widened to f32; lanes past them 0.
// A partial half reads its scales one by one: 16 bytes could run past the
// row's, and the matrix's, end.
inline __m256 load_scales(const uint8_t* p, int64_t lanes) {
  if (lanes == 8) return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  alignas(16) uint16_t h[8] = {};
  __builtin_memcpy(h, p, static_cast<size_t>(lanes) * 2);
  return _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(h)));
}

inline __m256i load_q(const uint8_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}
inline __m256i load_q(const uint8_t* p, __m256i mask) {
  return _mm256_maskload_epi32(reinterpret_cast<const int*>(p), mask);
}

// The 8 steps of one half group (8 blocks at a time; kFull: all 8 lanes, else
// the lanes of `mask`): w and qa point at the half's first bytes, `step`
// bytes between steps (4 * blocks in the group).
template <int MR, int NR, bool kFull>
__attribute__((always_inline)) inline void q8_half(const uint8_t* qa, int64_t qa_stride, int64_t K, const uint8_t* w,
                                                   int64_t row_bytes, int64_t step, __m256i mask,
                                                   __m256i (&acc)[MR][NR]) {
  const __m256i ones = _mm256_set1_epi16(1);
  // Unrolled by 2, not 8: fully unrolled, GCC hoisted the loads and kept the
  // products in stack slots (bench_kernels avx2/gemm_nt_q8_hot/M1_N1536_K512,
  // one thread: 26.7 GOP/s unrolled by 8, 59.2 by 1, 65.3 by 2).
#pragma GCC unroll 2
  for (int t = 0; t < 8; ++t) {
    __m256i wv[NR];
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) {
      const uint8_t* p = w + j * row_bytes + t * step;
      wv[j] = kFull ? load_q(p) : load_q(p, mask);
    }
#pragma GCC unroll 2
    for (int i = 0; i < MR; ++i) {
      const uint8_t* p = qa + i * qa_stride + t * step;
      const __m256i av = kFull ? load_q(p) : load_q(p, mask);
      const __m256i aa = kFull ? load_q(p + K) : load_q(p + K, mask);
#pragma GCC unroll 4
      for (int j = 0; j < NR; ++j)
        acc[i][j] =
            _mm256_add_epi32(acc[i][j], _mm256_madd_epi16(_mm256_maddubs_epi16(aa, _mm256_sign_epi8(wv[j], av)), ones));
    }
  }
}

// MR prepared A rows (qa_stride bytes apart) against NR W rows (NR memory
// streams): MR x NR int and float accumulators + NR W + 2 A + the ones = 13
// ymm at 2 x 2, 15 at 1 x 4.
template <int MR, int NR>
void q8_tile(int64_t K, const uint8_t* qa, int64_t qa_stride, const uint8_t* W, int64_t row_bytes, float* C,
             int64_t ldc, int64_t cs, const uint8_t* prefetch) {
  const int64_t nb = K / 32;
  __m256 facc[MR][NR];
#pragma GCC unroll 2
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) facc[i][j] = _mm256_setzero_ps();
  for (int64_t g = 0; g * 16 < nb; ++g) {
    const int64_t r = min64(16, nb - g * 16), step = 4 * r;
    const int64_t wg = q8_group_values(g), ws = q8_group_scales(g, r);  // in a W row
    if (prefetch != nullptr) {                                          // the next rows' group with its scales
#pragma GCC unroll 4
      for (int j = 0; j < NR; ++j) {
        const char* p = reinterpret_cast<const char*>(prefetch + j * row_bytes + wg);
        for (int64_t o = 0; o < ws + 2 * r - wg; o += 64) _mm_prefetch(p + o, _MM_HINT_T1);
      }
    }
    for (int64_t h = 0; h * 8 < r; ++h) {
      const int64_t lanes = min64(8, r - h * 8), off = g * 512 + h * 32, woff = wg + h * 32;
      __m256i acc[MR][NR];
#pragma GCC unroll 2
      for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
        for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_setzero_si256();
      const __m256i mask = tail_mask(lanes);
      if (lanes == 8)
        q8_half<MR, NR, true>(qa + off, qa_stride, K, W + woff, row_bytes, step, mask, acc);
      else
        q8_half<MR, NR, false>(qa + off, qa_stride, K, W + woff, row_bytes, step, mask, acc);
      const int64_t b0 = g * 16 + h * 8;  // first block of this half
#pragma GCC unroll 4
      for (int j = 0; j < NR; ++j) {
        const __m256 sw = load_scales(W + j * row_bytes + ws + h * 16, lanes);
#pragma GCC unroll 2
        for (int i = 0; i < MR; ++i) {
          const __m256 sa = _mm256_maskload_ps(reinterpret_cast<const float*>(qa + i * qa_stride + 2 * K) + b0, mask);
          facc[i][j] = _mm256_fmadd_ps(_mm256_mul_ps(sw, sa), _mm256_cvtepi32_ps(acc[i][j]), facc[i][j]);
        }
      }
    }
  }
#pragma GCC unroll 2
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) C[i * ldc + j * cs] = hsum(facc[i][j]);
}

constexpr int kQ8Mr = 2;
constexpr int kQ8Nr = 2;
constexpr int kQ8GemvNr = 4;  // W rows per one-row tile: its memory streams

constexpr Q8TileFn kQ8Tiles[kQ8Mr][kQ8GemvNr] = {
    {q8_tile<1, 1>, q8_tile<1, 2>, q8_tile<1, 3>, q8_tile<1, 4>},
    {q8_tile<2, 1>, q8_tile<2, 2>, nullptr, nullptr},
};

}  // namespace

// This table's PreparedGemm (kernels.h): the rows prepared above, the
// driver (x86/q8_drive.h) with this table's tiles: one-row calls run
// 1 x kQ8GemvNr tiles, larger ones kQ8Mr x kQ8Nr. Also the AVX-512 table's
// int8 GEMM on CPUs without VNNI.
int64_t q8_row_bytes_avx2(int64_t K) {
  return K / 32 * kQ8ActBytes;
}
void prepare_q8_avx2(int64_t M, int64_t K, const float* A, int64_t lda, uint8_t* P) {
  prepare_q8_cols(M, K, 0, K, A, lda, P, kQ8ActBytes, prepare_groups_q8);
}
void prepare_q8_cols_avx2(int64_t M, int64_t K, int64_t k0, int64_t k1, const float* A, int64_t lda, uint8_t* P) {
  prepare_q8_cols(M, K, k0, k1, A, lda, P, kQ8ActBytes, prepare_groups_q8);
}
void gemm_q8_prepared_avx2(int64_t M, int64_t n0, int64_t n1, int64_t K, const uint8_t* P, const void* W,
                           int64_t /*ldw: implied*/, float* C, int64_t ldc) {
  // Spread prefill prefetch (q8_drive.h): on the Zen 4 host, one thread,
  // avx2/gemm_nt_q8_stream/M32 (3 rounds in turn) ran N1536 K512 at 86-92
  // GOP/s instead of 81-84, and N512 K1536 at 101-103 against 101-105.
  // Far tiles (decode) prefetch nothing: on the Zen 3 host, one thread,
  // avx2/gemm_nt_q8_stream/M1 (3 rounds in turn) streamed N1536 K512 at
  // 16.9-18.5 GB/s with the next row of each stream prefetched and 18.9-21.3
  // without, N512 K1536 at 14.2-17.5 and 20.5-21.6 (bf16 rows: 19.7-21.6);
  // at M2 N512 K1536, 49-52 GOP/s and 65-67. The hardware prefetchers follow
  // the 4 streams, which read front to back.
  constexpr Q8Tiling kTiling = {kQ8Mr, kFarMaxM, kQ8GemvNr, kQ8Nr, kQ8GemvNr, kQ8Nr, kQ8ActBytes, 0, true};
  gemm_q8_drive(kTiling, M, n0, n1, K, P, static_cast<const uint8_t*>(W), C, ldc,
                [](int64_t mr, int64_t nr) { return kQ8Tiles[mr - 1][nr - 1]; });
}
void gemm_nt_q8_avx2(int64_t M, int64_t n0, int64_t n1, int64_t K, const float* A, int64_t lda, const uint8_t* W,
                     float* C, int64_t ldc) {
  gemm_prepared_chunks<q8_row_bytes_avx2, prepare_q8_avx2, gemm_q8_prepared_avx2>(M, n0, n1, K, A, lda, W, 0, C, ldc);
}

namespace {

// ---- gemm_nt over panels ---------------------------------------------------

// W in the panel layout (util/panel.h; not included: see the top of the
// file): panel p = rows 16p..16p+15 of W stored k-major, so one k step of a
// panel is 16 contiguous weights, two ymm. The tiles broadcast A[i, k] and
// FMA it into 2 accumulators per panel: each output is one FMA chain over k
// from k = 0, whatever the tile, M or column range (the kernels.h contract),
// with no horizontal sums and 12 FMAs per 2 weight loads and 6 broadcasts in
// the 6-row tile. bench/layout_study measures it against the 4x3 dot tile.
// Decode tiles prefetch each of their streams this far ahead (about what the
// row kernel's next-row prefetch reaches for bf16 rows of 512). 1, 2 and 4
// KiB measured the same within noise.
constexpr int64_t kPanelPrefetchBytes = 1024;

inline void load_panel_row(const float* p, __m256& w0, __m256& w1) {
  w0 = _mm256_loadu_ps(p);
  w1 = _mm256_loadu_ps(p + 8);
}
// bf16 panels store columns 4-7 and 8-11 swapped, so interleaving zeros below
// each 16-bit value inside the 128-bit halves yields columns 0-7 and 8-15 as
// exact f32, one instruction per 8 weights.
inline void load_panel_row(const uint16_t* p, __m256& w0, __m256& w1) {
  const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  const __m256i z = _mm256_setzero_si256();
  w0 = _mm256_castsi256_ps(_mm256_unpacklo_epi16(z, x));
  w1 = _mm256_castsi256_ps(_mm256_unpackhi_epi16(z, x));
}

// C[0..MR, 16 * NP columns) = A[0..MR, :K] . (NP panels)^T. Panel j starts
// at W + j * ps and its 16 outputs at C + j * pcs. If `prefetch`, each
// panel's stream is prefetched into L2 kPanelPrefetchBytes ahead (past the
// panel's end that is the next panel in memory; prefetches never fault).
// Registers: 2 * MR * NP accumulators, 2 * NP weights and a broadcast: (6,1)
// 15, (4,1) 11, (1,4) 17, which the compiler meets by loading each weight
// just before its one use.
template <class WT, int MR, int NP>
void panel_tile(int64_t K, const float* A, int64_t lda, const WT* W, int64_t ps, float* C, int64_t ldc, int64_t pcs,
                bool prefetch, PanelSpread spread) {
  SpreadState spread_state(spread);
  __m256 acc[MR][2 * NP];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < 2 * NP; ++j) acc[i][j] = _mm256_setzero_ps();
  constexpr int64_t kRowsPerLine = 64 / (kPanel * static_cast<int64_t>(sizeof(WT)));
  constexpr int64_t kAhead = kPanelPrefetchBytes / (kPanel * static_cast<int64_t>(sizeof(WT)));
  for (int64_t k = 0; k < K; ++k) {
    if (prefetch && k % kRowsPerLine == 0) {
#pragma GCC unroll 8
      for (int j = 0; j < NP; ++j)
        _mm_prefetch(reinterpret_cast<const char*>(W + j * ps + (k + kAhead) * kPanel), _MM_HINT_T1);
    }
    if (spread.lines > 0) panel_spread_step(spread, spread_state, K);
    __m256 w[2 * NP];
#pragma GCC unroll 8
    for (int j = 0; j < NP; ++j) load_panel_row(W + j * ps + k * kPanel, w[2 * j], w[2 * j + 1]);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m256 a = _mm256_broadcast_ss(A + i * lda + k);
#pragma GCC unroll 8
      for (int j = 0; j < 2 * NP; ++j) acc[i][j] = _mm256_fmadd_ps(a, w[j], acc[i][j]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < NP; ++j) {
      _mm256_storeu_ps(C + i * ldc + j * pcs, acc[i][2 * j]);
      _mm256_storeu_ps(C + i * ldc + j * pcs + 8, acc[i][2 * j + 1]);
    }
}

template <class WT>
using PanelTileFn = void (*)(int64_t, const float*, int64_t, const WT*, int64_t, float*, int64_t, int64_t, bool,
                             PanelSpread);
constexpr int64_t kPanelMr = 6;     // rows per tile for M > 8 (12 accumulators)
constexpr int64_t kPanelMrDec = 4;  // rows per tile for M <= 8 (the tile that then keeps pace with memory)
template <class WT>
constexpr PanelTileFn<WT> kPanelTiles[kPanelMr] = {panel_tile<WT, 1, 1>, panel_tile<WT, 2, 1>, panel_tile<WT, 3, 1>,
                                                   panel_tile<WT, 4, 1>, panel_tile<WT, 5, 1>, panel_tile<WT, 6, 1>};

// C[M, 16 * p0 .. 16 * p1) over whole panels p0 <= p < p1.
//   M == 1: four panels a quarter of the range apart per tile, four memory
//           streams (as the row kernel's far tiles), then the remainder.
//   M > 1:  4-row (M <= 8) or 6-row tiles panel by panel; the first row
//           tile of a panel prefetches ahead, the later ones find the panel
//           in cache. (Prefetching at M > 8 too: one thread's streamed M 32
//           rose 5-10%, bench_kernels avx2/gemm_nt_(bf16p16|p16)_stream/M32,
//           run on the AVX-512 Intel host.) Above 8 rows, as in the AVX-512
//           table, row tiles of near-equal height spread the prefetch of
//           the next panel (or of read_next after the last) over their k
//           steps, and only a thread's first panel waits on memory.
template <class WT>
void gemm_panels_whole(int64_t M, int64_t p0, int64_t p1, int64_t K, const float* A, int64_t lda, const WT* W, float* C,
                       int64_t ldc, ReadNext read_next) {
  const int64_t ps = K * kPanel;
  if (M == 1) {
    const int64_t q = (p1 - p0) / 4;
    for (int64_t i = 0; i < q; ++i) {
      const int64_t p = p0 + i;
      panel_tile<WT, 1, 4>(K, A, lda, W + p * ps, q * ps, C + p * kPanel, ldc, q * kPanel, true, {});
    }
    for (int64_t p = p0 + 4 * q; p < p1; ++p)
      panel_tile<WT, 1, 1>(K, A, lda, W + p * ps, ps, C + p * kPanel, ldc, kPanel, true, {});
    return;
  }
  if (M <= kFarMaxM) {
    for (int64_t p = p0; p < p1; ++p) {
      for (int64_t m = 0; m < M; m += kPanelMrDec) {
        const int64_t mr = min64(kPanelMrDec, M - m);
        kPanelTiles<WT>[mr - 1](K, A + m * lda, lda, W + p * ps, ps, C + m * ldc + p * kPanel, ldc, kPanel, m == 0, {});
      }
    }
    return;
  }
  const int64_t tiles = (M + kPanelMr - 1) / kPanelMr;
  const int64_t panel_bytes = ps * static_cast<int64_t>(sizeof(WT));
  for (int64_t p = p0; p < p1; ++p) {
    const PanelSpread after =
        panel_spread_after(W + (p + 1) * ps, p + 1 < p1 ? panel_bytes : 0, read_next, panel_bytes);
    for (int64_t r = 0; r < tiles; ++r) {
      const RowTile t = row_tile(M, r, tiles, after);
      kPanelTiles<WT>[t.mr - 1](K, A + t.m * lda, lda, W + p * ps, ps, C + t.m * ldc + p * kPanel, ldc, kPanel,
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
        kPanelTiles<WT>[mr - 1](K, A + m * lda, lda, W + p * ps, ps, out, kPanel, kPanel, false, {});
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

// ---- int8 panels (gemm_nt_q8p16) ------------------------------------------
//
// W in the int8 panel layout (util/q8_panel.h): block b, step t of a panel
// is 64 bytes, weights 32b + 4t .. +3 of its 16 rows stored as q + 128: two
// ymm, rows 0-7 and rows 8-15, a 32-bit lane a row. AVX2 has no vpdpbusd,
// and vpmaddubsw of the stored bytes against signed activations could
// saturate (2 x 255 x 127 > 2^15), so the tile takes the row kernel's
// product on q = w ^ 0x80, the activation row's 4 bytes broadcast with
// their magnitudes beside them:
//   acc += madd16(maddubs(|a|, sign(q, a)), 1)        (lane c: row c's 4 products, exact)
// 8 steps a block (no pair sum can saturate: 2 x 127 x 127 < 2^15), then
//   facc = fma(w_scale * a_scale, float(acc), facc)    (8 outputs at once)
// so each lane is one output and nothing is summed across lanes: the
// chain kernels.h prescribes, bit for bit the scalar and VNNI tables'.
// Per block and row of A: 16 vpmaddubsw + 16 vpmaddwd on the multiply
// pipes for 512 products, against 64 f32 FMAs for 512 in the f32 panels.
// The prepared rows are the row kernel's (prepare_groups_q8): block b,
// step t of a row at group b / 16, offset t * 4r + 4 (b % 16) (r the
// group's blocks), its magnitudes K bytes on, its f32 scales at 2 K.
// Rows of A per tile: 8 int accumulators, 2 W, |a|, a, the ones and the
// xor in the 16 ymm, the 8 f32 sums on the stack (touched once a block).
// One thread, bench_kernels avx2/gemm_nt_q8(c)?p16_(hot|stream)/M(16|32|128)_N1536_K512
// on the Zen 3 host, 2 rounds, GOP/s: 2 rows 100-112, 3 rows 102-114, 4 rows
// 107-119 (the rows kernel: 70-77).
constexpr int kQ8PMr = 4;
constexpr int64_t kQ8PRowChunk = 16;  // rows of A over which a panel is reused from L1 (as the VNNI table)

// One block of 32 k: a[i] is row i's first word of the block, w the
// panel's first byte of it, step the bytes between a row's words t and
// t + 1 (64 in a full group, known at compile time there).
template <int MR, int kStep>
__attribute__((always_inline)) inline void q8p_block(const uint8_t* const (&a)[MR], int64_t K, const uint8_t* w,
                                                     int64_t step, __m256i (&acc)[MR][2]) {
  const int64_t st = kStep != 0 ? kStep : step;
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_si256();
#pragma GCC unroll 2
  for (int t = 0; t < 8; ++t) {
    const __m256i w0 = _mm256_xor_si256(load_q(w + t * 64), flip);
    const __m256i w1 = _mm256_xor_si256(load_q(w + t * 64 + 32), flip);
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i) {
      const __m256i av = _mm256_set1_epi32(load_i32(a[i] + t * st));
      const __m256i aa = _mm256_set1_epi32(load_i32(a[i] + K + t * st));
      acc[i][0] =
          _mm256_add_epi32(acc[i][0], _mm256_madd_epi16(_mm256_maddubs_epi16(aa, _mm256_sign_epi8(w0, av)), ones));
      acc[i][1] =
          _mm256_add_epi32(acc[i][1], _mm256_madd_epi16(_mm256_maddubs_epi16(aa, _mm256_sign_epi8(w1, av)), ones));
    }
  }
}

// C[0..MR, 16) = prepared rows qa[0..MR) (qa_stride bytes apart) . (the
// panel at W)^T. Spreads `spread`'s prefetches over its blocks. kChannel:
// the channel-scale panels (kQ8CP16), whose blocks take the activation
// scale only and whose 16 f32 weight scales multiply the sums at the end.
template <int MR, bool kChannel>
void q8p_tile(int64_t K, const uint8_t* qa, int64_t qa_stride, const uint8_t* W, int64_t /*ps: one panel*/, float* C,
              int64_t ldc, int64_t /*pcs: one panel*/, PanelSpread spread) {
  const int64_t nb = K / 32;
  const uint8_t* w_scales = W + 16 * K;
  __m256 facc[MR][2];
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i) facc[i][0] = facc[i][1] = _mm256_setzero_ps();
  SpreadState st(spread);
  for (int64_t g = 0; g * 16 < nb; ++g) {
    const int64_t r = min64(16, nb - g * 16);
    for (int64_t l = 0; l < r; ++l) {
      const int64_t b = g * 16 + l;
      const uint8_t* a[MR];
#pragma GCC unroll 4
      for (int i = 0; i < MR; ++i) a[i] = qa + i * qa_stride + g * 512 + 4 * l;
      __m256i acc[MR][2];
      if (r == 16)
        q8p_block<MR, 64>(a, K, W + b * 512, 64, acc);
      else
        q8p_block<MR, 0>(a, K, W + b * 512, 4 * r, acc);
      __m256 sw0 = _mm256_setzero_ps(), sw1 = _mm256_setzero_ps();
      if constexpr (!kChannel) {
        sw0 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w_scales + b * 32)));
        sw1 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w_scales + b * 32 + 16)));
      }
#pragma GCC unroll 4
      for (int i = 0; i < MR; ++i) {
        const __m256 sa = _mm256_broadcast_ss(reinterpret_cast<const float*>(qa + i * qa_stride + 2 * K) + b);
        if constexpr (kChannel) {
          facc[i][0] = _mm256_fmadd_ps(sa, _mm256_cvtepi32_ps(acc[i][0]), facc[i][0]);
          facc[i][1] = _mm256_fmadd_ps(sa, _mm256_cvtepi32_ps(acc[i][1]), facc[i][1]);
        } else {
          facc[i][0] = _mm256_fmadd_ps(_mm256_mul_ps(sw0, sa), _mm256_cvtepi32_ps(acc[i][0]), facc[i][0]);
          facc[i][1] = _mm256_fmadd_ps(_mm256_mul_ps(sw1, sa), _mm256_cvtepi32_ps(acc[i][1]), facc[i][1]);
        }
      }
      if (spread.lines > 0) panel_spread_step(spread, st, nb);
    }
  }
  if constexpr (kChannel) {
    const __m256 sc0 = _mm256_loadu_ps(reinterpret_cast<const float*>(w_scales));
    const __m256 sc1 = _mm256_loadu_ps(reinterpret_cast<const float*>(w_scales) + 8);
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i) {
      facc[i][0] = _mm256_mul_ps(sc0, facc[i][0]);
      facc[i][1] = _mm256_mul_ps(sc1, facc[i][1]);
    }
  }
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i) {
    _mm256_storeu_ps(C + i * ldc, facc[i][0]);
    _mm256_storeu_ps(C + i * ldc + 8, facc[i][1]);
  }
}

template <bool kChannel>
constexpr Q8PTileFn kQ8PTiles[kQ8PMr] = {q8p_tile<1, kChannel>, q8p_tile<2, kChannel>, q8p_tile<3, kChannel>,
                                         q8p_tile<4, kChannel>};

}  // namespace

// The int8 panel GEMMs (kernels.h, gemm_nt_q8p16; kChannel: gemm_nt_q8cp16)
// on this table's prepared int8 rows; a thread's share that cuts a panel
// computes it whole on the stack (panel_split.h). Also the AVX-512 table's
// on CPUs without VNNI.
template <bool kChannel>
void gemm_q8p_prepared_avx2(int64_t M, int64_t n0, int64_t n1, int64_t K, const uint8_t* P, const void* W,
                            int64_t /*ldw: implied*/, float* C, int64_t ldc) {
  // One panel a group (panel_split.h, drive_q8_panels), reused from L1 by
  // the chunk's row tiles, which prefetch the next panel into L2.
  gemm_q8_panels_prepared<kQ8PRowChunk, kQ8PMr, 1, kChannel>(
      M, n0, n1, K, P, K / 32 * kQ8ActBytes, static_cast<const uint8_t*>(W), C, ldc,
      [](int64_t mr, int64_t) { return kQ8PTiles<kChannel>[mr - 1]; });
}
// The whole GEMM on rows of A, rounded a chunk at a time (prepared_chunks.h).
template <bool kChannel>
void gemm_nt_q8p_avx2(int64_t M, int64_t n0, int64_t n1, int64_t K, const float* A, int64_t lda, const uint8_t* W,
                      float* C, int64_t ldc) {
  gemm_prepared_chunks<q8_row_bytes_avx2, prepare_q8_avx2, gemm_q8p_prepared_avx2<kChannel>>(M, n0, n1, K, A, lda, W, 0,
                                                                                             C, ldc);
}
template void gemm_q8p_prepared_avx2<false>(int64_t, int64_t, int64_t, int64_t, const uint8_t*, const void*, int64_t,
                                            float*, int64_t);
template void gemm_q8p_prepared_avx2<true>(int64_t, int64_t, int64_t, int64_t, const uint8_t*, const void*, int64_t,
                                           float*, int64_t);
template void gemm_nt_q8p_avx2<false>(int64_t, int64_t, int64_t, int64_t, const float*, int64_t, const uint8_t*, float*,
                                      int64_t);
template void gemm_nt_q8p_avx2<true>(int64_t, int64_t, int64_t, int64_t, const float*, int64_t, const uint8_t*, float*,
                                     int64_t);

namespace {

// ---- element-wise ----------------------------------------------------------

// y[i] = f(x[i]) for i < n, 8 lanes at a time, masked tail. y may alias x.
template <class F>
inline void map1(const float* x, int64_t n, float* y, F f) {
  int64_t i = 0;
  for (; i + kW <= n; i += kW) _mm256_storeu_ps(y + i, f(_mm256_loadu_ps(x + i)));
  if (i < n) {
    const __m256i mask = tail_mask(n - i);
    _mm256_maskstore_ps(y + i, mask, f(_mm256_maskload_ps(x + i, mask)));
  }
}

// y[i] = f(a[i], b[i]) for i < n. y may alias a or b.
template <class F>
inline void map2(const float* a, const float* b, int64_t n, float* y, F f) {
  int64_t i = 0;
  for (; i + kW <= n; i += kW) _mm256_storeu_ps(y + i, f(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));
  if (i < n) {
    const __m256i mask = tail_mask(n - i);
    _mm256_maskstore_ps(y + i, mask, f(_mm256_maskload_ps(a + i, mask), _mm256_maskload_ps(b + i, mask)));
  }
}

// y[i] = 0 for i < n.
inline void zero(float* y, int64_t n) {
  int64_t i = 0;
  for (; i + kW <= n; i += kW) _mm256_storeu_ps(y + i, _mm256_setzero_ps());
  if (i < n) _mm256_maskstore_ps(y + i, tail_mask(n - i), _mm256_setzero_ps());
}

// x, y: [n]. 0.5 * x * (1 + erf(x / sqrt(2))).
void gelu(const float* x, int64_t n, float* y) {
  map1(x, n, y, [](__m256 v) {
    const __m256 e = erf_ps(_mm256_mul_ps(v, _mm256_set1_ps(0.70710678118654752f)));
    return _mm256_mul_ps(_mm256_mul_ps(v, _mm256_set1_ps(0.5f)), _mm256_add_ps(e, _mm256_set1_ps(1.0f)));
  });
}

// g, u, y: [n]. g / (1 + exp(-g)) * u; exp_ps's clamp keeps g = -100 at a
// tiny negative value and g = +100 at exactly 100.
void silu_mul(const float* g, const float* u, int64_t n, float* y) {
  map2(g, u, n, y, [](__m256 gv, __m256 uv) {
    const __m256 den = _mm256_add_ps(_mm256_set1_ps(1.0f), exp_ps(_mm256_sub_ps(_mm256_setzero_ps(), gv)));
    return _mm256_mul_ps(_mm256_div_ps(gv, den), uv);
  });
}

// a, b, y: [n].
void add(const float* a, const float* b, int64_t n, float* y) {
  map2(a, b, n, y, [](__m256 av, __m256 bv) { return _mm256_add_ps(av, bv); });
}

// x, y: [n]; y += alpha * x.
void axpy(float alpha, const float* x, int64_t n, float* y) {
  const __m256 va = _mm256_set1_ps(alpha);
  map2(x, y, n, y, [va](__m256 xv, __m256 yv) { return _mm256_fmadd_ps(va, xv, yv); });
}

// x: [n]. Two passes, as the AVX-512 table's: the largest value (vmaxps
// keeps its second operand, the running maximum, when x is NaN; the tail
// goes one value at a time), then its first index.
int64_t argmax(const float* x, int64_t n) {
  if (n <= 0) return 0;
  constexpr float kNinf = -std::numeric_limits<float>::infinity();
  __m256 m[4] = {_mm256_set1_ps(kNinf), _mm256_set1_ps(kNinf), _mm256_set1_ps(kNinf), _mm256_set1_ps(kNinf)};
  int64_t i = 0;
  for (; i + 4 * kW <= n; i += 4 * kW)
    for (int j = 0; j < 4; ++j) m[j] = _mm256_max_ps(_mm256_loadu_ps(x + i + j * kW), m[j]);
  for (; i + kW <= n; i += kW) m[0] = _mm256_max_ps(_mm256_loadu_ps(x + i), m[0]);
  const __m256 v = _mm256_max_ps(_mm256_max_ps(m[0], m[1]), _mm256_max_ps(m[2], m[3]));
  alignas(32) float lanes[kW];
  _mm256_store_ps(lanes, v);
  float top = kNinf;
  for (float l : lanes) top = l > top ? l : top;
  for (; i < n; ++i) top = x[i] > top ? x[i] : top;
  const __m256 best = _mm256_set1_ps(top);
  for (i = 0; i + kW <= n; i += kW) {
    const int eq = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), best, _CMP_EQ_OQ));
    if (eq != 0) return i + __builtin_ctz(static_cast<unsigned>(eq));
  }
  for (; i < n; ++i)
    if (x[i] == top) return i;
  return 0;  // every value NaN
}

// x: [n] -> out: [count]. A compare mask per 8 values; its set bits
// appended one at a time (few once the sampler's threshold has risen).
int64_t indices_at_least(const float* x, int64_t n, float t, int32_t base, int32_t* out) {
  const __m256 vt = _mm256_set1_ps(t);
  int64_t c = 0, i = 0;
  for (; i + kW <= n; i += kW) {
    unsigned m = static_cast<unsigned>(_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), vt, _CMP_GE_OQ)));
    for (; m != 0; m &= m - 1) out[c++] = base + static_cast<int32_t>(i + __builtin_ctz(m));
  }
  for (; i < n; ++i)
    if (x[i] >= t) out[c++] = base + static_cast<int32_t>(i);
  return c;
}

// x, p: [n]. exp_ps per 8 values, 0 where d is below the floor (or NaN).
float exp_shifted(const float* x, int64_t n, float mx, float inv_t, float* p) {
  const __m256 vmx = _mm256_set1_ps(mx), vt = _mm256_set1_ps(inv_t), floor = _mm256_set1_ps(kExpShiftedMin);
  auto numerators = [&](__m256 xv) {
    const __m256 d = _mm256_mul_ps(_mm256_sub_ps(xv, vmx), vt);
    return _mm256_and_ps(_mm256_cmp_ps(d, floor, _CMP_GE_OQ), exp_ps(d));
  };
  __m256 sum = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + kW <= n; i += kW) {  // vmaskmovps stores are slow on AMD: full vectors unmasked
    const __m256 e = numerators(_mm256_loadu_ps(x + i));
    _mm256_storeu_ps(p + i, e);
    sum = _mm256_add_ps(sum, e);
  }
  if (i < n) {
    const __m256i in = tail_mask(n - i);
    const __m256 e = _mm256_and_ps(_mm256_castsi256_ps(in), numerators(_mm256_maskload_ps(x + i, in)));
    _mm256_maskstore_ps(p + i, in, e);
    sum = _mm256_add_ps(sum, e);
  }
  return hsum(sum);
}

// ---- normalisation ---------------------------------------------------------

// sum_i x[i] over [n].
inline float sum(const float* x, int64_t n) {
  __m256 s = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + kW <= n; i += kW) s = _mm256_add_ps(s, _mm256_loadu_ps(x + i));
  if (i < n) s = _mm256_add_ps(s, _mm256_maskload_ps(x + i, tail_mask(n - i)));
  return hsum(s);
}

// sum_i (x[i] - c)^2 over [n]; masked-off tail lanes must add 0, not c^2.
inline float sum_sq_dev(const float* x, int64_t n, float c) {
  const __m256 vc = _mm256_set1_ps(c);
  __m256 s = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + kW <= n; i += kW) {
    const __m256 d = _mm256_sub_ps(_mm256_loadu_ps(x + i), vc);
    s = _mm256_fmadd_ps(d, d, s);
  }
  if (i < n) {
    const __m256i mask = tail_mask(n - i);
    const __m256 d = _mm256_and_ps(_mm256_sub_ps(_mm256_maskload_ps(x + i, mask), vc), _mm256_castsi256_ps(mask));
    s = _mm256_fmadd_ps(d, d, s);
  }
  return hsum(s);
}

// x, w, b, y: [n]. Two passes: mean, then variance of the centred values.
void layernorm(const float* x, const float* w, const float* b, float eps, int64_t n, float* y) {
  if (n == 0) return;
  const float mean = sum(x, n) / static_cast<float>(n);
  const float rstd = 1.0f / sqrtf(sum_sq_dev(x, n, mean) / static_cast<float>(n) + eps);
  const __m256 vm = _mm256_set1_ps(mean);
  const __m256 vr = _mm256_set1_ps(rstd);
  int64_t i = 0;
  for (; i + kW <= n; i += kW) {
    const __m256 xn = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm), vr);
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(xn, _mm256_loadu_ps(w + i), _mm256_loadu_ps(b + i)));
  }
  if (i < n) {
    const __m256i mask = tail_mask(n - i);
    const __m256 xn = _mm256_mul_ps(_mm256_sub_ps(_mm256_maskload_ps(x + i, mask), vm), vr);
    _mm256_maskstore_ps(y + i, mask,
                        _mm256_fmadd_ps(xn, _mm256_maskload_ps(w + i, mask), _mm256_maskload_ps(b + i, mask)));
  }
}

// x, w, y: [n].
void rmsnorm(const float* x, const float* w, float eps, int64_t n, float* y) {
  if (n == 0) return;
  const float rstd = 1.0f / sqrtf(sum_sq_dev(x, n, 0.0f) / static_cast<float>(n) + eps);
  const __m256 vr = _mm256_set1_ps(rstd);
  map2(x, w, n, y, [vr](__m256 xv, __m256 wv) { return _mm256_mul_ps(_mm256_mul_ps(xv, vr), wv); });
}

// ---- attention -------------------------------------------------------------

// Online softmax for hd <= NV * 8: the running output (unnormalised) lives in
// NV vectors (registers as far as the 16 ymm allow, the rest on the stack),
// with the running max `mx` and running sum `l`. Positions are taken in
// blocks of up to 4 so their dot products overlap; the accumulator is
// rescaled only when a block raises the max (exp(mx - new) <= 1, never
// overflows), so large scores are as safe as in the two-pass form.
// Lanes [0, n) of a K or V cache row as f32 (n <= 8; the rest 0): f32 rows
// as stored, bf16 rows widened (exact: a bf16 value is the top half of its
// f32). AVX2 has no 16-bit masked load: a partial bf16 vector goes through
// a zeroed stack copy.
inline __m256 load_cache(const float* p, int64_t n) {
  return n >= kW ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, tail_mask(n));
}
inline __m256 load_cache(const uint16_t* p, int64_t n) {
  __m128i h;
  if (n >= kW) {
    h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  } else {
    alignas(16) uint16_t tmp[8] = {};
    __builtin_memcpy(tmp, p, static_cast<size_t>(n) * 2);
    h = _mm_load_si128(reinterpret_cast<const __m128i*>(tmp));
  }
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

template <int NV, class T>
struct OnlineSoftmax {
  __m256 acc[NV];
  float mx;  // running max score (-inf before the first position)
  float l;   // running sum of exp(s - mx)

  // Vector `vi` of a row of hd values; only the last one can be partial.
  template <class E>
  static __m256 load(const E* row, int vi, int64_t hd) {
    return load_cache(row + vi * kW, vi < NV - 1 ? kW : hd - (NV - 1) * kW);
  }

  template <int B>
  void block(const float* q, const T* k, const T* v, int64_t hd, int64_t stride, float scale) {
    float s[B];
    __m256 d[B];
#pragma GCC unroll 4
    for (int b = 0; b < B; ++b) d[b] = _mm256_setzero_ps();
#pragma GCC unroll 16
    for (int vi = 0; vi < NV; ++vi) {
      const __m256 qv = load(q, vi, hd);
#pragma GCC unroll 4
      for (int b = 0; b < B; ++b) d[b] = _mm256_fmadd_ps(qv, load(k + b * stride, vi, hd), d[b]);
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
      const __m256 va = exp_ps(_mm256_set1_ps(mx - bmax));
#pragma GCC unroll 16
      for (int vi = 0; vi < NV; ++vi) acc[vi] = _mm256_mul_ps(acc[vi], va);
      l *= _mm256_cvtss_f32(va);
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
    const __m256 pv = exp_ps(_mm256_sub_ps(_mm256_set_m128(sv, sv), _mm256_set1_ps(mx)));
    __m128 p4 = _mm256_castps256_ps128(pv);
    if constexpr (B == 4) {
      p4 = _mm_add_ps(p4, _mm_movehl_ps(p4, p4));
      p4 = _mm_add_ss(p4, _mm_movehdup_ps(p4));
    }
    l += _mm_cvtss_f32(p4);
#pragma GCC unroll 4
    for (int b = 0; b < B; ++b) {
      const __m256 vp = _mm256_permutevar8x32_ps(pv, _mm256_set1_epi32(b));
#pragma GCC unroll 16
      for (int vi = 0; vi < NV; ++vi) acc[vi] = _mm256_fmadd_ps(vp, load(v + b * stride, vi, hd), acc[vi]);
    }
  }
};

// q: [hd]; k, v: [len, hd] with row stride `stride`; out: [hd]; hd <= NV * 8.
// Prefetch distance of attend, in positions (avx512.cc, kAttendAhead, has
// the measurements).
constexpr int64_t kAttendAhead = 8;

template <int NV, class T>
AttendStats attend_regs(const float* q, const T* k, const T* v, int64_t len, int64_t hd, int64_t stride, float scale,
                        float* out) {
  // One prefetch per 64-byte line: 16 f32 (two vectors) or 32 bf16 (four).
  constexpr int kLineVectors = sizeof(T) == 2 ? 4 : 2;
  OnlineSoftmax<NV, T> st;
#pragma GCC unroll 16
  for (int vi = 0; vi < NV; ++vi) st.acc[vi] = _mm256_setzero_ps();
  st.mx = -__builtin_inff();
  st.l = 0.0f;
  int64_t j = 0;
  for (; j + 4 <= len; j += 4) {
    // K and V rows kAttendAhead positions on, into L1, one line (two
    // vectors) at a time: a decode step reads the cache from memory.
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
  const __m256 vl = _mm256_set1_ps(st.l);
#pragma GCC unroll 16
  for (int vi = 0; vi < NV - 1; ++vi) _mm256_storeu_ps(out + vi * kW, _mm256_div_ps(st.acc[vi], vl));
  _mm256_maskstore_ps(out + (NV - 1) * kW, tail_mask(hd - (NV - 1) * kW), _mm256_div_ps(st.acc[NV - 1], vl));
  return {st.mx, st.l};
}

// The 8 sums of d[0..7] in one vector, lane b = d[b]'s (a horizontal-add
// tree: 7 adds and 2 lane shuffles for 8 sums instead of 8 hsums).
inline __m256 hsum8(const __m256 (&d)[8]) {
  // hadd(a, b) = [a0+a1, a2+a3, b0+b1, b2+b3 | a4+a5, a6+a7, b4+b5, b6+b7]
  const __m256 t0 = _mm256_hadd_ps(d[0], d[1]), t1 = _mm256_hadd_ps(d[2], d[3]);
  const __m256 t2 = _mm256_hadd_ps(d[4], d[5]), t3 = _mm256_hadd_ps(d[6], d[7]);
  // [d0..d3 over lanes 0-3 | the same over lanes 4-7], then for d4..d7
  const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

// Positions per chunk of attend_dense's scores: 2 KiB on the stack.
constexpr int64_t kScoreChunk = 512;

// Rows exactly NV vectors long (stride == hd == NV * 8, as the attention
// op's cache rows are), in three passes over chunks of kScoreChunk
// positions, as the AVX-512 table's attend_dense (avx512.cc):
//   1. s[j] = scale * dot(q, K[j]), 8 positions per horizontal-add tree
//      (hsum8), and their max;
//   2. s[j] = exp(s[j] - max), 8 at a time, and their sum;
//   3. acc += s[j] * V[j]; up to 4 vectors a row in two sets of
//      accumulators, so the chains of dependent FMAs are half as long;
//      8 vectors (hd 64) fill the 16 ymm with one set.
// Passes 1 and 3 read each chunk's rows as two streams (its two halves at
// once), with no software prefetch: one core streams two sequences of
// lines faster than one (k3 sysinfo's read probe: 17 and 20 GB/s here),
// and four measured as two. q is read from L1 in pass 1: 16 ymm hold the 8
// dot products, not q too. The max is known before any exp, so no position
// rescales the accumulators or takes a data-dependent branch (only a later
// chunk with a larger max rescales, once). A NaN score stays NaN through
// pass 2 (exp_ps), so a NaN in K or q makes the output NaN, as in the
// reference. One thread, hd 64, Zen 3 (bench_kernels
// avx2/attend(_stream)?/len(128|1024)_hd64, 3 rounds in turn, GB/s at len
// 128 / 1024), against the online softmax (attend_regs): in cache
// 41.5-46.5 / 39.7-45.6 -> 69.6-76.9 / 64.0-65.3; streamed 12.8-15.9 /
// 14.9-16.9 -> 14.0-20.3 / 17.7-19.2.
template <int NV, class T>
AttendStats attend_dense(const float* q, const T* k, const T* v, int64_t len, float scale, float* out) {
  constexpr int64_t hd = NV * kW;
  constexpr bool kTwoSets = NV <= 4;
  __m256 acc0[NV], acc1[NV];
#pragma GCC unroll 8
  for (int vi = 0; vi < NV; ++vi) {
    acc0[vi] = _mm256_setzero_ps();
    acc1[vi] = _mm256_setzero_ps();
  }
  float mx = -__builtin_inff();  // running max score
  float l = 0.0f;                // running sum of exp(s - mx)
  alignas(32) float s[kScoreChunk];
  const __m256 vscale = _mm256_set1_ps(scale);
  for (int64_t c0 = 0; c0 < len; c0 += kScoreChunk) {
    const int64_t n = min64(kScoreChunk, len - c0);
    const T* kc = k + c0 * hd;
    const T* vc = v + c0 * hd;
    // 1. Scores and their max.
    // Two streams: positions j.. and h + j.. of the chunk's first 8 * (n / 8),
    // 4 of each per step.
    __m256 vmax = _mm256_set1_ps(-__builtin_inff());
    const int64_t h = n / 8 * 4;
    for (int64_t j = 0; j < h; j += 4) {
      __m256 d[8];
#pragma GCC unroll 8
      for (int b = 0; b < 8; ++b) d[b] = _mm256_setzero_ps();
#pragma GCC unroll 8
      for (int vi = 0; vi < NV; ++vi) {
        const __m256 qv = _mm256_loadu_ps(q + vi * kW);
#pragma GCC unroll 8
        for (int b = 0; b < 8; ++b)
          d[b] = _mm256_fmadd_ps(qv, load_cache(kc + ((b < 4 ? j : h + j) + b % 4) * hd + vi * kW, kW), d[b]);
      }
      const __m256 sv = _mm256_mul_ps(vscale, hsum8(d));
      _mm_store_ps(s + j, _mm256_castps256_ps128(sv));
      _mm_store_ps(s + h + j, _mm256_extractf128_ps(sv, 1));
      vmax = _mm256_max_ps(vmax, sv);
    }
    float cmax = hmax(vmax);
    for (int64_t j = 2 * h; j < n; ++j) {  // the last n % 8 positions, one at a time
      __m256 d = _mm256_setzero_ps();
#pragma GCC unroll 8
      for (int vi = 0; vi < NV; ++vi)
        d = _mm256_fmadd_ps(_mm256_loadu_ps(q + vi * kW), load_cache(kc + j * hd + vi * kW, kW), d);
      s[j] = scale * hsum(d);
      cmax = s[j] > cmax ? s[j] : cmax;
    }
    // A larger max than the earlier chunks': rescale what they summed
    // (exp(mx - cmax) <= 1; on the first chunk mx = -inf clamps to ~1e-38,
    // harmless as acc and l are still 0).
    if (cmax > mx) {
      const __m256 va = exp_ps(_mm256_set1_ps(mx - cmax));
#pragma GCC unroll 8
      for (int vi = 0; vi < NV; ++vi) {
        acc0[vi] = _mm256_mul_ps(acc0[vi], va);
        if constexpr (kTwoSets) acc1[vi] = _mm256_mul_ps(acc1[vi], va);
      }
      l *= _mm256_cvtss_f32(va);
      mx = cmax;
    }
    // 2. Weights and their sum (lanes past n: 0).
    const __m256 vmx = _mm256_set1_ps(mx);
    __m256 vsum = _mm256_setzero_ps();
    for (int64_t i = 0; i < n; i += 8) {
      const __m256i m = tail_mask(min64(8, n - i));
      const __m256 x = _mm256_sub_ps(_mm256_load_ps(s + i), vmx);
      const __m256 pv = _mm256_and_ps(exp_ps(x), _mm256_castsi256_ps(m));
      _mm256_store_ps(s + i, pv);
      vsum = _mm256_add_ps(vsum, pv);
    }
    l += hsum(vsum);
    // 3. The weighted sum of V rows, two streams: rows i and nh + i.
    const int64_t nh = n / 2;
    for (int64_t i = 0; i < nh; ++i) {
      const __m256 p0 = _mm256_broadcast_ss(s + i), p1 = _mm256_broadcast_ss(s + nh + i);
#pragma GCC unroll 8
      for (int vi = 0; vi < NV; ++vi) {
        acc0[vi] = _mm256_fmadd_ps(p0, load_cache(vc + i * hd + vi * kW, kW), acc0[vi]);
        if constexpr (kTwoSets)
          acc1[vi] = _mm256_fmadd_ps(p1, load_cache(vc + (nh + i) * hd + vi * kW, kW), acc1[vi]);
        else
          acc0[vi] = _mm256_fmadd_ps(p1, load_cache(vc + (nh + i) * hd + vi * kW, kW), acc0[vi]);
      }
    }
    if (n % 2 != 0) {
      const __m256 p0 = _mm256_broadcast_ss(s + n - 1);
#pragma GCC unroll 8
      for (int vi = 0; vi < NV; ++vi)
        acc0[vi] = _mm256_fmadd_ps(p0, load_cache(vc + (n - 1) * hd + vi * kW, kW), acc0[vi]);
    }
  }
  const __m256 vl = _mm256_set1_ps(l);
#pragma GCC unroll 8
  for (int vi = 0; vi < NV; ++vi) {
    const __m256 a = kTwoSets ? _mm256_add_ps(acc0[vi], acc1[vi]) : acc0[vi];
    _mm256_storeu_ps(out + vi * kW, _mm256_div_ps(a, vl));
  }
  return {mx, l};
}

// Any hd, len >= 1: the same online softmax one position at a time,
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
    __m256 d = _mm256_setzero_ps();
    for (int64_t i = 0; i < hd; i += kW) d = _mm256_fmadd_ps(load_cache(q + i, hd - i), load_cache(kj + i, hd - i), d);
    const float s = scale * hsum(d);
    if (s > mx) {
      const float alpha = expf(mx - s);  // 0 on the first position
      const __m256 va = _mm256_set1_ps(alpha);
      map1(out, hd, out, [va](__m256 o) { return _mm256_mul_ps(o, va); });
      l *= alpha;
      mx = s;
    }
    const float p = expf(s - mx);
    l += p;
    const __m256 vp = _mm256_set1_ps(p);
    for (int64_t i = 0; i < hd; i += kW) {
      const __m256 o = _mm256_fmadd_ps(vp, load_cache(vj + i, hd - i), load_cache(out + i, hd - i));
      if (hd - i >= kW)
        _mm256_storeu_ps(out + i, o);
      else
        _mm256_maskstore_ps(out + i, tail_mask(hd - i), o);
    }
  }
  const __m256 vl = _mm256_set1_ps(l);
  map1(out, hd, out, [vl](__m256 o) { return _mm256_div_ps(o, vl); });
  return {mx, l};
}

template <class T>
using AttendFn = AttendStats (*)(const float*, const T*, const T*, int64_t, int64_t, int64_t, float, float*);

// kAttendRegs<T>[nv - 1] handles hd in ((nv - 1) * 8, nv * 8], i.e. up to
// 128; beyond that the accumulator would live on the stack anyway.
template <class T>
constexpr AttendFn<T> kAttendRegs[] = {
    attend_regs<1, T>,  attend_regs<2, T>,  attend_regs<3, T>,  attend_regs<4, T>,
    attend_regs<5, T>,  attend_regs<6, T>,  attend_regs<7, T>,  attend_regs<8, T>,
    attend_regs<9, T>,  attend_regs<10, T>, attend_regs<11, T>, attend_regs<12, T>,
    attend_regs<13, T>, attend_regs<14, T>, attend_regs<15, T>, attend_regs<16, T>,
};
constexpr int64_t kMaxRegVectors = 16;
template <class T>
using DenseAttendFn = AttendStats (*)(const float*, const T*, const T*, int64_t, float, float*);
// kAttendDense<T>[nv - 1]: rows of exactly nv vectors.
template <class T>
constexpr DenseAttendFn<T> kAttendDense[] = {
    attend_dense<1, T>, attend_dense<2, T>, attend_dense<3, T>, attend_dense<4, T>,
    attend_dense<5, T>, attend_dense<6, T>, attend_dense<7, T>, attend_dense<8, T>,
};
constexpr int64_t kMaxDenseVectors = 8;

// q: [hd]; k, v: [len, hd] with row stride `stride`; out: [hd]. len == 0
// gives zeros, as in the reference.
template <class T>
AttendStats attend_rows(const float* q, const T* k, const T* v, int64_t len, int64_t hd, int64_t stride, float scale,
                        float* out) {
  if (len == 0) {
    zero(out, hd);
    return {-__builtin_inff(), 0.0f};
  }
  const int64_t nv = (hd + kW - 1) / kW;
  if (nv == 0) return {0.0f, static_cast<float>(len)};  // hd 0: every score 0
  if (nv > kMaxRegVectors) return attend_any(q, k, v, len, hd, stride, scale, out);
  if (nv <= kMaxDenseVectors && hd == nv * kW && stride == hd) return kAttendDense<T>[nv - 1](q, k, v, len, scale, out);
  return kAttendRegs<T>[nv - 1](q, k, v, len, hd, stride, scale, out);
}

constexpr KernelTable kTable = {
    .isa = Isa::kAvx2,
    .prefetch = Prefetch::kL2,  // its row, int8 and panel tiles prefetch with T1
    .gemm_nt = gemm_nt,
    .gemm_nt_bf16 = gemm_nt_bf16,
    .gemm_nt_bf16dot = gemm_nt_bf16dot,
    .gemm_nt_q8 = gemm_nt_q8_avx2,
    .q8_prepared = {q8_row_bytes_avx2, prepare_q8_avx2, gemm_q8_prepared_avx2, prepare_q8_cols_avx2,
                    kQ8PrepareColGroup},
    .bf16dot_prepared = {bf16dot_rounded_row_bytes, prepare_bf16dot_rounded, gemm_bf16dot_rounded<gemm_nt_bf16>,
                         prepare_bf16dot_rounded_cols, kBf16DotRoundedColGroup},
    .bf16dot_tiles_prepared = {bf16dot_rounded_row_bytes, prepare_bf16dot_rounded,
                               gemm_tiles_via_rows<gemm_bf16dot_rounded<gemm_nt_bf16>>, prepare_bf16dot_rounded_cols,
                               kBf16DotRoundedColGroup},
    .gemm_nt_p16 = gemm_nt_p16,
    .gemm_nt_bf16p16 = gemm_nt_bf16p16,
    .bf16dotp16_prepared = {bf16dot_rounded_row_bytes, prepare_bf16dot_rounded,
                            gemm_bf16dot_panels_rounded<gemm_nt_bf16p16>, prepare_bf16dot_rounded_cols,
                            kBf16DotRoundedColGroup},
    .gemm_nt_q8p16 = gemm_nt_q8p_avx2<false>,
    .q8p16_prepared = {q8_row_bytes_avx2, prepare_q8_avx2, gemm_q8p_prepared_avx2<false>, prepare_q8_cols_avx2,
                       kQ8PrepareColGroup},
    .gemm_nt_q8cp16 = gemm_nt_q8p_avx2<true>,
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
    .attend = attend_rows<float>,
    .attend_bf16 = attend_rows<uint16_t>,
    .attend_cached = attend_rows<float>,  // nothing to leave out: no software prefetch
    .attend_bf16_cached = attend_rows<uint16_t>,
};

}  // namespace

const KernelTable& avx2_table() {
  return kTable;
}

}  // namespace k3::kernels
