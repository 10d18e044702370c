// fuse-layer-norm: folds the primitive-op LayerNorm that PyTorch's exporters
// write for a hand-written LayerNorm (k3ref's Norm) into one
// onnx.LayerNormalization(x, gamma, beta; axis=-1, epsilon=eps).
//
//   x --+--> ReduceMean(last axis) --> mean
//       |                               |
//       +--> Sub(x, mean) ----------> d +--> Pow(d, 2) | Mul(d, d)
//                                       |        |
//                                       |   ReduceMean(last axis) --> var
//                                       |        |
//                                       |   Add(var, eps) --> Sqrt --> std
//                                       |                              |
//                                       +--> Div(d, std) <-------------+
//                                              |
//                                           [Mul(., gamma)]  (either order)
//                                              |
//                                           [Add(., beta)]   (either order)
//                                              |
//                                              y   (any readers, may be an output)
//
// Without the Mul the scale is a new [D] weight of ones; without the Add
// there is no bias. The fused node takes the place of the last matched node.
//
// Guards (each has a must-not-match test in tests/passes/test_fuse_layer_norm.cc):
//   - both ReduceMeans reduce exactly the last axis (attribute or constant
//     axes input) with keepdims=1;
//   - x is f32 and its last dim D is known;
//   - the Pow exponent is a constant 2 (or the square is Mul(d, d));
//   - eps is a constant holding one number (rank <= rank of x);
//   - gamma / beta are f32 constant weights of shape [D] or [1, ..., 1, D];
//     a Mul/Add by anything else ends the match before it (the LayerNorm is
//     fused without it, with a note);
//   - every intermediate (mean, d, the square, var, var+eps, std, and the
//     Div/Mul outputs the match goes past) is read by exactly the matched
//     nodes and is not a graph output; d exactly by the square and the Div.
// A pattern that starts like a LayerNorm (ReduceMean feeding Sub(x, mean))
// but fails a guard is left alone and noted in the stats.
#include "passes/fuse_layer_norm.h"

#include <algorithm>

#include "passes/onnx_match.h"

namespace k3::passes {
namespace {

using ir::OpKind;

// Matches the pattern anchored at ReduceMean node `i`; nullopt when it does
// not, with `why` set when it started like a LayerNorm.
std::optional<Fusion> match(ir::Graph& g, const Readers& rd, int i, std::string& why) {
  const ir::Node& rm1 = g.nodes()[static_cast<size_t>(i)];
  if (rm1.op != OpKind::kOnnxReduceMean || rm1.inputs.empty() || rm1.outputs.empty()) return std::nullopt;
  const int x = rm1.inputs[0];
  const int mean = rm1.outputs[0];
  // Anchor: a reader Sub(x, mean).
  int sub_i = -1;
  for (int r : rd.of(mean)) {
    const ir::Node& n = g.nodes()[static_cast<size_t>(r)];
    if (n.op == OpKind::kOnnxSub && n.inputs.size() == 2 && n.inputs[0] == x && n.inputs[1] == mean) sub_i = r;
  }
  if (sub_i < 0) return std::nullopt;
  const ir::Node& sub = g.nodes()[static_cast<size_t>(sub_i)];
  std::string axis_why;
  if (!reduces_last_axis(g, rm1, axis_why)) return why = axis_why, std::nullopt;
  if (!is_f32(g, x)) return why = "x is " + std::string(ir::dtype_name(g.value(x).dtype)) + ", not f32", std::nullopt;
  const std::vector<int64_t>& xs = g.value(x).shape;
  if (xs.empty() || xs.back() < 0) return why = "the last dim of x is not known", std::nullopt;
  const int64_t d_dim = xs.back();
  const size_t rank = xs.size();
  if (!rd.single(mean)) return why = "the mean has other readers", std::nullopt;

  // d: read by the square and the Div only.
  const int d = sub.outputs[0];
  if (rd.is_output(d)) return why = "x - mean is a graph output", std::nullopt;
  int sq_i = -1, div_i = -1;
  size_t slots = 0;
  for (int r : rd.of(d)) {
    const ir::Node& n = g.nodes()[static_cast<size_t>(r)];
    if (r == sq_i || r == div_i) continue;
    if (n.op == OpKind::kOnnxMul && n.inputs.size() == 2 && n.inputs[0] == d && n.inputs[1] == d) {
      sq_i = r;
      slots += 2;
    } else if (n.op == OpKind::kOnnxPow && n.inputs.size() == 2 && n.inputs[0] == d) {
      const auto e = constant_scalar(g, n.inputs[1], rank);
      if (!e || *e != 2.0) return why = "Pow exponent is not a constant 2", std::nullopt;
      sq_i = r;
      slots += 1;
    } else if (n.op == OpKind::kOnnxDiv && n.inputs.size() == 2 && n.inputs[0] == d) {
      div_i = r;
      slots += 1;
    } else {
      return why = "x - mean is also read by " + n.name, std::nullopt;
    }
  }
  if (sq_i < 0 || div_i < 0 || slots != rd.of(d).size())
    return why = "x - mean is not read by exactly a square and a Div", std::nullopt;

  // var = ReduceMean(square)
  const ir::Node& sq = g.nodes()[static_cast<size_t>(sq_i)];
  const int rm2_i = rd.only_reader(sq.outputs[0]);
  if (rm2_i < 0 || g.nodes()[static_cast<size_t>(rm2_i)].op != OpKind::kOnnxReduceMean)
    return why = "the square is not read by one ReduceMean only", std::nullopt;
  const ir::Node& rm2 = g.nodes()[static_cast<size_t>(rm2_i)];
  if (!reduces_last_axis(g, rm2, axis_why)) return why = "variance: " + axis_why, std::nullopt;

  // Add(var, eps) -> Sqrt -> the Div's divisor.
  const int var = rm2.outputs[0];
  const int add_i = rd.only_reader(var);
  if (add_i < 0 || g.nodes()[static_cast<size_t>(add_i)].op != OpKind::kOnnxAdd)
    return why = "the variance is not read by one Add only", std::nullopt;
  const ir::Node& add = g.nodes()[static_cast<size_t>(add_i)];
  const auto eps = constant_scalar(g, other_input(add, var), rank);
  if (!eps) return why = "eps is not a constant scalar", std::nullopt;
  const int sqrt_i = rd.only_reader(add.outputs[0]);
  if (sqrt_i < 0 || g.nodes()[static_cast<size_t>(sqrt_i)].op != OpKind::kOnnxSqrt)
    return why = "var + eps is not read by one Sqrt only", std::nullopt;
  const int std_v = g.nodes()[static_cast<size_t>(sqrt_i)].outputs[0];
  if (rd.only_reader(std_v) != div_i || g.nodes()[static_cast<size_t>(div_i)].inputs[1] != std_v)
    return why = "the standard deviation is not read by the Div only", std::nullopt;

  std::vector<int> nodes = {i, sub_i, sq_i, rm2_i, add_i, sqrt_i, div_i};
  int y = g.nodes()[static_cast<size_t>(div_i)].outputs[0];
  // Optional Mul by gamma, then optional Add of beta.
  int gamma = -1, beta = -1;
  auto tail = [&](OpKind op, int& weight) {
    const int r = rd.only_reader(y);
    if (r < 0 || g.nodes()[static_cast<size_t>(r)].op != op) return;
    const ir::Node& n = g.nodes()[static_cast<size_t>(r)];
    const int w = other_input(n, y);
    std::string wwhy;
    if (w < 0 || w == y || g.value(w).kind != ir::ValueKind::kWeight) return;  // not an affine step
    if (!is_last_axis_weight(g, w, d_dim, rank, wwhy)) {
      why = "fused without " + n.name + ": " + wwhy;
      return;
    }
    weight = w;
    nodes.push_back(r);
    y = n.outputs[0];
  };
  tail(OpKind::kOnnxMul, gamma);
  if (why.empty()) tail(OpKind::kOnnxAdd, beta);

  Fusion f;
  f.nodes = nodes;
  const int last = *std::max_element(nodes.begin(), nodes.end());
  f.fused.op = OpKind::kOnnxLayerNormalization;
  f.fused.name = g.nodes()[static_cast<size_t>(last)].name;
  const std::string fused_name = f.fused.name;
  gamma = gamma >= 0 ? as_last_axis_weight(g, gamma) : filled_weight(g, fused_name + ".scale", d_dim, 1.0f);
  f.fused.inputs = {x, gamma};
  if (beta >= 0) f.fused.inputs.push_back(as_last_axis_weight(g, beta));
  f.fused.outputs = {y};
  f.fused.attrs = {{"axis", int64_t{-1}}, {"epsilon", *eps}};
  return f;
}

}  // namespace

StatusOr<bool> FuseLayerNorm::run(ir::Graph& g) {
  return run_anchored_fusions(g, {ir::OpKind::kOnnxReduceMean}, "LayerNorm", match, stats_);
}

}  // namespace k3::passes
