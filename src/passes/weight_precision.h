// weight-precision: see weight_precision.cc.
#pragma once

#include <string>

#include "passes/pass.h"

namespace k3::passes {

// OK if the pass takes `precision` (fp32, bf16, bf16-f32, bf16-mixed, int8,
// int8-channel), else the
// error naming it and the choices: the one check behind --precision.
Status check_weight_precision(std::string_view precision);

class WeightPrecision final : public Pass {
 public:
  explicit WeightPrecision(std::string precision) : precision_(std::move(precision)) {}
  std::string_view name() const override { return "weight-precision"; }
  std::string_view summary() const override {
    return "store Linear and expert weights in --precision (bf16, bf16-f32, bf16-mixed: half the bytes each decode "
           "step reads; "
           "int8, int8-channel: about a quarter)";
  }
  StatusOr<bool> run(ir::Graph& g) override;

 private:
  std::string precision_;
};

}  // namespace k3::passes
