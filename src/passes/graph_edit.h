// Graph rewriting helpers shared by the passes.
#pragma once

#include <vector>

#include "ir/graph.h"

namespace k3::passes {

// How many nodes read each value (graph outputs count as one extra reader).
std::vector<int> count_uses(const ir::Graph& g);

// A copy of g holding only the nodes with keep_node[i] set and the values
// they, the graph inputs and the graph outputs refer to; ids are renumbered,
// names, order and keep_alive are preserved.
ir::Graph compact(const ir::Graph& g, const std::vector<bool>& keep_node);

}  // namespace k3::passes
