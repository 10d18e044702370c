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
// RMSNorm on q and k after their projections: none, per head (Qwen3: weight
// [head_dim]) or over the whole projection (OLMoE: weight [heads * head_dim]).
enum class QkNorm : uint8_t { kNone, kPerHead, kFull };

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
  // the embedding table (set by Checkpoint::load: no lm_head.weight in the
  // file). Not part of K3's config.json.
  std::string hf_family;
  bool tie_embeddings = false;
  // The experts of each routed layer are stored fused, as transformers 5
  // holds them in memory (save_pretrained(..., save_original_format=False)):
  // mlp.experts.gate_up_proj [E, 2F, D] and mlp.experts.down_proj [E, D, F].
  // Decided by Checkpoint::load from the tensors present.
  bool hf_fused_experts = false;
  // Hugging Face family features (hf_config.cc says which family sets
  // which); K3's own configs keep these defaults, which change nothing.
  bool qkv_bias = false;  // q/k/v projections have biases (Qwen2)
  bool o_bias = false;    // the output projection has one (attention_bias)
  QkNorm qk_norm = QkNorm::kNone;
  double clip_qkv = 0.0;           // > 0: q, k, v clamped to [-clip, clip] (OLMoE)
  bool moe_renormalize = true;     // false: top-k weights are their share of the softmax over all experts
  std::vector<bool> dense_layers;  // per layer (empty: none): a dense MLP of dense_d_ff, the one-expert case
  int64_t dense_d_ff = 0;
  int64_t shared_d_ff = 0;       // > 0: a sigmoid-gated SwiGLU shared expert in every routed layer (Qwen2-MoE)
  double embedding_scale = 1.0;  // embedding rows times this (Granite's embedding_multiplier)
  double residual_scale = 1.0;   // each block's output times this before the residual add
  double attention_scale = 0.0;  // > 0: replaces 1/sqrt(head_dim)
  double logits_scale = 1.0;     // logits times this (1/logits_scaling)
  // RoPE scaling folded into the tables: per-pair inverse frequencies
  // (empty: theta^(-2i/hd)) and a factor on cos and sin (YaRN).
  std::vector<double> rope_inv_freq;
  double rope_attention_factor = 1.0;
  // Every id that ends generation (eos_token_id is the first).
  std::vector<int64_t> eos_token_ids;

  bool layer_dense(int64_t layer) const {
    return static_cast<size_t>(layer) < dense_layers.size() && dense_layers[static_cast<size_t>(layer)];
  }
  int64_t layer_experts(int64_t layer) const { return layer_dense(layer) ? 1 : n_experts; }
  int64_t layer_top_k(int64_t layer) const { return layer_dense(layer) ? 1 : top_k; }
  int64_t layer_d_ff(int64_t layer) const { return layer_dense(layer) ? dense_d_ff : d_ff; }

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
// The preset names joined with ", " (for help texts and error messages).
std::string preset_list();

}  // namespace k3
