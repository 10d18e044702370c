// pack-weights: see pack_weights.cc.
#pragma once

#include <string>

#include "passes/pass.h"

namespace k3::passes {

class PackWeights final : public Pass {
 public:
  // "rows": a no-op (the kernels' default layout); "panels": f32/bf16
  // matrices into panels, int8 ones into int8 panels (q8_channel: into the
  // channel-scale panels, as `--precision int8-channel` quantized them);
  // "tiles": bf16dot matrices into AMX tiles.
  explicit PackWeights(std::string layout = "panels", bool q8_channel = false)
      : layout_(std::move(layout)), q8_channel_(q8_channel) {}
  std::string_view name() const override { return "pack-weights"; }
  std::string_view summary() const override {
    return "store f32/bf16 Linear and expert matrices as k-major panels of 16 rows (one FMA chain per output, "
           "no horizontal sums), or with --weight-layout tiles bf16dot ones as contiguous AMX tiles";
  }
  StatusOr<bool> run(ir::Graph& g) override;

 private:
  std::string layout_;
  bool q8_channel_;
};

}  // namespace k3::passes
