// Shape rules of the onnx.* ops (ir/onnx_op_table.h).
//
// Unlike the fused ops' static rules, these are functions of the input
// dtypes, the input shapes (a dim may be -1: unknown at compile time) and,
// when known, the values of inputs (shape tensors, axes, Slice starts, TopK
// k, Range bounds). The importer calls them with the values of constant
// weights; the O0 interpreter calls them every step with concrete shapes and
// all values known, so the same code decides shapes at compile and run time.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "ir/graph.h"

namespace k3::ir {

struct OnnxInput {
  bool present = false;  // false for an omitted optional input
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;  // -1 = unknown
  const void* data = nullptr;  // element values when known (shape fully known then)
};

// Output types of an onnx.* node. Dims that depend on unknown dims or on
// unknown values come out as -1 (NonZero's count always does).
Status infer_onnx(const Node& n, std::span<const OnnxInput> in, std::vector<OutType>& out);

// The OnnxInput list for a node of a graph (weights' data counts as known).
std::vector<OnnxInput> onnx_inputs_of(const Graph& g, const Node& n);

// ONNX TensorProto data type code <-> IR dtype; nullopt when K3 has no such dtype.
std::optional<DType> dtype_from_onnx(int64_t code);
int64_t dtype_to_onnx(DType t);

// Numeric-broadcast of two shapes (ONNX multidirectional); error when incompatible.
StatusOr<std::vector<int64_t>> broadcast_shapes(const std::vector<int64_t>& a, const std::vector<int64_t>& b);

// One Slice axis: first index and element count for (start, end, step) on a
// dim of size `dim` (negative start/end count from the end; step != 0).
void slice_bounds(int64_t dim, int64_t start, int64_t end, int64_t step, int64_t& first, int64_t& count);

}  // namespace k3::ir
