// specialize-shapes: see specialize_shapes.cc for what it does and its guards.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "passes/pass.h"

namespace k3::passes {

class SpecializeShapes final : public Pass {
 public:
  // dims: symbolic dim name (ONNX dim_param) -> value, e.g. {"batch", 1}.
  explicit SpecializeShapes(std::vector<std::pair<std::string, int64_t>> dims) : dims_(std::move(dims)) {}
  std::string_view name() const override { return "specialize-shapes"; }
  std::string_view summary() const override {
    return "fix named input dims to the --input-shape values and re-infer onnx.* shapes";
  }
  StatusOr<bool> run(ir::Graph& g) override;

 private:
  std::vector<std::pair<std::string, int64_t>> dims_;
};

// Re-runs the shape rule of onnx.* node `node_index` with what is known now
// about its inputs (weights' data included) and writes the result into its
// output values. Dims still unknown keep their dim_param name; dims that
// became known lose it. Returns how many output values changed type; an
// error (naming the node) when the rule refuses the inputs or a known dim
// would change size. Fused nodes are not touched (returns 0).
StatusOr<int64_t> refresh_onnx_types(ir::Graph& g, size_t node_index);
// The same for every node, in order (after a rewrite changed what some
// onnx node reads, everything downstream may know more, or less).
Status refresh_all_onnx_types(ir::Graph& g);

}  // namespace k3::passes
