// constant-folding pass: chains that fold in one run (shape arithmetic,
// rotary tables), numeric equivalence with the O0 interpreter before and
// after, and one must-not-fold test per guard (non-constant input, unknown
// dims under Shape/Size, data-dependent op on an input, the size cap, an
// evaluation error, fused ops).
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "passes/constant_folding.h"
#include "passes/dead_code.h"
#include "passes/pipeline.h"
#include "runtime/interp/interpreter.h"

namespace k3::passes {
namespace {

using ir::DType;
using ir::OpKind;
using ir::RowDim;
using runtime::interp::Interpreter;
using runtime::interp::NamedTensor;

// A weight whose data the graph owns (kept alive by keep_alive).
template <typename T>
int weight(ir::Graph& g, const std::string& name, DType dt, std::vector<int64_t> shape, std::vector<T> vals) {
  auto buf = std::make_shared<std::vector<T>>(std::move(vals));
  g.keep_alive.push_back(buf);
  return g.add_weight(name, dt, std::move(shape), buf->data());
}

int i64w(ir::Graph& g, const std::string& name, std::vector<int64_t> shape, std::vector<int64_t> vals) {
  return weight<int64_t>(g, name, DType::kI64, std::move(shape), std::move(vals));
}

int f32w(ir::Graph& g, const std::string& name, std::vector<int64_t> shape, std::vector<float> vals) {
  return weight<float>(g, name, DType::kF32, std::move(shape), std::move(vals));
}

int node(ir::Graph& g, OpKind op, const std::string& name, std::vector<int> in, std::vector<ir::Attr> attrs = {}) {
  auto r = g.add_node(op, name, std::move(in), std::move(attrs));
  EXPECT_TRUE(r.ok()) << name << ": " << r.status().message();
  return r.ok() ? (*r)[0] : -1;
}

ir::Tensor f32_tensor(std::vector<int64_t> shape, float start) {
  ir::Tensor t = *ir::Tensor::zeros(DType::kF32, std::move(shape));
  for (int64_t i = 0; i < t.numel(); ++i) t.mut<float>()[i] = start + 0.25f * static_cast<float>(i);
  return t;
}

std::vector<NamedTensor> run_interp(const ir::Graph& g, const std::vector<NamedTensor>& inputs) {
  auto it = Interpreter::create(g);
  EXPECT_TRUE(it.ok()) << it.status().message();
  if (!it.ok()) return {};
  auto out = it->run(inputs);
  EXPECT_TRUE(out.ok()) << out.status().message();
  return out.ok() ? *out : std::vector<NamedTensor>{};
}

// Same names, dtypes, shapes and bytes (folding runs the interpreter's
// kernels, so results must be bit-identical).
void expect_same(const std::vector<NamedTensor>& a, const std::vector<NamedTensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].name, b[i].name);
    EXPECT_EQ(a[i].tensor.dtype(), b[i].tensor.dtype()) << a[i].name;
    EXPECT_EQ(a[i].tensor.shape(), b[i].tensor.shape()) << a[i].name;
    ASSERT_EQ(a[i].tensor.nbytes(), b[i].tensor.nbytes()) << a[i].name;
    EXPECT_EQ(std::memcmp(a[i].tensor.raw(), b[i].tensor.raw(), a[i].tensor.nbytes()), 0) << a[i].name;
  }
}

// Runs the pass, checks the graph still verifies and returns whether it changed.
bool fold(ir::Graph& g, ConstantFolding& pass) {
  auto changed = pass.run(g);
  EXPECT_TRUE(changed.ok()) << changed.status().message();
  const Status v = g.verify();
  EXPECT_TRUE(v.ok()) << v.message() << "\n" << g.to_string();
  return changed.ok() && *changed;
}

// x[2,3,4] -> Reshape(x, Concat(Unsqueeze(Gather(Shape(x), 0)), [-1])) = [2,12]:
// the shape-computing subgraph an exporter writes for x.view(x.size(0), -1).
ir::Graph shape_chain_graph(std::vector<int64_t> x_shape) {
  ir::Graph g;
  const int x = g.add_input("x", DType::kF32, x_shape, RowDim::kFixed);
  const int shp = node(g, OpKind::kOnnxShape, "shape", {x});
  const int b = node(g, OpKind::kOnnxGather, "gather", {shp, i64w(g, "zero", {}, {0})}, {{"axis", int64_t{0}}});
  const int b1 = node(g, OpKind::kOnnxUnsqueeze, "unsqueeze", {b, i64w(g, "axes0", {1}, {0})});
  const int target = node(g, OpKind::kOnnxConcat, "concat", {b1, i64w(g, "minus1", {1}, {-1})}, {{"axis", int64_t{0}}});
  g.mark_output(node(g, OpKind::kOnnxReshape, "reshape", {x, target}));
  return g;
}

TEST(ConstantFolding, ShapeChainFoldsIntoReshapeTargetInOneRun) {
  ir::Graph g = shape_chain_graph({2, 3, 4});
  ASSERT_TRUE(g.verify().ok()) << g.verify().message();
  EXPECT_EQ(g.value(g.outputs()[0]).shape, (std::vector<int64_t>{-1, -1}));  // target not known yet
  const std::vector<NamedTensor> in = {{"x", f32_tensor({2, 3, 4}, -1.0f)}};
  const auto before = run_interp(g, in);
  ConstantFolding pass;
  ASSERT_TRUE(fold(g, pass));
  ASSERT_EQ(g.nodes().size(), 1u) << g.to_string();
  EXPECT_EQ(g.nodes()[0].name, "reshape");
  const ir::Value& target = g.value(g.nodes()[0].inputs[1]);
  EXPECT_EQ(target.kind, ir::ValueKind::kWeight);
  EXPECT_EQ(target.name, "concat");
  ASSERT_EQ(target.shape, (std::vector<int64_t>{2}));
  EXPECT_EQ(static_cast<const int64_t*>(target.data)[0], 2);
  EXPECT_EQ(static_cast<const int64_t*>(target.data)[1], -1);
  // The Reshape's output type was re-inferred from the folded target.
  EXPECT_EQ(g.value(g.outputs()[0]).shape, (std::vector<int64_t>{2, 12}));
  EXPECT_EQ(pass.stats().applied, 4);
  expect_same(before, run_interp(g, in));
  // A second run finds nothing.
  ConstantFolding again;
  EXPECT_FALSE(fold(g, again));
}

TEST(ConstantFolding, RotaryTableGatheredByConstantPositions) {
  ir::Graph g;
  std::vector<float> table(16 * 4);
  for (size_t i = 0; i < table.size(); ++i) table[i] = 0.01f * static_cast<float>(i) - 0.3f;
  const int cos = f32w(g, "cos_cached", {16, 4}, table);
  const int pos = i64w(g, "position_ids", {3}, {0, 5, 15});
  const int gathered = node(g, OpKind::kOnnxGather, "gather_cos", {cos, pos}, {{"axis", int64_t{0}}});
  const int cos3 = node(g, OpKind::kOnnxUnsqueeze, "unsqueeze_cos", {gathered, i64w(g, "axes", {1}, {0})});
  const int x = g.add_input("q", DType::kF32, {1, 3, 4}, RowDim::kFixed);
  g.mark_output(node(g, OpKind::kOnnxMul, "rotate", {x, cos3}));
  ASSERT_TRUE(g.verify().ok()) << g.verify().message();
  const std::vector<NamedTensor> in = {{"q", f32_tensor({1, 3, 4}, 0.5f)}};
  const auto before = run_interp(g, in);
  ConstantFolding pass;
  ASSERT_TRUE(fold(g, pass));
  ASSERT_EQ(g.nodes().size(), 1u) << g.to_string();
  EXPECT_EQ(g.nodes()[0].name, "rotate");
  const ir::Value& c = g.value(g.nodes()[0].inputs[1]);
  EXPECT_EQ(c.kind, ir::ValueKind::kWeight);
  EXPECT_EQ(c.shape, (std::vector<int64_t>{1, 3, 4}));
  EXPECT_EQ(static_cast<const float*>(c.data)[4], table[5 * 4]);  // row of position 5
  expect_same(before, run_interp(g, in));
}

TEST(ConstantFolding, FoldedGraphOutputKeepsNameAndStaysOutput) {
  ir::Graph g;
  const int a = f32w(g, "a", {2, 2}, {1, 2, 3, 4});
  const int b = f32w(g, "b", {2}, {10, 20});
  const int x = g.add_input("x", DType::kF32, {2, 2}, RowDim::kFixed);
  g.mark_output(node(g, OpKind::kOnnxAdd, "sum", {a, b}));
  g.mark_output(node(g, OpKind::kOnnxMul, "scaled", {x, a}));
  const std::vector<NamedTensor> in = {{"x", f32_tensor({2, 2}, 1.0f)}};
  const auto before = run_interp(g, in);
  ConstantFolding pass;
  ASSERT_TRUE(fold(g, pass));
  ASSERT_EQ(g.outputs().size(), 2u);
  const ir::Value& sum = g.value(g.outputs()[0]);
  EXPECT_EQ(sum.name, "sum");
  EXPECT_EQ(sum.kind, ir::ValueKind::kWeight);
  EXPECT_TRUE(sum.is_output);
  EXPECT_EQ(static_cast<const float*>(sum.data)[3], 24.0f);
  EXPECT_EQ(g.nodes().size(), 1u);
  expect_same(before, run_interp(g, in));
}

TEST(ConstantFolding, OmittedOptionalInputIsFine) {
  // Clip without min (input -1) on a constant folds.
  ir::Graph g;
  const int a = f32w(g, "a", {4}, {-2, -1, 1, 2});
  const int hi = f32w(g, "hi", {}, {1.5f});
  const int x = g.add_input("x", DType::kF32, {4}, RowDim::kFixed);
  const int c = node(g, OpKind::kOnnxClip, "clip", {a, -1, hi});
  g.mark_output(node(g, OpKind::kOnnxAdd, "out", {x, c}));
  const std::vector<NamedTensor> in = {{"x", f32_tensor({4}, 0.0f)}};
  const auto before = run_interp(g, in);
  ConstantFolding pass;
  ASSERT_TRUE(fold(g, pass));
  EXPECT_EQ(g.nodes().size(), 1u);
  EXPECT_EQ(static_cast<const float*>(g.value(g.find_value("clip")).data)[3], 1.5f);
  expect_same(before, run_interp(g, in));
}

TEST(ConstantFolding, MustNotFoldNodeWithNonConstantInput) {
  ir::Graph g;
  const int a = f32w(g, "a", {2}, {1, 2});
  const int x = g.add_input("x", DType::kF32, {2}, RowDim::kFixed);
  const int y = node(g, OpKind::kOnnxAdd, "add", {x, a});
  g.mark_output(node(g, OpKind::kOnnxNeg, "neg", {y}));  // reads an activation
  ConstantFolding pass;
  EXPECT_FALSE(fold(g, pass));
  EXPECT_EQ(g.nodes().size(), 2u);
  EXPECT_EQ(pass.stats().matched, 0);
}

TEST(ConstantFolding, ShapeAndSizeFoldOnlyWhereDimsAreKnown) {
  ir::Graph g;
  const int x = g.add_input("x", DType::kF32, {-1, 3, 4}, RowDim::kFixed);
  g.values()[static_cast<size_t>(x)].dim_params = {"batch", "", ""};
  const int whole = node(g, OpKind::kOnnxShape, "shape_all", {x});
  const int tail = node(g, OpKind::kOnnxShape, "shape_tail", {x}, {{"start", int64_t{1}}});
  const int last = node(g, OpKind::kOnnxShape, "shape_last", {x}, {{"start", int64_t{-1}}});
  const int head = node(g, OpKind::kOnnxShape, "shape_head", {x}, {{"end", int64_t{1}}});
  const int size = node(g, OpKind::kOnnxSize, "size", {x});
  const int y = node(g, OpKind::kOnnxNeg, "neg", {x});
  const int ysize = node(g, OpKind::kOnnxShape, "shape_of_activation", {y}, {{"start", int64_t{2}}});
  for (int v : {whole, tail, last, head, size, ysize}) g.mark_output(v);
  ASSERT_TRUE(g.verify().ok()) << g.verify().message();
  ConstantFolding pass;
  ASSERT_TRUE(fold(g, pass));
  auto kind = [&](const char* name) { return g.value(g.find_value(name)).kind; };
  auto ints = [&](const char* name) {
    const ir::Value& v = g.value(g.find_value(name));
    const auto* p = static_cast<const int64_t*>(v.data);
    return std::vector<int64_t>(p, p + v.numel());
  };
  // Must not fold: a dim they read is unknown.
  EXPECT_EQ(kind("shape_all"), ir::ValueKind::kActivation);
  EXPECT_EQ(kind("shape_head"), ir::ValueKind::kActivation);
  EXPECT_EQ(kind("size"), ir::ValueKind::kActivation);
  // Fold: the dims read are static, whatever x's values (an input) or y's (an activation).
  EXPECT_EQ(ints("shape_tail"), (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(ints("shape_last"), (std::vector<int64_t>{4}));
  EXPECT_EQ(ints("shape_of_activation"), (std::vector<int64_t>{4}));
  EXPECT_EQ(pass.stats().applied, 3);
  EXPECT_EQ(g.nodes().size(), 4u);  // shape_all, shape_head, size, neg
}

TEST(ConstantFolding, DataDependentOpFoldsOnlyOnConstants) {
  ir::Graph g;
  const int c = f32w(g, "mask", {5}, {0, 1, 0, 2, 3});
  const int nz = node(g, OpKind::kOnnxNonZero, "nonzero_const", {c});
  EXPECT_EQ(g.value(nz).shape, (std::vector<int64_t>{1, -1}));
  const int t = node(g, OpKind::kOnnxTranspose, "transpose", {nz}, {{"perm", std::vector<int64_t>{1, 0}}});
  g.mark_output(t);
  const int x = g.add_input("x", DType::kF32, {5}, RowDim::kFixed);
  g.mark_output(node(g, OpKind::kOnnxNonZero, "nonzero_input", {x}));
  ConstantFolding pass;
  ASSERT_TRUE(fold(g, pass));
  const ir::Value& folded = g.value(g.find_value("transpose"));
  EXPECT_EQ(folded.kind, ir::ValueKind::kWeight);
  EXPECT_EQ(folded.shape, (std::vector<int64_t>{3, 1}));
  EXPECT_EQ(static_cast<const int64_t*>(folded.data)[2], 4);
  // Must not fold: NonZero of an input.
  ASSERT_EQ(g.nodes().size(), 1u);
  EXPECT_EQ(g.nodes()[0].name, "nonzero_input");
  EXPECT_EQ(g.value(g.find_value("nonzero_input")).shape, (std::vector<int64_t>{1, -1}));
}

TEST(ConstantFolding, MustNotFoldOutputOverTheCap) {
  ir::Graph g;
  // 4097 x 4096 f32 = 64 MiB + 16 KiB: one element row over the cap.
  const int shape = i64w(g, "big_shape", {2}, {4097, 4096});
  const int big = node(g, OpKind::kOnnxConstantOfShape, "fill", {shape});
  const int small_shape = i64w(g, "small_shape", {2}, {4096, 4096});  // exactly 64 MiB: folds
  const int small = node(g, OpKind::kOnnxConstantOfShape, "fill_small", {small_shape});
  const int tiled = node(g, OpKind::kOnnxTile, "tile", {small, i64w(g, "reps", {2}, {2, 1})});
  g.mark_output(big);
  g.mark_output(tiled);
  ConstantFolding pass;
  ASSERT_TRUE(fold(g, pass));
  EXPECT_EQ(g.value(g.find_value("fill")).kind, ir::ValueKind::kActivation);
  EXPECT_EQ(g.value(g.find_value("fill_small")).kind, ir::ValueKind::kWeight);
  EXPECT_EQ(g.value(g.find_value("tile")).kind, ir::ValueKind::kActivation);
  EXPECT_EQ(g.nodes().size(), 2u);
  EXPECT_EQ(pass.stats().matched, 3);  // all three have constant inputs
  EXPECT_EQ(pass.stats().applied, 1);
  ASSERT_EQ(pass.stats().notes.size(), 2u);
  EXPECT_NE(pass.stats().notes[0].find("node fill (onnx.ConstantOfShape)"), std::string::npos);
  EXPECT_NE(pass.stats().notes[0].find("64 MiB folding cap"), std::string::npos);
  EXPECT_NE(pass.stats().notes[1].find("node tile"), std::string::npos);
}

TEST(ConstantFolding, MustNotFoldNodeWhoseEvaluationFails) {
  // A constant Gather index out of range: left for the run time to report.
  ir::Graph g;
  const int table = f32w(g, "table", {4, 2}, std::vector<float>(8, 1.0f));
  const int idx = i64w(g, "idx", {1}, {7});
  g.mark_output(node(g, OpKind::kOnnxGather, "gather", {table, idx}, {{"axis", int64_t{0}}}));
  ConstantFolding pass;
  EXPECT_FALSE(fold(g, pass));
  EXPECT_EQ(g.nodes().size(), 1u);
  EXPECT_EQ(pass.stats().applied, 0);
  ASSERT_EQ(pass.stats().notes.size(), 1u);
  EXPECT_NE(pass.stats().notes[0].find("node gather"), std::string::npos);
  EXPECT_NE(pass.stats().notes[0].find("not folded (left for run time)"), std::string::npos);
}

TEST(ConstantFolding, MustNotFoldFusedOps) {
  // A fused LayerNorm whose inputs are all weights stays.
  ir::Graph g;
  const int x = f32w(g, "x", {2, 4}, std::vector<float>(8, 1.0f));
  const int w = f32w(g, "w", {4}, std::vector<float>(4, 1.0f));
  const int b = f32w(g, "b", {4}, std::vector<float>(4, 0.0f));
  g.mark_output(node(g, OpKind::kLayerNorm, "norm", {x, w, b}, {{"eps", 1e-5}}));
  ASSERT_TRUE(g.verify().ok()) << g.verify().message();
  ConstantFolding pass;
  EXPECT_FALSE(fold(g, pass));
  EXPECT_EQ(g.nodes().size(), 1u);
}

TEST(ConstantFolding, PipelineSpecializesThenFoldsThenRemovesDeadWeights) {
  // x's batch dim is symbolic: Shape(x)[0] folds only once --input-shape
  // fixes it; dead-code then drops the weights the folded chain read.
  ir::Graph g = shape_chain_graph({-1, 3, 4});
  g.values()[static_cast<size_t>(g.find_value("x"))].dim_params = {"batch", "", ""};
  ASSERT_TRUE(g.verify().ok()) << g.verify().message();
  PipelineOptions opts;
  opts.opt_level = 1;
  auto unspecialized = g;
  ASSERT_TRUE(run_pipeline(unspecialized, opts).ok());
  EXPECT_EQ(unspecialized.nodes().size(), 5u);  // nothing foldable without the batch size
  opts.dims = {{"batch", 2}};
  auto r = run_pipeline(g, opts);
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_EQ(g.nodes().size(), 1u) << g.to_string();
  EXPECT_EQ(g.value(g.outputs()[0]).shape, (std::vector<int64_t>{2, 12}));
  EXPECT_EQ(g.find_value("zero"), -1);
  EXPECT_EQ(g.find_value("minus1"), -1);
  const std::vector<NamedTensor> in = {{"x", f32_tensor({2, 3, 4}, 0.0f)}};
  expect_same(run_interp(shape_chain_graph({2, 3, 4}), in), run_interp(g, in));
}

}  // namespace
}  // namespace k3::passes

// Omitted optional inputs (id -1) survive compact() and dead-code.
namespace k3::passes {
TEST(OmittedInput, KeptNodeWithOmittedInput) {
  ir::Graph g;
  static const float a[2] = {1, 2};
  static const float hi[1] = {1.5f};
  const int wa = g.add_weight("a", ir::DType::kF32, {2}, a);
  const int whi = g.add_weight("hi", ir::DType::kF32, {}, hi);
  const int x = g.add_input("x", ir::DType::kF32, {2}, ir::RowDim::kFixed);
  const int n = (*g.add_node(ir::OpKind::kOnnxNeg, "neg", {wa}, {}))[0];
  const int c = (*g.add_node(ir::OpKind::kOnnxClip, "clip", {x, -1, whi}, {}))[0];
  g.mark_output((*g.add_node(ir::OpKind::kOnnxAdd, "add", {n, c}, {}))[0]);
  ConstantFolding pass;
  auto r = pass.run(g);
  EXPECT_TRUE(r.ok());
  EXPECT_TRUE(g.verify().ok()) << g.verify().message();
}

TEST(OmittedInput, DeadCodeWithOmittedInput) {
  ir::Graph g;
  static const float hi[1] = {1.5f};
  const int whi = g.add_weight("hi", ir::DType::kF32, {}, hi);
  const int x = g.add_input("x", ir::DType::kF32, {2}, ir::RowDim::kFixed);
  (void)(*g.add_node(ir::OpKind::kOnnxClip, "dead", {x, -1, whi}, {}))[0];
  g.mark_output((*g.add_node(ir::OpKind::kOnnxClip, "clip", {x, -1, whi}, {}))[0]);
  DeadCode pass;
  auto r = pass.run(g);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(*r);
  EXPECT_EQ(g.nodes().size(), 1u);
  EXPECT_TRUE(g.verify().ok()) << g.verify().message();
}
}  // namespace k3::passes
