// fuse-layer-norm pass: the forms the exporters write fold into one
// onnx.LayerNormalization with unchanged outputs, and one must-not-match
// test per guard.
#include <gtest/gtest.h>

#include "passes/fuse_layer_norm.h"
#include "passes/fusion_test_util.h"

namespace k3::passes {
namespace {

using namespace test;  // NOLINT

constexpr int64_t kD = 8;

// Knobs for the decomposed LayerNorm; the defaults are the TorchScript form.
struct Ln {
  std::vector<int64_t> x_shape = {2, 3, kD};
  DType dtype = DType::kF32;
  bool axes_input = false;  // axes as a constant input (opset 18) instead of the attribute
  int64_t axis1 = -1, axis2 = -1;
  int64_t keepdims2 = 1;
  bool square_by_mul = false;
  double exponent = 2;
  bool eps_first = false;
  std::vector<int64_t> eps_shape = {};
  bool eps_input = false;  // eps a graph input instead of a constant
  bool gamma = true, beta = true;
  bool swap_affine = false;  // Mul(gamma, .), Add(beta, .)
  std::vector<int64_t> gamma_shape = {kD};
  bool gamma_input = false;  // gamma a graph input instead of a weight
  // Extra readers / outputs of intermediates.
  bool mean_output = false, d_extra_reader = false, var_output = false, std_extra_reader = false;
  bool div_output = false;
};

struct Built {
  ir::Graph g;
  int y = -1;
};

Built build(const Ln& o) {
  Builder b;
  const DType dt = o.dtype;
  const int in = b.input("in", o.x_shape, dt);
  const int x = b.node(OpKind::kOnnxRelu, "pre", {in});  // x produced by a node, also read after
  auto reduce = [&](const std::string& name, int v, int64_t axis, int64_t keep) {
    if (o.axes_input)
      return b.node(OpKind::kOnnxReduceMean, name, {v, b.weight(name + ".axes", {1}, {double(axis)}, DType::kI64)},
                    {{"keepdims", keep}});
    return b.node(OpKind::kOnnxReduceMean, name, {v}, {{"axes", std::vector<int64_t>{axis}}, {"keepdims", keep}});
  };
  const int mean = reduce("ln/mean", x, o.axis1, 1);
  const int d = b.node(OpKind::kOnnxSub, "ln/sub", {x, mean});
  const int sq = o.square_by_mul ? b.node(OpKind::kOnnxMul, "ln/sq", {d, d})
                                 : b.node(OpKind::kOnnxPow, "ln/pow", {d, b.scalar("two", o.exponent, dt)});
  const int var = reduce("ln/var", sq, o.axis2, o.keepdims2);
  int eps = o.eps_input ? b.input("eps", o.eps_shape, dt)
                        : b.weight("eps", o.eps_shape, std::vector<double>(o.eps_shape.empty() ? 1 : 8, 1e-5), dt);
  const int ve = o.eps_first ? b.node(OpKind::kOnnxAdd, "ln/add_eps", {eps, var})
                             : b.node(OpKind::kOnnxAdd, "ln/add_eps", {var, eps});
  const int sd = b.node(OpKind::kOnnxSqrt, "ln/sqrt", {ve});
  int y = b.node(OpKind::kOnnxDiv, "ln/div", {d, sd});
  if (o.div_output) b.g.mark_output(y);
  if (o.gamma) {
    const int gm = o.gamma_input ? b.input("gamma", o.gamma_shape, dt) : b.ramp("ln.weight", o.gamma_shape, dt);
    y = o.swap_affine ? b.node(OpKind::kOnnxMul, "ln/mul", {gm, y}) : b.node(OpKind::kOnnxMul, "ln/mul", {y, gm});
  }
  if (o.beta) {
    const int bt = b.ramp("ln.bias", {kD}, dt);
    y = o.swap_affine ? b.node(OpKind::kOnnxAdd, "ln/add", {bt, y}) : b.node(OpKind::kOnnxAdd, "ln/add", {y, bt});
  }
  // y has two readers (like the exported q/k/v projections); x is read again (residual).
  const int r1 = b.node(OpKind::kOnnxAdd, "residual", {x, y});
  const int r2 = b.node(OpKind::kOnnxTanh, "post", {y});
  b.g.mark_output(r1);
  b.g.mark_output(r2);
  if (o.mean_output) b.g.mark_output(mean);
  if (o.var_output) b.g.mark_output(var);
  if (o.d_extra_reader) b.g.mark_output(b.node(OpKind::kOnnxNeg, "d_reader", {d}));
  if (o.std_extra_reader) b.g.mark_output(b.node(OpKind::kOnnxNeg, "std_reader", {sd}));
  EXPECT_TRUE(b.g.verify().ok()) << b.g.verify().message();
  return {std::move(b.g), y};
}

// Runs the pass and checks verify() and numeric equivalence; returns the pass.
FuseLayerNorm run_checked(ir::Graph& g, bool want_change) {
  const ir::Graph before = g;
  FuseLayerNorm pass;
  auto changed = pass.run(g);
  EXPECT_TRUE(changed.ok()) << changed.status().message();
  EXPECT_EQ(changed.ok() && *changed, want_change);
  EXPECT_TRUE(g.verify().ok()) << g.verify().message();
  if (!want_change) {
    EXPECT_EQ(g.nodes().size(), before.nodes().size());
  }
  expect_same_outputs(before, g);
  return pass;
}

const ir::Node* find_ln(const ir::Graph& g) {
  for (const ir::Node& n : g.nodes())
    if (n.op == OpKind::kOnnxLayerNormalization) return &n;
  return nullptr;
}

TEST(FuseLayerNorm, FusesTorchScriptForm) {
  Built b = build({});
  FuseLayerNorm pass = run_checked(b.g, true);
  EXPECT_EQ(pass.stats().matched, 1);
  EXPECT_EQ(pass.stats().applied, 1);
  EXPECT_TRUE(pass.stats().notes.empty());
  // pre, LayerNormalization, residual, post.
  ASSERT_EQ(b.g.nodes().size(), 4u);
  const ir::Node* ln = find_ln(b.g);
  ASSERT_NE(ln, nullptr);
  EXPECT_EQ(ln, &b.g.nodes()[1]);
  EXPECT_NEAR(ln->attr_float("epsilon"), 1e-5, 1e-11);
  EXPECT_EQ(ln->attr_int("axis"), -1);
  ASSERT_EQ(ln->inputs.size(), 3u);
  EXPECT_EQ(b.g.value(ln->inputs[1]).name, "ln.weight");
  EXPECT_EQ(b.g.value(ln->inputs[2]).name, "ln.bias");
  EXPECT_EQ(b.g.value(ln->outputs[0]).name, "ln/add");
  EXPECT_EQ(b.g.find_value("eps"), -1);  // unread constants are dropped
  // A second run finds nothing.
  FuseLayerNorm again;
  auto c2 = again.run(b.g);
  ASSERT_TRUE(c2.ok());
  EXPECT_FALSE(*c2);
}

TEST(FuseLayerNorm, FusesAxesInputMulSquareSwappedOperandsAndRankedGamma) {
  Ln o;
  o.axes_input = true;
  o.square_by_mul = true;
  o.eps_first = true;
  o.eps_shape = {1};
  o.swap_affine = true;
  o.gamma_shape = {1, 1, kD};
  o.axis1 = 2;  // positive last axis
  Built b = build(o);
  FuseLayerNorm pass = run_checked(b.g, true);
  EXPECT_EQ(pass.stats().applied, 1);
  const ir::Node* ln = find_ln(b.g);
  ASSERT_NE(ln, nullptr);
  EXPECT_EQ(b.g.value(ln->inputs[1]).shape, (std::vector<int64_t>{kD}));
  EXPECT_EQ(b.g.nodes().size(), 4u);
}

TEST(FuseLayerNorm, FusesWithoutAffineUsingUnitScale) {
  Ln o;
  o.gamma = false;
  o.beta = false;
  Built b = build(o);
  run_checked(b.g, true);
  const ir::Node* ln = find_ln(b.g);
  ASSERT_NE(ln, nullptr);
  ASSERT_EQ(ln->inputs.size(), 2u);
  EXPECT_EQ(b.g.value(ln->inputs[1]).shape, (std::vector<int64_t>{kD}));
  EXPECT_EQ(b.g.value(ln->outputs[0]).name, "ln/div");
}

TEST(FuseLayerNorm, FusesWithBiasOnly) {
  Ln o;
  o.gamma = false;
  Built b = build(o);
  run_checked(b.g, true);
  const ir::Node* ln = find_ln(b.g);
  ASSERT_NE(ln, nullptr);
  ASSERT_EQ(ln->inputs.size(), 3u);
  EXPECT_EQ(b.g.value(ln->inputs[2]).name, "ln.bias");
}

TEST(FuseLayerNorm, FusesTwoInSequenceKeepingTopologicalOrder) {
  Builder b;
  int x = b.input("in", {4, kD});
  for (int k = 0; k < 2; ++k) {
    const std::string p = "ln" + std::to_string(k);
    const int mean = b.node(OpKind::kOnnxReduceMean, p + "/mean", {x}, {{"axes", std::vector<int64_t>{-1}}});
    const int d = b.node(OpKind::kOnnxSub, p + "/sub", {x, mean});
    const int sq = b.node(OpKind::kOnnxPow, p + "/pow", {d, b.scalar(p + ".two", 2)});
    const int var = b.node(OpKind::kOnnxReduceMean, p + "/var", {sq}, {{"axes", std::vector<int64_t>{-1}}});
    const int sd = b.node(OpKind::kOnnxSqrt, p + "/sqrt",
                          {b.node(OpKind::kOnnxAdd, p + "/eps", {var, b.scalar(p + ".eps", 1e-6)})});
    const int n = b.node(OpKind::kOnnxDiv, p + "/div", {d, sd});
    const int s = b.node(OpKind::kOnnxMul, p + "/mul", {n, b.ramp(p + ".weight", {kD})});
    x = b.node(OpKind::kOnnxMatMul, p + "/proj",
               {b.node(OpKind::kOnnxAdd, p + "/add", {s, b.ramp(p + ".bias", {kD})}), b.ramp(p + ".w", {kD, kD})});
  }
  b.g.mark_output(x);
  FuseLayerNorm pass = run_checked(b.g, true);
  EXPECT_EQ(pass.stats().applied, 2);
  ASSERT_EQ(b.g.nodes().size(), 4u);
  EXPECT_EQ(count_op(b.g, OpKind::kOnnxLayerNormalization), 2);
  EXPECT_NEAR(b.g.nodes()[0].attr_float("epsilon"), 1e-6, 1e-12);
}

// ---- must not match: one test per guard ----

void expect_no_match(const Ln& o, const std::string& note) {
  Built b = build(o);
  FuseLayerNorm pass = run_checked(b.g, false);
  EXPECT_EQ(pass.stats().matched, 0);
  EXPECT_EQ(count_op(b.g, OpKind::kOnnxLayerNormalization), 0);
  if (!note.empty()) {
    EXPECT_TRUE(any_note_has(pass.stats().notes, note)) << "want a note with: " << note;
  }
}

TEST(FuseLayerNorm, MustNotMatchMeanOverAnotherAxis) {
  Ln o;
  o.axis1 = 1;
  expect_no_match(o, "LayerNorm pattern but mean over axis 1");
}

TEST(FuseLayerNorm, MustNotMatchVarianceOverAnotherAxis) {
  Ln o;
  o.axis2 = 1;
  o.axes_input = true;
  expect_no_match(o, "variance: mean over axis 1");
}

TEST(FuseLayerNorm, MustNotMatchKeepdimsZero) {
  Ln o;
  o.x_shape = {kD, kD};  // keepdims=0 still broadcasts (wrongly) against [D, D]
  o.keepdims2 = 0;
  expect_no_match(o, "keepdims=0");
}

TEST(FuseLayerNorm, MustNotMatchF64) {
  Ln o;
  o.dtype = DType::kF64;
  expect_no_match(o, "not f32");
}

TEST(FuseLayerNorm, MustNotMatchExponentOtherThanTwo) {
  Ln o;
  o.exponent = 3;
  expect_no_match(o, "exponent");
}

TEST(FuseLayerNorm, MustNotMatchEpsNotScalar) {
  Ln o;
  o.eps_shape = {kD};
  expect_no_match(o, "eps");
}

TEST(FuseLayerNorm, MustNotMatchEpsNotConstant) {
  Ln o;
  o.eps_input = true;
  expect_no_match(o, "eps");
}

TEST(FuseLayerNorm, MustNotMatchMeanWithAnotherReader) {
  Ln o;
  o.mean_output = true;
  expect_no_match(o, "mean has other readers");
}

TEST(FuseLayerNorm, MustNotMatchDiffWithAnotherReader) {
  Ln o;
  o.d_extra_reader = true;
  expect_no_match(o, "also read by d_reader");
}

TEST(FuseLayerNorm, MustNotMatchVarianceThatIsAGraphOutput) {
  Ln o;
  o.var_output = true;
  expect_no_match(o, "variance");
}

TEST(FuseLayerNorm, MustNotMatchStdWithAnotherReader) {
  Ln o;
  o.std_extra_reader = true;
  expect_no_match(o, "standard deviation");
}

// Gamma/beta guards: the LayerNorm is fused, the affine step is not.
TEST(FuseLayerNorm, MustNotFoldGammaThatIsNotAWeight) {
  Ln o;
  o.gamma_input = true;
  Built b = build(o);
  run_checked(b.g, true);
  const ir::Node* ln = find_ln(b.g);
  ASSERT_NE(ln, nullptr);
  EXPECT_EQ(ln->inputs.size(), 2u);                     // unit scale, no bias
  EXPECT_EQ(b.g.value(ln->outputs[0]).name, "ln/div");  // the Mul by gamma stays
  EXPECT_EQ(count_op(b.g, OpKind::kOnnxMul), 1);
}

TEST(FuseLayerNorm, MustNotFoldGammaBroadcastOverOtherAxes) {
  Ln o;
  o.gamma_shape = {1, 3, kD};  // per-row scale: not a LayerNorm weight
  Built b = build(o);
  FuseLayerNorm pass = run_checked(b.g, true);
  EXPECT_TRUE(any_note_has(pass.stats().notes, "fused without ln/mul"));
  const ir::Node* ln = find_ln(b.g);
  ASSERT_NE(ln, nullptr);
  EXPECT_EQ(b.g.value(ln->outputs[0]).name, "ln/div");
  EXPECT_EQ(count_op(b.g, OpKind::kOnnxMul), 1);
  EXPECT_EQ(count_op(b.g, OpKind::kOnnxAdd), 2);  // beta add stays, plus residual
}

TEST(FuseLayerNorm, MustNotSwallowDivThatIsAGraphOutput) {
  Ln o;
  o.div_output = true;
  Built b = build(o);
  run_checked(b.g, true);
  const ir::Node* ln = find_ln(b.g);
  ASSERT_NE(ln, nullptr);
  EXPECT_EQ(b.g.value(ln->outputs[0]).name, "ln/div");
  EXPECT_EQ(count_op(b.g, OpKind::kOnnxMul), 1);
}

}  // namespace
}  // namespace k3::passes
