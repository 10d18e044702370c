// Hugging Face checkpoints (config.json with "model_type" + model.safetensors
// or its shards, as transformers' save_pretrained writes them) mapped onto
// K3's model contract, so they run through the same graph builder and engine.
//
// Supported (docs/model-format.md has the table): Mixtral, Qwen2-MoE,
// Qwen3-MoE, OLMoE and GraniteMoE as routed experts, and the dense Llama,
// Mistral, Qwen2 and Qwen3 families as the one-expert case (the MLP is
// expert 0; its router is a synthesized [1, D] zero gate, so its weight is
// exactly 1). Family features (biases, q/k norms, shared experts, Granite's
// multipliers, RoPE scaling) become ModelConfig fields the graph builder
// turns into op attributes. Anything in a config that would change the math
// and is not implemented is a one-line error naming the key.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "frontend/checkpoint/config.h"

namespace k3 {

// True when the config.json object is a Hugging Face one (has model_type).
bool is_hf_config(const nlohmann::json& j);

// The K3 config of a Hugging Face config.json (hf_family set).
StatusOr<ModelConfig> parse_hf_config(const nlohmann::json& j);

// The checkpoint tensor name for a K3 contract name, for config c's family.
// Empty when the tensor is not in the file: the dense families' router gate
// (synthesized) and, with tied embeddings, the output projection.
std::string hf_tensor_name(const ModelConfig& c, const std::string& k3_name);

// A contract tensor stored as part of a stacked file tensor [N, R, C]
// (GraniteMoE: experts stacked, gate and up rows in one): entry `index`,
// rows [row_begin, row_begin + the contract's rows). nullopt: the whole
// file tensor.
struct HfSlice {
  int64_t index = 0;
  int64_t row_begin = 0;
};
std::optional<HfSlice> hf_tensor_slice(const ModelConfig& c, const std::string& k3_name);

}  // namespace k3
