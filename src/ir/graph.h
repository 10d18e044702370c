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

struct Value {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  ValueKind kind = ValueKind::kActivation;
  RowDim row_dim = RowDim::kFixed;
  const void* data = nullptr;  // kWeight only
  int producer = -1;           // node index, -1 for inputs/weights/state
  bool is_output = false;

  int64_t numel() const;
  uint64_t bytes() const;  // numel * dtype size (shape already validated)
  // Bytes of one row of the leading dimension.
  uint64_t row_bytes() const;
};

using AttrValue = std::variant<int64_t, double, std::string>;

struct Attr {
  std::string name;
  AttrValue value;
};

struct Node {
  OpKind op;
  std::string name;
  std::vector<int> inputs;
  std::vector<int> outputs;
  std::vector<Attr> attrs;

  // Attribute access without allocation (linear scan; nodes have few attrs).
  const AttrValue* find_attr(std::string_view key) const;
  int64_t attr_int(std::string_view key, int64_t fallback = 0) const;
  double attr_float(std::string_view key, double fallback = 0.0) const;
};

class Graph {
 public:
  int add_value(Value v);
  int add_input(std::string name, DType dtype, std::vector<int64_t> shape, RowDim row_dim);
  int add_weight(std::string name, DType dtype, std::vector<int64_t> shape, const void* data);
  int add_state(std::string name, DType dtype, std::vector<int64_t> shape);
  // Adds a node and its output values, whose types come from the op's shape rule.
  StatusOr<std::vector<int>> add_node(OpKind op, std::string name, std::vector<int> inputs,
                                      std::vector<Attr> attrs, int num_outputs = 1);
  void mark_output(int value);

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
Status infer_types(const Graph& g, const Node& node, std::vector<OutType>& out);

std::string shape_to_string(const std::vector<int64_t>& shape);

}  // namespace k3::ir
