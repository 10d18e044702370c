// Tests for src/frontend/onnx: the loader (bad files give a one-line Status,
// never a crash) and every `k3 lint` rule, each on a crafted graph that
// should fire it plus negative cases that must stay quiet.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "frontend/onnx/lint.h"
#include "frontend/onnx/onnx_builder.h"
#include "frontend/onnx/onnx_model.h"
#include "frontend/onnx/supported_ops.h"

namespace {

namespace fs = std::filesystem;
using k3::onnxfe::Finding;
using k3::onnxfe::OnnxModel;
using k3::onnxfe::Severity;
using k3::test::Dim;
using k3::test::OnnxBuilder;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr int32_t F = OnnxBuilder::FLOAT;
constexpr int32_t I64 = OnnxBuilder::INT64;

// A fresh directory under the system temp dir, removed with its contents.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    path_ =
        fs::temp_directory_path() / ("k3_test_onnx_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string write(const std::string& name, const std::string& bytes) const {
    const std::string p = (path_ / name).string();
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    return p;
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

std::vector<Finding> lint(const OnnxBuilder& b) {
  auto m = OnnxModel::from_proto(b.model());
  EXPECT_TRUE(m.ok()) << m.status().message();
  if (!m.ok()) return {};
  return k3::onnxfe::lint_model(*m);
}

std::vector<Finding> with_rule(const std::vector<Finding>& all, const std::string& rule) {
  std::vector<Finding> r;
  for (const Finding& f : all)
    if (f.rule == rule) r.push_back(f);
  return r;
}

std::string dump(const std::vector<Finding>& f) {
  return k3::onnxfe::format_findings_text(f);
}

// Exactly one finding of `rule`, on `node` with `op`, at `severity`.
void expect_one(const std::vector<Finding>& all, const std::string& rule, const std::string& node,
                const std::string& op, Severity severity) {
  auto r = with_rule(all, rule);
  ASSERT_EQ(r.size(), 1u) << dump(all);
  EXPECT_EQ(r[0].node, node) << dump(all);
  EXPECT_EQ(r[0].op_type, op) << dump(all);
  EXPECT_EQ(r[0].severity, severity) << dump(all);
}

// x / sqrt(2) -> Erf -> + 1 -> * x -> * 0.5, PyTorch's export of F.gelu.
std::string add_gelu(OnnxBuilder& b, const std::string& x, const std::string& p, float div = std::sqrt(2.0f),
                     float one = 1.0f, float half = 0.5f) {
  const std::string c_div = b.const_f32(p + "c_div", div);
  const std::string c_one = b.const_f32(p + "c_one", one);
  const std::string c_half = b.const_f32(p + "c_half", half);
  b.node("Div", {x, c_div}, {p + "d"}, p + "div");
  b.node("Erf", {p + "d"}, {p + "e"}, p + "erf");
  b.node("Add", {p + "e", c_one}, {p + "a"}, p + "add");
  b.node("Mul", {x, p + "a"}, {p + "m"}, p + "mul");
  b.node("Mul", {p + "m", c_half}, {p + "out"}, p + "mul_half");
  return p + "out";
}

// (x - mean) / sqrt(var + eps) * gamma + beta, as PyTorch decomposes LayerNorm.
std::string add_decomposed_ln(OnnxBuilder& b, const std::string& x, const std::string& p, int64_t d) {
  OnnxBuilder::attr_ints(b.node("ReduceMean", {x}, {p + "mean"}, p + "mean"), "axes", {-1});
  b.node("Sub", {x, p + "mean"}, {p + "xc"}, p + "sub");
  b.node("Pow", {p + "xc", b.const_f32(p + "two", 2.0f)}, {p + "sq"}, p + "pow");
  OnnxBuilder::attr_ints(b.node("ReduceMean", {p + "sq"}, {p + "var"}, p + "var"), "axes", {-1});
  b.node("Add", {p + "var", b.const_f32(p + "eps", 1e-5f)}, {p + "vare"}, p + "add_eps");
  b.node("Sqrt", {p + "vare"}, {p + "std"}, p + "sqrt");
  b.node("Div", {p + "xc", p + "std"}, {p + "norm"}, p + "div");
  b.node("Mul", {p + "norm", b.init_f32(p + "gamma", {d})}, {p + "scaled"}, p + "mul_gamma");
  b.node("Add", {p + "scaled", b.init_f32(p + "beta", {d})}, {p + "out"}, p + "add_beta");
  return p + "out";
}

std::string add_layer_norm_op(OnnxBuilder& b, const std::string& x, const std::string& name, int64_t d) {
  b.node("LayerNormalization", {x, b.init_f32(name + "_gamma", {d}), b.init_f32(name + "_beta", {d})}, {name + "_out"},
         name);
  return name + "_out";
}

// ---- Loader ----------------------------------------------------------------

OnnxBuilder small_valid_model() {
  OnnxBuilder b;
  b.input("x", F, {2, 8});
  b.node("MatMul", {"x", b.init_f32("w", {8, 8})}, {"h"}, "mm");
  b.node("Add", {"h", b.init_f32("bias", {8})}, {"y"}, "add");
  b.output("y");
  return b;
}

TEST(OnnxLoad, ValidFileLoadsAndShapesAreInferred) {
  TempDir dir;
  const std::string path = dir.write("m.onnx", small_valid_model().serialize());
  auto m = OnnxModel::load(path);
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ(m->opset(), 17);
  EXPECT_TRUE(m->shape_inference_error().empty()) << m->shape_inference_error();
  const auto* t = m->find_type("h");  // intermediate: only known through inference
  ASSERT_NE(t, nullptr);
  ASSERT_TRUE(t->tensor_type().has_shape());
  EXPECT_EQ(t->tensor_type().shape().dim_size(), 2);
  EXPECT_EQ(t->tensor_type().shape().dim(1).dim_value(), 8);
}

TEST(OnnxLoad, MissingFile) {
  auto m = OnnxModel::load("/nonexistent/dir/model.onnx");
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(m.status().message(), HasSubstr("/nonexistent/dir/model.onnx"));
}

TEST(OnnxLoad, EmptyFile) {
  TempDir dir;
  auto m = OnnxModel::load(dir.write("empty.onnx", ""));
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(m.status().message(), HasSubstr("empty"));
}

TEST(OnnxLoad, GarbageBytes) {
  TempDir dir;
  std::string garbage;
  for (int i = 0; i < 4096; ++i) garbage += static_cast<char>((i * 7919 + 13) & 0xff);
  auto m = OnnxModel::load(dir.write("garbage.onnx", garbage));
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(m.status().message(), HasSubstr("not an ONNX model"));
  // Text parses as protobuf surprisingly often; it must still be rejected.
  auto t = OnnxModel::load(dir.write("text.onnx", "{\"this\": \"is json, not onnx\"}\n"));
  EXPECT_FALSE(t.ok());
}

TEST(OnnxLoad, MessagesAreOneLine) {
  TempDir dir;
  auto m = OnnxModel::load(dir.write("garbage.onnx", std::string("\x0a\x05hello\nworld", 13)));
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().message().find('\n'), std::string::npos) << m.status().message();
}

TEST(OnnxLoad, TruncatedModel) {
  TempDir dir;
  const std::string bytes = small_valid_model().serialize();
  auto half = OnnxModel::load(dir.write("half.onnx", bytes.substr(0, bytes.size() / 2)));
  ASSERT_FALSE(half.ok());
  // Every prefix: never a crash, and never a model missing its tail silently
  // (a prefix that parses must still pass validation, i.e. be a full model).
  int accepted = 0;
  for (size_t n = 1; n < bytes.size(); ++n) {
    auto m = OnnxModel::parse(bytes.data(), n);
    if (m.ok()) ++accepted;
  }
  EXPECT_EQ(accepted, 0);
}

TEST(OnnxLoad, CorruptedBytesNeverCrash) {
  const std::string bytes = small_valid_model().serialize();
  uint32_t state = 12345;
  for (int trial = 0; trial < 300; ++trial) {
    std::string b = bytes;
    for (int k = 0; k < 3; ++k) {
      state = state * 1664525u + 1013904223u;
      b[(state >> 8) % b.size()] = static_cast<char>(state >> 24);
    }
    auto m = OnnxModel::parse(b.data(), b.size());
    if (m.ok()) (void)k3::onnxfe::lint_model(*m);
  }
}

TEST(OnnxLoad, SizeLimit) {
  const std::string bytes = small_valid_model().serialize();
  k3::onnxfe::OnnxLoadOptions o;
  o.max_file_bytes = 16;
  auto m = OnnxModel::parse(bytes.data(), bytes.size(), o);
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(m.status().message(), HasSubstr("limit"));
}

TEST(OnnxLoad, UndefinedInputRejected) {
  OnnxBuilder b;
  b.input("x", F, {2});
  b.node("Add", {"x", "nowhere"}, {"y"}, "add");
  b.output("y");
  auto m = OnnxModel::from_proto(b.model());
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(m.status().message(), HasSubstr("nowhere"));
}

TEST(OnnxLoad, InitializerPayloadMismatchRejected) {
  OnnxBuilder b;
  b.input("x", F, {4});
  b.node("Add", {"x", b.init_f32("w", {4}, {1, 2, 3})}, {"y"}, "add");  // 3 values for dims [4]
  b.output("y");
  auto m = OnnxModel::from_proto(b.model());
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(m.status().message(), HasSubstr("'w'"));
}

TEST(OnnxLoad, OverflowingDimsRejected) {
  OnnxBuilder b;
  b.input("x", F, {4});
  b.node("Identity", {"x"}, {"y"});
  auto* t = b.graph().add_initializer();
  t->set_name("huge");
  t->set_data_type(F);
  for (int i = 0; i < 4; ++i) t->add_dims(int64_t{1} << 20);
  b.output("y");
  auto m = OnnxModel::from_proto(b.model());
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(m.status().message(), HasSubstr("overflow"));
}

TEST(OnnxLoad, ShapeInferenceConflictIsRecordedNotFatal) {
  OnnxBuilder b;
  b.input("x", F, {2, 8});
  b.node("Relu", {"x"}, {"y"}, "relu");
  // Declared output shape contradicts the inferred [2, 8].
  auto* out = b.graph().add_output();
  out->set_name("y");
  auto* tt = out->mutable_type()->mutable_tensor_type();
  tt->set_elem_type(F);
  tt->mutable_shape()->add_dim()->set_dim_value(3);
  tt->mutable_shape()->add_dim()->set_dim_value(5);
  auto m = OnnxModel::from_proto(b.model());
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_FALSE(m->shape_inference_error().empty());
  EXPECT_EQ(m->shape_inference_error().find('\n'), std::string::npos);
  expect_one(k3::onnxfe::lint_model(*m), "shape-inference", "", "graph", Severity::kWarning);
}

TEST(OnnxLoad, CrashInOnnxShapeInferenceIsContained) {
  // ONNX 1.12 segfaults inferring Expand(r, Shape(r)) with data propagation
  // when r comes from an op without a schema; the child process absorbs it.
  OnnxBuilder b;
  b.input("x", F, {"batch", 4});
  b.node("NotAnOnnxOp", {"x"}, {"r"}, "custom0");
  b.node("Shape", {"r"}, {"s"}, "shape0");
  b.node("Expand", {"r", "s"}, {"y"}, "expand0");
  b.output("y");
  auto m = OnnxModel::from_proto(b.model());
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ(m->shape_inference_error().find('\n'), std::string::npos);
  auto f = k3::onnxfe::lint_model(*m);
  expect_one(f, "unsupported-op", "custom0", "NotAnOnnxOp", Severity::kError);
}

TEST(OnnxLoad, InProcessShapeInference) {
  k3::onnxfe::OnnxLoadOptions o;
  o.isolate_shape_inference = false;
  auto m = OnnxModel::from_proto(small_valid_model().model(), o);
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_TRUE(m->shape_inference_error().empty());
  EXPECT_NE(m->find_type("h"), nullptr);
}

// ---- Lint: negative cases --------------------------------------------------

TEST(OnnxLint, CleanMatMulAddHasNoFindings) {
  auto f = lint(small_valid_model());
  EXPECT_TRUE(f.empty()) << dump(f);
}

TEST(OnnxLint, ReshapeWithInitializerShapeNotFlagged) {
  OnnxBuilder b;
  b.input("x", F, {2, 8});
  b.node("Reshape", {"x", b.init_i64("shape", {4, 4})}, {"y"}, "reshape0");
  b.output("y");
  auto f = lint(b);
  EXPECT_TRUE(f.empty()) << dump(f);
}

TEST(OnnxLint, ReshapeWithConstantConcatShapeNotFlagged) {
  OnnxBuilder b;
  b.input("x", F, {2, 8});
  const std::string c0 = b.const_i64("c0", {4});
  const std::string c1 = b.const_i64("c1", {-1});
  OnnxBuilder::attr_int(b.node("Concat", {c0, c1}, {"shape"}, "concat0"), "axis", 0);
  b.node("Reshape", {"x", "shape"}, {"y"}, "reshape0");
  b.output("y");
  auto f = lint(b);
  EXPECT_TRUE(f.empty()) << dump(f);
}

TEST(OnnxLint, ReshapeWithShapeOfStaticTensorNotFlagged) {
  OnnxBuilder b;
  b.input("x", F, {2, 8});
  b.input("z", F, {16});
  b.node("Shape", {"x"}, {"shape"}, "shape0");
  b.node("Reshape", {"z", "shape"}, {"y"}, "reshape0");
  b.output("y");
  auto f = lint(b);
  EXPECT_TRUE(with_rule(f, "data-dependent-shape").empty()) << dump(f);
}

TEST(OnnxLint, LayerNormDirectlyIntoGeluNotBlocked) {
  OnnxBuilder b;
  b.input("x", F, {2, 8});
  const std::string ln = add_decomposed_ln(b, "x", "ln_", 8);
  b.node("Identity", {add_gelu(b, ln, "g_")}, {"y"}, "out");
  b.output("y");
  auto f = lint(b);
  EXPECT_TRUE(f.empty()) << dump(f);
  OnnxBuilder b2;
  b2.input("x", F, {2, 8});
  b2.node("Identity", {add_gelu(b2, add_layer_norm_op(b2, "x", "ln0", 8), "g_")}, {"y"}, "out");
  b2.output("y");
  auto f2 = lint(b2);
  EXPECT_TRUE(f2.empty()) << dump(f2);
}

// ---- Lint: one test per rule -----------------------------------------------

OnnxBuilder if_model() {
  OnnxBuilder b;
  b.input("cond", ::onnx::TensorProto::BOOL, {});
  b.init_f32("outer_w", {2}, {1, 2});  // read only inside the branches
  auto branch = [](const std::string& name) {
    ::onnx::GraphProto g;
    g.set_name(name);
    auto* n = g.add_node();
    n->set_op_type("Identity");
    n->add_input("outer_w");
    n->add_output(name + "_out");
    auto* o = g.add_output();
    o->set_name(name + "_out");
    o->mutable_type()->mutable_tensor_type()->set_elem_type(F);
    o->mutable_type()->mutable_tensor_type()->mutable_shape()->add_dim()->set_dim_value(2);
    return g;
  };
  auto& n = b.node("If", {"cond"}, {"y"}, "if0");
  OnnxBuilder::attr_graph(n, "then_branch", branch("then"));
  OnnxBuilder::attr_graph(n, "else_branch", branch("else"));
  b.output("y");
  return b;
}

TEST(OnnxLint, ControlFlowIsError) {
  auto f = lint(if_model());
  expect_one(f, "control-flow", "if0", "If", Severity::kError);
  EXPECT_TRUE(with_rule(f, "unsupported-op").empty()) << dump(f);      // not reported twice
  EXPECT_TRUE(with_rule(f, "unused-initializer").empty()) << dump(f);  // used by the branches
}

TEST(OnnxLint, ControlFlowModelFromFile) {
  TempDir dir;
  auto m = OnnxModel::load(dir.write("if.onnx", if_model().serialize()));
  ASSERT_TRUE(m.ok()) << m.status().message();
  auto f = k3::onnxfe::lint_model(*m);
  ASSERT_FALSE(f.empty());
  EXPECT_EQ(f[0].severity, Severity::kError);  // errors sort first
  EXPECT_EQ(k3::onnxfe::count_findings(f).error, 1) << dump(f);
}

TEST(OnnxLint, NonZeroIsError) {
  OnnxBuilder b;
  b.input("x", F, {4});
  b.node("NonZero", {"x"}, {"y"}, "nz0");
  b.output("y", I64);
  auto f = lint(b);
  expect_one(f, "data-dependent-shape", "nz0", "NonZero", Severity::kError);
  EXPECT_TRUE(with_rule(f, "unsupported-op").empty()) << dump(f);
}

TEST(OnnxLint, ReshapeWithRuntimeShapeIsWarning) {
  OnnxBuilder b;
  b.input("x", F, {2, 8});
  b.input("shape", I64, {2});
  b.node("Reshape", {"x", "shape"}, {"y"}, "reshape0");
  b.output("y");
  auto f = lint(b);
  expect_one(f, "data-dependent-shape", "reshape0", "Reshape", Severity::kWarning);
  EXPECT_THAT(with_rule(f, "data-dependent-shape")[0].reason, HasSubstr("graph input 'shape'"));
}

TEST(OnnxLint, ExpandToShapeOfDynamicTensorIsWarning) {
  OnnxBuilder b;
  b.input("x", F, {"batch", 8});
  b.input("v", F, {1, 8});
  b.node("Shape", {"x"}, {"s"}, "shape0");
  b.node("Expand", {"v", "s"}, {"y"}, "expand0");
  b.output("y");
  auto f = lint(b);
  expect_one(f, "data-dependent-shape", "expand0", "Expand", Severity::kWarning);
  EXPECT_THAT(with_rule(f, "data-dependent-shape")[0].reason, HasSubstr("Shape of 'x'"));
}

TEST(OnnxLint, SliceWithComputedEndsIsWarning) {
  OnnxBuilder b;
  b.input("x", F, {16});
  b.input("n", I64, {1});
  b.node("Add", {"n", b.init_i64("one", {1})}, {"end"}, "add0");
  b.node("Slice", {"x", b.init_i64("start", {0}), "end"}, {"y"}, "slice0");
  b.output("y");
  auto f = lint(b);
  expect_one(f, "data-dependent-shape", "slice0", "Slice", Severity::kWarning);
  EXPECT_THAT(with_rule(f, "data-dependent-shape")[0].reason, HasSubstr("ends 'end'"));
}

TEST(OnnxLint, UnknownRankReportedAtItsSource) {
  OnnxBuilder b;
  b.input("x", F, {2, 8});
  b.input("shape", I64, {"n"});  // length unknown -> Reshape's rank unknown
  b.node("Reshape", {"x", "shape"}, {"r"}, "reshape0");
  b.node("Relu", {"r"}, {"y"}, "relu0");
  b.output("y");
  auto f = lint(b);
  expect_one(f, "unknown-rank", "reshape0", "Reshape", Severity::kWarning);
  EXPECT_THAT(with_rule(f, "unknown-rank")[0].reason, HasSubstr("1 tensor computed from it"));
}

TEST(OnnxLint, RandomAccessOps) {
  OnnxBuilder b;
  b.input("x", F, {4, 8});
  b.input("idx", I64, {3, 1});
  b.input("ids", I64, {3});
  b.node("GatherND", {"x", "idx"}, {"g"}, "gathernd0");
  OnnxBuilder::attr_int(b.node("Gather", {"x", "ids"}, {"h"}, "gather_act"), "axis", 0);
  OnnxBuilder::attr_int(b.node("Gather", {b.init_f32("emb", {10, 8}), "ids"}, {"e"}, "gather_emb"), "axis", 0);
  b.output("g");
  b.output("h");
  b.output("e");
  auto f = lint(b);
  auto r = with_rule(f, "random-access");
  ASSERT_EQ(r.size(), 2u) << dump(f);
  EXPECT_EQ(r[0].node, "gathernd0");
  EXPECT_EQ(r[0].severity, Severity::kWarning);
  EXPECT_EQ(r[1].node, "gather_act");
  EXPECT_EQ(r[1].op_type, "Gather");
  EXPECT_EQ(r[1].severity, Severity::kInfo);
}

TEST(OnnxLint, UnsupportedOps) {
  OnnxBuilder b;
  b.input("x", F, {1, 1, 4, 4});
  b.node("FooBar", {"x"}, {"a"}, "foo0");
  b.node("Conv", {"x", b.init_f32("k", {1, 1, 1, 1})}, {"c"}, "conv0");
  b.node("MyOp", {"x"}, {"d"}, "custom0").set_domain("com.example");
  b.opset_import("com.example", 1);
  b.output("a");
  b.output("c");
  b.output("d");
  auto f = lint(b);
  auto r = with_rule(f, "unsupported-op");
  ASSERT_EQ(r.size(), 3u) << dump(f);
  EXPECT_EQ(r[0].node, "foo0");
  EXPECT_THAT(r[0].reason, HasSubstr("not known"));
  EXPECT_EQ(r[1].node, "conv0");
  EXPECT_THAT(r[1].reason, HasSubstr("recognized"));
  EXPECT_EQ(r[2].node, "custom0");
  EXPECT_THAT(r[2].reason, HasSubstr("com.example"));
  for (const auto& x : r) EXPECT_EQ(x.severity, Severity::kError);
}

TEST(OnnxLint, SupportedOpsListIsConsistent) {
  using k3::onnxfe::find_onnx_op;
  using k3::onnxfe::OpSupport;
  for (const char* op :
       {"MatMul", "Softmax", "Gather", "Reshape", "TopK", "ScatterND", "Trilu", "LayerNormalization"}) {
    ASSERT_NE(find_onnx_op("", op), nullptr) << op;
    EXPECT_EQ(find_onnx_op("", op)->support, OpSupport::kImportable) << op;
  }
  EXPECT_EQ(find_onnx_op("", "Loop")->support, OpSupport::kRecognized);
  EXPECT_EQ(find_onnx_op("com.microsoft", "MatMul"), nullptr);
  EXPECT_NE(find_onnx_op("ai.onnx", "MatMul"), nullptr);
  std::set<std::string_view> seen;
  for (const auto& info : k3::onnxfe::kOnnxOps) EXPECT_TRUE(seen.insert(info.op_type).second) << info.op_type;
}

TEST(OnnxLint, UnusedInitializers) {
  OnnxBuilder b;
  b.input("x", F, {2, 8});
  b.node("MatMul", {"x", b.init_f32("expert_0_w", {8, 8})}, {"y"}, "mm");
  b.init_f32("expert_1_w", {8, 8});
  b.init_f32("expert_2_w", {8, 8});
  b.output("y");
  auto f = lint(b);
  expect_one(f, "unused-initializer", "", "graph", Severity::kWarning);
  const std::string reason = with_rule(f, "unused-initializer")[0].reason;
  EXPECT_THAT(reason, HasSubstr("'expert_1_w', 'expert_2_w'"));
  EXPECT_THAT(reason, Not(HasSubstr("expert_0_w")));
  EXPECT_THAT(reason, HasSubstr("512 bytes"));
}

TEST(OnnxLint, DynamicInputDims) {
  OnnxBuilder b;
  b.input("x", F, {"batch", Dim::unknown(), 8});
  b.node("Relu", {"x"}, {"y"}, "relu");
  b.output("y");
  auto f = lint(b);
  expect_one(f, "dynamic-input-dim", "x", "input", Severity::kInfo);
  const std::string reason = with_rule(f, "dynamic-input-dim")[0].reason;
  EXPECT_THAT(reason, HasSubstr("batch (dim 0)"));
  EXPECT_THAT(reason, HasSubstr("? (dim 1)"));
}

TEST(OnnxLint, LayerNormBroadcastBeforeGeluBlocksFusion) {
  OnnxBuilder b;
  b.input("x", F, {1, 8});
  const std::string ln = add_layer_norm_op(b, "x", "ln0", 8);
  b.node("Expand", {ln, b.init_i64("to", {4, 8})}, {"lnx"}, "expand0");
  b.node("Identity", {add_gelu(b, "lnx", "g_")}, {"y"}, "out");
  b.output("y");
  auto f = lint(b);
  expect_one(f, "fusion-blocked", "expand0", "Expand", Severity::kInfo);
  const std::string reason = with_rule(f, "fusion-blocked")[0].reason;
  EXPECT_THAT(reason, HasSubstr("LayerNorm→GeLU fusion blocked"));
  EXPECT_THAT(reason, HasSubstr("broadcasts"));
  EXPECT_THAT(reason, HasSubstr("fuse-norm-activation"));  // K3 itself handles a broadcast
  EXPECT_TRUE(with_rule(f, "gelu-near-miss").empty()) << dump(f);
}

TEST(OnnxLint, ReshapeBetweenDecomposedLayerNormAndGeluBlocksFusion) {
  OnnxBuilder b;
  b.input("x", F, {2, 8});
  const std::string ln = add_decomposed_ln(b, "x", "ln_", 8);
  b.node("Reshape", {ln, b.init_i64("shape", {4, 4})}, {"r"}, "reshape0");
  b.node("Identity", {add_gelu(b, "r", "g_")}, {"y"}, "out");
  b.output("y");
  auto f = lint(b);
  expect_one(f, "fusion-blocked", "reshape0", "Reshape", Severity::kInfo);
  EXPECT_THAT(with_rule(f, "fusion-blocked")[0].reason, HasSubstr("sits between"));
}

TEST(OnnxLint, LayerNormWithSeveralReadersBlocksFusion) {
  OnnxBuilder b;
  b.input("x", F, {2, 8});
  const std::string ln = add_layer_norm_op(b, "x", "ln0", 8);
  const std::string g = add_gelu(b, ln, "g_");
  b.node("Add", {g, ln}, {"y"}, "residual");  // second reader of the norm output
  b.output("y");
  auto f = lint(b);
  expect_one(f, "fusion-blocked", "ln0", "LayerNormalization", Severity::kInfo);
  EXPECT_THAT(with_rule(f, "fusion-blocked")[0].reason, HasSubstr("1 other reader"));
  EXPECT_THAT(with_rule(f, "fusion-blocked")[0].reason, Not(HasSubstr("fuse-norm-activation")));
}

TEST(OnnxLint, GeluWithWrongConstantIsNearMiss) {
  OnnxBuilder b;
  b.input("x", F, {2, 8});
  b.node("Identity", {add_gelu(b, "x", "g_", 1.5f)}, {"y"}, "out");
  b.output("y");
  auto f = lint(b);
  expect_one(f, "gelu-near-miss", "g_erf", "Erf", Severity::kInfo);
  EXPECT_THAT(with_rule(f, "gelu-near-miss")[0].reason,
              HasSubstr("GeLU pattern almost matched: constant 'g_c_div' is 1.5"));

  OnnxBuilder ok;  // the correct constants, in the x * 1/sqrt(2) and 0.5 * x orders
  ok.input("x", F, {2, 8});
  ok.node("Mul", {"x", ok.const_f32("inv_sqrt2", 0.70710678f)}, {"d"}, "scale");
  ok.node("Erf", {"d"}, {"e"}, "erf");
  ok.node("Add", {ok.const_f32("one", 1.0f), "e"}, {"a"}, "add");
  ok.node("Mul", {ok.const_f32("half", 0.5f), "x"}, {"hx"}, "half_x");
  ok.node("Mul", {"hx", "a"}, {"y"}, "mul");
  ok.output("y");
  auto f_ok = lint(ok);
  EXPECT_TRUE(f_ok.empty()) << dump(f_ok);
}

TEST(OnnxLint, NewerOpsetIsNoted) {
  OnnxBuilder b(21);
  b.input("x", F, {2});
  b.node("Relu", {"x"}, {"y"}, "relu");
  b.output("y");
  auto f = lint(b);
  auto r = with_rule(f, "shape-inference");
  ASSERT_EQ(r.size(), 1u) << dump(f);
  EXPECT_EQ(r[0].severity, Severity::kInfo);
  EXPECT_THAT(r[0].reason, HasSubstr("opset 21"));
}

// ---- Output formats ----------------------------------------------------------

TEST(OnnxLint, TextAndJsonOutput) {
  auto f = lint(if_model());
  const std::string text = k3::onnxfe::format_findings_text(f);
  EXPECT_THAT(text, HasSubstr("error If if0: control flow"));
  EXPECT_THAT(text, HasSubstr("1 error, 0 warnings"));
  auto j = nlohmann::json::parse(k3::onnxfe::format_findings_json(f));
  ASSERT_TRUE(j["findings"].is_array());
  ASSERT_FALSE(j["findings"].empty());
  const auto& first = j["findings"][0];
  EXPECT_EQ(first["severity"], "error");
  EXPECT_EQ(first["rule"], "control-flow");
  EXPECT_EQ(first["node"], "if0");
  EXPECT_EQ(first["op_type"], "If");
  EXPECT_TRUE(first["reason"].is_string());
  EXPECT_EQ(j["counts"]["error"], 1);
  EXPECT_TRUE(j["counts"].contains("warning"));
  EXPECT_TRUE(j["counts"].contains("info"));
}

TEST(OnnxLint, ControlCharactersInNamesStayOnOneLine) {
  OnnxBuilder b;
  b.input("x", F, {4});
  b.node("NonZero", {"x"}, {"y"}, "evil\nname");
  b.output("y", I64);
  auto f = lint(b);
  const std::string text = k3::onnxfe::format_findings_text(f);
  EXPECT_THAT(text, HasSubstr("evil?name"));
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 2) << text;  // one finding + summary
}

}  // namespace
