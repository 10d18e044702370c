// The bf16 dot-product GEMM's PreparedGemm (kernels.h) for tables without
// bf16 dot products (AVX2, and AVX-512 without avx512bf16): a prepared row is
// the row of A rounded to bf16, kept as f32 values (which bf16 widens to
// exactly), K floats; the product is the table's own gemm_nt_bf16 on them.
// Each product is then bf16 x bf16, exact, as with vdpbf16ps; only the
// summation order differs. No intrinsics; an anonymous namespace, so each ISA
// translation unit compiles its own copy with its own flags.
#pragma once

#include <cstdint>

#include "kernels/kernels.h"

namespace k3::kernels {
namespace {

// f32 -> nearest-even bf16 -> f32 (util/half.h's f32_to_bf16, written here
// without library calls: this header is compiled with ISA flags). NaN stays
// NaN; values that round past the largest bf16 become inf.
inline float round_to_bf16(float f) {
  uint32_t u;
  __builtin_memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return f;
  u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  __builtin_memcpy(&f, &u, 4);
  return f;
}

inline int64_t bf16dot_rounded_row_bytes(int64_t K) {
  return 4 * K;
}

// Columns [k0, k1) of the rows (PreparedGemm::prepare_cols), whole cache
// lines of them at a time.
inline constexpr int64_t kBf16DotRoundedColGroup = 16;
inline void prepare_bf16dot_rounded_cols(int64_t M, int64_t K, int64_t k0, int64_t k1, const float* A, int64_t lda,
                                         uint8_t* P) {
  float* out = reinterpret_cast<float*>(P);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t k = k0; k < k1; ++k) out[i * K + k] = round_to_bf16(A[i * lda + k]);
}
inline void prepare_bf16dot_rounded(int64_t M, int64_t K, const float* A, int64_t lda, uint8_t* P) {
  prepare_bf16dot_rounded_cols(M, K, 0, K, A, lda, P);
}

template <void (*GemmBf16)(int64_t, int64_t, int64_t, int64_t, const float*, int64_t, const uint16_t*, int64_t, float*,
                           int64_t)>
void gemm_bf16dot_rounded(int64_t M, int64_t n0, int64_t n1, int64_t K, const uint8_t* P, const void* W, int64_t ldw,
                          float* C, int64_t ldc) {
  GemmBf16(M, n0, n1, K, reinterpret_cast<const float*>(P), K, static_cast<const uint16_t*>(W), ldw, C, ldc);
}

// The same rows against bf16 panels (kernels.h, bf16dotp16_prepared): the
// table's gemm_nt_bf16p16 on them.
template <void (*GemmBf16P16)(int64_t, int64_t, int64_t, int64_t, const float*, int64_t, const uint16_t*, float*,
                              int64_t, ReadNext)>
void gemm_bf16dot_panels_rounded(int64_t M, int64_t n0, int64_t n1, int64_t K, const uint8_t* P, const void* W,
                                 int64_t ldw, float* C, int64_t ldc) {
  (void)ldw;
  GemmBf16P16(M, n0, n1, K, reinterpret_cast<const float*>(P), K, static_cast<const uint16_t*>(W), C, ldc, {});
}

}  // namespace
}  // namespace k3::kernels
