// fuse-sibling-linears: see fuse_sibling_linears.cc for the pattern and its guards.
#pragma once

#include "passes/pass.h"

namespace k3::passes {

class FuseSiblingLinears final : public Pass {
 public:
  std::string_view name() const override { return "fuse-sibling-linears"; }
  std::string_view summary() const override {
    return "stack the weights of Linears that read one input (q, k, v) into one Linear with split outputs";
  }
  StatusOr<bool> run(ir::Graph& g) override;
};

}  // namespace k3::passes
