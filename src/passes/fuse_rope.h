// fuse-rope: see fuse_rope.cc for the pattern and its guards.
#pragma once

#include "passes/pass.h"

namespace k3::passes {

class FuseRope final : public Pass {
 public:
  std::string_view name() const override { return "fuse-rope"; }
  std::string_view summary() const override {
    return "rotary embedding (table Gather by position + rotate-half) -> k3.Rope before the head split";
  }
  StatusOr<bool> run(ir::Graph& g) override;
};

}  // namespace k3::passes
