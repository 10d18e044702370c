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

namespace k3::kernels {
namespace {

// Lanes [0, n) set, 0 <= n <= 16.
inline __mmask16 tail_mask(int64_t n) {
  return static_cast<__mmask16>((1u << n) - 1u);
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

}  // namespace
}  // namespace k3::kernels
