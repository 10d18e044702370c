// fuse-sibling-linears: projections of one input become one Linear over the
// stacked weight, with one output per projection (attr splits, ir/op_table.h).
//
//   x --> Linear(x, Wq) --> q
//    \--> Linear(x, Wk) --> k     ==>   Linear(x, [Wq; Wk; Wv], splits [Nq, Nk, Nv]) --> q, k, v
//     \-> Linear(x, Wv) --> v
//
// Attention's q, k and v projections are the case. At batch-1 decode each is
// a small matrix (k3-base: 320 x 512) that two threads read in microseconds,
// and the fixed costs of a matrix product (a parallel region, each thread's
// streams starting from cold, the activations rounded again for int8) are a
// large part of that; one 960 x 512 matrix pays them once. Prefill gains a
// little too: x is read once for the three. Results are unchanged bit for
// bit: every output element is the same dot product (kernels.h: an
// element's summation order does not depend on the column range).
//
// Guards (each has a must-not-match test in tests/passes/test_fuse_sibling_linears.cc):
//   - the Linears read the same input value and have no splits yet;
//   - each weight is an f32 constant, so the stacked matrix is converted
//     and packed as one by weight-precision and pack-weights, which run
//     after; a weight in another dtype stays as it is;
//   - each weight is read by its Linear only (a weight shared with another
//     node, e.g. tied, would be stored twice);
//   - each weight's rows N_i are a multiple of 16, as splits requires (an
//     output then starts on a panel of the panel layout);
//   - the same attrs (scale, clip) and either all have a bias, each an f32
//     constant read by that Linear only (the biases are stacked too), or
//     none has;
//   - at least two such Linears; at most 64 in one group (the splits rule).
// Outputs keep their value ids and names (tensor dumps and graph outputs
// are unaffected); the fused node takes the first Linear's place in the
// order, which precedes every reader of the others.
#include "passes/fuse_sibling_linears.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "passes/graph_edit.h"

namespace k3::passes {
namespace {

using ir::OpKind;

constexpr size_t kMaxGroup = 64;

bool own_f32_constant(const ir::Graph& g, const std::vector<int>& uses, int id, size_t rank) {
  const ir::Value& v = g.value(id);
  return v.kind == ir::ValueKind::kWeight && v.dtype == ir::DType::kF32 && v.data != nullptr &&
         v.shape.size() == rank && uses[static_cast<size_t>(id)] == 1;
}

// "layers.3.attn.wq", "layers.3.attn.wk" -> "layers.3.attn.wq+wk" (the
// prefix up to the last '.' said once when the names share it).
std::string joined_name(const std::vector<const ir::Node*>& group) {
  const std::string& first = group[0]->name;
  const size_t dot = first.rfind('.');
  const std::string prefix = dot == std::string::npos ? "" : first.substr(0, dot + 1);
  std::string name = first;
  for (size_t i = 1; i < group.size(); ++i) {
    const std::string& other = group[i]->name;
    const bool shared = !prefix.empty() && other.compare(0, prefix.size(), prefix) == 0;
    name += "+" + (shared ? other.substr(prefix.size()) : other);
  }
  return name;
}

// Rows of the constants (each [N_i, ...]) stacked into one new weight.
int stack_weights(ir::Graph& g, const std::vector<int>& ids, const std::string& name) {
  const ir::Value& first = g.value(ids[0]);
  const int64_t row = first.shape.size() == 2 ? first.shape[1] : 1;
  int64_t rows = 0;
  for (int id : ids) rows += g.value(id).shape[0];
  auto data = std::make_shared<std::vector<float>>(static_cast<size_t>(rows * row));
  float* dst = data->data();
  for (int id : ids) {
    const ir::Value& v = g.value(id);
    std::memcpy(dst, v.data, static_cast<size_t>(v.numel()) * 4);
    dst += v.numel();
  }
  std::vector<int64_t> shape{rows};
  if (first.shape.size() == 2) shape.push_back(row);
  const int nid = g.add_weight(name, ir::DType::kF32, shape, data->data());
  g.keep_alive.push_back(data);
  return nid;
}

}  // namespace

StatusOr<bool> FuseSiblingLinears::run(ir::Graph& g) {
  const std::vector<int> uses = count_uses(g);
  // Candidates keyed by what must be equal: input, K, bias or not, scale, clip.
  using Key = std::tuple<int, int64_t, bool, double, double>;
  std::map<Key, std::vector<size_t>> groups;
  for (size_t ni = 0; ni < g.nodes().size(); ++ni) {
    const ir::Node& n = g.nodes()[ni];
    if (n.op != OpKind::kLinear || n.find_attr("splits") != nullptr) continue;
    const int w = n.inputs[1];
    if (!own_f32_constant(g, uses, w, 2) || g.value(w).shape[0] % ir::kPanelRows != 0) continue;
    const bool bias = n.inputs.size() > 2;
    if (bias && !own_f32_constant(g, uses, n.inputs[2], 1)) continue;
    groups[{n.inputs[0], g.value(w).shape[1], bias, n.attr_float("scale", 1.0), n.attr_float("clip", 0.0)}].push_back(
        ni);
  }

  std::vector<bool> keep(g.nodes().size(), true);
  for (auto& [key, members] : groups) {
    if (members.size() < 2) continue;
    ++stats_.matched;
    for (size_t start = 0; start + 1 < members.size(); start += kMaxGroup) {
      const size_t end = std::min(members.size(), start + kMaxGroup);
      if (end - start < 2) break;
      std::vector<const ir::Node*> group;
      std::vector<int> weights, biases, outputs;
      std::vector<int64_t> splits;
      for (size_t i = start; i < end; ++i) {
        const ir::Node& n = g.nodes()[members[i]];
        group.push_back(&n);
        weights.push_back(n.inputs[1]);
        if (n.inputs.size() > 2) biases.push_back(n.inputs[2]);
        outputs.push_back(n.outputs[0]);
        splits.push_back(g.value(n.inputs[1]).shape[0]);
      }
      ir::Node fused;
      fused.op = OpKind::kLinear;
      fused.name = joined_name(group);
      fused.attrs = group[0]->attrs;
      fused.attrs.push_back({"splits", splits});
      const int w = stack_weights(g, weights, fused.name + ".weight");
      fused.inputs = {std::get<0>(key), w};
      if (!biases.empty()) fused.inputs.push_back(stack_weights(g, biases, fused.name + ".bias"));
      fused.outputs = outputs;
      // group points into g's nodes: the writes come last.
      for (size_t i = start + 1; i < end; ++i) keep[members[i]] = false;
      g.mutable_nodes()[members[start]] = std::move(fused);
      ++stats_.applied;
    }
  }
  if (stats_.applied == 0) return false;
  g = compact(g, keep);
  K3_RETURN_IF_ERROR(g.verify().with_context("fuse-sibling-linears"));
  return true;
}

}  // namespace k3::passes
