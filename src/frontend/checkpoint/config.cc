// config.json parsing and validation, and the model presets.
#include "frontend/checkpoint/config.h"

#include <nlohmann/json.hpp>

#include "frontend/checkpoint/hf_config.h"
#include "util/mapped_file.h"

namespace k3 {
namespace {

using nlohmann::json;

// Upper bounds that keep every derived size far from int64 overflow while
// leaving room for any model this engine could run.
constexpr int64_t kMaxDim = int64_t{1} << 24;

Status read_int(const json& j, const char* key, int64_t& out, bool required) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (required) return invalid_argument(std::string("config.json: missing required key \"") + key + "\"");
    return Status();
  }
  if (!it->is_number_integer()) return invalid_argument(std::string("config.json: \"") + key + "\" must be an integer");
  out = it->get<int64_t>();
  return Status();
}

Status read_float(const json& j, const char* key, double& out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return Status();
  if (!it->is_number()) return invalid_argument(std::string("config.json: \"") + key + "\" must be a number");
  out = it->get<double>();
  return Status();
}

Status read_string(const json& j, const char* key, std::string& out, bool required) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (required) return invalid_argument(std::string("config.json: missing required key \"") + key + "\"");
    return Status();
  }
  if (!it->is_string()) return invalid_argument(std::string("config.json: \"") + key + "\" must be a string");
  out = it->get<std::string>();
  return Status();
}

}  // namespace

Status ModelConfig::validate() const {
  if (architecture != "k3")
    return invalid_argument("config.json: architecture must be \"k3\", got \"" + architecture + "\"");
  struct Field {
    const char* name;
    int64_t value;
  };
  for (const Field& f :
       {Field{"vocab_size", vocab_size}, Field{"d_model", d_model}, Field{"n_layers", n_layers},
        Field{"n_heads", n_heads}, Field{"n_kv_heads", n_kv_heads}, Field{"head_dim", head_dim},
        Field{"n_experts", n_experts}, Field{"top_k", top_k}, Field{"d_ff", d_ff}, Field{"max_seq_len", max_seq_len}}) {
    if (f.value <= 0)
      return invalid_argument(std::string("config.json: ") + f.name + " must be positive, got " +
                              std::to_string(f.value));
    if (f.value > kMaxDim)
      return invalid_argument(std::string("config.json: ") + f.name + " is too large: " + std::to_string(f.value));
  }
  if (n_heads % n_kv_heads != 0)
    return invalid_argument("config.json: n_heads (" + std::to_string(n_heads) + ") must be divisible by n_kv_heads (" +
                            std::to_string(n_kv_heads) + ")");
  if (head_dim % 2 != 0)
    return invalid_argument("config.json: head_dim must be even for rotary embeddings, got " +
                            std::to_string(head_dim));
  if (top_k > n_experts)
    return invalid_argument("config.json: top_k (" + std::to_string(top_k) + ") exceeds n_experts (" +
                            std::to_string(n_experts) + ")");
  if (n_heads * head_dim > kMaxDim) return invalid_argument("config.json: n_heads * head_dim is too large");
  // Bound the total size so every derived count (parameters, bytes) fits in
  // int64 with room to spare; computed in double so the check cannot overflow.
  const double dd = static_cast<double>(d_model), ff = static_cast<double>(d_ff);
  const double approx_params =
      2.0 * static_cast<double>(vocab_size) * dd +
      static_cast<double>(n_layers) *
          (dd * static_cast<double>(head_dim) * (2.0 * static_cast<double>(n_heads + n_kv_heads)) +
           static_cast<double>(n_experts) * (3.0 * dd * ff + dd) + 4.0 * dd);
  if (approx_params > 1e13)
    return invalid_argument("config.json: the model would have about " + std::to_string(approx_params) +
                            " parameters, more than the 1e13 this engine supports");
  if (!(rope_theta > 0.0)) return invalid_argument("config.json: rope_theta must be positive");
  if (!(norm_eps > 0.0) || norm_eps > 1.0) return invalid_argument("config.json: norm_eps must be in (0, 1]");
  if (eos_token_id && (*eos_token_id < 0 || *eos_token_id >= vocab_size))
    return invalid_argument("config.json: eos_token_id " + std::to_string(*eos_token_id) +
                            " is outside the vocabulary");
  return Status();
}

StatusOr<ModelConfig> parse_config(const std::string& text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return invalid_argument("config.json: not valid JSON");
  if (!j.is_object()) return invalid_argument("config.json: top level must be an object");
  if (is_hf_config(j)) return parse_hf_config(j);
  ModelConfig c;
  K3_RETURN_IF_ERROR(read_string(j, "architecture", c.architecture, true));
  K3_RETURN_IF_ERROR(read_int(j, "vocab_size", c.vocab_size, true));
  K3_RETURN_IF_ERROR(read_int(j, "d_model", c.d_model, true));
  K3_RETURN_IF_ERROR(read_int(j, "n_layers", c.n_layers, true));
  K3_RETURN_IF_ERROR(read_int(j, "n_heads", c.n_heads, true));
  K3_RETURN_IF_ERROR(read_int(j, "n_kv_heads", c.n_kv_heads, true));
  K3_RETURN_IF_ERROR(read_int(j, "head_dim", c.head_dim, true));
  K3_RETURN_IF_ERROR(read_int(j, "n_experts", c.n_experts, true));
  K3_RETURN_IF_ERROR(read_int(j, "top_k", c.top_k, true));
  K3_RETURN_IF_ERROR(read_int(j, "d_ff", c.d_ff, true));
  K3_RETURN_IF_ERROR(read_int(j, "max_seq_len", c.max_seq_len, true));
  K3_RETURN_IF_ERROR(read_float(j, "rope_theta", c.rope_theta));
  K3_RETURN_IF_ERROR(read_float(j, "norm_eps", c.norm_eps));
  std::string norm = "layernorm", expert = "gelu";
  K3_RETURN_IF_ERROR(read_string(j, "norm_type", norm, false));
  K3_RETURN_IF_ERROR(read_string(j, "expert_type", expert, false));
  if (norm == "layernorm")
    c.norm_type = NormType::kLayerNorm;
  else if (norm == "rmsnorm")
    c.norm_type = NormType::kRmsNorm;
  else
    return invalid_argument("config.json: norm_type must be \"layernorm\" or \"rmsnorm\", got \"" + norm + "\"");
  if (expert == "gelu")
    c.expert_type = ExpertType::kGelu;
  else if (expert == "swiglu")
    c.expert_type = ExpertType::kSwiglu;
  else
    return invalid_argument("config.json: expert_type must be \"gelu\" or \"swiglu\", got \"" + expert + "\"");
  int64_t eos = -1;
  auto it = j.find("eos_token_id");
  if (it != j.end() && !it->is_null()) {
    K3_RETURN_IF_ERROR(read_int(j, "eos_token_id", eos, true));
    c.eos_token_id = eos;
  }
  // Further end ids (a Hugging Face list, carried into compiled models).
  if (auto ids = j.find("eos_token_ids"); ids != j.end() && !ids->is_null()) {
    if (!ids->is_array()) return invalid_argument("config.json: \"eos_token_ids\" must be a list of integers");
    for (const json& id : *ids) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= c.vocab_size)
        return invalid_argument("config.json: \"eos_token_ids\" must list ids inside the vocabulary");
      c.eos_token_ids.push_back(id.get<int64_t>());
    }
  }
  K3_RETURN_IF_ERROR(c.validate());
  return c;
}

StatusOr<ModelConfig> load_config(const std::string& path) {
  K3_ASSIGN_OR_RETURN(std::string text, read_text_file(path));
  return parse_config(text);  // messages already name config.json and the key
}

std::string ModelConfig::to_json() const {
  json j;
  j["architecture"] = architecture;
  j["vocab_size"] = vocab_size;
  j["d_model"] = d_model;
  j["n_layers"] = n_layers;
  j["n_heads"] = n_heads;
  j["n_kv_heads"] = n_kv_heads;
  j["head_dim"] = head_dim;
  j["n_experts"] = n_experts;
  j["top_k"] = top_k;
  j["d_ff"] = d_ff;
  j["max_seq_len"] = max_seq_len;
  j["rope_theta"] = rope_theta;
  j["norm_eps"] = norm_eps;
  j["norm_type"] = norm_type == NormType::kLayerNorm ? "layernorm" : "rmsnorm";
  j["expert_type"] = expert_type == ExpertType::kGelu ? "gelu" : "swiglu";
  if (eos_token_id) j["eos_token_id"] = *eos_token_id;
  if (eos_token_ids.size() > 1) j["eos_token_ids"] = eos_token_ids;
  return j.dump(2) + "\n";
}

int64_t ModelConfig::param_count() const {
  const int64_t d = d_model, attn = d * head_dim * (2 * n_heads + 2 * n_kv_heads);
  const int64_t norm = norm_type == NormType::kLayerNorm ? 2 * d : d;
  const int64_t experts = n_experts * expert_matrices() * d * d_ff;
  const int64_t layer = 2 * norm + attn + n_experts * d + experts;
  return 2 * vocab_size * d + n_layers * layer + norm;
}

int64_t ModelConfig::params_read_per_token() const {
  const int64_t d = d_model, attn = d * head_dim * (2 * n_heads + 2 * n_kv_heads);
  const int64_t norm = norm_type == NormType::kLayerNorm ? 2 * d : d;
  const int64_t experts = top_k * expert_matrices() * d * d_ff;
  const int64_t layer = 2 * norm + attn + n_experts * d + experts;
  return vocab_size * d + d + n_layers * layer + norm;
}

std::vector<std::string> preset_names() {
  return {"k3-tiny", "k3-small", "k3-base", "moe-swiglu-small", "moe-swiglu-base"};
}

std::string preset_list() {
  std::string names;
  for (const auto& n : preset_names()) names += (names.empty() ? "" : ", ") + n;
  return names;
}

StatusOr<ModelConfig> preset_config(const std::string& name) {
  ModelConfig c;
  c.top_k = 2;
  if (name == "k3-tiny") {
    c.vocab_size = 512, c.d_model = 64, c.n_layers = 2, c.n_heads = 4, c.n_kv_heads = 2, c.head_dim = 16;
    c.n_experts = 4, c.d_ff = 128, c.max_seq_len = 256;
  } else if (name == "k3-small" || name == "moe-swiglu-small") {
    c.vocab_size = 4096, c.d_model = 256, c.n_layers = 4, c.n_heads = 4, c.n_kv_heads = 4, c.head_dim = 64;
    c.n_experts = 8, c.d_ff = 768, c.max_seq_len = 1024;
    if (name == "moe-swiglu-small") {
      c.norm_type = NormType::kRmsNorm;
      c.expert_type = ExpertType::kSwiglu;
      c.n_kv_heads = 2;
    }
  } else if (name == "k3-base") {
    c.vocab_size = 32000, c.d_model = 512, c.n_layers = 32, c.n_heads = 5, c.n_kv_heads = 5, c.head_dim = 64;
    c.n_experts = 8, c.d_ff = 1536, c.max_seq_len = 2048;
  } else if (name == "moe-swiglu-base") {
    // k3-base's size class in an architecture llama.cpp runs (llama with
    // experts, as Mixtral): the peer comparison preset.
    c.vocab_size = 32000, c.d_model = 512, c.n_layers = 32, c.n_heads = 8, c.n_kv_heads = 8, c.head_dim = 64;
    c.n_experts = 8, c.d_ff = 1024, c.max_seq_len = 2048;
    c.norm_type = NormType::kRmsNorm;
    c.expert_type = ExpertType::kSwiglu;
  } else {
    return invalid_argument("unknown preset \"" + name + "\" (known: " + preset_list() + ")");
  }
  K3_RETURN_IF_ERROR(c.validate());
  return c;
}

}  // namespace k3
