// lower-to-plan: see lower_to_plan.cc.
#pragma once

#include "passes/pass.h"
#include "passes/pipeline.h"

namespace k3::passes {

class LowerToPlan final : public Pass {
 public:
  explicit LowerToPlan(PipelineOptions::PlanShape shape) : shape_(shape) {}
  std::string_view name() const override { return "lower-to-plan"; }
  std::string_view summary() const override {
    return "an ONNX decoder whose every op has a planned equivalent -> the fused step graph (fixed-slot KV cache)";
  }
  StatusOr<bool> run(ir::Graph& g) override;

 private:
  PipelineOptions::PlanShape shape_;
};

}  // namespace k3::passes
