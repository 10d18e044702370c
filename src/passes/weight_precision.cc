// weight-precision: stores matrix weights in the precision the user asked
// for (`k3 compile --precision`), once, at compile time; the .k3m holds the
// converted bytes and loading does no conversion.
//
//   Linear(x, W: f32 [N,K])              ->  Linear(x, W: bf16 [N,K])
//   Moe(x, gate: f32, experts: f32 ...)  ->  Moe(x, gate: f32, experts: bf16 ...)
//
// f32 -> bf16 rounds to nearest even. The kernels widen bf16 exactly and
// accumulate in f32, so the only error is the rounding of the weights.
//
// Guards (each has a must-not-convert test in tests/passes/test_weight_precision.cc):
//   - only weight values (constants) are converted, never activations;
//   - only f32 weights (a weight already in another dtype is left alone);
//   - the MoE gate stays f32: it decides which experts run by comparing
//     logits, and rounding could flip a choice (a discrete change in the
//     output) for 16 KiB per layer of savings;
//   - the embedding table stays f32: a step reads one row per token;
//   - a weight also read by a node this pass does not convert (e.g. a table
//     tied between embedding and output) is converted into a new value for
//     the converted readers only, so the other reader still sees f32.
// "fp32" is a no-op; other precisions are refused here (int8 comes with its
// kernels).
#include "passes/weight_precision.h"

#include <memory>
#include <vector>

#include "passes/graph_edit.h"
#include "util/half.h"

namespace k3::passes {

StatusOr<bool> WeightPrecision::run(ir::Graph& g) {
  if (precision_ == "fp32") return false;
  if (precision_ != "bf16") return unimplemented("weight precision '" + precision_ + "' is not supported (fp32, bf16)");
  std::vector<int> converted(g.values().size(), -1);  // f32 value id -> bf16 value id
  auto convert = [&](int id) -> int {
    const ir::Value& v = g.value(id);
    if (v.kind != ir::ValueKind::kWeight || v.dtype != ir::DType::kF32) return id;
    if (converted[static_cast<size_t>(id)] >= 0) return converted[static_cast<size_t>(id)];
    const auto n = static_cast<size_t>(v.numel());
    auto data = std::make_shared<std::vector<uint16_t>>(n);
    const auto* src = static_cast<const float*>(v.data);
    for (size_t i = 0; i < n; ++i) (*data)[i] = f32_to_bf16(src[i]);
    const int nid = g.add_weight(v.name, ir::DType::kBF16, v.shape, data->data());
    g.keep_alive.push_back(data);
    converted.resize(g.values().size(), -1);
    converted[static_cast<size_t>(id)] = nid;
    ++stats_.applied;
    return nid;
  };
  for (ir::Node& n : g.mutable_nodes()) {
    if (n.op == ir::OpKind::kLinear) {
      ++stats_.matched;
      n.inputs[1] = convert(n.inputs[1]);
    } else if (n.op == ir::OpKind::kMoe) {
      ++stats_.matched;
      for (size_t i = 2; i < n.inputs.size(); ++i) n.inputs[i] = convert(n.inputs[i]);
    }
  }
  if (stats_.applied == 0) return false;
  // Drop the f32 originals no node reads any more.
  g = compact(g, std::vector<bool>(g.nodes().size(), true));
  return true;
}

}  // namespace k3::passes
