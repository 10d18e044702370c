// Hugging Face config.json -> K3 ModelConfig, and the tensor name mapping
// (see hf_config.h).
#include "frontend/checkpoint/hf_config.h"

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

// RoPE: transformers 4.x writes rope_theta (+ rope_scaling), 5.x writes
// rope_parameters {rope_theta, rope_type}. Only unscaled ("default") RoPE
// is implemented.
StatusOr<double> rope_theta(const json& j, double fallback) {
  if (auto it = j.find("rope_parameters"); it != j.end() && it->is_object()) {
    const std::string type = it->value("rope_type", std::string("default"));
    if (type != "default")
      return unimplemented("config.json: rope_parameters.rope_type \"" + type +
                           "\" is not supported yet (default only)");
    return get_float(*it, "rope_theta", fallback);
  }
  if (auto it = j.find("rope_scaling"); it != j.end() && !it->is_null())
    return unimplemented("config.json: rope_scaling is not supported yet (unscaled RoPE only)");
  return get_float(j, "rope_theta", fallback);
}

}  // namespace

bool is_hf_config(const json& j) {
  return j.is_object() && j.contains("model_type");
}

StatusOr<ModelConfig> parse_hf_config(const json& j) {
  const auto mt = j.find("model_type");
  if (!mt->is_string()) return invalid_argument("config.json: \"model_type\" must be a string");
  const std::string family = mt->get<std::string>();
  const bool moe = family == "mixtral";
  if (!moe && family != "llama" && family != "mistral")
    return unimplemented("config.json: model_type \"" + family +
                         "\" is not supported (supported: mixtral, llama, mistral)");
  const std::string act = j.value("hidden_act", std::string("silu"));
  if (act != "silu") return unimplemented("config.json: hidden_act \"" + act + "\" is not supported (silu only)");
  for (const char* key : {"attention_bias", "mlp_bias"})
    if (truthy(j, key)) return unimplemented(std::string("config.json: ") + key + " is not supported yet");
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
  K3_ASSIGN_OR_RETURN(c.rope_theta, rope_theta(j, moe ? 1e6 : 10000.0));
  if (moe) {
    K3_ASSIGN_OR_RETURN(c.n_experts, get_int(j, "num_local_experts"));
    K3_ASSIGN_OR_RETURN(c.top_k, get_int(j, "num_experts_per_tok"));
  } else {
    c.n_experts = 1;
    c.top_k = 1;
  }
  // A sliding window at least as long as the context is full attention; a
  // shorter one is honoured by capping the context at it (exact: no token
  // then has anything outside its window to see).
  if (auto sw = j.find("sliding_window"); sw != j.end() && !sw->is_null()) {
    if (!sw->is_number_integer() || sw->get<int64_t>() <= 0)
      return invalid_argument("config.json: \"sliding_window\" must be a positive integer or null");
    c.max_seq_len = std::min(c.max_seq_len, sw->get<int64_t>());
  }
  c.tie_embeddings = truthy(j, "tie_word_embeddings");
  // eos_token_id: an id or a list of ids (the first ends generation here).
  if (auto eos = j.find("eos_token_id"); eos != j.end() && !eos->is_null() && !(eos->is_array() && eos->empty())) {
    const json& first = eos->is_array() && !eos->empty() ? (*eos)[0] : *eos;
    if (!first.is_number_integer())
      return invalid_argument("config.json: \"eos_token_id\" must be an integer or a list");
    c.eos_token_id = first.get<int64_t>();
  }
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
    if (rest == std::string("attn.w") + w + ".weight") return p + "self_attn." + w + "_proj.weight";
  const bool moe = c.hf_family == "mixtral";
  if (rest == "moe.gate.weight") return moe ? p + "block_sparse_moe.gate.weight" : "";
  static const std::regex expert(R"(moe\.experts\.(\d+)\.w_(up|gate|down)\.weight)");
  if (std::smatch e; std::regex_match(rest, e, expert)) {
    const std::string which = e[2].str();
    if (!moe) return p + "mlp." + which + "_proj.weight";
    // Mixtral: w1 = gate, w3 = up, w2 = down.
    const char* w = which == "gate" ? "w1" : which == "up" ? "w3" : "w2";
    return p + "block_sparse_moe.experts." + e[1].str() + "." + w + ".weight";
  }
  return n;
}

}  // namespace k3
