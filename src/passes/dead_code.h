// dead-code: see dead_code.cc for what it removes and its guards.
#pragma once

#include "passes/pass.h"

namespace k3::passes {

class DeadCode final : public Pass {
 public:
  std::string_view name() const override { return "dead-code"; }
  std::string_view summary() const override { return "remove nodes whose results nothing needs, and unused values"; }
  StatusOr<bool> run(ir::Graph& g) override;
};

}  // namespace k3::passes
