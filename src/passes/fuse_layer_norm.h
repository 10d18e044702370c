// fuse-layer-norm: see fuse_layer_norm.cc for the pattern and its guards.
#pragma once

#include "passes/pass.h"

namespace k3::passes {

class FuseLayerNorm final : public Pass {
 public:
  std::string_view name() const override { return "fuse-layer-norm"; }
  std::string_view summary() const override {
    return "fold an exported LayerNorm (ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div[/Mul][/Add]) into "
           "onnx.LayerNormalization";
  }
  StatusOr<bool> run(ir::Graph& g) override;
};

}  // namespace k3::passes
