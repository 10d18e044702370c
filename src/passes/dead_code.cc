// dead-code: removes nodes whose results nothing needs, and values nothing
// refers to (weights left behind by other rewrites, initializers a traced
// export never reads).
//
//   live = graph outputs, then walking back: every input of a live node.
//   A node is live if one of its outputs is live, or if it has an effect
//   beyond its outputs.
//
// Guards (each has a must-not-remove test in tests/passes/test_dead_code.cc):
//   - a graph output is never removed, even when no node reads it;
//   - a node that reads a state value (CachedAttention writes the KV cache
//     in place) is kept even when its output is unused: removing it would
//     leave the cache unwritten for later steps;
//   - graph inputs stay, used or not: they are the model's calling convention.
#include "passes/dead_code.h"

#include "passes/graph_edit.h"

namespace k3::passes {

StatusOr<bool> DeadCode::run(ir::Graph& g) {
  const auto& nodes = g.nodes();
  std::vector<bool> live_value(g.values().size(), false);
  for (int id : g.outputs()) live_value[static_cast<size_t>(id)] = true;
  std::vector<bool> keep(nodes.size(), false);
  for (size_t i = nodes.size(); i-- > 0;) {
    const ir::Node& n = nodes[i];
    bool live = false;
    for (int out : n.outputs) live = live || live_value[static_cast<size_t>(out)];
    for (int in : n.inputs) live = live || (in >= 0 && g.value(in).kind == ir::ValueKind::kState);
    if (!live) continue;
    keep[i] = true;
    for (int in : n.inputs)
      if (in >= 0) live_value[static_cast<size_t>(in)] = true;  // -1: omitted optional onnx input
  }
  int64_t removed = 0;
  for (bool k : keep) removed += k ? 0 : 1;
  // Values referenced by no kept node (and not inputs/outputs) are dropped
  // by compact() too; count them to decide whether anything changed.
  std::vector<bool> referenced(g.values().size(), false);
  for (int id : g.inputs()) referenced[static_cast<size_t>(id)] = true;
  for (int id : g.outputs()) referenced[static_cast<size_t>(id)] = true;
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (!keep[i]) continue;
    for (int id : nodes[i].inputs)
      if (id >= 0) referenced[static_cast<size_t>(id)] = true;
    for (int id : nodes[i].outputs) referenced[static_cast<size_t>(id)] = true;
  }
  int64_t dropped_values = 0;
  for (bool r : referenced) dropped_values += r ? 0 : 1;
  if (removed == 0 && dropped_values == 0) return false;
  stats_.matched += removed;
  stats_.applied += removed;
  if (dropped_values > 0) stats_.notes.push_back("dropped " + std::to_string(dropped_values) + " unreferenced values");
  g = compact(g, keep);
  return true;
}

}  // namespace k3::passes
