// Shape and dtype rules, one function per op of ir/op_table.h.
//
// Each rule validates its inputs (count, dtype, rank, matching dims, attrs)
// and returns a message naming the mismatch, so a malformed graph is rejected
// when it is built rather than misbehaving when it runs.
#include <string>

#include "ir/graph.h"
#include "ir/onnx_shape.h"

namespace k3::ir {
namespace {

using Outs = std::vector<OutType>;

Status expect_inputs(const Node& n, size_t count) {
  if (n.inputs.size() != count)
    return invalid_argument("expects " + std::to_string(count) + " inputs, got " + std::to_string(n.inputs.size()));
  return Status();
}

// Attr "residual" (Linear, Moe): 0 or 1; with 1 the last input is a value of
// the output's type, added to it. `outs`: the op's output types so far.
Status check_residual(const Graph& g, const Node& n, const std::vector<OutType>& outs) {
  const int64_t r = n.attr_int("residual", 0);
  if (r != 0 && r != 1) return invalid_argument("attribute residual must be 0 or 1");
  if (r == 0) return Status();
  if (outs.size() != 1) return invalid_argument("attribute residual needs one output (no splits)");
  const Value& v = g.value(n.inputs.back());
  if (v.dtype != DType::kF32 || v.shape != outs[0].shape || v.row_dim != outs[0].row_dim)
    return invalid_argument("residual " + v.name + " must be f32 " + shape_to_string(outs[0].shape) + ", is " +
                            std::string(dtype_name(v.dtype)) + " " + shape_to_string(v.shape));
  return Status();
}

Status expect(const Value& v, DType dtype, size_t rank, const char* what) {
  if (v.dtype != dtype)
    return invalid_argument(std::string(what) + " " + v.name + " must be " + std::string(dtype_name(dtype)) + ", is " +
                            std::string(dtype_name(v.dtype)));
  if (v.shape.size() != rank)
    return invalid_argument(std::string(what) + " " + v.name + " must have rank " + std::to_string(rank) + ", has shape " +
                            shape_to_string(v.shape));
  return Status();
}

// Matrix weights of Linear and of MoE experts: f32 or bf16, or bf16dot / q8
// after the compiler's weight-precision pass (the kernels widen or dequantize on load),
// or f32 / bf16 / bf16dot / q8 panels and bf16dot tiles after pack-weights.
Status expect_matrix_weight(const Value& v, const char* what) {
  if (v.dtype != DType::kF32 && v.dtype != DType::kBF16 && v.dtype != DType::kQ8 && v.dtype != DType::kF32P16 &&
      v.dtype != DType::kBF16P16 && v.dtype != DType::kBF16Dot && v.dtype != DType::kBF16DotT16 &&
      v.dtype != DType::kQ8P16 && v.dtype != DType::kQ8CP16 && v.dtype != DType::kBF16DotP16)
    return invalid_argument(std::string(what) + " " + v.name +
                            " must be f32, bf16, bf16dot, bf16dot_t16, bf16dot_p16, q8, q8p16, q8cp16, f32p16 or "
                            "bf16p16, is " +
                            std::string(dtype_name(v.dtype)));
  if (v.shape.size() != 2)
    return invalid_argument(std::string(what) + " " + v.name + " must have rank 2, has shape " + shape_to_string(v.shape));
  if (dtype_is_q8(v.dtype) && v.shape[1] > kQ8MaxCols)
    return invalid_argument(std::string(what) + " " + v.name + " is " + std::string(dtype_name(v.dtype)) +
                            " with rows of " + std::to_string(v.shape[1]) + " weights; the int8 kernels take at most " +
                            std::to_string(kQ8MaxCols));
  if ((v.dtype == DType::kBF16Dot || v.dtype == DType::kBF16DotT16 || v.dtype == DType::kBF16DotP16) &&
      v.shape[1] > kBF16DotMaxCols)
    return invalid_argument(std::string(what) + " " + v.name + " is " + std::string(dtype_name(v.dtype)) +
                            " with rows of " + std::to_string(v.shape[1]) +
                            " weights; the bf16 dot-product kernels take at most " + std::to_string(kBF16DotMaxCols));
  return Status();
}

Status expect_dim(const Value& v, size_t axis, int64_t want, const char* what) {
  if (v.shape[axis] != want)
    return invalid_argument(std::string(what) + " " + v.name + " has shape " + shape_to_string(v.shape) + ", expected dim " +
                            std::to_string(axis) + " = " + std::to_string(want));
  return Status();
}

Status positive_attr(const Node& n, const char* key, int64_t& out) {
  out = n.attr_int(key, 0);
  if (out <= 0) return invalid_argument(std::string("attribute ") + key + " must be positive");
  return Status();
}

Status infer_Embedding(const Graph& g, const Node& n, Outs& out) {
  K3_RETURN_IF_ERROR(expect_inputs(n, 2));
  const Value& table = g.value(n.inputs[0]);
  const Value& ids = g.value(n.inputs[1]);
  K3_RETURN_IF_ERROR(expect(table, DType::kF32, 2, "table"));
  K3_RETURN_IF_ERROR(expect(ids, DType::kI32, 1, "ids"));
  out.push_back({DType::kF32, {ids.shape[0], table.shape[1]}, ids.row_dim});
  return Status();
}

// An optional clamp bound (attr clip): absent or 0 means none.
Status clip_attr(const Node& n) {
  if (!(n.attr_float("clip", 0.0) >= 0.0)) return invalid_argument("attribute clip must be non-negative");
  return Status();
}

Status norm_common(const Graph& g, const Node& n, size_t n_params, Outs& out) {
  K3_RETURN_IF_ERROR(expect_inputs(n, 1 + n_params));
  const Value& x = g.value(n.inputs[0]);
  K3_RETURN_IF_ERROR(expect(x, DType::kF32, 2, "input"));
  // RmsNorm may normalize groups of a row on their own (per-head q/k norms).
  const int64_t group = n.op == OpKind::kRmsNorm ? n.attr_int("group", x.shape[1]) : x.shape[1];
  if (group <= 0 || x.shape[1] % group != 0) return invalid_argument("attribute group must divide the row width");
  for (size_t i = 1; i <= n_params; ++i) {
    const Value& p = g.value(n.inputs[i]);
    K3_RETURN_IF_ERROR(expect(p, DType::kF32, 1, "parameter"));
    K3_RETURN_IF_ERROR(expect_dim(p, 0, group, "parameter"));
  }
  if (!(n.attr_float("eps", -1.0) > 0.0)) return invalid_argument("attribute eps must be positive");
  K3_RETURN_IF_ERROR(clip_attr(n));
  out.push_back({DType::kF32, x.shape, x.row_dim});
  return Status();
}

Status infer_LayerNorm(const Graph& g, const Node& n, Outs& out) { return norm_common(g, n, 2, out); }
Status infer_RmsNorm(const Graph& g, const Node& n, Outs& out) { return norm_common(g, n, 1, out); }

Status infer_Linear(const Graph& g, const Node& n, Outs& out) {
  const size_t extra = residual_input(n) >= 0 ? 1 : 0;                                // the residual, last
  if (n.inputs.size() != 3 + extra) K3_RETURN_IF_ERROR(expect_inputs(n, 2 + extra));  // the bias is optional
  const Value& x = g.value(n.inputs[0]);
  const Value& w = g.value(n.inputs[1]);
  K3_RETURN_IF_ERROR(expect(x, DType::kF32, 2, "input"));
  K3_RETURN_IF_ERROR(expect_matrix_weight(w, "weight"));
  K3_RETURN_IF_ERROR(expect_dim(w, 1, x.shape[1], "weight"));
  if (linear_has_bias(n)) {
    const Value& b = g.value(n.inputs[2]);
    K3_RETURN_IF_ERROR(expect(b, DType::kF32, 1, "bias"));
    K3_RETURN_IF_ERROR(expect_dim(b, 0, w.shape[0], "bias"));
  }
  K3_RETURN_IF_ERROR(clip_attr(n));
  const std::vector<int64_t>* splits = n.attr_ints("splits");
  if (splits == nullptr) {
    if (n.find_attr("splits") != nullptr) return invalid_argument("attribute splits must be a list of ints");
    out.push_back({DType::kF32, {x.shape[0], w.shape[0]}, x.row_dim});
    return check_residual(g, n, out);
  }
  // Each width a positive multiple of 16 (a panel's rows: every output then
  // starts on a panel, and threads' 16-row chunks never straddle two), the
  // widths adding up to the weight's rows. Checked one at a time, so the sum
  // cannot overflow.
  if (splits->empty() || splits->size() > 64) return invalid_argument("attribute splits must list 1 to 64 widths");
  int64_t left = w.shape[0];
  for (int64_t width : *splits) {
    if (width <= 0 || width % kPanelRows != 0 || width > left)
      return invalid_argument("attribute splits: width " + std::to_string(width) + " must be a positive multiple of " +
                              std::to_string(kPanelRows) + " within the weight's " + std::to_string(w.shape[0]) +
                              " rows");
    left -= width;
    out.push_back({DType::kF32, {x.shape[0], width}, x.row_dim});
  }
  if (left != 0)
    return invalid_argument("attribute splits add up to " + std::to_string(w.shape[0] - left) + ", the weight has " +
                            std::to_string(w.shape[0]) + " rows");
  return check_residual(g, n, out);
}

Status infer_Add(const Graph& g, const Node& n, Outs& out) {
  K3_RETURN_IF_ERROR(expect_inputs(n, 2));
  const Value& a = g.value(n.inputs[0]);
  const Value& b = g.value(n.inputs[1]);
  K3_RETURN_IF_ERROR(expect(a, DType::kF32, 2, "input"));
  K3_RETURN_IF_ERROR(expect(b, DType::kF32, 2, "input"));
  if (a.shape != b.shape || a.row_dim != b.row_dim)
    return invalid_argument("operand shapes differ: " + shape_to_string(a.shape) + " vs " + shape_to_string(b.shape));
  out.push_back({DType::kF32, a.shape, a.row_dim});
  return Status();
}

Status infer_Rope(const Graph& g, const Node& n, Outs& out) {
  K3_RETURN_IF_ERROR(expect_inputs(n, 4));
  const Value& x = g.value(n.inputs[0]);
  const Value& pos = g.value(n.inputs[1]);
  const Value& cos = g.value(n.inputs[2]);
  const Value& sin = g.value(n.inputs[3]);
  K3_RETURN_IF_ERROR(expect(x, DType::kF32, 2, "input"));
  K3_RETURN_IF_ERROR(expect(pos, DType::kI32, 1, "positions"));
  K3_RETURN_IF_ERROR(expect_dim(pos, 0, x.shape[0], "positions"));
  int64_t hd = 0;
  K3_RETURN_IF_ERROR(positive_attr(n, "head_dim", hd));
  if (hd % 2 != 0 || x.shape[1] % hd != 0) return invalid_argument("head_dim must be even and divide the row width");
  // Tables [max_positions, head_dim/2], precomputed once (see build_graph.cc).
  K3_RETURN_IF_ERROR(expect(cos, DType::kF32, 2, "cos table"));
  K3_RETURN_IF_ERROR(expect(sin, DType::kF32, 2, "sin table"));
  K3_RETURN_IF_ERROR(expect_dim(cos, 1, hd / 2, "cos table"));
  if (sin.shape != cos.shape) return invalid_argument("sin and cos tables differ in shape");
  out.push_back({DType::kF32, x.shape, x.row_dim});
  return Status();
}

Status infer_CachedAttention(const Graph& g, const Node& n, Outs& out) {
  K3_RETURN_IF_ERROR(expect_inputs(n, 7));
  int64_t hq = 0, hkv = 0, hd = 0;
  K3_RETURN_IF_ERROR(positive_attr(n, "n_heads", hq));
  K3_RETURN_IF_ERROR(positive_attr(n, "n_kv_heads", hkv));
  K3_RETURN_IF_ERROR(positive_attr(n, "head_dim", hd));
  if (hq % hkv != 0) return invalid_argument("n_heads must be a multiple of n_kv_heads");
  if (!(n.attr_float("scale", 1.0) > 0.0)) return invalid_argument("attribute scale must be positive");
  const Value& q = g.value(n.inputs[0]);
  const Value& k = g.value(n.inputs[1]);
  const Value& v = g.value(n.inputs[2]);
  K3_RETURN_IF_ERROR(expect(q, DType::kF32, 2, "q"));
  K3_RETURN_IF_ERROR(expect(k, DType::kF32, 2, "k"));
  K3_RETURN_IF_ERROR(expect(v, DType::kF32, 2, "v"));
  K3_RETURN_IF_ERROR(expect_dim(q, 1, hq * hd, "q"));
  K3_RETURN_IF_ERROR(expect_dim(k, 1, hkv * hd, "k"));
  K3_RETURN_IF_ERROR(expect_dim(v, 1, hkv * hd, "v"));
  K3_RETURN_IF_ERROR(expect_dim(k, 0, q.shape[0], "k"));
  K3_RETURN_IF_ERROR(expect_dim(v, 0, q.shape[0], "v"));
  for (int i = 3; i <= 4; ++i) {
    const Value& idx = g.value(n.inputs[static_cast<size_t>(i)]);
    K3_RETURN_IF_ERROR(expect(idx, DType::kI32, 1, i == 3 ? "positions" : "slots"));
    K3_RETURN_IF_ERROR(expect_dim(idx, 0, q.shape[0], "index"));
  }
  // Cache layout [slots, n_kv_heads, max_seq, head_dim]; see runtime/kv_cache.h.
  // f32, or bf16 (k3 compile --kv-dtype bf16), the same for K and V.
  const DType cache_dtype = g.value(n.inputs[5]).dtype;
  if (cache_dtype != DType::kF32 && cache_dtype != DType::kBF16)
    return invalid_argument(std::string("cache must be f32 or bf16, got ") + std::string(dtype_name(cache_dtype)));
  for (int i = 5; i <= 6; ++i) {
    const Value& c = g.value(n.inputs[static_cast<size_t>(i)]);
    K3_RETURN_IF_ERROR(expect(c, cache_dtype, 4, "cache"));
    if (c.kind != ValueKind::kState) return invalid_argument("cache " + c.name + " must be a state value");
    K3_RETURN_IF_ERROR(expect_dim(c, 1, hkv, "cache"));
    K3_RETURN_IF_ERROR(expect_dim(c, 3, hd, "cache"));
  }
  out.push_back({DType::kF32, q.shape, q.row_dim});
  return Status();
}

Status infer_Moe(const Graph& g, const Node& n, Outs& out) {
  int64_t e = 0, top_k = 0;
  K3_RETURN_IF_ERROR(positive_attr(n, "n_experts", e));
  K3_RETURN_IF_ERROR(positive_attr(n, "top_k", top_k));
  if (top_k > e) return invalid_argument("top_k exceeds n_experts");
  // Each expert has inputs of its own: a larger count is corrupt, and would
  // overflow the input arithmetic below.
  if (e > static_cast<int64_t>(n.inputs.size()))
    return invalid_argument("n_experts " + std::to_string(e) + " exceeds the node's " +
                            std::to_string(n.inputs.size()) + " inputs");
  const int64_t swiglu = n.attr_int("swiglu", 0);
  const int64_t per_expert = moe_matrices_per_expert(n);
  const bool shared = n.attr_int("shared", 0) != 0;
  if (shared && !swiglu) return invalid_argument("a shared expert needs swiglu experts");
  K3_RETURN_IF_ERROR(expect_inputs(n, moe_weights_end(n) + (residual_input(n) >= 0 ? 1 : 0)));
  const Value& x = g.value(n.inputs[0]);
  const Value& gate = g.value(n.inputs[1]);
  K3_RETURN_IF_ERROR(expect(x, DType::kF32, 2, "input"));
  K3_RETURN_IF_ERROR(expect(gate, DType::kF32, 2, "gate"));
  const int64_t d = x.shape[1];
  K3_RETURN_IF_ERROR(expect_dim(gate, 0, e, "gate"));
  K3_RETURN_IF_ERROR(expect_dim(gate, 1, d, "gate"));
  int64_t f = -1;
  const DType wtype = g.value(n.inputs[2]).dtype;  // every expert weight has the same dtype
  for (int64_t i = 0; i < e; ++i) {
    // Per expert: w_up [F,D], (w_gate [F,D]), w_down [D,F].
    for (int64_t j = 0; j < per_expert; ++j) {
      const Value& w = g.value(n.inputs[static_cast<size_t>(2 + i * per_expert + j)]);
      K3_RETURN_IF_ERROR(expect_matrix_weight(w, "expert weight"));
      if (w.dtype != wtype) return invalid_argument("expert weights mix dtypes (" + w.name + ")");
      const bool down = j == per_expert - 1;
      if (f < 0) f = w.shape[0];
      K3_RETURN_IF_ERROR(expect_dim(w, 0, down ? d : f, "expert weight"));
      K3_RETURN_IF_ERROR(expect_dim(w, 1, down ? f : d, "expert weight"));
    }
  }
  if (shared) {
    // s_up [S,D], s_gate [S,D], s_down [D,S], gate g [1,D]: S may differ from F.
    const size_t s0 = moe_shared_input(n);
    const int64_t s = g.value(n.inputs[s0]).shape.empty() ? -1 : g.value(n.inputs[s0]).shape[0];
    const int64_t rows[4] = {s, s, d, 1}, cols[4] = {d, d, s, d};
    for (size_t j = 0; j < 4; ++j) {
      const Value& w = g.value(n.inputs[s0 + j]);
      K3_RETURN_IF_ERROR(expect_matrix_weight(w, "shared expert weight"));
      K3_RETURN_IF_ERROR(expect_dim(w, 0, rows[j], "shared expert weight"));
      K3_RETURN_IF_ERROR(expect_dim(w, 1, cols[j], "shared expert weight"));
    }
  }
  out.push_back({DType::kF32, x.shape, x.row_dim});
  return check_residual(g, n, out);
}

Status infer_GatherRows(const Graph& g, const Node& n, Outs& out) {
  K3_RETURN_IF_ERROR(expect_inputs(n, 2));
  const Value& x = g.value(n.inputs[0]);
  const Value& rows = g.value(n.inputs[1]);
  K3_RETURN_IF_ERROR(expect(x, DType::kF32, 2, "input"));
  K3_RETURN_IF_ERROR(expect(rows, DType::kI32, 1, "rows"));
  out.push_back({DType::kF32, {rows.shape[0], x.shape[1]}, rows.row_dim});
  return Status();
}

}  // namespace

Status infer_types(const Graph& g, const Node& node, std::vector<OutType>& out) {
  out.clear();
  switch (node.op) {
#define K3_OP_INFER(e, name) \
  case OpKind::k##e:         \
    return infer_##e(g, node, out);
    K3_OP_LIST(K3_OP_INFER)
#undef K3_OP_INFER
    // onnx.* ops: dynamic rules (onnx_shape_rules.cc), given what the graph knows.
#define K3_ONNX_CASE(e, name) case OpKind::k##e:
    K3_ONNX_OP_LIST(K3_ONNX_CASE)
#undef K3_ONNX_CASE
    {
      const std::vector<OnnxInput> in = onnx_inputs_of(g, node);
      return infer_onnx(node, in, out);
    }
  }
  return invalid_argument("unknown op");
}

}  // namespace k3::ir
