// pack-weights: see pack_weights.cc.
#pragma once

#include <string>

#include "passes/pass.h"

namespace k3::passes {

class PackWeights final : public Pass {
 public:
  // "rows": a no-op (the kernels' default layout); "panels": f32/bf16
  // matrices into panels, bf16dot ones into bf16dot panels (unless
  // bf16dot_panels is false: `--precision bf16-mixed` keeps its experts on
  // the row kernel's bf16 dot products), int8 ones into int8 panels
  // (q8_channel: into the channel-scale panels, as `--precision
  // int8-channel` quantized them); "tiles": bf16dot matrices into AMX tiles.
  explicit PackWeights(std::string layout = "panels", bool q8_channel = false, bool bf16dot_panels = true)
      : layout_(std::move(layout)), q8_channel_(q8_channel), bf16dot_panels_(bf16dot_panels) {}
  std::string_view name() const override { return "pack-weights"; }
  std::string_view summary() const override {
    return "store f32/bf16/bf16dot Linear and expert matrices as k-major panels of 16 rows (one FMA chain per output, "
           "no horizontal sums), or with --weight-layout tiles bf16dot ones as contiguous AMX tiles";
  }
  StatusOr<bool> run(ir::Graph& g) override;

 private:
  std::string layout_;
  bool q8_channel_;
  bool bf16dot_panels_;
};

}  // namespace k3::passes
