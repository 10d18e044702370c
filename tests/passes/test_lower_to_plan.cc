// lower-to-plan: an onnx-dialect decoder whose data path has planned
// equivalents becomes the fused step graph (engine calling convention);
// anything else leaves the graph as it is with a note naming the node.
#include <gtest/gtest.h>

#include <ostream>

#include "passes/fusion_test_util.h"
#include "passes/lower_to_plan.h"

namespace k3::passes {
namespace {

using ir::OpKind;
using test::Builder;
using test::count_op;

enum class Variant { kPlain, kRelu, kActivationWeight, kNormAxis0, kShapeArithmetic, kGatherND };

constexpr int64_t kV = 16, kD = 8;

ir::Graph decoder(Variant v) {
  Builder b;
  const int ids = b.input("input_ids", {1, -1}, ir::DType::kI64);
  b.input("position_ids", {1, -1}, ir::DType::kI64);
  const int table = b.ramp("embed", {kV, kD});
  int h = -1;
  if (v == Variant::kGatherND) {
    // The dynamo exporter's lookup: GatherND(table, Unsqueeze(ids, -1)).
    const int idx = b.node(OpKind::kOnnxUnsqueeze, "ids_col", {ids, b.weight("minus1", {1}, {-1}, ir::DType::kI64)});
    h = b.node(OpKind::kOnnxGatherND, "embed", {table, idx}, {{"batch_dims", int64_t{0}}});
  } else {
    h = b.node(OpKind::kOnnxGather, "embed", {table, ids}, {{"axis", int64_t{0}}});
  }
  if (v == Variant::kShapeArithmetic) {
    // A Reshape whose target is computed from Shape(): only rows matter.
    const int shp = b.node(OpKind::kOnnxShape, "shape", {h});
    h = b.node(OpKind::kOnnxReshape, "reshape", {h, shp});
  }
  if (v == Variant::kRelu) h = b.node(OpKind::kOnnxRelu, "relu", {h});
  const int64_t axis = v == Variant::kNormAxis0 ? 0 : -1;
  const int n = b.node(OpKind::kOnnxLayerNormalization, "norm", {h, b.ramp("ln_w", {kD}), b.ramp("ln_b", {kD})},
                       {{"axis", axis}, {"epsilon", 1e-5}});
  const int w = v == Variant::kActivationWeight ? b.input("w", {kD, kV}) : b.ramp("lm_head", {kD, kV});
  const int logits = b.node(OpKind::kOnnxMatMul, "logits", {n, w});
  b.g.values()[static_cast<size_t>(logits)].name = "logits";
  b.g.mark_output(logits);
  EXPECT_TRUE(b.g.verify().ok()) << b.g.verify().message();
  return std::move(b.g);
}

PipelineOptions::PlanShape shape() {
  return {4, 1, 1, 32};
}

TEST(LowerToPlan, BuildsTheStepGraph) {
  for (Variant v : {Variant::kPlain, Variant::kShapeArithmetic, Variant::kGatherND}) {
    ir::Graph g = decoder(v);
    LowerToPlan pass(shape());
    auto changed = pass.run(g);
    ASSERT_TRUE(changed.ok()) << changed.status().message();
    ASSERT_TRUE(*changed) << (pass.stats().notes.empty() ? "" : pass.stats().notes[0]);
    ASSERT_TRUE(g.verify().ok()) << g.verify().message();
    for (const ir::Node& n : g.nodes()) EXPECT_FALSE(ir::is_onnx_op(n.op)) << n.name;
    EXPECT_EQ(count_op(g, OpKind::kEmbedding), 1);
    EXPECT_EQ(count_op(g, OpKind::kLayerNorm), 1);
    EXPECT_EQ(count_op(g, OpKind::kGatherRows), 1);  // only the asked-for rows reach the vocabulary
    ASSERT_EQ(g.outputs().size(), 1u);
    const ir::Value& out = g.value(g.outputs()[0]);
    EXPECT_EQ(out.shape, (std::vector<int64_t>{1, kV}));
    EXPECT_EQ(out.row_dim, ir::RowDim::kOutRows);
    // The MatMul's [K, N] weight is stored transposed, [N, K].
    for (const ir::Node& n : g.nodes()) {
      if (n.op == OpKind::kLinear) {
        EXPECT_EQ(g.value(n.inputs[1]).shape, (std::vector<int64_t>{kV, kD}));
      }
    }
    for (const char* in : {"tokens", "positions", "slots", "out_rows"}) EXPECT_GE(g.find_value(in), 0) << in;
  }
}

TEST(LowerToPlan, NoShapeMeansNoLowering) {
  ir::Graph g = decoder(Variant::kPlain);
  LowerToPlan pass({});
  auto changed = pass.run(g);
  ASSERT_TRUE(changed.ok());
  EXPECT_FALSE(*changed);
}

struct Case {
  Variant v;
  const char* note;
  // gtest prints the parameter beside each test's name; without this it
  // prints the struct's bytes, pointer included, which differ run to run.
  friend void PrintTo(const Case& c, std::ostream* os) { *os << c.note; }
};
class LowerToPlanGuard : public ::testing::TestWithParam<Case> {};

TEST_P(LowerToPlanGuard, LeavesTheGraphAndSaysWhy) {
  ir::Graph g = decoder(GetParam().v);
  const size_t nodes = g.nodes().size();
  LowerToPlan pass(shape());
  auto changed = pass.run(g);
  ASSERT_TRUE(changed.ok());
  EXPECT_FALSE(*changed);
  EXPECT_EQ(g.nodes().size(), nodes);
  EXPECT_TRUE(test::any_note_has(pass.stats().notes, GetParam().note)) << GetParam().note;
}

INSTANTIATE_TEST_SUITE_P(Guards, LowerToPlanGuard,
                         ::testing::Values(Case{Variant::kRelu, "relu (onnx.Relu): has no planned equivalent"},
                                           Case{Variant::kActivationWeight, "constant f32 [K, N]"},
                                           Case{Variant::kNormAxis0, "last axis"}));

}  // namespace
}  // namespace k3::passes
