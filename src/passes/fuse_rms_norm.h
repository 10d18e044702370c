// fuse-rms-norm: see fuse_rms_norm.cc for the pattern and its guards.
#pragma once

#include "passes/pass.h"

namespace k3::passes {

class FuseRmsNorm final : public Pass {
 public:
  std::string_view name() const override { return "fuse-rms-norm"; }
  std::string_view summary() const override {
    return "fold an exported RMSNorm (Pow|Mul/ReduceMean/Add/Sqrt/Div|Reciprocal+Mul[/Mul]) into "
           "onnx.RMSNormalization";
  }
  StatusOr<bool> run(ir::Graph& g) override;
};

}  // namespace k3::passes
