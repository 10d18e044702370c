// fuse-residual-add: see fuse_residual_add.cc for the pattern and its guards.
#pragma once

#include "passes/pass.h"

namespace k3::passes {

class FuseResidualAdd final : public Pass {
 public:
  std::string_view name() const override { return "fuse-residual-add"; }
  std::string_view summary() const override {
    return "add the residual stream in the epilogue of the Linear or Moe that feeds it";
  }
  StatusOr<bool> run(ir::Graph& g) override;
};

}  // namespace k3::passes
