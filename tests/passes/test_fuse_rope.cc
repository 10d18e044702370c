// fuse-rope: the exported rotary embedding (table Gather by position,
// rotate-half on the head-split layout) -> one k3.Rope before the head
// split, numerically identical; and one must-not-match test per guard.
#include <gtest/gtest.h>

#include <ostream>

#include "passes/fuse_rope.h"
#include "passes/fusion_test_util.h"

namespace k3::passes {
namespace {

using ir::OpKind;
using test::Builder;
using test::count_op;

// What to break in the exported pattern (kNone builds it intact).
enum class Break {
  kNone,
  kSign,
  kSliceAtOne,
  kTableInput,
  kOtherPositions,
  kOutputProduct,
  kPerm,
  kRepeated,
  kGatherND,           // intact, tables read as the dynamo exporter does: GatherND(table, Unsqueeze(pos, -1))
  kGatherNDConstIndex  // GatherND by a constant index tensor, not by the positions
};

constexpr int64_t kB = 1, kS = 3, kH = 2, kHd = 4, kHalf = 2, kL = 8;

ir::Graph rope_graph(Break brk) {
  Builder b;
  const int y = b.input("y", {kB, kS, kH * kHd});
  const int shape = b.weight("split_shape", {4}, {kB, kS, kH, kHd}, ir::DType::kI64);
  const int r = b.node(OpKind::kOnnxReshape, "reshape", {y, shape});
  const std::vector<int64_t> perm{0, 2, 1, 3};
  // kPerm: the rotated tensor arrives already head-split, with no split to see through.
  const int xt = brk == Break::kPerm ? b.input("xt", {kB, kH, kS, kHd})
                                     : b.node(OpKind::kOnnxTranspose, "transpose", {r}, {{"perm", perm}});
  // kSliceAtOne: the first half read from 1:3 instead of 0:2 (same widths).
  const double lo = brk == Break::kSliceAtOne ? 1 : 0;
  auto c64 = [&](const std::string& n, double v) { return b.weight(n, {1}, {v}, ir::DType::kI64); };
  const int last = c64("axis", -1), one = c64("step", 1);
  const int x1 = b.node(OpKind::kOnnxSlice, "slice1", {xt, c64("s1", lo), c64("e1", lo + kHalf), last, one});
  const int x2 = b.node(OpKind::kOnnxSlice, "slice2", {xt, c64("s2", kHalf), c64("e2", 1e9), last, one});
  const int pos = b.weight("positions", {kB, kS}, {5, 0, 7}, ir::DType::kI64);
  const int pos2 = b.weight("positions2", {kB, kS}, {1, 2, 3}, ir::DType::kI64);
  const int cos_t = brk == Break::kTableInput ? b.input("cos_table", {kL, kHalf}) : b.ramp("cos_table", {kL, kHalf});
  const int sin_t =
      b.weight("sin_table", {kL, kHalf},
               {0.3, -0.2, 0.1, 0.9, -0.5, 0.4, 0.7, -0.8, 0.2, 0.6, -0.1, 0.05, 0.33, -0.44, 0.55, 0.66});
  const int ax1 = c64("unsq_axis", 1);
  const bool nd = brk == Break::kGatherND || brk == Break::kGatherNDConstIndex;
  auto table = [&](const std::string& n, int t, int p) {
    int gth = -1;
    if (nd) {
      const int idx = brk == Break::kGatherNDConstIndex
                          ? b.weight(n + "_idx", {kB, kS, 1}, {5, 0, 7}, ir::DType::kI64)
                          : b.node(OpKind::kOnnxUnsqueeze, n + "_idx", {p, c64(n + "_idx_axis", -1)});
      gth = b.node(OpKind::kOnnxGatherND, n + "_gather", {t, idx}, {{"batch_dims", int64_t{0}}});
    } else {
      gth = b.node(OpKind::kOnnxGather, n + "_gather", {t, p}, {{"axis", int64_t{0}}});
    }
    return b.node(OpKind::kOnnxUnsqueeze, n + "_unsqueeze", {gth, ax1});
  };
  const int c = table("cos", cos_t, pos);
  const int s = table("sin", sin_t, brk == Break::kOtherPositions ? pos2 : pos);
  const int m0 = b.node(OpKind::kOnnxMul, "m0", {x1, c});
  const int m1 = b.node(OpKind::kOnnxMul, "m1", {x2, s});
  const int m2 = b.node(OpKind::kOnnxMul, "m2", {c, x2});  // operands swapped: still a match
  const int m3 = b.node(OpKind::kOnnxMul, "m3", {x1, s});
  const int first = b.node(OpKind::kOnnxSub, "sub", {m0, m1});
  const int second = b.node(brk == Break::kSign ? OpKind::kOnnxSub : OpKind::kOnnxAdd, "add", {m3, m2});
  const int out = b.node(OpKind::kOnnxConcat, "concat", {first, second}, {{"axis", int64_t{-1}}});
  b.g.mark_output(out);
  if (brk == Break::kOutputProduct) b.g.mark_output(m0);
  if (brk == Break::kRepeated) {
    // The same rotation on a second projection (q and k share the tables).
    const int y2 = b.input("y2", {kB, kS, kH * kHd});
    const int r2 = b.node(OpKind::kOnnxReshape, "reshape2", {y2, shape});
    const int xt2 = b.node(OpKind::kOnnxTranspose, "transpose2", {r2}, {{"perm", perm}});
    const int a1 = b.node(OpKind::kOnnxSlice, "k_slice1", {xt2, c64("t1", 0), c64("u1", kHalf), last, one});
    const int a2 = b.node(OpKind::kOnnxSlice, "k_slice2", {xt2, c64("t2", kHalf), c64("u2", 1e9), last, one});
    const int k0 = b.node(OpKind::kOnnxMul, "k0", {a1, c});
    const int k1 = b.node(OpKind::kOnnxMul, "k1", {a2, s});
    const int k2 = b.node(OpKind::kOnnxMul, "k2", {a2, c});
    const int k3 = b.node(OpKind::kOnnxMul, "k3", {a1, s});
    const int ks = b.node(OpKind::kOnnxSub, "k_sub", {k0, k1});
    const int ka = b.node(OpKind::kOnnxAdd, "k_add", {k2, k3});
    b.g.mark_output(b.node(OpKind::kOnnxConcat, "k_concat", {ks, ka}, {{"axis", int64_t{3}}}));
  }
  EXPECT_TRUE(b.g.verify().ok()) << b.g.verify().message();
  return std::move(b.g);
}

TEST(FuseRope, RewritesToRopeBeforeTheHeadSplit) {
  ir::Graph g = rope_graph(Break::kNone);
  const ir::Graph before = g;
  FuseRope pass;
  auto changed = pass.run(g);
  ASSERT_TRUE(changed.ok()) << changed.status().message();
  EXPECT_TRUE(*changed);
  ASSERT_TRUE(g.verify().ok()) << g.verify().message();
  EXPECT_EQ(pass.stats().applied, 1);
  EXPECT_EQ(count_op(g, OpKind::kK3Rope), 1);
  EXPECT_EQ(count_op(g, OpKind::kOnnxSub), 0);
  EXPECT_EQ(count_op(g, OpKind::kOnnxConcat), 0);
  EXPECT_EQ(count_op(g, OpKind::kOnnxSlice), 0);
  // The rope reads the projection itself, not the head split.
  for (const ir::Node& n : g.nodes())
    if (n.op == OpKind::kK3Rope) {
      EXPECT_EQ(g.value(n.inputs[0]).name, "y");
      EXPECT_EQ(n.attr_int("head_dim"), kHd);
    }
  test::expect_same_outputs(before, g);
}

// The dynamo exporter reads the tables with GatherND(table [L, half],
// Unsqueeze(pos, -1), batch_dims 0): the same rows as Gather(table, pos).
TEST(FuseRope, TablesReadByGatherND) {
  ir::Graph g = rope_graph(Break::kGatherND);
  const ir::Graph before = g;
  FuseRope pass;
  auto changed = pass.run(g);
  ASSERT_TRUE(changed.ok()) << changed.status().message();
  EXPECT_TRUE(*changed);
  ASSERT_TRUE(g.verify().ok()) << g.verify().message();
  EXPECT_EQ(count_op(g, OpKind::kK3Rope), 1);
  for (const ir::Node& n : g.nodes())
    if (n.op == OpKind::kK3Rope) {
      EXPECT_EQ(g.value(n.inputs[1]).name, "positions");
    }
  test::expect_same_outputs(before, g);
}

TEST(FuseRope, SharedTablesServeTwoRotations) {
  ir::Graph g = rope_graph(Break::kRepeated);
  const ir::Graph before = g;
  FuseRope pass;
  ASSERT_TRUE(pass.run(g).ok());
  EXPECT_EQ(count_op(g, OpKind::kK3Rope), 2);
  test::expect_same_outputs(before, g);
}

struct GuardCase {
  Break brk;
  const char* why;
  // gtest prints the parameter beside each test's name; without this it
  // prints the struct's bytes, pointer included, which differ run to run.
  friend void PrintTo(const GuardCase& c, std::ostream* os) { *os << (*c.why ? c.why : "not a rope"); }
};

class FuseRopeGuard : public ::testing::TestWithParam<GuardCase> {};

TEST_P(FuseRopeGuard, MustNotMatch) {
  ir::Graph g = rope_graph(GetParam().brk);
  const size_t nodes = g.nodes().size();
  FuseRope pass;
  auto changed = pass.run(g);
  ASSERT_TRUE(changed.ok());
  EXPECT_FALSE(*changed);
  EXPECT_EQ(g.nodes().size(), nodes);
  EXPECT_EQ(count_op(g, OpKind::kK3Rope), 0);
  if (GetParam().why[0] != '\0') {
    EXPECT_TRUE(test::any_note_has(pass.stats().notes, GetParam().why)) << GetParam().why;
  }
}

INSTANTIATE_TEST_SUITE_P(Guards, FuseRopeGuard,
                         ::testing::Values(GuardCase{Break::kSign, ""},  // Concat(Sub, Sub): not a rope at all
                                           GuardCase{Break::kSliceAtOne, "split the head at half"},
                                           GuardCase{Break::kTableInput, "not a constant"},
                                           GuardCase{Break::kOtherPositions, "different positions"},
                                           GuardCase{Break::kOutputProduct, "another reader"},
                                           GuardCase{Break::kPerm, "Transpose(0,2,1,3)"},
                                           GuardCase{Break::kGatherNDConstIndex, "Unsqueeze(index, -1)"}));

TEST(K3RopeKernel, PositionOutsideTheTableIsAnError) {
  Builder b;
  const int x = b.input("x", {1, 1, 4});
  const int pos = b.weight("pos", {1, 1}, {9}, ir::DType::kI64);
  const int cos_t = b.ramp("cos", {4, 2}), sin_t = b.ramp("sin", {4, 2});
  b.g.mark_output(b.node(OpKind::kK3Rope, "rope", {x, pos, cos_t, sin_t}, {{"head_dim", int64_t{4}}}));
  auto it = runtime::interp::Interpreter::create(b.g);
  ASSERT_TRUE(it.ok());
  auto r = it->run(test::inputs_for(b.g));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("outside the rotary table"), std::string::npos);
}

}  // namespace
}  // namespace k3::passes
