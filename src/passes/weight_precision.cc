// weight-precision: stores matrix weights in the precision the user asked
// for (`k3 compile --precision`), once, at compile time; the .k3m holds the
// converted bytes and loading does no conversion.
//
//   Linear(x, W: f32 [N,K])              ->  Linear(x, W: bf16dot|bf16|q8 [N,K])
//   Moe(x, gate: f32, experts: f32 ...)  ->  Moe(x, gate: f32, experts: bf16dot|bf16|q8 ...)
//
// bf16: f32 -> bf16 rounds to nearest even, into kBF16Dot matrices: the
// kernels round the activations to bf16 as well and multiply bf16 by bf16
// exactly, accumulating in f32 (kernels.h, gemm_nt_bf16dot), which AVX-512
// BF16 does 32 products per instruction (llama.cpp's bf16 path does the
// same). Matrices with rows longer than the kernels take (K >
// kBF16DotMaxCols) become kBF16 instead, f32 activations against widened
// weights, as does a whole MoE if one of its expert matrices is that long.
// docs/precision.md has the quality cost of both roundings.
// bf16-f32: the same bf16 weights, every matrix kBF16: the kernels widen them
// and multiply f32 activations with FMAs. No activation rounding, and on
// CPUs whose vdpbf16ps runs at half the FMA rate (Intel Xeon with AVX-512
// BF16) prefill runs faster, the more so in the panel layout
// (docs/performance.md). In that layout `bf16` itself runs on the FMA units
// too (bf16dot panels, pack_weights.cc), with its activations rounded.
// bf16-mixed: the same bf16 weights, each product on the instruction that
// suits its shape on such CPUs: Linear matrices kBF16 (f32 activations,
// FMA), expert matrices kBF16Dot (rounded activations, bf16 dot products).
// A batch's Linears multiply every row against one matrix and are bound by
// vdpbf16ps at batch 8, where each expert sees 0-5 rows and streams at the
// memory rate; with `--weight-layout panels` only the Linears go to panels
// (docs/performance.md).
// int8: symmetric absmax quantization per block of 32 weights of a row with
// an f16 scale (util/quant.h; llama.cpp's Q8_0 bytes), the rows
// interleaved across 16-block groups for VNNI. The kernels round activations
// to int8 per block (kernels.h, gemm_nt_q8) for exact integer dot products:
// W8A8, llama.cpp's Q8_0 x Q8_0 (docs/precision.md has its quality cost).
// int8-channel: the same format with one scale per output channel (row):
// the row's absmax / 127 rounded up to an f16, written into every block's
// scale slot (util/quant.h, quantize_q8_row_channel), so the row kernels run
// it unchanged and `--weight-layout panels` stores it once per row
// (kQ8CP16, util/q8_panel.h), whose kernel skips the per-block weight scale
// product. Coarser steps for rows whose blocks differ in range
// (docs/precision.md has the cost).
//
// Guards (each has a must-not-convert test in tests/passes/test_weight_precision.cc):
//   - only weight values (constants) are converted, never activations;
//   - only f32 weights (a weight already in another dtype is left alone: a
//     bf16 checkpoint keeps its kBF16 matrices and f32 activations);
//   - int8 only for matrices whose rows are whole blocks (K % 32 == 0) of
//     at most kernels::kQ8MaxK, and whose finite weights are all within
//     kQ8MaxAbs (127 x the largest f16: a block scale must fit the f16);
//     others stay f32 (counted in stats as matched but not applied), and a
//     MoE stays f32 unless all its expert matrices qualify (one dtype per MoE);
//   - the MoE gate stays f32: it decides which experts run by comparing
//     logits, and rounding could flip a choice (a discrete change in the
//     output) for 16 KiB per layer of savings;
//   - the embedding table stays f32: a step reads one row per token;
//   - a weight also read by a node this pass does not convert (e.g. a table
//     tied between embedding and output) is converted into a new value for
//     the converted readers only, so the other reader still sees f32.
// "fp32" is a no-op; other precisions are refused.
#include "passes/weight_precision.h"

#include <cmath>

#include <memory>
#include <vector>

#include "kernels/kernels.h"
#include "passes/graph_edit.h"
#include "util/half.h"
#include "util/quant.h"

namespace k3::passes {
namespace {

// An f32 weight matrix the int8 format takes: rows of whole 32-blocks, K <=
// kQ8MaxK, and every weight within kQ8MaxAbs (its block's scale must fit an
// f16) or non-finite (NaN and inf poison their block, as in f32:
// util/quant.h). Anything else (another dtype, an activation) is not.
bool q8_ok(const ir::Value& v) {
  if (v.kind != ir::ValueKind::kWeight || v.dtype != ir::DType::kF32 || v.data == nullptr) return false;
  if (v.shape.size() != 2 || v.shape[1] % ir::kQ8Block != 0 || v.shape[1] > kernels::kQ8MaxK) return false;
  const auto* w = static_cast<const float*>(v.data);
  for (int64_t i = 0; i < v.numel(); ++i)
    if (std::isfinite(w[i]) && std::fabs(w[i]) > kQ8MaxAbs) return false;
  return true;
}

}  // namespace

Status check_weight_precision(std::string_view precision) {
  if (precision == "fp32" || precision == "bf16" || precision == "bf16-f32" || precision == "bf16-mixed" ||
      precision == "int8" || precision == "int8-channel")
    return Status();
  return unimplemented("precision '" + std::string(precision) +
                       "' is not supported (fp32, bf16, bf16-f32, bf16-mixed, int8, int8-channel)");
}

StatusOr<bool> WeightPrecision::run(ir::Graph& g) {
  K3_RETURN_IF_ERROR(check_weight_precision(precision_));
  if (precision_ == "fp32") return false;
  const bool channel = precision_ == "int8-channel";
  const bool int8 = precision_ == "int8" || channel, widened = precision_ == "bf16-f32",
             mixed = precision_ == "bf16-mixed";
  // f32 value id -> converted value id, one table per bf16 target: a weight
  // read by a Linear (kBF16Dot) and by a MoE that has to stay kBF16 gets one
  // copy for each, so the MoE's matrices keep one dtype (its shape rule).
  std::vector<int> converted[2] = {std::vector<int>(g.values().size(), -1), std::vector<int>(g.values().size(), -1)};
  // q8_ok per value, computed once: it reads every weight, and an expert
  // matrix is asked about by its MoE's check and again when converted.
  std::vector<int8_t> q8_verdict(g.values().size(), -1);
  auto q8_ok_once = [&](int id) {
    int8_t& v = q8_verdict[static_cast<size_t>(id)];
    if (v < 0) v = q8_ok(g.value(id)) ? 1 : 0;
    return v == 1;
  };
  // bf16 target of a matrix: kBF16Dot when the dot-product kernels take its
  // rows (and bf16-f32 did not ask for widened weights).
  auto dot_ok = [&](int id) {
    return !widened && g.value(id).shape.size() == 2 && g.value(id).shape[1] <= ir::kBF16DotMaxCols;
  };
  auto convert = [&](int id, bool dot) -> int {
    const ir::Value& v = g.value(id);
    if (v.kind != ir::ValueKind::kWeight || v.dtype != ir::DType::kF32) return id;
    if (int8 && !q8_ok_once(id)) return id;
    std::vector<int>& cache = converted[!int8 && dot ? 1 : 0];
    if (cache[static_cast<size_t>(id)] >= 0) return cache[static_cast<size_t>(id)];
    const auto n = static_cast<size_t>(v.numel());
    const auto* src = static_cast<const float*>(v.data);
    int nid;
    if (int8) {
      const int64_t rows = v.shape[0], cols = v.shape[1];
      const auto row_bytes = ir::q8_row_bytes(static_cast<uint64_t>(cols));
      auto data = std::make_shared<std::vector<uint8_t>>(static_cast<size_t>(rows) * row_bytes);
      for (int64_t r = 0; r < rows; ++r) {
        uint8_t* dst = data->data() + static_cast<size_t>(r) * row_bytes;
        if (channel)
          quantize_q8_row_channel(src + r * cols, cols, dst);
        else
          quantize_q8_row(src + r * cols, cols, dst);
      }
      nid = g.add_weight(v.name, ir::DType::kQ8, v.shape, data->data());
      g.keep_alive.push_back(data);
    } else {
      auto data = std::make_shared<std::vector<uint16_t>>(n);
      for (size_t i = 0; i < n; ++i) (*data)[i] = f32_to_bf16(src[i]);
      nid = g.add_weight(v.name, dot ? ir::DType::kBF16Dot : ir::DType::kBF16, v.shape, data->data());
      g.keep_alive.push_back(data);
    }
    for (std::vector<int>& c : converted) c.resize(g.values().size(), -1);
    q8_verdict.resize(g.values().size(), -1);
    cache[static_cast<size_t>(id)] = nid;
    ++stats_.applied;
    return nid;
  };
  for (ir::Node& n : g.mutable_nodes()) {
    if (n.op == ir::OpKind::kLinear) {
      ++stats_.matched;
      n.inputs[1] = convert(n.inputs[1], !mixed && dot_ok(n.inputs[1]));
    } else if (n.op == ir::OpKind::kMoe) {
      ++stats_.matched;
      // One precision per MoE (its shape rule wants the experts' matrices in
      // one dtype): int8 only when every expert matrix is whole blocks.
      if (int8) {
        bool all_blocks = true;
        for (size_t i = 2; i < ir::moe_weights_end(n); ++i) all_blocks = all_blocks && q8_ok_once(n.inputs[i]);
        if (!all_blocks) continue;
      }
      bool dot = true;  // one dtype per MoE: kBF16Dot only if every matrix takes it
      for (size_t i = 2; i < ir::moe_weights_end(n); ++i) dot = dot && dot_ok(n.inputs[i]);
      for (size_t i = 2; i < ir::moe_weights_end(n); ++i) n.inputs[i] = convert(n.inputs[i], dot);
    }
  }
  if (stats_.applied == 0) return false;
  // Drop the f32 originals no node reads any more.
  g = compact(g, std::vector<bool>(g.nodes().size(), true));
  return true;
}

}  // namespace k3::passes
