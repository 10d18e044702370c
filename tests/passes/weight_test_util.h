// Helpers shared by the weight-format pass tests (weight-precision,
// pack-weights): small hand-built graphs over one table of test weights,
// lookup of a node's input, and k3-tiny engines compiled with a given
// precision and layout, stepped for their last-row logits.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "../runtime/test_models.h"
#include "compiled/compiled_model.h"
#include "ir/graph.h"
#include "runtime/engine.h"

namespace k3::passes::test {

// 4096 smooth values in [-0.1, 0.1]; graphs take weights at offsets into it.
inline const std::vector<float>& test_weights() {
  static const std::vector<float> w = [] {
    std::vector<float> v(4096);
    for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(static_cast<float>(i)) * 0.1f;
    return v;
  }();
  return w;
}

// Adds a node and returns its first output (-1 after a test failure).
inline int node(ir::Graph& g, ir::OpKind op, const std::string& name, std::vector<int> in,
                std::vector<ir::Attr> attrs = {}) {
  auto r = g.add_node(op, name, std::move(in), std::move(attrs));
  EXPECT_TRUE(r.ok()) << r.status().message();
  return r.ok() ? (*r)[0] : -1;
}

// Input i of the node named `node_name`.
inline const ir::Value& input_of(const ir::Graph& g, const std::string& node_name, size_t i) {
  for (const ir::Node& n : g.nodes())
    if (n.name == node_name) return g.value(n.inputs[i]);
  ADD_FAILURE() << "no node " << node_name;
  return g.value(0);
}

// tokens -> Embedding(table [16, d]) -> Linear(proj.weight [d, d]) ->
// Moe(gate [2, d], 2 experts: up [f, d], down [d, f]) -> Linear(table): the
// table is tied between the embedding and the output projection.
inline ir::Graph tied_moe_graph(int64_t d, int64_t f) {
  ir::Graph g;
  const float* w = test_weights().data();
  const int tokens = g.add_input("tokens", ir::DType::kI32, {2}, ir::RowDim::kTokens);
  const int table = g.add_weight("table", ir::DType::kF32, {16, d}, w);
  const int x = node(g, ir::OpKind::kEmbedding, "embed", {table, tokens});
  const int h = node(g, ir::OpKind::kLinear, "proj", {x, g.add_weight("proj.weight", ir::DType::kF32, {d, d}, w + 7)});
  std::vector<int> moe_in{h, g.add_weight("gate", ir::DType::kF32, {2, d}, w + 11)};
  for (int e = 0; e < 2; ++e) {
    moe_in.push_back(g.add_weight("e" + std::to_string(e) + ".up", ir::DType::kF32, {f, d}, w + 1000 * e));
    moe_in.push_back(g.add_weight("e" + std::to_string(e) + ".down", ir::DType::kF32, {d, f}, w + 1000 * e + 500));
  }
  const int y = node(g, ir::OpKind::kMoe, "moe", moe_in, {{"n_experts", int64_t{2}}, {"top_k", int64_t{1}}});
  g.mark_output(node(g, ir::OpKind::kLinear, "output", {y, table}));
  return g;
}

// k3-tiny compiled at `precision` in `layout` (prefill chunks of 16, 64
// positions), on 2 threads, with the fast or the reference ops.
inline std::unique_ptr<runtime::Engine> tiny_engine(const std::string& precision, const std::string& layout,
                                                    bool reference) {
  CompileOptions o;
  o.prefill_chunk = 16;
  o.ctx_len = 64;
  o.precision = precision;
  o.pipeline.weight_layout = layout;
  auto m = compile_checkpoint(k3::testing::model_dir("k3-tiny"), o);
  EXPECT_TRUE(m.ok()) << m.status().message();
  runtime::EngineOptions eo;
  eo.threads = 2;
  eo.reference = reference;
  auto e = runtime::Engine::create(std::move(m).value(), eo);
  EXPECT_TRUE(e.ok()) << e.status().message();
  return std::move(e).value();
}

// Feeds `toks` to slot 0 at positions pos0.. in one step; the last row's logits.
inline std::vector<float> step_logits(runtime::Engine& e, int32_t pos0, const std::vector<int32_t>& toks) {
  const int64_t n = static_cast<int64_t>(toks.size());
  std::vector<int32_t> p(toks.size()), s(toks.size(), 0);
  for (int64_t i = 0; i < n; ++i) p[static_cast<size_t>(i)] = pos0 + static_cast<int32_t>(i);
  const int32_t row = static_cast<int32_t>(n - 1);
  auto r = e.step({toks.data(), p.data(), s.data(), n, &row, 1});
  EXPECT_TRUE(r.ok()) << r.status().message();
  return r.ok() ? std::vector<float>(*r, *r + e.config().vocab_size) : std::vector<float>{};
}

}  // namespace k3::passes::test
