// The `k3 lint` rules. Each rule is one function `rule_<id>(ctx, out)`
// registered in kRules at the bottom; shared analyses (producers/consumers,
// the "is constant" analysis, LayerNorm and GeLU pattern matchers) are
// computed once in LintContext.
#include "frontend/onnx/lint.h"

#include <onnx/defs/schema.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

#include "frontend/onnx/supported_ops.h"

namespace k3::onnxfe {
namespace {

using ::onnx::GraphProto;
using ::onnx::NodeProto;

std::string qname(std::string_view name) {
  return "'" + printable(name) + "'";
}

std::string bytes_text(uint64_t b) {
  char buf[64];
  if (b >= (uint64_t{1} << 30))
    std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(b) / (1 << 30));
  else if (b >= (uint64_t{1} << 20))
    std::snprintf(buf, sizeof buf, "%.2f MiB", static_cast<double>(b) / (1 << 20));
  else if (b >= (uint64_t{1} << 10))
    std::snprintf(buf, sizeof buf, "%.2f KiB", static_cast<double>(b) / (1 << 10));
  else
    std::snprintf(buf, sizeof buf, "%llu bytes", static_cast<unsigned long long>(b));
  return buf;
}

std::string number_text(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

// Is the rank of a tensor known? Non-tensor values (sequences, maps) have
// no rank; the rules that care treat them as known.
enum class RankState : uint8_t { kKnown, kUnknown, kNotTensor };

// One LayerNorm: the node that produces its final output (the
// LayerNormalization node, or the last of Div [-> Mul gamma] [-> Add beta]).
struct LayerNormMatch {
  int last_node = -1;
  std::string output;
};

// A constant of a GeLU pattern and the value it should have.
struct GeluConstant {
  std::string tensor;
  double expected = 0;
  std::string expected_text;
};

// One GeLU: a Gelu node, or the Erf pattern
//   x / sqrt(2) (or x * 1/sqrt(2)) -> Erf -> + 1 -> * x -> * 0.5 (any order of the two Muls).
struct GeluMatch {
  int anchor = -1;                      // the Gelu or Erf node (findings attach here)
  std::string input;                    // x
  std::set<int> input_consumers;        // pattern nodes that read x
  std::vector<GeluConstant> constants;  // empty for a Gelu node
};

class LintContext {
 public:
  explicit LintContext(const OnnxModel& m) : model(m), g(m.graph()) {
    for (const auto& t : g.initializer()) initializers.insert(t.name());
    for (const auto& in : g.input())
      if (!initializers.count(in.name())) graph_inputs.insert(in.name());
    for (const auto& out : g.output()) graph_outputs.insert(out.name());
    for (int i = 0; i < g.node_size(); ++i) {
      const NodeProto& n = g.node(i);
      for (const std::string& in : n.input())
        if (!in.empty()) {
          consumers[in].push_back(i);
          used.insert(in);
        }
      for (const std::string& out : n.output())
        if (!out.empty()) producer[out] = i;
      for (const auto& a : n.attribute()) {
        if (a.has_g()) collect_subgraph_uses(a.g(), 0);
        for (const auto& sub : a.graphs()) collect_subgraph_uses(sub, 0);
      }
    }
    analyze_constants();
    match_layer_norms();
    match_gelus();
  }

  const OnnxModel& model;
  const GraphProto& g;
  std::unordered_set<std::string> initializers;
  std::unordered_set<std::string> graph_inputs;  // excluding initializers
  std::unordered_set<std::string> graph_outputs;
  std::unordered_map<std::string, int> producer;
  std::unordered_map<std::string, std::vector<int>> consumers;  // top-level graph only
  std::unordered_set<std::string> used;                         // read by any node, subgraphs included
  std::vector<LayerNormMatch> layer_norms;
  std::vector<GeluMatch> gelus;

  static bool is_op(const NodeProto& n, std::string_view op) {
    return n.op_type() == op && is_default_onnx_domain(n.domain());
  }

  // Name for findings: the node's name, or its first output's when unnamed
  // (PyTorch names nodes, hand-built graphs often do not).
  std::string label(int i) const {
    const NodeProto& n = g.node(i);
    if (!n.name().empty()) return n.name();
    if (n.output_size() > 0 && !n.output(0).empty()) return n.output(0);
    return "#" + std::to_string(i);
  }

  const NodeProto* producer_of(const std::string& tensor) const {
    auto it = producer.find(tensor);
    return it == producer.end() ? nullptr : &g.node(it->second);
  }
  int producer_index(const std::string& tensor) const {
    auto it = producer.find(tensor);
    return it == producer.end() ? -1 : it->second;
  }
  // Readers of a tensor, counting a graph output as one more reader.
  size_t reader_count(const std::string& tensor) const {
    auto it = consumers.find(tensor);
    return (it == consumers.end() ? 0 : it->second.size()) + (graph_outputs.count(tensor) ? 1 : 0);
  }
  // The only node reading the tensor, or -1.
  int sole_consumer(const std::string& tensor) const {
    if (reader_count(tensor) != 1) return -1;
    auto it = consumers.find(tensor);
    return it == consumers.end() ? -1 : it->second[0];
  }

  bool is_const(const std::string& tensor) const {
    if (tensor.empty()) return true;  // omitted optional input
    auto it = constant.find(tensor);
    return it != constant.end() && it->second;
  }
  // Where a run-time tensor's value comes from ("graph input 'x'").
  std::string origin_of(const std::string& tensor) const {
    auto it = origin.find(tensor);
    return it == origin.end() ? "a run-time value" : it->second;
  }

  RankState rank_state(const std::string& tensor) const {
    if (initializers.count(tensor)) return RankState::kKnown;
    const ::onnx::TypeProto* t = model.find_type(tensor);
    if (t == nullptr) return RankState::kUnknown;
    if (t->has_tensor_type()) return t->tensor_type().has_shape() ? RankState::kKnown : RankState::kUnknown;
    if (t->has_sparse_tensor_type())
      return t->sparse_tensor_type().has_shape() ? RankState::kKnown : RankState::kUnknown;
    if (t->value_case() == ::onnx::TypeProto::VALUE_NOT_SET) return RankState::kUnknown;
    return RankState::kNotTensor;
  }

  // Static dims of a tensor, nullopt if the rank or any dim is unknown.
  std::optional<std::vector<int64_t>> static_shape(const std::string& tensor) const {
    if (const auto* init = model.find_initializer(tensor))
      return std::vector<int64_t>(init->dims().begin(), init->dims().end());
    const ::onnx::TypeProto* t = model.find_type(tensor);
    if (t == nullptr || !t->has_tensor_type() || !t->tensor_type().has_shape()) return std::nullopt;
    std::vector<int64_t> dims;
    for (const auto& d : t->tensor_type().shape().dim()) {
      if (!d.has_dim_value()) return std::nullopt;
      dims.push_back(d.dim_value());
    }
    return dims;
  }

  // Value and ONNX data type of a one-element constant (initializer or
  // Constant node output); nullopt when the tensor is not directly a
  // constant or has more elements.
  struct Scalar {
    double value;
    int32_t data_type;
  };
  std::optional<Scalar> scalar(const std::string& tensor) const {
    const ::onnx::TensorProto* t = model.find_initializer(tensor);
    if (t == nullptr) {
      const NodeProto* p = producer_of(tensor);
      if (p == nullptr || !is_op(*p, "Constant")) return std::nullopt;
      for (const auto& a : p->attribute()) {
        if (a.name() == "value" && a.has_t()) t = &a.t();
        if (a.name() == "value_float" && a.has_f()) return Scalar{a.f(), ::onnx::TensorProto::FLOAT};
        if (a.name() == "value_int" && a.has_i()) return Scalar{static_cast<double>(a.i()), ::onnx::TensorProto::INT64};
      }
      if (t == nullptr) return std::nullopt;
    }
    auto v = tensor_values(*t, 1);
    if (!v || v->size() != 1) return std::nullopt;
    return Scalar{(*v)[0], t->data_type()};
  }

  // For a binary node with `tensor` as one input, the other input ("" if none).
  static std::string other_input(const NodeProto& n, const std::string& tensor) {
    if (n.input_size() != 2) return "";
    if (n.input(0) == tensor) return n.input(1);
    if (n.input(1) == tensor) return n.input(0);
    return "";
  }

 private:
  std::unordered_map<std::string, bool> constant;
  std::unordered_map<std::string, std::string> origin;

  // Random ops give a new value per run even from constant inputs.
  static bool is_random(const NodeProto& n) {
    return n.op_type().rfind("Random", 0) == 0 || n.op_type() == "Multinomial" || n.op_type() == "Bernoulli";
  }

  // Outer-scope names read inside If/Loop/Scan bodies keep initializers used.
  void collect_subgraph_uses(const GraphProto& sub, int depth) {
    if (depth > 32) return;  // nesting this deep is adversarial; the If/Loop is an error anyway
    for (const auto& n : sub.node()) {
      for (const std::string& in : n.input())
        if (!in.empty()) used.insert(in);
      for (const auto& a : n.attribute()) {
        if (a.has_g()) collect_subgraph_uses(a.g(), depth + 1);
        for (const auto& s : a.graphs()) collect_subgraph_uses(s, depth + 1);
      }
    }
  }

  // A tensor is constant if it is an initializer, a Constant node's output,
  // or the output of a deterministic node whose inputs are all constant;
  // Shape/Size of a tensor is constant when the dims it reads are static.
  // One pass suffices: the loader checked topological order.
  void analyze_constants() {
    for (const auto& t : g.initializer()) constant[t.name()] = true;
    for (const auto& in : g.input())
      if (!initializers.count(in.name())) {
        constant[in.name()] = false;
        origin[in.name()] = "graph input " + qname(in.name());
      }
    for (int i = 0; i < g.node_size(); ++i) {
      const NodeProto& n = g.node(i);
      bool c = false;
      std::string why;
      const auto info = find_onnx_op(n.domain(), n.op_type());
      const bool has_subgraph = std::any_of(n.attribute().begin(), n.attribute().end(),
                                            [](const auto& a) { return a.has_g() || a.graphs_size() > 0; });
      if (is_op(n, "Constant")) {
        c = true;
      } else if ((is_op(n, "Shape") || is_op(n, "Size")) && n.input_size() >= 1) {
        c = shape_input_static(n);
        if (!c) why = n.op_type() + " of " + qname(n.input(0)) + " (shape not static)";
      } else if (info == nullptr || has_subgraph || is_random(n)) {
        why = n.op_type() + " " + qname(label(i));
      } else {
        c = true;
        bool any_input = false;
        for (const std::string& in : n.input()) {
          if (in.empty()) continue;
          any_input = true;
          if (!is_const(in)) {
            c = false;
            why = origin_of(in);
            break;
          }
        }
        if (!any_input) {  // no inputs and not Constant: nothing to fold from
          c = false;
          why = n.op_type() + " " + qname(label(i));
        }
      }
      for (const std::string& out : n.output()) {
        if (out.empty()) continue;
        constant[out] = c;
        if (!c) origin[out] = why;
      }
    }
  }

  // Shape (opset 15 start/end attributes included) or Size reads only the
  // dims it selects; those must be static.
  bool shape_input_static(const NodeProto& n) const {
    const std::string& in = n.input(0);
    if (model.find_initializer(in) != nullptr) return true;
    if (is_op(n, "Size")) return static_shape(in).has_value();
    const ::onnx::TypeProto* t = model.find_type(in);
    if (t == nullptr || !t->has_tensor_type() || !t->tensor_type().has_shape()) return false;
    const auto& dims = t->tensor_type().shape().dim();
    const int64_t rank = dims.size();
    int64_t start = 0, end = rank;
    for (const auto& a : n.attribute()) {
      if (a.name() == "start") start = a.i();
      if (a.name() == "end") end = a.i();
    }
    if (start < 0) start += rank;
    if (end < 0) end += rank;
    start = std::clamp<int64_t>(start, 0, rank);
    end = std::clamp<int64_t>(end, 0, rank);
    for (int64_t d = start; d < end; ++d)
      if (!dims[static_cast<int>(d)].has_dim_value()) return false;
    return true;
  }

  void match_layer_norms() {
    for (int i = 0; i < g.node_size(); ++i) {
      const NodeProto& n = g.node(i);
      if (is_op(n, "LayerNormalization") && n.output_size() >= 1) {
        layer_norms.push_back({i, n.output(0)});
        continue;
      }
      // (x - mean(x)) / sqrt(var + eps): Div(Sub(x, ReduceMean(x)), Sqrt(...)).
      if (!is_op(n, "Div") || n.input_size() != 2 || n.output_size() < 1) continue;
      const NodeProto* sub = producer_of(n.input(0));
      const NodeProto* sqrt = producer_of(n.input(1));
      if (sub == nullptr || sqrt == nullptr || !is_op(*sub, "Sub") || !is_op(*sqrt, "Sqrt") || sub->input_size() != 2)
        continue;
      const NodeProto* mean = producer_of(sub->input(1));
      if (mean == nullptr || !is_op(*mean, "ReduceMean") || mean->input_size() < 1 || mean->input(0) != sub->input(0))
        continue;
      LayerNormMatch m{i, n.output(0)};
      // Optional affine part: * gamma, then + beta, each with a constant operand.
      for (std::string_view op : {"Mul", "Add"}) {
        const int c = sole_consumer(m.output);
        if (c < 0 || !is_op(g.node(c), op) || g.node(c).output_size() < 1) break;
        const std::string other = other_input(g.node(c), m.output);
        if (other.empty() || !is_const(other)) break;
        m = {c, g.node(c).output(0)};
      }
      layer_norms.push_back(m);
    }
  }

  void match_gelus() {
    const double kSqrt2 = std::sqrt(2.0);
    for (int i = 0; i < g.node_size(); ++i) {
      const NodeProto& n = g.node(i);
      if (n.op_type() == "Gelu" && (is_default_onnx_domain(n.domain()) || n.domain() == "com.microsoft") &&
          n.input_size() >= 1) {
        gelus.push_back({i, n.input(0), {i}, {}});
        continue;
      }
      if (!is_op(n, "Erf") || n.input_size() != 1 || n.output_size() != 1) continue;
      // Erf's input: x / c or x * c with c constant.
      const int pi = producer_index(n.input(0));
      if (pi < 0) continue;
      const NodeProto& p = g.node(pi);
      if (p.input_size() != 2 || !(is_op(p, "Div") || is_op(p, "Mul"))) continue;
      GeluMatch m;
      m.anchor = i;
      if (is_op(p, "Div")) {
        if (!is_const(p.input(1)) || is_const(p.input(0))) continue;
        m.input = p.input(0);
        m.constants.push_back({p.input(1), kSqrt2, "sqrt(2) = 1.41421"});
      } else {
        const bool c0 = is_const(p.input(0)), c1 = is_const(p.input(1));
        if (c0 == c1) continue;
        m.input = c1 ? p.input(0) : p.input(1);
        m.constants.push_back({c1 ? p.input(1) : p.input(0), 1 / kSqrt2, "1/sqrt(2) = 0.707107"});
      }
      m.input_consumers.insert(pi);
      // Erf -> Add(1).
      const int ai = sole_consumer(n.output(0));
      if (ai < 0 || !is_op(g.node(ai), "Add") || g.node(ai).output_size() < 1) continue;
      const std::string& add_out = g.node(ai).output(0);
      const std::string one = other_input(g.node(ai), n.output(0));
      if (one.empty() || !is_const(one)) continue;
      m.constants.push_back({one, 1.0, "1"});
      // The two Muls, in any of PyTorch's orders:
      //   (x * add) * 0.5,  (x * 0.5) * add,  x * (add * 0.5).
      const int m1 = sole_consumer(add_out);
      if (m1 < 0 || !is_op(g.node(m1), "Mul") || g.node(m1).output_size() < 1) continue;
      const std::string other = other_input(g.node(m1), add_out);
      std::string half;
      if (other == m.input) {
        const int m2 = sole_consumer(g.node(m1).output(0));
        if (m2 < 0 || !is_op(g.node(m2), "Mul")) continue;
        half = other_input(g.node(m2), g.node(m1).output(0));
        m.input_consumers.insert(m1);
      } else if (const int hi = producer_index(other);
                 hi >= 0 && is_op(g.node(hi), "Mul") && !other_input(g.node(hi), m.input).empty()) {
        half = other_input(g.node(hi), m.input);
        m.input_consumers.insert(hi);
      } else if (is_const(other)) {
        const int m2 = sole_consumer(g.node(m1).output(0));
        if (m2 < 0 || !is_op(g.node(m2), "Mul") || other_input(g.node(m2), g.node(m1).output(0)) != m.input) continue;
        half = other;
        m.input_consumers.insert(m2);
      } else {
        continue;
      }
      if (half.empty() || !is_const(half)) continue;
      m.constants.push_back({half, 0.5, "0.5"});
      gelus.push_back(std::move(m));
    }
  }
};

// A GeLU constant that is present but wrong: "constant 'c' is 1.5 (expected ...)".
// Empty when it matches or its value cannot be read (folded from other
// constants): the lint does not guess.
std::string constant_mismatch(const LintContext& ctx, const GeluConstant& c) {
  auto v = ctx.scalar(c.tensor);
  if (!v) {
    const ::onnx::TensorProto* t = ctx.model.find_initializer(c.tensor);
    auto numel = t ? tensor_numel(*t) : std::nullopt;
    if (numel && *numel != 1)
      return "constant " + qname(c.tensor) + " has " + std::to_string(*numel) + " elements (expected scalar " +
             c.expected_text + ")";
    return "";
  }
  // Half-precision exports round sqrt(2) to 1.4140625; that is a match.
  const double tolerance = v->data_type == ::onnx::TensorProto::BFLOAT16  ? 4e-3
                           : v->data_type == ::onnx::TensorProto::FLOAT16 ? 1e-3
                                                                          : 1e-4;
  if (std::fabs(v->value - c.expected) <= tolerance * std::max(1.0, std::fabs(c.expected))) return "";
  return "constant " + qname(c.tensor) + " is " + number_text(v->value) + " (expected " + c.expected_text + ")";
}

bool gelu_constants_ok(const LintContext& ctx, const GeluMatch& m) {
  return std::all_of(m.constants.begin(), m.constants.end(),
                     [&](const GeluConstant& c) { return constant_mismatch(ctx, c).empty(); });
}

void add(std::vector<Finding>& out, Severity s, const char* rule, std::string node, std::string op,
         std::string reason) {
  out.push_back({s, rule, std::move(node), std::move(op), std::move(reason)});
}

void add_node(std::vector<Finding>& out, const LintContext& ctx, int i, Severity s, const char* rule,
              std::string reason) {
  add(out, s, rule, ctx.label(i), ctx.g.node(i).op_type(), std::move(reason));
}

// ---- Rules ---------------------------------------------------------------

void rule_control_flow(const LintContext& ctx, std::vector<Finding>& out) {
  for (int i = 0; i < ctx.g.node_size(); ++i) {
    const NodeProto& n = ctx.g.node(i);
    if (LintContext::is_op(n, "If") || LintContext::is_op(n, "Loop") || LintContext::is_op(n, "Scan"))
      add_node(out, ctx, i, Severity::kError, "control-flow",
               "control flow cannot be compiled ahead of time; export with the " +
                   std::string(n.op_type() == "If" ? "branch resolved" : "loop unrolled") + " (static graph)");
  }
}

// Inputs that decide an op's output shape, by op.
struct ShapeInputs {
  std::string_view op;
  std::vector<std::pair<int, std::string_view>> inputs;  // index, role
};

void rule_data_dependent_shape(const LintContext& ctx, std::vector<Finding>& out) {
  static const ShapeInputs kShapeInputs[] = {
      {"Reshape", {{1, "shape"}}},
      {"Expand", {{1, "shape"}}},
      {"Tile", {{1, "repeats"}}},
      {"ConstantOfShape", {{0, "shape"}}},
      {"Range", {{0, "start"}, {1, "limit"}, {2, "delta"}}},
      {"Slice", {{1, "starts"}, {2, "ends"}, {3, "axes"}, {4, "steps"}}},
      {"TopK", {{1, "k"}}},
  };
  for (int i = 0; i < ctx.g.node_size(); ++i) {
    const NodeProto& n = ctx.g.node(i);
    if (LintContext::is_op(n, "NonZero")) {
      add_node(out, ctx, i, Severity::kError, "data-dependent-shape",
               "output shape depends on tensor values (e.g. torch.nonzero or boolean-mask indexing); K3 needs static "
               "shapes");
      continue;
    }
    for (const ShapeInputs& si : kShapeInputs) {
      if (!LintContext::is_op(n, si.op)) continue;
      std::string roles, origin;
      for (const auto& [index, role] : si.inputs) {
        if (index >= n.input_size() || ctx.is_const(n.input(index))) continue;
        roles += (roles.empty() ? "" : ", ") + std::string(role) + " " + qname(n.input(index));
        if (origin.empty()) origin = ctx.origin_of(n.input(index));
      }
      if (roles.empty()) break;
      // If shape inference proved every output static, the values are fixed
      // in practice (e.g. computed from static shapes the analysis could not
      // fold); the importer can use the inferred shape.
      bool outputs_static = n.output_size() > 0;
      for (const std::string& o : n.output())
        if (!o.empty() && !ctx.static_shape(o)) outputs_static = false;
      if (outputs_static) break;
      add_node(out, ctx, i, Severity::kWarning, "data-dependent-shape",
               roles + " computed at run time (from " + origin + "), so the output shape is not static");
      break;
    }
  }
}

void rule_unknown_rank(const LintContext& ctx, std::vector<Finding>& out) {
  // Report where unknown ranks start, not every tensor they spread to.
  std::unordered_set<std::string> unknown;
  for (const auto& in : ctx.g.input())
    if (ctx.graph_inputs.count(in.name()) && ctx.rank_state(in.name()) == RankState::kUnknown)
      unknown.insert(in.name());
  for (const auto& n : ctx.g.node())
    for (const std::string& o : n.output())
      if (!o.empty() && ctx.rank_state(o) == RankState::kUnknown) unknown.insert(o);
  // Tensors of unknown rank reachable from `start` through nodes (excluding
  // start). Roots can share a large downstream, so the total walk has a
  // budget; past it, counts are left out rather than making lint quadratic.
  size_t budget = 2'000'000;
  auto downstream = [&](const std::vector<std::string>& start) -> std::optional<size_t> {
    std::unordered_set<std::string> seen(start.begin(), start.end());
    std::vector<std::string> stack = start;
    size_t count = 0;
    while (!stack.empty()) {
      std::string t = std::move(stack.back());
      stack.pop_back();
      auto it = ctx.consumers.find(t);
      if (it == ctx.consumers.end()) continue;
      for (int c : it->second)
        for (const std::string& o : ctx.g.node(c).output()) {
          if (budget == 0) return std::nullopt;
          --budget;
          if (!o.empty() && unknown.count(o) && seen.insert(o).second) {
            ++count;
            stack.push_back(o);
          }
        }
    }
    return count;
  };
  auto tail = [](std::optional<size_t> n) {
    return !n || *n == 0
               ? std::string()
               : "; " + std::to_string(*n) + " tensor" + (*n == 1 ? "" : "s") + " computed from it also unknown";
  };
  for (const auto& in : ctx.g.input())
    if (ctx.graph_inputs.count(in.name()) && unknown.count(in.name()))
      add(out, Severity::kWarning, "unknown-rank", in.name(), "input",
          "graph input has no shape (rank unknown); give it one at export" + tail(downstream({in.name()})));
  for (int i = 0; i < ctx.g.node_size(); ++i) {
    const NodeProto& n = ctx.g.node(i);
    std::vector<std::string> outs;
    for (const std::string& o : n.output())
      if (!o.empty() && unknown.count(o)) outs.push_back(o);
    if (outs.empty()) continue;
    const bool root =
        std::none_of(n.input().begin(), n.input().end(), [&](const std::string& in) { return unknown.count(in) > 0; });
    if (!root) continue;
    add_node(out, ctx, i, Severity::kWarning, "unknown-rank",
             "rank of " + qname(outs[0]) +
                 (outs.size() > 1 ? " (and " + std::to_string(outs.size() - 1) + " more outputs)" : "") +
                 " is unknown after shape inference" + tail(downstream(outs)));
  }
}

void rule_shape_inference(const LintContext& ctx, std::vector<Finding>& out) {
  if (!ctx.model.shape_inference_error().empty())
    add(out, Severity::kWarning, "shape-inference", "", "graph",
        "ONNX shape inference: " + ctx.model.shape_inference_error());
  const auto& ranges = ::onnx::OpSchemaRegistry::DomainToVersionRange::Instance().Map();
  auto it = ranges.find("");
  if (it != ranges.end() && ctx.model.opset() > it->second.second)
    add(out, Severity::kInfo, "shape-inference", "", "graph",
        "model uses opset " + std::to_string(ctx.model.opset()) +
            "; the ONNX library's shape inference knows up to opset " + std::to_string(it->second.second) +
            ", so newer ops get no inferred shapes");
}

void rule_random_access(const LintContext& ctx, std::vector<Finding>& out) {
  for (int i = 0; i < ctx.g.node_size(); ++i) {
    const NodeProto& n = ctx.g.node(i);
    if (!is_default_onnx_domain(n.domain())) continue;
    const std::string& op = n.op_type();
    if (op == "GatherND" || op == "ScatterND" || op == "ScatterElements" || op == "GatherElements" || op == "Scatter") {
      add_node(out, ctx, i, Severity::kWarning, "random-access",
               op + " reads or writes memory at run-time indices (random access, not streaming)");
    } else if (op == "Gather" && n.input_size() >= 2 && !ctx.is_const(n.input(1)) && !ctx.is_const(n.input(0))) {
      add_node(out, ctx, i, Severity::kInfo, "random-access",
               "Gather of run-time indices " + qname(n.input(1)) + " from activation " + qname(n.input(0)) +
                   " (random access; lookups into weights are fine)");
    }
  }
}

void rule_unsupported_op(const LintContext& ctx, std::vector<Finding>& out) {
  for (int i = 0; i < ctx.g.node_size(); ++i) {
    const NodeProto& n = ctx.g.node(i);
    const OnnxOpInfo* info = find_onnx_op(n.domain(), n.op_type());
    if (info == nullptr) {
      const std::string domain = is_default_onnx_domain(n.domain()) ? "" : " from domain " + qname(n.domain());
      add_node(out, ctx, i, Severity::kError, "unsupported-op",
               "op type " + qname(n.op_type()) + domain + " is not known to K3's ONNX importer");
    } else if (info->support == OpSupport::kRecognized && info->reported_by.empty()) {
      add_node(out, ctx, i, Severity::kError, "unsupported-op",
               "recognized but not importable: " + std::string(info->note));
    }
  }
}

void rule_unused_initializer(const LintContext& ctx, std::vector<Finding>& out) {
  std::vector<std::string> names;
  uint64_t bytes = 0;
  bool bytes_exact = true;
  for (const auto& t : ctx.g.initializer()) {
    if (ctx.used.count(t.name()) || ctx.graph_outputs.count(t.name())) continue;
    names.push_back(t.name());
    auto b = tensor_nominal_bytes(t);
    if (b && bytes + *b >= bytes)
      bytes += *b;
    else
      bytes_exact = false;
  }
  if (names.empty()) return;
  constexpr size_t kListed = 8;
  std::string list;
  for (size_t k = 0; k < names.size() && k < kListed; ++k) list += (k ? ", " : "") + qname(names[k]);
  if (names.size() > kListed) list += " and " + std::to_string(names.size() - kListed) + " more";
  add(out, Severity::kWarning, "unused-initializer", "", "graph",
      std::to_string(names.size()) + " initializer" + (names.size() == 1 ? "" : "s") + " (" +
          (bytes_exact ? "" : "at least ") + bytes_text(bytes) + ") read by no node: " + list +
          " (if these are expert weights: indexing experts with a Python int while tracing bakes the traced experts "
          "into the graph)");
}

void rule_dynamic_input_dim(const LintContext& ctx, std::vector<Finding>& out) {
  for (const auto& in : ctx.g.input()) {
    if (!ctx.graph_inputs.count(in.name()) || !in.type().has_tensor_type() || !in.type().tensor_type().has_shape())
      continue;
    std::string dims;
    int k = 0;
    for (const auto& d : in.type().tensor_type().shape().dim()) {
      if (!d.has_dim_value()) {
        dims += (dims.empty() ? "" : ", ") +
                (d.has_dim_param() && !d.dim_param().empty() ? printable(d.dim_param()) : "?") + " (dim " +
                std::to_string(k) + ")";
      }
      ++k;
    }
    if (!dims.empty())
      add(out, Severity::kInfo, "dynamic-input-dim", in.name(), "input",
          "dynamic dims " + dims + "; specialize them with k3 compile --input-shape");
  }
}

// LayerNorm -> GeLU: the fuser needs the norm output to feed the GeLU
// directly and nothing else.
void rule_fusion_blocked(const LintContext& ctx, std::vector<Finding>& out) {
  std::unordered_map<std::string, const LayerNormMatch*> norm_by_output;
  for (const auto& ln : ctx.layer_norms) norm_by_output[ln.output] = &ln;
  static const std::set<std::string_view> kBetween = {"Expand",    "Tile",    "Reshape", "Unsqueeze", "Squeeze",
                                                      "Transpose", "Flatten", "Cast",    "Identity"};
  for (const GeluMatch& gelu : ctx.gelus) {
    if (!gelu_constants_ok(ctx, gelu)) continue;  // gelu-near-miss reports it
    std::vector<int> path;                        // nodes between norm and GeLU, GeLU side first
    std::string cur = gelu.input;
    const LayerNormMatch* ln = nullptr;
    for (int step = 0; step < 8; ++step) {
      auto it = norm_by_output.find(cur);
      if (it != norm_by_output.end()) {
        ln = it->second;
        break;
      }
      const int p = ctx.producer_index(cur);
      if (p < 0) break;
      const NodeProto& pn = ctx.g.node(p);
      if (!is_default_onnx_domain(pn.domain()) || !kBetween.count(pn.op_type()) || pn.input_size() < 1) break;
      path.push_back(p);
      cur = pn.input(0);
    }
    if (ln == nullptr) continue;
    std::vector<std::string> reasons;
    // The first layout op after the norm is the one the finding names.
    int blocker = -1;
    for (auto it = path.rbegin(); it != path.rend() && blocker < 0; ++it)
      if (ctx.g.node(*it).op_type() != "Identity") blocker = *it;
    if (blocker >= 0) {
      const std::string& op = ctx.g.node(blocker).op_type();
      const bool broadcast = op == "Expand" || op == "Tile";
      reasons.push_back(op + " " + qname(ctx.label(blocker)) +
                        (broadcast ? " broadcasts the output of LayerNorm " : " sits between LayerNorm ") +
                        qname(ctx.label(ln->last_node)) + (broadcast ? " before GeLU " : " and GeLU ") +
                        qname(ctx.label(gelu.anchor)));
    }
    if (blocker >= 0 && path.size() > 1) {
      const size_t more = static_cast<size_t>(std::count_if(
          path.begin(), path.end(), [&](int p) { return ctx.g.node(p).op_type() != "Identity" && p != blocker; }));
      if (more > 0) reasons.back() += " (+" + std::to_string(more) + " more layout op" + (more == 1 ? "" : "s") + ")";
    }
    // Readers of the norm output other than the GeLU chain.
    size_t internal = 0;
    if (auto it = ctx.consumers.find(ln->output); it != ctx.consumers.end())
      for (int c : it->second)
        if (path.empty() ? gelu.input_consumers.count(c) > 0 : c == path.back()) ++internal;
    const size_t others = ctx.reader_count(ln->output) - internal;
    if (others > 0)
      reasons.push_back("LayerNorm output " + qname(ln->output) + " has " + std::to_string(others) + " other reader" +
                        (others == 1 ? "" : "s") + " besides GeLU " + qname(ctx.label(gelu.anchor)));
    if (reasons.empty()) continue;
    std::string reason = "LayerNorm→GeLU fusion blocked: ";
    for (size_t k = 0; k < reasons.size(); ++k) reason += (k ? "; " : "") + reasons[k];
    // Layout ops alone do not stop K3 (its fuse-norm-activation pass moves
    // the GeLU above them); another reader of the norm output does.
    if (others == 0) reason += " (k3 compile -O2 and up fuses it anyway: fuse-norm-activation)";
    add_node(out, ctx, blocker >= 0 ? blocker : ln->last_node, Severity::kInfo, "fusion-blocked", reason);
  }
}

void rule_gelu_near_miss(const LintContext& ctx, std::vector<Finding>& out) {
  for (const GeluMatch& gelu : ctx.gelus) {
    std::string misses;
    for (const GeluConstant& c : gelu.constants) {
      std::string m = constant_mismatch(ctx, c);
      if (!m.empty()) misses += (misses.empty() ? "" : "; ") + m;
    }
    if (!misses.empty())
      add_node(out, ctx, gelu.anchor, Severity::kInfo, "gelu-near-miss", "GeLU pattern almost matched: " + misses);
  }
}

struct Rule {
  const char* id;
  void (*run)(const LintContext&, std::vector<Finding>&);
};

// Every rule, in report order within a severity.
constexpr Rule kRules[] = {
    {"control-flow", rule_control_flow},
    {"unsupported-op", rule_unsupported_op},
    {"data-dependent-shape", rule_data_dependent_shape},
    {"shape-inference", rule_shape_inference},
    {"unknown-rank", rule_unknown_rank},
    {"random-access", rule_random_access},
    {"unused-initializer", rule_unused_initializer},
    {"dynamic-input-dim", rule_dynamic_input_dim},
    {"fusion-blocked", rule_fusion_blocked},
    {"gelu-near-miss", rule_gelu_near_miss},
};

}  // namespace

const char* severity_name(Severity s) {
  switch (s) {
    case Severity::kError:
      return "error";
    case Severity::kWarning:
      return "warning";
    case Severity::kInfo:
      return "info";
  }
  return "?";
}

std::vector<Finding> lint_model(const OnnxModel& model) {
  const LintContext ctx(model);
  std::vector<Finding> findings;
  for (const Rule& r : kRules) r.run(ctx, findings);
  std::stable_sort(findings.begin(), findings.end(),
                   [](const Finding& a, const Finding& b) { return a.severity < b.severity; });
  return findings;
}

LintCounts count_findings(const std::vector<Finding>& findings) {
  LintCounts c;
  for (const Finding& f : findings) {
    if (f.severity == Severity::kError) ++c.error;
    if (f.severity == Severity::kWarning) ++c.warning;
    if (f.severity == Severity::kInfo) ++c.info;
  }
  return c;
}

std::string format_findings_text(const std::vector<Finding>& findings) {
  std::string s;
  for (const Finding& f : findings) {
    s += severity_name(f.severity);
    s += " " + printable(f.op_type);
    if (!f.node.empty()) s += " " + printable(f.node);
    s += ": " + f.reason + "\n";
  }
  const LintCounts c = count_findings(findings);
  auto plural = [](int64_t n, const char* word) { return std::to_string(n) + " " + word + (n == 1 ? "" : "s"); };
  s += plural(c.error, "error") + ", " + plural(c.warning, "warning") + ", " + plural(c.info, "info") + "\n";
  return s;
}

std::string format_findings_json(const std::vector<Finding>& findings) {
  // ordered_json: "findings" before "counts", fields in the documented order.
  nlohmann::ordered_json j;
  j["findings"] = nlohmann::ordered_json::array();
  for (const Finding& f : findings)
    j["findings"].push_back({{"severity", severity_name(f.severity)},
                             {"rule", f.rule},
                             {"node", f.node},
                             {"op_type", f.op_type},
                             {"reason", f.reason}});
  const LintCounts c = count_findings(findings);
  j["counts"] = {{"error", c.error}, {"warning", c.warning}, {"info", c.info}};
  // Names come from the file and may not be UTF-8: replace rather than throw.
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

}  // namespace k3::onnxfe
