// fuse-gelu pass: the erf GeLU orders the exporters write (and the tanh
// approximation) fold into one onnx.Gelu with unchanged outputs, and one
// must-not-match test per guard.
#include <gtest/gtest.h>

#include "passes/fuse_gelu.h"
#include "passes/fusion_test_util.h"

namespace k3::passes {
namespace {

using namespace test;  // NOLINT

constexpr double kSqrt2 = 1.4142135623730951;

enum class Tail { kA, kB, kC };  // see fuse_gelu.cc: (x*a)*0.5, x*(0.5*a), (x*0.5)*a

struct Gelu {
  DType dtype = DType::kF32;
  bool mul_form = false;  // Mul(x, 1/sqrt2) instead of Div(x, sqrt2)
  double scale = kSqrt2;  // divisor (or 1/factor)
  double one = 1.0, half = 0.5;
  Tail tail = Tail::kA;
  bool swap = false;  // constants first / a first
  bool scaled_output = false, erf_extra_reader = false, inner_output = false;
};

ir::Graph build(const Gelu& o) {
  Builder b;
  const DType dt = o.dtype;
  const int in = b.input("in", {3, 16}, dt);
  const int x = b.node(OpKind::kOnnxMatMul, "up", {in, b.ramp("w_up", {16, 16}, dt)});
  const int u = o.mul_form ? b.node(OpKind::kOnnxMul, "g/mul_s", {x, b.scalar("inv_sqrt2", 1 / o.scale, dt)})
                           : b.node(OpKind::kOnnxDiv, "g/div", {x, b.scalar("sqrt2", o.scale, dt)});
  const int e = b.node(OpKind::kOnnxErf, "g/erf", {u});
  const int one = b.scalar("one", o.one, dt);
  const int a = o.swap ? b.node(OpKind::kOnnxAdd, "g/add", {one, e}) : b.node(OpKind::kOnnxAdd, "g/add", {e, one});
  const int half = b.scalar("half", o.half, dt);
  int y = -1, inner = -1;
  switch (o.tail) {
    case Tail::kA:
      inner = o.swap ? b.node(OpKind::kOnnxMul, "g/mul", {a, x}) : b.node(OpKind::kOnnxMul, "g/mul", {x, a});
      y = o.swap ? b.node(OpKind::kOnnxMul, "g/mul_half", {half, inner})
                 : b.node(OpKind::kOnnxMul, "g/mul_half", {inner, half});
      break;
    case Tail::kB:
      inner = o.swap ? b.node(OpKind::kOnnxMul, "g/mul_half", {a, half})
                     : b.node(OpKind::kOnnxMul, "g/mul_half", {half, a});
      y = o.swap ? b.node(OpKind::kOnnxMul, "g/mul", {inner, x}) : b.node(OpKind::kOnnxMul, "g/mul", {x, inner});
      break;
    case Tail::kC:
      inner = o.swap ? b.node(OpKind::kOnnxMul, "g/mul_half", {half, x})
                     : b.node(OpKind::kOnnxMul, "g/mul_half", {x, half});
      y = o.swap ? b.node(OpKind::kOnnxMul, "g/mul", {a, inner}) : b.node(OpKind::kOnnxMul, "g/mul", {inner, a});
      break;
  }
  b.g.mark_output(b.node(OpKind::kOnnxMatMul, "down", {y, b.ramp("w_down", {16, 4}, dt)}));
  b.g.mark_output(b.node(OpKind::kOnnxAdd, "skip", {x, x}));  // x has other readers
  if (o.scaled_output) b.g.mark_output(u);
  if (o.erf_extra_reader) b.g.mark_output(b.node(OpKind::kOnnxNeg, "erf_reader", {e}));
  if (o.inner_output) b.g.mark_output(inner);
  EXPECT_TRUE(b.g.verify().ok()) << b.g.verify().message();
  return std::move(b.g);
}

FuseGelu run_checked(ir::Graph& g, bool want_change) {
  const ir::Graph before = g;
  FuseGelu pass;
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

void expect_fused(const Gelu& o, const std::string& approximate = "none") {
  ir::Graph g = build(o);
  FuseGelu pass = run_checked(g, true);
  EXPECT_EQ(pass.stats().matched, 1);
  EXPECT_EQ(pass.stats().applied, 1);
  EXPECT_TRUE(pass.stats().notes.empty());
  ASSERT_EQ(g.nodes().size(), 4u);  // up, Gelu, down, skip
  const ir::Node& n = g.nodes()[1];
  ASSERT_EQ(n.op, OpKind::kOnnxGelu);
  const auto* a = n.find_attr("approximate");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(std::get<std::string>(*a), approximate);
  EXPECT_EQ(g.value(n.inputs[0]).name, "up");
}

TEST(FuseGelu, FusesTorchScriptForm) {
  expect_fused({});  // Div, Erf, Add(e, 1), Mul(x, a), Mul(., 0.5)
}

TEST(FuseGelu, FusesDynamoForm) {
  Gelu o;
  o.tail = Tail::kB;  // Mul(0.5, a), Mul(x, .)
  expect_fused(o);
}

TEST(FuseGelu, FusesEveryTailOrderAndOperandOrder) {
  for (Tail t : {Tail::kA, Tail::kB, Tail::kC})
    for (bool swap : {false, true})
      for (bool mul : {false, true}) {
        SCOPED_TRACE(testing::Message() << "tail " << int(t) << " swap " << swap << " mul " << mul);
        Gelu o;
        o.tail = t;
        o.swap = swap;
        o.mul_form = mul;
        expect_fused(o);
      }
}

TEST(FuseGelu, FusesF32RoundedConstants) {
  Gelu o;
  o.scale = static_cast<float>(kSqrt2);  // 1.41421354 as exported
  o.mul_form = true;                     // 0.70710677
  expect_fused(o);
}

// x * 0.5 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3))), cube as Pow or x*x*x.
ir::Graph build_tanh(bool pow_cube, double cubic) {
  Builder b;
  const int in = b.input("in", {3, 16});
  const int x = b.node(OpKind::kOnnxMatMul, "up", {in, b.ramp("w_up", {16, 16})});
  const int cube = pow_cube ? b.node(OpKind::kOnnxPow, "t/pow", {x, b.scalar("three", 3)})
                            : b.node(OpKind::kOnnxMul, "t/cube", {x, b.node(OpKind::kOnnxMul, "t/sq", {x, x})});
  const int k = b.node(OpKind::kOnnxMul, "t/k", {b.scalar("c", cubic), cube});
  const int inner = b.node(OpKind::kOnnxAdd, "t/inner", {x, k});
  const int u = b.node(OpKind::kOnnxMul, "t/u", {inner, b.scalar("s", 0.7978845608028654)});
  const int a = b.node(OpKind::kOnnxAdd, "t/add", {b.node(OpKind::kOnnxTanh, "t/tanh", {u}), b.scalar("one", 1)});
  const int y =
      b.node(OpKind::kOnnxMul, "t/mul_half", {b.node(OpKind::kOnnxMul, "t/mul", {x, a}), b.scalar("half", 0.5)});
  b.g.mark_output(b.node(OpKind::kOnnxMatMul, "down", {y, b.ramp("w_down", {16, 4})}));
  EXPECT_TRUE(b.g.verify().ok()) << b.g.verify().message();
  return std::move(b.g);
}

TEST(FuseGelu, FusesTanhApproximation) {
  for (bool pow_cube : {true, false}) {
    ir::Graph g = build_tanh(pow_cube, 0.044715);
    FuseGelu pass = run_checked(g, true);
    EXPECT_EQ(pass.stats().applied, 1);
    ASSERT_EQ(g.nodes().size(), 3u);
    EXPECT_EQ(g.nodes()[1].op, OpKind::kOnnxGelu);
    EXPECT_EQ(std::get<std::string>(*g.nodes()[1].find_attr("approximate")), "tanh");
  }
}

// ---- must not match: one test per guard ----

void expect_no_match(const Gelu& o, const std::string& note) {
  ir::Graph g = build(o);
  FuseGelu pass = run_checked(g, false);
  EXPECT_EQ(pass.stats().matched, 0);
  EXPECT_EQ(count_op(g, OpKind::kOnnxGelu), 0);
  if (!note.empty()) {
    EXPECT_TRUE(any_note_has(pass.stats().notes, note)) << "want a note with: " << note;
  }
}

TEST(FuseGelu, MustNotMatchWrongDivisor) {
  Gelu o;
  o.scale = 1.4142;  // 1.7e-5 relative off
  expect_no_match(o, "GeLU pattern but the divisor is 1.41");
}

TEST(FuseGelu, MustNotMatchWrongFactor) {
  Gelu o;
  o.mul_form = true;
  o.scale = 2.0;
  expect_no_match(o, "the factor is 0.5");
}

TEST(FuseGelu, MustNotMatchWrongOne) {
  Gelu o;
  o.one = 1.001;
  expect_no_match(o, "the constant added");
}

TEST(FuseGelu, MustNotMatchWrongHalf) {
  for (Tail t : {Tail::kA, Tail::kB, Tail::kC}) {
    Gelu o;
    o.tail = t;
    o.half = 0.25;
    expect_no_match(o, "the half is 0.25");
  }
}

TEST(FuseGelu, MustNotMatchF64) {
  Gelu o;
  o.dtype = DType::kF64;
  expect_no_match(o, "not f32");
}

TEST(FuseGelu, MustNotMatchScaledInputThatIsAGraphOutput) {
  Gelu o;
  o.scaled_output = true;
  expect_no_match(o, "other readers");
}

TEST(FuseGelu, MustNotMatchErfWithAnotherReader) {
  Gelu o;
  o.erf_extra_reader = true;
  expect_no_match(o, "Erf/Tanh result");
}

TEST(FuseGelu, MustNotMatchInnerProductThatIsAGraphOutput) {
  for (Tail t : {Tail::kA, Tail::kB, Tail::kC}) {
    Gelu o;
    o.tail = t;
    o.inner_output = true;
    expect_no_match(o, "");
  }
}

TEST(FuseGelu, MustNotMatchTanhWithWrongCubicCoefficient) {
  ir::Graph g = build_tanh(true, 0.05);
  FuseGelu pass = run_checked(g, false);
  EXPECT_TRUE(any_note_has(pass.stats().notes, "cubic coefficient"));
}

}  // namespace
}  // namespace k3::passes
