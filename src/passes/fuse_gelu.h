// fuse-gelu: see fuse_gelu.cc for the patterns and their guards.
#pragma once

#include "passes/pass.h"

namespace k3::passes {

class FuseGelu final : public Pass {
 public:
  std::string_view name() const override { return "fuse-gelu"; }
  std::string_view summary() const override {
    return "fold an exported erf GeLU (and the tanh approximation) into onnx.Gelu";
  }
  StatusOr<bool> run(ir::Graph& g) override;
};

}  // namespace k3::passes
