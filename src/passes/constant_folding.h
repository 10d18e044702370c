// constant-folding: see constant_folding.cc for what it folds and its guards.
#pragma once

#include <cstdint>

#include "passes/pass.h"

namespace k3::passes {

// Largest single folded output. Folding turns an op's result into a weight
// stored in the .k3m: a small Expand / Tile / ConstantOfShape node can stand
// for a huge tensor, and folding it would inflate the file and the load
// time by far more than computing it at run time costs. 64 MiB is well above
// shape arithmetic, masks and rotary tables of real models and well below
// what would matter next to their weights.
inline constexpr uint64_t kMaxFoldedBytes = uint64_t{64} << 20;

class ConstantFolding final : public Pass {
 public:
  std::string_view name() const override { return "constant-folding"; }
  std::string_view summary() const override {
    return "evaluate onnx.* nodes whose inputs are constants (and Shape/Size of known shapes) at compile time";
  }
  StatusOr<bool> run(ir::Graph& g) override;
};

}  // namespace k3::passes
