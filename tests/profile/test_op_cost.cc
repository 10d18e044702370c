// op_cost on small hand-built graphs: the byte and flop counts each op is
// charged follow the documented rules (weights + used rows, 2*M*N*K, top_k
// experts at batch 1, KV bytes that grow with the context).
#include <gtest/gtest.h>

#include "profile/op_cost.h"

namespace k3::profile {
namespace {

using ir::Attr;
using ir::DType;
using ir::OpKind;
using ir::RowDim;

constexpr int64_t kT = 8;  // plan's maximum tokens

const ir::Node& add(ir::Graph& g, OpKind op, std::vector<int> in, std::vector<Attr> attrs = {}) {
  auto r = g.add_node(op, "n" + std::to_string(g.nodes().size()), std::move(in), std::move(attrs));
  EXPECT_TRUE(r.ok()) << r.status().message();
  return g.nodes().back();
}

TEST(OpCost, LinearIsWeightPlusInputPlusOutput) {
  ir::Graph g;
  const int x = g.add_input("x", DType::kF32, {kT, 32}, RowDim::kTokens);
  const int w = g.add_weight("w", DType::kF32, {48, 32}, nullptr);
  const ir::Node& n = add(g, OpKind::kLinear, {x, w});
  for (int64_t m : {1, 3, 8}) {
    const OpCost c = op_cost(g, n, m, 1, 1);
    EXPECT_DOUBLE_EQ(c.bytes_read, 48.0 * 32 * 4 + m * 32.0 * 4) << m;
    EXPECT_DOUBLE_EQ(c.bytes_written, m * 48.0 * 4) << m;
    EXPECT_DOUBLE_EQ(c.flops, 2.0 * m * 48 * 32) << m;
  }
}

TEST(OpCost, LinearOnOutputRowsFollowsOutRows) {
  ir::Graph g;
  const int x = g.add_input("x", DType::kF32, {4, 16}, RowDim::kOutRows);
  const int w = g.add_weight("w", DType::kF32, {100, 16}, nullptr);
  const ir::Node& n = add(g, OpKind::kLinear, {x, w});
  const OpCost c = op_cost(g, n, /*tokens=*/8, /*out_rows=*/2, 1);
  EXPECT_DOUBLE_EQ(c.flops, 2.0 * 2 * 100 * 16);
  EXPECT_DOUBLE_EQ(c.bytes_written, 2.0 * 100 * 4);
}

TEST(OpCost, RowWiseOps) {
  ir::Graph g;
  const int64_t d = 16;
  const int x = g.add_input("x", DType::kF32, {kT, d}, RowDim::kTokens);
  const int y = g.add_input("y", DType::kF32, {kT, d}, RowDim::kTokens);
  const int ids = g.add_input("ids", DType::kI32, {kT}, RowDim::kTokens);
  const int rows = g.add_input("rows", DType::kI32, {2}, RowDim::kOutRows);
  const int table = g.add_weight("table", DType::kF32, {50, d}, nullptr);
  const int wn = g.add_weight("wn", DType::kF32, {d}, nullptr);
  const int bn = g.add_weight("bn", DType::kF32, {d}, nullptr);
  const double row = d * 4.0;
  const int64_t t = 3;

  const OpCost emb = op_cost(g, add(g, OpKind::kEmbedding, {table, ids}), t, 1, 1);
  EXPECT_DOUBLE_EQ(emb.bytes_read, t * row + t * 4.0);  // t table rows, not the table
  EXPECT_DOUBLE_EQ(emb.bytes_written, t * row);
  EXPECT_DOUBLE_EQ(emb.flops, 0);

  const OpCost ln = op_cost(g, add(g, OpKind::kLayerNorm, {x, wn, bn}, {{"eps", 1e-5}}), t, 1, 1);
  EXPECT_DOUBLE_EQ(ln.bytes_read, t * row + 2 * row);
  EXPECT_DOUBLE_EQ(ln.bytes_written, t * row);
  EXPECT_GT(ln.flops, 0);

  const OpCost rms = op_cost(g, add(g, OpKind::kRmsNorm, {x, wn}, {{"eps", 1e-5}}), t, 1, 1);
  EXPECT_DOUBLE_EQ(rms.bytes_read, t * row + row);
  EXPECT_LT(rms.flops, ln.flops);

  const OpCost sum = op_cost(g, add(g, OpKind::kAdd, {x, y}), t, 1, 1);
  EXPECT_DOUBLE_EQ(sum.bytes_read, 2 * t * row);
  EXPECT_DOUBLE_EQ(sum.bytes_written, t * row);
  EXPECT_DOUBLE_EQ(sum.flops, t * d);

  const OpCost gather = op_cost(g, add(g, OpKind::kGatherRows, {x, rows}), t, 2, 1);
  EXPECT_DOUBLE_EQ(gather.bytes_read, 2 * row + 2 * 4.0);
  EXPECT_DOUBLE_EQ(gather.bytes_written, 2 * row);
}

TEST(OpCost, RopeReadsOneTableRowPerToken) {
  ir::Graph g;
  const int64_t hd = 8, heads = 2, ctx = 64;
  const int x = g.add_input("x", DType::kF32, {kT, heads * hd}, RowDim::kTokens);
  const int pos = g.add_input("positions", DType::kI32, {kT}, RowDim::kTokens);
  const int cs = g.add_weight("cos", DType::kF32, {ctx, hd / 2}, nullptr);
  const int sn = g.add_weight("sin", DType::kF32, {ctx, hd / 2}, nullptr);
  const ir::Node& n = add(g, OpKind::kRope, {x, pos, cs, sn}, {{"head_dim", hd}});
  const OpCost c = op_cost(g, n, 2, 1, 1);
  EXPECT_DOUBLE_EQ(c.bytes_read, 2 * heads * hd * 4.0 + 2 * 4.0 + 2 * 2 * (hd / 2) * 4.0);
  EXPECT_DOUBLE_EQ(c.bytes_written, 2 * heads * hd * 4.0);
}

// x [T,D] -> Moe with E experts of F hidden units.
struct MoeGraph {
  ir::Graph g;
  int64_t d = 16, f = 32, e = 8, k = 2;
  bool swiglu = false;
  const ir::Node* node = nullptr;

  explicit MoeGraph(bool sw) : swiglu(sw) {
    const int x = g.add_input("x", DType::kF32, {kT, d}, RowDim::kTokens);
    std::vector<int> in{x, g.add_weight("gate", DType::kF32, {e, d}, nullptr)};
    for (int64_t i = 0; i < e; ++i) {
      const std::string p = "e" + std::to_string(i) + ".";
      in.push_back(g.add_weight(p + "up", DType::kF32, {f, d}, nullptr));
      if (swiglu) in.push_back(g.add_weight(p + "gate", DType::kF32, {f, d}, nullptr));
      in.push_back(g.add_weight(p + "down", DType::kF32, {d, f}, nullptr));
    }
    node = &add(g, OpKind::kMoe, in, {{"n_experts", e}, {"top_k", k}, {"swiglu", int64_t{swiglu}}});
  }
  double expert_bytes() const { return (swiglu ? 3.0 : 2.0) * static_cast<double>(d * f) * 4; }
  double fixed_bytes(int64_t t) const { return static_cast<double>(t * d) * 4 + static_cast<double>(e * d) * 4; }
};

TEST(OpCost, MoeAtBatchOneCountsTopKExpertsNotAll) {
  for (bool swiglu : {false, true}) {
    MoeGraph m(swiglu);
    const OpCost c = op_cost(m.g, *m.node, 1, 1, 1);
    EXPECT_DOUBLE_EQ(c.bytes_read, m.fixed_bytes(1) + static_cast<double>(m.k) * m.expert_bytes()) << swiglu;
    EXPECT_LT(c.bytes_read, m.fixed_bytes(1) + static_cast<double>(m.e) * m.expert_bytes());
    EXPECT_DOUBLE_EQ(c.bytes_written, static_cast<double>(m.d) * 4);
    // Gate product plus top_k experts' matrix products, plus a little elementwise work.
    const double mats = 2.0 * m.e * m.d + static_cast<double>(m.k) * (swiglu ? 3 : 2) * 2.0 * m.d * m.f;
    EXPECT_GE(c.flops, mats);
    EXPECT_LT(c.flops, mats * 1.2);
  }
}

TEST(OpCost, MoeForSeveralTokens) {
  MoeGraph m(false);
  // Unknown routing: min(E, T*top_k) experts, an upper estimate.
  EXPECT_DOUBLE_EQ(op_cost(m.g, *m.node, 3, 1, 1).bytes_read, m.fixed_bytes(3) + 6 * m.expert_bytes());
  EXPECT_DOUBLE_EQ(op_cost(m.g, *m.node, 8, 1, 1).bytes_read, m.fixed_bytes(8) + 8 * m.expert_bytes());
  EXPECT_EQ(estimated_moe_experts(*m.node, 1), 2);
  EXPECT_EQ(estimated_moe_experts(*m.node, 3), 6);
  EXPECT_EQ(estimated_moe_experts(*m.node, 100), 8);
  // Known routing: the experts that actually ran; flops still follow tokens.
  StepCounts c;
  c.tokens = 3;
  c.moe_experts = 4;
  const OpCost known = op_cost(m.g, *m.node, c);
  EXPECT_DOUBLE_EQ(known.bytes_read, m.fixed_bytes(3) + 4 * m.expert_bytes());
  EXPECT_DOUBLE_EQ(known.flops, op_cost(m.g, *m.node, 3, 1, 1).flops);
}

TEST(OpCost, AttentionBytesGrowWithContext) {
  ir::Graph g;
  const int64_t hq = 4, hkv = 2, hd = 8, slots = 2, ctx = 256;
  const int q = g.add_input("q", DType::kF32, {kT, hq * hd}, RowDim::kTokens);
  const int k = g.add_input("k", DType::kF32, {kT, hkv * hd}, RowDim::kTokens);
  const int v = g.add_input("v", DType::kF32, {kT, hkv * hd}, RowDim::kTokens);
  const int pos = g.add_input("positions", DType::kI32, {kT}, RowDim::kTokens);
  const int slot = g.add_input("slots", DType::kI32, {kT}, RowDim::kTokens);
  const int kc = g.add_state("layers.0.k_cache", DType::kF32, {slots, hkv, ctx, hd});
  const int vc = g.add_state("layers.0.v_cache", DType::kF32, {slots, hkv, ctx, hd});
  const ir::Node& n = add(g, OpKind::kCachedAttention, {q, k, v, pos, slot, kc, vc},
                          {{"n_heads", hq}, {"n_kv_heads", hkv}, {"head_dim", hd}, {"layer", int64_t{0}}});
  const OpCost c10 = op_cost(g, n, 2, 1, 10), c100 = op_cost(g, n, 2, 1, 100);
  // K and V rows of every KV head for each attended position of each token.
  EXPECT_DOUBLE_EQ(c100.bytes_read - c10.bytes_read, 2.0 * 90 * 2 * hkv * hd * 4);
  EXPECT_GT(c100.flops, c10.flops * 5);
  // Writes: output rows and the two tokens' K/V rows; independent of context.
  EXPECT_DOUBLE_EQ(c10.bytes_written, 2.0 * hq * hd * 4 + 2.0 * 2 * hkv * hd * 4);
  EXPECT_DOUBLE_EQ(c100.bytes_written, c10.bytes_written);
  // The StepCounts form takes the exact sum of attended positions (a
  // prefill chunk at positions 0..3 attends 1+2+3+4 = 10).
  StepCounts sc;
  sc.tokens = 4;
  sc.kv_positions = 10;
  const OpCost chunk = op_cost(g, n, sc);
  EXPECT_DOUBLE_EQ(chunk.bytes_read - op_cost(g, n, 4, 1, 0).bytes_read, 2.0 * 10 * hkv * hd * 4);
}

}  // namespace
}  // namespace k3::profile
