// fuse-attention: see fuse_attention.cc for the pattern and its guards.
#pragma once

#include "passes/pass.h"

namespace k3::passes {

class FuseAttention final : public Pass {
 public:
  std::string_view name() const override { return "fuse-attention"; }
  std::string_view summary() const override {
    return "fold exported causal GQA attention (head split, KV cache Concat or slot Where, QK^T, scale, "
           "position mask, Softmax, .V, head merge) into k3.Attention";
  }
  StatusOr<bool> run(ir::Graph& g) override;
};

}  // namespace k3::passes
