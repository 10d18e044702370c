// The graph IR: typed values with static shapes, and ops between them.
//
// A graph is built for one step shape: the leading dimension of activations
// is either the step's token count (bounded by T) or its output-row count
// (bounded by R); the plan is sized for those bounds and a step may use fewer
// rows (RowDim says which count applies). Everything else is static.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "ir/dtype.h"
#include "ir/op_table.h"
#include "util/status.h"

namespace k3::ir {

enum class ValueKind : uint8_t {
  kInput,       // fed per step (token ids, positions, slots, output rows)
  kWeight,      // constant data owned by the model
  kActivation,  // produced by a node, lives in the arena
  kState,       // persistent across steps (KV cache), owned by the runtime
};

// Which run-time count the leading dimension follows.
enum class RowDim : uint8_t { kFixed, kTokens, kOutRows };

// Shapes are static for the fused ops. Values of imported ONNX graphs may
// have dims unknown at compile time: -1 there, with the ONNX dim_param name
// (e.g. "batch") in dim_params when the model gave one. numel()/bytes() are
// only meaningful for fully known shapes (has_unknown_dims() false).
struct Value {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::vector<std::string> dim_params;  // empty, or one name per dim ("" = unnamed)
  ValueKind kind = ValueKind::kActivation;
  RowDim row_dim = RowDim::kFixed;
  const void* data = nullptr;  // kWeight only
  int producer = -1;           // node index, -1 for inputs/weights/state
  bool is_output = false;

  int64_t numel() const;
  uint64_t bytes() const;  // numel * dtype size (shape already validated)
  // Bytes of one row of the leading dimension.
  uint64_t row_bytes() const;
  bool has_unknown_dims() const;
};

// Dimension value for "not known at compile time" (ONNX dim_param or none).
inline constexpr int64_t kUnknownDim = -1;

// Attribute values. Lists are what ONNX attributes (perm, axes, pads) need.
// The .k3m serializer writes every alternative: add one there when adding here.
using AttrValue = std::variant<int64_t, double, std::string, std::vector<int64_t>, std::vector<double>>;

struct Attr {
  std::string name;
  AttrValue value;
};

struct Node {
  OpKind op;
  std::string name;
  // Value ids. onnx.* ops may have -1 for an omitted optional input (an
  // empty name in ONNX, e.g. Clip without min); fused ops never do.
  std::vector<int> inputs;
  std::vector<int> outputs;
  std::vector<Attr> attrs;

  // Attribute access without allocation (linear scan; nodes have few attrs).
  const AttrValue* find_attr(std::string_view key) const;
  int64_t attr_int(std::string_view key, int64_t fallback = 0) const;
  double attr_float(std::string_view key, double fallback = 0.0) const;
  // nullptr when absent or not an int list.
  const std::vector<int64_t>* attr_ints(std::string_view key) const;
};

// A Moe node's inputs: x, the router, each expert's matrices (up, [gate,]
// down), then with attr "shared" the shared expert's four. Every reader of
// that layout (shape rule, kernel, workspace, byte counts) goes through these.
inline int64_t moe_matrices_per_expert(const Node& n) {
  return n.attr_int("swiglu") != 0 ? 3 : 2;
}
inline size_t moe_shared_input(const Node& n) {
  return static_cast<size_t>(2 + n.attr_int("n_experts") * moe_matrices_per_expert(n));
}
// One past a Moe node's last weight input (the shared expert's gate, or the
// last routed expert's down projection).
inline size_t moe_weights_end(const Node& n) {
  return moe_shared_input(n) + (n.attr_int("shared", 0) != 0 ? 4 : 0);
}

// A Linear or Moe with attr "residual" 1 takes one more input, the last: a
// [T, N] value added to its output (passes/fuse_residual_add.cc). Its index,
// or -1 when there is none.
inline int residual_input(const Node& n) {
  return n.attr_int("residual", 0) != 0 && !n.inputs.empty() ? static_cast<int>(n.inputs.size()) - 1 : -1;
}
// A Linear's inputs: x, W, then the optional bias, then the optional residual.
inline bool linear_has_bias(const Node& n) {
  return n.inputs.size() - (residual_input(n) >= 0 ? 1 : 0) > 2;
}

class Graph {
 public:
  int add_value(Value v);
  int add_input(std::string name, DType dtype, std::vector<int64_t> shape, RowDim row_dim);
  int add_weight(std::string name, DType dtype, std::vector<int64_t> shape, const void* data);
  int add_state(std::string name, DType dtype, std::vector<int64_t> shape);
  // Adds a node and its output values, whose types come from the op's shape
  // rule. An onnx.* op may take fewer outputs than its rule gives (ONNX
  // optional trailing outputs such as LayerNormalization's Mean).
  StatusOr<std::vector<int>> add_node(OpKind op, std::string name, std::vector<int> inputs,
                                      std::vector<Attr> attrs, int num_outputs = 1);
  void mark_output(int value);
  // For deserializers and rewriters: registers an existing value as a graph
  // input, and appends a node whose output values already exist (their
  // producer is set here; verify() checks the rest).
  void mark_input(int value);
  void append_node(Node node);
  // Rewriters edit nodes in place (then verify()).
  std::vector<Node>& mutable_nodes() { return nodes_; }

  const std::vector<Value>& values() const { return values_; }
  std::vector<Value>& values() { return values_; }
  const std::vector<Node>& nodes() const { return nodes_; }
  const std::vector<int>& inputs() const { return inputs_; }
  const std::vector<int>& outputs() const { return outputs_; }
  const Value& value(int id) const { return values_[static_cast<size_t>(id)]; }
  int find_value(std::string_view name) const;  // -1 if absent

  // Checks structural invariants: ids in range, topological order, each
  // activation produced once, shapes agree with shape rules.
  Status verify() const;
  // Human-readable listing, one node per line.
  std::string to_string() const;

  // Keeps the buffers that weight values point into alive with the graph.
  std::vector<std::shared_ptr<const void>> keep_alive;

 private:
  std::vector<Value> values_;
  std::vector<Node> nodes_;
  std::vector<int> inputs_;
  std::vector<int> outputs_;
};

// Shape rule of an op: output types from input types (defined in shape_rules.cc).
struct OutType {
  DType dtype;
  std::vector<int64_t> shape;
  RowDim row_dim;
};
// For onnx.* ops dims may come out as -1 (not known at compile time).
Status infer_types(const Graph& g, const Node& node, std::vector<OutType>& out);

// "[2,?,4]": unknown dims print as "?".
std::string shape_to_string(const std::vector<int64_t>& shape);

}  // namespace k3::ir
