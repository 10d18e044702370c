// fuse-norm-activation: a LayerNorm / RMSNorm whose output reaches a unary
// activation through layout and broadcast ops only becomes one k3.NormAct
// (the norm with the activation applied to its output), followed by the
// same layout ops.
//
//   x --> LayerNormalization(w, b) | RMSNormalization(w) --> n
//     --> [Expand | Tile | Reshape | Transpose | Unsqueeze | Squeeze | Flatten]*
//     --> Gelu (approximate none | tanh) | Relu | Sigmoid | Tanh --> y
//
//   ==>  x --> k3.NormAct(w, b; norm, activation, axis, epsilon) --> the same
//          layout ops (same shape / perm / axes / repeats inputs) --> y
//
// The activation is commuted above the layout ops: they only move or
// replicate elements, and an elementwise unary f satisfies
// f(layout(t)) = layout(f(t)) for any such op. So the activation runs on the
// un-broadcast tensor (an Expand or Tile after the norm no longer multiplies
// its work) and in the same sweep as the norm; with no layout ops between
// them it is plain norm + activation fusion. This is the case `k3 lint`
// reports as "fusion-blocked" (a LayerNorm output broadcast before a GeLU).
// The activation node's output y keeps its value id: the last layout op (or
// k3.NormAct itself) now produces it and takes the activation's place.
// (ONNX Identity is not listed: the importer drops it.)
//
// Runs after fuse-layer-norm, fuse-rms-norm and fuse-gelu (pipeline.cc): it
// matches the onnx.LayerNormalization / onnx.RMSNormalization / onnx.Gelu
// those produce.
//
// Guards (each has a must-not-match test in
// tests/passes/test_fuse_norm_activation.cc):
//   - the activation is a supported unary op (Gelu, Relu, Sigmoid, Tanh);
//     a chain that ends in any other elementwise op (Add of another tensor,
//     Exp, ...) is left alone (noted when layout ops were passed);
//   - GeLU's approximate attribute is recorded exactly: "none" ->
//     activation "gelu", "tanh" -> activation "gelu_tanh";
//   - every layout op reads the chain in its data input (input 0), and its
//     other inputs (shape, axes, repeats) are constants or values not
//     computed from the norm or the chain;
//   - the norm output and every intermediate of the chain have exactly one
//     reader and are not graph outputs; a LayerNormalization's Mean and
//     InvStdDev outputs, if present, are read by nothing;
//   - the norm's input x is f32.
// A chain that reaches a supported activation but fails a guard is left
// alone and noted in the stats.
#include "passes/fuse_norm_activation.h"

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "passes/onnx_match.h"

namespace k3::passes {
namespace {

using ir::OpKind;

constexpr size_t kMaxChain = 16;

const ir::Node& at(const ir::Graph& g, int i) {
  return g.nodes()[static_cast<size_t>(i)];
}

std::string short_name(OpKind op) {
  const std::string s = ir::op_name(op);
  return s.rfind("onnx.", 0) == 0 ? s.substr(5) : s;
}

bool is_layout(OpKind op) {
  switch (op) {
    case OpKind::kOnnxExpand:
    case OpKind::kOnnxTile:
    case OpKind::kOnnxReshape:
    case OpKind::kOnnxTranspose:
    case OpKind::kOnnxUnsqueeze:
    case OpKind::kOnnxSqueeze:
    case OpKind::kOnnxFlatten:
      return true;
    default:
      return false;
  }
}

bool is_activation(OpKind op) {
  return op == OpKind::kOnnxGelu || op == OpKind::kOnnxRelu || op == OpKind::kOnnxSigmoid || op == OpKind::kOnnxTanh;
}

// Elementwise ops that are not a supported activation: a layout chain that
// ends in one of these is a near miss worth a note.
bool is_other_elementwise(OpKind op) {
  switch (op) {
    case OpKind::kOnnxAdd:
    case OpKind::kOnnxSub:
    case OpKind::kOnnxMul:
    case OpKind::kOnnxDiv:
    case OpKind::kOnnxPow:
    case OpKind::kOnnxMax:
    case OpKind::kOnnxMin:
    case OpKind::kOnnxSqrt:
    case OpKind::kOnnxReciprocal:
    case OpKind::kOnnxNeg:
    case OpKind::kOnnxAbs:
    case OpKind::kOnnxExp:
    case OpKind::kOnnxLog:
    case OpKind::kOnnxErf:
    case OpKind::kOnnxCos:
    case OpKind::kOnnxSin:
    case OpKind::kOnnxFloor:
    case OpKind::kOnnxCeil:
    case OpKind::kOnnxClip:
      return true;
    default:
      return false;
  }
}

// The k3.NormAct activation name of activation node `a`, "" when its
// attributes are not ones we know.
std::string activation_name(const ir::Node& a) {
  switch (a.op) {
    case OpKind::kOnnxGelu: {
      const ir::AttrValue* v = a.find_attr("approximate");
      if (v == nullptr) return "gelu";
      const auto* s = std::get_if<std::string>(v);
      if (s == nullptr) return "";
      if (*s == "none") return "gelu";
      if (*s == "tanh") return "gelu_tanh";
      return "";
    }
    case OpKind::kOnnxRelu:
      return "relu";
    case OpKind::kOnnxSigmoid:
      return "sigmoid";
    case OpKind::kOnnxTanh:
      return "tanh";
    default:
      return "";
  }
}

// Whether `value` is computed (through any path of producers) by one of the
// nodes in `matched`. Weights and graph inputs are not.
bool computed_from(const ir::Graph& g, int value, const std::vector<int>& matched) {
  std::vector<int> stack = {value};
  std::vector<bool> seen(g.nodes().size(), false);
  while (!stack.empty()) {
    const int v = stack.back();
    stack.pop_back();
    if (v < 0) continue;
    const int p = g.value(v).producer;
    if (p < 0 || seen[static_cast<size_t>(p)]) continue;
    if (std::find(matched.begin(), matched.end(), p) != matched.end()) return true;
    seen[static_cast<size_t>(p)] = true;
    for (int in : at(g, p).inputs) stack.push_back(in);
  }
  return false;
}

// A copy of value `id` as a fresh activation named `name` (no producer yet).
int fresh_value(ir::Graph& g, int id, const std::string& name) {
  ir::Value v = g.value(id);  // a copy: add_value may reallocate the table
  v.name = name;
  v.kind = ir::ValueKind::kActivation;
  v.producer = -1;
  v.is_output = false;
  v.data = nullptr;
  return g.add_value(std::move(v));
}

// The fusion anchored at norm node `i`; nullopt when there is none, with
// `why` set for a near miss.
std::optional<Fusion> match(ir::Graph& g, const Readers& rd, int i, std::string& why) {
  const ir::Node& norm = at(g, i);
  if (norm.outputs.empty() || norm.inputs.empty() || norm.inputs[0] < 0) return std::nullopt;
  const int n = norm.outputs[0];

  // Walk from n through layout ops (reading the chain as data) to an
  // activation. Reader counts are checked after the walk, so a chain that
  // reaches an activation is diagnosed by its most specific failure.
  std::vector<int> chain;  // layout node indices, norm side first
  int v = n, act = -1;
  while (act < 0) {
    int next = -1;
    for (int r : rd.of(v)) {
      const ir::Node& rn = at(g, r);
      if ((is_layout(rn.op) && !rn.inputs.empty() && rn.inputs[0] == v) ||
          (is_activation(rn.op) && rn.inputs.size() == 1)) {
        next = r;
        break;
      }
    }
    if (next < 0) {
      // A layout chain that ends in another elementwise op is the near miss
      // worth reporting (a norm read directly by a MatMul or Add is not).
      if (!chain.empty()) {
        for (int r : rd.of(v))
          if (is_other_elementwise(at(g, r).op)) {
            why = g.value(v).name + " is read by " + short_name(at(g, r).op) +
                  ", not a unary activation (Gelu, Relu, Sigmoid, Tanh)";
            break;
          }
      }
      return std::nullopt;
    }
    if (is_activation(at(g, next).op)) {
      act = next;
    } else {
      if (chain.size() >= kMaxChain) return std::nullopt;
      chain.push_back(next);
      v = at(g, next).outputs[0];
    }
  }
  const ir::Node& a = at(g, act);
  auto fail = [&](std::string msg) -> std::optional<Fusion> {
    why = std::move(msg);
    return std::nullopt;
  };

  const std::string act_name = activation_name(a);
  if (act_name.empty()) return fail(short_name(a.op) + " " + a.name + " has attributes k3.NormAct does not know");

  std::vector<int> matched = {i};
  matched.insert(matched.end(), chain.begin(), chain.end());
  for (int l : chain) {
    const ir::Node& ln = at(g, l);
    for (size_t k = 1; k < ln.inputs.size(); ++k)
      if (computed_from(g, ln.inputs[k], matched))
        return fail("input " + std::to_string(k) + " of " + short_name(ln.op) + " " + ln.name +
                    " (shape/axes/repeats) is computed from the norm output");
  }

  // Single readers: n and each layout output up to the activation.
  std::vector<int> inner = {n};
  for (int l : chain) inner.push_back(at(g, l).outputs[0]);
  for (int val : inner) {
    if (rd.is_output(val)) return fail(g.value(val).name + " is a graph output");
    if (rd.of(val).size() != 1)
      return fail(g.value(val).name + " has " + std::to_string(rd.of(val).size()) + " readers, not one");
  }
  for (size_t k = 1; k < norm.outputs.size(); ++k) {
    const int extra = norm.outputs[k];
    if (extra >= 0 && (rd.is_output(extra) || !rd.of(extra).empty()))
      return fail("the norm's output " + std::to_string(k) + " (" + g.value(extra).name + ") is used");
  }
  if (!is_f32(g, norm.inputs[0]))
    return fail("x is " + std::string(ir::dtype_name(g.value(norm.inputs[0]).dtype)) + ", not f32");

  // The rewrite: k3.NormAct, then copies of the layout ops on fresh values;
  // the last of them produces y.
  const int y = a.outputs[0];
  std::vector<ir::Node> seq;
  std::vector<int> norm_in = norm.inputs;
  while (norm_in.size() > 2 && norm_in.back() < 0) norm_in.pop_back();
  const bool layer = norm.op == OpKind::kOnnxLayerNormalization;
  const std::string norm_name = norm.name, act_node_name = a.name;
  const int64_t axis = norm.attr_int("axis", -1);
  const double eps = norm.attr_float("epsilon", 1e-5);
  std::vector<ir::Node> layouts;
  for (int l : chain) layouts.push_back(at(g, l));
  const int na = chain.empty() ? y : fresh_value(g, n, norm_name + "/norm_act");
  seq.push_back(ir::Node{
      OpKind::kK3NormAct,
      chain.empty() ? act_node_name : norm_name,
      norm_in,
      {na},
      {{"norm", std::string(layer ? "layer" : "rms")}, {"activation", act_name}, {"axis", axis}, {"epsilon", eps}}});
  int cur = na;
  for (size_t k = 0; k < layouts.size(); ++k) {
    ir::Node ln = layouts[k];
    const bool last = k + 1 == layouts.size();
    const int out = last ? y : fresh_value(g, ln.outputs[0], ln.name + "/act");
    ln.inputs[0] = cur;
    ln.outputs = {out};
    seq.push_back(std::move(ln));
    cur = out;
  }
  Fusion f;
  f.nodes = matched;
  f.nodes.push_back(act);
  f.fused = std::move(seq.back());
  seq.pop_back();
  f.before = std::move(seq);
  if (!chain.empty())
    why = "activation " + act_name + " moved above " + std::to_string(chain.size()) + " layout op" +
          (chain.size() == 1 ? "" : "s");
  return f;
}

}  // namespace

StatusOr<bool> FuseNormActivation::run(ir::Graph& g) {
  return run_anchored_fusions(g, {OpKind::kOnnxLayerNormalization, OpKind::kOnnxRMSNormalization}, "norm-activation",
                              match, stats_);
}

}  // namespace k3::passes
