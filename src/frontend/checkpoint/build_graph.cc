// Emits the K3 forward pass (docs/model-format.md) as IR ops.
#include "frontend/checkpoint/build_graph.h"

#include <cmath>
#include <memory>

namespace k3 {
namespace {

using ir::Attr;
using ir::DType;
using ir::OpKind;

class Builder {
 public:
  Builder(const Checkpoint& ck, ir::Graph& g) : ck_(ck), g_(g) {}

  int weight(const std::string& name, std::vector<int64_t> shape) {
    return g_.add_weight(name, DType::kF32, std::move(shape), ck_.weight(name));
  }

  StatusOr<int> node(OpKind op, const std::string& name, std::vector<int> in, std::vector<Attr> attrs = {}) {
    K3_ASSIGN_OR_RETURN(std::vector<int> outs, g_.add_node(op, name, std::move(in), std::move(attrs)));
    return outs[0];
  }

  StatusOr<int> norm(const std::string& prefix, int x) {
    const ModelConfig& c = ck_.config();
    std::vector<Attr> attrs{{"eps", c.norm_eps}};
    if (c.norm_type == NormType::kLayerNorm)
      return node(OpKind::kLayerNorm, prefix,
                  {x, weight(prefix + ".weight", {c.d_model}), weight(prefix + ".bias", {c.d_model})}, attrs);
    return node(OpKind::kRmsNorm, prefix, {x, weight(prefix + ".weight", {c.d_model})}, attrs);
  }

 private:
  const Checkpoint& ck_;
  ir::Graph& g_;
};

}  // namespace

StatusOr<ir::Graph> build_graph(const Checkpoint& ck, const StepShape& s, const BuildOptions& options) {
  const ModelConfig& c = ck.config();
  if (s.max_tokens < 1 || s.max_out_rows < 1 || s.n_slots < 1 || s.ctx_len < 1 || s.ctx_len > c.max_seq_len)
    return invalid_argument("invalid step shape for graph construction");
  ir::Graph g;
  Builder b(ck, g);
  const int64_t t = s.max_tokens, d = c.d_model, hd = c.head_dim, half = hd / 2;
  const int tokens = g.add_input("tokens", DType::kI32, {t}, ir::RowDim::kTokens);
  const int positions = g.add_input("positions", DType::kI32, {t}, ir::RowDim::kTokens);
  const int slots = g.add_input("slots", DType::kI32, {t}, ir::RowDim::kTokens);
  const int out_rows = g.add_input("out_rows", DType::kI32, {s.max_out_rows}, ir::RowDim::kOutRows);

  // Rotary tables, folded at build time: angle in double, cos/sin rounded to
  // f32 (the reference model does the same).
  auto cos_t = std::shared_ptr<float[]>(new float[static_cast<size_t>(s.ctx_len * half)]);
  auto sin_t = std::shared_ptr<float[]>(new float[static_cast<size_t>(s.ctx_len * half)]);
  for (int64_t p = 0; p < s.ctx_len; ++p)
    for (int64_t i = 0; i < half; ++i) {
      const double inv_freq = std::pow(c.rope_theta, -2.0 * static_cast<double>(i) / static_cast<double>(hd));
      const double angle = static_cast<double>(p) * inv_freq;
      cos_t[static_cast<size_t>(p * half + i)] = static_cast<float>(std::cos(angle));
      sin_t[static_cast<size_t>(p * half + i)] = static_cast<float>(std::sin(angle));
    }
  g.keep_alive.push_back(cos_t);
  g.keep_alive.push_back(sin_t);
  const int rope_cos = g.add_weight("rope.cos", DType::kF32, {s.ctx_len, half}, cos_t.get());
  const int rope_sin = g.add_weight("rope.sin", DType::kF32, {s.ctx_len, half}, sin_t.get());

  const std::vector<Attr> rope_attrs{{"head_dim", hd}};
  K3_ASSIGN_OR_RETURN(
      int h, b.node(OpKind::kEmbedding, "embed", {b.weight("tok_embeddings.weight", {c.vocab_size, d}), tokens}));
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    K3_ASSIGN_OR_RETURN(int a, b.norm(p + "attn_norm", h));
    K3_ASSIGN_OR_RETURN(
        int q, b.node(OpKind::kLinear, p + "attn.wq", {a, b.weight(p + "attn.wq.weight", {c.n_heads * hd, d})}));
    K3_ASSIGN_OR_RETURN(
        int k, b.node(OpKind::kLinear, p + "attn.wk", {a, b.weight(p + "attn.wk.weight", {c.n_kv_heads * hd, d})}));
    K3_ASSIGN_OR_RETURN(
        int v, b.node(OpKind::kLinear, p + "attn.wv", {a, b.weight(p + "attn.wv.weight", {c.n_kv_heads * hd, d})}));
    K3_ASSIGN_OR_RETURN(int qr,
                        b.node(OpKind::kRope, p + "attn.rope_q", {q, positions, rope_cos, rope_sin}, rope_attrs));
    K3_ASSIGN_OR_RETURN(int kr,
                        b.node(OpKind::kRope, p + "attn.rope_k", {k, positions, rope_cos, rope_sin}, rope_attrs));
    const std::vector<int64_t> cache_shape{s.n_slots, c.n_kv_heads, s.ctx_len, hd};
    const int kc = g.add_state(p + "k_cache", DType::kF32, cache_shape);
    const int vc = g.add_state(p + "v_cache", DType::kF32, cache_shape);
    K3_ASSIGN_OR_RETURN(int att,
                        b.node(OpKind::kCachedAttention, p + "attn.attention", {qr, kr, v, positions, slots, kc, vc},
                               {{"n_heads", c.n_heads}, {"n_kv_heads", c.n_kv_heads}, {"head_dim", hd}, {"layer", l}}));
    K3_ASSIGN_OR_RETURN(
        int o, b.node(OpKind::kLinear, p + "attn.wo", {att, b.weight(p + "attn.wo.weight", {d, c.n_heads * hd})}));
    K3_ASSIGN_OR_RETURN(h, b.node(OpKind::kAdd, p + "attn.residual", {h, o}));
    K3_ASSIGN_OR_RETURN(int m, b.norm(p + "moe_norm", h));
    std::vector<int> moe_in{m, b.weight(p + "moe.gate.weight", {c.n_experts, d})};
    for (int64_t e = 0; e < c.n_experts; ++e) {
      const std::string pe = p + "moe.experts." + std::to_string(e) + ".";
      moe_in.push_back(b.weight(pe + "w_up.weight", {c.d_ff, d}));
      if (c.expert_type == ExpertType::kSwiglu) moe_in.push_back(b.weight(pe + "w_gate.weight", {c.d_ff, d}));
      moe_in.push_back(b.weight(pe + "w_down.weight", {d, c.d_ff}));
    }
    K3_ASSIGN_OR_RETURN(int y, b.node(OpKind::kMoe, p + "moe", moe_in,
                                      {{"n_experts", c.n_experts},
                                       {"top_k", c.top_k},
                                       {"swiglu", int64_t{c.expert_type == ExpertType::kSwiglu}},
                                       {"dense", int64_t{options.moe_dense}}}));
    K3_ASSIGN_OR_RETURN(h, b.node(OpKind::kAdd, p + "moe.residual", {h, y}));
  }
  // Only the rows whose logits are needed go through the final norm and the
  // vocabulary projection (one per sequence in prefill, not one per token).
  K3_ASSIGN_OR_RETURN(int last, b.node(OpKind::kGatherRows, "select_rows", {h, out_rows}));
  K3_ASSIGN_OR_RETURN(int n, b.norm("norm", last));
  K3_ASSIGN_OR_RETURN(int logits, b.node(OpKind::kLinear, "logits", {n, b.weight("output.weight", {c.vocab_size, d})}));
  g.mark_output(logits);
  K3_RETURN_IF_ERROR(g.verify());
  return g;
}

}  // namespace k3
