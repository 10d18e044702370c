// dead-code pass: what it removes, and one must-not-remove test per guard
// (graph output, node writing state, graph input); the pipeline's options.
#include <gtest/gtest.h>

#include <vector>

#include "passes/dead_code.h"
#include "passes/pipeline.h"

namespace k3::passes {
namespace {

using ir::DType;
using ir::OpKind;
using ir::RowDim;

// Weights for small graphs: all share one zeroed buffer (contents do not
// matter to the pass).
const float* zeros() {
  static std::vector<float> z(4096, 0.0f);
  return z.data();
}

int node(ir::Graph& g, OpKind op, const std::string& name, std::vector<int> in, std::vector<ir::Attr> attrs = {}) {
  auto r = g.add_node(op, name, std::move(in), std::move(attrs));
  EXPECT_TRUE(r.ok()) << r.status().message();
  return r.ok() ? (*r)[0] : -1;
}

// tokens -> Embedding -> x;  x -> LayerNorm -> out (graph output);
// x -> Linear(w_dead) -> dead1 -> Linear(w_dead2) -> dead2 (nobody reads).
ir::Graph graph_with_dead_chain() {
  ir::Graph g;
  const int tokens = g.add_input("tokens", DType::kI32, {4}, RowDim::kTokens);
  const int table = g.add_weight("table", DType::kF32, {16, 8}, zeros());
  const int x = node(g, OpKind::kEmbedding, "embed", {table, tokens});
  const int w = g.add_weight("norm.weight", DType::kF32, {8}, zeros());
  const int b = g.add_weight("norm.bias", DType::kF32, {8}, zeros());
  const int out = node(g, OpKind::kLayerNorm, "norm", {x, w, b}, {{"eps", 1e-5}});
  const int wd = g.add_weight("dead.weight", DType::kF32, {8, 8}, zeros());
  const int d1 = node(g, OpKind::kLinear, "dead1", {x, wd});
  const int wd2 = g.add_weight("dead2.weight", DType::kF32, {8, 8}, zeros());
  node(g, OpKind::kLinear, "dead2", {d1, wd2});
  g.mark_output(out);
  return g;
}

TEST(DeadCode, RemovesDeadChainAndItsWeights) {
  ir::Graph g = graph_with_dead_chain();
  ASSERT_TRUE(g.verify().ok());
  DeadCode pass;
  auto changed = pass.run(g);
  ASSERT_TRUE(changed.ok()) << changed.status().message();
  EXPECT_TRUE(*changed);
  ASSERT_TRUE(g.verify().ok()) << g.verify().message();
  ASSERT_EQ(g.nodes().size(), 2u);
  EXPECT_EQ(g.nodes()[0].name, "embed");
  EXPECT_EQ(g.nodes()[1].name, "norm");
  EXPECT_EQ(g.find_value("dead.weight"), -1);
  EXPECT_EQ(g.find_value("dead2.weight"), -1);
  EXPECT_EQ(g.find_value("dead1"), -1);
  EXPECT_EQ(pass.stats().applied, 2);
  ASSERT_EQ(g.outputs().size(), 1u);
  EXPECT_EQ(g.value(g.outputs()[0]).name, "norm");
  EXPECT_EQ(g.value(g.outputs()[0]).producer, 1);
  // A second run finds nothing.
  DeadCode again;
  auto changed2 = again.run(g);
  ASSERT_TRUE(changed2.ok());
  EXPECT_FALSE(*changed2);
}

TEST(DeadCode, MustNotRemoveGraphOutputNobodyReads) {
  ir::Graph g = graph_with_dead_chain();
  g.mark_output(g.find_value("dead2"));  // now both chains are outputs
  DeadCode pass;
  auto changed = pass.run(g);
  ASSERT_TRUE(changed.ok());
  EXPECT_FALSE(*changed);
  EXPECT_EQ(g.nodes().size(), 4u);
}

TEST(DeadCode, MustNotRemoveNodeThatWritesState) {
  // An attention node whose output nobody reads still writes the KV cache.
  ir::Graph g;
  const int q = g.add_input("q", DType::kF32, {1, 16}, RowDim::kTokens);
  const int k = g.add_input("k", DType::kF32, {1, 16}, RowDim::kTokens);
  const int v = g.add_input("v", DType::kF32, {1, 16}, RowDim::kTokens);
  const int pos = g.add_input("positions", DType::kI32, {1}, RowDim::kTokens);
  const int slots = g.add_input("slots", DType::kI32, {1}, RowDim::kTokens);
  const int kc = g.add_state("layers.0.k_cache", DType::kF32, {1, 1, 8, 16});
  const int vc = g.add_state("layers.0.v_cache", DType::kF32, {1, 1, 8, 16});
  node(g, OpKind::kCachedAttention, "attn", {q, k, v, pos, slots, kc, vc},
       {{"n_heads", int64_t{1}}, {"n_kv_heads", int64_t{1}}, {"head_dim", int64_t{16}}});
  const int w = g.add_weight("w", DType::kF32, {16, 16}, zeros());
  g.mark_output(node(g, OpKind::kLinear, "proj", {q, w}));
  ASSERT_TRUE(g.verify().ok()) << g.verify().message();
  DeadCode pass;
  auto changed = pass.run(g);
  ASSERT_TRUE(changed.ok());
  EXPECT_FALSE(*changed);
  EXPECT_EQ(g.nodes().size(), 2u);
}

TEST(DeadCode, MustNotRemoveUnusedGraphInput) {
  ir::Graph g = graph_with_dead_chain();
  const int unused = g.add_input("positions", DType::kI32, {4}, RowDim::kTokens);
  (void)unused;
  DeadCode pass;
  ASSERT_TRUE(pass.run(g).ok());
  ASSERT_TRUE(g.verify().ok());
  const int id = g.find_value("positions");
  ASSERT_GE(id, 0);
  EXPECT_EQ(g.value(id).kind, ir::ValueKind::kInput);
  EXPECT_EQ(g.inputs().size(), 2u);
}

TEST(Pipeline, ListsPassesInOrderWithLevels) {
  const auto passes = list_passes();
  ASSERT_GE(passes.size(), 3u);
  // --input-shape first, folding before dead-code removes what it empties.
  EXPECT_EQ(passes[0].name, "specialize-shapes");
  EXPECT_EQ(passes[1].name, "constant-folding");
  EXPECT_EQ(passes[2].name, "dead-code");
  for (const PassInfo& p : passes) {
    EXPECT_GE(p.min_opt_level, 0) << p.name;
    EXPECT_LE(p.min_opt_level, 3) << p.name;
    EXPECT_FALSE(p.summary.empty()) << p.name;
  }
}

TEST(Pipeline, OptLevelZeroRunsOnlyLevelZeroPasses) {
  // At O0 only format passes (weight-precision, pack-weights and
  // kv-cache-precision, no-ops at fp32 rows and an f32 cache) run: the graph
  // is executed as built.
  ir::Graph g = graph_with_dead_chain();
  auto r = run_pipeline(g, {0, {}});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(g.nodes().size(), 4u);
  const auto infos = list_passes();
  ASSERT_EQ(infos.size(), r->passes.size());
  for (size_t i = 0; i < infos.size(); ++i) {
    EXPECT_EQ(r->passes[i].ran, infos[i].min_opt_level == 0) << r->passes[i].name;
    EXPECT_FALSE(r->passes[i].changed) << r->passes[i].name;
  }
}

TEST(Pipeline, DisabledPassDoesNotRun) {
  ir::Graph g = graph_with_dead_chain();
  auto r = run_pipeline(g, {3, {"dead-code"}});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(g.nodes().size(), 4u);
  auto r3 = run_pipeline(g, {3, {}});
  ASSERT_TRUE(r3.ok());
  EXPECT_EQ(g.nodes().size(), 2u);
  const PassRecord* dc = nullptr;
  for (const PassRecord& p : r3->passes)
    if (p.name == "dead-code" && dc == nullptr) dc = &p;  // the first of the dead-code runs
  ASSERT_NE(dc, nullptr);
  EXPECT_TRUE(dc->changed);
  EXPECT_EQ(dc->nodes_before, 4);
  EXPECT_EQ(dc->nodes_after, 2);
}

TEST(Pipeline, RejectsUnknownPassAndBadLevel) {
  ir::Graph g = graph_with_dead_chain();
  auto r = run_pipeline(g, {3, {"no-such-pass"}});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("unknown pass 'no-such-pass'"), std::string::npos);
  auto r4 = run_pipeline(g, {4, {}});
  ASSERT_FALSE(r4.ok());
  EXPECT_NE(r4.status().message().find("--opt-level"), std::string::npos);
}

}  // namespace
}  // namespace k3::passes
