// Arena planning: buffers whose lifetimes overlap never share bytes, reuse
// makes the arena smaller than one buffer per tensor, and the plan of a real
// model fits in what was planned.
#include <gtest/gtest.h>

#include "frontend/checkpoint/build_graph.h"
#include "runtime/plan.h"
#include "test_models.h"

namespace k3::runtime {
namespace {

TEST(Arena, LiveBuffersNeverOverlap) {
  auto ck = Checkpoint::load(k3::testing::model_dir("k3-tiny"));
  ASSERT_TRUE(ck.ok()) << ck.status().message();
  auto g = build_graph(**ck, {8, 2, 2, 64});
  ASSERT_TRUE(g.ok()) << g.status().message();
  const ArenaLayout l = plan_arena(*g);
  const auto& nodes = g->nodes();
  const int end = static_cast<int>(nodes.size());
  struct Live {
    int64_t lo, hi;
    int first, last;
  };
  std::vector<Live> live;
  std::vector<int> last_use(g->values().size(), -1);
  for (int i = 0; i < end; ++i)
    for (int in : nodes[static_cast<size_t>(i)].inputs) last_use[static_cast<size_t>(in)] = i;
  for (size_t v = 0; v < g->values().size(); ++v) {
    const ir::Value& val = g->values()[v];
    if (l.value_offset[v] < 0) {
      EXPECT_TRUE(val.kind == ir::ValueKind::kWeight || val.kind == ir::ValueKind::kState) << val.name;
      continue;
    }
    const int first = val.kind == ir::ValueKind::kInput ? -1 : val.producer;
    const int last = val.kind == ir::ValueKind::kInput || val.is_output ? end : std::max(first, last_use[v]);
    live.push_back({l.value_offset[v], l.value_offset[v] + static_cast<int64_t>(val.bytes()), first, last});
    EXPECT_EQ(l.value_offset[v] % 64, 0);
    EXPECT_LE(static_cast<uint64_t>(live.back().hi), l.peak_bytes);
  }
  for (size_t n = 0; n < nodes.size(); ++n)
    if (l.node_workspace_offset[n] >= 0) {
      const uint64_t ws = op_workspace_bytes(*g, nodes[n]);
      live.push_back({l.node_workspace_offset[n], l.node_workspace_offset[n] + static_cast<int64_t>(ws), static_cast<int>(n), static_cast<int>(n)});
    }
  for (size_t i = 0; i < live.size(); ++i)
    for (size_t j = i + 1; j < live.size(); ++j) {
      const bool time = live[i].first <= live[j].last && live[j].first <= live[i].last;
      const bool space = live[i].lo < live[j].hi && live[j].lo < live[i].hi;
      EXPECT_FALSE(time && space) << "buffers " << i << " and " << j << " overlap while both live";
    }
  EXPECT_LT(l.peak_bytes, l.no_reuse_bytes / 2) << "reuse should at least halve a 2-layer model's activation memory";
}

}  // namespace
}  // namespace k3::runtime
