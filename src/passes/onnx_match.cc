// Pattern-matching helpers shared by the onnx-dialect fusion passes.
#include "passes/onnx_match.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>

#include "passes/graph_edit.h"

namespace k3::passes {

Readers::Readers(const ir::Graph& g) : readers_(g.values().size()), is_output_(g.values().size(), false) {
  const auto& nodes = g.nodes();
  for (size_t i = 0; i < nodes.size(); ++i)
    for (int in : nodes[i].inputs)
      if (in >= 0) readers_[static_cast<size_t>(in)].push_back(static_cast<int>(i));
  for (int out : g.outputs()) is_output_[static_cast<size_t>(out)] = true;
}

const ir::Node* produced_by(const ir::Graph& g, int value, ir::OpKind op) {
  if (value < 0) return nullptr;
  const int p = g.value(value).producer;
  if (p < 0) return nullptr;
  const ir::Node& n = g.nodes()[static_cast<size_t>(p)];
  return n.op == op ? &n : nullptr;
}

int other_input(const ir::Node& n, int value) {
  if (n.inputs.size() != 2) return -1;
  if (n.inputs[0] == value) return n.inputs[1];
  if (n.inputs[1] == value) return n.inputs[0];
  return -1;
}

namespace {

bool known_shape(const ir::Value& v) {
  return std::all_of(v.shape.begin(), v.shape.end(), [](int64_t d) { return d >= 0; });
}

// Element i of a constant of an integer or float dtype, as double.
std::optional<double> element(const ir::Value& v, int64_t i) {
  const char* p = static_cast<const char*>(v.data);
  switch (v.dtype) {
    case ir::DType::kF32: {
      float x;
      std::memcpy(&x, p + 4 * i, 4);
      return x;
    }
    case ir::DType::kF64: {
      double x;
      std::memcpy(&x, p + 8 * i, 8);
      return x;
    }
    case ir::DType::kI32: {
      int32_t x;
      std::memcpy(&x, p + 4 * i, 4);
      return x;
    }
    case ir::DType::kI64: {
      int64_t x;
      std::memcpy(&x, p + 8 * i, 8);
      return static_cast<double>(x);
    }
    default:
      return std::nullopt;
  }
}

}  // namespace

std::optional<double> constant_scalar(const ir::Graph& g, int value, size_t max_rank) {
  if (value < 0) return std::nullopt;
  const ir::Value& v = g.value(value);
  if (v.kind != ir::ValueKind::kWeight || v.data == nullptr || !known_shape(v) || v.shape.size() > max_rank)
    return std::nullopt;
  if (v.numel() != 1) return std::nullopt;
  return element(v, 0);
}

bool near_value(double got, double want, double rel) {
  return std::fabs(got - want) <= rel * std::fabs(want);
}

std::optional<std::vector<int64_t>> constant_ints(const ir::Graph& g, int value, int64_t max_elems) {
  if (value < 0) return std::nullopt;
  const ir::Value& v = g.value(value);
  if (v.kind != ir::ValueKind::kWeight || v.data == nullptr || v.has_unknown_dims() || v.numel() > max_elems ||
      (v.dtype != ir::DType::kI64 && v.dtype != ir::DType::kI32))
    return std::nullopt;
  std::vector<int64_t> out(static_cast<size_t>(v.numel()));
  for (size_t i = 0; i < out.size(); ++i) {
    if (v.dtype == ir::DType::kI64) {
      std::memcpy(&out[i], static_cast<const char*>(v.data) + 8 * i, 8);
    } else {
      int32_t x;
      std::memcpy(&x, static_cast<const char*>(v.data) + 4 * i, 4);
      out[i] = x;
    }
  }
  return out;
}

bool is_f32(const ir::Graph& g, int value) {
  return value >= 0 && g.value(value).dtype == ir::DType::kF32;
}

bool gathers_rows(const ir::Graph& g, const ir::Node& n, int& table, int& index, std::string& why) {
  if (n.op == ir::OpKind::kOnnxGather && n.inputs.size() == 2) {
    if (n.attr_int("axis", 0) != 0) {
      why = "a Gather along axis " + std::to_string(n.attr_int("axis", 0));
      return false;
    }
    table = n.inputs[0];
    index = n.inputs[1];
    return true;
  }
  if (n.op != ir::OpKind::kOnnxGatherND || n.inputs.size() != 2) {
    why = "not a Gather or GatherND";
    return false;
  }
  if (n.attr_int("batch_dims", 0) != 0) {
    why = "a GatherND with batch_dims != 0";
    return false;
  }
  const ir::Node* u = produced_by(g, n.inputs[1], ir::OpKind::kOnnxUnsqueeze);
  if (u == nullptr || u->inputs.empty() || u->inputs[0] < 0) {
    why = "a GatherND whose indices are not Unsqueeze(index, -1)";
    return false;
  }
  std::vector<int64_t> axes;
  if (const auto* a = u->attr_ints("axes")) {
    axes = *a;
  } else if (u->inputs.size() > 1 && u->inputs[1] >= 0) {
    const ir::Value& av = g.value(u->inputs[1]);
    if (av.kind == ir::ValueKind::kWeight && av.data != nullptr && known_shape(av) &&
        (av.dtype == ir::DType::kI64 || av.dtype == ir::DType::kI32))
      for (int64_t i = 0; i < av.numel(); ++i) axes.push_back(static_cast<int64_t>(*element(av, i)));
  }
  const int64_t rank = static_cast<int64_t>(g.value(u->inputs[0]).shape.size());
  if (axes.size() != 1 || (axes[0] != -1 && axes[0] != rank)) {
    why = "a GatherND whose indices are not Unsqueeze(index, -1)";
    return false;
  }
  table = n.inputs[0];
  index = u->inputs[0];
  return true;
}

bool reduces_last_axis(const ir::Graph& g, const ir::Node& n, std::string& why) {
  if (n.op != ir::OpKind::kOnnxReduceMean || n.inputs.empty() || n.inputs[0] < 0) {
    why = "not a ReduceMean";
    return false;
  }
  const int64_t r = static_cast<int64_t>(g.value(n.inputs[0]).shape.size());
  std::vector<int64_t> axes;
  if (const auto* a = n.attr_ints("axes")) {
    axes = *a;
  } else if (n.inputs.size() > 1 && n.inputs[1] >= 0) {
    const ir::Value& av = g.value(n.inputs[1]);
    if (av.kind != ir::ValueKind::kWeight || av.data == nullptr || !known_shape(av) ||
        (av.dtype != ir::DType::kI64 && av.dtype != ir::DType::kI32)) {
      why = "axes not a constant";
      return false;
    }
    for (int64_t i = 0; i < av.numel(); ++i) axes.push_back(static_cast<int64_t>(*element(av, i)));
  }
  if (axes.empty()) {
    if (n.attr_int("noop_with_empty_axes", 0) != 0) {
      why = "a no-op reduction (noop_with_empty_axes)";
      return false;
    }
    if (r != 1) {
      why = "mean over all axes";
      return false;
    }
    axes.push_back(0);
  }
  if (axes.size() != 1) {
    why = "mean over " + std::to_string(axes.size()) + " axes";
    return false;
  }
  const int64_t axis = axes[0] < 0 ? axes[0] + r : axes[0];
  if (axis != r - 1) {
    why = "mean over axis " + std::to_string(axes[0]) + " of rank " + std::to_string(r);
    return false;
  }
  if (n.attr_int("keepdims", 1) != 1) {
    why = "keepdims=0";
    return false;
  }
  return true;
}

bool is_last_axis_weight(const ir::Graph& g, int value, int64_t d, size_t max_rank, std::string& why) {
  const ir::Value& v = g.value(value);
  if (v.kind != ir::ValueKind::kWeight || v.data == nullptr) {
    why = v.name + " is not a constant weight";
    return false;
  }
  if (v.dtype != ir::DType::kF32) {
    why = v.name + " is " + std::string(ir::dtype_name(v.dtype)) + ", not f32";
    return false;
  }
  bool ok = !v.shape.empty() && v.shape.size() <= max_rank && v.shape.back() == d;
  for (size_t i = 0; ok && i + 1 < v.shape.size(); ++i) ok = v.shape[i] == 1;
  if (!ok) {
    why = v.name + " has shape " + ir::shape_to_string(v.shape) + ", not [" + std::to_string(d) + "]";
    return false;
  }
  return true;
}

int as_last_axis_weight(ir::Graph& g, int value) {
  const ir::Value& v = g.value(value);
  if (v.shape.size() == 1) return value;
  const int64_t d = v.shape.back();
  return g.add_weight(v.name + ":last_axis", v.dtype, {d}, v.data);
}

int filled_weight(ir::Graph& g, const std::string& name, int64_t d, float fill) {
  auto buf = std::make_shared<std::vector<float>>(static_cast<size_t>(d), fill);
  const int id = g.add_weight(name, ir::DType::kF32, {d}, buf->data());
  g.keep_alive.push_back(std::move(buf));
  return id;
}

void apply_fusions(ir::Graph& g, const std::vector<Fusion>& fusions) {
  std::vector<bool> keep(g.nodes().size(), true);
  std::vector<const Fusion*> inserts_at(g.nodes().size(), nullptr);
  for (const Fusion& f : fusions) {
    const int last = *std::max_element(f.nodes.begin(), f.nodes.end());
    for (int i : f.nodes) keep[static_cast<size_t>(i)] = false;
    keep[static_cast<size_t>(last)] = true;
    g.mutable_nodes()[static_cast<size_t>(last)] = f.fused;
    if (!f.before.empty()) inserts_at[static_cast<size_t>(last)] = &f;
  }
  if (std::all_of(inserts_at.begin(), inserts_at.end(), [](const Fusion* f) { return f == nullptr; })) {
    g = compact(g, keep);
    return;
  }
  // Splice the extra nodes in; compact() then renumbers and sets producers.
  std::vector<ir::Node> nodes;
  std::vector<bool> keep_all;
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    if (!keep[i]) continue;
    if (inserts_at[i] != nullptr)
      for (const ir::Node& n : inserts_at[i]->before) nodes.push_back(n);
    nodes.push_back(g.nodes()[i]);
  }
  keep_all.assign(nodes.size(), true);
  g.mutable_nodes() = std::move(nodes);
  g = compact(g, keep_all);
}

bool run_anchored_fusions(ir::Graph& g, std::initializer_list<ir::OpKind> anchors, std::string_view label,
                          const MatchFn& match, PassStats& stats) {
  const Readers rd(g);
  std::vector<Fusion> fusions;
  const int n = static_cast<int>(g.nodes().size());
  std::vector<bool> taken(static_cast<size_t>(n), false);
  // A node can belong to one fusion only (first match wins).
  auto claimed = [&](const Fusion& f) {
    for (int k : f.nodes)
      if (taken[static_cast<size_t>(k)]) return true;
    for (int k : f.nodes) taken[static_cast<size_t>(k)] = true;
    return false;
  };
  for (int i = 0; i < n; ++i) {
    const ir::OpKind op = g.nodes()[static_cast<size_t>(i)].op;
    if (std::find(anchors.begin(), anchors.end(), op) == anchors.end()) continue;
    std::string why;
    std::optional<Fusion> f = match(g, rd, i, why);
    if (!why.empty())
      stats.notes.push_back("node " + g.nodes()[static_cast<size_t>(i)].name + ": " + std::string(label) + " pattern " +
                            (f ? "fused, " : "but ") + why);
    if (!f) continue;
    ++stats.matched;
    if (claimed(*f)) continue;
    fusions.push_back(std::move(*f));
  }
  if (fusions.empty()) return false;
  apply_fusions(g, fusions);
  stats.applied += static_cast<int64_t>(fusions.size());
  return true;
}

}  // namespace k3::passes
