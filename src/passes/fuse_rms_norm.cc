// fuse-rms-norm: folds the primitive-op RMSNorm that PyTorch's exporters
// write for a hand-written RMSNorm (k3ref's Norm with norm_type rmsnorm)
// into one onnx.RMSNormalization(x, scale; axis=-1, epsilon=eps) (the
// opset-23 op).
//
//   x --+--> Pow(x, 2) | Mul(x, x) --> ReduceMean(last axis) --> ms
//       |                                                         |
//       |                              Add(ms, eps) --> Sqrt --> std
//       |                                                         |
//       +--> Div(x, std) <----------------------------------------+
//        or  Mul(x, Reciprocal(std))  (either order)
//              |
//           [Mul(., scale)]  (either order)
//              |
//              y   (any readers, may be an output)
//
// Without the Mul by a weight the scale is a new [D] weight of ones. The
// fused node takes the place of the last matched node. x may have other
// readers (the residual stream).
//
// Guards (each has a must-not-match test in tests/passes/test_fuse_rms_norm.cc):
//   - the ReduceMean reduces exactly the last axis (attribute or constant
//     axes input) with keepdims=1;
//   - x is f32 and its last dim D is known;
//   - the Pow exponent is a constant 2 (or the square is Mul(x, x));
//   - eps is a constant holding one number (rank <= rank of x);
//   - the scale is an f32 constant weight of shape [D] or [1, ..., 1, D]; a
//     Mul by a weight of another shape ends the match before it (noted);
//   - every intermediate (the square, ms, ms+eps, std, 1/std, and the
//     normalized x when the scale Mul is matched) is read only by the next
//     matched node and is not a graph output.
// A square feeding a ReduceMean that then fails a guard is left alone and
// noted in the stats.
#include "passes/fuse_rms_norm.h"

#include <algorithm>

#include "passes/onnx_match.h"

namespace k3::passes {
namespace {

using ir::OpKind;

const ir::Node& at(const ir::Graph& g, int i) {
  return g.nodes()[static_cast<size_t>(i)];
}

// Matches the pattern anchored at ReduceMean node `i`; nullopt when it does
// not, with `why` set when it started like an RMSNorm.
std::optional<Fusion> match(ir::Graph& g, const Readers& rd, int i, std::string& why) {
  const ir::Node& rm = at(g, i);
  if (rm.op != OpKind::kOnnxReduceMean || rm.inputs.empty() || rm.outputs.empty()) return std::nullopt;
  // Anchor: the mean of a square of x.
  const int sq_v = rm.inputs[0];
  const int sq_i = g.value(sq_v).producer;
  if (sq_i < 0) return std::nullopt;
  const ir::Node& sq = at(g, sq_i);
  if (sq.inputs.size() != 2) return std::nullopt;
  const int x = sq.inputs[0];
  const bool is_mul = sq.op == OpKind::kOnnxMul && sq.inputs[1] == x;
  if (!is_mul && sq.op != OpKind::kOnnxPow) return std::nullopt;

  std::string axis_why;
  if (!reduces_last_axis(g, rm, axis_why)) return why = axis_why, std::nullopt;
  if (!is_f32(g, x)) return why = "x is " + std::string(ir::dtype_name(g.value(x).dtype)) + ", not f32", std::nullopt;
  const std::vector<int64_t>& xs = g.value(x).shape;
  if (xs.empty() || xs.back() < 0) return why = "the last dim of x is not known", std::nullopt;
  const int64_t d_dim = xs.back();
  const size_t rank = xs.size();
  if (!is_mul) {
    const auto e = constant_scalar(g, sq.inputs[1], rank);
    if (!e || *e != 2.0) return why = "Pow exponent is not a constant 2", std::nullopt;
  }
  if (!rd.single(sq_v)) return why = "the square has other readers", std::nullopt;

  const int ms = rm.outputs[0];
  const int add_i = rd.only_reader(ms);
  if (add_i < 0 || at(g, add_i).op != OpKind::kOnnxAdd)
    return why = "the mean square is not read by one Add only", std::nullopt;
  const auto eps = constant_scalar(g, other_input(at(g, add_i), ms), rank);
  if (!eps) return why = "eps is not a constant scalar", std::nullopt;
  const int sqrt_i = rd.only_reader(at(g, add_i).outputs[0]);
  if (sqrt_i < 0 || at(g, sqrt_i).op != OpKind::kOnnxSqrt)
    return why = "ms + eps is not read by one Sqrt only", std::nullopt;
  const int std_v = at(g, sqrt_i).outputs[0];
  const int norm_i = rd.only_reader(std_v);
  if (norm_i < 0) return why = "the root mean square is not read by one node only", std::nullopt;

  std::vector<int> nodes = {sq_i, i, add_i, sqrt_i};
  int y = -1;
  const ir::Node& nn = at(g, norm_i);
  if (nn.op == OpKind::kOnnxDiv && nn.inputs.size() == 2 && nn.inputs[0] == x && nn.inputs[1] == std_v) {
    nodes.push_back(norm_i);
    y = nn.outputs[0];
  } else if (nn.op == OpKind::kOnnxReciprocal) {
    const int inv = nn.outputs[0];
    const int mul_i = rd.only_reader(inv);
    if (mul_i < 0 || at(g, mul_i).op != OpKind::kOnnxMul || other_input(at(g, mul_i), inv) != x)
      return why = "1 / rms is not read by one Mul(x, .) only", std::nullopt;
    nodes.push_back(norm_i);
    nodes.push_back(mul_i);
    y = at(g, mul_i).outputs[0];
  } else {
    return why = "the root mean square is read by " + nn.name + ", not Div(x, .) or Reciprocal", std::nullopt;
  }

  // Optional Mul by the scale.
  int scale = -1;
  const int r = rd.only_reader(y);
  if (r >= 0 && at(g, r).op == OpKind::kOnnxMul) {
    const int w = other_input(at(g, r), y);
    std::string wwhy;
    if (w >= 0 && w != y && g.value(w).kind == ir::ValueKind::kWeight) {
      if (is_last_axis_weight(g, w, d_dim, rank, wwhy)) {
        scale = w;
        nodes.push_back(r);
        y = at(g, r).outputs[0];
      } else {
        why = "fused without " + at(g, r).name + ": " + wwhy;
      }
    }
  }

  Fusion f;
  f.nodes = nodes;
  const int last = *std::max_element(nodes.begin(), nodes.end());
  f.fused.op = OpKind::kOnnxRMSNormalization;
  f.fused.name = at(g, last).name;
  const std::string fused_name = f.fused.name;
  scale = scale >= 0 ? as_last_axis_weight(g, scale) : filled_weight(g, fused_name + ".scale", d_dim, 1.0f);
  f.fused.inputs = {x, scale};
  f.fused.outputs = {y};
  f.fused.attrs = {{"axis", int64_t{-1}}, {"epsilon", *eps}};
  return f;
}

}  // namespace

StatusOr<bool> FuseRmsNorm::run(ir::Graph& g) {
  return run_anchored_fusions(g, {ir::OpKind::kOnnxReduceMean}, "RMSNorm", match, stats_);
}

}  // namespace k3::passes
