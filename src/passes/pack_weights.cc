// pack-weights: repacks the matrices the gemm kernels stream into the panel
// layout (util/panel.h), once, at compile time; the .k3m holds the packed
// bytes and loading does no transformation.
//
//   Linear(x, W: f32|bf16 [N,K])          ->  Linear(x, W: f32p16|bf16p16 [N,K])
//   Moe(x, gate, experts: f32|bf16 ...)   ->  Moe(x, gate, experts: f32p16|bf16p16 ...)
//   Linear(x, W: bf16dot [N,K]), Moe(... bf16dot)
//                                         ->  the same with bf16dot_p16: bf16p16's bytes,
//                                              whose kernel rounds the activations to
//                                              bf16 first (`--precision bf16`'s products)
//   Linear(x, W: q8 [N,K]), Moe(... q8)   ->  the same with q8p16 (util/q8_panel.h)
//                                              or, for `--precision int8-channel`, q8cp16
//
// The panel kernels (kernels.h, gemm_nt_p16) broadcast one activation
// against 16 contiguous weights, so every output is a single FMA chain over
// k: no horizontal sums, 12 FMAs per 2 weight loads in the prefill tile, and
// bf16 widened with one instruction per 8 weights. int8 panels give each
// vpdpbusd lane one row of W, which removes the row tile's horizontal sums
// and the xor of every weight load. Results stay independent
// of batch size and thread split, as with the row layout; they differ from
// the row layout's in the last bits (another summation order).
//
// `--weight-layout tiles` instead packs the bf16dot matrices
// (`--precision bf16`) into the tile layout (util/tiles.h):
//
//   Linear(x, W: bf16dot [N,K])           ->  Linear(x, W: bf16dot_t16 [N,K])
//   Moe(x, gate, experts: bf16dot ...)    ->  Moe(x, gate, experts: bf16dot_t16 ...)
//
// where each AMX tile the amx kernel table loads is 1 KiB of contiguous
// memory, so a block of 16 rows streams front to back. Every table computes
// the same bits as on the rows (the others unpack them first); only the
// amx table gains (docs/performance.md). Its guards mirror the panels':
// only bf16dot weight matrices; a MoE only if all its experts are; a weight
// also read elsewhere is packed into a new value.
//
// Opt-in (`k3 compile --weight-layout panels`): on the development machine
// (AVX2) it makes prefill 1.1-1.4x faster and decode up to ~10% slower than
// the row kernels' far streams (docs/performance.md has the runs), so the
// row layout stays the default. int8 panels on the Zen 4 host (AVX-512
// VNNI): two-thread k3-base prefill 7-9% faster, batch-1 decode 13-15%
// slower (docs/performance.md, "int8 panels").
//
// Guards (each has a must-not-pack test in tests/passes/test_pack_weights.cc):
//   - only weight values (constants) are packed, never activations;
//   - only f32, bf16, bf16dot and int8 (q8) matrices; a bf16dot matrix
//     (`--precision bf16`) becomes bf16dot_p16, never bf16p16, so its
//     activations are still rounded to bf16 (rank 2 is the Linear and Moe
//     shape rules' own check, tested with them);
//   - bf16dot matrices stay rows when the pipeline asks (`--precision
//     bf16-mixed`, whose experts run the row kernel's bf16 dot products at
//     the memory rate, docs/precision.md);
//   - a MoE is packed only if all its expert matrices are f32, bf16, bf16dot
//     or q8 weights (its shape rule already makes them one dtype); the gate stays
//     f32 rows (the routing reads it with gemm_nt);
//   - q8cp16 (int8-channel) only for q8 matrices whose every row holds one
//     scale in all its blocks (what int8-channel quantization writes), and
//     a MoE only if all its expert matrices do; others pack to q8p16 (with
//     a note), which keeps each block's scale;
//   - a weight also read by a node this pass does not pack (e.g. a table tied
//     between embedding and output) is packed into a new value for the
//     packed readers only, so the other reader still sees rows.
#include "passes/pack_weights.h"

#include <memory>
#include <vector>

#include "passes/graph_edit.h"
#include "util/panel.h"
#include "util/q8_panel.h"
#include "util/tiles.h"

namespace k3::passes {
namespace {

bool packable(const ir::Value& v, bool tiles, bool bf16dot_panels) {
  if (v.kind != ir::ValueKind::kWeight || v.shape.size() != 2 || v.data == nullptr) return false;
  if (tiles) return v.dtype == ir::DType::kBF16Dot;
  return v.dtype == ir::DType::kF32 || v.dtype == ir::DType::kBF16 ||
         (bf16dot_panels && v.dtype == ir::DType::kBF16Dot) || v.dtype == ir::DType::kQ8;
}

// A q8 matrix whose rows each hold one scale (util/q8_panel.h).
bool q8_channel_rows(const ir::Value& v) {
  return v.dtype == ir::DType::kQ8 && q8_rows_share_scale(static_cast<const uint8_t*>(v.data), v.shape[0], v.shape[1]);
}

int add_q8_panels(ir::Graph& g, const ir::Value& v, bool channel) {
  const int64_t N = v.shape[0], K = v.shape[1];
  const int64_t pb = channel ? q8c_panel_bytes(K) : q8_panel_bytes(K);
  auto data = std::make_shared<std::vector<uint8_t>>(static_cast<size_t>(panel_count(N) * pb));
  if (channel)
    pack_q8c_panels(static_cast<const uint8_t*>(v.data), N, K, data->data());
  else
    pack_q8_panels(static_cast<const uint8_t*>(v.data), N, K, data->data());
  const int id = g.add_weight(v.name, channel ? ir::DType::kQ8CP16 : ir::DType::kQ8P16, v.shape, data->data());
  g.keep_alive.push_back(data);
  return id;
}

int add_tiles(ir::Graph& g, const ir::Value& v) {
  const int64_t N = v.shape[0], K = v.shape[1];
  auto data = std::make_shared<std::vector<uint16_t>>(
      static_cast<size_t>(tile_block_count(N) * ir::kTileRows * tile_padded_cols(K)));
  pack_tiles(static_cast<const uint16_t*>(v.data), N, K, data->data());
  const int id = g.add_weight(v.name, ir::DType::kBF16DotT16, v.shape, data->data());
  g.keep_alive.push_back(data);
  return id;
}

template <class T>
int add_packed(ir::Graph& g, const ir::Value& v, ir::DType packed) {
  const int64_t N = v.shape[0], K = v.shape[1];
  auto data = std::make_shared<std::vector<T>>(static_cast<size_t>(panel_count(N) * ir::kPanelRows * K));
  pack_panels(static_cast<const T*>(v.data), N, K, data->data());
  const int id = g.add_weight(v.name, packed, v.shape, data->data());
  g.keep_alive.push_back(data);
  return id;
}

}  // namespace

StatusOr<bool> PackWeights::run(ir::Graph& g) {
  if (layout_ == "rows") return false;
  if (layout_ != "panels" && layout_ != "tiles")
    return invalid_argument("weight layout '" + layout_ + "' is not rows, panels or tiles");
  const bool tiles = layout_ == "tiles";
  // Row value id -> packed value id, one table per int8 panel kind: a q8
  // weight read by a Linear (channel panels) and by a MoE that has to keep
  // block scales gets one copy for each, so the MoE's matrices keep one
  // dtype (its shape rule).
  std::vector<int> packed[2] = {std::vector<int>(g.values().size(), -1), std::vector<int>(g.values().size(), -1)};
  auto pack = [&](int id, bool channel) -> int {
    std::vector<int>& cache = packed[channel ? 1 : 0];
    if (cache[static_cast<size_t>(id)] >= 0) return cache[static_cast<size_t>(id)];
    // Copy: add_weight may grow the value list.
    const ir::Value v = g.value(id);
    const int nid = tiles                            ? add_tiles(g, v)
                    : v.dtype == ir::DType::kF32     ? add_packed<float>(g, v, ir::DType::kF32P16)
                    : v.dtype == ir::DType::kQ8      ? add_q8_panels(g, v, channel)
                    : v.dtype == ir::DType::kBF16Dot ? add_packed<uint16_t>(g, v, ir::DType::kBF16DotP16)
                                                     : add_packed<uint16_t>(g, v, ir::DType::kBF16P16);
    for (std::vector<int>& c : packed) c.resize(g.values().size(), -1);
    cache[static_cast<size_t>(id)] = nid;
    ++stats_.applied;
    return nid;
  };
  // Whether int8-channel q8 matrices pack to channel panels; a note when
  // they cannot (rows with several scales: another pass's or a file's q8).
  auto channel_ok = [&](const ir::Node& n, size_t begin, size_t end) {
    if (tiles || !q8_channel_) return false;
    bool q8 = false, all = true;
    for (size_t i = begin; i < end; ++i) {
      const ir::Value& v = g.value(n.inputs[i]);
      q8 = q8 || v.dtype == ir::DType::kQ8;
      all = all && q8_channel_rows(v);
    }
    if (q8 && !all)
      stats_.notes.push_back(n.name + ": int8 rows with more than one scale, packed with block scales (q8p16)");
    return q8 && all;
  };
  for (ir::Node& n : g.mutable_nodes()) {
    if (n.op == ir::OpKind::kLinear) {
      ++stats_.matched;
      if (packable(g.value(n.inputs[1]), tiles, bf16dot_panels_)) n.inputs[1] = pack(n.inputs[1], channel_ok(n, 1, 2));
    } else if (n.op == ir::OpKind::kMoe) {
      ++stats_.matched;
      const size_t end = ir::moe_weights_end(n);
      bool all = end > 2;
      for (size_t i = 2; i < end; ++i) all = all && packable(g.value(n.inputs[i]), tiles, bf16dot_panels_);
      if (!all) {
        stats_.notes.push_back("moe " + n.name + ": expert matrices are not " +
                               (tiles             ? "bf16dot"
                                : bf16dot_panels_ ? "f32, bf16, bf16dot or q8"
                                                  : "f32, bf16 or q8 (bf16dot stays rows here)") +
                               " weights, left as rows");
        continue;
      }
      const bool channel = channel_ok(n, 2, end);
      for (size_t i = 2; i < end; ++i) n.inputs[i] = pack(n.inputs[i], channel);
    }
  }
  if (stats_.applied == 0) return false;
  // Drop the row-layout originals no node reads any more.
  g = compact(g, std::vector<bool>(g.nodes().size(), true));
  return true;
}

}  // namespace k3::passes
