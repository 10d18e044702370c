// fuse-moe: see fuse_moe.cc for the patterns and their guards.
#pragma once

#include "passes/pass.h"

namespace k3::passes {

class FuseMoe final : public Pass {
 public:
  std::string_view name() const override { return "fuse-moe"; }
  std::string_view summary() const override {
    return "fold an exported MoE layer (gate, TopK, Softmax, expert dispatch) into k3.Moe";
  }
  StatusOr<bool> run(ir::Graph& g) override;
};

}  // namespace k3::passes
