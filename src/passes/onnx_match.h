// Pattern-matching helpers shared by the fusion passes on the onnx dialect
// (fuse-layer-norm, fuse-rms-norm, fuse-gelu): who reads a value, constant
// scalars and weights, reduction axes, and the rewrite that replaces a
// matched chain of nodes by one fused node.
#pragma once

#include <functional>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ir/graph.h"
#include "passes/pass.h"
#include "util/status.h"

namespace k3::passes {

// Readers of every value: node indices, a node listed once per input slot
// that reads the value (Mul(d, d) lists its node twice).
class Readers {
 public:
  explicit Readers(const ir::Graph& g);
  const std::vector<int>& of(int value) const { return readers_[static_cast<size_t>(value)]; }
  bool is_output(int value) const { return is_output_[static_cast<size_t>(value)]; }
  // Exactly one reading slot and not a graph output: the value can vanish
  // into a fused node.
  bool single(int value) const { return !is_output(value) && of(value).size() == 1; }
  // The one reader node of a single() value, -1 otherwise.
  int only_reader(int value) const { return single(value) ? of(value)[0] : -1; }

 private:
  std::vector<std::vector<int>> readers_;
  std::vector<bool> is_output_;
};

// The producer of `value` when it is op `op`, else nullptr.
const ir::Node* produced_by(const ir::Graph& g, int value, ir::OpKind op);

// The other input of a two-input node, -1 when `value` is not one of them
// (for x op x returns x).
int other_input(const ir::Node& n, int value);

// The value of a constant (weight) holding exactly one number of any
// numeric dtype whose rank is at most `max_rank` (so broadcasting it against
// a value of that rank does not change the shape); nullopt otherwise.
std::optional<double> constant_scalar(const ir::Graph& g, int value, size_t max_rank);

// The values of a constant int32/int64 tensor (a weight with data) of at
// most max_elems elements; nullopt otherwise.
std::optional<std::vector<int64_t>> constant_ints(const ir::Graph& g, int value, int64_t max_elems = int64_t{1} << 20);

// |got - want| <= rel * |want|.
bool near_value(double got, double want, double rel = 1e-6);

bool is_f32(const ir::Graph& g, int value);

// Whether node `n` takes whole rows of a table by an index tensor: Gather(table,
// index, axis 0), or GatherND(table, Unsqueeze(index, -1), batch_dims 0) as
// the dynamo exporter writes it (each index tuple has one entry, so it picks
// the same rows). Sets `table` and `index` (the un-unsqueezed one); when not,
// `why` says what it is instead.
bool gathers_rows(const ir::Graph& g, const ir::Node& n, int& table, int& index, std::string& why);

// Whether ReduceMean node `n` reduces exactly the last axis of its input
// with keepdims=1 (axes from the attribute or a constant input). When not,
// `why` says what it does instead ("mean over axis 1", "keepdims=0").
bool reduces_last_axis(const ir::Graph& g, const ir::Node& n, std::string& why);

// A per-channel weight for the last axis: an f32 weight of shape [D] or
// [1, ..., 1, D] with rank <= max_rank. When not, `why` says what it is.
bool is_last_axis_weight(const ir::Graph& g, int value, int64_t d, size_t max_rank, std::string& why);
// The id of a [D] weight for such a value: itself, or a new [D] view of the
// same data.
int as_last_axis_weight(ir::Graph& g, int value);

// A new f32 weight of shape [d] filled with `fill`, owned by the graph.
int filled_weight(ir::Graph& g, const std::string& name, int64_t d, float fill);

// One match to rewrite: the nodes it replaces and the fused node, which
// takes the place of the last of them (the one producing fused.outputs).
struct Fusion {
  std::vector<int> nodes;  // node indices, any order
  ir::Node fused;
  // Nodes that go right before the fused node, in this order (a rewrite
  // into several nodes; their new output values must already exist).
  std::vector<ir::Node> before;
};

// Applies non-overlapping fusions: each fused node replaces the last node
// of its match (so the order stays topological), the other matched nodes
// are removed, and values nothing refers to any more are dropped.
void apply_fusions(ir::Graph& g, const std::vector<Fusion>& fusions);

// A pattern matcher: the fusion anchored at node `i`, or nullopt. `why`
// says what failed (or, for a match, anything worth noting).
using MatchFn = std::function<std::optional<Fusion>(ir::Graph& g, const Readers& rd, int i, std::string& why)>;

// The loop of an anchored fusion pass: tries `match` on every node whose op
// is one of `anchors`, notes each near miss in `stats` ("node N: <label>
// pattern but <why>"), keeps the matches that overlap no earlier one and
// applies them. Returns whether the graph changed.
bool run_anchored_fusions(ir::Graph& g, std::initializer_list<ir::OpKind> anchors, std::string_view label,
                          const MatchFn& match, PassStats& stats);

}  // namespace k3::passes
