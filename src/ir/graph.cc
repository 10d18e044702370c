// Graph construction, verification and printing.
#include "ir/graph.h"

#include <sstream>

#include "util/checked.h"

namespace k3::ir {

const char* op_name(OpKind op) {
  switch (op) {
#define K3_OP_NAME(e, name) \
  case OpKind::k##e:            \
    return name;
    K3_OP_LIST(K3_OP_NAME)
    K3_ONNX_OP_LIST(K3_OP_NAME)
#undef K3_OP_NAME
  }
  return "?";
}

int64_t Value::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

uint64_t Value::bytes() const { return dtype_bytes(dtype, shape).value_or(0); }

uint64_t Value::row_bytes() const {
  if (shape.empty() || shape[0] == 0) return 0;
  return bytes() / static_cast<uint64_t>(shape[0]);
}

bool Value::has_unknown_dims() const {
  for (int64_t d : shape)
    if (d < 0) return true;
  return false;
}

const AttrValue* Node::find_attr(std::string_view key) const {
  for (const Attr& a : attrs)
    if (a.name == key) return &a.value;
  return nullptr;
}

int64_t Node::attr_int(std::string_view key, int64_t fallback) const {
  const AttrValue* v = find_attr(key);
  if (v == nullptr) return fallback;
  if (const auto* i = std::get_if<int64_t>(v)) return *i;
  return fallback;
}

double Node::attr_float(std::string_view key, double fallback) const {
  const AttrValue* v = find_attr(key);
  if (v == nullptr) return fallback;
  if (const auto* d = std::get_if<double>(v)) return *d;
  if (const auto* i = std::get_if<int64_t>(v)) return static_cast<double>(*i);
  return fallback;
}

const std::vector<int64_t>* Node::attr_ints(std::string_view key) const {
  const AttrValue* v = find_attr(key);
  return v == nullptr ? nullptr : std::get_if<std::vector<int64_t>>(v);
}

int Graph::add_value(Value v) {
  values_.push_back(std::move(v));
  return static_cast<int>(values_.size() - 1);
}

int Graph::add_input(std::string name, DType dtype, std::vector<int64_t> shape, RowDim row_dim) {
  Value v;
  v.name = std::move(name);
  v.dtype = dtype;
  v.shape = std::move(shape);
  v.kind = ValueKind::kInput;
  v.row_dim = row_dim;
  int id = add_value(std::move(v));
  inputs_.push_back(id);
  return id;
}

int Graph::add_weight(std::string name, DType dtype, std::vector<int64_t> shape, const void* data) {
  Value v;
  v.name = std::move(name);
  v.dtype = dtype;
  v.shape = std::move(shape);
  v.kind = ValueKind::kWeight;
  v.data = data;
  return add_value(std::move(v));
}

int Graph::add_state(std::string name, DType dtype, std::vector<int64_t> shape) {
  Value v;
  v.name = std::move(name);
  v.dtype = dtype;
  v.shape = std::move(shape);
  v.kind = ValueKind::kState;
  return add_value(std::move(v));
}

StatusOr<std::vector<int>> Graph::add_node(OpKind op, std::string name, std::vector<int> inputs,
                                           std::vector<Attr> attrs, int num_outputs) {
  for (int in : inputs)
    if ((in < 0 && !(in == -1 && is_onnx_op(op))) || in >= static_cast<int>(values_.size()))
      return invalid_argument("node " + name + ": input id out of range");
  Node node{op, std::move(name), std::move(inputs), {}, std::move(attrs)};
  std::vector<OutType> types;
  K3_RETURN_IF_ERROR(infer_types(*this, node, types).with_context(std::string(op_name(op)) + " " + node.name));
  if (is_onnx_op(op) && num_outputs >= 1 && static_cast<int>(types.size()) > num_outputs)
    types.resize(static_cast<size_t>(num_outputs));
  if (static_cast<int>(types.size()) != num_outputs)
    return invalid_argument("node " + node.name + ": " + op_name(op) + " has " + std::to_string(types.size()) +
                            " outputs, not " + std::to_string(num_outputs));
  int node_index = static_cast<int>(nodes_.size());
  for (int i = 0; i < num_outputs; ++i) {
    Value v;
    v.name = num_outputs == 1 ? node.name : node.name + ":" + std::to_string(i);
    v.dtype = types[static_cast<size_t>(i)].dtype;
    v.shape = types[static_cast<size_t>(i)].shape;
    v.row_dim = types[static_cast<size_t>(i)].row_dim;
    v.kind = ValueKind::kActivation;
    v.producer = node_index;
    node.outputs.push_back(add_value(std::move(v)));
  }
  std::vector<int> outs = node.outputs;
  nodes_.push_back(std::move(node));
  return outs;
}

void Graph::mark_output(int value) {
  values_[static_cast<size_t>(value)].is_output = true;
  outputs_.push_back(value);
}

void Graph::mark_input(int value) { inputs_.push_back(value); }

void Graph::append_node(Node node) {
  const int index = static_cast<int>(nodes_.size());
  for (int out : node.outputs)
    if (out >= 0 && out < static_cast<int>(values_.size())) values_[static_cast<size_t>(out)].producer = index;
  nodes_.push_back(std::move(node));
}

int Graph::find_value(std::string_view name) const {
  for (size_t i = 0; i < values_.size(); ++i)
    if (values_[i].name == name) return static_cast<int>(i);
  return -1;
}

Status Graph::verify() const {
  const int nv = static_cast<int>(values_.size());
  std::vector<int> produced_at(values_.size(), -1);
  for (size_t vi = 0; vi < values_.size(); ++vi) {
    const Value& v = values_[vi];
    // Unknown dims (-1) are allowed; the known ones must not overflow.
    std::vector<int64_t> known;
    for (int64_t d : v.shape) {
      if (d < kUnknownDim) return invalid_argument("value " + v.name + " has a negative dimension");
      known.push_back(d < 0 ? 1 : d);
    }
    if (!dtype_bytes(v.dtype, known))
      return invalid_argument("value " + v.name + " has an invalid shape " + shape_to_string(v.shape));
    if (!v.dim_params.empty() && v.dim_params.size() != v.shape.size())
      return invalid_argument("value " + v.name + " has dim names for a different rank");
    if (v.kind == ValueKind::kWeight && v.has_unknown_dims())
      return invalid_argument("weight " + v.name + " has unknown dims");
    if (v.kind == ValueKind::kWeight && v.data == nullptr)
      return invalid_argument("weight " + v.name + " has no data");
  }
  for (size_t ni = 0; ni < nodes_.size(); ++ni) {
    const Node& n = nodes_[ni];
    for (int in : n.inputs) {
      if (in == -1 && is_onnx_op(n.op)) continue;  // omitted optional input
      if (in < 0 || in >= nv) return invalid_argument("node " + n.name + ": input id out of range");
      const Value& v = values_[static_cast<size_t>(in)];
      if (v.kind == ValueKind::kActivation && (produced_at[static_cast<size_t>(in)] < 0))
        return invalid_argument("node " + n.name + " reads " + v.name + " before it is produced");
    }
    std::vector<OutType> types;
    K3_RETURN_IF_ERROR(infer_types(*this, n, types).with_context("node " + n.name));
    if (is_onnx_op(n.op) && types.size() > n.outputs.size() && !n.outputs.empty()) types.resize(n.outputs.size());
    if (types.size() != n.outputs.size()) return invalid_argument("node " + n.name + ": output count mismatch");
    for (size_t o = 0; o < n.outputs.size(); ++o) {
      int out = n.outputs[o];
      if (out < 0 || out >= nv) return invalid_argument("node " + n.name + ": output id out of range");
      const Value& v = values_[static_cast<size_t>(out)];
      if (v.kind != ValueKind::kActivation) return invalid_argument("node " + n.name + " writes non-activation " + v.name);
      if (produced_at[static_cast<size_t>(out)] >= 0) return invalid_argument("value " + v.name + " produced twice");
      if (v.shape != types[o].shape || v.dtype != types[o].dtype)
        return invalid_argument("value " + v.name + " type disagrees with the shape rule of " + n.name);
      produced_at[static_cast<size_t>(out)] = static_cast<int>(ni);
    }
  }
  for (int out : outputs_)
    if (out < 0 || out >= nv) return invalid_argument("graph output id out of range");
  return Status();
}

std::string shape_to_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ",";
    s += shape[i] < 0 ? std::string("?") : std::to_string(shape[i]);
  }
  return s + "]";
}

std::string Graph::to_string() const {
  std::ostringstream os;
  for (const Node& n : nodes_) {
    os << op_name(n.op) << " " << n.name << " (";
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      if (n.inputs[i] < 0) {
        os << (i ? ", " : "") << "-";
        continue;
      }
      const Value& v = value(n.inputs[i]);
      os << (i ? ", " : "") << v.name << ":" << dtype_name(v.dtype) << shape_to_string(v.shape);
    }
    os << ") -> ";
    for (size_t i = 0; i < n.outputs.size(); ++i) {
      const Value& v = value(n.outputs[i]);
      os << (i ? ", " : "") << v.name << ":" << dtype_name(v.dtype) << shape_to_string(v.shape);
    }
    os << "\n";
  }
  return os.str();
}

}  // namespace k3::ir
