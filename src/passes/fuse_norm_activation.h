// fuse-norm-activation: see fuse_norm_activation.cc for the pattern and its
// guards.
#pragma once

#include "passes/pass.h"

namespace k3::passes {

class FuseNormActivation final : public Pass {
 public:
  std::string_view name() const override { return "fuse-norm-activation"; }
  std::string_view summary() const override {
    return "norm -> [layout/broadcast ops] -> GeLU/Relu/Sigmoid/Tanh -> k3.NormAct, the activation moved above the "
           "layout ops";
  }
  StatusOr<bool> run(ir::Graph& g) override;
};

}  // namespace k3::passes
