// Rounding a product's rows once for the kernels that round A before they
// multiply (int8 and bf16 dot products; kernels.h, PreparedGemm), so a
// Linear's threads and a MoE's experts share one rounding instead of each
// call repeating it. The rows go into the op's workspace, sized by
// prepared_bytes_bound when the plan is made, before the kernel table is
// known.
#pragma once

#include <cstdint>

#include "runtime/ops/op_call.h"
#include "util/checked.h"

namespace k3::runtime {

// The table's PreparedGemm for a weight dtype, or nullptr when the dtype's
// kernel multiplies A as it is.
inline const kernels::PreparedGemm* prepared_gemm(const kernels::KernelTable* kt, ir::DType dt) {
  if (dt == ir::DType::kQ8) return &kt->q8_prepared;
  if (dt == ir::DType::kQ8P16) return &kt->q8p16_prepared;
  if (dt == ir::DType::kQ8CP16) return &kt->q8cp16_prepared;
  if (dt == ir::DType::kBF16Dot) return &kt->bf16dot_prepared;
  if (dt == ir::DType::kBF16DotT16) return &kt->bf16dot_tiles_prepared;
  if (dt == ir::DType::kBF16DotP16) return &kt->bf16dotp16_prepared;
  return nullptr;
}

// Workspace bytes for `rows` prepared rows of K values for weights of dtype
// dt, enough for any table; 0 for the dtypes that need none.
inline uint64_t prepared_bytes_bound(ir::DType dt, int64_t rows, int64_t K) {
  int64_t per_row = 0;
  if (ir::dtype_is_q8(dt)) per_row = kernels::q8_prepared_row_bytes_bound(K);
  if (dt == ir::DType::kBF16Dot || dt == ir::DType::kBF16DotT16 || dt == ir::DType::kBF16DotP16)
    per_row = kernels::bf16dot_prepared_row_bytes_bound(K);
  return align_up(static_cast<uint64_t>(rows) * static_cast<uint64_t>(per_row), 64);
}

// Rows [r0, r1) of A (lda apart) on this thread, as prepare_rows below
// gives them: rounded into buf's rows r0.. by pg, or as they are when pg is
// nullptr (the dtype's kernel does not round A). Returns rows r0...
inline ActRows prepare_rows_here(const kernels::PreparedGemm* pg, int64_t r0, int64_t r1, int64_t K, const float* A,
                                 int64_t lda, uint8_t* buf) {
  if (pg == nullptr) return ActRows{A + r0 * lda, lda};
  const int64_t stride = pg->row_bytes(K);
  pg->prepare(r1 - r0, K, A + r0 * lda, lda, buf + r0 * stride);
  return ActRows{A + r0 * lda, lda, buf + r0 * stride, stride};
}

// Rows [0, rows) of A (lda apart) for a product with weights of dtype dt:
// rounded into buf (64-byte aligned, prepared_bytes_bound bytes) when dt's
// kernel rounds A, on the pool's threads when there are many rows; as they
// are otherwise.
inline ActRows prepare_rows(const OpCall& c, ir::DType dt, int64_t rows, int64_t K, const float* A, int64_t lda,
                            uint8_t* buf) {
  const kernels::PreparedGemm* pg = prepared_gemm(c.kt, dt);
  // Batched decode rounds its 8-16 rows here: 0.04-0.3 ns a value.
  if (pg == nullptr || rows * K < kParallelValues) return prepare_rows_here(pg, 0, rows, K, A, lda, buf);
  c.pool->parallel_for(rows, 1, [&](int64_t b, int64_t e) { prepare_rows_here(pg, b, e, K, A, lda, buf); });
  return ActRows{A, lda, buf, pg->row_bytes(K)};
}

}  // namespace k3::runtime
