// Tests of the ONNX importer and the O0 interpreter on small graphs built in
// C++: broadcasting, negative axes, symbolic dims, dtypes the ONNX node tests
// miss (f16 arithmetic, i8, bool), data-dependent shapes, and bad input
// (unknown ops, control flow, invalid attributes, bad run-time inputs,
// truncated tensor files) that must give one-line errors, never crashes.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "frontend/onnx/import.h"
#include "frontend/onnx/onnx_builder.h"
#include "frontend/onnx/tensor_proto.h"
#include "runtime/interp/interpreter.h"
#include "runtime/plan.h"
#include "util/half.h"

namespace {

using k3::ir::DType;
using k3::ir::Tensor;
using k3::runtime::interp::Interpreter;
using k3::runtime::interp::NamedTensor;
using k3::test::Dim;
using k3::test::OnnxBuilder;
using ::testing::HasSubstr;

constexpr int32_t F = OnnxBuilder::FLOAT;
constexpr int32_t I64 = OnnxBuilder::INT64;
constexpr int32_t I32 = ::onnx::TensorProto::INT32;
constexpr int32_t I8 = ::onnx::TensorProto::INT8;
constexpr int32_t F16 = ::onnx::TensorProto::FLOAT16;
constexpr int32_t BOOL = ::onnx::TensorProto::BOOL;

template <typename T>
Tensor make(DType dt, std::vector<int64_t> shape, const std::vector<T>& v) {
  Tensor t = *Tensor::zeros(dt, std::move(shape));
  EXPECT_EQ(t.nbytes(), v.size() * sizeof(T));
  std::memcpy(t.raw_mut(), v.data(), t.nbytes());
  return t;
}
Tensor f32(std::vector<int64_t> shape, const std::vector<float>& v) {
  return make(DType::kF32, std::move(shape), v);
}

template <typename T>
std::vector<T> values(const Tensor& t) {
  std::vector<T> v(static_cast<size_t>(t.numel()));
  std::memcpy(v.data(), t.raw(), t.nbytes());
  return v;
}

k3::StatusOr<k3::ir::Graph> import(const OnnxBuilder& b) {
  auto m = k3::onnxfe::OnnxModel::from_proto(b.model());
  if (!m.ok()) return m.status();
  return k3::onnxfe::import_onnx(*m);
}

k3::StatusOr<Interpreter> load(const OnnxBuilder& b) {
  auto g = import(b);
  if (!g.ok()) return g.status();
  return Interpreter::create(std::move(*g));
}

// Runs and returns the first output (fails the test on error).
Tensor run1(const Interpreter& it, const std::vector<NamedTensor>& in) {
  auto r = it.run(in);
  EXPECT_TRUE(r.ok()) << r.status().message();
  if (!r.ok()) return Tensor();
  return (*r)[0].tensor;
}

std::string import_error(const OnnxBuilder& b) {
  auto g = import(b);
  EXPECT_FALSE(g.ok());
  if (g.ok()) return "";
  EXPECT_EQ(g.status().message().find('\n'), std::string::npos);
  return g.status().message();
}

// ---- Symbolic dims and broadcasting ----------------------------------------

TEST(OnnxImport, SymbolicDimsBroadcastAndRunAtAnySize) {
  OnnxBuilder b;
  b.input("x", F, {"batch", 1, 3});
  b.input("y", F, {4, 1});
  b.node("Add", {"x", "y"}, {"z"}, "add");
  b.output("z");
  auto g = import(b);
  ASSERT_TRUE(g.ok()) << g.status().message();
  const k3::ir::Value& z = g->value(g->find_value("z"));
  EXPECT_EQ(z.shape, (std::vector<int64_t>{-1, 4, 3}));
  ASSERT_EQ(z.dim_params.size(), 3u);
  EXPECT_EQ(z.dim_params[0], "batch");  // taken from ONNX shape inference
  ASSERT_TRUE(g->verify().ok());
  auto it = Interpreter::create(std::move(*g));
  ASSERT_TRUE(it.ok()) << it.status().message();
  for (int64_t batch : {1, 3}) {
    std::vector<float> xv(static_cast<size_t>(batch * 3));
    for (size_t i = 0; i < xv.size(); ++i) xv[i] = static_cast<float>(i);
    Tensor out = run1(*it, {{"x", f32({batch, 1, 3}, xv)}, {"y", f32({4, 1}, {100, 200, 300, 400})}});
    ASSERT_EQ(out.shape(), (std::vector<int64_t>{batch, 4, 3}));
    const auto v = values<float>(out);
    for (int64_t bi = 0; bi < batch; ++bi)
      for (int64_t j = 0; j < 4; ++j)
        for (int64_t k = 0; k < 3; ++k)
          EXPECT_EQ(v[static_cast<size_t>((bi * 4 + j) * 3 + k)], static_cast<float>(bi * 3 + k + 100 * (j + 1)));
  }
}

TEST(OnnxImport, InterpreterChecksInputs) {
  OnnxBuilder b;
  b.input("x", F, {"n", 2});
  b.input("y", F, {"n", 2});
  b.node("Mul", {"x", "y"}, {"z"}, "mul");
  b.output("z");
  auto it = load(b);
  ASSERT_TRUE(it.ok()) << it.status().message();
  const Tensor a = f32({1, 2}, {1, 2}), c = f32({2, 2}, {1, 2, 3, 4});
  EXPECT_THAT(it->run({{"x", a}}).status().message(), HasSubstr("'y' is missing"));
  EXPECT_THAT(it->run({{"x", a}, {"y", c}}).status().message(), HasSubstr("dim 'n'"));
  EXPECT_THAT(it->run({{"x", f32({2}, {1, 2})}, {"y", a}}).status().message(), HasSubstr("must have shape"));
  EXPECT_THAT(it->run({{"x", f32({1, 3}, {1, 2, 3})}, {"y", a}}).status().message(), HasSubstr("must have shape"));
  EXPECT_THAT(it->run({{"x", make<int64_t>(DType::kI64, {1, 2}, {1, 2})}, {"y", a}}).status().message(),
              HasSubstr("must be f32"));
  EXPECT_THAT(it->run({{"x", a}, {"y", a}, {"w", a}}).status().message(), HasSubstr("no input named 'w'"));
}

// ---- Negative axes -----------------------------------------------------------

TEST(OnnxImport, NegativeAxes) {
  OnnxBuilder b;
  b.input("x", F, {2, 3});
  OnnxBuilder::attr_int(b.node("Softmax", {"x"}, {"s"}, "softmax"), "axis", -2);
  OnnxBuilder::attr_int(b.node("ReduceSum", {"s", b.const_i64("ax", {-1})}, {"r"}, "sum"), "keepdims", 0);
  OnnxBuilder::attr_int(b.node("Gather", {"x", b.const_i64("idx", {-1, 0})}, {"g"}, "gather"), "axis", -1);
  OnnxBuilder::attr_int(b.node("Concat", {"x", "x"}, {"c"}, "concat"), "axis", -1);
  b.node("Unsqueeze", {"r", b.const_i64("uax", {-1})}, {"u"}, "unsq");
  b.output("r");
  b.output("g");
  b.output("c");
  b.output("u");
  auto it = load(b);
  ASSERT_TRUE(it.ok()) << it.status().message();
  auto r = it->run({{"x", f32({2, 3}, {0, 1, 2, 3, 4, 5})}});
  ASSERT_TRUE(r.ok()) << r.status().message();
  // softmax over axis 0: each column sums to 1, so each row sum r[i] + r[1-i] = 3.
  const auto sums = values<float>((*r)[0].tensor);
  ASSERT_EQ(sums.size(), 2u);
  EXPECT_NEAR(sums[0] + sums[1], 3.0f, 1e-5);
  EXPECT_NEAR(sums[0], 3.0f / (1.0f + std::exp(3.0f)), 1e-5);
  EXPECT_EQ(values<float>((*r)[1].tensor), (std::vector<float>{2, 0, 5, 3}));
  EXPECT_EQ((*r)[2].tensor.shape(), (std::vector<int64_t>{2, 6}));
  EXPECT_EQ(values<float>((*r)[2].tensor), (std::vector<float>{0, 1, 2, 0, 1, 2, 3, 4, 5, 3, 4, 5}));
  EXPECT_EQ((*r)[3].tensor.shape(), (std::vector<int64_t>{2, 1}));
}

// ---- Dtypes the node tests miss ----------------------------------------------

TEST(OnnxImport, HalfArithmeticBoolAndInt8) {
  OnnxBuilder b;
  b.input("h", F16, {3});
  b.input("i", I8, {3});
  b.input("j", I32, {3});
  b.node("Add", {"h", "h"}, {"h2"}, "add_f16");
  b.node("Mul", {"i", "i"}, {"i2"}, "mul_i8");  // wraps modulo 256
  auto& cast = b.node("Cast", {"j"}, {"jb"}, "to_bool");
  OnnxBuilder::attr_int(cast, "to", BOOL);
  b.node("Where", {"jb", "h2", "h"}, {"w"}, "where");
  b.output("h2", F16);
  b.output("i2", I8);
  b.output("w", F16);
  auto it = load(b);
  ASSERT_TRUE(it.ok()) << it.status().message();
  std::vector<uint16_t> hv = {k3::f32_to_f16(1.5f), k3::f32_to_f16(-2.25f), k3::f32_to_f16(1000.0f)};
  auto r = it->run({{"h", make(DType::kF16, {3}, hv)},
                    {"i", make<int8_t>(DType::kI8, {3}, {100, -3, 16})},
                    {"j", make<int32_t>(DType::kI32, {3}, {0, 7, -1})}});
  ASSERT_TRUE(r.ok()) << r.status().message();
  const auto h2 = values<uint16_t>((*r)[0].tensor);
  EXPECT_EQ(k3::f16_to_f32(h2[0]), 3.0f);
  EXPECT_EQ(k3::f16_to_f32(h2[1]), -4.5f);
  EXPECT_EQ(k3::f16_to_f32(h2[2]), 2000.0f);
  EXPECT_EQ(values<int8_t>((*r)[1].tensor), (std::vector<int8_t>{16, 9, 0}));  // 10000 mod 256 = 16
  const auto w = values<uint16_t>((*r)[2].tensor);
  EXPECT_EQ(k3::f16_to_f32(w[0]), 1.5f);   // j=0 -> false -> h
  EXPECT_EQ(k3::f16_to_f32(w[1]), -4.5f);  // true -> h2
  EXPECT_EQ(k3::f16_to_f32(w[2]), 2000.0f);
}

TEST(OnnxImport, GeluBothForms) {
  for (const char* form : {"none", "tanh"}) {
    OnnxBuilder b(20);
    b.input("x", F, {4});
    auto& n = b.node("Gelu", {"x"}, {"y"}, "gelu");
    auto* a = n.add_attribute();
    a->set_name("approximate");
    a->set_type(::onnx::AttributeProto::STRING);
    a->set_s(form);
    b.output("y");
    auto it = load(b);
    ASSERT_TRUE(it.ok()) << it.status().message();
    const std::vector<float> x = {-3.0f, -0.5f, 0.0f, 2.0f};
    const auto y = values<float>(run1(*it, {{"x", f32({4}, x)}}));
    for (size_t i = 0; i < x.size(); ++i) {
      const double v = x[i];
      const double want = std::string(form) == "tanh"
                              ? 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)))
                              : 0.5 * v * (1 + std::erf(v / std::sqrt(2.0)));
      EXPECT_NEAR(y[i], want, 1e-6) << form << " " << v;
    }
  }
}

// RMSNormalization is an opset-23 op, newer than the ONNX node test data:
// imported and run against a hand computation (scale broadcast over the
// normalized dims, epsilon attribute).
TEST(OnnxImport, RMSNormalizationOpset23) {
  OnnxBuilder b(23);
  b.input("x", F, {2, 3});
  b.init_f32("scale", {3}, {0.5f, -1.0f, 2.0f});
  auto& n = b.node("RMSNormalization", {"x", "scale"}, {"y"}, "rms");
  auto* a = n.add_attribute();
  a->set_name("epsilon");
  a->set_type(::onnx::AttributeProto::FLOAT);
  a->set_f(0.25f);
  b.output("y");
  auto it = load(b);
  ASSERT_TRUE(it.ok()) << it.status().message();
  const std::vector<float> x = {1, 2, 3, -4, 0, 4};
  const auto y = values<float>(run1(*it, {{"x", f32({2, 3}, x)}}));
  const double scale[3] = {0.5, -1.0, 2.0};
  for (size_t r = 0; r < 2; ++r) {
    double ms = 0;
    for (size_t i = 0; i < 3; ++i) ms += double(x[3 * r + i]) * x[3 * r + i] / 3;
    for (size_t i = 0; i < 3; ++i)
      EXPECT_NEAR(y[3 * r + i], x[3 * r + i] / std::sqrt(ms + 0.25) * scale[i], 1e-6) << r << " " << i;
  }
}

TEST(OnnxImport, NonZeroHasADataDependentShape) {
  OnnxBuilder b;
  b.input("x", F, {"n"});
  b.node("NonZero", {"x"}, {"nz"}, "nonzero");
  b.output("nz", I64);
  auto g = import(b);
  ASSERT_TRUE(g.ok()) << g.status().message();
  EXPECT_EQ(g->value(g->find_value("nz")).shape, (std::vector<int64_t>{1, -1}));
  auto it = Interpreter::create(std::move(*g));
  ASSERT_TRUE(it.ok());
  EXPECT_EQ(values<int64_t>(run1(*it, {{"x", f32({5}, {0, 1, 0, 2, 3})}})), (std::vector<int64_t>{1, 3, 4}));
  EXPECT_EQ(run1(*it, {{"x", f32({2}, {0, 0})}}).shape(), (std::vector<int64_t>{1, 0}));
}

TEST(OnnxImport, OutputsMayBeWeightsOrPassThroughIdentity) {
  OnnxBuilder b;
  b.input("x", F, {2});
  b.init_f32("w", {2}, {7, 8});
  b.node("Relu", {"x"}, {"r"}, "relu");
  b.node("Identity", {"r"}, {"y"}, "id");
  b.output("w");
  b.output("y");
  std::vector<NamedTensor> out;
  {
    auto it = load(b);
    ASSERT_TRUE(it.ok()) << it.status().message();
    auto r = it->run({{"x", f32({2}, {-1, 2})}});
    ASSERT_TRUE(r.ok()) << r.status().message();
    out = std::move(*r);
  }  // the interpreter (and its graph's weights) are gone; outputs stay valid
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].name, "w");
  EXPECT_EQ(values<float>(out[0].tensor), (std::vector<float>{7, 8}));
  EXPECT_EQ(out[1].name, "y");
  EXPECT_EQ(values<float>(out[1].tensor), (std::vector<float>{0, 2}));
}

TEST(OnnxImport, StaticPlanRejectsOnnxOps) {
  OnnxBuilder b;
  b.input("x", F, {2});
  b.node("Relu", {"x"}, {"y"}, "relu");
  b.output("y");
  auto g = import(b);
  ASSERT_TRUE(g.ok());
  k3::runtime::KvCache cache;
  auto p = k3::runtime::Plan::build(std::move(*g), cache);
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(p.status().message(), HasSubstr("onnx.Relu is not supported by the static plan"));
}

// ---- Bad input -----------------------------------------------------------------

TEST(OnnxImportErrors, UnknownOpAndDomain) {
  OnnxBuilder b;
  b.input("x", F, {2});
  b.node("FrobnicateV2", {"x"}, {"y"}, "frob");
  b.output("y");
  EXPECT_THAT(import_error(b), HasSubstr("node 'frob' (FrobnicateV2): unknown op"));
  OnnxBuilder c;
  c.opset_import("com.microsoft", 1);
  c.input("x", F, {2});
  c.node("Gelu", {"x"}, {"y"}, "ms_gelu").set_domain("com.microsoft");
  c.output("y");
  EXPECT_THAT(import_error(c), HasSubstr("in domain 'com.microsoft'"));
}

TEST(OnnxImportErrors, ControlFlow) {
  OnnxBuilder b;
  b.input("c", BOOL, {});
  OnnxBuilder then_b;
  then_b.input("x", F, {1});
  then_b.output("x");
  auto& n = b.node("If", {"c"}, {"y"}, "branch");
  OnnxBuilder::attr_graph(n, "then_branch", then_b.model().graph());
  OnnxBuilder::attr_graph(n, "else_branch", then_b.model().graph());
  b.output("y");
  auto m = k3::onnxfe::OnnxModel::from_proto(b.model());
  ASSERT_TRUE(m.ok()) << m.status().message();
  auto g = k3::onnxfe::import_onnx(*m);
  ASSERT_FALSE(g.ok());
  EXPECT_THAT(g.status().message(), HasSubstr("node 'branch' (If): not supported (control flow)"));
}

TEST(OnnxImportErrors, InvalidAttributes) {
  {
    OnnxBuilder b;
    b.input("x", F, {2, 3});
    OnnxBuilder::attr_ints(b.node("Transpose", {"x"}, {"y"}, "tr"), "perm", {0, 0});
    b.output("y");
    EXPECT_THAT(import_error(b), HasSubstr("is not a permutation"));
  }
  {
    OnnxBuilder b;
    b.input("x", F, {2, 3});
    b.node("Unsqueeze", {"x", b.const_i64("ax", {5})}, {"y"}, "unsq");
    b.output("y");
    EXPECT_THAT(import_error(b), HasSubstr("out of range"));
  }
  {
    OnnxBuilder b;
    b.input("x", F, {2, 3});
    OnnxBuilder::attr_int(b.node("Softmax", {"x"}, {"y"}, "sm"), "axis", -3);
    b.output("y");
    EXPECT_THAT(import_error(b), HasSubstr("axis -3 is out of range for rank 2"));
  }
  {
    OnnxBuilder b;
    b.input("x", F, {2, 3});
    b.node("Reshape", {"x", b.const_i64("shape", {4, -1, 5})}, {"y"}, "rs");
    b.output("y");
    EXPECT_THAT(import_error(b), HasSubstr("cannot reshape"));
  }
  {
    OnnxBuilder b;
    b.input("x", F, {2, 3});
    b.input("y", F, {4, 3});
    b.node("Add", {"x", "y"}, {"z"}, "add");
    b.output("z");
    EXPECT_THAT(import_error(b), HasSubstr("do not broadcast"));
  }
}

TEST(OnnxImportErrors, OutOfRangeIndexAtRunTime) {
  OnnxBuilder b;
  b.input("x", F, {3});
  b.input("i", I64, {1});
  b.node("Gather", {"x", "i"}, {"y"}, "gather");
  b.output("y");
  auto it = load(b);
  ASSERT_TRUE(it.ok());
  auto r = it->run({{"x", f32({3}, {1, 2, 3})}, {"i", make<int64_t>(DType::kI64, {1}, {7})}});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("node gather (onnx.Gather): index 7 is out of range"));
  r = it->run({{"x", f32({3}, {1, 2, 3})}, {"i", make<int64_t>(DType::kI64, {1}, {-3})}});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(values<float>((*r)[0].tensor), (std::vector<float>{1}));
}

TEST(OnnxImportErrors, TruncatedTensorFile) {
  const std::string dir = ::testing::TempDir();
  const std::string path = dir + "/k3_trunc_" + std::to_string(::getpid()) + ".pb";
  ASSERT_TRUE(k3::onnxfe::write_tensor_pb(path, f32({4, 4}, std::vector<float>(16, 1.0f)), "t").ok());
  auto ok = k3::onnxfe::read_tensor_pb(path);
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  EXPECT_EQ(ok->shape(), (std::vector<int64_t>{4, 4}));
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  for (size_t cut : {bytes.size() - 5, bytes.size() / 2, size_t{3}}) {
    std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), static_cast<std::streamsize>(cut));
    auto r = k3::onnxfe::read_tensor_pb(path);
    EXPECT_FALSE(r.ok()) << cut;
  }
  EXPECT_FALSE(k3::onnxfe::read_tensor_pb(dir + "/does_not_exist.pb").ok());
  std::filesystem::remove(path);
}

}  // namespace
