// fuse-sibling-linears: the stacked Linear replaces its siblings (one
// must-not-match test per guard), the splits shape rule refuses what does
// not add up, and k3-tiny decodes bit for bit the same with and without the
// fusion in every precision and weight layout.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "passes/fuse_sibling_linears.h"
#include "weight_test_util.h"

namespace k3::passes {
namespace {

using ir::DType;
using ir::OpKind;
using test::node;
using test::test_weights;

struct Proj {
  int64_t rows = 16;
  DType dtype = DType::kF32;
  bool bias = false;
  double scale = 1.0;
};

// x [3, 32] (tokens) -> one Linear per entry of `projs`, each a graph output,
// weights at distinct offsets of the test table (weights of a dtype other
// than f32 reuse the f32 bits: only the dtype matters to the guards).
ir::Graph siblings(const std::vector<Proj>& projs) {
  ir::Graph g;
  const int x = g.add_input("x", DType::kF32, {3, 32}, ir::RowDim::kTokens);
  for (size_t i = 0; i < projs.size(); ++i) {
    const Proj& p = projs[i];
    const std::string name = "attn.w" + std::to_string(i);
    std::vector<int> in{x, g.add_weight(name + ".weight", p.dtype, {p.rows, 32}, test_weights().data() + 100 * i)};
    if (p.bias)
      in.push_back(g.add_weight(name + ".bias", DType::kF32, {p.rows}, test_weights().data() + 3000 + 64 * i));
    std::vector<ir::Attr> attrs;
    if (p.scale != 1.0) attrs.push_back({"scale", p.scale});
    g.mark_output(node(g, OpKind::kLinear, name, in, attrs));
  }
  return g;
}

int count_linears(const ir::Graph& g) {
  int n = 0;
  for (const ir::Node& node : g.nodes()) n += node.op == OpKind::kLinear;
  return n;
}

StatusOr<bool> run_pass(ir::Graph& g) {
  FuseSiblingLinears pass;
  return pass.run(g);
}

TEST(FuseSiblingLinears, StacksQkvIntoOneSplitLinear) {
  ir::Graph g = siblings({{32}, {16}, {48}});
  auto r = run_pass(g);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_TRUE(*r);
  ASSERT_EQ(g.nodes().size(), 1u);
  const ir::Node& n = g.nodes()[0];
  EXPECT_EQ(n.name, "attn.w0+w1+w2");
  ASSERT_NE(n.attr_ints("splits"), nullptr);
  EXPECT_EQ(*n.attr_ints("splits"), (std::vector<int64_t>{32, 16, 48}));
  // The outputs keep their names, in order, and are still the graph's outputs.
  ASSERT_EQ(n.outputs.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(g.value(n.outputs[i]).name, "attn.w" + std::to_string(i));
    EXPECT_EQ(g.value(n.outputs[i]).shape, (std::vector<int64_t>{3, (i == 0 ? 32 : i == 1 ? 16 : 48)}));
    EXPECT_EQ(g.outputs()[i], n.outputs[i]);
  }
  // The stacked weight is the three matrices' rows in order.
  const ir::Value& w = g.value(n.inputs[1]);
  ASSERT_EQ(w.shape, (std::vector<int64_t>{96, 32}));
  const auto* data = static_cast<const float*>(w.data);
  const int64_t rows[3] = {32, 16, 48};
  int64_t at = 0;
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(std::memcmp(data + at * 32, test_weights().data() + 100 * i, static_cast<size_t>(rows[i] * 32) * 4), 0)
        << "matrix " << i;
    at += rows[i];
  }
  EXPECT_TRUE(g.verify().ok());
}

TEST(FuseSiblingLinears, StacksBiasesWithTheirRows) {
  ir::Graph g = siblings({{16, DType::kF32, true, 0.5}, {32, DType::kF32, true, 0.5}});
  ASSERT_TRUE(run_pass(g).ok());
  ASSERT_EQ(count_linears(g), 1);
  const ir::Node& n = g.nodes()[0];
  ASSERT_EQ(n.inputs.size(), 3u);
  const ir::Value& b = g.value(n.inputs[2]);
  ASSERT_EQ(b.shape, (std::vector<int64_t>{48}));
  const auto* data = static_cast<const float*>(b.data);
  EXPECT_EQ(std::memcmp(data, test_weights().data() + 3000, 16 * 4), 0);
  EXPECT_EQ(std::memcmp(data + 16, test_weights().data() + 3064, 32 * 4), 0);
  EXPECT_DOUBLE_EQ(n.attr_float("scale", 1.0), 0.5);
}

// A group where one Linear fails a guard fuses the others.
TEST(FuseSiblingLinears, LeavesTheOddOneOut) {
  ir::Graph g = siblings({{32}, {24}, {16}});
  ASSERT_TRUE(run_pass(g).ok());
  EXPECT_EQ(count_linears(g), 2);
}

// ---- must-not-match, one per guard ----------------------------------------

void expect_unchanged(ir::Graph g, const char* why) {
  const size_t before = g.nodes().size();
  auto r = run_pass(g);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_FALSE(*r) << why;
  EXPECT_EQ(g.nodes().size(), before) << why;
}

TEST(FuseSiblingLinears, NotDifferentInputs) {
  ir::Graph g;
  const int x = g.add_input("x", DType::kF32, {3, 32}, ir::RowDim::kTokens);
  const int y = g.add_input("y", DType::kF32, {3, 32}, ir::RowDim::kTokens);
  g.mark_output(node(g, OpKind::kLinear, "a", {x, g.add_weight("a.w", DType::kF32, {16, 32}, test_weights().data())}));
  g.mark_output(node(g, OpKind::kLinear, "b", {y, g.add_weight("b.w", DType::kF32, {16, 32}, test_weights().data())}));
  expect_unchanged(std::move(g), "different inputs");
}

TEST(FuseSiblingLinears, NotAWeightInAnotherDtype) {
  expect_unchanged(siblings({{16}, {16, DType::kBF16}}), "bf16 weight");
}

TEST(FuseSiblingLinears, NotAWeightThatIsNotAConstant) {
  ir::Graph g;
  const int x = g.add_input("x", DType::kF32, {3, 32}, ir::RowDim::kTokens);
  const int w = g.add_input("w", DType::kF32, {16, 32}, ir::RowDim::kFixed);
  g.mark_output(node(g, OpKind::kLinear, "a", {x, w}));
  g.mark_output(node(g, OpKind::kLinear, "b", {x, g.add_weight("b.w", DType::kF32, {16, 32}, test_weights().data())}));
  expect_unchanged(std::move(g), "weight fed as an input");
}

TEST(FuseSiblingLinears, NotAWeightReadTwice) {
  ir::Graph g;
  const int x = g.add_input("x", DType::kF32, {3, 32}, ir::RowDim::kTokens);
  const int w = g.add_weight("w", DType::kF32, {16, 32}, test_weights().data());
  g.mark_output(node(g, OpKind::kLinear, "a", {x, w}));
  g.mark_output(node(g, OpKind::kLinear, "b", {x, w}));
  expect_unchanged(std::move(g), "one weight read by both");
}

TEST(FuseSiblingLinears, NotRowsThatAreNotAMultipleOf16) {
  expect_unchanged(siblings({{16}, {24}}), "24 rows");
}

TEST(FuseSiblingLinears, NotDifferentScales) {
  expect_unchanged(siblings({{16, DType::kF32, false, 0.5}, {16}}), "scale 0.5 vs 1");
}

TEST(FuseSiblingLinears, NotBiasOnOnlyOne) {
  expect_unchanged(siblings({{16, DType::kF32, true}, {16}}), "bias on one");
}

TEST(FuseSiblingLinears, NotALinearAlreadySplit) {
  ir::Graph g = siblings({{16}, {16}});
  ASSERT_TRUE(run_pass(g).ok());
  ASSERT_EQ(count_linears(g), 1);
  expect_unchanged(std::move(g), "second run");
}

// ---- the splits shape rule --------------------------------------------------

std::string split_error(std::vector<int64_t> splits) {
  ir::Graph g;
  const int x = g.add_input("x", DType::kF32, {3, 32}, ir::RowDim::kTokens);
  const int w = g.add_weight("w", DType::kF32, {48, 32}, test_weights().data());
  const int outs = std::max<int>(1, static_cast<int>(splits.size()));
  auto r = g.add_node(OpKind::kLinear, "l", {x, w}, {{"splits", std::move(splits)}}, outs);
  return r.ok() ? "" : r.status().message();
}

TEST(FuseSiblingLinears, SplitsRuleRefusesWhatDoesNotAddUp) {
  EXPECT_EQ(split_error({16, 32}), "");
  EXPECT_NE(split_error({16, 16}).find("add up to 32"), std::string::npos) << split_error({16, 16});
  EXPECT_NE(split_error({16, 48}).find("within the weight's 48 rows"), std::string::npos);
  EXPECT_NE(split_error({24, 24}).find("multiple of 16"), std::string::npos);
  EXPECT_NE(split_error({0, 48}).find("positive"), std::string::npos);
  EXPECT_NE(split_error({-16, 64}).find("positive"), std::string::npos);
  EXPECT_NE(split_error({}).find("1 to 64"), std::string::npos);
  EXPECT_NE(split_error({INT64_MAX - 15, 16}).find("within"), std::string::npos);
}

// ---- numeric equivalence ----------------------------------------------------

// k3-tiny (q 64, k 32, v 32 wide: fused) compiled at O3 against O2, where the
// fusion does not run: the same logits, bit for bit, in every precision and
// layout, since each output element is the same dot product.
std::vector<float> tiny_logits(const std::string& precision, const std::string& layout, int opt_level) {
  CompileOptions o;
  o.prefill_chunk = 16;
  o.ctx_len = 64;
  o.precision = precision;
  o.pipeline.weight_layout = layout;
  o.pipeline.opt_level = opt_level;
  auto m = compile_checkpoint(k3::testing::model_dir("k3-tiny"), o);
  EXPECT_TRUE(m.ok()) << m.status().message();
  int fused = 0;
  for (const ir::Node& n : m->decode.nodes()) fused += n.attr_ints("splits") != nullptr;
  EXPECT_EQ(fused, opt_level >= 3 ? 2 : 0) << "one per layer at O3";
  runtime::EngineOptions eo;
  eo.threads = 2;
  auto e = runtime::Engine::create(std::move(m).value(), eo);
  EXPECT_TRUE(e.ok()) << e.status().message();
  std::vector<float> out = test::step_logits(**e, 0, {5, 17, 42, 99, 3, 1});  // prefill
  const std::vector<float> next = test::step_logits(**e, 6, {7});             // decode
  out.insert(out.end(), next.begin(), next.end());
  return out;
}

TEST(FuseSiblingLinears, SameLogitsBitForBitInEveryPrecisionAndLayout) {
  for (const char* precision : {"fp32", "bf16", "int8"})
    for (const char* layout : {"rows", "panels"}) {
      const auto fused = tiny_logits(precision, layout, 3), plain = tiny_logits(precision, layout, 2);
      ASSERT_EQ(fused.size(), plain.size());
      ASSERT_FALSE(fused.empty());
      EXPECT_EQ(std::memcmp(fused.data(), plain.data(), fused.size() * 4), 0) << precision << " " << layout;
    }
}

}  // namespace
}  // namespace k3::passes
