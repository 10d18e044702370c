// specialize-shapes pass (--input-shape): input dims fixed and propagated
// through onnx.* shape rules, names kept on dims still unknown, and one test
// per guard (no dims, negative value, conflicting repeat, known dim of
// another size, unused name, a rule refusing the result, fused nodes).
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "passes/pipeline.h"
#include "passes/specialize_shapes.h"

namespace k3::passes {
namespace {

using ir::DType;
using ir::OpKind;
using ir::RowDim;

int node(ir::Graph& g, OpKind op, const std::string& name, std::vector<int> in, std::vector<ir::Attr> attrs = {}) {
  auto r = g.add_node(op, name, std::move(in), std::move(attrs));
  EXPECT_TRUE(r.ok()) << name << ": " << r.status().message();
  return r.ok() ? (*r)[0] : -1;
}

int input(ir::Graph& g, const std::string& name, std::vector<int64_t> shape, std::vector<std::string> params) {
  const int id = g.add_input(name, DType::kF32, std::move(shape), RowDim::kFixed);
  g.values()[static_cast<size_t>(id)].dim_params = std::move(params);
  return id;
}

// A decode step's attention input: x[batch, seq, 4] appended to
// past[batch, past, 4] along dim 1 -> cat[batch, total, 4] (the name
// "total" as ONNX shape inference would give it), then transposed.
ir::Graph kv_graph() {
  ir::Graph g;
  const int x = input(g, "x", {-1, -1, 4}, {"batch", "seq", ""});
  const int past = input(g, "past", {-1, -1, 4}, {"batch", "past", ""});
  const int cat = node(g, OpKind::kOnnxConcat, "cat", {past, x}, {{"axis", int64_t{1}}});
  g.values()[static_cast<size_t>(cat)].dim_params = {"batch", "total", ""};
  const int t = node(g, OpKind::kOnnxTranspose, "t", {cat}, {{"perm", std::vector<int64_t>{0, 2, 1}}});
  g.mark_output(t);
  g.mark_output(node(g, OpKind::kOnnxShape, "shape", {x}));
  return g;
}

const ir::Value& val(const ir::Graph& g, const char* name) {
  return g.value(g.find_value(name));
}

TEST(SpecializeShapes, FixesInputDimsAndPropagates) {
  ir::Graph g = kv_graph();
  ASSERT_TRUE(g.verify().ok()) << g.verify().message();
  SpecializeShapes pass({{"batch", 1}, {"seq", 1}, {"past", 127}});
  auto changed = pass.run(g);
  ASSERT_TRUE(changed.ok()) << changed.status().message();
  EXPECT_TRUE(*changed);
  ASSERT_TRUE(g.verify().ok()) << g.verify().message();
  EXPECT_EQ(val(g, "x").shape, (std::vector<int64_t>{1, 1, 4}));
  EXPECT_TRUE(val(g, "x").dim_params.empty());  // every name now fixed
  EXPECT_EQ(val(g, "past").shape, (std::vector<int64_t>{1, 127, 4}));
  EXPECT_EQ(val(g, "cat").shape, (std::vector<int64_t>{1, 128, 4}));
  EXPECT_TRUE(val(g, "cat").dim_params.empty());
  EXPECT_EQ(val(g, "t").shape, (std::vector<int64_t>{1, 4, 128}));
  EXPECT_EQ(pass.stats().matched, 4);  // batch twice, seq, past
  EXPECT_EQ(pass.stats().applied, 4);  // x, past, cat, t (shape's [3] did not change)
}

TEST(SpecializeShapes, DimsStillUnknownKeepTheirName) {
  ir::Graph g = kv_graph();
  SpecializeShapes pass({{"batch", 2}});
  auto changed = pass.run(g);
  ASSERT_TRUE(changed.ok()) << changed.status().message();
  EXPECT_TRUE(*changed);
  ASSERT_TRUE(g.verify().ok()) << g.verify().message();
  EXPECT_EQ(val(g, "x").shape, (std::vector<int64_t>{2, -1, 4}));
  EXPECT_EQ(val(g, "x").dim_params, (std::vector<std::string>{"", "seq", ""}));
  EXPECT_EQ(val(g, "cat").shape, (std::vector<int64_t>{2, -1, 4}));
  EXPECT_EQ(val(g, "cat").dim_params, (std::vector<std::string>{"", "total", ""}));
  EXPECT_EQ(pass.stats().matched, 2);
}

TEST(SpecializeShapes, NoDimsDoesNothing) {
  ir::Graph g = kv_graph();
  SpecializeShapes pass({});
  auto changed = pass.run(g);
  ASSERT_TRUE(changed.ok());
  EXPECT_FALSE(*changed);
  EXPECT_EQ(val(g, "x").shape, (std::vector<int64_t>{-1, -1, 4}));
}

TEST(SpecializeShapes, UnusedNameIsAnError) {
  ir::Graph g = kv_graph();
  SpecializeShapes pass({{"batch", 1}, {"sequence", 1}});
  auto r = pass.run(g);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "--input-shape: no input has a dim named 'sequence'");
}

TEST(SpecializeShapes, NegativeOrConflictingValueIsAnError) {
  ir::Graph g = kv_graph();
  auto neg = SpecializeShapes({{"seq", -3}}).run(g);
  ASSERT_FALSE(neg.ok());
  EXPECT_NE(neg.status().message().find("dim 'seq' must be >= 0"), std::string::npos);
  auto twice = SpecializeShapes({{"seq", 1}, {"seq", 2}}).run(g);
  ASSERT_FALSE(twice.ok());
  EXPECT_NE(twice.status().message().find("dim 'seq' is given twice"), std::string::npos);
}

TEST(SpecializeShapes, KnownDimOfAnotherSizeIsAnError) {
  ir::Graph g;
  g.mark_output(input(g, "h", {-1, 8}, {"batch", "hidden"}));
  auto bad = SpecializeShapes({{"hidden", 16}}).run(g);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("input 'h' dim 1 ('hidden') is already 8, not 16"), std::string::npos)
      << bad.status().message();
  // The same size is accepted (the name is used, nothing changes).
  auto same = SpecializeShapes({{"hidden", 8}}).run(g);
  ASSERT_TRUE(same.ok()) << same.status().message();
  EXPECT_FALSE(*same);
}

TEST(SpecializeShapes, ShapeRuleRefusingTheSizesNamesTheNode) {
  // Reshape of x[n] to [3, 2] is fine while n is unknown, not for n = 5.
  ir::Graph g;
  const int x = input(g, "x", {-1}, {"n"});
  static const int64_t target[] = {3, 2};
  const int t = g.add_weight("target", DType::kI64, {2}, target);
  g.mark_output(node(g, OpKind::kOnnxReshape, "reshape", {x, t}));
  ASSERT_TRUE(g.verify().ok()) << g.verify().message();
  auto r = SpecializeShapes({{"n", 5}}).run(g);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("node reshape (onnx.Reshape)"), std::string::npos) << r.status().message();
}

TEST(SpecializeShapes, FusedNodesAreLeftAlone) {
  ir::Graph g = kv_graph();
  static const float zeros[64] = {};
  const int tokens = g.add_input("tokens", DType::kI32, {4}, RowDim::kTokens);
  const int table = g.add_weight("table", DType::kF32, {16, 4}, zeros);
  const int e = node(g, OpKind::kEmbedding, "embed", {table, tokens});
  g.mark_output(e);
  ASSERT_TRUE(g.verify().ok()) << g.verify().message();
  SpecializeShapes pass({{"batch", 1}, {"seq", 1}, {"past", 3}});
  ASSERT_TRUE(pass.run(g).ok());
  ASSERT_TRUE(g.verify().ok()) << g.verify().message();
  EXPECT_EQ(val(g, "embed").shape, (std::vector<int64_t>{4, 4}));
  EXPECT_EQ(val(g, "embed").row_dim, RowDim::kTokens);
  EXPECT_EQ(val(g, "cat").shape, (std::vector<int64_t>{1, 4, 4}));
}

TEST(SpecializeShapes, RunsAtOptLevelZero) {
  // --input-shape is the user's choice, not an optimization: O0 applies it.
  ir::Graph g = kv_graph();
  PipelineOptions opts;
  opts.opt_level = 0;
  opts.dims = {{"batch", 1}, {"seq", 1}, {"past", 7}};
  auto r = run_pipeline(g, opts);
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_EQ(r->passes[0].name, "specialize-shapes");
  EXPECT_TRUE(r->passes[0].ran);
  EXPECT_TRUE(r->passes[0].changed);
  EXPECT_EQ(r->passes[0].stats.matched, 4);
  EXPECT_EQ(val(g, "t").shape, (std::vector<int64_t>{1, 4, 8}));
  for (const PassRecord& p : r->passes) {
    if (p.name == "constant-folding") {
      EXPECT_FALSE(p.ran);
    }
  }
  // An unused name stops the pipeline with the pass's error.
  ir::Graph g2 = kv_graph();
  opts.dims = {{"beam", 4}};
  auto bad = run_pipeline(g2, opts);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("no input has a dim named 'beam'"), std::string::npos);
}

}  // namespace
}  // namespace k3::passes
