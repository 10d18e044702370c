// What an op implementation receives when the executor runs one node.
//
// All pointers are bound when the plan is built (arena offsets, weights, KV
// cache); per step only the row counts change. Implementations validate
// nothing: the graph was verified and the step inputs checked before running.
#pragma once

#include <cstdint>

#include "ir/graph.h"
#include "kernels/kernels.h"
#include "runtime/thread_pool.h"
#include "util/q8_panel.h"
#include "util/tiles.h"

namespace k3::runtime {

struct TensorArg {
  void* data = nullptr;
  const ir::Value* value = nullptr;
  int64_t rows = 0;  // leading dimension at this step (<= value->shape[0])

  float* f32() const { return static_cast<float*>(data); }
  const int32_t* i32() const { return static_cast<const int32_t*>(data); }
  int64_t dim(size_t axis) const { return value->shape[axis]; }
  int64_t cols() const { return value->shape.size() >= 2 ? value->shape[1] : 1; }
};

struct OpCall {
  const ir::Node* node = nullptr;
  const TensorArg* in = nullptr;
  const TensorArg* out = nullptr;
  void* workspace = nullptr;
  ThreadPool* pool = nullptr;
  const kernels::KernelTable* kt = nullptr;
};

using OpFn = void (*)(const OpCall&);

// Row-wise work (norms, rotary embedding, rounding a product's rows) on
// fewer values than this runs on the calling thread: a parallel region (0.4-1
// us to open and close, bench_thread_pool, plus each thread's first misses)
// costs more than a few thousand values, which is all a batched decode step
// gives them. On the Intel host, batch-8 k3-base int8 decode (k3 profile,
// two rounds in turn): LayerNorm 0.16 -> 0.09 ms per step, Rope 0.11 -> 0.06.
inline constexpr int64_t kParallelValues = 32768;

// The rows a product multiplies: A (lda floats apart) and, for the weight
// dtypes whose kernels round A before multiplying (kQ8, kBF16Dot), the same
// rows already rounded by prepare_rows (runtime/ops/prepared_rows.h), row i
// at prepared + i * prepared_stride, or nullptr to round them in the call.
struct ActRows {
  const float* a = nullptr;
  int64_t lda = 0;
  const uint8_t* prepared = nullptr;
  int64_t prepared_stride = 0;

  // Rows r.. of these.
  ActRows from(int64_t r) const {
    return {a + r * lda, lda, prepared != nullptr ? prepared + r * prepared_stride : nullptr, prepared_stride};
  }
};

// A product in two steps (kernels.h, PreparedGemm; the bf16 dot product in
// the tile and panel layouts) on rows x, rounding them here, a chunk at a
// time on the stack, when the caller has not (out of line: the buffer must
// not sit in every gemm_weight frame).
void gemm_prepared_here(const kernels::PreparedGemm& pg, int64_t M, int64_t n0, int64_t n1, int64_t K, const ActRows& x,
                        const uint8_t* w, float* C, int64_t ldc);

// C[M, n0..n1) = A[M, K] . W[row0 + n0 .. row0 + n1, K]^T for a weight
// argument stored as f32 or bf16 ([N, K], dense rows; kBF16Dot rounds A to
// bf16 too), int8 blocks
// (ir::DType::kQ8), f32 / bf16 panels (ir::DType::kF32P16 / kBF16P16 / kBF16DotP16,
// util/panel.h) or int8 panels (ir::DType::kQ8P16 / kQ8CP16, util/q8_panel.h): the kernel sees the rows from row0 on as
// a matrix of their own (a Linear's split output; row0 is a multiple of 16, so panels start on a panel). `next`
// (kernels::ReadNext) names the weights the caller multiplies next; the panel kernels prefetch them (next_rows below
// builds it).
inline void gemm_weight(const kernels::KernelTable* kt, int64_t M, int64_t n0, int64_t n1, int64_t K, const ActRows& x,
                        const TensorArg& w, float* C, int64_t ldc, int64_t row0 = 0, kernels::ReadNext next = {}) {
  const auto* base = static_cast<const uint8_t*>(w.data);
  const auto k = static_cast<uint64_t>(K), r = static_cast<uint64_t>(row0);
  const float* A = x.a;
  const int64_t lda = x.lda;
  switch (w.value->dtype) {
    case ir::DType::kBF16:
      kt->gemm_nt_bf16(M, n0, n1, K, A, lda, reinterpret_cast<const uint16_t*>(base + r * k * 2), K, C, ldc);
      break;
    case ir::DType::kBF16Dot:
      if (x.prepared != nullptr)
        kt->bf16dot_prepared.gemm(M, n0, n1, K, x.prepared, base + r * k * 2, K, C, ldc);
      else
        kt->gemm_nt_bf16dot(M, n0, n1, K, A, lda, reinterpret_cast<const uint16_t*>(base + r * k * 2), K, C, ldc);
      break;
    case ir::DType::kBF16DotT16:  // row0 / 16 whole blocks of 16 x Kp
      gemm_prepared_here(kt->bf16dot_tiles_prepared, M, n0, n1, K, x,
                         base + r * static_cast<uint64_t>(tile_padded_cols(K)) * 2, C, ldc);
      break;
    case ir::DType::kBF16DotP16:  // row0 / 16 whole panels of 16 x K
      // Prepared rows are f32 values (kernels.h, bf16dotp16_prepared): the
      // panel kernel takes them directly, with the caller's hint.
      if (x.prepared != nullptr)
        kt->gemm_nt_bf16p16(M, n0, n1, K, reinterpret_cast<const float*>(x.prepared), x.prepared_stride / 4,
                            reinterpret_cast<const uint16_t*>(base + r * k * 2), C, ldc, next);
      else
        gemm_prepared_here(kt->bf16dotp16_prepared, M, n0, n1, K, x, base + r * k * 2, C, ldc);
      break;
    case ir::DType::kQ8:
      if (x.prepared != nullptr)
        kt->q8_prepared.gemm(M, n0, n1, K, x.prepared, base + r * ir::q8_row_bytes(k), 0, C, ldc);
      else
        kt->gemm_nt_q8(M, n0, n1, K, A, lda, base + r * ir::q8_row_bytes(k), C, ldc);
      break;
    case ir::DType::kQ8P16:
    case ir::DType::kQ8CP16: {  // row0 / 16 whole panels (util/q8_panel.h)
      const bool channel = w.value->dtype == ir::DType::kQ8CP16;
      const uint8_t* wp = base + r / 16 * static_cast<uint64_t>(channel ? q8c_panel_bytes(K) : q8_panel_bytes(K));
      if (x.prepared != nullptr)
        (channel ? kt->q8cp16_prepared : kt->q8p16_prepared).gemm(M, n0, n1, K, x.prepared, wp, 0, C, ldc);
      else
        (channel ? kt->gemm_nt_q8cp16 : kt->gemm_nt_q8p16)(M, n0, n1, K, A, lda, wp, C, ldc);
      break;
    }
    case ir::DType::kBF16P16:  // row0 / 16 whole panels of 16 x K
      kt->gemm_nt_bf16p16(M, n0, n1, K, A, lda, reinterpret_cast<const uint16_t*>(base + r * k * 2), C, ldc, next);
      break;
    case ir::DType::kF32P16:
      kt->gemm_nt_p16(M, n0, n1, K, A, lda, reinterpret_cast<const float*>(base + r * k * 4), C, ldc, next);
      break;
    default:
      kt->gemm_nt(M, n0, n1, K, A, lda, reinterpret_cast<const float*>(base + r * k * 4), K, C, ldc);
  }
}
// Rows [n0, n1) of a K-column weight in the panel layouts, as the ReadNext
// hint of the gemm_weight call before the one that reads them; none for the
// other layouts, whose kernels take no hint.
inline kernels::ReadNext next_rows(const TensorArg& w, int64_t K, int64_t n0, int64_t n1) {
  int64_t elem = 0;
  if (w.value->dtype == ir::DType::kF32P16) elem = 4;
  if (w.value->dtype == ir::DType::kBF16P16 || w.value->dtype == ir::DType::kBF16DotP16) elem = 2;
  if (elem == 0 || n1 <= n0) return {};
  const int64_t p0 = n0 / 16, p1 = (n1 + 15) / 16;  // whole panels of 16 rows x K
  return {static_cast<const uint8_t*>(w.data) + p0 * 16 * K * elem, (p1 - p0) * 16 * K * elem};
}

inline void gemm_weight(const kernels::KernelTable* kt, int64_t M, int64_t n0, int64_t n1, int64_t K, const float* A,
                        int64_t lda, const TensorArg& w, float* C, int64_t ldc, int64_t row0 = 0) {
  gemm_weight(kt, M, n0, n1, K, ActRows{A, lda}, w, C, ldc, row0);
}

// Optimized implementation of an op (registry.cc).
OpFn fast_op(ir::OpKind op);
// Scalar reference implementation of an op (ref_ops.cc): plain loops, no
// threads, no SIMD; the oracle the fast ops are tested against.
OpFn ref_op(ir::OpKind op);
// Arena scratch bytes the fast implementation needs for this node at its
// static (maximum) shape; the reference implementations need the same or less.
uint64_t op_workspace_bytes(const ir::Graph& g, const ir::Node& node);

}  // namespace k3::runtime
