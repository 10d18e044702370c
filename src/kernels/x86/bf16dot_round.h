// gemm_nt_bf16dot for tables without bf16 dot products (AVX2, and AVX-512
// without avx512bf16): rows of A are rounded to bf16 (kept as f32 values,
// which bf16 widens to exactly) in chunks into a stack buffer, then the
// table's own gemm_nt_bf16 multiplies them. Each product is then bf16 x bf16,
// exact, as with vdpbf16ps; only the summation order differs. Chunking by
// rows changes no element's summation order (the gemm_nt contract), so the
// result stays independent of M and the column split. No intrinsics; an
// anonymous namespace, so each ISA translation unit compiles its own copy
// with its own flags.
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

template <class GemmBf16>
void gemm_bf16dot_rounded(int64_t M, int64_t n0, int64_t n1, int64_t K, const float* A, int64_t lda, const uint16_t* W,
                          int64_t ldw, float* C, int64_t ldc, GemmBf16 gemm_bf16) {
  alignas(64) float buf[kBf16DotMaxK];  // 128 KiB: 64 rows at K = 512
  const int64_t chunk = K == 0 ? M : kBf16DotMaxK / K;
  for (int64_t m0 = 0; m0 < M; m0 += chunk) {
    const int64_t rows = chunk < M - m0 ? chunk : M - m0;
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t k = 0; k < K; ++k) buf[i * K + k] = round_to_bf16(A[(m0 + i) * lda + k]);
    gemm_bf16(rows, n0, n1, K, buf, K, W, ldw, C + m0 * ldc, ldc);
  }
}

}  // namespace
}  // namespace k3::kernels
