// The ONNX importer; see import.h.
#include "frontend/onnx/import.h"

#include <cstring>
#include <string_view>
#include <unordered_map>

#include "frontend/onnx/supported_ops.h"
#include "frontend/onnx/tensor_proto.h"
#include "ir/onnx_shape.h"

namespace k3::onnxfe {
namespace {

using ::onnx::AttributeProto;
using ::onnx::NodeProto;

struct OnnxOpKind {
  std::string_view op_type;
  ir::OpKind kind;
};
// "onnx.Add" -> ("Add", kOnnxAdd), from the one list.
constexpr OnnxOpKind kOpKinds[] = {
#define K3_ONNX_KIND(e, name) {std::string_view(name).substr(5), ir::OpKind::k##e},
    K3_ONNX_OP_LIST(K3_ONNX_KIND)
#undef K3_ONNX_KIND
};

const OnnxOpKind* find_kind(std::string_view op_type) {
  for (const OnnxOpKind& k : kOpKinds)
    if (k.op_type == op_type) return &k;
  return nullptr;
}

class Importer {
 public:
  Importer(const OnnxModel& m, const ImportOptions& o) : m_(m), opt_(o) {}

  StatusOr<ir::Graph> run() {
    const ::onnx::GraphProto& g = m_.graph();
    for (const auto& t : g.initializer()) {
      K3_ASSIGN_OR_RETURN(ir::Tensor w,
                          tensor_from_proto(t, "initializer '" + printable(t.name()) + "'", m_.base_dir()));
      add_weight(t.name(), w);
    }
    if (g.sparse_initializer_size() > 0) return unimplemented("sparse initializers are not supported");
    for (const auto& in : g.input()) {
      if (ids_.count(in.name())) continue;  // IR < 4 lists initializers as inputs too
      K3_RETURN_IF_ERROR(add_input(in));
    }
    for (int i = 0; i < g.node_size(); ++i) K3_RETURN_IF_ERROR(add_node(g.node(i)));
    for (const auto& out : g.output()) {
      auto it = ids_.find(out.name());
      if (it == ids_.end()) return data_loss("graph output '" + printable(out.name()) + "' is never defined");
      int id = it->second;
      ir::Value& v = graph_.values()[static_cast<size_t>(id)];
      if (v.name != out.name()) {
        // Reached through a dropped Identity/Dropout: the value takes the output's name.
        if (v.kind != ir::ValueKind::kActivation || v.is_output)
          return unimplemented("graph output '" + printable(out.name()) + "' is an alias of '" + printable(v.name) +
                               "', which K3 cannot rename");
        v.name = out.name();
      }
      graph_.mark_output(id);
    }
    K3_RETURN_IF_ERROR(graph_.verify());
    return std::move(graph_);
  }

 private:
  void add_weight(const std::string& name, const ir::Tensor& t) {
    graph_.keep_alive.push_back(t.owner());
    ids_[name] = graph_.add_weight(name, t.dtype(), t.shape(), t.raw());
  }

  Status add_input(const ::onnx::ValueInfoProto& in) {
    const std::string what = "graph input '" + printable(in.name()) + "'";
    if (!in.type().has_tensor_type())
      return unimplemented(what + " is not a tensor (sequences and maps are not supported)");
    const auto& tt = in.type().tensor_type();
    auto dtype = ir::dtype_from_onnx(tt.elem_type());
    if (!dtype)
      return unimplemented(what + " has type " + onnx_type_name(tt.elem_type()) + ", which K3 does not support");
    if (!tt.has_shape()) return unimplemented(what + " has no shape (unknown rank)");
    std::vector<int64_t> shape;
    std::vector<std::string> params;
    bool named = false;
    for (const auto& d : tt.shape().dim()) {
      if (d.has_dim_value()) {
        if (d.dim_value() < 0) return data_loss(what + " has a negative dimension");
        shape.push_back(d.dim_value());
        params.emplace_back();
      } else {
        shape.push_back(ir::kUnknownDim);
        params.push_back(d.dim_param());
        named |= !d.dim_param().empty();
      }
    }
    const int id = graph_.add_input(in.name(), *dtype, shape, ir::RowDim::kFixed);
    if (named) graph_.values()[static_cast<size_t>(id)].dim_params = std::move(params);
    ids_[in.name()] = id;
    return Status();
  }

  Status constant(const NodeProto& n, const std::string& where) {
    if (n.attribute_size() != 1 || n.output_size() != 1)
      return invalid_argument(where + ": Constant needs one value attribute");
    const AttributeProto& a = n.attribute(0);
    ir::Tensor t;
    auto make = [&](ir::DType dt, std::vector<int64_t> shape, const void* src) {
      t = *ir::Tensor::zeros(dt, std::move(shape));
      std::memcpy(t.raw_mut(), src, t.nbytes());
    };
    if (a.name() == "value") {
      K3_ASSIGN_OR_RETURN(t, tensor_from_proto(a.t(), where + " value"));
    } else if (a.name() == "value_float") {
      const float f = a.f();
      make(ir::DType::kF32, {}, &f);
    } else if (a.name() == "value_int") {
      const int64_t i = a.i();
      make(ir::DType::kI64, {}, &i);
    } else if (a.name() == "value_floats") {
      make(ir::DType::kF32, {a.floats_size()}, a.floats().data());
    } else if (a.name() == "value_ints") {
      make(ir::DType::kI64, {a.ints_size()}, a.ints().data());
    } else {
      return unimplemented(where + ": Constant attribute '" + printable(a.name()) + "' is not supported");
    }
    add_weight(n.output(0), t);
    return Status();
  }

  StatusOr<std::vector<ir::Attr>> attrs(const NodeProto& n, const std::string& where) {
    std::vector<ir::Attr> out;
    for (const AttributeProto& a : n.attribute()) {
      switch (a.type()) {
        case AttributeProto::INT:
          out.push_back({a.name(), a.i()});
          break;
        case AttributeProto::FLOAT:
          out.push_back({a.name(), static_cast<double>(a.f())});
          break;
        case AttributeProto::STRING:
          out.push_back({a.name(), a.s()});
          break;
        case AttributeProto::INTS:
          out.push_back({a.name(), std::vector<int64_t>(a.ints().begin(), a.ints().end())});
          break;
        case AttributeProto::FLOATS:
          out.push_back({a.name(), std::vector<double>(a.floats().begin(), a.floats().end())});
          break;
        case AttributeProto::TENSOR: {
          if (n.op_type() != "ConstantOfShape" || a.name() != "value")
            return unimplemented(where + ": tensor attribute '" + printable(a.name()) + "' is not supported");
          // One-element value -> value_dtype (ONNX type code) + value (int or float).
          K3_ASSIGN_OR_RETURN(ir::Tensor t, tensor_from_proto(a.t(), where + " value"));
          if (t.numel() != 1) return invalid_argument(where + ": ConstantOfShape value must have one element");
          out.push_back({"value_dtype", ir::dtype_to_onnx(t.dtype())});
          switch (t.dtype()) {
            case ir::DType::kF32:
              out.push_back({"value", static_cast<double>(t.data<float>()[0])});
              break;
            case ir::DType::kF64:
              out.push_back({"value", t.data<double>()[0]});
              break;
            case ir::DType::kI64:
              out.push_back({"value", t.data<int64_t>()[0]});
              break;
            case ir::DType::kI32:
              out.push_back({"value", static_cast<int64_t>(t.data<int32_t>()[0])});
              break;
            case ir::DType::kI8:
              out.push_back({"value", static_cast<int64_t>(t.data<int8_t>()[0])});
              break;
            case ir::DType::kU8:
            case ir::DType::kBool:
              out.push_back({"value", static_cast<int64_t>(t.data<uint8_t>()[0])});
              break;
            default:
              return unimplemented(where + ": ConstantOfShape value type is not supported");
          }
          break;
        }
        case AttributeProto::GRAPH:
        case AttributeProto::GRAPHS:
          return unimplemented(where + " has a subgraph attribute (control flow is not supported)");
        default:
          return unimplemented(where + ": attribute '" + printable(a.name()) + "' has an unsupported type");
      }
    }
    return out;
  }

  // ONNX's inferred type of an output must agree with K3's rule.
  Status check_inferred(const std::string& name, ir::Value& v, const std::string& where) {
    const ::onnx::TypeProto* t = m_.find_type(name);
    if (t == nullptr || !t->has_tensor_type()) return Status();
    const auto& tt = t->tensor_type();
    if (tt.elem_type() != 0) {
      auto dt = ir::dtype_from_onnx(tt.elem_type());
      if (!dt || *dt != v.dtype)
        return invalid_argument(where + ": output '" + printable(name) + "' is " +
                                std::string(ir::dtype_name(v.dtype)) + " by K3's rule but " +
                                onnx_type_name(tt.elem_type()) + " by ONNX shape inference");
    }
    if (!tt.has_shape()) return Status();
    if (tt.shape().dim_size() != static_cast<int>(v.shape.size()))
      return invalid_argument(where + ": output '" + printable(name) + "' has rank " + std::to_string(v.shape.size()) +
                              " by K3's rule but " + std::to_string(tt.shape().dim_size()) +
                              " by ONNX shape inference");
    std::vector<std::string> params(v.shape.size());
    bool named = false;
    for (int i = 0; i < tt.shape().dim_size(); ++i) {
      const auto& d = tt.shape().dim(i);
      const int64_t ours = v.shape[static_cast<size_t>(i)];
      if (d.has_dim_value() && ours >= 0 && d.dim_value() != ours)
        return invalid_argument(where + ": output '" + printable(name) + "' has shape " + ir::shape_to_string(v.shape) +
                                " by K3's rule but dim " + std::to_string(i) + " = " + std::to_string(d.dim_value()) +
                                " by ONNX shape inference");
      if (ours < 0 && d.has_dim_param()) {
        params[static_cast<size_t>(i)] = d.dim_param();
        named = true;
      }
    }
    if (named) v.dim_params = std::move(params);
    return Status();
  }

  Status add_node(const NodeProto& n) {
    const std::string label = n.name().empty() ? (n.output_size() > 0 ? n.output(0) : std::string("?")) : n.name();
    const std::string where = "node '" + printable(label) + "' (" + printable(n.op_type()) + ")";
    const OnnxOpInfo* info = find_onnx_op(n.domain(), n.op_type());
    if (info == nullptr)
      return unimplemented(
          where + ": unknown op" +
          (is_default_onnx_domain(n.domain()) ? std::string() : " in domain '" + printable(n.domain()) + "'"));
    if (info->support != OpSupport::kImportable)
      return unimplemented(where + ": not supported (" + std::string(info->note) + ")");
    if (n.op_type() == "Constant") return constant(n, where);
    if (n.op_type() == "Identity" || n.op_type() == "Dropout") {
      if (n.input_size() < 1 || !ids_.count(n.input(0))) return invalid_argument(where + " has no input");
      if (n.op_type() == "Dropout" && n.input_size() > 2 && !n.input(2).empty())
        return unimplemented(where + ": training_mode input is not supported (inference only)");
      if (n.output_size() > 1 && !n.output(1).empty())
        return unimplemented(where + ": the mask output is not supported");
      ids_[n.output(0)] = ids_.at(n.input(0));
      return Status();
    }
    const OnnxOpKind* kind = find_kind(n.op_type());
    if (kind == nullptr) return internal_error(where + ": importable op without an IR op");
    std::vector<int> inputs;
    for (const std::string& in : n.input()) {
      if (in.empty()) {
        inputs.push_back(-1);
        continue;
      }
      auto it = ids_.find(in);
      if (it == ids_.end()) return data_loss(where + " reads '" + printable(in) + "', which is not defined before it");
      inputs.push_back(it->second);
    }
    while (!inputs.empty() && inputs.back() < 0) inputs.pop_back();
    K3_ASSIGN_OR_RETURN(std::vector<ir::Attr> at, attrs(n, where));
    const int64_t opset = m_.opset();
    ir::Node probe{kind->kind, label, {}, {}, at};
    if (n.op_type() == "Split" && probe.find_attr("num_outputs") == nullptr)
      at.push_back({"num_outputs", static_cast<int64_t>(n.output_size())});
    if ((n.op_type() == "Softmax" || n.op_type() == "LogSoftmax") && opset < 13) {
      // Before opset 13 these flatten to 2-D at `axis` (default 1); that is
      // the opset-13 meaning only when axis is the last dim.
      const int64_t axis = probe.attr_int("axis", 1);
      const int64_t r =
          inputs.empty() || inputs[0] < 0 ? 0 : static_cast<int64_t>(graph_.value(inputs[0]).shape.size());
      if (axis != -1 && axis != r - 1)
        return unimplemented(where + ": opset " + std::to_string(opset) + " semantics with axis " +
                             std::to_string(axis) + " are not supported (re-export with opset >= 13)");
      std::erase_if(at, [](const ir::Attr& a) { return a.name == "axis"; });
      at.push_back({"axis", int64_t{-1}});
    }
    auto outs = graph_.add_node(kind->kind, label, std::move(inputs), std::move(at), n.output_size());
    if (!outs.ok()) return Status(outs.status().code(), where + ": " + outs.status().message());
    for (int o = 0; o < n.output_size(); ++o) {
      const std::string& name = n.output(o);
      if (name.empty()) continue;
      const int id = (*outs)[static_cast<size_t>(o)];
      ir::Value& v = graph_.values()[static_cast<size_t>(id)];
      v.name = name;
      if (opt_.check_inferred_types) K3_RETURN_IF_ERROR(check_inferred(name, v, where));
      ids_[name] = id;
    }
    return Status();
  }

  const OnnxModel& m_;
  ImportOptions opt_;
  ir::Graph graph_;
  std::unordered_map<std::string, int> ids_;
};

}  // namespace

StatusOr<ir::Graph> import_onnx(const OnnxModel& model, const ImportOptions& options) {
  Importer imp(model, options);
  return imp.run();
}

}  // namespace k3::onnxfe
