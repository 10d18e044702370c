// The K3 model configuration (config.json) and the named presets.
//
// See docs/model-format.md for the contract. Parsing validates every field:
// a config that parses is one the engine can build a graph for.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "util/status.h"

namespace k3 {

enum class NormType : uint8_t { kLayerNorm, kRmsNorm };
enum class ExpertType : uint8_t { kGelu, kSwiglu };

struct ModelConfig {
  std::string architecture = "k3";
  int64_t vocab_size = 0;
  int64_t d_model = 0;
  int64_t n_layers = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t n_experts = 0;
  int64_t top_k = 0;
  int64_t d_ff = 0;
  int64_t max_seq_len = 0;
  double rope_theta = 10000.0;
  double norm_eps = 1e-5;
  NormType norm_type = NormType::kLayerNorm;
  ExpertType expert_type = ExpertType::kGelu;
  std::optional<int64_t> eos_token_id;
  // Hugging Face checkpoints (hf_config.h): the family whose tensor names
  // the file uses ("" for K3's own), and whether the output projection is
  // the embedding table. Not part of K3's config.json.
  std::string hf_family;
  bool tie_embeddings = false;

  Status validate() const;
  std::string to_json() const;  // pretty-printed config.json text

  // Parameter counts: total, and read per token at batch 1 (everything but
  // the unchosen experts and the embedding table, of which one row is read).
  int64_t param_count() const;
  int64_t params_read_per_token() const;
  int64_t expert_matrices() const { return expert_type == ExpertType::kSwiglu ? 3 : 2; }
};

StatusOr<ModelConfig> parse_config(const std::string& json_text);
StatusOr<ModelConfig> load_config(const std::string& path);

// Presets for `k3 init-model --preset NAME`.
StatusOr<ModelConfig> preset_config(const std::string& name);
std::vector<std::string> preset_names();

}  // namespace k3
