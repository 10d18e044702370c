// Graph rewriting helpers shared by the passes.
#include "passes/graph_edit.h"

namespace k3::passes {

std::vector<int> count_uses(const ir::Graph& g) {
  std::vector<int> uses(g.values().size(), 0);
  for (const ir::Node& n : g.nodes())
    for (int in : n.inputs)
      if (in >= 0) ++uses[static_cast<size_t>(in)];  // -1: omitted optional onnx input
  for (int out : g.outputs()) ++uses[static_cast<size_t>(out)];
  return uses;
}

ir::Graph compact(const ir::Graph& g, const std::vector<bool>& keep_node) {
  const auto& nodes = g.nodes();
  std::vector<bool> keep_value(g.values().size(), false);
  for (int id : g.inputs()) keep_value[static_cast<size_t>(id)] = true;
  for (int id : g.outputs()) keep_value[static_cast<size_t>(id)] = true;
  for (size_t ni = 0; ni < nodes.size(); ++ni) {
    if (!keep_node[ni]) continue;
    for (int id : nodes[ni].inputs)
      if (id >= 0) keep_value[static_cast<size_t>(id)] = true;  // -1: omitted optional onnx input
    for (int id : nodes[ni].outputs) keep_value[static_cast<size_t>(id)] = true;
  }
  ir::Graph out;
  std::vector<int> remap(g.values().size(), -1);
  for (size_t vi = 0; vi < g.values().size(); ++vi) {
    if (!keep_value[vi]) continue;
    ir::Value v = g.values()[vi];
    v.producer = -1;      // set again by append_node
    v.is_output = false;  // set again by mark_output
    remap[vi] = out.add_value(std::move(v));
  }
  for (int id : g.inputs()) out.mark_input(remap[static_cast<size_t>(id)]);
  for (size_t ni = 0; ni < nodes.size(); ++ni) {
    if (!keep_node[ni]) continue;
    ir::Node n = nodes[ni];
    for (int& id : n.inputs)
      if (id >= 0) id = remap[static_cast<size_t>(id)];
    for (int& id : n.outputs) id = remap[static_cast<size_t>(id)];
    out.append_node(std::move(n));
  }
  for (int id : g.outputs()) out.mark_output(remap[static_cast<size_t>(id)]);
  out.keep_alive = g.keep_alive;
  return out;
}

}  // namespace k3::passes
