// Building small ONNX ModelProtos in C++ for tests (no Python needed).
//
//   OnnxBuilder b;
//   b.input("x", FLOAT, {"batch", 64});
//   std::string w = b.init_f32("w", {64, 64});
//   b.node("MatMul", {"x", w}, {"y"}, "mm");
//   b.output("y", FLOAT);
//   onnx::ModelProto m = b.model();
#pragma once

#include <onnx/onnx_pb.h>

#include <cstdint>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace k3::test {

// One dim of a graph input/output: a number, a symbolic name, or unknown.
struct Dim {
  Dim(int64_t v) : value(v) {}      // NOLINT: implicit so {"batch", 64} reads naturally
  Dim(int v) : value(v) {}          // NOLINT
  Dim(const char* p) : param(p) {}  // NOLINT
  static Dim unknown() { return Dim(-1); }
  int64_t value = -1;  // < 0 and no param: neither dim_value nor dim_param
  std::string param;
};

class OnnxBuilder {
 public:
  static constexpr int32_t FLOAT = ::onnx::TensorProto::FLOAT;
  static constexpr int32_t INT64 = ::onnx::TensorProto::INT64;

  explicit OnnxBuilder(int64_t opset = 17) {
    model_.set_ir_version(8);
    model_.set_producer_name("k3-test");
    opset_import("", opset);
    model_.mutable_graph()->set_name("test");
  }

  ::onnx::GraphProto& graph() { return *model_.mutable_graph(); }
  void opset_import(const std::string& domain, int64_t version) {
    auto* op = model_.add_opset_import();
    op->set_domain(domain);
    op->set_version(version);
  }

  // Graph input; no_shape declares the element type only (rank unknown).
  void input(const std::string& name, int32_t type, const std::vector<Dim>& dims, bool no_shape = false) {
    fill_value_info(graph().add_input(), name, type, dims, no_shape);
  }
  // Graph output with no shape: shape inference fills it in.
  void output(const std::string& name, int32_t type = FLOAT) {
    fill_value_info(graph().add_output(), name, type, {}, true);
  }

  // Float initializer; values default to 0.01 * index.
  std::string init_f32(const std::string& name, const std::vector<int64_t>& dims, std::vector<float> values = {}) {
    auto* t = graph().add_initializer();
    t->set_name(name);
    t->set_data_type(FLOAT);
    int64_t n = 1;
    for (int64_t d : dims) {
      t->add_dims(d);
      n *= d;
    }
    if (values.empty())
      for (int64_t i = 0; i < n; ++i) values.push_back(0.01f * static_cast<float>(i));
    t->set_raw_data(std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float)));
    return name;
  }
  std::string init_i64(const std::string& name, const std::vector<int64_t>& values) {
    auto* t = graph().add_initializer();
    t->set_name(name);
    t->set_data_type(INT64);
    t->add_dims(static_cast<int64_t>(values.size()));
    for (int64_t v : values) t->add_int64_data(v);
    return name;
  }

  ::onnx::NodeProto& node(const std::string& op, const std::vector<std::string>& inputs,
                          const std::vector<std::string>& outputs, const std::string& name = "") {
    auto* n = graph().add_node();
    n->set_op_type(op);
    n->set_name(name);
    for (const auto& i : inputs) n->add_input(i);
    for (const auto& o : outputs) n->add_output(o);
    return *n;
  }

  // Constant node producing a scalar float / an int64 vector; returns the output name.
  std::string const_f32(const std::string& out, float v) {
    auto& n = node("Constant", {}, {out}, out + "_node");
    auto* a = n.add_attribute();
    a->set_name("value");
    a->set_type(::onnx::AttributeProto::TENSOR);
    a->mutable_t()->set_data_type(FLOAT);
    a->mutable_t()->add_float_data(v);
    return out;
  }
  std::string const_i64(const std::string& out, const std::vector<int64_t>& v) {
    auto& n = node("Constant", {}, {out}, out + "_node");
    auto* a = n.add_attribute();
    a->set_name("value");
    a->set_type(::onnx::AttributeProto::TENSOR);
    a->mutable_t()->set_data_type(INT64);
    a->mutable_t()->add_dims(static_cast<int64_t>(v.size()));
    for (int64_t x : v) a->mutable_t()->add_int64_data(x);
    return out;
  }

  static void attr_int(::onnx::NodeProto& n, const std::string& name, int64_t v) {
    auto* a = n.add_attribute();
    a->set_name(name);
    a->set_type(::onnx::AttributeProto::INT);
    a->set_i(v);
  }
  static void attr_ints(::onnx::NodeProto& n, const std::string& name, const std::vector<int64_t>& v) {
    auto* a = n.add_attribute();
    a->set_name(name);
    a->set_type(::onnx::AttributeProto::INTS);
    for (int64_t x : v) a->add_ints(x);
  }
  static void attr_graph(::onnx::NodeProto& n, const std::string& name, const ::onnx::GraphProto& g) {
    auto* a = n.add_attribute();
    a->set_name(name);
    a->set_type(::onnx::AttributeProto::GRAPH);
    *a->mutable_g() = g;
  }

  const ::onnx::ModelProto& model() const { return model_; }
  std::string serialize() const { return model_.SerializeAsString(); }

 private:
  static void fill_value_info(::onnx::ValueInfoProto* v, const std::string& name, int32_t type,
                              const std::vector<Dim>& dims, bool no_shape) {
    v->set_name(name);
    auto* tt = v->mutable_type()->mutable_tensor_type();
    tt->set_elem_type(type);
    if (no_shape) return;
    auto* shape = tt->mutable_shape();
    for (const Dim& d : dims) {
      auto* dim = shape->add_dim();
      if (!d.param.empty())
        dim->set_dim_param(d.param);
      else if (d.value >= 0)
        dim->set_dim_value(d.value);
    }
  }

  ::onnx::ModelProto model_;
};

}  // namespace k3::test
