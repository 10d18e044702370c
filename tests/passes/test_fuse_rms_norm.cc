// fuse-rms-norm pass: the forms the exporters write fold into one
// onnx.RMSNormalization with unchanged outputs, and one must-not-match test
// per guard; plus the RMSNormalization kernel against a hand computation.
#include <gtest/gtest.h>

#include "kernels/onnx_ref/onnx_ref.h"
#include "passes/fuse_rms_norm.h"
#include "passes/fusion_test_util.h"

namespace k3::passes {
namespace {

using namespace test;  // NOLINT

constexpr int64_t kD = 8;

// Knobs for the decomposed RMSNorm; the defaults are the TorchScript form
// of k3ref's Norm: Mul(x, x) -> ReduceMean -> Add eps -> Sqrt -> Div(x, .) -> Mul w.
struct Rms {
  std::vector<int64_t> x_shape = {2, 3, kD};
  DType dtype = DType::kF32;
  bool axes_input = false;
  int64_t axis = -1;
  int64_t keepdims = 1;
  bool square_by_pow = false;
  double exponent = 2;
  std::vector<int64_t> eps_shape = {};
  bool eps_input = false;
  bool reciprocal = false;  // Mul(x, Reciprocal(std)) instead of Div(x, std)
  bool scale = true;
  bool swap_scale = false;
  std::vector<int64_t> scale_shape = {kD};
  bool scale_input = false;
  bool square_output = false, ms_extra_reader = false, std_extra_reader = false;
};

ir::Graph build(const Rms& o) {
  Builder b;
  const DType dt = o.dtype;
  const int in = b.input("in", o.x_shape, dt);
  const int x = b.node(OpKind::kOnnxRelu, "pre", {in});
  const int sq = o.square_by_pow ? b.node(OpKind::kOnnxPow, "rms/pow", {x, b.scalar("two", o.exponent, dt)})
                                 : b.node(OpKind::kOnnxMul, "rms/sq", {x, x});
  const int ms = o.axes_input
                     ? b.node(OpKind::kOnnxReduceMean, "rms/mean",
                              {sq, b.weight("axes", {1}, {double(o.axis)}, DType::kI64)}, {{"keepdims", o.keepdims}})
                     : b.node(OpKind::kOnnxReduceMean, "rms/mean", {sq},
                              {{"axes", std::vector<int64_t>{o.axis}}, {"keepdims", o.keepdims}});
  const int eps = o.eps_input
                      ? b.input("eps", o.eps_shape, dt)
                      : b.weight("eps", o.eps_shape, std::vector<double>(o.eps_shape.empty() ? 1 : 8, 1e-6), dt);
  const int sd = b.node(OpKind::kOnnxSqrt, "rms/sqrt", {b.node(OpKind::kOnnxAdd, "rms/add", {ms, eps})});
  int y = o.reciprocal ? b.node(OpKind::kOnnxMul, "rms/mul_inv", {b.node(OpKind::kOnnxReciprocal, "rms/inv", {sd}), x})
                       : b.node(OpKind::kOnnxDiv, "rms/div", {x, sd});
  if (o.scale) {
    const int w = o.scale_input ? b.input("w", o.scale_shape, dt) : b.ramp("norm.weight", o.scale_shape, dt);
    y = o.swap_scale ? b.node(OpKind::kOnnxMul, "rms/mul", {w, y}) : b.node(OpKind::kOnnxMul, "rms/mul", {y, w});
  }
  b.g.mark_output(b.node(OpKind::kOnnxAdd, "residual", {x, y}));
  b.g.mark_output(b.node(OpKind::kOnnxTanh, "post", {y}));
  if (o.square_output) b.g.mark_output(sq);
  if (o.ms_extra_reader) b.g.mark_output(b.node(OpKind::kOnnxNeg, "ms_reader", {ms}));
  if (o.std_extra_reader) b.g.mark_output(b.node(OpKind::kOnnxNeg, "std_reader", {sd}));
  EXPECT_TRUE(b.g.verify().ok()) << b.g.verify().message();
  return std::move(b.g);
}

FuseRmsNorm run_checked(ir::Graph& g, bool want_change) {
  const ir::Graph before = g;
  FuseRmsNorm pass;
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

const ir::Node* find_rms(const ir::Graph& g) {
  for (const ir::Node& n : g.nodes())
    if (n.op == OpKind::kOnnxRMSNormalization) return &n;
  return nullptr;
}

TEST(FuseRmsNorm, FusesTorchScriptForm) {
  ir::Graph g = build({});
  FuseRmsNorm pass = run_checked(g, true);
  EXPECT_EQ(pass.stats().matched, 1);
  EXPECT_EQ(pass.stats().applied, 1);
  EXPECT_TRUE(pass.stats().notes.empty());
  ASSERT_EQ(g.nodes().size(), 4u);  // pre, RMSNormalization, residual, post
  const ir::Node* n = find_rms(g);
  ASSERT_NE(n, nullptr);
  EXPECT_EQ(n, &g.nodes()[1]);
  EXPECT_NEAR(n->attr_float("epsilon"), 1e-6, 1e-12);
  EXPECT_EQ(n->attr_int("axis"), -1);
  ASSERT_EQ(n->inputs.size(), 2u);
  EXPECT_EQ(g.value(n->inputs[1]).name, "norm.weight");
  EXPECT_EQ(g.value(n->outputs[0]).name, "rms/mul");
  FuseRmsNorm again;
  auto c2 = again.run(g);
  ASSERT_TRUE(c2.ok());
  EXPECT_FALSE(*c2);
}

TEST(FuseRmsNorm, FusesPowReciprocalAxesInputSwappedScale) {
  Rms o;
  o.square_by_pow = true;
  o.reciprocal = true;
  o.axes_input = true;
  o.axis = 2;
  o.swap_scale = true;
  o.scale_shape = {1, 1, kD};
  o.eps_shape = {1, 1};
  ir::Graph g = build(o);
  run_checked(g, true);
  const ir::Node* n = find_rms(g);
  ASSERT_NE(n, nullptr);
  EXPECT_EQ(g.value(n->inputs[1]).shape, (std::vector<int64_t>{kD}));
  EXPECT_EQ(g.nodes().size(), 4u);
}

TEST(FuseRmsNorm, FusesWithoutScaleUsingUnitScale) {
  Rms o;
  o.scale = false;
  ir::Graph g = build(o);
  run_checked(g, true);
  const ir::Node* n = find_rms(g);
  ASSERT_NE(n, nullptr);
  EXPECT_EQ(g.value(n->outputs[0]).name, "rms/div");
  EXPECT_EQ(g.value(n->inputs[1]).shape, (std::vector<int64_t>{kD}));
}

// ---- must not match: one test per guard ----

void expect_no_match(const Rms& o, const std::string& note) {
  ir::Graph g = build(o);
  FuseRmsNorm pass = run_checked(g, false);
  EXPECT_EQ(pass.stats().matched, 0);
  EXPECT_EQ(count_op(g, OpKind::kOnnxRMSNormalization), 0);
  if (!note.empty()) {
    EXPECT_TRUE(any_note_has(pass.stats().notes, note)) << "want a note with: " << note;
  }
}

TEST(FuseRmsNorm, MustNotMatchMeanOverAnotherAxis) {
  Rms o;
  o.axis = 1;
  expect_no_match(o, "RMSNorm pattern but mean over axis 1");
}

TEST(FuseRmsNorm, MustNotMatchKeepdimsZero) {
  Rms o;
  o.x_shape = {kD, kD};
  o.keepdims = 0;
  o.axes_input = true;
  expect_no_match(o, "keepdims=0");
}

TEST(FuseRmsNorm, MustNotMatchF64) {
  Rms o;
  o.dtype = DType::kF64;
  expect_no_match(o, "not f32");
}

TEST(FuseRmsNorm, MustNotMatchExponentOtherThanTwo) {
  Rms o;
  o.square_by_pow = true;
  o.exponent = 4;
  expect_no_match(o, "exponent");
}

TEST(FuseRmsNorm, MustNotMatchEpsNotScalar) {
  Rms o;
  o.eps_shape = {kD};
  expect_no_match(o, "eps");
}

TEST(FuseRmsNorm, MustNotMatchEpsNotConstant) {
  Rms o;
  o.eps_input = true;
  expect_no_match(o, "eps");
}

TEST(FuseRmsNorm, MustNotMatchSquareThatIsAGraphOutput) {
  Rms o;
  o.square_output = true;
  expect_no_match(o, "square has other readers");
}

TEST(FuseRmsNorm, MustNotMatchMeanSquareWithAnotherReader) {
  Rms o;
  o.ms_extra_reader = true;
  expect_no_match(o, "mean square");
}

TEST(FuseRmsNorm, MustNotMatchRmsWithAnotherReader) {
  Rms o;
  o.std_extra_reader = true;
  o.reciprocal = true;
  expect_no_match(o, "root mean square");
}

TEST(FuseRmsNorm, MustNotFoldScaleThatIsNotAWeight) {
  Rms o;
  o.scale_input = true;
  ir::Graph g = build(o);
  run_checked(g, true);
  const ir::Node* n = find_rms(g);
  ASSERT_NE(n, nullptr);
  EXPECT_EQ(g.value(n->outputs[0]).name, "rms/div");  // the Mul by w stays
  EXPECT_EQ(count_op(g, OpKind::kOnnxMul), 1);
}

TEST(FuseRmsNorm, MustNotFoldScaleBroadcastOverOtherAxes) {
  Rms o;
  o.scale_shape = {3, 1};  // per-row
  ir::Graph g = build(o);
  FuseRmsNorm pass = run_checked(g, true);
  EXPECT_TRUE(any_note_has(pass.stats().notes, "fused without rms/mul"));
  EXPECT_EQ(count_op(g, OpKind::kOnnxMul), 1);
}

// The RMSNormalization reference kernel (opset 23; not in the ONNX 1.12 node
// tests) against a hand computation: x [2, 3], scale [3], axis -1, and
// axis 0 with a scalar-broadcast scale [1].
TEST(OnnxRMSNormalization, KernelMatchesHandComputation) {
  Builder b;
  const int x = b.input("x", {2, 3});
  const int w = b.weight("w", {3}, {0.5, -1.0, 2.0});
  const int w1 = b.weight("w1", {1}, {3.0});
  const int y = b.node(OpKind::kOnnxRMSNormalization, "rms", {x, w}, {{"epsilon", 0.25}});
  const int y0 = b.node(OpKind::kOnnxRMSNormalization, "rms0", {x, w1}, {{"axis", int64_t{0}}});
  b.g.mark_output(y);
  b.g.mark_output(y0);
  ASSERT_TRUE(b.g.verify().ok()) << b.g.verify().message();
  auto it = runtime::interp::Interpreter::create(b.g);
  ASSERT_TRUE(it.ok()) << it.status().message();
  ir::Tensor t = *ir::Tensor::zeros(DType::kF32, {2, 3});
  const float xv[6] = {1, 2, 3, -4, 0, 4};
  std::memcpy(t.raw_mut(), xv, sizeof xv);
  auto r = it->run({{"x", t}});
  ASSERT_TRUE(r.ok()) << r.status().message();
  // Row 0: mean(1, 4, 9) = 14/3; row 1: mean(16, 0, 16) = 32/3.
  const double inv0 = 1 / std::sqrt(14.0 / 3 + 0.25), inv1 = 1 / std::sqrt(32.0 / 3 + 0.25);
  const double want[6] = {1 * inv0 * 0.5, 2 * inv0 * -1, 3 * inv0 * 2, -4 * inv1 * 0.5, 0, 4 * inv1 * 2};
  for (int i = 0; i < 6; ++i) EXPECT_NEAR((*r)[0].tensor.data<float>()[i], want[i], 1e-6) << i;
  // axis 0 normalizes over all 6 values: mean square = (14 + 32) / 6, eps 1e-5 (default).
  const double inv = 1 / std::sqrt(46.0 / 6 + 1e-5);
  for (int i = 0; i < 6; ++i) EXPECT_NEAR((*r)[1].tensor.data<float>()[i], xv[i] * inv * 3, 1e-6) << i;
}

TEST(OnnxRMSNormalization, ShapeRuleRejectsBadScale) {
  Builder b;
  const int x = b.input("x", {2, 3});
  const int w = b.weight("w", {2, 3}, {1, 1, 1, 1, 1, 1});
  auto r = b.g.add_node(OpKind::kOnnxRMSNormalization, "rms", {x, w}, {});
  EXPECT_FALSE(r.ok());
  auto r2 = b.g.add_node(OpKind::kOnnxRMSNormalization, "rms", {x}, {});
  EXPECT_FALSE(r2.ok());
}

}  // namespace
}  // namespace k3::passes
