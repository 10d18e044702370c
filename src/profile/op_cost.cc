// Per-op byte and flop accounting (rules in op_cost.h).
#include "profile/op_cost.h"

#include <algorithm>

namespace k3::profile {
namespace {

using ir::OpKind;
using ir::RowDim;
using ir::Value;

// Rows of `v` this step: the leading dimension follows the step's counts.
double rows_of(const Value& v, const StepCounts& c) {
  const int64_t full = v.shape.empty() ? 1 : v.shape[0];
  switch (v.row_dim) {
    case RowDim::kTokens: return static_cast<double>(std::min(c.tokens, full));
    case RowDim::kOutRows: return static_cast<double>(std::min(c.out_rows, full));
    case RowDim::kFixed: break;
  }
  return static_cast<double>(full);
}

// Bytes of the rows of `v` used this step.
double used_bytes(const Value& v, const StepCounts& c) {
  return v.shape.empty() ? static_cast<double>(v.bytes()) : rows_of(v, c) * static_cast<double>(v.row_bytes());
}

double cols_of(const Value& v) {
  double n = 1;
  for (size_t i = 1; i < v.shape.size(); ++i) n *= static_cast<double>(v.shape[i]);
  return n;
}

}  // namespace

int64_t estimated_moe_experts(const ir::Node& node, int64_t tokens) {
  const int64_t e = node.attr_int("n_experts"), k = node.attr_int("top_k");
  return std::min(e, std::max<int64_t>(tokens, 1) * k);
}

OpCost op_cost(const ir::Graph& g, const ir::Node& n, const StepCounts& c) {
  OpCost r;
  auto in = [&](size_t i) -> const Value& { return g.value(n.inputs[i]); };
  const Value& out = g.value(n.outputs[0]);
  const double out_rows = rows_of(out, c), out_cols = cols_of(out);
  const double out_elems = out_rows * out_cols;
  r.bytes_written = 0;
  for (int v : n.outputs) r.bytes_written += used_bytes(g.value(v), c);  // a split Linear has several
  // A fused residual (Linear, Moe): its rows read and one add per output element.
  auto add_residual = [&] {
    const int res = ir::residual_input(n);
    if (res < 0) return;
    r.bytes_read += used_bytes(in(static_cast<size_t>(res)), c);
    r.flops += out_elems;
  };

  switch (n.op) {
    case OpKind::kEmbedding: {
      // One table row per token plus the ids.
      r.bytes_read = out_rows * static_cast<double>(in(0).row_bytes()) + used_bytes(in(1), c);
      break;
    }
    case OpKind::kLayerNorm: {
      r.bytes_read = used_bytes(in(0), c) + static_cast<double>(in(1).bytes() + in(2).bytes());
      // mean (1), variance (3), normalize + affine (4) per element.
      r.flops = 8 * out_elems;
      break;
    }
    case OpKind::kRmsNorm: {
      r.bytes_read = used_bytes(in(0), c) + static_cast<double>(in(1).bytes());
      // square-accumulate (2), scale and weight (2) per element.
      r.flops = 4 * out_elems;
      break;
    }
    case OpKind::kLinear: {
      // x [M,K] . W[N,K]^T: the whole weight is streamed once per step.
      const Value& x = in(0);
      const Value& w = in(1);
      const double m = rows_of(x, c), k = cols_of(x), nn = static_cast<double>(w.shape[0]);
      r.bytes_read = used_bytes(x, c) + static_cast<double>(w.bytes());
      r.flops = 2 * m * nn * k;
      add_residual();
      break;
    }
    case OpKind::kAdd: {
      r.bytes_read = used_bytes(in(0), c) + used_bytes(in(1), c);
      r.flops = out_elems;
      break;
    }
    case OpKind::kRope: {
      // Per token: its row, its position, and one cos and one sin row.
      const Value& x = in(0);
      const double t = rows_of(x, c);
      r.bytes_read = used_bytes(x, c) + used_bytes(in(1), c) + t * static_cast<double>(in(2).row_bytes() + in(3).row_bytes());
      // 2 multiplies and 1 add per output element.
      r.flops = 3 * out_elems;
      break;
    }
    case OpKind::kCachedAttention: {
      // q [T,Hq*hd], k/v [T,Hkv*hd], positions, slots, kcache, vcache [S,Hkv,L,hd]
      const int64_t hq = n.attr_int("n_heads"), hkv = n.attr_int("n_kv_heads"), hd = n.attr_int("head_dim");
      const Value& kc = in(5);
      const double elem = static_cast<double>(ir::dtype_size(kc.dtype));
      const double kv_row = static_cast<double>(hkv * hd) * elem;  // one position, all KV heads, K or V
      const double pos = static_cast<double>(c.kv_positions);
      r.bytes_read = used_bytes(in(0), c) + used_bytes(in(1), c) + used_bytes(in(2), c) + used_bytes(in(3), c) +
                     used_bytes(in(4), c) + 2 * kv_row * pos;
      // Output rows plus this step's K and V rows appended to the cache.
      r.bytes_written += 2 * rows_of(in(1), c) * kv_row;
      // Per query head and attended position: q.k (2*hd), softmax (~4),
      // p*v accumulate (2*hd).
      r.flops = pos * static_cast<double>(hq) * static_cast<double>(4 * hd + 4);
      break;
    }
    case OpKind::kMoe: {
      // x [T,D], gate [E,D], then per expert up (gate) down matrices.
      const Value& x = in(0);
      const int64_t n_exp = n.attr_int("n_experts"), k = n.attr_int("top_k");
      const bool swiglu = n.attr_int("swiglu") != 0;
      const size_t per = static_cast<size_t>(ir::moe_matrices_per_expert(n));
      const double t = rows_of(x, c), d = cols_of(x), f = static_cast<double>(in(2).shape[0]);
      int64_t experts = c.moe_experts;
      if (experts < 0) experts = estimated_moe_experts(n, static_cast<int64_t>(t));
      experts = std::min(experts, n_exp);
      double expert_bytes = 0;  // one expert's matrices (all experts have the same shapes)
      for (size_t m = 0; m < per; ++m) expert_bytes += static_cast<double>(in(2 + m).bytes());
      r.bytes_read = used_bytes(x, c) + static_cast<double>(in(1).bytes()) + static_cast<double>(experts) * expert_bytes;
      // Expert work scales with (token, choice) entries, not with experts.
      const double entries = t * static_cast<double>(k);
      const double gate = 2 * t * static_cast<double>(n_exp) * d;
      const double mats = entries * static_cast<double>(per) * 2 * d * f;
      const double act = entries * f * (swiglu ? 5 : 8);  // silu*mul / tanh-gelu, approximate
      const double combine = 2 * entries * d;
      r.flops = gate + mats + act + combine;
      // A shared expert (and its [1, D] gate), if any, runs on every token.
      for (size_t i = ir::moe_shared_input(n); i < ir::moe_weights_end(n); ++i) {
        r.bytes_read += static_cast<double>(in(i).bytes());
        r.flops += 2 * t * static_cast<double>(in(i).numel());
      }
      add_residual();
      break;
    }
    case OpKind::kGatherRows: {
      r.bytes_read = out_rows * static_cast<double>(in(0).row_bytes()) + used_bytes(in(1), c);
      break;
    }
    default:  // onnx.* ops: only the O0 interpreter runs them; no cost model.
      break;
  }
  return r;
}

OpCost op_cost(const ir::Graph& g, const ir::Node& node, int64_t tokens, int64_t out_rows, int64_t context_len) {
  StepCounts c;
  c.tokens = tokens;
  c.out_rows = out_rows;
  c.kv_positions = tokens * context_len;
  return op_cost(g, node, c);
}

}  // namespace k3::profile
