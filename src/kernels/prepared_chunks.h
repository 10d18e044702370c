// gemm_nt_q8 and gemm_nt_bf16dot of every table, built from the table's
// PreparedGemm (kernels.h): rows of A are prepared in chunks into a stack
// buffer (no allocation; a chunk holds at least one row up to kQ8MaxK and
// kBf16DotMaxK), then each chunk is multiplied, so W is streamed once per
// chunk, once per call at decode. Chunking by rows changes no element's
// summation order (the gemm_nt contract). No intrinsics; an anonymous
// namespace, so each translation unit compiles its own copy with its flags.
#pragma once

#include <cstdint>

#include "kernels/kernels.h"

namespace k3::kernels {
namespace {

inline constexpr int64_t kPreparedStackBytes = 131072;
static_assert(q8_prepared_row_bytes_bound(kQ8MaxK) <= kPreparedStackBytes);
static_assert(bf16dot_prepared_row_bytes_bound(kBf16DotMaxK) <= kPreparedStackBytes);

template <int64_t (*RowBytes)(int64_t), void (*Prepare)(int64_t, int64_t, const float*, int64_t, uint8_t*),
          void (*Gemm)(int64_t, int64_t, int64_t, int64_t, const uint8_t*, const void*, int64_t, float*, int64_t)>
void gemm_prepared_chunks(int64_t M, int64_t n0, int64_t n1, int64_t K, const float* A, int64_t lda, const void* W,
                          int64_t ldw, float* C, int64_t ldc) {
  alignas(64) uint8_t buf[kPreparedStackBytes];
  const int64_t rb = RowBytes(K);
  const int64_t chunk = rb == 0 ? M : kPreparedStackBytes / rb;
  // K beyond the kernels' maximum is refused by the shape rules; stop
  // rather than loop on chunks of no rows if a caller skips them.
  if (chunk <= 0) __builtin_trap();
  for (int64_t m0 = 0; m0 < M; m0 += chunk) {
    const int64_t rows = chunk < M - m0 ? chunk : M - m0;
    Prepare(rows, K, A + m0 * lda, lda, buf);
    Gemm(rows, n0, n1, K, buf, W, ldw, C + m0 * ldc, ldc);
  }
}

}  // namespace
}  // namespace k3::kernels
