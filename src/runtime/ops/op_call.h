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

// Optimized implementation of an op (registry.cc).
OpFn fast_op(ir::OpKind op);
// Scalar reference implementation of an op (ref_ops.cc): plain loops, no
// threads, no SIMD; the oracle the fast ops are tested against.
OpFn ref_op(ir::OpKind op);
// Arena scratch bytes the fast implementation needs for this node at its
// static (maximum) shape; the reference implementations need the same or less.
uint64_t op_workspace_bytes(const ir::Graph& g, const ir::Node& node);

}  // namespace k3::runtime
