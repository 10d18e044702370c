// The O0 interpreter; see interpreter.h.
#include "runtime/interp/interpreter.h"

#include <cstring>
#include <map>
#include <optional>

namespace k3::runtime::interp {

using ir::Tensor;

StatusOr<Interpreter> Interpreter::create(ir::Graph graph) {
  K3_RETURN_IF_ERROR(graph.verify());
  Interpreter it;
  for (const ir::Node& n : graph.nodes()) {
    if (onnx_ref::onnx_kernel(n.op) == nullptr)
      return unimplemented("node " + n.name + ": the O0 interpreter runs onnx.* ops only, not " + ir::op_name(n.op));
  }
  for (const ir::Value& v : graph.values())
    if (v.kind == ir::ValueKind::kState)
      return unimplemented("the O0 interpreter does not run graphs with state values");
  it.last_use_.assign(graph.values().size(), -1);
  for (size_t ni = 0; ni < graph.nodes().size(); ++ni)
    for (int in : graph.nodes()[ni].inputs)
      if (in >= 0) it.last_use_[static_cast<size_t>(in)] = static_cast<int>(ni);
  it.graph_ = std::move(graph);
  return it;
}

StatusOr<std::vector<NamedTensor>> Interpreter::run(const std::vector<NamedTensor>& inputs, RunStats* stats) const {
  const ir::Graph& g = graph_;
  std::vector<std::optional<Tensor>> slot(g.values().size());
  // Weights: views of the graph's data, no copy.
  for (size_t vi = 0; vi < g.values().size(); ++vi) {
    const ir::Value& v = g.values()[vi];
    if (v.kind == ir::ValueKind::kWeight) slot[vi] = Tensor::view(v.dtype, v.shape, v.data, nullptr);
  }
  // Inputs: by name, checked against the declared types; named dims bind once.
  std::map<std::string, int64_t> dim_binding;
  for (const NamedTensor& nt : inputs)
    if (g.find_value(nt.name) < 0 || g.value(g.find_value(nt.name)).kind != ir::ValueKind::kInput)
      return invalid_argument("the model has no input named '" + nt.name + "'");
  for (int id : g.inputs()) {
    const ir::Value& v = g.value(id);
    const NamedTensor* given = nullptr;
    for (const NamedTensor& nt : inputs)
      if (nt.name == v.name) given = &nt;
    if (given == nullptr) return invalid_argument("input '" + v.name + "' is missing");
    const Tensor& t = given->tensor;
    if (t.dtype() != v.dtype)
      return invalid_argument("input '" + v.name + "' must be " + std::string(ir::dtype_name(v.dtype)) + ", got " +
                              std::string(ir::dtype_name(t.dtype())));
    if (t.shape().size() != v.shape.size())
      return invalid_argument("input '" + v.name + "' must have shape " + ir::shape_to_string(v.shape) + ", got " +
                              ir::shape_to_string(t.shape()));
    for (size_t d = 0; d < v.shape.size(); ++d) {
      if (v.shape[d] >= 0 && v.shape[d] != t.shape()[d])
        return invalid_argument("input '" + v.name + "' must have shape " + ir::shape_to_string(v.shape) + ", got " +
                                ir::shape_to_string(t.shape()));
      const std::string& param = v.dim_params.empty() ? std::string() : v.dim_params[d];
      if (param.empty()) continue;
      auto [it, fresh] = dim_binding.emplace(param, t.shape()[d]);
      if (!fresh && it->second != t.shape()[d])
        return invalid_argument("input '" + v.name + "' dim '" + param + "' is " + std::to_string(t.shape()[d]) +
                                " but another input has it " + std::to_string(it->second));
    }
    slot[static_cast<size_t>(id)] = t;
  }

  std::vector<bool> keep(g.values().size(), false);
  for (int id : g.outputs()) keep[static_cast<size_t>(id)] = true;
  uint64_t live = 0, peak = 0;
  std::vector<ir::OutType> types;
  for (size_t ni = 0; ni < g.nodes().size(); ++ni) {
    const ir::Node& n = g.nodes()[ni];
    std::vector<const Tensor*> in(n.inputs.size(), nullptr);
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      if (n.inputs[i] < 0) continue;
      const std::optional<Tensor>& t = slot[static_cast<size_t>(n.inputs[i])];
      if (!t) return internal_error("node " + n.name + " reads a value that was freed or never produced");
      in[i] = &*t;
    }
    K3_ASSIGN_OR_RETURN(std::vector<Tensor> out, onnx_ref::eval_node(g, n, std::move(in)));
    for (size_t o = 0; o < n.outputs.size(); ++o) {
      live += out[o].nbytes();
      slot[static_cast<size_t>(n.outputs[o])] = std::move(out[o]);
    }
    peak = std::max(peak, live);
    // Free what no later node reads.
    auto release = [&](int id) {
      if (id < 0 || keep[static_cast<size_t>(id)] || g.value(id).kind != ir::ValueKind::kActivation) return;
      if (last_use_[static_cast<size_t>(id)] > static_cast<int>(ni)) return;
      if (slot[static_cast<size_t>(id)]) {
        live -= slot[static_cast<size_t>(id)]->nbytes();
        slot[static_cast<size_t>(id)].reset();
      }
    };
    for (int id : n.inputs) release(id);
    for (int id : n.outputs) release(id);  // outputs nobody reads
  }
  if (stats != nullptr) {
    stats->nodes_run = static_cast<int64_t>(g.nodes().size());
    stats->peak_live_bytes = peak;
  }
  std::vector<NamedTensor> result;
  for (int id : g.outputs()) {
    if (!slot[static_cast<size_t>(id)]) return internal_error("graph output " + g.value(id).name + " was not produced");
    const Tensor& t = *slot[static_cast<size_t>(id)];
    if (g.value(id).kind == ir::ValueKind::kWeight) {
      // Weights are views into the graph: hand out a copy that outlives it.
      Tensor copy = *Tensor::zeros(t.dtype(), t.shape());
      std::memcpy(copy.raw_mut(), t.raw(), t.nbytes());
      result.push_back({g.value(id).name, std::move(copy)});
      continue;
    }
    result.push_back({g.value(id).name, t});
  }
  return result;
}

}  // namespace k3::runtime::interp
