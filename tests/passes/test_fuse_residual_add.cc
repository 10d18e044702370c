// fuse-residual-add: a residual Add of a Linear's or Moe's result becomes the
// op's epilogue (one must-not-match test per guard), the residual shape rule
// refuses what does not fit, and whole models decode bit for bit the same
// with and without the fusion in every precision.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "fusion_test_util.h"
#include "passes/fuse_residual_add.h"
#include "weight_test_util.h"

namespace k3::passes {
namespace {

using ir::DType;
using ir::OpKind;
using test::node;
using test::test_weights;

constexpr int64_t kD = 32, kF = 16;

// x [3, kD] (tokens), the graph's input.
int input_x(ir::Graph& g) {
  return g.add_input("x", DType::kF32, {3, kD}, ir::RowDim::kTokens);
}

int linear(ir::Graph& g, const std::string& name, int x, int64_t n = kD, std::vector<ir::Attr> attrs = {}) {
  return node(g, OpKind::kLinear, name,
              {x, g.add_weight(name + ".weight", DType::kF32, {n, kD}, test_weights().data())}, std::move(attrs));
}

int moe(ir::Graph& g, const std::string& name, int x) {
  const float* w = test_weights().data();
  std::vector<int> in{x, g.add_weight(name + ".gate", DType::kF32, {2, kD}, w + 11)};
  for (int e = 0; e < 2; ++e) {
    in.push_back(g.add_weight(name + ".up" + std::to_string(e), DType::kF32, {kF, kD}, w + 1000 * e));
    in.push_back(g.add_weight(name + ".down" + std::to_string(e), DType::kF32, {kD, kF}, w + 1000 * e + 600));
  }
  return node(g, OpKind::kMoe, name, in, {{"n_experts", int64_t{2}}, {"top_k", int64_t{1}}});
}

// One decoder layer's residual stream: h1 = x + wo(x), h2 = h1 + moe(h1).
ir::Graph layer() {
  ir::Graph g;
  const int x = input_x(g);
  const int o = linear(g, "attn.wo", x);
  const int h1 = node(g, OpKind::kAdd, "attn.residual", {x, o});
  const int y = moe(g, "moe", h1);
  g.mark_output(node(g, OpKind::kAdd, "moe.residual", {h1, y}));
  return g;
}

StatusOr<bool> run_pass(ir::Graph& g, PassStats* stats = nullptr) {
  FuseResidualAdd pass;
  auto r = pass.run(g);
  if (stats != nullptr) *stats = pass.stats();
  return r;
}

TEST(FuseResidualAdd, FusesBothResidualsOfALayer) {
  ir::Graph g = layer();
  const int x = g.inputs()[0];
  auto r = run_pass(g);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_TRUE(*r);
  ASSERT_EQ(g.nodes().size(), 2u);
  const ir::Node& wo = g.nodes()[0];
  const ir::Node& m = g.nodes()[1];
  EXPECT_EQ(wo.name, "attn.wo+residual");
  EXPECT_EQ(wo.op, OpKind::kLinear);
  EXPECT_EQ(wo.attr_int("residual"), 1);
  ASSERT_EQ(wo.inputs.size(), 3u);
  EXPECT_EQ(wo.inputs[2], x);
  EXPECT_FALSE(ir::linear_has_bias(wo));
  // The outputs keep the Adds' values (names), the last one the graph's output.
  EXPECT_EQ(g.value(wo.outputs[0]).name, "attn.residual");
  EXPECT_EQ(m.name, "moe+residual");
  EXPECT_EQ(m.attr_int("residual"), 1);
  EXPECT_EQ(ir::residual_input(m), static_cast<int>(ir::moe_weights_end(m)));
  EXPECT_EQ(m.inputs.back(), wo.outputs[0]);
  EXPECT_EQ(g.value(m.outputs[0]).name, "moe.residual");
  EXPECT_EQ(g.outputs()[0], m.outputs[0]);
  EXPECT_TRUE(g.verify().ok());
}

// Add(y, h) as well as Add(h, y); a Linear with a bias keeps it (the
// residual comes after it).
TEST(FuseResidualAdd, FusesTheOpAsEitherOperandAndKeepsTheBias) {
  ir::Graph g;
  const int x = input_x(g);
  const int b = g.add_weight("wo.bias", DType::kF32, {kD}, test_weights().data() + 50);
  const int o =
      node(g, OpKind::kLinear, "wo", {x, g.add_weight("wo.weight", DType::kF32, {kD, kD}, test_weights().data()), b});
  g.mark_output(node(g, OpKind::kAdd, "res", {o, x}));
  ASSERT_TRUE(run_pass(g).ok());
  ASSERT_EQ(g.nodes().size(), 1u);
  const ir::Node& n = g.nodes()[0];
  EXPECT_TRUE(ir::linear_has_bias(n));
  EXPECT_EQ(n.inputs[2], g.find_value("wo.bias"));
  EXPECT_EQ(n.inputs[3], x);
}

// The residual computed after the op: the fused node moves to the Add's place.
TEST(FuseResidualAdd, TakesTheAddsPlaceAfterALaterResidual) {
  ir::Graph g;
  const int x = input_x(g);
  const int y = linear(g, "a", x);
  const int h = linear(g, "b", x, kD, {{"scale", 0.5}});
  g.mark_output(node(g, OpKind::kAdd, "res", {h, y}));
  ASSERT_TRUE(run_pass(g).ok());
  ASSERT_EQ(g.nodes().size(), 2u);
  // b (now the residual's producer) fused into nothing: its result is the
  // first operand, tried second, and a's fusion took the Add.
  EXPECT_EQ(g.nodes()[0].name, "b");
  EXPECT_EQ(g.nodes()[1].name, "a+residual");
  EXPECT_TRUE(g.verify().ok());
}

// ---- must-not-match, one per guard ----------------------------------------

void expect_unchanged(ir::Graph g, const char* why, const char* note = nullptr) {
  const size_t before = g.nodes().size();
  PassStats stats;
  auto r = run_pass(g, &stats);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_FALSE(*r) << why;
  EXPECT_EQ(g.nodes().size(), before) << why;
  if (note != nullptr) {
    EXPECT_TRUE(test::any_note_has(stats.notes, note)) << why;
  }
}

TEST(FuseResidualAdd, NotAnAddWithAScale) {
  ir::Graph g;
  const int x = input_x(g);
  g.mark_output(node(g, OpKind::kAdd, "res", {x, linear(g, "wo", x)}, {{"scale", 0.5}}));
  expect_unchanged(std::move(g), "scale 0.5", "has a scale");
}

TEST(FuseResidualAdd, NotAnOperandMadeByAnotherOp) {
  ir::Graph g;
  const int x = input_x(g);
  const int n = node(g, OpKind::kRmsNorm, "norm", {x, g.add_weight("norm.w", DType::kF32, {kD}, test_weights().data())},
                     {{"eps", 1e-5}});
  g.mark_output(node(g, OpKind::kAdd, "res", {x, n}));
  expect_unchanged(std::move(g), "RmsNorm operand");
}

TEST(FuseResidualAdd, NotASplitLinear) {
  ir::Graph g;
  const int x = input_x(g);
  auto outs =
      g.add_node(OpKind::kLinear, "qk", {x, g.add_weight("qk.w", DType::kF32, {2 * kD, kD}, test_weights().data())},
                 {{"splits", std::vector<int64_t>{kD, kD}}}, 2);
  ASSERT_TRUE(outs.ok());
  g.mark_output((*outs)[1]);
  g.mark_output(node(g, OpKind::kAdd, "res", {x, (*outs)[0]}));
  expect_unchanged(std::move(g), "split Linear", "split Linear");
}

TEST(FuseResidualAdd, NotAResultWithAnotherReader) {
  ir::Graph g;
  const int x = input_x(g);
  const int o = linear(g, "wo", x);
  g.mark_output(node(g, OpKind::kAdd, "res", {x, o}));
  g.mark_output(node(g, OpKind::kAdd, "other", {o, o}));
  expect_unchanged(std::move(g), "o read twice", "other readers");
}

TEST(FuseResidualAdd, NotAResultThatIsAGraphOutput) {
  ir::Graph g;
  const int x = input_x(g);
  const int o = linear(g, "wo", x);
  g.mark_output(o);
  g.mark_output(node(g, OpKind::kAdd, "res", {x, o}));
  expect_unchanged(std::move(g), "o is an output", "other readers");
}

// Add(y, y): y's one reader reads it twice.
TEST(FuseResidualAdd, NotTheSameValueTwice) {
  ir::Graph g;
  const int x = input_x(g);
  const int o = linear(g, "wo", x);
  g.mark_output(node(g, OpKind::kAdd, "res", {o, o}));
  expect_unchanged(std::move(g), "Add(o, o)", "other readers");
}

TEST(FuseResidualAdd, NotAnOpThatHasAResidualAlready) {
  ir::Graph g = layer();
  ASSERT_TRUE(run_pass(g).ok());
  expect_unchanged(std::move(g), "second run");
}

// ---- the residual shape rule ------------------------------------------------

std::string residual_error(std::vector<int64_t> shape, DType dt = DType::kF32, int64_t attr = 1,
                           std::vector<int64_t> splits = {}) {
  ir::Graph g;
  const int x = input_x(g);
  const int r = g.add_input("r", dt, std::move(shape), ir::RowDim::kTokens);
  std::vector<ir::Attr> attrs{{"residual", attr}};
  const int outs = splits.empty() ? 1 : static_cast<int>(splits.size());
  if (!splits.empty()) attrs.push_back({"splits", std::move(splits)});
  auto n = g.add_node(OpKind::kLinear, "l", {x, g.add_weight("w", DType::kF32, {kD, kD}, test_weights().data()), r},
                      attrs, outs);
  return n.ok() ? "" : n.status().message();
}

TEST(FuseResidualAdd, ResidualRuleRefusesWhatDoesNotFit) {
  EXPECT_EQ(residual_error({3, kD}), "");
  EXPECT_NE(residual_error({3, kD + 1}).find("residual r must be f32 [3,32], is f32 [3,33]"), std::string::npos)
      << residual_error({3, kD + 1});
  EXPECT_NE(residual_error({3, kD}, DType::kI32).find("must be f32"), std::string::npos);
  EXPECT_NE(residual_error({3, kD}, DType::kF32, 2).find("0 or 1"), std::string::npos);
  EXPECT_NE(residual_error({3, 16}, DType::kF32, 1, {16, 16}).find("one output"), std::string::npos);
  // attr residual 0 with a third input: that input is the bias, [N].
  EXPECT_NE(residual_error({3, kD}, DType::kF32, 0).find("bias"), std::string::npos);
}

// ---- numeric equivalence ----------------------------------------------------

// A preset compiled at O3 with and without the fusion: the same logits, bit
// for bit, in every precision (prefill of 6 tokens, then one decode step),
// since each output element is the op's result plus the same residual.
std::vector<float> logits(const std::string& preset, const std::string& precision, bool fuse) {
  CompileOptions o;
  o.prefill_chunk = 16;
  o.ctx_len = 64;
  o.precision = precision;
  if (!fuse) o.pipeline.disabled = {"fuse-residual-add"};
  auto m = compile_checkpoint(k3::testing::model_dir(preset), o);
  EXPECT_TRUE(m.ok()) << m.status().message();
  if (!m.ok()) return {};
  int fused = 0, adds = 0;
  for (const ir::Node& n : m->decode.nodes()) {
    fused += ir::residual_input(n) >= 0;
    adds += n.op == OpKind::kAdd;
  }
  EXPECT_EQ(fused, fuse ? 2 * m->config.n_layers : 0) << preset;
  EXPECT_EQ(adds, fuse ? 0 : 2 * m->config.n_layers) << preset;
  runtime::EngineOptions eo;
  eo.threads = 2;
  auto e = runtime::Engine::create(std::move(m).value(), eo);
  EXPECT_TRUE(e.ok()) << e.status().message();
  if (!e.ok()) return {};
  std::vector<float> out = test::step_logits(**e, 0, {5, 17, 42, 99, 3, 1});  // prefill
  const std::vector<float> next = test::step_logits(**e, 6, {7});             // decode
  out.insert(out.end(), next.begin(), next.end());
  return out;
}

TEST(FuseResidualAdd, SameLogitsBitForBitInEveryPrecision) {
  for (const char* preset : {"k3-tiny", "moe-swiglu-small"})
    for (const char* precision : {"fp32", "bf16", "int8"}) {
      const auto fused = logits(preset, precision, true), plain = logits(preset, precision, false);
      ASSERT_EQ(fused.size(), plain.size());
      ASSERT_FALSE(fused.empty());
      EXPECT_EQ(std::memcmp(fused.data(), plain.data(), fused.size() * 4), 0) << preset << " " << precision;
    }
}

}  // namespace
}  // namespace k3::passes
