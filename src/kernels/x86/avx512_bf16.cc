// The AVX-512 BF16 matrix product (gemm_nt_bf16dot of the AVX-512 table on
// CPUs with avx512bf16): its own translation unit because it is compiled
// with -mavx512bf16, which the rest of the AVX-512 table must not assume
// (Skylake-SP and Ice Lake have AVX-512 without it). Same rules as avx512.cc:
// internal linkage, no inline library functions.
//
// W rows are bf16 as stored ([N, K], row stride ldw); the activations are
// rounded to bf16 (vcvtne2ps2bf16, nearest even) into prepared rows
// (kernels.h, PreparedGemm), row stride K rounded up to 32 and zero-padded.
// One k step of a tile then covers 32 k:
//   acc[i][j] = dpbf16(acc[i][j], a_i[k..k+32), w_j[k..k+32))   (16 f32 lanes,
//               lane l += a[2l] w[2l] + a[2l+1] w[2l+1])
// and C = hsum(acc) (avx512_util.h). That is one instruction per 64 bytes
// of W where the widening kernel (avx512.cc, gemm_nt_bf16) spends two
// widenings and two FMAs, so prefill runs on the dot-product units, which on
// Zen 4/5 do twice the fp32 FMA rate. The sequence per element does not
// depend on M, the tile or the column split (the gemm_nt contract).
#include <array>
#include <cstdint>
#include <utility>

#include "kernels/prepared_chunks.h"
#include "kernels/x86/avx512_util.h"
#include "kernels/x86/row_drive.h"
#include "kernels/x86/tables.h"

namespace k3::kernels {
namespace {

constexpr int64_t kStep = 32;  // bf16 per zmm: k consumed per dot-product step
constexpr int64_t kMr = 4;     // rows of A per tile
constexpr int64_t kNr = 4;     // rows of W per tile (16 acc + 4 W + 1 A = 21 zmm)
// 6 x 4, 5 x 4, 4 x 6 and 8 x 3 tiles were measured against 4 x 4
// (bench_kernels avx512/gemm_nt_bf16dot_(hot|stream)/M(32|128), one thread,
// 3 rounds in turn on the Zen 5 host): none was ahead by more than the
// rounds' spread (about 10%), 8 x 3 was behind.
// The tile walk of avx512.cc's gemm_nt: 4 far streams per thread at decode.
constexpr RowTiling kRowTiling = {.max_mr = kMr, .adj_nr = kNr, .far_max_m = 8, .far_nr_m2 = 4, .far_nr = 4};

// One line of each W row is prefetched per 64 bytes of K consumed, into the
// table's level (kernels.h, Prefetch): L1 streamed best on Zen 5, L2 on Zen 4.

inline __m512bh as_bh(__m512i v) {
  return reinterpret_cast<__m512bh&>(v);
}

// Lanes [0, n) of 32 16-bit lanes, 0 <= n <= 32.
inline __mmask32 tail_mask32(int64_t n) {
  return n >= 32 ? ~__mmask32{0} : static_cast<__mmask32>((1u << n) - 1u);
}

// Row stride of the prepared rows, in bf16 values: K rounded up to a step.
inline int64_t padded_k(int64_t K) {
  return (K + kStep - 1) / kStep * kStep;
}

// C[0..MR, 0..NR) (outputs cs apart) from MR prepared rows (stride lda) and
// NR bf16 W rows (stride ldw); prefetch, if set, is the next tile's first row.
template <Prefetch P, int MR, int NR>
void dot_tile(int64_t K, const uint16_t* A, int64_t lda, const uint16_t* W, int64_t ldw, float* C, int64_t ldc,
              int64_t cs, const uint16_t* prefetch) {
  __m512 acc[MR][NR];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + kStep <= K; k += kStep) {
    if (prefetch != nullptr) {
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j) _mm_prefetch(reinterpret_cast<const char*>(prefetch + j * ldw + k), kHintOf<P>);
    }
    __m512i w[NR];
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) w[j] = _mm512_loadu_si512(W + j * ldw + k);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m512bh a = as_bh(_mm512_load_si512(A + i * lda + k));
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], a, as_bh(w[j]));
    }
  }
  if (k < K) {  // the prepared rows are zero beyond K; W must not be read there
    const __mmask32 m = tail_mask32(K - k);
    __m512i w[NR];
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) w[j] = _mm512_maskz_loadu_epi16(m, W + j * ldw + k);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m512bh a = as_bh(_mm512_load_si512(A + i * lda + k));
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], a, as_bh(w[j]));
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) store_hsums(acc[i], C + i * ldc, cs);
}

using DotTileFn = void (*)(int64_t, const uint16_t*, int64_t, const uint16_t*, int64_t, float*, int64_t, int64_t,
                           const uint16_t*);
// kTiles<P>[(mr - 1) * kNr + nr - 1] = dot_tile<P, mr, nr>.
template <Prefetch P, int... I>
constexpr auto make_tiles(std::integer_sequence<int, I...>) {
  return std::array<DotTileFn, sizeof...(I)>{dot_tile<P, I / kNr + 1, I % kNr + 1>...};
}
template <Prefetch P>
constexpr auto kTiles = make_tiles<P>(std::make_integer_sequence<int, kMr * kNr>{});

}  // namespace

// This file's PreparedGemm (kernels.h). prepare: rows of A -> bf16, row
// stride padded_k(K), zero beyond K. gemm: the tiles walked as avx512.cc's
// gemm_nt walks them (row_drive.h), so W is streamed once per call.
int64_t bf16dot_row_bytes_avx512bf16(int64_t K) {
  return 2 * padded_k(K);
}
// Columns [k0, k_end) of the prepared rows (k0 a multiple of kStep; k_end
// one too, or padded_k(K) for the rest of the row with its zero padding).
static void prepare_bf16dot_range(int64_t M, int64_t K, int64_t k0, int64_t k_end, const float* A, int64_t lda,
                                  uint8_t* P) {
  const int64_t kp = padded_k(K);
  for (int64_t i = 0; i < M; ++i) {
    const float* a = A + i * lda;
    uint16_t* o = reinterpret_cast<uint16_t*>(P) + i * kp;
    for (int64_t k = k0; k < k_end; k += kStep) {
      // k < K here (kp - 32 < K), so the low half has 1..16 lanes, the high 0..16.
      const int64_t hi_n = K - k - 16;
      const __m512 lo = _mm512_maskz_loadu_ps(tail_mask(min64(16, K - k)), a + k);
      const __m512 hi = _mm512_maskz_loadu_ps(tail_mask(hi_n < 0 ? 0 : min64(16, hi_n)), a + k + 16);
      // cvtne2ps_pbh(hi, lo): lo converts into the low 16 lanes.
      const __m512bh h = _mm512_cvtne2ps_pbh(hi, lo);
      _mm512_store_si512(reinterpret_cast<__m512i*>(o + k), reinterpret_cast<const __m512i&>(h));
    }
  }
}
void prepare_bf16dot_avx512bf16(int64_t M, int64_t K, const float* A, int64_t lda, uint8_t* P) {
  prepare_bf16dot_range(M, K, 0, padded_k(K), A, lda, P);
}
void prepare_bf16dot_cols_avx512bf16(int64_t M, int64_t K, int64_t k0, int64_t k1, const float* A, int64_t lda,
                                     uint8_t* P) {
  static_assert(kBf16DotPrepareColGroup == kStep, "a column group is one step of the prepared row");
  prepare_bf16dot_range(M, K, k0, k1 == K ? padded_k(K) : k1, A, lda, P);
}
template <Prefetch Pf>
void gemm_bf16dot_prepared_avx512bf16(int64_t M, int64_t n0, int64_t n1, int64_t K, const uint8_t* P, const void* W,
                                      int64_t ldw, float* C, int64_t ldc) {
  drive_row_tiles(kRowTiling, M, n0, n1, K, reinterpret_cast<const uint16_t*>(P), padded_k(K),
                  static_cast<const uint16_t*>(W), ldw, C, ldc,
                  [](int64_t mr, int64_t nr) { return kTiles<Pf>[(mr - 1) * kNr + nr - 1]; });
}
template <Prefetch Pf>
void gemm_nt_bf16dot_avx512bf16(int64_t M, int64_t n0, int64_t n1, int64_t K, const float* A, int64_t lda,
                                const uint16_t* W, int64_t ldw, float* C, int64_t ldc) {
  gemm_prepared_chunks<bf16dot_row_bytes_avx512bf16, prepare_bf16dot_avx512bf16, gemm_bf16dot_prepared_avx512bf16<Pf>>(
      M, n0, n1, K, A, lda, W, ldw, C, ldc);
}
template void gemm_bf16dot_prepared_avx512bf16<Prefetch::kL1>(int64_t, int64_t, int64_t, int64_t, const uint8_t*,
                                                              const void*, int64_t, float*, int64_t);
template void gemm_bf16dot_prepared_avx512bf16<Prefetch::kL2>(int64_t, int64_t, int64_t, int64_t, const uint8_t*,
                                                              const void*, int64_t, float*, int64_t);
template void gemm_nt_bf16dot_avx512bf16<Prefetch::kL1>(int64_t, int64_t, int64_t, int64_t, const float*, int64_t,
                                                        const uint16_t*, int64_t, float*, int64_t);
template void gemm_nt_bf16dot_avx512bf16<Prefetch::kL2>(int64_t, int64_t, int64_t, int64_t, const float*, int64_t,
                                                        const uint16_t*, int64_t, float*, int64_t);

}  // namespace k3::kernels
