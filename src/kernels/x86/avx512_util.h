// Small AVX-512 helpers shared by the AVX-512 translation units (avx512.cc,
// avx512_vnni.cc). Intrinsics: include only from files compiled with the
// AVX-512 flags (cmake/isa.cmake); an anonymous namespace, so each unit
// compiles its own copy and none leaks into baseline code.
#pragma once

// GCC 12's AVX-512 headers trip -Wmaybe-uninitialized on their own
// "undefined" vectors (GCC PR 105593, fixed in 12.3/13); it is a false positive.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <cstdint>

#include "kernels/kernels.h"

namespace k3::kernels {
namespace {

// The _mm_prefetch hint for a Prefetch level (kernels.h).
template <Prefetch P>
inline constexpr _mm_hint kHintOf = P == Prefetch::kL2 ? _MM_HINT_T1 : _MM_HINT_T0;

// Lanes [0, n) set, 0 <= n <= 16.
inline __mmask16 tail_mask(int64_t n) {
  return static_cast<__mmask16>((1u << n) - 1u);
}

// Lanes of the 16 values from i on that lie in [0, n): all, or the tail's.
inline __mmask16 lanes_before(int64_t i, int64_t n) {
  return i + 16 <= n ? static_cast<__mmask16>(0xFFFF) : tail_mask(n - i);
}

inline int64_t min64(int64_t a, int64_t b) {
  return a < b ? a : b;
}

// Sum of the 16 lanes in one fixed order (halving tree). gemm_nt relies on
// this being the same instruction sequence for every output element.
inline float hsum(__m512 v) {
  const __m256 s8 = _mm256_add_ps(_mm512_extractf32x8_ps(v, 0), _mm512_extractf32x8_ps(v, 1));
  __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  s4 = _mm_add_ss(s4, _mm_movehdup_ps(s4));
  return _mm_cvtss_f32(s4);
}

// hsum(a), hsum(b), hsum(c), hsum(d) in lanes 0-3, each made of exactly
// hsum's additions (lanes l + l+8, then l + l+4, l + l+2, 0 + 1; float
// addition commutes), so the bits equal hsum's, in 10 vector ops instead of
// 4 x 7. Tile epilogues hold one accumulator per output: at K = 512 their
// horizontal sums cost as much as the int8 tile's dot products.
inline __m128 hsum4(__m512 a, __m512 b, __m512 c, __m512 d) {
  // Quarters (128 bits) [a0 a1 b0 b1] + [a2 a3 b2 b3]: a's and b's 8-lane sums.
  const __m512 ab = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(1, 0, 1, 0)),
                                  _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 cd = _mm512_add_ps(_mm512_shuffle_f32x4(c, d, _MM_SHUFFLE(1, 0, 1, 0)),
                                  _mm512_shuffle_f32x4(c, d, _MM_SHUFFLE(3, 2, 3, 2)));
  // Quarter q: the 4-lane sums of input q.
  const __m512 s4 = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, _MM_SHUFFLE(2, 0, 2, 0)),
                                  _mm512_shuffle_f32x4(ab, cd, _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512 s2 = _mm512_add_ps(s4, _mm512_permute_ps(s4, _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 s1 = _mm512_add_ps(s2, _mm512_movehdup_ps(s2));  // lane 4q: the sum of input q
  return _mm512_castps512_ps128(
      _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), s1));
}

// c[j * cs] = hsum(v[j]) for j < NR, four at a time.
template <int NR>
inline void store_hsums(const __m512 (&v)[NR], float* c, int64_t cs) {
  int j = 0;
  for (; j + 4 <= NR; j += 4) {
    const __m128 s = hsum4(v[j], v[j + 1], v[j + 2], v[j + 3]);
    if (cs == 1) {
      _mm_storeu_ps(c + j, s);
    } else {
      _mm_store_ss(c + j * cs, s);
      _mm_store_ss(c + (j + 1) * cs, _mm_movehdup_ps(s));
      _mm_store_ss(c + (j + 2) * cs, _mm_movehl_ps(s, s));
      _mm_store_ss(c + (j + 3) * cs, _mm_shuffle_ps(s, s, _MM_SHUFFLE(3, 3, 3, 3)));
    }
  }
  for (; j < NR; ++j) c[j * cs] = hsum(v[j]);
}

}  // namespace
}  // namespace k3::kernels
