// weight-precision pass: which weights become bf16 or int8, a
// must-not-convert test per guard, and numerical equivalence of a bf16- or
// int8-compiled model to its fp32 original (within the precision's rounding)
// and of its fast ops to the reference ops.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "passes/weight_precision.h"
#include "passes/weight_test_util.h"
#include "util/half.h"
#include "util/quant.h"

namespace k3::passes {
namespace {

using ir::DType;
using ir::OpKind;
using ir::RowDim;

using test::input_of;
using test::node;
using test::step_logits;

const std::vector<float>& weights() {
  return test::test_weights();
}

ir::Graph small_graph() {
  return test::tied_moe_graph(8, 4);
}

DType dtype_of_input(const ir::Graph& g, const std::string& node_name, size_t i) {
  return input_of(g, node_name, i).dtype;
}

// bf16 matrices become kBF16Dot: bf16 weights whose products also round the
// activations to bf16 (kernels.h, gemm_nt_bf16dot).
TEST(WeightPrecision, ConvertsLinearAndExpertWeightsToBf16) {
  ir::Graph g = small_graph();
  WeightPrecision pass("bf16");
  auto changed = pass.run(g);
  ASSERT_TRUE(changed.ok()) << changed.status().message();
  EXPECT_TRUE(*changed);
  ASSERT_TRUE(g.verify().ok()) << g.verify().message();
  EXPECT_EQ(dtype_of_input(g, "proj", 1), DType::kBF16Dot);
  EXPECT_EQ(dtype_of_input(g, "output", 1), DType::kBF16Dot);
  for (size_t i = 2; i < 6; ++i) EXPECT_EQ(dtype_of_input(g, "moe", i), DType::kBF16Dot) << i;
  // Values are rounded to nearest even.
  const int id = g.find_value("proj.weight");
  ASSERT_GE(id, 0);
  const auto* h = static_cast<const uint16_t*>(g.value(id).data);
  for (int i = 0; i < 64; ++i) EXPECT_EQ(h[i], f32_to_bf16(weights()[7 + i])) << i;
  // A second run changes nothing.
  WeightPrecision again("bf16");
  auto changed2 = again.run(g);
  ASSERT_TRUE(changed2.ok());
  EXPECT_FALSE(*changed2);
}

// Runs `precision` on the small graph: the Linears' matrices and the
// experts' come out in the dtypes given, the gate stays f32, and the bytes
// are the weights rounded to bf16 (nearest even).
void expect_bf16_dtypes(const std::string& precision, DType linear, DType expert) {
  ir::Graph g = small_graph();
  auto changed = WeightPrecision(precision).run(g);
  ASSERT_TRUE(changed.ok()) << changed.status().message();
  EXPECT_TRUE(*changed);
  ASSERT_TRUE(g.verify().ok()) << g.verify().message();
  EXPECT_EQ(dtype_of_input(g, "proj", 1), linear);
  EXPECT_EQ(dtype_of_input(g, "output", 1), linear);
  EXPECT_EQ(dtype_of_input(g, "moe", 1), DType::kF32);
  for (size_t i = 2; i < 6; ++i) EXPECT_EQ(dtype_of_input(g, "moe", i), expert) << i;
  const int id = g.find_value("proj.weight");
  ASSERT_GE(id, 0);
  const auto* h = static_cast<const uint16_t*>(g.value(id).data);
  for (int i = 0; i < 64; ++i) EXPECT_EQ(h[i], f32_to_bf16(weights()[7 + i])) << i;
}

// bf16-mixed: the same rounded weights, Linear matrices kBF16 (FMA on f32
// activations), expert matrices kBF16Dot, the gate still f32.
TEST(WeightPrecision, Bf16MixedWidensLinearsAndKeepsExpertsOnDotProducts) {
  expect_bf16_dtypes("bf16-mixed", DType::kBF16, DType::kBF16Dot);
}

// bf16-f32: the same rounded weights, every matrix kBF16 (widened against
// f32 activations), the gate still f32.
TEST(WeightPrecision, Bf16F32StoresWidenedBf16Matrices) {
  expect_bf16_dtypes("bf16-f32", DType::kBF16, DType::kBF16);
}

// 32-wide rows so int8 applies: tokens -> Embedding(table [16,32]) ->
// Linear(w [32,32]) -> Moe(gate, 2 experts up [32,32] down [32,32]) ->
// Linear(table) (tied), plus a Linear whose rows (K = 8) are not whole blocks.
ir::Graph int8_graph() {
  ir::Graph g;
  const float* w = weights().data();
  const int tokens = g.add_input("tokens", DType::kI32, {2}, RowDim::kTokens);
  const int table = g.add_weight("table", DType::kF32, {16, 32}, w);
  const int x = node(g, OpKind::kEmbedding, "embed", {table, tokens});
  const int h = node(g, OpKind::kLinear, "proj", {x, g.add_weight("proj.weight", DType::kF32, {32, 32}, w + 7)});
  std::vector<int> moe_in{h, g.add_weight("gate", DType::kF32, {2, 32}, w + 11)};
  for (int e = 0; e < 2; ++e) {
    moe_in.push_back(g.add_weight("e" + std::to_string(e) + ".up", DType::kF32, {32, 32}, w + 1000 * e));
    moe_in.push_back(g.add_weight("e" + std::to_string(e) + ".down", DType::kF32, {32, 32}, w + 1000 * e + 500));
  }
  const int y = node(g, OpKind::kMoe, "moe", moe_in, {{"n_experts", int64_t{2}}, {"top_k", int64_t{1}}});
  const int narrow =
      node(g, OpKind::kLinear, "narrow", {y, g.add_weight("narrow.weight", DType::kF32, {8, 32}, w + 3)});
  const int back =
      node(g, OpKind::kLinear, "widen", {narrow, g.add_weight("widen.weight", DType::kF32, {32, 8}, w + 5)});
  g.mark_output(node(g, OpKind::kLinear, "output", {back, table}));
  return g;
}

TEST(WeightPrecision, Int8QuantizesWholeBlockMatricesOnly) {
  ir::Graph g = int8_graph();
  WeightPrecision pass("int8");
  auto changed = pass.run(g);
  ASSERT_TRUE(changed.ok()) << changed.status().message();
  EXPECT_TRUE(*changed);
  ASSERT_TRUE(g.verify().ok()) << g.verify().message();
  EXPECT_EQ(dtype_of_input(g, "proj", 1), DType::kQ8);
  EXPECT_EQ(dtype_of_input(g, "narrow", 1), DType::kQ8);  // [8, 32]: rows of 32 are whole blocks
  for (size_t i = 2; i < 6; ++i) EXPECT_EQ(dtype_of_input(g, "moe", i), DType::kQ8) << i;
  EXPECT_EQ(dtype_of_input(g, "output", 1), DType::kQ8);
  // Guards: K = 8 is not a whole block; the gate and the embedding stay f32.
  EXPECT_EQ(dtype_of_input(g, "widen", 1), DType::kF32);
  EXPECT_EQ(dtype_of_input(g, "moe", 1), DType::kF32);
  EXPECT_EQ(dtype_of_input(g, "embed", 0), DType::kF32);
  // The bytes are util/quant.h's rows, and the value's size is rows * q8_row_bytes.
  const ir::Value& v = g.value(g.find_value("proj.weight"));
  ASSERT_EQ(v.bytes(), 32 * ir::q8_row_bytes(32));
  std::vector<uint8_t> want(ir::q8_row_bytes(32));
  for (int r = 0; r < 32; ++r) {
    quantize_q8_row(weights().data() + 7 + r * 32, 32, want.data());
    ASSERT_EQ(std::memcmp(static_cast<const uint8_t*>(v.data) + r * want.size(), want.data(), want.size()), 0) << r;
  }
  // A second run changes nothing.
  auto again = WeightPrecision("int8").run(g);
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(*again);
}

// int8-channel: the same matrices as int8 (its guards are int8's), each row
// quantized with one scale (util/quant.h, quantize_q8_row_channel) in the
// kQ8 row format.
TEST(WeightPrecision, Int8ChannelQuantizesEachRowWithOneScale) {
  ir::Graph g = int8_graph();
  WeightPrecision pass("int8-channel");
  auto changed = pass.run(g);
  ASSERT_TRUE(changed.ok()) << changed.status().message();
  EXPECT_TRUE(*changed);
  ASSERT_TRUE(g.verify().ok()) << g.verify().message();
  EXPECT_EQ(dtype_of_input(g, "proj", 1), DType::kQ8);
  for (size_t i = 2; i < 6; ++i) EXPECT_EQ(dtype_of_input(g, "moe", i), DType::kQ8) << i;
  EXPECT_EQ(dtype_of_input(g, "widen", 1), DType::kF32) << "K = 8 is not a whole block";
  EXPECT_EQ(dtype_of_input(g, "moe", 1), DType::kF32) << "the gate stays f32";
  const ir::Value& v = g.value(g.find_value("e0.up"));
  ASSERT_EQ(v.bytes(), 32 * ir::q8_row_bytes(32));
  std::vector<uint8_t> want(ir::q8_row_bytes(32));
  for (int r = 0; r < 32; ++r) {
    quantize_q8_row_channel(weights().data() + r * 32, 32, want.data());
    ASSERT_EQ(std::memcmp(static_cast<const uint8_t*>(v.data) + r * want.size(), want.data(), want.size()), 0) << r;
  }
  EXPECT_FALSE(check_weight_precision("int8-channel").message().size() > 0);
  EXPECT_NE(check_weight_precision("int8-row").message().find("int8-channel"), std::string::npos)
      << "the error lists the choices";
}

TEST(WeightPrecision, Int8MustNotSplitAMoeAcrossDtypes) {
  // Experts of width 48: up [48, 32] quantizes, down [32, 48] does not, so
  // the whole MoE stays f32 rather than mixing dtypes.
  ir::Graph g;
  const float* w = weights().data();
  const int x = g.add_input("x", DType::kF32, {2, 32}, RowDim::kTokens);
  std::vector<int> moe_in{x, g.add_weight("gate", DType::kF32, {2, 32}, w)};
  for (int e = 0; e < 2; ++e) {
    moe_in.push_back(g.add_weight("e" + std::to_string(e) + ".up", DType::kF32, {48, 32}, w + 100 * e));
    moe_in.push_back(g.add_weight("e" + std::to_string(e) + ".down", DType::kF32, {32, 48}, w + 100 * e + 50));
  }
  g.mark_output(node(g, OpKind::kMoe, "moe", moe_in, {{"n_experts", int64_t{2}}, {"top_k", int64_t{1}}}));
  auto changed = WeightPrecision("int8").run(g);
  ASSERT_TRUE(changed.ok()) << changed.status().message();
  EXPECT_FALSE(*changed);
  for (size_t i = 2; i < 6; ++i) EXPECT_EQ(dtype_of_input(g, "moe", i), DType::kF32) << i;
  ASSERT_TRUE(g.verify().ok());
}

// A weight beyond kQ8MaxAbs would need a block scale past the largest f16:
// that matrix stays f32 (and, being an expert, keeps its MoE f32), while a
// matrix holding inf still quantizes (its block is NaN, as in f32).
TEST(WeightPrecision, Int8MustNotQuantizeWeightsBeyondTheF16Scale) {
  std::vector<float> big(weights().begin(), weights().begin() + 32 * 32);
  big[100] = kQ8MaxAbs * 1.01f;
  std::vector<float> with_inf(weights().begin(), weights().begin() + 32 * 32);
  with_inf[5] = std::numeric_limits<float>::infinity();
  std::vector<float> at_limit(weights().begin(), weights().begin() + 32 * 32);
  at_limit[7] = -kQ8MaxAbs;
  ir::Graph g;
  const int x = g.add_input("x", DType::kF32, {2, 32}, RowDim::kTokens);
  const int a = node(g, OpKind::kLinear, "big", {x, g.add_weight("big.weight", DType::kF32, {32, 32}, big.data())});
  const int b =
      node(g, OpKind::kLinear, "inf", {a, g.add_weight("inf.weight", DType::kF32, {32, 32}, with_inf.data())});
  g.mark_output(
      node(g, OpKind::kLinear, "edge", {b, g.add_weight("edge.weight", DType::kF32, {32, 32}, at_limit.data())}));
  auto changed = WeightPrecision("int8").run(g);
  ASSERT_TRUE(changed.ok()) << changed.status().message();
  EXPECT_EQ(dtype_of_input(g, "big", 1), DType::kF32);
  EXPECT_EQ(dtype_of_input(g, "inf", 1), DType::kQ8);
  EXPECT_EQ(dtype_of_input(g, "edge", 1), DType::kQ8);
  const ir::Value& v = g.value(g.find_value("edge.weight"));
  EXPECT_EQ(q8_weight(static_cast<const uint8_t*>(v.data), 32, 7), -kQ8MaxAbs) << "the largest weight stays exact";
}

TEST(WeightPrecision, MustNotConvertGate) {
  ir::Graph g = small_graph();
  ASSERT_TRUE(WeightPrecision("bf16").run(g).ok());
  EXPECT_EQ(dtype_of_input(g, "moe", 1), DType::kF32);
}

TEST(WeightPrecision, MustNotConvertTiedWeightForItsOtherReader) {
  // "table" is both the embedding table and the output projection: the
  // output reads a bf16 copy, the embedding keeps reading f32.
  ir::Graph g = small_graph();
  ASSERT_TRUE(WeightPrecision("bf16").run(g).ok());
  EXPECT_EQ(dtype_of_input(g, "embed", 0), DType::kF32);
  EXPECT_EQ(dtype_of_input(g, "output", 1), DType::kBF16Dot);
}

TEST(WeightPrecision, MustNotConvertActivationsOrNonF32Weights) {
  ir::Graph g;
  const int x = g.add_input("x", DType::kF32, {2, 8}, RowDim::kTokens);
  const int a = g.add_input("w_act", DType::kF32, {8, 8}, RowDim::kFixed);  // weight fed at run time
  std::vector<uint16_t> bf(64, 0x3f80);
  const int b = g.add_weight("w_bf16", DType::kBF16, {8, 8}, bf.data());
  const int y = node(g, OpKind::kLinear, "act", {x, a});
  g.mark_output(node(g, OpKind::kLinear, "already", {y, b}));
  WeightPrecision pass("bf16");
  auto changed = pass.run(g);
  ASSERT_TRUE(changed.ok());
  EXPECT_FALSE(*changed);
  EXPECT_EQ(dtype_of_input(g, "act", 1), DType::kF32);
  EXPECT_EQ(g.value(g.nodes()[1].inputs[1]).data, bf.data());
}

// A MoE whose experts are already bf16 (a bf16 checkpoint) stays bf16 under
// int8, and the int8 check never reads its 2-byte weights as 4-byte floats
// (it did: a heap over-read of the second half of each matrix, which the
// sanitizer build reports).
TEST(WeightPrecision, Int8LeavesABf16MoeAloneWithoutReadingItAsF32) {
  ir::Graph g;
  const int x = g.add_input("x", DType::kF32, {2, 32}, RowDim::kTokens);
  std::vector<int> moe_in{x, g.add_weight("gate", DType::kF32, {2, 32}, weights().data())};
  std::vector<std::vector<uint16_t>> experts(4, std::vector<uint16_t>(32 * 32, 0x3f80));
  for (int e = 0; e < 2; ++e) {
    moe_in.push_back(g.add_weight("e" + std::to_string(e) + ".up", DType::kBF16, {32, 32}, experts[2 * e].data()));
    moe_in.push_back(
        g.add_weight("e" + std::to_string(e) + ".down", DType::kBF16, {32, 32}, experts[2 * e + 1].data()));
  }
  g.mark_output(node(g, OpKind::kMoe, "moe", moe_in, {{"n_experts", int64_t{2}}, {"top_k", int64_t{1}}}));
  auto changed = WeightPrecision("int8").run(g);
  ASSERT_TRUE(changed.ok()) << changed.status().message();
  EXPECT_FALSE(*changed);
  for (size_t i = 2; i < 6; ++i) EXPECT_EQ(dtype_of_input(g, "moe", i), DType::kBF16) << i;
}

// Rows longer than the bf16 dot-product kernels take (their rounded
// activations live on the stack) stay f32-activation bf16 (kBF16), and so
// does a MoE one of whose expert matrices is that long (one dtype per MoE);
// a row at the limit becomes kBF16Dot. The shape rule refuses a longer
// kBF16Dot row (a crafted .k3m) with a message.
TEST(WeightPrecision, Bf16DotOnlyForRowsTheKernelsTake) {
  constexpr int64_t kMax = ir::kBF16DotMaxCols;
  std::vector<float> w(static_cast<size_t>(2 * (kMax + 1)), 0.5f);  // the largest matrix: [kMax + 1, 2]
  ir::Graph g;
  const int x = g.add_input("x", DType::kF32, {1, 1}, RowDim::kTokens);
  const int wide =
      node(g, OpKind::kLinear, "wide", {x, g.add_weight("wide.weight", DType::kF32, {kMax + 1, 1}, w.data())});
  const int at =
      node(g, OpKind::kLinear, "at", {wide, g.add_weight("at.weight", DType::kF32, {1, kMax + 1}, w.data())});
  const int lim = node(g, OpKind::kLinear, "lim", {at, g.add_weight("lim.weight", DType::kF32, {kMax, 1}, w.data())});
  const int h = node(g, OpKind::kLinear, "back", {lim, g.add_weight("back.weight", DType::kF32, {2, kMax}, w.data())});
  // MoE over d = 2 with d_ff = kMax + 1: the down matrices' rows are too long.
  std::vector<int> moe_in{h, g.add_weight("gate", DType::kF32, {2, 2}, w.data())};
  for (int e = 0; e < 2; ++e) {
    moe_in.push_back(g.add_weight("e" + std::to_string(e) + ".up", DType::kF32, {kMax + 1, 2}, w.data()));
    moe_in.push_back(g.add_weight("e" + std::to_string(e) + ".down", DType::kF32, {2, kMax + 1}, w.data()));
  }
  g.mark_output(node(g, OpKind::kMoe, "moe", moe_in, {{"n_experts", int64_t{2}}, {"top_k", int64_t{1}}}));
  auto changed = WeightPrecision("bf16").run(g);
  ASSERT_TRUE(changed.ok()) << changed.status().message();
  ASSERT_TRUE(g.verify().ok()) << g.verify().message();
  EXPECT_EQ(dtype_of_input(g, "wide", 1), DType::kBF16Dot);  // K = 1
  EXPECT_EQ(dtype_of_input(g, "at", 1), DType::kBF16);       // K = kMax + 1
  EXPECT_EQ(dtype_of_input(g, "lim", 1), DType::kBF16Dot);   // K = 1
  EXPECT_EQ(dtype_of_input(g, "back", 1), DType::kBF16Dot);  // K = kMax
  for (size_t i = 2; i < 6; ++i) EXPECT_EQ(dtype_of_input(g, "moe", i), DType::kBF16) << i;

  ir::Graph bad;
  std::vector<uint16_t> h16(static_cast<size_t>(kMax + 1));
  const int bx = bad.add_input("x", DType::kF32, {1, kMax + 1}, RowDim::kTokens);
  auto r = bad.add_node(OpKind::kLinear, "long",
                        {bx, bad.add_weight("long.weight", DType::kBF16Dot, {1, kMax + 1}, h16.data())}, {});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("at most 32768"), std::string::npos) << r.status().message();
}

// One weight read by a Linear whose rows the dot-product kernels take and
// by a MoE that must stay kBF16 (another of its matrices has longer rows):
// each reader gets its own copy in its own dtype, so the MoE's matrices keep
// one dtype and the graph verifies. (Converted once for both, the MoE got a
// kBF16Dot matrix among kBF16 ones and its shape rule failed the compile.)
TEST(WeightPrecision, SharedWeightGetsEachReadersBf16Dtype) {
  constexpr int64_t kMax = ir::kBF16DotMaxCols;
  std::vector<float> w(static_cast<size_t>(2 * (kMax + 1)), 0.5f);
  ir::Graph g;
  const int x = g.add_input("x", DType::kF32, {1, 2}, RowDim::kTokens);
  const int up0 = g.add_weight("e0.up", DType::kF32, {kMax + 1, 2}, w.data());
  const int lin = node(g, OpKind::kLinear, "lin", {x, up0});  // K = 2: a dot-product matrix
  std::vector<int> moe_in{x, g.add_weight("gate", DType::kF32, {2, 2}, w.data())};
  moe_in.push_back(up0);
  moe_in.push_back(g.add_weight("e0.down", DType::kF32, {2, kMax + 1}, w.data()));  // K = kMax + 1
  moe_in.push_back(g.add_weight("e1.up", DType::kF32, {kMax + 1, 2}, w.data()));
  moe_in.push_back(g.add_weight("e1.down", DType::kF32, {2, kMax + 1}, w.data()));
  g.mark_output(lin);
  g.mark_output(node(g, OpKind::kMoe, "moe", moe_in, {{"n_experts", int64_t{2}}, {"top_k", int64_t{1}}}));
  auto changed = WeightPrecision("bf16").run(g);
  ASSERT_TRUE(changed.ok()) << changed.status().message();
  ASSERT_TRUE(g.verify().ok()) << g.verify().message();
  EXPECT_EQ(dtype_of_input(g, "lin", 1), DType::kBF16Dot);
  for (size_t i = 2; i < 6; ++i) EXPECT_EQ(dtype_of_input(g, "moe", i), DType::kBF16) << i;
}

// A q8 matrix whose rows are longer than the int8 kernels take (a crafted
// .k3m; the compiler keeps such matrices f32) fails the Linear's shape rule
// with a message, before a kernel could overrun its stack buffer or loop.
TEST(WeightPrecision, ShapeRuleRefusesQ8RowsLongerThanTheKernelsTake) {
  for (int64_t k : {ir::kQ8MaxCols, ir::kQ8MaxCols + 32}) {
    ir::Graph g;
    std::vector<uint8_t> q(ir::q8_row_bytes(static_cast<uint64_t>(k)));
    const int x = g.add_input("x", DType::kF32, {1, k}, RowDim::kTokens);
    auto r = g.add_node(OpKind::kLinear, "long", {x, g.add_weight("long.weight", DType::kQ8, {1, k}, q.data())}, {});
    if (k == ir::kQ8MaxCols) {
      EXPECT_TRUE(r.ok()) << r.status().message();
    } else {
      ASSERT_FALSE(r.ok());
      EXPECT_NE(r.status().message().find("at most 32768"), std::string::npos) << r.status().message();
    }
  }
}

TEST(WeightPrecision, Fp32IsANoOpAndOthersAreRefused) {
  ir::Graph g = small_graph();
  auto r = WeightPrecision("fp32").run(g);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(*r);
  auto bad = WeightPrecision("int3").run(g);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("int3"), std::string::npos);
  EXPECT_NE(bad.status().message().find("bf16-f32"), std::string::npos);  // the message lists the choices
}

// End to end on k3-tiny: bf16 logits stay close to fp32 (bf16 has 8 bits of
// mantissa: relative weight error <= 2^-9), and the fast bf16 ops agree with
// the reference ops on the same bf16 weights.
std::vector<float> last_logits(runtime::Engine& e, const std::vector<int32_t>& toks) {
  return step_logits(e, 0, toks);
}

std::unique_ptr<runtime::Engine> engine(const std::string& precision, bool reference,
                                        const std::string& layout = "rows") {
  return test::tiny_engine(precision, layout, reference);
}

// A model compiled at `precision` against the fp32 one on k3-tiny: it reads
// at most `max_bytes_ratio` of fp32's weight bytes per token, its logits move
// (but by at most `tol` of the largest logit), and its fast ops equal the
// reference ops on the same converted weights.
void expect_close_to_fp32(const std::string& precision, double max_bytes_ratio, float tol,
                          const std::string& layout = "rows") {
  const std::vector<int32_t> prompt{5, 17, 42, 99, 3, 1};
  auto f32 = engine("fp32", false);
  auto fast = engine(precision, false, layout);
  auto ref = engine(precision, true, layout);
  EXPECT_LT(static_cast<double>(fast->weight_bytes_per_token()),
            static_cast<double>(f32->weight_bytes_per_token()) * max_bytes_ratio);
  const auto a = last_logits(*f32, prompt), b = last_logits(*fast, prompt), r = last_logits(*ref, prompt);
  ASSERT_EQ(a.size(), b.size());
  ASSERT_EQ(b.size(), r.size());
  float max_abs = 0, err_f32 = 0, err_ref = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    max_abs = std::max(max_abs, std::fabs(a[i]));
    err_f32 = std::max(err_f32, std::fabs(a[i] - b[i]));
    err_ref = std::max(err_ref, std::fabs(r[i] - b[i]));
  }
  EXPECT_GT(err_f32, 0.0f) << precision << " weights should change the logits a little";
  EXPECT_LE(err_f32, tol * std::max(1.0f, max_abs));
  EXPECT_LE(err_ref, 1e-4f * std::max(1.0f, max_abs));
}

// bf16 has 8 bits of mantissa: relative weight error <= 2^-9. In the panel
// layout (bf16dot panels: the same rounded products, another summation
// order) the same bound holds.
TEST(WeightPrecision, Bf16ModelStaysCloseToFp32AndMatchesReferenceOps) {
  expect_close_to_fp32("bf16", 0.75, 2e-2f);
  expect_close_to_fp32("bf16", 0.75, 2e-2f, "panels");
}

// bf16-f32 rounds only the weights, so it stays as close as bf16; in the
// panel layout too (another summation order, the same bound).
TEST(WeightPrecision, Bf16F32ModelStaysCloseToFp32AndMatchesReferenceOps) {
  expect_close_to_fp32("bf16-f32", 0.75, 2e-2f);
  expect_close_to_fp32("bf16-f32", 0.75, 2e-2f, "panels");
}

// bf16-mixed rounds the experts' activations as bf16 does and no others, so
// bf16's bound holds; in panels only its Linears are packed.
TEST(WeightPrecision, Bf16MixedModelStaysCloseToFp32AndMatchesReferenceOps) {
  expect_close_to_fp32("bf16-mixed", 0.75, 2e-2f);
  expect_close_to_fp32("bf16-mixed", 0.75, 2e-2f, "panels");
}

// int8 weights: per-block absmax gives an error up to 1/254 of the block's
// largest weight, so the logits move more than with bf16 but stay close.
TEST(WeightPrecision, Int8ModelStaysCloseToFp32AndMatchesReferenceOps) {
  expect_close_to_fp32("int8", 0.4, 5e-2f);
}

}  // namespace
}  // namespace k3::passes
