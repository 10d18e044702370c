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

  // A projection with its bias when the checkpoint has one.
  StatusOr<int> linear(const std::string& name, int x, int64_t rows, int64_t cols, bool bias,
                       std::vector<Attr> attrs = {}) {
    std::vector<int> in{x, weight(name + ".weight", {rows, cols})};
    if (bias) in.push_back(weight(name + ".bias", {rows}));
    return node(OpKind::kLinear, name, std::move(in), std::move(attrs));
  }

  // q or k after its projection: the optional RMSNorm (per head or over the
  // whole projection) and clamp, in the order the families apply them.
  StatusOr<int> project_qk(const std::string& p, const char* which, int x, int64_t heads) {
    const ModelConfig& c = ck_.config();
    const int64_t width = heads * c.head_dim;
    std::vector<Attr> clip;
    if (c.clip_qkv > 0.0) clip.push_back({"clip", c.clip_qkv});
    const bool norm = c.qk_norm != QkNorm::kNone;
    K3_ASSIGN_OR_RETURN(
        int y, linear(p + "attn.w" + which, x, width, c.d_model, c.qkv_bias, norm ? std::vector<Attr>{} : clip));
    if (!norm) return y;
    const int64_t group = c.qk_norm == QkNorm::kPerHead ? c.head_dim : width;
    std::vector<Attr> attrs{{"eps", c.norm_eps}, {"group", group}};
    attrs.insert(attrs.end(), clip.begin(), clip.end());
    const std::string n = p + "attn." + which + "_norm";
    return node(OpKind::kRmsNorm, n, {y, weight(n + ".weight", {group})}, std::move(attrs));
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
      // Scaled RoPE (hf_config.cc) brings its own frequencies and, for
      // YaRN, a factor on cos and sin.
      const double inv_freq = c.rope_inv_freq.empty()
                                  ? std::pow(c.rope_theta, -2.0 * static_cast<double>(i) / static_cast<double>(hd))
                                  : c.rope_inv_freq[static_cast<size_t>(i)];
      const double angle = static_cast<double>(p) * inv_freq, af = c.rope_attention_factor;
      cos_t[static_cast<size_t>(p * half + i)] = static_cast<float>(std::cos(angle) * af);
      sin_t[static_cast<size_t>(p * half + i)] = static_cast<float>(std::sin(angle) * af);
    }
  g.keep_alive.push_back(cos_t);
  g.keep_alive.push_back(sin_t);
  const int rope_cos = g.add_weight("rope.cos", DType::kF32, {s.ctx_len, half}, cos_t.get());
  const int rope_sin = g.add_weight("rope.sin", DType::kF32, {s.ctx_len, half}, sin_t.get());

  const std::vector<Attr> rope_attrs{{"head_dim", hd}};
  std::vector<Attr> embed_attrs, residual_attrs, attention_attrs, logits_attrs;
  if (c.embedding_scale != 1.0) embed_attrs.push_back({"scale", c.embedding_scale});
  if (c.residual_scale != 1.0) residual_attrs.push_back({"scale", c.residual_scale});
  if (c.attention_scale > 0.0) attention_attrs.push_back({"scale", c.attention_scale});
  if (c.logits_scale != 1.0) logits_attrs.push_back({"scale", c.logits_scale});
  K3_ASSIGN_OR_RETURN(int h, b.node(OpKind::kEmbedding, "embed",
                                    {b.weight("tok_embeddings.weight", {c.vocab_size, d}), tokens}, embed_attrs));
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    K3_ASSIGN_OR_RETURN(int a, b.norm(p + "attn_norm", h));
    K3_ASSIGN_OR_RETURN(int q, b.project_qk(p, "q", a, c.n_heads));
    K3_ASSIGN_OR_RETURN(int k, b.project_qk(p, "k", a, c.n_kv_heads));
    std::vector<Attr> v_attrs;
    if (c.clip_qkv > 0.0) v_attrs.push_back({"clip", c.clip_qkv});
    K3_ASSIGN_OR_RETURN(int v, b.linear(p + "attn.wv", a, c.n_kv_heads * hd, d, c.qkv_bias, v_attrs));
    K3_ASSIGN_OR_RETURN(int qr,
                        b.node(OpKind::kRope, p + "attn.rope_q", {q, positions, rope_cos, rope_sin}, rope_attrs));
    K3_ASSIGN_OR_RETURN(int kr,
                        b.node(OpKind::kRope, p + "attn.rope_k", {k, positions, rope_cos, rope_sin}, rope_attrs));
    const std::vector<int64_t> cache_shape{s.n_slots, c.n_kv_heads, s.ctx_len, hd};
    const int kc = g.add_state(p + "k_cache", DType::kF32, cache_shape);
    const int vc = g.add_state(p + "v_cache", DType::kF32, cache_shape);
    std::vector<Attr> att_attrs{{"n_heads", c.n_heads}, {"n_kv_heads", c.n_kv_heads}, {"head_dim", hd}, {"layer", l}};
    att_attrs.insert(att_attrs.end(), attention_attrs.begin(), attention_attrs.end());
    K3_ASSIGN_OR_RETURN(int att, b.node(OpKind::kCachedAttention, p + "attn.attention",
                                        {qr, kr, v, positions, slots, kc, vc}, att_attrs));
    K3_ASSIGN_OR_RETURN(int o, b.linear(p + "attn.wo", att, d, c.n_heads * hd, c.o_bias));
    K3_ASSIGN_OR_RETURN(h, b.node(OpKind::kAdd, p + "attn.residual", {h, o}, residual_attrs));
    K3_ASSIGN_OR_RETURN(int m, b.norm(p + "moe_norm", h));
    // Dense layers of MoE families (and dense families) are the one-expert case.
    const int64_t n_exp = c.layer_experts(l), ff = c.layer_d_ff(l);
    const bool shared = c.shared_d_ff > 0 && !c.layer_dense(l);
    std::vector<int> moe_in{m, b.weight(p + "moe.gate.weight", {n_exp, d})};
    for (int64_t e = 0; e < n_exp; ++e) {
      const std::string pe = p + "moe.experts." + std::to_string(e) + ".";
      moe_in.push_back(b.weight(pe + "w_up.weight", {ff, d}));
      if (c.expert_type == ExpertType::kSwiglu) moe_in.push_back(b.weight(pe + "w_gate.weight", {ff, d}));
      moe_in.push_back(b.weight(pe + "w_down.weight", {d, ff}));
    }
    std::vector<Attr> moe_attrs{{"n_experts", n_exp},
                                {"top_k", c.layer_top_k(l)},
                                {"swiglu", int64_t{c.expert_type == ExpertType::kSwiglu}},
                                {"dense", int64_t{options.moe_dense}}};
    if (!c.moe_renormalize) moe_attrs.push_back({"renormalize", int64_t{0}});
    if (shared) {
      moe_attrs.push_back({"shared", int64_t{1}});
      for (const char* w : {"moe.shared.w_up", "moe.shared.w_gate"})
        moe_in.push_back(b.weight(p + w + ".weight", {c.shared_d_ff, d}));
      moe_in.push_back(b.weight(p + "moe.shared.w_down.weight", {d, c.shared_d_ff}));
      moe_in.push_back(b.weight(p + "moe.shared_gate.weight", {1, d}));
    }
    K3_ASSIGN_OR_RETURN(int y, b.node(OpKind::kMoe, p + "moe", moe_in, moe_attrs));
    K3_ASSIGN_OR_RETURN(h, b.node(OpKind::kAdd, p + "moe.residual", {h, y}, residual_attrs));
  }
  // Only the rows whose logits are needed go through the final norm and the
  // vocabulary projection (one per sequence in prefill, not one per token).
  K3_ASSIGN_OR_RETURN(int last, b.node(OpKind::kGatherRows, "select_rows", {h, out_rows}));
  K3_ASSIGN_OR_RETURN(int n, b.norm("norm", last));
  K3_ASSIGN_OR_RETURN(
      int logits, b.node(OpKind::kLinear, "logits", {n, b.weight("output.weight", {c.vocab_size, d})}, logits_attrs));
  g.mark_output(logits);
  K3_RETURN_IF_ERROR(g.verify());
  return g;
}

}  // namespace k3
