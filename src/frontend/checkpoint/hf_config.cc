// Hugging Face config.json -> K3 ModelConfig, and the tensor name mapping
// (see hf_config.h).
#include "frontend/checkpoint/hf_config.h"

#include <algorithm>
#include <cmath>
#include <regex>

namespace k3 {
namespace {

using nlohmann::json;

StatusOr<int64_t> get_int(const json& j, const char* key, std::optional<int64_t> fallback = std::nullopt) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (fallback) return *fallback;
    return invalid_argument(std::string("config.json: missing required key \"") + key + "\"");
  }
  if (!it->is_number_integer()) return invalid_argument(std::string("config.json: \"") + key + "\" must be an integer");
  return it->get<int64_t>();
}

StatusOr<double> get_float(const json& j, const char* key, double fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_number()) return invalid_argument(std::string("config.json: \"") + key + "\" must be a number");
  return it->get<double>();
}

bool truthy(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_boolean() && it->get<bool>();
}

constexpr double kPi = 3.14159265358979323846;

// RoPE: transformers 4.x writes rope_theta (+ rope_scaling {type|rope_type,
// factor, ...}), 5.x writes rope_parameters {rope_theta, rope_type, ...}.
// Scaled types are folded into per-pair inverse frequencies (and YaRN's
// factor on cos/sin) the way transformers' modeling_rope_utils computes them;
// the graph builder turns those into its tables.
Status parse_rope(const json& j, ModelConfig& c, double theta_fallback) {
  json params = json::object();
  if (auto it = j.find("rope_parameters"); it != j.end() && it->is_object()) {
    params = *it;
  } else if (auto rs = j.find("rope_scaling"); rs != j.end() && !rs->is_null()) {
    if (!rs->is_object()) return invalid_argument("config.json: \"rope_scaling\" must be an object or null");
    params = *rs;
    if (!params.contains("rope_type") && params.contains("type")) params["rope_type"] = params["type"];
  }
  if (!params.contains("rope_theta") && j.contains("rope_theta")) params["rope_theta"] = j["rope_theta"];
  K3_ASSIGN_OR_RETURN(c.rope_theta, get_float(params, "rope_theta", theta_fallback));
  if (auto pr = params.find("partial_rotary_factor");
      pr != params.end() && !pr->is_null() && !(pr->is_number() && pr->get<double>() == 1.0))
    return unimplemented("config.json: partial_rotary_factor is not supported (rotary on the whole head only)");
  const std::string type = params.value("rope_type", std::string("default"));
  if (type == "default") return Status();
  if (type == "dynamic")
    return unimplemented(
        "config.json: rope_type \"dynamic\" is not supported (its frequencies depend on the running sequence "
        "length; K3 folds RoPE tables at build time)");
  if (type != "linear" && type != "llama3" && type != "yarn")
    return unimplemented("config.json: rope_type \"" + type + "\" is not supported (default, linear, llama3, yarn)");
  const int64_t dim = c.head_dim, half = dim / 2;
  if (dim <= 0 || dim % 2 != 0) return invalid_argument("config.json: head_dim must be even for rotary embeddings");
  std::vector<double> inv(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i)
    inv[static_cast<size_t>(i)] = 1.0 / std::pow(c.rope_theta, static_cast<double>(2 * i) / static_cast<double>(dim));
  const double nan = std::nan("");
  K3_ASSIGN_OR_RETURN(double factor, get_float(params, "factor", nan));
  K3_ASSIGN_OR_RETURN(double original,
                      get_float(params, "original_max_position_embeddings", static_cast<double>(c.max_seq_len)));
  if (type == "linear" || type == "llama3") {
    if (!(factor > 0.0)) return invalid_argument("config.json: the RoPE \"factor\" must be a positive number");
  }
  if (type == "linear") {
    for (double& f : inv) f /= factor;
  } else if (type == "llama3") {
    K3_ASSIGN_OR_RETURN(double low, get_float(params, "low_freq_factor", nan));
    K3_ASSIGN_OR_RETURN(double high, get_float(params, "high_freq_factor", nan));
    if (!(low > 0.0) || !(high > low))
      return invalid_argument("config.json: llama3 RoPE needs 0 < low_freq_factor < high_freq_factor");
    const double low_wavelen = original / low, high_wavelen = original / high;
    for (double& f : inv) {
      const double wavelen = 2 * kPi / f;
      if (wavelen > low_wavelen) {
        f /= factor;
      } else if (wavelen >= high_wavelen) {  // medium: interpolate
        const double smooth = (original / wavelen - low) / (high - low);
        f = (1 - smooth) * f / factor + smooth * f;
      }
    }
  } else {  // yarn
    if (std::isnan(factor)) factor = static_cast<double>(c.max_seq_len) / original;
    if (!(factor > 0.0)) return invalid_argument("config.json: the RoPE \"factor\" must be a positive number");
    auto mscale = [](double scale, double m) { return scale <= 1 ? 1.0 : 0.1 * m * std::log(scale) + 1.0; };
    K3_ASSIGN_OR_RETURN(double attention_factor, get_float(params, "attention_factor", nan));
    K3_ASSIGN_OR_RETURN(double ms, get_float(params, "mscale", 0.0));
    K3_ASSIGN_OR_RETURN(double ms_all, get_float(params, "mscale_all_dim", 0.0));
    if (std::isnan(attention_factor))
      attention_factor = ms != 0.0 && ms_all != 0.0 ? mscale(factor, ms) / mscale(factor, ms_all) : mscale(factor, 1.0);
    K3_ASSIGN_OR_RETURN(double beta_fast, get_float(params, "beta_fast", 32.0));
    K3_ASSIGN_OR_RETURN(double beta_slow, get_float(params, "beta_slow", 1.0));
    if (beta_fast == 0.0) beta_fast = 32.0;  // transformers: `or 32`
    if (beta_slow == 0.0) beta_slow = 1.0;
    const bool truncate =
        !params.contains("truncate") || !params["truncate"].is_boolean() || params["truncate"].get<bool>();
    const double d = static_cast<double>(dim);
    auto correction_dim = [&](double rotations) {
      return d * std::log(original / (rotations * 2 * kPi)) / (2 * std::log(c.rope_theta));
    };
    double lo = correction_dim(beta_fast), hi = correction_dim(beta_slow);
    if (truncate) lo = std::floor(lo), hi = std::ceil(hi);
    lo = std::max(lo, 0.0), hi = std::min(hi, d - 1);
    if (lo == hi) hi += 0.001;
    for (int64_t i = 0; i < half; ++i) {
      const double ramp = std::clamp((static_cast<double>(i) - lo) / (hi - lo), 0.0, 1.0);
      const double extrapolation = 1.0 - ramp;  // weight of the unscaled frequency
      double& f = inv[static_cast<size_t>(i)];
      f = f / factor * (1 - extrapolation) + f * extrapolation;
    }
    c.rope_attention_factor = attention_factor;
  }
  c.rope_inv_freq = std::move(inv);
  return Status();
}

// The integer list under key (absent or null: empty).
StatusOr<std::vector<int64_t>> get_int_list(const json& j, const char* key) {
  std::vector<int64_t> out;
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return out;
  if (!it->is_array()) return invalid_argument(std::string("config.json: \"") + key + "\" must be a list of integers");
  for (const json& v : *it) {
    if (!v.is_number_integer())
      return invalid_argument(std::string("config.json: \"") + key + "\" must be a list of integers");
    out.push_back(v.get<int64_t>());
  }
  return out;
}

const char* const kFamilies = "mixtral, llama, mistral, qwen2, qwen3, qwen2_moe, qwen3_moe, olmoe, granitemoe";

}  // namespace

bool is_hf_config(const json& j) {
  return j.is_object() && j.contains("model_type");
}

StatusOr<ModelConfig> parse_hf_config(const json& j) {
  const auto mt = j.find("model_type");
  if (!mt->is_string()) return invalid_argument("config.json: \"model_type\" must be a string");
  const std::string family = mt->get<std::string>();
  const bool qwen_moe = family == "qwen2_moe" || family == "qwen3_moe";
  const bool granite = family == "granitemoe";
  const bool routed = family == "mixtral" || qwen_moe || family == "olmoe" || granite;
  const bool dense = family == "llama" || family == "mistral" || family == "qwen2" || family == "qwen3";
  if (!routed && !dense)
    return unimplemented("config.json: model_type \"" + family + "\" is not supported (supported: " + kFamilies + ")");
  const std::string act = j.value("hidden_act", std::string("silu"));
  if (act != "silu") return unimplemented("config.json: hidden_act \"" + act + "\" is not supported (silu only)");
  if (truthy(j, "mlp_bias")) return unimplemented("config.json: mlp_bias is not supported yet");
  if (auto pt = j.find("pretraining_tp"); pt != j.end() && pt->is_number_integer() && pt->get<int64_t>() != 1)
    return unimplemented("config.json: pretraining_tp != 1 is not supported");

  ModelConfig c;
  c.hf_family = family;
  c.norm_type = NormType::kRmsNorm;
  c.expert_type = ExpertType::kSwiglu;
  K3_ASSIGN_OR_RETURN(c.vocab_size, get_int(j, "vocab_size"));
  K3_ASSIGN_OR_RETURN(c.d_model, get_int(j, "hidden_size"));
  K3_ASSIGN_OR_RETURN(c.n_layers, get_int(j, "num_hidden_layers"));
  K3_ASSIGN_OR_RETURN(c.n_heads, get_int(j, "num_attention_heads"));
  K3_ASSIGN_OR_RETURN(c.n_kv_heads, get_int(j, "num_key_value_heads", c.n_heads));
  if (c.n_heads <= 0) return invalid_argument("config.json: num_attention_heads must be positive");
  K3_ASSIGN_OR_RETURN(c.head_dim, get_int(j, "head_dim", c.d_model / c.n_heads));
  K3_ASSIGN_OR_RETURN(c.d_ff, get_int(j, "intermediate_size"));
  K3_ASSIGN_OR_RETURN(c.max_seq_len, get_int(j, "max_position_embeddings"));
  K3_ASSIGN_OR_RETURN(c.norm_eps, get_float(j, "rms_norm_eps", 1e-6));
  K3_RETURN_IF_ERROR(parse_rope(j, c, family == "mixtral" ? 1e6 : 10000.0));

  // Attention: biases and q/k norms by family (Qwen2 always has q/k/v
  // biases; attention_bias means all four projections elsewhere).
  if (family == "qwen2") {
    c.qkv_bias = true;
  } else if (family == "qwen2_moe") {
    c.qkv_bias = j.value("qkv_bias", true);
  } else if (truthy(j, "attention_bias")) {
    c.qkv_bias = c.o_bias = true;
  }
  if (family == "qwen3" || family == "qwen3_moe") c.qk_norm = QkNorm::kPerHead;
  if (family == "olmoe") {
    c.qk_norm = QkNorm::kFull;
    K3_ASSIGN_OR_RETURN(c.clip_qkv, get_float(j, "clip_qkv", 0.0));
    if (c.clip_qkv < 0.0) return invalid_argument("config.json: \"clip_qkv\" must be positive or null");
  }

  // Experts: Mixtral renormalizes the top-k; the others do when
  // norm_topk_prob says so. Qwen MoE layers may be dense (mlp_only_layers,
  // decoder_sparse_step): the one-expert case with intermediate_size.
  if (routed) {
    const char* n_key = j.contains("num_local_experts") ? "num_local_experts" : "num_experts";
    K3_ASSIGN_OR_RETURN(c.n_experts, get_int(j, n_key));
    K3_ASSIGN_OR_RETURN(c.top_k, get_int(j, "num_experts_per_tok"));
    // Mixtral and Granite take the softmax over the top-k logits.
    if (family != "mixtral" && !granite) c.moe_renormalize = truthy(j, "norm_topk_prob");
    if (qwen_moe) {
      c.dense_d_ff = c.d_ff;
      K3_ASSIGN_OR_RETURN(c.d_ff, get_int(j, "moe_intermediate_size"));
      K3_ASSIGN_OR_RETURN(const std::vector<int64_t> mlp_only, get_int_list(j, "mlp_only_layers"));
      K3_ASSIGN_OR_RETURN(const int64_t step, get_int(j, "decoder_sparse_step", 1));
      if (step <= 0) return invalid_argument("config.json: \"decoder_sparse_step\" must be positive");
      c.dense_layers.assign(static_cast<size_t>(std::max<int64_t>(c.n_layers, 0)), false);
      for (int64_t l = 0; l < c.n_layers; ++l)
        c.dense_layers[static_cast<size_t>(l)] =
            std::find(mlp_only.begin(), mlp_only.end(), l) != mlp_only.end() || (l + 1) % step != 0;
      if (family == "qwen2_moe") {
        K3_ASSIGN_OR_RETURN(c.shared_d_ff, get_int(j, "shared_expert_intermediate_size"));
        if (c.shared_d_ff <= 0)
          return invalid_argument("config.json: \"shared_expert_intermediate_size\" must be positive");
      }
    }
  } else {
    c.n_experts = 1;
    c.top_k = 1;
  }
  if (granite) {
    // Granite's scalars: embeddings and each block's output scaled, its own
    // attention scale, logits divided.
    K3_ASSIGN_OR_RETURN(c.embedding_scale, get_float(j, "embedding_multiplier", 1.0));
    K3_ASSIGN_OR_RETURN(c.residual_scale, get_float(j, "residual_multiplier", 1.0));
    K3_ASSIGN_OR_RETURN(c.attention_scale, get_float(j, "attention_multiplier", 1.0));
    K3_ASSIGN_OR_RETURN(const double logits_scaling, get_float(j, "logits_scaling", 1.0));
    if (!(c.attention_scale > 0.0) || !(logits_scaling > 0.0))
      return invalid_argument("config.json: attention_multiplier and logits_scaling must be positive");
    c.logits_scale = 1.0 / logits_scaling;
  }
  // A sliding window at least as long as the context is full attention; a
  // shorter one is honoured by capping the context at it (exact: no token
  // then has anything outside its window to see, whichever layers slide).
  // Qwen configs carry a window that only applies with use_sliding_window.
  const bool qwen = family.rfind("qwen", 0) == 0;
  if (auto sw = j.find("sliding_window");
      sw != j.end() && !sw->is_null() && (!qwen || truthy(j, "use_sliding_window"))) {
    if (!sw->is_number_integer() || sw->get<int64_t>() <= 0)
      return invalid_argument("config.json: \"sliding_window\" must be a positive integer or null");
    c.max_seq_len = std::min(c.max_seq_len, sw->get<int64_t>());
  }
  // tie_embeddings is not read from tie_word_embeddings: Checkpoint::load
  // decides it from whether the file has lm_head.weight.
  // eos_token_id: an id or a list of ids; every one ends generation.
  if (auto eos = j.find("eos_token_id"); eos != j.end() && !eos->is_null()) {
    for (const json& id : eos->is_array() ? *eos : json::array({*eos})) {
      if (!id.is_number_integer())
        return invalid_argument("config.json: \"eos_token_id\" must be an integer or a list of integers");
      c.eos_token_ids.push_back(id.get<int64_t>());
    }
    if (!c.eos_token_ids.empty()) c.eos_token_id = c.eos_token_ids.front();
  }
  for (int64_t id : c.eos_token_ids)
    if (id < 0 || id >= c.vocab_size)
      return invalid_argument("config.json: eos_token_id " + std::to_string(id) + " is outside the vocabulary");
  if (c.dense_d_ff <= 0 && std::find(c.dense_layers.begin(), c.dense_layers.end(), true) != c.dense_layers.end())
    return invalid_argument("config.json: \"intermediate_size\" must be positive");
  K3_RETURN_IF_ERROR(c.validate());
  return c;
}

std::string hf_tensor_name(const ModelConfig& c, const std::string& n) {
  static const std::regex layer(R"(layers\.(\d+)\.(.*))");
  if (n == "tok_embeddings.weight") return "model.embed_tokens.weight";
  if (n == "norm.weight") return "model.norm.weight";
  if (n == "output.weight") return c.tie_embeddings ? "" : "lm_head.weight";
  std::smatch m;
  if (!std::regex_match(n, m, layer)) return n;
  const std::string p = "model.layers." + m[1].str() + ".", rest = m[2].str();
  if (rest == "attn_norm.weight") return p + "input_layernorm.weight";
  if (rest == "moe_norm.weight") return p + "post_attention_layernorm.weight";
  for (const char* w : {"q", "k", "v", "o"})
    for (const char* kind : {"weight", "bias"})
      if (rest == std::string("attn.w") + w + "." + kind) return p + "self_attn." + w + "_proj." + kind;
  if (rest == "attn.q_norm.weight" || rest == "attn.k_norm.weight") return p + "self_attn." + rest.substr(5);
  if (rest == "moe.shared_gate.weight") return p + "mlp.shared_expert_gate.weight";
  static const std::regex shared(R"(moe\.shared\.w_(up|gate|down)\.weight)");
  if (std::smatch e; std::regex_match(rest, e, shared)) return p + "mlp.shared_expert." + e[1].str() + "_proj.weight";
  const bool mixtral = c.hf_family == "mixtral";
  if (c.hf_family == "granitemoe") {  // experts stacked: see hf_tensor_slice
    if (rest == "moe.gate.weight") return p + "block_sparse_moe.router.layer.weight";
    static const std::regex stacked(R"(moe\.experts\.\d+\.w_(up|gate|down)\.weight)");
    if (std::smatch e; std::regex_match(rest, e, stacked))
      return p + "block_sparse_moe." + (e[1].str() == "down" ? "output" : "input") + "_linear.weight";
  }
  // Dense families and the dense layers of MoE families: a plain MLP, and
  // no router in the file (synthesized).
  const bool routed_family =
      mixtral || c.hf_family == "qwen2_moe" || c.hf_family == "qwen3_moe" || c.hf_family == "olmoe";
  const bool routed_layer = routed_family && !c.layer_dense(std::stoll(m[1].str()));
  if (rest == "moe.gate.weight")
    return !routed_layer                          ? ""
           : mixtral && !c.hf_fused_experts ? p + "block_sparse_moe.gate.weight"
                                                  : p + "mlp.gate.weight";
  static const std::regex expert(R"(moe\.experts\.(\d+)\.w_(up|gate|down)\.weight)");
  if (std::smatch e; std::regex_match(rest, e, expert)) {
    const std::string which = e[2].str();
    if (!routed_layer) return p + "mlp." + which + "_proj.weight";
    // Fused layout: slices of two 3-D tensors (hf_tensor_slice).
    if (c.hf_fused_experts) return p + "mlp.experts." + (which == "down" ? "down_proj" : "gate_up_proj");
    if (!mixtral) return p + "mlp.experts." + e[1].str() + "." + which + "_proj.weight";
    // Mixtral: w1 = gate, w3 = up, w2 = down.
    const char* w = which == "gate" ? "w1" : which == "up" ? "w3" : "w2";
    return p + "block_sparse_moe.experts." + e[1].str() + "." + w + ".weight";
  }
  return n;
}

std::optional<HfSlice> hf_tensor_slice(const ModelConfig& c, const std::string& n) {
  if (c.hf_family != "granitemoe" && !c.hf_fused_experts) return std::nullopt;
  static const std::regex stacked(R"(layers\.(\d+)\.moe\.experts\.(\d+)\.w_(up|gate|down)\.weight)");
  std::smatch m;
  if (!std::regex_match(n, m, stacked)) return std::nullopt;
  // A dense layer of a sparse-step model is a plain MLP even in a fused file.
  if (c.hf_family != "granitemoe" && c.layer_dense(std::stoll(m[1].str()))) return std::nullopt;
  // Granite's input_linear and the fused gate_up_proj, both [E, 2F, D]: rows
  // [0, F) gate, [F, 2F) up (transformers chunks gate first); output_linear
  // and down_proj [E, D, F].
  return HfSlice{std::stoll(m[2].str()), m[3].str() == "up" ? c.d_ff : 0};
}

}  // namespace k3
