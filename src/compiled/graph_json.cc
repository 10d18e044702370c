// ir::Graph <-> JSON for the .k3m metadata.
#include "compiled/graph_json.h"

#include <string>
#include <vector>

namespace k3::k3m {
namespace {

using nlohmann::json;

const char* kind_name(ir::ValueKind k) {
  switch (k) {
    case ir::ValueKind::kInput:
      return "input";
    case ir::ValueKind::kWeight:
      return "weight";
    case ir::ValueKind::kActivation:
      return "activation";
    case ir::ValueKind::kState:
      return "state";
  }
  return "?";
}

const char* row_dim_name(ir::RowDim r) {
  switch (r) {
    case ir::RowDim::kFixed:
      return "fixed";
    case ir::RowDim::kTokens:
      return "tokens";
    case ir::RowDim::kOutRows:
      return "out_rows";
  }
  return "?";
}

json attr_to_json(const ir::Attr& a) {
  return std::visit(
      [&](const auto& v) -> json {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, int64_t>)
          return json::array({a.name, "i", v});
        else if constexpr (std::is_same_v<T, double>)
          return json::array({a.name, "f", v});
        else if constexpr (std::is_same_v<T, std::string>)
          return json::array({a.name, "s", v});
        else if constexpr (std::is_same_v<T, std::vector<int64_t>>)
          return json::array({a.name, "ints", v});
        else
          return json::array({a.name, "floats", v});
      },
      a.value);
}

StatusOr<ir::Attr> attr_from_json(const json& j) {
  if (!j.is_array() || j.size() != 3 || !j[0].is_string() || !j[1].is_string())
    return data_loss("attribute entry is not [name, type, value]");
  ir::Attr a;
  a.name = j[0].get<std::string>();
  const std::string type = j[1].get<std::string>();
  const json& v = j[2];
  if (type == "i" && v.is_number_integer())
    a.value = v.get<int64_t>();
  else if (type == "f" && v.is_number())
    a.value = v.get<double>();
  else if (type == "s" && v.is_string())
    a.value = v.get<std::string>();
  else if (type == "ints" && v.is_array()) {
    std::vector<int64_t> xs;
    for (const json& x : v) {
      if (!x.is_number_integer()) return data_loss("attribute " + a.name + ": ints list holds a non-integer");
      xs.push_back(x.get<int64_t>());
    }
    a.value = std::move(xs);
  } else if (type == "floats" && v.is_array()) {
    std::vector<double> xs;
    for (const json& x : v) {
      if (!x.is_number()) return data_loss("attribute " + a.name + ": floats list holds a non-number");
      xs.push_back(x.get<double>());
    }
    a.value = std::move(xs);
  } else {
    return data_loss("attribute " + a.name + " has type '" + type + "' and a value that does not match it");
  }
  return a;
}

StatusOr<ir::OpKind> parse_op(const std::string& name) {
  // The op table is an X-macro; the enum is dense from 0, and op_name()
  // returns "?" past its end.
  for (int i = 0; i < 256; ++i) {
    const auto op = static_cast<ir::OpKind>(i);
    if (name == ir::op_name(op)) return op;
  }
  return data_loss("unknown op '" + name + "' (written by a newer K3?)");
}

StatusOr<int> parse_id(const json& j, size_t n_values, const std::string& what) {
  if (!j.is_number_integer()) return data_loss(what + " is not an integer value id");
  const int64_t id = j.get<int64_t>();
  if (id < 0 || static_cast<uint64_t>(id) >= n_values)
    return data_loss(what + " refers to value " + std::to_string(id) + " of " + std::to_string(n_values));
  return static_cast<int>(id);
}

}  // namespace

StatusOr<ir::DType> parse_dtype(const std::string& name) {
  for (int i = 0; i < 64; ++i) {
    const auto t = static_cast<ir::DType>(i);
    if (ir::dtype_name(t) == name) return t;
  }
  return data_loss("unknown dtype '" + name + "'");
}

json graph_to_json(const ir::Graph& g, const std::function<int64_t(int)>& tensor_index) {
  json values = json::array();
  for (size_t vi = 0; vi < g.values().size(); ++vi) {
    const ir::Value& v = g.values()[vi];
    json jv = {{"name", v.name},
               {"dtype", std::string(ir::dtype_name(v.dtype))},
               {"shape", v.shape},
               {"kind", kind_name(v.kind)},
               {"row_dim", row_dim_name(v.row_dim)}};
    if (v.kind == ir::ValueKind::kWeight) jv["tensor"] = tensor_index(static_cast<int>(vi));
    // Symbolic dim names of graphs that keep unknown dims (onnx dialect).
    if (!v.dim_params.empty()) jv["dim_params"] = v.dim_params;
    values.push_back(std::move(jv));
  }
  json nodes = json::array();
  for (const ir::Node& n : g.nodes()) {
    json attrs = json::array();
    for (const ir::Attr& a : n.attrs) attrs.push_back(attr_to_json(a));
    nodes.push_back(
        {{"op", ir::op_name(n.op)}, {"name", n.name}, {"inputs", n.inputs}, {"outputs", n.outputs}, {"attrs", attrs}});
  }
  return {{"values", values}, {"inputs", g.inputs()}, {"outputs", g.outputs()}, {"nodes", nodes}};
}

StatusOr<ir::Graph> graph_from_json(const json& j,
                                    const std::function<StatusOr<const void*>(int64_t, const ir::Value&)>& weight) {
  if (!j.is_object()) return data_loss("graph is not a JSON object");
  const json& jvalues = j.at("values");
  const json& jnodes = j.at("nodes");
  if (!jvalues.is_array() || !jnodes.is_array()) return data_loss("graph values/nodes are not arrays");
  const size_t nv = jvalues.size();
  ir::Graph g;
  std::vector<bool> produced(nv, false);
  for (size_t vi = 0; vi < nv; ++vi) {
    const json& jv = jvalues[vi];
    ir::Value v;
    v.name = jv.at("name").get<std::string>();
    K3_ASSIGN_OR_RETURN(v.dtype, parse_dtype(jv.at("dtype").get<std::string>()));
    v.shape = jv.at("shape").get<std::vector<int64_t>>();
    if (jv.contains("dim_params")) {
      const json& dp = jv.at("dim_params");
      if (!dp.is_array() || dp.size() != v.shape.size())
        return data_loss("value " + v.name + ": dim_params must list one name per dimension");
      for (const json& name : dp) {
        if (!name.is_string()) return data_loss("value " + v.name + ": a dim_param is not a string");
        v.dim_params.push_back(name.get<std::string>());
      }
    }
    const std::string kind = jv.at("kind").get<std::string>();
    const std::string row = jv.at("row_dim").get<std::string>();
    if (kind == "input")
      v.kind = ir::ValueKind::kInput;
    else if (kind == "weight")
      v.kind = ir::ValueKind::kWeight;
    else if (kind == "activation")
      v.kind = ir::ValueKind::kActivation;
    else if (kind == "state")
      v.kind = ir::ValueKind::kState;
    else
      return data_loss("value " + v.name + " has unknown kind '" + kind + "'");
    if (row == "fixed")
      v.row_dim = ir::RowDim::kFixed;
    else if (row == "tokens")
      v.row_dim = ir::RowDim::kTokens;
    else if (row == "out_rows")
      v.row_dim = ir::RowDim::kOutRows;
    else
      return data_loss("value " + v.name + " has unknown row_dim '" + row + "'");
    if ((v.row_dim != ir::RowDim::kFixed) && v.shape.empty())
      return data_loss("value " + v.name + " has a row dimension but no shape");
    if (v.kind == ir::ValueKind::kWeight) {
      const json& t = jv.at("tensor");
      if (!t.is_number_integer()) return data_loss("weight " + v.name + " has no tensor index");
      K3_ASSIGN_OR_RETURN(v.data, weight(t.get<int64_t>(), v));
    }
    g.add_value(std::move(v));
  }
  for (const json& id : j.at("inputs")) {
    K3_ASSIGN_OR_RETURN(int v, parse_id(id, nv, "graph input"));
    if (g.value(v).kind != ir::ValueKind::kInput)
      return data_loss("graph input " + g.value(v).name + " is not an input");
    g.mark_input(v);
  }
  for (const json& jn : jnodes) {
    ir::Node n;
    K3_ASSIGN_OR_RETURN(n.op, parse_op(jn.at("op").get<std::string>()));
    n.name = jn.at("name").get<std::string>();
    for (const json& id : jn.at("inputs")) {
      K3_ASSIGN_OR_RETURN(int v, parse_id(id, nv, "input of node " + n.name));
      n.inputs.push_back(v);
    }
    for (const json& id : jn.at("outputs")) {
      K3_ASSIGN_OR_RETURN(int v, parse_id(id, nv, "output of node " + n.name));
      if (g.value(v).kind != ir::ValueKind::kActivation || produced[static_cast<size_t>(v)])
        return data_loss("node " + n.name + " writes " + g.value(v).name + ", which is not a fresh activation");
      produced[static_cast<size_t>(v)] = true;
      n.outputs.push_back(v);
    }
    for (const json& ja : jn.at("attrs")) {
      K3_ASSIGN_OR_RETURN(ir::Attr a, attr_from_json(ja));
      n.attrs.push_back(std::move(a));
    }
    g.append_node(std::move(n));
  }
  for (size_t vi = 0; vi < nv; ++vi)
    if (g.values()[vi].kind == ir::ValueKind::kActivation && !produced[vi])
      return data_loss("activation " + g.values()[vi].name + " has no producer");
  for (const json& id : j.at("outputs")) {
    K3_ASSIGN_OR_RETURN(int v, parse_id(id, nv, "graph output"));
    g.mark_output(v);
  }
  return g;
}

}  // namespace k3::k3m
