// Every op of ir/op_table.h: the optimized implementation against the scalar
// reference on random inputs, with fewer rows than the plan's maximum. The
// TEST list is expanded from the op table, so an op without a test_<op>()
// here does not compile.
#include <numeric>

#include "op_tester.h"
#include "runtime/ops/fast_ops.h"

namespace k3::runtime::testing {
namespace {

using ir::OpKind;
using ir::RowDim;

constexpr float kTol = 2e-5f;
// int8 and bf16-dot products: both sides round the activations the same
// way, but the kernels add the products in another order than the
// reference, so a MoE's hidden value can land on the other side of a rounding
// boundary before the down projection: one bf16 step is 2^-8 of the value
// (measured worst 4.5e-4 with SwiGLU), one int8 step 1/127 of its block's
// largest (worst 6e-6 here).
constexpr float kRoundedTol = 2e-3f;

void test_Embedding() {
  OpTester t;
  int table = t.f32("table", {50, 24});
  int ids = t.i32("ids", {3, 49, 0, 7, 7}, RowDim::kTokens);
  t.node(OpKind::kEmbedding, {table, ids});
  t.check(4, 0, 0.0f);
  OpTester s;  // scaled rows (Granite's embedding_multiplier)
  int table2 = s.f32("table", {50, 24});
  int ids2 = s.i32("ids", {3, 49, 0, 7, 7}, RowDim::kTokens);
  s.node(OpKind::kEmbedding, {table2, ids2}, {{"scale", 12.0}});
  s.check(4, 0, 0.0f);
}

void norm_case(OpKind op, bool bias, int64_t max_rows, int64_t rows, int64_t width = 37) {
  OpTester t;
  int x = t.f32("x", {max_rows, width}, RowDim::kTokens, 3.0f);
  std::vector<int> in{x, t.f32("w", {width})};
  if (bias) in.push_back(t.f32("b", {width}));
  t.node(op, in, {{"eps", 1e-5}});
  t.check(rows, 0, kTol);
}

void test_LayerNorm() {
  norm_case(OpKind::kLayerNorm, true, 6, 4);
  norm_case(OpKind::kLayerNorm, true, 12, 11);
  // Enough values to be split across the threads (kParallelValues).
  norm_case(OpKind::kLayerNorm, true, kParallelValues / 256 + 4, kParallelValues / 256 + 3, 256);
}

// Per-head norms (group = head width) and a clamped whole-row norm.
void grouped_rms_case(int64_t group, double clip, int64_t max_rows, int64_t rows) {
  OpTester t;
  int x = t.f32("x", {max_rows, 48}, RowDim::kTokens, 3.0f);
  t.node(OpKind::kRmsNorm, {x, t.f32("w", {group}, RowDim::kFixed, 2.0f)},
         {{"eps", 1e-6}, {"group", group}, {"clip", clip}});
  t.check(rows, 0, kTol);
}

void test_RmsNorm() {
  norm_case(OpKind::kRmsNorm, false, 6, 4);
  norm_case(OpKind::kRmsNorm, false, 12, 11);
  norm_case(OpKind::kRmsNorm, false, kParallelValues / 256 + 4, kParallelValues / 256 + 3, 256);
  grouped_rms_case(16, 0.0, 6, 5);
  grouped_rms_case(8, 0.0, 3, 2);  // 12 groups over 2 rows: parallel
  grouped_rms_case(48, 0.5, 6, 5);
}

// A fused residual (fuse-residual-add): the output plus a [T, N] value,
// after the bias, scale and clamp; rows and columns split across 2 threads.
void linear_residual_case() {
  for (bool epilogue : {false, true}) {
    OpTester t;
    int x = t.f32("x", {9, 67}, RowDim::kTokens);
    std::vector<int> in{x, t.f32("w", {130, 67})};
    std::vector<ir::Attr> attrs{{"residual", int64_t{1}}};
    if (epilogue) {
      in.push_back(t.f32("b", {130}));
      attrs.push_back({"scale", 0.25});
      attrs.push_back({"clip", 0.6});
    }
    in.push_back(t.f32("r", {9, 130}, RowDim::kTokens));
    t.node(OpKind::kLinear, in, attrs);
    t.check(7, 0, kTol);
    t.check(1, 0, kTol, 1);
  }
}

// Prefill rows (at least kRowSplitMinRows, basic_ops.cc): threads split the
// rows, not the columns, and round their own rows. Same bits as one thread
// (which splits nothing), for each weight format, with split outputs and
// with a bias, scale, clamp and residual; within tolerance of the reference.
void linear_row_split_case(ir::DType dt, bool splits) {
  OpTester t;
  const int64_t rows = 70, k = 64, n = 96;
  int x = t.f32("x", {rows, k}, RowDim::kTokens);
  std::vector<int> in{x, t.weight("w", {n, k}, dt)};
  std::vector<ir::Attr> attrs;
  if (splits) {
    attrs.push_back({"splits", std::vector<int64_t>{32, 64}});
  } else {
    in.push_back(t.f32("b", {n}));
    in.push_back(t.f32("r", {rows, n}, RowDim::kTokens));
    attrs = {{"scale", 0.5}, {"clip", 0.8}, {"residual", int64_t{1}}};
  }
  auto r = t.graph().add_node(OpKind::kLinear, "node", in, attrs, splits ? 2 : 1);
  ASSERT_TRUE(r.ok()) << r.status().message();
  t.check(rows, 0, dt == ir::DType::kF32 ? kTol : kRoundedTol);
  const auto two = t.fast_outputs(rows, 0, 2), one = t.fast_outputs(rows, 0, 1);
  ASSERT_EQ(two.size(), one.size());
  for (size_t b = 0; b < two.size(); ++b)
    EXPECT_EQ(std::memcmp(two[b].data(), one[b].data(), two[b].size() * 4), 0) << "output " << b;
}

void test_Linear() {
  for (int64_t n : {1, 45, 130}) {
    OpTester t;
    int x = t.f32("x", {9, 67}, RowDim::kTokens);
    int w = t.f32("w", {n, 67});
    t.node(OpKind::kLinear, {x, w});
    t.check(7, 0, kTol);
  }
  // Bias (Qwen2's q/k/v), output scale (Granite's 1/logits_scaling) and
  // clamp (OLMoE's clip_qkv).
  for (int64_t n : {1, 45, 130}) {
    OpTester t;
    int x = t.f32("x", {9, 67}, RowDim::kTokens);
    int w = t.f32("w", {n, 67});
    t.node(OpKind::kLinear, {x, w, t.f32("b", {n})}, {{"scale", 0.25}, {"clip", 0.6}});
    t.check(7, 0, kTol);
    OpTester u;
    int x2 = u.f32("x", {9, 67}, RowDim::kTokens);
    int w2 = u.f32("w", {n, 67});
    u.node(OpKind::kLinear, {x2, w2, u.f32("b", {n})});
    u.check(7, 0, kTol);
  }
  linear_residual_case();
  for (ir::DType dt : {ir::DType::kF32, ir::DType::kQ8, ir::DType::kBF16Dot})
    for (bool splits : {false, true}) linear_row_split_case(dt, splits);
  // Split outputs (fuse-sibling-linears' stacked q, k, v), with and without
  // bias and clamp; 2 threads' chunks of 16 then end inside an output.
  for (const std::vector<int64_t>& splits : {std::vector<int64_t>{16, 32, 16}, {48}, {32, 64, 80, 16}}) {
    for (bool epilogue : {false, true}) {
      OpTester t;
      int64_t n = 0;
      for (int64_t s : splits) n += s;
      int x = t.f32("x", {9, 67}, RowDim::kTokens);
      std::vector<int> in{x, t.f32("w", {n, 67})};
      std::vector<ir::Attr> attrs{{"splits", splits}};
      if (epilogue) {
        in.push_back(t.f32("b", {n}));
        attrs.push_back({"clip", 0.6});
      }
      auto r = t.graph().add_node(OpKind::kLinear, "node", in, attrs, static_cast<int>(splits.size()));
      ASSERT_TRUE(r.ok()) << r.status().message();
      t.check(7, 0, kTol);
    }
  }
  // int8 and bf16-dot weights: the rows are rounded once for all threads
  // (on the calling thread for a few values, split across threads from
  // kParallelValues), then each thread's columns and each output of a split
  // are multiplied.
  for (ir::DType dt : {ir::DType::kQ8, ir::DType::kBF16Dot}) {
    for (int64_t rows : {int64_t{3}, int64_t{12}, kParallelValues / 96 + 1}) {
      OpTester t;
      int x = t.f32("x", {rows + 2, 96}, RowDim::kTokens);
      t.node(OpKind::kLinear, {x, t.weight("w", {130, 96}, dt)});
      t.check(rows, 0, kRoundedTol);
      OpTester u;
      int x2 = u.f32("x", {rows + 2, 96}, RowDim::kTokens);
      auto r = u.graph().add_node(OpKind::kLinear, "node", {x2, u.weight("w", {80, 96}, dt)},
                                  {{"splits", std::vector<int64_t>{16, 48, 16}}}, 3);
      ASSERT_TRUE(r.ok()) << r.status().message();
      u.check(rows, 0, kRoundedTol);
    }
  }
}

void test_Add() {
  for (double scale : {1.0, 0.22}) {
    OpTester t;
    int a = t.f32("a", {5, 33}, RowDim::kTokens);
    int b = t.f32("b", {5, 33}, RowDim::kTokens);
    t.node(OpKind::kAdd, {a, b}, {{"scale", scale}});
    t.check(3, 0, 0.0f);
  }
}

void test_Rope() {
  OpTester t;
  int x = t.f32("x", {5, 48}, RowDim::kTokens);
  int pos = t.i32("pos", {0, 3, 7, 1, 2}, RowDim::kTokens);
  int cs = t.f32("cos", {8, 8});
  int sn = t.f32("sin", {8, 8});
  t.node(OpKind::kRope, {x, pos, cs, sn}, {{"head_dim", int64_t{16}}});
  t.check(5, 0, kTol);
  // Enough values to be split across the threads (kParallelValues).
  const int64_t rows = kParallelValues / 256 + 3;
  OpTester u;
  int x2 = u.f32("x", {rows, 256}, RowDim::kTokens);
  std::vector<int32_t> positions;
  for (int64_t i = 0; i < rows; ++i) positions.push_back(static_cast<int32_t>(i * 7 % 64));
  int pos2 = u.i32("pos", positions, RowDim::kTokens);
  int cs2 = u.f32("cos", {64, 16});
  int sn2 = u.f32("sin", {64, 16});
  u.node(OpKind::kRope, {x2, pos2, cs2, sn2}, {{"head_dim", int64_t{32}}});
  u.check(rows, 0, kTol);
}

void attention_scale_case();
void attention_pieces_case();

void test_CachedAttention() {
  // Hq=4, Hkv=2, hd=16; two slots of 16 positions. Token rows: slot 0 pos 5,
  // slot 1 pos 9, slot 0 pos 6 (reads the row written by the first token of
  // this step), slot 1 pos 0. With a bf16 cache both implementations round
  // the new rows the same way (the states are compared too) and widen what
  // they read.
  for (ir::DType cache : {ir::DType::kF32, ir::DType::kBF16}) {
    OpTester t;
    int q = t.f32("q", {4, 64}, RowDim::kTokens);
    int k = t.f32("k", {4, 32}, RowDim::kTokens);
    int v = t.f32("v", {4, 32}, RowDim::kTokens);
    int pos = t.i32("pos", {5, 9, 6, 0}, RowDim::kTokens);
    int slot = t.i32("slot", {0, 1, 0, 1}, RowDim::kTokens);
    int kc = t.state("k_cache", {2, 2, 16, 16}, cache);
    int vc = t.state("v_cache", {2, 2, 16, 16}, cache);
    t.node(OpKind::kCachedAttention, {q, k, v, pos, slot, kc, vc},
           {{"n_heads", int64_t{4}}, {"n_kv_heads", int64_t{2}}, {"head_dim", int64_t{16}}});
    t.check(4, 0, kTol);
  }
  attention_scale_case();
  attention_pieces_case();
}

// Rows longer than 256 positions are attended in pieces and merged. A
// decode step of one token's 5 heads on 2 or 3 threads hands the pieces to
// the threads; the same row in a step of 2 tokens (10 rows, even on 2
// threads) is attended whole by one thread. Both give the same bits, as
// one thread does, and match the reference.
void attention_pieces_case() {
  for (ir::DType cache : {ir::DType::kF32, ir::DType::kBF16}) {
    OpTester t(7);
    int q = t.f32("q", {2, 320}, RowDim::kTokens);
    int k = t.f32("k", {2, 320}, RowDim::kTokens);
    int v = t.f32("v", {2, 320}, RowDim::kTokens);
    int pos = t.i32("pos", {700, 701}, RowDim::kTokens);
    int slot = t.i32("slot", {0, 0}, RowDim::kTokens);
    int kc = t.state("k_cache", {1, 5, 1024, 64}, cache);
    int vc = t.state("v_cache", {1, 5, 1024, 64}, cache);
    t.node(OpKind::kCachedAttention, {q, k, v, pos, slot, kc, vc},
           {{"n_heads", int64_t{5}}, {"n_kv_heads", int64_t{5}}, {"head_dim", int64_t{64}}});
    t.check(1, 0, kTol);
    t.check(2, 0, kTol);
    auto pieces = [&](int64_t tokens, int threads) {
      int64_t taken = -1;
      t.fast_inspect(tokens, threads, [&](const OpCall& c) { taken = attention_pieces_taken(c); });
      return taken;
    };
    EXPECT_EQ(pieces(1, 2), 15);  // len 701: 3 pieces of 240 positions, 5 heads
    EXPECT_EQ(pieces(1, 3), 15);
    EXPECT_EQ(pieces(1, 1), 0);
    EXPECT_EQ(pieces(2, 2), 0);
    const auto one = t.fast_outputs(1, 0, 1)[0];
    for (int threads : {2, 3}) EXPECT_EQ(t.fast_outputs(1, 0, threads)[0], one) << threads << " threads";
    const auto two = t.fast_outputs(2, 0, 2)[0];
    EXPECT_EQ(std::vector<float>(two.begin(), two.begin() + 320), one);
  }
  // A row of at most 256 positions is one piece: nothing handed out.
  OpTester t(8);
  int q = t.f32("q", {1, 320}, RowDim::kTokens);
  int k = t.f32("k", {1, 320}, RowDim::kTokens);
  int v = t.f32("v", {1, 320}, RowDim::kTokens);
  int pos = t.i32("pos", {255}, RowDim::kTokens);
  int slot = t.i32("slot", {0}, RowDim::kTokens);
  int kc = t.state("k_cache", {1, 5, 512, 64});
  int vc = t.state("v_cache", {1, 5, 512, 64});
  t.node(OpKind::kCachedAttention, {q, k, v, pos, slot, kc, vc},
         {{"n_heads", int64_t{5}}, {"n_kv_heads", int64_t{5}}, {"head_dim", int64_t{64}}});
  int64_t taken = -1;
  t.fast_inspect(1, 2, [&](const OpCall& c) { taken = attention_pieces_taken(c); });
  EXPECT_EQ(taken, 0);
  t.check(1, 0, kTol);
}

void attention_scale_case() {
  OpTester t;
  int q = t.f32("q", {2, 64}, RowDim::kTokens);
  int k = t.f32("k", {2, 32}, RowDim::kTokens);
  int v = t.f32("v", {2, 32}, RowDim::kTokens);
  int pos = t.i32("pos", {3, 4}, RowDim::kTokens);
  int slot = t.i32("slot", {0, 0}, RowDim::kTokens);
  int kc = t.state("k_cache", {1, 2, 8, 16});
  int vc = t.state("v_cache", {1, 2, 8, 16});
  t.node(OpKind::kCachedAttention, {q, k, v, pos, slot, kc, vc},
         {{"n_heads", int64_t{4}}, {"n_kv_heads", int64_t{2}}, {"head_dim", int64_t{16}}, {"scale", 0.6}});
  t.check(2, 0, kTol);
}

// A shared expert of another width (40, f32) and its [1, D] gate, appended
// to a MoE node's inputs after the routed experts.
void add_shared_expert(OpTester& t, std::vector<int>& in, int64_t d) {
  in.push_back(t.f32("s_up", {40, d}));
  in.push_back(t.f32("s_gate", {40, d}));
  in.push_back(t.f32("s_down", {d, 40}));
  in.push_back(t.f32("s_g", {1, d}));
}

void moe_case(bool swiglu, bool tied_gate, bool dense = false, bool renormalize = true, bool shared = false,
              bool residual = false) {
  OpTester t;
  const int64_t e = 4, d = 32, f = 24;
  int x = t.f32("x", {6, d}, RowDim::kTokens);
  // Tied gate: experts 1 and 2 get identical rows, so every token sees a
  // tie, which both implementations must break toward the lower index.
  int gate = -1;
  if (tied_gate) {
    std::vector<float> g(static_cast<size_t>(e * d));
    std::mt19937 r(5);
    std::uniform_real_distribution<float> u(-1, 1);
    for (float& z : g) z = u(r);
    for (int64_t i = 0; i < d; ++i) g[static_cast<size_t>(2 * d + i)] = g[static_cast<size_t>(1 * d + i)];
    for (int64_t i = 0; i < d; ++i) g[static_cast<size_t>(i)] = -10.0f * std::fabs(g[static_cast<size_t>(i)]);
    gate = t.f32_values("gate", {e, d}, g);
  } else {
    gate = t.f32("gate", {e, d});
  }
  std::vector<int> in{x, gate};
  for (int64_t i = 0; i < e; ++i) {
    in.push_back(t.f32("up" + std::to_string(i), {f, d}));
    if (swiglu) in.push_back(t.f32("gate" + std::to_string(i), {f, d}));
    in.push_back(t.f32("down" + std::to_string(i), {d, f}));
  }
  if (shared) add_shared_expert(t, in, d);
  if (residual) in.push_back(t.f32("r", {6, d}, RowDim::kTokens));  // fuse-residual-add's input, last
  // The reference always computes only the chosen experts, so the dense
  // (article) variant is checked against the same oracle.
  t.node(OpKind::kMoe, in,
         {{"n_experts", e},
          {"top_k", int64_t{2}},
          {"swiglu", int64_t{swiglu}},
          {"dense", int64_t{dense}},
          {"renormalize", int64_t{renormalize}},
          {"shared", int64_t{shared}},
          {"residual", int64_t{residual}}});
  t.check(5, 0, kTol);
  t.check(1, 0, kTol, 1);  // decode shape, one thread
}

// Each of e experts' weights ([f, d] up, [f, d] gate with swiglu, [d, f]
// down, of dtype dt) appended to a MoE node's inputs.
void add_experts(OpTester& t, std::vector<int>& in, int64_t e, int64_t d, int64_t f, ir::DType dt, bool swiglu) {
  for (int64_t i = 0; i < e; ++i) {
    in.push_back(t.weight("up" + std::to_string(i), {f, d}, dt));
    if (swiglu) in.push_back(t.weight("gate" + std::to_string(i), {f, d}, dt));
    in.push_back(t.weight("down" + std::to_string(i), {d, f}, dt));
  }
}

// A top-2 Moe node over x [rows, d] and e routed experts of dtype dt
// (add_experts), with a shared expert and a fused residual if asked.
void routed_moe_node(OpTester& t, int64_t rows, int64_t e, int64_t d, int64_t f, ir::DType dt, bool swiglu, bool shared,
                     bool residual) {
  int x = t.f32("x", {rows, d}, RowDim::kTokens);
  std::vector<int> in{x, t.f32("gate", {e, d})};
  add_experts(t, in, e, d, f, dt, swiglu);
  if (shared) add_shared_expert(t, in, d);
  if (residual) in.push_back(t.f32("r", {rows, d}, RowDim::kTokens));
  t.node(OpKind::kMoe, in,
         {{"n_experts", e},
          {"top_k", int64_t{2}},
          {"swiglu", int64_t{swiglu}},
          {"shared", int64_t{shared}},
          {"residual", int64_t{residual}}});
}

// The op's outputs on 2 and 3 threads are one thread's, bit for bit.
void expect_one_threads_bits(OpTester& t, int64_t tokens) {
  const auto one = t.fast_outputs(tokens, 0, 1);
  for (int threads : {2, 3}) {
    const auto split = t.fast_outputs(tokens, 0, threads);
    ASSERT_EQ(split.size(), one.size());
    for (size_t b = 0; b < split.size(); ++b) {
      ASSERT_EQ(split[b].size(), one[b].size());
      EXPECT_EQ(std::memcmp(split[b].data(), one[b].data(), split[b].size() * 4), 0)
          << "output " << b << ", " << threads << " threads";
    }
  }
}

// Experts with int8 or bf16-dot weights: the grouped rows, then the hidden
// rows, are rounded once for every expert and column chunk.
// With `many`, enough routed rows that their rounding is split across the
// threads (kParallelValues).
void moe_weight_dtype_case(ir::DType dt, bool swiglu, bool many = false) {
  OpTester t;
  const int64_t e = 4, d = 64, f = 96;
  const int64_t tokens = many ? kParallelValues / (2 * d) + 1 : 13;
  int x = t.f32("x", {tokens + 3, d}, RowDim::kTokens);
  std::vector<int> in{x, t.f32("gate", {e, d})};
  add_experts(t, in, e, d, f, dt, swiglu);
  t.node(OpKind::kMoe, in, {{"n_experts", e}, {"top_k", int64_t{2}}, {"swiglu", int64_t{swiglu}}});
  t.check(tokens, 0, kRoundedTol);
  t.check(1, 0, kRoundedTol, 1);  // decode shape, one thread
}

// Prefill rows with the tokens split across threads (moe_op.cc,
// run_by_tokens: int8 and bf16dot-row experts) or whole experts split (f32
// experts and bf16 panels, run_by_experts), which the op takes on 2 and 3 threads with
// these shapes; 1 thread takes the column split. Same bits either way, and
// within tolerance of the reference. With `many`, enough rows
// (kParallelValues values) that the one-thread routing splits them across
// the threads too. `expect` is the split 2 threads take (e = 8 experts keep
// the expert split balanced on 2 threads). With `shared`, a shared expert
// (f32, of another width) runs after the routed ones.
void moe_prefill_split_case(ir::DType dt, int64_t e, bool swiglu, bool residual, bool many = false,
                            bool shared = false) {
  OpTester t;
  const int64_t d = 64, f = 96, tokens = many ? kParallelValues / d + 5 : 20 * e + 3;
  const bool f32 = dt == ir::DType::kF32 || dt == ir::DType::kF32P16;
  const MoeSplit expect =
      f32 || dt == ir::DType::kBF16DotP16 || dt == ir::DType::kBF16P16 ? MoeSplit::kExperts : MoeSplit::kTokens;
  // Two threads split the tokens evenly, three unevenly (shares differ by
  // one row); both must give one thread's bits.
  ASSERT_EQ(moe_prefill_split(tokens, 2, e, 2, dt), expect);
  ASSERT_EQ(moe_prefill_split(tokens, 2, e, 3, dt), expect);
  routed_moe_node(t, tokens, e, d, f, dt, swiglu, shared, residual);
  // f32 panels sum each output in one chain in k order, which drifts from
  // the reference's sums a little more than the row kernel's split sums.
  t.check(tokens, 0, dt == ir::DType::kF32 ? kTol : f32 ? 4 * kTol : kRoundedTol);
  expect_one_threads_bits(t, tokens);
  // The split each pool took: one thread the column split; the expert split
  // on 2 threads where the routing of these random rows is balanced (8
  // experts), else the token split it falls back to.
  EXPECT_EQ(t.fast_split(tokens, 1), MoeSplit::kColumns);
  if (expect == MoeSplit::kTokens || e == 8) {
    EXPECT_EQ(t.fast_split(tokens, 2), expect);
  }
  const MoeSplit three = t.fast_split(tokens, 3);
  EXPECT_TRUE(three == expect || (expect == MoeSplit::kExperts && three == MoeSplit::kTokens));
}

// Decode rows whose hidden columns are rounded by the threads that computed
// them (moe_op.cc, the column split: where the table rounds column groups on
// their own and d_ff gives every thread two chunks of whole groups). Two
// experts, so 3 threads cannot have whole experts each and take the column
// split; 2 threads take whole experts. d_ff is sized for `sized_for`
// threads: for 3 the threads round, for 2 the chunks are too few on 3 and
// the caller rounds the rows. The same bytes either way, so 1, 2 and 3
// threads give the same bits.
void moe_hidden_rounded_by_threads_case(ir::DType dt, bool swiglu, int64_t sized_for) {
  const kernels::PreparedGemm& pg =
      dt == ir::DType::kQ8 ? kernels::best_table().q8_prepared : kernels::best_table().bf16dot_prepared;
  if (pg.prepare_cols == nullptr) return;  // the table rounds whole rows only
  OpTester t;
  const int64_t e = 2, d = 64, tokens = 8, f = sized_for * 2 * std::lcm<int64_t>(16, pg.col_group);
  SCOPED_TRACE(::testing::Message() << "dt " << static_cast<int>(dt) << " swiglu " << swiglu << " sized_for "
                                    << sized_for << " f " << f);
  int x = t.f32("x", {tokens, d}, RowDim::kTokens);
  std::vector<int> in{x, t.f32("gate", {e, d})};
  add_experts(t, in, e, d, f, dt, swiglu);
  t.node(OpKind::kMoe, in, {{"n_experts", e}, {"top_k", int64_t{2}}, {"swiglu", int64_t{swiglu}}});
  t.check(tokens, 0, kRoundedTol);
  expect_one_threads_bits(t, tokens);
  EXPECT_EQ(t.fast_split(tokens, 2), MoeSplit::kExperts);
  EXPECT_EQ(t.fast_split(tokens, 3), MoeSplit::kColumns);
}

// A decode step (one token, top 2 of 8 experts): 2 threads run one chosen
// expert each (moe_op.cc, run_by_experts), 3 cannot and take the column
// split, 1 runs the column split inline. All three give the same bits,
// within tolerance of the reference; with a shared expert after the routed
// ones and with a fused residual too.
void moe_decode_whole_experts_case(ir::DType dt, bool swiglu, bool shared, bool residual) {
  OpTester t;
  const int64_t e = 8, d = 64, f = 96;
  routed_moe_node(t, 3, e, d, f, dt, swiglu, shared, residual);
  t.check(1, 0, dt == ir::DType::kF32 ? kTol : kRoundedTol);
  expect_one_threads_bits(t, 1);
  EXPECT_EQ(t.fast_split(1, 1), MoeSplit::kColumns);
  EXPECT_EQ(t.fast_split(1, 2), MoeSplit::kExperts);
  EXPECT_EQ(t.fast_split(1, 3), MoeSplit::kColumns);
}

void test_Moe() {
  for (ir::DType dt : {ir::DType::kQ8, ir::DType::kBF16Dot}) {
    // (SwiGLU's hidden rows sized for 3 threads, 3072 int8 values, are
    // rounded beyond kRoundedTol of the f32 reference.)
    moe_hidden_rounded_by_threads_case(dt, false, 3);
    moe_hidden_rounded_by_threads_case(dt, true, 2);
    moe_weight_dtype_case(dt, false);
    moe_weight_dtype_case(dt, true);
    moe_weight_dtype_case(dt, true, /*many=*/true);
  }
  moe_case(false, false);
  moe_case(true, false);
  moe_case(false, true);
  moe_case(false, false, /*dense=*/true);
  moe_case(true, false, /*dense=*/true);
  moe_case(true, false, false, /*renormalize=*/false);
  moe_case(true, false, true, /*renormalize=*/false);
  moe_case(true, false, false, true, /*shared=*/true);
  moe_case(true, false, true, false, /*shared=*/true);
  // With a fused residual: grouped, dense, and after a shared expert.
  moe_case(false, false, false, true, false, /*residual=*/true);
  moe_case(true, false, true, true, false, /*residual=*/true);
  moe_case(true, false, false, true, /*shared=*/true, /*residual=*/true);
  for (ir::DType dt : {ir::DType::kF32, ir::DType::kQ8, ir::DType::kBF16Dot, ir::DType::kF32P16, ir::DType::kBF16P16,
                       ir::DType::kBF16DotP16}) {
    moe_prefill_split_case(dt, 2, false, false);
    moe_prefill_split_case(dt, 4, true, true);
    moe_prefill_split_case(dt, 8, false, true);
  }
  moe_prefill_split_case(ir::DType::kQ8, 4, false, true, /*many=*/true);
  moe_prefill_split_case(ir::DType::kF32, 8, true, false, /*many=*/true);
  moe_prefill_split_case(ir::DType::kF32, 8, true, true, false, /*shared=*/true);
  moe_prefill_split_case(ir::DType::kQ8, 4, true, true, false, /*shared=*/true);
  for (ir::DType dt : {ir::DType::kF32, ir::DType::kQ8, ir::DType::kBF16Dot}) {
    moe_decode_whole_experts_case(dt, false, false, false);
    moe_decode_whole_experts_case(dt, true, false, true);
  }
  moe_decode_whole_experts_case(ir::DType::kQ8, true, /*shared=*/true, /*residual=*/true);
}

void test_GatherRows() {
  OpTester t;
  int x = t.f32("x", {6, 10}, RowDim::kTokens);
  int rows = t.i32("rows", {4, 0, 2}, RowDim::kOutRows);
  t.node(OpKind::kGatherRows, {x, rows});
  t.check(5, 2, 0.0f);
}

#define K3_OP_TEST(e, name)     \
  TEST(OpsFastVsReference, e) { \
    test_##e();                 \
  }
K3_OP_LIST(K3_OP_TEST)
#undef K3_OP_TEST

// The token and expert splits need kPrefillSplitMinRowsPerExpert (8) routed
// rows per expert and thread on average, and a pool of 2..64 threads; f32
// experts take the expert split, the others the token split.
TEST(MoePrefillSplit, TakenOnlyWithEnoughRowsPerExpertAndThread) {
  const ir::DType q8 = ir::DType::kQ8;
  EXPECT_EQ(moe_prefill_split(128, 2, 8, 2, q8), MoeSplit::kTokens);    // k3-base prefill on 2 threads: 16
  EXPECT_EQ(moe_prefill_split(64, 2, 8, 2, q8), MoeSplit::kTokens);     // 8
  EXPECT_EQ(moe_prefill_split(63, 2, 8, 2, q8), MoeSplit::kColumns);    // 7.9
  EXPECT_EQ(moe_prefill_split(8, 2, 8, 2, q8), MoeSplit::kColumns);     // batch-8 decode
  EXPECT_EQ(moe_prefill_split(128, 2, 8, 1, q8), MoeSplit::kColumns);   // one thread
  EXPECT_EQ(moe_prefill_split(128, 2, 8, 16, q8), MoeSplit::kColumns);  // 2 per expert and thread
  EXPECT_EQ(moe_prefill_split(4096, 2, 8, 64, q8), MoeSplit::kTokens);
  EXPECT_EQ(moe_prefill_split(8192, 2, 8, 65, q8), MoeSplit::kColumns);  // more threads than the split's bins
  for (ir::DType dt : {ir::DType::kBF16, ir::DType::kBF16Dot})
    EXPECT_EQ(moe_prefill_split(128, 2, 8, 2, dt), MoeSplit::kTokens);
  EXPECT_EQ(moe_prefill_split(128, 2, 8, 2, ir::DType::kF32), MoeSplit::kExperts);
  EXPECT_EQ(moe_prefill_split(63, 2, 8, 2, ir::DType::kF32), MoeSplit::kColumns);
  EXPECT_EQ(moe_prefill_split(128, 2, 8, 1, ir::DType::kF32), MoeSplit::kColumns);
}

// The expert split's assignment: largest expert first onto the least loaded
// thread, each expert costing its rows + 4; refused when a thread would get
// no expert or the busiest more than 1.1 times the mean.
TEST(MoePrefillSplit, AssignsExpertsLargestFirstWithinTheImbalanceBound) {
  auto offsets = [](const std::vector<int32_t>& rows) {
    std::vector<int32_t> offs{0};
    for (int32_t r : rows) offs.push_back(offs.back() + r);
    return offs;
  };
  std::vector<int32_t> bin_of(8);
  // k3-base-like: costs 40 36 36 32 32 28 28 24 (total 256) go to the
  // lighter thread in turn (ties to thread 0): loads 40/0, 40/36, 40/72,
  // 72/72, 104/72, 104/100, 104/128, 128/128.
  auto offs = offsets({36, 32, 32, 28, 28, 24, 24, 20});
  ASSERT_TRUE(assign_experts(offs.data(), 8, 2, bin_of.data()));
  EXPECT_EQ(bin_of, (std::vector<int32_t>{0, 1, 1, 0, 0, 1, 1, 0}));
  // Largest first whatever the expert's index; an expert with no rows gets
  // no thread.
  offs = offsets({8, 0, 40, 40, 0, 0, 0, 8});
  ASSERT_TRUE(assign_experts(offs.data(), 8, 2, bin_of.data()));
  EXPECT_EQ(bin_of, (std::vector<int32_t>{0, -1, 0, 1, -1, -1, -1, 1}));
  // 3 active experts on 2 threads: 88 against a mean of 66 -> refused.
  offs = offsets({40, 0, 40, 40, 0, 0, 0, 0});
  EXPECT_FALSE(assign_experts(offs.data(), 8, 2, bin_of.data()));
  // One expert with most rows: 104 against a mean of 80 -> refused.
  offs = offsets({100, 4, 4, 4, 4, 4, 4, 4});
  EXPECT_FALSE(assign_experts(offs.data(), 8, 2, bin_of.data()));
  // Fewer active experts than threads -> refused.
  offs = offsets({40, 40, 0, 0, 0, 0, 0, 0});
  EXPECT_FALSE(assign_experts(offs.data(), 8, 3, bin_of.data()));
  // Just inside the bound: costs 24 24 20 20 20 -> 44 / 64 against a mean
  // of 54 (1.19): refused; 24 24 24 24 -> 48 / 48: taken.
  offs = offsets({20, 20, 16, 16, 16, 0, 0, 0});
  EXPECT_FALSE(assign_experts(offs.data(), 8, 2, bin_of.data()));
  offs = offsets({20, 20, 20, 20, 0, 0, 0, 0});
  EXPECT_TRUE(assign_experts(offs.data(), 8, 2, bin_of.data()));
}

TEST(OpsShapeRules, RejectMismatchedShapes) {
  ir::Graph g;
  int x = g.add_input("x", ir::DType::kF32, {4, 8}, RowDim::kTokens);
  int w = g.add_input("w", ir::DType::kF32, {3, 9}, RowDim::kFixed);
  auto r = g.add_node(OpKind::kLinear, "bad", {x, w}, {});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("weight w has shape [3,9]"), std::string::npos) << r.status().message();
  int ids = g.add_input("ids", ir::DType::kF32, {4}, RowDim::kTokens);
  auto e = g.add_node(OpKind::kEmbedding, "emb", {x, ids}, {});
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("must be i32"), std::string::npos) << e.status().message();
  auto m = g.add_node(OpKind::kMoe, "moe", {x, w}, {{"n_experts", int64_t{2}}, {"top_k", int64_t{3}}});
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("top_k exceeds n_experts"), std::string::npos) << m.status().message();
  // A corrupt expert count (as a damaged .k3m could hold) is named, not
  // multiplied into an overflowing input index.
  auto huge = g.add_node(OpKind::kMoe, "moe2", {x, w},
                         {{"n_experts", int64_t{1} << 62}, {"top_k", int64_t{1}}, {"swiglu", int64_t{1}}});
  ASSERT_FALSE(huge.ok());
  EXPECT_NE(huge.status().message().find("exceeds the node's 2 inputs"), std::string::npos) << huge.status().message();
}

}  // namespace
}  // namespace k3::runtime::testing
