// pack-weights pass: which matrices become panels, a must-not-pack test per
// guard, the packed bytes, and numerical equivalence of a packed model to
// the row-layout one (within float summation-order differences), its fast
// ops to the reference ops, and its greedy tokens to the row layout's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "passes/pack_weights.h"
#include "passes/pipeline.h"
#include "passes/weight_precision.h"
#include "passes/weight_test_util.h"
#include "util/half.h"
#include "util/panel.h"
#include "util/q8_panel.h"
#include "util/tiles.h"

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

// d = 20: a whole panel and a padded one; experts of width 12.
ir::Graph small_graph() {
  return test::tied_moe_graph(20, 12);
}

TEST(PackWeights, PacksLinearAndExpertMatrices) {
  ir::Graph g = small_graph();
  PackWeights pass;
  auto changed = pass.run(g);
  ASSERT_TRUE(changed.ok()) << changed.status().message();
  EXPECT_TRUE(*changed);
  ASSERT_TRUE(g.verify().ok()) << g.verify().message();
  EXPECT_EQ(input_of(g, "proj", 1).dtype, DType::kF32P16);
  EXPECT_EQ(input_of(g, "output", 1).dtype, DType::kF32P16);
  for (size_t i = 2; i < 6; ++i) EXPECT_EQ(input_of(g, "moe", i).dtype, DType::kF32P16) << i;
  // The bytes are util/panel.h's layout of the original rows: [20, 20] is a
  // whole panel and a padded one, 32 * 20 floats.
  const ir::Value& v = input_of(g, "proj", 1);
  EXPECT_EQ(v.shape, (std::vector<int64_t>{20, 20}));
  ASSERT_EQ(v.bytes(), 32u * 20u * 4u);
  std::vector<float> rows(20 * 20);
  unpack_panels(static_cast<const float*>(v.data), 20, 20, rows.data());
  EXPECT_EQ(std::memcmp(rows.data(), weights().data() + 7, rows.size() * 4), 0);
  // A second run changes nothing.
  auto again = PackWeights().run(g);
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(*again);
}

// bf16 weights as a bf16 checkpoint holds them (kBF16: f32 activations).
TEST(PackWeights, PacksBf16Matrices) {
  std::vector<uint16_t> w16(20 * 20);
  for (size_t i = 0; i < w16.size(); ++i) w16[i] = f32_to_bf16(weights()[7 + i]);
  ir::Graph g;
  const int x = g.add_input("x", DType::kF32, {2, 20}, RowDim::kTokens);
  g.mark_output(node(g, OpKind::kLinear, "proj", {x, g.add_weight("proj.weight", DType::kBF16, {20, 20}, w16.data())}));
  auto changed = PackWeights().run(g);
  ASSERT_TRUE(changed.ok()) << changed.status().message();
  EXPECT_TRUE(*changed);
  ASSERT_TRUE(g.verify().ok()) << g.verify().message();
  const ir::Value& v = input_of(g, "proj", 1);
  EXPECT_EQ(v.dtype, DType::kBF16P16);
  ASSERT_EQ(v.bytes(), 32u * 20u * 2u);
  std::vector<uint16_t> rows(20 * 20);
  unpack_panels(static_cast<const uint16_t*>(v.data), 20, 20, rows.data());
  EXPECT_EQ(rows, w16);
}

// `--precision bf16` makes kBF16Dot matrices, whose kernel multiplies rows
// of bf16 by bf16-rounded activations. They become kBF16DotP16, whose
// kernel rounds the activations too, never kBF16P16 (f32 activations,
// another computation); the bytes are bf16p16's layout of the same rows;
// the MoE gate stays f32 rows.
TEST(PackWeights, PacksBf16DotMatricesIntoBf16DotPanels) {
  ir::Graph g = small_graph();
  ASSERT_TRUE(WeightPrecision("bf16").run(g).ok());
  const ir::Value rows = input_of(g, "proj", 1);
  ASSERT_EQ(rows.dtype, DType::kBF16Dot);
  const std::vector<uint16_t> w16(static_cast<const uint16_t*>(rows.data),
                                  static_cast<const uint16_t*>(rows.data) + 20 * 20);
  auto changed = PackWeights().run(g);
  ASSERT_TRUE(changed.ok()) << changed.status().message();
  EXPECT_TRUE(*changed);
  ASSERT_TRUE(g.verify().ok()) << g.verify().message();
  EXPECT_EQ(input_of(g, "proj", 1).dtype, DType::kBF16DotP16);
  EXPECT_EQ(input_of(g, "output", 1).dtype, DType::kBF16DotP16);
  for (size_t i = 2; i < 6; ++i) EXPECT_EQ(input_of(g, "moe", i).dtype, DType::kBF16DotP16) << i;
  EXPECT_EQ(input_of(g, "moe", 1).dtype, DType::kF32);
  const ir::Value& v = input_of(g, "proj", 1);
  ASSERT_EQ(v.bytes(), 32u * 20u * 2u);
  std::vector<uint16_t> back(20 * 20);
  unpack_panels(static_cast<const uint16_t*>(v.data), 20, 20, back.data());
  EXPECT_EQ(back, w16);
}

TEST(PackWeights, RowsIsANoOpAndOthersAreRefused) {
  ir::Graph g = small_graph();
  auto rows = PackWeights("rows").run(g);
  ASSERT_TRUE(rows.ok());
  EXPECT_FALSE(*rows);
  EXPECT_EQ(input_of(g, "proj", 1).dtype, DType::kF32);
  auto bad = PackWeights("squares").run(g);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("squares"), std::string::npos);
  PipelineOptions o;
  o.weight_layout = "squares";
  const Status s = check_pipeline_options(o);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("--weight-layout"), std::string::npos);
}

// --weight-layout tiles: the bf16dot matrices of Linear and MoE experts
// become kBF16DotT16 (util/tiles.h's layout of the same bf16 rows); the gate
// and the tied embedding's other reader keep theirs.
TEST(PackWeights, TilesPackBf16DotMatrices) {
  ir::Graph g = small_graph();
  ASSERT_TRUE(WeightPrecision("bf16").run(g).ok());
  const ir::Value before = input_of(g, "proj", 1);
  ASSERT_EQ(before.dtype, DType::kBF16Dot);
  const std::vector<uint16_t> rows(static_cast<const uint16_t*>(before.data),
                                   static_cast<const uint16_t*>(before.data) + 20 * 20);
  const DType embed_before = input_of(g, "embed", 0).dtype;
  PackWeights pass("tiles");
  auto changed = pass.run(g);
  ASSERT_TRUE(changed.ok()) << changed.status().message();
  EXPECT_TRUE(*changed);
  ASSERT_TRUE(g.verify().ok()) << g.verify().message();
  EXPECT_EQ(input_of(g, "proj", 1).dtype, DType::kBF16DotT16);
  EXPECT_EQ(input_of(g, "output", 1).dtype, DType::kBF16DotT16);
  for (size_t i = 2; i < 6; ++i) EXPECT_EQ(input_of(g, "moe", i).dtype, DType::kBF16DotT16) << i;
  EXPECT_EQ(input_of(g, "moe", 1).dtype, DType::kF32);
  EXPECT_EQ(input_of(g, "embed", 0).dtype, embed_before);
  // [20, 20]: two blocks of 16 rows, one step of 32 columns, zero-padded.
  const ir::Value& v = input_of(g, "proj", 1);
  ASSERT_EQ(v.bytes(), 32u * 32u * 2u);
  const auto* t = static_cast<const uint16_t*>(v.data);
  std::vector<uint16_t> back(20 * 20);
  unpack_tile_rows(t, 0, 20, 20, back.data());
  EXPECT_EQ(back, rows);
  EXPECT_EQ(t[tile_index(17, 3, 20)], rows[17 * 20 + 3]);
  EXPECT_EQ(t[tile_index(5, 25, 20)], 0u) << "padding column";
  EXPECT_EQ(t[16 * 32 + 4 * 32 + 0], 0u) << "padding row";
}

// Tiles lay out bf16dot matrices only: f32 ones (like int8 ones) keep their
// rows, and the MoE's note says why.
TEST(PackWeights, MustNotTileOtherMatrices) {
  ir::Graph g = small_graph();
  PackWeights pass("tiles");
  auto changed = pass.run(g);
  ASSERT_TRUE(changed.ok());
  EXPECT_FALSE(*changed);
  EXPECT_EQ(input_of(g, "proj", 1).dtype, DType::kF32);
  for (size_t i = 2; i < 6; ++i) EXPECT_EQ(input_of(g, "moe", i).dtype, DType::kF32) << i;
  ASSERT_EQ(pass.stats().notes.size(), 1u);
  EXPECT_NE(pass.stats().notes[0].find("bf16dot"), std::string::npos);
}

TEST(PackWeights, MustNotPackGate) {
  ir::Graph g = small_graph();
  ASSERT_TRUE(PackWeights().run(g).ok());
  EXPECT_EQ(input_of(g, "moe", 1).dtype, DType::kF32);
}

TEST(PackWeights, MustNotPackTiedWeightForItsOtherReader) {
  // "table" is the embedding table and the output projection: the output
  // reads a packed copy, the embedding keeps reading rows.
  ir::Graph g = small_graph();
  ASSERT_TRUE(PackWeights().run(g).ok());
  EXPECT_EQ(input_of(g, "embed", 0).dtype, DType::kF32);
  EXPECT_EQ(input_of(g, "embed", 0).data, weights().data());
  EXPECT_EQ(input_of(g, "output", 1).dtype, DType::kF32P16);
}

// A MoE "moe" over x (d wide) with two f32 experts of width f and a gate,
// marked as an output.
void add_moe(ir::Graph& g, int x, int64_t d, int64_t f) {
  const float* w = weights().data();
  std::vector<int> moe_in{x, g.add_weight("gate", DType::kF32, {2, d}, w)};
  for (int e = 0; e < 2; ++e) {
    moe_in.push_back(g.add_weight("e" + std::to_string(e) + ".up", DType::kF32, {f, d}, w + 100 * e));
    moe_in.push_back(g.add_weight("e" + std::to_string(e) + ".down", DType::kF32, {d, f}, w + 100 * e + 50));
  }
  g.mark_output(node(g, OpKind::kMoe, "moe", moe_in, {{"n_experts", int64_t{2}}, {"top_k", int64_t{1}}}));
}

// x [2, K] -> Linear "q8" (w [40, K]: two panels, the second padded) and a
// MoE "moe" (add_moe, experts of width f), with precision's weights.
ir::Graph linear_and_moe(int64_t K, int64_t f, const std::string& precision) {
  ir::Graph g;
  const int x = g.add_input("x", DType::kF32, {2, K}, RowDim::kTokens);
  g.mark_output(node(g, OpKind::kLinear, "q8", {x, g.add_weight("w", DType::kF32, {40, K}, weights().data())}));
  add_moe(g, x, K, f);
  EXPECT_TRUE(WeightPrecision(precision).run(g).ok());
  return g;
}

// A copy of a weight's bytes (the pass replaces the value they belong to).
std::vector<uint8_t> bytes_of(const ir::Value& v) {
  const auto* p = static_cast<const uint8_t*>(v.data);
  return std::vector<uint8_t>(p, p + v.bytes());
}

TEST(PackWeights, MustNotPackActivations) {
  ir::Graph g;
  const int x = g.add_input("x", DType::kF32, {2, 32}, RowDim::kTokens);
  const int a = g.add_input("w_act", DType::kF32, {32, 32}, RowDim::kFixed);  // weight fed at run time
  g.mark_output(node(g, OpKind::kLinear, "act", {x, a}));
  auto changed = PackWeights().run(g);
  ASSERT_TRUE(changed.ok());
  EXPECT_FALSE(*changed);
  EXPECT_EQ(input_of(g, "act", 1).dtype, DType::kF32);
}

// int8 matrices (`--precision int8`) become int8 panels (util/q8_panel.h):
// the same values and scales as the rows, in panels of 16 rows.
TEST(PackWeights, PacksInt8MatricesIntoInt8Panels) {
  ir::Graph g = linear_and_moe(32, 64, "int8");
  ASSERT_EQ(input_of(g, "q8", 1).dtype, DType::kQ8);
  const std::vector<uint8_t> row_bytes = bytes_of(input_of(g, "q8", 1));
  auto changed = PackWeights().run(g);
  ASSERT_TRUE(changed.ok()) << changed.status().message();
  EXPECT_TRUE(*changed);
  ASSERT_TRUE(g.verify().ok()) << g.verify().message();
  const ir::Value& v = input_of(g, "q8", 1);
  EXPECT_EQ(v.dtype, DType::kQ8P16);
  EXPECT_EQ(v.shape, (std::vector<int64_t>{40, 32}));
  std::vector<uint8_t> want(static_cast<size_t>(panel_count(40) * q8_panel_bytes(32)));
  pack_q8_panels(row_bytes.data(), 40, 32, want.data());
  ASSERT_EQ(v.bytes(), want.size());
  EXPECT_EQ(std::memcmp(v.data, want.data(), want.size()), 0);
  for (size_t i = 2; i < 6; ++i) EXPECT_EQ(input_of(g, "moe", i).dtype, DType::kQ8P16) << i;
  EXPECT_EQ(input_of(g, "moe", 1).dtype, DType::kF32) << "the gate stays f32 rows";
}

// int8-channel matrices (one scale a row) become channel-scale panels: the
// same values, each row's scale once as f32 (util/q8_panel.h).
TEST(PackWeights, PacksInt8ChannelMatricesIntoChannelScalePanels) {
  ir::Graph g = linear_and_moe(64, 32, "int8-channel");
  ASSERT_EQ(input_of(g, "q8", 1).dtype, DType::kQ8);
  const std::vector<uint8_t> row_bytes = bytes_of(input_of(g, "q8", 1));
  ASSERT_TRUE(q8_rows_share_scale(row_bytes.data(), 40, 64));
  PackWeights pass("panels", true);
  auto changed = pass.run(g);
  ASSERT_TRUE(changed.ok()) << changed.status().message();
  EXPECT_TRUE(*changed);
  ASSERT_TRUE(g.verify().ok()) << g.verify().message();
  EXPECT_TRUE(pass.stats().notes.empty());
  const ir::Value& v = input_of(g, "q8", 1);
  EXPECT_EQ(v.dtype, DType::kQ8CP16);
  std::vector<uint8_t> want(static_cast<size_t>(panel_count(40) * q8c_panel_bytes(64)));
  pack_q8c_panels(row_bytes.data(), 40, 64, want.data());
  ASSERT_EQ(v.bytes(), want.size());
  EXPECT_EQ(std::memcmp(v.data, want.data(), want.size()), 0);
  for (size_t i = 2; i < 6; ++i) EXPECT_EQ(input_of(g, "moe", i).dtype, DType::kQ8CP16) << i;
  // Without the channel flag (`--precision int8`'s packing) the same rows
  // keep a scale per block.
  ir::Graph h = linear_and_moe(64, 32, "int8-channel");
  ASSERT_TRUE(PackWeights("panels", false).run(h).ok());
  EXPECT_EQ(input_of(h, "q8", 1).dtype, DType::kQ8P16);
}

// Guard: rows with a scale per block (`--precision int8`'s quantization)
// never become channel-scale panels, even when asked: they pack with block
// scales and the pass notes why; one such expert keeps its whole MoE on
// block scales (one dtype per MoE).
TEST(PackWeights, MustNotPackBlockScaledRowsIntoChannelPanels) {
  ir::Graph g = linear_and_moe(64, 32, "int8");
  PackWeights pass("panels", true);
  ASSERT_TRUE(pass.run(g).ok());
  EXPECT_EQ(input_of(g, "q8", 1).dtype, DType::kQ8P16);
  for (size_t i = 2; i < 6; ++i) EXPECT_EQ(input_of(g, "moe", i).dtype, DType::kQ8P16) << i;
  EXPECT_EQ(pass.stats().notes.size(), 2u);

  ir::Graph m = linear_and_moe(64, 32, "int8-channel");
  // Give expert 0's first row a second scale: that expert no longer takes
  // channel panels, so none of the MoE's matrices do.
  int e0_id = -1;
  for (const ir::Node& n : m.nodes())
    if (n.name == "moe") e0_id = n.inputs[2];
  ASSERT_GE(e0_id, 0);
  ir::Value& e0 = m.values()[static_cast<size_t>(e0_id)];
  auto bytes = std::make_shared<std::vector<uint8_t>>(bytes_of(e0));
  (*bytes)[64 + 2] ^= 1;  // block 1's scale of row 0
  e0.data = bytes->data();
  m.keep_alive.push_back(bytes);
  PackWeights moe_pass("panels", true);
  ASSERT_TRUE(moe_pass.run(m).ok());
  for (size_t i = 2; i < 6; ++i) EXPECT_EQ(input_of(m, "moe", i).dtype, DType::kQ8P16) << i;
  EXPECT_EQ(moe_pass.stats().notes.size(), 1u);
}

// `--precision bf16-mixed` asks to keep bf16dot matrices in rows (its
// experts run the row kernel's bf16 dot products): its Linears (kBF16)
// become panels, its experts stay rows, and the pass notes the MoE.
TEST(PackWeights, MustNotPackBf16DotMatricesWhenAskedToKeepThemRows) {
  ir::Graph g = small_graph();
  ASSERT_TRUE(WeightPrecision("bf16-mixed").run(g).ok());
  PackWeights pass("panels", false, false);
  auto changed = pass.run(g);
  ASSERT_TRUE(changed.ok()) << changed.status().message();
  EXPECT_TRUE(*changed);
  ASSERT_TRUE(g.verify().ok()) << g.verify().message();
  EXPECT_EQ(input_of(g, "proj", 1).dtype, DType::kBF16P16);
  for (size_t i = 2; i < 6; ++i) EXPECT_EQ(input_of(g, "moe", i).dtype, DType::kBF16Dot) << i;
  ASSERT_EQ(pass.stats().notes.size(), 1u);
  EXPECT_NE(pass.stats().notes[0].find("bf16dot stays rows"), std::string::npos) << pass.stats().notes[0];
}

TEST(PackWeights, MustNotPackAMoeWhoseExpertsTheKernelsDoNotTake) {
  // Experts already in the tile layout (`--weight-layout tiles`) are not
  // rows the panels take: they stay tiles, and the pass notes why.
  ir::Graph g;
  add_moe(g, g.add_input("x", DType::kF32, {2, 32}, RowDim::kTokens), 32, 32);
  ASSERT_TRUE(WeightPrecision("bf16").run(g).ok());
  ASSERT_TRUE(PackWeights("tiles").run(g).ok());
  for (size_t i = 2; i < 6; ++i) ASSERT_EQ(input_of(g, "moe", i).dtype, DType::kBF16DotT16) << i;
  PackWeights pass;
  auto changed = pass.run(g);
  ASSERT_TRUE(changed.ok()) << changed.status().message();
  EXPECT_FALSE(*changed);
  for (size_t i = 2; i < 6; ++i) EXPECT_EQ(input_of(g, "moe", i).dtype, DType::kBF16DotT16) << i;
  EXPECT_EQ(input_of(g, "moe", 1).dtype, DType::kF32);
  ASSERT_EQ(pass.stats().notes.size(), 1u);
  EXPECT_NE(pass.stats().notes[0].find("moe"), std::string::npos);
}

// End to end on k3-tiny: the packed model against the row-layout one. The
// panel kernels sum in another order, so logits move by float rounding only;
// the fast ops match the reference ops on the packed weights; and greedy
// decoding picks the same tokens.
std::unique_ptr<runtime::Engine> engine(const std::string& precision, bool pack, bool reference) {
  return test::tiny_engine(precision, pack ? "panels" : "rows", reference);
}

void expect_packed_equals_rows(const std::string& precision) {
  const std::vector<int32_t> prompt{5, 17, 42, 99, 3, 1};
  auto rows = engine(precision, false, false);
  auto packed = engine(precision, true, false);
  auto ref = engine(precision, true, true);
  const auto a = step_logits(*rows, 0, prompt), b = step_logits(*packed, 0, prompt), r = step_logits(*ref, 0, prompt);
  ASSERT_EQ(a.size(), b.size());
  ASSERT_EQ(b.size(), r.size());
  float max_abs = 0, err_rows = 0, err_ref = 0;
  size_t argmax_a = 0, argmax_b = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    max_abs = std::max(max_abs, std::fabs(a[i]));
    err_rows = std::max(err_rows, std::fabs(a[i] - b[i]));
    err_ref = std::max(err_ref, std::fabs(r[i] - b[i]));
    if (a[i] > a[argmax_a]) argmax_a = i;
    if (b[i] > b[argmax_b]) argmax_b = i;
  }
  EXPECT_LE(err_rows, 1e-4f * std::max(1.0f, max_abs)) << precision;
  EXPECT_LE(err_ref, 1e-4f * std::max(1.0f, max_abs)) << precision;
  EXPECT_EQ(argmax_a, argmax_b) << precision;
}

// The determinism contract holds in the panel layout too: a prompt prefilled
// in chunks of 16 gives the same logits, bit for bit, as one token per step.
TEST(PackWeights, PackedModelChunkedPrefillEqualsTokenByToken) {
  auto chunked = engine("bf16", true, false);
  auto single = engine("bf16", true, false);
  std::vector<int32_t> prompt;
  for (int i = 0; i < 40; ++i) prompt.push_back((i * 37 + 11) % 512);
  std::vector<float> a, b;
  for (size_t b0 = 0; b0 < prompt.size(); b0 += 16) {
    const size_t b1 = std::min(prompt.size(), b0 + 16);
    a = step_logits(
        *chunked, static_cast<int32_t>(b0),
        std::vector<int32_t>(prompt.begin() + static_cast<long>(b0), prompt.begin() + static_cast<long>(b1)));
  }
  for (size_t i = 0; i < prompt.size(); ++i) b = step_logits(*single, static_cast<int32_t>(i), {prompt[i]});
  ASSERT_FALSE(a.empty());
  EXPECT_EQ(a, b);
}

// Every table computes a tile-layout product exactly as it computes the rows
// (kernels.h, bf16dot_tiles_prepared), so a tiled bf16 model's logits equal
// the row model's bit for bit, in one prefill and token by token; the
// reference ops on the tiles agree within rounding.
TEST(PackWeights, TiledBf16ModelIsTheRowModelBitForBit) {
  const std::vector<int32_t> prompt{5, 17, 42, 99, 3, 1};
  auto rows = test::tiny_engine("bf16", "rows", false);
  auto tiles = test::tiny_engine("bf16", "tiles", false);
  auto ref = test::tiny_engine("bf16", "tiles", true);
  const auto a = step_logits(*rows, 0, prompt), b = step_logits(*tiles, 0, prompt), r = step_logits(*ref, 0, prompt);
  ASSERT_FALSE(a.empty());
  EXPECT_EQ(a, b);
  float max_abs = 0, err_ref = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    max_abs = std::max(max_abs, std::fabs(a[i]));
    err_ref = std::max(err_ref, std::fabs(r[i] - b[i]));
  }
  EXPECT_LE(err_ref, 1e-4f * std::max(1.0f, max_abs));
  for (size_t i = 0; i < prompt.size(); ++i) {
    const auto x = step_logits(*rows, static_cast<int32_t>(i), {prompt[i]});
    const auto y = step_logits(*tiles, static_cast<int32_t>(i), {prompt[i]});
    ASSERT_EQ(x, y) << "token " << i;
  }
}

TEST(PackWeights, PackedFp32ModelMatchesRowsAndReferenceOps) {
  expect_packed_equals_rows("fp32");
}

TEST(PackWeights, PackedBf16ModelMatchesRowsAndReferenceOps) {
  expect_packed_equals_rows("bf16");
}

TEST(PackWeights, PackedInt8ModelMatchesRowsAndReferenceOps) {
  expect_packed_equals_rows("int8");
}

TEST(PackWeights, PackedInt8ChannelModelMatchesRowsAndReferenceOps) {
  expect_packed_equals_rows("int8-channel");
}

}  // namespace
}  // namespace k3::passes
