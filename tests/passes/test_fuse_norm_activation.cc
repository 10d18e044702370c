// fuse-norm-activation pass: LayerNorm / RMSNorm -> [layout/broadcast ops]
// -> unary activation becomes k3.NormAct followed by the same layout ops,
// with unchanged outputs; one must-not-match test per guard; and the
// k3.NormAct reference kernel against the norm and activation ops it
// stands for.
#include <gtest/gtest.h>

#include "passes/fuse_norm_activation.h"
#include "passes/fusion_test_util.h"

namespace k3::passes {
namespace {

using namespace test;  // NOLINT

std::vector<ir::Attr> norm_attrs() {
  return {{"axis", int64_t{-1}}, {"epsilon", 1e-5}};
}

// x [2,1,8] -> LayerNormalization (or RMSNormalization) -> n.
int add_norm(Builder& b, int x, bool rms, DType dt = DType::kF32) {
  const int w = b.ramp("w", {8}, dt);
  if (rms) return b.node(OpKind::kOnnxRMSNormalization, "norm", {x, w}, norm_attrs());
  return b.node(OpKind::kOnnxLayerNormalization, "norm", {x, w, b.ramp("bias", {8}, dt)}, norm_attrs());
}

int gelu(Builder& b, int v, const std::string& approximate = "none") {
  return b.node(OpKind::kOnnxGelu, "act", {v}, {{"approximate", approximate}});
}

// n -> Expand to [2,3,8] (broadcasts the size-1 dim).
int expand(Builder& b, int v) {
  return b.node(OpKind::kOnnxExpand, "expand", {v, b.weight("target", {3}, {2, 3, 8}, DType::kI64)});
}

FuseNormActivation run_checked(ir::Graph& g, bool want_change) {
  const ir::Graph before = g;
  FuseNormActivation pass;
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

const ir::Node& only_norm_act(const ir::Graph& g) {
  for (const ir::Node& n : g.nodes())
    if (n.op == OpKind::kK3NormAct) return n;
  ADD_FAILURE() << "no k3.NormAct";
  return g.nodes()[0];
}

std::string str_attr(const ir::Node& n, const char* key) {
  const auto* a = n.find_attr(key);
  if (a == nullptr || std::get_if<std::string>(a) == nullptr) return "<missing>";
  return std::get<std::string>(*a);
}

TEST(FuseNormActivation, FusesLayerNormGelu) {
  Builder b;
  const int x = b.input("x", {2, 1, 8});
  b.g.mark_output(gelu(b, add_norm(b, x, false)));
  FuseNormActivation pass = run_checked(b.g, true);
  EXPECT_EQ(pass.stats().applied, 1);
  ASSERT_EQ(b.g.nodes().size(), 1u);
  const ir::Node& n = b.g.nodes()[0];
  ASSERT_EQ(n.op, OpKind::kK3NormAct);
  EXPECT_EQ(str_attr(n, "norm"), "layer");
  EXPECT_EQ(str_attr(n, "activation"), "gelu");
  EXPECT_EQ(n.attr_int("axis"), -1);
  EXPECT_DOUBLE_EQ(n.attr_float("epsilon"), 1e-5);
  EXPECT_EQ(n.inputs.size(), 3u);
  EXPECT_TRUE(b.g.value(n.outputs[0]).is_output);
}

// The article's case: the norm output is broadcast before the GeLU.
TEST(FuseNormActivation, FusesLayerNormExpandGeluOnTheUnbroadcastTensor) {
  Builder b;
  const int x = b.input("x", {2, 1, 8});
  b.g.mark_output(gelu(b, expand(b, add_norm(b, x, false))));
  run_checked(b.g, true);
  ASSERT_EQ(b.g.nodes().size(), 2u);  // k3.NormAct, Expand
  const ir::Node& na = b.g.nodes()[0];
  ASSERT_EQ(na.op, OpKind::kK3NormAct);
  EXPECT_EQ(str_attr(na, "activation"), "gelu");
  // The activation now runs on [2,1,8], not the broadcast [2,3,8].
  EXPECT_EQ(b.g.value(na.outputs[0]).shape, (std::vector<int64_t>{2, 1, 8}));
  const ir::Node& ex = b.g.nodes()[1];
  ASSERT_EQ(ex.op, OpKind::kOnnxExpand);
  EXPECT_EQ(ex.inputs[0], na.outputs[0]);
  EXPECT_EQ(b.g.value(ex.outputs[0]).shape, (std::vector<int64_t>{2, 3, 8}));
  EXPECT_TRUE(b.g.value(ex.outputs[0]).is_output);
  EXPECT_EQ(count_op(b.g, OpKind::kOnnxGelu), 0);
}

TEST(FuseNormActivation, FusesRmsNormUnsqueezeRelu) {
  Builder b;
  const int x = b.input("x", {2, 8});
  const int n = add_norm(b, x, true);
  const int u = b.node(OpKind::kOnnxUnsqueeze, "unsqueeze", {n, b.weight("axes", {1}, {1}, DType::kI64)});
  b.g.mark_output(b.node(OpKind::kOnnxRelu, "act", {u}));
  run_checked(b.g, true);
  ASSERT_EQ(b.g.nodes().size(), 2u);
  const ir::Node& na = only_norm_act(b.g);
  EXPECT_EQ(str_attr(na, "norm"), "rms");
  EXPECT_EQ(str_attr(na, "activation"), "relu");
  EXPECT_EQ(na.inputs.size(), 2u);
  EXPECT_EQ(b.g.nodes()[1].op, OpKind::kOnnxUnsqueeze);
}

// tanh GeLU is recorded as gelu_tanh, erf GeLU as gelu: never confused
// (the outputs differ by ~1e-3, which expect_same_outputs would catch).
TEST(FuseNormActivation, RecordsTanhGeluExactly) {
  for (const char* approx : {"tanh", "none"}) {
    SCOPED_TRACE(approx);
    Builder b;
    const int x = b.input("x", {2, 1, 8});
    const int t =
        b.node(OpKind::kOnnxTranspose, "transpose", {add_norm(b, x, false)}, {{"perm", std::vector<int64_t>{1, 0, 2}}});
    b.g.mark_output(gelu(b, t, approx));
    run_checked(b.g, true);
    EXPECT_EQ(str_attr(only_norm_act(b.g), "activation"), std::string(approx) == "tanh" ? "gelu_tanh" : "gelu");
  }
}

TEST(FuseNormActivation, FusesLongLayoutChainsAndEveryActivation) {
  for (OpKind act : {OpKind::kOnnxSigmoid, OpKind::kOnnxTanh, OpKind::kOnnxRelu, OpKind::kOnnxGelu}) {
    SCOPED_TRACE(ir::op_name(act));
    Builder b;
    const int x = b.input("x", {2, 8});
    int v =
        b.node(OpKind::kOnnxUnsqueeze, "unsqueeze", {add_norm(b, x, false), b.weight("axes", {1}, {1}, DType::kI64)});
    v = expand(b, v);
    v = b.node(OpKind::kOnnxTile, "tile", {v, b.weight("reps", {3}, {1, 1, 2}, DType::kI64)});
    v = b.node(OpKind::kOnnxReshape, "reshape", {v, b.weight("shape", {2}, {6, 16}, DType::kI64)});
    v = b.node(OpKind::kOnnxSqueeze, "squeeze",
               {b.node(OpKind::kOnnxFlatten, "flatten", {v}, {{"axis", int64_t{0}}}),
                b.weight("sq_axes", {1}, {0}, DType::kI64)});
    b.g.mark_output(b.node(act, "act", {v}));
    FuseNormActivation pass = run_checked(b.g, true);
    EXPECT_EQ(b.g.nodes().size(), 7u);  // k3.NormAct + 6 layout ops
    EXPECT_EQ(b.g.nodes()[0].op, OpKind::kK3NormAct);
    EXPECT_EQ(b.g.value(b.g.nodes()[0].outputs[0]).shape, (std::vector<int64_t>{2, 8}));
    EXPECT_TRUE(any_note_has(pass.stats().notes, "moved above 6 layout ops"));
  }
}

// A shape input computed at run time, but not from the chain, is fine.
TEST(FuseNormActivation, FusesExpandToARuntimeShape) {
  Builder b;
  const int x = b.input("x", {2, 1, 8});
  const int z = b.input("z", {2, 3, 8});
  const int s = b.node(OpKind::kOnnxShape, "shape_of_z", {z});
  const int e = b.node(OpKind::kOnnxExpand, "expand", {add_norm(b, x, false), s});
  b.g.mark_output(gelu(b, e));
  run_checked(b.g, true);
  EXPECT_EQ(count_op(b.g, OpKind::kK3NormAct), 1);
}

// ---- must not match: one test per guard ----

FuseNormActivation expect_no_match(ir::Graph& g, const std::string& note) {
  FuseNormActivation pass = run_checked(g, false);
  EXPECT_EQ(pass.stats().matched, 0);
  EXPECT_EQ(count_op(g, OpKind::kK3NormAct), 0);
  if (!note.empty()) {
    EXPECT_TRUE(any_note_has(pass.stats().notes, note)) << "want a note with: " << note;
  }
  return pass;
}

TEST(FuseNormActivation, MustNotMatchF64) {
  Builder b;
  const int x = b.input("x", {2, 1, 8}, DType::kF64);
  b.g.mark_output(gelu(b, expand(b, add_norm(b, x, false, DType::kF64))));
  expect_no_match(b.g, "not f32");
}

TEST(FuseNormActivation, MustNotMatchNormOutputWithAnotherReader) {
  Builder b;
  const int x = b.input("x", {2, 1, 8});
  const int n = add_norm(b, x, false);
  b.g.mark_output(gelu(b, n));
  b.g.mark_output(b.node(OpKind::kOnnxNeg, "other", {n}));
  expect_no_match(b.g, "2 readers, not one");
}

TEST(FuseNormActivation, MustNotMatchNormOutputThatIsAGraphOutput) {
  Builder b;
  const int x = b.input("x", {2, 1, 8});
  const int n = add_norm(b, x, true);
  b.g.mark_output(gelu(b, n));
  b.g.mark_output(n);
  expect_no_match(b.g, "is a graph output");
}

TEST(FuseNormActivation, MustNotMatchIntermediateThatIsAGraphOutput) {
  Builder b;
  const int x = b.input("x", {2, 1, 8});
  const int e = expand(b, add_norm(b, x, false));
  b.g.mark_output(gelu(b, e));
  b.g.mark_output(e);
  expect_no_match(b.g, "expand is a graph output");
}

TEST(FuseNormActivation, MustNotMatchIntermediateWithAnotherReader) {
  Builder b;
  const int x = b.input("x", {2, 1, 8});
  const int e = expand(b, add_norm(b, x, false));
  b.g.mark_output(gelu(b, e));
  b.g.mark_output(b.node(OpKind::kOnnxNeg, "other", {e}));
  expect_no_match(b.g, "2 readers, not one");
}

TEST(FuseNormActivation, MustNotMatchWhenLayerNormMeanIsUsed) {
  Builder b;
  const int x = b.input("x", {2, 1, 8});
  auto outs = b.g.add_node(OpKind::kOnnxLayerNormalization, "norm", {x, b.ramp("w", {8}), b.ramp("bias", {8})},
                           norm_attrs(), 3);
  ASSERT_TRUE(outs.ok()) << outs.status().message();
  const std::vector<int> o = *outs;
  b.g.mark_output(gelu(b, o[0]));
  b.g.mark_output(o[1]);
  expect_no_match(b.g, "output 1");
}

// Expand(n, Shape(n)): the shape input is computed from the norm output.
TEST(FuseNormActivation, MustNotMatchShapeInputComputedFromTheChain) {
  Builder b;
  const int x = b.input("x", {2, 1, 8});
  const int n = add_norm(b, x, false);
  const int e = b.node(OpKind::kOnnxExpand, "expand", {n, b.node(OpKind::kOnnxShape, "shape_of_n", {n})});
  b.g.mark_output(gelu(b, e));
  expect_no_match(b.g, "computed from the norm output");
}

TEST(FuseNormActivation, MustNotMatchBinaryOpWithAnotherTensor) {
  Builder b;
  const int x = b.input("x", {2, 1, 8});
  const int other = b.input("other", {2, 3, 8});
  b.g.mark_output(b.node(OpKind::kOnnxAdd, "add", {expand(b, add_norm(b, x, false)), other}));
  expect_no_match(b.g, "read by Add, not a unary activation");
  // Directly after the norm too (no note: a norm read by an Add is common).
  Builder b2;
  const int x2 = b2.input("x", {2, 1, 8});
  b2.g.mark_output(b2.node(OpKind::kOnnxAdd, "add", {add_norm(b2, x2, false), b2.input("other", {2, 1, 8})}));
  expect_no_match(b2.g, "");
}

TEST(FuseNormActivation, MustNotMatchUnsupportedUnaryOp) {
  Builder b;
  const int x = b.input("x", {2, 1, 8});
  b.g.mark_output(b.node(OpKind::kOnnxExp, "exp", {expand(b, add_norm(b, x, false))}));
  expect_no_match(b.g, "read by Exp");
}

// ---- the k3.NormAct reference kernel vs the ops it stands for ----

TEST(K3NormActKernel, MatchesNormThenActivation) {
  struct Act {
    OpKind op;
    const char* approximate;
    const char* name;
  };
  for (bool rms : {false, true})
    for (const Act& a : {Act{OpKind::kOnnxGelu, "none", "gelu"}, Act{OpKind::kOnnxGelu, "tanh", "gelu_tanh"},
                         Act{OpKind::kOnnxRelu, "", "relu"}, Act{OpKind::kOnnxSigmoid, "", "sigmoid"},
                         Act{OpKind::kOnnxTanh, "", "tanh"}}) {
      SCOPED_TRACE(testing::Message() << "rms " << rms << " " << a.name);
      Builder composed;
      {
        const int x = composed.input("x", {3, 2, 8});
        const int n = add_norm(composed, x, rms);
        std::vector<ir::Attr> attrs;
        if (a.op == OpKind::kOnnxGelu) attrs.push_back({"approximate", std::string(a.approximate)});
        composed.g.mark_output(composed.node(a.op, "act", {n}, attrs));
      }
      Builder fused;
      {
        const int x = fused.input("x", {3, 2, 8});
        std::vector<int> in = {x, fused.ramp("w", {8})};
        if (!rms) in.push_back(fused.ramp("bias", {8}));
        std::vector<ir::Attr> attrs = {{"norm", std::string(rms ? "rms" : "layer")},
                                       {"activation", std::string(a.name)},
                                       {"axis", int64_t{-1}},
                                       {"epsilon", 1e-5}};
        fused.g.mark_output(fused.node(OpKind::kK3NormAct, "norm_act", in, attrs));
      }
      expect_same_outputs(composed.g, fused.g);
    }
}

TEST(K3NormActKernel, BadAttributesAreAnError) {
  Builder b;
  const int x = b.input("x", {2, 8});
  const int w = b.ramp("w", {8});
  auto bad_act = b.g.add_node(OpKind::kK3NormAct, "na", {x, w},
                              {{"norm", std::string("rms")}, {"activation", std::string("swish")}});
  EXPECT_FALSE(bad_act.ok());
  auto bad_norm = b.g.add_node(OpKind::kK3NormAct, "na", {x, w},
                               {{"norm", std::string("batch")}, {"activation", std::string("relu")}});
  EXPECT_FALSE(bad_norm.ok());
  auto rms_with_bias = b.g.add_node(OpKind::kK3NormAct, "na", {x, w, b.ramp("bias", {8})},
                                    {{"norm", std::string("rms")}, {"activation", std::string("relu")}});
  EXPECT_FALSE(rms_with_bias.ok());
}

}  // namespace
}  // namespace k3::passes
