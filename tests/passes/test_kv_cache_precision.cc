// kv-cache-precision: --kv-dtype bf16 turns the f32 KV cache states of
// CachedAttention nodes into bf16 states; f32 leaves the graph alone; one
// must-not-convert test per guard of the pass (kv_cache_precision.cc).
#include "passes/kv_cache_precision.h"

#include <gtest/gtest.h>

#include "passes/fusion_test_util.h"

namespace k3::passes {
namespace {

using ir::DType;
using ir::OpKind;
using ir::RowDim;

struct AttentionGraph {
  ir::Graph g;
  int kc = -1, vc = -1;
};

// One attention layer reading caches of `cache` dtype; `second` adds a
// second attention node reading the same caches.
AttentionGraph attention_graph(DType cache = DType::kF32, bool second = false) {
  AttentionGraph a;
  ir::Graph& g = a.g;
  const int q = g.add_input("q", DType::kF32, {2, 16}, RowDim::kTokens);
  const int k = g.add_input("k", DType::kF32, {2, 16}, RowDim::kTokens);
  const int v = g.add_input("v", DType::kF32, {2, 16}, RowDim::kTokens);
  const int pos = g.add_input("positions", DType::kI32, {2}, RowDim::kTokens);
  const int slots = g.add_input("slots", DType::kI32, {2}, RowDim::kTokens);
  a.kc = g.add_state("layers.0.k_cache", cache, {1, 1, 8, 16});
  a.vc = g.add_state("layers.0.v_cache", cache, {1, 1, 8, 16});
  const std::vector<ir::Attr> attrs = {{"n_heads", int64_t{1}}, {"n_kv_heads", int64_t{1}}, {"head_dim", int64_t{16}}};
  auto out = g.add_node(OpKind::kCachedAttention, "attn", {q, k, v, pos, slots, a.kc, a.vc}, attrs);
  EXPECT_TRUE(out.ok()) << out.status().message();
  g.mark_output((*out)[0]);
  if (second) {
    auto out2 = g.add_node(OpKind::kCachedAttention, "attn2", {q, k, v, pos, slots, a.kc, a.vc}, attrs);
    EXPECT_TRUE(out2.ok()) << out2.status().message();
    g.mark_output((*out2)[0]);
  }
  EXPECT_TRUE(g.verify().ok()) << g.verify().message();
  return a;
}

TEST(KvCachePrecision, Bf16ConvertsBothCaches) {
  AttentionGraph a = attention_graph();
  KvCachePrecision pass("bf16");
  auto changed = pass.run(a.g);
  ASSERT_TRUE(changed.ok()) << changed.status().message();
  EXPECT_TRUE(*changed);
  EXPECT_EQ(a.g.value(a.kc).dtype, DType::kBF16);
  EXPECT_EQ(a.g.value(a.vc).dtype, DType::kBF16);
  EXPECT_EQ(pass.stats().matched, 1);
  EXPECT_EQ(pass.stats().applied, 1);
  EXPECT_TRUE(a.g.verify().ok()) << a.g.verify().message();  // the shape rule takes a bf16 cache
}

TEST(KvCachePrecision, TwoReadersOfOneCacheAreConvertedTogether) {
  AttentionGraph a = attention_graph(DType::kF32, /*second=*/true);
  KvCachePrecision pass("bf16");
  ASSERT_TRUE(pass.run(a.g).ok());
  EXPECT_EQ(a.g.value(a.kc).dtype, DType::kBF16);
  EXPECT_TRUE(a.g.verify().ok()) << a.g.verify().message();
}

TEST(KvCachePrecision, F32IsANoOp) {
  AttentionGraph a = attention_graph();
  KvCachePrecision pass("f32");
  auto changed = pass.run(a.g);
  ASSERT_TRUE(changed.ok());
  EXPECT_FALSE(*changed);
  EXPECT_EQ(a.g.value(a.kc).dtype, DType::kF32);
}

TEST(KvCachePrecision, MustNotConvertACacheThatIsNotF32) {
  AttentionGraph a = attention_graph(DType::kBF16);
  KvCachePrecision pass("bf16");
  auto changed = pass.run(a.g);
  ASSERT_TRUE(changed.ok());
  EXPECT_FALSE(*changed);
  EXPECT_EQ(pass.stats().applied, 0);
  EXPECT_EQ(pass.stats().notes.size(), 1u);
}

TEST(KvCachePrecision, MustNotConvertAStateWithAnotherReader) {
  AttentionGraph a = attention_graph();
  // Something other than an attention cache input reads the V cache: neither
  // cache of that node changes (K and V share a dtype).
  auto id = a.g.add_node(OpKind::kOnnxRelu, "peek", {a.vc}, {});
  ASSERT_TRUE(id.ok()) << id.status().message();
  a.g.mark_output((*id)[0]);
  KvCachePrecision pass("bf16");
  auto changed = pass.run(a.g);
  ASSERT_TRUE(changed.ok());
  EXPECT_FALSE(*changed);
  EXPECT_EQ(a.g.value(a.kc).dtype, DType::kF32);
  EXPECT_EQ(a.g.value(a.vc).dtype, DType::kF32);
}

TEST(KvCachePrecision, RefusesAnUnknownDtype) {
  AttentionGraph a = attention_graph();
  KvCachePrecision pass("fp8");
  auto changed = pass.run(a.g);
  ASSERT_FALSE(changed.ok());
  EXPECT_NE(changed.status().message().find("fp8"), std::string::npos);
}

TEST(KvCachePrecision, ShapeRuleRefusesMixedOrOtherCacheDtypes) {
  for (DType v_dtype : {DType::kBF16, DType::kI32}) {
    ir::Graph g;
    const int q = g.add_input("q", DType::kF32, {2, 16}, RowDim::kTokens);
    const int pos = g.add_input("positions", DType::kI32, {2}, RowDim::kTokens);
    const int kc = g.add_state("layers.0.k_cache", v_dtype == DType::kI32 ? DType::kI32 : DType::kF32, {1, 1, 8, 16});
    const int vc = g.add_state("layers.0.v_cache", v_dtype, {1, 1, 8, 16});
    auto out = g.add_node(OpKind::kCachedAttention, "attn", {q, q, q, pos, pos, kc, vc},
                          {{"n_heads", int64_t{1}}, {"n_kv_heads", int64_t{1}}, {"head_dim", int64_t{16}}});
    EXPECT_FALSE(out.ok()) << "cache dtypes " << ir::dtype_name(g.value(kc).dtype) << ", "
                           << ir::dtype_name(g.value(vc).dtype);
  }
}

}  // namespace
}  // namespace k3::passes
